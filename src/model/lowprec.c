/*
 * lowprec.c - FP8 / FP4 round trips and the 128-point Hadamard transform
 * (see lowprec.h; docs/MODEL.md 4.3, 4.4).
 *
 * The power-of-two block scale 2^ceil(log2(r)) is computed exactly from the
 * binary exponent of r (frexp), not through log2f, whose rounding can turn
 * log2 of a value just above a power of two into an integer.
 */
#include "model/lowprec.h"

#include <math.h>

#include "base/fp.h"

/* 2^ceil(log2(r)) for r > 0, exactly. */
static float pow2_ceil(float r) {
    int e;
    float m = frexpf(r, &e); /* r = m * 2^e, m in [0.5, 1) */
    return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

/* Nearest entry of an ascending magnitude table to v (0 <= v <= last);
 * on a tie the even index wins. */
static float round_to_table(const float *mag, int n, float v) {
    int lo = 0, hi = n - 1; /* largest index with mag <= v */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (mag[mid] <= v) lo = mid;
        else hi = mid - 1;
    }
    if (lo == n - 1) return mag[lo];
    float dlo = v - mag[lo], dhi = mag[lo + 1] - v;
    if (dhi < dlo || (dhi == dlo && (lo & 1))) return mag[lo + 1];
    return mag[lo];
}

/* E4M3FN magnitudes, code i = exp << 3 | mant, i = 0..126 (126 is 448). */
static float e4m3_mag[127];
static int e4m3_ready;

static void e4m3_init(void) {
    for (int i = 0; i < 127; i++) {
        int exp = i >> 3, mant = i & 7;
        e4m3_mag[i] = exp == 0 ? ldexpf((float)mant, -9) : ldexpf(1.0f + (float)mant / 8.0f, exp - 7);
    }
    __atomic_store_n(&e4m3_ready, 1, __ATOMIC_RELEASE);
}

float ds4_fp8_e4m3_round(float v) {
    if (!__atomic_load_n(&e4m3_ready, __ATOMIC_ACQUIRE)) e4m3_init(); /* idempotent */
    float a = fminf(fabsf(v), 448.0f);
    float r = round_to_table(e4m3_mag, 127, a);
    return v < 0 ? -r : r;
}

void ds4_fp8_kv_roundtrip(float *x, uint32_t n) {
    for (uint32_t b = 0; b < n; b += 64) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float scale = pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
        for (uint32_t i = 0; i < 64; i++) {
            float v = fminf(fmaxf(x[b + i] / scale, -448.0f), 448.0f);
            x[b + i] = ds4_fp8_e4m3_round(v) * scale;
        }
    }
}

void ds4_hadamard128(float *x) {
    for (int stride = 1; stride < 128; stride *= 2)
        for (int i = 0; i < 128; i += 2 * stride)
            for (int j = i; j < i + stride; j++) {
                float a = x[j], b = x[j + stride];
                x[j] = a + b;
                x[j + stride] = a - b;
            }
    for (int i = 0; i < 128; i++) x[i] *= 0.08838834764831845f;
}

static const float fp4_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

void ds4_fp4_roundtrip(float *x, uint32_t n) {
    for (uint32_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b + i]));
        float scale = pow2_ceil(fmaxf(amax, 7.052966104933725e-38f) / 6.0f);
        for (uint32_t i = 0; i < 32; i++) {
            float v = fminf(fmaxf(x[b + i] / scale, -6.0f), 6.0f);
            float r = round_to_table(fp4_mag, 8, fabsf(v));
            x[b + i] = (v < 0 ? -r : r) * scale;
        }
    }
}

void ds4_indexer_qat_row(float *x) {
    ds4_hadamard128(x);
    ds4_fp4_roundtrip(x, 128);
}

void ds4_f16_round_row(float *x, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) x[i] = ds4_f16_round(x[i]);
}
