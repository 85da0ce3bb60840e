/*
 * cuda_hc.cu - hyper-connections on the GPU (docs/MODEL.md 5), mirroring
 * src/model/cpu/cpu_hc.c: at each HC site (cu_hc_step, called by
 * cuda_forward.cu) the HC post of the previous sublayer is applied to the
 * residual streams, the site's mixer computed (pre / post weights and the
 * Sinkhorn-normalised combination matrix), the streams collapsed into the
 * next sublayer's input and its RMSNorm and quantized forms written.
 *
 * A decode step does that in one launch, which is latency-bound (a few MB
 * of traffic, 86 per decoded token), so it is shaped to have few serial
 * round trips: blocks of 512 threads over column slices (32 for the 4096
 * columns of Flash), every weight the launch needs (mixer rows, norm
 * weights, scale and base) loaded into registers before waiting for the
 * previous kernel, and a finish - in the block that completes last - that
 * issues all its loads at once and keeps the row in registers from the
 * collapse through the RMSNorm to the quantized words it stores.  A
 * prefill pass has the work to fill the GPU instead: the HC post is a
 * streaming launch of its own (hc_prefill_post_kernel), the mixer a
 * product of the tokens' streams with the mixer rows on the FP64 tensor
 * cores (hc_prefill_mix_kernel), and a third launch (a block per token)
 * finishes.
 */
#include "model/cuda/cuda_sinkhorn.cuh"

#define HC_MAX_D        8192 /* the widest row the finish holds (16 values a thread) */
#define HC_PART_LANES   16   /* finish: threads per reduced partial sum */
#define HC_EXPERT_LOADS 8    /* HC post: routed experts' values loaded at once */

/* The launch shape of the decode launch and of the prefill finish (one
 * shape, so both sum in the same order): blocks of 512 threads, 8 columns
 * per finish thread, the Q8_K block one warp, plus a 17th warp that
 * computes post / comb (Sinkhorn) while the other 16 collapse, normalise
 * and quantize (they meet at a named barrier that leaves it out), so
 * Sinkhorn is off the path of the next sublayer's input.  Measured on the
 * H200 (docs/PERFORMANCE.md): the Sinkhorn warp pays in decode (662a7ef:
 * 109.4 against 107.3 t/s) and in the prefill finish (718d90e: 158 -> 95
 * us a 2048-token launch with two blocks an SM, where
 * warp 0 running Sinkhorn after the rest had held each SM's only block);
 * blocks of 1024 threads measured slower.  A decode launch's 17th warp
 * only stores the reduced sums: a block of a later launch hosts the
 * Sinkhorn (cuda_sinkhorn.cuh; 345a7aa). */
#define HC_THREADS     512               /* mixer and finish threads */
#define HC_BLOCK       (HC_THREADS + 32) /* and the Sinkhorn warp */
#define HC_WARPS       (HC_THREADS / 32)
/* Finish: consecutive columns per thread, 8 for rows of up to 4096 values
 * (Flash; a Q8_K block is one warp), 16 for wider ones (Pro's 7168; a
 * Q8_K block is half a warp).  Whole float4 loads either way. */
#define HC_VALS_NARROW 8
#define HC_VALS_WIDE   16
#define HC_COLS        (HC_THREADS / 4) /* mixer: a thread per stream and column */
static_assert(HC_VALS_WIDE * HC_THREADS == HC_MAX_D, "the widest row fills the finish");
static_assert(HC_WARPS <= 32, "the finish sums the per-warp values with one warp reduction");
/* The most partial sums a finish thread adds: the slices of the widest row
 * a finish of VALS columns a thread holds (decode; the prefill mixer's
 * slices are wider, so fewer) over the threads of an output (2 for
 * Flash's finish, 4 for Pro's). */
#define HC_PART_LOADS(VALS) (((VALS)*HC_THREADS / HC_COLS + HC_PART_LANES - 1) / HC_PART_LANES)

uint32_t cu_hc_cols(void) { return HC_COLS; }

/* One launch per HC site: the HC post of the previous sublayer, the
 * partial sums of this site's mixer (blocks over column slices), and, in
 * the block that finishes last, the mixer weights and the input of the
 * next sublayer. */
typedef struct hc_args {
    float *S;
    const float *y, *eout, *sout; /* HC post source (y, or routed + shared), all NULL for none */
    uint32_t k;
    const int *hsel; /* hc_post_src's */
    const float *hout;
    float *post, *comb; /* read by the post, rewritten by the finish */
    const uint8_t *fn;
    uint32_t fn_type, nmix, D, n_hc, nsplit;
    double *part;
    uint32_t *count; /* decode: blocks done (back to 0 after each launch) */
    uint32_t T;      /* tokens of the pass */
    /* finish */
    uint32_t sink_iters;
    float hc_eps, rms_eps;
    const float *scale, *base; /* F32 vectors */
    const uint8_t *norm;
    uint32_t norm_type;
    bool head; /* output collapse: pre weights only */
    dact xn;
    double *sums_out; /* decode, Sinkhorn hosted later (hc_site.sink_later): the sums and rs go there */
} hc_args;

/* The finish's constant inputs: the norm weights of the thread's columns
 * (loaded with the finish's other loads: fewer registers through the mixer
 * phase) and, loaded by every thread before the wait for the previous
 * kernel, the scales, the pre bases and the post / comb bases of its lane
 * (the Sinkhorn warp uses those). */
template <int VALS> struct hc_consts {
    float w[VALS];
    float scale[3], base_pre[4], base_post, base_comb;
};

template <int VALS> static __device__ __forceinline__ void hc_load_norm(const hc_args &a, float (&w)[VALS]) {
    uint32_t e = VALS * threadIdx.x;
    if (a.norm) fvec_n(a.norm, a.norm_type, e, 1, e < a.D, w); /* D % VALS == 0: a thread's run is all in or out */
    else
#pragma unroll
        for (int i = 0; i < VALS; i++) w[i] = 1.0f;
}

template <int VALS> static __device__ __forceinline__ hc_consts<VALS> hc_load_consts(const hc_args &a) {
    hc_consts<VALS> k;
    uint32_t n = 4;
    unsigned lane = threadIdx.x & 31;
    k.scale[0] = a.scale[0];
    for (uint32_t h = 0; h < n; h++) k.base_pre[h] = a.base[h];
    k.scale[1] = k.scale[2] = k.base_post = k.base_comb = 0.0f;
    if (!a.head) {
        k.scale[1] = a.scale[1];
        k.scale[2] = a.scale[2];
        k.base_post = lane >= n && lane < 2 * n ? a.base[lane] : 0.0f;
        k.base_comb = a.base[2 * n + (lane & 15)];
    }
    return k;
}

/* Post weights and the Sinkhorn iterations (cuda_sinkhorn.cuh) of token t,
 * in the finish: a prefill pass's, and a decode site's without a host. */
template <int VALS>
static __device__ void hc_post_comb(const hc_args &a, uint32_t t, const double *sums, float rs,
                                    const hc_consts<VALS> &k, unsigned lane) {
    uint32_t n = 4;
    hc_sinkhorn(sums, rs, k.scale[1], k.scale[2], k.base_post, k.base_comb, a.sink_iters, a.hc_eps,
                a.post + (size_t)t * n, a.comb + (size_t)t * n * n, lane);
}

/* Reduce-scatter over the warp: every lane holds v[0 .. 31]; afterwards
 * lane l holds in v[0] the warp's sum of v[l].  Five exchanges that halve
 * what each lane holds (31 shuffles instead of 32 x 5); every partial sum
 * is computed by one lane, so the tree is fixed. */
template <int O> static __device__ __forceinline__ void hc_scatter_step(float (&v)[32], unsigned lane) {
    bool up = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < O; i++) {
        float send = up ? v[i] : v[i + O], keep = up ? v[i + O] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    if constexpr (O > 1) hc_scatter_step<O / 2>(v, lane);
}

/* Q8_0 of the thread's VALS values (32 / VALS consecutive lanes hold the
 * 32 values of a block), exactly as dev_quantize_row: amax / 127, round to
 * nearest even, packed words. */
template <int VALS>
static __device__ __forceinline__ void hc_store_q8_0(const float (&y)[VALS], uint32_t e, bool has, uint8_t *q8,
                                                     uint32_t D) {
    constexpr int TPB = 32 / VALS; /* threads per block of 32 */
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < VALS; i++) amax = fmaxf(amax, fabsf(y[i]));
    for (int o = TPB / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float db = amax / 127.0f;
    float id = db != 0.0f ? 1.0f / db : 0.0f;
    if (!has) return;
#pragma unroll
    for (int w = 0; w < VALS / 4; w++) {
        uint32_t packed = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) packed |= (uint32_t)(uint8_t)q8_round(y[4 * w + i] * id) << (8 * i);
        *(uint32_t *)(q8 + e + 4 * w) = packed;
    }
    if ((threadIdx.x & (TPB - 1)) == 0) ((float *)(q8 + D))[e / 32] = db;
}

/* Q8_K of the row, exactly as dev_quantize_row / ds4_quantize_q8_K: a
 * block of 256 values is 256 / VALS lanes of a warp; the signed value of
 * the largest magnitude (first index on ties) is reduced in the warp. */
template <int VALS>
static __device__ __forceinline__ void hc_store_q8_k(const float (&y)[VALS], uint32_t e, bool has, uint8_t *qk,
                                                     uint32_t D) {
    /* a block of 256 values is 256 / VALS lanes; warps past the row (D a
     * multiple of 256: whole blocks) skip the reduction */
    constexpr int LANES = 256 / VALS;
    bool wact = e - VALS * (threadIdx.x & 31) < D;
    unsigned lane = threadIdx.x & 31;
    float amax = 0.0f, mx = 0.0f;
    int idx = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < VALS; i++) {
        float ax = fabsf(y[i]);
        if (ax > amax) {
            amax = ax;
            mx = y[i];
            idx = (int)(e % 256) + i;
        }
    }
    for (int o = LANES / 2; wact && o > 0; o >>= 1) {
        float a2 = __shfl_xor_sync(0xffffffffu, amax, o), m2 = __shfl_xor_sync(0xffffffffu, mx, o);
        int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > amax || (a2 == amax && i2 < idx)) {
            amax = a2;
            mx = m2;
            idx = i2;
        }
    }
    if (!has) return;
    uint32_t b = e / 256;
    int s = 0;
    float iscale = amax == 0.0f ? 0.0f : -127.0f / mx;
#pragma unroll
    for (int w = 0; w < VALS / 4; w++) {
        uint32_t packed = 0;
        if (amax != 0.0f) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int8_t q = q8_round(iscale * y[4 * w + i]);
                s += q;
                packed |= (uint32_t)(uint8_t)q << (8 * i);
            }
        }
        *(uint32_t *)(qk + e + 4 * w) = packed;
    }
    if (e % 256 == 0) ((float *)(qk + D))[b] = amax == 0.0f ? 0.0f : 1.0f / iscale;
    /* 16-value block sums: 16 / VALS threads each */
    for (int o = 1; o < 16 / VALS; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((lane & (16 / VALS - 1)) == 0) ((int16_t *)(qk + D + D / 256 * 4))[e / 16] = (int16_t)s;
}

/* The thread's VALS columns from e of the four streams of row S (D
 * values a stream): from global memory through the L2, or from shared
 * memory; zeros for a thread past the row. */
template <bool SHARED, int VALS>
static __device__ __forceinline__ void hc_load_streams(const float *S, uint32_t D, uint32_t e, bool has,
                                                       float4 (&s4)[4][VALS / 4]) {
#pragma unroll
    for (uint32_t h = 0; h < 4; h++)
#pragma unroll
        for (int w = 0; w < VALS / 4; w++) {
            const float4 *p = (const float4 *)(S + (size_t)h * D + e + 4 * w);
            s4[h][w] = !has ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : SHARED ? *p : __ldcg(p);
        }
}

/* Mixer outputs -> pre / post / comb, x = sum_h pre_h S_h, then the
 * sublayer's RMSNorm and the quantized forms of the result, by the block
 * that finished last (decode) or a block a token (prefill).  Serial
 * steps: one round trip to the L2 (the partial sums of every slice and
 * the thread's four columns of the four streams, loaded together), a
 * barrier for the reduced sums, the pre weights in every thread (no
 * barrier), the collapse in registers, a barrier for the sum of squares,
 * the stores (a barrier inside the Q8_K amax of 4-value threads); the
 * Sinkhorn warp computes post / comb from the reduced sums on, while the
 * finish threads meet at a named barrier without it.  BULK (the prefill
 * finish): the streams come in four bulk copies into dynamic shared
 * memory (hc_finish_smem) rather than through the threads' registers:
 * +0.5 % prefill at 4k (338cfda), while the decode launch, whose 32
 * blocks would each reserve the 64 KB, ran 0.6 % slower with it. */
template <int NMIX, bool BULK, int VALS>
static __device__ void hc_finish(const hc_args &a, uint32_t t, hc_consts<VALS> k) {
    constexpr int WARPS = HC_WARPS;
    __shared__ double sums[NMIX + 1], ssw[WARPS];
    __shared__ uint64_t sbar;
    DS4_DYN_SMEM(float, sS);
    const uint32_t n = 4;
    uint32_t D = a.D, e = VALS * threadIdx.x;
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    bool has = e < D; /* false in the Sinkhorn warp (e >= HC_MAX_D) */
    const float *S = a.S + (size_t)t * n * D;
    float4 s4[4][VALS / 4];
    if (BULK && threadIdx.x == 0) { /* 16 KB a copy (Flash) */
        bulk_begin(&sbar, n * D * sizeof(float));
        for (uint32_t h = 0; h < n; h++) bulk_copy(sS + (size_t)h * D, S + (size_t)h * D, D * sizeof(float), &sbar);
    }
    if (!BULK) hc_load_streams<false, VALS>(S, D, e, has, s4);
    hc_load_norm(a, k.w);
    /* partial sums: HC_PART_LANES threads per output, a fixed shuffle tree */
    uint32_t m = threadIdx.x / HC_PART_LANES, j = threadIdx.x % HC_PART_LANES;
    const double *p = a.part + (size_t)t * a.nsplit * (NMIX + 1);
    if (warp < ((NMIX + 1) * HC_PART_LANES + 31) / 32) {
        /* a thread's partial sums (at most HC_PART_LOADS) loaded at once */
        double v = 0.0, pv[HC_PART_LOADS(VALS)];
#pragma unroll
        for (int u = 0; u < HC_PART_LOADS(VALS); u++) {
            uint32_t s = j + u * HC_PART_LANES;
            pv[u] = m <= (uint32_t)NMIX && s < a.nsplit ? __ldcg(p + (size_t)s * (NMIX + 1) + m) : 0.0;
        }
#pragma unroll
        for (int u = 0; u < HC_PART_LOADS(VALS); u++)
            if (j + u * HC_PART_LANES < a.nsplit) v += pv[u];
        for (int o = HC_PART_LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (j == 0 && m <= (uint32_t)NMIX) sums[m] = v;
    }
    __syncthreads();
    float rs = 1.0f / sqrtf((float)(sums[0] / (double)(n * D)) + a.rms_eps);
    if (warp == (unsigned)WARPS) {
        unsigned l = threadIdx.x - HC_THREADS;
        if (a.sums_out) { /* for the hosted Sinkhorn (cuda_sinkhorn.cuh) */
            if (l <= (unsigned)NMIX) a.sums_out[l] = sums[l];
            if (l == 0) a.sums_out[HC_SUMS_RS] = rs;
        } else if (!a.head) {
            hc_post_comb(a, t, sums, rs, k, l);
        }
        return;
    }
    /* pre weights, in every thread (the same bits everywhere) */
    float pre[4];
#pragma unroll
    for (uint32_t h = 0; h < n; h++)
        pre[h] = dev_sigmoid(hc_mix_value(sums, h, rs) * k.scale[0] + k.base_pre[h]) + a.hc_eps;
    /* x = sum_h pre_h S_h (the pre weights are not normalised) */
    if (BULK) {
        bulk_wait(&sbar);
        hc_load_streams<true, VALS>(sS, D, e, has, s4);
    }
    float sv[4][VALS];
#pragma unroll
    for (uint32_t h = 0; h < n; h++)
#pragma unroll
        for (int w = 0; w < VALS / 4; w++) {
            sv[h][4 * w] = s4[h][w].x;
            sv[h][4 * w + 1] = s4[h][w].y;
            sv[h][4 * w + 2] = s4[h][w].z;
            sv[h][4 * w + 3] = s4[h][w].w;
        }
    float x[VALS];
    double ss = 0.0;
#pragma unroll
    for (int i = 0; i < VALS; i++) {
        float acc = 0.0f;
#pragma unroll
        for (uint32_t h = 0; h < n; h++) acc += pre[h] * sv[h][i];
        x[i] = acc;
        ss += (double)acc * (double)acc;
    }
    /* RMSNorm: the block's sum of squares in one barrier (warps past the
     * row add zeros and skip the reductions) */
    bool wact = VALS * 32 * warp < D;
    if (wact) ss = warp_sum_d(ss);
    if (lane == 0) ssw[warp] = ss;
    dev_bar_sync(1, HC_THREADS);
    if (wact) ss = warp_sum_d(lane < (unsigned)WARPS ? ssw[lane] : 0.0);
    float scale = 1.0f / sqrtf((float)(ss / D) + a.rms_eps);
    float y[VALS];
#pragma unroll
    for (int i = 0; i < VALS; i++) y[i] = x[i] * scale * k.w[i];
    if (has)
#pragma unroll
        for (int w = 0; w < VALS / 4; w++)
            *(float4 *)(a.xn.f + (size_t)t * a.xn.fs + e + 4 * w) = make_float4(y[4 * w], y[4 * w + 1], y[4 * w + 2],
                                                                                y[4 * w + 3]);
    if (a.xn.q8 && wact) hc_store_q8_0(y, e, has, a.xn.q8 + (size_t)t * a.xn.q8s, D);
    if (a.xn.qk) hc_store_q8_k<VALS>(y, e, has, a.xn.qk + (size_t)t * a.xn.qks, D);
}

/* What column d of token t brings to the HC post: its four streams and,
 * with a post source, the sublayer output. */
typedef struct hc_in {
    float v[4], yd;
} hc_in;

/* The post weight and combination row of stream h of token t (written by
 * the previous HC launch's Sinkhorn): loaded with the column's values, not
 * after the experts' sum, where they would cost a round trip of their own. */
typedef struct hc_row {
    float post, comb[4];
} hc_row;

static __device__ __forceinline__ hc_row hc_load_row(const hc_args &a, uint32_t t, unsigned h) {
    const uint32_t n = 4;
    hc_row w;
    w.post = a.post[(size_t)t * n + h];
#pragma unroll
    for (uint32_t src = 0; src < n; src++) w.comb[src] = a.comb[(size_t)t * n * n + h + n * src];
    return w;
}

static __device__ __forceinline__ hc_in hc_load_token(const hc_args &a, uint32_t t, uint32_t d, bool on) {
    const uint32_t n = 4, D = a.D;
    hc_in in;
    const float *S = a.S + (size_t)t * n * D;
#pragma unroll
    for (uint32_t src = 0; src < n; src++) in.v[src] = on ? S[(size_t)src * D + d] : 0.0f;
    in.yd = 0.0f;
    if (on && a.y) {
        in.yd = a.y[(size_t)t * D + d];
    } else if (on && a.eout) {
        /* the experts' values HC_EXPERT_LOADS at a time, all loaded before
         * any is added (a loop of loads and adds waits a round trip each) */
        float routed = 0.0f;
        for (uint32_t i0 = 0; i0 < a.k; i0 += HC_EXPERT_LOADS) {
            float e[HC_EXPERT_LOADS];
#pragma unroll
            for (int u = 0; u < HC_EXPERT_LOADS; u++)
                e[u] = i0 + u < a.k ? a.eout[((size_t)t * a.k + i0 + u) * D + d] : 0.0f;
            if (a.hsel) /* experts on the host: their outputs are the host's */
#pragma unroll
                for (int u = 0; u < HC_EXPERT_LOADS; u++)
                    if (i0 + u < a.k && a.hsel[(size_t)t * a.k + i0 + u] < 0)
                        e[u] = a.hout[((size_t)t * a.k + i0 + u) * D + d];
#pragma unroll
            for (int u = 0; u < HC_EXPERT_LOADS; u++)
                if (i0 + u < a.k) routed += e[u];
        }
        in.yd = routed + a.sout[(size_t)t * D + d];
    }
    return in;
}

/* Stream h after the HC post of the previous sublayer (MODEL.md 5.3):
 * post_h y + sum_src comb[h][src] S_src, in cpu_hc.c's order. */
static __device__ __forceinline__ float hc_post_value(const hc_row &w, const hc_in &in) {
    float s = w.post * in.yd;
#pragma unroll
    for (uint32_t src = 0; src < 4; src++) s += w.comb[src] * in.v[src];
    return s;
}

/* Token t's part of the mixer launch, by thread (h, j) of column d (the
 * Sinkhorn warp, if any, only meets the barriers).  Optional HC post of
 * the previous sublayer (S <- post y + comb S), then the block's partial
 * sums of the mixer: the sum of squares of S and fn . S (NMIX rows),
 * reduce-scattered in each warp in float, then summed over the warps in
 * double through shared memory into the token's partial-sum row of this
 * block.  A warp's sums in float add rounding at the float level (a few
 * 1e-7 of the 32 terms; the CPU reference sums in double but multiplies
 * float-rounded normalised streams and rounds the result to float) and
 * spare the shuffles of doubles and the conversions, whose throughput
 * bounded the launch: +1.5 % decode at 4k (078f658). */
template <int NMIX>
static __device__ __forceinline__ void hc_mix_token(const hc_args &a, uint32_t t, const hc_in &in, const hc_row &w,
                                                    const float (&f)[NMIX], uint32_t d, unsigned h, bool mixer, bool on,
                                                    double (*red)[33]) {
    constexpr int WARPS = HC_WARPS;
    const uint32_t n = 4, D = a.D;
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float vh = h == 0 ? in.v[0] : h == 1 ? in.v[1] : h == 2 ? in.v[2] : in.v[3]; /* no indexed register array */
    if (a.y || a.eout) {
        vh = hc_post_value(w, in);
        __syncthreads(); /* every stream of the column is read before any is rewritten */
        if (on) a.S[(size_t)t * n * D + (size_t)h * D + d] = vh;
    }
    if (mixer) {
        float sv[32];
        sv[0] = vh * vh;
#pragma unroll
        for (int mi = 1; mi < 32; mi++) sv[mi] = mi <= NMIX ? f[mi - 1] * vh : 0.0f;
        hc_scatter_step<16>(sv, lane);
        if (lane <= (unsigned)NMIX) red[warp][lane] = (double)sv[0];
    }
    __syncthreads();
    double *out = a.part + ((size_t)t * a.nsplit + blockIdx.x) * (NMIX + 1);
    /* output m summed over the warps by warp m % WARPS */
#pragma unroll
    for (int r = 0; r < (NMIX + WARPS) / WARPS; r++) {
        uint32_t m = warp + r * WARPS;
        if (mixer && m <= (uint32_t)NMIX) {
            double sum = warp_sum_d(lane < (unsigned)WARPS ? red[lane][m] : 0.0);
            if (lane == 0) out[m] = sum;
        }
    }
    __syncthreads(); /* red is free for the next token */
}

/* Decode: block x takes columns HC_COLS x .. of the token; the last
 * block to count itself done computes the mixer weights and the next
 * sublayer's input from all the partial sums (dev_last_block), so the
 * step needs one launch.  A pass of a few rows (CU_FEW_PASS at most: a
 * verification, a batched step of a few sessions) takes the same launch
 * with a row of blocks a token (blockIdx.y): each token's sums are a
 * decode step's, in one launch that fills the GPU, where the prefill's
 * three launches gave 4 tokens 16 blocks (45 us a site on an H100, 11.8
 * for a decode step's). */
template <int NMIX, int VALS> static __global__ void __launch_bounds__(HC_BLOCK, 1) hc_mix_kernel(hc_args a) {
    static_assert(NMIX + 1 <= 32, "a lane per mixer output");
    static_assert((NMIX + 1) * HC_PART_LANES <= HC_THREADS, "finish: threads for the partial sums");
    __shared__ double red[HC_WARPS][33];
    const uint32_t n = 4, t = blockIdx.y;
    bool mixer = threadIdx.x < HC_THREADS; /* not the Sinkhorn warp */
    unsigned h = mixer ? threadIdx.x / HC_COLS : 0;
    uint32_t d = blockIdx.x * HC_COLS + threadIdx.x % HC_COLS;
    bool on = mixer && d < a.D;
    /* the weights are written by no kernel: load them while the kernel
     * before this one finishes */
    dev_pdl_launch_next();
    float f[NMIX];
    fvec_n(a.fn, a.fn_type, (size_t)h * a.D + d, (size_t)n * a.D, on, f);
    hc_consts<VALS> k = hc_load_consts<VALS>(a);
    if (a.norm) { /* the finish's norm weights, cold by then: into the L2, a share of their lines a block */
        size_t lines = ((size_t)a.D * (a.norm_type == DS4_TYPE_F32 ? 4 : 2) + 127) / 128;
        size_t line = blockIdx.x + (size_t)threadIdx.x * gridDim.x;
        if (line < lines) prefetch_l2(a.norm + 128 * line);
    }
    dev_pdl_wait_prev();
    hc_row w = {};
    if (a.y || a.eout) w = hc_load_row(a, t, h);
    hc_in in = hc_load_token(a, t, d, on);
    hc_mix_token<NMIX>(a, t, in, w, f, d, h, mixer, on, red);
    if (dev_last_block(a.count + t, a.nsplit)) hc_finish<NMIX, false, VALS>(a, t, k);
}

/* Prefill: the mixer of HCP_TOK tokens x HCP_COLS columns (all four
 * streams: a K slice of 4 HCP_COLS) per block, on the FP64 tensor cores,
 * after hc_prefill_post_kernel has applied the previous sublayer's HC
 * post to S.  For each chunk of HCP_CC columns the block keeps the
 * streams and the mixer weights in shared memory as doubles and
 * multiplies them: partial[t][m] = sum_k fn[m][k] S[t][k], exact products
 * summed in double (the decode kernel sums a warp's products in float,
 * then in double); each thread also sums the squares of its values.  The
 * next chunk's streams are loaded before a chunk's products
 * (hcp_load_streams), two blocks an SM.
 * hc_finish_kernel then reduces the slices and finishes. */
#define HCP_TOK     64
#define HCP_COLS    256
#define HCP_CC      32
#define HCP_K       (4 * HCP_CC) /* K values of a chunk, stream-major: h * HCP_CC + c */
#define HCP_LD      (HCP_K + 4)  /* the fragment loads hit 32 banks (8-byte words: 4 g + t) */
#define HCP_THREADS 256

#define HCP_MROWS 32 /* mixer rows staged: every NMIX (<= 31) in whole m-tiles of 8 */

static size_t hcp_smem(void) { return (size_t)(HCP_TOK + HCP_MROWS) * HCP_LD * sizeof(double); }

/* The tokens' streams of one chunk of columns c0.. (HCP_CC of them): warp
 * w takes tokens w + 8 j, lane = column (zeros past the pass).  Issued a
 * chunk ahead of their use, so that they are in flight during the
 * previous chunk's products. */
static __device__ __forceinline__ void hcp_load_streams(const hc_args &a, uint32_t t0, uint32_t c0,
                                                        float (&sv)[HCP_TOK / 8][4]) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    uint32_t d = c0 + lane;
#pragma unroll
    for (int j = 0; j < HCP_TOK / 8; j++) {
        uint32_t t = t0 + warp + 8 * j;
        hc_in in = hc_load_token(a, t, d, t < a.T && d < a.D); /* S only: the mixer's args have no post source */
#pragma unroll
        for (int h = 0; h < 4; h++) sv[j][h] = in.v[h];
    }
}

template <int NMIX> static __global__ void __launch_bounds__(HCP_THREADS, 2) hc_prefill_mix_kernel(hc_args a) {
    constexpr int MT = (NMIX + 7) / 8;                /* m-tiles of 8 mixer rows */
    constexpr int FPT = MT * 8 * HCP_K / HCP_THREADS; /* mixer weights a thread stages per chunk */
    static_assert(HCP_THREADS % HCP_K == 0 && FPT * HCP_THREADS == MT * 8 * HCP_K, "staging: whole rows");
    static_assert(MT * 8 <= HCP_MROWS, "the staged mixer rows fit");
    dev_pdl_enter();
    DS4_DYN_SMEM(double, sm);
    double *sS = sm, *sF = sm + HCP_TOK * HCP_LD;
    const uint32_t n = 4, D = a.D;
    unsigned tid = threadIdx.x, lane = tid & 31, warp = tid / 32, g = lane / 4, tq = lane % 4;
    uint32_t t0 = blockIdx.x * HCP_TOK, col0 = blockIdx.y * HCP_COLS;
    uint32_t nsplit = (D + HCP_COLS - 1) / HCP_COLS;
    double acc[MT][2] = {}, ssq[HCP_TOK / 8] = {};
    float sv[HCP_TOK / 8][4];
    hcp_load_streams(a, t0, col0, sv);
    for (uint32_t cc = 0; cc < HCP_COLS && col0 + cc < D; cc += HCP_CC) {
        __syncthreads(); /* the previous chunk's fragments are read */
        /* mixer weights: thread tid takes K value tid % HCP_K of rows tid / HCP_K + r HCP_THREADS / HCP_K */
        {
            uint32_t kk = tid % HCP_K, h = kk / HCP_CC, d = col0 + cc + kk % HCP_CC;
            uint32_t m0 = tid / HCP_K, mstep = HCP_THREADS / HCP_K;
            float fv[FPT];
            fvec_n(a.fn, a.fn_type, (size_t)m0 * n * D + (size_t)h * D + d, (size_t)mstep * n * D, d < D, fv);
#pragma unroll
            for (int r = 0; r < FPT; r++) {
                uint32_t m = m0 + r * mstep;
                sF[m * HCP_LD + kk] = m < (uint32_t)NMIX ? (double)fv[r] : 0.0;
            }
        }
#pragma unroll
        for (int j = 0; j < HCP_TOK / 8; j++) {
            uint32_t tl = warp + 8 * j;
#pragma unroll
            for (uint32_t h = 0; h < n; h++) {
                double v = (double)sv[j][h]; /* 0 past the pass: adds nothing to the squares */
                sS[tl * HCP_LD + h * HCP_CC + lane] = v;
                ssq[j] += v * v;
            }
        }
        __syncthreads();
        if (cc + HCP_CC < HCP_COLS && col0 + cc + HCP_CC < D) hcp_load_streams(a, t0, col0 + cc + HCP_CC, sv);
        /* warp w: tokens 8 w .. 8 w + 7 against every m-tile */
        const double *bs = sS + (8 * warp + g) * HCP_LD + tq;
#pragma unroll 4
        for (uint32_t k = 0; k < HCP_K; k += 4) {
            double bv = bs[k];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) mma_f64_8x8x4(acc[mt], sF[(8 * mt + g) * HCP_LD + k + tq], bv);
        }
    }
    /* partial sums of slice blockIdx.y: squares (summed over the warp's lanes) and the mixer rows */
#pragma unroll
    for (int j = 0; j < HCP_TOK / 8; j++) {
        uint32_t t = t0 + warp + 8 * j;
        double v = warp_sum_d(ssq[j]);
        if (lane == 0 && t < a.T) a.part[((size_t)t * nsplit + blockIdx.y) * (NMIX + 1)] = v;
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t m = 8 * mt + g, t = t0 + 8 * warp + 2 * tq + i;
            if (m < (uint32_t)NMIX && t < a.T)
                a.part[((size_t)t * nsplit + blockIdx.y) * (NMIX + 1) + 1 + m] = acc[mt][i];
        }
}

/* Block t: the finish of token t of a prefill pass, after its mixer launch. */
template <int NMIX, int VALS> static __global__ void __launch_bounds__(HC_BLOCK, 2) hc_finish_kernel(hc_args a) {
    dev_pdl_launch_next();
    hc_consts<VALS> k = hc_load_consts<VALS>(a);
    dev_pdl_wait_prev();
    hc_finish<NMIX, true, VALS>(a, blockIdx.x, k);
}

/* Prefill: the HC post of the previous sublayer on its own, a thread per
 * column of a token (the arithmetic of hc_post_value, so the same values),
 * S rewritten in place.  The mixer launch after it reads S as it is: its
 * blocks, which sum as they load, kept too few loads in flight to stream
 * the post's sources (Nsight Compute: 41 % of its samples waiting on
 * them), which a launch without barriers and with every SM full of
 * threads does. */
#define HCPOST_THREADS 256
static __global__ void __launch_bounds__(HCPOST_THREADS) hc_prefill_post_kernel(hc_args a) {
    dev_pdl_enter();
    const uint32_t n = 4, D = a.D, t = blockIdx.y, d = blockIdx.x * HCPOST_THREADS + threadIdx.x;
    if (d >= D) return;
    hc_row w[4];
#pragma unroll
    for (uint32_t h = 0; h < n; h++) w[h] = hc_load_row(a, t, h);
    hc_in in = hc_load_token(a, t, d, true);
    float v[4];
#pragma unroll
    for (uint32_t h = 0; h < n; h++) v[h] = hc_post_value(w[h], in);
#pragma unroll
    for (uint32_t h = 0; h < n; h++) a.S[(size_t)t * n * D + (size_t)h * D + d] = v[h];
}

/* The prefill finish's dynamic shared memory: the token's four streams. */
static size_t hc_finish_smem(uint32_t D) { return (size_t)4 * D * sizeof(float); }

template <int NMIX, int VALS> static int hc_launch_rows(cuda_backend *b, uint32_t T, const hc_args &a, ds4_err *err) {
    if (T <= CU_FEW_PASS) {
        DS4_LAUNCH((hc_mix_kernel<NMIX, VALS>), dim3(b->hc_split, T), HC_BLOCK, 0, b->st, a);
        CU_LAUNCHED();
        return 0;
    }
    if (cu_allow_smem<hc_prefill_mix_kernel<NMIX>>(hcp_smem(), err)) return -1;
    hc_args p = a;
    if (a.y || a.eout) {
        DS4_LAUNCH(hc_prefill_post_kernel, dim3((a.D + HCPOST_THREADS - 1) / HCPOST_THREADS, T), HCPOST_THREADS, 0,
                   b->st, a);
        CU_LAUNCHED();
        p.y = p.eout = p.sout = NULL; /* the mixer reads the new S */
    }
    p.nsplit = (a.D + HCP_COLS - 1) / HCP_COLS;
    dim3 grid((T + HCP_TOK - 1) / HCP_TOK, p.nsplit);
    DS4_LAUNCH((hc_prefill_mix_kernel<NMIX>), grid, HCP_THREADS, hcp_smem(), b->st, p);
    CU_LAUNCHED();
    if (cu_allow_smem<hc_finish_kernel<NMIX, VALS>>(hc_finish_smem(a.D), err)) return -1;
    DS4_LAUNCH((hc_finish_kernel<NMIX, VALS>), T, HC_BLOCK, hc_finish_smem(a.D), b->st, p);
    CU_LAUNCHED();
    return 0;
}

/* The HC post of `post` alone, by the prefill's post launch (a thread a
 * column of a token: T rows of any length). */
static int hc_post_only(cuda_backend *b, const hc_args &a, uint32_t T, ds4_err *err) {
    if (b->cfg->n_hc != 4)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: HC of %u streams (needs 4)", b->cfg->n_hc);
    if (!a.y && !a.eout) return 0;
    DS4_LAUNCH(hc_prefill_post_kernel, dim3((a.D + HCPOST_THREADS - 1) / HCPOST_THREADS, T), HCPOST_THREADS, 0, b->st,
               a);
    CU_LAUNCHED();
    return 0;
}

int cu_hc_step(cuda_backend *b, const hc_post_src *post, const hc_site *site, uint32_t T, ds4_err *err) {
    const ds4_config *c = b->cfg;
    hc_args a;
    memset(&a, 0, sizeof(a));
    a.S = b->S;
    if (post) {
        a.y = post->y;
        a.eout = post->eout;
        a.sout = post->sout;
        a.k = post->k;
        a.hsel = post->hsel;
        a.hout = post->hout;
    }
    a.post = b->post;
    a.comb = b->comb;
    a.D = c->n_embd;
    if (!site) return hc_post_only(b, a, T, err);
    const dwt *fn = site->fn;
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
    if (!(site->forms & ACT_Q8)) a.xn.q8 = NULL;
    if (!(site->forms & ACT_QK)) a.xn.qk = NULL;
    a.sums_out = site->sink_later ? b->hcsums : NULL; /* a decode pass: one token (cu_forward) */
    uint32_t D = c->n_embd;
    uint32_t vals = D <= HC_VALS_NARROW * HC_THREADS ? HC_VALS_NARROW : HC_VALS_WIDE;
    if (c->n_hc != 4 || D > HC_MAX_D || D % vals != 0 || (a.xn.q8 && D % 32 != 0) || (a.xn.qk && D % 256 != 0))
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "CUDA backend: HC of %u streams of %u values (needs 4 streams, at most %u values, "
                           "a multiple of %u, of 32 / 256 for quantized inputs)",
                           c->n_hc, D, HC_MAX_D, vals);
    if (fn->rows != 24 && fn->rows != 4)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: HC mixer of %u rows", fn->rows);
    a.T = T;
    if (vals == HC_VALS_NARROW)
        return fn->rows == 24 ? hc_launch_rows<24, HC_VALS_NARROW>(b, T, a, err)
                              : hc_launch_rows<4, HC_VALS_NARROW>(b, T, a, err);
    return fn->rows == 24 ? hc_launch_rows<24, HC_VALS_WIDE>(b, T, a, err)
                          : hc_launch_rows<4, HC_VALS_WIDE>(b, T, a, err);
}

hc_sink_job cu_hc_sink_job(const cuda_backend *b, const hc_site *site) {
    hc_sink_job j;
    memset(&j, 0, sizeof(j));
    if (!site || !site->sink_later) return j;
    j.sums = b->hcsums;
    j.scale = (const float *)site->scale->p;
    j.base = (const float *)site->base->p;
    j.post = b->post;
    j.comb = b->comb;
    j.iters = b->cfg->hc_sinkhorn_iters;
    j.eps = b->cfg->hc_eps;
    return j;
}
