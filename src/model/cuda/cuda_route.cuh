/*
 * cuda_route.cuh - the routing of one token by one warp (spec/MODEL.md
 * 6.4, as cpu_ffn.c): router probabilities sqrt(softplus), the hash table
 * or the biased top-k (descending, lower index on ties), the normalised
 * routing weights.  Used by route_kernel (cuda_ffn.cu) and by the last
 * router block of a decode step's product (cuda_matmul.cu), which routes
 * while the rest of that launch still streams its weights.
 */
#ifndef DS4_CUDA_ROUTE_CUH
#define DS4_CUDA_ROUTE_CUH

#include "model/cuda/cuda_internal.h"

static __device__ __forceinline__ float dev_softplus(float x) {
    if (x > 20.0f) return x;
    if (x < -20.0f) return expf(x);
    return log1pf(expf(x));
}

/* One warp per token; lane l holds experts l, l + 32, ... (PER of them)
 * in registers, so the top-k rounds are register scans and shuffles with
 * no shared-memory round trips. */
template <int PER> static __device__ __forceinline__ void route_warp(const route_args &a, uint32_t t) {
    uint32_t ne = a.n_expert, k = a.k;
    unsigned lane = threadIdx.x & 31;
    float prob[PER], score[PER];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        uint32_t e = lane + 32 * j;
        float p = e < ne ? sqrtf(dev_softplus(__ldcg(a.logits + (size_t)t * ne + e))) : 0.0f;
        prob[j] = p;
        score[j] = e < ne ? p + (a.bias ? a.bias[e] : 0.0f) : 0.0f;
    }
    uint32_t open = 0; /* bit j: expert lane + 32 j exists and is not taken yet */
#pragma unroll
    for (int j = 0; j < PER; j++)
        if (lane + 32 * j < ne) open |= 1u << j;
    int chosen = -1;  /* lane i < k: the i-th selected expert */
    float cprob = 0.0f; /* and its probability */
    if (a.hash) {
        if (lane < k) chosen = a.hash[(size_t)a.tok[t] * k + lane];
        /* the owner of each chosen expert hands its probability over */
        for (uint32_t i = 0; i < k; i++) {
            int e = __shfl_sync(0xffffffffu, chosen, i);
            float p = 0.0f;
#pragma unroll
            for (int j = 0; j < PER; j++)
                if ((uint32_t)e == lane + 32 * j) p = prob[j];
            p = __shfl_sync(0xffffffffu, p, (unsigned)e & 31);
            if (lane == i) cprob = p;
        }
    } else {
        /* k rounds of: the best untaken expert by prob + bias, lower index
         * first on ties (the CPU's stable insertion top-k) */
        for (uint32_t i = 0; i < k; i++) {
            float bv = -INFINITY, bp = 0.0f;
            int bi = 0x7fffffff;
#pragma unroll
            for (int j = 0; j < PER; j++) {
                int e = (int)(lane + 32 * j);
                if (((open >> j) & 1) && (score[j] > bv || (score[j] == bv && e < bi))) { bv = score[j]; bi = e; bp = prob[j]; }
            }
            for (int o = 16; o > 0; o >>= 1) {
                float v2 = __shfl_xor_sync(0xffffffffu, bv, o), p2 = __shfl_xor_sync(0xffffffffu, bp, o);
                int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
                if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; bp = p2; }
            }
            if (lane == i) { chosen = bi; cprob = bp; }
#pragma unroll
            for (int j = 0; j < PER; j++)
                if ((int)(lane + 32 * j) == bi) open &= ~(1u << j);
        }
    }
    /* the weights, summed in selection order as the CPU does */
    float sum = 0.0f;
    for (uint32_t i = 0; i < k; i++) sum += __shfl_sync(0xffffffffu, cprob, i);
    float nrm = a.norm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f;
    if (lane < k) {
        a.sel[(size_t)t * k + lane] = chosen;
        a.selw[(size_t)t * k + lane] = cprob * nrm * a.scale;
    }
}

#endif
