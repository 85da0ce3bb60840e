/*
 * test_rank.c - one argmax and one top-k (base/rank.h) for every path that
 * picks tokens: the order (larger first, lower index on ties), the NaN rule
 * (never chosen, an all-NaN row gives 0), and the paths built on them
 * agreeing on rows with NaN: the generic greedy loop of the backends, the
 * sampler at temperature 0 and with top-k 1, and the log-probability report.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/rank.h"
#include "engine/sampler.h"
#include "model/backend.h"

static void test_argmax(void **state) {
    (void)state;
    const float a[] = {1, 3, 2, 3};
    assert_int_equal(ds4_argmax(a, 4), 1); /* lowest index on ties */
    const float nan_first[] = {NAN, -1, 5, NAN, 4};
    assert_int_equal(ds4_argmax(nan_first, 5), 2);
    const float all_nan[] = {NAN, NAN, NAN};
    assert_int_equal(ds4_argmax(all_nan, 3), 0);
    const float ninf[] = {NAN, -INFINITY, -INFINITY};
    assert_int_equal(ds4_argmax(ninf, 3), 1);
    const float pinf[] = {2, INFINITY, NAN, INFINITY};
    assert_int_equal(ds4_argmax(pinf, 4), 1);
    assert_int_equal(ds4_argmax(a, 0), 0);
}

static void test_top_k(void **state) {
    (void)state;
    const float x[] = {0.5f, NAN, 2, 7, 2, -INFINITY, 7, NAN};
    int32_t ids[8];
    assert_int_equal(ds4_top_k(x, 8, 4, ids), 4);
    const int32_t want[] = {3, 6, 2, 4};
    assert_memory_equal(ids, want, sizeof(want));
    assert_int_equal(ids[0], ds4_argmax(x, 8));
    /* More than the numbers in the row: every number, NaN left out. */
    assert_int_equal(ds4_top_k(x, 8, 8, ids), 6);
    const int32_t all[] = {3, 6, 2, 4, 0, 5};
    assert_memory_equal(ids, all, sizeof(all));
    assert_int_equal(ds4_top_k(x, 8, 0, ids), 0);
    const float nans[] = {NAN, NAN};
    assert_int_equal(ds4_top_k(nans, 2, 2, ids), 0);
    assert_true(ds4_any_nan(x, 8));
    assert_false(ds4_any_nan(x, 1));
}

/* A backend whose logits are a fixed row, without a greedy op of its own:
 * ds4_backend_greedy runs its generic loop over it. */
#define FAKE_V 5
static const float FAKE_ROW[FAKE_V] = {NAN, 1.0f, 4.0f, NAN, 4.0f};

static int fake_decode(ds4_backend *b, ds4_seq *s, uint32_t token, ds4_err *err) {
    (void)b;
    (void)s;
    (void)token;
    (void)err;
    return 0;
}
static const float *fake_logits(ds4_backend *b, ds4_seq *s) {
    (void)b;
    (void)s;
    return FAKE_ROW;
}

static void test_greedy_paths_agree(void **state) {
    (void)state;
    static const ds4_backend_ops ops = {.name = "fake", .decode = fake_decode, .logits = fake_logits};
    static ds4_weights w;
    w.cfg.n_vocab = FAKE_V;
    ds4_seq main_seq = {0};
    ds4_backend b = {.ops = &ops, .w = &w, .main = &main_seq};
    uint32_t out[3];
    ds4_err err = {0};
    assert_int_equal(ds4_backend_greedy(&b, 3, out, &err), 0);
    int32_t want = ds4_argmax(FAKE_ROW, FAKE_V);
    assert_int_equal(want, 2);
    for (int i = 0; i < 3; i++) assert_int_equal(out[i], want);

    ds4_sampler_params p;
    ds4_sampler_defaults(&p);
    p.temperature = 0;
    ds4_sampler s;
    assert_int_equal(ds4_sampler_init(&s, &p, FAKE_V, &err), 0);
    assert_int_equal(ds4_sample(&s, FAKE_ROW), want);
    ds4_sampler_free(&s);
    p.temperature = 5;
    p.top_k = 1;
    p.min_p = 0;
    p.seed = 9;
    assert_int_equal(ds4_sampler_init(&s, &p, FAKE_V, &err), 0);
    for (int i = 0; i < 20; i++) assert_int_equal(ds4_sample(&s, FAKE_ROW), want);
    ds4_sampler_free(&s);

    int32_t ids[FAKE_V];
    float lps[FAKE_V];
    assert_int_equal(ds4_top_logprobs(FAKE_ROW, FAKE_V, FAKE_V, ids, lps), 3);
    assert_int_equal(ids[0], want);
    assert_int_equal(ids[1], 4);
    assert_int_equal(ids[2], 1);
    assert_true(isnan(lps[0])); /* a row with NaN has no distribution: its log-probabilities say so */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_greedy_paths_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
