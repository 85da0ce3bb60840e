/*
 * test_gguf_read.c - the GGUF reader on hand-built files: a valid file reads
 * back exactly; every truncation fails cleanly; each kind of corruption
 * gives its error code and a message naming the exact file offset; lookups
 * and typed getters behave as documented; files that cannot be opened give
 * clear errors.  Files are built byte by byte here, independently of the
 * ds4 writer.
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

#include "format/gguf.h"
#include "format/quants.h"
#include "test_gguf_util.h"

/* ----------------------------------------------------------- valid file */

static void test_small_file_reads_back(void **state) {
    (void)state;
    small_layout lay;
    size_t size;
    uint8_t *buf = build_small(&size, &lay);
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open_buffer(buf, size, "small", &err);
    assert_non_null(g);
    assert_int_equal(g->version, 3);
    assert_int_equal(g->alignment, 32);
    assert_int_equal(g->data_offset, lay.data_offset);
    assert_int_equal(g->n_kv, SMALL_NKV);
    assert_int_equal(g->n_tensors, SMALL_NT);
    for (int i = 0; i < SMALL_NKV; i++) assert_int_equal(g->kv[i].file_offset, lay.kv[i]);

    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, "k.s1");
    assert_non_null(kv);
    assert_int_equal(kv->value.type, DS4_GGUF_STRING);
    assert_true(ds4_str_eq(kv->value.s, "hello"));
    assert_ptr_equal(kv->value.s.ptr, buf + lay.kv_value[0] + 8);

    const ds4_gguf_array *a;
    assert_int_equal(ds4_gguf_get_arr(g, "k.s2", DS4_GGUF_U16, &a, &err), 0);
    assert_int_equal(a->count, 3);
    for (uint64_t i = 0; i < 3; i++) assert_int_equal(ds4_gguf_arr_i64(a, i), (int64_t)i + 1);
    assert_null(a->strs);

    assert_int_equal(ds4_gguf_get_arr(g, "k.s3", DS4_GGUF_STRING, &a, &err), 0);
    assert_int_equal(a->count, 2);
    assert_true(ds4_str_eq(a->strs[0], "x"));
    assert_true(ds4_str_eq(a->strs[1], "yz"));

    bool b = false;
    assert_int_equal(ds4_gguf_get_bool(g, "k.s4", &b, &err), 0);
    assert_true(b);
    int64_t i64;
    assert_int_equal(ds4_gguf_get_i64(g, "k.s5", &i64, &err), 0);
    assert_int_equal(i64, -7);

    const ds4_gguf_tensor *t1 = ds4_gguf_find_tensor(g, "t1");
    const ds4_gguf_tensor *t2 = ds4_gguf_find_tensor(g, "t2");
    assert_non_null(t1);
    assert_non_null(t2);
    assert_int_equal(t1->ndim, 2);
    assert_int_equal(t1->ne[0], 4);
    assert_int_equal(t1->ne[1], 2);
    for (int d = 2; d < DS4_GGUF_MAX_DIMS; d++) assert_int_equal(t1->ne[d], 1);
    assert_int_equal(t1->nelements, 8);
    assert_int_equal(t1->nbytes, 32);
    assert_int_equal(t1->type, DS4_TYPE_F32);
    assert_ptr_equal(t1->data, buf + lay.data_offset);
    assert_int_equal(t2->type, DS4_TYPE_Q8_0);
    assert_int_equal(t2->nbytes, 34);
    assert_int_equal(t2->offset, 32);
    assert_int_equal(t2->file_offset, lay.t[1]);
    const uint8_t *d2 = t2->data;
    for (uint64_t j = 0; j < 34; j++) assert_int_equal(d2[j], small_data_byte(32 + j));
    assert_null(ds4_gguf_find_tensor(g, "t3"));
    assert_null(ds4_gguf_find_kv(g, "t1"));
    ds4_gguf_close(g);
    free(buf);
}

/* ------------------------------------------------------------ truncation */

/* Every prefix fails with a format or range error naming an offset, except
 * those that keep all tensor bytes and lose only trailing padding. */
static void test_every_truncation_fails_cleanly(void **state) {
    (void)state;
    small_layout lay;
    size_t size;
    uint8_t *full = build_small(&size, &lay);
    for (size_t len = 0; len < size; len++) {
        /* An exact-size copy, so ASan catches any read past the end. */
        uint8_t *buf = malloc(len ? len : 1);
        memcpy(buf, full, len);
        ds4_err err;
        ds4_err_clear(&err);
        ds4_gguf *g = ds4_gguf_open_buffer(buf, len, "cut", &err);
        if (len >= lay.data_end) {
            assert_non_null(g);
            ds4_gguf_close(g);
        } else {
            if (g) fail_msg("length %zu opened", len);
            if (err.code != DS4_EFORMAT && err.code != DS4_ERANGE)
                fail_msg("length %zu: code %s: %s", len, ds4_errcode_name(err.code), err.msg);
            if (!strstr(err.msg, "cut: offset ")) fail_msg("length %zu: no offset in '%s'", len, err.msg);
        }
        free(buf);
    }
    free(full);
}

/* ------------------------------------------------------------ corruption */

/* Patch one field of the small file, open it, and check the error. */
static void expect_corrupt(const char *label, uint64_t at, int width, uint64_t value, ds4_errcode code, uint64_t err_at,
                           const char *needle) {
    small_layout lay;
    size_t size;
    uint8_t *buf = build_small(&size, &lay);
    if (width == 4) patch_u32(buf, at, (uint32_t)value);
    else if (width == 8) patch_u64(buf, at, value);
    else buf[at] = (uint8_t)value;
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open_buffer(buf, size, "bad.gguf", &err);
    char want_at[64];
    snprintf(want_at, sizeof(want_at), "bad.gguf: offset %llu: ", (unsigned long long)err_at);
    if (g) fail_msg("%s: opened", label);
    if (err.code != code)
        fail_msg("%s: code %s, expected %s: %s", label, ds4_errcode_name(err.code), ds4_errcode_name(code), err.msg);
    if (!strstr(err.msg, want_at)) fail_msg("%s: '%s' does not start with '%s'", label, err.msg, want_at);
    if (!strstr(err.msg, needle)) fail_msg("%s: '%s' does not mention '%s'", label, err.msg, needle);
    free(buf);
}

static void test_header_corruption(void **state) {
    (void)state;
    small_layout l;
    size_t size;
    free(build_small(&size, &l));
    expect_corrupt("magic", 0, 4, 0x46554746, DS4_EFORMAT, 0, "bad magic");
    expect_corrupt("version 2", 4, 4, 2, DS4_EUNSUPPORTED, 4, "version 2");
    expect_corrupt("version 4", 4, 4, 4, DS4_EUNSUPPORTED, 4, "version 4");
    expect_corrupt("huge kv count", 16, 8, 1ull << 60, DS4_ERANGE, 16, "metadata count");
    expect_corrupt("max kv count", 16, 8, UINT64_MAX, DS4_ERANGE, 16, "metadata count");
    expect_corrupt("huge tensor count", 8, 8, 1ull << 58, DS4_ERANGE, 8, "tensor count");
    expect_corrupt("max tensor count", 8, 8, UINT64_MAX, DS4_ERANGE, 8, "tensor count");
    /* More tensors than there are: the data bytes are parsed as tensor infos. */
    expect_corrupt("one more tensor", 8, 8, 3, DS4_EFORMAT, l.data_offset, "tensor");
}

static void test_metadata_corruption(void **state) {
    (void)state;
    small_layout l;
    size_t size;
    free(build_small(&size, &l));
    expect_corrupt("huge key length", l.kv[0], 8, 1ull << 40, DS4_ERANGE, l.kv[0], "key length");
    expect_corrupt("max key length", l.kv[0], 8, UINT64_MAX, DS4_ERANGE, l.kv[0], "key length");
    expect_corrupt("unknown value type", l.kv_type[0], 4, 13, DS4_EFORMAT, l.kv_type[0], "unknown value type 13");
    expect_corrupt("string too long", l.kv_value[0], 8, size, DS4_ERANGE, l.kv_value[0], "key 'k.s1'");
    expect_corrupt("max string length", l.kv_value[0], 8, UINT64_MAX, DS4_ERANGE, l.kv_value[0], "string length");
    expect_corrupt("array of unknown type", l.kv_value[1], 4, 77, DS4_EFORMAT, l.kv_value[1],
                   "unknown array element type 77");
    expect_corrupt("nested array", l.kv_value[1], 4, DS4_GGUF_ARRAY, DS4_EUNSUPPORTED, l.kv_value[1], "nested");
    expect_corrupt("array count past the end", l.arr_count, 8, size, DS4_ERANGE, l.arr_count, "array of");
    expect_corrupt("array count overflowing", l.arr_count, 8, 1ull << 63, DS4_ERANGE, l.arr_count, "array of");
    expect_corrupt("string array count", l.sarr_count, 8, size / 8, DS4_ERANGE, l.sarr_count, "array of");
    expect_corrupt("string array element", l.sarr_elem1, 8, 1ull << 50, DS4_ERANGE, l.sarr_elem1,
                   "array string length");
    expect_corrupt("bool value 2", l.kv_value[3], 1, 2, DS4_EFORMAT, l.kv_value[3], "bool value 2");
    expect_corrupt("alignment zero", l.kv_value[5], 4, 0, DS4_EFORMAT, l.kv[5], "general.alignment");
    expect_corrupt("alignment 48", l.kv_value[5], 4, 48, DS4_EFORMAT, l.kv[5], "power of two");
    expect_corrupt("alignment as i32", l.kv_type[5], 4, DS4_GGUF_I32, DS4_EFORMAT, l.kv[5], "expected u32");
    /* "k.s2" -> "k.s1": a duplicate key, reported where the second starts. */
    expect_corrupt("duplicate key", l.kv[1] + 8 + 3, 1, '1', DS4_EFORMAT, l.kv[1],
                   "duplicate key (first at offset 24)");
    expect_corrupt("NUL in key", l.kv[1] + 8 + 1, 1, 0, DS4_EFORMAT, l.kv[1], "NUL byte");
}

static void test_bool_array_element_is_checked(void **state) {
    (void)state;
    bbuf b = {0};
    bb_u32(&b, DS4_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 1);
    bb_str(&b, "b");
    bb_u32(&b, DS4_GGUF_ARRAY);
    bb_u32(&b, DS4_GGUF_BOOL);
    bb_u64(&b, 3);
    bb_u8(&b, 1);
    bb_u8(&b, 0);
    uint64_t bad = b.n;
    bb_u8(&b, 5);
    ds4_err err;
    assert_null(ds4_gguf_open_buffer(b.p, b.n, "m", &err));
    assert_int_equal(err.code, DS4_EFORMAT);
    char want[64];
    snprintf(want, sizeof(want), "m: offset %llu: key 'b': bool element 2", (unsigned long long)bad);
    assert_non_null(strstr(err.msg, want));
    free(b.p);
}

static void test_tensor_info_corruption(void **state) {
    (void)state;
    small_layout l;
    size_t size;
    free(build_small(&size, &l));
    expect_corrupt("ndim 0", l.t_ndim[0], 4, 0, DS4_EFORMAT, l.t_ndim[0], "ndim 0");
    expect_corrupt("ndim 9", l.t_ndim[0], 4, 9, DS4_EFORMAT, l.t_ndim[0], "ndim 9");
    expect_corrupt("zero dim", l.t_dims[0] + 8, 8, 0, DS4_EFORMAT, l.t_dims[0] + 8, "dimension 1 is zero");
    expect_corrupt("dim over int64", l.t_dims[0], 8, 1ull << 63, DS4_ERANGE, l.t_dims[0], "overflows");
    expect_corrupt("unknown type 4", l.t_type[0], 4, 4, DS4_EFORMAT, l.t_type[0], "unknown tensor type 4");
    expect_corrupt("unknown type 99", l.t_type[0], 4, 99, DS4_EFORMAT, l.t_type[0], "unknown tensor type 99");
    expect_corrupt("partial block", l.t_dims[1], 8, 16, DS4_EFORMAT, l.t_type[1], "not a whole number of q8_0 blocks");
    expect_corrupt("misaligned data", l.t_offset[1], 8, 36, DS4_EFORMAT, l.t_offset[1],
                   "not a multiple of the alignment 32");
    expect_corrupt("data past the end", l.t_offset[1], 8, 64, DS4_ERANGE, l.t_offset[1], "past the end");
    expect_corrupt("data far past the end", l.t_offset[1], 8, 1ull << 62, DS4_ERANGE, l.t_offset[1], "past the end");
    expect_corrupt("max data offset", l.t_offset[1], 8, UINT64_MAX - 31, DS4_ERANGE, l.t_offset[1], "past the end");
    expect_corrupt("overlap", l.t_offset[1], 8, 0, DS4_EFORMAT, l.t_offset[1], "overlaps tensor 't1'");
    expect_corrupt("duplicate tensor", l.t[1] + 9, 1, '1', DS4_EFORMAT, l.t[1], "duplicate tensor name");
    expect_corrupt("tensor name length", l.t[0], 8, 1ull << 62, DS4_ERANGE, l.t[0], "tensor name length");
}

/* Cases that need more than one field changed. */
static void test_multi_field_corruption(void **state) {
    (void)state;
    small_layout l;
    size_t size;
    ds4_err err;
    char want[96];

    /* Element count over INT64_MAX from two dims that each fit. */
    uint8_t *buf = build_small(&size, &l);
    patch_u64(buf, l.t_dims[0], 1ull << 32);
    patch_u64(buf, l.t_dims[0] + 8, 1ull << 31);
    assert_null(ds4_gguf_open_buffer(buf, size, "f", &err));
    assert_int_equal(err.code, DS4_ERANGE);
    snprintf(want, sizeof(want), "f: offset %llu: tensor 't1': element count overflows at dimension 1",
             (unsigned long long)(l.t_dims[0] + 8));
    assert_non_null(strstr(err.msg, want));
    free(buf);

    /* A byte size that overflows 64 bits: 2^62 f64 elements. */
    buf = build_small(&size, &l);
    patch_u64(buf, l.t_dims[0], 1ull << 62);
    patch_u64(buf, l.t_dims[0] + 8, 1);
    patch_u32(buf, l.t_type[0], 28);
    assert_null(ds4_gguf_open_buffer(buf, size, "f", &err));
    assert_int_equal(err.code, DS4_ERANGE);
    snprintf(want, sizeof(want), "f: offset %llu: tensor 't1': byte size", (unsigned long long)l.t_type[0]);
    assert_non_null(strstr(err.msg, want));
    free(buf);

    /* Overlap without a shared start: t1 grows into t2's bytes. */
    buf = build_small(&size, &l);
    patch_u64(buf, l.t_dims[0] + 8, 3);
    assert_null(ds4_gguf_open_buffer(buf, size, "f", &err));
    assert_int_equal(err.code, DS4_EFORMAT);
    snprintf(want, sizeof(want), "f: offset %llu: tensor 't2': data [32, 66) overlaps tensor 't1' data [0, 48)",
             (unsigned long long)l.t_offset[1]);
    assert_non_null(strstr(err.msg, want));
    free(buf);
}

static void test_tiny_inputs(void **state) {
    (void)state;
    ds4_err err;
    assert_null(ds4_gguf_open_buffer(NULL, 0, NULL, &err));
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_non_null(strstr(err.msg, "<memory>: offset 0: truncated magic"));
    const uint8_t three[3] = {'G', 'G', 'U'};
    assert_null(ds4_gguf_open_buffer(three, 3, "x", &err));
    assert_non_null(strstr(err.msg, "x: offset 0: truncated magic: needs 4 bytes, 3 left"));
    assert_null(ds4_gguf_open_buffer(NULL, 10, "x", &err));
    assert_int_equal(err.code, DS4_EINVAL);
    assert_null(ds4_gguf_open_buffer(three, 3, "x", NULL)); /* a NULL err is allowed */
}

/* An empty file (no kv, no tensors) and one that ends without padding. */
static void test_minimal_files(void **state) {
    (void)state;
    bbuf b = {0};
    bb_u32(&b, DS4_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 0);
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open_buffer(b.p, b.n, "empty", &err);
    assert_non_null(g);
    assert_int_equal(g->n_kv, 0);
    assert_int_equal(g->n_tensors, 0);
    assert_int_equal(g->data_offset, 32);
    assert_null(ds4_gguf_find_kv(g, "general.alignment"));
    ds4_gguf_close(g);
    free(b.p);
}

/* -------------------------------------------------------------- lookups */

static void test_lookups_many_names(void **state) {
    (void)state;
    enum { N = 3000 };
    bbuf b = {0};
    bb_u32(&b, DS4_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, N);
    bb_u64(&b, N);
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "key.%d", i);
        bb_str(&b, name);
        bb_u32(&b, DS4_GGUF_U32);
        bb_u32(&b, (uint32_t)i * 3);
    }
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "blk.%d.weight", i);
        bb_str(&b, name);
        bb_u32(&b, 1);
        bb_u64(&b, 1);
        bb_u32(&b, DS4_TYPE_F32);
        bb_u64(&b, (uint64_t)i * 32);
    }
    bb_pad(&b, 32);
    for (int i = 0; i < N; i++) {
        float v = (float)i;
        bb_put(&b, &v, 4);
        bb_pad(&b, 32);
    }
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open_buffer(b.p, b.n, "many", &err);
    if (!g) fail_msg("%s", err.msg);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "key.%d", i);
        uint32_t v;
        assert_int_equal(ds4_gguf_get_u32(g, name, &v, &err), 0);
        assert_int_equal(v, (uint32_t)i * 3);
        assert_ptr_equal(ds4_gguf_find_kv(g, name), &g->kv[i]);
        snprintf(name, sizeof(name), "blk.%d.weight", i);
        const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, name);
        assert_ptr_equal(t, &g->tensors[i]);
        float f;
        memcpy(&f, t->data, 4);
        assert_true(f == (float)i);
    }
    assert_null(ds4_gguf_find_kv(g, "key.3000"));
    assert_null(ds4_gguf_find_kv(g, ""));
    assert_null(ds4_gguf_find_tensor(g, "blk.-1.weight"));
    ds4_gguf_close(g);
    free(b.p);
}

/* -------------------------------------------------------------- getters */

static ds4_gguf *getter_file(bbuf *b) {
    memset(b, 0, sizeof(*b));
    bb_u32(b, DS4_GGUF_MAGIC);
    bb_u32(b, 3);
    bb_u64(b, 0);
    bb_u64(b, 9);
    bb_str(b, "u8");
    bb_u32(b, DS4_GGUF_U8);
    bb_u8(b, 250);
    bb_str(b, "neg");
    bb_u32(b, DS4_GGUF_I16);
    int16_t n = -5;
    bb_put(b, &n, 2);
    bb_str(b, "big");
    bb_u32(b, DS4_GGUF_U64);
    bb_u64(b, 1ull << 40);
    bb_str(b, "huge");
    bb_u32(b, DS4_GGUF_U64);
    bb_u64(b, UINT64_MAX);
    bb_str(b, "f32");
    bb_u32(b, DS4_GGUF_F32);
    float f = 0.25f;
    bb_put(b, &f, 4);
    bb_str(b, "str");
    bb_u32(b, DS4_GGUF_STRING);
    bb_str(b, "s");
    bb_str(b, "bool");
    bb_u32(b, DS4_GGUF_BOOL);
    bb_u8(b, 0);
    bb_str(b, "i64");
    bb_u32(b, DS4_GGUF_I64);
    bb_u64(b, (uint64_t)INT64_MIN);
    bb_str(b, "arr");
    bb_u32(b, DS4_GGUF_ARRAY);
    bb_u32(b, DS4_GGUF_F32);
    bb_u64(b, 2);
    float fs[2] = {1.5f, -2.75f};
    bb_put(b, fs, 8);
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open_buffer(b->p, b->n, "get", &err);
    if (!g) fail_msg("%s", err.msg);
    return g;
}

static void test_getters(void **state) {
    (void)state;
    bbuf b;
    ds4_gguf *g = getter_file(&b);
    ds4_err err;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    double f;
    bool bo;
    ds4_str s;
    const ds4_gguf_array *a;

    assert_int_equal(ds4_gguf_get_u32(g, "u8", &u32, &err), 0);
    assert_int_equal(u32, 250);
    assert_int_equal(ds4_gguf_get_i64(g, "neg", &i64, &err), 0);
    assert_int_equal(i64, -5);
    assert_int_equal(ds4_gguf_get_u32(g, "neg", &u32, &err), -1);
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_non_null(strstr(err.msg, "key 'neg' value -5 does not fit in u32"));
    assert_int_equal(ds4_gguf_get_u64(g, "neg", &u64, &err), -1);
    assert_int_equal(ds4_gguf_get_u32(g, "big", &u32, &err), -1);
    assert_non_null(strstr(err.msg, "does not fit in u32"));
    assert_int_equal(ds4_gguf_get_u64(g, "big", &u64, &err), 0);
    assert_int_equal(u64, 1ull << 40);
    assert_int_equal(ds4_gguf_get_i64(g, "huge", &i64, &err), -1);
    assert_int_equal(ds4_gguf_get_i64(g, "i64", &i64, &err), 0);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(ds4_gguf_get_f64(g, "f32", &f, &err), 0);
    assert_true(f == 0.25);
    assert_int_equal(ds4_gguf_get_f64(g, "big", &f, &err), 0);
    assert_true(f == 1099511627776.0);
    assert_int_equal(ds4_gguf_get_f64(g, "huge", &f, &err), -1); /* not exact in a double */
    assert_int_equal(ds4_gguf_get_f64(g, "str", &f, &err), -1);
    assert_non_null(strstr(err.msg, "has type str, expected a number"));
    assert_int_equal(ds4_gguf_get_u32(g, "f32", &u32, &err), -1);
    assert_non_null(strstr(err.msg, "key 'f32' has type f32, expected an integer"));
    assert_int_equal(ds4_gguf_get_bool(g, "bool", &bo, &err), 0);
    assert_false(bo);
    assert_int_equal(ds4_gguf_get_bool(g, "u8", &bo, &err), -1);
    assert_int_equal(ds4_gguf_get_str(g, "str", &s, &err), 0);
    assert_true(ds4_str_eq(s, "s"));
    assert_false(ds4_str_eq(s, "ss"));
    assert_int_equal(ds4_gguf_get_str(g, "bool", &s, &err), -1);
    assert_int_equal(ds4_gguf_get_arr(g, "arr", DS4_GGUF_F32, &a, &err), 0);
    assert_true(ds4_gguf_arr_f64(a, 0) == 1.5 && ds4_gguf_arr_f64(a, 1) == -2.75);
    assert_int_equal(ds4_gguf_arr_i64(a, 1), -2);
    assert_int_equal(ds4_gguf_get_arr(g, "arr", DS4_GGUF_VTYPE_COUNT, &a, &err), 0);
    assert_int_equal(ds4_gguf_get_arr(g, "arr", DS4_GGUF_I32, &a, &err), -1);
    assert_non_null(strstr(err.msg, "is an array of f32, expected i32"));
    assert_int_equal(ds4_gguf_get_arr(g, "str", DS4_GGUF_VTYPE_COUNT, &a, &err), -1);
    assert_int_equal(ds4_gguf_get_u32(g, "missing", &u32, &err), -1);
    assert_int_equal(err.code, DS4_ENOTFOUND);
    assert_non_null(strstr(err.msg, "get: key 'missing' not found"));
    ds4_gguf_close(g);
    free(b.p);
}

static void test_vtype_helpers(void **state) {
    (void)state;
    assert_int_equal(ds4_gguf_vtype_size(DS4_GGUF_BOOL), 1);
    assert_int_equal(ds4_gguf_vtype_size(DS4_GGUF_I16), 2);
    assert_int_equal(ds4_gguf_vtype_size(DS4_GGUF_F32), 4);
    assert_int_equal(ds4_gguf_vtype_size(DS4_GGUF_F64), 8);
    assert_int_equal(ds4_gguf_vtype_size(DS4_GGUF_STRING), 0);
    assert_int_equal(ds4_gguf_vtype_size(DS4_GGUF_ARRAY), 0);
    assert_string_equal(ds4_gguf_vtype_name(DS4_GGUF_U64), "u64");
    assert_string_equal(ds4_gguf_vtype_name(DS4_GGUF_VTYPE_COUNT), "invalid");
}

/* ------------------------------------------------------------ from files */

static void test_open_files(void **state) {
    (void)state;
    char *dir = make_temp_dir();
    assert_non_null(dir);
    ds4_err err;

    char *missing = path_in(dir, "missing.gguf");
    assert_null(ds4_gguf_open(missing, &err));
    assert_int_equal(err.code, DS4_ENOTFOUND);
    assert_non_null(strstr(err.msg, "missing.gguf: cannot open"));

    assert_null(ds4_gguf_open(dir, &err));
    assert_int_equal(err.code, DS4_EIO);
    assert_non_null(strstr(err.msg, "not a regular file"));

    char *empty = path_in(dir, "empty.gguf");
    FILE *f = fopen(empty, "wb");
    fclose(f);
    assert_null(ds4_gguf_open(empty, &err));
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_non_null(strstr(err.msg, "empty.gguf: offset 0: truncated magic"));

    small_layout lay;
    size_t size;
    uint8_t *buf = build_small(&size, &lay);
    char *good = path_in(dir, "good.gguf");
    f = fopen(good, "wb");
    fwrite(buf, 1, size, f);
    fclose(f);
    ds4_gguf *g = ds4_gguf_open(good, &err);
    assert_non_null(g);
    assert_int_equal(g->owns_map, 1);
    assert_string_equal(g->path, good);
    assert_int_equal(g->size, size);
    assert_memory_equal(ds4_gguf_find_tensor(g, "t2")->data, buf + lay.data_offset + 32, 34);
    ds4_gguf_close(g);

    /* A corrupt file on disk: the error names the path. */
    patch_u32(buf, lay.t_type[1], 200);
    f = fopen(good, "wb");
    fwrite(buf, 1, size, f);
    fclose(f);
    assert_null(ds4_gguf_open(good, &err));
    assert_non_null(strstr(err.msg, "good.gguf: offset "));
    assert_non_null(strstr(err.msg, "unknown tensor type 200"));

    free(buf);
    free(missing);
    free(empty);
    free(good);
    remove_temp_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_file_reads_back),
        cmocka_unit_test(test_every_truncation_fails_cleanly),
        cmocka_unit_test(test_header_corruption),
        cmocka_unit_test(test_metadata_corruption),
        cmocka_unit_test(test_bool_array_element_is_checked),
        cmocka_unit_test(test_tensor_info_corruption),
        cmocka_unit_test(test_multi_field_corruption),
        cmocka_unit_test(test_tiny_inputs),
        cmocka_unit_test(test_minimal_files),
        cmocka_unit_test(test_lookups_many_names),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_vtype_helpers),
        cmocka_unit_test(test_open_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
