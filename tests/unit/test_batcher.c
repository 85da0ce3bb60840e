/*
 * test_batcher.c - continuous batching (engine/batcher.h) on the CPU:
 * eight sessions, each driven by a thread of its own, prefill prompts of
 * different lengths and generate greedily at the same time; every session
 * gets the tokens, logits and DSV4 payload it gets alone, and the steps
 * really were shared (more than one sequence a step, prefill chunks split
 * by the budget).  And a prefill larger than the step budget does not hold
 * a decoding session back: it gets a row into every step the prefill takes
 * (the short requests go first).  Model: tests/golden/cpu/tiny-a.f16.gguf.
 * And the pacer (engine/pace.h) cuts the pieces beside decoding rows from
 * the step times it was told of, with exact values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/batcher.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/pace.h"
#include "engine/session.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define NSESS 8
#define GEN   24
#define CTX   1024

static const uint32_t plen[NSESS] = {3, 40, 127, 128, 200, 257, 300, 64};

typedef struct run {
    ds4_engine *e;
    int i;
    int32_t prompt[400];
    int32_t out[GEN];
    uint32_t n_out;
    char *payload;
    size_t payload_len;
    int rc;
    char err[256];
} run;

static void on_token(void *ctx, int32_t tok, ds4_gen_control *ctl) {
    (void)ctl;
    run *r = ctx;
    r->out[r->n_out++] = tok;
}

static void *session_thread(void *arg) {
    run *r = arg;
    ds4_err err = {0};
    ds4_session *s = ds4_session_new(r->e, CTX, &err);
    ds4_gen_opts o = {.max_tokens = GEN};
    ds4_gen_result res;
    r->rc = -1;
    if (!s || ds4_session_sync(s, r->prompt, plen[r->i], NULL, NULL, &err) != 0 ||
        ds4_generate(s, NULL, &o, on_token, r, &res, &err) != 0)
        goto out;
    ds4_kv_state *st = ds4_session_state_new(s, &err);
    if (!st || ds4_session_snapshot(s, st, &err) != 0) goto out;
    FILE *f = open_memstream(&r->payload, &r->payload_len);
    int rc = ds4_kv_state_save(st, f, &err);
    fclose(f);
    ds4_kv_state_free(st);
    if (rc == 0) r->rc = 0;
out:
    if (r->rc) snprintf(r->err, sizeof(r->err), "%s", ds4_err_msg(&err));
    ds4_session_free(s);
    return NULL;
}

static ds4_engine *open_engine(void) {
    ds4_err err = {0};
    ds4_engine_opts o = {.model_path = MODEL, .backend = "cpu", .n_threads = 2};
    ds4_engine *e = ds4_engine_open(&o, &err);
    if (!e) fail_msg("%s", ds4_err_msg(&err));
    return e;
}

static void fill(run *r, ds4_engine *e, int i) {
    memset(r, 0, sizeof(*r));
    r->e = e;
    r->i = i;
    for (uint32_t t = 0; t < plen[i]; t++)
        r->prompt[t] = (int32_t)((t * 2654435761u + 31u * i + 7u) % e->w->cfg.n_vocab);
}

static void test_sessions_batched_as_alone(void **state) {
    (void)state;
    ds4_err err = {0};
    /* alone: one engine, the sessions one after another */
    ds4_engine *e1 = open_engine();
    run *alone = calloc(NSESS, sizeof(run)), *batched = calloc(NSESS, sizeof(run));
    for (int i = 0; i < NSESS; i++) {
        fill(&alone[i], e1, i);
        session_thread(&alone[i]);
        if (alone[i].rc) fail_msg("session %d alone: %s", i, alone[i].err);
    }
    /* batched: the same, all at once, with a budget that splits prefills */
    ds4_engine *e2 = open_engine();
    ds4_session *first = ds4_session_new(e2, CTX, &err); /* makes the backend */
    assert_non_null(first);
    assert_int_equal(ds4_engine_enable_batching(e2, 96, DS4_PACE_STRETCH, &err), 0);
    pthread_t th[NSESS];
    for (int i = 0; i < NSESS; i++) {
        fill(&batched[i], e2, i);
        assert_int_equal(pthread_create(&th[i], NULL, session_thread, &batched[i]), 0);
    }
    for (int i = 0; i < NSESS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NSESS; i++) {
        if (batched[i].rc) fail_msg("session %d batched: %s", i, batched[i].err);
        assert_int_equal(batched[i].n_out, GEN);
        if (memcmp(batched[i].out, alone[i].out, sizeof(alone[i].out)) != 0)
            fail_msg("session %d: batched tokens differ from the session alone", i);
        if (batched[i].payload_len != alone[i].payload_len ||
            memcmp(batched[i].payload, alone[i].payload, alone[i].payload_len) != 0)
            fail_msg("session %d: batched DSV4 payload differs from the session alone", i);
    }
    ds4_batcher_stats st = ds4_batcher_get_stats(e2->batch);
    fprintf(stderr, "batched: %llu steps, %llu rows, at most %llu rows and %llu sequences a step\n",
            (unsigned long long)st.steps, (unsigned long long)st.rows, (unsigned long long)st.max_rows,
            (unsigned long long)st.max_seqs);
    assert_true(st.max_seqs > 1);   /* steps were shared */
    assert_true(st.max_rows <= 96); /* and within the budget */
    for (int i = 0; i < NSESS; i++) {
        free(alone[i].payload);
        free(batched[i].payload);
    }
    free(alone);
    free(batched);
    ds4_session_free(first);
    ds4_engine_close(e2);
    ds4_engine_close(e1);
}

/* A session decoding one token at a time until told to stop, counting
 * its steps. */
typedef struct decoder {
    ds4_session *s;
    volatile int steps, stop, rc;
} decoder;

static void *decode_thread(void *arg) {
    decoder *d = arg;
    ds4_err err = {0};
    for (int32_t t = 1; !d->stop && d->rc == 0; t++) {
        d->rc = ds4_session_eval(d->s, t % 100 + 1, &err);
        __atomic_add_fetch(&d->steps, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void test_decode_beside_long_prefill(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_engine *e = open_engine();
    ds4_session *a = ds4_session_new(e, CTX, &err), *b = ds4_session_new(e, CTX, &err);
    assert_non_null(a);
    assert_non_null(b);
    const uint32_t budget = 32, n = 320;
    assert_int_equal(ds4_engine_enable_batching(e, budget, DS4_PACE_STRETCH, &err), 0);
    int32_t tok[1] = {5};
    assert_int_equal(ds4_session_sync(a, tok, 1, NULL, NULL, &err), 0);
    decoder d = {.s = a};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, decode_thread, &d), 0);
    while (__atomic_load_n(&d.steps, __ATOMIC_SEQ_CST) < 2)
        ;
    int32_t prompt[320];
    for (uint32_t t = 0; t < n; t++) prompt[t] = (int32_t)(t % 200 + 3);
    int before = __atomic_load_n(&d.steps, __ATOMIC_SEQ_CST);
    ds4_batcher_stats s0 = ds4_batcher_get_stats(e->batch);
    assert_int_equal(ds4_session_sync(b, prompt, n, NULL, NULL, &err), 0);
    int during = __atomic_load_n(&d.steps, __ATOMIC_SEQ_CST) - before;
    ds4_batcher_stats s1 = ds4_batcher_get_stats(e->batch);
    d.stop = 1;
    pthread_join(th, NULL);
    assert_int_equal(d.rc, 0);
    /* the prefill took at least n / budget steps; the decoder is in every
     * step it comes back to in time (the stepper waits a little for it; a
     * loaded machine may run it late for some): more than one of them
     * (first come first served gave it one, the first) */
    fprintf(stderr, "prefill of %u rows in %llu steps of %u; the decoder ran %d steps meanwhile\n", n,
            (unsigned long long)(s1.steps - s0.steps), budget, during);
    assert_true(s1.steps - s0.steps >= n / budget);
    assert_true(during >= 3);
    assert_true(s1.max_rows <= budget);
    ds4_session_free(a);
    ds4_session_free(b);
    ds4_engine_close(e);
}

/* The piece: all the room without decoders; DS4_PACE_FIRST before a step
 * with one was timed; then scaled by the time it may add over the time it
 * added (at most x2 or /2 a step, never below DS4_PACE_MIN, never past the
 * room); it settles where a piece adds what it may. */
static void test_pace_piece(void **state) {
    (void)state;
    ds4_pacer p = {.stretch = DS4_PACE_STRETCH};
    assert_int_equal(ds4_pace_piece(&p, 0, 2000), 2000);
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), DS4_PACE_FIRST);
    assert_int_equal(ds4_pace_piece(&p, 16, 40), 40);
    ds4_pace_note(&p, 16, 64, 0.050); /* no decoders' step known: nothing learnt */
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), DS4_PACE_FIRST);
    ds4_pace_note(&p, 16, 0, 0.020); /* decoders alone: 20 ms, so a piece may add 15 */
    assert_true(p.short_s == 0.020);
    ds4_pace_note(&p, 16, 64, 0.050); /* 64 rows added 30 ms: 32 next */
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), 32);
    ds4_pace_note(&p, 16, 32, 0.030); /* added 10 ms: 48 */
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), 48);
    ds4_pace_note(&p, 16, 48, 0.021); /* added 1 ms: at most twice */
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), 96);
    ds4_pace_note(&p, 16, 96, 0.500); /* added 480 ms: at most half */
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), 48);
    ds4_pace_note(&p, 16, 20, 0.400); /* never below the least */
    assert_int_equal(ds4_pace_piece(&p, 16, 2000), DS4_PACE_MIN);
    assert_int_equal(ds4_pace_piece(&p, 0, 2000), 2000);
    /* the decoders' mean moves a quarter of the way: 20 -> 22 ms */
    ds4_pace_note(&p, 16, 0, 0.028);
    assert_true(p.short_s > 0.02199 && p.short_s < 0.02201);
    /* prefill steps alone, untimed or negative ones change nothing */
    ds4_pacer q = p;
    ds4_pace_note(&q, 0, 100, 0.100);
    ds4_pace_note(&q, 16, 50, 0);
    ds4_pace_note(&q, 16, 0, -1);
    assert_true(q.piece == p.piece && q.short_s == p.short_s);
    /* a piece whose time is a fixed cost plus a cost a row settles where
     * the step takes the stretch: 5 ms + 0.1 ms a row beside 20 ms
     * decoders -> 100 rows */
    ds4_pacer r = {.stretch = DS4_PACE_STRETCH, .short_s = 0.020};
    for (int i = 0; i < 60; i++) {
        uint32_t rows = ds4_pace_piece(&r, 16, 4096);
        ds4_pace_note(&r, 16, rows, 0.020 + 0.005 + 0.0001 * rows);
    }
    uint32_t settled = ds4_pace_piece(&r, 16, 4096);
    /* a larger stretch allows more: 3x a 20 ms step -> 40 ms added ->
     * 350 rows; off: all the room */
    ds4_pacer w = {.stretch = 3, .short_s = 0.020};
    for (int i = 0; i < 60; i++) {
        uint32_t rows = ds4_pace_piece(&w, 16, 4096);
        ds4_pace_note(&w, 16, rows, 0.020 + 0.005 + 0.0001 * rows);
    }
    uint32_t wide = ds4_pace_piece(&w, 16, 4096);
    assert_true(wide >= 348 && wide <= 351);
    ds4_pacer off = {.stretch = 0, .short_s = 0.020, .piece = 20};
    assert_int_equal(ds4_pace_piece(&off, 16, 4096), 4096);
    ds4_err err = {0};
    assert_int_equal(ds4_pace_check(0, &err), 0);
    assert_int_equal(ds4_pace_check(1.5, &err), 0);
    assert_int_not_equal(ds4_pace_check(1, &err), 0);
    assert_non_null(strstr(err.msg, "0 (no pacing) or above 1"));
    assert_int_not_equal(ds4_pace_check(0.5, &err), 0);
    fprintf(stderr, "pacer settled at %u rows (fixed 5 ms + 0.1 ms a row, 15 ms allowed)\n", settled);
    assert_true(settled >= 98 && settled <= 101);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pace_piece),
        cmocka_unit_test(test_sessions_batched_as_alone),
        cmocka_unit_test(test_decode_beside_long_prefill),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
