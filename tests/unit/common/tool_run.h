/*
 * tool_run.h - test helpers for tests that run programs and check messages:
 * run a shell command capturing its output, and fail unless a message
 * contains an expected part.
 */
#ifndef DS4_TEST_TOOL_RUN_H
#define DS4_TEST_TOOL_RUN_H

#include <stddef.h>

/* Run a shell command (printf-style) with stderr merged into stdout; the
 * output goes to out (NUL-terminated, truncated to len).  Returns the exit
 * status, -1 when the command did not exit normally.  Unless the test
 * runner chose one, the programs get an instance lock file of this test's
 * own (build/test-locks/TEST.lock; src/base/instance_lock.h). */
int run_capture(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Fail the current cmocka test unless msg contains part. */
void assert_contains(const char *msg, const char *part);

#endif
