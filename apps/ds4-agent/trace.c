/*
 * trace.c - the --trace file: one line per event with a wall-clock time
 * in milliseconds, text escaped so a line stays a line (see agent.h).
 */
#include <stdarg.h>
#include <sys/time.h>
#include <time.h>

#include "agent.h"

static void stamp(FILE *f) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    fprintf(f, "[%02d:%02d:%02d.%03d] ", tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000));
}

void trace_line(FILE *f, const char *fmt, ...) {
    if (!f) return;
    stamp(f);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fflush(f);
}

void trace_text(FILE *f, const char *label, const char *s, size_t n) {
    if (!f) return;
    stamp(f);
    fprintf(f, "%s: \"", label);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputs("\"\n", f);
    fflush(f);
}
