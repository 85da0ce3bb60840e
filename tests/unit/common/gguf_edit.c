/*
 * gguf_edit.c - edited copies of GGUF files for tests (see gguf_edit.h).
 */
#include "gguf_edit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp.h"
#include "format/gguf.h"
#include "format/quants.h"

static bool is(const char *a, const char *b) { return a && b && strcmp(a, b) == 0; }

static int copy_kv(ds4_gguf_writer *w, const ds4_gguf_kv *kv, const gguf_edit *e) {
    if (is(kv->key, "general.alignment") || is(kv->key, e->drop_key)) return 0;
    if (is(kv->key, e->u32_key)) return ds4_gguf_w_u32(w, kv->key, e->u32_value);
    if (is(kv->key, e->ratio_key) || is(kv->key, e->resize_key)) {
        const ds4_gguf_array *a = &kv->value.a;
        uint64_t n = is(kv->key, e->resize_key) ? e->resize_count : a->count;
        uint32_t *v = calloc(n + 1, sizeof(uint32_t));
        for (uint64_t i = 0; i < a->count && i < n; i++) v[i] = (uint32_t)ds4_gguf_arr_i64(a, i);
        if (is(kv->key, e->ratio_key) && n > 2) v[2] = 3;
        int rc = ds4_gguf_w_arr(w, kv->key, DS4_GGUF_U32, v, n);
        free(v);
        return rc;
    }
    return ds4_gguf_w_copy_kv(w, kv);
}

/* The bytes to write for tensor t and its (possibly changed) type and ne[0]. */
static void *tensor_bytes(const ds4_gguf_tensor *t, const gguf_edit *e, uint32_t *type, uint64_t *ne0,
                          uint64_t *nbytes) {
    uint64_t n = t->nelements, rows = n / t->ne[0];
    *type = t->type;
    *ne0 = t->ne[0];
    if (is(t->name, e->short_tensor)) {
        *ne0 = t->ne[0] - 1;
        size_t rb = ds4_row_bytes(t->type, (int64_t)t->ne[0]), nrb = ds4_row_bytes(t->type, (int64_t)*ne0);
        uint8_t *out = malloc(rows * nrb + 1);
        for (uint64_t r = 0; r < rows; r++) memcpy(out + r * nrb, (const uint8_t *)t->data + r * rb, nrb);
        *nbytes = rows * nrb;
        return out;
    }
    if (t->type == DS4_TYPE_F16 && e->all_f32) {
        float *out = malloc(n * sizeof(float));
        ds4_f16_to_f32_row(t->data, out, (int64_t)n);
        *type = DS4_TYPE_F32;
        *nbytes = n * sizeof(float);
        return out;
    }
    if (t->type == DS4_TYPE_F32 && is(t->name, e->f16_tensor)) {
        uint16_t *out = malloc(n * sizeof(uint16_t));
        ds4_f32_to_f16_row(t->data, out, (int64_t)n);
        *type = DS4_TYPE_F16;
        *nbytes = n * sizeof(uint16_t);
        return out;
    }
    void *out = malloc(t->nbytes);
    memcpy(out, t->data, t->nbytes);
    if (is(t->name, e->bad_hash)) {
        int32_t bad = 1 << 20;
        memcpy(out, &bad, 4);
    }
    *nbytes = t->nbytes;
    return out;
}

int gguf_copy_edited(const char *src, const char *dst, const gguf_edit *e, ds4_err *err) {
    ds4_gguf *g = ds4_gguf_open(src, err);
    if (!g) return -1;
    ds4_gguf_writer *w = ds4_gguf_writer_open(dst, 0, err);
    if (!w) {
        ds4_gguf_close(g);
        return -1;
    }
    int rc = 0;
    for (uint64_t i = 0; i < g->n_kv && rc == 0; i++) rc = copy_kv(w, &g->kv[i], e);
    void **data = calloc(g->n_tensors + 1, sizeof(void *));
    uint64_t *sizes = calloc(g->n_tensors + 1, sizeof(uint64_t));
    uint64_t m = 0;
    for (uint64_t i = 0; i < g->n_tensors && rc == 0; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        if (is(t->name, e->drop_tensor)) continue;
        uint32_t type;
        uint64_t ne[DS4_GGUF_MAX_DIMS];
        memcpy(ne, t->ne, sizeof(ne));
        data[m] = tensor_bytes(t, e, &type, &ne[0], &sizes[m]);
        rc = ds4_gguf_w_tensor(w, t->name, t->ndim, ne, type);
        m++;
    }
    static const float extra[4] = {1, 2, 3, 4};
    if (rc == 0 && e->extra_tensor) {
        uint64_t ne[1] = {4};
        data[m] = malloc(sizeof(extra));
        memcpy(data[m], extra, sizeof(extra));
        sizes[m] = sizeof(extra);
        rc = ds4_gguf_w_tensor(w, e->extra_tensor, 1, ne, DS4_TYPE_F32);
        m++;
    }
    for (uint64_t i = 0; i < m && rc == 0; i++) rc = ds4_gguf_w_data(w, data[i], sizes[i]);
    for (uint64_t i = 0; i < m; i++) free(data[i]);
    free(data);
    free(sizes);
    ds4_gguf_close(g);
    if (rc != 0) {
        ds4_gguf_writer_abort(w);
        return ds4_err_set(err, DS4_EIO, "writing the edited copy %s failed", dst);
    }
    return ds4_gguf_writer_close(w, err);
}

int file_truncated_copy(const char *src, const char *dst, long drop_bytes, ds4_err *err) {
    FILE *in = fopen(src, "rb");
    if (!in) return ds4_err_set(err, DS4_EIO, "cannot open %s", src);
    fseek(in, 0, SEEK_END);
    long size = ftell(in);
    fseek(in, 0, SEEK_SET);
    long keep = size - drop_bytes;
    char *buf = malloc((size_t)keep);
    size_t got = fread(buf, 1, (size_t)keep, in);
    fclose(in);
    FILE *out = fopen(dst, "wb");
    int rc = 0;
    if (!out || got != (size_t)keep || fwrite(buf, 1, got, out) != got)
        rc = ds4_err_set(err, DS4_EIO, "writing %s", dst);
    if (out) fclose(out);
    free(buf);
    return rc;
}
