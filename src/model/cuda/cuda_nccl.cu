/*
 * cuda_nccl.cu - NCCL between the GPUs of one host (docs/DISTRIBUTED.md):
 * communicators over the GPUs, and
 *  - the residuals' way between the stages of a pipeline (--gpus;
 *    model/dist): each stage's ends - a buffer what the stage before sends
 *    lands in, buffers of what it sends on, in its GPU's memory - with
 *    transfers started on a stream of their own and polled for completion,
 *    so that the pipeline's waits can give up when a stage has failed
 *    (model/backends.h, ds4_cuda_clique_*, ds4_cuda_pipe_*);
 *  - the sums of tensor parallelism (--tensor-parallel; cuda_tp.cu): an
 *    all-reduce on the backend's stream, which a decode graph captures.
 *
 * The programs do not link NCCL: libnccl.so.2 is loaded when GPUs first
 * work together, so that every other run works without it, and its
 * entry points are taken by name with the types of nccl.h.  In the CPU
 * emulation of CUDA the emulated NCCL (tests/cuda/emu/nccl_emu.h) stands
 * in for the library.
 */
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <new>

#include "model/cuda/cuda_rt.h"

#ifdef DS4_CUDA_EMU
#include "nccl_emu.h"
#else
#include <dlfcn.h>
#include <nccl.h>
#endif

extern "C" {
#include "model/backends.h"
}

#define DS4_LIBNCCL "libnccl.so.2"

/* NCCL's entry points ds4 calls. */
typedef struct cu_nccl {
    decltype(&ncclCommInitAll) CommInitAll;
    decltype(&ncclCommDestroy) CommDestroy;
    decltype(&ncclCommAbort) CommAbort;
    decltype(&ncclSend) Send;
    decltype(&ncclRecv) Recv;
    decltype(&ncclAllReduce) AllReduce;
    decltype(&ncclGetErrorString) GetErrorString;
} cu_nccl;

/* The library's entry points into n.  It stays loaded once they are
 * found: its threads and the device code it registered outlive the
 * communicators, so it is never closed. */
static int nccl_load(cu_nccl *n, ds4_err *err) {
#ifdef DS4_CUDA_EMU
    *n = cu_nccl{ncclCommInitAll, ncclCommDestroy, ncclCommAbort, ncclSend, ncclRecv, ncclAllReduce,
                  ncclGetErrorString};
    (void)err;
    return 0;
#else
    void *lib = dlopen(DS4_LIBNCCL, RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return ds4_err_set(err, DS4_ENOTFOUND,
                           "GPUs working together (--gpus, --tensor-parallel) need NCCL, whose %s cannot be loaded: %s "
                           "(install NCCL: "
                           "Debian's or NVIDIA's libnccl2)",
                           DS4_LIBNCCL, dlerror());
    struct {
        void *slot;
        const char *name;
    } fns[] = {
        {(void *)&n->CommInitAll, "ncclCommInitAll"},
        {(void *)&n->CommDestroy, "ncclCommDestroy"},
        {(void *)&n->CommAbort, "ncclCommAbort"},
        {(void *)&n->Send, "ncclSend"},
        {(void *)&n->Recv, "ncclRecv"},
        {(void *)&n->AllReduce, "ncclAllReduce"},
        {(void *)&n->GetErrorString, "ncclGetErrorString"},
    };
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        void *p = dlsym(lib, fns[i].name);
        if (!p) {
            ds4_err_set(err, DS4_EUNSUPPORTED, "%s has no %s: not NCCL 2's library", DS4_LIBNCCL, fns[i].name);
            dlclose(lib);
            return -1;
        }
        memcpy(fns[i].slot, &p, sizeof(p));
    }
    return 0;
#endif
}

/* The stages' threads each start their own transfers; an abort (a stage
 * failed) ends every communicator at once, so the transfers are started
 * under a lock that the abort takes too, and none after it. */
struct ds4_cuda_clique {
    cu_nccl nccl;
    int n;
    int *gpus;
    ncclComm_t *comms; /* rank r's on gpus[r] */
    std::mutex mu;
    bool aborted;
};

static int nccl_check(const cu_nccl *n, ncclResult_t r, const char *what, ds4_err *err) {
    if (r == ncclSuccess) return 0;
    return ds4_err_set(err, DS4_EIO, "NCCL: %s failed: %s", what, n->GetErrorString(r));
}

/* NCCL loaded, and its communicators over the listed GPUs, each one the
 * process sees; the caller's current device stays its own. */
static int clique_init(ds4_cuda_clique *c, const int *gpus, int n, ds4_err *err) {
    if (nccl_load(&c->nccl, err)) return -1;
    int prev = 0, count = 0;
    CU_TRY(cudaGetDevice(&prev));
    CU_TRY(cudaGetDeviceCount(&count));
    for (int r = 0; r < n; r++)
        if (gpus[r] >= count)
            return ds4_err_set(err, DS4_EINVAL, "GPU %d: the process sees %d GPU%s (0..%d)", gpus[r], count,
                               count == 1 ? "" : "s", count - 1);
    if (nccl_check(&c->nccl, c->nccl.CommInitAll(c->comms, n, gpus), "ncclCommInitAll", err)) {
        memset(c->comms, 0, (size_t)n * sizeof(ncclComm_t)); /* none made: NCCL frees what it began */
        return -1;
    }
    CU_TRY(cudaSetDevice(prev));
    return 0;
}

extern "C" int ds4_cuda_clique_open(const int *gpus, int n, ds4_cuda_clique **out, ds4_err *err) {
    *out = NULL;
    ds4_cuda_clique *c = new (std::nothrow) ds4_cuda_clique();
    if (!c) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    c->n = n;
    c->gpus = (int *)malloc((size_t)n * sizeof(int));
    c->comms = (ncclComm_t *)calloc((size_t)n, sizeof(ncclComm_t));
    int rc = c->gpus && c->comms ? 0 : ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (rc == 0) memcpy(c->gpus, gpus, (size_t)n * sizeof(int));
    if (rc == 0) rc = clique_init(c, gpus, n, err);
    if (rc != 0) {
        ds4_cuda_clique_close(c); /* the communicators made, if any */
        return -1;
    }
    *out = c;
    return 0;
}

extern "C" void ds4_cuda_clique_abort(ds4_cuda_clique *c) {
    std::lock_guard<std::mutex> l(c->mu);
    if (c->aborted) return;
    c->aborted = true;
    for (int r = 0; r < c->n; r++)
        if (c->comms[r]) c->nccl.CommAbort(c->comms[r]);
}

extern "C" void ds4_cuda_clique_close(ds4_cuda_clique *c) {
    if (!c) return;
    for (int r = 0; c->comms && !c->aborted && r < c->n; r++)
        if (c->comms[r]) c->nccl.CommDestroy(c->comms[r]);
    free(c->gpus);
    free(c->comms);
    delete c;
}

/* Start a transfer, unless the communicators were aborted. */
static int start(ds4_cuda_clique *c, bool send, void *buf, size_t floats, int rank, cudaStream_t st, ds4_err *err) {
    std::lock_guard<std::mutex> l(c->mu);
    if (c->aborted) return ds4_err_set(err, DS4_EIO, "NCCL: the pipeline's transfers were aborted");
    ncclResult_t r = send ? c->nccl.Send(buf, floats, ncclFloat32, rank + 1, c->comms[rank], st)
                          : c->nccl.Recv(buf, floats, ncclFloat32, rank - 1, c->comms[rank], st);
    return nccl_check(&c->nccl, r, send ? "ncclSend" : "ncclRecv", err);
}

/* The sum over the clique of rank's n floats at buf, in place, on st
 * (cuda_tp.cu); captured with the stream when it is being captured. */
int cu_nccl_allreduce(ds4_cuda_clique *c, int rank, float *buf, size_t n, cudaStream_t st, ds4_err *err) {
    std::lock_guard<std::mutex> l(c->mu);
    if (c->aborted) return ds4_err_set(err, DS4_EIO, "NCCL: the GPUs' communicators were aborted (a GPU failed)");
    return nccl_check(&c->nccl, c->nccl.AllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comms[rank], st),
                      "ncclAllReduce", err);
}

struct ds4_cuda_pipe {
    ds4_cuda_clique *c;
    int rank, gpu;
    size_t floats;    /* each buffer's */
    uint32_t n_out;   /* buffers out */
    void *block;      /* the buffers, in the GPU's memory */
    float *in, **out; /* what arrives; what goes */
    cudaStream_t st;  /* the transfers, in order */
    cudaEvent_t ev_in, *ev_out;
};

extern "C" void ds4_cuda_pipe_close(ds4_cuda_pipe *p) {
    if (!p) return;
    if (cudaSetDevice(p->gpu) != cudaSuccess) (void)cudaGetLastError();
    if (p->ev_out)
        for (uint32_t k = 0; k < p->n_out; k++)
            if (p->ev_out[k]) cudaEventDestroy(p->ev_out[k]);
    if (p->ev_in) cudaEventDestroy(p->ev_in);
    if (p->st) cudaStreamDestroy(p->st);
    if (p->block) cudaFree(p->block);
    free(p->ev_out);
    free(p->out);
    free(p);
}

static int pipe_setup(ds4_cuda_pipe *p, ds4_err *err) {
    CU_TRY(cudaSetDevice(p->gpu));
    bool has_in = p->rank > 0;
    size_t bytes = ((has_in ? 1 : 0) + p->n_out) * p->floats * sizeof(float);
    if (cu_dev_alloc(&p->block, bytes, "the pipeline's residual buffers", err)) return -1;
    float *f = (float *)p->block;
    p->in = has_in ? f : NULL;
    for (uint32_t k = 0; k < p->n_out; k++) p->out[k] = f + (size_t)(has_in + k) * p->floats;
    CU_TRY(cudaStreamCreateWithFlags(&p->st, cudaStreamNonBlocking));
    CU_TRY(cudaEventCreateWithFlags(&p->ev_in, cudaEventDisableTiming));
    for (uint32_t k = 0; k < p->n_out; k++) CU_TRY(cudaEventCreateWithFlags(&p->ev_out[k], cudaEventDisableTiming));
    return 0;
}

extern "C" int ds4_cuda_pipe_open(ds4_cuda_clique *c, int rank, size_t floats, uint32_t n_out, ds4_cuda_pipe **out,
                                  ds4_err *err) {
    *out = NULL;
    ds4_cuda_pipe *p = (ds4_cuda_pipe *)calloc(1, sizeof(*p));
    if (!p) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->c = c;
    p->rank = rank;
    p->gpu = c->gpus[rank];
    p->floats = floats;
    p->n_out = rank + 1 < c->n ? n_out : 0; /* the last stage sends no residuals */
    p->out = (float **)calloc(n_out ? n_out : 1, sizeof(float *));
    p->ev_out = (cudaEvent_t *)calloc(n_out ? n_out : 1, sizeof(cudaEvent_t));
    if (!p->out || !p->ev_out) {
        ds4_cuda_pipe_close(p);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    if (pipe_setup(p, err)) {
        ds4_cuda_pipe_close(p);
        return ds4_err_prefix(err, "GPU %d", p->gpu);
    }
    *out = p;
    return 0;
}

extern "C" float *ds4_cuda_pipe_in(ds4_cuda_pipe *p) { return p->in; }
extern "C" float *ds4_cuda_pipe_out(ds4_cuda_pipe *p, uint32_t k) { return k < p->n_out ? p->out[k] : NULL; }

extern "C" int ds4_cuda_pipe_recv(ds4_cuda_pipe *p, size_t floats, ds4_err *err) {
    if (!p->in || floats > p->floats)
        return ds4_err_set(err, DS4_EINVAL, "GPU %d: a receive of %zu floats (room for %zu)", p->gpu, floats,
                           p->in ? p->floats : 0);
    CU_TRY(cudaSetDevice(p->gpu));
    if (start(p->c, false, p->in, floats, p->rank, p->st, err)) return -1;
    CU_TRY(cudaEventRecord(p->ev_in, p->st));
    return 0;
}

extern "C" int ds4_cuda_pipe_send(ds4_cuda_pipe *p, uint32_t k, size_t floats, ds4_err *err) {
    if (k >= p->n_out || floats > p->floats)
        return ds4_err_set(err, DS4_EINVAL, "GPU %d: a send of %zu floats from buffer %u", p->gpu, floats, k);
    CU_TRY(cudaSetDevice(p->gpu));
    if (start(p->c, true, p->out[k], floats, p->rank, p->st, err)) return -1;
    CU_TRY(cudaEventRecord(p->ev_out[k], p->st));
    return 0;
}

/* 1 when the event's transfers are done, 0 while they run. */
static int event_done(ds4_cuda_pipe *p, cudaEvent_t e, ds4_err *err) {
    CU_TRY(cudaSetDevice(p->gpu));
    cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) return 0;
    CU_TRY(r);
    return 1;
}

extern "C" int ds4_cuda_pipe_recv_done(ds4_cuda_pipe *p, ds4_err *err) { return event_done(p, p->ev_in, err); }

extern "C" int ds4_cuda_pipe_send_done(ds4_cuda_pipe *p, uint32_t k, ds4_err *err) {
    return k < p->n_out ? event_done(p, p->ev_out[k], err) : 1;
}
