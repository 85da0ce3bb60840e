/*
 * quants.c - the public face of the block formats (quants.h): dispatch by
 * type, dequantization, activation quantizers, column energy, and the run-time
 * choice between the scalar kernels (quants_dot.c, the definition) and the
 * AVX2 ones (quants_avx2.c).
 *
 * Dequantizers evaluate exactly the float expressions gguf-py evaluates (same
 * operations, same order, f32 throughout, no contraction), which is what makes
 * them bit-identical to gguf.quants.dequantize (tests/unit/test_quants_golden.c).
 */
#include "format/quants_impl.h"

#include <cpuid.h>
#include <math.h>
#include <stdatomic.h>

_Static_assert(sizeof(ds4_block_q8_0) == 34, "q8_0 block is 34 bytes");
_Static_assert(sizeof(ds4_block_q2_K) == 84, "q2_K block is 84 bytes");
_Static_assert(sizeof(ds4_block_q4_K) == 144, "q4_K block is 144 bytes");
_Static_assert(sizeof(ds4_block_iq2_xxs) == 66, "iq2_xxs block is 66 bytes");
_Static_assert(sizeof(ds4_block_q8_K) == 292, "q8_K block is 292 bytes");

/* ---------------------------------------------------------- dequantize */

static void dequant_q8_0(const ds4_block_q8_0 *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = ds4_f16_to_f32(b[i].d);
        for (int k = 0; k < DS4_QK8_0; k++) y[i * DS4_QK8_0 + k] = (float)b[i].qs[k] * d;
    }
}

static void dequant_q2_K(const ds4_block_q2_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
        float d = ds4_f16_to_f32(b[i].d), dmin = ds4_f16_to_f32(b[i].dmin);
        for (int s = 0; s < 16; s++) {
            float dl = d * (float)(b[i].scales[s] & 15);
            float ml = dmin * (float)(b[i].scales[s] >> 4);
            int h = s / 8, j = (s % 8) / 2, l0 = (s & 1) * 16;
            for (int l = l0; l < l0 + 16; l++) {
                int q = (b[i].qs[32 * h + l] >> (2 * j)) & 3;
                y[16 * s + l - l0] = dl * (float)q - ml;
            }
        }
    }
}

static void dequant_q4_K(const ds4_block_q4_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, y += DS4_QK_K) {
        float d = ds4_f16_to_f32(b[i].d), dmin = ds4_f16_to_f32(b[i].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            ds4_q4_K_scale_min(b[i].scales, j, &sc, &m);
            float dl = d * (float)sc, ml = dmin * (float)m;
            const uint8_t *q = b[i].qs + 32 * (j / 2);
            int shift = 4 * (j & 1);
            for (int l = 0; l < 32; l++) y[32 * j + l] = dl * (float)((q[l] >> shift) & 15) - ml;
        }
    }
}

static void dequant_iq2_xxs(const ds4_block_iq2_xxs *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        float d = ds4_f16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ib++, y += 32) {
            uint32_t a, s;
            memcpy(&a, &b[i].qs[4 * ib], 4);
            memcpy(&s, &b[i].qs[4 * ib + 2], 4);
            float db = d * (0.5f + (float)(s >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const uint8_t *g = (const uint8_t *)&ds4_iq2xxs_grid[(a >> (8 * l)) & 255];
                uint8_t signs = ds4_iq2_sign_byte((s >> (7 * l)) & 127);
                for (int k = 0; k < 8; k++) {
                    float v = db * (float)g[k];
                    y[8 * l + k] = (signs >> k) & 1 ? v * -1.0f : v;
                }
            }
        }
    }
}

static void dequant_q8_K(const ds4_block_q8_K *b, float *y, int64_t nb) {
    for (int64_t i = 0; i < nb; i++) {
        for (int k = 0; k < DS4_QK_K; k++) y[i * DS4_QK_K + k] = b[i].d * (float)b[i].qs[k];
    }
}

void ds4_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const ds4_type_info *t = ds4_type_get(type);
    int64_t nb = t && n > 0 ? n / t->block_elems : 0;
    switch (t && n % t->block_elems == 0 ? type : UINT32_MAX) {
    case DS4_TYPE_F32: memcpy(dst, src, (size_t)n * sizeof(float)); return;
    case DS4_TYPE_F16: ds4_f16_to_f32_row(src, dst, n); return;
    case DS4_TYPE_BF16: ds4_bf16_to_f32_row(src, dst, n); return;
    case DS4_TYPE_Q8_0: dequant_q8_0(src, dst, nb); return;
    case DS4_TYPE_Q2_K: dequant_q2_K(src, dst, nb); return;
    case DS4_TYPE_Q4_K: dequant_q4_K(src, dst, nb); return;
    case DS4_TYPE_IQ2_XXS: dequant_iq2_xxs(src, dst, nb); return;
    case DS4_TYPE_Q8_K: dequant_q8_K(src, dst, nb); return;
    case DS4_TYPE_I32:
        for (int64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, (const char *)src + 4 * i, 4);
            dst[i] = (float)v;
        }
        return;
    default:
        /* No format to decode: poison the output rather than leave garbage. */
        for (int64_t i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
}

/* -------------------------------------------------------- quantization */

size_t ds4_quantize_row(uint32_t type, const float *src, void *dst, int64_t n, const float *importance) {
    size_t bytes = ds4_row_bytes(type, n);
    if (bytes == 0) return 0;
    switch (type) {
    case DS4_TYPE_F32: memcpy(dst, src, bytes); return bytes;
    case DS4_TYPE_F16: ds4_f32_to_f16_row(src, dst, n); return bytes;
    case DS4_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = ds4_f32_to_bf16(src[i]);
        return bytes;
    case DS4_TYPE_Q8_0: ds4_quantize_q8_0_row(src, dst, n); return bytes;
    case DS4_TYPE_Q2_K: ds4_quantize_q2_K_row(src, dst, n, importance); return bytes;
    case DS4_TYPE_Q4_K: ds4_quantize_q4_K_row(src, dst, n, importance); return bytes;
    case DS4_TYPE_IQ2_XXS: ds4_quantize_iq2_xxs_row(src, dst, n, importance); return bytes;
    default: return 0;
    }
}

void ds4_column_energy(const float *w, int64_t rows, int64_t cols, float *out) {
    /* Sum in double over column tiles that fit on the stack, so the result
     * does not depend on the number of rows' rounding. */
    enum { TILE = 512 };
    double acc[TILE];
    for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
        int64_t nc = cols - c0 < TILE ? cols - c0 : TILE;
        memset(acc, 0, sizeof acc);
        for (int64_t r = 0; r < rows; r++) {
            const float *row = w + r * cols + c0;
            for (int64_t c = 0; c < nc; c++) acc[c] += (double)row[c] * (double)row[c];
        }
        for (int64_t c = 0; c < nc; c++) out[c0 + c] = (float)acc[c];
    }
}

/* ---------------------------------------------------------- activations */

/* Round to nearest, ties to even, for |v| < 2^22 (1.5 * 2^23 trick); the
 * result does not depend on the FPU rounding mode or on libm. */
static inline int32_t round_even(float v) {
    float t = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &t, 4);
    return (bits & 0x7fffff) - 0x400000;
}

static inline int8_t clamp_i8(int32_t v) { return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); }

void ds4_quantize_q8_0x(const float *x, ds4_block_q8_0x *y, int64_t n) {
    for (int64_t i = 0; i < n / DS4_QK8_0; i++) {
        const float *xb = x + i * DS4_QK8_0;
        float amax = 0.0f;
        for (int k = 0; k < DS4_QK8_0; k++) amax = fmaxf(amax, fabsf(xb[k]));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = d;
        for (int k = 0; k < DS4_QK8_0; k++) {
            float v = xb[k] * id;
            /* |v| <= 127 (+ rounding) for finite input; the guard keeps
             * round_even in its domain for inf/NaN input. */
            y[i].qs[k] = fabsf(v) < 256.0f ? clamp_i8(round_even(v)) : (v > 0 ? 127 : -128);
        }
    }
}

void ds4_quantize_q8_K(const float *x, ds4_block_q8_K *y, int64_t n) {
    for (int64_t i = 0; i < n / DS4_QK_K; i++) {
        const float *xb = x + i * DS4_QK_K;
        float amax = 0.0f, max = 0.0f;
        for (int k = 0; k < DS4_QK_K; k++) {
            float ax = fabsf(xb[k]);
            if (ax > amax) {
                amax = ax;
                max = xb[k];
            }
        }
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float iscale = -127.0f / max;
        for (int k = 0; k < DS4_QK_K; k++) {
            float v = iscale * xb[k];
            y[i].qs[k] = fabsf(v) < 256.0f ? clamp_i8(round_even(v)) : (v > 0 ? 127 : -128);
        }
        for (int j = 0; j < DS4_QK_K / 16; j++) {
            int sum = 0;
            for (int k = 0; k < 16; k++) sum += y[i].qs[16 * j + k];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1.0f / iscale;
    }
}

uint32_t ds4_act_type(uint32_t weight_type) {
    switch (weight_type) {
    case DS4_TYPE_F32:
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: return DS4_TYPE_F32;
    case DS4_TYPE_Q8_0: return DS4_TYPE_Q8_0;
    case DS4_TYPE_Q2_K:
    case DS4_TYPE_Q4_K:
    case DS4_TYPE_IQ2_XXS: return DS4_TYPE_Q8_K;
    default: return UINT32_MAX;
    }
}

size_t ds4_act_bytes(uint32_t weight_type, int64_t n) {
    if (n < 0) return 0;
    switch (ds4_act_type(weight_type)) {
    case DS4_TYPE_F32: return (size_t)n * sizeof(float);
    case DS4_TYPE_Q8_0: return n % DS4_QK8_0 ? 0 : (size_t)(n / DS4_QK8_0) * sizeof(ds4_block_q8_0x);
    case DS4_TYPE_Q8_K: return n % DS4_QK_K ? 0 : (size_t)(n / DS4_QK_K) * sizeof(ds4_block_q8_K);
    default: return 0;
    }
}

void ds4_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n) {
    switch (ds4_act_type(weight_type)) {
    case DS4_TYPE_F32: memcpy(dst, x, (size_t)n * sizeof(float)); return;
    case DS4_TYPE_Q8_0: ds4_quantize_q8_0x(x, dst, n); return;
    case DS4_TYPE_Q8_K: ds4_quantize_q8_K(x, dst, n); return;
    default: return;
    }
}

/* ------------------------------------------------------ kernel choice */

static atomic_int simd_request = DS4_SIMD_AUTO;

int ds4_cpu_has_avx2_fma(void) {
    static atomic_int cached = -1;
    int v = atomic_load(&cached);
    if (v < 0) {
#if defined(__x86_64__) || defined(__i386__)
        unsigned a, b, c, d;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
        __builtin_cpu_init();
        v = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
        v = 0;
#endif
        atomic_store(&cached, v);
    }
    return v;
}

void ds4_set_simd(ds4_simd_level level) { atomic_store(&simd_request, (int)level); }

ds4_simd_level ds4_get_simd(void) {
    int req = atomic_load(&simd_request);
    if (req == DS4_SIMD_SCALAR || !ds4_cpu_has_avx2_fma()) return DS4_SIMD_SCALAR;
    return DS4_SIMD_AVX2;
}

/* The kernels of one weight type at one level: the single dot, the dot
 * against several activations and how many that one takes at most. */
typedef struct {
    ds4_dot_kernel one;
    ds4_dot_multi_kernel multi;
    int width;
} dot_kernels;

/* clang-format off */
#define SCALAR_KERNELS(t) \
    { ds4_dot_##t##_scalar, ds4_dot_##t##_multi_scalar, DS4_MULTI_MAX }
#define AVX2_KERNELS(t, w) \
    { ds4_dot_##t##_avx2, ds4_dot_##t##_multi_avx2, w }
/* clang-format on */

static int pick_dot(uint32_t type, int avx2, dot_kernels *k) {
    static const dot_kernels scalar[] = {SCALAR_KERNELS(f32),    SCALAR_KERNELS(f16),  SCALAR_KERNELS(bf16),
                                         SCALAR_KERNELS(q8_0),   SCALAR_KERNELS(q2_K), SCALAR_KERNELS(q4_K),
                                         SCALAR_KERNELS(iq2_xxs)};
    static const dot_kernels simd[] = {
        AVX2_KERNELS(f32, DS4_AVX2_WIDTH_FLOAT),  AVX2_KERNELS(f16, DS4_AVX2_WIDTH_FLOAT),
        AVX2_KERNELS(bf16, DS4_AVX2_WIDTH_FLOAT), AVX2_KERNELS(q8_0, DS4_AVX2_WIDTH_Q8_0),
        AVX2_KERNELS(q2_K, DS4_AVX2_WIDTH_256),   AVX2_KERNELS(q4_K, DS4_AVX2_WIDTH_256),
        AVX2_KERNELS(iq2_xxs, DS4_AVX2_WIDTH_256)};
    int i;
    switch (type) {
    case DS4_TYPE_F32: i = 0; break;
    case DS4_TYPE_F16: i = 1; break;
    case DS4_TYPE_BF16: i = 2; break;
    case DS4_TYPE_Q8_0: i = 3; break;
    case DS4_TYPE_Q2_K: i = 4; break;
    case DS4_TYPE_Q4_K: i = 5; break;
    case DS4_TYPE_IQ2_XXS: i = 6; break;
    default: return -1;
    }
    *k = avx2 ? simd[i] : scalar[i];
    return 0;
}

/* A weight row of `n` elements must be whole blocks of its type. */
static int dot_shape_ok(uint32_t type, int64_t n) { return n >= 0 && (n == 0 || ds4_row_bytes(type, n) != 0); }

float ds4_vec_dot(uint32_t weight_type, int64_t n, const void *w_row, const void *act) {
    dot_kernels k;
    if (pick_dot(weight_type, ds4_get_simd() == DS4_SIMD_AVX2, &k) < 0 || !dot_shape_ok(weight_type, n)) return NAN;
    return k.one(n, w_row, act);
}

void ds4_vec_dot_rows(uint32_t weight_type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *act,
                      float *y) {
    ds4_vec_dot_rows_multi(weight_type, n, nrows, w, row_stride, act, 0, 1, y, 0);
}

void ds4_vec_dot_rows_multi(uint32_t weight_type, int64_t n, int64_t nrows, const void *w, size_t row_stride,
                            const void *acts, size_t act_stride, int64_t nacts, float *y, size_t y_stride) {
    dot_kernels k;
    if (pick_dot(weight_type, ds4_get_simd() == DS4_SIMD_AVX2, &k) < 0 || !dot_shape_ok(weight_type, n)) {
        for (int64_t a = 0; a < nacts; a++)
            for (int64_t r = 0; r < nrows; r++) y[(size_t)a * y_stride + (size_t)r] = NAN;
        return;
    }
    /* Activations in groups of the kernel's width, each group against every
     * row: the group stays in L1 while the rows stream past it.  A lone
     * activation goes to the single kernel. */
    for (int64_t a0 = 0; a0 < nacts; a0 += k.width) {
        int na = nacts - a0 < k.width ? (int)(nacts - a0) : k.width;
        const char *act = (const char *)acts + (size_t)a0 * act_stride;
        float *ya = y + (size_t)a0 * y_stride;
        for (int64_t r = 0; r < nrows; r++) {
            const void *row = (const char *)w + (size_t)r * row_stride;
            if (na == 1) {
                ya[r] = k.one(n, row, act);
                continue;
            }
            float out[DS4_MULTI_MAX];
            k.multi(n, row, act, act_stride, na, out);
            for (int j = 0; j < na; j++) ya[(size_t)j * y_stride + (size_t)r] = out[j];
        }
    }
}
