/*
 * error.c - errors as values (see error.h).
 */
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ds4_err_set(ds4_err *e, ds4_errcode code, const char *fmt, ...) {
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    e->code = code;
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -1;
}

int ds4_err_prefix(ds4_err *e, const char *fmt, ...) {
    if (!e) return -1;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);

    /* Truncation is fine: the innermost detail is the least important
     * only when the message is already over a kilobyte. */
    char joined[sizeof(e->msg)];
    size_t plen = strnlen(prefix, sizeof(prefix));
    size_t room = sizeof(joined) - 1;
    size_t n = plen < room ? plen : room;
    memcpy(joined, prefix, n);
    if (n + 2 <= room) {
        joined[n++] = ':';
        joined[n++] = ' ';
    }
    size_t mlen = strnlen(e->msg, sizeof(e->msg));
    size_t m = mlen < room - n ? mlen : room - n;
    memcpy(joined + n, e->msg, m);
    joined[n + m] = '\0';
    memcpy(e->msg, joined, sizeof(e->msg));
    return -1;
}

int ds4_err_prefix_path(ds4_err *e, const char *path, const char *what) {
    if (!e) return -1;
    size_t n = strlen(path);
    if (strncmp(e->msg, path, n) == 0 && e->msg[n] == ':' && e->msg[n + 1] == ' ') {
        char rest[sizeof(e->msg)];
        snprintf(rest, sizeof(rest), "%s", e->msg + n + 2);
        snprintf(e->msg, sizeof(e->msg), "%s", rest);
    }
    return ds4_err_prefix(e, "%s: %s", path, what);
}

void ds4_err_clear(ds4_err *e) {
    if (!e) return;
    e->code = DS4_OK;
    e->msg[0] = '\0';
}

const char *ds4_err_msg(const ds4_err *e) { return e ? e->msg : ""; }

const char *ds4_errcode_name(ds4_errcode code) {
    switch (code) {
    case DS4_OK: return "ok";
    case DS4_EIO: return "io";
    case DS4_EFORMAT: return "format";
    case DS4_ERANGE: return "range";
    case DS4_EUNSUPPORTED: return "unsupported";
    case DS4_EINVAL: return "invalid";
    case DS4_ENOMEM: return "nomem";
    case DS4_ENOTFOUND: return "notfound";
    case DS4_EINTERRUPTED: return "interrupted";
    case DS4_EBUSY: return "busy";
    }
    return "unknown";
}
