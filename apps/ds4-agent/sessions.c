/*
 * sessions.c - what /list, /switch and /history show, for both models
 * (see agent.h): the session directory, titles, ages, resolving an id
 * prefix, the history of user turns with their answers, and the ids Tab
 * completes after /switch.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "engine/kvcache.h"

static int mkdir_p(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int rc = mkdir(path, 0700);
        *p = '/';
        if (rc != 0 && errno != EEXIST) return -1;
    }
    return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

char *sessions_dir(const agent_opts *o, ds4_err *err) {
    char buf[1024];
    if (o->kv_dir) {
        snprintf(buf, sizeof(buf), "%s", o->kv_dir);
    } else {
        const char *home = getenv("HOME");
        if (!home || !*home) {
            ds4_err_set(err, DS4_EINVAL, "no $HOME for the session directory: give --kv-dir DIR");
            return NULL;
        }
        snprintf(buf, sizeof(buf), "%s/.ds4/kvcache", home);
    }
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    if (mkdir_p(buf) != 0) {
        ds4_err_set(err, DS4_EIO, "session directory %s: %s", buf, strerror(errno));
        return NULL;
    }
    return strdup(buf);
}

void sessions_title(const char *text, size_t n, char out[80]) {
    size_t i = 0, o = 0;
    while (i < n && (text[i] == ' ' || text[i] == '\n')) i++;
    while (i < n && text[i] != '\n' && o < 70) {
        /* whole UTF-8 characters only */
        size_t len = 1;
        unsigned char c = (unsigned char)text[i];
        if (c >= 0xF0) len = 4;
        else if (c >= 0xE0) len = 3;
        else if (c >= 0xC0) len = 2;
        if (i + len > n || o + len > 70) break;
        memcpy(out + o, text + i, len);
        o += len;
        i += len;
    }
    if (i < n && text[i] != '\n' && o + 3 < 80) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = 0;
}

static int by_recent(const void *a, const void *b) {
    const session_info *x = a, *y = b;
    return x->mtime < y->mtime ? 1 : x->mtime > y->mtime ? -1 : strcmp(x->id, y->id);
}

void sessions_sort_recent(session_info *s, size_t n) {
    if (n) qsort(s, n, sizeof(*s), by_recent);
}

int sessions_resolve(const session_info *s, size_t n, const char *prefix, size_t *which, ds4_err *err) {
    size_t pl = strlen(prefix), found = 0;
    if (!pl) return ds4_err_set(err, DS4_EINVAL, "/switch needs a session id (see /list; Tab completes)");
    if (strspn(prefix, "0123456789abcdefABCDEF") != pl)
        return ds4_err_set(err, DS4_EINVAL, "'%s' is not a session id (hex digits, see /list)", prefix);
    for (size_t i = 0; i < n; i++)
        if (!strncasecmp(s[i].id, prefix, pl)) {
            if (!found) *which = i;
            found++;
        }
    if (!found) return ds4_err_set(err, DS4_ENOTFOUND, "no saved session starts with %s (see /list)", prefix);
    if (found > 1) return ds4_err_set(err, DS4_EINVAL, "%s matches %zu sessions: type more digits", prefix, found);
    return 0;
}

static void fmt_age(uint64_t when, char *buf, size_t n) {
    uint64_t now = (uint64_t)time(NULL), d = now > when ? now - when : 0;
    if (d < 60) snprintf(buf, n, "%llus ago", (unsigned long long)d);
    else if (d < 3600) snprintf(buf, n, "%llum ago", (unsigned long long)(d / 60));
    else if (d < 86400) snprintf(buf, n, "%lluh ago", (unsigned long long)(d / 3600));
    else snprintf(buf, n, "%llud ago", (unsigned long long)(d / 86400));
}

static void fmt_bytes(uint64_t b, char *buf, size_t n) {
    if (b < (1u << 20)) snprintf(buf, n, "%.0f KiB", b / 1024.0);
    else if (b < (1ull << 30)) snprintf(buf, n, "%.1f MiB", b / 1048576.0);
    else snprintf(buf, n, "%.2f GiB", b / 1073741824.0);
}

void sessions_print(display *d, const session_info *s, size_t n) {
    if (!n) {
        display_printf(d, OUT_INFO, "no saved sessions (/save keeps the current one)\n");
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char age[32], size[32];
        fmt_age(s[i].mtime, age, sizeof(age));
        fmt_bytes(s[i].bytes, size, sizeof(size));
        display_printf(d, OUT_INFO, "%.8s  %-8s  %7u tokens  %9s  %s%s%s%s\n", s[i].id, age, s[i].tokens, size,
                       s[i].title[0] ? s[i].title : "(no user message)", strcmp(s[i].kind, "session") ? "  [" : "",
                       strcmp(s[i].kind, "session") ? s[i].kind : "", strcmp(s[i].kind, "session") ? "]" : "");
    }
}

/* At most max bytes and 8 lines of s, cut at a character boundary, with
 * a note. */
static void show_cut(display *d, out_style st, const char *s, size_t n, size_t max) {
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' ')) n--;
    while (n && (*s == '\n' || *s == ' ')) s++, n--;
    int lines = 0;
    for (size_t i = 0; i < n && i < max; i++)
        if (s[i] == '\n' && ++lines == 8) max = i;
    if (n <= max) {
        display_write(d, st, s, n);
        display_newline(d);
        return;
    }
    size_t k = max;
    while (k && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    display_write(d, st, s, k);
    display_printf(d, OUT_RESULT, " [... %zu more bytes]\n", n - k);
}

void sessions_history(display *d, const json_t *msgs, int turns) {
    size_t n = json_array_size(msgs), start = n;
    int seen = 0;
    /* the last `turns` real user messages (tool results are not turns) */
    while (start > 0 && seen < turns) {
        start--;
        if (!strcmp(json_string_value(json_object_get(json_array_get(msgs, start), "role")), "user")) seen++;
    }
    if (!seen) {
        display_printf(d, OUT_INFO, "no user turns yet\n");
        return;
    }
    for (size_t i = start; i < n; i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        if (!strcmp(role, "user")) {
            display_newline(d);
            display_write(d, OUT_ECHO, "› ", strlen("› "));
            show_cut(d, OUT_ECHO, json_string_value(c), json_string_length(c), 600);
        } else if (!strcmp(role, "assistant")) {
            const json_t *calls = json_object_get(m, "tool_calls");
            if (json_string_length(c)) show_cut(d, OUT_TEXT, json_string_value(c), json_string_length(c), 1200);
            if (json_array_size(calls)) {
                ds4_strbuf b = {0};
                for (size_t k = 0; k < json_array_size(calls); k++)
                    ds4_strbuf_printf(&b, "%s%s", k ? ", " : "", json_string_value(json_array_get(calls, k)));
                display_printf(d, OUT_TOOL, "  [tools: %s]\n", b.p ? b.p : "");
                ds4_strbuf_free(&b);
            }
        }
    }
}

/* ------------------------------------------------------------ completion */

typedef struct cand {
    char id[41];
    time_t mtime;
} cand;

static int cand_recent(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return x->mtime < y->mtime ? 1 : x->mtime > y->mtime ? -1 : strcmp(x->id, y->id);
}

char **sessions_complete(const char *dir, const char *prefix, size_t *n_out) {
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    cand *c = NULL;
    size_t n = 0, cap = 0, pl = strlen(prefix);
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        bool kv = l == 43 && !strcmp(de->d_name + 40, ".kv"), js = l == 45 && !strcmp(de->d_name + 40, ".json");
        if ((!kv && !js) || strspn(de->d_name, "0123456789abcdef") != 40 || strncmp(de->d_name, prefix, pl)) continue;
        char path[1200];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        if (kv) {
            /* the system prompt's own file is not a session */
            FILE *f = fopen(path, "rb");
            unsigned char h[8];
            bool sys = f && fread(h, 1, 8, f) == 8 && h[5] == DS4_KVC_AGENT_SYSTEM;
            if (f) fclose(f);
            if (sys) continue;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            cand *nc = realloc(c, cap * sizeof(*nc));
            if (!nc) break;
            c = nc;
        }
        memcpy(c[n].id, de->d_name, 40);
        c[n].id[40] = 0;
        c[n].mtime = st.st_mtime;
        n++;
    }
    closedir(d);
    if (n) qsort(c, n, sizeof(*c), cand_recent);
    char **out = n ? calloc(n, sizeof(*out)) : NULL;
    for (size_t i = 0; out && i < n; i++) out[i] = strdup(c[i].id);
    free(c);
    *n_out = out ? n : 0;
    return out;
}
