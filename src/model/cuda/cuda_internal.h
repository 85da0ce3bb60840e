/*
 * cuda_internal.h - internals of the CUDA backend (src/model/cuda/).
 *
 * The backend keeps every weight and the whole session state in GPU
 * memory and runs the forward pass of docs/MODEL.md 5-7 as the CPU
 * reference does (the same activation quantization, the same low-precision
 * simulations), with different kernels for the two regimes:
 *
 *   decode   one token: matrix-vector products that stream each weight
 *            once (16-byte coalesced loads, integer dot products against
 *            the quantized activation), every step captured once into a
 *            CUDA graph that reads the token and position from device
 *            memory, so a step is one graph launch and nothing waits for
 *            the host (router and indexer top-k, expert choice and the
 *            greedy argmax run on the device);
 *   prefill  a chunk of tokens: int8 tensor-core products for the
 *            quantized weights (exactly the CPU's integer block sums),
 *            tiled float products for the float ones, experts grouped by
 *            the tokens that chose them, attention for all queries of the
 *            chunk in parallel under the masks of MODEL.md 7.
 * Both share the small kernels (hyper-connections, norms, RoPE,
 * compressors, indexer, attention, routing).
 *
 *   cuda_rt.h        runtime or emulation, device helpers
 *   cuda_weights.cu  weights to the GPU in a repacked layout; synthetic weights
 *   cuda_matmul.cu   quantized activations, matrix-vector and matrix products
 *   cuda_hc.cu       hyper-connections: HC post, mixer, collapse, sublayer input
 *   cuda_attn.cu     embedding, norms, RoPE, compressors, attention
 *   cuda_indexer.cu  indexer scores and top-k (the visible compressed rows)
 *   cuda_ffn.cu      router, experts, shared expert, output head, argmax
 *   cuda_backend.cu  the ds4_backend: sequences' state, chunks, graphs, snapshots
 *   cuda_seq.cu      steps over rows of several sequences, marks and rewinds
 *   cuda_offload.cu  routed experts in host RAM: placement, the host branch (cuda_offload.h)
 *
 * Repacked weight rows (same bytes as the GGUF block formats, regrouped so
 * that the quant bytes of a row are contiguous and 16-byte aligned):
 *   Q8_0     qs[n] int8 | d[n/32] f16
 *   Q2_K     qs[64 nb] | scales[16 nb] | (d, dmin)[nb] f16 pairs
 *   Q4_K     qs[128 nb] | scales[12 nb] | (d, dmin)[nb]
 *   IQ2_XXS  qs[64 nb] (the 32 u16 of each block) | d[nb] f16
 *   F16/BF16/F32  unchanged
 * each row padded to a multiple of 16 bytes (nb = n / 256).
 *
 * Quantized activations of one token (n values), as MODEL.md 3.8:
 *   q8 (against Q8_0):   qs[n] int8 | d[n/32] f32
 *   qk (against K-quants): qs[n] int8 | d[n/256] f32 | bsums[n/16] int16
 * with the same values ds4_quantize_q8_0x / ds4_quantize_q8_K produce.
 */
#ifndef DS4_MODEL_CUDA_CUDA_INTERNAL_H
#define DS4_MODEL_CUDA_CUDA_INTERNAL_H

#include "model/cuda/cuda_actq.cuh"
#include "model/cuda/cuda_rt.h"
#include "model/cuda/cuda_offload.h"

extern "C" {
#include "format/quants.h"
#include "model/backend.h"
#include "model/rope.h"
}

#define CU_MAX_EXPERT_USED 16
#define CU_MAX_SEGS        16
#define CU_FEW_T           8  /* tokens one block of a plan of a few dots with each weight row it reads */
#define CU_FEW_PASS        64 /* tokens a pass of which takes the plans of a few (cu_gemm, cu_ffn_layer, the HC) */
#define CU_FEW_ENTRIES     (CU_FEW_PASS * 8) /* (token, expert) entries a pass of a few orders (cu_entry_order) */

/* ------------------------------------------------------------ weights */

typedef struct dwt {
    const uint8_t *p; /* repacked rows on the device; NULL for an absent tensor */
    uint32_t type;
    uint32_t n;       /* row length (elements) */
    uint32_t rows;    /* rows per matrix */
    uint32_t mats;    /* matrices (experts) */
    size_t row_bytes; /* bytes of a repacked row (16-byte multiple) */
} dwt;

/* The device copies of ds4_layer_weights and ds4_weights: the same fields
 * (the tensor table, model/tensors.h). */
#define DWT_FIELD(field, ...) dwt field;
typedef struct dlayer {
    DS4_LAYER_TENSORS(DWT_FIELD)
} dlayer;

typedef struct dweights {
    DS4_GLOBAL_TENSORS(DWT_FIELD)
    dlayer *layers; /* n_layer + 1: the last is the MTP block's layer (absent without one) */
    void *block;    /* one device allocation holding every tensor */
    size_t bytes;
} dweights;

/* The MTP block's own tensors (its layer is dweights.layers[n_layer]). */
typedef struct dmtp {
    DS4_MTP_TENSORS(DWT_FIELD)
    void *block; /* its tensors and its layer's */
    size_t bytes;
} dmtp;
#undef DWT_FIELD

/* Byte geometry of a repacked row; 0 for a type the GPU cannot use. */
size_t cu_row_bytes(uint32_t type, uint32_t n);

/* One GGUF row (n values of `type`) into the device layout, row_bytes long. */
void cu_repack_row(uint32_t type, uint32_t n, const uint8_t *src, uint8_t *dst, size_t row_bytes);

struct cu_tp;
/* The device shapes of the tensors of `w` a backend of layers [first, end)
 * runs (nothing allocated): those layers' tensors, the embedding when
 * first is 0, the output head when end is the last layer; the others stay
 * absent.  A routed tensor of layer l holds n_gpu[l] matrices (NULL: all
 * of them); the tensors that tensor parallelism splits hold tp's share
 * (cu_tp_part; NULL: the whole). */
int cu_weights_shape(dweights *dw, const ds4_weights *w, const struct cu_tp *tp, const uint32_t *n_gpu, uint32_t first,
                     uint32_t end, ds4_err *err);
/* Whether a device tensor is part of the model (its shape is known before
 * its memory is: an all-host routed tensor has none). */
static inline bool dwt_present(const dwt *W) { return W->row_bytes != 0; }
/* Device bytes of the shaped tensors: all, or those that are no routed
 * expert (routed: the routed tensors' bytes, separately). */
size_t cu_weights_bytes(const dweights *dw, const ds4_config *c, size_t *routed);
/* Upload (repacking) or synthesise every tensor of `w` after
 * cu_weights_shape; slot (NULL: every expert) places routed expert e of
 * layer l in matrix slot[l * n_expert + e], or nowhere when -1. */
int cu_weights_load(dweights *dw, const ds4_weights *w, const struct cu_tp *tp, const int32_t *slot, cudaStream_t st,
                    ds4_err *err);
int cu_weights_synth(dweights *dw, const ds4_weights *w, uint64_t seed, cudaStream_t st, ds4_err *err);
void cu_weights_free(dweights *dw);
/* The MTP block's tensors into dm and its layer's into dl, uploaded from
 * m, or (synth) seeded random values of m's shapes. */
int cu_mtp_weights_load(dmtp *dm, dlayer *dl, const struct ds4_mtp_weights *m, bool synth, uint64_t seed,
                        cudaStream_t st, ds4_err *err);

/* ------------------------------------------------------- activations */

/* T tokens of n values: f32 rows plus the quantized forms (NULL when n is
 * not a whole number of their blocks). */
typedef struct dact {
    float *f;
    uint8_t *q8, *qk;
    uint32_t n;
    size_t fs, q8s, qks; /* strides: floats, bytes, bytes */
} dact;

size_t cu_q8_bytes(uint32_t n); /* bytes of one token's q8 row (16-byte multiple) */
size_t cu_qk_bytes(uint32_t n);

/* Pointers into token t's row of `a`, `off` values in, in the form a
 * weight of type `wtype` is multiplied with (xq/xd/xb NULL for float
 * weights or when the form is missing). */
/* The forms of an activation: f32 rows, Q8_0 rows, Q8_K rows; and the one
 * a product with weights of type wtype reads (float weights: f32). */
enum { ACT_F = 1, ACT_Q8 = 2, ACT_QK = 4, ACT_ALL = 7 };
unsigned cu_act_form(uint32_t wtype);
void cu_act_ptrs(const dact *a, uint32_t wtype, uint32_t t, uint32_t off, const float **xf, const int8_t **xq,
                 const float **xd, const int16_t **xb);

/* Quantize (from a.f) tokens [0, T) into the q8/qk forms. */
int cu_quantize(const dact *a, uint32_t T, cudaStream_t st, ds4_err *err);


/* ---------------------------------------------------------- products */

/* One matrix-vector product of a fused launch (decode).  Output row r of
 * the segment is dot(W[mat] row row0 + r, x) where x is the activation of
 * the segment (offset `act_off` values into the token row); the matrix is
 * `mat`, or sel[sel_slot] when sel != NULL (routed experts). */
typedef struct gemv_seg {
    const uint8_t *w;
    uint32_t type, n, rows;
    size_t row_bytes, mat_bytes;
    uint32_t mat;
    const int *sel;
    uint32_t sel_slot;
    /* a selection s is this segment's matrix s - sel_lo where it lies in
     * [sel_lo, sel_lo + sel_n), else skipped (-1: an expert on the host;
     * another tier's: cuda_offload.h) */
    int32_t sel_lo;
    uint32_t sel_n;
    uint32_t row0;
    const float *xf;
    const int8_t *xq;  /* quantized activation values */
    const float *xd;   /* their block scales */
    const int16_t *xb; /* Q8_K block sums */
    float *out;
    /* with q8 set, the outputs are also quantized as Q8_0 (the block of
     * 32 rows that a launch block makes): output r is value q8_off + r of
     * the Q8_0 row q8 of q8_n values (cu_gemv_add_q8) */
    uint8_t *q8;
    uint32_t q8_n, q8_off;
    uint32_t block0; /* first block of this segment in the launch */
    uint32_t rpw;    /* rows per warp */
    uint32_t split;  /* 1, or a block a row, each warp a part (few long float rows) */
    /* token t of a plan of several (gemv_plan.T or .reps) reads x from
     * xqs bytes (quantized forms) or xfs floats past token 0's - of token
     * t / x_div where x_div > 1 (entries of one token: x_div of them read
     * its row) - writes outs floats past its outputs, and selects slot
     * sel_slot + t sel_step */
    uint32_t xqs, xfs, sel_step, x_div;
    size_t outs;
} gemv_seg;

/* A token's routing (cuda_route.cuh): the router's logits, the F32 bias
 * or NULL, the hash table (vocab x k; NULL but for hash layers) and the
 * tokens it reads, k of n_expert. */
typedef struct cu_route_in {
    const float *logits, *bias;
    const int32_t *hash;
    const uint32_t *tok;
    uint32_t n_expert, k;
    float scale;
    bool norm;
    /* with routed experts on the host (cuda_offload.h): each expert's
     * device slot (-1: on the host), and where the selected ones' go */
    const int32_t *slot;
    int *msel;
    uint32_t *count; /* per expert: selections (NULL: not counted) */
} cu_route_in;

/* The routing a decode step's router product does in its last block
 * (cu_gemv_route): where the selection goes, and the launch's count of
 * blocks done (NULL: none). */
typedef struct gemv_route {
    cu_route_in in;
    int *sel;
    float *selw;
    uint32_t *count;
} gemv_route;

/* A plan is one launch.  Of one token (T and reps 0 or 1: a decode step), or
 * of the T tokens of a pass of a few (CU_FEW_PASS at most; cu_gemv_tokens):
 * dense Q8_0 and float rows, each read from DRAM once and dotted with
 * every token (in chunks of at most CU_FEW_T tokens, a block each, the
 * chunks of a row read side by side), each token's sums those of a
 * one-token plan; or of `reps` tokens that
 * select their own matrices (the routed experts of a pass of a few:
 * cu_gemv_reps), each token the blocks of a one-token plan, in the order
 * `order` lists them (NULL: 0, 1, ...; a device array a kernel before the
 * plan's writes). */
typedef struct gemv_plan {
    gemv_seg seg[CU_MAX_SEGS];
    uint32_t n_seg, n_blocks;
    uint32_t T, reps;
    const int *order;
    gemv_route route;
} gemv_plan;

/* Whether plan p can route k of n_expert experts in its last block: it is
 * the router alone, a block a row (the float rows' split path), and a
 * warp holds every expert (route_token<8>: 8 a lane, Flash's 256; a launch
 * of its own, route_token<16>, up to 512: Pro's 384). */
#define GEMV_ROUTE_MAX_EXPERTS      256
#define GEMV_ROUTE_MAX_EXPERTS_WIDE 512
static inline bool cu_gemv_can_route(const gemv_plan *p, uint32_t n_expert, uint32_t k) {
    return p->n_seg == 1 && p->seg[0].split > 1 && n_expert <= GEMV_ROUTE_MAX_EXPERTS_WIDE && k <= 32;
}

/* The blocks of each of p's segments when all have as many, else 0:
 * cu_gemv_run passes it to the kernel, whose blocks then find their
 * segment by a division. */
uint32_t cu_gemv_seg_blocks(const gemv_plan *p);

/* Add a segment to a plan (host side). */
void cu_gemv_add(gemv_plan *p, const dwt *W, uint32_t mat, const int *sel, uint32_t slot, uint32_t row0, uint32_t rows,
                 const dact *x, uint32_t act_off, float *out);
/* The same, the outputs also quantized into row 0 of q's Q8_0 form from
 * value q_off on (rows and q_off multiples of 32). */
void cu_gemv_add_q8(gemv_plan *p, const dwt *W, uint32_t row0, uint32_t rows, const dact *x, uint32_t act_off,
                    float *out, const dact *q, uint32_t q_off);
/* Where token t of a plan of several finds its part of a segment: x_rows
 * rows of the activation (of token t / x_div, where x_div > 1), out_stride
 * outputs and sel_step selection slots past token 0's. */
typedef struct gemv_tok {
    uint32_t x_rows;
    size_t out_stride;
    uint32_t sel_step, x_div;
} gemv_tok;
void cu_gemv_add_tok(gemv_plan *p, const dwt *W, uint32_t mat, const int *sel, uint32_t slot, uint32_t row0,
                     uint32_t rows, const dact *x, uint32_t act_off, float *out, gemv_tok tk);
/* The last segment added selects matrices s - lo of the selections s in
 * [lo, lo + n) only (gemv_seg.sel_lo). */
void cu_gemv_sel_range(gemv_plan *p, int32_t lo, uint32_t n);
/* An empty plan of T tokens of a few (a dense product a launch), or of
 * reps tokens each selecting its own matrices (T, reps 1: one token). */
void cu_gemv_tokens(gemv_plan *p, uint32_t T);
void cu_gemv_reps(gemv_plan *p, uint32_t reps);
/* Whether a plan of a few tokens can hold a product with W: dense Q8_0
 * rows, or float rows loaded 16 bytes at a time. */
bool cu_gemv_few_fits(const dwt *W);
int cu_gemv_run(const gemv_plan *p, cudaStream_t st, ds4_err *err);
/* The blocks of the streamed launch (gemv_stream_kernel) that the routed
 * experts' down product takes: 0 a wave of blocks (what the backend uses),
 * else that many (the kernel test, whose small grids make a warp walk
 * several units). */
void cu_gemv_set_stream(uint32_t blocks);
/* Whether plan p takes the streamed launch: every segment Q2_K, of one row
 * length, four rows a warp, whole blocks of rows, one block count. */
bool cu_gemv_streamed(const gemv_plan *p);

/* The products of a decode step that closes a ratio-4 compressor window
 * (cuda_matmul.cu, gemv_window_kernel): the activations of CU_WIN_T tokens
 * (f32 rows of n values, x[t]) against the first `rows` rows of up to
 * CU_WIN_SEGS float matrices, each row read once; token t's output r goes
 * to out[t * out_stride + r].  Each token's outputs have the bits of a
 * one-token gemv of it. */
#define CU_WIN_T    4
#define CU_WIN_ROWS 4 /* rows a block */
#define CU_WIN_SEGS 4
typedef struct cu_win_seg {
    const uint8_t *w;
    uint32_t type, rows;
    size_t row_bytes;
    float *out;
    size_t out_stride;
    uint32_t block0;
} cu_win_seg;
typedef struct cu_win_plan {
    cu_win_seg seg[CU_WIN_SEGS];
    uint32_t n_seg, n_blocks, n;
    const float *x[CU_WIN_T];
} cu_win_plan;
/* Whether W's rows can take it: float rows that split into the gemv's 8
 * equal parts of whole 16-byte loads. */
static inline bool cu_win_fits(const dwt *W) {
    return dwt_present(W) && (W->type == DS4_TYPE_F32 || W->type == DS4_TYPE_F16 || W->type == DS4_TYPE_BF16) &&
           W->n % 64 == 0;
}
int cu_win_add(cu_win_plan *p, const dwt *W, uint32_t rows, float *out, size_t out_stride, ds4_err *err);
int cu_win_run(const cu_win_plan *p, cudaStream_t st, ds4_err *err);

/* Matrix product over T tokens (prefill): out[t][row0 + r] for r < rows.
 * In grouped mode (routed experts) `grp` lists, per expert, the rows of
 * the activation to use and where to write. */
typedef struct cu_group {
    const int *tile_mat;   /* per work tile: expert */
    const int *tile_start; /* per work tile: first entry in `perm` */
    const int *tile_count; /* per work tile: entries (<= the tile width) */
    const int *n_tiles;    /* device: number of work tiles */
    uint32_t max_tiles;    /* bound for the grid */
    const int *perm;       /* entries: token*k + slot, grouped by expert */
    uint32_t act_div;      /* activation row = perm[i] / act_div */
} cu_group;

/* split: scratch of cu_gemm_split_floats() floats, owned by the caller
 * and used by one product at a time on st, in which a float product whose
 * grid would leave SMs idle keeps its partial sums over slices of K; NULL:
 * such products are not split. */
int cu_gemm(const dwt *W, uint32_t mat, uint32_t row0, uint32_t rows, const dact *x, uint32_t act_off, uint32_t T,
            float *out, size_t out_stride, const cu_group *grp, float *split, cudaStream_t st, ds4_err *err);
/* The scratch a split float product may need (valid after cu_matmul_init). */
size_t cu_gemm_split_floats(void);

/* ------------------------------------------------------------ backend */

typedef struct dlstate {
    uint32_t ratio;
    float *raw, *comp, *comp_kv, *comp_score, *idx, *idx_kv, *idx_score;
    /* A layer whose compressor projections decode steps defer (cu_defers):
     * the inputs of its current window, row p % ratio for position p,
     * kept by the steps that close no window until the one that does
     * projects them all (NULL: not deferred). */
    float *win;
} dlstate;

/* The device's record of the session: position of the next pass's first
 * token, and the token a decode step embeds (set by the host, or by the
 * previous step's argmax in a greedy run). */
typedef struct dstep {
    uint32_t pos;
    uint32_t token;
    /* the deferred layers' frontiers hold every position below
     * max(fold, their window's start); the window's later positions are in
     * dlstate.win (a prefill, a restore or cu_comp_flush sets it) */
    uint32_t fold;
} dstep;

/* What the sequence keeps from its mark on (cuda_seq.cu): device copies
 * of the frontiers at the mark, of the ring slots rewindable rows
 * overwrite and of their compressor projections; their logits in host
 * memory. */
/* A run of a sequence's frontier floats and its copy in the journal. */
typedef struct cu_front_seg {
    float *state, *jr;
    uint32_t n;
} cu_front_seg;

typedef struct cu_journal {
    bool valid;
    bool on;                             /* the pass being made copies its projections in (cu_journal_proj) */
    uint32_t n0, T, cap;                 /* length at the mark, rows since, rows the buffers hold */
    float *raw, *raw_row, *front, *proj; /* ring slots before the rows, the rows' own, frontiers, projections */
    float **rings;                       /* device: every layer's ring */
    cu_front_seg *segs;                  /* device: every frontier (one launch copies them all) */
    uint32_t n_segs;
    float *logits;                       /* host: cap rows, then the logits at the mark */
    bool had_logits;
} cu_journal;

#define CU_LANES      8 /* streams the parts of a pass run their own work on */
#define CU_STEP_GRAPHS 2 /* captured steps of several rows kept (cuda_backend.steps) */
#define CU_GRAPHS     8 /* decode graphs at most: contexts 8k, 32k, .. (x 4) below the session's, and it */
/* Kinds of decode step, one graph each: no compressor window closes, the
 * ratio-4 windows close (one step in four), the ratio-4 and ratio-128 ones
 * close (one in 128).  A deferred layer does its compressor's work only in
 * the steps that close its window (cu_step_kind). */
#define CU_STEP_KINDS 3
#define CU_GRAPH_CTX0 8192 /* the smallest (ds4_backend_opts.cuda_graph_ctx sets another, for the tests) */

struct cu_mtp;
struct ds4_cuda_clique;

/* A backend's share of each layer under tensor parallelism (cuda_tp.cu,
 * docs/DISTRIBUTED.md 7): rank `rank` of n computes its query heads
 * [head0, head0 + heads) and output groups [group0, group0 + groups) of
 * the attention, its rows [ff0, ff0 + ff) of the shared expert and the
 * routed experts e with e % n == rank (in slot e / n), and every other
 * part of a layer whole, as every rank does; the sublayers' partial
 * outputs are summed over the ranks by an NCCL all-reduce.  n == 1 (no
 * tensor parallelism): the whole of everything. */
typedef struct cu_tp {
    uint32_t rank, n;
    struct ds4_cuda_clique *clique; /* NULL when n == 1 */
    uint32_t heads, head0, groups, group0, ff, ff0;
    int32_t *slot;   /* n > 1, host: n_layer x n_expert, a routed expert's slot here or -1 */
    int32_t *d_slot; /* its device copy */
    uint32_t *n_own; /* n > 1, host: per layer, the routed experts held here */
} cu_tp;

/* A sequence (backend.h): one token stream's state in GPU memory - its
 * layers' rings, compressed rows, frontiers and indexer rows, sized from
 * its context - with the device record of its position (dstep) and the
 * host mirror of its tokens and logits.  The main sequence alone is what
 * the decode graphs were captured for (they hold its pointers); every
 * other one advances by steps (cu_seq_step), whose passes act on the
 * sequence cuda_backend.sq names while they are made. */
typedef struct cu_seq {
    ds4_seq base;
    uint32_t ctx;      /* tokens it holds */
    dlstate *L;        /* per layer (device pointers) */
    void *state_block; /* all layer state, and d_step */
    size_t bytes;      /* its size (cuda_backend.dev_bytes counts it) */
    dstep *d_step;
    cu_journal jr; /* from its mark on */
    uint32_t n_tokens;
    uint32_t *tokens;
    float *logits_h; /* the logits after its last token (host) */
    bool has_logits;
    /* logits_h holds them; else (the main sequence after a decode step)
     * they are the pass's d_last_logits, until a pass of another sequence */
    bool logits_fresh;
    uint32_t fold; /* host copy of dstep.fold */
} cu_seq;

/* A captured step of several rows (cuda_backend.steps): its parts' sequences
 * and rows, in row order, and the steering scales it was captured with. */
typedef struct cu_step_graph {
    cudaGraphExec_t x; /* NULL: the slot is free */
    cu_seq **seq;
    uint32_t *rows;
    uint32_t n;
    float steer[2];
    uint64_t used; /* cuda_backend.steps_clock when it last ran */
} cu_step_graph;

typedef struct cuda_backend {
    ds4_backend base;
    int dev;         /* its GPU (ds4_backend_opts.gpu), made current by every entry point */
    cu_seq main_seq; /* the decode graphs' sequence */
    cu_seq *sq;      /* the sequence the pass being made acts on (a pass of several parts: each part's in turn) */
    /* the sequence whose logits are d_last_logits and not yet in its
     * logits_h (cu_use copies them out before another one's pass) */
    cu_seq *lg_owner;
    const ds4_config *cfg;
    bool sim;
    uint32_t chunk, ctx, raw_cap, comp_cap4, comp_cap128;
    /* The layers it runs, [layer_first, layer_end): all of them, or a
     * pipeline stage's (docs/DISTRIBUTED.md), which holds only their
     * weights and state, starts from the residuals the stage before it
     * hands over (in S) unless it has the embedding (layer_first 0), and
     * ends with the residuals (S) unless it has the output head. */
    uint32_t layer_first, layer_end;
    ds4_rope rope_dense, rope_comp;
    cudaStream_t st;
    /* decode: work that does not feed the next launch runs on `side`,
     * forked from st and joined back (a branch of the step's graph): a
     * ratio layer's compressor beside the query path, the shared expert
     * beside the routing and the routed experts */
    cudaStream_t side;
    cudaEvent_t ev_fork, ev_join;
    /* a pass of several parts: the parts' own work (q / kv post,
     * compressor, indexer, attention) on CU_LANES streams, part i on lane
     * i % CU_LANES, forked from st and joined back, each lane with its own
     * attention scratch (captured: parallel branches of the batched decode
     * graph, whose parts' small launches then overlap) */
    cudaStream_t lane[CU_LANES];
    cudaEvent_t lane_ev[CU_LANES];
    float *lane_attn_part[CU_LANES];
    uint32_t *lane_attn_count[CU_LANES];

    dweights W;
    cu_tp tp;
    struct cu_mtp *mtp; /* the MTP block and its sequence (cuda_mtp.cu); NULL without one */
    /* directional steering (model/steering.h): the directions on the
     * device (NULL without), the scales the decode graphs were captured
     * with, and the activation observer's host rows (chunk x n_embd) */
    float *d_steer;
    float graph_steer[2];
    float *obs_h;
    uint32_t *d_tokens;   /* the chunk's token ids */
    float *d_logits;      /* logits_rows x n_vocab */
    float *d_last_logits; /* row of the last pass's last token */
    uint32_t logits_rows;
    uint32_t *d_argmax; /* tokens recorded by decode steps */
    uint32_t *d_nrec, rec_cap;
    float *argmax_part;
    uint32_t *argmax_idx;

    /* pass buffers, `chunk` tokens each */
    float *S, *post, *comb, *y, *q, *kvbuf, *ckv, *cgate, *ikv, *igate, *iq, *iw, *qa_raw;
    double *hcpart;
    uint32_t hc_split;
    uint32_t *hc_count;    /* per token: HC blocks done (cuda_hc.cu) */
    uint32_t *route_count; /* a decode step's router product: blocks done (cu_gemv_route) */
    double *hcsums;        /* decode: the last HC launch's mixer sums and RMS scale (cuda_sinkhorn.cuh) */
    dact xn, qr, heads, low, mid, smid, hz;
    int *msel;              /* the selected experts' device slots (-1: on the host; cuda_offload.h) */
    uint32_t *expert_count; /* n_layer x n_expert selections (ds4_backend_opts.count_experts), or NULL */
    struct cu_offload *off; /* routed experts on the host, or NULL */
    size_t dev_bytes;       /* device bytes of the weights, state and buffers (the placement's accounting) */
    size_t dev_fixed;       /* of which any placement needs: all but the routed experts, with the slot table */
    float *router, *selw, *eg, *eu, *eout, *sg, *su, *sout, *idx_scores, *attn_part;
    float *split; /* cu_gemm's split scratch */
    int *sel;
    uint32_t *vis, *nvis;
    uint32_t attn_split;  /* most splits of a decode step's rows (cu_attn_splits) */
    uint32_t *attn_count; /* per head group: split blocks done (cuda_attn.cu) */
    uint32_t attn_queries; /* the queries attn_part and attn_count hold: CU_FEW_T, a lane's 1 */
    float *attn_tc_rows;  /* the tensor-core attention's split rows (cu_attn_tc_rows) */
    int *grp_count, *grp_off, *grp_perm, *grp_tile_mat, *grp_tile_start, *grp_tile_count, *grp_ntiles;
    int *few_order; /* a pass of a few: its entries by expert (cu_entry_order) */
    /* the importance-matrix sums (ds4_backend_opts.imatrix; cuda_imatrix.cu),
     * NULL without: n_layer x n_expert x n_embd, x n_ff_exp, routed entries */
    double *imx_in, *imx_mid;
    uint64_t *imx_routes;
    void *buf_block;

    /* The captured decode step, once for each of a few context sizes and
     * each kind of step (capture_step): graph[i][k] serves the steps of
     * kind k (cu_step_kind) below graph_ctx[i], the last the whole context.  A step's grids, the attention's splits and
     * the top-k's cache are sized for the most compressed rows its
     * positions can have, so an early position of a long session does not
     * pay for the session's end.  None with DS4_CUDA_PROFILE (a
     * developer build's eager, timed launches). */
    cudaGraphExec_t graph[CU_GRAPHS][CU_STEP_KINDS];
    uint32_t graph_ctx[CU_GRAPHS], n_graphs, graph_ctx0;
    uint32_t n_kinds;  /* CU_STEP_KINDS with deferred layers, else 1 */
    uint32_t dec_kind; /* the kind of step the decode pass being made is for */
    uint32_t dec_ctx;  /* the context the decode pass being made is sized for (cu_dec_cap) */
    bool capturing;    /* capture_step is recording it: d_step changes only between its replays */
    /* The captured steps of several rows (cuda_seq.cu, graph_step): a
     * batched decode step (one row of each of several sequences) or a
     * verification (the rows of one sequence after its mark), each part's
     * work sized for any position of its sequence, the positions advanced
     * by the graph; one serves every step of the same parts.  The least
     * recently run goes when another is needed. */
    cu_step_graph steps[CU_STEP_GRAPHS];
    uint64_t steps_clock;
} cuda_backend;

/* Whether the backend is a pipeline stage, and whether it has the output
 * head (its passes end with logits, not residuals). */
static inline bool cu_stage(const cuda_backend *b) { return b->layer_first > 0 || b->layer_end < b->cfg->n_layer; }
static inline bool cu_head(const cuda_backend *b) { return b->layer_end == b->cfg->n_layer; }

/* How the backend captures its graphs: restricting its own thread only,
 * so that the backends of other GPUs go on meanwhile in theirs (a
 * pipeline over a host's GPUs runs a thread a stage); a global capture
 * would make their allocations and synchronisations fail. */
#define CU_CAPTURE_MODE cudaStreamCaptureModeThreadLocal

/* The backend's GPU made current: the first thing each entry point does,
 * since one thread may call backends of several GPUs in turn (a pipeline
 * over the GPUs of a host, docs/DISTRIBUTED.md) and a thread starts on
 * device 0.  CU_ON_DEVICE in functions that return an error; the others
 * go on, their next CUDA call failing the same way. */
#define CU_ON_DEVICE(b) CU_TRY(cudaSetDevice((b)->dev))
static inline void cu_on_device(const cuda_backend *b) {
    if (cudaSetDevice(b->dev) != cudaSuccess) (void)cudaGetLastError();
}
static inline int cu_device_error(const cuda_backend *b, ds4_err *err) {
    CU_ON_DEVICE(b);
    return 0;
}

/* Make s the sequence the next passes act on (cuda_backend.sq), first
 * copying the logits another sequence left on the device to its host
 * mirror (cuda_backend.lg_owner). */
int cu_use(cuda_backend *b, cu_seq *s, ds4_err *err);
/* The logits after s's last token, on the host (NULL: none, or a read
 * failed). */
const float *cu_seq_logits(cuda_backend *b, cu_seq *s);

/* The kind of the decode step at position pos (CU_STEP_KINDS), and
 * whether a step of kind k closes the windows of a ratio layer. */
static inline uint32_t cu_step_kind(const cuda_backend *b, uint32_t pos) {
    if (b->n_kinds == 1) return 0;
    return (pos + 1) % 128 == 0 ? 2 : (pos + 1) % 4 == 0 ? 1 : 0;
}
static inline bool cu_kind_closes(uint32_t kind, uint32_t ratio) { return ratio == 4 ? kind >= 1 : kind == 2; }

/* Whether a pass's launches may read the position before their PDL wait
 * (dev_pdl_wait_pos): a decode graph's, whose steps run one after
 * another, and whose position only its last kernel writes. */
static inline bool cu_pos_early(const cuda_backend *b, uint32_t T) { return b->capturing && T == 1; }

/* Room for the compressed rows of a ratio layer in a context of ctx
 * tokens (two rows of slack). */
static inline uint32_t cu_comp_cap(uint32_t ctx, uint32_t ratio) { return ctx / ratio + 2; }

/* The most compressed rows of a ratio layer (4 or 128) that a decode
 * pass's positions can have (cuda_backend.dec_ctx). */
static inline uint32_t cu_dec_cap(const cuda_backend *b, uint32_t ratio) { return cu_comp_cap(b->dec_ctx, ratio); }

/* A part of a pass: its rows [r0, r0 + n) are the next n tokens of
 * sequence s, whose length is pos0. */
typedef struct cu_part {
    cu_seq *s;
    uint32_t r0, n, pos0;
} cu_part;

/* cuda_forward.cu: one pass of T tokens (ids at d_tok) of the sequence
 * b->sq, the first at position pos0; host_all, when given, receives the
 * logits of every token. */
int cu_forward(cuda_backend *b, const uint32_t *d_tok, uint32_t T, uint32_t pos0, bool decode, float *host_all,
               ds4_err *err);
/* One pass of T rows in parts of several sequences (a decode pass: one
 * part of one row): the products of all rows at once - the routed experts
 * grouped over them, each expert's weights read once - and each part's
 * attention over its own state.  host: the logits of the rows `need`
 * marks (NULL: all), in row order; none: the last row's into d_logits.
 * One part: its position advanced and next greedy token set, as
 * cu_step_end; several: the caller sets their positions. */
int cu_forward_parts(cuda_backend *b, const uint32_t *d_tok, const cu_part *parts, uint32_t n_parts, uint32_t T,
                     bool decode, const bool *need, float *host, ds4_err *err);
int cu_attention_layer(cuda_backend *b, uint32_t il, const cu_part *parts, uint32_t n_parts, uint32_t T, bool decode,
                       ds4_err *err);
int cu_ffn_layer(cuda_backend *b, uint32_t il, const uint32_t *tok, uint32_t T, bool decode, ds4_err *err);
/* A decode step's routed-expert products of layer il, gate and up (else
 * down), of the slots esel selects: the resident tier's (gpu) and the
 * mapped tier's (its nmap experts; cuda_offload.h). */
int cu_decode_experts(cuda_backend *b, uint32_t il, const int *esel, bool gpu, uint32_t nmap, bool gate_up,
                      ds4_err *err);

/* The MTP block's pass (its input S made by cuda_mtp.cu, position and
 * logits those of the MTP sequence): its layer (n_layer), its HC head and
 * norm, the model's output matrix. */
int cu_forward_mtp(cuda_backend *b, const uint32_t *d_tok, uint32_t T, uint32_t pos0, bool decode, float *host_all,
                   ds4_err *err);

/* cuda_mtp.cu: the MTP block (docs/MODEL.md 9) and its one sequence.
 * init: after the weights, before the decode graphs are captured (they
 * keep the main sequence's final residuals); cfg then points at the
 * block's copy of the config, whose layer n_layer is the block's. */
int cu_mtp_init(cuda_backend *b, ds4_err *err);
void cu_mtp_free(cuda_backend *b);
/* The final residuals (S) of the pass's T rows into the ring of the
 * sequence being advanced (the main one, or in cu_forward_mtp the MTP
 * sequence's), at slots of their positions (d_step->pos on). */
int cu_mtp_keep_hidden(cuda_backend *b, uint32_t T, bool mtp_pass, ds4_err *err);
/* The device copy of the MTP block's own tensors. */
const dmtp *cu_mtp_dev(const cuda_backend *b);
/* The backend's calls on the MTP sequence (s its sequence: cu_mtp_seq). */
bool cu_mtp_seq(const cuda_backend *b, const ds4_seq *s);
ds4_seq *cu_mtp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err);
void cu_mtp_seq_free(cuda_backend *b);
int cu_mtp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err);
int cu_mtp_mark(cuda_backend *b, ds4_err *err);
int cu_mtp_rewind(cuda_backend *b, uint32_t n_tokens, ds4_err *err);
void cu_mtp_reset(cuda_backend *b);
uint32_t cu_mtp_len(const cuda_backend *b);
const float *cu_mtp_logits(cuda_backend *b);

/* cuda_seq.cu: the batched step and the rewind (backend.h); the pass's
 * hook that journals layer il's projections (nothing unless a rewindable
 * step is being made). */
int cu_seq_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err);
/* A pipeline stage's step as one eager pass over its rows (in: the
 * entering residuals, a stage after the first; resid: the leaving ones, a
 * stage before the head). */
int cu_seq_stage_pass(ds4_backend *base, const ds4_row *rows, uint32_t n, const float *in, float *resid,
                      const ds4_step_out *out, ds4_err *err);
int cu_seq_mark(ds4_backend *base, ds4_seq *s, ds4_err *err);
int cu_seq_rewind(ds4_backend *base, ds4_seq *s, uint32_t n_tokens, ds4_err *err);
int cu_journal_proj(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err);
/* The pass's own ring rows of layer il (kvbuf, once its q / kv post made
 * them), likewise. */
int cu_journal_rows(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err);
void cu_journal_free(cu_journal *j);
/* The journal's device lists of s's rings and frontiers (made at its first
 * mark, again when the sequence is resized). */
int cu_journal_bind(cuda_backend *b, cu_seq *s, ds4_err *err);
/* Drop the captured steps of several rows that hold s (s is being freed or
 * resized; NULL: every one). */
void cu_step_graphs_drop(cuda_backend *b, const cu_seq *s);

/* cuda_hc.cu */
typedef struct hc_post_src {
    const float *y;    /* attention output, or NULL */
    const float *eout; /* routed outputs (T x k x D), with the shared one */
    const float *sout;
    uint32_t k;
    /* routed experts on the host: slot i of token t is hout's where
     * hsel[t k + i] < 0, else eout's (NULL: all eout's) */
    const int *hsel;
    const float *hout;
} hc_post_src;
/* A decode HC site's Sinkhorn, hosted by a spare block of a later launch
 * (cuda_sinkhorn.cuh): its sums (NULL: no job), the site's scale and base
 * vectors, and where post / comb go. */
typedef struct hc_sink_job {
    const double *sums;
    const float *scale, *base;
    float *post, *comb;
    uint32_t iters;
    float eps;
} hc_sink_job;

/* An HC site: its mixer, the norm of the sublayer it feeds (or of the
 * output head: pre weights only) and where that input goes. */
typedef struct hc_site {
    const dwt *fn, *scale, *base, *norm;
    bool head;
    dact *out;
    /* decode, never the head: the site's post / comb (Sinkhorn) are
     * computed by a block of a later launch (cu_hc_sink_job), from the sums
     * the launch leaves in hcsums (cuda_sinkhorn.cuh) */
    bool sink_later;
    /* the quantized forms of `out` (ACT_Q8, ACT_QK) the sublayer's products
     * read: the others are not written (f32 always is) */
    unsigned forms;
} hc_site;
/* Columns of the residual state per block of the HC launch (its part
 * buffer holds a slice of partial sums per block). */
uint32_t cu_hc_cols(void);
/* One launch: the HC post of `post` (NULL: none) into the residual state,
 * then the site's mixer, pre / post / comb and its sublayer's normalised,
 * quantized input.  No site: the HC post alone (the last layer of a
 * pipeline stage, whose next sublayer is the next stage's), with the
 * arithmetic of the fused launch, so the residuals have its bits. */
int cu_hc_step(cuda_backend *b, const hc_post_src *post, const hc_site *site, uint32_t T, ds4_err *err);

/* cuda_tp.cu: tensor parallelism (cu_tp).  init: the backend's share
 * from its options (rank of tensor_parallel), refusing a model whose
 * heads, groups, shared-expert rows or blocks do not divide among the
 * ranks; before the weights are shaped. */
int cu_tp_init(cuda_backend *b, const ds4_weights *w, ds4_err *err);
void cu_tp_free(cu_tp *tp);
/* The rank's part of layer tensor `field` (its offset in dlayer): rows
 * [*row0, *row0 + *rows) and values [*col0, *col0 + *n) of each row of the
 * whole, which come in as the whole's rows and n; false when every rank
 * holds it whole. */
bool cu_tp_part(const cu_tp *tp, const ds4_config *c, size_t field, uint32_t *row0, uint32_t *rows, uint32_t *col0,
                uint32_t *n);
/* The all-reduce of a sublayer's partial outputs: the attention's (b->y),
 * or the FFN's - the rank's routed experts (slots msel >= 0) and its part
 * of the shared expert summed into b->y first - after which post reads
 * b->y.  Nothing when n == 1. */
int cu_tp_reduce_attn(cuda_backend *b, uint32_t T, ds4_err *err);
int cu_tp_reduce_ffn(cuda_backend *b, uint32_t T, hc_post_src *post, ds4_err *err);
/* cuda_nccl.cu: the sum over the clique of rank's n floats at buf, in
 * place, on st (captured with st). */
int cu_nccl_allreduce(struct ds4_cuda_clique *c, int rank, float *buf, size_t n, cudaStream_t st, ds4_err *err);

/* cuda_steer.cu: the sublayer output of layer il at a steering point with
 * the scale of the pass's sequence (b->sq; the parts of a pass of several
 * all have the same, cu_seq_step), and to the activation observer (not in
 * decode passes).  The attention's is b->y; the FFN's (post, routed + shared) is
 * first summed into b->y when steered or observed, and post then reads
 * b->y.  Nothing at all when neither applies. */
int cu_steer(cuda_backend *b, uint32_t il, uint32_t T, bool ffn, bool decode, hc_post_src *post, ds4_err *err);
/* The scales a decode step of the main sequence runs with now. */
static inline bool cu_steer_changed(const cuda_backend *b) {
    return b->d_steer &&
           (b->main_seq.base.steer_ffn != b->graph_steer[0] || b->main_seq.base.steer_attn != b->graph_steer[1]);
}
/* hcsums: the mixer's reduced sums (sum of squares, then the rows; at
 * most 32) and, at HC_SUMS_RS, the RMS scale as a double. */
#define HC_SUMS_RS 32
#define HC_SUMS    (HC_SUMS_RS + 1)
/* The job that computes a decode site's post / comb in a spare block of a
 * later launch (NULL site: none, sums NULL). */
hc_sink_job cu_hc_sink_job(const cuda_backend *b, const hc_site *site);

/* cuda_attn.cu */
int cu_embed_tokens(cuda_backend *b, const uint32_t *d_tok, uint32_t T, ds4_err *err);
int cu_qkv_post(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err);
/* keep: a decode step that closes no window of layer il, deferred: its
 * input also goes into the window (dlstate.win). */
int cu_q_post(cuda_backend *b, uint32_t il, uint32_t T, bool keep, ds4_err *err);
/* Layer il's compressed rows of the pass, then its frontier rebuilt, on
 * st; emitted (not NULL): recorded on st between the two, for a decode
 * step's query path to wait for the rows alone - no launch of the step
 * reads the frontier, which runs on beside the attention.  decode: sized
 * for any position (a decode step, a captured step of several rows), the
 * position read on the device; else for pos0, the pass's own. */
int cu_compress(cuda_backend *b, uint32_t il, uint32_t T, uint32_t pos0, bool decode, cudaStream_t st,
                cudaEvent_t emitted, ds4_err *err);
/* The compressors' projections of layer il (the attention's; at a ratio-4
 * layer also the indexer's) of T tokens of x into the pass buffers (ckv,
 * cgate, ikv, igate), by the tensor-core product, on st. */
int cu_comp_products(cuda_backend *b, uint32_t il, const dact *x, uint32_t T, cudaStream_t st, ds4_err *err);
/* A deferred layer (dlstate.win) in a decode step that closes its window:
 * the window's projections (its earlier inputs from win, the step's from
 * xn) and its compressed rows, then its frontier, on st, with `emitted`
 * as cu_compress's. */
int cu_compress_window(cuda_backend *b, uint32_t il, cudaStream_t st, cudaEvent_t emitted, ds4_err *err);
/* The positions that decode steps left in the deferred layers' windows
 * projected and folded into their frontiers (before a prefill pass or a
 * snapshot reads them); sets fold to the session's length. */
int cu_comp_flush(cuda_backend *b, ds4_err *err);
/* A compressor lane of one pass (MODEL.md 6.2): its frontier (the rows
 * of the current window - and for ratio 4 the previous one - that earlier
 * passes left), the pass's projections, and where its compressed rows go. */
typedef struct comp_lane {
    float *skv, *ssc;         /* frontier: SR x width */
    const float *ckv, *cgate; /* the pass's projections: T x width */
    const uint8_t *ape;
    uint32_t ape_type;
    const uint8_t *norm;
    uint32_t norm_type;
    float *rows; /* compressed rows, hd each */
    uint32_t hd, width, ratio;
    bool indexer;
} comp_lane;

typedef struct comp_args {
    comp_lane lane[2];
    uint32_t n_lanes, T, rope_dim;
    const uint32_t *pos0;
    /* the pass's positions start `back` before *pos0; with fold set (a
     * deferred layer's window, cu_compress), those below *fold are the
     * frontier's, not the pass's */
    uint32_t back;
    const uint32_t *fold;
    bool pos_early; /* as attn_args.pos_early */
    ds4_rope rope;
    float eps;
    bool sim;
} comp_args;
/* The rows (hd <= 512: check_config) of the nwin windows that can close
 * in the pass (a block per window and lane; those that do not close exit):
 * pooled, normalised,
 * RoPE'd, rounded.  batched: windows wholly inside the pass pool their
 * candidates in batches of loads - the same sums in the same order
 * (cu_compress; exported for the kernel test, which holds it to that). */
int cu_comp_emit(const comp_args *a, uint32_t nwin, bool batched, cudaStream_t st, ds4_err *err);

/* cuda_indexer.cu */
int cu_indexer(cuda_backend *b, uint32_t il, uint32_t T, uint32_t pos0, bool decode, ds4_err *err);
/* Query t's (position *pos0 + t) indexer scores of the (pos + 1) / 4
 * compressed rows of its prefix, when they are more than top_k: score[c] =
 * sum_h iw[t][h] max(0, iq[t][h] . rows[c]) into row t of scores; max_nc
 * bounds the rows of any query; tc: on the tensor cores (prefill), else
 * on the SIMT units (cu_indexer; exported for the kernel test).
 * pos_early, here and in cu_topk: as attn_args.pos_early. */
int cu_idx_scores(const uint32_t *pos0, bool pos_early, const float *iq, const float *iw, const float *rows, uint32_t T,
                  uint32_t max_nc, uint32_t heads, uint32_t ihd, uint32_t top_k, float *scores, size_t score_stride,
                  bool tc, cudaStream_t st, ds4_err *err);
/* Query t (position *pos0 + t) sees the (pos + 1) / 4 compressed rows of
 * its prefix, or the top_k of them by score (row t of scores): their
 * indices in ascending order into vis row t, their count into nvis[t].
 * max_nc: the most rows a query of the launch has (sizes its cache). */
int cu_topk(const uint32_t *pos0, bool pos_early, const float *scores, size_t score_stride, uint32_t max_nc, uint32_t T,
            uint32_t top_k, uint32_t *vis, uint32_t *nvis, cudaStream_t st, ds4_err *err);

/* cuda_attn.cu: attention */
/* The pass at pos0 (the host's copy of d_step->pos); sink: the HC site whose
 * Sinkhorn the decode attention hosts, or NULL. */
int cu_attend(cuda_backend *b, uint32_t il, uint32_t T, uint32_t pos0, const hc_site *sink, ds4_err *err);
/* The decode attention's scratch for one query: its head groups (a done
 * counter each), the splits of `rows` visible rows at most, and the floats
 * of the partial results of `splits` splits. */
uint32_t cu_attn_groups(const ds4_config *c);
uint32_t cu_attn_splits(const ds4_config *c, uint32_t rows);
size_t cu_attn_part_floats(const ds4_config *c, uint32_t splits);

/* One attention pass (cuda_attn.cu): the visible rows of query t (at
 * position *pos0 + t) are its raw window - rows before *pos0 in the ring
 * (row r at r % raw_cap), the pass's own in kvbuf - then its compressed
 * rows (ratio 4: the nvis[t] listed in vis[t][..top_k], no more than the
 * (pos + 1) / 4 complete ones; ratio 128: all complete ones).  heads gets
 * the normalised outputs, key RoPE undone. */
typedef struct attn_args {
    const uint32_t *pos0;
    bool pos_early; /* *pos0 may be read before the PDL wait (cu_pos_early) */
    const float *q; /* as q_post_kernel leaves them; tc: as projected (the kernel does their q post) */
    float q_eps;    /* tc: the q post's RMSNorm epsilon */
    const float *kvbuf, *ring, *comp;
    const uint32_t *vis, *nvis;
    const float *sinks; /* F32 */
    uint32_t n_head, hd, window, raw_cap, ratio, top_k, nsplit, rope_dim;
    float *part;     /* nsplit > 1: per (t, head group, part): m[H], l[H], o[H][hd] in slot order (attn_heads_kernel) */
    uint32_t *count; /* nsplit > 1: per (t, head group): blocks done (back to 0 after each launch) */
    dact heads;      /* the output */
    ds4_rope rope;
    hc_sink_job sink; /* decode: the Sinkhorn of the HC site that prepared the attention, one more block */
    /* tc: the visible rows split into binary16 heads and tails once a pass
     * (atc_prep_kernel): the ring's slots, the pass's rows from raw_cap, the
     * compressed rows from tc_comp0, tc_nrows in all, then a row of zeros;
     * cu_attn_tc_floats(hd, tc_nrows) floats */
    float *tc_rows;
    uint32_t tc_comp0, tc_nrows;
} attn_args;
/* The launch of a pass: on the tensor cores (tc: attn_tc_kernel, long
 * prefill passes, after splitting the pass's tc_nrows rows) or a
 * warp per two heads (attn_heads_kernel). */
int cu_attn_run(const attn_args *a, uint32_t T, bool tc, cudaStream_t st, ds4_err *err);
/* Rows of the tensor-core attention's split scratch a session needs (0 when
 * no pass is long enough to take that kernel), and the floats of a scratch
 * of `rows` rows of hd values. */
size_t cu_attn_tc_rows(const cuda_backend *b);
size_t cu_attn_tc_floats(uint32_t hd, size_t rows);
/* Whether a pass of T tokens takes the tensor-core attention. */
bool cu_attn_tc(const cuda_backend *b, uint32_t T);

/* Passes of up to this many tokens attend with the head-blocked kernel. */
#define CU_ATTN_BLOCKED_T 16

/* cuda_ffn.cu */
/* The routing launch of T tokens (cu_route_in: T x n_expert logits). */
int cu_route_tokens(const cu_route_in *in, uint32_t T, int *sel, float *selw, cudaStream_t st, ds4_err *err);
/* decode: a decode step's (the mapped tier's slots, cuda_offload.h) */
int cu_route(cuda_backend *b, uint32_t il, const uint32_t *tok, uint32_t T, bool decode, ds4_err *err);
/* Makes the router product of plan p (a decode step's: one token) route
 * in its last block, if it can (a block a row, at most 512 experts):
 * true if so, and then no routing launch follows it. */
bool cu_gemv_route(cuda_backend *b, uint32_t il, const uint32_t *tok, gemv_plan *p);
/* The T tokens' entries grouped by sel (expert, or device slot: negative
 * entries are left out). */
int cu_group_tokens(cuda_backend *b, const int *sel, uint32_t T, cu_group *g, ds4_err *err);
/* order: the n entries of sel (at most CU_FEW_ENTRIES) by selection, ties
 * by entry: entries of one expert adjacent (cu_gemv_reps' order). */
int cu_entry_order(const int *sel, uint32_t n, int *order, cudaStream_t st, ds4_err *err);
/* Which rows a SwiGLU launch makes: the routed experts', the shared one's. */
enum { SWIGLU_ROUTED = 1, SWIGLU_SHARED = 2, SWIGLU_ALL = 3 };
/* sink: the HC site whose Sinkhorn the launch hosts (one more block; the
 * shared expert's SwiGLU of a decode step), or NULL. */
int cu_swiglu(cuda_backend *b, uint32_t il, uint32_t T, unsigned which, const hc_site *sink, cudaStream_t st,
              ds4_err *err);
/* A pass's end on the device: the next greedy token (the argmax of
 * d_last_logits; record: the pass's token also into d_argmax) and the
 * position advanced by T; a pipeline stage before the head only advances
 * the position. */
int cu_step_end(cuda_backend *b, uint32_t T, bool record, ds4_err *err);

/* cuda_imatrix.cu: layer il's routed-expert inputs of a prefill pass of T
 * tokens added to the device sums (after its routed products; nothing
 * without a collector), and the sizes of those sums (in doubles; mid and
 * the routed entries' counters through the pointers). */
int cu_imatrix_sum(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err);
size_t cu_imatrix_floats(const ds4_config *c, size_t *mid, size_t *routes);
/* d_step's fields that cu_set_step sets (a set of them): the position,
 * the token, the fold (to the position given). */
enum { STEP_POS = 1, STEP_TOKEN = 2, STEP_FOLD = 4 };
int cu_set_step(cuda_backend *b, int which, uint32_t pos, uint32_t token, ds4_err *err);
/* b->sq's position one further, its frontiers holding every position
 * (fold): a captured batched step's end, for each of its sequences. */
int cu_advance(cuda_backend *b, ds4_err *err);
int cu_fill(cuda_backend *b, float *p, size_t n, float v, ds4_err *err);

/* cuda_matmul.cu: device tables the products need, before any capture. */
int cu_matmul_init(ds4_err *err);

/* ---------------------------- device helpers of cuda_hc.cu and cuda_attn.cu */

/* One element of a float tensor row (F32 / F16 / BF16). */
static __device__ __forceinline__ float fvec(const uint8_t *p, uint32_t type, size_t i) {
    if (type == DS4_TYPE_F32) return ((const float *)p)[i];
    if (type == DS4_TYPE_F16) return dev_f16(((const uint16_t *)p)[i]);
    return dev_bf16(((const uint16_t *)p)[i]);
}

/* N elements i0, i0 + stride, ... of a float tensor (0 where !on): the
 * type is tested once and every load is issued before any is converted,
 * so the N loads are one memory round trip, not N (fvec in a loop would
 * branch per element and serialise them). */
template <int N>
static __device__ __forceinline__ void fvec_n(const uint8_t *p, uint32_t type, size_t i0, size_t stride, bool on,
                                              float (&f)[N]) {
    if (type == DS4_TYPE_F32) {
#pragma unroll
        for (int k = 0; k < N; k++) f[k] = on ? __ldg((const float *)p + i0 + k * stride) : 0.0f;
        return;
    }
    uint16_t raw[N];
#pragma unroll
    for (int k = 0; k < N; k++) raw[k] = on ? __ldg((const uint16_t *)p + i0 + k * stride) : 0;
    bool bf = type == DS4_TYPE_BF16;
#pragma unroll
    for (int k = 0; k < N; k++) f[k] = bf ? dev_bf16(raw[k]) : dev_f16(raw[k]);
}

/* A float as an unsigned key in the same order (larger float, larger key;
 * -0 counts as +0, since the CPU compares floats): top-k selections find
 * their largest keys with integer radix digits or one warp reduction. */
static __device__ __forceinline__ uint32_t dev_order_key(float f) {
    if (f == 0.0f) f = 0.0f;
    uint32_t u = __float_as_uint(f);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* Block-wide row helpers take up to NORM_PER values a thread: value
 * threadIdx.x + u blockDim.x is the thread's u-th.  The q / kv post
 * normalises rows of q_lora_rank values with QKV_POST_THREADS threads
 * (check_config holds the rank to what they take). */
#define NORM_PER         8
#define QKV_POST_THREADS 256

/* x[0 .. n) <- src (global memory) by the block, each thread's values
 * loaded before any is stored (a loop of single loads and stores would
 * wait a round trip for each). */
template <typename T> static __device__ __forceinline__ void block_load_row(T *x, const T *src, uint32_t n) {
    for (uint32_t i0 = threadIdx.x; i0 < n; i0 += NORM_PER * blockDim.x) {
        T v[NORM_PER];
#pragma unroll
        for (int u = 0; u < NORM_PER; u++) {
            uint32_t i = i0 + u * blockDim.x;
            v[u] = i < n ? src[i] : (T)0;
        }
#pragma unroll
        for (int u = 0; u < NORM_PER; u++)
            if (i0 + u * blockDim.x < n) x[i0 + u * blockDim.x] = v[u];
    }
}

/* The RMSNorm weights of the thread's values of an n-value row (n <=
 * NORM_PER blockDim.x), all loaded at once; 1 without weights.  Weights
 * are written by no kernel: a kernel loads them before dev_pdl_wait_prev,
 * while the kernel before it finishes. */
typedef struct norm_w {
    float w[NORM_PER];
} norm_w;

static __device__ __forceinline__ norm_w block_norm_weights(const uint8_t *w, uint32_t type, uint32_t n) {
    norm_w r;
    if (!w) {
#pragma unroll
        for (int u = 0; u < NORM_PER; u++) r.w[u] = 1.0f;
        return r;
    }
    if (type == DS4_TYPE_F32) {
#pragma unroll
        for (int u = 0; u < NORM_PER; u++) {
            uint32_t i = threadIdx.x + u * blockDim.x;
            r.w[u] = i < n ? __ldg((const float *)w + i) : 0.0f;
        }
        return r;
    }
    uint16_t raw[NORM_PER];
#pragma unroll
    for (int u = 0; u < NORM_PER; u++) {
        uint32_t i = threadIdx.x + u * blockDim.x;
        raw[u] = i < n ? __ldg((const uint16_t *)w + i) : 0;
    }
    bool bf = type == DS4_TYPE_BF16;
#pragma unroll
    for (int u = 0; u < NORM_PER; u++) r.w[u] = bf ? dev_bf16(raw[u]) : dev_f16(raw[u]);
    return r;
}

/* x <- x * w / rms(x) over n <= NORM_PER blockDim.x values (shared
 * memory), the weights from block_norm_weights; sum of squares in double,
 * as cpu_rmsnorm. */
static __device__ inline void block_rmsnorm(float *x, uint32_t n, const norm_w &nw, float eps) {
    __shared__ double red[32];
    double ss = 0.0;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) ss += (double)x[i] * (double)x[i];
    ss = block_sum(ss, red);
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
#pragma unroll
    for (int u = 0; u < NORM_PER; u++) {
        uint32_t i = threadIdx.x + u * blockDim.x;
        if (i < n) x[i] = x[i] * scale * nw.w[u];
    }
    __syncthreads();
}

#endif
