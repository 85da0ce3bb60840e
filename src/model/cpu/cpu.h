/*
 * cpu.h - internals of the CPU reference backend (src/model/cpu/).
 *
 * The backend runs the forward pass of docs/MODEL.md 5-7 in f32 over the
 * mmap'ed weights.  A pass takes up to `chunk` rows - tokens of any
 * sequences, each at its sequence's next position - through the model
 * layer-major: every matrix product of a layer is done for all rows at
 * once (each weight row is read once per pass, each routed expert once for
 * all the rows that chose it), while the order-dependent part of attention
 * (KV ring, compressors, indexer) walks the rows in order, each in its own
 * sequence's state.  A decode step is a pass of one row; a prefill chunk a
 * pass of one sequence's rows; a batched step several sequences' rows.
 * Every output value is computed by one thread with a fixed accumulation
 * order, so results depend neither on the chunking, nor on the thread
 * count, nor on the other rows of the pass: prefill, token-by-token decode
 * and batched steps are bit-identical.
 *
 *   cpu_ops.c      matrix products, norms, activations
 *   cpu_hc.c       hyper-connections (HC pre / post, output collapse)
 *   cpu_attn.c     attention sublayer: raw ring, compressors, indexer
 *   cpu_ffn.c      MoE sublayer: router, routed and shared experts
 *   cpu_rewind.c   the journal of a rewindable pass, and the rewind
 *   cpu_backend.c  the ds4_backend: sequences, passes, output head
 */
#ifndef DS4_MODEL_CPU_CPU_H
#define DS4_MODEL_CPU_CPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/threads.h"
#include "model/backend.h"
#include "model/rope.h"
#include "model/session_state.h"

/* What a sequence keeps from its mark on (cpu_rewind.c): enough to take
 * back any suffix of the rows rewindable passes appended since. */
typedef struct cpu_journal {
    const ds4_config *cfg; /* the sequence's (the MTP block's state has one layer) */
    bool valid;
    uint32_t n0, T; /* length at the mark, rows journaled since */
    uint32_t cap;   /* rows the buffers hold (DS4_REWIND_MAX) */
    float *raw;     /* [layer][row] the ring slot before the row, head_dim each */
    float *raw_row; /* [layer][row] the row's own ring row */
    float *front;   /* [ratio layer] frontiers (cpu_journal_front_floats) */
    float *proj;    /* [row][ratio layer] ckv, cgate, ikv, igate */
    float *logits;  /* [row] n_vocab (every row's); then the logits before the pass */
    bool had_logits;
} cpu_journal;

/* The CPU backend's ds4_seq: a KV state in host memory and its journal. */
typedef struct cpu_seq {
    ds4_seq base;
    bool mtp; /* the MTP block's (one dense layer) */
    ds4_kv_state *st;
    cpu_journal j;
    float *hid; /* with an MTP block: the final residuals of the last DS4_HIDDEN_KEEP
                               * positions, position p at p % DS4_HIDDEN_KEEP (NULL without) */
} cpu_seq;

static inline cpu_seq *cpu_seq_of(ds4_seq *s) { return (cpu_seq *)s; }
static inline const float *cpu_seq_hidden(const cpu_seq *s, uint32_t p) {
    return s->hid + (size_t)(p % DS4_HIDDEN_KEEP) * s->st->cfg->n_hc * s->st->cfg->n_embd;
}

/* One row of a pass: a token of a sequence at a position. */
typedef struct cpu_row {
    cpu_seq *s;
    ds4_kv_state *st; /* s->st */
    cpu_journal *j;   /* the sequence's journal when the pass is rewindable, else NULL */
    uint32_t pos, tok;
} cpu_row;

/* The layer a sublayer function runs: the main model's layer il, or the
 * MTP block (cpu_mtp.c), whose own state has one dense layer. */
typedef struct cpu_layer {
    const ds4_layer_weights *w;
    uint32_t il;    /* the layer in each row's KV state */
    uint32_t jl;    /* its slot in the journal (the main model's layer index) */
    uint32_t ratio; /* compression ratio: 0, 4 or 128 */
    bool hash;      /* hash-routed experts */
    float clamp;    /* SwiGLU clamp */
    bool observe;   /* its experts go to the imatrix collector (the main model's) */
    bool steer;     /* directional steering applies (the main model's layers) */
} cpu_layer;

typedef struct cpu_backend {
    ds4_backend base;
    const ds4_config *cfg;
    ds4_pool *pool;
    int n_threads;
    bool sim; /* low-precision simulations on */
    ds4_rope rope_dense, rope_comp;
    const ds4_rope *ratio_rope;      /* the current layer's (dense or compressed) */
    uint32_t chunk;                  /* max rows per pass */
    uint32_t max_ctx;                /* largest context a sequence may have */
    uint32_t layer_first, layer_end; /* the layers it runs (a pipeline stage: not all) */

    /* the current pass: its rows (`chunk` at most) */
    cpu_row *rows;

    /* chunk buffers, `chunk` rows each */
    float *S;               /* residual: n_hc * n_embd per token */
    float *flat;            /* HC: normalised flattened state */
    float *mix;             /* HC: mixer outputs */
    float *post, *comb;     /* HC: post gates, combination matrix */
    float *x, *xn;          /* sublayer input, normed */
    float *qr, *q, *kv;     /* attention projections */
    float *heads, *low, *y; /* attention output, grouped low rank, sublayer output */
    float *ckv, *cgate;     /* attention compressor projections */
    float *ikv, *igate;     /* indexer compressor projections */
    float *iq, *iw;         /* indexer queries and head weights */
    float *router;          /* router probabilities */
    uint32_t *sel;          /* selected experts */
    float *selw;            /* routing weights */
    float *exp_out;         /* routed expert outputs, per token and slot */
    float *gath, *eg, *eu;  /* gathered expert inputs, gate / up outputs */
    uint32_t *gath_t;       /* token x slot of each gathered row */
    float *sg, *su;         /* shared expert gate / up */
    uint8_t *act;           /* quantized activations, act_row bytes per token */
    size_t act_row;

    /* attention scratch */
    float *ape;         /* one positional-bias row */
    float *att_scratch; /* per thread: scores over visible rows */
    size_t att_stride;
    float *idx_scores; /* indexer scores over compressed rows */
    uint32_t *visible; /* selected compressed rows (ascending) */
    uint32_t n_visible;
} cpu_backend;

/* After a pass: each row's sequence grows by its token; its final
 * residual goes to the sequence's ring (with MTP) and to hidden[t] when
 * asked for. */
void cpu_pass_end(cpu_backend *b, uint32_t T, const uint32_t *tok, float *const *hidden);

/* The main model's layer il as the sublayer functions take it. */
cpu_layer cpu_main_layer(const cpu_backend *b, uint32_t il);

/* -------------------------------------------------------------- cpu_ops */

/* Multiply-adds below which a parallel loop runs on the calling thread:
 * about 25-50 us of one core's work.  Waking the pool and waiting for it
 * took ~30 us a loop on a 2-core virtual machine; at 65536 a 4-row step of
 * the small model (docs/SMALL_MODEL.md) ran ~320 loops of a few
 * microseconds' work each and cost 11.5 one-row steps, at 1048576 3.8
 * (tokens 4 of work), and the MTP rate went from 128 to 480 t/s. */
#define CPU_MIN_TASK_WORK 1048576

/* y[t][r] = W[mat] row (row0 + r) . x[t], for r < nrows and t < T.
 * Activations are prepared per MODEL.md 3.8 for the weight type. */
void cpu_matmul(cpu_backend *b, const ds4_wt *W, uint64_t mat, uint64_t row0, uint64_t nrows, const float *x,
                size_t x_stride, uint32_t T, float *y, size_t y_stride);

/* out = x * w / sqrt(mean(x^2) + eps); w may be NULL (unweighted).  The sum
 * of squares is accumulated in double. */
void cpu_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps);

float cpu_sigmoid(float x);
float cpu_silu(float x);
float cpu_softplus(float x);

/* Clamped SwiGLU (MODEL.md 4.2): silu(min(g, L)) * clamp(u, -L, L). */
float cpu_swiglu(float g, float u, float limit);

/* An F32 vector tensor as floats (vectors are always F32). */
static inline const float *cpu_vec(const ds4_wt *t) { return (const float *)t->data; }

/* --------------------------------------------------------------- cpu_hc */

/* HC pre for rows [0, T): from b->S, using the site's fn/scale/base,
 * write b->x (the sublayer input), b->post and b->comb. */
void cpu_hc_pre(cpu_backend *b, const ds4_wt *fn, const ds4_wt *scale, const ds4_wt *base, uint32_t T);

/* Directional steering of the sublayer output b->y of layer L (ffn: after
 * the FFN, else after the attention), each row with its sequence's scale
 * (model/steering.h), when the backend has directions; then the result to
 * the activation observer, if any. */
void cpu_steer(cpu_backend *b, const cpu_layer *L, uint32_t T, bool ffn);

/* HC post: S <- post * y + comb^T S, per row. */
void cpu_hc_post(cpu_backend *b, uint32_t T);

/* Output collapse and head (MODEL.md 5.4) with the given HC head and norm
 * (the main model's, or the MTP block's): the logits of row t go to
 * dst[t], rows with dst[t] == NULL are skipped. */
void cpu_output_head(cpu_backend *b, const ds4_wt *fn, const ds4_wt *scale, const ds4_wt *base, const ds4_wt *norm,
                     uint32_t T, float *const *dst);

/* ------------------------------------------------------------- cpu_attn */

/* Attention sublayer of layer L for rows [0, T) of the pass (MODEL.md
 * 6.1-6.3): reads b->S, leaves the result in b->S. */
void cpu_attention_layer(cpu_backend *b, const cpu_layer *L, uint32_t T);

/* The state update of one row (raw ring, compressors) without attention:
 * a rewind replays the rows it keeps with it (cpu_rewind.c).  ckv/cgate
 * and ikv/igate are the row's compressor projections. */
void cpu_compress_row(cpu_backend *b, const cpu_layer *L, ds4_kv_state *st, const float *ckv, const float *cgate,
                      const float *ikv, const float *igate, uint32_t p);

/* -------------------------------------------------------------- cpu_mtp */

/* The MTP block over the rows in b->rows (docs/MODEL.md 9): each row's
 * token paired with rows[t].hidden; logits and hidden state as run_pass. */
int cpu_mtp_pass(cpu_backend *b, const ds4_row *rows, uint32_t T, float *const *logits, float *const *hidden);

/* -------------------------------------------------------------- cpu_ffn */

/* FFN sublayer of layer L for the rows' tokens `tok`. */
void cpu_ffn_layer(cpu_backend *b, const cpu_layer *L, const uint32_t *tok, uint32_t T);

/* ----------------------------------------------------------- cpu_rewind */

/* Start s's journal at its current length (the mark: saves its frontiers
 * and logits); rewindable passes then record each row with the hooks
 * below. */
int cpu_journal_begin(cpu_backend *b, cpu_seq *s, ds4_err *err);
/* Row at position p of layer slot jl and its ring slot: the slot's
 * content before the row writes it (!mine), then the row's own (mine). */
void cpu_journal_raw(cpu_backend *b, cpu_journal *j, uint32_t jl, uint32_t p, const float *slot, bool mine);
/* Row at position p's compressor projections at layer slot jl. */
void cpu_journal_proj(cpu_backend *b, cpu_journal *j, uint32_t jl, uint32_t p, const float *ckv, const float *cgate,
                      const float *ikv, const float *igate);
/* Where the logits after position p are kept, and keeping them (from
 * wherever the pass wrote them). */
float *cpu_journal_logits_row(cpu_backend *b, cpu_seq *s, uint32_t p);
void cpu_journal_logits(cpu_backend *b, cpu_seq *s, uint32_t p, const float *logits);
void cpu_journal_free(cpu_journal *j);
/* The bytes of a sequence's journal (made at its first rewindable step). */
uint64_t cpu_journal_bytes(const ds4_config *c);
int cpu_rewind(ds4_backend *base, ds4_seq *s, uint32_t n_tokens, ds4_err *err);

#endif
