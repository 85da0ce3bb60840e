/*
 * ds4-imatrix - collect an importance matrix for the routed experts by
 * running the model over a dataset (spec/PRODUCT.md 1.8).
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
 * `ds4-quantize --imatrix`.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/imatrix.h"
#include "model/backend.h"
#include "model/imatrix_collect.h"
#include "model/weights.h"
#include "text/tokenizer.h"

typedef struct opts {
    const char *model, *dataset, *out;
    long max_prompts, max_tokens;
    ds4_backend_opts bo;
} opts;

static void usage(FILE *f) {
    fprintf(f, "usage: ds4-imatrix MODEL --imatrix-dataset FILE --imatrix-out OUT.dat [--ctx N]\n"
               "                   [--imatrix-max-prompts N] [--imatrix-max-tokens N] [-t N] [--no-sim]\n");
}

static char *read_all(const char *path, size_t *n, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *g = realloc(buf, cap *= 2);
            if (!g) free(buf);
            buf = g;
        }
    }
    fclose(f);
    if (!buf) ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", path);
    *n = len;
    return buf;
}

static bool is_id_list(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]) && !isspace((unsigned char)s[i]) && s[i] != ',') return false;
    return true;
}

/* A rendered-text prompt through the model's tokenizer. */
static int tokenize(ds4_tokenizer *tok, const char *s, size_t n, uint32_t **out, uint32_t *count, ds4_err *err) {
    if (!tok) return ds4_err_set(err, DS4_EUNSUPPORTED, "prompt is text, but the model has no tokenizer metadata");
    ds4_tokens t = {0};
    if (ds4_tokenize_transcript(tok, s, n, &t, err) != 0) {
        ds4_tokens_free(&t);
        return -1;
    }
    *out = malloc((t.n + 1) * sizeof(uint32_t));
    if (!*out) {
        ds4_tokens_free(&t);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < t.n; i++) (*out)[i] = (uint32_t)t.ids[i];
    *count = (uint32_t)t.n;
    ds4_tokens_free(&t);
    return 0;
}

/* A prompt block of token ids. */
static int parse_ids(const char *s, size_t n, uint32_t n_vocab, uint32_t **out, uint32_t *count, ds4_err *err) {
    uint32_t *ids = malloc((n / 2 + 1) * sizeof(uint32_t));
    if (!ids) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    uint32_t k = 0;
    for (size_t i = 0; i < n;) {
        if (isspace((unsigned char)s[i]) || s[i] == ',') {
            i++;
            continue;
        }
        unsigned long long v = 0;
        while (i < n && isdigit((unsigned char)s[i]) && v < n_vocab) v = v * 10 + (unsigned)(s[i++] - '0');
        if (v >= n_vocab) {
            free(ids);
            return ds4_err_set(err, DS4_ERANGE, "token id outside the vocabulary (%u)", n_vocab);
        }
        ids[k++] = (uint32_t)v;
    }
    *out = ids;
    *count = k;
    return 0;
}

static void observe(void *ctx, uint32_t il, uint32_t e, uint32_t m, const float *x, const float *mid) {
    ds4_imcol_expert(ctx, il, e, m, x, mid);
}

static int collect(const opts *o, ds4_err *err) {
    size_t len = 0;
    char *text = read_all(o->dataset, &len, err);
    if (!text) return -1;
    ds4_weights *w = ds4_weights_open(o->model, err);
    ds4_imcol *col = w ? ds4_imcol_new(&w->cfg, err) : NULL;
    ds4_backend_opts bo = o->bo;
    bo.expert_observer = observe;
    bo.observer_ctx = col;
    ds4_backend *b = col ? ds4_backend_create("cpu", w, &bo, err) : NULL;
    int rc = b ? 0 : -1;
    /* The tokenizer is optional: token-id datasets need none. */
    ds4_vocab *vocab = NULL;
    ds4_tokenizer *tok = NULL;
    if (rc == 0 && ds4_gguf_find_kv(w->gguf, "tokenizer.ggml.tokens") &&
        (!(vocab = ds4_vocab_from_gguf(w->gguf, err)) || !(tok = ds4_tokenizer_new(vocab, err))))
        rc = ds4_err_prefix(err, "%s: tokenizer", o->model);
    size_t pos = 0, start, plen;
    long prompts = 0, tokens = 0, index = 0;
    while (rc == 0 && ds4_imatrix_dataset_next(text, len, &pos, &start, &plen)) {
        index++;
        uint32_t *ids = NULL, n = 0;
        int prc = is_id_list(text + start, plen) ? parse_ids(text + start, plen, w->cfg.n_vocab, &ids, &n, err)
                                                 : tokenize(tok, text + start, plen, &ids, &n, err);
        if (prc != 0) {
            rc = ds4_err_prefix(err, "%s: prompt %ld", o->dataset, index);
            break;
        }
        if (n > b->opts.ctx_size) n = b->opts.ctx_size;
        if (o->max_tokens > 0 && (long)n > o->max_tokens - tokens) n = (uint32_t)(o->max_tokens - tokens);
        if (n > 0) {
            ds4_backend_reset(b);
            if (ds4_backend_prefill(b, ids, n, NULL, err) != 0) rc = ds4_err_prefix(err, "prompt %ld", index);
            ds4_imcol_end_prompt(col);
            prompts++;
            tokens += n;
        }
        free(ids);
        if ((o->max_prompts > 0 && prompts >= o->max_prompts) || (o->max_tokens > 0 && tokens >= o->max_tokens)) break;
    }
    if (rc == 0 && prompts == 0) rc = ds4_err_set(err, DS4_EINVAL, "%s: no prompts", o->dataset);
    if (rc == 0) {
        const char *slash = strrchr(o->dataset, '/');
        rc = ds4_imcol_save(col, o->out, slash ? slash + 1 : o->dataset, err);
    }
    if (rc == 0)
        fprintf(stderr, "ds4-imatrix: wrote %s from %ld prompts, %ld tokens, %llu routed expert observations\n",
                o->out, prompts, tokens, (unsigned long long)ds4_imcol_routes(col));
    ds4_tokenizer_free(tok);
    ds4_vocab_free(vocab);
    ds4_backend_free(b);
    ds4_imcol_free(col);
    ds4_weights_close(w);
    free(text);
    return rc;
}

static long parse_count(const char *opt, const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 1) {
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
        case 'd': o.dataset = optarg; break;
        case 'o': o.out = optarg; break;
        case 'c': o.bo.ctx_size = (uint32_t)parse_count("--ctx", optarg); break;
        case 'p': o.max_prompts = parse_count("--imatrix-max-prompts", optarg); break;
        case 'k': o.max_tokens = parse_count("--imatrix-max-tokens", optarg); break;
        case 't': o.bo.n_threads = (int)parse_count("-t", optarg); break;
        case 'n': o.bo.no_sim = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind != 1 || !o.dataset || !o.out) {
        usage(stderr);
        return 2;
    }
    o.model = argv[optind];
    ds4_err err = {0};
    if (collect(&o, &err) != 0) {
        fprintf(stderr, "ds4-imatrix: %s\n", err.msg);
        return 1;
    }
    return 0;
}
