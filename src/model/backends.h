/*
 * backends.h - the compute backends of this build, by name: "cpu" always,
 * "cuda" in CUDA builds (`make cuda`).
 *
 * The interface they implement is model/backend.h; this is the one place
 * that knows every implementation, so the interface does not depend on
 * them.
 */
#ifndef DS4_MODEL_BACKENDS_H
#define DS4_MODEL_BACKENDS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/error.h"
#include "model/backend.h"

/* 0 when this build has the named backend (NULL: the default); else why
 * not ("metal", "cuda" in a CPU build, unknown names).  Programs check
 * before loading the model. */
int ds4_backend_check_name(const char *name, ds4_err *err);

/* Create the named backend ("cpu"; "cuda" in CUDA builds) over loaded
 * weights, which must outlive it. */
ds4_backend *ds4_backend_create(const char *name, const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* Bytes the named backend may fill when not told how many: the CUDA
 * backend's budget on GPU gpu (its free memory less a reserve for the
 * runtime; docs/DISTRIBUTED.md splits a pipeline by it); 0 for a backend
 * whose memory is the host's (NULL, "cpu"), or when the GPU cannot say. */
uint64_t ds4_backend_mem_available(const char *name, int gpu);

/* Brings what backend b has summed for its imatrix collector
 * (ds4_backend_opts.imatrix) into the collector: the CUDA backend's device
 * sums since the last flush (one read-back of them all); nothing to do for
 * the CPU backend, which adds as it runs.  Call it before reading or saving
 * the collector. */
int ds4_backend_imatrix_flush(ds4_backend *b, ds4_err *err);

/* The CPU reference backend (src/model/cpu/). */
ds4_backend *ds4_cpu_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* The CUDA backend (src/model/cuda/, CUDA builds only).  Also accepts
 * synthetic weights (ds4_weights_synthetic), which it fills on the GPU.
 * Its prefill chunk defaults to 2048. */
ds4_backend *ds4_cuda_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* Tensor parallelism over the host's GPUs 0 .. opts->tensor_parallel - 1
 * (model/dist/dist_tp.c, docs/DISTRIBUTED.md 7): a backend of CUDA
 * backends, one a GPU, each computing its share of every layer; what it
 * refuses (MTP, a pipeline, host experts, a model whose heads do not
 * divide) it says.  ds4_backend_create makes it for "cuda" with
 * opts->tensor_parallel > 1; a CPU build refuses it. */
ds4_backend *ds4_tp_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);
/* Rank r's CUDA backend of a tensor-parallel group (its share, on GPU r),
 * or NULL when b is no such group or has no rank r. */
ds4_backend *ds4_tp_rank(const ds4_backend *b, uint32_t r);

/* CUDA builds: the bytes a CUDA backend on GPU gpu not told --gpu-mem may
 * allocate. */
int ds4_cuda_mem_available(int gpu, uint64_t *bytes, ds4_err *err);

/* CUDA builds: the device's copy bandwidth (bytes read + written per second,
 * a large device-to-device copy, best of several), and its name. */
int ds4_cuda_copy_bandwidth(double *bytes_per_s, char *name, size_t name_len, ds4_err *err);

/* CUDA builds: where a backend made by ds4_cuda_backend_create keeps the
 * routed experts (docs/DESIGN.md 3.5).  -1 for another backend. */
typedef struct ds4_offload_info {
    bool on; /* some experts are in host RAM */
    uint32_t host_experts, total_experts;
    uint64_t dev_total;       /* device bytes the placement counted */
    uint64_t dev_fixed;       /* of which every placement needs (all but the routed experts): the least --gpu-mem */
    uint64_t dev_allocated;   /* device bytes the backend allocated (weights, state, buffers, slot table) */
    uint64_t host_bytes;      /* file bytes of the host experts */
    uint32_t mapped_experts;  /* of them, read by the GPU from pinned host memory in decode steps */
    uint64_t mapped_bytes;    /* their pinned bytes */
    double tok_dev, tok_host; /* expected routed bytes a token reads on each side */
    /* the host's work since the backend was made: its hand-offs (one a
     * layer with host experts a pass), the (token, expert) entries they
     * computed, and the seconds the CPU spent on them */
    uint64_t host_jobs, host_entries;
    double host_sec;
} ds4_offload_info;
int ds4_cuda_offload_info(const ds4_backend *b, ds4_offload_info *out);

/* CUDA builds: the routed-expert selections a backend made with
 * opts.count_experts has counted so far, into p (model/placement.h). */
struct ds4_expert_profile;
int ds4_cuda_expert_counts(ds4_backend *b, struct ds4_expert_profile *p, ds4_err *err);

/* CUDA builds: ds4_backend_imatrix_flush for a CUDA backend. */
int ds4_cuda_imatrix_flush(ds4_backend *b, ds4_err *err);

/* CUDA builds: the residuals' way between the stages of a pipeline over
 * GPUs of this host (--gpus; model/dist, docs/DISTRIBUTED.md), over NCCL,
 * whose libnccl.so.2 is loaded by the first clique (the error says why it
 * cannot be).  A clique is NCCL's communicators over gpus[0..n) (rank r on
 * gpus[r]); abort (any thread, once a stage has failed) ends them and
 * their waiting transfers at once, close frees them. */
typedef struct ds4_cuda_clique ds4_cuda_clique;
int ds4_cuda_clique_open(const int *gpus, int n, ds4_cuda_clique **c, ds4_err *err);
void ds4_cuda_clique_abort(ds4_cuda_clique *c);
void ds4_cuda_clique_close(ds4_cuda_clique *c);

/* Stage rank's ends of the way, in its GPU's memory: a buffer of `floats`
 * that what stage rank - 1 sends lands in (rank > 0), and n_out buffers
 * of what it sends to rank + 1 (before the last stage).  Transfers start
 * on a stream of the pipe's own and are polled: *_done 1 when finished,
 * 0 while they run, -1 on an error.  A buffer out is reused once its send
 * is done; close the pipe when its transfers are, or after an abort. */
typedef struct ds4_cuda_pipe ds4_cuda_pipe;
int ds4_cuda_pipe_open(ds4_cuda_clique *c, int rank, size_t floats, uint32_t n_out, ds4_cuda_pipe **p, ds4_err *err);
void ds4_cuda_pipe_close(ds4_cuda_pipe *p);
float *ds4_cuda_pipe_in(ds4_cuda_pipe *p);
float *ds4_cuda_pipe_out(ds4_cuda_pipe *p, uint32_t k);
int ds4_cuda_pipe_recv(ds4_cuda_pipe *p, size_t floats, ds4_err *err);
int ds4_cuda_pipe_send(ds4_cuda_pipe *p, uint32_t k, size_t floats, ds4_err *err);
int ds4_cuda_pipe_recv_done(ds4_cuda_pipe *p, ds4_err *err);
int ds4_cuda_pipe_send_done(ds4_cuda_pipe *p, uint32_t k, ds4_err *err);

#endif
