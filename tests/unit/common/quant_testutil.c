/*
 * quant_testutil.c - see quant_testutil.h.
 */
#include "common/quant_testutil.h"

#include <math.h>
#include <string.h>

#include "base/fp.h"
#include "format/quants.h"

void qt_seed(qt_rng *r, uint64_t seed) { r->s = seed * 0x9E3779B97F4A7C15ull + 1; }

uint64_t qt_next(qt_rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

double qt_uniform(qt_rng *r) { return ((double)(qt_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

float qt_gauss(qt_rng *r) {
    double u = qt_uniform(r), v = qt_uniform(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

void qt_gauss_fill(qt_rng *r, float *x, int64_t n, float sigma) {
    for (int64_t i = 0; i < n; i++) x[i] = sigma * qt_gauss(r);
}

static uint16_t random_scale(qt_rng *r) {
    float m = ldexpf(1.0f + (float)qt_uniform(r), -12 + (int)(qt_next(r) % 8));
    return ds4_f32_to_f16(qt_next(r) & 1 ? -m : m);
}

void qt_random_blocks(qt_rng *r, uint32_t type, void *dst, int64_t n) {
    size_t bytes = ds4_row_bytes(type, n);
    uint8_t *p = dst;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t v = qt_next(r);
        memcpy(p + i, &v, bytes - i < 8 ? bytes - i : 8);
    }
    const ds4_type_info *t = ds4_type_get(type);
    int64_t nb = n / t->block_elems;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + (size_t)b * t->block_bytes;
        uint16_t s;
        switch (type) {
        case DS4_TYPE_F16:
            s = random_scale(r);
            memcpy(blk, &s, 2);
            break;
        case DS4_TYPE_BF16: {
            uint16_t v = ds4_f32_to_bf16(qt_gauss(r));
            memcpy(blk, &v, 2);
            break;
        }
        case DS4_TYPE_F32: {
            float v = qt_gauss(r);
            memcpy(blk, &v, 4);
            break;
        }
        case DS4_TYPE_Q8_0:
        case DS4_TYPE_IQ2_XXS:
            s = random_scale(r);
            memcpy(blk, &s, 2);
            break;
        case DS4_TYPE_Q4_K:
            s = random_scale(r);
            memcpy(blk, &s, 2);
            s = random_scale(r);
            memcpy(blk + 2, &s, 2);
            break;
        case DS4_TYPE_Q2_K:
            s = random_scale(r);
            memcpy(blk + 80, &s, 2);
            s = random_scale(r);
            memcpy(blk + 82, &s, 2);
            break;
        default: break;
        }
    }
}
