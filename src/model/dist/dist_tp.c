/*
 * dist_tp.c - tensor parallelism over the GPUs of one host
 * (--tensor-parallel N, docs/DISTRIBUTED.md 7): one ds4_backend made of N
 * CUDA backends, rank r on GPU r holding its share of every layer
 * (src/model/cuda/cuda_tp.cu), each driven by a thread of its own.
 *
 * Every call of the interface is made by every rank at once - rank 0 in
 * the caller's thread, the others in theirs - with the same arguments
 * but each rank's own sequences: their passes meet in the same NCCL
 * all-reduces, two a layer, and leave the same state on every rank (the
 * KV, the positions, the logits).  What comes back is rank 0's: the
 * logits, the snapshot, the greedy tokens; the other ranks' go to scratch
 * memory.  A pass that fails on one rank would leave the others waiting
 * in an all-reduce: the communicators are aborted at the first failure,
 * which ends those waits, and the group stays failed - every later pass
 * returns that first error.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backends.h"
#include "model/dist/dist.h"

#if DS4_CUDA

/* A sequence of the group: one of each rank's backend. */
typedef struct tp_seq {
    ds4_seq base;
    ds4_seq *r[DS4_DIST_MAX_GPUS];
} tp_seq;

typedef struct tp_backend tp_backend;

/* A call made by every rank: rank r's part of it. */
typedef int (*tp_fn)(tp_backend *t, uint32_t r, void *arg, ds4_err *err);

/* Host memory a rank other than 0 writes what only rank 0's caller reads. */
typedef struct tp_scratch {
    void *p;
    size_t bytes;
} tp_scratch;

struct tp_backend {
    ds4_backend base;
    uint32_t n;
    ds4_backend *rank[DS4_DIST_MAX_GPUS];
    ds4_cuda_clique *clique;
    tp_seq main;
    tp_scratch scratch[DS4_DIST_MAX_GPUS];
    /* the ranks' threads (1 .. n - 1) and the call they make */
    pthread_t thread[DS4_DIST_MAX_GPUS];
    bool started[DS4_DIST_MAX_GPUS];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t calls;                      /* issued */
    uint64_t served[DS4_DIST_MAX_GPUS]; /* made, by rank */
    tp_fn fn;
    void *arg;
    bool passes; /* the call runs passes: a failure aborts the communicators */
    bool quit;
    int rc[DS4_DIST_MAX_GPUS];
    ds4_err err[DS4_DIST_MAX_GPUS];
    int first_failed; /* the rank that failed first in this call, or -1 */
    bool broken;      /* a pass failed: the communicators are aborted */
    ds4_err broke;    /* why */
};

/* ------------------------------------------------------------- calls */

/* Rank r's part of the current call; its failure recorded (the first of
 * the call's names the call's error) and, in a pass, the communicators
 * aborted so that no other rank waits for it. */
static void run_part(tp_backend *t, uint32_t r) {
    ds4_err_clear(&t->err[r]);
    t->rc[r] = t->fn(t, r, t->arg, &t->err[r]);
    if (t->rc[r] == 0) return;
    pthread_mutex_lock(&t->mu);
    if (t->first_failed < 0) t->first_failed = (int)r;
    bool abort = t->passes && !t->broken;
    if (abort) {
        t->broken = true;
        ds4_err_set(&t->broke, t->err[r].code, "GPU %u: %s", r, ds4_err_msg(&t->err[r]));
    }
    pthread_mutex_unlock(&t->mu);
    if (abort) ds4_cuda_clique_abort(t->clique);
}

/* A rank's thread: its part of every call until the group ends. */
typedef struct tp_thread_arg {
    tp_backend *t;
    uint32_t r;
} tp_thread_arg;

static void *serve(void *p) {
    tp_thread_arg a = *(tp_thread_arg *)p;
    free(p);
    tp_backend *t = a.t;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        while (!t->quit && t->served[a.r] == t->calls) pthread_cond_wait(&t->go, &t->mu);
        bool quit = t->quit;
        pthread_mutex_unlock(&t->mu);
        if (quit) return NULL;
        run_part(t, a.r);
        pthread_mutex_lock(&t->mu);
        t->served[a.r] = t->calls;
        pthread_cond_broadcast(&t->done);
        pthread_mutex_unlock(&t->mu);
    }
}

/* fn made by every rank (passes: it runs forward passes); 0, or -1 with
 * the first failing rank's error. */
static int run_all(tp_backend *t, tp_fn fn, void *arg, bool passes, ds4_err *err) {
    if (passes && t->broken) {
        if (err) *err = t->broke;
        return ds4_err_prefix(err, "the tensor-parallel group failed earlier");
    }
    pthread_mutex_lock(&t->mu);
    t->fn = fn;
    t->arg = arg;
    t->passes = passes;
    t->first_failed = -1;
    t->calls++;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    run_part(t, 0);
    pthread_mutex_lock(&t->mu);
    for (uint32_t r = 1; r < t->n; r++)
        while (t->started[r] && t->served[r] != t->calls) pthread_cond_wait(&t->done, &t->mu);
    int failed = t->first_failed;
    pthread_mutex_unlock(&t->mu);
    if (failed < 0) return 0;
    if (err) *err = t->err[failed];
    return failed == 0 ? -1 : ds4_err_prefix(err, "GPU %d", failed);
}

/* Rank r's scratch of at least `bytes` (NULL: out of memory). */
static void *scratch(tp_backend *t, uint32_t r, size_t bytes) {
    tp_scratch *s = &t->scratch[r];
    if (s->bytes < bytes) {
        void *p = realloc(s->p, bytes);
        if (!p) return NULL;
        s->p = p;
        s->bytes = bytes;
    }
    return s->p;
}

/* Rank r's sequence of s, with s's steering scales. */
static ds4_seq *rank_seq(ds4_seq *s, uint32_t r) {
    if (!s) return NULL;
    ds4_seq *q = ((tp_seq *)s)->r[r];
    ds4_seq_set_steering(q, s->steer_ffn, s->steer_attn);
    return q;
}

/* --------------------------------------------------------- sequences */

typedef struct seq_call {
    tp_seq *s;
    uint32_t ctx, n;
    const uint32_t *tokens;
    float *logits;
    uint32_t *out;
    ds4_kv_state *state;
    const ds4_kv_state *in;
} seq_call;

static int part_seq_new(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    return (c->s->r[r] = ds4_seq_new(t->rank[r], c->ctx, err)) ? 0 : -1;
}

static void free_parts(tp_backend *t, tp_seq *s) {
    for (uint32_t r = 0; r < t->n; r++)
        if (s->r[r]) ds4_seq_free(t->rank[r], s->r[r]);
}

static ds4_seq *tp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    tp_backend *t = (tp_backend *)base;
    tp_seq *s = calloc(1, sizeof(*s));
    if (!s) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    s->base.owner = base;
    seq_call c = {.s = s, .ctx = ctx};
    if (run_all(t, part_seq_new, &c, false, err) != 0) {
        free_parts(t, s);
        free(s);
        return NULL;
    }
    return &s->base;
}

static int part_seq_free(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    (void)err;
    ds4_seq_free(t->rank[r], ((seq_call *)arg)->s->r[r]);
    return 0;
}

static void tp_seq_free(ds4_backend *base, ds4_seq *seq) {
    tp_backend *t = (tp_backend *)base;
    seq_call c = {.s = (tp_seq *)seq};
    run_all(t, part_seq_free, &c, false, NULL);
    free(seq);
}

static int part_seq_resize(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    return ds4_seq_resize(t->rank[r], c->s->r[r], c->ctx, err);
}

static int tp_seq_resize(ds4_backend *base, ds4_seq *s, uint32_t ctx, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .ctx = ctx};
    return run_all((tp_backend *)base, part_seq_resize, &c, false, err);
}

static uint32_t tp_seq_len(const ds4_backend *base, const ds4_seq *s) {
    const tp_backend *t = (const tp_backend *)base;
    return ds4_seq_len(t->rank[0], ((const tp_seq *)s)->r[0]);
}

static int part_mark(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    return ds4_backend_mark(t->rank[r], ((seq_call *)arg)->s->r[r], err);
}

static int tp_mark(ds4_backend *base, ds4_seq *s, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s};
    return run_all((tp_backend *)base, part_mark, &c, false, err);
}

static int part_rewind(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    return ds4_backend_rewind(t->rank[r], c->s->r[r], c->n, err);
}

static int tp_rewind(ds4_backend *base, ds4_seq *s, uint32_t n_tokens, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .n = n_tokens};
    return run_all((tp_backend *)base, part_rewind, &c, false, err);
}

static int part_reset(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    (void)err;
    ds4_seq_reset(t->rank[r], ((seq_call *)arg)->s->r[r]);
    return 0;
}

static void tp_reset(ds4_backend *base, ds4_seq *s) {
    seq_call c = {.s = (tp_seq *)s};
    run_all((tp_backend *)base, part_reset, &c, false, NULL);
}

/* ------------------------------------------------------------ passes */

static int part_prefill(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    return ds4_seq_prefill(t->rank[r], rank_seq(&c->s->base, r), c->tokens, c->n, r == 0 ? c->logits : NULL, err);
}

static int tp_prefill(ds4_backend *base, ds4_seq *s, const uint32_t *tokens, uint32_t n, float *all_logits,
                      ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .n = n, .tokens = tokens, .logits = all_logits};
    return run_all((tp_backend *)base, part_prefill, &c, true, err);
}

static int part_decode(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    return ds4_seq_decode(t->rank[r], rank_seq(&c->s->base, r), c->n, err);
}

static int tp_decode(ds4_backend *base, ds4_seq *s, uint32_t token, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .n = token};
    return run_all((tp_backend *)base, part_decode, &c, true, err);
}

static int part_greedy(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    uint32_t *out = r == 0 ? c->out : scratch(t, r, (size_t)c->n * sizeof(uint32_t));
    if (!out) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return ds4_seq_greedy(t->rank[r], rank_seq(&c->s->base, r), c->n, out, err);
}

static int tp_greedy(ds4_backend *base, ds4_seq *s, uint32_t n, uint32_t *out, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .n = n, .out = out};
    return run_all((tp_backend *)base, part_greedy, &c, true, err);
}

typedef struct step_call {
    const ds4_row *rows;
    uint32_t n;
    const ds4_step_out *out;
    size_t logit_floats, hidden_floats; /* what out holds */
} step_call;

/* Rank r's rows (its sequences) and outputs (rank 0: the caller's). */
static int part_step(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    step_call *c = arg;
    ds4_row *rows = malloc((size_t)c->n * sizeof(*rows));
    if (!rows) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < c->n; i++) {
        rows[i] = c->rows[i];
        rows[i].seq = rank_seq(c->rows[i].seq, r);
        rows[i].hseq = rank_seq(c->rows[i].hseq, r);
    }
    ds4_step_out out = {NULL, NULL};
    const ds4_step_out *o = c->out;
    if (o && r > 0) {
        float *s = scratch(t, r, (c->logit_floats + c->hidden_floats) * sizeof(float));
        if (!s) {
            free(rows);
            return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        }
        out.logits = o->logits ? s : NULL;
        out.hidden = o->hidden ? s + c->logit_floats : NULL;
        o = &out;
    }
    int rc = ds4_backend_step(t->rank[r], rows, c->n, o, err);
    free(rows);
    return rc;
}

static int tp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    const ds4_config *cfg = &base->w->cfg;
    step_call c = {rows, n, out, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        if (rows[i].want & DS4_ROW_LOGITS) c.logit_floats += cfg->n_vocab;
        if (rows[i].want & DS4_ROW_HIDDEN) c.hidden_floats += (size_t)cfg->n_hc * cfg->n_embd;
    }
    return run_all((tp_backend *)base, part_step, &c, true, err);
}

static ds4_seq *tp_mtp_seq_new(ds4_backend *base, uint32_t ctx, ds4_err *err) {
    (void)base, (void)ctx;
    ds4_err_set(err, DS4_EUNSUPPORTED, "tensor parallelism does not run the MTP block");
    return NULL;
}

static int tp_mtp_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    (void)base, (void)rows, (void)n, (void)out;
    return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor parallelism does not run the MTP block");
}

static const float *tp_logits(ds4_backend *base, ds4_seq *s) {
    tp_backend *t = (tp_backend *)base;
    return ds4_seq_logits(t->rank[0], ((tp_seq *)s)->r[0]);
}

/* ---------------------------------------------------- snapshots */

/* Every rank takes its snapshot (it folds the decode steps' compressor
 * windows, which the ranks keep doing alike); rank 0's is the caller's,
 * the others' are dropped. */
static int part_snapshot(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    ds4_kv_state *st = c->state;
    if (r > 0 && !(st = ds4_kv_state_new(c->state->cfg, c->state->ctx, c->state->prefill_chunk, err))) return -1;
    int rc = ds4_seq_snapshot(t->rank[r], c->s->r[r], st, err);
    if (r > 0) ds4_kv_state_free(st);
    return rc;
}

static int tp_snapshot(ds4_backend *base, ds4_seq *s, ds4_kv_state *out, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .state = out};
    return run_all((tp_backend *)base, part_snapshot, &c, false, err);
}

static int part_restore(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    seq_call *c = arg;
    return ds4_seq_restore(t->rank[r], c->s->r[r], c->in, err);
}

static int tp_restore(ds4_backend *base, ds4_seq *s, const ds4_kv_state *in, ds4_err *err) {
    seq_call c = {.s = (tp_seq *)s, .in = in};
    return run_all((tp_backend *)base, part_restore, &c, false, err);
}

/* What a sequence costs each GPU (every rank holds the whole KV) and the
 * room on GPU 0's. */
static void tp_seq_memory(const ds4_backend *base, uint32_t ctx, ds4_seq_memory *m) {
    ds4_seq_memory_of(((const tp_backend *)base)->rank[0], ctx, m);
}

/* ------------------------------------------------------ the group */

static int part_free(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    (void)arg, (void)err;
    ds4_backend_free(t->rank[r]);
    t->rank[r] = NULL;
    return 0;
}

static void tp_free(ds4_backend *base) {
    tp_backend *t = (tp_backend *)base;
    if (!t) return;
    run_all(t, part_free, NULL, false, NULL);
    pthread_mutex_lock(&t->mu);
    t->quit = true;
    pthread_cond_broadcast(&t->go);
    pthread_mutex_unlock(&t->mu);
    for (uint32_t r = 1; r < t->n; r++)
        if (t->started[r]) pthread_join(t->thread[r], NULL);
    ds4_cuda_clique_close(t->clique);
    for (uint32_t r = 0; r < t->n; r++) free(t->scratch[r].p);
    pthread_cond_destroy(&t->go);
    pthread_cond_destroy(&t->done);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static const ds4_backend_ops tp_ops = {
    .name = "cuda-tp",
    .free = tp_free,
    .seq_new = tp_seq_new,
    .mtp_seq_new = tp_mtp_seq_new,
    .seq_free = tp_seq_free,
    .seq_resize = tp_seq_resize,
    .seq_len = tp_seq_len,
    .step = tp_step,
    .mtp_step = tp_mtp_step,
    .stage_step = NULL,
    .mark = tp_mark,
    .rewind = tp_rewind,
    .prefill = tp_prefill,
    .decode = tp_decode,
    .logits = tp_logits,
    .reset = tp_reset,
    .snapshot = tp_snapshot,
    .restore = tp_restore,
    .greedy = tp_greedy,
    .seq_memory = tp_seq_memory,
};

/* Rank r's backend on GPU r, with its share (made in its own thread: its
 * graphs are captured there). */
static int part_create(tp_backend *t, uint32_t r, void *arg, ds4_err *err) {
    ds4_backend_opts o = *(const ds4_backend_opts *)arg;
    o.gpu = (int)r;
    o.tp_rank = r;
    o.tp_clique = t->clique;
    if (r > 0) o.act_observer = NULL, o.act_ctx = NULL; /* rank 0's rows are the sublayers' outputs */
    t->rank[r] = ds4_cuda_backend_create(t->base.w, &o, err);
    return t->rank[r] ? 0 : -1;
}

/* What the group refuses before it opens NCCL. */
static int check_opts(const ds4_backend_opts *o, ds4_err *err) {
    const char *no = o->mtp                             ? "the MTP block (speculative decoding, --mtp)"
                     : o->layer_first || o->layer_end   ? "with a pipeline (--layers, --gpus, mpirun)"
                     : o->imatrix                       ? "an importance-matrix collection"
                     : o->host_experts != DS4_HOST_AUTO ? "routed experts in host RAM"
                                                        : NULL;
    if (no) return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor parallelism (--tensor-parallel) does not run %s", no);
    if (o->tensor_parallel > DS4_DIST_MAX_GPUS)
        return ds4_err_set(err, DS4_EINVAL, "tensor parallelism over %u GPUs: at most %d", o->tensor_parallel,
                           DS4_DIST_MAX_GPUS);
    return 0;
}

static int start_ranks(tp_backend *t, ds4_err *err) {
    for (uint32_t r = 1; r < t->n; r++) {
        tp_thread_arg *a = malloc(sizeof(*a));
        if (!a) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        *a = (tp_thread_arg){t, r};
        if (pthread_create(&t->thread[r], NULL, serve, a) != 0) {
            free(a);
            return ds4_err_set(err, DS4_EIO, "cannot start the thread of GPU %u", r);
        }
        t->started[r] = true;
    }
    return 0;
}

ds4_backend *ds4_tp_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    if (check_opts(opts, err)) return NULL;
    tp_backend *t = calloc(1, sizeof(*t));
    if (!t) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    t->base.ops = &tp_ops;
    t->base.w = w;
    t->n = opts->tensor_parallel;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->go, NULL);
    pthread_cond_init(&t->done, NULL);
    int gpus[DS4_DIST_MAX_GPUS];
    for (uint32_t r = 0; r < t->n; r++) gpus[r] = (int)r;
    if (ds4_cuda_clique_open(gpus, (int)t->n, &t->clique, err) != 0 || start_ranks(t, err) != 0 ||
        run_all(t, part_create, (void *)opts, false, err) != 0) {
        ds4_err_prefix(err, "tensor parallel over %u GPUs", t->n);
        tp_free(&t->base);
        return NULL;
    }
    t->base.opts = t->rank[0]->opts;
    t->base.opts.gpu = 0;
    t->base.opts.tp_rank = 0;
    t->base.opts.tp_clique = NULL;
    t->main.base.owner = &t->base;
    for (uint32_t r = 0; r < t->n; r++) t->main.r[r] = t->rank[r]->main;
    t->base.main = &t->main.base;
    return &t->base;
}

ds4_backend *ds4_tp_rank(const ds4_backend *b, uint32_t r) {
    if (!b || b->ops != &tp_ops) return NULL;
    const tp_backend *t = (const tp_backend *)b;
    return r < t->n ? t->rank[r] : NULL;
}

#else /* a CPU build */

ds4_backend *ds4_tp_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err) {
    (void)w, (void)opts;
    ds4_err_set(err, DS4_EUNSUPPORTED,
                "tensor parallelism (--tensor-parallel) runs on GPUs: this is a CPU build (build it with `make cuda`)");
    return NULL;
}

ds4_backend *ds4_tp_rank(const ds4_backend *b, uint32_t r) {
    (void)b, (void)r;
    return NULL;
}

#endif
