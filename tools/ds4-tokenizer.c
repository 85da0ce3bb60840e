/*
 * ds4-tokenizer - the DeepSeek V4 tokenizer from the command line.
 *
 *   ds4-tokenizer import TOKENIZER.json OUT.gguf [--config tokenizer_config.json] [--vocab-size N]
 *   ds4-tokenizer [-t TOKENIZER] encode [--specials] TEXT | -f FILE
 *   ds4-tokenizer [-t TOKENIZER] decode ID...
 *   ds4-tokenizer [-t TOKENIZER] bench FILE [--repeat N]
 *
 * `import` writes the tokenizer.ggml.* metadata of a tokenizer.json (".xz"
 * is decompressed on the fly) into a GGUF, laid out as ds4's model files.
 * TOKENIZER is a GGUF with that metadata (a model file or an imported one)
 * or a tokenizer.json; the default is the copy in data/tokenizer/.  `encode` prints ids on
 * one line; with --specials added-token spellings in the text ("<｜User｜>",
 * "<think>") become their control tokens (trusted-transcript mode),
 * otherwise everything is plain text.  `decode` writes the exact bytes.
 * `bench` measures plain tokenization throughput on one core: one cold pass
 * (fresh piece cache) and N warm passes (mean and best, for shared machines).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/opts.h"
#include "base/paths.h"
#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/tokjson.h"

/* The tokenizer a checkout carries, looked for next to the program (and in
 * the folders above it: build/cuda/bin/), then in the current directory. */
#define DEFAULT_TOKENIZER "data/tokenizer/deepseek-v4-tokenizer.json.xz"

static ds4_vocab *load_vocab_gguf(const char *path) {
    ds4_err err = {0};
    ds4_gguf *g = ds4_gguf_open(path, &err);
    ds4_vocab *v = g ? ds4_vocab_from_gguf(g, &err) : NULL;
    if (!v) fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
    ds4_gguf_close(g);
    return v;
}

static ds4_vocab *load_vocab(const char *path) {
    size_t n = strlen(path);
    if (n > 5 && strcmp(path + n - 5, ".gguf") == 0) return load_vocab_gguf(path);
    ds4_err err = {0};
    ds4_tokjson tj;
    if (ds4_tokjson_load(path, NULL, 0, &tj, &err)) {
        fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
        return NULL;
    }
    ds4_vocab_src src = ds4_tokjson_src(&tj);
    ds4_vocab *v = ds4_vocab_new(&src, &err);
    ds4_tokjson_free(&tj);
    if (!v) fprintf(stderr, "ds4-tokenizer: %s: %s\n", path, err.msg);
    return v;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ds4-tokenizer: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    ds4_strbuf b = {0};
    char chunk[65536];
    size_t r;
    while ((r = fread(chunk, 1, sizeof(chunk), f)) > 0) ds4_strbuf_append(&b, chunk, r);
    int bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad || b.failed) {
        fprintf(stderr, "ds4-tokenizer: reading %s failed\n", path);
        ds4_strbuf_free(&b);
        return NULL;
    }
    return ds4_strbuf_take(&b, len);
}

/* The parsed command line: the options of every command, and the
 * positional arguments after the command. */
typedef struct tok_opts {
    const char *tokenizer, *command, *file, *config;
    bool specials, tokenizer_given, repeat_given;
    int repeat;
    uint32_t vocab_size;
    const char **args;
    int n_args;
} tok_opts;

static int cmd_encode(const ds4_vocab *v, const tok_opts *o) {
    int specials = o->specials;
    const char *file = o->file, *text = o->n_args ? o->args[0] : NULL;
    size_t len = 0;
    char *owned = NULL;
    if (file) {
        owned = read_file(file, &len);
        if (!owned) return 1;
        text = owned;
    } else {
        len = strlen(text);
    }
    ds4_err err = {0};
    ds4_tokenizer *t = ds4_tokenizer_new(v, &err);
    ds4_tokens ids = {0};
    int rc = !t         ? -1
             : specials ? ds4_tokenize_transcript(t, text, len, &ids, &err)
                        : ds4_tokenize_text(t, text, len, &ids, &err);
    if (rc == 0) {
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        printf("\n");
    } else {
        fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
    }
    ds4_tokens_free(&ids);
    ds4_tokenizer_free(t);
    free(owned);
    return rc ? 1 : 0;
}

static int cmd_decode(const ds4_vocab *v, const tok_opts *o) {
    ds4_tokens ids = {0};
    for (int i = 0; i < o->n_args; i++) {
        const char *p = o->args[i];
        while (*p) {
            if (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t') {
                p++;
                continue;
            }
            char *end;
            errno = 0;
            long id = strtol(p, &end, 10);
            if (end == p || errno || id < INT32_MIN || id > INT32_MAX) {
                fprintf(stderr, "ds4-tokenizer: \"%s\" is not a token id\n", p);
                ds4_tokens_free(&ids);
                return 2;
            }
            ds4_tokens_push(&ids, (int32_t)id);
            p = end;
        }
    }
    ds4_strbuf out = {0};
    ds4_err err = {0};
    int rc = ids.failed ? ds4_err_set(&err, DS4_ENOMEM, "out of memory")
                        : ds4_detokenize(v, ids.ids, ids.n, &out, &err);
    if (rc == 0) fwrite(out.p ? out.p : "", 1, out.len, stdout);
    else fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
    ds4_strbuf_free(&out);
    ds4_tokens_free(&ids);
    return rc ? 1 : 0;
}

/* One pass over the text; returns seconds, or a negative value on error. */
static double bench_pass(ds4_tokenizer *t, const char *text, size_t len, size_t *n_tokens) {
    ds4_tokens ids = {0};
    ds4_err err = {0};
    double t0 = ds4_now();
    int rc = ds4_tokenize_text(t, text, len, &ids, &err);
    double dt = ds4_now() - t0;
    *n_tokens = ids.n;
    ds4_tokens_free(&ids);
    if (rc) fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
    return rc ? -1.0 : dt;
}

static int cmd_bench(const ds4_vocab *v, const tok_opts *o) {
    const char *file = o->args[0];
    int repeat = o->repeat;
    size_t len;
    char *text = read_file(file, &len);
    if (!text) return 1;
    ds4_err err = {0};
    ds4_tokenizer *t = ds4_tokenizer_new(v, &err);
    if (!t) {
        fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
        free(text);
        return 1;
    }
    size_t n_tokens = 0;
    double cold = bench_pass(t, text, len, &n_tokens), warm = 0, best = 0;
    for (int r = 0; r < repeat && cold >= 0; r++) {
        double dt = bench_pass(t, text, len, &n_tokens);
        if (dt < 0) {
            cold = -1;
            break;
        }
        warm += dt;
        if (r == 0 || dt < best) best = dt;
    }
    int rc = cold < 0;
    if (!rc) {
        double mb = (double)len / 1e6;
        printf("file: %s, %zu bytes, %zu tokens (%.2f bytes/token)\n", file, len, n_tokens,
               (double)len / (double)n_tokens);
        printf("cold pass: %.3f s, %.1f MB/s\n", cold, mb / cold);
        printf("warm passes (%d): %.3f s each, %.1f MB/s; best %.3f s, %.1f MB/s\n", repeat, warm / repeat,
               mb * repeat / warm, best, mb / best);
    }
    ds4_tokenizer_free(t);
    free(text);
    return rc;
}

static int cmd_import(const tok_opts *o) {
    ds4_err err = {0};
    if (ds4_tokjson_import(o->args[0], o->config, o->vocab_size, o->args[1], &err)) {
        fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* DEFAULT_TOKENIZER next to the program or above it, else as a relative
 * path; NULL with where it looked in err. */
static const char *default_tokenizer(char *buf, size_t len, ds4_err *err) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        for (int up = 0; slash && up < 4; up++) {
            *slash = 0;
            snprintf(buf, len, "%s/%s", exe[0] ? exe : "/", DEFAULT_TOKENIZER);
            if (access(buf, R_OK) == 0) return buf;
            slash = strrchr(exe, '/');
        }
    }
    if (access(DEFAULT_TOKENIZER, R_OK) == 0) return DEFAULT_TOKENIZER;
    ds4_err_set(err, DS4_ENOTFOUND,
                "no -t TOKENIZER given, and %s is neither next to the program%s%s nor in the current directory",
                DEFAULT_TOKENIZER, n > 0 ? " " : "", n > 0 ? "(or the folders above it)" : "");
    return NULL;
}

/* The positional arguments after the command. */
static int add_arg(void *ctx, const char *v, ds4_err *err) {
    (void)err;
    tok_opts *o = ctx;
    o->args[o->n_args++] = v;
    return 0;
}

/* What each command takes: a usage error for the rest. */
static int check_command(const ds4_cli *cli, const tok_opts *o) {
    const char *c = o->command;
    bool encode = !strcmp(c, "encode"), bench = !strcmp(c, "bench"), import = !strcmp(c, "import");
    if (o->specials && !encode) return ds4_cli_usage(cli, "--specials only applies to encode");
    if (o->file && !encode) return ds4_cli_usage(cli, "-f only applies to encode");
    if (o->repeat_given && !bench) return ds4_cli_usage(cli, "--repeat only applies to bench");
    if ((o->config || o->vocab_size) && !import)
        return ds4_cli_usage(cli, "--config and --vocab-size only apply to import");
    if (o->tokenizer_given && import) return ds4_cli_usage(cli, "import reads TOKENIZER.json, not -t");
    if (encode && (o->n_args + !!o->file != 1)) return ds4_cli_usage(cli, "encode takes one TEXT or -f FILE");
    if (bench && o->n_args != 1) return ds4_cli_usage(cli, "bench takes one FILE");
    if (import && o->n_args != 2) return ds4_cli_usage(cli, "import takes TOKENIZER.json OUT.gguf");
    ds4_err err = {0};
    if (bench && ds4_path_check_readable(o->args[0], &err) != 0) return ds4_cli_usage(cli, "bench: %s", err.msg);
    if (import && (ds4_path_check_readable(o->args[0], &err) != 0 || ds4_path_check_writable(o->args[1], &err) != 0))
        return ds4_cli_usage(cli, "import: %s", err.msg);
    return 0;
}

int main(int argc, char **argv) {
    tok_opts o = {0};
    if (!(o.args = calloc((size_t)argc + 1, sizeof(char *)))) return 1;
    ds4_opt table[] = {
        {DS4_OPT_STR("-t, --tokenizer", "FILE", &o.tokenizer, NULL,
                     "a .gguf with tokenizer metadata (a model file or an imported one), a tokenizer.json or a "
                     "tokenizer.json.xz"),
         .def_text = DEFAULT_TOKENIZER " next to the program", .seen = &o.tokenizer_given, .flags = DS4_OPT_IN},
        {DS4_OPT_FLAG("--specials", &o.specials,
                      "encode: added-token spellings in the text (<｜User｜>, <think>) become their control "
                      "tokens; otherwise everything is plain text")},
        {DS4_OPT_STR("-f, --file", "FILE", &o.file, NULL, "encode: the text of FILE (- for standard input)"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_INT("--repeat", "N", &o.repeat, 1, 1000000, 5, "bench: warm passes"), .seen = &o.repeat_given},
        {DS4_OPT_STR("--config", "FILE", &o.config, NULL, "import: the tokenizer_config.json"), .flags = DS4_OPT_IN},
        {DS4_OPT_U32("--vocab-size", "N", &o.vocab_size, 1, INT32_MAX, 0,
                     "import: the model's vocabulary size, when larger than the tokenizer's"),
         .def_text = "the tokenizer's"},
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_CHOICE("COMMAND", NULL, &o.command, "encode|decode|bench|import", NULL,
                        "encode TEXT prints the token ids of TEXT (or of -f FILE); decode ID... prints the bytes "
                        "of the ids (space or comma separated); bench FILE tokenizes FILE on one core and reports "
                        "MB/s (a cold pass, then --repeat warm ones); import TOKENIZER.json OUT.gguf writes the "
                        "tokenizer.ggml.* metadata of a tokenizer.json (.xz too) into a GGUF"),
         .flags = DS4_OPT_REQUIRED},
        {DS4_OPT_CALL("ARG", NULL, add_arg, &o, "the command's arguments"), .flags = DS4_OPT_MANY},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-tokenizer",
                   .usage = "[-t TOKENIZER] encode [--specials] TEXT | -f FILE\n"
                            "[-t TOKENIZER] decode ID...\n"
                            "[-t TOKENIZER] bench FILE [--repeat N]\n"
                            "import TOKENIZER.json OUT.gguf [--config tokenizer_config.json] [--vocab-size N]",
                   .about = "The DeepSeek V4 tokenizer from the command line.",
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status) || (status = check_command(&cli, &o)) != 0) {
        free(o.args);
        return status;
    }
    int rc;
    if (!strcmp(o.command, "import")) {
        rc = cmd_import(&o);
    } else {
        char buf[4200];
        ds4_err err = {0};
        const char *path = o.tokenizer ? o.tokenizer : default_tokenizer(buf, sizeof(buf), &err);
        ds4_vocab *v = path ? load_vocab(path) : NULL;
        if (!path) fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
        rc = !v                             ? 1
             : !strcmp(o.command, "encode") ? cmd_encode(v, &o)
             : !strcmp(o.command, "decode") ? cmd_decode(v, &o)
                                            : cmd_bench(v, &o);
        ds4_vocab_free(v);
    }
    free(o.args);
    return rc;
}
