/*
 * gguf_index.h - a name -> index hash table (open addressing, linear
 * probing) used by the format readers (GGUF reader and writer, safetensors,
 * imatrix) for O(1) key and tensor lookups and for duplicate detection.
 *
 * The table does not own the names it points to; they must outlive it.
 */
#ifndef DS4_FORMAT_GGUF_INDEX_H
#define DS4_FORMAT_GGUF_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

typedef struct ds4_name_slot {
    uint64_t hash;
    const char *name; /* NULL: empty slot */
    uint64_t value;
} ds4_name_slot;

typedef struct ds4_name_index {
    ds4_name_slot *slots;
    uint64_t cap; /* power of two, or 0 before the first insert */
    uint64_t count;
} ds4_name_index;

/* Size the table for `expected` names up front (0 is fine: it grows). */
int ds4_name_index_init(ds4_name_index *ix, uint64_t expected, ds4_err *err);

/* Insert name -> value.  Returns 1 when inserted, 0 when the name is
 * already present (its value is stored in *existing and nothing changes),
 * -1 when growing the table fails. */
int ds4_name_index_put(ds4_name_index *ix, const char *name, uint64_t value, uint64_t *existing, ds4_err *err);

bool ds4_name_index_get(const ds4_name_index *ix, const char *name, uint64_t *value);

void ds4_name_index_free(ds4_name_index *ix);

#endif
