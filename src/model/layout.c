/*
 * layout.c - tensor inventory and quantization recipes (see layout.h).
 */
#include "model/layout.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "format/quants.h"

#define T(t) (1ull << (t))
/* Matrices may be any float type or Q8_0; routed experts also the 2/4-bit
 * K-quants of the published files. */
#define FLOATS (T(DS4_TYPE_F32) | T(DS4_TYPE_F16) | T(DS4_TYPE_BF16))
#define MATRIX (FLOATS | T(DS4_TYPE_Q8_0))
#define EXPERT (MATRIX | T(DS4_TYPE_Q2_K) | T(DS4_TYPE_Q4_K) | T(DS4_TYPE_IQ2_XXS))

typedef struct builder {
    ds4_tensor_spec *out;
    size_t n;
    int layer;
} builder;

static void add(builder *b, ds4_tclass cls, uint64_t allowed, bool optional, uint32_t ndim,
                uint64_t ne0, uint64_t ne1, uint64_t ne2, const char *fmt, ...) {
    if (b->out) {
        ds4_tensor_spec *t = &b->out[b->n];
        memset(t, 0, sizeof(*t));
        char local[40];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(local, sizeof(local), fmt, ap);
        va_end(ap);
        if (b->layer >= 0)
            snprintf(t->name, sizeof(t->name), "blk.%d.%s", b->layer, local);
        else
            snprintf(t->name, sizeof(t->name), "%s", local);
        t->cls = cls;
        t->layer = b->layer;
        t->ndim = ndim;
        t->ne[0] = ne0;
        t->ne[1] = ne1;
        t->ne[2] = ne2;
        t->optional = optional;
        t->allowed = allowed;
    }
    b->n++;
}

#define VEC(b, n, ...) add(b, DS4_TC_VECTOR, T(DS4_TYPE_F32), false, 1, n, 1, 1, __VA_ARGS__)
#define MAT(b, cls, allowed, in, out, ...) add(b, cls, allowed, false, 2, in, out, 1, __VA_ARGS__)

static void add_globals(builder *b, const ds4_config *c) {
    uint64_t hc_flat = (uint64_t)c->n_hc * c->n_embd;
    b->layer = -1;
    MAT(b, DS4_TC_TOKEN_EMBD, MATRIX, c->n_embd, c->n_vocab, "token_embd.weight");
    VEC(b, c->n_hc, "output_hc_base.weight");
    MAT(b, DS4_TC_HC_FN, FLOATS, hc_flat, c->n_hc, "output_hc_fn.weight");
    VEC(b, 1, "output_hc_scale.weight");
    VEC(b, c->n_embd, "output_norm.weight");
    MAT(b, DS4_TC_OUTPUT, MATRIX, c->n_embd, c->n_vocab, "output.weight");
}

static void add_attention(builder *b, const ds4_config *c) {
    uint64_t hc_flat = (uint64_t)c->n_hc * c->n_embd;
    uint64_t q_out = (uint64_t)c->n_head * c->head_dim;
    uint64_t group_in = q_out / c->o_groups;
    uint64_t o_low = (uint64_t)c->o_groups * c->o_lora_rank;

    MAT(b, DS4_TC_HC_FN, FLOATS, hc_flat, ds4_hc_mix(c), "hc_attn_fn.weight");
    VEC(b, 3, "hc_attn_scale.weight");
    VEC(b, ds4_hc_mix(c), "hc_attn_base.weight");
    VEC(b, c->n_embd, "attn_norm.weight");
    MAT(b, DS4_TC_ATTN_PROJ, MATRIX, c->n_embd, c->q_lora_rank, "attn_q_a.weight");
    VEC(b, c->q_lora_rank, "attn_q_a_norm.weight");
    MAT(b, DS4_TC_ATTN_PROJ, MATRIX, c->q_lora_rank, q_out, "attn_q_b.weight");
    MAT(b, DS4_TC_ATTN_PROJ, MATRIX, c->n_embd, c->head_dim, "attn_kv.weight");
    VEC(b, c->head_dim, "attn_kv_a_norm.weight");
    VEC(b, c->n_head, "attn_sinks.weight");
    /* Grouped output: each of the o_groups blocks of o_lora_rank rows reads
     * one group's heads (group_in values). */
    MAT(b, DS4_TC_ATTN_PROJ, MATRIX, group_in, o_low, "attn_output_a.weight");
    MAT(b, DS4_TC_ATTN_PROJ, MATRIX, o_low, c->n_embd, "attn_output_b.weight");
}

static void add_compressor(builder *b, const ds4_config *c, uint32_t ratio) {
    uint64_t width = (uint64_t)ds4_compress_coff(ratio) * c->head_dim;
    MAT(b, DS4_TC_COMPRESSOR_APE, FLOATS, width, ratio, "attn_compressor_ape.weight");
    MAT(b, DS4_TC_COMPRESSOR, MATRIX, c->n_embd, width, "attn_compressor_kv.weight");
    MAT(b, DS4_TC_COMPRESSOR, MATRIX, c->n_embd, width, "attn_compressor_gate.weight");
    VEC(b, c->head_dim, "attn_compressor_norm.weight");
}

static void add_indexer(builder *b, const ds4_config *c) {
    uint64_t width = 2ull * c->idx_head_dim; /* ratio 4: two overlapping lanes */
    MAT(b, DS4_TC_INDEXER, MATRIX, c->q_lora_rank, (uint64_t)c->idx_n_head * c->idx_head_dim, "indexer.attn_q_b.weight");
    MAT(b, DS4_TC_INDEXER, MATRIX, c->n_embd, c->idx_n_head, "indexer.proj.weight");
    MAT(b, DS4_TC_COMPRESSOR_APE, FLOATS, width, 4, "indexer_compressor_ape.weight");
    MAT(b, DS4_TC_INDEXER, MATRIX, c->n_embd, width, "indexer_compressor_kv.weight");
    MAT(b, DS4_TC_INDEXER, MATRIX, c->n_embd, width, "indexer_compressor_gate.weight");
    VEC(b, c->idx_head_dim, "indexer_compressor_norm.weight");
}

static void add_ffn(builder *b, const ds4_config *c, uint32_t il) {
    uint64_t hc_flat = (uint64_t)c->n_hc * c->n_embd;
    MAT(b, DS4_TC_HC_FN, FLOATS, hc_flat, ds4_hc_mix(c), "hc_ffn_fn.weight");
    VEC(b, 3, "hc_ffn_scale.weight");
    VEC(b, ds4_hc_mix(c), "hc_ffn_base.weight");
    VEC(b, c->n_embd, "ffn_norm.weight");
    MAT(b, DS4_TC_ROUTER, FLOATS, c->n_embd, c->n_expert, "ffn_gate_inp.weight");
    add(b, DS4_TC_ROUTER_BIAS, T(DS4_TYPE_F32), true, 1, c->n_expert, 1, 1, "exp_probs_b.bias");
    if (ds4_layer_is_hash(c, il))
        add(b, DS4_TC_HASH, T(DS4_TYPE_I32), false, 2, c->n_expert_used, c->n_vocab, 1, "ffn_gate_tid2eid.weight");
    add(b, DS4_TC_EXP_GATE, EXPERT, false, 3, c->n_embd, c->n_ff_exp, c->n_expert, "ffn_gate_exps.weight");
    add(b, DS4_TC_EXP_UP, EXPERT, false, 3, c->n_embd, c->n_ff_exp, c->n_expert, "ffn_up_exps.weight");
    add(b, DS4_TC_EXP_DOWN, EXPERT, false, 3, c->n_ff_exp, c->n_embd, c->n_expert, "ffn_down_exps.weight");
    MAT(b, DS4_TC_SHARED, MATRIX, c->n_embd, c->n_ff_exp, "ffn_gate_shexp.weight");
    MAT(b, DS4_TC_SHARED, MATRIX, c->n_embd, c->n_ff_exp, "ffn_up_shexp.weight");
    MAT(b, DS4_TC_SHARED, MATRIX, c->n_ff_exp, c->n_embd, "ffn_down_shexp.weight");
}

static size_t build(const ds4_config *c, ds4_tensor_spec *out) {
    builder b = {.out = out, .n = 0, .layer = -1};
    add_globals(&b, c);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        b.layer = (int)il;
        add_attention(&b, c);
        uint32_t ratio = ds4_layer_ratio(c, il);
        if (ratio != 0) add_compressor(&b, c, ratio);
        if (ds4_layer_has_indexer(c, il)) add_indexer(&b, c);
        add_ffn(&b, c, il);
    }
    return b.n;
}

size_t ds4_layout_count(const ds4_config *c) { return build(c, NULL); }
size_t ds4_layout_build(const ds4_config *c, ds4_tensor_spec *out) { return build(c, out); }

const char *ds4_tclass_name(ds4_tclass cls) {
    static const char *names[DS4_TC_COUNT] = {
        [DS4_TC_TOKEN_EMBD] = "embedding", [DS4_TC_OUTPUT] = "output",
        [DS4_TC_HC_FN] = "hc", [DS4_TC_VECTOR] = "vector",
        [DS4_TC_ATTN_PROJ] = "attention-proj", [DS4_TC_COMPRESSOR] = "compressor",
        [DS4_TC_COMPRESSOR_APE] = "compressor-ape", [DS4_TC_INDEXER] = "indexer",
        [DS4_TC_ROUTER] = "router", [DS4_TC_ROUTER_BIAS] = "router-bias",
        [DS4_TC_HASH] = "hash", [DS4_TC_EXP_GATE] = "routed-w1",
        [DS4_TC_EXP_UP] = "routed-w3", [DS4_TC_EXP_DOWN] = "routed-w2",
        [DS4_TC_SHARED] = "shared",
    };
    return (unsigned)cls < DS4_TC_COUNT ? names[cls] : "?";
}

/* ------------------------------------------------------------ recipes */

/* The published files keep everything but the routed experts at the same
 * high precision (docs/MODEL.md 2.6); the recipes differ only in the experts. */
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

static const ds4_recipe recipes[] = {
    {"f32", {DS4_UNIFORM_TYPES(DS4_TYPE_F32, DS4_TYPE_F32)}},
    {"f16", {DS4_UNIFORM_TYPES(DS4_TYPE_F16, DS4_TYPE_F32)}},
    {"q8_0", {DS4_BASE_TYPES, [DS4_TC_EXP_GATE] = DS4_TYPE_Q8_0, [DS4_TC_EXP_UP] = DS4_TYPE_Q8_0,
              [DS4_TC_EXP_DOWN] = DS4_TYPE_Q8_0}},
    {"q2", {DS4_BASE_TYPES, [DS4_TC_EXP_GATE] = DS4_TYPE_IQ2_XXS, [DS4_TC_EXP_UP] = DS4_TYPE_IQ2_XXS,
            [DS4_TC_EXP_DOWN] = DS4_TYPE_Q2_K}},
    {"q4", {DS4_BASE_TYPES, [DS4_TC_EXP_GATE] = DS4_TYPE_Q4_K, [DS4_TC_EXP_UP] = DS4_TYPE_Q4_K,
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
    if (!info || !(t->allowed & T(ty)))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "recipe %s: type %s is not accepted for %s",
                           r->name, info ? info->name : "?", t->name);
    if (t->ne[0] % (uint64_t)info->block_elems != 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "recipe %s: %s has rows of %llu values, not a multiple of the %s block (%lld)",
                           r->name, t->name, (unsigned long long)t->ne[0], info->name, (long long)info->block_elems);
    *type = ty;
    return 0;
}
