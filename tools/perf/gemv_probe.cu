/*
 * gemv_probe.cu - how fast do the decode products stream on their own?
 * (build/cuda/gemv_probe, built by `make perf-tools`; needs a GPU.)
 *
 * The decode step's products run between latency-bound launches, so the
 * step's ablations cannot tell a product's own streaming rate from the
 * ramps and tails around it.  This probe times, in captured graphs of
 * back-to-back launches (each launch programmatically dependent on the one
 * before, as in the step):
 *   - cold chains: CHAIN products of one shape, each on its own weights
 *     (the chain's bytes far beyond the L2), in the shapes of the step's
 *     Q8_0 products (attn_output_b, q_b, the shared expert's gate / up,
 *     q_a + kv): weight bytes / time, against
 *   - the same bytes read by a plain streaming kernel (int4 loads, four
 *     in flight a thread, a grid of 4 blocks an SM), the read roofline;
 *   - hot chains: one product's weights, small enough for the L2, CHAIN
 *     times: the rate the kernel reaches when the DRAM is not the limit.
 * The weights are arbitrary bytes: only the time counts.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "model/cuda/cuda_internal.h"

/* clang-format off */
#define CU(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)
/* clang-format on */

enum { CHAIN = 16, REPLAYS = 20 };

/* A matrix (mats of them) of rows x n in the backend's repacked layout
 * (cu_row_bytes), of arbitrary small bytes. */
static dwt matrix(uint32_t type, uint32_t n, uint32_t rows, uint32_t mats) {
    dwt w;
    memset(&w, 0, sizeof(w));
    w.type = type;
    w.n = n;
    w.rows = rows;
    w.mats = mats;
    w.row_bytes = cu_row_bytes(type, n);
    void *p;
    CU(cudaMalloc(&p, w.row_bytes * rows * mats));
    CU(cudaMemset(p, 0x11, w.row_bytes * rows * mats)); /* small scales, small quants */
    w.p = (const uint8_t *)p;
    return w;
}
static dwt q8_matrix(uint32_t n, uint32_t rows) { return matrix(DS4_TYPE_Q8_0, n, rows, 1); }

static dact activation(uint32_t n) {
    dact a;
    memset(&a, 0, sizeof(a));
    a.n = n;
    a.fs = n;
    a.q8s = cu_q8_bytes(n);
    a.qks = cu_qk_bytes(n);
    CU(cudaMalloc(&a.f, n * sizeof(float)));
    CU(cudaMemset(a.f, 0, n * sizeof(float)));
    CU(cudaMalloc(&a.q8, a.q8s));
    CU(cudaMemset(a.q8, 0x11, a.q8s));
    CU(cudaMalloc(&a.qk, a.qks));
    CU(cudaMemset(a.qk, 0x01, a.qks));
    return a;
}

/* The plain read: every int4 of [p, p + bytes), summed so the loads stay. */
static __global__ void __launch_bounds__(256) read_kernel(const int4 *p, size_t n16, int *sink) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    size_t stride = (size_t)gridDim.x * blockDim.x, i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    int acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        int4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
             d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n16; i += stride) acc ^= __ldcs(p + i).x;
    if (acc == 0x7fffffff) *sink = acc;
}

typedef struct shape {
    const char *name;
    uint32_t n, rows, segs; /* segs products of rows x n in one launch */
} shape;

/* Seconds per launch of a captured chain, the best of three timings of
 * REPLAYS replays. */
template <typename F> static double time_chain(cudaStream_t st, F enqueue) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    enqueue();
    CU(cudaStreamEndCapture(st, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    CU(cudaGraphLaunch(ge, st));
    CU(cudaStreamSynchronize(st));
    double best = 1e30;
    for (int k = 0; k < 3; k++) {
        CU(cudaEventRecord(e0, st));
        for (int r = 0; r < REPLAYS; r++) CU(cudaGraphLaunch(ge, st));
        CU(cudaEventRecord(e1, st));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        double s = ms * 1e-3 / REPLAYS / CHAIN;
        if (s < best) best = s;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return best;
}

static void run_gemv(const std::vector<dwt> &ws, uint32_t segs, const dact *x, float *out, cudaStream_t st) {
    gemv_plan p;
    memset(&p, 0, sizeof(p));
    for (uint32_t s = 0; s < segs; s++)
        cu_gemv_add(&p, &ws[s], 0, NULL, 0, 0, ws[s].rows, x, 0, out + (size_t)s * ws[s].rows);
    ds4_err err = {};
    if (cu_gemv_run(&p, st, &err)) {
        fprintf(stderr, "gemv: %s\n", ds4_err_msg(&err));
        exit(1);
    }
}

/* The routed experts' products of the step: gate and up (IQ2_XXS, 2048 x
 * 4096) or down (Q2_K, 4096 x 2048) of K experts picked by a device
 * selection; link k of a cold chain picks experts K k .. K k + K - 1 of
 * 256, a hot chain always the first K. */
static void routed(cudaStream_t st, float *out) {
    enum { K = 6, E = 256 };
    dwt gate = matrix(DS4_TYPE_IQ2_XXS, 4096, 2048, E), up = matrix(DS4_TYPE_IQ2_XXS, 4096, 2048, E);
    dwt down = matrix(DS4_TYPE_Q2_K, 2048, 4096, E);
    dact x = activation(4096), m = activation(2048);
    int *sel;
    CU(cudaMalloc(&sel, CHAIN * K * sizeof(int)));
    std::vector<int> hs(CHAIN * K);
    for (int i = 0; i < CHAIN * K; i++) hs[i] = i % E;
    CU(cudaMemcpy(sel, hs.data(), hs.size() * sizeof(int), cudaMemcpyHostToDevice));
    auto gate_up = [&](int link) {
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        for (uint32_t i = 0; i < K; i++) {
            cu_gemv_add(&p, &gate, 0, sel + K * link, i, 0, 2048, &x, 0, out + 2048 * i);
            cu_gemv_add(&p, &up, 0, sel + K * link, i, 0, 2048, &x, 0, out + 2048 * (K + i));
        }
        ds4_err err = {};
        if (cu_gemv_run(&p, st, &err)) {
            fprintf(stderr, "gemv: %s\n", ds4_err_msg(&err));
            exit(1);
        }
    };
    auto downs = [&](int link) {
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        for (uint32_t i = 0; i < K; i++) cu_gemv_add(&p, &down, 0, sel + K * link, i, 0, 4096, &m, 0, out + 4096 * i);
        ds4_err err = {};
        if (cu_gemv_run(&p, st, &err)) {
            fprintf(stderr, "gemv: %s\n", ds4_err_msg(&err));
            exit(1);
        }
    };
    double gb = 2.0 * K * 2048 * gate.row_bytes, db = (double)K * 4096 * down.row_bytes;
    double tg = time_chain(st, [&] {
        for (int k = 0; k < CHAIN; k++) gate_up(k);
    });
    double tgh = time_chain(st, [&] {
        for (int k = 0; k < CHAIN; k++) gate_up(0);
    });
    double td = time_chain(st, [&] {
        for (int k = 0; k < CHAIN; k++) downs(k);
    });
    double tdh = time_chain(st, [&] {
        for (int k = 0; k < CHAIN; k++) downs(0);
    });
    printf("%-34s %9.1f %9.2f %9.2f %9s %7s   hot: %.2f us, %.2f TB/s\n", "routed gate+up IQ2_XXS 6 x 2 x 2048",
           gb / 1e6, tg * 1e6, gb / tg / 1e12, "", "", tgh * 1e6, gb / tgh / 1e12);
    printf("%-34s %9.1f %9.2f %9.2f %9s %7s   hot: %.2f us, %.2f TB/s\n", "routed down Q2_K 6 x 4096 x 2048", db / 1e6,
           td * 1e6, db / td / 1e12, "", "", tdh * 1e6, db / tdh / 1e12);
    cudaFree((void *)gate.p);
    cudaFree((void *)up.p);
    cudaFree((void *)down.p);
    cudaFree(sel);
}

int main(void) {
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ds4_err err = {};
    if (cu_matmul_init(&err)) { /* its tables: allocated outside the captures */
        fprintf(stderr, "%s\n", ds4_err_msg(&err));
        return 1;
    }
    int *sink;
    CU(cudaMalloc(&sink, 4));
    float *out;
    CU(cudaMalloc(&out, 65536 * sizeof(float)));
    CU(cudaMemset(out, 0, 65536 * sizeof(float)));
    const shape shapes[] = {
        {"attn_output_b 4096 x 8192", 8192, 4096, 1},
        {"q_b 32768 x 1024", 1024, 32768, 1},
        {"shared gate+up 2 x 2048 x 4096", 4096, 2048, 2},
        {"q_a + kv 1024 + 512 x 4096", 4096, 1024, 1},
    };
    printf("%-34s %9s %9s %9s %9s %7s\n", "shape", "MB", "gemv us", "gemv TB/s", "read TB/s", "ratio");
    for (const shape &sh : shapes) {
        dact x = activation(sh.n);
        std::vector<std::vector<dwt>> chain(CHAIN);
        for (auto &c : chain)
            for (uint32_t s = 0; s < sh.segs; s++) c.push_back(q8_matrix(sh.n, sh.rows));
        double bytes = (double)chain[0][0].row_bytes * sh.rows * sh.segs;
        double tg = time_chain(st, [&] {
            for (auto &c : chain) run_gemv(c, sh.segs, &x, out, st);
        });
        double tr = time_chain(st, [&] {
            for (auto &c : chain)
                for (uint32_t s = 0; s < sh.segs; s++) {
                    size_t n16 = c[s].row_bytes * sh.rows / 16;
                    DS4_LAUNCH(read_kernel, 4 * 132, 256, 0, st, (const int4 *)c[s].p, n16, sink);
                }
        });
        /* hot: the first product's weights CHAIN times (L2-resident when they fit) */
        double th = time_chain(st, [&] {
            for (int k = 0; k < CHAIN; k++) run_gemv(chain[0], sh.segs, &x, out, st);
        });
        printf("%-34s %9.1f %9.2f %9.2f %9.2f %7.2f   hot: %.2f us, %.2f TB/s\n", sh.name, bytes / 1e6, tg * 1e6,
               bytes / tg / 1e12, bytes / tr / 1e12, tr / tg, th * 1e6, bytes / th / 1e12);
        for (auto &c : chain)
            for (auto &w : c) cudaFree((void *)w.p);
        cudaFree(x.f);
        cudaFree(x.q8);
        cudaFree(x.qk);
    }
    routed(st, out);
    return 0;
}
