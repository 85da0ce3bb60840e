/*
 * cpu_attn.c - the attention sublayer (docs/MODEL.md 6.1-6.3).
 *
 * For a chunk of tokens: HC pre and the projections (Q low rank, per-head
 * norm, tail RoPE; the single KV row; compressor and indexer projections)
 * are batched; then the tokens are walked in order, each one pushing its KV
 * row into the raw ring, feeding the compressors (which may emit a
 * compressed row), choosing its visible compressed rows (all of them, or the
 * indexer's top-k on ratio-4 layers) and attending with the head's sink;
 * the outputs get the inverse RoPE, the grouped output projection and HC
 * post.
 *
 * Low-precision simulations (on unless --no-sim; transformers has none of
 * them): FP8 round trip of the non-RoPE part of every KV row, raw and
 * compressed (4.3); f16 rounding of raw rows; Hadamard + FP4 round trip of
 * indexer queries and rows (4.4).  Compressed rows are not f16-rounded:
 * antirez/ds4's CPU path does that (MODEL.md 6.1 A6/A7) but its GPU paths
 * and the official graph (MODEL.md 12.1) keep them in f32.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"
#include "model/cpu/cpu.h"
#include "model/lowprec.h"

/* ------------------------------------------------------ the compressor */

typedef struct compressor {
    float *skv, *sscore; /* frontier: SR x width each */
    const ds4_wt *ape, *norm;
    uint32_t ratio, hd;
} compressor;

/* One token of MODEL.md 6.2: store the token's projections (score plus the
 * positional bias of its phase) in its frontier row; when the token closes
 * a window, pool the window per dimension with a softmax over the scores,
 * normalise and RoPE the result at the window's first position into `out`
 * and return true.  Frontier rows past the current window are kept empty
 * (0 / -inf), the canonical form of MODEL.md 6.2. */
static bool compressor_step(cpu_backend *b, const compressor *cp, const float *kvc, const float *scc, uint32_t p,
                            float *out) {
    uint32_t ratio = cp->ratio, hd = cp->hd, width = ds4_compress_coff(ratio) * hd;
    uint32_t phase = p % ratio, R = ratio == 4 ? 4 + phase : phase;
    float *ape = b->ape;
    ds4_dequantize_row(cp->ape->type, ds4_wt_row(cp->ape, 0, phase), ape, width);
    float *rkv = cp->skv + (size_t)R * width, *rsc = cp->sscore + (size_t)R * width;
    for (uint32_t j = 0; j < width; j++) {
        rkv[j] = kvc[j];
        rsc[j] = scc[j] + ape[j];
    }
    if ((p + 1) % ratio != 0) return false;

    /* Candidates of output dim j: ratio 128, rows 0..127 at column j;
     * ratio 4, rows 0..3 at column j (previous window, first half of the
     * width) and rows 4..7 at column hd + j (this window, second half). */
    uint32_t n_cand = ratio == 4 ? 8 : ratio;
    for (uint32_t j = 0; j < hd; j++) {
        float mx = DS4_SCORE_NEG_INF;
        for (uint32_t r = 0; r < n_cand; r++) {
            uint32_t col = (ratio == 4 && r >= 4) ? hd + j : j;
            mx = fmaxf(mx, cp->sscore[(size_t)r * width + col]);
        }
        float sum = 0.0f, acc = 0.0f;
        for (uint32_t r = 0; r < n_cand; r++) {
            uint32_t col = (ratio == 4 && r >= 4) ? hd + j : j;
            float e = expf(cp->sscore[(size_t)r * width + col] - mx);
            sum += e;
            acc += e * cp->skv[(size_t)r * width + col];
        }
        out[j] = sum > 0.0f ? acc / sum : 0.0f;
    }
    cpu_rmsnorm(out, out, cpu_vec(cp->norm), hd, b->cfg->rms_eps);
    ds4_rope_apply(&b->rope_comp, out + hd - b->cfg->rope_dim, p + 1 - ratio, false);

    if (ratio == 4) { /* this window becomes the previous one */
        memcpy(cp->skv, cp->skv + 4 * (size_t)width, 4 * (size_t)width * sizeof(float));
        memcpy(cp->sscore, cp->sscore + 4 * (size_t)width, 4 * (size_t)width * sizeof(float));
        ds4_frontier_clear(cp->skv, cp->sscore, width, 4, 8);
    } else {
        ds4_frontier_clear(cp->skv, cp->sscore, width, 0, ratio);
    }
    return true;
}

/* f32 dot product: the SIMD F32 kernel of quants.h (double accumulation;
 * an F32 "activation" is the plain float vector). */
static float dot(const float *a, const float *b, uint32_t n) { return ds4_vec_dot(DS4_TYPE_F32, n, a, b); }

/* ---------------------------------------------------- the indexer top-k */

typedef struct index_task {
    const float *iq, *iw, *rows;
    float *scores;
    uint32_t n_head, hd;
} index_task;

/* score_c = sum_h w_h * max(0, q_h . k_c)  (MODEL.md 6.3 step 3) */
static void index_scores(void *ctx, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    const index_task *x = ctx;
    for (int64_t c = c0; c < c1; c++) {
        const float *k = x->rows + (size_t)c * x->hd;
        float s = 0.0f;
        for (uint32_t h = 0; h < x->n_head; h++) {
            const float *q = x->iq + (size_t)h * x->hd;
            s += x->iw[h] * fmaxf(dot(q, k, x->hd), 0.0f);
        }
        x->scores[c] = s;
    }
}

/* a ranks below b: lower score, or equal score and higher index. */
static bool ranks_below(const float *s, uint32_t a, uint32_t b) { return s[a] < s[b] || (s[a] == s[b] && a > b); }

static void sift_down(uint32_t *heap, uint32_t n, uint32_t i, const float *s) {
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && ranks_below(s, heap[l], heap[m])) m = l;
        if (r < n && ranks_below(s, heap[r], heap[m])) m = r;
        if (m == i) return;
        uint32_t tmp = heap[i];
        heap[i] = heap[m];
        heap[m] = tmp;
        i = m;
    }
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The k best of n scores (higher first, lower index on ties) into
 * b->visible, in ascending row order: a min-heap of the best so far. */
static void top_k(cpu_backend *b, const float *s, uint32_t n, uint32_t k) {
    uint32_t *heap = b->visible;
    for (uint32_t c = 0; c < k; c++) heap[c] = c;
    for (int64_t i = (int64_t)k / 2 - 1; i >= 0; i--) sift_down(heap, k, (uint32_t)i, s);
    for (uint32_t c = k; c < n; c++)
        if (ranks_below(s, heap[0], c)) {
            heap[0] = c;
            sift_down(heap, k, 0, s);
        }
    qsort(heap, k, sizeof(uint32_t), cmp_u32);
    b->n_visible = k;
}

static void select_rows(cpu_backend *b, const cpu_layer *L, uint32_t t, uint32_t n_comp) {
    const ds4_config *c = b->cfg;
    if (L->ratio != 4 || n_comp <= c->idx_top_k) {
        for (uint32_t i = 0; i < n_comp; i++) b->visible[i] = i;
        b->n_visible = n_comp;
        return;
    }
    index_task x = {b->iq + (size_t)t * c->idx_n_head * c->idx_head_dim,
                    b->iw + (size_t)t * c->idx_n_head,
                    b->rows[t].st->layers[L->il].idx,
                    b->idx_scores,
                    c->idx_n_head,
                    c->idx_head_dim};
    uint64_t work = (uint64_t)n_comp * c->idx_n_head * c->idx_head_dim;
    ds4_pool_run(work < CPU_MIN_TASK_WORK ? NULL : b->pool, n_comp, 16, index_scores, &x);
    top_k(b, b->idx_scores, n_comp, c->idx_top_k);
}

/* ------------------------------------------------------------ attention */

typedef struct attn_task {
    cpu_backend *b;
    const float *q; /* this token's heads */
    float *out;
    const float *sinks;
    const ds4_layer_state *L;
    uint32_t p, raw_cap;
} attn_task;

/* Sink-aware attention of heads [h0, h1) over the raw rows of positions
 * max(0, p-W+1)..p and the visible compressed rows (MODEL.md 4.6). */
static void attend_heads(void *ctx, int64_t h0, int64_t h1, int thread) {
    const attn_task *a = ctx;
    cpu_backend *b = a->b;
    const ds4_config *c = b->cfg;
    uint32_t hd = c->head_dim, p = a->p, raw_cap = a->raw_cap;
    uint32_t first = p + 1 > c->sliding_window ? p + 1 - c->sliding_window : 0;
    uint32_t n_raw = p + 1 - first, n_rows = n_raw + b->n_visible;
    float *scores = b->att_scratch + (size_t)thread * b->att_stride;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t h = h0; h < h1; h++) {
        const float *q = a->q + (size_t)h * hd;
        float mx = a->sinks[h];
        for (uint32_t i = 0; i < n_rows; i++) {
            const float *row = i < n_raw ? a->L->raw + (size_t)((first + i) % raw_cap) * hd
                                         : a->L->comp + (size_t)b->visible[i - n_raw] * hd;
            scores[i] = dot(q, row, hd) * scale;
            mx = fmaxf(mx, scores[i]);
        }
        float den = expf(a->sinks[h] - mx);
        float *o = a->out + (size_t)h * hd;
        memset(o, 0, hd * sizeof(float));
        for (uint32_t i = 0; i < n_rows; i++) {
            const float *row = i < n_raw ? a->L->raw + (size_t)((first + i) % raw_cap) * hd
                                         : a->L->comp + (size_t)b->visible[i - n_raw] * hd;
            float e = expf(scores[i] - mx);
            den += e;
            for (uint32_t d = 0; d < hd; d++) o[d] += e * row[d];
        }
        for (uint32_t d = 0; d < hd; d++) o[d] /= den;
        /* K = V carried the key's RoPE; undo it at the query position. */
        ds4_rope_apply(b->ratio_rope, o + hd - c->rope_dim, p, true);
    }
}

/* ------------------------------------------------------- the sublayer */

/* Q path (A3): qr = RMSNorm(q_a . xn) kept for the indexer; q = q_b . qr,
 * per-head unweighted RMSNorm, tail RoPE. */
static void project_q(cpu_backend *b, const ds4_layer_weights *w, uint32_t T) {
    const ds4_config *c = b->cfg;
    uint32_t qd = c->n_head * c->head_dim;
    cpu_matmul(b, &w->q_a, 0, 0, c->q_lora_rank, b->xn, c->n_embd, T, b->qr, c->q_lora_rank);
    for (uint32_t t = 0; t < T; t++) {
        float *qr = b->qr + (size_t)t * c->q_lora_rank;
        cpu_rmsnorm(qr, qr, cpu_vec(&w->q_a_norm), c->q_lora_rank, c->rms_eps);
    }
    cpu_matmul(b, &w->q_b, 0, 0, qd, b->qr, c->q_lora_rank, T, b->q, qd);
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t h = 0; h < c->n_head; h++) {
            float *q = b->q + (size_t)t * qd + (size_t)h * c->head_dim;
            cpu_rmsnorm(q, q, NULL, c->head_dim, c->rms_eps);
            ds4_rope_apply(b->ratio_rope, q + c->head_dim - c->rope_dim, b->rows[t].pos, false);
        }
}

/* KV path (A4): RMSNorm(kv . xn), tail RoPE, FP8 round trip of the rest. */
static void project_kv(cpu_backend *b, const ds4_layer_weights *w, uint32_t T) {
    const ds4_config *c = b->cfg;
    uint32_t hd = c->head_dim;
    cpu_matmul(b, &w->kv, 0, 0, hd, b->xn, c->n_embd, T, b->kv, hd);
    for (uint32_t t = 0; t < T; t++) {
        float *kv = b->kv + (size_t)t * hd;
        cpu_rmsnorm(kv, kv, cpu_vec(&w->kv_norm), hd, c->rms_eps);
        ds4_rope_apply(b->ratio_rope, kv + hd - c->rope_dim, b->rows[t].pos, false);
        if (b->sim) ds4_fp8_kv_roundtrip(kv, hd - c->rope_dim);
    }
}

/* Indexer queries (6.3 steps 1-2): per head tail RoPE then Hadamard+FP4;
 * head weights scaled by 1/sqrt(head_dim * n_head). */
static void project_indexer(cpu_backend *b, const ds4_layer_weights *w, uint32_t T) {
    const ds4_config *c = b->cfg;
    uint32_t ihd = c->idx_head_dim, iqd = c->idx_n_head * ihd, iw2 = 2 * ihd;
    cpu_matmul(b, &w->idx_kv, 0, 0, iw2, b->xn, c->n_embd, T, b->ikv, iw2);
    cpu_matmul(b, &w->idx_gate, 0, 0, iw2, b->xn, c->n_embd, T, b->igate, iw2);
    cpu_matmul(b, &w->idx_q_b, 0, 0, iqd, b->qr, c->q_lora_rank, T, b->iq, iqd);
    cpu_matmul(b, &w->idx_proj, 0, 0, c->idx_n_head, b->xn, c->n_embd, T, b->iw, c->idx_n_head);
    float wscale = 1.0f / sqrtf((float)ihd * (float)c->idx_n_head);
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t h = 0; h < c->idx_n_head; h++) {
            float *q = b->iq + (size_t)t * iqd + (size_t)h * ihd;
            ds4_rope_apply(&b->rope_comp, q + ihd - c->rope_dim, b->rows[t].pos, false);
            if (b->sim) ds4_indexer_qat_row(q);
        }
        for (uint32_t h = 0; h < c->idx_n_head; h++) b->iw[(size_t)t * c->idx_n_head + h] *= wscale;
    }
}

void cpu_compress_row(cpu_backend *b, const cpu_layer *L, ds4_kv_state *st, const float *ckv, const float *cgate,
                      const float *ikv, const float *igate, uint32_t p) {
    const ds4_config *c = b->cfg;
    ds4_layer_state *S = &st->layers[L->il];
    const ds4_layer_weights *w = L->w;
    uint32_t hd = c->head_dim;
    if (L->ratio != 0) {
        compressor cp = {S->comp_kv, S->comp_score, &w->comp_ape, &w->comp_norm, L->ratio, hd};
        float *row = S->comp + (size_t)(p / L->ratio) * hd; /* the row this window will fill */
        if (compressor_step(b, &cp, ckv, cgate, p, row) && b->sim) ds4_fp8_kv_roundtrip(row, hd - c->rope_dim);
    }
    if (L->ratio == 4) {
        uint32_t ihd = c->idx_head_dim;
        compressor cp = {S->idx_kv, S->idx_score, &w->idx_ape, &w->idx_norm, 4, ihd};
        float *row = S->idx + (size_t)(p / 4) * ihd;
        if (compressor_step(b, &cp, ikv, igate, p, row) && b->sim) ds4_indexer_qat_row(row);
    }
}

/* The in-order part for row t: raw ring, compressors, row selection,
 * attention, each in the row's own sequence state.  A rewindable pass
 * journals what the row overwrites and its compressor inputs. */
static void attend_token(cpu_backend *b, const cpu_layer *L, uint32_t t) {
    const ds4_config *c = b->cfg;
    const cpu_row *r = &b->rows[t];
    ds4_layer_state *S = &r->st->layers[L->il];
    uint32_t hd = c->head_dim, p = r->pos, ratio = L->ratio;
    uint32_t cw = ratio ? ds4_compress_coff(ratio) * hd : 0, iw2 = 2 * c->idx_head_dim;
    const float *ckv = b->ckv + (size_t)t * cw, *cgate = b->cgate + (size_t)t * cw;
    const float *ikv = b->ikv + (size_t)t * iw2, *igate = b->igate + (size_t)t * iw2;

    float *raw = S->raw + (size_t)(p % r->st->raw_cap) * hd;
    if (r->j) cpu_journal_raw(b, r->j, L->jl, p, raw, false);
    memcpy(raw, b->kv + (size_t)t * hd, hd * sizeof(float));
    if (b->sim) ds4_f16_round_row(raw, hd);
    if (r->j) {
        cpu_journal_raw(b, r->j, L->jl, p, raw, true);
        cpu_journal_proj(b, r->j, L->jl, p, ckv, cgate, ikv, igate);
    }
    cpu_compress_row(b, L, r->st, ckv, cgate, ikv, igate, p);
    select_rows(b, L, t, ratio ? (p + 1) / ratio : 0);

    uint32_t qd = c->n_head * hd;
    attn_task a = {b, b->q + (size_t)t * qd, b->heads + (size_t)t * qd, cpu_vec(&L->w->sinks), S, p, r->st->raw_cap};
    uint32_t n_rows = (p + 1 < c->sliding_window ? p + 1 : c->sliding_window) + b->n_visible;
    uint64_t work = (uint64_t)2 * c->n_head * n_rows * hd;
    ds4_pool_run(work < CPU_MIN_TASK_WORK ? NULL : b->pool, c->n_head, 1, attend_heads, &a);
}

void cpu_attention_layer(cpu_backend *b, const cpu_layer *L, uint32_t T) {
    const ds4_config *c = b->cfg;
    const ds4_layer_weights *w = L->w;
    uint32_t D = c->n_embd, ratio = L->ratio;
    b->ratio_rope = ratio ? &b->rope_comp : &b->rope_dense;

    cpu_hc_pre(b, &w->hc_attn_fn, &w->hc_attn_scale, &w->hc_attn_base, T);
    for (uint32_t t = 0; t < T; t++)
        cpu_rmsnorm(b->xn + (size_t)t * D, b->x + (size_t)t * D, cpu_vec(&w->attn_norm), D, c->rms_eps);
    project_q(b, w, T);
    project_kv(b, w, T);
    if (ratio != 0) {
        uint32_t width = ds4_compress_coff(ratio) * c->head_dim;
        cpu_matmul(b, &w->comp_kv, 0, 0, width, b->xn, D, T, b->ckv, width);
        cpu_matmul(b, &w->comp_gate, 0, 0, width, b->xn, D, T, b->cgate, width);
    }
    if (ratio == 4) project_indexer(b, w, T);

    for (uint32_t t = 0; t < T; t++) attend_token(b, L, t);

    /* Grouped output projection (A11): group g's heads through its own
     * o_lora_rank rows of attn_output_a, then attn_output_b. */
    uint32_t qd = c->n_head * c->head_dim, gin = qd / c->o_groups, low = c->o_groups * c->o_lora_rank;
    for (uint32_t g = 0; g < c->o_groups; g++)
        cpu_matmul(b, &w->out_a, 0, (uint64_t)g * c->o_lora_rank, c->o_lora_rank, b->heads + (size_t)g * gin, qd, T,
                   b->low + (size_t)g * c->o_lora_rank, low);
    cpu_matmul(b, &w->out_b, 0, 0, D, b->low, low, T, b->y, D);
    cpu_steer(b, L, T, false);
    cpu_hc_post(b, T);
}
