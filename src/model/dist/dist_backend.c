/*
 * dist_backend.c - rank 0's side of the pipeline: a ds4_backend whose
 * calls run the first stage here and drive the other ranks (see dist.h).
 *
 * A step is "issued" - the first stage computed, the rows sent to every
 * rank, the residuals to rank 1, the receive of the logits posted - and
 * later "completed": the logits are in.  A single step completes at once;
 * a prefill issues chunk after chunk and completes each only when its
 * slot is needed again, so DS4_DIST_IN_FLIGHT chunks move down the
 * pipeline together while rank 0 computes the next.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rank.h"
#include "model/backends.h"
#include "model/dist/dist_internal.h"

/* A sequence of the pipeline: its id on every rank, the first stage's
 * sequence, and the logits the last stage sent back. */
typedef struct dist_seq {
    ds4_seq base;
    uint32_t id;
    uint32_t ctx;
    ds4_seq *local;
    float *logits;
    bool has_logits;
} dist_seq;

/* One issued step; slot k's residuals go from the pipe's out[k]. */
typedef struct dist_slot {
    bool busy;
    uint32_t n;
    size_t nret;                      /* floats the last rank returns */
    dist_cmd cmd;                     /* the step's command */
    dist_row *rows;                   /* chunk entries */
    float *ret;                       /* the logits (and argmaxes) received */
    size_t ret_cap;                   /* its bytes (grown to the largest answer) */
    uint32_t *argmax;                 /* where a RET_ARGMAX row's token goes */
    dist_req req[2 * DIST_MAX_RANKS]; /* the command and the rows to every rank */
    int nreq;
    dist_req ret_req;
    /* where the returned logits go: each row's destination (NULL: none),
     * and the sequence whose next-token logits the row's are */
    float **dst;
    dist_seq **seq_of;
} dist_slot;

typedef struct dist_backend {
    ds4_backend base;
    ds4_dist *d;
    ds4_backend *local; /* the first stage */
    uint32_t hcD, n_vocab, chunk;
    dist_pipe *pipe; /* the first stage's output on its way */
    dist_slot slots[DS4_DIST_IN_FLIGHT];
    uint32_t next_slot;
    uint32_t next_id;
    uint32_t *free_ids; /* ids given back, reused */
    uint32_t n_free, cap_free;
} dist_backend;

static dist_seq *dseq(ds4_seq *s) { return (dist_seq *)s; }

/* ---------------------------------------------------------- messages */

/* A command to every other rank, and each one's acknowledgement when it
 * has one to give (a backend or a sequence made). */
static int send_cmd(dist_backend *b, const dist_cmd *c, bool ack, ds4_err *err) {
    ds4_dist *d = b->d;
    if (ds4_dist_failed(d, err)) return -1;
    dist_req rq[DIST_MAX_RANKS] = {0};
    for (int r = 1; r < d->size; r++) dist_send(d, c, sizeof(*c), r, TAG_CMD, &rq[r - 1]);
    if (dist_wait_all(d, rq, d->size - 1, err) != 0) return -1;
    if (!ack) return 0;
    dist_ack *acks = calloc((size_t)d->size, sizeof(dist_ack));
    if (!acks) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (int r = 1; r < d->size; r++) dist_recv(d, &acks[r], sizeof(dist_ack), r, TAG_ACK, &rq[r - 1]);
    int rc = dist_wait_all(d, rq, d->size - 1, err);
    for (int r = 1; rc == 0 && r < d->size; r++)
        if (!acks[r].ok) {
            char name[128];
            acks[r].msg[DIST_MSG - 1] = 0;
            rc = ds4_err_set(err, DS4_EIO, "pipeline %s: %s", dist_peer_name(d, r, name, sizeof(name)), acks[r].msg);
        }
    free(acks);
    return rc;
}

/* ------------------------------------------------------------ sequences */

static void dist_seq_free(ds4_backend *base, ds4_seq *s);

static ds4_seq *seq_make(dist_backend *b, uint32_t ctx, bool main, ds4_err *err) {
    dist_seq *s = calloc(1, sizeof(*s));
    if (!s || !(s->logits = calloc(b->n_vocab, sizeof(float)))) {
        free(s);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    s->base.owner = &b->base;
    s->ctx = ctx;
    if (main) {
        s->id = 0;
        s->local = b->local->main;
        return &s->base;
    }
    s->id = b->n_free ? b->free_ids[--b->n_free] : b->next_id++;
    if (!(s->local = ds4_seq_new(b->local, ctx, err))) goto fail;
    dist_cmd c = {.op = CMD_SEQ_NEW, .seq = s->id, .arg = {ctx}};
    if (send_cmd(b, &c, true, err) != 0) goto fail;
    return &s->base;
fail:
    dist_seq_free(&b->base, &s->base);
    return NULL;
}

static ds4_seq *dist_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    return seq_make((dist_backend *)base, ctx, false, err);
}

static ds4_seq *dist_mtp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    (void)base, (void)ctx;
    ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline does not run the MTP block");
    return NULL;
}

static void dist_seq_free(ds4_backend *base, ds4_seq *seq) {
    dist_backend *b = (dist_backend *)base;
    dist_seq *s = dseq(seq);
    if (!s) return;
    if (s->id != 0) {
        if (s->local) {
            dist_cmd c = {.op = CMD_SEQ_FREE, .seq = s->id};
            send_cmd(b, &c, false, NULL);
            ds4_seq_free(b->local, s->local);
        }
        if (b->n_free == b->cap_free) {
            uint32_t cap = b->cap_free ? 2 * b->cap_free : 16;
            uint32_t *ids = realloc(b->free_ids, cap * sizeof(uint32_t));
            if (ids) b->free_ids = ids, b->cap_free = cap;
        }
        if (b->n_free < b->cap_free) b->free_ids[b->n_free++] = s->id;
    }
    free(s->logits);
    free(s);
}

static uint32_t dist_seq_len(const ds4_backend *base, const ds4_seq *s) {
    const dist_backend *b = (const dist_backend *)base;
    return ds4_seq_len(b->local, ((const dist_seq *)s)->local);
}

/* -------------------------------------------------------------- steps */

/* Wait for a slot's transfers and hand its logits out. */
static int complete(dist_backend *b, dist_slot *sl, ds4_err *err) {
    if (!sl->busy) return 0;
    sl->busy = false;
    int rc = dist_wait_all(b->d, sl->req, sl->nreq, err);
    if (sl->nret && rc == 0) rc = dist_wait(b->d, &sl->ret_req, err);
    else if (sl->ret_req.on) b->d->tr->cancel(b->d, &sl->ret_req); /* its buffer is the slot's */
    if (rc != 0) return -1;
    size_t V = b->n_vocab;
    const float *l = sl->ret;
    for (uint32_t i = 0; i < sl->n; i++) {
        if (sl->rows[i].ret == RET_ARGMAX) {
            memcpy(sl->argmax, l++, sizeof(uint32_t));
            if (sl->seq_of[i]) sl->seq_of[i]->has_logits = false; /* only their argmax came */
            continue;
        }
        if (sl->rows[i].ret != RET_LOGITS) continue;
        l += V;
        if (sl->dst[i]) memcpy(sl->dst[i], l - V, V * sizeof(float));
        if (sl->seq_of[i]) {
            memcpy(sl->seq_of[i]->logits, l - V, V * sizeof(float));
            sl->seq_of[i]->has_logits = true;
        }
    }
    return 0;
}

/* Every issued step, oldest first (a sequence's logits are its last
 * step's). */
static int complete_all(dist_backend *b, ds4_err *err) {
    int rc = 0;
    for (uint32_t i = 0; i < DS4_DIST_IN_FLIGHT; i++) {
        dist_slot *sl = &b->slots[(b->next_slot + i) % DS4_DIST_IN_FLIGHT];
        if (complete(b, sl, rc == 0 ? err : NULL) != 0) rc = -1;
    }
    return rc;
}

/* Run the first stage over rows and send the step on; the logits come
 * back into out->logits (rows asking) and each sequence's own when the
 * slot completes.  argmax (a one-row step): only the argmax of the row's
 * logits comes back, into *argmax. */
static int issue(dist_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, uint32_t *argmax,
                 ds4_err *err) {
    ds4_dist *d = b->d;
    if (ds4_dist_failed(d, err)) return -1;
    if (n > b->chunk) return ds4_err_set(err, DS4_ERANGE, "a step of %u rows exceeds the %u a pass holds", n, b->chunk);
    uint32_t k = b->next_slot;
    dist_slot *sl = &b->slots[k];
    b->next_slot = (k + 1) % DS4_DIST_IN_FLIGHT;
    if (complete(b, sl, err) != 0) return -1;
    ds4_row local[n];
    uint32_t nl = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!rows[i].seq || rows[i].seq->owner != &b->base)
            return ds4_err_set(err, DS4_EINVAL, "row %u: the sequence is not this backend's", i);
        if (rows[i].want & (DS4_ROW_HIDDEN | DS4_ROW_REWIND))
            return ds4_err_set(err, DS4_EUNSUPPORTED,
                               "row %u: a pipeline returns no final residuals and journals "
                               "no rows for a rewind",
                               i);
        dist_seq *s = dseq(rows[i].seq);
        bool last = i + 1 == n || rows[i + 1].seq != rows[i].seq;
        bool asks = (rows[i].want & DS4_ROW_LOGITS) && out && out->logits;
        local[i] = ds4_row_of(s->local, rows[i].token, 0);
        uint32_t ret = argmax ? RET_ARGMAX : asks || last ? RET_LOGITS : RET_NONE;
        sl->rows[i] = (dist_row){s->id, rows[i].token, ret};
        sl->dst[i] = asks ? out->logits + (size_t)nl++ * b->n_vocab : NULL;
        sl->seq_of[i] = last ? s : NULL;
    }
    sl->nret = dist_ret_floats(sl->rows, n, b->n_vocab);
    sl->argmax = argmax;
    if (dist_grow((void **)&sl->ret, &sl->ret_cap, sl->nret * sizeof(float), err) != 0) return -1;
    /* the first stage, into out[k] once its last send is gone: on failure
     * nothing was sent, the pipeline is intact */
    if (d->tr->pipe_wait(d, b->pipe, k, err) != 0 ||
        ds4_backend_stage_step(b->local, local, n, NULL, b->pipe->out[k], NULL, err) != 0)
        return -1;
    for (uint32_t i = 0; i < n; i++)
        if (sl->seq_of[i]) sl->seq_of[i]->has_logits = false;
    sl->n = n;
    sl->busy = true;
    sl->nreq = 0;
    sl->cmd = (dist_cmd){.op = CMD_STEP, .n = n};
    int rc = 0;
    for (int r = 1; r < d->size; r++) { /* the slot's buffers stay until it completes */
        rc |= dist_send(d, &sl->cmd, sizeof(sl->cmd), r, TAG_CMD, &sl->req[sl->nreq++]);
        rc |= dist_send(d, sl->rows, n * sizeof(dist_row), r, TAG_ROWS, &sl->req[sl->nreq++]);
    }
    ds4_err e = {0};
    if (rc != 0 || d->tr->pipe_send(d, b->pipe, k, (size_t)n * b->hcD, &e) != 0 ||
        (sl->nret && dist_recv(d, sl->ret, sl->nret * sizeof(float), d->size - 1, TAG_LOGITS, &sl->ret_req) != 0)) {
        /* part of the step went: the stages no longer agree */
        dist_fail(d, "rank 0: sending a step failed%s%s", e.msg[0] ? ": " : "", e.msg);
        return dist_failure(d, err);
    }
    return 0;
}

/* A step over several sequences (sessions batched together) goes as up to
 * one micro-step a stage, each a run of whole sequences: while the last
 * stage runs the first micro-step, the ones before it run the next ones,
 * so every stage works.  A row's result does not depend on the other rows
 * of its step, so the split changes no bit. */
static int dist_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    dist_backend *b = (dist_backend *)base;
    if (n == 0) return 0;
    uint32_t runs = 1;
    for (uint32_t i = 1; i < n; i++) runs += rows[i].seq != rows[i - 1].seq;
    uint32_t parts = runs < (uint32_t)b->d->size ? runs : (uint32_t)b->d->size;
    uint32_t start = 0, nl = 0;
    for (uint32_t p = 0; p < parts; p++) {
        uint32_t end = start + 1, target = p + 1 == parts ? n : (uint32_t)((uint64_t)n * (p + 1) / parts);
        while (end < n && (end < target || rows[end].seq == rows[end - 1].seq)) end++;
        ds4_step_out o = {out && out->logits ? out->logits + (size_t)nl * b->n_vocab : NULL, NULL};
        if (issue(b, rows + start, end - start, &o, NULL, err) != 0) {
            complete_all(b, NULL);
            return -1;
        }
        for (uint32_t i = start; i < end; i++) nl += (rows[i].want & DS4_ROW_LOGITS) != 0;
        start = end;
        if (start == n) break;
    }
    return complete_all(b, err);
}

/* Greedy decoding with the argmax taken on the last rank: 4 bytes come
 * back a token instead of the logits, which only the last step returns
 * (the sequence's logits after the last token, as the contract wants). */
static int dist_greedy(ds4_backend *base, ds4_seq *seq, uint32_t n, uint32_t *out, ds4_err *err) {
    dist_backend *b = (dist_backend *)base;
    dist_seq *s = dseq(seq);
    if (n == 0) return 0;
    if (!s->has_logits) return ds4_err_set(err, DS4_EINVAL, "greedy generation needs logits (prefill first)");
    uint32_t tok = (uint32_t)ds4_argmax(s->logits, (int)b->n_vocab);
    for (uint32_t i = 0; i < n; i++) {
        out[i] = tok;
        ds4_row row = ds4_row_of(seq, tok, 0);
        if (issue(b, &row, 1, NULL, i + 1 < n ? &tok : NULL, err) != 0 || complete_all(b, err) != 0) return -1;
    }
    return 0;
}

static int dist_mtp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    (void)base, (void)rows, (void)n, (void)out;
    return ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline does not run the MTP block");
}

/* Chunks issued one after another, DS4_DIST_IN_FLIGHT of them moving at
 * once. */
static int dist_prefill(ds4_backend *base, ds4_seq *seq, const uint32_t *tokens, uint32_t n, float *all_logits,
                        ds4_err *err) {
    dist_backend *b = (dist_backend *)base;
    dist_seq *s = dseq(seq);
    if ((uint64_t)ds4_seq_len(b->local, s->local) + n > s->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", n,
                           ds4_seq_len(b->local, s->local), s->ctx);
    ds4_row rows[b->chunk];
    for (uint32_t off = 0; off < n; off += b->chunk) {
        uint32_t T = n - off < b->chunk ? n - off : b->chunk;
        for (uint32_t t = 0; t < T; t++) rows[t] = ds4_row_of(seq, tokens[off + t], all_logits ? DS4_ROW_LOGITS : 0);
        ds4_step_out out = {all_logits ? all_logits + (size_t)off * b->n_vocab : NULL, NULL};
        if (issue(b, rows, T, &out, NULL, err) != 0) {
            complete_all(b, NULL);
            return -1;
        }
    }
    return complete_all(b, err);
}

static int dist_decode(ds4_backend *base, ds4_seq *s, uint32_t token, ds4_err *err) {
    ds4_row row = ds4_row_of(s, token, 0);
    return dist_step(base, &row, 1, NULL, err);
}

static const float *dist_logits(ds4_backend *base, ds4_seq *seq) {
    (void)base;
    dist_seq *s = dseq(seq);
    return s->has_logits ? s->logits : NULL;
}

static void dist_reset(ds4_backend *base, ds4_seq *seq) {
    dist_backend *b = (dist_backend *)base;
    dist_seq *s = dseq(seq);
    dist_cmd c = {.op = CMD_RESET, .seq = s->id};
    send_cmd(b, &c, false, NULL); /* a failure shows at the next call */
    ds4_seq_reset(b->local, s->local);
    s->has_logits = false;
}

static int dist_mark(ds4_backend *base, ds4_seq *s, ds4_err *err) {
    (void)base, (void)s;
    return ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline journals no rows for a rewind (MTP runs in one process)");
}

static int dist_rewind(ds4_backend *base, ds4_seq *s, uint32_t n, ds4_err *err) {
    (void)base, (void)s, (void)n;
    return ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline journals no rows for a rewind (MTP runs in one process)");
}

/* ---------------------------------------------------------- snapshots */

/* The first stage's layers from here, every other stage's slice from its
 * rank: one whole state, as one process holds it. */
static int dist_snapshot(ds4_backend *base, ds4_seq *seq, ds4_kv_state *out, ds4_err *err) {
    dist_backend *b = (dist_backend *)base;
    ds4_dist *d = b->d;
    dist_seq *s = dseq(seq);
    if (out->layer_first != 0 || out->layer_end != b->base.w->cfg.n_layer)
        return ds4_err_set(err, DS4_EINVAL, "a pipeline's snapshot goes to a whole state");
    if (ds4_seq_snapshot(b->local, s->local, out, err) != 0) return -1;
    uint32_t n = out->n_tokens;
    memcpy(out->logits, s->logits, b->n_vocab * sizeof(float));
    out->has_logits = s->has_logits;
    dist_cmd c = {.op = CMD_SNAPSHOT, .seq = s->id};
    if (send_cmd(b, &c, false, err) != 0) return -1;
    for (int r = 1; r < d->size; r++) {
        uint64_t bytes = ds4_kv_state_slice_bytes(out, n, d->first[r], d->end[r]);
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf) return ds4_err_set(err, DS4_ENOMEM, "out of memory for a snapshot's slice");
        dist_req q = {0};
        dist_recv(d, buf, bytes, r, TAG_SLICE, &q);
        int rc = dist_wait(d, &q, err);
        if (rc == 0) ds4_kv_state_unpack_layers(out, n, d->first[r], d->end[r], buf);
        free(buf);
        if (rc != 0) return -1;
    }
    return 0;
}

/* Every stage's slice of a whole state to its rank. */
static int dist_restore(ds4_backend *base, ds4_seq *seq, const ds4_kv_state *in, ds4_err *err) {
    dist_backend *b = (dist_backend *)base;
    ds4_dist *d = b->d;
    dist_seq *s = dseq(seq);
    if (in->layer_first != 0 || in->layer_end != b->base.w->cfg.n_layer)
        return ds4_err_set(err, DS4_EINVAL, "a pipeline restores a whole state");
    if (ds4_seq_restore(b->local, s->local, in, err) != 0) return -1;
    uint32_t n = in->n_tokens;
    dist_cmd c = {.op = CMD_RESTORE, .seq = s->id, .n = n};
    if (send_cmd(b, &c, false, err) != 0) return -1;
    for (int r = 1; r < d->size; r++) {
        uint64_t bytes = ds4_kv_state_slice_bytes(in, n, d->first[r], d->end[r]);
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf) return ds4_err_set(err, DS4_ENOMEM, "out of memory for a restore's slice");
        ds4_kv_state_pack_layers(in, d->first[r], d->end[r], buf);
        dist_req q[2] = {{0}};
        dist_send(d, in->tokens, (size_t)n * sizeof(uint32_t), r, TAG_TOKENS, &q[0]);
        dist_send(d, buf, bytes, r, TAG_SLICE, &q[1]);
        int rc = dist_wait_all(d, q, 2, err);
        free(buf);
        if (rc != 0) return -1;
    }
    memcpy(s->logits, in->logits, b->n_vocab * sizeof(float));
    s->has_logits = in->has_logits;
    return 0;
}

/* ------------------------------------------------------------ backend */

static void free_slots(dist_backend *b) {
    for (uint32_t i = 0; i < DS4_DIST_IN_FLIGHT; i++) {
        dist_slot *sl = &b->slots[i];
        free(sl->rows);
        free(sl->ret);
        free(sl->dst);
        free(sl->seq_of);
    }
}

/* Every other stage's backend freed, and acknowledged: once the pipeline
 * is freed no stage touches the weights, which the program may close (the
 * stages in this process share them).  After a failure the stages stop
 * by themselves. */
static void free_stages(dist_backend *b) {
    dist_cmd c = {.op = CMD_FREE};
    if (send_cmd(b, &c, true, NULL) != 0) b->d->tr->settle(b->d);
}

static void dist_free(ds4_backend *base) {
    dist_backend *b = (dist_backend *)base;
    if (!b) return;
    complete_all(b, NULL);
    if (b->base.main) dist_seq_free(base, b->base.main);
    if (b->local) free_stages(b);
    ds4_backend_free(b->local);
    b->d->tr->pipe_close(b->d, b->pipe);
    free_slots(b);
    free(b->free_ids);
    free(b);
}

static const ds4_backend_ops dist_ops = {
    .name = "pipeline",
    .free = dist_free,
    .seq_new = dist_seq_new,
    .mtp_seq_new = dist_mtp_seq_new,
    .seq_free = dist_seq_free,
    .seq_len = dist_seq_len,
    .step = dist_step,
    .mtp_step = dist_mtp_step,
    .mark = dist_mark,
    .rewind = dist_rewind,
    .prefill = dist_prefill,
    .decode = dist_decode,
    .logits = dist_logits,
    .reset = dist_reset,
    .snapshot = dist_snapshot,
    .restore = dist_restore,
    .greedy = dist_greedy,
};

/* The slots' buffers, and the pipe (before the first stage's backend:
 * on a GPU its buffers are then out of the backend's budget). */
static int alloc_slots(dist_backend *b, ds4_err *err) {
    size_t C = b->chunk;
    for (uint32_t i = 0; i < DS4_DIST_IN_FLIGHT; i++) {
        dist_slot *sl = &b->slots[i];
        sl->rows = calloc(C, sizeof(dist_row));
        sl->dst = calloc(C, sizeof(float *));
        sl->seq_of = calloc(C, sizeof(dist_seq *));
        if (!sl->rows || !sl->dst || !sl->seq_of)
            return ds4_err_set(err, DS4_ENOMEM, "out of memory for the pipeline's buffers (%zu-token chunks)", C);
    }
    return b->d->tr->pipe_open(b->d, C * b->hcD, &b->pipe, err);
}

ds4_backend *ds4_dist_backend_create(ds4_dist *d, const char *local, const ds4_weights *w, const ds4_backend_opts *opts,
                                     ds4_err *err) {
    if (!d || d->rank != 0 || !d->planned) {
        ds4_err_set(err, DS4_EINVAL, "the pipeline backend is rank 0's, after the stages are set");
        return NULL;
    }
    if (opts && opts->mtp) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline does not run the MTP block (--mtp needs one process)");
        return NULL;
    }
    if (opts && opts->imatrix) {
        ds4_err_set(err, DS4_EUNSUPPORTED,
                    "a pipeline does not collect an importance matrix (the imatrix runs in one process)");
        return NULL;
    }
    if (opts && (opts->steer || opts->act_observer)) {
        ds4_err_set(err, DS4_EUNSUPPORTED,
                    "a pipeline does not steer or observe activations (--dir-steering-file and ds4-direction need "
                    "one process)");
        return NULL;
    }
    dist_backend *b = calloc(1, sizeof(*b));
    if (!b) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    b->base.ops = &dist_ops;
    b->base.w = w;
    b->base.opts = ds4_backend_opts_resolve(opts);
    b->base.opts.main_ctx = b->base.opts.ctx_size; /* its sequences keep their size (no seq_resize) */
    b->d = d;
    b->hcD = w->cfg.n_hc * w->cfg.n_embd;
    b->n_vocab = w->cfg.n_vocab;
    b->chunk = b->base.opts.prefill_chunk;
    b->next_id = 1;
    ds4_backend_opts lo = b->base.opts;
    lo.layer_first = d->first[0];
    lo.layer_end = d->end[0];
    lo.gpu = d->gpu;
    if (alloc_slots(b, err) != 0) {
        d->tr->pipe_close(d, b->pipe);
        free_slots(b);
        free(b);
        return NULL;
    }
    dist_cmd c = {.op = CMD_CREATE, .arg = {lo.ctx_size, lo.prefill_chunk, lo.no_sim, lo.cuda_graph_ctx}};
    if (send_cmd(b, &c, true, err) != 0 || !(b->local = ds4_backend_create(local, w, &lo, err))) {
        free_stages(b); /* the ranks that made theirs free them */
        d->tr->pipe_close(d, b->pipe);
        free_slots(b);
        free(b);
        return NULL;
    }
    b->base.opts.n_threads = b->local->opts.n_threads;
    char line[512];
    size_t o = (size_t)snprintf(line, sizeof(line), "pipeline: a sequence of %u tokens keeps", lo.ctx_size);
    for (int r = 0; r < d->size && o < sizeof(line); r++) {
        double mib = (double)ds4_kv_state_bytes_layers(&w->cfg, lo.ctx_size, d->first[r], d->end[r]) / (1u << 20);
        o += (size_t)snprintf(line + o, sizeof(line) - o, "%s %.1f MiB on %s %d", r ? "," : "", mib,
                              d->loc ? "GPU" : "rank", d->loc ? dist_local_gpu(d, r) : r);
    }
    fprintf(stderr, "%s: %s\n", d->prog ? d->prog : "ds4", line);
    if (!(b->base.main = seq_make(b, b->base.opts.ctx_size, true, err))) {
        dist_free(&b->base);
        return NULL;
    }
    return &b->base;
}
