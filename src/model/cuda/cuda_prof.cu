/*
 * cuda_prof.cu - per-kernel timing and ablation for development, compiled
 * in only by a developer build (-DDS4_CUDA_DEV: `make cuda-dev`), never
 * into a release binary nor the CPU emulation.
 *
 * With DS4_CUDA_PROFILE=1 the backend runs decode steps without the graph
 * and every launch is bracketed by CUDA events; ds4_prof_report() prints,
 * per kernel name, the launches, the total and the mean time, largest
 * first.  A decode step's side-stream branches (cuda_forward.cu) still run
 * beside the main stream, so their launches and the ones they overlap are
 * timed with each other's contention included.
 *
 * DS4_CUDA_ABLATE (cuda_rt.h): the decode graph captured without some of
 * its launches, so that the benchmark's step time shows what each costs on
 * the step's path, which event timing outside the graph cannot
 * (docs/PERFORMANCE.md, "How it was measured").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_rt.h"

#if defined(DS4_CUDA_DEV) && !defined(DS4_CUDA_EMU)

bool ds4_prof_on;
bool ds4_prof_grids;
const char *ds4_ablate;

#define PROF_MAX 8192

typedef struct prof_rec {
    const char *name;
    dim3 grid;
    cudaEvent_t a, b;
} prof_rec;

bool ds4_ablated(const char *name, dim3 grid, cudaStream_t st) {
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusActive) return false;
    for (const char *p = ds4_ablate; *p;) {
        size_t n = strcspn(p, "+");
        char tok[128];
        if (n && n < sizeof(tok)) {
            memcpy(tok, p, n);
            tok[n] = 0;
            char *at = strchr(tok, '@');
            unsigned gx = 0;
            if (at) {
                *at = 0;
                gx = (unsigned)atoi(at + 1);
            }
            if (strstr(name, tok) && (!gx || gx == grid.x)) return true;
        }
        p += n + (p[n] ? 1 : 0);
    }
    return false;
}

static prof_rec recs[PROF_MAX];
static int n_recs, n_events;
static cudaEvent_t pending;

typedef struct prof_sum {
    const char *name;
    dim3 grid; /* 0 x 0 x 0 unless ds4_prof_grids */
    double ms;
    long calls;
} prof_sum;

static bool same_grid(dim3 a, dim3 b) { return a.x == b.x && a.y == b.y && a.z == b.z; }

static prof_sum sums[256];
static int n_sums;

/* Fold the recorded launches into the per-name sums (waits for them). */
static void flush(void) {
    for (int i = 0; i < n_recs; i++) {
        float ms = 0;
        cudaEventSynchronize(recs[i].b);
        cudaEventElapsedTime(&ms, recs[i].a, recs[i].b);
        dim3 grid = ds4_prof_grids ? recs[i].grid : dim3(0, 0, 0);
        int k = 0;
        while (k < n_sums && (strcmp(sums[k].name, recs[i].name) || !same_grid(sums[k].grid, grid))) k++;
        if (k == n_sums && n_sums < 256) {
            sums[n_sums].name = recs[i].name;
            sums[n_sums].grid = grid;
            sums[n_sums].ms = 0;
            sums[n_sums].calls = 0;
            n_sums++;
        }
        if (k < 256) {
            sums[k].ms += ms;
            sums[k].calls++;
        }
    }
    n_recs = 0;
}

static cudaEvent_t event(void) {
    static cudaEvent_t pool[2 * PROF_MAX];
    if (n_events < 2 * PROF_MAX) {
        if (!pool[n_events]) cudaEventCreate(&pool[n_events]);
        return pool[n_events++];
    }
    return NULL;
}

void ds4_prof_before(cudaStream_t st) {
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
    if (n_recs == PROF_MAX || n_events + 2 > 2 * PROF_MAX) {
        flush();
        n_events = 0;
    }
    pending = event();
    cudaEventRecord(pending, st);
}

void ds4_prof_after(const char *name, dim3 grid, cudaStream_t st) {
    if (!pending) return;
    cudaEvent_t b = event();
    cudaEventRecord(b, st);
    recs[n_recs].name = name;
    recs[n_recs].grid = grid;
    recs[n_recs].a = pending;
    recs[n_recs].b = b;
    n_recs++;
    pending = NULL;
}

static int by_time(const void *x, const void *y) {
    double a = ((const prof_sum *)x)->ms, b = ((const prof_sum *)y)->ms;
    return a < b ? 1 : a > b ? -1 : 0;
}

void ds4_prof_report(const char *title) {
    flush();
    n_events = 0;
    double total = 0;
    for (int i = 0; i < n_sums; i++) total += sums[i].ms;
    qsort(sums, n_sums, sizeof(sums[0]), by_time);
    fprintf(stderr, "ds4 cuda profile (%s): %.3f ms in kernels\n", title, total);
    fprintf(stderr, "  %-28s %8s %10s %9s %6s\n", "kernel", "launches", "total ms", "mean us", "share");
    for (int i = 0; i < n_sums; i++) {
        char name[160];
        if (sums[i].grid.x)
            snprintf(name, sizeof(name), "%s [%ux%ux%u]", sums[i].name, sums[i].grid.x, sums[i].grid.y, sums[i].grid.z);
        else snprintf(name, sizeof(name), "%s", sums[i].name);
        fprintf(stderr, "  %-28s %8ld %10.3f %9.2f %5.1f%%\n", name, sums[i].calls, sums[i].ms,
                1e3 * sums[i].ms / sums[i].calls, 100.0 * sums[i].ms / total);
    }
    n_sums = 0;
}

#else

void ds4_prof_report(const char *) {}

#endif
