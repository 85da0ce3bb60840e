/*
 * backend.h - the interface every compute backend implements, at the level
 * of a whole model step (DESIGN.md, "Backends").
 *
 * A backend owns the state of one sequence and runs the complete forward
 * pass of spec/MODEL.md 5-7 over it:
 *
 *   prefill(tokens, n)   append n tokens (batched, layer-major); optionally
 *                        return the logits of every one of them
 *   decode(token)        append one token
 *   logits()             logits for the next token (after the last one)
 *   reset()              back to zero tokens
 *   greedy(n)            append n tokens, each the argmax of the logits
 *                        before it (optional: backends that can keep the
 *                        loop on the device provide it; otherwise the
 *                        generic loop of ds4_backend_greedy runs)
 *   snapshot / restore   copy the state to / from a backend-neutral
 *                        ds4_kv_state in host memory, which also
 *                        (de)serialises as a DSV4 payload (session_state.h)
 *
 * Prefill and token-by-token decode are defined to give the same logits
 * (MODEL.md 7); the CPU backend makes them bit-identical.  The low-precision
 * simulations of MODEL.md 4.3-4.4 (FP8 KV, Hadamard+FP4 indexer, f16 raw
 * rows) are on unless `no_sim` is set; with them off the forward pass is the
 * one HF transformers computes.
 */
#ifndef DS4_MODEL_BACKEND_H
#define DS4_MODEL_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "model/session_state.h"
#include "model/weights.h"

typedef struct ds4_backend_opts {
    int n_threads;          /* <= 0: all online CPUs (or $DS4_THREADS); the
                             * backend's copy holds the count in use */
    uint32_t ctx_size;      /* tokens the session can hold; 0: 4096 */
    uint32_t prefill_chunk; /* tokens per batched pass; 0: 2048 */
    bool no_sim;            /* turn the low-precision simulations off */
    /* Called for every routed expert the forward pass runs: the m tokens of
     * layer il routed to expert e, with their FFN input rows (x: m x n_embd,
     * normalised) and the down projection's input rows (mid: m x n_ff_exp,
     * clamped SwiGLU times the routing weight).  For the imatrix collector
     * (model/imatrix_collect.h); NULL for none.  One call at a time. */
    void (*expert_observer)(void *ctx, uint32_t il, uint32_t e, uint32_t m, const float *x, const float *mid);
    void *observer_ctx;
} ds4_backend_opts;

typedef struct ds4_backend ds4_backend;

typedef struct ds4_backend_ops {
    const char *name;
    void (*free)(ds4_backend *b);
    int (*prefill)(ds4_backend *b, const uint32_t *tokens, uint32_t n, float *all_logits, ds4_err *err);
    int (*decode)(ds4_backend *b, uint32_t token, ds4_err *err);
    const float *(*logits)(ds4_backend *b);
    void (*reset)(ds4_backend *b);
    int (*snapshot)(ds4_backend *b, ds4_kv_state *out, ds4_err *err);
    int (*restore)(ds4_backend *b, const ds4_kv_state *in, ds4_err *err);
    int (*greedy)(ds4_backend *b, uint32_t n, uint32_t *out, ds4_err *err); /* may be NULL */
} ds4_backend_ops;

struct ds4_backend {
    const ds4_backend_ops *ops;
    const ds4_weights *w;
    ds4_backend_opts opts;
};

/* 0 when this build has the named backend (NULL: the default); else why
 * not ("metal", "cuda" in a CPU build, unknown names).  Programs check
 * before loading the model. */
int ds4_backend_check_name(const char *name, ds4_err *err);

/* Create the named backend ("cpu"; "cuda" in CUDA builds) over loaded
 * weights, which must outlive it. */
ds4_backend *ds4_backend_create(const char *name, const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* The CPU reference backend (src/model/cpu/). */
ds4_backend *ds4_cpu_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* The CUDA backend (src/model/cuda/, CUDA builds only).  Also accepts
 * synthetic weights (ds4_weights_synthetic), which it fills on the GPU.
 * Its prefill chunk defaults to 2048. */
ds4_backend *ds4_cuda_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* CUDA builds: the device's copy bandwidth (bytes read + written per second,
 * a large device-to-device copy, best of several), and its name. */
int ds4_cuda_copy_bandwidth(double *bytes_per_s, char *name, size_t name_len, ds4_err *err);

static inline void ds4_backend_free(ds4_backend *b) { if (b) b->ops->free(b); }

/* Append n tokens.  `all_logits` (n * n_vocab floats) may be NULL; when
 * given it receives the logits after each token. */
static inline int ds4_backend_prefill(ds4_backend *b, const uint32_t *tokens, uint32_t n, float *all_logits, ds4_err *err) {
    return b->ops->prefill(b, tokens, n, all_logits, err);
}
static inline int ds4_backend_decode(ds4_backend *b, uint32_t token, ds4_err *err) {
    return b->ops->decode(b, token, err);
}
/* n_vocab logits for the next token; NULL before the first token. */
static inline const float *ds4_backend_logits(ds4_backend *b) { return b->ops->logits(b); }
static inline void ds4_backend_reset(ds4_backend *b) { b->ops->reset(b); }
static inline int ds4_backend_snapshot(ds4_backend *b, ds4_kv_state *out, ds4_err *err) {
    return b->ops->snapshot(b, out, err);
}
static inline int ds4_backend_restore(ds4_backend *b, const ds4_kv_state *in, ds4_err *err) {
    return b->ops->restore(b, in, err);
}

/* Append n greedy tokens (the first is the argmax of the current logits;
 * out receives them).  Needs logits (a prefill or decode before). */
int ds4_backend_greedy(ds4_backend *b, uint32_t n, uint32_t *out, ds4_err *err);

/* A state sized for this backend's session (to snapshot into). */
ds4_kv_state *ds4_backend_state_new(const ds4_backend *b, ds4_err *err);

/* Resolved options (defaults filled in). */
ds4_backend_opts ds4_backend_opts_resolve(const ds4_backend_opts *opts);

#endif
