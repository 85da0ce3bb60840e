/*
 * dist_serve.c - the ranks after the first: their stage's backend, driven
 * by rank 0's commands until the job ends (see dist.h), in a process of
 * their own (mpirun) or a thread of the program's (--gpus); and a
 * program's start (ds4_dist_start).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/instance_lock.h"
#include "base/rank.h"
#include "model/backends.h"
#include "model/dist/dist_internal.h"

/* The stage's state on this rank. */
typedef struct server {
    ds4_dist *d;
    const char *local;
    const ds4_weights *w;
    int n_threads;
    uint32_t first, end, hcD, n_vocab;
    bool last;
    ds4_backend *b;
    ds4_seq **seqs; /* by id; 0 is the backend's main one */
    uint32_t *ctx;  /* each one's context */
    uint32_t n_seqs;
    /* step buffers: the rows; the residuals' way in (and out, before the
     * last stage); the last stage's logits and DS4_DIST_IN_FLIGHT answers
     * (each sent while the next steps run) */
    uint32_t chunk;
    dist_row *rows;
    ds4_row *lrows;
    dist_pipe *pipe;
    float *lg; /* the logits of the rows that ask */
    size_t lg_cap;
    void *out[DS4_DIST_IN_FLIGHT]; /* what is sent back: logits and argmaxes */
    size_t out_cap[DS4_DIST_IN_FLIGHT];
    dist_req out_req[DS4_DIST_IN_FLIGHT];
    uint32_t next_out;
} server;

static int recv_from(server *s, void *buf, size_t bytes, int from, int tag, ds4_err *err) {
    dist_req q = {0};
    if (dist_recv(s->d, buf, bytes, from, tag, &q) != 0) return ds4_err_set(err, DS4_EIO, "a receive failed");
    return dist_wait(s->d, &q, err);
}

static int send_ack(server *s, const ds4_err *failure) {
    dist_ack a = {.ok = failure == NULL};
    if (failure) snprintf(a.msg, sizeof(a.msg), "%s", ds4_err_msg(failure));
    dist_req q = {0};
    dist_send(s->d, &a, sizeof(a), 0, TAG_ACK, &q);
    return dist_wait(s->d, &q, NULL);
}

static int wait_outputs(server *s, ds4_err *err) {
    for (uint32_t i = 0; i < DS4_DIST_IN_FLIGHT; i++) {
        if (s->out_req[i].on && dist_wait(s->d, &s->out_req[i], err) != 0) return -1;
        if (s->pipe && !s->last && s->d->tr->pipe_wait(s->d, s->pipe, i, err) != 0) return -1;
    }
    return 0;
}

static void free_stage(server *s) {
    wait_outputs(s, NULL);
    for (uint32_t i = 1; i < s->n_seqs; i++) ds4_seq_free(s->b, s->seqs[i]);
    ds4_backend_free(s->b);
    s->b = NULL;
    s->d->tr->pipe_close(s->d, s->pipe);
    s->pipe = NULL;
    free(s->seqs);
    free(s->ctx);
    s->seqs = NULL, s->ctx = NULL, s->n_seqs = 0;
    free(s->rows), free(s->lrows), free(s->lg);
    s->rows = NULL, s->lrows = NULL, s->lg = NULL, s->lg_cap = 0;
    for (uint32_t i = 0; i < DS4_DIST_IN_FLIGHT; i++) free(s->out[i]), s->out[i] = NULL, s->out_cap[i] = 0;
}

/* The stage's backend, its pipe first (on a GPU its buffers are then out
 * of the backend's budget). */
static int make_stage(server *s, const dist_cmd *c, ds4_err *err) {
    free_stage(s);
    ds4_backend_opts o = {.n_threads = s->n_threads,
                          .ctx_size = c->arg[0],
                          .prefill_chunk = c->arg[1],
                          .no_sim = c->arg[2] != 0,
                          .cuda_graph_ctx = c->arg[3],
                          .gpu = s->d->gpu,
                          .layer_first = s->first,
                          .layer_end = s->end};
    size_t C = s->chunk = ds4_backend_opts_resolve(&o).prefill_chunk;
    if (s->d->tr->pipe_open(s->d, C * s->hcD, &s->pipe, err) != 0) return -1;
    if (!(s->b = ds4_backend_create(s->local, s->w, &o, err))) return -1;
    bool ok = (s->seqs = calloc(1, sizeof(ds4_seq *))) && (s->ctx = calloc(1, sizeof(uint32_t)));
    ok = ok && (s->rows = calloc(C, sizeof(dist_row))) && (s->lrows = calloc(C, sizeof(ds4_row)));
    if (!ok) return ds4_err_set(err, DS4_ENOMEM, "out of memory for a stage's buffers");
    s->seqs[0] = s->b->main;
    s->ctx[0] = s->b->opts.ctx_size;
    s->n_seqs = 1;
    return 0;
}

static ds4_seq *seq_of(server *s, uint32_t id, ds4_err *err) {
    if (!s->b || id >= s->n_seqs || !s->seqs[id]) {
        ds4_err_set(err, DS4_EINVAL, "rank 0 named sequence %u, which this rank does not hold", id);
        return NULL;
    }
    return s->seqs[id];
}

static int seq_new(server *s, uint32_t id, uint32_t ctx, ds4_err *err) {
    if (!s->b) return ds4_err_set(err, DS4_EINVAL, "a sequence before the stage's backend");
    if (id >= s->n_seqs) {
        ds4_seq **q = realloc(s->seqs, (id + 1) * sizeof(*q));
        if (q) s->seqs = q;
        uint32_t *x = q ? realloc(s->ctx, (id + 1) * sizeof(*x)) : NULL;
        if (x) s->ctx = x;
        if (!q || !x) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        for (uint32_t i = s->n_seqs; i <= id; i++) s->seqs[i] = NULL;
        s->n_seqs = id + 1;
    }
    if (s->seqs[id]) return ds4_err_set(err, DS4_EINVAL, "sequence %u is already held", id);
    s->ctx[id] = ctx;
    return (s->seqs[id] = ds4_seq_new(s->b, ctx, err)) ? 0 : -1;
}

/* One step: the rows from rank 0, the residuals from the stage before,
 * this stage, then the residuals on or the logits back. */
static int step(server *s, const dist_cmd *c, ds4_err *err) {
    ds4_dist *d = s->d;
    uint32_t n = c->n;
    if (!s->b || n == 0 || n > s->chunk) return ds4_err_set(err, DS4_EINVAL, "a step of %u rows", n);
    if (recv_from(s, s->rows, n * sizeof(dist_row), 0, TAG_ROWS, err) != 0) return -1;
    size_t floats = (size_t)n * s->hcD;
    if (d->tr->pipe_recv(d, s->pipe, floats, err) != 0) return -1;
    uint32_t nl = 0;
    for (uint32_t i = 0; i < n; i++) {
        ds4_seq *q = seq_of(s, s->rows[i].seq, err);
        if (!q) return -1;
        bool ret = s->rows[i].ret != RET_NONE;
        s->lrows[i] = ds4_row_of(q, s->rows[i].token, s->last && ret ? DS4_ROW_LOGITS : 0);
        nl += ret;
    }
    uint32_t k = s->next_out;
    s->next_out = (k + 1) % DS4_DIST_IN_FLIGHT;
    if (s->last) {
        if (s->out_req[k].on && dist_wait(d, &s->out_req[k], err) != 0) return -1;
        size_t ret_floats = dist_ret_floats(s->rows, n, s->n_vocab);
        if (dist_grow((void **)&s->lg, &s->lg_cap, (size_t)nl * s->n_vocab * 4, err) != 0 ||
            dist_grow(&s->out[k], &s->out_cap[k], ret_floats * 4, err) != 0)
            return -1;
        ds4_step_out out = {s->lg, NULL};
        if (ds4_backend_stage_step(s->b, s->lrows, n, s->pipe->in, NULL, &out, err) != 0) return -1;
        /* the rows' logits, or their argmax, in row order */
        float *o = s->out[k];
        const float *l = s->lg;
        for (uint32_t i = 0; i < n; i++) {
            if (s->rows[i].ret == RET_NONE) continue;
            if (s->rows[i].ret == RET_ARGMAX) {
                uint32_t a = (uint32_t)ds4_argmax(l, (int)s->n_vocab);
                memcpy(o++, &a, sizeof(a));
            } else {
                memcpy(o, l, s->n_vocab * sizeof(float));
                o += s->n_vocab;
            }
            l += s->n_vocab;
        }
        if (nl && dist_send(d, s->out[k], (size_t)(o - (float *)s->out[k]) * sizeof(float), 0, TAG_LOGITS,
                            &s->out_req[k]) != 0)
            return ds4_err_set(err, DS4_EIO, "sending the logits failed");
        return 0;
    }
    if (d->tr->pipe_wait(d, s->pipe, k, err) != 0 ||
        ds4_backend_stage_step(s->b, s->lrows, n, s->pipe->in, s->pipe->out[k], NULL, err) != 0)
        return -1;
    return d->tr->pipe_send(d, s->pipe, k, floats, err);
}

/* This rank's layers of a sequence, to rank 0. */
static int snapshot(server *s, const dist_cmd *c, ds4_err *err) {
    ds4_seq *q = seq_of(s, c->seq, err);
    if (!q) return -1;
    ds4_kv_state *st = ds4_kv_state_new_layers(&s->w->cfg, s->ctx[c->seq], s->chunk, s->first, s->end, err);
    if (!st) return -1;
    int rc = ds4_seq_snapshot(s->b, q, st, err);
    uint64_t bytes = ds4_kv_state_slice_bytes(st, st->n_tokens, s->first, s->end);
    void *buf = rc == 0 ? malloc(bytes ? bytes : 1) : NULL;
    if (rc == 0 && !buf) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory for a snapshot's slice");
    if (rc == 0) {
        ds4_kv_state_pack_layers(st, s->first, s->end, buf);
        dist_req r = {0};
        dist_send(s->d, buf, bytes, 0, TAG_SLICE, &r);
        rc = dist_wait(s->d, &r, err);
    }
    free(buf);
    ds4_kv_state_free(st);
    return rc;
}

/* A sequence's state from rank 0's tokens and this rank's layer slice. */
static int restore(server *s, const dist_cmd *c, ds4_err *err) {
    ds4_seq *q = seq_of(s, c->seq, err);
    if (!q) return -1;
    uint32_t n = c->n;
    ds4_kv_state *st = ds4_kv_state_new_layers(&s->w->cfg, s->ctx[c->seq], s->chunk, s->first, s->end, err);
    if (!st) return -1;
    int rc = 0;
    if (n > st->ctx) rc = ds4_err_set(err, DS4_ERANGE, "a restore of %u tokens into a context of %u", n, st->ctx);
    uint64_t bytes = ds4_kv_state_slice_bytes(st, n, s->first, s->end);
    void *buf = rc == 0 ? malloc(bytes ? bytes : 1) : NULL;
    if (rc == 0 && !buf) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory for a restore's slice");
    if (rc == 0)
        rc = recv_from(s, st->tokens, (size_t)n * sizeof(uint32_t), 0, TAG_TOKENS, err) ||
             recv_from(s, buf, bytes, 0, TAG_SLICE, err);
    if (rc == 0) {
        ds4_kv_state_unpack_layers(st, n, s->first, s->end, buf);
        st->n_tokens = n;
        st->has_logits = false; /* the last stage's logits live on rank 0 */
        rc = ds4_seq_restore(s->b, q, st, err);
    }
    free(buf);
    ds4_kv_state_free(st);
    return rc;
}

/* Commands until the end.  Errors of commands that acknowledge go back to
 * rank 0; any other fails the pipeline. */
static int serve(server *s, ds4_err *err) {
    for (;;) {
        dist_cmd c;
        if (recv_from(s, &c, sizeof(c), 0, TAG_CMD, err) != 0) return -1;
        ds4_err e = {0};
        int rc = 0;
        switch (c.op) {
        case CMD_CREATE:
            rc = make_stage(s, &c, &e);
            if (rc != 0) free_stage(s);
            send_ack(s, rc ? &e : NULL);
            continue;
        case CMD_SEQ_NEW:
            rc = seq_new(s, c.seq, c.arg[0], &e);
            send_ack(s, rc ? &e : NULL);
            continue;
        case CMD_FREE:
            free_stage(s);
            send_ack(s, NULL);
            continue;
        case CMD_SEQ_FREE:
            if (s->b && c.seq > 0 && c.seq < s->n_seqs) {
                ds4_seq_free(s->b, s->seqs[c.seq]);
                s->seqs[c.seq] = NULL;
            }
            continue;
        case CMD_RESET: {
            ds4_seq *q = seq_of(s, c.seq, &e);
            if (q) ds4_seq_reset(s->b, q);
            rc = q ? 0 : -1;
            break;
        }
        case CMD_STEP: rc = step(s, &c, &e); break;
        case CMD_SNAPSHOT: rc = wait_outputs(s, &e) || snapshot(s, &c, &e); break;
        case CMD_RESTORE: rc = wait_outputs(s, &e) || restore(s, &c, &e); break;
        case CMD_END: free_stage(s); return 0;
        default: rc = ds4_err_set(&e, DS4_EINVAL, "unknown command %u from rank 0", c.op);
        }
        if (rc != 0) {
            if (!ds4_dist_failed(s->d, NULL)) dist_fail(s->d, "%s", ds4_err_msg(&e)); /* rank 0 names this rank */
            return dist_failure(s->d, err);
        }
    }
}

int ds4_dist_serve(ds4_dist *d, const char *local, const ds4_weights *w, int n_threads, ds4_err *err) {
    server s = {.d = d, .local = local, .w = w, .n_threads = n_threads};
    ds4_dist_layers(d, &s.first, &s.end);
    s.last = d->rank == d->size - 1;
    s.hcD = w->cfg.n_hc * w->cfg.n_embd;
    s.n_vocab = w->cfg.n_vocab;
    int rc = serve(&s, err);
    free_stage(&s);
    return rc;
}

int ds4_dist_start(const char *prog, const char *model_path, const char *local, int n_threads, const ds4_dist_opts *o,
                   ds4_dist **d) {
    ds4_err err = {0};
    if (o && o->n_gpus) { /* the stages in this process, over its host's GPUs */
        int rc = 2;
        if (ds4_dist_launched())
            ds4_err_set(&err, DS4_EINVAL,
                        "--gpus runs one process over GPUs of its host: not under mpirun (there each rank is a "
                        "stage)");
        else rc = dist_local_open(o, local, model_path, n_threads, d, &err);
        if (rc == 0) return -1;
        fprintf(stderr, "%s: %s\n", prog, ds4_err_msg(&err));
        return rc;
    }
    if (ds4_dist_init(d, &err) != 0) {
        fprintf(stderr, "%s: %s\n", prog, ds4_err_msg(&err));
        return 1;
    }
    if (*d) (*d)->local = local; /* the plan says what it runs on and the memory it has */
    if (!*d || (*d)->rank == 0) return -1;
    ds4_weights *w = NULL;
    bool locked = ds4_instance_lock(&err) == 0; /* this rank's own lock file (dist_comm.c) */
    if (locked && !model_path)
        ds4_err_set(&err, DS4_EUNSUPPORTED, "a pipeline runs a model file (synthetic weights have no file to split)");
    else if (locked) w = ds4_weights_open(model_path, &err);
    int rc = 0;
    if (!w) {
        /* the others wait in the plan for this rank: end the job */
        fprintf(stderr, "%s: rank %d: %s\n", prog, (*d)->rank, ds4_err_msg(&err));
        fflush(stderr);
        (*d)->mpi.Abort((*d)->mpi.comm_world, 1);
        return 1;
    }
    uint32_t first, end;
    if (ds4_dist_plan(*d, prog, w, o, &err) == 0 && o && o->warm) {
        ds4_dist_layers(*d, &first, &end);
        if (o->warm(o->warm_ctx, w, first, end) != 0) dist_fail(*d, "reading the weights in failed (--warm-weights)");
    }
    if (!(*d)->planned || ds4_dist_serve(*d, local, w, n_threads, &err) != 0) {
        /* rank 0 says the plan's refusal; a failure names its rank */
        if ((*d)->planned) fprintf(stderr, "%s: rank %d: %s\n", prog, (*d)->rank, ds4_err_msg(&err));
        rc = 1;
    }
    ds4_dist_end(*d);
    *d = NULL;
    ds4_weights_close(w);
    return rc;
}
