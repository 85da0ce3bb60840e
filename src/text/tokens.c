/*
 * tokens.c - growable token-id array with sticky allocation failure.
 */
#include "text/tokens.h"

#include <stdlib.h>
#include <string.h>

bool ds4_tokens_reserve(ds4_tokens *t, size_t more) {
    if (t->failed) return false;
    if (more <= t->cap - t->n) return true;
    if (more > (SIZE_MAX / sizeof(int32_t)) / 2 - t->n) {
        t->failed = true;
        return false;
    }
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->n + more) cap *= 2;
    int32_t *p = realloc(t->ids, cap * sizeof(int32_t));
    if (!p) {
        t->failed = true;
        return false;
    }
    t->ids = p;
    t->cap = cap;
    return true;
}

void ds4_tokens_push(ds4_tokens *t, int32_t id) {
    if (t->n == t->cap && !ds4_tokens_reserve(t, 1)) return;
    if (t->failed) return;
    t->ids[t->n++] = id;
}

void ds4_tokens_append(ds4_tokens *t, const int32_t *ids, size_t n) {
    if (!ds4_tokens_reserve(t, n)) return;
    if (n) memcpy(t->ids + t->n, ids, n * sizeof(int32_t));
    t->n += n;
}

void ds4_tokens_free(ds4_tokens *t) {
    free(t->ids);
    t->ids = NULL;
    t->n = t->cap = 0;
    t->failed = false;
}
