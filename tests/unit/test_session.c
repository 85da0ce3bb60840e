/*
 * test_session.c - the engine session reuses what it can and nothing it
 * should not: prefix reuse by counters, divergence falls back to the
 * checkpoint or a full prefill, and whatever path is taken the logits are
 * bit-identical to a fresh prefill of the same tokens.  Also: context
 * overflow and cancelled prefill leave a consistent session; a sized
 * session grows its state in granules as tokens arrive, shrinks and frees
 * it on request, with the logits of a session of the whole context.
 * Model: tests/golden/cpu/tiny-a.f16.gguf (no tokenizer needed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/session.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define CTX   256

static ds4_engine *E;
static uint32_t V;

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_engine_opts o = {.model_path = MODEL, .backend = "cpu", .n_threads = 2};
    if (!(E = ds4_engine_open(&o, &err))) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    V = E->w->cfg.n_vocab;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ds4_engine_close(E);
    return 0;
}

static void make_tokens(int32_t *t, uint32_t n, uint32_t seed) {
    for (uint32_t i = 0; i < n; i++) t[i] = (int32_t)((i * 2654435761u + seed * 40503u) % V);
}

static ds4_session *new_session(void) {
    ds4_err err = {0};
    ds4_session *s = ds4_session_new(E, CTX, &err);
    if (!s) fail_msg("%s", err.msg);
    return s;
}

/* Logits of a fresh session fed `t` in one sync. */
static float *fresh_logits(const int32_t *t, uint32_t n) {
    ds4_err err = {0};
    ds4_session *s = new_session();
    if (ds4_session_sync(s, t, n, NULL, NULL, &err) != 0) fail_msg("%s", err.msg);
    float *out = malloc(V * sizeof(float));
    memcpy(out, ds4_session_logits(s), V * sizeof(float));
    ds4_session_free(s);
    return out;
}

static void sync_ok(ds4_session *s, const int32_t *t, uint32_t n) {
    ds4_err err = {0};
    if (ds4_session_sync(s, t, n, NULL, NULL, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(ds4_session_n_tokens(s), n);
    assert_memory_equal(ds4_session_tokens(s), t, n * sizeof(int32_t));
}

static void assert_logits(ds4_session *s, const int32_t *t, uint32_t n) {
    float *want = fresh_logits(t, n);
    assert_memory_equal(ds4_session_logits(s), want, V * sizeof(float));
    free(want);
}

static void test_prefix_reuse_counts(void **state) {
    (void)state;
    int32_t t[200];
    make_tokens(t, 200, 1);
    ds4_session *s = new_session();
    sync_ok(s, t, 80);
    const ds4_session_stats *st = ds4_session_get_stats(s);
    assert_int_equal(st->reused, 0);
    assert_int_equal(st->prefilled, 80);
    /* A second turn: only the suffix is prefilled. */
    sync_ok(s, t, 150);
    assert_int_equal(st->reused, 80);
    assert_int_equal(st->prefilled, 70);
    assert_logits(s, t, 150);
    /* The same tokens again: nothing to do. */
    sync_ok(s, t, 150);
    assert_int_equal(st->reused, 150);
    assert_int_equal(st->prefilled, 0);
    /* Decode then sync to the decoded list: no work. */
    ds4_err err = {0};
    assert_int_equal(ds4_session_eval(s, t[150], &err), 0);
    sync_ok(s, t, 151);
    assert_int_equal(st->prefilled, 0);
    assert_logits(s, t, 151);
    ds4_session_free(s);
}

static void test_divergence_restarts_or_uses_checkpoint(void **state) {
    (void)state;
    int32_t a[160], b[160];
    make_tokens(a, 160, 2);
    memcpy(b, a, sizeof(a));
    for (int i = 100; i < 160; i++) b[i] = (a[i] + 7) % (int32_t)V;
    ds4_session *s = new_session();
    const ds4_session_stats *st = ds4_session_get_stats(s);

    /* Without a checkpoint a diverging target is a full prefill. */
    sync_ok(s, a, 140);
    sync_ok(s, b, 150);
    assert_int_equal(st->reused, 0);
    assert_int_equal(st->prefilled, 150);
    assert_logits(s, b, 150);

    /* With a checkpoint at 90 tokens, the next divergence restores it. */
    sync_ok(s, a, 90);
    ds4_err err = {0};
    assert_int_equal(ds4_session_checkpoint(s, &err), 0);
    assert_int_equal(ds4_session_checkpoint_tokens(s), 90);
    sync_ok(s, a, 140);
    sync_ok(s, b, 150);
    assert_int_equal(st->restored, 90);
    assert_int_equal(st->prefilled, 60);
    assert_logits(s, b, 150);

    /* A target that is a strict prefix of the live tokens also restarts
     * (from the checkpoint, which is a prefix of it). */
    sync_ok(s, b, 120);
    assert_int_equal(st->restored, 90);
    assert_int_equal(st->prefilled, 30);
    assert_logits(s, b, 120);
    ds4_session_free(s);
}

static int cancel_after_first(void *ctx, uint32_t done, uint32_t total) {
    (void)done;
    (void)total;
    int *calls = ctx;
    return ++*calls >= 1;
}

static void test_overflow_and_cancel(void **state) {
    (void)state;
    int32_t t[CTX];
    make_tokens(t, CTX, 3);
    ds4_session *s = new_session();
    ds4_err err = {0};
    assert_int_equal(ds4_session_sync(s, t, CTX, NULL, NULL, &err), -1);
    assert_int_equal(err.code, DS4_ERANGE);
    assert_non_null(strstr(err.msg, "context"));

    /* Fill to ctx - 1, then one more decode does not fit. */
    sync_ok(s, t, CTX - 1);
    assert_int_equal(ds4_session_eval(s, 5, &err), -1);
    assert_int_equal(err.code, DS4_ERANGE);
    assert_int_equal(ds4_session_n_tokens(s), CTX - 1);
    ds4_session_free(s);

    /* Cancel: the backend's chunk is 2048 > CTX, so use append with a
     * session whose sync is cut by the callback after the only chunk; it
     * completes (the last chunk is never interrupted) and stays usable. */
    s = new_session();
    int calls = 0;
    assert_int_equal(ds4_session_sync(s, t, 40, cancel_after_first, &calls, &err), 0);
    assert_int_equal(calls, 1);
    assert_logits(s, t, 40);
    ds4_session_free(s);
}

static void test_snapshot_file_round_trip(void **state) {
    (void)state;
    int32_t t[120];
    make_tokens(t, 120, 4);
    ds4_session *s = new_session();
    sync_ok(s, t, 70);
    ds4_err err = {0};
    char path[] = "/tmp/ds4-test-session-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ds4_session_save_file(s, path, &err), 0);
    ds4_session *r = new_session();
    assert_int_equal(ds4_session_load_file(r, path, &err), 0);
    unlink(path);
    assert_int_equal(ds4_session_n_tokens(r), 70);
    assert_memory_equal(ds4_session_logits(r), ds4_session_logits(s), V * sizeof(float));
    /* Continue both: same logits, and the restored one reuses its tokens. */
    sync_ok(s, t, 120);
    sync_ok(r, t, 120);
    assert_int_equal(ds4_session_get_stats(r)->reused, 70);
    assert_memory_equal(ds4_session_logits(r), ds4_session_logits(s), V * sizeof(float));
    ds4_session_free(s);
    ds4_session_free(r);
}

/* Batched prefill with every position's logits equals a sync to each
 * prefix (the perplexity path), and leaves the session as append would. */
static void test_append_logits(void **state) {
    (void)state;
    int32_t t[60];
    make_tokens(t, 60, 5);
    ds4_session *s = new_session();
    sync_ok(s, t, 20);
    float *all = malloc((size_t)40 * V * sizeof(float));
    ds4_err err = {0};
    assert_int_equal(ds4_session_append_logits(s, t + 20, 40, all, NULL, NULL, &err), 0);
    assert_int_equal(ds4_session_n_tokens(s), 60);
    assert_int_equal(ds4_session_get_stats(s)->total_prefilled, 60);
    for (uint32_t k = 0; k < 40; k += 13) {
        float *want = fresh_logits(t, 21 + k);
        assert_memory_equal(all + (size_t)k * V, want, V * sizeof(float));
        free(want);
    }
    assert_memory_equal(all + (size_t)39 * V, ds4_session_logits(s), V * sizeof(float));
    free(all);
    ds4_session_free(s);
}

/* A session sized by what it holds (granules of 32 tokens, at least the
 * model's window of 128): no state at first, grown by syncs, decodes and a
 * checkpoint's restore, fitted down and released; the logits are a full
 * session's all along. */
static void test_sized_session(void **state) {
    (void)state;
    ds4_err err = {0};
    int32_t a[CTX], b[CTX];
    make_tokens(a, CTX, 6);
    memcpy(b, a, sizeof(a));
    for (int i = 100; i < CTX; i++) b[i] = (a[i] + 5) % (int32_t)V;
    ds4_session *s = ds4_session_new_sized(E, CTX, 32, &err);
    assert_non_null(s);
    assert_int_equal(ds4_session_capacity(s), 0);
    assert_null(ds4_session_logits(s));
    sync_ok(s, a, 20);
    assert_int_equal(ds4_session_capacity(s), 128);
    assert_logits(s, a, 20);
    assert_int_equal(ds4_session_checkpoint(s, &err), 0);
    for (uint32_t i = 20; i < 140; i++) assert_int_equal(ds4_session_eval(s, a[i], &err), 0);
    assert_int_equal(ds4_session_capacity(s), 160); /* grew at 127 tokens (room for the next one) */
    assert_logits(s, a, 140);
    sync_ok(s, a, 170);
    assert_int_equal(ds4_session_capacity(s), 192);
    assert_int_equal(ds4_session_get_stats(s)->reused, 140);
    sync_ok(s, b, 150); /* diverges at 100: back to the checkpoint of 20 */
    assert_int_equal(ds4_session_get_stats(s)->restored, 20);
    assert_logits(s, b, 150);
    /* fitted: to its tokens (plus one) at least, then down when empty */
    assert_int_equal(ds4_session_fit(s, 1, &err), 0);
    assert_int_equal(ds4_session_capacity(s), 160);
    assert_int_equal(ds4_session_fit(s, 200, &err), 0);
    assert_int_equal(ds4_session_capacity(s), 224);
    assert_int_equal(ds4_session_eval(s, b[150], &err), 0);
    assert_logits(s, b, 151);
    ds4_session_reset(s);
    assert_int_equal(ds4_session_fit(s, 1, &err), 0);
    assert_int_equal(ds4_session_capacity(s), 128);
    /* at most the context, and not beyond it */
    sync_ok(s, a, CTX - 1);
    assert_int_equal(ds4_session_capacity(s), CTX);
    assert_logits(s, a, CTX - 1);
    assert_int_equal(ds4_session_reserve(s, CTX + 1, &err), -1);
    assert_int_equal(err.code, DS4_ERANGE);
    /* released: no state, no checkpoint; it starts again on demand */
    ds4_session_release(s);
    assert_int_equal(ds4_session_capacity(s), 0);
    assert_int_equal(ds4_session_n_tokens(s), 0);
    assert_int_equal(ds4_session_checkpoint_tokens(s), 0);
    sync_ok(s, b, 120);
    assert_int_equal(ds4_session_capacity(s), 128);
    assert_logits(s, b, 120);
    ds4_session_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_reuse_counts), cmocka_unit_test(test_divergence_restarts_or_uses_checkpoint),
        cmocka_unit_test(test_overflow_and_cancel), cmocka_unit_test(test_snapshot_file_round_trip),
        cmocka_unit_test(test_append_logits),       cmocka_unit_test(test_sized_session),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
