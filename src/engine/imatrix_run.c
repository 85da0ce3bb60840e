/*
 * imatrix_run.c - importance-matrix collection over a dataset (see
 * imatrix_run.h).
 */
#include "engine/imatrix_run.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/imatrix.h"
#include "model/backends.h"
#include "model/imatrix_collect.h"

static char *read_dataset(const char *path, size_t *n, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, len = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len < cap) continue;
        char *g = realloc(buf, cap *= 2);
        if (!g) free(buf);
        buf = g;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf) {
        ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    if (failed) {
        free(buf);
        ds4_err_set(err, DS4_EIO, "%s: read failed", path);
        return NULL;
    }
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

/* Prefill every prompt (within the limits) into the collector. */
static int run_prompts(ds4_backend *b, ds4_imcol *col, ds4_tokenizer *tok, const char *text, size_t len,
                       const ds4_imatrix_run_opts *o, ds4_imatrix_run_stats *st, ds4_err *err) {
    size_t pos = 0, start, plen;
    uint64_t index = 0;
    while (ds4_imatrix_dataset_next(text, len, &pos, &start, &plen)) {
        index++;
        uint32_t *ids = NULL, n = 0;
        int prc = is_id_list(text + start, plen) ? parse_ids(text + start, plen, b->w->cfg.n_vocab, &ids, &n, err)
                                                 : tokenize(tok, text + start, plen, &ids, &n, err);
        if (prc != 0) return ds4_err_prefix(err, "%s: prompt %llu", o->dataset, (unsigned long long)index);
        if (n > b->opts.ctx_size) n = b->opts.ctx_size;
        if (o->max_tokens > 0 && n > o->max_tokens - st->tokens) n = (uint32_t)(o->max_tokens - st->tokens);
        if (n > 0) {
            ds4_backend_reset(b);
            int rc = ds4_backend_prefill(b, ids, n, NULL, err);
            free(ids);
            if (rc != 0) return ds4_err_prefix(err, "prompt %llu", (unsigned long long)index);
            ds4_imcol_end_prompt(col);
            st->prompts++;
            st->tokens += n;
            if (o->progress && o->progress(o->progress_ctx, st->prompts, n))
                return ds4_err_set(err, DS4_EINTERRUPTED, "interrupted after %llu prompts; %s not written",
                                   (unsigned long long)st->prompts, o->out);
        } else {
            free(ids);
        }
        if ((o->max_prompts > 0 && st->prompts >= o->max_prompts) || (o->max_tokens > 0 && st->tokens >= o->max_tokens))
            break;
    }
    if (st->prompts == 0) return ds4_err_set(err, DS4_EINVAL, "%s: no prompts", o->dataset);
    return 0;
}

int ds4_imatrix_run(const ds4_weights *w, ds4_tokenizer *tok, const ds4_backend_opts *bo,
                    const ds4_imatrix_run_opts *o, ds4_imatrix_run_stats *stats, ds4_err *err) {
    ds4_imatrix_run_stats st = {0};
    size_t len = 0;
    char *text = read_dataset(o->dataset, &len, err);
    if (!text) return -1;
    ds4_imcol *col = ds4_imcol_new(&w->cfg, err);
    ds4_backend_opts opts = *bo;
    opts.expert_observer = observe;
    opts.observer_ctx = col;
    ds4_backend *b = col ? ds4_backend_create("cpu", w, &opts, err) : NULL;
    int rc = b ? run_prompts(b, col, tok, text, len, o, &st, err) : -1;
    if (rc == 0) {
        const char *slash = strrchr(o->dataset, '/');
        rc = ds4_imcol_save(col, o->out, slash ? slash + 1 : o->dataset, err);
    }
    st.routes = col ? ds4_imcol_routes(col) : 0;
    if (stats) *stats = st;
    ds4_backend_free(b);
    ds4_imcol_free(col);
    free(text);
    return rc;
}
