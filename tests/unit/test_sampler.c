/*
 * test_sampler.c - greedy is the argmax; the filters keep exactly the
 * tokens they should; draws follow the filtered distribution; the same
 * seed gives the same sequence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "engine/sampler.h"

static ds4_sampler make(float t, float top_p, float min_p, int top_k, uint64_t seed, int n) {
    ds4_sampler_params p = {.temperature = t, .top_p = top_p, .min_p = min_p, .top_k = top_k, .seed = seed};
    ds4_sampler s;
    ds4_err err;
    assert_int_equal(ds4_sampler_init(&s, &p, n, &err), 0);
    return s;
}

static void test_argmax_ties_and_nan(void **state) {
    (void)state;
    float x[] = {1, 3, NAN, 3, -INFINITY};
    assert_int_equal(ds4_argmax(x, 5), 1);
    float y[] = {-INFINITY, -INFINITY};
    assert_int_equal(ds4_argmax(y, 2), 0);
    float z[] = {NAN, 2, NAN};
    assert_int_equal(ds4_argmax(z, 3), 1);
}

static void test_greedy_is_argmax(void **state) {
    (void)state;
    float x[] = {0.5f, 2.0f, 7.0f, 7.0f, -1.0f};
    ds4_sampler s = make(0.0f, 1.0f, 0.05f, 0, 42, 5);
    for (int i = 0; i < 10; i++) assert_int_equal(ds4_sample(&s, x), 2);
    ds4_sampler_free(&s);
}

/* Frequencies over many draws must match the filtered softmax. */
static void check_distribution(ds4_sampler *s, const float *logits, int n, const double *expect) {
    enum { DRAWS = 200000 };
    int counts[16] = {0};
    for (int i = 0; i < DRAWS; i++) counts[ds4_sample(s, logits)]++;
    for (int i = 0; i < n; i++) {
        double f = (double)counts[i] / DRAWS;
        double sd = sqrt(expect[i] * (1 - expect[i]) / DRAWS);
        if (expect[i] == 0.0) assert_int_equal(counts[i], 0);
        else assert_true(fabs(f - expect[i]) < 5 * sd + 1e-9);
    }
}

static void softmax(const float *l, int n, float t, double *p) {
    double sum = 0;
    for (int i = 0; i < n; i++) sum += p[i] = exp(l[i] / t);
    for (int i = 0; i < n; i++) p[i] /= sum;
}

static void test_plain_temperature(void **state) {
    (void)state;
    float l[] = {0.0f, 1.0f, 2.0f, 0.5f};
    double p[4];
    softmax(l, 4, 0.7f, p);
    ds4_sampler s = make(0.7f, 1.0f, 0.0f, 0, 7, 4);
    check_distribution(&s, l, 4, p);
    ds4_sampler_free(&s);
}

static void test_min_p_cuts_exactly(void **state) {
    (void)state;
    /* probs proportional to 1, 0.5, 0.1, 0.04: min_p 0.05 drops the last. */
    float l[] = {0.0f, logf(0.5f), logf(0.1f), logf(0.04f)};
    double p[4] = {1, 0.5, 0.1, 0};
    double sum = 1.6;
    for (int i = 0; i < 4; i++) p[i] /= sum;
    ds4_sampler s = make(1.0f, 1.0f, 0.05f, 0, 9, 4);
    check_distribution(&s, l, 4, p);
    ds4_sampler_free(&s);
}

static void test_top_k_and_top_p(void **state) {
    (void)state;
    float l[] = {logf(0.1f), logf(0.4f), logf(0.3f), logf(0.2f)};
    /* top-k 2 keeps ids 1 and 2. */
    double pk[4] = {0, 0.4 / 0.7, 0.3 / 0.7, 0};
    ds4_sampler s = make(1.0f, 1.0f, 0.0f, 2, 11, 4);
    check_distribution(&s, l, 4, pk);
    ds4_sampler_free(&s);
    /* top-p 0.75 keeps 0.4 + 0.3 = 0.7 < 0.75, so also 0.2. */
    double pp[4] = {0, 0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9};
    s = make(1.0f, 0.75f, 0.0f, 0, 13, 4);
    check_distribution(&s, l, 4, pp);
    ds4_sampler_free(&s);
}

static void test_same_seed_same_tokens(void **state) {
    (void)state;
    float l[64];
    for (int i = 0; i < 64; i++) l[i] = sinf((float)i) * 3.0f;
    ds4_sampler a = make(1.0f, 0.95f, 0.05f, 0, 1234, 64), b = make(1.0f, 0.95f, 0.05f, 0, 1234, 64);
    ds4_sampler c = make(1.0f, 0.95f, 0.05f, 0, 999, 64);
    int differ = 0;
    for (int i = 0; i < 200; i++) {
        int32_t ta = ds4_sample(&a, l), tb = ds4_sample(&b, l), tc = ds4_sample(&c, l);
        assert_int_equal(ta, tb);
        differ |= ta != tc;
    }
    assert_true(differ);
    ds4_sampler_free(&a);
    ds4_sampler_free(&b);
    ds4_sampler_free(&c);
}

static void test_top_logprobs(void **state) {
    (void)state;
    float l[] = {1.0f, 3.0f, 2.0f, 3.0f};
    int32_t ids[3];
    float lp[3];
    assert_int_equal(ds4_top_logprobs(l, 4, 3, ids, lp), 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 2);
    double lse = log(exp(1.0) + 2 * exp(3.0) + exp(2.0));
    assert_float_equal(lp[0], 3.0 - lse, 1e-6);
    assert_float_equal(lp[2], 2.0 - lse, 1e-6);
    assert_float_equal(ds4_logprob_of(l, 4, 0), 1.0 - lse, 1e-12);
}

static void test_bad_params(void **state) {
    (void)state;
    ds4_sampler_params p;
    ds4_sampler_defaults(&p);
    ds4_err err;
    p.temperature = -1;
    assert_int_equal(ds4_sampler_params_check(&p, &err), -1);
    assert_non_null(strstr(err.msg, "temperature"));
    ds4_sampler_defaults(&p);
    p.top_p = 1.5f;
    assert_int_equal(ds4_sampler_params_check(&p, &err), -1);
    ds4_sampler_defaults(&p);
    p.min_p = NAN;
    assert_int_equal(ds4_sampler_params_check(&p, &err), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax_ties_and_nan), cmocka_unit_test(test_greedy_is_argmax),
        cmocka_unit_test(test_plain_temperature),   cmocka_unit_test(test_min_p_cuts_exactly),
        cmocka_unit_test(test_top_k_and_top_p),     cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_top_logprobs),        cmocka_unit_test(test_bad_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
