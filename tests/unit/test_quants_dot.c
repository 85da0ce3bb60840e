/*
 * test_quants_dot.c - dot products and activation quantizers.
 *
 *  - The AVX2 kernels return exactly the bits of the scalar definitions, for
 *    every weight type, on many random rows of many lengths (up to 65536),
 *    and ds4_vec_dot_rows equals ds4_vec_dot row by row in both modes.
 *  - ds4_vec_dot_rows_multi (several activations per weight row, the batched
 *    products of prefill) equals ds4_vec_dot bit for bit in both modes, for
 *    batch sizes that fill the multi kernels' groups and leave remainders.
 *  - Every dot agrees with a double-precision dot of the dequantized weight
 *    and activation within the rounding bound of its accumulation shape.
 *  - ds4_quantize_q8_0x and ds4_quantize_q8_K follow docs/MODEL.md 3.7-3.8
 *    (checked against an independent implementation with libm's lrintf).
 *  - Bad shapes and types give NaN / 0, not a crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp.h"
#include "common/quant_testutil.h"
#include "format/quants.h"

static const uint32_t WTYPES[] = {DS4_TYPE_F32,  DS4_TYPE_F16,  DS4_TYPE_BF16,   DS4_TYPE_Q8_0,
                                  DS4_TYPE_Q2_K, DS4_TYPE_Q4_K, DS4_TYPE_IQ2_XXS};
#define NWTYPES   (sizeof WTYPES / sizeof WTYPES[0])
#define TYPE_Q4_0 2 /* a GGML type ds4 does not compute with */

static int lengths(uint32_t type, int64_t out[8]) {
    static const int64_t plain[] = {1, 7, 31, 33, 100, 1000, 4096, 65541};
    static const int64_t q32[] = {32, 64, 224, 256, 288, 4096, 8224, 65536};
    static const int64_t q256[] = {256, 512, 1792, 2048, 4096, 7168, 16384, 65536};
    int64_t block = ds4_type_get(type)->block_elems;
    memcpy(out, block == 1 ? plain : block == 32 ? q32 : q256, 8 * sizeof(int64_t));
    return 8;
}

/* Random row of `type`: half the time random well-formed blocks, half the
 * time real quantized data (importance-weighted for the K-quants). */
static void random_row(qt_rng *r, uint32_t type, int64_t n, void *w, float *tmp) {
    if (qt_next(r) & 1) {
        qt_random_blocks(r, type, w, n);
    } else {
        qt_gauss_fill(r, tmp, n, (float)ldexp(1.0, (int)(qt_next(r) % 9) - 6));
        ds4_quantize_row(type, tmp, w, n, NULL);
    }
}

static void random_act(qt_rng *r, uint32_t type, int64_t n, void *act, float *tmp) {
    qt_gauss_fill(r, tmp, n, (float)ldexp(1.0, (int)(qt_next(r) % 13) - 6));
    if (qt_next(r) % 4 == 0) { /* a zero stretch: zero activation blocks */
        int64_t len = n / 3;
        memset(tmp, 0, (size_t)len * sizeof(float));
    }
    ds4_quantize_act(type, tmp, act, n);
}

static float dot_with(ds4_simd_level level, uint32_t type, int64_t n, const void *w, const void *act) {
    ds4_set_simd(level);
    float v = ds4_vec_dot(type, n, w, act);
    ds4_set_simd(DS4_SIMD_AUTO);
    return v;
}

static void test_avx2_matches_scalar(void **state) {
    (void)state;
    if (!ds4_cpu_has_avx2_fma()) {
        print_message("no AVX2+FMA on this CPU: only the scalar kernels exist\n");
        skip();
    }
    qt_rng r;
    qt_seed(&r, 1);
    for (size_t t = 0; t < NWTYPES; t++) {
        uint32_t type = WTYPES[t];
        int64_t lens[8];
        int nl = lengths(type, lens);
        for (int li = 0; li < nl; li++) {
            int64_t n = lens[li];
            void *w = malloc(ds4_row_bytes(type, n));
            void *act = malloc(ds4_act_bytes(type, n));
            float *tmp = malloc((size_t)n * sizeof(float));
            int reps = n > 10000 ? 6 : 60;
            for (int rep = 0; rep < reps; rep++) {
                random_row(&r, type, n, w, tmp);
                random_act(&r, type, n, act, tmp);
                float s = dot_with(DS4_SIMD_SCALAR, type, n, w, act);
                float v = dot_with(DS4_SIMD_AVX2, type, n, w, act);
                if (memcmp(&s, &v, sizeof s) != 0)
                    fail_msg("%s n=%lld rep %d: scalar %a, avx2 %a", ds4_type_get(type)->name, (long long)n, rep,
                             (double)s, (double)v);
            }
            free(w);
            free(act);
            free(tmp);
        }
    }
}

/* Dequantized activation, whatever its format. */
static void act_to_f32(uint32_t wtype, const void *act, float *out, int64_t n) {
    ds4_dequantize_row(ds4_act_type(wtype) == DS4_TYPE_Q8_0 ? UINT32_MAX : ds4_act_type(wtype), act, out, n);
    if (ds4_act_type(wtype) == DS4_TYPE_Q8_0) {
        const ds4_block_q8_0x *b = act;
        for (int64_t i = 0; i < n; i++) out[i] = b[i / 32].d * (float)b[i / 32].qs[i % 32];
    }
}

/* |scale part| + |min part| of each weight: the magnitude the float steps of
 * the K-quant dots round against (a min can cancel a scale term). */
static void weight_magnitudes(uint32_t type, const void *w, int64_t n, float *mag, float *tmp) {
    ds4_dequantize_row(type, w, mag, n);
    for (int64_t i = 0; i < n; i++) mag[i] = fabsf(mag[i]);
    if (type != DS4_TYPE_Q2_K && type != DS4_TYPE_Q4_K) return;
    size_t bytes = ds4_row_bytes(type, n), bb = ds4_type_get(type)->block_bytes;
    size_t d_off = type == DS4_TYPE_Q2_K ? 80 : 0, dmin_off = d_off + 2;
    uint8_t *copy = malloc(bytes);
    memcpy(copy, w, bytes);
    for (size_t b = 0; b < bytes / bb; b++) memset(copy + b * bb + dmin_off, 0, 2);
    ds4_dequantize_row(type, copy, tmp, n); /* scale part only */
    for (int64_t i = 0; i < n; i++) mag[i] = fabsf(tmp[i]);
    memcpy(copy, w, bytes);
    for (size_t b = 0; b < bytes / bb; b++) memset(copy + b * bb + d_off, 0, 2);
    ds4_dequantize_row(type, copy, tmp, n); /* min part only */
    for (int64_t i = 0; i < n; i++) mag[i] += fabsf(tmp[i]);
    free(copy);
}

/* Rounding budget, in units of 2^-24 of the magnitude sum, of each shape. */
static double budget(uint32_t type, int64_t n) {
    switch (type) {
    case DS4_TYPE_F32: return 2;
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: return (double)n / 32 + 8;
    case DS4_TYPE_Q8_0: return (double)n / 32 / 8 + 8;
    default: return (double)n / 256 + 8;
    }
}

static void test_dot_matches_double_reference(void **state) {
    (void)state;
    qt_rng r;
    qt_seed(&r, 2);
    for (int mode = 0; mode < 2; mode++) {
        ds4_set_simd(mode ? DS4_SIMD_AUTO : DS4_SIMD_SCALAR);
        for (size_t t = 0; t < NWTYPES; t++) {
            uint32_t type = WTYPES[t];
            int64_t lens[8];
            int nl = lengths(type, lens);
            for (int li = 0; li < nl; li++) {
                int64_t n = lens[li];
                void *w = malloc(ds4_row_bytes(type, n));
                void *act = malloc(ds4_act_bytes(type, n));
                float *wf = malloc((size_t)n * sizeof(float)), *af = malloc((size_t)n * sizeof(float));
                float *mag = malloc((size_t)n * sizeof(float)), *tmp = malloc((size_t)n * sizeof(float));
                for (int rep = 0; rep < 8; rep++) {
                    random_row(&r, type, n, w, tmp);
                    random_act(&r, type, n, act, tmp);
                    ds4_dequantize_row(type, w, wf, n);
                    act_to_f32(type, act, af, n);
                    weight_magnitudes(type, w, n, mag, tmp);
                    double ref = 0, m = 0;
                    for (int64_t i = 0; i < n; i++) {
                        ref += (double)wf[i] * af[i];
                        m += (double)mag[i] * fabs((double)af[i]);
                    }
                    double got = ds4_vec_dot(type, n, w, act);
                    double tol = budget(type, n) * ldexp(m, -24) + 1e-30;
                    if (!(fabs(got - ref) <= tol))
                        fail_msg("%s n=%lld: dot %.9g, double reference %.9g, bound %.3g", ds4_type_get(type)->name,
                                 (long long)n, got, ref, tol);
                }
                free(w);
                free(act);
                free(wf);
                free(af);
                free(mag);
                free(tmp);
            }
        }
    }
    ds4_set_simd(DS4_SIMD_AUTO);
}

static void test_rows_match_single(void **state) {
    (void)state;
    qt_rng r;
    qt_seed(&r, 3);
    for (int mode = 0; mode < 2; mode++) {
        ds4_set_simd(mode ? DS4_SIMD_AUTO : DS4_SIMD_SCALAR);
        for (size_t t = 0; t < NWTYPES; t++) {
            uint32_t type = WTYPES[t];
            int64_t n = ds4_type_get(type)->block_elems == 1 ? 1000 : 2304;
            size_t rb = ds4_row_bytes(type, n), stride = rb + 40;
            int nrows = 9;
            uint8_t *w = malloc(stride * (size_t)nrows);
            void *act = malloc(ds4_act_bytes(type, n));
            float *tmp = malloc((size_t)n * sizeof(float));
            for (int i = 0; i < nrows; i++) random_row(&r, type, n, w + (size_t)i * stride, tmp);
            random_act(&r, type, n, act, tmp);
            for (int rows = 0; rows <= nrows; rows++) {
                float y[9];
                ds4_vec_dot_rows(type, n, rows, w, stride, act, y);
                for (int i = 0; i < rows; i++) {
                    float one = ds4_vec_dot(type, n, w + (size_t)i * stride, act);
                    assert_memory_equal(&one, &y[i], sizeof one);
                }
            }
            free(w);
            free(act);
            free(tmp);
        }
    }
    ds4_set_simd(DS4_SIMD_AUTO);
}

/* ds4_vec_dot_rows_multi against ds4_vec_dot, bit for bit, at one level:
 * every weight type, several lengths (with and without a tail past the
 * kernels' vector steps), batches of 1 to 19 activations (one or several
 * whole groups of each kernel width, 2, 4 and 8, and every remainder),
 * rows and activations at odd byte offsets and strides, outputs
 * interleaved with a gap. */
static void check_multi_level(ds4_simd_level level, uint64_t seed) {
    enum { MAXA = 19, NROWS = 5, YPAD = 3 };
    qt_rng r;
    qt_seed(&r, seed);
    for (size_t t = 0; t < NWTYPES; t++) {
        uint32_t type = WTYPES[t];
        int64_t lens[8];
        int nl = lengths(type, lens);
        for (int li = 0; li < nl; li++) {
            int64_t n = lens[li];
            if (n > 10000) continue; /* the long rows are covered by the single-kernel tests */
            size_t rb = ds4_row_bytes(type, n), ab = ds4_act_bytes(type, n);
            size_t row_stride = rb + 1 + (size_t)li, act_stride = ab + 3 + (size_t)li;
            uint8_t *wbuf = malloc(row_stride * NROWS + 1), *abuf = malloc(act_stride * MAXA + 1);
            uint8_t *w = wbuf + 1, *acts = abuf + 1; /* unaligned */
            float *tmp = malloc((size_t)n * sizeof(float));
            void *one_act = malloc(ab);
            for (int i = 0; i < NROWS; i++) random_row(&r, type, n, w + (size_t)i * row_stride, tmp);
            for (int a = 0; a < MAXA; a++) {
                random_act(&r, type, n, one_act, tmp);
                memcpy(acts + (size_t)a * act_stride, one_act, ab);
            }
            for (int nacts = 1; nacts <= MAXA; nacts++) {
                size_t y_stride = NROWS + YPAD;
                float y[MAXA * (NROWS + YPAD)];
                for (size_t i = 0; i < sizeof y / sizeof y[0]; i++) y[i] = -1.0f;
                ds4_set_simd(level);
                ds4_vec_dot_rows_multi(type, n, NROWS, w, row_stride, acts, act_stride, nacts, y, y_stride);
                for (int a = 0; a < MAXA; a++) {
                    memcpy(one_act, acts + (size_t)a * act_stride, ab); /* the single kernel reads it aligned */
                    for (int i = 0; i < (int)y_stride; i++) {
                        float got = y[(size_t)a * y_stride + (size_t)i];
                        if (a >= nacts || i >= NROWS) {
                            assert_true(got == -1.0f); /* nothing written outside */
                            continue;
                        }
                        float one = ds4_vec_dot(type, n, w + (size_t)i * row_stride, one_act);
                        if (memcmp(&one, &got, sizeof one) != 0)
                            fail_msg("%s %s n=%lld, %d activations: row %d act %d multi %a, single %a",
                                     level == DS4_SIMD_SCALAR ? "scalar" : "avx2", ds4_type_get(type)->name,
                                     (long long)n, nacts, i, a, (double)got, (double)one);
                    }
                }
                ds4_set_simd(DS4_SIMD_AUTO);
            }
            free(wbuf);
            free(abuf);
            free(tmp);
            free(one_act);
        }
    }
}

static void test_multi_matches_single_scalar(void **state) {
    (void)state;
    check_multi_level(DS4_SIMD_SCALAR, 5);
}

static void test_multi_matches_single_avx2(void **state) {
    (void)state;
    if (!ds4_cpu_has_avx2_fma()) {
        print_message("no AVX2+FMA on this CPU: only the scalar kernels exist\n");
        skip();
    }
    check_multi_level(DS4_SIMD_AVX2, 6);
}

/* --------------------------------------------------- activation quantizers */

static void check_q8_0x_block(const float *x, const ds4_block_q8_0x *b) {
    float amax = 0;
    for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[k]));
    float d = amax / 127.0f;
    assert_true(b->d == d);
    for (int k = 0; k < 32; k++) {
        long q = d == 0 ? 0 : lrintf(x[k] * (1.0f / d));
        q = q < -128 ? -128 : q > 127 ? 127 : q;
        assert_int_equal(b->qs[k], q);
        assert_true(b->qs[k] >= -127); /* the dots rely on it */
    }
}

static void check_q8_K_block(const float *x, const ds4_block_q8_K *b) {
    float amax = 0, max = 0;
    for (int k = 0; k < 256; k++) {
        if (fabsf(x[k]) > amax) {
            amax = fabsf(x[k]);
            max = x[k];
        }
    }
    if (amax == 0) {
        assert_true(b->d == 0);
        for (int k = 0; k < 256; k++) assert_int_equal(b->qs[k], 0);
        for (int j = 0; j < 16; j++) assert_int_equal(b->bsums[j], 0);
        return;
    }
    float iscale = -127.0f / max;
    assert_true(b->d == 1.0f / iscale);
    int biggest = 0;
    for (int k = 0; k < 256; k++) {
        long q = lrintf(iscale * x[k]);
        q = q < -128 ? -128 : q > 127 ? 127 : q;
        assert_int_equal(b->qs[k], q);
        assert_true(b->qs[k] >= -127);
        if (x[k] == max) biggest = b->qs[k];
    }
    assert_int_equal(biggest, -127);
    for (int j = 0; j < 16; j++) {
        int s = 0;
        for (int k = 0; k < 16; k++) s += b->qs[16 * j + k];
        assert_int_equal(b->bsums[j], s);
    }
}

static void test_activation_quantizers(void **state) {
    (void)state;
    qt_rng r;
    qt_seed(&r, 4);
    enum { N = 256 * 64 };
    float *x = malloc(N * sizeof(float));
    ds4_block_q8_0x *a = malloc(N / 32 * sizeof *a);
    ds4_block_q8_K *k = malloc(N / 256 * sizeof *k);
    for (int rep = 0; rep < 20; rep++) {
        qt_gauss_fill(&r, x, N, (float)ldexp(1.0, rep - 10));
        memset(x, 0, 300 * sizeof(float));                                    /* zero blocks */
        x[300] = 5.0f;                                                        /* one-hot in a zero stretch */
        for (int i = 512; i < 768; i++) x[i] = (float)(i % 254 - 127) + 0.5f; /* ties */
        x[512] = -127.0f; /* iscale = 1 (q8_K), d = 1 (q8_0x): the halves are exact ties */
        for (int i = 1024; i < 1056; i++) x[i] = (i & 1) ? 1.0f : -1.0f; /* equal |x|, both signs */
        ds4_quantize_q8_0x(x, a, N);
        ds4_quantize_q8_K(x, k, N);
        for (int b = 0; b < N / 32; b++) check_q8_0x_block(x + 32 * b, &a[b]);
        for (int b = 0; b < N / 256; b++) check_q8_K_block(x + 256 * b, &k[b]);
    }
    /* the tie block rounds half to even */
    ds4_quantize_q8_K(x + 512, k, 256);
    assert_int_equal(k[0].qs[1], -122); /* x[513] = -121.5 */
    assert_int_equal(k[0].qs[2], -120); /* x[514] = -120.5 */
    free(x);
    free(a);
    free(k);
}

/* ------------------------------------------------------------- interface */

static void test_act_formats_and_bad_input(void **state) {
    (void)state;
    assert_int_equal(ds4_act_type(DS4_TYPE_F32), DS4_TYPE_F32);
    assert_int_equal(ds4_act_type(DS4_TYPE_F16), DS4_TYPE_F32);
    assert_int_equal(ds4_act_type(DS4_TYPE_BF16), DS4_TYPE_F32);
    assert_int_equal(ds4_act_type(DS4_TYPE_Q8_0), DS4_TYPE_Q8_0);
    assert_int_equal(ds4_act_type(DS4_TYPE_Q2_K), DS4_TYPE_Q8_K);
    assert_int_equal(ds4_act_type(DS4_TYPE_Q4_K), DS4_TYPE_Q8_K);
    assert_int_equal(ds4_act_type(DS4_TYPE_IQ2_XXS), DS4_TYPE_Q8_K);
    assert_int_equal(ds4_act_type(3), UINT32_MAX);
    assert_int_equal(ds4_act_bytes(DS4_TYPE_F16, 10), 40);
    assert_int_equal(ds4_act_bytes(DS4_TYPE_Q8_0, 64), 72);
    assert_int_equal(ds4_act_bytes(DS4_TYPE_Q8_0, 65), 0);
    assert_int_equal(ds4_act_bytes(DS4_TYPE_IQ2_XXS, 512), 584);
    assert_int_equal(ds4_act_bytes(DS4_TYPE_Q2_K, 100), 0);
    assert_int_equal(ds4_act_bytes(99, 256), 0);

    float x[256] = {1.0f}, y[256];
    uint8_t buf[1024] = {0};
    ds4_block_q8_K act[1];
    ds4_quantize_act(DS4_TYPE_Q2_K, x, act, 256);
    assert_true(isnan(ds4_vec_dot(DS4_TYPE_Q2_K, 100, buf, act))); /* not whole blocks */
    assert_true(isnan(ds4_vec_dot(TYPE_Q4_0, 256, buf, act)));
    float rows[3];
    ds4_vec_dot_rows(DS4_TYPE_Q8_K, 256, 3, buf, 292, act, rows); /* activation-only type */
    for (int i = 0; i < 3; i++) assert_true(isnan(rows[i]));
    assert_int_equal(ds4_quantize_row(DS4_TYPE_Q4_K, x, buf, 100, NULL), 0);
    assert_int_equal(ds4_quantize_row(DS4_TYPE_Q8_K, x, buf, 256, NULL), 0);
    assert_int_equal(ds4_quantize_row(DS4_TYPE_Q8_0, x, buf, 64, NULL), 68);
    ds4_dequantize_row(TYPE_Q4_0, buf, y, 32);
    for (int i = 0; i < 32; i++) assert_true(isnan(y[i]));
    ds4_dequantize_row(DS4_TYPE_Q8_K, act, y, 256); /* activation blocks decode too */
    assert_true(y[0] == act[0].d * act[0].qs[0]);

    ds4_set_simd(DS4_SIMD_SCALAR);
    assert_int_equal(ds4_get_simd(), DS4_SIMD_SCALAR);
    ds4_set_simd(DS4_SIMD_AUTO);
    assert_int_equal(ds4_get_simd(), ds4_cpu_has_avx2_fma() ? DS4_SIMD_AVX2 : DS4_SIMD_SCALAR);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_avx2_matches_scalar),       cmocka_unit_test(test_dot_matches_double_reference),
        cmocka_unit_test(test_rows_match_single),         cmocka_unit_test(test_multi_matches_single_scalar),
        cmocka_unit_test(test_multi_matches_single_avx2), cmocka_unit_test(test_activation_quantizers),
        cmocka_unit_test(test_act_formats_and_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
