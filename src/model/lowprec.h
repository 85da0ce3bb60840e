/*
 * lowprec.h - the low-precision simulations that belong to the DeepSeek V4
 * graph (docs/MODEL.md 4.3, 4.4, 12): rows are rounded through FP8 or FP4
 * and back to f32, exactly as the official inference code does, so that the
 * engine sees the values the model was trained against.
 *
 * Plain scalar code with no dependencies, written to be mirrored by every
 * backend (the CUDA kernels reproduce these bit for bit).
 */
#ifndef DS4_MODEL_LOWPREC_H
#define DS4_MODEL_LOWPREC_H

#include <stdint.h>

/* FP8 E4M3 round trip of a KV row's non-RoPE part (MODEL.md 4.3): `n`
 * (a multiple of 64) values, in blocks of 64 with a power-of-two scale each. */
void ds4_fp8_kv_roundtrip(float *x, uint32_t n);

/* Round one value, already divided by its scale, to the nearest E4M3FN
 * magnitude (ties to the even code), keeping its sign; |v| <= 448. */
float ds4_fp8_e4m3_round(float v);

/* In-place fast Walsh-Hadamard transform of 128 values, natural order,
 * scaled by 1/sqrt(128). */
void ds4_hadamard128(float *x);

/* FP4 E2M1 round trip of `n` values (a multiple of 32) in blocks of 32 with
 * a power-of-two scale each (MODEL.md 4.4 step 2). */
void ds4_fp4_roundtrip(float *x, uint32_t n);

/* The indexer "QAT" round trip of one 128-wide row: Hadamard, then FP4. */
void ds4_indexer_qat_row(float *x);

/* Round every value through IEEE binary16 (raw KV rows). */
void ds4_f16_round_row(float *x, uint32_t n);

#endif
