/*
 * cpu_hc.c - hyper-connections (docs/MODEL.md 5): the 4 residual streams
 * mixed into one sublayer input (HC pre, with a Sinkhorn-normalised
 * combination matrix), written back after the sublayer (HC post), and
 * collapsed before the output head.
 *
 * Layout: the state of a token is n_hc streams of n_embd floats, stream h
 * at [h*n_embd, (h+1)*n_embd).  comb[a + n_hc*b] is the weight of source
 * stream b in destination stream a (MODEL.md 5.2 step 5; transformers
 * stores the same matrix as comb[b][a] and multiplies by its transpose).
 */
#include <math.h>
#include <string.h>

#include "model/cpu/cpu.h"
#include "model/steering.h"

/* f = RMSNorm(flatten(S)) for every token, then m = fn . f. */
static void hc_mix(cpu_backend *b, const ds4_wt *fn, uint32_t T) {
    const ds4_config *c = b->cfg;
    uint32_t flat = c->n_hc * c->n_embd, nmix = (uint32_t)fn->ne[1];
    for (uint32_t t = 0; t < T; t++)
        cpu_rmsnorm(b->flat + (size_t)t * flat, b->S + (size_t)t * flat, NULL, flat, c->rms_eps);
    cpu_matmul(b, fn, 0, 0, nmix, b->flat, flat, T, b->mix, nmix);
}

/* Sinkhorn normalisation of the n x n matrix C[a + n*b] (MODEL.md 5.2). */
static void sinkhorn(float *C, uint32_t n, uint32_t iters, float eps) {
    for (uint32_t bb = 0; bb < n; bb++) { /* softmax over a, per column b */
        float mx = -INFINITY, sum = 0.0f;
        for (uint32_t a = 0; a < n; a++) mx = fmaxf(mx, C[a + n * bb]);
        for (uint32_t a = 0; a < n; a++) sum += (C[a + n * bb] = expf(C[a + n * bb] - mx));
        for (uint32_t a = 0; a < n; a++) C[a + n * bb] = C[a + n * bb] / sum + eps;
    }
    for (uint32_t it = 0; it < iters; it++) {
        if (it > 0)
            for (uint32_t bb = 0; bb < n; bb++) {
                float sum = 0.0f;
                for (uint32_t a = 0; a < n; a++) sum += C[a + n * bb];
                for (uint32_t a = 0; a < n; a++) C[a + n * bb] /= sum + eps;
            }
        for (uint32_t a = 0; a < n; a++) {
            float sum = 0.0f;
            for (uint32_t bb = 0; bb < n; bb++) sum += C[a + n * bb];
            for (uint32_t bb = 0; bb < n; bb++) C[a + n * bb] /= sum + eps;
        }
    }
}

void cpu_hc_pre(cpu_backend *b, const ds4_wt *fn, const ds4_wt *scale_t, const ds4_wt *base_t, uint32_t T) {
    const ds4_config *c = b->cfg;
    uint32_t n = c->n_hc, D = c->n_embd, nmix = ds4_hc_mix(c);
    const float *scale = cpu_vec(scale_t), *base = cpu_vec(base_t);
    hc_mix(b, fn, T);
    for (uint32_t t = 0; t < T; t++) {
        const float *m = b->mix + (size_t)t * nmix;
        float *post = b->post + (size_t)t * n, *comb = b->comb + (size_t)t * n * n;
        float pre[16];
        for (uint32_t h = 0; h < n; h++) {
            pre[h] = cpu_sigmoid(m[h] * scale[0] + base[h]) + c->hc_eps;
            post[h] = 2.0f * cpu_sigmoid(m[n + h] * scale[1] + base[n + h]);
        }
        for (uint32_t k = 0; k < n * n; k++) comb[k] = m[2 * n + k] * scale[2] + base[2 * n + k];
        sinkhorn(comb, n, c->hc_sinkhorn_iters, c->hc_eps);
        /* x = sum_h pre_h S_h (the pre weights are not normalised) */
        const float *S = b->S + (size_t)t * n * D;
        float *x = b->x + (size_t)t * D;
        for (uint32_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (uint32_t h = 0; h < n; h++) acc += pre[h] * S[(size_t)h * D + d];
            x[d] = acc;
        }
    }
}

void cpu_steer(cpu_backend *b, const cpu_layer *L, uint32_t T, bool ffn) {
    const ds4_backend_opts *o = &b->base.opts;
    if (!L->steer) return;
    uint32_t D = b->cfg->n_embd;
    if (o->steer) {
        const float *v = o->steer->dir + (size_t)L->il * D;
        for (uint32_t t = 0; t < T; t++) {
            const ds4_seq *s = &b->rows[t].s->base;
            float scale = ffn ? s->steer_ffn : s->steer_attn;
            if (scale != 0.0f) ds4_steer_rows(v, scale, b->y + (size_t)t * D, D, 1, D);
        }
    }
    if (o->act_observer) o->act_observer(o->act_ctx, L->il, ffn, T, b->y);
}

void cpu_hc_post(cpu_backend *b, uint32_t T) {
    const ds4_config *c = b->cfg;
    uint32_t n = c->n_hc, D = c->n_embd;
    float old[16];
    for (uint32_t t = 0; t < T; t++) {
        float *S = b->S + (size_t)t * n * D;
        const float *y = b->y + (size_t)t * D, *post = b->post + (size_t)t * n, *comb = b->comb + (size_t)t * n * n;
        for (uint32_t d = 0; d < D; d++) {
            for (uint32_t h = 0; h < n; h++) old[h] = S[(size_t)h * D + d];
            for (uint32_t a = 0; a < n; a++) {
                float acc = post[a] * y[d];
                for (uint32_t src = 0; src < n; src++) acc += comb[a + n * src] * old[src];
                S[(size_t)a * D + d] = acc;
            }
        }
    }
}

void cpu_output_head(cpu_backend *b, const ds4_wt *fn, const ds4_wt *scale_t, const ds4_wt *base_t, const ds4_wt *norm,
                     uint32_t T, float *const *dst) {
    const ds4_weights *w = b->base.w;
    const ds4_config *c = b->cfg;
    uint32_t n = c->n_hc, D = c->n_embd;
    const float *scale = cpu_vec(scale_t), *base = cpu_vec(base_t);
    uint32_t m_rows = 0;
    for (uint32_t t = 0; t < T; t++) m_rows += dst[t] != NULL;
    if (m_rows == 0) return;
    hc_mix(b, fn, T);
    /* z = sum_h w_h S_h, then the output norm; gathered into b->xn. */
    m_rows = 0;
    for (uint32_t t = 0; t < T; t++) {
        if (!dst[t]) continue;
        const float *mix = b->mix + (size_t)t * n, *S = b->S + (size_t)t * n * D;
        float wh[16];
        for (uint32_t h = 0; h < n; h++) wh[h] = cpu_sigmoid(mix[h] * scale[0] + base[h]) + c->hc_eps;
        float *z = b->x + (size_t)m_rows * D;
        for (uint32_t d = 0; d < D; d++) {
            float acc = 0.0f;
            for (uint32_t h = 0; h < n; h++) acc += wh[h] * S[(size_t)h * D + d];
            z[d] = acc;
        }
        cpu_rmsnorm(b->xn + (size_t)m_rows * D, z, cpu_vec(norm), D, c->rms_eps);
        m_rows++;
    }
    /* The head's product over runs of rows whose destinations follow each
     * other (all of them when a prefill wants every row's logits), so that
     * its rows are read once a run. */
    uint32_t done = 0;
    for (uint32_t t = 0; t < T;) {
        if (!dst[t]) {
            t++;
            continue;
        }
        uint32_t run = 1;
        for (uint32_t u = t + 1; u < T && dst[u]; u++, run++)
            if (dst[u] != dst[t] + (size_t)run * c->n_vocab) break;
        cpu_matmul(b, &w->output, 0, 0, c->n_vocab, b->xn + (size_t)done * D, D, run, dst[t], c->n_vocab);
        done += run;
        t += run;
        while (t < T && !dst[t]) t++;
    }
}
