/*
 * weights.h - a ds4 GGUF opened as a model: the validated config and one
 * typed view per tensor, used in place from the mmap (never copied).
 *
 * This is the model layer's entry point.  ds4_weights_open() reads every
 * deepseek4.* key (config.c) and binds every tensor of the inventory
 * (layout.c), checking each name, shape and storage type; a wrong or
 * missing one is an error naming the tensor or key.  Shapes come from the
 * metadata, so the published 284B model and the tiny test models share
 * this code.
 *
 * Extra tensors: `mtp.*` tensors (the MTP block, docs/MODEL.md 2.5, shipped in a
 * separate file but harmless in the main one) are ignored; any other name
 * the inventory does not know is an error, because it means the file is not
 * the layout this engine computes (a misspelt or foreign tensor would
 * otherwise be silently unused).
 */
#ifndef DS4_MODEL_WEIGHTS_H
#define DS4_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "format/gguf.h"
#include "model/config.h"

/* One tensor: ne[0] is the row length; ne[1] rows per matrix; ne[2]
 * matrices (experts).  data == NULL for an absent optional tensor. */
typedef struct ds4_wt {
    const void *data;
    uint32_t type;
    uint64_t ne[3];
    size_t row_bytes;      /* bytes of one row of ne[0] elements */
    const char *name;      /* the GGUF name (points into the reader) */
} ds4_wt;

typedef struct ds4_layer_weights {
    /* attention sublayer */
    ds4_wt hc_attn_fn, hc_attn_scale, hc_attn_base, attn_norm;
    ds4_wt q_a, q_a_norm, q_b, kv, kv_norm, sinks, out_a, out_b;
    /* compressor (ratio != 0) */
    ds4_wt comp_ape, comp_kv, comp_gate, comp_norm;
    /* lightning indexer (ratio 4) */
    ds4_wt idx_q_b, idx_proj, idx_ape, idx_kv, idx_gate, idx_norm;
    /* FFN sublayer */
    ds4_wt hc_ffn_fn, hc_ffn_scale, hc_ffn_base, ffn_norm;
    ds4_wt gate_inp, exp_bias, tid2eid;
    ds4_wt gate_exps, up_exps, down_exps, gate_sh, up_sh, down_sh;
} ds4_layer_weights;

typedef struct ds4_weights {
    ds4_config cfg;
    ds4_gguf *gguf;
    ds4_wt token_embd, output_hc_base, output_hc_fn, output_hc_scale, output_norm, output;
    ds4_layer_weights *layers; /* cfg.n_layer entries */
    bool synthetic;            /* shapes only: data NULL (ds4_weights_synthetic) */
    uint64_t synthetic_seed;
    void *owned;               /* names of a synthetic table */
} ds4_weights;

/* Open, validate and bind.  NULL on failure; the message starts with the
 * path and names the key or tensor at fault. */
ds4_weights *ds4_weights_open(const char *path, ds4_err *err);

/* Same over an already opened reader; on success the weights own it. */
ds4_weights *ds4_weights_from_gguf(ds4_gguf *g, ds4_err *err);

/* Shapes without data: every tensor a config and a recipe ("q2", "q4",
 * ...) call for, with its type and size and data == NULL, for backends that
 * fill weights themselves with seeded random values (speed measurements at
 * the real sizes without a file).  The router bias is left out on hash
 * layers, as ds4-mkmodel writes it. */
ds4_weights *ds4_weights_synthetic(const ds4_config *c, const char *recipe, uint64_t seed, ds4_err *err);

void ds4_weights_close(ds4_weights *w);

/* Pointer to row `row` of matrix `mat` (expert index) of a tensor. */
static inline const void *ds4_wt_row(const ds4_wt *t, uint64_t mat, uint64_t row) {
    return (const uint8_t *)t->data + (mat * t->ne[1] + row) * t->row_bytes;
}

#endif
