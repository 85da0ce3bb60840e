/*
 * jail.c - the working root of the file tools (see tools.h).
 *
 * A path is resolved one component at a time from the root (or from "/"
 * for an absolute path): while components exist they go through
 * realpath(), so every symlink is followed to where it really points;
 * once one does not exist the rest is appended as written, ".." and "."
 * applied lexically (a file about to be created).  The result must be the
 * root or below it.  So "link-to-etc/passwd" is refused even though it
 * looks like it is inside, and "../x" or "/etc/x" are refused plainly.
 *
 * The check is made when the tool runs; a process that swaps a directory
 * for a symlink between the check and the open could still escape.  The
 * jail keeps the model's file tools where the user put them; it is not a
 * sandbox against a hostile local process (and bash is not confined at all:
 * the permission prompt is what guards it).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tools.h"

int jail_init(jail *j, const char *dir, ds4_err *err) {
    memset(j, 0, sizeof(*j));
    char *r = realpath(dir, NULL);
    if (!r) return ds4_err_set(err, DS4_EIO, "--root %s: %s", dir, strerror(errno));
    struct stat st;
    if (stat(r, &st) != 0 || !S_ISDIR(st.st_mode)) {
        free(r);
        return ds4_err_set(err, DS4_EINVAL, "--root %s: not a directory", dir);
    }
    j->root = r;
    j->root_len = strlen(r);
    return 0;
}

void jail_free(jail *j) {
    free(j->root);
    memset(j, 0, sizeof(*j));
}

static bool inside(const jail *j, const char *abs) {
    if (!strcmp(j->root, "/")) return true;
    return !strncmp(abs, j->root, j->root_len) && (abs[j->root_len] == 0 || abs[j->root_len] == '/');
}

/* Drop the last component of an absolute path in place ("/" stays). */
static void up(char *p) {
    char *s = strrchr(p, '/');
    if (!s) return;
    if (s == p) p[1] = 0;
    else *s = 0;
}

static bool append(char *p, const char *comp, size_t n) {
    size_t l = strlen(p);
    bool slash = !(l == 1 && p[0] == '/');
    if (l + slash + n + 1 > PATH_MAX) return false;
    if (slash) p[l++] = '/';
    memcpy(p + l, comp, n);
    p[l + n] = 0;
    return true;
}

char *jail_resolve(const jail *j, const char *path, ds4_err *err) {
    if (!path || !*path) {
        ds4_err_set(err, DS4_EINVAL, "empty path");
        return NULL;
    }
    char cur[PATH_MAX];
    snprintf(cur, sizeof(cur), "%s", path[0] == '/' ? "/" : j->root);
    const char *p = path;
    while (*p) {
        while (*p == '/') p++;
        size_t n = strcspn(p, "/");
        if (!n) break;
        if (n == 1 && p[0] == '.') {
            /* nothing */
        } else if (n == 2 && p[0] == '.' && p[1] == '.') {
            up(cur);
        } else {
            if (!append(cur, p, n)) {
                ds4_err_set(err, DS4_ERANGE, "path %s is too long", path);
                return NULL;
            }
            struct stat st;
            if (lstat(cur, &st) == 0) {
                char *real = realpath(cur, NULL);
                if (!real) {
                    ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
                    return NULL;
                }
                snprintf(cur, sizeof(cur), "%s", real);
                free(real);
            }
        }
        p += n;
    }
    if (!inside(j, cur)) {
        if (strcmp(cur, path) != 0 && path[0] != '/' && strncmp(path, "..", 2) != 0)
            ds4_err_set(err, DS4_EINVAL, "%s resolves to %s, outside the working root %s (symlinks are followed)", path,
                        cur, j->root);
        else ds4_err_set(err, DS4_EINVAL, "%s is outside the working root %s", path, j->root);
        return NULL;
    }
    return strdup(cur);
}

const char *jail_show(const jail *j, const char *abs) {
    if (!strcmp(abs, j->root)) return ".";
    if (inside(j, abs) && strcmp(j->root, "/") != 0) return abs + j->root_len + 1;
    return abs;
}
