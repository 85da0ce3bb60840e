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
 * Collection runs on the backend named (the build's default: cuda in CUDA
 * builds); the backend sums the routed experts' inputs into the collector
 * (ds4_backend_opts.imatrix; the CUDA backend on the device, read back at
 * each checkpoint and at the end).
 *
 * Checkpoints: every save_every prompts, when stopped (Ctrl+C; a prompt
 * that fails leaves the last checkpoint) and when a limit ends the run
 * before the dataset does, the collector's exact state goes to OUT.partial
 * (model/imatrix_collect.h, ds4_imcol_save_state) with how far the run
 * got; `resume` continues from it, so a run resumed after any stop ends
 * with the bytes the uninterrupted run writes.  A prompt cut by max_tokens
 * counts as done (a resumed run with a larger limit goes on with the next
 * one).  A run that reaches the dataset's end removes the checkpoint.
 *
 * Progress (show_progress): on a terminal a bar with prompts, tokens,
 * tokens/s and the time left; otherwise a line every 10 seconds.
 */
#ifndef DS4_ENGINE_IMATRIX_RUN_H
#define DS4_ENGINE_IMATRIX_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "model/backend.h"
#include "model/weights.h"
#include "text/tokenizer.h"

typedef struct ds4_imatrix_run_opts {
    const char *backend;  /* backend name (NULL: the build's default) */
    const char *dataset;  /* prompts file */
    const char *out;      /* .dat to write; its checkpoint is OUT.partial */
    uint64_t max_prompts; /* stop after this many prompts; 0: all */
    uint64_t max_tokens;  /* stop after this many prompt tokens; 0: all */
    uint64_t save_every;  /* prompts between checkpoints (0: DS4_IMATRIX_SAVE_EVERY) */
    bool resume;          /* continue from OUT.partial */
    bool show_progress;   /* the progress bar or lines on stderr */
    /* Called after each prompt; nonzero stops the run (DS4_EINTERRUPTED,
     * after a checkpoint; the .dat is not written).  NULL: never. */
    int (*stop)(void *ctx);
    void *stop_ctx;
} ds4_imatrix_run_opts;

/* A checkpoint reads every sum back and writes them (0.5 GiB for Flash,
 * about a second): every 256 prompts keeps that near 1 % of a GPU run's
 * time and loses at most a few minutes of it to a crash. */
#define DS4_IMATRIX_SAVE_EVERY 256

typedef struct ds4_imatrix_run_stats {
    uint64_t prompts, tokens;
    uint64_t routes; /* routed (token, expert) pairs observed */
} ds4_imatrix_run_stats;

/* Run the dataset through a backend over w (bo: context size, threads,
 * simulations, GPU budget; its imatrix field is set here) and write the
 * .dat.  stats count the whole run (resumed parts too).  tok
 * may be NULL when the model has no tokenizer: then only token-id prompts
 * work.  stats may be NULL. */
int ds4_imatrix_run(const ds4_weights *w, ds4_tokenizer *tok, const ds4_backend_opts *bo, const ds4_imatrix_run_opts *o,
                    ds4_imatrix_run_stats *stats, ds4_err *err);

#endif
