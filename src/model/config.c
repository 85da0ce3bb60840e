/*
 * config.c - deepseek4.* metadata <-> ds4_config (see config.h).
 */
#include "model/config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ARCH   "deepseek4" /* general.architecture of the files ds4 runs */
#define KEY(k) ARCH "." k

void ds4_config_schedule(ds4_config *c, uint32_t first_ratio) {
    for (uint32_t il = 0; il < DS4_MAX_LAYERS; il++) {
        c->compress_ratio[il] = il >= c->n_layer ? 0 : il < 2 ? first_ratio : (il % 2 == 0 ? 4 : 128);
        c->swiglu_clamp[il] = il >= c->n_layer ? 0.0f : 10.0f;
    }
}

/* What Flash and Pro share (docs/MODEL.md 1.1, 1.3). */
static void common_shapes(ds4_config *c) {
    memset(c, 0, sizeof(*c));
    c->n_vocab = 129280;
    c->n_head_kv = 1;
    c->head_dim = 512;
    c->rope_dim = 64;
    c->o_lora_rank = 1024;
    c->n_expert_used = 6;
    c->n_expert_shared = 1;
    c->n_hash_layer = 3;
    c->sliding_window = 128;
    c->idx_n_head = 64;
    c->idx_head_dim = 128;
    c->n_hc = 4;
    c->hc_sinkhorn_iters = 20;
    c->hc_eps = 1e-6f;
    c->rms_eps = 1e-6f;
    c->rope_base = 10000.0f;
    c->compress_rope_base = 160000.0f;
    c->yarn_factor = 16.0f;
    c->yarn_orig_ctx = 65536;
    c->yarn_beta_fast = 32.0f;
    c->yarn_beta_slow = 1.0f;
    c->expert_weights_norm = true;
    c->context_length = 1048576;
}

void ds4_config_flash(ds4_config *c) {
    common_shapes(c);
    c->n_layer = 43;
    c->n_embd = 4096;
    c->n_head = 64;
    c->q_lora_rank = 1024;
    c->o_groups = 8;
    c->n_expert = 256;
    c->n_ff_exp = 2048;
    c->idx_top_k = 512;
    c->expert_weights_scale = 1.5f;
    ds4_config_schedule(c, 0);
}

void ds4_config_pro(ds4_config *c) {
    common_shapes(c);
    c->n_layer = 61;
    c->n_embd = 7168;
    c->n_head = 128;
    c->q_lora_rank = 1536;
    c->o_groups = 16;
    c->n_expert = 384;
    c->n_ff_exp = 3072;
    c->idx_top_k = 1024;
    c->expert_weights_scale = 2.5f;
    ds4_config_schedule(c, 128);
}

/* ------------------------------------------------------------- reading */

static int get_u32(const ds4_gguf *g, const char *key, uint32_t *out, ds4_err *err) {
    /* docs/MODEL.md 1.1: integer keys are u32 (we also accept other integer
     * types holding a value that fits, as gguf-py writers sometimes do). */
    return ds4_gguf_get_u32(g, key, out, err);
}

static int get_f32(const ds4_gguf *g, const char *key, float *out, ds4_err *err) {
    double v;
    if (ds4_gguf_get_f64(g, key, &v, err) != 0) return -1;
    if (!isfinite(v)) return ds4_err_set(err, DS4_EFORMAT, "metadata %s: value is not finite", key);
    *out = (float)v;
    return 0;
}

static int read_ratios(const ds4_gguf *g, ds4_config *c, ds4_err *err) {
    const ds4_gguf_array *a;
    if (ds4_gguf_get_arr(g, KEY("attention.compress_ratios"), DS4_GGUF_VTYPE_COUNT, &a, err) != 0) return -1;
    if (a->type != DS4_GGUF_U32 && a->type != DS4_GGUF_I32)
        return ds4_err_set(err, DS4_EFORMAT, "metadata %s: array of %s, expected u32 or i32",
                           KEY("attention.compress_ratios"), ds4_gguf_vtype_name(a->type));
    /* One per layer, and possibly the MTP layer's 0 after them (the
     * official config lists it). */
    if (a->count != c->n_layer && !(a->count == c->n_layer + 1 && ds4_gguf_arr_i64(a, c->n_layer) == 0))
        return ds4_err_set(err, DS4_EFORMAT,
                           "metadata %s: %llu entries for %s = %u (one per layer, optionally then the MTP layer's 0)",
                           KEY("attention.compress_ratios"), (unsigned long long)a->count, KEY("block_count"),
                           c->n_layer);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        int64_t r = ds4_gguf_arr_i64(a, il);
        if (r != 0 && r != 4 && r != 128)
            return ds4_err_set(err, DS4_EUNSUPPORTED, "metadata %s[%u] = %lld: only 0, 4 and 128 are supported",
                               KEY("attention.compress_ratios"), il, (long long)r);
        c->compress_ratio[il] = (uint32_t)r;
    }
    return 0;
}

static int read_clamps(const ds4_gguf *g, ds4_config *c, ds4_err *err) {
    const ds4_gguf_array *a;
    if (ds4_gguf_get_arr(g, KEY("swiglu_clamp_exp"), DS4_GGUF_VTYPE_COUNT, &a, err) != 0) return -1;
    if (a->type != DS4_GGUF_F32 && a->type != DS4_GGUF_F64)
        return ds4_err_set(err, DS4_EFORMAT, "metadata %s: array of %s, expected f32", KEY("swiglu_clamp_exp"),
                           ds4_gguf_vtype_name(a->type));
    if (a->count != c->n_layer && a->count != c->n_layer + 1)
        return ds4_err_set(err, DS4_EFORMAT,
                           "metadata %s: %llu entries for %s = %u (one per layer, optionally then "
                           "the MTP layer's)",
                           KEY("swiglu_clamp_exp"), (unsigned long long)a->count, KEY("block_count"), c->n_layer);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        double v = ds4_gguf_arr_f64(a, il);
        if (!(v >= 0.0) || !isfinite(v))
            return ds4_err_set(err, DS4_EFORMAT, "metadata %s[%u] = %g: must be finite and >= 0",
                               KEY("swiglu_clamp_exp"), il, v);
        c->swiglu_clamp[il] = (float)v;
    }
    return 0;
}

/* Expert groups are a DeepSeek V3 feature Flash does not use; a file that
 * sets them describes a different routing than the one implemented. */
static int check_no_expert_groups(const ds4_gguf *g, ds4_err *err) {
    static const char *keys[] = {KEY("expert_group_count"), KEY("expert_group_used_count")};
    for (int i = 0; i < 2; i++) {
        if (!ds4_gguf_find_kv(g, keys[i])) continue;
        uint32_t v;
        if (get_u32(g, keys[i], &v, err) != 0) return -1;
        if (v != 0)
            return ds4_err_set(err, DS4_EUNSUPPORTED, "metadata %s = %u: expert groups are not supported", keys[i], v);
    }
    return 0;
}

/* A GGUF that holds no model at all (no deepseek4.* shape): say what it is
 * rather than which key is missing first. */
static int check_holds_model(const ds4_gguf *g, ds4_err *err) {
    if (ds4_gguf_find_kv(g, KEY("block_count"))) return 0;
    ds4_str arch = {0};
    if (ds4_gguf_find_kv(g, "general.architecture") && ds4_gguf_get_str(g, "general.architecture", &arch, err) != 0)
        return -1;
    if (arch.len && (arch.len != strlen(ARCH) || memcmp(arch.ptr, ARCH, arch.len) != 0))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: architecture \"%.*s\": ds4 runs %s (DeepSeek V4) models only",
                           g->path, (int)arch.len, arch.ptr, ARCH);
    if (!arch.len && g->n_tensors == 0 && ds4_gguf_find_kv(g, "tokenizer.ggml.tokens"))
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "%s: a tokenizer-only GGUF (tokenizer metadata, no model weights, as ds4-tokenizer import "
                           "writes): give a model file (ds4 --dump-tokens and ds4-tokenizer -t read this one)",
                           g->path);
    return 0; /* the missing key is the message */
}

int ds4_config_from_gguf(const ds4_gguf *g, ds4_config *c, ds4_err *err) {
    memset(c, 0, sizeof(*c));
    if (check_holds_model(g, err) != 0) return -1;
    struct {
        const char *key;
        uint32_t *dst;
    } u32s[] = {
        {KEY("block_count"), &c->n_layer},
        {KEY("embedding_length"), &c->n_embd},
        {KEY("vocab_size"), &c->n_vocab},
        {KEY("attention.head_count"), &c->n_head},
        {KEY("attention.head_count_kv"), &c->n_head_kv},
        {KEY("attention.key_length"), &c->head_dim},
        {KEY("rope.dimension_count"), &c->rope_dim},
        {KEY("attention.q_lora_rank"), &c->q_lora_rank},
        {KEY("attention.output_lora_rank"), &c->o_lora_rank},
        {KEY("attention.output_group_count"), &c->o_groups},
        {KEY("expert_count"), &c->n_expert},
        {KEY("expert_used_count"), &c->n_expert_used},
        {KEY("expert_shared_count"), &c->n_expert_shared},
        {KEY("expert_feed_forward_length"), &c->n_ff_exp},
        {KEY("hash_layer_count"), &c->n_hash_layer},
        {KEY("attention.sliding_window"), &c->sliding_window},
        {KEY("attention.indexer.head_count"), &c->idx_n_head},
        {KEY("attention.indexer.key_length"), &c->idx_head_dim},
        {KEY("attention.indexer.top_k"), &c->idx_top_k},
        {KEY("hyper_connection.count"), &c->n_hc},
        {KEY("hyper_connection.sinkhorn_iterations"), &c->hc_sinkhorn_iters},
    };
    for (size_t i = 0; i < sizeof(u32s) / sizeof(u32s[0]); i++)
        if (get_u32(g, u32s[i].key, u32s[i].dst, err) != 0) return -1;

    uint32_t value_length;
    if (get_u32(g, KEY("attention.value_length"), &value_length, err) != 0) return -1;
    if (value_length != c->head_dim)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "metadata %s = %u differs from %s = %u: K and V share one row",
                           KEY("attention.value_length"), value_length, KEY("attention.key_length"), c->head_dim);

    struct {
        const char *key;
        float *dst;
    } f32s[] = {
        {KEY("hyper_connection.epsilon"), &c->hc_eps},
        {KEY("attention.layer_norm_rms_epsilon"), &c->rms_eps},
        {KEY("rope.freq_base"), &c->rope_base},
        {KEY("attention.compress_rope_freq_base"), &c->compress_rope_base},
        {KEY("rope.scaling.factor"), &c->yarn_factor},
        {KEY("rope.scaling.yarn_beta_fast"), &c->yarn_beta_fast},
        {KEY("rope.scaling.yarn_beta_slow"), &c->yarn_beta_slow},
        {KEY("expert_weights_scale"), &c->expert_weights_scale},
    };
    for (size_t i = 0; i < sizeof(f32s) / sizeof(f32s[0]); i++)
        if (get_f32(g, f32s[i].key, f32s[i].dst, err) != 0) return -1;

    if (ds4_gguf_get_u64(g, KEY("rope.scaling.original_context_length"), &c->yarn_orig_ctx, err) != 0) return -1;
    if (ds4_gguf_get_bool(g, KEY("expert_weights_norm"), &c->expert_weights_norm, err) != 0) return -1;
    if (ds4_gguf_find_kv(g, KEY("context_length")) &&
        ds4_gguf_get_u64(g, KEY("context_length"), &c->context_length, err) != 0)
        return -1;
    if (check_no_expert_groups(g, err) != 0) return -1;

    if (c->n_layer == 0 || c->n_layer > DS4_MAX_LAYERS)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "metadata %s = %u: must be 1..%d", KEY("block_count"), c->n_layer,
                           DS4_MAX_LAYERS);
    if (read_ratios(g, c, err) != 0) return -1;
    if (read_clamps(g, c, err) != 0) return -1;
    return ds4_config_validate(c, err);
}

/* ---------------------------------------------------------- validation */

/* clang-format off */
#define REQUIRE(cond, ...)                                                     \
    do {                                                                       \
        if (!(cond)) return ds4_err_set(err, DS4_EUNSUPPORTED, __VA_ARGS__);   \
    } while (0)
/* clang-format on */

/* What the forward pass itself needs.  Widths need no particular
 * divisibility: the quantized types a file uses bring their block sizes,
 * which the loader checks per tensor (weights.c), and the simulations
 * bring theirs (ds4_config_check_sim), checked only where they run. */
int ds4_config_validate(const ds4_config *c, ds4_err *err) {
    REQUIRE(c->n_layer >= 1 && c->n_layer <= DS4_MAX_LAYERS, "block_count %u: must be 1..%d", c->n_layer,
            DS4_MAX_LAYERS);
    REQUIRE(c->n_embd > 0, "embedding_length must be positive");
    REQUIRE(c->n_vocab > 0, "vocab_size must be positive");
    REQUIRE(c->n_head > 0 && c->n_head_kv == 1, "attention: %u heads, %u KV heads: ds4 implements MQA with one KV head",
            c->n_head, c->n_head_kv);
    REQUIRE(c->head_dim > 0, "key_length must be positive");
    REQUIRE(c->rope_dim > 0 && c->rope_dim % 2 == 0 && c->rope_dim <= c->head_dim,
            "rope.dimension_count %u: must be even and at most key_length %u", c->rope_dim, c->head_dim);
    REQUIRE(c->q_lora_rank > 0, "q_lora_rank must be positive");
    REQUIRE(c->o_groups > 0 && c->n_head % c->o_groups == 0, "output_group_count %u: must divide head_count %u",
            c->o_groups, c->n_head);
    REQUIRE(c->o_lora_rank > 0, "output_lora_rank must be positive");
    REQUIRE(c->n_expert > 0 && c->n_expert_used > 0 && c->n_expert_used <= c->n_expert,
            "expert_used_count %u of expert_count %u: must be 1..expert_count", c->n_expert_used, c->n_expert);
    REQUIRE(c->n_expert_shared == 1, "expert_shared_count %u: ds4 implements exactly one shared expert",
            c->n_expert_shared);
    REQUIRE(c->n_ff_exp > 0, "expert_feed_forward_length must be positive");
    REQUIRE(c->n_hash_layer <= c->n_layer, "hash_layer_count %u exceeds block_count %u", c->n_hash_layer, c->n_layer);
    REQUIRE(c->sliding_window > 0, "sliding_window must be positive");
    REQUIRE(c->n_hc >= 1 && c->n_hc <= 16, "hyper_connection.count %u: must be 1..16", c->n_hc);
    REQUIRE(c->hc_sinkhorn_iters >= 1, "hyper_connection.sinkhorn_iterations must be at least 1");
    REQUIRE(c->rms_eps > 0 && c->hc_eps >= 0, "epsilons must be positive");
    REQUIRE(c->rope_base > 1 && c->compress_rope_base > 1, "RoPE bases must be > 1");
    REQUIRE(c->yarn_factor >= 1 && c->yarn_orig_ctx > 0 && c->yarn_beta_fast > 0 && c->yarn_beta_slow > 0,
            "YaRN parameters out of range (factor %g, original context %llu, beta %g/%g)", c->yarn_factor,
            (unsigned long long)c->yarn_orig_ctx, c->yarn_beta_fast, c->yarn_beta_slow);
    REQUIRE(c->expert_weights_scale > 0, "expert_weights_scale must be positive");

    for (uint32_t il = 0; il < c->n_layer; il++) {
        uint32_t r = c->compress_ratio[il];
        REQUIRE(r == 0 || r == 4 || r == 128, "compress_ratios[%u] = %u: only 0, 4 and 128 are supported", il, r);
    }
    if (ds4_config_has_indexer(c)) {
        REQUIRE(c->idx_n_head > 0, "indexer.head_count must be positive when ratio-4 layers exist");
        REQUIRE(c->idx_head_dim >= c->rope_dim, "indexer.key_length %u: must be at least rope.dimension_count %u",
                c->idx_head_dim, c->rope_dim);
        REQUIRE(c->idx_top_k > 0, "indexer.top_k must be positive");
    }
    return 0;
}

bool ds4_config_has_indexer(const ds4_config *c) {
    for (uint32_t il = 0; il < c->n_layer; il++)
        if (c->compress_ratio[il] == 4) return true;
    return false;
}

int ds4_config_check_sim(const ds4_config *c, ds4_err *err) {
    /* The FP8 KV simulation rounds the non-RoPE part in blocks of 64. */
    REQUIRE((c->head_dim - c->rope_dim) % 64 == 0,
            "key_length %u minus rope.dimension_count %u is not a multiple of 64: the FP8 KV simulation rounds "
            "blocks of 64 (run with the simulations off)",
            c->head_dim, c->rope_dim);
    /* The Hadamard + FP4 simulation works on 128-wide rows (docs/MODEL.md 4.4). */
    REQUIRE(!ds4_config_has_indexer(c) || c->idx_head_dim == 128,
            "indexer.key_length %u: the indexer simulation (Hadamard + FP4) needs 128 (run with the simulations off)",
            c->idx_head_dim);
    return 0;
}

static bool feq(float a, float b) { return fabsf(a - b) <= 1e-6f * fmaxf(fabsf(a), fabsf(b)); }

static bool same_shapes(const ds4_config *c, const ds4_config *f) {
    if (c->n_layer != f->n_layer || c->n_embd != f->n_embd || c->n_vocab != f->n_vocab || c->n_head != f->n_head ||
        c->n_head_kv != f->n_head_kv || c->head_dim != f->head_dim || c->rope_dim != f->rope_dim ||
        c->q_lora_rank != f->q_lora_rank || c->o_lora_rank != f->o_lora_rank || c->o_groups != f->o_groups ||
        c->n_expert != f->n_expert || c->n_expert_used != f->n_expert_used || c->n_ff_exp != f->n_ff_exp ||
        c->n_hash_layer != f->n_hash_layer || c->sliding_window != f->sliding_window ||
        c->idx_n_head != f->idx_n_head || c->idx_head_dim != f->idx_head_dim || c->idx_top_k != f->idx_top_k ||
        c->n_hc != f->n_hc || c->hc_sinkhorn_iters != f->hc_sinkhorn_iters || c->yarn_orig_ctx != f->yarn_orig_ctx ||
        c->expert_weights_norm != f->expert_weights_norm)
        return false;
    if (!feq(c->hc_eps, f->hc_eps) || !feq(c->rms_eps, f->rms_eps) || !feq(c->rope_base, f->rope_base) ||
        !feq(c->compress_rope_base, f->compress_rope_base) || !feq(c->yarn_factor, f->yarn_factor) ||
        !feq(c->yarn_beta_fast, f->yarn_beta_fast) || !feq(c->yarn_beta_slow, f->yarn_beta_slow) ||
        !feq(c->expert_weights_scale, f->expert_weights_scale))
        return false;
    for (uint32_t il = 0; il < f->n_layer; il++)
        if (c->compress_ratio[il] != f->compress_ratio[il] || !feq(c->swiglu_clamp[il], f->swiglu_clamp[il]))
            return false;
    return true;
}

bool ds4_config_is_flash(const ds4_config *c) {
    ds4_config f;
    ds4_config_flash(&f);
    return same_shapes(c, &f);
}

bool ds4_config_is_pro(const ds4_config *c) {
    ds4_config f;
    ds4_config_pro(&f);
    return same_shapes(c, &f);
}

const char *ds4_config_name(const ds4_config *c) {
    return ds4_config_is_flash(c) ? "DeepSeek V4 Flash" : ds4_config_is_pro(c) ? "DeepSeek V4 Pro" : NULL;
}

/* ------------------------------------------------------------- writing */

int ds4_config_to_gguf(const ds4_config *c, ds4_gguf_writer *w, ds4_err *err) {
    if (ds4_config_validate(c, err) != 0) return -1;
    int rc = 0;
    rc |= ds4_gguf_w_u32(w, KEY("block_count"), c->n_layer);
    rc |= ds4_gguf_w_u64(w, KEY("context_length"), c->context_length);
    rc |= ds4_gguf_w_u32(w, KEY("embedding_length"), c->n_embd);
    rc |= ds4_gguf_w_u32(w, KEY("vocab_size"), c->n_vocab);
    rc |= ds4_gguf_w_u32(w, KEY("attention.head_count"), c->n_head);
    rc |= ds4_gguf_w_u32(w, KEY("attention.head_count_kv"), c->n_head_kv);
    rc |= ds4_gguf_w_u32(w, KEY("attention.key_length"), c->head_dim);
    rc |= ds4_gguf_w_u32(w, KEY("attention.value_length"), c->head_dim);
    rc |= ds4_gguf_w_u32(w, KEY("rope.dimension_count"), c->rope_dim);
    rc |= ds4_gguf_w_u32(w, KEY("attention.q_lora_rank"), c->q_lora_rank);
    rc |= ds4_gguf_w_u32(w, KEY("attention.output_lora_rank"), c->o_lora_rank);
    rc |= ds4_gguf_w_u32(w, KEY("attention.output_group_count"), c->o_groups);
    rc |= ds4_gguf_w_u32(w, KEY("expert_count"), c->n_expert);
    rc |= ds4_gguf_w_u32(w, KEY("expert_used_count"), c->n_expert_used);
    rc |= ds4_gguf_w_u32(w, KEY("expert_shared_count"), c->n_expert_shared);
    rc |= ds4_gguf_w_u32(w, KEY("expert_feed_forward_length"), c->n_ff_exp);
    rc |= ds4_gguf_w_u32(w, KEY("hash_layer_count"), c->n_hash_layer);
    rc |= ds4_gguf_w_u32(w, KEY("expert_group_count"), 0);
    rc |= ds4_gguf_w_u32(w, KEY("expert_group_used_count"), 0);
    rc |= ds4_gguf_w_f32(w, KEY("expert_weights_scale"), c->expert_weights_scale);
    rc |= ds4_gguf_w_bool(w, KEY("expert_weights_norm"), c->expert_weights_norm);
    rc |= ds4_gguf_w_u32(w, KEY("attention.sliding_window"), c->sliding_window);
    rc |= ds4_gguf_w_u32(w, KEY("attention.indexer.head_count"), c->idx_n_head);
    rc |= ds4_gguf_w_u32(w, KEY("attention.indexer.key_length"), c->idx_head_dim);
    rc |= ds4_gguf_w_u32(w, KEY("attention.indexer.top_k"), c->idx_top_k);
    rc |= ds4_gguf_w_u32(w, KEY("hyper_connection.count"), c->n_hc);
    rc |= ds4_gguf_w_u32(w, KEY("hyper_connection.sinkhorn_iterations"), c->hc_sinkhorn_iters);
    rc |= ds4_gguf_w_f32(w, KEY("hyper_connection.epsilon"), c->hc_eps);
    rc |= ds4_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->rms_eps);
    rc |= ds4_gguf_w_f32(w, KEY("rope.freq_base"), c->rope_base);
    rc |= ds4_gguf_w_f32(w, KEY("attention.compress_rope_freq_base"), c->compress_rope_base);
    rc |= ds4_gguf_w_f32(w, KEY("rope.scaling.factor"), c->yarn_factor);
    rc |= ds4_gguf_w_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)c->yarn_orig_ctx);
    rc |= ds4_gguf_w_f32(w, KEY("rope.scaling.yarn_beta_fast"), c->yarn_beta_fast);
    rc |= ds4_gguf_w_f32(w, KEY("rope.scaling.yarn_beta_slow"), c->yarn_beta_slow);
    rc |= ds4_gguf_w_arr(w, KEY("attention.compress_ratios"), DS4_GGUF_U32, c->compress_ratio, c->n_layer);
    rc |= ds4_gguf_w_arr(w, KEY("swiglu_clamp_exp"), DS4_GGUF_F32, c->swiglu_clamp, c->n_layer);
    if (rc != 0) return ds4_err_set(err, DS4_EIO, "writing deepseek4.* metadata failed");
    return 0;
}
