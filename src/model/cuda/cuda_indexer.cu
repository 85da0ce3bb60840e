/*
 * cuda_indexer.cu - the lightning indexer's selection on the GPU (docs/
 * MODEL.md 6.3, ratio-4 layers), mirroring select_rows in
 * src/model/cpu/cpu_attn.c: every query scores the compressed rows of its
 * prefix (score = sum_h w_h relu(q_h . k)) and keeps the top-k of them,
 * listed in row order, for the attention kernels of cuda_attn.cu.
 *
 * Scores: a SIMT kernel for decode steps (one query; each query value read
 * from shared memory serves up to four rows) and a TF32 tensor-core kernel
 * for prefill passes.  Top-k: one block a query, exact (higher score first,
 * lower index on ties, -0 equal to +0), by linear bins of the score range
 * or, failing that, radix digits of the order keys.
 */
#include "model/cuda/cuda_internal.h"

#define IDX_THREADS   256
#define IDX_GROUP     8                         /* threads per row group */
#define IDX_GROUPS    (IDX_THREADS / IDX_GROUP) /* row groups per block */
#define IDX_RPT       4                         /* rows a thread, at most */
#define IDX_TILE      (IDX_GROUPS * IDX_RPT)    /* rows a block, at most */
#define IDX_GRID      128                       /* blocks a launch aims for: about one an SM of the H200 */
#define IDX_MAX_HEADS 64
#define IDX_HPT       (IDX_MAX_HEADS / IDX_GROUP) /* heads per thread */
#define IDX_MAX_DIM   128
/* Query heads and rows in shared memory, read 16 bytes at a time: the
 * stride keeps each 16-byte aligned and puts 8 consecutive ones in 8
 * distinct 4-bank quads, so a warp's vector loads are conflict-free. */
#define IDX_QSTRIDE   (IDX_MAX_DIM + 4)

typedef struct idx_args {
    const uint32_t *pos0;
    bool pos_early; /* as attn_args.pos_early */
    const float *iq, *iw, *rows;
    float *scores;
    size_t score_stride;
    uint32_t heads, ihd, top_k;
} idx_args;

static size_t idx_simt_smem(void) { return (size_t)(IDX_MAX_HEADS + IDX_TILE) * IDX_QSTRIDE * sizeof(float); }

/* The scores of R rows a thread: rows rl, rl + 32, .. of the block's
 * tile, heads g, g + 8, ..; each query value read from shared memory
 * serves R rows (one row a thread read the query once per multiply-add,
 * and shared memory bounded the kernel at long contexts).  The relu'd dots
 * times the head weights are added over the thread's heads, in head
 * order, then over the group's 8 threads by a fixed shuffle tree. */
template <int R>
static __device__ __forceinline__ void idx_tile_scores(const idx_args &a, const float *qs, const float *ks,
                                                       const float *ws, uint32_t r0, uint32_t r1, float *out) {
    unsigned g = threadIdx.x % IDX_GROUP, rl = threadIdx.x / IDX_GROUP;
    float acc[IDX_HPT][R];
#pragma unroll
    for (int j = 0; j < IDX_HPT; j++)
#pragma unroll
        for (int i = 0; i < R; i++) acc[j][i] = 0.0f;
    for (uint32_t d = 0; d < a.ihd; d += 4) {
        float4 kv[R];
#pragma unroll
        for (int i = 0; i < R; i++) kv[i] = *(const float4 *)(ks + (rl + IDX_GROUPS * i) * IDX_QSTRIDE + d);
#pragma unroll
        for (int j = 0; j < IDX_HPT; j++) {
            float4 q = *(const float4 *)(qs + (g + IDX_GROUP * j) * IDX_QSTRIDE + d);
#pragma unroll
            for (int i = 0; i < R; i++) {
                float s = acc[j][i];
                s = fmaf(q.x, kv[i].x, s);
                s = fmaf(q.y, kv[i].y, s);
                s = fmaf(q.z, kv[i].z, s);
                acc[j][i] = fmaf(q.w, kv[i].w, s);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; i++) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < IDX_HPT; j++) s += ws[g + IDX_GROUP * j] * fmaxf(acc[j][i], 0.0f);
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        s += __shfl_xor_sync(0xffffffffu, s, 4);
        uint32_t c = r0 + rl + IDX_GROUPS * i;
        if (g == 0 && c < r1) out[c] = s;
    }
}

/* score[t][c] = sum_h w_h max(0, q_h . k_c) for the rows c of the query's
 * prefix (only when it holds more rows than top-k).  The grid is sized for
 * the most rows a query can have (a decode step's graph serves every
 * position), so each block takes an equal share of the rows there are
 * now, in whole row groups: at most IDX_TILE, one to IDX_RPT rows a
 * thread.  The share's rows are copied into shared memory while the query
 * loads.  Heads past a.heads are zeros with weight 0. */
/* Both indexer kernels let the next launch be scheduled only after their
 * PDL wait, unlike dev_pdl_enter(): there launches run ahead in a chain -
 * each kernel's blocks, placed while they wait, launch the kernel after
 * them - so several kernels' waiting blocks may hold the SMs' threads,
 * registers and shared memory that the running kernel's blocks need.  The
 * decode indexer sits in such a chain between small launches: in this
 * order a decode step ran 4.4 % faster at 4k and 3 % at 64k
 * (0fb123b), while the two kernels by
 * themselves had not changed. */
static __global__ void __launch_bounds__(IDX_THREADS) idx_score_kernel(idx_args a) {
    uint32_t pos0 = dev_pdl_wait_pos(a.pos0, a.pos_early);
    dev_pdl_launch_next(); /* after the wait: no launches piling up ahead */
    DS4_DYN_SMEM(float, qs);
    float *ks = qs + IDX_MAX_HEADS * IDX_QSTRIDE;
    __shared__ float ws[IDX_MAX_HEADS];
    uint32_t t = blockIdx.y, nc = (pos0 + t + 1) / 4;
    uint32_t per = (nc + gridDim.x - 1) / gridDim.x;
    per = (per + IDX_GROUPS - 1) / IDX_GROUPS * IDX_GROUPS;
    if (per > IDX_TILE) per = IDX_TILE; /* only if nc exceeds the rows the grid was sized for */
    uint32_t r0 = blockIdx.x * per, r1 = r0 + per < nc ? r0 + per : nc;
    if (nc <= a.top_k || r0 >= nc) return;
    /* the share's rows, by asynchronous copies (zeros past them) */
    uint32_t pieces = a.ihd / 4;
    for (uint32_t i = threadIdx.x; i < per * pieces; i += IDX_THREADS) {
        uint32_t r = i / pieces, d = 4 * (i % pieces);
        float *dst = ks + r * IDX_QSTRIDE + d;
        if (r0 + r < r1) cp_async16(dst, a.rows + (size_t)(r0 + r) * a.ihd + d);
        else *(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    cp_async_commit();
    /* the query (at most 64 x 128 floats): every load issued, then stored */
    const float *q = a.iq + (size_t)t * a.heads * a.ihd;
    constexpr int QV = IDX_MAX_HEADS * IDX_MAX_DIM / 4 / IDX_THREADS;
    float4 qv[QV];
#pragma unroll
    for (int j = 0; j < QV; j++) {
        uint32_t i = 4 * (threadIdx.x + j * IDX_THREADS), h = i / IDX_MAX_DIM, d = i % IDX_MAX_DIM;
        qv[j] = h < a.heads && d < a.ihd ? __ldg((const float4 *)(q + h * a.ihd + d))
                                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < QV; j++) {
        uint32_t i = 4 * (threadIdx.x + j * IDX_THREADS), h = i / IDX_MAX_DIM, d = i % IDX_MAX_DIM;
        *(float4 *)(qs + h * IDX_QSTRIDE + d) = qv[j];
    }
    for (uint32_t i = threadIdx.x; i < IDX_MAX_HEADS; i += blockDim.x)
        ws[i] = i < a.heads ? a.iw[(size_t)t * a.heads + i] : 0.0f;
    cp_async_wait_all();
    __syncthreads();
    float *out = a.scores + (size_t)t * a.score_stride;
    switch (per / IDX_GROUPS) { /* the same in every thread of the block */
    case 1: idx_tile_scores<1>(a, qs, ks, ws, r0, r1, out); break;
    case 2: idx_tile_scores<2>(a, qs, ks, ws, r0, r1, out); break;
    case 3: idx_tile_scores<3>(a, qs, ks, ws, r0, r1, out); break;
    default: idx_tile_scores<4>(a, qs, ks, ws, r0, r1, out); break;
    }
}

/* Prefill scores on the TF32 tensor cores: a block is one query and up to
 * IDXC_ROWS of its rows, in sub-tiles of 64 (a warp 16 rows x all 64
 * heads, m16n8k8).  The query's heads are split into TF32 head and tail
 * once, into shared memory; each sub-tile's rows are staged raw and split
 * by the warp that multiplies them; products q k = qh kh + qh kl + ql kh
 * (tails apart), f32 to a few units of the last place, summed in the
 * tensor cores' order rather than the dimensions' (so not the SIMT
 * kernel's bits).  The relu'd dots times the head weights are added over
 * the fragment's heads and then across the lanes of a column, in a fixed
 * order. */
#define IDXC_WARPS  4
#define IDXC_QLOADS 8                 /* query loads a thread has in flight */
#define IDXC_SUB    (16 * IDXC_WARPS) /* rows per sub-tile */
#define IDXC_ROWS   512               /* rows per block */
#define IDXC_LD     (IDX_MAX_DIM + 4) /* row stride: the fragment loads hit 32 banks */

static size_t idx_tc_smem(void) { return (size_t)(2 * IDX_MAX_HEADS + IDXC_SUB) * IDXC_LD * sizeof(uint32_t); }

/* IHD: the indexer head dimension as a constant (Flash's 128: the K loop
 * gets a constant trip count), or 0 to take it from the arguments. */
template <int IHD> static __global__ void __launch_bounds__(IDXC_WARPS * 32) idx_score_tc_kernel(idx_args a) {
    dev_pdl_enter();
    DS4_DYN_SMEM(uint32_t, sm);
    uint32_t(*qh)[IDXC_LD] = (uint32_t(*)[IDXC_LD])sm;
    uint32_t(*ql)[IDXC_LD] = qh + IDX_MAX_HEADS;
    float(*kr)[IDXC_LD] = (float(*)[IDXC_LD])(ql + IDX_MAX_HEADS);
    __shared__ float ws[IDX_MAX_HEADS];
    uint32_t t = blockIdx.y, nc = (*a.pos0 + t + 1) / 4, c0 = blockIdx.x * IDXC_ROWS;
    if (nc <= a.top_k || c0 >= nc) return;
    const uint32_t ihd = IHD ? (uint32_t)IHD : a.ihd;
    const float *q = a.iq + (size_t)t * a.heads * ihd;
    /* the query, IDXC_QLOADS 16-byte pieces a thread loaded before any is
     * used (a loop of single loads waits a round trip for each) */
    constexpr uint32_t QPIECES = IDX_MAX_HEADS * IDX_MAX_DIM / 4;
    for (uint32_t i0 = threadIdx.x; i0 < QPIECES; i0 += IDXC_QLOADS * blockDim.x) {
        float4 v[IDXC_QLOADS];
#pragma unroll
        for (int u = 0; u < IDXC_QLOADS; u++) {
            uint32_t i = i0 + u * blockDim.x, h = i / (IDX_MAX_DIM / 4), d = 4 * (i % (IDX_MAX_DIM / 4));
            bool on = i < QPIECES && h < a.heads && d < ihd;
            v[u] = on ? __ldg((const float4 *)(q + (size_t)h * ihd + d)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < IDXC_QLOADS; u++) {
            uint32_t i = i0 + u * blockDim.x, h = i / (IDX_MAX_DIM / 4), d = 4 * (i % (IDX_MAX_DIM / 4));
            if (i >= QPIECES) break;
            float f[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll
            for (int j = 0; j < 4; j++) dev_tf32_split(f[j], &qh[h][d + j], &ql[h][d + j]);
        }
    }
    for (uint32_t h = threadIdx.x; h < IDX_MAX_HEADS; h += blockDim.x)
        ws[h] = h < a.heads ? a.iw[(size_t)t * a.heads + h] : 0.0f;
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, g = lane / 4, tq = lane % 4;
    uint32_t end = nc < c0 + IDXC_ROWS ? nc : c0 + IDXC_ROWS;
    for (uint32_t cb = c0; cb < end; cb += IDXC_SUB) {
        __syncthreads(); /* the query is stored; the previous sub-tile's rows are read */
        /* the rows by asynchronous copies, all in flight at once */
        for (uint32_t i = threadIdx.x; i < IDXC_SUB * IDX_MAX_DIM / 4; i += blockDim.x) {
            uint32_t r = i / (IDX_MAX_DIM / 4), d = 4 * (i % (IDX_MAX_DIM / 4));
            if (cb + r < end && d < ihd) cp_async16(&kr[r][d], a.rows + (size_t)(cb + r) * ihd + d);
            else *(float4 *)&kr[r][d] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        cp_async_commit();
        cp_async_wait_all();
        __syncthreads();
        float acc[4][2][4] = {}, tail[4][2][4] = {};
#pragma unroll 4
        for (uint32_t k0 = 0; k0 < ihd; k0 += 8) {
            uint32_t bh[2][2], bl[2][2];
#pragma unroll
            for (int n = 0; n < 2; n++) {
                const float *kp = kr[16 * warp + 8 * n + g];
                dev_tf32_split(kp[k0 + tq], &bh[n][0], &bl[n][0]);
                dev_tf32_split(kp[k0 + tq + 4], &bh[n][1], &bl[n][1]);
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                unsigned r = 16 * m + g;
                uint32_t ah[4] = {qh[r][k0 + tq], qh[r + 8][k0 + tq], qh[r][k0 + tq + 4], qh[r + 8][k0 + tq + 4]};
                uint32_t al[4] = {ql[r][k0 + tq], ql[r + 8][k0 + tq], ql[r][k0 + tq + 4], ql[r + 8][k0 + tq + 4]};
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    mma_tf32_16x8x8(tail[m][n], al, bh[n]);
                    mma_tf32_16x8x8(tail[m][n], ah, bl[n]);
                    mma_tf32_16x8x8(acc[m][n], ah, bh[n]);
                }
            }
        }
        /* c[i] of (m, n): head 16 m + g (+ 8 for i >= 2), row 8 n + 2 tq + (i & 1) */
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int p = 0; p < 2; p++) {
                float s = 0.0f;
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    s += ws[16 * m + g] * fmaxf(acc[m][n][p] + tail[m][n][p], 0.0f);
                    s += ws[16 * m + g + 8] * fmaxf(acc[m][n][p + 2] + tail[m][n][p + 2], 0.0f);
                }
                s += __shfl_xor_sync(0xffffffffu, s, 4);
                s += __shfl_xor_sync(0xffffffffu, s, 8);
                s += __shfl_xor_sync(0xffffffffu, s, 16);
                uint32_t c = cb + 16 * warp + 8 * n + 2 * tq + p;
                if (g == 0 && c < end) a.scores[(size_t)t * a.score_stride + c] = s;
            }
    }
}

typedef struct topk_args {
    const uint32_t *pos0;
    bool pos_early; /* as attn_args.pos_early */
    const float *scores;
    size_t score_stride;
    uint32_t top_k;
    uint32_t *vis, *nvis;
    uint32_t cache; /* scores a block keeps in shared memory */
} topk_args;

/* The top-k of a query's scores (higher first, lower index on ties) in
 * passes over them, each reading them in batches of TOPK_BATCH a thread,
 * coalesced, loads issued before any is used.  The scores go into shared
 * memory on the first pass when they fit (TOPK_CACHE), so the later
 * passes read them there.  The k-th largest key is found by one of two
 * ways, both exact:
 *   linear  scores binned by (v - min) / (max - min) into TOPK_BINS bins
 *           (a monotone map, so every key of a higher bin is larger); the
 *           bin holding the k-th largest is found by a scan of the
 *           histogram, and its keys are ranked among themselves.  One
 *           histogram pass, whose atomics spread over many bins.
 *   radix   four passes of 8-bit digits of the order keys; the first
 *           digit (sign and exponent) puts most of a query's scores into
 *           a few bins, whose atomics then wait on each other.  Taken
 *           when the scores are not all finite and distinct in range, or
 *           the threshold bin holds more than TOPK_CAND keys (many equal
 *           scores).
 * A last pass writes the selection in index order, each warp a span of
 * the keys (ballots order the keys within a warp's step); the linear way
 * counts each span's keys above the threshold on its way, the radix way
 * in a pass of its own. */
#define TOPK_THREADS 1024
#define TOPK_WARPS   (TOPK_THREADS / 32)
#define TOPK_BATCH   8
#define TOPK_WBATCH  4                  /* the last pass's batches (its ballots need registers) */
#define TOPK_BINS    (2 * TOPK_THREADS) /* two bins a thread in the scan */
#define TOPK_CAND    1024
#define TOPK_CACHE   20480 /* 80 KB: the scores of a 80k-token session */

typedef struct topk_shared {
    uint32_t hist[TOPK_BINS];
    uint32_t ckey[TOPK_CAND], cidx[TOPK_CAND];
    uint64_t warp_tot[TOPK_WARPS];
    float wmin[TOPK_WARPS], wmax[TOPK_WARPS];
    uint32_t wbad[TOPK_WARPS];
    uint32_t tb, nb, m, ncand, prefix, need;
} topk_shared;

static __device__ __forceinline__ bool topk_finite(float v) {
    return (__float_as_uint(v) & 0x7f800000u) != 0x7f800000u;
}

/* Scores i0, i0 + TOPK_THREADS, .. (TOPK_BATCH of them; 0 past n). */
static __device__ __forceinline__ void topk_load(const float *src, uint32_t i0, uint32_t n, float (&v)[TOPK_BATCH]) {
#pragma unroll
    for (int u = 0; u < TOPK_BATCH; u++) {
        uint32_t i = i0 + u * TOPK_THREADS;
        v[u] = i < n ? src[i] : 0.0f;
    }
}

/* Inclusive prefix of v over the warp's lanes. */
static __device__ __forceinline__ uint64_t topk_warp_prefix(uint64_t v) {
    unsigned lane = threadIdx.x & 31;
    for (unsigned o = 1; o < 32; o <<= 1) {
        uint64_t u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

/* warp_tot[w] (one value a warp, stored by the caller) becomes the sum of
 * the values of warps 0 .. w - 1, for every thread to read. */
static __device__ void topk_warps_before(uint64_t *warp_tot) {
    __syncthreads();
    if (threadIdx.x < 32) {
        uint64_t w = warp_tot[threadIdx.x];
        warp_tot[threadIdx.x] = topk_warp_prefix(w) - w;
    }
    __syncthreads();
}

/* Exclusive prefix over the block's threads, in thread order, of v. */
static __device__ uint64_t topk_scan(uint64_t v, uint64_t *warp_tot) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    uint64_t incl = topk_warp_prefix(v);
    if (lane == 31) warp_tot[warp] = incl;
    topk_warps_before(warp_tot);
    uint64_t r = warp_tot[warp] + incl - v;
    __syncthreads(); /* warp_tot is free again */
    return r;
}

/* Pass 0: the scores into the cache (when given), and their range; false
 * when one is not finite. */
static __device__ bool topk_range(const float *sc, uint32_t nc, float *cache, topk_shared &sh, float *vmin,
                                  float *vmax) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float lo = INFINITY, hi = -INFINITY;
    bool ok = true;
    for (uint32_t i0 = threadIdx.x; i0 < nc; i0 += TOPK_BATCH * TOPK_THREADS) {
        float v[TOPK_BATCH];
        topk_load(sc, i0, nc, v);
#pragma unroll
        for (int u = 0; u < TOPK_BATCH; u++) {
            uint32_t i = i0 + u * TOPK_THREADS;
            if (i >= nc) break;
            if (cache) cache[i] = v[u];
            lo = fminf(lo, v[u]);
            hi = fmaxf(hi, v[u]);
            ok = ok && topk_finite(v[u]);
        }
    }
    lo = -warp_max(-lo);
    hi = warp_max(hi);
    bool wok = __all_sync(0xffffffffu, ok);
    if (lane == 0) {
        sh.wmin[warp] = lo;
        sh.wmax[warp] = hi;
        sh.wbad[warp] = !wok;
    }
    __syncthreads();
    lo = -warp_max(-sh.wmin[lane]);
    hi = warp_max(sh.wmax[lane]);
    ok = !__any_sync(0xffffffffu, sh.wbad[lane] != 0);
    __syncthreads(); /* wmin .. are read before any reuse */
    *vmin = lo;
    *vmax = hi;
    return ok;
}

/* The bin of a score in [vmin, vmax]: monotone in v. */
static __device__ __forceinline__ uint32_t topk_bin(float v, float vmin, float scale) {
    float f = (v - vmin) * scale;
    return f < (float)(TOPK_BINS - 1) ? (uint32_t)f : TOPK_BINS - 1;
}

/* Warp w's span of the keys: [w span, (w + 1) span), span a multiple of 32. */
static __device__ __forceinline__ void topk_span(uint32_t nc, uint32_t *w0, uint32_t *w1) {
    uint32_t span = ((nc + TOPK_WARPS - 1) / TOPK_WARPS + 31) / 32 * 32, warp = threadIdx.x / 32;
    *w0 = warp * span < nc ? warp * span : nc;
    *w1 = *w0 + span < nc ? *w0 + span : nc;
}

/* The linear way: sets sh.prefix (the k-th largest key) and sh.need (how
 * many keys equal to it the selection takes, first in index order), and
 * for the warp's span the keys greater than and equal to the prefix (in
 * *ngt, *neq); or returns false (the threshold bin holds more than
 * TOPK_CAND keys). */
static __device__ bool topk_linear(const float *src, uint32_t nc, uint32_t k, float vmin, float vmax, topk_shared &sh,
                                   uint32_t *ngt, uint32_t *neq) {
    unsigned lane = threadIdx.x & 31;
    float scale = (float)TOPK_BINS / (vmax - vmin);
    for (uint32_t i = threadIdx.x; i < TOPK_BINS; i += TOPK_THREADS) sh.hist[i] = 0;
    if (threadIdx.x == 0) sh.ncand = 0;
    __syncthreads();
    for (uint32_t i0 = threadIdx.x; i0 < nc; i0 += TOPK_BATCH * TOPK_THREADS) {
        float v[TOPK_BATCH];
        topk_load(src, i0, nc, v);
#pragma unroll
        for (int u = 0; u < TOPK_BATCH; u++)
            if (i0 + u * TOPK_THREADS < nc) atomicAdd(&sh.hist[topk_bin(v[u], vmin, scale)], 1u);
    }
    __syncthreads();
    /* thread j holds bins B - 1 - 2 j and B - 2 - 2 j: its exclusive prefix
     * counts the keys of the higher bins */
    uint32_t bh = TOPK_BINS - 1 - 2 * threadIdx.x, ch = sh.hist[bh], cl = sh.hist[bh - 1];
    uint64_t above = topk_scan(ch + cl, sh.warp_tot);
    if (above < k && above + ch + cl >= k) {
        bool high = above + ch >= k;
        sh.tb = high ? bh : bh - 1;
        sh.nb = k - (uint32_t)(high ? above : above + ch);
        sh.m = high ? ch : cl;
    }
    __syncthreads();
    uint32_t tb = sh.tb, nb = sh.nb, m = sh.m;
    if (m > TOPK_CAND) return false;
    /* the threshold bin's keys (in any order), and the keys of higher bins
     * in the warp's span */
    uint32_t w0, w1, nabove = 0;
    topk_span(nc, &w0, &w1);
    for (uint32_t b = w0; b < w1; b += 32) {
        uint32_t i = b + lane;
        float v = i < w1 ? src[i] : vmin;
        uint32_t bin = topk_bin(v, vmin, scale);
        nabove += __popc(__ballot_sync(0xffffffffu, i < w1 && bin > tb));
        if (i < w1 && bin == tb) {
            uint32_t slot = atomicAdd(&sh.ncand, 1u);
            sh.ckey[slot] = dev_order_key(v);
            sh.cidx[slot] = i;
        }
    }
    __syncthreads();
    /* rank them (key descending, index ascending): the nb-th is the k-th
     * largest of all, and takes the equal keys up to its own index */
    for (uint32_t c = threadIdx.x; c < m; c += TOPK_THREADS) {
        uint32_t kc = sh.ckey[c], ic = sh.cidx[c], rank = 0, gt = 0;
        for (uint32_t j = 0; j < m; j++) {
            uint32_t kj = sh.ckey[j];
            gt += kj > kc;
            rank += kj > kc || (kj == kc && sh.cidx[j] < ic);
        }
        if (rank == nb - 1) {
            sh.prefix = kc;
            sh.need = nb - gt;
        }
    }
    __syncthreads();
    /* the span's candidates above and equal to the prefix */
    uint32_t prefix = sh.prefix, cgt = 0, ceq = 0;
    for (uint32_t c = lane; c < m; c += 32) {
        bool in = sh.cidx[c] >= w0 && sh.cidx[c] < w1;
        cgt += in && sh.ckey[c] > prefix;
        ceq += in && sh.ckey[c] == prefix;
    }
    for (unsigned o = 16; o > 0; o >>= 1) {
        cgt += __shfl_xor_sync(0xffffffffu, cgt, o);
        ceq += __shfl_xor_sync(0xffffffffu, ceq, o);
    }
    *ngt = nabove + cgt;
    *neq = ceq;
    return true;
}

/* By warp 0: the largest digit d whose bins d..255 hold at least `need`
 * keys (or 0), the keys above it subtracted from `need`.  Lane l owns bins
 * 255 - 8l .. 248 - 8l; a scan over the lanes finds the lane, which walks
 * its eight bins. */
static __device__ void topk_pick_bin(const uint32_t *hist, uint32_t prefix, uint32_t need, int shift,
                                     uint32_t *out_prefix, uint32_t *out_need) {
    unsigned lane = threadIdx.x;
    uint32_t hb[8], lsum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        hb[i] = hist[255 - 8 * lane - i];
        lsum += hb[i];
    }
    uint32_t incl = lsum;
    for (unsigned o = 1; o < 32; o <<= 1) {
        uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
    unsigned src = hit ? (unsigned)(__ffs((int)hit) - 1) : 31;
    if (lane != src) return;
    uint32_t acc = incl - lsum, d = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        d = 255 - 8 * lane - i;
        if (acc + hb[i] >= need || d == 0) break;
        acc += hb[i];
    }
    *out_prefix = prefix | (d << shift);
    *out_need = need - acc;
}

/* The radix way: sets sh.prefix and sh.need as topk_linear does. */
static __device__ void topk_radix(const float *src, uint32_t nc, uint32_t k, topk_shared &sh) {
    uint32_t prefix = 0, need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (uint32_t i = threadIdx.x; i < 256; i += TOPK_THREADS) sh.hist[i] = 0;
        __syncthreads();
        uint32_t hmask = shift == 24 ? 0 : 0xFFFFFFFFu << (shift + 8);
        for (uint32_t i0 = threadIdx.x; i0 < nc; i0 += TOPK_BATCH * TOPK_THREADS) {
            float v[TOPK_BATCH];
            topk_load(src, i0, nc, v);
#pragma unroll
            for (int u = 0; u < TOPK_BATCH; u++) {
                uint32_t key = dev_order_key(v[u]);
                if (i0 + u * TOPK_THREADS < nc && (key & hmask) == (prefix & hmask))
                    atomicAdd(&sh.hist[(key >> shift) & 255], 1u);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) topk_pick_bin(sh.hist, prefix, need, shift, &sh.prefix, &sh.need);
        __syncthreads();
        prefix = sh.prefix;
        need = sh.need;
        __syncthreads();
    }
}

/* The order keys b + 32 u + lane of the warp's span, every load issued
 * before any is used (0 past w1). */
static __device__ __forceinline__ void topk_span_keys(const float *src, uint32_t b, uint32_t w1,
                                                      uint32_t (&key)[TOPK_WBATCH]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < TOPK_WBATCH; u++) {
        uint32_t i = b + 32 * u + lane;
        key[u] = i < w1 ? dev_order_key(src[i]) : 0;
    }
}

/* The keys of the warp's span greater than and equal to prefix (the
 * radix way's counts; the linear way has them from its passes). */
static __device__ void topk_count(const float *src, uint32_t nc, uint32_t prefix, uint32_t *ngt, uint32_t *neq) {
    unsigned lane = threadIdx.x & 31;
    uint32_t w0, w1, gt = 0, eq = 0;
    topk_span(nc, &w0, &w1);
    for (uint32_t b = w0; b < w1; b += 32 * TOPK_WBATCH) {
        uint32_t key[TOPK_WBATCH];
        topk_span_keys(src, b, w1, key);
#pragma unroll
        for (int u = 0; u < TOPK_WBATCH; u++) {
            bool on = b + 32 * u + lane < w1;
            gt += __popc(__ballot_sync(0xffffffffu, on && key[u] > prefix));
            eq += __popc(__ballot_sync(0xffffffffu, on && key[u] == prefix));
        }
    }
    *ngt = gt;
    *neq = eq;
}

/* Every key above prefix and the first `need` equal to it, in index
 * order: after a scan of the warps' counts, each warp writes its span's,
 * 32 keys a step (a ballot orders them within the step). */
static __device__ void topk_write(const float *src, uint32_t nc, uint32_t prefix, uint32_t need, uint32_t ngt,
                                  uint32_t neq, uint32_t *vis, topk_shared &sh) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, lt = (1u << lane) - 1;
    if (lane == 0) sh.warp_tot[warp] = (uint64_t)ngt << 32 | neq;
    topk_warps_before(sh.warp_tot);
    /* oe: equal keys before the step; out: keys taken before it */
    uint32_t oe = (uint32_t)sh.warp_tot[warp], out = (uint32_t)(sh.warp_tot[warp] >> 32) + (oe < need ? oe : need);
    uint32_t w0, w1;
    topk_span(nc, &w0, &w1);
    for (uint32_t b = w0; b < w1; b += 32 * TOPK_WBATCH) {
        uint32_t key[TOPK_WBATCH];
        topk_span_keys(src, b, w1, key);
#pragma unroll
        for (int u = 0; u < TOPK_WBATCH; u++) {
            uint32_t i = b + 32 * u + lane;
            bool on = i < w1, take = on && key[u] > prefix;
            unsigned eqm = __ballot_sync(0xffffffffu, on && key[u] == prefix);
            if (eqm) { /* rare: equal keys, taken while fewer than need came before */
                take = take || ((eqm >> lane & 1) && oe + __popc(eqm & lt) < need);
                oe += __popc(eqm);
            }
            unsigned tm = __ballot_sync(0xffffffffu, take);
            if (take) vis[out + __popc(tm & lt)] = i;
            out += __popc(tm);
        }
    }
}

/* Visible rows of query t: all of its prefix, or the top-k scores (higher
 * first, lower index on ties) listed in ascending row order.  32 registers
 * a thread: the block must not need a whole SM's registers, or in a graph
 * it waits for one to drain (64 measured slower in decode). */
static __global__ void __launch_bounds__(TOPK_THREADS, 2) topk_kernel(topk_args a) {
    uint32_t pos0 = dev_pdl_wait_pos(a.pos0, a.pos_early);
    dev_pdl_launch_next(); /* after the wait, as idx_score_kernel */
    __shared__ topk_shared sh;
    DS4_DYN_SMEM(float, cache);
    uint32_t t = blockIdx.x, nc = (pos0 + t + 1) / 4, k = a.top_k;
    uint32_t *vis = a.vis + (size_t)t * k;
    if (nc <= k) {
        for (uint32_t i = threadIdx.x; i < nc; i += blockDim.x) vis[i] = i;
        if (threadIdx.x == 0) a.nvis[t] = nc;
        return;
    }
    const float *sc = a.scores + (size_t)t * a.score_stride;
    bool cached = nc <= a.cache;
    float vmin, vmax;
    bool finite = topk_range(sc, nc, cached ? cache : NULL, sh, &vmin, &vmax);
    const float *src = cached ? cache : sc;
    uint32_t ngt, neq;
    if (!(finite && vmin < vmax && topk_finite(vmax - vmin) && topk_linear(src, nc, k, vmin, vmax, sh, &ngt, &neq))) {
        topk_radix(src, nc, k, sh);
        topk_count(src, nc, sh.prefix, &ngt, &neq);
    }
    topk_write(src, nc, sh.prefix, sh.need, ngt, neq, vis, sh);
    if (threadIdx.x == 0) a.nvis[t] = k;
}

/* The visible rows of T queries from their scores (cu_indexer; exported
 * for the kernel test). */
int cu_topk(const uint32_t *pos0, bool pos_early, const float *scores, size_t score_stride, uint32_t max_nc, uint32_t T,
            uint32_t top_k, uint32_t *vis, uint32_t *nvis, cudaStream_t st, ds4_err *err) {
    uint32_t cache = max_nc < TOPK_CACHE ? max_nc : TOPK_CACHE;
    topk_args k = {pos0, pos_early, scores, score_stride, top_k, vis, nvis, cache};
    if (cu_allow_smem<topk_kernel>(cache * sizeof(float), err)) return -1;
    DS4_LAUNCH(topk_kernel, T, TOPK_THREADS, cache * sizeof(float), st, k);
    CU_LAUNCHED();
    return 0;
}

int cu_idx_scores(const uint32_t *pos0, bool pos_early, const float *iq, const float *iw, const float *rows, uint32_t T,
                  uint32_t max_nc, uint32_t heads, uint32_t ihd, uint32_t top_k, float *scores, size_t score_stride,
                  bool tc, cudaStream_t st, ds4_err *err) {
    if (heads > IDX_MAX_HEADS || ihd > IDX_MAX_DIM || ihd % 32)
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "CUDA backend: indexer heads %u x %u (needs <= %u x %u, a multiple of 32)", heads, ihd,
                           IDX_MAX_HEADS, IDX_MAX_DIM);
    if (max_nc <= top_k) return 0;
    idx_args a = {pos0, pos_early, iq, iw, rows, scores, score_stride, heads, ihd, top_k};
    if (tc) {
        dim3 grid((max_nc + IDXC_ROWS - 1) / IDXC_ROWS, T);
        if (ihd == 128) {
            if (cu_allow_smem<idx_score_tc_kernel<128>>(idx_tc_smem(), err)) return -1;
            DS4_LAUNCH(idx_score_tc_kernel<128>, grid, IDXC_WARPS * 32, idx_tc_smem(), st, a);
        } else {
            if (cu_allow_smem<idx_score_tc_kernel<0>>(idx_tc_smem(), err)) return -1;
            DS4_LAUNCH(idx_score_tc_kernel<0>, grid, IDXC_WARPS * 32, idx_tc_smem(), st, a);
        }
    } else {
        /* at least IDX_GRID blocks where the rows allow 32 a block, and
         * never more than IDX_TILE rows a block */
        uint32_t blocks = (max_nc + IDX_GROUPS - 1) / IDX_GROUPS;
        if (blocks > IDX_GRID) blocks = IDX_GRID;
        if (blocks < (max_nc + IDX_TILE - 1) / IDX_TILE) blocks = (max_nc + IDX_TILE - 1) / IDX_TILE;
        if (cu_allow_smem<idx_score_kernel>(idx_simt_smem(), err)) return -1;
        DS4_LAUNCH(idx_score_kernel, dim3(blocks, T), IDX_THREADS, idx_simt_smem(), st, a);
    }
    CU_LAUNCHED();
    return 0;
}

/* A prefill pass scores on the tensor cores (61k tokens at 64k: 1719 ->
 * 2350 t/s); a decode step keeps the SIMT kernel, which is faster for one
 * query (135.0 vs 128.1 t/s at 4k, measured with fde0567). */
int cu_indexer(cuda_backend *b, uint32_t il, uint32_t T, uint32_t pos0, bool decode, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t max_nc = decode ? cu_dec_cap(b, 4) : (pos0 + T) / 4;
    bool early = cu_pos_early(b, T);
    if (cu_idx_scores(&b->sq->d_step->pos, early, b->iq, b->iw, b->sq->L[il].idx, T, max_nc, c->idx_n_head,
                      c->idx_head_dim, c->idx_top_k, b->idx_scores, b->comp_cap4, !decode, b->st, err))
        return -1;
    return cu_topk(&b->sq->d_step->pos, early, b->idx_scores, b->comp_cap4, max_nc, T, c->idx_top_k, b->vis, b->nvis,
                   b->st, err);
}
