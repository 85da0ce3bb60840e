/*
 * cuda_hc.cu - hyper-connections on the GPU (spec/MODEL.md 5), mirroring
 * src/model/cpu/cpu_hc.c: one launch per HC site (cu_hc_step, called by
 * cuda_forward.cu) applies the HC post of the previous sublayer to the
 * residual streams, computes the site's mixer (pre / post weights and the
 * Sinkhorn-normalised combination matrix), collapses the streams into the
 * next sublayer's input and writes its RMSNorm and quantized forms.
 */
#include "model/cuda/cuda_internal.h"

#define HC_THREADS 256
#define HC_COLS (HC_THREADS / 4) /* columns of S per block: a thread per stream and column */
#define HC_MAX_MIX 32

static __device__ __forceinline__ float dev_sigmoid(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* One launch per HC site: the HC post of the previous sublayer, the
 * partial sums of this site's mixer (blocks over column slices), and, in
 * the block that finishes last, the mixer weights and the input of the
 * next sublayer. */
typedef struct hc_args {
    float *S;
    const float *y, *eout, *sout; /* HC post source (y, or routed + shared), all NULL for none */
    uint32_t k;
    float *post, *comb;           /* read by the post, rewritten by the finish */
    const uint8_t *fn;
    uint32_t fn_type, nmix, D, n_hc, nsplit;
    double *part;
    uint32_t *count;              /* per token: blocks done (back to 0 after each launch) */
    /* finish */
    uint32_t sink_iters;
    float hc_eps, rms_eps;
    const float *scale, *base;    /* F32 vectors */
    const uint8_t *norm;
    uint32_t norm_type;
    bool head;                    /* output collapse: pre weights only */
    dact xn;
} hc_args;

/* Column sum of the 4 x 4 matrix held one entry per lane (lane k = a + 4b),
 * in the CPU's order a = 0..3; rows: b = 0..3. */
static __device__ __forceinline__ float hc_col_sum(float v, unsigned b) {
    float s = __shfl_sync(0xffffffffu, v, 4 * b);
    s += __shfl_sync(0xffffffffu, v, 4 * b + 1);
    s += __shfl_sync(0xffffffffu, v, 4 * b + 2);
    return s + __shfl_sync(0xffffffffu, v, 4 * b + 3);
}
static __device__ __forceinline__ float hc_row_sum(float v, unsigned a) {
    float s = __shfl_sync(0xffffffffu, v, a);
    s += __shfl_sync(0xffffffffu, v, a + 4);
    s += __shfl_sync(0xffffffffu, v, a + 8);
    return s + __shfl_sync(0xffffffffu, v, a + 12);
}

/* The block's sums of the partial sums of token t (written by the other
 * blocks of this launch: read from the L2): eight threads per output, each
 * over every eighth slice, then a fixed tree over the eight, so that all
 * the loads are in flight at once. */
static __device__ void hc_reduce_parts(const hc_args &a, uint32_t t, double *sums) {
    const double *p = a.part + (size_t)t * a.nsplit * (a.nmix + 1);
    for (uint32_t base = 0; base < (a.nmix + 1) * 8; base += blockDim.x) {
        uint32_t i = base + threadIdx.x, m = i / 8, j = i % 8;
        double v = 0.0;
        if (m <= a.nmix) {
#pragma unroll 8
            for (uint32_t s = j; s < a.nsplit; s += 8) v += __ldcg(p + (size_t)s * (a.nmix + 1) + m);
        }
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        if (j == 0 && m <= a.nmix) sums[m] = v;
    }
}

/* The mixer weights of one token, by warp 0 from the reduced sums: pre /
 * post, and the Sinkhorn iterations of MODEL.md 5.2 with one matrix entry
 * per lane (the arithmetic of cpu_hc.c, sums in its order). */
static __device__ void hc_weights(const hc_args &a, uint32_t t, const double *sums, float *pre, float *mix) {
    unsigned lane = threadIdx.x;
    uint32_t n = a.n_hc;
    double v = lane <= a.nmix ? sums[lane] : 0.0;
    double ss = sums[0];
    float rs = 1.0f / sqrtf((float)(ss / (double)(n * a.D)) + a.rms_eps);
    if (lane >= 1 && lane <= a.nmix) mix[lane - 1] = (float)v * rs;
    __syncwarp();
    if (a.head) {
        if (lane < n) pre[lane] = dev_sigmoid(mix[lane] * a.scale[0] + a.base[lane]) + a.hc_eps;
        return;
    }
    float *post = a.post + (size_t)t * n, *comb = a.comb + (size_t)t * n * n;
    if (lane < n) pre[lane] = dev_sigmoid(mix[lane] * a.scale[0] + a.base[lane]) + a.hc_eps;
    else if (lane < 2 * n) post[lane - n] = 2.0f * dev_sigmoid(mix[lane] * a.scale[1] + a.base[lane]);
    unsigned k = lane & 15, ra = k % 4, cb = k / 4;
    float c = mix[2 * n + k] * a.scale[2] + a.base[2 * n + k];
    /* softmax over a of each column, + eps */
    float mx = __shfl_sync(0xffffffffu, c, 4 * cb);
    for (unsigned i = 1; i < 4; i++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, c, 4 * cb + i));
    c = expf(c - mx);
    c = c / hc_col_sum(c, cb) + a.hc_eps;
    for (uint32_t it = 0; it < a.sink_iters; it++) {
        if (it > 0) c /= hc_col_sum(c, cb) + a.hc_eps;
        c /= hc_row_sum(c, ra) + a.hc_eps;
    }
    if (lane < 16) comb[k] = c;
}

/* Mixer outputs -> pre / post / comb, x = sum_h pre_h S_h, then the
 * sublayer's RMSNorm and the quantized forms of the result (x: D floats of
 * shared memory). */
static __device__ void hc_finish(const hc_args &a, uint32_t t, float *x) {
    __shared__ float pre[4], mix[HC_MAX_MIX];
    __shared__ double sums[HC_MAX_MIX + 1];
    uint32_t n = a.n_hc, D = a.D;
    hc_reduce_parts(a, t, sums);
    __syncthreads();
    if (threadIdx.x < 32) hc_weights(a, t, sums, pre, mix);
    __syncthreads();
    const float *S = a.S + (size_t)t * n * D;
#pragma unroll 4
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t h = 0; h < n; h++) acc += pre[h] * __ldcg(S + (size_t)h * D + d);
        x[d] = acc;
    }
    __syncthreads();
    block_rmsnorm(x, D, a.norm, a.norm_type, a.rms_eps);
    float *xo = a.xn.f + (size_t)t * a.xn.fs;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) xo[d] = x[d];
    dev_quantize_row(x, D, a.xn.q8 ? a.xn.q8 + (size_t)t * a.xn.q8s : NULL, a.xn.qk ? a.xn.qk + (size_t)t * a.xn.qks : NULL);
}

/* Block (x, t): columns HC_COLS x .. of token t, thread (h, j) on stream h
 * of column j.  Optional HC post of the previous sublayer (S <- post y +
 * comb S), then this block's partial sums of the mixer: the sum of squares
 * of S (double) and fn . S (NMIX rows), reduced through shared memory in
 * one step (a warp per output).  The last block of the token to finish
 * computes the mixer weights and the next sublayer's input from all the
 * partial sums (the fence and counter of the CUDA guide's "last block"
 * reduction). */
template <int NMIX> static __global__ void __launch_bounds__(HC_THREADS) hc_mix_kernel(hc_args a) {
    dev_pdl_enter();
    DS4_DYN_SMEM(float, buf); /* the per-thread sums, then the finish's row */
    __shared__ double redss[HC_THREADS];
    __shared__ bool last;
    float(*red)[HC_THREADS] = reinterpret_cast<float(*)[HC_THREADS]>(buf);
    uint32_t t = blockIdx.y, D = a.D;
    const uint32_t n = 4;
    unsigned h = threadIdx.x / HC_COLS;
    uint32_t d = blockIdx.x * HC_COLS + threadIdx.x % HC_COLS;
    bool on = d < D;
    float *S = a.S + (size_t)t * n * D;
    float v[4];
    for (uint32_t src = 0; src < n; src++) v[src] = on ? S[(size_t)src * D + d] : 0.0f;
    float vh = h == 0 ? v[0] : h == 1 ? v[1] : h == 2 ? v[2] : v[3]; /* no indexed register array */
    if (a.y || a.eout) {
        float yd = 0.0f;
        if (on && a.y) {
            yd = a.y[(size_t)t * D + d];
        } else if (on) {
            float routed = 0.0f;
            for (uint32_t i = 0; i < a.k; i++) routed += a.eout[((size_t)t * a.k + i) * D + d];
            yd = routed + a.sout[(size_t)t * D + d];
        }
        const float *post = a.post + (size_t)t * n, *comb = a.comb + (size_t)t * n * n;
        float s = post[h] * yd;
        for (uint32_t src = 0; src < n; src++) s += comb[h + n * src] * v[src];
        vh = s;
        __syncthreads(); /* every stream of the column is read before any is rewritten */
        if (on) S[(size_t)h * D + d] = vh;
    }
    double ss = (double)vh * (double)vh;
    size_t c = (size_t)h * D + d;
#pragma unroll
    for (int m = 0; m < NMIX; m++) red[m][threadIdx.x] = on ? fvec(a.fn, a.fn_type, (size_t)m * n * D + c) * vh : 0.0f;
    redss[threadIdx.x] = ss;
    __syncthreads();
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    double *out = a.part + ((size_t)t * a.nsplit + blockIdx.x) * (NMIX + 1);
    for (unsigned m = warp; m <= (unsigned)NMIX; m += nw) {
        double sum = 0.0;
        for (unsigned i = lane; i < blockDim.x; i += 32) sum += m == 0 ? redss[i] : (double)red[m - 1][i];
        sum = warp_sum_d(sum);
        if (lane == 0) out[m] = sum;
    }
    __threadfence(); /* this block's S and sums, visible before it counts itself done */
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(a.count + t, 1u) == a.nsplit - 1;
        if (last) a.count[t] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    hc_finish(a, t, buf);
}

/* Dynamic shared memory of hc_mix_kernel<nmix> for rows of D. */
static size_t hc_smem(uint32_t nmix, uint32_t D) {
    size_t sums = (size_t)nmix * HC_THREADS * sizeof(float), row = (size_t)D * sizeof(float);
    return sums > row ? sums : row;
}

int cu_hc_step(cuda_backend *b, const hc_post_src *post, const hc_site *site, uint32_t T, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dwt *fn = site->fn;
    hc_args a;
    memset(&a, 0, sizeof(a));
    a.S = b->S;
    if (post) {
        a.y = post->y;
        a.eout = post->eout;
        a.sout = post->sout;
        a.k = post->k;
    }
    a.post = b->post;
    a.comb = b->comb;
    a.fn = fn->p;
    a.fn_type = fn->type;
    a.nmix = fn->rows;
    a.D = c->n_embd;
    a.n_hc = c->n_hc;
    a.nsplit = b->hc_split;
    a.part = b->hcpart;
    a.count = b->hc_count;
    a.sink_iters = c->hc_sinkhorn_iters;
    a.hc_eps = c->hc_eps;
    a.rms_eps = c->rms_eps;
    a.scale = (const float *)site->scale->p;
    a.base = (const float *)site->base->p;
    a.norm = site->norm->p;
    a.norm_type = site->norm->type;
    a.head = site->head;
    a.xn = *site->out;
    size_t smem = hc_smem(fn->rows, c->n_embd);
    if (smem > 40 * 1024)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: HC rows of %u values need %zu bytes of shared memory",
                           c->n_embd, smem);
    dim3 grid(b->hc_split, T);
    if (fn->rows == 24) DS4_LAUNCH(hc_mix_kernel<24>, grid, HC_THREADS, smem, b->st, a);
    else if (fn->rows == 4) DS4_LAUNCH(hc_mix_kernel<4>, grid, HC_THREADS, smem, b->st, a);
    else return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: HC mixer of %u rows", fn->rows);
    CU_LAUNCHED();
    return 0;
}
