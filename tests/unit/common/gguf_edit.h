/*
 * gguf_edit.h - test helper: write a copy of a GGUF with one deliberate
 * change (a dropped tensor, a wrong shape or type, wrong metadata, an extra
 * tensor) or with every F16 tensor widened to F32.  Used to produce the bad
 * models of the loader tests and the F32 variant of the golden models.
 */
#ifndef DS4_TEST_GGUF_EDIT_H
#define DS4_TEST_GGUF_EDIT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

typedef struct gguf_edit {
    bool all_f32;             /* store every F16 tensor as F32 */
    const char *drop_tensor;  /* leave this tensor out */
    const char *short_tensor; /* write this tensor with ne[0] one smaller */
    const char *f16_tensor;   /* store this F32 tensor as F16 */
    const char *bad_hash;     /* set the first entry of this I32 table to 1 << 20 */
    const char *extra_tensor; /* add an F32 [4] tensor of this name */
    const char *drop_key;     /* leave this metadata key out */
    const char *u32_key;      /* set this (u32) key to u32_value */
    uint32_t u32_value;
    const char *ratio_key;  /* set element 2 of this u32 array to 3 */
    const char *resize_key; /* write this u32 array with resize_count entries (zeros added) */
    uint32_t resize_count;
} gguf_edit;

/* Copy src to dst applying `e`.  0 or -1 with a message. */
int gguf_copy_edited(const char *src, const char *dst, const gguf_edit *e, ds4_err *err);

/* Copy the first `keep` bytes of src to dst (a truncated file). */
int file_truncated_copy(const char *src, const char *dst, long drop_bytes, ds4_err *err);

#endif
