/*
 * hf.h - the official Hugging Face release of DeepSeek V4 Flash as a source
 * of weights: tensor names, config.json, and decoding of its encodings to
 * f32 (used by tools/ds4-quantize).
 *
 * Facts about the official checkpoint this module relies on (sources:
 * docs/MODEL.md 2.6; the official inference/model.py of
 * deepseek-ai/DeepSeek-V4-Flash (class Linear, Compressor, Gate, Block,
 * ParallelHead); antirez/ds4 gguf-tools/deepseek4-quantize.c (functions
 * dequant_fp8_weight, dequant_fp4_weight, i64_to_i32, tables top_map,
 * layer_map); safetensors headers of the release quoted in public notes,
 * e.g. "layers.0.ffn.experts.0.w1.weight I8 [2048, 2048]",
 * "layers.0.ffn.experts.0.w1.scale F8_E8M0 [2048, 128]",
 * "layers.0.attn.wq_a.weight F8_E4M3" + "layers.0.attn.wq_a.scale F8_E8M0"):
 *
 *  - Shards `model-XXXXX-of-XXXXX.safetensors` and
 *    `model.safetensors.index.json` ({"metadata", "weight_map": name->file}).
 *  - Dense FP8 matrices (attn wq_a, wq_b, wkv, wo_a, wo_b, indexer wq_b,
 *    shared experts w1/w2/w3): `NAME.weight` F8_E4M3 [out, in] plus
 *    `NAME.scale` F8_E8M0 [ceil(out/128), ceil(in/128)]; one scale per
 *    128x128 block (config.json quantization_config.weight_block_size).
 *    E4M3FN: bias 7, subnormals m*2^-9, 0x7F/0xFF decode to 0 (ds4's rule).
 *    E8M0 byte e is 2^(e-127) (e = 0 gives 2^-127).
 *  - Routed experts `layers.N.ffn.experts.E.w{1,2,3}.weight`: FP4 E2M1
 *    packed two per byte, low nibble first, dtype I8, shape [out, in/2];
 *    `.scale` F8_E8M0 [out, in/32] (one scale per 32 inputs of a row).
 *  - BF16: embed, head, norms, compressor wkv/wgate, indexer weights_proj,
 *    gate.weight.  F32: hc_* mixers, attn_sink, compressor ape, gate.bias.
 *  - `layers.N.ffn.gate.tid2eid` I64 [vocab, n_activated] (hash layers),
 *    narrowed to I32 (values must fit).
 *  - `mtp.*` tensors belong to the MTP block and are not part of the main
 *    GGUF.
 *  Every dtype is read from the shard header, so F32/F16/BF16 sources are
 *  accepted for any float tensor; the checks below say what is required.
 *
 * GGUF dims are the reverse of HF shapes; routed experts are stacked over E
 * into one 3-D tensor.
 */
#ifndef DS4_CONVERT_HF_H
#define DS4_CONVERT_HF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "convert/safetensors.h"
#include "model/config.h"
#include "model/layout.h"

/* HF name of a layout tensor (the hf column of the tensor table).  For
 * routed experts (DS4_TC_EXP_*), the name of expert `expert`'s matrix
 * ("layers.3.ffn.experts.7.w1.weight"); `expert` is ignored for other
 * tensors.  -1 when a routed tensor gets no expert id or buf is too small. */
int ds4_hf_name(const ds4_tensor_spec *t, int expert, char *buf, size_t len, ds4_err *err);

/* The `.scale` companion of an HF weight name ("x.weight" -> "x.scale"). */
int ds4_hf_scale_name(const char *weight_name, char *buf, size_t len, ds4_err *err);

/* ---------------------------------------------------------- config.json */

typedef struct ds4_hf_config {
    ds4_config cfg;
    uint32_t fp8_block_out, fp8_block_in; /* quantization_config.weight_block_size */
} ds4_hf_config;

/* Read config.json (the official keys; see hf_config.c for the mapping)
 * and validate the result.  Errors name the file and the key. */
int ds4_hf_config_load(const char *path, ds4_hf_config *out, ds4_err *err);

/* ------------------------------------------------------------ decoding */

typedef enum ds4_hf_enc {
    DS4_HF_ENC_FLOAT, /* F32, F16 or BF16 values as they are */
    DS4_HF_ENC_FP8,   /* F8_E4M3 + E8M0 scale per block_out x block_in */
    DS4_HF_ENC_FP4,   /* packed E2M1 + E8M0 scale per 32 inputs */
    DS4_HF_ENC_INT,   /* I64 or I32 integers (tid2eid) */
} ds4_hf_enc;

/* One matrix (or vector) of the checkpoint, resolved and checked. */
typedef struct ds4_hf_source {
    ds4_hf_enc enc;
    const ds4_st_tensor *w;
    const ds4_st_tensor *scale; /* FP8/FP4 only */
    int64_t rows, cols;         /* logical [rows, cols] */
    uint32_t block_out, block_in;
} ds4_hf_source;

/* Find the HF tensor(s) behind layout tensor `t` (expert `expert` for routed
 * experts), choose the decoding from the dtypes and check every shape
 * against the layout: a missing tensor or scale, a dtype that fits no
 * encoding and a shape mismatch are errors naming the HF and GGUF tensors. */
int ds4_hf_resolve(ds4_st_ckpt *ck, const ds4_hf_config *hc, const ds4_tensor_spec *t, int expert, ds4_hf_source *src,
                   ds4_err *err);

/* Decode rows [row0, row0 + nrows) to f32 (cols values per row).  Values
 * that decode to inf or NaN are an error naming the tensor and position. */
int ds4_hf_decode_rows(const ds4_hf_source *src, int64_t row0, int64_t nrows, float *out, ds4_err *err);

/* Decode an integer tensor to I32; values outside int32 or outside
 * [0, limit) (when limit > 0) are errors. */
int ds4_hf_decode_i32(const ds4_hf_source *src, int64_t limit, int32_t *out, ds4_err *err);

#endif
