/*
 * test_cpu_golden.c - the CPU forward pass against HF transformers.
 *
 * tests/golden/cpu/NAME.f16.gguf are two tiny Flash-shaped models (ratios
 * 0,0,4,128,4,...; hash layers; YaRN; 32 indexer heads with a top-k far
 * below the 100 ratio-4 rows of the prompt; >= 3 ratio-128 rows), two of
 * shapes no published model has (odd-a, odd-b) and one of Pro's pattern
 * (pro-a; tests/golden/cpu/README.md), and
 * NAME.golden their logits from transformers' DeepseekV4ForCausalLM for
 * every position, as one prefill and token by token through its cache
 * (tests/reference/hf_golden.py).  With the simulations off the engine must
 * agree to max |d| <= 1e-4 * max |logit| with the same argmax everywhere,
 * from the F16 file and from an F32 copy of it (the weights are
 * f16-representable, so both hold the same model).
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
#include <unistd.h>

#include "common/gguf_edit.h"
#include "model/backends.h"

typedef struct golden {
    uint32_t n, vocab;
    uint32_t *tokens;
    float *prefill, *decode;
} golden;

static void read_golden(const char *path, golden *g) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char magic[4];
    uint32_t h[3];
    assert_int_equal(fread(magic, 1, 4, f), 4);
    assert_memory_equal(magic, "DS4G", 4);
    assert_int_equal(fread(h, 4, 3, f), 3);
    assert_int_equal(h[0], 1);
    g->n = h[1];
    g->vocab = h[2];
    size_t nl = (size_t)g->n * g->vocab;
    g->tokens = malloc(g->n * 4);
    g->prefill = malloc(nl * 4);
    g->decode = malloc(nl * 4);
    assert_int_equal(fread(g->tokens, 4, g->n, f), g->n);
    assert_int_equal(fread(g->prefill, 4, nl, f), nl);
    assert_int_equal(fread(g->decode, 4, nl, f), nl);
    fclose(f);
}

static void free_golden(golden *g) {
    free(g->tokens);
    free(g->prefill);
    free(g->decode);
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++) if (x[i] > x[b]) b = i;
    return b;
}

/* max |got - want| <= 1e-4 max |want| over all positions; same argmax. */
static void compare(const char *what, const float *got, const float *want, uint32_t n, uint32_t vocab) {
    float amax = 0.0f, dmax = 0.0f;
    for (size_t i = 0; i < (size_t)n * vocab; i++) amax = fmaxf(amax, fabsf(want[i]));
    uint32_t argmax_bad = 0;
    for (uint32_t p = 0; p < n; p++) {
        for (uint32_t v = 0; v < vocab; v++)
            dmax = fmaxf(dmax, fabsf(got[(size_t)p * vocab + v] - want[(size_t)p * vocab + v]));
        if (argmax(got + (size_t)p * vocab, vocab) != argmax(want + (size_t)p * vocab, vocab)) argmax_bad++;
    }
    printf("%s: max|d| %.3g (%.3g of max|logit| %.3f), argmax mismatches %u of %u\n", what, dmax, dmax / amax, amax,
           argmax_bad, n);
    assert_true(dmax <= 1e-4f * amax);
    assert_int_equal(argmax_bad, 0);
}

static void check_model(const char *gguf_path, const golden *g, bool decode_too) {
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(gguf_path, &err);
    if (!w) fail_msg("%s", ds4_err_msg(&err));
    assert_int_equal(w->cfg.n_vocab, g->vocab);
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = 1024, .no_sim = true};
    ds4_backend *b = ds4_backend_create("cpu", w, &o, &err);
    assert_non_null(b);
    float *got = malloc((size_t)g->n * g->vocab * sizeof(float));
    assert_int_equal(ds4_backend_prefill(b, g->tokens, g->n, got, &err), 0);
    compare("prefill", got, g->prefill, g->n, g->vocab);
    if (decode_too) {
        ds4_backend_reset(b);
        for (uint32_t i = 0; i < g->n; i++) {
            assert_int_equal(ds4_backend_decode(b, g->tokens[i], &err), 0);
            memcpy(got + (size_t)i * g->vocab, ds4_backend_logits(b), g->vocab * sizeof(float));
        }
        compare("decode", got, g->decode, g->n, g->vocab);
    }
    free(got);
    ds4_backend_free(b);
    ds4_weights_close(w);
}

static void run_config(const char *name) {
    char path[256], gpath[256], f32path[256];
    snprintf(path, sizeof(path), "tests/golden/cpu/%s.f16.gguf", name);
    snprintf(gpath, sizeof(gpath), "tests/golden/cpu/%s.golden", name);
    snprintf(f32path, sizeof(f32path), "build/tests/%s.f32.%d.gguf", name, (int)getpid());
    golden g;
    read_golden(gpath, &g);
    printf("%s (F16 weights)\n", name);
    check_model(path, &g, true);

    ds4_err err = {0};
    gguf_edit e = {.all_f32 = true};
    if (gguf_copy_edited(path, f32path, &e, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    printf("%s (F32 weights)\n", name);
    check_model(f32path, &g, true);
    unlink(f32path);
    free_golden(&g);
}

static void test_tiny_a(void **state) { (void)state; run_config("tiny-a"); }
static void test_tiny_b(void **state) { (void)state; run_config("tiny-b"); }
/* Shapes no published model has (width 80 and output rank 16; width 112,
 * heads of 192, rank 24) and Pro's pattern scaled down (ratio 128 from
 * layer 0, 16 output groups, 24 experts choosing 6, routed scale 2.5, an
 * indexer top-k above the compressed rows). */
static void test_odd_a(void **state) { (void)state; run_config("odd-a"); }
static void test_odd_b(void **state) { (void)state; run_config("odd-b"); }
static void test_pro_a(void **state) { (void)state; run_config("pro-a"); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_a),
        cmocka_unit_test(test_tiny_b),
        cmocka_unit_test(test_odd_a),
        cmocka_unit_test(test_odd_b),
        cmocka_unit_test(test_pro_a),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
