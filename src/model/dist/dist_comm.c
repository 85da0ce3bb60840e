/*
 * dist_comm.c - the waits and failures of every pipeline (see
 * dist_internal.h), and its MPI transport: joining the MPI job, messages
 * and residuals between the ranks, the heartbeats that find a failed
 * rank, and leaving the job.
 *
 * MPI alone does not bound the wait for a rank that died or whose link
 * broke: a receive from it may never complete, and a send to it may
 * succeed into a buffer.  So nothing here blocks inside MPI: every wait
 * polls its request and the pipeline's failure flag, and a thread on every
 * rank exchanges a heartbeat with rank 0 every DIST_BEAT_S seconds on a
 * communicator of its own.  A rank silent for the timeout has failed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/instance_lock.h"
#include "base/fp.h"
#include "model/dist/dist_internal.h"

#define DIST_BEAT_S  0.25  /* between two heartbeats */
#define DIST_TICK_US 20000 /* the heartbeat thread's look at its messages */

static const dist_transport dist_mpi_transport;

/* mpirun (Open MPI, MPICH, PMIx launchers) leaves these in each rank's
 * environment; a process started by hand has none and runs alone. */
bool ds4_dist_launched(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        if (getenv(vars[i])) return true;
    return false;
}

/* Ranks on one machine each hold the instance lock (base/instance_lock.h)
 * of their own: rank r > 0 appends ".rank<r>" to the lock file's name, so
 * that a pipeline's ranks share a machine while a second job still finds
 * the first one's lock. */
static void own_lock_file(int rank) {
    if (rank == 0) return;
    char path[4096];
    snprintf(path, sizeof(path), "%s.rank%d", ds4_instance_lock_path(), rank);
    setenv("DS4_LOCK_FILE", path, 1);
}

/* Open MPI's TCP transport, set for a decode step's messages unless the
 * user set it (environment or mpirun --mca, which reaches the ranks as the
 * same variables):
 * - with the kernel's default socket buffers it stalls a residual of
 *   64 KiB on a shaped link (measured: a third of the decode rate lost on
 *   1 Gb/s, docs/DISTRIBUTED.md 5); 4 MiB buffers keep it at the link's rate;
 * - a message over its eager limit (64 KiB with the header) waits for the
 *   receiver's answer before its data goes: one round trip more a hop,
 *   which a 64 KiB residual paid on every token (measured: 2 round trips a
 *   token on a 50 ms link, test-dist-link).  1 MiB sends a step of a few
 *   rows at once, and the logits of a sampled token (n_vocab x 4 bytes);
 *   a prefill chunk still waits, which the receives posted ahead hide
 *   (MPI: pipe, below). */
static void tcp_transport(void) {
    setenv("OMPI_MCA_btl_tcp_sndbuf", "4194304", 0);
    setenv("OMPI_MCA_btl_tcp_rcvbuf", "4194304", 0);
    setenv("OMPI_MCA_btl_tcp_eager_limit", "1048576", 0);
}

int ds4_dist_init(ds4_dist **out, ds4_err *err) {
    *out = NULL;
    if (!ds4_dist_launched()) return 0;
    dist_mpi m;
    if (dist_mpi_load(&m, err) != 0) return -1;
    tcp_transport();
    int provided = 0, inited = 0;
    m.Initialized(&inited);
    if (!inited && m.Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        return ds4_err_set(err, DS4_EIO, "MPI_Init_thread failed");
    if (inited) m.Query_thread(&provided);
    int size = 1, rank = 0;
    m.Comm_size(m.comm_world, &size);
    m.Comm_rank(m.comm_world, &rank);
    if (size == 1) { /* one rank: an ordinary process */
        m.Finalize();
        return 0;
    }
    ds4_dist *d = NULL;
    if (provided < MPI_THREAD_MULTIPLE)
        ds4_err_set(err, DS4_EUNSUPPORTED,
                    "this MPI library lacks MPI_THREAD_MULTIPLE (the heartbeat thread needs it)");
    else if (size > DIST_MAX_RANKS)
        ds4_err_set(err, DS4_ERANGE, "%d ranks: a pipeline has at most %d", size, DIST_MAX_RANKS);
    else if (!(d = calloc(1, sizeof(*d)))) ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (!d) { /* the other ranks fail alike, or wait: end the job */
        m.Abort(m.comm_world, 1);
        return -1;
    }
    d->tr = &dist_mpi_transport;
    d->job = d;
    d->mpi = m;
    d->rank = rank;
    d->size = size;
    d->timeout_s = DS4_DIST_TIMEOUT_DEFAULT;
    pthread_mutex_init(&d->mu, NULL);
    m.Comm_dup(m.comm_world, &d->comm);
    m.Comm_dup(m.comm_world, &d->hb);
    /* errors come back as codes (the failure flag says what happened) */
    m.Comm_set_errhandler(d->comm, m.errors_return);
    m.Comm_set_errhandler(d->hb, m.errors_return);
    own_lock_file(rank);
    *out = d;
    return 0;
}

int ds4_dist_rank(const ds4_dist *d) { return d ? d->rank : 0; }
int ds4_dist_size(const ds4_dist *d) { return d ? d->size : 1; }

const char *dist_peer_name(const ds4_dist *d, int r, char *buf, size_t n) {
    if (d->loc) snprintf(buf, n, "stage %d (GPU %d)", r, dist_local_gpu(d, r));
    else if (d->peers) snprintf(buf, n, "rank %d (pid %d on %s)", r, (int)d->peers[r].pid, d->peers[r].host);
    else snprintf(buf, n, "rank %d", r);
    return buf;
}

int dist_grow(void **p, size_t *cap, size_t need, ds4_err *err) {
    if (need <= *cap) return 0;
    void *q = realloc(*p, need);
    if (!q) return ds4_err_set(err, DS4_ENOMEM, "out of memory for %zu bytes of the pipeline's buffers", need);
    *p = q;
    *cap = need;
    return 0;
}

/* ------------------------------------------------------------ failure */

bool dist_set_failed(ds4_dist *d, const char *why) {
    ds4_dist *j = d->job;
    pthread_mutex_lock(&j->mu);
    bool first = !atomic_load(&j->failed);
    if (first) {
        snprintf(j->why, sizeof(j->why), "%s", why);
        atomic_store(&j->failed, true);
    }
    pthread_mutex_unlock(&j->mu);
    return first;
}

void dist_fail(ds4_dist *d, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    d->tr->fail(d, why);
}

bool ds4_dist_failed(const ds4_dist *d, ds4_err *err) {
    if (!d || !atomic_load(&d->job->failed)) return false;
    ds4_dist *j = d->job; /* the lock only */
    pthread_mutex_lock(&j->mu);
    ds4_err_set(err, DS4_EIO, "pipeline failed: %s", j->why);
    pthread_mutex_unlock(&j->mu);
    return true;
}

int dist_failure(ds4_dist *d, ds4_err *err) {
    ds4_dist_failed(d, err);
    return -1;
}

/* -------------------------------------------------------------- waits */

int dist_wait_until(ds4_dist *d, int (*done)(void *ctx, ds4_err *err), void *ctx, ds4_err *err) {
    uint32_t spins = 0;
    for (;;) {
        ds4_err e = {0};
        int rc = done(ctx, &e);
        if (rc > 0) return 0;
        if (rc < 0) {
            dist_fail(d, "rank %d: %s", d->rank, ds4_err_msg(&e));
            return dist_failure(d, err);
        }
        if (atomic_load(&d->job->failed)) return dist_failure(d, err);
        if (++spins > 2000) usleep(spins > 20000 ? 1000 : 20);
    }
}

typedef struct reqs {
    ds4_dist *d;
    dist_req *r;
    int n;
} reqs;

static int reqs_done(void *ctx, ds4_err *err) {
    reqs *q = ctx;
    bool all = true;
    for (int i = 0; i < q->n; i++) {
        bool done = true;
        if (q->r[i].on && q->d->tr->test(q->d, &q->r[i], &done) != 0)
            return ds4_err_set(err, DS4_EIO, "a transfer failed");
        all = all && done;
    }
    return all;
}

int dist_wait_all(ds4_dist *d, dist_req *r, int n, ds4_err *err) {
    reqs q = {d, r, n};
    if (dist_wait_until(d, reqs_done, &q, err) == 0) return 0;
    for (int i = 0; i < n; i++)
        if (r[i].on) d->tr->cancel(d, &r[i]);
    return -1;
}

int dist_wait(ds4_dist *d, dist_req *r, ds4_err *err) { return dist_wait_all(d, r, 1, err); }

/* ----------------------------------------------------------- residuals */

size_t dist_resid_row_bytes(const ds4_dist *d, uint32_t floats) {
    return (size_t)floats * (d->dtype == DS4_DIST_F32 ? 4 : 2);
}

void dist_resid_pack(const ds4_dist *d, const float *src, void *dst, size_t floats) {
    if (d->dtype == DS4_DIST_F32) {
        memcpy(dst, src, floats * sizeof(float));
    } else if (d->dtype == DS4_DIST_F16) {
        ds4_f32_to_f16_row(src, dst, (int64_t)floats);
    } else {
        uint16_t *o = dst;
        for (size_t i = 0; i < floats; i++) o[i] = ds4_f32_to_bf16(src[i]);
    }
}

void dist_resid_unpack(const ds4_dist *d, const void *src, float *dst, size_t floats) {
    if (d->dtype == DS4_DIST_F32) {
        memcpy(dst, src, floats * sizeof(float));
    } else if (d->dtype == DS4_DIST_F16) {
        ds4_f16_to_f32_row(src, dst, (int64_t)floats);
    } else {
        const uint16_t *o = src;
        for (size_t i = 0; i < floats; i++) dst[i] = ds4_bf16_to_f32(o[i]);
    }
}

void ds4_dist_end(ds4_dist *d) {
    if (d) d->tr->end(d);
}

/* ==================================================== MPI: messages */

/* Every message travels as floats (its bytes are a multiple of 4): one
 * type on both ends, and counts up to 8 GiB in an int. */
static int mpi_send(ds4_dist *d, const void *buf, size_t bytes, int to, int tag, dist_req *r) {
    r->on = d->mpi.Isend(buf, (int)(bytes / 4), d->mpi.flt, to, tag, d->comm, &r->mpi) == MPI_SUCCESS;
    return r->on ? 0 : -1;
}

static int mpi_recv(ds4_dist *d, void *buf, size_t bytes, int from, int tag, dist_req *r) {
    r->on = d->mpi.Irecv(buf, (int)(bytes / 4), d->mpi.flt, from, tag, d->comm, &r->mpi) == MPI_SUCCESS;
    return r->on ? 0 : -1;
}

static int mpi_test(ds4_dist *d, dist_req *r, bool *done) {
    int flag = 0;
    if (d->mpi.Test(&r->mpi, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
    *done = flag != 0;
    if (*done) r->on = false;
    return 0;
}

/* A request left after a failure: the job ends without waiting for it
 * (MPI_Abort, or a worker's exit). */
static void mpi_cancel(ds4_dist *d, dist_req *r) { (void)d, (void)r; }

/* ============================================ MPI: failures, heartbeats */

static void send_text(ds4_dist *d, int to, int tag, const char *text) {
    char msg[DIST_MSG] = {0};
    snprintf(msg, sizeof(msg), "%s", text);
    MPI_Request r;
    /* a notice to a rank that may be dead: sent and left (it is small) */
    if (d->mpi.Isend(msg, DIST_MSG, d->mpi.chr, to, tag, d->hb, &r) == MPI_SUCCESS) {
        double t0 = ds4_now();
        int done = 0;
        while (!done && ds4_now() - t0 < 0.5 && d->mpi.Test(&r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS)
            if (!done) usleep(1000);
        if (!done) d->mpi.Request_free(&r);
    }
}

/* A worker's end after a failure: its last words, and out.  Nothing of
 * the process needs releasing (the kernel takes the mapping back), and its
 * main thread may be in the middle of a pass. */
static void worker_exit(ds4_dist *d) {
    char why[1024];
    pthread_mutex_lock(&d->mu);
    snprintf(why, sizeof(why), "%s", d->why);
    pthread_mutex_unlock(&d->mu);
    fprintf(stderr, "%s: rank %d: stopping: %s\n", d->prog ? d->prog : "ds4", d->rank, why);
    fflush(stderr);
    _exit(1);
}

/* The failure becomes known to every rank: rank 0 tells the workers (but
 * the failed one), a worker tells rank 0 and stops. */
static void spread_failure(ds4_dist *d, int culprit) {
    char why[1024];
    pthread_mutex_lock(&d->mu);
    snprintf(why, sizeof(why), "%s", d->why);
    pthread_mutex_unlock(&d->mu);
    if (d->rank == 0) {
        for (int r = 1; r < d->size; r++)
            if (r != culprit) send_text(d, r, TAG_STOP, why);
    } else {
        if (culprit != 0) send_text(d, 0, TAG_FAIL, why);
        worker_exit(d);
    }
}

static void mpi_fail(ds4_dist *d, const char *why) {
    if (dist_set_failed(d, why)) spread_failure(d, -1);
}

typedef struct beat_state {
    double *last_seen; /* per rank */
    double last_sent;
    MPI_Request *sends; /* one heartbeat in flight a peer */
    MPI_Request rx;     /* the posted receive */
    char rx_buf[DIST_MSG];
} beat_state;

static void post_rx(ds4_dist *d, beat_state *s) {
    d->mpi.Irecv(s->rx_buf, DIST_MSG, d->mpi.chr, MPI_ANY_SOURCE, MPI_ANY_TAG, d->hb, &s->rx);
}

/* What came in: a heartbeat, a worker's failure, rank 0's stop. */
static void receive(ds4_dist *d, beat_state *s, double now) {
    for (;;) {
        int done = 0;
        MPI_Status st;
        if (d->mpi.Test(&s->rx, &done, &st) != MPI_SUCCESS || !done) return;
        int from = st.MPI_SOURCE;
        char name[128], why[1024];
        s->last_seen[from] = now;
        if (st.MPI_TAG == TAG_FAIL) {
            s->rx_buf[DIST_MSG - 1] = 0;
            snprintf(why, sizeof(why), "%s failed: %s", dist_peer_name(d, from, name, sizeof(name)), s->rx_buf);
            if (dist_set_failed(d, why)) spread_failure(d, from);
        } else if (st.MPI_TAG == TAG_STOP) {
            s->rx_buf[DIST_MSG - 1] = 0;
            if (dist_set_failed(d, s->rx_buf)) spread_failure(d, 0);
        }
        post_rx(d, s);
    }
}

/* A peer silent for the timeout has failed. */
static void check_silence(ds4_dist *d, beat_state *s, double now) {
    for (int r = 0; r < d->size; r++) {
        if (r == d->rank || (d->rank != 0 && r != 0)) continue;
        if (now - s->last_seen[r] <= d->timeout_s) continue;
        char name[128], why[1024];
        snprintf(why, sizeof(why), "%s sent nothing for %.1f s: the process died or the link to it broke",
                 dist_peer_name(d, r, name, sizeof(name)), now - s->last_seen[r]);
        if (dist_set_failed(d, why)) spread_failure(d, r);
    }
}

static void *beat_thread(void *arg) {
    ds4_dist *d = arg;
    beat_state s = {0};
    s.last_seen = calloc((size_t)d->size, sizeof(double));
    s.sends = malloc((size_t)d->size * sizeof(MPI_Request));
    char *out = calloc(1, DIST_MSG);
    if (!s.last_seen || !s.sends || !out) {
        dist_fail(d, "rank %d: out of memory for heartbeats", d->rank);
        free(s.last_seen);
        free(s.sends);
        free(out);
        return NULL;
    }
    double now = ds4_now();
    for (int r = 0; r < d->size; r++) s.last_seen[r] = now, s.sends[r] = d->mpi.request_null;
    post_rx(d, &s);
    while (!atomic_load(&d->quit)) {
        now = ds4_now();
        /* heartbeats to the peers (rank 0: every worker; a worker: rank
         * 0), each sent when the one before it went; they carry DIST_MSG
         * bytes like the notices, so one posted receive takes either */
        if (now - s.last_sent >= DIST_BEAT_S) {
            s.last_sent = now;
            for (int r = 0; r < d->size; r++) {
                if (r == d->rank || (d->rank != 0 && r != 0)) continue;
                int done = 1;
                if (s.sends[r] != d->mpi.request_null) d->mpi.Test(&s.sends[r], &done, MPI_STATUS_IGNORE);
                if (done) d->mpi.Isend(out, DIST_MSG, d->mpi.chr, r, TAG_BEAT, d->hb, &s.sends[r]);
            }
        }
        receive(d, &s, now);
        if (!atomic_load(&d->failed)) check_silence(d, &s, now);
        usleep(DIST_TICK_US);
    }
    /* the end of the job: nothing more is expected */
    d->mpi.Cancel(&s.rx);
    d->mpi.Request_free(&s.rx);
    for (int r = 0; r < d->size; r++)
        if (s.sends[r] != d->mpi.request_null) d->mpi.Request_free(&s.sends[r]);
    free(s.last_seen);
    free(s.sends);
    free(out);
    return NULL;
}

static int mpi_start(ds4_dist *d, const ds4_weights *w, const ds4_dist_opts *o, ds4_err *err) {
    (void)w, (void)o;
    if (d->thread_on) return 0;
    if (pthread_create(&d->thread, NULL, beat_thread, d) != 0)
        return ds4_err_set(err, DS4_ENOMEM, "cannot start the heartbeat thread");
    d->thread_on = true;
    return 0;
}

/* Ranks are processes of their own: nothing of theirs is this one's. */
static void mpi_settle(ds4_dist *d) { (void)d; }

static void beat_stop(ds4_dist *d) {
    if (!d->thread_on) return;
    atomic_store(&d->quit, true);
    pthread_join(d->thread, NULL);
    d->thread_on = false;
}

/* ========================================================= MPI: pipe */

/* A step's residuals over Open MPI's eager limit (a prefill chunk: 4 MiB at
 * 64 tokens of 4 x 4096 floats, 128 MiB at 2048) leave only when the
 * receiver has matched them to a posted receive.  Posted when the stage is
 * ready for the step, that receive would put a round trip and the transfer
 * on every chunk's way, between two of the stage's steps.  So a stage keeps
 * DIST_PIPE_POSTED receives posted ahead, each into a buffer of a whole
 * chunk: while it computes one step, the next step's residuals are already
 * matched and move (the heartbeat thread's polls drive MPI's progress):
 * the handshake and the transfer are paid once, as the pipe fills, not on
 * every chunk.  MPI matches a sender's messages of one tag to the receives
 * in the order they were posted, so the steps' residuals arrive in
 * order. */

static int post_in(ds4_dist *d, dist_pipe *p, uint32_t i) {
    return mpi_recv(d, p->in_raw[i], dist_resid_row_bytes(d, (uint32_t)p->cap), d->rank - 1, TAG_RESID, &p->got[i]);
}

typedef struct arrival {
    ds4_dist *d;
    dist_req *r;
    int floats; /* in the transfer type, counted as MPI floats */
} arrival;

/* Whether the posted receive got its step's residuals: the receive is of a
 * whole chunk, so a message of another length than the step's is found
 * here. */
static int arrived(void *ctx, ds4_err *err) {
    arrival *a = ctx;
    int flag = 0, got = 0;
    MPI_Status st;
    if (a->d->mpi.Test(&a->r->mpi, &flag, &st) != MPI_SUCCESS)
        return ds4_err_set(err, DS4_EIO, "receiving a step's residuals from rank %d failed", a->d->rank - 1);
    if (!flag) return 0;
    a->r->on = false;
    if (a->d->mpi.Get_count(&st, a->d->mpi.flt, &got) != MPI_SUCCESS || got != a->floats)
        return ds4_err_set(err, DS4_EIO, "rank %d sent %d floats of residuals for a step of %d", a->d->rank - 1, got,
                           a->floats);
    return 1;
}

/* The posted receives given up (their buffers are freed next): a receive
 * nothing matched ends at once.  After a failure the job is ending and
 * MPI may still write into a buffer: it is left to the process's end. */
static void mpi_pipe_close(ds4_dist *d, dist_pipe *p) {
    if (!p) return;
    for (uint32_t k = 0; k < DS4_DIST_IN_FLIGHT; k++) {
        if (p->sent[k].on) dist_wait(d, &p->sent[k], NULL);
        free(p->raw[k]);
    }
    for (uint32_t i = 0; i < DIST_PIPE_POSTED; i++) {
        if (p->got[i].on) {
            d->mpi.Cancel(&p->got[i].mpi);
            if (dist_wait(d, &p->got[i], NULL) != 0) continue;
        }
        free(p->in_raw[i]);
    }
    free(p->in_f32);
    free(p->out[0]);
    free(p);
}

/* Host buffers: DIST_PIPE_POSTED for what arrives, their receives posted
 * (in f32 the stage reads its input there, otherwise unpacked into
 * in_f32), the stage's f32 output (one buffer: packed into raw[k] at each
 * send), raw[k] in flight. */
static int mpi_pipe_open(ds4_dist *d, size_t floats, dist_pipe **out, ds4_err *err) {
    *out = NULL;
    dist_pipe *p = calloc(1, sizeof(*p));
    if (!p) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->cap = floats;
    size_t raw = dist_resid_row_bytes(d, (uint32_t)floats);
    bool ok = true;
    if (d->rank > 0) {
        for (uint32_t i = 0; ok && i < DIST_PIPE_POSTED; i++) ok = (p->in_raw[i] = malloc(raw)) != NULL;
        if (ok && d->dtype != DS4_DIST_F32) ok = (p->in_f32 = malloc(floats * sizeof(float))) != NULL;
    }
    if (ok && d->rank + 1 < d->size) {
        ok = (p->out[0] = malloc(floats * sizeof(float))) != NULL;
        for (uint32_t k = 0; ok && k < DS4_DIST_IN_FLIGHT; k++) {
            p->out[k] = p->out[0];
            ok = (p->raw[k] = malloc(raw)) != NULL;
        }
    }
    if (!ok) {
        mpi_pipe_close(d, p);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory for the pipeline's buffers (%zu floats)", floats);
    }
    for (uint32_t i = 0; d->rank > 0 && i < DIST_PIPE_POSTED; i++) {
        if (post_in(d, p, i) != 0) {
            mpi_pipe_close(d, p);
            return ds4_err_set(err, DS4_EIO, "posting a receive of the residuals from rank %d failed", d->rank - 1);
        }
    }
    *out = p;
    return 0;
}

/* The step's residuals from the posted receive that comes next in turn.
 * The buffer the last step read is free again: its receive is posted
 * first, for the step after the next. */
static int mpi_pipe_recv(ds4_dist *d, dist_pipe *p, size_t floats, ds4_err *err) {
    uint32_t i = p->next_in;
    uint32_t prev = (i + DIST_PIPE_POSTED - 1) % DIST_PIPE_POSTED;
    if (!p->got[prev].on && post_in(d, p, prev) != 0)
        return ds4_err_set(err, DS4_EIO, "posting a receive of the residuals from rank %d failed", d->rank - 1);
    arrival a = {d, &p->got[i], (int)(dist_resid_row_bytes(d, (uint32_t)floats) / 4)};
    if (dist_wait_until(d, arrived, &a, err) != 0) return -1;
    p->next_in = (i + 1) % DIST_PIPE_POSTED;
    if (d->dtype == DS4_DIST_F32) {
        p->in = p->in_raw[i];
    } else {
        dist_resid_unpack(d, p->in_raw[i], p->in_f32, floats);
        p->in = p->in_f32;
    }
    return 0;
}

static int mpi_pipe_send(ds4_dist *d, dist_pipe *p, uint32_t k, size_t floats, ds4_err *err) {
    (void)err;
    dist_resid_pack(d, p->out[k], p->raw[k], floats);
    return mpi_send(d, p->raw[k], dist_resid_row_bytes(d, (uint32_t)floats), d->rank + 1, TAG_RESID, &p->sent[k]);
}

static int mpi_pipe_wait(ds4_dist *d, dist_pipe *p, uint32_t k, ds4_err *err) {
    return p->sent[k].on ? dist_wait(d, &p->sent[k], err) : 0;
}

/* ========================================================== MPI: end */

static void mpi_end(ds4_dist *d) {
    bool failed = atomic_load(&d->failed);
    if (d->rank == 0 && d->planned && !failed) {
        dist_cmd c = {.op = CMD_END};
        dist_req rq[DIST_MAX_RANKS];
        for (int r = 1; r < d->size; r++) mpi_send(d, &c, sizeof(c), r, TAG_CMD, &rq[r - 1]);
        failed = dist_wait_all(d, rq, d->size - 1, NULL) != 0;
    }
    beat_stop(d);
    if (d->rank == 0 && !d->plan_tried) failed = true; /* the others wait for a plan that never comes */
    if (failed) {
        /* the ranks that are left are not waited for: MPI_Finalize would */
        fflush(stderr);
        d->mpi.Abort(d->mpi.comm_world, 1);
    } else {
        d->mpi.Comm_free(&d->comm);
        d->mpi.Comm_free(&d->hb);
        d->mpi.Finalize();
    }
    pthread_mutex_destroy(&d->mu);
    free(d->peers);
    free(d->first);
    free(d->end);
    free(d);
}

static const dist_transport dist_mpi_transport = {
    .send = mpi_send,
    .recv = mpi_recv,
    .test = mpi_test,
    .cancel = mpi_cancel,
    .fail = mpi_fail,
    .start = mpi_start,
    .settle = mpi_settle,
    .end = mpi_end,
    .pipe_open = mpi_pipe_open,
    .pipe_close = mpi_pipe_close,
    .pipe_recv = mpi_pipe_recv,
    .pipe_send = mpi_pipe_send,
    .pipe_wait = mpi_pipe_wait,
};
