/*
 * cuda_backend.cu - the CUDA ds4_backend: creation (weights, session state
 * and pass buffers in GPU memory), prefill in chunks, decode as one graph
 * launch per token, greedy generation without host round trips, and
 * snapshot / restore through the backend-neutral ds4_kv_state (so a DSV4
 * payload moves freely between the CPU and CUDA backends).
 */
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_internal.h"

extern "C" {
#include "base/numparse.h"
#include "base/rank.h"
#include "model/backends.h"
#include "model/session_state.h"
#include "model/steering.h"
}

#define REC_CAP     4096
#define LOGITS_ROWS 64

/* ----------------------------------------------------------- buffers */

/* Bump allocation inside one device block: the first pass (base NULL)
 * only sums the sizes. */
typedef struct bump {
    uint8_t *base;
    size_t off;
} bump;

#ifndef DS4_CUDA_EMU
thread_local cudaError_t ds4_launch_status = cudaSuccess;
#endif

static void *take(bump *m, size_t bytes) {
    size_t at = (m->off + 255) / 256 * 256;
    m->off = at + bytes;
    return m->base ? m->base + at : NULL;
}
#define TAKE(m, ptr, count) ((ptr) = (decltype(ptr))take((m), (size_t)(count) * sizeof(*(ptr))))

static void take_act(bump *m, dact *a, uint32_t n, uint32_t rows, unsigned forms) {
    a->n = n;
    a->fs = n;
    a->q8s = forms & ACT_Q8 ? cu_q8_bytes(n) : 0;
    a->qks = forms & ACT_QK ? cu_qk_bytes(n) : 0;
    a->f = forms & ACT_F ? (float *)take(m, (size_t)rows * n * sizeof(float)) : NULL;
    a->q8 = a->q8s ? (uint8_t *)take(m, (size_t)rows * a->q8s) : NULL;
    a->qk = a->qks ? (uint8_t *)take(m, (size_t)rows * a->qks) : NULL;
}

/* The forms the products with weights m1 and m2 (absent: none) of every
 * layer read.  Activations read only by those are made (and stored) only
 * in those forms, plus f32 where their producer needs it: the SwiGLU
 * outputs (for the q2 recipe the routed rows as Q8_K alone, a sixth of
 * their f32 + Q8_0 + Q8_K bytes) and the attention heads (Q8_0 alone),
 * and no Q8_K rows for the attention projections' inputs. */
static unsigned layer_forms(const cuda_backend *b, dwt dlayer::*m1, dwt dlayer::*m2) {
    unsigned forms = 0;
    for (uint32_t il = 0; il <= b->cfg->n_layer; il++) { /* the MTP block's layer too (absent: no forms) */
        const dlayer *w = &b->W.layers[il];
        if (dwt_present(&(w->*m1))) forms |= cu_act_form((w->*m1).type);
        if (m2 && dwt_present(&(w->*m2))) forms |= cu_act_form((w->*m2).type);
    }
    return forms;
}

static void layout_buffers(cuda_backend *b, bump *m) {
    const ds4_config *c = b->cfg;
    size_t C = b->chunk, D = c->n_embd, k = c->n_expert_used, F = c->n_ff_exp, hd = c->head_dim;
    /* the query heads, output groups and shared-expert rows are the
     * backend's share of them (cu_tp: all of them but under tensor
     * parallelism) */
    size_t ihd = c->idx_head_dim, ih = c->idx_n_head, qd = (size_t)b->tp.heads * hd;
    TAKE(m, b->S, C * c->n_hc * D);
    TAKE(m, b->post, C * c->n_hc);
    TAKE(m, b->comb, C * c->n_hc * c->n_hc);
    TAKE(m, b->hcpart, C * b->hc_split * (ds4_hc_mix(c) + 1));
    TAKE(m, b->hc_count, C);
    TAKE(m, b->route_count, 1);
    TAKE(m, b->hcsums, HC_SUMS);
    take_act(m, &b->xn, c->n_embd, b->chunk, ACT_ALL); /* read by every kind of product */
    TAKE(m, b->qa_raw, C * c->q_lora_rank);
    take_act(m, &b->qr, c->q_lora_rank, b->chunk, ACT_F | layer_forms(b, &dlayer::q_b, &dlayer::idx_q_b));
    TAKE(m, b->q, C * qd);
    TAKE(m, b->kvbuf, C * hd);
    /* the compressors' projections: a prefill chunk's, or a deferred
     * layer's window in a decode step (up to 128 rows) */
    size_t P = C > 128 ? C : 128;
    TAKE(m, b->ckv, P * 2 * hd);
    TAKE(m, b->cgate, P * 2 * hd);
    TAKE(m, b->ikv, P * 2 * ihd);
    TAKE(m, b->igate, P * 2 * ihd);
    TAKE(m, b->iq, C * ih * ihd);
    TAKE(m, b->iw, C * ih);
    TAKE(m, b->idx_scores, C * b->comp_cap4);
    TAKE(m, b->vis, C * c->idx_top_k);
    TAKE(m, b->nvis, C);
    take_act(m, &b->heads, (uint32_t)qd, b->chunk, layer_forms(b, &dlayer::out_a, NULL));
    TAKE(m, b->attn_part, CU_FEW_T * cu_attn_part_floats(c, b->attn_split)); /* CU_FEW_T queries (cu_attend) */
    TAKE(m, b->attn_count, CU_FEW_T * cu_attn_groups(c));
    for (uint32_t i = 0; i < CU_LANES; i++) {
        float *part;
        uint32_t *count;
        TAKE(m, part, cu_attn_part_floats(c, b->attn_split));
        TAKE(m, count, cu_attn_groups(c));
        b->lane_attn_part[i] = part;
        b->lane_attn_count[i] = count;
    }
    TAKE(m, b->attn_tc_rows, cu_attn_tc_rows(b) ? cu_attn_tc_floats(c->head_dim, cu_attn_tc_rows(b)) : 0);
    take_act(m, &b->low, b->tp.groups * c->o_lora_rank, b->chunk, ACT_F | layer_forms(b, &dlayer::out_b, NULL));
    TAKE(m, b->y, C * D);
    if (b->base.opts.steer) TAKE(m, b->d_steer, (size_t)c->n_layer * D);
    TAKE(m, b->router, C * c->n_expert);
    TAKE(m, b->sel, C * k);
    TAKE(m, b->msel, C * k);
    TAKE(m, b->expert_count, b->base.opts.count_experts ? (size_t)c->n_layer * c->n_expert : 0);
    if (!b->base.opts.count_experts) b->expert_count = NULL;
    TAKE(m, b->selw, C * k);
    TAKE(m, b->eg, C * k * F);
    TAKE(m, b->eu, C * k * F);
    /* collecting an imatrix: also the f32 rows (cuda_imatrix.cu reads them) */
    take_act(m, &b->mid, (uint32_t)F, (uint32_t)(C * k),
             layer_forms(b, &dlayer::down_exps, NULL) | (b->base.opts.imatrix ? ACT_F : 0));
    TAKE(m, b->sg, C * b->tp.ff);
    TAKE(m, b->su, C * b->tp.ff);
    take_act(m, &b->smid, b->tp.ff, b->chunk, layer_forms(b, &dlayer::down_sh, NULL));
    TAKE(m, b->eout, C * k * D);
    TAKE(m, b->sout, C * D);
    TAKE(m, b->split, cu_gemm_split_floats());
    size_t max_tiles = C * k / 64 + c->n_expert;
    TAKE(m, b->grp_count, c->n_expert);
    TAKE(m, b->grp_off, c->n_expert);
    TAKE(m, b->grp_perm, C * k);
    TAKE(m, b->few_order, (size_t)CU_FEW_PASS * k);
    TAKE(m, b->grp_tile_mat, max_tiles);
    TAKE(m, b->grp_tile_start, max_tiles);
    TAKE(m, b->grp_tile_count, max_tiles);
    TAKE(m, b->grp_ntiles, 1);
    if (b->base.opts.imatrix) {
        size_t mid_n, routes_n, in_n = cu_imatrix_floats(c, &mid_n, &routes_n);
        TAKE(m, b->imx_in, in_n);
        TAKE(m, b->imx_mid, mid_n);
        TAKE(m, b->imx_routes, routes_n);
    }
    take_act(m, &b->hz, c->n_embd, b->chunk, ACT_F | cu_act_form(b->W.output.type));
    TAKE(m, b->d_logits, (size_t)b->logits_rows * c->n_vocab);
    TAKE(m, b->argmax_part, 128);
    TAKE(m, b->argmax_idx, 128);
    TAKE(m, b->d_tokens, C);
    TAKE(m, b->d_argmax, b->rec_cap);
    TAKE(m, b->d_nrec, 1);
}

static size_t frontier_floats(const ds4_config *c, uint32_t ratio, bool indexer) {
    return (size_t)ds4_state_frontier_rows(ratio) * ds4_state_frontier_width(c, ratio, indexer);
}

/* Whether decode steps defer layer il's compressor projections to the step
 * that closes its window (dlstate.win): its compressor's and indexer's
 * projections are float rows the window products take (cu_win_fits). */
static bool layer_defers(const cuda_backend *b, uint32_t il) {
    const dlayer *w = &b->W.layers[il];
    uint32_t ratio = ds4_layer_ratio(b->cfg, il);
    if (ratio == 0 || !cu_win_fits(&w->comp_kv) || !cu_win_fits(&w->comp_gate)) return false;
    return ratio != 4 || (cu_win_fits(&w->idx_kv) && cu_win_fits(&w->idx_gate));
}

/* A sequence's state: every layer's ring, compressed rows, frontiers and
 * indexer rows (a pipeline stage's layers only: the others' stay empty),
 * sized for s->ctx tokens, and its dstep.  defer: the deferred layers'
 * windows too (dlstate.win: the main sequence's, whose decode graphs keep
 * them). */
static void layout_state(const cuda_backend *b, cu_seq *s, bool defer, bump *m) {
    const ds4_config *c = b->cfg;
    uint32_t cap4 = cu_comp_cap(s->ctx, 4);
    for (uint32_t il = b->layer_first; il < b->layer_end; il++) {
        dlstate *L = &s->L[il];
        L->ratio = ds4_layer_ratio(c, il);
        TAKE(m, L->raw, (size_t)b->raw_cap * c->head_dim);
        if (L->ratio == 0) continue;
        if (defer && layer_defers(b, il)) TAKE(m, L->win, (size_t)L->ratio * c->n_embd);
        else L->win = NULL;
        TAKE(m, L->comp, (size_t)cu_comp_cap(s->ctx, L->ratio) * c->head_dim);
        TAKE(m, L->comp_kv, frontier_floats(c, L->ratio, false));
        TAKE(m, L->comp_score, frontier_floats(c, L->ratio, false));
        if (L->ratio != 4) continue;
        TAKE(m, L->idx, (size_t)cap4 * c->idx_head_dim);
        TAKE(m, L->idx_kv, frontier_floats(c, 4, true));
        TAKE(m, L->idx_score, frontier_floats(c, 4, true));
    }
    TAKE(m, s->d_step, 1);
}

/* --------------------------------------------------------------- state */

/* Empty sequence: frontiers 0 / -inf, position 0. */
static int reset_state(cuda_backend *b, cu_seq *s, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (cu_use(b, s, err)) return -1;
    for (uint32_t il = b->layer_first; il < b->layer_end; il++) {
        const dlstate *L = &s->L[il];
        if (L->ratio == 0) continue;
        size_t fr = frontier_floats(c, L->ratio, false);
        CU_TRY(cudaMemsetAsync(L->comp_kv, 0, fr * sizeof(float), b->st));
        if (cu_fill(b, L->comp_score, fr, DS4_SCORE_NEG_INF, err)) return -1;
        if (L->ratio != 4) continue;
        size_t ifr = frontier_floats(c, 4, true);
        CU_TRY(cudaMemsetAsync(L->idx_kv, 0, ifr * sizeof(float), b->st));
        if (cu_fill(b, L->idx_score, ifr, DS4_SCORE_NEG_INF, err)) return -1;
    }
    if (cu_set_step(b, STEP_POS | STEP_TOKEN | STEP_FOLD, 0, 0, err)) return -1;
    CU_TRY(cudaStreamSynchronize(b->st));
    s->n_tokens = 0;
    s->fold = 0;
    s->jr.valid = false;
    s->has_logits = false;
    s->logits_fresh = false;
    return 0;
}

static void cuda_reset(ds4_backend *base, ds4_seq *seq) {
    cuda_backend *b = (cuda_backend *)base;
    cu_on_device(b);
    if (cu_mtp_seq(b, seq)) return cu_mtp_reset(b);
    ds4_err err = {};
    if (reset_state(b, (cu_seq *)seq, &err)) fprintf(stderr, "ds4 cuda: reset failed: %s\n", ds4_err_msg(&err));
}

/* The host copy of s's logits, from d_last_logits where a pass left them. */
const float *cu_seq_logits(cuda_backend *b, cu_seq *s) {
    if (!s->has_logits) return NULL;
    if (!s->logits_fresh) {
        if (cudaMemcpyAsync(s->logits_h, b->d_last_logits, b->cfg->n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                            b->st) != cudaSuccess ||
            cudaStreamSynchronize(b->st) != cudaSuccess) {
            fprintf(stderr, "ds4 cuda: reading the logits failed: %s\n", cudaGetErrorString(cudaGetLastError()));
            return NULL;
        }
        s->logits_fresh = true;
        if (b->lg_owner == s) b->lg_owner = NULL;
    }
    return s->logits_h;
}

int cu_use(cuda_backend *b, cu_seq *s, ds4_err *err) {
    cu_seq *o = b->lg_owner;
    if (o && o != s) {
        if (o->has_logits && !o->logits_fresh && !cu_seq_logits(b, o))
            return ds4_err_set(err, DS4_EIO, "CUDA: reading a sequence's logits failed");
        b->lg_owner = NULL;
    }
    b->sq = s;
    return 0;
}

/* ------------------------------------------------------- the passes */

/* The MTP block's sequence takes MTP steps and its own calls alone. */
static int not_mtp(const cuda_backend *b, const ds4_seq *seq, const char *what, ds4_err *err) {
    if (cu_mtp_seq(b, seq))
        return ds4_err_set(err, DS4_EINVAL, "%s: the MTP block's sequence advances by MTP steps", what);
    return 0;
}

/* A pipeline stage advances by stage steps alone: its passes start from
 * the residuals of the stage before it, or end with residuals for the
 * next. */
static int not_stage(const cuda_backend *b, const char *what, ds4_err *err) {
    if (cu_stage(b))
        return ds4_err_set(err, DS4_EINVAL, "%s: a pipeline stage (layers %u..%u) advances by stage steps", what,
                           b->layer_first, b->layer_end - 1);
    return 0;
}

static int check_room(const cu_seq *s, uint32_t n, ds4_err *err) {
    if ((uint64_t)s->n_tokens + n > s->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", n, s->n_tokens, s->ctx);
    return 0;
}

static int cuda_prefill(ds4_backend *base, ds4_seq *seq, const uint32_t *tokens, uint32_t n, float *all_logits,
                        ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    const ds4_config *c = b->cfg;
    cu_seq *s = (cu_seq *)seq;
    if (n == 0) return 0;
    if (not_stage(b, "prefill", err) || not_mtp(b, seq, "prefill", err) || check_room(s, n, err) || cu_use(b, s, err))
        return -1;
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] >= c->n_vocab)
            return ds4_err_set(err, DS4_EINVAL, "token %u at index %u is outside the vocabulary (%u)", tokens[i], i,
                               c->n_vocab);
    if (cu_comp_flush(b, err)) return ds4_err_prefix(err, "folding the decode steps' compressor windows");
    b->sq->jr.valid = false;
    for (uint32_t off = 0; off < n; off += b->chunk) {
        uint32_t T = n - off < b->chunk ? n - off : b->chunk;
        CU_TRY(cudaMemcpyAsync(b->d_tokens, tokens + off, T * sizeof(uint32_t), cudaMemcpyHostToDevice, b->st));
        if (cu_forward(b, b->d_tokens, T, b->sq->n_tokens, false,
                       all_logits ? all_logits + (size_t)off * c->n_vocab : NULL, err))
            return ds4_err_prefix(err, "prefill of tokens %u..%u", b->sq->n_tokens, b->sq->n_tokens + T - 1);
        memcpy(b->sq->tokens + b->sq->n_tokens, tokens + off, T * sizeof(uint32_t));
        b->sq->n_tokens += T;
    }
    /* the passes left every position in the frontiers */
    if (cu_set_step(b, STEP_FOLD, b->sq->n_tokens, 0, err)) return -1;
    b->sq->fold = b->sq->n_tokens;
    CU_TRY(cudaStreamSynchronize(b->st));
    s->has_logits = true;
    s->logits_fresh = false;
    b->lg_owner = s;
    if (ds4_prof_on) {
        char title[64];
        snprintf(title, sizeof(title), "prefill of %u tokens", n);
        ds4_prof_report(title);
    }
    return 0;
}

/* The decode step's graphs, captured once when the backend is made: every
 * kernel of them reads the position and token from d_step, so one graph
 * serves every step of its kind (cu_step_kind: which compressor windows
 * close) of every session below its context size (graph_ctx).
 * Capturing, instantiating and uploading the ~860 launches of one takes
 * milliseconds that the first generated token would otherwise wait for.
 * The contexts: 8k, 32k, .. (times 4) below the session's, then the
 * session's (a 64k session: 8k, 32k, 64k; its decode at 4k was 0.1 %
 * slower in the whole context's graph: bcd5cd7).  With DS4_CUDA_PROFILE
 * (a developer build) there is no graph: every launch is
 * timed on its own. */
static int capture_one(cuda_backend *b, uint32_t ctx, uint32_t kind, ds4_err *err) {
    cudaGraph_t g;
    b->dec_ctx = ctx;
    b->dec_kind = kind;
    CU_TRY(cudaStreamBeginCapture(b->st, CU_CAPTURE_MODE));
    b->capturing = true;
    int rc = cu_forward(b, &b->sq->d_step->token, 1, 0, true, NULL, err);
    b->capturing = false;
    b->dec_ctx = b->ctx;
    cudaError_t e = cudaStreamEndCapture(b->st, &g);
    if (rc) return ds4_err_prefix(err, "capturing the decode step (context %u, kind %u)", ctx, kind);
    CU_TRY(e);
    cudaGraphExec_t x;
    e = cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    CU_TRY(e);
    b->graph[b->n_graphs][kind] = x;
    CU_TRY(cudaGraphUpload(x, b->st));
    return 0;
}

/* A graph of each kind of step (CU_STEP_KINDS) for each context. */
static int capture_ctx(cuda_backend *b, uint32_t ctx, ds4_err *err) {
    for (uint32_t k = 0; k < b->n_kinds; k++)
        if (capture_one(b, ctx, k, err)) return -1;
    b->graph_ctx[b->n_graphs++] = ctx;
    return 0;
}

/* The contexts are the backend's (ds4_backend_opts.ctx_size), whatever the
 * main sequence holds: a main sequence made short or resized (cuda_seq_resize)
 * gets the graphs of the contexts up to the first that holds it, the same
 * graphs a main sequence of the whole context runs at those positions, so
 * that its tokens do not depend on its size.  Captured with the main
 * sequence as the one the passes act on (b->sq). */
static int capture_step(cuda_backend *b, ds4_err *err) {
    b->graph_steer[0] = b->main_seq.base.steer_ffn;
    b->graph_steer[1] = b->main_seq.base.steer_attn;
    if (ds4_prof_on) return 0;
    bool held = false;
    for (uint64_t ctx = b->graph_ctx0; ctx < b->ctx && b->n_graphs < CU_GRAPHS - 1 && !held; ctx *= 4) {
        if (capture_ctx(b, (uint32_t)ctx, err)) return -1;
        held = ctx >= b->main_seq.ctx;
    }
    if (!held && capture_ctx(b, b->ctx, err)) return -1;
    CU_TRY(cudaStreamSynchronize(b->st));
    return 0;
}

/* Every decode graph destroyed (their kernels' arguments changed). */
static void drop_graphs(cuda_backend *b) {
    for (uint32_t i = 0; i < CU_GRAPHS; i++)
        for (uint32_t k = 0; k < CU_STEP_KINDS; k++)
            if (b->graph[i][k]) {
                cudaGraphExecDestroy(b->graph[i][k]);
                b->graph[i][k] = NULL;
            }
    b->n_graphs = 0;
}

/* The decode graphs again when the main sequence's steering scales are not
 * the ones they were captured with (a scale is a kernel argument of the
 * graph; with none the graph has no steering launch at all).  Between
 * steps, with nothing in flight. */
static int steer_recapture(cuda_backend *b, ds4_err *err) {
    if (!cu_steer_changed(b)) return 0;
    CU_TRY(cudaStreamSynchronize(b->st));
    drop_graphs(b);
    return capture_step(b, err);
}

/* The decode step at position pos on the device.  Its logits are
 * d_logits' row 0; a prefill that returned every row may have left
 * d_last_logits elsewhere, and the graph runs none of the host code that
 * sets it. */
static int run_step(cuda_backend *b, uint32_t pos, ds4_err *err) {
    b->d_last_logits = b->d_logits;
    uint32_t kind = cu_step_kind(b, pos);
    if (ds4_prof_on) {
        b->dec_kind = kind;
        return cu_forward(b, &b->sq->d_step->token, 1, pos, true, NULL, err);
    }
    uint32_t i = 0;
    while (i + 1 < b->n_graphs && pos >= b->graph_ctx[i]) i++;
    CU_TRY(cudaGraphLaunch(b->graph[i][kind], b->st));
    return 0;
}

/* A token of the main sequence is one launch of its decode graph; of
 * another, a step of one row (the graphs hold the main sequence's state). */
static int cuda_decode(ds4_backend *base, ds4_seq *seq, uint32_t token, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    cu_seq *s = (cu_seq *)seq;
    if (not_stage(b, "decode", err) || not_mtp(b, seq, "decode", err)) return -1;
    if (s != &b->main_seq) {
        ds4_row r = ds4_row_of(seq, token, 0);
        return cu_seq_step(base, &r, 1, NULL, err);
    }
    if (check_room(s, 1, err) || cu_use(b, s, err)) return -1;
    if (token >= b->cfg->n_vocab)
        return ds4_err_set(err, DS4_EINVAL, "token %u is outside the vocabulary (%u)", token, b->cfg->n_vocab);
    s->jr.valid = false; /* a plain step ends what a rewind can take back */
    if (steer_recapture(b, err) || cu_set_step(b, STEP_TOKEN, 0, token, err) || run_step(b, s->n_tokens, err))
        return -1;
    s->tokens[s->n_tokens++] = token;
    s->has_logits = true;
    s->logits_fresh = false;
    b->lg_owner = s;
    return 0;
}

/* n greedy tokens: each step embeds the argmax its predecessor left in
 * d_step and records it; the host waits once, at the end.  Another
 * sequence than the main one: token by token, its argmax on the host. */
static int cuda_greedy(ds4_backend *base, ds4_seq *seq, uint32_t n, uint32_t *out, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    cu_seq *s = (cu_seq *)seq;
    if (not_stage(b, "greedy generation", err) || not_mtp(b, seq, "greedy generation", err)) return -1;
    if (!s->has_logits) return ds4_err_set(err, DS4_EINVAL, "greedy generation needs logits (prefill first)");
    if (check_room(s, n, err)) return -1;
    if (s != &b->main_seq) {
        for (uint32_t i = 0; i < n; i++) {
            const float *l = cu_seq_logits(b, s);
            if (!l) return ds4_err_set(err, DS4_EIO, "CUDA: reading the logits failed");
            out[i] = (uint32_t)ds4_argmax(l, (int)b->cfg->n_vocab);
            if (cuda_decode(base, seq, out[i], err)) return -1;
        }
        return 0;
    }
    if (cu_use(b, s, err) || steer_recapture(b, err)) return -1;
    s->jr.valid = false;
    for (uint32_t done = 0; done < n;) {
        uint32_t m = n - done < b->rec_cap ? n - done : b->rec_cap;
        CU_TRY(cudaMemsetAsync(b->d_nrec, 0, sizeof(uint32_t), b->st));
        for (uint32_t i = 0; i < m; i++)
            if (run_step(b, s->n_tokens + i, err)) return -1;
        CU_TRY(cudaMemcpyAsync(out + done, b->d_argmax, m * sizeof(uint32_t), cudaMemcpyDeviceToHost, b->st));
        CU_TRY(cudaStreamSynchronize(b->st));
        memcpy(s->tokens + s->n_tokens, out + done, m * sizeof(uint32_t));
        s->n_tokens += m;
        done += m;
    }
    s->logits_fresh = false;
    b->lg_owner = s;
    if (ds4_prof_on) {
        char title[64];
        snprintf(title, sizeof(title), "%u decode steps at %u tokens", n, s->n_tokens - n);
        ds4_prof_report(title);
    }
    return 0;
}

static int cuda_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    CU_ON_DEVICE((cuda_backend *)base);
    if (n && not_stage((cuda_backend *)base, "a step", err)) return -1;
    int rc = cu_seq_step(base, rows, n, out, err);
    if (ds4_prof_on && rc == 0) {
        char title[64];
        snprintf(title, sizeof(title), "a step of %u rows", n);
        ds4_prof_report(title);
    }
    return rc;
}

/* A pipeline stage's decode step of the main sequence: its decode graph,
 * as cuda_decode, between the entering residuals put into S (a stage
 * after the first) and the leaving ones read from it (before the head). */
static int stage_decode(cuda_backend *b, const ds4_row *r, const float *in, float *resid, const ds4_step_out *out,
                        ds4_err *err) {
    cu_seq *s = &b->main_seq;
    size_t hcd = (size_t)b->cfg->n_hc * b->cfg->n_embd;
    if (check_room(s, 1, err) || cu_use(b, s, err)) return -1;
    if (r->token >= b->cfg->n_vocab)
        return ds4_err_set(err, DS4_EINVAL, "token %u is outside the vocabulary (%u)", r->token, b->cfg->n_vocab);
    s->jr.valid = false;
    if (in) CU_TRY(cudaMemcpyAsync(b->S, in, hcd * sizeof(float), cudaMemcpyDefault, b->st));
    if (cu_set_step(b, STEP_TOKEN, 0, r->token, err) || run_step(b, s->n_tokens, err)) return -1;
    s->tokens[s->n_tokens++] = r->token;
    if (!cu_head(b)) {
        CU_TRY(cudaMemcpyAsync(resid, b->S, hcd * sizeof(float), cudaMemcpyDefault, b->st));
        CU_TRY(cudaStreamSynchronize(b->st));
        return 0;
    }
    s->has_logits = true;
    s->logits_fresh = false;
    b->lg_owner = s;
    if (!(r->want & DS4_ROW_LOGITS) || !out || !out->logits) {
        if (in) CU_TRY(cudaStreamSynchronize(b->st)); /* in read: the caller may reuse it (device memory) */
        return 0;
    }
    const float *l = cu_seq_logits(b, s);
    if (!l) return ds4_err_set(err, DS4_EIO, "CUDA: reading the logits failed");
    memcpy(out->logits, l, b->cfg->n_vocab * sizeof(float));
    return 0;
}

/* A step of a pipeline stage (backend.h): the main sequence's one plain
 * row through the stage's decode graphs (captured as the whole model's
 * are: the steps of a single stream keep their speed), any other step one
 * eager pass (cu_seq_stage_pass).  A whole model's is an ordinary step. */
static int cuda_stage_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const float *in, float *resid,
                           const ds4_step_out *out, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    if (!cu_stage(b)) return cu_seq_step(base, rows, n, out, err);
    if (n == 0) return 0;
    if (b->layer_first > 0 && !in)
        return ds4_err_set(err, DS4_EINVAL, "a pipeline stage from layer %u needs its rows' residuals", b->layer_first);
    if (!cu_head(b) && !resid)
        return ds4_err_set(err, DS4_EINVAL, "a pipeline stage to layer %u needs room for its rows' residuals",
                           b->layer_end - 1);
    if (n == 1 && rows[0].seq == &b->main_seq.base && !(rows[0].want & (DS4_ROW_REWIND | DS4_ROW_HIDDEN)))
        return stage_decode(b, &rows[0], in, resid, out, err);
    return cu_seq_stage_pass(base, rows, n, in, resid, out, err);
}

static const float *cuda_logits(ds4_backend *base, ds4_seq *seq) {
    cuda_backend *b = (cuda_backend *)base;
    cu_on_device(b);
    if (cu_mtp_seq(b, seq)) return cu_mtp_logits(b);
    return cu_seq_logits(b, (cu_seq *)seq);
}

/* ---------------------------------------------------- snapshot/restore */

static int check_state(const cuda_backend *b, const cu_seq *q, const ds4_kv_state *s, uint32_t n, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (s->cfg->n_layer != c->n_layer || s->cfg->head_dim != c->head_dim || s->cfg->n_vocab != c->n_vocab ||
        s->cfg->idx_head_dim != c->idx_head_dim)
        return ds4_err_set(err, DS4_EINVAL, "KV state of a different model");
    if (n > s->ctx || n > q->ctx)
        return ds4_err_set(err, DS4_EINVAL, "KV state: %u tokens do not fit contexts of %u / %u", n, s->ctx, q->ctx);
    if (s->raw_cap != b->raw_cap)
        return ds4_err_set(err, DS4_EINVAL, "KV state: raw rings of %u and %u rows", s->raw_cap, b->raw_cap);
    if (s->layer_first > b->layer_first || s->layer_end < b->layer_end)
        return ds4_err_set(err, DS4_EINVAL, "KV state of layers %u..%u for a backend of layers %u..%u", s->layer_first,
                           s->layer_end - 1, b->layer_first, b->layer_end - 1);
    return 0;
}

/* Copy every live array of the backend's layers between the device state
 * and `s`. */
static int copy_state(cuda_backend *b, ds4_kv_state *s, uint32_t n, bool to_host, ds4_err *err) {
    const ds4_config *c = b->cfg;
/* clang-format off */
#define COPY(dev, host, count)                                                                              \
    CU_TRY(to_host ? cudaMemcpy((host), (dev), (size_t)(count) * sizeof(float), cudaMemcpyDeviceToHost)   \
                   : cu_upload((dev), (host), (size_t)(count) * sizeof(float)))
    /* clang-format on */
    for (uint32_t il = b->layer_first; il < b->layer_end; il++) {
        const dlstate *D = &b->sq->L[il];
        ds4_layer_state *H = &s->layers[il];
        COPY(D->raw, H->raw, (size_t)b->raw_cap * c->head_dim);
        if (D->ratio == 0) continue;
        COPY(D->comp, H->comp, (size_t)(n / D->ratio) * c->head_dim);
        COPY(D->comp_kv, H->comp_kv, frontier_floats(c, D->ratio, false));
        COPY(D->comp_score, H->comp_score, frontier_floats(c, D->ratio, false));
        if (D->ratio != 4) continue;
        COPY(D->idx, H->idx, (size_t)(n / 4) * c->idx_head_dim);
        COPY(D->idx_kv, H->idx_kv, frontier_floats(c, 4, true));
        COPY(D->idx_score, H->idx_score, frontier_floats(c, 4, true));
    }
#undef COPY
    return 0;
}

static int cuda_snapshot(ds4_backend *base, ds4_seq *seq, ds4_kv_state *out, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    cu_seq *q = (cu_seq *)seq;
    if (not_mtp(b, seq, "snapshot", err) || check_state(b, q, out, q->n_tokens, err) || cu_use(b, q, err)) return -1;
    if (cu_comp_flush(b, err)) return ds4_err_prefix(err, "folding the decode steps' compressor windows");
    CU_TRY(cudaStreamSynchronize(b->st));
    if (b->sq->has_logits && !cuda_logits(base, seq))
        return ds4_err_set(err, DS4_EIO, "CUDA: reading the logits failed");
    if (copy_state(b, out, b->sq->n_tokens, true, err)) return -1;
    out->n_tokens = b->sq->n_tokens;
    out->has_logits = b->sq->has_logits;
    memcpy(out->tokens, b->sq->tokens, (size_t)b->sq->n_tokens * sizeof(uint32_t));
    if (b->sq->has_logits) memcpy(out->logits, b->sq->logits_h, b->cfg->n_vocab * sizeof(float));
    return 0;
}

static int cuda_restore(ds4_backend *base, ds4_seq *seq, const ds4_kv_state *in, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    cu_seq *q = (cu_seq *)seq;
    uint32_t n = in->n_tokens;
    if (not_mtp(b, seq, "restore", err) || check_state(b, q, in, n, err) || cu_use(b, q, err)) return -1;
    CU_TRY(cudaStreamSynchronize(b->st));
    if (copy_state(b, (ds4_kv_state *)in, n, false, err)) return -1;
    memcpy(b->sq->tokens, in->tokens, (size_t)n * sizeof(uint32_t));
    b->sq->n_tokens = n;
    b->sq->jr.valid = false;
    b->sq->fold = n;
    b->sq->has_logits = in->has_logits && cu_head(b); /* a stage before the head has none */
    if (cu_set_step(b, STEP_POS | STEP_TOKEN | STEP_FOLD, n, 0, err)) return -1;
    if (b->sq->has_logits) {
        CU_TRY(cu_upload(b->d_logits, in->logits, b->cfg->n_vocab * sizeof(float)));
        memcpy(b->sq->logits_h, in->logits, b->cfg->n_vocab * sizeof(float));
        b->d_last_logits = b->d_logits;
        b->sq->logits_fresh = true;
        if (cu_step_end(b, 0, false, err)) return -1; /* the next greedy token */
    }
    CU_TRY(cudaStreamSynchronize(b->st));
    return 0;
}

/* ------------------------------------------------------------ create */

/* A sequence's memory (its state block, journal and host mirror). */
static void seq_release(cu_seq *s) {
    cu_journal_free(&s->jr);
    if (s->state_block) cudaFree(s->state_block);
    free(s->L);
    free(s->tokens);
    free(s->logits_h);
    s->state_block = NULL;
    s->L = NULL;
    s->tokens = NULL;
    s->logits_h = NULL;
}

/* Bytes of device memory a sequence of ctx tokens takes (its state block;
 * a mark adds its journal). */
static size_t seq_bytes(const cuda_backend *b, uint32_t ctx, bool defer) {
    cu_seq probe = {};
    dlstate L[DS4_MAX_LAYERS];
    probe.ctx = ctx;
    probe.L = L;
    bump m = {NULL, 0};
    layout_state(b, &probe, defer, &m);
    return m.off;
}

/* s's memory for ctx tokens, empty; defer: the main sequence's windows. */
static int seq_alloc(cuda_backend *b, cu_seq *s, uint32_t ctx, bool defer, ds4_err *err) {
    const ds4_config *c = b->cfg;
    s->base.owner = &b->base;
    s->ctx = ctx;
    s->L = (dlstate *)calloc(c->n_layer + 1, sizeof(dlstate)); /* the main one's: and the MTP block's layer */
    s->tokens = (uint32_t *)calloc(ctx, sizeof(uint32_t));
    s->logits_h = (float *)calloc(c->n_vocab, sizeof(float));
    if (!s->L || !s->tokens || !s->logits_h) return ds4_err_set(err, DS4_ENOMEM, "out of memory for a sequence");
    char what[96];
    snprintf(what, sizeof(what), "the state of a sequence of %u tokens", ctx);
    bump m = {NULL, seq_bytes(b, ctx, defer)};
    if (cu_dev_alloc(&s->state_block, m.off, what, err)) return -1;
    s->bytes = m.off;
    b->dev_bytes += (s->bytes + 255) / 256 * 256;
    m.base = (uint8_t *)s->state_block;
    m.off = 0;
    layout_state(b, s, defer, &m);
    for (uint32_t il = 0; il < c->n_layer; il++)
        if (s->L[il].win)
            CU_TRY(cudaMemsetAsync(s->L[il].win, 0, (size_t)s->L[il].ratio * c->n_embd * sizeof(float), b->st));
    return reset_state(b, s, err);
}

static void cuda_free(ds4_backend *base) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b) return;
    cu_on_device(b);
    drop_graphs(b);
    cu_step_graphs_drop(b, NULL);
    cu_offload_free(b->off);
    cu_mtp_free(b);
    cu_tp_free(&b->tp);
    seq_release(&b->main_seq);
    if (b->buf_block) cudaFree(b->buf_block);
    cu_weights_free(&b->W);
    for (uint32_t i = 0; i < CU_LANES; i++) {
        if (b->lane_ev[i]) cudaEventDestroy(b->lane_ev[i]);
        if (b->lane[i]) cudaStreamDestroy(b->lane[i]);
    }
    if (b->ev_join) cudaEventDestroy(b->ev_join);
    if (b->ev_fork) cudaEventDestroy(b->ev_fork);
    if (b->side) cudaStreamDestroy(b->side);
    if (b->st) cudaStreamDestroy(b->st);
    free(b->obs_h);
    free(b);
}

/* ---------------------------------------------------------- sequences */

/* A sequence beside the main one: its own state in device memory, which
 * steps (cu_seq_step) advance alone or with others. */
static ds4_seq *cuda_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    if (cu_device_error(b, err)) return NULL;
    if (ctx == 0 || ctx > b->ctx) {
        ds4_err_set(err, DS4_EINVAL, "a sequence of %u tokens: the backend's sequences hold 1 to %u", ctx, b->ctx);
        return NULL;
    }
    cu_seq *s = (cu_seq *)calloc(1, sizeof(*s));
    if (!s) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for a sequence");
        return NULL;
    }
    if (seq_alloc(b, s, ctx, false, err)) {
        seq_release(s);
        free(s);
        return NULL;
    }
    return &s->base;
}

static void cuda_seq_free(ds4_backend *base, ds4_seq *seq) {
    cuda_backend *b = (cuda_backend *)base;
    cu_on_device(b);
    if (cu_mtp_seq(b, seq)) return cu_mtp_seq_free(b);
    cu_seq *s = (cu_seq *)seq;
    if (s == &b->main_seq) return; /* the backend's own */
    if (cudaStreamSynchronize(b->st) != cudaSuccess) (void)cudaGetLastError();
    if (b->lg_owner == s) b->lg_owner = NULL;
    if (b->sq == s) b->sq = &b->main_seq;
    cu_step_graphs_drop(b, s);
    b->dev_bytes -= (s->bytes + 255) / 256 * 256;
    seq_release(s);
    free(s);
}

/* The live arrays of s into `to`, the same layers laid out for another
 * context (on st): each ring whole (its size is the backend's), the
 * compressed and indexer rows both contexts hold (every live one: the
 * smaller holds the tokens), the frontiers, the deferred windows. */
static int copy_live(cuda_backend *b, const cu_seq *s, const cu_seq *to, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t lo = s->ctx < to->ctx ? s->ctx : to->ctx;
/* clang-format off */
#define DCOPY(dst, src, count)                                                                              \
    CU_TRY(cudaMemcpyAsync((dst), (src), (size_t)(count) * sizeof(float), cudaMemcpyDeviceToDevice, b->st))
    /* clang-format on */
    for (uint32_t il = b->layer_first; il < b->layer_end; il++) {
        const dlstate *F = &s->L[il], *T = &to->L[il];
        DCOPY(T->raw, F->raw, (size_t)b->raw_cap * c->head_dim);
        if (F->ratio == 0) continue;
        if (F->win) DCOPY(T->win, F->win, (size_t)F->ratio * c->n_embd);
        DCOPY(T->comp, F->comp, (size_t)cu_comp_cap(lo, F->ratio) * c->head_dim);
        DCOPY(T->comp_kv, F->comp_kv, frontier_floats(c, F->ratio, false));
        DCOPY(T->comp_score, F->comp_score, frontier_floats(c, F->ratio, false));
        if (F->ratio != 4) continue;
        DCOPY(T->idx, F->idx, (size_t)cu_comp_cap(lo, 4) * c->idx_head_dim);
        DCOPY(T->idx_kv, F->idx_kv, frontier_floats(c, 4, true));
        DCOPY(T->idx_score, F->idx_score, frontier_floats(c, 4, true));
    }
#undef DCOPY
    CU_TRY(cudaMemcpyAsync(to->d_step, s->d_step, sizeof(dstep), cudaMemcpyDeviceToDevice, b->st));
    return 0;
}

/* A state block for ctx tokens laid out in `to` (main: with the deferred
 * windows) holding s's state; on failure nothing is left allocated. */
static int resized_copy(cuda_backend *b, const cu_seq *s, uint32_t ctx, bool main, cu_seq *to, ds4_err *err) {
    const ds4_config *c = b->cfg;
    to->ctx = ctx;
    to->L = (dlstate *)calloc(c->n_layer + 1, sizeof(dlstate));
    to->tokens = (uint32_t *)calloc(ctx, sizeof(uint32_t));
    char what[96];
    snprintf(what, sizeof(what), "the state of a sequence resized to %u tokens", ctx);
    bump m = {NULL, seq_bytes(b, ctx, main)};
    int rc = -1;
    if (!to->L || !to->tokens) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for a sequence");
    } else if (cu_dev_alloc(&to->state_block, m.off, what, err) == 0) {
        to->bytes = m.off;
        m.base = (uint8_t *)to->state_block;
        m.off = 0;
        layout_state(b, to, main, &m);
        to->L[c->n_layer] = s->L[c->n_layer]; /* the MTP block's layer (the main sequence's: cu_mtp_init) */
        memcpy(to->tokens, s->tokens, (size_t)s->n_tokens * sizeof(uint32_t));
        rc = copy_live(b, s, to, err);
        if (rc == 0 && cudaStreamSynchronize(b->st) != cudaSuccess)
            rc = ds4_err_set(err, DS4_EIO, "CUDA: copying a resized sequence's state failed");
    }
    if (rc == 0) return 0;
    if (to->state_block) cudaFree(to->state_block);
    free(to->L);
    free(to->tokens);
    return -1;
}

/* A sequence resized (backend.h ds4_seq_resize): a state block for ctx
 * tokens with the old one's content, then the old one freed.  What held
 * the old addresses follows: the journal's list of rings (its mark is
 * kept: it holds copies, and the rings keep their size, the backend's),
 * the batched decode graph of the sequence (dropped), and for the main
 * sequence its decode graphs, captured again (capture_step: the same
 * contexts as before, so that its tokens do not change).  The backend's
 * one MTP sequence holds the whole context already. */
static int cuda_seq_resize(ds4_backend *base, ds4_seq *seq, uint32_t ctx, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    if (!seq || seq->owner != base) return ds4_err_set(err, DS4_EINVAL, "resize: the sequence is not this backend's");
    bool mtp = cu_mtp_seq(b, seq);
    cu_seq *s = (cu_seq *)seq;
    uint32_t n = mtp ? cu_mtp_len(b) : s->n_tokens;
    if (ctx == 0 || ctx > b->ctx || ctx < n)
        return ds4_err_set(err, DS4_ERANGE, "resize to %u tokens: the sequence holds %u, the backend at most %u", ctx,
                           n, b->ctx);
    if (mtp || ctx == s->ctx) return 0;
    bool main = s == &b->main_seq;
    cu_seq to = {};
    CU_TRY(cudaStreamSynchronize(b->st));
    if (resized_copy(b, s, ctx, main, &to, err)) return -1;
    cu_step_graphs_drop(b, s);
    cudaFree(s->state_block);
    free(s->L);
    free(s->tokens);
    b->dev_bytes = b->dev_bytes - (s->bytes + 255) / 256 * 256 + (to.bytes + 255) / 256 * 256;
    s->ctx = ctx;
    s->L = to.L;
    s->tokens = to.tokens;
    s->state_block = to.state_block;
    s->bytes = to.bytes;
    s->d_step = to.d_step;
    if (s->jr.raw && cu_journal_bind(b, s, err)) return ds4_err_prefix(err, "a resized sequence's journal");
    if (!main) return 0;
    drop_graphs(b);
    if (cu_use(b, s, err) || capture_step(b, err))
        return ds4_err_prefix(err, "the main sequence resized to %u tokens", ctx);
    return 0;
}

static uint32_t cuda_seq_len(const ds4_backend *base, const ds4_seq *s) {
    const cuda_backend *b = (const cuda_backend *)base;
    return cu_mtp_seq(b, s) ? cu_mtp_len(b) : ((const cu_seq *)s)->n_tokens;
}

/* Marks and rewinds of the main sequence (cuda_seq.cu) or the MTP one. */
static int cuda_mark(ds4_backend *base, ds4_seq *s, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    return cu_mtp_seq(b, s) ? cu_mtp_mark(b, err) : cu_seq_mark(base, s, err);
}

static int cuda_rewind(ds4_backend *base, ds4_seq *s, uint32_t n_tokens, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    return cu_mtp_seq(b, s) ? cu_mtp_rewind(b, n_tokens, err) : cu_seq_rewind(base, s, n_tokens, err);
}

/* Device memory the runtime keeps beyond the backend's blocks (graphs,
 * the rewind journal): the budget leaves it free. */
static const uint64_t DEV_RESERVE = (uint64_t)1 << 30;

/* The device's free memory less the runtime's reserve; within the caller's
 * budget (--gpu-mem) less what the backend holds already. */
static int device_room(const cuda_backend *b, uint64_t *room, ds4_err *err) {
    size_t free_b = 0, total_b = 0;
    CU_TRY(cudaMemGetInfo(&free_b, &total_b));
    *room = free_b > DEV_RESERVE ? free_b - DEV_RESERVE : 0;
    uint64_t cap = b->base.opts.gpu_mem;
    if (cap) {
        uint64_t left = cap > b->dev_bytes ? cap - b->dev_bytes : 0;
        if (left < *room) *room = left;
    }
    return 0;
}

/* A sequence's device state (the MTP block's sequence is the backend's
 * one, made with it), its host mirror, and the device's room for more
 * plus one: the main sequence, made with the backend, is the first
 * session's. */
static void cuda_seq_memory(const ds4_backend *base, uint32_t ctx, ds4_seq_memory *m) {
    const cuda_backend *b = (const cuda_backend *)base;
    cu_on_device(b);
    const ds4_config *c = b->cfg;
    m->bytes = (seq_bytes(b, ctx, false) + 255) / 256 * 256;
    m->host_bytes = (uint64_t)ctx * sizeof(uint32_t) + (uint64_t)c->n_vocab * sizeof(float) +
                    (uint64_t)(c->n_layer + 1) * sizeof(dlstate);
    uint64_t room = 0;
    ds4_err err = {};
    if (device_room(b, &room, &err) == 0) m->room = room + m->bytes;
    m->host_weights = b->off ? b->off->place.host_bytes : 0;
    m->in_host = false;
}

static ds4_seq *cuda_mtp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    if (cu_device_error((cuda_backend *)base, err)) return NULL;
    return cu_mtp_seq_new(base, ctx, err);
}

static int cuda_mtp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    CU_ON_DEVICE((cuda_backend *)base);
    return cu_mtp_step(base, rows, n, out, err);
}

static ds4_backend_ops make_ops() {
    ds4_backend_ops o = {};
    o.name = "cuda";
    o.free = cuda_free;
    o.seq_new = cuda_seq_new;
    o.mtp_seq_new = cuda_mtp_seq_new;
    o.mtp_step = cuda_mtp_step;
    o.seq_free = cuda_seq_free;
    o.seq_resize = cuda_seq_resize;
    o.seq_len = cuda_seq_len;
    o.step = cuda_step;
    o.stage_step = cuda_stage_step;
    o.mark = cuda_mark;
    o.rewind = cuda_rewind;
    o.prefill = cuda_prefill;
    o.decode = cuda_decode;
    o.logits = cuda_logits;
    o.reset = cuda_reset;
    o.snapshot = cuda_snapshot;
    o.restore = cuda_restore;
    o.greedy = cuda_greedy;
    o.seq_memory = cuda_seq_memory;
    return o;
}
static const ds4_backend_ops cuda_ops = make_ops();

/* Shapes the kernels are written for (the published model and the test
 * presets all satisfy them). */
static int check_config(const ds4_config *c, ds4_err *err) {
    if (c->n_hc != 4)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: hyper_connection.count %u (needs 4)", c->n_hc);
    if (c->head_dim % 64 || c->head_dim > 512)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: head dim %u (needs a multiple of 64, <= 512)",
                           c->head_dim);
    if (c->idx_head_dim != 128 || c->idx_n_head > 64)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: indexer heads %u x %u (needs <= 64 x 128)",
                           c->idx_n_head, c->idx_head_dim);
    if (c->n_expert_used > 8 || c->n_expert > 1024)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: %u of %u experts (needs <= 8 of <= 1024)",
                           c->n_expert_used, c->n_expert);
    if (c->rope_dim / 2 > DS4_ROPE_MAX_PAIRS || c->rope_dim % 2 || c->rope_dim > c->head_dim ||
        c->rope_dim > c->idx_head_dim)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: rope dims %u", c->rope_dim);
    if ((c->head_dim - c->rope_dim) % 64)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: %u non-RoPE dims (needs FP8 blocks of 64)",
                           c->head_dim - c->rope_dim);
    if (c->q_lora_rank > NORM_PER * QKV_POST_THREADS)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: q_lora_rank %u (needs <= %u)", c->q_lora_rank,
                           NORM_PER * QKV_POST_THREADS);
    return 0;
}

/* GPU gpu's free memory less a reserve for the runtime (graphs, the
 * rewind journal); the caller's current device stays its own. */
extern "C" int ds4_cuda_mem_available(int gpu, uint64_t *bytes, ds4_err *err) {
    int prev = 0, n = 0;
    size_t free_b = 0, total_b = 0;
    CU_TRY(cudaGetDevice(&prev));
    CU_TRY(cudaGetDeviceCount(&n));
    if (gpu < 0 || gpu >= n)
        return ds4_err_set(err, DS4_EINVAL, "CUDA: GPU %d: the process sees %d (0..%d)", gpu, n, n - 1);
    CU_TRY(cudaSetDevice(gpu));
    cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
    CU_TRY(cudaSetDevice(prev));
    CU_TRY(e);
    *bytes = free_b > DEV_RESERVE ? free_b - DEV_RESERVE : 0;
    return 0;
}

/* The backend's GPU: one the process sees, made current for the setup. */
static int use_gpu(cuda_backend *b, ds4_err *err) {
    int n = 0;
    CU_TRY(cudaGetDeviceCount(&n));
    if (b->dev < 0 || b->dev >= n || b->dev >= CU_MAX_DEVICES)
        return ds4_err_set(err, DS4_EINVAL, "GPU %d: the process sees %d GPU%s (0..%d)", b->dev, n, n == 1 ? "" : "s",
                           n - 1);
    CU_ON_DEVICE(b);
    return 0;
}

/* The GPU budget: the caller's, or what the device has free. */
static int gpu_budget(const cuda_backend *b, uint64_t *budget, ds4_err *err) {
    if (b->base.opts.gpu_mem) {
        *budget = b->base.opts.gpu_mem;
        return 0;
    }
    return device_room(b, budget, err);
}

/* Weights, state and buffers in GPU memory: every tensor but the routed
 * experts, then as many of those as the budget holds (cuda_offload.h); a
 * pipeline stage's tensors all on the GPU, and a tensor-parallel rank's
 * share (cuda_tp.cu). */
static int place_and_load(cuda_backend *b, const ds4_weights *w, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (cu_tp_init(b, w, err) ||
        cu_weights_shape(&b->W, w, &b->tp, b->tp.n_own, b->layer_first, b->layer_end, err))
        return -1;
    size_t state = (seq_bytes(b, b->base.opts.main_ctx, true) + 255) / 256 * 256; /* the main sequence's */
    bump m = {NULL, 0};
    layout_buffers(b, &m);
    size_t bufs = (m.off + 255) / 256 * 256, routed = 0, all = cu_weights_bytes(&b->W, c, &routed);
    uint64_t budget;
    if (gpu_budget(b, &budget, err)) return -1;
    b->dev_fixed = all - routed + state + bufs + cu_offload_dev_bytes(b);
    if ((uint64_t)all + state + bufs > budget && cu_stage(b))
        return ds4_err_set(err, DS4_ENOMEM,
                           "the pipeline stage of layers %u..%u needs %.2f GiB on the GPU, the budget is %.2f GiB: a "
                           "CUDA stage keeps no routed experts in host RAM (no offload): give it fewer layers "
                           "(--layers) or more GPU memory (--gpu-mem)",
                           b->layer_first, b->layer_end - 1, (double)(all + state + bufs) / (1u << 30),
                           (double)budget / (1u << 30));
    if ((uint64_t)all + state + bufs > budget && b->tp.n > 1)
        return ds4_err_set(err, DS4_ENOMEM,
                           "GPU %d's share of the model under tensor parallelism needs %.2f GiB, the budget is %.2f "
                           "GiB: tensor parallelism keeps no routed experts in host RAM (no offload): use more GPUs "
                           "(--tensor-parallel) or more GPU memory (--gpu-mem)",
                           b->dev, (double)(all + state + bufs) / (1u << 30), (double)budget / (1u << 30));
    /* Room for the sequences to come (opts.extra_seqs) where the budget
     * has it with every routed expert in host RAM; where not, none: the
     * caller refuses those sequences (cuda_seq_memory reports the room). */
    uint64_t more = (uint64_t)b->base.opts.extra_seqs * ((seq_bytes(b, b->ctx, false) + 255) / 256 * 256);
    if (b->dev_fixed + more > budget) more = 0;
    state += more;
    b->dev_fixed += more;
    if ((uint64_t)all + state + bufs > budget && cu_offload_plan(b, w, b->dev_fixed, budget, &b->off, err)) return -1;
    if (b->off && cu_weights_shape(&b->W, w, NULL, b->off->place.n_gpu, 0, c->n_layer, err)) return -1;
    if (w->synthetic) {
        if (cu_weights_synth(&b->W, w, w->synthetic_seed, b->st, err)) return -1;
    } else if (cu_weights_load(&b->W, w, &b->tp, b->off ? b->off->slot : b->tp.slot, b->st, err)) {
        return -1;
    }
    b->dev_bytes = b->W.bytes;
    if (b->tp.d_slot) b->dev_bytes += ((size_t)c->n_layer * c->n_expert * sizeof(int32_t) + 255) / 256 * 256;
    return b->off ? cu_offload_init(b, b->off, w, err) : 0;
}

static int init(cuda_backend *b, const ds4_weights *w, ds4_err *err) {
    const ds4_config *c = b->cfg;
    CU_TRY(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking));
    CU_TRY(cudaStreamCreateWithFlags(&b->side, cudaStreamNonBlocking));
    CU_TRY(cudaEventCreateWithFlags(&b->ev_fork, cudaEventDisableTiming));
    CU_TRY(cudaEventCreateWithFlags(&b->ev_join, cudaEventDisableTiming));
    for (uint32_t i = 0; i < CU_LANES; i++) {
        CU_TRY(cudaStreamCreateWithFlags(&b->lane[i], cudaStreamNonBlocking));
        CU_TRY(cudaEventCreateWithFlags(&b->lane_ev[i], cudaEventDisableTiming));
    }
    if (cu_matmul_init(err)) return -1;
    if (place_and_load(b, w, err)) return -1;
    if (b->base.opts.act_observer && !(b->obs_h = (float *)malloc((size_t)b->chunk * c->n_embd * sizeof(float))))
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    bump m = {NULL, 0};
    layout_buffers(b, &m);
    char what[96];
    size_t need = m.off;
    snprintf(what, sizeof(what), "pass buffers (chunk %u, context %u)", b->chunk, b->ctx);
    if (cu_dev_alloc(&b->buf_block, need, what, err)) return -1;
    if (b->off) /* cu_offload_measure reads the activations before any pass wrote them */
        CU_TRY(cudaMemsetAsync(b->buf_block, 0, need, b->st));
    b->dev_bytes += (need + 255) / 256 * 256;
    m.base = (uint8_t *)b->buf_block;
    m.off = 0;
    layout_buffers(b, &m);
    CU_TRY(cudaMemsetAsync(b->hc_count, 0, b->chunk * sizeof(uint32_t), b->st));
    CU_TRY(cudaMemsetAsync(b->route_count, 0, sizeof(uint32_t), b->st));
    if (b->expert_count)
        CU_TRY(cudaMemsetAsync(b->expert_count, 0, (size_t)c->n_layer * c->n_expert * sizeof(uint32_t), b->st));
    if (b->imx_in) {
        size_t mid_n, routes_n, in_n = cu_imatrix_floats(c, &mid_n, &routes_n);
        CU_TRY(cudaMemsetAsync(b->imx_in, 0, in_n * sizeof(double), b->st));
        CU_TRY(cudaMemsetAsync(b->imx_mid, 0, mid_n * sizeof(double), b->st));
        CU_TRY(cudaMemsetAsync(b->imx_routes, 0, routes_n * sizeof(uint64_t), b->st));
    }
    CU_TRY(cudaMemsetAsync(b->attn_count, 0, CU_FEW_T * cu_attn_groups(b->cfg) * sizeof(uint32_t), b->st));
    for (uint32_t i = 0; i < CU_LANES; i++)
        CU_TRY(cudaMemsetAsync(b->lane_attn_count[i], 0, cu_attn_groups(b->cfg) * sizeof(uint32_t), b->st));
    if (b->d_steer)
        CU_TRY(cu_upload(b->d_steer, b->base.opts.steer->dir, (size_t)c->n_layer * c->n_embd * sizeof(float)));
    if (cu_offload_measure(b, err)) return -1; /* before a graph captures the tiers' sizes */
    if (seq_alloc(b, &b->main_seq, b->base.opts.main_ctx, true, err)) return -1;
    if (b->base.opts.mtp && cu_mtp_init(b, err)) return -1;
    b->n_kinds = 1;
    for (uint32_t il = 0; il < c->n_layer; il++)
        if (b->main_seq.L[il].win) b->n_kinds = CU_STEP_KINDS;
    return capture_step(b, err);
}

#ifdef DS4_CUDA_DEV
/* A developer build's environment (`make cuda-dev`; docs/PERFORMANCE.md,
 * "How it was measured"): DS4_CUDA_GRAPH_CTX, the smallest decode graph's
 * context; DS4_CUDA_ABLATE, launches left out of the decode graph (its
 * tokens are then wrong); DS4_CUDA_PROFILE, eager launches timed one by
 * one (2: also by grid).  A release build reads none of them. */
static int dev_settings(cuda_backend *b, ds4_err *err) {
    const char *gctx = getenv("DS4_CUDA_GRAPH_CTX");
    if (gctx && ds4_parse_u32(gctx, 1, UINT32_MAX / 4, &b->graph_ctx0))
        return ds4_err_set(err, DS4_EINVAL,
                           "CUDA backend: DS4_CUDA_GRAPH_CTX=%s is not a context size (tokens, 1 or more)", gctx);
#ifndef DS4_CUDA_EMU
    ds4_ablate = getenv("DS4_CUDA_ABLATE");
    if (ds4_ablate && *ds4_ablate)
        fprintf(stderr,
                "ds4: DS4_CUDA_ABLATE=%s leaves launches out of the decode graph: its tokens are wrong "
                "(for timing only)\n",
                ds4_ablate);
    const char *prof = getenv("DS4_CUDA_PROFILE");
    ds4_prof_on = prof && atoi(prof) > 0;
    ds4_prof_grids = prof && atoi(prof) == 2;
#endif
    return 0;
}
#endif

/* A pipeline stage's layers (ds4_backend_opts.layer_first/layer_end), and
 * what a stage does not run: the MTP block, which needs the final
 * residuals, and what reads or adds to every layer (steering, the
 * activation observer, the imatrix and the expert counts). */
static int check_stage(const ds4_config *c, const ds4_backend_opts *o, ds4_err *err) {
    uint32_t first = o->layer_first, end = o->layer_end ? o->layer_end : c->n_layer;
    if (first >= end || end > c->n_layer)
        return ds4_err_set(err, DS4_EINVAL, "layers %u..%u are not a range of the model's %u", first, end - 1,
                           c->n_layer);
    if (first == 0 && end == c->n_layer) return 0;
    const char *no = o->mtp                             ? "the MTP block (speculative decoding needs one process)"
                     : o->imatrix                       ? "an importance-matrix collection"
                     : o->steer || o->act_observer      ? "directional steering or an activation observer"
                     : o->count_experts                 ? "expert selection counts (an expert profile)"
                     : o->host_experts != DS4_HOST_AUTO ? "routed experts in host RAM"
                                                        : NULL;
    if (no)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "a CUDA pipeline stage (layers %u..%u) does not run %s", first,
                           end - 1, no);
    return 0;
}

extern "C" ds4_backend *ds4_cuda_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    if (check_config(c, err) || (opts && check_stage(c, opts, err))) return NULL;
    cuda_backend *b = (cuda_backend *)calloc(1, sizeof(*b));
    if (!b) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    ds4_backend_opts o = opts ? *opts : ds4_backend_opts{};
    if (o.prefill_chunk == 0) o.prefill_chunk = 2048;
    /* an imatrix needs every routed row on the GPU: host experts are streamed */
    if (o.imatrix) o.host_experts = DS4_HOST_STREAM;
    b->base.ops = &cuda_ops;
    b->base.w = w;
    b->dev = o.gpu;
    b->main_seq.base.owner = &b->base;
    b->base.main = &b->main_seq.base;
    b->sq = &b->main_seq;
    b->base.opts = ds4_backend_opts_resolve(&o);
    b->cfg = c;
    b->sim = !b->base.opts.no_sim;
    b->chunk = b->base.opts.prefill_chunk;
    b->ctx = b->base.opts.ctx_size;
    b->layer_first = b->base.opts.layer_first;
    b->layer_end = b->base.opts.layer_end ? b->base.opts.layer_end : c->n_layer;
    b->raw_cap = c->sliding_window < b->ctx ? c->sliding_window : b->ctx;
    b->comp_cap4 = cu_comp_cap(b->ctx, 4);
    b->comp_cap128 = cu_comp_cap(b->ctx, 128);
    b->dec_ctx = b->ctx;
    b->graph_ctx0 = b->base.opts.cuda_graph_ctx ? b->base.opts.cuda_graph_ctx : CU_GRAPH_CTX0;
#ifdef DS4_CUDA_DEV
    if (dev_settings(b, err)) {
        cuda_free(&b->base);
        return NULL;
    }
#endif
    uint32_t hc_cols = cu_hc_cols();
    b->hc_split = (c->n_embd + hc_cols - 1) / hc_cols;
    b->logits_rows = LOGITS_ROWS;
    b->rec_cap = REC_CAP;
    uint32_t max_rows = c->sliding_window + (c->idx_top_k < b->comp_cap4 ? c->idx_top_k : b->comp_cap4);
    if (c->sliding_window + b->comp_cap128 > max_rows) max_rows = c->sliding_window + b->comp_cap128;
    b->attn_split = cu_attn_splits(c, max_rows);
    b->attn_queries = CU_FEW_T;
    ds4_rope_init(&b->rope_dense, c, false);
    ds4_rope_init(&b->rope_comp, c, true);
    if (use_gpu(b, err) || init(b, w, err)) {
        ds4_err_prefix(err, "CUDA backend");
        cuda_free(&b->base);
        return NULL;
    }
    return &b->base;
}

extern "C" int ds4_cuda_copy_bandwidth(double *bytes_per_s, char *name, size_t name_len, ds4_err *err) {
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, 0));
    if (name && name_len) snprintf(name, name_len, "%s", prop.name);
    /* 4 GiB each way: far beyond the L2 (50 MB on an H200), so the copy
     * runs at the DRAM's rate */
    size_t bytes = (size_t)4 << 30;
#ifdef DS4_CUDA_EMU
    bytes = (size_t)64 << 20;
#endif
    void *a = NULL, *b = NULL;
    cudaEvent_t e0, e1;
    CU_TRY(cudaMalloc(&a, bytes));
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return ds4_err_set(err, DS4_ENOMEM, "CUDA: no room for the bandwidth probe");
    }
    CU_TRY(cudaMemset(a, 1, bytes));
    CU_TRY(cudaEventCreate(&e0));
    CU_TRY(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < 6; i++) {
        CU_TRY(cudaEventRecord(e0, 0));
        CU_TRY(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0));
        CU_TRY(cudaEventRecord(e1, 0));
        CU_TRY(cudaEventSynchronize(e1));
        float ms;
        CU_TRY(cudaEventElapsedTime(&ms, e0, e1));
        if (i > 0 && ms < best) best = ms; /* the first is a warm-up */
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    *bytes_per_s = 2.0 * (double)bytes / (best * 1e-3);
    return 0;
}

extern "C" int ds4_cuda_offload_info(const ds4_backend *base, ds4_offload_info *out) {
    const cuda_backend *b = (const cuda_backend *)base;
    memset(out, 0, sizeof(*out));
    if (!base || strcmp(base->ops->name, "cuda") != 0) return -1;
    out->dev_allocated = b->dev_bytes;
    out->dev_fixed = b->dev_fixed;
    out->total_experts = b->cfg->n_layer * b->cfg->n_expert;
    if (!b->off) {
        out->dev_total = b->dev_bytes;
        return 0;
    }
    const ds4_placement *p = &b->off->place;
    out->on = true;
    out->host_experts = p->host_experts;
    out->dev_total = p->dev_total;
    out->host_bytes = p->host_bytes;
    out->mapped_experts = b->off->map_experts;
    out->mapped_bytes = b->off->map_bytes;
    out->tok_dev = p->tok_dev;
    out->tok_host = p->tok_host;
    out->host_jobs = b->off->host_jobs;
    out->host_entries = b->off->host_entries;
    out->host_sec = b->off->host_sec;
    return 0;
}

extern "C" int ds4_cuda_expert_counts(ds4_backend *base, ds4_expert_profile *p, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    const ds4_config *c = b->cfg;
    if (!b->expert_count)
        return ds4_err_set(err, DS4_EINVAL, "the CUDA backend was made without counting experts (count_experts)");
    if (p->n_layer != c->n_layer || p->n_expert != c->n_expert)
        return ds4_err_set(err, DS4_EINVAL, "a profile of %u x %u experts for a model of %u x %u", p->n_layer,
                           p->n_expert, c->n_layer, c->n_expert);
    size_t n = (size_t)c->n_layer * c->n_expert;
    uint32_t *h = (uint32_t *)malloc(n * sizeof(uint32_t));
    if (!h) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    cudaError_t e = cudaStreamSynchronize(b->st);
    if (e == cudaSuccess) e = cudaMemcpy(h, b->expert_count, n * sizeof(uint32_t), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        free(h);
        return ds4_err_set(err, DS4_EIO, "CUDA: reading the expert counts: %s", cudaGetErrorString(e));
    }
    uint64_t sel = 0;
    for (size_t i = 0; i < n; i++) p->use[i] = h[i];
    for (uint32_t e0 = 0; e0 < c->n_expert; e0++) sel += h[e0];
    p->tokens = sel / c->n_expert_used; /* layer 0's selections: k a token */
    free(h);
    return 0;
}
