/*
 * gguf.h - the GGUF v3 container: a validating reader over mmap and a
 * streaming writer (docs/MODEL.md 2.1).
 *
 * Reader.  ds4_gguf_open() maps the file read-only and parses the header,
 * the metadata and the tensor table up front, checking every length, count,
 * type and offset against the file size before anything is dereferenced.
 * After a successful open every pointer handed out (string bytes, array
 * elements, tensor data) lies inside the mapping, so callers never need to
 * bounds-check again.  Weights are used in place: nothing is copied.
 *
 * Writer.  Metadata and tensor infos are declared first; tensor bytes are
 * then streamed in declaration order (possibly in several pieces each), so
 * a 150 GB model can be written while holding one tensor or less in RAM.
 * The file is written under a temporary name and renamed on success, so a
 * crash never leaves a truncated file under the final name.
 */
#ifndef DS4_FORMAT_GGUF_H
#define DS4_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define DS4_GGUF_MAGIC             0x46554747u /* "GGUF" little-endian */
#define DS4_GGUF_VERSION           3u
#define DS4_GGUF_DEFAULT_ALIGNMENT 32u
#define DS4_GGUF_MAX_DIMS          8

/* Metadata value types (GGUF spec numbering). */
typedef enum ds4_gguf_vtype {
    DS4_GGUF_U8 = 0,
    DS4_GGUF_I8 = 1,
    DS4_GGUF_U16 = 2,
    DS4_GGUF_I16 = 3,
    DS4_GGUF_U32 = 4,
    DS4_GGUF_I32 = 5,
    DS4_GGUF_F32 = 6,
    DS4_GGUF_BOOL = 7,
    DS4_GGUF_STRING = 8,
    DS4_GGUF_ARRAY = 9,
    DS4_GGUF_U64 = 10,
    DS4_GGUF_I64 = 11,
    DS4_GGUF_F64 = 12,
    DS4_GGUF_VTYPE_COUNT
} ds4_gguf_vtype;

/* A length-delimited string inside the mapping (not NUL-terminated). */
typedef struct ds4_str {
    const char *ptr;
    uint64_t len;
} ds4_str;

/* An array value.  Fixed-size elements lie contiguously (little-endian, possibly
 * unaligned) at `data`; for string arrays `strs` holds one ds4_str per element
 * (built at open time).  Nested arrays are rejected by the reader. */
typedef struct ds4_gguf_array {
    ds4_gguf_vtype type;
    uint64_t count;
    const uint8_t *data; /* first element's bytes in the mapping */
    ds4_str *strs;       /* string arrays only, else NULL */
} ds4_gguf_array;

typedef struct ds4_gguf_value {
    ds4_gguf_vtype type;
    union {
        uint64_t u;       /* U8, U16, U32, U64 */
        int64_t i;        /* I8, I16, I32, I64 */
        double f;         /* F32, F64 */
        bool b;           /* BOOL */
        ds4_str s;        /* STRING */
        ds4_gguf_array a; /* ARRAY */
    };
} ds4_gguf_value;

typedef struct ds4_gguf_kv {
    char *key; /* NUL-terminated copy */
    ds4_gguf_value value;
    uint64_t file_offset; /* where the entry starts, for messages */
    const uint8_t *raw;   /* the value as stored (after its type field), in the
                            * mapping; lets copies keep exact bits (e.g. NaN
                            * payloads that a float -> double -> float trip
                            * would change).  NULL in hand-made entries. */
} ds4_gguf_kv;

typedef struct ds4_gguf_tensor {
    char *name; /* NUL-terminated copy */
    uint32_t ndim;
    uint64_t ne[DS4_GGUF_MAX_DIMS]; /* ne[0] fastest; unused dims are 1 */
    uint32_t type;                  /* ggml type id, see format/quants.h */
    uint64_t offset;                /* relative to the data section */
    uint64_t nbytes;                /* from the type's block geometry */
    uint64_t nelements;
    const void *data;     /* inside the mapping */
    uint64_t file_offset; /* where the tensor info starts, for messages */
} ds4_gguf_tensor;

typedef struct ds4_gguf {
    char *path;          /* for messages ("<memory>" for buffers) */
    const uint8_t *base; /* mapping or caller buffer */
    uint64_t size;
    int owns_map;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* absolute offset of the data section */
    uint64_t n_kv;
    ds4_gguf_kv *kv;
    uint64_t n_tensors;
    ds4_gguf_tensor *tensors;
    void *index;      /* private: name -> tensor/kv hash tables */
    bool header_only; /* opened by ds4_gguf_open_header: tensors have no data */
} ds4_gguf;

/* Open and validate a file.  NULL on failure with a message naming the
 * problem and the file offset where it was found. */
ds4_gguf *ds4_gguf_open(const char *path, ds4_err *err);

/* The metadata and tensor table alone, tensor data not looked for (every
 * tensor's data NULL): a header-only file (ds4_gguf_writer_close_header),
 * or any file read for its shapes.  Offsets must still be aligned and
 * disjoint. */
ds4_gguf *ds4_gguf_open_header(const char *path, ds4_err *err);

/* Same over a caller-owned buffer that must outlive the result (fuzzing,
 * tests).  `name` is used in messages. */
ds4_gguf *ds4_gguf_open_buffer(const void *buf, size_t size, const char *name, ds4_err *err);

void ds4_gguf_close(ds4_gguf *g);

/* Lookups: NULL when absent.  O(1) average. */
const ds4_gguf_kv *ds4_gguf_find_kv(const ds4_gguf *g, const char *key);
const ds4_gguf_tensor *ds4_gguf_find_tensor(const ds4_gguf *g, const char *name);

/* Typed metadata getters.  Each returns 0 on success; -1 with a message
 * naming the key when it is missing (DS4_ENOTFOUND) or has a type that cannot
 * represent the request exactly (DS4_EFORMAT).  Integer getters accept any
 * integer type whose value fits; ds4_gguf_get_f64 accepts F32, F64 and
 * integer types. */
int ds4_gguf_get_u32(const ds4_gguf *g, const char *key, uint32_t *out, ds4_err *err);
int ds4_gguf_get_u64(const ds4_gguf *g, const char *key, uint64_t *out, ds4_err *err);
int ds4_gguf_get_i64(const ds4_gguf *g, const char *key, int64_t *out, ds4_err *err);
int ds4_gguf_get_f64(const ds4_gguf *g, const char *key, double *out, ds4_err *err);
int ds4_gguf_get_bool(const ds4_gguf *g, const char *key, bool *out, ds4_err *err);
int ds4_gguf_get_str(const ds4_gguf *g, const char *key, ds4_str *out, ds4_err *err);
/* Array of the given element type (any type if `elem` is DS4_GGUF_VTYPE_COUNT). */
int ds4_gguf_get_arr(const ds4_gguf *g, const char *key, ds4_gguf_vtype elem, const ds4_gguf_array **out, ds4_err *err);

/* Element i of an integer or float array as int64/double (no bounds check
 * beyond an assert: callers loop to a->count). */
int64_t ds4_gguf_arr_i64(const ds4_gguf_array *a, uint64_t i);
double ds4_gguf_arr_f64(const ds4_gguf_array *a, uint64_t i);

/* Size in bytes of one element of a fixed-size value type (0 for STRING/ARRAY). */
size_t ds4_gguf_vtype_size(ds4_gguf_vtype t);
const char *ds4_gguf_vtype_name(ds4_gguf_vtype t);

/* Compare a ds4_str with a C string. */
bool ds4_str_eq(ds4_str s, const char *cstr);

/* ---------------------------------------------------------------- writer */

typedef struct ds4_gguf_writer ds4_gguf_writer;

/* Start a file.  Metadata and tensor declarations are buffered until the
 * first tensor data is written.  `alignment` 0 means the default (32); any
 * other value is also stored as general.alignment (after the caller's
 * keys).  A general.alignment written by the caller (e.g. copied with
 * ds4_gguf_w_copy_kv) must be a u32 power of two equal to a nonzero
 * `alignment`; with `alignment` 0 its value is used. */
ds4_gguf_writer *ds4_gguf_writer_open(const char *path, uint32_t alignment, ds4_err *err);

/* Metadata.  Keys must be unique (a duplicate is an error at close). */
int ds4_gguf_w_u8(ds4_gguf_writer *w, const char *key, uint8_t v);
int ds4_gguf_w_i8(ds4_gguf_writer *w, const char *key, int8_t v);
int ds4_gguf_w_u16(ds4_gguf_writer *w, const char *key, uint16_t v);
int ds4_gguf_w_i16(ds4_gguf_writer *w, const char *key, int16_t v);
int ds4_gguf_w_u32(ds4_gguf_writer *w, const char *key, uint32_t v);
int ds4_gguf_w_i32(ds4_gguf_writer *w, const char *key, int32_t v);
int ds4_gguf_w_u64(ds4_gguf_writer *w, const char *key, uint64_t v);
int ds4_gguf_w_i64(ds4_gguf_writer *w, const char *key, int64_t v);
int ds4_gguf_w_f32(ds4_gguf_writer *w, const char *key, float v);
int ds4_gguf_w_f64(ds4_gguf_writer *w, const char *key, double v);
int ds4_gguf_w_bool(ds4_gguf_writer *w, const char *key, bool v);
int ds4_gguf_w_str(ds4_gguf_writer *w, const char *key, const char *s);
int ds4_gguf_w_strn(ds4_gguf_writer *w, const char *key, const char *s, uint64_t len);
/* Array of fixed-size elements, `data` holds count little-endian elements. */
int ds4_gguf_w_arr(ds4_gguf_writer *w, const char *key, ds4_gguf_vtype elem, const void *data, uint64_t count);
/* Array of strings; `lens` may be NULL for NUL-terminated strings. */
int ds4_gguf_w_arr_str(ds4_gguf_writer *w, const char *key, const char *const *strs, const uint64_t *lens,
                       uint64_t count);
/* Copy a metadata entry from a reader (used by the quantizer and splicer). */
int ds4_gguf_w_copy_kv(ds4_gguf_writer *w, const ds4_gguf_kv *kv);

/* Declare a tensor; data must later be written in declaration order. */
int ds4_gguf_w_tensor(ds4_gguf_writer *w, const char *name, uint32_t ndim, const uint64_t *ne, uint32_t type);

/* Append bytes of the current tensor (the first not yet complete).  May be
 * called several times per tensor; the total must equal its size.  The
 * first call writes the header, metadata and tensor table. */
int ds4_gguf_w_data(ds4_gguf_writer *w, const void *data, uint64_t nbytes);

/* Append nbytes zero bytes of the current tensor as a hole: the writer
 * seeks past them instead of writing, so on filesystems with sparse files
 * they take no disk space (they read back as zeros everywhere).  Mixes
 * freely with ds4_gguf_w_data; the file is byte for byte the one that
 * writing the zeros gives. */
int ds4_gguf_w_hole(ds4_gguf_writer *w, uint64_t nbytes);

/* Finish: checks every tensor got exactly its bytes, flushes, fsyncs and
 * renames the temporary file into place.  Frees the writer in all cases.
 * Errors from earlier calls are reported here too. */
int ds4_gguf_writer_close(ds4_gguf_writer *w, ds4_err *err);

/* Finish a header-only file: the metadata and the tensor table (with the
 * offsets the data would have), no tensor data; no data may have been
 * written.  For shape and memory checks of models too large to write
 * (ds4-mkmodel --header-only; read with ds4_gguf_open_header). */
int ds4_gguf_writer_close_header(ds4_gguf_writer *w, ds4_err *err);

/* Abandon a file: removes the temporary file and frees the writer. */
void ds4_gguf_writer_abort(ds4_gguf_writer *w);

#endif
