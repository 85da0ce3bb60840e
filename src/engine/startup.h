/*
 * startup.h - what every program that runs the model does when it starts
 * (as ds4's programs do; README.md): take the process-wide instance
 * lock (base/instance_lock.h) before loading anything, explain a missing
 * model file, tell the user what the chosen context costs in memory, and
 * (--warm-weights) read the weights in before the first token.
 *
 * "Engine programs" are the ones that load weights to run them: ds4,
 * ds4-server, ds4-bench, ds4-forward, ds4-score, ds4-imatrix, ds4-qeval,
 * ds4-eval, ds4-direction.
 * File tools (ds4-gguf, ds4-tokenizer, ds4-quantize, ds4-mkmodel, ...) take
 * no lock.
 */
#ifndef DS4_ENGINE_STARTUP_H
#define DS4_ENGINE_STARTUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

/* Exit status of a program that found the lock held by another process. */
#define DS4_EXIT_LOCKED      2
/* Exit status of a program stopped by Ctrl+C (128 + SIGINT, as shells
 * report it). */
#define DS4_EXIT_INTERRUPTED 130

/* Take the instance lock.  On failure print "PROG: <why>" on stderr and
 * return the status to exit with: DS4_EXIT_LOCKED when another process
 * holds the lock, 1 when the lock file is unusable.  0 when taken. */
int ds4_startup_lock(const char *prog);

/* 0 when the model file exists; else DS4_ENOTFOUND with an explanation of
 * where ds4 models come from (the message starts with the path). */
int ds4_model_file_check(const char *path, ds4_err *err);

/* Options of ds4's programs that this engine does not have (ds4's Metal
 * diagnostics): why, for a message that
 * says more than "unknown option"; NULL for any other name. */
const char *ds4_option_not_supported(const char *name);

/* "12.3 MiB" style (bytes below 1 KiB as "N bytes"). */
const char *ds4_fmt_bytes(uint64_t bytes, char buf[32]);

/* "memory: weights W + context N tokens K = T": the weights plus the KV
 * state a session of ctx tokens holds (model/session_state.h). */
const char *ds4_memory_line(const ds4_weights *w, uint32_t ctx, char *buf, size_t len);

/* "PROG: backend NAME; <memory line>" on stderr. */
void ds4_startup_print_memory(const char *prog, const char *backend, const ds4_weights *w, uint32_t ctx);

/* --warm-weights: read every page of the mapped model file (n_threads
 * readers, <= 0: all CPUs), so that the first tokens do not wait for the
 * disk page by page.  Matters where generation reads the mapping (the CPU
 * backend); the CUDA backend reads the whole file once anyway when it
 * copies the weights to the GPU.  *bytes: how much was read (0 for
 * synthetic weights, which have no file).  stop (may be NULL) is asked
 * between slices of the file: when it says true (Ctrl+C) the reading ends
 * with DS4_EINTERRUPTED. */
int ds4_weights_warm(const ds4_weights *w, int n_threads, bool (*stop)(void *ctx), void *stop_ctx, uint64_t *bytes,
                     ds4_err *err);

/* The same for the tensors of layers [first, end) only, with the embedding
 * when first is 0 and the output head when end is the last: a pipeline
 * stage's (docs/DISTRIBUTED.md). */
int ds4_weights_warm_layers(const ds4_weights *w, uint32_t first, uint32_t end, int n_threads, bool (*stop)(void *ctx),
                            void *stop_ctx, uint64_t *bytes, ds4_err *err);

/* ds4_weights_warm with a line on stderr ("PROG: warmed X of weights in
 * S s"); the error, if any, is printed too.  Returns the status to go on
 * with: 0, 1 after an error, DS4_EXIT_INTERRUPTED when stop said so. */
int ds4_startup_warm(const char *prog, const ds4_weights *w, int n_threads, bool (*stop)(void *ctx), void *stop_ctx);
/* ds4_weights_warm_layers with the same line. */
int ds4_startup_warm_layers(const char *prog, const ds4_weights *w, uint32_t first, uint32_t end, int n_threads,
                            bool (*stop)(void *ctx), void *stop_ctx);

/* A pipeline rank's --warm-weights (ds4_dist_opts.warm): ctx is a
 * ds4_warm_ctx naming the program and its threads. */
typedef struct ds4_warm_ctx {
    const char *prog;
    int n_threads;
} ds4_warm_ctx;
int ds4_startup_warm_stage(void *ctx, const ds4_weights *w, uint32_t first, uint32_t end);

#endif
