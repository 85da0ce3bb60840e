/*
 * strbuf.h - a growable byte string for the text layer.
 *
 * Renderers and decoders append many small pieces; checking every append
 * for allocation failure would bury the logic, so a failed allocation is
 * sticky: later appends do nothing and the owner checks `failed` once
 * (ds4_strbuf_check) before handing the result out.  The bytes are always
 * NUL-terminated (not counted in len), so they can be printed directly, but
 * they may contain NULs of their own.
 */
#ifndef DS4_TEXT_STRBUF_H
#define DS4_TEXT_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "base/error.h"

typedef struct ds4_strbuf {
    char *p; /* NULL until the first append */
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed; contents are incomplete */
} ds4_strbuf;

void ds4_strbuf_append(ds4_strbuf *b, const void *s, size_t n);
void ds4_strbuf_puts(ds4_strbuf *b, const char *s);
void ds4_strbuf_putc(ds4_strbuf *b, char c);
void ds4_strbuf_printf(ds4_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Make room for n more bytes; false (and failed set) when out of memory. */
bool ds4_strbuf_reserve(ds4_strbuf *b, size_t n);
void ds4_strbuf_truncate(ds4_strbuf *b, size_t len);
/* Detach the bytes (caller frees); the buffer is left empty. */
char *ds4_strbuf_take(ds4_strbuf *b, size_t *len);
void ds4_strbuf_free(ds4_strbuf *b);
/* 0, or -1 with DS4_ENOMEM naming `what` when an append failed. */
int ds4_strbuf_check(const ds4_strbuf *b, const char *what, ds4_err *err);

#endif
