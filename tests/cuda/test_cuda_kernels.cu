/*
 * test_cuda_kernels.cu - the CUDA backend's products against the CPU
 * definitions of src/format (quants.h), type by type: activation
 * quantization must give the CPU's bytes, and every matrix-vector and
 * matrix product (plain, with a row offset, with an activation offset,
 * grouped by expert, split over K, several fused into one launch, routed
 * ones picked by a device selection) must give the CPU's dot products to
 * rounding (results are read after synchronising the stream the products
 * ran on) (|d| <= 2e-6 of the row's sum of |terms|); products that
 * quantize their outputs must give the CPU quantizer's Q8_0 of them; a
 * product of an activation without the form its weights read is refused.
 * Random weights and inputs, fresh for each type; outputs poisoned before
 * each run.
 *
 * The low-precision simulations (FP8 KV, Hadamard + FP4 - by a block and
 * by one warp - and f16 rounding) must give lowprec.c's bits on identical
 * inputs, exact ties included.
 * The indexer's scores must be the f64 reference's to rounding (|d| <=
 * 1e-5 of the sum of |terms|), only for the rows of each query's prefix.
 * The indexer's top-k must list exactly the rows a stable sort by score
 * picks (ties to the lower row, -0 equal to +0), from a few keys to more
 * than its threads can hold in one batch.  Routing must pick the experts
 * of a stable sort of prob + bias (or the hash table's), with their
 * normalised weights to 1e-5.
 *
 * With the argument alloc-failure, only: a device allocation the device
 * cannot serve fails as DS4_ENOMEM with a message naming what wanted how
 * many GiB and what the device has free, and the device stays usable.
 *
 * Built for a GPU (make cuda) and for the CPU emulation (make
 * test-cuda-emu); run by tests/cuda/run.sh.  Exit status 0 when all pass.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "model/cuda/cuda_internal.h"
#include "model/cuda/cuda_lowprec.cuh"

extern "C" {
#include "model/lowprec.h"
#include "model/rope.h"
#include "base/fp.h"
}

#include "check.h"

#define CU(call)                                                                  \
    do {                                                                          \
        cudaError_t e_ = (call);                                                  \
        if (e_ != cudaSuccess) {                                                  \
            printf("FAIL: %s: %s\n", #call, cudaGetErrorString(e_));              \
            exit(1);                                                              \
        }                                                                         \
    } while (0)
/* clang-format on */

static uint64_t rng = 88172645463325252ull;
static float frand() { /* N(0,1)-ish */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        s += (float)(rng >> 40) / 16777216.0f - 0.5f;
    }
    return s * 1.7f;
}

template <typename T> static T *dalloc(size_t n) {
    T *p;
    CU(cudaMalloc(&p, n * sizeof(T) + 16));
    return p;
}

/* A device copy of host values. */
template <typename T> static T *dcopy(const T *h, size_t n) {
    T *p = dalloc<T>(n);
    CU(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <typename T> static T *dcopy(const std::vector<T> &h) { return dcopy(h.data(), h.size()); }

/* cudaMemset, finished before anything else starts: it runs on the legacy
 * default stream, which does not wait for or hold back the test's
 * non-blocking stream, and returns before the device has written. */
static void dset(void *p, int v, size_t n) {
    CU(cudaMemset(p, v, n));
    CU(cudaDeviceSynchronize());
}

/* A device activation of `rows` tokens of n random values, quantized on the
 * device; the host copies of every form for the reference. */
struct act_pair {
    dact d;
    std::vector<float> f;
    std::vector<uint8_t> q8, qk;
};

/* Keeps the largest error so far; a NaN (an output never written, still
 * its poison) counts as infinite, so that no later row's error hides it. */
static void note_err(double &worst, double e) {
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
}

static void free_act(act_pair &a) {
    cudaFree(a.d.f);
    cudaFree(a.d.q8);
    cudaFree(a.d.qk);
}

static void make_act(act_pair &a, uint32_t n, uint32_t rows, cudaStream_t st) {
    a.f.resize((size_t)n * rows);
    for (auto &v : a.f) v = frand() * 3.0f;
    a.f[3] = 0.0f; /* zero blocks and ties exercise the rounding rules */
    memset(&a.d, 0, sizeof(a.d));
    a.d.n = n;
    a.d.fs = n;
    a.d.q8s = cu_q8_bytes(n);
    a.d.qks = cu_qk_bytes(n);
    a.d.f = dalloc<float>((size_t)n * rows);
    CU(cudaMemcpy(a.d.f, a.f.data(), a.f.size() * 4, cudaMemcpyHostToDevice));
    if (a.d.q8s) a.d.q8 = dalloc<uint8_t>(a.d.q8s * rows);
    if (a.d.qks) a.d.qk = dalloc<uint8_t>(a.d.qks * rows);
    ds4_err err = {};
    if (cu_quantize(&a.d, rows, st, &err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        exit(1);
    }
    CU(cudaStreamSynchronize(st));
    if (a.d.q8) {
        a.q8.resize(a.d.q8s * rows);
        CU(cudaMemcpy(a.q8.data(), a.d.q8, a.q8.size(), cudaMemcpyDeviceToHost));
    }
    if (a.d.qk) {
        a.qk.resize(a.d.qks * rows);
        CU(cudaMemcpy(a.qk.data(), a.d.qk, a.qk.size(), cudaMemcpyDeviceToHost));
    }
}

/* The device quantized row t, as the CPU's activation block array. */
static std::vector<uint8_t> host_act(const act_pair &a, uint32_t type, uint32_t t, uint32_t off, uint32_t len) {
    std::vector<uint8_t> out(ds4_act_bytes(type, len) + 64);
    uint32_t at = ds4_act_type(type), n = a.d.n;
    if (at == DS4_TYPE_F32) {
        memcpy(out.data(), &a.f[(size_t)t * n + off], len * 4);
    } else if (at == DS4_TYPE_Q8_0) {
        const uint8_t *row = a.q8.data() + (size_t)t * a.d.q8s;
        ds4_block_q8_0x *b = (ds4_block_q8_0x *)out.data();
        for (uint32_t i = 0; i < len / 32; i++) {
            memcpy(&b[i].d, row + n + 4 * ((off / 32) + i), 4);
            memcpy(b[i].qs, row + off + 32 * i, 32);
        }
    } else {
        const uint8_t *row = a.qk.data() + (size_t)t * a.d.qks;
        ds4_block_q8_K *b = (ds4_block_q8_K *)out.data();
        for (uint32_t i = 0; i < len / 256; i++) {
            memcpy(&b[i].d, row + n + 4 * ((off / 256) + i), 4);
            memcpy(b[i].qs, row + off + 256 * i, 256);
            memcpy(b[i].bsums, row + n + n / 256 * 4 + 2 * (off / 16 + 16 * i), 32);
        }
    }
    return out;
}

static void check_quantize(cudaStream_t st) {
    for (uint32_t n : {256u, 768u, 4096u}) {
        act_pair a;
        make_act(a, n, 3, st);
        int bad8 = 0, badk = 0;
        for (uint32_t t = 0; t < 3; t++) {
            std::vector<ds4_block_q8_0x> r8(n / 32);
            std::vector<ds4_block_q8_K> rk(n / 256);
            ds4_quantize_q8_0x(&a.f[(size_t)t * n], r8.data(), n);
            ds4_quantize_q8_K(&a.f[(size_t)t * n], rk.data(), n);
            std::vector<uint8_t> g8 = host_act(a, DS4_TYPE_Q8_0, t, 0, n), gk = host_act(a, DS4_TYPE_Q2_K, t, 0, n);
            bad8 += memcmp(g8.data(), r8.data(), r8.size() * sizeof(r8[0])) != 0;
            badk += memcmp(gk.data(), rk.data(), rk.size() * sizeof(rk[0])) != 0;
        }
        printf("quantize n=%-5u q8_0x %s, q8_K %s\n", n, bad8 ? "DIFFER" : "identical", badk ? "DIFFER" : "identical");
        CHECK(!bad8 && !badk, "activation quantization of %u values differs from the CPU's", n);
        free_act(a);
    }
}

/* A random weight tensor: host GGUF rows and the repacked device copy. */
struct wt_pair {
    dwt d;
    std::vector<uint8_t> h;
    size_t hrow;
};

static void make_weights(wt_pair &w, uint32_t type, uint32_t n, uint32_t rows, uint32_t mats) {
    w.hrow = ds4_row_bytes(type, n);
    w.h.resize(w.hrow * rows * mats);
    std::vector<float> x(n);
    for (size_t r = 0; r < (size_t)rows * mats; r++) {
        for (auto &v : x) v = frand() * 0.05f;
        ds4_quantize_row(type, x.data(), w.h.data() + r * w.hrow, n, NULL);
    }
    memset(&w.d, 0, sizeof(w.d));
    w.d.type = type;
    w.d.n = n;
    w.d.rows = rows;
    w.d.mats = mats;
    w.d.row_bytes = cu_row_bytes(type, n);
    std::vector<uint8_t> dev(w.d.row_bytes * rows * mats);
    for (size_t r = 0; r < (size_t)rows * mats; r++)
        cu_repack_row(type, n, w.h.data() + r * w.hrow, dev.data() + r * w.d.row_bytes, w.d.row_bytes);
    uint8_t *p = dalloc<uint8_t>(dev.size());
    CU(cudaMemcpy(p, dev.data(), dev.size(), cudaMemcpyHostToDevice));
    w.d.p = p;
}

/* Reference: dot of weight row (mat, row) with token t's activation at `off`,
 * and the scale of its terms (for the tolerance). */
static void reference(const wt_pair &w, const act_pair &a, uint32_t mat, uint32_t row, uint32_t t, uint32_t off,
                      double *ref, double *mag) {
    const uint8_t *wr = w.h.data() + ((size_t)mat * w.d.rows + row) * w.hrow;
    std::vector<uint8_t> act = host_act(a, w.d.type, t, off, w.d.n);
    *ref = ds4_vec_dot(w.d.type, w.d.n, wr, act.data());
    std::vector<float> wf(w.d.n);
    ds4_dequantize_row(w.d.type, wr, wf.data(), w.d.n);
    double m = 0;
    for (uint32_t i = 0; i < w.d.n; i++) m += fabs(wf[i] * a.f[(size_t)t * a.d.n + off + i]);
    *mag = m;
}

static const char *tname(uint32_t t) { return ds4_type_get(t)->name; }

/* The scratch cu_gemm may split float products in (one for the test). */
static float *split_scratch(void) {
    static float *p;
    if (!p) p = dalloc<float>(cu_gemm_split_floats());
    return p;
}

/* A float product of few, long rows: with a scratch the launch splits it
 * over K (partial sums per split, added in split order; the last split
 * short), without one it computes it unsplit. */
static void split_gemm_case(cudaStream_t st, uint32_t type, float *scratch) {
    const uint32_t n = 2336, rows = 100, T = 37;
    wt_pair w;
    act_pair a;
    make_weights(w, type, n, rows, 1);
    make_act(a, n, T, st);
    float *out = dalloc<float>((size_t)T * (rows + 3));
    dset(out, 0xFF, (size_t)T * (rows + 3) * 4);
    ds4_err err = {};
    if (cu_gemm(&w.d, 0, 0, rows, &a.d, 0, T, out, rows + 3, NULL, scratch, st, &err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        exit(1);
    }
    CU(cudaStreamSynchronize(st));
    std::vector<float> got((size_t)T * (rows + 3));
    CU(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    int guards = 0;
    for (uint32_t t = 0; t < T; t++) {
        for (uint32_t r = 0; r < rows; r++) {
            double ref, mag;
            reference(w, a, 0, r, t, 0, &ref, &mag);
            double e = fabs(got[(size_t)t * (rows + 3) + r] - ref) / (mag + 1e-30);
            note_err(worst, e);
        }
        for (uint32_t r = rows; r < rows + 3; r++) {
            uint32_t v;
            memcpy(&v, &got[(size_t)t * (rows + 3) + r], 4);
            guards += v != 0xFFFFFFFFu;
        }
    }
    const char *how = scratch ? "split over K" : "no scratch, unsplit";
    printf("gemm %-8s %s, max error %.2g of the terms' magnitude\n", tname(type), how, worst);
    CHECK(worst <= 2e-6 && guards == 0, "gemm %s %s: error %.3g, %d values written outside the rows", tname(type), how,
          worst, guards);
    cudaFree(out);
    cudaFree((void *)w.d.p);
    free_act(a);
}

static void check_split_gemm(cudaStream_t st) {
    const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16};
    for (uint32_t type : types) split_gemm_case(st, type, split_scratch());
    for (uint32_t type : types) split_gemm_case(st, type, NULL);
}

/* Float products of activations far from 1: token t's runs of 8 values
 * scaled by 2^e, e from -60 to +20 by token and run (within a K step of
 * the kernels, too), so some values
 * exceed binary16's range and some fall below its normal numbers (the F16
 * kernel's per-step scaling).  Only the float values are rescaled: the
 * quantized rows stay those of make_act, which float products do not read. */
static void check_gemm_range(cudaStream_t st) {
    const uint32_t n = 1024, rows = 70, T = 21;
    for (uint32_t type : {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16}) {
        wt_pair w;
        act_pair a;
        make_weights(w, type, n, rows, 1);
        make_act(a, n, T, st);
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < n; i++) {
                int e = (int)(t % 7) * 10 - 40 + (int)((i / 8) % 5) * 5 - 20;
                a.f[(size_t)t * n + i] = ldexpf(a.f[(size_t)t * n + i], e);
            }
        CU(cudaMemcpy(a.d.f, a.f.data(), a.f.size() * 4, cudaMemcpyHostToDevice));
        float *out = dalloc<float>((size_t)T * rows);
        ds4_err err = {};
        if (cu_gemm(&w.d, 0, 0, rows, &a.d, 0, T, out, rows, NULL, NULL, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        std::vector<float> got((size_t)T * rows);
        CU(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t r = 0; r < rows; r++) {
                double ref, mag;
                reference(w, a, 0, r, t, 0, &ref, &mag);
                double e = fabs(got[(size_t)t * rows + r] - ref) / (mag + 1e-30);
                note_err(worst, e);
            }
        printf("gemm %-8s magnitudes 2^-60 .. 2^22, max error %.2g of the terms' magnitude\n", tname(type), worst);
        CHECK(worst <= 2e-6, "gemm %s of magnitudes 2^-60 .. 2^22: error %.3g", tname(type), worst);
        cudaFree(out);
        cudaFree((void *)w.d.p);
        free_act(a);
    }
}

/* A product of an activation that lacks the form its weights read (the
 * backend makes each activation only in the forms its products read) is
 * refused with a message naming what is missing, not run on NULL rows. */
static void check_missing_form(cudaStream_t st) {
    wt_pair wf, wq;
    make_weights(wf, DS4_TYPE_F16, 256, 8, 1);
    make_weights(wq, DS4_TYPE_Q8_0, 256, 8, 1);
    act_pair a;
    make_act(a, 256, 2, st);
    dact no_f = a.d, no_q = a.d;
    no_f.f = NULL;
    no_q.q8 = no_q.qk = NULL;
    float *out = dalloc<float>(16);
    struct {
        const dwt *w;
        const dact *x;
        const char *want;
    } cases[] = {{&wf.d, &no_f, "no f32 activation"}, {&wq.d, &no_q, "no quantized activation"}};
    for (auto &c : cases) {
        ds4_err err = {};
        int rc = cu_gemm(c.w, 0, 0, 8, c.x, 0, 2, out, 8, NULL, NULL, st, &err);
        printf("gemm %-8s without its form: %s\n", tname(c.w->type), ds4_err_msg(&err));
        CHECK(rc != 0 && strstr(ds4_err_msg(&err), c.want), "gemm %s of a missing form: rc %d, '%s'", tname(c.w->type),
              rc, ds4_err_msg(&err));
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, c.w, 0, NULL, 0, 0, 8, c.x, 0, out);
        err = {};
        rc = cu_gemv_run(&p, st, &err);
        printf("gemv %-8s without its form: %s\n", tname(c.w->type), ds4_err_msg(&err));
        CHECK(rc != 0 && strstr(ds4_err_msg(&err), "without the form it reads"),
              "gemv %s of a missing form: rc %d, '%s'", tname(c.w->type), rc, ds4_err_msg(&err));
    }
    CU(cudaStreamSynchronize(st));
    cudaFree(out);
    cudaFree((void *)wf.d.p);
    cudaFree((void *)wq.d.p);
    free_act(a);
}

/* Few long float rows: a block a row, the row split over its warps. */
static void check_split_gemv(cudaStream_t st) {
    const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16};
    const uint32_t n = 1024, rows = 37;
    for (uint32_t type : types) {
        wt_pair w;
        act_pair a;
        make_weights(w, type, n, rows, 2);
        make_act(a, n, 1, st);
        float *out = dalloc<float>(rows + 1);
        dset(out, 0xFF, (rows + 1) * 4);
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, &w.d, 1, NULL, 0, 0, rows, &a.d, 0, out);
        CHECK(p.n_blocks == rows, "split gemv %s: %u blocks for %u rows", tname(type), p.n_blocks, rows);
        ds4_err err = {};
        if (cu_gemv_run(&p, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        std::vector<float> got(rows + 1);
        CU(cudaMemcpy(got.data(), out, (rows + 1) * 4, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (uint32_t r = 0; r < rows; r++) {
            double ref, mag;
            reference(w, a, 1, r, 0, 0, &ref, &mag);
            double e = fabs(got[r] - ref) / (mag + 1e-30);
            note_err(worst, e);
        }
        uint32_t guard;
        memcpy(&guard, &got[rows], 4);
        printf("gemv %-8s split rows, max error %.2g of the terms' magnitude\n", tname(type), worst);
        CHECK(worst <= 2e-6, "split gemv %s: error %.3g", tname(type), worst);
        CHECK(guard == 0xFFFFFFFFu, "split gemv %s wrote past its rows", tname(type));
        cudaFree(out);
        cudaFree((void *)w.d.p);
        free_act(a);
    }
}

/* The window products of a closing decode step (cu_win_run): each token's
 * outputs bit for bit those of a one-token split gemv of it, rows past a
 * segment untouched, and a plan of rows it cannot take refused. */
static void check_window_gemv(cudaStream_t st) {
    const uint32_t types[] = {DS4_TYPE_F32, DS4_TYPE_F16, DS4_TYPE_BF16};
    const uint32_t n = 1024, rows = 37;
    for (uint32_t type : types) {
        wt_pair w;
        act_pair a;
        make_weights(w, type, n, rows, 1);
        make_act(a, n, CU_WIN_T, st);
        size_t stride = rows + 3;
        float *win = dalloc<float>(CU_WIN_T * stride), *one = dalloc<float>(CU_WIN_T * stride);
        dset(win, 0xFF, CU_WIN_T * stride * 4);
        dset(one, 0xFF, CU_WIN_T * stride * 4);
        cu_win_plan p;
        memset(&p, 0, sizeof(p));
        for (uint32_t t = 0; t < CU_WIN_T; t++) p.x[CU_WIN_T - 1 - t] = a.d.f + (size_t)t * n; /* any rows, any order */
        ds4_err err = {};
        if (cu_win_add(&p, &w.d, rows, win, stride, &err) || cu_win_run(&p, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        for (uint32_t t = 0; t < CU_WIN_T; t++) {
            dact x = a.d;
            x.f = a.d.f + (size_t)(CU_WIN_T - 1 - t) * n;
            gemv_plan g;
            memset(&g, 0, sizeof(g));
            cu_gemv_add(&g, &w.d, 0, NULL, 0, 0, rows, &x, 0, one + t * stride);
            if (cu_gemv_run(&g, st, &err)) {
                printf("FAIL: %s\n", ds4_err_msg(&err));
                exit(1);
            }
        }
        CU(cudaStreamSynchronize(st));
        std::vector<float> got(CU_WIN_T * stride), want(CU_WIN_T * stride);
        CU(cudaMemcpy(got.data(), win, got.size() * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(want.data(), one, want.size() * 4, cudaMemcpyDeviceToHost));
        uint32_t differ = 0, untouched = 0;
        double worst = 0;
        for (uint32_t t = 0; t < CU_WIN_T; t++) {
            for (uint32_t r = 0; r < rows; r++) {
                differ += memcmp(&got[t * stride + r], &want[t * stride + r], 4) != 0;
                double ref, mag;
                reference(w, a, 0, r, CU_WIN_T - 1 - t, 0, &ref, &mag);
                note_err(worst, fabs(got[t * stride + r] - ref) / (mag + 1e-30));
            }
            for (uint32_t r = rows; r < stride; r++) untouched += std::isnan(got[t * stride + r]);
        }
        printf("gemv %-8s window of %u tokens, %u of %u values differ from one-token products, error %.2g\n",
               tname(type), CU_WIN_T, differ, CU_WIN_T * rows, worst);
        CHECK(differ == 0 && worst <= 2e-6, "window gemv %s: %u values differ, error %.3g", tname(type), differ, worst);
        CHECK(untouched == CU_WIN_T * (stride - rows), "window gemv %s wrote past its rows", tname(type));
        cudaFree(win);
        cudaFree(one);
        cudaFree((void *)w.d.p);
        free_act(a);
    }
    /* rows whose parts are not whole 16-byte loads: refused, not misread */
    wt_pair w;
    make_weights(w, DS4_TYPE_F16, 96, 4, 1);
    cu_win_plan p;
    memset(&p, 0, sizeof(p));
    ds4_err err = {};
    CHECK(cu_win_add(&p, &w.d, 4, NULL, 4, &err) != 0 && err.code == DS4_EINVAL && strstr(ds4_err_msg(&err), "window"),
          "a window product of 96-value rows was accepted: '%s'", ds4_err_msg(&err));
    cudaFree((void *)w.d.p);
}

static void check_products(cudaStream_t st) {
    const uint32_t types[] = {DS4_TYPE_F32,  DS4_TYPE_F16,  DS4_TYPE_BF16,   DS4_TYPE_Q8_0,
                              DS4_TYPE_Q2_K, DS4_TYPE_Q4_K, DS4_TYPE_IQ2_XXS};
    ds4_err err = {};
    for (uint32_t type : types) {
        bool kq = type == DS4_TYPE_Q2_K || type == DS4_TYPE_Q4_K || type == DS4_TYPE_IQ2_XXS;
        uint32_t n = kq ? 768 : 864, rows = 141, mats = 3, T = 70, off = kq ? 256 : 96, an = n + off;
        wt_pair w;
        make_weights(w, type, n, rows, mats);
        act_pair a;
        make_act(a, an, T, st);
        float *out = dalloc<float>((size_t)T * rows);
        std::vector<float> got((size_t)T * rows);
        double worst = 0;

        /* gemv: matrix 2, rows 5.., activation offset `off`, token 0 */
        dset(out, 0xFF, (size_t)T * rows * 4);
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, &w.d, 2, NULL, 0, 5, rows - 5, &a.d, off, out);
        if (cu_gemv_run(&p, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        CU(cudaMemcpy(got.data(), out, (rows - 5) * 4, cudaMemcpyDeviceToHost));
        for (uint32_t r = 0; r < rows - 5; r++) {
            double ref, mag;
            reference(w, a, 2, 5 + r, 0, off, &ref, &mag);
            double e = fabs(got[r] - ref) / (mag + 1e-30);
            note_err(worst, e);
        }
        printf("gemv %-8s max error %.2g of the terms' magnitude\n", tname(type), worst);
        CHECK(worst <= 2e-6, "gemv %s: error %.3g", tname(type), worst);

        /* gemm: matrix 1, rows 3.., activation offset, T tokens, strided out */
        worst = 0;
        dset(out, 0xFF, (size_t)T * rows * 4);
        if (cu_gemm(&w.d, 1, 3, rows - 3, &a.d, off, T, out, rows, NULL, split_scratch(), st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        CU(cudaMemcpy(got.data(), out, (size_t)T * rows * 4, cudaMemcpyDeviceToHost));
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t r = 0; r < rows - 3; r++) {
                double ref, mag;
                reference(w, a, 1, 3 + r, t, off, &ref, &mag);
                double e = fabs(got[(size_t)t * rows + r] - ref) / (mag + 1e-30);
                note_err(worst, e);
            }
        printf("gemm %-8s max error %.2g of the terms' magnitude\n", tname(type), worst);
        CHECK(worst <= 2e-6, "gemm %s: error %.3g", tname(type), worst);

        /* the same for a few tokens (CU_FEW_PASS at most: Q8_0 and float
         * rows take the few-token kernels, past CU_FEW_T in chunks), each
         * token's outputs those of a one-token gemv of it, bit for bit,
         * where a few-token kernel runs */
        bool few_kernel = !kq;
        for (uint32_t few : {1u, 5u, (uint32_t)CU_FEW_T, 19u}) {
            worst = 0;
            uint32_t mism = 0;
            dset(out, 0xFF, (size_t)T * rows * 4);
            if (cu_gemm(&w.d, 1, 3, rows - 3, &a.d, off, few, out, rows, NULL, split_scratch(), st, &err)) {
                printf("FAIL: %s\n", ds4_err_msg(&err));
                exit(1);
            }
            CU(cudaStreamSynchronize(st));
            CU(cudaMemcpy(got.data(), out, (size_t)T * rows * 4, cudaMemcpyDeviceToHost));
            float *one = dalloc<float>(rows);
            std::vector<float> g1(rows);
            for (uint32_t t = 0; t < few; t++) {
                gemv_plan q;
                memset(&q, 0, sizeof(q));
                dact at = a.d; /* token t's row */
                at.f = a.d.f ? a.d.f + (size_t)t * a.d.fs : NULL;
                at.q8 = a.d.q8 ? a.d.q8 + (size_t)t * a.d.q8s : NULL;
                at.qk = a.d.qk ? a.d.qk + (size_t)t * a.d.qks : NULL;
                cu_gemv_add(&q, &w.d, 1, NULL, 0, 3, rows - 3, &at, off, one);
                if (cu_gemv_run(&q, st, &err)) {
                    printf("FAIL: %s\n", ds4_err_msg(&err));
                    exit(1);
                }
                CU(cudaStreamSynchronize(st));
                CU(cudaMemcpy(g1.data(), one, (rows - 3) * 4, cudaMemcpyDeviceToHost));
                for (uint32_t r = 0; r < rows - 3; r++) {
                    double ref, mag;
                    reference(w, a, 1, 3 + r, t, off, &ref, &mag);
                    note_err(worst, fabs(got[(size_t)t * rows + r] - ref) / (mag + 1e-30));
                    mism += few_kernel && memcmp(&got[(size_t)t * rows + r], &g1[r], 4) != 0;
                }
            }
            cudaFree(one);
            printf("gemm %-8s %u tokens, max error %.2g of the terms' magnitude, %u outputs unlike the gemv's\n",
                   tname(type), few, worst, mism);
            CHECK(worst <= 2e-6 && mism == 0, "gemm %s of %u tokens: error %.3g, %u unlike the gemv", tname(type), few,
                  worst, mism);
        }

        /* grouped gemm: entries (token*2 + slot) in expert order, two tiles */
        std::vector<int> perm, tmat, tstart, tcount;
        for (int e = 0; e < 3; e++) {
            int start = (int)perm.size();
            for (uint32_t i = 0; i < T; i++)
                if ((i * 7 + e) % 3 == 0) perm.push_back((int)i);
            for (int s0 = start; s0 < (int)perm.size(); s0 += 64) {
                tmat.push_back(e);
                tstart.push_back(s0);
                tcount.push_back((int)perm.size() - s0 < 64 ? (int)perm.size() - s0 : 64);
            }
        }
        int nt = (int)tmat.size();
        int *dp = dalloc<int>(perm.size()), *dm = dalloc<int>(nt), *ds = dalloc<int>(nt), *dc = dalloc<int>(nt),
            *dn = dalloc<int>(1);
        CU(cudaMemcpy(dp, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dm, tmat.data(), nt * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(ds, tstart.data(), nt * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dc, tcount.data(), nt * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dn, &nt, 4, cudaMemcpyHostToDevice));
        cu_group g = {dm, ds, dc, dn, (uint32_t)nt + 2, dp, 2};
        dset(out, 0xFF, (size_t)T * rows * 4);
        if (cu_gemm(&w.d, 0, 0, rows, &a.d, 0, 0, out, rows, &g, NULL, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        CU(cudaMemcpy(got.data(), out, (size_t)T * rows * 4, cudaMemcpyDeviceToHost));
        worst = 0;
        for (int e = 0, i = 0; e < 3; e++)
            for (uint32_t tok = 0; tok < T; tok++) {
                if ((tok * 7 + e) % 3) continue;
                int entry = perm[i++];
                for (uint32_t r = 0; r < rows; r += 7) {
                    double ref, mag;
                    reference(w, a, (uint32_t)e, r, (uint32_t)entry / 2, 0, &ref, &mag);
                    double v = got[(size_t)entry * rows + r];
                    double err2 = fabs(v - ref) / (mag + 1e-30);
                    note_err(worst, err2);
                }
            }
        printf("gemm %-8s grouped, max error %.2g\n", tname(type), worst);
        CHECK(worst <= 2e-6, "grouped gemm %s: error %.3g", tname(type), worst);
        cudaFree(dp);
        cudaFree(dm);
        cudaFree(ds);
        cudaFree(dc);
        cudaFree(dn);
        cudaFree(out);
        cudaFree((void *)w.d.p);
        free_act(a);
    }
}

/* mode 0: FP8 round trip of 448 values; 1: QAT of 128 (a block); 2: f16
 * rounding; 3: QAT of 128 held by one warp, four values a lane. */
static __global__ void lowprec_kernel(float *x, uint32_t n, int mode) {
    DS4_DYN_SMEM(float, v);
    float *row = x + (size_t)blockIdx.x * n;
    if (mode == 3) {
        if (threadIdx.x >= 32) return;
        float w[4];
        for (int i = 0; i < 4; i++) w[i] = row[4 * threadIdx.x + i];
        warp_qat128(w);
        for (int i = 0; i < 4; i++) row[4 * threadIdx.x + i] = w[i];
        return;
    }
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = row[i];
    __syncthreads();
    if (mode == 0) block_fp8_roundtrip(v, n);
    else if (mode == 1) block_qat128(v);
    else
        for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) v[i] = dev_f16_round(v[i]);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) row[i] = v[i];
}

/* Grid midpoints: a block whose amax fixes the scale at 2^-3 and whose other
 * values sit exactly halfway between neighbouring E4M3 magnitudes. */
static void fp8_ties(float *x, uint32_t n) {
    float mag[127];
    for (int i = 0; i < 127; i++) {
        int e = i >> 3, m = i & 7;
        mag[i] = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + m / 8.0f, e - 7);
    }
    for (uint32_t b = 0; b < n / 64; b++) {
        x[64 * b] = 448.0f / 8.0f;
        for (int i = 1; i < 64; i++) {
            int k = (int)((b * 64 + i) * 37 % 126);
            float mid = 0.5f * (mag[k] + mag[k + 1]);
            x[64 * b + i] = (i & 1 ? -mid : mid) / 8.0f;
        }
    }
}

static void check_lowprec(cudaStream_t st) {
    const uint32_t rows = 64;
    for (int mode = 0; mode < 4; mode++) {
        uint32_t n = mode == 1 || mode == 3 ? 128 : 448;
        std::vector<float> h((size_t)rows * n), ref;
        for (uint32_t r = 0; r < rows; r++) {
            float scale = ldexpf(1.0f, (int)(r % 24) - 12);
            for (uint32_t i = 0; i < n; i++) h[(size_t)r * n + i] = frand() * scale;
        }
        if (mode == 0) fp8_ties(h.data(), n);           /* row 0: exact ties */
        if (mode == 2) h[5] = 1.0f + ldexpf(1.0f, -11); /* an f16 tie */
        ref = h;
        for (uint32_t r = 0; r < rows; r++) {
            float *x = &ref[(size_t)r * n];
            if (mode == 0) ds4_fp8_kv_roundtrip(x, n);
            else if (mode == 1 || mode == 3) ds4_indexer_qat_row(x);
            else ds4_f16_round_row(x, n);
        }
        float *d = dalloc<float>(h.size());
        CU(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        DS4_LAUNCH(lowprec_kernel, rows, 128, n * sizeof(float), st, d, n, mode);
        CU(cudaGetLastError());
        CU(cudaStreamSynchronize(st));
        std::vector<float> got(h.size());
        CU(cudaMemcpy(got.data(), d, got.size() * 4, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); i++) bad += memcmp(&got[i], &ref[i], 4) != 0;
        const char *names[] = {"FP8 KV round trip", "Hadamard + FP4", "f16 rounding", "Hadamard + FP4, warp"};
        printf("%-20s %zu of %zu values differ from lowprec.c\n", names[mode], bad, got.size());
        CHECK(bad == 0, "%s differs from the CPU", names[mode]);
        cudaFree(d);
    }
}

/* Rows of hd values, RMS-normalised like the KV rows; with `sim` as the
 * simulations store them: raw rows through binary16, compressed rows
 * through FP8 before the RoPE tail (and f32 in it). */
/* RoPE over the last rope_dim values of a row, base 10000. */
static ds4_rope test_rope(uint32_t rope_dim) {
    ds4_rope rope;
    memset(&rope, 0, sizeof(rope));
    rope.n_pairs = rope_dim / 2;
    for (uint32_t k = 0; k < rope.n_pairs; k++) rope.inv_freq[k] = powf(10000.0f, -2.0f * (float)k / (float)rope_dim);
    return rope;
}

static void attn_rows_make(std::vector<float> &v, uint32_t n, uint32_t hd, uint32_t tail0, bool sim, bool comp) {
    v.resize((size_t)n * hd);
    for (uint32_t r = 0; r < n; r++) {
        float *x = &v[(size_t)r * hd];
        double ss = 0.0;
        for (uint32_t i = 0; i < hd; i++) {
            x[i] = frand();
            ss += (double)x[i] * x[i];
        }
        float s = (float)(1.0 / sqrt(ss / hd));
        for (uint32_t i = 0; i < hd; i++) x[i] *= s;
        if (sim && comp) ds4_fp8_kv_roundtrip(x, tail0);
        if (sim && !comp)
            for (uint32_t i = 0; i < hd; i++) x[i] = ds4_f16_round(x[i]);
    }
}

/* One attention pass (cu_attn_run) of T queries at positions pos0.. over
 * a raw window (rows before pos0 in the ring, the pass's own in kvbuf) and
 * compressed rows listed per query (ratio 4), with sinks, against a
 * double-precision softmax and the inverse key RoPE on the host: the
 * tensor-core kernel (long prefill passes, from the queries as projected:
 * it normalises and RoPEs them itself) and the warp-per-heads one, 64 heads (one tensor-core block) and 20 (a partial one), rows as the
 * simulations store them (the tensor-core kernel's binary16 operands and,
 * for the RoPE tail of compressed rows, head and tail) and as f32 (head
 * and tail everywhere). */
static void check_attention(cudaStream_t st) {
    const uint32_t hd = 512, rope_dim = 64, tail0 = hd - rope_dim, window = 128, top_k = 64, ncomp = 90, T = 24,
                   pos0 = 200;
    ds4_rope rope = test_rope(rope_dim);
    std::vector<uint32_t> vis((size_t)T * top_k, 0), nvis(T);
    for (uint32_t t = 0; t < T; t++) {
        nvis[t] = std::min(30 + (t * 7) % 34, (pos0 + t + 1) / 4); /* no more than its complete windows */
        std::vector<uint32_t> all(ncomp);
        for (uint32_t i = 0; i < ncomp; i++) all[i] = i;
        for (uint32_t i = 0; i < ncomp; i++)
            std::swap(all[i], all[i + (uint32_t)(frand() * 1e6f + 5e6f) % (ncomp - i)]);
        std::sort(all.begin(), all.begin() + nvis[t]);
        for (uint32_t i = 0; i < nvis[t]; i++) vis[(size_t)t * top_k + i] = all[i];
    }
    for (uint32_t n_head : {64u, 20u})
        for (int sim = 1; sim >= 0; sim--) {
            std::vector<float> q((size_t)T * n_head * hd), ring, kv, comp, sinks(n_head);
            attn_rows_make(q, T * n_head, hd, tail0, false, false); /* RMS-normalised, as q_post leaves them */
            /* and as projected, for the tensor-core kernel, which does the q
             * post itself: each head's tail RoPE undone and the head scaled,
             * so that the RMSNorm and RoPE give q back (within a few float
             * roundings) */
            std::vector<float> qraw(q);
            for (uint32_t t = 0; t < T; t++)
                for (uint32_t h = 0; h < n_head; h++) {
                    float *x = &qraw[((size_t)t * n_head + h) * hd],
                          sc = 0.5f + fabsf(frand()); /* > 0: a sign would flip q */
                    ds4_rope_apply(&rope, x + tail0, pos0 + t, true);
                    for (uint32_t i = 0; i < hd; i++) x[i] *= sc;
                }
            attn_rows_make(ring, window, hd, tail0, sim, false);
            attn_rows_make(kv, T, hd, tail0, sim, false);
            attn_rows_make(comp, ncomp, hd, tail0, sim, true);
            for (float &v : sinks) v = frand();
            attn_args a;
            memset(&a, 0, sizeof(a));
            uint32_t *dpos = dcopy(&pos0, 1), *dvis = dcopy(vis), *dnvis = dcopy(nvis);
            float *dq = dcopy(q), *dqraw = dcopy(qraw), *dring = dcopy(ring), *dkv = dcopy(kv), *dcomp = dcopy(comp),
                  *dsinks = dcopy(sinks);
            float *dout = dalloc<float>((size_t)T * n_head * hd);
            a.pos0 = dpos;
            a.q = dq;
            a.kvbuf = dkv;
            a.ring = dring;
            a.comp = dcomp;
            a.vis = dvis;
            a.nvis = dnvis;
            a.sinks = dsinks;
            a.n_head = n_head;
            a.hd = hd;
            a.window = window;
            a.raw_cap = window;
            a.ratio = 4;
            a.top_k = top_k;
            a.nsplit = 1;
            a.rope_dim = rope_dim;
            a.rope = rope;
            a.heads.f = dout;
            a.heads.fs = n_head * hd;
            a.heads.n = n_head * hd;
            a.tc_comp0 = window + T; /* the tensor-core kernel's split rows: ring, pass, compressed */
            a.tc_nrows = a.tc_comp0 + ncomp;
            a.tc_rows = dalloc<float>(cu_attn_tc_floats(hd, a.tc_nrows));
            /* the host's answer */
            std::vector<float> want((size_t)T * n_head * hd);
            for (uint32_t t = 0; t < T; t++) {
                uint32_t p = pos0 + t, first = p + 1 > window ? p + 1 - window : 0;
                std::vector<const float *> rows;
                for (uint32_t r = first; r <= p; r++)
                    rows.push_back(r >= pos0 ? &kv[(size_t)(r - pos0) * hd] : &ring[(size_t)(r % window) * hd]);
                for (uint32_t i = 0; i < nvis[t]; i++) rows.push_back(&comp[(size_t)vis[(size_t)t * top_k + i] * hd]);
                for (uint32_t h = 0; h < n_head; h++) {
                    const float *qh = &q[((size_t)t * n_head + h) * hd];
                    std::vector<double> s(rows.size());
                    double M = sinks[h];
                    for (size_t j = 0; j < rows.size(); j++) {
                        double d = 0.0;
                        for (uint32_t i = 0; i < hd; i++) d += (double)qh[i] * rows[j][i];
                        s[j] = d / sqrt((double)hd);
                        M = std::max(M, s[j]);
                    }
                    double den = exp(sinks[h] - M);
                    std::vector<double> o(hd, 0.0);
                    for (size_t j = 0; j < rows.size(); j++) {
                        double e = exp(s[j] - M);
                        den += e;
                        for (uint32_t i = 0; i < hd; i++) o[i] += e * rows[j][i];
                    }
                    float *w = &want[((size_t)t * n_head + h) * hd];
                    for (uint32_t i = 0; i < hd; i++) w[i] = (float)(o[i] / den);
                    ds4_rope_apply(&rope, w + tail0, p, true);
                }
            }
            /* the tensor-core kernel, then the heads kernel with one split and
             * with the rows split over three blocks a head group (as a decode
             * step splits them; the last block merges) */
            const uint32_t nsplit =
                3; /* scratch for head groups of any size (a group's part: its heads' values, m, l) */
            float *dpart = dalloc<float>((size_t)T * (n_head + 1) * nsplit * (2 + hd));
            uint32_t *dcount = dalloc<uint32_t>((size_t)T * n_head);
            dset(dcount, 0, (size_t)T * n_head * sizeof(uint32_t));
            a.part = dpart;
            a.count = dcount;
            for (int run = 0; run < 3; run++) {
                bool tc = run == 0;
                a.nsplit = run == 2 ? nsplit : 1;
                a.q = tc ? dqraw : dq; /* the tensor-core kernel does its q post */
                a.q_eps = 1e-6f;
                dset(dout, 0xFF, (size_t)T * n_head * hd * 4);
                ds4_err err = {};
                if (cu_attn_run(&a, T, tc, st, &err)) {
                    printf("FAIL: %s\n", ds4_err_msg(&err));
                    exit(1);
                }
                CU(cudaStreamSynchronize(st));
                std::vector<float> got(want.size());
                CU(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
                double worst = 0.0;
                for (size_t i = 0; i < got.size(); i++) {
                    double e = fabs((double)got[i] - want[i]);
                    note_err(worst, e);
                }
                printf("attention %s %2u heads, rows %s, %u split%s  max error %.2g (values ~1)\n",
                       tc ? "tc   " : "heads", n_head, sim ? "as simulated" : "f32         ", a.nsplit,
                       a.nsplit > 1 ? "s" : " ", worst);
                CHECK(worst <= 1e-5, "attention (%s, %u heads, %s rows, %u splits): error %.3g",
                      tc ? "tensor cores" : "heads", n_head, sim ? "simulated" : "f32", a.nsplit, worst);
            }
            cudaFree(dpart);
            cudaFree(dcount);
            cudaFree(a.tc_rows);
            cudaFree(dpos);
            cudaFree(dvis);
            cudaFree(dnvis);
            cudaFree(dq);
            cudaFree(dqraw);
            cudaFree(dring);
            cudaFree(dkv);
            cudaFree(dcomp);
            cudaFree(dsinks);
            cudaFree(dout);
        }
}

/* The ratio-128 compressor's pooling in batches of loads (prefill) against
 * the candidate-by-candidate pooling it replaced: the same bits, for
 * windows wholly in the pass and for one that begins in the frontier left
 * by an earlier pass (pos0 = 64: window 0 takes its first 64 positions
 * from the frontier, so it pools unbatched in both runs); F32 and F16
 * positional biases; simulations on (the FP8 round trip of the rows). */
/* Passes of a prefill (T tokens from pos) and windows of a deferred
 * layer's closing decode step at pos (the pass `back` before it), whose
 * positions below fold are the frontier's. */
struct emit_case {
    uint32_t pos, T, back;
    int fold; /* < 0: none */
};

static void check_comp_emit(cudaStream_t st) {
    const uint32_t ratio = 128, hd = 512, width = hd, rope_dim = 64;
    const emit_case cases[] = {{0, 300, 0, -1}, {64, 300, 0, -1}, {255, 128, 127, 128}, {255, 128, 127, 178}};
    ds4_rope rope = test_rope(rope_dim);
    std::vector<float> unfolded[2]; /* the window's rows with no position folded, by ape type */
    uint64_t resume = 0;
    for (const emit_case &cs : cases)
        for (uint32_t ape_type : {(uint32_t)DS4_TYPE_F32, (uint32_t)DS4_TYPE_F16}) {
            uint32_t T = cs.T, pos0 = cs.pos - cs.back;
            if (cs.fold >= 0) { /* the same data for every fold; the later tests' as before these cases */
                if (!resume) resume = rng;
                rng = 0x9E3779B97F4A7C15ull + ape_type;
            }
            std::vector<float> frontier((size_t)ratio * width), fscore((size_t)ratio * width), kv((size_t)T * width),
                gate((size_t)T * width), ape((size_t)ratio * width), norm(hd);
            for (auto &v : frontier) v = frand();
            for (auto &v : fscore) v = frand();
            for (auto &v : kv) v = frand();
            for (auto &v : gate) v = frand() * 2.0f;
            for (auto &v : ape) v = ds4_f16_round(frand()); /* exact in either type */
            for (auto &v : norm) v = 1.0f + 0.1f * frand();
            std::vector<uint16_t> ape16(ape.size());
            for (size_t i = 0; i < ape.size(); i++) ape16[i] = ds4_f32_to_f16(ape[i]);
            uint32_t nwin = (pos0 + T) / ratio - pos0 / ratio;
            float *dskv = dcopy(frontier), *dssc = dcopy(fscore), *dkv = dcopy(kv), *dgate = dcopy(gate),
                  *dnorm = dcopy(norm);
            uint8_t *dape = ape_type == DS4_TYPE_F32 ? (uint8_t *)dcopy(ape) : (uint8_t *)dcopy(ape16);
            uint32_t *dpos = dcopy(&cs.pos, 1), fold = cs.fold < 0 ? 0 : (uint32_t)cs.fold;
            uint32_t *dfold = dcopy(&fold, 1);
            float *drows = dalloc<float>((size_t)(pos0 / ratio + nwin + 1) * hd);
            comp_args a;
            memset(&a, 0, sizeof(a));
            comp_lane &L = a.lane[0];
            L.skv = dskv;
            L.ssc = dssc;
            L.ckv = dkv;
            L.cgate = dgate;
            L.ape = dape;
            L.ape_type = ape_type;
            L.norm = (const uint8_t *)dnorm;
            L.norm_type = DS4_TYPE_F32;
            L.rows = drows;
            L.hd = hd;
            L.width = width;
            L.ratio = ratio;
            a.n_lanes = 1;
            a.T = T;
            a.rope_dim = rope_dim;
            a.pos0 = dpos;
            a.back = cs.back;
            a.fold = cs.fold < 0 ? NULL : dfold;
            a.pos_early = cs.pos != 0; /* read before the PDL wait, as in a decode graph */
            a.rope = rope;
            a.eps = 1e-6f;
            a.sim = true;
            std::vector<float> got[2];
            size_t nrows = (size_t)(pos0 / ratio + nwin + 1) * hd;
            for (int batched = 0; batched < 2; batched++) {
                dset(drows, 0xFF, nrows * sizeof(float));
                ds4_err err = {};
                if (cu_comp_emit(&a, nwin, batched, st, &err)) {
                    printf("FAIL: %s\n", ds4_err_msg(&err));
                    exit(1);
                }
                CU(cudaStreamSynchronize(st));
                got[batched].resize(nrows);
                CU(cudaMemcpy(got[batched].data(), drows, got[batched].size() * sizeof(float), cudaMemcpyDeviceToHost));
            }
            /* rows pos0 / ratio .. of the windows that closed; the row after them untouched (NaN) */
            uint32_t w0 = pos0 / ratio, closed = (pos0 + T) / ratio - w0, differ = 0, finite = 0;
            for (size_t i = (size_t)w0 * hd; i < (size_t)(w0 + closed) * hd; i++) {
                differ += memcmp(&got[0][i], &got[1][i], sizeof(float)) != 0;
                finite += std::isfinite(got[1][i]);
            }
            printf("compressor ratio 128, pass at %3u, fold %4d, ape %s  %u windows, %u of %u values differ\n", pos0,
                   cs.fold, ape_type == DS4_TYPE_F32 ? "f32" : "f16", closed, differ, closed * hd);
            CHECK(differ == 0 && finite == closed * hd,
                  "batched compressor pooling (pos0 %u): %u values differ, %u finite", pos0, differ, finite);
            CHECK(std::isnan(got[1][(size_t)(w0 + closed) * hd]), "batched compressor pooling wrote past its windows");
            if (cs.fold >= 0) { /* the frontier's rows must change the window's row */
                std::vector<float> row(got[1].begin() + (size_t)w0 * hd, got[1].begin() + (size_t)(w0 + 1) * hd);
                std::vector<float> &base = unfolded[ape_type == DS4_TYPE_F16];
                if (cs.fold == (int)pos0) base = row;
                else
                    CHECK(!base.empty() && memcmp(base.data(), row.data(), hd * sizeof(float)) != 0,
                          "a window folded up to %d pooled as one folded nowhere", cs.fold);
            }
            cudaFree(dskv);
            cudaFree(dssc);
            cudaFree(dkv);
            cudaFree(dgate);
            cudaFree(dnorm);
            cudaFree(dape);
            cudaFree(dpos);
            cudaFree(dfold);
            cudaFree(drows);
        }
    rng = resume;
}

static void check_idx_scores(cudaStream_t st, bool tc, uint32_t T) {
    const uint32_t ihd = 128;
    {
        ds4_err err = {};
        int rc = cu_idx_scores(NULL, false, NULL, NULL, NULL, T, 1000, 65, ihd, 8, NULL, 1000, tc, st, &err);
        CHECK(rc != 0 && err.code == DS4_EUNSUPPORTED && strstr(ds4_err_msg(&err), "65 x 128"),
              "65 indexer heads: rc %d, \"%s\"", rc, ds4_err_msg(&err));
    }
    /* heads, n0, top-k, spare: query t has (4 n0 - 1 + t) / 4 rows (n0 - 1,
     * n0, n0); the first query of the second case has 512, so it is not
     * scored.  The grid is sized for spare times the rows there are, as a
     * decode step's for the session's last position.  The SIMT kernel's
     * blocks take 1 row a thread up to 4096 rows, then 2, 3 and 4 (the last
     * three cases). */
    const uint32_t cases[][4] = {{64, 1500, 512, 1}, {64, 513, 512, 1}, {8, 70, 8, 1},      {64, 1500, 512, 6},
                                 {64, 3000, 512, 3}, {8, 8000, 512, 2}, {8, 12000, 512, 1}, {8, 16400, 512, 1}};
    for (const auto &cs : cases) {
        uint32_t heads = cs[0], n0 = cs[1], k = cs[2], pos0 = 4 * n0 - 2, nmax = (pos0 + T) / 4, stride = nmax + 5;
        uint32_t grid_nc = cs[3] * nmax;
        std::vector<float> q((size_t)T * heads * ihd), w((size_t)T * heads), rows((size_t)nmax * ihd);
        for (float &v : q) v = frand();
        for (float &v : w) v = frand();
        for (float &v : rows) v = frand();
        float *dq = dcopy(q), *dw = dcopy(w), *dr = dcopy(rows), *ds = dalloc<float>((size_t)T * stride);
        uint32_t *dpos = dcopy(&pos0, 1);
        dset(ds, 0xFF, (size_t)T * stride * 4); /* NaN: rows not scored must stay so */
        ds4_err err = {};
        bool early = !tc && (&cs - cases) % 2; /* a decode graph's early position (the tc kernel is prefill's) */
        if (cu_idx_scores(dpos, early, dq, dw, dr, T, grid_nc, heads, ihd, k, ds, stride, tc, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        std::vector<float> got((size_t)T * stride);
        CU(cudaMemcpy(got.data(), ds, got.size() * 4, cudaMemcpyDeviceToHost));
        double worst = 0.0;
        size_t stray = 0;
        for (uint32_t t = 0; t < T; t++) {
            uint32_t nc = (pos0 + t + 1) / 4;
            for (uint32_t c = 0; c < stride; c++) {
                float g = got[(size_t)t * stride + c];
                if (c >= nc || nc <= k) {
                    stray += !std::isnan(g);
                    continue;
                }
                double ref = 0.0, mag = 0.0;
                for (uint32_t h = 0; h < heads; h++) {
                    double dot = 0.0, dmag = 0.0;
                    for (uint32_t d = 0; d < ihd; d++) {
                        double p = (double)q[((size_t)t * heads + h) * ihd + d] * rows[(size_t)c * ihd + d];
                        dot += p;
                        dmag += fabs(p);
                    }
                    ref += w[(size_t)t * heads + h] * (dot > 0.0 ? dot : 0.0);
                    mag += fabs(w[(size_t)t * heads + h]) * dmag;
                }
                double e = fabs(g - ref) / (mag > 0.0 ? mag : 1.0);
                note_err(worst, e);
            }
        }
        printf(
            "idx scores %s T %u, %2u heads, %4u rows (grid for %5u)  max error %.2g of the terms' magnitude, %zu stray writes\n",
            tc ? "tc  " : "simt", T, heads, n0, grid_nc, worst, stray);
        CHECK(worst <= 1e-5 && stray == 0, "indexer scores (%s), %u heads, %u rows", tc ? "tensor cores" : "SIMT",
              heads, n0);
        cudaFree(dq);
        cudaFree(dw);
        cudaFree(dr);
        cudaFree(ds);
        cudaFree(dpos);
    }
}

/* Products fused into one launch as a decode step fuses them: routed
 * matrices picked by a device selection (odd row counts, rows of two
 * 16-block chunks), next to fixed ones of other types, each segment with
 * its own activation.  Run as one mixed launch and as launches of the
 * type sets that have kernels of their own (IQ2_XXS alone, the light
 * types with Q2_K).  The IQ2_XXS launch's segments have equal block
 * counts, so its blocks find their segment by a division; the others'
 * walk the plan. */
struct fused_seg {
    uint32_t type, n, rows, mats, mat, slot;
    bool routed;
};

static void check_fused_gemv(cudaStream_t st) {
    const fused_seg segs[] = {
        {DS4_TYPE_IQ2_XXS, 4352, 37, 3, 0, 0, true}, {DS4_TYPE_IQ2_XXS, 4352, 37, 3, 0, 1, true},
        {DS4_TYPE_Q2_K, 512, 20, 2, 0, 2, true},     {DS4_TYPE_Q8_0, 864, 45, 2, 1, 0, false},
        {DS4_TYPE_F16, 256, 9, 1, 0, 0, false},
    };
    const int nseg = (int)(sizeof(segs) / sizeof(segs[0]));
    const int sel_h[3] = {2, 0, 1};
    int *sel = dcopy(sel_h, 3);
    wt_pair w[nseg];
    act_pair a[nseg];
    float *out[nseg];
    for (int i = 0; i < nseg; i++) {
        make_weights(w[i], segs[i].type, segs[i].n, segs[i].rows, segs[i].mats);
        make_act(a[i], segs[i].n, 1, st);
        out[i] = dalloc<float>(segs[i].rows + 1);
    }
    const char *launches[] = {"all types", "iq2_xxs alone", "q2_k, q8_0, f16"};
    for (int l = 0; l < 3; l++) {
        bool in[nseg];
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        for (int i = 0; i < nseg; i++) {
            bool iq2 = segs[i].type == DS4_TYPE_IQ2_XXS;
            in[i] = l == 0 || (l == 1) == iq2;
            if (!in[i]) continue;
            dset(out[i], 0xFF, (segs[i].rows + 1) * 4);
            cu_gemv_add(&p, &w[i].d, segs[i].mat, segs[i].routed ? sel : NULL, segs[i].slot, 0, segs[i].rows, &a[i].d,
                        0, out[i]);
        }
        uint32_t seg_blocks = cu_gemv_seg_blocks(&p);
        CHECK((l == 1) == (seg_blocks != 0), "fused gemv (%s): %u blocks a segment", launches[l], seg_blocks);
        CHECK(!cu_gemv_streamed(&p), "fused gemv (%s): streamed", launches[l]);
        ds4_err err = {};
        if (cu_gemv_run(&p, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        double worst = 0;
        int guards = 0;
        for (int i = 0; i < nseg; i++) {
            if (!in[i]) continue;
            std::vector<float> got(segs[i].rows + 1);
            CU(cudaMemcpy(got.data(), out[i], got.size() * 4, cudaMemcpyDeviceToHost));
            uint32_t mat = segs[i].routed ? (uint32_t)sel_h[segs[i].slot] : segs[i].mat;
            for (uint32_t r = 0; r < segs[i].rows; r++) {
                double ref, mag;
                reference(w[i], a[i], mat, r, 0, 0, &ref, &mag);
                double e = fabs(got[r] - ref) / (mag + 1e-30);
                note_err(worst, e);
            }
            uint32_t guard;
            memcpy(&guard, &got[segs[i].rows], 4);
            guards += guard != 0xFFFFFFFFu;
        }
        printf("gemv fused, %-16s max error %.2g of the terms' magnitude\n", launches[l], worst);
        CHECK(worst <= 2e-6 && guards == 0, "fused gemv (%s): error %.3g, %d segments written past their rows",
              launches[l], worst, guards);
    }
    for (int i = 0; i < nseg; i++) {
        cudaFree(out[i]);
        cudaFree((void *)w[i].d.p);
        cudaFree(a[i].d.f);
        cudaFree(a[i].d.q8);
        cudaFree(a[i].d.qk);
    }
    cudaFree(sel);
}

/* Token t's row of activation a (the forms it has). */
static dact act_at(const dact &a, uint32_t t) {
    dact v = a;
    v.f = a.f ? a.f + (size_t)t * a.fs : NULL;
    v.q8 = a.q8 ? a.q8 + (size_t)t * a.q8s : NULL;
    v.qk = a.qk ? a.qk + (size_t)t * a.qks : NULL;
    return v;
}

/* Plans of several tokens against one-token plans of each, bit for bit:
 * a few tokens of dense rows (Q8_0 from a row and a value offset, split
 * F16 and BF16 rows, F32 rows a warp each; every output strided past its
 * rows, the gap left alone), and reps of selected experts (IQ2_XXS of one
 * activation row a token, Q2_K of two, an expert on the host written
 * nowhere); a few-token plan of K-quant rows is refused. */
static void check_token_plans(cudaStream_t st) {
    struct tseg {
        uint32_t type, n, rows, mats, mat, row0, off;
    };
    const tseg dense[] = {{DS4_TYPE_Q8_0, 864, 45, 2, 1, 3, 32},
                          {DS4_TYPE_F16, 1024, 20, 1, 0, 0, 0},
                          {DS4_TYPE_F32, 864, 9, 1, 0, 0, 0},
                          {DS4_TYPE_BF16, 512, 33, 2, 1, 1, 64}};
    const int nd = 4;
    ds4_err err = {};
    /* a kernel each count up to CU_FEW_T, then passes in chunks (the last
     * one shorter at 9, 17, 40); a token past the pass's is written
     * nowhere (8 rows of outputs past them checked) */
    const uint32_t counts[] = {2, 3, 4, 5, 6, 7, 8, 9, 12, 17, 40, CU_FEW_PASS};
    for (uint32_t T : counts) {
        const uint32_t past = 8;
        wt_pair w[nd];
        act_pair a[nd];
        float *out[nd], *one = dalloc<float>(64);
        size_t stride[nd];
        gemv_plan p;
        cu_gemv_tokens(&p, T);
        for (int i = 0; i < nd; i++) {
            const tseg &g = dense[i];
            make_weights(w[i], g.type, g.n, g.row0 + g.rows, g.mats);
            make_act(a[i], g.n + g.off, T, st);
            stride[i] = g.rows + 3;
            out[i] = dalloc<float>(stride[i] * (T + past));
            dset(out[i], 0xFF, stride[i] * (T + past) * 4);
            gemv_tok tk = {1, stride[i], 0, 0};
            cu_gemv_add_tok(&p, &w[i].d, g.mat, NULL, 0, g.row0, g.rows, &a[i].d, g.off, out[i], tk);
        }
        if (cu_gemv_run(&p, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        uint32_t mism = 0, gaps = 0;
        for (int i = 0; i < nd; i++) {
            const tseg &g = dense[i];
            std::vector<float> got(stride[i] * (T + past)), g1(g.rows);
            CU(cudaMemcpy(got.data(), out[i], got.size() * 4, cudaMemcpyDeviceToHost));
            for (uint32_t t = 0; t < T; t++) {
                gemv_plan q;
                memset(&q, 0, sizeof(q));
                dact x = act_at(a[i].d, t);
                cu_gemv_add(&q, &w[i].d, g.mat, NULL, 0, g.row0, g.rows, &x, g.off, one);
                if (cu_gemv_run(&q, st, &err)) {
                    printf("FAIL: %s\n", ds4_err_msg(&err));
                    exit(1);
                }
                CU(cudaStreamSynchronize(st));
                CU(cudaMemcpy(g1.data(), one, g.rows * 4, cudaMemcpyDeviceToHost));
                for (uint32_t r = 0; r < g.rows; r++) mism += memcmp(&got[t * stride[i] + r], &g1[r], 4) != 0;
                for (uint32_t r = g.rows; r < stride[i]; r++) {
                    uint32_t v;
                    memcpy(&v, &got[t * stride[i] + r], 4);
                    gaps += v != 0xFFFFFFFFu;
                }
            }
            for (size_t j = stride[i] * T; j < got.size(); j++) {
                uint32_t v;
                memcpy(&v, &got[j], 4);
                gaps += v != 0xFFFFFFFFu;
            }
            cudaFree(out[i]);
            cudaFree((void *)w[i].d.p);
            free_act(a[i]);
        }
        cudaFree(one);
        printf("gemv plan of %u tokens (q8_0, f16, f32, bf16): %u outputs unlike one token's, %u written between or "
               "past rows\n",
               T, mism, gaps);
        CHECK(mism == 0 && gaps == 0, "gemv plan of %u tokens: %u unlike, %u gaps written", T, mism, gaps);
    }

    /* reps: k = 2 slots a token, 3 tokens; the selection of entry t k + i */
    const uint32_t k = 2, R = 3;
    const int sel_h[k * R] = {2, 0, 1, -1, 0, 1};
    int *sel = dcopy(sel_h, k * R);
    wt_pair wi, wq;
    make_weights(wi, DS4_TYPE_IQ2_XXS, 768, 40, 3);
    make_weights(wq, DS4_TYPE_Q2_K, 512, 64, 3);
    act_pair ai, aq;
    make_act(ai, 768, R, st);
    make_act(aq, 512, R * k, st);
    float *oi = dalloc<float>(k * R * 40), *oq = dalloc<float>(k * R * 64), *one = dalloc<float>(64);
    dset(oi, 0xFF, k * R * 40 * 4);
    dset(oq, 0xFF, k * R * 64 * 4);
    gemv_plan p;
    cu_gemv_reps(&p, R);
    for (uint32_t i = 0; i < k; i++) {
        gemv_tok ti = {1, k * 40, k, 0}, tq = {k, k * 64, k, 0};
        cu_gemv_add_tok(&p, &wi.d, 0, sel, i, 0, 40, &ai.d, 0, oi + i * 40, ti);
        dact xq = act_at(aq.d, i);
        cu_gemv_add_tok(&p, &wq.d, 0, sel, i, 0, 64, &xq, 0, oq + i * 64, tq);
    }
    if (cu_gemv_run(&p, st, &err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        exit(1);
    }
    CU(cudaStreamSynchronize(st));
    std::vector<float> gi(k * R * 40), gq(k * R * 64), g1(64);
    CU(cudaMemcpy(gi.data(), oi, gi.size() * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gq.data(), oq, gq.size() * 4, cudaMemcpyDeviceToHost));
    uint32_t mism = 0, host_written = 0;
    for (uint32_t e = 0; e < k * R; e++) {
        for (int which = 0; which < 2; which++) {
            uint32_t rows = which ? 64 : 40;
            const float *got = (which ? gq.data() : gi.data()) + (size_t)e * rows;
            if (sel_h[e] < 0) {
                for (uint32_t r = 0; r < rows; r++) {
                    uint32_t v;
                    memcpy(&v, &got[r], 4);
                    host_written += v != 0xFFFFFFFFu;
                }
                continue;
            }
            gemv_plan q;
            memset(&q, 0, sizeof(q));
            dact x = which ? act_at(aq.d, e) : act_at(ai.d, e / k);
            cu_gemv_add(&q, which ? &wq.d : &wi.d, 0, sel, e, 0, rows, &x, 0, one);
            if (cu_gemv_run(&q, st, &err)) {
                printf("FAIL: %s\n", ds4_err_msg(&err));
                exit(1);
            }
            CU(cudaStreamSynchronize(st));
            CU(cudaMemcpy(g1.data(), one, rows * 4, cudaMemcpyDeviceToHost));
            for (uint32_t r = 0; r < rows; r++) mism += memcmp(&got[r], &g1[r], 4) != 0;
        }
    }
    printf("gemv plan of %u tokens' experts (iq2_xxs, q2_k): %u outputs unlike one token's, %u of a host expert\n", R,
           mism, host_written);
    CHECK(mism == 0 && host_written == 0, "gemv reps: %u unlike, %u host outputs written", mism, host_written);

    /* the same as entries in expert order (few_experts): cu_entry_order's
     * permutation by (selection, entry), then a rep an entry in that order
     * - entry q reads row q / k of the IQ2_XXS product's activation and
     * row q of the Q2_K one's - each output the same bits as above */
    int *order = dalloc<int>(k * R);
    if (cu_entry_order(sel, k * R, order, st, &err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        exit(1);
    }
    float *ei = dalloc<float>(k * R * 40), *eq = dalloc<float>(k * R * 64);
    dset(ei, 0xFF, k * R * 40 * 4);
    dset(eq, 0xFF, k * R * 64 * 4);
    cu_gemv_reps(&p, k * R);
    p.order = order;
    gemv_tok ei_t = {1, 40, 1, k}, eq_t = {1, 64, 1, 0};
    cu_gemv_add_tok(&p, &wi.d, 0, sel, 0, 0, 40, &ai.d, 0, ei, ei_t);
    cu_gemv_add_tok(&p, &wq.d, 0, sel, 0, 0, 64, &aq.d, 0, eq, eq_t);
    if (cu_gemv_run(&p, st, &err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        exit(1);
    }
    CU(cudaStreamSynchronize(st));
    int order_h[k * R];
    const int order_want[k * R] = {3, 1, 4, 2, 5, 0};
    std::vector<float> hi(k * R * 40), hq(k * R * 64);
    CU(cudaMemcpy(order_h, order, sizeof(order_h), cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hi.data(), ei, hi.size() * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hq.data(), eq, hq.size() * 4, cudaMemcpyDeviceToHost));
    uint32_t emism = memcmp(order_h, order_want, sizeof(order_h)) != 0;
    emism += memcmp(hi.data(), gi.data(), hi.size() * 4) != 0; /* host entries: unwritten in both */
    emism += memcmp(hq.data(), gq.data(), hq.size() * 4) != 0;
    printf("gemv plan of %u entries in expert order (iq2_xxs, q2_k): order %d %d %d %d %d %d, %s\n", k * R,
           order_h[0], order_h[1], order_h[2], order_h[3], order_h[4], order_h[5],
           emism ? "UNLIKE the token plan" : "the token plan's bits");
    CHECK(emism == 0, "entries in expert order: order or outputs unlike");
    cudaFree(order);
    cudaFree(ei);
    cudaFree(eq);
    err = {};
    CHECK(cu_entry_order(sel, CU_FEW_ENTRIES + 1, NULL, st, &err) != 0 && strstr(ds4_err_msg(&err), "entries to order"),
          "cu_entry_order of too many entries: %s", ds4_err_msg(&err));

    /* K-quant rows in a plan of a few tokens: refused with a message */
    cu_gemv_tokens(&p, 2);
    cu_gemv_add(&p, &wq.d, 0, NULL, 0, 0, 64, &aq.d, 0, oq);
    err = {};
    CHECK(cu_gemv_run(&p, st, &err) != 0 && strstr(ds4_err_msg(&err), "other than dense"),
          "a plan of 2 tokens of Q2_K rows was run: '%s'", ds4_err_msg(&err));
    cudaFree(oi);
    cudaFree(oq);
    cudaFree(one);
    cudaFree(sel);
    cudaFree((void *)wi.d.p);
    cudaFree((void *)wq.d.p);
    free_act(ai);
    free_act(aq);
}

/* The routed experts' products in decode shapes: the down of selected
 * Q2_K experts (each its own activation) as streamed launches
 * (gemv_stream_kernel), in row lengths of one stage of 8 blocks or of two
 * with a partial last (9 blocks), run by a wave of blocks (a unit a warp)
 * and by 1 and 3 blocks (each warp walks many units and stages, the stage
 * buffers in turn); gate and up of selected IQ2_XXS experts (a segment
 * each, one shared activation; 8 and 17 blocks) take the plain kernel,
 * with its replicated tables.  The fused launches of check_fused_gemv (odd
 * row counts) take the plain kernel. */
static void check_stream_gemv(cudaStream_t st) {
    const int sel_h[4] = {2, 0, 3, 1};
    int *sel = dcopy(sel_h, 4);
    struct shape {
        uint32_t type, n, rows, segs;
        bool shared_act;
    } shapes[] = {
        {DS4_TYPE_IQ2_XXS, 2048, 64, 4, true},
        {DS4_TYPE_IQ2_XXS, 4352, 32, 4, true},
        {DS4_TYPE_Q2_K, 2048, 64, 3, false},
        {DS4_TYPE_Q2_K, 2304, 96, 2, false},
    };
    const int grids[] = {0, 1, 3}; /* a wave (the backend's), then grids that make warps walk several units */
    for (const shape &sh : shapes) {
        wt_pair w;
        make_weights(w, sh.type, sh.n, sh.rows, 4);
        act_pair a[4];
        float *out[4];
        for (uint32_t i = 0; i < sh.segs; i++) {
            if (i == 0 || !sh.shared_act) make_act(a[i], sh.n, 1, st);
            else a[i] = a[0];
            out[i] = dalloc<float>(sh.rows + 1);
        }
        for (int g : grids) {
            cu_gemv_set_stream((uint32_t)g);
            gemv_plan p;
            memset(&p, 0, sizeof(p));
            for (uint32_t i = 0; i < sh.segs; i++) {
                dset(out[i], 0xFF, (sh.rows + 1) * 4);
                cu_gemv_add(&p, &w.d, 0, sel, i, 0, sh.rows, &a[i].d, 0, out[i]);
            }
            bool streamed = cu_gemv_streamed(&p), want = sh.type == DS4_TYPE_Q2_K;
            CHECK(streamed == want, "stream gemv: %s of %u rows %s (grid %d)", ds4_type_get(sh.type)->name, sh.rows,
                  streamed ? "streamed" : "not streamed", g);
            ds4_err err = {};
            if (cu_gemv_run(&p, st, &err)) {
                printf("FAIL: %s\n", ds4_err_msg(&err));
                exit(1);
            }
            CU(cudaStreamSynchronize(st));
            double worst = 0;
            int guards = 0;
            for (uint32_t i = 0; i < sh.segs; i++) {
                std::vector<float> got(sh.rows + 1);
                CU(cudaMemcpy(got.data(), out[i], got.size() * 4, cudaMemcpyDeviceToHost));
                for (uint32_t r = 0; r < sh.rows; r++) {
                    double ref, mag;
                    reference(w, a[i], (uint32_t)sel_h[i], r, 0, 0, &ref, &mag);
                    note_err(worst, fabs(got[r] - ref) / (mag + 1e-30));
                }
                uint32_t guard;
                memcpy(&guard, &got[sh.rows], 4);
                guards += guard != 0xFFFFFFFFu;
            }
            printf("gemv %-8s %-8s n %4u, %u x %3u rows, grid %2d  max error %.2g of the terms' magnitude\n",
                   streamed ? "streamed" : "plain", ds4_type_get(sh.type)->name, sh.n, sh.segs, sh.rows, g, worst);
            CHECK(worst <= 2e-6 && guards == 0, "stream gemv: error %.3g, %d segments written past their rows", worst,
                  guards);
        }
        cu_gemv_set_stream(0);
        for (uint32_t i = 0; i < sh.segs; i++) {
            cudaFree(out[i]);
            if (i > 0 && sh.shared_act) continue;
            cudaFree(a[i].d.f);
            cudaFree(a[i].d.q8);
            cudaFree(a[i].d.qk);
        }
        cudaFree((void *)w.d.p);
    }
    cudaFree(sel);
}

/* Q8_0 products that also quantize their outputs (cu_gemv_add_q8): two
 * segments into one Q8_0 row at offsets 0 and 64; the floats as any
 * product's, the Q8_0 bytes and scales exactly the CPU quantizer's of
 * those floats. */
static void check_gemv_q8_out(cudaStream_t st) {
    const uint32_t n = 512, rows0 = 64, rows1 = 32, qn = rows0 + rows1;
    wt_pair w;
    act_pair a;
    make_weights(w, DS4_TYPE_Q8_0, n, rows0 + rows1, 1);
    make_act(a, n, 1, st);
    dact q;
    memset(&q, 0, sizeof(q));
    q.n = qn;
    q.fs = qn;
    q.q8s = cu_q8_bytes(qn);
    q.f = dalloc<float>(qn);
    q.q8 = dalloc<uint8_t>(q.q8s);
    dset(q.q8, 0xFF, q.q8s);
    gemv_plan p;
    memset(&p, 0, sizeof(p));
    cu_gemv_add_q8(&p, &w.d, 0, rows0, &a.d, 0, q.f, &q, 0);
    cu_gemv_add_q8(&p, &w.d, rows0, rows1, &a.d, 0, q.f + rows0, &q, rows0);
    CHECK(p.n_blocks == qn / 32, "quantized gemv: %u blocks for %u rows", p.n_blocks, qn);
    ds4_err err = {};
    if (cu_gemv_run(&p, st, &err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        exit(1);
    }
    CU(cudaStreamSynchronize(st));
    std::vector<float> got(qn);
    std::vector<uint8_t> gq(q.q8s);
    CU(cudaMemcpy(got.data(), q.f, qn * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(gq.data(), q.q8, q.q8s, cudaMemcpyDeviceToHost));
    double worst = 0;
    for (uint32_t r = 0; r < qn; r++) {
        double ref, mag;
        reference(w, a, 0, r, 0, 0, &ref, &mag);
        double e = fabs(got[r] - ref) / (mag + 1e-30);
        note_err(worst, e);
    }
    std::vector<ds4_block_q8_0x> want(qn / 32);
    ds4_quantize_q8_0x(got.data(), want.data(), qn);
    int bad = 0;
    for (uint32_t b = 0; b < qn / 32; b++) {
        float d;
        memcpy(&d, gq.data() + qn + 4 * b, 4);
        bad += memcmp(gq.data() + 32 * b, want[b].qs, 32) != 0 || memcmp(&d, &want[b].d, 4) != 0;
    }
    printf("gemv q8_0     quantized outputs, max error %.2g of the terms' magnitude, Q8_0 blocks %s\n", worst,
           bad ? "DIFFER" : "identical");
    CHECK(worst <= 2e-6 && bad == 0, "quantized gemv outputs: error %.3g, %d Q8_0 blocks differ", worst, bad);
    gemv_plan bad_plan;
    memset(&bad_plan, 0, sizeof(bad_plan));
    cu_gemv_add_q8(&bad_plan, &w.d, 0, rows1, &a.d, 0, q.f, &q, rows0 + 16);
    CHECK(cu_gemv_run(&bad_plan, st, &err) != 0 && err.code == DS4_EINVAL,
          "a misaligned quantized output was accepted");
    cudaFree(q.f);
    cudaFree(q.q8);
    cudaFree((void *)w.d.p);
    free_act(a);
}

/* Scores of three kinds:
 *   TIES  many exact ties (eighths), both zeros and long runs: the
 *         top-k's threshold bin holds too many keys for the linear way
 *   FINE  a fine grid (1/4096): distinct enough for the linear way, with
 *         a few equal keys in the threshold bin
 *   INF   FINE with an infinity of each sign: the radix way */
enum { TIES, FINE, INF };
static float topk_score(int kind, uint32_t i) {
    if (kind == TIES) {
        if (i % 97 == 5) return -0.0f;
        if (i % 89 == 3) return 0.0f;
        if (i % 1000 < 40) return 2.0f; /* a long run of equal top keys */
        return roundf(frand() * 8.0f) / 8.0f;
    }
    if (kind == INF && i % 1000 == 17) return i % 2000 == 17 ? INFINITY : -INFINITY;
    return roundf(frand() * 4096.0f) / 4096.0f;
}

static void check_topk(cudaStream_t st) {
    const uint32_t T = 2;
    /* keys of query 0, top-k, kind; the first case's queries see their
     * whole prefix; past TOPK_CACHE keys (40000) they are not kept in
     * shared memory */
    const uint32_t cases[][3] = {{70, 100, TIES},    {70, 8, TIES},    {1500, 512, TIES}, {16421, 512, TIES},
                                 {40000, 512, TIES}, {40000, 3, TIES}, {1500, 512, FINE}, {16421, 512, FINE},
                                 {40000, 512, FINE}, {40000, 3, FINE}, {16421, 512, INF}, {40000, 512, INF}};
    for (const auto &cs : cases) {
        uint32_t pos0 = 4 * cs[0] - 1, k = cs[1], stride = cs[0] + 1 + 7;
        int kind = (int)cs[2];
        std::vector<float> h((size_t)T * stride);
        for (float &v : h) v = 0.0f;
        for (uint32_t t = 0; t < T; t++)
            for (uint32_t i = 0; i < (pos0 + t + 1) / 4; i++) h[(size_t)t * stride + i] = topk_score(kind, i + 31 * t);
        float *d = dalloc<float>(h.size());
        /* one more row of vis as a guard: nothing may be written past a query's rows */
        uint32_t *dpos = dalloc<uint32_t>(1), *dvis = dalloc<uint32_t>((size_t)(T + 1) * k), *dn = dalloc<uint32_t>(T);
        CU(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dpos, &pos0, 4, cudaMemcpyHostToDevice));
        dset(dvis, 0xFF, (size_t)(T + 1) * k * 4);
        ds4_err err = {};
        bool early = (&cs - cases) % 2; /* the position read before the PDL wait, as in a decode graph */
        if (cu_topk(dpos, early, d, stride, (pos0 + T) / 4, T, k, dvis, dn, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        std::vector<uint32_t> vis((size_t)(T + 1) * k), n(T);
        CU(cudaMemcpy(vis.data(), dvis, vis.size() * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(n.data(), dn, n.size() * 4, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (uint32_t t = 0; t < T; t++) {
            uint32_t nc = (pos0 + t + 1) / 4;
            std::vector<uint32_t> idx(nc);
            for (uint32_t i = 0; i < nc; i++) idx[i] = i;
            const float *sc = &h[(size_t)t * stride];
            std::stable_sort(idx.begin(), idx.end(), [&](uint32_t x, uint32_t y) { return sc[x] > sc[y]; });
            uint32_t want = nc < k ? nc : k;
            idx.resize(want);
            std::sort(idx.begin(), idx.end());
            CHECK(n[t] == want, "top-k of %u keys, query %u: %u rows, want %u", nc, t, n[t], want);
            for (uint32_t i = 0; i < k; i++) bad += vis[(size_t)t * k + i] != (i < want ? idx[i] : 0xFFFFFFFFu);
        }
        for (uint32_t i = 0; i < k; i++) bad += vis[(size_t)T * k + i] != 0xFFFFFFFFu;
        printf("top-k %3u of %5u keys (%s)  %zu rows differ from a stable sort\n", k, (pos0 + 1) / 4,
               kind == TIES   ? "ties"
               : kind == FINE ? "fine"
                              : "inf ",
               bad);
        CHECK(bad == 0, "top-k of %u keys differs from a stable sort", (pos0 + 1) / 4);
        cudaFree(d);
        cudaFree(dpos);
        cudaFree(dvis);
        cudaFree(dn);
    }
}

/* Routing against a host definition of cpu_ffn.c's: probabilities
 * sqrt(softplus(logit)), the k best of prob + bias by a stable sort
 * (ties to the lower expert, -0 equal to +0), or the hash table's experts;
 * weights normalised in selection order.  Logits in eighths and a few
 * biases make many exact ties; distinct scores are far apart, so the
 * device's expf / log1pf (not glibc's bits) cannot reorder them. */
static float host_softplus(float x) { return x > 20.0f ? x : x < -20.0f ? expf(x) : log1pf(expf(x)); }

static void check_route(cudaStream_t st) {
    struct rcase {
        uint32_t n_expert, k;
        bool bias, hash, norm;
    };
    const rcase cases[] = {{256, 6, true, false, true}, {256, 6, false, false, true},  {256, 8, true, false, false},
                           {300, 6, true, false, true}, {1024, 8, false, false, true}, {16, 2, true, false, true},
                           {256, 6, true, true, true},  {40, 6, false, false, true}};
    const uint32_t T = 5, vocab = 7;
    for (const rcase &rc : cases) {
        uint32_t ne = rc.n_expert, k = rc.k;
        std::vector<float> logit((size_t)T * ne), bias(ne);
        std::vector<int32_t> hash((size_t)vocab * k);
        std::vector<uint32_t> tok(T);
        for (uint32_t t = 0; t < T; t++) {
            tok[t] = (t * 3) % vocab;
            for (uint32_t e = 0; e < ne; e++) {
                float v = roundf(frand() * 4.0f) / 8.0f;
                if (t == 1 && e % 5 == 0) v = 1.5f;      /* a run of equal top scores */
                if (t == 2) v = -30.0f + (float)(e % 3); /* tiny probabilities, softplus by expf */
                if (t == 3 && e % 7 == 0) v = 25.0f;     /* softplus(x) = x */
                logit[(size_t)t * ne + e] = v;
            }
        }
        for (uint32_t e = 0; e < ne; e++) bias[e] = e % 11 == 0 ? 0.25f : e % 13 == 0 ? -0.125f : 0.0f;
        for (uint32_t v = 0; v < vocab; v++)
            for (uint32_t i = 0; i < k; i++) hash[(size_t)v * k + i] = (int32_t)((v * 37 + i * 101) % ne);
        float *dl = dalloc<float>(logit.size()), *db = dalloc<float>(ne), *dw = dalloc<float>((size_t)(T + 1) * k);
        int32_t *dh = dalloc<int32_t>(hash.size());
        int *ds = dalloc<int>((size_t)(T + 1) * k);
        uint32_t *dt = dalloc<uint32_t>(T);
        CU(cudaMemcpy(dl, logit.data(), logit.size() * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(db, bias.data(), ne * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dh, hash.data(), hash.size() * 4, cudaMemcpyHostToDevice));
        CU(cudaMemcpy(dt, tok.data(), T * 4, cudaMemcpyHostToDevice));
        dset(ds, 0xFF, (size_t)(T + 1) * k * 4); /* one more row: nothing is written past the tokens */
        cu_route_in in;
        memset(&in, 0, sizeof(in));
        in.logits = dl;
        in.bias = rc.bias ? db : NULL;
        in.hash = rc.hash ? dh : NULL;
        in.tok = dt;
        in.n_expert = ne;
        in.k = k;
        in.scale = 1.5f;
        in.norm = rc.norm;
        ds4_err err = {};
        if (cu_route_tokens(&in, T, ds, dw, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        CU(cudaStreamSynchronize(st));
        std::vector<int> sel((size_t)(T + 1) * k);
        std::vector<float> w((size_t)T * k);
        CU(cudaMemcpy(sel.data(), ds, sel.size() * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(w.data(), dw, w.size() * 4, cudaMemcpyDeviceToHost));
        size_t bad_sel = 0;
        double worst = 0.0;
        for (uint32_t t = 0; t < T; t++) {
            std::vector<float> prob(ne), score(ne);
            std::vector<uint32_t> idx(ne);
            for (uint32_t e = 0; e < ne; e++) {
                prob[e] = sqrtf(host_softplus(logit[(size_t)t * ne + e]));
                score[e] = prob[e] + (rc.bias ? bias[e] : 0.0f);
                idx[e] = e;
            }
            std::stable_sort(idx.begin(), idx.end(), [&](uint32_t x, uint32_t y) { return score[x] > score[y]; });
            float sum = 0.0f;
            for (uint32_t i = 0; i < k; i++) {
                uint32_t e = rc.hash ? (uint32_t)hash[(size_t)tok[t] * k + i] : idx[i];
                bad_sel += (uint32_t)sel[(size_t)t * k + i] != e;
                sum += prob[e];
            }
            float nrm = rc.norm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f;
            for (uint32_t i = 0; i < k; i++) {
                uint32_t e = rc.hash ? (uint32_t)hash[(size_t)tok[t] * k + i] : idx[i];
                float want = prob[e] * nrm * 1.5f;
                worst = fmax(worst, fabs((double)w[(size_t)t * k + i] - want) / fmax(fabs(want), 1e-30));
            }
        }
        for (uint32_t i = 0; i < k; i++) bad_sel += sel[(size_t)T * k + i] != -1;
        printf("route %u of %4u experts%s%s  %zu choices differ, weights within %.1e\n", k, ne, rc.bias ? " +bias" : "",
               rc.hash ? " hash" : "", bad_sel, worst);
        CHECK(bad_sel == 0 && worst <= 1e-5, "routing %u of %u experts (bias %d, hash %d)", k, ne, rc.bias, rc.hash);
        cudaFree(dl);
        cudaFree(db);
        cudaFree(dw);
        cudaFree(dh);
        cudaFree(ds);
        cudaFree(dt);
    }
}

/* A device allocation that cannot be served says how much of what it
 * wanted and what the device has; the device stays usable.  Run on its
 * own (`test_cuda_kernels alloc-failure`): compute-sanitizer counts the
 * refused cudaMalloc as an API error, so the memcheck runs leave it out. */
static void check_alloc_error(void) {
    void *p = NULL;
    ds4_err err = {};
    int rc = cu_dev_alloc(&p, (size_t)1 << 62, "a test block", &err);
    const char *m = ds4_err_msg(&err);
    printf("allocation failure: %s\n", m);
    CHECK(rc != 0 && p == NULL && err.code == DS4_ENOMEM, "a 4 EiB allocation did not fail as DS4_ENOMEM");
    CHECK(strstr(m, "no room for 4294967296.00 GiB of a test block") && strstr(m, "GiB free of"),
          "allocation error message: %s", m);
    float *q = dalloc<float>(16);
    dset(q, 0, 16 * sizeof(float));
    CU(cudaFree(q));
}

/* A router product that routes in its last block (gemv_plan.route, as a
 * decode step's cu_gemv_route sets it): F32 router rows (a block a row),
 * the logits, choices and weights bit for bit those of the plain product
 * followed by the routing launch, for biased top-k and for hash routing;
 * twice each, so the count of blocks done must be back at 0 after a
 * launch.  A plan that routes with more than the router in it is refused. */
static void check_gemv_route(cudaStream_t st, uint32_t ne) {
    const uint32_t n = 512, k = 6, vocab = 5;
    wt_pair w;
    act_pair a;
    make_weights(w, DS4_TYPE_F32, n, ne, 1);
    make_act(a, n, 1, st);
    std::vector<float> bias(ne);
    for (uint32_t e = 0; e < ne; e++) bias[e] = e % 9 == 0 ? 0.05f : 0.0f;
    std::vector<int32_t> hash((size_t)vocab * k);
    for (size_t i = 0; i < hash.size(); i++) hash[i] = (int32_t)((i * 53 + 7) % ne);
    float *db = dalloc<float>(ne), *lg = dalloc<float>(2 * ne), *w1 = dalloc<float>(k), *w2 = dalloc<float>(k);
    int32_t *dh = dalloc<int32_t>(hash.size());
    int *s1 = dalloc<int>(k), *s2 = dalloc<int>(k);
    uint32_t *dt = dalloc<uint32_t>(1), *count = dalloc<uint32_t>(1), tok = 3;
    CU(cudaMemcpy(db, bias.data(), ne * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dh, hash.data(), hash.size() * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dt, &tok, 4, cudaMemcpyHostToDevice));
    dset(count, 0, 4);
    ds4_err err = {};
    for (int hashed = 0; hashed < 2; hashed++) {
        cu_route_in in;
        memset(&in, 0, sizeof(in));
        in.bias = hashed ? NULL : db;
        in.hash = hashed ? dh : NULL;
        in.tok = dt;
        in.n_expert = ne;
        in.k = k;
        in.scale = 1.5f;
        in.norm = true;
        /* plain: the product into lg, then the routing launch */
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, &w.d, 0, NULL, 0, 0, ne, &a.d, 0, lg);
        in.logits = lg;
        if (cu_gemv_run(&p, st, &err) || cu_route_tokens(&in, 1, s1, w1, st, &err)) {
            printf("FAIL: %s\n", ds4_err_msg(&err));
            exit(1);
        }
        std::vector<int> want_s(k), got_s(k);
        std::vector<float> want_w(k), got_w(k), want_l(ne), got_l(ne);
        CU(cudaStreamSynchronize(st));
        CU(cudaMemcpy(want_s.data(), s1, k * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(want_w.data(), w1, k * 4, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(want_l.data(), lg, ne * 4, cudaMemcpyDeviceToHost));
        for (int round = 0; round < 2; round++) {
            memset(&p, 0, sizeof(p));
            cu_gemv_add(&p, &w.d, 0, NULL, 0, 0, ne, &a.d, 0, lg + ne);
            in.logits = lg + ne;
            p.route.in = in;
            p.route.sel = s2;
            p.route.selw = w2;
            p.route.count = count;
            dset(s2, 0xFF, k * 4);
            dset(w2, 0xFF, k * 4);
            if (cu_gemv_run(&p, st, &err)) {
                printf("FAIL: %s\n", ds4_err_msg(&err));
                exit(1);
            }
            CU(cudaStreamSynchronize(st));
            CU(cudaMemcpy(got_s.data(), s2, k * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(got_w.data(), w2, k * 4, cudaMemcpyDeviceToHost));
            CU(cudaMemcpy(got_l.data(), lg + ne, ne * 4, cudaMemcpyDeviceToHost));
            bool same = got_s == want_s && !memcmp(got_w.data(), want_w.data(), k * 4) &&
                        !memcmp(got_l.data(), want_l.data(), ne * 4);
            printf("router product of %u experts routing in its last block (%s, launch %d): %s\n", ne,
                   hashed ? "hash" : "top-k + bias", round + 1, same ? "the routing launch's bits" : "DIFFERENT");
            CHECK(same, "a router product routing in its last block (hash %d, launch %d)", hashed, round + 1);
        }
    }
    gemv_plan bad;
    memset(&bad, 0, sizeof(bad));
    cu_gemv_add(&bad, &w.d, 0, NULL, 0, 0, ne, &a.d, 0, lg);
    cu_gemv_add(&bad, &w.d, 0, NULL, 0, 0, ne, &a.d, 0, lg + ne);
    bad.route.count = count;
    bad.route.in.n_expert = ne;
    bad.route.in.k = k;
    CHECK(cu_gemv_run(&bad, st, &err) != 0 && err.code == DS4_EINVAL, "a plan routing with two products was accepted");
    cudaFree((void *)w.d.p);
    free_act(a);
    cudaFree(db);
    cudaFree(lg);
    cudaFree(w1);
    cudaFree(w2);
    cudaFree(dh);
    cudaFree(s1);
    cudaFree(s2);
    cudaFree(dt);
    cudaFree(count);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "alloc-failure")) {
        check_alloc_error();
        printf(failures ? "allocation failure: FAILED\n" : "allocation failure: passed\n");
        return failures ? 1 : 0;
    }
    if (argc != 1) {
        fprintf(stderr, "usage: test_cuda_kernels [alloc-failure]\n");
        return 2;
    }
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ds4_err err = {};
    if (cu_matmul_init(&err)) {
        printf("FAIL: %s\n", ds4_err_msg(&err));
        return 1;
    }
    check_lowprec(st);
    check_quantize(st);
    check_products(st);
    check_split_gemv(st);
    check_window_gemv(st);
    check_split_gemm(st);
    check_gemm_range(st);
    check_missing_form(st);
    check_fused_gemv(st);
    check_token_plans(st);
    check_stream_gemv(st);
    check_gemv_q8_out(st);
    check_attention(st);
    check_comp_emit(st);
    check_idx_scores(st, false, 3);
    check_idx_scores(st, true, 3);
    check_idx_scores(st, true, 1); /* one query */
    check_topk(st);
    check_route(st);
    check_gemv_route(st, 256); /* Flash's experts */
    check_gemv_route(st, 384); /* Pro's: the wide launch */
    CU(cudaDeviceSynchronize());
    if (failures) printf("%d check(s) failed\n", failures);
    else printf("cuda kernels: all passed\n");
    return failures ? 1 : 0;
}
