/*
 * strindex.c - open-addressing string hash index (see strindex.h).
 */
#include "base/strindex.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static int alloc_slots(ds4_strindex *ix, size_t cap) {
    ix->keys = calloc(cap, sizeof(*ix->keys));
    ix->values = calloc(cap, sizeof(*ix->values));
    if (!ix->keys || !ix->values) {
        free(ix->keys);
        free(ix->values);
        ix->keys = NULL;
        ix->values = NULL;
        return -1;
    }
    ix->cap = cap;
    return 0;
}

int ds4_strindex_init(ds4_strindex *ix, size_t expected) {
    memset(ix, 0, sizeof(*ix));
    size_t cap = 16;
    while (cap < expected * 2 && cap < ((size_t)1 << 40)) cap <<= 1;
    return alloc_slots(ix, cap);
}

void ds4_strindex_free(ds4_strindex *ix) {
    free(ix->keys);
    free(ix->values);
    memset(ix, 0, sizeof(*ix));
}

static size_t find_slot(const ds4_strindex *ix, const char *key) {
    size_t mask = ix->cap - 1;
    size_t i = (size_t)hash_str(key) & mask;
    while (ix->keys[i] && strcmp(ix->keys[i], key) != 0) i = (i + 1) & mask;
    return i;
}

/* Keep the load factor at or below one half so probes stay short. */
static int grow(ds4_strindex *ix) {
    ds4_strindex bigger;
    if (alloc_slots(&bigger, ix->cap * 2) != 0) return -1;
    bigger.count = ix->count;
    for (size_t i = 0; i < ix->cap; i++) {
        if (!ix->keys[i]) continue;
        size_t j = find_slot(&bigger, ix->keys[i]);
        bigger.keys[j] = ix->keys[i];
        bigger.values[j] = ix->values[i];
    }
    ds4_strindex_free(ix);
    *ix = bigger;
    return 0;
}

int ds4_strindex_put(ds4_strindex *ix, const char *key, size_t value) {
    if (!ix->keys && ds4_strindex_init(ix, 8) != 0) return -1;
    if ((ix->count + 1) * 2 > ix->cap && grow(ix) != 0) return -1;
    size_t i = find_slot(ix, key);
    if (ix->keys[i]) return 1;
    ix->keys[i] = key;
    ix->values[i] = value;
    ix->count++;
    return 0;
}

size_t ds4_strindex_get(const ds4_strindex *ix, const char *key) {
    if (!ix->keys) return SIZE_MAX;
    size_t i = find_slot(ix, key);
    return ix->keys[i] ? ix->values[i] : SIZE_MAX;
}
