/*
 * cuda_attn.cu - embedding and the attention sublayer on the GPU
 * (docs/MODEL.md 6.1-6.3, 7), mirroring src/model/cpu/cpu_attn.c (the
 * hyper-connections around it are in cuda_hc.cu).
 *
 * A pass handles T tokens at positions pos0 .. pos0+T-1, with pos0 read
 * from device memory so that the same kernels serve a captured decode
 * step (T = 1, replayed at every position) and a prefill chunk.  The
 * order-dependent parts of the CPU's token walk become parallel steps:
 *   1. every compressed row whose window closes inside the pass is pooled
 *      at once (its inputs are the pass's projections or the frontier the
 *      previous pass left), then the frontier is rebuilt in canonical form;
 *   2. each query selects its visible rows (indexer top-k over the rows of
 *      its own prefix: cuda_indexer.cu);
 *   3. each query attends over its raw window (rows of earlier passes from
 *      the ring, rows of this pass from the pass buffer) and its visible
 *      compressed rows; the ring is updated afterwards.
 * The low-precision simulations use the CPU's formulas (lowprec.c): FP8
 * and FP4 rounding are computed in closed form (round-to-nearest-even on
 * the mantissa), which selects the same table entry as the CPU's search.
 */
#include "model/cuda/cuda_sinkhorn.cuh"

#include "model/cuda/cuda_lowprec.cuh"

#define SCORE_NEG_INF (-1e30f)

/* ------------------------------------------------------ small helpers */

/* Rotate the tail pairs of x (n values; the last 2 * rope.n_pairs) in place
 * (shared memory). */
static __device__ void block_rope(float *x, uint32_t n, const ds4_rope &rope, uint32_t pos, bool inverse) {
    __syncthreads();
    float *tail = x + n - 2 * rope.n_pairs;
    for (uint32_t k = threadIdx.x; k < rope.n_pairs; k += blockDim.x) {
        float theta = (float)pos * rope.inv_freq[k];
        float c = cosf(theta), s = sinf(theta);
        if (inverse) s = -s;
        float x0 = tail[2 * k], x1 = tail[2 * k + 1];
        tail[2 * k] = x0 * c - x1 * s;
        tail[2 * k + 1] = x0 * s + x1 * c;
    }
    __syncthreads();
}
/* Asks the L2 for the RoPE table before a launch's PDL wait: the weights
 * streamed since its last use have pushed it out, and the rotation reads it
 * only after the launch's loads and norm, one more DRAM round trip. */
static __device__ __forceinline__ void rope_to_l2(const ds4_rope &rope) {
    if (threadIdx.x * 32 < rope.n_pairs) prefetch_l2(rope.inv_freq + 32 * threadIdx.x);
}
/* ---------------------------------------------------------- embedding */

static __global__ void embed_kernel(const uint32_t *tokens, dwt E, float *S, uint32_t D, uint32_t n_hc) {
    dev_pdl_enter();
    uint32_t tok = tokens[blockIdx.x];
    const uint8_t *row = E.p + (size_t)tok * E.row_bytes;
    float *s = S + (size_t)blockIdx.x * n_hc * D;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        float v;
        if (E.type == DS4_TYPE_Q8_0)
            v = (float)((const int8_t *)row)[d] * dev_f16(((const uint16_t *)(row + D))[d / 32]);
        else v = fvec(row, E.type, d);
        for (uint32_t h = 0; h < n_hc; h++) s[(size_t)h * D + d] = v;
    }
}

int cu_embed_tokens(cuda_backend *b, const uint32_t *d_tok, uint32_t T, ds4_err *err) {
    DS4_LAUNCH(embed_kernel, T, 256, 0, b->st, d_tok, b->W.token_embd, b->S, b->cfg->n_embd, b->cfg->n_hc);
    CU_LAUNCHED();
    return 0;
}

/* ------------------------------------------------- Q / KV projections */

typedef struct qkv_args {
    const uint32_t *pos0;
    /* role 0: qr normalisation */
    float *qa_raw;
    uint32_t qlr;
    const uint8_t *qa_norm;
    uint32_t qa_norm_type;
    dact qr;
    /* role 1: KV row */
    float *kv; /* in: projection; out: normed, roped, rounded row */
    uint32_t hd, rope_dim;
    const uint8_t *kv_norm;
    uint32_t kv_norm_type;
    ds4_rope rope;
    float eps;
    bool sim;
    float *ring; /* a decode step's row also goes into the raw ring (NULL: ring_write_kernel after attention) */
    uint32_t raw_cap;
} qkv_args;

static __global__ void qkv_post_kernel(qkv_args a) {
    dev_pdl_launch_next();
    DS4_DYN_SMEM(float, x);
    uint32_t t = blockIdx.x;
    bool qrole = blockIdx.y == 0;
    norm_w nw = qrole ? block_norm_weights(a.qa_norm, a.qa_norm_type, a.qlr)
                      : block_norm_weights(a.kv_norm, a.kv_norm_type, a.hd);
    if (!qrole) rope_to_l2(a.rope);
    dev_pdl_wait_prev();
    uint32_t pos = *a.pos0 + t; /* loaded with the row, not after the norm */
    if (qrole) {
        block_load_row(x, a.qa_raw + (size_t)t * a.qlr, a.qlr);
        __syncthreads();
        block_rmsnorm(x, a.qlr, nw, a.eps);
        float *o = a.qr.f + (size_t)t * a.qr.fs;
        for (uint32_t i = threadIdx.x; i < a.qlr; i += blockDim.x) o[i] = x[i];
        dev_quantize_row(x, a.qlr, a.qr.q8 ? a.qr.q8 + (size_t)t * a.qr.q8s : NULL,
                         a.qr.qk ? a.qr.qk + (size_t)t * a.qr.qks : NULL);
        return;
    }
    float *kv = a.kv + (size_t)t * a.hd;
    block_load_row(x, kv, a.hd);
    __syncthreads();
    block_rmsnorm(x, a.hd, nw, a.eps);
    block_rope(x, a.hd, a.rope, pos, false);
    if (a.sim) block_fp8_roundtrip(x, a.hd - a.rope_dim);
    float *ring = a.ring ? a.ring + (size_t)(pos % a.raw_cap) * a.hd : NULL;
    for (uint32_t i = threadIdx.x; i < a.hd; i += blockDim.x) {
        float v = a.sim ? dev_f16_round(x[i]) : x[i];
        kv[i] = v;
        if (ring) ring[i] = v;
    }
}

int cu_qkv_post(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    qkv_args a;
    memset(&a, 0, sizeof(a));
    a.pos0 = &b->sq->d_step->pos;
    a.qa_raw = b->qa_raw;
    a.qlr = c->q_lora_rank;
    a.qa_norm = w->q_a_norm.p;
    a.qa_norm_type = w->q_a_norm.type;
    a.qr = b->qr;
    a.kv = b->kvbuf;
    a.hd = c->head_dim;
    a.rope_dim = c->rope_dim;
    a.kv_norm = w->kv_norm.p;
    a.kv_norm_type = w->kv_norm.type;
    a.rope = ds4_layer_ratio(c, il) ? b->rope_comp : b->rope_dense;
    a.eps = c->rms_eps;
    a.sim = b->sim;
    /* one token: the ring slot it takes holds the row that just left the
     * window (raw_cap = the window), which its attention does not read */
    if (T == 1) {
        a.ring = b->sq->L[il].raw;
        a.raw_cap = b->raw_cap;
    }
    size_t smem = (c->q_lora_rank > c->head_dim ? c->q_lora_rank : c->head_dim) * sizeof(float);
    DS4_LAUNCH(qkv_post_kernel, dim3(T, 2), QKV_POST_THREADS, smem, b->st, a);
    CU_LAUNCHED();
    return 0;
}

typedef struct qpost_args {
    const uint32_t *pos0;
    float *q;
    uint32_t n_head, hd; /* n_head 0: the query heads are the attention's (atc_load_q) */
    ds4_rope rope;
    float *iq, *iw;
    uint32_t idx_heads, ihd;
    ds4_rope rope_comp;
    float wscale, eps;
    bool sim;
    /* a decode step that closes no window of a deferred layer: its input
     * (src, n values) into row pos % ratio of the window (NULL: none) */
    float *keep;
    const float *keep_src;
    uint32_t keep_n, keep_ratio;
} qpost_args;

/* A query head by one warp, in registers: lane l holds the groups of four
 * values at 4 l + 128 j (whole 512-byte rows a load), the unweighted
 * RMSNorm's sum of squares in double as block_rmsnorm's, then the tail
 * RoPE's pairs, which never straddle a group (the tail starts at an even
 * value).  Same arithmetic as the block helpers, without their barriers:
 * this launch is on a decode step's path from the projections to the
 * attention.  A long prefill pass's attention does the same to its query's
 * heads as it loads them (atc_load_q), instead of this launch. */
#define QP_HEADS  4 /* query heads a block: a warp each */
#define QP_GROUPS 4 /* groups of four values a lane: head_dim <= 512 (check_config) */
static __device__ __forceinline__ void q_post_vals(float4 (&v)[QP_GROUPS], uint32_t hd, const ds4_rope &rope,
                                                   uint32_t pos, float eps) {
    unsigned lane = threadIdx.x & 31;
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < QP_GROUPS; j++)
        ss += (double)v[j].x * v[j].x + (double)v[j].y * v[j].y + (double)v[j].z * v[j].z + (double)v[j].w * v[j].w;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float scale = 1.0f / sqrtf((float)(ss / hd) + eps);
    uint32_t t0 = hd - 2 * rope.n_pairs;
#pragma unroll
    for (int j = 0; j < QP_GROUPS; j++) {
        uint32_t e = 4 * lane + 128 * j;
        if (e >= hd) break;
        float x[4] = {v[j].x * scale, v[j].y * scale, v[j].z * scale, v[j].w * scale};
#pragma unroll
        for (int p = 0; p < 2; p++) {
            if (e + 2 * p < t0) continue;
            float theta = (float)pos * rope.inv_freq[(e + 2 * p - t0) / 2];
            float c = cosf(theta), sn = sinf(theta), x0 = x[2 * p], x1 = x[2 * p + 1];
            x[2 * p] = x0 * c - x1 * sn;
            x[2 * p + 1] = x0 * sn + x1 * c;
        }
        v[j] = make_float4(x[0], x[1], x[2], x[3]);
    }
}
/* The lane's groups of a head row (zeros past hd, or for no row). */
static __device__ __forceinline__ void q_post_load(const float *q, uint32_t hd, float4 (&v)[QP_GROUPS]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < QP_GROUPS; j++) {
        uint32_t e = 4 * lane + 128 * j;
        v[j] = q && e < hd ? *(const float4 *)(q + e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}
static __device__ __forceinline__ void q_post_head(float *q, uint32_t hd, const ds4_rope &rope, uint32_t pos,
                                                   float eps) {
    unsigned lane = threadIdx.x & 31;
    float4 v[QP_GROUPS];
    q_post_load(q, hd, v);
    q_post_vals(v, hd, rope, pos, eps);
#pragma unroll
    for (int j = 0; j < QP_GROUPS; j++) {
        uint32_t e = 4 * lane + 128 * j;
        if (e >= hd) break;
        *(float4 *)(q + e) = v[j];
    }
}

/* An indexer head (128 values: check_config) by one warp, lane l holding
 * values 4 l .. 4 l + 3: the tail RoPE's pairs (never straddling a lane:
 * the tail starts at an even value) and, with the simulations, the QAT
 * round trip (warp_qat128) - block_rope's and block_qat128's arithmetic. */
static __device__ __forceinline__ void idx_post_head(float *q, const ds4_rope &rope, uint32_t pos, bool sim) {
    unsigned lane = threadIdx.x & 31;
    float4 v = *(const float4 *)(q + 4 * lane);
    float x[4] = {v.x, v.y, v.z, v.w};
    uint32_t t0 = 128 - 2 * rope.n_pairs;
#pragma unroll
    for (int p = 0; p < 2; p++) {
        uint32_t e = 4 * lane + 2 * p;
        if (e < t0) continue;
        float theta = (float)pos * rope.inv_freq[(e - t0) / 2];
        float c = cosf(theta), s = sinf(theta), x0 = x[2 * p], x1 = x[2 * p + 1];
        x[2 * p] = x0 * c - x1 * s;
        x[2 * p + 1] = x0 * s + x1 * c;
    }
    if (sim) warp_qat128(x);
    *(float4 *)(q + 4 * lane) = make_float4(x[0], x[1], x[2], x[3]);
}

/* Blocks y < ceil(n_head / QP_HEADS): QP_HEADS query heads, a warp each
 * (q_post_head); the others QP_HEADS indexer heads, a warp each
 * (idx_post_head), and the first of them gives the indexer head weights
 * their scale.  (An indexer head a block of 128 threads through shared
 * memory, as before 3e56b4a, made 64 small blocks a token:
 * 263 us of a 2048-token prefill launch.) */
static __global__ void q_post_kernel(qpost_args a) {
    dev_pdl_enter();
    uint32_t t = blockIdx.x, y = blockIdx.y, pos = *a.pos0 + t, nqb = (a.n_head + QP_HEADS - 1) / QP_HEADS;
    if (a.keep && y == gridDim.y - 1) { /* the last block: the window's row */
        float4 *dst = (float4 *)(a.keep + (size_t)(pos % a.keep_ratio) * a.keep_n);
        for (uint32_t i = threadIdx.x; i < a.keep_n / 4; i += blockDim.x) dst[i] = ((const float4 *)a.keep_src)[i];
        return;
    }
    if (y < nqb) {
        uint32_t h = y * QP_HEADS + threadIdx.x / 32;
        if (h < a.n_head) q_post_head(a.q + ((size_t)t * a.n_head + h) * a.hd, a.hd, a.rope, pos, a.eps);
        return;
    }
    uint32_t h = (y - nqb) * QP_HEADS + threadIdx.x / 32;
    if (h < a.idx_heads) idx_post_head(a.iq + ((size_t)t * a.idx_heads + h) * a.ihd, a.rope_comp, pos, a.sim);
    if (y == nqb)
        for (uint32_t i = threadIdx.x; i < a.idx_heads; i += blockDim.x) a.iw[(size_t)t * a.idx_heads + i] *= a.wscale;
}

int cu_q_post(cuda_backend *b, uint32_t il, uint32_t T, bool keep, ds4_err *err) {
    const ds4_config *c = b->cfg;
    bool idx = ds4_layer_has_indexer(c, il);
    qpost_args a;
    memset(&a, 0, sizeof(a));
    a.pos0 = &b->sq->d_step->pos;
    a.q = b->q;
    a.hd = c->head_dim;
    a.rope = ds4_layer_ratio(c, il) ? b->rope_comp : b->rope_dense;
    a.iq = b->iq;
    a.iw = b->iw;
    a.idx_heads = c->idx_n_head;
    a.ihd = c->idx_head_dim;
    a.rope_comp = b->rope_comp;
    a.wscale = 1.0f / sqrtf((float)c->idx_head_dim * (float)c->idx_n_head);
    a.eps = c->rms_eps;
    a.sim = b->sim;
    /* the query heads of a pass on the tensor-core attention are its to do;
     * the backend's own heads (cu_tp) */
    uint32_t nqb = cu_attn_tc(b, T) ? 0 : (b->tp.heads + QP_HEADS - 1) / QP_HEADS;
    uint32_t nib = idx ? (c->idx_n_head + QP_HEADS - 1) / QP_HEADS : 0;
    a.n_head = nqb ? b->tp.heads : 0;
    if (keep) {
        a.keep = b->sq->L[il].win;
        a.keep_src = b->xn.f;
        a.keep_n = c->n_embd;
        a.keep_ratio = b->sq->L[il].ratio;
    }
    uint32_t blocks = nqb + nib + (keep ? 1 : 0);
    if (blocks == 0) return 0;
    DS4_LAUNCH(q_post_kernel, dim3(T, blocks), 32 * QP_HEADS, 0, b->st, a);
    CU_LAUNCHED();
    return 0;
}

/* -------------------------------------------------------- compressors */

/* Value and score of frontier position `p` in column `col`: the pass's
 * projection (score + positional bias) or the row the previous pass left.
 * The pass starts at pos0, and its rows below `first` (a deferred layer's
 * window: comp_pass_start) are the frontier's. */
static __device__ __forceinline__ void comp_fetch(const comp_lane &L, uint32_t pos0, uint32_t first, long long p,
                                                  uint32_t col, float *kv, float *sc) {
    if (p < 0) {
        *kv = 0.0f;
        *sc = SCORE_NEG_INF;
        return;
    }
    uint32_t q = (uint32_t)p; /* positions fit 32 bits: 64-bit divisions cost the ratio-4 pooling a fifth */
    if (q >= first) {
        size_t t = q - pos0;
        *kv = L.ckv[t * L.width + col];
        *sc = L.cgate[t * L.width + col] + fvec(L.ape, L.ape_type, (size_t)(q % L.ratio) * L.width + col);
        return;
    }
    uint32_t R;
    if (L.ratio == 4) R = q / 4 == pos0 / 4 ? 4 + q % 4 : q % 4;
    else R = q % L.ratio;
    *kv = L.skv[(size_t)R * L.width + col];
    *sc = L.ssc[(size_t)R * L.width + col];
}

/* Pooling of column j over a window of `ratio` (a multiple of CP_BATCH)
 * positions all in the pass, from pass row t0: comp_fetch's sums in its
 * order, but the loads of CP_BATCH candidates are issued before any is
 * used.  Through comp_fetch, whose branches keep each candidate's loads
 * behind the previous one's use, a ratio-128 window took a memory round
 * trip a candidate: ~230 us a 2048-token chunk for 16 blocks, 37 us
 * since (69f6bcd). */
#define CP_BATCH 16

/* Scores of candidates r0 .. r0 + CP_BATCH - 1: projection + positional
 * bias, or for the first nf of the window (a deferred layer's, folded
 * before the pass: comp_pass_start) the frontier's row (ratio 128: row r). */
static __device__ __forceinline__ void comp_batch_scores(const comp_lane &L, uint32_t t0, uint32_t nf, uint32_t r0,
                                                         uint32_t j, float (&sc)[CP_BATCH]) {
    float ap[CP_BATCH];
#pragma unroll
    for (int k = 0; k < CP_BATCH; k++) {
        uint32_t r = r0 + k;
        sc[k] = __ldg(r < nf ? L.ssc + (size_t)r * L.width + j : L.cgate + (size_t)(t0 + r) * L.width + j);
    }
    fvec_n(L.ape, L.ape_type, (size_t)r0 * L.width + j, L.width, true, ap);
#pragma unroll
    for (int k = 0; k < CP_BATCH; k++)
        if (r0 + k >= nf) sc[k] += ap[k];
}

static __device__ float comp_pool_pass(const comp_lane &L, uint32_t t0, uint32_t nf, uint32_t j) {
    float mx = SCORE_NEG_INF;
    for (uint32_t r0 = 0; r0 < L.ratio; r0 += CP_BATCH) {
        float sc[CP_BATCH];
        comp_batch_scores(L, t0, nf, r0, j, sc);
#pragma unroll
        for (int k = 0; k < CP_BATCH; k++) mx = fmaxf(mx, sc[k]);
    }
    float sum = 0.0f, acc = 0.0f;
    for (uint32_t r0 = 0; r0 < L.ratio; r0 += CP_BATCH) {
        float sc[CP_BATCH], kv[CP_BATCH];
        comp_batch_scores(L, t0, nf, r0, j, sc);
#pragma unroll
        for (int k = 0; k < CP_BATCH; k++) {
            uint32_t r = r0 + k;
            kv[k] = __ldg(r < nf ? L.skv + (size_t)r * L.width + j : L.ckv + (size_t)(t0 + r) * L.width + j);
        }
#pragma unroll
        for (int k = 0; k < CP_BATCH; k++) {
            float e = expf(sc[k] - mx);
            sum += e;
            acc += e * kv[k];
        }
    }
    return sum > 0.0f ? acc / sum : 0.0f;
}

/* Ratio 4's pooling of column j of the window from ws: comp_fetch's eight
 * candidates (the previous window's first half of the row, the window's
 * second half) and its sums in its order, but every load issued before
 * any is used - through comp_fetch in a loop, each candidate waited for a
 * memory round trip, twice, and a closing decode step's emit is on the
 * query path. */
static __device__ float comp_pool4(const comp_lane &L, uint32_t pos0, uint32_t first, long long ws, uint32_t j) {
    float kv[8], sc[8], ap[8], lo[4], hi[4];
    bool pass[8];
#pragma unroll
    for (int r = 0; r < 8; r++) {
        long long p = ws - 4 + r;
        uint32_t q = p < 0 ? 0 : (uint32_t)p, col = r < 4 ? j : L.hd + j;
        pass[r] = p >= 0 && q >= first;
        uint32_t R = q / 4 == pos0 / 4 ? 4 + q % 4 : q % 4;
        size_t at = pass[r] ? (size_t)(q - pos0) * L.width + col : (size_t)R * L.width + col;
        kv[r] = __ldg((pass[r] ? L.ckv : L.skv) + at);
        sc[r] = __ldg((pass[r] ? L.cgate : L.ssc) + at);
    }
    fvec_n(L.ape, L.ape_type, j, L.width, true, lo);
    fvec_n(L.ape, L.ape_type, L.hd + j, L.width, true, hi);
#pragma unroll
    for (int r = 0; r < 8; r++) {
        ap[r] = r < 4 ? lo[r] : hi[r - 4];
        if (pass[r]) sc[r] += ap[r];
        if (ws - 4 + r < 0) {
            kv[r] = 0.0f;
            sc[r] = SCORE_NEG_INF;
        }
    }
    float mx = SCORE_NEG_INF;
#pragma unroll
    for (int r = 0; r < 8; r++) mx = fmaxf(mx, sc[r]);
    float sum = 0.0f, acc = 0.0f;
#pragma unroll
    for (int r = 0; r < 8; r++) {
        float e = expf(sc[r] - mx);
        sum += e;
        acc += e * kv[r];
    }
    return sum > 0.0f ? acc / sum : 0.0f;
}

/* The pass's first position (back before the step's) and the first that
 * is the pass's rather than the frontier's (comp_fetch), after the PDL
 * wait. */
static __device__ __forceinline__ uint32_t comp_pass_start(const comp_args &a, uint32_t *first) {
    uint32_t pos0 = dev_pdl_wait_pos(a.pos0, a.pos_early) - a.back, f = a.fold ? *a.fold : 0;
    *first = f > pos0 ? f : pos0;
    return pos0;
}

/* One block per (window closing in the pass, lane): pool, normalise, RoPE
 * at the window start, round trip; writes compressed row `w`.  BATCHED
 * (ratio-128 windows wholly in the pass: prefill passes, a deferred
 * layer's closing window) pools by comp_pool_pass, whose batches take 128
 * registers: a variant of its own, so that the ratio-4 launches (a block
 * per window, 512 a chunk; comp_pool4) keep their occupancy. */
template <bool BATCHED> static __global__ void comp_emit_kernel(comp_args a) {
    dev_pdl_launch_next();
    __shared__ float x[512];
    const comp_lane &L = a.lane[blockIdx.y];
    norm_w nw = block_norm_weights(L.norm, L.norm_type, L.hd);
    rope_to_l2(a.rope);
    uint32_t first, pos0 = comp_pass_start(a, &first), ratio = L.ratio, hd = L.hd;
    uint32_t w = pos0 / ratio + blockIdx.x;   /* window index */
    if ((w + 1) * ratio > pos0 + a.T) return; /* does not close in this pass */
    long long ws = (long long)w * ratio;
    bool in_pass = BATCHED && ratio % CP_BATCH == 0 && ws >= pos0;
    for (uint32_t j = threadIdx.x; j < hd; j += blockDim.x) {
        if (in_pass) {
            uint32_t nf = first > ws ? (uint32_t)(first - ws) : 0;
            x[j] = comp_pool_pass(L, (uint32_t)(ws - pos0), nf < ratio ? nf : ratio, j);
            continue;
        }
        if (ratio == 4) {
            x[j] = comp_pool4(L, pos0, first, ws, j);
            continue;
        }
        float mx = SCORE_NEG_INF;
        for (uint32_t r = 0; r < ratio; r++) {
            float kv, sc;
            comp_fetch(L, pos0, first, ws + r, j, &kv, &sc);
            mx = fmaxf(mx, sc);
        }
        float sum = 0.0f, acc = 0.0f;
        for (uint32_t r = 0; r < ratio; r++) {
            float kv, sc;
            comp_fetch(L, pos0, first, ws + r, j, &kv, &sc);
            float e = expf(sc - mx);
            sum += e;
            acc += e * kv;
        }
        x[j] = sum > 0.0f ? acc / sum : 0.0f;
    }
    __syncthreads();
    block_rmsnorm(x, hd, nw, a.eps);
    block_rope(x, hd, a.rope, (uint32_t)ws, false);
    if (a.sim) {
        if (L.indexer) block_qat128(x);
        else block_fp8_roundtrip(x, hd - a.rope_dim);
    }
    float *out = L.rows + (size_t)w * hd;
    for (uint32_t j = threadIdx.x; j < hd; j += blockDim.x) out[j] = x[j];
}

/* Rebuild the frontier in canonical form (MODEL.md 6.2) after the pass;
 * a thread owns a column, so rows can move (ratio 4: the current window
 * becoming the previous one) without races. */
static __global__ void comp_frontier_kernel(comp_args a) {
    dev_pdl_launch_next();
    uint32_t first, pos0 = comp_pass_start(a, &first);
    const comp_lane &L = a.lane[blockIdx.y];
    uint32_t n = pos0 + a.T, ratio = L.ratio;
    /* no window closed in this pass: only the pass's own positions change
     * (rows past the partial window are already empty) */
    bool same_window = n / ratio == pos0 / ratio;
    for (uint32_t col = blockIdx.x * blockDim.x + threadIdx.x; col < L.width; col += gridDim.x * blockDim.x) {
        uint32_t kn = n / ratio, rem = n % ratio;
        if (same_window) {
            for (uint32_t p = pos0; p < n; p++) {
                uint32_t R = ratio == 4 ? 4 + p % 4 : p % ratio;
                float kv, sc;
                comp_fetch(L, pos0, first, p, col, &kv, &sc);
                L.skv[(size_t)R * L.width + col] = kv;
                L.ssc[(size_t)R * L.width + col] = sc;
            }
        } else if (ratio == 4) {
            float kv[8], sc[8];
            for (uint32_t R = 0; R < 8; R++) {
                long long p;
                bool live;
                if (R < 4) {
                    p = (long long)kn * 4 - 4 + R;
                    live = kn >= 1;
                } else {
                    p = (long long)kn * 4 + (R - 4);
                    live = R - 4 < rem;
                }
                if (live) comp_fetch(L, pos0, first, p, col, &kv[R], &sc[R]);
                else {
                    kv[R] = 0.0f;
                    sc[R] = SCORE_NEG_INF;
                }
            }
            for (uint32_t R = 0; R < 8; R++) {
                L.skv[(size_t)R * L.width + col] = kv[R];
                L.ssc[(size_t)R * L.width + col] = sc[R];
            }
        } else {
            for (uint32_t R = 0; R < ratio; R++) {
                long long p = (long long)kn * ratio + R;
                float kv = 0.0f, sc = SCORE_NEG_INF;
                if (R < rem) comp_fetch(L, pos0, first, p, col, &kv, &sc); /* window kn: in the pass or folded */
                L.skv[(size_t)R * L.width + col] = kv;
                L.ssc[(size_t)R * L.width + col] = sc;
            }
        }
    }
}

int cu_comp_emit(const comp_args *a, uint32_t nwin, bool batched, cudaStream_t st, ds4_err *err) {
    if (nwin == 0) return 0;
    if (batched) DS4_LAUNCH(comp_emit_kernel<true>, dim3(nwin, a->n_lanes), 256, 0, st, *a);
    else DS4_LAUNCH(comp_emit_kernel<false>, dim3(nwin, a->n_lanes), 256, 0, st, *a);
    CU_LAUNCHED();
    return 0;
}

/* The compressor lanes of layer il (the attention's; at a ratio-4 layer
 * also the indexer's) for a pass of T tokens whose first is `back` before
 * the step's position (decode: in a decode step). */
static void comp_setup(cuda_backend *b, uint32_t il, uint32_t T, uint32_t back, bool decode, comp_args *a) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    const dlstate *S = &b->sq->L[il];
    uint32_t ratio = S->ratio;
    memset(a, 0, sizeof(*a));
    a->T = T;
    a->back = back;
    a->rope_dim = c->rope_dim;
    a->pos0 = &b->sq->d_step->pos;
    a->pos_early = cu_pos_early(b, decode ? 1 : T);
    a->rope = b->rope_comp;
    a->eps = c->rms_eps;
    a->sim = b->sim;
    comp_lane *L = &a->lane[0];
    L->skv = S->comp_kv;
    L->ssc = S->comp_score;
    L->ckv = b->ckv;
    L->cgate = b->cgate;
    L->ape = w->comp_ape.p;
    L->ape_type = w->comp_ape.type;
    L->norm = w->comp_norm.p;
    L->norm_type = w->comp_norm.type;
    L->rows = S->comp;
    L->hd = c->head_dim;
    L->width = ds4_compress_coff(ratio) * c->head_dim;
    L->ratio = ratio;
    a->n_lanes = 1;
    if (ratio == 4) {
        L = &a->lane[1];
        L->skv = S->idx_kv;
        L->ssc = S->idx_score;
        L->ckv = b->ikv;
        L->cgate = b->igate;
        L->ape = w->idx_ape.p;
        L->ape_type = w->idx_ape.type;
        L->norm = w->idx_norm.p;
        L->norm_type = w->idx_norm.type;
        L->rows = S->idx;
        L->hd = c->idx_head_dim;
        L->width = 2 * c->idx_head_dim;
        L->ratio = 4;
        L->indexer = true;
        a->n_lanes = 2;
    }
}

static int comp_frontier(const comp_args *a, cudaStream_t st, ds4_err *err) {
    DS4_LAUNCH(comp_frontier_kernel, dim3((a->lane[0].width + 255) / 256, a->n_lanes), 256, 0, st, *a);
    CU_LAUNCHED();
    return 0;
}

int cu_compress(cuda_backend *b, uint32_t il, uint32_t T, uint32_t pos0, bool decode, cudaStream_t st,
                cudaEvent_t emitted, ds4_err *err) {
    uint32_t ratio = b->sq->L[il].ratio;
    comp_args a;
    comp_setup(b, il, T, 0, decode, &a);
    /* windows that can close: in a pass sized for any position (decode,
     * a captured step) as many as T rows can close, partly the frontier's
     * (the unbatched pooling; the blocks of windows that do not close
     * return); ratio 4 pools by comp_pool4 either way */
    uint32_t nwin = decode ? (T + ratio - 1) / ratio : (pos0 + T) / ratio - pos0 / ratio;
    if (cu_comp_emit(&a, nwin, !decode && ratio != 4, st, err)) return -1;
    if (emitted) CU_TRY(cudaEventRecord(emitted, st));
    return comp_frontier(&a, st, err);
}

/* The compressors' projections of layer il (the attention's; at a ratio-4
 * layer also the indexer's) of T tokens, x's rows, into the pass buffers
 * by the tensor-core product: a prefill pass's, a deferred layer's window. */
int cu_comp_products(cuda_backend *b, uint32_t il, const dact *x, uint32_t T, cudaStream_t st, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    uint32_t width = ds4_compress_coff(b->sq->L[il].ratio) * c->head_dim, iw2 = 2 * c->idx_head_dim;
    if (cu_gemm(&w->comp_kv, 0, 0, width, x, 0, T, b->ckv, width, NULL, b->split, st, err) ||
        cu_gemm(&w->comp_gate, 0, 0, width, x, 0, T, b->cgate, width, NULL, b->split, st, err))
        return -1;
    if (b->sq->L[il].ratio == 4 && (cu_gemm(&w->idx_kv, 0, 0, iw2, x, 0, T, b->ikv, iw2, NULL, b->split, st, err) ||
                                    cu_gemm(&w->idx_gate, 0, 0, iw2, x, 0, T, b->igate, iw2, NULL, b->split, st, err)))
        return -1;
    return 0;
}

/* Rows of a deferred layer's window from row r as an activation (f32 alone:
 * the compressors' weights are float rows, cu_win_fits). */
static dact window_rows(const cuda_backend *b, const dlstate *S, uint32_t r) {
    dact x;
    memset(&x, 0, sizeof(x));
    x.f = S->win + (size_t)r * b->cfg->n_embd;
    x.n = b->cfg->n_embd;
    x.fs = b->cfg->n_embd;
    return x;
}

/* dst <- src, n floats (a multiple of 4), by one block: a kernel rather
 * than a copy node, so that the graph's launches chain as everywhere. */
static __global__ void copy_row_kernel(float *dst, const float *src, uint32_t n) {
    dev_pdl_enter();
    for (uint32_t i = threadIdx.x; i < n / 4; i += blockDim.x) ((float4 *)dst)[i] = ((const float4 *)src)[i];
}

/* The window closing at the step: a ratio-4 one is CU_WIN_T rows, whose
 * products read each weight row once (gemv_window_kernel: 20 MB of F16
 * rows of Flash's, as a step's own projections); a ratio-128 one takes
 * the tensor-core product, once in 128 steps, after the step's input
 * joins the others in the window's last row. */
int cu_compress_window(cuda_backend *b, uint32_t il, cudaStream_t st, cudaEvent_t emitted, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    const dlstate *S = &b->sq->L[il];
    uint32_t ratio = S->ratio, D = c->n_embd;
    if (ratio == CU_WIN_T) {
        uint32_t width = ds4_compress_coff(ratio) * c->head_dim, iw2 = 2 * c->idx_head_dim;
        cu_win_plan p;
        memset(&p, 0, sizeof(p));
        for (uint32_t t = 0; t + 1 < CU_WIN_T; t++) p.x[t] = S->win + (size_t)t * D;
        p.x[CU_WIN_T - 1] = b->xn.f;
        if (cu_win_add(&p, &w->comp_kv, width, b->ckv, width, err) ||
            cu_win_add(&p, &w->comp_gate, width, b->cgate, width, err) ||
            cu_win_add(&p, &w->idx_kv, iw2, b->ikv, iw2, err) ||
            cu_win_add(&p, &w->idx_gate, iw2, b->igate, iw2, err) || cu_win_run(&p, st, err))
            return -1;
    } else {
        DS4_LAUNCH(copy_row_kernel, 1, 256, 0, st, S->win + (size_t)(ratio - 1) * D, (const float *)b->xn.f, D);
        CU_LAUNCHED();
        dact x = window_rows(b, S, 0);
        if (cu_comp_products(b, il, &x, ratio, st, err)) return -1;
    }
    comp_args a;
    comp_setup(b, il, ratio, ratio - 1, true, &a);
    a.fold = &b->sq->d_step->fold;
    if (cu_comp_emit(&a, 1, ratio != 4, st, err)) return -1;
    if (emitted) CU_TRY(cudaEventRecord(emitted, st));
    return comp_frontier(&a, st, err);
}

int cu_comp_flush(cuda_backend *b, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t n = b->sq->n_tokens;
    if (b->sq->fold >= n) return 0;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        const dlstate *S = &b->sq->L[il];
        if (!S->win) continue;
        uint32_t start = n / S->ratio * S->ratio;
        if (start < b->sq->fold) start = b->sq->fold;
        if (start >= n) continue;
        /* positions [start, n): the window's rows from start % ratio, a
         * pass that closes no window, so the frontier alone */
        comp_args a;
        dact x = window_rows(b, S, start % S->ratio);
        if (cu_comp_products(b, il, &x, n - start, b->st, err)) return -1;
        comp_setup(b, il, n - start, n - start, false, &a);
        if (comp_frontier(&a, b->st, err)) return -1;
    }
    if (cu_set_step(b, STEP_FOLD, n, 0, err)) return -1;
    b->sq->fold = n;
    return 0;
}

/* ----------------------------------------------------------- attention */

/* All heads of a query attend over the same visible rows (one KV row per
 * position serves every head), so the work is shaped around loading each
 * row as few times as possible:
 *   attn_heads_kernel  a warp carries H (2) heads, so each row it loads
 *       serves all of them; the ATB_WARPS warps of a block take consecutive
 *       shares of the block's rows and are merged through shared memory.
 *       In a decode step (T = 1) the rows are also split over blocks, so
 *       that head groups x splits ~ 128 blocks fill the GPU, and the
 *       block of a head group that finishes last merges the splits and
 *       writes the heads (the "last block" pattern of hc_mix_kernel: no
 *       second launch).  Short prefill passes use it with one split.
 *   attn_tc_kernel  long prefill passes (T > CU_ATTN_BLOCKED_T): a block
 *       per query and 64 heads, the products on the tensor cores (below).
 * Scores and the softmax are f32 (the tensor-core products to f32
 * precision).  Order of the sums: online softmaxes over batches of rows,
 * merged in fixed order (the CPU takes the maximum over all rows first),
 * so the result is deterministic but not the CPU's bits. */
#define ATT_MAXV      16 /* values per lane: head_dim <= 512, a multiple of 64 */
#define ATB_WARPS     8
#define ATB_CBATCH    2  /* partial results a warp of the last block loads at once */
#define ATB_PREF_ROWS 32 /* row addresses a warp holds, one a lane */

/* Floats of one partial result of attn_heads_kernel with h heads a warp
 * (16-byte aligned: h is even and hd a multiple of 64). */
static __host__ __device__ __forceinline__ size_t attn_part_floats(uint32_t h, uint32_t hd) {
    return (size_t)h * (2 + hd);
}

/* Compressed row i of query t's list: ratio 4 the indexer's choice, ratio
 * 128 every complete one in order. */
static __device__ __forceinline__ uint32_t attn_comp_row(const attn_args &a, uint32_t t, uint32_t i) {
    return a.ratio == 4 ? a.vis[(size_t)t * a.top_k + i] : i;
}

/* Row i of query t's visible list: raw window first, then compressed rows. */
static __device__ __forceinline__ const float *attn_row(const attn_args &a, uint32_t t, uint32_t p, uint32_t pos0,
                                                        uint32_t first, uint32_t n_raw, uint32_t i) {
    if (i < n_raw) {
        uint32_t r = first + i;
        return r >= pos0 ? a.kvbuf + (size_t)(r - pos0) * a.hd : a.ring + (size_t)(r % a.raw_cap) * a.hd;
    }
    return a.comp + (size_t)attn_comp_row(a, t, i - n_raw) * a.hd;
}

/* The compressed rows query t (at position p) sees. */
static __device__ __forceinline__ uint32_t attn_comp_count(const attn_args &a, uint32_t t, uint32_t p) {
    return a.ratio == 0 ? 0 : a.ratio == 4 ? a.nvis[t] : (p + 1) / a.ratio;
}

/* The raw window of the query at position p: from `first`, n_raw rows. */
static __device__ __forceinline__ void attn_raw(const attn_args &a, uint32_t p, uint32_t *first, uint32_t *n_raw) {
    *first = p + 1 > a.window ? p + 1 - a.window : 0;
    *n_raw = p + 1 - *first;
}

/* The visible rows of query t: raw window from `first`, n_raw of them,
 * then the compressed ones; returns the count. */
static __device__ __forceinline__ uint32_t attn_rows(const attn_args &a, uint32_t t, uint32_t p, uint32_t *first,
                                                     uint32_t *n_raw) {
    attn_raw(a, p, first, n_raw);
    return *n_raw + attn_comp_count(a, t, p);
}

/* The same with the most compressed rows a ratio-4 query can have listed
 * (the top_k or every complete one), known without the list's count. */
static __device__ __forceinline__ uint32_t attn_rows_bound(const attn_args &a, uint32_t p, uint32_t *first,
                                                           uint32_t *n_raw) {
    attn_raw(a, p, first, n_raw);
    uint32_t n_comp = a.ratio == 0 ? 0 : (p + 1) / a.ratio;
    return *n_raw + (a.ratio == 4 && n_comp > a.top_k ? a.top_k : n_comp);
}

/* A warp holds a row of hd = 32 per values (per even) as groups of VW
 * consecutive values, VW = 4 where per allows it and 2 otherwise: group i
 * of lane l is elements VW (32 i + l) .., so each load or store of the
 * warp covers 32 VW consecutive floats (whole sectors).  Value k of a lane
 * is element attn_lane_e(per, lane, k). */
static __device__ __forceinline__ uint32_t attn_lane_e(uint32_t per, unsigned lane, int k) {
    return per % 4 == 0 ? 4 * (32 * (k / 4) + lane) + k % 4 : 2 * (32 * (k / 2) + lane) + k % 2;
}

/* The lane's values of the row at v (zeros when !on), in wide loads. */
static __device__ __forceinline__ void attn_lane_load(const float *v, bool on, uint32_t per, float *out) {
    unsigned lane = threadIdx.x & 31;
    if (per % 4 == 0) {
#pragma unroll
        for (int j = 0; j < ATT_MAXV; j += 4) {
            const float4 *p4 = (const float4 *)(v + attn_lane_e(per, lane, j));
            float4 x = on && (uint32_t)j < per ? *p4 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            out[j] = x.x;
            out[j + 1] = x.y;
            out[j + 2] = x.z;
            out[j + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < ATT_MAXV; j += 2) {
            const float2 *p2 = (const float2 *)(v + attn_lane_e(per, lane, j));
            float2 x = on && (uint32_t)j < per ? *p2 : make_float2(0.0f, 0.0f);
            out[j] = x.x;
            out[j + 1] = x.y;
        }
    }
}

/* The lane's values into the row at v, in wide stores. */
static __device__ __forceinline__ void attn_lane_store(float *v, uint32_t per, const float *in) {
    unsigned lane = threadIdx.x & 31;
    if (per % 4 == 0) {
#pragma unroll
        for (int j = 0; j < ATT_MAXV; j += 4)
            if ((uint32_t)j < per)
                *(float4 *)(v + attn_lane_e(per, lane, j)) = make_float4(in[j], in[j + 1], in[j + 2], in[j + 3]);
    } else {
#pragma unroll
        for (int j = 0; j < ATT_MAXV; j += 2)
            if ((uint32_t)j < per) *(float2 *)(v + attn_lane_e(per, lane, j)) = make_float2(in[j], in[j + 1]);
    }
}

static __device__ __forceinline__ uint32_t attn_min(uint32_t x, uint32_t y) { return x < y ? x : y; }

/* The factor that brings a sum kept against maximum m to maximum M >= m
 * (0 for an empty sum, m = -inf, even when M is -inf too). */
static __device__ __forceinline__ float attn_rescale(float m, float M) { return m == -INFINITY ? 0.0f : expf(m - M); }

/* Q8_0 of the lane's values i .. i + VW - 1 (a group, at element e): a
 * block of 32 is the group of 32 / VW consecutive lanes (amax / 127, round
 * to nearest even, as dev_quantize_row). */
template <int VW>
static __device__ __forceinline__ void attn_q8_group(const float (&o)[ATT_MAXV], int i, uint32_t e, int8_t *qo,
                                                     float *qd) {
    constexpr unsigned LANES = 32 / VW;
    float amax = 0.0f;
#pragma unroll
    for (int c = 0; c < VW; c++) amax = fmaxf(amax, fabsf(o[i + c]));
#pragma unroll
    for (unsigned span = 1; span < LANES; span *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, span));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    uint32_t w = 0;
#pragma unroll
    for (int c = 0; c < VW; c++) w |= (uint32_t)(uint8_t)q8_round(o[i + c] * id) << (8 * c);
    if (VW == 4) *(uint32_t *)(qo + e) = w;
    else *(uint16_t *)(qo + e) = (uint16_t)w;
    if ((threadIdx.x & 31) % LANES == 0) qd[e / 32] = d;
}

/* Normalise, undo the key RoPE at the query position (frequencies freq:
 * a.rope.inv_freq or a copy in shared memory), write the head's output and
 * its Q8_0 activation blocks.  The lane holds its per = hd / 32 values of
 * the attn_lane_e layout (per is a constant where the caller's is:
 * inlined, the guards on it fold away). */
static __device__ __forceinline__ void finish_head(const attn_args &a, uint32_t per, uint32_t t, uint32_t h, uint32_t p,
                                                   const float *freq, float (&o)[ATT_MAXV], float den) {
    unsigned lane = threadIdx.x & 31;
    uint32_t hd = 32 * per, tail0 = hd - a.rope_dim;
#pragma unroll
    for (int i = 0; i < ATT_MAXV; i++)
        if ((uint32_t)i < per) o[i] /= den;
#pragma unroll
    for (int i = 0; i < ATT_MAXV; i += 2) {
        uint32_t e = attn_lane_e(per, lane, i); /* even: a pair never straddles two groups */
        if ((uint32_t)i < per && e >= tail0) {
            uint32_t k = (e - tail0) / 2;
            float theta = (float)p * freq[k];
            float c = cosf(theta), s = -sinf(theta);
            float x0 = o[i], x1 = o[i + 1];
            o[i] = x0 * c - x1 * s;
            o[i + 1] = x0 * s + x1 * c;
        }
    }
    if (a.heads.f) attn_lane_store(a.heads.f + (size_t)t * a.heads.fs + (size_t)h * hd, per, o);
    if (!a.heads.q8) return;
    int8_t *qo = (int8_t *)(a.heads.q8 + (size_t)t * a.heads.q8s) + (size_t)h * hd;
    float *qd = (float *)(a.heads.q8 + (size_t)t * a.heads.q8s + a.heads.n) + (size_t)h * per;
    if (per % 4 == 0) {
#pragma unroll
        for (int i = 0; i < ATT_MAXV; i += 4)
            if ((uint32_t)i < per) attn_q8_group<4>(o, i, attn_lane_e(per, lane, i), qo, qd);
    } else {
#pragma unroll
        for (int i = 0; i < ATT_MAXV; i += 2)
            if ((uint32_t)i < per) attn_q8_group<2>(o, i, attn_lane_e(per, lane, i), qo, qd);
    }
}

/* Merge the sink into a head's sum (maximum m, sum l, lane values o) and
 * finish it. */
static __device__ __forceinline__ void attn_sink_finish(const attn_args &a, uint32_t per, uint32_t t, uint32_t h,
                                                        uint32_t p, float (&o)[ATT_MAXV], float m, float l) {
    float sink = a.sinks[h], M = fmaxf(sink, m), c = attn_rescale(m, M);
    float den = expf(sink - M) + l * c;
#pragma unroll
    for (int j = 0; j < ATT_MAXV; j++) o[j] *= c;
    finish_head(a, per, t, h, p, a.rope.inv_freq, o, den);
}

/* The last block's loads of parts s0 .. (ATB_CBATCH of them, to se) of a
 * head group's nparts (part stride pf floats): head j's maximum and sum,
 * and the lane's values in slot order (one coalesced load per value);
 * an empty slot holds -inf and zeros. */
template <int H>
static __device__ __forceinline__ void attn_load_parts(const float *pg, size_t pf, unsigned j, uint32_t s0, uint32_t se,
                                                       uint32_t per, uint32_t hd, float (&ml)[ATB_CBATCH][2],
                                                       float (&ov)[ATB_CBATCH][ATT_MAXV]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < ATB_CBATCH; u++) {
        bool su = s0 + u < se;
        const float *ps = pg + (su ? s0 + u : s0) * pf;
        ml[u][0] = su ? __ldcg(ps + j) : -INFINITY;
        ml[u][1] = su ? __ldcg(ps + H + j) : 0.0f;
#pragma unroll
        for (int k = 0; k < ATT_MAXV; k++)
            ov[u][k] = su && (uint32_t)k < per ? __ldcg(ps + 2 * H + (size_t)j * hd + 32 * k + lane) : 0.0f;
    }
}

/* Grid (head groups of H, queries, splits of the rows).  A warp keeps H
 * heads' online softmax over its share of the block's rows.  The warps'
 * results meet in shared memory and the block's threads merge them value
 * by value (one barrier, conflict-free: value k of lane l at slot
 * 32 k + l); with one split the block finishes
 * its heads, otherwise it stores its partial result and the last block of
 * the head group merges them all.  Template parameters (the configuration
 * is chosen at the launch, in cu_attend):
 *   H       heads per warp (each row a warp loads serves all of them)
 *   MINB    blocks per SM the registers are budgeted for
 *   BATCH   rows whose loads a warp issues before using any
 *   PER     values a lane holds (head_dim / 32), or 0 to take it from the
 *           arguments: Flash's 16 as a constant leaves the per-value loops
 *           without guards or the two-wide layout's branches
 * Lane l holds the address of the warp's row ib + l of the current
 * ATB_PREF_ROWS and loads those of the next ones meanwhile, so the vis[]
 * load a ratio-4 row's address depends on never sits between a batch and
 * its row loads; the first addresses are requested before the q loads,
 * which then overlap them. */
template <int H, int MINB, int BATCH, int PER>
static __global__ void __launch_bounds__(ATB_WARPS * 32, MINB) attn_heads_kernel(attn_args a) {
    static_assert(ATB_PREF_ROWS % BATCH == 0 && ATB_PREF_ROWS <= 32, "a batch takes its addresses from one set");
    if (a.sink.sums && blockIdx.x == gridDim.x - 1) { /* the hosted Sinkhorn (cuda_sinkhorn.cuh): one block */
        dev_pdl_launch_next();
        if (blockIdx.y == 0 && blockIdx.z == 0) hc_sink_job_run(a.sink);
        return;
    }
    if (a.nsplit > 1) { /* what the last block reads that is cold by then: into the L2 while the launch before runs */
        if (threadIdx.x == 0) prefetch_l2(a.sinks + blockIdx.x * H);
        rope_to_l2(a.rope);
    }
    dev_pdl_launch_next();
    uint32_t pos0 = dev_pdl_wait_pos(a.pos0, a.pos_early);
    __shared__ __align__(16) float xo[ATB_WARPS][H][ATT_MAXV * 32];
    __shared__ float xm[ATB_WARPS][H], xl[ATB_WARPS][H], fm[H], fl[H];
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    uint32_t g = blockIdx.x, t = blockIdx.y, split = blockIdx.z, h0 = g * H;
    uint32_t p = pos0 + t, first, n_raw;
    /* The split's rows, then the warp's share of them, are cut from the
     * most rows the query can see, so that the first row addresses (a
     * ratio-4 row's from vis[]) are asked for with the count of its
     * compressed rows rather than after it; the rows past the count are
     * then left out (w1). */
    uint32_t bound = attn_rows_bound(a, p, &first, &n_raw);
    uint32_t nparts = a.nsplit, part = split;
    uint32_t per_part = (bound + nparts - 1) / nparts;
    uint32_t w0 = attn_min(part * per_part, bound), w1 = attn_min(w0 + per_part, bound);
    {
        uint32_t i0 = w0, i1 = w1, per_warp = (i1 - i0 + ATB_WARPS - 1) / ATB_WARPS;
        w0 = attn_min(i0 + warp * per_warp, i1);
        w1 = attn_min(w0 + per_warp, i1);
    }
    const uint32_t per = PER ? (uint32_t)PER : a.hd / 32, hd = 32 * per;
    float scale = 1.0f / sqrtf((float)hd);
    unsigned long long rnext = 0, rcur = 0; /* rows' addresses, as integers for the shuffle */
    if (lane < ATB_PREF_ROWS && w0 + lane < w1)
        rnext = (unsigned long long)(size_t)attn_row(a, t, p, pos0, first, n_raw, w0 + lane);
    w1 = attn_min(w1, n_raw + attn_comp_count(a, t, p)); /* an address past the count is never loaded from */
    float q[H][ATT_MAXV], o[H][ATT_MAXV], m[H], l[H];
#pragma unroll
    for (int j = 0; j < H; j++) {
        bool on = h0 + j < a.n_head; /* a missing head of the last group: zeros, never written */
        attn_lane_load(a.q + ((size_t)t * a.n_head + (on ? h0 + j : 0)) * hd, on, per, q[j]);
#pragma unroll
        for (int k = 0; k < ATT_MAXV; k++) o[j][k] = 0.0f;
        m[j] = -INFINITY;
        l[j] = 0.0f;
    }
    for (uint32_t ib = w0; ib < w1; ib += BATCH) {
        if ((ib - w0) % ATB_PREF_ROWS == 0) {
            rcur = rnext;
            uint32_t n = ib + ATB_PREF_ROWS + lane;
            rnext = lane < ATB_PREF_ROWS && n < w1
                        ? (unsigned long long)(size_t)attn_row(a, t, p, pos0, first, n_raw, n)
                        : 0;
        }
        /* the loads of BATCH rows first, each row then serves every head */
        float rv[BATCH][ATT_MAXV];
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            bool on = ib + u < w1;
            const float *rp = (const float *)(size_t)__shfl_sync(0xffffffffu, rcur,
                                                                 (int)((ib - w0 + u) % ATB_PREF_ROWS));
            attn_lane_load(rp, on, per, rv[u]);
        }
        float sc[BATCH][H];
#pragma unroll
        for (int u = 0; u < BATCH; u++)
#pragma unroll
            for (int j = 0; j < H; j++) {
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < ATT_MAXV; k++)
                    if ((uint32_t)k < per) s += q[j][k] * rv[u][k];
                sc[u][j] = s;
            }
#pragma unroll
        for (int u = 0; u < BATCH; u++)
#pragma unroll
            for (int j = 0; j < H; j++) sc[u][j] = ib + u < w1 ? warp_sum(sc[u][j]) * scale : -INFINITY;
                /* one rescale per batch: to the batch's maximum when it is larger */
#pragma unroll
        for (int j = 0; j < H; j++) {
            float mb = sc[0][j];
#pragma unroll
            for (int u = 1; u < BATCH; u++) mb = fmaxf(mb, sc[u][j]);
            if (mb > m[j]) {
                float c = attn_rescale(m[j], mb);
                l[j] *= c;
#pragma unroll
                for (int k = 0; k < ATT_MAXV; k++) o[j][k] *= c;
                m[j] = mb;
            }
        }
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            if (ib + u >= w1) break;
#pragma unroll
            for (int j = 0; j < H; j++) {
                float e = expf(sc[u][j] - m[j]);
                l[j] += e;
#pragma unroll
                for (int k = 0; k < ATT_MAXV; k++) o[j][k] += e * rv[u][k];
            }
        }
    }
    /* Every warp's (m, l, o) into shared memory and one barrier; then the
     * block's threads merge them value by value (each head against the
     * largest of its warps' maxima, the warps added in order), rather than
     * in a tree of barriers. */
#pragma unroll
    for (int j = 0; j < H; j++) {
        if (lane == 0) {
            xm[warp][j] = m[j];
            xl[warp][j] = l[j];
        }
#pragma unroll
        for (int k = 0; k < ATT_MAXV; k++)
            if ((uint32_t)k < per) xo[warp][j][32 * k + lane] = o[j][k];
    }
    __syncthreads();
    size_t pf = attn_part_floats(H, hd), gi = (size_t)t * gridDim.x + g;
    float *pp = a.nsplit > 1 ? a.part + (gi * nparts + part) * pf : NULL;
    uint32_t nv = 32 * per; /* a head's values, in slot order 32 k + lane */
#pragma unroll
    for (int j = 0; j < H; j++) {
        float M = -INFINITY, c[ATB_WARPS];
#pragma unroll
        for (int w = 0; w < ATB_WARPS; w++) M = fmaxf(M, xm[w][j]);
#pragma unroll
        for (int w = 0; w < ATB_WARPS; w++) c[w] = attn_rescale(xm[w][j], M);
        if (threadIdx.x == 0) {
            float sl = 0.0f;
#pragma unroll
            for (int w = 0; w < ATB_WARPS; w++) sl += xl[w][j] * c[w];
            if (pp) {
                pp[j] = M;
                pp[H + j] = sl;
            } else {
                fm[j] = M;
                fl[j] = sl;
            }
        }
        for (uint32_t slot = threadIdx.x; slot < nv; slot += blockDim.x) {
            float v = 0.0f;
#pragma unroll
            for (int w = 0; w < ATB_WARPS; w++) v += xo[w][j][slot] * c[w];
            if (pp) pp[2 * H + (size_t)j * hd + slot] = v;
            else xo[0][j][slot] = v; /* this thread's own slot: read by no other */
        }
    }
    if (!pp) {
        /* one split: a warp finishes each head */
        __syncthreads();
        if (warp < H && h0 + warp < a.n_head) {
            float v[ATT_MAXV];
#pragma unroll
            for (int k = 0; k < ATT_MAXV; k++) v[k] = (uint32_t)k < per ? xo[0][warp][32 * k + lane] : 0.0f;
            attn_sink_finish(a, per, t, h0 + warp, p, v, fm[warp], fl[warp]);
        }
        return;
    }
    if (!dev_last_block(a.count + gi, a.nsplit)) return;
    /* The last block: warp w merges head w % H over slice w / H of the
     * parts, against the largest maximum of all of them and the sink (a
     * maximum is exact in any order), so the slices simply add.  Its loads
     * go out in one round trip: the sink, every part's maximum, the
     * slice's first parts and the RoPE's frequencies (cold in the L2 by
     * then), which finish_head reads from shared memory. */
    constexpr unsigned NSL = ATB_WARPS / H;
    unsigned j = warp % H, hv = warp / H;
    bool on = h0 + j < a.n_head;
    const float *pg = a.part + gi * nparts * pf;
    uint32_t nh = (nparts + NSL - 1) / NSL, sb = attn_min(hv * nh, nparts), se = attn_min(sb + nh, nparts);
    __shared__ float freq[ATT_MAXV * 16]; /* the RoPE's, rope_dim / 2 <= hd / 2 */
    float fv = threadIdx.x < a.rope_dim / 2 ? a.rope.inv_freq[threadIdx.x] : 0.0f;
    float sink = on ? a.sinks[h0 + j] : 0.0f;
    float mx = lane < nparts ? __ldcg(pg + lane * pf + j) : -INFINITY;
    float ml[ATB_CBATCH][2], ov[ATB_CBATCH][ATT_MAXV];
    attn_load_parts<H>(pg, pf, j, sb, se, per, hd, ml, ov);
    float M = fmaxf(sink, warp_max(mx));
    for (uint32_t s0 = 32; s0 < nparts; s0 += 32) {
        uint32_t s = s0 + lane;
        M = fmaxf(M, warp_max(s < nparts ? __ldcg(pg + s * pf + j) : -INFINITY));
    }
    float den = 0.0f, v[ATT_MAXV];
#pragma unroll
    for (int k = 0; k < ATT_MAXV; k++) v[k] = 0.0f;
    for (uint32_t s0 = sb;;) { /* empty slots add zeros */
#pragma unroll
        for (int u = 0; u < ATB_CBATCH; u++) {
            float c = attn_rescale(ml[u][0], M);
            den += ml[u][1] * c;
#pragma unroll
            for (int k = 0; k < ATT_MAXV; k++) v[k] += ov[u][k] * c;
        }
        s0 += ATB_CBATCH;
        if (s0 >= se) break;
        attn_load_parts<H>(pg, pf, j, s0, se, per, hd, ml, ov);
    }
    if (threadIdx.x < a.rope_dim / 2) freq[threadIdx.x] = fv;
    if (hv > 0) {
        if (lane == 0) xl[hv - 1][j] = den;
#pragma unroll
        for (int k = 0; k < ATT_MAXV; k++)
            if ((uint32_t)k < per) xo[hv - 1][j][32 * k + lane] = v[k];
    }
    __syncthreads();
    if (hv == 0 && on) {
#pragma unroll
        for (unsigned s = 0; s + 1 < NSL; s++) {
#pragma unroll
            for (int k = 0; k < ATT_MAXV; k++)
                if ((uint32_t)k < per) v[k] += xo[s][j][32 * k + lane];
            den += xl[s][j];
        }
        finish_head(a, per, t, h0 + j, p, freq, v, expf(sink - M) + den);
    }
}

/* Long prefill passes on the FP16 tensor cores, flash-attention style: a
 * block is one query and ATC_HEADS heads (M = heads: every head of a query
 * reads the same rows), walking the rows in chunks of ATC_ROWS.  Per chunk:
 * the rows into shared memory, S = Q K^T (a warp 16 heads x 16 rows over
 * half the head dimension, the halves summed through shared memory), the
 * online softmax (eight threads a head), O = O c + P V (a warp 16 heads x
 * a quarter of the head dimension, in registers).  The products keep f32
 * precision: Q and P are held as binary16 head and tail (split once: Q at
 * the start, P by the softmax), and a row value goes in as one binary16
 * where it is one already - the simulations' f16 raw rows and the FP8
 * parts of compressed rows - or as head and tail otherwise (a third
 * product), decided per chunk for the values before and in the RoPE
 * tail.  Q and P are scaled by 2^8 (undone exactly on the scores and on
 * O) so that their small values keep their precision above the binary16
 * subnormals; Q is RMS-normalised (|q| <= sqrt(hd) before the scale) and
 * P <= 1, so neither can overflow.  Rows are taken unscaled: they are
 * RMS-normalised too (the KV and compressor norms, weighted).
 *
 * The rows are split once a pass, before the launch (atc_prep_kernel:
 * pieces of 8 values as their 8 binary16 heads followed by their 8 tails,
 * and in the row's padding a flag word telling which tails are non-zero),
 * and a chunk's rows are copied as they are.  The products take their row
 * operands with ldmatrix (K for the scores, transposed for V), so no warp
 * converts a row value (before, every query's block split each of its
 * rows again).  Q and P are binary16 pairs in k order, their fragments
 * ldmatrix loads too (row strides of 1040 and 80 bytes: the eight rows of
 * a piece on eight bank groups).  At the end O goes through shared memory
 * to the per-head finish of the other kernel. */
#define ATC_HEADS 64
#define ATC_ROWS  32
#define ATC_WARPS 16
#define ATC_PAD   4 /* row stride hd + 4 floats (ldmatrix: 8 rows on 8 bank groups); a head's Q words hd / 2 + 4 */
#define ATC_PIECE 8 /* row values a thread copies and splits together */
#define ATC_PLD   (ATC_ROWS + ATC_PAD) /* f32 scores a head */
#define ATC_PW    (ATC_ROWS / 2 + 4)   /* P words a head (20: ldmatrix rows on 8 bank groups) */
#define ATC_SCALE 256.0f               /* Q and P scale, 2^8 */
static_assert(ATC_ROWS == 32, "a chunk's row table is made by one warp");

static size_t attn_tc_smem(uint32_t hd) {
    return (2 * (size_t)ATC_HEADS * (hd / 2 + ATC_PAD) + (size_t)ATC_ROWS * (hd + ATC_PAD) +
            2 * (size_t)ATC_HEADS * ATC_PLD + 2 * (size_t)ATC_HEADS * ATC_PW + 3 * ATC_HEADS) *
               sizeof(float) +
           2 * ATC_ROWS * sizeof(const float *);
}

/* The pieces of a chunk's rows a thread copies: 32-byte piece u = tid +
 * k blockDim of the chunk is row u / nq, column 8 (u % nq).  The same for
 * every chunk, so the divisions are done once (rows past `rows` are not
 * the thread's). */
struct atc_pieces {
    uint32_t r0, c0, rstep, cstep, n;
};
static __device__ __forceinline__ atc_pieces atc_pieces_of(uint32_t tid, uint32_t nq) {
    atc_pieces p;
    p.r0 = tid / nq;
    p.c0 = ATC_PIECE * (tid % nq);
    p.rstep = blockDim.x / nq;
    p.cstep = ATC_PIECE * (blockDim.x % nq);
    p.n = (ATC_ROWS * nq + blockDim.x - 1 - tid) / blockDim.x;
    return p;
}
/* Piece k + 1 from piece k: the remainder carries into the row. */
static __device__ __forceinline__ void atc_next_piece(const atc_pieces &p, uint32_t nq, uint32_t *r, uint32_t *c) {
    *r += p.rstep;
    *c += p.cstep;
    if (*c >= ATC_PIECE * nq) {
        *c -= ATC_PIECE * nq;
        *r += 1;
    }
}

/* Whether the chunk's row values before the RoPE tail (which starts at
 * value tail0) and in it are binary16 already. */
struct atc_exact {
    uint32_t tail0;
    bool body, tail; /* true: a head and tail each */
};

/* The address of the binary16 heads of values 8 j .. 8 j + 7 of chunk
 * row r (their tails follow, 16 bytes on). */
static __device__ __forceinline__ const uint8_t *atc_piece(const float *Ks, uint32_t ld, uint32_t r, uint32_t j) {
    return (const uint8_t *)(Ks + r * ld + ATC_PIECE * j);
}

/* The split rows of a pass (attn_args.tc_rows): every row a query of the
 * pass can see, split once into binary16 heads and tails in the layout of
 * the chunk in shared memory - piece j of 8 values at bytes 32 j.., its 8
 * heads then their 8 tails, and in the row's padding (ATC_PAD floats) a
 * flag word: bit 0 when a tail before the RoPE tail (value tail0) is
 * non-zero, bit 1 when one in it is - so that a chunk's copy is a plain
 * copy that brings the flags along, and no query splits a row again (a raw
 * row is seen by 128 queries).  Row s: the ring's slot s for s < raw_cap,
 * the pass's row s - raw_cap up to tc_comp0, then compressed row s -
 * tc_comp0; row tc_nrows is zeros (the rows past a query's list).  A warp
 * a row. */
size_t cu_attn_tc_floats(uint32_t hd, size_t rows) { return (rows + 1) * (hd + ATC_PAD); }

static __global__ void atc_prep_kernel(attn_args a) {
    dev_pdl_enter();
    uint32_t s = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31, ld = a.hd + ATC_PAD;
    if (s > a.tc_nrows || (s < a.raw_cap && s >= *a.pos0)) return; /* or a ring slot not written yet */
    const float *src = s == a.tc_nrows  ? NULL
                       : s < a.raw_cap  ? a.ring + (size_t)s * a.hd
                       : s < a.tc_comp0 ? a.kvbuf + (size_t)(s - a.raw_cap) * a.hd
                                        : a.comp + (size_t)(s - a.tc_comp0) * a.hd;
    float *dst = a.tc_rows + (size_t)s * ld;
    uint32_t tail0 = a.hd - a.rope_dim;
    unsigned off = 0;
    for (uint32_t c = ATC_PIECE * lane; c < a.hd; c += ATC_PIECE * 32) {
        float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
        if (src) {
            x0 = *(const float4 *)(src + c);
            x1 = *(const float4 *)(src + c + 4);
        }
        uint4 h, l;
        dev_f16x2_split(x0.x, x0.y, &h.x, &l.x);
        dev_f16x2_split(x0.z, x0.w, &h.y, &l.y);
        dev_f16x2_split(x1.x, x1.y, &h.z, &l.z);
        dev_f16x2_split(x1.z, x1.w, &h.w, &l.w);
        ((uint4 *)(dst + c))[0] = h;
        ((uint4 *)(dst + c))[1] = l;
        if (l.x | l.y | l.z | l.w) off |= c + ATC_PIECE <= tail0 ? 1u : c >= tail0 ? 2u : 3u;
    }
    off = __any_sync(0xffffffffu, off & 1) | (__any_sync(0xffffffffu, off & 2) << 1);
    if (lane == 0) *(uint4 *)(dst + a.hd) = make_uint4(off, 0, 0, 0);
}

/* The split row of row i of query t's visible list (attn_row's order), or
 * the zero row past the list. */
static __device__ __forceinline__ uint32_t atc_row(const attn_args &a, uint32_t t, uint32_t pos0, uint32_t first,
                                                   uint32_t n_raw, uint32_t total, uint32_t i) {
    if (i >= total) return a.tc_nrows;
    if (i < n_raw) {
        uint32_t r = first + i;
        return r >= pos0 ? a.raw_cap + (r - pos0) : r % a.raw_cap;
    }
    return a.tc_comp0 + attn_comp_row(a, t, i - n_raw);
}

/* The word lane i points ldmatrix at for an A fragment of rows r0.. of a
 * matrix of binary16 pairs in k order (stride w words), k block 0: row
 * r0 + i % 8 + 8 ((i / 8) % 2), values 8 (i / 16).. - the fragment's four
 * 8 x 8 pieces in mma order.  Add 8 words a k block. */
static __device__ __forceinline__ uint32_t atc_a_word(unsigned lane, uint32_t r0, uint32_t w) {
    return (r0 + lane % 8 + 8 * ((lane / 8) % 2)) * w + 4 * (lane / 16);
}

/* Which 16-value blocks of the rows need their tails: those before block
 * bt (wholly before the RoPE tail) if body, those from bt on if tail (also
 * if body where the RoPE tail starts inside block bt: a zero tail adds
 * nothing to a product, so taking one where none is needed is harmless).
 * The products then run in two stretches, each with its choice a template
 * constant, rather than a predicate per block. */
static __device__ __forceinline__ uint32_t atc_tail_block(const atc_exact &x) { return x.tail0 / 16; }
static __device__ __forceinline__ bool atc_split_from(const atc_exact &x) { return x.tail || (x.tail0 % 16 && x.body); }

/* Blocks [b0, b1) of a warp's scores (atc_scores), with or without the
 * rows' tails; the same products in the same order as one loop. */
template <bool SPLIT>
static __device__ __forceinline__ void atc_scores_run(const uint32_t *Qh, const uint32_t *Ql, uint32_t qa,
                                                      const uint8_t *kp, uint32_t b0, uint32_t b1, float (&sh)[2][4],
                                                      float (&st)[2][4]) {
    for (uint32_t b = b0; b < b1; b++) {
        uint32_t ah[4], al[4], bh[4], bl[4];
        ldmatrix_x4(ah, Qh + qa + 8 * b);
        ldmatrix_x4(al, Ql + qa + 8 * b);
        ldmatrix_x4(bh, kp + 64 * b);
        if (SPLIT) ldmatrix_x4(bl, kp + 64 * b + 16);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            if (SPLIT) mma_f16_16x8x16(st[nt], ah, bl + 2 * nt);
            mma_f16_16x8x16(st[nt], al, bh + 2 * nt);
            mma_f16_16x8x16(sh[nt], ah, bh + 2 * nt);
        }
    }
}

/* Warp (mt, q4)'s part of S: heads 16 mt.., chunk rows 16 (q4 / 2).. (two
 * tiles of 8), the 16-value blocks of half q4 % 2 of the head dimension
 * (two warps share a tile's rows and meet in atc_merge_scores).  A block's
 * four row fragments (two tiles, two halves of k) come from one ldmatrix:
 * lane i points at row i % 8 of tile (i / 16), values 8 ((i / 8) % 2).. */
static __device__ __forceinline__ void atc_scores(const uint32_t *Qh, const uint32_t *Ql, uint32_t qw, const float *Ks,
                                                  uint32_t hd, uint32_t ld, const atc_exact &ex, unsigned mt,
                                                  unsigned q4, float (&sp)[2][4]) {
    unsigned lane = threadIdx.x & 31;
    uint32_t kb0 = (q4 & 1) * (hd / 32), kb1 = kb0 + hd / 32, qa = atc_a_word(lane, 16 * mt, qw);
    uint32_t bm = min(max(atc_tail_block(ex), kb0), kb1);
    const uint8_t *kp = atc_piece(Ks, ld, 16 * (q4 >> 1) + 8 * (lane / 16) + lane % 8, (lane / 8) % 2);
    float sh[2][4] = {}, st[2][4] = {};
    if (ex.body) atc_scores_run<true>(Qh, Ql, qa, kp, kb0, bm, sh, st);
    else atc_scores_run<false>(Qh, Ql, qa, kp, kb0, bm, sh, st);
    if (atc_split_from(ex)) atc_scores_run<true>(Qh, Ql, qa, kp, bm, kb1, sh, st);
    else atc_scores_run<false>(Qh, Ql, qa, kp, bm, kb1, sh, st);
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) sp[nt][i] = sh[nt][i] + st[nt][i];
}

/* S = (first half + second half) * scale into Ps, rows past the query's
 * list -inf: the second-half warps leave their sums in SP, the first-half
 * ones add them (a fixed order).  Two block barriers. */
static __device__ __forceinline__ void atc_merge_scores(const float (&sp)[2][4], float *SP, float *Ps, unsigned mt,
                                                        unsigned q4, uint32_t valid, float scale) {
    unsigned lane = threadIdx.x & 31, g = lane / 4, tq = lane % 4;
    bool second = q4 & 1;
    if (second)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                unsigned h = 16 * mt + g + (i >= 2 ? 8 : 0), r = 16 * (q4 >> 1) + 8 * nt + 2 * tq + (i & 1);
                SP[h * ATC_PLD + r] = sp[nt][i];
            }
    __syncthreads();
    if (!second)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                unsigned h = 16 * mt + g + (i >= 2 ? 8 : 0), r = 16 * (q4 >> 1) + 8 * nt + 2 * tq + (i & 1);
                Ps[h * ATC_PLD + r] = r < valid ? (sp[nt][i] + SP[h * ATC_PLD + r]) * scale : -INFINITY;
            }
    __syncthreads();
}

/* Tile pairs j (values n0 + 8 j.., 16 of them) in [j0, j1) of a warp's
 * O += P V for one block of 16 rows (atc_values), with or without the
 * rows' tails.  The pairs are unrolled (o stays in registers), each behind
 * a uniform test of its place. */
template <bool SPLIT>
static __device__ __forceinline__ void atc_values_run(const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                                      const uint8_t *vp, uint32_t j0, uint32_t j1,
                                                      float (&o)[ATT_MAXV][4]) {
#pragma unroll
    for (int j = 0; j < ATT_MAXV; j += 2) {
        if ((uint32_t)j < j0 || (uint32_t)j >= j1) continue;
        uint32_t bh[4], bl[4];
        ldmatrix_x4_trans(bh, vp + 32 * j);
        if (SPLIT) ldmatrix_x4_trans(bl, vp + 32 * j + 16);
        if (SPLIT) mma_f16_16x8x16(o[j], ah, bl);
        mma_f16_16x8x16(o[j], al, bh);
        mma_f16_16x8x16(o[j], ah, bh);
        if (SPLIT) mma_f16_16x8x16(o[j + 1], ah, bl + 2);
        mma_f16_16x8x16(o[j + 1], al, bh + 2);
        mma_f16_16x8x16(o[j + 1], ah, bh + 2);
    }
}

/* O += P V for warp (mt, q4): heads 16 mt.., values n0.. of the quarter
 * (ntile tiles of 8, an even number), the chunk's rows in two blocks of
 * 16.  Two tiles' row fragments come from one transposed ldmatrix: lane i
 * points at row 8 ((i / 8) % 2) + i % 8 of the block, values of tile
 * i / 16.  Pairs before jm lie before the RoPE tail's block. */
static __device__ __forceinline__ void atc_values(const uint32_t *Ph, const uint32_t *Pl, const float *Ks, uint32_t ld,
                                                  const atc_exact &ex, unsigned mt, uint32_t n0, uint32_t ntile,
                                                  float (&o)[ATT_MAXV][4]) {
    unsigned lane = threadIdx.x & 31;
    uint32_t pa = atc_a_word(lane, 16 * mt, ATC_PW), bt = 16 * atc_tail_block(ex);
    uint32_t jm = bt <= n0 ? 0 : min((bt - n0) / 8, ntile);
    bool split_from = atc_split_from(ex);
#pragma unroll
    for (int b = 0; b < ATC_ROWS / 16; b++) {
        uint32_t ah[4], al[4];
        ldmatrix_x4(ah, Ph + pa + 8 * b);
        ldmatrix_x4(al, Pl + pa + 8 * b);
        const uint8_t *vp = atc_piece(Ks, ld, 16 * b + 8 * ((lane / 8) % 2) + lane % 8, n0 / 8 + lane / 16);
        if (ex.body) atc_values_run<true>(ah, al, vp, 0, jm, o);
        else atc_values_run<false>(ah, al, vp, 0, jm, o);
        if (split_from) atc_values_run<true>(ah, al, vp, jm, ntile, o);
        else atc_values_run<false>(ah, al, vp, jm, ntile, o);
    }
}

/* Online softmax over the chunk: thread (head tid / 8, q = tid % 8) takes
 * rows 16 (q / 4) + 2 (q % 4) + {0, 1, 8, 9} - the two P words of lane
 * q % 4 of block q / 4 - turns its scores into probabilities against the
 * head's new maximum, stores them scaled, as head and tail, and records
 * the factor for the head's earlier sums. */
static __device__ __forceinline__ void atc_softmax(const float *Ps, uint32_t *Ph, uint32_t *Pl, float *mh, float *lh,
                                                   float *ch) {
    unsigned h = threadIdx.x / 8, q = threadIdx.x % 8, r0 = 16 * (q / 4) + 2 * (q % 4);
    float v[4], mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = Ps[h * ATC_PLD + r0 + (i & 1) + 8 * (i >> 1)];
        mx = fmaxf(mx, v[i]);
    }
    for (int o = 1; o < 8; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float m_old = mh[h], M = fmaxf(m_old, mx), sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = expf(v[i] - M); /* 0 for the rows past the list: M is finite (row c0 is in it) */
        sum += v[i];
    }
    uint32_t w = h * ATC_PW + 8 * (q / 4) + q % 4;
    dev_f16x2_split(v[0] * ATC_SCALE, v[1] * ATC_SCALE, &Ph[w], &Pl[w]);
    dev_f16x2_split(v[2] * ATC_SCALE, v[3] * ATC_SCALE, &Ph[w + 4], &Pl[w + 4]);
    for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __syncwarp();
    if (q == 0) {
        float c = attn_rescale(m_old, M);
        lh[h] = lh[h] * c + sum;
        mh[h] = M;
        ch[h] = c;
    }
}

/* Q of the block's heads as projected, normalised and RoPE'd as they are
 * loaded (q_post_head's arithmetic on registers: q_post_vals, a warp a
 * head, two heads a round so that eight 16-byte loads a lane are in
 * flight - loads waited for one at a time had taken a fifth of the
 * kernel's samples at 4k), then scaled and split into binary16 pairs: word
 * w of a head holds values 2 w and 2 w + 1.  Doing the q post here saves a
 * long pass's q_post_kernel a read and a write of every query (15 ms of a
 * 4k prefill). */
static __device__ __forceinline__ void atc_load_q(const attn_args &a, uint32_t hd, uint32_t t, uint32_t h0,
                                                  uint32_t pos, uint32_t *Qh, uint32_t *Ql, uint32_t qw) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (uint32_t h = warp; h < ATC_HEADS; h += 2 * nw) {
        float4 v[2][QP_GROUPS];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t hk = h + k * nw;
            bool on = hk < ATC_HEADS && h0 + hk < a.n_head;
            q_post_load(on ? a.q + ((size_t)t * a.n_head + h0 + hk) * hd : NULL, hd, v[k]);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t hk = h + k * nw;
            if (hk >= ATC_HEADS) break;
            if (h0 + hk < a.n_head) q_post_vals(v[k], hd, a.rope, pos, a.q_eps);
#pragma unroll
            for (int j = 0; j < QP_GROUPS; j++) {
                uint32_t e = 4 * lane + 128 * j, w = hk * qw + e / 2;
                if (e >= hd) break;
                uint2 hw, lw;
                dev_f16x2_split(v[k][j].x * ATC_SCALE, v[k][j].y * ATC_SCALE, &hw.x, &lw.x);
                dev_f16x2_split(v[k][j].z * ATC_SCALE, v[k][j].w * ATC_SCALE, &hw.y, &lw.y);
                *(uint2 *)(Qh + w) = hw;
                *(uint2 *)(Ql + w) = lw;
            }
        }
    }
}

/* The L2 asked for the Q of the query whose block will likely follow this
 * one on its SM (blocks start in order, one an SM as others end): its 128 KB
 * then come from the L2, not from DRAM while its SM does nothing else. */
static __device__ __forceinline__ void atc_prefetch_next_q(const attn_args &a, uint32_t hd, uint32_t t, uint32_t h0) {
    uint32_t tn = t + dev_sm_ids();
    if (tn >= gridDim.y) return;
    const char *q = (const char *)(a.q + ((size_t)tn * a.n_head + h0) * hd);
    uint32_t bytes = (a.n_head - h0 < ATC_HEADS ? a.n_head - h0 : ATC_HEADS) * hd * (uint32_t)sizeof(float);
    for (uint32_t off = 128 * threadIdx.x; off < bytes; off += 128 * blockDim.x) prefetch_l2(q + off);
}

/* HD: the head dimension as a constant (Flash's 512: the loops over a
 * head's values and pieces get constant bounds), or 0 to take it from the
 * arguments. */
template <int HD> static __global__ void __launch_bounds__(ATC_WARPS * 32, 1) attn_tc_kernel(attn_args a) {
    dev_pdl_enter();
    DS4_DYN_SMEM(float, atc_smem);
    const uint32_t hd = HD ? (uint32_t)HD : a.hd, ld = hd + ATC_PAD, nq = hd / ATC_PIECE, qw = hd / 2 + ATC_PAD;
    uint32_t *Qh = (uint32_t *)atc_smem, *Ql = Qh + ATC_HEADS * qw;
    float *Ks = (float *)(Ql + ATC_HEADS * qw), *Ps = Ks + ATC_ROWS * ld, *SP = Ps + ATC_HEADS * ATC_PLD;
    uint32_t *Ph = (uint32_t *)(SP + ATC_HEADS * ATC_PLD), *Pl = Ph + ATC_HEADS * ATC_PW;
    float *mh = (float *)(Pl + ATC_HEADS * ATC_PW), *lh = mh + ATC_HEADS, *ch = lh + ATC_HEADS;
    const float **rowp = (const float **)(ch + ATC_HEADS); /* two tables of ATC_ROWS row addresses */
    unsigned tid = threadIdx.x, lane = tid & 31, warp = tid / 32, g = lane / 4, tq = lane % 4;
    unsigned mt = warp / 4, q4 = warp % 4;
    uint32_t t = blockIdx.y, h0 = blockIdx.x * ATC_HEADS;
    uint32_t pos0 = *a.pos0, p = pos0 + t, first, n_raw;
    uint32_t total = attn_rows(a, t, p, &first, &n_raw);
    atc_load_q(a, hd, t, h0, p, Qh, Ql, qw);
    atc_prefetch_next_q(a, hd, t, h0);
    if (tid < ATC_HEADS) {
        mh[tid] = -INFINITY;
        lh[tid] = 0.0f;
    }
    uint32_t ncol = hd / 4, ntile = ncol / 8; /* O: a warp's columns and 8-wide tiles */
    float o[ATT_MAXV][4] = {};
    float scale = 1.0f / sqrtf((float)hd) / ATC_SCALE;
    atc_pieces pc = atc_pieces_of(tid, nq);
    uint32_t row_next = tid < ATC_ROWS ? atc_row(a, t, pos0, first, n_raw, total, tid)
                                       : 0; /* warp 0: the next chunk's */
    atc_exact ex;
    ex.tail0 = hd - a.rope_dim;
    for (uint32_t c0 = 0, ci = 0; c0 < total; c0 += ATC_ROWS, ci++) {
        /* the chunk's row addresses, by warp 0 (ATC_ROWS lanes) from the
         * indices it loaded a chunk ago (their loads are off the path); the
         * table of this parity was last read two chunks ago, before the
         * barriers of the chunk between */
        const float **rp = rowp + (ci & 1) * ATC_ROWS;
        if (tid < ATC_ROWS) {
            rp[tid] = a.tc_rows + (size_t)row_next * ld;
            row_next = atc_row(a, t, pos0, first, n_raw, total, c0 + ATC_ROWS + tid);
        }
        __syncthreads(); /* the previous chunk's rows and probabilities are read; the table is written */
        uint32_t r = pc.r0, c = pc.c0;
        for (uint32_t k = 0; k < pc.n; k++, atc_next_piece(pc, nq, &r, &c)) {
            float *dst = Ks + r * ld + c;
            cp_async16(dst, rp[r] + c);
            cp_async16(dst + 4, rp[r] + c + 4);
        }
        if (tid < ATC_ROWS) cp_async16(Ks + tid * ld + hd, rp[tid] + hd); /* the row's flags */
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        /* which values need their tails, before and in the RoPE tail: the
         * rows' flags ORed, by every warp */
        unsigned f = *(const unsigned *)(Ks + lane * ld + hd);
        ex.body = __any_sync(0xffffffffu, f & 1);
        ex.tail = __any_sync(0xffffffffu, f & 2);
        float sp[2][4];
        atc_scores(Qh, Ql, qw, Ks, hd, ld, ex, mt, q4, sp);
        atc_merge_scores(sp, SP, Ps, mt, q4, total - c0, scale);
        if (tid < ATC_HEADS * 8) atc_softmax(Ps, Ph, Pl, mh, lh, ch);
        __syncthreads();
        float c_lo = ch[16 * mt + g], c_hi = ch[16 * mt + g + 8];
#pragma unroll
        for (int j = 0; j < ATT_MAXV; j++) {
            o[j][0] *= c_lo;
            o[j][1] *= c_lo;
            o[j][2] *= c_hi;
            o[j][3] *= c_hi;
        }
        atc_values(Ph, Pl, Ks, ld, ex, mt, q4 * ncol, ntile, o);
    }
    __syncthreads(); /* Q is read: its space takes O */
    float *Os = atc_smem;
    uint32_t n0 = q4 * ncol;
#pragma unroll
    for (int j = 0; j < ATT_MAXV; j++) {
        if ((uint32_t)j >= ntile) break;
        unsigned h = 16 * mt + g, c = n0 + 8 * j + 2 * tq;
        Os[h * ld + c] = o[j][0] / ATC_SCALE;
        Os[h * ld + c + 1] = o[j][1] / ATC_SCALE;
        Os[(h + 8) * ld + c] = o[j][2] / ATC_SCALE;
        Os[(h + 8) * ld + c + 1] = o[j][3] / ATC_SCALE;
    }
    __syncthreads();
    uint32_t per = hd / 32;
    for (uint32_t h = warp; h < ATC_HEADS && h0 + h < a.n_head; h += ATC_WARPS) {
        float v[ATT_MAXV];
#pragma unroll
        for (int i = 0; i < ATT_MAXV; i++) v[i] = (uint32_t)i < per ? Os[h * ld + attn_lane_e(per, lane, i)] : 0.0f;
        attn_sink_finish(a, per, t, h0 + h, p, v, mh[h], lh[h]);
    }
}

/* Raw rows of the pass into the ring (after attention has read it). */
static __global__ void ring_write_kernel(const uint32_t *pos0p, const float *kvbuf, float *ring, uint32_t T,
                                         uint32_t hd, uint32_t raw_cap) {
    dev_pdl_enter();
    uint32_t first = T > raw_cap ? T - raw_cap : 0, t = first + blockIdx.x, pos = *pos0p + t;
    float *dst = ring + (size_t)(pos % raw_cap) * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = kvbuf[(size_t)t * hd + i];
}

/* The decode configuration of attn_heads_kernel: 2 heads a warp and
 * batches of 2 rows in 128 registers, so 2 blocks per SM; splits sized for
 * ATB_BLOCKS blocks, each with ATB_MIN_ROWS rows at the least.  Measured on
 * the H200 (662a7ef) against 4 heads a warp at 255
 * registers (1 block per SM: 3.5-4% slower decode), every warp a split of
 * its own (8% slower) and the same without the address prefetch (0.3%
 * slower). */
#define ATB_HEADS    2
#define ATB_MIN_ROWS 8
#define ATB_BLOCKS   256

uint32_t cu_attn_groups(const ds4_config *c) { return (c->n_head + ATB_HEADS - 1) / ATB_HEADS; }

uint32_t cu_attn_splits(const ds4_config *c, uint32_t rows) {
    uint32_t groups = cu_attn_groups(c), s = (ATB_BLOCKS + groups - 1) / groups;
    uint32_t by_rows = (rows + ATB_MIN_ROWS - 1) / ATB_MIN_ROWS;
    if (by_rows < s) s = by_rows;
    return s ? s : 1;
}

size_t cu_attn_part_floats(const ds4_config *c, uint32_t splits) {
    return (size_t)cu_attn_groups(c) * splits * attn_part_floats(ATB_HEADS, c->head_dim);
}

int cu_attn_run(const attn_args *a, uint32_t T, bool tc, cudaStream_t st, ds4_err *err) {
    if (tc && a->sink.sums)
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: the tensor-core attention hosts no Sinkhorn");
    if (tc && !a->tc_rows)
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: the tensor-core attention has no split rows");
    if (tc) {
        DS4_LAUNCH(atc_prep_kernel, (a->tc_nrows + 1 + 7) / 8, 256, 0, st, *a);
        CU_LAUNCHED();
        size_t smem = attn_tc_smem(a->hd);
        dim3 grid((a->n_head + ATC_HEADS - 1) / ATC_HEADS, T);
        if (a->hd == 512) {
            if (cu_allow_smem<attn_tc_kernel<512>>(smem, err)) return -1;
            DS4_LAUNCH(attn_tc_kernel<512>, grid, ATC_WARPS * 32, smem, st, *a);
        } else {
            if (cu_allow_smem<attn_tc_kernel<0>>(smem, err)) return -1;
            DS4_LAUNCH(attn_tc_kernel<0>, grid, ATC_WARPS * 32, smem, st, *a);
        }
    } else {
        dim3 grid((a->n_head + ATB_HEADS - 1) / ATB_HEADS + (a->sink.sums ? 1 : 0), T, a->nsplit);
        if (a->hd == 512) DS4_LAUNCH((attn_heads_kernel<ATB_HEADS, 2, 2, 16>), grid, ATB_WARPS * 32, 0, st, *a);
        else DS4_LAUNCH((attn_heads_kernel<ATB_HEADS, 2, 2, 0>), grid, ATB_WARPS * 32, 0, st, *a);
    }
    CU_LAUNCHED();
    return 0;
}

bool cu_attn_tc(const cuda_backend *b, uint32_t T) { return T > CU_ATTN_BLOCKED_T; }

size_t cu_attn_tc_rows(const cuda_backend *b) {
    if (b->chunk <= CU_ATTN_BLOCKED_T) return 0;
    return (size_t)b->raw_cap + b->chunk + (b->comp_cap4 > b->comp_cap128 ? b->comp_cap4 : b->comp_cap128);
}

int cu_attend(cuda_backend *b, uint32_t il, uint32_t T, uint32_t pos0, const hc_site *sink, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlstate *S = &b->sq->L[il];
    attn_args a;
    memset(&a, 0, sizeof(a));
    a.pos0 = &b->sq->d_step->pos;
    a.q = b->q;
    a.kvbuf = b->kvbuf;
    a.ring = S->raw;
    a.comp = S->comp;
    a.vis = b->vis;
    a.nvis = b->nvis;
    a.sinks = (const float *)b->W.layers[il].sinks.p; /* the backend's heads' (cu_tp) */
    a.n_head = b->tp.heads;
    a.hd = c->head_dim;
    a.window = c->sliding_window;
    a.raw_cap = b->raw_cap;
    a.ratio = S->ratio;
    a.top_k = c->idx_top_k;
    a.rope_dim = c->rope_dim;
    a.rope = S->ratio ? b->rope_comp : b->rope_dense;
    a.part = b->attn_part;
    a.count = b->attn_count;
    a.heads = b->heads;
    a.sink = cu_hc_sink_job(b, sink);
    a.nsplit = 1;
    bool tc = cu_attn_tc(b, T);
    a.q_eps = c->rms_eps;
    a.pos_early = cu_pos_early(b, T);
    if (tc) { /* the ring's slots written so far, the pass's rows, the compressed rows complete by its end */
        a.tc_rows = b->attn_tc_rows;
        a.tc_comp0 = b->raw_cap + T;
        a.tc_nrows = a.tc_comp0 + (S->ratio ? (pos0 + T) / S->ratio : 0);
        if ((size_t)a.tc_nrows > cu_attn_tc_rows(b))
            return ds4_err_set(err, DS4_EINVAL, "CUDA backend: %u rows to split for the attention, room for %zu",
                               a.tc_nrows, cu_attn_tc_rows(b));
    }
    if (!tc && T <= b->attn_queries) { /* a few queries: the rows split over blocks (the scratch holds
                                          * their partial results; a lane's holds one query's) */
        uint32_t rows = c->sliding_window, cap = S->ratio ? cu_dec_cap(b, S->ratio) : 0;
        rows += S->ratio == 4 && c->idx_top_k < cap ? c->idx_top_k : cap;
        a.nsplit = cu_attn_splits(c, rows);
        if (a.nsplit > b->attn_split) a.nsplit = b->attn_split;
    }
    if (cu_attn_run(&a, T, tc, b->st, err)) return -1;
    if (T == 1) return 0; /* qkv_post_kernel wrote the ring */
    uint32_t nw = T < b->raw_cap ? T : b->raw_cap;
    DS4_LAUNCH(ring_write_kernel, nw, 128, 0, b->st, &b->sq->d_step->pos, (const float *)b->kvbuf, S->raw, T,
               c->head_dim, b->raw_cap);
    CU_LAUNCHED();
    return 0;
}
