/*
 * nccl_emu.h - the part of NCCL's API (nccl.h) the ds4 programs use, for
 * the CPU emulation of CUDA (cuda_emu.h): a clique of communicators over
 * the emulated GPUs of one process, point-to-point transfers between
 * them and the sum over all of them (ncclAllReduce).  Names, types and values are NCCL's, so that the code which calls
 * them compiles against either; src/model/cuda/cuda_nccl.cu takes these
 * in an emulation build where a GPU build loads libnccl.so.2.
 */
#ifndef DS4_NCCL_EMU_H
#define DS4_NCCL_EMU_H

#include "cuda_emu.h"

typedef struct emu_nccl_comm *ncclComm_t;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclFloat32 = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;

ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
/* Every rank's count floats summed, in rank order, into every rank's
 * recvbuff (sendbuff == recvbuff: in place); the k-th all-reduce of each
 * rank are one.  On a stream being captured it is recorded, and each run
 * of the graph makes one. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
const char *ncclGetErrorString(ncclResult_t result);

#endif
