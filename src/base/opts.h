/*
 * opts.h - a program's command line from one table.
 *
 * Every option of a program is one row of a ds4_opt table: its spellings,
 * the kind of value it takes, the accepted range, the default and the help
 * text.  The rows drive everything else: the defaults are written from
 * them, the parser finds options and checks values by them, range errors
 * are worded from them and --help is printed from them, so an option is
 * described exactly once.  (The model is Redis's config table, where one
 * row per setting drives parsing, bounds, defaults and documentation.)
 * Nothing here knows about models; the rows the ds4 programs share (model,
 * context, threads, backend, sampling) are in engine/cli.h.
 *
 * The conventions of every ds4 program, implemented here once:
 *   - a row lists its spellings separated by ", " ("-c, --ctx"); single-dash
 *     long names are ordinary spellings ("-sys", ds4's system prompt);
 *   - a value is the next argument ("--ctx 4096", "-c 4096") or, after a
 *     "--" spelling, follows '=' ("--ctx=4096"); it may start with '-', so
 *     "--top-k -1" is a range error rather than a missing value;
 *   - numbers are whole decimal arguments inside the row's range
 *     (base/numparse.h): "4k", " 5" and "1e3" are refused;
 *   - a row whose name does not start with '-' is a positional argument
 *     ("MODEL"); positionals fill their rows in table order and may be mixed
 *     with options; after "--" every argument is positional, and "-" alone
 *     is one (standard input, where a program reads it);
 *   - when an option is given twice the last one counts (CALL rows see each);
 *   - rows marked DS4_OPT_IN / DS4_OPT_OUT name files: they are checked when
 *     parsing ends, before the program loads anything (base/paths.h);
 *   - -h, --help prints the help on stdout and the program exits 0;
 *   - anything wrong prints "PROG: what (see PROG --help)" on stderr and the
 *     program exits 2; ds4_cli_usage() gives the checks a program makes
 *     after parsing (combinations of options) the same form.
 *
 * A new program (ds4-agent, say) declares its options and parses them so:
 *
 *     typedef struct agent_opts {
 *         const char *model;
 *         uint32_t ctx;
 *         bool verbose;
 *     } agent_opts;
 *
 *     int main(int argc, char **argv) {
 *         agent_opts o;
 *         ds4_opt table[] = {
 *             DS4_CLI_MODEL(&o.model),          // shared rows (engine/cli.h)
 *             DS4_CLI_CTX(&o.ctx),
 *             {DS4_OPT_FLAG("-v, --verbose", &o.verbose, "say more")},
 *             {0},
 *         };
 *         ds4_cli cli = {.prog = "ds4-agent", .usage = "[options]",
 *                        .about = "What it does, in a sentence or two.", .opts = table};
 *         int status;
 *         if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
 *         if (<a combination that cannot work>) return ds4_cli_usage(&cli, "--x needs --y");
 *         ...
 *     }
 *
 * The DS4_OPT_* row macros give a row's required fields; optional ones
 * (.def_text, .seen, .flags) follow the macro inside the row's braces:
 * {DS4_OPT_U32(...), .seen = &o.ctx_given}.  The table is built where it is
 * parsed, with pointers into the program's own options struct: no globals.
 */
#ifndef DS4_BASE_OPTS_H
#define DS4_BASE_OPTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

typedef enum ds4_opt_kind {
    DS4_OPT_KIND_END = 0, /* the zero row that ends a table */
    DS4_OPT_KIND_SECTION, /* a heading in --help (names: its title) */
    DS4_OPT_KIND_FLAG,    /* bool: true when given */
    DS4_OPT_KIND_SET,     /* int: set to .set (several rows, one field: --think, --nothink) */
    DS4_OPT_KIND_SETSTR,  /* const char *: set to .str (--cpu, --cuda) */
    DS4_OPT_KIND_STR,     /* const char *: the argument itself */
    DS4_OPT_KIND_CHOICE,  /* const char *: one of .choices ("a|b|c") */
    DS4_OPT_KIND_INT,     /* int in [lo, hi] */
    DS4_OPT_KIND_U32,     /* uint32_t in [lo, hi] */
    DS4_OPT_KIND_U64,     /* uint64_t in [lo, hi] */
    DS4_OPT_KIND_FLOAT,   /* float in [flo, fhi] */
    DS4_OPT_KIND_CALL,    /* .fn(.ctx, value, err) each time it is given */
} ds4_opt_kind;

/* Row flags. */
#define DS4_OPT_REQUIRED 0x01u /* must be given */
#define DS4_OPT_HIDDEN   0x02u /* accepted, not listed by --help (test hooks) */
#define DS4_OPT_CLAMP    0x04u /* an integer above hi is taken as hi */
#define DS4_OPT_DEFAULT  0x08u /* SET, SETSTR: this row's value is the default */
#define DS4_OPT_IN       0x10u /* a file to read: must exist and be readable */
#define DS4_OPT_OUT      0x20u /* a file to write: its directory must exist and be writable */
#define DS4_OPT_MANY     0x40u /* positional CALL row: takes every remaining positional */

typedef struct ds4_opt {
    ds4_opt_kind kind;
    const char *names; /* "-c, --ctx"; "MODEL" for a positional */
    const char *arg;   /* the value in --help ("N", "FILE"); NULL: takes none */
    void *dst;
    const char *help;
    uint64_t lo, hi, def;                                  /* INT, U32, U64 */
    double flo, fhi, fdef;                                 /* FLOAT; fhi HUGE_VAL: no upper bound */
    const char *str;                                       /* STR, CHOICE: the default; SETSTR: the value set */
    const char *choices;                                   /* CHOICE: the accepted values, '|' between them */
    int set;                                               /* SET: the value set */
    int (*fn)(void *ctx, const char *value, ds4_err *err); /* CALL: -1 and a reason to refuse */
    void *ctx;
    /* Optional, after the row macro: */
    const char *def_text; /* the default in words, where it is computed or automatic */
    bool *seen;           /* set to whether the option was given */
    unsigned flags;       /* DS4_OPT_* above */
} ds4_opt;

/* Row macros: the fields of one row, to be written inside braces. */
#define DS4_OPT_SECTION(title)            .kind = DS4_OPT_KIND_SECTION, .names = (title)
#define DS4_OPT_FLAG(names_, dst_, help_) .kind = DS4_OPT_KIND_FLAG, .names = (names_), .dst = (dst_), .help = (help_)
/* clang-format off */
#define DS4_OPT_SET(names_, dst_, value, help_) \
    .kind = DS4_OPT_KIND_SET, .names = (names_), .dst = (dst_), .set = (value), .help = (help_)
#define DS4_OPT_SETSTR(names_, dst_, value, help_) \
    .kind = DS4_OPT_KIND_SETSTR, .names = (names_), .dst = (dst_), .str = (value), .help = (help_)
#define DS4_OPT_STR(names_, arg_, dst_, def_, help_) \
    .kind = DS4_OPT_KIND_STR, .names = (names_), .arg = (arg_), .dst = (dst_), .str = (def_), .help = (help_)
#define DS4_OPT_CHOICE(names_, arg_, dst_, choices_, def_, help_)                                       \
    .kind = DS4_OPT_KIND_CHOICE, .names = (names_), .arg = (arg_), .dst = (dst_), .choices = (choices_), \
    .str = (def_), .help = (help_)
#define DS4_OPT_INT(names_, arg_, dst_, lo_, hi_, def_, help_)                                               \
    .kind = DS4_OPT_KIND_INT, .names = (names_), .arg = (arg_), .dst = (dst_), .lo = (lo_), .hi = (hi_), \
    .def = (def_), .help = (help_)
#define DS4_OPT_U32(names_, arg_, dst_, lo_, hi_, def_, help_)                                               \
    .kind = DS4_OPT_KIND_U32, .names = (names_), .arg = (arg_), .dst = (dst_), .lo = (lo_), .hi = (hi_), \
    .def = (def_), .help = (help_)
#define DS4_OPT_U64(names_, arg_, dst_, lo_, hi_, def_, help_)                                               \
    .kind = DS4_OPT_KIND_U64, .names = (names_), .arg = (arg_), .dst = (dst_), .lo = (lo_), .hi = (hi_), \
    .def = (def_), .help = (help_)
#define DS4_OPT_FLOAT(names_, arg_, dst_, lo_, hi_, def_, help_)                                                 \
    .kind = DS4_OPT_KIND_FLOAT, .names = (names_), .arg = (arg_), .dst = (dst_), .flo = (lo_), .fhi = (hi_), \
    .fdef = (def_), .help = (help_)
#define DS4_OPT_CALL(names_, arg_, fn_, ctx_, help_) \
    .kind = DS4_OPT_KIND_CALL, .names = (names_), .arg = (arg_), .fn = (fn_), .ctx = (ctx_), .help = (help_)
/* clang-format on */

/* A program's command line. */
typedef struct ds4_cli {
    const char *prog;  /* "ds4-bench" */
    const char *usage; /* synopsis after the program name; '\n' between alternatives */
    const char *about; /* what the program does (pre-wrapped text) */
    ds4_opt *opts;     /* the table, ended by a zero row */
    const char *notes; /* after the options: environment, exit status (pre-wrapped) */
    const char *stray; /* added to "unexpected argument" (a hint), or NULL */
    /* Why a spelling this program does not have is refused (options of
     * the original ds4 not implemented here), or NULL: "unknown option". */
    const char *(*refused)(const char *name);
} ds4_cli;

/* Write every row's default, then parse argv[1..argc).  0: parsed; 1:
 * --help was asked (nothing else is checked); -1: a usage error, described
 * in err ("-c 0: must be an integer in 1..1048576"). */
int ds4_opts_parse(const ds4_cli *cli, int argc, char **argv, ds4_err *err);

/* The help text: synopsis, about, every visible row with its range and
 * default, -h, the notes. */
void ds4_opts_help(const ds4_cli *cli, FILE *f);

/* ds4_opts_parse with the conventions applied: true to run the program;
 * false when it should exit now with *status (0 after printing the help
 * on stdout, 2 after printing the usage error on stderr). */
bool ds4_cli_parse(const ds4_cli *cli, int argc, char **argv, int *status);

/* "PROG: <message> (see PROG --help)" on stderr; returns 2, the status of
 * a usage error. */
int ds4_cli_usage(const ds4_cli *cli, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
