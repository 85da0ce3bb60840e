/*
 * cuda_route.cuh - the MoE routing of one token by one warp (docs/MODEL.md
 * 6.4, as src/model/cpu/cpu_ffn.c routes): router probabilities
 * sqrt(softplus(logit)), the experts from the hash table or by the biased
 * top-k (descending, the lower index on ties), and the normalised, scaled
 * routing weights.  Shared by the routing launch (cuda_ffn.cu: prefill,
 * and any router product that cannot host it) and by the last block of a
 * decode step's router product (cuda_matmul.cu), which routes without a
 * launch of its own.
 */
#ifndef DS4_CUDA_ROUTE_CUH
#define DS4_CUDA_ROUTE_CUH

#include "model/cuda/cuda_internal.h"

static __device__ __forceinline__ float dev_softplus(float x) {
    if (x > 20.0f) return x;
    if (x < -20.0f) return expf(x);
    return log1pf(expf(x));
}

/* The bias of the lane's experts (lane l: l, l + 32, ...): a weight, so a
 * caller loads it before waiting for the router's logits. */
template <int PER> static __device__ __forceinline__ void route_load_bias(const cu_route_in &a, float (&bias)[PER]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < PER; j++) bias[j] = a.bias && lane + 32 * j < a.n_expert ? a.bias[lane + 32 * j] : 0.0f;
}

/* Token t by the calling warp; lane l holds experts l, l + 32, ... (PER of
 * them) in registers.  Each top-k round is a register scan and two warp
 * reductions: the largest key, then the lowest index holding it (the
 * CPU's stable insertion top-k).  The rounds are the serial part, on every
 * layer's path from the router to the experts.  The logits are read
 * through the L2 (__ldcg): the router product's other blocks wrote them. */
template <int PER>
static __device__ __forceinline__ void route_token(const cu_route_in &a, uint32_t t, int *sel, float *selw,
                                                   const float (&bias)[PER]) {
    uint32_t ne = a.n_expert, k = a.k;
    unsigned lane = threadIdx.x & 31;
    /* every load issued before any value is used: the branches of the
     * softplus otherwise kept each logit's load behind the previous one's
     * use, a round trip to the L2 per expert a lane (a422c65, with the
     * argmax's loads: +3.1 % decode at 4k) */
    float logit[PER];
#pragma unroll
    for (int j = 0; j < PER; j++)
        logit[j] = lane + 32 * j < ne ? __ldcg(a.logits + (size_t)t * ne + lane + 32 * j) : 0.0f;
    float prob[PER];
    uint32_t key[PER];
    uint32_t open = 0; /* bit j: expert lane + 32 j exists and is not taken yet */
#pragma unroll
    for (int j = 0; j < PER; j++) {
        uint32_t e = lane + 32 * j;
        float p = e < ne ? sqrtf(dev_softplus(logit[j])) : 0.0f;
        prob[j] = p;
        key[j] = dev_order_key(e < ne ? p + bias[j] : 0.0f);
        if (e < ne) open |= 1u << j;
    }
    int chosen = -1;    /* lane i < k: the i-th selected expert */
    float cprob = 0.0f; /* and its probability */
    int hashed = a.hash && lane < k ? a.hash[(size_t)a.tok[t] * k + lane] : -1;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t e;
        if (a.hash) {
            e = (uint32_t)__shfl_sync(0xffffffffu, hashed, i);
        } else {
            uint32_t bk = 0;
            int bj = -1;
#pragma unroll
            for (int j = 0; j < PER; j++)
                if (((open >> j) & 1) && (bj < 0 || key[j] > bk)) {
                    bk = key[j];
                    bj = j;
                }
            uint32_t top = __reduce_max_sync(0xffffffffu, bk);
            e = __reduce_min_sync(0xffffffffu, bj >= 0 && bk == top ? 32u * (uint32_t)bj + lane : 0xffffffffu);
        }
        /* the owner of expert e hands its probability over */
        float p = 0.0f;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (e == lane + 32 * j) {
                p = prob[j];
                open &= ~(1u << j);
            }
        p = __shfl_sync(0xffffffffu, p, e & 31);
        if (lane == i) {
            chosen = (int)e;
            cprob = p;
        }
    }
    /* the weights, summed in selection order as the CPU does */
    float sum = 0.0f;
    for (uint32_t i = 0; i < k; i++) sum += __shfl_sync(0xffffffffu, cprob, i);
    float nrm = a.norm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f;
    if (lane < k) {
        sel[(size_t)t * k + lane] = chosen;
        selw[(size_t)t * k + lane] = cprob * nrm * a.scale;
        if (a.slot) a.msel[(size_t)t * k + lane] = a.slot[chosen];
        if (a.count) atomicAdd(&a.count[chosen], 1u);
    }
}

#endif
