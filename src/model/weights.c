/*
 * weights.c - bind and validate the tensors of a ds4 GGUF (see weights.h).
 *
 * The inventory (layout.c) says which tensors a config needs; here each one
 * is looked up, checked (shape, storage type, whole blocks per row) and its
 * view stored into the field its row of the tensor table (tensors.h)
 * names.  Then the file's own tensor list is checked for names the
 * inventory does not know.
 */
#include "model/weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"
#include "model/layout.h"

/* The field a spec binds: its row's offset in the struct of its block. */
static ds4_wt *slot_for(ds4_weights *w, const ds4_tensor_spec *s) {
    char *base = s->layer < 0 ? (char *)w : (char *)&w->layers[s->layer];
    return (ds4_wt *)(base + s->row->offset);
}

size_t ds4_weights_count(const ds4_weights *w) {
    return DS4_N_GLOBAL_TENSORS + (size_t)w->cfg.n_layer * DS4_N_LAYER_TENSORS;
}

const ds4_wt *ds4_weights_at(const ds4_weights *w, size_t i, const ds4_tensor_row **row) {
    const ds4_tensor_row *r;
    const char *base;
    if (i < DS4_N_GLOBAL_TENSORS) {
        r = &ds4_global_rows[i];
        base = (const char *)w;
    } else {
        i -= DS4_N_GLOBAL_TENSORS;
        r = &ds4_layer_rows[i % DS4_N_LAYER_TENSORS];
        base = (const char *)&w->layers[i / DS4_N_LAYER_TENSORS];
    }
    if (row) *row = r;
    return (const ds4_wt *)(base + r->offset);
}

static void shape_str(char *buf, size_t n, uint32_t ndim, const uint64_t *ne) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (uint32_t i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%llu", i ? ", " : "", (unsigned long long)ne[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

/* Trailing dimensions of 1 carry no information: a vector may be stored as
 * [n] or [n, 1]. */
static uint32_t effective_ndim(uint32_t ndim, const uint64_t *ne) {
    while (ndim > 1 && ne[ndim - 1] == 1) ndim--;
    return ndim;
}

static int check_tensor(const ds4_tensor_spec *s, const ds4_gguf_tensor *t, ds4_err *err) {
    uint64_t want[DS4_GGUF_MAX_DIMS] = {s->ne[0], s->ne[1], s->ne[2], 1, 1, 1, 1, 1};
    bool same = effective_ndim(t->ndim, t->ne) == effective_ndim(s->ndim, want);
    for (uint32_t i = 0; same && i < DS4_GGUF_MAX_DIMS; i++)
        same = (i < t->ndim ? t->ne[i] : 1) == want[i];
    if (!same) {
        char got_s[128], want_s[128];
        shape_str(got_s, sizeof(got_s), t->ndim, t->ne);
        shape_str(want_s, sizeof(want_s), s->ndim, want);
        return ds4_err_set(err, DS4_EFORMAT, "tensor %s: shape %s, expected %s", s->name, got_s, want_s);
    }
    const ds4_type_info *ti = ds4_type_get(t->type);
    if (!ti || t->type >= 64 || !(s->allowed & (1ull << t->type)) || !ti->supported)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor %s: storage type %s is not accepted for a %s tensor",
                           s->name, ti ? ti->name : "unknown", ds4_tclass_name(s->cls));
    if (s->ne[0] % (uint64_t)ti->block_elems != 0)
        return ds4_err_set(err, DS4_EFORMAT, "tensor %s: rows of %llu values are not whole %s blocks of %lld",
                           s->name, (unsigned long long)s->ne[0], ti->name, (long long)ti->block_elems);
    return 0;
}

/* The hash table indexes the expert tensors directly: every entry must be a
 * valid expert id. */
static int check_tid2eid(const ds4_weights *w, uint32_t il, ds4_err *err) {
    const ds4_wt *t = &w->layers[il].tid2eid;
    const uint8_t *p = t->data;
    uint64_t n = t->ne[0] * t->ne[1];
    for (uint64_t i = 0; i < n; i++) {
        int32_t e;
        memcpy(&e, p + 4 * i, 4);
        if (e < 0 || (uint32_t)e >= w->cfg.n_expert)
            return ds4_err_set(err, DS4_EFORMAT, "tensor %s: token %llu maps to expert %d, outside 0..%u",
                               t->name, (unsigned long long)(i / t->ne[0]), e, w->cfg.n_expert - 1);
    }
    return 0;
}

static int bind_all(ds4_weights *w, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    size_t n = ds4_layout_count(c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    if (!specs) return ds4_err_set(err, DS4_ENOMEM, "out of memory for the tensor inventory");
    ds4_layout_build(c, specs);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const ds4_tensor_spec *s = &specs[i];
        ds4_wt *slot = slot_for(w, s);
        const ds4_gguf_tensor *t = ds4_gguf_find_tensor(w->gguf, s->name);
        if (!t) {
            if (s->optional) continue;
            rc = ds4_err_set(err, DS4_ENOTFOUND, "tensor %s is missing", s->name);
            break;
        }
        if ((rc = check_tensor(s, t, err)) != 0) break;
        slot->data = t->data;
        slot->type = t->type;
        slot->ne[0] = s->ne[0];
        slot->ne[1] = s->ne[1];
        slot->ne[2] = s->ne[2];
        slot->row_bytes = ds4_row_bytes(t->type, (int64_t)s->ne[0]);
        slot->name = t->name;
    }
    /* Every tensor of the file must be one the inventory knows. */
    for (uint64_t i = 0; rc == 0 && i < w->gguf->n_tensors; i++) {
        const char *name = w->gguf->tensors[i].name;
        if (strncmp(name, "mtp.", 4) == 0) continue;
        bool known = false;
        for (size_t j = 0; j < n && !known; j++) known = strcmp(specs[j].name, name) == 0;
        if (!known)
            rc = ds4_err_set(err, DS4_EUNSUPPORTED, "tensor %s is not part of a %u-layer ds4 model", name, c->n_layer);
    }
    free(specs);
    for (uint32_t il = 0; rc == 0 && il < c->n_layer; il++)
        if (ds4_layer_is_hash(c, il)) rc = check_tid2eid(w, il, err);
    return rc;
}

/* Errors name the file once: the reader's own messages already do. */
static void name_file(const ds4_gguf *g, ds4_err *err) {
    if (err && !strstr(ds4_err_msg(err), g->path)) ds4_err_prefix(err, "%s", g->path);
}

ds4_weights *ds4_weights_from_gguf(ds4_gguf *g, ds4_err *err) {
    ds4_weights *w = calloc(1, sizeof(*w));
    if (!w) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    if (ds4_config_from_gguf(g, &w->cfg, err) != 0) {
        name_file(g, err);
        free(w);
        return NULL;
    }
    w->layers = calloc(w->cfg.n_layer, sizeof(*w->layers));
    if (!w->layers) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        free(w);
        return NULL;
    }
    w->gguf = g;
    if (bind_all(w, err) != 0) {
        name_file(g, err);
        w->gguf = NULL; /* the caller keeps its reader on failure */
        ds4_weights_close(w);
        return NULL;
    }
    return w;
}

ds4_weights *ds4_weights_open(const char *path, ds4_err *err) {
    ds4_gguf *g = ds4_gguf_open(path, err);
    if (!g) return NULL;
    ds4_weights *w = ds4_weights_from_gguf(g, err);
    if (!w) ds4_gguf_close(g);
    return w;
}

ds4_weights *ds4_weights_synthetic(const ds4_config *c, const char *recipe_name, uint64_t seed, ds4_err *err) {
    if (ds4_config_validate(c, err) != 0) return NULL;
    const ds4_recipe *recipe = ds4_recipe_get(recipe_name);
    if (!recipe) {
        ds4_err_set(err, DS4_EINVAL, "unknown recipe '%s' (known: %s)", recipe_name, ds4_recipe_names());
        return NULL;
    }
    ds4_weights *w = calloc(1, sizeof(*w));
    size_t n = ds4_layout_count(c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    if (w) w->layers = calloc(c->n_layer, sizeof(*w->layers));
    if (!w || !specs || !w->layers) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        free(specs);
        ds4_weights_close(w);
        return NULL;
    }
    w->cfg = *c;
    w->synthetic = true;
    w->synthetic_seed = seed;
    w->owned = specs;
    ds4_layout_build(c, specs);
    for (size_t i = 0; i < n; i++) {
        const ds4_tensor_spec *s = &specs[i];
        if (!s->generated) continue;
        ds4_wt *slot = slot_for(w, s);
        uint32_t type;
        if (ds4_recipe_type_for(recipe, s, &type, err) != 0) {
            ds4_weights_close(w);
            return NULL;
        }
        slot->data = NULL;
        slot->type = type;
        slot->ne[0] = s->ne[0];
        slot->ne[1] = s->ne[1];
        slot->ne[2] = s->ne[2];
        slot->row_bytes = ds4_row_bytes(type, (int64_t)s->ne[0]);
        slot->name = s->name;
    }
    return w;
}

void ds4_weights_close(ds4_weights *w) {
    if (!w) return;
    free(w->owned);
    if (w->gguf) ds4_gguf_close(w->gguf);
    free(w->layers);
    free(w);
}
