/*
 * test_steering.c - directional steering (model/steering.h) on the CPU
 * backend:
 *   - the projection y - s v (v.y) against values worked out by hand and
 *     against a long-double computation on random rows; s = 1 leaves rows
 *     orthogonal to v;
 *   - direction files: written and read back; wrong size (the message names
 *     both shapes), NaN, infinities and non-unit rows refused;
 *   - on a tiny model: scales of 0 give logits bit-identical to a backend
 *     without directions; with s = 1 every activation at the steering points
 *     (seen through the activation observer) is orthogonal to its layer's
 *     direction; a steered and an unsteered sequence in one step each get
 *     what they get alone; steering changes the logits;
 *   - sessions: a change of scales drops the state computed with the old
 *     ones; scales without directions are refused.
 * Model: tests/golden/cpu/tiny-a.f16.gguf.
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

#include "engine/session.h"
#include "model/backends.h"
#include "model/steering.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define CTX   256
#define NP    40

static ds4_weights *W;
static uint32_t L, D, V;
static float *dirs; /* random unit rows, L x D; layer 1 zero */
static uint32_t prompt[NP];

static uint32_t rng_next(uint32_t *s) { return (*s = *s * 1103515245u + 12345u) >> 8; }
static float rng_gauss(uint32_t *s) {
    double u = (rng_next(s) + 1.0) / 16777218.0, w = (rng_next(s) + 1.0) / 16777218.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w));
}

/* n_layer x n floats: unit rows (in double, then rounded), zero_layer all 0. */
static void random_dirs(float *out, uint32_t nl, uint32_t n, uint32_t seed, int zero_layer) {
    uint32_t s = seed;
    for (uint32_t il = 0; il < nl; il++) {
        float *v = out + (size_t)il * n;
        double norm = 0;
        for (uint32_t d = 0; d < n; d++) {
            v[d] = rng_gauss(&s);
            norm += (double)v[d] * v[d];
        }
        for (uint32_t d = 0; d < n; d++) v[d] = (int)il == zero_layer ? 0.0f : (float)(v[d] / sqrt(norm));
    }
}

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    if (!(W = ds4_weights_open(MODEL, &err))) {
        fprintf(stderr, "%s\n", ds4_err_msg(&err));
        return -1;
    }
    L = W->cfg.n_layer;
    D = W->cfg.n_embd;
    V = W->cfg.n_vocab;
    dirs = malloc((size_t)L * D * sizeof(float));
    random_dirs(dirs, L, D, 4242, 1);
    uint32_t s = 99;
    for (uint32_t i = 0; i < NP; i++) prompt[i] = rng_next(&s) % V;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(dirs);
    ds4_weights_close(W);
    return 0;
}

/* ------------------------------------------------------------ the math */

static void test_projection_by_hand(void **state) {
    (void)state;
    /* v = (0.6, 0.8, 0, 0), y = (1, 2, 3, -1): v.y = 2.2 */
    const float v[4] = {0.6f, 0.8f, 0.0f, 0.0f};
    float y[4] = {1, 2, 3, -1};
    ds4_steer_rows(v, 1.0f, y, 4, 1, 4);
    const float want1[4] = {-0.32f, 0.24f, 3.0f, -1.0f};
    for (int i = 0; i < 4; i++) assert_true(fabsf(y[i] - want1[i]) < 1e-6f);
    /* s = -1 from the original row: y + v (v.y) */
    float z[4] = {1, 2, 3, -1};
    ds4_steer_rows(v, -1.0f, z, 4, 1, 4);
    const float want2[4] = {2.32f, 3.76f, 3.0f, -1.0f};
    for (int i = 0; i < 4; i++) assert_true(fabsf(z[i] - want2[i]) < 1e-6f);
    /* s = 0 leaves the row alone */
    float u[4] = {1, 2, 3, -1};
    ds4_steer_rows(v, 0.0f, u, 4, 1, 4);
    assert_memory_equal(u, ((float[4]){1, 2, 3, -1}), sizeof(u));
}

static void test_projection_random_rows(void **state) {
    (void)state;
    enum { N = 4096, T = 5 };
    static float v[N], y[T * N], y0[T * N];
    random_dirs(v, 1, N, 7, -1);
    uint32_t s = 11;
    for (int i = 0; i < T * N; i++) y0[i] = y[i] = 3.0f * rng_gauss(&s);
    const float scales[T] = {1.0f, 2.0f, -1.5f, 0.5f, 100.0f};
    for (int t = 0; t < T; t++) ds4_steer_rows(v, scales[t], y + (size_t)t * N, N, 1, N);
    for (int t = 0; t < T; t++) {
        long double dot = 0, ynorm = 0;
        for (int d = 0; d < N; d++) dot += (long double)v[d] * y0[(size_t)t * N + d];
        for (int d = 0; d < N; d++) {
            long double want = y0[(size_t)t * N + d] - (long double)scales[t] * v[d] * dot;
            long double got = y[(size_t)t * N + d];
            ynorm += want * want;
            if (fabsl(got - want) > 1e-5L * (1 + fabsl(scales[t] * dot)))
                fail_msg("row %d value %d: %Lg, expected %Lg", t, d, got, want);
        }
        if (scales[t] == 1.0f) {
            long double after = 0;
            for (int d = 0; d < N; d++) after += (long double)v[d] * y[(size_t)t * N + d];
            if (fabsl(after) > 1e-6L * sqrtl(ynorm)) fail_msg("s = 1 left v.y = %Lg (|y| = %Lg)", after, sqrtl(ynorm));
        }
    }
}

/* ------------------------------------------------------------ the files */

static void test_files(void **state) {
    (void)state;
    char path[] = "/tmp/ds4-steer-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    ds4_err err = {0};
    assert_int_equal(ds4_steering_write(path, dirs, L, D, &err), 0);
    ds4_steering *s = ds4_steering_load(path, &W->cfg, &err);
    if (!s) fail_msg("%s", ds4_err_msg(&err));
    assert_memory_equal(s->dir, dirs, (size_t)L * D * sizeof(float));
    ds4_steering_free(s);

    /* one layer short: both shapes named */
    assert_int_equal(ds4_steering_write(path, dirs, L - 1, D, &err), 0);
    assert_null(ds4_steering_load(path, &W->cfg, &err));
    char want[128];
    snprintf(want, sizeof(want), "%u x %u f32, but the model has %u layers x %u", L - 1, D, L, D);
    if (!strstr(ds4_err_msg(&err), want)) fail_msg("message: %s", ds4_err_msg(&err));
    /* a size that is no whole number of rows */
    FILE *f = fopen(path, "wb");
    fwrite(dirs, 1, 10, f);
    fclose(f);
    assert_null(ds4_steering_load(path, &W->cfg, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "10 bytes"));

    float *bad = malloc((size_t)L * D * sizeof(float));
    memcpy(bad, dirs, (size_t)L * D * sizeof(float));
    bad[(size_t)2 * D + 5] = NAN;
    assert_int_equal(ds4_steering_write(path, bad, L, D, &err), 0);
    assert_null(ds4_steering_load(path, &W->cfg, &err));
    if (!strstr(ds4_err_msg(&err), "layer 2, value 5 is NaN") || !strstr(ds4_err_msg(&err), path))
        fail_msg("message: %s", ds4_err_msg(&err));
    bad[(size_t)2 * D + 5] = INFINITY;
    assert_null(ds4_steering_from(bad, L, D, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "infinite"));
    memcpy(bad, dirs, (size_t)L * D * sizeof(float));
    for (uint32_t d = 0; d < D; d++) bad[d] *= 2.0f;
    assert_null(ds4_steering_from(bad, L, D, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "layer 0's direction has norm 2"));
    free(bad);

    assert_null(ds4_steering_load("/nonexistent/dir.f32", &W->cfg, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "/nonexistent/dir.f32"));
    unlink(path);
}

/* ------------------------------------------------------------ the model */

static ds4_backend *make(const ds4_steering *st, void (*obs)(void *, uint32_t, bool, uint32_t, const float *),
                         void *obs_ctx) {
    ds4_err err = {0};
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = CTX, .steer = st, .act_observer = obs, .act_ctx = obs_ctx};
    ds4_backend *b = ds4_backend_create("cpu", W, &o, &err);
    if (!b) fail_msg("%s", ds4_err_msg(&err));
    return b;
}

/* Prefill the prompt, then 5 decode steps of token 1..5: every logits row. */
static void run(ds4_backend *b, ds4_seq *s, float *logits) {
    ds4_err err = {0};
    if (ds4_seq_prefill(b, s, prompt, NP, NULL, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    memcpy(logits, ds4_seq_logits(b, s), V * sizeof(float));
    for (uint32_t i = 1; i <= 5; i++) {
        if (ds4_seq_decode(b, s, i, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        memcpy(logits + (size_t)i * V, ds4_seq_logits(b, s), V * sizeof(float));
    }
}

static void test_zero_scale_is_bit_identical(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_steering *st = ds4_steering_from(dirs, L, D, &err);
    assert_non_null(st);
    size_t n = (size_t)6 * V;
    float *plain = malloc(n * sizeof(float)), *zero = malloc(n * sizeof(float)), *on = malloc(n * sizeof(float));
    ds4_backend *a = make(NULL, NULL, NULL), *b = make(st, NULL, NULL);
    run(a, a->main, plain);
    run(b, b->main, zero); /* scales 0: a new sequence's */
    assert_memory_equal(plain, zero, n * sizeof(float));
    ds4_seq_reset(b, b->main);
    ds4_seq_set_steering(b->main, 1.0f, 0.0f);
    run(b, b->main, on);
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff = fmax(diff, fabs(on[i] - plain[i]));
    if (!(diff > 1e-4)) fail_msg("steering at scale 1 changed the logits by only %g", diff);
    ds4_backend_free(a);
    ds4_backend_free(b);
    ds4_steering_free(st);
    free(plain);
    free(zero);
    free(on);
}

/* What the observer saw: the largest |v.y| / |y| over rows of steered
 * layers, and how many rows of each kind. */
typedef struct seen {
    double worst;
    uint32_t rows[2];
    uint32_t zero_layer_rows;
} seen;

static void observe(void *ctx, uint32_t il, bool ffn, uint32_t T, const float *y) {
    seen *s = ctx;
    const float *v = dirs + (size_t)il * D;
    for (uint32_t t = 0; t < T; t++) {
        const float *row = y + (size_t)t * D;
        double norm = sqrt(ds4_steer_dot(row, row, D));
        if (il == 1) {
            s->zero_layer_rows++;
            continue;
        }
        double r = fabs(ds4_steer_dot(v, row, D)) / (norm > 0 ? norm : 1);
        if (r > s->worst) s->worst = r;
        s->rows[ffn]++;
    }
}

static void test_removal_is_orthogonal(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_steering *st = ds4_steering_from(dirs, L, D, &err);
    seen s = {0};
    ds4_backend *b = make(st, observe, &s);
    ds4_seq_set_steering(b->main, 1.0f, 1.0f);
    float *lg = malloc((size_t)6 * V * sizeof(float));
    run(b, b->main, lg);
    /* NP prompt rows and 5 decode rows, at every layer but the zero one */
    assert_int_equal(s.rows[0], (NP + 5) * (L - 1));
    assert_int_equal(s.rows[1], (NP + 5) * (L - 1));
    assert_int_equal(s.zero_layer_rows, 2 * (NP + 5));
    if (s.worst > 1e-6) fail_msg("after removal |v.y| / |y| is up to %g", s.worst);

    /* without steering the same activations do have a component along v */
    seen u = {0};
    ds4_backend *p = make(st, observe, &u);
    run(p, p->main, lg);
    if (!(u.worst > 1e-3))
        fail_msg("unsteered activations are already orthogonal (%g): the test proves nothing", u.worst);
    ds4_backend_free(p);
    ds4_backend_free(b);
    ds4_steering_free(st);
    free(lg);
}

static void test_batched_rows_keep_their_scales(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_steering *st = ds4_steering_from(dirs, L, D, &err);
    float *alone[2];
    const float sc[2][2] = {{0.0f, 0.0f}, {1.5f, -0.5f}};
    for (int i = 0; i < 2; i++) {
        ds4_backend *b = make(st, NULL, NULL);
        ds4_seq_set_steering(b->main, sc[i][0], sc[i][1]);
        alone[i] = malloc(V * sizeof(float));
        if (ds4_seq_prefill(b, b->main, prompt, NP, NULL, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        memcpy(alone[i], ds4_seq_logits(b, b->main), V * sizeof(float));
        ds4_backend_free(b);
    }
    ds4_backend *b = make(st, NULL, NULL);
    ds4_seq *s[2] = {b->main, ds4_seq_new(b, 0, &err)};
    assert_non_null(s[1]);
    ds4_row rows[2 * NP];
    for (int i = 0; i < 2; i++) {
        ds4_seq_set_steering(s[i], sc[i][0], sc[i][1]);
        for (uint32_t t = 0; t < NP; t++)
            rows[i * NP + t] = ds4_row_of(s[i], prompt[t], t + 1 == NP ? DS4_ROW_LOGITS : 0);
    }
    float *lg = malloc((size_t)2 * V * sizeof(float));
    ds4_step_out out = {lg, NULL};
    if (ds4_backend_step(b, rows, 2 * NP, &out, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    for (int i = 0; i < 2; i++) assert_memory_equal(lg + (size_t)i * V, alone[i], V * sizeof(float));
    assert_true(memcmp(alone[0], alone[1], V * sizeof(float)) != 0);
    ds4_seq_free(b, s[1]);
    ds4_backend_free(b);
    ds4_steering_free(st);
    free(lg);
    free(alone[0]);
    free(alone[1]);
}

static void test_backend_refuses_other_shape(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_steering *st = ds4_steering_from(dirs, L - 1, D, &err);
    ds4_backend_opts o = {.n_threads = 1, .ctx_size = CTX, .steer = st};
    assert_null(ds4_backend_create("cpu", W, &o, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "steering directions of"));
    ds4_steering_free(st);
}

/* ------------------------------------------------------------ sessions */

static void test_session_scales(void **state) {
    (void)state;
    char path[] = "/tmp/ds4-steer-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    ds4_err err = {0};
    assert_int_equal(ds4_steering_write(path, dirs, L, D, &err), 0);

    /* no directions: scales refused, at open and later */
    ds4_engine_opts eo = {.model_path = MODEL, .backend = "cpu", .n_threads = 2, .steer_ffn = 1.0f};
    assert_null(ds4_engine_open(&eo, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "direction file"));
    eo.steer_ffn = 0.0f;
    ds4_engine *e = ds4_engine_open(&eo, &err);
    assert_non_null(e);
    ds4_session *s = ds4_session_new(e, CTX, &err);
    assert_non_null(s);
    assert_int_equal(ds4_session_set_steering(s, 0.5f, 0.0f, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "--dir-steering-file"));
    assert_int_equal(ds4_session_set_steering(s, 0.0f, 0.0f, &err), 0);
    ds4_session_free(s);
    ds4_engine_close(e);

    /* with them: the engine's defaults, then a change drops the state */
    eo.steer_path = path;
    eo.steer_ffn = 1.0f;
    eo.steer_attn = 0.25f;
    assert_non_null(e = ds4_engine_open(&eo, &err));
    assert_non_null(s = ds4_session_new(e, CTX, &err));
    float f, a;
    ds4_session_steering(s, &f, &a);
    assert_true(f == 1.0f && a == 0.25f);
    int32_t toks[NP];
    for (int i = 0; i < NP; i++) toks[i] = (int32_t)prompt[i];
    assert_int_equal(ds4_session_sync(s, toks, NP, NULL, NULL, &err), 0);
    assert_int_equal(ds4_session_checkpoint(s, &err), 0);
    assert_int_equal(ds4_session_set_steering(s, 1.0f, 0.25f, &err), 0); /* the same: kept */
    assert_int_equal(ds4_session_n_tokens(s), NP);
    assert_int_equal(ds4_session_set_steering(s, 200.0f, 0.0f, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "outside -100..100"));
    assert_int_equal(ds4_session_set_steering(s, 0.0f, 0.0f, &err), 0);
    assert_int_equal(ds4_session_n_tokens(s), 0);
    assert_int_equal(ds4_session_checkpoint_tokens(s), 0);
    ds4_session_free(s);
    ds4_engine_close(e);
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_projection_by_hand),
        cmocka_unit_test(test_projection_random_rows),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_zero_scale_is_bit_identical),
        cmocka_unit_test(test_removal_is_orthogonal),
        cmocka_unit_test(test_batched_rows_keep_their_scales),
        cmocka_unit_test(test_backend_refuses_other_shape),
        cmocka_unit_test(test_session_scales),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
