/*
 * startup.h - what every program that runs the model does when it starts
 * (spec/PRODUCT.md 1, "Common conventions"): take the process-wide instance
 * lock (base/instance_lock.h) before loading anything, and tell the user
 * what the chosen context costs in memory.
 *
 * "Engine programs" are the ones that load weights to run them: ds4,
 * ds4-server, ds4-bench, ds4-forward, ds4-score, ds4-imatrix, ds4-qeval.
 * File tools (ds4-gguf, ds4-tokenizer, ds4-quantize, ds4-mkmodel, ...) take
 * no lock.
 */
#ifndef DS4_ENGINE_STARTUP_H
#define DS4_ENGINE_STARTUP_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

/* Exit status of a program that found the lock held by another process. */
#define DS4_EXIT_LOCKED 2

/* Take the instance lock.  On failure print "PROG: <why>" on stderr and
 * return the status to exit with: DS4_EXIT_LOCKED when another process
 * holds the lock, 1 when the lock file is unusable.  0 when taken. */
int ds4_startup_lock(const char *prog);

/* Bytes of every weight tensor (file or synthetic). */
uint64_t ds4_weights_bytes(const ds4_weights *w);

/* "12.3 MiB" style (bytes below 1 KiB as "N bytes"). */
const char *ds4_fmt_bytes(uint64_t bytes, char buf[32]);

/* "memory: weights W + context N tokens K = T": the weights plus the KV
 * state a session of ctx tokens holds (model/session_state.h). */
const char *ds4_memory_line(const ds4_weights *w, uint32_t ctx, char *buf, size_t len);

/* "PROG: backend NAME; <memory line>" on stderr. */
void ds4_startup_print_memory(const char *prog, const char *backend, const ds4_weights *w, uint32_t ctx);

#endif
