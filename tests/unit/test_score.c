/*
 * test_score.c - ./ds4-score and ./ds4-score-compare on the tiny model
 * (./ds4-quantize of the tiny official checkpoint): NLL equal to a log-softmax
 * of the backend's prefill logits computed here, first-token match and
 * greedy LCP on a target made of the model's own greedy tokens, the compare
 * summary, and clear errors for bad manifests and token files.
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
#include <sys/stat.h>

#include "common/official_ckpt.h"
#include "common/st_build.h"
#include "common/tool_run.h"
#include "model/backends.h"
#include "model/weights.h"

static char *dir;
static char f32[1024], q2[1024], manifest[1024];
static const uint32_t prompt_a[5] = {1, 5, 9, 200, 33};
static const uint32_t target_a[3] = {7, 100, 511};
static const uint32_t prompt_b[4] = {3, 4, 5, 6};
static uint32_t greedy_b[3]; /* the f32 model's own greedy continuation */

static void write_ids(const char *name, const uint32_t *v, int n) {
    char path[1100], text[256] = "";
    for (int i = 0; i < n; i++)
        snprintf(text + strlen(text), sizeof(text) - strlen(text), "%u%s", v[i], i % 2 ? "," : " ");
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    st_write_file(path, text, strlen(text));
}

static ds4_backend *open_backend(const char *model, ds4_weights **w) {
    ds4_err err = {0};
    *w = ds4_weights_open(model, &err);
    if (!*w) fail_msg("%s", err.msg);
    ds4_backend_opts bo = {.n_threads = 2};
    ds4_backend *b = ds4_backend_create("cpu", *w, &bo, &err);
    if (!b) fail_msg("%s", err.msg);
    return b;
}

static uint32_t argmax(const float *v, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static int setup(void **state) {
    (void)state;
    struct stat st;
    if (stat("./ds4-score", &st) != 0 || stat("./ds4-quantize", &st) != 0) return -1;
    dir = st_tempdir();
    official_ckpt_write(dir, NULL);
    snprintf(f32, sizeof(f32), "%s/f32.gguf", dir);
    snprintf(q2, sizeof(q2), "%s/q2.gguf", dir);
    char log[8192];
    if (run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe f32 --quiet", dir, f32) != 0 ||
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q2 --quiet", dir, q2) != 0)
        return -1;
    /* Case b's target: three greedy steps of the f32 model. */
    ds4_weights *w;
    ds4_backend *b = open_backend(f32, &w);
    ds4_err err = {0};
    ds4_backend_prefill(b, prompt_b, 4, NULL, &err);
    for (int i = 0; i < 3; i++) {
        greedy_b[i] = argmax(ds4_backend_logits(b), w->cfg.n_vocab);
        if (i < 2) ds4_backend_decode(b, greedy_b[i], &err);
    }
    ds4_backend_free(b);
    ds4_weights_close(w);
    write_ids("pa.txt", prompt_a, 5);
    write_ids("ta.txt", target_a, 3);
    write_ids("pb.txt", prompt_b, 4);
    write_ids("tb.txt", greedy_b, 3);
    snprintf(manifest, sizeof(manifest), "%s/manifest.tsv", dir);
    const char *m = "# id\tprompt\ttarget\ncase-a\tpa.txt\tta.txt\n\ncase-b\tpb.txt\ttb.txt\n";
    st_write_file(manifest, m, strlen(m));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_rmdir(dir);
    free(dir);
    return 0;
}

/* Expected NLL of a case from one prefill with all logits. */
static double expected_nll(const char *model, const uint32_t *p, uint32_t np, const uint32_t *t, uint32_t nt) {
    ds4_weights *w;
    ds4_backend *b = open_backend(model, &w);
    uint32_t nv = w->cfg.n_vocab, n = np + nt;
    uint32_t *all = malloc(n * sizeof(uint32_t));
    memcpy(all, p, np * sizeof(uint32_t));
    memcpy(all + np, t, nt * sizeof(uint32_t));
    float *logits = malloc((size_t)n * nv * sizeof(float));
    ds4_err err = {0};
    assert_int_equal(ds4_backend_prefill(b, all, n, logits, &err), 0);
    double nll = 0;
    for (uint32_t j = 0; j < nt; j++) {
        const float *l = logits + (size_t)(np - 1 + j) * nv;
        double m = -INFINITY, s = 0;
        for (uint32_t i = 0; i < nv; i++) m = fmax(m, l[i]);
        for (uint32_t i = 0; i < nv; i++) s += exp(l[i] - m);
        nll += log(s) + m - l[t[j]];
    }
    free(all);
    free(logits);
    ds4_backend_free(b);
    ds4_weights_close(w);
    return nll;
}

static void parse_row(const char *tsv, const char *id, double *nll, int *first, unsigned *lcp) {
    const char *p = strstr(tsv, id);
    if (!p) fail_msg("no row %s in %s", id, tsv);
    char name[64];
    unsigned pt, tt;
    double avg;
    assert_int_equal(sscanf(p, "%63[^\t]\t%u\t%u\t%lf\t%lf\t%d\t%u", name, &pt, &tt, nll, &avg, first, lcp), 7);
}

static void test_scores(void **state) {
    (void)state;
    char log[8192], out[1100], tsv[8192];
    snprintf(out, sizeof(out), "%s/f32.tsv", dir);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score --token-ids %s %s %s 64 -t 2", f32, manifest, out), 0);
    assert_contains(log, "2 cases, 6 target tokens");
    FILE *f = fopen(out, "r");
    size_t n = fread(tsv, 1, sizeof(tsv) - 1, f);
    tsv[n] = '\0';
    fclose(f);
    assert_contains(tsv, "id\tprompt_tokens\ttarget_tokens\tnll\tavg_nll\tfirst_match\tgreedy_lcp\n");
    double nll;
    int first;
    unsigned lcp;
    parse_row(tsv, "case-a\t5\t3\t", &nll, &first, &lcp);
    double want = expected_nll(f32, prompt_a, 5, target_a, 3);
    if (fabs(nll - want) > 1e-4 * fmax(1.0, want)) fail_msg("case-a nll %f, expected %f", nll, want);
    parse_row(tsv, "case-b\t4\t3\t", &nll, &first, &lcp);
    want = expected_nll(f32, prompt_b, 4, greedy_b, 3);
    if (fabs(nll - want) > 1e-4 * fmax(1.0, want)) fail_msg("case-b nll %f, expected %f", nll, want);
    assert_int_equal(first, 1);
    assert_int_equal(lcp, 3);

    char q2out[1100];
    snprintf(q2out, sizeof(q2out), "%s/q2.tsv", dir);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score --token-ids %s %s %s 64", q2, manifest, q2out), 0);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score-compare %s %s", out, out), 0);
    assert_contains(log, "delta +0.000000");
    assert_contains(log, "new better 0, tied 2, old better 0");
    assert_contains(log, "first-token matches: old 1 new 1");
    assert_contains(log, "avg greedy LCP: old 1.500 new 1.500");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score-compare %s %s", out, q2out), 0);
    assert_contains(log, "cases: 2 (0 only in one file)");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score-compare %s %s", out, manifest), 1);
    assert_contains(log, "not a ds4-score row");
}

static void expect_error(const char *manifest_text, const char *ids_text, int rc_want, const char *want) {
    char m[1100], log[8192], out[1100];
    snprintf(m, sizeof(m), "%s/bad-manifest.tsv", dir);
    st_write_file(m, manifest_text, strlen(manifest_text));
    if (ids_text) {
        char p[1100];
        snprintf(p, sizeof(p), "%s/bad.txt", dir);
        st_write_file(p, ids_text, strlen(ids_text));
    }
    snprintf(out, sizeof(out), "%s/bad.tsv", dir);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score --token-ids %s %s %s 64", f32, m, out), rc_want);
    assert_contains(log, want);
}

static void test_errors(void **state) {
    (void)state;
    expect_error("x\tpa.txt\n", NULL, 1, "bad-manifest.tsv:1: expected ID<TAB>PROMPT_FILE<TAB>TARGET_FILE");
    expect_error("x\tpa.txt\tnope.txt\n", NULL, 1, "nope.txt: No such file");
    expect_error("x\tpa.txt\tbad.txt\n", "1 2 512", 1, "bad.txt: byte 6: token id outside the vocabulary (512)");
    expect_error("x\tpa.txt\tbad.txt\n", "1 2 x", 1, "unexpected character 'x'");
    expect_error("x\tpa.txt\tbad.txt\n", " \n", 1, "case x: empty prompt or target");
    char many[400] = "";
    for (int i = 0; i < 70; i++) strcat(many, "3 ");
    expect_error("x\tpa.txt\tbad.txt\n", many, 1, "case x: 5 + 70 tokens exceed the context of 64");
    char log[1024];
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score %s", f32), 2);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-score %s %s out.tsv 0", f32, manifest), 2);
    assert_non_null(strstr(log, "CTX 0: must be an integer in 1..1048576"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scores),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
