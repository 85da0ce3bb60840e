/*
 * test_generate.c - the shared generation loop (engine/generate.h) against
 * independent references: greedy tokens are the argmax of the logits a
 * fresh session computes for the same tokens; every way generation ends
 * (EOS, max_tokens, full context, callback stop, cancel, error) reports
 * the right finish and leaves the session holding exactly the prompt plus
 * every token handed out except the last; greedy_next, exclude_eos and
 * append=false do what they say; the same seed gives the same tokens; a
 * sized session's grow hook is asked at its end, and its refusal ends
 * generation there.
 * Model: tests/golden/cpu/tiny-a.f16.gguf (no tokenizer: the EOS id is set
 * by hand where a test needs one).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"

#define MODEL   "tests/golden/cpu/tiny-a.f16.gguf"
#define CTX     96
#define NPROMPT 12
#define MAXGEN  160

static ds4_engine *E;
static uint32_t V;
static int32_t PROMPT[NPROMPT];

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_engine_opts o = {.model_path = MODEL, .backend = "cpu", .n_threads = 2};
    if (!(E = ds4_engine_open(&o, &err))) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    V = E->w->cfg.n_vocab;
    for (uint32_t i = 0; i < NPROMPT; i++) PROMPT[i] = (int32_t)((i * 2654435761u + 17u) % V);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ds4_engine_close(E);
    return 0;
}

/* A session holding the prompt, ready to generate. */
static ds4_session *primed(uint32_t ctx) {
    ds4_err err = {0};
    ds4_session *s = ds4_session_new(E, ctx, &err);
    if (!s) fail_msg("%s", err.msg);
    if (ds4_session_sync(s, PROMPT, NPROMPT, NULL, NULL, &err) != 0) fail_msg("%s", err.msg);
    return s;
}

/* What the callback records and how it steers. */
typedef struct rec {
    int32_t tok[MAXGEN];
    uint32_t n;
    uint32_t stop_after;   /* 0: never */
    uint32_t cancel_after; /* 0: never */
    bool greedy_next, no_append;
    volatile sig_atomic_t *cancel;
} rec;

static void on_token(void *ctx, int32_t token, ds4_gen_control *ctl) {
    rec *r = ctx;
    assert_true(r->n < MAXGEN);
    r->tok[r->n++] = token;
    if (r->stop_after && r->n >= r->stop_after) ctl->stop = true;
    if (r->cancel_after && r->n >= r->cancel_after) *r->cancel = 1;
    ctl->greedy_next = r->greedy_next;
    if (r->no_append) ctl->append = false;
}

static void sampler_init(ds4_sampler *smp, float temp, uint64_t seed) {
    ds4_sampler_params p;
    ds4_sampler_defaults(&p);
    p.temperature = temp;
    p.min_p = 0.0f;
    p.seed = seed;
    ds4_err err = {0};
    if (ds4_sampler_init(smp, &p, (int)V, &err) != 0) fail_msg("%s", err.msg);
}

static ds4_gen_result run(ds4_session *s, ds4_sampler *smp, const ds4_gen_opts *o, rec *r) {
    ds4_gen_result res;
    ds4_err err = {0};
    if (ds4_generate(s, smp, o, on_token, r, &res, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(res.n_generated, r->n);
    assert_true(res.seconds >= 0.0);
    return res;
}

/* Logits after prompt + gen[0..k), from a fresh session (one prefill). */
static float *reference_logits(const int32_t *gen, uint32_t k) {
    int32_t t[CTX];
    memcpy(t, PROMPT, sizeof(PROMPT));
    memcpy(t + NPROMPT, gen, k * sizeof(int32_t));
    ds4_err err = {0};
    ds4_session *s = ds4_session_new(E, CTX, &err);
    if (!s || ds4_session_sync(s, t, NPROMPT + k, NULL, NULL, &err) != 0) fail_msg("%s", err.msg);
    float *out = malloc(V * sizeof(float));
    memcpy(out, ds4_session_logits(s), V * sizeof(float));
    ds4_session_free(s);
    return out;
}

/* Independent argmax: highest value, lowest index on ties. */
static int32_t plain_argmax(const float *x, uint32_t n, int32_t excluded) {
    int32_t best = -1;
    for (uint32_t i = 0; i < n; i++) {
        if ((int32_t)i == excluded) continue;
        if (best < 0 || x[i] > x[best]) best = (int32_t)i;
    }
    return best;
}

/* The session holds the prompt followed by gen[0..k). */
static void assert_holds(ds4_session *s, const int32_t *gen, uint32_t k) {
    assert_int_equal(ds4_session_n_tokens(s), NPROMPT + k);
    assert_memory_equal(ds4_session_tokens(s), PROMPT, sizeof(PROMPT));
    if (k) assert_memory_equal(ds4_session_tokens(s) + NPROMPT, gen, k * sizeof(int32_t));
}

static void test_greedy_is_argmax_chain(void **state) {
    (void)state;
    ds4_session *s = primed(CTX);
    rec r = {0};
    ds4_gen_opts o = {.max_tokens = 8};
    /* A NULL sampler means greedy. */
    ds4_gen_result res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_LENGTH);
    assert_int_equal(r.n, 8);
    for (uint32_t k = 0; k < r.n; k++) {
        float *want = reference_logits(r.tok, k);
        assert_int_equal(r.tok[k], plain_argmax(want, V, -1));
        free(want);
    }
    /* The last token was handed out but not appended; the session's
     * logits are those after the seventh. */
    assert_holds(s, r.tok, 7);
    float *want = reference_logits(r.tok, 7);
    assert_memory_equal(ds4_session_logits(s), want, V * sizeof(float));
    free(want);

    /* A temperature-0 sampler gives the same tokens. */
    ds4_sampler smp;
    sampler_init(&smp, 0.0f, 1);
    ds4_session *s2 = primed(CTX);
    rec r2 = {0};
    run(s2, &smp, &o, &r2);
    assert_memory_equal(r2.tok, r.tok, sizeof(r.tok));
    ds4_sampler_free(&smp);
    ds4_session_free(s2);
    ds4_session_free(s);
}

static void test_eos_and_exclude_eos(void **state) {
    (void)state;
    float *first = reference_logits(NULL, 0);
    int32_t top = plain_argmax(first, V, -1);
    int32_t second = plain_argmax(first, V, top);
    free(first);
    int32_t saved = E->eos;
    E->eos = top;

    ds4_session *s = primed(CTX);
    rec r = {0};
    ds4_gen_opts o = {.max_tokens = 5};
    ds4_gen_result res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_EOS);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.tok[0], top);
    assert_holds(s, NULL, 0);
    ds4_session_free(s);

    /* exclude_eos: the EOS token can never come out, greedy or sampled. */
    s = primed(CTX);
    memset(&r, 0, sizeof(r));
    o.exclude_eos = true;
    res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_LENGTH);
    assert_int_equal(r.n, 5);
    assert_int_equal(r.tok[0], second);
    for (uint32_t k = 0; k < r.n; k++) {
        float *want = reference_logits(r.tok, k);
        assert_int_equal(r.tok[k], plain_argmax(want, V, top));
        free(want);
    }
    ds4_session_free(s);

    ds4_sampler smp;
    sampler_init(&smp, 5.0f, 99);
    s = primed(CTX);
    memset(&r, 0, sizeof(r));
    o.max_tokens = 40;
    run(s, &smp, &o, &r);
    for (uint32_t k = 0; k < r.n; k++) assert_int_not_equal(r.tok[k], top);
    ds4_sampler_free(&smp);
    ds4_session_free(s);
    E->eos = saved;
}

static void test_context_full(void **state) {
    (void)state;
    const uint32_t ctx = NPROMPT + 5;
    ds4_session *s = primed(ctx);
    rec r = {0};
    ds4_gen_opts o = {0}; /* no max: until the context is full */
    ds4_gen_result res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_LENGTH);
    /* The session can hold ctx - 1 tokens: 4 appended, then a fifth handed
     * out that does not fit. */
    assert_int_equal(r.n, 5);
    assert_holds(s, r.tok, 4);
    assert_int_equal(ds4_session_n_tokens(s), ctx - 1);

    /* Already full: one token (computed from the last logits), no append. */
    memset(&r, 0, sizeof(r));
    res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_LENGTH);
    assert_int_equal(r.n, 1);
    assert_int_equal(ds4_session_n_tokens(s), ctx - 1);
    ds4_session_free(s);
}

static void test_callback_stop_and_greedy_next(void **state) {
    (void)state;
    ds4_sampler smp;
    sampler_init(&smp, 100.0f, 7); /* nearly uniform: sampled != argmax */
    ds4_session *s = primed(CTX);
    rec r = {.stop_after = 4, .greedy_next = true};
    ds4_gen_opts o = {.max_tokens = 20};
    ds4_gen_result res = run(s, &smp, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_CALLBACK);
    assert_int_equal(r.n, 4);
    assert_holds(s, r.tok, 3);
    /* Every token after the first was chosen greedily... */
    for (uint32_t k = 1; k < r.n; k++) {
        float *want = reference_logits(r.tok, k);
        assert_int_equal(r.tok[k], plain_argmax(want, V, -1));
        free(want);
    }
    /* ...and the first one was sampled at T=100 (not the argmax). */
    float *want = reference_logits(NULL, 0);
    assert_int_not_equal(r.tok[0], plain_argmax(want, V, -1));
    free(want);
    ds4_sampler_free(&smp);
    ds4_session_free(s);
}

/* A restrict hook that allows only even token ids. */
static void only_even(void *ctx, float *logits, int n) {
    (*(int *)ctx)++;
    for (int i = 1; i < n; i += 2) logits[i] = -INFINITY;
}

static void test_restrict_and_forced(void **state) {
    (void)state;
    /* Greedy under the hook: the argmax of the allowed (even) tokens. */
    ds4_session *s = primed(CTX);
    rec r = {0};
    int calls = 0;
    ds4_gen_opts o = {.max_tokens = 4, .restrict_fn = only_even, .restrict_ctx = &calls};
    run(s, NULL, &o, &r);
    assert_int_equal(calls, 4);
    for (uint32_t k = 0; k < r.n; k++) {
        float *want = reference_logits(r.tok, k);
        for (uint32_t i = 1; i < V; i += 2) want[i] = -INFINITY;
        assert_int_equal(r.tok[k], plain_argmax(want, V, -1));
        assert_int_equal(r.tok[k] % 2, 0);
        free(want);
    }
    ds4_session_free(s);
    /* Forced tokens the hook allows are taken; the first it does not allow
     * ends the forcing: the allowed argmax instead, and no more forcing. */
    int32_t forced[4] = {2, 4, 7, 8};
    s = primed(CTX);
    rec r2 = {0};
    ds4_gen_opts f = {
        .max_tokens = 4, .forced = forced, .n_forced = 4, .restrict_fn = only_even, .restrict_ctx = &calls};
    run(s, NULL, &f, &r2);
    assert_int_equal(r2.tok[0], 2);
    assert_int_equal(r2.tok[1], 4);
    for (uint32_t k = 2; k < 4; k++) {
        float *want = reference_logits(r2.tok, k);
        for (uint32_t i = 1; i < V; i += 2) want[i] = -INFINITY;
        assert_int_equal(r2.tok[k], plain_argmax(want, V, -1));
        free(want);
    }
    ds4_session_free(s);
    /* Without a hook, forced tokens are taken as they are. */
    s = primed(CTX);
    rec r3 = {0};
    ds4_gen_opts g = {.max_tokens = 4, .forced = forced, .n_forced = 4};
    run(s, NULL, &g, &r3);
    assert_memory_equal(r3.tok, forced, sizeof(forced));
    ds4_session_free(s);
}

static void test_no_append(void **state) {
    (void)state;
    /* append=false: the session does not move, so greedy repeats itself. */
    ds4_session *s = primed(CTX);
    rec r = {.no_append = true};
    ds4_gen_opts o = {.max_tokens = 3};
    ds4_gen_result res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_LENGTH);
    assert_holds(s, NULL, 0);
    assert_int_equal(r.tok[0], r.tok[1]);
    assert_int_equal(r.tok[1], r.tok[2]);
    ds4_session_free(s);
}

static void test_cancel(void **state) {
    (void)state;
    volatile sig_atomic_t cancel = 0;
    ds4_session *s = primed(CTX);
    rec r = {.cancel_after = 3, .cancel = &cancel};
    ds4_gen_opts o = {.max_tokens = 20, .cancel = &cancel};
    ds4_gen_result res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_CANCELLED);
    /* Cancel is noticed before the next pick: the tokens handed out so far
     * are all in the session. */
    assert_int_equal(r.n, 3);
    assert_holds(s, r.tok, 3);

    /* Cancelled before the start: nothing happens. */
    memset(&r, 0, sizeof(r));
    res = run(s, NULL, &o, &r);
    assert_int_equal(res.finish, DS4_FINISH_CANCELLED);
    assert_int_equal(r.n, 0);
    assert_int_equal(ds4_session_n_tokens(s), NPROMPT + 3);
    ds4_session_free(s);
}

static void test_same_seed_same_tokens(void **state) {
    (void)state;
    int32_t runs[3][MAXGEN];
    const uint64_t seeds[3] = {42, 42, 43};
    for (int i = 0; i < 3; i++) {
        ds4_sampler smp;
        sampler_init(&smp, 1.5f, seeds[i]);
        ds4_session *s = primed(CTX);
        rec r = {0};
        ds4_gen_opts o = {.max_tokens = 16};
        run(s, &smp, &o, &r);
        assert_int_equal(r.n, 16);
        memcpy(runs[i], r.tok, sizeof(runs[i]));
        ds4_sampler_free(&smp);
        ds4_session_free(s);
    }
    assert_memory_equal(runs[0], runs[1], 16 * sizeof(int32_t));
    assert_memory_not_equal(runs[0], runs[2], 16 * sizeof(int32_t));
}

/* The grow hook of a sized session: grows it (ds4_session_reserve) or
 * refuses, counting the calls. */
typedef struct grower {
    ds4_session *s;
    bool refuse;
    uint32_t calls, need;
} grower;

static int grow(void *ctx, uint32_t need) {
    grower *g = ctx;
    g->calls++;
    g->need = need;
    if (g->refuse) return 1;
    ds4_err err = {0};
    if (ds4_session_reserve(g->s, need, &err) != 0) fail_msg("%s", err.msg);
    return 0;
}

/* A sized session in granules of 32 tokens (first of the model's sliding
 * window, 128 tokens) whose growth goes through the hook: grown once it
 * is full (room for 128 tokens asked at 127), its tokens are those of a
 * session of the whole context; refused, generation ends there (finish
 * length; the session holds capacity - 1 tokens, the last token handed out
 * but not appended, as at a full context), the tokens up to there the
 * same. */
static void test_grow_hook(void **state) {
    (void)state;
    const uint32_t n = 140, big = 512;
    ds4_gen_opts o = {.max_tokens = n};
    rec want = {0};
    ds4_session *s = primed(big);
    run(s, NULL, &o, &want);
    assert_int_equal(want.n, n);
    ds4_session_free(s);
    for (int refuse = 0; refuse < 2; refuse++) {
        ds4_err err = {0};
        s = ds4_session_new_sized(E, big, 32, &err);
        if (!s || ds4_session_sync(s, PROMPT, NPROMPT, NULL, NULL, &err) != 0) fail_msg("%s", err.msg);
        assert_int_equal(ds4_session_capacity(s), 128);
        grower g = {.s = s, .refuse = refuse};
        o.grow_fn = grow;
        o.grow_ctx = &g;
        rec got = {0};
        ds4_gen_result res = run(s, NULL, &o, &got);
        assert_int_equal(res.finish, DS4_FINISH_LENGTH);
        assert_int_equal(g.calls, 1);
        assert_int_equal(g.need, 128 + 1);
        uint32_t handed = refuse ? 128 - NPROMPT : n;
        assert_int_equal(got.n, handed);
        assert_memory_equal(got.tok, want.tok, handed * sizeof(int32_t));
        assert_holds(s, got.tok, handed - 1);
        assert_int_equal(ds4_session_capacity(s), refuse ? 128 : 160);
        ds4_session_free(s);
    }
}

static void test_empty_session_is_an_error(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_session *s = ds4_session_new(E, CTX, &err);
    assert_non_null(s);
    ds4_gen_opts o = {.max_tokens = 4};
    ds4_gen_result res;
    rec r = {0};
    assert_int_equal(ds4_generate(s, NULL, &o, on_token, &r, &res, &err), -1);
    assert_int_equal(res.finish, DS4_FINISH_ERROR);
    assert_int_equal(r.n, 0);
    assert_non_null(strstr(err.msg, "prompt"));
    /* A sampler for another vocabulary is refused, not overrun. */
    ds4_session *p = primed(CTX);
    ds4_sampler smp;
    ds4_sampler_params sp;
    ds4_sampler_defaults(&sp);
    assert_int_equal(ds4_sampler_init(&smp, &sp, (int)V / 2, &err), 0);
    assert_int_equal(ds4_generate(p, &smp, &o, on_token, &r, &res, &err), -1);
    assert_int_equal(res.finish, DS4_FINISH_ERROR);
    assert_non_null(strstr(err.msg, "sampler"));
    ds4_sampler_free(&smp);
    ds4_session_free(p);
    assert_string_equal(ds4_finish_name(DS4_FINISH_EOS), "stop");
    assert_string_equal(ds4_finish_name(DS4_FINISH_LENGTH), "length");
    ds4_session_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_is_argmax_chain),
        cmocka_unit_test(test_eos_and_exclude_eos),
        cmocka_unit_test(test_context_full),
        cmocka_unit_test(test_callback_stop_and_greedy_next),
        cmocka_unit_test(test_restrict_and_forced),
        cmocka_unit_test(test_no_append),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_grow_hook),
        cmocka_unit_test(test_empty_session_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
