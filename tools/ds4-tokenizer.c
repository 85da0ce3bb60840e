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
#include <time.h>

#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/tokjson.h"

#define DEFAULT_TOKENIZER "data/tokenizer/deepseek-v4-tokenizer.json.xz"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ds4-tokenizer import TOKENIZER.json OUT.gguf [--config tokenizer_config.json] [--vocab-size N]\n"
            "       ds4-tokenizer [-t TOKENIZER] COMMAND ...\n"
            "  encode [--specials] TEXT | -f FILE   print the token ids of TEXT or FILE\n"
            "  decode ID...                         print the bytes of the ids (space/comma separated)\n"
            "  bench FILE [--repeat N]              tokenize FILE on one core, report MB/s\n"
            "TOKENIZER: a .gguf with tokenizer metadata, tokenizer.json or tokenizer.json.xz (default %s)\n",
            DEFAULT_TOKENIZER);
}

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

static int cmd_encode(const ds4_vocab *v, int argc, char **argv) {
    int specials = 0;
    const char *file = NULL, *text = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--specials") == 0) specials = 1;
        else if (strcmp(argv[i], "-f") == 0 && i + 1 < argc) file = argv[++i];
        else if (!text) text = argv[i];
        else return usage(stderr), 2;
    }
    if (!!file == !!text) return usage(stderr), 2;
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
    int rc = !t ? -1
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

static int cmd_decode(const ds4_vocab *v, int argc, char **argv) {
    ds4_tokens ids = {0};
    for (int i = 0; i < argc; i++) {
        char *p = argv[i];
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
    int rc = ids.failed ? ds4_err_set(&err, DS4_ENOMEM, "out of memory") : ds4_detokenize(v, ids.ids, ids.n, &out, &err);
    if (rc == 0) fwrite(out.p ? out.p : "", 1, out.len, stdout);
    else fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
    ds4_strbuf_free(&out);
    ds4_tokens_free(&ids);
    return rc ? 1 : 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One pass over the text; returns seconds, or a negative value on error. */
static double bench_pass(ds4_tokenizer *t, const char *text, size_t len, size_t *n_tokens) {
    ds4_tokens ids = {0};
    ds4_err err = {0};
    double t0 = now_s();
    int rc = ds4_tokenize_text(t, text, len, &ids, &err);
    double dt = now_s() - t0;
    *n_tokens = ids.n;
    ds4_tokens_free(&ids);
    if (rc) fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
    return rc ? -1.0 : dt;
}

static int cmd_bench(const ds4_vocab *v, int argc, char **argv) {
    const char *file = NULL;
    int repeat = 5;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!file) file = argv[i];
        else return usage(stderr), 2;
    }
    if (!file || repeat < 1) return usage(stderr), 2;
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

static int cmd_import(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *config = NULL;
    unsigned long vocab_size = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) config = argv[++i];
        else if (strcmp(argv[i], "--vocab-size") == 0 && i + 1 < argc) vocab_size = strtoul(argv[++i], NULL, 10);
        else if (!in) in = argv[i];
        else if (!out) out = argv[i];
        else return usage(stderr), 2;
    }
    if (!in || !out || vocab_size > INT32_MAX) return usage(stderr), 2;
    ds4_err err = {0};
    if (ds4_tokjson_import(in, config, (uint32_t)vocab_size, out, &err)) {
        fprintf(stderr, "ds4-tokenizer: %s\n", err.msg);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *tok_path = DEFAULT_TOKENIZER;
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "-t") == 0) {
        tok_path = argv[i + 1];
        i += 2;
    }
    if (i >= argc) return usage(stderr), 2;
    const char *cmd = argv[i++];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) return usage(stdout), 0;
    if (strcmp(cmd, "import") == 0) return cmd_import(argc - i, argv + i);
    int (*fn)(const ds4_vocab *, int, char **) = strcmp(cmd, "encode") == 0   ? cmd_encode
                                                 : strcmp(cmd, "decode") == 0 ? cmd_decode
                                                 : strcmp(cmd, "bench") == 0  ? cmd_bench
                                                                              : NULL;
    if (!fn) return usage(stderr), 2;
    ds4_vocab *v = load_vocab(tok_path);
    if (!v) return 1;
    int rc = fn(v, argc - i, argv + i);
    ds4_vocab_free(v);
    return rc;
}
