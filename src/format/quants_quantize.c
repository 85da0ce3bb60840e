/*
 * quants_quantize.c - encoders for Q8_0 (byte-identical to gguf-py) and for
 * the K-quants Q2_K and Q4_K (our own importance-weighted fitting).
 *
 * K-quant fitting, per 256-value super-block:
 *   1. every sub-block (16 values for Q2_K, 32 for Q4_K) gets the float
 *      scale a >= 0 and min m >= 0 minimising sum w (x - (a q - m))^2 over
 *      q in 0..nmax: a sweep of candidate steps around (max - min) / nmax,
 *      each followed by a weighted least-squares fit of (a, m) to the
 *      assigned levels, then a few reassign-and-refit rounds;
 *   2. the sub-block scales and mins become integers under the f16
 *      super-block factors d = max a / smax and dmin = max m / smax;
 *   3. every value is reassigned under the integer scales, and (d, dmin) are
 *      refitted by least squares over the whole super-block; the refit is
 *      kept when it lowers the weighted error as the decoder will see it.
 * Weights are the caller's importance (any w >= 0), or 1 when none is given;
 * a sub-block whose weights are all zero is fitted with uniform weights.
 */
#include "format/quants_impl.h"

#include <math.h>

/* ---------------------------------------------------------------- Q8_0 */

/* gguf-py's np_roundf: floor(a) + floor(2 (a - floor(a))), sign restored;
 * half away from zero.  Exact for |v| < 2^23, which covers |x/d| <= 127. */
static int round_away(float v) {
    float a = fabsf(v);
    if (!(a < 8388608.0f)) return 0; /* only NaN reaches here for Q8_0 */
    int t = (int)a;
    int r = t + (a - (float)t >= 0.5f);
    return v < 0 ? -r : r;
}

void ds4_quantize_q8_0_row(const float *x, ds4_block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / DS4_QK8_0; i++) {
        const float *xb = x + i * DS4_QK8_0;
        float amax = 0.0f;
        for (int k = 0; k < DS4_QK8_0; k++) {
            float a = fabsf(xb[k]);
            if (!(a <= amax)) amax = a; /* NaN propagates, as numpy's max */
        }
        /* q is computed from the f32 scale, the f16 one is only stored. */
        float d = amax / 127.0f;
        float id = d == 0.0f ? 0.0f : 1.0f / d;
        y[i].d = ds4_f32_to_f16(d);
        for (int k = 0; k < DS4_QK8_0; k++) y[i].qs[k] = (int8_t)round_away(xb[k] * id);
    }
}

/* ------------------------------------------------------------- K-quants */

typedef struct {
    int sub;  /* values per sub-block */
    int nsub; /* sub-blocks per super-block */
    int nmax; /* largest quant level */
    int smax; /* largest integer scale / min */
} kq_shape;

static const kq_shape Q2K_SHAPE = {16, 16, 3, 15};
static const kq_shape Q4K_SHAPE = {32, 8, 15, 63};

static inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Nearest integer, ties to even (the 1.5 * 2^23 trick, exact for
 * |v| < 2^22); larger values, infinities and NaN (from inf/NaN input) are
 * clamped first so the result stays a valid int. */
static inline int nearest_int(float v) {
    v = v > -4194304.0f ? (v < 4194304.0f ? v : 4194304.0f) : -4194304.0f;
    float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, 4);
    return (bits & 0x7fffff) - 0x400000;
}

static inline float min_f(float a, float b) { return b < a ? b : a; }

static inline float max_f(float a, float b) { return b > a ? b : a; }

/* Weighted error of x ~ a q + b for the levels in q. */
static double kq_error(int n, const float *x, const float *w, const uint8_t *q, float a, float b) {
    double e = 0;
    for (int i = 0; i < n; i++) {
        float r = a * (float)q[i] + b - x[i];
        e += (double)w[i] * r * r;
    }
    return e;
}

/* Weighted least squares of x ~ a q + b with b <= 0; returns 0 when the
 * levels carry no information (all equal). */
static int kq_fit(int n, const float *x, const float *w, const uint8_t *q, float *pa, float *pb) {
    double sw = 0, sq = 0, sqq = 0, sx = 0, sqx = 0;
    for (int i = 0; i < n; i++) {
        double wi = w[i], qi = q[i];
        sw += wi;
        sq += wi * qi;
        sqq += wi * qi * qi;
        sx += wi * x[i];
        sqx += wi * qi * x[i];
    }
    double det = sw * sqq - sq * sq;
    if (sqq <= 0) return 0;
    double a, b;
    if (det > 1e-12 * sw * sqq) {
        a = (sw * sqx - sq * sx) / det;
        b = (sqq * sx - sq * sqx) / det;
    } else {
        a = sqx / sqq;
        b = 0;
    }
    if (b > 0) { /* the format's offset is -dmin * m with m >= 0 */
        b = 0;
        a = sqx / sqq;
    }
    if (!(a > 0)) return 0;
    *pa = (float)a;
    *pb = (float)b;
    return 1;
}

static void kq_assign(int n, int nmax, const float *x, float a, float b, uint8_t *q) {
    float ia = a > 0 ? 1.0f / a : 0.0f;
    for (int i = 0; i < n; i++) q[i] = (uint8_t)clamp_int(nearest_int((x[i] - b) * ia), 0, nmax);
}

/* Step 1: the best float scale a and min m (returned as m >= 0) of one
 * sub-block. */
static void kq_fit_sub(int n, int nmax, const float *x, const float *w, float *pa, float *pm) {
    float xmin = 0.0f, xmax = x[0];
    for (int i = 0; i < n; i++) {
        xmin = min_f(xmin, x[i]);
        xmax = max_f(xmax, x[i]);
    }
    *pa = 0.0f;
    *pm = -xmin;
    if (!(xmax > xmin)) return;
    uint8_t q[32], best_q[32];
    float best_a = (xmax - xmin) / (float)nmax, best_b = xmin;
    kq_assign(n, nmax, x, best_a, best_b, best_q);
    double best_e = kq_error(n, x, w, best_q, best_a, best_b);
    /* Candidate steps: (max - min) / (nmax + delta) for delta in -0.5..1.5. */
    for (int k = 0; k <= 20; k++) {
        float a = (xmax - xmin) / ((float)nmax - 0.5f + 0.1f * (float)k), b = xmin;
        kq_assign(n, nmax, x, a, b, q);
        if (!kq_fit(n, x, w, q, &a, &b)) continue;
        double e = kq_error(n, x, w, q, a, b);
        if (e < best_e) {
            best_e = e;
            best_a = a;
            best_b = b;
            memcpy(best_q, q, (size_t)n);
        }
    }
    for (int it = 0; it < 3; it++) { /* reassign under the best fit, refit */
        float a = best_a, b = best_b;
        kq_assign(n, nmax, x, a, b, q);
        if (!kq_fit(n, x, w, q, &a, &b)) break;
        double e = kq_error(n, x, w, q, a, b);
        if (!(e < best_e)) break;
        best_e = e;
        best_a = a;
        best_b = b;
    }
    *pa = best_a;
    *pm = -best_b;
}

/* Levels under integer scales: value = (d*sc) q - (dmin*m), with the f32
 * products the decoder forms.  Returns the weighted error. */
static double kq_assign_block(const kq_shape *s, const float *x, const float *w, float d, float dmin, const uint8_t *sc,
                              const uint8_t *mn, uint8_t *q) {
    double e = 0;
    for (int j = 0; j < s->nsub; j++) {
        float dl = d * (float)sc[j], ml = dmin * (float)mn[j];
        const float *xs = x + j * s->sub;
        uint8_t *qs = q + j * s->sub;
        if (dl > 0) kq_assign(s->sub, s->nmax, xs, dl, -ml, qs);
        else memset(qs, 0, (size_t)s->sub);
        for (int i = 0; i < s->sub; i++) {
            float r = dl * (float)qs[i] - ml - xs[i];
            e += (double)w[j * s->sub + i] * r * r;
        }
    }
    return e;
}

/* Step 3: least squares of x ~ d (sc q) - dmin m over the super-block. */
static void kq_refit_block(const kq_shape *s, const float *x, const float *w, const uint8_t *sc, const uint8_t *mn,
                           const uint8_t *q, float *pd, float *pdmin) {
    double suu = 0, suv = 0, svv = 0, sux = 0, svx = 0;
    for (int i = 0; i < DS4_QK_K; i++) {
        int j = i / s->sub;
        double wi = w[i], u = (double)sc[j] * q[i], v = -(double)mn[j];
        suu += wi * u * u;
        suv += wi * u * v;
        svv += wi * v * v;
        sux += wi * u * x[i];
        svx += wi * v * x[i];
    }
    double det = suu * svv - suv * suv;
    if (suu > 0 && svv > 0 && det > 1e-12 * suu * svv) {
        *pd = (float)((sux * svv - suv * svx) / det);
        *pdmin = (float)((suu * svx - suv * sux) / det);
    } else if (suu > 0) {
        *pd = (float)(sux / suu);
    }
}

/* Quantize one super-block: levels q[256], integer scales and mins, f16 d and
 * dmin. */
static void kq_block(const kq_shape *s, const float *x, const float *imp, uint8_t *q, uint8_t *sc, uint8_t *mn,
                     uint16_t *d16, uint16_t *dmin16) {
    float w[DS4_QK_K];
    for (int i = 0; i < DS4_QK_K; i++) {
        float v = imp ? imp[i] : 1.0f;
        w[i] = v > 0 && v < INFINITY ? v : 0.0f;
    }
    float a[16], m[16], amax = 0, mmax = 0;
    for (int j = 0; j < s->nsub; j++) {
        float *ws = w + j * s->sub;
        float sw = 0;
        for (int i = 0; i < s->sub; i++) sw += ws[i];
        if (!(sw > 0)) {
            for (int i = 0; i < s->sub; i++) ws[i] = 1.0f;
        }
        kq_fit_sub(s->sub, s->nmax, x + j * s->sub, ws, &a[j], &m[j]);
        amax = max_f(amax, a[j]);
        mmax = max_f(mmax, m[j]);
    }
    /* Saturate at the largest f16: values beyond it are not representable,
     * but the block stays finite. */
    float d = ds4_f16_round(min_f(amax / (float)s->smax, 65504.0f));
    float dmin = ds4_f16_round(min_f(mmax / (float)s->smax, 65504.0f));
    for (int j = 0; j < s->nsub; j++) {
        sc[j] = (uint8_t)(d > 0 ? clamp_int(nearest_int(a[j] / d), 0, s->smax) : 0);
        mn[j] = (uint8_t)(dmin > 0 ? clamp_int(nearest_int(m[j] / dmin), 0, s->smax) : 0);
    }
    double best = kq_assign_block(s, x, w, d, dmin, sc, mn, q);
    uint8_t q2[DS4_QK_K];
    for (int it = 0; it < 2; it++) {
        float d2 = d, dmin2 = dmin;
        kq_refit_block(s, x, w, sc, mn, q, &d2, &dmin2);
        d2 = ds4_f16_round(d2);
        dmin2 = ds4_f16_round(dmin2);
        if (!isfinite(d2) || !isfinite(dmin2)) break;
        double e = kq_assign_block(s, x, w, d2, dmin2, sc, mn, q2);
        if (!(e < best)) break;
        best = e;
        d = d2;
        dmin = dmin2;
        memcpy(q, q2, DS4_QK_K);
    }
    *d16 = ds4_f32_to_f16(d);
    *dmin16 = ds4_f32_to_f16(dmin);
}

void ds4_quantize_q2_K_row(const float *x, ds4_block_q2_K *y, int64_t n, const float *imp) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        uint8_t q[DS4_QK_K], sc[16], mn[16];
        kq_block(&Q2K_SHAPE, x + b * DS4_QK_K, imp ? imp + b * DS4_QK_K : NULL, q, sc, mn, &y[b].d, &y[b].dmin);
        for (int j = 0; j < 16; j++) y[b].scales[j] = (uint8_t)(sc[j] | mn[j] << 4);
        memset(y[b].qs, 0, sizeof y[b].qs);
        for (int i = 0; i < DS4_QK_K; i++) {
            int h = i / 128, j = (i % 128) / 32, l = i % 32;
            y[b].qs[32 * h + l] |= (uint8_t)(q[i] << (2 * j));
        }
    }
}

void ds4_quantize_q4_K_row(const float *x, ds4_block_q4_K *y, int64_t n, const float *imp) {
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        uint8_t q[DS4_QK_K], sc[8], mn[8];
        kq_block(&Q4K_SHAPE, x + b * DS4_QK_K, imp ? imp + b * DS4_QK_K : NULL, q, sc, mn, &y[b].d, &y[b].dmin);
        uint8_t *s = y[b].scales;
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
            s[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
            s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
        }
        memset(y[b].qs, 0, sizeof y[b].qs);
        for (int i = 0; i < DS4_QK_K; i++) {
            int j = i / 32, l = i % 32;
            y[b].qs[32 * (j / 2) + l] |= (uint8_t)(q[i] << (4 * (j & 1)));
        }
    }
}
