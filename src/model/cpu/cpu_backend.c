/*
 * cpu_backend.c - the CPU reference backend: buffers, sequences, the
 * layer-major pass over rows of any sequences, and the ds4_backend vtable
 * (see cpu.h).
 */
#include <stdlib.h>
#include <string.h>

#include "base/meminfo.h"
#include "format/quants.h"
#include "model/backends.h"
#include "model/cpu/cpu.h"

#define MAX_EXPERT_USED 64

static void *xcalloc(size_t n, size_t size, bool *ok) {
    void *p = calloc(n ? n : 1, size);
    if (!p) *ok = false;
    return p;
}

static void free_buffers(cpu_backend *b) {
    void *bufs[] = {b->S,  b->flat,   b->mix, b->post, b->comb,        b->x,          b->xn,      b->qr,    b->q,
                    b->kv, b->heads,  b->low, b->y,    b->ckv,         b->cgate,      b->ikv,     b->igate, b->iq,
                    b->iw, b->router, b->sel, b->selw, b->exp_out,     b->gath,       b->eg,      b->eu,    b->gath_t,
                    b->sg, b->su,     b->act, b->ape,  b->att_scratch, b->idx_scores, b->visible, b->rows};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
}

/* ------------------------------------------------------------ sequences */

static void cpu_seq_free(ds4_backend *base, ds4_seq *seq);

/* A sequence of the main model, or (mtp) of the MTP block, whose state
 * has one dense layer; with an MTP block, a ring of its last residuals. */
static ds4_seq *seq_new(cpu_backend *b, uint32_t ctx, bool mtp, ds4_err *err) {
    ds4_backend *base = &b->base;
    if (ctx > b->max_ctx) {
        ds4_err_set(err, DS4_ERANGE, "a sequence of %u tokens exceeds the backend's context of %u", ctx, b->max_ctx);
        return NULL;
    }
    cpu_seq *s = calloc(1, sizeof(*s));
    if (!s) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    s->base.owner = base;
    s->mtp = mtp;
    s->st = mtp ? ds4_kv_state_new(&b->base.opts.mtp->cfg, ctx, b->chunk, err)
                : ds4_kv_state_new_layers(b->cfg, ctx, b->chunk, b->layer_first, b->layer_end, err);
    if (!s->st) {
        free(s);
        return NULL;
    }
    if (b->base.opts.mtp &&
        !(s->hid = malloc((size_t)DS4_HIDDEN_KEEP * b->cfg->n_hc * b->cfg->n_embd * sizeof(float)))) {
        cpu_seq_free(base, &s->base);
        ds4_err_set(err, DS4_ENOMEM, "out of memory for a sequence's residuals");
        return NULL;
    }
    return &s->base;
}

static ds4_seq *cpu_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    return seq_new((cpu_backend *)base, ctx, false, err);
}

static ds4_seq *cpu_mtp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b->base.opts.mtp) {
        ds4_err_set(err, DS4_EINVAL, "the backend was made without an MTP block");
        return NULL;
    }
    return seq_new(b, ctx, true, err);
}

static void cpu_seq_free(ds4_backend *base, ds4_seq *seq) {
    (void)base;
    cpu_seq *s = cpu_seq_of(seq);
    if (!s) return;
    cpu_journal_free(&s->j);
    ds4_kv_state_free(s->st);
    free(s->hid);
    free(s);
}

/* A new state of ctx tokens with the old one's content (session_state.h:
 * ds4_kv_state_copy keeps every live row where a sequence made that large
 * has it), then the old one freed. */
static int cpu_seq_resize(ds4_backend *base, ds4_seq *seq, uint32_t ctx, ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    cpu_seq *s = cpu_seq_of(seq);
    if (!seq || seq->owner != base) return ds4_err_set(err, DS4_EINVAL, "resize: the sequence is not this backend's");
    if (ctx == 0 || ctx > b->max_ctx || ctx < s->st->n_tokens)
        return ds4_err_set(err, DS4_ERANGE, "resize to %u tokens: the sequence holds %u, the backend at most %u", ctx,
                           s->st->n_tokens, b->max_ctx);
    if (ctx == s->st->ctx) return 0;
    ds4_kv_state *st = s->mtp ? ds4_kv_state_new(&b->base.opts.mtp->cfg, ctx, b->chunk, err)
                              : ds4_kv_state_new_layers(b->cfg, ctx, b->chunk, b->layer_first, b->layer_end, err);
    if (!st || ds4_kv_state_copy(st, s->st, err) != 0) {
        ds4_kv_state_free(st);
        return -1;
    }
    /* the mark stays (its journal holds copies) unless the ring changed
     * size: its journaled slots are the old ring's */
    if (st->raw_cap != s->st->raw_cap) s->j.valid = false;
    ds4_kv_state_free(s->st);
    s->st = st;
    return 0;
}

static uint32_t cpu_seq_len(const ds4_backend *base, const ds4_seq *s) {
    (void)base;
    return ((const cpu_seq *)s)->st->n_tokens;
}

static void cpu_free(ds4_backend *base) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b) return;
    free_buffers(b);
    cpu_seq_free(base, b->base.main);
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
    b->rows = xcalloc(C, sizeof(cpu_row), &ok);
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
    /* attention scratch for the longest sequence the backend takes */
    size_t raw_cap = c->sliding_window < b->max_ctx ? c->sliding_window : b->max_ctx;
    size_t comp_cap = b->max_ctx / 4 + 2;
    b->att_stride = raw_cap + comp_cap;
    b->att_scratch = xcalloc((size_t)b->n_threads * b->att_stride, sizeof(float), &ok);
    b->idx_scores = xcalloc(comp_cap, sizeof(float), &ok);
    b->visible = xcalloc(umax(comp_cap, c->idx_top_k), sizeof(uint32_t), &ok);
    if (!ok) return ds4_err_set(err, DS4_ENOMEM, "out of memory for CPU buffers (%zu-token chunks)", C);
    return 0;
}

/* --------------------------------------------------------------- a pass */

cpu_layer cpu_main_layer(const cpu_backend *b, uint32_t il) {
    const ds4_config *c = b->cfg;
    return (cpu_layer){&b->base.w->layers[il], il,   il,  ds4_layer_ratio(c, il), ds4_layer_is_hash(c, il),
                       c->swiglu_clamp[il],    true, true};
}

/* One pass of the T rows in b->rows through the backend's layers
 * (layer-major; all of them but in a pipeline stage), then the output head
 * for the rows with a logits destination; rows with a hidden destination
 * get their final residual.  A stage after the first starts from the
 * residuals `in`; one before the last leaves every row's in stage_out.
 * Each row's sequence grows by its token. */
static void run_pass(cpu_backend *b, uint32_t T, float *const *logits, float *const *hidden, const float *in,
                     float *stage_out) {
    const ds4_weights *w = b->base.w;
    const ds4_config *c = b->cfg;
    uint32_t D = c->n_embd, hcD = c->n_hc * D;
    uint32_t tok[T];
    for (uint32_t t = 0; t < T; t++) tok[t] = b->rows[t].tok;
    if (b->layer_first > 0) {
        memcpy(b->S, in, (size_t)T * hcD * sizeof(float));
    } else {
        for (uint32_t t = 0; t < T; t++) { /* every stream starts as the embedding (5.1) */
            float *S = b->S + (size_t)t * hcD;
            ds4_dequantize_row(w->token_embd.type, ds4_wt_row(&w->token_embd, 0, tok[t]), S, D);
            for (uint32_t h = 1; h < c->n_hc; h++) memcpy(S + (size_t)h * D, S, D * sizeof(float));
        }
    }
    for (uint32_t il = b->layer_first; il < b->layer_end; il++) {
        cpu_layer L = cpu_main_layer(b, il);
        cpu_attention_layer(b, &L, T);
        cpu_ffn_layer(b, &L, tok, T);
    }
    cpu_pass_end(b, T, tok, hidden);
    if (b->layer_end < c->n_layer) memcpy(stage_out, b->S, (size_t)T * hcD * sizeof(float));
    else cpu_output_head(b, &w->output_hc_fn, &w->output_hc_scale, &w->output_hc_base, &w->output_norm, T, logits);
}

void cpu_pass_end(cpu_backend *b, uint32_t T, const uint32_t *tok, float *const *hidden) {
    uint32_t hcD = b->cfg->n_hc * b->cfg->n_embd;
    for (uint32_t t = 0; t < T; t++) {
        const cpu_row *r = &b->rows[t];
        const float *S = b->S + (size_t)t * hcD;
        r->st->tokens[r->pos] = tok[t];
        r->st->n_tokens = r->pos + 1;
        if (r->s->hid) memcpy(r->s->hid + (size_t)(r->pos % DS4_HIDDEN_KEEP) * hcD, S, hcD * sizeof(float));
        if (hidden && hidden[t]) memcpy(hidden[t], S, hcD * sizeof(float));
    }
}

/* An MTP row's residual is one its sequence keeps: of a past position,
 * among the last DS4_HIDDEN_KEEP (the row's own sequence's residual at the
 * position before it is still unwritten when it is an earlier row of the
 * same step: not allowed either). */
static int check_hidden(const cpu_backend *b, const ds4_row *r, uint32_t i, ds4_err *err) {
    if (!r->hseq || r->hseq->owner != &b->base)
        return ds4_err_set(err, DS4_EINVAL, "row %u: an MTP row without the residual it pairs with", i);
    const cpu_seq *h = cpu_seq_of(r->hseq);
    uint32_t n = h->st->n_tokens;
    if (r->hpos >= n || r->hpos + DS4_HIDDEN_KEEP < n)
        return ds4_err_set(err, DS4_EINVAL,
                           "row %u: the residual of position %u is not kept (the sequence has %u, "
                           "keeps the last %d)",
                           i, r->hpos, n, DS4_HIDDEN_KEEP);
    return 0;
}

/* Rows are valid for a pass: tokens in the vocabulary, a sequence's rows
 * adjacent and within its context, rewindable sequences within the
 * journal's rows. */
static int check_rows(const cpu_backend *b, const ds4_row *rows, uint32_t n, bool mtp, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (n > b->chunk) return ds4_err_set(err, DS4_ERANGE, "a step of %u rows exceeds the %u a pass holds", n, b->chunk);
    for (uint32_t i = 0; i < n;) {
        if (!rows[i].seq || rows[i].seq->owner != &b->base)
            return ds4_err_set(err, DS4_EINVAL, "row %u: the sequence is not this backend's", i);
        const cpu_seq *s = cpu_seq_of(rows[i].seq);
        if (s->mtp != mtp)
            return ds4_err_set(err, DS4_EINVAL, "row %u: a sequence of the %s in a step of the %s", i,
                               s->mtp ? "MTP block" : "main model", mtp ? "MTP block" : "main model");
        uint32_t m = 0;
        while (i + m < n && rows[i + m].seq == &s->base) {
            const ds4_row *r = &rows[i + m];
            if (r->token >= c->n_vocab)
                return ds4_err_set(err, DS4_EINVAL, "token %u at row %u is outside the vocabulary (%u)", r->token,
                                   i + m, c->n_vocab);
            if (mtp && check_hidden(b, r, i + m, err) != 0) return -1;
            if ((r->want & DS4_ROW_REWIND) != (rows[i].want & DS4_ROW_REWIND))
                return ds4_err_set(err, DS4_EINVAL, "row %u: the rows of a sequence are all rewindable or none is",
                                   i + m);
            m++;
        }
        for (uint32_t k = i + m; k < n; k++)
            if (rows[k].seq == &s->base)
                return ds4_err_set(err, DS4_EINVAL, "row %u: the rows of a sequence must be adjacent", k);
        if ((uint64_t)s->st->n_tokens + m > s->st->ctx)
            return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", m, s->st->n_tokens,
                               s->st->ctx);
        if ((rows[i].want & DS4_ROW_REWIND) && !s->j.valid)
            return ds4_err_set(err, DS4_EINVAL, "row %u: a rewindable row of a sequence without a mark", i);
        if ((rows[i].want & DS4_ROW_REWIND) && s->st->n_tokens + m - s->j.n0 > DS4_REWIND_MAX)
            return ds4_err_set(err, DS4_ERANGE, "%u rewindable rows after the mark exceed %d",
                               s->st->n_tokens + m - s->j.n0, DS4_REWIND_MAX);
        i += m;
    }
    return 0;
}

/* A step over rows of the main model's sequences, or (mtp) of the MTP
 * block's. */
static int step_rows(cpu_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp,
                     const float *in, float *resid, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (n == 0) return 0;
    if (check_rows(b, rows, n, mtp, err) != 0) return -1;
    if (b->layer_first > 0 && !in)
        return ds4_err_set(err, DS4_EINVAL, "a pipeline stage from layer %u needs its rows' residuals", b->layer_first);
    if (b->layer_end < c->n_layer && !resid)
        return ds4_err_set(err, DS4_EINVAL, "a pipeline stage to layer %u needs room for its rows' residuals",
                           b->layer_end - 1);
    float *logits[n], *hidden[n];
    uint32_t nl = 0, nh = 0, k = 0;
    for (uint32_t i = 0; i < n; i++) {
        cpu_seq *s = cpu_seq_of(rows[i].seq);
        bool last = i + 1 == n || rows[i + 1].seq != rows[i].seq;
        if (i == 0 || rows[i - 1].seq != rows[i].seq) { /* the sequence's first row */
            k = 0;
            if (!(rows[i].want & DS4_ROW_REWIND)) s->j.valid = false; /* drops the mark */
        }
        b->rows[i] = (cpu_row){s, s->st, (rows[i].want & DS4_ROW_REWIND) ? &s->j : NULL, s->st->n_tokens + k++,
                               rows[i].token};
        /* a rewindable row's logits are kept whether asked for or not: a
         * rewind to it brings them back as the sequence's */
        logits[i] = (rows[i].want & DS4_ROW_LOGITS) && out && out->logits ? out->logits + (size_t)nl++ * c->n_vocab
                    : b->rows[i].j                                        ? cpu_journal_logits_row(b, s, b->rows[i].pos)
                    : last                                                ? s->st->logits
                                                                          : NULL;
        hidden[i] = (rows[i].want & DS4_ROW_HIDDEN) && out && out->hidden && b->layer_end == c->n_layer
                        ? out->hidden + (size_t)nh++ * c->n_hc * c->n_embd
                        : NULL;
    }
    if (mtp) cpu_mtp_pass(b, rows, n, logits, hidden);
    else run_pass(b, n, logits, hidden, in, resid);
    for (uint32_t i = 0; i < n; i++) {
        cpu_seq *s = cpu_seq_of(rows[i].seq);
        if (s->j.valid && b->rows[i].j) cpu_journal_logits(b, s, b->rows[i].pos, logits[i]);
        if (b->layer_end < c->n_layer) continue; /* a stage before the head has none */
        if (i + 1 == n ||
            rows[i + 1].seq != rows[i].seq) { /* the sequence's last row: its logits are the next token's */
            if (logits[i] != s->st->logits) memcpy(s->st->logits, logits[i], c->n_vocab * sizeof(float));
            s->st->has_logits = true;
        }
    }
    return 0;
}

static int cpu_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    return step_rows((cpu_backend *)base, rows, n, out, false, NULL, NULL, err);
}

static int cpu_stage_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const float *in, float *resid,
                          const ds4_step_out *out, ds4_err *err) {
    return step_rows((cpu_backend *)base, rows, n, out, false, in, resid, err);
}

static int cpu_mtp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    if (!b->base.opts.mtp) return ds4_err_set(err, DS4_EINVAL, "the backend was made without an MTP block");
    return step_rows(b, rows, n, out, true, NULL, NULL, err);
}

static int cpu_prefill(ds4_backend *base, ds4_seq *seq, const uint32_t *tokens, uint32_t n, float *all_logits,
                       ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    cpu_seq *s = cpu_seq_of(seq);
    const ds4_config *c = b->cfg;
    if (n == 0) return 0;
    if ((uint64_t)s->st->n_tokens + n > s->st->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", n, s->st->n_tokens,
                           s->st->ctx);
    ds4_row rows[b->chunk];
    for (uint32_t off = 0; off < n; off += b->chunk) {
        uint32_t T = n - off < b->chunk ? n - off : b->chunk;
        for (uint32_t t = 0; t < T; t++) rows[t] = ds4_row_of(seq, tokens[off + t], all_logits ? DS4_ROW_LOGITS : 0);
        ds4_step_out out = {all_logits ? all_logits + (size_t)off * c->n_vocab : NULL, NULL};
        if (cpu_step(base, rows, T, &out, err) != 0) return -1;
    }
    return 0;
}

static int cpu_decode(ds4_backend *base, ds4_seq *s, uint32_t token, ds4_err *err) {
    ds4_row row = ds4_row_of(s, token, 0);
    return cpu_step(base, &row, 1, NULL, err);
}

static const float *cpu_logits(ds4_backend *base, ds4_seq *seq) {
    (void)base;
    cpu_seq *s = cpu_seq_of(seq);
    return s->st->has_logits ? s->st->logits : NULL;
}

static void cpu_reset(ds4_backend *base, ds4_seq *seq) {
    (void)base;
    cpu_seq *s = cpu_seq_of(seq);
    s->j.valid = false;
    ds4_kv_state_reset(s->st);
}

static int cpu_snapshot(ds4_backend *base, ds4_seq *seq, ds4_kv_state *out, ds4_err *err) {
    (void)base;
    return ds4_kv_state_copy(out, cpu_seq_of(seq)->st, err);
}

static int cpu_restore(ds4_backend *base, ds4_seq *seq, const ds4_kv_state *in, ds4_err *err) {
    (void)base;
    cpu_seq *s = cpu_seq_of(seq);
    s->j.valid = false;
    return ds4_kv_state_copy(s->st, in, err);
}

static int cpu_mark(ds4_backend *base, ds4_seq *seq, ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    if (b->layer_first > 0 || b->layer_end < b->cfg->n_layer)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline stage does not journal rows for a rewind");
    return cpu_journal_begin(b, cpu_seq_of(seq), err);
}

/* A sequence's memory: its state, and with an MTP block the residual
 * ring, the block's own sequence (each session drafts with one) and both
 * journals (their first rewindable step makes them).  Everything is in
 * host memory, its pages committed as tokens fill them: MemAvailable
 * still counts the main sequence's as free.  The backend reads the whole
 * mapped model file while it runs. */
static void cpu_seq_memory(const ds4_backend *base, uint32_t ctx, ds4_seq_memory *m) {
    const cpu_backend *b = (const cpu_backend *)base;
    const ds4_mtp_weights *mtp = b->base.opts.mtp;
    m->bytes = ds4_kv_state_bytes_layers(b->cfg, ctx, b->layer_first, b->layer_end);
    if (mtp) {
        uint64_t hid = (uint64_t)DS4_HIDDEN_KEEP * b->cfg->n_hc * b->cfg->n_embd * sizeof(float);
        m->bytes += 2 * hid + ds4_kv_state_bytes(&mtp->cfg, ctx) + cpu_journal_bytes(b->cfg) +
                    cpu_journal_bytes(&mtp->cfg);
    }
    m->host_bytes = 0;
    m->room = ds4_mem_available();
    m->host_weights = ds4_weights_bytes(b->base.w);
    m->in_host = true;
}

static const ds4_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .seq_new = cpu_seq_new,
    .mtp_seq_new = cpu_mtp_seq_new,
    .seq_free = cpu_seq_free,
    .seq_resize = cpu_seq_resize,
    .seq_len = cpu_seq_len,
    .mtp_step = cpu_mtp_step,
    .stage_step = cpu_stage_step,
    .step = cpu_step,
    .mark = cpu_mark,
    .rewind = cpu_rewind,
    .prefill = cpu_prefill,
    .decode = cpu_decode,
    .logits = cpu_logits,
    .reset = cpu_reset,
    .snapshot = cpu_snapshot,
    .restore = cpu_restore,
    .seq_memory = cpu_seq_memory,
};

ds4_backend *ds4_cpu_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    if (w->synthetic) {
        ds4_err_set(err, DS4_EUNSUPPORTED,
                    "synthetic weights have no data on the host; only the cuda backend fills them");
        return NULL;
    }
    if (c->n_expert_used > MAX_EXPERT_USED) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "expert_used_count %u: the CPU backend handles at most %d", c->n_expert_used,
                    MAX_EXPERT_USED);
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
    b->max_ctx = b->base.opts.ctx_size;
    b->layer_first = b->base.opts.layer_first;
    b->layer_end = b->base.opts.layer_end ? b->base.opts.layer_end : c->n_layer;
    if (b->layer_first >= b->layer_end || b->layer_end > c->n_layer) {
        ds4_err_set(err, DS4_EINVAL, "layers %u..%u are not a range of the model's %u", b->layer_first,
                    b->layer_end - 1, c->n_layer);
        goto fail;
    }
    if (b->base.opts.mtp && (b->layer_first > 0 || b->layer_end < c->n_layer)) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline stage does not run the MTP block");
        goto fail;
    }
    if (c->rope_dim / 2 > DS4_ROPE_MAX_PAIRS) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "rope.dimension_count %u exceeds %d", c->rope_dim, 2 * DS4_ROPE_MAX_PAIRS);
        goto fail;
    }
    ds4_rope_init(&b->rope_dense, c, false);
    ds4_rope_init(&b->rope_comp, c, true);
    if (!(b->pool = ds4_pool_create(b->base.opts.n_threads, err))) goto fail;
    b->n_threads = b->base.opts.n_threads = ds4_pool_size(b->pool);
    if (!(b->base.main = seq_new(b, b->base.opts.main_ctx, false, err))) goto fail;
    if (alloc_buffers(b, err) != 0) goto fail;
    return &b->base;
fail:
    cpu_free(&b->base);
    return NULL;
}
