/*
 * cuda_emu.cpp - the fiber scheduler, warp exchanges, memory and stream
 * calls behind cuda_emu.h.
 *
 * Each thread of a block is a fiber with its own stack; a fiber runs until
 * it reaches a barrier (block or warp) or returns, and then switches
 * straight to the next fiber of the run queue (no round trip through a
 * scheduler: a warp exchange costs one switch a lane).  The last live lane
 * of a warp to reach a warp barrier releases the warp, its lanes queued in
 * order; when the queue is empty and every live thread waits at the block
 * barrier, the block is released.  Anything else is a deadlock (a barrier
 * in divergent code, lanes that exited before a shuffle) and aborts with a
 * message, because on a GPU it would hang or be undefined.
 *
 * Context switches are a few instructions of x86-64 assembly (callee-saved
 * registers and the stack pointer; the floating-point environment is never
 * changed by kernels, so it is not switched), not ucontext, whose
 * signal-mask system calls would make the emulation far slower.
 *
 * Lane exchanges use two buffers in turn, so one warp barrier per exchange
 * suffices: a lane can only overwrite a buffer after every lane of its warp
 * has passed the following exchange's barrier, hence finished reading it.
 */
#include "cuda_emu.h"

extern "C" {
#include "base/fp.h"
}

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the CUDA emulation's context switch is written for x86-64"
#endif

/* ------------------------------------------------------ context switch */

/* emu_swap(save, load): push the callee-saved registers, store the stack
 * pointer into *save, load `load` as the stack pointer, pop and return
 * into whatever that stack was switched away from. */
extern "C" void emu_swap(void **save, void *load);
asm(".text\n"
    ".globl emu_swap\n"
    ".type emu_swap,@function\n"
    "emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size emu_swap,.-emu_swap\n");

enum fiber_state { F_RUN, F_WARP_BAR, F_BLOCK_BAR, F_DONE };

struct emu_fiber {
    uint3 tid;
    unsigned linear, lane, warp;
    unsigned xphase; /* which exchange buffer the next exchange uses */
    fiber_state state;
    void *sp;
    char *stack;
    int bar_value; /* predicate carried into a counting block barrier */
    unsigned bar_id, bar_need; /* the block barrier waited at: 0 = __syncthreads, else a named one of bar_need threads */
};

emu_block_ctx emu_blk;
emu_fiber *emu_cur;

static const size_t STACK_BYTES = 128 * 1024;
static std::vector<emu_fiber> fibers;
static std::vector<char *> stacks;
static void *sched_sp;
static const std::function<void()> *cur_body;
static unsigned cur_threads; /* threads of the running block */
/* The running block's bookkeeping: each warp's live lanes and lanes at a
 * warp barrier, the block's live threads and threads at a block barrier,
 * and the run queue (a ring: a fiber is in it at most once). */
struct emu_warp_count {
    unsigned live, waiting;
};
static emu_warp_count warp_count[32];
static unsigned blk_live, blk_waiting;
static unsigned runq[1024], rq_head, rq_len; /* 1024: the most threads a block has */
static std::atomic<uint64_t> n_launch;
/* Warp exchange tables: 16 words per lane, two used in turn. */
static uint32_t xbuf[2][1024][16];
static int bar_accum;
static int bar_result;
#if EMU_ASAN
static void *sched_fake_stack;
#endif

static void emu_die(const char *fmt, const char *what) {
    fprintf(stderr, "cuda-emu: ");
    fprintf(stderr, fmt, what);
    fprintf(stderr, "\n");
    abort();
}

float emu_f16_table[65536];

/* before main: no kernel runs before it */
__attribute__((constructor)) static void fill_f16_table() {
    for (uint32_t h = 0; h < 65536; h++) emu_f16_table[h] = ds4_f16_to_f32((uint16_t)h);
}

const uint3 &emu_thread_idx() { return emu_cur->tid; }
unsigned emu_lane() { return emu_cur->lane; }

static void push_run(unsigned i) {
    fibers[i].state = F_RUN;
    runq[(rq_head + rq_len++) & 1023] = i;
}

/* A warp whose live lanes all wait at a warp barrier goes on: its lanes
 * queued in lane order. */
static void release_warp(unsigned w) {
    unsigned lo = w * 32, hi = lo + 32 < cur_threads ? lo + 32 : cur_threads;
    for (unsigned i = lo; i < hi; i++)
        if (fibers[i].state == F_WARP_BAR) push_run(i);
    warp_count[w].waiting = 0;
}

/* Nothing can run and threads are left: they must all wait at the same
 * block barrier (a named one: exactly its count of them), which releases
 * them; anything else is a deadlock. */
static void release_block() {
    if (blk_waiting != blk_live) {
        char where[64];
        snprintf(where, sizeof(where), "block (%u,%u,%u)", emu_blk.bid.x, emu_blk.bid.y, emu_blk.bid.z);
        emu_die("deadlock in %s: threads wait at different barriers (warp vs block), "
                "or a warp collective was called by part of a warp", where);
    }
    int count = 0;
    unsigned waiting = 0, bar_id = 0, bar_need = 0;
    bool same_bar = true;
    for (unsigned i = 0; i < cur_threads; i++) {
        if (fibers[i].state != F_BLOCK_BAR) continue;
        count += fibers[i].bar_value;
        if (waiting++ == 0) {
            bar_id = fibers[i].bar_id;
            bar_need = fibers[i].bar_need;
        } else if (fibers[i].bar_id != bar_id || (bar_id && fibers[i].bar_need != bar_need)) {
            same_bar = false;
        }
    }
    if (!same_bar || (bar_id != 0 && waiting != bar_need)) {
        char where[160];
        snprintf(where, sizeof(where), "block (%u,%u,%u), %u threads at block barrier %u (named: of %u)",
                 emu_blk.bid.x, emu_blk.bid.y, emu_blk.bid.z, waiting, bar_id, bar_need);
        emu_die("deadlock in %s: threads wait at different block barriers, or a named barrier's count "
                "is not the live threads waiting at it", where);
    }
    bar_accum = count;
    bar_result = count > 0;
    for (unsigned i = 0; i < cur_threads; i++)
        if (fibers[i].state == F_BLOCK_BAR) {
            fibers[i].bar_value = 0;
            push_run(i);
        }
    blk_waiting = 0;
}

/* The fiber to run next, or null when the block has finished. */
static emu_fiber *next_fiber() {
    while (rq_len == 0) {
        if (blk_live == 0) return nullptr;
        release_block();
    }
    unsigned i = runq[rq_head];
    rq_head = (rq_head + 1) & 1023;
    rq_len--;
    return &fibers[i];
}

/* The running fiber stops (its state says why: a barrier, or done) and
 * the next one runs; back here when this one is released. */
static void switch_away() {
    emu_fiber *me = emu_cur;
    emu_warp_count &w = warp_count[me->warp];
    switch (me->state) {
    case F_WARP_BAR:
        if (++w.waiting == w.live) release_warp(me->warp);
        break;
    case F_DONE:
        blk_live--;
        if (--w.live && w.waiting == w.live) release_warp(me->warp);
        break;
    case F_BLOCK_BAR: blk_waiting++; break;
    case F_RUN: break;
    }
    emu_fiber *next = next_fiber();
    if (next == me) return; /* released at once: its warp's only live lane */
    emu_cur = next;
#if EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(me->state == F_DONE ? nullptr : &fake, next ? next->stack : nullptr,
                                   next ? STACK_BYTES : 0);
    emu_swap(&me->sp, next ? next->sp : sched_sp);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    emu_swap(&me->sp, next ? next->sp : sched_sp);
#endif
    emu_cur = me;
}

extern "C" void emu_fiber_entry() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    (*cur_body)();
    emu_cur->state = F_DONE;
    switch_away();
    abort(); /* never resumed */
}

/* A fresh stack whose first switch "returns" into emu_fiber_entry. */
static void *prepare_stack(char *stack) {
    uintptr_t top = ((uintptr_t)(stack + STACK_BYTES)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                             /* fake return address of the entry */
    *--sp = (uint64_t)(uintptr_t)&emu_fiber_entry;
    for (int r = 0; r < 6; r++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
    return sp;
}

/* ------------------------------------------------------------ barriers */

void __syncthreads() {
    emu_cur->bar_id = 0;
    emu_cur->state = F_BLOCK_BAR;
    switch_away();
}

/* A named barrier (bar.sync id, nthreads): released when every live thread
 * waits at it and they are exactly nthreads - the threads left out must have
 * run on and exited, since fibers at a barrier wait for all live ones. */
void emu_bar_sync(unsigned id, unsigned nthreads) {
    emu_cur->bar_id = id;
    emu_cur->bar_need = nthreads;
    emu_cur->state = F_BLOCK_BAR;
    switch_away();
}

int __syncthreads_or(int pred) {
    emu_cur->bar_value = pred != 0;
    __syncthreads();
    return bar_result;
}

int __syncthreads_count(int pred) {
    emu_cur->bar_value = pred != 0;
    __syncthreads();
    return bar_accum;
}

static void warp_barrier() {
    emu_cur->state = F_WARP_BAR;
    switch_away();
}

void __syncwarp(unsigned) { warp_barrier(); }

/* Deposit, wait for the warp, return the warp's table of this phase. */
static uint32_t (*exchange(const void *mine, size_t bytes))[16] {
    unsigned ph = emu_cur->xphase;
    emu_cur->xphase ^= 1;
    memcpy(xbuf[ph][emu_cur->linear], mine, bytes);
    warp_barrier();
    return &xbuf[ph][emu_cur->linear - emu_cur->lane];
}

uint64_t emu_warp_exchange(uint64_t mine, unsigned src) {
    uint32_t(*tab)[16] = exchange(&mine, 8);
    uint64_t v;
    memcpy(&v, tab[src], 8);
    return v;
}

const uint32_t *emu_warp_gather(const uint32_t *mine, int n) { return exchange(mine, (size_t)n * 4)[0]; }

unsigned __ballot_sync(unsigned, int pred) {
    uint32_t p = pred != 0;
    uint32_t(*tab)[16] = exchange(&p, 4);
    unsigned base = emu_cur->linear - emu_cur->lane, r = 0;
    for (unsigned l = 0; l < 32 && base + l < cur_threads; l++)
        if (tab[l][0]) r |= 1u << l;
    return r;
}
static unsigned warp_reduce(unsigned v, bool want_max) {
    uint32_t(*tab)[16] = exchange(&v, 4);
    unsigned base = emu_cur->linear - emu_cur->lane, r = tab[0][0];
    for (unsigned l = 1; l < 32 && base + l < cur_threads; l++)
        r = want_max ? (tab[l][0] > r ? tab[l][0] : r) : (tab[l][0] < r ? tab[l][0] : r);
    return r;
}
unsigned __reduce_max_sync(unsigned, unsigned v) { return warp_reduce(v, true); }
unsigned __reduce_min_sync(unsigned, unsigned v) { return warp_reduce(v, false); }
int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
int __all_sync(unsigned mask, int pred) {
    unsigned base = emu_cur->linear - emu_cur->lane;
    unsigned n = cur_threads - base < 32 ? cur_threads - base : 32;
    unsigned b = __ballot_sync(mask, pred);
    return (unsigned)__builtin_popcount(b) == n;
}

/* ---------------------------------------------------------- scheduler */

static void run_block(unsigned nthreads) {
    cur_threads = nthreads;
    rq_head = rq_len = 0;
    for (unsigned i = 0; i < nthreads; i++) {
        fibers[i].sp = prepare_stack(fibers[i].stack);
        fibers[i].xphase = 0;
        push_run(i);
    }
    for (unsigned w = 0; w * 32 < nthreads; w++)
        warp_count[w] = emu_warp_count{nthreads - w * 32 < 32 ? nthreads - w * 32 : 32, 0};
    blk_live = nthreads;
    blk_waiting = 0;
    emu_fiber *first = next_fiber();
    emu_cur = first;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&sched_fake_stack, first->stack, STACK_BYTES);
    emu_swap(&sched_sp, first->sp);
    __sanitizer_finish_switch_fiber(sched_fake_stack, nullptr, nullptr);
#else
    emu_swap(&sched_sp, first->sp); /* back when the block's last fiber is done */
#endif
}

/* ------------------------------------------------------------- devices */

/* The emulated GPUs: DS4_EMU_GPUS of them (default 1), each with the
 * memory DS4_EMU_GPU_MEM gives - one size for every device or one a
 * device, in bytes or with K, M, G ("8G,4G,4G"); default 16 GiB.  Each
 * thread has its current device (cudaSetDevice); an allocation counts
 * against that device's memory and fails beyond it, and cudaMemGetInfo
 * says what is left.  Both variables are the emulation's own: a GPU build
 * reads neither. */
struct emu_device {
    size_t total, used;
};
struct emu_alloc {
    size_t bytes;
    int dev;
};
static std::mutex mem_mu; /* the devices' use and the allocations */
static std::vector<emu_device> devices;
static std::map<uintptr_t, emu_alloc> allocs; /* device allocations by address */
static thread_local int cur_dev;

static void emu_dief(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void emu_dief(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    emu_die("%s", msg);
    abort();
}

/* "16G", "512M", "1048576": bytes; 0 when it is not a size. */
static size_t parse_size(const char *s, const char **end) {
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    if (e == s) return 0;
    int shift = *e == 'K' ? 10 : *e == 'M' ? 20 : *e == 'G' ? 30 : 0;
    if (shift) e++;
    *end = e;
    return (size_t)v << shift;
}

static void init_devices() {
    const char *n = getenv("DS4_EMU_GPUS"), *mem = getenv("DS4_EMU_GPU_MEM");
    int count = n ? atoi(n) : 1;
    if (count < 1 || count > 64) emu_dief("DS4_EMU_GPUS=%s: expected 1 to 64 devices", n);
    size_t size = (size_t)16 << 30;
    for (int i = 0; i < count; i++) {
        if (mem && *mem) {
            const char *e = mem;
            size = parse_size(mem, &e);
            if (!size || (*e && *e != ',')) emu_dief("DS4_EMU_GPU_MEM=%s: expected sizes (16G, 512M) by commas", mem);
            mem = *e ? e + 1 : e; /* a single size serves every device */
        }
        devices.push_back(emu_device{size, 0});
    }
}

static std::vector<emu_device> &devs() {
    static std::once_flag once;
    std::call_once(once, init_devices);
    return devices;
}

int emu_mem_device(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> l(mem_mu);
    auto it = allocs.upper_bound((uintptr_t)p);
    if (it == allocs.begin()) return -1;
    --it;
    return (uintptr_t)p + bytes <= it->first + it->second.bytes ? it->second.dev : -1;
}

void emu_check_arg_device(const void *p, const char *kernel) {
    int dev = emu_mem_device(p, 1);
    if (dev >= 0 && dev != cur_dev)
        emu_dief("launch of %s on device %d with an argument in memory of device %d", kernel, cur_dev, dev);
}

/* -------------------------------------------------------------- streams */

struct emu_stream;
struct emu_graph {
    std::vector<std::function<void()>> ops;
    std::vector<emu_stream *> joined; /* streams forked into the capture (event waits) */
    cudaStreamCaptureMode mode;
};
/* Work on a stream that another thread's call completes (emu_stream_defer). */
struct emu_deferred {
    std::function<bool()> try_run;
    bool done;
};
struct emu_stream {
    emu_graph *capture;
    int dev; /* the device it was made on; -1: the default stream, the current device's */
    std::deque<std::shared_ptr<emu_deferred>> deferred; /* unfinished, oldest first (under work_mu) */
    std::atomic<size_t> n_deferred;
};
/* An event remembers the capture its last record was part of: a stream
 * that waits on it joins that capture (CUDA's fork of a captured stream);
 * launches run or are recorded in issue order, a valid order of the
 * captured graph since every fork follows its record and every join its
 * branch's work.  It also remembers the deferred work it was recorded
 * after: it is complete when that is. */
struct emu_event {
    double t;
    emu_graph *capture;
    int dev;
    std::shared_ptr<emu_deferred> after;
};

static emu_stream default_stream{nullptr, -1, {}, {0}};
static emu_stream *stream_of(cudaStream_t s) { return s ? s : &default_stream; }

/* Captures in progress: a capture in cudaStreamCaptureModeGlobal forbids
 * the calls that could synchronise (allocations, synchronous copies,
 * synchronisations) in every thread, one in ThreadLocal mode in its own
 * thread only - as CUDA does. */
static std::atomic<int> global_captures;
static thread_local int thread_captures;

static void check_not_capturing(const char *what) {
    if (global_captures.load() > 0 || thread_captures > 0)
        emu_die("%s called while a stream is being captured", what);
}

/* Deferred work: each stream's unfinished work in order, tried whenever
 * any is issued or finished (emu_stream_defer). */
static std::mutex work_mu;
static std::condition_variable work_cv;
static std::vector<emu_stream *> busy; /* streams with deferred work */

static void progress_locked() {
    for (bool moved = true; moved;) {
        moved = false;
        for (emu_stream *s : busy)
            while (!s->deferred.empty()) {
                emu_deferred &w = *s->deferred.front();
                if (!w.done && !(w.done = w.try_run())) break;
                s->deferred.pop_front();
                s->n_deferred--;
                moved = true;
            }
        busy.erase(std::remove_if(busy.begin(), busy.end(), [](emu_stream *s) { return s->deferred.empty(); }),
                   busy.end());
    }
    work_cv.notify_all();
}

void emu_stream_defer(cudaStream_t s, std::function<bool()> try_run) {
    emu_stream *st = stream_of(s);
    if (st->capture) emu_die("%s", "deferred work (an NCCL transfer) on a stream being captured: not emulated");
    std::lock_guard<std::mutex> l(work_mu);
    if (st->deferred.empty()) busy.push_back(st);
    st->deferred.push_back(std::make_shared<emu_deferred>(emu_deferred{std::move(try_run), false}));
    st->n_deferred++;
    progress_locked();
}

static void drain(emu_stream *st);

void emu_stream_defer_each(cudaStream_t s, std::function<std::function<bool()>()> make) {
    emu_stream *st = stream_of(s);
    if (!st->capture) {
        emu_stream_defer(s, make());
        return;
    }
    int dev = emu_stream_device(st);
    st->capture->ops.push_back([make, dev]() {
        emu_stream run{nullptr, dev, {}, {0}}; /* the graph's run, which waits for it */
        emu_stream_defer(&run, make());
        drain(&run);
    });
}

void emu_deferred_update(const std::function<void()> &fn) {
    std::lock_guard<std::mutex> l(work_mu);
    fn();
    progress_locked();
}

int emu_stream_device(cudaStream_t s) {
    emu_stream *st = stream_of(s);
    return st->dev >= 0 ? st->dev : cur_dev;
}

/* Work issued to a stream waits for the deferred work before it. */
static void drain(emu_stream *st) {
    if (st->n_deferred.load() == 0) return;
    std::unique_lock<std::mutex> l(work_mu);
    work_cv.wait(l, [st] { return st->deferred.empty(); });
}

static void exec_launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    /* one kernel at a time: the fibers and the block's context are the
     * process's (threads of a multi-GPU program launch concurrently) */
    static std::mutex launch_mu;
    std::lock_guard<std::mutex> l(launch_mu);
    unsigned nthreads = block.x * block.y * block.z;
    static std::vector<unsigned char> dyn;
    if (dyn.size() < smem + 16) dyn.resize(smem + 16);
    while (fibers.size() < nthreads) {
        emu_fiber f;
        memset(&f, 0, sizeof(f));
        f.stack = (char *)malloc(STACK_BYTES);
        if (!f.stack) emu_die("%s", "out of memory for fiber stacks");
        fibers.push_back(f);
    }
    for (unsigned z = 0, i = 0; z < block.z; z++)
        for (unsigned y = 0; y < block.y; y++)
            for (unsigned x = 0; x < block.x; x++, i++) {
                emu_fiber &f = fibers[i];
                f.tid = uint3{x, y, z};
                f.linear = i;
                f.lane = i % 32;
                f.warp = i / 32;
                f.bar_value = 0;
            }
    emu_blk.bdim = block;
    emu_blk.gdim = grid;
    emu_blk.dyn_smem = dyn.data();
    cur_body = &body;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_blk.bid = uint3{bx, by, bz};
                /* poison dynamic shared memory: kernels must not rely on it */
                memset(dyn.data(), 0xA5, smem);
                run_block(nthreads);
            }
    emu_cur = nullptr;
}

/* A launch made to fail, for the tests of what a failing GPU does to a
 * program: DS4_EMU_FAIL_LAUNCH=DEV:N (the emulation's own variable) - the
 * N-th launch run on device DEV (from 1; captured ones are not counted)
 * does not run and leaves cudaErrorLaunchFailure for cudaGetLastError, as
 * a kernel that faulted does. */
static thread_local cudaError_t last_error = cudaSuccess;
struct emu_fault {
    int dev;
    uint64_t n;
    std::atomic<uint64_t> seen;
};
static emu_fault *fault_plan() {
    static emu_fault f{-1, 0, {0}};
    static std::once_flag once;
    std::call_once(once, [] {
        const char *v = getenv("DS4_EMU_FAIL_LAUNCH");
        if (v && sscanf(v, "%d:%llu", &f.dev, (unsigned long long *)&f.n) != 2)
            emu_dief("DS4_EMU_FAIL_LAUNCH=%s: expected DEV:N", v);
    });
    return &f;
}
static bool launch_fails() {
    emu_fault *f = fault_plan();
    return f->dev == cur_dev && ++f->seen == f->n;
}

/* A kernel goes to a stream of the current device (CUDA refuses others). */
static void check_device(const emu_stream *st, const char *what) {
    if (st->dev >= 0 && st->dev != cur_dev)
        emu_dief("%s on a stream of device %d while device %d is current", what, st->dev, cur_dev);
}

void emu_launch(dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body, const char *name) {
    unsigned nthreads = block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > 1024 || block.z > 64)
        emu_die("launch of %s: bad block size", name);
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu)
        emu_die("launch of %s: bad grid size", name);
    if (smem > 227 * 1024) emu_die("launch of %s: more than 227 KiB of dynamic shared memory", name);
    n_launch++;
    emu_stream *st = stream_of(s);
    char what[128];
    snprintf(what, sizeof(what), "launch of %s", name);
    check_device(st, what);
    if (st->capture) {
        st->capture->ops.push_back([grid, block, smem, body]() { exec_launch(grid, block, smem, body); });
        return;
    }
    drain(st);
    if (launch_fails()) {
        last_error = cudaErrorLaunchFailure;
        return;
    }
    exec_launch(grid, block, smem, body);
}

uint64_t emu_launch_count() { return n_launch; }

/* --------------------------------------------------------------- memory */

cudaError_t cudaMalloc(void **p, size_t n) {
    check_not_capturing("cudaMalloc");
    *p = nullptr;
    size_t bytes = (n ? n + 255 : 256) / 256 * 256;
    std::lock_guard<std::mutex> l(mem_mu);
    emu_device &d = devs()[cur_dev];
    if (n > d.total || bytes > d.total - d.used) return cudaErrorMemoryAllocation;
    if (!(*p = aligned_alloc(256, bytes))) return cudaErrorMemoryAllocation;
    d.used += bytes;
    allocs[(uintptr_t)*p] = emu_alloc{bytes, cur_dev};
    memset(*p, 0xCD, n); /* device memory starts with garbage */
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> l(mem_mu);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end()) return cudaErrorInvalidValue;
    devs()[it->second.dev].used -= it->second.bytes;
    allocs.erase(it);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned) { return cudaMallocHost(p, n); }
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind) {
    check_not_capturing("cudaMemcpy");
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind, cudaStream_t s) {
    emu_stream *st = stream_of(s);
    if (st->capture) {
        st->capture->ops.push_back([dst, src, n]() { memmove(dst, src, n); });
        return cudaSuccess;
    }
    drain(st);
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data) {
    emu_stream *st = stream_of(s);
    if (st->capture) {
        st->capture->ops.push_back([fn, data]() { fn(data); });
        return cudaSuccess;
    }
    drain(st);
    fn(data);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *dst, int v, size_t n) {
    check_not_capturing("cudaMemset");
    memset(dst, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s) {
    emu_stream *st = stream_of(s);
    if (st->capture) {
        st->capture->ops.push_back([dst, v, n]() { memset(dst, v, n); });
        return cudaSuccess;
    }
    drain(st);
    memset(dst, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    std::lock_guard<std::mutex> l(mem_mu);
    const emu_device &d = devs()[cur_dev];
    *free_b = d.total - d.used;
    *total_b = d.total;
    return cudaSuccess;
}

/* --------------------------------------------------------------- device */

cudaError_t cudaSetDevice(int dev) {
    if (dev < 0 || dev >= (int)devs().size()) return cudaErrorInvalidDevice;
    cur_dev = dev;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = cur_dev;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = (int)devs().size();
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev < 0 || dev >= (int)devs().size()) return cudaErrorInvalidDevice;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "ds4 CPU emulation of an sm_90 GPU");
    p->multiProcessorCount = 132;
    p->totalGlobalMem = devs()[dev].total;
    p->sharedMemPerBlockOptin = 227 * 1024;
    p->l2CacheSize = 50 << 20;
    p->major = 9;
    p->minor = 0;
    return cudaSuccess;
}
/* Every stream of the current device done (its deferred work included). */
cudaError_t cudaDeviceSynchronize() {
    check_not_capturing("cudaDeviceSynchronize");
    std::unique_lock<std::mutex> l(work_mu);
    work_cv.wait(l, [] {
        for (emu_stream *s : busy)
            if (emu_stream_device(s) == cur_dev) return false;
        return true;
    });
    return cudaSuccess;
}
cudaError_t cudaGetLastError() {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return last_error; }
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "emulated error";
    }
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) {
    *s = new emu_stream{nullptr, cur_dev, {}, {0}};
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (s->n_deferred.load() != 0) emu_die("%s", "cudaStreamDestroy of a stream with NCCL transfers unfinished");
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    check_not_capturing("cudaStreamSynchronize");
    drain(stream_of(s));
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    std::lock_guard<std::mutex> l(work_mu);
    return stream_of(s)->deferred.empty() ? cudaSuccess : cudaErrorNotReady;
}
static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = new emu_event{0, nullptr, cur_dev, nullptr};
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    emu_stream *st = stream_of(s);
    if (emu_stream_device(st) != e->dev)
        emu_dief("cudaEventRecord of an event of device %d on a stream of device %d", e->dev, emu_stream_device(st));
    e->t = now_ms();
    e->capture = st->capture;
    std::lock_guard<std::mutex> l(work_mu);
    e->after = st->deferred.empty() ? nullptr : st->deferred.back();
    return cudaSuccess;
}
static bool event_done(const emu_event *e) { return !e->after || e->after->done; }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    emu_stream *st = stream_of(s);
    if (e->capture && st->capture != e->capture) {
        if (st->capture) emu_die("%s", "cudaStreamWaitEvent joins two captures");
        st->capture = e->capture;
        e->capture->joined.push_back(st);
    }
    /* the stream's later work waits for the event's: here, the host does */
    std::unique_lock<std::mutex> l(work_mu);
    work_cv.wait(l, [e] { return event_done(e); });
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    std::unique_lock<std::mutex> l(work_mu);
    work_cv.wait(l, [e] { return event_done(e); });
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    std::lock_guard<std::mutex> l(work_mu);
    return event_done(e) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
    emu_stream *st = stream_of(s);
    if (st->capture) emu_die("%s", "cudaStreamBeginCapture on a stream already capturing");
    drain(st);
    st->capture = new emu_graph();
    st->capture->mode = mode;
    if (mode == cudaStreamCaptureModeGlobal) global_captures++;
    else if (mode == cudaStreamCaptureModeThreadLocal) thread_captures++;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    emu_stream *st = stream_of(s);
    if (!st->capture) emu_die("%s", "cudaStreamEndCapture without a capture");
    *g = st->capture;
    for (emu_stream *j : st->capture->joined) j->capture = nullptr;
    st->capture->joined.clear();
    if (st->capture->mode == cudaStreamCaptureModeGlobal) global_captures--;
    else if (st->capture->mode == cudaStreamCaptureModeThreadLocal) thread_captures--;
    st->capture = nullptr;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    *e = new emu_graph(*g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    emu_stream *st = stream_of(s);
    check_device(st, "a graph launch");
    if (st->capture) {
        emu_graph *copy = e;
        st->capture->ops.push_back([copy]() { for (auto &op : copy->ops) op(); });
        return cudaSuccess;
    }
    drain(st);
    for (auto &op : e->ops) op();
    return cudaSuccess;
}
/* Nothing to upload: the emulation runs a graph's operations on the host. */
cudaError_t cudaGraphUpload(cudaGraphExec_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete g;
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) {
    delete e;
    return cudaSuccess;
}
