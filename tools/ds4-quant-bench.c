/*
 * ds4-quant-bench - single-thread micro-benchmark of the block formats:
 *
 *   dots      GB/s of weight bytes for ds4_vec_dot_rows over a matrix larger
 *             than the last-level cache (every weight type, scalar and AVX2);
 *   batch     the batched products of prefill: ns per (row, activation)
 *             pair, one activation at a time against ds4_vec_dot_rows_multi
 *             (--acts N activations, default 64; --cols N wide rows, default
 *             4096);
 *   quantize  elements/s of ds4_quantize_row per type (with and without
 *             importance), on N(0,1) rows of 4096;
 *   rmse      quantize-then-dequantize RMSE on N(0,1) data per type (the
 *             numbers recorded in docs/QUANTS.md).
 * Timings are the best of --reps passes, so a pass slowed by other work on
 * the machine does not count.
 *
 * Usage: ds4-quant-bench [--mib N] [--reps N] [--acts N] [--cols N] [--only dots|batch|quantize|rmse]
 * (ds4-quant-bench --help describes them).
 * Results go in docs/PERFORMANCE.md ("Block formats (CPU dot products)";
 * the batch mode under "CPU forward").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fp.h"
#include "base/opts.h"
#include "format/quants.h"

enum { COLS = 4096 };

static const uint32_t WTYPES[] = {DS4_TYPE_F32,  DS4_TYPE_F16,  DS4_TYPE_BF16,   DS4_TYPE_Q8_0,
                                  DS4_TYPE_Q4_K, DS4_TYPE_Q2_K, DS4_TYPE_IQ2_XXS};
#define NWTYPES (sizeof WTYPES / sizeof WTYPES[0])


static uint64_t rng_state;

/* Each section reseeds, so its data does not depend on which ran before. */
static void rng_seed(uint64_t seed) { rng_state = seed; }

static uint64_t rng_next(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static float gauss(void) {
    double u = ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
    double v = ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "ds4-quant-bench: out of memory allocating %zu bytes\n", n);
        exit(1);
    }
    return p;
}

/* Weight bytes that decode to finite values: random payload, then each f16
 * scale field of every block set to a small random value. */
static void fill_weights(uint32_t type, uint8_t *w, size_t bytes) {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = rng_next();
        memcpy(w + i, &v, 8);
    }
    const ds4_type_info *t = ds4_type_get(type);
    int offs[2] = {-1, -1};
    switch (type) {
    case DS4_TYPE_Q8_0:
    case DS4_TYPE_IQ2_XXS: offs[0] = 0; break;
    case DS4_TYPE_Q4_K: offs[0] = 0, offs[1] = 2; break;
    case DS4_TYPE_Q2_K: offs[0] = 80, offs[1] = 82; break;
    case DS4_TYPE_F16: offs[0] = 0; break;
    case DS4_TYPE_BF16:
    case DS4_TYPE_F32:
        for (size_t i = 0; i < bytes; i += t->block_bytes) {
            float f = (float)(rng_next() % 2001) / 1000.0f - 1.0f;
            if (type == DS4_TYPE_F32) memcpy(w + i, &f, 4);
            else memcpy(w + i, &(uint16_t){ds4_f32_to_bf16(f)}, 2);
        }
        return;
    default: return;
    }
    for (size_t i = 0; i < bytes; i += t->block_bytes) {
        for (int k = 0; k < 2; k++) {
            if (offs[k] < 0) continue;
            uint16_t s = ds4_f32_to_f16(ldexpf(1.0f + (float)(rng_next() % 1000) / 1000.0f, -10));
            memcpy(w + i + offs[k], &s, 2);
        }
    }
}

static void bench_dots(size_t mib, int reps) {
    rng_seed(1);
    printf("dots: single thread, rows of %d, %zu MiB of weights per type, best of %d per 1 MiB chunk\n", COLS, mib,
           reps);
    printf("%-8s %12s %12s %10s\n", "type", "scalar GB/s", "avx2 GB/s", "avx2 ns/row");
    float *x = xmalloc(COLS * sizeof(float));
    for (int i = 0; i < COLS; i++) x[i] = gauss();
    for (size_t t = 0; t < NWTYPES; t++) {
        uint32_t type = WTYPES[t];
        size_t rb = ds4_row_bytes(type, COLS);
        int64_t rows = (int64_t)(mib * 1024 * 1024 / rb);
        uint8_t *w = xmalloc(rb * (size_t)rows);
        fill_weights(type, w, rb * (size_t)rows);
        void *act = xmalloc(ds4_act_bytes(type, COLS));
        ds4_quantize_act(type, x, act, COLS);
        float *y = xmalloc((size_t)rows * sizeof(float));
        /* The matrix is swept in 1 MiB chunks; each chunk keeps the best of
         * its `reps` timings (one per sweep, so always from DRAM: the whole
         * matrix does not fit the cache), and the rate is the total bytes
         * over the sum of those bests.  A sweep preempted by other work on
         * the machine only loses the chunks it was preempted in. */
        int64_t chunk = (int64_t)(1024 * 1024 / rb) > 0 ? (int64_t)(1024 * 1024 / rb) : 1;
        int64_t nchunks = (rows + chunk - 1) / chunk;
        double *best = xmalloc((size_t)nchunks * sizeof(double));
        double gbs[2] = {0, 0}, ns_row = 0;
        for (int mode = 0; mode < 2; mode++) {
            if (mode == 1 && !ds4_cpu_has_avx2_fma()) break;
            ds4_set_simd(mode ? DS4_SIMD_AVX2 : DS4_SIMD_SCALAR);
            for (int64_t c = 0; c < nchunks; c++) best[c] = INFINITY;
            for (int r = 0; r < reps; r++) {
                for (int64_t c = 0; c < nchunks; c++) {
                    int64_t r0 = c * chunk, nr = rows - r0 < chunk ? rows - r0 : chunk;
                    double t0 = ds4_now();
                    ds4_vec_dot_rows(type, COLS, nr, w + (size_t)r0 * rb, rb, act, y + r0);
                    best[c] = fmin(best[c], ds4_now() - t0);
                }
            }
            double total = 0;
            for (int64_t c = 0; c < nchunks; c++) total += best[c];
            gbs[mode] = (double)rb * (double)rows / total / 1e9;
            ns_row = total / (double)rows * 1e9;
        }
        free(best);
        ds4_set_simd(DS4_SIMD_AUTO);
        printf("%-8s %12.2f %12.2f %10.1f\n", ds4_type_get(type)->name, gbs[0], gbs[1], ns_row);
        free(w);
        free(act);
        free(y);
    }
    free(x);
}

/* The batched product of prefill as the CPU backend runs it (cpu_ops.c):
 * rows in tiles of about 32 KiB, each tile dotted with every activation,
 * either one activation at a time (ds4_vec_dot_rows, what decode does) or
 * through ds4_vec_dot_rows_multi.  A 1 MiB matrix (in the L2/L3 cache, as
 * the tiles of a prefill chunk mostly are), best of `reps` passes. */
static double batch_pass(uint32_t type, int64_t cols, const uint8_t *w, size_t rb, int64_t rows, const uint8_t *acts,
                         size_t ab, int nacts, float *y, int multi) {
    int64_t tile = (int64_t)(32768 / rb) + 1;
    double t0 = ds4_now();
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
        int64_t nr = rows - r0 < tile ? rows - r0 : tile;
        const uint8_t *wt = w + (size_t)r0 * rb;
        if (multi) {
            ds4_vec_dot_rows_multi(type, cols, nr, wt, rb, acts, ab, nacts, y + r0, (size_t)rows);
        } else {
            for (int a = 0; a < nacts; a++)
                ds4_vec_dot_rows(type, cols, nr, wt, rb, acts + (size_t)a * ab, y + (size_t)a * rows + r0);
        }
    }
    return ds4_now() - t0;
}

static void bench_batch(int reps, int nacts, int64_t cols) {
    rng_seed(4);
    printf("batch: single thread, rows of %lld, 1 MiB of weights per type, %d activations, tiles of 32 KiB, "
           "best of %d\n",
           (long long)cols, nacts, reps);
    printf("%-8s %-7s %14s %14s %8s\n", "type", "kernels", "one ns/pair", "multi ns/pair", "speedup");
    float *x = xmalloc((size_t)cols * sizeof(float));
    for (size_t t = 0; t < NWTYPES; t++) {
        uint32_t type = WTYPES[t];
        size_t rb = ds4_row_bytes(type, cols), ab = ds4_act_bytes(type, cols);
        int64_t rows = (int64_t)(1024 * 1024 / rb);
        uint8_t *w = xmalloc(rb * (size_t)rows), *acts = xmalloc(ab * (size_t)nacts);
        fill_weights(type, w, rb * (size_t)rows);
        for (int a = 0; a < nacts; a++) {
            for (int64_t i = 0; i < cols; i++) x[i] = gauss();
            ds4_quantize_act(type, x, acts + (size_t)a * ab, cols);
        }
        float *y = xmalloc((size_t)rows * (size_t)nacts * sizeof(float));
        for (int mode = 0; mode < 2; mode++) {
            if (mode == 1 && !ds4_cpu_has_avx2_fma()) break;
            ds4_set_simd(mode ? DS4_SIMD_AVX2 : DS4_SIMD_SCALAR);
            double best[2] = {INFINITY, INFINITY};
            for (int r = 0; r < reps; r++)
                for (int multi = 0; multi < 2; multi++)
                    best[multi] = fmin(best[multi], batch_pass(type, cols, w, rb, rows, acts, ab, nacts, y, multi));
            double pairs = (double)rows * nacts;
            printf("%-8s %-7s %14.1f %14.1f %8.2f\n", ds4_type_get(type)->name, mode ? "avx2" : "scalar",
                   best[0] / pairs * 1e9, best[1] / pairs * 1e9, best[0] / best[1]);
        }
        ds4_set_simd(DS4_SIMD_AUTO);
        free(w);
        free(acts);
        free(y);
    }
    free(x);
}

static void bench_quantize(int reps) {
    enum { ROWS = 32 };
    rng_seed(2);
    float *x = xmalloc((size_t)ROWS * COLS * sizeof(float)), *imp = xmalloc(COLS * sizeof(float));
    for (int i = 0; i < ROWS * COLS; i++) x[i] = gauss();
    for (int i = 0; i < COLS; i++) imp[i] = (float)pow(10.0, (double)(rng_next() % 3000) / 1000.0);
    uint8_t *buf = xmalloc(COLS * 4);
    printf("quantize: single thread, %d rows of %d, N(0,1), best of %d per row\n", ROWS, COLS, reps);
    printf("%-8s %-12s %12s\n", "type", "importance", "Melem/s");
    const uint32_t types[] = {DS4_TYPE_Q8_0, DS4_TYPE_Q4_K, DS4_TYPE_Q2_K, DS4_TYPE_IQ2_XXS};
    ds4_quantize_row(DS4_TYPE_IQ2_XXS, x, buf, COLS, NULL); /* builds the IQ2 tables */
    for (int t = 0; t < 4; t++) {
        for (int with = 0; with < 2; with++) {
            if (types[t] == DS4_TYPE_Q8_0 && with) continue;
            /* per row, the best of `reps` timings (short enough to dodge
             * preemption on a busy machine), summed over the rows */
            double dt = 0;
            for (int r = 0; r < ROWS; r++) {
                double best = INFINITY;
                for (int rep = 0; rep < reps; rep++) {
                    double t0 = ds4_now();
                    ds4_quantize_row(types[t], x + (size_t)r * COLS, buf, COLS, with ? imp : NULL);
                    best = fmin(best, ds4_now() - t0);
                }
                dt += best;
            }
            printf("%-8s %-12s %12.2f\n", ds4_type_get(types[t])->name,
                   with                           ? "imatrix"
                   : types[t] == DS4_TYPE_IQ2_XXS ? "none (x^2)"
                                                  : "none",
                   ROWS * COLS / dt / 1e6);
        }
    }
    free(x);
    free(imp);
    free(buf);
}

static void bench_rmse(void) {
    enum { ROWS = 256 };
    rng_seed(3);
    float *x = xmalloc((size_t)ROWS * COLS * sizeof(float)), *y = xmalloc(COLS * sizeof(float));
    float *ones = xmalloc(COLS * sizeof(float));
    for (int i = 0; i < ROWS * COLS; i++) x[i] = gauss();
    for (int i = 0; i < COLS; i++) ones[i] = 1.0f;
    uint8_t *buf = xmalloc(COLS * 4);
    printf("rmse: quantize + dequantize, %d rows of %d, N(0,1)\n", ROWS, COLS);
    const struct {
        uint32_t type;
        const float *imp;
        const char *note;
    } cases[] = {
        {DS4_TYPE_F16, NULL, ""},
        {DS4_TYPE_BF16, NULL, ""},
        {DS4_TYPE_Q8_0, NULL, ""},
        {DS4_TYPE_Q4_K, NULL, ""},
        {DS4_TYPE_Q2_K, NULL, ""},
        {DS4_TYPE_IQ2_XXS, ones, "uniform importance"},
        {DS4_TYPE_IQ2_XXS, NULL, "no importance (x^2 fallback)"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double e = 0;
        for (int r = 0; r < ROWS; r++) {
            const float *xr = x + (size_t)r * COLS;
            ds4_quantize_row(cases[c].type, xr, buf, COLS, cases[c].imp);
            ds4_dequantize_row(cases[c].type, buf, y, COLS);
            for (int i = 0; i < COLS; i++) e += ((double)y[i] - xr[i]) * ((double)y[i] - xr[i]);
        }
        printf("%-8s rmse %.6f %s\n", ds4_type_get(cases[c].type)->name, sqrt(e / ((double)ROWS * COLS)),
               cases[c].note);
    }
    free(x);
    free(y);
    free(ones);
    free(buf);
}

int main(int argc, char **argv) {
    uint32_t mib, cols;
    int reps, nacts;
    const char *only;
    ds4_opt table[] = {
        {DS4_OPT_CHOICE("--only", "WHAT", &only, "dots|batch|quantize|rmse", NULL, "run one of the benchmarks"),
         .def_text = "all"},
        {DS4_OPT_U32("--mib", "N", &mib, 1, 1u << 20, 256,
                     "MiB of weights per type in dots (more than the last-level "
                     "cache)")},
        {DS4_OPT_INT("--reps", "N", &reps, 1, 1000000, 3, "passes; the best one counts")},
        {DS4_OPT_INT("--acts", "N", &nacts, 1, 1 << 16, 64, "activations of batch")},
        {DS4_OPT_U32("--cols", "N", &cols, 256, 1u << 24, COLS, "row width of batch, a multiple of 256")},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-quant-bench",
                   .usage = "[options]",
                   .about = "Single-thread micro-benchmark of the block formats: dot products (GB/s of weight "
                            "bytes),\nbatched products (ns per row and activation), quantization (elements/s) "
                            "and quantization RMSE.",
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (cols % 256 != 0) return ds4_cli_usage(&cli, "--cols %u: must be a multiple of 256", cols);
    printf("kernels: %s\n", ds4_cpu_has_avx2_fma() ? "scalar and AVX2+FMA" : "scalar only (no AVX2+FMA)");
    if (!only || !strcmp(only, "dots")) bench_dots((size_t)mib, reps);
    if (!only || !strcmp(only, "batch")) bench_batch(reps, nacts, cols);
    if (!only || !strcmp(only, "quantize")) bench_quantize(reps);
    if (!only || !strcmp(only, "rmse")) bench_rmse();
    return 0;
}
