/*
 * gguf_index.c - name -> index hash table for the GGUF reader and writer
 * (see gguf_index.h).  FNV-1a hashing, linear probing, load factor <= 1/2.
 */
#include "format/gguf_index.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* Smallest power of two >= 2 * n (at least 16), or 0 on overflow. */
static uint64_t capacity_for(uint64_t n) {
    uint64_t cap = 16;
    while (cap / 2 < n) {
        if (cap > UINT64_MAX / 2) return 0;
        cap *= 2;
    }
    return cap;
}

static ds4_name_slot *find_slot(ds4_name_slot *slots, uint64_t cap, uint64_t h, const char *name) {
    uint64_t mask = cap - 1;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        ds4_name_slot *s = &slots[i];
        if (!s->name || (s->hash == h && strcmp(s->name, name) == 0)) return s;
    }
}

static int resize(ds4_name_index *ix, uint64_t cap, ds4_err *err) {
    if (cap == 0 || cap > SIZE_MAX / sizeof(ds4_name_slot))
        return ds4_err_set(err, DS4_ENOMEM, "name index: %llu entries is too many", (unsigned long long)ix->count);
    ds4_name_slot *slots = calloc((size_t)cap, sizeof(*slots));
    if (!slots)
        return ds4_err_set(err, DS4_ENOMEM, "name index: out of memory for %llu slots", (unsigned long long)cap);
    for (uint64_t i = 0; i < ix->cap; i++) {
        const ds4_name_slot *old = &ix->slots[i];
        if (old->name) *find_slot(slots, cap, old->hash, old->name) = *old;
    }
    free(ix->slots);
    ix->slots = slots;
    ix->cap = cap;
    return 0;
}

int ds4_name_index_init(ds4_name_index *ix, uint64_t expected, ds4_err *err) {
    memset(ix, 0, sizeof(*ix));
    return resize(ix, capacity_for(expected), err);
}

int ds4_name_index_put(ds4_name_index *ix, const char *name, uint64_t value, uint64_t *existing, ds4_err *err) {
    if (ix->cap == 0 || ix->count + 1 > ix->cap / 2) {
        if (resize(ix, capacity_for(ix->count + 1), err) != 0) return -1;
    }
    uint64_t h = hash_name(name);
    ds4_name_slot *s = find_slot(ix->slots, ix->cap, h, name);
    if (s->name) {
        if (existing) *existing = s->value;
        return 0;
    }
    s->hash = h;
    s->name = name;
    s->value = value;
    ix->count++;
    return 1;
}

bool ds4_name_index_get(const ds4_name_index *ix, const char *name, uint64_t *value) {
    if (ix->cap == 0) return false;
    const ds4_name_slot *s = find_slot(ix->slots, ix->cap, hash_name(name), name);
    if (!s->name) return false;
    *value = s->value;
    return true;
}

void ds4_name_index_free(ds4_name_index *ix) {
    free(ix->slots);
    memset(ix, 0, sizeof(*ix));
}
