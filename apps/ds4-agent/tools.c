/*
 * tools.c - the tool table, argument checking, permissions and the file
 * tools read, more, write, edit and list (see tools.h; search.c and jobs.c
 * hold the others).
 *
 * Arguments arrive as the JSON object the DSML parser built.  Before a
 * tool runs, the object is checked against the table: unknown names,
 * missing required ones and wrong types are refused with a message naming
 * the argument and what was expected.  Models sometimes write a number or
 * a boolean with string="true"; "12" and "true" are accepted for integer
 * and boolean parameters, anything else is an error.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools.h"

typedef enum param_type { P_STRING, P_INTEGER, P_BOOLEAN } param_type;

typedef struct param_def {
    const char *name;
    param_type type;
    bool required;
    const char *help;
} param_def;

typedef char *(*tool_fn)(tool_env *env, const json_t *args);

/* One tool: its name and description (both go into the system prompt),
 * its parameters and what runs it. */
typedef struct tool_def {
    const char *name;
    const char *help;
    param_def params[8];
    tool_fn run;
} tool_def;

static char *tool_read(tool_env *env, const json_t *args);
static char *tool_more(tool_env *env, const json_t *args);
static char *tool_write(tool_env *env, const json_t *args);
static char *tool_edit(tool_env *env, const json_t *args);
static char *tool_list(tool_env *env, const json_t *args);

static const tool_def TOOLS[] = {
    {"read",
     "Read a text file: numbered lines, 500 from start_line by default. whole=true reads it all (if it fits the "
     "context); raw=true gives the bytes without line numbers.",
     {{"path", P_STRING, true, "file to read"},
      {"start_line", P_INTEGER, false, "first line, from 1"},
      {"max_lines", P_INTEGER, false, "how many lines (default 500)"},
      {"whole", P_BOOLEAN, false, "read the whole file"},
      {"raw", P_BOOLEAN, false, "no line numbers"}},
     tool_read},
    {"more",
     "Continue the last read where it stopped.",
     {{"count", P_INTEGER, false, "how many lines (default 500)"}},
     tool_more},
    {"write",
     "Create or overwrite a file with the given content (parent directories are created).",
     {{"path", P_STRING, true, "file to write"}, {"content", P_STRING, true, "the whole new content"}},
     tool_write},
    {"edit",
     "Edit a file. By lines you were shown: line=N, start_line/end_line, or range=\"A:B\", with new (\"\" deletes); "
     "range=\"all\" rewrites the whole file. Or by text: old (must occur exactly once) and new.",
     {{"path", P_STRING, true, "file to edit"},
      {"line", P_INTEGER, false, "one line to replace"},
      {"start_line", P_INTEGER, false, "first line to replace"},
      {"end_line", P_INTEGER, false, "last line to replace"},
      {"range", P_STRING, false, "\"A:B\" or \"all\""},
      {"old", P_STRING, false, "exact text to replace"},
      {"new", P_STRING, true, "replacement text"}},
     tool_edit},
    {"search",
     "Search file contents under a directory (skips .git and binary files): numbered matching lines with context.",
     {{"query", P_STRING, true, "text or regular expression"},
      {"path", P_STRING, false, "file or directory (default .)"},
      {"mode", P_STRING, false, "literal (default) or regex (POSIX extended)"},
      {"glob", P_STRING, false, "only files whose name or path matches, e.g. *.c"},
      {"context", P_INTEGER, false, "lines of context around each match, 0-5"},
      {"max_results", P_INTEGER, false, "matches to show, default 50, at most 500"},
      {"case_sensitive", P_BOOLEAN, false, "default true"}},
     tool_search},
    {"list", "List one directory.", {{"path", P_STRING, false, "directory (default .)"}}, tool_list},
    {"bash",
     "Run a shell command (sh -c) as a job. Returns when it ends or after refresh_sec seconds with the output so "
     "far; a job still running keeps going: check it with bash_status, end it with bash_stop.",
     {{"command", P_STRING, true, "the command"},
      {"timeout_sec", P_INTEGER, false, "kill it after this long, 1-86400 (default 3600)"},
      {"refresh_sec", P_INTEGER, false, "wait at most this long before reporting, 1-3600 (default 60)"}},
     tool_bash},
    {"bash_status",
     "Status and new output of a bash job.",
     {{"job", P_INTEGER, false, "job number"},
      {"pid", P_INTEGER, false, "or its process id"},
      {"refresh_sec", P_INTEGER, false, "wait up to this long for it to end first (default 0)"}},
     tool_bash_status},
    {"bash_stop",
     "Stop a bash job (SIGTERM to its process group, SIGKILL a second later) and report its last output.",
     {{"job", P_INTEGER, false, "job number"}, {"pid", P_INTEGER, false, "or its process id"}},
     tool_bash_stop},
};
#define N_TOOLS (sizeof(TOOLS) / sizeof(TOOLS[0]))

static const char *const TYPE_NAMES[] = {[P_STRING] = "string", [P_INTEGER] = "integer", [P_BOOLEAN] = "boolean"};

json_t *agent_tool_schemas(void) {
    json_t *tools = json_array();
    for (size_t i = 0; i < N_TOOLS && tools; i++) {
        const tool_def *t = &TOOLS[i];
        json_t *props = json_object(), *req = json_array();
        for (const param_def *p = t->params; p->name; p++) {
            json_object_set_new(props, p->name,
                                json_pack("{s:s, s:s}", "type", TYPE_NAMES[p->type], "description", p->help));
            if (p->required) json_array_append_new(req, json_string(p->name));
        }
        json_t *params = json_pack("{s:s, s:o}", "type", "object", "properties", props);
        if (json_array_size(req)) json_object_set_new(params, "required", req);
        else json_decref(req);
        json_array_append_new(tools, json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name",
                                               t->name, "description", t->help, "parameters", params));
    }
    return tools;
}

/* ------------------------------------------------------------ results */

char *tool_error(const char *fmt, ...) {
    ds4_strbuf b = {0};
    ds4_strbuf_puts(&b, "Tool error: ");
    va_list ap;
    va_start(ap, fmt);
    char msg[2048];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ds4_strbuf_puts(&b, msg);
    return tool_text(&b);
}

char *tool_text(ds4_strbuf *b) {
    if (b->failed) return strdup("Tool error: out of memory building the result");
    char *s = malloc(b->len + 1);
    if (!s) return NULL;
    if (b->len) memcpy(s, b->p, b->len);
    s[b->len] = 0;
    ds4_strbuf_free(b);
    return s;
}

/* ------------------------------------------------------------ arguments */

const char *arg_str(const json_t *args, const char *name) { return json_string_value(json_object_get(args, name)); }

static bool parse_ll(const char *s, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || errno) return false;
    while (*end == ' ' || *end == '\n') end++;
    if (*end) return false;
    *out = v;
    return true;
}

bool arg_int(const json_t *args, const char *name, long long *out) {
    const json_t *v = json_object_get(args, name);
    if (json_is_integer(v)) return *out = json_integer_value(v), true;
    if (json_is_real(v)) return *out = (long long)json_real_value(v), true;
    if (json_is_string(v)) return parse_ll(json_string_value(v), out);
    return false;
}

bool arg_bool(const json_t *args, const char *name, bool def) {
    const json_t *v = json_object_get(args, name);
    if (json_is_boolean(v)) return json_is_true(v);
    if (json_is_string(v)) return !strcmp(json_string_value(v), "true");
    return def;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* Check one value against its declared type; NULL when fine. */
static char *check_type(const tool_def *t, const param_def *p, const json_t *v) {
    long long ll;
    switch (p->type) {
    case P_STRING:
        if (json_is_string(v)) return NULL;
        break;
    case P_INTEGER:
        if (json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v)))
            return NULL;
        if (json_is_string(v) && parse_ll(json_string_value(v), &ll)) return NULL;
        if (json_is_string(v))
            return tool_error("%s: argument '%s' must be an integer, got the string \"%.60s\"", t->name, p->name,
                              json_string_value(v));
        break;
    case P_BOOLEAN:
        if (json_is_boolean(v)) return NULL;
        if (json_is_string(v) && (!strcmp(json_string_value(v), "true") || !strcmp(json_string_value(v), "false")))
            return NULL;
        if (json_is_string(v))
            return tool_error("%s: argument '%s' must be true or false, got the string \"%.60s\"", t->name, p->name,
                              json_string_value(v));
        break;
    }
    return tool_error("%s: argument '%s' must be %s (string=\"%s\"), got %s", t->name, p->name,
                      p->type == P_STRING    ? "a string"
                      : p->type == P_INTEGER ? "an integer"
                                             : "a boolean",
                      p->type == P_STRING ? "true" : "false", json_kind(v));
}

static char *check_args(const tool_def *t, const json_t *args) {
    if (!json_is_object(args))
        return tool_error("%s: the arguments are %s, not named parameters", t->name, json_kind(args));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)args, key, v) {
        const param_def *p = t->params;
        while (p->name && strcmp(p->name, key)) p++;
        if (!p->name) {
            ds4_strbuf names = {0};
            for (const param_def *q = t->params; q->name; q++)
                ds4_strbuf_printf(&names, "%s%s", q == t->params ? "" : ", ", q->name);
            char *e = tool_error("%s: unknown argument '%.60s' (%s takes: %s)", t->name, key, t->name,
                                 names.p ? names.p : "no arguments");
            ds4_strbuf_free(&names);
            return e;
        }
        char *e = check_type(t, p, v);
        if (e) return e;
    }
    for (const param_def *p = t->params; p->name; p++)
        if (p->required && !json_object_get(args, p->name))
            return tool_error("%s: missing required argument '%s' (%s)", t->name, p->name, p->help);
    return NULL;
}

/* ------------------------------------------------------------ permissions */

static const char *kind_name(unsigned kind) {
    return kind == AGENT_ALLOW_BASH ? "bash" : kind == AGENT_ALLOW_WRITE ? "write" : "edit";
}

bool tools_permit(tool_env *env, unsigned kind, const char *what, char **denied) {
    *denied = NULL;
    if (env->allow & kind) return true;
    char q[600];
    snprintf(q, sizeof(q), "allow %s: %s? [y]es / [n]o / [a]lways for %s", kind_name(kind), what, kind_name(kind));
    int a = link_ask(env->link, q, "yna");
    if (env->trace) trace_line(env->trace, "permission %s '%s': %c", kind_name(kind), what, a > 0 ? a : '-');
    if (a == 'y') return true;
    if (a == 'a') {
        env->allow |= kind;
        display_printf(env->d, OUT_INFO, "%s allowed for the rest of this run\n", kind_name(kind));
        return true;
    }
    if (a < 0)
        *denied = tool_error("%s needs the user's permission and no one can answer here: it was not run (the user can "
                             "start ds4-agent with --allow %s)",
                             kind_name(kind), kind_name(kind));
    else
        *denied = tool_error("the user declined this %s; do not retry it unchanged, ask or take another way",
                             kind_name(kind));
    return false;
}

/* ------------------------------------------------------------ dispatch */

int tools_init(tool_env *env, const agent_opts *o, agent_link *l, display *d, FILE *trace, ds4_err *err) {
    memset(env, 0, sizeof(*env));
    env->link = l;
    env->d = d;
    env->trace = trace;
    env->allow = o->allow;
    if (jail_init(&env->jail, o->root ? o->root : ".", err) != 0) return -1;
    if (!(env->jobs = jobs_new(err))) {
        jail_free(&env->jail);
        return -1;
    }
    return 0;
}

void tools_free(tool_env *env) {
    jobs_free(env->jobs);
    views_free(&env->views);
    jail_free(&env->jail);
    free(env->more_path);
    memset(env, 0, sizeof(*env));
}

char *tools_run(tool_env *env, const char *name, const json_t *args) {
    const tool_def *t = NULL;
    for (size_t i = 0; i < N_TOOLS; i++)
        if (!strcmp(TOOLS[i].name, name)) t = &TOOLS[i];
    char *r;
    if (!t) {
        ds4_strbuf names = {0};
        for (size_t i = 0; i < N_TOOLS; i++) ds4_strbuf_printf(&names, "%s%s", i ? ", " : "", TOOLS[i].name);
        r = tool_error("unknown tool '%.80s' (the tools are: %s)", name, names.p ? names.p : "");
        ds4_strbuf_free(&names);
    } else if (!(r = check_args(t, args))) {
        r = t->run(env, args);
    }
    if (!r) r = strdup("Tool error: out of memory");
    if (r && !strncmp(r, "Tool error: ", 12)) {
        size_t n = strcspn(r, "\n");
        display_newline(env->d);
        display_printf(env->d, OUT_ERROR, "✗ %.*s\n", (int)(n > 300 ? 300 : n), r + 12);
    }
    return r;
}

/* ------------------------------------------------------------ files */

bool looks_binary(const char *data, size_t len) {
    size_t n = len < 8192 ? len : 8192;
    return memchr(data, 0, n) != NULL;
}

void file_lines_free(file_lines *f) {
    free(f->data);
    free(f->line);
    free(f->len_of);
    memset(f, 0, sizeof(*f));
}

/* Split into lines; a final line without a newline counts. */
static int split_lines(file_lines *f, ds4_err *err) {
    int cap = 64, n = 0;
    f->line = malloc((size_t)cap * sizeof(*f->line));
    f->len_of = malloc((size_t)cap * sizeof(*f->len_of));
    if (!f->line || !f->len_of) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    size_t i = 0, crlf = 0;
    while (i < f->len) {
        const char *nl = memchr(f->data + i, '\n', f->len - i);
        size_t e = nl ? (size_t)(nl - f->data) : f->len;
        size_t l = e - i;
        if (nl && l && f->data[e - 1] == '\r') l--, crlf++;
        if (n == cap) {
            cap *= 2;
            const char **nli = realloc(f->line, (size_t)cap * sizeof(*nli));
            if (nli) f->line = nli;
            size_t *nle = realloc(f->len_of, (size_t)cap * sizeof(*nle));
            if (nle) f->len_of = nle;
            if (!nli || !nle) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        }
        f->line[n] = f->data + i;
        f->len_of[n] = l;
        n++;
        i = nl ? e + 1 : f->len;
    }
    f->n = n;
    f->final_newline = f->len > 0 && f->data[f->len - 1] == '\n';
    f->crlf = crlf > 0 && crlf * 2 >= (size_t)n;
    return 0;
}

int file_load(const char *path, file_lines *f, ds4_err *err) {
    memset(f, 0, sizeof(*f));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ds4_err_set(err, errno == ENOENT ? DS4_ENOTFOUND : DS4_EIO, "%s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return ds4_err_set(err, DS4_EINVAL,
                           S_ISDIR(st.st_mode) ? "it is a directory (use list)" : "not a regular file");
    }
    if ((uint64_t)st.st_size > TOOL_FILE_MAX) {
        close(fd);
        return ds4_err_set(err, DS4_ERANGE, "it is %lld bytes, more than the %u MiB the file tools handle",
                           (long long)st.st_size, TOOL_FILE_MAX >> 20);
    }
    f->data = malloc((size_t)st.st_size + 1);
    if (!f->data) {
        close(fd);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, f->data + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    f->len = got;
    f->data[got] = 0;
    if (looks_binary(f->data, f->len)) {
        int rc = ds4_err_set(err, DS4_EUNSUPPORTED, "it is a binary file (%zu bytes); the file tools handle text",
                             f->len);
        file_lines_free(f);
        return rc;
    }
    if (split_lines(f, err) != 0) {
        file_lines_free(f);
        return -1;
    }
    return 0;
}

/* Longest line shown by read; longer ones are cut and not editable by number. */
#define READ_LINE_MAX 2000

static void set_more(tool_env *env, const char *path, int next, bool raw) {
    free(env->more_path);
    env->more_path = path ? strdup(path) : NULL;
    env->more_next = next;
    env->more_raw = raw;
}

/* Lines [start, start + count) of a file, numbered (or raw). */
static char *read_range(tool_env *env, const char *path, long long start, long long count, bool whole, bool raw) {
    ds4_err err = {0};
    char *abs = jail_resolve(&env->jail, path, &err);
    if (!abs) return tool_error("read %s: %s", path, err.msg);
    file_lines f;
    if (file_load(abs, &f, &err) != 0) {
        char *e = tool_error("read %s: %s", path, err.msg);
        free(abs);
        return e;
    }
    const char *shown = jail_show(&env->jail, abs);
    if (start < 1) start = 1;
    if (start > f.n + 1LL) {
        char *e = tool_error("read %s: start_line %lld is past the end (the file has %d lines)", path, start, f.n);
        file_lines_free(&f);
        free(abs);
        return e;
    }
    int first = (int)start - 1;
    int last = whole ? f.n : (int)(first + count < f.n ? first + count : f.n); /* exclusive */
    ds4_strbuf b = {0};
    if (!raw) {
        ds4_strbuf_printf(&b, "%s: lines %d-%d of %d", shown, f.n ? first + 1 : 0, last, f.n);
        if (last < f.n)
            ds4_strbuf_printf(&b, "; continue_offset=%d (call more to read the next %lld lines)", last + 1, count);
        ds4_strbuf_puts(&b, "\n");
    }
    int cut = 0;
    for (int i = first; i < last; i++) {
        size_t l = f.len_of[i];
        bool long_line = l > READ_LINE_MAX;
        if (!raw) ds4_strbuf_printf(&b, "%d\t", i + 1);
        ds4_strbuf_append(&b, f.line[i], long_line && !raw ? READ_LINE_MAX : l);
        if (long_line && !raw) {
            ds4_strbuf_printf(&b, " [... line cut: %zu bytes; not editable by line number]", l);
            cut++;
        }
        ds4_strbuf_putc(&b, '\n');
    }
    if (raw && last < f.n)
        ds4_strbuf_printf(&b, "[read stopped at line %d of %d; continue_offset=%d: call more to go on]\n", last, f.n,
                          last + 1);
    if (!f.n) ds4_strbuf_puts(&b, raw ? "" : "(empty file)\n");
    /* whole=true must fit the context */
    if (whole && env->room) {
        uint32_t room = env->room(env->room_ctx, b.p ? b.p : "", b.len);
        if (room == 0) {
            char *e = tool_error("read %s whole: %d lines do not fit in the free context; read it in chunks with "
                                 "start_line/max_lines (or search for what you need)",
                                 path, f.n);
            ds4_strbuf_free(&b);
            file_lines_free(&f);
            free(abs);
            return e;
        }
    }
    if (!raw) {
        /* numbered lines can be edited by number: remember them (cut ones excepted) */
        for (int i = first; i < last; i++)
            if (f.len_of[i] <= READ_LINE_MAX) views_see(&env->views, abs, i + 1, 1, &f.line[i], &f.len_of[i]);
    }
    set_more(env, last < f.n ? abs : NULL, last + 1, raw);
    display_printf(env->d, OUT_RESULT, "  read %s: lines %d-%d of %d%s\n", shown, f.n ? first + 1 : 0, last, f.n,
                   cut ? " (long lines cut)" : "");
    file_lines_free(&f);
    free(abs);
    return tool_text(&b);
}

static char *tool_read(tool_env *env, const json_t *args) {
    long long start = 1, count = TOOL_READ_LINES;
    arg_int(args, "start_line", &start);
    if (arg_int(args, "max_lines", &count) && count < 1) return tool_error("read: max_lines must be at least 1");
    if (start < 1) return tool_error("read: start_line counts from 1");
    return read_range(env, arg_str(args, "path"), start, count, arg_bool(args, "whole", false),
                      arg_bool(args, "raw", false));
}

static char *tool_more(tool_env *env, const json_t *args) {
    long long count = TOOL_READ_LINES;
    if (arg_int(args, "count", &count) && count < 1) return tool_error("more: count must be at least 1");
    if (!env->more_path)
        return tool_error("more: nothing to continue (the last read reached the end of its file, or there was none)");
    char *path = strdup(env->more_path);
    if (!path) return NULL;
    char *r = read_range(env, path, env->more_next, count, false, env->more_raw);
    free(path);
    return r;
}

/* mkdir -p of the directories above an absolute path. */
static int make_parents(const char *abs) {
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", abs);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return 0;
}

static int write_file(const char *abs, const char *data, size_t n, ds4_err *err) {
    if (make_parents(abs) != 0) return ds4_err_set(err, DS4_EIO, "creating its directory: %s", strerror(errno));
    int fd = open(abs, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return ds4_err_set(err, DS4_EIO, "%s", strerror(errno));
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, data + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return ds4_err_set(err, DS4_EIO, "%s", strerror(e));
        }
        done += (size_t)w;
    }
    if (close(fd) != 0) return ds4_err_set(err, DS4_EIO, "%s", strerror(errno));
    return 0;
}

/* Remember every line of a text the model itself wrote. */
static void see_all(tool_env *env, const char *abs) {
    file_lines f;
    views_forget(&env->views, abs);
    if (file_load(abs, &f, NULL) != 0) return;
    views_see(&env->views, abs, 1, f.n, f.line, f.len_of);
    file_lines_free(&f);
}

static char *tool_write(tool_env *env, const json_t *args) {
    const char *path = arg_str(args, "path");
    const json_t *cv = json_object_get(args, "content");
    const char *content = json_string_value(cv);
    size_t n = json_string_length(cv);
    ds4_err err = {0};
    char *abs = jail_resolve(&env->jail, path, &err);
    if (!abs) return tool_error("write %s: %s", path, err.msg);
    struct stat st;
    bool existed = stat(abs, &st) == 0;
    if (existed && S_ISDIR(st.st_mode)) {
        free(abs);
        return tool_error("write %s: it is a directory", path);
    }
    char what[400], *denied;
    snprintf(what, sizeof(what), "%s %s (%zu bytes)", existed ? "overwrite" : "create", jail_show(&env->jail, abs), n);
    if (!tools_permit(env, AGENT_ALLOW_WRITE, what, &denied)) {
        free(abs);
        return denied;
    }
    if (write_file(abs, content, n, &err) != 0) {
        char *e = tool_error("write %s: %s", path, err.msg);
        free(abs);
        return e;
    }
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += content[i] == '\n';
    if (n && content[n - 1] != '\n') lines++;
    see_all(env, abs);
    ds4_strbuf b = {0};
    ds4_strbuf_printf(&b, "%s %s: %zu bytes, %zu lines\n", existed ? "Overwrote" : "Created",
                      jail_show(&env->jail, abs), n, lines);
    display_printf(env->d, OUT_RESULT, "  %s", b.p);
    free(abs);
    return tool_text(&b);
}

/* ------------------------------------------------------------ edit */

/* Numbered lines [a, b] of the new text for the result, remembered as seen. */
static void context_lines(tool_env *env, const char *abs, ds4_strbuf *b, int a, int z) {
    file_lines f;
    if (file_load(abs, &f, NULL) != 0) return;
    if (a < 1) a = 1;
    if (z > f.n) z = f.n;
    for (int i = a; i <= z; i++) {
        ds4_strbuf_printf(b, "%d\t%.*s\n", i, (int)f.len_of[i - 1], f.line[i - 1]);
        views_see(&env->views, abs, i, 1, &f.line[i - 1], &f.len_of[i - 1]);
    }
    file_lines_free(&f);
}

static int count_lines(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k + (n && s[n - 1] != '\n');
}

/* After an edit of lines [first, last] (old numbering) into n_new lines. */
static char *edit_result(tool_env *env, const char *abs, const char *how, int first, int last, int n_new) {
    file_lines f;
    ds4_err err = {0};
    if (file_load(abs, &f, &err) != 0)
        return tool_error("edit %s: reading it back: %s", jail_show(&env->jail, abs), err.msg);
    views_edited(&env->views, abs, first, last, n_new, f.line, f.len_of, f.n);
    int total = f.n;
    file_lines_free(&f);
    int delta = n_new - (last - first + 1);
    ds4_strbuf b = {0};
    ds4_strbuf_printf(&b, "Edited %s (%s): lines %d-%d replaced by %d line%s; the file has %d lines.\n",
                      jail_show(&env->jail, abs), how, first, last, n_new, n_new == 1 ? "" : "s", total);
    if (delta)
        ds4_strbuf_printf(&b,
                          "Lines after %d moved by %+d (old line %d is now %d): read them again before editing "
                          "them by number.\n",
                          last, delta, last + 1, last + 1 + delta);
    int z = first + (n_new > 0 ? n_new - 1 : 0);
    ds4_strbuf_puts(&b, "Post-edit context:\n");
    context_lines(env, abs, &b, first - 3, z + 3);
    return tool_text(&b);
}

/* "A:B", "A-B", "A" into a line range. */
static bool parse_range(const char *s, long long *a, long long *b) {
    char *end;
    errno = 0;
    *a = strtoll(s, &end, 10);
    if (end == s || errno) return false;
    if (!*end) return *b = *a, true;
    if (*end != ':' && *end != '-') return false;
    const char *p = end + 1;
    *b = strtoll(p, &end, 10);
    return end != p && !*end && !errno;
}

/* Replace lines [first, last] (1-based) of f by `text`; returns the new data. */
static char *splice_lines(const file_lines *f, int first, int last, const char *text, size_t tn, bool crlf,
                          size_t *out_len) {
    size_t start = first <= f->n ? (size_t)(f->line[first - 1] - f->data) : f->len;
    size_t end = last < f->n ? (size_t)(f->line[last] - f->data) : f->len;
    ds4_strbuf b = {0};
    ds4_strbuf_append(&b, f->data, start);
    for (size_t i = 0; i < tn; i++) {
        if (text[i] == '\n' && crlf && (i == 0 || text[i - 1] != '\r')) ds4_strbuf_putc(&b, '\r');
        ds4_strbuf_putc(&b, text[i]);
    }
    /* whole lines in, whole lines out: a replacement gets its newline unless
     * it replaces the file's last line, which had none */
    bool at_end = last >= f->n;
    if (tn && text[tn - 1] != '\n' && !(at_end && !f->final_newline)) ds4_strbuf_puts(&b, crlf ? "\r\n" : "\n");
    if (tn && text[tn - 1] == '\n' && at_end && !f->final_newline) {
        b.len -= 1 + (crlf && b.len > 1 && b.p[b.len - 2] == '\r');
    }
    ds4_strbuf_append(&b, f->data + end, f->len - end);
    if (b.failed) {
        ds4_strbuf_free(&b);
        return NULL;
    }
    return ds4_strbuf_take(&b, out_len);
}

static char *edit_write(tool_env *env, const char *abs, const char *path, const char *data, size_t n) {
    ds4_err err = {0};
    if (write_file(abs, data, n, &err) != 0) return tool_error("edit %s: writing: %s", path, err.msg);
    return NULL;
}

static char *edit_old_new(tool_env *env, const char *abs, const char *path, file_lines *f, const json_t *args) {
    const json_t *ov = json_object_get(args, "old"), *nv = json_object_get(args, "new");
    const char *old = json_string_value(ov), *nw = json_string_value(nv);
    size_t on = json_string_length(ov), nn = json_string_length(nv);
    if (!on) return tool_error("edit %s: old is empty; give the exact text to replace, or edit by line", path);
    size_t count = 0, at = 0;
    char lines[120] = "";
    for (const char *p = f->data; (p = memmem(p, f->len - (size_t)(p - f->data), old, on)); p += on) {
        if (!count) at = (size_t)(p - f->data);
        count++;
        size_t l = strlen(lines);
        if (l < sizeof(lines) - 16) {
            int ln = 1;
            for (const char *q = f->data; q < p; q++) ln += *q == '\n';
            snprintf(lines + l, sizeof(lines) - l, "%s%d", l ? ", " : "", ln);
        }
    }
    if (count == 0)
        return tool_error("edit %s: old text not found (it must match exactly, white space and line breaks "
                          "included); read the file again or edit by line",
                          path);
    if (count > 1)
        return tool_error("edit %s: old text occurs %zu times (at lines %s); include more of the surrounding text "
                          "so it occurs once, or edit by line",
                          path, count, lines);
    char what[400], *denied;
    snprintf(what, sizeof(what), "edit %s (replace %zu bytes with %zu)", jail_show(&env->jail, abs), on, nn);
    if (!tools_permit(env, AGENT_ALLOW_EDIT, what, &denied)) return denied;
    ds4_strbuf b = {0};
    ds4_strbuf_append(&b, f->data, at);
    ds4_strbuf_append(&b, nw, nn);
    ds4_strbuf_append(&b, f->data + at + on, f->len - at - on);
    if (b.failed) {
        ds4_strbuf_free(&b);
        return tool_error("edit %s: out of memory", path);
    }
    /* The whole lines the match touched, before and after: from the start
     * of the line holding its first byte to the end of the line holding
     * its last one. */
    int first = 1;
    for (size_t i = 0; i < at; i++) first += f->data[i] == '\n';
    size_t line_start = at;
    while (line_start && f->data[line_start - 1] != '\n') line_start--;
    const char *nl = memchr(f->data + at + on - 1, '\n', f->len - (at + on - 1));
    size_t old_end = nl ? (size_t)(nl - f->data) + 1 : f->len;
    size_t new_end = old_end + nn - on;
    int last = first + count_lines(f->data + line_start, old_end - line_start) - 1;
    int n_new = count_lines(b.p + line_start, new_end - line_start);
    char *e = edit_write(env, abs, path, b.p, b.len);
    ds4_strbuf_free(&b);
    if (e) return e;
    return edit_result(env, abs, "old/new", first, last, n_new);
}

static char *tool_edit(tool_env *env, const json_t *args) {
    const char *path = arg_str(args, "path");
    long long line = 0, a = 0, b = 0;
    bool has_line = json_object_get(args, "line") != NULL;
    bool has_se = json_object_get(args, "start_line") || json_object_get(args, "end_line");
    const char *range = arg_str(args, "range");
    bool has_old = json_object_get(args, "old") != NULL;
    int modes = has_line + has_se + (range != NULL) + has_old;
    if (modes == 0) return tool_error("edit %s: say what to replace: line, start_line/end_line, range, or old", path);
    if (modes > 1)
        return tool_error("edit %s: give only one of line, start_line/end_line, range, old (got %d of them)", path,
                          modes);
    ds4_err err = {0};
    char *abs = jail_resolve(&env->jail, path, &err);
    if (!abs) return tool_error("edit %s: %s", path, err.msg);
    const json_t *nv = json_object_get(args, "new");
    const char *nw = json_string_value(nv);
    size_t nn = json_string_length(nv);
    char *res = NULL;
    if (range && !strcmp(range, "all")) {
        /* an explicit whole-file rewrite: no earlier read needed */
        struct stat st;
        if (stat(abs, &st) != 0) res = tool_error("edit %s: %s (use write to create a file)", path, strerror(errno));
        char what[400], *denied = NULL;
        snprintf(what, sizeof(what), "rewrite all of %s (%zu bytes)", jail_show(&env->jail, abs), nn);
        if (!res && !tools_permit(env, AGENT_ALLOW_EDIT, what, &denied)) res = denied;
        if (!res && write_file(abs, nw, nn, &err) != 0) res = tool_error("edit %s: %s", path, err.msg);
        if (!res) {
            see_all(env, abs);
            ds4_strbuf r = {0};
            ds4_strbuf_printf(&r, "Rewrote %s: %zu bytes, %d lines.\n", jail_show(&env->jail, abs), nn,
                              count_lines(nw, nn));
            display_printf(env->d, OUT_RESULT, "  %s", r.p);
            res = tool_text(&r);
        }
        free(abs);
        return res;
    }
    file_lines f;
    if (file_load(abs, &f, &err) != 0) {
        res = tool_error("edit %s: %s%s", path, err.msg,
                         err.code == DS4_ENOTFOUND ? " (use write to create a file)" : "");
        free(abs);
        return res;
    }
    if (has_old) {
        res = edit_old_new(env, abs, path, &f, args);
        file_lines_free(&f);
        free(abs);
        return res;
    }
    if (has_line) {
        arg_int(args, "line", &line);
        a = b = line;
    } else if (has_se) {
        if (!arg_int(args, "start_line", &a)) res = tool_error("edit %s: end_line needs start_line", path);
        if (!arg_int(args, "end_line", &b)) b = a;
    } else if (!parse_range(range, &a, &b)) {
        res = tool_error("edit %s: range \"%.40s\" is not \"A:B\", \"A\" or \"all\"", path, range);
    }
    if (!res && (a < 1 || b < a))
        res = tool_error("edit %s: lines %lld-%lld are not a range of lines counted from 1", path, a, b);
    if (!res && b > f.n) res = tool_error("edit %s: line %lld does not exist, the file has %d lines", path, b, f.n);
    char msg[300];
    if (!res && !views_check(&env->views, abs, (int)a, (int)b, f.line, f.len_of, f.n, msg, sizeof(msg)))
        res = tool_error("edit %s: %s", path, msg);
    char what[400], *denied = NULL;
    snprintf(what, sizeof(what), "edit %s lines %lld-%lld", jail_show(&env->jail, abs), a, b);
    if (!res && !tools_permit(env, AGENT_ALLOW_EDIT, what, &denied)) res = denied;
    if (!res) {
        /* show what goes away (the new lines were shown as they streamed) */
        size_t s0 = (size_t)(f.line[a - 1] - f.data), s1 = (size_t)(f.line[b - 1] - f.data) + f.len_of[b - 1];
        display_diff(env->d, f.data + s0, s1 - s0, NULL, 0, (int)a);
        size_t out_len;
        char *data = splice_lines(&f, (int)a, (int)b, nw, nn, f.crlf, &out_len);
        if (!data) res = tool_error("edit %s: out of memory", path);
        else {
            res = edit_write(env, abs, path, data, out_len);
            free(data);
        }
        if (!res) res = edit_result(env, abs, nn ? "lines" : "deleted", (int)a, (int)b, count_lines(nw, nn));
    }
    file_lines_free(&f);
    free(abs);
    return res;
}

/* ------------------------------------------------------------ list */

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

#define LIST_MAX 500

static char *tool_list(tool_env *env, const json_t *args) {
    const char *path = arg_str(args, "path");
    if (!path || !*path) path = ".";
    ds4_err err = {0};
    char *abs = jail_resolve(&env->jail, path, &err);
    if (!abs) return tool_error("list %s: %s", path, err.msg);
    DIR *dir = opendir(abs);
    if (!dir) {
        char *e = tool_error("list %s: %s", path, strerror(errno));
        free(abs);
        return e;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
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
    ds4_strbuf b = {0};
    ds4_strbuf_printf(&b, "%s: %zu entries\n", jail_show(&env->jail, abs), n);
    for (size_t i = 0; i < n; i++) {
        if (i < LIST_MAX) {
            char full[PATH_MAX];
            snprintf(full, sizeof(full), "%s/%s", abs, names[i]);
            struct stat st;
            if (lstat(full, &st) != 0) {
                ds4_strbuf_printf(&b, "? %s\n", names[i]);
            } else if (S_ISLNK(st.st_mode)) {
                char target[PATH_MAX];
                ssize_t t = readlink(full, target, sizeof(target) - 1);
                target[t > 0 ? t : 0] = 0;
                ds4_strbuf_printf(&b, "l %s -> %s\n", names[i], target);
            } else if (S_ISDIR(st.st_mode)) {
                ds4_strbuf_printf(&b, "d %s/\n", names[i]);
            } else {
                ds4_strbuf_printf(&b, "- %s %lld\n", names[i], (long long)st.st_size);
            }
        }
        free(names[i]);
    }
    if (n > LIST_MAX)
        ds4_strbuf_printf(&b, "... and %zu more entries (list a subdirectory, or search)\n", n - LIST_MAX);
    free(names);
    display_printf(env->d, OUT_RESULT, "  list %s: %zu entries\n", jail_show(&env->jail, abs), n);
    free(abs);
    return tool_text(&b);
}
