/*
 * cuda_actq.cuh - activation quantization on the device (docs/MODEL.md
 * 3.7-3.8), for every kernel that produces an input of a quantized matrix
 * product: the CPU's formulas (amax / 127 per 32 for Q8_0 weights; the
 * signed largest value, -127 / max and the 16-value block sums per 256 for
 * K-quant weights), round-to-nearest-even, the same bytes.
 */
#ifndef DS4_MODEL_CUDA_CUDA_ACTQ_CUH
#define DS4_MODEL_CUDA_CUDA_ACTQ_CUH

#include "model/cuda/cuda_rt.h"

static __device__ inline int8_t q8_round(float v) {
    if (!(fabsf(v) < 256.0f)) return v > 0 ? 127 : -128;
    int r = __float2int_rn(v);
    return (int8_t)(r < -128 ? -128 : r > 127 ? 127 : r);
}

/* Block-wide quantization of one token row held in `x` (shared or global
 * memory, n values): writes q8 and/or qk (either may be NULL) exactly as
 * ds4_quantize_q8_0x / ds4_quantize_q8_K.  One warp per activation block;
 * every thread of the block must call it. */
static __device__ inline void dev_quantize_row(const float *x, uint32_t n, uint8_t *q8, uint8_t *qk) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    if (q8) {
        /* four blocks per warp and step: lane l holds values 4 (l % 8) ..
         * of block l / 8, the block's maximum comes from its 8 lanes (the
         * maximum does not depend on the order) */
        float *d = (float *)(q8 + n);
        uint32_t nb = n / 32;
        for (uint32_t b0 = 4 * warp; b0 < nb; b0 += 4 * nw) {
            uint32_t b = b0 + lane / 8, e = 32 * b + 4 * (lane & 7);
            bool ok = b < nb;
            float v[4];
            float amax = 0.0f;
            for (int i = 0; i < 4; i++) {
                v[i] = ok ? x[e + i] : 0.0f;
                amax = fmaxf(amax, fabsf(v[i]));
            }
            for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            float db = amax / 127.0f;
            float id = db != 0.0f ? 1.0f / db : 0.0f;
            if (ok) {
                uint32_t packed = 0;
                for (int i = 0; i < 4; i++) packed |= (uint32_t)(uint8_t)q8_round(v[i] * id) << (8 * i);
                *(uint32_t *)(q8 + e) = packed;
                if ((lane & 7) == 0) d[b] = db;
            }
        }
    }
    if (qk) {
        float *d = (float *)(qk + n);
        int16_t *bs = (int16_t *)(qk + n + n / 256 * 4);
        for (uint32_t b = warp; b < n / 256; b += nw) {
            /* the lane's eight values in registers first: stores through an
             * int8_t pointer could alias x, which would make every later
             * read of x a new round trip */
            const float *xb = x + 256 * b + 8 * lane;
            float v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = xb[i];
            float amax = 0.0f, mx = 0.0f;
            int idx = 0x7fffffff;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float ax = fabsf(v[i]);
                if (ax > amax) {
                    amax = ax;
                    mx = v[i];
                    idx = 8 * lane + i;
                }
            }
            /* the first index with the largest magnitude, as the CPU's strict > scan */
            for (int o = 16; o > 0; o >>= 1) {
                float a2 = __shfl_xor_sync(0xffffffffu, amax, o), m2 = __shfl_xor_sync(0xffffffffu, mx, o);
                int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
                if (a2 > amax || (a2 == amax && i2 < idx)) {
                    amax = a2;
                    mx = m2;
                    idx = i2;
                }
            }
            uint32_t *q = (uint32_t *)(qk + 256 * b + 8 * lane);
            uint32_t packed[2] = {0, 0};
            int s = 0;
            if (amax != 0.0f) {
                float iscale = -127.0f / mx;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    int8_t qi = q8_round(iscale * v[i]);
                    s += qi;
                    packed[i / 4] |= (uint32_t)(uint8_t)qi << (8 * (i % 4));
                }
                if (lane == 0) d[b] = 1.0f / iscale;
            } else if (lane == 0) {
                d[b] = 0.0f;
            }
            q[0] = packed[0];
            q[1] = packed[1];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            if ((lane & 1) == 0) bs[16 * b + lane / 2] = (int16_t)s;
        }
    }
}

#endif
