/*
 * test_cpu_matmul.c - the CPU backend's matrix product (cpu_matmul) for
 * every weight type the loader accepts: rows from any offset of any matrix
 * of a 3-D (expert) tensor, several tokens at once, 1 to 4 threads.  The
 * reference is the dequantized row times the activation in double; the
 * tolerance is that of the activation format (f32 for float weights, 8-bit
 * blocks for the quantized ones, docs/MODEL.md 3.8).  Results must be
 * bit-identical whatever the thread count (the product is large enough to
 * be split into tasks) and however many tokens share the call.
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

/* Rows 5..5+NR of matrix 2: enough work (NR * N_IN * T multiply-adds,
 * and NR * N_IN for one token) that the pool splits it into several tasks,
 * so different thread counts really compute different partitions. */
enum { N_IN = 4096, ROWS = 320, MATS = 3, T = 5, ROW0 = 5, NR = 300 };
static const int THREADS[] = {1, 2, 3, 4};

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void check_type(uint32_t type, float tol) {
    assert_true((uint64_t)NR * N_IN >= CPU_MIN_TASK_WORK); /* one token uses the pool */
    assert_true(NR > CPU_MIN_TASK_WORK / (N_IN * T) + 1);  /* in more than one task */
    uint64_t seed = 42 + type;
    size_t rb = ds4_row_bytes(type, N_IN);
    uint8_t *wbytes = malloc(rb * ROWS * MATS);
    float *wf = malloc(sizeof(float) * N_IN);
    for (int r = 0; r < ROWS * MATS; r++) {
        for (int i = 0; i < N_IN; i++) wf[i] = frand(&seed) * (1.0f + (float)(r % 5));
        ds4_quantize_row(type, wf, wbytes + (size_t)r * rb, N_IN, NULL);
    }
    ds4_wt W = {.data = wbytes, .type = type, .ne = {N_IN, ROWS, MATS}, .row_bytes = rb, .name = "w"};
    static float x[T][N_IN], y[T][NR], first[T][NR], y1[NR];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < N_IN; i++) x[t][i] = frand(&seed) * (t + 1);

    for (size_t k = 0; k < sizeof(THREADS) / sizeof(THREADS[0]); k++) {
        cpu_backend b = {0};
        ds4_err err;
        b.pool = ds4_pool_create(THREADS[k], &err);
        assert_non_null(b.pool);
        b.act_row = ds4_act_bytes(DS4_TYPE_F32, N_IN) + ds4_act_bytes(DS4_TYPE_Q2_K, N_IN);
        b.act = malloc(b.act_row * T);
        cpu_matmul(&b, &W, 2, ROW0, NR, &x[0][0], N_IN, T, &y[0][0], NR);
        if (k == 0) {
            /* The reference, once: the dequantized rows in double. */
            for (int t = 0; t < T; t++) {
                float xn = 0;
                for (int i = 0; i < N_IN; i++) xn = fmaxf(xn, fabsf(x[t][i]));
                for (int r = 0; r < NR; r++) {
                    ds4_dequantize_row(type, ds4_wt_row(&W, 2, ROW0 + r), wf, N_IN);
                    double ref = 0, mag = 0;
                    for (int i = 0; i < N_IN; i++) {
                        ref += (double)wf[i] * x[t][i];
                        mag += fabs((double)wf[i]) * xn;
                    }
                    if (fabs(y[t][r] - ref) > tol * mag)
                        fail_msg("type %u token %d row %d: %g, expected %g (tolerance %g)", type, t, r, y[t][r], ref,
                                 tol * mag);
                }
            }
            memcpy(first, y, sizeof(y));
        } else if (memcmp(first, y, sizeof(y)) != 0) {
            /* Any thread count gives the bits of one thread. */
            fail_msg("type %u: %d threads differ from 1 thread", type, THREADS[k]);
        }
        /* One token alone gives the same bits. */
        for (int t = 0; t < T; t++) {
            cpu_matmul(&b, &W, 2, ROW0, NR, &x[t][0], N_IN, 1, y1, NR);
            assert_memory_equal(y1, first[t], sizeof(y1));
        }
        free(b.act);
        ds4_pool_free(b.pool);
    }
    free(wbytes);
    free(wf);
}

static void test_f32(void **s) {
    (void)s;
    check_type(DS4_TYPE_F32, 1e-6f);
}
static void test_f16(void **s) {
    (void)s;
    check_type(DS4_TYPE_F16, 1e-6f);
}
static void test_bf16(void **s) {
    (void)s;
    check_type(DS4_TYPE_BF16, 1e-6f);
}
static void test_q8_0(void **s) {
    (void)s;
    check_type(DS4_TYPE_Q8_0, 1e-2f);
}
static void test_q2_k(void **s) {
    (void)s;
    check_type(DS4_TYPE_Q2_K, 1e-2f);
}
static void test_q4_k(void **s) {
    (void)s;
    check_type(DS4_TYPE_Q4_K, 1e-2f);
}
static void test_iq2_xxs(void **s) {
    (void)s;
    check_type(DS4_TYPE_IQ2_XXS, 1e-2f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32),     cmocka_unit_test(test_f16),  cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_q8_0),    cmocka_unit_test(test_q2_k), cmocka_unit_test(test_q4_k),
        cmocka_unit_test(test_iq2_xxs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
