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
#include <unistd.h>

#include "base/clock.h"
#include "engine/engine.h"
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

/* ------------------------------------------------------------ progress */

typedef struct meter {
    bool on, tty;
    double t0, last;            /* start, last line printed */
    uint64_t prompts0, tokens0; /* counts at the start (a resumed run's) */
    uint64_t total_prompts;     /* of the run, limits applied */
    uint64_t max_tokens;
} meter;

static void fmt_time(char *buf, size_t n, double s) {
    if (s < 0 || s > 1e9) snprintf(buf, n, "?");
    else if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
}

/* The fraction done: of the prompts, or of --imatrix-max-tokens when that
 * ends the run sooner. */
static double meter_fraction(const meter *m, const ds4_imatrix_run_stats *st) {
    double f = m->total_prompts ? (double)st->prompts / (double)m->total_prompts : 0;
    if (m->max_tokens) {
        double ft = (double)st->tokens / (double)m->max_tokens;
        if (ft > f) f = ft;
    }
    return f > 1 ? 1 : f;
}

static void meter_show(meter *m, const ds4_imatrix_run_stats *st, bool final) {
    if (!m->on) return;
    double now = ds4_now();
    if (!m->tty && !final && now - m->last < 10.0) return;
    m->last = now;
    double el = now - m->t0, tps = el > 0 ? (double)(st->tokens - m->tokens0) / el : 0;
    double f = meter_fraction(m, st), f0 = meter_fraction(m, &(ds4_imatrix_run_stats){m->prompts0, m->tokens0, 0});
    char eta[32], spent[32];
    fmt_time(eta, sizeof(eta), f > f0 ? el * (1 - f) / (f - f0) : -1);
    fmt_time(spent, sizeof(spent), el);
    if (m->tty) {
        char bar[31];
        int fill = (int)(f * 30);
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\rimatrix [%s] %3.0f%% %llu/%llu prompts, %llu tokens, %.1f tok/s, %s, ETA %s\033[K", bar,
                f * 100, (unsigned long long)st->prompts, (unsigned long long)m->total_prompts,
                (unsigned long long)st->tokens, tps, spent, eta);
        if (final) fputs("\r\033[K", stderr);
    } else {
        fprintf(stderr, "imatrix: %llu/%llu prompts, %llu tokens, %.1f tok/s, %s, ETA %s\n",
                (unsigned long long)st->prompts, (unsigned long long)m->total_prompts, (unsigned long long)st->tokens,
                tps, spent, eta);
    }
    fflush(stderr);
}

/* ------------------------------------------------------------- the run */

typedef struct run {
    const ds4_imatrix_run_opts *o;
    ds4_backend *b;
    ds4_imcol *col;
    ds4_tokenizer *tok;
    const char *text;
    size_t len;
    char *partial;         /* OUT.partial */
    ds4_imcol_progress pg; /* consumed, tokens, dataset size, ctx */
    ds4_imatrix_run_stats st;
    uint64_t n_all; /* the dataset's prompts */
    meter m;
} run;

static uint32_t line_of(const char *text, size_t at) {
    uint32_t line = 1;
    for (size_t i = 0; i < at; i++) line += text[i] == '\n';
    return line;
}

static int checkpoint(run *r, ds4_err *err) {
    r->pg.tokens = r->st.tokens;
    if (ds4_backend_imatrix_flush(r->b, err) != 0) return -1;
    return ds4_imcol_save_state(r->col, r->partial, &r->pg, err);
}

/* One prompt (dataset prompt number `index`, at byte `start`): prefilled
 * into the collector, or skipped when nothing of it is left to run. */
static int run_prompt(run *r, uint64_t index, size_t start, size_t plen, ds4_err *err) {
    const ds4_imatrix_run_opts *o = r->o;
    ds4_backend *b = r->b;
    uint32_t *ids = NULL, n = 0;
    int prc = is_id_list(r->text + start, plen) ? parse_ids(r->text + start, plen, b->w->cfg.n_vocab, &ids, &n, err)
                                                : tokenize(r->tok, r->text + start, plen, &ids, &n, err);
    if (prc != 0)
        return ds4_err_prefix(err, "%s:%u: prompt %llu", o->dataset, line_of(r->text, start),
                              (unsigned long long)index);
    if (n > b->opts.ctx_size) n = b->opts.ctx_size;
    if (o->max_tokens > 0 && n > o->max_tokens - r->st.tokens) n = (uint32_t)(o->max_tokens - r->st.tokens);
    int rc = 0;
    if (n > 0) {
        ds4_backend_reset(b);
        rc = ds4_backend_prefill(b, ids, n, NULL, err);
        if (rc != 0) {
            ds4_err_prefix(err, "%s:%u: prompt %llu", o->dataset, line_of(r->text, start), (unsigned long long)index);
        } else {
            ds4_imcol_end_prompt(r->col);
            r->st.prompts++;
            r->st.tokens += n;
        }
    }
    free(ids);
    return rc;
}

static bool at_limit(const run *r) {
    const ds4_imatrix_run_opts *o = r->o;
    return (o->max_prompts > 0 && r->st.prompts >= o->max_prompts) ||
           (o->max_tokens > 0 && r->st.tokens >= o->max_tokens);
}

/* Prefill every prompt (within the limits) into the collector, from where
 * a checkpoint left off. */
static int run_prompts(run *r, ds4_err *err) {
    const ds4_imatrix_run_opts *o = r->o;
    uint64_t every = o->save_every ? o->save_every : DS4_IMATRIX_SAVE_EVERY, index = 0;
    size_t pos = 0, start, plen;
    while (!at_limit(r) && ds4_imatrix_dataset_next(r->text, r->len, &pos, &start, &plen)) {
        if (++index <= r->pg.consumed) continue;
        uint64_t before = r->st.prompts;
        if (run_prompt(r, index, start, plen, err) != 0) return -1;
        r->pg.consumed = index;
        meter_show(&r->m, &r->st, false);
        if (r->st.prompts != before && r->st.prompts % every == 0 && checkpoint(r, err) != 0) return -1;
        if (o->stop && o->stop(o->stop_ctx)) {
            meter_show(&r->m, &r->st, true);
            if (checkpoint(r, err) != 0) return -1;
            return ds4_err_set(err, DS4_EINTERRUPTED,
                               "interrupted after %llu prompts; %s not written, %s holds the "
                               "progress (--resume continues)",
                               (unsigned long long)r->st.prompts, o->out, r->partial);
        }
    }
    meter_show(&r->m, &r->st, true);
    if (r->st.prompts == 0) return ds4_err_set(err, DS4_EINVAL, "%s: no prompts", o->dataset);
    /* a limit ended the run before the dataset's end: keep the state, so
     * that --resume with larger limits goes on */
    if (r->pg.consumed < r->n_all) return checkpoint(r, err);
    if (ds4_backend_imatrix_flush(r->b, err) != 0) return -1;
    if (unlink(r->partial) != 0 && errno != ENOENT)
        return ds4_err_set(err, DS4_EIO, "%s: %s", r->partial, strerror(errno));
    return 0;
}

static uint64_t count_prompts(const char *text, size_t len) {
    size_t pos = 0, start, plen;
    uint64_t n = 0;
    while (ds4_imatrix_dataset_next(text, len, &pos, &start, &plen)) n++;
    return n;
}

static int resume(run *r, ds4_err *err) {
    ds4_imcol_progress pg;
    if (ds4_imcol_load_state(r->col, r->partial, &pg, err) != 0) return ds4_err_prefix(err, "--resume");
    if (pg.dataset_bytes != r->pg.dataset_bytes || pg.ctx != r->pg.ctx)
        return ds4_err_set(err, DS4_EINVAL,
                           "--resume: %s is of another run (a dataset of %llu bytes, context %u; now "
                           "%llu bytes, context %u)",
                           r->partial, (unsigned long long)pg.dataset_bytes, pg.ctx,
                           (unsigned long long)r->pg.dataset_bytes, r->pg.ctx);
    r->pg = pg;
    r->st.prompts = (uint64_t)ds4_imcol_prompts(r->col);
    r->st.tokens = pg.tokens;
    return 0;
}

int ds4_imatrix_run(const ds4_weights *w, ds4_tokenizer *tok, const ds4_backend_opts *bo, const ds4_imatrix_run_opts *o,
                    ds4_imatrix_run_stats *stats, ds4_err *err) {
    run r = {.o = o, .tok = tok};
    char *text = read_dataset(o->dataset, &r.len, err);
    if (!text) return -1;
    r.text = text;
    size_t plen = strlen(o->out);
    r.partial = malloc(plen + 9);
    r.col = r.partial ? ds4_imcol_new(&w->cfg, err) : NULL;
    if (!r.partial) ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = -1;
    if (r.col) {
        snprintf(r.partial, plen + 9, "%s.partial", o->out);
        ds4_backend_opts opts = *bo;
        opts.imatrix = r.col;
        r.b = ds4_backend_create(o->backend ? o->backend : ds4_default_backend(), w, &opts, err);
    }
    if (r.b) {
        r.pg.dataset_bytes = r.len;
        r.pg.ctx = r.b->opts.ctx_size;
        rc = o->resume ? resume(&r, err) : 0;
    }
    if (rc == 0) {
        r.m = (meter){.on = o->show_progress,
                      .tty = isatty(2) != 0,
                      .t0 = ds4_now(),
                      .prompts0 = r.st.prompts,
                      .tokens0 = r.st.tokens,
                      .max_tokens = o->max_tokens};
        r.m.last = r.m.t0;
        /* the prompts of the run: the dataset's, fewer by the limit */
        r.n_all = count_prompts(text, r.len);
        r.m.total_prompts = r.n_all - r.pg.consumed + r.st.prompts;
        if (o->max_prompts && r.m.total_prompts > o->max_prompts) r.m.total_prompts = o->max_prompts;
        rc = run_prompts(&r, err);
    }
    if (rc == 0) {
        const char *slash = strrchr(o->dataset, '/');
        rc = ds4_imcol_save(r.col, o->out, slash ? slash + 1 : o->dataset, err);
    }
    r.st.routes = r.col ? ds4_imcol_routes(r.col) : 0;
    if (stats) *stats = r.st;
    ds4_backend_free(r.b);
    ds4_imcol_free(r.col);
    free(r.partial);
    free(text);
    return rc;
}
