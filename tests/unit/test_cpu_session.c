/*
 * test_cpu_session.c - with the low-precision simulations on (the default):
 * prefill, token-by-token decode, any chunking, split prefill + decode and
 * any thread count give bit-identical logits; a snapshot restored in memory
 * or through a DSV4 payload file continues bit-identically; the payload has
 * the byte layout of docs/MODEL.md 8.3 and bad payloads are refused.
 * Model: tests/golden/cpu/tiny-a.f16.gguf.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/backends.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define N     300

static ds4_weights *W;
static uint32_t tokens[N];
static float *ref; /* prefill logits, simulations on, 2 threads */
static uint32_t V;

static ds4_backend *make_ctx(int threads, uint32_t chunk, bool no_sim, uint32_t ctx) {
    ds4_err err = {0};
    ds4_backend_opts o = {.n_threads = threads, .ctx_size = ctx, .prefill_chunk = chunk, .no_sim = no_sim};
    ds4_backend *b = ds4_backend_create("cpu", W, &o, &err);
    if (!b) fail_msg("%s", ds4_err_msg(&err));
    return b;
}

static ds4_backend *make(int threads, uint32_t chunk, bool no_sim) { return make_ctx(threads, chunk, no_sim, 512); }

static float *run_prefill(ds4_backend *b, uint32_t n) {
    ds4_err err = {0};
    float *out = malloc((size_t)n * V * sizeof(float));
    if (ds4_backend_prefill(b, tokens, n, out, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    return out;
}

/* Decode tokens [from, to) and compare each step with ref bitwise. */
static void decode_and_check(ds4_backend *b, uint32_t from, uint32_t to) {
    ds4_err err = {0};
    for (uint32_t i = from; i < to; i++) {
        if (ds4_backend_decode(b, tokens[i], &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        if (memcmp(ds4_backend_logits(b), ref + (size_t)i * V, V * sizeof(float)) != 0)
            fail_msg("logits after token %u differ", i);
    }
}

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    if (!(W = ds4_weights_open(MODEL, &err))) {
        fprintf(stderr, "%s\n", ds4_err_msg(&err));
        return -1;
    }
    V = W->cfg.n_vocab;
    uint32_t s = 12345;
    for (uint32_t i = 0; i < N; i++) tokens[i] = (s = s * 1103515245u + 12345u) >> 8 & 0xffff, tokens[i] %= V;
    ds4_backend *b = make(2, 0, false);
    ref = run_prefill(b, N);
    ds4_backend_free(b);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(ref);
    ds4_weights_close(W);
    return 0;
}

static void test_decode_equals_prefill(void **state) {
    (void)state;
    ds4_backend *b = make(2, 0, false);
    decode_and_check(b, 0, N);
    ds4_backend_free(b);
}

static void test_chunks_and_threads(void **state) {
    (void)state;
    const struct {
        int threads;
        uint32_t chunk;
    } cases[] = {{1, 512}, {1, 7}, {2, 64}, {3, 129}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        ds4_backend *b = make(cases[c].threads, cases[c].chunk, false);
        float *got = run_prefill(b, N);
        if (memcmp(got, ref, (size_t)N * V * sizeof(float)) != 0)
            fail_msg("%d threads, chunk %u: logits differ", cases[c].threads, cases[c].chunk);
        free(got);
        ds4_backend_free(b);
    }
}

static void test_split_prefill_then_decode(void **state) {
    (void)state;
    ds4_backend *b = make(2, 0, false);
    free(run_prefill(b, 131));
    decode_and_check(b, 131, N);
    ds4_backend_reset(b); /* and again from scratch after a reset */
    free(run_prefill(b, 64));
    decode_and_check(b, 64, 100);
    ds4_backend_free(b);
}

static void test_simulations_change_the_result(void **state) {
    (void)state;
    ds4_backend *b = make(2, 0, true);
    float *got = run_prefill(b, N);
    assert_true(memcmp(got, ref, (size_t)N * V * sizeof(float)) != 0);
    free(got);
    ds4_backend_free(b);
}

static void test_snapshot_restore(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend *b = make(2, 0, false);
    free(run_prefill(b, 170));
    ds4_kv_state *snap = ds4_backend_state_new(b, &err);
    assert_int_equal(ds4_backend_snapshot(b, snap, &err), 0);
    decode_and_check(b, 170, 220);
    assert_int_equal(ds4_backend_restore(b, snap, &err), 0); /* rewind */
    assert_memory_equal(ds4_backend_logits(b), ref + (size_t)169 * V, V * sizeof(float));
    decode_and_check(b, 170, N);
    ds4_backend *fresh = make(1, 0, false);
    assert_int_equal(ds4_backend_restore(fresh, snap, &err), 0);
    decode_and_check(fresh, 170, N);
    ds4_kv_state_free(snap);
    ds4_backend_free(fresh);
    ds4_backend_free(b);
}

static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    long s = ftell(f);
    fclose(f);
    return s;
}

/* Save after prefill and after decode of the same tokens: identical bytes
 * of the size MODEL.md 8.3 gives; a new state loaded from the file
 * continues bit-identically. */
static void test_dsv4_payload(void **state) {
    (void)state;
    ds4_err err = {0};
    const ds4_config *c = &W->cfg;
    char p1[64], p2[64];
    snprintf(p1, sizeof(p1), "build/tests/session-a.%d.dsv4", (int)getpid());
    snprintf(p2, sizeof(p2), "build/tests/session-b.%d.dsv4", (int)getpid());
    uint32_t n = 203;

    ds4_backend *b = make(2, 0, false);
    free(run_prefill(b, n));
    ds4_kv_state *st = ds4_backend_state_new(b, &err);
    assert_int_equal(ds4_backend_snapshot(b, st, &err), 0);
    assert_int_equal(ds4_kv_state_save_file(st, p1, &err), 0);
    ds4_backend *d = make(2, 0, false);
    decode_and_check(d, 0, n);
    assert_int_equal(ds4_backend_snapshot(d, st, &err), 0);
    assert_int_equal(ds4_kv_state_save_file(st, p2, &err), 0);

    long want = 13 * 4 + 4 * n + 4 * c->n_vocab + 8 * c->n_layer;
    uint32_t L = n < c->sliding_window ? n : c->sliding_window;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        uint32_t r = c->compress_ratio[il];
        want += 4L * L * c->head_dim;
        if (r) want += 4L * (n / r) * c->head_dim + 2 * 4L * (r == 4 ? 8 : 128) * (r == 4 ? 2 : 1) * c->head_dim;
        if (r == 4) want += 4L * (n / 4) * c->idx_head_dim + 2 * 4L * 8 * 2 * c->idx_head_dim;
    }
    assert_int_equal(file_size(p1), want);
    FILE *f1 = fopen(p1, "rb"), *f2 = fopen(p2, "rb");
    char *a = malloc(want), *bb = malloc(want);
    assert_int_equal(fread(a, 1, want, f1), want);
    assert_int_equal(fread(bb, 1, want, f2), want);
    fclose(f1);
    fclose(f2);
    assert_memory_equal(a, bb, want);
    uint32_t h[13];
    memcpy(h, a, sizeof(h));
    assert_int_equal(h[0], 0x34565344u);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[7], n);
    assert_int_equal(h[8], c->n_layer);
    assert_int_equal(h[12], L);

    ds4_backend *fresh = make(1, 0, false);
    ds4_kv_state *loaded = ds4_backend_state_new(fresh, &err);
    if (ds4_kv_state_load_file(loaded, p1, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    assert_int_equal(ds4_backend_restore(fresh, loaded, &err), 0);
    decode_and_check(fresh, n, N);

    /* A truncated payload and a wrong magic are refused with a message. */
    FILE *t = fopen(p2, "wb");
    fwrite(a, 1, want - 100, t);
    fclose(t);
    assert_int_equal(ds4_kv_state_load_file(loaded, p2, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "truncated"));
    a[0] ^= 1;
    t = fopen(p2, "wb");
    fwrite(a, 1, want, t);
    fclose(t);
    assert_int_equal(ds4_kv_state_load_file(loaded, p2, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "magic"));

    unlink(p1);
    unlink(p2);
    free(a);
    free(bb);
    ds4_kv_state_free(loaded);
    ds4_kv_state_free(st);
    ds4_backend_free(fresh);
    ds4_backend_free(d);
    ds4_backend_free(b);
}

/* The header fields at contexts below the prefill chunk and the raw window
 * are the ones the original ds4 writes and requires (docs/MODEL.md 8.3:
 * chunk min(ctx, 2048), raw cap and raw window min(128, ctx)), so that it
 * reads our files; a payload as ds4 writes it loads here, and so does one
 * with the whole window recorded (this engine's older files). */
static void test_dsv4_header_small_contexts(void **state) {
    (void)state;
    ds4_err err = {0};
    const uint32_t ctxs[] = {64, 100, 256, 1024, 2048, 4096};
    for (size_t i = 0; i < sizeof(ctxs) / sizeof(ctxs[0]); i++) {
        uint32_t ctx = ctxs[i], n = ctx < 90 ? ctx - 4 : 90;
        char p[64];
        snprintf(p, sizeof(p), "build/tests/session-h.%d.dsv4", (int)getpid());
        ds4_backend *b = make_ctx(2, 0, false, ctx);
        free(run_prefill(b, n));
        ds4_kv_state *st = ds4_backend_state_new(b, &err);
        assert_int_equal(ds4_backend_snapshot(b, st, &err), 0);
        assert_int_equal(ds4_kv_state_save_file(st, p, &err), 0);
        uint32_t h[13];
        FILE *f = fopen(p, "r+b");
        assert_non_null(f);
        assert_int_equal(fread(h, 4, 13, f), 13);
        uint32_t win = ctx < 128 ? ctx : 128, want[13] = {0x34565344u,
                                                          1,
                                                          ctx,
                                                          ctx < 2048 ? ctx : 2048,
                                                          win,
                                                          win,
                                                          ctx / 4 + 2,
                                                          n,
                                                          W->cfg.n_layer,
                                                          W->cfg.head_dim,
                                                          W->cfg.idx_head_dim,
                                                          V,
                                                          n < win ? n : win};
        for (int k = 0; k < 13; k++)
            if (h[k] != want[k]) fail_msg("ctx %u: header field %d is %u, ds4 writes %u", ctx, k, h[k], want[k]);
        ds4_backend *fresh = make_ctx(2, 0, false, ctx);
        ds4_kv_state *loaded = ds4_backend_state_new(fresh, &err);
        if (ds4_kv_state_load_file(loaded, p, &err) != 0) fail_msg("ctx %u: %s", ctx, ds4_err_msg(&err));
        /* The whole window recorded, as before: still read. */
        h[5] = 128;
        assert_int_equal(fseek(f, 0, SEEK_SET), 0);
        assert_int_equal(fwrite(h, 4, 13, f), 13);
        fflush(f);
        if (ds4_kv_state_load_file(loaded, p, &err) != 0) fail_msg("ctx %u, window 128: %s", ctx, ds4_err_msg(&err));
        /* Any other window is another model's. */
        h[5] = 96;
        assert_int_equal(fseek(f, 0, SEEK_SET), 0);
        assert_int_equal(fwrite(h, 4, 13, f), 13);
        fclose(f);
        assert_int_equal(ds4_kv_state_load_file(loaded, p, &err), -1);
        assert_non_null(strstr(ds4_err_msg(&err), "raw window 96"));
        unlink(p);
        ds4_kv_state_free(loaded);
        ds4_kv_state_free(st);
        ds4_backend_free(fresh);
        ds4_backend_free(b);
    }
}

/* A context shorter than the sliding window (a raw ring of ctx rows) gives
 * the same logits as a long one. */
static void test_short_context(void **state) {
    (void)state;
    ds4_backend *b = make_ctx(2, 16, false, 100);
    float *got = run_prefill(b, 100);
    assert_memory_equal(got, ref, (size_t)100 * V * sizeof(float));
    free(got);
    ds4_backend_free(b);
}

static void test_context_and_token_errors(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend *b = make(1, 0, false);
    uint32_t bad = V;
    assert_int_equal(ds4_backend_decode(b, bad, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "vocabulary"));
    uint32_t *many = calloc(600, sizeof(uint32_t));
    assert_int_equal(ds4_backend_prefill(b, many, 600, NULL, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "context"));
    free(many);
    ds4_backend_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_equals_prefill),      cmocka_unit_test(test_chunks_and_threads),
        cmocka_unit_test(test_split_prefill_then_decode),  cmocka_unit_test(test_simulations_change_the_result),
        cmocka_unit_test(test_snapshot_restore),           cmocka_unit_test(test_dsv4_payload),
        cmocka_unit_test(test_dsv4_header_small_contexts), cmocka_unit_test(test_short_context),
        cmocka_unit_test(test_context_and_token_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
