/*
 * cuda_lowprec.cuh - the low-precision simulations of docs/MODEL.md 4.3-4.4 as
 * device code (the GPU side of src/model/lowprec.c): FP8 E4M3 round trip
 * of KV rows, Hadamard + FP4 E2M1 round trip of indexer rows.
 *
 * The CPU finds the nearest grid value by searching a table, ties to the
 * even code; here it is computed in closed form: round-to-nearest-even of
 * the value in units of its binade's step (rintf), which picks the same
 * grid point, because within a binade the code's parity is the parity of
 * the integer step count and at a binade boundary the even code is the
 * one above.  test_cuda_kernels checks the two bit for bit.
 */
#ifndef DS4_MODEL_CUDA_CUDA_LOWPREC_CUH
#define DS4_MODEL_CUDA_CUDA_LOWPREC_CUH

#include "model/cuda/cuda_rt.h"

static __device__ __forceinline__ float pow2_ceil(float r) {
    int e;
    float m = frexpf(r, &e);
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

/* Nearest E4M3FN magnitude of a (0 <= a <= 448), ties to the even code. */
static __device__ __forceinline__ float e4m3_round(float a) {
    if (a < 0.015625f) return rintf(a * 512.0f) * (1.0f / 512.0f);
    int e;
    frexpf(a, &e); /* a in [2^(e-1), 2^e) */
    float step = ldexpf(1.0f, e - 4);
    return rintf(a / step) * step;
}

/* Nearest E2M1 magnitude of a (0 <= a <= 6), ties to the even code. */
static __device__ __forceinline__ float e2m1_round(float a) {
    if (a < 2.0f) return rintf(a * 2.0f) * 0.5f;
    if (a < 4.0f) return rintf(a);
    return a <= 5.0f ? 4.0f : 6.0f;
}

/* FP8 round trip of x[0..n) (n a multiple of 64) in place, blocks of 64;
 * whole block participates (x in shared memory). */
static __device__ void block_fp8_roundtrip(float *x, uint32_t n) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();
    for (uint32_t b = warp; b < n / 64; b += nw) {
        float v0 = x[64 * b + lane], v1 = x[64 * b + 32 + lane];
        float amax = warp_max(fmaxf(fabsf(v0), fabsf(v1)));
        float scale = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
        float a0 = fminf(fmaxf(v0 / scale, -448.0f), 448.0f), a1 = fminf(fmaxf(v1 / scale, -448.0f), 448.0f);
        float r0 = e4m3_round(fminf(fabsf(a0), 448.0f)), r1 = e4m3_round(fminf(fabsf(a1), 448.0f));
        x[64 * b + lane] = (a0 < 0 ? -r0 : r0) * scale;
        x[64 * b + 32 + lane] = (a1 < 0 ? -r1 : r1) * scale;
    }
    __syncthreads();
}

/* The FP4 round trip of a value v of a block of 32 whose largest
 * magnitude is amax. */
static __device__ __forceinline__ float fp4_roundtrip(float v, float amax) {
    float scale = pow2_ceil(fmaxf(amax, 7.052966104933725e-38f) / 6.0f);
    float a = fminf(fmaxf(v / scale, -6.0f), 6.0f);
    float r = e2m1_round(fabsf(a));
    return (a < 0 ? -r : r) * scale;
}

#define QAT_H 0.08838834764831845f /* 1 / sqrt(128) */

/* Hadamard (128, natural order, 1/sqrt(128)) then FP4 round trip in blocks
 * of 32, in place on 128 values in shared memory. */
static __device__ void block_qat128(float *x) {
    __syncthreads();
    for (int stride = 1; stride < 128; stride *= 2) {
        for (unsigned p = threadIdx.x; p < 64; p += blockDim.x) {
            unsigned i = (p / stride) * 2 * stride + (p % stride), j = i + stride;
            float a = x[i], b = x[j];
            x[i] = a + b;
            x[j] = a - b;
        }
        __syncthreads();
    }
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (uint32_t b = warp; b < 4; b += nw) {
        float v = x[32 * b + lane] * QAT_H;
        x[32 * b + lane] = fp4_roundtrip(v, warp_max(fabsf(v)));
    }
    __syncthreads();
}

/* block_qat128 of 128 values held by one warp, lane l holding values
 * 4 l .. 4 l + 3: the butterflies of strides 1 and 2 in the lane, the
 * wider ones with the lane l ^ stride / 4 (each value a + b or a - b of
 * the same two operands as there), a block of 32 in 8 lanes. */
static __device__ __forceinline__ void warp_qat128(float (&x)[4]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int stride = 1; stride < 4; stride *= 2)
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (!(i & stride)) {
                float a = x[i], b = x[i + stride];
                x[i] = a + b;
                x[i + stride] = a - b;
            }
#pragma unroll
    for (unsigned m = 1; m < 32; m *= 2)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float o = __shfl_xor_sync(0xffffffffu, x[i], m);
            x[i] = lane & m ? o - x[i] : x[i] + o;
        }
    float v[4], amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[i] = x[i] * QAT_H;
        amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (unsigned m = 1; m < 8; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
#pragma unroll
    for (int i = 0; i < 4; i++) x[i] = fp4_roundtrip(v[i], amax);
}

#endif
