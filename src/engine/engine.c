/*
 * engine.c - open a model for serving (see engine.h).
 */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "format/quants.h"
#include "model/backends.h"

const char *ds4_default_backend(void) {
#ifdef DS4_CUDA
    return "cuda";
#else
    return "cpu";
#endif
}

ds4_engine *ds4_engine_open(const ds4_engine_opts *opts, ds4_err *err) {
    ds4_engine *e = calloc(1, sizeof(*e));
    if (!e) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    e->opts = *opts;
    e->eos = e->bos = -1;
    if (ds4_backend_check_name(opts->backend, err) != 0) goto fail;
    e->backend_name = strdup(opts->backend ? opts->backend : ds4_default_backend());
    if (!e->backend_name) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto fail;
    }
    e->opts.backend = e->backend_name;
    e->opts.model_path = NULL; /* not owned; callers keep theirs */
    if (!(e->w = ds4_weights_open(opts->model_path, err))) goto fail;

    /* Tools that only run token ids (ds4-forward, the tests' minimal
     * models) do not need a tokenizer; chat programs do. */
    if (ds4_gguf_find_kv(e->w->gguf, "tokenizer.ggml.tokens")) {
        ds4_err verr = {0};
        e->vocab = ds4_vocab_from_gguf(e->w->gguf, &verr);
        if (!e->vocab && opts->need_vocab) {
            if (err) *err = verr;
            goto fail;
        }
    } else if (opts->need_vocab) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s: the model has no tokenizer (tokenizer.ggml.* metadata)",
                    opts->model_path);
        goto fail;
    }
    if (e->vocab) {
        if (ds4_vocab_size(e->vocab) != e->w->cfg.n_vocab) {
            ds4_err_set(err, DS4_EFORMAT, "%s: tokenizer has %u tokens but the model's vocabulary is %u",
                        opts->model_path, ds4_vocab_size(e->vocab), e->w->cfg.n_vocab);
            goto fail;
        }
        e->eos = ds4_vocab_eos(e->vocab);
        e->bos = ds4_vocab_bos(e->vocab);
    }
    return e;
fail:
    ds4_engine_close(e);
    return NULL;
}

void ds4_engine_close(ds4_engine *e) {
    if (!e) return;
    ds4_backend_free(e->b);
    ds4_vocab_free(e->vocab);
    ds4_weights_close(e->w);
    free(e->backend_name);
    free(e);
}

ds4_seq *ds4_engine_seq_new(ds4_engine *e, uint32_t ctx, ds4_err *err) {
    if (e->b && ctx != e->b->opts.ctx_size && e->n_seqs == 0) {
        ds4_backend_free(e->b);
        e->b = NULL;
    }
    if (!e->b) {
        ds4_backend_opts bo = {.n_threads = e->opts.n_threads, .ctx_size = ctx, .no_sim = e->opts.no_sim};
        if (!(e->b = ds4_backend_create(e->backend_name, e->w, &bo, err))) return NULL;
    }
    ds4_seq *s;
    if (!e->main_held && ctx == e->b->opts.ctx_size) {
        s = e->b->main;
        ds4_seq_reset(e->b, s);
        e->main_held = true;
    } else if (!(s = ds4_seq_new(e->b, ctx, err))) {
        return NULL;
    }
    e->n_seqs++;
    return s;
}

void ds4_engine_seq_free(ds4_engine *e, ds4_seq *s) {
    if (!s) return;
    e->n_seqs--;
    if (s == e->b->main)
        e->main_held = false;
    else
        ds4_seq_free(e->b, s);
}

uint64_t ds4_engine_kv_bytes(const ds4_engine *e, uint32_t ctx) {
    return ds4_kv_state_bytes(&e->w->cfg, ctx);
}

int ds4_engine_quant_bits(const ds4_engine *e) {
    return e->w->layers[0].gate_exps.type == DS4_TYPE_Q4_K ? 4 : 2;
}
