/*
 * test_opts.c - the option tables of base/opts.h: defaults written from the
 * rows, every spelling convention ("--name value", "--name=value", "-x v",
 * single-dash long names, positionals mixed with options, "--"), range
 * errors worded exactly, clamping, choices, required rows, file checks
 * before any work, and the --help text generated from the same rows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/opts.h"

typedef struct topts {
    const char *model, *system, *preset, *out, *in, *first, *second;
    uint32_t ctx;
    uint64_t seed;
    int threads, top_k, mode;
    float temp;
    bool quiet, ctx_given;
    const char *backend;
    int calls;
    char called_with[64];
} topts;

static int count_call(void *ctx, const char *v, ds4_err *err) {
    topts *o = ctx;
    if (v && !strcmp(v, "bad")) return ds4_err_set(err, DS4_EINVAL, "not this one");
    o->calls++;
    snprintf(o->called_with, sizeof(o->called_with), "%s", v ? v : "(none)");
    return 0;
}

static const char *refused(const char *name) { return !strcmp(name, "--mtp") ? "not implemented here" : NULL; }

/* The table every test parses with: one row of each kind. */
/* clang-format off */
#define TABLE(o)                                                                                              \
    ds4_opt table[] = {                                                                                       \
        {DS4_OPT_SECTION("model:")},                                                                          \
        {DS4_OPT_STR("-m, --model", "FILE", &(o).model, "ds4flash.gguf", "the model")},                       \
        {DS4_OPT_STR("-sys, --system", "TEXT", &(o).system, "be helpful", "system prompt")},                  \
        {DS4_OPT_U32("-c, --ctx", "N", &(o).ctx, 1, 1048576, 32768, "context size"), .seen = &(o).ctx_given}, \
        {DS4_OPT_U64("--seed", "N", &(o).seed, 1, UINT64_MAX, 0, "seed"), .def_text = "from the time"},      \
        {DS4_OPT_INT("-t, --threads", "N", &(o).threads, 1, 4096, 0, "threads"), .def_text = "all CPUs"},     \
        {DS4_OPT_INT("--top-k", "N", &(o).top_k, 0, 1024, 0, "top-k"), .flags = DS4_OPT_CLAMP},               \
        {DS4_OPT_FLOAT("--temp", "F", &(o).temp, 0.0, 100.0, 1.0, "temperature")},                            \
        {DS4_OPT_FLOAT("--step", "F", &(o).temp, 1.0, HUGE_VAL, 1.0, "step"), .flags = DS4_OPT_HIDDEN},       \
        {DS4_OPT_CHOICE("--preset", "NAME", &(o).preset, "tiny|small|flash", "tiny", "shape")},               \
        {DS4_OPT_FLAG("-q, --quiet", &(o).quiet, "no progress")},                                             \
        {DS4_OPT_SET("--think", &(o).mode, 1, "think"), .flags = DS4_OPT_DEFAULT},                           \
        {DS4_OPT_SET("--nothink", &(o).mode, 0, "do not think")},                                             \
        {DS4_OPT_SETSTR("--cpu", &(o).backend, "cpu", "cpu")},                                                \
        {DS4_OPT_CALL("--set", "K=V", count_call, &(o), "repeatable")},                                       \
        {DS4_OPT_CALL("--ping", NULL, count_call, &(o), "no value")},                                         \
        {DS4_OPT_STR("--out", "FILE", &(o).out, NULL, "output"), .flags = DS4_OPT_OUT},                       \
        {DS4_OPT_STR("--in", "FILE", &(o).in, NULL, "input"), .flags = DS4_OPT_IN},                           \
        {DS4_OPT_SECTION("arguments:")},                                                                      \
        {DS4_OPT_STR("FIRST", NULL, &(o).first, NULL, "first"), .flags = DS4_OPT_REQUIRED},                   \
        {DS4_OPT_STR("SECOND", NULL, &(o).second, NULL, "second, optional")},                                 \
        {0},                                                                                                  \
    };                                                                                                        \
    ds4_cli cli = {.prog = "prog", .usage = "FIRST [SECOND] [options]", .about = "A test program.",         \
                   .opts = table, .refused = refused, .stray = "(a hint)"}
/* clang-format on */

/* Parse a space-separated command line (no quoting needed by the tests). */
static int parse(const ds4_cli *cli, const char *line, ds4_err *err) {
    static char buf[1024];
    char *argv[64] = {"prog"};
    int argc = 1;
    snprintf(buf, sizeof(buf), "%s", line);
    for (char *t = strtok(buf, " "); t && argc < 63; t = strtok(NULL, " ")) argv[argc++] = strcmp(t, "''") ? t : "";
    ds4_err_clear(err);
    return ds4_opts_parse(cli, argc, argv, err);
}

static void test_defaults(void **state) {
    (void)state;
    topts o;
    memset(&o, 0x55, sizeof(o));
    o.calls = 0;
    TABLE(o);
    ds4_err err;
    assert_int_equal(parse(&cli, "a", &err), 0);
    assert_string_equal(o.model, "ds4flash.gguf");
    assert_string_equal(o.system, "be helpful");
    assert_int_equal(o.ctx, 32768);
    assert_false(o.ctx_given);
    assert_true(o.seed == 0);
    assert_int_equal(o.threads, 0);
    assert_int_equal(o.top_k, 0);
    assert_true(o.temp == 1.0f);
    assert_string_equal(o.preset, "tiny");
    assert_false(o.quiet);
    assert_int_equal(o.mode, 1);
    assert_null(o.out);
    assert_string_equal(o.first, "a");
    assert_null(o.second);
    assert_int_equal(o.calls, 0);
}

static void test_spellings(void **state) {
    (void)state;
    topts o = {0};
    TABLE(o);
    ds4_err err;
    assert_int_equal(parse(&cli, "-c 4096 -sys hi x --model=m.gguf --seed=7 -t 3 -q --nothink --cpu y", &err), 0);
    assert_int_equal(o.ctx, 4096);
    assert_true(o.ctx_given);
    assert_string_equal(o.system, "hi");
    assert_string_equal(o.model, "m.gguf");
    assert_true(o.seed == 7);
    assert_int_equal(o.threads, 3);
    assert_true(o.quiet);
    assert_int_equal(o.mode, 0);
    assert_string_equal(o.backend, "cpu");
    assert_string_equal(o.first, "x");
    assert_string_equal(o.second, "y");
    /* "--name=value" keeps what follows the first '=', empty included. */
    assert_int_equal(parse(&cli, "a --system=x=y", &err), 0);
    assert_string_equal(o.system, "x=y");
    assert_int_equal(parse(&cli, "a --system= --model ''", &err), 0);
    assert_string_equal(o.system, "");
    assert_string_equal(o.model, "");
    /* The last one counts; a value may start with '-'. */
    assert_int_equal(parse(&cli, "a -c 5 --ctx 6 -sys -q", &err), 0);
    assert_int_equal(o.ctx, 6);
    assert_string_equal(o.system, "-q");
    assert_false(o.quiet);
    /* "--" ends the options, "-" alone is an argument. */
    assert_int_equal(parse(&cli, "-- -q -c", &err), 0);
    assert_string_equal(o.first, "-q");
    assert_string_equal(o.second, "-c");
    assert_false(o.quiet);
    assert_int_equal(parse(&cli, "- -q", &err), 0);
    assert_string_equal(o.first, "-");
    assert_true(o.quiet);
    /* CALL rows see every occurrence. */
    assert_int_equal(parse(&cli, "a --set k=1 --set=k=2 --ping", &err), 0);
    assert_int_equal(o.calls, 3);
    assert_string_equal(o.called_with, "(none)");
}

static void test_errors(void **state) {
    (void)state;
    topts o = {0};
    TABLE(o);
    ds4_err err;
    static const struct {
        const char *line, *msg;
    } cases[] = {
        {"a -c 0", "-c 0: must be an integer in 1..1048576"},
        {"a --ctx 1048577", "--ctx 1048577: must be an integer in 1..1048576"},
        {"a --ctx=4k", "--ctx 4k: must be an integer in 1..1048576"},
        {"a --seed 0", "--seed 0: must be a positive integer"},
        {"a --top-k -1", "--top-k -1: must be an integer >= 0"},
        {"a --temp 101", "--temp 101: must be a number in 0..100"},
        {"a --temp nan", "--temp nan: must be a number in 0..100"},
        {"a --step 0.5", "--step 0.5: must be a number >= 1"},
        {"a --preset huge", "--preset huge: must be one of tiny, small or flash"},
        {"a --bogus", "--bogus: unknown option"},
        {"a --bogus=1", "--bogus: unknown option"},
        {"a --mtp 2", "--mtp: not implemented here"},
        {"a --mtp=2", "--mtp: not implemented here"},
        {"a -c", "-c: needs a value (N)"},
        {"a -q=1", "-q=1: unknown option"},
        {"a --quiet=1", "--quiet: takes no value"},
        {"a b c", "c: unexpected argument (a hint)"},
        {"-q", "FIRST is required"},
        {"a --set bad", "--set bad: not this one"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(parse(&cli, cases[i].line, &err), -1);
        assert_int_equal(err.code, DS4_EINVAL);
        assert_string_equal(err.msg, cases[i].msg);
    }
    /* -h and --help end the parsing where they stand. */
    assert_int_equal(parse(&cli, "--bogus-later -h", &err), -1);
    assert_int_equal(parse(&cli, "-h --bogus", &err), 1);
    assert_int_equal(parse(&cli, "--help", &err), 1);
}

static void test_clamp(void **state) {
    (void)state;
    topts o = {0};
    TABLE(o);
    ds4_err err;
    assert_int_equal(parse(&cli, "a --top-k 5000", &err), 0);
    assert_int_equal(o.top_k, 1024);
    assert_int_equal(parse(&cli, "a --top-k 7", &err), 0);
    assert_int_equal(o.top_k, 7);
    /* Clamped rows still refuse what is not a number or overflows the type. */
    assert_int_equal(parse(&cli, "a --top-k 99999999999", &err), -1);
}

static void test_files(void **state) {
    (void)state;
    topts o = {0};
    TABLE(o);
    ds4_err err;
    char dir[] = "/tmp/test_opts_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char line[512], file[300];
    snprintf(file, sizeof(file), "%s/in.txt", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(line, sizeof(line), "a --in %s --out %s/new.txt", file, dir);
    assert_int_equal(parse(&cli, line, &err), 0);
    /* Nothing was created. */
    snprintf(file, sizeof(file), "%s/new.txt", dir);
    assert_int_equal(access(file, F_OK), -1);

    snprintf(line, sizeof(line), "a --in %s/none.txt", dir);
    assert_int_equal(parse(&cli, line, &err), -1);
    assert_non_null(strstr(err.msg, "--in: cannot open "));
    assert_non_null(strstr(err.msg, "none.txt: No such file or directory"));
    snprintf(line, sizeof(line), "a --in %s", dir);
    assert_int_equal(parse(&cli, line, &err), -1);
    assert_non_null(strstr(err.msg, "it is a directory"));
    snprintf(line, sizeof(line), "a --out %s/missing/x.txt", dir);
    assert_int_equal(parse(&cli, line, &err), -1);
    assert_non_null(strstr(err.msg, "--out: cannot write "));
    assert_non_null(strstr(err.msg, "missing: No such file or directory"));
    snprintf(line, sizeof(line), "a --out %s", dir);
    assert_int_equal(parse(&cli, line, &err), -1);
    assert_non_null(strstr(err.msg, "it is a directory"));
    /* Standard input is not a file to check. */
    assert_int_equal(parse(&cli, "a --in -", &err), 0);
    snprintf(file, sizeof(file), "%s/in.txt", dir);
    unlink(file);
    rmdir(dir);
}

/* The help text, captured through a temporary file. */
static char *help_text(const ds4_cli *cli) {
    FILE *f = tmpfile();
    assert_non_null(f);
    ds4_opts_help(cli, f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return s;
}

static void test_help(void **state) {
    (void)state;
    topts o = {0};
    TABLE(o);
    char *h = help_text(&cli);
    assert_true(strncmp(h, "usage: prog FIRST [SECOND] [options]\n\nA test program.\n\nmodel:\n", 62) == 0);
    assert_non_null(strstr(h, "\n  -c, --ctx N              context size (1..1048576; default 32768)\n"));
    assert_non_null(strstr(h, "\n  -m, --model FILE         the model (default ds4flash.gguf)\n"));
    assert_non_null(strstr(h, "\n  --seed N                 seed (>= 1; default from the time)\n"));
    assert_non_null(strstr(h, "\n  --top-k N                top-k (>= 0, capped at 1024; default 0)\n"));
    assert_non_null(strstr(h, "\n  --temp F                 temperature (0..100; default 1)\n"));
    assert_non_null(strstr(h, "\n  --preset NAME            shape (tiny, small or flash; default tiny)\n"));
    assert_non_null(strstr(h, "\n  --think                  think (the default)\n"));
    assert_non_null(strstr(h, "\n  -q, --quiet              no progress\n"));
    /* -h is listed with the options, before the section of positionals. */
    assert_non_null(strstr(h, "\n  -h, --help               print this help and exit\n\narguments:\n"
                              "  FIRST                    first (required)\n"));
    assert_null(strstr(h, "--step")); /* hidden */
    free(h);
}

static void test_help_wraps(void **state) {
    (void)state;
    bool x;
    ds4_opt table[] = {
        {DS4_OPT_FLAG("--a-rather-long-option-name", &x,
                      "a help text long enough to need a second line when it is printed, so that the wrapping "
                      "code has work to do and keeps the column")},
        {0},
    };
    ds4_cli cli = {.prog = "p", .opts = table};
    char *h = help_text(&cli);
    assert_non_null(strstr(h, "\noptions:\n  --a-rather-long-option-name\n                           a help text"));
    for (char *line = strtok(h, "\n"); line; line = strtok(NULL, "\n")) assert_true(strlen(line) <= 96);
    free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),   cmocka_unit_test(test_spellings), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_clamp),      cmocka_unit_test(test_files),     cmocka_unit_test(test_help),
        cmocka_unit_test(test_help_wraps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
