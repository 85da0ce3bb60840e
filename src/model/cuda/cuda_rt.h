/*
 * cuda_rt.h - what every .cu file of the CUDA backend includes: the CUDA
 * runtime (or, with -DDS4_CUDA_EMU, the CPU emulation of tests/cuda/emu/
 * that runs these same sources without a GPU), the launch macro both
 * understand, error checking, and the small device helpers shared by the
 * kernels (narrow float conversions, warp reductions, the integer and half
 * tensor-core instructions).
 *
 * Device code must not depend on which of the two it is compiled for,
 * except through the helpers here.
 */
#ifndef DS4_MODEL_CUDA_CUDA_RT_H
#define DS4_MODEL_CUDA_CUDA_RT_H

#include <stddef.h>
#include <stdint.h>

#ifdef DS4_CUDA_EMU
#include <stdio.h>
#include <stdlib.h>

#include "cuda_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

extern "C" {
#include "base/error.h"
#include "base/fp.h"
}

/* kernel<<<grid, block, smem, stream>>>(args...) in either build. */
#ifdef DS4_CUDA_EMU
/* clang-format off */
#define DS4_LAUNCH(kern, grid, block, smem, stream, ...) \
    emu_launch_kernel((grid), (block), (smem), (stream), #kern, kern, __VA_ARGS__)
/* clang-format on */
#define DS4_DYN_SMEM(type, name) type *name = reinterpret_cast<type *>(emu_blk.dyn_smem)
#elif defined(DS4_CUDA_DEV)
/* clang-format off */
#define DS4_LAUNCH(kern, grid, block, smem, stream, ...)                                     \
    do {                                                                                      \
        if (ds4_ablate && ds4_ablated(#kern, dim3(grid), stream)) break;                      \
        if (ds4_prof_on) ds4_prof_before(stream);                                             \
        ds4_launch_status = ds4_launch_chained(kern, (grid), (block), (smem), (stream), __VA_ARGS__); \
        if (ds4_prof_on) ds4_prof_after(#kern, dim3(grid), stream);                           \
    } while (0)
/* clang-format on */
#else
/* clang-format off */
#define DS4_LAUNCH(kern, grid, block, smem, stream, ...)                                             \
    do {                                                                                              \
        ds4_launch_status = ds4_launch_chained(kern, (grid), (block), (smem), (stream), __VA_ARGS__); \
    } while (0)
/* clang-format on */
#endif
#ifndef DS4_CUDA_EMU
/* clang-format off */
#define DS4_DYN_SMEM(type, name)                                   \
    extern __shared__ __align__(16) unsigned char ds4_dyn_smem[]; \
    type *name = reinterpret_cast<type *>(ds4_dyn_smem)
/* clang-format on */
#endif

/* Programmatic dependent launch (Hopper): every kernel is launched so that
 * it may be scheduled while the kernel before it in the stream (or graph)
 * is still running.  Its blocks then wait in dev_pdl_enter() until that
 * kernel has finished and its writes are visible, so the launch latency and
 * the block ramp-up of each of the ~900 launches of a decode step overlap
 * the tail of the previous kernel instead of following it.  The ordering is
 * still strict: every kernel waits before it touches memory that an earlier
 * kernel writes or reads, and a kernel completes only after its own wait,
 * so the chain is transitive (docs/DESIGN.md 4.4). */
#ifndef DS4_CUDA_EMU
extern thread_local cudaError_t ds4_launch_status; /* of the last DS4_LAUNCH, read by CU_LAUNCHED */
template <typename... P, typename... A>
static inline cudaError_t ds4_launch_chained(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                             A &&...args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, static_cast<P>(args)...);
}
#endif

/* At the top of every kernel: let the next kernel of the stream be
 * scheduled, then wait for the previous one (no-ops without a programmatic
 * dependency, and in the emulation, where launches run one after another). */
static __device__ __forceinline__ void dev_pdl_launch_next() {
#if !defined(DS4_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void dev_pdl_wait_prev() {
#if !defined(DS4_CUDA_EMU) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* A barrier of `nthreads` threads of the block (whole warps), id 1..15:
 * lets some warps go on without the others (which must not use the id). */
static __device__ __forceinline__ void dev_bar_sync(unsigned id, unsigned nthreads) {
#if defined(DS4_CUDA_EMU)
    emu_bar_sync(id, nthreads);
#else
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
#endif
}
static __device__ __forceinline__ void dev_pdl_enter() {
    dev_pdl_launch_next();
    dev_pdl_wait_prev();
}
/* A launch's position (*pos, the decode step's) across its PDL wait:
 * read before the wait where `early` says that no kernel of the launch's
 * graph writes it (cu_pos_early), so that what it addresses need not wait
 * for a load after the wait; else after it.  Waits for the previous
 * kernel. */
static __device__ __forceinline__ uint32_t dev_pdl_wait_pos(const uint32_t *pos, bool early) {
    uint32_t v = early ? *pos : 0;
    dev_pdl_wait_prev();
    return early ? v : *pos;
}
/* The "last block" of a launch whose blocks each leave partial results
 * for one of them to combine: every thread calls it after writing its
 * part; it returns true in the block that counted itself done last, and
 * resets *count to 0 for the next launch.  After the barrier, thread 0
 * adds to the counter with release and acquire semantics at device scope:
 * the release publishes every write the barrier ordered before it (its
 * block's parts), the acquire makes the last block see all the others'
 * (read them through the L2, __ldcg, not a stale L1).  One such atomic
 * replaces a sequentially consistent fence (MEMBAR.SC) in every thread
 * before and after the count. */
static __device__ __forceinline__ bool dev_last_block(uint32_t *count, uint32_t nblocks) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t old;
#ifdef DS4_CUDA_EMU
        old = atomicAdd(count, 1u);
#else
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
#endif
        last = old == nblocks - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    return last;
}

/* Kernel timing for development (developer builds only, -DDS4_CUDA_DEV:
 * `make cuda-dev`; DS4_CUDA_PROFILE=1, cuda_prof.cu): when on, every launch
 * outside a graph capture is bracketed by events, and the backend prints
 * the time per kernel (with 2: per kernel and grid) after each prefill and
 * greedy run.  A release build has none of it: ds4_prof_on is a constant
 * false there, and ds4_prof_report does nothing. */
#if defined(DS4_CUDA_DEV) && !defined(DS4_CUDA_EMU)
extern bool ds4_prof_on, ds4_prof_grids;
void ds4_prof_before(cudaStream_t st);
void ds4_prof_after(const char *name, dim3 grid, cudaStream_t st);

/* Ablation for development (developer builds only; DS4_CUDA_ABLATE,
 * cuda_prof.cu): launches captured into the decode graph whose kernel name
 * contains one of the '+'-separated tokens (NAME, or NAME@X for grid.x = X
 * only) are left out, so that a benchmark shows what they cost the step.
 * The step's results are then wrong: for timing only, which is why no
 * release binary can be made to do it. */
extern const char *ds4_ablate;
bool ds4_ablated(const char *name, dim3 grid, cudaStream_t st);
#else
static constexpr bool ds4_prof_on = false;
#endif
void ds4_prof_report(const char *title);

/* Turn a CUDA error into a ds4 error naming the call and the place. */
static inline int ds4_cuda_check(cudaError_t e, const char *what, const char *file, int line, ds4_err *err) {
    if (e == cudaSuccess) return 0;
    return ds4_err_set(err, DS4_EIO, "CUDA: %s failed at %s:%d: %s", what, file, line, cudaGetErrorString(e));
}
/* clang-format off */
#define CU_TRY(call)                                                              \
    do {                                                                          \
        if (ds4_cuda_check((call), #call, __FILE__, __LINE__, err) != 0) return -1; \
    } while (0)
/* clang-format on */

/* A host-to-device copy that has landed when this returns.  cudaMemcpy
 * from pageable memory returns once the bytes are staged, and runs on the
 * legacy default stream, which the backend's non-blocking streams neither
 * wait for nor hold back: a kernel launched next could read the old bytes
 * (the same holds for cudaMemset, which the backend issues on its own
 * stream instead). */
static inline cudaError_t cu_upload(void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

/* cudaMalloc for the backend's large blocks (weights, session state, pass
 * buffers): when the device has no room, the error says what needed how
 * much and how much the device has, which is what a user can act on (a
 * smaller recipe, a shorter context, a smaller chunk). */
static inline int cu_dev_alloc(void **p, size_t bytes, const char *what, ds4_err *err) {
    if (cudaMalloc(p, bytes ? bytes : 256) == cudaSuccess) return 0;
    (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
    *p = NULL;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        free_b = total_b = 0;
    }
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return ds4_err_set(err, DS4_ENOMEM, "CUDA: no room for %.2f GiB of %s on the device (%.2f GiB free of %.2f GiB)",
                       (double)bytes / gib, what, (double)free_b / gib, (double)total_b / gib);
}
/* The most GPUs a process uses (a backend's ds4_backend_opts.gpu is below
 * it), and the calling thread's current one: the index of what is kept a
 * device - a kernel's attributes, tables in its memory. */
#define CU_MAX_DEVICES 64
static inline int cu_current_device() {
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess || d < 0 || d >= CU_MAX_DEVICES) d = 0;
    return d;
}

/* Let kernel KERN take `bytes` of dynamic shared memory (past the default
 * 48 KiB) on the current GPU; each kernel keeps the most granted so far
 * on each GPU, so the attribute is set once a size, not before every
 * launch. */
template <auto KERN> static inline int cu_allow_smem(size_t bytes, ds4_err *err) {
    static size_t allowed[CU_MAX_DEVICES];
    int dev = cu_current_device();
    if (bytes <= allowed[dev]) return 0;
    CU_TRY(cudaFuncSetAttribute(KERN, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    allowed[dev] = bytes;
    return 0;
}
/* After a launch: configuration errors show up here. */
#ifdef DS4_CUDA_EMU
#define CU_LAUNCHED() CU_TRY(cudaGetLastError())
#else
/* clang-format off */
#define CU_LAUNCHED()                                                   \
    do {                                                                \
        cudaError_t launch_e = ds4_launch_status;                       \
        ds4_launch_status = cudaSuccess;                                \
        CU_TRY(launch_e != cudaSuccess ? launch_e : cudaGetLastError()); \
    } while (0)
/* clang-format on */
#endif

/* -------------------------------------------------- device helpers */

static __device__ __forceinline__ float dev_f16(uint16_t h) {
#ifdef DS4_CUDA_EMU
    return emu_f16_table[h];
#else
    return __half2float(__ushort_as_half(h));
#endif
}

static __device__ __forceinline__ float dev_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Round through IEEE binary16 (nearest even), as ds4_f16_round. */
static __device__ __forceinline__ float dev_f16_round(float x) {
#ifdef DS4_CUDA_EMU
    return ds4_f16_round(x);
#else
    return __half2float(__float2half_rn(x));
#endif
}

static __device__ __forceinline__ uint16_t dev_to_f16(float x) {
#ifdef DS4_CUDA_EMU
    return ds4_f32_to_f16(x);
#else
    return __half_as_ushort(__float2half_rn(x));
#endif
}

/* PTX prmt.b32 in its default mode: byte k of the result is byte
 * (s >> 4 k) & 7 of the pair (a, b), or that byte's sign replicated when
 * bit 3 of the nibble is set.  __byte_perm promises the plain selection
 * for any nibble, so the compiler masks its selector first; callers whose
 * nibbles never have bit 3 set use this and save that instruction. */
static __device__ __forceinline__ uint32_t dev_prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifdef DS4_CUDA_EMU
    uint32_t r = 0;
    for (int k = 0; k < 4; k++) {
        uint32_t nib = (s >> (4 * k)) & 15, byte = __byte_perm(a, b, nib & 7) & 255;
        if (nib & 8) byte = (byte & 128) ? 255 : 0;
        r |= byte << (8 * k);
    }
    return r;
#else
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
    return r;
#endif
}

/* c + the dot product of the unsigned bytes of w and the signed bytes of x. */
static __device__ __forceinline__ int dev_dp4a_us(uint32_t w, int x, int c) {
#ifdef DS4_CUDA_EMU
    for (int i = 0; i < 4; i++) c += (int)(uint8_t)(w >> (8 * i)) * (int)(int8_t)(x >> (8 * i));
    return c;
#else
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(w), "r"(x), "r"(c));
    return r;
#endif
}

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
/* N values each summed over the warp as warp_sum sums it (the same
 * butterfly: the same bits), and N ints each added to lane ^ 1's: N
 * shuffles a step on the GPU, one exchange of N words in the emulation,
 * whose cost is its exchanges (each a switch of every lane's fiber). */
template <int N> static __device__ __forceinline__ void warp_sum_n(float (&v)[N]) {
#ifdef DS4_CUDA_EMU
    static_assert(N <= 16, "an exchange holds 16 words a lane");
    unsigned lane = emu_lane();
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t mine[N];
        memcpy(mine, v, sizeof(mine));
        const uint32_t *all = emu_warp_gather(mine, N);
        for (int i = 0; i < N; i++) {
            float w;
            memcpy(&w, &all[(lane ^ (unsigned)o) * 16 + i], sizeof(w));
            v[i] += w;
        }
    }
#else
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = warp_sum(v[i]);
#endif
}
template <int N> static __device__ __forceinline__ void warp_pair_add_n(int (&v)[N]) {
#ifdef DS4_CUDA_EMU
    static_assert(N <= 16, "an exchange holds 16 words a lane");
    uint32_t mine[N];
    memcpy(mine, v, sizeof(mine));
    const uint32_t *all = emu_warp_gather(mine, N);
    unsigned other = emu_lane() ^ 1u;
    for (int i = 0; i < N; i++) v[i] += (int)all[other * 16 + i];
#else
#pragma unroll
    for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], 1);
#endif
}
static __device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
 * gets the result.  `scratch` holds 32 values. */
template <typename T> static __device__ __forceinline__ T block_sum(T v, T *scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    unsigned w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads(); /* scratch may still be read from a previous call */
    if ((threadIdx.x & 31) == 0) scratch[w] = v;
    __syncthreads();
    T r = 0;
    for (unsigned i = 0; i < nw; i++) r += scratch[i]; /* fixed order: same bits in every thread */
    return r;
}
static __device__ __forceinline__ float block_max(float v, float *scratch) {
    v = warp_max(v);
    unsigned w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[w] = v;
    __syncthreads();
    float r = scratch[0];
    for (unsigned i = 1; i < nw; i++) r = fmaxf(r, scratch[i]);
    return r;
}

/* D = A * B + C on int8 tensor cores, m16n8k32 (PTX ISA "Matrix Fragments
 * for mma.m16n8k32"): with g = lane / 4 and t = lane % 4,
 *   a[0]: A row g,   cols 4t..4t+3      a[1]: A row g+8, cols 4t..4t+3
 *   a[2]: A row g,   cols 16+4t..       a[3]: A row g+8, cols 16+4t..
 *   b[0]: B rows 4t..4t+3, col g        b[1]: B rows 16+4t.., col g
 *   c[0], c[1]: D row g, cols 2t, 2t+1  c[2], c[3]: D row g+8, cols 2t, 2t+1
 * (bytes in a register are consecutive columns / rows, lowest first). */
static __device__ __forceinline__ void mma_s8_16x8x32(int c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef DS4_CUDA_EMU
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const uint32_t *all = emu_warp_gather(mine, 6);
    unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
    /* A[row][k] and B[k][col] read back from the lanes that hold them */
    auto A = [&](unsigned row, unsigned k) -> int {
        unsigned holder = (row % 8) * 4 + (k % 16) / 4;
        unsigned reg = (row >= 8 ? 1 : 0) + (k >= 16 ? 2 : 0);
        return (int)(int8_t)(all[holder * 16 + reg] >> (8 * (k % 4)));
    };
    auto B = [&](unsigned k, unsigned col) -> int {
        unsigned holder = col * 4 + (k % 16) / 4;
        unsigned reg = 4 + (k >= 16 ? 1 : 0);
        return (int)(int8_t)(all[holder * 16 + reg] >> (8 * (k % 4)));
    };
    int out[4];
    for (int i = 0; i < 4; i++) {
        unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        int s = c[i];
        for (unsigned k = 0; k < 32; k++) s += A(row, k) * B(k, col);
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) c[i] = out[i];
#else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Asynchronous copies global -> shared (cp.async, sm_80+): the copy is
 * issued without holding registers, so a kernel can fetch its next tile
 * while it computes on the current one.  cp_async16 goes around the L1
 * (both addresses 16-byte aligned), cp_async4 through it (4-byte aligned).
 * cp_async_commit closes the group of copies issued so far;
 * cp_async_wait_all waits for all of this thread's groups (a block barrier
 * must follow before other threads read the data).  The emulation copies
 * at once, which the barrier discipline makes indistinguishable. */
#ifdef DS4_CUDA_EMU
/* The alignment the hardware requires of a wide access (it traps
 * otherwise), checked by the emulation where the access goes through one
 * of these helpers. */
static inline void emu_check_aligned(const void *p, size_t n, const char *what) {
    if ((uintptr_t)p % n) {
        fprintf(stderr, "emulated CUDA: %s of %zu bytes at %p is misaligned\n", what, n, p);
        abort();
    }
}
#endif

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
#ifdef DS4_CUDA_EMU
    emu_check_aligned(smem, 16, "cp.async destination");
    emu_check_aligned(gmem, 16, "cp.async source");
    memcpy(smem, gmem, 16);
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem) : "memory");
#endif
}
static __device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
#ifdef DS4_CUDA_EMU
    emu_check_aligned(smem, 4, "cp.async destination");
    emu_check_aligned(gmem, 4, "cp.async source");
    memcpy(smem, gmem, 4);
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(gmem) : "memory");
#endif
}
/* Asks the L2 for the line of p, nothing awaited (a later load or copy of
 * it then waits for the L2 rather than for the DRAM).  The operand is a
 * global address: with a generic one (which could point at the stack)
 * ptxas kept the calling kernel's local arrays in memory around it. */
static __device__ __forceinline__ void prefetch_l2(const void *p) {
#ifdef DS4_CUDA_EMU
    (void)p;
#else
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(__cvta_generic_to_global(p)));
#endif
}
/* The number of SM ids (%nsmid: the highest id + 1, at least the SM count). */
static __device__ __forceinline__ uint32_t dev_sm_ids() {
#ifdef DS4_CUDA_EMU
    return 1;
#else
    uint32_t n;
    asm("mov.u32 %0, %%nsmid;" : "=r"(n));
    return n;
#endif
}
static __device__ __forceinline__ void cp_async_commit() {
#ifndef DS4_CUDA_EMU
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void cp_async_wait_all() {
#ifndef DS4_CUDA_EMU
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/* Bulk copies global -> shared by the tensor memory accelerator
 * (cp.async.bulk, sm_90): one thread asks for whole runs of bytes (sizes
 * and both addresses multiples of 16), which arrive without passing
 * through the threads' load units and their limit on misses in flight;
 * they complete on an mbarrier in shared memory.  One thread calls
 * bulk_begin (the barrier's init, the byte count to expect, and a proxy
 * fence: the bytes may have been written by ordinary stores that this
 * thread has acquired), then bulk_copy for each run; every thread that
 * reads the bytes calls bulk_wait, after a block barrier that orders it
 * behind bulk_begin.  A barrier serves one round of copies (phase 0).
 * The emulation copies at once. */
static __device__ __forceinline__ void bulk_begin(uint64_t *bar, uint32_t bytes) {
#ifndef DS4_CUDA_EMU
    uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n"
                 "fence.mbarrier_init.release.cluster;\n"
                 "fence.proxy.async.global;\n"
                 "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b),
                 "r"(bytes)
                 : "memory");
#endif
}
static __device__ __forceinline__ void bulk_copy(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar) {
#ifdef DS4_CUDA_EMU
    emu_check_aligned(smem, 16, "bulk copy destination");
    emu_check_aligned(gmem, 16, "bulk copy source");
    if (bytes % 16) {
        fprintf(stderr, "emulated CUDA: a bulk copy of %u bytes (not a multiple of 16)\n", bytes);
        abort();
    }
    memcpy(smem, gmem, bytes);
#else
    uint32_t d = (uint32_t)__cvta_generic_to_shared(smem), b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(d),
                 "l"(gmem), "r"(bytes), "r"(b)
                 : "memory");
#endif
}
static __device__ __forceinline__ void bulk_wait(uint64_t *bar) {
#ifndef DS4_CUDA_EMU
    uint32_t b = (uint32_t)__cvta_generic_to_shared(bar), done = 0;
    while (!done)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(b)
            : "memory");
#endif
}

#ifdef DS4_CUDA_EMU
/* The emulation of ldmatrix: every lane's row address, gathered, and the
 * row that lane src gave. */
static inline const uint32_t *emu_ldsm_gather(const void *row) {
    uint64_t p = (uint64_t)(uintptr_t)row;
    uint32_t mine[2] = {(uint32_t)p, (uint32_t)(p >> 32)};
    return emu_warp_gather(mine, 2);
}
static inline const unsigned char *emu_ldsm_row(const uint32_t *all, unsigned src) {
    return (const unsigned char *)(uintptr_t)((uint64_t)all[src * 16] | (uint64_t)all[src * 16 + 1] << 32);
}
#endif

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8 x 16-byte matrices from
 * shared memory; lane i gives the address of row i % 8 of matrix i / 8,
 * and register j of lane l receives bytes 4 (l % 4) .. 4 (l % 4) + 3 of
 * row l / 4 of matrix j (so matrix j lands as an mma fragment register). */
static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *row) {
#ifdef DS4_CUDA_EMU
    const uint32_t *all = emu_ldsm_gather(row);
    unsigned lane = emu_lane();
    for (unsigned j = 0; j < 4; j++) memcpy(&r[j], emu_ldsm_row(all, 8 * j + lane / 4) + 4 * (lane % 4), 4);
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

/* The same, transposed (.trans): register j of lane l receives the two
 * 16-bit values of column l / 4 in rows 2 (l % 4) and 2 (l % 4) + 1 of
 * matrix j, the lower row first - a B fragment of mma_f16_16x8x16 from a
 * matrix stored with k along its rows. */
static __device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *row) {
#ifdef DS4_CUDA_EMU
    const uint32_t *all = emu_ldsm_gather(row);
    unsigned lane = emu_lane();
    for (unsigned j = 0; j < 4; j++) {
        uint16_t v[2];
        for (unsigned i = 0; i < 2; i++)
            memcpy(&v[i], emu_ldsm_row(all, 8 * j + 2 * (lane % 4) + i) + 2 * (lane / 4), 2);
        r[j] = (uint32_t)v[0] | (uint32_t)v[1] << 16;
    }
#else
    uint32_t a = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

/* The same with K = 16 (PTX "Matrix Fragments for mma.m16n8k16" of the
 * 8-bit integer types), A signed, B unsigned when B_U8:
 *   a[0]: A row g, cols 4t..4t+3      a[1]: A row g+8, cols 4t..4t+3
 *   b:    B rows 4t..4t+3, col g      c as above. */
template <bool B_U8> static __device__ __forceinline__ void mma_s8_16x8x16(int c[4], const uint32_t a[2], uint32_t b) {
#ifdef DS4_CUDA_EMU
    uint32_t mine[3] = {a[0], a[1], b};
    const uint32_t *all = emu_warp_gather(mine, 3);
    unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
    int out[4];
    for (int i = 0; i < 4; i++) {
        unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        int s = c[i];
        for (unsigned k = 0; k < 16; k++) {
            uint32_t aw = all[((row % 8) * 4 + k / 4) * 16 + (row >= 8 ? 1 : 0)];
            uint32_t bw = all[(col * 4 + k / 4) * 16 + 2];
            int av = (int)(int8_t)(aw >> (8 * (k % 4)));
            int bv = B_U8 ? (int)(uint8_t)(bw >> (8 * (k % 4))) : (int)(int8_t)(bw >> (8 * (k % 4)));
            s += av * bv;
        }
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) c[i] = out[i];
#else
    if constexpr (B_U8)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.u8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                     : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b));
#endif
}

/* x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero:
 * cvt.rna), as the bits mma .tf32 reads. */
static __device__ __forceinline__ uint32_t dev_tf32(float x) {
#ifdef DS4_CUDA_EMU
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    return u;
#else
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#endif
}

/* v as a TF32 head and tail, v = h + l to about 2^-22 of v: products
 * with both keep f32 precision on the TF32 tensor cores. */
static __device__ __forceinline__ void dev_tf32_split(float v, uint32_t *h, uint32_t *l) {
    *h = dev_tf32(v);
    *l = dev_tf32(v - __uint_as_float(*h));
}

/* D = A * B + C on the TF32 tensor cores, m16n8k8 (PTX ISA "Matrix
 * Fragments for mma.m16n8k8" of .tf32), g = lane / 4, t = lane % 4:
 *   a[0]: A row g, col t    a[1]: A row g+8, col t
 *   a[2]: A row g, col t+4  a[3]: A row g+8, col t+4
 *   b[0]: B row t, col g    b[1]: B row t+4, col g    c as mma_s8_16x8x32. */
static __device__ __forceinline__ void mma_tf32_16x8x8(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef DS4_CUDA_EMU
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const uint32_t *all = emu_warp_gather(mine, 6);
    unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
    auto F = [&](unsigned holder, unsigned reg) -> float { return __uint_as_float(all[holder * 16 + reg]); };
    float out[4];
    for (int i = 0; i < 4; i++) {
        unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
        float s = c[i];
        for (unsigned k = 0; k < 8; k++)
            s += F((row % 8) * 4 + k % 4, (row >= 8 ? 1 : 0) + (k >= 4 ? 2 : 0)) *
                 F(col * 4 + k % 4, 4 + (k >= 4 ? 1 : 0));
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) c[i] = out[i];
#else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Two floats as one word of binary16 (x in the low half), each rounded
 * to nearest even: the operand form of mma_f16_16x8x16. */
static __device__ __forceinline__ uint32_t dev_f16x2(float x, float y) {
#ifdef DS4_CUDA_EMU
    return (uint32_t)ds4_f32_to_f16(x) | (uint32_t)ds4_f32_to_f16(y) << 16;
#else
    __half2 h = __floats2half2_rn(x, y);
    return *(uint32_t *)&h;
#endif
}

/* (x, y) as the binary16 head h and tail l of dev_f16x2 (x = h + l to
 * about 2^-22 of x where neither is subnormal): products with both keep
 * about the precision of f32 operands. */
static __device__ __forceinline__ void dev_f16x2_split(float x, float y, uint32_t *h, uint32_t *l) {
    *h = dev_f16x2(x, y);
    *l = dev_f16x2(x - dev_f16((uint16_t)*h), y - dev_f16((uint16_t)(*h >> 16)));
}

/* D = A * B + C on the FP16 tensor cores with f32 sums, m16n8k16 (PTX ISA
 * "Matrix Fragments for mma.m16n8k16" of .f16), g = lane / 4, t = lane % 4;
 * each register holds two binary16 values, the lower k first:
 *   a[0]: A row g, k 2t, 2t+1      a[1]: A row g+8, k 2t, 2t+1
 *   a[2]: A row g, k 2t+8, 2t+9    a[3]: A row g+8, k 2t+8, 2t+9
 *   b[0]: B k 2t, 2t+1, col g      b[1]: B k 2t+8, 2t+9, col g
 *   c as mma_s8_16x8x32.  The products are exact in f32; the order of the
 *   sums inside the instruction is the hardware's. */
static __device__ __forceinline__ void mma_f16_16x8x16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef DS4_CUDA_EMU
    uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const uint32_t *all = emu_warp_gather(mine, 6);
    unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
    /* the lane's two rows of A and two columns of B, converted once */
    float ar[2][16], bc[2][16];
    for (unsigned k = 0; k < 16; k++) {
        unsigned sh = 16 * (k % 2), hk = (k % 8) / 2, rk = k >= 8 ? 2 : 0;
        for (unsigned r = 0; r < 2; r++) {
            ar[r][k] = emu_f16_table[(uint16_t)(all[(g * 4 + hk) * 16 + r + rk] >> sh)];
            bc[r][k] = emu_f16_table[(uint16_t)(all[((2 * t + r) * 4 + hk) * 16 + 4 + rk / 2] >> sh)];
        }
    }
    float out[4];
    for (int i = 0; i < 4; i++) {
        const float *x = ar[i >= 2], *y = bc[i & 1];
        float s = c[i];
        for (unsigned k = 0; k < 16; k++) s += x[k] * y[k];
        out[i] = s;
    }
    for (int i = 0; i < 4; i++) c[i] = out[i];
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* D = A * B + C on the FP64 tensor cores, m8n8k4 (PTX ISA "Matrix
 * Fragments for mma.m8n8k4" of .f64), g = lane / 4, t = lane % 4:
 *   a: A row g, col t    b: B row t, col g    c[i]: D row g, col 2t + i. */
static __device__ __forceinline__ void mma_f64_8x8x4(double c[2], double a, double b) {
#ifdef DS4_CUDA_EMU
    uint32_t mine[4];
    memcpy(mine, &a, 8);
    memcpy(mine + 2, &b, 8);
    const uint32_t *all = emu_warp_gather(mine, 4);
    unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
    auto D = [&](unsigned holder, unsigned reg) -> double {
        double v;
        memcpy(&v, all + holder * 16 + reg, 8);
        return v;
    };
    for (int i = 0; i < 2; i++) {
        unsigned col = 2 * t + i;
        double s = c[i];
        for (unsigned k = 0; k < 4; k++) s += D(g * 4 + k, 0) * D(col * 4 + k, 2);
        c[i] = s;
    }
#else
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
                 : "+d"(c[0]), "+d"(c[1])
                 : "d"(a), "d"(b));
#endif
}

static __device__ __forceinline__ int imin_d(int a, int b) { return a < b ? a : b; }
static __device__ __forceinline__ int imax_d(int a, int b) { return a > b ? a : b; }

#endif
