/*
 * ds4-imatrix - collect an importance matrix for the routed experts by
 * running the model over a dataset (docs/TOOLCHAIN.md).
 *
 *   ds4-imatrix MODEL --imatrix-dataset FILE --imatrix-out OUT.dat
 *               [--ctx N] [--imatrix-max-prompts N] [--imatrix-max-tokens N] [-t N] [--no-sim]
 *
 * The dataset holds prompts separated by `===== DS4_IMATRIX_PROMPT ...`
 * lines (format/imatrix.h).  A prompt is either a list of token ids (spaces,
 * commas or newlines between them) or rendered text, tokenized with the
 * model's own tokenizer metadata with every special token recognised
 * (text/tokenizer.h, ds4_tokenize_transcript).  Every prompt is
 * prefilled from an empty context (cut to --ctx tokens); the forward pass
 * reports each routed expert's inputs to the collector
 * (model/imatrix_collect.h), which writes ds4's legacy .dat for
 * `ds4-quantize --imatrix`.  The loop is engine/imatrix_run.h, shared with
 * `ds4 --imatrix-dataset FILE --imatrix-out OUT.dat`: the two write the same
 * bytes.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/numparse.h"
#include "engine/imatrix_run.h"
#include "engine/startup.h"
#include "model/backend.h"
#include "model/weights.h"
#include "text/tokenizer.h"

typedef struct opts {
    const char *model;
    ds4_imatrix_run_opts run;
    ds4_backend_opts bo;
} opts;

static void usage(FILE *f) {
    fprintf(f, "usage: ds4-imatrix MODEL --imatrix-dataset FILE --imatrix-out OUT.dat [--ctx N]\n"
               "                   [--imatrix-max-prompts N] [--imatrix-max-tokens N] [-t N] [--no-sim]\n");
}

static int collect(const opts *o, ds4_err *err) {
    ds4_weights *w = ds4_weights_open(o->model, err);
    if (!w) return -1;
    /* The tokenizer is optional: token-id datasets need none. */
    ds4_vocab *vocab = NULL;
    ds4_tokenizer *tok = NULL;
    int rc = 0;
    if (ds4_gguf_find_kv(w->gguf, "tokenizer.ggml.tokens") &&
        (!(vocab = ds4_vocab_from_gguf(w->gguf, err)) || !(tok = ds4_tokenizer_new(vocab, err))))
        rc = ds4_err_prefix(err, "%s: tokenizer", o->model);
    ds4_imatrix_run_stats st;
    if (rc == 0) {
        ds4_startup_print_memory("ds4-imatrix", "cpu", w, ds4_backend_opts_resolve(&o->bo).ctx_size);
        rc = ds4_imatrix_run(w, tok, &o->bo, &o->run, &st, err);
    }
    if (rc == 0)
        fprintf(stderr, "ds4-imatrix: wrote %s from %llu prompts, %llu tokens, %llu routed expert observations\n",
                o->run.out, (unsigned long long)st.prompts, (unsigned long long)st.tokens,
                (unsigned long long)st.routes);
    ds4_tokenizer_free(tok);
    ds4_vocab_free(vocab);
    ds4_weights_close(w);
    return rc;
}

static uint32_t parse_count(const char *opt, const char *s) {
    uint32_t v;
    if (ds4_parse_u32(s, 1, UINT32_MAX, &v)) {
        fprintf(stderr, "ds4-imatrix: %s %s: expected a positive integer\n", opt, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    static const struct option lo[] = {
        {"imatrix-dataset", required_argument, 0, 'd'}, {"imatrix-out", required_argument, 0, 'o'},
        {"ctx", required_argument, 0, 'c'},             {"imatrix-max-prompts", required_argument, 0, 'p'},
        {"imatrix-max-tokens", required_argument, 0, 'k'}, {"threads", required_argument, 0, 't'},
        {"no-sim", no_argument, 0, 'n'},                {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    opts o = {0};
    int c;
    while ((c = getopt_long(argc, argv, "t:h", lo, NULL)) != -1) {
        switch (c) {
        case 'd': o.run.dataset = optarg; break;
        case 'o': o.run.out = optarg; break;
        case 'c': o.bo.ctx_size = (uint32_t)parse_count("--ctx", optarg); break;
        case 'p': o.run.max_prompts = (uint64_t)parse_count("--imatrix-max-prompts", optarg); break;
        case 'k': o.run.max_tokens = (uint64_t)parse_count("--imatrix-max-tokens", optarg); break;
        case 't': o.bo.n_threads = (int)parse_count("-t", optarg); break;
        case 'n': o.bo.no_sim = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind != 1 || !o.run.dataset || !o.run.out) {
        usage(stderr);
        return 2;
    }
    o.model = argv[optind];
    int lrc = ds4_startup_lock("ds4-imatrix");
    if (lrc) return lrc;
    ds4_err err = {0};
    if (collect(&o, &err) != 0) {
        fprintf(stderr, "ds4-imatrix: %s\n", err.msg);
        return 1;
    }
    return 0;
}
