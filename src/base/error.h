/*
 * error.h - errors as values.
 *
 * Every fallible function in ds4 takes a `ds4_err *` as its last argument.
 * On failure it fills the message (what went wrong and where: a file name,
 * a byte offset, a tensor or key name) and returns -1 or NULL.  Callers that
 * add context prepend it with ds4_err_prefix(), so a message read by a user
 * goes from the outermost operation to the innermost cause:
 *
 *     loading ds4flash.gguf: tensor blk.3.attn_kv.weight: shape [4096, 500],
 *     expected [4096, 512]
 *
 * A NULL `ds4_err *` is allowed everywhere: the message is then discarded.
 */
#ifndef DS4_BASE_ERROR_H
#define DS4_BASE_ERROR_H

#include <stddef.h>

/* Broad classes, for callers (and tests) that need to branch on the kind of
 * failure.  The message always carries the detail. */
typedef enum ds4_errcode {
    DS4_OK = 0,
    DS4_EIO,          /* open/read/write/mmap failed (errno text in message) */
    DS4_EFORMAT,      /* malformed or truncated file or request */
    DS4_ERANGE,       /* size, count or offset overflows or is out of bounds */
    DS4_EUNSUPPORTED, /* well-formed but not something ds4 accepts */
    DS4_EINVAL,       /* bad argument or option value */
    DS4_ENOMEM,       /* allocation failed */
    DS4_ENOTFOUND,    /* missing key, tensor, file */
    DS4_EINTERRUPTED, /* cancelled by the user or a client disconnect */
    DS4_EBUSY,        /* held by another process (the instance lock) */
} ds4_errcode;

typedef struct ds4_err {
    ds4_errcode code;
    char msg[1024];
} ds4_err;

/* Set code and message; returns -1 so callers can `return ds4_err_set(...)`. */
int ds4_err_set(ds4_err *e, ds4_errcode code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prepend "context: " to the current message; returns -1. */
int ds4_err_prefix(ds4_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "path: what: " before the message, without saying the path twice when
 * the message already starts with "path: " (errors of a file's reader
 * name the file).  Returns -1. */
int ds4_err_prefix_path(ds4_err *e, const char *path, const char *what);

/* Reset to DS4_OK with an empty message. */
void ds4_err_clear(ds4_err *e);

/* Message of an error, "" for a NULL pointer. */
const char *ds4_err_msg(const ds4_err *e);

/* Name of an error code ("format", "io", ...). */
const char *ds4_errcode_name(ds4_errcode code);

/* The plural ending of messages that count: "%u token%s", n, ds4_plural(n)
 * says "1 token" and "2 tokens". */
static inline const char *ds4_plural(unsigned long long n) { return n == 1 ? "" : "s"; }

#endif
