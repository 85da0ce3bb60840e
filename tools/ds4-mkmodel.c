/*
 * ds4-mkmodel - write a GGUF of the DeepSeek V4 architecture (Flash, Pro,
 * any consistent shape) with seeded random weights, or its header alone.
 *
 * Tests, benchmarks and the README's demo need models without downloading
 * the real 284B weights.  This tool writes files with ds4's exact tensor
 * names and deepseek4.* metadata (src/model/tensors.h and config.c decide
 * both), for any shape: tiny presets for tests, `flash` and `pro` for the
 * real sizes (--header-only: the metadata and tensor table without data,
 * for the shapes and memory of a model too large to write).
 * Weights are random with scales that keep activations of order one through
 * the layers (matrices N(0, 1/in), norms near 1, hash tables of distinct
 * experts; the table's init column), and are stored with one of the
 * quantization recipes.  The output is a pure function of the options:
 * every row is drawn from a generator seeded by (seed, tensor name, row),
 * so thread count does not change the bytes.
 *
 * With --random-blocks, quantized tensors are filled with random but valid
 * blocks instead of quantized random floats: that is how the full-size
 * synthetic models used for speed measurements are made in minutes rather
 * than hours (their outputs mean nothing, their bytes are realistic).
 *
 * With --sparse-experts N, each layer (and the MTP block) keeps N routed
 * experts, drawn at random; the others are holes in the file (zero blocks:
 * zero weights, no disk on filesystems with sparse files), and routing is
 * rigged to the kept ones: the router bias lifts them by SPARSE_MARGIN
 * over every other expert, the hash tables draw each token's experts among
 * them.  A full-size Flash file is then ~10 GB on disk instead of 81 GB,
 * and still exercises the routed products: the original ds4 engine, which
 * accepts only the full Flash shape, runs it beside this one (docs/COMPAT.md).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/fp.h"
#include "base/threads.h"
#include "base/numparse.h"
#include "engine/cli.h"
#include "format/gguf.h"
#include "format/quants.h"
#include "model/config.h"
#include "model/layout.h"

/* ------------------------------------------------------------ presets */

static void preset_tiny(ds4_config *c) {
    ds4_config_flash(c);
    c->n_layer = 6;
    c->n_embd = 256;
    c->n_vocab = 1024;
    c->n_head = 8;
    c->head_dim = 128;
    c->rope_dim = 64;
    c->q_lora_rank = 64;
    c->o_lora_rank = 64;
    c->o_groups = 2;
    c->n_expert = 8;
    c->n_expert_used = 2;
    c->n_ff_exp = 256;
    c->sliding_window = 16;
    c->idx_n_head = 32;
    c->idx_top_k = 8;
    c->context_length = 65536;
}

static void preset_small(ds4_config *c) {
    preset_tiny(c);
    c->n_layer = 8;
    c->n_embd = 512;
    c->n_head = 16;
    c->head_dim = 256;
    c->q_lora_rank = 128;
    c->o_lora_rank = 128;
    c->o_groups = 4;
    c->n_expert = 16;
    c->n_expert_used = 4;
    c->n_ff_exp = 512;
    c->sliding_window = 128;
    c->idx_top_k = 32;
}

static void preset_mid(ds4_config *c) {
    preset_small(c);
    c->n_layer = 12;
    c->n_embd = 1024;
    c->n_head = 16;
    c->head_dim = 512;
    c->q_lora_rank = 256;
    c->o_lora_rank = 256;
    c->o_groups = 4;
    c->n_expert = 32;
    c->n_expert_used = 6;
    c->n_ff_exp = 1024;
    c->idx_n_head = 64;
    c->idx_top_k = 64;
}

static int apply_preset(const char *name, ds4_config *c) {
    if (strcmp(name, "tiny") == 0) preset_tiny(c);
    else if (strcmp(name, "small") == 0) preset_small(c);
    else if (strcmp(name, "mid") == 0) preset_mid(c);
    else if (strcmp(name, "flash") == 0) ds4_config_flash(c);
    else if (strcmp(name, "pro") == 0) ds4_config_pro(c);
    else return -1;
    /* Ratios follow the published schedule (Flash's for the test presets)
     * for however many layers there are. */
    ds4_config_schedule(c, strcmp(name, "pro") == 0 ? 128 : 0);
    return 0;
}

/* ------------------------------------------------------------- random */

typedef struct rng {
    uint64_t s[4];
} rng;

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_u64(rng *r) { /* xoshiro256** */
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static float rng_uniform(rng *r) { return (float)((rng_u64(r) >> 40) * (1.0 / 16777216.0)); }

static float rng_normal(rng *r) {
    float u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-7f) u1 = 1e-7f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* ------------------------------------------------------ value choices */

/* How the values of one tensor are drawn. */
typedef struct dist {
    float mean, std;
} dist;

static dist tensor_dist(const ds4_tensor_spec *t) {
    dist d;
    ds4_init_dist(t->row->init, t->ne[0], &d.mean, &d.std);
    return d;
}

/* ----------------------------------------------------------- writing */

typedef struct gen_ctx {
    const ds4_tensor_spec *t;
    uint32_t type;
    uint64_t seed; /* tensor seed */
    uint64_t row0; /* first row of the current slab */
    const float *importance;
    const float *offset; /* added to every row before encoding (NULL: none) */
    int random_blocks;
    float *f32;   /* slab rows as floats, per row */
    uint8_t *out; /* slab rows encoded */
    size_t row_bytes;
    int64_t ne0;
} gen_ctx;

static void draw_row(const gen_ctx *g, uint64_t row, float *dst) {
    rng r;
    rng_seed(&r, g->seed ^ (row * 0xD1B54A32D192ED03ull));
    dist d = tensor_dist(g->t);
    for (int64_t i = 0; i < g->ne0; i++) dst[i] = d.mean + d.std * rng_normal(&r);
}

/* Random but valid quantized blocks whose values have roughly the
 * tensor's scale: quants are uniform, block scales are set so the
 * dequantized values have about the requested standard deviation. */
static void random_blocks_row(const gen_ctx *g, uint64_t row, uint8_t *dst) {
    rng r;
    rng_seed(&r, g->seed ^ (row * 0xD1B54A32D192ED03ull));
    for (size_t i = 0; i < g->row_bytes; i += 8) {
        uint64_t v = rng_u64(&r);
        memcpy(dst + i, &v, g->row_bytes - i < 8 ? g->row_bytes - i : 8);
    }
    float std = tensor_dist(g->t).std;
    const ds4_type_info *info = ds4_type_get(g->type);
    size_t nblocks = g->row_bytes / info->block_bytes;
    for (size_t b = 0; b < nblocks; b++) {
        uint8_t *blk = dst + b * info->block_bytes;
        uint16_t d, dmin;
        switch (g->type) {
        case DS4_TYPE_Q8_0: /* q uniform in [-128,127]: std ~74 */
            d = ds4_f32_to_f16(std / 74.0f);
            memcpy(blk, &d, 2);
            break;
        case DS4_TYPE_Q2_K: /* sc*q - m with q in 0..3, sc, m in 0..15 */
            d = ds4_f32_to_f16(std / 8.0f);
            dmin = ds4_f32_to_f16(std / 8.0f);
            memcpy(blk + 80, &d, 2);
            memcpy(blk + 82, &dmin, 2);
            break;
        case DS4_TYPE_Q4_K:
            d = ds4_f32_to_f16(std / 150.0f);
            dmin = ds4_f32_to_f16(std / 150.0f);
            memcpy(blk, &d, 2);
            memcpy(blk + 2, &dmin, 2);
            break;
        case DS4_TYPE_IQ2_XXS: /* grid values up to 43, group scale (2S+1)/8 */
            d = ds4_f32_to_f16(std / 40.0f);
            memcpy(blk, &d, 2);
            break;
        default: break;
        }
    }
}

static void gen_rows(void *vctx, int64_t begin, int64_t end, int thread) {
    gen_ctx *g = vctx;
    for (int64_t i = begin; i < end; i++) {
        uint64_t row = g->row0 + (uint64_t)i;
        uint8_t *dst = g->out + (size_t)i * g->row_bytes;
        if (g->random_blocks && g->type != DS4_TYPE_F32 && g->type != DS4_TYPE_F16 && g->type != DS4_TYPE_BF16) {
            random_blocks_row(g, row, dst);
            continue;
        }
        float *x = g->f32 + (size_t)i * (size_t)g->ne0;
        draw_row(g, row, x);
        if (g->offset)
            for (int64_t k = 0; k < g->ne0; k++) x[k] += g->offset[k];
        if (g->type == DS4_TYPE_F32) {
            memcpy(dst, x, (size_t)g->ne0 * 4);
        } else if (g->type == DS4_TYPE_F16) {
            ds4_f32_to_f16_row(x, (uint16_t *)(void *)dst, g->ne0);
        } else if (g->type == DS4_TYPE_BF16) {
            uint16_t *o = (uint16_t *)(void *)dst;
            for (int64_t k = 0; k < g->ne0; k++) o[k] = ds4_f32_to_bf16(x[k]);
        } else {
            ds4_quantize_row(g->type, x, dst, g->ne0, g->importance);
        }
    }
}

/* Hash routing table: each token gets n_expert_used distinct experts, of
 * the pool's n (pool NULL: of all n experts). */
static void gen_tid2eid(const ds4_tensor_spec *t, const uint32_t *pool, uint32_t n, uint64_t seed, int32_t *out) {
    uint32_t k = (uint32_t)t->ne[0];
    for (uint64_t tok = 0; tok < t->ne[1]; tok++) {
        rng r;
        rng_seed(&r, seed ^ (tok * 0xD1B54A32D192ED03ull));
        int32_t *row = out + tok * k;
        for (uint32_t j = 0; j < k; j++) {
            for (;;) {
                uint32_t pick = (uint32_t)(rng_u64(&r) % n);
                int32_t e = (int32_t)(pool ? pool[pick] : pick);
                uint32_t m = 0;
                while (m < j && row[m] != e) m++;
                if (m == j) {
                    row[j] = e;
                    break;
                }
            }
        }
    }
}

/* --sparse-experts: the router bias of a kept expert is its random value
 * plus this margin, so that the biased top-k (sqrt-softplus scores of
 * order one plus the bias) always picks kept experts, whatever rounding
 * the engine's router has. */
#define SPARSE_MARGIN 100.0f

/* Which routed experts hold weights: row r (a layer, or n_layer for the
 * MTP block) keeps the n experts list[r * n ...], ascending. */
typedef struct sparse_plan {
    uint32_t n;     /* kept per row; 0: every expert (a dense file) */
    uint32_t rows;  /* n_layer + 1 */
    uint32_t *list; /* rows x n */
    uint8_t *kept;  /* rows x n_expert: 1 where kept */
    uint32_t n_expert;
} sparse_plan;

/* The kept experts of every row: a seeded partial shuffle of 0..n_expert-1. */
static int sparse_plan_make(sparse_plan *p, uint32_t n, const ds4_config *c, uint64_t seed, ds4_err *err) {
    memset(p, 0, sizeof(*p));
    if (n == 0) return 0;
    p->n = n;
    p->rows = c->n_layer + 1;
    p->n_expert = c->n_expert;
    p->list = malloc((size_t)p->rows * n * sizeof(*p->list));
    p->kept = calloc((size_t)p->rows * c->n_expert, 1);
    uint32_t *perm = malloc((size_t)c->n_expert * sizeof(*perm));
    if (!p->list || !p->kept || !perm) {
        free(perm);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    for (uint32_t r = 0; r < p->rows; r++) {
        rng g;
        rng_seed(&g, seed ^ name_hash("sparse-experts") ^ ((uint64_t)r * 0xD1B54A32D192ED03ull));
        for (uint32_t e = 0; e < c->n_expert; e++) perm[e] = e;
        for (uint32_t j = 0; j < n; j++) {
            uint32_t o = j + (uint32_t)(rng_u64(&g) % (c->n_expert - j)), tmp = perm[j];
            perm[j] = perm[o];
            perm[o] = tmp;
            p->kept[(size_t)r * c->n_expert + perm[j]] = 1;
        }
        uint32_t *row = p->list + (size_t)r * n, m = 0;
        for (uint32_t e = 0; e < c->n_expert; e++)
            if (p->kept[(size_t)r * c->n_expert + e]) row[m++] = e;
    }
    free(perm);
    return 0;
}

static void sparse_plan_free(sparse_plan *p) {
    free(p->list);
    free(p->kept);
}

/* The plan's row of a tensor's block (-1: a global tensor, no experts). */
static int sparse_row(const sparse_plan *p, const ds4_tensor_spec *t) {
    if (p->n == 0 || t->layer == -1) return -1;
    return t->layer == DS4_BLOCK_MTP ? (int)p->rows - 1 : t->layer;
}

typedef struct opts {
    const char *out;
    const char *preset;
    const char *recipe;
    const char *tokenizer;
    const char *name;
    uint64_t seed;
    int threads;
    int random_blocks;
    int quiet;
    bool header_only;                     /* metadata and tensor table, no data */
    uint32_t type_override[DS4_TC_COUNT]; /* UINT32_MAX = recipe's */
    const char *mtp_out;                  /* also an MTP block (NULL: none) */
    uint32_t sparse_experts;              /* --sparse-experts N (0: dense) */
    sparse_plan sparse;
} opts;

static int write_tensor(ds4_gguf_writer *w, const ds4_tensor_spec *t, uint32_t type, const opts *o, const ds4_config *c,
                        ds4_pool *pool, ds4_err *err) {
    uint64_t seed = o->seed ^ name_hash(t->name);
    const sparse_plan *sp = &o->sparse;
    int srow = sparse_row(sp, t);
    if (t->cls == DS4_TC_HASH) {
        size_t n = (size_t)(t->ne[0] * t->ne[1]);
        int32_t *tab = malloc(n * sizeof(int32_t));
        if (!tab) return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", t->name);
        if (srow >= 0) gen_tid2eid(t, sp->list + (size_t)srow * sp->n, sp->n, seed, tab);
        else gen_tid2eid(t, NULL, c->n_expert, seed, tab);
        int rc = ds4_gguf_w_data(w, tab, n * sizeof(int32_t));
        free(tab);
        return rc;
    }

    int64_t ne0 = (int64_t)t->ne[0];
    uint64_t rows_per_mat = t->ne[1];
    uint64_t nmat = t->ndim == 3 ? t->ne[2] : 1;
    size_t row_bytes = ds4_row_bytes(type, ne0);
    /* Slabs of one matrix (one expert) at most, and at most ~64 MB of f32. */
    uint64_t slab = rows_per_mat;
    while (slab > 1 && slab * (uint64_t)ne0 * 4 > (64u << 20)) slab = (slab + 1) / 2;

    gen_ctx g = {
        .t = t, .type = type, .seed = seed, .random_blocks = o->random_blocks, .row_bytes = row_bytes, .ne0 = ne0};
    g.f32 = malloc((size_t)slab * (size_t)ne0 * sizeof(float));
    g.out = malloc((size_t)slab * row_bytes);
    float *energy = NULL, *lift = NULL;
    int rc = 0;
    if (!g.f32 || !g.out) rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", t->name);
    if (rc == 0 && srow >= 0 && t->cls == DS4_TC_ROUTER_BIAS) {
        lift = calloc((size_t)ne0, sizeof(float));
        if (!lift) rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", t->name);
        for (int64_t e = 0; lift && e < ne0; e++)
            if (sp->kept[(size_t)srow * sp->n_expert + (size_t)e]) lift[e] = SPARSE_MARGIN;
        g.offset = lift;
    }
    bool routed = t->cls == DS4_TC_EXP_GATE || t->cls == DS4_TC_EXP_UP || t->cls == DS4_TC_EXP_DOWN;

    int needs_importance = type == DS4_TYPE_IQ2_XXS && !o->random_blocks;
    for (uint64_t m = 0; rc == 0 && m < nmat; m++) {
        if (routed && srow >= 0 && !sp->kept[(size_t)srow * sp->n_expert + m]) {
            rc = ds4_gguf_w_hole(w, rows_per_mat * row_bytes); /* an expert never routed to */
            continue;
        }
        if (needs_importance) {
            /* Column-energy fallback (docs/MODEL.md 2.6) over the whole matrix,
             * which is regenerated here since rows are seeded by index. */
            if (!energy) energy = calloc((size_t)ne0, sizeof(float));
            if (!energy) {
                rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", t->name);
                break;
            }
            memset(energy, 0, (size_t)ne0 * sizeof(float));
            for (uint64_t r0 = 0; r0 < rows_per_mat; r0++) {
                draw_row(&g, m * rows_per_mat + r0, g.f32);
                for (int64_t i = 0; i < ne0; i++) energy[i] += g.f32[i] * g.f32[i];
            }
            g.importance = energy;
        }
        for (uint64_t r0 = 0; rc == 0 && r0 < rows_per_mat; r0 += slab) {
            uint64_t n = rows_per_mat - r0 < slab ? rows_per_mat - r0 : slab;
            g.row0 = m * rows_per_mat + r0;
            ds4_pool_run(pool, (int64_t)n, 1, gen_rows, &g);
            rc = ds4_gguf_w_data(w, g.out, n * row_bytes);
        }
    }
    free(energy);
    free(lift);
    free(g.f32);
    free(g.out);
    return rc;
}

static int copy_tokenizer(ds4_gguf_writer *w, const char *path, ds4_config *c, ds4_err *err) {
    ds4_gguf *tok = ds4_gguf_open(path, err);
    if (!tok) return ds4_err_prefix(err, "--tokenizer");
    int rc = 0, have_tokens = 0;
    for (uint64_t i = 0; i < tok->n_kv && rc == 0; i++) {
        const ds4_gguf_kv *kv = &tok->kv[i];
        if (strncmp(kv->key, "tokenizer.", 10) != 0) continue;
        if (strcmp(kv->key, "tokenizer.ggml.tokens") == 0) {
            have_tokens = 1;
            if (kv->value.type != DS4_GGUF_ARRAY || kv->value.a.count != c->n_vocab)
                rc = ds4_err_set(err, DS4_EINVAL, "tokenizer %s has %llu tokens but the model vocabulary is %u", path,
                                 (unsigned long long)kv->value.a.count, c->n_vocab);
        }
        if (rc == 0 && ds4_gguf_w_copy_kv(w, kv) != 0) rc = ds4_err_set(err, DS4_EIO, "copying %s failed", kv->key);
    }
    if (rc == 0 && !have_tokens) rc = ds4_err_set(err, DS4_EFORMAT, "tokenizer %s has no tokenizer.ggml.tokens", path);
    ds4_gguf_close(tok);
    return rc;
}

/* Vocabulary size of a tokenizer GGUF, so --vocab can follow it. */
static int tokenizer_vocab(const char *path, uint32_t *n, ds4_err *err) {
    ds4_gguf *tok = ds4_gguf_open(path, err);
    if (!tok) return ds4_err_prefix(err, "--tokenizer");
    const ds4_gguf_array *a;
    int rc = ds4_gguf_get_arr(tok, "tokenizer.ggml.tokens", DS4_GGUF_STRING, &a, err);
    if (rc == 0) *n = (uint32_t)a->count;
    ds4_gguf_close(tok);
    return rc;
}

/* A GGUF of the tensors `specs` (the model's inventory, or the MTP
 * block's) with the config's metadata, to path. */
static int write_file(const opts *o, const ds4_config *c, const ds4_recipe *recipe, const ds4_tensor_spec *specs,
                      size_t n, const char *path, bool tokenizer, ds4_err *err) {
    uint32_t *types = calloc(n ? n : 1, sizeof(*types));
    if (!types) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = ds4_recipe_type_for(recipe, &specs[i], &types[i], err);

    ds4_pool *pool = NULL;
    ds4_gguf_writer *w = NULL;
    if (rc == 0) pool = ds4_pool_create(o->threads, err);
    if (rc == 0 && !pool) rc = -1;
    if (rc == 0) w = ds4_gguf_writer_open(path, 0, err);
    if (rc == 0 && !w) rc = -1;

    if (rc == 0) {
        rc |= ds4_gguf_w_str(w, "general.architecture", "deepseek4");
        rc |= ds4_gguf_w_str(w, "general.name", o->name);
        rc |= ds4_gguf_w_str(w, "general.type", "model");
        rc |= ds4_gguf_w_str(w, "ds4.mkmodel.recipe", recipe->name);
        rc |= ds4_gguf_w_u64(w, "ds4.mkmodel.seed", o->seed);
        rc |= ds4_gguf_w_bool(w, "ds4.mkmodel.random_blocks", o->random_blocks != 0);
        if (o->sparse.n) {
            rc |= ds4_gguf_w_u32(w, "ds4.mkmodel.sparse_experts", o->sparse.n);
            rc |= ds4_gguf_w_arr(w, "ds4.mkmodel.sparse_kept", DS4_GGUF_U32, o->sparse.list,
                                 (uint64_t)o->sparse.rows * o->sparse.n);
        }
        if (rc != 0) rc = ds4_err_set(err, DS4_EIO, "writing general metadata failed");
    }
    if (rc == 0) rc = ds4_config_to_gguf(c, w, err);
    if (rc == 0 && tokenizer && o->tokenizer) rc = copy_tokenizer(w, o->tokenizer, (ds4_config *)c, err);

    /* The router bias exists only on learned-routing layers, as in the
     * official checkpoint (hash layers have tid2eid instead). */
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!specs[i].generated) continue;
        if (ds4_gguf_w_tensor(w, specs[i].name, specs[i].ndim, specs[i].ne, types[i]) != 0)
            rc = ds4_err_set(err, DS4_EINVAL, "declaring %s failed", specs[i].name);
    }
    uint64_t total = 0;
    size_t written = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!specs[i].generated) continue;
        written++;
        if (o->header_only) { /* declared above; its bytes counted, none written */
            total += ds4_row_bytes(types[i], (int64_t)specs[i].ne[0]) * specs[i].ne[1] * specs[i].ne[2];
            continue;
        }
        rc = write_tensor(w, &specs[i], types[i], o, c, pool, err);
        if (rc != 0) {
            ds4_err_prefix(err, "tensor %s", specs[i].name);
            break;
        }
        total += ds4_row_bytes(types[i], (int64_t)specs[i].ne[0]) * specs[i].ne[1] * specs[i].ne[2];
        if (!o->quiet && specs[i].ne[1] * specs[i].ne[2] > 1000000)
            fprintf(stderr, "\r  %zu/%zu tensors, %.2f GB", i + 1, n, (double)total / 1e9);
    }
    if (w) {
        if (rc == 0) rc = o->header_only ? ds4_gguf_writer_close_header(w, err) : ds4_gguf_writer_close(w, err);
        else ds4_gguf_writer_abort(w);
    }
    if (!o->quiet && rc == 0)
        fprintf(stderr, "\rwrote %s: %zu tensors, %.3f GB%s, recipe %s, seed %llu\n", path, written,
                (double)total / 1e9, o->header_only ? " (header only: no data)" : "", recipe->name,
                (unsigned long long)o->seed);
    ds4_pool_free(pool);
    free(types);
    return rc;
}

/* The model's file, and the MTP block's when asked for. */
static int write_model(opts *o, ds4_config *c, ds4_err *err) {
    if (ds4_config_validate(c, err) != 0) return ds4_err_prefix(err, "model shape");
    const ds4_recipe *base = ds4_recipe_get(o->recipe);
    if (!base) return ds4_err_set(err, DS4_EINVAL, "unknown recipe '%s' (known: %s)", o->recipe, ds4_recipe_names());
    ds4_recipe recipe = *base;
    for (int k = 0; k < DS4_TC_COUNT; k++)
        if (o->type_override[k] != UINT32_MAX) recipe.type[k] = o->type_override[k];
    if (o->sparse_experts && (o->sparse_experts < c->n_expert_used || o->sparse_experts > c->n_expert))
        return ds4_err_set(err, DS4_EINVAL,
                           "--sparse-experts %u: must be between the experts used (%u) and the experts (%u)",
                           o->sparse_experts, c->n_expert_used, c->n_expert);

    size_t n = ds4_layout_count(c), nm = ds4_layout_mtp(c, NULL);
    ds4_tensor_spec *specs = calloc(n > nm ? n : nm, sizeof(*specs));
    if (!specs) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    ds4_layout_build(c, specs);
    int rc = sparse_plan_make(&o->sparse, o->sparse_experts, c, o->seed, err);
    if (rc == 0) rc = write_file(o, c, &recipe, specs, n, o->out, true, err);
    if (rc == 0 && o->mtp_out) {
        ds4_layout_mtp(c, specs);
        rc = write_file(o, c, &recipe, specs, nm, o->mtp_out, false, err);
    }
    sparse_plan_free(&o->sparse);
    free(specs);
    return rc;
}

/* ------------------------------------------------------------ options */

static int parse_type(const char *s, uint32_t *out) {
    static const struct {
        const char *n;
        uint32_t t;
    } names[] = {{"f32", DS4_TYPE_F32},        {"f16", DS4_TYPE_F16},   {"bf16", DS4_TYPE_BF16},
                 {"q8_0", DS4_TYPE_Q8_0},      {"q2_k", DS4_TYPE_Q2_K}, {"q4_k", DS4_TYPE_Q4_K},
                 {"iq2_xxs", DS4_TYPE_IQ2_XXS}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i].n) == 0) {
            *out = names[i].t;
            return 0;
        }
    return -1;
}

static int parse_class_type(const char *arg, opts *o) {
    const char *eq = strchr(arg, '=');
    if (!eq) return -1;
    uint32_t type;
    if (parse_type(eq + 1, &type) != 0) return -1;
    int found = 0;
    for (int k = 0; k < DS4_TC_COUNT; k++) {
        const char *cn = ds4_tclass_name((ds4_tclass)k);
        if (strlen(cn) == (size_t)(eq - arg) && strncmp(cn, arg, (size_t)(eq - arg)) == 0) {
            o->type_override[k] = type;
            found = 1;
        }
    }
    return found ? 0 : -1;
}

static int parse_set(const char *arg, ds4_config *c) {
    const char *eq = strchr(arg, '=');
    if (!eq) return -1;
    uint32_t v;
    if (ds4_parse_u32(eq + 1, 0, 100000000u, &v)) return -1;
    size_t kl = (size_t)(eq - arg);
    static const struct {
        const char *k;
        size_t off;
    } keys[] = {
        {"layers", offsetof(ds4_config, n_layer)},
        {"embd", offsetof(ds4_config, n_embd)},
        {"vocab", offsetof(ds4_config, n_vocab)},
        {"heads", offsetof(ds4_config, n_head)},
        {"head-dim", offsetof(ds4_config, head_dim)},
        {"rope-dim", offsetof(ds4_config, rope_dim)},
        {"q-rank", offsetof(ds4_config, q_lora_rank)},
        {"o-rank", offsetof(ds4_config, o_lora_rank)},
        {"o-groups", offsetof(ds4_config, o_groups)},
        {"experts", offsetof(ds4_config, n_expert)},
        {"experts-used", offsetof(ds4_config, n_expert_used)},
        {"ff", offsetof(ds4_config, n_ff_exp)},
        {"hash-layers", offsetof(ds4_config, n_hash_layer)},
        {"window", offsetof(ds4_config, sliding_window)},
        {"idx-heads", offsetof(ds4_config, idx_n_head)},
        {"idx-top-k", offsetof(ds4_config, idx_top_k)},
        {"hc", offsetof(ds4_config, n_hc)},
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strlen(keys[i].k) == kl && strncmp(keys[i].k, arg, kl) == 0) {
            *(uint32_t *)(void *)((char *)c + keys[i].off) = (uint32_t)v;
            if (strcmp(keys[i].k, "layers") == 0) {
                if (v < 1 || v > DS4_MAX_LAYERS) return -1;
                ds4_config_schedule(c, c->compress_ratio[0]); /* the preset's schedule, so many layers */
            }
            return 0;
        }
    }
    return -1;
}

/* --type CLASS=TYPE, applied as it comes. */
static int type_option(void *ctx, const char *v, ds4_err *err) {
    if (parse_class_type(v, ctx) != 0)
        return ds4_err_set(err, DS4_EINVAL, "not CLASS=TYPE with a known class and type");
    return 0;
}

/* --set KEY=VALUE, kept until the preset is in place. */
typedef struct set_list {
    const char *v[64];
    int n;
} set_list;

static int set_option(void *ctx, const char *v, ds4_err *err) {
    set_list *l = ctx;
    if (l->n == 64) return ds4_err_set(err, DS4_EINVAL, "too many --set (64 at most)");
    l->v[l->n++] = v;
    return 0;
}

int main(int argc, char **argv) {
    opts o = {0};
    for (int k = 0; k < DS4_TC_COUNT; k++) o.type_override[k] = UINT32_MAX;
    set_list sets = {0};
    bool random_blocks, quiet, header_only;
    char recipe_help[256];
    snprintf(recipe_help, sizeof(recipe_help), "storage types: %s", ds4_recipe_names());
    ds4_opt table[] = {
        {DS4_OPT_STR("-o, --out, --output", "FILE", &o.out, NULL, "the GGUF to write"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_OUT},
        {DS4_OPT_STR("--mtp", "FILE", &o.mtp_out, NULL,
                     "also write the model's MTP block (docs/MODEL.md 2.5) to FILE, same recipe and seed"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_CHOICE("--preset", "NAME", &o.preset, "tiny|small|mid|flash|pro", "tiny",
                        "the shape (flash, pro: the published DeepSeek V4 models)")},
        {DS4_OPT_STR("--recipe", "NAME", &o.recipe, "f16", recipe_help)},
        {DS4_OPT_CALL("--type", "CLASS=TYPE", type_option, &o,
                      "override one tensor class (embedding, output, hc, attention-proj, compressor, "
                      "compressor-ape, indexer, router, shared, routed-w1, routed-w2, routed-w3) with f32, f16, "
                      "bf16, q8_0, q2_k, q4_k or iq2_xxs; repeatable")},
        {DS4_OPT_U64("--seed", "N", &o.seed, 0, UINT64_MAX, 1, "random seed")},
        {DS4_OPT_STR("--tokenizer", "FILE", &o.tokenizer, NULL,
                     "copy tokenizer.* metadata from a GGUF (sets the vocabulary size)"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_CALL("--set", "KEY=VALUE", set_option, &sets,
                      "change one shape: layers, embd, vocab, heads, head-dim, rope-dim, q-rank, o-rank, "
                      "o-groups, experts, experts-used, ff, hash-layers, window, idx-heads, idx-top-k, hc; "
                      "repeatable, applied over the preset")},
        {DS4_OPT_FLAG("--header-only", &header_only,
                      "write the metadata and the tensor table without any data: a file of the model's shapes "
                      "(e.g. Pro's 1.6T) that ds4 --inspect reads for its memory estimate")},
        {DS4_OPT_FLAG("--random-blocks", &random_blocks,
                      "fill quantized tensors with random valid blocks (fast; for speed tests)")},
        {DS4_OPT_U32("--sparse-experts", "N", &o.sparse_experts, 1, 65536, 0,
                     "keep N random routed experts per layer (N at least the experts used) and leave the others "
                     "as holes in the file (zero weights, no disk); the router bias and the hash tables route "
                     "every token to kept experts only (with N = the experts used, always the same ones)"),
         .def_text = "every expert"},
        {DS4_OPT_STR("--name", "TEXT", &o.name, NULL, "general.name"), .def_text = "ds4-mkmodel-PRESET"},
        DS4_CLI_THREADS(&o.threads),
        {DS4_OPT_FLAG("-q, --quiet", &quiet, "no progress output")},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-mkmodel",
                   .usage = "-o OUT.gguf [options]",
                   .about = "Write a GGUF of the DeepSeek V4 architecture with seeded random weights, of "
                            "any shape and\nrecipe (tests, benchmarks, the demo).",
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    o.random_blocks = random_blocks;
    o.quiet = quiet;
    o.header_only = header_only;
    if (!ds4_recipe_get(o.recipe))
        return ds4_cli_usage(&cli, "--recipe %s: unknown recipe (known: %s)", o.recipe, ds4_recipe_names());
    ds4_config c;
    apply_preset(o.preset, &c);
    ds4_err err = {0};
    if (o.tokenizer && tokenizer_vocab(o.tokenizer, &c.n_vocab, &err) != 0) {
        fprintf(stderr, "ds4-mkmodel: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < sets.n; i++)
        if (parse_set(sets.v[i], &c) != 0)
            return ds4_cli_usage(&cli, "--set %s: not KEY=VALUE with a known key and a value in range", sets.v[i]);
    char name[64];
    if (!o.name) {
        snprintf(name, sizeof(name), "ds4-mkmodel-%s", o.preset);
        o.name = name;
    }
    if (write_model(&o, &c, &err) != 0) {
        fprintf(stderr, "ds4-mkmodel: %s\n", err.msg);
        return 1;
    }
    return 0;
}
