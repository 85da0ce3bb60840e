/*
 * official_ckpt.c - the tiny official-format checkpoint (see
 * official_ckpt.h; the generator is specified in
 * tests/reference/make_official_ckpt.py and mirrored here).
 */
#include "common/official_ckpt.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/st_build.h"

#define SEED  0x5EED0D54ull
#define GAMMA 0x9E3779B97F4A7C15ull

enum {
    L = 4,
    D = 256,
    V = 512,
    HC = 4,
    NH = 4,
    HD = 128,
    QL = 128,
    OL = 64,
    NU = 2,
    FF = 256,
    INH = 4,
    IHD = 128,
    NHASH = 3
};

/* What differs between the Flash-pattern checkpoint and the Pro-pattern one
 * (official_ckpt_opts.pro). */
typedef struct shape {
    int ratios[L], og, ne;
} shape;
static const shape FLASH_PATTERN = {{0, 0, 4, 128}, 2, 4};
static const shape PRO_PATTERN = {{128, 128, 4, 128}, 4, 8};

typedef enum { K_W, K_NORM, K_FP8, K_FP8S, K_FP4, K_FP4S, K_TID } kind;

typedef struct gen {
    const shape *sh;
    st_spec specs[3][256];
    size_t n[3];
    int k; /* generation counter */
    const official_ckpt_opts *opts;
    void *blobs[1024];
    int nblobs;
} gen;

static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t draw(int k, uint64_t i) { return mix(SEED + GAMMA * (((uint64_t)k << 32) + i + 1)); }

static size_t fill(int k, const char *dtype, uint64_t rows, uint64_t cols, kind kd, int n_expert, uint8_t **out) {
    uint64_t n = rows * cols;
    size_t es = strcmp(dtype, "F32") == 0 ? 4 : strcmp(dtype, "BF16") == 0 ? 2 : strcmp(dtype, "I64") == 0 ? 8 : 1;
    uint8_t *p = malloc(n * es);
    if (!p) abort();
    for (uint64_t i = 0; i < n; i++) {
        if (kd == K_TID) {
            if (i >= rows) break;
            uint64_t b = (draw(k, i) >> 32) % (uint64_t)n_expert;
            for (uint64_t j = 0; j < cols; j++) {
                int64_t v = (int64_t)((b + j) % (uint64_t)n_expert);
                memcpy(p + (i * cols + j) * 8, &v, 8);
            }
            continue;
        }
        uint64_t z = draw(k, i);
        uint8_t top = (uint8_t)(z >> 56);
        switch (kd) {
        case K_FP8:
        case K_FP4: p[i] = top; break;
        case K_FP8S: p[i] = (uint8_t)(115 + (top & 7)); break;
        case K_FP4S: p[i] = (uint8_t)(118 + (top & 7)); break;
        case K_NORM: {
            uint16_t h = (uint16_t)((126u + (top & 1u)) << 7 | (z & 0x7f));
            memcpy(p + 2 * i, &h, 2);
            break;
        }
        default: {
            uint32_t sign = (uint32_t)(z >> 63), ex = 119u + (top & 7u);
            if (es == 4) {
                uint32_t u = sign << 31 | ex << 23 | (uint32_t)(z & 0x7fffff);
                memcpy(p + 4 * i, &u, 4);
            } else {
                uint16_t h = (uint16_t)(sign << 15 | ex << 7 | (uint32_t)(z & 0x7f));
                memcpy(p + 2 * i, &h, 2);
            }
        }
        }
    }
    *out = p;
    return n * es;
}

static void add(gen *g, int shard, const char *name, const char *dtype, int ndim, uint64_t d0, uint64_t d1, kind kd) {
    uint64_t rows = ndim == 1 ? 1 : d0, cols = ndim == 1 ? d0 : d1;
    uint8_t *data;
    size_t nbytes = fill(g->k++, dtype, rows, cols, kd, g->sh->ne, &data);
    if (g->opts && g->opts->drop && strcmp(g->opts->drop, name) == 0) { /* left out; the others keep their bytes */
        free(data);
        return;
    }
    g->blobs[g->nblobs++] = data;
    st_spec *s = &g->specs[shard - 1][g->n[shard - 1]++];
    s->name = strdup(name);
    s->dtype = dtype;
    s->ndim = ndim;
    s->shape[0] = d0;
    s->shape[1] = d1;
    s->data = data;
    s->nbytes = nbytes;
    if (g->opts && g->opts->spoil && strcmp(g->opts->spoil, name) == 0) {
        if (g->opts->spoil_dtype) s->dtype = g->opts->spoil_dtype;
        if (g->opts->spoil_transpose) s->shape[0] = d1, s->shape[1] = d0;
    }
}

static void add1(gen *g, int shard, const char *name, const char *dtype, uint64_t n, kind kd) {
    add(g, shard, name, dtype, 1, n, 0, kd);
}

static void fp8(gen *g, int shard, const char *base, uint64_t o, uint64_t i) {
    char n[160];
    snprintf(n, sizeof(n), "%s.weight", base);
    add(g, shard, n, "F8_E4M3", 2, o, i, K_FP8);
    snprintf(n, sizeof(n), "%s.scale", base);
    add(g, shard, n, "F8_E8M0", 2, (o + 127) / 128, (i + 127) / 128, K_FP8S);
}

static void fp4(gen *g, int shard, const char *base, uint64_t o, uint64_t i) {
    char n[160];
    snprintf(n, sizeof(n), "%s.weight", base);
    add(g, shard, n, "I8", 2, o, i / 2, K_FP4);
    snprintf(n, sizeof(n), "%s.scale", base);
    add(g, shard, n, "F8_E8M0", 2, o, i / 32, K_FP4S);
}

#define NM(...) (snprintf(nm, sizeof(nm), __VA_ARGS__), nm)

/* A block's tensors under prefix p ("layers.N.", "mtp.0."), in shard s. */
static void block(gen *g, int s, const char *p, int ratio, bool hash) {
    char nm[160];
    int mixhc = (2 + HC) * HC, og = g->sh->og, ne = g->sh->ne;
    const char *subs[2] = {"attn", "ffn"};
    for (int j = 0; j < 2; j++) {
        add(g, s, NM("%shc_%s_fn", p, subs[j]), "F32", 2, mixhc, HC * D, K_W);
        add1(g, s, NM("%shc_%s_base", p, subs[j]), "F32", mixhc, K_W);
        add1(g, s, NM("%shc_%s_scale", p, subs[j]), "F32", 3, K_W);
    }
    add1(g, s, NM("%sattn_norm.weight", p), "BF16", D, K_NORM);
    add1(g, s, NM("%sffn_norm.weight", p), "BF16", D, K_NORM);
    add1(g, s, NM("%sattn.attn_sink", p), "F32", NH, K_W);
    fp8(g, s, NM("%sattn.wq_a", p), QL, D);
    add1(g, s, NM("%sattn.q_norm.weight", p), "BF16", QL, K_NORM);
    fp8(g, s, NM("%sattn.wq_b", p), NH * HD, QL);
    fp8(g, s, NM("%sattn.wkv", p), HD, D);
    add1(g, s, NM("%sattn.kv_norm.weight", p), "BF16", HD, K_NORM);
    fp8(g, s, NM("%sattn.wo_a", p), og * OL, NH * HD / og);
    fp8(g, s, NM("%sattn.wo_b", p), D, og * OL);
    if (ratio) {
        int coff = ratio == 4 ? 2 : 1;
        add(g, s, NM("%sattn.compressor.ape", p), "F32", 2, ratio, coff * HD, K_W);
        add(g, s, NM("%sattn.compressor.wkv.weight", p), "BF16", 2, coff * HD, D, K_W);
        add(g, s, NM("%sattn.compressor.wgate.weight", p), "BF16", 2, coff * HD, D, K_W);
        add1(g, s, NM("%sattn.compressor.norm.weight", p), "BF16", HD, K_NORM);
    }
    if (ratio == 4) {
        fp8(g, s, NM("%sattn.indexer.wq_b", p), INH * IHD, QL);
        add(g, s, NM("%sattn.indexer.weights_proj.weight", p), "BF16", 2, INH, D, K_W);
        add(g, s, NM("%sattn.indexer.compressor.ape", p), "F32", 2, 4, 2 * IHD, K_W);
        add(g, s, NM("%sattn.indexer.compressor.wkv.weight", p), "BF16", 2, 2 * IHD, D, K_W);
        add(g, s, NM("%sattn.indexer.compressor.wgate.weight", p), "BF16", 2, 2 * IHD, D, K_W);
        add1(g, s, NM("%sattn.indexer.compressor.norm.weight", p), "BF16", IHD, K_NORM);
    }
    add(g, s, NM("%sffn.gate.weight", p), "BF16", 2, ne, D, K_W);
    if (hash) add(g, s, NM("%sffn.gate.tid2eid", p), "I64", 2, V, NU, K_TID);
    else add1(g, s, NM("%sffn.gate.bias", p), "F32", ne, K_W);
    for (int e = 0; e < ne; e++) {
        fp4(g, s, NM("%sffn.experts.%d.w1", p, e), FF, D);
        fp4(g, s, NM("%sffn.experts.%d.w2", p, e), D, FF);
        fp4(g, s, NM("%sffn.experts.%d.w3", p, e), FF, D);
    }
    fp8(g, s, NM("%sffn.shared_experts.w1", p), FF, D);
    fp8(g, s, NM("%sffn.shared_experts.w2", p), D, FF);
    fp8(g, s, NM("%sffn.shared_experts.w3", p), FF, D);
}

static void layer(gen *g, int il) {
    char p[32];
    snprintf(p, sizeof(p), "layers.%d.", il);
    block(g, il == 0 ? 1 : il < 3 ? 2 : 3, p, g->sh->ratios[il], il < NHASH);
}

/* The MTP block's own tensors and its dense layer (after mtp.0.enorm). */
static void mtp_block(gen *g) {
    add1(g, 3, "mtp.0.hnorm.weight", "BF16", D, K_NORM);
    add1(g, 3, "mtp.0.norm.weight", "BF16", D, K_NORM);
    fp8(g, 3, "mtp.0.e_proj", D, D);
    fp8(g, 3, "mtp.0.h_proj", D, D);
    add(g, 3, "mtp.0.hc_head_fn", "F32", 2, HC, HC * D, K_W);
    add1(g, 3, "mtp.0.hc_head_base", "F32", HC, K_W);
    add1(g, 3, "mtp.0.hc_head_scale", "F32", 1, K_W);
    block(g, 3, "mtp.0.", 0, false);
}

/* %s: the ratios; %d: o_groups, n_routed_experts; %s: routed_scaling_factor */
static const char *config_json =
    "{\"architectures\":[\"DeepseekV4ForCausalLM\"],\"model_type\":\"deepseek_v4\",\"num_hidden_layers\":4,"
    "\"compress_ratios\":[%s],\"hidden_size\":256,\"vocab_size\":512,\"num_attention_heads\":4,"
    "\"num_key_value_heads\":1,\"head_dim\":128,\"qk_rope_head_dim\":64,\"q_lora_rank\":128,\"o_lora_rank\":64,"
    "\"o_groups\":%d,\"n_routed_experts\":%d,\"num_experts_per_tok\":2,\"n_shared_experts\":1,"
    "\"moe_intermediate_size\":256,\"num_hash_layers\":3,\"sliding_window\":16,\"index_n_heads\":4,"
    "\"index_head_dim\":128,\"index_topk\":512,\"hc_mult\":4,\"hc_sinkhorn_iters\":20,\"hc_eps\":1e-06,"
    "\"rms_norm_eps\":1e-06,\"rope_theta\":10000,\"compress_rope_theta\":160000,\"rope_scaling\":{\"type\":\"yarn\","
    "\"factor\":16,\"original_max_position_embeddings\":65536,\"beta_fast\":32,\"beta_slow\":1},"
    "\"routed_scaling_factor\":%s,\"norm_topk_prob\":true,\"max_position_embeddings\":1048576,"
    "\"swiglu_limit\":10.0,\"scoring_func\":\"sqrtsoftplus\",\"topk_method\":\"noaux_tc\","
    "\"num_nextn_predict_layers\":1,\"quantization_config\":{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
    "\"quant_method\":\"fp8\",\"scale_fmt\":\"ue8m0\",\"weight_block_size\":[128,128]}}\n";

static void write_index(const char *dir, const gen *g) {
    size_t cap = 1 << 16, len = 0;
    char *s = malloc(cap);
    const char *sep = "";
    len += (size_t)snprintf(s + len, cap - len, "{\"metadata\":{},\"weight_map\":{");
    for (int sh = 0; sh < 3; sh++)
        for (size_t i = 0; i < g->n[sh]; i++) {
            if (len + 256 > cap) s = realloc(s, cap *= 2);
            len += (size_t)snprintf(s + len, cap - len, "%s\"%s\":\"model-%05d-of-00003.safetensors\"", sep,
                                    g->specs[sh][i].name, sh + 1);
            sep = ",";
        }
    len += (size_t)snprintf(s + len, cap - len, "}}\n");
    char path[1024];
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    st_write_file(path, s, len);
    free(s);
}

void official_ckpt_write(const char *dir, const official_ckpt_opts *opts) {
    gen *g = calloc(1, sizeof(*g));
    if (!g) abort();
    g->opts = opts;
    g->sh = opts && opts->pro ? &PRO_PATTERN : &FLASH_PATTERN;
    add(g, 1, "embed.weight", "BF16", 2, V, D, K_W);
    add(g, 1, "head.weight", "BF16", 2, V, D, K_W);
    add1(g, 1, "norm.weight", "BF16", D, K_NORM);
    add(g, 1, "hc_head_fn", "F32", 2, HC, HC * D, K_W);
    add1(g, 1, "hc_head_base", "F32", HC, K_W);
    add1(g, 1, "hc_head_scale", "F32", 1, K_W);
    for (int il = 0; il < L; il++) layer(g, il);
    add1(g, 3, "mtp.0.enorm.weight", "BF16", D, K_NORM);
    if (opts && opts->mtp_block) mtp_block(g);

    char path[1024];
    for (int sh = 0; sh < 3; sh++) {
        uint8_t *buf;
        size_t len;
        st_build(g->specs[sh], g->n[sh], "{\"format\":\"pt\"}", &buf, &len);
        snprintf(path, sizeof(path), "%s/model-%05d-of-00003.safetensors", dir, sh + 1);
        st_write_file(path, buf, len);
        free(buf);
    }
    write_index(dir, g);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    char cfg[2048];
    bool pro = g->sh == &PRO_PATTERN;
    int n = snprintf(cfg, sizeof(cfg), config_json, pro ? "128,128,4,128,0" : "0,0,4,128,0", g->sh->og, g->sh->ne,
                     pro ? "2.5" : "1.5");
    st_write_file(path, cfg, (size_t)n);
    for (int sh = 0; sh < 3; sh++)
        for (size_t i = 0; i < g->n[sh]; i++) free((char *)g->specs[sh][i].name);
    for (int i = 0; i < g->nblobs; i++) free(g->blobs[i]);
    free(g);
}
