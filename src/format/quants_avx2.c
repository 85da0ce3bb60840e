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

AVX2 static inline float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }

/* ------------------------------------------- several activations, shared
 *
 * The integer kernels for several activations keep one integer accumulator
 * per activation, unpack each weight block into registers once, and do the
 * per-block float step of the single kernel for all activations at once in
 * the lanes of one vector (lane k is activation k; the lane operations are
 * the scalar ones, so each lane has the single kernel's bits).  The bodies
 * take the activation count as a constant (forced inlining), so that the
 * loops over activations unroll and their accumulators stay in registers;
 * the exported kernel picks the instance. */
#define AVX2_BODY static inline __attribute__((target("avx2,fma,f16c"), always_inline))

/* [sum v[0], ..., sum v[7]] of eight int32 vectors. */
AVX2 static inline __m256i hsum_i32_x8(const __m256i v[8]) {
    __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    __m256i efgh = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(abcd, efgh, 0x20), _mm256_permute2x128_si256(abcd, efgh, 0x31));
}

/* The scales d of block b of activations 0 .. nk-1 (Q8_K), 0 elsewhere. */
AVX2_BODY __m256 act_d_x8(const ds4_block_q8_K *const x[8], int64_t b, int nk) {
    float d[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < nk; k++) d[k] = x[k][b].d;
    return _mm256_loadu_ps(d);
}

/* acc + the float step of a K-quant super-block (ds4_kq_step) in every
 * lane: d x_d isum - dmin x_d msum, with the weight's f16 d and dmin. */
AVX2_BODY __m256 kq_step_x8(__m256 acc, uint16_t d, uint16_t dmin, __m256 xd, __m256i isum, __m256i msum) {
    __m256 dall = _mm256_mul_ps(_mm256_set1_ps(f16_scalar(d)), xd);
    __m256 dm = _mm256_mul_ps(_mm256_set1_ps(f16_scalar(dmin)), xd);
    __m256 p = _mm256_mul_ps(dall, _mm256_cvtepi32_ps(isum)), m = _mm256_mul_ps(dm, _mm256_cvtepi32_ps(msum));
    return _mm256_add_ps(acc, _mm256_sub_ps(p, m));
}

/* Lanes 0 .. nk-1 of acc into out. */
AVX2_BODY void store_x8(__m256 acc, int nk, float *out) {
    float v[8];
    _mm256_storeu_ps(v, acc);
    for (int k = 0; k < nk; k++) out[k] = v[k];
}

/* The exported multi kernel of an integer type, for 2 .. 8 activations. */
/* clang-format off */
#define MULTI_INT_KERNEL(name, body)                                                                   \
    AVX2 void name(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) { \
        switch (nacts) {                                                                               \
        case 2: body(n, w, act, act_stride, 2, out); break;                                            \
        case 3: body(n, w, act, act_stride, 3, out); break;                                            \
        case 4: body(n, w, act, act_stride, 4, out); break;                                            \
        case 5: body(n, w, act, act_stride, 5, out); break;                                            \
        case 6: body(n, w, act, act_stride, 6, out); break;                                            \
        case 7: body(n, w, act, act_stride, 7, out); break;                                            \
        default: body(n, w, act, act_stride, 8, out); break;                                           \
        }                                                                                              \
    }

/* The same for Q8_0, whose kernel keeps more per activation: 2 .. 4. */
#define MULTI_INT_KERNEL4(name, body)                                                                  \
    AVX2 void name(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) { \
        if (nacts == 2) body(n, w, act, act_stride, 2, out);                                           \
        else if (nacts == 3) body(n, w, act, act_stride, 3, out);                                      \
        else body(n, w, act, act_stride, 4, out);                                                      \
    }
/* clang-format on */

/* ------------------------------------------------------------------ F32 */

AVX2 static inline __m256d widen_lo(__m256 v) { return _mm256_cvtps_pd(_mm256_castps256_ps128(v)); }

AVX2 static inline __m256d widen_hi(__m256 v) { return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)); }

/* The reduction trees of quants_dot.c on vectors, for rows without a tail:
 * the same additions of the same operands in the same order, without
 * storing the lanes and reading them back.  reduce_q8_vec is
 * ds4_reduce_q8_lanes; ds4_reduce_f32_lanes is it after adding the four
 * vectors of 8 lanes as (c0 + c1) + (c2 + c3), and ds4_reduce_f64_lanes
 * ends the same way on doubles.
 *
 * The finish functions that use them are inlined into the exported kernels
 * (AVX2_BODY): GCC 12 puts vzeroupper before a return only in a function
 * that itself wrote the 256-bit registers, not in one that merely received
 * them as arguments, and a return with their upper halves dirty made every
 * later SSE instruction of the process (the scalar kernels, the baseline
 * code of the backend) two to four times slower on Zen 5. */
AVX2 static inline float reduce_q8_vec(__m256 acc) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

AVX2 static inline double reduce_f64_vec(__m256d c0, __m256d c1, __m256d c2, __m256d c3) {
    __m256d s = _mm256_add_pd(_mm256_add_pd(c0, c1), _mm256_add_pd(c2, c3));
    __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}

/* Tail (elements past the last 16) and reduction: the accumulators hold
 * lanes 0..15, the remaining elements go to lane i % 16 as in the scalar. */
AVX2_BODY float finish_f32(__m256d c0, __m256d c1, __m256d c2, __m256d c3, int64_t i, int64_t n, const float *a,
                           const float *x) {
    if (i == n) return (float)reduce_f64_vec(c0, c1, c2, c3);
    double lanes[DS4_F64_LANES];
    _mm256_storeu_pd(lanes, c0);
    _mm256_storeu_pd(lanes + 4, c1);
    _mm256_storeu_pd(lanes + 8, c2);
    _mm256_storeu_pd(lanes + 12, c3);
    for (; i < n; i++) lanes[i % DS4_F64_LANES] += (double)a[i] * (double)x[i];
    return (float)ds4_reduce_f64_lanes(lanes);
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
    return finish_f32(c0, c1, c2, c3, i, n, a, x);
}

/* Two activations: the widened weights are shared, the accumulators of
 * each activation are those of the single kernel. */
AVX2 static inline void f32_multi2(int64_t n, const float *a, const float *x, const float *z, float *out) {
    __m256d c0 = _mm256_setzero_pd(), c1 = c0, c2 = c0, c3 = c0;
    __m256d e0 = c0, e1 = c0, e2 = c0, e3 = c0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_loadu_ps(a + i), w1 = _mm256_loadu_ps(a + i + 8);
        __m256d wl0 = widen_lo(w0), wh0 = widen_hi(w0), wl1 = widen_lo(w1), wh1 = widen_hi(w1);
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
        __m256 z0 = _mm256_loadu_ps(z + i), z1 = _mm256_loadu_ps(z + i + 8);
        c0 = _mm256_fmadd_pd(wl0, widen_lo(x0), c0);
        c1 = _mm256_fmadd_pd(wh0, widen_hi(x0), c1);
        c2 = _mm256_fmadd_pd(wl1, widen_lo(x1), c2);
        c3 = _mm256_fmadd_pd(wh1, widen_hi(x1), c3);
        e0 = _mm256_fmadd_pd(wl0, widen_lo(z0), e0);
        e1 = _mm256_fmadd_pd(wh0, widen_hi(z0), e1);
        e2 = _mm256_fmadd_pd(wl1, widen_lo(z1), e2);
        e3 = _mm256_fmadd_pd(wh1, widen_hi(z1), e3);
    }
    out[0] = finish_f32(c0, c1, c2, c3, i, n, a, x);
    out[1] = finish_f32(e0, e1, e2, e3, i, n, a, z);
}

AVX2 void ds4_dot_f32_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    (void)nacts; /* always DS4_AVX2_WIDTH_FLOAT = 2 */
    f32_multi2(n, w, act, ds4_act_at(act, act_stride, 1), out);
}

/* ------------------------------------------------------------ F16, BF16 */

AVX2 static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

AVX2 static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* Tail and reduction shared by the F16/BF16 kernels: the accumulators hold
 * lanes 0..31, the remaining elements go to lane i % 32 as in the scalar. */
AVX2_BODY float finish_f16(__m256 c0, __m256 c1, __m256 c2, __m256 c3, int64_t i, int64_t n, const uint16_t *a,
                           const float *x, int bf16) {
    if (i == n) return reduce_q8_vec(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)));
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
/* clang-format off */
#define F16_STEP(load)                                                                  \
    do {                                                                                \
        c0 = _mm256_add_ps(c0, _mm256_mul_ps(load(a + i), _mm256_loadu_ps(x + i)));           \
        c1 = _mm256_add_ps(c1, _mm256_mul_ps(load(a + i + 8), _mm256_loadu_ps(x + i + 8)));   \
        c2 = _mm256_add_ps(c2, _mm256_mul_ps(load(a + i + 16), _mm256_loadu_ps(x + i + 16))); \
        c3 = _mm256_add_ps(c3, _mm256_mul_ps(load(a + i + 24), _mm256_loadu_ps(x + i + 24))); \
    } while (0)
/* clang-format on */

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

/* Two activations: each weight vector converted once, then the step of
 * F16_STEP for each activation. */
/* clang-format off */
#define F16_STEP2(load)                                                               \
    do {                                                                              \
        __m256 w0 = load(a + i), w1 = load(a + i + 8), w2 = load(a + i + 16), w3 = load(a + i + 24); \
        c0 = _mm256_add_ps(c0, _mm256_mul_ps(w0, _mm256_loadu_ps(x + i)));           \
        c1 = _mm256_add_ps(c1, _mm256_mul_ps(w1, _mm256_loadu_ps(x + i + 8)));       \
        c2 = _mm256_add_ps(c2, _mm256_mul_ps(w2, _mm256_loadu_ps(x + i + 16)));      \
        c3 = _mm256_add_ps(c3, _mm256_mul_ps(w3, _mm256_loadu_ps(x + i + 24)));      \
        e0 = _mm256_add_ps(e0, _mm256_mul_ps(w0, _mm256_loadu_ps(z + i)));           \
        e1 = _mm256_add_ps(e1, _mm256_mul_ps(w1, _mm256_loadu_ps(z + i + 8)));       \
        e2 = _mm256_add_ps(e2, _mm256_mul_ps(w2, _mm256_loadu_ps(z + i + 16)));      \
        e3 = _mm256_add_ps(e3, _mm256_mul_ps(w3, _mm256_loadu_ps(z + i + 24)));      \
    } while (0)
/* clang-format on */

/* Two activations against one F16 (bf16 = 0) or BF16 row. */
AVX2_BODY void dot_f16_pair(int64_t n, const uint16_t *a, const float *x, const float *z, int bf16, float *out) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, e0 = c0, e1 = c0, e2 = c0, e3 = c0;
    int64_t i = 0;
    if (bf16)
        for (; i + 32 <= n; i += 32) F16_STEP2(load_bf16x8);
    else
        for (; i + 32 <= n; i += 32) F16_STEP2(load_f16x8);
    out[0] = finish_f16(c0, c1, c2, c3, i, n, a, x, bf16);
    out[1] = finish_f16(e0, e1, e2, e3, i, n, a, z, bf16);
}

AVX2 void ds4_dot_f16_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    (void)nacts; /* always DS4_AVX2_WIDTH_FLOAT = 2 */
    dot_f16_pair(n, w, act, ds4_act_at(act, act_stride, 1), 0, out);
}

AVX2 void ds4_dot_bf16_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    (void)nacts;
    dot_f16_pair(n, w, act, ds4_act_at(act, act_stride, 1), 1, out);
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
    __m128i d16 = _mm_setr_epi16((short)a[0].d, (short)a[1].d, (short)a[2].d, (short)a[3].d, (short)a[4].d,
                                 (short)a[5].d, (short)a[6].d, (short)a[7].d);
    __m256 xd = _mm256_setr_ps(x[0].d, x[1].d, x[2].d, x[3].d, x[4].d, x[5].d, x[6].d, x[7].d);
    return _mm256_mul_ps(_mm256_cvtph_ps(d16), xd);
}

AVX2_BODY float q8_finish(__m256 acc, int64_t b, int64_t nb, const ds4_block_q8_0 *a, const ds4_block_q8_0x *x) {
    if (b == nb) return reduce_q8_vec(acc);
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

/* Partials of one block for an activation, from the weight's absolute
 * value (shared) and the weight itself (its signs). */
AVX2 static inline __m256i q8_partials_abs(__m256i wabs, __m256i wq, const ds4_block_q8_0x *x) {
    __m256i v = _mm256_loadu_si256((const __m256i *)x->qs);
    __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(v, wq));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Blocks b and b+1 of the weight against each activation, combined by one
 * hadd as in q8_sums8. */
AVX2_BODY void q8_pair(const ds4_block_q8_0 *a, const ds4_block_q8_0x *const x[4], int64_t b, int nk, __m256i h[4]) {
    __m256i w0 = _mm256_loadu_si256((const __m256i *)a[b].qs);
    __m256i w1 = _mm256_loadu_si256((const __m256i *)a[b + 1].qs);
    __m256i a0 = _mm256_sign_epi8(w0, w0), a1 = _mm256_sign_epi8(w1, w1);
#pragma GCC unroll 4
    for (int k = 0; k < nk; k++)
        h[k] = _mm256_hadd_epi32(q8_partials_abs(a0, w0, &x[k][b]), q8_partials_abs(a1, w1, &x[k][b + 1]));
}

/* Groups of 8 blocks as in ds4_dot_q8_0_avx2: the int32 sums of each
 * activation in q8_sums8's layout, the weight scales converted once. */
AVX2_BODY void q8_0_multi(int64_t n, const void *w, const void *act, size_t act_stride, int nk, float *out) {
    const ds4_block_q8_0 *a = w;
    const ds4_block_q8_0x *x[4];
    for (int k = 0; k < nk; k++) x[k] = ds4_act_at(act, act_stride, k);
    int64_t nb = n / DS4_QK8_0, b = 0;
    __m256 acc[4];
    for (int k = 0; k < nk; k++) acc[k] = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8) {
        __m256i lo[4], hi[4], h[4];
        q8_pair(a, x, b, nk, lo);
        q8_pair(a, x, b + 2, nk, h);
#pragma GCC unroll 4
        for (int k = 0; k < nk; k++) lo[k] = _mm256_hadd_epi32(lo[k], h[k]);
        q8_pair(a, x, b + 4, nk, hi);
        q8_pair(a, x, b + 6, nk, h);
#pragma GCC unroll 4
        for (int k = 0; k < nk; k++) hi[k] = _mm256_hadd_epi32(hi[k], h[k]);
        __m128i d16 = _mm_setr_epi16((short)a[b].d, (short)a[b + 1].d, (short)a[b + 2].d, (short)a[b + 3].d,
                                     (short)a[b + 4].d, (short)a[b + 5].d, (short)a[b + 6].d, (short)a[b + 7].d);
        __m256 wd = _mm256_cvtph_ps(d16);
#pragma GCC unroll 4
        for (int k = 0; k < nk; k++) {
            const ds4_block_q8_0x *xb = x[k] + b;
            __m256 xd = _mm256_setr_ps(xb[0].d, xb[1].d, xb[2].d, xb[3].d, xb[4].d, xb[5].d, xb[6].d, xb[7].d);
            __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(lo[k], hi[k], 0x20),
                                            _mm256_permute2x128_si256(lo[k], hi[k], 0x31));
            acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_mul_ps(wd, xd), _mm256_cvtepi32_ps(sums)));
        }
    }
    for (int k = 0; k < nk; k++) out[k] = q8_finish(acc[k], b, nb, a, x[k]);
}

MULTI_INT_KERNEL4(ds4_dot_q8_0_multi_avx2, q8_0_multi)

/* ----------------------------------------------------------------- Q2_K */

/* Shuffle controls that spread the scale of sub-blocks s (low 128 bits) and
 * s+1 (high 128 bits) over int16 lanes, for s = 0, 2, ..., 14. */
AVX2 static inline __m256i q2_scale_ctl(int s) {
    return _mm256_setr_epi8((char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1, (char)s, -1,
                            (char)s, -1, (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1), -1,
                            (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1), -1, (char)(s + 1), -1);
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

/* Several activations: the 2-bit values and their spread scales once per
 * sub-block pair, the integer sums of ds4_dot_q2_K_avx2 per activation. */
AVX2_BODY void q2_K_multi(int64_t n, const void *w, const void *act, size_t act_stride, int nk, float *out) {
    const ds4_block_q2_K *a = w;
    const ds4_block_q8_K *x[8];
    for (int k = 0; k < nk; k++) x[k] = ds4_act_at(act, act_stride, k);
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m15 = _mm_set1_epi8(15);
    const __m256i ctl0 = q2_scale_ctl(0); /* + 2s in the int16 lanes: q2_scale_ctl(2s) */
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        __m128i sc8 = _mm_loadu_si128((const __m128i *)a[b].scales);
        __m256i scales = _mm256_broadcastsi128_si256(_mm_and_si128(sc8, m15));
        __m256i v[8];
        for (int k = 0; k < 8; k++) v[k] = _mm256_setzero_si256();
        /* A rolled loop over the 8 pairs of sub-blocks: unrolled, GCC
         * regroups the sums of each accumulator into a tree whose partial
         * sums no longer fit the registers. */
        for (int s = 0; s < 8; s++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(a[b].qs + 32 * (s / 4)));
            __m256i qs = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (s % 4))), m3);
            __m256i sc = _mm256_shuffle_epi8(scales, _mm256_add_epi16(ctl0, _mm256_set1_epi16((short)(2 * s))));
#pragma GCC unroll 8
            for (int k = 0; k < nk; k++) {
                __m256i y = _mm256_loadu_si256((const __m256i *)(x[k][b].qs + 32 * s));
                v[k] = _mm256_add_epi32(v[k], _mm256_madd_epi16(_mm256_maddubs_epi16(qs, y), sc));
            }
        }
        __m256i isum = hsum_i32_x8(v);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), m15));
#pragma GCC unroll 8
        for (int k = 0; k < nk; k++) v[k] = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)x[k][b].bsums));
        __m256i msum = hsum_i32_x8(v);
        acc = kq_step_x8(acc, a[b].d, a[b].dmin, act_d_x8(x, b, nk), isum, msum);
    }
    store_x8(acc, nk, out);
}

MULTI_INT_KERNEL(ds4_dot_q2_K_multi_avx2, q2_K_multi)

/* ----------------------------------------------------------------- Q4_K */

/* Unpack the 6-bit scales and mins four at a time (docs/MODEL.md 3.5):
 * *scv gets the 8 scales as bytes in both 128-bit lanes (spread later by
 * shuffles), *mins the 8 mins as int32. */
AVX2 static inline void q4_K_scales_mins(const uint8_t *scales, __m256i *scv, __m256i *mins) {
    uint32_t u[3], sc32[2], mn32[2];
    memcpy(u, scales, 12);
    sc32[0] = u[0] & 0x3f3f3f3fu;
    mn32[0] = u[1] & 0x3f3f3f3fu;
    sc32[1] = (u[2] & 0x0f0f0f0fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    mn32[1] = ((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    *scv = _mm256_broadcastsi128_si256(_mm_loadl_epi64((const __m128i *)sc32));
    *mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)mn32));
}

AVX2 float ds4_dot_q4_K_avx2(int64_t n, const void *w, const void *act) {
    const ds4_block_q4_K *a = w;
    const ds4_block_q8_K *x = act;
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        __m256i scv, mins;
        q4_K_scales_mins(a[b].scales, &scv, &mins);
        __m256i pair_sums = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[b].bsums), ones);
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

/* Several activations: the nibbles and spread scales once per 64 values,
 * the integer sums of ds4_dot_q4_K_avx2 per activation. */
AVX2_BODY void q4_K_multi(int64_t n, const void *w, const void *act, size_t act_stride, int nk, float *out) {
    const ds4_block_q4_K *a = w;
    const ds4_block_q8_K *x[8];
    for (int k = 0; k < nk; k++) x[k] = ds4_act_at(act, act_stride, k);
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        __m256i scv, mins;
        q4_K_scales_mins(a[b].scales, &scv, &mins);
        __m256i v[8];
        for (int k = 0; k < 8; k++) v[k] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) { /* rolled, as in q2_K_multi */
            __m256i q = _mm256_loadu_si256((const __m256i *)(a[b].qs + 32 * p));
            __m256i lo = _mm256_and_si256(q, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i slo = _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0xff00 | (2 * p))));
            __m256i shi = _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0xff00 | (2 * p + 1))));
#pragma GCC unroll 8
            for (int k = 0; k < nk; k++) {
                __m256i ylo = _mm256_loadu_si256((const __m256i *)(x[k][b].qs + 64 * p));
                __m256i yhi = _mm256_loadu_si256((const __m256i *)(x[k][b].qs + 64 * p + 32));
                __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), slo);
                __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), shi);
                v[k] = _mm256_add_epi32(v[k], _mm256_add_epi32(plo, phi));
            }
        }
        __m256i isum = hsum_i32_x8(v);
#pragma GCC unroll 8
        for (int k = 0; k < nk; k++) {
            __m256i pair_sums = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[k][b].bsums), ones);
            v[k] = _mm256_mullo_epi32(pair_sums, mins);
        }
        __m256i msum = hsum_i32_x8(v);
        acc = kq_step_x8(acc, a[b].d, a[b].dmin, act_d_x8(x, b, nk), isum, msum);
    }
    store_x8(acc, nk, out);
}

MULTI_INT_KERNEL(ds4_dot_q4_K_multi_avx2, q4_K_multi)

/* -------------------------------------------------------------- IQ2_XXS
 *
 * A group of 32 weights is 8 bytes: 4 grid indices, then a word with 4 7-bit
 * sign indices and the scale S in bits 28-31.  The grid takes 4 lookups per
 * group (the 8 magnitudes of an index); the signs are worked out in vector
 * registers for the 8 groups of a block at once, which replaced 4 lookups
 * of a 64-bit sign table per group (those lookups, their index arithmetic
 * and the inserts that gather them were the larger half of the kernel's
 * time).  The kernels first do this for a few blocks into small arrays,
 * then take each group's sign bytes and scale from them with broadcast
 * loads: per group that is cheaper than picking them out of registers with
 * shuffles, the unit the grid inserts already keep busy. */

/* Blocks whose sign bytes and scales are prepared at a time. */
#define IQ2_PREP_BLOCKS 8

/* The slot of group g in iq2_block_prep's output: the one shuffle that
 * gathers a block's 8 sign words leaves them in the order 0 1 4 5 2 3 6 7
 * (bits 1 and 2 of g swapped). */
static inline int iq2_slot(int g) { return (g & 1) | (g & 2) << 1 | (g & 4) >> 1; }

/* Sign bytes and scale words of the 8 groups of block qs, group g in slot
 * iq2_slot(g): sg = its 4 sign bytes (the 7-bit index plus the even-parity
 * bit 7, ds4_iq2_sign_byte), sc = 2S+1 in both 16-bit halves (the second
 * operand of _mm256_madd_epi16). */
AVX2 static inline void iq2_block_prep(const uint16_t *qs, uint32_t sg[8], uint32_t sc[8]) {
    __m256 lo = _mm256_loadu_ps((const float *)qs), hi = _mm256_loadu_ps((const float *)(qs + 16));
    __m256i s = _mm256_castps_si256(_mm256_shuffle_ps(lo, hi, 0xdd)); /* the odd words */
    /* the four 7-bit indices into bytes 0..3 */
    __m256i idx = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0x7f)),
                        _mm256_and_si256(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(0x7f00))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(s, 2), _mm256_set1_epi32(0x7f0000)),
                        _mm256_and_si256(_mm256_slli_epi32(s, 3), _mm256_set1_epi32(0x7f000000))));
    /* bit 7: the parity of each index, from the parities of its two nibbles */
    const __m256i odd = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0, 0,
                                         -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i par = _mm256_xor_si256(_mm256_shuffle_epi8(odd, _mm256_and_si256(idx, nib)),
                                   _mm256_shuffle_epi8(odd, _mm256_and_si256(_mm256_srli_epi16(idx, 4), nib)));
    _mm256_storeu_si256((__m256i *)sg, _mm256_or_si256(idx, par));
    __m256i sc1 = _mm256_or_si256(_mm256_slli_epi32(_mm256_srli_epi32(s, 28), 1), _mm256_set1_epi32(1));
    _mm256_storeu_si256((__m256i *)sc, _mm256_or_si256(sc1, _mm256_slli_epi32(sc1, 16)));
}

/* The second operand of _mm256_sign_epi8 for a group's 32 activations from
 * its sign bytes sg: each byte picks its bit (0 or 1 << k), and the
 * saturating add of 0x7f makes 0x7f (keep) of 0 and a negative byte (negate)
 * of a set bit. */
AVX2 static inline __m256i iq2_sign_operand(uint32_t sg) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                            3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)sg), spread), bit);
    return _mm256_adds_epu8(b, _mm256_set1_epi8(0x7f));
}

/* The 32 grid magnitudes of the group at qs. */
AVX2 static inline __m256i iq2_grid(const uint16_t *qs) {
    uint32_t g;
    memcpy(&g, qs, 4);
    /* One 32-bit load and shifts: without the barrier GCC loads the 4 index
     * bytes one by one, which measured 3% slower (more loads per group). */
    __asm__("" : "+r"(g));
    const uint64_t *grid = ds4_iq2xxs_grid;
    return _mm256_set_epi64x((long long)grid[g >> 24], (long long)grid[(g >> 16) & 255],
                             (long long)grid[(g >> 8) & 255], (long long)grid[g & 255]);
}

/* Sum of the int32 lanes of v as a float, converted in the vector unit
 * (cvtdq2ps rounds as (float) does; the trip through an integer register
 * cost 9% of the single-row kernel). */
AVX2 static inline float hsum_i32_f32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtss_f32(_mm_cvtepi32_ps(s));
}

AVX2 float ds4_dot_iq2_xxs_avx2(int64_t n, const void *w, const void *act) {
    const ds4_block_iq2_xxs *a = w;
    const ds4_block_q8_K *x = act;
    float acc = 0.0f;
    int64_t nb = n / DS4_QK_K;
    for (int64_t b0 = 0; b0 < nb; b0 += IQ2_PREP_BLOCKS) {
        int64_t nc = nb - b0 < IQ2_PREP_BLOCKS ? nb - b0 : IQ2_PREP_BLOCKS;
        uint32_t sg[8 * IQ2_PREP_BLOCKS], sc[8 * IQ2_PREP_BLOCKS];
        for (int64_t c = 0; c < nc; c++) iq2_block_prep(a[b0 + c].qs, sg + 8 * c, sc + 8 * c);
        for (int64_t c = 0; c < nc; c++) {
            const ds4_block_iq2_xxs *ab = &a[b0 + c];
            const ds4_block_q8_K *xb = &x[b0 + c];
            __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int slot = 8 * (int)c + iq2_slot(g);
                __m256i y = _mm256_loadu_si256((const __m256i *)(xb->qs + 32 * g));
                y = _mm256_sign_epi8(y, iq2_sign_operand(sg[slot]));
                __m256i p = _mm256_maddubs_epi16(iq2_grid(&ab->qs[4 * g]), y);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi32((int)sc[slot])));
            }
            /* ds4_iq2_step, the int32 sum converted by hsum_i32_f32 */
            acc = acc + (f16_scalar(ab->d) * xb->d) * (hsum_i32_f32(isum) * 0.125f);
        }
    }
    return acc;
}

/* Several activations.  The grid takes the signs instead of each
 * activation: u = 43 + sign * grid lies in [0, 86], so maddubs(u, y) needs
 * no sign operation per activation, and the 43 * sum(y) it adds is taken
 * off per block from the activation's bsums (sums of 16 of its qs, which
 * ds4_quantize_q8_K provides): 4 operations per group and activation
 * instead of 5. */
AVX2_BODY void iq2_xxs_multi(int64_t n, const void *w, const void *act, size_t act_stride, int nk, float *out) {
    const ds4_block_iq2_xxs *a = w;
    const ds4_block_q8_K *x[8];
    for (int k = 0; k < nk; k++) x[k] = ds4_act_at(act, act_stride, k);
    const __m256i off = _mm256_set1_epi8(43);
    __m256 acc = _mm256_setzero_ps();
    int64_t nb = n / DS4_QK_K;
    for (int64_t b0 = 0; b0 < nb; b0 += IQ2_PREP_BLOCKS) {
        int64_t nc = nb - b0 < IQ2_PREP_BLOCKS ? nb - b0 : IQ2_PREP_BLOCKS;
        uint32_t sg[8 * IQ2_PREP_BLOCKS], sc[8 * IQ2_PREP_BLOCKS];
        for (int64_t c = 0; c < nc; c++) iq2_block_prep(a[b0 + c].qs, sg + 8 * c, sc + 8 * c);
        for (int64_t c = 0; c < nc; c++) {
            int64_t b = b0 + c;
            /* 43 (2S+1) per group in group order, against the pairs of bsums */
            __m256i sc_g = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(sc + 8 * c)), 0xd8);
            __m256i sc43 = _mm256_mullo_epi16(sc_g, _mm256_set1_epi16(43));
            __m256i v[8];
            for (int k = nk; k < 8; k++) v[k] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < nk; k++) {
                __m256i bsums = _mm256_loadu_si256((const __m256i *)x[k][b].bsums);
                v[k] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(bsums, sc43));
            }
            /* unrolled: the slots become constants and GCC keeps the
             * accumulators in registers (14% less time a pair) */
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                int slot = 8 * (int)c + iq2_slot(g);
                __m256i sgrid = _mm256_sign_epi8(iq2_grid(&a[b].qs[4 * g]), iq2_sign_operand(sg[slot]));
                __m256i u = _mm256_add_epi8(sgrid, off);
                __m256i scale = _mm256_set1_epi32((int)sc[slot]);
#pragma GCC unroll 8
                for (int k = 0; k < nk; k++) {
                    __m256i y = _mm256_loadu_si256((const __m256i *)(x[k][b].qs + 32 * g));
                    v[k] = _mm256_add_epi32(v[k], _mm256_madd_epi16(_mm256_maddubs_epi16(u, y), scale));
                }
            }
            __m256i isum = hsum_i32_x8(v);
            __m256 d = _mm256_mul_ps(_mm256_set1_ps(f16_scalar(a[b].d)), act_d_x8(x, b, nk));
            /* ds4_iq2_step in every lane */
            acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(0.125f))));
        }
    }
    store_x8(acc, nk, out);
}

MULTI_INT_KERNEL(ds4_dot_iq2_xxs_multi_avx2, iq2_xxs_multi)

#else /* not x86: the dispatcher never selects these (no AVX2). */

float ds4_dot_f32_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_f32_scalar(n, w, act); }
float ds4_dot_f16_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_f16_scalar(n, w, act); }
float ds4_dot_bf16_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_bf16_scalar(n, w, act); }
float ds4_dot_q8_0_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_q8_0_scalar(n, w, act); }
float ds4_dot_q2_K_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_q2_K_scalar(n, w, act); }
float ds4_dot_q4_K_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_q4_K_scalar(n, w, act); }
float ds4_dot_iq2_xxs_avx2(int64_t n, const void *w, const void *act) { return ds4_dot_iq2_xxs_scalar(n, w, act); }

/* clang-format off */
#define MULTI_FALLBACK(t)                                                                              \
    void ds4_dot_##t##_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, \
                                  float *out) {                                                        \
        ds4_dot_##t##_multi_scalar(n, w, act, act_stride, nacts, out);                                 \
    }
/* clang-format on */
MULTI_FALLBACK(f32)
MULTI_FALLBACK(f16)
MULTI_FALLBACK(bf16)
MULTI_FALLBACK(q8_0)
MULTI_FALLBACK(q2_K)
MULTI_FALLBACK(q4_K)
MULTI_FALLBACK(iq2_xxs)

#endif
