/*
 * test_mtp.c - the MTP block and speculative decoding on the CPU:
 *   - the block's logits equal transformers' (tests/reference/mtp_golden.py)
 *     on two tiny models, within 1e-4 of max |logit|, simulations off;
 *   - greedy generation with drafts of 1, 2 and 4 tokens hands out the
 *     tokens plain generation does, and leaves the session's DSV4 payload
 *     byte-identical, across the ratio-4 / ratio-128 window ends and the
 *     prefill / decode boundary; in sized sessions too, grown by themselves
 *     or through a grow hook (drafts kept within the session's room);
 *   - a verification whose drafts are the true continuation keeps them all,
 *     one whose drafts are wrong keeps none, the state as plain decoding's;
 *   - the speculative sampling rule leaves the target's distribution
 *     (chi-square over 200,000 draws);
 *   - bad MTP files and options are refused with the reason.
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
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/spec.h"
#include "model/backends.h"

#define GOLD "tests/golden/cpu/"

/* ------------------------------------------- the block against HF */

static void check_golden(const char *name) {
    char path[256], mpath[256];
    snprintf(path, sizeof(path), GOLD "%s.f16.gguf", name);
    snprintf(mpath, sizeof(mpath), GOLD "%s.mtp.gguf", name);
    char gpath[256];
    snprintf(gpath, sizeof(gpath), GOLD "%s.mtp.golden", name);
    FILE *f = fopen(gpath, "rb");
    assert_non_null(f);
    char magic[4];
    uint32_t h[3];
    assert_int_equal(fread(magic, 1, 4, f), 4);
    assert_memory_equal(magic, "DS4M", 4);
    assert_int_equal(fread(h, 4, 3, f), 3);
    uint32_t n = h[1], V = h[2];
    uint32_t *tok = malloc(n * 4);
    float *want = malloc((size_t)(n - 1) * V * 4);
    assert_int_equal(fread(tok, 4, n, f), n);
    assert_int_equal(fread(want, 4, (size_t)(n - 1) * V, f), (size_t)(n - 1) * V);
    fclose(f);

    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) fail_msg("%s", ds4_err_msg(&err));
    ds4_mtp_weights *m = ds4_mtp_open(mpath, w, &err);
    if (!m) fail_msg("%s", ds4_err_msg(&err));
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = 512, .no_sim = true, .mtp = m};
    ds4_backend *b = ds4_backend_create("cpu", w, &o, &err);
    if (!b) fail_msg("%s", ds4_err_msg(&err));
    uint32_t W = w->cfg.sliding_window;
    float *got = malloc((size_t)V * 4);
    /* after prefills of several lengths: the MTP rows of the last
     * DS4_HIDDEN_KEEP positions, then the row at the last position with
     * the prompt's next token; rows whose window the MTP sequence holds
     * whole compare (the last one always) */
    const uint32_t ns[] = {2, 60, 130, 257, n - 1};
    double worst = 0;
    for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++) {
        uint32_t len = ns[a];
        ds4_backend_reset(b);
        if (ds4_backend_prefill(b, tok, len, NULL, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
        ds4_seq *ms = ds4_mtp_seq_new(b, 0, &err);
        if (!ms) fail_msg("%s", ds4_err_msg(&err));
        uint32_t lo = len > DS4_HIDDEN_KEEP ? len - DS4_HIDDEN_KEEP : 0;
        for (uint32_t i = lo; i < len; i++) {
            ds4_row row = ds4_mtp_row(ms, tok[i + 1], DS4_ROW_LOGITS, b->main, i);
            ds4_step_out out = {got, NULL};
            if (ds4_backend_mtp_step(b, &row, 1, &out, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
            if (i + 1 < lo + W && i + 1 != len) continue; /* its window reaches before the MTP rows */
            const float *r = want + (size_t)i * V;
            double mx = 0, d = 0;
            for (uint32_t v = 0; v < V; v++) {
                mx = fmax(mx, fabs(r[v]));
                d = fmax(d, fabs(got[v] - r[v]));
            }
            if (d > 1e-4 * mx) fail_msg("%s: MTP row at %u: max|d| %.3g of max|logit| %.3g", name, i, d, mx);
            worst = fmax(worst, d / mx);
        }
        ds4_seq_free(b, ms);
    }
    fprintf(stderr, "%s: MTP block against transformers, worst row max|d| / max|logit| = %.3g\n", name, worst);
    free(got);
    free(tok);
    free(want);
    ds4_backend_free(b);
    ds4_mtp_close(m);
    ds4_weights_close(w);
}

static void test_block_matches_transformers(void **state) {
    (void)state;
    check_golden("tiny-a");
    check_golden("tiny-b");
}

/* ---------------------------------------------- greedy identity */

typedef struct rec {
    int32_t tok[256];
    uint32_t n;
} rec;

static void on_token(void *ctx, int32_t t, ds4_gen_control *ctl) {
    (void)ctl;
    rec *r = ctx;
    r->tok[r->n++] = t;
}

static ds4_engine *open_engine(bool mtp) {
    ds4_err err = {0};
    ds4_engine_opts o = {.model_path = GOLD "tiny-a.f16.gguf",
                         .backend = "cpu",
                         .n_threads = 2,
                         .mtp_path = mtp ? GOLD "tiny-a.mtp.gguf" : NULL};
    ds4_engine *e = ds4_engine_open(&o, &err);
    if (!e) fail_msg("%s", ds4_err_msg(&err));
    return e;
}

static char *payload_of(ds4_session *s, size_t *len) {
    ds4_err err = {0};
    ds4_kv_state *st = ds4_session_state_new(s, &err);
    if (!st || ds4_session_snapshot(s, st, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (ds4_kv_state_save(st, f, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    fclose(f);
    ds4_kv_state_free(st);
    return buf;
}

/* A grow hook (generate.h) that grows the session as asked, counting the
 * calls: the server's, whose admission always finds room. */
typedef struct grower {
    ds4_session *s;
    uint32_t calls;
} grower;

static int grow(void *ctx, uint32_t need) {
    grower *g = ctx;
    ds4_err err = {0};
    g->calls++;
    if (ds4_session_reserve(g->s, need, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    return 0;
}

/* Generate n tokens greedily after prompt p (draft 0: no MTP) in a session
 * of 512 tokens (granule: sized by what it holds, in granules of that
 * many; 0: not; g: its growth through g's hook, the drafts then within the
 * session's capacity). */
static void generate_in(ds4_engine *e, uint32_t granule, grower *g, const int32_t *p, uint32_t np, uint32_t n,
                        uint32_t draft, rec *r, char **pl, size_t *pl_len, ds4_spec_stats *st) {
    ds4_err err = {0};
    ds4_session *s = granule ? ds4_session_new_sized(e, 512, granule, &err) : ds4_session_new(e, 512, &err);
    if (!s) fail_msg("%s", ds4_err_msg(&err));
    if (draft && ds4_session_enable_mtp(s, draft, 0.0f, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    if (ds4_session_sync(s, p, np, NULL, NULL, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    ds4_gen_opts o = {.max_tokens = n};
    if (g) {
        g->s = s;
        o.grow_fn = grow;
        o.grow_ctx = g;
    }
    ds4_gen_result res;
    memset(r, 0, sizeof(*r));
    if (ds4_generate(s, NULL, &o, on_token, r, &res, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    *pl = payload_of(s, pl_len);
    if (st) *st = ds4_session_spec(s) ? ds4_session_spec(s)->stats : (ds4_spec_stats){0};
    ds4_session_free(s);
}

static void generate(ds4_engine *e, const int32_t *p, uint32_t np, uint32_t n, uint32_t draft, rec *r, char **pl,
                     size_t *pl_len, ds4_spec_stats *st) {
    generate_in(e, 0, NULL, p, np, n, draft, r, pl, pl_len, st);
}

static void test_greedy_identity(void **state) {
    (void)state;
    ds4_engine *plain = open_engine(false), *spec = open_engine(true);
    int32_t prompt[300];
    for (uint32_t i = 0; i < 300; i++) prompt[i] = (int32_t)((i * 2654435761u + 11u) % 256);
    /* prompts ending before the ratio-4 and ratio-128 windows close, and
     * one prefill chunk of tokens */
    const uint32_t np[] = {1, 118, 250};
    const uint32_t draft[] = {1, 2, 4};
    for (size_t a = 0; a < sizeof(np) / sizeof(np[0]); a++) {
        rec want, got;
        char *pw, *pg;
        size_t lw, lg;
        generate(plain, prompt, np[a], 20, 0, &want, &pw, &lw, NULL);
        for (size_t d = 0; d < sizeof(draft) / sizeof(draft[0]); d++) {
            ds4_spec_stats st;
            /* drafts of 2 in a sized session: grown (its MTP sequence too) as it speculates; of 4:
             * grown through a grow hook, the drafts kept within the session's capacity */
            grower g = {0};
            generate_in(spec, draft[d] == 1 ? 0 : 16, draft[d] == 4 ? &g : NULL, prompt, np[a], 20, draft[d], &got, &pg,
                        &lg, &st);
            if (draft[d] == 4 && np[a] == 250) assert_true(g.calls > 0);
            assert_int_equal(got.n, want.n);
            if (memcmp(got.tok, want.tok, want.n * sizeof(int32_t)) != 0)
                fail_msg("prompt %u, drafts of %u: tokens differ from plain decoding", np[a], draft[d]);
            if (lg != lw || memcmp(pg, pw, lw) != 0)
                fail_msg("prompt %u, drafts of %u: the session's payload differs from plain decoding", np[a], draft[d]);
            assert_true(st.cycles > 0);
            free(pg);
        }
        free(pw);
    }
    ds4_engine_close(spec);
    ds4_engine_close(plain);
}

/* Drafts that are the target's own continuation are all kept. */
static void test_right_drafts_are_kept(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_engine *e = open_engine(true);
    int32_t prompt[140];
    for (uint32_t i = 0; i < 140; i++) prompt[i] = (int32_t)((i * 97u + 5u) % 256);
    /* the target's greedy continuation, plainly */
    rec want;
    char *pw;
    size_t lw;
    generate(e, prompt, 120, 9, 0, &want, &pw, &lw, NULL);
    ds4_session *s = ds4_session_new(e, 512, &err);
    assert_int_equal(ds4_session_enable_mtp(s, 8, 0.0f, &err), 0);
    assert_int_equal(ds4_session_sync(s, prompt, 120, NULL, NULL, &err), 0);
    float *lg = malloc((size_t)9 * 256 * sizeof(float));
    assert_int_equal(ds4_session_spec_verify(s, want.tok, 9, lg, &err), 0);
    for (uint32_t i = 0; i + 1 < 9; i++) assert_int_equal(ds4_argmax(lg + (size_t)i * 256, 256), want.tok[i + 1]);
    assert_int_equal(ds4_session_spec_accept(s, 9, &err), 0);
    assert_int_equal(ds4_session_n_tokens(s), 129);
    /* the state is plain decoding's after the same tokens */
    ds4_session *p = ds4_session_new(e, 512, &err);
    int32_t all[129];
    memcpy(all, prompt, 120 * sizeof(int32_t));
    memcpy(all + 120, want.tok, 9 * sizeof(int32_t));
    assert_int_equal(ds4_session_sync(p, all, 120, NULL, NULL, &err), 0);
    for (uint32_t i = 120; i < 129; i++) assert_int_equal(ds4_session_eval(p, all[i], &err), 0);
    size_t la, lb;
    char *a = payload_of(s, &la), *b = payload_of(p, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    /* wrong drafts: none is kept, the state is the one before */
    int32_t wrong[5] = {want.tok[0], 1, 2, 3, 4};
    a = payload_of(s, &la);
    assert_int_equal(ds4_session_spec_verify(s, wrong, 5, lg, &err), 0);
    assert_int_equal(ds4_session_spec_accept(s, 0, &err), 0);
    b = payload_of(s, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    free(lg);
    free(pw);
    ds4_session_free(p);
    ds4_session_free(s);
    ds4_engine_close(e);
}

/* ------------------------------------- the speculative sampling rule */

static void test_sampling_rule_keeps_the_distribution(void **state) {
    (void)state;
    ds4_err err = {0};
    enum { V = 8, DRAWS = 200000 };
    ds4_sampler smp;
    ds4_sampler_params sp;
    ds4_sampler_defaults(&sp);
    sp.seed = 42;
    assert_int_equal(ds4_sampler_init(&smp, &sp, V, &err), 0);
    const double p0[V] = {0.30, 0.05, 0.20, 0.00, 0.15, 0.10, 0.12, 0.08};
    const double q[V] = {0.10, 0.25, 0.05, 0.20, 0.15, 0.05, 0.10, 0.10};
    double count[V] = {0}, p[V];
    for (int i = 0; i < DRAWS; i++) {
        int32_t d = ds4_sample_dist(&smp, q), y;
        memcpy(p, p0, sizeof(p));
        count[ds4_spec_accepts(&smp, p, q, d, &y) ? d : y]++;
    }
    double chi2 = 0;
    for (int v = 0; v < V; v++) {
        if (p0[v] == 0) {
            assert_true(count[v] == 0); /* never a token the target excludes */
            continue;
        }
        double e = p0[v] * DRAWS;
        chi2 += (count[v] - e) * (count[v] - e) / e;
    }
    /* 6 degrees of freedom: P(chi2 > 22.46) = 0.001 */
    if (chi2 > 22.46) fail_msg("chi-square %.2f: the accepted tokens are not drawn from the target", chi2);
    ds4_sampler_free(&smp);
}

/* ------------------------------------------------------ bad input */

static void test_bad_files_and_options(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(GOLD "tiny-a.f16.gguf", &err);
    assert_non_null(w);
    /* another model's block: its metadata says so */
    assert_null(ds4_mtp_open(GOLD "tiny-b.mtp.gguf", w, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "deepseek4.vocab_size is 200"));
    /* the right metadata but a tensor of another shape: the tensor is named */
    char path[128];
    snprintf(path, sizeof(path), "build/tests/mtp-short.%d.gguf", (int)getpid());
    gguf_edit ed = {.short_tensor = "mtp.0.attn_q_a.weight"};
    assert_int_equal(gguf_copy_edited(GOLD "tiny-a.mtp.gguf", path, &ed, &err), 0);
    assert_null(ds4_mtp_open(path, w, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "tensor mtp.0.attn_q_a.weight: shape"));
    gguf_edit drop = {.drop_tensor = "mtp.0.exp_probs_b.bias"}; /* the router bias is required here */
    assert_int_equal(gguf_copy_edited(GOLD "tiny-a.mtp.gguf", path, &drop, &err), 0);
    assert_null(ds4_mtp_open(path, w, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "tensor mtp.0.exp_probs_b.bias is missing"));
    unlink(path);
    /* a main model file has no block */
    assert_null(ds4_mtp_open(GOLD "tiny-a.f16.gguf", w, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "mtp.0."));
    ds4_weights_close(w);
    /* drafts out of range, MTP without a block */
    ds4_engine *plain = open_engine(false), *spec = open_engine(true);
    ds4_session *s = ds4_session_new(spec, 512, &err);
    assert_int_equal(ds4_session_enable_mtp(s, 17, 0.0f, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "1..16"));
    ds4_session_free(s);
    s = ds4_session_new(plain, 512, &err);
    assert_int_equal(ds4_session_enable_mtp(s, 2, 0.0f, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "MTP"));
    ds4_session_free(s);
    ds4_engine_close(spec);
    ds4_engine_close(plain);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_matches_transformers), cmocka_unit_test(test_greedy_identity),
        cmocka_unit_test(test_right_drafts_are_kept),      cmocka_unit_test(test_sampling_rule_keeps_the_distribution),
        cmocka_unit_test(test_bad_files_and_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
