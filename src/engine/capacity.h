/*
 * capacity.h - how many sessions of a context size the memory holds: the
 * arithmetic behind ds4-server's --parallel (docs/SERVER.md), a pure
 * function of the figures the backend and the host report.
 *
 * A session draws on one memory or two: the host's (its token list, its
 * in-memory checkpoint, and on the CPU its KV state) and a GPU's (its KV
 * state on CUDA).  Each memory (a pool) has
 *   room     what it can still give: the host's MemAvailable, the GPU's
 *            free memory less the runtime's reserve (model/backend.h:
 *            ds4_seq_memory)
 *   weights  what of that room stays with the model's weights: the pages
 *            of the mapped file a backend reads from host memory
 *   shared   what is needed once however many sessions there are (the
 *            state the disk KV cache loads into and saves from)
 *   per      what one session takes, its state sized for the whole context
 * A given --parallel N must fit every pool:
 *   N x per + shared <= room - weights
 * Without one, N is as many as three quarters of (room - weights - shared)
 * hold in every pool (a quarter left for everything else: buffers, other
 * programs), at least 1 and at most `max`.  A pool whose room is not known
 * (0) constrains nothing.
 */
#ifndef DS4_ENGINE_CAPACITY_H
#define DS4_ENGINE_CAPACITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct ds4_mem_pool {
    const char *name; /* "memory", "GPU memory": for messages */
    uint64_t room, weights, shared, per;
} ds4_mem_pool;

typedef struct ds4_capacity {
    uint32_t n;    /* sessions to make */
    bool measured; /* a pool's room was known: n is what the memory holds */
    uint64_t fits; /* sessions the tightest pool holds (its usable part without
                    * --parallel, all of it with); UINT64_MAX when not measured */
} ds4_capacity;

/* The sessions of ctx tokens to make: `given` (0: none) checked against
 * every pool, or sized from them (at most max).  A given N that does not
 * fit is DS4_ENOMEM, the message naming the memory needed and the memory
 * available ("--parallel N: N sessions of CTX tokens need ..."). */
int ds4_capacity_plan(const ds4_mem_pool *pools, size_t n_pools, uint32_t ctx, uint32_t given, uint32_t max,
                      ds4_capacity *out, ds4_err *err);

/* Pool p's arithmetic for n sessions, one clause for a log line: with
 * given, "memory: 4 x 1.0 MiB + 2.0 MiB shared = 6.0 MiB of 10.0 GiB
 * available beside 1.0 GiB of weights"; without, "memory: 10.0 GiB
 * available - 1.0 GiB weights - 2.0 MiB shared, 3/4 of it holds 6911
 * sessions of 1.0 MiB".  "memory: not known" when its room is not. */
const char *ds4_capacity_explain(const ds4_mem_pool *p, uint32_t n, bool given, char *buf, size_t len);

#endif
