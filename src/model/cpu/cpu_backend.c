/*
 * cpu_backend.c - the CPU reference backend: buffers, the chunked
 * layer-major forward pass and the ds4_backend vtable (see cpu.h).
 */
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"
#include "model/cpu/cpu.h"

#define MAX_EXPERT_USED 64

static void *xcalloc(size_t n, size_t size, bool *ok) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *ok = false;
    return p;
}

static void cpu_free(ds4_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b) return;
    void *bufs[] = {b->S, b->flat, b->mix, b->post, b->comb, b->x, b->xn, b->qr, b->q, b->kv, b->heads,
                    b->low, b->y, b->ckv, b->cgate, b->ikv, b->igate, b->iq, b->iw, b->router, b->sel,
                    b->selw, b->exp_out, b->gath, b->eg, b->eu, b->gath_t, b->sg, b->su, b->act, b->ape,
                    b->att_scratch, b->idx_scores, b->visible};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
    ds4_kv_state_free(b->st);
    ds4_pool_free(b->pool);
    free(b);
}

static uint64_t umax(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* Bytes of one token's prepared activation for the longest input row any
 * weight type may see. */
static size_t act_row_bytes(const ds4_config *c) {
    uint64_t n = umax((uint64_t)c->n_hc * c->n_embd, (uint64_t)c->n_head * c->head_dim / c->o_groups);
    n = umax(n, (uint64_t)c->o_groups * c->o_lora_rank);
    n = umax(n, umax(c->q_lora_rank, umax(c->n_embd, c->n_ff_exp)));
    n = (n + 255) / 256 * 256;
    size_t bytes = 0;
    const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16, DS4_TYPE_Q8_0, DS4_TYPE_Q2_K};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        size_t s = ds4_act_bytes(types[i], (int64_t)n);
        if (s > bytes) bytes = s;
    }
    return (bytes + 63) / 64 * 64;
}

static int alloc_buffers(cpu_backend *b, ds4_err *err) {
    const ds4_config *c = b->cfg;
    size_t C = b->chunk, D = c->n_embd, hcD = (size_t)c->n_hc * D, k = c->n_expert_used;
    size_t qd = (size_t)c->n_head * c->head_dim, F = c->n_ff_exp;
    bool ok = true;
    b->S = xcalloc(C * hcD, sizeof(float), &ok);
    b->flat = xcalloc(C * hcD, sizeof(float), &ok);
    b->mix = xcalloc(C * ds4_hc_mix(c), sizeof(float), &ok);
    b->post = xcalloc(C * c->n_hc, sizeof(float), &ok);
    b->comb = xcalloc(C * c->n_hc * c->n_hc, sizeof(float), &ok);
    b->x = xcalloc(C * D, sizeof(float), &ok);
    b->xn = xcalloc(C * D, sizeof(float), &ok);
    b->qr = xcalloc(C * c->q_lora_rank, sizeof(float), &ok);
    b->q = xcalloc(C * qd, sizeof(float), &ok);
    b->kv = xcalloc(C * c->head_dim, sizeof(float), &ok);
    b->heads = xcalloc(C * qd, sizeof(float), &ok);
    b->low = xcalloc(C * c->o_groups * c->o_lora_rank, sizeof(float), &ok);
    b->y = xcalloc(C * D, sizeof(float), &ok);
    b->ckv = xcalloc(C * 2 * c->head_dim, sizeof(float), &ok);
    b->cgate = xcalloc(C * 2 * c->head_dim, sizeof(float), &ok);
    b->ikv = xcalloc(C * 2 * c->idx_head_dim, sizeof(float), &ok);
    b->igate = xcalloc(C * 2 * c->idx_head_dim, sizeof(float), &ok);
    b->iq = xcalloc(C * c->idx_n_head * c->idx_head_dim, sizeof(float), &ok);
    b->iw = xcalloc(C * c->idx_n_head, sizeof(float), &ok);
    b->router = xcalloc(C * c->n_expert, sizeof(float), &ok);
    b->sel = xcalloc(C * k, sizeof(uint32_t), &ok);
    b->selw = xcalloc(C * k, sizeof(float), &ok);
    b->exp_out = xcalloc(C * k * D, sizeof(float), &ok);
    b->gath = xcalloc(C * k * D, sizeof(float), &ok);
    b->gath_t = xcalloc(C * k, sizeof(uint32_t), &ok);
    b->eg = xcalloc(C * k * F, sizeof(float), &ok);
    b->eu = xcalloc(C * k * F, sizeof(float), &ok);
    b->sg = xcalloc(C * F, sizeof(float), &ok);
    b->su = xcalloc(C * F, sizeof(float), &ok);
    b->act_row = act_row_bytes(c);
    b->act = xcalloc(C, b->act_row, &ok);
    b->ape = xcalloc(2 * umax(c->head_dim, c->idx_head_dim), sizeof(float), &ok);
    size_t comp_cap = ds4_state_comp_cap(b->st, 4);
    b->att_stride = b->st->raw_cap + comp_cap;
    b->att_scratch = xcalloc((size_t)b->n_threads * b->att_stride, sizeof(float), &ok);
    b->idx_scores = xcalloc(comp_cap, sizeof(float), &ok);
    b->visible = xcalloc(umax(comp_cap, c->idx_top_k), sizeof(uint32_t), &ok);
    if (!ok) return ds4_err_set(err, DS4_ENOMEM, "out of memory for CPU buffers (%zu-token chunks)", C);
    return 0;
}

/* One pass of T tokens through every layer (layer-major), then the output
 * head for the tokens marked in `want`; their logits go to consecutive rows
 * of `logits`. */
static void run_chunk(cpu_backend *b, const uint32_t *tok, uint32_t T, const bool *want, float *logits) {
    const ds4_weights *w = b->base.w;
    const ds4_config *c = b->cfg;
    uint32_t D = c->n_embd, pos0 = b->st->n_tokens;
    for (uint32_t t = 0; t < T; t++) { /* every stream starts as the embedding (5.1) */
        float *S = b->S + (size_t)t * c->n_hc * D;
        ds4_dequantize_row(w->token_embd.type, ds4_wt_row(&w->token_embd, 0, tok[t]), S, D);
        for (uint32_t h = 1; h < c->n_hc; h++) memcpy(S + (size_t)h * D, S, D * sizeof(float));
    }
    for (uint32_t il = 0; il < c->n_layer; il++) {
        cpu_attention_layer(b, il, pos0, T);
        cpu_ffn_layer(b, il, tok, T);
    }
    memcpy(b->st->tokens + pos0, tok, T * sizeof(uint32_t));
    b->st->n_tokens += T;
    cpu_output_head(b, T, want, logits, c->n_vocab);
}

static int cpu_prefill(ds4_backend *base, const uint32_t *tokens, uint32_t n, float *all_logits, ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    const ds4_config *c = b->cfg;
    if (n == 0) return 0;
    if ((uint64_t)b->st->n_tokens + n > b->st->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", n, b->st->n_tokens,
                           b->st->ctx);
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] >= c->n_vocab)
            return ds4_err_set(err, DS4_EINVAL, "token %u at index %u is outside the vocabulary (%u)", tokens[i], i,
                               c->n_vocab);
    bool want[b->chunk];
    for (uint32_t off = 0; off < n; off += b->chunk) {
        uint32_t T = n - off < b->chunk ? n - off : b->chunk;
        bool last = off + T == n;
        for (uint32_t t = 0; t < T; t++) want[t] = all_logits || (last && t == T - 1);
        float *out = all_logits ? all_logits + (size_t)off * c->n_vocab : b->st->logits;
        run_chunk(b, tokens + off, T, want, out);
        if (all_logits && last)
            memcpy(b->st->logits, out + (size_t)(T - 1) * c->n_vocab, c->n_vocab * sizeof(float));
    }
    b->st->has_logits = true;
    return 0;
}

static int cpu_decode(ds4_backend *base, uint32_t token, ds4_err *err) {
    return cpu_prefill(base, &token, 1, NULL, err);
}

static const float *cpu_logits(ds4_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    return b->st->has_logits ? b->st->logits : NULL;
}

static void cpu_reset(ds4_backend *base) { ds4_kv_state_reset(((cpu_backend *)base)->st); }

static int cpu_snapshot(ds4_backend *base, ds4_kv_state *out, ds4_err *err) {
    return ds4_kv_state_copy(out, ((cpu_backend *)base)->st, err);
}

static int cpu_restore(ds4_backend *base, const ds4_kv_state *in, ds4_err *err) {
    return ds4_kv_state_copy(((cpu_backend *)base)->st, in, err);
}

static const ds4_backend_ops cpu_ops = {
    .name = "cpu", .free = cpu_free, .prefill = cpu_prefill, .decode = cpu_decode, .logits = cpu_logits,
    .reset = cpu_reset, .snapshot = cpu_snapshot, .restore = cpu_restore,
};

ds4_backend *ds4_cpu_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    if (w->synthetic) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "synthetic weights have no data on the host; only the cuda backend fills them");
        return NULL;
    }
    if (c->n_expert_used > MAX_EXPERT_USED) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "expert_used_count %u: the CPU backend handles at most %d",
                    c->n_expert_used, MAX_EXPERT_USED);
        return NULL;
    }
    cpu_backend *b = calloc(1, sizeof(*b));
    if (!b) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    b->base.ops = &cpu_ops;
    b->base.w = w;
    b->base.opts = ds4_backend_opts_resolve(opts);
    b->cfg = c;
    b->sim = !b->base.opts.no_sim;
    b->chunk = b->base.opts.prefill_chunk;
    if (c->rope_dim / 2 > DS4_ROPE_MAX_PAIRS) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "rope.dimension_count %u exceeds %d", c->rope_dim, 2 * DS4_ROPE_MAX_PAIRS);
        goto fail;
    }
    ds4_rope_init(&b->rope_dense, c, false);
    ds4_rope_init(&b->rope_comp, c, true);
    if (!(b->pool = ds4_pool_create(b->base.opts.n_threads, err))) goto fail;
    b->n_threads = b->base.opts.n_threads = ds4_pool_size(b->pool);
    if (!(b->st = ds4_kv_state_new(c, b->base.opts.ctx_size, b->chunk, err))) goto fail;
    if (alloc_buffers(b, err) != 0) goto fail;
    return &b->base;
fail:
    cpu_free(&b->base);
    return NULL;
}
