/*
 * generate.h - the token generation loop shared by every program.
 *
 * Starting from a session whose logits are ready (after a sync), pick a
 * token, hand it to the caller, append it, repeat.  The caller's callback
 * sees each token before it is appended and decides whether to go on; it
 * can also ask for the next token to be chosen greedily (the server does
 * this inside DSML tool-call syntax) or for the EOS token to be excluded
 * (the benchmark).  Generation ends at EOS, at max_tokens, when the context
 * is full (or the session may not grow further: the caller's grow hook),
 * when the callback says stop, or when *cancel becomes nonzero
 * (Ctrl+C, a client that went away); the session stays consistent in every
 * case: it holds exactly the prompt plus the tokens appended, which are all
 * the tokens handed out except the last one when generation ended at EOS,
 * max_tokens, a full context or a callback stop (its logits are not needed;
 * the next sync appends it), and all of them when it was cancelled.
 */
#ifndef DS4_ENGINE_GENERATE_H
#define DS4_ENGINE_GENERATE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h" /* ds4_now, for the timing lines programs print */
#include "base/error.h"
#include "engine/sampler.h"
#include "engine/session.h"

typedef enum ds4_finish {
    DS4_FINISH_NONE = 0,
    DS4_FINISH_EOS,       /* the model ended its turn */
    DS4_FINISH_LENGTH,    /* max_tokens reached or the context is full */
    DS4_FINISH_CALLBACK,  /* the callback asked to stop (stop sequence, tool call closed) */
    DS4_FINISH_CANCELLED, /* *cancel was set */
    DS4_FINISH_ERROR,     /* the backend failed (see the error) */
} ds4_finish;

const char *ds4_finish_name(ds4_finish f);

/* What the callback can ask for the next step. */
typedef struct ds4_gen_control {
    bool stop;        /* end generation after this token */
    bool greedy_next; /* choose the next token by argmax */
    bool append;      /* append this token to the session (default true) */
} ds4_gen_control;

typedef void (*ds4_gen_token_fn)(void *ctx, int32_t token, ds4_gen_control *ctl);

typedef struct ds4_gen_opts {
    uint32_t max_tokens; /* 0: until the context is full */
    bool exclude_eos;    /* never sample EOS (benchmarks) */
    volatile sig_atomic_t *cancel;
    /* Tokens chosen instead of sampling for the first n_forced steps (the
     * server's test hook drives a known continuation through the real
     * pipeline); sampling resumes after them, or at the first one the
     * restrict hook does not allow (a forced continuation stands for what
     * the model would sample, which a constraint overrides). */
    const int32_t *forced;
    uint32_t n_forced;
    /* Optional: restrict the next token (constrained decoding): called
     * before each step with a copy of the logits, in which it sets what may
     * not come next to -INFINITY. */
    void (*restrict_fn)(void *ctx, float *logits, int n_vocab);
    void *restrict_ctx;
    /* Optional, for a sized session (session.h) whose growth the caller
     * admits (the server's memory budget): called when the next token
     * would not fit the session's capacity, with the tokens the session
     * must then have room for.  It returns 0 once it made that room
     * (ds4_session_reserve), nonzero when the session may not grow:
     * generation then ends there, finish LENGTH, as at a full context.
     * MTP drafts are limited to the room the session has, never grown
     * for.  NULL: the session grows by itself as it needs. */
    int (*grow_fn)(void *ctx, uint32_t need);
    void *grow_ctx;
} ds4_gen_opts;

typedef struct ds4_gen_result {
    ds4_finish finish;
    uint32_t n_generated; /* tokens handed to the callback */
    uint32_t nan_steps;   /* of which were chosen from logits holding NaN
                                 * (broken weights or kernels: programs warn) */
    double seconds;       /* wall time of the loop */
} ds4_gen_result;

/* Returns 0 (see res->finish) or -1 on a backend error (finish ERROR).
 * smp NULL: every token is the argmax. */
int ds4_generate(ds4_session *s, ds4_sampler *smp, const ds4_gen_opts *opts, ds4_gen_token_fn fn, void *ctx,
                 ds4_gen_result *res, ds4_err *err);

#endif
