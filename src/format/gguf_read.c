/*
 * gguf_read.c - the validating GGUF v3 reader (see gguf.h, docs/MODEL.md 2.1).
 *
 * The whole header, metadata and tensor table are parsed at open time by a
 * cursor that checks every read against the bytes left in the file, so no
 * later access can go out of bounds.  Counts read from the file (entries,
 * tensors, array elements) are checked against the bytes left *before*
 * anything is allocated for them, so memory use stays proportional to the
 * file size whatever the file claims.  Every error names the file offset
 * where the problem was found.
 */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf_index.h"
#include "format/quants.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader reads fields in place and assumes a little-endian host"
#endif

/* Smallest possible encodings, used to bound counts before allocating:
 * a kv entry is a key length (8), a value type (4) and a value (>= 1);
 * a tensor info is a name length (8), ndim (4), one dim (8), a type (4)
 * and an offset (8). */
#define MIN_KV_BYTES          13u
#define MIN_TENSOR_INFO_BYTES 32u

typedef struct gguf_index {
    ds4_name_index kv;
    ds4_name_index tensors;
} gguf_index;

typedef struct parser {
    ds4_gguf *g;
    uint64_t pos;
    char ctx[200]; /* "key 'x'" or "tensor 'y'" while parsing one, else "" */
    ds4_err *err;
    bool header_only; /* ds4_gguf_open_header: no data expected */
} parser;

/* Quote a name for a message: printable ASCII as is, other bytes as \xNN,
 * cut at a length that keeps messages readable. */
static void quote_name(char *out, size_t cap, const char *s, uint64_t len) {
    size_t o = 0;
    const size_t max_shown = 96;
    out[o++] = '\'';
    for (uint64_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i == max_shown) {
            o += (size_t)snprintf(out + o, cap - o, "...");
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o++] = '\'';
    out[o] = '\0';
}

static int fail(parser *p, uint64_t at, ds4_errcode code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(parser *p, uint64_t at, ds4_errcode code, const char *fmt, ...) {
    char detail[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    return ds4_err_set(p->err, code, "%s: offset %llu: %s%s%s", p->g->path, (unsigned long long)at, p->ctx,
                       p->ctx[0] ? ": " : "", detail);
}

static uint64_t left(const parser *p) { return p->g->size - p->pos; }

static int need(parser *p, uint64_t n, const char *what) {
    if (n <= left(p)) return 0;
    return fail(p, p->pos, DS4_EFORMAT, "truncated %s: needs %llu bytes, %llu left in the file", what,
                (unsigned long long)n, (unsigned long long)left(p));
}

static int read_u32(parser *p, const char *what, uint32_t *out) {
    if (need(p, 4, what) != 0) return -1;
    memcpy(out, p->g->base + p->pos, 4);
    p->pos += 4;
    return 0;
}

static int read_u64(parser *p, const char *what, uint64_t *out) {
    if (need(p, 8, what) != 0) return -1;
    memcpy(out, p->g->base + p->pos, 8);
    p->pos += 8;
    return 0;
}

/* A GGUF string: u64 length, then that many bytes (any bytes: GGUF does not
 * require UTF-8, so none is checked). */
static int read_str(parser *p, const char *what, ds4_str *out) {
    uint64_t at = p->pos;
    uint64_t len;
    if (read_u64(p, what, &len) != 0) return -1;
    if (len > left(p))
        return fail(p, at, DS4_ERANGE, "%s length %llu exceeds the %llu bytes left in the file", what,
                    (unsigned long long)len, (unsigned long long)left(p));
    out->ptr = (const char *)p->g->base + p->pos;
    out->len = len;
    p->pos += len;
    return 0;
}

/* A key or tensor name: a string that the API hands out NUL-terminated, so
 * it may not contain a NUL byte itself. */
static int read_name(parser *p, const char *what, char **out) {
    uint64_t at = p->pos;
    ds4_str s;
    if (read_str(p, what, &s) != 0) return -1;
    if (s.len && memchr(s.ptr, '\0', s.len)) return fail(p, at, DS4_EFORMAT, "%s contains a NUL byte", what);
    char *copy = malloc(s.len + 1);
    if (!copy) return fail(p, at, DS4_ENOMEM, "out of memory copying a %llu-byte %s", (unsigned long long)s.len, what);
    if (s.len) memcpy(copy, s.ptr, s.len);
    copy[s.len] = '\0';
    *out = copy;
    return 0;
}

static int read_scalar(parser *p, ds4_gguf_vtype t, ds4_gguf_value *v) {
    size_t sz = ds4_gguf_vtype_size(t);
    const char *what = ds4_gguf_vtype_name(t);
    if (need(p, sz, what) != 0) return -1;
    const uint8_t *b = p->g->base + p->pos;
    uint8_t u8;
    int8_t i8;
    uint16_t u16;
    int16_t i16;
    uint32_t u32;
    int32_t i32;
    float f32;
    switch (t) {
    case DS4_GGUF_U8:
        memcpy(&u8, b, 1);
        v->u = u8;
        break;
    case DS4_GGUF_I8:
        memcpy(&i8, b, 1);
        v->i = i8;
        break;
    case DS4_GGUF_U16:
        memcpy(&u16, b, 2);
        v->u = u16;
        break;
    case DS4_GGUF_I16:
        memcpy(&i16, b, 2);
        v->i = i16;
        break;
    case DS4_GGUF_U32:
        memcpy(&u32, b, 4);
        v->u = u32;
        break;
    case DS4_GGUF_I32:
        memcpy(&i32, b, 4);
        v->i = i32;
        break;
    case DS4_GGUF_F32:
        memcpy(&f32, b, 4);
        v->f = f32;
        break;
    case DS4_GGUF_U64: memcpy(&v->u, b, 8); break;
    case DS4_GGUF_I64: memcpy(&v->i, b, 8); break;
    case DS4_GGUF_F64: memcpy(&v->f, b, 8); break;
    case DS4_GGUF_BOOL:
        if (b[0] > 1) return fail(p, p->pos, DS4_EFORMAT, "bool value %u is neither 0 nor 1", b[0]);
        v->b = b[0] != 0;
        break;
    default: return fail(p, p->pos, DS4_EFORMAT, "internal: %u is not a scalar type", (unsigned)t);
    }
    p->pos += sz;
    return 0;
}

/* An array: u32 element type, u64 count, then the elements.  Fixed-size
 * elements are left in place; string elements are indexed into `strs`. */
static int read_array(parser *p, ds4_gguf_array *a) {
    uint64_t type_at = p->pos;
    uint32_t et;
    if (read_u32(p, "array element type", &et) != 0) return -1;
    if (et >= DS4_GGUF_VTYPE_COUNT) return fail(p, type_at, DS4_EFORMAT, "unknown array element type %u", et);
    if (et == DS4_GGUF_ARRAY) return fail(p, type_at, DS4_EUNSUPPORTED, "nested arrays are not supported");
    a->type = (ds4_gguf_vtype)et;

    uint64_t count_at = p->pos;
    uint64_t count;
    if (read_u64(p, "array count", &count) != 0) return -1;
    size_t esize = a->type == DS4_GGUF_STRING ? 8 : ds4_gguf_vtype_size(a->type);
    if (count > left(p) / esize)
        return fail(p, count_at, DS4_ERANGE,
                    "array of %llu %s elements needs at least %llu bytes each, %llu bytes left in the file",
                    (unsigned long long)count, ds4_gguf_vtype_name(a->type), (unsigned long long)esize,
                    (unsigned long long)left(p));
    a->count = count;
    a->data = p->g->base + p->pos;

    if (a->type != DS4_GGUF_STRING) {
        if (a->type == DS4_GGUF_BOOL) {
            for (uint64_t i = 0; i < count; i++)
                if (a->data[i] > 1)
                    return fail(p, p->pos + i, DS4_EFORMAT, "bool element %llu has value %u, neither 0 nor 1",
                                (unsigned long long)i, a->data[i]);
        }
        p->pos += count * esize;
        return 0;
    }
    if (count == 0) return 0;
    /* count <= bytes left / 8, so this allocation is bounded by the file size. */
    a->strs = malloc((size_t)count * sizeof(ds4_str));
    if (!a->strs) return fail(p, count_at, DS4_ENOMEM, "out of memory for %llu strings", (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++)
        if (read_str(p, "array string", &a->strs[i]) != 0) return -1;
    return 0;
}

static int read_kv(parser *p, ds4_gguf_kv *kv, uint64_t index) {
    gguf_index *ix = p->g->index;
    kv->file_offset = p->pos;
    if (read_name(p, "key", &kv->key) != 0) return -1;
    quote_name(p->ctx + 4, sizeof(p->ctx) - 4, kv->key, strlen(kv->key));
    memcpy(p->ctx, "key ", 4);

    uint64_t first;
    int r = ds4_name_index_put(&ix->kv, kv->key, index, &first, p->err);
    if (r < 0) return -1;
    if (r == 0)
        return fail(p, kv->file_offset, DS4_EFORMAT, "duplicate key (first at offset %llu)",
                    (unsigned long long)p->g->kv[first].file_offset);

    uint64_t type_at = p->pos;
    uint32_t t;
    if (read_u32(p, "value type", &t) != 0) return -1;
    if (t >= DS4_GGUF_VTYPE_COUNT) return fail(p, type_at, DS4_EFORMAT, "unknown value type %u", t);
    kv->value.type = (ds4_gguf_vtype)t;
    kv->raw = p->g->base + p->pos;
    if (t == DS4_GGUF_STRING) return read_str(p, "string", &kv->value.s);
    if (t == DS4_GGUF_ARRAY) return read_array(p, &kv->value.a);
    return read_scalar(p, kv->value.type, &kv->value);
}

/* ndim, dims and type of one tensor info; fills the geometry fields. */
static int read_tensor_shape(parser *p, ds4_gguf_tensor *t) {
    uint64_t at = p->pos;
    if (read_u32(p, "tensor ndim", &t->ndim) != 0) return -1;
    if (t->ndim == 0 || t->ndim > DS4_GGUF_MAX_DIMS)
        return fail(p, at, DS4_EFORMAT, "ndim %u is not in 1..%d", t->ndim, DS4_GGUF_MAX_DIMS);
    t->nelements = 1;
    for (uint32_t d = 0; d < DS4_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->ndim; d++) {
        at = p->pos;
        if (read_u64(p, "tensor dimension", &t->ne[d]) != 0) return -1;
        if (t->ne[d] == 0) return fail(p, at, DS4_EFORMAT, "dimension %u is zero", d);
        /* Element counts are int64 everywhere downstream. */
        if (t->ne[d] > (uint64_t)INT64_MAX / t->nelements)
            return fail(p, at, DS4_ERANGE, "element count overflows at dimension %u (%llu)", d,
                        (unsigned long long)t->ne[d]);
        t->nelements *= t->ne[d];
    }
    at = p->pos;
    if (read_u32(p, "tensor type", &t->type) != 0) return -1;
    const ds4_type_info *ti = ds4_type_get(t->type);
    if (!ti) return fail(p, at, DS4_EFORMAT, "unknown tensor type %u", t->type);
    /* Rows are whole blocks, as GGML requires. */
    if (t->ne[0] % (uint64_t)ti->block_elems != 0)
        return fail(p, at, DS4_EFORMAT, "row of %llu elements is not a whole number of %s blocks of %lld",
                    (unsigned long long)t->ne[0], ti->name, (long long)ti->block_elems);
    int ok;
    t->nbytes = ds4_type_nbytes_checked(t->type, t->nelements, &ok);
    if (!ok)
        return fail(p, at, DS4_ERANGE, "byte size of %llu %s elements overflows", (unsigned long long)t->nelements,
                    ti->name);
    return 0;
}

static int read_tensor_info(parser *p, ds4_gguf_tensor *t, uint64_t index) {
    gguf_index *ix = p->g->index;
    t->file_offset = p->pos;
    if (read_name(p, "tensor name", &t->name) != 0) return -1;
    quote_name(p->ctx + 7, sizeof(p->ctx) - 7, t->name, strlen(t->name));
    memcpy(p->ctx, "tensor ", 7);

    uint64_t first;
    int r = ds4_name_index_put(&ix->tensors, t->name, index, &first, p->err);
    if (r < 0) return -1;
    if (r == 0)
        return fail(p, t->file_offset, DS4_EFORMAT, "duplicate tensor name (first at offset %llu)",
                    (unsigned long long)p->g->tensors[first].file_offset);
    if (read_tensor_shape(p, t) != 0) return -1;
    return read_u64(p, "tensor data offset", &t->offset);
}

/* Where a tensor info's data-offset field lies (its last 8 bytes). */
static uint64_t offset_field_at(const ds4_gguf_tensor *t) {
    return t->file_offset + 8 + strlen(t->name) + 4 + 8ull * t->ndim + 4;
}

static void set_tensor_ctx(parser *p, const ds4_gguf_tensor *t) {
    memcpy(p->ctx, "tensor ", 7);
    quote_name(p->ctx + 7, sizeof(p->ctx) - 7, t->name, strlen(t->name));
}

static int read_alignment(parser *p) {
    p->g->alignment = DS4_GGUF_DEFAULT_ALIGNMENT;
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(p->g, "general.alignment");
    if (!kv) return 0;
    snprintf(p->ctx, sizeof(p->ctx), "key 'general.alignment'");
    if (kv->value.type != DS4_GGUF_U32)
        return fail(p, kv->file_offset, DS4_EFORMAT, "type is %s, expected u32", ds4_gguf_vtype_name(kv->value.type));
    uint64_t a = kv->value.u;
    if (a == 0 || (a & (a - 1)) != 0)
        return fail(p, kv->file_offset, DS4_EFORMAT, "value %llu is not a nonzero power of two", (unsigned long long)a);
    p->g->alignment = (uint32_t)a;
    p->ctx[0] = '\0';
    return 0;
}

typedef struct extent {
    uint64_t begin, end;
    uint64_t index;
} extent;

static int cmp_extent(const void *va, const void *vb) {
    const extent *a = va, *b = vb;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Each tensor's data must be aligned, lie inside the file and overlap no
 * other tensor's data. */
static int place_tensors(parser *p) {
    ds4_gguf *g = p->g;
    uint64_t data_bytes = g->data_offset <= g->size ? g->size - g->data_offset : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        ds4_gguf_tensor *t = &g->tensors[i];
        set_tensor_ctx(p, t);
        uint64_t at = offset_field_at(t);
        if (t->offset % g->alignment != 0)
            return fail(p, at, DS4_EFORMAT, "data offset %llu is not a multiple of the alignment %u",
                        (unsigned long long)t->offset, g->alignment);
        if (p->header_only) {
            t->data = NULL;
            continue;
        }
        if (data_bytes == 0 && t->nbytes > 0)
            return fail(p, at, DS4_ERANGE,
                        "the file holds no tensor data: a header-only file (ds4-mkmodel --header-only), which ds4 "
                        "--inspect and ds4-gguf info read");
        if (t->offset > data_bytes || t->nbytes > data_bytes - t->offset)
            return fail(p, at, DS4_ERANGE,
                        "data at file offset %llu + %llu bytes ends past the end of the file (%llu bytes)",
                        (unsigned long long)(g->data_offset + t->offset), (unsigned long long)t->nbytes,
                        (unsigned long long)g->size);
        t->data = g->base + g->data_offset + t->offset;
    }
    p->ctx[0] = '\0';
    if (g->n_tensors < 2) return 0;

    extent *ex = malloc((size_t)g->n_tensors * sizeof(*ex));
    if (!ex) return fail(p, p->pos, DS4_ENOMEM, "out of memory sorting %llu tensors", (unsigned long long)g->n_tensors);
    for (uint64_t i = 0; i < g->n_tensors; i++)
        ex[i] = (extent){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].nbytes, i};
    qsort(ex, (size_t)g->n_tensors, sizeof(*ex), cmp_extent);
    int rc = 0;
    for (uint64_t i = 1; i < g->n_tensors && rc == 0; i++) {
        if (ex[i].begin >= ex[i - 1].end) continue;
        const ds4_gguf_tensor *t = &g->tensors[ex[i].index], *o = &g->tensors[ex[i - 1].index];
        char other[120];
        quote_name(other, sizeof(other), o->name, strlen(o->name));
        set_tensor_ctx(p, t);
        rc = fail(p, offset_field_at(t), DS4_EFORMAT,
                  "data [%llu, %llu) overlaps tensor %s data [%llu, %llu) (offsets in the data section)",
                  (unsigned long long)ex[i].begin, (unsigned long long)ex[i].end, other,
                  (unsigned long long)ex[i - 1].begin, (unsigned long long)ex[i - 1].end);
    }
    free(ex);
    return rc;
}

static int read_header(parser *p) {
    ds4_gguf *g = p->g;
    uint32_t magic;
    if (read_u32(p, "magic", &magic) != 0) return -1;
    if (magic != DS4_GGUF_MAGIC) return fail(p, 0, DS4_EFORMAT, "bad magic 0x%08x, not a GGUF file", magic);
    if (read_u32(p, "version", &g->version) != 0) return -1;
    if (g->version != DS4_GGUF_VERSION)
        return fail(p, 4, DS4_EUNSUPPORTED, "GGUF version %u, only version 3 is supported", g->version);
    uint64_t n_tensors, n_kv;
    if (read_u64(p, "tensor count", &n_tensors) != 0) return -1;
    if (read_u64(p, "metadata count", &n_kv) != 0) return -1;

    /* Bound both counts by the bytes left before allocating for them. */
    uint64_t rest = left(p);
    if (n_kv > rest / MIN_KV_BYTES)
        return fail(p, 16, DS4_ERANGE, "metadata count %llu cannot fit in the %llu bytes left in the file",
                    (unsigned long long)n_kv, (unsigned long long)rest);
    rest -= n_kv * MIN_KV_BYTES;
    if (n_tensors > rest / MIN_TENSOR_INFO_BYTES)
        return fail(p, 8, DS4_ERANGE, "tensor count %llu cannot fit in the %llu bytes left in the file",
                    (unsigned long long)n_tensors, (unsigned long long)left(p));

    gguf_index *ix = g->index;
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof(*g->kv));
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof(*g->tensors));
    if (!g->kv || !g->tensors)
        return fail(p, 8, DS4_ENOMEM, "out of memory for %llu entries and %llu tensors", (unsigned long long)n_kv,
                    (unsigned long long)n_tensors);
    /* n_kv and n_tensors count the allocated entries so close() frees them. */
    g->n_kv = n_kv;
    g->n_tensors = n_tensors;
    if (ds4_name_index_init(&ix->kv, n_kv, p->err) != 0) return -1;
    return ds4_name_index_init(&ix->tensors, n_tensors, p->err);
}

static int parse(parser *p) {
    ds4_gguf *g = p->g;
    if (read_header(p) != 0) return -1;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (read_kv(p, &g->kv[i], i) != 0) return -1;
        p->ctx[0] = '\0';
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (read_tensor_info(p, &g->tensors[i], i) != 0) return -1;
        p->ctx[0] = '\0';
    }
    if (read_alignment(p) != 0) return -1;
    /* pos <= size, so rounding up cannot overflow for any real file. */
    g->data_offset = (p->pos + g->alignment - 1) / g->alignment * g->alignment;
    return place_tensors(p);
}

/* Allocate the reader state; base/size are filled by the caller. */
static ds4_gguf *new_reader(const char *name, ds4_err *err) {
    ds4_gguf *g = calloc(1, sizeof(*g));
    if (!g) {
        ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", name);
        return NULL;
    }
    g->path = strdup(name);
    g->index = calloc(1, sizeof(gguf_index));
    if (!g->path || !g->index) {
        ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", name);
        ds4_gguf_close(g);
        return NULL;
    }
    return g;
}

static ds4_gguf *parse_or_close(ds4_gguf *g, bool header_only, ds4_err *err) {
    parser p = {.g = g, .err = err, .header_only = header_only};
    g->header_only = header_only;
    if (parse(&p) != 0) {
        ds4_gguf_close(g);
        return NULL;
    }
    return g;
}

ds4_gguf *ds4_gguf_open_buffer(const void *buf, size_t size, const char *name, ds4_err *err) {
    if (!name) name = "<memory>";
    if (!buf && size) {
        ds4_err_set(err, DS4_EINVAL, "%s: NULL buffer of %zu bytes", name, size);
        return NULL;
    }
    ds4_gguf *g = new_reader(name, err);
    if (!g) return NULL;
    g->base = buf;
    g->size = size;
    return parse_or_close(g, false, err);
}

static ds4_gguf *open_file(const char *path, bool header_only, ds4_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ds4_err_set(err, errno == ENOENT ? DS4_ENOTFOUND : DS4_EIO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ds4_err_set(err, DS4_EIO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ds4_err_set(err, DS4_EIO, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    ds4_gguf *g = new_reader(path, err);
    if (!g) {
        close(fd);
        return NULL;
    }
    g->size = (uint64_t)st.st_size;
    if (g->size > 0) {
        void *m = mmap(NULL, (size_t)g->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            ds4_err_set(err, DS4_EIO, "%s: mmap of %llu bytes failed: %s", path, (unsigned long long)g->size,
                        strerror(errno));
            close(fd);
            ds4_gguf_close(g);
            return NULL;
        }
        g->base = m;
        g->owns_map = 1;
    }
    close(fd);
    return parse_or_close(g, header_only, err);
}

ds4_gguf *ds4_gguf_open(const char *path, ds4_err *err) { return open_file(path, false, err); }

ds4_gguf *ds4_gguf_open_header(const char *path, ds4_err *err) { return open_file(path, true, err); }

void ds4_gguf_close(ds4_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
        ds4_gguf_kv *kv = &g->kv[i];
        free(kv->key);
        if (kv->value.type == DS4_GGUF_ARRAY) free(kv->value.a.strs);
    }
    free(g->kv);
    for (uint64_t i = 0; g->tensors && i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->tensors);
    gguf_index *ix = g->index;
    if (ix) {
        ds4_name_index_free(&ix->kv);
        ds4_name_index_free(&ix->tensors);
        free(ix);
    }
    if (g->owns_map) munmap((void *)g->base, (size_t)g->size);
    free(g->path);
    free(g);
}

/* ------------------------------------------------------------- lookups */

const ds4_gguf_kv *ds4_gguf_find_kv(const ds4_gguf *g, const char *key) {
    const gguf_index *ix = g->index;
    uint64_t i;
    return ds4_name_index_get(&ix->kv, key, &i) ? &g->kv[i] : NULL;
}

const ds4_gguf_tensor *ds4_gguf_find_tensor(const ds4_gguf *g, const char *name) {
    const gguf_index *ix = g->index;
    uint64_t i;
    return ds4_name_index_get(&ix->tensors, name, &i) ? &g->tensors[i] : NULL;
}

/* -------------------------------------------------------------- getters */

static const ds4_gguf_kv *need_kv(const ds4_gguf *g, const char *key, ds4_err *err) {
    const ds4_gguf_kv *kv = ds4_gguf_find_kv(g, key);
    if (!kv) ds4_err_set(err, DS4_ENOTFOUND, "%s: key '%s' not found", g->path, key);
    return kv;
}

static bool is_unsigned(ds4_gguf_vtype t) {
    return t == DS4_GGUF_U8 || t == DS4_GGUF_U16 || t == DS4_GGUF_U32 || t == DS4_GGUF_U64;
}

static bool is_signed(ds4_gguf_vtype t) {
    return t == DS4_GGUF_I8 || t == DS4_GGUF_I16 || t == DS4_GGUF_I32 || t == DS4_GGUF_I64;
}

static int wrong_type(const ds4_gguf *g, const ds4_gguf_kv *kv, const char *want, ds4_err *err) {
    return ds4_err_set(err, DS4_EFORMAT, "%s: offset %llu: key '%s' has type %s, expected %s", g->path,
                       (unsigned long long)kv->file_offset, kv->key, ds4_gguf_vtype_name(kv->value.type), want);
}

static int out_of_range(const ds4_gguf *g, const ds4_gguf_kv *kv, const char *want, ds4_err *err) {
    if (is_signed(kv->value.type))
        return ds4_err_set(err, DS4_EFORMAT, "%s: offset %llu: key '%s' value %lld does not fit in %s", g->path,
                           (unsigned long long)kv->file_offset, kv->key, (long long)kv->value.i, want);
    return ds4_err_set(err, DS4_EFORMAT, "%s: offset %llu: key '%s' value %llu does not fit in %s", g->path,
                       (unsigned long long)kv->file_offset, kv->key, (unsigned long long)kv->value.u, want);
}

/* Whether an integer value lies in [min, max]; non-integers are a type error. */
static int integer_in_range(const ds4_gguf *g, const ds4_gguf_kv *kv, int64_t min, uint64_t max, const char *want,
                            ds4_err *err) {
    ds4_gguf_vtype t = kv->value.type;
    if (is_unsigned(t)) {
        if (kv->value.u > max) return out_of_range(g, kv, want, err);
    } else if (is_signed(t)) {
        if (kv->value.i < min || (kv->value.i >= 0 && (uint64_t)kv->value.i > max))
            return out_of_range(g, kv, want, err);
    } else {
        return wrong_type(g, kv, "an integer", err);
    }
    return 0;
}

int ds4_gguf_get_u64(const ds4_gguf *g, const char *key, uint64_t *out, ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv || integer_in_range(g, kv, 0, UINT64_MAX, "u64", err) != 0) return -1;
    *out = is_unsigned(kv->value.type) ? kv->value.u : (uint64_t)kv->value.i;
    return 0;
}

int ds4_gguf_get_u32(const ds4_gguf *g, const char *key, uint32_t *out, ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv || integer_in_range(g, kv, 0, UINT32_MAX, "u32", err) != 0) return -1;
    *out = (uint32_t)(is_unsigned(kv->value.type) ? kv->value.u : (uint64_t)kv->value.i);
    return 0;
}

int ds4_gguf_get_i64(const ds4_gguf *g, const char *key, int64_t *out, ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv || integer_in_range(g, kv, INT64_MIN, INT64_MAX, "i64", err) != 0) return -1;
    *out = is_unsigned(kv->value.type) ? (int64_t)kv->value.u : kv->value.i;
    return 0;
}

int ds4_gguf_get_f64(const ds4_gguf *g, const char *key, double *out, ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv) return -1;
    /* Integers are exact in a double up to 2^53. */
    const uint64_t exact = 1ull << 53;
    ds4_gguf_vtype t = kv->value.type;
    if (t == DS4_GGUF_F32 || t == DS4_GGUF_F64) *out = kv->value.f;
    else if (is_unsigned(t) && kv->value.u <= exact) *out = (double)kv->value.u;
    else if (is_signed(t) && kv->value.i <= (int64_t)exact && kv->value.i >= -(int64_t)exact)
        *out = (double)kv->value.i;
    else if (is_unsigned(t) || is_signed(t)) return out_of_range(g, kv, "f64 exactly", err);
    else return wrong_type(g, kv, "a number", err);
    return 0;
}

int ds4_gguf_get_bool(const ds4_gguf *g, const char *key, bool *out, ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv) return -1;
    if (kv->value.type != DS4_GGUF_BOOL) return wrong_type(g, kv, "bool", err);
    *out = kv->value.b;
    return 0;
}

int ds4_gguf_get_str(const ds4_gguf *g, const char *key, ds4_str *out, ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv) return -1;
    if (kv->value.type != DS4_GGUF_STRING) return wrong_type(g, kv, "str", err);
    *out = kv->value.s;
    return 0;
}

int ds4_gguf_get_arr(const ds4_gguf *g, const char *key, ds4_gguf_vtype elem, const ds4_gguf_array **out,
                     ds4_err *err) {
    const ds4_gguf_kv *kv = need_kv(g, key, err);
    if (!kv) return -1;
    if (kv->value.type != DS4_GGUF_ARRAY) return wrong_type(g, kv, "arr", err);
    if (elem != DS4_GGUF_VTYPE_COUNT && kv->value.a.type != elem)
        return ds4_err_set(err, DS4_EFORMAT, "%s: offset %llu: key '%s' is an array of %s, expected %s", g->path,
                           (unsigned long long)kv->file_offset, kv->key, ds4_gguf_vtype_name(kv->value.a.type),
                           ds4_gguf_vtype_name(elem));
    *out = &kv->value.a;
    return 0;
}
