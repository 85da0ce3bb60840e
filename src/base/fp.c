/*
 * fp.c - scalar conversions between f32 and the narrow float formats of
 * ds4 files and of the model's low-precision simulations (see fp.h).
 *
 * Everything works on bit patterns with integer arithmetic, so the results do
 * not depend on the FPU rounding mode, flush-to-zero settings or on whether
 * the compiler contracts expressions.  tests/unit/test_fp.c checks every
 * encoder against a brute-force "nearest representable value, ties to the
 * even code" definition.
 */
#include "base/fp.h"

#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Shift `v` right by `shift` (1..31) rounding to nearest, ties to even. */
static inline uint32_t shift_right_rne(uint32_t v, int shift) {
    uint32_t q = v >> shift;
    uint32_t rem = v & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

float ds4_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
    if (mant == 0) return f32_from_bits(sign);
    /* Subnormal: mant * 2^-24, renormalised so the leading 1 becomes implicit. */
    int e = 113;
    while (!(mant & 0x400)) {
        mant <<= 1;
        e--;
    }
    return f32_from_bits(sign | ((uint32_t)e << 23) | ((mant & 0x3ff) << 13));
}

uint16_t ds4_f32_to_f16(float f) {
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000u) return sign | 0x7c00; /* >= 65520 rounds to inf */
    if (ax >= 0x38800000u) {                     /* normal f16 range */
        uint32_t r = shift_right_rne(ax, 13);    /* carries into the exponent */
        return sign | (uint16_t)(r - (112u << 10));
    }
    if (ax <= 0x33000000u) return sign; /* <= 2^-25: ties to the even zero */
    /* Subnormal result: value = m * 2^(e-150), in units of 2^-24. */
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    return sign | (uint16_t)shift_right_rne(mant, (int)(126 - e));
}

float ds4_f16_round(float f) { return ds4_f16_to_f32(ds4_f32_to_f16(f)); }

float ds4_bf16_to_f32(uint16_t b) { return f32_from_bits((uint32_t)b << 16); }

uint16_t ds4_f32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

float ds4_fp8_e4m3_to_f32(uint8_t b) {
    if ((b & 0x7f) == 0x7f) return 0.0f;
    uint32_t exp = (b >> 3) & 0xf;
    uint32_t mant = b & 7;
    /* mant * 2^-9 for subnormals, (8 + mant) * 2^(exp-10) otherwise; both
     * products of a small integer and a power of two, hence exact. */
    float mag = exp == 0 ? (float)mant * 0x1p-9f : (float)(8 + mant) * f32_from_bits((exp + 117) << 23);
    return (b & 0x80) ? -mag : mag;
}

uint8_t ds4_f32_to_fp8_e4m3(float f) {
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 24) & 0x80);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7f;         /* NaN: the NaN code */
    if (ax >= 0x43e00000u) return sign | 0x7e; /* >= 448: saturate */
    if (ax >= 0x3c800000u) {                   /* >= 2^-6: normal */
        uint32_t r = shift_right_rne(ax, 20);  /* exponent:3-bit mantissa */
        return sign | (uint8_t)(r - (120u << 3));
    }
    /* Subnormal range: code = round(|f| * 2^9), an integer 0..8 (8 is the
     * smallest normal, whose code is also 8). */
    if (ax <= 0x3a800000u) return sign; /* <= 2^-10: ties to the even zero */
    uint32_t e = ax >> 23;
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    return sign | (uint8_t)shift_right_rne(mant, (int)(141 - e));
}

float ds4_e8m0_to_f32(uint8_t e) {
    /* 2^-127 is the f32 subnormal 0x00400000; 255 lands on the inf pattern. */
    return f32_from_bits(e == 0 ? 0x00400000u : (uint32_t)e << 23);
}

static const float fp4_magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

float ds4_fp4_e2m1_to_f32(uint8_t nibble) {
    float mag = fp4_magnitudes[nibble & 7];
    return (nibble & 8) ? -mag : mag;
}

uint8_t ds4_f32_to_fp4_e2m1(float f) {
    uint32_t x = f32_bits(f);
    uint8_t sign = (uint8_t)((x >> 28) & 8);
    float a = f32_from_bits(x & 0x7fffffffu);
    if (a != a) return 0;
    /* Midpoints between neighbouring magnitudes; a tie goes to the even code,
     * so the comparison is <= below an even code and < below an odd one. */
    uint8_t code;
    if (a <= 0.25f) code = 0;
    else if (a < 0.75f) code = 1;
    else if (a <= 1.25f) code = 2;
    else if (a < 1.75f) code = 3;
    else if (a <= 2.5f) code = 4;
    else if (a < 3.5f) code = 5;
    else if (a <= 5.0f) code = 6;
    else code = 7;
    return sign | code;
}

void ds4_f16_to_f32_row(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ds4_f16_to_f32(src[i]);
}

void ds4_f32_to_f16_row(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ds4_f32_to_f16(src[i]);
}

void ds4_bf16_to_f32_row(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = ds4_bf16_to_f32(src[i]);
}
