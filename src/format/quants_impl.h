/*
 * quants_impl.h - internals shared by the block-format files of src/format/
 * (quants.c dispatch, quants_dot.c scalar kernels, quants_avx2.c SIMD
 * kernels, quants_quantize.c and quants_iq2.c encoders, iq2_grid.c tables).
 * Not part of the public interface.
 *
 * Exactness contract: the AVX2 kernels return the same bits as the scalar
 * ones.  To make that possible the scalar definitions spell out their
 * accumulation order (lanes, reduction tree, per-block float expression) and
 * both sides use only multiply and add, never fused multiply-add where the
 * product is inexact.  Floating-point contraction is therefore switched off
 * for every file that includes this header: GCC would otherwise fuse a
 * multiply and an add (even written as intrinsics) into an FMA.
 */
#ifndef DS4_FORMAT_QUANTS_IMPL_H
#define DS4_FORMAT_QUANTS_IMPL_H

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stdint.h>
#include <string.h>

#include "base/fp.h"
#include "format/quants.h"

/* ----------------------------------------------------- accumulation shape */

/* F32 rows: 16 double lanes, element i goes to lane i % 16. */
#define DS4_F64_LANES 16
/* F16/BF16 rows: 32 float lanes, element i goes to lane i % 32. */
#define DS4_F32_LANES 32
/* Q8_0 rows: 8 float lanes, block b goes to lane b % 8. */
#define DS4_Q8_LANES  8

/* The fixed reduction trees that end those dots (quants_dot.c). */
double ds4_reduce_f64_lanes(const double acc[DS4_F64_LANES]);
float ds4_reduce_f32_lanes(const float acc[DS4_F32_LANES]);
float ds4_reduce_q8_lanes(const float acc[DS4_Q8_LANES]);

/* Per-block float step of the K-quant dots: isum is the integer dot weighted
 * by the sub-block scales, msum the mins weighted by the activation block
 * sums; dall = f16(d) * act.d, dmin = f16(dmin) * act.d. */
static inline float ds4_kq_step(float acc, float dall, float dmin, int32_t isum, int32_t msum) {
    float a = dall * (float)isum;
    float b = dmin * (float)msum;
    return acc + (a - b);
}

/* IQ2_XXS: isum = sum over groups of (2S+1) * integer dot; the value of a
 * grid entry is d * (2S+1)/8 * grid. */
static inline float ds4_iq2_step(float acc, float d, int32_t isum) { return acc + d * ((float)isum * 0.125f); }

/* ------------------------------------------------------------- kernels */

typedef float (*ds4_dot_kernel)(int64_t n, const void *w, const void *act);

float ds4_dot_f32_scalar(int64_t n, const void *w, const void *act);
float ds4_dot_f16_scalar(int64_t n, const void *w, const void *act);
float ds4_dot_bf16_scalar(int64_t n, const void *w, const void *act);
float ds4_dot_q8_0_scalar(int64_t n, const void *w, const void *act);
float ds4_dot_q2_K_scalar(int64_t n, const void *w, const void *act);
float ds4_dot_q4_K_scalar(int64_t n, const void *w, const void *act);
float ds4_dot_iq2_xxs_scalar(int64_t n, const void *w, const void *act);

/* Several activations at once: out[k] = dot(w, act k) for k < nacts, act k
 * starting at (const char *)act + k * act_stride.  Each weight block is
 * unpacked once and used for every activation; each out[k] has the bits of
 * the single kernel of the same level.  nacts is 2 .. the kernel's width
 * (ds4_vec_dot_rows_multi sends one activation to the single kernel). */
typedef void (*ds4_dot_multi_kernel)(int64_t n, const void *w, const void *act, size_t act_stride, int nacts,
                                     float *out);

/* Widest multi kernel (activations per call). */
#define DS4_MULTI_MAX 8

static inline const void *ds4_act_at(const void *act, size_t act_stride, int k) {
    return (const char *)act + (size_t)k * act_stride;
}

/* Portable multi kernels (quants_dot.c), nacts up to DS4_MULTI_MAX. */
void ds4_dot_f32_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_f16_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_bf16_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_q8_0_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_q2_K_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_q4_K_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_iq2_xxs_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);

/* AVX2+FMA+F16C kernels (quants_avx2.c); call only when
 * ds4_cpu_has_avx2_fma(). */
float ds4_dot_f32_avx2(int64_t n, const void *w, const void *act);
float ds4_dot_f16_avx2(int64_t n, const void *w, const void *act);
float ds4_dot_bf16_avx2(int64_t n, const void *w, const void *act);
float ds4_dot_q8_0_avx2(int64_t n, const void *w, const void *act);
float ds4_dot_q2_K_avx2(int64_t n, const void *w, const void *act);
float ds4_dot_q4_K_avx2(int64_t n, const void *w, const void *act);
float ds4_dot_iq2_xxs_avx2(int64_t n, const void *w, const void *act);

/* AVX2 multi kernels (quants_avx2.c); their widths are what keeps the
 * accumulators and the unpacked block in the 16 vector registers. */
#define DS4_AVX2_WIDTH_FLOAT 2 /* F32, F16, BF16 */
#define DS4_AVX2_WIDTH_Q8_0  4
#define DS4_AVX2_WIDTH_256   8 /* Q2_K, Q4_K, IQ2_XXS */
void ds4_dot_f32_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_f16_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_bf16_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_q8_0_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_q2_K_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_q4_K_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);
void ds4_dot_iq2_xxs_multi_avx2(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out);

/* ------------------------------------------------------------ IQ2_XXS */

/* The codebook and the sign bytes: quants.h (the GPU decodes them too). */

/* Encoders (quants_quantize.c, quants_iq2.c): n a multiple of the block. */
void ds4_quantize_q8_0_row(const float *x, ds4_block_q8_0 *y, int64_t n);
void ds4_quantize_q2_K_row(const float *x, ds4_block_q2_K *y, int64_t n, const float *imp);
void ds4_quantize_q4_K_row(const float *x, ds4_block_q4_K *y, int64_t n, const float *imp);
void ds4_quantize_iq2_xxs_row(const float *x, ds4_block_iq2_xxs *y, int64_t n, const float *imp);

/* Decode scale and min of Q4_K sub-block j (0..7) from the packed bytes. */
static inline void ds4_q4_K_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

#endif
