/*
 * cpu_ops.c - matrix products, norms and activations of the CPU backend.
 *
 * A matrix product first prepares each token's activation in the format
 * the weight type is multiplied with (docs/MODEL.md 3.8: Q8_0 blocks for Q8_0
 * weights, Q8_K for the K-quants and IQ2_XXS, f32 for float weights), then
 * splits the weight rows over the worker pool; each thread reads its rows
 * once and dots them with every token.  A value depends only on its row and
 * its token, never on the split.
 */
#include <math.h>
#include <string.h>

#include "format/quants.h"
#include "model/cpu/cpu.h"

typedef struct matmul_task {
    const ds4_wt *W;
    const uint8_t *w0; /* first row of the range */
    const uint8_t *act;
    size_t act_row;
    uint32_t T;
    float *y;
    size_t y_stride;
} matmul_task;

/* Rows in tiles of about 32 KiB, each dotted with every token while it
 * is in the core's cache; the multi-activation kernels unpack each weight
 * block once for several tokens. */
static void matmul_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const matmul_task *m = ctx;
    size_t rb = m->W->row_bytes;
    int64_t tile = (int64_t)(32768 / rb) + 1;
    for (int64_t a = r0; a < r1; a += tile) {
        int64_t b = a + tile < r1 ? a + tile : r1;
        ds4_vec_dot_rows_multi(m->W->type, (int64_t)m->W->ne[0], b - a, m->w0 + (size_t)a * rb, rb, m->act, m->act_row,
                               m->T, m->y + a, m->y_stride);
    }
}

typedef struct quant_task {
    uint32_t type;
    int64_t n;
    const float *x;
    size_t x_stride;
    uint8_t *act;
    size_t act_row;
} quant_task;

static void quantize_tokens(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const quant_task *q = ctx;
    for (int64_t t = t0; t < t1; t++)
        ds4_quantize_act(q->type, q->x + (size_t)t * q->x_stride, q->act + (size_t)t * q->act_row, q->n);
}

void cpu_matmul(cpu_backend *b, const ds4_wt *W, uint64_t mat, uint64_t row0, uint64_t nrows, const float *x,
                size_t x_stride, uint32_t T, float *y, size_t y_stride) {
    if (T == 0 || nrows == 0) return;
    /* Waking the workers costs microseconds: small products run inline,
     * and each task gets at least CPU_MIN_TASK_WORK multiply-adds. */
    uint64_t work = nrows * W->ne[0] * T;
    ds4_pool *pool = work < CPU_MIN_TASK_WORK ? NULL : b->pool;
    quant_task q = {W->type, (int64_t)W->ne[0], x, x_stride, b->act, b->act_row};
    ds4_pool_run(T > 1 ? pool : NULL, T, 1, quantize_tokens, &q);
    matmul_task m = {W, ds4_wt_row(W, mat, row0), b->act, b->act_row, T, y, y_stride};
    int64_t grain = (int64_t)(CPU_MIN_TASK_WORK / (W->ne[0] * T)) + 1;
    ds4_pool_run(pool, (int64_t)nrows, grain, matmul_rows, &m);
}

void cpu_rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps) {
    double ss = 0.0;
    for (uint32_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    float scale = 1.0f / sqrtf((float)(ss / n) + eps);
    if (w)
        for (uint32_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
    else
        for (uint32_t i = 0; i < n; i++) out[i] = x[i] * scale;
}

float cpu_sigmoid(float x) {
    if (x >= 0) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

float cpu_silu(float x) { return x * cpu_sigmoid(x); }

float cpu_softplus(float x) {
    if (x > 20.0f) return x;
    if (x < -20.0f) return expf(x);
    return log1pf(expf(x));
}

float cpu_swiglu(float g, float u, float limit) {
    if (limit > 1e-6f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    return cpu_silu(g) * u;
}
