/*
 * tool_run.h - test helpers for tests that run programs and check messages:
 * run a shell command capturing its output, fail unless a message
 * contains an expected part, check and open the files the programs wrote.
 */
#ifndef DS4_TEST_TOOL_RUN_H
#define DS4_TEST_TOOL_RUN_H

#include <stdbool.h>
#include <stddef.h>

#include "format/gguf.h"

/* Run a shell command (printf-style) with stderr merged into stdout; the
 * output goes to out (NUL-terminated, truncated to len).  Returns the exit
 * status, -1 when the command did not exit normally.  Unless the test
 * runner chose one, the programs get an instance lock file of this test's
 * own (build/test-locks/TEST.lock; src/base/instance_lock.h). */
int run_capture(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Fail the current cmocka test unless msg contains part. */
void assert_contains(const char *msg, const char *part);

/* Whether a file (or folder) is at path. */
bool file_exists(const char *path);

/* The GGUF at path, or the current cmocka test fails with the reader's
 * message. */
ds4_gguf *gguf_open_or_fail(const char *path);

#endif
