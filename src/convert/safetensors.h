/*
 * safetensors.h - a validating reader for Hugging Face safetensors files and
 * sharded checkpoint directories (the official DeepSeek V4 Flash release is
 * 46 shards plus `model.safetensors.index.json`).
 *
 * File layout: an 8-byte little-endian header length N, N bytes of UTF-8
 * JSON (possibly padded with spaces), then the data section.  The JSON maps
 * each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with
 * offsets relative to the data section; the optional "__metadata__" entry is
 * ignored.
 *
 * ds4_st_open() maps the file read-only and checks every entry before any
 * pointer is handed out: known dtype, shape products and byte sizes without
 * overflow, offsets inside the file, byte size equal to shape x dtype size,
 * no two tensors overlapping.  After a successful open, `data` of every
 * tensor lies inside the mapping.
 *
 * A checkpoint (ds4_st_ckpt) reads the index's weight_map (or a single
 * `model.safetensors` when there is no index), checks that every shard it
 * names exists, and maps shards on first use.  Lookups are thread-safe, and
 * tensors stay valid until the checkpoint is closed.  Errors name the file,
 * the tensor and what was expected.
 *
 * Shapes are kept in safetensors (row-major, PyTorch) order: shape[0] is the
 * slowest axis.  GGUF dims are the reverse.
 */
#ifndef DS4_CONVERT_SAFETENSORS_H
#define DS4_CONVERT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define DS4_ST_MAX_DIMS   8
/* Headers above this are rejected (the safetensors library's own limit). */
#define DS4_ST_MAX_HEADER 100000000ull

typedef enum ds4_st_dtype {
    DS4_ST_BOOL,
    DS4_ST_U8,
    DS4_ST_I8,
    DS4_ST_F8_E4M3, /* "F8_E4M3": float8_e4m3fn */
    DS4_ST_F8_E5M2,
    DS4_ST_F8_E8M0, /* "F8_E8M0": power-of-two scale bytes */
    DS4_ST_U16,
    DS4_ST_I16,
    DS4_ST_F16,
    DS4_ST_BF16,
    DS4_ST_U32,
    DS4_ST_I32,
    DS4_ST_F32,
    DS4_ST_U64,
    DS4_ST_I64,
    DS4_ST_F64,
    DS4_ST_DTYPE_COUNT
} ds4_st_dtype;

/* Name as written in headers ("F8_E4M3", ...). */
const char *ds4_st_dtype_name(ds4_st_dtype t);
/* Bytes per element. */
size_t ds4_st_dtype_size(ds4_st_dtype t);
/* Parse a header dtype string; -1 when unknown. */
int ds4_st_dtype_parse(const char *s, ds4_st_dtype *out);

typedef struct ds4_st_tensor {
    char *name;
    ds4_st_dtype dtype;
    uint32_t ndim; /* 0 for a scalar */
    uint64_t shape[DS4_ST_MAX_DIMS];
    uint64_t nelements;
    uint64_t nbytes;
    uint64_t offset;     /* absolute file offset of the first byte */
    const uint8_t *data; /* inside the mapping */
    const char *file;    /* the owning file's path, for messages */
} ds4_st_tensor;

typedef struct ds4_st_file {
    char *path; /* for messages ("<memory>" name for buffers) */
    const uint8_t *base;
    uint64_t size;
    int owns_map;
    uint64_t data_offset; /* 8 + header length */
    size_t n_tensors;
    ds4_st_tensor *tensors; /* in header order */
    void *index;            /* private: name -> tensor */
} ds4_st_file;

ds4_st_file *ds4_st_open(const char *path, ds4_err *err);
/* Same over a caller-owned buffer that must outlive the result. */
ds4_st_file *ds4_st_open_buffer(const void *buf, size_t size, const char *name, ds4_err *err);
void ds4_st_close(ds4_st_file *f);

/* NULL when absent. */
const ds4_st_tensor *ds4_st_find(const ds4_st_file *f, const char *name);

/* Check a tensor against what the caller needs: its dtype must be one of the
 * `ndtypes` given, and (when `shape` is not NULL) it must have `ndim` dims
 * equal to `shape`.  The message names the file, the tensor, what it is and
 * what was expected. */
int ds4_st_expect(const ds4_st_tensor *t, const ds4_st_dtype *dtypes, size_t ndtypes, uint32_t ndim,
                  const uint64_t *shape, ds4_err *err);

/* "[a, b, c]" into buf (always NUL-terminated); returns buf. */
const char *ds4_st_shape_str(const ds4_st_tensor *t, char *buf, size_t len);

/* ------------------------------------------------------- checkpoints */

typedef struct ds4_st_ckpt ds4_st_ckpt;

/* Open a checkpoint directory: `model.safetensors.index.json` when present,
 * else the single file `model.safetensors`.  Every shard named by the index
 * must exist (its size is checked when it is mapped). */
ds4_st_ckpt *ds4_st_ckpt_open(const char *dir, ds4_err *err);
void ds4_st_ckpt_close(ds4_st_ckpt *c);

const char *ds4_st_ckpt_dir(const ds4_st_ckpt *c);
size_t ds4_st_ckpt_count(const ds4_st_ckpt *c);
/* Tensor names in index order. */
const char *ds4_st_ckpt_name(const ds4_st_ckpt *c, size_t i);
bool ds4_st_ckpt_has(const ds4_st_ckpt *c, const char *name);

/* The tensor, mapping its shard on first use.  NULL with a message when the
 * name is not in the checkpoint, the shard cannot be opened or is corrupt,
 * or the shard does not hold the tensor the index promised. */
const ds4_st_tensor *ds4_st_ckpt_get(ds4_st_ckpt *c, const char *name, ds4_err *err);

/* Number of shards mapped so far (for tests of the lazy opening). */
size_t ds4_st_ckpt_shards_open(const ds4_st_ckpt *c);

#endif
