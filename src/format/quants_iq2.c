/*
 * quants_iq2.c - IQ2_XXS encoder: importance-weighted search over the 256
 * grid vectors, the 16 group scales and the super-block scale.
 *
 * Model of one super-block: value = dl(S) * grid(g)[k] * sign, with
 * dl(S) = f16(d) * (0.5 + S) * 0.25 per group of 32 and the sign pattern of
 * each 8 values having an even number of minus signs.  The error minimised is
 * sum w (x - value)^2 with w the caller's importance, or x^2 of the row when
 * none is given (the per-row form of the column-energy fallback).
 *
 * Search, per super-block:
 *   - for a given multiplier dl, each 8-value subgroup takes signs from x,
 *     rounds |x|/dl to the nearest level {8, 25, 43} per element, and looks
 *     that 3^8 pattern up in a precomputed list of the nearest grid vectors
 *     (by squared distance in level space).  Each listed vector is scored by
 *     the exact weighted error; when the sign count is odd, the cheapest
 *     element to flip is flipped (its cost 4 w |x| dl v is added);
 *   - per group, a sweep of dl over amax/r (r = 8..50, then the midpoints
 *     around the best), refined by least squares on the chosen grid vectors,
 *     gives the ideal float multiplier;
 *   - the super-block scale d is chosen among candidates near
 *     8 * max(ideal dl) / 31, each rounded to f16; for each, every group tries
 *     the integers S around its ideal with the exact decoder multiplier, and
 *     the d with the lowest total error wins;
 *   - finally d is refitted by least squares on the chosen S, vectors and
 *     signs, and the refit is kept if it lowers the error.
 * The candidate counts (12 listed vectors, 8 + 2 sweep points, 2 d
 * candidates, 4 S values) were tuned on N(0,1) data: doubling any of them
 * buys < 0.3% RMSE at up to twice the time.
 */
#include "format/quants_impl.h"

#include <math.h>
#include <pthread.h>

static inline float max_f(float a, float b) { return b > a ? b : a; }

static inline float min_f(float a, float b) { return b < a ? b : a; }

#define NPATTERN 6561 /* 3^8 */
#define NCAND    12   /* grid vectors listed per pattern */

static const float LEVEL[3] = {8.0f, 25.0f, 43.0f};

static struct {
    uint8_t level[256][8]; /* 0, 1, 2 per element of each grid vector */
    uint8_t slot[256][8];  /* 3 k + level: index into a subgroup's cost table */
    float value[256][8];   /* 8, 25, 43 */
    uint8_t cand[NPATTERN][NCAND];
} tables;

static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (int g = 0; g < 256; g++) {
        for (int k = 0; k < 8; k++) {
            uint8_t v = (uint8_t)(ds4_iq2xxs_grid[g] >> (8 * k));
            tables.level[g][k] = v == 8 ? 0 : v == 25 ? 1 : 2;
            tables.slot[g][k] = (uint8_t)(3 * k + tables.level[g][k]);
            tables.value[g][k] = (float)v;
        }
    }
    float dist2[3][3];
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 3; j++) dist2[i][j] = (LEVEL[i] - LEVEL[j]) * (LEVEL[i] - LEVEL[j]);
    }
    for (int p = 0; p < NPATTERN; p++) {
        int lv[8];
        for (int k = 0, t = p; k < 8; k++, t /= 3) lv[k] = t % 3;
        /* Keep the NCAND nearest, sorted by distance then index. */
        float best_d[NCAND];
        int count = 0;
        for (int g = 0; g < 256; g++) {
            float d = 0;
            for (int k = 0; k < 8; k++) d += dist2[lv[k]][tables.level[g][k]];
            if (count == NCAND && !(d < best_d[NCAND - 1])) continue;
            int i = count < NCAND ? count++ : NCAND - 1;
            while (i > 0 && d < best_d[i - 1]) {
                best_d[i] = best_d[i - 1];
                tables.cand[p][i] = tables.cand[p][i - 1];
                i--;
            }
            best_d[i] = d;
            tables.cand[p][i] = (uint8_t)g;
        }
    }
}

/* One 8-value subgroup prepared for scoring: |x|, weights, w|x|, sign bits. */
typedef struct {
    float ax[8], w[8], wa[8];
    uint8_t neg;
} iq2_sub;

typedef struct {
    uint8_t grid;
    uint8_t signs; /* the sign byte actually stored (even parity) */
} iq2_pick;

/* Best grid vector and signs of one subgroup under multiplier dl; returns
 * the weighted error.  The error of each element at each of the 3 levels,
 * and the cost of flipping its sign there, are tabulated first, so scoring
 * a candidate vector is 8 lookups (16 when the sign count is odd). */
static float iq2_best_sub(const iq2_sub *s, float dl, iq2_pick *pick) {
    float err[24], flip[24]; /* [3 k + level] */
    int p = 0;
    for (int k = 7; k >= 0; k--) {
        for (int lv = 0; lv < 3; lv++) {
            float r = s->ax[k] - dl * LEVEL[lv];
            err[3 * k + lv] = s->w[k] * r * r;
            flip[3 * k + lv] = 4.0f * dl * LEVEL[lv] * s->wa[k];
        }
        float t = s->ax[k];
        p = 3 * p + (t < 16.5f * dl ? 0 : t < 34.0f * dl ? 1 : 2);
    }
    int odd = __builtin_popcount(s->neg) & 1;
    float best = INFINITY;
    int best_g = 0, best_flip = 0;
    for (int c = 0; c < NCAND; c++) {
        int g = tables.cand[p][c];
        const uint8_t *o = tables.slot[g];
        float e = ((err[o[0]] + err[o[1]]) + (err[o[2]] + err[o[3]])) +
                  ((err[o[4]] + err[o[5]]) + (err[o[6]] + err[o[7]]));
        int flip_k = 0;
        if (odd) {
            float fmin = flip[o[0]];
#pragma GCC unroll 8
            for (int k = 1; k < 8; k++) {
                if (flip[o[k]] < fmin) {
                    fmin = flip[o[k]];
                    flip_k = k;
                }
            }
            e += fmin;
        }
        if (e < best) {
            best = e;
            best_g = g;
            best_flip = flip_k;
        }
    }
    pick->grid = (uint8_t)best_g;
    pick->signs = (uint8_t)(s->neg ^ (odd ? 1u << best_flip : 0u));
    return best;
}

static float iq2_group_error(const iq2_sub *sub, float dl, iq2_pick picks[4]) {
    float e = 0;
    for (int l = 0; l < 4; l++) e += iq2_best_sub(&sub[l], dl, &picks[l]);
    return e;
}

/* Least-squares multiplier for the vectors and signs already picked. */
static float iq2_refit(const iq2_sub *sub, const iq2_pick picks[4]) {
    double num = 0, den = 0;
    for (int l = 0; l < 4; l++) {
        const float *v = tables.value[picks[l].grid];
        for (int k = 0; k < 8; k++) {
            int flipped = ((picks[l].signs ^ sub[l].neg) >> k) & 1;
            num += (flipped ? -1.0 : 1.0) * sub[l].wa[k] * v[k];
            den += (double)sub[l].w[k] * v[k] * v[k];
        }
    }
    return den > 0 ? (float)(num / den) : 0.0f;
}

/* Least-squares super-block scale: value = d * (2S+1)/8 * v * sign. */
static float iq2_refit_d(const iq2_sub sub[8][4], const int S[8], const iq2_pick picks[8][4]) {
    double num = 0, den = 0;
    for (int ib = 0; ib < 8; ib++) {
        double m = (2.0 * S[ib] + 1.0) / 8.0;
        for (int l = 0; l < 4; l++) {
            const iq2_sub *s = &sub[ib][l];
            const float *v = tables.value[picks[ib][l].grid];
            for (int k = 0; k < 8; k++) {
                int flipped = ((picks[ib][l].signs ^ s->neg) >> k) & 1;
                num += (flipped ? -1.0 : 1.0) * s->wa[k] * m * v[k];
                den += (double)s->w[k] * m * m * v[k] * v[k];
            }
        }
    }
    return den > 0 ? (float)(num / den) : 0.0f;
}

/* The ideal float multiplier of one group (before S is quantized). */
static float iq2_group_ideal(const iq2_sub *sub, float amax) {
    iq2_pick picks[4];
    float best_e = INFINITY, best_r = 8.0f;
    /* coarse sweep of amax / dl over 8 .. 50, then the two midpoints around
     * the best */
    for (int i = 0; i < 8; i++) {
        float r = 8.0f + 6.0f * (float)i;
        float e = iq2_group_error(sub, amax / r, picks);
        if (e < best_e) {
            best_e = e;
            best_r = r;
        }
    }
    float center = best_r;
    for (int side = -1; side <= 1; side += 2) {
        float r = center + 3.0f * (float)side;
        float e = iq2_group_error(sub, amax / r, picks);
        if (e < best_e) {
            best_e = e;
            best_r = r;
        }
    }
    float best_dl = amax / best_r;
    for (int it = 0; it < 2; it++) {
        iq2_group_error(sub, best_dl, picks);
        float dl = iq2_refit(sub, picks);
        if (!(dl > 0)) break;
        float e = iq2_group_error(sub, dl, picks);
        if (!(e < best_e)) break;
        best_e = e;
        best_dl = dl;
    }
    return best_dl;
}

static void prepare_group(const float *x, const float *w, iq2_sub sub[4]) {
    float sw = 0;
    for (int i = 0; i < 32; i++) sw += w[i];
    for (int l = 0; l < 4; l++) {
        iq2_sub *s = &sub[l];
        s->neg = 0;
        for (int k = 0; k < 8; k++) {
            float v = x[8 * l + k];
            s->ax[k] = fabsf(v);
            s->w[k] = sw > 0 ? w[8 * l + k] : 1.0f;
            s->wa[k] = s->w[k] * s->ax[k];
            if (v < 0) s->neg |= (uint8_t)(1u << k);
        }
    }
}

/* Decoder multiplier of group scale S under the f16 super-block scale d. */
static inline float iq2_dl(float d, int S) { return d * (0.5f + (float)S) * 0.25f; }

/* For a given f16 d, the best S per group; returns the total error. */
static float iq2_choose_scales(const iq2_sub sub[8][4], const float ideal[8], float d, int S[8]) {
    float total = 0;
    for (int ib = 0; ib < 8; ib++) {
        iq2_pick picks[4];
        float t = (8.0f * ideal[ib] / d - 1.0f) * 0.5f;
        int s0 = t > -2.0f ? (t < 17.0f ? (int)floorf(t) : 17) : -2;
        float best = INFINITY;
        for (int s = s0 - 1; s <= s0 + 2; s++) {
            if (s < 0 || s > 15) continue;
            float e = iq2_group_error(sub[ib], iq2_dl(d, s), picks);
            if (e < best) {
                best = e;
                S[ib] = s;
            }
        }
        if (best == INFINITY) { /* ideal far outside 0..15: clamp */
            S[ib] = s0 < 0 ? 0 : 15;
            best = iq2_group_error(sub[ib], iq2_dl(d, S[ib]), picks);
        }
        total += best;
    }
    return total;
}

static void iq2_block(const float *x, const float *w, ds4_block_iq2_xxs *y) {
    iq2_sub sub[8][4];
    float ideal[8], gmax = 0;
    for (int ib = 0; ib < 8; ib++) {
        prepare_group(x + 32 * ib, w + 32 * ib, sub[ib]);
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = max_f(amax, fabsf(x[32 * ib + i]));
        ideal[ib] = amax > 0 ? iq2_group_ideal(sub[ib], amax) : 0.0f;
        gmax = max_f(gmax, ideal[ib]);
    }
    memset(y, 0, sizeof *y);
    if (!(gmax > 0)) return; /* all-zero block (d = 0 decodes to zeros) */

    static const float factor[] = {1.0f, 1.05f};
    float best_d = 0, best_e = INFINITY;
    int best_S[8] = {0};
    for (size_t f = 0; f < sizeof factor / sizeof factor[0]; f++) {
        float d = ds4_f16_round(min_f(8.0f * gmax / 31.0f * factor[f], 65504.0f));
        if (!(d > 0) || !isfinite(d)) continue;
        int S[8];
        float e = iq2_choose_scales((const iq2_sub(*)[4])sub, ideal, d, S);
        if (e < best_e) {
            best_e = e;
            best_d = d;
            memcpy(best_S, S, sizeof S);
        }
    }
    if (!(best_d > 0)) return;
    iq2_pick picks[8][4];
    for (int ib = 0; ib < 8; ib++) iq2_group_error(sub[ib], iq2_dl(best_d, best_S[ib]), picks[ib]);
    /* Least-squares d for the chosen scales and vectors; kept if it helps. */
    float d2 = ds4_f16_round(min_f(iq2_refit_d(sub, best_S, picks), 65504.0f));
    if (d2 > 0 && d2 != best_d) {
        iq2_pick picks2[8][4];
        float e = 0;
        for (int ib = 0; ib < 8; ib++) e += iq2_group_error(sub[ib], iq2_dl(d2, best_S[ib]), picks2[ib]);
        if (e < best_e) {
            best_d = d2;
            memcpy(picks, picks2, sizeof picks);
        }
    }
    y->d = ds4_f32_to_f16(best_d);
    for (int ib = 0; ib < 8; ib++) {
        uint32_t a = 0, s = (uint32_t)best_S[ib] << 28;
        for (int l = 0; l < 4; l++) {
            a |= (uint32_t)picks[ib][l].grid << (8 * l);
            s |= (uint32_t)(picks[ib][l].signs & 127) << (7 * l);
        }
        memcpy(&y->qs[4 * ib], &a, 4);
        memcpy(&y->qs[4 * ib + 2], &s, 4);
    }
}

void ds4_quantize_iq2_xxs_row(const float *x, ds4_block_iq2_xxs *y, int64_t n, const float *imp) {
    pthread_once(&tables_once, build_tables);
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        const float *xb = x + b * DS4_QK_K;
        float w[DS4_QK_K];
        for (int i = 0; i < DS4_QK_K; i++) {
            float v = imp ? imp[b * DS4_QK_K + i] : xb[i] * xb[i];
            w[i] = v > 0 && v < INFINITY ? v : 0.0f;
        }
        iq2_block(xb, w, &y[b]);
    }
}
