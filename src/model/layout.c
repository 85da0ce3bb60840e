/*
 * layout.c - tensor inventory and quantization recipes (see layout.h): the
 * rows of the tensor table (tensors.h) each block of a config has, with
 * their names and shapes spelled out.
 */
#include "model/layout.h"

#include <stdio.h>
#include <string.h>

#include "format/quants.h"

ds4_block ds4_block_global(void) { return (ds4_block){.layer = -1}; }

ds4_block ds4_block_layer(const ds4_config *c, uint32_t il) {
    ds4_block b = {.layer = (int)il,
                   .ratio = ds4_layer_ratio(c, il),
                   .indexer = ds4_layer_has_indexer(c, il),
                   .hash = ds4_layer_is_hash(c, il)};
    snprintf(b.prefix, sizeof(b.prefix), "blk.%u.", il);
    snprintf(b.hf_prefix, sizeof(b.hf_prefix), "layers.%u.", il);
    return b;
}

ds4_block ds4_block_mtp(void) {
    return (ds4_block){.layer = DS4_BLOCK_MTP, .prefix = "mtp.0.", .hf_prefix = "mtp.0.", .bias_required = true};
}

uint64_t ds4_dim_value(const ds4_config *c, const ds4_block *b, ds4_dim d) {
    uint64_t q_out = (uint64_t)c->n_head * c->head_dim;
    switch (d) {
    case DS4_DIM_ONE: return 1;
    case DS4_DIM_HC_SCALES: return 3;
    case DS4_DIM_EMBD: return c->n_embd;
    case DS4_DIM_VOCAB: return c->n_vocab;
    case DS4_DIM_HC: return c->n_hc;
    case DS4_DIM_HC_FLAT: return (uint64_t)c->n_hc * c->n_embd;
    case DS4_DIM_HC_MIX: return ds4_hc_mix(c);
    case DS4_DIM_Q_RANK: return c->q_lora_rank;
    case DS4_DIM_Q_OUT: return q_out;
    case DS4_DIM_HEAD_DIM: return c->head_dim;
    case DS4_DIM_N_HEAD: return c->n_head;
    case DS4_DIM_O_GROUP_IN: return q_out / c->o_groups;
    case DS4_DIM_O_LOW: return (uint64_t)c->o_groups * c->o_lora_rank;
    case DS4_DIM_RATIO: return b->ratio;
    case DS4_DIM_COMP_WIDTH: return (uint64_t)ds4_compress_coff(b->ratio) * c->head_dim;
    case DS4_DIM_IDX_Q_OUT: return (uint64_t)c->idx_n_head * c->idx_head_dim;
    case DS4_DIM_IDX_N_HEAD: return c->idx_n_head;
    case DS4_DIM_IDX_WIDTH: return (uint64_t)ds4_compress_coff(b->ratio) * c->idx_head_dim;
    case DS4_DIM_IDX_HEAD_DIM: return c->idx_head_dim;
    case DS4_DIM_EXPERTS: return c->n_expert;
    case DS4_DIM_EXPERTS_USED: return c->n_expert_used;
    case DS4_DIM_FF: return c->n_ff_exp;
    }
    return 0;
}

const char *ds4_dim_keys(ds4_dim d) {
    switch (d) {
    case DS4_DIM_ONE:
    case DS4_DIM_HC_SCALES: return NULL;
    case DS4_DIM_EMBD: return "deepseek4.embedding_length";
    case DS4_DIM_VOCAB: return "deepseek4.vocab_size";
    case DS4_DIM_HC:
    case DS4_DIM_HC_MIX: return "deepseek4.hyper_connection.count";
    case DS4_DIM_HC_FLAT: return "deepseek4.hyper_connection.count x deepseek4.embedding_length";
    case DS4_DIM_Q_RANK: return "deepseek4.attention.q_lora_rank";
    case DS4_DIM_Q_OUT: return "deepseek4.attention.head_count x deepseek4.attention.key_length";
    case DS4_DIM_HEAD_DIM: return "deepseek4.attention.key_length";
    case DS4_DIM_N_HEAD: return "deepseek4.attention.head_count";
    case DS4_DIM_O_GROUP_IN:
        return "deepseek4.attention.head_count x deepseek4.attention.key_length / deepseek4.attention.output_group_count";
    case DS4_DIM_O_LOW: return "deepseek4.attention.output_group_count x deepseek4.attention.output_lora_rank";
    case DS4_DIM_RATIO: return "deepseek4.attention.compress_ratios";
    case DS4_DIM_COMP_WIDTH: return "deepseek4.attention.compress_ratios and deepseek4.attention.key_length";
    case DS4_DIM_IDX_Q_OUT: return "deepseek4.attention.indexer.head_count x deepseek4.attention.indexer.key_length";
    case DS4_DIM_IDX_N_HEAD: return "deepseek4.attention.indexer.head_count";
    case DS4_DIM_IDX_WIDTH: return "deepseek4.attention.indexer.key_length";
    case DS4_DIM_IDX_HEAD_DIM: return "deepseek4.attention.indexer.key_length";
    case DS4_DIM_EXPERTS: return "deepseek4.expert_count";
    case DS4_DIM_EXPERTS_USED: return "deepseek4.expert_used_count";
    case DS4_DIM_FF: return "deepseek4.expert_feed_forward_length";
    }
    return NULL;
}

static bool block_has(const ds4_block *b, ds4_when when) {
    switch (when) {
    case DS4_WHEN_ALWAYS:
    case DS4_WHEN_LEARNED: return true;
    case DS4_WHEN_COMPRESSED: return b->ratio != 0;
    case DS4_WHEN_INDEXER: return b->indexer;
    case DS4_WHEN_HASH: return b->hash;
    }
    return false;
}

static void fill_spec(const ds4_config *c, const ds4_tensor_row *r, const ds4_block *b, ds4_tensor_spec *t) {
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s%s", b->prefix, r->name);
    snprintf(t->hf_prefix, sizeof(t->hf_prefix), "%s", b->hf_prefix);
    t->cls = r->cls;
    t->layer = b->layer;
    t->ndim = 1;
    for (uint32_t i = 0; i < 3; i++) {
        t->ne[i] = ds4_dim_value(c, b, r->ne[i]);
        if (r->ne[i] != DS4_DIM_ONE) t->ndim = i + 1;
    }
    bool learned = r->when == DS4_WHEN_LEARNED;
    t->optional = learned && !b->bias_required;
    t->generated = !(learned && b->hash);
    t->allowed = r->types;
    t->row = r;
}

size_t ds4_layout_block(const ds4_config *c, const ds4_tensor_row *rows, size_t n, const ds4_block *b,
                        ds4_tensor_spec *out) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (!block_has(b, rows[i].when)) continue;
        if (out) fill_spec(c, &rows[i], b, &out[k]);
        k++;
    }
    return k;
}

/* Globals first, then each layer. */
static size_t build(const ds4_config *c, ds4_tensor_spec *out) {
    ds4_block g = ds4_block_global();
    size_t n = ds4_layout_block(c, ds4_global_rows, DS4_N_GLOBAL_TENSORS, &g, out);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        ds4_block b = ds4_block_layer(c, il);
        n += ds4_layout_block(c, ds4_layer_rows, DS4_N_LAYER_TENSORS, &b, out ? out + n : NULL);
    }
    return n;
}

size_t ds4_layout_mtp(const ds4_config *c, ds4_tensor_spec *out) {
    ds4_block b = ds4_block_mtp();
    size_t n = ds4_layout_block(c, ds4_mtp_rows, DS4_N_MTP_TENSORS, &b, out);
    return n + ds4_layout_block(c, ds4_layer_rows, DS4_N_LAYER_TENSORS, &b, out ? out + n : NULL);
}

size_t ds4_layout_count(const ds4_config *c) { return build(c, NULL); }
size_t ds4_layout_build(const ds4_config *c, ds4_tensor_spec *out) { return build(c, out); }

const char *ds4_tclass_name(ds4_tclass cls) {
    static const char *names[DS4_TC_COUNT] = {
        [DS4_TC_TOKEN_EMBD] = "embedding",
        [DS4_TC_OUTPUT] = "output",
        [DS4_TC_HC_FN] = "hc",
        [DS4_TC_VECTOR] = "vector",
        [DS4_TC_ATTN_PROJ] = "attention-proj",
        [DS4_TC_COMPRESSOR] = "compressor",
        [DS4_TC_COMPRESSOR_APE] = "compressor-ape",
        [DS4_TC_INDEXER] = "indexer",
        [DS4_TC_ROUTER] = "router",
        [DS4_TC_ROUTER_BIAS] = "router-bias",
        [DS4_TC_HASH] = "hash",
        [DS4_TC_EXP_GATE] = "routed-w1",
        [DS4_TC_EXP_UP] = "routed-w3",
        [DS4_TC_EXP_DOWN] = "routed-w2",
        [DS4_TC_SHARED] = "shared",
    };
    return (unsigned)cls < DS4_TC_COUNT ? names[cls] : "?";
}

/* ------------------------------------------------------------ recipes */

/* The published files keep everything but the routed experts at the same
 * high precision (docs/MODEL.md 2.6); the recipes differ only in the experts. */
/* clang-format off */
#define DS4_BASE_TYPES                                                          \
    [DS4_TC_TOKEN_EMBD] = DS4_TYPE_F16, [DS4_TC_OUTPUT] = DS4_TYPE_Q8_0,        \
    [DS4_TC_HC_FN] = DS4_TYPE_F16, [DS4_TC_VECTOR] = DS4_TYPE_F32,              \
    [DS4_TC_ATTN_PROJ] = DS4_TYPE_Q8_0, [DS4_TC_COMPRESSOR] = DS4_TYPE_F16,     \
    [DS4_TC_COMPRESSOR_APE] = DS4_TYPE_F16, [DS4_TC_INDEXER] = DS4_TYPE_F16,    \
    [DS4_TC_ROUTER] = DS4_TYPE_F16, [DS4_TC_ROUTER_BIAS] = DS4_TYPE_F32,        \
    [DS4_TC_HASH] = DS4_TYPE_I32, [DS4_TC_SHARED] = DS4_TYPE_Q8_0

/* Every-tensor-one-type recipes, for reference comparisons and tests. */
#define DS4_UNIFORM_TYPES(ty, vec)                                              \
    [DS4_TC_TOKEN_EMBD] = ty, [DS4_TC_OUTPUT] = ty, [DS4_TC_HC_FN] = ty,        \
    [DS4_TC_VECTOR] = vec, [DS4_TC_ATTN_PROJ] = ty, [DS4_TC_COMPRESSOR] = ty,   \
    [DS4_TC_COMPRESSOR_APE] = ty, [DS4_TC_INDEXER] = ty, [DS4_TC_ROUTER] = ty,  \
    [DS4_TC_ROUTER_BIAS] = vec, [DS4_TC_HASH] = DS4_TYPE_I32,                   \
    [DS4_TC_EXP_GATE] = ty, [DS4_TC_EXP_UP] = ty, [DS4_TC_EXP_DOWN] = ty,       \
    [DS4_TC_SHARED] = ty
/* clang-format on */

static const ds4_recipe recipes[] = {
    {"f32", {DS4_UNIFORM_TYPES(DS4_TYPE_F32, DS4_TYPE_F32)}},
    {"f16", {DS4_UNIFORM_TYPES(DS4_TYPE_F16, DS4_TYPE_F32)}},
    {"q8_0",
     {DS4_BASE_TYPES, [DS4_TC_EXP_GATE] = DS4_TYPE_Q8_0, [DS4_TC_EXP_UP] = DS4_TYPE_Q8_0,
      [DS4_TC_EXP_DOWN] = DS4_TYPE_Q8_0}},
    {"q2",
     {DS4_BASE_TYPES, [DS4_TC_EXP_GATE] = DS4_TYPE_IQ2_XXS, [DS4_TC_EXP_UP] = DS4_TYPE_IQ2_XXS,
      [DS4_TC_EXP_DOWN] = DS4_TYPE_Q2_K}},
    {"q4",
     {DS4_BASE_TYPES, [DS4_TC_EXP_GATE] = DS4_TYPE_Q4_K, [DS4_TC_EXP_UP] = DS4_TYPE_Q4_K,
      [DS4_TC_EXP_DOWN] = DS4_TYPE_Q4_K}},
};

const ds4_recipe *ds4_recipe_get(const char *name) {
    for (size_t i = 0; i < sizeof(recipes) / sizeof(recipes[0]); i++)
        if (strcmp(recipes[i].name, name) == 0) return &recipes[i];
    return NULL;
}

const char *ds4_recipe_names(void) { return "f32, f16, q8_0, q2, q4"; }

int ds4_recipe_type_for(const ds4_recipe *r, const ds4_tensor_spec *t, uint32_t *type, ds4_err *err) {
    uint32_t ty = r->type[t->cls];
    const ds4_type_info *info = ds4_type_get(ty);
    if (!info || !(t->allowed & DS4_TYPE_BIT(ty)))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "recipe %s: type %s is not accepted for %s", r->name,
                           info ? info->name : "?", t->name);
    if (t->ne[0] % (uint64_t)info->block_elems != 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "recipe %s: %s has rows of %llu values, not a multiple of the %s block (%lld)", r->name,
                           t->name, (unsigned long long)t->ne[0], info->name, (long long)info->block_elems);
    *type = ty;
    return 0;
}
