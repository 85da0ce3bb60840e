/*
 * nccl_emu.cpp - NCCL's point-to-point transfers and all-reduce between
 * the emulated GPUs of one process (nccl_emu.h), for the CPU emulation of
 * CUDA.
 *
 * A transfer is deferred work on its stream (cuda_emu.h, emu_stream_defer):
 * it starts when it is its stream's oldest unfinished work, as NCCL's
 * kernels run in stream order, and both ends complete once the peer's
 * matching transfer has started too - the receive's buffer then holds the
 * send's bytes.  Until then the streams wait, as a GPU's do.  An
 * all-reduce is the same kind of work: the k-th of each rank are one, which
 * completes once every rank's has started, each rank's buffer then holding
 * the sum of all ranks' in rank order (the same bits on every rank, as
 * NCCL's).
 *
 * What NCCL requires is checked, and a breach ends the program with a
 * message (on a GPU it would hang or fault): distinct devices in a clique,
 * a stream and buffers of the communicator's device, a send and its
 * receive of one count, an all-reduce of one count on every rank, a peer
 * other than oneself, no communicator destroyed while its transfers wait.  ncclCommAbort ends the clique's
 * waiting transfers.
 */
#include "nccl_emu.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

/* One transfer: a send (src) or a receive (dst) between ranks from -> to. */
struct nccl_op {
    int from, to;
    const void *src;
    void *dst;
    size_t bytes;
    bool started, done;
    std::shared_ptr<size_t> unfinished; /* its communicator's count, which may be gone before it is */
};

/* One rank's part of an all-reduce. */
struct nccl_red {
    int rank;
    const float *src;
    float *dst;
    size_t count;
    bool started, done;
    std::shared_ptr<size_t> unfinished;
};

/* The k-th all-reduce of the clique: the parts of the ranks that started it. */
struct nccl_coll {
    std::vector<std::shared_ptr<nccl_red>> part; /* by rank; null: not started */
    size_t joined;
};

/* The communicators of one ncclCommInitAll; touched under the emulation's
 * lock only (emu_stream_defer, emu_deferred_update). */
struct emu_clique {
    std::vector<int> devs;
    std::vector<std::shared_ptr<nccl_op>> started; /* started, not done, oldest first */
    std::vector<uint64_t> reduces;                 /* by rank: all-reduces started */
    std::map<uint64_t, nccl_coll> colls;           /* the all-reduces some rank has not started */
    bool aborted;
};

struct emu_nccl_comm {
    std::shared_ptr<emu_clique> clique;
    int rank;
    std::shared_ptr<size_t> unfinished; /* its transfers issued and not done */
};

static void nccl_die(const char *what) {
    fprintf(stderr, "nccl-emu: %s\n", what);
    abort();
}

static void finish(nccl_op *op) {
    op->done = true;
    (*op->unfinished)--;
}

/* An op at the head of its stream: started, and matched with its peer's
 * when that one has started too. */
static bool try_transfer(emu_clique *cl, const std::shared_ptr<nccl_op> &op) {
    if (op->done) return true;
    if (cl->aborted) {
        finish(op.get());
        return true;
    }
    if (!op->started) {
        op->started = true;
        cl->started.push_back(op);
    }
    for (size_t i = 0; i < cl->started.size(); i++) {
        nccl_op *q = cl->started[i].get();
        if (q == op.get() || q->from != op->from || q->to != op->to || (q->dst == nullptr) == (op->dst == nullptr))
            continue;
        nccl_op *send = op->dst ? q : op.get(), *recv = op->dst ? op.get() : q;
        if (send->bytes != recv->bytes) {
            char msg[160];
            snprintf(msg, sizeof(msg), "rank %d sends %zu bytes to rank %d, which receives %zu", send->from,
                     send->bytes, send->to, recv->bytes);
            nccl_die(msg);
        }
        memcpy(recv->dst, send->src, send->bytes);
        finish(send);
        finish(recv);
        cl->started.erase(std::remove_if(cl->started.begin(), cl->started.end(),
                                         [](const std::shared_ptr<nccl_op> &o) { return o->done; }),
                          cl->started.end());
        return true;
    }
    return false;
}

static void finish_red(nccl_red *op) {
    op->done = true;
    (*op->unfinished)--;
}

/* The sums of a complete all-reduce, into every rank's buffer (which may be
 * its source: every source is read first). */
static void reduce(nccl_coll &c) {
    size_t count = c.part[0]->count;
    std::vector<float> sum(count);
    for (size_t i = 0; i < count; i++) {
        float acc = c.part[0]->src[i];
        for (size_t r = 1; r < c.part.size(); r++) acc += c.part[r]->src[i];
        sum[i] = acc;
    }
    for (auto &p : c.part) {
        memcpy(p->dst, sum.data(), count * sizeof(float));
        finish_red(p.get());
    }
}

/* A rank's all-reduce at the head of its stream: started (its place among
 * the rank's all-reduces is the next), and done when every rank's is. */
static bool try_reduce(emu_clique *cl, const std::shared_ptr<nccl_red> &op) {
    if (op->done) return true;
    if (cl->aborted) {
        finish_red(op.get());
        return true;
    }
    if (op->started) return false;
    op->started = true;
    uint64_t k = cl->reduces[(size_t)op->rank]++;
    nccl_coll &c = cl->colls[k];
    if (c.part.empty()) c.part.resize(cl->devs.size());
    for (auto &p : c.part)
        if (p && p->count != op->count) {
            char msg[160];
            snprintf(msg, sizeof(msg), "all-reduce %llu: rank %d sums %zu floats, rank %d %zu",
                     (unsigned long long)k, p->rank, p->count, op->rank, op->count);
            nccl_die(msg);
        }
    c.part[(size_t)op->rank] = op;
    if (++c.joined < c.part.size()) return false;
    reduce(c);
    cl->colls.erase(k);
    return true;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist) {
    int count = 0;
    cudaGetDeviceCount(&count);
    if (ndev < 1) return ncclInvalidArgument;
    auto cl = std::make_shared<emu_clique>();
    for (int i = 0; i < ndev; i++) {
        int d = devlist ? devlist[i] : i;
        if (d < 0 || d >= count) return ncclInvalidArgument;
        for (int j = 0; j < i; j++)
            if (cl->devs[j] == d) return ncclInvalidUsage; /* NCCL: "Duplicate GPU detected" */
        cl->devs.push_back(d);
    }
    cl->aborted = false;
    cl->reduces.assign((size_t)ndev, 0);
    for (int i = 0; i < ndev; i++) comm[i] = new emu_nccl_comm{cl, i, std::make_shared<size_t>(0)};
    return ncclSuccess;
}

static ncclResult_t post(const void *src, void *dst, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                         cudaStream_t stream) {
    if (!comm || type != ncclFloat32) return ncclInvalidArgument;
    emu_clique *cl = comm->clique.get();
    int dev = cl->devs[(size_t)comm->rank], n = (int)cl->devs.size();
    if (peer < 0 || peer >= n || peer == comm->rank) nccl_die("a transfer's peer is not another rank of the clique");
    if (emu_stream_device(stream) != dev) nccl_die("a transfer on a stream of another device than its communicator's");
    size_t bytes = count * sizeof(float);
    if (emu_mem_device(src ? src : dst, bytes) != dev)
        nccl_die("a transfer's buffer is not device memory of its communicator's device");
    auto op = std::make_shared<nccl_op>(nccl_op{src ? comm->rank : peer, src ? peer : comm->rank, src, dst, bytes,
                                                false, false, comm->unfinished});
    std::shared_ptr<emu_clique> keep = comm->clique;
    emu_deferred_update([comm] { (*comm->unfinished)++; });
    emu_stream_defer(stream, [keep, op] { return try_transfer(keep.get(), op); });
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return post(sendbuff, nullptr, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return post(nullptr, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!comm || datatype != ncclFloat32 || op != ncclSum) return ncclInvalidArgument;
    int dev = comm->clique->devs[(size_t)comm->rank];
    size_t bytes = count * sizeof(float);
    if (emu_stream_device(stream) != dev) nccl_die("an all-reduce on a stream of another device than its communicator's");
    if (emu_mem_device(sendbuff, bytes) != dev || emu_mem_device(recvbuff, bytes) != dev)
        nccl_die("an all-reduce's buffer is not device memory of its communicator's device");
    std::shared_ptr<emu_clique> keep = comm->clique;
    std::shared_ptr<size_t> unfinished = comm->unfinished;
    int rank = comm->rank;
    const float *src = (const float *)sendbuff;
    float *dst = (float *)recvbuff;
    emu_stream_defer_each(stream, [keep, unfinished, rank, src, dst, count]() -> std::function<bool()> {
        auto red = std::make_shared<nccl_red>(nccl_red{rank, src, dst, count, false, false, unfinished});
        emu_deferred_update([unfinished] { (*unfinished)++; });
        return [keep, red] { return try_reduce(keep.get(), red); };
    });
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    size_t left = 0;
    emu_deferred_update([comm, &left] { left = *comm->unfinished; });
    if (left) nccl_die("ncclCommDestroy of a communicator whose transfers wait (abort it instead)");
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    emu_deferred_update([comm] {
        emu_clique *cl = comm->clique.get();
        cl->aborted = true;
        for (auto &op : cl->started) finish(op.get());
        cl->started.clear();
        for (auto &c : cl->colls)
            for (auto &p : c.second.part)
                if (p && !p->done) finish_red(p.get());
        cl->colls.clear();
    });
    delete comm;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "emulated NCCL error";
    }
}
