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
#include "model/tensors.h"

/* One tensor: ne[0] is the row length; ne[1] rows per matrix; ne[2]
 * matrices (experts).  data == NULL for an absent optional tensor. */
typedef struct ds4_wt {
    const void *data;
    uint32_t type;
    uint64_t ne[3];
    size_t row_bytes; /* bytes of one row of ne[0] elements */
    const char *name; /* the GGUF name (points into the reader) */
} ds4_wt;

/* The views of one layer, one field per row of DS4_LAYER_TENSORS
 * (tensors.h): hc_attn_fn, ..., q_a, q_b, kv, ..., gate_exps, down_sh. */
#define DS4_WT_FIELD(field, ...) ds4_wt field;
typedef struct ds4_layer_weights {
    DS4_LAYER_TENSORS(DS4_WT_FIELD)
} ds4_layer_weights;

/* The MTP block (docs/MODEL.md 2.5, 9): one V4 block under "mtp.0." (a
 * dense layer: no compressor, indexer or hash table) and its own input
 * projections, norms and HC head, one field per row of DS4_MTP_TENSORS;
 * the embedding and the output matrix are the main model's. */
typedef struct ds4_mtp_weights {
    ds4_config cfg;               /* its state's shape: the main config with one dense layer */
    ds4_gguf *gguf;               /* the file it is bound from */
    bool own_gguf;                /* a file of its own (not the main model's) */
    bool synthetic;               /* shapes only, data NULL (ds4_mtp_synthetic) */
    void *owned;                  /* names of a synthetic table */
    DS4_MTP_TENSORS(DS4_WT_FIELD) /* hc_head_*, e_proj, h_proj, enorm, hnorm, norm */
    ds4_layer_weights blk;
} ds4_mtp_weights;

typedef struct ds4_weights {
    ds4_config cfg;
    ds4_gguf *gguf;
    DS4_GLOBAL_TENSORS(DS4_WT_FIELD) /* token_embd, output_hc_*, output_norm, output */
    ds4_layer_weights *layers;       /* cfg.n_layer entries */
    bool synthetic;                  /* shapes only: data NULL (ds4_weights_synthetic) */
    uint64_t synthetic_seed;
    void *owned; /* names of a synthetic table */
} ds4_weights;
#undef DS4_WT_FIELD


/* Open, validate and bind.  NULL on failure; the message starts with the
 * path and names the key or tensor at fault. */
ds4_weights *ds4_weights_open(const char *path, ds4_err *err);

/* A header-only file (ds4-mkmodel --header-only) with the same checks on its
 * metadata and tensor table (every tensor's data NULL, the hash tables'
 * entries unchecked): what a model of its shapes would hold, e.g. Pro's.
 * A file with data is opened as ds4_weights_open opens it. */
ds4_weights *ds4_weights_open_header(const char *path, ds4_err *err);

/* Same over an already opened reader; on success the weights own it. */
ds4_weights *ds4_weights_from_gguf(ds4_gguf *g, ds4_err *err);

/* Shapes without data: every tensor a config and a recipe ("q2", "q4",
 * ...) call for, with its type and size and data == NULL, for backends that
 * fill weights themselves with seeded random values (speed measurements at
 * the real sizes without a file).  The router bias is left out on hash
 * layers, as ds4-mkmodel writes it. */
ds4_weights *ds4_weights_synthetic(const ds4_config *c, const char *recipe, uint64_t seed, ds4_err *err);

void ds4_weights_close(ds4_weights *w);

/* The MTP block of model w from its own GGUF (ds4's separate MTP file),
 * or from w's file when it holds one (NULL when it does not: err says so).
 * Every tensor is checked against w's shapes, so a block of another model
 * is refused naming the first tensor that does not fit; a file with
 * deepseek4.* metadata must also agree with w's shape keys. */
ds4_mtp_weights *ds4_mtp_open(const char *path, const ds4_weights *w, ds4_err *err);
ds4_mtp_weights *ds4_mtp_from_model(const ds4_weights *w, ds4_err *err);
/* Shapes without data for w's block, the recipe's types (as
 * ds4_weights_synthetic: the CUDA backend fills them with seeded random
 * values). */
ds4_mtp_weights *ds4_mtp_synthetic(const ds4_weights *w, const char *recipe, ds4_err *err);
void ds4_mtp_close(ds4_mtp_weights *m);

/* Every tensor view, in the tables' order: the globals, then each layer's
 * (an absent tensor has name == NULL).  i < ds4_weights_count(w); `row`,
 * when not NULL, receives the table row the view comes from. */
size_t ds4_weights_count(const ds4_weights *w);
const ds4_wt *ds4_weights_at(const ds4_weights *w, size_t i, const ds4_tensor_row **row);

/* Bytes of every weight tensor (file or synthetic). */
uint64_t ds4_weights_bytes(const ds4_weights *w);

/* Bytes of a tensor (0 for an absent one). */
static inline uint64_t ds4_wt_bytes(const ds4_wt *t) {
    if (!t->name) return 0;
    uint64_t mats = t->ne[2] ? t->ne[2] : 1;
    return (uint64_t)t->row_bytes * t->ne[1] * mats;
}

/* Pointer to row `row` of matrix `mat` (expert index) of a tensor. */
static inline const void *ds4_wt_row(const ds4_wt *t, uint64_t mat, uint64_t row) {
    return (const uint8_t *)t->data + (mat * t->ne[1] + row) * t->row_bytes;
}

#endif
