/*
 * backend.c - backend selection and option defaults (see backend.h).
 */
#include "model/backend.h"

#include <string.h>

ds4_backend_opts ds4_backend_opts_resolve(const ds4_backend_opts *opts) {
    ds4_backend_opts o = {0};
    if (opts) o = *opts;
    if (o.ctx_size == 0) o.ctx_size = 4096;
    if (o.prefill_chunk == 0) o.prefill_chunk = 2048; /* ds4 default (MODEL.md 7); recorded in DSV4 payloads */
    return o;
}

ds4_backend *ds4_backend_create(const char *name, const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    if (!name || strcmp(name, "cpu") == 0) return ds4_cpu_backend_create(w, opts, err);
    ds4_err_set(err, DS4_EINVAL, "unknown backend '%s' (this build has: cpu)", name);
    return NULL;
}

ds4_kv_state *ds4_backend_state_new(const ds4_backend *b, ds4_err *err) {
    return ds4_kv_state_new(&b->w->cfg, b->opts.ctx_size, b->opts.prefill_chunk, err);
}
