/*
 * gguf_write.c - the streaming GGUF v3 writer (see gguf.h).
 *
 * Metadata is serialized into a memory buffer as it is added; tensor
 * declarations are kept as a list.  The first ds4_gguf_w_data() call (or
 * close, for a file without tensor data) writes the header, the metadata
 * and the tensor table with offsets computed from the declared sizes; the
 * tensor bytes then go straight to the file in declaration order, each
 * padded with zeros to the alignment.  This is the layout GGML and gguf-py
 * write, so a file with the same content comes out byte for byte the same.
 *
 * Zero bytes handed over as a hole (ds4_gguf_w_hole) are skipped with a
 * seek, so a mostly-zero model (ds4-mkmodel --sparse-experts) is a sparse
 * file; the final length is set at close in case the file ends in one.
 *
 * The file is written as PATH.tmp.PID.N and renamed over PATH only after a
 * successful fsync, so PATH is either the old file or the complete new one.
 * The first error is kept in the writer; later calls fail fast and close
 * reports it.
 */
#include "format/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf_index.h"
#include "format/quants.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF writer copies fields in host order and assumes a little-endian host"
#endif

#define WRITE_BUF_BYTES (1u << 20)

typedef struct wtensor {
    char *name;
    uint32_t ndim;
    uint64_t ne[DS4_GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t nbytes;
    uint64_t offset; /* in the data section */
} wtensor;

struct ds4_gguf_writer {
    char *path;
    char *tmp_path;
    int fd;
    uint32_t alignment;
    bool alignment_given; /* nonzero at open: store general.alignment */
    bool alignment_kv;    /* the caller wrote general.alignment itself */

    uint8_t *meta; /* serialized kv entries */
    size_t meta_len, meta_cap;
    uint64_t n_kv;
    ds4_name_index keys; /* names owned by key_names */
    char **key_names;
    uint64_t keys_cap;

    wtensor *tensors;
    uint64_t n_tensors, tensors_cap;
    ds4_name_index names; /* points at tensors[i].name */

    bool header_done;
    uint64_t cur;         /* tensor receiving data */
    uint64_t cur_written; /* its bytes so far */
    uint64_t file_pos;    /* bytes handed to the file (buffered or not) */
    uint8_t *buf;
    size_t buf_len;

    bool failed;
    ds4_err err;
};

static int wfail(ds4_gguf_writer *w, ds4_errcode code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Record the first error (later ones are consequences) and return -1. */
static int wfail(ds4_gguf_writer *w, ds4_errcode code, const char *fmt, ...) {
    if (w->failed) return -1;
    char detail[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    w->failed = true;
    return ds4_err_set(&w->err, code, "%s: %s", w->path, detail);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ----------------------------------------------------------- file output */

static int write_all(ds4_gguf_writer *w, const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t at = w->file_pos - w->buf_len;
    while (n > 0) {
        ssize_t r = write(w->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return wfail(w, DS4_EIO, "write to %s at offset %llu failed: %s", w->tmp_path, (unsigned long long)at,
                         r < 0 ? strerror(errno) : "no progress");
        p += r;
        n -= (size_t)r;
        at += (uint64_t)r;
    }
    return 0;
}

static int flush_buf(ds4_gguf_writer *w) {
    if (w->buf_len == 0) return 0;
    if (write_all(w, w->buf, w->buf_len) != 0) return -1;
    w->buf_len = 0;
    return 0;
}

/* Small pieces are gathered in the buffer; large ones bypass it. */
static int emit(ds4_gguf_writer *w, const void *data, uint64_t n) {
    if (w->failed) return -1;
    if (n == 0) return 0;
    if (w->buf_len + n <= WRITE_BUF_BYTES) {
        memcpy(w->buf + w->buf_len, data, (size_t)n);
        w->buf_len += (size_t)n;
        w->file_pos += n;
        return 0;
    }
    if (flush_buf(w) != 0) return -1;
    if (n < WRITE_BUF_BYTES) return emit(w, data, n);
    if (write_all(w, data, (size_t)n) != 0) return -1;
    w->file_pos += n;
    return 0;
}

static int emit_zeros(ds4_gguf_writer *w, uint64_t n) {
    static const uint8_t zeros[4096];
    while (n > 0) {
        uint64_t k = n < sizeof(zeros) ? n : sizeof(zeros);
        if (emit(w, zeros, k) != 0) return -1;
        n -= k;
    }
    return 0;
}

static int pad_to_alignment(ds4_gguf_writer *w) {
    return emit_zeros(w, align_up(w->file_pos, w->alignment) - w->file_pos);
}

/* ------------------------------------------------------------ metadata */

static int meta_put(ds4_gguf_writer *w, const void *data, uint64_t n) {
    if (n > SIZE_MAX - w->meta_len) return wfail(w, DS4_ENOMEM, "metadata too large");
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n) cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        uint8_t *m = realloc(w->meta, cap);
        if (!m) return wfail(w, DS4_ENOMEM, "out of memory for %zu bytes of metadata", cap);
        w->meta = m;
        w->meta_cap = cap;
    }
    if (n) memcpy(w->meta + w->meta_len, data, (size_t)n);
    w->meta_len += (size_t)n;
    return 0;
}

static int meta_u32(ds4_gguf_writer *w, uint32_t v) { return meta_put(w, &v, 4); }

static int meta_u64(ds4_gguf_writer *w, uint64_t v) { return meta_put(w, &v, 8); }

static int meta_str(ds4_gguf_writer *w, const char *s, uint64_t len) {
    if (meta_u64(w, len) != 0) return -1;
    return meta_put(w, s, len);
}

/* general.alignment written by the caller must agree with the writer's
 * alignment; with none given at open, the caller's value is adopted. */
static int check_alignment_kv(ds4_gguf_writer *w, ds4_gguf_vtype type, uint64_t v) {
    if (type != DS4_GGUF_U32)
        return wfail(w, DS4_EINVAL, "key 'general.alignment' must be u32, got %s", ds4_gguf_vtype_name(type));
    if (v == 0 || (v & (v - 1)) != 0)
        return wfail(w, DS4_EINVAL, "key 'general.alignment': %llu is not a nonzero power of two",
                     (unsigned long long)v);
    if (w->alignment_given && v != w->alignment)
        return wfail(w, DS4_EINVAL, "key 'general.alignment' = %llu but the writer was opened with alignment %u",
                     (unsigned long long)v, w->alignment);
    w->alignment = (uint32_t)v;
    w->alignment_kv = true;
    return 0;
}

/* Start an entry: checks the writer state and the key, then serializes the
 * key and the value type.  `scalar` is the value for general.alignment. */
static int begin_kv(ds4_gguf_writer *w, const char *key, ds4_gguf_vtype type, uint64_t scalar) {
    if (w->failed) return -1;
    if (!key) return wfail(w, DS4_EINVAL, "metadata key is NULL");
    if (w->header_done) return wfail(w, DS4_EINVAL, "key '%s' added after tensor data started", key);
    if (strcmp(key, "general.alignment") == 0 && check_alignment_kv(w, type, scalar) != 0) return -1;
    char *copy = strdup(key);
    if (!copy) return wfail(w, DS4_ENOMEM, "out of memory for key '%s'", key);
    ds4_err e;
    int r = ds4_name_index_put(&w->keys, copy, w->n_kv, NULL, &e);
    if (r <= 0) {
        free(copy);
        if (r < 0) return wfail(w, e.code, "key '%s': %s", key, e.msg);
        return wfail(w, DS4_EINVAL, "duplicate key '%s'", key);
    }
    w->key_names[w->n_kv++] = copy;
    if (meta_str(w, key, strlen(key)) != 0) return -1;
    return meta_u32(w, type);
}

/* Room in key_names for one more key. */
static int reserve_key(ds4_gguf_writer *w) {
    if (!w || w->failed) return -1;
    if (w->n_kv == w->keys_cap) {
        uint64_t cap = w->keys_cap ? w->keys_cap * 2 : 16;
        char **k = realloc(w->key_names, (size_t)cap * sizeof(*k));
        if (!k) return wfail(w, DS4_ENOMEM, "out of memory for %llu keys", (unsigned long long)cap);
        w->key_names = k;
        w->keys_cap = cap;
    }
    return 0;
}

static int add_scalar(ds4_gguf_writer *w, const char *key, ds4_gguf_vtype type, const void *v, uint64_t as_u64) {
    if (reserve_key(w) != 0 || begin_kv(w, key, type, as_u64) != 0) return -1;
    return meta_put(w, v, ds4_gguf_vtype_size(type));
}

int ds4_gguf_w_u8(ds4_gguf_writer *w, const char *key, uint8_t v) { return add_scalar(w, key, DS4_GGUF_U8, &v, v); }
int ds4_gguf_w_i8(ds4_gguf_writer *w, const char *key, int8_t v) { return add_scalar(w, key, DS4_GGUF_I8, &v, 0); }
int ds4_gguf_w_u16(ds4_gguf_writer *w, const char *key, uint16_t v) { return add_scalar(w, key, DS4_GGUF_U16, &v, v); }
int ds4_gguf_w_i16(ds4_gguf_writer *w, const char *key, int16_t v) { return add_scalar(w, key, DS4_GGUF_I16, &v, 0); }
int ds4_gguf_w_u32(ds4_gguf_writer *w, const char *key, uint32_t v) { return add_scalar(w, key, DS4_GGUF_U32, &v, v); }
int ds4_gguf_w_i32(ds4_gguf_writer *w, const char *key, int32_t v) { return add_scalar(w, key, DS4_GGUF_I32, &v, 0); }
int ds4_gguf_w_u64(ds4_gguf_writer *w, const char *key, uint64_t v) { return add_scalar(w, key, DS4_GGUF_U64, &v, v); }
int ds4_gguf_w_i64(ds4_gguf_writer *w, const char *key, int64_t v) { return add_scalar(w, key, DS4_GGUF_I64, &v, 0); }
int ds4_gguf_w_f32(ds4_gguf_writer *w, const char *key, float v) { return add_scalar(w, key, DS4_GGUF_F32, &v, 0); }
int ds4_gguf_w_f64(ds4_gguf_writer *w, const char *key, double v) { return add_scalar(w, key, DS4_GGUF_F64, &v, 0); }
int ds4_gguf_w_bool(ds4_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, DS4_GGUF_BOOL, &b, 0);
}

int ds4_gguf_w_strn(ds4_gguf_writer *w, const char *key, const char *s, uint64_t len) {
    if (!w) return -1;
    if (!s && len)
        return wfail(w, DS4_EINVAL, "key '%s': NULL string of %llu bytes", key ? key : "(null)",
                     (unsigned long long)len);
    if (reserve_key(w) != 0 || begin_kv(w, key, DS4_GGUF_STRING, 0) != 0) return -1;
    return meta_str(w, s, len);
}

int ds4_gguf_w_str(ds4_gguf_writer *w, const char *key, const char *s) {
    if (!w) return -1;
    if (!s) return wfail(w, DS4_EINVAL, "key '%s': NULL string", key ? key : "(null)");
    return ds4_gguf_w_strn(w, key, s, strlen(s));
}

int ds4_gguf_w_arr(ds4_gguf_writer *w, const char *key, ds4_gguf_vtype elem, const void *data, uint64_t count) {
    if (!w) return -1;
    size_t esize = elem < DS4_GGUF_VTYPE_COUNT ? ds4_gguf_vtype_size(elem) : 0;
    if (esize == 0)
        return wfail(w, DS4_EINVAL, "key '%s': %s is not a fixed-size array element type", key ? key : "(null)",
                     ds4_gguf_vtype_name(elem));
    if (count > SIZE_MAX / esize || (!data && count))
        return wfail(w, DS4_EINVAL, "key '%s': bad array of %llu elements", key ? key : "(null)",
                     (unsigned long long)count);
    /* GGUF bools are the bytes 0 and 1; readers reject anything else. */
    for (uint64_t i = 0; elem == DS4_GGUF_BOOL && i < count; i++)
        if (((const uint8_t *)data)[i] > 1)
            return wfail(w, DS4_EINVAL, "key '%s': bool element %llu is %u, not 0 or 1", key ? key : "(null)",
                         (unsigned long long)i, ((const uint8_t *)data)[i]);
    if (reserve_key(w) != 0 || begin_kv(w, key, DS4_GGUF_ARRAY, 0) != 0) return -1;
    if (meta_u32(w, elem) != 0 || meta_u64(w, count) != 0) return -1;
    return meta_put(w, data, count * esize);
}

int ds4_gguf_w_arr_str(ds4_gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                       uint64_t count) {
    if (!w) return -1;
    if (!strs && count)
        return wfail(w, DS4_EINVAL, "key '%s': NULL string array of %llu elements", key ? key : "(null)",
                     (unsigned long long)count);
    for (uint64_t i = 0; i < count; i++)
        if (!strs[i] && (!lens || lens[i]))
            return wfail(w, DS4_EINVAL, "key '%s': string %llu is NULL", key ? key : "(null)", (unsigned long long)i);
    if (reserve_key(w) != 0 || begin_kv(w, key, DS4_GGUF_ARRAY, 0) != 0) return -1;
    if (meta_u32(w, DS4_GGUF_STRING) != 0 || meta_u64(w, count) != 0) return -1;
    for (uint64_t i = 0; i < count; i++)
        if (meta_str(w, strs[i], lens ? lens[i] : strlen(strs[i])) != 0) return -1;
    return 0;
}

int ds4_gguf_w_copy_kv(ds4_gguf_writer *w, const ds4_gguf_kv *kv) {
    if (!w) return -1;
    if (!kv) return wfail(w, DS4_EINVAL, "copy of a NULL metadata entry");
    const ds4_gguf_value *v = &kv->value;
    if (v->type == DS4_GGUF_STRING) return ds4_gguf_w_strn(w, kv->key, v->s.ptr, v->s.len);
    if (v->type != DS4_GGUF_ARRAY && kv->raw && ds4_gguf_vtype_size(v->type))
        /* Scalars read from a file: the stored bytes, exactly. */
        return add_scalar(w, kv->key, v->type, kv->raw, v->u);
    if (v->type != DS4_GGUF_ARRAY) {
        /* Hand-made scalars: encode the decoded value in the stored width. */
        uint64_t u = v->u;
        int64_t i = v->i;
        switch (v->type) {
        case DS4_GGUF_U8: return ds4_gguf_w_u8(w, kv->key, (uint8_t)u);
        case DS4_GGUF_I8: return ds4_gguf_w_i8(w, kv->key, (int8_t)i);
        case DS4_GGUF_U16: return ds4_gguf_w_u16(w, kv->key, (uint16_t)u);
        case DS4_GGUF_I16: return ds4_gguf_w_i16(w, kv->key, (int16_t)i);
        case DS4_GGUF_U32: return ds4_gguf_w_u32(w, kv->key, (uint32_t)u);
        case DS4_GGUF_I32: return ds4_gguf_w_i32(w, kv->key, (int32_t)i);
        case DS4_GGUF_U64: return ds4_gguf_w_u64(w, kv->key, u);
        case DS4_GGUF_I64: return ds4_gguf_w_i64(w, kv->key, i);
        case DS4_GGUF_F32: return ds4_gguf_w_f32(w, kv->key, (float)v->f);
        case DS4_GGUF_F64: return ds4_gguf_w_f64(w, kv->key, v->f);
        case DS4_GGUF_BOOL: return ds4_gguf_w_bool(w, kv->key, v->b);
        default: return wfail(w, DS4_EINVAL, "key '%s': invalid value type %u", kv->key, (unsigned)v->type);
        }
    }
    const ds4_gguf_array *a = &v->a;
    if (a->type != DS4_GGUF_STRING) return ds4_gguf_w_arr(w, kv->key, a->type, a->data, a->count);
    if (reserve_key(w) != 0 || begin_kv(w, kv->key, DS4_GGUF_ARRAY, 0) != 0) return -1;
    if (meta_u32(w, DS4_GGUF_STRING) != 0 || meta_u64(w, a->count) != 0) return -1;
    for (uint64_t k = 0; k < a->count; k++)
        if (meta_str(w, a->strs[k].ptr, a->strs[k].len) != 0) return -1;
    return 0;
}

/* -------------------------------------------------------------- tensors */

static int check_shape(ds4_gguf_writer *w, const char *name, uint32_t ndim, const uint64_t *ne, uint32_t type,
                       uint64_t *nbytes) {
    if (ndim == 0 || ndim > DS4_GGUF_MAX_DIMS || !ne)
        return wfail(w, DS4_EINVAL, "tensor '%s': ndim %u is not in 1..%d", name, ndim, DS4_GGUF_MAX_DIMS);
    const ds4_type_info *ti = ds4_type_get(type);
    if (!ti) return wfail(w, DS4_EINVAL, "tensor '%s': unknown tensor type %u", name, type);
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        if (ne[d] == 0) return wfail(w, DS4_EINVAL, "tensor '%s': dimension %u is zero", name, d);
        if (ne[d] > (uint64_t)INT64_MAX / n) return wfail(w, DS4_ERANGE, "tensor '%s': element count overflows", name);
        n *= ne[d];
    }
    if (ne[0] % (uint64_t)ti->block_elems != 0)
        return wfail(w, DS4_EINVAL, "tensor '%s': row of %llu elements is not a whole number of %s blocks of %lld",
                     name, (unsigned long long)ne[0], ti->name, (long long)ti->block_elems);
    int ok;
    *nbytes = ds4_type_nbytes_checked(type, n, &ok);
    if (!ok) return wfail(w, DS4_ERANGE, "tensor '%s': byte size overflows", name);
    return 0;
}

int ds4_gguf_w_tensor(ds4_gguf_writer *w, const char *name, uint32_t ndim, const uint64_t *ne, uint32_t type) {
    if (!w || w->failed) return -1;
    if (!name) return wfail(w, DS4_EINVAL, "tensor name is NULL");
    if (w->header_done) return wfail(w, DS4_EINVAL, "tensor '%s' declared after tensor data started", name);
    uint64_t nbytes = 0;
    if (check_shape(w, name, ndim, ne, type, &nbytes) != 0) return -1;
    if (w->n_tensors == w->tensors_cap) {
        uint64_t cap = w->tensors_cap ? w->tensors_cap * 2 : 64;
        wtensor *t = realloc(w->tensors, (size_t)cap * sizeof(*t));
        if (!t) return wfail(w, DS4_ENOMEM, "out of memory for %llu tensors", (unsigned long long)cap);
        w->tensors = t;
        w->tensors_cap = cap;
    }
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof(*t));
    t->name = strdup(name);
    if (!t->name) return wfail(w, DS4_ENOMEM, "out of memory for tensor '%s'", name);
    /* Names live in their own allocations, so the index stays valid when
     * the table is resized. */
    ds4_err e;
    int r = ds4_name_index_put(&w->names, t->name, w->n_tensors, NULL, &e);
    if (r <= 0) {
        free(t->name);
        if (r < 0) return wfail(w, e.code, "tensor '%s': %s", name, e.msg);
        return wfail(w, DS4_EINVAL, "duplicate tensor '%s'", name);
    }
    t->ndim = ndim;
    for (uint32_t d = 0; d < DS4_GGUF_MAX_DIMS; d++) t->ne[d] = d < ndim ? ne[d] : 1;
    t->type = type;
    t->nbytes = nbytes;
    w->n_tensors++;
    return 0;
}

/* --------------------------------------------------------------- output */

static int emit_u32(ds4_gguf_writer *w, uint32_t v) { return emit(w, &v, 4); }

static int emit_u64(ds4_gguf_writer *w, uint64_t v) { return emit(w, &v, 8); }

/* Header, metadata and tensor table, then padding up to the data section.
 * Offsets are assigned here, once the alignment is final. */
static int write_header(ds4_gguf_writer *w) {
    bool add_alignment = w->alignment_given && !w->alignment_kv;
    emit_u32(w, DS4_GGUF_MAGIC);
    emit_u32(w, DS4_GGUF_VERSION);
    emit_u64(w, w->n_tensors);
    emit_u64(w, w->n_kv + (add_alignment ? 1 : 0));
    emit(w, w->meta, w->meta_len);
    if (add_alignment) {
        static const char key[] = "general.alignment";
        emit_u64(w, sizeof(key) - 1);
        emit(w, key, sizeof(key) - 1);
        emit_u32(w, DS4_GGUF_U32);
        emit_u32(w, w->alignment);
    }
    uint64_t offset = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        uint64_t room = UINT64_MAX - offset;
        if (room < w->alignment || t->nbytes > room - w->alignment)
            return wfail(w, DS4_ERANGE, "tensor '%s': data section too large", t->name);
        t->offset = offset;
        offset = align_up(offset + t->nbytes, w->alignment);
        emit_u64(w, strlen(t->name));
        emit(w, t->name, strlen(t->name));
        emit_u32(w, t->ndim);
        emit(w, t->ne, 8ull * t->ndim);
        emit_u32(w, t->type);
        emit_u64(w, t->offset);
    }
    pad_to_alignment(w);
    w->header_done = true;
    return w->failed ? -1 : 0;
}

/* The next nbytes of the current tensor: data, or (NULL) a hole the file
 * seeks past, which reads back as zeros and takes no disk. */
static int tensor_bytes(ds4_gguf_writer *w, const void *data, uint64_t nbytes) {
    if (!w || w->failed) return -1;
    if (!w->header_done && write_header(w) != 0) return -1;
    if (nbytes == 0) return 0;
    if (w->cur == w->n_tensors)
        return wfail(w, DS4_EINVAL, "%llu bytes of tensor data beyond the last tensor (all %llu are complete)",
                     (unsigned long long)nbytes, (unsigned long long)w->n_tensors);
    wtensor *t = &w->tensors[w->cur];
    if (nbytes > t->nbytes - w->cur_written)
        return wfail(w, DS4_EINVAL, "tensor '%s': %llu bytes of data given, its size is %llu", t->name,
                     (unsigned long long)(w->cur_written + nbytes), (unsigned long long)t->nbytes);
    if (data) {
        if (emit(w, data, nbytes) != 0) return -1;
    } else {
        if (flush_buf(w) != 0) return -1;
        if (nbytes > (uint64_t)INT64_MAX || lseek(w->fd, (off_t)nbytes, SEEK_CUR) < 0)
            return wfail(w, DS4_EIO, "seek past %llu bytes of %s failed: %s", (unsigned long long)nbytes, w->tmp_path,
                         strerror(errno));
        w->file_pos += nbytes;
    }
    w->cur_written += nbytes;
    if (w->cur_written == t->nbytes) {
        w->cur++;
        w->cur_written = 0;
        return pad_to_alignment(w);
    }
    return 0;
}

int ds4_gguf_w_data(ds4_gguf_writer *w, const void *data, uint64_t nbytes) {
    if (w && !w->failed && !data && nbytes)
        return wfail(w, DS4_EINVAL, "NULL tensor data of %llu bytes", (unsigned long long)nbytes);
    return tensor_bytes(w, data, nbytes);
}

int ds4_gguf_w_hole(ds4_gguf_writer *w, uint64_t nbytes) { return tensor_bytes(w, NULL, nbytes); }

/* ------------------------------------------------------ open and close */

ds4_gguf_writer *ds4_gguf_writer_open(const char *path, uint32_t alignment, ds4_err *err) {
    if (!path || !*path) {
        ds4_err_set(err, DS4_EINVAL, "GGUF writer: empty output path");
        return NULL;
    }
    if (alignment & (alignment - 1)) {
        ds4_err_set(err, DS4_EINVAL, "%s: alignment %u is not a power of two", path, alignment);
        return NULL;
    }
    ds4_gguf_writer *w = calloc(1, sizeof(*w));
    if (!w) {
        ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    w->fd = -1;
    w->alignment = alignment ? alignment : DS4_GGUF_DEFAULT_ALIGNMENT;
    w->alignment_given = alignment != 0;
    w->path = strdup(path);
    w->tmp_path = malloc(strlen(path) + 64);
    w->buf = malloc(WRITE_BUF_BYTES);
    if (!w->path || !w->tmp_path || !w->buf || ds4_name_index_init(&w->keys, 0, err) != 0 ||
        ds4_name_index_init(&w->names, 0, err) != 0) {
        ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", path);
        ds4_gguf_writer_abort(w);
        return NULL;
    }
    /* A fresh name per attempt, so concurrent writers and leftovers of a
     * crashed run never collide; mode 0666 lets the umask apply. */
    static unsigned counter;
    for (int attempt = 0; attempt < 100 && w->fd < 0; attempt++) {
        sprintf(w->tmp_path, "%s.tmp.%ld.%u", path, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
        w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (w->fd < 0 && errno != EEXIST) break;
    }
    if (w->fd < 0) {
        ds4_err_set(err, DS4_EIO, "%s: cannot create %s: %s", path, w->tmp_path, strerror(errno));
        free(w->tmp_path);
        w->tmp_path = NULL;
        ds4_gguf_writer_abort(w);
        return NULL;
    }
    return w;
}

static void free_writer(ds4_gguf_writer *w) {
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->key_names[i]);
    free(w->key_names);
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->tensors);
    ds4_name_index_free(&w->keys);
    ds4_name_index_free(&w->names);
    free(w->meta);
    free(w->buf);
    free(w->tmp_path);
    free(w->path);
    free(w);
}

void ds4_gguf_writer_abort(ds4_gguf_writer *w) {
    if (!w) return;
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp_path);
    }
    free_writer(w);
}

/* Make the rename durable too: fsync the directory holding the file. */
static int sync_parent_dir(ds4_gguf_writer *w) {
    char *copy = strdup(w->path);
    if (!copy) return wfail(w, DS4_ENOMEM, "out of memory");
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (dfd < 0) return wfail(w, DS4_EIO, "cannot open the parent directory to sync it: %s", strerror(errno));
    int rc = fsync(dfd) == 0 || errno == EINVAL ? 0 : -1;
    int e = errno;
    close(dfd);
    if (rc != 0) return wfail(w, DS4_EIO, "fsync of the parent directory failed: %s", strerror(e));
    return 0;
}

static int finish(ds4_gguf_writer *w, bool header_only) {
    if (w->failed) return -1;
    if (header_only && w->header_done) return wfail(w, DS4_EINVAL, "a header-only file got tensor data");
    if (!w->header_done && write_header(w) != 0) return -1;
    if (!header_only && w->cur < w->n_tensors) {
        const wtensor *t = &w->tensors[w->cur];
        return wfail(w, DS4_EINVAL, "tensor '%s' got %llu of its %llu bytes (%llu of %llu tensors complete)", t->name,
                     (unsigned long long)w->cur_written, (unsigned long long)t->nbytes, (unsigned long long)w->cur,
                     (unsigned long long)w->n_tensors);
    }
    if (flush_buf(w) != 0) return -1;
    /* A file that ends in a hole (ds4_gguf_w_hole) gets its length here. */
    if (!header_only && ftruncate(w->fd, (off_t)w->file_pos) != 0)
        return wfail(w, DS4_EIO, "setting the length of %s failed: %s", w->tmp_path, strerror(errno));
    if (fsync(w->fd) != 0) return wfail(w, DS4_EIO, "fsync of %s failed: %s", w->tmp_path, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        unlink(w->tmp_path);
        return wfail(w, DS4_EIO, "close of %s failed: %s", w->tmp_path, strerror(errno));
    }
    if (rename(w->tmp_path, w->path) != 0) {
        int e = errno;
        unlink(w->tmp_path);
        return wfail(w, DS4_EIO, "cannot rename %s into place: %s", w->tmp_path, strerror(e));
    }
    return sync_parent_dir(w);
}

static int close_writer(ds4_gguf_writer *w, bool header_only, ds4_err *err) {
    if (!w) return ds4_err_set(err, DS4_EINVAL, "GGUF writer: close of a writer that failed to open");
    if (finish(w, header_only) != 0) {
        if (err) *err = w->err;
        ds4_gguf_writer_abort(w);
        return -1;
    }
    free_writer(w);
    return 0;
}

int ds4_gguf_writer_close(ds4_gguf_writer *w, ds4_err *err) { return close_writer(w, false, err); }

int ds4_gguf_writer_close_header(ds4_gguf_writer *w, ds4_err *err) { return close_writer(w, true, err); }
