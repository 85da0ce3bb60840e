/*
 * strindex.h - a small hash index from NUL-terminated strings to array
 * positions, for the name lookups of file readers (safetensors tensors,
 * checkpoint weight maps, imatrix entries).
 *
 * The index does not own the keys: they must outlive it (they normally live
 * in the array being indexed).  Insertion reports duplicates so readers can
 * reject files that name the same thing twice.
 */
#ifndef DS4_BASE_STRINDEX_H
#define DS4_BASE_STRINDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct ds4_strindex {
    const char **keys;  /* slot -> key, NULL when empty */
    size_t *values;     /* slot -> position */
    size_t cap;         /* power of two */
    size_t count;
} ds4_strindex;

/* Prepare for about `expected` keys.  Returns -1 when out of memory. */
int ds4_strindex_init(ds4_strindex *ix, size_t expected);
void ds4_strindex_free(ds4_strindex *ix);

/* Insert key -> value.  Returns 0, 1 when the key is already present (the
 * old value is kept), -1 when out of memory. */
int ds4_strindex_put(ds4_strindex *ix, const char *key, size_t value);

/* Position stored for key, or SIZE_MAX when absent. */
size_t ds4_strindex_get(const ds4_strindex *ix, const char *key);

#endif
