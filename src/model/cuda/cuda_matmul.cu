/*
 * cuda_matmul.cu - activation quantization and the matrix products of the
 * CUDA backend (layouts in cuda_internal.h).
 *
 * Activations are quantized exactly as the CPU does it (docs/MODEL.md 3.8), so
 * the integer block sums of every quantized product are the CPU's; only
 * the float accumulation across blocks may round differently.
 *
 * Decode (gemv): a warp owns one to four weight rows and walks them with
 * 16-byte loads (each lane 16 quant bytes per row per step, all loads of a
 * step issued before use), dotting them with dp4a against the int8
 * activation read through the L1; several products with different shapes
 * and types run in one launch ("segments"), the block picking its segment.
 * The kernel is compiled per set of weight types (the light Q8_0 / float
 * types, with Q2_K or Q4_K, IQ2_XXS alone, all), so that each launch runs
 * with the registers of its own types only and keeps three or four blocks
 * per SM streaming.  The routed experts' Q2_K down product has a launch
 * of its own (gemv_stream_kernel): a wave of blocks whose warps each walk
 * several units, loading one stage ahead.
 *
 * A few tokens (at most CU_FEW_PASS: a verification, a batched step of up
 * to 64 sessions) take the same plans: dense Q8_0 and float rows read once
 * from DRAM and dotted with every token (gemv_few_kernel, a kernel per
 * token count, more than CU_FEW_T tokens in chunks whose blocks run side
 * by side), each token's sums the one-token plan's; the routed experts as
 * one-token plans side by side, a (token, expert) entry in the grid's y,
 * the entries of one expert adjacent (cu_gemv_reps, cu_entry_order).
 *
 * Prefill (gemm): 128 weight rows x 64 tokens per block of 8 warps, K in
 * chunks of 256, compiled per weight type.  Quantized weights are expanded
 * to int8 in shared memory (Q8_0 copied verbatim, Q2_K pre-multiplied by
 * its 4-bit sub-block scales, IQ2_XXS as signed grid values, Q4_K nibbles)
 * and multiplied on the int8 tensor cores (ldmatrix fragments, mma
 * m16n8k32) against the int8 activations; the scales are applied to the
 * int32 results as the CPU applies them to its sums (Q8_0: the weight's
 * scale first, then the activation's, one rounding more than the CPU's
 * product of the two scales).  Shared memory holds two chunks: the next
 * one is fetched (cp.async, or for K-quants raw loads into registers,
 * issued two chunks ahead and expanded after the products) while the
 * current one is multiplied.  F16 weights run on the FP16 tensor cores
 * as stored, the tokens scaled by powers of two and split into binary16
 * head and tail; F32 and BF16 weights on the TF32 ones, each operand split
 * into a TF32 head and tail: either way the products keep f32 precision.
 * A float product of few rows is also split over K, so that its grid
 * fills the GPU, and its partial sums are added in a fixed order
 * afterwards.
 */
#include "model/cuda/cuda_route.cuh"


/* ------------------------------------------------------ quantization */

size_t cu_q8_bytes(uint32_t n) { return n % 32 ? 0 : ((size_t)n + (size_t)n / 32 * 4 + 15) / 16 * 16; }
size_t cu_qk_bytes(uint32_t n) {
    return n % 256 ? 0 : ((size_t)n + (size_t)n / 256 * 4 + (size_t)n / 16 * 2 + 15) / 16 * 16;
}

unsigned cu_act_form(uint32_t wtype) {
    switch (wtype) {
    case DS4_TYPE_Q8_0: return ACT_Q8;
    case DS4_TYPE_Q2_K:
    case DS4_TYPE_Q4_K:
    case DS4_TYPE_IQ2_XXS: return ACT_QK;
    default: return ACT_F;
    }
}

void cu_act_ptrs(const dact *a, uint32_t wtype, uint32_t t, uint32_t off, const float **xf, const int8_t **xq,
                 const float **xd, const int16_t **xb) {
    *xf = a->f ? a->f + (size_t)t * a->fs + off : NULL;
    *xq = NULL;
    *xd = NULL;
    *xb = NULL;
    unsigned form = cu_act_form(wtype);
    if (form == ACT_Q8 && a->q8) {
        const uint8_t *row = a->q8 + (size_t)t * a->q8s;
        *xq = (const int8_t *)row + off;
        *xd = (const float *)(row + a->n) + off / 32;
    } else if (form == ACT_QK && a->qk) {
        const uint8_t *row = a->qk + (size_t)t * a->qks;
        *xq = (const int8_t *)row + off;
        *xd = (const float *)(row + a->n) + off / 256;
        *xb = (const int16_t *)(row + a->n + a->n / 256 * 4) + off / 16;
    }
}

static __global__ void quantize_kernel(dact a) {
    dev_pdl_enter();
    const float *x = a.f + (size_t)blockIdx.x * a.fs;
    dev_quantize_row(x, a.n, a.q8 ? a.q8 + (size_t)blockIdx.x * a.q8s : NULL,
                     a.qk ? a.qk + (size_t)blockIdx.x * a.qks : NULL);
}

int cu_quantize(const dact *a, uint32_t T, cudaStream_t st, ds4_err *err) {
    if (T == 0 || (!a->q8 && !a->qk)) return 0;
    DS4_LAUNCH(quantize_kernel, T, 1024, 0, st, *a); /* a decode row is one block: many warps */
    CU_LAUNCHED();
    return 0;
}

/* ------------------------------------------------------------- gemv */

#define GEMV_WARPS 8

/* 16 bytes from global memory through the read-only path. */
static __device__ __forceinline__ int4 ld16(const void *p) {
#ifdef DS4_CUDA_EMU
    emu_check_aligned(p, 16, "16-byte load");
#endif
    return __ldg((const int4 *)p);
}

/* 16 bytes of a weight row in a decode product: read once, so kept out of
 * the L1 (where the activation every warp of the block rereads stays). */
static __device__ __forceinline__ int4 ldw16(const void *p) {
#ifdef DS4_CUDA_EMU
    return ld16(p);
#else
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#endif
}

static __device__ __forceinline__ int dot16(int4 w, int4 a) {
    int s = __dp4a(w.x, a.x, 0);
    s = __dp4a(w.y, a.y, s);
    s = __dp4a(w.z, a.z, s);
    return __dp4a(w.w, a.w, s);
}

/* Byte i (0..15, not known at compile time) of a 16-byte vector, without
 * indexing a register array (which would put it in local memory). */
static __device__ __forceinline__ uint32_t byte16(int4 v, uint32_t i) {
    uint32_t w = i < 8 ? (i < 4 ? (uint32_t)v.x : (uint32_t)v.y) : (i < 12 ? (uint32_t)v.z : (uint32_t)v.w);
    return (w >> (8 * (i & 3))) & 255;
}

/* Q8_0 rows: lane l holds bytes 16l..16l+15 of each 512-byte step, half a
 * block; the partner lane (l ^ 1) holds the other half.  U steps of R rows
 * are loaded before any is used (U R = 4: 64 bytes per lane in flight).
 * q8_0_load_w loads the weights of the steps from base; gemv_q8_0 with
 * wait set makes the PDL wait itself, after the first step's weight loads
 * (gemv_rows).  With PIPE, the next U steps' weights are loaded before the
 * current ones are used: two rounds in flight instead of a round trip
 * each.  Only the quantized-output launch
 * (attn_output_a: 32 rows a block, four a warp, eight rounds of 512 bytes
 * a row) has the registers for two rounds, at two blocks an SM - enough
 * for its 256 blocks: 2.5 % faster decode (cc1ab05).  In the light
 * launches (64 registers) it spills, and at 80
 * registers (three blocks an SM) they measured 3.9 % slower. */
template <int R>
static __device__ __forceinline__ void q8_0_load_w(const uint8_t *const *rows, uint32_t n, uint32_t base,
                                                   int4 (&w)[4 / R][R], uint16_t (&dw)[4 / R][R]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < 4 / R; u++) {
        uint32_t c = base + 512 * u + 16 * lane;
        bool ok = c < n;
#pragma unroll
        for (int r = 0; r < R; r++) {
            w[u][r] = ok ? ldw16(rows[r] + c) : make_int4(0, 0, 0, 0);
            dw[u][r] = ok ? __ldg((const uint16_t *)(rows[r] + n) + c / 32) : 0;
        }
    }
}
template <int R, bool PIPE>
static __device__ __forceinline__ void gemv_q8_0(const uint8_t *const *rows, uint32_t n, const int8_t *x,
                                                 const float *xd, float *acc, bool wait) {
    constexpr int U = 4 / R;
    unsigned lane = threadIdx.x & 31;
    int4 w[U][R];
    uint16_t dw[U][R];
    q8_0_load_w<R>(rows, n, 0, w, dw);
    if (wait) dev_pdl_wait_prev();
    for (uint32_t base = 0; base < n; base += 512 * U) {
        int4 wn[U][R];
        uint16_t dwn[U][R];
        bool more = base + 512 * U < n;
        if (PIPE && more) q8_0_load_w<R>(rows, n, base + 512 * U, wn, dwn);
        else if (!PIPE && base) q8_0_load_w<R>(rows, n, base, w, dw);
        int4 a[U];
        float dx[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t c = base + 512 * u + 16 * lane;
            bool ok = c < n;
            a[u] = ok ? ld16(x + c) : make_int4(0, 0, 0, 0);
            dx[u] = ok ? __ldg(xd + c / 32) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            bool ok = base + 512 * u + 16 * lane < n;
#pragma unroll
            for (int r = 0; r < R; r++) {
                int sum = dot16(w[u][r], a[u]);
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                if (ok && (lane & 1) == 0) acc[r] += (dev_f16(dw[u][r]) * dx[u]) * (float)sum;
            }
        }
        if (PIPE && more)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    w[u][r] = wn[u][r];
                    dw[u][r] = dwn[u][r];
                }
    }
}

/* Q2_K rows: four lanes per 256-block, each with a quarter of the 64 quant
 * bytes (4 sub-blocks of 16 values) and the 8 scale bytes of its half; a
 * stage is 8 blocks of R rows (step t: blocks 8 t ..).  Sub-block j's
 * 2-bit values are masked in place, not shifted down: bytes 4^j v (v =
 * 0..3, up to 192) against the activations by an unsigned x signed dp4a,
 * whose sum is then 4^j times the sum of v x - exact, so one shift of the
 * sum replaces a shift of each word.  Each lane keeps its own float sum
 * (the warp's sum at the end adds them). */
template <int R> struct q2k_stage {
    int4 w[R];
    uint2 sc[R];
    uint32_t dd[R];
};
template <int R>
static __device__ __forceinline__ void q2k_load(q2k_stage<R> &st, const uint8_t *const *rows, uint32_t nb, uint32_t t) {
    unsigned lane = threadIdx.x & 31, q = lane & 3, h = q >> 1;
    uint32_t b = 8 * t + lane / 4;
    bool ok = b < nb;
#pragma unroll
    for (int r = 0; r < R; r++) {
        st.w[r] = ok ? ldw16(rows[r] + 64 * (size_t)b + 16 * q) : make_int4(0, 0, 0, 0);
        st.sc[r] = ok ? __ldg((const uint2 *)(rows[r] + 64 * (size_t)nb + 16 * (size_t)b + 8 * h)) : make_uint2(0, 0);
        st.dd[r] = ok ? __ldg((const uint32_t *)(rows[r] + 80 * (size_t)nb) + b) : 0;
    }
}
template <int R>
static __device__ __forceinline__ void q2k_dot(const q2k_stage<R> &st, const int8_t *x, const float *xd,
                                               const int16_t *bsum, uint32_t nb, uint32_t t, float *acc) {
    unsigned lane = threadIdx.x & 31, q = lane & 3, h = q >> 1, l0 = (q & 1) * 16;
    uint32_t b = 8 * t + lane / 4;
    bool ok = b < nb;
    int4 a[4];
    int bs[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        a[j] = ok ? ld16(x + 256 * (size_t)b + 128 * h + 32 * j + l0) : make_int4(0, 0, 0, 0);
        bs[j] = ok ? bsum[16 * b + 8 * h + 2 * j + (q & 1)] : 0;
    }
    float dx = ok ? xd[b] : 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        /* sub-block j's scale byte is byte 2 j + (q & 1) of the half's 8 */
        uint32_t s01 = st.sc[r].x >> (8 * (q & 1)), s23 = st.sc[r].y >> (8 * (q & 1));
        const uint32_t sj[4] = {s01, s01 >> 16, s23, s23 >> 16};
        int isum = 0, msum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t m = 0x03030303u << (2 * j);
            int dj = dev_dp4a_us((uint32_t)st.w[r].x & m, a[j].x, 0);
            dj = dev_dp4a_us((uint32_t)st.w[r].y & m, a[j].y, dj);
            dj = dev_dp4a_us((uint32_t)st.w[r].z & m, a[j].z, dj);
            dj = dev_dp4a_us((uint32_t)st.w[r].w & m, a[j].w, dj);
            isum += (int)(sj[j] & 15) * (dj >> (2 * j));
            msum += (int)((sj[j] >> 4) & 15) * bs[j];
        }
        float dall = dev_f16((uint16_t)st.dd[r]) * dx, dmin = dev_f16((uint16_t)(st.dd[r] >> 16)) * dx;
        acc[r] += __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)msum));
    }
}
template <int R>
static __device__ __forceinline__ void gemv_q2_K(const uint8_t *const *rows, uint32_t n, const int8_t *x,
                                                 const float *xd, const int16_t *bsum, float *acc) {
    uint32_t nb = n / 256;
    for (uint32_t t = 0; 8 * t < nb; t++) {
        q2k_stage<R> st;
        q2k_load<R>(st, rows, nb, t);
        q2k_dot<R>(st, x, xd, bsum, nb, t, acc);
    }
}

/* Scale and min of Q4_K sub-block j (0..7) from the 12 scale bytes, held
 * as three little-endian words. */
static __device__ __forceinline__ void q4k_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, uint32_t j, int *sc,
                                                     int *m) {
    int4 s = make_int4((int)s0, (int)s1, (int)s2, 0);
    if (j < 4) {
        *sc = (int)(byte16(s, j) & 63);
        *m = (int)(byte16(s, j + 4) & 63);
    } else {
        *sc = (int)((byte16(s, j + 4) & 15) | ((byte16(s, j - 4) >> 6) << 4));
        *m = (int)((byte16(s, j + 4) >> 4) | ((byte16(s, j) >> 6) << 4));
    }
}

/* Q4_K rows: eight lanes per 256-block, each with 16 of the 128 quant bytes
 * (16 values of sub-block 2p in the low nibbles, 16 of 2p+1 in the high). */
template <int R>
static __device__ __forceinline__ void gemv_q4_K(const uint8_t *const *rows, uint32_t n, const int8_t *x,
                                                 const float *xd, const int16_t *bsum, float *acc) {
    unsigned lane = threadIdx.x & 31, c = lane & 7, p = c >> 1, l0 = (c & 1) * 16;
    uint32_t nb = n / 256;
    for (uint32_t b0 = 0; b0 < nb; b0 += 4) {
        uint32_t b = b0 + lane / 8;
        bool ok = b < nb;
        int4 w[R];
        uint32_t dd[R], s[R][3];
#pragma unroll
        for (int r = 0; r < R; r++) {
            w[r] = ok ? ldw16(rows[r] + 128 * (size_t)b + 16 * c) : make_int4(0, 0, 0, 0);
            const uint32_t *sp = (const uint32_t *)(rows[r] + 128 * (size_t)nb + 12 * (size_t)b);
#pragma unroll
            for (int i = 0; i < 3; i++) s[r][i] = ok ? __ldg(sp + i) : 0;
            dd[r] = ok ? __ldg((const uint32_t *)(rows[r] + 140 * (size_t)nb) + b) : 0;
        }
        int4 alo = ok ? ld16(x + 256 * (size_t)b + 64 * p + l0) : make_int4(0, 0, 0, 0);
        int4 ahi = ok ? ld16(x + 256 * (size_t)b + 64 * p + 32 + l0) : make_int4(0, 0, 0, 0);
        int bslo = ok ? bsum[16 * b + 4 * p + (l0 / 16)] : 0, bshi = ok ? bsum[16 * b + 4 * p + 2 + (l0 / 16)] : 0;
#pragma unroll
        for (int r = 0; r < R; r++) {
            int4 wl, wh;
            wl.x = w[r].x & 0x0f0f0f0f;
            wh.x = (w[r].x >> 4) & 0x0f0f0f0f;
            wl.y = w[r].y & 0x0f0f0f0f;
            wh.y = (w[r].y >> 4) & 0x0f0f0f0f;
            wl.z = w[r].z & 0x0f0f0f0f;
            wh.z = (w[r].z >> 4) & 0x0f0f0f0f;
            wl.w = w[r].w & 0x0f0f0f0f;
            wh.w = (w[r].w >> 4) & 0x0f0f0f0f;
            int sc0, m0, sc1, m1;
            q4k_scale_min(s[r][0], s[r][1], s[r][2], 2 * p, &sc0, &m0);
            q4k_scale_min(s[r][0], s[r][1], s[r][2], 2 * p + 1, &sc1, &m1);
            int isum = sc0 * dot16(wl, alo) + sc1 * dot16(wh, ahi);
            int msum = m0 * bslo + m1 * bshi;
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) {
                isum += __shfl_xor_sync(0xffffffffu, isum, o);
                msum += __shfl_xor_sync(0xffffffffu, msum, o);
            }
            if (ok && c == 0) {
                float dall = dev_f16((uint16_t)dd[r]) * xd[b], dmin = dev_f16((uint16_t)(dd[r] >> 16)) * xd[b];
                acc[r] += __fsub_rn(__fmul_rn(dall, (float)isum), __fmul_rn(dmin, (float)msum));
            }
        }
    }
}

/* IQ2_XXS decoding as byte selections: a value is one of 8, 25, 43 or their
 * negatives, so the eight signed bytes of a grid vector are two byte
 * permutes (PRMT) of the words IQ2_POS and IQ2_NEG, whose selector nibble k
 * is the level of value k (0..2) plus 4 for a negative one.  A block keeps
 * two tables of selector words in shared memory (cu_matmul_init makes
 * them): the levels of grid vector i as eight nibbles (IQ2_LEVELS words),
 * and, for each 7-bit sign index, its eight signs - the eighth the parity
 * of the seven stored - as bit 2 of each nibble (IQ2_SIGNS words).  Two
 * 4-byte lookups (a warp's random 4-byte lookups take half the
 * bank-conflicted passes of its 8-byte ones), an OR and two permutes
 * replace an 8-byte grid lookup and ten operations of sign arithmetic.
 * Measured on the H200 (1aceb1e): decode 1 % faster, the prefill
 * products unchanged.  The prefill's expansion reads this compact table;
 * the decode products a copy a lane (iq2_group_rep: decode 2.6 % faster,
 * 098be36 - once the decode had half
 * the instructions, the lookups' bank conflicts bound it). */
#define IQ2_LEVELS 256
#define IQ2_SIGNS  128
#define IQ2_POS    0x002B1908u                  /* bytes 8, 25, 43 */
#define IQ2_TAB    (IQ2_LEVELS + IQ2_SIGNS + 2) /* words: the last two are IQ2_POS, see iq2_pos */
#define IQ2_NEG    0x00D5E7F8u                  /* bytes -8, -25, -43 */

static __device__ void dev_iq2_fill_tab(uint32_t *tab, const uint32_t *tab_g) {
    block_load_row(tab, tab_g, IQ2_TAB);
    __syncthreads();
}

/* IQ2_POS as a value the lanes read from two words of the table by the
 * parity of their index: a constant, or a value read at one address, the
 * compiler keeps in a uniform register and copies before every permute
 * (which takes one immediate, IQ2_NEG, and no uniform register) rather
 * than hold in a register of its own - a copy for each 8 values. */
static __device__ __forceinline__ uint32_t iq2_pos(const uint32_t *tab) { return tab[IQ2_TAB - 2 + (threadIdx.x & 1)]; }

/* The signed grid values of one IQ2_XXS group of 32 (8 words), from its
 * index word g and sign/scale word s; pos is iq2_pos(tab). */
static __device__ __forceinline__ void iq2_group(const uint32_t *tab, uint32_t pos, uint32_t g, uint32_t s,
                                                 uint32_t out[8]) {
#pragma unroll
    for (int l = 0; l < 4; l++) {
        uint32_t sel = tab[(g >> (8 * l)) & 255] | tab[IQ2_LEVELS + ((s >> (7 * l)) & 127)];
        out[2 * l] = dev_prmt(pos, IQ2_NEG, sel); /* nibbles 0..6: no sign mode */
        out[2 * l + 1] = dev_prmt(pos, IQ2_NEG, sel >> 16);
    }
}

/* The decode products' copy of the tables: each word 32 times, entry e's
 * copy for lane i at word 32 e + i, in bank i - a warp's 32 random lookups
 * in one pass, where the compact table's bank conflicts take three on
 * average (a warp's lookups are random over 256 or 128 words).  49 KB a
 * block (dynamic shared memory), filled from the device's compact table
 * (L1 hits after an SM's first block). */
#define IQ2_REP_BYTES (IQ2_TAB * 32 * 4)
static __device__ void dev_iq2_fill_rep(uint32_t *tab, const uint32_t *tab_g) {
    /* 16 bytes a store, all loads first: chunk c is copies 4 (c % 8) ..
     * 4 (c % 8) + 3 of entry c / 8 (blocks of GEMV_WARPS warps) */
    constexpr uint32_t CHUNKS = IQ2_TAB * 8, T = GEMV_WARPS * 32, U = (CHUNKS + T - 1) / T;
    uint32_t v[U];
#pragma unroll
    for (uint32_t u = 0; u < U; u++) v[u] = threadIdx.x + u * T < CHUNKS ? __ldg(tab_g + (threadIdx.x + u * T) / 8) : 0;
#pragma unroll
    for (uint32_t u = 0; u < U; u++)
        if (threadIdx.x + u * T < CHUNKS) ((uint4 *)tab)[threadIdx.x + u * T] = make_uint4(v[u], v[u], v[u], v[u]);
    __syncthreads();
}
static __device__ __forceinline__ uint32_t iq2_pos_rep(const uint32_t *tab) {
    return tab[32 * (IQ2_TAB - 1) + (threadIdx.x & 31)];
}
/* iq2_group on the replicated tables: the byte offset of lane i's copy of
 * entry e is 128 e + 4 i, so each field is shifted to bit 7 and masked,
 * the lane's 4 i or-ed in (one LOP3 with the mask). */
static __device__ __forceinline__ void iq2_group_rep(const uint32_t *tab, uint32_t pos, uint32_t g, uint32_t s,
                                                     uint32_t out[8]) {
    const char *tb = (const char *)tab;
    uint32_t lane4 = 4 * (threadIdx.x & 31);
    const uint32_t og[4] = {(g << 7) & 0x7F80u, (g >> 1) & 0x7F80u, (g >> 9) & 0x7F80u, (g >> 17) & 0x7F80u};
    const uint32_t os[4] = {(s << 7) & 0x3F80u, s & 0x3F80u, (s >> 7) & 0x3F80u, (s >> 14) & 0x3F80u};
#pragma unroll
    for (int l = 0; l < 4; l++) {
        uint32_t sel = *(const uint32_t *)(tb + (og[l] | lane4)) |
                       *(const uint32_t *)(tb + 128 * IQ2_LEVELS + (os[l] | lane4));
        out[2 * l] = dev_prmt(pos, IQ2_NEG, sel);
        out[2 * l + 1] = dev_prmt(pos, IQ2_NEG, sel >> 16);
    }
}

/* IQ2_XXS rows: four lanes per 256-block, each with two groups of 32; a
 * stage is 8 blocks of R rows (step t: blocks 8 t ..).  Each lane keeps
 * its own float sum of its blocks (the warp's sum at the end adds them):
 * no shuffles a block.  The blocks' common factor 1/8 is left to the end
 * (IQ2_SCALE: a power of two, the same bits). */
#define IQ2_SCALE 0.125f
template <int R> struct iq2_stage {
    int4 w[R];
    uint32_t d[R];
};
template <int R>
static __device__ __forceinline__ void iq2_load(iq2_stage<R> &st, const uint8_t *const *rows, uint32_t nb, uint32_t t) {
    unsigned lane = threadIdx.x & 31, q = lane & 3;
    uint32_t b = 8 * t + lane / 4;
    bool ok = b < nb;
#pragma unroll
    for (int r = 0; r < R; r++) {
        st.w[r] = ok ? ldw16(rows[r] + 64 * (size_t)b + 16 * q) : make_int4(0, 0, 0, 0);
        st.d[r] = ok ? __ldg((const uint16_t *)(rows[r] + 64 * (size_t)nb) + b) : 0;
    }
}
template <int R>
static __device__ __forceinline__ void iq2_dot(const iq2_stage<R> &st, const int8_t *x, const float *xd,
                                               const uint32_t *tab, uint32_t pos, uint32_t nb, uint32_t t, float *acc) {
    unsigned lane = threadIdx.x & 31, q = lane & 3;
    uint32_t b = 8 * t + lane / 4;
    bool ok = b < nb;
    int4 a[4];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = ok ? ld16(x + 256 * (size_t)b + 64 * q + 16 * i) : make_int4(0, 0, 0, 0);
    float dx = ok ? xd[b] : 0.0f;
#pragma unroll
    for (int r = 0; r < R; r++) {
        int isum = 0;
        uint32_t wq[4] = {(uint32_t)st.w[r].x, (uint32_t)st.w[r].y, (uint32_t)st.w[r].z, (uint32_t)st.w[r].w};
#pragma unroll
        for (int gi = 0; gi < 2; gi++) {
            uint32_t v[8];
            iq2_group_rep(tab, pos, wq[2 * gi], wq[2 * gi + 1], v);
            int4 v0 = make_int4((int)v[0], (int)v[1], (int)v[2], (int)v[3]);
            int4 v1 = make_int4((int)v[4], (int)v[5], (int)v[6], (int)v[7]);
            int sub = dot16(v0, a[2 * gi]) + dot16(v1, a[2 * gi + 1]);
            isum += (int)(2 * (wq[2 * gi + 1] >> 28) + 1) * sub;
        }
        acc[r] += (dev_f16((uint16_t)st.d[r]) * dx) * (float)isum;
    }
}
/* Two stages loaded at once. */
template <int R>
static __device__ __forceinline__ void gemv_iq2_xxs(const uint8_t *const *rows, uint32_t n, const int8_t *x,
                                                    const float *xd, const uint32_t *tab, float *acc) {
    uint32_t nb = n / 256, pos = iq2_pos_rep(tab);
    for (uint32_t t = 0; 8 * t < nb; t += 2) {
        iq2_stage<R> st[2];
        iq2_load<R>(st[0], rows, nb, t);
        iq2_load<R>(st[1], rows, nb, t + 1);
        iq2_dot<R>(st[0], x, xd, tab, pos, nb, t, acc);
        iq2_dot<R>(st[1], x, xd, tab, pos, nb, t + 1, acc);
    }
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] *= IQ2_SCALE;
}

/* Float rows against f32 activations: 16 bytes of weights per lane per
 * step, U steps of R rows loaded at once (U R = 4); wait as gemv_q8_0's. */
template <int R>
static __device__ __forceinline__ void float_load_w(const uint8_t *const *rows, uint32_t n, uint32_t per, uint32_t esz,
                                                    uint32_t base, int4 (&w)[4 / R][R]) {
    unsigned lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < 4 / R; u++) {
        uint32_t e = base + 32 * per * u + per * lane;
#pragma unroll
        for (int r = 0; r < R; r++) w[u][r] = e < n ? ldw16(rows[r] + (size_t)e * esz) : make_int4(0, 0, 0, 0);
    }
}
/* The 8 values of a lane's 16 bytes of float weights (4 for F32; the
 * others 0) from activation x at value e, and their products' sum in
 * order: the arithmetic of every float product of a decode step. */
static __device__ __forceinline__ void float_x8(const float *x, uint32_t e, uint32_t per, float (&xv)[8]) {
    float4 v0 = __ldg((const float4 *)(x + e));
    xv[0] = v0.x;
    xv[1] = v0.y;
    xv[2] = v0.z;
    xv[3] = v0.w;
    if (per == 8) {
        float4 v1 = __ldg((const float4 *)(x + e + 4));
        xv[4] = v1.x;
        xv[5] = v1.y;
        xv[6] = v1.z;
        xv[7] = v1.w;
    } else {
        xv[4] = xv[5] = xv[6] = xv[7] = 0.0f;
    }
}
static __device__ __forceinline__ float float_dot8(int4 w, uint32_t type, const float (&xv)[8]) {
    uint32_t wv[4] = {(uint32_t)w.x, (uint32_t)w.y, (uint32_t)w.z, (uint32_t)w.w};
    float sum = 0.0f;
    if (type == DS4_TYPE_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) sum += __uint_as_float(wv[i]) * xv[i];
    } else if (type == DS4_TYPE_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sum += dev_f16((uint16_t)wv[i]) * xv[2 * i];
            sum += dev_f16((uint16_t)(wv[i] >> 16)) * xv[2 * i + 1];
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sum += dev_bf16((uint16_t)wv[i]) * xv[2 * i];
            sum += dev_bf16((uint16_t)(wv[i] >> 16)) * xv[2 * i + 1];
        }
    }
    return sum;
}

template <int R>
static __device__ __forceinline__ void gemv_float(const uint8_t *const *rows, uint32_t type, uint32_t n, const float *x,
                                                  float *acc, bool wait) {
    constexpr int U = 4 / R;
    unsigned lane = threadIdx.x & 31;
    uint32_t per = type == DS4_TYPE_F32 ? 4 : 8, esz = type == DS4_TYPE_F32 ? 4 : 2; /* elements per 16 bytes */
    int4 w[U][R];
    float_load_w<R>(rows, n, per, esz, 0, w);
    if (wait) dev_pdl_wait_prev();
    for (uint32_t base = 0; base < n; base += 32 * per * U) {
        if (base) float_load_w<R>(rows, n, per, esz, base, w);
#pragma unroll
        for (int u = 0; u < U; u++) {
            uint32_t e = base + 32 * per * u + per * lane;
            if (e >= n) continue;
            float xv[8];
            float_x8(x, e, per, xv);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] += float_dot8(w[u][r], type, xv);
        }
    }
}

/* The weight types a gemv launch may contain, as a bit set: each launch
 * runs the kernel compiled for the smallest listed set that covers its
 * segments, so a launch without IQ2_XXS rows does not pay that path's
 * registers (and occupancy). */
enum {
    GM_Q8_0 = 1,
    GM_FLOAT = 2,
    GM_Q2_K = 4,
    GM_Q4_K = 8,
    GM_IQ2_XXS = 16,
    GM_LIGHT = GM_Q8_0 | GM_FLOAT,
    GM_ALL = 31,
    GM_Q8OUT = 32,      /* Q8_0 rows whose outputs are quantized too (a launch of its own: the epilogue's registers) */
    GM_ROUTE_WIDE = 64, /* a router product of more than 256 experts routing in its last block (a launch of
                         * its own: the 16 experts a lane take registers the others need not reserve) */
    GM_REPS = 128,      /* a plan of reps tokens, blockIdx.y the token (cu_gemv_reps) */
};

static uint32_t gemv_type_bit(uint32_t type) {
    switch (type) {
    case DS4_TYPE_Q8_0: return GM_Q8_0;
    case DS4_TYPE_Q2_K: return GM_Q2_K;
    case DS4_TYPE_Q4_K: return GM_Q4_K;
    case DS4_TYPE_IQ2_XXS: return GM_IQ2_XXS;
    default: return GM_FLOAT;
    }
}

/* Segment sg as token t of a plan of several sees it (gemv_seg.xqs ...). */
static __device__ __forceinline__ gemv_seg gemv_seg_token(const gemv_seg &sg, uint32_t t) {
    gemv_seg v = sg;
    uint32_t xt = sg.x_div > 1 ? t / sg.x_div : t;
    size_t q = (size_t)xt * sg.xqs;
    v.xq = sg.xq ? sg.xq + q : NULL;
    v.xd = sg.xd ? (const float *)((const uint8_t *)sg.xd + q) : NULL;
    v.xb = sg.xb ? (const int16_t *)((const uint8_t *)sg.xb + q) : NULL;
    v.xf = sg.xf ? sg.xf + (size_t)xt * sg.xfs : NULL;
    v.out = sg.out + t * sg.outs;
    v.sel_slot = sg.sel_slot + t * sg.sel_step;
    return v;
}

/* R rows of a segment from row r0, after the PDL wait (wait: it is still
 * to come).  The Q8_0 and float loops of fixed matrices issue their first
 * weight loads before it and then wait themselves: those rows are written
 * by no kernel, and the loads overlap the end of the kernel before.  Rows
 * of selected matrices (routed experts: the routing picks them) and the
 * other types wait first. */
template <unsigned M, int R>
static __device__ __forceinline__ void gemv_rows(const gemv_seg &sg, uint32_t r0, const uint32_t *tab, float *keep,
                                                 bool wait) {
    bool q8 = (M & GM_Q8_0) && sg.type == DS4_TYPE_Q8_0;
    bool fl = (M & GM_FLOAT) && (sg.type == DS4_TYPE_F32 || sg.type == DS4_TYPE_F16 || sg.type == DS4_TYPE_BF16);
    bool early = wait && !sg.sel && (q8 || fl);
    if (wait && !early) dev_pdl_wait_prev();
    unsigned lane = threadIdx.x & 31;
    int m = sg.sel ? sg.sel[sg.sel_slot] - sg.sel_lo : (int)sg.mat;
    if (sg.sel && (m < 0 || (uint32_t)m >= sg.sel_n)) return; /* on the host, or another tier's (cuda_offload.h) */
    uint32_t mat = (uint32_t)m;
    const uint8_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        uint32_t row = r0 + r < sg.rows ? r0 + r : sg.rows - 1; /* duplicate the last row: loads stay in bounds */
        rows[r] = sg.w + mat * sg.mat_bytes + (size_t)(sg.row0 + row) * sg.row_bytes;
    }
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    if (q8) gemv_q8_0<R, (M & GM_Q8OUT) != 0>(rows, sg.n, sg.xq, sg.xd, acc, early);
    else if ((M & GM_Q2_K) && sg.type == DS4_TYPE_Q2_K) gemv_q2_K<R>(rows, sg.n, sg.xq, sg.xd, sg.xb, acc);
    else if ((M & GM_Q4_K) && sg.type == DS4_TYPE_Q4_K) gemv_q4_K<R>(rows, sg.n, sg.xq, sg.xd, sg.xb, acc);
    else if ((M & GM_IQ2_XXS) && sg.type == DS4_TYPE_IQ2_XXS) gemv_iq2_xxs<R>(rows, sg.n, sg.xq, sg.xd, tab, acc);
    else if (fl) gemv_float<R>(rows, sg.type, sg.n, sg.xf, acc, early);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0 && r0 + r < sg.rows) sg.out[r0 + r] = v;
        if (keep && lane == 0) keep[r] = v;
    }
}

/* The Q8_0 form of a block's 32 outputs (kept in shared memory), by warp
 * 0, as dev_quantize_row makes it: amax / 127, round to nearest even. */
static __device__ __forceinline__ void gemv_q8_epilogue(const gemv_seg &sg, const float *kept) {
    unsigned lane = threadIdx.x & 31;
    float v = kept[lane], amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float db = amax / 127.0f;
    float id = db != 0.0f ? 1.0f / db : 0.0f;
    uint32_t i = sg.q8_off + (blockIdx.x - sg.block0) * 32 + lane;
    sg.q8[i] = (uint8_t)q8_round(v * id);
    if (lane == 0) ((float *)(sg.q8 + sg.q8_n))[i / 32] = db;
}

/* A float row split over the block's warps (gemv_seg.split): warp w takes
 * values [w n / W, (w + 1) n / W), and the partial sums meet in shared
 * memory, added in warp order.  For products of few long rows (the
 * router: 256 rows of 4096), which a warp a row would walk in several
 * dependent rounds of loads; here each warp issues its part's loads at
 * once. */
struct gemv_part {
    const uint8_t *w; /* the part's first weight byte */
    uint32_t e0, len; /* its first value and count */
};
static __device__ __forceinline__ gemv_part gemv_part_of(const gemv_seg &sg, uint32_t row, unsigned warp) {
    uint32_t esz = sg.type == DS4_TYPE_F32 ? 4 : 2;
    gemv_part pt;
    pt.len = sg.n / GEMV_WARPS;
    pt.e0 = warp * pt.len;
    pt.w = sg.w + (size_t)sg.mat * sg.mat_bytes + (size_t)(sg.row0 + row) * sg.row_bytes + (size_t)pt.e0 * esz;
    return pt;
}

static __device__ __forceinline__ void gemv_split_row(const gemv_seg &sg, uint32_t row, unsigned warp,
                                                      const gemv_part &pt) {
    __shared__ float part[GEMV_WARPS];
    const uint8_t *rows[1] = {pt.w};
    float acc[1] = {0.0f};
    gemv_float<1>(rows, sg.type, pt.len, sg.xf + pt.e0, acc, true);
    float v = warp_sum(acc[0]);
    if ((threadIdx.x & 31) == 0) part[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.0f;
        for (int w = 0; w < GEMV_WARPS; w++) s += part[w];
        sg.out[row] = s;
    }
}

/* Blocks per SM the register budget must allow: 4 (64 registers a thread,
 * half the warps of an SM) for the light types and Q2_K / Q4_K, 3 with the
 * IQ2_XXS decoding, 2 for the quantized output (its 256 blocks fit, with
 * the registers of its pipelined walk). */
#define GEMV_MIN_BLOCKS(M) ((M) & (GM_Q8OUT | GM_ROUTE_WIDE) ? 2 : (M) & (GM_Q2_K | GM_Q4_K | GM_IQ2_XXS) ? 3 : 4)

template <unsigned M>
static __global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_MIN_BLOCKS(M))
    gemv_kernel(gemv_plan p, const uint32_t *tab_g, uint32_t seg_blocks /* cu_gemv_seg_blocks */) {
    dev_pdl_launch_next();
    DS4_DYN_SMEM(uint32_t, tab); /* IQ2_REP_BYTES with IQ2_XXS rows, else none */
    /* the block's segment: by a division where the segments are equal (the
     * routed experts', attn_output_a's groups), else by a walk of the plan,
     * whose dependent constant-cache loads the division spares (gemv_probe
     * and Nsight Compute: 10 - 15 % of a routed product's samples waited
     * on them; bc54dcb) */
    uint32_t s = 0;
    if (seg_blocks) s = blockIdx.x / seg_blocks;
    else
        while (s + 1 < p.n_seg && blockIdx.x >= p.seg[s + 1].block0) s++;
    gemv_seg tok;
    if (M & GM_REPS) {
        uint32_t t = blockIdx.y;
        if (p.order) { /* written by the kernel before */
            dev_pdl_wait_prev();
            t = (uint32_t)p.order[t];
        }
        tok = gemv_seg_token(p.seg[s], t);
    }
    const gemv_seg &sg = (M & GM_REPS) ? tok : p.seg[s];
    unsigned warp = threadIdx.x / 32;
    if ((M & GM_FLOAT) && sg.split > 1) { /* a block a row (never selected rows: see cu_gemv_add) */
        uint32_t row = blockIdx.x - sg.block0;
        gemv_split_row(sg, row, warp, gemv_part_of(sg, row, warp));
        /* the router's (cu_gemv_route): its last block loads the bias
         * and routes, one warp, as the routing launch would */
        if (p.route.count && dev_last_block(p.route.count, p.n_blocks) && warp == 0) {
            constexpr int PER = ((M & GM_ROUTE_WIDE) ? GEMV_ROUTE_MAX_EXPERTS_WIDE : GEMV_ROUTE_MAX_EXPERTS) / 32;
            float bias[PER];
            route_load_bias<PER>(p.route.in, bias);
            route_token<PER>(p.route.in, 0, p.route.sel, p.route.selw, bias);
        }
        return;
    }
    uint32_t r0 = ((blockIdx.x - sg.block0) * GEMV_WARPS + warp) * sg.rpw;
    /* The IQ2_XXS tables and the weights are written by no kernel: the
     * tables are copied, and each warp's first round of loads of Q8_0 or
     * float rows of fixed matrices issued into registers (gemv_rows), while
     * the kernel before this one finishes.  Not more: asking the L2 for a
     * block's whole rows before the wait (as before a1e1cce) let the
     * waiting blocks of several products, whose launches run ahead in a
     * chain, push tens of MB out of one another's way - 5 % slower;
     * staging 4 KB a warp in shared memory measured 5.6 % slower. */
    if ((M & GM_IQ2_XXS) && sg.type == DS4_TYPE_IQ2_XXS) dev_iq2_fill_rep(tab, tab_g);
    if ((M & GM_Q8OUT) && sg.q8) { /* 32 rows a block, none past the segment (cu_gemv_add_q8) */
        __shared__ float kept[32];
        gemv_rows<M, 4>(sg, r0, tab, kept + 4 * warp, true);
        __syncthreads();
        if (warp == 0) gemv_q8_epilogue(sg, kept);
        return;
    }
    if (r0 >= sg.rows) return; /* touches no memory: nothing to wait for */
    switch (sg.rpw) {
    case 1: gemv_rows<M, 1>(sg, r0, tab, NULL, true); break;
    case 2: gemv_rows<M, 2>(sg, r0, tab, NULL, true); break;
    default: gemv_rows<M, 4>(sg, r0, tab, NULL, true); break;
    }
}

/* A plan of a few tokens (gemv_plan.T, CU_FEW_PASS at most: a verification,
 * the rows an MTP cycle keeps, a batched step of sessions): each
 * weight row is read once and dotted with every token's activation, in
 * one launch for all the plan's segments, as a decode step's plan is one.
 * The int8 tile kernel, 64 tokens a tile, ran a block of 128 rows over the
 * whole row length: a 1024-row product was 8 blocks on 132 SMs, 51 us a
 * launch on an H100 where the decode gemv reads the same bytes in a few;
 * and a launch a matrix left the launches of a pass of 4 rows 2.5 times a
 * decode step's.  Each token's sums are those of the one-token plan, in
 * its order: a Q8_0 row by a warp (gemv_q8_0: a lane's partial sums over
 * rounds of 512 values, then the warp's), a split float row by a block
 * (gemv_split_row: warp w's part, the parts added in warp order), other
 * float rows by a warp (gemv_float). */
#define FEW_U 4 /* 16-byte weight loads a lane issues at once: one in flight left a warp waiting on each */
/* NT is the plan's token count itself (a kernel per count): with a loop
 * over the tokens that could end early, each token's activation loads
 * waited behind the last token's sums - 28.7 us a launch for 4 tokens on
 * an H100, a quarter of the weights' bandwidth. */
/* A warp takes FEW_R Q8_0 rows, each activation load serving them all:
 * with a row a warp, T tokens' loads of the activations (from L1) were T
 * times the weights' (from DRAM).  FEW_U / FEW_R rounds of 512 values a
 * step, so that a lane has FEW_U 16-byte weight loads in flight. */
#define FEW_R 2
/* nt: the chunk's tokens (NT but in a pass's last chunk); a token past them
 * loads the last one's activation and writes nothing, so that no load
 * waits on a test. */
template <uint32_t NT>
static __device__ __forceinline__ void few_q8_rows(const gemv_seg &sg, uint32_t row0, uint32_t nt) {
    constexpr uint32_t U = FEW_U / FEW_R;
    unsigned lane = threadIdx.x & 31;
    const uint8_t *w[FEW_R];
#pragma unroll
    for (uint32_t r = 0; r < FEW_R; r++) { /* past the segment: its last row again, loads in bounds, not written */
        uint32_t row = row0 + r < sg.rows ? row0 + r : sg.rows - 1;
        w[r] = sg.w + (size_t)sg.mat * sg.mat_bytes + (size_t)(sg.row0 + row) * sg.row_bytes;
    }
    float acc[FEW_R][NT];
#pragma unroll
    for (uint32_t r = 0; r < FEW_R; r++)
#pragma unroll
        for (uint32_t t = 0; t < NT; t++) acc[r][t] = 0.0f;
    for (uint32_t base = 0; base < sg.n; base += 512 * U) {
        int4 wv[FEW_R][U];
        float d[FEW_R][U];
#pragma unroll
        for (uint32_t u = 0; u < U; u++) {
            uint32_t c = base + 512 * u + 16 * lane;
#pragma unroll
            for (uint32_t r = 0; r < FEW_R; r++) {
                wv[r][u] = c < sg.n ? ldw16(w[r] + c) : make_int4(0, 0, 0, 0);
                d[r][u] = c < sg.n ? dev_f16(__ldg((const uint16_t *)(w[r] + sg.n) + c / 32)) : 0.0f;
            }
        }
#pragma unroll
        for (uint32_t u = 0; u < U; u++) {
            uint32_t c = base + 512 * u + 16 * lane;
            bool ok = c < sg.n;
            int4 xv[NT];
            float xd[NT];
            int sum[FEW_R * NT];
#pragma unroll
            for (uint32_t t = 0; t < NT; t++) { /* every token's loads first */
                size_t q = (size_t)(t < nt ? t : nt - 1) * sg.xqs;
                xv[t] = ok ? ld16(sg.xq + q + c) : make_int4(0, 0, 0, 0);
                xd[t] = ok ? __ldg((const float *)((const uint8_t *)sg.xd + q) + c / 32) : 0.0f;
            }
#pragma unroll
            for (uint32_t r = 0; r < FEW_R; r++)
#pragma unroll
                for (uint32_t t = 0; t < NT; t++) sum[r * NT + t] = dot16(wv[r][u], xv[t]);
            warp_pair_add_n<FEW_R * NT>(sum); /* a Q8_0 block's two halves */
#pragma unroll
            for (uint32_t r = 0; r < FEW_R; r++)
#pragma unroll
                for (uint32_t t = 0; t < NT; t++)
                    if (ok && (lane & 1) == 0) acc[r][t] += (d[r][u] * xd[t]) * (float)sum[r * NT + t];
        }
    }
#pragma unroll
    for (uint32_t r = 0; r < FEW_R; r++) {
        warp_sum_n<NT>(acc[r]);
#pragma unroll
        for (uint32_t t = 0; t < NT; t++)
            if (lane == 0 && row0 + r < sg.rows && t < nt) sg.out[(size_t)t * sg.outs + row0 + r] = acc[r][t];
    }
}

/* Values [e0, e0 + len) of a float row (w: value e0's byte) against every
 * token's activation, a lane's sums in gemv_float's order. */
template <uint32_t NT>
static __device__ __forceinline__ void few_float_part(const gemv_seg &sg, const uint8_t *w, uint32_t e0, uint32_t len,
                                                      uint32_t nt, float (&acc)[NT]) {
    unsigned lane = threadIdx.x & 31;
    uint32_t per = sg.type == DS4_TYPE_F32 ? 4 : 8, esz = sg.type == DS4_TYPE_F32 ? 4 : 2; /* values a 16-byte load */
#pragma unroll
    for (uint32_t t = 0; t < NT; t++) acc[t] = 0.0f;
    for (uint32_t base = 0; base < len; base += 32 * per * FEW_U) {
        int4 wv[FEW_U];
#pragma unroll
        for (uint32_t u = 0; u < FEW_U; u++) {
            uint32_t e = base + 32 * per * u + per * lane;
            wv[u] = e < len ? ldw16(w + (size_t)e * esz) : make_int4(0, 0, 0, 0);
        }
#pragma unroll
        for (uint32_t u = 0; u < FEW_U; u++) {
            uint32_t e = base + 32 * per * u + per * lane;
            if (e >= len) continue;
#pragma unroll
            for (uint32_t t = 0; t < NT; t++) {
                float xv[8];
                float_x8(sg.xf + (size_t)(t < nt ? t : nt - 1) * sg.xfs + e0, e, per, xv);
                acc[t] += float_dot8(wv[u], sg.type, xv);
            }
        }
    }
}

template <uint32_t NT>
static __device__ __forceinline__ void few_float_row(const gemv_seg &sg, uint32_t row, uint32_t nt) {
    const uint8_t *w = sg.w + (size_t)sg.mat * sg.mat_bytes + (size_t)(sg.row0 + row) * sg.row_bytes;
    float acc[NT];
    few_float_part<NT>(sg, w, 0, sg.n, nt, acc);
    warp_sum_n<NT>(acc);
#pragma unroll
    for (uint32_t t = 0; t < NT; t++)
        if ((threadIdx.x & 31) == 0 && t < nt) sg.out[(size_t)t * sg.outs + row] = acc[t];
}

template <uint32_t NT>
static __device__ __forceinline__ void few_split_row(const gemv_seg &sg, uint32_t row, uint32_t nt) {
    __shared__ float part[NT][GEMV_WARPS];
    unsigned warp = threadIdx.x / 32;
    gemv_part pt = gemv_part_of(sg, row, warp);
    float acc[NT];
    few_float_part<NT>(sg, pt.w, pt.e0, pt.len, nt, acc);
    warp_sum_n<NT>(acc);
#pragma unroll
    for (uint32_t t = 0; t < NT; t++)
        if ((threadIdx.x & 31) == 0) part[t][warp] = acc[t];
    __syncthreads();
    if (threadIdx.x < nt) {
        float v = 0.0f;
        for (int k = 0; k < GEMV_WARPS; k++) v += part[threadIdx.x][k];
        sg.out[(size_t)threadIdx.x * sg.outs + row] = v;
    }
}

/* A pass of more than CU_FEW_T tokens goes in chunks of NT (the last may
 * have fewer), chunk c the blocks x with x % chunks == c: the blocks of a
 * row's chunks are scheduled side by side, so that one of them reads the
 * row from DRAM and the others find it in the L2. */
template <uint32_t NT>
static __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_few_kernel(gemv_plan p) {
    dev_pdl_enter();
    uint32_t chunks = (p.T + NT - 1) / NT, c = blockIdx.x % chunks, bx = blockIdx.x / chunks;
    uint32_t s = 0;
    while (s + 1 < p.n_seg && bx >= p.seg[s + 1].block0) s++;
    const gemv_seg sg = gemv_seg_token(p.seg[s], c * NT);
    uint32_t nt = min(NT, p.T - c * NT);
    if (sg.split > 1) {
        few_split_row<NT>(sg, bx - sg.block0, nt);
        return;
    }
    uint32_t row = ((bx - sg.block0) * GEMV_WARPS + threadIdx.x / 32) * sg.rpw;
    if (row >= sg.rows) return;
    if (sg.type == DS4_TYPE_Q8_0) few_q8_rows<NT>(sg, row, nt);
    else few_float_row<NT>(sg, row, nt);
}

/* The products of a decode step that closes a ratio-4 compressor window
 * (cuda_forward.cu): the window's CU_WIN_T inputs against the float rows
 * of the compressor's and the indexer's projections, each row read once
 * for all of them.  The layout of a split float row of the gemv (a block
 * per CU_WIN_ROWS rows, warp w the w-th of GEMV_WARPS equal parts of each
 * row, the parts' sums added in warp order), so that every token's
 * outputs have the bits a one-token product would give it.  The weights
 * are loaded before the PDL wait, as the gemv's.  Of eight shapes measured
 * (74ad433, docs/PERFORMANCE.md), four rows a block, one 16-byte
 * chunk of each a round, four blocks an SM decoded fastest: 202.92 t/s at
 * 4k, against 202.09 with two chunks a round at 89 registers (two blocks
 * an SM) and 202.15 with a row a block (more loads of the activations). */
#define WIN_U          1 /* 16-byte chunks of a row a lane loads at once */
#define WIN_MIN_BLOCKS 4 /* blocks an SM: at most 64 registers a thread */
static __global__ void __launch_bounds__(GEMV_WARPS * 32, WIN_MIN_BLOCKS) gemv_window_kernel(cu_win_plan p) {
    dev_pdl_launch_next();
    __shared__ float part[CU_WIN_ROWS * CU_WIN_T][GEMV_WARPS];
    uint32_t s = 0;
    while (s + 1 < p.n_seg && blockIdx.x >= p.seg[s + 1].block0) s++;
    const cu_win_seg &sg = p.seg[s];
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    uint32_t r0 = (blockIdx.x - sg.block0) * CU_WIN_ROWS, len = p.n / GEMV_WARPS, e0 = warp * len;
    uint32_t per = sg.type == DS4_TYPE_F32 ? 4 : 8, esz = sg.type == DS4_TYPE_F32 ? 4 : 2;
    const uint8_t *rows[CU_WIN_ROWS];
#pragma unroll
    for (int r = 0; r < CU_WIN_ROWS; r++) {
        uint32_t row = r0 + r < sg.rows ? r0 + r : sg.rows - 1; /* loads stay in bounds */
        rows[r] = sg.w + (size_t)row * sg.row_bytes + (size_t)e0 * esz;
    }
    float acc[CU_WIN_ROWS][CU_WIN_T];
#pragma unroll
    for (int r = 0; r < CU_WIN_ROWS; r++)
#pragma unroll
        for (int t = 0; t < CU_WIN_T; t++) acc[r][t] = 0.0f;
    for (uint32_t base = 0; base < len; base += 32 * per * WIN_U) {
        int4 w[WIN_U][CU_WIN_ROWS];
#pragma unroll
        for (int u = 0; u < WIN_U; u++) {
            uint32_t e = base + 32 * per * u + per * lane;
#pragma unroll
            for (int r = 0; r < CU_WIN_ROWS; r++)
                w[u][r] = e < len ? ldw16(rows[r] + (size_t)e * esz) : make_int4(0, 0, 0, 0);
        }
        if (base == 0) dev_pdl_wait_prev();
#pragma unroll
        for (int u = 0; u < WIN_U; u++) {
            uint32_t e = base + 32 * per * u + per * lane;
            if (e >= len) continue;
#pragma unroll
            for (int t = 0; t < CU_WIN_T; t++) {
                float xv[8];
                float_x8(p.x[t] + e0, e, per, xv);
#pragma unroll
                for (int r = 0; r < CU_WIN_ROWS; r++) acc[r][t] += float_dot8(w[u][r], sg.type, xv);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < CU_WIN_ROWS; r++)
#pragma unroll
        for (int t = 0; t < CU_WIN_T; t++) {
            float v = warp_sum(acc[r][t]);
            if (lane == 0) part[r * CU_WIN_T + t][warp] = v;
        }
    __syncthreads();
    if (threadIdx.x >= CU_WIN_ROWS * CU_WIN_T) return;
    uint32_t r = threadIdx.x / CU_WIN_T, t = threadIdx.x % CU_WIN_T;
    if (r0 + r >= sg.rows) return;
    float v = 0.0f;
    for (int k = 0; k < GEMV_WARPS; k++) v += part[threadIdx.x][k];
    sg.out[(size_t)t * sg.out_stride + r0 + r] = v;
}

int cu_win_add(cu_win_plan *p, const dwt *W, uint32_t rows, float *out, size_t out_stride, ds4_err *err) {
    if (!cu_win_fits(W) || rows > W->rows || p->n_seg == CU_WIN_SEGS || (p->n_seg && W->n != p->n))
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a window product of %u rows of type %u, %u values", rows,
                           W->type, W->n);
    cu_win_seg *s = &p->seg[p->n_seg++];
    s->w = W->p;
    s->type = W->type;
    s->rows = rows;
    s->row_bytes = W->row_bytes;
    s->out = out;
    s->out_stride = out_stride;
    s->block0 = p->n_blocks;
    p->n = W->n;
    p->n_blocks += (rows + CU_WIN_ROWS - 1) / CU_WIN_ROWS;
    return 0;
}

int cu_win_run(const cu_win_plan *p, cudaStream_t st, ds4_err *err) {
    if (p->n_blocks == 0) return 0;
    DS4_LAUNCH(gemv_window_kernel, p->n_blocks, GEMV_WARPS * 32, 0, st, *p);
    CU_LAUNCHED();
    return 0;
}

/* The streamed launch of the routed experts' down product (Q2_K: plans
 * whose segments are all Q2_K rows of one length, four rows a warp, equal
 * and whole; cu_gemv_streamed decides).  One wave of blocks
 * (GEMV_STREAM_PER_SM an SM), each striding over the plan's blocks; a warp
 * walks its units (four rows) in stages of two rows and 8 of their
 * 256-blocks and loads the next stage - of the same unit or the next -
 * before it works on the one it holds.  A block a unit would have its
 * warps load their rows at once and then only compute, the DRAM idle
 * while the SMs decode.  gemv_probe: 9.38 -> 8.35 us for the six experts
 * of a decode step; the same for IQ2_XXS gate / up measured slower (15.6
 * against 14.1 us: its decode is bound by its instructions, which the
 * walk adds to), so they keep a block a unit (098be36). */
#define GEMV_STREAM_PER_SM 3
#define GEMV_STREAM_R      2 /* rows a stage: four in each of two stages would not fit three blocks' registers */

/* Where a warp of a streamed launch is: plan block vb (segment s, block
 * rb of it; w0 the unit's first row), the unit's two-row part and its
 * step of 8 blocks. */
struct stream_pos {
    const uint8_t *w0;
    uint32_t vb, s, rb, part, t;
    bool host; /* the segment's expert is on the host (cuda_offload.h): slot 0 is walked, nothing written */
};
static __device__ __forceinline__ void stream_at(stream_pos &ps, const gemv_plan &p, uint32_t vb, uint32_t seg_blocks) {
    ps.vb = vb;
    ps.s = vb / seg_blocks;
    ps.rb = vb - ps.s * seg_blocks;
    ps.part = ps.t = 0;
    const gemv_seg &sg = p.seg[ps.s];
    int m = sg.sel ? sg.sel[sg.sel_slot] - sg.sel_lo : (int)sg.mat;
    ps.host = m < 0 || (sg.sel && (uint32_t)m >= sg.sel_n);
    uint32_t mat = ps.host ? 0 : (uint32_t)m;
    uint32_t r0 = (ps.rb * GEMV_WARPS + threadIdx.x / 32) * 4;
    ps.w0 = sg.w + mat * sg.mat_bytes + (size_t)(sg.row0 + r0) * sg.row_bytes;
}
/* The stage after ps; false past the warp's last. */
static __device__ __forceinline__ bool stream_next(stream_pos &ps, const gemv_plan &p, uint32_t seg_blocks,
                                                   uint32_t steps) {
    if (++ps.t < steps) return true;
    ps.t = 0;
    if (++ps.part < 4 / GEMV_STREAM_R) return true;
    if (ps.vb + gridDim.x >= p.n_blocks) return false;
    stream_at(ps, p, ps.vb + gridDim.x, seg_blocks);
    return true;
}
/* The first row of ps's part in its segment. */
static __device__ __forceinline__ uint32_t stream_row0(const stream_pos &ps) {
    return (ps.rb * GEMV_WARPS + threadIdx.x / 32) * 4 + GEMV_STREAM_R * ps.part;
}
static __device__ __forceinline__ void stream_load(q2k_stage<GEMV_STREAM_R> &st, const gemv_plan &p,
                                                   const stream_pos &ps, uint32_t nb) {
    size_t rb = p.seg[0].row_bytes; /* every segment's (cu_gemv_streamed) */
    const uint8_t *rows[GEMV_STREAM_R];
#pragma unroll
    for (int r = 0; r < GEMV_STREAM_R; r++) rows[r] = ps.w0 + (GEMV_STREAM_R * ps.part + r) * rb;
    q2k_load<GEMV_STREAM_R>(st, rows, nb, ps.t);
}
/* Works on ps's stage; at a part's last step, its sums go out. */
static __device__ __forceinline__ void stream_dot(const q2k_stage<GEMV_STREAM_R> &st, const gemv_plan &p,
                                                  const stream_pos &ps, uint32_t nb, uint32_t steps, float *acc) {
    const gemv_seg &sg = p.seg[ps.s];
    q2k_dot<GEMV_STREAM_R>(st, sg.xq, sg.xd, sg.xb, nb, ps.t, acc);
    if (ps.t + 1 < steps) return;
    uint32_t r0 = stream_row0(ps);
#pragma unroll
    for (int r = 0; r < GEMV_STREAM_R; r++) {
        float v = warp_sum(acc[r]);
        if ((threadIdx.x & 31) == 0 && !ps.host) sg.out[r0 + r] = v;
        acc[r] = 0.0f;
    }
}

/* Two stage buffers in turn (no copies between them): each is loaded one
 * stage ahead of its use. */
static __global__ void __launch_bounds__(GEMV_WARPS * 32, GEMV_STREAM_PER_SM)
    gemv_stream_kernel(gemv_plan p, uint32_t seg_blocks) {
    dev_pdl_launch_next();
    dev_pdl_wait_prev(); /* the routing picks the rows; the activations come from the launch before */
    uint32_t nb = p.seg[0].n / 256, steps = (nb + 7) / 8;
    stream_pos a, b;
    stream_at(a, p, blockIdx.x, seg_blocks);
    q2k_stage<GEMV_STREAM_R> sa, sb;
    stream_load(sa, p, a, nb);
    float acc[GEMV_STREAM_R];
#pragma unroll
    for (int r = 0; r < GEMV_STREAM_R; r++) acc[r] = 0.0f;
    for (;;) {
        b = a;
        bool more = stream_next(b, p, seg_blocks, steps);
        if (more) stream_load(sb, p, b, nb);
        stream_dot(sa, p, a, nb, steps, acc);
        if (!more) break;
        a = b;
        more = stream_next(a, p, seg_blocks, steps);
        if (more) stream_load(sa, p, a, nb);
        stream_dot(sb, p, b, nb, steps, acc);
        if (!more) break;
    }
}

static uint32_t stream_blocks; /* cu_gemv_set_stream */
void cu_gemv_set_stream(uint32_t blocks) { stream_blocks = blocks; }

/* What the products keep of each GPU (the thread's current one's:
 * cu_current_device): the IQ2_XXS selector tables in its memory, its
 * multiprocessors (gemm_f_split), whether the int8 kernels may take their
 * shared memory there (gemm_q_init).  A thread a GPU sets them up (a
 * pipeline over the GPUs of a host), so no two threads share an entry. */
typedef struct mm_device {
    uint32_t *iq2_tab;
    uint32_t n_sms;
    bool gemm_q_ready;
} mm_device;
static mm_device mm_devices[CU_MAX_DEVICES];
static mm_device *mm_here() { return &mm_devices[cu_current_device()]; }

/* The selector tables of iq2_group from the codebook and the sign bytes
 * (format/quants.h). */
static void iq2_make_tab(uint32_t *tab) {
    for (uint32_t i = 0; i < IQ2_LEVELS; i++) {
        uint32_t w = 0;
        for (int k = 0; k < 8; k++) {
            uint32_t v = (uint32_t)(ds4_iq2xxs_grid[i] >> (8 * k)) & 255;
            w |= (v == 8 ? 0u : v == 25 ? 1u : 2u) << (4 * k);
        }
        tab[i] = w;
    }
    for (uint32_t s7 = 0; s7 < IQ2_SIGNS; s7++) {
        uint32_t sb = ds4_iq2_sign_byte(s7), w = 0;
        for (int k = 0; k < 8; k++) w |= ((sb >> k) & 1) << (4 * k + 2);
        tab[IQ2_LEVELS + s7] = w;
    }
    tab[IQ2_TAB - 2] = tab[IQ2_TAB - 1] = IQ2_POS;
}

int cu_matmul_init(ds4_err *err) {
    mm_device *m = mm_here();
    if (m->iq2_tab) return 0;
    cudaDeviceProp prop;
    CU_TRY(cudaGetDeviceProperties(&prop, cu_current_device()));
    m->n_sms = (uint32_t)prop.multiProcessorCount;
    uint32_t tab[IQ2_TAB];
    iq2_make_tab(tab);
    CU_TRY(cudaMalloc(&m->iq2_tab, sizeof(tab)));
    CU_TRY(cu_upload(m->iq2_tab, tab, sizeof(tab)));
    return 0;
}

/* Rows per warp: enough bytes in flight per lane for short rows.  Four
 * short K-quant rows (the routed down product's 672-byte Q2_K rows) in one
 * round rather than two: a warp's fixed work (its segment, selection and
 * row addresses, the sums and stores) then serves twice the bytes, and the
 * launch has half the blocks - 2.6 % faster decode with the segment
 * division (bc54dcb); the K-quant kernels
 * run at three blocks an SM, whose registers hold the four rows. */
static uint32_t pick_rpw(const dwt *W) {
    size_t qbytes = W->row_bytes;
    if (qbytes <= 1024) return 4;
    if (qbytes <= 2560)
        return W->type == DS4_TYPE_IQ2_XXS ? 4 : 2; /* its block copies the IQ2_XXS tables first: more rows */
    return 1;
}

/* Float products of at most GEMV_SPLIT_ROWS rows (router, compressor,
 * indexer weights) take a block a row: a warp a row would leave most SMs
 * idle and walk each row in dependent rounds.  Rows must split into
 * whole 16-byte loads per warp. */
#define GEMV_SPLIT_ROWS 1024
static bool split_rows(const dwt *W, const int *sel, uint32_t rows) {
    return cu_act_form(W->type) == ACT_F && !sel && rows <= GEMV_SPLIT_ROWS && W->n % (8 * GEMV_WARPS) == 0;
}

void cu_gemv_tokens(gemv_plan *p, uint32_t T) {
    memset(p, 0, sizeof(*p));
    p->T = T;
}
void cu_gemv_reps(gemv_plan *p, uint32_t reps) {
    memset(p, 0, sizeof(*p));
    p->reps = reps;
}

bool cu_gemv_few_fits(const dwt *W) {
    bool fl = W->type == DS4_TYPE_F32 || W->type == DS4_TYPE_F16 || W->type == DS4_TYPE_BF16;
    return (W->type == DS4_TYPE_Q8_0 || fl) && ((uintptr_t)W->p | W->row_bytes) % 16 == 0;
}

void cu_gemv_add(gemv_plan *p, const dwt *W, uint32_t mat, const int *sel, uint32_t slot, uint32_t row0, uint32_t rows,
                 const dact *x, uint32_t act_off, float *out) {
    gemv_tok one = {1, rows, 0, 0};
    cu_gemv_add_tok(p, W, mat, sel, slot, row0, rows, x, act_off, out, one);
}

void cu_gemv_add_tok(gemv_plan *p, const dwt *W, uint32_t mat, const int *sel, uint32_t slot, uint32_t row0,
                     uint32_t rows, const dact *x, uint32_t act_off, float *out, gemv_tok tk) {
    gemv_seg *s = &p->seg[p->n_seg++];
    s->w = W->p;
    s->type = W->type;
    s->n = W->n;
    s->rows = rows;
    s->row_bytes = W->row_bytes;
    s->mat_bytes = W->row_bytes * W->rows;
    s->mat = mat;
    s->sel = sel;
    s->sel_slot = slot;
    s->sel_lo = 0;
    s->sel_n = UINT32_MAX;
    s->row0 = row0;
    cu_act_ptrs(x, W->type, 0, act_off, &s->xf, &s->xq, &s->xd, &s->xb);
    s->out = out;
    unsigned form = cu_act_form(W->type);
    s->xqs = tk.x_rows * (uint32_t)(form == ACT_Q8 ? x->q8s : form == ACT_QK ? x->qks : 0);
    s->xfs = tk.x_rows * (uint32_t)x->fs;
    s->outs = tk.out_stride;
    s->sel_step = tk.sel_step;
    s->x_div = tk.x_div;
    /* a few tokens: a warp holds the sums of FEW_R Q8_0 rows or a float row */
    s->rpw = p->T > 1 ? (W->type == DS4_TYPE_Q8_0 ? FEW_R : 1) : pick_rpw(W);
    s->split = split_rows(W, sel, rows) ? GEMV_WARPS : 1;
    s->block0 = p->n_blocks;
    p->n_blocks += s->split > 1 ? rows : (rows + GEMV_WARPS * s->rpw - 1) / (GEMV_WARPS * s->rpw);
}

void cu_gemv_sel_range(gemv_plan *p, int32_t lo, uint32_t n) {
    p->seg[p->n_seg - 1].sel_lo = lo;
    p->seg[p->n_seg - 1].sel_n = n;
}

static_assert(32 % GEMV_WARPS == 0, "a block of the quantized output makes 32 rows");
void cu_gemv_add_q8(gemv_plan *p, const dwt *W, uint32_t row0, uint32_t rows, const dact *x, uint32_t act_off,
                    float *out, const dact *q, uint32_t q_off) {
    cu_gemv_add(p, W, 0, NULL, 0, row0, rows, x, act_off, out);
    gemv_seg *s = &p->seg[p->n_seg - 1];
    s->q8 = q->q8;
    s->q8_n = q->n;
    s->q8_off = q_off;
    s->rpw = 32 / GEMV_WARPS;
    s->split = 1;
    p->n_blocks = s->block0 + rows / 32;
}

/* Float rows are read 16 bytes at a time: whole vectors only. */
static int check_float_row(uint32_t type, uint32_t n, ds4_err *err) {
    if ((type == DS4_TYPE_F32 && n % 4) || ((type == DS4_TYPE_F16 || type == DS4_TYPE_BF16) && n % 8))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "CUDA backend: float matrix rows of %u values (type %u)", n, type);
    return 0;
}

uint32_t cu_gemv_seg_blocks(const gemv_plan *p) {
    if (p->n_seg == 0) return 0;
    uint32_t per = p->n_blocks / p->n_seg;
    if (per * p->n_seg != p->n_blocks) return 0;
    for (uint32_t i = 0; i < p->n_seg; i++)
        if (p->seg[i].block0 != i * per) return 0;
    return per;
}

bool cu_gemv_streamed(const gemv_plan *p) {
    if (p->n_seg == 0 || !cu_gemv_seg_blocks(p)) return false;
    for (uint32_t i = 0; i < p->n_seg; i++) {
        const gemv_seg &sg = p->seg[i];
        /* the mapped tier's matrices are host memory (cuda_offload.h): the
         * walk reads a skipped slot's rows, over PCIe there (the down
         * products of a decode step's mapped experts at 21 GB/s where the
         * block-a-unit launch skipping them reads 34, H100) */
        if (sg.sel_lo != 0) return false;
        if (sg.type != DS4_TYPE_Q2_K || sg.n != p->seg[0].n || sg.row_bytes != p->seg[0].row_bytes || sg.rpw != 4 ||
            sg.split != 1 || sg.rows % (4 * GEMV_WARPS))
            return false;
    }
    return true;
}

/* A plan of a few tokens: dense Q8_0 and float rows alone (gemv_few_kernel). */
static int gemv_run_few(const gemv_plan *p, uint32_t mask, cudaStream_t st, ds4_err *err) {
    if (p->T > CU_FEW_PASS || p->route.count || (mask | GM_LIGHT) != GM_LIGHT)
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a plan of %u tokens of other than dense Q8_0 or float rows",
                           p->T);
    for (uint32_t i = 0; i < p->n_seg; i++) {
        const gemv_seg &sg = p->seg[i];
        bool aligned = (((uintptr_t)sg.w | sg.row_bytes | sg.xqs | (uintptr_t)sg.xq) % 16 == 0) &&
                       ((uintptr_t)sg.xf | sg.xfs * sizeof(float)) % 16 == 0;
        if (sg.sel || !aligned)
            return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a %u-row product of %u tokens %s", sg.rows, p->T,
                               sg.sel ? "of selected matrices" : "not 16-byte aligned");
    }
    static_assert(CU_FEW_T == 8, "a kernel for each token count of a chunk");
    unsigned threads = GEMV_WARPS * 32;
    /* equal chunks of at most CU_FEW_T: 12 tokens are two of 6, not 8 and 4 */
    uint32_t chunks = (p->T + CU_FEW_T - 1) / CU_FEW_T, nt = (p->T + chunks - 1) / chunks;
    uint32_t grid = p->n_blocks * chunks;
    switch (nt) {
    case 2: DS4_LAUNCH(gemv_few_kernel<2>, grid, threads, 0, st, *p); break;
    case 3: DS4_LAUNCH(gemv_few_kernel<3>, grid, threads, 0, st, *p); break;
    case 4: DS4_LAUNCH(gemv_few_kernel<4>, grid, threads, 0, st, *p); break;
    case 5: DS4_LAUNCH(gemv_few_kernel<5>, grid, threads, 0, st, *p); break;
    case 6: DS4_LAUNCH(gemv_few_kernel<6>, grid, threads, 0, st, *p); break;
    case 7: DS4_LAUNCH(gemv_few_kernel<7>, grid, threads, 0, st, *p); break;
    default: DS4_LAUNCH(gemv_few_kernel<8>, grid, threads, 0, st, *p); break;
    }
    CU_LAUNCHED();
    return 0;
}

int cu_gemv_run(const gemv_plan *p, cudaStream_t st, ds4_err *err) {
    if (p->n_blocks == 0) return 0;
    uint32_t mask = 0;
    for (uint32_t i = 0; i < p->n_seg; i++) {
        const gemv_seg &sg = p->seg[i];
        if (check_float_row(sg.type, sg.n, err)) return -1;
        if (cu_act_form(sg.type) == ACT_F ? !sg.xf : !sg.xq)
            return ds4_err_set(err, DS4_EINVAL,
                               "CUDA backend: a %u-row %s product of an activation without the form it reads", sg.rows,
                               ds4_type_get(sg.type)->name);
        if (sg.q8 && (sg.type != DS4_TYPE_Q8_0 || sg.rows % 32 || sg.q8_off % 32 || sg.q8_off + sg.rows > sg.q8_n))
            return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a quantized product output of %u rows at %u (type %u)",
                               sg.rows, sg.q8_off, sg.type);
        mask |= sg.q8 ? (uint32_t)GM_Q8OUT : gemv_type_bit(sg.type);
    }
    if (p->route.count && !cu_gemv_can_route(p, p->route.in.n_expert, p->route.in.k))
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a product that routes must be one router of a block a row");
    if (cu_matmul_init(err)) return -1;
    const uint32_t *tab = mm_here()->iq2_tab;
    unsigned threads = GEMV_WARPS * 32;
    uint32_t seg_blocks = cu_gemv_seg_blocks(p);
    if (p->T > 1) return gemv_run_few(p, mask, st, err);
    if (p->reps > 1) {
        if (p->route.count || (mask & GM_Q8OUT))
            return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a plan of %u tokens that routes or quantizes", p->reps);
        dim3 grid(p->n_blocks, p->reps);
        size_t smem = mask & GM_IQ2_XXS ? IQ2_REP_BYTES : 0;
        if (mask == GM_IQ2_XXS) {
            if (cu_allow_smem<gemv_kernel<GM_IQ2_XXS | GM_REPS>>(smem, err)) return -1;
            DS4_LAUNCH(gemv_kernel<GM_IQ2_XXS | GM_REPS>, grid, threads, smem, st, *p, tab, seg_blocks);
        } else {
            if (cu_allow_smem<gemv_kernel<GM_ALL | GM_REPS>>(smem, err)) return -1;
            DS4_LAUNCH(gemv_kernel<GM_ALL | GM_REPS>, grid, threads, smem, st, *p, tab, seg_blocks);
        }
        CU_LAUNCHED();
        return 0;
    }
    if (cu_gemv_streamed(p)) {
        uint32_t grid = stream_blocks ? stream_blocks : GEMV_STREAM_PER_SM * mm_here()->n_sms;
        if (grid > p->n_blocks) grid = p->n_blocks;
        DS4_LAUNCH(gemv_stream_kernel, grid, threads, 0, st, *p, seg_blocks);
    } else if (mask & GM_Q8OUT) {
        if (mask != GM_Q8OUT)
            return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a product quantizing its outputs mixed with others");
        DS4_LAUNCH(gemv_kernel<GM_Q8OUT | GM_Q8_0>, p->n_blocks, threads, 0, st, *p, tab, seg_blocks);
    } else if (p->route.count && p->route.in.n_expert > GEMV_ROUTE_MAX_EXPERTS) {
        if ((mask | GM_LIGHT) != GM_LIGHT)
            return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a routing router product of quantized rows");
        DS4_LAUNCH(gemv_kernel<GM_LIGHT | GM_ROUTE_WIDE>, p->n_blocks, threads, 0, st, *p, tab, seg_blocks);
    } else if ((mask | GM_LIGHT) == GM_LIGHT)
        DS4_LAUNCH(gemv_kernel<GM_LIGHT>, p->n_blocks, threads, 0, st, *p, tab, seg_blocks);
    else if ((mask | GM_LIGHT) == (GM_LIGHT | GM_Q2_K))
        DS4_LAUNCH(gemv_kernel<GM_LIGHT | GM_Q2_K>, p->n_blocks, threads, 0, st, *p, tab, seg_blocks);
    else if ((mask | GM_LIGHT) == (GM_LIGHT | GM_Q4_K))
        DS4_LAUNCH(gemv_kernel<GM_LIGHT | GM_Q4_K>, p->n_blocks, threads, 0, st, *p, tab, seg_blocks);
    else if (mask == GM_IQ2_XXS) {
        if (cu_allow_smem<gemv_kernel<GM_IQ2_XXS>>(IQ2_REP_BYTES, err)) return -1;
        DS4_LAUNCH(gemv_kernel<GM_IQ2_XXS>, p->n_blocks, threads, IQ2_REP_BYTES, st, *p, tab, seg_blocks);
    } else {
        size_t smem = mask & GM_IQ2_XXS ? IQ2_REP_BYTES : 0;
        if (cu_allow_smem<gemv_kernel<GM_ALL>>(smem, err)) return -1;
        DS4_LAUNCH(gemv_kernel<GM_ALL>, p->n_blocks, threads, smem, st, *p, tab, seg_blocks);
    }
    CU_LAUNCHED();
    return 0;
}

/* ------------------------------------------------------------- gemm */

#define BM       64  /* float kernel: weight rows per block */
#define BN       64  /* tokens per block (both kernels; the expert grouping's tile width) */
#define QBM      128 /* int8 kernel: weight rows per block */
#define KC       256 /* int8 kernel: K per chunk (one K-quant super-block) */
#define QTHREADS 256

typedef struct gemm_args {
    const uint8_t *w;
    uint32_t type, n, rows, row0, mat;
    size_t row_bytes, mat_bytes;
    const int8_t *xq;  /* token 0's quantized values (offset applied) */
    const float *xd;   /* its block scales */
    const int16_t *xb; /* its Q8_K block sums */
    size_t xqs;        /* bytes from one token's row to the next */
    const float *xf;
    size_t xfs;
    uint32_t T;
    float *out;
    size_t out_stride;
    cu_group grp;
    bool grouped;
    /* float kernel split over K (gemm_f_split): block z takes the values
     * [z kper, (z + 1) kper) and writes its partial sums to slice z of part
     * (split x T x rows); gemm_f_join_kernel adds them in split order */
    uint32_t kper, split;
    float *part;
} gemm_args;

/* Which activation rows a block works on and where its outputs go. */
/* Dense products put the token tiles on x, so that the blocks sharing a
 * tile of weight rows run together and read it once from DRAM (the
 * activations, a few MB, stay in the L2); grouped ones put the rows on x. */
static __device__ __forceinline__ uint32_t row_tile(const gemm_args &g) { return g.grouped ? blockIdx.x : blockIdx.y; }

static __device__ __forceinline__ bool tile_tokens(const gemm_args &g, int *mat, int *count, int *start) {
    if (!g.grouped) {
        *mat = (int)g.mat;
        *start = (int)(blockIdx.x * BN);
        *count = imin_d(BN, (int)g.T - *start);
        return *count > 0;
    }
    if ((int)blockIdx.y >= *g.grp.n_tiles) return false;
    *mat = g.grp.tile_mat[blockIdx.y];
    *start = g.grp.tile_start[blockIdx.y];
    *count = g.grp.tile_count[blockIdx.y];
    return true;
}
static __device__ __forceinline__ int act_row(const gemm_args &g, int i) {
    return g.grouped ? g.grp.perm[i] / (int)g.grp.act_div : i;
}
static __device__ __forceinline__ int out_row(const gemm_args &g, int i) { return g.grouped ? g.grp.perm[i] : i; }

/* One stage of the int8 kernel's shared memory: a chunk of KC values of
 * the block's weight rows and tokens as int8, rows of KC bytes whose
 * 16-byte pieces are swizzled (piece p of row r stored at p ^ (r % 8)), so
 * that the eight rows an ldmatrix phase reads fall on eight different
 * groups of four banks without padding; and the chunk's scales.  Two
 * stages: the next chunk is fetched while the current one is multiplied. */
typedef struct qstage {
    int8_t w[QBM * KC];
    int8_t x[BN * KC];
    union {
        struct {
            float wd[8 * QBM]; /* weight d per 32 of the chunk's 8 blocks, at q8w_at */
            float xd[8 * BN];  /* activation d per 32, at q8x_at */
        } q8;
        struct {
            int8_t wsc[QBM][8]; /* integer sub-scale per 32 (Q4_K, IQ2_XXS) */
            int8_t wm[QBM][16]; /* mins per 16 (Q2_K; Q4_K's per-32 min twice) */
            float2 wd[QBM];     /* d, dmin */
            float xd[BN];       /* Q8_K d */
            int16_t xb[BN][16]; /* Q8_K bsums */
        } k;
    } u;
} qstage;

/* Where the Q8_0 scales of block kk of weight row r and of token t go: the
 * four rows a thread's MMA results cover (r, r + 8, r + 16, r + 24 of its
 * warp's 32) side by side, and its eight tokens (two of each 8-token
 * tile), so that a step reads them in one and two 16-byte loads. */
static __device__ __forceinline__ unsigned q8w_at(unsigned kk, unsigned r) {
    return kk * QBM + r / 32 * 32 + r % 8 * 4 + r % 32 / 8;
}
static __device__ __forceinline__ unsigned q8x_at(unsigned kk, unsigned t) {
    return kk * BN + t / 32 * 32 + t % 8 / 2 * 8 + t % 32 / 8 * 2 + t % 2;
}

static __host__ __device__ __forceinline__ size_t gemm_q_smem(uint32_t type) {
    return 2 * sizeof(qstage) + (type == DS4_TYPE_IQ2_XXS ? IQ2_TAB * sizeof(uint32_t) : 0);
}

static __device__ __forceinline__ unsigned swz(unsigned row, unsigned piece) {
    return row * KC + ((piece ^ (row & 7)) << 4);
}
/* swz(row, piece + 2 kk) from off = swz(row, piece) with piece < 2: the
 * piece's bits above the lowest are kk's, which the swizzle only flips, so
 * one XOR moves a fragment's address to step kk (no address per step held
 * in registers, which the K-quant kernels had spilled). */
static __device__ __forceinline__ unsigned swz_step(unsigned off, unsigned kk) { return off ^ (kk << 5); }

/* Integer sums to float without the conversion unit (a quarter of the
 * rate of the float pipes): an accumulator that starts at the bits of
 * 1.5 * 2^23 and gains an integer s with |s| < 2^22 reads as the float
 * 1.5 * 2^23 + s exactly, and one exact subtraction leaves (float) s. */
#define MAGIC_BITS 0x4B400000
#define MAGIC_F    12582912.0f /* the float of MAGIC_BITS, 1.5 * 2^23 */
static __device__ __forceinline__ float magic_to_f(int bits) { return __int_as_float(bits) - MAGIC_F; }

static __device__ __forceinline__ void st_zero16(int8_t *p) { *(int4 *)p = make_int4(0, 0, 0, 0); }

/* The block's first byte of weight row r (of its tile), or NULL past the end. */
static __device__ __forceinline__ const uint8_t *w_row(const gemm_args &g, int mat, unsigned r) {
    uint32_t rt = row_tile(g) * QBM + r;
    if (rt >= g.rows) return NULL;
    return g.w + (size_t)mat * g.mat_bytes + (size_t)(g.row0 + rt) * g.row_bytes;
}

/* Q8_0 weights: the int8 bytes are copied verbatim (load_w_q8_async); the
 * chunk's f16 scales of row threadIdx.x (< QBM) are loaded into registers
 * (load_w_q8_scales, a chunk ahead), to be converted once (by
 * store_w_q8_scales) rather than in every product that uses them. */
static __device__ __forceinline__ void load_w_q8_async(const gemm_args &g, qstage &s, int mat, uint32_t k0,
                                                       uint32_t klen) {
    /* thread i copies piece i % 16 of rows i / 16 + 16 j: the rows' swizzle
     * is the same (16 j is a multiple of 8), so only the row moves */
    unsigned r = threadIdx.x / 16, piece = threadIdx.x % 16;
    int live = (int)g.rows - (int)(row_tile(g) * QBM + r); /* rows r + 16 j with 16 j < live exist */
    const uint8_t *src = live > 0 ? w_row(g, mat, r) + k0 + 16 * piece : NULL;
    size_t step = 16 * (size_t)g.row_bytes;
    int8_t *dst = s.w + swz(r, piece);
    bool in = piece * 16 < klen;
#pragma unroll 1
    for (int j = 0; j < QBM / 16; j++, src += step, dst += 16 * KC) {
        if (!in || 16 * j >= live) st_zero16(dst);
        else cp_async16(dst, src);
    }
}
static __device__ __forceinline__ uint4 load_w_q8_scales(const gemm_args &g, int mat, uint32_t k0) {
    if (threadIdx.x >= QBM) return make_uint4(0, 0, 0, 0);
    const uint8_t *rp = w_row(g, mat, threadIdx.x);
    /* the row's scale area is padded to 16 bytes: a whole chunk's eight fit */
    return rp ? __ldg((const uint4 *)(rp + g.n + k0 / 16)) : make_uint4(0, 0, 0, 0);
}
static __device__ __forceinline__ void store_w_q8_scales(qstage &s, uint4 sc) {
    if (threadIdx.x >= QBM) return;
    uint32_t w[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
    for (int k = 0; k < 8; k++) s.u.q8.wd[q8w_at(k, threadIdx.x)] = dev_f16((uint16_t)(w[k / 2] >> (16 * (k % 2))));
}

/* K-quant weights go through registers: the raw bytes of the next chunk
 * are loaded before the current chunk's products (so their latency is
 * hidden behind them) and expanded into shared memory after.  Thread i
 * owns row i / 2 and half i % 2 of its super-block: 8 pieces of 16. */
typedef struct wraw {
    int4 q[4];
    uint32_t s[3];
    uint32_t d;
    bool ok;
} wraw;

/* Chunk b's raw bytes of this thread's half row into w.  With them the L2
 * is asked for the row's quant bytes two chunks on, so that those loads, issued two chunks later, wait
 * for the L2 rather than the DRAM (the expert products, whose weights are
 * read once, gained 5 %; asking for the activations too, which the L2
 * holds already, measured slower). */
template <uint32_t TYPE>
static __device__ __forceinline__ void load_w_raw(const gemm_args &g, int mat, const uint8_t *wrp, uint32_t b,
                                                  wraw &w) {
    /* the row: held by the caller in wrp, or for Q4_K, whose raw words need
     * more registers, recomputed (held, it spilled 68 bytes against 42) */
    const uint8_t *rp = TYPE == DS4_TYPE_Q4_K ? w_row(g, mat, threadIdx.x / 2) : wrp;
    unsigned p = threadIdx.x & 1;
    uint32_t nb = g.n / 256;
    w.ok = rp != NULL;
    for (int i = 0; i < 4; i++) w.q[i] = make_int4(0, 0, 0, 0);
    w.s[0] = w.s[1] = w.s[2] = w.d = 0;
    if (!rp) return;
    uint32_t qb = TYPE == DS4_TYPE_Q4_K ? 128 : 64; /* quant bytes of a super-block: one or two lines */
    if (p == 0 && b + 2 < nb) prefetch_l2(rp + qb * (size_t)(b + 2));
    if (TYPE == DS4_TYPE_Q2_K) { /* half p: quant bytes 32 p.., sub-blocks 8 p..8 p + 7 */
        w.q[0] = ld16(rp + 64 * (size_t)b + 32 * p);
        w.q[1] = ld16(rp + 64 * (size_t)b + 32 * p + 16);
        uint2 sc = __ldg((const uint2 *)(rp + 64 * (size_t)nb + 16 * (size_t)b + 8 * p));
        w.s[0] = sc.x;
        w.s[1] = sc.y;
        w.d = __ldg((const uint32_t *)(rp + 80 * (size_t)nb + 4 * (size_t)b));
    } else if (TYPE == DS4_TYPE_Q4_K) { /* half p: quant bytes 64 p.., sub-blocks 4 p..4 p + 3 */
        for (int i = 0; i < 4; i++) w.q[i] = ld16(rp + 128 * (size_t)b + 64 * p + 16 * i);
        const uint32_t *sw = (const uint32_t *)(rp + 128 * (size_t)nb + 12 * (size_t)b);
        w.s[0] = __ldg(sw);
        w.s[1] = __ldg(sw + 1);
        w.s[2] = __ldg(sw + 2);
        w.d = __ldg((const uint32_t *)(rp + 140 * (size_t)nb + 4 * (size_t)b));
    } else { /* IQ2_XXS, half p: groups 4 p..4 p + 3 */
        w.q[0] = ld16(rp + 64 * (size_t)b + 32 * p);
        w.q[1] = ld16(rp + 64 * (size_t)b + 32 * p + 16);
        w.d = __ldg((const uint16_t *)(rp + 64 * (size_t)nb) + b);
    }
}

static __device__ __forceinline__ void st16(int8_t *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    *(uint4 *)p = make_uint4(a, b, c, d);
}

template <uint32_t TYPE>
static __device__ __forceinline__ void store_w_raw(qstage &s, const wraw &w, const uint32_t *tab) {
    unsigned r = threadIdx.x / 2, p = threadIdx.x & 1;
    if (!w.ok) {
        for (unsigned k = 0; k < 8; k++) st_zero16(s.w + swz(r, 8 * p + k));
        *(uint2 *)&s.u.k.wm[r][8 * p] = make_uint2(0, 0);
        *(uint32_t *)&s.u.k.wsc[r][4 * p] = 0;
        if (p == 0) s.u.k.wd[r] = make_float2(0.0f, 0.0f);
        return;
    }
    if (TYPE == DS4_TYPE_Q2_K) {
        /* sub-block 8 p + 2 j + e: bits 2 j of quant half e, times its 4-bit
         * scale (at most 45: no carry between bytes) */
#pragma unroll
        for (unsigned j = 0; j < 4; j++)
#pragma unroll
            for (unsigned e = 0; e < 2; e++) {
                unsigned k = 2 * j + e;
                uint32_t m = (w.s[k / 4] >> (8 * (k % 4))) & 15;
                int4 q = w.q[e];
                st16(s.w + swz(r, 8 * p + k), (((uint32_t)q.x >> (2 * j)) & 0x03030303u) * m,
                     (((uint32_t)q.y >> (2 * j)) & 0x03030303u) * m, (((uint32_t)q.z >> (2 * j)) & 0x03030303u) * m,
                     (((uint32_t)q.w >> (2 * j)) & 0x03030303u) * m);
            }
        *(uint2 *)&s.u.k.wm[r][8 * p] = make_uint2((w.s[0] >> 4) & 0x0F0F0F0Fu, (w.s[1] >> 4) & 0x0F0F0F0Fu);
    } else if (TYPE == DS4_TYPE_Q4_K) {
        /* sub-block j = 4 p + jj: nibble jj % 2 of the 32 bytes jj / 2 */
        uint32_t sc4 = 0, m8[2] = {0, 0};
#pragma unroll
        for (unsigned jj = 0; jj < 4; jj++) {
            unsigned j = 4 * p + jj, shift = 4 * (jj & 1);
#pragma unroll
            for (unsigned e = 0; e < 2; e++) {
                int4 q = w.q[2 * (jj / 2) + e];
                st16(s.w + swz(r, 2 * j + e), ((uint32_t)q.x >> shift) & 0x0F0F0F0Fu,
                     ((uint32_t)q.y >> shift) & 0x0F0F0F0Fu, ((uint32_t)q.z >> shift) & 0x0F0F0F0Fu,
                     ((uint32_t)q.w >> shift) & 0x0F0F0F0Fu);
            }
            int sc, m;
            q4k_scale_min(w.s[0], w.s[1], w.s[2], j, &sc, &m);
            sc4 |= (uint32_t)sc << (8 * jj);
            m8[jj / 2] |= ((uint32_t)m | (uint32_t)m << 8) << (16 * (jj % 2));
        }
        *(uint32_t *)&s.u.k.wsc[r][4 * p] = sc4;
        *(uint2 *)&s.u.k.wm[r][8 * p] = make_uint2(m8[0], m8[1]);
    } else {
        uint32_t sc4 = 0;
#pragma unroll
        for (unsigned k = 0; k < 4; k++) {
            int4 q = w.q[k / 2];
            uint32_t gw0 = (uint32_t)(k & 1 ? q.z : q.x), gw1 = (uint32_t)(k & 1 ? q.w : q.y);
            uint32_t v[8];
            iq2_group(tab, iq2_pos(tab), gw0, gw1, v);
            unsigned ib = 4 * p + k;
            st16(s.w + swz(r, 2 * ib), v[0], v[1], v[2], v[3]);
            st16(s.w + swz(r, 2 * ib + 1), v[4], v[5], v[6], v[7]);
            sc4 |= (2 * (gw1 >> 28) + 1) << (8 * k);
        }
        *(uint32_t *)&s.u.k.wsc[r][4 * p] = sc4;
    }
    if (p == 0) s.u.k.wd[r] = make_float2(dev_f16((uint16_t)w.d), dev_f16((uint16_t)(w.d >> 16)));
}

/* The chunk's activations: int8 bytes (zeros past the tile's tokens or the
 * row's end) and scales, all by asynchronous copies.  Thread i copies for
 * token i / 4 of the tile, whose activation row starts xo bytes into the
 * launch's (live: the token exists): pieces i % 4 + 4 j of 16 bytes.  One
 * row offset a thread, held in a register, rather than an offset a copy
 * read from shared memory. */
template <uint32_t TYPE>
static __device__ __forceinline__ void load_x_async(const gemm_args &g, qstage &s, size_t xo, bool live, uint32_t k0,
                                                    uint32_t klen) {
    unsigned t = threadIdx.x / 4, q = threadIdx.x % 4;
    static_assert(BN * 4 == QTHREADS, "four threads a token");
    const uint8_t *src = (const uint8_t *)g.xq + xo + k0 + 16 * q;
    /* piece q + 4 j = q | 4 j lands at (q ^ (t % 8)) ^ 4 j (swz) */
    unsigned sw = q ^ (t & 7);
#pragma unroll
    for (unsigned j = 0; j < 4; j++) {
        int8_t *dst = s.x + t * KC + ((sw ^ 4 * j) << 4);
        if (!live || (q + 4 * j) * 16 >= klen) st_zero16(dst);
        else cp_async16(dst, src + 64 * j);
    }
    if (!live) return;
    if (TYPE == DS4_TYPE_Q8_0) {
#pragma unroll
        for (unsigned kb = q; kb < 8; kb += 4)
            if (kb * 32 < klen) cp_async4(&s.u.q8.xd[q8x_at(kb, t)], (const uint8_t *)g.xd + xo + 4 * (k0 / 32 + kb));
    } else {
#pragma unroll
        for (unsigned h = q; h < 8; h += 4)
            cp_async4(&s.u.k.xb[t][2 * h], (const uint8_t *)g.xb + xo + 2 * (k0 / 16 + 2 * h));
        if (q == 0) cp_async4(&s.u.k.xd[t], (const uint8_t *)g.xd + xo + 4 * (k0 / 256));
    }
}

/* 128 weight rows x 64 tokens per block of 8 warps; warp (wm, wn) of the
 * 4 x 2 arrangement owns rows 32 wm.. and tokens 32 wn.. (2 x 4 mma tiles).
 * The integer sums per 32 (and per 256 for Q2_K) and every float step are
 * those of the CPU dot, in its order. */
/* A warp's results, MA x NB mma tiles of 16 rows x 8 tokens (the c layout
 * of mma_s8_16x8x32), to out: rows row0.. of the launch's rows, tokens
 * t0.. of the block's tokens (count of them from entry start), those inside
 * both. */
template <int MA, int NB>
static __device__ __forceinline__ void gemm_store(const gemm_args &g, float *out, size_t stride, uint32_t row0, int t0,
                                                  int count, int start, const float (&acc)[MA][NB][4]) {
    unsigned lane = threadIdx.x & 31, gq = lane / 4, tq = lane % 4;
#pragma unroll
    for (int a = 0; a < MA; a++)
#pragma unroll
        for (int b = 0; b < NB; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                uint32_t row = row0 + 16 * a + gq + (i >= 2 ? 8 : 0);
                int t = t0 + 8 * b + 2 * (int)tq + (i & 1);
                if (t < count && row < g.rows) out[(size_t)out_row(g, start + t) * stride + row] = acc[a][b][i];
            }
}

/* The A fragments of a warp's two 16-row tiles (f[0..7]) and the B
 * fragments of its four 8-token tiles (f[8..15], two words each) at step kk
 * of a chunk. */
static __device__ __forceinline__ void load_frags(const qstage &s, unsigned aoff, unsigned boff, uint32_t kk,
                                                  uint32_t f[16]) {
#pragma unroll
    for (int a = 0; a < 2; a++) ldmatrix_x4(f + 4 * a, s.w + swz_step(aoff, kk) + 16 * KC * a);
#pragma unroll
    for (int bb = 0; bb < 2; bb++) ldmatrix_x4(f + 8 + 4 * bb, s.x + swz_step(boff, kk) + 16 * KC * bb);
}

template <uint32_t TYPE>
static __global__ void __launch_bounds__(QTHREADS, 2) gemm_q_kernel(gemm_args g, const uint32_t *tab_g) {
    dev_pdl_enter();
    DS4_DYN_SMEM(qstage, st);
    int mat, count, start;
    if (!tile_tokens(g, &mat, &count, &start)) return;
    const bool kq = TYPE != DS4_TYPE_Q8_0;
    /* fragments a step ahead: only the Q2_K kernel has the registers (no
     * per-step sub-scales); Q8_0 measured slower with them at 128
     * registers, IQ2_XXS spills */
    constexpr bool PF = TYPE == DS4_TYPE_Q2_K;
    uint32_t *tab = (uint32_t *)(st + 2);
    bool xlive = (int)(threadIdx.x / 4) < count; /* this thread's token (load_x_async) */
    size_t xo = xlive ? (size_t)act_row(g, start + (int)(threadIdx.x / 4)) * g.xqs : 0;
    if (TYPE == DS4_TYPE_IQ2_XXS) dev_iq2_fill_tab(tab, tab_g); /* ends with a barrier */

    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, wm = warp & 3, wn = warp >> 2;
    unsigned gq = lane / 4, tq = lane % 4, lm = lane / 8, l8 = lane % 8;
    /* ldmatrix rows: A tiles (matrix lm: rows +8 (lm & 1), k +16 (lm >> 1)),
     * B tile pairs (matrix lm: tokens +8 (lm >> 1), k +16 (lm & 1)) */
    unsigned aoff = swz(32 * wm + l8 + 8 * (lm & 1), lm >> 1);
    unsigned boff = swz(32 * wn + l8 + 8 * (lm >> 1), lm & 1);

    float acc[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[a][b][i] = 0.0f;

    uint32_t nchunk = (g.n + KC - 1) / KC;
    wraw raw;
    uint4 wsc = make_uint4(0, 0, 0, 0);
    /* K-quants: this thread's raw weight row (see load_w_raw) */
    const uint8_t *wrp = kq && TYPE != DS4_TYPE_Q4_K ? w_row(g, mat, threadIdx.x / 2) : NULL;
    if (kq) {
        load_w_raw<TYPE>(g, mat, wrp, 0, raw);
        store_w_raw<TYPE>(st[0], raw, tab);
        if (nchunk > 1) load_w_raw<TYPE>(g, mat, wrp, 1, raw);
    } else {
        load_w_q8_async(g, st[0], mat, 0, imin_d((int)g.n, KC));
        store_w_q8_scales(st[0], load_w_q8_scales(g, mat, 0));
        if (nchunk > 1) wsc = load_w_q8_scales(g, mat, KC);
    }
    load_x_async<TYPE>(g, st[0], xo, xlive, 0, imin_d((int)g.n, KC));
    cp_async_commit();
    cp_async_wait_all();
    __syncthreads();

    for (uint32_t c = 0; c < nchunk; c++) {
        qstage &s = st[c & 1], &nx = st[(c + 1) & 1];
        uint32_t k0 = c * KC, klen = g.n - k0 < KC ? g.n - k0 : KC;
        bool more = c + 1 < nchunk;
        if (more) { /* stage c + 1 was last read before the barrier that ended chunk c - 1;
                     * its K-quant raw weights or Q8_0 scales are in registers already */
            uint32_t k1 = k0 + KC, klen1 = g.n - k1 < KC ? g.n - k1 : KC;
            if (!kq) load_w_q8_async(g, nx, mat, k1, klen1);
            load_x_async<TYPE>(g, nx, xo, xlive, k1, klen1);
            cp_async_commit();
        }

        int isum[2][4][4];
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int b = 0; b < 4; b++)
#pragma unroll
                for (int i = 0; i < 4; i++) isum[a][b][i] = TYPE == DS4_TYPE_Q2_K ? MAGIC_BITS : 0;
        uint32_t fr[2][16]; /* fragments of step kk in fr[kk % 2] (with PF, step kk + 1's loaded ahead) */
        load_frags(s, aoff, boff, 0, fr[0]);
#pragma unroll
        for (uint32_t kk = 0; kk < KC / 32; kk++) {
            if (32 * kk >= klen) break;
            if (!PF && kk > 0) load_frags(s, aoff, boff, kk, fr[kk & 1]);
            if (PF && kk + 1 < KC / 32 && 32 * (kk + 1) < klen) load_frags(s, aoff, boff, kk + 1, fr[(kk + 1) & 1]);
            const uint32_t(*af)[4] = (const uint32_t(*)[4])fr[kk & 1];
            const uint32_t(*bf)[2] = (const uint32_t(*)[2])(fr[kk & 1] + 8);
            if (TYPE == DS4_TYPE_Q2_K) { /* pre-scaled: the sums run across the chunk */
#pragma unroll
                for (int a = 0; a < 2; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) mma_s8_16x8x32(isum[a][b], af[a], bf[b]);
            } else if (kq) {
                int sc[2][2];
#pragma unroll
                for (int a = 0; a < 2; a++)
#pragma unroll
                    for (int h = 0; h < 2; h++) sc[a][h] = s.u.k.wsc[32 * wm + 16 * a + gq + 8 * h][kk];
#pragma unroll
                for (int a = 0; a < 2; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        int cc[4] = {0, 0, 0, 0};
                        mma_s8_16x8x32(cc, af[a], bf[b]);
#pragma unroll
                        for (int i = 0; i < 4; i++) isum[a][b][i] += sc[a][i >> 1] * cc[i];
                    }
            } else {
                /* Two float steps per result: u = w.d s, then acc += u x.d.  The
                 * magic number's subtraction rides in the first FMA: with f the
                 * accumulator's float (1.5 2^23 + s), fma(f, w.d, -1.5 2^23 w.d)
                 * rounds w.d s once, because 1.5 2^23 w.d is exact (w.d is an
                 * f16, 11 significant bits, times 3 2^22). */
                float ws[2][2], wc[2][2];
                float4 w4 = *(const float4 *)&s.u.q8.wd[q8w_at(kk, 32 * wm + gq)];
                ws[0][0] = w4.x, ws[0][1] = w4.y, ws[1][0] = w4.z, ws[1][1] = w4.w;
#pragma unroll
                for (int a = 0; a < 2; a++)
#pragma unroll
                    for (int h = 0; h < 2; h++) wc[a][h] = -MAGIC_F * ws[a][h];
                const float4 *x4 = (const float4 *)&s.u.q8.xd[q8x_at(kk, 32 * wn + 2 * tq)];
                float4 xa = x4[0], xb = x4[1];
                float2 xs[4] = {make_float2(xa.x, xa.y), make_float2(xa.z, xa.w), make_float2(xb.x, xb.y),
                                make_float2(xb.z, xb.w)};
#pragma unroll
                for (int a = 0; a < 2; a++)
#pragma unroll
                    for (int b = 0; b < 4; b++) {
                        /* a sum of 32 int8 products: |s| <= 2^19 */
                        int cc[4] = {MAGIC_BITS, MAGIC_BITS, MAGIC_BITS, MAGIC_BITS};
                        mma_s8_16x8x32(cc, af[a], bf[b]);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            float u = __fmaf_rn(__int_as_float(cc[i]), ws[a][i >> 1], wc[a][i >> 1]);
                            acc[a][b][i] = __fmaf_rn(u, i & 1 ? xs[b].y : xs[b].x, acc[a][b][i]);
                        }
                    }
            }
        }

        if (kq) { /* K-quant super-block: mins and the float step of the CPU dot */
#pragma unroll
            for (int a = 0; a < 2; a++) {
                unsigned r0 = 32 * wm + 16 * a + gq;
                float2 wd[2] = {s.u.k.wd[r0], s.u.k.wd[r0 + 8]};
                uint32_t am[2] = {0, 0};
                if (TYPE != DS4_TYPE_IQ2_XXS) {
                    am[0] = *(const uint32_t *)&s.u.k.wm[r0][4 * tq];
                    am[1] = *(const uint32_t *)&s.u.k.wm[r0 + 8][4 * tq];
                }
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    float2 xd = *(const float2 *)&s.u.k.xd[32 * wn + 8 * b + 2 * tq];
                    /* sum over the 16 sub-blocks of min x bsum as two products on
                     * the tensor cores, bsum = 256 high byte (signed) + low byte
                     * (unsigned); |sum| <= 16 * 63 * 2048 < 2^22 */
                    int ml[4] = {MAGIC_BITS, MAGIC_BITS, MAGIC_BITS, MAGIC_BITS}, mh[4] = {0, 0, 0, 0};
                    if (TYPE != DS4_TYPE_IQ2_XXS) {
                        uint2 v = *(const uint2 *)&s.u.k.xb[32 * wn + 8 * b + gq][4 * tq];
                        mma_s8_16x8x16<true>(ml, am, __byte_perm(v.x, v.y, 0x6420));
                        mma_s8_16x8x16<false>(mh, am, __byte_perm(v.x, v.y, 0x7531));
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float2 w = wd[i >> 1];
                        float x = i & 1 ? xd.y : xd.x;
                        int is = isum[a][b][i];
                        if (TYPE == DS4_TYPE_IQ2_XXS) {
                            acc[a][b][i] += (w.x * x) * ((float)is * 0.125f);
                            continue;
                        }
                        /* Q2_K's sum (|s| <= 256 * 45 * 128 < 2^22) came out of
                         * accumulators started at the magic bits; Q4_K's may not fit */
                        float isf = TYPE == DS4_TYPE_Q2_K ? magic_to_f(is) : (float)is;
                        float msf = magic_to_f(ml[i] + 256 * mh[i]);
                        float dall = w.x * x, dmin = w.y * x;
                        acc[a][b][i] += __fsub_rn(__fmul_rn(dall, isf), __fmul_rn(dmin, msf));
                    }
                }
            }
        }
        if (more && kq) {
            store_w_raw<TYPE>(nx, raw, tab);
            /* chunk c + 2's raw weights are in flight through the barrier */
            if (c + 2 < nchunk) load_w_raw<TYPE>(g, mat, wrp, c + 2, raw);
        }
        if (more && !kq) {
            store_w_q8_scales(nx, wsc);
            if (c + 2 < nchunk) wsc = load_w_q8_scales(g, mat, (c + 2) * KC);
        }
        cp_async_wait_all();
        __syncthreads();
    }

    gemm_store(g, g.out, g.out_stride, row_tile(g) * QBM + 32 * wm, (int)(32 * wn), count, start, acc);
}

/* F32 and BF16 weights on the TF32 tensor cores: 64 rows x 64 tokens a
 * block, K in steps of FK, eight warps of 32 rows x 16 tokens.  TF32 keeps
 * 10 mantissa bits, so each operand is split into a TF32 head and tail (x
 * = xh + xl to about 2^-22 of x) and a product is w xh + w xl: BF16
 * weights are exact in TF32, F32 weights add their tail's wl xh.  That is
 * the f32 products of the CPU to within a few units of the last place, at
 * two or three tensor-core passes instead of the SIMT multiply-adds.  F16
 * weights take the FP16 units instead (gemm_h_kernel, same tiles). */
#define FK   32
#define FPAD (FK + 4) /* row stride of the tiles: the fragment loads hit 32 banks */

/* Thread i loads 8 consecutive K values of tile row i / 4: in 16-byte
 * loads when the launch found everything aligned (vec), else one by one;
 * zeros past kend or the tokens.  These are the token row's. */
static __device__ __forceinline__ void gemm_x_load(bool vec, const float *xrow, uint32_t k, uint32_t kend,
                                                   float (&xv)[8]) {
    if (vec) {
        float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
        if (xrow && k < kend) { /* kend % 8 == 0: the whole run or none */
            x0 = *(const float4 *)(xrow + k);
            x1 = *(const float4 *)(xrow + k + 4);
        }
        xv[0] = x0.x, xv[1] = x0.y, xv[2] = x0.z, xv[3] = x0.w, xv[4] = x1.x, xv[5] = x1.y, xv[6] = x1.z, xv[7] = x1.w;
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) xv[i] = xrow && k + i < kend ? xrow[k + i] : 0.0f;
}

/* The token row's and the (F32 or BF16) weight row's, as floats. */
static __device__ __forceinline__ void gemm_f_load(const gemm_args &g, bool vec, const uint8_t *wrow, const float *xrow,
                                                   uint32_t k, uint32_t kend, float (&wv)[8], float (&xv)[8]) {
    gemm_x_load(vec, xrow, k, kend, xv);
    if (vec) {
        bool ok = k < kend;
        float4 w0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), w1 = w0;
        if (wrow && ok && g.type == DS4_TYPE_F32) {
            w0 = __ldg((const float4 *)wrow + k / 4);
            w1 = __ldg((const float4 *)wrow + k / 4 + 1);
        } else if (wrow && ok) {
            uint4 r = __ldg((const uint4 *)(wrow + 2 * (size_t)k));
            w0 = make_float4(dev_bf16((uint16_t)r.x), dev_bf16((uint16_t)(r.x >> 16)), dev_bf16((uint16_t)r.y),
                             dev_bf16((uint16_t)(r.y >> 16)));
            w1 = make_float4(dev_bf16((uint16_t)r.z), dev_bf16((uint16_t)(r.z >> 16)), dev_bf16((uint16_t)r.w),
                             dev_bf16((uint16_t)(r.w >> 16)));
        }
        wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w, wv[4] = w1.x, wv[5] = w1.y, wv[6] = w1.z, wv[7] = w1.w;
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float w = 0.0f;
        if (wrow && k + i < kend) {
            if (g.type == DS4_TYPE_F32) w = __ldg((const float *)wrow + k + i);
            else w = dev_bf16(__ldg((const uint16_t *)wrow + k + i));
        }
        wv[i] = w;
    }
}

/* The tile row's 8 values at column lk as TF32 heads (and tails): split
 * once here rather than by every warp that reads them.  Values already
 * exact in TF32 (F16 and BF16 weights) are their own head. */
static __device__ __forceinline__ void gemm_f_store(uint32_t (*h)[FPAD], uint32_t (*l)[FPAD], unsigned r, unsigned lk,
                                                    const float (&v)[8]) {
    uint32_t vh[8], vl[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (l) dev_tf32_split(v[i], &vh[i], &vl[i]);
        else vh[i] = __float_as_uint(v[i]);
    }
    /* 16-byte stores: each quarter warp covers the 32 banks once */
    *(uint4 *)&h[r][lk] = make_uint4(vh[0], vh[1], vh[2], vh[3]);
    *(uint4 *)&h[r][lk + 4] = make_uint4(vh[4], vh[5], vh[6], vh[7]);
    if (l) {
        *(uint4 *)&l[r][lk] = make_uint4(vl[0], vl[1], vl[2], vl[3]);
        *(uint4 *)&l[r][lk + 4] = make_uint4(vl[4], vl[5], vl[6], vl[7]);
    }
}

/* gemm_f_kernel's tiles: TF32 heads and tails of the weight rows (tails
 * only for F32 weights) and of the tokens, one K step. */
typedef struct gemm_f_tiles {
    uint32_t wh[BM][FPAD], wl[BM][FPAD], xh[BN][FPAD], xl[BN][FPAD];
} gemm_f_tiles;

/* One K step at k0: the values staged in (wv, xv) into the tiles, the
 * loads of the step two ahead into the same registers (two register sets
 * alternate, so a load has two steps of products to arrive), then the
 * step's products. */
static __device__ __forceinline__ void gemm_f_step(const gemm_args &g, gemm_f_tiles &s, bool vec, bool wtail,
                                                   const uint8_t *wrow, const float *xrow, uint32_t k0, uint32_t kend,
                                                   float (&wv)[8], float (&xv)[8], float (&acc)[2][2][4],
                                                   float (&tail)[2][2][4]) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    unsigned wm = warp / 4, wn = warp % 4; /* rows 32 wm.., tokens 16 wn.. */
    unsigned lr = threadIdx.x / 4, lk = (threadIdx.x % 4) * 8;
    __syncthreads(); /* the previous step's fragments are read */
    gemm_f_store(s.wh, wtail ? s.wl : NULL, lr, lk, wv);
    gemm_f_store(s.xh, s.xl, lr, lk, xv);
    __syncthreads();
    if (k0 + 2 * FK < kend)
        gemm_f_load(g, vec, wrow, xrow, k0 + 2 * FK + lk, kend, wv, xv); /* in flight for two steps */
#pragma unroll
    for (int kk = 0; kk < FK; kk += 8) {
        uint32_t ah[2][4], al[2][4], bh[2][2], bl[2][2];
#pragma unroll
        for (int m = 0; m < 2; m++) {
            unsigned r = 32 * wm + 16 * m + gq;
            ah[m][0] = s.wh[r][kk + tq], ah[m][1] = s.wh[r + 8][kk + tq];
            ah[m][2] = s.wh[r][kk + tq + 4], ah[m][3] = s.wh[r + 8][kk + tq + 4];
            if (wtail) {
                al[m][0] = s.wl[r][kk + tq], al[m][1] = s.wl[r + 8][kk + tq];
                al[m][2] = s.wl[r][kk + tq + 4], al[m][3] = s.wl[r + 8][kk + tq + 4];
            }
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            unsigned t = 16 * wn + 8 * nt + gq;
            bh[nt][0] = s.xh[t][kk + tq], bh[nt][1] = s.xh[t][kk + tq + 4];
            bl[nt][0] = s.xl[t][kk + tq], bl[nt][1] = s.xl[t][kk + tq + 4];
        }
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                if (wtail) mma_tf32_16x8x8(tail[m][nt], al[m], bh[nt]);
                mma_tf32_16x8x8(tail[m][nt], ah[m], bl[nt]);
                mma_tf32_16x8x8(acc[m][nt], ah[m], bh[nt]);
            }
    }
}

/* A float kernel's block as thread i sees it: the weight row and token
 * row it stages (tile row i / 4; NULL past the rows or tokens), whether
 * every row can be read 16 bytes at a time, and the block's K range (a
 * split's slice). */
typedef struct gemm_f_block {
    const uint8_t *wrow;
    const float *xrow;
    bool vec;
    uint32_t kb, ke;
} gemm_f_block;

static __device__ __forceinline__ gemm_f_block gemm_f_block_of(const gemm_args &g, int mat, int count, int start) {
    gemm_f_block b;
    unsigned lr = threadIdx.x / 4;
    uint32_t wr = row_tile(g) * BM + lr;
    b.wrow = wr < g.rows ? g.w + (size_t)mat * g.mat_bytes + (size_t)(g.row0 + wr) * g.row_bytes : NULL;
    b.xrow = (int)lr < count ? g.xf + (size_t)act_row(g, start + (int)lr) * g.xfs : NULL;
    b.vec = g.n % 8 == 0 &&
            ((uintptr_t)g.xf | g.xfs * sizeof(float) | (uintptr_t)g.w | g.row_bytes | g.mat_bytes) % 16 == 0;
    b.kb = blockIdx.z * g.kper;
    b.ke = b.kb + g.kper < g.n ? b.kb + g.kper : g.n;
    return b;
}

/* A float kernel's results: warp (wm, wn)'s 32 rows x 16 tokens; a
 * split's partial sums go to its slice of part, in the launch's rows. */
static __device__ __forceinline__ void gemm_f_write(const gemm_args &g, int count, int start,
                                                    const float (&acc)[2][2][4]) {
    unsigned warp = threadIdx.x / 32, wm = warp / 4, wn = warp % 4;
    float *out = g.split > 1 ? g.part + (size_t)blockIdx.z * g.T * g.rows : g.out;
    size_t ostride = g.split > 1 ? g.rows : g.out_stride;
    gemm_store(g, out, ostride, row_tile(g) * BM + 32 * wm, (int)(16 * wn), count, start, acc);
}

static __global__ void __launch_bounds__(256) gemm_f_kernel(gemm_args g) {
    dev_pdl_enter();
    __shared__ __align__(16) gemm_f_tiles s;
    int mat, count, start;
    if (!tile_tokens(g, &mat, &count, &start)) return;
    gemm_f_block b = gemm_f_block_of(g, mat, count, start);
    bool wtail = g.type == DS4_TYPE_F32;
    uint32_t lk = (threadIdx.x % 4) * 8, kb = b.kb, ke = b.ke;
    float acc[2][2][4] = {}, tail[2][2][4] = {}; /* the head products; the tail ones, 2^-11 smaller, apart */
    float wv0[8], xv0[8], wv1[8], xv1[8];
    gemm_f_load(g, b.vec, b.wrow, b.xrow, kb + lk, ke, wv0, xv0);
    gemm_f_load(g, b.vec, b.wrow, b.xrow, kb + FK + lk, ke, wv1, xv1); /* zeros past ke */
    for (uint32_t k0 = kb; k0 < ke; k0 += 2 * FK) {
        gemm_f_step(g, s, b.vec, wtail, b.wrow, b.xrow, k0, ke, wv0, xv0, acc, tail);
        if (k0 + FK < ke) gemm_f_step(g, s, b.vec, wtail, b.wrow, b.xrow, k0 + FK, ke, wv1, xv1, acc, tail);
    }
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][nt][i] += tail[m][nt][i];
    gemm_f_write(g, count, start, acc);
}

/* F16 weights on the FP16 tensor cores (m16n8k16, f32 sums), in gemm_f's
 * tiles and warps: the weights as stored, the tokens as binary16 head and
 * tail.  So that neither overflows nor loses its tail to the subnormals,
 * each token's FK values of a K step are first scaled by the power of two
 * that puts their largest magnitude in [2^14, 2^15); the step's sums are
 * scaled back (exactly) as they join the f32 accumulators.  Per K value,
 * half the tensor-core passes and fragment loads of the TF32 kernel. */
#define HPAD (FK / 2 + 4) /* words (value pairs) of a tile row: the fragment loads hit 32 banks */

typedef struct gemm_h_tiles {
    uint32_t w[BM][HPAD], xh[BN][HPAD], xl[BN][HPAD];
    float xinv[BN]; /* the step's scale of each token, inverted */
} gemm_h_tiles;

/* gemm_f_load's rows for F16 weights: 8 weights as stored, 8 values of x. */
static __device__ __forceinline__ void gemm_h_load(const gemm_args &g, bool vec, const uint8_t *wrow, const float *xrow,
                                                   uint32_t k, uint32_t kend, uint4 &wv, float (&xv)[8]) {
    gemm_x_load(vec, xrow, k, kend, xv);
    if (vec) {
        wv = wrow && k < kend ? __ldg((const uint4 *)(wrow + 2 * (size_t)k)) : make_uint4(0, 0, 0, 0);
        return;
    }
    uint32_t h[8];
#pragma unroll
    for (int i = 0; i < 8; i++) h[i] = wrow && k + i < kend ? __ldg((const uint16_t *)wrow + k + i) : 0;
    wv = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
}

/* 2^e as a float, for |e| <= 126. */
static __device__ __forceinline__ float dev_pow2(int e) { return __uint_as_float((uint32_t)(127 + e) << 23); }

/* gemm_f_step for F16 weights. */
static __device__ __forceinline__ void gemm_h_step(const gemm_args &g, gemm_h_tiles &s, bool vec, const uint8_t *wrow,
                                                   const float *xrow, uint32_t k0, uint32_t kend, uint4 &wv,
                                                   float (&xv)[8], float (&acc)[2][2][4]) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, tq = lane % 4;
    unsigned wm = warp / 4, wn = warp % 4;
    unsigned lr = threadIdx.x / 4, lw = (threadIdx.x % 4) * 4; /* tile row, first word */
    /* the token's scale: its FK values are spread over 4 adjacent lanes */
    float m = fmaxf(fmaxf(fmaxf(fabsf(xv[0]), fabsf(xv[1])), fmaxf(fabsf(xv[2]), fabsf(xv[3]))),
                    fmaxf(fmaxf(fabsf(xv[4]), fabsf(xv[5])), fmaxf(fabsf(xv[6]), fabsf(xv[7]))));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    int e = (int)((__float_as_uint(m) >> 23) & 0xff) - 127; /* floor(log2 m) for a normal m */
    e = imin_d(imax_d(14 - e, -126), 126);
    float sc = dev_pow2(e);
    uint32_t h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) dev_f16x2_split(xv[2 * i] * sc, xv[2 * i + 1] * sc, &h[i], &l[i]);
    __syncthreads(); /* the previous step's fragments are read */
    *(uint4 *)&s.w[lr][lw] = wv;
    *(uint4 *)&s.xh[lr][lw] = make_uint4(h[0], h[1], h[2], h[3]);
    *(uint4 *)&s.xl[lr][lw] = make_uint4(l[0], l[1], l[2], l[3]);
    if (lw == 0) s.xinv[lr] = dev_pow2(-e);
    __syncthreads();
    if (k0 + 2 * FK < kend)
        gemm_h_load(g, vec, wrow, xrow, k0 + 2 * FK + 2 * lw, kend, wv, xv); /* in flight for two steps */
    /* fragments by ldmatrix: A's four 8 x 8 matrices are rows +8 (lane bit
     * 3) and k +8 (bit 4); B's are k +8 (bit 3) and tokens +8 (bit 4) */
    unsigned l8 = lane % 8, ar = 32 * wm + l8 + 8 * ((lane >> 3) & 1), aw = 4 * (lane >> 4);
    unsigned bt = 16 * wn + l8 + 8 * (lane >> 4), bw = 4 * ((lane >> 3) & 1);
    float p[2][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < FK / 2; kk += 8) {
        uint32_t a[2][4], bh[4], bl[4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) ldmatrix_x4(a[mi], &s.w[ar + 16 * mi][kk + aw]);
        ldmatrix_x4(bh, &s.xh[bt][kk + bw]);
        ldmatrix_x4(bl, &s.xl[bt][kk + bw]);
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                mma_f16_16x8x16(p[mi][nt], a[mi], &bh[2 * nt]);
                mma_f16_16x8x16(p[mi][nt], a[mi], &bl[2 * nt]);
            }
    }
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        float i0 = s.xinv[16 * wn + 8 * nt + 2 * tq], i1 = s.xinv[16 * wn + 8 * nt + 2 * tq + 1];
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[mi][nt][i] = fmaf(p[mi][nt][i], i & 1 ? i1 : i0, acc[mi][nt][i]);
    }
}

static __global__ void __launch_bounds__(256) gemm_h_kernel(gemm_args g) {
    dev_pdl_enter();
    __shared__ __align__(16) gemm_h_tiles s;
    int mat, count, start;
    if (!tile_tokens(g, &mat, &count, &start)) return;
    gemm_f_block b = gemm_f_block_of(g, mat, count, start);
    uint32_t lk = (threadIdx.x % 4) * 8, kb = b.kb, ke = b.ke;
    float acc[2][2][4] = {};
    uint4 wv0, wv1;
    float xv0[8], xv1[8];
    gemm_h_load(g, b.vec, b.wrow, b.xrow, kb + lk, ke, wv0, xv0);
    gemm_h_load(g, b.vec, b.wrow, b.xrow, kb + FK + lk, ke, wv1, xv1); /* zeros past ke */
    for (uint32_t k0 = kb; k0 < ke; k0 += 2 * FK) {
        gemm_h_step(g, s, b.vec, b.wrow, b.xrow, k0, ke, wv0, xv0, acc);
        if (k0 + FK < ke) gemm_h_step(g, s, b.vec, b.wrow, b.xrow, k0 + FK, ke, wv1, xv1, acc);
    }
    gemm_f_write(g, count, start, acc);
}

/* out[t][r] = the sum of the splits' partial sums, in split order. */
static __global__ void gemm_f_join_kernel(const float *part, uint32_t split, uint32_t T, uint32_t rows, float *out,
                                          size_t stride) {
    dev_pdl_enter();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)T * rows;
    if (i >= n) return;
    float v = part[i];
    for (uint32_t z = 1; z < split; z++) v += part[(size_t)z * n + i];
    out[(i / rows) * stride + i % rows] = v;
}

/* Split a dense float product over K when its grid would leave SMs idle
 * (the few-row products: router, compressor, indexer, at most 16 row
 * tiles of a 2048-token chunk): enough blocks for two waves of two blocks
 * an SM, each split of whole pairs of K steps and at least 256 values, its
 * partial sums in `scratch` (none: no split).  Sets g->split, g->kper,
 * g->part and grid->z.  (The int8 kernel gains nothing from it: measured,
 * its dense products split over K lost 2 % of a prefill.) */
static int gemm_f_split(gemm_args *g, dim3 *grid, float *scratch, ds4_err *err) {
    if (cu_matmul_init(err)) return -1;
    uint32_t blocks = grid->x * grid->y, split = 1;
    uint32_t n_sms = mm_here()->n_sms;
    if (!g->grouped && scratch)
        while (split < 8 && blocks * split < 4 * n_sms && g->n / (2 * split) >= 256) split *= 2;
    g->kper = ((g->n + split - 1) / split + 2 * FK - 1) / (2 * FK) * (2 * FK);
    g->split = (g->n + g->kper - 1) / g->kper;
    if (g->split > 1) {
        if ((size_t)g->split * g->T * g->rows > cu_gemm_split_floats())
            return ds4_err_set(err, DS4_EINVAL, "CUDA gemm: %u splits of %u x %u outputs exceed the split scratch",
                               g->split, g->T, g->rows);
        g->part = scratch;
        grid->z = g->split;
    }
    return 0;
}

/* The loop above stops doubling once blocks x split reaches 4 SMs' worth,
 * so a split product has blocks x split < 8 x SMs, and each block holds at
 * most BM x BN outputs. */
size_t cu_gemm_split_floats(void) { return (size_t)8 * mm_here()->n_sms * BM * BN; }

static int gemm_f_join(const gemm_args *g, cudaStream_t st, ds4_err *err) {
    if (g->split < 2) return 0;
    size_t n = (size_t)g->T * g->rows;
    DS4_LAUNCH(gemm_f_join_kernel, (unsigned)((n + 255) / 256), 256, 0, st, (const float *)g->part, g->split, g->T,
               g->rows, g->out, g->out_stride);
    CU_LAUNCHED();
    return 0;
}

/* The int8 kernel's two stages exceed the default 48 KiB of shared memory:
 * allow them once per weight type, with the whole carveout as shared
 * memory so that two blocks (16 warps) fit an SM. */
template <uint32_t TYPE> static int gemm_q_allow(ds4_err *err) {
    CU_TRY(
        cudaFuncSetAttribute(gemm_q_kernel<TYPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)gemm_q_smem(TYPE)));
    CU_TRY(cudaFuncSetAttribute(gemm_q_kernel<TYPE>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    return 0;
}
static int gemm_q_init(ds4_err *err) {
    mm_device *m = mm_here();
    if (m->gemm_q_ready) return 0;
    if (gemm_q_allow<DS4_TYPE_Q8_0>(err) || gemm_q_allow<DS4_TYPE_Q2_K>(err) || gemm_q_allow<DS4_TYPE_Q4_K>(err) ||
        gemm_q_allow<DS4_TYPE_IQ2_XXS>(err))
        return -1;
    m->gemm_q_ready = true;
    return 0;
}

/* Whether cu_gemm takes a plan of a few tokens (cu_gemv_tokens). */
static bool gemm_few(const dwt *W, const dact *x, uint32_t act_off, uint32_t T, const cu_group *grp) {
    if (grp || T > CU_FEW_PASS || !cu_gemv_few_fits(W)) return false;
    if (W->type == DS4_TYPE_Q8_0) return x->q8 != NULL;
    return x->f && ((uintptr_t)(x->f + act_off) | x->fs * sizeof(float)) % 16 == 0;
}

/* The same product as a plan of a few tokens. */
static int gemm_few_run(const dwt *W, uint32_t mat, uint32_t row0, uint32_t rows, const dact *x, uint32_t act_off,
                        uint32_t T, float *out, size_t out_stride, cudaStream_t st, ds4_err *err) {
    gemv_plan p;
    cu_gemv_tokens(&p, T);
    gemv_tok tk = {1, out_stride, 0, 0};
    cu_gemv_add_tok(&p, W, mat, NULL, 0, row0, rows, x, act_off, out, tk);
    return cu_gemv_run(&p, st, err);
}

int cu_gemm(const dwt *W, uint32_t mat, uint32_t row0, uint32_t rows, const dact *x, uint32_t act_off, uint32_t T,
            float *out, size_t out_stride, const cu_group *grp, float *split, cudaStream_t st, ds4_err *err) {
    if (rows == 0 || (T == 0 && !grp)) return 0;
    gemm_args g;
    memset(&g, 0, sizeof(g));
    g.w = W->p;
    g.type = W->type;
    g.n = W->n;
    g.rows = rows;
    g.row0 = row0;
    g.mat = mat;
    g.row_bytes = W->row_bytes;
    g.mat_bytes = W->row_bytes * W->rows;
    g.T = T;
    g.out = out;
    g.out_stride = out_stride;
    g.grouped = grp != NULL;
    if (grp) g.grp = *grp;
    bool quant = cu_act_form(W->type) != ACT_F;
    uint32_t bm = quant ? QBM : BM, row_tiles = (rows + bm - 1) / bm;
    dim3 grid = grp ? dim3(row_tiles, grp->max_tiles) : dim3((T + BN - 1) / BN, row_tiles);
    cu_act_ptrs(x, W->type, 0, act_off, &g.xf, &g.xq, &g.xd, &g.xb);
    g.xfs = x->fs;
    if (!quant) {
        if (!g.xf)
            return ds4_err_set(err, DS4_EINVAL, "CUDA gemm: no f32 activation for a %u-row %s product", rows,
                               ds4_type_get(W->type)->name);
        if (gemm_few(W, x, act_off, T, grp))
            return gemm_few_run(W, mat, row0, rows, x, act_off, T, out, out_stride, st, err);
        if (gemm_f_split(&g, &grid, split, err)) return -1;
        if (W->type == DS4_TYPE_F16) DS4_LAUNCH(gemm_h_kernel, grid, 256, 0, st, g);
        else DS4_LAUNCH(gemm_f_kernel, grid, 256, 0, st, g);
        CU_LAUNCHED();
        return gemm_f_join(&g, st, err);
    }
    g.xqs = W->type == DS4_TYPE_Q8_0 ? x->q8s : x->qks;
    if (!g.xq) return ds4_err_set(err, DS4_EINVAL, "CUDA gemm: no quantized activation for a %u-row product", rows);
    if (gemm_few(W, x, act_off, T, grp))
        return gemm_few_run(W, mat, row0, rows, x, act_off, T, out, out_stride, st, err);
    if (((uintptr_t)g.xq | g.xqs | W->row_bytes | (uintptr_t)W->p) % 16)
        return ds4_err_set(err, DS4_EINVAL, "CUDA gemm: activation or weight rows not 16-byte aligned (%u-row product)",
                           rows);
    if (cu_matmul_init(err) || gemm_q_init(err)) return -1;
    size_t smem = gemm_q_smem(W->type);
    const uint32_t *gr = mm_here()->iq2_tab;
    switch (W->type) {
    case DS4_TYPE_Q8_0: DS4_LAUNCH(gemm_q_kernel<DS4_TYPE_Q8_0>, grid, QTHREADS, smem, st, g, gr); break;
    case DS4_TYPE_Q2_K: DS4_LAUNCH(gemm_q_kernel<DS4_TYPE_Q2_K>, grid, QTHREADS, smem, st, g, gr); break;
    case DS4_TYPE_Q4_K: DS4_LAUNCH(gemm_q_kernel<DS4_TYPE_Q4_K>, grid, QTHREADS, smem, st, g, gr); break;
    default: DS4_LAUNCH(gemm_q_kernel<DS4_TYPE_IQ2_XXS>, grid, QTHREADS, smem, st, g, gr); break;
    }
    CU_LAUNCHED();
    return 0;
}
