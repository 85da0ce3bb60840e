/*
 * imatrix.c - `ds4 --imatrix-dataset FILE --imatrix-out OUT.dat`: collect a
 * routed-expert importance matrix for ds4-quantize --imatrix (as ds4's
 * option; docs/TOOLCHAIN.md), with --ctx, -t, --imatrix-max-prompts and
 * --imatrix-max-tokens, --imatrix-save-every, --resume, on the engine's
 * backend (--backend; the build's default).
 *
 * The collection itself is engine/imatrix_run.h, the same code ds4-imatrix
 * runs, so the two programs write identical files.  This file adds what an
 * interactive user needs: Ctrl+C (the first stops after the current
 * prompt, saving the progress for --resume, a second exits at once).
 */
#include <stdio.h>

#include "engine/imatrix_run.h"
#include "modes.h"
#include "runtime.h"

static int stop_requested(void *ctx) {
    (void)ctx;
    return cli_interrupted != 0;
}

int run_imatrix(ds4_engine *e, const cli_opts *o) {
    ds4_err err = {0};
    ds4_tokenizer *tok = NULL;
    if (e->vocab && !(tok = ds4_tokenizer_new(e->vocab, &err))) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return 1;
    }
    ds4_imatrix_run_opts ro = {
        .backend = e->backend_name,
        .dataset = o->imatrix_dataset,
        .out = o->imatrix_out,
        .max_prompts = o->imatrix_max_prompts,
        .max_tokens = o->imatrix_max_tokens,
        .save_every = o->imatrix_save_every,
        .resume = o->imatrix_resume,
        .show_progress = true,
        .stop = stop_requested,
    };
    ds4_backend_opts bo = {
        .n_threads = o->threads, .ctx_size = o->ctx, .gpu_mem = o->gpu_mem,
        .host_mapped = o->host_mapped, .expert_profile = e->profile};
    ds4_imatrix_run_stats st;
    cli_interrupted = 0;
    cli_busy(true);
    int rc = ds4_imatrix_run(e->w, tok, &bo, &ro, &st, &err);
    cli_busy(false);
    ds4_tokenizer_free(tok);
    if (rc != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return err.code == DS4_EINTERRUPTED ? 130 : 1;
    }
    fprintf(stderr, "ds4: wrote %s from %llu prompt%s, %llu token%s, %llu routed expert observations\n", o->imatrix_out,
            (unsigned long long)st.prompts, ds4_plural(st.prompts), (unsigned long long)st.tokens,
            ds4_plural(st.tokens), (unsigned long long)st.routes);
    return 0;
}
