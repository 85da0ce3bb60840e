/*
 * fp.h - scalar conversions between f32 and the narrow float formats that
 * appear in ds4 files and in the model's low-precision simulations.
 *
 *   f16   IEEE binary16: weights, raw KV rows, block scales.
 *   bf16  bfloat16: official checkpoint tensors.
 *   fp8   E4M3FN: official dense weights and the KV round trip (docs/MODEL.md 4.3).
 *   e8m0  power-of-two scale bytes of the official checkpoint (docs/MODEL.md 2.6).
 *   fp4   E2M1: official routed experts and the indexer round trip (4.4).
 *
 * All encoders round to nearest, ties to even, unless stated otherwise.
 */
#ifndef DS4_BASE_FP_H
#define DS4_BASE_FP_H

#include <stdint.h>

/* binary16 -> f32, exact (subnormals, inf and NaN included). */
float ds4_f16_to_f32(uint16_t h);

/* f32 -> binary16, round-to-nearest-even; overflow gives +-inf, NaN gives a
 * quiet NaN, values below half the smallest subnormal give signed zero. */
uint16_t ds4_f32_to_f16(float f);

/* Round an f32 through binary16 and back. */
float ds4_f16_round(float f);

/* bfloat16 -> f32 (bits << 16). */
float ds4_bf16_to_f32(uint16_t b);

/* f32 -> bfloat16 with round-to-nearest-even; NaN keeps its top bits and
 * gets the quiet bit (bit 6 of the bf16) set. */
uint16_t ds4_f32_to_bf16(float f);

/* FP8 E4M3FN byte -> f32.  Exponent bias 7, subnormals mant * 2^-9, no
 * infinities.  The NaN codes 0x7F and 0xFF decode to 0, as ds4 does. */
float ds4_fp8_e4m3_to_f32(uint8_t b);

/* f32 -> FP8 E4M3FN byte, round-to-nearest-even, saturating at +-448
 * (infinities included); NaN gives the NaN code 0x7F. */
uint8_t ds4_f32_to_fp8_e4m3(float f);

/* E8M0 scale byte -> 2^(e-127) (e = 0 gives 2^-127 exactly, 255 gives inf). */
float ds4_e8m0_to_f32(uint8_t e);

/* FP4 E2M1 nibble (low 4 bits used) -> f32: magnitudes
 * {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign. */
float ds4_fp4_e2m1_to_f32(uint8_t nibble);

/* f32 -> FP4 E2M1 nibble, nearest magnitude, ties to the even code,
 * saturating at +-6; the sign of zero is kept, NaN gives 0. */
uint8_t ds4_f32_to_fp4_e2m1(float f);

/* Bulk row conversions. */
void ds4_f16_to_f32_row(const uint16_t *src, float *dst, int64_t n);
void ds4_f32_to_f16_row(const float *src, uint16_t *dst, int64_t n);
void ds4_bf16_to_f32_row(const uint16_t *src, float *dst, int64_t n);

#endif
