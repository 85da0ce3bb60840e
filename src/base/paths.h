/*
 * paths.h - checking the files a command line names before the work starts:
 * a program that will read a file or write one should say that it cannot
 * before it spends minutes loading a model, not after.
 *
 * The checks do not create or change anything: an output file is not
 * truncated, only its directory is checked (and the file itself when it
 * already exists).  They cannot promise the later open succeeds (the file
 * system can change in between); they catch the mistakes people make.
 */
#ifndef DS4_BASE_PATHS_H
#define DS4_BASE_PATHS_H

#include <stdbool.h>
#include <stdio.h>

#include "base/error.h"

/* 0 when path names a readable file that is not a directory; else
 * "cannot open PATH: why" (DS4_EIO). */
int ds4_path_check_readable(const char *path, ds4_err *err);

/* 0 when path can be created or replaced: not a directory, writable when
 * it exists, its directory existing and writable when it does not; else
 * "cannot write PATH: why" (DS4_EIO). */
int ds4_path_check_writable(const char *path, ds4_err *err);

/* A file written whole or not at all: ds4_atomic_open creates PATH.tmp;
 * ds4_atomic_commit flushes, syncs and closes it, then renames it over PATH,
 * unless `bad` (the caller's writes failed) or any of that fails, when the
 * temporary file is removed and "PATH: write failed" is the error. */
typedef struct ds4_atomic_file {
    FILE *f;
    char *tmp;
    const char *path;
} ds4_atomic_file;

int ds4_atomic_open(ds4_atomic_file *a, const char *path, ds4_err *err);
int ds4_atomic_commit(ds4_atomic_file *a, bool bad, ds4_err *err);

#endif
