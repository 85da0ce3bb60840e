/*
 * gguf_src.h - a ds4 GGUF as a source of weights for the quantizer
 * (tools/ds4-quantize --gguf): the tensors of a file the engine runs,
 * found by their layout names, checked against the layout's shapes and
 * decoded to f32 by the format's own dequantizers (format/quants.h), so
 * that a file can be requantized to another recipe.
 *
 * What goes in is what comes out of the decoders: a Q8_0 file gives the
 * Q8_0 values, not the weights it was made from, so a file requantized
 * from it carries both roundings.  F32, F16, BF16 and Q8_0 inputs written
 * back in their own type come out with the same bytes (docs/QUANTS.md).
 */
#ifndef DS4_CONVERT_GGUF_SRC_H
#define DS4_CONVERT_GGUF_SRC_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "format/gguf.h"
#include "model/layout.h"

/* One matrix (or vector) of a GGUF: a whole tensor, or one expert of a
 * routed tensor (the experts are its outermost dimension). */
typedef struct ds4_gguf_source {
    const ds4_gguf *g;
    const ds4_gguf_tensor *t;
    const uint8_t *data; /* the matrix's first row */
    size_t row_bytes;
    int64_t rows, cols; /* logical [rows, cols] */
} ds4_gguf_source;

/* Find layout tensor `t` in g (expert `expert` of a routed tensor) and
 * check it: present, the layout's shape, a type the decoders read (I32
 * for the hash tables, a float or block type for everything else).
 * Errors name the file and the tensor. */
int ds4_gguf_src_resolve(const ds4_gguf *g, const ds4_tensor_spec *t, int expert, ds4_gguf_source *src, ds4_err *err);

/* Decode rows [row0, row0 + nrows) to f32 (cols values per row).  Values
 * that decode to inf or NaN are an error naming the tensor and position. */
int ds4_gguf_src_decode_rows(const ds4_gguf_source *src, int64_t row0, int64_t nrows, float *out, ds4_err *err);

/* Copy an I32 tensor; values outside [0, limit) (limit > 0) are errors. */
int ds4_gguf_src_decode_i32(const ds4_gguf_source *src, int64_t limit, int32_t *out, ds4_err *err);

#endif
