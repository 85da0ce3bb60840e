/*
 * cpu.h - internals of the CPU reference backend (src/model/cpu/).
 *
 * The backend runs the forward pass of spec/MODEL.md 5-7 in f32 over the
 * mmap'ed weights.  Tokens go through the model in chunks of up to
 * `chunk` tokens, layer-major: every matrix product of a layer is done for
 * all tokens of the chunk at once (each weight row is read once per chunk),
 * while the order-dependent part of attention (KV ring, compressors,
 * indexer) walks the tokens in order.  A decode step is a chunk of one.
 * Every output value is computed by one thread with a fixed accumulation
 * order, so results do not depend on the chunking or the thread count:
 * prefill and token-by-token decode are bit-identical.
 *
 *   cpu_ops.c      matrix products, norms, activations
 *   cpu_hc.c       hyper-connections (HC pre / post, output collapse)
 *   cpu_attn.c     attention sublayer: raw ring, compressors, indexer
 *   cpu_ffn.c      MoE sublayer: router, routed and shared experts
 *   cpu_backend.c  the ds4_backend: chunks, layers, output head
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

typedef struct cpu_backend {
    ds4_backend base;
    const ds4_config *cfg;
    ds4_pool *pool;
    int n_threads;
    ds4_kv_state *st;
    bool sim;                 /* low-precision simulations on */
    ds4_rope rope_dense, rope_comp;
    const ds4_rope *ratio_rope; /* the current layer's (dense or compressed) */
    uint32_t chunk;           /* max tokens per pass */

    /* chunk buffers, `chunk` rows each */
    float *S;                 /* residual: n_hc * n_embd per token */
    float *flat;              /* HC: normalised flattened state */
    float *mix;               /* HC: mixer outputs */
    float *post, *comb;       /* HC: post gates, combination matrix */
    float *x, *xn;            /* sublayer input, normed */
    float *qr, *q, *kv;       /* attention projections */
    float *heads, *low, *y;   /* attention output, grouped low rank, sublayer output */
    float *ckv, *cgate;       /* attention compressor projections */
    float *ikv, *igate;       /* indexer compressor projections */
    float *iq, *iw;           /* indexer queries and head weights */
    float *router;            /* router probabilities */
    uint32_t *sel;            /* selected experts */
    float *selw;              /* routing weights */
    float *exp_out;           /* routed expert outputs, per token and slot */
    float *gath, *eg, *eu;    /* gathered expert inputs, gate / up outputs */
    uint32_t *gath_t;         /* token x slot of each gathered row */
    float *sg, *su;           /* shared expert gate / up */
    uint8_t *act;             /* quantized activations, act_row bytes per token */
    size_t act_row;

    /* attention scratch */
    float *ape;               /* one positional-bias row */
    float *att_scratch;       /* per thread: scores over visible rows */
    size_t att_stride;
    float *idx_scores;        /* indexer scores over compressed rows */
    uint32_t *visible;        /* selected compressed rows (ascending) */
    uint32_t n_visible;
} cpu_backend;

/* -------------------------------------------------------------- cpu_ops */

/* Multiply-adds below which a parallel loop runs on the calling thread. */
#define CPU_MIN_TASK_WORK 65536

/* y[t][r] = W[mat] row (row0 + r) . x[t], for r < nrows and t < T.
 * Activations are prepared per MODEL.md 3.8 for the weight type. */
void cpu_matmul(cpu_backend *b, const ds4_wt *W, uint64_t mat, uint64_t row0, uint64_t nrows,
                const float *x, size_t x_stride, uint32_t T, float *y, size_t y_stride);

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

/* HC pre for tokens [0, T): from b->S, using the site's fn/scale/base,
 * write b->x (the sublayer input), b->post and b->comb. */
void cpu_hc_pre(cpu_backend *b, const ds4_wt *fn, const ds4_wt *scale, const ds4_wt *base, uint32_t T);

/* HC post: S <- post * y + comb^T S, per token. */
void cpu_hc_post(cpu_backend *b, uint32_t T);

/* Output collapse and head (MODEL.md 5.4) for the tokens of the chunk
 * marked in `want`: one row of n_vocab logits per marked token, in order,
 * `logits_stride` floats apart. */
void cpu_output_head(cpu_backend *b, uint32_t T, const bool *want, float *logits, size_t logits_stride);

/* ------------------------------------------------------------- cpu_attn */

/* Attention sublayer of layer il for tokens at positions pos0 .. pos0+T-1
 * (MODEL.md 6.1-6.3): reads b->S, leaves the result in b->S. */
void cpu_attention_layer(cpu_backend *b, uint32_t il, uint32_t pos0, uint32_t T);

/* -------------------------------------------------------------- cpu_ffn */

/* FFN sublayer of layer il (MODEL.md 6.4) for the tokens `tok`. */
void cpu_ffn_layer(cpu_backend *b, uint32_t il, const uint32_t *tok, uint32_t T);

#endif
