/*
 * cuda_imatrix.cu - the importance-matrix sums on the GPU
 * (ds4_backend_opts.imatrix, model/imatrix_collect.h).
 *
 * After a prefill pass has run layer il's routed experts (cu_ffn_layer),
 * the pass's (token, slot) entries are grouped by expert (cu_group_tokens
 * on the selections, whatever device slots the products read) and one
 * block per (expert, slice of columns) sums x^2 over that expert's
 * entries: x the FFN input row (xn, gate and up read it) and the down
 * projection's input row (mid's f32 rows, which the SwiGLU launch writes
 * when collecting).  A thread owns its columns, so the sums need no
 * atomics: it adds its entries in double and adds the result to the
 * layer's double accumulator in device memory.  Double because a run over
 * millions of tokens adds ~10^5 small squares into one value per column
 * (a float accumulator would drop their low bits); the FP64 units of the
 * data-centre GPUs run it at the memory's pace.  The order within a pass
 * follows the grouping's, which is not fixed: sums agree with the CPU's
 * to double rounding, not bit for bit.
 *
 * Nothing goes to the host during the passes: ds4_cuda_imatrix_flush reads
 * every layer's sums back once (when the run saves), adds them to the
 * collector and zeroes them.
 */
#include "model/cuda/cuda_internal.h"

extern "C" {
#include "model/backends.h"
#include "model/imatrix_collect.h"
}

#define IMX_THREADS 256
#define IMX_PER     4                       /* columns a thread */
#define IMX_COLS    (IMX_THREADS * IMX_PER) /* columns a block */
#define IMX_ROWS    4                       /* entries loaded together */

typedef struct imx_args {
    const int *count, *end; /* per expert: entries, and the end of its run of perm (the scatter's cursor) */
    const int *perm;        /* entries token * k + slot, grouped by expert */
    const float *x;         /* FFN input rows, token t at t * xs */
    const float *mid;       /* down inputs, entry j at j * ms */
    size_t xs, ms;
    uint32_t k, D, F, xblocks;
    double *in, *dmid; /* the layer's sums: n_expert x D, n_expert x F */
    uint64_t *routes;  /* the layer's entries per expert */
} imx_args;

/* Block (e, y): expert e, column slice y of the FFN input (y < xblocks) or
 * of the down input. */
static __global__ void __launch_bounds__(IMX_THREADS) imx_sum_kernel(imx_args a) {
    dev_pdl_enter();
    uint32_t e = blockIdx.x, y = blockIdx.y;
    int n = a.count[e];
    if (n <= 0) return;
    int start = a.end[e] - n;
    bool is_x = y < a.xblocks;
    uint32_t width = is_x ? a.D : a.F, c0 = (is_x ? y : y - a.xblocks) * IMX_COLS + threadIdx.x;
    double acc[IMX_PER];
#pragma unroll
    for (int j = 0; j < IMX_PER; j++) acc[j] = 0.0;
    /* IMX_ROWS entries at a time, every load issued before any is used: a
     * much-chosen expert's many entries would otherwise wait a memory round
     * trip each */
    for (int i = 0; i < n; i += IMX_ROWS) {
        float v[IMX_ROWS][IMX_PER];
#pragma unroll
        for (int r = 0; r < IMX_ROWS; r++) {
            const float *row = NULL;
            if (i + r < n) {
                int ent = a.perm[start + i + r];
                row = is_x ? a.x + (size_t)(ent / (int)a.k) * a.xs : a.mid + (size_t)ent * a.ms;
            }
#pragma unroll
            for (int j = 0; j < IMX_PER; j++) {
                uint32_t c = c0 + j * IMX_THREADS;
                v[r][j] = row && c < width ? row[c] : 0.0f;
            }
        }
#pragma unroll
        for (int r = 0; r < IMX_ROWS; r++)
#pragma unroll
            for (int j = 0; j < IMX_PER; j++) acc[j] += (double)v[r][j] * (double)v[r][j];
    }
    double *sums = (is_x ? a.in : a.dmid) + (size_t)e * width;
#pragma unroll
    for (int j = 0; j < IMX_PER; j++) {
        uint32_t c = c0 + j * IMX_THREADS;
        if (c < width) sums[c] += acc[j];
    }
    if (y == 0 && threadIdx.x == 0) a.routes[e] += (uint64_t)n;
}

int cu_imatrix_sum(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (!b->imx_in || il >= c->n_layer || T == 0) return 0;
    if (!b->mid.f) return ds4_err_set(err, DS4_EINVAL, "CUDA backend: imatrix sums without the f32 SwiGLU rows");
    cu_group g;
    if (cu_group_tokens(b, b->sel, T, &g, err)) return -1;
    imx_args a;
    a.count = b->grp_count;
    a.end = b->grp_off;
    a.perm = b->grp_perm;
    a.x = b->xn.f;
    a.xs = b->xn.fs;
    a.mid = b->mid.f;
    a.ms = b->mid.fs;
    a.k = c->n_expert_used;
    a.D = c->n_embd;
    a.F = c->n_ff_exp;
    a.xblocks = (a.D + IMX_COLS - 1) / IMX_COLS;
    uint32_t mblocks = (a.F + IMX_COLS - 1) / IMX_COLS;
    size_t slot = (size_t)il * c->n_expert;
    a.in = b->imx_in + slot * a.D;
    a.dmid = b->imx_mid + slot * a.F;
    a.routes = b->imx_routes + slot;
    DS4_LAUNCH(imx_sum_kernel, dim3(c->n_expert, a.xblocks + mblocks), IMX_THREADS, 0, b->st, a);
    CU_LAUNCHED();
    return 0;
}

size_t cu_imatrix_floats(const ds4_config *c, size_t *mid, size_t *routes) {
    size_t per = (size_t)c->n_layer * c->n_expert;
    *mid = per * c->n_ff_exp;
    *routes = per;
    return per * c->n_embd;
}

extern "C" int ds4_cuda_imatrix_flush(ds4_backend *base, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    CU_ON_DEVICE(b);
    const ds4_config *c = b->cfg;
    if (!b->imx_in || !base->opts.imatrix) return 0;
    size_t E = c->n_expert, in_n = E * c->n_embd, mid_n = E * c->n_ff_exp;
    double *h = (double *)malloc((in_n + mid_n) * sizeof(double));
    uint64_t *r = (uint64_t *)malloc(E * sizeof(uint64_t));
    int rc = 0;
    if (!h || !r) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    cudaError_t e = rc ? cudaSuccess : cudaStreamSynchronize(b->st);
    for (uint32_t il = 0; il < c->n_layer && !rc && e == cudaSuccess; il++) {
        size_t slot = (size_t)il * E;
        e = cudaMemcpy(h, b->imx_in + slot * c->n_embd, in_n * sizeof(double), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess)
            e = cudaMemcpy(h + in_n, b->imx_mid + slot * c->n_ff_exp, mid_n * sizeof(double), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) e = cudaMemcpy(r, b->imx_routes + slot, E * sizeof(uint64_t), cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) break;
        uint64_t routes = 0;
        for (size_t i = 0; i < E; i++) routes += r[i];
        ds4_imcol_add_sums(base->opts.imatrix, il, h, h + in_n, routes);
    }
    size_t mid_all, routes_all, in_all = cu_imatrix_floats(c, &mid_all, &routes_all);
    if (!rc && e == cudaSuccess) e = cudaMemsetAsync(b->imx_in, 0, in_all * sizeof(double), b->st);
    if (!rc && e == cudaSuccess) e = cudaMemsetAsync(b->imx_mid, 0, mid_all * sizeof(double), b->st);
    if (!rc && e == cudaSuccess) e = cudaMemsetAsync(b->imx_routes, 0, routes_all * sizeof(uint64_t), b->st);
    if (!rc && e != cudaSuccess)
        rc = ds4_err_set(err, DS4_EIO, "CUDA: reading the imatrix sums: %s", cudaGetErrorString(e));
    free(h);
    free(r);
    return rc;
}
