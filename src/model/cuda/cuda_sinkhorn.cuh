/*
 * cuda_sinkhorn.cuh - an HC site's post weights and Sinkhorn-normalised
 * combination matrix (docs/MODEL.md 5.2) from its mixer sums, by one warp with
 * one matrix entry a lane: the arithmetic of cpu_hc.c, sums in its order.
 *
 * Only the next HC launch reads the result.  A prefill pass computes it in
 * the HC finish (cuda_hc.cu).  A decode step has the launch leave its sums
 * in memory (hcsums) and a spare block of a later launch of the sublayer
 * the site prepares compute it - the attention's, the shared expert's
 * SwiGLU beside the routed experts (an hc_sink_job in their arguments) -
 * so that its 20 iterations of dependent shuffles and divisions (~5 us by
 * clock stamps on the H200) no longer end a launch that every later
 * launch waits for, and add no launch or graph branch of their own
 * (345a7aa: +1.1 % decode at 4k, docs/PERFORMANCE.md).
 */
#ifndef DS4_MODEL_CUDA_CUDA_SINKHORN_CUH
#define DS4_MODEL_CUDA_CUDA_SINKHORN_CUH

#include "model/cuda/cuda_internal.h"

static __device__ __forceinline__ float dev_sigmoid(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* Column sum of the 4 x 4 matrix held one entry per lane (lane k = a + 4b),
 * in the CPU's order a = 0..3; rows: b = 0..3. */
static __device__ __forceinline__ float hc_col_sum(float v, unsigned b) {
    float s = __shfl_sync(0xffffffffu, v, 4 * b);
    s += __shfl_sync(0xffffffffu, v, 4 * b + 1);
    s += __shfl_sync(0xffffffffu, v, 4 * b + 2);
    return s + __shfl_sync(0xffffffffu, v, 4 * b + 3);
}
static __device__ __forceinline__ float hc_row_sum(float v, unsigned a) {
    float s = __shfl_sync(0xffffffffu, v, a);
    s += __shfl_sync(0xffffffffu, v, a + 4);
    s += __shfl_sync(0xffffffffu, v, a + 8);
    return s + __shfl_sync(0xffffffffu, v, a + 12);
}

/* The mixer value m of the token (the reduced fn . S times the RMS scale,
 * as cpu_hc.c's fn . RMSNorm(S)). */
static __device__ __forceinline__ float hc_mix_value(const double *sums, uint32_t m, float rs) {
    return (float)sums[1 + m] * rs;
}

/* Lane `lane` of the warp: post weights (lanes 4..7) and the combination
 * matrix (lanes 0..15) from the sums and the RMS scale rs; s_post, s_comb
 * the site's scales, b_post (lanes 4..7) and b_comb (lane & 15) its bases. */
static __device__ __forceinline__ void hc_sinkhorn(const double *sums, float rs, float s_post, float s_comb,
                                                   float b_post, float b_comb, uint32_t iters, float eps, float *post,
                                                   float *comb, unsigned lane) {
    const uint32_t n = 4;
    if (lane >= n && lane < 2 * n) post[lane - n] = 2.0f * dev_sigmoid(hc_mix_value(sums, lane, rs) * s_post + b_post);
    unsigned e = lane & 15, ra = e % 4, cb = e / 4;
    float c = hc_mix_value(sums, 2 * n + e, rs) * s_comb + b_comb;
    /* softmax over a of each column, + eps */
    float mx = __shfl_sync(0xffffffffu, c, 4 * cb);
    for (unsigned i = 1; i < 4; i++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, 4 * cb + i));
    c = expf(c - mx);
    c = c / hc_col_sum(c, cb) + eps;
    for (uint32_t it = 0; it < iters; it++) {
        if (it > 0) c /= hc_col_sum(c, cb) + eps;
        c /= hc_row_sum(c, ra) + eps;
    }
    if (lane < 16) comb[e] = c;
}

/* A hosted job, by warp 0 of the hosting block (the other threads return).
 * The hosts (attn_heads_kernel, swiglu_kernel) test for their spare block
 * themselves: a shared helper for that test cost the attention's generic
 * instance a spill.  The scales and bases are weights, loaded before the
 * PDL wait; the sums were written by an earlier launch, complete once the
 * wait returns. */
static __device__ __forceinline__ void hc_sink_job_run(const hc_sink_job &j) {
    if (threadIdx.x >= 32) return;
    unsigned lane = threadIdx.x;
    const uint32_t n = 4;
    float s_post = j.scale[1], s_comb = j.scale[2];
    float b_post = lane >= n && lane < 2 * n ? j.base[lane] : 0.0f, b_comb = j.base[2 * n + (lane & 15)];
    dev_pdl_wait_prev();
    hc_sinkhorn(j.sums, (float)j.sums[HC_SUMS_RS], s_post, s_comb, b_post, b_comb, j.iters, j.eps, j.post, j.comb,
                lane);
}

#endif
