/*
 * batcher.h - continuous batching: the engine's backend shared by many
 * sessions, each driven by its own thread, their rows run together.
 *
 * Without a batcher a session calls its backend directly (one thread at a
 * time).  With one, every backend call of every session goes through a
 * stepper thread: the rows the sessions submit (a decode token, a prefill
 * chunk, an MTP verification, an MTP draft) are packed into one step of up
 * to `budget` rows - so the routed experts' weights are read once for all
 * of them - and each session wakes with its own results; other calls
 * (snapshots, restores, marks, rewinds) run alone between steps.  A step
 * takes the short requests first (decode tokens, MTP verifications and
 * drafts: at most DS4_BATCH_SHORT_ROWS rows), then the longer ones (prefill
 * chunks) in arrival order with what is left of the budget - beside short
 * rows only the piece the pacer allows (pace.h: the step about 1.75 times
 * the short rows' step alone); a prefill chunk larger than that goes in
 * pieces over several steps, so a long prompt never stalls the sessions
 * decoding beside it.
 *
 * After a step the stepper waits a little for the sessions whose rows it
 * just ran to come back with their next rows (each picks its next token in
 * between), so that steady decoding sessions share every step instead of
 * alternating.  On the CPU a row's results do not depend on the other rows
 * of its step, so batching changes no token; on CUDA see docs/DESIGN.md.
 */
#ifndef DS4_ENGINE_BATCHER_H
#define DS4_ENGINE_BATCHER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "model/backend.h"

typedef struct ds4_batcher ds4_batcher;

/* Requests of at most this many rows go into a step before longer ones. */
#define DS4_BATCH_SHORT_ROWS 16

typedef struct ds4_batcher_stats {
    uint64_t steps;    /* batched steps run */
    uint64_t rows;     /* rows they ran */
    uint64_t max_rows; /* the most rows one step ran */
    uint64_t seqs;     /* sequences they advanced (summed over steps) */
    uint64_t max_seqs; /* the most sequences one step advanced */
    uint64_t calls;    /* other backend calls run between steps */
    double short_s;    /* the pacer's step of decoding rows alone, seconds (0: none yet; pace.h) */
    double piece;      /* the pacer's prefill piece beside them, rows, within the budget (0: none cut yet) */
} ds4_batcher_stats;

/* budget: rows a step may run (at most the backend's prefill chunk);
 * stretch: how many times the decoding rows' step alone a step with a
 * prefill piece beside them may take (pace.h; 0: no pacing, pieces up to
 * the budget). */
ds4_batcher *ds4_batcher_new(ds4_backend *b, uint32_t budget, double stretch, ds4_err *err);
void ds4_batcher_free(ds4_batcher *bt);

/* Run rows as part of the next step (mtp: an MTP step), waiting for their
 * results: ds4_backend_step's contract, from any thread. */
int ds4_batcher_step(ds4_batcher *bt, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp, ds4_err *err);

/* Run fn(ctx, err) on the backend between steps, waiting for it. */
int ds4_batcher_call(ds4_batcher *bt, int (*fn)(void *ctx, ds4_err *err), void *ctx, ds4_err *err);

ds4_batcher_stats ds4_batcher_get_stats(ds4_batcher *bt);

/* A step as ds4_backend_step (or ds4_backend_mtp_step), with a lone
 * sequence's plain rows through the single-sequence calls, which backends
 * may run faster (the CUDA decode graph). */
int ds4_run_rows(ds4_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp, ds4_err *err);

#endif
