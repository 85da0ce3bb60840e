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
 * The backend calls ds4_imcol_expert() once per (layer, expert, batch of
 * tokens) from one thread at a time.
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

/* Count one prompt (the ncall of every entry). */
void ds4_imcol_end_prompt(ds4_imcol *col);

/* Routed (token, expert) pairs seen so far. */
uint64_t ds4_imcol_routes(const ds4_imcol *col);

/* Write the legacy .dat; `dataset` (may be NULL) goes in the trailer. */
int ds4_imcol_save(const ds4_imcol *col, const char *path, const char *dataset, ds4_err *err);

#endif
