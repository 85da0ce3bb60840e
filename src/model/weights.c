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

uint64_t ds4_weights_bytes(const ds4_weights *w) {
    uint64_t total = 0;
    for (size_t i = 0; i < ds4_weights_count(w); i++) total += ds4_wt_bytes(ds4_weights_at(w, i, NULL));
    return total;
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
    for (uint32_t i = 0; same && i < DS4_GGUF_MAX_DIMS; i++) same = (i < t->ndim ? t->ne[i] : 1) == want[i];
    if (!same) {
        char got_s[128], want_s[128];
        shape_str(got_s, sizeof(got_s), t->ndim, t->ne);
        shape_str(want_s, sizeof(want_s), s->ndim, want);
        /* Name the metadata the expected shape comes from: a file whose
         * keys describe one model and whose tensors another (a Pro header
         * over Flash tensors) is told apart from a damaged tensor. */
        const char *keys = NULL;
        for (uint32_t i = 0; i < 3 && !keys; i++)
            if (s->row && (i < t->ndim ? t->ne[i] : 1) != want[i]) keys = ds4_dim_keys(s->row->ne[i]);
        if (keys)
            return ds4_err_set(err, DS4_EFORMAT, "tensor %s: shape %s, expected %s by the metadata (%s)", s->name,
                               got_s, want_s, keys);
        return ds4_err_set(err, DS4_EFORMAT, "tensor %s: shape %s, expected %s", s->name, got_s, want_s);
    }
    const ds4_type_info *ti = ds4_type_get(t->type);
    if (!ti || t->type >= 64 || !(s->allowed & (1ull << t->type)) || !ti->supported)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor %s: storage type %s is not accepted for a %s tensor", s->name,
                           ti ? ti->name : "unknown", ds4_tclass_name(s->cls));
    if (s->ne[0] % (uint64_t)ti->block_elems != 0)
        return ds4_err_set(err, DS4_EFORMAT, "tensor %s: rows of %llu values are not whole %s blocks of %lld", s->name,
                           (unsigned long long)s->ne[0], ti->name, (long long)ti->block_elems);
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
            return ds4_err_set(err, DS4_EFORMAT, "tensor %s: token %llu maps to expert %d, outside 0..%u", t->name,
                               (unsigned long long)(i / t->ne[0]), e, w->cfg.n_expert - 1);
    }
    return 0;
}

/* Look up, check and bind one tensor of g into slot (an absent optional
 * one stays empty). */
static int bind_one(const ds4_gguf *g, const ds4_tensor_spec *s, ds4_wt *slot, ds4_err *err) {
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, s->name);
    if (!t) return s->optional ? 0 : ds4_err_set(err, DS4_ENOTFOUND, "tensor %s is missing", s->name);
    if (check_tensor(s, t, err) != 0) return -1;
    slot->data = t->data;
    slot->type = t->type;
    slot->ne[0] = s->ne[0];
    slot->ne[1] = s->ne[1];
    slot->ne[2] = s->ne[2];
    slot->row_bytes = ds4_row_bytes(t->type, (int64_t)s->ne[0]);
    slot->name = t->name;
    return 0;
}

static int bind_all(ds4_weights *w, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    size_t n = ds4_layout_count(c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    if (!specs) return ds4_err_set(err, DS4_ENOMEM, "out of memory for the tensor inventory");
    ds4_layout_build(c, specs);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) rc = bind_one(w->gguf, &specs[i], slot_for(w, &specs[i]), err);
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
    for (uint32_t il = 0; rc == 0 && il < c->n_layer && !w->gguf->header_only; il++)
        if (ds4_layer_is_hash(c, il)) rc = check_tid2eid(w, il, err);
    return rc;
}

/* A synthetic tensor: the shape and type of its layout row, no data (the
 * backend fills it). */
static void shape_synthetic(ds4_wt *slot, const ds4_tensor_spec *s, uint32_t type) {
    slot->data = NULL;
    slot->type = type;
    slot->ne[0] = s->ne[0];
    slot->ne[1] = s->ne[1];
    slot->ne[2] = s->ne[2];
    slot->row_bytes = ds4_row_bytes(type, (int64_t)s->ne[0]);
    slot->name = s->name;
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

ds4_weights *ds4_weights_open_header(const char *path, ds4_err *err) {
    ds4_gguf *g = ds4_gguf_open_header(path, err);
    if (!g) return NULL;
    if (g->size > g->data_offset) { /* a file with data gets every check */
        ds4_gguf_close(g);
        return ds4_weights_open(path, err);
    }
    ds4_weights *w = ds4_weights_from_gguf(g, err);
    if (!w) ds4_gguf_close(g);
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
        shape_synthetic(slot, s, type);
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

/* ------------------------------------------------------ the MTP block */

void ds4_mtp_close(ds4_mtp_weights *m) {
    if (!m) return;
    if (m->own_gguf) ds4_gguf_close(m->gguf);
    free(m->owned);
    free(m);
}

/* The block's state: one dense layer with the main model's last clamp. */
static void mtp_config(ds4_mtp_weights *m, const ds4_config *c) {
    m->cfg = *c;
    m->cfg.n_layer = 1;
    m->cfg.compress_ratio[0] = 0;
    m->cfg.n_hash_layer = 0;
    m->cfg.swiglu_clamp[0] = c->swiglu_clamp[c->n_layer - 1];
}

/* Where the spec's tensor goes: the block's own fields or its layer's. */
static ds4_wt *mtp_slot(ds4_mtp_weights *m, const ds4_tensor_spec *s) {
    char *base = s->row >= ds4_mtp_rows && s->row < ds4_mtp_rows + DS4_N_MTP_TENSORS ? (char *)m : (char *)&m->blk;
    return (ds4_wt *)(base + s->row->offset);
}

ds4_mtp_weights *ds4_mtp_synthetic(const ds4_weights *w, const char *recipe_name, ds4_err *err) {
    const ds4_recipe *recipe = ds4_recipe_get(recipe_name);
    if (!recipe) {
        ds4_err_set(err, DS4_EINVAL, "unknown recipe '%s' (known: %s)", recipe_name, ds4_recipe_names());
        return NULL;
    }
    size_t n = ds4_layout_mtp(&w->cfg, NULL);
    ds4_mtp_weights *m = calloc(1, sizeof(*m));
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    if (!m || !specs) {
        free(m);
        free(specs);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    mtp_config(m, &w->cfg);
    m->synthetic = true;
    m->owned = specs;
    ds4_layout_mtp(&w->cfg, specs);
    for (size_t i = 0; i < n; i++) {
        const ds4_tensor_spec *s = &specs[i];
        if (!s->generated) continue;
        ds4_wt *slot = mtp_slot(m, s);
        uint32_t type;
        if (ds4_recipe_type_for(recipe, s, &type, err) != 0) {
            ds4_mtp_close(m);
            return NULL;
        }
        shape_synthetic(slot, s, type);
    }
    return m;
}

/* A file with the deepseek4.* keys describes a model: it must be w's
 * shape.  (ds4's MTP files may carry no keys: their tensors are checked
 * against w anyway.) */
static int check_mtp_config(const ds4_gguf *g, const ds4_config *c, ds4_err *err) {
    ds4_config f;
    ds4_err ignored = {0};
    if (!ds4_gguf_find_kv(g, "deepseek4.embedding_length") || ds4_config_from_gguf(g, &f, &ignored) != 0) return 0;
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
#define K(key, field) {"deepseek4." key, offsetof(ds4_config, field)}
        K("embedding_length", n_embd),
        K("vocab_size", n_vocab),
        K("attention.head_count", n_head),
        K("attention.key_length", head_dim),
        K("rope.dimension_count", rope_dim),
        K("attention.q_lora_rank", q_lora_rank),
        K("attention.output_lora_rank", o_lora_rank),
        K("attention.output_group_count", o_groups),
        K("expert_count", n_expert),
        K("expert_used_count", n_expert_used),
        K("expert_feed_forward_length", n_ff_exp),
        K("attention.sliding_window", sliding_window),
        K("hyper_connection.count", n_hc),
#undef K
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        uint32_t a = *(const uint32_t *)((const char *)&f + keys[i].off);
        uint32_t b = *(const uint32_t *)((const char *)c + keys[i].off);
        if (a != b)
            return ds4_err_set(err, DS4_EFORMAT, "%s is %u, the model's is %u: an MTP block of another model",
                               keys[i].key, a, b);
    }
    return 0;
}

static ds4_mtp_weights *mtp_bind(ds4_gguf *g, bool own, const ds4_weights *w, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    ds4_mtp_weights *m = calloc(1, sizeof(*m));
    size_t n = ds4_layout_mtp(c, NULL);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    if (!m || !specs) {
        free(m);
        free(specs);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    m->gguf = g;
    mtp_config(m, c);
    ds4_layout_mtp(c, specs);
    int rc = check_mtp_config(g, c, err);
    for (size_t i = 0; i < n && rc == 0; i++) rc = bind_one(g, &specs[i], mtp_slot(m, &specs[i]), err);
    free(specs);
    if (rc != 0) {
        ds4_err_prefix(err, "%s: MTP block", g->path);
        free(m);
        return NULL;
    }
    m->own_gguf = own;
    return m;
}

ds4_mtp_weights *ds4_mtp_open(const char *path, const ds4_weights *w, ds4_err *err) {
    ds4_gguf *g = ds4_gguf_open(path, err);
    if (!g) return NULL;
    ds4_mtp_weights *m = mtp_bind(g, true, w, err);
    if (!m) ds4_gguf_close(g);
    return m;
}

ds4_mtp_weights *ds4_mtp_from_model(const ds4_weights *w, ds4_err *err) {
    if (!w->gguf || !ds4_gguf_find_tensor(w->gguf, "mtp.0.e_proj.weight")) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s holds no MTP block (no mtp.0.* tensors)",
                    w->gguf ? w->gguf->path : "the model");
        return NULL;
    }
    return mtp_bind(w->gguf, false, w, err);
}
