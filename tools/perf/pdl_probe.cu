/*
 * pdl_probe.cu - does programmatic dependent launch work inside a captured
 * CUDA graph on this GPU, and what does it save?  (The measurement behind
 * the PDL figures of docs/PERFORMANCE.md, "Why decode is fast";
 * build/cuda/pdl_probe, built by `make perf-tools`, needs a GPU to run.)
 *
 * Three measurements, each plain and with the PDL launch attribute (the
 * first two on a stream and in a captured graph, the third in a graph):
 *   - a 20 us spinning kernel followed by a short one: how long before the
 *     spinning kernel's end the second one starts (negative: after), and
 *     how long after that end it passes griddepcontrol.wait;
 *   - a chain of 1000 tiny dependent kernels: time per kernel;
 *   - chains of 1000 kernels with the grids of the decode step's launches
 *     (1 to 1024 blocks), each block reading what the kernel before wrote
 *     and writing for the next: time per link, i.e. the floor a launch on
 *     the step's path costs before its own work.
 * The kernels call griddepcontrol the way every ds4 kernel does
 * (dev_pdl_enter in cuda_rt.h), written out here so that the probe does
 * not depend on the backend.
 */
#include <cstdio>
#include <cuda_runtime.h>

static __device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ void pdl_enter() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

/* rec[4 i]: start and end of the spin; rec[4 i + 2]: the follower's start
 * and the moment it passed its wait. */
static __global__ void spin_kernel(unsigned long long *rec, int i, unsigned long long spin_ns) {
    pdl_enter();
    unsigned long long t0 = now_ns();
    while (now_ns() - t0 < spin_ns) {}
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        rec[4 * i] = t0;
        rec[4 * i + 1] = now_ns();
    }
}
static __global__ void follow_kernel(unsigned long long *rec, int i) {
    unsigned long long a = now_ns();
    pdl_enter();
    unsigned long long b = now_ns();
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        rec[4 * i + 2] = a;
        rec[4 * i + 3] = b;
    }
}
static __global__ void tiny_kernel(float *x) {
    pdl_enter();
    x[threadIdx.x] += 1.0f;
}

/* A link of the grid chains: a value per thread from the previous link. */
static __global__ void link_kernel(const float *in, float *out) {
    pdl_enter();
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = in[i] * 1.0001f + 1.0f;
}

template <typename... A> static void launch(bool pdl, cudaStream_t st, void (*k)(A...), dim3 g, dim3 b, A... args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = g;
    c.blockDim = b;
    c.stream = st;
    c.attrs = at;
    c.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&c, k, args...);
    if (e != cudaSuccess) fprintf(stderr, "pdl_probe: launch: %s\n", cudaGetErrorString(e));
}

/* Runs enqueue() on the stream, or captured into a graph and replayed
 * (timing the second replay); returns milliseconds. */
template <typename F> static float run(bool graph, cudaStream_t st, F enqueue) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    if (graph) {
        cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
        enqueue();
        cudaStreamEndCapture(st, &g);
        cudaGraphInstantiate(&ge, g, 0);
        cudaGraphLaunch(ge, st);
        cudaEventRecord(e0, st);
        cudaGraphLaunch(ge, st);
    } else {
        cudaEventRecord(e0, st);
        enqueue();
    }
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms;
}

int main() {
    const int pairs = 16, chain = 1000;
    cudaStream_t st;
    unsigned long long *rec;
    float *x;
    if (cudaStreamCreate(&st) != cudaSuccess || cudaMalloc(&rec, 4 * pairs * sizeof(*rec)) != cudaSuccess ||
        cudaMalloc(&x, 256 * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "pdl_probe: no usable GPU\n");
        return 1;
    }
    for (int pdl = 0; pdl < 2; pdl++)
        for (int graph = 0; graph < 2; graph++) {
            run(graph, st, [&] {
                for (int i = 0; i < pairs; i++) {
                    launch(pdl, st, spin_kernel, dim3(8), dim3(128), rec, i, 20000ull);
                    launch(pdl, st, follow_kernel, dim3(8), dim3(128), rec, i);
                }
            });
            unsigned long long h[4 * pairs];
            cudaMemcpy(h, rec, sizeof(h), cudaMemcpyDeviceToHost);
            double early = 0, wait = 0;
            for (int i = 1; i < pairs; i++) { /* the first pair includes the start-up */
                early += (double)h[4 * i + 1] - (double)h[4 * i + 2];
                wait += (double)h[4 * i + 3] - (double)h[4 * i + 1];
            }
            float ms = run(graph, st, [&] {
                for (int i = 0; i < chain; i++) launch(pdl, st, tiny_kernel, dim3(4), dim3(256), x);
            });
            printf("pdl %d graph %d: follower starts %.0f ns before the spin ends, passes its wait %.0f ns after; "
                   "%d tiny dependent kernels: %.2f us each\n",
                   pdl, graph, early / (pairs - 1), wait / (pairs - 1), chain, 1000.0 * ms / chain);
        }
    const int shapes[][2] = {{1, 32}, {32, 544}, {132, 256}, {528, 256}, {1024, 256}}; /* blocks, threads */
    float *a, *b;
    if (cudaMalloc(&a, 1024 * 544 * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&b, 1024 * 544 * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "pdl_probe: out of memory\n");
        return 1;
    }
    cudaMemset(a, 0, 1024 * 544 * sizeof(float));
    for (const auto &sh : shapes) {
        float us[2];
        for (int pdl = 0; pdl < 2; pdl++)
            us[pdl] = 1000.0f / chain * run(true, st, [&] {
                          for (int i = 0; i < chain; i++)
                              launch(pdl, st, link_kernel, dim3(sh[0]), dim3(sh[1]), (const float *)(i & 1 ? b : a),
                                     i & 1 ? a : b);
                      });
        printf("graph chain of %d kernels of %4d x %3d threads, each reading the previous one's output: "
               "%.2f us a link with pdl, %.2f without\n",
               chain, sh[0], sh[1], us[1], us[0]);
    }
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        fprintf(stderr, "pdl_probe: %s\n", cudaGetErrorString(e));
        return 1;
    }
    return 0;
}
