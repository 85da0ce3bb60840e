/*
 * backend.h - the interface every compute backend implements, at the level
 * of a whole model step (docs/DESIGN.md 3.1).
 *
 * A backend runs the complete forward pass of docs/MODEL.md 5-7 over the
 * states of sequences (ds4_seq) it holds:
 *
 *   step(rows)           one pass over rows (sequence, token) of any
 *                        sequences: each appends its token; the logits and
 *                        the final hidden state of chosen rows come back
 *   mark(seq)            remember seq's length as a point to come back to
 *   rewind(seq, n)       take back rows appended since the mark, exactly
 *                        (rejected MTP drafts)
 *   prefill(seq, tokens) append n tokens (chunked passes, layer-major);
 *                        optionally return the logits of every one of them
 *   decode(seq, token)   append one token
 *   logits(seq)          logits for the next token (after the last one)
 *   reset(seq)           back to zero tokens
 *   greedy(seq, n)       append n tokens, each the argmax of the logits
 *                        before it (optional: backends that can keep the
 *                        loop on the device provide it; otherwise the
 *                        generic loop of ds4_seq_greedy runs)
 *   snapshot / restore   copy a sequence's state to / from a backend-neutral
 *                        ds4_kv_state in host memory, which also
 *                        (de)serialises as a DSV4 payload (session_state.h)
 *
 * Every backend has a main sequence, made with it, which the
 * ds4_backend_prefill / decode / ... calls act on: programs that run one
 * stream never see sequences.  Many tokens in flight (MTP verification,
 * many sessions at once, prefill chunks beside decoding) are steps over
 * rows of several sequences or several rows of one.
 *
 * Prefill and token-by-token decode are defined to give the same logits
 * (MODEL.md 7); the CPU backend makes them bit-identical, and a row's
 * result there does not depend on the other rows of its step.  The
 * low-precision simulations of MODEL.md 4.3-4.4 (FP8 KV, Hadamard+FP4
 * indexer, f16 raw rows) are on unless `no_sim` is set; with them off the
 * forward pass is the one HF transformers computes.
 *
 * This header is what a backend implements and what its callers use;
 * model/backends.h names the backends a build has and creates them.
 */
#ifndef DS4_MODEL_BACKEND_H
#define DS4_MODEL_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "model/session_state.h"
#include "model/weights.h"

/* A session's size in tokens: the one default and the one bound every
 * program's -c/--ctx and the library share (engine/cli.h). */
#define DS4_CTX_DEFAULT 32768u   /* tokens a session holds unless told otherwise */
#define DS4_CTX_MAX     1048576u /* the longest context accepted: the model's trained one */

/* ds4_backend_opts.host_experts */
enum { DS4_HOST_AUTO = 0, DS4_HOST_CPU = 1, DS4_HOST_STREAM = 2 };

typedef struct ds4_backend_opts {
    int n_threads;           /* <= 0: all online CPUs (or $DS4_THREADS); the
                             * backend's copy holds the count in use */
    uint32_t ctx_size;       /* the most tokens any sequence may hold, and what
                             * the main sequence holds unless main_ctx says
                             * otherwise; 0: DS4_CTX_DEFAULT */
    uint32_t main_ctx;       /* tokens the main sequence holds when made (at
                             * most ctx_size; 0: ctx_size): a backend that
                             * resizes sequences (ds4_seq_resize) lets it grow
                             * as the session that holds it needs */
    uint32_t prefill_chunk;  /* tokens per batched pass; 0: 2048 */
    bool no_sim;             /* turn the low-precision simulations off */
    uint32_t cuda_graph_ctx; /* CUDA: context of the smallest captured decode
                              * graph (0: 8192; docs/DESIGN.md 4.2); tests
                              * set small ones so that short sequences cross
                              * graphs.  Ignored by the CPU backend. */
    /* CUDA: bytes the backend may allocate on the GPU (0: the device's free
     * memory less a reserve for the runtime).  What does not fit of the
     * routed experts stays in host RAM, computed there (docs/DESIGN.md
     * 3.5); expert_profile, when given, decides which experts go on the
     * GPU first (model/placement.h; NULL: whole layers from the first).
     * Ignored by the CPU backend. */
    uint64_t gpu_mem;
    const struct ds4_expert_profile *expert_profile;
    /* CUDA: the GPU the backend runs on (a CUDA device index: 0 is the
     * first the process sees).  Each of its calls makes it the calling
     * thread's current device.  Ignored by the CPU backend. */
    int gpu;
    /* CUDA: sequences of ctx_size tokens that will be made besides the
     * main one (ds4-server's sessions): the placement leaves room for
     * their state within the budget, routed experts going to host RAM for
     * it where they must (none when they do not fit even with all of
     * them there).  Ignored by the CPU backend. */
    uint32_t extra_seqs;
    /* CUDA: count every pass's routed-expert selections, for an expert
     * profile (ds4_cuda_expert_counts).  Ignored by the CPU backend. */
    bool count_experts;
    /* CUDA, for the tests that check both ways: how a prefill pass computes
     * the host experts (DS4_HOST_*; 0: the cheaper by the measured costs) */
    int host_experts;
    /* CUDA: the percentage of each layer's host experts the GPU reads
     * itself from pinned host memory in decode steps (the mapped tier,
     * cuda_offload.h), beside the CPU's: 0, by the measured costs; -1,
     * none (for the tests that check each way) */
    int host_mapped;
    /* A pipeline stage (docs/DISTRIBUTED.md): the backend runs layers
     * [layer_first, layer_end) only and keeps only their state, and is
     * advanced by ds4_backend_stage_step.  Both 0: the whole model.  The
     * CPU and CUDA backends run stages (a CUDA stage refuses what it does
     * not run: MTP, routed experts in host RAM, steering, the imatrix). */
    uint32_t layer_first, layer_end;
    /* CUDA: tensor parallelism (docs/DISTRIBUTED.md 7) over the host's GPUs
     * 0 .. tensor_parallel - 1 (0 or 1: none): ds4_backend_create makes a
     * backend of each GPU's share of every layer, run side by side, their
     * partial sums added by NCCL.  tp_rank and tp_clique (the NCCL
     * communicators) are set for each of those; a caller leaves them 0. */
    uint32_t tensor_parallel;
    uint32_t tp_rank;
    struct ds4_cuda_clique *tp_clique;
    /* the MTP block (weights.h), or NULL: the backend can then run MTP
     * sequences; it must outlive the backend */
    const struct ds4_mtp_weights *mtp;
    /* directional steering (model/steering.h): the directions, or NULL;
     * the scales are each sequence's (ds4_seq_set_steering).  It must
     * outlive the backend. */
    const struct ds4_steering *steer;
    /* The importance-matrix collector (model/imatrix_collect.h) that the
     * routed experts' inputs of every main-model layer are summed into: the
     * FFN input rows (normalised) and the down projection's input rows
     * (clamped SwiGLU times the routing weight) of the tokens routed to
     * each expert; NULL for none.  The CPU backend adds each expert's rows
     * as it runs it (prefill and decode).  The CUDA backend sums its
     * prefill passes on the device (decode steps are not summed) and adds
     * them to the collector at ds4_backend_imatrix_flush (model/backends.h);
     * with routed experts in host RAM its prefill streams them to the GPU. */
    struct ds4_imcol *imatrix;
    /* Called with the sublayer outputs of main-model layer il at the
     * steering points (after steering, before the HC post): the attention
     * output (ffn false) and the FFN output (ffn true) of the pass's T rows,
     * T x n_embd floats.  For ds4-direction; NULL for none. */
    void (*act_observer)(void *ctx, uint32_t il, bool ffn, uint32_t T, const float *y);
    void *act_ctx;
} ds4_backend_opts;

typedef struct ds4_backend ds4_backend;

/* A sequence: one token stream's state inside a backend (its KV rows,
 * compressor frontiers and indexer rows: the content of a ds4_kv_state,
 * wherever the backend keeps it).  A backend makes one at creation, its
 * main sequence, which the single-sequence calls below act on; it can
 * make more (seq_new) and advance any number of them in one step. */
typedef struct ds4_seq {
    ds4_backend *owner; /* the backend that made it; backends extend the struct */
    /* steering scales after the FFN and the attention output (0: off),
     * used when the backend has directions (ds4_backend_opts.steer) */
    float steer_ffn, steer_attn;
} ds4_seq;

/* The steering scales of s's next rows (model/steering.h).  What s holds
 * was computed with the scales of its time: a caller that changes them
 * keeps or drops that state as it sees fit (engine/session.h drops it). */
static inline void ds4_seq_set_steering(ds4_seq *s, float ffn, float attn) {
    s->steer_ffn = ffn;
    s->steer_attn = attn;
}

/* What a step returns for a row (a set of them). */
enum {
    DS4_ROW_LOGITS = 1, /* the logits after the row's token */
    DS4_ROW_HIDDEN = 2, /* the residual after the last layer: n_hc x n_embd floats (the MTP block's input) */
    DS4_ROW_REWIND = 4, /* the step keeps what ds4_backend_rewind needs to take this row back, its
                         * logits included: the sequence must have a mark (ds4_backend_mark) and
                         * every one of its rows in the step must say so */
};

/* Rows a sequence may append after its mark (ds4_backend_mark): one MTP
 * cycle's verification (draft + 1 <= 17 rows) or drafts (<= 15). */
#define DS4_REWIND_MAX 32

/* One row of a step: the next token of a sequence.  A row of an MTP
 * step (ds4_backend_mtp_step) pairs its token with a final residual the
 * backend keeps: that of sequence hseq at position hpos (the main model's
 * at the position before the token, or the MTP sequence's own last one
 * for a draft after a draft).  Backends made with opts.mtp keep the final
 * residuals of every sequence's last DS4_HIDDEN_KEEP positions. */
typedef struct ds4_row {
    ds4_seq *seq;
    uint32_t token;
    uint32_t want; /* DS4_ROW_* */
    ds4_seq *hseq; /* MTP rows */
    uint32_t hpos;
} ds4_row;

/* A row of sequence s: token, and what the step returns for it. */
static inline ds4_row ds4_row_of(ds4_seq *s, uint32_t token, uint32_t want) {
    ds4_row r = {s, token, want, NULL, 0};
    return r;
}

/* A row of MTP sequence s: token paired with the residual of hseq at hpos. */
static inline ds4_row ds4_mtp_row(ds4_seq *s, uint32_t token, uint32_t want, ds4_seq *hseq, uint32_t hpos) {
    ds4_row r = {s, token, want, hseq, hpos};
    return r;
}

/* Positions whose final residual a sequence keeps (backends with MTP): a
 * row overwrites the residual of the position this many before it, which
 * a rewind does not bring back. */
#define DS4_HIDDEN_KEEP 128

/* Where a step writes what its rows asked for, in row order: one n_vocab
 * row of logits for each row with DS4_ROW_LOGITS, one n_hc x n_embd row of
 * hidden state for each with DS4_ROW_HIDDEN.  NULL when no row asks. */
typedef struct ds4_step_out {
    float *logits;
    float *hidden;
} ds4_step_out;

/* What sequences of a context size cost a backend, and its room for more
 * (ds4-server sizes its sessions by it; ds4_seq_memory_of):
 *   bytes         a sequence's state where the backend keeps it (with the
 *                 MTP block's own sequence, where each sequence has one)
 *   host_bytes    host memory a sequence takes besides, when its state is
 *                 on a device (its token list, its logits)
 *   room          bytes sequences can still have there, plus one
 *                 sequence's: the main sequence, made with the backend,
 *                 is the first session's; 0 when the backend cannot tell
 *   host_weights  bytes of the mapped model file the backend reads while
 *                 it runs: pages that must stay in host memory
 *   in_host       the state is in host memory (bytes come out of the
 *                 host's room) */
typedef struct ds4_seq_memory {
    uint64_t bytes, host_bytes, room, host_weights;
    bool in_host;
} ds4_seq_memory;

typedef struct ds4_backend_ops {
    const char *name;
    void (*free)(ds4_backend *b);
    /* a new empty sequence of ctx tokens (at most the backend's ctx_size) */
    ds4_seq *(*seq_new)(ds4_backend *b, uint32_t ctx, ds4_err *err);
    /* a new empty sequence of the MTP block (backends made with opts.mtp) */
    ds4_seq *(*mtp_seq_new)(ds4_backend *b, uint32_t ctx, ds4_err *err);
    void (*seq_free)(ds4_backend *b, ds4_seq *s);
    /* room for ctx tokens, the state kept (see ds4_seq_resize); NULL: the
     * backend's sequences keep the size they were made with */
    int (*seq_resize)(ds4_backend *b, ds4_seq *s, uint32_t ctx, ds4_err *err);
    uint32_t (*seq_len)(const ds4_backend *b, const ds4_seq *s);
    /* one pass over rows of any sequences (see ds4_backend_step) */
    int (*step)(ds4_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err);
    int (*mtp_step)(ds4_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err);
    /* a pipeline stage's step (see ds4_backend_stage_step); NULL: the backend runs no stages */
    int (*stage_step)(ds4_backend *b, const ds4_row *rows, uint32_t n, const float *in, float *resid,
                      const ds4_step_out *out, ds4_err *err);
    int (*mark)(ds4_backend *b, ds4_seq *s, ds4_err *err);
    int (*rewind)(ds4_backend *b, ds4_seq *s, uint32_t n_tokens, ds4_err *err);
    int (*prefill)(ds4_backend *b, ds4_seq *s, const uint32_t *tokens, uint32_t n, float *all_logits, ds4_err *err);
    int (*decode)(ds4_backend *b, ds4_seq *s, uint32_t token, ds4_err *err);
    const float *(*logits)(ds4_backend *b, ds4_seq *s);
    void (*reset)(ds4_backend *b, ds4_seq *s);
    int (*snapshot)(ds4_backend *b, ds4_seq *s, ds4_kv_state *out, ds4_err *err);
    int (*restore)(ds4_backend *b, ds4_seq *s, const ds4_kv_state *in, ds4_err *err);
    int (*greedy)(ds4_backend *b, ds4_seq *s, uint32_t n, uint32_t *out, ds4_err *err); /* may be NULL */
    /* sequences of ctx tokens: what they cost, the room for more; may be NULL (nothing known) */
    void (*seq_memory)(const ds4_backend *b, uint32_t ctx, ds4_seq_memory *m);
} ds4_backend_ops;

struct ds4_backend {
    const ds4_backend_ops *ops;
    const ds4_weights *w;
    ds4_backend_opts opts;
    ds4_seq *main; /* the main sequence */
};

static inline void ds4_backend_free(ds4_backend *b) {
    if (b) b->ops->free(b);
}

/* ------------------------------------------------------- sequences */

/* A new empty sequence of ctx tokens (0: the backend's ctx_size, the
 * most it takes); free it with ds4_seq_free before the backend. */
static inline ds4_seq *ds4_seq_new(ds4_backend *b, uint32_t ctx, ds4_err *err) {
    return b->ops->seq_new(b, ctx ? ctx : b->opts.ctx_size, err);
}
static inline void ds4_seq_free(ds4_backend *b, ds4_seq *s) {
    if (s) b->ops->seq_free(b, s);
}
static inline uint32_t ds4_seq_len(const ds4_backend *b, const ds4_seq *s) { return b->ops->seq_len(b, s); }

/* Give s room for ctx tokens (1 .. the backend's ctx_size, at least the
 * tokens it holds), more or fewer than it has: its state is kept exactly
 * (tokens, KV rows, compressor frontiers, indexer rows, logits, an MTP
 * sequence's residuals), so that the rows it appends after are bit for bit
 * those of a sequence made that large.  Its mark stays (a rewind goes back
 * to it as before), but where the resize changes the raw ring's size (a
 * context below the sliding window).  Sequences of the MTP block resize
 * too.  On failure s is as it was.  A backend whose sequences keep their
 * size (a pipeline) answers DS4_EUNSUPPORTED. */
static inline int ds4_seq_resize(ds4_backend *b, ds4_seq *s, uint32_t ctx, ds4_err *err) {
    if (!b->ops->seq_resize)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "the %s backend does not resize sequences", b->ops->name);
    return b->ops->seq_resize(b, s, ctx, err);
}

/* What sequences of ctx tokens cost b and the room it has for more (all 0
 * where b cannot tell). */
static inline void ds4_seq_memory_of(const ds4_backend *b, uint32_t ctx, ds4_seq_memory *m) {
    ds4_seq_memory none = {0, 0, 0, 0, false};
    *m = none;
    if (b->ops->seq_memory) b->ops->seq_memory(b, ctx, m);
}

/* One pass over n rows (at most the backend's prefill_chunk): each row
 * appends its token to its sequence, at that sequence's next position.
 * The rows of a sequence must be adjacent and in order; any number of
 * sequences may share a step, and the routed experts of all rows are
 * grouped so that each expert's weights are read once.  A row's results
 * do not depend on the other rows of its step (bit for bit on the CPU).
 * On failure the sequences of the step are left undefined (reset them). */
static inline int ds4_backend_step(ds4_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out,
                                   ds4_err *err) {
    return b->ops->step(b, rows, n, out, err);
}

/* A step of a pipeline stage (ds4_backend_opts.layer_first/layer_end): as
 * ds4_backend_step, but a stage after the first starts from every row's
 * entering residual `in` (n_hc x n_embd floats a row, in row order)
 * instead of the embedding, and a stage before the last leaves every
 * row's residual after its last layer in `resid` and has no logits.  On
 * the CUDA backend `in` and `resid` may also be memory of the backend's
 * GPU (a pipeline over a host's GPUs passes them between GPUs there); in
 * either memory, the step has read `in` and written `resid` when it
 * returns. */
static inline int ds4_backend_stage_step(ds4_backend *b, const ds4_row *rows, uint32_t n, const float *in, float *resid,
                                         const ds4_step_out *out, ds4_err *err) {
    if (!b->ops->stage_step)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "the %s backend runs no pipeline stage", b->ops->name);
    return b->ops->stage_step(b, rows, n, in, resid, out, err);
}

/* Remember s's current length as a point it can be taken back to: the
 * rows of rewindable steps (DS4_ROW_REWIND) after it, DS4_REWIND_MAX at
 * most, are journaled.  A step that appends rows to s without
 * DS4_ROW_REWIND, a prefill, a decode, a reset or a restore drops the mark. */
static inline int ds4_backend_mark(ds4_backend *b, ds4_seq *s, ds4_err *err) { return b->ops->mark(b, s, err); }

/* A sequence of the MTP block (docs/MODEL.md 9): its own KV rows, one
 * dense layer; ds4_backend_mtp_step advances it.  Backends made with
 * opts.mtp only. */
static inline ds4_seq *ds4_mtp_seq_new(ds4_backend *b, uint32_t ctx, ds4_err *err) {
    return b->ops->mtp_seq_new(b, ctx ? ctx : b->opts.ctx_size, err);
}

/* One pass of the MTP block over rows of MTP sequences, as a step: each
 * row appends its token (paired with row->hidden) to its sequence; the
 * logits are the draft's prediction for the token after it, the hidden
 * state what the next draft pairs with.  Marks and rewinds as for the main
 * model's sequences. */
static inline int ds4_backend_mtp_step(ds4_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out,
                                       ds4_err *err) {
    return b->ops->mtp_step(b, rows, n, out, err);
}

/* Take back the last tokens of s, keeping n_tokens (at least its mark's
 * length): exactly the state a sequence that never saw the others would
 * have (KV rows, compressor frontiers, indexer rows, and the logits after
 * token n_tokens - 1).  The mark stays: a later rewind may go back further. */
static inline int ds4_backend_rewind(ds4_backend *b, ds4_seq *s, uint32_t n_tokens, ds4_err *err) {
    return b->ops->rewind(b, s, n_tokens, err);
}

static inline int ds4_seq_prefill(ds4_backend *b, ds4_seq *s, const uint32_t *tokens, uint32_t n, float *all_logits,
                                  ds4_err *err) {
    return b->ops->prefill(b, s, tokens, n, all_logits, err);
}
static inline int ds4_seq_decode(ds4_backend *b, ds4_seq *s, uint32_t token, ds4_err *err) {
    return b->ops->decode(b, s, token, err);
}
static inline const float *ds4_seq_logits(ds4_backend *b, ds4_seq *s) { return b->ops->logits(b, s); }
static inline void ds4_seq_reset(ds4_backend *b, ds4_seq *s) { b->ops->reset(b, s); }
static inline int ds4_seq_snapshot(ds4_backend *b, ds4_seq *s, ds4_kv_state *out, ds4_err *err) {
    return b->ops->snapshot(b, s, out, err);
}
static inline int ds4_seq_restore(ds4_backend *b, ds4_seq *s, const ds4_kv_state *in, ds4_err *err) {
    return b->ops->restore(b, s, in, err);
}
/* Append n greedy tokens to s (see ds4_backend_greedy). */
int ds4_seq_greedy(ds4_backend *b, ds4_seq *s, uint32_t n, uint32_t *out, ds4_err *err);

/* ------------------------------------- the main sequence (one stream) */

/* Append n tokens.  `all_logits` (n * n_vocab floats) may be NULL; when
 * given it receives the logits after each token. */
static inline int ds4_backend_prefill(ds4_backend *b, const uint32_t *tokens, uint32_t n, float *all_logits,
                                      ds4_err *err) {
    return ds4_seq_prefill(b, b->main, tokens, n, all_logits, err);
}
static inline int ds4_backend_decode(ds4_backend *b, uint32_t token, ds4_err *err) {
    return ds4_seq_decode(b, b->main, token, err);
}
/* n_vocab logits for the next token; NULL before the first token. */
static inline const float *ds4_backend_logits(ds4_backend *b) { return ds4_seq_logits(b, b->main); }
static inline void ds4_backend_reset(ds4_backend *b) { ds4_seq_reset(b, b->main); }
static inline int ds4_backend_snapshot(ds4_backend *b, ds4_kv_state *out, ds4_err *err) {
    return ds4_seq_snapshot(b, b->main, out, err);
}
static inline int ds4_backend_restore(ds4_backend *b, const ds4_kv_state *in, ds4_err *err) {
    return ds4_seq_restore(b, b->main, in, err);
}

/* Append n greedy tokens (the first is the argmax of the current logits;
 * out receives them).  Needs logits (a prefill or decode before). */
static inline int ds4_backend_greedy(ds4_backend *b, uint32_t n, uint32_t *out, ds4_err *err) {
    return ds4_seq_greedy(b, b->main, n, out, err);
}

/* A state sized for this backend's session (to snapshot into). */
ds4_kv_state *ds4_backend_state_new(const ds4_backend *b, ds4_err *err);

/* Resolved options (defaults filled in). */
ds4_backend_opts ds4_backend_opts_resolve(const ds4_backend_opts *opts);

#endif
