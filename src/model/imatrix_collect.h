/*
 * imatrix_collect.h - accumulating an importance matrix for the routed
 * experts while the forward pass runs (docs/TOOLCHAIN.md, ds4-imatrix).
 *
 * For every routed expert of every layer the collector sums, per input
 * column, x^2 over the tokens routed to that expert:
 *   gate and up (w1, w3): x = the normalised FFN input of the token;
 *   down (w2):            x = the token's SwiGLU row after the routing
 *                          weight, i.e. what the down projection reads.
 * Saved as ds4's legacy `.dat` (format/imatrix.h): one entry per routed
 * tensor, named like the GGUF tensor, n_expert consecutive vectors, ncall =
 * the number of prompts.  Sums are kept in double so long datasets do not
 * lose the small contributions.
 *
 * A backend made with the collector (ds4_backend_opts.imatrix) adds to it:
 * the CPU backend calls ds4_imcol_expert() once per (layer, expert, batch
 * of tokens); the CUDA backend sums on the device and adds a layer's sums
 * at a time with ds4_imcol_add_sums() when asked (ds4_backend_imatrix_flush).
 * One thread at a time.
 *
 * A run that stops part way keeps its state in a checkpoint
 * (ds4_imcol_save_state): the sums in double, bit for bit, so that a
 * resumed run ends with the bytes an uninterrupted one writes.
 */
#ifndef DS4_MODEL_IMATRIX_COLLECT_H
#define DS4_MODEL_IMATRIX_COLLECT_H

#include <stdint.h>

#include "base/error.h"
#include "model/config.h"

typedef struct ds4_imcol ds4_imcol;

ds4_imcol *ds4_imcol_new(const ds4_config *c, ds4_err *err);
void ds4_imcol_free(ds4_imcol *col);

/* m tokens routed to expert e of layer il: x is m rows of n_embd (the FFN
 * input), mid m rows of n_ff_exp (the down projection's input). */
void ds4_imcol_expert(ds4_imcol *col, uint32_t il, uint32_t e, uint32_t m, const float *x, const float *mid);

/* Layer il's sums of another accumulator: in (n_expert x n_embd), mid
 * (n_expert x n_ff_exp), and the routed (token, expert) pairs they hold. */
void ds4_imcol_add_sums(ds4_imcol *col, uint32_t il, const double *in, const double *mid, uint64_t routes);

/* Count one prompt (the ncall of every entry). */
void ds4_imcol_end_prompt(ds4_imcol *col);

/* Routed (token, expert) pairs seen so far. */
uint64_t ds4_imcol_routes(const ds4_imcol *col);

/* Write the legacy .dat; `dataset` (may be NULL) goes in the trailer. */
int ds4_imcol_save(const ds4_imcol *col, const char *path, const char *dataset, ds4_err *err);

/* Where a run over a dataset stands (saved with a checkpoint): the dataset's
 * prompts consumed (the skipped empty ones too), the prompt tokens
 * prefilled, and what identifies the run (the dataset's size in bytes, the
 * context size: a checkpoint of another run is refused). */
typedef struct ds4_imcol_progress {
    uint64_t consumed, tokens;
    uint64_t dataset_bytes;
    uint32_t ctx;
} ds4_imcol_progress;

/* A checkpoint: the shapes, the progress, the prompt and route counts and
 * every sum as a double, written through a temporary file renamed into
 * place. */
int ds4_imcol_save_state(const ds4_imcol *col, const char *path, const ds4_imcol_progress *p, ds4_err *err);

/* Load a checkpoint into a fresh collector (same shapes) and its progress;
 * a file of other shapes, truncated or not a checkpoint is an error naming
 * the file. */
int ds4_imcol_load_state(ds4_imcol *col, const char *path, ds4_imcol_progress *p, ds4_err *err);

/* Prompts counted so far. */
int32_t ds4_imcol_prompts(const ds4_imcol *col);

#endif
