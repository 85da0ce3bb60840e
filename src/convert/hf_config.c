/*
 * hf_config.c - the official config.json -> ds4_config (see hf.h).
 *
 * Key mapping (config.json of deepseek-ai/DeepSeek-V4-Flash):
 *   num_hidden_layers -> n_layer, hidden_size -> n_embd, vocab_size,
 *   num_attention_heads -> n_head, num_key_value_heads -> n_head_kv,
 *   head_dim, qk_rope_head_dim -> rope_dim, q_lora_rank, o_lora_rank,
 *   o_groups, n_routed_experts -> n_expert, num_experts_per_tok ->
 *   n_expert_used, n_shared_experts, moe_intermediate_size -> n_ff_exp,
 *   num_hash_layers, sliding_window, index_n_heads, index_head_dim,
 *   index_topk, hc_mult -> n_hc, hc_sinkhorn_iters, hc_eps, rms_norm_eps,
 *   rope_theta, compress_rope_theta, rope_scaling.{factor,
 *   original_max_position_embeddings, beta_fast, beta_slow},
 *   routed_scaling_factor -> expert_weights_scale, norm_topk_prob ->
 *   expert_weights_norm, max_position_embeddings -> context_length,
 *   compress_ratios (n_layer entries; the release lists one more, the MTP
 *   layer's 0), swiglu_limit -> swiglu_clamp of every layer.
 * scoring_func must be "sqrtsoftplus" (the only routing ds4 implements).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "convert/hf.h"

typedef struct ctx {
    const char *path;
    const json_t *root;
    ds4_err *err;
} ctx;

static const json_t *need(ctx *c, const json_t *obj, const char *key) {
    const json_t *v = json_object_get(obj, key);
    if (!v) ds4_err_set(c->err, DS4_ENOTFOUND, "%s: missing key \"%s\"", c->path, key);
    return v;
}

static int get_u32(ctx *c, const json_t *obj, const char *key, uint32_t *out) {
    const json_t *v = need(c, obj, key);
    if (!v) return -1;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
        return ds4_err_set(c->err, DS4_EFORMAT, "%s: \"%s\" must be an integer in 0..2^32-1", c->path, key);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int get_f32(ctx *c, const json_t *obj, const char *key, float *out) {
    const json_t *v = need(c, obj, key);
    if (!v) return -1;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return ds4_err_set(c->err, DS4_EFORMAT, "%s: \"%s\" must be a finite number", c->path, key);
    *out = (float)json_number_value(v);
    return 0;
}

static int read_ratios(ctx *c, ds4_config *cfg) {
    const json_t *a = need(c, c->root, "compress_ratios");
    if (!a) return -1;
    /* One per layer, then (in the releases) the MTP layer's 0. */
    if (!json_is_array(a) ||
        (json_array_size(a) != cfg->n_layer &&
         !(json_array_size(a) == cfg->n_layer + 1 && json_is_integer(json_array_get(a, cfg->n_layer)) &&
           json_integer_value(json_array_get(a, cfg->n_layer)) == 0)))
        return ds4_err_set(c->err, DS4_EFORMAT,
                           "%s: \"compress_ratios\" must be an array of %u integers (num_hidden_layers), or %u ending "
                           "in the MTP layer's 0",
                           c->path, cfg->n_layer, cfg->n_layer + 1);
    for (uint32_t il = 0; il < cfg->n_layer; il++) {
        const json_t *v = json_array_get(a, il);
        if (!json_is_integer(v))
            return ds4_err_set(c->err, DS4_EFORMAT, "%s: compress_ratios[%u] is not an integer", c->path, il);
        json_int_t r = json_integer_value(v);
        if (r != 0 && r != 4 && r != 128)
            return ds4_err_set(c->err, DS4_EUNSUPPORTED, "%s: compress_ratios[%u] = %lld: only 0, 4 and 128", c->path,
                               il, (long long)r);
        cfg->compress_ratio[il] = (uint32_t)r;
    }
    return 0;
}

static int read_block_size(ctx *c, ds4_hf_config *out) {
    out->fp8_block_out = out->fp8_block_in = 128;
    const json_t *q = json_object_get(c->root, "quantization_config");
    if (!q) return 0;
    const json_t *s = json_object_get(q, "scale_fmt");
    if (s && (!json_is_string(s) || strcmp(json_string_value(s), "ue8m0") != 0))
        return ds4_err_set(c->err, DS4_EUNSUPPORTED, "%s: quantization_config.scale_fmt must be \"ue8m0\"", c->path);
    const json_t *f = json_object_get(q, "fmt");
    if (f && (!json_is_string(f) || strcmp(json_string_value(f), "e4m3") != 0))
        return ds4_err_set(c->err, DS4_EUNSUPPORTED, "%s: quantization_config.fmt must be \"e4m3\"", c->path);
    const json_t *b = json_object_get(q, "weight_block_size");
    if (!b) return 0;
    if (!json_is_array(b) || json_array_size(b) != 2 || !json_is_integer(json_array_get(b, 0)) ||
        !json_is_integer(json_array_get(b, 1)) || json_integer_value(json_array_get(b, 0)) <= 0 ||
        json_integer_value(json_array_get(b, 1)) <= 0 || json_integer_value(json_array_get(b, 0)) > 65536 ||
        json_integer_value(json_array_get(b, 1)) > 65536)
        return ds4_err_set(c->err, DS4_EFORMAT, "%s: quantization_config.weight_block_size must be [out, in]", c->path);
    out->fp8_block_out = (uint32_t)json_integer_value(json_array_get(b, 0));
    out->fp8_block_in = (uint32_t)json_integer_value(json_array_get(b, 1));
    return 0;
}

static int read_all(ctx *c, ds4_hf_config *out) {
    ds4_config *cfg = &out->cfg;
    const json_t *r = c->root;
    struct {
        const char *key;
        uint32_t *dst;
    } u32s[] = {
        {"num_hidden_layers", &cfg->n_layer},
        {"hidden_size", &cfg->n_embd},
        {"vocab_size", &cfg->n_vocab},
        {"num_attention_heads", &cfg->n_head},
        {"num_key_value_heads", &cfg->n_head_kv},
        {"head_dim", &cfg->head_dim},
        {"qk_rope_head_dim", &cfg->rope_dim},
        {"q_lora_rank", &cfg->q_lora_rank},
        {"o_lora_rank", &cfg->o_lora_rank},
        {"o_groups", &cfg->o_groups},
        {"n_routed_experts", &cfg->n_expert},
        {"num_experts_per_tok", &cfg->n_expert_used},
        {"n_shared_experts", &cfg->n_expert_shared},
        {"moe_intermediate_size", &cfg->n_ff_exp},
        {"num_hash_layers", &cfg->n_hash_layer},
        {"sliding_window", &cfg->sliding_window},
        {"index_n_heads", &cfg->idx_n_head},
        {"index_head_dim", &cfg->idx_head_dim},
        {"index_topk", &cfg->idx_top_k},
        {"hc_mult", &cfg->n_hc},
        {"hc_sinkhorn_iters", &cfg->hc_sinkhorn_iters},
    };
    for (size_t i = 0; i < sizeof(u32s) / sizeof(u32s[0]); i++)
        if (get_u32(c, r, u32s[i].key, u32s[i].dst) != 0) return -1;
    struct {
        const char *key;
        float *dst;
    } f32s[] = {
        {"hc_eps", &cfg->hc_eps},
        {"rms_norm_eps", &cfg->rms_eps},
        {"rope_theta", &cfg->rope_base},
        {"compress_rope_theta", &cfg->compress_rope_base},
        {"routed_scaling_factor", &cfg->expert_weights_scale},
    };
    for (size_t i = 0; i < sizeof(f32s) / sizeof(f32s[0]); i++)
        if (get_f32(c, r, f32s[i].key, f32s[i].dst) != 0) return -1;

    const json_t *rs = need(c, r, "rope_scaling");
    if (!rs) return -1;
    uint32_t orig;
    if (get_f32(c, rs, "factor", &cfg->yarn_factor) != 0 || get_f32(c, rs, "beta_fast", &cfg->yarn_beta_fast) != 0 ||
        get_f32(c, rs, "beta_slow", &cfg->yarn_beta_slow) != 0 ||
        get_u32(c, rs, "original_max_position_embeddings", &orig) != 0)
        return ds4_err_prefix(c->err, "rope_scaling");
    cfg->yarn_orig_ctx = orig;

    const json_t *norm = need(c, r, "norm_topk_prob");
    if (!norm) return -1;
    if (!json_is_boolean(norm))
        return ds4_err_set(c->err, DS4_EFORMAT, "%s: \"norm_topk_prob\" must be a boolean", c->path);
    cfg->expert_weights_norm = json_is_true(norm);
    uint32_t ctx_len = 0;
    if (json_object_get(r, "max_position_embeddings") && get_u32(c, r, "max_position_embeddings", &ctx_len) != 0)
        return -1;
    cfg->context_length = ctx_len;

    const json_t *sf = json_object_get(r, "scoring_func");
    if (sf && (!json_is_string(sf) || strcmp(json_string_value(sf), "sqrtsoftplus") != 0))
        return ds4_err_set(c->err, DS4_EUNSUPPORTED, "%s: scoring_func must be \"sqrtsoftplus\"", c->path);
    if (cfg->n_layer == 0 || cfg->n_layer > DS4_MAX_LAYERS)
        return ds4_err_set(c->err, DS4_EUNSUPPORTED, "%s: num_hidden_layers %u is not in 1..%d", c->path, cfg->n_layer,
                           DS4_MAX_LAYERS);
    float clamp;
    if (get_f32(c, r, "swiglu_limit", &clamp) != 0) return -1;
    for (uint32_t il = 0; il < cfg->n_layer; il++) cfg->swiglu_clamp[il] = clamp;
    if (read_ratios(c, cfg) != 0 || read_block_size(c, out) != 0) return -1;
    if (ds4_config_validate(cfg, c->err) != 0) return ds4_err_prefix(c->err, "%s", c->path);
    return 0;
}

int ds4_hf_config_load(const char *path, ds4_hf_config *out, ds4_err *err) {
    memset(out, 0, sizeof(*out));
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) return ds4_err_set(err, DS4_EFORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
    ctx c = {.path = path, .root = root, .err = err};
    int rc = json_is_object(root) ? read_all(&c, out) : ds4_err_set(err, DS4_EFORMAT, "%s: not a JSON object", path);
    json_decref(root);
    return rc;
}
