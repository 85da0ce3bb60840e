/*
 * test_cpu_stages.c - pipeline stages of the CPU backend in one process
 * (the pieces src/model/dist puts on MPI ranks; docs/DISTRIBUTED.md 2):
 * stage backends of layer ranges chained by hand give the whole model's
 * logits bit for bit, in prefill chunks and in decode, for splits before
 * ratio-4 and ratio-128 layers; a stage keeps only its layers' KV state;
 * the layer slices of its state, packed and unpacked into a whole state,
 * make the whole model's snapshot byte for byte; misuse is refused.
 * Model: tests/golden/cpu/tiny-a.f16.gguf (ratios 0,0,4,128,4,128).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backends.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define N     150
#define CHUNK 16
#define CTX   256

static ds4_weights *W;
static uint32_t tokens[N];
static float *ref; /* the whole model's logits after each token */
static uint32_t V, HCD;

static ds4_backend *make(uint32_t first, uint32_t end) {
    ds4_err err = {0};
    ds4_backend_opts o = {
        .n_threads = 2, .ctx_size = CTX, .prefill_chunk = CHUNK, .layer_first = first, .layer_end = end};
    ds4_backend *b = ds4_backend_create("cpu", W, &o, &err);
    if (!b) fail_msg("%s", ds4_err_msg(&err));
    return b;
}

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    if (!(W = ds4_weights_open(MODEL, &err))) {
        fprintf(stderr, "%s\n", ds4_err_msg(&err));
        return -1;
    }
    V = W->cfg.n_vocab;
    HCD = W->cfg.n_hc * W->cfg.n_embd;
    uint64_t s = 99;
    for (uint32_t i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (uint32_t)(s >> 33) % V;
    }
    ds4_backend *b = make(0, 0);
    ref = malloc((size_t)N * V * sizeof(float));
    int rc = ds4_backend_prefill(b, tokens, N, ref, &err);
    ds4_backend_free(b);
    return rc;
}

static int teardown(void **state) {
    (void)state;
    free(ref);
    ds4_weights_close(W);
    return 0;
}

/* Stages with these boundaries (n + 1 entries, 0 .. n_layer) run rows
 * [from, to) of tokens in steps of `step` rows; each step's logits are
 * compared with ref. */
static void run_stages(ds4_backend **st, uint32_t n, uint32_t from, uint32_t to, uint32_t step) {
    ds4_err err = {0};
    float *a = malloc((size_t)CHUNK * HCD * sizeof(float)), *b = malloc((size_t)CHUNK * HCD * sizeof(float));
    float *lg = malloc((size_t)CHUNK * V * sizeof(float));
    for (uint32_t off = from; off < to; off += step) {
        uint32_t T = to - off < step ? to - off : step;
        float *in = NULL, *out = a;
        for (uint32_t k = 0; k < n; k++) {
            ds4_row rows[CHUNK];
            for (uint32_t t = 0; t < T; t++) rows[t] = ds4_row_of(st[k]->main, tokens[off + t], DS4_ROW_LOGITS);
            bool last = k + 1 == n;
            ds4_step_out o = {lg, NULL};
            if (ds4_backend_stage_step(st[k], rows, T, in, last ? NULL : out, last ? &o : NULL, &err) != 0)
                fail_msg("stage %u: %s", k, ds4_err_msg(&err));
            in = out;
            out = out == a ? b : a;
        }
        if (memcmp(lg, ref + (size_t)off * V, (size_t)T * V * sizeof(float)) != 0)
            fail_msg("tokens %u..%u: the stages' logits differ from the whole model's", off, off + T - 1);
    }
    free(a);
    free(b);
    free(lg);
}

static void check_split(const uint32_t *bounds, uint32_t n) {
    ds4_backend *st[8];
    for (uint32_t k = 0; k < n; k++) st[k] = make(bounds[k], bounds[k + 1]);
    run_stages(st, n, 0, 100, CHUNK); /* prefill chunks */
    run_stages(st, n, 100, N, 1);     /* decode */
    for (uint32_t k = 0; k < n; k++) ds4_backend_free(st[k]);
}

static void test_splits(void **state) {
    (void)state;
    const uint32_t two_r4[] = {0, 2, 6}, two_r128[] = {0, 3, 6}, three[] = {0, 1, 4, 6}, six[] = {0, 1, 2, 3, 4, 5, 6};
    check_split(two_r4, 2);
    check_split(two_r128, 2);
    check_split(three, 3);
    check_split(six, 6);
}

/* The stages' slices, gathered into a whole state, are the whole model's
 * snapshot; scattered back they continue bit for bit. */
static void test_slices(void **state) {
    (void)state;
    ds4_err err = {0};
    const uint32_t bounds[] = {0, 2, 3, 6};
    ds4_backend *st[3];
    for (uint32_t k = 0; k < 3; k++) st[k] = make(bounds[k], bounds[k + 1]);
    run_stages(st, 3, 0, 100, CHUNK);

    ds4_backend *whole = make(0, 0);
    if (ds4_backend_prefill(whole, tokens, 100, NULL, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    ds4_kv_state *want = ds4_backend_state_new(whole, &err), *got = ds4_backend_state_new(whole, &err);
    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(ds4_backend_snapshot(whole, want, &err), 0);

    /* a stage's own state holds its layers only */
    ds4_kv_state *part = ds4_kv_state_new_layers(&W->cfg, CTX, CHUNK, 2, 3, &err);
    assert_non_null(part);
    assert_null(part->layers[0].raw);
    assert_non_null(part->layers[2].raw);
    assert_null(part->layers[3].raw);
    FILE *f = tmpfile();
    assert_int_not_equal(ds4_kv_state_save(part, f, &err), 0); /* a payload holds every layer */
    assert_non_null(strstr(ds4_err_msg(&err), "every layer"));
    fclose(f);

    /* gather: stage 0 by copy, the others through their packed slices */
    assert_int_equal(ds4_backend_snapshot(st[0], got, &err), 0);
    for (uint32_t k = 1; k < 3; k++) {
        ds4_err_clear(&err);
        ds4_kv_state *s = ds4_kv_state_new_layers(&W->cfg, CTX, CHUNK, bounds[k], bounds[k + 1], &err);
        assert_int_equal(ds4_backend_snapshot(st[k], s, &err), 0);
        size_t bytes = ds4_kv_state_slice_bytes(s, s->n_tokens, bounds[k], bounds[k + 1]);
        void *buf = malloc(bytes);
        ds4_kv_state_pack_layers(s, bounds[k], bounds[k + 1], buf);
        ds4_kv_state_unpack_layers(got, s->n_tokens, bounds[k], bounds[k + 1], buf);
        if (k == 2) memcpy(got->logits, s->logits, V * sizeof(float)); /* the head's stage has them */
        free(buf);
        ds4_kv_state_free(s);
    }
    char *pw = NULL, *pg = NULL;
    size_t nw = 0, ng = 0;
    FILE *fw = open_memstream(&pw, &nw), *fg = open_memstream(&pg, &ng);
    assert_int_equal(ds4_kv_state_save(want, fw, &err), 0);
    assert_int_equal(ds4_kv_state_save(got, fg, &err), 0);
    fclose(fw);
    fclose(fg);
    assert_int_equal(nw, ng);
    if (memcmp(pw, pg, nw) != 0) fail_msg("the gathered slices' payload differs from the whole model's");

    /* scatter the whole state to fresh stages: they continue bit for bit */
    ds4_backend *fresh[3];
    for (uint32_t k = 0; k < 3; k++) {
        fresh[k] = make(bounds[k], bounds[k + 1]);
        if (ds4_backend_restore(fresh[k], want, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    }
    run_stages(fresh, 3, 100, N, 1);

    free(pw);
    free(pg);
    ds4_kv_state_free(part);
    ds4_kv_state_free(want);
    ds4_kv_state_free(got);
    ds4_backend_free(whole);
    for (uint32_t k = 0; k < 3; k++) {
        ds4_backend_free(st[k]);
        ds4_backend_free(fresh[k]);
    }
}

static void test_refusals(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_backend_opts bad = {.ctx_size = CTX, .layer_first = 4, .layer_end = 9};
    assert_null(ds4_backend_create("cpu", W, &bad, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "not a range"));
    ds4_backend *mid = make(2, 4);
    ds4_row row = ds4_row_of(mid->main, tokens[0], 0);
    ds4_err_clear(&err);
    assert_int_not_equal(ds4_backend_step(mid, &row, 1, NULL, &err), 0); /* needs the residual in */
    assert_non_null(strstr(ds4_err_msg(&err), "needs its rows' residuals"));
    ds4_err_clear(&err);
    assert_int_not_equal(ds4_backend_mark(mid, mid->main, &err), 0);
    assert_non_null(strstr(ds4_err_msg(&err), "rewind"));
    ds4_backend_free(mid);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_slices),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
