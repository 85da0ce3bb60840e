/*
 * dist_internal.h - the pipeline's internals (see dist.h): the job, the
 * messages between ranks, how they travel, and the waits that end when a
 * rank fails.
 *
 * The ranks are MPI processes (mpirun), or stages in threads of one
 * process over GPUs of its host (--gpus).  Either way rank 0 drives the
 * others with the same protocol (dist_backend.c, dist_serve.c), through a
 * transport: messages to and from a rank, and the residuals' way from a
 * stage to the next.
 *
 *   dist_mpi.c      Open MPI loaded at run time
 *   dist_comm.c     the MPI transport: joining the job, heartbeats and
 *                   failures; the waits and failures of every transport
 *   dist_local.c    the in-process transport: a thread a stage, messages
 *                   by memory, residuals by NCCL between the GPUs
 *   dist_plan.c     model comparison and the split into stages
 *   dist_backend.c  rank 0's ds4_backend: the pipeline driven
 *   dist_serve.c    the other ranks' loop, and a program's start
 */
#ifndef DS4_MODEL_DIST_DIST_INTERNAL_H
#define DS4_MODEL_DIST_DIST_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

#include "model/dist/dist.h"

#define DIST_MAX_RANKS 256
#define DIST_MSG       512 /* bytes of a failure notice or an acknowledgement's message */

/* Tags of the data communicator. */
enum {
    TAG_CMD = 1, /* rank 0 -> r: a dist_cmd */
    TAG_ROWS,    /* rank 0 -> r: a step's rows (dist_row) */
    TAG_RESID,   /* r -> r + 1: a step's residuals */
    TAG_LOGITS,  /* last -> 0: the logits of the rows that return them */
    TAG_ACK,     /* r -> 0: a dist_ack */
    TAG_SLICE,   /* a snapshot's or a restore's layer slice */
    TAG_TOKENS,  /* 0 -> r: a restore's tokens */
};

/* Tags of the heartbeat communicator. */
enum {
    TAG_BEAT = 1, /* "alive": workers -> 0, 0 -> workers */
    TAG_FAIL,     /* a worker's error (text) -> 0 */
    TAG_STOP,     /* 0 -> workers: the pipeline failed (text): stop */
};

/* Commands from rank 0. */
enum {
    CMD_CREATE = 1, /* make the stage's backend: ctx, chunk, no_sim, graph ctx */
    CMD_FREE,       /* free it (acknowledged) */
    CMD_SEQ_NEW,    /* seq id, ctx */
    CMD_SEQ_FREE,
    CMD_RESET,
    CMD_STEP,     /* n rows follow (TAG_ROWS) */
    CMD_SNAPSHOT, /* send the sequence's layer slice to rank 0 */
    CMD_RESTORE,  /* n tokens, then the tokens and the slice follow */
    CMD_END,      /* the job is over */
};

typedef struct dist_cmd {
    uint32_t op, seq, n;
    uint32_t arg[4];
} dist_cmd;

/* What the last rank returns for a row: nothing, its logits, or only
 * their argmax (greedy decoding: 4 bytes instead of n_vocab floats). */
enum { RET_NONE = 0, RET_LOGITS = 1, RET_ARGMAX = 2 };

/* A step's row as it travels: sequence id, token, what comes back. */
typedef struct dist_row {
    uint32_t seq, token, ret;
} dist_row;

/* Floats of the last rank's answer for rows (a row's argmax travels as
 * the bits of one float). */
static inline size_t dist_ret_floats(const dist_row *rows, uint32_t n, uint32_t n_vocab) {
    size_t f = 0;
    for (uint32_t i = 0; i < n; i++) f += rows[i].ret == RET_LOGITS ? n_vocab : rows[i].ret == RET_ARGMAX ? 1 : 0;
    return f;
}

typedef struct dist_ack {
    int32_t ok;
    char msg[DIST_MSG];
} dist_ack;

/* What a rank tells the others about itself at the start. */
typedef struct dist_peer {
    int32_t pid;
    char host[64];
    char model[256]; /* its model file's path */
    uint64_t file_bytes, table_hash;
    uint32_t n_layer, n_embd, n_hc, n_vocab, n_expert, expert_type;
    int32_t want_first, want_end; /* its --layers, [first, end); -1: none */
    char layers_err[128];         /* its --layers did not parse */
    uint64_t mem_bytes;           /* memory available to it: its GPU's for a CUDA rank */
    char backend[16];             /* the backend its stage runs on */
} dist_peer;

/* Open MPI's entry points and predefined handles, loaded at run time
 * (dist_mpi.c): the programs do not link libmpi. */
typedef struct dist_mpi {
    void *lib;
    int (*Init_thread)(int *, char ***, int, int *);
    int (*Initialized)(int *);
    int (*Query_thread)(int *);
    int (*Finalize)(void);
    int (*Abort)(MPI_Comm, int);
    int (*Comm_size)(MPI_Comm, int *);
    int (*Comm_rank)(MPI_Comm, int *);
    int (*Comm_dup)(MPI_Comm, MPI_Comm *);
    int (*Comm_free)(MPI_Comm *);
    int (*Comm_set_errhandler)(MPI_Comm, MPI_Errhandler);
    int (*Isend)(const void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *);
    int (*Irecv)(void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *);
    int (*Test)(MPI_Request *, int *, MPI_Status *);
    int (*Get_count)(const MPI_Status *, MPI_Datatype, int *);
    int (*Testall)(int, MPI_Request *, int *, MPI_Status *);
    int (*Cancel)(MPI_Request *);
    int (*Request_free)(MPI_Request *);
    int (*Allgather)(const void *, int, MPI_Datatype, void *, int, MPI_Datatype, MPI_Comm);
    int (*Bcast)(void *, int, MPI_Datatype, int, MPI_Comm);
    MPI_Comm comm_world;
    MPI_Datatype byte, chr, flt, u32;
    MPI_Request request_null;
    MPI_Errhandler errors_return;
} dist_mpi;

/* Load Open MPI's libmpi.so.40 (an error says why it cannot be). */
int dist_mpi_load(dist_mpi *m, ds4_err *err);

/* A message in flight (dist_send, dist_recv; done at dist_wait): an MPI
 * request, or an in-process receive waiting for its message. */
typedef struct dist_req {
    bool on; /* started, not yet seen done */
    MPI_Request mpi;
    /* in-process (dist_local.c) */
    struct dist_req *next; /* the receiving rank's posted receives, in order */
    void *buf;
    size_t bytes;
    int from, tag;
    bool got;       /* its message is in buf */
    bool truncated; /* its message was longer than buf */
} dist_req;

/* Receives an MPI pipe keeps posted for the stage before (dist_comm.c). */
#define DIST_PIPE_POSTED 2

/* A stage's ends of the residuals' way: what the stage before sends lands
 * in `in`, and what this stage computes into out[k] (k < DS4_DIST_IN_FLIGHT)
 * goes to the next; out[k] is written again once its send is done.  MPI's
 * are host memory: a step's residuals arrive in one of in_raw[], whose
 * receives stay posted ahead of the steps, and leave packed into raw[k] in
 * the transfer type; in-process ones are memory of the stage's GPU, carried
 * by NCCL. */
typedef struct dist_pipe {
    size_t cap; /* floats each buffer holds */
    float *in, *out[DS4_DIST_IN_FLIGHT];
    /* MPI */
    void *in_raw[DIST_PIPE_POSTED], *raw[DS4_DIST_IN_FLIGHT];
    dist_req got[DIST_PIPE_POSTED]; /* the receives into in_raw[], posted in turn */
    uint32_t next_in;               /* in_raw[] of the next step's residuals */
    float *in_f32;                  /* in's own buffer where the transfer type is not f32 */
    dist_req sent[DS4_DIST_IN_FLIGHT];
    /* in-process */
    struct ds4_cuda_pipe *gpu;
} dist_pipe;

/* How the ranks reach each other (dist_comm.c: MPI; dist_local.c: stages
 * in threads of one process). */
typedef struct dist_transport {
    /* A message of `bytes` (a multiple of 4) to or from a rank, started:
     * done at dist_wait, a send's buffer free to reuse then. */
    int (*send)(ds4_dist *d, const void *buf, size_t bytes, int to, int tag, dist_req *r);
    int (*recv)(ds4_dist *d, void *buf, size_t bytes, int from, int tag, dist_req *r);
    /* Whether r is done (its `on` cleared then); -1 when it failed. */
    int (*test)(ds4_dist *d, dist_req *r, bool *done);
    /* Give up on r (a wait that failed): its buffer is no longer written. */
    void (*cancel)(ds4_dist *d, dist_req *r);
    /* The pipeline fails with this cause, found on this rank: the others
     * learn of it (a worker process stops). */
    void (*fail)(ds4_dist *d, const char *why);
    /* After the plan: what runs beside the program (heartbeats; the
     * stages' threads, each stage's weights read in first by o->warm). */
    int (*start)(ds4_dist *d, const ds4_weights *w, const ds4_dist_opts *o, ds4_err *err);
    /* After a failure, rank 0: wait until no other stage runs any more
     * (in-process stages: they share the program's weights). */
    void (*settle)(ds4_dist *d);
    /* Leave the job (ds4_dist_end), freeing d. */
    void (*end)(ds4_dist *d);
    /* This rank's pipe, each buffer of `floats` (a chunk's residuals). */
    int (*pipe_open)(ds4_dist *d, size_t floats, dist_pipe **p, ds4_err *err);
    void (*pipe_close)(ds4_dist *d, dist_pipe *p);
    /* Receive `floats` from the stage before into p->in: done when it returns. */
    int (*pipe_recv)(ds4_dist *d, dist_pipe *p, size_t floats, ds4_err *err);
    /* Send p->out[k]'s first `floats` to the next stage: started. */
    int (*pipe_send)(ds4_dist *d, dist_pipe *p, uint32_t k, size_t floats, ds4_err *err);
    /* Wait for out[k]'s send. */
    int (*pipe_wait)(ds4_dist *d, dist_pipe *p, uint32_t k, ds4_err *err);
} dist_transport;

struct ds4_dist {
    const dist_transport *tr;
    int rank, size;
    int gpu;               /* the GPU this rank's stage runs on (an MPI rank: its first) */
    dist_peer *peers;      /* size entries (after ds4_dist_plan) */
    uint32_t *first, *end; /* every rank's layers */
    ds4_dist_dtype dtype;
    double timeout_s;
    bool planned;
    bool plan_tried; /* the others joined the plan (else they wait in it) */

    /* MPI */
    dist_mpi mpi;
    MPI_Comm comm;    /* commands and data */
    MPI_Comm hb;      /* heartbeats and failures */
    pthread_t thread; /* the heartbeat thread */
    bool thread_on;
    atomic_bool quit; /* the thread's end */

    /* in-process stages: the job they share (dist_local.c) */
    struct dist_local *loc;

    /* The failure: kept by `job` - this rank itself, or the in-process
     * stages' stage 0 for all of them. */
    ds4_dist *job;
    atomic_bool failed;
    pthread_mutex_t mu; /* why */
    char why[1024];
    const char *prog;  /* names the program in a worker's last words */
    const char *local; /* this rank's backend (ds4_dist_start's; NULL: the CPU) */
};

/* A pipeline of in-process stages over o->gpus (dist_local.c): *d is
 * stage 0's view, the program's; the other stages' threads start after
 * the plan.  0, or the exit status (2: a usage error) with err saying why. */
int dist_local_open(const ds4_dist_opts *o, const char *local, const char *model_path, int n_threads, ds4_dist **d,
                    ds4_err *err);

/* The in-process stages' GPU of stage r (dist_local.c). */
int dist_local_gpu(const ds4_dist *d, int r);

/* *p holds at least `need` bytes (grown as needed; *cap its size). */
int dist_grow(void **p, size_t *cap, size_t need, ds4_err *err);

/* A peer's name in messages: "rank 2 (pid 123 on host)". */
const char *dist_peer_name(const ds4_dist *d, int r, char *buf, size_t n);

/* Fail the pipeline with this cause (the first one stays); a worker tells
 * rank 0, rank 0 tells the workers. */
void dist_fail(ds4_dist *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record the cause (the job's first one stays); true for the first. */
bool dist_set_failed(ds4_dist *d, const char *why);

/* err <- the failure; -1. */
int dist_failure(ds4_dist *d, ds4_err *err);

/* Messages through d's transport (dist_transport.send, recv). */
static inline int dist_send(ds4_dist *d, const void *buf, size_t bytes, int to, int tag, dist_req *r) {
    return d->tr->send(d, buf, bytes, to, tag, r);
}
static inline int dist_recv(ds4_dist *d, void *buf, size_t bytes, int from, int tag, dist_req *r) {
    return d->tr->recv(d, buf, bytes, from, tag, r);
}

/* Wait for requests, or for the pipeline to fail (-1, err says why). */
int dist_wait(ds4_dist *d, dist_req *r, ds4_err *err);
int dist_wait_all(ds4_dist *d, dist_req *r, int n, ds4_err *err);

/* Wait until done(ctx) says 1 (-1: it failed), or the pipeline fails:
 * polls, spinning first (a decode hop takes microseconds), then sleeping
 * in growing steps up to a millisecond. */
int dist_wait_until(ds4_dist *d, int (*done)(void *ctx, ds4_err *err), void *ctx, ds4_err *err);

/* A residual's bytes a row in the transfer type, and the conversions. */
size_t dist_resid_row_bytes(const ds4_dist *d, uint32_t floats);
void dist_resid_pack(const ds4_dist *d, const float *src, void *dst, size_t floats);
void dist_resid_unpack(const ds4_dist *d, const void *src, float *dst, size_t floats);

#endif
