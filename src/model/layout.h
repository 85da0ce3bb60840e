/*
 * layout.h - the tensor inventory of a DeepSeek V4 Flash-architecture GGUF
 * (docs/MODEL.md 2.3-2.4) and the quantization recipes (2.6).
 *
 * One table, derived from a ds4_config, names every tensor with its shape,
 * its class and the storage types the engine accepts for it.  The model
 * loader validates files against it; the model generator and the quantizer
 * write files from it; nothing else spells tensor names.
 */
#ifndef DS4_MODEL_LAYOUT_H
#define DS4_MODEL_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/config.h"

/* What a tensor is, for quantization policy and type checks. */
typedef enum ds4_tclass {
    DS4_TC_TOKEN_EMBD,   /* token_embd */
    DS4_TC_OUTPUT,       /* output (LM head) */
    DS4_TC_HC_FN,        /* hc_{attn,ffn}_fn, output_hc_fn: HC mixers */
    DS4_TC_VECTOR,       /* norms, HC scale/base, sinks: always F32 in ds4 files */
    DS4_TC_ATTN_PROJ,    /* attn_q_a, attn_q_b, attn_kv, attn_output_a, attn_output_b */
    DS4_TC_COMPRESSOR,   /* attn_compressor_{kv,gate} */
    DS4_TC_COMPRESSOR_APE, /* attn_compressor_ape, indexer_compressor_ape */
    DS4_TC_INDEXER,      /* indexer.attn_q_b, indexer.proj, indexer_compressor_{kv,gate} */
    DS4_TC_ROUTER,       /* ffn_gate_inp */
    DS4_TC_ROUTER_BIAS,  /* exp_probs_b (optional) */
    DS4_TC_HASH,         /* ffn_gate_tid2eid (I32) */
    DS4_TC_EXP_GATE,     /* ffn_gate_exps (w1) */
    DS4_TC_EXP_UP,       /* ffn_up_exps (w3) */
    DS4_TC_EXP_DOWN,     /* ffn_down_exps (w2) */
    DS4_TC_SHARED,       /* ffn_{gate,up,down}_shexp */
    DS4_TC_COUNT
} ds4_tclass;

typedef struct ds4_tensor_spec {
    char name[64];
    ds4_tclass cls;
    int layer;             /* -1 for global tensors */
    uint32_t ndim;
    uint64_t ne[3];        /* GGUF order: ne[0] is the row length */
    bool optional;
    uint64_t allowed;      /* bit t set: ggml type t accepted */
} ds4_tensor_spec;

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
