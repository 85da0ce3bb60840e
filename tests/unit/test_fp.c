/*
 * test_fp.c - the narrow float conversions of base/fp.h against their
 * definitions: every f16, bf16, fp8 E4M3FN, E8M0 and fp4 E2M1 code decodes to
 * the value its formula gives (computed with ldexp in double), and every
 * encoder returns the nearest representable value with ties to the even code
 * (found by a brute-force search over the decoded codes), checked at every
 * midpoint, its float neighbours, and a dense sample of all f32 patterns.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/fp.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------ references */

static double ref_f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double ref_fp8_value(uint8_t b) {
    if ((b & 0x7f) == 0x7f) return 0.0;
    int e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? ldexp(m, -9) : (1.0 + m / 8.0) * ldexp(1.0, e - 7);
    return (b & 0x80) ? -v : v;
}

/* Nearest of `count` ascending magnitudes mag(0..count-1), ties to the even
 * index: the definition shared by every encoder test (docs/MODEL.md 4.3). */
typedef double (*mag_fn)(int);

static int ref_nearest_code(double a, mag_fn mag, int count) {
    int lo = 0, hi = count - 1;
    if (a >= mag(hi)) return hi;
    while (hi - lo > 1) { /* invariant: mag(lo) <= a < mag(hi) */
        int mid = (lo + hi) / 2;
        if (mag(mid) <= a) lo = mid;
        else hi = mid;
    }
    double dl = a - mag(lo), dh = mag(hi) - a;
    if (dh < dl || (dh == dl && (hi & 1) == 0)) return hi;
    return lo;
}

static double f16_mag(int c) { return ref_f16_value((uint16_t)c); }
static double bf16_mag(int c) { return (double)float_of((uint32_t)c << 16); }
static double fp8_mag(int c) { return ref_fp8_value((uint8_t)c); }
static double fp4_mag(int c) {
    static const double t[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return t[c];
}

static uint16_t ref_f32_to_f16(float f) {
    uint16_t sign = (bits_of(f) >> 16) & 0x8000;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7c00; /* past max + half ulp */
    return sign | (uint16_t)ref_nearest_code(a, f16_mag, 0x7c00);
}

static uint16_t ref_f32_to_bf16(float f) {
    uint16_t sign = (bits_of(f) >> 16) & 0x8000;
    double a = fabs((double)f);
    /* Past the largest bf16 plus half an ulp rounds to inf. */
    double limit = (double)float_of(0x7f7f0000) + ldexp(1.0, 127 - 8);
    if (a >= limit) return sign | 0x7f80;
    return sign | (uint16_t)ref_nearest_code(a, bf16_mag, 0x7f80);
}

static uint8_t ref_f32_to_fp8(float f) {
    uint8_t sign = (bits_of(f) >> 24) & 0x80;
    double a = fabs((double)f);
    if (a > 448.0) a = 448.0;
    return sign | (uint8_t)ref_nearest_code(a, fp8_mag, 127);
}

static uint8_t ref_f32_to_fp4(float f) {
    uint8_t sign = (bits_of(f) >> 28) & 8;
    double a = fabs((double)f);
    if (a > 6.0) a = 6.0;
    return sign | (uint8_t)ref_nearest_code(a, fp4_mag, 8);
}

/* ------------------------------------------------------------------ f16 */

static void test_f16_decode_all_codes(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float got = ds4_f16_to_f32((uint16_t)h);
        double want = ref_f16_value((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(got));
            /* payload kept: top mantissa bits are the f16 mantissa */
            assert_int_equal(bits_of(got), ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
        } else {
            assert_true((double)got == want);
            assert_int_equal(signbit(got) != 0, (h >> 15) != 0);
        }
    }
}

static void check_f16_encode(float f) {
    uint16_t got = ds4_f32_to_f16(f);
    if (isnan(f)) {
        assert_int_equal(got & 0x7e00, 0x7e00); /* quiet NaN */
        assert_int_equal(got >> 15, bits_of(f) >> 31);
        return;
    }
    uint16_t want = ref_f32_to_f16(f);
    if (got != want) fail_msg("f32 %a (0x%08x): f16 0x%04x, want 0x%04x", f, bits_of(f), got, want);
}

static void test_f16_encode_midpoints_and_sample(void **state) {
    (void)state;
    /* Every midpoint between neighbouring f16 codes and its float neighbours. */
    for (int c = 0; c < 0x7c00; c++) {
        double mid = (ref_f16_value((uint16_t)c) + (c + 1 < 0x7c00 ? ref_f16_value((uint16_t)(c + 1)) : 65536.0)) / 2;
        float m = (float)mid;
        assert_true((double)m == mid); /* f16 midpoints are exact in f32 */
        float probes[] = {m, nextafterf(m, 0), nextafterf(m, INFINITY), (float)ref_f16_value((uint16_t)c)};
        for (int k = 0; k < 4; k++) {
            check_f16_encode(probes[k]);
            check_f16_encode(-probes[k]);
        }
    }
    /* A dense stride through all f32 bit patterns (NaNs, infs included). */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093) check_f16_encode(float_of((uint32_t)u));
    check_f16_encode(INFINITY);
    check_f16_encode(-INFINITY);
    assert_int_equal(ds4_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(ds4_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(ds4_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(ds4_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(ds4_f32_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(ds4_f32_to_f16(nextafterf(0x1p-25f, 1)), 0x0001);
    assert_int_equal(ds4_f32_to_f16(float_of(0x7f800001)) & 0x7e00, 0x7e00);
    assert_true(ds4_f16_round(1.0f + 0x1p-11f) == 1.0f);
    assert_true(ds4_f16_round(1.0f + 0x1p-11f + 0x1p-20f) == 1.0f + 0x1p-10f);
}

static void test_f16_rows(void **state) {
    (void)state;
    uint16_t h[1000];
    float f[1000];
    uint16_t back[1000];
    for (int i = 0; i < 1000; i++) h[i] = (uint16_t)(i * 65 + 7);
    ds4_f16_to_f32_row(h, f, 1000);
    ds4_f32_to_f16_row(f, back, 1000);
    for (int i = 0; i < 1000; i++) {
        if ((h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x3ff)) continue; /* NaN gets quieted */
        assert_int_equal(back[i], h[i]);
    }
}

/* ----------------------------------------------------------------- bf16 */

static void test_bf16(void **state) {
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) { assert_int_equal(bits_of(ds4_bf16_to_f32((uint16_t)b)), b << 16); }
    float row[4];
    uint16_t src[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};
    ds4_bf16_to_f32_row(src, row, 4);
    assert_true(row[0] == 1.0f && row[1] == -1.0f && isinf(row[2]) && row[3] > 0);
    /* Midpoints between bf16 codes (exact in f32) and their neighbours. */
    for (uint32_t c = 0; c < 0x7f80; c += 3) {
        uint32_t mid = (c << 16) | 0x8000;
        float probes[] = {float_of(mid), float_of(mid - 1), float_of(mid + 1), float_of(c << 16)};
        for (int k = 0; k < 4; k++) {
            for (int s = 0; s < 2; s++) {
                float f = s ? -probes[k] : probes[k];
                assert_int_equal(ds4_f32_to_bf16(f), ref_f32_to_bf16(f));
            }
        }
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 7919) {
        float f = float_of((uint32_t)u);
        uint16_t got = ds4_f32_to_bf16(f);
        if (isnan(f)) assert_int_equal(got, ((uint32_t)u >> 16) | 0x40);
        else assert_int_equal(got, ref_f32_to_bf16(f));
    }
}

/* ------------------------------------------------------------------ fp8 */

static void test_fp8_decode_all_codes(void **state) {
    (void)state;
    for (int b = 0; b < 256; b++) {
        float got = ds4_fp8_e4m3_to_f32((uint8_t)b);
        assert_true((double)got == ref_fp8_value((uint8_t)b));
    }
    assert_true(ds4_fp8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(ds4_fp8_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(ds4_fp8_e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(ds4_fp8_e4m3_to_f32(0x7f) == 0.0f && ds4_fp8_e4m3_to_f32(0xff) == 0.0f);
}

static void check_fp8_encode(float f) {
    uint8_t got = ds4_f32_to_fp8_e4m3(f), want = ref_f32_to_fp8(f);
    if (got != want) fail_msg("f32 %a: fp8 0x%02x, want 0x%02x", f, got, want);
}

static void test_fp8_encode(void **state) {
    (void)state;
    for (int c = 0; c < 127; c++) {
        float v = (float)ref_fp8_value((uint8_t)c);
        float next = c < 126 ? (float)ref_fp8_value((uint8_t)(c + 1)) : 480.0f;
        float mid = (v + next) / 2; /* exact: few significant bits */
        float probes[] = {v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), nextafterf(v, 0)};
        for (int k = 0; k < 5; k++) {
            check_fp8_encode(probes[k]);
            check_fp8_encode(-probes[k]);
        }
        assert_int_equal(ds4_f32_to_fp8_e4m3(v), c); /* round trip */
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) {
        float f = float_of((uint32_t)u);
        if (!isnan(f)) check_fp8_encode(f);
    }
    /* ties to the even code, saturation and specials */
    assert_int_equal(ds4_f32_to_fp8_e4m3(0x1p-10f), 0x00);     /* 0 vs 2^-9 */
    assert_int_equal(ds4_f32_to_fp8_e4m3(3 * 0x1p-10f), 0x02); /* 1 vs 2 */
    assert_int_equal(ds4_f32_to_fp8_e4m3(1.0625f), 0x38);      /* 1 vs 1.125 */
    assert_int_equal(ds4_f32_to_fp8_e4m3(1.1875f), 0x3a);      /* 1.125 vs 1.25 */
    assert_int_equal(ds4_f32_to_fp8_e4m3(432.0f), 0x7e);       /* 416 vs 448 */
    assert_int_equal(ds4_f32_to_fp8_e4m3(1e30f), 0x7e);
    assert_int_equal(ds4_f32_to_fp8_e4m3(-INFINITY), 0xfe);
    assert_int_equal(ds4_f32_to_fp8_e4m3(NAN), 0x7f);
    assert_int_equal(ds4_f32_to_fp8_e4m3(-0.0f), 0x80);
}

/* ----------------------------------------------------------------- e8m0 */

static void test_e8m0_all_codes(void **state) {
    (void)state;
    for (int e = 0; e < 256; e++) {
        float got = ds4_e8m0_to_f32((uint8_t)e);
        float want = (float)ldexp(1.0, e - 127);
        assert_true(got == want);
    }
    assert_int_equal(bits_of(ds4_e8m0_to_f32(0)), 0x00400000);
    assert_true(isinf(ds4_e8m0_to_f32(255)));
}

/* ------------------------------------------------------------------ fp4 */

static void check_fp4_encode(float f) {
    uint8_t got = ds4_f32_to_fp4_e2m1(f), want = ref_f32_to_fp4(f);
    if (got != want) fail_msg("f32 %a: fp4 0x%x, want 0x%x", f, got, want);
}

static void test_fp4(void **state) {
    (void)state;
    for (int c = 0; c < 16; c++) {
        double want = fp4_mag(c & 7) * ((c & 8) ? -1 : 1);
        float got = ds4_fp4_e2m1_to_f32((uint8_t)c);
        assert_true((double)got == want);
        assert_int_equal(signbit(got) != 0, (c & 8) != 0);
        assert_int_equal(ds4_f32_to_fp4_e2m1(got), c);
        assert_true(ds4_fp4_e2m1_to_f32((uint8_t)(c | 0xf0)) == got); /* high bits ignored */
    }
    for (int c = 0; c < 8; c++) {
        float v = (float)fp4_mag(c), next = c < 7 ? (float)fp4_mag(c + 1) : 8.0f;
        float mid = (v + next) / 2;
        float probes[] = {v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int k = 0; k < 4; k++) {
            check_fp4_encode(probes[k]);
            check_fp4_encode(-probes[k]);
        }
    }
    for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) {
        float f = float_of((uint32_t)u);
        if (!isnan(f)) check_fp4_encode(f);
    }
    /* the ties of docs/MODEL.md 4.4 */
    const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const uint8_t want[] = {0, 2, 2, 4, 4, 6, 6};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(ds4_f32_to_fp4_e2m1(ties[i]), want[i]);
        assert_int_equal(ds4_f32_to_fp4_e2m1(-ties[i]), want[i] | 8);
    }
    assert_int_equal(ds4_f32_to_fp4_e2m1(100.0f), 7);
    assert_int_equal(ds4_f32_to_fp4_e2m1(-INFINITY), 15);
    assert_int_equal(ds4_f32_to_fp4_e2m1(NAN), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_decode_all_codes),
        cmocka_unit_test(test_f16_encode_midpoints_and_sample),
        cmocka_unit_test(test_f16_rows),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_fp8_decode_all_codes),
        cmocka_unit_test(test_fp8_encode),
        cmocka_unit_test(test_e8m0_all_codes),
        cmocka_unit_test(test_fp4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
