/*
 * test_imatrix.c - legacy `.dat` importance matrices: a file assembled
 * byte by byte here is read back exactly, a saved matrix is byte-identical
 * to the same hand-assembled bytes, every truncation and malformed field is
 * refused with a message naming the file and entry, and lookups find
 * packed per-expert vectors, per-expert entries and plain entries, divided
 * by the call count.
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

#include "common/st_build.h"
#include "common/tool_run.h"
#include "format/imatrix.h"
#include "model/config.h"
#include "model/imatrix_collect.h"

typedef struct bytes {
    uint8_t buf[4096];
    size_t n;
} bytes;

static void put_i32(bytes *b, int32_t v) {
    for (int i = 0; i < 4; i++) b->buf[b->n++] = (uint8_t)((uint32_t)v >> (8 * i));
}
static void put_f32(bytes *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    put_i32(b, (int32_t)u);
}
static void put_str(bytes *b, const char *s) {
    put_i32(b, (int32_t)strlen(s));
    memcpy(b->buf + b->n, s, strlen(s));
    b->n += strlen(s);
}

/* Two entries: a packed 3-expert x 4-column routed tensor summed over 2
 * calls, and a plain 2-column one; then the trailer. */
static void sample(bytes *b, int trailer) {
    b->n = 0;
    put_i32(b, 2);
    put_str(b, "blk.0.ffn_gate_exps.weight");
    put_i32(b, 2);
    put_i32(b, 12);
    for (int i = 0; i < 12; i++) put_f32(b, (float)(i * 2));
    put_str(b, "blk.0.attn_q_a.weight");
    put_i32(b, 0);
    put_i32(b, 2);
    put_f32(b, 0.5f);
    put_f32(b, 8.0f);
    if (trailer) {
        put_i32(b, 17);
        put_str(b, "prompts.txt");
    }
}

static char *write_tmp(const char *dir, const bytes *b) {
    char *path = malloc(1024);
    snprintf(path, 1024, "%s/im.dat", dir);
    st_write_file(path, b->buf, b->n);
    return path;
}

static void test_reads_hand_built_file(void **state) {
    (void)state;
    char *dir = st_tempdir();
    bytes b;
    sample(&b, 1);
    char *path = write_tmp(dir, &b);
    ds4_err err = {0};
    ds4_imatrix *im = ds4_imatrix_load(path, &err);
    assert_non_null(im);
    assert_int_equal(im->n_entries, 2);
    assert_string_equal(im->entries[0].name, "blk.0.ffn_gate_exps.weight");
    assert_int_equal(im->entries[0].ncall, 2);
    assert_int_equal(im->entries[0].nval, 12);
    assert_true(im->entries[0].values[11] == 22.0f);
    assert_int_equal(im->chunks, 17);
    assert_string_equal(im->dataset, "prompts.txt");
    assert_non_null(ds4_imatrix_find(im, "blk.0.attn_q_a.weight"));
    assert_null(ds4_imatrix_find(im, "blk.1.attn_q_a.weight"));
    ds4_imatrix_free(im);

    sample(&b, 0);
    st_write_file(path, b.buf, b.n);
    im = ds4_imatrix_load(path, &err);
    assert_non_null(im);
    assert_int_equal(im->chunks, -1);
    assert_null(im->dataset);
    ds4_imatrix_free(im);
    free(path);
    st_rmdir(dir);
    free(dir);
}

static void test_save_is_byte_exact(void **state) {
    (void)state;
    char *dir = st_tempdir();
    ds4_err err = {0};
    ds4_imatrix *im = ds4_imatrix_new(&err);
    ds4_imatrix_entry *e = ds4_imatrix_entry_get(im, "blk.0.ffn_gate_exps.weight", 12, &err);
    assert_non_null(e);
    for (int i = 0; i < 12; i++) e->values[i] = (float)(i * 2);
    e->ncall = 2;
    e = ds4_imatrix_entry_get(im, "blk.0.attn_q_a.weight", 2, &err);
    e->values[0] = 0.5f;
    e->values[1] = 8.0f;
    assert_ptr_equal(ds4_imatrix_entry_get(im, "blk.0.attn_q_a.weight", 2, &err), e);
    assert_null(ds4_imatrix_entry_get(im, "blk.0.attn_q_a.weight", 3, &err));
    assert_contains(err.msg, "has 2 values, not 3");
    assert_int_equal(ds4_imatrix_set_trailer(im, 17, "prompts.txt", &err), 0);

    char path[1024];
    snprintf(path, sizeof(path), "%s/out.dat", dir);
    assert_int_equal(ds4_imatrix_save(im, path, &err), 0);
    ds4_imatrix_free(im);

    bytes want;
    sample(&want, 1);
    FILE *fp = fopen(path, "rb");
    uint8_t got[4096];
    size_t n = fread(got, 1, sizeof(got), fp);
    fclose(fp);
    assert_int_equal(n, want.n);
    assert_memory_equal(got, want.buf, n);
    st_rmdir(dir);
    free(dir);
}

static void test_every_truncation_is_refused(void **state) {
    (void)state;
    char *dir = st_tempdir();
    bytes full, cut;
    sample(&full, 1);
    char *path = NULL;
    /* Cutting exactly before the trailer gives a valid trailer-less file. */
    bytes no_trailer;
    sample(&no_trailer, 0);
    for (size_t len = 0; len < full.n; len++) {
        memcpy(cut.buf, full.buf, len);
        cut.n = len;
        free(path);
        path = write_tmp(dir, &cut);
        ds4_err err = {0};
        ds4_imatrix *im = ds4_imatrix_load(path, &err);
        if (len == no_trailer.n) {
            assert_non_null(im);
            ds4_imatrix_free(im);
            continue;
        }
        if (im) fail_msg("truncation at %zu accepted", len);
        assert_contains(err.msg, path);
    }
    free(path);
    st_rmdir(dir);
    free(dir);
}

typedef void (*corrupt_fn)(bytes *b);
static void neg_count(bytes *b) { b->n = 0, put_i32(b, -3); }
static void zero_name(bytes *b) { b->n = 0, put_i32(b, 1), put_i32(b, 0); }
static void nul_name(bytes *b) {
    b->n = 0, put_i32(b, 1), put_i32(b, 3);
    memcpy(b->buf + b->n, "a\0b", 3);
    b->n += 3, put_i32(b, 1), put_i32(b, 1), put_f32(b, 1);
}
static void neg_nval(bytes *b) { b->n = 0, put_i32(b, 1), put_str(b, "x"), put_i32(b, 1), put_i32(b, -1); }
static void nan_value(bytes *b) {
    b->n = 0, put_i32(b, 1), put_str(b, "x"), put_i32(b, 1), put_i32(b, 2), put_f32(b, 1), put_f32(b, NAN);
}
static void negative_value(bytes *b) {
    b->n = 0, put_i32(b, 1), put_str(b, "x"), put_i32(b, 1), put_i32(b, 1), put_f32(b, -1);
}
static void duplicate(bytes *b) {
    b->n = 0, put_i32(b, 2);
    for (int i = 0; i < 2; i++) put_str(b, "x"), put_i32(b, 1), put_i32(b, 1), put_f32(b, 1);
}
static void trailing(bytes *b) { sample(b, 1), put_i32(b, 7); }
static void huge_nval(bytes *b) { b->n = 0, put_i32(b, 1), put_str(b, "x"), put_i32(b, 1), put_i32(b, 1 << 30); }

static void test_malformed_files(void **state) {
    (void)state;
    static const struct {
        corrupt_fn make;
        const char *expect;
    } cases[] = {
        {neg_count, "entry count -3"},
        {zero_name, "name length 0"},
        {nul_name, "NUL"},
        {neg_nval, "entry x: ncall 1, nval -1"},
        {nan_value, "entry x: value 1 is nan"},
        {negative_value, "entry x: value 0 is -1"},
        {duplicate, "entry x appears twice"},
        {trailing, "unexpected bytes after the trailer"},
        {huge_nval, "entry x: 1073741824 values run past the end"},
    };
    char *dir = st_tempdir();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bytes b;
        cases[i].make(&b);
        char *path = write_tmp(dir, &b);
        ds4_err err = {0};
        ds4_imatrix *im = ds4_imatrix_load(path, &err);
        if (im) fail_msg("case %zu accepted", i);
        assert_contains(err.msg, path);
        assert_contains(err.msg, cases[i].expect);
        free(path);
    }
    ds4_err err = {0};
    assert_null(ds4_imatrix_load("/nonexistent/im.dat", &err));
    assert_int_equal(err.code, DS4_ENOTFOUND);
    st_rmdir(dir);
    free(dir);
}

static void test_lookup(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_imatrix *im = ds4_imatrix_new(&err);
    ds4_imatrix_entry *packed = ds4_imatrix_entry_get(im, "blk.0.ffn_up_exps.weight", 12, &err);
    for (int i = 0; i < 12; i++) packed->values[i] = (float)i;
    packed->ncall = 4;
    ds4_imatrix_entry *one = ds4_imatrix_entry_get(im, "blk.1.ffn_up_exps.weight.expert.2", 4, &err);
    for (int i = 0; i < 4; i++) one->values[i] = 100.0f + (float)i;
    ds4_imatrix_entry *alt = ds4_imatrix_entry_get(im, "blk.1.ffn_up_exps.weight.expert_1", 4, &err);
    alt->values[3] = 7;
    ds4_imatrix_entry *plain = ds4_imatrix_entry_get(im, "output.weight", 4, &err);
    plain->values[0] = 3;

    float out[4];
    assert_int_equal(ds4_imatrix_lookup(im, "blk.0.ffn_up_exps.weight", 4, 2, 3, out, &err), 1);
    for (int c = 0; c < 4; c++) assert_true(out[c] == (float)(8 + c) / 4.0f);
    assert_int_equal(ds4_imatrix_lookup(im, "blk.1.ffn_up_exps.weight", 4, 2, 3, out, &err), 1);
    assert_true(out[1] == 101.0f);
    assert_int_equal(ds4_imatrix_lookup(im, "blk.1.ffn_up_exps.weight", 4, 1, 3, out, &err), 1);
    assert_true(out[3] == 7.0f);
    assert_int_equal(ds4_imatrix_lookup(im, "blk.1.ffn_up_exps.weight", 4, 0, 3, out, &err), 0);
    assert_int_equal(ds4_imatrix_lookup(im, "output.weight", 4, -1, 0, out, &err), 1);
    assert_true(out[0] == 3.0f);
    assert_int_equal(ds4_imatrix_lookup(im, "absent", 4, -1, 0, out, &err), 0);
    assert_int_equal(ds4_imatrix_lookup(im, "blk.0.ffn_up_exps.weight", 8, 0, 3, out, &err), -1);
    assert_contains(err.msg, "blk.0.ffn_up_exps.weight has 12 values, expected 8 or 3 x 8");
    assert_int_equal(ds4_imatrix_lookup(im, "blk.1.ffn_up_exps.weight", 5, 2, 3, out, &err), -1);
    assert_contains(err.msg, "expert.2 has 4 values, expected 5");
    ds4_imatrix_free(im);
}

/* Pro's expert entries (61 layers x 384 experts of 7168 inputs, 3072 for
 * the down projection) saved, loaded and looked up at the last expert of
 * the last layer. */
static void test_pro_sized(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_pro(&c);
    ds4_err err = {0};
    ds4_imatrix *im = ds4_imatrix_new(&err);
    char name[64];
    uint32_t last = c.n_layer - 1, ne = c.n_expert;
    snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", last);
    ds4_imatrix_entry *g = ds4_imatrix_entry_get(im, name, ne * c.n_embd, &err);
    assert_non_null(g);
    for (uint32_t i = 0; i < ne * c.n_embd; i++) g->values[i] = (float)(i % 9973);
    g->ncall = 2;
    snprintf(name, sizeof(name), "blk.%u.ffn_down_exps.weight", last);
    ds4_imatrix_entry *d = ds4_imatrix_entry_get(im, name, ne * c.n_ff_exp, &err);
    assert_non_null(d);
    for (uint32_t i = 0; i < ne * c.n_ff_exp; i++) d->values[i] = 1.0f;
    d->ncall = 1;
    char path[96];
    snprintf(path, sizeof(path), "build/tests/pro-imatrix.%d.dat", (int)getpid());
    assert_int_equal(ds4_imatrix_save(im, path, &err), 0);
    ds4_imatrix_free(im);
    im = ds4_imatrix_load(path, &err);
    unlink(path);
    if (!im) fail_msg("%s", err.msg);
    float *out = malloc(c.n_embd * sizeof(float));
    snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", last);
    assert_int_equal(ds4_imatrix_lookup(im, name, c.n_embd, (int)ne - 1, (int)ne, out, &err), 1);
    for (uint32_t k = 0; k < c.n_embd; k++) assert_true(out[k] == (float)(((ne - 1) * c.n_embd + k) % 9973) / 2.0f);
    snprintf(name, sizeof(name), "blk.%u.ffn_down_exps.weight", last);
    assert_int_equal(ds4_imatrix_lookup(im, name, c.n_ff_exp, 383, (int)ne, out, &err), 1);
    assert_true(out[c.n_ff_exp - 1] == 1.0f);
    free(out);
    ds4_imatrix_free(im);
}

static int split(const char *text, char out[][64], int max) {
    size_t pos = 0, start, len;
    int n = 0;
    while (n < max && ds4_imatrix_dataset_next(text, strlen(text), &pos, &start, &len))
        snprintf(out[n++], 64, "%.*s", (int)len, text + start);
    return n;
}

static void test_dataset_split(void **state) {
    (void)state;
    char p[8][64];
    const char *ds = "preamble ignored\n"
                     "\n\n===== DS4_IMATRIX_PROMPT 1 code think src =====\n<bos>first\nline two\n"
                     "\n\n===== DS4_IMATRIX_PROMPT 2 x y z =====\n\n\n"
                     "===== DS4_IMATRIX_PROMPT 3 =====\nthird ===== DS4_IMATRIX_PROMPT inline\n\n";
    assert_int_equal(split(ds, p, 8), 2);
    assert_string_equal(p[0], "<bos>first\nline two");
    assert_string_equal(p[1], "third ===== DS4_IMATRIX_PROMPT inline");
    assert_int_equal(split("just one prompt\n", p, 8), 1);
    assert_string_equal(p[0], "just one prompt");
    assert_int_equal(split("", p, 8), 0);
    assert_int_equal(split("===== DS4_IMATRIX_PROMPT only", p, 8), 0);
}

static void test_collector(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_ff_exp = 64;
    c.n_expert = 3;
    c.n_hash_layer = 1;
    ds4_err err = {0};
    ds4_imcol *col = ds4_imcol_new(&c, &err);
    assert_non_null(col);
    float x[2 * 32], mid[2 * 64];
    for (int i = 0; i < 64; i++) x[i] = (float)(i % 32) * (i < 32 ? 1.0f : -2.0f);
    for (int i = 0; i < 128; i++) mid[i] = 0.5f * (float)(i % 64);
    ds4_imcol_expert(col, 1, 2, 2, x, mid); /* two tokens */
    ds4_imcol_expert(col, 1, 2, 1, x, mid); /* one more */
    ds4_imcol_expert(col, 0, 0, 1, x + 32, mid);
    ds4_imcol_end_prompt(col);
    ds4_imcol_end_prompt(col);
    assert_int_equal(ds4_imcol_routes(col), 4);
    char *dir = st_tempdir(), path[1024];
    snprintf(path, sizeof(path), "%s/col.dat", dir);
    assert_int_equal(ds4_imcol_save(col, path, "data.txt", &err), 0);
    ds4_imcol_free(col);

    ds4_imatrix *im = ds4_imatrix_load(path, &err);
    assert_non_null(im);
    assert_int_equal(im->n_entries, 6);
    assert_int_equal(im->chunks, 2);
    assert_string_equal(im->dataset, "data.txt");
    const ds4_imatrix_entry *g = ds4_imatrix_find(im, "blk.1.ffn_gate_exps.weight");
    const ds4_imatrix_entry *u = ds4_imatrix_find(im, "blk.1.ffn_up_exps.weight");
    const ds4_imatrix_entry *d = ds4_imatrix_find(im, "blk.1.ffn_down_exps.weight");
    assert_non_null(g);
    assert_int_equal(g->nval, 3 * 32);
    assert_int_equal(d->nval, 3 * 64);
    assert_int_equal(g->ncall, 2);
    for (int i = 0; i < 32; i++) {
        float want = (float)i * i * (1 + 4 + 1); /* tokens x, -2x, x */
        assert_true(g->values[2 * 32 + i] == want);
        assert_true(u->values[2 * 32 + i] == want);
        assert_true(g->values[i] == 0.0f);
    }
    for (int i = 0; i < 64; i++) assert_true(d->values[2 * 64 + i] == 0.25f * (float)(i * i) * 3);
    const ds4_imatrix_entry *g0 = ds4_imatrix_find(im, "blk.0.ffn_gate_exps.weight");
    assert_true(g0->values[5] == 100.0f);
    float out[32];
    assert_int_equal(ds4_imatrix_lookup(im, "blk.1.ffn_up_exps.weight", 32, 2, 3, out, &err), 1);
    assert_true(out[3] == 27.0f); /* 9 * 6 / 2 prompts */
    ds4_imatrix_free(im);
    st_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_hand_built_file),
        cmocka_unit_test(test_save_is_byte_exact),
        cmocka_unit_test(test_every_truncation_is_refused),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_pro_sized),
        cmocka_unit_test(test_dataset_split),
        cmocka_unit_test(test_collector),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
