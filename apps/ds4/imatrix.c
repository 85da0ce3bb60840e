/*
 * imatrix.c - `ds4 --imatrix-dataset FILE --imatrix-out OUT.dat`: collect a
 * routed-expert importance matrix for ds4-quantize --imatrix (as ds4's
 * option; docs/TOOLCHAIN.md), with --ctx, -t, --imatrix-max-prompts and
 * --imatrix-max-tokens.
 *
 * The collection itself is engine/imatrix_run.h, the same code ds4-imatrix
 * runs, so the two programs write identical files.  This file adds what an
 * interactive user needs: a progress line on a terminal and Ctrl+C (the
 * first stops after the current prompt without writing, a second exits at
 * once).
 */
#include <stdio.h>

#include "engine/imatrix_run.h"
#include "modes.h"
#include "runtime.h"

typedef struct progress {
    bool show;
    uint64_t tokens;
} progress;

static int on_prompt(void *ctx, uint64_t prompts, uint32_t tokens) {
    progress *p = ctx;
    p->tokens += tokens;
    if (p->show) {
        fprintf(stderr, "\rimatrix: %llu prompt%s, %llu token%s\033[K", (unsigned long long)prompts, ds4_plural(prompts),
                (unsigned long long)p->tokens, ds4_plural(p->tokens));
        fflush(stderr);
    }
    return cli_interrupted != 0;
}

int run_imatrix(ds4_engine *e, const cli_opts *o) {
    ds4_err err = {0};
    ds4_tokenizer *tok = NULL;
    if (e->vocab && !(tok = ds4_tokenizer_new(e->vocab, &err))) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return 1;
    }
    progress pr = {.show = cli_term_detect().err_tty};
    ds4_imatrix_run_opts ro = {
        .dataset = o->imatrix_dataset,
        .out = o->imatrix_out,
        .max_prompts = o->imatrix_max_prompts,
        .max_tokens = o->imatrix_max_tokens,
        .progress = on_prompt,
        .progress_ctx = &pr,
    };
    ds4_backend_opts bo = {.n_threads = o->threads, .ctx_size = o->ctx};
    ds4_imatrix_run_stats st;
    cli_interrupted = 0;
    cli_busy(true);
    int rc = ds4_imatrix_run(e->w, tok, &bo, &ro, &st, &err);
    cli_busy(false);
    if (pr.show && pr.tokens) fputs("\r\033[K", stderr);
    ds4_tokenizer_free(tok);
    if (rc != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return err.code == DS4_EINTERRUPTED ? 130 : 1;
    }
    fprintf(stderr, "ds4: wrote %s from %llu prompt%s, %llu token%s, %llu routed expert observations\n", o->imatrix_out,
            (unsigned long long)st.prompts, ds4_plural(st.prompts), (unsigned long long)st.tokens, ds4_plural(st.tokens),
            (unsigned long long)st.routes);
    return 0;
}
