/*
 * placement.c - routed experts between GPU memory and host RAM (see
 * placement.h): the expert profile files and the placement itself.
 */
#include "model/placement.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/imatrix.h"

ds4_expert_profile *ds4_expert_profile_new(uint32_t n_layer, uint32_t n_expert, ds4_err *err) {
    ds4_expert_profile *p = calloc(1, sizeof(*p));
    if (p) p->use = calloc((size_t)n_layer * n_expert + 1, sizeof(double));
    if (!p || !p->use) {
        ds4_expert_profile_free(p);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    p->n_layer = n_layer;
    p->n_expert = n_expert;
    return p;
}

void ds4_expert_profile_free(ds4_expert_profile *p) {
    if (!p) return;
    free(p->use);
    free(p);
}

/* The text form (placement.h). */
static ds4_expert_profile *load_text(FILE *fp, const char *path, uint32_t n_layer, uint32_t n_expert, ds4_err *err) {
    unsigned ver, L, E;
    unsigned long long tokens;
    if (fscanf(fp, " ds4-expert-profile %u layers %u experts %u tokens %llu", &ver, &L, &E, &tokens) != 4 || ver != 1) {
        ds4_err_set(err, DS4_EINVAL, "%s: not an expert profile (expected \"ds4-expert-profile 1\" and its header)",
                    path);
        return NULL;
    }
    if (L != n_layer || E != n_expert) {
        ds4_err_set(err, DS4_EINVAL, "%s: a profile of %u layers x %u experts; the model has %u x %u", path, L, E,
                    n_layer, n_expert);
        return NULL;
    }
    ds4_expert_profile *p = ds4_expert_profile_new(L, E, err);
    if (!p) return NULL;
    p->tokens = tokens;
    for (size_t i = 0; i < (size_t)L * E; i++) {
        double v;
        if (fscanf(fp, "%lf", &v) != 1 || !isfinite(v) || v < 0) {
            ds4_err_set(err, DS4_EINVAL, "%s: count %zu (layer %zu, expert %zu) is missing or not a count >= 0", path,
                        i, i / E, i % E);
            ds4_expert_profile_free(p);
            return NULL;
        }
        p->use[i] = v;
    }
    int c;
    while ((c = fgetc(fp)) != EOF)
        if (c != ' ' && c != '\n' && c != '\t' && c != '\r') {
            ds4_err_set(err, DS4_EINVAL, "%s: text after the %zu counts", path, (size_t)L * E);
            ds4_expert_profile_free(p);
            return NULL;
        }
    return p;
}

/* An imatrix: expert e's use is the sum of its gate vector (sums of squared
 * normalised inputs: each token routed to it adds about the same amount). */
static ds4_expert_profile *load_imatrix(const char *path, uint32_t n_layer, uint32_t n_expert, ds4_err *err) {
    ds4_imatrix *im = ds4_imatrix_load(path, err);
    if (!im) return NULL;
    ds4_expert_profile *p = ds4_expert_profile_new(n_layer, n_expert, err);
    if (!p) {
        ds4_imatrix_free(im);
        return NULL;
    }
    uint32_t found = 0;
    for (uint32_t l = 0; l < n_layer; l++) {
        char name[64];
        snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", l);
        const ds4_imatrix_entry *e = ds4_imatrix_find(im, name);
        if (!e) continue;
        if (e->nval % n_expert) {
            ds4_err_set(err, DS4_EINVAL, "%s: %s holds %u values, not %u experts' vectors", path, name, e->nval,
                        n_expert);
            ds4_imatrix_free(im);
            ds4_expert_profile_free(p);
            return NULL;
        }
        uint32_t per = e->nval / n_expert;
        for (uint32_t x = 0; x < n_expert; x++) {
            double s = 0;
            for (uint32_t i = 0; i < per; i++) s += e->values[(size_t)x * per + i];
            p->use[(size_t)l * n_expert + x] = s;
        }
        found++;
    }
    ds4_imatrix_free(im);
    if (found == 0) {
        ds4_err_set(err, DS4_EINVAL, "%s: an imatrix without routed-expert entries (blk.N.ffn_gate_exps.weight)", path);
        ds4_expert_profile_free(p);
        return NULL;
    }
    return p;
}

ds4_expert_profile *ds4_expert_profile_load(const char *path, uint32_t n_layer, uint32_t n_expert, ds4_err *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char head[19] = {0};
    size_t got = fread(head, 1, 18, fp);
    bool text = got == 18 && !memcmp(head, "ds4-expert-profile", 18);
    ds4_expert_profile *p = NULL;
    if (text) {
        rewind(fp);
        p = load_text(fp, path, n_layer, n_expert, err);
    }
    fclose(fp);
    return text ? p : load_imatrix(path, n_layer, n_expert, err);
}

int ds4_expert_profile_save(const ds4_expert_profile *p, const char *path, ds4_err *err) {
    size_t len = strlen(path) + 8;
    char *tmp = malloc(len);
    if (!tmp) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    snprintf(tmp, len, "%s.tmp", path);
    FILE *fp = fopen(tmp, "w");
    if (!fp) {
        ds4_err_set(err, DS4_EIO, "%s: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    fprintf(fp, "ds4-expert-profile 1\nlayers %u experts %u tokens %llu\n", p->n_layer, p->n_expert,
            (unsigned long long)p->tokens);
    for (uint32_t l = 0; l < p->n_layer; l++)
        for (uint32_t e = 0; e < p->n_expert; e++)
            fprintf(fp, "%.17g%c", p->use[(size_t)l * p->n_expert + e], e + 1 == p->n_expert ? '\n' : ' ');
    bool bad = ferror(fp) != 0;
    if (fclose(fp) != 0) bad = true;
    if (bad || rename(tmp, path) != 0) {
        ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return -1;
    }
    free(tmp);
    return 0;
}

/* ------------------------------------------------------------ placement */

static uint64_t round_up(uint64_t x, uint64_t a) { return a > 1 ? (x + a - 1) / a * a : x; }

uint64_t ds4_place_layer_bytes(const ds4_place_in *in, uint32_t l, uint32_t n) {
    uint64_t b = 0;
    for (int t = 0; t < DS4_PLACE_TENSORS; t++)
        b += round_up(in->dev_mat[(size_t)l * DS4_PLACE_TENSORS + t] * n, in->align);
    return b;
}

/* Expert e of layer l's share of its layer's selections (1 / n_expert
 * without a profile or a layer the profile never saw). */
static double share(const ds4_place_in *in, uint32_t l, uint32_t e) {
    const ds4_expert_profile *p = in->profile;
    if (!p) return 1.0 / in->n_expert;
    const double *u = p->use + (size_t)l * in->n_expert;
    double sum = 0;
    for (uint32_t i = 0; i < in->n_expert; i++) sum += u[i];
    return sum > 0 ? u[e] / sum : 1.0 / in->n_expert;
}

typedef struct cand {
    double share;
    uint32_t l, e;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->share != y->share) return x->share > y->share ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

void ds4_placement_free(ds4_placement *p) {
    if (!p) return;
    free(p->on_gpu);
    free(p->n_gpu);
    memset(p, 0, sizeof(*p));
}

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

int ds4_place_experts(const ds4_place_in *in, ds4_placement *out, ds4_err *err) {
    memset(out, 0, sizeof(*out));
    uint32_t L = in->n_layer, E = in->n_expert;
    if (in->profile && (in->profile->n_layer != L || in->profile->n_expert != E))
        return ds4_err_set(err, DS4_EINVAL, "expert profile of %u x %u experts for a model of %u x %u",
                           in->profile->n_layer, in->profile->n_expert, L, E);
    if (in->fixed > in->budget)
        return ds4_err_set(err, DS4_ENOMEM,
                           "a GPU budget of %.2f GiB (%llu bytes) is below what must be on the GPU: %.2f GiB "
                           "(%llu bytes: every weight but the routed experts, the session state and the pass "
                           "buffers); give at least that",
                           gib(in->budget), (unsigned long long)in->budget, gib(in->fixed),
                           (unsigned long long)in->fixed);
    out->n_layer = L;
    out->n_expert = E;
    out->on_gpu = calloc((size_t)L * E + 1, 1);
    out->n_gpu = calloc(L + 1, sizeof(uint32_t));
    cand *c = malloc(((size_t)L * E + 1) * sizeof(cand));
    if (!out->on_gpu || !out->n_gpu || !c) {
        free(c);
        ds4_placement_free(out);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t e = 0; e < E; e++) {
            cand *x = &c[(size_t)l * E + e];
            x->l = l;
            x->e = e;
            x->share = in->profile ? share(in, l, e) : 0; /* no profile: layer order, then expert order */
        }
    if (in->profile) qsort(c, (size_t)L * E, sizeof(cand), cmp_cand);
    /* Greedy in that order: an expert goes on the device when the layer's
     * allocations with it still fit; one that does not fit may leave room
     * for a smaller expert of another layer, so the walk goes on. */
    uint64_t used = in->fixed;
    for (size_t i = 0; i < (size_t)L * E; i++) {
        uint32_t l = c[i].l, n = out->n_gpu[l];
        uint64_t grow = ds4_place_layer_bytes(in, l, n + 1) - ds4_place_layer_bytes(in, l, n);
        if (used + grow > in->budget) continue;
        used += grow;
        out->n_gpu[l] = n + 1;
        out->on_gpu[(size_t)l * E + c[i].e] = 1;
    }
    free(c);
    for (uint32_t l = 0; l < L; l++) {
        out->dev_routed += ds4_place_layer_bytes(in, l, out->n_gpu[l]);
        for (uint32_t e = 0; e < E; e++) {
            double per_tok = in->k * share(in, l, e);
            uint64_t dev = 0;
            for (int t = 0; t < DS4_PLACE_TENSORS; t++) dev += in->dev_mat[(size_t)l * DS4_PLACE_TENSORS + t];
            if (out->on_gpu[(size_t)l * E + e]) {
                out->tok_dev += per_tok * (double)dev;
            } else {
                out->host_bytes += in->host_expert[l];
                out->host_experts++;
                out->tok_host += per_tok * (double)in->host_expert[l];
            }
        }
    }
    out->dev_total = in->fixed + out->dev_routed;
    return 0;
}
