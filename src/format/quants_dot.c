/*
 * quants_dot.c - portable dot products of one weight row with a prepared
 * activation vector.  These are the definition of every dot in ds4: the AVX2
 * kernels (quants_avx2.c) follow the same accumulation shape and return the
 * same bits.
 *
 * Shapes (see quants_impl.h for the lane counts):
 *   F32       products in double, element i into lane i % 16, fixed tree.
 *   F16/BF16  f32 products (multiply, then add), lane i % 32, fixed tree.
 *   Q8_0      per block an exact int32 sum; (f16(w.d) * a.d) * sum goes into
 *             lane b % 8; fixed tree.
 *   K-quants  per block exact int32 sums weighted by the sub-block scales,
 *   IQ2_XXS   then one f32 step per block (ds4_kq_step / ds4_iq2_step) in
 *             block order.
 * Activations must come from ds4_quantize_q8_0x / ds4_quantize_q8_K (their
 * int8 values lie in [-127, 127]).
 */
#include "format/quants_impl.h"

double ds4_reduce_f64_lanes(const double acc[DS4_F64_LANES]) {
    double s[4];
    for (int j = 0; j < 4; j++) s[j] = (acc[j] + acc[4 + j]) + (acc[8 + j] + acc[12 + j]);
    return (s[0] + s[2]) + (s[1] + s[3]);
}

float ds4_reduce_f32_lanes(const float acc[DS4_F32_LANES]) {
    float s[8], t[4];
    for (int j = 0; j < 8; j++) s[j] = (acc[j] + acc[8 + j]) + (acc[16 + j] + acc[24 + j]);
    for (int j = 0; j < 4; j++) t[j] = s[j] + s[4 + j];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

float ds4_reduce_q8_lanes(const float acc[DS4_Q8_LANES]) {
    float t[4];
    for (int j = 0; j < 4; j++) t[j] = acc[j] + acc[4 + j];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

float ds4_dot_f32_scalar(int64_t n, const void *w, const void *act) {
    const float *a = w, *x = act;
    double acc[DS4_F64_LANES] = {0};
    for (int64_t i = 0; i < n; i++) acc[i % DS4_F64_LANES] += (double)a[i] * (double)x[i];
    return (float)ds4_reduce_f64_lanes(acc);
}

float ds4_dot_f16_scalar(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *x = act;
    float acc[DS4_F32_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = ds4_f16_to_f32(a[i]) * x[i];
        acc[i % DS4_F32_LANES] += p;
    }
    return ds4_reduce_f32_lanes(acc);
}

float ds4_dot_bf16_scalar(int64_t n, const void *w, const void *act) {
    const uint16_t *a = w;
    const float *x = act;
    float acc[DS4_F32_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = ds4_bf16_to_f32(a[i]) * x[i];
        acc[i % DS4_F32_LANES] += p;
    }
    return ds4_reduce_f32_lanes(acc);
}

float ds4_dot_q8_0_scalar(int64_t n, const void *w, const void *act) {
    const ds4_block_q8_0 *a = w;
    const ds4_block_q8_0x *x = act;
    float acc[DS4_Q8_LANES] = {0};
    for (int64_t b = 0; b < n / DS4_QK8_0; b++) {
        int32_t sum = 0;
        for (int k = 0; k < DS4_QK8_0; k++) sum += a[b].qs[k] * x[b].qs[k];
        float c = (ds4_f16_to_f32(a[b].d) * x[b].d) * (float)sum;
        acc[b % DS4_Q8_LANES] += c;
    }
    return ds4_reduce_q8_lanes(acc);
}

float ds4_dot_q2_K_scalar(int64_t n, const void *w, const void *act) {
    const ds4_block_q2_K *a = w;
    const ds4_block_q8_K *x = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 16; s++) {
            int h = s / 8, j = (s % 8) / 2, l0 = (s & 1) * 16;
            int32_t sub = 0;
            for (int l = l0; l < l0 + 16; l++) {
                int q = (a[b].qs[32 * h + l] >> (2 * j)) & 3;
                sub += q * x[b].qs[128 * h + 32 * j + l];
            }
            isum += (a[b].scales[s] & 15) * sub;
            msum += (a[b].scales[s] >> 4) * x[b].bsums[s];
        }
        float dall = ds4_f16_to_f32(a[b].d) * x[b].d;
        float dmin = ds4_f16_to_f32(a[b].dmin) * x[b].d;
        acc = ds4_kq_step(acc, dall, dmin, isum, msum);
    }
    return acc;
}

float ds4_dot_q4_K_scalar(int64_t n, const void *w, const void *act) {
    const ds4_block_q4_K *a = w;
    const ds4_block_q8_K *x = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            ds4_q4_K_scale_min(a[b].scales, j, &sc, &m);
            const uint8_t *q = a[b].qs + 32 * (j / 2);
            int shift = 4 * (j & 1);
            int32_t sub = 0;
            for (int l = 0; l < 32; l++) sub += ((q[l] >> shift) & 15) * x[b].qs[32 * j + l];
            isum += sc * sub;
            msum += m * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
        }
        float dall = ds4_f16_to_f32(a[b].d) * x[b].d;
        float dmin = ds4_f16_to_f32(a[b].dmin) * x[b].d;
        acc = ds4_kq_step(acc, dall, dmin, isum, msum);
    }
    return acc;
}

float ds4_dot_iq2_xxs_scalar(int64_t n, const void *w, const void *act) {
    const ds4_block_iq2_xxs *a = w;
    const ds4_block_q8_K *x = act;
    float acc = 0.0f;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        int32_t isum = 0;
        for (int ib = 0; ib < 8; ib++) {
            uint32_t g, s;
            memcpy(&g, &a[b].qs[4 * ib], 4);
            memcpy(&s, &a[b].qs[4 * ib + 2], 4);
            const int8_t *q8 = x[b].qs + 32 * ib;
            int32_t sub = 0;
            for (int l = 0; l < 4; l++) {
                const uint8_t *grid = (const uint8_t *)&ds4_iq2xxs_grid[(g >> (8 * l)) & 255];
                uint8_t signs = ds4_iq2_sign_byte((s >> (7 * l)) & 127);
                for (int k = 0; k < 8; k++) {
                    int v = grid[k] * q8[8 * l + k];
                    sub += (signs >> k) & 1 ? -v : v;
                }
            }
            isum += (int32_t)(2 * (s >> 28) + 1) * sub;
        }
        acc = ds4_iq2_step(acc, ds4_f16_to_f32(a[b].d) * x[b].d, isum);
    }
    return acc;
}

/* ------------------------------------------------ several activations
 *
 * The same dots against up to DS4_MULTI_MAX activations: each weight element
 * or block is converted or unpacked once (F16 to float, Q8_0 scale, K-quant
 * values and scales, IQ2_XXS grid vectors with their signs), then every
 * activation takes it through the float expression and lane of its single
 * kernel above.  Integer sums are exact, so unpacking changes no bit. */

void ds4_dot_f32_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    const float *a = w;
    double acc[DS4_MULTI_MAX][DS4_F64_LANES] = {{0}};
    for (int64_t i = 0; i < n; i++) {
        double wv = (double)a[i];
        for (int k = 0; k < nacts; k++) {
            const float *x = ds4_act_at(act, act_stride, k);
            acc[k][i % DS4_F64_LANES] += wv * (double)x[i];
        }
    }
    for (int k = 0; k < nacts; k++) out[k] = (float)ds4_reduce_f64_lanes(acc[k]);
}

/* F16 and BF16: the weight as float once per element. */
static void dot_f16_multi(int64_t n, const uint16_t *a, int bf16, const void *act, size_t act_stride, int nacts,
                          float *out) {
    float acc[DS4_MULTI_MAX][DS4_F32_LANES] = {{0}};
    for (int64_t i = 0; i < n; i++) {
        float wv = bf16 ? ds4_bf16_to_f32(a[i]) : ds4_f16_to_f32(a[i]);
        for (int k = 0; k < nacts; k++) {
            const float *x = ds4_act_at(act, act_stride, k);
            float p = wv * x[i];
            acc[k][i % DS4_F32_LANES] += p;
        }
    }
    for (int k = 0; k < nacts; k++) out[k] = ds4_reduce_f32_lanes(acc[k]);
}

void ds4_dot_f16_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    dot_f16_multi(n, w, 0, act, act_stride, nacts, out);
}

void ds4_dot_bf16_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    dot_f16_multi(n, w, 1, act, act_stride, nacts, out);
}

void ds4_dot_q8_0_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    const ds4_block_q8_0 *a = w;
    float acc[DS4_MULTI_MAX][DS4_Q8_LANES] = {{0}};
    for (int64_t b = 0; b < n / DS4_QK8_0; b++) {
        float wd = ds4_f16_to_f32(a[b].d);
        for (int k = 0; k < nacts; k++) {
            const ds4_block_q8_0x *x = (const ds4_block_q8_0x *)ds4_act_at(act, act_stride, k) + b;
            int32_t sum = 0;
            for (int e = 0; e < DS4_QK8_0; e++) sum += a[b].qs[e] * x->qs[e];
            float c = (wd * x->d) * (float)sum;
            acc[k][b % DS4_Q8_LANES] += c;
        }
    }
    for (int k = 0; k < nacts; k++) out[k] = ds4_reduce_q8_lanes(acc[k]);
}

/* A K-quant or IQ2_XXS block unpacked in activation order: q[i] multiplies
 * activation element i, and each group of 16 elements (the span of one
 * activation bsum) has the integer scale sc[g] and min m[g] of the
 * sub-block it lies in (a sub-block of 32 gives both its groups the same).
 * Groups of a fixed 16 keep the loops below countable, so GCC vectorizes
 * them as it does the single kernels. */
typedef struct {
    int8_t q[DS4_QK_K];
    int32_t sc[16], m[16];
} unpacked_block;

/* isum = sum_g sc[g] * (q . x over group g), msum = sum_g m[g] * bsums[g]:
 * the integers of the single kernels (exact, so the grouping changes no
 * bit). */
static void unpacked_sums(const unpacked_block *u, const ds4_block_q8_K *x, int32_t *isum, int32_t *msum) {
    int32_t is = 0, ms = 0;
    for (int g = 0; g < 16; g++) {
        int32_t sub = 0;
        for (int l = 0; l < 16; l++) sub += u->q[16 * g + l] * x->qs[16 * g + l];
        is += u->sc[g] * sub;
        ms += u->m[g] * x->bsums[g];
    }
    *isum = is;
    *msum = ms;
}

static void unpack_q2_K(const ds4_block_q2_K *a, unpacked_block *u) {
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++) u->q[128 * h + 32 * j + l] = (int8_t)((a->qs[32 * h + l] >> (2 * j)) & 3);
    for (int g = 0; g < 16; g++) {
        u->sc[g] = a->scales[g] & 15;
        u->m[g] = a->scales[g] >> 4;
    }
}

static void unpack_q4_K(const ds4_block_q4_K *a, unpacked_block *u) {
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) {
            u->q[64 * p + l] = (int8_t)(a->qs[32 * p + l] & 15);
            u->q[64 * p + 32 + l] = (int8_t)(a->qs[32 * p + l] >> 4);
        }
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        ds4_q4_K_scale_min(a->scales, j, &sc, &m);
        u->sc[2 * j] = u->sc[2 * j + 1] = sc;
        u->m[2 * j] = u->m[2 * j + 1] = m;
    }
}

/* Signed grid values (|v| <= 43) and the group scales 2S+1; no mins. */
static void unpack_iq2_xxs(const ds4_block_iq2_xxs *a, unpacked_block *u) {
    for (int ib = 0; ib < 8; ib++) {
        uint32_t g, s;
        memcpy(&g, &a->qs[4 * ib], 4);
        memcpy(&s, &a->qs[4 * ib + 2], 4);
        for (int l = 0; l < 4; l++) {
            const uint8_t *grid = (const uint8_t *)&ds4_iq2xxs_grid[(g >> (8 * l)) & 255];
            uint8_t signs = ds4_iq2_sign_byte((s >> (7 * l)) & 127);
            for (int k = 0; k < 8; k++) u->q[32 * ib + 8 * l + k] = (int8_t)((signs >> k) & 1 ? -grid[k] : grid[k]);
        }
        u->sc[2 * ib] = u->sc[2 * ib + 1] = (int32_t)(2 * (s >> 28) + 1);
        u->m[2 * ib] = u->m[2 * ib + 1] = 0;
    }
}

/* Unpack block b of a Q2_K, Q4_K or IQ2_XXS row; *d and *dmin are its f16
 * factors (dmin 0 for IQ2_XXS). */
static void unpack_block(uint32_t type, const void *w, int64_t b, unpacked_block *u, float *d, float *dmin) {
    if (type == DS4_TYPE_Q2_K) {
        const ds4_block_q2_K *a = (const ds4_block_q2_K *)w + b;
        unpack_q2_K(a, u);
        *d = ds4_f16_to_f32(a->d), *dmin = ds4_f16_to_f32(a->dmin);
    } else if (type == DS4_TYPE_Q4_K) {
        const ds4_block_q4_K *a = (const ds4_block_q4_K *)w + b;
        unpack_q4_K(a, u);
        *d = ds4_f16_to_f32(a->d), *dmin = ds4_f16_to_f32(a->dmin);
    } else {
        const ds4_block_iq2_xxs *a = (const ds4_block_iq2_xxs *)w + b;
        unpack_iq2_xxs(a, u);
        *d = ds4_f16_to_f32(a->d), *dmin = 0.0f;
    }
}

/* The 256-element block loop: each activation takes the block's integer
 * sums through the float step of its type. */
static void blocks256_multi(uint32_t type, int64_t n, const void *w, const void *act, size_t act_stride, int nacts,
                            float *out) {
    float acc[DS4_MULTI_MAX] = {0};
    unpacked_block u;
    for (int64_t b = 0; b < n / DS4_QK_K; b++) {
        float d, dmin;
        unpack_block(type, w, b, &u, &d, &dmin);
        for (int k = 0; k < nacts; k++) {
            const ds4_block_q8_K *x = (const ds4_block_q8_K *)ds4_act_at(act, act_stride, k) + b;
            int32_t isum, msum;
            unpacked_sums(&u, x, &isum, &msum);
            if (type == DS4_TYPE_IQ2_XXS) acc[k] = ds4_iq2_step(acc[k], d * x->d, isum);
            else acc[k] = ds4_kq_step(acc[k], d * x->d, dmin * x->d, isum, msum);
        }
    }
    for (int k = 0; k < nacts; k++) out[k] = acc[k];
}

void ds4_dot_q2_K_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    blocks256_multi(DS4_TYPE_Q2_K, n, w, act, act_stride, nacts, out);
}

void ds4_dot_q4_K_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    blocks256_multi(DS4_TYPE_Q4_K, n, w, act, act_stride, nacts, out);
}

void ds4_dot_iq2_xxs_multi_scalar(int64_t n, const void *w, const void *act, size_t act_stride, int nacts, float *out) {
    blocks256_multi(DS4_TYPE_IQ2_XXS, n, w, act, act_stride, nacts, out);
}
