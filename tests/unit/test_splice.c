/*
 * test_splice.c - ./ds4-splice on a q2 base and a q4 donor made by
 * ./ds4-quantize from the tiny official checkpoint: the output opens, has
 * the base's metadata plus splice.* provenance, the donor's bytes and types
 * for the routed experts of the chosen layers and the base's bytes for
 * everything else.  Incompatible inputs (other config, architecture, tensor
 * set or shapes, unacceptable donor types), bad layer specs and existing
 * outputs are refused; --dry-run writes nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/official_ckpt.h"
#include "common/st_build.h"
#include "common/tool_run.h"
#include "format/gguf.h"
#include "format/quants.h"
#include "model/backends.h"
#include "model/config.h"
#include "model/weights.h"

static char *dir;
static char base[1024], donor[1024], out[1024];

static int setup(void **state) {
    (void)state;
    struct stat st;
    if (stat("./ds4-splice", &st) != 0 || stat("./ds4-quantize", &st) != 0) {
        fprintf(stderr, "./ds4-splice or ./ds4-quantize missing: run make first\n");
        return -1;
    }
    dir = st_tempdir();
    official_ckpt_write(dir, NULL);
    snprintf(base, sizeof(base), "%s/q2.gguf", dir);
    snprintf(donor, sizeof(donor), "%s/q4.gguf", dir);
    snprintf(out, sizeof(out), "%s/mix.gguf", dir);
    char log[8192];
    if (run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q2 --quiet", dir, base) != 0 ||
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q4 --quiet", dir, donor) != 0) {
        fprintf(stderr, "%s\n", log);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_rmdir(dir);
    free(dir);
    return 0;
}

static bool kv_equal(const ds4_gguf_kv *a, const ds4_gguf_kv *b) {
    if (a->value.type != b->value.type) return false;
    switch (a->value.type) {
    case DS4_GGUF_STRING:
        return a->value.s.len == b->value.s.len && memcmp(a->value.s.ptr, b->value.s.ptr, a->value.s.len) == 0;
    case DS4_GGUF_ARRAY: {
        const ds4_gguf_array *x = &a->value.a, *y = &b->value.a;
        if (x->type != y->type || x->count != y->count) return false;
        if (x->type == DS4_GGUF_STRING) {
            for (uint64_t i = 0; i < x->count; i++)
                if (x->strs[i].len != y->strs[i].len || memcmp(x->strs[i].ptr, y->strs[i].ptr, x->strs[i].len))
                    return false;
            return true;
        }
        return memcmp(x->data, y->data, x->count * ds4_gguf_vtype_size(x->type)) == 0;
    }
    default: return memcmp(&a->value, &b->value, sizeof(a->value)) == 0;
    }
}

static bool in_layers(const char *name) {
    return strstr(name, "_exps.") && (strncmp(name, "blk.1.", 6) == 0 || strncmp(name, "blk.3.", 6) == 0);
}

static void test_splice_layers(void **state) {
    (void)state;
    char log[1 << 14];
    unlink(out);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 1,3", base, donor, out),
        0);
    ds4_gguf *b = gguf_open_or_fail(base), *d = gguf_open_or_fail(donor), *m = gguf_open_or_fail(out);
    ds4_err err = {0};
    ds4_config cb, cm;
    assert_int_equal(ds4_config_from_gguf(b, &cb, &err), 0);
    assert_int_equal(ds4_config_from_gguf(m, &cm, &err), 0);
    assert_memory_equal(&cb, &cm, sizeof(cb));
    for (uint64_t i = 0; i < b->n_kv; i++) {
        const ds4_gguf_kv *k = ds4_gguf_find_kv(m, b->kv[i].key);
        if (!k || !kv_equal(k, &b->kv[i])) fail_msg("metadata %s not copied", b->kv[i].key);
    }
    ds4_str s;
    assert_int_equal(ds4_gguf_get_str(m, "splice.layers", &s, &err), 0);
    assert_true(ds4_str_eq(s, "1,3"));
    assert_int_equal(ds4_gguf_get_str(m, "splice.donor", &s, &err), 0);
    assert_true(ds4_str_eq(s, "q4.gguf"));
    assert_int_equal(m->n_tensors, b->n_tensors);
    int from_donor = 0;
    for (uint64_t i = 0; i < b->n_tensors; i++) {
        const ds4_gguf_tensor *t = &m->tensors[i];
        assert_string_equal(t->name, b->tensors[i].name);
        const ds4_gguf_tensor *src = in_layers(t->name) ? ds4_gguf_find_tensor(d, t->name) : &b->tensors[i];
        from_donor += in_layers(t->name);
        assert_int_equal(t->type, src->type);
        assert_int_equal(t->nbytes, src->nbytes);
        if (memcmp(t->data, src->data, t->nbytes) != 0) fail_msg("%s: bytes differ from their source", t->name);
    }
    assert_int_equal(from_donor, 6);
    assert_int_equal(ds4_gguf_find_tensor(m, "blk.3.ffn_down_exps.weight")->type, DS4_TYPE_Q4_K);
    assert_int_equal(ds4_gguf_find_tensor(m, "blk.2.ffn_down_exps.weight")->type, DS4_TYPE_Q2_K);
    ds4_gguf_close(b);
    ds4_gguf_close(d);
    ds4_gguf_close(m);

    /* The model loader accepts the mixed file and the forward pass runs. */
    ds4_weights *wts = ds4_weights_open(out, &err);
    if (!wts) fail_msg("%s", err.msg);
    ds4_backend_opts bo = {.n_threads = 1};
    ds4_backend *be = ds4_backend_create("cpu", wts, &bo, &err);
    const uint32_t toks[4] = {1, 2, 300, 4};
    assert_non_null(be);
    assert_int_equal(ds4_backend_prefill(be, toks, 4, NULL, &err), 0);
    const float *lg = ds4_backend_logits(be);
    for (uint32_t i = 0; i < wts->cfg.n_vocab; i++) assert_true(lg[i] == lg[i]);
    ds4_backend_free(be);
    ds4_weights_close(wts);

    /* Splicing again over a spliced base replaces the provenance. */
    char again[1100];
    snprintf(again, sizeof(again), "%s/again.gguf", dir);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --layers 0-1", out, donor, again), 0);
    m = gguf_open_or_fail(again);
    assert_int_equal(ds4_gguf_get_str(m, "splice.layers", &s, &err), 0);
    assert_true(ds4_str_eq(s, "0-1"));
    assert_int_equal(ds4_gguf_find_tensor(m, "blk.0.ffn_gate_exps.weight")->type, DS4_TYPE_Q4_K);
    ds4_gguf_close(m);
}

static void test_cli_checks(void **state) {
    (void)state;
    char log[1 << 14];
    unlink(out);
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-splice --base %s --donor %s --out %s --q4-layers 2-3 --dry-run", base, donor,
                                 out),
                     0);
    assert_contains(log, "blk.2.ffn_up_exps.weight         iq2_xxs  -> q4_k");
    assert_contains(log, "spliced tensors: 6 of 116");
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 4", base, donor, out), 2);
    assert_contains(log, "4-4 is not within 0..3");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 2-x", base, donor, out),
        2);
    assert_contains(log, "range without an end");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 3-1", base, donor, out),
        2);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --q4-layers 1", base, donor), 2);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 1", base, donor, base),
        2);
    assert_contains(log, "is one of the inputs");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 1", base, donor, out), 0);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 1", base, donor, out), 2);
    assert_contains(log, "exists (use --force");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 1 --force",
                                 base, donor, out),
                     0);
}

/* A copy of `src` with one change, written through the GGUF writer. */
typedef enum { M_KV_U32, M_ARCH, M_DROP, M_SHAPE, M_TYPE } mutation;

static void rewrite(const char *src, const char *dst, mutation m, const char *what) {
    ds4_err err = {0};
    ds4_gguf *g = gguf_open_or_fail(src);
    ds4_gguf_writer *w = ds4_gguf_writer_open(dst, 0, &err);
    assert_non_null(w);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const ds4_gguf_kv *kv = &g->kv[i];
        if (strcmp(kv->key, what) == 0 && m == M_KV_U32) {
            ds4_gguf_w_u32(w, kv->key, (uint32_t)kv->value.u + 1);
        } else if (strcmp(kv->key, "general.architecture") == 0 && m == M_ARCH) {
            ds4_gguf_w_str(w, kv->key, "deepseek2");
        } else {
            ds4_gguf_w_copy_kv(w, kv);
        }
    }
    uint8_t *zeros = calloc(1, 1 << 22);
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const ds4_gguf_tensor *t = &g->tensors[i];
            bool hit = strcmp(t->name, what) == 0;
            if (hit && m == M_DROP) continue;
            uint64_t ne[DS4_GGUF_MAX_DIMS];
            memcpy(ne, t->ne, sizeof(ne));
            uint32_t type = t->type;
            if (hit && m == M_SHAPE) ne[1] = t->ne[2], ne[2] = t->ne[1];
            if (hit && m == M_TYPE) type = 2; /* q4_0: not accepted by ds4 */
            int ok;
            uint64_t n = ds4_type_nbytes_checked(type, ne[0] * ne[1] * ne[2], &ok);
            if (pass == 0) ds4_gguf_w_tensor(w, t->name, t->ndim, ne, type);
            else ds4_gguf_w_data(w, type == t->type ? t->data : zeros, n);
        }
    free(zeros);
    if (ds4_gguf_writer_close(w, &err) != 0) fail_msg("%s", err.msg);
    ds4_gguf_close(g);
}

static void expect_refused(mutation m, const char *what, const char *want) {
    char bad[1100], log[1 << 14];
    snprintf(bad, sizeof(bad), "%s/bad.gguf", dir);
    rewrite(donor, bad, m, what);
    unlink(out);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --q4-layers 1", base, bad, out), 1);
    assert_contains(log, want);
    struct stat st;
    assert_int_not_equal(stat(out, &st), 0);
}

static void test_incompatible_donors(void **state) {
    (void)state;
    expect_refused(M_KV_U32, "deepseek4.expert_used_count", "different deepseek4.* configurations");
    expect_refused(M_ARCH, "", "architectures differ");
    expect_refused(M_DROP, "blk.2.attn_kv.weight", "base has 116 tensors, donor 115");
    expect_refused(M_SHAPE, "blk.0.ffn_up_exps.weight", "tensor blk.0.ffn_up_exps.weight: shapes differ");
    expect_refused(M_TYPE, "blk.1.ffn_down_exps.weight", "blk.1.ffn_down_exps.weight has type q4_0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splice_layers),
        cmocka_unit_test(test_cli_checks),
        cmocka_unit_test(test_incompatible_donors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
