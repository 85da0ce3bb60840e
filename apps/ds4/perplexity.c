/*
 * perplexity.c - `ds4 --perplexity-file FILE`: teacher-forced negative
 * log-likelihood of a raw text under the model, the number to compare
 * quantizations and backends with.
 *
 * The text is tokenized as plain text (no BOS, no chat template, no
 * special-token recognition), as ds4 does, so the numbers compare with
 * its.  The first 32 tokens are context only; every later token t is
 * scored with -log softmax(logits after t-1)[t], up to -n scored tokens
 * (default 50000) and as many as the context holds (a note on stderr says
 * so when the context leaves part of the text out).  The model runs
 * batched prefills that return every position's logits
 * (ds4_session_append_logits), not one decode per token.  Prints ds4's
 * line:
 *
 *   tokens=N scored=S nll=X avg_nll=X/S ppl=exp(avg_nll)
 *
 * N: the text's tokens; S: those scored; nll: the sum over the scored
 * tokens, natural log.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "modes.h"
#include "runtime.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "text/tokenizer.h"

#define PPL_CONTEXT 32
#define PPL_BATCH   256 /* positions per batched prefill (bounds the logits buffer) */

/* The text's tokens. */
static int text_tokens(ds4_engine *e, const char *path, ds4_tokens *out, ds4_err *err) {
    size_t len;
    char *text = cli_read_file(path, &len, err);
    if (!text) return -1;
    ds4_tokenizer *t = ds4_tokenizer_new(e->vocab, err);
    int rc = -1;
    if (t) rc = ds4_tokenize_text(t, text, len, out, err);
    ds4_tokenizer_free(t);
    free(text);
    return rc;
}

/* Score tokens[first..first+n): feed tokens[first-1..first+n-1) in batches
 * and add -log p of each next token. */
static int score(ds4_session *s, const ds4_tokens *tk, uint32_t first, uint32_t n, double *nll, ds4_err *err) {
    uint32_t V = ds4_session_engine(s)->w->cfg.n_vocab;
    float *logits = malloc((size_t)PPL_BATCH * V * sizeof(float));
    if (!logits) return ds4_err_set(err, DS4_ENOMEM, "out of memory for %u x %u logits", PPL_BATCH, V);
    cli_progress pr = {.show = cli_term_detect().err_tty};
    cli_progress_start(&pr, n);
    int rc = 0;
    for (uint32_t done = 0; done < n && rc == 0;) {
        uint32_t b = n - done < PPL_BATCH ? n - done : PPL_BATCH;
        const int32_t *feed = tk->ids + first - 1 + done;
        rc = ds4_session_append_logits(s, feed, b, logits, NULL, NULL, err);
        for (uint32_t i = 0; rc == 0 && i < b; i++) *nll -= ds4_logprob_of(logits + (size_t)i * V, (int)V, feed[i + 1]);
        done += b;
        if (rc == 0 && cli_progress_fn(&pr, done, n)) rc = ds4_err_set(err, DS4_EINTERRUPTED, "interrupted");
    }
    cli_progress_clear(&pr);
    free(logits);
    return rc;
}

int run_perplexity(ds4_engine *e, const cli_opts *o) {
    ds4_err err = {0};
    ds4_tokens tk = {0};
    ds4_session *s = NULL;
    int status = 1;
    if (text_tokens(e, o->perplexity_file, &tk, &err) != 0) goto out;
    if (tk.n <= PPL_CONTEXT) {
        ds4_err_set(&err, DS4_EINVAL, "%s: %zu token%s; more than %d are needed (the first %d are context)",
                    o->perplexity_file, tk.n, ds4_plural(tk.n), PPL_CONTEXT, PPL_CONTEXT);
        goto out;
    }
    /* Scored tokens: the rest of the text, at most -n, and what fits: the
     * session holds the fed tokens, context + scored - 1 < ctx. */
    uint64_t n = tk.n - PPL_CONTEXT;
    if (n > o->n_tokens) n = o->n_tokens;
    uint64_t fits = o->ctx > PPL_CONTEXT ? o->ctx - PPL_CONTEXT : 0;
    if (fits == 0) {
        ds4_err_set(&err, DS4_EINVAL, "a context of %u tokens leaves nothing to score after %d context tokens", o->ctx,
                    PPL_CONTEXT);
        goto out;
    }
    if (n > fits) {
        fprintf(stderr,
                "ds4: --perplexity-file: the text has %zu tokens; a context of %u tokens scores the first "
                "%llu after the %d context tokens, not the other %llu (a larger context: -c N)\n",
                tk.n, o->ctx, (unsigned long long)fits, PPL_CONTEXT, (unsigned long long)(n - fits));
        n = fits;
    }
    if (!(s = ds4_session_new(e, o->ctx, &err))) goto out;
    cli_busy(true);
    double t0 = ds4_now(), nll = 0.0;
    int rc = ds4_session_sync(s, tk.ids, PPL_CONTEXT - 1, NULL, NULL, &err);
    if (rc == 0) rc = score(s, &tk, PPL_CONTEXT, (uint32_t)n, &nll, &err);
    cli_busy(false);
    if (rc != 0) goto out;
    double secs = ds4_now() - t0;
    uint32_t fed = ds4_session_n_tokens(s);
    printf("tokens=%zu scored=%llu nll=%.9f avg_nll=%.9f ppl=%.9f\n", tk.n, (unsigned long long)n, nll, nll / (double)n,
           exp(nll / (double)n));
    fprintf(stderr, "ds4: %u token%s in %.2f s (%.2f t/s)\n", fed, ds4_plural(fed), secs, secs > 0 ? fed / secs : 0.0);
    if (isnan(nll))
        fputs("ds4: warning: the log-likelihood is NaN: the model's logits held NaN (its weights hold NaN or Inf "
              "values, or a kernel failed)\n",
              stderr);
    status = 0;
out:
    if (status && err.code == DS4_EINTERRUPTED) status = cli_report_interrupt();
    else if (status) fprintf(stderr, "ds4: --perplexity-file: %s\n", err.msg);
    ds4_session_free(s);
    ds4_tokens_free(&tk);
    return status;
}
