/*
 * dist.h - pipeline-parallel inference (docs/DISTRIBUTED.md): the model's
 * layers split into contiguous stages, one MPI rank each (mpirun), or one
 * GPU each of this host in one process (--gpus).
 *
 * Every rank runs the same program under mpirun.  Rank 0 owns the
 * program's work (the CLI, the HTTP server, the benchmark) and computes
 * the first stage (the embedding and the first layers); the other ranks
 * serve their stage in ds4_dist_serve until rank 0 ends the job; the last
 * stage holds the output head.  On rank 0 the pipeline is an ordinary
 * ds4_backend (ds4_dist_backend_create): steps, prefills, snapshots and
 * sequences go through it, so the engine, sessions and programs work
 * unchanged.  Each rank maps the GGUF but touches only its stage's tensors
 * and keeps only its layers' KV state (a backend made with
 * ds4_backend_opts.layer_first/layer_end, on the CPU or CUDA backend each
 * rank names: ranks of both kinds mix).
 *
 * What travels (MPI point to point on a communicator of its own):
 *   rank 0 -> every rank   commands: make / free the backend, new / free
 *                          / reset a sequence, a step's rows (sequence,
 *                          token, what comes back), snapshot, restore
 *   rank r -> rank r + 1   a step's residuals: n_hc x n_embd per row (the
 *                          mHC streams), f32, or f16 / bf16 (--pipe-dtype)
 *   last rank -> rank 0    the logits of the rows that need them (the
 *                          rows asking, and each sequence's last row), or
 *                          only their argmax in greedy decoding
 *   rank r -> rank 0       a snapshot's layer slice; rank 0 -> r a restore's
 * A prefill goes in chunks with several in flight, so the stages work on
 * consecutive chunks at once; a step of several sequences goes as one
 * micro-step a stage; a decode step is one hop a stage and the logits'
 * way back.  The programs do not link MPI: Open MPI's library is loaded
 * when mpirun starts them (dist_mpi.c).
 *
 * With --gpus the ranks are threads of the program: stage r runs on GPU
 * gpus[r] in a thread of its own (rank 0's in the program's), the same
 * commands travel between them in memory, and the residuals go from GPU
 * to GPU by NCCL send / receive, which the programs load at run time
 * (libnccl.so.2) only then.  A failed stage fails the pipeline as a rank
 * does, and NCCL's transfers are aborted.
 *
 * Faults: a thread on every rank exchanges heartbeats with rank 0 (a
 * second communicator).  A rank silent for the timeout (--pipe-timeout,
 * default 5 s), or one that reports an error, fails the pipeline: rank 0's
 * calls return an error naming the rank and the cause, and the other
 * ranks stop with that message.  At start every rank's model file is
 * compared with rank 0's (shape, quantization, tensor table) and a
 * difference is refused, naming it.
 */
#ifndef DS4_MODEL_DIST_DIST_H
#define DS4_MODEL_DIST_DIST_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "model/backend.h"
#include "model/weights.h"

/* How a residual travels between stages. */
typedef enum ds4_dist_dtype { DS4_DIST_F32, DS4_DIST_F16, DS4_DIST_BF16 } ds4_dist_dtype;

#define DS4_DIST_TIMEOUT_DEFAULT 5.0 /* seconds without a heartbeat before a rank has failed */
#define DS4_DIST_IN_FLIGHT       4   /* prefill chunks in flight between two stages */

#define DS4_DIST_MAX_GPUS 64 /* GPUs a pipeline in one process spans at most (--gpus) */

/* A rank's part of the command line (engine/cli.h: DS4_CLI_DIST). */
typedef struct ds4_dist_opts {
    /* this rank's layers "A:B" (inclusive) or "A:output"; with --gpus one
     * range a GPU, by commas ("0:20,21:output"); NULL: split by memory */
    const char *layers;
    /* --gpus: the stages run in this process, stage r on GPU gpus[r]
     * (n_gpus >= 2, distinct); n_gpus 0: none (one process, or mpirun's) */
    int gpus[DS4_DIST_MAX_GPUS];
    int n_gpus;
    const char *dtype; /* "f32", "f16", "bf16" (rank 0's is used); NULL: f32 */
    float timeout_s;   /* rank 0's is used; <= 0: DS4_DIST_TIMEOUT_DEFAULT */
    /* --warm-weights on a rank after the first: read its stage's tensors
     * in before serving (the program's reader, engine/startup.h:
     * ds4_startup_warm_stage); NULL: no. 0 on success. */
    int (*warm)(void *ctx, const ds4_weights *w, uint32_t first, uint32_t end);
    void *warm_ctx;
} ds4_dist_opts;

typedef struct ds4_dist ds4_dist;

/* Join the MPI job when the process was started by mpirun (its environment
 * says so) with more than one rank: *d receives the job; otherwise *d is
 * NULL (one process, no MPI).  On error *d is NULL and err says why. */
int ds4_dist_init(ds4_dist **d, ds4_err *err);
int ds4_dist_rank(const ds4_dist *d);
int ds4_dist_size(const ds4_dist *d);

/* Every rank, with its own model file opened: compare the files with rank
 * 0's and agree on the stages (each rank's --layers, or an automatic split
 * in proportion to each rank's available memory: its GPU's for a rank on
 * the CUDA backend, as ds4_dist_start named it).  Collective; on failure
 * every rank gets the same message.  Rank 0 prints the stages on stderr
 * prefixed with prog. */
int ds4_dist_plan(ds4_dist *d, const char *prog, const ds4_weights *w, const ds4_dist_opts *o, ds4_err *err);

/* This rank's layers [first, end) after ds4_dist_plan. */
void ds4_dist_layers(const ds4_dist *d, uint32_t *first, uint32_t *end);

/* Rank 0: the pipeline as a backend over w, its own stage computed by the
 * named local backend ("cpu", "cuda").  The other ranks make theirs with the same
 * opts (context, chunk, simulations; threads their own).  Free it before
 * ds4_dist_end. */
ds4_backend *ds4_dist_backend_create(ds4_dist *d, const char *local, const ds4_weights *w, const ds4_backend_opts *opts,
                                     ds4_err *err);

/* Ranks other than 0: serve this rank's stage (backends made with the named
 * local backend and n_threads threads) until rank 0 ends the job.  0 at a
 * normal end, -1 when the pipeline failed (err says which rank and why). */
int ds4_dist_serve(ds4_dist *d, const char *local, const ds4_weights *w, int n_threads, ds4_err *err);

/* The pipeline's failure, when it has one: the message naming the rank
 * and the cause (the server answers 503 with it). */
bool ds4_dist_failed(const ds4_dist *d, ds4_err *err);

/* Whether mpirun started this process (its launcher's variables are in the
 * environment): a program's --layers then names this rank's stage. */
bool ds4_dist_launched(void);

/* Leave the job: rank 0 tells the others to end.  After a failure the
 * ranks that are left are stopped instead of waited for. */
void ds4_dist_end(ds4_dist *d);

/* A program's start under mpirun: join the job; on ranks other than 0,
 * open the model, agree on the stages, serve, and return the exit status
 * (0, or 1 with the error printed prefixed with prog); on rank 0, or
 * outside mpirun (*d NULL), return -1: the program carries on and calls
 * ds4_dist_plan once it has the model open.  model_path NULL (synthetic
 * weights) ends the job with that error.  With o->n_gpus (--gpus) the
 * stages are this process's: *d is their pipeline (NCCL loaded, the
 * stages' threads started by ds4_dist_plan) and -1 comes back, or the exit
 * status of a refusal (2: --gpus under mpirun, or with another backend
 * than cuda; 1: NCCL missing or failing). */
int ds4_dist_start(const char *prog, const char *model_path, const char *local, int n_threads, const ds4_dist_opts *o,
                   ds4_dist **d);

#endif
