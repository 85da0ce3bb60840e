/*
 * quantize.h - internals shared by the files of tools/ds4-quantize: the
 * options, the per-tensor plan, and the conversion of one tensor from the
 * official checkpoint into the GGUF writer.
 *
 * main.c parses options and plans (types, sizes, sources checked, nothing
 * decoded); convert.c streams each tensor: routed experts in batches of one
 * expert per thread, other matrices in row chunks, so memory stays at a few
 * experts or chunks whatever the model size.
 */
#ifndef DS4_TOOLS_QUANTIZE_H
#define DS4_TOOLS_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "base/threads.h"
#include "convert/hf.h"
#include "convert/policy.h"
#include "convert/safetensors.h"
#include "format/gguf.h"
#include "format/imatrix.h"
#include "model/layout.h"

typedef struct qz_opts {
    const char *hf_dir;
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
    uint32_t type;          /* output ggml type */
    uint64_t nbytes;        /* output bytes */
    ds4_st_dtype src_dtype; /* of the (first) source tensor, for the plan */
} qz_item;

typedef struct qz_job {
    const qz_opts *o;
    ds4_hf_config hc;
    ds4_st_ckpt *ck;
    ds4_imatrix *im; /* NULL without --imatrix */
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
