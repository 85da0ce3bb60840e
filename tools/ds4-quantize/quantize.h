/*
 * quantize.h - internals shared by the files of tools/ds4-quantize: the
 * options, the per-tensor plan, where the weights come from, and the
 * conversion of one tensor into the GGUF writer.
 *
 * main.c parses options and plans (types, sizes, sources checked, nothing
 * decoded); source.c opens the input (the official checkpoint, or a ds4
 * GGUF to requantize) and decodes its matrices to f32; convert.c streams
 * each tensor: routed experts in batches of one expert per thread, other
 * matrices in row chunks, so memory stays at a few experts or chunks
 * whatever the model size.
 */
#ifndef DS4_TOOLS_QUANTIZE_H
#define DS4_TOOLS_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "base/threads.h"
#include "convert/gguf_src.h"
#include "convert/hf.h"
#include "convert/policy.h"
#include "convert/safetensors.h"
#include "format/gguf.h"
#include "format/imatrix.h"
#include "model/layout.h"

typedef struct qz_opts {
    const char *hf_dir;   /* the input: an official checkpoint ... */
    const char *gguf_in;  /* ... or a ds4 GGUF */
    const char *mtp_gguf; /* the MTP block's GGUF (default gguf_in) */
    const char *out;
    const char *mtp_out; /* the MTP block's file (mtp.0.* tensors), or NULL */
    const char *imatrix_path;
    const char *tokenizer_gguf;
    const char *tokenizer_json;
    const char *tokenizer_config;
    const char *name;
    const char *recipe;
    const char *compare_tensor;
    const char *compare_gguf;
    bool imatrix_strict;
    bool dry_run;
    bool overwrite;
    bool quiet;
    int threads;
    ds4_policy policy;
} qz_opts;

typedef struct qz_item {
    const ds4_tensor_spec *t;
    uint32_t type;        /* output ggml type */
    uint64_t nbytes;      /* output bytes */
    const char *src_type; /* of the (first) source tensor, for the plan */
} qz_item;

typedef struct qz_job {
    const qz_opts *o;
    ds4_hf_config hc;    /* from config.json, or (--gguf) hc.cfg from the metadata */
    ds4_st_ckpt *ck;     /* --hf */
    ds4_gguf *in;        /* --gguf */
    ds4_gguf *mtp_in;    /* --mtp-gguf, else NULL */
    const ds4_gguf *src; /* --gguf: the file the current plan reads */
    ds4_imatrix *im;     /* NULL without --imatrix */
    ds4_pool *pool;
    ds4_tensor_spec *specs;
    size_t nspecs;
    qz_item *items;
    size_t nitems;
    /* statistics */
    uint64_t elements_done;
    uint64_t bytes_done;
    uint64_t imatrix_used;   /* matrices quantized with an imatrix vector */
    uint64_t synthetic_used; /* matrices that fell back to column energy */
} qz_job;

/* One matrix (or vector, or expert) of the input, resolved and checked. */
typedef struct qz_source {
    ds4_hf_source hf;     /* --hf */
    ds4_gguf_source gguf; /* --gguf */
    bool is_gguf;
    int64_t rows, cols;
} qz_source;

/* Open the input named by the options: the shape (j->hc), the checkpoint
 * or the GGUF file(s).  qz_close_input() releases them. */
int qz_open_input(qz_job *j, ds4_err *err);
void qz_close_input(qz_job *j);

/* Read the model's tensors, or (mtp) the MTP block's, from here on: for a
 * GGUF input, --mtp-gguf's file when given. */
void qz_select_input(qz_job *j, bool mtp);

/* Whether the input holds an optional tensor. */
bool qz_input_has(const qz_job *j, const ds4_tensor_spec *t);

/* Find and check the source of layout tensor t (expert `expert` of a
 * routed tensor), decode its rows to f32, or its integers to I32 (values
 * in [0, n_expert)). */
int qz_resolve(const qz_job *j, const ds4_tensor_spec *t, int expert, qz_source *s, ds4_err *err);
int qz_decode_rows(const qz_source *s, int64_t row0, int64_t nrows, float *out, ds4_err *err);
int qz_decode_i32(const qz_job *j, const qz_source *s, int32_t *out, ds4_err *err);
/* The source's storage type, for the plan ("F8_E4M3", "q8_0"). */
const char *qz_source_type(const qz_source *s);

/* Whether a type's encoder uses per-column importance. */
bool qz_type_uses_importance(uint32_t type);

/* Where converted bytes go, in order: the GGUF writer, or a comparison
 * against a reference tensor (--compare-tensor). */
typedef struct qz_sink {
    int (*put)(struct qz_sink *s, const void *data, uint64_t n, ds4_err *err);
} qz_sink;

/* Decode, quantize and hand one planned tensor's bytes to the sink. */
int qz_convert(qz_job *j, const qz_item *it, qz_sink *sink, ds4_err *err);

#endif
