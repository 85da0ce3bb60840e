/*
 * test_cpu_matmul.c - the CPU backend's matrix product (cpu_matmul) for
 * every weight type the loader accepts: rows from any offset of any matrix
 * of a 3-D (expert) tensor, several tokens at once, 1 and 3 threads.  The
 * reference is the dequantized row times the activation in double; the
 * tolerance is that of the activation format (f32 for float weights, 8-bit
 * blocks for the quantized ones, docs/MODEL.md 3.8).  Results must not depend on
 * the thread count or on how many tokens share the call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"
#include "model/cpu/cpu.h"

enum { N_IN = 512, ROWS = 24, MATS = 3, T = 5 };

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void check_type(uint32_t type, float tol) {
    uint64_t seed = 42 + type;
    size_t rb = ds4_row_bytes(type, N_IN);
    uint8_t *wbytes = malloc(rb * ROWS * MATS);
    float *wf = malloc(sizeof(float) * N_IN);
    for (int r = 0; r < ROWS * MATS; r++) {
        for (int i = 0; i < N_IN; i++) wf[i] = frand(&seed) * (1.0f + (float)(r % 5));
        ds4_quantize_row(type, wf, wbytes + (size_t)r * rb, N_IN, NULL);
    }
    ds4_wt W = {.data = wbytes, .type = type, .ne = {N_IN, ROWS, MATS}, .row_bytes = rb, .name = "w"};
    float x[T][N_IN];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N_IN; i++) x[t][i] = frand(&seed) * (t + 1);

    for (int threads = 1; threads <= 3; threads += 2) {
        cpu_backend b = {0};
        ds4_err err;
        b.pool = ds4_pool_create(threads, &err);
        b.act_row = ds4_act_bytes(DS4_TYPE_F32, N_IN) + ds4_act_bytes(DS4_TYPE_Q2_K, N_IN);
        b.act = malloc(b.act_row * T);
        float y[T][ROWS], y1[ROWS];
        /* rows 5..20 of matrix 2 */
        cpu_matmul(&b, &W, 2, 5, 16, &x[0][0], N_IN, T, &y[0][0], ROWS);
        for (int t = 0; t < T; t++) {
            float xn = 0;
            for (int i = 0; i < N_IN; i++) xn = fmaxf(xn, fabsf(x[t][i]));
            for (int r = 0; r < 16; r++) {
                ds4_dequantize_row(type, ds4_wt_row(&W, 2, 5 + r), wf, N_IN);
                double ref = 0, mag = 0;
                for (int i = 0; i < N_IN; i++) {
                    ref += (double)wf[i] * x[t][i];
                    mag += fabs((double)wf[i]) * xn;
                }
                if (fabs(y[t][r] - ref) > tol * mag)
                    fail_msg("type %u token %d row %d: %g, expected %g (tolerance %g)", type, t, r, y[t][r], ref, tol * mag);
            }
            /* one token alone gives the same bits */
            cpu_matmul(&b, &W, 2, 5, 16, &x[t][0], N_IN, 1, y1, ROWS);
            assert_memory_equal(y1, y[t], 16 * sizeof(float));
        }
        free(b.act);
        ds4_pool_free(b.pool);
    }
    free(wbytes);
    free(wf);
}

static void test_f32(void **s) { (void)s; check_type(DS4_TYPE_F32, 1e-6f); }
static void test_f16(void **s) { (void)s; check_type(DS4_TYPE_F16, 1e-6f); }
static void test_bf16(void **s) { (void)s; check_type(DS4_TYPE_BF16, 1e-6f); }
static void test_q8_0(void **s) { (void)s; check_type(DS4_TYPE_Q8_0, 1e-2f); }
static void test_q2_k(void **s) { (void)s; check_type(DS4_TYPE_Q2_K, 1e-2f); }
static void test_q4_k(void **s) { (void)s; check_type(DS4_TYPE_Q4_K, 1e-2f); }
static void test_iq2_xxs(void **s) { (void)s; check_type(DS4_TYPE_IQ2_XXS, 1e-2f); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32), cmocka_unit_test(test_f16), cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_q8_0), cmocka_unit_test(test_q2_k), cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_iq2_xxs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
