/*
 * cpu_ffn.c - the MoE sublayer (docs/MODEL.md 6.4): router with
 * sqrt(softplus) scores, expert selection (hash table on the first layers,
 * biased top-k elsewhere), routed experts with clamped SwiGLU, the shared
 * expert, HC post.
 *
 * Experts are run expert by expert over the tokens of the chunk that chose
 * them; each token's routed sum is then added up in its selection order, so
 * a token's result does not depend on the other tokens of its chunk.
 *
 * Differences from HF transformers, all at rounding level: the routing
 * weight multiplies the SwiGLU output before the down projection (MODEL.md
 * 6.4 F6; transformers scales the down projection's output), and the weight
 * normaliser is max(sum, 2^-14) (transformers: sum + 1e-20).
 */
#include <math.h>
#include <string.h>

#include "model/cpu/cpu.h"
#include "model/imatrix_collect.h"

/* prob_e = sqrt(softplus(router_e . xn)) for every token. */
static void route_probs(cpu_backend *b, const ds4_layer_weights *w, uint32_t T) {
    const ds4_config *c = b->cfg;
    cpu_matmul(b, &w->gate_inp, 0, 0, c->n_expert, b->xn, c->n_embd, T, b->router, c->n_expert);
    for (size_t i = 0; i < (size_t)T * c->n_expert; i++) b->router[i] = sqrtf(cpu_softplus(b->router[i]));
}

/* Top k of prob + bias: descending, lower index first on ties (a stable
 * insertion sort, MODEL.md 6.4 F4). */
static void select_top_k(const float *prob, const float *bias, uint32_t n, uint32_t k, uint32_t *sel) {
    float best[64];
    uint32_t m = 0;
    for (uint32_t e = 0; e < n; e++) {
        float s = prob[e] + (bias ? bias[e] : 0.0f);
        if (m == k && s <= best[k - 1]) continue;
        uint32_t i = m < k ? m++ : k - 1;
        while (i > 0 && best[i - 1] < s) {
            best[i] = best[i - 1];
            sel[i] = sel[i - 1];
            i--;
        }
        best[i] = s;
        sel[i] = e;
    }
}

static void select_experts(cpu_backend *b, const cpu_layer *L, const uint32_t *tok, uint32_t T) {
    const ds4_layer_weights *w = L->w;
    const ds4_config *c = b->cfg;
    uint32_t k = c->n_expert_used;
    for (uint32_t t = 0; t < T; t++) {
        const float *prob = b->router + (size_t)t * c->n_expert;
        uint32_t *sel = b->sel + (size_t)t * k;
        float *sw = b->selw + (size_t)t * k;
        if (L->hash) memcpy(sel, (const int32_t *)w->tid2eid.data + (size_t)tok[t] * k, k * sizeof(uint32_t));
        else select_top_k(prob, w->exp_bias.data ? cpu_vec(&w->exp_bias) : NULL, c->n_expert, k, sel);
        float sum = 0.0f;
        for (uint32_t i = 0; i < k; i++) sum += (sw[i] = prob[sel[i]]);
        float norm = c->expert_weights_norm ? 1.0f / fmaxf(sum, 6.103515625e-5f) : 1.0f;
        for (uint32_t i = 0; i < k; i++) sw[i] = sw[i] * norm * c->expert_weights_scale;
    }
}

/* Expert e over the tokens that chose it: gate / up, weighted clamped
 * SwiGLU, down into exp_out[token][slot]. */
static void run_expert(cpu_backend *b, const cpu_layer *L, uint32_t e, uint32_t T) {
    const ds4_layer_weights *w = L->w;
    const ds4_config *c = b->cfg;
    uint32_t k = c->n_expert_used, D = c->n_embd, F = c->n_ff_exp, m = 0;
    for (uint32_t t = 0; t < T; t++)
        for (uint32_t i = 0; i < k; i++)
            if (b->sel[(size_t)t * k + i] == e) {
                memcpy(b->gath + (size_t)m * D, b->xn + (size_t)t * D, D * sizeof(float));
                b->gath_t[m++] = t * k + i;
            }
    if (m == 0) return;
    cpu_matmul(b, &w->gate_exps, e, 0, F, b->gath, D, m, b->eg, F);
    cpu_matmul(b, &w->up_exps, e, 0, F, b->gath, D, m, b->eu, F);
    float limit = L->clamp;
    for (uint32_t r = 0; r < m; r++) {
        float weight = b->selw[b->gath_t[r]];
        float *g = b->eg + (size_t)r * F;
        const float *u = b->eu + (size_t)r * F;
        for (uint32_t f = 0; f < F; f++) g[f] = cpu_swiglu(g[f], u[f], limit) * weight;
    }
    if (L->observe && b->base.opts.imatrix) ds4_imcol_expert(b->base.opts.imatrix, L->jl, e, m, b->gath, b->eg);
    cpu_matmul(b, &w->down_exps, e, 0, D, b->eg, F, m, b->gath, D);
    for (uint32_t r = 0; r < m; r++)
        memcpy(b->exp_out + (size_t)b->gath_t[r] * D, b->gath + (size_t)r * D, D * sizeof(float));
}

static void shared_expert(cpu_backend *b, const cpu_layer *L, uint32_t T) {
    const ds4_layer_weights *w = L->w;
    const ds4_config *c = b->cfg;
    uint32_t D = c->n_embd, F = c->n_ff_exp;
    cpu_matmul(b, &w->gate_sh, 0, 0, F, b->xn, D, T, b->sg, F);
    cpu_matmul(b, &w->up_sh, 0, 0, F, b->xn, D, T, b->su, F);
    for (size_t i = 0; i < (size_t)T * F; i++) b->sg[i] = cpu_swiglu(b->sg[i], b->su[i], L->clamp);
    cpu_matmul(b, &w->down_sh, 0, 0, D, b->sg, F, T, b->y, D);
}

void cpu_ffn_layer(cpu_backend *b, const cpu_layer *L, const uint32_t *tok, uint32_t T) {
    const ds4_config *c = b->cfg;
    const ds4_layer_weights *w = L->w;
    uint32_t D = c->n_embd, k = c->n_expert_used;

    cpu_hc_pre(b, &w->hc_ffn_fn, &w->hc_ffn_scale, &w->hc_ffn_base, T);
    for (uint32_t t = 0; t < T; t++)
        cpu_rmsnorm(b->xn + (size_t)t * D, b->x + (size_t)t * D, cpu_vec(&w->ffn_norm), D, c->rms_eps);
    route_probs(b, w, T);
    select_experts(b, L, tok, T);
    for (uint32_t e = 0; e < c->n_expert; e++) run_expert(b, L, e, T);
    shared_expert(b, L, T);
    /* y = shared + routed, the routed outputs added in selection order. */
    for (uint32_t t = 0; t < T; t++) {
        float *y = b->y + (size_t)t * D;
        for (uint32_t d = 0; d < D; d++) {
            float routed = 0.0f;
            for (uint32_t i = 0; i < k; i++) routed += b->exp_out[((size_t)t * k + i) * D + d];
            y[d] = routed + y[d];
        }
    }
    cpu_steer(b, L, T, true);
    cpu_hc_post(b, T);
}
