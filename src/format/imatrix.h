/*
 * imatrix.h - importance matrices in llama.cpp's legacy binary `.dat`
 * format, as written by ds4's collector and read by its quantizer.
 *
 * Layout (little-endian):
 *
 *   i32 n_entries
 *   n_entries x { i32 name_len; name bytes (no NUL); i32 ncall; i32 nval;
 *                 f32 values[nval] }
 *   optional trailer: i32 chunks; i32 dataset_len; dataset bytes
 *
 * `values` are sums over `ncall` calls of x^2 per input column; importance
 * is values / ncall (ncall 0 means the values are used as they are).  ds4
 * stores one entry per routed-expert tensor, named after the GGUF tensor
 * (`blk.N.ffn_gate_exps.weight`), holding n_expert consecutive per-expert
 * vectors of the tensor's row length.  Per-expert entries named
 * `NAME.expert.E` or `NAME.expert_E` and plain per-matrix entries are found
 * too (ds4_imatrix_lookup).
 *
 * Shared by the quantizer (reading) and the collector (accumulating and
 * writing).
 */
#ifndef DS4_FORMAT_IMATRIX_H
#define DS4_FORMAT_IMATRIX_H

#include <stdint.h>

#include "base/error.h"

#define DS4_IMATRIX_MAX_NAME 4096

typedef struct ds4_imatrix_entry {
    char *name;
    int32_t ncall;
    uint32_t nval;
    float *values; /* sums of squares (not yet divided by ncall) */
} ds4_imatrix_entry;

typedef struct ds4_imatrix {
    char *path; /* file it was read from, NULL for a new one */
    uint32_t n_entries;
    ds4_imatrix_entry *entries;
    int32_t chunks; /* trailer; -1 when absent */
    char *dataset;  /* trailer; NULL when absent */
    void *index;    /* private: name -> entry */
} ds4_imatrix;

/* Read and validate a file: counts, lengths, duplicate names, finite
 * non-negative values, a well-formed trailer.  Errors name the file, the
 * entry and the byte offset. */
ds4_imatrix *ds4_imatrix_load(const char *path, ds4_err *err);
void ds4_imatrix_free(ds4_imatrix *im);

/* An empty matrix for a collector. */
ds4_imatrix *ds4_imatrix_new(ds4_err *err);

/* The entry `name`, created with `nval` zero values when absent.  An entry
 * of another length is an error. */
ds4_imatrix_entry *ds4_imatrix_entry_get(ds4_imatrix *im, const char *name, uint32_t nval, ds4_err *err);

const ds4_imatrix_entry *ds4_imatrix_find(const ds4_imatrix *im, const char *name);

/* Set the trailer (dataset may be NULL). */
int ds4_imatrix_set_trailer(ds4_imatrix *im, int32_t chunks, const char *dataset, ds4_err *err);

/* Write to `path` through a temporary file renamed into place. */
int ds4_imatrix_save(const ds4_imatrix *im, const char *path, ds4_err *err);

/* Importance of the `ncols` input columns of one matrix: tensor `name`, or
 * expert `expert` of `n_expert` when expert >= 0.  Fills out[0..ncols) with
 * values / ncall.  Returns 1 when found, 0 when no entry matches, -1 when
 * an entry matches the name but has a length that fits neither ncols nor
 * n_expert x ncols. */
int ds4_imatrix_lookup(const ds4_imatrix *im, const char *name, int64_t ncols, int expert, int n_expert, float *out,
                       ds4_err *err);

/* ------------------------------------------------------------ datasets */

/* Collection datasets are rendered prompts, each introduced by a line that
 * starts with this marker (ds4's builder writes
 * "\n\n===== DS4_IMATRIX_PROMPT <id> <category> <mode> <source> =====\n"). */
#define DS4_IMATRIX_MARKER "===== DS4_IMATRIX_PROMPT"

/* Next prompt of a dataset text[0..n): *pos starts at 0.  Returns 1 with
 * the prompt in text[*start, *start + *len), 0 when there are no more.
 * Markers count only at the start of a line; trailing newlines before the
 * next marker are dropped, empty prompts skipped.  A text without any
 * marker is one prompt; text before the first marker is ignored. */
int ds4_imatrix_dataset_next(const char *text, size_t n, size_t *pos, size_t *start, size_t *len);

#endif
