/*
 * session_state.c - KV state allocation, copies and the DSV4 payload
 * (see session_state.h; docs/MODEL.md 8.1, 8.3).
 */
#include "model/session_state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint32_t ds4_state_frontier_rows(uint32_t ratio) { return ds4_compress_coff(ratio) * ratio; }

uint32_t ds4_state_frontier_width(const ds4_config *c, uint32_t ratio, bool indexer) {
    return ds4_compress_coff(ratio) * (indexer ? c->idx_head_dim : c->head_dim);
}

/* Rows a compressed list can hold: one per `ratio` tokens of the context
 * (plus slack, as MODEL.md 8.1 sizes it). */
uint32_t ds4_state_comp_cap(const ds4_kv_state *s, uint32_t ratio) { return ratio ? s->ctx / ratio + 2 : 0; }

void ds4_frontier_clear(float *kv, float *score, uint32_t width, uint32_t r0, uint32_t r1) {
    for (uint32_t r = r0; r < r1; r++)
        for (uint32_t j = 0; j < width; j++) {
            kv[(size_t)r * width + j] = 0.0f;
            score[(size_t)r * width + j] = DS4_SCORE_NEG_INF;
        }
}

static void clear_layer(const ds4_kv_state *s, uint32_t il) {
    const ds4_config *c = s->cfg;
    ds4_layer_state *L = &s->layers[il];
    if (L->ratio == 0) return;
    uint32_t sr = ds4_state_frontier_rows(L->ratio);
    ds4_frontier_clear(L->comp_kv, L->comp_score, ds4_state_frontier_width(c, L->ratio, false), 0, sr);
    if (L->ratio == 4) ds4_frontier_clear(L->idx_kv, L->idx_score, ds4_state_frontier_width(c, 4, true), 0, sr);
}

void ds4_kv_state_reset(ds4_kv_state *s) {
    s->n_tokens = 0;
    s->has_logits = false;
    memset(s->logits, 0, (size_t)s->cfg->n_vocab * sizeof(float)); /* an empty state is canonical */
    for (uint32_t il = s->layer_first; il < s->layer_end; il++) clear_layer(s, il);
}

void ds4_kv_state_free(ds4_kv_state *s) {
    if (!s) return;
    if (s->layers) {
        for (uint32_t il = 0; il < s->cfg->n_layer; il++) {
            ds4_layer_state *L = &s->layers[il];
            free(L->raw);
            free(L->comp);
            free(L->comp_kv);
            free(L->comp_score);
            free(L->idx);
            free(L->idx_kv);
            free(L->idx_score);
        }
        free(s->layers);
    }
    free(s->tokens);
    free(s->logits);
    free(s);
}

static float *alloc_f32(size_t n, bool *ok) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) *ok = false;
    return p;
}

uint64_t ds4_kv_state_bytes_layers(const ds4_config *cfg, uint32_t ctx, uint32_t first, uint32_t end) {
    uint64_t raw_cap = cfg->sliding_window < ctx ? cfg->sliding_window : ctx;
    uint64_t floats = (uint64_t)ctx + cfg->n_vocab; /* tokens (u32) and logits */
    for (uint32_t il = first; il < end; il++) {
        uint32_t r = ds4_layer_ratio(cfg, il);
        floats += raw_cap * cfg->head_dim;
        if (r == 0) continue;
        floats += ((uint64_t)ctx / r + 2) * cfg->head_dim;
        floats += 2ull * ds4_state_frontier_rows(r) * ds4_state_frontier_width(cfg, r, false);
        if (r != 4) continue;
        floats += ((uint64_t)ctx / 4 + 2) * cfg->idx_head_dim;
        floats += 2ull * ds4_state_frontier_rows(4) * ds4_state_frontier_width(cfg, 4, true);
    }
    return floats * 4;
}

uint64_t ds4_kv_state_bytes(const ds4_config *cfg, uint32_t ctx) {
    return ds4_kv_state_bytes_layers(cfg, ctx, 0, cfg->n_layer);
}

ds4_kv_state *ds4_kv_state_new(const ds4_config *cfg, uint32_t ctx, uint32_t prefill_chunk, ds4_err *err) {
    return ds4_kv_state_new_layers(cfg, ctx, prefill_chunk, 0, cfg->n_layer, err);
}

ds4_kv_state *ds4_kv_state_new_layers(const ds4_config *cfg, uint32_t ctx, uint32_t prefill_chunk, uint32_t first,
                                      uint32_t end, ds4_err *err) {
    if (first >= end || end > cfg->n_layer) {
        ds4_err_set(err, DS4_EINVAL, "a KV state of layers %u..%u of a %u-layer model", first, end, cfg->n_layer);
        return NULL;
    }
    if (ctx == 0) {
        ds4_err_set(err, DS4_EINVAL, "context size must be positive");
        return NULL;
    }
    ds4_kv_state *s = calloc(1, sizeof(*s));
    if (!s) goto oom;
    s->cfg = cfg;
    s->layer_first = first;
    s->layer_end = end;
    s->ctx = ctx;
    s->prefill_chunk = prefill_chunk;
    s->raw_cap = cfg->sliding_window < ctx ? cfg->sliding_window : ctx;
    s->tokens = calloc(ctx, sizeof(uint32_t));
    s->logits = calloc(cfg->n_vocab, sizeof(float));
    s->layers = calloc(cfg->n_layer, sizeof(*s->layers));
    if (!s->tokens || !s->logits || !s->layers) goto oom;
    bool ok = true;
    for (uint32_t il = 0; il < cfg->n_layer; il++) {
        ds4_layer_state *L = &s->layers[il];
        uint32_t r = L->ratio = ds4_layer_ratio(cfg, il);
        if (il < first || il >= end) continue;
        L->raw = alloc_f32((size_t)s->raw_cap * cfg->head_dim, &ok);
        if (r == 0) continue;
        size_t fr = (size_t)ds4_state_frontier_rows(r) * ds4_state_frontier_width(cfg, r, false);
        L->comp = alloc_f32((size_t)ds4_state_comp_cap(s, r) * cfg->head_dim, &ok);
        L->comp_kv = alloc_f32(fr, &ok);
        L->comp_score = alloc_f32(fr, &ok);
        if (r != 4) continue;
        size_t ifr = (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(cfg, 4, true);
        L->idx = alloc_f32((size_t)ds4_state_comp_cap(s, 4) * cfg->idx_head_dim, &ok);
        L->idx_kv = alloc_f32(ifr, &ok);
        L->idx_score = alloc_f32(ifr, &ok);
    }
    if (!ok) goto oom;
    ds4_kv_state_reset(s);
    return s;
oom:
    ds4_kv_state_free(s);
    ds4_err_set(err, DS4_ENOMEM, "out of memory for a KV state of %u tokens", ctx);
    return NULL;
}

/* ------------------------------------------------------------- copying */

/* The live raw rows, oldest first: positions n-L .. n-1. */
static uint32_t live_raw(const ds4_kv_state *s) {
    uint32_t L = s->cfg->sliding_window;
    if (s->raw_cap < L) L = s->raw_cap;
    if (s->n_tokens < L) L = s->n_tokens;
    return L;
}

/* A raw ring into one of dst_cap rows: the whole ring when the sizes are
 * equal; else (a state of fewer tokens than the window: its ring holds
 * them all) each live row to its position's slot.  The destination holds
 * the live rows: its context holds the tokens, and its ring is the window
 * or its context. */
static void copy_ring(float *dst, uint32_t dst_cap, const float *src_ring, const ds4_kv_state *src, uint32_t hd) {
    if (dst_cap == src->raw_cap) {
        memcpy(dst, src_ring, (size_t)dst_cap * hd * sizeof(float));
        return;
    }
    uint32_t n = src->n_tokens, L = live_raw(src);
    for (uint32_t p = n - L; p < n; p++)
        memcpy(dst + (size_t)(p % dst_cap) * hd, src_ring + (size_t)(p % src->raw_cap) * hd, hd * sizeof(float));
}

int ds4_kv_state_copy(ds4_kv_state *dst, const ds4_kv_state *src, ds4_err *err) {
    const ds4_config *c = src->cfg;
    if (dst->cfg->n_layer != c->n_layer || dst->cfg->head_dim != c->head_dim || dst->cfg->n_vocab != c->n_vocab)
        return ds4_err_set(err, DS4_EINVAL, "KV state copy between different models");
    if (src->n_tokens > dst->ctx)
        return ds4_err_set(err, DS4_EINVAL, "KV state copy: %u tokens do not fit a context of %u", src->n_tokens,
                           dst->ctx);
    uint32_t n = src->n_tokens;
    dst->n_tokens = n;
    dst->has_logits = src->has_logits;
    memcpy(dst->tokens, src->tokens, (size_t)n * sizeof(uint32_t));
    memcpy(dst->logits, src->logits, (size_t)c->n_vocab * sizeof(float));
    uint32_t first = src->layer_first > dst->layer_first ? src->layer_first : dst->layer_first;
    uint32_t end = src->layer_end < dst->layer_end ? src->layer_end : dst->layer_end;
    for (uint32_t il = first; il < end; il++) {
        const ds4_layer_state *S = &src->layers[il];
        ds4_layer_state *D = &dst->layers[il];
        copy_ring(D->raw, dst->raw_cap, S->raw, src, c->head_dim);
        if (S->ratio == 0) continue;
        size_t fr = (size_t)ds4_state_frontier_rows(S->ratio) * ds4_state_frontier_width(c, S->ratio, false);
        memcpy(D->comp, S->comp, (size_t)(n / S->ratio) * c->head_dim * sizeof(float));
        memcpy(D->comp_kv, S->comp_kv, fr * sizeof(float));
        memcpy(D->comp_score, S->comp_score, fr * sizeof(float));
        if (S->ratio != 4) continue;
        size_t ifr = (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
        memcpy(D->idx, S->idx, (size_t)(n / 4) * c->idx_head_dim * sizeof(float));
        memcpy(D->idx_kv, S->idx_kv, ifr * sizeof(float));
        memcpy(D->idx_score, S->idx_score, ifr * sizeof(float));
    }
    return 0;
}

/* ------------------------------------------------------- layer slices */

/* The arrays of layer il a slice carries, with their float counts for n
 * tokens, in slice order. */
static uint32_t slice_parts(const ds4_kv_state *s, uint32_t il, uint32_t n, float **ptr, size_t *cnt) {
    const ds4_config *c = s->cfg;
    ds4_layer_state *L = &s->layers[il];
    uint32_t k = 0;
    ptr[k] = L->raw, cnt[k++] = (size_t)s->raw_cap * c->head_dim;
    if (L->ratio == 0) return k;
    size_t fr = (size_t)ds4_state_frontier_rows(L->ratio) * ds4_state_frontier_width(c, L->ratio, false);
    ptr[k] = L->comp, cnt[k++] = (size_t)(n / L->ratio) * c->head_dim;
    ptr[k] = L->comp_kv, cnt[k++] = fr;
    ptr[k] = L->comp_score, cnt[k++] = fr;
    if (L->ratio != 4) return k;
    size_t ifr = (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
    ptr[k] = L->idx, cnt[k++] = (size_t)(n / 4) * c->idx_head_dim;
    ptr[k] = L->idx_kv, cnt[k++] = ifr;
    ptr[k] = L->idx_score, cnt[k++] = ifr;
    return k;
}

uint64_t ds4_kv_state_slice_bytes(const ds4_kv_state *s, uint32_t n, uint32_t first, uint32_t end) {
    uint64_t floats = 0;
    float *ptr[7];
    size_t cnt[7];
    for (uint32_t il = first; il < end; il++) {
        uint32_t k = slice_parts(s, il, n, ptr, cnt);
        for (uint32_t i = 0; i < k; i++) floats += cnt[i];
    }
    return floats * sizeof(float);
}

void ds4_kv_state_pack_layers(const ds4_kv_state *s, uint32_t first, uint32_t end, void *buf) {
    float *o = buf, *ptr[7];
    size_t cnt[7];
    for (uint32_t il = first; il < end; il++) {
        uint32_t k = slice_parts(s, il, s->n_tokens, ptr, cnt);
        for (uint32_t i = 0; i < k; i++) {
            memcpy(o, ptr[i], cnt[i] * sizeof(float));
            o += cnt[i];
        }
    }
}

void ds4_kv_state_unpack_layers(ds4_kv_state *s, uint32_t n, uint32_t first, uint32_t end, const void *buf) {
    const float *o = buf;
    float *ptr[7];
    size_t cnt[7];
    for (uint32_t il = first; il < end; il++) {
        uint32_t k = slice_parts(s, il, n, ptr, cnt);
        for (uint32_t i = 0; i < k; i++) {
            memcpy(ptr[i], o, cnt[i] * sizeof(float));
            o += cnt[i];
        }
    }
}

/* ------------------------------------------------------- DSV4 payload */

/* The engine runs on little-endian hosts only (x86-64, aarch64), so the
 * payload's little-endian arrays are written straight from memory. */
static int wr(FILE *f, const void *p, size_t n, ds4_err *err) {
    if (n && fwrite(p, 1, n, f) != n) return ds4_err_set(err, DS4_EIO, "writing session payload: %s", strerror(errno));
    return 0;
}

static int rd(FILE *f, void *p, size_t n, const char *what, ds4_err *err) {
    if (n && fread(p, 1, n, f) != n)
        return ds4_err_set(err, DS4_EFORMAT, "session payload truncated while reading %s", what);
    return 0;
}

/* The prefill chunk a payload records: ds4 records the chunk its graph was
 * sized for, min(ctx, chunk), and refuses a payload whose value differs
 * from its own (docs/MODEL.md 8.3). */
static uint32_t ds4_payload_chunk(const ds4_kv_state *s) {
    return s->prefill_chunk < s->ctx ? s->prefill_chunk : s->ctx;
}

enum {
    H_MAGIC,
    H_VERSION,
    H_CTX,
    H_CHUNK,
    H_RAW_CAP,
    H_RAW_WINDOW,
    H_COMP_CAP,
    H_N,
    H_LAYERS,
    H_HEAD_DIM,
    H_IDX_HEAD_DIM,
    H_VOCAB,
    H_LIVE_RAW,
    H_COUNT
};

static int check_whole(const ds4_kv_state *s, ds4_err *err) {
    if (s->layer_first == 0 && s->layer_end == s->cfg->n_layer) return 0;
    return ds4_err_set(err, DS4_EINVAL, "a session payload holds every layer, this state only %u..%u", s->layer_first,
                       s->layer_end - 1);
}

int ds4_kv_state_save(const ds4_kv_state *s, FILE *f, ds4_err *err) {
    const ds4_config *c = s->cfg;
    if (check_whole(s, err) != 0) return -1;
    uint32_t n = s->n_tokens, L = live_raw(s);
    uint32_t h[H_COUNT] = {
        [H_MAGIC] = DS4_DSV4_MAGIC,
        [H_VERSION] = DS4_DSV4_VERSION,
        [H_CTX] = s->ctx,
        [H_CHUNK] = ds4_payload_chunk(s),
        [H_RAW_CAP] = s->raw_cap,
        [H_RAW_WINDOW] = s->raw_cap,
        [H_COMP_CAP] = ds4_state_comp_cap(s, 4),
        [H_N] = n,
        [H_LAYERS] = c->n_layer,
        [H_HEAD_DIM] = c->head_dim,
        [H_IDX_HEAD_DIM] = c->idx_head_dim,
        [H_VOCAB] = c->n_vocab,
        [H_LIVE_RAW] = L,
    };
    if (wr(f, h, sizeof(h), err) || wr(f, s->tokens, (size_t)n * 4, err) ||
        wr(f, s->logits, (size_t)c->n_vocab * 4, err))
        return -1;
    uint32_t counts[2 * DS4_MAX_LAYERS] = {0};
    for (uint32_t il = 0; il < c->n_layer; il++) {
        uint32_t r = s->layers[il].ratio;
        counts[il] = r ? n / r : 0;
        counts[c->n_layer + il] = r == 4 ? n / 4 : 0;
    }
    if (wr(f, counts, (size_t)c->n_layer * 2 * 4, err)) return -1;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        const ds4_layer_state *S = &s->layers[il];
        for (uint32_t p = n - L; p < n; p++)
            if (wr(f, S->raw + (size_t)(p % s->raw_cap) * c->head_dim, (size_t)c->head_dim * 4, err)) return -1;
        if (S->ratio == 0) continue;
        size_t fr = (size_t)ds4_state_frontier_rows(S->ratio) * ds4_state_frontier_width(c, S->ratio, false);
        if (wr(f, S->comp, (size_t)counts[il] * c->head_dim * 4, err) || wr(f, S->comp_kv, fr * 4, err) ||
            wr(f, S->comp_score, fr * 4, err))
            return -1;
        if (S->ratio != 4) continue;
        size_t ifr = (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
        if (wr(f, S->idx, (size_t)counts[c->n_layer + il] * c->idx_head_dim * 4, err) ||
            wr(f, S->idx_kv, ifr * 4, err) || wr(f, S->idx_score, ifr * 4, err))
            return -1;
    }
    return 0;
}

uint64_t ds4_kv_state_payload_bytes(const ds4_kv_state *s) {
    const ds4_config *c = s->cfg;
    uint64_t n = s->n_tokens, bytes = H_COUNT * 4 + n * 4 + (uint64_t)c->n_vocab * 4 + (uint64_t)c->n_layer * 8;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        uint32_t r = s->layers[il].ratio;
        bytes += (uint64_t)live_raw(s) * c->head_dim * 4;
        if (r == 0) continue;
        bytes += (n / r) * c->head_dim * 4 +
                 2 * (uint64_t)ds4_state_frontier_rows(r) * ds4_state_frontier_width(c, r, false) * 4;
        if (r != 4) continue;
        bytes += (n / 4) * c->idx_head_dim * 4 +
                 2 * (uint64_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true) * 4;
    }
    return bytes;
}

static int check_header(const ds4_kv_state *s, const uint32_t *h, ds4_err *err) {
    const ds4_config *c = s->cfg;
    if (h[H_MAGIC] != DS4_DSV4_MAGIC) return ds4_err_set(err, DS4_EFORMAT, "not a DSV4 session payload (bad magic)");
    if (h[H_VERSION] != DS4_DSV4_VERSION)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "DSV4 payload version %u, expected %u", h[H_VERSION],
                           DS4_DSV4_VERSION);
    struct {
        int idx;
        uint32_t want;
        const char *what;
    } same[] = {
        {H_LAYERS, c->n_layer, "layer count"},
        {H_HEAD_DIM, c->head_dim, "head dim"},
        {H_IDX_HEAD_DIM, c->idx_head_dim, "indexer head dim"},
        {H_VOCAB, c->n_vocab, "vocabulary"},
    };
    for (size_t i = 0; i < sizeof(same) / sizeof(same[0]); i++)
        if (h[same[i].idx] != same[i].want)
            return ds4_err_set(err, DS4_EUNSUPPORTED, "DSV4 payload: %s %u, this model has %u", same[i].what,
                               h[same[i].idx], same[i].want);
    /* The raw window as ds4 writes it, min(window, ctx of the writer); the
     * whole window as this engine wrote it before it matched ds4. */
    uint32_t win = c->sliding_window < h[H_CTX] ? c->sliding_window : h[H_CTX];
    if (h[H_RAW_WINDOW] != win && h[H_RAW_WINDOW] != c->sliding_window)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "DSV4 payload: raw window %u, this model's is %u (at ctx %u: %u)",
                           h[H_RAW_WINDOW], c->sliding_window, h[H_CTX], win);
    uint32_t n = h[H_N];
    if (n > h[H_CTX])
        return ds4_err_set(err, DS4_EFORMAT, "DSV4 payload: %u tokens exceed its own context size %u", n, h[H_CTX]);
    if (n > s->ctx)
        return ds4_err_set(err, DS4_ERANGE, "DSV4 payload: %u tokens exceed the context size %u", n, s->ctx);
    uint32_t want_L = c->sliding_window < n ? c->sliding_window : n;
    if (h[H_LIVE_RAW] != want_L || h[H_RAW_CAP] < want_L)
        return ds4_err_set(err, DS4_EFORMAT, "DSV4 payload: %u live raw rows (raw cap %u), expected %u", h[H_LIVE_RAW],
                           h[H_RAW_CAP], want_L);
    return 0;
}

int ds4_kv_state_load(ds4_kv_state *s, FILE *f, ds4_err *err) {
    const ds4_config *c = s->cfg;
    uint32_t h[H_COUNT];
    if (check_whole(s, err) || rd(f, h, sizeof(h), "the header", err) || check_header(s, h, err)) return -1;
    uint32_t n = h[H_N], L = h[H_LIVE_RAW];
    ds4_kv_state_reset(s);
    if (rd(f, s->tokens, (size_t)n * 4, "the tokens", err) ||
        rd(f, s->logits, (size_t)c->n_vocab * 4, "the logits", err))
        goto fail;
    for (uint32_t i = 0; i < n; i++)
        if (s->tokens[i] >= c->n_vocab) {
            ds4_err_set(err, DS4_EFORMAT, "DSV4 payload: token %u at position %u is outside the vocabulary",
                        s->tokens[i], i);
            goto fail;
        }
    uint32_t counts[2 * DS4_MAX_LAYERS];
    if (rd(f, counts, (size_t)c->n_layer * 2 * 4, "the row counts", err)) goto fail;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        uint32_t r = s->layers[il].ratio;
        if (counts[il] != (r ? n / r : 0) || counts[c->n_layer + il] != (r == 4 ? n / 4 : 0)) {
            ds4_err_set(err, DS4_EFORMAT,
                        "DSV4 payload: layer %u holds %u compressed / %u indexer rows, "
                        "expected %u / %u for %u tokens",
                        il, counts[il], counts[c->n_layer + il], r ? n / r : 0, r == 4 ? n / 4 : 0, n);
            goto fail;
        }
    }
    for (uint32_t il = 0; il < c->n_layer; il++) {
        ds4_layer_state *S = &s->layers[il];
        for (uint32_t p = n - L; p < n; p++)
            if (rd(f, S->raw + (size_t)(p % s->raw_cap) * c->head_dim, (size_t)c->head_dim * 4, "raw rows", err))
                goto fail;
        if (S->ratio == 0) continue;
        size_t fr = (size_t)ds4_state_frontier_rows(S->ratio) * ds4_state_frontier_width(c, S->ratio, false);
        if (rd(f, S->comp, (size_t)counts[il] * c->head_dim * 4, "compressed rows", err) ||
            rd(f, S->comp_kv, fr * 4, "a compressor frontier", err) ||
            rd(f, S->comp_score, fr * 4, "a compressor frontier", err))
            goto fail;
        if (S->ratio != 4) continue;
        size_t ifr = (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
        if (rd(f, S->idx, (size_t)counts[c->n_layer + il] * c->idx_head_dim * 4, "indexer rows", err) ||
            rd(f, S->idx_kv, ifr * 4, "an indexer frontier", err) ||
            rd(f, S->idx_score, ifr * 4, "an indexer frontier", err))
            goto fail;
    }
    s->n_tokens = n;
    s->has_logits = n > 0;
    return 0;
fail:
    ds4_kv_state_reset(s);
    return -1;
}

int ds4_kv_state_save_file(const ds4_kv_state *s, const char *path, ds4_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return ds4_err_set(err, DS4_EIO, "cannot create %s: %s", path, strerror(errno));
    int rc = ds4_kv_state_save(s, f, err);
    if (fclose(f) != 0 && rc == 0) rc = ds4_err_set(err, DS4_EIO, "writing %s: %s", path, strerror(errno));
    if (rc != 0) ds4_err_prefix(err, "%s", path);
    return rc;
}

int ds4_kv_state_load_file(ds4_kv_state *s, const char *path, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
    int rc = ds4_kv_state_load(s, f, err);
    if (rc == 0 && fgetc(f) != EOF) {
        ds4_kv_state_reset(s);
        rc = ds4_err_set(err, DS4_EFORMAT, "trailing bytes after the session payload");
    }
    fclose(f);
    if (rc != 0) ds4_err_prefix(err, "%s", path);
    return rc;
}
