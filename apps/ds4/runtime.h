/*
 * runtime.h - what every ds4 mode shares around the engine: opening the
 * model (with a helpful message when the file is missing), the memory
 * estimate printed at startup, Ctrl+C handling and the terminal.
 *
 * Ctrl+C sets a flag that the prefill progress callback and the generation
 * loop poll, so work stops at the next chunk or token with the session
 * consistent; a second Ctrl+C while that work is still running exits at
 * once (status 130), for a prefill chunk that takes too long.  While the
 * model loads there is nothing to keep: the first Ctrl+C exits at once.
 * A Ctrl+C that comes before the work starts (during --warm-weights, the
 * tokenizer, anything) is not forgotten: the work stops before it begins,
 * and the one-shot modes exit with status 130.  Only the REPL clears the
 * flag, when it reads a new line.
 */
#ifndef DS4_CLI_RUNTIME_H
#define DS4_CLI_RUNTIME_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"
#include "engine/startup.h"
#include "options.h"

/* Set by SIGINT; cleared by whoever starts new work. */
extern volatile sig_atomic_t cli_interrupted;

/* Install the SIGINT handler (no SA_RESTART: a blocked read returns EINTR). */
void cli_signals_init(void);
/* Mark a stretch of model work: a second Ctrl+C inside it exits. */
void cli_busy(bool busy);
/* Mark the model loading: a Ctrl+C inside it exits at once. */
void cli_loading(bool loading);
/* Whether Ctrl+C was pressed (a stop callback: ds4_startup_warm). */
bool cli_stop_requested(void *ctx);
/* A warning on stderr when generation chose tokens from NaN logits. */
void cli_warn_nan(uint32_t nan_steps, uint32_t steps);
/* "ds4: interrupted" on stderr; returns the exit status, 130. */
int cli_report_interrupt(void);

/* Open the model named by the options (tokenizer required).  A missing file
 * gets an explanation of where models come from. */
ds4_engine *cli_engine_open(const cli_opts *o, ds4_dist *d, ds4_err *err);

/* The startup line: weights + KV state for ctx tokens on the backend
 * (engine/startup.h, shared by every engine program). */
void cli_print_memory(const ds4_engine *e, uint32_t ctx);

/* Terminal facts, decided once. */
typedef struct cli_term {
    bool out_tty; /* stdout: colours for thinking text */
    bool err_tty; /* stderr: prefill progress line */
} cli_term;
cli_term cli_term_detect(void);

/* Prefill progress for ds4_session_sync: "processing N input tokens: x/N
 * (p%)" on a terminal, and the Ctrl+C check.  ctx is a cli_progress. */
typedef struct cli_progress {
    bool show;
    bool shown;
} cli_progress;
/* Draw the line before the first chunk (total: tokens to prefill). */
void cli_progress_start(cli_progress *p, uint32_t total);
int cli_progress_fn(void *ctx, uint32_t done, uint32_t total);
/* Erase the progress line if one was drawn. */
void cli_progress_clear(cli_progress *p);

#endif
