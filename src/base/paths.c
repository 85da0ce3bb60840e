/*
 * paths.c - file checks before the work starts (see paths.h).
 */
#include "base/paths.h"

#include <errno.h>
#include <stdio.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ds4_path_check_readable(const char *path, ds4_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) return ds4_err_set(err, DS4_EIO, "cannot open %s: it is a directory", path);
    if (access(path, R_OK) != 0) return ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
    return 0;
}

int ds4_path_check_writable(const char *path, ds4_err *err) {
    struct stat st;
    if (!*path) return ds4_err_set(err, DS4_EIO, "cannot write a file with an empty name");
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return ds4_err_set(err, DS4_EIO, "cannot write %s: it is a directory", path);
        if (access(path, W_OK) != 0) return ds4_err_set(err, DS4_EIO, "cannot write %s: %s", path, strerror(errno));
        return 0;
    }
    if (errno != ENOENT) return ds4_err_set(err, DS4_EIO, "cannot write %s: %s", path, strerror(errno));
    char *copy = strdup(path);
    if (!copy) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    const char *dir = dirname(copy); /* "." for a bare name */
    int rc = 0;
    if (stat(dir, &st) != 0)
        rc = ds4_err_set(err, DS4_EIO, "cannot write %s: directory %s: %s", path, dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode)) rc = ds4_err_set(err, DS4_EIO, "cannot write %s: %s is not a directory", path, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        rc = ds4_err_set(err, DS4_EIO, "cannot write %s: directory %s: %s", path, dir, strerror(errno));
    free(copy);
    return rc;
}

int ds4_atomic_open(ds4_atomic_file *a, const char *path, ds4_err *err) {
    size_t n = strlen(path) + 5;
    a->path = path;
    a->f = NULL;
    if (!(a->tmp = malloc(n))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    snprintf(a->tmp, n, "%s.tmp", path);
    if (!(a->f = fopen(a->tmp, "wb"))) {
        ds4_err_set(err, DS4_EIO, "%s: %s", a->tmp, strerror(errno));
        free(a->tmp);
        a->tmp = NULL;
        return -1;
    }
    return 0;
}

int ds4_atomic_commit(ds4_atomic_file *a, bool bad, ds4_err *err) {
    bad |= fflush(a->f) != 0 || fsync(fileno(a->f)) != 0;
    bad |= fclose(a->f) != 0;
    int rc = 0;
    if (bad || rename(a->tmp, a->path) != 0) {
        rc = ds4_err_set(err, DS4_EIO, "%s: write failed: %s", a->path, strerror(errno));
        unlink(a->tmp);
    }
    free(a->tmp);
    a->tmp = NULL;
    a->f = NULL;
    return rc;
}
