/*
 * cuda_ffn.cu - the MoE sublayer's small kernels (docs/MODEL.md 6.4),
 * mirroring src/model/cpu/cpu_ffn.c, and the per-pass bookkeeping on the
 * device: greedy argmax and the step record (position, next token).
 *
 *   route     router probabilities sqrt(softplus), the hash table or the
 *             biased top-k (descending, lower index on ties), the
 *             normalised routing weights;
 *   group     prefill: the (token, slot) entries sorted by expert and cut
 *             into tiles of at most 64 for the grouped products;
 *   swiglu    clamped SwiGLU (routed rows times their weight, as the CPU
 *             applies it before the down projection) and the quantized
 *             form the down projection reads.
 */
#include "model/cuda/cuda_route.cuh"
#include "model/cuda/cuda_sinkhorn.cuh"

/* ------------------------------------------------------------- routing */

/* The routing launch: a warp a token (route_token, cuda_route.cuh), the
 * bias loaded before the wait.  A decode step's routing runs instead in
 * the last block of the router product (cu_gemv_route). */
template <int PER> static __global__ void route_kernel(cu_route_in a, int *sel, float *selw) {
    dev_pdl_launch_next();
    float bias[PER];
    route_load_bias<PER>(a, bias);
    dev_pdl_wait_prev();
    route_token<PER>(a, blockIdx.x, sel, selw, bias);
}

int cu_route_tokens(const cu_route_in *in, uint32_t T, int *sel, float *selw, cudaStream_t st, ds4_err *err) {
    const cu_route_in &a = *in;
    if (a.k == 0 || a.k > 32 || a.k > a.n_expert || a.n_expert > 1024)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: routing %u of %u experts (at most 32 of 1024)", a.k,
                           a.n_expert);
    if (a.n_expert <= 256) DS4_LAUNCH(route_kernel<8>, T, 32, 0, st, a, sel, selw);
    else DS4_LAUNCH(route_kernel<32>, T, 32, 0, st, a, sel, selw);
    CU_LAUNCHED();
    return 0;
}

static cu_route_in route_input(const cuda_backend *b, uint32_t il, const uint32_t *tok, bool decode) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    cu_route_in in;
    in.logits = b->router;
    in.bias = w->exp_bias.p ? (const float *)w->exp_bias.p : NULL;
    in.hash = ds4_layer_is_hash(c, il) ? (const int32_t *)w->tid2eid.p : NULL;
    in.tok = tok;
    in.n_expert = c->n_expert;
    in.k = c->n_expert_used;
    in.scale = c->expert_weights_scale;
    in.norm = c->expert_weights_norm;
    /* the selected experts' slots: on the host's -1 (cuda_offload.h; in a
     * decode step the mapped tier's past the device's), or under tensor
     * parallelism another rank's (cu_tp) */
    bool host = cu_offload_host(b->off, il);
    const int32_t *slot = host ? (decode ? b->off->d_slot1 : b->off->d_slot) : b->tp.d_slot;
    in.slot = slot ? slot + (size_t)il * c->n_expert : NULL;
    in.msel = slot ? b->msel : NULL;
    in.count = b->expert_count ? b->expert_count + (size_t)il * c->n_expert : NULL;
    return in;
}

int cu_route(cuda_backend *b, uint32_t il, const uint32_t *tok, uint32_t T, bool decode, ds4_err *err) {
    cu_route_in in = route_input(b, il, tok, decode);
    return cu_route_tokens(&in, T, b->sel, b->selw, b->st, err);
}

/* The routing launch's work in the router product's last block: one launch
 * boundary less on a decode step's path from the router to the experts. */
bool cu_gemv_route(cuda_backend *b, uint32_t il, const uint32_t *tok, gemv_plan *p) {
    const ds4_config *c = b->cfg;
    if (!cu_gemv_can_route(p, c->n_expert, c->n_expert_used)) return false;
    p->route.in = route_input(b, il, tok, true);
    p->route.sel = b->sel;
    p->route.selw = b->selw;
    p->route.count = b->route_count;
    return true;
}

/* ------------------------------------------------------------ grouping */

#define GROUP_TILE 64

/* Entries whose selection is negative (an expert on the host,
 * cuda_offload.h) are left out. */
static __global__ void group_count_kernel(const int *sel, uint32_t n, int *count) {
    dev_pdl_enter();
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (sel[i] >= 0) atomicAdd(&count[sel[i]], 1);
}

/* One warp: offsets, per-expert cursors and the list of work tiles, in
 * expert order.  Lane l takes experts 8 l .. 8 l + 7 of each round of 256;
 * warp scans of their token and tile counts place them (a serial loop
 * over the experts took a round trip to the L2 for each: ~50 us). */
#define GROUP_PER 8
static __global__ void group_plan_kernel(const int *count, uint32_t n_expert, int *off, int *tile_mat, int *tile_start,
                                         int *tile_count, int *n_tiles) {
    dev_pdl_enter();
    if (threadIdx.x >= 32 || blockIdx.x != 0) return;
    unsigned lane = threadIdx.x;
    int acc = 0, nt = 0; /* entries and tiles of the rounds before */
    for (uint32_t e0 = 0; e0 < n_expert; e0 += 32 * GROUP_PER) {
        uint32_t e1 = e0 + GROUP_PER * lane;
        int c[GROUP_PER], csum = 0, tsum = 0;
#pragma unroll
        for (int i = 0; i < GROUP_PER; i++) {
            c[i] = e1 + i < n_expert ? count[e1 + i] : 0;
            csum += c[i];
            tsum += (c[i] + GROUP_TILE - 1) / GROUP_TILE;
        }
        int cx = csum, tx = tsum; /* inclusive scans over the lanes */
        for (int d = 1; d < 32; d <<= 1) {
            int cy = __shfl_up_sync(0xffffffffu, cx, d), ty = __shfl_up_sync(0xffffffffu, tx, d);
            if ((int)lane >= d) cx += cy, tx += ty;
        }
        int pos = acc + cx - csum, t = nt + tx - tsum;
#pragma unroll
        for (int i = 0; i < GROUP_PER; i++) {
            if (e1 + i >= n_expert) break;
            off[e1 + i] = pos;
            for (int j = 0; j < c[i]; j += GROUP_TILE, t++) {
                tile_mat[t] = (int)(e1 + i);
                tile_start[t] = pos + j;
                tile_count[t] = c[i] - j < GROUP_TILE ? c[i] - j : GROUP_TILE;
            }
            pos += c[i];
        }
        acc += __shfl_sync(0xffffffffu, cx, 31);
        nt += __shfl_sync(0xffffffffu, tx, 31);
    }
    if (lane == 0) *n_tiles = nt;
}

static __global__ void group_scatter_kernel(const int *sel, uint32_t n, int *cursor, int *perm) {
    dev_pdl_enter();
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        if (sel[i] < 0) continue;
        int pos = atomicAdd(&cursor[sel[i]], 1);
        perm[pos] = (int)i;
    }
}

int cu_group_tokens(cuda_backend *b, const int *sel, uint32_t T, cu_group *g, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t n = T * c->n_expert_used;
    CU_TRY(cudaMemsetAsync(b->grp_count, 0, c->n_expert * sizeof(int), b->st));
    DS4_LAUNCH(group_count_kernel, (n + 255) / 256, 256, 0, b->st, sel, n, b->grp_count);
    CU_LAUNCHED();
    DS4_LAUNCH(group_plan_kernel, 1, 32, 0, b->st, (const int *)b->grp_count, c->n_expert, b->grp_off, b->grp_tile_mat,
               b->grp_tile_start, b->grp_tile_count, b->grp_ntiles);
    CU_LAUNCHED();
    DS4_LAUNCH(group_scatter_kernel, (n + 255) / 256, 256, 0, b->st, sel, n, b->grp_off, b->grp_perm);
    CU_LAUNCHED();
    g->tile_mat = b->grp_tile_mat;
    g->tile_start = b->grp_tile_start;
    g->tile_count = b->grp_tile_count;
    g->n_tiles = b->grp_ntiles;
    g->max_tiles = n / GROUP_TILE + c->n_expert;
    g->perm = b->grp_perm;
    g->act_div = c->n_expert_used;
    return 0;
}

/* One block: entry q's place is the number of entries before it by
 * (selection, entry); sel staged in shared memory. */
static __global__ void entry_order_kernel(const int *sel, uint32_t n, int *order) {
    __shared__ int s[CU_FEW_ENTRIES];
    dev_pdl_enter();
    for (uint32_t q = threadIdx.x; q < n; q += blockDim.x) s[q] = sel[q];
    __syncthreads();
    for (uint32_t q = threadIdx.x; q < n; q += blockDim.x) {
        int v = s[q];
        uint32_t at = 0;
        for (uint32_t j = 0; j < n; j++) at += s[j] < v || (s[j] == v && j < q);
        order[at] = (int)q;
    }
}

int cu_entry_order(const int *sel, uint32_t n, int *order, cudaStream_t st, ds4_err *err) {
    if (n == 0 || n > CU_FEW_ENTRIES)
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: %u entries to order (1 to %u)", n, CU_FEW_ENTRIES);
    DS4_LAUNCH(entry_order_kernel, 1, 256, 0, st, sel, n, order);
    CU_LAUNCHED();
    return 0;
}

/* -------------------------------------------------------------- swiglu */

typedef struct swiglu_args {
    const float *eg, *eu, *selw; /* routed: rows T*k */
    const float *sg, *su;        /* shared: rows T */
    uint32_t n_routed, n_shared, F;
    uint32_t Fs; /* a shared row's values: F, or a tensor-parallel rank's part (cu_tp) */
    float limit;
    dact mid, smid;
    hc_sink_job sink; /* one more block: see cu_swiglu */
} swiglu_args;

static __device__ __forceinline__ float dev_swiglu(float g, float u, float limit) {
    if (limit > 1e-6f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    float sg = g >= 0 ? 1.0f / (1.0f + expf(-g)) : expf(g) / (1.0f + expf(g));
    return g * sg * u;
}

#define SWIGLU_MAX 4096 /* values of a row */

/* A block of NT threads per row: every gate / up load (16 bytes each)
 * issued before any result is stored, the row kept in shared memory for
 * its quantization.  A prefill pass's many rows take 256 threads (8 of
 * Flash's 2048 values each: 123 us a 2048-token pass on the H200, against
 * 165 for 512 threads of scalar loads), a decode step's seven rows 512
 * (256 cost it 0.6 %). */
template <int NT> static __global__ void __launch_bounds__(NT) swiglu_kernel(swiglu_args a) {
    constexpr int PER4 = SWIGLU_MAX / 4 / NT;         /* float4 of values per thread */
    if (a.sink.sums && blockIdx.x == gridDim.x - 1) { /* the hosted Sinkhorn (cuda_sinkhorn.cuh) */
        dev_pdl_launch_next();
        hc_sink_job_run(a.sink);
        return;
    }
    dev_pdl_enter();
    DS4_DYN_SMEM(float4, xs);
    uint32_t r = blockIdx.x;
    bool routed = r < a.n_routed;
    if (!routed) r -= a.n_routed;
    uint32_t F = routed ? a.F : a.Fs, n4 = F / 4;
    const float4 *g = (const float4 *)((routed ? a.eg : a.sg) + (size_t)r * F);
    const float4 *u = (const float4 *)((routed ? a.eu : a.su) + (size_t)r * F);
    const dact &o = routed ? a.mid : a.smid;
    float w = routed ? a.selw[r] : 1.0f;
    float4 gv[PER4], uv[PER4];
#pragma unroll
    for (int i = 0; i < PER4; i++) {
        uint32_t f = threadIdx.x + i * NT;
        gv[i] = f < n4 ? g[f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        uv[i] = f < n4 ? u[f] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float *x = o.f ? o.f + (size_t)r * o.fs : NULL; /* only the forms the down products read */
#pragma unroll
    for (int i = 0; i < PER4; i++) {
        uint32_t f = threadIdx.x + i * NT;
        if (f >= n4) break;
        float4 v = make_float4(dev_swiglu(gv[i].x, uv[i].x, a.limit), dev_swiglu(gv[i].y, uv[i].y, a.limit),
                               dev_swiglu(gv[i].z, uv[i].z, a.limit), dev_swiglu(gv[i].w, uv[i].w, a.limit));
        if (routed) v = make_float4(v.x * w, v.y * w, v.z * w, v.w * w);
        xs[f] = v;
        if (x) *(float4 *)(x + 4 * (size_t)f) = v;
    }
    __syncthreads();
    dev_quantize_row((const float *)xs, F, o.q8 ? o.q8 + (size_t)r * o.q8s : NULL,
                     o.qk ? o.qk + (size_t)r * o.qks : NULL);
}

int cu_swiglu(cuda_backend *b, uint32_t il, uint32_t T, unsigned which, const hc_site *sink, cudaStream_t st,
              ds4_err *err) {
    const ds4_config *c = b->cfg;
    swiglu_args a;
    a.eg = b->eg;
    a.eu = b->eu;
    a.selw = b->selw;
    a.sg = b->sg;
    a.su = b->su;
    a.n_routed = which & SWIGLU_ROUTED ? T * c->n_expert_used : 0;
    a.n_shared = which & SWIGLU_SHARED ? T : 0;
    a.F = c->n_ff_exp;
    a.Fs = b->tp.ff;
    a.limit = c->swiglu_clamp[il];
    a.mid = b->mid;
    a.smid = b->smid;
    a.sink = cu_hc_sink_job(b, sink);
    if (a.F > SWIGLU_MAX || a.F % 4 || a.Fs > a.F || a.Fs % 4)
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "CUDA backend: expert rows of %u values (a multiple of 4, at most %u)", a.F, SWIGLU_MAX);
    if (a.n_routed + a.n_shared == 0) return 0;
    uint32_t blocks = a.n_routed + a.n_shared + (a.sink.sums ? 1 : 0);
    if (T == 1) DS4_LAUNCH(swiglu_kernel<512>, blocks, 512, a.F * sizeof(float), st, a);
    else DS4_LAUNCH(swiglu_kernel<256>, blocks, 256, a.F * sizeof(float), st, a);
    CU_LAUNCHED();
    return 0;
}

/* ------------------------------------------------------ argmax, steps */

#define ARGMAX_BLOCKS 128

/* The argmax order: the larger value, the lower index on ties (so any
 * order of reduction gives the same winner). */
static __device__ __forceinline__ void argmax_take(float v, uint32_t i, float &bv, uint32_t &bi) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}
static __device__ __forceinline__ void warp_argmax(float &bv, uint32_t &bi) {
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
        uint32_t i2 = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(v2, i2, bv, bi);
    }
}

static __global__ void argmax_part_kernel(const float *x, uint32_t n, float *pv, uint32_t *pi) {
    dev_pdl_enter();
    __shared__ float sv[32];
    __shared__ uint32_t si[32];
    float bv = -INFINITY;
    uint32_t bi = 0xffffffffu;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        argmax_take(x[i], i, bv, bi);
    warp_argmax(bv, bi);
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        bv = sv[0];
        bi = si[0];
        for (unsigned w = 1; w < blockDim.x / 32; w++) argmax_take(sv[w], si[w], bv, bi);
        pv[blockIdx.x] = bv;
        pi[blockIdx.x] = bi;
    }
}

#define STEP_END_LOADS (ARGMAX_BLOCKS / 32) /* the argmax parts a lane of step_end_kernel takes */
static_assert(ARGMAX_BLOCKS % 32 == 0, "whole loads a lane");

/* End of a pass: record the input token (greedy runs), set the next token
 * to the argmax of the new logits (from argmax_part_kernel's ARGMAX_BLOCKS
 * parts), advance the position by T. */
static __global__ void step_end_kernel(dstep *st, const float *pv, const uint32_t *pi, uint32_t T, uint32_t *record,
                                       uint32_t *n_rec, uint32_t rec_cap) {
    dev_pdl_enter();
    /* the parts by one warp, a lane's loads issued together: one thread
     * walking them took a round trip to the L2 a part, on every token's path */
    float v[STEP_END_LOADS];
    uint32_t ix[STEP_END_LOADS];
#pragma unroll
    for (int u = 0; u < STEP_END_LOADS; u++) {
        uint32_t i = threadIdx.x + 32 * u;
        v[u] = pv[i];
        ix[u] = pi[i];
    }
    float bv = v[0];
    uint32_t bi = ix[0];
#pragma unroll
    for (int u = 1; u < STEP_END_LOADS; u++) argmax_take(v[u], ix[u], bv, bi);
    warp_argmax(bv, bi);
    if (threadIdx.x != 0) return;
    if (record && *n_rec < rec_cap) record[(*n_rec)++] = st->token;
    st->token = bi == 0xffffffffu ? 0 : bi;
    st->pos += T;
}

/* A pipeline stage before the head: the position advanced by T. */
static __global__ void step_pos_kernel(dstep *st, uint32_t T) {
    dev_pdl_enter();
    if (threadIdx.x == 0) st->pos += T;
}

int cu_step_end(cuda_backend *b, uint32_t T, bool record, ds4_err *err) {
    if (!cu_head(b)) { /* no logits: no next token either */
        if (T == 0) return 0;
        DS4_LAUNCH(step_pos_kernel, 1, 32, 0, b->st, b->sq->d_step, T);
        CU_LAUNCHED();
        return 0;
    }
    DS4_LAUNCH(argmax_part_kernel, ARGMAX_BLOCKS, 256, 0, b->st, (const float *)b->d_last_logits, b->cfg->n_vocab,
               b->argmax_part, b->argmax_idx);
    CU_LAUNCHED();
    DS4_LAUNCH(step_end_kernel, 1, 32, 0, b->st, b->sq->d_step, (const float *)b->argmax_part,
               (const uint32_t *)b->argmax_idx, T, record ? b->d_argmax : (uint32_t *)NULL, b->d_nrec, b->rec_cap);
    CU_LAUNCHED();
    return 0;
}

static __global__ void set_step_kernel(dstep *st, uint32_t pos, uint32_t token, int which) {
    dev_pdl_enter();
    if (threadIdx.x != 0) return;
    if (which & STEP_POS) st->pos = pos;
    if (which & STEP_TOKEN) st->token = token;
    if (which & STEP_FOLD) st->fold = pos;
}

int cu_set_step(cuda_backend *b, int which, uint32_t pos, uint32_t token, ds4_err *err) {
    DS4_LAUNCH(set_step_kernel, 1, 32, 0, b->st, b->sq->d_step, pos, token, which);
    CU_LAUNCHED();
    return 0;
}

static __global__ void advance_kernel(dstep *st) {
    dev_pdl_enter();
    if (threadIdx.x != 0) return;
    st->pos += 1;
    st->fold = st->pos;
}

int cu_advance(cuda_backend *b, ds4_err *err) {
    DS4_LAUNCH(advance_kernel, 1, 32, 0, b->st, b->sq->d_step);
    CU_LAUNCHED();
    return 0;
}

static __global__ void fill_kernel(float *p, size_t n, float v) {
    dev_pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

int cu_fill(cuda_backend *b, float *p, size_t n, float v, ds4_err *err) {
    if (n == 0) return 0;
    DS4_LAUNCH(fill_kernel, 256, 256, 0, b->st, p, n, v);
    CU_LAUNCHED();
    return 0;
}
