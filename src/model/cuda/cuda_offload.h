/*
 * cuda_offload.h - routed experts in host RAM beside the CUDA backend
 * (docs/DESIGN.md 3.5; cuda_offload.cu).
 *
 * When the model does not fit the GPU's budget (ds4_backend_opts.gpu_mem),
 * everything but the routed experts is resident, and of those as many as
 * the placement (model/placement.h) gives the GPU; the others stay in the
 * mmap'ed file.  Each routed tensor of layer l then holds n_gpu[l]
 * matrices, in slots; slot[l][e] is expert e's slot or -1.
 *
 * A pass's FFN of a layer with host experts (cu_ffn_layer):
 *
 *   router product and routing on the GPU; the routing also writes msel,
 *   the selected experts' slots (-1: on the host);
 *   [host branch, its own stream]  a launch copies the pass's FFN inputs
 *   and selections into pinned host memory; a host function computes the
 *   host experts of the selections with the CPU kernels (format/quants.h,
 *   multi-threaded), writing their outputs into pinned host memory;
 *   [GPU]  the resident experts by slot (a -1 slot is skipped) and the
 *   shared expert, as without offloading;
 *   join: the HC post reads each slot's output from the device (msel >= 0)
 *   or from the host's (msel < 0).
 *
 * One hand-off a layer, no device synchronisation: the decode graph
 * captures the host branch (kernel, host function) with the rest.
 *
 * The mapped tier: of each layer's host experts, a share (the CPU's
 * measured cost of an entry against PCIe's of an expert, so that both
 * sides end together) is also copied, in the device's layout, into pinned
 * host memory that the GPU reads directly.  In a decode step (one token)
 * the routing gives these experts slots past the layer's device ones
 * (slot1: n_gpu + index), the GPU's products read them over PCIe while the
 * CPU computes the others, and the HC post takes their outputs from the
 * device as it takes the resident experts'.  Passes of several tokens
 * leave them to the host side (slot: -1), streamed or computed there.
 *
 * A prefill chunk whose host experts serve many tokens each streams them
 * instead (cu_offload_stream): their weights go over PCIe, repacked by
 * the CPU into pinned stages and copied into device stages, two of each in
 * turn (the next batch is repacked and copied while the GPU multiplies
 * the last), and the GPU computes them as it does its own.  Which of the
 * two a chunk takes is decided by the measured costs: the PCIe bandwidth
 * (measured at creation) against the CPU's time per (token, expert)
 * (measured at creation and on every host job since).
 */
#ifndef DS4_MODEL_CUDA_CUDA_OFFLOAD_H
#define DS4_MODEL_CUDA_CUDA_OFFLOAD_H

#include "model/cuda/cuda_rt.h"

extern "C" {
#include "base/threads.h"
#include "model/placement.h"
#include "model/weights.h"
}

struct cuda_backend;
struct cu_offload;

/* The host function's argument: a layer of the offload (T: the pass's
 * tokens, set when the branch is enqueued; a decode graph's is 1). */
typedef struct cu_host_job {
    struct cu_offload *o;
    uint32_t il, T;
    bool mapped; /* a decode step: the mapped tier's experts are the GPU's */
} cu_host_job;

typedef struct cu_offload {
    const ds4_config *cfg;
    ds4_placement place;
    int32_t *slot;        /* host: n_layer x n_expert, the device slot or -1 */
    int32_t *d_slot;      /* device copy */
    /* the mapped tier: per layer its experts, the slots of a decode step
     * (slot's, a mapped expert's n_gpu + its index), the pinned memory
     * (per layer the gate, up and down matrices of its mapped experts, in
     * the device's layout) and views of it as device tensors (n_layer x 3) */
    uint32_t *n_map;
    int32_t *slot1, *d_slot1;
    uint8_t *map;
    uint64_t map_bytes;
    uint32_t map_experts;
    struct dwt *map_w;
    const uint8_t **hmat; /* n_layer x 3 x n_expert: an expert's matrix on the host (GGUF layout), NULL on the GPU */
    const ds4_wt **hwt;   /* n_layer x 3: the tensors (types, shapes) */
    uint8_t *synth;       /* synthetic weights: the host experts' bytes */
    size_t synth_bytes;
    float *clamp; /* per layer: the SwiGLU clamp */
    ds4_pool *pool;
    uint32_t chunk; /* tokens a pass holds at most */
    /* hand-off (pinned host memory that the GPU's launches read and write) */
    float *h_x;    /* chunk x D: FFN inputs */
    int *h_sel;    /* chunk x k: experts */
    float *h_selw; /* chunk x k: their routing weights */
    float *h_out;  /* chunk x k x D: the host experts' outputs */
    /* CPU scratch: entries (token, slot) grouped by expert */
    uint32_t *ent, *ent_off;         /* entries (t * k + i), by expert; each expert's first */
    uint32_t *used;                  /* the experts with entries */
    uint8_t *xact_g, *xact_u, *mact; /* quantized gate / up inputs, down inputs, an entry's row each */
    size_t xrow_g, xrow_u, mrow;
    float *eg, *eu, *dout; /* gate, up (entries x F), down outputs (entries x D) */
    cudaStream_t hs;
    cudaEvent_t ev_route, ev_host;
    cu_host_job *jobs;  /* per layer: eager passes' (T set as each is enqueued) */
    cu_host_job *gjobs; /* per layer: the decode graphs' (T = 1 always) */
    /* prefill streaming: S experts a stage; a stage holds the gate, up and
     * down matrices of S experts, each part sized for the largest layer */
    uint32_t S;
    size_t stage_part[3], stage_bytes;
    uint8_t *stage_h[2];     /* pinned */
    uint8_t *stage_d;        /* device: two stages */
    int *ssel_h[2], *ssel_d; /* an entry's slot in a stage (-1: not in it); device: two of chunk x k */
    int32_t *batch_slot;     /* per expert: its slot in the stage being filled, or -1 */
    cudaStream_t cs;         /* the copies */
    cudaEvent_t ev_copied[2], ev_free[2];
    double pcie_bw;       /* bytes/s, pinned host to device */
    double sec_per_entry; /* the CPU's seconds per (token, expert) */
    /* the host work so far (ds4_offload_info): host functions run, the
     * entries they computed, the seconds from each one's start to its end */
    uint64_t host_jobs, host_entries;
    double host_sec;
} cu_offload;

/* Placement for backend b (its weights' shapes known, fixed: the bytes it
 * allocates besides the routed experts, budget: what it may allocate):
 * NULL with *err clear when every expert fits; else the offload, with its
 * slots and host matrices.  Prints the placement. */
int cu_offload_plan(struct cuda_backend *b, const ds4_weights *w, uint64_t fixed, uint64_t budget, cu_offload **out,
                    ds4_err *err);
/* Host buffers, threads, streams and the device slot table. */
int cu_offload_init(struct cuda_backend *b, cu_offload *o, const ds4_weights *w, ds4_err *err);
/* Once the pass buffers exist: the mapped tier's products timed as a
 * decode step runs them; where the GPU reads its experts slower than the
 * copy engine's rate that sized the tier, each layer's tier keeps the
 * share that balances the measured rate against the CPU's. */
int cu_offload_measure(struct cuda_backend *b, ds4_err *err);
void cu_offload_free(cu_offload *o);

/* Whether layer il has experts on the host, and whether it has any on the
 * GPU; the experts of its mapped tier. */
static inline bool cu_offload_host(const cu_offload *o, uint32_t il) {
    return o && o->place.n_gpu[il] < o->place.n_expert;
}
static inline bool cu_offload_gpu(const cu_offload *o, uint32_t il) { return !o || o->place.n_gpu[il] > 0; }
static inline uint32_t cu_offload_mapped(const cu_offload *o, uint32_t il) { return o && o->n_map ? o->n_map[il] : 0; }
/* Device bytes the offload allocates: the slot table, the two stages and
 * their selections (b's weights shaped with every expert). */
size_t cu_offload_dev_bytes(const struct cuda_backend *b);

/* Whether layer il's host experts of a prefill pass of T tokens (after the
 * routing) are cheaper streamed than computed by the CPU: waits for the
 * routing, reads the selections. */
int cu_offload_pick_stream(struct cuda_backend *b, uint32_t il, uint32_t T, bool *stream, ds4_err *err);
/* Layer il's host experts of the pass, streamed and computed on the GPU
 * into the routed outputs (after the resident experts' products). */
int cu_offload_stream(struct cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err);

/* The host branch of layer il's FFN for a pass of T tokens (a decode step:
 * decode, the mapped tier left to the GPU): forked from st after the
 * routing, ends with ev_host recorded (cu_offload_join). */
int cu_offload_branch(struct cuda_backend *b, uint32_t il, uint32_t T, bool decode, ds4_err *err);
int cu_offload_join(struct cuda_backend *b, ds4_err *err);

#endif
