/*
 * strbuf.c - growable byte string with sticky allocation failure (strbuf.h).
 */
#include "text/strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool ds4_strbuf_reserve(ds4_strbuf *b, size_t n) {
    if (b->failed) return false;
    if (n > SIZE_MAX - b->len - 1) {
        b->failed = true;
        return false;
    }
    size_t need = b->len + n + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

void ds4_strbuf_append(ds4_strbuf *b, const void *s, size_t n) {
    if (!ds4_strbuf_reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void ds4_strbuf_puts(ds4_strbuf *b, const char *s) { ds4_strbuf_append(b, s, strlen(s)); }

void ds4_strbuf_putc(ds4_strbuf *b, char c) { ds4_strbuf_append(b, &c, 1); }

void ds4_strbuf_printf(ds4_strbuf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof(small), fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof(small)) {
        ds4_strbuf_append(b, small, (size_t)n);
        return;
    }
    if (!ds4_strbuf_reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ds4_strbuf_truncate(ds4_strbuf *b, size_t len) {
    if (len >= b->len) return;
    b->len = len;
    b->p[len] = '\0';
}

char *ds4_strbuf_take(ds4_strbuf *b, size_t *len) {
    if (!b->p) ds4_strbuf_reserve(b, 0);
    if (b->p && b->len == 0) b->p[0] = '\0';
    char *p = b->p;
    if (len) *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void ds4_strbuf_free(ds4_strbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}

int ds4_strbuf_check(const ds4_strbuf *b, const char *what, ds4_err *err) {
    if (!b->failed) return 0;
    return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", what);
}
