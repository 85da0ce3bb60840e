/*
 * cuda_mtp.cu - the MTP block (docs/MODEL.md 9) on the GPU: its weights,
 * its one sequence, the rings of final residuals its rows pair with, and
 * the mark / rewind of its drafts.
 *
 * The block is one more dense layer of the model: its tensors are the
 * backend's layer n_layer (dweights.layers, dlstate), and the backend's
 * config becomes a copy whose layer n_layer has ratio 0 and the block's
 * SwiGLU clamp, so that the layer code of cuda_forward.cu runs it as it
 * runs the model's own layers.  A pass of T rows (token t_i paired with the
 * final residual H_i of some sequence's position):
 *
 *   e_i   = RMSNorm_enorm(embed(t_i))                 the model's embedding
 *   S_i,h = e_proj e_i + h_proj RMSNorm_hnorm(H_i,h)  each stream h
 *   then the layer, the block's HC head and norm, the model's output matrix
 *
 * with the position, the token and the logits of the MTP sequence (its own
 * dstep and logits rows stand in for the main sequence's while the pass is
 * made), its raw ring as the layer's KV state.  The model's passes keep
 * their last DS4_HIDDEN_KEEP final residuals in a ring (a launch at the end
 * of every pass, the decode graphs' included); the block's passes keep
 * theirs in one of their own (a draft after a draft pairs with them).
 *
 * A mark copies the MTP sequence's raw ring (one window of rows: its whole
 * KV state) and its logits; rewindable passes keep their rows' KV rows and
 * logits; a rewind puts the ring back and writes the kept rows again.
 *
 * A speculative cycle runs the block for a draft (one row) and for the
 * rows a verification kept (one to a few): each such pass is captured
 * once per row count (mtp_graph), as the model's decode step is - an
 * eager pass of the block cost as much host time as the model's whole
 * captured step.  The block's layer has no compressor, so a pass depends
 * on its position only through the dstep the kernels read.
 */
#include "model/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* Passes of up to this many rows run as captured graphs: a draft, and the
 * rows a verification of up to 16 drafts keeps. */
#define MTP_GRAPH_ROWS 17

typedef struct mtp_graph {
    cudaGraphExec_t x;
    float steer[2]; /* the main sequence's steering scales it was captured with */
} mtp_graph;

struct cu_mtp {
    ds4_config cfg; /* the model's, layer n_layer the block's (the backend's cfg) */
    mtp_graph graph[MTP_GRAPH_ROWS]; /* by rows - 1 */
    dmtp W;
    ds4_seq seq; /* the one MTP sequence */
    bool held;
    float *hid_main;      /* DS4_HIDDEN_KEEP final residuals (n_hc x n_embd) of the main sequence */
    float *hid_mtp;       /* ... of the MTP sequence */
    float *raw;           /* the MTP sequence's raw ring: b->main_seq.L[n_layer].raw */
    dstep *d_step;        /* its position and token */
    float *d_logits;      /* logits_rows x n_vocab (the pass's output head) */
    const float **d_hsrc; /* chunk entries: the residual each row of a pass pairs with */
    void *block;
    uint32_t n_tokens;
    bool has_logits;
    float *logits_h; /* host: the logits after its last token */
    /* the mark (journal) */
    bool jvalid, had_logits;
    uint32_t n0;
    float *jraw;    /* device: the ring at the mark */
    float *jrows;   /* device: DS4_REWIND_MAX KV rows of the rows since the mark */
    float *jlogits; /* host: DS4_REWIND_MAX rows of logits since the mark, then the mark's */
};

const dmtp *cu_mtp_dev(const cuda_backend *b) { return &b->mtp->W; }
bool cu_mtp_seq(const cuda_backend *b, const ds4_seq *s) { return b->mtp && s == &b->mtp->seq; }
uint32_t cu_mtp_len(const cuda_backend *b) { return b->mtp->n_tokens; }
const float *cu_mtp_logits(cuda_backend *b) { return b->mtp->has_logits ? b->mtp->logits_h : NULL; }

/* ----------------------------------------------------------- kernels */

/* The final residuals of rows [T - n, T) of the pass into the ring slots of
 * their positions (*pos on, read before the pass's end advances it). */
static __global__ void keep_hidden_kernel(const dstep *st, const float *S, float *ring, uint32_t T, uint32_t n,
                                          uint32_t hcD) {
    dev_pdl_enter();
    uint32_t t = T - n + blockIdx.x, pos = st->pos + t;
    const float *src = S + (size_t)t * hcD;
    float *dst = ring + (size_t)(pos % DS4_HIDDEN_KEEP) * hcD;
    for (uint32_t i = threadIdx.x; i < hcD; i += blockDim.x) dst[i] = src[i];
}

/* x <- x * w / rms(x) into out (D values in shared memory; the sum of
 * squares in double and the product order of cpu_rmsnorm). */
static __device__ void rmsnorm_to(const float *x, const uint8_t *w, uint32_t wtype, uint32_t D, float eps, float *out) {
    __shared__ double red[32];
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) ss += (double)x[i] * (double)x[i];
    ss = block_sum(ss, red);
    float scale = 1.0f / sqrtf((float)(ss / D) + eps);
    for (uint32_t i = threadIdx.x; i < D; i += blockDim.x) out[i] = x[i] * scale * fvec(w, wtype, i);
}

/* Row t: RMSNorm_enorm of token t's embedding into out row t. */
static __global__ void mtp_embed_kernel(const uint32_t *tokens, dwt E, const uint8_t *w, uint32_t wtype, uint32_t D,
                                        float eps, float *out) {
    dev_pdl_enter();
    DS4_DYN_SMEM(float, x);
    const uint8_t *row = E.p + (size_t)tokens[blockIdx.x] * E.row_bytes;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x)
        x[d] = E.type == DS4_TYPE_Q8_0
                   ? (float)((const int8_t *)row)[d] * dev_f16(((const uint16_t *)(row + D))[d / 32])
                   : fvec(row, E.type, d);
    __syncthreads();
    rmsnorm_to(x, w, wtype, D, eps, out + (size_t)blockIdx.x * D);
}

/* Row t, stream h0 + y (y = blockIdx.y): RMSNorm_hnorm of that stream of
 * the residual row t pairs with, into out row t * per + y. */
static __global__ void mtp_hnorm_kernel(const float *const *src, uint32_t h0, uint32_t per, const uint8_t *w,
                                        uint32_t wtype, uint32_t D, float eps, float *out) {
    dev_pdl_enter();
    DS4_DYN_SMEM(float, x);
    const float *h = src[blockIdx.x] + (size_t)(h0 + blockIdx.y) * D;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) x[d] = h[d];
    __syncthreads();
    rmsnorm_to(x, w, wtype, D, eps, out + ((size_t)blockIdx.x * per + blockIdx.y) * D);
}

/* S[t][h] = e_proj[t] + S[t][h] for every stream. */
static __global__ void mtp_add_kernel(float *S, const float *y, uint32_t n_hc, uint32_t D) {
    dev_pdl_enter();
    float *s = S + (size_t)blockIdx.x * n_hc * D;
    const float *e = y + (size_t)blockIdx.x * D;
    for (uint32_t i = threadIdx.x; i < n_hc * D; i += blockDim.x) s[i] = e[i % D] + s[i];
}

int cu_mtp_keep_hidden(cuda_backend *b, uint32_t T, bool mtp_pass, ds4_err *err) {
    uint32_t n = T < DS4_HIDDEN_KEEP ? T : DS4_HIDDEN_KEEP, hcD = b->cfg->n_hc * b->cfg->n_embd;
    DS4_LAUNCH(keep_hidden_kernel, n, 256, 0, b->st, (const dstep *)b->sq->d_step, (const float *)b->S,
               mtp_pass ? b->mtp->hid_mtp : b->mtp->hid_main, T, n, hcD);
    CU_LAUNCHED();
    return 0;
}

/* ---------------------------------------------------------- the pass */

/* S of the pass's T rows: e_proj of the normalised embeddings plus h_proj
 * of each normalised stream of the residuals (d_hsrc), the streams of all
 * rows in one product when the pass buffers hold them. */
static int mtp_input(cuda_backend *b, uint32_t T, ds4_err *err) {
    cu_mtp *m = b->mtp;
    const ds4_config *c = b->cfg;
    uint32_t D = c->n_embd, nh = c->n_hc;
    size_t smem = D * sizeof(float);
    DS4_LAUNCH(mtp_embed_kernel, T, 256, smem, b->st, (const uint32_t *)b->d_tokens, b->W.token_embd, m->W.enorm.p,
               m->W.enorm.type, D, c->rms_eps, b->xn.f);
    CU_LAUNCHED();
    if (cu_quantize(&b->xn, T, b->st, err) ||
        cu_gemm(&m->W.e_proj, 0, 0, D, &b->xn, 0, T, b->y, D, NULL, b->split, b->st, err))
        return -1;
    bool whole = (size_t)T * nh <= b->chunk;
    for (uint32_t h = 0; h < (whole ? 1 : nh); h++) {
        uint32_t rows = whole ? T * nh : T;
        DS4_LAUNCH(mtp_hnorm_kernel, dim3(T, whole ? nh : 1), 256, smem, b->st, (const float *const *)m->d_hsrc,
                   whole ? 0 : h, whole ? nh : 1, m->W.hnorm.p, m->W.hnorm.type, D, c->rms_eps, b->xn.f);
        CU_LAUNCHED();
        if (cu_quantize(&b->xn, rows, b->st, err) ||
            cu_gemm(&m->W.h_proj, 0, 0, D, &b->xn, 0, rows, b->S + (size_t)h * D, whole ? D : (size_t)nh * D, NULL,
                    b->split, b->st, err))
            return -1;
    }
    DS4_LAUNCH(mtp_add_kernel, T, 256, 0, b->st, b->S, (const float *)b->y, nh, D);
    CU_LAUNCHED();
    return 0;
}

/* One pass of the block over T rows (tokens in d_tokens, residual sources
 * in d_hsrc) at the MTP sequence's position; host_all as cu_forward's.
 * The MTP sequence's dstep and logits rows stand in for the main one's. */
static int mtp_pass(cuda_backend *b, uint32_t T, float *host_all, ds4_err *err) {
    cu_mtp *m = b->mtp;
    b->sq = &b->main_seq; /* whose final residuals the block pairs with, and whose layer n_layer is the block's */
    dstep *main_step = b->sq->d_step;
    float *main_logits = b->d_logits, *main_last = b->d_last_logits;
    b->sq->d_step = m->d_step;
    b->d_logits = m->d_logits;
    int rc = mtp_input(b, T, err);
    if (rc == 0) rc = cu_forward_mtp(b, b->d_tokens, T, m->n_tokens, T == 1, host_all, err);
    b->sq->d_step = main_step;
    b->d_logits = main_logits;
    b->d_last_logits = main_last;
    return rc;
}

/* Whether a pass of the block can run as its captured graph: one whose
 * logits are its last row's alone (a draft; the rows a verification kept;
 * not several rewindable rows, whose logits the journal keeps each), no
 * hidden states asked for, no host work within the pass (experts in host
 * RAM, the activation observer, the developer build's timed launches). */
static bool mtp_graph_ok(const cuda_backend *b, const ds4_row *rows, uint32_t n, bool own_all) {
    if (n > MTP_GRAPH_ROWS || n > b->logits_rows || own_all || ds4_prof_on || b->off || b->base.opts.act_observer)
        return false;
    if (n > 1 && (rows[0].want & DS4_ROW_REWIND)) return false;
    for (uint32_t i = 0; i < n; i++)
        if (rows[i].want & DS4_ROW_HIDDEN) return false;
    return true;
}

static void mtp_graph_drop(mtp_graph *g) {
    if (g->x) cudaGraphExecDestroy(g->x);
    memset(g, 0, sizeof(*g));
}

/* The pass of n rows through its graph (captured first, or again for other
 * steering scales), its last row's logits left in the block's d_logits. */
static int mtp_graph_run(cuda_backend *b, uint32_t n, ds4_err *err) {
    const ds4_seq *q = &b->main_seq.base;
    mtp_graph *g = &b->mtp->graph[n - 1];
    if (g->x && (g->steer[0] != q->steer_ffn || g->steer[1] != q->steer_attn)) mtp_graph_drop(g);
    if (!g->x) {
        cudaGraph_t cg;
        CU_TRY(cudaStreamBeginCapture(b->st, CU_CAPTURE_MODE));
        b->capturing = true;
        int rc = mtp_pass(b, n, NULL, err);
        b->capturing = false;
        cudaError_t e = cudaStreamEndCapture(b->st, &cg);
        if (rc) return ds4_err_prefix(err, "capturing the MTP block's pass of %u rows", n);
        CU_TRY(e);
        e = cudaGraphInstantiate(&g->x, cg, 0);
        cudaGraphDestroy(cg);
        if (e != cudaSuccess) g->x = NULL;
        CU_TRY(e);
        g->steer[0] = q->steer_ffn;
        g->steer[1] = q->steer_attn;
    }
    CU_TRY(cudaGraphLaunch(g->x, b->st));
    return 0;
}

/* The position of the MTP sequence's dstep. */
static int mtp_set_pos(cuda_backend *b, uint32_t pos, ds4_err *err) {
    b->sq = &b->main_seq;
    dstep *main_step = b->sq->d_step;
    b->sq->d_step = b->mtp->d_step;
    int rc = cu_set_step(b, STEP_POS | STEP_TOKEN | STEP_FOLD, pos, 0, err);
    b->sq->d_step = main_step;
    return rc;
}

/* An MTP row pairs with a residual its sequence keeps: of a past position,
 * among the last DS4_HIDDEN_KEEP; its device address. */
static int hidden_src(const cuda_backend *b, const ds4_row *r, uint32_t i, const float **src, ds4_err *err) {
    const cu_mtp *m = b->mtp;
    if (!r->hseq || r->hseq->owner != &b->base || (r->hseq != b->base.main && r->hseq != &m->seq))
        return ds4_err_set(err, DS4_EINVAL, "row %u: an MTP row without the residual it pairs with", i);
    bool own = r->hseq == &m->seq;
    uint32_t n = own ? m->n_tokens : b->main_seq.n_tokens;
    if (r->hpos >= n || r->hpos + DS4_HIDDEN_KEEP < n)
        return ds4_err_set(err, DS4_EINVAL,
                           "row %u: the residual of position %u is not kept (the sequence has %u, "
                           "keeps the last %d)",
                           i, r->hpos, n, DS4_HIDDEN_KEEP);
    *src = (own ? m->hid_mtp : m->hid_main) + (size_t)(r->hpos % DS4_HIDDEN_KEEP) * b->cfg->n_hc * b->cfg->n_embd;
    return 0;
}

static int check_rows(const cuda_backend *b, const ds4_row *rows, uint32_t n, const float **src, ds4_err *err) {
    const cu_mtp *m = b->mtp;
    if (n > b->chunk) return ds4_err_set(err, DS4_ERANGE, "a step of %u rows exceeds the %u a pass holds", n, b->chunk);
    bool rewindable = rows[0].want & DS4_ROW_REWIND;
    for (uint32_t i = 0; i < n; i++) {
        if (!rows[i].seq || rows[i].seq->owner != &b->base)
            return ds4_err_set(err, DS4_EINVAL, "row %u: the sequence is not this backend's", i);
        if (rows[i].seq != &m->seq)
            return ds4_err_set(err, DS4_EINVAL, "row %u: a sequence of the main model in a step of the MTP block", i);
        if (rows[i].token >= b->cfg->n_vocab)
            return ds4_err_set(err, DS4_EINVAL, "token %u at row %u is outside the vocabulary (%u)", rows[i].token, i,
                               b->cfg->n_vocab);
        if ((rows[i].want & DS4_ROW_REWIND) != (rows[0].want & DS4_ROW_REWIND))
            return ds4_err_set(err, DS4_EINVAL, "row %u: the rows of a sequence are all rewindable or none is", i);
        if (hidden_src(b, &rows[i], i, &src[i], err)) return -1;
    }
    if (rewindable && !m->jvalid)
        return ds4_err_set(err, DS4_EINVAL, "row 0: a rewindable row of a sequence without a mark");
    if (rewindable && m->n_tokens + n - m->n0 > DS4_REWIND_MAX)
        return ds4_err_set(err, DS4_ERANGE, "%u rewindable rows after the mark exceed %d", m->n_tokens + n - m->n0,
                           DS4_REWIND_MAX);
    if ((uint64_t)m->n_tokens + n > b->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", n, m->n_tokens, b->ctx);
    return 0;
}

/* After the pass: the rows' hidden states asked for, the rewindable rows'
 * KV rows into the journal; then (synchronised) the logits. */
static int finish_step(cuda_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, float *all,
                       bool rewindable, ds4_err *err) {
    cu_mtp *m = b->mtp;
    const ds4_config *c = b->cfg;
    size_t hcd = (size_t)c->n_hc * c->n_embd, V = c->n_vocab;
    for (uint32_t i = 0, nh = 0; i < n; i++)
        if ((rows[i].want & DS4_ROW_HIDDEN) && out && out->hidden)
            CU_TRY(cudaMemcpyAsync(out->hidden + hcd * nh++, b->S + hcd * i, hcd * sizeof(float),
                                   cudaMemcpyDeviceToHost, b->st));
    if (rewindable)
        CU_TRY(cudaMemcpyAsync(m->jrows + (size_t)(m->n_tokens - m->n0) * c->head_dim, b->kvbuf,
                               (size_t)n * c->head_dim * sizeof(float), cudaMemcpyDeviceToDevice, b->st));
    if (!all) CU_TRY(cudaMemcpyAsync(m->logits_h, m->d_logits, V * sizeof(float), cudaMemcpyDeviceToHost, b->st));
    CU_TRY(cudaStreamSynchronize(b->st));
    if (all) memcpy(m->logits_h, all + (n - 1) * V, V * sizeof(float));
    for (uint32_t i = 0, k = 0; i < n; i++)
        if ((rows[i].want & DS4_ROW_LOGITS) && out && out->logits)
            memcpy(out->logits + V * k++, all ? all + V * i : m->logits_h, V * sizeof(float));
    m->n_tokens += n;
    m->has_logits = true;
    return 0;
}

int cu_mtp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    cu_mtp *m = b->mtp;
    if (!m) return ds4_err_set(err, DS4_EINVAL, "the backend was made without an MTP block");
    if (n == 0) return 0;
    const float *src[DS4_REWIND_MAX], **srcs = n <= DS4_REWIND_MAX ? src : (const float **)malloc(n * sizeof(*srcs));
    uint32_t tok[DS4_REWIND_MAX], *ids = n <= DS4_REWIND_MAX ? tok : (uint32_t *)malloc(n * sizeof(uint32_t));
    bool rewindable = rows[0].want & DS4_ROW_REWIND;
    size_t V = b->cfg->n_vocab;
    float *all = NULL;
    bool own_all = false;
    int rc = -1;
    if (!srcs || !ids) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto out;
    }
    if (check_rows(b, rows, n, srcs, err)) goto out;
    if (!rewindable) m->jvalid = false; /* drops the mark */
    /* every row's logits when the journal keeps them or a row other than
     * the last asks; else the last row's alone */
    if (rewindable) {
        all = m->jlogits + (size_t)(m->n_tokens - m->n0) * V;
    } else {
        for (uint32_t i = 0; i + 1 < n; i++) own_all |= (rows[i].want & DS4_ROW_LOGITS) && out && out->logits;
        if (own_all && !(all = (float *)malloc(n * V * sizeof(float)))) {
            ds4_err_set(err, DS4_ENOMEM, "out of memory for %u rows of logits", n);
            goto out;
        }
    }
    for (uint32_t i = 0; i < n; i++) ids[i] = rows[i].token;
    if (cudaMemcpyAsync(b->d_tokens, ids, n * sizeof(uint32_t), cudaMemcpyHostToDevice, b->st) != cudaSuccess ||
        cudaMemcpyAsync(m->d_hsrc, srcs, n * sizeof(*srcs), cudaMemcpyHostToDevice, b->st) != cudaSuccess) {
        ds4_err_set(err, DS4_EIO, "CUDA: copying the step's rows failed");
        goto out;
    }
    if (mtp_graph_ok(b, rows, n, own_all)) {
        /* the last row's logits: into the journal's row (a draft) here,
         * into logits_h by finish_step */
        if (mtp_graph_run(b, n, err) ||
            (all && cudaMemcpyAsync(all, m->d_logits, V * sizeof(float), cudaMemcpyDeviceToHost, b->st) != cudaSuccess) ||
            finish_step(b, rows, n, out, all, rewindable, err)) {
            ds4_err_prefix(err, "MTP step of %u rows at %u", n, m->n_tokens);
            goto out;
        }
    } else if (mtp_pass(b, n, all, err) || finish_step(b, rows, n, out, all, rewindable, err)) {
        ds4_err_prefix(err, "MTP step of %u rows at %u", n, m->n_tokens);
        goto out;
    }
    rc = 0;
out:
    if (srcs != src) free(srcs);
    if (ids != tok) free(ids);
    if (own_all) free(all);
    return rc;
}

/* ------------------------------------------------- mark and rewind */

int cu_mtp_mark(cuda_backend *b, ds4_err *err) {
    cu_mtp *m = b->mtp;
    size_t V = b->cfg->n_vocab;
    m->jvalid = false;
    m->n0 = m->n_tokens;
    CU_TRY(cudaMemcpyAsync(m->jraw, m->raw, (size_t)b->raw_cap * b->cfg->head_dim * sizeof(float),
                           cudaMemcpyDeviceToDevice, b->st));
    m->had_logits = m->has_logits;
    if (m->has_logits) memcpy(m->jlogits + DS4_REWIND_MAX * V, m->logits_h, V * sizeof(float));
    m->jvalid = true;
    return 0;
}

int cu_mtp_rewind(cuda_backend *b, uint32_t n, ds4_err *err) {
    cu_mtp *m = b->mtp;
    size_t V = b->cfg->n_vocab, hd = b->cfg->head_dim;
    if (!m->jvalid) return ds4_err_set(err, DS4_EINVAL, "rewind: the MTP sequence has no mark");
    if (n < m->n0 || n > m->n_tokens)
        return ds4_err_set(err, DS4_ERANGE, "rewind to %u: the MTP sequence's mark is at %u, its length %u", n, m->n0,
                           m->n_tokens);
    if (n == m->n_tokens) return 0;
    CU_TRY(cudaMemcpyAsync(m->raw, m->jraw, (size_t)b->raw_cap * hd * sizeof(float), cudaMemcpyDeviceToDevice, b->st));
    for (uint32_t p = n > m->n0 + b->raw_cap ? n - b->raw_cap : m->n0; p < n; p++)
        CU_TRY(cudaMemcpyAsync(m->raw + (size_t)(p % b->raw_cap) * hd, m->jrows + (size_t)(p - m->n0) * hd,
                               hd * sizeof(float), cudaMemcpyDeviceToDevice, b->st));
    if (mtp_set_pos(b, n, err)) return -1;
    CU_TRY(cudaStreamSynchronize(b->st));
    m->n_tokens = n;
    m->has_logits = n > m->n0 || m->had_logits;
    if (m->has_logits)
        memcpy(m->logits_h, m->jlogits + (n > m->n0 ? (size_t)(n - 1 - m->n0) : DS4_REWIND_MAX) * V, V * sizeof(float));
    return 0;
}

void cu_mtp_reset(cuda_backend *b) {
    cu_mtp *m = b->mtp;
    ds4_err err = {};
    if (mtp_set_pos(b, 0, &err) || ds4_cuda_check(cudaStreamSynchronize(b->st), "reset", __FILE__, __LINE__, &err))
        fprintf(stderr, "ds4 cuda: resetting the MTP sequence failed: %s\n", ds4_err_msg(&err));
    m->n_tokens = 0;
    m->jvalid = false;
    m->has_logits = false;
}

/* ------------------------------------------------------ the sequence */

ds4_seq *cu_mtp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    if (!b->mtp) {
        ds4_err_set(err, DS4_EINVAL, "the backend was made without an MTP block");
        return NULL;
    }
    if (b->mtp->held) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "the CUDA backend holds one MTP sequence, and it is in use");
        return NULL;
    }
    if (ctx > b->ctx) {
        ds4_err_set(err, DS4_ERANGE, "an MTP sequence of %u tokens exceeds the backend's context of %u", ctx, b->ctx);
        return NULL;
    }
    cu_mtp_reset(b);
    b->mtp->held = true;
    return &b->mtp->seq;
}

void cu_mtp_seq_free(cuda_backend *b) { b->mtp->held = false; }

/* -------------------------------------------------------- lifetime */

int cu_mtp_init(cuda_backend *b, ds4_err *err) {
    const ds4_mtp_weights *mw = b->base.opts.mtp;
    const ds4_config *c = b->cfg;
    if (c->n_layer >= DS4_MAX_LAYERS)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: no layer slot for the MTP block after %u layers",
                           c->n_layer);
    cu_mtp *m = (cu_mtp *)calloc(1, sizeof(cu_mtp));
    if (!m) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    b->mtp = m;
    m->seq.owner = &b->base;
    m->cfg = *c;
    m->cfg.compress_ratio[c->n_layer] = 0;
    m->cfg.swiglu_clamp[c->n_layer] = mw->cfg.swiglu_clamp[0];
    b->cfg = &m->cfg;
    if (cu_mtp_weights_load(&m->W, &b->W.layers[c->n_layer], mw, mw->synthetic, b->base.w->synthetic_seed ^ 0x4d5450ull,
                            b->st, err))
        return ds4_err_prefix(err, "the MTP block");
    size_t hcD = (size_t)c->n_hc * c->n_embd, hd = c->head_dim, V = c->n_vocab;
    size_t sizes[] = {DS4_HIDDEN_KEEP * hcD * sizeof(float), DS4_HIDDEN_KEEP * hcD * sizeof(float),
                      b->raw_cap * hd * sizeof(float),       sizeof(dstep),
                      b->logits_rows * V * sizeof(float),    b->chunk * sizeof(float *),
                      b->raw_cap * hd * sizeof(float),       DS4_REWIND_MAX * hd * sizeof(float)};
    void **ptrs[] = {(void **)&m->hid_main, (void **)&m->hid_mtp, (void **)&m->raw,  (void **)&m->d_step,
                     (void **)&m->d_logits, (void **)&m->d_hsrc,  (void **)&m->jraw, (void **)&m->jrows};
    size_t total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) total += (sizes[i] + 255) / 256 * 256;
    if (cu_dev_alloc(&m->block, total, "the MTP sequence's state", err)) return -1;
    total = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        *ptrs[i] = (uint8_t *)m->block + total;
        total += (sizes[i] + 255) / 256 * 256;
    }
    CU_TRY(cudaMemsetAsync(m->block, 0, total, b->st));
    /* pinned: every draft's logits come back to the host */
    if (cudaMallocHost((void **)&m->logits_h, V * sizeof(float)) != cudaSuccess ||
        cudaMallocHost((void **)&m->jlogits, (DS4_REWIND_MAX + 1) * V * sizeof(float)) != cudaSuccess)
        return ds4_err_set(err, DS4_ENOMEM, "out of pinned memory for the MTP sequence's logits");
    dlstate *L = &b->main_seq.L[c->n_layer];
    memset(L, 0, sizeof(*L));
    L->raw = m->raw;
    return 0;
}

void cu_mtp_free(cuda_backend *b) {
    cu_mtp *m = b->mtp;
    if (!m) return;
    for (uint32_t i = 0; i < MTP_GRAPH_ROWS; i++) mtp_graph_drop(&m->graph[i]);
    if (m->W.block) cudaFree(m->W.block);
    if (m->block) cudaFree(m->block);
    if (m->logits_h) cudaFreeHost(m->logits_h);
    if (m->jlogits) cudaFreeHost(m->jlogits);
    free(m);
    b->mtp = NULL;
}
