/*
 * rope.c - RoPE / YaRN frequency tables and the pair rotation (see rope.h).
 */
#include "model/rope.h"

#include <math.h>

/* YaRN correction dimension: the pair index whose wavelength makes
 * `rotations` turns over the original context (docs/MODEL.md 4.5). */
static double yarn_corr_dim(double rotations, double dim, double base, double orig_ctx) {
    return dim * log(orig_ctx / (rotations * 2.0 * M_PI)) / (2.0 * log(base));
}

void ds4_rope_init(ds4_rope *r, const ds4_config *c, bool compressed) {
    uint32_t dim = c->rope_dim;
    float base = compressed ? c->compress_rope_base : c->rope_base;
    r->n_pairs = dim / 2;
    double low = 0, high = 0;
    if (compressed) {
        low = floor(yarn_corr_dim(c->yarn_beta_fast, dim, base, (double)c->yarn_orig_ctx));
        high = ceil(yarn_corr_dim(c->yarn_beta_slow, dim, base, (double)c->yarn_orig_ctx));
        if (low < 0) low = 0;
        if (high > dim - 1) high = dim - 1;
        if (high == low) high += 0.001; /* a single-step ramp */
    }
    for (uint32_t k = 0; k < r->n_pairs; k++) {
        float pos_freq = powf(base, (float)(2 * k) / (float)dim);
        float extrap = 1.0f / pos_freq;
        if (!compressed) {
            r->inv_freq[k] = extrap;
            continue;
        }
        float interp = 1.0f / (c->yarn_factor * pos_freq);
        float ramp = (float)(((double)k - low) / (high - low));
        ramp = fminf(fmaxf(ramp, 0.0f), 1.0f);
        float keep = 1.0f - ramp; /* weight of the original (extrapolated) frequency */
        r->inv_freq[k] = interp * (1.0f - keep) + extrap * keep;
    }
}

void ds4_rope_apply(const ds4_rope *r, float *tail, uint32_t pos, bool inverse) {
    for (uint32_t k = 0; k < r->n_pairs; k++) {
        float theta = (float)pos * r->inv_freq[k];
        float c = cosf(theta), s = sinf(theta);
        if (inverse) s = -s;
        float x0 = tail[2 * k], x1 = tail[2 * k + 1];
        tail[2 * k] = x0 * c - x1 * s;
        tail[2 * k + 1] = x0 * s + x1 * c;
    }
}
