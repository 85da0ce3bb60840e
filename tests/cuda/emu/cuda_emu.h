/*
 * cuda_emu.h - a CPU emulation of the subset of CUDA the ds4 CUDA backend
 * uses, so its kernels can be run and checked on machines without a GPU
 * (this development machine, CI).
 *
 * The backend's .cu files are compiled as plain C++ with -DDS4_CUDA_EMU;
 * src/model/cuda/cuda_rt.h then includes this header instead of the CUDA
 * runtime.  A kernel launch runs the grid block by block; the threads of a
 * block are fibers (cooperative coroutines) that switch only at block or
 * warp barriers, so __syncthreads, __syncwarp, the shuffles, ballots and the
 * warp-wide matrix instructions have their real semantics: a value crosses
 * lanes only through an exchange between two warp barriers.  Launch
 * configurations are checked against the limits of the hardware (block and
 * grid sizes, shared memory), stream capture records launches and copies
 * into graphs that replay them, and a synchronous call made while capturing
 * is an error, as on a GPU.
 *
 * Several GPUs (DS4_EMU_GPUS, DS4_EMU_GPU_MEM; cuda_emu.cpp) each have
 * their memory and streams: a kernel sent to a stream of another device
 * than the thread's current one is an error, as on a GPU.  A launch can be
 * made to fail (DS4_EMU_FAIL_LAUNCH) to test what a program does then.  Threads may
 * launch at once (a program with a thread a GPU); kernels then run one at
 * a time.  The part of NCCL the programs use is emulated beside it
 * (nccl_emu.h).
 *
 * What it cannot show: timing, memory-model races between blocks (blocks run
 * one after another), and anything the hardware does differently in
 * floating point (the emulation rounds like the host CPU).  Build it with
 * AddressSanitizer to catch out-of-bounds device accesses.
 */
#ifndef DS4_CUDA_EMU_H
#define DS4_CUDA_EMU_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>

/* ------------------------------------------------------------ keywords */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__   static
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

/* --------------------------------------------------------------- types */

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
    unsigned x, y, z;
};

struct __align__(8) float2 {
    float x, y;
};
struct __align__(16) float4 {
    float x, y, z, w;
};
struct __align__(8) int2 {
    int x, y;
};
struct __align__(16) int4 {
    int x, y, z, w;
};
struct __align__(8) uint2 {
    unsigned x, y;
};
struct __align__(16) uint4 {
    unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

typedef int cudaError_t;
enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorNotReady = 600,
    cudaErrorLaunchFailure = 719
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost,
    cudaMemcpyHostToDevice,
    cudaMemcpyDeviceToHost,
    cudaMemcpyDeviceToDevice,
    cudaMemcpyDefault
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal,
    cudaStreamCaptureModeThreadLocal,
    cudaStreamCaptureModeRelaxed
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
#define cudaStreamNonBlocking  1u
#define cudaEventDisableTiming 2u

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef struct emu_graph *cudaGraph_t;
typedef struct emu_graph *cudaGraphExec_t;
typedef void (*cudaHostFn_t)(void *userData);
#define CUDART_CB

struct cudaDeviceProp {
    char name[256];
    int multiProcessorCount;
    size_t totalGlobalMem;
    size_t sharedMemPerBlockOptin;
    int l2CacheSize;
    int major, minor;
    int memoryBusWidth;
    int memoryClockRate;
};

/* ------------------------------------------------------ thread indices */

struct emu_fiber;
struct emu_block_ctx {
    uint3 bid;
    dim3 bdim, gdim;
    unsigned char *dyn_smem;
};
extern emu_block_ctx emu_blk;
extern emu_fiber *emu_cur;
const uint3 &emu_thread_idx();

#define threadIdx (emu_thread_idx())
#define blockIdx  (emu_blk.bid)
#define blockDim  (emu_blk.bdim)
#define gridDim   (emu_blk.gdim)
#define warpSize  32

/* --------------------------------------------------- barriers and lanes */

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
int __syncthreads_or(int pred);
int __syncthreads_count(int pred);
/* bar.sync id, nthreads (id > 0): a barrier of part of the block */
void emu_bar_sync(unsigned id, unsigned nthreads);
/* Exchange one 64-bit word per lane of the calling warp: returns the word
 * deposited by lane `src` (an index inside the warp). */
uint64_t emu_warp_exchange(uint64_t mine, unsigned src);
/* Deposit `n` words per lane (n <= 16) and return a pointer to the warp's
 * 32 x 16 table (lane-major), valid until the lane's next exchange but one. */
const uint32_t *emu_warp_gather(const uint32_t *mine, int n);

/* Every binary16 value as a float (ds4_f16_to_f32 of each bit pattern),
 * filled before main: the emulated tensor-core products convert each of
 * their operands, and a table read is several times cheaper than the
 * conversion's branches (the suite's emulated steps spend most of their
 * time in these products). */
extern float emu_f16_table[65536];
unsigned emu_lane();

template <typename T> static inline uint64_t emu_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 64 bits");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    return b;
}
template <typename T> static inline T emu_from_bits(uint64_t b) {
    T v;
    memcpy(&v, &b, sizeof(T));
    return v;
}
template <typename T> T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    unsigned lane = emu_lane();
    unsigned src = ((lane ^ (unsigned)mask) & (unsigned)(width - 1)) | (lane & ~(unsigned)(width - 1));
    return emu_from_bits<T>(emu_warp_exchange(emu_bits(v), src));
}
template <typename T> T __shfl_sync(unsigned, T v, int srcLane, int width = 32) {
    unsigned lane = emu_lane();
    unsigned src = (lane & ~(unsigned)(width - 1)) | ((unsigned)srcLane & (unsigned)(width - 1));
    return emu_from_bits<T>(emu_warp_exchange(emu_bits(v), src));
}
template <typename T> T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned lane = emu_lane();
    unsigned in_seg = lane & (unsigned)(width - 1);
    unsigned src = in_seg + delta < (unsigned)width ? lane + delta : lane;
    return emu_from_bits<T>(emu_warp_exchange(emu_bits(v), src));
}
template <typename T> T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
    unsigned lane = emu_lane();
    unsigned in_seg = lane & (unsigned)(width - 1);
    unsigned src = in_seg >= delta ? lane - delta : lane;
    return emu_from_bits<T>(emu_warp_exchange(emu_bits(v), src));
}
unsigned __ballot_sync(unsigned mask, int pred);
int __any_sync(unsigned mask, int pred);
/* redux.sync: the largest / smallest value over the warp's live lanes */
unsigned __reduce_max_sync(unsigned mask, unsigned v);
unsigned __reduce_min_sync(unsigned mask, unsigned v);
int __all_sync(unsigned mask, int pred);

/* ----------------------------------------------------------- intrinsics */

static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 255u) << (8 * i);
    return r;
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint8_t b[8];
    for (int i = 0; i < 4; i++) {
        b[i] = (uint8_t)(x >> (8 * i));
        b[4 + i] = (uint8_t)(y >> (8 * i));
    }
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)b[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline float __int_as_float(int x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline int __float_as_int(float f) {
    int x;
    memcpy(&x, &f, 4);
    return x;
}
static inline float __uint_as_float(unsigned x) {
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned x;
    memcpy(&x, &f, 4);
    return x;
}
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
static inline void __threadfence() {}
static inline void __threadfence_block() {}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

/* Fibers never switch inside an ordinary statement, so plain
 * read-modify-write is atomic here. */
template <typename T> static inline T atomicAdd(T *p, T v) {
    T o = *p;
    *p = o + v;
    return o;
}
template <typename T> static inline T atomicMax(T *p, T v) {
    T o = *p;
    if (v > o) *p = v;
    return o;
}
template <typename T> static inline T atomicMin(T *p, T v) {
    T o = *p;
    if (v < o) *p = v;
    return o;
}
template <typename T> static inline T atomicExch(T *p, T v) {
    T o = *p;
    *p = v;
    return o;
}
template <typename T> static inline T atomicOr(T *p, T v) {
    T o = *p;
    *p = o | v;
    return o;
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v) {
    T o = *p;
    if (o == cmp) *p = v;
    return o;
}

/* ------------------------------------------------------------ runtime */

cudaError_t cudaMalloc(void **p, size_t n);
template <typename T> cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
template <typename T> cudaError_t cudaMallocHost(T **p, size_t n) { return cudaMallocHost((void **)p, n); }
#define cudaHostAllocPortable 1u
#define cudaHostAllocMapped   2u
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
template <typename T> cudaError_t cudaHostAlloc(T **p, size_t n, unsigned flags) {
    return cudaHostAlloc((void **)p, n, flags);
}
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *dst, int v, size_t n);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
/* A host function in stream order (run in place, or recorded while the
 * stream is captured). */
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphUpload(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
template <typename F> cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }

/* Run (or record, while the stream is being captured) one launch. */
void emu_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body, const char *name);

/* A kernel's pointer argument into memory of another device than the
 * current one stops the program (a GPU would fault, or read the peer's
 * memory over the link without the access enabled). */
void emu_check_arg_device(const void *p, const char *kernel);
template <typename T> static inline void emu_check_arg(const T &, const char *) {}
template <typename T> static inline void emu_check_arg(T *const &p, const char *kernel) {
    emu_check_arg_device((const void *)p, kernel);
}

/* A launch as CUDA does it: the arguments are converted to the kernel's
 * parameter types and copied now, when the launch is made. */
template <typename... P, typename... A>
void emu_launch_kernel(dim3 grid, dim3 block, size_t smem, cudaStream_t s, const char *name, void (*k)(P...),
                       A &&...args) {
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    std::apply([name](const auto &...a) { (emu_check_arg(a, name), ...); }, params);
    emu_launch(
        grid, block, smem, s, [k, params]() { std::apply(k, params); }, name);
}

/* Number of kernel launches and fiber switches so far (for tests). */
uint64_t emu_launch_count();

/* Work on a stream that only another thread's call completes: an emulated
 * NCCL transfer, which waits for its peer's (nccl_emu.cpp).  Each stream's
 * such work runs in order: the oldest unfinished one is tried (try_run:
 * true once it is done) whenever any is issued or finished, under the
 * emulation's lock.  Meanwhile work issued to the stream after it waits
 * for it, an event recorded after it is not complete and cudaStreamQuery
 * says cudaErrorNotReady - as a GPU's stream behind a transfer. */
void emu_stream_defer(cudaStream_t s, std::function<bool()> try_run);
/* The same for work a capture records (an emulated NCCL collective): make()
 * makes the work when the stream reaches it - now, or on a captured stream
 * at each run of the graph, whose later operations then wait for it. */
void emu_stream_defer_each(cudaStream_t s, std::function<std::function<bool()>()> make);
/* fn under that lock, then every stream's oldest deferred work tried again. */
void emu_deferred_update(const std::function<void()> &fn);
/* The device of a stream, and of the allocation holding [p, p + bytes)
 * (-1: no device allocation holds it). */
int emu_stream_device(cudaStream_t s);
int emu_mem_device(const void *p, size_t bytes);

#endif
