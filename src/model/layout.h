/*
 * layout.h - the tensor inventory of a DeepSeek V4 Flash-architecture GGUF
 * (docs/MODEL.md 2.3-2.4) and the quantization recipes (2.6).
 *
 * The inventory is the tensor table (tensors.h) applied to a ds4_config:
 * every tensor the config calls for, with its full name, its shape in
 * numbers, its class and the storage types the engine accepts for it.  The
 * model loader validates files against it; the model generator and the
 * quantizer write files from it.
 */
#ifndef DS4_MODEL_LAYOUT_H
#define DS4_MODEL_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/config.h"
#include "model/tensors.h"

/* Where a list of tensors goes: the prefixes of its names and which of
 * the optional parts (tensors.h, ds4_when) it has. */
typedef struct ds4_block {
    int layer;          /* the main model's layer; -1 for the globals */
    char prefix[24];    /* of GGUF names: "blk.3.", "" */
    char hf_prefix[24]; /* of HF names: "layers.3.", "" */
    uint32_t ratio;     /* compression ratio; 0: dense (no compressor) */
    bool indexer;       /* the lightning indexer */
    bool hash;          /* hash routing (tid2eid) */
    bool bias_required; /* the router bias may not be absent */
} ds4_block;

/* The global tensors' block, layer il's, and the MTP block's (layer
 * DS4_BLOCK_MTP: dense, no hash table, the router bias required). */
#define DS4_BLOCK_MTP (-2)
ds4_block ds4_block_global(void);
ds4_block ds4_block_layer(const ds4_config *c, uint32_t il);
ds4_block ds4_block_mtp(void);

/* Value of a shape symbol for a block of config c. */
uint64_t ds4_dim_value(const ds4_config *c, const ds4_block *b, ds4_dim d);

typedef struct ds4_tensor_spec {
    char name[64];
    ds4_tclass cls;
    int layer; /* -1 for global tensors, DS4_BLOCK_MTP for the MTP block's */
    uint32_t ndim;
    uint64_t ne[3];            /* GGUF order: ne[0] is the row length */
    bool optional;             /* a file may lack it */
    bool generated;            /* ds4's generators write it (ds4-mkmodel,
                            * synthetic weights): not the router bias of
                            * hash layers */
    uint64_t allowed;          /* bit t set: ggml type t accepted */
    const ds4_tensor_row *row; /* the table row it comes from */
    char hf_prefix[24];        /* its block's HF prefix (convert/hf_names.c) */
} ds4_tensor_spec;

/* The metadata key(s) a dimension comes from ("deepseek4.expert_count"),
 * for messages; NULL for the fixed ones. */
const char *ds4_dim_keys(ds4_dim d);

/* The tensors of a list (rows, n) that block b has, appended to `out` in
 * the list's order (out NULL: only counted).  Returns how many. */
size_t ds4_layout_block(const ds4_config *c, const ds4_tensor_row *rows, size_t n, const ds4_block *b,
                        ds4_tensor_spec *out);

/* The MTP block's tensors in file order: its own, then its layer's
 * (out NULL: only counted).  Returns how many. */
size_t ds4_layout_mtp(const ds4_config *c, ds4_tensor_spec *out);

/* Number of tensors of a config (upper bound for the array passed below). */
size_t ds4_layout_count(const ds4_config *c);

/* Fill `out` (ds4_layout_count() entries) in canonical file order: globals
 * first, then each layer.  Returns the number written. */
size_t ds4_layout_build(const ds4_config *c, ds4_tensor_spec *out);

const char *ds4_tclass_name(ds4_tclass cls);

/* ---------------------------------------------------------- recipes */

/* A storage type for every tensor class. */
typedef struct ds4_recipe {
    const char *name;
    uint32_t type[DS4_TC_COUNT];
} ds4_recipe;

/* Named recipes: "f32", "f16", "q8_0", "q2" (IQ2_XXS gate/up + Q2_K down)
 * and "q4" (Q4_K experts); see MODEL.md 2.6.  NULL if unknown. */
const ds4_recipe *ds4_recipe_get(const char *name);

/* Comma-separated list of recipe names, for help texts. */
const char *ds4_recipe_names(void);

/* Type a recipe assigns to a tensor; checks the type is accepted for the
 * tensor and that its row length is a whole number of blocks. */
int ds4_recipe_type_for(const ds4_recipe *r, const ds4_tensor_spec *t, uint32_t *type, ds4_err *err);

#endif
