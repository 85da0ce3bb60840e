/*
 * opts.c - command lines from option tables (see opts.h).
 */
#include "base/opts.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/numparse.h"
#include "base/paths.h"

#define HELP_COL   27 /* where help text starts */
#define HELP_WIDTH 96 /* where it wraps */

static bool is_positional(const ds4_opt *r) {
    return r->kind != DS4_OPT_KIND_SECTION && r->names && r->names[0] != '-';
}

static bool takes_value(const ds4_opt *r) {
    switch (r->kind) {
    case DS4_OPT_KIND_FLAG:
    case DS4_OPT_KIND_SET:
    case DS4_OPT_KIND_SETSTR: return false;
    case DS4_OPT_KIND_CALL: return r->arg != NULL;
    default: return true;
    }
}

/* Whether `name` is one of the row's spellings ("-c, --ctx"). */
static bool has_spelling(const ds4_opt *r, const char *name, size_t len) {
    if (r->kind == DS4_OPT_KIND_SECTION || is_positional(r)) return false;
    for (const char *p = r->names; *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && memcmp(p, name, len) == 0) return true;
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    return false;
}

static ds4_opt *find(const ds4_cli *cli, const char *name, size_t len) {
    for (ds4_opt *r = cli->opts; r->kind != DS4_OPT_KIND_END; r++)
        if (has_spelling(r, name, len)) return r;
    return NULL;
}

static uint64_t type_max(ds4_opt_kind k) {
    return k == DS4_OPT_KIND_INT ? (uint64_t)INT_MAX : k == DS4_OPT_KIND_U32 ? UINT32_MAX : UINT64_MAX;
}

static bool is_integer(ds4_opt_kind k) {
    return k == DS4_OPT_KIND_INT || k == DS4_OPT_KIND_U32 || k == DS4_OPT_KIND_U64;
}

static void store_integer(const ds4_opt *r, uint64_t v) {
    if (r->kind == DS4_OPT_KIND_INT) *(int *)r->dst = (int)v;
    else if (r->kind == DS4_OPT_KIND_U32) *(uint32_t *)r->dst = (uint32_t)v;
    else *(uint64_t *)r->dst = v;
}

static void apply_default(const ds4_opt *r) {
    if (r->seen) *r->seen = false;
    if (!r->dst) return;
    switch (r->kind) {
    case DS4_OPT_KIND_FLAG: *(bool *)r->dst = false; break;
    case DS4_OPT_KIND_SET:
        if (r->flags & DS4_OPT_DEFAULT) *(int *)r->dst = r->set;
        break;
    case DS4_OPT_KIND_SETSTR:
        if (r->flags & DS4_OPT_DEFAULT) *(const char **)r->dst = r->str;
        break;
    case DS4_OPT_KIND_STR:
    case DS4_OPT_KIND_CHOICE: *(const char **)r->dst = r->str; break;
    case DS4_OPT_KIND_INT:
    case DS4_OPT_KIND_U32:
    case DS4_OPT_KIND_U64: store_integer(r, r->def); break;
    case DS4_OPT_KIND_FLOAT: *(float *)r->dst = (float)r->fdef; break;
    default: break;
    }
}

/* The accepted range in words, for errors ("an integer in 1..4096") and
 * help ("1..4096"). */
static void range_words(const ds4_opt *r, bool for_error, char *buf, size_t len) {
    buf[0] = 0;
    if (is_integer(r->kind)) {
        unsigned long long lo = r->lo, hi = r->hi;
        bool bounded = hi < type_max(r->kind) && !(r->flags & DS4_OPT_CLAMP);
        if (for_error && bounded) snprintf(buf, len, "an integer in %llu..%llu", lo, hi);
        else if (for_error && lo == 1) snprintf(buf, len, "a positive integer");
        else if (for_error) snprintf(buf, len, "an integer >= %llu", lo);
        else if (r->flags & DS4_OPT_CLAMP) snprintf(buf, len, ">= %llu, capped at %llu", lo, hi);
        else if (bounded) snprintf(buf, len, "%llu..%llu", lo, hi);
        else if (lo > 0) snprintf(buf, len, ">= %llu", lo);
    } else if (r->kind == DS4_OPT_KIND_FLOAT) {
        if (isinf(r->fhi)) snprintf(buf, len, "%s>= %g", for_error ? "a number " : "", r->flo);
        else snprintf(buf, len, "%s%g..%g", for_error ? "a number in " : "", r->flo, r->fhi);
    } else if (r->kind == DS4_OPT_KIND_CHOICE) {
        /* "a|b|c" -> "a, b or c" */
        size_t o = 0, n = strlen(r->choices);
        const char *last = strrchr(r->choices, '|');
        o += (size_t)snprintf(buf, len, "%s", for_error ? "one of " : "");
        for (size_t i = 0; i < n && o + 5 < len; i++) {
            if (r->choices[i] != '|') {
                buf[o++] = r->choices[i];
            } else if (r->choices + i == last) {
                memcpy(buf + o, " or ", 4);
                o += 4;
            } else {
                memcpy(buf + o, ", ", 2);
                o += 2;
            }
        }
        buf[o] = 0;
    }
}

static bool choice_ok(const char *choices, const char *v) {
    size_t vn = strlen(v);
    for (const char *p = choices; *p;) {
        size_t n = strcspn(p, "|");
        if (n == vn && memcmp(p, v, n) == 0) return true;
        p += n + (p[n] == '|');
    }
    return false;
}

/* Store one occurrence.  `name` is the spelling as given (for messages). */
static int apply(const ds4_opt *r, const char *name, const char *v, ds4_err *err) {
    char words[160];
    uint64_t u;
    float f;
    switch (r->kind) {
    case DS4_OPT_KIND_FLAG: *(bool *)r->dst = true; break;
    case DS4_OPT_KIND_SET: *(int *)r->dst = r->set; break;
    case DS4_OPT_KIND_SETSTR: *(const char **)r->dst = r->str; break;
    case DS4_OPT_KIND_STR: *(const char **)r->dst = v; break;
    case DS4_OPT_KIND_CHOICE:
        if (!choice_ok(r->choices, v)) {
            range_words(r, true, words, sizeof(words));
            return ds4_err_set(err, DS4_EINVAL, "%s %s: must be %s", name, v, words);
        }
        *(const char **)r->dst = v;
        break;
    case DS4_OPT_KIND_INT:
    case DS4_OPT_KIND_U32:
    case DS4_OPT_KIND_U64:
        if (ds4_parse_u64(v, r->lo, r->flags & DS4_OPT_CLAMP ? type_max(r->kind) : r->hi, &u) != 0) {
            range_words(r, true, words, sizeof(words));
            return ds4_err_set(err, DS4_EINVAL, "%s %s: must be %s", name, v, words);
        }
        store_integer(r, u > r->hi ? r->hi : u);
        break;
    case DS4_OPT_KIND_FLOAT:
        if (ds4_parse_float(v, (float)r->flo, (float)r->fhi, &f) != 0) {
            range_words(r, true, words, sizeof(words));
            return ds4_err_set(err, DS4_EINVAL, "%s %s: must be %s", name, v, words);
        }
        *(float *)r->dst = f;
        break;
    case DS4_OPT_KIND_CALL:
        if (r->fn(r->ctx, v, err) != 0) return ds4_err_prefix(err, v ? "%s %s" : "%s", name, v);
        break;
    default: break;
    }
    if (r->seen) *r->seen = true;
    return 0;
}

/* The next positional row at or after *next. */
static ds4_opt *next_positional(const ds4_cli *cli, size_t *next) {
    for (ds4_opt *r = cli->opts + *next; r->kind != DS4_OPT_KIND_END; r++)
        if (is_positional(r)) {
            *next = (size_t)(r - cli->opts);
            return r;
        }
    return NULL;
}

/* How messages name a row: its long spelling ("--hf"), or a positional's
 * name ("MODEL"); with_arg adds the value ("--hf DIR"). */
static void display_name(const ds4_opt *r, bool with_arg, char *buf, size_t len) {
    if (is_positional(r)) {
        snprintf(buf, len, "%s", r->names);
        return;
    }
    const char *l = strstr(r->names, "--");
    const char *n = l ? l : r->names;
    int nl = (int)strcspn(n, ",");
    bool arg = with_arg && r->arg;
    snprintf(buf, len, "%.*s%s%s", nl, n, arg ? " " : "", arg ? r->arg : "");
}

/* Files the command line names, checked before the program does anything. */
static int check_files(const ds4_cli *cli, const bool *given, ds4_err *err) {
    for (const ds4_opt *r = cli->opts; r->kind != DS4_OPT_KIND_END; r++) {
        size_t i = (size_t)(r - cli->opts);
        if (!(r->flags & (DS4_OPT_IN | DS4_OPT_OUT)) || !given[i] || r->kind != DS4_OPT_KIND_STR) continue;
        const char *path = *(const char **)r->dst;
        if (!path || !strcmp(path, "-")) continue;
        int rc = r->flags & DS4_OPT_IN ? ds4_path_check_readable(path, err) : ds4_path_check_writable(path, err);
        if (rc != 0) {
            char name[64];
            display_name(r, false, name, sizeof(name));
            return ds4_err_prefix(err, "%s", name);
        }
    }
    return 0;
}

static int parse_args(const ds4_cli *cli, int argc, char **argv, bool *given, ds4_err *err) {
    size_t next_pos = 0;
    bool only_positional = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!only_positional && !strcmp(a, "--")) {
            only_positional = true;
            continue;
        }
        if (only_positional || a[0] != '-' || a[1] == 0) {
            ds4_opt *r = next_positional(cli, &next_pos);
            if (!r)
                return ds4_err_set(err, DS4_EINVAL, "%s: unexpected argument%s%s", a, cli->stray ? " " : "",
                                   cli->stray ? cli->stray : "");
            if (apply(r, r->names, a, err) != 0) return -1;
            given[next_pos] = true;
            if (!(r->flags & DS4_OPT_MANY)) next_pos++;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        /* "--name=value" */
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        char name[128];
        snprintf(name, sizeof(name), "%.*s", (int)len, a);
        ds4_opt *r = find(cli, a, len);
        if (!r) {
            const char *why = cli->refused ? cli->refused(name) : NULL;
            return ds4_err_set(err, DS4_EINVAL, "%s: %s", name, why ? why : "unknown option");
        }
        const char *v = eq ? eq + 1 : NULL;
        if (takes_value(r) && !v) {
            if (i + 1 >= argc) return ds4_err_set(err, DS4_EINVAL, "%s: needs a value (%s)", name, r->arg);
            v = argv[++i];
        } else if (!takes_value(r) && v) {
            return ds4_err_set(err, DS4_EINVAL, "%s: takes no value", name);
        }
        if (apply(r, name, v, err) != 0) return -1;
        given[r - cli->opts] = true;
    }
    for (const ds4_opt *r = cli->opts; r->kind != DS4_OPT_KIND_END; r++) {
        if (!(r->flags & DS4_OPT_REQUIRED) || given[r - cli->opts]) continue;
        char name[64];
        display_name(r, true, name, sizeof(name));
        return ds4_err_set(err, DS4_EINVAL, "%s is required", name);
    }
    return check_files(cli, given, err);
}

int ds4_opts_parse(const ds4_cli *cli, int argc, char **argv, ds4_err *err) {
    size_t n = 0;
    while (cli->opts[n].kind != DS4_OPT_KIND_END) n++;
    for (size_t i = 0; i < n; i++) apply_default(&cli->opts[i]);
    bool *given = calloc(n + 1, sizeof(bool));
    if (!given) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = parse_args(cli, argc, argv, given, err);
    free(given);
    return rc;
}

/* ------------------------------------------------------------ help */

/* Words of `text` from column `col` on, wrapped at HELP_WIDTH, later lines
 * indented to HELP_COL. */
static void wrap(FILE *f, const char *text, int col) {
    const char *p = text;
    while (*p) {
        size_t word = strcspn(p, " \n");
        if (col > HELP_COL && col + 1 + (int)word > HELP_WIDTH) {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
        } else if (col > HELP_COL) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, word, f);
        col += (int)word;
        p += word;
        if (*p == '\n') {
            fprintf(f, "\n%*s", HELP_COL, "");
            col = HELP_COL;
        }
        while (*p == ' ' || *p == '\n') p++;
    }
    fputc('\n', f);
}

/* "(1..4096; default 2048)" or "" for a row that has neither. */
static void range_and_default(const ds4_opt *r, char *buf, size_t len) {
    char range[160], def[160] = "";
    range_words(r, false, range, sizeof(range));
    if (r->def_text) snprintf(def, sizeof(def), "default %s", r->def_text);
    else if (r->flags & DS4_OPT_REQUIRED) snprintf(def, sizeof(def), "required");
    else if (is_integer(r->kind)) snprintf(def, sizeof(def), "default %llu", (unsigned long long)r->def);
    else if (r->kind == DS4_OPT_KIND_FLOAT) snprintf(def, sizeof(def), "default %g", r->fdef);
    else if ((r->kind == DS4_OPT_KIND_STR || r->kind == DS4_OPT_KIND_CHOICE) && r->str)
        snprintf(def, sizeof(def), strpbrk(r->str, " ") || !*r->str ? "default \"%s\"" : "default %s", r->str);
    else if ((r->kind == DS4_OPT_KIND_SET || r->kind == DS4_OPT_KIND_SETSTR) && (r->flags & DS4_OPT_DEFAULT))
        snprintf(def, sizeof(def), "the default");
    if (range[0] && def[0]) snprintf(buf, len, "(%s; %s)", range, def);
    else if (range[0] || def[0]) snprintf(buf, len, "(%s)", range[0] ? range : def);
    else buf[0] = 0;
}

static void help_row(FILE *f, const char *left, const char *help, const char *extra) {
    int col = fprintf(f, "  %s", left);
    if (col > HELP_COL - 2) { /* at least two blanks between the two columns */
        fprintf(f, "\n%*s", HELP_COL, "");
    } else {
        fprintf(f, "%*s", HELP_COL - col, "");
    }
    char text[1024];
    snprintf(text, sizeof(text), "%s%s%s", help ? help : "", help && *help && *extra ? " " : "", extra);
    wrap(f, text, HELP_COL);
}

/* Whether the section starting after r holds only positionals (-h is
 * listed before such a section, with the other options). */
static bool positional_section(const ds4_opt *r) {
    bool any = false;
    for (r++; r->kind != DS4_OPT_KIND_END && r->kind != DS4_OPT_KIND_SECTION; r++) {
        if (!is_positional(r)) return false;
        any = true;
    }
    return any;
}

void ds4_opts_help(const ds4_cli *cli, FILE *f) {
    const char *u = cli->usage ? cli->usage : "[options]";
    for (bool first = true; *u; first = false) {
        size_t n = strcspn(u, "\n");
        fprintf(f, "%s %s %.*s\n", first ? "usage:" : "      ", cli->prog, (int)n, u);
        u += n + (u[n] == '\n');
    }
    if (cli->about) fprintf(f, "\n%s\n", cli->about);
    if (cli->opts[0].kind != DS4_OPT_KIND_SECTION) fputs("\noptions:\n", f);
    bool help_listed = false;
    for (const ds4_opt *r = cli->opts; r->kind != DS4_OPT_KIND_END; r++) {
        if (r->kind == DS4_OPT_KIND_SECTION) {
            if (!help_listed && positional_section(r)) {
                if (r == cli->opts) fputs("\noptions:\n", f);
                help_row(f, "-h, --help", "print this help and exit", "");
                help_listed = true;
            }
            fprintf(f, "\n%s\n", r->names);
            continue;
        }
        if (r->flags & DS4_OPT_HIDDEN) continue;
        char left[128], extra[400];
        if (is_positional(r)) snprintf(left, sizeof(left), "%s", r->names);
        else snprintf(left, sizeof(left), "%s%s%s", r->names, r->arg ? " " : "", r->arg ? r->arg : "");
        range_and_default(r, extra, sizeof(extra));
        help_row(f, left, r->help, extra);
    }
    if (!help_listed) help_row(f, "-h, --help", "print this help and exit", "");
    if (cli->notes) fprintf(f, "\n%s\n", cli->notes);
}

bool ds4_cli_parse(const ds4_cli *cli, int argc, char **argv, int *status) {
    ds4_err err = {0};
    int rc = ds4_opts_parse(cli, argc, argv, &err);
    if (rc == 0) return true;
    if (rc == 1) {
        ds4_opts_help(cli, stdout);
        *status = 0;
    } else {
        *status = ds4_cli_usage(cli, "%s", err.msg);
    }
    return false;
}

int ds4_cli_usage(const ds4_cli *cli, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s (see %s --help)\n", cli->prog, msg, cli->prog);
    return 2;
}
