/*
 * tokens.h - a growable array of token ids.
 *
 * Like ds4_strbuf, a failed allocation is sticky (`failed`), so the
 * tokenizer's inner loops push without checking and the public entry points
 * report DS4_ENOMEM once at the end.
 */
#ifndef DS4_TEXT_TOKENS_H
#define DS4_TEXT_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ds4_tokens {
    int32_t *ids;
    size_t n;
    size_t cap;
    bool failed;
} ds4_tokens;

bool ds4_tokens_reserve(ds4_tokens *t, size_t more);
void ds4_tokens_push(ds4_tokens *t, int32_t id);
void ds4_tokens_append(ds4_tokens *t, const int32_t *ids, size_t n);
void ds4_tokens_free(ds4_tokens *t);

#endif
