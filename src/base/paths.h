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

#include "base/error.h"

/* 0 when path names a readable file that is not a directory; else
 * "cannot open PATH: why" (DS4_EIO). */
int ds4_path_check_readable(const char *path, ds4_err *err);

/* 0 when path can be created or replaced: not a directory, writable when
 * it exists, its directory existing and writable when it does not; else
 * "cannot write PATH: why" (DS4_EIO). */
int ds4_path_check_writable(const char *path, ds4_err *err);

#endif
