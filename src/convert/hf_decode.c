/*
 * hf_decode.c - official checkpoint tensors -> f32 / i32 (see hf.h for the
 * encodings and where the facts come from).
 *
 * Decoding works on row ranges so callers can stream a large matrix (the
 * 129280 x 4096 embedding) without holding it whole in f32.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/fp.h"
#include "convert/hf.h"

/* Byte -> f32 tables, built once from the scalar conversions in base/fp. */
static float fp8_lut[256], e8m0_lut[256], fp4_lut[16];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void build_luts(void) {
    for (int i = 0; i < 256; i++) {
        fp8_lut[i] = ds4_fp8_e4m3_to_f32((uint8_t)i);
        e8m0_lut[i] = ds4_e8m0_to_f32((uint8_t)i);
    }
    for (int i = 0; i < 16; i++) fp4_lut[i] = ds4_fp4_e2m1_to_f32((uint8_t)i);
}

static bool is_routed(ds4_tclass cls) {
    return cls == DS4_TC_EXP_GATE || cls == DS4_TC_EXP_UP || cls == DS4_TC_EXP_DOWN;
}

static int check_shape(const ds4_st_tensor *t, const char *gguf, uint32_t ndim, const uint64_t *shape, ds4_err *err) {
    if (ds4_st_expect(t, NULL, 0, ndim, shape, err) != 0) return ds4_err_prefix(err, "for %s", gguf);
    return 0;
}

static int resolve_scale(ds4_st_ckpt *ck, ds4_hf_source *src, const char *gguf, uint64_t srows, uint64_t scols,
                         ds4_err *err) {
    char name[160];
    if (ds4_hf_scale_name(src->w->name, name, sizeof(name), err) != 0) return -1;
    if (!ds4_st_ckpt_has(ck, name))
        return ds4_err_set(err, DS4_ENOTFOUND, "%s: %s tensor %s has no scale tensor %s (needed for %s)", src->w->file,
                           ds4_st_dtype_name(src->w->dtype), src->w->name, name, gguf);
    src->scale = ds4_st_ckpt_get(ck, name, err);
    if (!src->scale) return -1;
    static const ds4_st_dtype e8m0[] = {DS4_ST_F8_E8M0, DS4_ST_U8};
    const uint64_t shape[2] = {srows, scols};
    if (ds4_st_expect(src->scale, e8m0, 2, 2, shape, err) != 0) return ds4_err_prefix(err, "for %s", gguf);
    return 0;
}

static int choose_encoding(ds4_st_ckpt *ck, const ds4_hf_config *hc, const ds4_tensor_spec *t, ds4_hf_source *src,
                           ds4_err *err) {
    const ds4_st_tensor *w = src->w;
    uint64_t rows = (uint64_t)src->rows, cols = (uint64_t)src->cols;
    uint64_t full[2] = {rows, cols};
    uint32_t nd = t->ndim == 1 ? 1 : 2;
    const uint64_t *shape = nd == 1 ? &full[1] : full;
    bool hash = t->cls == DS4_TC_HASH;
    switch (w->dtype) {
    case DS4_ST_F32:
    case DS4_ST_F16:
    case DS4_ST_BF16:
        if (hash) break;
        src->enc = DS4_HF_ENC_FLOAT;
        return check_shape(w, t->name, nd, shape, err);
    case DS4_ST_I64:
    case DS4_ST_I32:
        if (!hash) break;
        src->enc = DS4_HF_ENC_INT;
        return check_shape(w, t->name, nd, shape, err);
    case DS4_ST_F8_E4M3:
        if (hash || nd != 2) break;
        src->enc = DS4_HF_ENC_FP8;
        src->block_out = hc->fp8_block_out;
        src->block_in = hc->fp8_block_in;
        if (check_shape(w, t->name, 2, full, err) != 0) return -1;
        return resolve_scale(ck, src, t->name, (rows + src->block_out - 1) / src->block_out,
                             (cols + src->block_in - 1) / src->block_in, err);
    case DS4_ST_I8:
    case DS4_ST_U8: {
        if (!is_routed(t->cls)) break;
        src->enc = DS4_HF_ENC_FP4;
        if (cols % 32 != 0)
            return ds4_err_set(err, DS4_EFORMAT, "%s: row length %" PRIu64 " is not a multiple of 32 (FP4 blocks)",
                               t->name, cols);
        const uint64_t packed[2] = {rows, cols / 2};
        if (check_shape(w, t->name, 2, packed, err) != 0) return -1;
        return resolve_scale(ck, src, t->name, rows, cols / 32, err);
    }
    default: break;
    }
    return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: dtype %s cannot hold %s (%s)", w->file, w->name,
                       ds4_st_dtype_name(w->dtype), t->name,
                       hash                ? "expected I64 or I32"
                       : is_routed(t->cls) ? "expected I8 FP4 or a float type"
                                           : "expected F8_E4M3 or a float type");
}

int ds4_hf_resolve(ds4_st_ckpt *ck, const ds4_hf_config *hc, const ds4_tensor_spec *t, int expert, ds4_hf_source *src,
                   ds4_err *err) {
    pthread_once(&lut_once, build_luts);
    memset(src, 0, sizeof(*src));
    char name[160];
    if (ds4_hf_name(t, expert, name, sizeof(name), err) != 0) return -1;
    src->w = ds4_st_ckpt_get(ck, name, err);
    if (!src->w) return ds4_err_prefix(err, "source of %s", t->name);
    src->rows = t->ndim == 1 ? 1 : (int64_t)t->ne[1];
    src->cols = (int64_t)t->ne[0];
    return choose_encoding(ck, hc, t, src, err);
}

/* --------------------------------------------------------------- rows */

static void float_row(const ds4_st_tensor *w, int64_t r, int64_t cols, float *out) {
    uint64_t base = (uint64_t)r * (uint64_t)cols;
    if (w->dtype == DS4_ST_F32) {
        memcpy(out, w->data + base * 4, (size_t)cols * 4);
        return;
    }
    const uint8_t *p = w->data + base * 2;
    for (int64_t c = 0; c < cols; c++) {
        uint16_t h = (uint16_t)(p[2 * c] | p[2 * c + 1] << 8);
        out[c] = w->dtype == DS4_ST_BF16 ? ds4_bf16_to_f32(h) : ds4_f16_to_f32(h);
    }
}

static void fp8_row(const ds4_hf_source *s, int64_t r, float *out) {
    const uint8_t *w = s->w->data + (uint64_t)r * (uint64_t)s->cols;
    int64_t scols = (s->cols + s->block_in - 1) / s->block_in;
    const uint8_t *sc = s->scale->data + (uint64_t)(r / s->block_out) * (uint64_t)scols;
    for (int64_t b = 0; b < scols; b++) {
        float d = e8m0_lut[sc[b]];
        int64_t c0 = b * s->block_in, c1 = c0 + s->block_in < s->cols ? c0 + s->block_in : s->cols;
        for (int64_t c = c0; c < c1; c++) out[c] = fp8_lut[w[c]] * d;
    }
}

static void fp4_row(const ds4_hf_source *s, int64_t r, float *out) {
    const uint8_t *w = s->w->data + (uint64_t)r * (uint64_t)(s->cols / 2);
    const uint8_t *sc = s->scale->data + (uint64_t)r * (uint64_t)(s->cols / 32);
    for (int64_t b = 0; b < s->cols / 32; b++) {
        float d = e8m0_lut[sc[b]];
        for (int j = 0; j < 16; j++) {
            uint8_t q = w[b * 16 + j];
            out[b * 32 + 2 * j] = fp4_lut[q & 15] * d; /* low nibble first */
            out[b * 32 + 2 * j + 1] = fp4_lut[q >> 4] * d;
        }
    }
}

int ds4_hf_decode_rows(const ds4_hf_source *src, int64_t row0, int64_t nrows, float *out, ds4_err *err) {
    if (row0 < 0 || nrows < 0 || row0 + nrows > src->rows)
        return ds4_err_set(err, DS4_ERANGE, "%s: rows [%" PRId64 ", %" PRId64 ") outside 0..%" PRId64, src->w->name,
                           row0, row0 + nrows, src->rows);
    for (int64_t i = 0; i < nrows; i++) {
        float *o = out + i * src->cols;
        int64_t r = row0 + i;
        switch (src->enc) {
        case DS4_HF_ENC_FLOAT: float_row(src->w, r, src->cols, o); break;
        case DS4_HF_ENC_FP8: fp8_row(src, r, o); break;
        case DS4_HF_ENC_FP4: fp4_row(src, r, o); break;
        case DS4_HF_ENC_INT: return ds4_err_set(err, DS4_EINVAL, "%s: integer tensor decoded as floats", src->w->name);
        }
        for (int64_t c = 0; c < src->cols; c++)
            if (!isfinite(o[c]))
                return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: row %" PRId64 ", column %" PRId64 " decodes to %g",
                                   src->w->file, src->w->name, r, c, o[c]);
    }
    return 0;
}

int ds4_hf_decode_i32(const ds4_hf_source *src, int64_t limit, int32_t *out, ds4_err *err) {
    if (src->enc != DS4_HF_ENC_INT)
        return ds4_err_set(err, DS4_EINVAL, "%s: float tensor decoded as integers", src->w->name);
    uint64_t n = src->w->nelements;
    size_t es = ds4_st_dtype_size(src->w->dtype);
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = src->w->data + i * es;
        uint64_t u = 0;
        for (size_t b = 0; b < es; b++) u |= (uint64_t)p[b] << (8 * b);
        int64_t v = es == 8 ? (int64_t)u : (int64_t)(int32_t)(uint32_t)u;
        if (v < INT32_MIN || v > INT32_MAX || (limit > 0 && (v < 0 || v >= limit)))
            return ds4_err_set(err, DS4_ERANGE,
                               "%s: tensor %s: element %" PRIu64 " = %" PRId64 " is outside [0, %" PRId64 ")",
                               src->w->file, src->w->name, i, v, limit > 0 ? limit : (int64_t)INT32_MAX);
        out[i] = (int32_t)v;
    }
    return 0;
}
