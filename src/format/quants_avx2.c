/*
 * quants_avx2.c - AVX2+FMA+F16C dot-product kernels, chosen at run time by
 * quants.c when the CPU has them (the Makefile compiles every file for the
 * baseline ISA, so each function carries its own target attribute).
 *
 * Every kernel returns the same bits as its scalar definition in
 * quants_dot.c: integer block sums are exact whatever the order, and the
 * float work follows the same lanes, the same per-block expression and the
 * same reduction tree.  Products are exact before a fused multiply-add only
 * in the F32 kernel (f32 x f32 fits a double), which is the one place FMA is
 * used.  The int8 paths rely on activations in [-127, 127] (as produced by
 * ds4_quantize_q8_0x / ds4_quantize_q8_K), so that _mm256_sign_epi8 never
 * negates -128 and _mm256_maddubs_epi16 never saturates.
 */
#include "format/quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

AVX2 static inline float f16_scalar(uint16_t h) {
    return _cvtsh_ss(h);
}

/* ------------------------------------------------------------------ F32 */

AVX2 static inline __m256d widen_lo(__m256 v) {
    return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}

AVX2 static inline __m256d widen_hi(__m256 v) {
    return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

/* Accumulators are named variables (not an array) so that they stay in
 * registers: GCC at -O2 neither unrolls a loop over an array of vectors nor
 * keeps it out of memory. */
AVX2 float ds4_dot_f32_avx2(int64_t n, const void *w, const void *act) {
    const float *a = w, *x = act;
    __m256d c0 = _mm256_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_loadu_ps(a + i), w1 = _mm256_loadu_ps(a + i + 8);
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        /* exact products (f32 x f32 fits a double): FMA equals mul + add */
        c0 = _mm256_fmadd_pd(widen_lo(w0), widen_lo(x0), c0);
        c1 = _mm256_fmadd_pd(widen_hi(w0), widen_hi(x0), c1);
        c2 = _mm256_fmadd_pd(widen_lo(w1), widen_lo(x1), c2);
        c3 = _mm256_fmadd_pd(widen_hi(w1), widen_hi(x1), c3);
    }
    double lanes[DS4_F64_LANES];
    _mm256_storeu_pd(lanes, c0);
    _mm256_storeu_pd(lanes + 4, c1);
    _mm256_storeu_pd(lanes + 8, c2);
    _mm256_storeu_pd(lanes + 12, c3);
    for (; i < n; i++) lanes[i % DS4_F64_LANES] += (double)a[i] * (double)x[i];
    return (float)ds4_reduce_f64_lanes(lanes);
}

/* ------------------------------------------------------------ F16, BF16 */

AVX2 static inline __m256 load_f16x8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* Tail and reduction shared by the F16/BF16 kernels: the accumulators hold
 * lanes 0..31, the remaining elements go to lane i % 32 as in the scalar. */
AVX2 static float finish_f16(__m256 c0, __m256 c1, __m256 c2, __m256 c3, int64_t i, int64_t n,
                             const uint16_t *a, const float *x, int bf16) {
    float lanes[DS4_F32_LANES];
    _mm256_storeu_ps(lanes, c0);
    _mm256_storeu_ps(lanes + 8, c1);
    _mm256_storeu_ps(lanes + 16, c2);
    _mm256_storeu_ps(lanes + 24, c3);
    for (; i < n; i++) {
        float p = (bf16 ? ds4_bf16_to_f32(a[i]) : ds4_f16_to_f32(a[i])) * x[i];
        lanes[i % DS4_F32_LANES] += p;
    }
    return ds4_reduce_f32_lanes(lanes);
}

/* One step of 32 elements: multiply, then add (no FMA: the f16 x f32
 * product is inexact, and the scalar definition rounds it). */
#define F16_STEP(load)                                                                  \
    do {                                                                                \
        c0 = _mm256_add_ps(c0, _mm256_mul_ps(load(a + i), _mm256_loadu_ps(x + i)));           \
        c1 = _mm256_add_ps(c1, _mm256_mul_ps(load(a + i + 8), _mm256_loadu_ps(x + i + 8)));   \
        c2 = _mm256_add_ps(c2, _mm256_mul_ps(load(a + i + 16), _mm256_loadu_ps(x + i + 16))); \
        c3 = _mm256_add_ps(c3, _mm256_mul_ps(load(a + i + 24), _mm256_loadu_ps(x + i + 24))); \
    } while (0)

AVX2 float ds4_dot_f16_avx2(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *x = act;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) F16_STEP(load_f16x8);
    return finish_f16(c0, c1, c2, c3, i, n, a, x, 0);
}

AVX2 float ds4_dot_bf16_avx2(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *x = act;
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) F16_STEP(load_bf16x8);
    return finish_f16(c0, c1, c2, c3, i, n, a, x, 1);
}

/* ----------------------------------------------------------------- Q8_0 */

/* 8 int32 partial sums of one block's int8 dot: |w| times w's sign applied
 * to the activation (exact for activations in [-127, 127]). */
AVX2 static inline __m256i q8_block_partials(const ds4_block_q8_0 *a, const ds4_block_q8_0x *x) {
    __m256i w = _mm256_loadu_si256((const __m256i *)a->qs);
    __m256i v = _mm256_loadu_si256((const __m256i *)x->qs);
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(v, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The int32 sums of 8 consecutive blocks, block k in element k. */
AVX2 static inline __m256i q8_sums8(const ds4_block_q8_0 *a, const ds4_block_q8_0x *x) {
    __m256i h01 = _mm256_hadd_epi32(q8_block_partials(a + 0, x + 0), q8_block_partials(a + 1, x + 1));
    __m256i h23 = _mm256_hadd_epi32(q8_block_partials(a + 2, x + 2), q8_block_partials(a + 3, x + 3));
    __m256i h45 = _mm256_hadd_epi32(q8_block_partials(a + 4, x + 4), q8_block_partials(a + 5, x + 5));
    __m256i h67 = _mm256_hadd_epi32(q8_block_partials(a + 6, x + 6), q8_block_partials(a + 7, x + 7));
    __m256i lo = _mm256_hadd_epi32(h01, h23), hi = _mm256_hadd_epi32(h45, h67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20), _mm256_permute2x128_si256(lo, hi, 0x31));
}

AVX2 static inline __m256 q8_scales8(const ds4_block_q8_0 *a, const ds4_block_q8_0x *x) {
    __m128i d16 = _mm_setr_epi16((short)a[0].d, (short)a[1].d, (short)a[2].d, (short)a[3].d,
                                 (short)a[4].d, (short)a[5].d, (short)a[6].d, (short)a[7].d);
    __m256 xd = _mm256_setr_ps(x[0].d, x[1].d, x[2].d, x[3].d, x[4].d, x[5].d, x[6].d, x[7].d);
    return _mm256_mul_ps(_mm256_cvtph_ps(d16), xd);
}

AVX2 static float q8_finish(__m256 acc, int64_t b, int64_t nb, const ds4_block_q8_0 *a,
                            const ds4_block_q8_0x *x) {
    float lanes[DS4_Q8_LANES];
    _mm256_storeu_ps(lanes, acc);
    for (; b < nb; b++) {
        int32_t sum = hsum_i32(q8_block_partials(&a[b], &x[b]));
        float c = (f16_scalar(a[b].d) * x[b].d) * (float)sum;
        lanes[b % DS4_Q8_LANES] += c;
    }
    return ds4_reduce_q8_lanes(lanes);
}

AVX2 float ds4_dot_q8_0_avx2(int64_t n, const void *w, const void *act) {
    const ds4_block_q8_0 *a = w;
    const ds4_block_q8_0x *x = act;
    int64_t nb = n / DS4_QK8_0, b = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256 c = _mm256_mul_ps(q8_scales8(a + b, x + b), _mm256_cvtepi32_ps(q8_sums8(a + b, x + b)));
        acc = _mm256_add_ps(acc, c);
    }
    return q8_finish(acc, b, nb, a, x);
}

/* ----------------------------------------------------------------- Q2_K */

/* Shuffle controls that spread the scale of sub-blocks s (low 128 bits) and
 * s+1 (high 128 bits) over int16 lanes, for s = 0, 2, ..., 14. */
AVX2 static inline __m256i q2_scale_ctl(int s) {
    return _mm256_setr_epi8((char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1,
                            (char)s, -1, (char)s, -1, (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1),
                            -1, (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1), -1,
                            (char)(s + 1), -1);
}

AVX2 float ds4_dot_q2_K_avx2(int64_t n, const void *w, const void *act) {
    const ds4_block_q2_K *a = w;
    const ds4_block_q8_K *x = act;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m15 = _mm_set1_epi8(15);
    __m256i ctl[8];
    for (int k = 0; k < 8; k++) ctl[k] = q2_scale_ctl(2 * k);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)a[b].scales);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m15));
        __m256i bsums = _mm256_loadu_si256((const __m256i *)x[b].bsums);
        int32_t msum = hsum_i32(_mm256_madd_epi16(mins, bsums));
        __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m15));
        __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(a[b].qs + 32 * h));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i qj = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
                __m256i y = _mm256_loadu_si256((const __m256i *)(x[b].qs + 128 * h + 32 * j));
                __m256i p = _mm256_maddubs_epi16(qj, y);
                __m256i sc = _mm256_shuffle_epi8(scales, ctl[4 * h + j]);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sc));
            }
        }
        float dall = f16_scalar(a[b].d) * x[b].d;
        float dmin = f16_scalar(a[b].dmin) * x[b].d;
        acc = ds4_kq_step(acc, dall, dmin, hsum_i32(isum), msum);
    }
    return acc;
}

/* ----------------------------------------------------------------- Q4_K */

AVX2 float ds4_dot_q4_K_avx2(int64_t n, const void *w, const void *act) {
    const ds4_block_q4_K *a = w;
    const ds4_block_q8_K *x = act;
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        /* Unpack the 6-bit scales and mins four at a time (spec/MODEL.md 3.5). */
        uint32_t u[3], sc32[2], mn32[2];
        memcpy(u, a[b].scales, 12);
        sc32[0] = u[0] & 0x3f3f3f3fu;
        mn32[0] = u[1] & 0x3f3f3f3fu;
        sc32[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
        mn32[1] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
        uint8_t mn[8];
        memcpy(mn, mn32, 8);
        /* the 8 scales as bytes in both 128-bit lanes, spread by shuffles */
        __m256i scv = _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)sc32));

        __m256i pair_sums = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[b].bsums), ones);
        __m256i mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn));
        int32_t msum = hsum_i32(_mm256_mullo_epi32(pair_sums, mins));

        __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(a[b].qs + 32 * p));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i ylo = _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * p));
            __m256i yhi = _mm256_loadu_si256((const __m256i *)(x[b].qs + 64 * p + 32));
            __m256i slo = _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0xff00 | (2 * p))));
            __m256i shi = _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0xff00 | (2 * p + 1))));
            __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), slo);
            __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), shi);
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(plo, phi));
        }
        float dall = f16_scalar(a[b].d) * x[b].d;
        float dmin = f16_scalar(a[b].dmin) * x[b].d;
        acc = ds4_kq_step(acc, dall, dmin, hsum_i32(isum), msum);
    }
    return acc;
}

/* -------------------------------------------------------------- IQ2_XXS */

/* Byte k of SIGN64(s) is -1 where bit k of the sign byte of s is set, else
 * +1: the second operand of _mm256_sign_epi8. */
#define SB(s) ((s) | ((((s) ^ (s) >> 1 ^ (s) >> 2 ^ (s) >> 3 ^ (s) >> 4 ^ (s) >> 5 ^ (s) >> 6) & 1) << 7))
#define SBYTE(s, k) ((uint64_t)((SB(s) >> (k)) & 1 ? 0xff : 0x01) << (8 * (k)))
#define SIGN64(s) (SBYTE(s, 0) | SBYTE(s, 1) | SBYTE(s, 2) | SBYTE(s, 3) | SBYTE(s, 4) | SBYTE(s, 5) | \
                   SBYTE(s, 6) | SBYTE(s, 7))
#define SIGN64_8(s) SIGN64(s), SIGN64(s + 1), SIGN64(s + 2), SIGN64(s + 3), SIGN64(s + 4), \
                    SIGN64(s + 5), SIGN64(s + 6), SIGN64(s + 7)
static const uint64_t iq2_sign64[128] = {
    SIGN64_8(0),  SIGN64_8(8),  SIGN64_8(16), SIGN64_8(24), SIGN64_8(32),  SIGN64_8(40),
    SIGN64_8(48), SIGN64_8(56), SIGN64_8(64), SIGN64_8(72), SIGN64_8(80),  SIGN64_8(88),
    SIGN64_8(96), SIGN64_8(104), SIGN64_8(112), SIGN64_8(120),
};

/* Integer dot of one group of 32 (grid bytes times signed activations),
 * as 8 int32 partials already multiplied by the group scale 2S+1. */
AVX2 static inline __m256i iq2_group(const uint16_t *qs, const int8_t *y8) {
    const uint8_t *g = (const uint8_t *)qs;
    uint32_t s;
    memcpy(&s, qs + 2, 4);
    const uint64_t *grid = ds4_iq2xxs_grid;
    __m256i gv = _mm256_set_epi64x((long long)grid[g[3]], (long long)grid[g[2]], (long long)grid[g[1]],
                                   (long long)grid[g[0]]);
    __m256i sv = _mm256_set_epi64x((long long)iq2_sign64[(s >> 21) & 127], (long long)iq2_sign64[(s >> 14) & 127],
                                   (long long)iq2_sign64[(s >> 7) & 127], (long long)iq2_sign64[s & 127]);
    __m256i y = _mm256_loadu_si256((const __m256i *)y8);
    __m256i p = _mm256_maddubs_epi16(gv, _mm256_sign_epi8(y, sv));
    return _mm256_madd_epi16(p, _mm256_set1_epi16((short)(2 * (s >> 28) + 1)));
}

AVX2 float ds4_dot_iq2_xxs_avx2(int64_t n, const void *w, const void *act) {
    const ds4_block_iq2_xxs *a = w;
    const ds4_block_q8_K *x = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int ib = 0; ib < 8; ib += 2) {
            s0 = _mm256_add_epi32(s0, iq2_group(&a[b].qs[4 * ib], x[b].qs + 32 * ib));
            s1 = _mm256_add_epi32(s1, iq2_group(&a[b].qs[4 * ib + 4], x[b].qs + 32 * ib + 32));
        }
        acc = ds4_iq2_step(acc, f16_scalar(a[b].d) * x[b].d, hsum_i32(_mm256_add_epi32(s0, s1)));
    }
    return acc;
}

#else /* not x86: the dispatcher never selects these (no AVX2). */

float ds4_dot_f32_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_f32_scalar(n, w, act); }
float ds4_dot_f16_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_f16_scalar(n, w, act); }
float ds4_dot_bf16_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_bf16_scalar(n, w, act); }
float ds4_dot_q8_0_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_q8_0_scalar(n, w, act); }
float ds4_dot_q2_K_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_q2_K_scalar(n, w, act); }
float ds4_dot_q4_K_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_q4_K_scalar(n, w, act); }
float ds4_dot_iq2_xxs_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_iq2_xxs_scalar(n, w, act); }

#endif
