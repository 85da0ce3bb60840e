/*
 * capacity.h - the memory ds4-server's sessions may take and how many of
 * them there are: the arithmetic behind --parallel and --kv-mem-mb
 * (docs/SERVER.md), a pure function of the figures the backend and the
 * host report.
 *
 * A session's state is sized for what it holds (engine/session.h, sized
 * sessions): from `least` bytes (its fewest tokens, a granule) to `most`
 * (the whole context).  It draws on one memory or two: the host's (its
 * token list, its in-memory checkpoint, and on the CPU its KV state) and a
 * GPU's (its KV state on CUDA).  Each memory (a pool) has
 *   room     what it can still give: the host's MemAvailable, the GPU's
 *            free memory less the runtime's reserve (model/backend.h:
 *            ds4_seq_memory)
 *   weights  what of that room stays with the model's weights: the pages
 *            of the mapped file a backend reads from host memory
 *   shared   what is needed once however many sessions there are (the
 *            state the disk KV cache loads into and saves from, the
 *            backend's main sequence at its least)
 *   given    the sessions' bytes the user set (--kv-mem-mb), or 0
 * The sessions' budget in a pool is `given`, else three quarters of
 * room - weights - shared (a quarter left for everything else: buffers,
 * other programs), at least one session of the least; a pool whose room is
 * not known (0) and has no given budget constrains nothing.  Every running request holds the bytes of its
 * session's size; the scheduler admits a request when they fit what the
 * others hold.  --parallel N bounds the sessions: N of the least must fit
 * every budget; without it N is as many as the budgets hold of the least,
 * at least 1 and at most `max`.
 */
#ifndef DS4_ENGINE_CAPACITY_H
#define DS4_ENGINE_CAPACITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

typedef struct ds4_mem_pool {
    const char *name; /* "memory", "GPU memory": for messages */
    uint64_t room, weights, shared, given;
    uint64_t least, most; /* a session of the fewest tokens, of the whole context */
    uint64_t budget;      /* set by ds4_capacity_plan; UINT64_MAX: not known */
} ds4_mem_pool;

typedef struct ds4_capacity {
    uint32_t n;    /* sessions to make */
    bool measured; /* a pool's budget was known: n is what the memory holds */
    uint64_t fits; /* sessions of the least the tightest budget holds; UINT64_MAX when not known */
} ds4_capacity;

/* Tokens a sized session of a context grows by: a sixteenth of it as a
 * power of two, 256 to 4096 (a short context still has several sizes, a
 * long one no more steps than it needs). */
uint32_t ds4_ctx_granule(uint32_t ctx);

/* The pools' budgets, and the sessions to make: `given` (0: none) checked
 * against every budget, or sized from them (at most max).  A pool whose
 * budget does not hold one session of the least, or a given N that does
 * not fit, is DS4_ENOMEM, the message naming the memory needed and the
 * memory available ("--parallel N: N sessions of at least T tokens need
 * ..."). */
int ds4_capacity_plan(ds4_mem_pool *pools, size_t n_pools, uint32_t least_tokens, uint32_t given, uint32_t max,
                      ds4_capacity *out, ds4_err *err);

/* Pool p's arithmetic, one clause for a log line: "memory: 6.0 GiB for
 * sessions (3/4 of 10.0 GiB available - 2.0 GiB weights), 6144 of the
 * least or 6 of the most at once"; "memory: 64.0 MiB for sessions
 * (--kv-mem-mb), ..."; "memory: not known". */
const char *ds4_capacity_explain(const ds4_mem_pool *p, char *buf, size_t len);

#endif
