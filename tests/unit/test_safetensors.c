/*
 * test_safetensors.c - the safetensors reader: well-formed files read back
 * exactly (dtypes, shapes, bytes, __metadata__ skipped, padded headers);
 * every kind of malformed file (truncated at any byte, bad lengths, bad
 * JSON, bad dtype/shape/offsets, overlaps, duplicates, overflow) is refused
 * with a message naming the file and the tensor; sharded checkpoints open
 * shards lazily and report missing shards, missing tensors, wrong dtypes and
 * shape mismatches clearly.
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

#include "common/st_build.h"
#include "common/tool_run.h"
#include "convert/safetensors.h"

static const float f32_data[6] = {1, -2, 3.5f, 0, 1e-3f, 42};
static const uint16_t bf16_data[4] = {0x3f80, 0xc000, 0x0000, 0x7f80};
static const uint8_t fp8_data[8] = {0x38, 0xb8, 0x7f, 0xff, 0x01, 0x00, 0x40, 0x7e};
static const int64_t i64_data[3] = {-1, 0, 1ll << 40};

static void make_sample(uint8_t **buf, size_t *len) {
    st_spec specs[] = {
        {"a.weight", "F32", 2, {2, 3}, f32_data, sizeof(f32_data)},
        {"b.norm", "BF16", 1, {4}, bf16_data, sizeof(bf16_data)},
        {"c.fp8", "F8_E4M3", 2, {2, 4}, fp8_data, sizeof(fp8_data)},
        {"d.ids", "I64", 1, {3}, i64_data, sizeof(i64_data)},
        {"e.scalar", "F32", 0, {0}, f32_data, 4},
    };
    st_build(specs, 5, "{\"format\":\"pt\",\"nested\":{\"x\":[1,2]}}", buf, len);
}

static void test_reads_well_formed_file(void **state) {
    (void)state;
    uint8_t *buf;
    size_t len;
    make_sample(&buf, &len);
    ds4_err err = {0};
    ds4_st_file *f = ds4_st_open_buffer(buf, len, "sample.safetensors", &err);
    assert_non_null(f);
    assert_int_equal(f->n_tensors, 5);
    assert_int_equal(f->data_offset % 8, 0); /* header padding kept */

    const ds4_st_tensor *a = ds4_st_find(f, "a.weight");
    assert_non_null(a);
    assert_int_equal(a->dtype, DS4_ST_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nelements, 6);
    assert_int_equal(a->nbytes, 24);
    assert_memory_equal(a->data, f32_data, sizeof(f32_data));

    const ds4_st_tensor *c = ds4_st_find(f, "c.fp8");
    assert_int_equal(c->dtype, DS4_ST_F8_E4M3);
    assert_memory_equal(c->data, fp8_data, sizeof(fp8_data));
    const ds4_st_tensor *d = ds4_st_find(f, "d.ids");
    assert_int_equal(d->dtype, DS4_ST_I64);
    assert_memory_equal(d->data, i64_data, sizeof(i64_data));
    const ds4_st_tensor *e = ds4_st_find(f, "e.scalar");
    assert_int_equal(e->ndim, 0);
    assert_int_equal(e->nelements, 1);

    assert_null(ds4_st_find(f, "__metadata__"));
    assert_null(ds4_st_find(f, "missing"));

    const ds4_st_dtype want_f32[] = {DS4_ST_F32};
    const uint64_t shape23[] = {2, 3};
    assert_int_equal(ds4_st_expect(a, want_f32, 1, 2, shape23, &err), 0);
    ds4_st_close(f);
    free(buf);
}

static void test_expect_messages(void **state) {
    (void)state;
    uint8_t *buf;
    size_t len;
    make_sample(&buf, &len);
    ds4_err err = {0};
    ds4_st_file *f = ds4_st_open_buffer(buf, len, "sample.safetensors", &err);
    assert_non_null(f);
    const ds4_st_tensor *c = ds4_st_find(f, "c.fp8");

    const ds4_st_dtype want[] = {DS4_ST_I8, DS4_ST_U8};
    assert_int_equal(ds4_st_expect(c, want, 2, 0, NULL, &err), -1);
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_contains(err.msg, "sample.safetensors");
    assert_contains(err.msg, "c.fp8");
    assert_contains(err.msg, "dtype F8_E4M3, expected I8 or U8");

    const ds4_st_dtype fp8[] = {DS4_ST_F8_E4M3};
    const uint64_t shape[] = {4, 2};
    assert_int_equal(ds4_st_expect(c, fp8, 1, 2, shape, &err), -1);
    assert_contains(err.msg, "shape [2, 4], expected [4, 2]");
    const uint64_t shape3[] = {2, 4, 1};
    assert_int_equal(ds4_st_expect(c, fp8, 1, 3, shape3, &err), -1);
    assert_contains(err.msg, "expected [2, 4, 1]");
    ds4_st_close(f);
    free(buf);
}

/* Every prefix of a valid file must be refused without crashing; prefixes
 * that keep the header but lose data must say the data section is short. */
static void test_every_truncation_is_refused(void **state) {
    (void)state;
    uint8_t *buf;
    size_t len;
    make_sample(&buf, &len);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)buf[i] << (8 * i);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *copy = malloc(cut + 1);
        memcpy(copy, buf, cut);
        ds4_err err = {0};
        ds4_st_file *f = ds4_st_open_buffer(copy, cut, "cut.safetensors", &err);
        if (f) fail_msg("truncation at %zu of %zu accepted", cut, len);
        assert_contains(err.msg, "cut.safetensors");
        if (cut >= 8 + hlen) assert_contains(err.msg, "truncated");
        free(copy);
    }
    free(buf);
}

typedef struct bad_case {
    const char *header;
    size_t ndata;
    const char *expect;
} bad_case;

static void test_malformed_headers(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"[]", 0, "does not start with '{'"},
        {"{\"a\":1", 0, "header JSON"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{}}", 4, "header JSON"},
        {"{\"a\":5}", 0, "tensor a: entry is not an object"},
        {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor a: missing string \"dtype\""},
        {"{\"a\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor a: unknown dtype \"F7\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,4]}}", 4, "\"shape\" is not an array"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "shape[0] is not a non-negative"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "9 dims"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
         "element count overflows"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],\"data_offsets\":[0,4]}}", 4,
         "byte size overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "must be [begin, end]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "outside"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, "truncated"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "4 bytes in data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "overlap"},
    };
    uint8_t zeros[16] = {0};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t *buf;
        size_t len;
        st_raw(cases[i].header, zeros, cases[i].ndata, &buf, &len);
        ds4_err err = {0};
        ds4_st_file *f = ds4_st_open_buffer(buf, len, "bad.safetensors", &err);
        if (f) fail_msg("case %zu accepted: %s", i, cases[i].header);
        assert_contains(err.msg, "bad.safetensors");
        assert_contains(err.msg, cases[i].expect);
        free(buf);
    }
}

static void test_bad_header_lengths(void **state) {
    (void)state;
    uint8_t buf[16] = {0};
    ds4_err err = {0};
    assert_null(ds4_st_open_buffer(buf, 5, "x", &err));
    assert_contains(err.msg, "too short");
    assert_null(ds4_st_open_buffer(buf, 16, "x", &err)); /* length 0 */
    assert_contains(err.msg, "header length 0");
    buf[0] = 100;
    assert_null(ds4_st_open_buffer(buf, 16, "x", &err));
    assert_contains(err.msg, "runs past the end");
    memset(buf, 0xff, 8);
    assert_null(ds4_st_open_buffer(buf, 16, "x", &err));
    assert_contains(err.msg, "header length");
}

static void test_empty_and_zero_sized(void **state) {
    (void)state;
    uint8_t *buf;
    size_t len;
    st_spec specs[] = {{"empty", "F32", 2, {0, 5}, NULL, 0}};
    st_build(specs, 1, NULL, &buf, &len);
    ds4_err err = {0};
    ds4_st_file *f = ds4_st_open_buffer(buf, len, "z", &err);
    assert_non_null(f);
    assert_int_equal(ds4_st_find(f, "empty")->nelements, 0);
    ds4_st_close(f);
    free(buf);
    st_build(NULL, 0, NULL, &buf, &len);
    f = ds4_st_open_buffer(buf, len, "z", &err);
    assert_non_null(f);
    assert_int_equal(f->n_tensors, 0);
    ds4_st_close(f);
    free(buf);
}

/* ------------------------------------------------------- checkpoints */

static void write_st(const char *dir, const char *file, const st_spec *specs, size_t n) {
    uint8_t *buf;
    size_t len;
    st_build(specs, n, NULL, &buf, &len);
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    st_write_file(path, buf, len);
    free(buf);
}

static void write_text(const char *dir, const char *file, const char *text) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, file);
    st_write_file(path, text, strlen(text));
}

static const char *index_json = "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
                                "\"a.weight\":\"model-00001-of-00002.safetensors\","
                                "\"b.norm\":\"model-00001-of-00002.safetensors\","
                                "\"c.fp8\":\"model-00002-of-00002.safetensors\"}}";

static char *make_ckpt(void) {
    char *dir = st_tempdir();
    st_spec s1[] = {
        {"a.weight", "F32", 2, {2, 3}, f32_data, sizeof(f32_data)},
        {"b.norm", "BF16", 1, {4}, bf16_data, sizeof(bf16_data)},
    };
    st_spec s2[] = {{"c.fp8", "F8_E4M3", 2, {2, 4}, fp8_data, sizeof(fp8_data)}};
    write_st(dir, "model-00001-of-00002.safetensors", s1, 2);
    write_st(dir, "model-00002-of-00002.safetensors", s2, 1);
    write_text(dir, "model.safetensors.index.json", index_json);
    return dir;
}

static void test_ckpt_lazy_shards(void **state) {
    (void)state;
    char *dir = make_ckpt();
    ds4_err err = {0};
    ds4_st_ckpt *c = ds4_st_ckpt_open(dir, &err);
    assert_non_null(c);
    assert_int_equal(ds4_st_ckpt_count(c), 3);
    assert_string_equal(ds4_st_ckpt_name(c, 0), "a.weight");
    assert_string_equal(ds4_st_ckpt_name(c, 2), "c.fp8");
    assert_true(ds4_st_ckpt_has(c, "b.norm"));
    assert_false(ds4_st_ckpt_has(c, "nope"));
    assert_int_equal(ds4_st_ckpt_shards_open(c), 0);

    const ds4_st_tensor *t = ds4_st_ckpt_get(c, "c.fp8", &err);
    assert_non_null(t);
    assert_memory_equal(t->data, fp8_data, sizeof(fp8_data));
    assert_int_equal(ds4_st_ckpt_shards_open(c), 1);
    t = ds4_st_ckpt_get(c, "a.weight", &err);
    assert_non_null(t);
    assert_memory_equal(t->data, f32_data, sizeof(f32_data));
    assert_int_equal(ds4_st_ckpt_shards_open(c), 2);

    assert_null(ds4_st_ckpt_get(c, "nope", &err));
    assert_int_equal(err.code, DS4_ENOTFOUND);
    assert_contains(err.msg, "no tensor nope");

    const ds4_st_dtype want[] = {DS4_ST_BF16};
    assert_int_equal(ds4_st_expect(t, want, 1, 0, NULL, &err), -1);
    assert_contains(err.msg, "model-00001-of-00002.safetensors: tensor a.weight: dtype F32, expected BF16");
    ds4_st_ckpt_close(c);
    st_rmdir(dir);
    free(dir);
}

static void test_ckpt_missing_shard(void **state) {
    (void)state;
    char *dir = make_ckpt();
    char path[1024];
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
    remove(path);
    ds4_err err = {0};
    assert_null(ds4_st_ckpt_open(dir, &err));
    assert_int_equal(err.code, DS4_ENOTFOUND);
    assert_contains(err.msg, "model-00002-of-00002.safetensors");
    assert_contains(err.msg, "c.fp8");
    assert_contains(err.msg, "missing");
    st_rmdir(dir);
    free(dir);
}

static void test_ckpt_tensor_missing_from_shard(void **state) {
    (void)state;
    char *dir = make_ckpt();
    st_spec other[] = {{"x.other", "F32", 1, {1}, f32_data, 4}};
    write_st(dir, "model-00002-of-00002.safetensors", other, 1);
    ds4_err err = {0};
    ds4_st_ckpt *c = ds4_st_ckpt_open(dir, &err);
    assert_non_null(c);
    assert_null(ds4_st_ckpt_get(c, "c.fp8", &err));
    assert_contains(err.msg, "model-00002-of-00002.safetensors: no tensor c.fp8");
    ds4_st_ckpt_close(c);
    st_rmdir(dir);
    free(dir);
}

static void test_ckpt_truncated_shard(void **state) {
    (void)state;
    char *dir = make_ckpt();
    char path[1024];
    snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", dir);
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fclose(fp);
    assert_int_equal(truncate(path, n - 3), 0);
    ds4_err err = {0};
    ds4_st_ckpt *c = ds4_st_ckpt_open(dir, &err);
    assert_non_null(c);
    assert_non_null(ds4_st_ckpt_get(c, "a.weight", &err)); /* other shard fine */
    assert_null(ds4_st_ckpt_get(c, "c.fp8", &err));
    assert_contains(err.msg, "tensor c.fp8");
    assert_contains(err.msg, "model-00002-of-00002.safetensors");
    assert_contains(err.msg, "truncated");
    ds4_st_ckpt_close(c);
    st_rmdir(dir);
    free(dir);
}

static void test_ckpt_bad_index(void **state) {
    (void)state;
    static const struct {
        const char *json;
        const char *expect;
    } cases[] = {
        {"{\"weight_map\":", "model.safetensors.index.json"},
        {"{\"metadata\":{}}", "no \"weight_map\""},
        {"{\"weight_map\":{\"a\":3}}", "weight_map[a]"},
        {"{\"weight_map\":{\"a\":\"../evil.safetensors\"}}", "weight_map[a]"},
        {"{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "weight_map[a]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *dir = st_tempdir();
        write_text(dir, "model.safetensors.index.json", cases[i].json);
        ds4_err err = {0};
        assert_null(ds4_st_ckpt_open(dir, &err));
        assert_contains(err.msg, cases[i].expect);
        st_rmdir(dir);
        free(dir);
    }
}

static void test_ckpt_single_file_and_empty_dir(void **state) {
    (void)state;
    char *dir = st_tempdir();
    ds4_err err = {0};
    assert_null(ds4_st_ckpt_open(dir, &err));
    assert_contains(err.msg, "neither model.safetensors.index.json nor model.safetensors");
    st_spec s[] = {{"only", "F32", 1, {2}, f32_data, 8}};
    write_st(dir, "model.safetensors", s, 1);
    ds4_st_ckpt *c = ds4_st_ckpt_open(dir, &err);
    assert_non_null(c);
    assert_int_equal(ds4_st_ckpt_count(c), 1);
    const ds4_st_tensor *t = ds4_st_ckpt_get(c, "only", &err);
    assert_non_null(t);
    assert_memory_equal(t->data, f32_data, 8);
    ds4_st_ckpt_close(c);
    st_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_well_formed_file),
        cmocka_unit_test(test_expect_messages),
        cmocka_unit_test(test_every_truncation_is_refused),
        cmocka_unit_test(test_malformed_headers),
        cmocka_unit_test(test_bad_header_lengths),
        cmocka_unit_test(test_empty_and_zero_sized),
        cmocka_unit_test(test_ckpt_lazy_shards),
        cmocka_unit_test(test_ckpt_missing_shard),
        cmocka_unit_test(test_ckpt_tensor_missing_from_shard),
        cmocka_unit_test(test_ckpt_truncated_shard),
        cmocka_unit_test(test_ckpt_bad_index),
        cmocka_unit_test(test_ckpt_single_file_and_empty_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
