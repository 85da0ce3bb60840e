/*
 * dist_local.c - the in-process transport (see dist_internal.h): a
 * pipeline whose stages are threads of one program over GPUs of its host
 * (--gpus), driven by the protocol of the MPI ranks.
 *
 * Stage r runs on GPU gpus[r]: stage 0 in the program's thread (its
 * backend is the pipeline's, dist_backend.c), the others each in a thread
 * of its own serving rank 0's commands (dist_serve.c).  Every stage sees
 * the job through its own ds4_dist (its rank, its GPU); they share the
 * job below and stage 0's failure.
 *
 * Messages go by memory: a send copies into the receiving rank's posted
 * receive, or into its inbox until one is posted (in order per sender and
 * tag, as MPI matches them), and is done at once.  The residuals go from
 * GPU to GPU by NCCL (model/backends.h, ds4_cuda_pipe_*): stage r
 * receives from r - 1 and sends to r + 1 on a stream of its own, and the
 * waits poll the transfers so that they give up when a stage has failed -
 * which aborts NCCL's communicators at once, ending every transfer still
 * waiting.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backends.h"
#include "model/dist/dist_internal.h"

#if DS4_CUDA

static const dist_transport dist_local_transport;

/* A message waiting for its receive. */
typedef struct dist_mail {
    struct dist_mail *next;
    int from, tag;
    size_t bytes;
    unsigned char data[];
} dist_mail;

/* A rank's incoming messages and posted receives, oldest first. */
typedef struct dist_box {
    dist_mail *mail, *mail_tail;
    dist_req *posted, *posted_tail;
} dist_box;

typedef struct dist_local {
    int n;
    int gpus[DS4_DIST_MAX_GPUS];
    pthread_mutex_t mu; /* the boxes */
    dist_box box[DS4_DIST_MAX_GPUS];
    ds4_dist *views[DS4_DIST_MAX_GPUS]; /* views[0]: the program's */
    pthread_t threads[DS4_DIST_MAX_GPUS];
    bool started[DS4_DIST_MAX_GPUS];
    struct ds4_cuda_clique *clique;
    /* what the stages' threads serve with */
    const ds4_weights *w;
    const char *local;
    int n_threads;
} dist_local;

int dist_local_gpu(const ds4_dist *d, int r) { return d->loc->gpus[r]; }

/* ------------------------------------------------------------ messages */

static int local_send(ds4_dist *d, const void *buf, size_t bytes, int to, int tag, dist_req *r) {
    dist_local *L = d->loc;
    dist_box *b = &L->box[to];
    r->on = false; /* copied now */
    pthread_mutex_lock(&L->mu);
    dist_req *q = b->posted, *prev = NULL;
    while (q && (q->from != d->rank || q->tag != tag)) prev = q, q = q->next;
    if (q) { /* the oldest receive that takes it */
        if (bytes > q->bytes) q->truncated = true;
        else memcpy(q->buf, buf, bytes);
        q->got = true;
        if (prev) prev->next = q->next;
        else b->posted = q->next;
        if (b->posted_tail == q) b->posted_tail = prev;
        pthread_mutex_unlock(&L->mu);
        return 0;
    }
    dist_mail *m = malloc(sizeof(*m) + bytes);
    if (m) {
        *m = (dist_mail){NULL, d->rank, tag, bytes};
        memcpy(m->data, buf, bytes);
        if (b->mail_tail) b->mail_tail->next = m;
        else b->mail = m;
        b->mail_tail = m;
    }
    pthread_mutex_unlock(&L->mu);
    return m ? 0 : -1;
}

static int local_recv(ds4_dist *d, void *buf, size_t bytes, int from, int tag, dist_req *r) {
    dist_local *L = d->loc;
    dist_box *b = &L->box[d->rank];
    *r = (dist_req){.on = true, .buf = buf, .bytes = bytes, .from = from, .tag = tag};
    pthread_mutex_lock(&L->mu);
    dist_mail *m = b->mail, *prev = NULL;
    while (m && (m->from != from || m->tag != tag)) prev = m, m = m->next;
    if (m) { /* the oldest message it takes */
        if (m->bytes > bytes) r->truncated = true;
        else memcpy(buf, m->data, m->bytes);
        r->got = true;
        if (prev) prev->next = m->next;
        else b->mail = m->next;
        if (b->mail_tail == m) b->mail_tail = prev;
        free(m);
    } else {
        if (b->posted_tail) b->posted_tail->next = r;
        else b->posted = r;
        b->posted_tail = r;
    }
    pthread_mutex_unlock(&L->mu);
    return 0;
}

static int local_test(ds4_dist *d, dist_req *r, bool *done) {
    pthread_mutex_lock(&d->loc->mu);
    *done = r->got;
    bool bad = r->got && r->truncated;
    pthread_mutex_unlock(&d->loc->mu);
    if (*done) r->on = false;
    return bad ? -1 : 0;
}

/* A receive given up: out of its rank's posted list. */
static void local_cancel(ds4_dist *d, dist_req *r) {
    dist_local *L = d->loc;
    dist_box *b = &L->box[d->rank];
    pthread_mutex_lock(&L->mu);
    dist_req *q = b->posted, *prev = NULL;
    while (q && q != r) prev = q, q = q->next;
    if (q) {
        if (prev) prev->next = q->next;
        else b->posted = q->next;
        if (b->posted_tail == q) b->posted_tail = prev;
    }
    r->on = false;
    pthread_mutex_unlock(&L->mu);
}

/* A stage's failure is the job's: named after the stage (stage 0's own
 * errors need no name: they are the program's), and NCCL's transfers
 * aborted so that no wait hangs on one. */
static void local_fail(ds4_dist *d, const char *why) {
    char named[1024], name[64];
    if (d->rank > 0)
        snprintf(named, sizeof(named), "%s failed: %s", dist_peer_name(d, d->rank, name, sizeof(name)), why);
    else snprintf(named, sizeof(named), "%s", why);
    if (dist_set_failed(d, named)) ds4_cuda_clique_abort(d->loc->clique);
}

/* --------------------------------------------------------------- pipes */

typedef struct gpu_done {
    dist_pipe *p;
    int k; /* -1: the receive */
} gpu_done;

static int gpu_done_poll(void *ctx, ds4_err *err) {
    gpu_done *g = ctx;
    return g->k < 0 ? ds4_cuda_pipe_recv_done(g->p->gpu, err) : ds4_cuda_pipe_send_done(g->p->gpu, (uint32_t)g->k, err);
}

static void local_pipe_close(ds4_dist *d, dist_pipe *p) {
    if (!p) return;
    for (uint32_t k = 0; p->gpu && k < DS4_DIST_IN_FLIGHT; k++) {
        gpu_done g = {p, (int)k};
        dist_wait_until(d, gpu_done_poll, &g, NULL);
    }
    /* after a failure the transfers end by the abort, which the failing
     * stage may not have made yet: made here (once), before their memory goes */
    if (atomic_load(&d->job->failed)) ds4_cuda_clique_abort(d->loc->clique);
    ds4_cuda_pipe_close(p->gpu);
    free(p);
}

static int local_pipe_open(ds4_dist *d, size_t floats, dist_pipe **out, ds4_err *err) {
    *out = NULL;
    dist_pipe *p = calloc(1, sizeof(*p));
    if (!p) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->cap = floats;
    if (ds4_cuda_pipe_open(d->loc->clique, d->rank, floats, DS4_DIST_IN_FLIGHT, &p->gpu, err) != 0) {
        free(p);
        return -1;
    }
    p->in = ds4_cuda_pipe_in(p->gpu);
    for (uint32_t k = 0; k < DS4_DIST_IN_FLIGHT; k++) p->out[k] = ds4_cuda_pipe_out(p->gpu, k);
    *out = p;
    return 0;
}

static int local_pipe_recv(ds4_dist *d, dist_pipe *p, size_t floats, ds4_err *err) {
    gpu_done g = {p, -1};
    ds4_err e = {0};
    if (ds4_cuda_pipe_recv(p->gpu, floats, &e) != 0) {
        dist_fail(d, "%s", ds4_err_msg(&e));
        return dist_failure(d, err);
    }
    return dist_wait_until(d, gpu_done_poll, &g, err);
}

static int local_pipe_send(ds4_dist *d, dist_pipe *p, uint32_t k, size_t floats, ds4_err *err) {
    ds4_err e = {0};
    if (ds4_cuda_pipe_send(p->gpu, k, floats, &e) == 0) return 0;
    dist_fail(d, "%s", ds4_err_msg(&e));
    return dist_failure(d, err);
}

static int local_pipe_wait(ds4_dist *d, dist_pipe *p, uint32_t k, ds4_err *err) {
    gpu_done g = {p, (int)k};
    return dist_wait_until(d, gpu_done_poll, &g, err);
}

/* ------------------------------------------------------- the stages */

/* A stage's thread: its commands until the end (or the failure, which
 * names it). */
static void *stage_main(void *arg) {
    ds4_dist *d = arg;
    dist_local *L = d->loc;
    ds4_err err = {0};
    ds4_dist_serve(d, L->local, L->w, L->n_threads, &err);
    return NULL;
}

/* After the plan: every stage's view knows the split; each stage after
 * the first reads its weights in (--warm-weights), then serves in its
 * thread. */
static int local_start(ds4_dist *d, const ds4_weights *w, const ds4_dist_opts *o, ds4_err *err) {
    dist_local *L = d->loc;
    L->w = w;
    for (int r = 1; r < L->n; r++) {
        ds4_dist *v = L->views[r];
        v->peers = d->peers, v->first = d->first, v->end = d->end;
        v->dtype = d->dtype, v->timeout_s = d->timeout_s, v->prog = d->prog;
        v->planned = v->plan_tried = true;
    }
    for (int r = 1; r < L->n; r++)
        if (o && o->warm && o->warm(o->warm_ctx, w, d->first[r], d->end[r]) != 0)
            return ds4_err_set(err, DS4_EIO, "reading stage %d's weights in failed (--warm-weights)", r);
    for (int r = 1; r < L->n; r++) {
        if (pthread_create(&L->threads[r], NULL, stage_main, L->views[r]) != 0) {
            dist_fail(d, "cannot start the thread of stage %d", r);
            return dist_failure(d, err);
        }
        L->started[r] = true;
    }
    return 0;
}

/* The stages' threads end after a failure (their waits see it). */
static void join_stages(dist_local *L) {
    for (int r = 1; r < L->n; r++)
        if (L->started[r]) pthread_join(L->threads[r], NULL), L->started[r] = false;
}

static void local_settle(ds4_dist *d) {
    if (atomic_load(&d->job->failed)) join_stages(d->loc);
}

static void free_job(dist_local *L) {
    for (int r = 0; r < L->n; r++) {
        for (dist_mail *m = L->box[r].mail, *next; m; m = next) next = m->next, free(m);
        ds4_dist *v = L->views[r];
        if (!v) continue;
        if (r == 0) free(v->peers), free(v->first), free(v->end); /* the plan's, which the others share */
        pthread_mutex_destroy(&v->mu);
        free(v);
    }
    ds4_cuda_clique_close(L->clique);
    pthread_mutex_destroy(&L->mu);
    free(L);
}

/* Stage 0 (the program) leaves: the stages are told to end, or after a
 * failure stop by themselves (their waits see it; NCCL was aborted); then
 * the communicators and the views go. */
static void local_end(ds4_dist *d) {
    dist_local *L = d->loc;
    if (d->planned && !atomic_load(&d->failed)) {
        dist_cmd c = {.op = CMD_END};
        dist_req rq[DS4_DIST_MAX_GPUS] = {{0}};
        for (int r = 1; r < L->n; r++) local_send(d, &c, sizeof(c), r, TAG_CMD, &rq[r - 1]);
    }
    join_stages(L);
    free_job(L);
}

static const dist_transport dist_local_transport = {
    .send = local_send,
    .recv = local_recv,
    .test = local_test,
    .cancel = local_cancel,
    .fail = local_fail,
    .start = local_start,
    .settle = local_settle,
    .end = local_end,
    .pipe_open = local_pipe_open,
    .pipe_close = local_pipe_close,
    .pipe_recv = local_pipe_recv,
    .pipe_send = local_pipe_send,
    .pipe_wait = local_pipe_wait,
};

/* ------------------------------------------------------------- opening */

static ds4_dist *new_view(dist_local *L, int r, ds4_dist *job) {
    ds4_dist *v = calloc(1, sizeof(*v));
    if (!v) return NULL;
    v->tr = &dist_local_transport;
    v->loc = L;
    v->rank = r;
    v->size = L->n;
    v->gpu = L->gpus[r];
    v->timeout_s = DS4_DIST_TIMEOUT_DEFAULT;
    v->job = job ? job : v;
    v->local = L->local;
    pthread_mutex_init(&v->mu, NULL);
    return v;
}

int dist_local_open(const ds4_dist_opts *o, const char *local, const char *model_path, int n_threads, ds4_dist **d,
                    ds4_err *err) {
    *d = NULL;
    if (local && strcmp(local, "cuda") != 0) {
        ds4_err_set(err, DS4_EINVAL, "--gpus runs the stages on the CUDA backend, not --backend %s", local);
        return 2;
    }
    if (!model_path) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline runs a model file (synthetic weights have no file to split)");
        return 1;
    }
    dist_local *L = calloc(1, sizeof(*L));
    if (!L) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return 1;
    }
    pthread_mutex_init(&L->mu, NULL);
    L->n = o->n_gpus;
    memcpy(L->gpus, o->gpus, (size_t)L->n * sizeof(int));
    L->local = "cuda";
    L->n_threads = n_threads;
    for (int r = 0; r < L->n; r++)
        if (!(L->views[r] = new_view(L, r, L->views[0]))) {
            free_job(L);
            ds4_err_set(err, DS4_ENOMEM, "out of memory");
            return 1;
        }
    if (ds4_cuda_clique_open(L->gpus, L->n, &L->clique, err) != 0) {
        free_job(L);
        return 1;
    }
    *d = L->views[0];
    return 0;
}

#else /* a CPU build */

int dist_local_gpu(const ds4_dist *d, int r) {
    (void)d;
    return r;
}

int dist_local_open(const ds4_dist_opts *o, const char *local, const char *model_path, int n_threads, ds4_dist **d,
                    ds4_err *err) {
    (void)o, (void)local, (void)model_path, (void)n_threads;
    *d = NULL;
    ds4_err_set(err, DS4_EUNSUPPORTED,
                "--gpus runs the stages on GPUs: this is a CPU build (build it with `make cuda`)");
    return 2;
}

#endif
