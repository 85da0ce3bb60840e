/*
 * cuda_steer.cu - directional steering on the GPU (model/steering.h): each
 * row y of a sublayer output becomes y - s v (v . y), with the dot product
 * reduced in double as the CPU's ds4_steer_dot, and the update rounded
 * step by step as the CPU's (no fused multiply-add).  The FFN's output,
 * which the HC post otherwise sums on the fly from the routed and shared
 * experts' rows, is summed here first in the HC post's order.
 */
#include "model/cuda/cuda_internal.h"

extern "C" {
#include "model/steering.h"
}

#define STEER_THREADS 256

/* One block per row t.  eout (T x k x D) and sout (T x D), when given, are
 * summed into y first (a slot with hsel < 0 from hout: an expert on the
 * host, cuda_offload.h); s == 0 only sums. */
static __global__ void steer_kernel(float *y, const float *eout, const float *sout, uint32_t k, const int *hsel,
                                    const float *hout, const float *v, float s, uint32_t D) {
    dev_pdl_enter();
    __shared__ double part[STEER_THREADS];
    uint32_t t = blockIdx.x;
    float *row = y + (size_t)t * D;
    double acc = 0.0;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        float yd;
        if (eout) {
            float routed = 0.0f;
            for (uint32_t i = 0; i < k; i++) {
                size_t at = ((size_t)t * k + i) * D + d;
                routed += hsel && hsel[(size_t)t * k + i] < 0 ? hout[at] : eout[at];
            }
            yd = routed + sout[(size_t)t * D + d];
            row[d] = yd;
        } else {
            yd = row[d];
        }
        if (s != 0.0f) acc += (double)v[d] * (double)yd;
    }
    if (s == 0.0f) return;
    part[threadIdx.x] = acc;
    __syncthreads();
    for (uint32_t half = STEER_THREADS / 2; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    float coef = __fmul_rn(s, (float)part[0]);
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) row[d] = __fsub_rn(row[d], __fmul_rn(coef, v[d]));
}

/* The rows to the activation observer (host code between launches). */
static int observe(cuda_backend *b, uint32_t il, uint32_t T, bool ffn, ds4_err *err) {
    const ds4_backend_opts *o = &b->base.opts;
    size_t n = (size_t)T * b->cfg->n_embd;
    CU_TRY(cudaMemcpyAsync(b->obs_h, b->y, n * sizeof(float), cudaMemcpyDeviceToHost, b->st));
    CU_TRY(cudaStreamSynchronize(b->st));
    o->act_observer(o->act_ctx, il, ffn, T, b->obs_h);
    return 0;
}

int cu_steer(cuda_backend *b, uint32_t il, uint32_t T, bool ffn, bool decode, hc_post_src *post, ds4_err *err) {
    const ds4_backend_opts *o = &b->base.opts;
    if (il >= b->cfg->n_layer) return 0; /* the MTP block's layer: neither steered nor observed */
    float s = !b->d_steer ? 0.0f : ffn ? b->sq->base.steer_ffn : b->sq->base.steer_attn;
    bool obs = o->act_observer && !decode;
    if (s == 0.0f && !obs) return 0;
    uint32_t D = b->cfg->n_embd;
    if (s != 0.0f || post->eout) {
        const float *v = b->d_steer ? b->d_steer + (size_t)il * D : NULL;
        DS4_LAUNCH(steer_kernel, T, STEER_THREADS, 0, b->st, b->y, post->eout, post->sout, post->k, post->hsel,
                   post->hout, v, s, D);
        CU_LAUNCHED();
        post->y = b->y;
        post->eout = post->sout = NULL;
        post->k = 0;
        post->hsel = NULL;
        post->hout = NULL;
    }
    return obs ? observe(b, il, T, ffn, err) : 0;
}
