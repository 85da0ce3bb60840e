/*
 * search.c - the search tool (see tools.h): a recursive grep for the model.
 *
 * Walks a file or a directory tree below the root (at most 24 levels, not
 * into .git, not following symlinked directories, in name order so results
 * are stable), skips binary and oversized files, and prints each matching
 * line as "path:line<TAB>text" with up to 5 lines of context ("path-line").
 * Matches are literal by default, or POSIX extended regular expressions;
 * a glob filters files by name or by path below the search root.  Every
 * line shown is remembered (views.c), so the model can edit it by number
 * without reading the file first.
 */
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "tools.h"

#define SEARCH_DEFAULT_RESULTS 50
#define SEARCH_MAX_RESULTS     500
#define SEARCH_LINE_MAX        400

typedef struct search {
    tool_env *env;
    const char *query;
    size_t qlen;
    bool regex, icase;
    regex_t re;
    const char *glob;
    const char *base; /* the search root (absolute), for glob paths */
    int context;
    long long max;
    long long found; /* matches, shown or not */
    long long files_with, files_seen, skipped_binary, skipped_big;
    ds4_strbuf out;
} search;

static bool line_matches(search *s, const char *p, size_t n) {
    if (s->regex) {
        char stack[1024];
        char *buf = n < sizeof(stack) ? stack : malloc(n + 1);
        if (!buf) return false;
        memcpy(buf, p, n);
        buf[n] = 0;
        bool m = regexec(&s->re, buf, 0, NULL, 0) == 0;
        if (buf != stack) free(buf);
        return m;
    }
    if (s->qlen > n) return false;
    if (!s->icase) return memmem(p, n, s->query, s->qlen) != NULL;
    for (size_t i = 0; i + s->qlen <= n; i++)
        if (!strncasecmp(p + i, s->query, s->qlen)) return true;
    return false;
}

static void emit(search *s, const char *shown, const file_lines *f, int i, char sep) {
    size_t l = f->len_of[i];
    ds4_strbuf_printf(&s->out, "%s%c%d\t%.*s%s\n", shown, sep, i + 1, (int)(l > SEARCH_LINE_MAX ? SEARCH_LINE_MAX : l),
                      f->line[i], l > SEARCH_LINE_MAX ? " [...]" : "");
}

static bool glob_ok(search *s, const char *abs, const char *name) {
    if (!s->glob) return true;
    if (fnmatch(s->glob, name, 0) == 0) return true;
    size_t bl = strlen(s->base);
    const char *rel = !strncmp(abs, s->base, bl) && abs[bl] == '/' ? abs + bl + 1 : abs;
    return fnmatch(s->glob, rel, FNM_PATHNAME) == 0 || fnmatch(s->glob, rel, 0) == 0;
}

static void search_file(search *s, const char *abs, const char *name) {
    if (!glob_ok(s, abs, name)) return;
    file_lines f;
    ds4_err err = {0};
    if (file_load(abs, &f, &err) != 0) {
        if (err.code == DS4_EUNSUPPORTED) s->skipped_binary++;
        else if (err.code == DS4_ERANGE) s->skipped_big++;
        return;
    }
    s->files_seen++;
    const char *shown = jail_show(&s->env->jail, abs);
    int last_shown = 0; /* last line printed (1-based), for context overlap */
    bool any = false;
    for (int i = 0; i < f.n; i++) {
        if (!line_matches(s, f.line[i], f.len_of[i])) continue;
        s->found++;
        if (s->found > s->max) continue;
        any = true;
        int a = i - s->context > 0 ? i - s->context : 0;
        int z = i + s->context < f.n - 1 ? i + s->context : f.n - 1;
        if (a < last_shown) a = last_shown;
        if (last_shown && a > last_shown) ds4_strbuf_puts(&s->out, "--\n");
        for (int k = a; k <= z; k++) {
            bool hit = k == i || (k > i && line_matches(s, f.line[k], f.len_of[k]));
            if (k > i && hit) break; /* the next match prints its own context */
            emit(s, shown, &f, k, k == i ? ':' : '-');
            if (f.len_of[k] <= SEARCH_LINE_MAX) views_see(&s->env->views, abs, k + 1, 1, &f.line[k], &f.len_of[k]);
            last_shown = k + 1;
        }
    }
    if (any) s->files_with++;
    file_lines_free(&f);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void search_dir(search *s, const char *abs, int depth) {
    if (depth > TOOL_SEARCH_DEPTH) return;
    DIR *dir = opendir(abs);
    if (!dir) return;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, ".git")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof(*nn));
            if (!nn) break;
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) break;
        n++;
    }
    closedir(dir);
    if (n) qsort(names, n, sizeof(*names), by_name);
    for (size_t i = 0; i < n; i++) {
        char full[PATH_MAX];
        if ((size_t)snprintf(full, sizeof(full), "%s/%s", strcmp(abs, "/") ? abs : "", names[i]) < sizeof(full)) {
            struct stat st;
            if (lstat(full, &st) == 0) {
                if (S_ISDIR(st.st_mode)) search_dir(s, full, depth + 1);
                else if (S_ISREG(st.st_mode)) search_file(s, full, names[i]);
                /* symlinks are not followed: they may leave the root or loop */
            }
        }
        free(names[i]);
    }
    free(names);
}

char *tool_search(tool_env *env, const json_t *args) {
    search s = {.env = env, .max = SEARCH_DEFAULT_RESULTS};
    s.query = arg_str(args, "query");
    s.qlen = json_string_length(json_object_get(args, "query"));
    const char *path = arg_str(args, "path");
    const char *mode = arg_str(args, "mode");
    s.glob = arg_str(args, "glob");
    long long ctx = 0;
    if (arg_int(args, "context", &ctx) && (ctx < 0 || ctx > 5))
        return tool_error("search: context must be 0 to 5, not %lld", ctx);
    s.context = (int)ctx;
    if (arg_int(args, "max_results", &s.max) && (s.max < 1 || s.max > SEARCH_MAX_RESULTS))
        return tool_error("search: max_results must be 1 to %d, not %lld", SEARCH_MAX_RESULTS, s.max);
    s.icase = !arg_bool(args, "case_sensitive", true);
    if (!s.qlen) return tool_error("search: the query is empty");
    if (mode && strcmp(mode, "literal") && strcmp(mode, "regex"))
        return tool_error("search: mode must be \"literal\" or \"regex\", not \"%.40s\"", mode);
    s.regex = mode && !strcmp(mode, "regex");
    if (s.regex) {
        int rc = regcomp(&s.re, s.query, REG_EXTENDED | REG_NOSUB | (s.icase ? REG_ICASE : 0));
        if (rc) {
            char msg[200];
            regerror(rc, &s.re, msg, sizeof(msg));
            return tool_error("search: bad regular expression \"%.100s\": %s (POSIX extended syntax)", s.query, msg);
        }
    }
    ds4_err err = {0};
    char *abs = jail_resolve(&env->jail, path && *path ? path : ".", &err);
    if (!abs) {
        if (s.regex) regfree(&s.re);
        return tool_error("search %s: %s", path, err.msg);
    }
    struct stat st;
    char *r = NULL;
    if (stat(abs, &st) != 0) {
        r = tool_error("search %s: %s", path ? path : ".", strerror(errno));
    } else {
        s.base = S_ISDIR(st.st_mode) ? abs : NULL;
        if (S_ISDIR(st.st_mode)) {
            search_dir(&s, abs, 0);
        } else {
            char *slash = strrchr(abs, '/');
            s.base = abs;
            s.glob = NULL; /* a single file named on purpose */
            search_file(&s, abs, slash ? slash + 1 : abs);
        }
        ds4_strbuf head = {0};
        ds4_strbuf_printf(&head, "%lld match%s in %lld file%s (%lld searched)", s.found, s.found == 1 ? "" : "es",
                          s.files_with, s.files_with == 1 ? "" : "s", s.files_seen);
        if (s.found > s.max)
            ds4_strbuf_printf(&head, "; showing the first %lld: narrow the search or raise max_results", s.max);
        if (s.skipped_binary) ds4_strbuf_printf(&head, "; %lld binary files skipped", s.skipped_binary);
        if (s.skipped_big)
            ds4_strbuf_printf(&head, "; %lld files over %u MiB skipped", s.skipped_big, TOOL_FILE_MAX >> 20);
        ds4_strbuf_puts(&head, "\n");
        display_printf(env->d, OUT_RESULT, "  search: %s", head.p);
        ds4_strbuf_append(&head, s.out.p, s.out.len);
        r = tool_text(&head);
    }
    ds4_strbuf_free(&s.out);
    if (s.regex) regfree(&s.re);
    free(abs);
    return r;
}
