/*
 * backends.c - backend names and creation (see backends.h).
 */
#include "model/backends.h"
#include "model/steering.h"

#include <string.h>

#if DS4_CUDA
#define BACKEND_NAMES "cpu, cuda"
#else
#define BACKEND_NAMES "cpu"
#endif

int ds4_backend_check_name(const char *name, ds4_err *err) {
    if (!name || strcmp(name, "cpu") == 0) return 0;
#if DS4_CUDA
    if (strcmp(name, "cuda") == 0) return 0;
#else
    if (strcmp(name, "cuda") == 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "this is a CPU build, without the CUDA backend (build it with `make cuda`)");
#endif
    if (strcmp(name, "metal") == 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "Metal is not supported by this engine (backends: %s)",
                           BACKEND_NAMES);
    return ds4_err_set(err, DS4_EINVAL, "unknown backend '%s' (this build has: %s)", name, BACKEND_NAMES);
}

ds4_backend *ds4_backend_create(const char *name, const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    /* Every backend runs the same simulations: their shape needs are checked
     * once, here, and only when they are on. */
    if (!(opts && opts->no_sim) && ds4_config_check_sim(&w->cfg, err) != 0) {
        ds4_err_prefix(err, "%s", w->gguf ? w->gguf->path : "model");
        return NULL;
    }
    const ds4_steering *st = opts ? opts->steer : NULL;
    if (st && (st->n_layer != w->cfg.n_layer || st->n_embd != w->cfg.n_embd)) {
        ds4_err_set(err, DS4_EINVAL, "steering directions of %u x %u for a model of %u layers x %u", st->n_layer,
                    st->n_embd, w->cfg.n_layer, w->cfg.n_embd);
        return NULL;
    }
    bool cuda = name && strcmp(name, "cuda") == 0;
    if (opts && opts->tensor_parallel > 1 && !opts->tp_clique) { /* the group, which makes its ranks' */
        if (!cuda) {
            ds4_err_set(err, DS4_EUNSUPPORTED, "tensor parallelism (--tensor-parallel) runs on CUDA GPUs, not the %s "
                        "backend", name ? name : "cpu");
            return NULL;
        }
        return ds4_tp_backend_create(w, opts, err);
    }
    if (!name || strcmp(name, "cpu") == 0) return ds4_cpu_backend_create(w, opts, err);
#if DS4_CUDA
    if (cuda) return ds4_cuda_backend_create(w, opts, err);
#endif
    ds4_err_set(err, DS4_EINVAL, "unknown backend '%s' (this build has: %s)", name, BACKEND_NAMES);
    return NULL;
}

uint64_t ds4_backend_mem_available(const char *name, int gpu) {
#if DS4_CUDA
    uint64_t bytes = 0;
    ds4_err err = {0};
    if (name && strcmp(name, "cuda") == 0 && ds4_cuda_mem_available(gpu, &bytes, &err) == 0) return bytes;
#else
    (void)name, (void)gpu;
#endif
    return 0;
}

int ds4_backend_imatrix_flush(ds4_backend *b, ds4_err *err) {
#if DS4_CUDA
    if (b->opts.imatrix && strcmp(b->ops->name, "cuda") == 0) return ds4_cuda_imatrix_flush(b, err);
#else
    (void)b;
    (void)err;
#endif
    return 0;
}
