/*
 * hf_names.c - GGUF tensor name -> official Hugging Face name (see hf.h and
 * docs/MODEL.md 2.6).  Keys are the part of layout.c's names after the
 * "blk.N." prefix; this table and layout.c are the only places that spell
 * GGUF tensor names.
 */
#include "convert/hf.h"

#include <stdio.h>
#include <string.h>

typedef struct name_pair {
    const char *gguf;
    const char *hf;
} name_pair;

static const name_pair global_names[] = {
    {"token_embd.weight", "embed.weight"},
    {"output_norm.weight", "norm.weight"},
    {"output.weight", "head.weight"},
    {"output_hc_base.weight", "hc_head_base"},
    {"output_hc_fn.weight", "hc_head_fn"},
    {"output_hc_scale.weight", "hc_head_scale"},
};

/* Per-layer names; the HF name is prefixed with "layers.N.".  Routed
 * experts carry a %d for the expert id. */
static const name_pair layer_names[] = {
    {"hc_attn_base.weight", "hc_attn_base"},
    {"hc_attn_fn.weight", "hc_attn_fn"},
    {"hc_attn_scale.weight", "hc_attn_scale"},
    {"hc_ffn_base.weight", "hc_ffn_base"},
    {"hc_ffn_fn.weight", "hc_ffn_fn"},
    {"hc_ffn_scale.weight", "hc_ffn_scale"},
    {"attn_norm.weight", "attn_norm.weight"},
    {"ffn_norm.weight", "ffn_norm.weight"},
    {"attn_sinks.weight", "attn.attn_sink"},
    {"attn_q_a.weight", "attn.wq_a.weight"},
    {"attn_q_a_norm.weight", "attn.q_norm.weight"},
    {"attn_q_b.weight", "attn.wq_b.weight"},
    {"attn_kv.weight", "attn.wkv.weight"},
    {"attn_kv_a_norm.weight", "attn.kv_norm.weight"},
    {"attn_output_a.weight", "attn.wo_a.weight"},
    {"attn_output_b.weight", "attn.wo_b.weight"},
    {"attn_compressor_ape.weight", "attn.compressor.ape"},
    {"attn_compressor_kv.weight", "attn.compressor.wkv.weight"},
    {"attn_compressor_gate.weight", "attn.compressor.wgate.weight"},
    {"attn_compressor_norm.weight", "attn.compressor.norm.weight"},
    {"indexer.attn_q_b.weight", "attn.indexer.wq_b.weight"},
    {"indexer.proj.weight", "attn.indexer.weights_proj.weight"},
    {"indexer_compressor_ape.weight", "attn.indexer.compressor.ape"},
    {"indexer_compressor_kv.weight", "attn.indexer.compressor.wkv.weight"},
    {"indexer_compressor_gate.weight", "attn.indexer.compressor.wgate.weight"},
    {"indexer_compressor_norm.weight", "attn.indexer.compressor.norm.weight"},
    {"ffn_gate_inp.weight", "ffn.gate.weight"},
    {"exp_probs_b.bias", "ffn.gate.bias"},
    {"ffn_gate_tid2eid.weight", "ffn.gate.tid2eid"},
    {"ffn_gate_shexp.weight", "ffn.shared_experts.w1.weight"},
    {"ffn_up_shexp.weight", "ffn.shared_experts.w3.weight"},
    {"ffn_down_shexp.weight", "ffn.shared_experts.w2.weight"},
    {"ffn_gate_exps.weight", "ffn.experts.%d.w1.weight"},
    {"ffn_up_exps.weight", "ffn.experts.%d.w3.weight"},
    {"ffn_down_exps.weight", "ffn.experts.%d.w2.weight"},
};

static const char *lookup(const name_pair *tab, size_t n, const char *gguf) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(tab[i].gguf, gguf) == 0) return tab[i].hf;
    return NULL;
}

static bool is_routed(ds4_tclass cls) {
    return cls == DS4_TC_EXP_GATE || cls == DS4_TC_EXP_UP || cls == DS4_TC_EXP_DOWN;
}

int ds4_hf_name(const ds4_tensor_spec *t, int expert, char *buf, size_t len, ds4_err *err) {
    int n;
    if (t->layer < 0) {
        const char *hf = lookup(global_names, sizeof(global_names) / sizeof(global_names[0]), t->name);
        if (!hf) return ds4_err_set(err, DS4_ENOTFOUND, "tensor %s has no known Hugging Face name", t->name);
        n = snprintf(buf, len, "%s", hf);
    } else {
        /* layout.c names layer tensors "blk.N.<rest>". */
        const char *rest = strchr(t->name + 4, '.');
        const char *hf = rest ? lookup(layer_names, sizeof(layer_names) / sizeof(layer_names[0]), rest + 1) : NULL;
        if (!hf) return ds4_err_set(err, DS4_ENOTFOUND, "tensor %s has no known Hugging Face name", t->name);
        char tail[96];
        if (is_routed(t->cls)) {
            if (expert < 0) return ds4_err_set(err, DS4_EINVAL, "tensor %s: an expert id is needed", t->name);
            snprintf(tail, sizeof(tail), hf, expert);
        } else {
            snprintf(tail, sizeof(tail), "%s", hf);
        }
        n = snprintf(buf, len, "layers.%d.%s", t->layer, tail);
    }
    if (n < 0 || (size_t)n >= len) return ds4_err_set(err, DS4_ERANGE, "tensor %s: name buffer too small", t->name);
    return 0;
}

int ds4_hf_scale_name(const char *weight_name, char *buf, size_t len, ds4_err *err) {
    size_t n = strlen(weight_name);
    static const char suffix[] = ".weight";
    size_t s = sizeof(suffix) - 1;
    if (n < s || strcmp(weight_name + n - s, suffix) != 0)
        return ds4_err_set(err, DS4_EFORMAT, "%s: block-quantized tensor name does not end in .weight", weight_name);
    if (n - s + sizeof(".scale") > len) return ds4_err_set(err, DS4_ERANGE, "%s: name too long", weight_name);
    memcpy(buf, weight_name, n - s);
    memcpy(buf + n - s, ".scale", sizeof(".scale"));
    return 0;
}
