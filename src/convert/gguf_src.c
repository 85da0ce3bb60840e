/*
 * gguf_src.c - ds4 GGUF tensors -> f32 / i32 for the quantizer (see
 * gguf_src.h).
 */
#include "convert/gguf_src.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "format/quants.h"

static bool is_routed(ds4_tclass cls) {
    return cls == DS4_TC_EXP_GATE || cls == DS4_TC_EXP_UP || cls == DS4_TC_EXP_DOWN;
}

/* Types that decode to the weights themselves (not I32 ids nor Q8_K
 * activation blocks, which the dequantizer also reads). */
static bool decodes_to_floats(uint32_t type) {
    const ds4_type_info *info = ds4_type_get(type);
    return info && info->supported && type != DS4_TYPE_I32 && type != DS4_TYPE_Q8_K;
}

static void shape_text(uint32_t ndim, const uint64_t *ne, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRIu64, i ? ", " : "[", ne[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

int ds4_gguf_src_resolve(const ds4_gguf *g, const ds4_tensor_spec *t, int expert, ds4_gguf_source *src, ds4_err *err) {
    memset(src, 0, sizeof(*src));
    const ds4_gguf_tensor *gt = ds4_gguf_find_tensor(g, t->name);
    if (!gt) return ds4_err_set(err, DS4_ENOTFOUND, "%s has no tensor %s", g->path, t->name);
    if (gt->ndim != t->ndim || memcmp(gt->ne, t->ne, t->ndim * sizeof(uint64_t)) != 0) {
        char have[96], want[96];
        shape_text(gt->ndim, gt->ne, have, sizeof(have));
        shape_text(t->ndim, t->ne, want, sizeof(want));
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s has shape %s, the model's metadata gives %s", g->path,
                           t->name, have, want);
    }
    const ds4_type_info *info = ds4_type_get(gt->type);
    bool hash = t->cls == DS4_TC_HASH;
    if (hash ? gt->type != DS4_TYPE_I32 : !decodes_to_floats(gt->type))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: tensor %s has type %s, expected %s", g->path, t->name,
                           info ? info->name : "(unknown)", hash ? "i32" : "a float or block type ds4 decodes");
    if (is_routed(t->cls) && (expert < 0 || (uint64_t)expert >= t->ne[2]))
        return ds4_err_set(err, DS4_EINVAL, "tensor %s: expert %d is not one of its %" PRIu64, t->name, expert,
                           t->ne[2]);
    src->g = g;
    src->t = gt;
    src->rows = t->ndim == 1 ? 1 : (int64_t)t->ne[1];
    src->cols = (int64_t)t->ne[0];
    src->row_bytes = ds4_row_bytes(gt->type, src->cols);
    src->data = gt->data;
    if (is_routed(t->cls)) src->data += (size_t)expert * (size_t)src->rows * src->row_bytes;
    return 0;
}

int ds4_gguf_src_decode_rows(const ds4_gguf_source *src, int64_t row0, int64_t nrows, float *out, ds4_err *err) {
    if (row0 < 0 || nrows < 0 || row0 + nrows > src->rows)
        return ds4_err_set(err, DS4_ERANGE, "%s: rows [%" PRId64 ", %" PRId64 ") outside 0..%" PRId64, src->t->name,
                           row0, row0 + nrows, src->rows);
    if (src->t->type == DS4_TYPE_I32)
        return ds4_err_set(err, DS4_EINVAL, "%s: integer tensor decoded as floats", src->t->name);
    for (int64_t i = 0; i < nrows; i++) {
        float *o = out + i * src->cols;
        int64_t r = row0 + i;
        ds4_dequantize_row(src->t->type, src->data + (size_t)r * src->row_bytes, o, src->cols);
        for (int64_t c = 0; c < src->cols; c++)
            if (!isfinite(o[c]))
                return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: row %" PRId64 ", column %" PRId64 " decodes to %g",
                                   src->g->path, src->t->name, r, c, o[c]);
    }
    return 0;
}

int ds4_gguf_src_decode_i32(const ds4_gguf_source *src, int64_t limit, int32_t *out, ds4_err *err) {
    if (src->t->type != DS4_TYPE_I32)
        return ds4_err_set(err, DS4_EINVAL, "%s: float tensor decoded as integers", src->t->name);
    uint64_t n = src->t->nelements;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = src->data + i * 4;
        int32_t v = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        if (limit > 0 && (v < 0 || v >= limit))
            return ds4_err_set(err, DS4_ERANGE,
                               "%s: tensor %s: element %" PRIu64 " = %" PRId32 " is outside [0, %" PRId64 ")",
                               src->g->path, src->t->name, i, v, limit);
        out[i] = v;
    }
    return 0;
}
