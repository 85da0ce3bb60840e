/*
 * test_emu.cpp - the CUDA emulation's own semantics (cuda_emu.cpp), on
 * which every emulated test of the backend rests: the warp exchanges
 * (shuffles, ballots, reductions) give each lane what the hardware gives
 * it, also in a warp some of whose lanes have left, block barriers wait for every live thread and carry their counting
 * predicates, threads that exit early leave the others' barriers, named
 * barriers take their count of threads, every block of a grid runs once
 * with its index, and a barrier the hardware would hang at stops the
 * program with a message naming the block (checked in a child process).
 *
 * Built for the emulation only (make test-cuda-emu); run by
 * tests/cuda/run.sh.  Exit status 0 when all pass.
 */
#include "cuda_emu.h"

#include <algorithm>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"

#define LAUNCH(kern, grid, block, ...) emu_launch_kernel((grid), (block), 0, (cudaStream_t)0, #kern, kern, __VA_ARGS__)

/* Per thread of 3 warps: the warp's sum by a butterfly of xor shuffles,
 * the next lane's value, the value 3 lanes down (its own below lane 3),
 * the ballot of lanes divisible by 3, the warp's max. */
static __global__ void exchange_kernel(unsigned *out) {
    unsigned t = threadIdx.x, lane = t % 32, v = t * 7 + 1, sum = v;
    for (int m = 16; m; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    out[t * 5 + 0] = sum;
    out[t * 5 + 1] = __shfl_sync(0xffffffffu, v, (lane + 1) % 32);
    out[t * 5 + 2] = __shfl_up_sync(0xffffffffu, v, 3);
    out[t * 5 + 3] = __ballot_sync(0xffffffffu, lane % 3 == 0);
    out[t * 5 + 4] = __reduce_max_sync(0xffffffffu, v ^ 0x55u);
}

/* Lanes 16..31 of the second warp leave; its other 16 exchange among
 * themselves (the mask of the lanes left), the first warp whole. */
static __global__ void partial_kernel(unsigned *out) {
    unsigned t = threadIdx.x;
    if (t >= 48) return;
    unsigned mask = t < 32 ? 0xffffffffu : 0xffffu;
    out[t] = __shfl_xor_sync(mask, t * 3, 1);
}

static void check_exchanges() {
    const unsigned n = 96;
    unsigned *d;
    cudaMalloc((void **)&d, n * 5 * sizeof(unsigned));
    LAUNCH(exchange_kernel, dim3(1), dim3(n), d);
    cudaDeviceSynchronize();
    unsigned bad = 0, ballot = 0;
    for (unsigned l = 0; l < 32; l++) ballot |= (l % 3 == 0 ? 1u : 0u) << l;
    for (unsigned t = 0; t < n; t++) {
        unsigned w0 = t / 32 * 32, lane = t % 32, sum = 0, mx = 0;
        for (unsigned l = 0; l < 32; l++) {
            sum += (w0 + l) * 7 + 1;
            mx = std::max(mx, ((w0 + l) * 7 + 1) ^ 0x55u);
        }
        unsigned up = lane >= 3 ? (t - 3) * 7 + 1 : t * 7 + 1;
        const unsigned *o = d + t * 5;
        bad += o[0] != sum || o[1] != (w0 + (lane + 1) % 32) * 7 + 1 || o[2] != up || o[3] != ballot || o[4] != mx;
    }
    CHECK(bad == 0, "%u of %u threads got other exchanged values than the hardware's", bad, n);
    printf("warp exchanges        %u of %u threads differ\n", bad, n);
    LAUNCH(partial_kernel, dim3(1), dim3(64), d);
    cudaDeviceSynchronize();
    bad = 0;
    for (unsigned t = 0; t < 48; t++) bad += d[t] != (t ^ 1) * 3;
    CHECK(bad == 0, "%u of 48 lanes got other values in warps with lanes that left", bad);
    printf("part of a warp        %u of 48 lanes differ\n", bad);
    cudaFree(d);
}

/* 80 threads (the third warp of 16): threads from 72 on leave at once;
 * the rest pass values through shared memory across a barrier, then count
 * and or their predicates at barriers. */
static __global__ void block_kernel(unsigned *out) {
    __shared__ unsigned s[72];
    unsigned t = threadIdx.x;
    if (t >= 72) return;
    s[t] = t * 3;
    __syncthreads();
    out[t * 3 + 0] = s[71 - t];
    out[t * 3 + 1] = (unsigned)__syncthreads_count(t % 2);
    out[t * 3 + 2] = (unsigned)__syncthreads_or(t == 70) + 2 * (unsigned)__syncthreads_or(0);
}

static void check_block_barriers() {
    unsigned *d;
    cudaMalloc((void **)&d, 72 * 3 * sizeof(unsigned));
    LAUNCH(block_kernel, dim3(1), dim3(80), d);
    cudaDeviceSynchronize();
    unsigned bad = 0;
    for (unsigned t = 0; t < 72; t++) bad += d[t * 3] != (71 - t) * 3 || d[t * 3 + 1] != 36 || d[t * 3 + 2] != 1;
    CHECK(bad == 0, "%u of 72 threads saw other values across the block barriers", bad);
    printf("block barriers        %u of 72 threads differ\n", bad);
    cudaFree(d);
}

/* A named barrier of the first two warps while the third goes on alone:
 * the third leaves before it, as the hardware allows. */
static __global__ void named_kernel(unsigned *out) {
    __shared__ unsigned s[64];
    unsigned t = threadIdx.x;
    if (t >= 64) {
        out[t] = 1000 + t;
        return;
    }
    s[t] = t + 5;
    emu_bar_sync(1, 64);
    out[t] = s[63 - t];
}

static void check_named_barrier() {
    unsigned *d;
    cudaMalloc((void **)&d, 96 * sizeof(unsigned));
    LAUNCH(named_kernel, dim3(1), dim3(96), d);
    cudaDeviceSynchronize();
    unsigned bad = 0;
    for (unsigned t = 0; t < 96; t++) bad += d[t] != (t >= 64 ? 1000 + t : 63 - t + 5);
    CHECK(bad == 0, "%u of 96 threads differ around a named barrier", bad);
    printf("named barrier         %u of 96 threads differ\n", bad);
    cudaFree(d);
}

/* Every block of a 3 x 2 x 2 grid once, with its indices and sizes. */
static __global__ void grid_kernel(unsigned *out) {
    unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) atomicAdd(&out[b], 1u + 100u * (gridDim.x * gridDim.y * gridDim.z) + 10000u * blockDim.x);
}

static void check_grid() {
    unsigned *d;
    cudaMalloc((void **)&d, 12 * sizeof(unsigned));
    cudaMemset(d, 0, 12 * sizeof(unsigned));
    LAUNCH(grid_kernel, dim3(3, 2, 2), dim3(64), d);
    cudaDeviceSynchronize();
    unsigned bad = 0;
    for (unsigned b = 0; b < 12; b++) bad += d[b] != 1u + 1200u + 640000u;
    CHECK(bad == 0, "%u of 12 blocks ran other than once with their indices", bad);
    printf("grid                  %u of 12 blocks differ\n", bad);
    cudaFree(d);
}

/* Barriers the hardware would hang at: lane 0 at the block barrier while
 * its warp waits at a warp barrier; two warps at different named barriers. */
static __global__ void split_kernel(unsigned *out) {
    if (threadIdx.x == 0) __syncthreads();
    else out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
}
static __global__ void names_kernel(unsigned *out) {
    emu_bar_sync(1 + threadIdx.x / 32, 64);
    out[threadIdx.x] = 1;
}

/* Run a launch in a child: it must stop by abort with `want` in what it
 * wrote to stderr. */
static void check_stops(const char *what, void (*kern)(unsigned *), unsigned threads, const char *want) {
    int fd[2];
    if (pipe(fd) != 0) {
        CHECK(0, "pipe failed");
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        unsigned *d;
        cudaMalloc((void **)&d, threads * sizeof(unsigned));
        emu_launch_kernel(dim3(2), dim3(threads), 0, (cudaStream_t)0, what, kern, d);
        cudaDeviceSynchronize();
        _exit(0);
    }
    close(fd[1]);
    char msg[512];
    size_t n = 0;
    ssize_t r;
    while (n + 1 < sizeof(msg) && (r = read(fd[0], msg + n, sizeof(msg) - 1 - n)) > 0) n += (size_t)r;
    msg[n] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    bool aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    CHECK(aborted && strstr(msg, want), "%s: %s, stderr \"%s\" (wanted an abort naming \"%s\")", what,
          aborted ? "aborted" : "did not abort", msg, want);
    printf("%-21s stopped: %s", what, aborted && strstr(msg, want) ? msg : "no\n");
}

int main() {
    check_exchanges();
    check_block_barriers();
    check_named_barrier();
    check_grid();
    check_stops("warp vs block", split_kernel, 32, "deadlock in block (0,0,0)");
    check_stops("two named barriers", names_kernel, 64, "threads wait at different block barriers");
    if (failures) printf("%d check(s) failed\n", failures);
    else printf("cuda emulation: all passed\n");
    return failures ? 1 : 0;
}
