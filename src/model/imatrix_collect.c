/*
 * imatrix_collect.c - routed-expert importance accumulation (see
 * imatrix_collect.h).  Gate and up read the same input, so one sum serves
 * both entries.
 */
#include "model/imatrix_collect.h"

#include "base/paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/imatrix.h"
#include "model/layout.h"

struct ds4_imcol {
    ds4_config cfg;
    double *in;  /* [n_layer][n_expert][n_embd] */
    double *mid; /* [n_layer][n_expert][n_ff_exp] */
    int32_t prompts;
    uint64_t routes;
};

ds4_imcol *ds4_imcol_new(const ds4_config *c, ds4_err *err) {
    ds4_imcol *col = calloc(1, sizeof(*col));
    if (!col) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    col->cfg = *c;
    size_t per = (size_t)c->n_layer * c->n_expert;
    col->in = calloc(per * c->n_embd, sizeof(double));
    col->mid = calloc(per * c->n_ff_exp, sizeof(double));
    if (!col->in || !col->mid) {
        ds4_err_set(err, DS4_ENOMEM, "imatrix collector: out of memory for %zu experts", per);
        ds4_imcol_free(col);
        return NULL;
    }
    return col;
}

void ds4_imcol_free(ds4_imcol *col) {
    if (!col) return;
    free(col->in);
    free(col->mid);
    free(col);
}

static void add_squares(double *acc, const float *rows, uint32_t m, uint32_t n) {
    for (uint32_t r = 0; r < m; r++) {
        const float *x = rows + (size_t)r * n;
        for (uint32_t i = 0; i < n; i++) acc[i] += (double)x[i] * (double)x[i];
    }
}

void ds4_imcol_expert(ds4_imcol *col, uint32_t il, uint32_t e, uint32_t m, const float *x, const float *mid) {
    const ds4_config *c = &col->cfg;
    if (il >= c->n_layer || e >= c->n_expert || m == 0) return;
    size_t slot = (size_t)il * c->n_expert + e;
    add_squares(col->in + slot * c->n_embd, x, m, c->n_embd);
    add_squares(col->mid + slot * c->n_ff_exp, mid, m, c->n_ff_exp);
    col->routes += m;
}

void ds4_imcol_add_sums(ds4_imcol *col, uint32_t il, const double *in, const double *mid, uint64_t routes) {
    const ds4_config *c = &col->cfg;
    if (il >= c->n_layer) return;
    size_t slot = (size_t)il * c->n_expert;
    double *a = col->in + slot * c->n_embd, *b = col->mid + slot * c->n_ff_exp;
    for (size_t i = 0; i < (size_t)c->n_expert * c->n_embd; i++) a[i] += in[i];
    for (size_t i = 0; i < (size_t)c->n_expert * c->n_ff_exp; i++) b[i] += mid[i];
    col->routes += routes;
}

void ds4_imcol_end_prompt(ds4_imcol *col) { col->prompts++; }

int32_t ds4_imcol_prompts(const ds4_imcol *col) { return col->prompts; }

uint64_t ds4_imcol_routes(const ds4_imcol *col) { return col->routes; }

/* One entry: the sums of layer il, all experts, as floats. */
static int put_entry(ds4_imatrix *im, const char *name, const double *sums, uint32_t n_expert, uint32_t n,
                     int32_t ncall, ds4_err *err) {
    ds4_imatrix_entry *e = ds4_imatrix_entry_get(im, name, n_expert * n, err);
    if (!e) return -1;
    for (uint32_t i = 0; i < n_expert * n; i++) e->values[i] = (float)sums[i];
    e->ncall = ncall;
    return 0;
}

int ds4_imcol_save(const ds4_imcol *col, const char *path, const char *dataset, ds4_err *err) {
    const ds4_config *c = &col->cfg;
    size_t n = ds4_layout_count(c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    ds4_imatrix *im = ds4_imatrix_new(err);
    int rc = -1;
    if (!specs || !im) {
        if (!specs) ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    ds4_layout_build(c, specs);
    for (size_t i = 0; i < n; i++) {
        const ds4_tensor_spec *t = &specs[i];
        size_t slot = (size_t)t->layer * c->n_expert;
        if (t->cls == DS4_TC_EXP_GATE || t->cls == DS4_TC_EXP_UP) {
            if (put_entry(im, t->name, col->in + slot * c->n_embd, c->n_expert, c->n_embd, col->prompts, err) != 0)
                goto done;
        } else if (t->cls == DS4_TC_EXP_DOWN) {
            if (put_entry(im, t->name, col->mid + slot * c->n_ff_exp, c->n_expert, c->n_ff_exp, col->prompts, err) != 0)
                goto done;
        }
    }
    if (ds4_imatrix_set_trailer(im, col->prompts, dataset, err) != 0) goto done;
    rc = ds4_imatrix_save(im, path, err);
done:
    ds4_imatrix_free(im);
    free(specs);
    return rc;
}

/* ---------------------------------------------------------- checkpoints */

/* Layout (the writing machine's byte order: a checkpoint resumes a run on
 * the machine that made it): magic, u32 n_layer n_expert n_embd n_ff_exp
 * ctx, i32 prompts, u64 consumed tokens dataset_bytes routes, then the
 * double sums of the gate/up inputs and of the down inputs. */
#define CKPT_MAGIC "DS4IMCK1"

typedef struct ckpt_head {
    char magic[8];
    uint32_t n_layer, n_expert, n_embd, n_ff_exp, ctx;
    int32_t prompts;
    uint64_t consumed, tokens, dataset_bytes, routes;
} ckpt_head;

static size_t in_count(const ds4_config *c) { return (size_t)c->n_layer * c->n_expert * c->n_embd; }
static size_t mid_count(const ds4_config *c) { return (size_t)c->n_layer * c->n_expert * c->n_ff_exp; }

int ds4_imcol_save_state(const ds4_imcol *col, const char *path, const ds4_imcol_progress *p, ds4_err *err) {
    const ds4_config *c = &col->cfg;
    ckpt_head h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.n_layer = c->n_layer;
    h.n_expert = c->n_expert;
    h.n_embd = c->n_embd;
    h.n_ff_exp = c->n_ff_exp;
    h.ctx = p->ctx;
    h.prompts = col->prompts;
    h.consumed = p->consumed;
    h.tokens = p->tokens;
    h.dataset_bytes = p->dataset_bytes;
    h.routes = col->routes;
    ds4_atomic_file a;
    if (ds4_atomic_open(&a, path, err)) return -1;
    bool bad = fwrite(&h, sizeof(h), 1, a.f) != 1 || fwrite(col->in, sizeof(double), in_count(c), a.f) != in_count(c) ||
               fwrite(col->mid, sizeof(double), mid_count(c), a.f) != mid_count(c);
    return ds4_atomic_commit(&a, bad, err);
}

int ds4_imcol_load_state(ds4_imcol *col, const char *path, ds4_imcol_progress *p, ds4_err *err) {
    const ds4_config *c = &col->cfg;
    FILE *f = fopen(path, "rb");
    if (!f) return ds4_err_set(err, errno == ENOENT ? DS4_ENOTFOUND : DS4_EIO, "%s: %s", path, strerror(errno));
    ckpt_head h;
    int rc = -1;
    if (fread(&h, sizeof(h), 1, f) != 1 || memcmp(h.magic, CKPT_MAGIC, 8) != 0) {
        ds4_err_set(err, DS4_EFORMAT, "%s: not an imatrix checkpoint", path);
    } else if (h.n_layer != c->n_layer || h.n_expert != c->n_expert || h.n_embd != c->n_embd ||
               h.n_ff_exp != c->n_ff_exp) {
        ds4_err_set(err, DS4_EINVAL,
                    "%s: a checkpoint of %u layers x %u experts (%u, %u wide), not this model's %u x %u (%u, %u)", path,
                    h.n_layer, h.n_expert, h.n_embd, h.n_ff_exp, c->n_layer, c->n_expert, c->n_embd, c->n_ff_exp);
    } else if (h.prompts < 0 || fread(col->in, sizeof(double), in_count(c), f) != in_count(c) ||
               fread(col->mid, sizeof(double), mid_count(c), f) != mid_count(c) || fgetc(f) != EOF) {
        ds4_err_set(err, DS4_EFORMAT, "%s: a checkpoint of the wrong size (truncated?)", path);
    } else {
        col->prompts = h.prompts;
        col->routes = h.routes;
        p->consumed = h.consumed;
        p->tokens = h.tokens;
        p->dataset_bytes = h.dataset_bytes;
        p->ctx = h.ctx;
        rc = 0;
    }
    fclose(f);
    return rc;
}
