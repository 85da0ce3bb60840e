/*
 * test_cpu_batch.c - the batched step and the rewind on the CPU backend
 * (backend.h, "sequences"), simulations on:
 *   - eight sequences of different prompts and lengths advanced together,
 *     prefill chunks beside decode rows, give each sequence bit for bit the
 *     logits and the DSV4 payload it has when run alone;
 *   - a rewindable step of N+1 rows taken back to any of its rows leaves
 *     the state byte-identical to a sequence that never saw the others,
 *     across ratio-4 and ratio-128 window boundaries, and decoding goes on
 *     bit-identically;
 *   - a sequence resized as it goes (grown from a context shorter than the
 *     window, across the ratio-4 and ratio-128 windows' ends, mid-decode
 *     and beside other rows, shrunk to its tokens and grown again; the
 *     main sequence too) has bit for bit the logits and the payload of one
 *     made large from the start;
 *   - bad steps, rewinds and resizes are refused with a message.
 * Model: tests/golden/cpu/tiny-a.f16.gguf (layers of ratio 0, 4 and 128).
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

#include "common/tool_run.h"
#include "model/backends.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define N     400
#define CTX   512
#define NSEQ  8
#define GEN   10

static ds4_weights *W;
static uint32_t tokens[N];
static uint32_t V;

static ds4_backend *make(uint32_t chunk) {
    ds4_err err = {0};
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = CTX, .prefill_chunk = chunk};
    ds4_backend *b = ds4_backend_create("cpu", W, &o, &err);
    if (!b) fail_msg("%s", ds4_err_msg(&err));
    return b;
}

static uint32_t argmax(const float *x) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The DSV4 payload of a sequence, in memory. */
static char *payload(ds4_backend *b, ds4_seq *s, size_t *len) {
    ds4_err err = {0};
    ds4_kv_state *st = ds4_backend_state_new(b, &err);
    if (!st || ds4_seq_snapshot(b, s, st, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (ds4_kv_state_save(st, f, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    fclose(f);
    ds4_kv_state_free(st);
    return buf;
}

static void assert_same_state(ds4_backend *a, ds4_seq *sa, ds4_backend *b, ds4_seq *sb, const char *what) {
    size_t la, lb;
    char *pa = payload(a, sa, &la), *pb = payload(b, sb, &lb);
    if (la != lb || memcmp(pa, pb, la) != 0) fail_msg("%s: the DSV4 payloads differ", what);
    free(pa);
    free(pb);
}

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    if (!(W = ds4_weights_open(MODEL, &err))) {
        fprintf(stderr, "%s\n", ds4_err_msg(&err));
        return -1;
    }
    V = W->cfg.n_vocab;
    uint32_t s = 777;
    for (uint32_t i = 0; i < N; i++) tokens[i] = ((s = s * 1103515245u + 12345u) >> 8) % V;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ds4_weights_close(W);
    return 0;
}

/* Prompt lengths around the window boundaries (4, 128) and the starts. */
static const uint32_t plen[NSEQ] = {1, 5, 64, 127, 128, 129, 200, 255};
static const uint32_t *prompt(int i) { return tokens + 7 * i; }

/* Each sequence alone on its own backend: prefill, then GEN greedy decode
 * steps; the logits after the prompt and after each step, and the payload
 * after GEN / 2 steps. */
static void run_alone(int i, float *logits, char **mid, size_t *mid_len) {
    ds4_err err = {0};
    ds4_backend *b = make(0);
    if (ds4_backend_prefill(b, prompt(i), plen[i], NULL, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    for (uint32_t g = 0; g <= GEN; g++) {
        memcpy(logits + (size_t)g * V, ds4_backend_logits(b), V * sizeof(float));
        if (g == GEN / 2) *mid = payload(b, b->main, mid_len);
        if (g < GEN && ds4_backend_decode(b, argmax(ds4_backend_logits(b)), &err) != 0)
            fail_msg("%s", ds4_err_msg(&err));
    }
    ds4_backend_free(b);
}

static void test_batched_equals_alone(void **state) {
    (void)state;
    ds4_err err = {0};
    float *alone = malloc((size_t)NSEQ * (GEN + 1) * V * sizeof(float));
    char *mid[NSEQ];
    size_t mid_len[NSEQ];
    for (int i = 0; i < NSEQ; i++) run_alone(i, alone + (size_t)i * (GEN + 1) * V, &mid[i], &mid_len[i]);

    ds4_backend *b = make(0);
    ds4_seq *s[NSEQ];
    for (int i = 0; i < NSEQ; i++)
        if (!(s[i] = ds4_seq_new(b, 0, &err))) fail_msg("%s", ds4_err_msg(&err));
    /* Every prompt in one step, then steps of one row per sequence. */
    ds4_row rows[1024];
    uint32_t n = 0;
    for (int i = 0; i < NSEQ; i++)
        for (uint32_t t = 0; t < plen[i]; t++)
            rows[n++] = ds4_row_of(s[i], prompt(i)[t], t + 1 == plen[i] ? DS4_ROW_LOGITS : 0);
    float *lg = malloc((size_t)NSEQ * V * sizeof(float));
    ds4_step_out out = {lg, NULL};
    if (ds4_backend_step(b, rows, n, &out, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    for (uint32_t g = 0; g <= GEN; g++) {
        for (int i = 0; i < NSEQ; i++) {
            const float *want = alone + ((size_t)i * (GEN + 1) + g) * V;
            if (memcmp(lg + (size_t)i * V, want, V * sizeof(float)) != 0)
                fail_msg("sequence %d, step %u: batched logits differ from the sequence alone", i, g);
            assert_memory_equal(ds4_seq_logits(b, s[i]), want, V * sizeof(float));
            rows[i] = ds4_row_of(s[i], argmax(want), DS4_ROW_LOGITS);
        }
        if (g == GEN / 2)
            for (int i = 0; i < NSEQ; i++) {
                size_t len;
                char *p = payload(b, s[i], &len);
                if (len != mid_len[i] || memcmp(p, mid[i], len) != 0)
                    fail_msg("sequence %d: the payload taken mid-batch differs from the one alone", i);
                free(p);
            }
        if (g < GEN && ds4_backend_step(b, rows, NSEQ, &out, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    }
    for (int i = 0; i < NSEQ; i++) {
        assert_int_equal(ds4_seq_len(b, s[i]), plen[i] + GEN);
        ds4_seq_free(b, s[i]);
        free(mid[i]);
    }
    free(lg);
    free(alone);
    ds4_backend_free(b);
}

/* A step that mixes one sequence's decode row, another's prefill chunk and
 * a third's decode row; the rows' hidden states come back too. */
static void test_mixed_step(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend *ref = make(0), *b = make(0);
    float *want = malloc((size_t)N * V * sizeof(float));
    if (ds4_backend_prefill(ref, tokens, 150, want, &err) != 0) fail_msg("%s", ds4_err_msg(&err));

    ds4_seq *a = ds4_seq_new(b, 0, &err), *c = ds4_seq_new(b, 0, &err);
    assert_int_equal(ds4_seq_prefill(b, a, tokens, 99, NULL, &err), 0);
    assert_int_equal(ds4_seq_prefill(b, c, tokens, 140, NULL, &err), 0);
    ds4_row rows[64];
    uint32_t n = 0;
    rows[n++] = ds4_row_of(a, tokens[99], DS4_ROW_LOGITS | DS4_ROW_HIDDEN);
    for (uint32_t t = 0; t < 50; t++) rows[n++] = ds4_row_of(b->main, tokens[t], t == 49 ? DS4_ROW_LOGITS : 0);
    rows[n++] = ds4_row_of(c, tokens[140], DS4_ROW_LOGITS);
    size_t hd = (size_t)W->cfg.n_hc * W->cfg.n_embd;
    float *lg = malloc((size_t)3 * V * sizeof(float)), *hid = malloc(hd * sizeof(float));
    ds4_step_out out = {lg, hid};
    assert_int_equal(ds4_backend_step(b, rows, n, &out, &err), 0);
    assert_memory_equal(lg, want + (size_t)99 * V, V * sizeof(float));
    assert_memory_equal(lg + V, want + (size_t)49 * V, V * sizeof(float));
    assert_memory_equal(lg + 2 * (size_t)V, want + (size_t)140 * V, V * sizeof(float));
    /* The hidden state is the sequence's own: the same token at the same
     * position of another run gives the same residual. */
    ds4_seq *d = ds4_seq_new(b, 0, &err);
    assert_int_equal(ds4_seq_prefill(b, d, tokens, 99, NULL, &err), 0);
    float *hid2 = malloc(hd * sizeof(float));
    ds4_row one = ds4_row_of(d, tokens[99], DS4_ROW_HIDDEN);
    ds4_step_out out2 = {NULL, hid2};
    assert_int_equal(ds4_backend_step(b, &one, 1, &out2, &err), 0);
    assert_memory_equal(hid, hid2, hd * sizeof(float));
    ds4_seq_free(b, a);
    ds4_seq_free(b, c);
    ds4_seq_free(b, d);
    free(hid);
    free(hid2);
    free(lg);
    free(want);
    ds4_backend_free(ref);
    ds4_backend_free(b);
}

/* The reference: one sequence decoding tokens [0, N) one at a time, its
 * logits after each and its payload at every length. */
static float *ref_logits;
static char *ref_payload[N + 1];
static size_t ref_len[N + 1];

static void make_reference(void) {
    ds4_err err = {0};
    ds4_backend *rb = make(0);
    ref_logits = malloc((size_t)N * V * sizeof(float));
    for (uint32_t p = 0; p <= N; p++) {
        ref_payload[p] = payload(rb, rb->main, &ref_len[p]);
        if (p == N) break;
        if (ds4_backend_decode(rb, tokens[p], &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        memcpy(ref_logits + (size_t)p * V, ds4_backend_logits(rb), V * sizeof(float));
    }
    ds4_backend_free(rb);
}

/* A rewindable step of m rows from position n0 (the first k right, the
 * others not), taken back to n0 + k: the payload equals the reference's
 * at n0 + k, the logits are the ones after token n0 + k - 1, and decoding
 * on gives the reference logits. */
static void check_rewind(ds4_backend *b, const ds4_kv_state *at_n0, uint32_t n0, uint32_t m, uint32_t k) {
    ds4_err err = {0};
    ds4_row rows[DS4_REWIND_MAX];
    assert_int_equal(ds4_backend_restore(b, at_n0, &err), 0);
    assert_int_equal(ds4_backend_mark(b, b->main, &err), 0);
    for (uint32_t i = 0; i < m; i++)
        rows[i] = ds4_row_of(b->main, tokens[n0 + i] ^ (i >= k ? 1u : 0u), DS4_ROW_LOGITS | DS4_ROW_REWIND);
    float *lg = malloc((size_t)m * V * sizeof(float));
    ds4_step_out out = {lg, NULL};
    if (ds4_backend_step(b, rows, m, &out, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    for (uint32_t i = 0; i < k; i++)
        if (memcmp(lg + (size_t)i * V, ref_logits + (size_t)(n0 + i) * V, V * sizeof(float)) != 0)
            fail_msg("n0 %u: the step's row %u differs from the reference", n0, i);
    free(lg);
    if (ds4_backend_rewind(b, b->main, n0 + k, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    size_t len;
    char *p = payload(b, b->main, &len);
    if (len != ref_len[n0 + k] || memcmp(p, ref_payload[n0 + k], len) != 0)
        fail_msg("rewind of %u rows after %u to %u: the payload differs from the reference", m, n0, n0 + k);
    free(p);
    if (n0 + k > 0)
        assert_memory_equal(ds4_backend_logits(b), ref_logits + (size_t)(n0 + k - 1) * V, V * sizeof(float));
    for (uint32_t q = n0 + k; q < n0 + k + 4 && q < N; q++) {
        assert_int_equal(ds4_backend_decode(b, tokens[q], &err), 0);
        if (memcmp(ds4_backend_logits(b), ref_logits + (size_t)q * V, V * sizeof(float)) != 0)
            fail_msg("rewind of %u rows after %u to %u: decoding on differs at position %u", m, n0, n0 + k, q);
    }
}

static void test_rewind_is_exact(void **state) {
    (void)state;
    ds4_err err = {0};
    make_reference();
    ds4_backend *b = make(0);
    ds4_kv_state *at = ds4_backend_state_new(b, &err);
    /* steps of N+1 = 2, 3, 5 and 17 rows that start before, at and after
     * the ratio-4 and ratio-128 windows close (positions 127 and 255),
     * taken back to every row (to a few of the 17) */
    const uint32_t m[] = {2, 3, 5, 17};
    const uint32_t n0[] = {0, 121, 126, 127, 128, 251, 254};
    for (size_t j = 0; j < sizeof(n0) / sizeof(n0[0]); j++) {
        ds4_backend_reset(b);
        assert_int_equal(ds4_backend_prefill(b, tokens, n0[j], NULL, &err), 0);
        assert_int_equal(ds4_backend_snapshot(b, at, &err), 0);
        for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++)
            for (uint32_t k = 0; k <= m[i]; k++)
                if (m[i] < 8 || k < 2 || k == m[i] / 2 || k == m[i]) check_rewind(b, at, n0[j], m[i], k);
    }
    ds4_kv_state_free(at);
    for (uint32_t p = 0; p <= N; p++) free(ref_payload[p]);
    free(ref_logits);
    ds4_backend_free(b);
}

/* A context shorter than the sliding window (a raw ring of 20 rows),
 * three rewindable steps after one mark, and two rewinds that cross them. */
static void test_rewind_short_ring(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend_opts o = {.n_threads = 1, .ctx_size = 20, .prefill_chunk = 64};
    ds4_backend *b = ds4_backend_create("cpu", W, &o, &err), *rb = ds4_backend_create("cpu", W, &o, &err);
    assert_non_null(b);
    assert_int_equal(ds4_backend_prefill(b, tokens, 3, NULL, &err), 0);
    assert_int_equal(ds4_backend_mark(b, b->main, &err), 0);
    /* three rewindable steps after the mark: 5, 1 and 10 rows */
    ds4_row rows[16];
    for (uint32_t i = 0; i < 16; i++) rows[i] = ds4_row_of(b->main, tokens[40 + i], DS4_ROW_REWIND);
    assert_int_equal(ds4_backend_step(b, rows, 5, NULL, &err), 0);
    assert_int_equal(ds4_backend_step(b, rows + 5, 1, NULL, &err), 0);
    assert_int_equal(ds4_backend_step(b, rows + 6, 10, NULL, &err), 0);
    assert_int_equal(ds4_backend_rewind(b, b->main, 10, &err), 0);
    uint32_t seq[10] = {tokens[0], tokens[1], tokens[2]};
    for (uint32_t i = 0; i < 7; i++) seq[3 + i] = tokens[40 + i];
    assert_int_equal(ds4_backend_prefill(rb, seq, 10, NULL, &err), 0);
    assert_same_state(b, b->main, rb, rb->main, "rewind in a 20-token context");
    /* a second rewind inside the same step goes further back */
    assert_int_equal(ds4_backend_rewind(b, b->main, 4, &err), 0);
    ds4_backend_reset(rb);
    assert_int_equal(ds4_backend_prefill(rb, seq, 4, NULL, &err), 0);
    assert_same_state(b, b->main, rb, rb->main, "second rewind");
    /* and the mark itself */
    assert_int_equal(ds4_backend_rewind(b, b->main, 3, &err), 0);
    ds4_backend_reset(rb);
    assert_int_equal(ds4_backend_prefill(rb, seq, 3, NULL, &err), 0);
    assert_same_state(b, b->main, rb, rb->main, "rewind to the mark");
    ds4_backend_free(rb);
    ds4_backend_free(b);
}

/* A raw window of 8 rows, shorter than the rows since the mark: slots
 * written twice by one step, and by two steps; every rewind length. */
static void test_rewind_short_window(void **state) {
    (void)state;
    ds4_err err = {0};
    char out[4096], path[128];
    snprintf(path, sizeof(path), "build/tests/cpu-batch-w8.%d.gguf", (int)getpid());
    if (run_capture(out, sizeof(out), "./ds4-mkmodel -q --seed 5 --set window=8 --set layers=4 -o %s", path) != 0)
        fail_msg("ds4-mkmodel: %s", out);
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) fail_msg("%s", ds4_err_msg(&err));
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = 256, .prefill_chunk = 64};
    ds4_backend *b = ds4_backend_create("cpu", w, &o, &err), *rb = ds4_backend_create("cpu", w, &o, &err);
    ds4_kv_state *at = ds4_backend_state_new(b, &err);
    uint32_t nv = w->cfg.n_vocab, tok[64];
    for (uint32_t i = 0; i < 64; i++) tok[i] = (i * 2654435761u + 7u) % nv;
    assert_int_equal(ds4_backend_prefill(b, tok, 11, NULL, &err), 0);
    assert_int_equal(ds4_backend_snapshot(b, at, &err), 0);
    for (uint32_t k = 0; k <= 20; k++) {
        assert_int_equal(ds4_backend_restore(b, at, &err), 0);
        assert_int_equal(ds4_backend_mark(b, b->main, &err), 0);
        ds4_row rows[20];
        for (uint32_t i = 0; i < 20; i++) rows[i] = ds4_row_of(b->main, (tok[11 + i] + (i >= k)) % nv, DS4_ROW_REWIND);
        assert_int_equal(ds4_backend_step(b, rows, 12, NULL, &err), 0); /* 12 rows, then 8 more */
        assert_int_equal(ds4_backend_step(b, rows + 12, 8, NULL, &err), 0);
        assert_int_equal(ds4_backend_rewind(b, b->main, 11 + k, &err), 0);
        ds4_backend_reset(rb);
        assert_int_equal(ds4_backend_prefill(rb, tok, 11 + k, NULL, &err), 0);
        char what[64];
        snprintf(what, sizeof(what), "window 8: rewind to %u", 11 + k);
        assert_same_state(b, b->main, rb, rb->main, what);
    }
    ds4_kv_state_free(at);
    ds4_backend_free(rb);
    ds4_backend_free(b);
    ds4_weights_close(w);
    unlink(path);
}

static void expect_error(int rc, const ds4_err *err, const char *needle) {
    assert_int_equal(rc, -1);
    if (!strstr(ds4_err_msg(err), needle)) fail_msg("message '%s' lacks '%s'", ds4_err_msg(err), needle);
}

/* A sequence whose context follows its length: made for 16 tokens (a
 * raw ring shorter than the window), then grown whenever it is full, its
 * rows beside another sequence's in the same steps; shrunk to its tokens
 * (a step then does not fit) and grown again; every logit row and the
 * payload at the end against a sequence of the whole context that saw the
 * same tokens.  sized: the sequence to resize (a new one, or the main
 * sequence of a backend made with a short main_ctx), of 16 tokens. */
static void check_resized(ds4_backend *b, ds4_seq *sized) {
    ds4_err err = {0};
    ds4_backend *rb = make(0);
    ds4_seq *big = ds4_seq_new(rb, CTX, &err);
    assert_non_null(big);
    /* the contexts it grows to when full, in order: across the ratio-4 and
     * ratio-128 windows' ends (127, 255), the last the whole */
    const uint32_t grow[] = {40, 127, 130, 256, 300, CTX};
    uint32_t g = 0, n = 0, cap = 16;
    float *lg = malloc((size_t)2 * V * sizeof(float));
    while (n < 320) {
        if (n == cap) {
            assert_int_equal(ds4_seq_resize(b, sized, grow[g], &err), 0);
            cap = grow[g++];
        }
        /* a prefill chunk of 5 now and then, else one decode row */
        uint32_t m = n % 37 == 3 ? 5 : 1;
        if (m > cap - n) m = cap - n;
        ds4_row rows[6];
        for (uint32_t i = 0; i < m; i++) rows[i] = ds4_row_of(sized, tokens[n + i], i + 1 == m ? DS4_ROW_LOGITS : 0);
        uint32_t nr = m;
        if (sized != b->main && ds4_seq_len(b, b->main) < 100) rows[nr++] = ds4_row_of(b->main, tokens[n], 0);
        if (ds4_backend_step(b, rows, nr, &(ds4_step_out){lg, NULL}, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        for (uint32_t i = 0; i < m; i++) rows[i].seq = big;
        if (ds4_backend_step(rb, rows, m, &(ds4_step_out){lg + V, NULL}, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        n += m;
        if (memcmp(lg, lg + V, V * sizeof(float)) != 0)
            fail_msg("after %u tokens (context %u): the resized sequence's logits differ", n, cap);
        if (n == 200) {
            assert_int_equal(ds4_seq_resize(b, sized, n, &err), 0);
            rows[0] = ds4_row_of(sized, 1, 0);
            expect_error(ds4_backend_step(b, rows, 1, NULL, &err), &err, "do not fit");
            assert_int_equal(ds4_seq_resize(b, sized, cap, &err), 0);
        }
    }
    assert_int_equal(g, 6);
    assert_same_state(b, sized, rb, big, "a sequence resized as it went");
    assert_memory_equal(ds4_seq_logits(b, sized), ds4_seq_logits(rb, big), V * sizeof(float));
    /* a resize that drops tokens, or beyond the backend's context */
    expect_error(ds4_seq_resize(b, sized, n - 1, &err), &err, "holds 320");
    expect_error(ds4_seq_resize(b, sized, CTX + 1, &err), &err, "at most 512");
    ds4_seq_free(rb, big);
    ds4_backend_free(rb);
    free(lg);
}

static void test_resize_keeps_state(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend *b = make(0);
    ds4_seq *s = ds4_seq_new(b, 16, &err);
    assert_non_null(s);
    check_resized(b, s);
    ds4_seq_free(b, s);
    ds4_backend_free(b);
    /* the main sequence, made short (main_ctx) */
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = CTX, .main_ctx = 16};
    assert_non_null(b = ds4_backend_create("cpu", W, &o, &err));
    check_resized(b, b->main);
    ds4_backend_free(b);
}

static void test_bad_steps_and_rewinds(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend *b = make(64), *other = make(64);
    ds4_seq *s = ds4_seq_new(b, 0, &err);
    assert_int_equal(ds4_backend_prefill(b, tokens, 10, NULL, &err), 0);
    ds4_row rows[70];
    /* a rewind with no mark, a rewindable row without one */
    expect_error(ds4_backend_rewind(b, b->main, 5, &err), &err, "since the sequence's mark");
    rows[0] = ds4_row_of(b->main, 1, DS4_ROW_REWIND);
    expect_error(ds4_backend_step(b, rows, 1, NULL, &err), &err, "without a mark");
    /* forward, before the mark */
    assert_int_equal(ds4_backend_mark(b, b->main, &err), 0);
    rows[1] = ds4_row_of(b->main, 2, DS4_ROW_REWIND);
    assert_int_equal(ds4_backend_step(b, rows, 2, NULL, &err), 0);
    expect_error(ds4_backend_rewind(b, b->main, 13, &err), &err, "has 12");
    expect_error(ds4_backend_rewind(b, b->main, 9, &err), &err, "at 10");
    assert_int_equal(ds4_backend_rewind(b, b->main, 11, &err), 0);
    /* more rows after the mark than the journal holds */
    for (uint32_t i = 0; i < DS4_REWIND_MAX; i++) rows[i] = ds4_row_of(b->main, 1, DS4_ROW_REWIND);
    expect_error(ds4_backend_step(b, rows, DS4_REWIND_MAX, NULL, &err), &err, "exceed");
    /* a plain step drops the mark */
    rows[0] = ds4_row_of(b->main, 1, 0);
    assert_int_equal(ds4_backend_step(b, rows, 1, NULL, &err), 0);
    expect_error(ds4_backend_rewind(b, b->main, 11, &err), &err, "since the sequence's mark");
    /* rows of a sequence apart, of another backend, mixed flags, too many */
    rows[0] = ds4_row_of(b->main, 1, 0);
    rows[1] = ds4_row_of(s, 1, 0);
    rows[2] = ds4_row_of(b->main, 1, 0);
    expect_error(ds4_backend_step(b, rows, 3, NULL, &err), &err, "adjacent");
    rows[0] = ds4_row_of(other->main, 1, 0);
    expect_error(ds4_backend_step(b, rows, 1, NULL, &err), &err, "not this backend's");
    rows[0] = ds4_row_of(s, 1, DS4_ROW_REWIND);
    rows[1] = ds4_row_of(s, 1, 0);
    expect_error(ds4_backend_step(b, rows, 2, NULL, &err), &err, "all rewindable or none");
    for (uint32_t i = 0; i < 65; i++) rows[i] = ds4_row_of(s, 1, 0);
    expect_error(ds4_backend_step(b, rows, 65, NULL, &err), &err, "a pass holds");
    rows[0] = ds4_row_of(s, V, 0);
    expect_error(ds4_backend_step(b, rows, 1, NULL, &err), &err, "vocabulary");
    /* a sequence longer than the backend's context */
    assert_null(ds4_seq_new(b, CTX + 1, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "context"));
    ds4_seq_free(b, s);
    ds4_backend_free(other);
    ds4_backend_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),  cmocka_unit_test(test_mixed_step),
        cmocka_unit_test(test_rewind_is_exact),       cmocka_unit_test(test_rewind_short_ring),
        cmocka_unit_test(test_rewind_short_window),   cmocka_unit_test(test_resize_keeps_state),
        cmocka_unit_test(test_bad_steps_and_rewinds),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
