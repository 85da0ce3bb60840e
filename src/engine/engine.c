/*
 * engine.c - open a model for serving (see engine.h).
 */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/batcher.h"
#include "format/quants.h"
#include "model/backends.h"
#include "model/placement.h"
#include "model/steering.h"

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
    if (!(e->w = opts->header_only ? ds4_weights_open_header(opts->model_path, err)
                                   : ds4_weights_open(opts->model_path, err)))
        goto fail;
    e->opts.mtp_path = NULL; /* not owned either */
    e->opts.steer_path = NULL;
    if (opts->steer_path && !(e->steer = ds4_steering_load(opts->steer_path, &e->w->cfg, err))) goto fail;
    if (ds4_steer_scale_check(opts->steer_ffn, "FFN steering scale", err) ||
        ds4_steer_scale_check(opts->steer_attn, "attention steering scale", err) ||
        ds4_engine_steering_check(e, opts->steer_ffn, opts->steer_attn, err))
        goto fail;
    e->opts.dist_opts = NULL;
    e->opts.prog = NULL;
    if (opts->dist) {
        /* a pipeline: the stages agreed on, no MTP block (it needs the
         * final residuals in one process), no steering (the other ranks'
         * layers would run without it) */
        if (opts->mtp_path) {
            ds4_err_set(err, DS4_EUNSUPPORTED, "--mtp: speculative decoding runs in one process, not in a pipeline");
            goto fail;
        }
        if (e->steer) {
            ds4_err_set(err, DS4_EUNSUPPORTED, "--dir-steering-file: steering runs in one process, not in a pipeline");
            goto fail;
        }
        if (ds4_dist_plan(opts->dist, opts->prog ? opts->prog : "ds4", e->w, opts->dist_opts, err) != 0) goto fail;
    } else if (opts->mtp_path) {
        if (!(e->mtp = ds4_mtp_open(opts->mtp_path, e->w, err))) goto fail;
    } else if (ds4_gguf_find_tensor(e->w->gguf, "mtp.0.e_proj.weight")) {
        if (!(e->mtp = ds4_mtp_from_model(e->w, err))) goto fail;
    }
    e->opts.expert_profile = NULL; /* not owned: the profile is read now */
    if (opts->expert_profile &&
        !(e->profile = ds4_expert_profile_load(opts->expert_profile, e->w->cfg.n_layer, e->w->cfg.n_expert, err)))
        goto fail;

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
        ds4_err_set(err, DS4_ENOTFOUND, "%s: the model has no tokenizer (tokenizer.ggml.* metadata)", opts->model_path);
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
    ds4_batcher_free(e->batch);
    ds4_backend_free(e->b);
    ds4_vocab_free(e->vocab);
    ds4_mtp_close(e->mtp);
    ds4_expert_profile_free(e->profile);
    ds4_steering_free(e->steer);
    ds4_weights_close(e->w);
    free(e->backend_name);
    free(e);
}

/* Sequences are made and freed between steps (through the batcher when
 * there is one), which also serialises the engine's counts. */
typedef struct seq_alloc {
    ds4_engine *e;
    uint32_t ctx;
    bool mtp;
    ds4_seq *s;
} seq_alloc;

bool ds4_engine_can_resize(const ds4_engine *e) { return e->b && e->b->ops->seq_resize; }

/* The main sequence resized (its size remembered), or any other. */
static int resize_seq(ds4_engine *e, ds4_seq *s, uint32_t ctx, ds4_err *err) {
    if (ds4_seq_resize(e->b, s, ctx, err) != 0) return -1;
    if (s == e->b->main) e->main_ctx = ctx;
    return 0;
}

/* The main sequence when it is free and of ctx tokens, or can be made so. */
static bool take_main(ds4_engine *e, uint32_t ctx) {
    if (e->main_held) return false;
    if (ctx != e->main_ctx && (!ds4_engine_can_resize(e) || resize_seq(e, e->b->main, ctx, NULL) != 0)) return false;
    return true;
}

static int alloc_seq(void *ctx, ds4_err *err) {
    seq_alloc *a = ctx;
    ds4_engine *e = a->e;
    if (a->mtp) return (a->s = ds4_mtp_seq_new(e->b, a->ctx, err)) ? 0 : -1;
    if (take_main(e, a->ctx)) {
        a->s = e->b->main;
        ds4_seq_reset(e->b, a->s);
        e->main_held = true;
    } else if (!(a->s = ds4_seq_new(e->b, a->ctx, err))) {
        return -1;
    }
    ds4_seq_set_steering(a->s, e->opts.steer_ffn, e->opts.steer_attn);
    e->n_seqs++;
    return 0;
}

static int free_seq(void *ctx, ds4_err *err) {
    seq_alloc *a = ctx;
    ds4_engine *e = a->e;
    if (a->mtp) {
        ds4_seq_free(e->b, a->s);
        return 0;
    }
    e->n_seqs--;
    if (a->s != e->b->main) {
        ds4_seq_free(e->b, a->s);
        return 0;
    }
    /* back to the size it was made with: the memory of a larger one is the session's, which is gone */
    e->main_held = false;
    ds4_seq_reset(e->b, a->s);
    if (e->main_ctx != e->b->opts.main_ctx) resize_seq(e, a->s, e->b->opts.main_ctx, err);
    return 0;
}

typedef struct seq_resize_call {
    ds4_engine *e;
    ds4_seq *s;
    uint32_t ctx;
} seq_resize_call;

static int run_resize(void *ctx, ds4_err *err) {
    seq_resize_call *c = ctx;
    return resize_seq(c->e, c->s, c->ctx, err);
}

int ds4_engine_seq_resize(ds4_engine *e, ds4_seq *s, uint32_t ctx, ds4_err *err) {
    seq_resize_call c = {e, s, ctx};
    return e->batch ? ds4_batcher_call(e->batch, run_resize, &c, err) : run_resize(&c, err);
}

int ds4_engine_open_backend(ds4_engine *e, uint32_t ctx, ds4_err *err) {
    if (e->b && ctx != e->b->opts.ctx_size && e->n_seqs == 0 && !e->batch) {
        ds4_backend_free(e->b);
        e->b = NULL;
    }
    if (e->b) return 0;
    ds4_backend_opts bo = {.n_threads = e->opts.n_threads,
                           .ctx_size = ctx,
                           .main_ctx = e->opts.dist ? 0 : e->opts.main_ctx, /* a pipeline's keep their size */
                           .no_sim = e->opts.no_sim,
                           .mtp = e->mtp,
                           .steer = e->steer,
                           .gpu_mem = e->opts.gpu_mem,
                           .host_mapped = e->opts.host_mapped,
                           .extra_seqs = e->opts.extra_seqs,
                           .expert_profile = e->profile,
                           .tensor_parallel = e->opts.tensor_parallel,
                           .act_observer = e->opts.act_observer,
                           .act_ctx = e->opts.act_ctx};
    e->b = e->opts.dist ? ds4_dist_backend_create(e->opts.dist, e->backend_name, e->w, &bo, err)
                        : ds4_backend_create(e->backend_name, e->w, &bo, err);
    if (!e->b) return -1;
    e->main_ctx = e->b->opts.main_ctx;
    return 0;
}

ds4_seq *ds4_engine_seq_new(ds4_engine *e, uint32_t ctx, ds4_err *err) {
    return ds4_engine_seq_new_sized(e, ctx, ctx, err);
}

ds4_seq *ds4_engine_seq_new_sized(ds4_engine *e, uint32_t ctx, uint32_t cap, ds4_err *err) {
    if (ds4_engine_open_backend(e, ctx, err) != 0) return NULL;
    seq_alloc a = {e, cap, false, NULL};
    int rc = e->batch ? ds4_batcher_call(e->batch, alloc_seq, &a, err) : alloc_seq(&a, err);
    return rc == 0 ? a.s : NULL;
}

ds4_seq *ds4_engine_mtp_seq_new(ds4_engine *e, uint32_t ctx, ds4_err *err) {
    seq_alloc a = {e, ctx, true, NULL};
    int rc = e->batch ? ds4_batcher_call(e->batch, alloc_seq, &a, err) : alloc_seq(&a, err);
    return rc == 0 ? a.s : NULL;
}

static void release(ds4_engine *e, ds4_seq *s, bool mtp) {
    if (!s) return;
    seq_alloc a = {e, 0, mtp, s};
    if (e->batch) ds4_batcher_call(e->batch, free_seq, &a, NULL);
    else free_seq(&a, NULL);
}

void ds4_engine_seq_free(ds4_engine *e, ds4_seq *s) { release(e, s, false); }
void ds4_engine_mtp_seq_free(ds4_engine *e, ds4_seq *s) { release(e, s, true); }

int ds4_engine_steering_check(const ds4_engine *e, float ffn, float attn, ds4_err *err) {
    if ((ffn != 0.0f || attn != 0.0f) && !e->steer)
        return ds4_err_set(err, DS4_EINVAL, "steering scales need a direction file (--dir-steering-file)");
    return 0;
}

int ds4_engine_enable_batching(ds4_engine *e, uint32_t budget, double stretch, ds4_err *err) {
    if (!e->b) return ds4_err_set(err, DS4_EINVAL, "batching needs the backend: make a session first");
    if (e->batch) return 0;
    return (e->batch = ds4_batcher_new(e->b, budget, stretch, err)) ? 0 : -1;
}

int ds4_engine_step(ds4_engine *e, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp, ds4_err *err) {
    if (e->batch) return ds4_batcher_step(e->batch, rows, n, out, mtp, err);
    return ds4_run_rows(e->b, rows, n, out, mtp, err);
}

typedef struct seq_call {
    ds4_backend *b;
    ds4_seq *s;
    ds4_seq_op op;
    uint32_t n;
    ds4_kv_state *state;
} seq_call;

static int run_seq_call(void *ctx, ds4_err *err) {
    seq_call *c = ctx;
    switch (c->op) {
    case DS4_SEQ_MARK: return ds4_backend_mark(c->b, c->s, err);
    case DS4_SEQ_REWIND: return ds4_backend_rewind(c->b, c->s, c->n, err);
    case DS4_SEQ_RESET: ds4_seq_reset(c->b, c->s); return 0;
    case DS4_SEQ_SNAPSHOT: return ds4_seq_snapshot(c->b, c->s, c->state, err);
    case DS4_SEQ_RESTORE: return ds4_seq_restore(c->b, c->s, c->state, err);
    }
    return ds4_err_set(err, DS4_EINVAL, "unknown sequence call");
}

int ds4_engine_seq_op(ds4_engine *e, ds4_seq *s, ds4_seq_op op, uint32_t n, ds4_kv_state *state, ds4_err *err) {
    seq_call c = {e->b, s, op, n, state};
    return e->batch ? ds4_batcher_call(e->batch, run_seq_call, &c, err) : run_seq_call(&c, err);
}

uint64_t ds4_engine_kv_bytes(const ds4_engine *e, uint32_t ctx) { return ds4_kv_state_bytes(&e->w->cfg, ctx); }

void ds4_engine_seq_memory(const ds4_engine *e, uint32_t ctx, ds4_seq_memory *m) { ds4_seq_memory_of(e->b, ctx, m); }

int ds4_engine_quant_bits(const ds4_engine *e) { return e->w->layers[0].gate_exps.type == DS4_TYPE_Q4_K ? 4 : 2; }
