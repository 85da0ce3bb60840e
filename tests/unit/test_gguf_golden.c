/*
 * test_gguf_golden.c - compatibility with gguf-py (PyPI gguf==0.19.0)
 * through committed golden files (tests/reference/gguf_compat.py).
 *
 *  - tests/golden/gguf/pywriter_a{32,1,256}.gguf were written by GGUFWriter:
 *    the ds4 reader must find every key, value, tensor and data byte that
 *    the content below describes, with tensor offsets that agree with the
 *    ds4 type geometry, and the ds4 writer fed the same content must
 *    reproduce each file byte for byte.
 *  - tests/golden/gguf/ds4writer.gguf is a regression golden: written by
 *    the ds4 writer itself, then read back by gguf-py's GGUFReader
 *    (gguf_compat.py check), which is what makes it more than a record of
 *    our own output; the writer must still produce it byte for byte.  `test_gguf_golden --write-golden PATH` writes it.
 *
 * The content here mirrors gguf_compat.py; the two change together.
 * Run from the repository root (as the test suite does).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "format/quants.h"
#include "test_gguf_util.h"

#define GOLDEN_DIR "tests/golden/gguf/"

/* ---------------------------------------------------------- the content */

typedef struct spec_kv {
    const char *key;
    ds4_gguf_vtype type; /* element type for arrays */
    bool is_array;
    const void *data;        /* stored bytes: scalar, string bytes or fixed elements */
    uint64_t n;              /* string length, or array count */
    const char *const *strs; /* string arrays */
    const uint64_t *lens;
} spec_kv;

static const char arch[] = "ds4test";
static const uint8_t v_u8 = 200;
static const int8_t v_i8 = -100;
static const uint16_t v_u16 = 60000;
static const int16_t v_i16 = -30000;
static const uint32_t v_u32 = 4000000000u;
static const int32_t v_i32 = -2000000000;
static const float v_f32 = 0.1f;
static const uint8_t v_true = 1, v_false = 0;
static const char v_str[] = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93";
static const char v_raw[] = "\xff\xfe\x00raw\x80";
static const uint64_t v_u64 = UINT64_MAX;
static const int64_t v_i64 = INT64_MIN;
static const double v_f64 = -2.718281828459045;
static const uint32_t v_seven = 7, v_align1 = 1, v_align256 = 256;

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {0, 65535, 1234};
static const int16_t a_i16[] = {-32768, 32767};
static const uint32_t a_u32[] = {0, 4294967295u, 7};
static const int32_t a_i32[] = {INT32_MIN, INT32_MAX, -1};
static const float a_f32[] = {1.0f, -0.5f, 3.4028234663852886e38f, 0.1f};
static const uint8_t a_bool[] = {1, 0, 1};
static const char *const a_str[] = {"a", "",
                                    "\xc3\xbcn\xc3\xaf"
                                    "c\xc3\xb6"
                                    "d\xc3\xa9",
                                    "tab\tnl\n"};
static const uint64_t a_str_lens[] = {1, 0, 11, 7};
static const uint64_t a_u64[] = {0, UINT64_MAX};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, 42};
static const double a_f64[] = {3.141592653589793, -1e300, 5e-324};

/* clang-format off */
#define SCALAR(k, t, v) \
    { k, t, false, &(v), 0, NULL, NULL }
#define STRING(k, s, len) \
    { k, DS4_GGUF_STRING, false, s, len, NULL, NULL }
#define ARRAY(k, t, a) \
    { k, t, true, a, sizeof(a) / sizeof(a[0]), NULL, NULL }
#define EMPTY(k, t) \
    { k, t, true, NULL, 0, NULL, NULL }
/* clang-format on */

static const spec_kv arch_kv[] = {STRING("general.architecture", arch, 7)};

/* SCALARS + ARRAYS of gguf_compat.py, in order. */
static const spec_kv content_kvs[] = {
    SCALAR("test.u8", DS4_GGUF_U8, v_u8),
    SCALAR("test.i8", DS4_GGUF_I8, v_i8),
    SCALAR("test.u16", DS4_GGUF_U16, v_u16),
    SCALAR("test.i16", DS4_GGUF_I16, v_i16),
    SCALAR("test.u32", DS4_GGUF_U32, v_u32),
    SCALAR("test.i32", DS4_GGUF_I32, v_i32),
    SCALAR("test.f32", DS4_GGUF_F32, v_f32),
    SCALAR("test.bool_true", DS4_GGUF_BOOL, v_true),
    SCALAR("test.bool_false", DS4_GGUF_BOOL, v_false),
    STRING("test.str", v_str, sizeof(v_str) - 1),
    STRING("test.str_empty", "", 0),
    STRING("test.str_raw", v_raw, sizeof(v_raw) - 1),
    SCALAR("test.u64", DS4_GGUF_U64, v_u64),
    SCALAR("test.i64", DS4_GGUF_I64, v_i64),
    SCALAR("test.f64", DS4_GGUF_F64, v_f64),
    ARRAY("test.arr.u8", DS4_GGUF_U8, a_u8),
    ARRAY("test.arr.i8", DS4_GGUF_I8, a_i8),
    ARRAY("test.arr.u16", DS4_GGUF_U16, a_u16),
    ARRAY("test.arr.i16", DS4_GGUF_I16, a_i16),
    ARRAY("test.arr.u32", DS4_GGUF_U32, a_u32),
    ARRAY("test.arr.i32", DS4_GGUF_I32, a_i32),
    ARRAY("test.arr.f32", DS4_GGUF_F32, a_f32),
    ARRAY("test.arr.bool", DS4_GGUF_BOOL, a_bool),
    {"test.arr.str", DS4_GGUF_STRING, true, NULL, 4, a_str, a_str_lens},
    ARRAY("test.arr.u64", DS4_GGUF_U64, a_u64),
    ARRAY("test.arr.i64", DS4_GGUF_I64, a_i64),
    ARRAY("test.arr.f64", DS4_GGUF_F64, a_f64),
};

/* EMPTY_ARRAYS of gguf_compat.py (ds4-written file only). */
static const spec_kv empty_kvs[] = {
    EMPTY("test.empty.u8", DS4_GGUF_U8),      EMPTY("test.empty.i8", DS4_GGUF_I8),
    EMPTY("test.empty.u16", DS4_GGUF_U16),    EMPTY("test.empty.i16", DS4_GGUF_I16),
    EMPTY("test.empty.u32", DS4_GGUF_U32),    EMPTY("test.empty.i32", DS4_GGUF_I32),
    EMPTY("test.empty.f32", DS4_GGUF_F32),    EMPTY("test.empty.bool", DS4_GGUF_BOOL),
    EMPTY("test.empty.str", DS4_GGUF_STRING), EMPTY("test.empty.u64", DS4_GGUF_U64),
    EMPTY("test.empty.i64", DS4_GGUF_I64),    EMPTY("test.empty.f64", DS4_GGUF_F64),
};

static const spec_kv small_kvs[2][2] = {
    {SCALAR("general.alignment", DS4_GGUF_U32, v_align1), SCALAR("test.u32", DS4_GGUF_U32, v_seven)},
    {SCALAR("general.alignment", DS4_GGUF_U32, v_align256), SCALAR("test.u32", DS4_GGUF_U32, v_seven)},
};

/* Every id of the geometry table but q8_1 (see test_geometry_matches_gguf_py). */
static const uint32_t all_types[] = {0,  1,  2,  3,  6,  7,  8,  10, 11, 12, 13, 14, 15, 16, 17, 18,
                                     19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 34, 35, 39};
static const uint32_t a1_types[] = {0, 8, 24};
static const uint32_t a256_types[] = {1, 12, 26};
static const uint32_t ds4_types[] = {0, 1, 8, 10, 12, 16, 26, 30};
#define MAXDIMS_SEED  100
#define DS4_ALIGNMENT 64

typedef struct spec_tensor {
    char name[32];
    uint32_t type, ndim;
    uint64_t ne[DS4_GGUF_MAX_DIMS];
    uint64_t seed, nbytes;
} spec_tensor;

static uint8_t tensor_byte(uint64_t seed, uint64_t j) { return (uint8_t)((seed * 37 + j * 11 + 3) & 0xFF); }

/* tensor_shape() of gguf_compat.py. */
static spec_tensor type_tensor(uint32_t id) {
    spec_tensor t = {.type = id, .seed = id};
    const ds4_type_info *ti = ds4_type_get(id);
    int64_t block = ti->block_elems;
    snprintf(t.name, sizeof(t.name), "t.%s", ti->name);
    t.ndim = 1 + id % 4;
    t.ne[0] = block == 1 ? 1 + id % 5 : block < 256 ? (uint64_t)block * (1 + id % 2) : (uint64_t)block;
    uint64_t n = t.ne[0];
    for (uint32_t d = 1; d < t.ndim; d++) {
        t.ne[d] = block >= 256 ? 1 : 1 + (id + d) % 2;
        n *= t.ne[d];
    }
    t.nbytes = n / (uint64_t)block * ti->block_bytes;
    return t;
}

static spec_tensor maxdims_tensor(void) {
    spec_tensor t = {.type = 0, .ndim = 8, .ne = {2, 1, 1, 1, 1, 1, 1, 3}, .seed = MAXDIMS_SEED, .nbytes = 24};
    strcpy(t.name, "t.maxdims");
    return t;
}

/* A file's full content: kv lists in order and tensors. */
typedef struct spec_file {
    const char *name;
    uint32_t alignment; /* as found in the file (0: no key, default 32) */
    const spec_kv *kvs[4];
    size_t nkvs[4];
    spec_tensor tensors[40];
    int ntensors;
} spec_file;

static void add_types(spec_file *f, const uint32_t *ids, size_t n, bool maxdims) {
    for (size_t i = 0; i < n; i++) f->tensors[f->ntensors++] = type_tensor(ids[i]);
    if (maxdims) f->tensors[f->ntensors++] = maxdims_tensor();
}

#define COUNT(a) (sizeof(a) / sizeof(a[0]))

static spec_file py_file(int which) {
    spec_file f = {0};
    f.kvs[0] = arch_kv;
    f.nkvs[0] = 1;
    if (which == 0) {
        f.name = "pywriter_a32.gguf";
        f.kvs[1] = content_kvs;
        f.nkvs[1] = COUNT(content_kvs);
        add_types(&f, all_types, COUNT(all_types), true);
    } else {
        f.name = which == 1 ? "pywriter_a1.gguf" : "pywriter_a256.gguf";
        f.alignment = which == 1 ? 1 : 256;
        f.kvs[1] = small_kvs[which - 1];
        f.nkvs[1] = 2;
        if (which == 1) add_types(&f, a1_types, COUNT(a1_types), false);
        else add_types(&f, a256_types, COUNT(a256_types), false);
    }
    return f;
}

/* The ds4 writer stores general.alignment after the caller's keys. */
static const uint32_t v_align_ds4 = DS4_ALIGNMENT;
static const spec_kv ds4_align_kv[] = {SCALAR("general.alignment", DS4_GGUF_U32, v_align_ds4)};

static spec_file ds4_file(void) {
    spec_file f = {.name = "ds4writer.gguf", .alignment = DS4_ALIGNMENT};
    f.kvs[0] = arch_kv;
    f.nkvs[0] = 1;
    f.kvs[1] = content_kvs;
    f.nkvs[1] = COUNT(content_kvs);
    f.kvs[2] = empty_kvs;
    f.nkvs[2] = COUNT(empty_kvs);
    f.kvs[3] = ds4_align_kv;
    f.nkvs[3] = 1;
    add_types(&f, ds4_types, COUNT(ds4_types), true);
    return f;
}

/* ------------------------------------------------------------- checking */

/* A decoded scalar back in its stored width. */
static void encode_scalar(const ds4_gguf_value *v, uint8_t out[8]) {
    uint8_t u8 = (uint8_t)v->u;
    int8_t i8 = (int8_t)v->i;
    uint16_t u16 = (uint16_t)v->u;
    int16_t i16 = (int16_t)v->i;
    uint32_t u32 = (uint32_t)v->u;
    int32_t i32 = (int32_t)v->i;
    float f32 = (float)v->f;
    switch (v->type) {
    case DS4_GGUF_U8: memcpy(out, &u8, 1); break;
    case DS4_GGUF_I8: memcpy(out, &i8, 1); break;
    case DS4_GGUF_U16: memcpy(out, &u16, 2); break;
    case DS4_GGUF_I16: memcpy(out, &i16, 2); break;
    case DS4_GGUF_U32: memcpy(out, &u32, 4); break;
    case DS4_GGUF_I32: memcpy(out, &i32, 4); break;
    case DS4_GGUF_F32: memcpy(out, &f32, 4); break;
    case DS4_GGUF_BOOL: out[0] = v->b ? 1 : 0; break;
    case DS4_GGUF_U64: memcpy(out, &v->u, 8); break;
    case DS4_GGUF_I64: memcpy(out, &v->i, 8); break;
    case DS4_GGUF_F64: memcpy(out, &v->f, 8); break;
    default: fail_msg("not a scalar: %d", v->type);
    }
}

static void check_kv(const ds4_gguf_kv *kv, const spec_kv *s) {
    if (strcmp(kv->key, s->key) != 0) fail_msg("key '%s', expected '%s'", kv->key, s->key);
    const ds4_gguf_value *v = &kv->value;
    if (!s->is_array) {
        if (v->type != s->type) fail_msg("%s: type %d, expected %d", s->key, v->type, s->type);
        if (s->type == DS4_GGUF_STRING) {
            assert_int_equal(v->s.len, s->n);
            if (s->n) assert_memory_equal(v->s.ptr, s->data, s->n);
            return;
        }
        uint8_t got[8];
        encode_scalar(v, got);
        if (memcmp(got, s->data, ds4_gguf_vtype_size(s->type)) != 0) fail_msg("%s: value differs", s->key);
        return;
    }
    if (v->type != DS4_GGUF_ARRAY || v->a.type != s->type)
        fail_msg("%s: not an array of %s", s->key, ds4_gguf_vtype_name(s->type));
    assert_int_equal(v->a.count, s->n);
    for (uint64_t i = 0; i < s->n; i++) {
        if (s->type == DS4_GGUF_STRING) {
            assert_int_equal(v->a.strs[i].len, s->lens[i]);
            if (s->lens[i]) assert_memory_equal(v->a.strs[i].ptr, s->strs[i], s->lens[i]);
        }
    }
    if (s->type != DS4_GGUF_STRING && s->n)
        if (memcmp(v->a.data, s->data, s->n * ds4_gguf_vtype_size(s->type)) != 0)
            fail_msg("%s: elements differ", s->key);
}

static void check_file(const ds4_gguf *g, const spec_file *f) {
    uint64_t k = 0;
    for (int part = 0; part < 4; part++)
        for (size_t i = 0; i < f->nkvs[part]; i++) {
            if (k >= g->n_kv) fail_msg("%s: only %llu keys", f->name, (unsigned long long)g->n_kv);
            check_kv(&g->kv[k], &f->kvs[part][i]);
            assert_ptr_equal(ds4_gguf_find_kv(g, f->kvs[part][i].key), &g->kv[k]);
            k++;
        }
    assert_int_equal(g->n_kv, k);
    uint32_t align = f->alignment ? f->alignment : 32;
    assert_int_equal(g->alignment, align);
    assert_int_equal(g->n_tensors, (uint64_t)f->ntensors);
    uint64_t expect_offset = 0;
    for (int i = 0; i < f->ntensors; i++) {
        const spec_tensor *s = &f->tensors[i];
        const ds4_gguf_tensor *t = &g->tensors[i];
        if (strcmp(t->name, s->name) != 0)
            fail_msg("%s: tensor %d is '%s', expected '%s'", f->name, i, t->name, s->name);
        assert_int_equal(t->type, s->type);
        assert_int_equal(t->ndim, s->ndim);
        for (uint32_t d = 0; d < s->ndim; d++) assert_int_equal(t->ne[d], s->ne[d]);
        /* The writer laid tensors out with its own sizes: offsets agreeing
         * means our geometry of this type agrees with the writer's. */
        if (t->offset != expect_offset || t->nbytes != s->nbytes)
            fail_msg("%s: tensor %s at %llu with %llu bytes, expected %llu with %llu", f->name, s->name,
                     (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)expect_offset,
                     (unsigned long long)s->nbytes);
        const uint8_t *d = t->data;
        for (uint64_t j = 0; j < s->nbytes; j++)
            if (d[j] != tensor_byte(s->seed, j))
                fail_msg("%s: tensor %s byte %llu differs", f->name, s->name, (unsigned long long)j);
        expect_offset = (expect_offset + t->nbytes + align - 1) / align * align;
    }
    assert_int_equal(g->size, g->data_offset + expect_offset);
}

static ds4_gguf *open_golden(const char *name) {
    char path[256];
    snprintf(path, sizeof(path), GOLDEN_DIR "%s", name);
    ds4_err err;
    ds4_gguf *g = ds4_gguf_open(path, &err);
    if (!g) fail_msg("%s (run from the repository root)", err.msg);
    return g;
}

/* ------------------------------------------------------------- writing */

static void write_kv(ds4_gguf_writer *w, const spec_kv *s) {
    int rc;
    if (s->is_array && s->type == DS4_GGUF_STRING) rc = ds4_gguf_w_arr_str(w, s->key, s->strs, s->lens, s->n);
    else if (s->is_array) rc = ds4_gguf_w_arr(w, s->key, s->type, s->data, s->n);
    else if (s->type == DS4_GGUF_STRING) rc = ds4_gguf_w_strn(w, s->key, s->data, s->n);
    else {
        ds4_gguf_kv kv = {.key = (char *)s->key};
        kv.value.type = s->type;
        uint8_t b[8] = {0};
        memcpy(b, s->data, ds4_gguf_vtype_size(s->type));
        /* Decode the stored bytes the way the reader does, then copy. */
        switch (s->type) {
        case DS4_GGUF_U8: kv.value.u = b[0]; break;
        case DS4_GGUF_I8: kv.value.i = (int8_t)b[0]; break;
        case DS4_GGUF_U16: {
            uint16_t x;
            memcpy(&x, b, 2);
            kv.value.u = x;
            break;
        }
        case DS4_GGUF_I16: {
            int16_t x;
            memcpy(&x, b, 2);
            kv.value.i = x;
            break;
        }
        case DS4_GGUF_U32: {
            uint32_t x;
            memcpy(&x, b, 4);
            kv.value.u = x;
            break;
        }
        case DS4_GGUF_I32: {
            int32_t x;
            memcpy(&x, b, 4);
            kv.value.i = x;
            break;
        }
        case DS4_GGUF_F32: {
            float x;
            memcpy(&x, b, 4);
            kv.value.f = x;
            break;
        }
        case DS4_GGUF_BOOL: kv.value.b = b[0] != 0; break;
        case DS4_GGUF_U64: memcpy(&kv.value.u, b, 8); break;
        case DS4_GGUF_I64: memcpy(&kv.value.i, b, 8); break;
        case DS4_GGUF_F64: memcpy(&kv.value.f, b, 8); break;
        default: break;
        }
        rc = ds4_gguf_w_copy_kv(w, &kv);
    }
    if (rc != 0) fail_msg("writing %s failed", s->key);
}

/* The ds4-written golden: alignment given at open, data in 100-byte pieces. */
static int write_ds4_file(const char *path, ds4_err *err) {
    spec_file f = ds4_file();
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, DS4_ALIGNMENT, err);
    if (!w) return -1;
    /* general.alignment (the last part) comes from the open argument. */
    for (int part = 0; part < 3; part++)
        for (size_t i = 0; i < f.nkvs[part]; i++) write_kv(w, &f.kvs[part][i]);
    for (int i = 0; i < f.ntensors; i++)
        ds4_gguf_w_tensor(w, f.tensors[i].name, f.tensors[i].ndim, f.tensors[i].ne, f.tensors[i].type);
    for (int i = 0; i < f.ntensors; i++) {
        uint8_t buf[100];
        for (uint64_t j = 0; j < f.tensors[i].nbytes; j += sizeof(buf)) {
            uint64_t n = f.tensors[i].nbytes - j < sizeof(buf) ? f.tensors[i].nbytes - j : sizeof(buf);
            for (uint64_t k = 0; k < n; k++) buf[k] = tensor_byte(f.tensors[i].seed, j + k);
            ds4_gguf_w_data(w, buf, n);
        }
    }
    return ds4_gguf_writer_close(w, err);
}

static void assert_same_bytes(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *pa = read_whole_file(a, &na), *pb = read_whole_file(b, &nb);
    assert_non_null(pa);
    assert_non_null(pb);
    if (na != nb) fail_msg("%s is %zu bytes, %s is %zu", a, na, b, nb);
    for (size_t i = 0; i < na; i++)
        if (pa[i] != pb[i]) fail_msg("%s and %s differ first at byte %zu", a, b, i);
    free(pa);
    free(pb);
}

/* ---------------------------------------------------------------- tests */

/* Block geometry of every type ds4 knows agrees with gguf-py's table, but
 * for q8_1: gguf-py 0.19.0 still has its old 40-byte block (f32 scales)
 * where GGML's block_q8_1 is 36 bytes (f16 scales).  q8_1 is activation-only
 * in GGML and never stored in a GGUF, so ds4 follows GGML.  Types newer than
 * ds4's table (ids gguf-py knows and ds4 does not) are skipped. */
static void test_geometry_matches_gguf_py(void **state) {
    (void)state;
    FILE *f = fopen(GOLDEN_DIR "quant_sizes.txt", "r");
    if (!f) fail_msg("cannot open " GOLDEN_DIR "quant_sizes.txt (run from the repository root)");
    char line[128], name[32];
    unsigned id;
    long long block, bytes;
    int seen[64] = {0}, compared = 0;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#') continue;
        if (sscanf(line, "%u %31s %lld %lld", &id, name, &block, &bytes) != 4) fail_msg("bad line '%s'", line);
        const ds4_type_info *ti = ds4_type_get(id);
        if (!ti) continue;
        if (id < 64) seen[id] = 1;
        assert_string_equal(ti->name, name);
        assert_int_equal(ti->block_elems, block);
        if (id == 9) {
            assert_int_equal(bytes, 40);
            assert_int_equal(ti->block_bytes, 36);
        } else {
            assert_int_equal(ti->block_bytes, bytes);
        }
        compared++;
    }
    fclose(f);
    assert_true(compared >= 32);
    for (uint32_t t = 0; t < 64; t++)
        if (ds4_type_get(t) && !seen[t]) fail_msg("type %u is not in gguf-py's table", t);
}

static void test_reads_gguf_py_files(void **state) {
    (void)state;
    for (int which = 0; which < 3; which++) {
        spec_file f = py_file(which);
        ds4_gguf *g = open_golden(f.name);
        check_file(g, &f);
        ds4_gguf_close(g);
    }
}

/* Our writer, given what the reader found, reproduces gguf-py's files. */
static void test_writer_reproduces_gguf_py_files(void **state) {
    (void)state;
    char *dir = make_temp_dir();
    for (int which = 0; which < 3; which++) {
        spec_file f = py_file(which);
        ds4_gguf *g = open_golden(f.name);
        char *out = path_in(dir, f.name);
        ds4_err err;
        ds4_gguf_writer *w = ds4_gguf_writer_open(out, 0, &err);
        assert_non_null(w);
        for (uint64_t i = 0; i < g->n_kv; i++) assert_int_equal(ds4_gguf_w_copy_kv(w, &g->kv[i]), 0);
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const ds4_gguf_tensor *t = &g->tensors[i];
            assert_int_equal(ds4_gguf_w_tensor(w, t->name, t->ndim, t->ne, t->type), 0);
        }
        for (uint64_t i = 0; i < g->n_tensors; i++)
            assert_int_equal(ds4_gguf_w_data(w, g->tensors[i].data, g->tensors[i].nbytes), 0);
        if (ds4_gguf_writer_close(w, &err) != 0) fail_msg("%s", err.msg);
        assert_same_bytes(out, g->path);
        ds4_gguf_close(g);
        unlink(out);
        free(out);
    }
    remove_temp_dir(dir);
}

static void test_writer_reproduces_ds4_golden(void **state) {
    (void)state;
    char *dir = make_temp_dir();
    char *out = path_in(dir, "ds4writer.gguf");
    ds4_err err;
    if (write_ds4_file(out, &err) != 0) fail_msg("%s", err.msg);
    assert_same_bytes(out, GOLDEN_DIR "ds4writer.gguf");
    spec_file f = ds4_file();
    ds4_gguf *g = open_golden(f.name);
    check_file(g, &f);
    ds4_gguf_close(g);
    unlink(out);
    free(out);
    remove_temp_dir(dir);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-golden") == 0) {
        ds4_err err;
        if (write_ds4_file(argv[2], &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        printf("wrote %s\n", argv[2]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry_matches_gguf_py),
        cmocka_unit_test(test_reads_gguf_py_files),
        cmocka_unit_test(test_writer_reproduces_gguf_py_files),
        cmocka_unit_test(test_writer_reproduces_ds4_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
