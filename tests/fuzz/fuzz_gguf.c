/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader (and, through a round
 * trip, the writer).
 *
 * Opens the input with ds4_gguf_open_buffer() and, when it is accepted,
 * walks every metadata entry, array element, string byte and tensor byte
 * the reader hands out, checking the reader's promises on the way: every
 * pointer lies inside the input, lookups find each entry, tensor sizes
 * follow the type geometry and data is aligned and in bounds.  An accepted
 * input is then copied through the writer (copy_kv, tensors, data) into a
 * temporary file, which must read back with the same entries, bits and
 * tensor bytes.  A rejected input must come with a message that names the
 * input.  Any broken promise aborts, which libFuzzer reports like a crash.
 * Built and run by tests/suite/fuzz_gguf.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"
#include "format/quants.h"

/* clang-format off */
#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "fuzz_gguf: %s:%d: broken promise: %s\n",        \
                    __FILE__, __LINE__, #cond);                              \
            abort();                                                         \
        }                                                                    \
    } while (0)
/* clang-format on */

static const uint8_t *lo, *hi;
static volatile uint64_t sink;

/* [p, p + n) lies inside the input; touch every byte so ASan sees reads. */
static void inside(const void *p, uint64_t n) {
    const uint8_t *b = p;
    if (n == 0) return;
    CHECK(b >= lo && n <= (uint64_t)(hi - b));
    uint64_t acc = 0;
    for (uint64_t i = 0; i < n; i++) acc += b[i];
    sink += acc;
}

static void walk_array(const ds4_gguf_array *a) {
    CHECK(a->type < DS4_GGUF_VTYPE_COUNT && a->type != DS4_GGUF_ARRAY);
    if (a->type == DS4_GGUF_STRING) {
        CHECK(a->count == 0 || a->strs != NULL);
        for (uint64_t i = 0; i < a->count; i++) inside(a->strs[i].ptr, a->strs[i].len);
        return;
    }
    CHECK(a->strs == NULL);
    inside(a->data, a->count * ds4_gguf_vtype_size(a->type));
    for (uint64_t i = 0; i < a->count; i++) {
        sink += (uint64_t)ds4_gguf_arr_i64(a, i);
        double d = ds4_gguf_arr_f64(a, i);
        sink += d == d;
    }
}

/* Every getter on every key: none may crash, and a success agrees with the
 * stored value's type. */
static void walk_getters(const ds4_gguf *g, const ds4_gguf_kv *kv) {
    ds4_err err;
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    double f;
    bool b;
    ds4_str s;
    const ds4_gguf_array *a;
    sink += (uint64_t)ds4_gguf_get_u32(g, kv->key, &u32, &err);
    sink += (uint64_t)ds4_gguf_get_u64(g, kv->key, &u64, &err);
    sink += (uint64_t)ds4_gguf_get_i64(g, kv->key, &i64, &err);
    sink += (uint64_t)ds4_gguf_get_f64(g, kv->key, &f, &err);
    CHECK((ds4_gguf_get_bool(g, kv->key, &b, &err) == 0) == (kv->value.type == DS4_GGUF_BOOL));
    CHECK((ds4_gguf_get_str(g, kv->key, &s, &err) == 0) == (kv->value.type == DS4_GGUF_STRING));
    CHECK((ds4_gguf_get_arr(g, kv->key, DS4_GGUF_VTYPE_COUNT, &a, &err) == 0) == (kv->value.type == DS4_GGUF_ARRAY));
}

static void walk(const ds4_gguf *g) {
    CHECK(g->version == 3);
    CHECK(g->alignment && (g->alignment & (g->alignment - 1)) == 0);
    CHECK(g->data_offset % g->alignment == 0);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const ds4_gguf_kv *kv = &g->kv[i];
        CHECK(kv->file_offset < g->size);
        CHECK(ds4_gguf_find_kv(g, kv->key) == kv);
        CHECK(kv->value.type < DS4_GGUF_VTYPE_COUNT);
        if (kv->value.type == DS4_GGUF_STRING) inside(kv->value.s.ptr, kv->value.s.len);
        if (kv->value.type == DS4_GGUF_ARRAY) walk_array(&kv->value.a);
        walk_getters(g, kv);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        CHECK(ds4_gguf_find_tensor(g, t->name) == t);
        CHECK(t->ndim >= 1 && t->ndim <= DS4_GGUF_MAX_DIMS);
        uint64_t n = 1;
        for (uint32_t d = 0; d < DS4_GGUF_MAX_DIMS; d++) {
            CHECK(t->ne[d] >= 1);
            CHECK(d < t->ndim || t->ne[d] == 1);
            n *= t->ne[d];
        }
        CHECK(n == t->nelements && n <= (uint64_t)INT64_MAX);
        int ok;
        CHECK(ds4_type_nbytes_checked(t->type, n, &ok) == t->nbytes && ok);
        CHECK(t->offset % g->alignment == 0);
        CHECK((const uint8_t *)t->data == g->base + g->data_offset + t->offset);
        inside(t->data, t->nbytes);
    }
    CHECK(ds4_gguf_find_kv(g, "fuzz: no such key \x01") == NULL);
    CHECK(ds4_gguf_find_tensor(g, "fuzz: no such tensor \x01") == NULL);
}

static bool same_kv(const ds4_gguf_kv *a, const ds4_gguf_kv *b) {
    const ds4_gguf_value *x = &a->value, *y = &b->value;
    if (strcmp(a->key, b->key) != 0 || x->type != y->type) return false;
    if (x->type == DS4_GGUF_STRING)
        return x->s.len == y->s.len && (x->s.len == 0 || memcmp(x->s.ptr, y->s.ptr, x->s.len) == 0);
    if (x->type != DS4_GGUF_ARRAY) return memcmp(a->raw, b->raw, ds4_gguf_vtype_size(x->type)) == 0;
    if (x->a.type != y->a.type || x->a.count != y->a.count) return false;
    if (x->a.type != DS4_GGUF_STRING)
        return x->a.count == 0 || memcmp(x->a.data, y->a.data, x->a.count * ds4_gguf_vtype_size(x->a.type)) == 0;
    for (uint64_t i = 0; i < x->a.count; i++)
        if (x->a.strs[i].len != y->a.strs[i].len ||
            (x->a.strs[i].len && memcmp(x->a.strs[i].ptr, y->a.strs[i].ptr, x->a.strs[i].len) != 0))
            return false;
    return true;
}

static bool same_tensor(const ds4_gguf_tensor *a, const ds4_gguf_tensor *b) {
    return strcmp(a->name, b->name) == 0 && a->type == b->type && a->ndim == b->ndim &&
           memcmp(a->ne, b->ne, sizeof(a->ne)) == 0 && a->nbytes == b->nbytes &&
           memcmp(a->data, b->data, a->nbytes) == 0;
}

static const char *scratch_path(void) {
    static char path[256];
    if (!path[0]) {
        const char *dir = getenv("TMPDIR");
        if (!dir || !*dir) dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(path, sizeof(path), "%s/fuzz_gguf.%ld.gguf", dir, (long)getpid());
    }
    return path;
}

/* Everything the reader accepted, written back by the writer, reads back
 * the same.  Files with an alignment over 64 KiB are skipped: the writer
 * correctly pads the tensor table up to it (up to 2 GiB of zeros), which
 * would spend the fuzzing time writing padding. */
#define ROUND_TRIP_MAX_ALIGNMENT 65536u

static void round_trip(const ds4_gguf *g) {
    if (g->alignment > ROUND_TRIP_MAX_ALIGNMENT) return;
    const char *path = scratch_path();
    ds4_err err;
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    if (!w) fprintf(stderr, "fuzz_gguf: %s\n", err.msg);
    CHECK(w != NULL);
    for (uint64_t i = 0; i < g->n_kv; i++) CHECK(ds4_gguf_w_copy_kv(w, &g->kv[i]) == 0);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        CHECK(ds4_gguf_w_tensor(w, t->name, t->ndim, t->ne, t->type) == 0);
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        CHECK(ds4_gguf_w_data(w, g->tensors[i].data, g->tensors[i].nbytes) == 0);
    int rc = ds4_gguf_writer_close(w, &err);
    if (rc != 0) fprintf(stderr, "fuzz_gguf: %s\n", err.msg);
    CHECK(rc == 0);
    ds4_gguf *h = ds4_gguf_open(path, &err);
    if (!h) fprintf(stderr, "fuzz_gguf: %s\n", err.msg);
    CHECK(h != NULL);
    CHECK(h->n_kv == g->n_kv && h->n_tensors == g->n_tensors && h->alignment == g->alignment);
    for (uint64_t i = 0; i < g->n_kv; i++) CHECK(same_kv(&g->kv[i], &h->kv[i]));
    for (uint64_t i = 0; i < g->n_tensors; i++) CHECK(same_tensor(&g->tensors[i], &h->tensors[i]));
    ds4_gguf_close(h);
    unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lo = data;
    hi = data + size;
    ds4_err err;
    ds4_err_clear(&err);
    ds4_gguf *g = ds4_gguf_open_buffer(data, size, "fuzz", &err);
    if (!g) {
        CHECK(err.code != DS4_OK);
        CHECK(strncmp(err.msg, "fuzz: ", 6) == 0);
        return 0;
    }
    CHECK(g->base == data && g->size == size);
    walk(g);
    round_trip(g);
    ds4_gguf_close(g);
    return 0;
}
