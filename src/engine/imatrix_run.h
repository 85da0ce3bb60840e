/*
 * imatrix_run.h - collecting a routed-expert importance matrix over a
 * prompt dataset (docs/TOOLCHAIN.md): the loop shared by
 * `ds4 --imatrix-dataset FILE --imatrix-out OUT.dat` and `ds4-imatrix`, so
 * both write the same bytes for the same model, dataset and limits.
 *
 * The dataset holds prompts separated by `===== DS4_IMATRIX_PROMPT ...`
 * lines (format/imatrix.h).  A prompt is either a list of token ids
 * (spaces, commas or newlines between them) or rendered text, tokenized
 * with every special token recognised (ds4_tokenize_transcript).  Each
 * prompt is prefilled from an empty context, cut to the context size and to
 * what is left of --imatrix-max-tokens; the forward pass reports each
 * routed expert's inputs to the collector (model/imatrix_collect.h), which
 * writes ds4's legacy .dat, with the dataset's file name in the trailer.
 *
 * Collection runs on the CPU backend: it is the one that reports expert
 * inputs (ds4_backend_opts.expert_observer).
 */
#ifndef DS4_ENGINE_IMATRIX_RUN_H
#define DS4_ENGINE_IMATRIX_RUN_H

#include <stdint.h>

#include "base/error.h"
#include "model/backend.h"
#include "model/weights.h"
#include "text/tokenizer.h"

typedef struct ds4_imatrix_run_opts {
    const char *dataset;   /* prompts file */
    const char *out;       /* .dat to write */
    uint64_t max_prompts;  /* stop after this many prompts; 0: all */
    uint64_t max_tokens;   /* stop after this many prompt tokens; 0: all */
    /* Called after each prompt with the count so far and that prompt's
     * tokens; nonzero stops the run (DS4_EINTERRUPTED, nothing written).
     * NULL: quiet. */
    int (*progress)(void *ctx, uint64_t prompts, uint32_t tokens);
    void *progress_ctx;
} ds4_imatrix_run_opts;

typedef struct ds4_imatrix_run_stats {
    uint64_t prompts, tokens;
    uint64_t routes;       /* routed (token, expert) pairs observed */
} ds4_imatrix_run_stats;

/* Run the dataset through a CPU backend over w (bo: context size, threads,
 * simulations; its observer fields are set here) and write the .dat.  tok
 * may be NULL when the model has no tokenizer: then only token-id prompts
 * work.  stats may be NULL. */
int ds4_imatrix_run(const ds4_weights *w, ds4_tokenizer *tok, const ds4_backend_opts *bo,
                    const ds4_imatrix_run_opts *o, ds4_imatrix_run_stats *stats, ds4_err *err);

#endif
