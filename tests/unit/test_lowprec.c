/*
 * test_lowprec.c - the low-precision simulations (src/model/lowprec.c)
 * against their definition in docs/MODEL.md 4.3-4.4, as computed by numpy
 * in tests/reference/lowprec_golden.py (tests/golden/cpu/lowprec.bin):
 * FP8 E4M3 KV round trip (random rows over many scales, every tie between
 * neighbouring magnitudes, zeros), FP4 E2M1 round trip (ties included) and
 * the indexer's Hadamard + FP4.  Bit-exact.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp.h"
#include "model/lowprec.h"

typedef struct section {
    uint32_t n, len;
    float *in, *out;
} section;

static void read_section(FILE *f, section *s) {
    uint32_t h[2];
    assert_int_equal(fread(h, 4, 2, f), 2);
    s->n = h[0];
    s->len = h[1];
    size_t m = (size_t)s->n * s->len;
    s->in = malloc(m * 4);
    s->out = malloc(m * 4);
    assert_int_equal(fread(s->in, 4, m, f), m);
    assert_int_equal(fread(s->out, 4, m, f), m);
}

static section fp8, fp4, qat;

static int setup(void **state) {
    (void)state;
    FILE *f = fopen("tests/golden/cpu/lowprec.bin", "rb");
    if (!f) return -1;
    read_section(f, &fp8);
    read_section(f, &fp4);
    read_section(f, &qat);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    section *all[] = {&fp8, &fp4, &qat};
    for (int i = 0; i < 3; i++) {
        free(all[i]->in);
        free(all[i]->out);
    }
    return 0;
}

static void check(const section *s, void (*fn)(float *, uint32_t)) {
    float *row = malloc(s->len * sizeof(float));
    for (uint32_t r = 0; r < s->n; r++) {
        memcpy(row, s->in + (size_t)r * s->len, s->len * sizeof(float));
        fn(row, s->len);
        for (uint32_t i = 0; i < s->len; i++) {
            float want = s->out[(size_t)r * s->len + i];
            if (memcmp(&row[i], &want, 4) != 0)
                fail_msg("row %u value %u: input %.9g gave %.9g, expected %.9g", r, i, s->in[(size_t)r * s->len + i],
                         row[i], want);
        }
    }
    free(row);
}

static void qat_rows(float *x, uint32_t n) {
    assert_int_equal(n, 128);
    ds4_indexer_qat_row(x);
}

static void test_fp8_kv(void **state) {
    (void)state;
    assert_int_equal(fp8.len, 448);
    check(&fp8, ds4_fp8_kv_roundtrip);
}
static void test_fp4(void **state) {
    (void)state;
    check(&fp4, ds4_fp4_roundtrip);
}
static void test_indexer_qat(void **state) {
    (void)state;
    check(&qat, qat_rows);
}

static void test_f16_round(void **state) {
    (void)state;
    float x[4] = {1.0f, 1.0f + 1.0f / 4096, 65504.0f, 1e-9f};
    ds4_f16_round_row(x, 4);
    assert_true(x[0] == 1.0f && x[1] == 1.0f && x[2] == 65504.0f && x[3] == 0.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_kv),
        cmocka_unit_test(test_fp4),
        cmocka_unit_test(test_indexer_qat),
        cmocka_unit_test(test_f16_round),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
