/*
 * test_gguf_write.c - the streaming GGUF writer, checked through the
 * reader: every value type and array (empty ones included) round-trips,
 * tensors of every type in the geometry table keep their bytes, alignment
 * variants lay data out correctly, chunked writes give the same file,
 * copy_kv reproduces entries exactly, and every misuse or I/O failure is
 * reported at close with no file left behind (and an existing file kept).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "format/gguf.h"
#include "format/quants.h"
#include "test_gguf_util.h"

static char *tmp_dir;

static int setup(void **state) {
    (void)state;
    tmp_dir = make_temp_dir();
    return tmp_dir ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    remove_temp_dir(tmp_dir);
    return 0;
}

static ds4_gguf *reopen(const char *path) {
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open(path, &err);
    if (!g) fail_msg("reopen %s: %s", path, err.msg);
    return g;
}

static void close_ok(ds4_gguf_writer *w) {
    ds4_err err;
    if (ds4_gguf_writer_close(w, &err) != 0) fail_msg("writer close: %s", err.msg);
}

static uint8_t pattern(uint64_t seed, uint64_t j) { return (uint8_t)(seed * 131 + j * 29 + (j >> 7)); }

/* ------------------------------------------------------------ metadata */

static const uint8_t arr_u8[] = {0, 1, 255};
static const int8_t arr_i8[] = {-128, 0, 127};
static const uint16_t arr_u16[] = {0, 65535};
static const int16_t arr_i16[] = {-32768, 1, 32767};
static const uint32_t arr_u32[] = {0, UINT32_MAX};
static const int32_t arr_i32[] = {INT32_MIN, -1, INT32_MAX};
static const float arr_f32[] = {0.1f, -0.0f, 3.4028234663852886e38f};
static const uint8_t arr_bool[] = {1, 0, 0, 1};
static const uint64_t arr_u64[] = {UINT64_MAX, 0, 1};
static const int64_t arr_i64[] = {INT64_MIN, INT64_MAX};
static const double arr_f64[] = {-1e300, 5e-324, 3.141592653589793};

typedef struct fixed_arr {
    const char *key;
    ds4_gguf_vtype type;
    const void *data;
    uint64_t count;
} fixed_arr;

static const fixed_arr fixed_arrays[] = {
    {"a.u8", DS4_GGUF_U8, arr_u8, 3},    {"a.i8", DS4_GGUF_I8, arr_i8, 3},       {"a.u16", DS4_GGUF_U16, arr_u16, 2},
    {"a.i16", DS4_GGUF_I16, arr_i16, 3}, {"a.u32", DS4_GGUF_U32, arr_u32, 2},    {"a.i32", DS4_GGUF_I32, arr_i32, 3},
    {"a.f32", DS4_GGUF_F32, arr_f32, 3}, {"a.bool", DS4_GGUF_BOOL, arr_bool, 4}, {"a.u64", DS4_GGUF_U64, arr_u64, 3},
    {"a.i64", DS4_GGUF_I64, arr_i64, 2}, {"a.f64", DS4_GGUF_F64, arr_f64, 3},
};
#define N_FIXED (sizeof(fixed_arrays) / sizeof(fixed_arrays[0]))

static const char *const strs[] = {"one", "", "tr\xc3\xa9s", "with\nnewline"};
static const char raw_bytes[] = {'a', 0, (char)0xff, 'b'};

static void write_all_values(ds4_gguf_writer *w) {
    assert_int_equal(ds4_gguf_w_u8(w, "s.u8", 255), 0);
    assert_int_equal(ds4_gguf_w_i8(w, "s.i8", -128), 0);
    assert_int_equal(ds4_gguf_w_u16(w, "s.u16", 65535), 0);
    assert_int_equal(ds4_gguf_w_i16(w, "s.i16", -32768), 0);
    assert_int_equal(ds4_gguf_w_u32(w, "s.u32", UINT32_MAX), 0);
    assert_int_equal(ds4_gguf_w_i32(w, "s.i32", INT32_MIN), 0);
    assert_int_equal(ds4_gguf_w_u64(w, "s.u64", UINT64_MAX), 0);
    assert_int_equal(ds4_gguf_w_i64(w, "s.i64", INT64_MIN), 0);
    assert_int_equal(ds4_gguf_w_f32(w, "s.f32", -1.25e-3f), 0);
    assert_int_equal(ds4_gguf_w_f64(w, "s.f64", 1.0 / 3.0), 0);
    assert_int_equal(ds4_gguf_w_bool(w, "s.true", true), 0);
    assert_int_equal(ds4_gguf_w_bool(w, "s.false", false), 0);
    assert_int_equal(ds4_gguf_w_str(w, "s.str", "h\xc3\xa9llo"), 0);
    assert_int_equal(ds4_gguf_w_str(w, "s.empty", ""), 0);
    assert_int_equal(ds4_gguf_w_strn(w, "s.raw", raw_bytes, sizeof(raw_bytes)), 0);
    assert_int_equal(ds4_gguf_w_strn(w, "s.null0", NULL, 0), 0);
    for (size_t i = 0; i < N_FIXED; i++) {
        const fixed_arr *a = &fixed_arrays[i];
        assert_int_equal(ds4_gguf_w_arr(w, a->key, a->type, a->data, a->count), 0);
        char empty_key[32];
        snprintf(empty_key, sizeof(empty_key), "e.%s", ds4_gguf_vtype_name(a->type));
        assert_int_equal(ds4_gguf_w_arr(w, empty_key, a->type, NULL, 0), 0);
    }
    assert_int_equal(ds4_gguf_w_arr_str(w, "a.str", strs, NULL, 4), 0);
    const char *with_lens[] = {raw_bytes, "xyz"};
    const uint64_t lens[] = {sizeof(raw_bytes), 2};
    assert_int_equal(ds4_gguf_w_arr_str(w, "a.strn", with_lens, lens, 2), 0);
    assert_int_equal(ds4_gguf_w_arr_str(w, "e.str", NULL, NULL, 0), 0);
}

static void check_all_values(const ds4_gguf *g) {
    ds4_err err;
    const ds4_gguf_kv *kv;
/* clang-format off */
#define SCALAR(key, field, vt, want)                    \
    kv = ds4_gguf_find_kv(g, key);                      \
    assert_non_null(kv);                                \
    assert_int_equal(kv->value.type, vt);               \
    assert_true(kv->value.field == (want));
    /* clang-format on */
    SCALAR("s.u8", u, DS4_GGUF_U8, 255);
    SCALAR("s.i8", i, DS4_GGUF_I8, -128);
    SCALAR("s.u16", u, DS4_GGUF_U16, 65535);
    SCALAR("s.i16", i, DS4_GGUF_I16, -32768);
    SCALAR("s.u32", u, DS4_GGUF_U32, UINT32_MAX);
    SCALAR("s.i32", i, DS4_GGUF_I32, INT32_MIN);
    SCALAR("s.u64", u, DS4_GGUF_U64, UINT64_MAX);
    SCALAR("s.i64", i, DS4_GGUF_I64, INT64_MIN);
    SCALAR("s.f32", f, DS4_GGUF_F32, (double)-1.25e-3f);
    SCALAR("s.f64", f, DS4_GGUF_F64, 1.0 / 3.0);
    SCALAR("s.true", b, DS4_GGUF_BOOL, true);
    SCALAR("s.false", b, DS4_GGUF_BOOL, false);
#undef SCALAR
    ds4_str s;
    assert_int_equal(ds4_gguf_get_str(g, "s.str", &s, &err), 0);
    assert_true(ds4_str_eq(s, "h\xc3\xa9llo"));
    assert_int_equal(ds4_gguf_get_str(g, "s.empty", &s, &err), 0);
    assert_int_equal(s.len, 0);
    assert_int_equal(ds4_gguf_get_str(g, "s.raw", &s, &err), 0);
    assert_int_equal(s.len, sizeof(raw_bytes));
    assert_memory_equal(s.ptr, raw_bytes, sizeof(raw_bytes));
    assert_int_equal(ds4_gguf_get_str(g, "s.null0", &s, &err), 0);
    assert_int_equal(s.len, 0);

    const ds4_gguf_array *a;
    for (size_t i = 0; i < N_FIXED; i++) {
        const fixed_arr *f = &fixed_arrays[i];
        assert_int_equal(ds4_gguf_get_arr(g, f->key, f->type, &a, &err), 0);
        assert_int_equal(a->count, f->count);
        assert_memory_equal(a->data, f->data, f->count * ds4_gguf_vtype_size(f->type));
        char empty_key[32];
        snprintf(empty_key, sizeof(empty_key), "e.%s", ds4_gguf_vtype_name(f->type));
        assert_int_equal(ds4_gguf_get_arr(g, empty_key, f->type, &a, &err), 0);
        assert_int_equal(a->count, 0);
    }
    assert_int_equal(ds4_gguf_get_arr(g, "a.i64", DS4_GGUF_I64, &a, &err), 0);
    assert_true(ds4_gguf_arr_i64(a, 0) == INT64_MIN && ds4_gguf_arr_i64(a, 1) == INT64_MAX);
    assert_int_equal(ds4_gguf_get_arr(g, "a.f64", DS4_GGUF_F64, &a, &err), 0);
    assert_true(ds4_gguf_arr_f64(a, 1) == 5e-324);
    assert_int_equal(ds4_gguf_get_arr(g, "a.str", DS4_GGUF_STRING, &a, &err), 0);
    assert_int_equal(a->count, 4);
    for (int i = 0; i < 4; i++) assert_true(ds4_str_eq(a->strs[i], strs[i]));
    assert_int_equal(ds4_gguf_get_arr(g, "a.strn", DS4_GGUF_STRING, &a, &err), 0);
    assert_int_equal(a->strs[0].len, sizeof(raw_bytes));
    assert_memory_equal(a->strs[0].ptr, raw_bytes, sizeof(raw_bytes));
    assert_true(ds4_str_eq(a->strs[1], "xy"));
    assert_int_equal(ds4_gguf_get_arr(g, "e.str", DS4_GGUF_STRING, &a, &err), 0);
    assert_int_equal(a->count, 0);
    assert_null(a->strs);
}

static void test_round_trip_all_values(void **state) {
    (void)state;
    char *path = path_in(tmp_dir, "values.gguf");
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_non_null(w);
    write_all_values(w);
    close_ok(w);
    assert_int_equal(count_entries(tmp_dir, "values.gguf"), 1);

    ds4_gguf *g = reopen(path);
    assert_int_equal(g->n_tensors, 0);
    assert_int_equal(g->alignment, 32);
    assert_null(ds4_gguf_find_kv(g, "general.alignment"));
    assert_int_equal(g->size % 32, 0);
    check_all_values(g);

    /* copy_kv of every entry reproduces the file byte for byte. */
    char *copy_path = path_in(tmp_dir, "copy.gguf");
    w = ds4_gguf_writer_open(copy_path, 0, &err);
    for (uint64_t i = 0; i < g->n_kv; i++) assert_int_equal(ds4_gguf_w_copy_kv(w, &g->kv[i]), 0);
    close_ok(w);
    size_t n1, n2;
    uint8_t *b1 = read_whole_file(path, &n1), *b2 = read_whole_file(copy_path, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    ds4_gguf_close(g);
    unlink(copy_path);
    unlink(path);
    free(copy_path);
    free(path);
}

/* copy_kv keeps stored bits exactly, even signalling NaNs that a float ->
 * double -> float conversion would quiet. */
static void test_copy_kv_keeps_exact_bits(void **state) {
    (void)state;
    bbuf b = {0};
    bb_u32(&b, DS4_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, 0);
    bb_u64(&b, 3);
    bb_str(&b, "f32.snan");
    bb_u32(&b, DS4_GGUF_F32);
    bb_u32(&b, 0x7f800001u);
    bb_str(&b, "f64.snan");
    bb_u32(&b, DS4_GGUF_F64);
    bb_u64(&b, 0x7ff0000000000001ull);
    bb_str(&b, "f32.negzero");
    bb_u32(&b, DS4_GGUF_F32);
    bb_u32(&b, 0x80000000u);
    bb_pad(&b, 32);
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open_buffer(b.p, b.n, "bits", &err);
    assert_non_null(g);
    char *path = path_in(tmp_dir, "bits.gguf");
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    for (uint64_t i = 0; i < g->n_kv; i++) assert_int_equal(ds4_gguf_w_copy_kv(w, &g->kv[i]), 0);
    close_ok(w);
    size_t n;
    uint8_t *out = read_whole_file(path, &n);
    assert_int_equal(n, b.n);
    assert_memory_equal(out, b.p, n);
    free(out);
    ds4_gguf_close(g);
    unlink(path);
    free(path);
    free(b.p);
}

/* ------------------------------------------------------------- tensors */

static void test_alignment_variants(void **state) {
    (void)state;
    const uint32_t aligns[] = {0, 1, 2, 8, 32, 64, 4096};
    const uint64_t sizes[] = {3, 40, 1, 97}; /* i8 elements, not multiples of the alignments */
    for (size_t k = 0; k < sizeof(aligns) / sizeof(aligns[0]); k++) {
        char *path = path_in(tmp_dir, "align.gguf");
        ds4_err err;
        ds4_gguf_writer *w = ds4_gguf_writer_open(path, aligns[k], &err);
        assert_non_null(w);
        assert_int_equal(ds4_gguf_w_str(w, "general.name", "align"), 0);
        char name[16];
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof(name), "t%d", i);
            assert_int_equal(ds4_gguf_w_tensor(w, name, 1, &sizes[i], 24 /* i8 */), 0);
        }
        for (int i = 0; i < 4; i++) {
            uint8_t buf[128];
            for (uint64_t j = 0; j < sizes[i]; j++) buf[j] = pattern((uint64_t)i, j);
            assert_int_equal(ds4_gguf_w_data(w, buf, sizes[i]), 0);
        }
        close_ok(w);

        ds4_gguf *g = reopen(path);
        uint32_t a = aligns[k] ? aligns[k] : 32;
        assert_int_equal(g->alignment, a);
        uint32_t stored;
        if (aligns[k]) {
            assert_int_equal(ds4_gguf_get_u32(g, "general.alignment", &stored, &err), 0);
            assert_int_equal(stored, a);
        } else {
            assert_null(ds4_gguf_find_kv(g, "general.alignment"));
        }
        assert_int_equal(g->data_offset % a, 0);
        uint64_t expect_off = 0;
        for (int i = 0; i < 4; i++) {
            const ds4_gguf_tensor *t = &g->tensors[i];
            assert_int_equal(t->offset, expect_off);
            assert_int_equal(t->nbytes, sizes[i]);
            for (uint64_t j = 0; j < sizes[i]; j++)
                assert_int_equal(((const uint8_t *)t->data)[j], pattern((uint64_t)i, j));
            expect_off += (sizes[i] + a - 1) / a * a;
        }
        /* The last tensor is padded too, as GGML and gguf-py do. */
        assert_int_equal(g->size, g->data_offset + expect_off);
        ds4_gguf_close(g);
        unlink(path);
        free(path);
    }
}

static void test_every_type_in_geometry_table(void **state) {
    (void)state;
    char *path = path_in(tmp_dir, "types.gguf");
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    uint32_t ids[64];
    uint64_t nbytes[64];
    int n = 0;
    char name[32];
    for (uint32_t id = 0; id < 64; id++) {
        const ds4_type_info *ti = ds4_type_get(id);
        if (!ti) continue;
        uint64_t ne[3] = {(uint64_t)ti->block_elems * 2, 3, 1};
        snprintf(name, sizeof(name), "t.%s", ti->name);
        assert_int_equal(ds4_gguf_w_tensor(w, name, 3, ne, id), 0);
        ids[n] = id;
        nbytes[n] = ti->block_bytes * 6;
        n++;
    }
    assert_true(n >= 30);
    for (int i = 0; i < n; i++) {
        uint8_t *buf = malloc(nbytes[i]);
        for (uint64_t j = 0; j < nbytes[i]; j++) buf[j] = pattern(ids[i], j);
        assert_int_equal(ds4_gguf_w_data(w, buf, nbytes[i]), 0);
        free(buf);
    }
    close_ok(w);

    ds4_gguf *g = reopen(path);
    assert_int_equal(g->n_tensors, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        const ds4_type_info *ti = ds4_type_get(ids[i]);
        snprintf(name, sizeof(name), "t.%s", ti->name);
        assert_string_equal(t->name, name);
        assert_ptr_equal(ds4_gguf_find_tensor(g, name), t);
        assert_int_equal(t->type, ids[i]);
        assert_int_equal(t->ndim, 3);
        assert_int_equal(t->nelements, (uint64_t)ti->block_elems * 6);
        assert_int_equal(t->nbytes, nbytes[i]);
        for (uint64_t j = 0; j < nbytes[i]; j++) assert_int_equal(((const uint8_t *)t->data)[j], pattern(ids[i], j));
    }
    ds4_gguf_close(g);
    unlink(path);
    free(path);
}

/* Data given in odd-sized pieces gives the same file as whole tensors. */
static void test_chunked_data_same_file(void **state) {
    (void)state;
    const uint64_t ne_a[2] = {64, 5}, ne_b[1] = {7}, ne_c[1] = {256 * 3};
    uint8_t data[3][1000];
    const uint64_t sizes[3] = {64 * 5 * 34 / 32, 7 * 4, 3 * 144};
    for (int t = 0; t < 3; t++)
        for (uint64_t j = 0; j < sizes[t]; j++) data[t][j] = pattern((uint64_t)t + 10, j);
    uint8_t *files[2];
    size_t lens[2];
    for (int chunked = 0; chunked < 2; chunked++) {
        char *path = path_in(tmp_dir, chunked ? "chunked.gguf" : "whole.gguf");
        ds4_err err;
        ds4_gguf_writer *w = ds4_gguf_writer_open(path, 64, &err);
        assert_int_equal(ds4_gguf_w_u32(w, "x", 1), 0);
        assert_int_equal(ds4_gguf_w_tensor(w, "a", 2, ne_a, DS4_TYPE_Q8_0), 0);
        assert_int_equal(ds4_gguf_w_tensor(w, "b", 1, ne_b, DS4_TYPE_F32), 0);
        assert_int_equal(ds4_gguf_w_tensor(w, "c", 1, ne_c, DS4_TYPE_Q4_K), 0);
        for (int t = 0; t < 3; t++) {
            if (!chunked) {
                assert_int_equal(ds4_gguf_w_data(w, data[t], sizes[t]), 0);
                continue;
            }
            uint64_t done = 0, step = 1;
            while (done < sizes[t]) {
                uint64_t k = sizes[t] - done < step ? sizes[t] - done : step;
                assert_int_equal(ds4_gguf_w_data(w, data[t] + done, k), 0);
                assert_int_equal(ds4_gguf_w_data(w, data[t], 0), 0);
                done += k;
                step = step * 3 + 1;
            }
        }
        close_ok(w);
        files[chunked] = read_whole_file(path, &lens[chunked]);
        unlink(path);
        free(path);
    }
    assert_int_equal(lens[0], lens[1]);
    assert_memory_equal(files[0], files[1], lens[0]);
    free(files[0]);
    free(files[1]);
}

/* A tensor larger than the writer's buffer goes straight to the file. */
static void test_large_tensor(void **state) {
    (void)state;
    const uint64_t n = 3u << 20;
    uint8_t *buf = malloc(n);
    for (uint64_t j = 0; j < n; j++) buf[j] = pattern(5, j);
    char *path = path_in(tmp_dir, "large.gguf");
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    const uint64_t small = 5, big = n;
    assert_int_equal(ds4_gguf_w_tensor(w, "small", 1, &small, 24), 0);
    assert_int_equal(ds4_gguf_w_tensor(w, "big", 1, &big, 24), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, small), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, big), 0);
    close_ok(w);
    ds4_gguf *g = reopen(path);
    assert_memory_equal(ds4_gguf_find_tensor(g, "small")->data, buf, small);
    assert_memory_equal(ds4_gguf_find_tensor(g, "big")->data, buf, big);
    ds4_gguf_close(g);
    unlink(path);
    free(path);
    free(buf);
}

/* -------------------------------------------------------------- errors */

/* Close must fail with `code` and a message containing `needle`, leaving
 * no err.gguf file (final or temporary) behind. */
static void expect_close_error(ds4_gguf_writer *w, ds4_errcode code, const char *needle) {
    ds4_err err;
    assert_int_equal(ds4_gguf_writer_close(w, &err), -1);
    if (err.code != code)
        fail_msg("code %s, expected %s: %s", ds4_errcode_name(err.code), ds4_errcode_name(code), err.msg);
    if (!strstr(err.msg, needle)) fail_msg("'%s' does not mention '%s'", err.msg, needle);
    assert_int_equal(count_entries(tmp_dir, "err.gguf"), 0);
}

static ds4_gguf_writer *fresh(uint32_t alignment) {
    char *path = path_in(tmp_dir, "err.gguf");
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, alignment, &err);
    if (!w) fail_msg("%s", err.msg);
    free(path);
    return w;
}

static void test_writer_metadata_errors(void **state) {
    (void)state;
    ds4_gguf_writer *w = fresh(0);
    assert_int_equal(ds4_gguf_w_u32(w, "k", 1), 0);
    assert_int_equal(ds4_gguf_w_str(w, "k", "again"), -1);
    assert_int_equal(ds4_gguf_w_u32(w, "other", 1), -1); /* fails fast after an error */
    expect_close_error(w, DS4_EINVAL, "err.gguf: duplicate key 'k'");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_u16(w, "general.alignment", 64), -1);
    expect_close_error(w, DS4_EINVAL, "'general.alignment' must be u32, got u16");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_u32(w, "general.alignment", 48), -1);
    expect_close_error(w, DS4_EINVAL, "48 is not a nonzero power of two");

    w = fresh(64);
    assert_int_equal(ds4_gguf_w_u32(w, "general.alignment", 128), -1);
    expect_close_error(w, DS4_EINVAL, "opened with alignment 64");

    w = fresh(0);
    uint64_t one = 1;
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 1, &one, 0), 0);
    float f = 1;
    assert_int_equal(ds4_gguf_w_data(w, &f, 4), 0);
    assert_int_equal(ds4_gguf_w_u32(w, "late", 1), -1);
    expect_close_error(w, DS4_EINVAL, "key 'late' added after tensor data started");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_arr(w, "a", DS4_GGUF_STRING, NULL, 0), -1);
    expect_close_error(w, DS4_EINVAL, "not a fixed-size array element type");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_str(w, NULL, "x"), -1);
    expect_close_error(w, DS4_EINVAL, "metadata key is NULL");

    w = fresh(0);
    const uint8_t bools[3] = {1, 0, 2};
    assert_int_equal(ds4_gguf_w_arr(w, "b", DS4_GGUF_BOOL, bools, 3), -1);
    expect_close_error(w, DS4_EINVAL, "key 'b': bool element 2 is 2, not 0 or 1");

    /* Calls on a writer that failed to open are harmless. */
    assert_int_equal(ds4_gguf_w_u32(NULL, "k", 1), -1);
    assert_int_equal(ds4_gguf_w_str(NULL, "k", "v"), -1);
    assert_int_equal(ds4_gguf_w_arr_str(NULL, "k", NULL, NULL, 0), -1);
    assert_int_equal(ds4_gguf_w_tensor(NULL, "t", 0, NULL, 0), -1);
    assert_int_equal(ds4_gguf_w_data(NULL, "x", 1), -1);

    ds4_err err;
    char *path = path_in(tmp_dir, "x.gguf");
    assert_null(ds4_gguf_writer_open(path, 24, &err));
    assert_int_equal(err.code, DS4_EINVAL);
    assert_non_null(strstr(err.msg, "alignment 24 is not a power of two"));
    free(path);
    assert_int_equal(ds4_gguf_writer_close(NULL, &err), -1);
    assert_int_equal(err.code, DS4_EINVAL);
}

static void test_writer_alignment_kv_adopted(void **state) {
    (void)state;
    char *path = path_in(tmp_dir, "adopt.gguf");
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_int_equal(ds4_gguf_w_u32(w, "general.alignment", 128), 0);
    const uint64_t ne = 3;
    assert_int_equal(ds4_gguf_w_tensor(w, "a", 1, &ne, 24), 0);
    assert_int_equal(ds4_gguf_w_tensor(w, "b", 1, &ne, 24), 0);
    assert_int_equal(ds4_gguf_w_data(w, "abc", 3), 0);
    assert_int_equal(ds4_gguf_w_data(w, "def", 3), 0);
    close_ok(w);
    ds4_gguf *g = reopen(path);
    assert_int_equal(g->alignment, 128);
    assert_int_equal(g->n_kv, 1);
    assert_int_equal(g->tensors[1].offset, 128);
    assert_int_equal(g->size, g->data_offset + 256);
    ds4_gguf_close(g);
    unlink(path);
    free(path);
}

static void test_writer_tensor_errors(void **state) {
    (void)state;
    const uint64_t ne4[2] = {4, 2}, zero[2] = {4, 0}, q16[1] = {16};
    const uint64_t over[2] = {1ull << 62, 4};
    const uint64_t ne9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    ds4_gguf_writer *w;

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), 0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), -1);
    expect_close_error(w, DS4_EINVAL, "duplicate tensor 't'");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 0, ne4, 0), -1);
    expect_close_error(w, DS4_EINVAL, "tensor 't': ndim 0 is not in 1..8");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 9, ne9, 0), -1);
    expect_close_error(w, DS4_EINVAL, "ndim 9");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, zero, 0), -1);
    expect_close_error(w, DS4_EINVAL, "dimension 1 is zero");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 1, q16, 4), -1);
    expect_close_error(w, DS4_EINVAL, "unknown tensor type 4");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 1, q16, DS4_TYPE_Q8_0), -1);
    expect_close_error(w, DS4_EINVAL, "row of 16 elements is not a whole number of q8_0 blocks of 32");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, over, 0), -1);
    expect_close_error(w, DS4_ERANGE, "element count overflows");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, NULL, 2, ne4, 0), -1);
    expect_close_error(w, DS4_EINVAL, "tensor name is NULL");

    /* Data errors. */
    uint8_t buf[64] = {0};
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 20), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 20), -1);
    expect_close_error(w, DS4_EINVAL, "tensor 't': 40 bytes of data given, its size is 32");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 32), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 1), -1);
    expect_close_error(w, DS4_EINVAL, "1 bytes of tensor data beyond the last tensor");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), 0);
    assert_int_equal(ds4_gguf_w_tensor(w, "u", 2, ne4, 0), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 32), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 3), 0);
    expect_close_error(w, DS4_EINVAL, "tensor 'u' got 3 of its 32 bytes (1 of 2 tensors complete)");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), 0);
    expect_close_error(w, DS4_EINVAL, "tensor 't' got 0 of its 32 bytes");

    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 2, ne4, 0), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, 32), 0);
    assert_int_equal(ds4_gguf_w_tensor(w, "u", 2, ne4, 0), -1);
    expect_close_error(w, DS4_EINVAL, "tensor 'u' declared after tensor data started");
}

static void test_writer_abort_and_atomic_replace(void **state) {
    (void)state;
    char *path = path_in(tmp_dir, "keep.gguf");
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_int_equal(ds4_gguf_w_str(w, "version", "old"), 0);
    close_ok(w);

    /* An aborted writer and a failed one both leave the old file intact. */
    w = ds4_gguf_writer_open(path, 0, &err);
    assert_int_equal(ds4_gguf_w_str(w, "version", "new"), 0);
    assert_int_equal(count_entries(tmp_dir, "keep.gguf"), 2); /* the file and the temporary */
    ds4_gguf_writer_abort(w);
    ds4_gguf_writer_abort(NULL);
    w = ds4_gguf_writer_open(path, 0, &err);
    assert_int_equal(ds4_gguf_w_str(w, "version", "new"), 0);
    assert_int_equal(ds4_gguf_w_str(w, "version", "newer"), -1);
    assert_int_equal(ds4_gguf_writer_close(w, &err), -1);
    assert_int_equal(count_entries(tmp_dir, "keep.gguf"), 1);
    ds4_gguf *g = reopen(path);
    ds4_str s;
    assert_int_equal(ds4_gguf_get_str(g, "version", &s, &err), 0);
    assert_true(ds4_str_eq(s, "old"));
    ds4_gguf_close(g);

    /* A successful writer replaces it. */
    w = ds4_gguf_writer_open(path, 0, &err);
    assert_int_equal(ds4_gguf_w_str(w, "version", "new"), 0);
    close_ok(w);
    g = reopen(path);
    assert_int_equal(ds4_gguf_get_str(g, "version", &s, &err), 0);
    assert_true(ds4_str_eq(s, "new"));
    ds4_gguf_close(g);
    unlink(path);
    free(path);
}

static void test_writer_io_errors(void **state) {
    (void)state;
    ds4_err err;
    char *bad = path_in(tmp_dir, "no-such-dir/x.gguf");
    assert_null(ds4_gguf_writer_open(bad, 0, &err));
    assert_int_equal(err.code, DS4_EIO);
    assert_non_null(strstr(err.msg, "cannot create"));
    free(bad);
    assert_null(ds4_gguf_writer_open("", 0, &err));
    assert_int_equal(err.code, DS4_EINVAL);

    /* A file size limit makes write() fail with EFBIG part way through. */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 100000;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    ds4_gguf_writer *w = fresh(0);
    const uint64_t n = 4u << 20;
    uint8_t *buf = calloc(1, n);
    assert_int_equal(ds4_gguf_w_tensor(w, "big", 1, &n, 24), 0);
    assert_int_equal(ds4_gguf_w_data(w, buf, n), -1);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_handler);
    expect_close_error(w, DS4_EIO, "File too large");
    free(buf);
}

/* Holes: a file whose zeros are given as holes (in pieces, mixed with
 * data, one at the end) is byte for byte the file with the zeros written,
 * and where the filesystem keeps sparse files it takes less disk. */
static void test_holes_same_file(void **state) {
    (void)state;
    const uint64_t n = 4u << 20, head = 1000;
    uint8_t *buf = calloc(1, n);
    for (uint64_t j = 0; j < head; j++) buf[j] = pattern(9, j);
    const uint64_t small = 7;
    uint8_t *files[2];
    size_t lens[2];
    struct stat st[2];
    for (int holes = 0; holes < 2; holes++) {
        char *path = path_in(tmp_dir, holes ? "holes.gguf" : "zeros.gguf");
        ds4_err err;
        ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
        assert_int_equal(ds4_gguf_w_tensor(w, "big", 1, &n, 24), 0);
        assert_int_equal(ds4_gguf_w_tensor(w, "small", 1, &small, 24), 0);
        assert_int_equal(ds4_gguf_w_tensor(w, "tail", 1, &n, 24), 0);
        assert_int_equal(ds4_gguf_w_data(w, buf, head), 0);
        if (holes) {
            assert_int_equal(ds4_gguf_w_hole(w, 3), 0);
            assert_int_equal(ds4_gguf_w_hole(w, 0), 0);
            assert_int_equal(ds4_gguf_w_hole(w, n - head - 3), 0);
            assert_int_equal(ds4_gguf_w_data(w, buf, small), 0);
            assert_int_equal(ds4_gguf_w_hole(w, n), 0);
        } else {
            assert_int_equal(ds4_gguf_w_data(w, buf + head, n - head), 0);
            assert_int_equal(ds4_gguf_w_data(w, buf, small), 0);
            uint8_t *zeros = calloc(1, n);
            assert_int_equal(ds4_gguf_w_data(w, zeros, n), 0);
            free(zeros);
        }
        close_ok(w);
        assert_int_equal(stat(path, &st[holes]), 0);
        files[holes] = read_whole_file(path, &lens[holes]);
        ds4_gguf *g = reopen(path);
        assert_memory_equal(ds4_gguf_find_tensor(g, "big")->data, buf, n);
        ds4_gguf_close(g);
        unlink(path);
        free(path);
    }
    assert_int_equal(lens[0], lens[1]);
    assert_memory_equal(files[0], files[1], lens[0]);
    free(files[0]);
    free(files[1]);
    free(buf);

    /* A hole past the tensor's size, or after the last tensor, fails. */
    ds4_gguf_writer *w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 1, &small, 24), 0);
    assert_int_equal(ds4_gguf_w_hole(w, small + 1), -1);
    expect_close_error(w, DS4_EINVAL, "its size is 7");
    w = fresh(0);
    assert_int_equal(ds4_gguf_w_tensor(w, "t", 1, &small, 24), 0);
    assert_int_equal(ds4_gguf_w_hole(w, small), 0);
    assert_int_equal(ds4_gguf_w_hole(w, 1), -1);
    expect_close_error(w, DS4_EINVAL, "beyond the last tensor");

    if ((uint64_t)st[1].st_blocks * 512 + n > (uint64_t)st[0].st_blocks * 512)
        skip(); /* SKIP: this filesystem stores holes as data */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_values),
        cmocka_unit_test(test_copy_kv_keeps_exact_bits),
        cmocka_unit_test(test_alignment_variants),
        cmocka_unit_test(test_every_type_in_geometry_table),
        cmocka_unit_test(test_chunked_data_same_file),
        cmocka_unit_test(test_large_tensor),
        cmocka_unit_test(test_holes_same_file),
        cmocka_unit_test(test_writer_metadata_errors),
        cmocka_unit_test(test_writer_alignment_kv_adopted),
        cmocka_unit_test(test_writer_tensor_errors),
        cmocka_unit_test(test_writer_abort_and_atomic_replace),
        cmocka_unit_test(test_writer_io_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
