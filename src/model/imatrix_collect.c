/*
 * imatrix_collect.c - routed-expert importance accumulation (see
 * imatrix_collect.h).  Gate and up read the same input, so one sum serves
 * both entries.
 */
#include "model/imatrix_collect.h"

#include <stdlib.h>
#include <string.h>

#include "format/imatrix.h"
#include "model/layout.h"

struct ds4_imcol {
    ds4_config cfg;
    double *in;    /* [n_layer][n_expert][n_embd] */
    double *mid;   /* [n_layer][n_expert][n_ff_exp] */
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

void ds4_imcol_end_prompt(ds4_imcol *col) { col->prompts++; }

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
