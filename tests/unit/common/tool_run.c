/*
 * tool_run.c - running programs from tests (see tool_run.h).
 */
#include "common/tool_run.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

static void own_lock_file(void) {
    if (getenv("DS4_LOCK_FILE") && *getenv("DS4_LOCK_FILE")) return;
    char p[512];
    mkdir("build", 0777);
    mkdir("build/test-locks", 0777);
    snprintf(p, sizeof(p), "build/test-locks/%s.lock", program_invocation_short_name);
    setenv("DS4_LOCK_FILE", p, 1);
}

int run_capture(char *out, size_t len, const char *fmt, ...) {
    own_lock_file();
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof(cmd) - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    if (!p) fail_msg("popen failed: %s", cmd);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void assert_contains(const char *msg, const char *part) {
    if (!strstr(msg, part)) fail_msg("\"%s\" lacks \"%s\"", msg, part);
}

bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

ds4_gguf *gguf_open_or_fail(const char *path) {
    ds4_err err = {0};
    ds4_gguf *g = ds4_gguf_open(path, &err);
    if (!g) fail_msg("%s", err.msg);
    return g;
}
