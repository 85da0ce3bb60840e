/*
 * convert.c - one tensor from the input (source.c) into the GGUF writer
 * (see quantize.h).
 *
 * Routed experts: a batch of as many experts as threads is decoded and
 * quantized in parallel (one expert per task), then written in order.  The
 * importance vector of each expert comes from the imatrix (packed
 * n_expert x n_columns or per-expert entries) or, for IQ2_XXS when none
 * exists, from the expert's own column energy, sum over rows of w^2
 * (docs/MODEL.md 2.6); Q2_K/Q4_K without a vector use their own weighting.
 *
 * Other matrices: row chunks of about 16 MB of f32, each split across the
 * threads, written in order.  IQ2_XXS without an imatrix vector first takes
 * a pass over the whole matrix for its column energy.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"
#include "quantize.h"

#define CHUNK_FLOATS (4u << 20)

bool qz_type_uses_importance(uint32_t type) {
    return type == DS4_TYPE_Q2_K || type == DS4_TYPE_Q4_K || type == DS4_TYPE_IQ2_XXS;
}

static bool is_routed(const ds4_tensor_spec *t) {
    return t->cls == DS4_TC_EXP_GATE || t->cls == DS4_TC_EXP_UP || t->cls == DS4_TC_EXP_DOWN;
}

static void quantize_rows(uint32_t type, const float *src, int64_t nrows, int64_t cols, const float *imp,
                          uint8_t *dst) {
    size_t rb = ds4_row_bytes(type, cols);
    for (int64_t r = 0; r < nrows; r++) ds4_quantize_row(type, src + r * cols, dst + (size_t)r * rb, cols, imp);
}

/* Importance for one matrix: 1 from the imatrix, 0 none (imp unused),
 * 2 synthetic column energy; -1 on error. */
static int importance_for(qz_job *j, const ds4_tensor_spec *t, uint32_t type, int expert, const float *w, int64_t rows,
                          int64_t cols, float *imp, ds4_err *err) {
    if (!qz_type_uses_importance(type)) return 0;
    if (j->im) {
        int rc = ds4_imatrix_lookup(j->im, t->name, cols, expert, (int)j->hc.cfg.n_expert, imp, err);
        if (rc != 0) return rc;
        if (j->o->imatrix_strict) {
            if (expert >= 0)
                return ds4_err_set(err, DS4_ENOTFOUND, "%s: no imatrix vector for expert %d (--imatrix-strict)",
                                   t->name, expert);
            return ds4_err_set(err, DS4_ENOTFOUND, "%s: no imatrix vector (--imatrix-strict)", t->name);
        }
    }
    if (type != DS4_TYPE_IQ2_XXS || !w) return 0;
    ds4_column_energy(w, rows, cols, imp);
    return 2;
}

/* ------------------------------------------------------------ experts */

typedef struct expert_batch {
    qz_job *j;
    const qz_item *it;
    int first;
    int64_t rows, cols;
    size_t per_expert;
    float **f32;
    float **imp;
    uint8_t **out;
    int *source;   /* importance source per slot (importance_for's result) */
    ds4_err *errs; /* per slot */
    int *failed;
} expert_batch;

static void expert_task(void *ctx, int64_t begin, int64_t end, int thread) {
    expert_batch *b = ctx;
    (void)thread;
    for (int64_t slot = begin; slot < end; slot++) {
        int e = b->first + (int)slot;
        ds4_err *err = &b->errs[slot];
        qz_source src;
        b->failed[slot] = 1;
        if (qz_resolve(b->j, b->it->t, e, &src, err) != 0) continue;
        if (qz_decode_rows(&src, 0, b->rows, b->f32[slot], err) != 0) continue;
        int rc = importance_for(b->j, b->it->t, b->it->type, e, b->f32[slot], b->rows, b->cols, b->imp[slot], err);
        if (rc < 0) continue;
        b->source[slot] = rc;
        quantize_rows(b->it->type, b->f32[slot], b->rows, b->cols, rc ? b->imp[slot] : NULL, b->out[slot]);
        b->failed[slot] = 0;
    }
}

static void free_slots(void **slots, int n) {
    if (!slots) return;
    for (int i = 0; i < n; i++) free(slots[i]);
    free(slots);
}

static void *alloc_slots(int n, size_t each) {
    void **s = calloc((size_t)n, sizeof(void *));
    if (!s) return NULL;
    for (int i = 0; i < n; i++)
        if (!(s[i] = malloc(each ? each : 1))) {
            free_slots(s, i);
            return NULL;
        }
    return s;
}

static int convert_experts(qz_job *j, const qz_item *it, qz_sink *sink, ds4_err *err) {
    const ds4_tensor_spec *t = it->t;
    int n_expert = (int)t->ne[2];
    int slots = ds4_pool_size(j->pool);
    if (slots > n_expert) slots = n_expert;
    expert_batch b = {.j = j, .it = it, .rows = (int64_t)t->ne[1], .cols = (int64_t)t->ne[0]};
    b.per_expert = ds4_row_bytes(it->type, b.cols) * (size_t)b.rows;
    b.f32 = alloc_slots(slots, (size_t)(b.rows * b.cols) * sizeof(float));
    b.imp = alloc_slots(slots, (size_t)b.cols * sizeof(float));
    b.out = alloc_slots(slots, b.per_expert);
    b.source = calloc((size_t)slots, sizeof(int));
    b.errs = calloc((size_t)slots, sizeof(ds4_err));
    b.failed = calloc((size_t)slots, sizeof(int));
    int rc = 0;
    if (!b.f32 || !b.imp || !b.out || !b.source || !b.errs || !b.failed) {
        rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory for %d expert buffers", t->name, slots);
        goto done;
    }
    for (b.first = 0; b.first < n_expert && rc == 0; b.first += slots) {
        int count = n_expert - b.first < slots ? n_expert - b.first : slots;
        ds4_pool_run(j->pool, count, 1, expert_task, &b);
        for (int s = 0; s < count && rc == 0; s++) {
            if (b.failed[s]) {
                *err = b.errs[s];
                rc = -1;
                break;
            }
            if (b.source[s] == 1) j->imatrix_used++;
            if (b.source[s] == 2) j->synthetic_used++;
            if (sink->put(sink, b.out[s], b.per_expert, err) != 0) rc = -1;
        }
        j->elements_done += (uint64_t)count * (uint64_t)(b.rows * b.cols);
        j->bytes_done += (uint64_t)count * b.per_expert;
    }
done:
    free_slots((void **)b.f32, slots);
    free_slots((void **)b.imp, slots);
    free_slots((void **)b.out, slots);
    free(b.source);
    free(b.errs);
    free(b.failed);
    return rc;
}

/* ------------------------------------------------------------ matrices */

typedef struct chunk {
    const qz_source *src;
    uint32_t type;
    int64_t row0, cols;
    float *f32;
    uint8_t *out;
    const float *imp;
    ds4_err *errs; /* per thread */
    int *failed;   /* per thread */
} chunk;

static void chunk_task(void *ctx, int64_t begin, int64_t end, int thread) {
    chunk *c = ctx;
    float *rows = c->f32 + begin * c->cols;
    if (qz_decode_rows(c->src, c->row0 + begin, end - begin, rows, &c->errs[thread]) != 0) {
        c->failed[thread] = 1;
        return;
    }
    size_t rb = ds4_row_bytes(c->type, c->cols);
    quantize_rows(c->type, rows, end - begin, c->cols, c->imp, c->out + (size_t)begin * rb);
}

static int first_failure(const chunk *c, int nthreads, ds4_err *err) {
    for (int i = 0; i < nthreads; i++)
        if (c->failed[i]) {
            *err = c->errs[i];
            return -1;
        }
    return 0;
}

/* Column energy of a whole matrix, streamed in chunks, for IQ2_XXS. */
static int matrix_energy(const qz_source *src, int64_t chunk_rows, float *buf, float *energy, ds4_err *err) {
    float *part = malloc((size_t)src->cols * sizeof(float));
    if (!part) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    memset(energy, 0, (size_t)src->cols * sizeof(float));
    for (int64_t r0 = 0; r0 < src->rows; r0 += chunk_rows) {
        int64_t n = src->rows - r0 < chunk_rows ? src->rows - r0 : chunk_rows;
        if (qz_decode_rows(src, r0, n, buf, err) != 0) {
            free(part);
            return -1;
        }
        ds4_column_energy(buf, n, src->cols, part);
        for (int64_t c = 0; c < src->cols; c++) energy[c] += part[c];
    }
    free(part);
    return 0;
}

static int convert_matrix(qz_job *j, const qz_item *it, qz_sink *sink, ds4_err *err) {
    const ds4_tensor_spec *t = it->t;
    qz_source src;
    if (qz_resolve(j, t, -1, &src, err) != 0) return -1;
    int nthreads = ds4_pool_size(j->pool);
    int64_t chunk_rows = (int64_t)(CHUNK_FLOATS / (uint64_t)src.cols);
    if (chunk_rows < 1) chunk_rows = 1;
    if (chunk_rows > src.rows) chunk_rows = src.rows;
    size_t rb = ds4_row_bytes(it->type, src.cols);
    chunk c = {.src = &src, .type = it->type, .cols = src.cols};
    c.f32 = malloc((size_t)(chunk_rows * src.cols) * sizeof(float));
    c.out = malloc(rb * (size_t)chunk_rows);
    float *imp = malloc((size_t)src.cols * sizeof(float));
    c.errs = calloc((size_t)nthreads, sizeof(ds4_err));
    c.failed = calloc((size_t)nthreads, sizeof(int));
    int rc = 0;
    if (!c.f32 || !c.out || !imp || !c.errs || !c.failed) {
        rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", t->name);
        goto done;
    }
    int source = importance_for(j, t, it->type, -1, NULL, 0, src.cols, imp, err);
    if (source < 0) {
        rc = -1;
        goto done;
    }
    if (source == 0 && it->type == DS4_TYPE_IQ2_XXS) {
        if (matrix_energy(&src, chunk_rows, c.f32, imp, err) != 0) {
            rc = -1;
            goto done;
        }
        source = 2;
    }
    c.imp = source ? imp : NULL;
    j->imatrix_used += source == 1;
    j->synthetic_used += source == 2;
    for (c.row0 = 0; c.row0 < src.rows && rc == 0; c.row0 += chunk_rows) {
        int64_t n = src.rows - c.row0 < chunk_rows ? src.rows - c.row0 : chunk_rows;
        ds4_pool_run(j->pool, n, 1 + 4096 / src.cols, chunk_task, &c);
        if (first_failure(&c, nthreads, err) != 0) {
            rc = -1;
            break;
        }
        if (sink->put(sink, c.out, rb * (size_t)n, err) != 0) rc = -1;
        j->elements_done += (uint64_t)(n * src.cols);
        j->bytes_done += rb * (size_t)n;
    }
done:
    free(c.f32);
    free(c.out);
    free(imp);
    free(c.errs);
    free(c.failed);
    return rc;
}

static int convert_ids(qz_job *j, const qz_item *it, qz_sink *sink, ds4_err *err) {
    qz_source src;
    if (qz_resolve(j, it->t, -1, &src, err) != 0) return -1;
    if (it->type != DS4_TYPE_I32)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: integer tensors are stored as i32", it->t->name);
    int32_t *ids = malloc(it->nbytes ? it->nbytes : 1);
    if (!ids) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = qz_decode_i32(j, &src, ids, err);
    if (rc == 0) rc = sink->put(sink, ids, it->nbytes, err);
    j->elements_done += it->nbytes / 4;
    j->bytes_done += it->nbytes;
    free(ids);
    return rc;
}

int qz_convert(qz_job *j, const qz_item *it, qz_sink *sink, ds4_err *err) {
    if (it->t->cls == DS4_TC_HASH) return convert_ids(j, it, sink, err);
    if (is_routed(it->t)) return convert_experts(j, it, sink, err);
    return convert_matrix(j, it, sink, err);
}
