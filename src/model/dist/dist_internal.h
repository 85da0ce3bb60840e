/*
 * dist_internal.h - the pipeline's internals (see dist.h): the job, the
 * messages between ranks, and the waits that end when a rank fails.
 *
 *   dist_mpi.c      Open MPI loaded at run time
 *   dist_comm.c     joining the job, heartbeats and failures, waits
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
    CMD_FREE,       /* free it */
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

struct ds4_dist {
    dist_mpi mpi;
    int rank, size;
    MPI_Comm comm;         /* commands and data */
    MPI_Comm hb;           /* heartbeats and failures */
    dist_peer *peers;      /* size entries (after ds4_dist_plan) */
    uint32_t *first, *end; /* every rank's layers */
    ds4_dist_dtype dtype;
    double timeout_s;
    bool planned;
    bool plan_tried; /* the others joined the plan (else they wait in it) */

    /* the heartbeat thread */
    pthread_t thread;
    bool thread_on;
    atomic_bool quit; /* the thread's end */
    atomic_bool failed;
    pthread_mutex_t mu; /* why */
    char why[1024];
    const char *prog;  /* names the program in a worker's last words */
    const char *local; /* this rank's backend (ds4_dist_start's; NULL: the CPU) */
};

/* *p holds at least `need` bytes (grown as needed; *cap its size). */
int dist_grow(void **p, size_t *cap, size_t need, ds4_err *err);

/* A peer's name in messages: "rank 2 (pid 123 on host)". */
const char *dist_peer_name(const ds4_dist *d, int r, char *buf, size_t n);

/* Fail the pipeline with this cause (the first one stays); a worker tells
 * rank 0, rank 0 tells the workers. */
void dist_fail(ds4_dist *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* err <- the failure; -1. */
int dist_failure(ds4_dist *d, ds4_err *err);

/* Start / stop the heartbeat thread (ds4_dist_plan starts it). */
int dist_beat_start(ds4_dist *d, ds4_err *err);
void dist_beat_stop(ds4_dist *d);

/* Wait for a request, or for the pipeline to fail (-1, err says why). */
int dist_wait(ds4_dist *d, MPI_Request *r, ds4_err *err);
int dist_wait_all(ds4_dist *d, MPI_Request *r, int n, ds4_err *err);

/* A residual's bytes a row in the transfer type, and the conversions. */
size_t dist_resid_row_bytes(const ds4_dist *d, uint32_t floats);
void dist_resid_pack(const ds4_dist *d, const float *src, void *dst, size_t floats);
void dist_resid_unpack(const ds4_dist *d, const void *src, float *dst, size_t floats);

#endif
