/*
 * startup.c - instance lock and memory estimate at program start (see
 * startup.h).
 */
#include "engine/startup.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/instance_lock.h"
#include "base/threads.h"
#include "model/session_state.h"

int ds4_startup_lock(const char *prog) {
    ds4_err err = {0};
    if (ds4_instance_lock(&err) == 0) return 0;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return err.code == DS4_EBUSY ? DS4_EXIT_LOCKED : 1;
}

int ds4_model_file_check(const char *path, ds4_err *err) {
    struct stat st;
    if (stat(path, &st) == 0) return 0;
    return ds4_err_set(err, DS4_ENOTFOUND,
                       "model file %s: %s.\n"
                       "  ds4 runs the DeepSeek V4 Flash GGUF files published for the ds4 engine\n"
                       "  (Hugging Face antirez/deepseek-v4-gguf, e.g. the q2-imatrix file, about 81 GB).\n"
                       "  Download one and pass it with -m FILE, or link it as ./ds4flash.gguf.\n"
                       "  To try ds4 without downloading anything, `make demo` builds a tiny random\n"
                       "  model with the real tokenizer: ./ds4 -m build/models/demo.gguf",
                       path, strerror(errno));
}

const char *ds4_option_not_supported(const char *name) {
    static const char DIAG[] = "a diagnostic of ds4's Metal build; this engine compares backends with "
                               "ds4-forward and tests/cuda (see README.md)";
    static const char PIPE[] = "ds4's own TCP pipeline; here mpirun starts the ranks: mpirun -np N ./ds4 ... with "
                               "--layers A:B per rank (docs/DISTRIBUTED.md)";
    static const struct {
        const char *name, *why;
    } table[] = {
        {"--head-test", DIAG},
        {"--first-token-test", DIAG},
        {"--metal-graph-test", DIAG},
        {"--metal-graph-full-test", DIAG},
        {"--metal-graph-prompt-test", DIAG},
        {"--metal-graph-generate", "removed from ds4 itself"},
        {"--role", PIPE},
        {"--coordinator", PIPE},
        {"--listen", PIPE},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (!strcmp(name, table[i].name)) return table[i].why;
    return NULL;
}

const char *ds4_fmt_bytes(uint64_t b, char buf[32]) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, 32, "%llu bytes", (unsigned long long)b);
    else snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

const char *ds4_memory_line(const ds4_weights *w, uint32_t ctx, char *buf, size_t len) {
    char a[32], b[32], c[32];
    uint64_t wb = ds4_weights_bytes(w), kv = ds4_kv_state_bytes(&w->cfg, ctx);
    snprintf(buf, len, "memory: weights %s + context %u tokens %s = %s", ds4_fmt_bytes(wb, a), ctx,
             ds4_fmt_bytes(kv, b), ds4_fmt_bytes(wb + kv, c));
    return buf;
}

void ds4_startup_print_memory(const char *prog, const char *backend, const ds4_weights *w, uint32_t ctx) {
    char line[160];
    fprintf(stderr, "%s: backend %s; %s\n", prog, backend, ds4_memory_line(w, ctx, line, sizeof(line)));
}

/* ------------------------------------------------------------ warming */

typedef struct warm_job {
    const volatile uint8_t *base; /* volatile: every read happens */
    size_t page;
} warm_job;

static void warm_pages(void *ctx, int64_t begin, int64_t end, int thread) {
    const warm_job *j = ctx;
    (void)thread;
    for (int64_t p = begin; p < end; p++) (void)j->base[(size_t)p * j->page];
}

/* Pages read between two looks at the stop callback: a few hundred
 * milliseconds of a fast disk, so Ctrl+C is answered at once. */
#define WARM_SLICE_BYTES (256ull << 20)

/* Read the pages of [span, span + size) with the pool, a slice at a time
 * between looks at stop; *bytes grows by what was read. */
static int warm_span(ds4_pool *pool, const uint8_t *span, size_t size, bool (*stop)(void *ctx), void *stop_ctx,
                     uint64_t *bytes, ds4_err *err) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const uint8_t *base = (const uint8_t *)((uintptr_t)span & ~(uintptr_t)(page - 1));
    size += (size_t)(span - base);
    /* Start the kernel's read-ahead over the span, then fault every page
     * in from several threads (one thread waiting on one page at a time
     * leaves a fast disk idle). */
    (void)madvise((void *)base, size, MADV_WILLNEED);
    int64_t pages = (int64_t)((size + page - 1) / page), slice = (int64_t)(WARM_SLICE_BYTES / page);
    for (int64_t first = 0; first < pages; first += slice) {
        if (stop && stop(stop_ctx)) return ds4_err_set(err, DS4_EINTERRUPTED, "warming the weights: interrupted");
        int64_t n = pages - first < slice ? pages - first : slice;
        warm_job j = {.base = base + (size_t)first * page, .page = page};
        ds4_pool_run(pool, n, 256, warm_pages, &j);
        uint64_t done = (uint64_t)n * page;
        *bytes += (uint64_t)first * page + done <= size ? done : size - (uint64_t)first * page;
    }
    return 0;
}

int ds4_weights_warm(const ds4_weights *w, int n_threads, bool (*stop)(void *ctx), void *stop_ctx, uint64_t *bytes,
                     ds4_err *err) {
    *bytes = 0;
    if (w->synthetic || !w->gguf || !w->gguf->owns_map) return 0;
    ds4_pool *pool = ds4_pool_create(n_threads, err);
    if (!pool) return ds4_err_prefix(err, "warming the weights");
    int rc = warm_span(pool, w->gguf->base, (size_t)w->gguf->size, stop, stop_ctx, bytes, err);
    ds4_pool_free(pool);
    return rc;
}

int ds4_weights_warm_layers(const ds4_weights *w, uint32_t first, uint32_t end, int n_threads, bool (*stop)(void *ctx),
                            void *stop_ctx, uint64_t *bytes, ds4_err *err) {
    *bytes = 0;
    if (w->synthetic || !w->gguf || !w->gguf->owns_map) return 0;
    ds4_pool *pool = ds4_pool_create(n_threads, err);
    if (!pool) return ds4_err_prefix(err, "warming the weights");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ds4_weights_count(w); i++) {
        const ds4_wt *t = ds4_weights_at(w, i, NULL);
        bool mine = i < DS4_N_GLOBAL_TENSORS
                        ? (t == &w->token_embd ? first == 0 : end == w->cfg.n_layer) /* embedding, head */
                        : (i - DS4_N_GLOBAL_TENSORS) / DS4_N_LAYER_TENSORS >= first &&
                              (i - DS4_N_GLOBAL_TENSORS) / DS4_N_LAYER_TENSORS < end;
        if (mine && t->data) rc = warm_span(pool, t->data, ds4_wt_bytes(t), stop, stop_ctx, bytes, err);
    }
    ds4_pool_free(pool);
    return rc;
}

/* What a warming read, on stderr; the status to go on with. */
static int warm_report(const char *prog, int rc, const ds4_err *err, uint64_t bytes, double t0) {
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", prog, err->msg);
        return err->code == DS4_EINTERRUPTED ? DS4_EXIT_INTERRUPTED : 1;
    }
    char b[32];
    double dt = ds4_now() - t0;
    if (bytes)
        fprintf(stderr, "%s: warmed %s of weights in %.2f s (%.2f GB/s)\n", prog, ds4_fmt_bytes(bytes, b), dt,
                dt > 0 ? (double)bytes / dt / 1e9 : 0.0);
    else fprintf(stderr, "%s: --warm-weights: synthetic weights have no file to read\n", prog);
    return 0;
}

int ds4_startup_warm(const char *prog, const ds4_weights *w, int n_threads, bool (*stop)(void *ctx), void *stop_ctx) {
    ds4_err err = {0};
    uint64_t bytes;
    double t0 = ds4_now();
    int rc = ds4_weights_warm(w, n_threads, stop, stop_ctx, &bytes, &err);
    return warm_report(prog, rc, &err, bytes, t0);
}

int ds4_startup_warm_layers(const char *prog, const ds4_weights *w, uint32_t first, uint32_t end, int n_threads,
                            bool (*stop)(void *ctx), void *stop_ctx) {
    ds4_err err = {0};
    uint64_t bytes;
    double t0 = ds4_now();
    int rc = ds4_weights_warm_layers(w, first, end, n_threads, stop, stop_ctx, &bytes, &err);
    return warm_report(prog, rc, &err, bytes, t0);
}

int ds4_startup_warm_stage(void *ctx, const ds4_weights *w, uint32_t first, uint32_t end) {
    const ds4_warm_ctx *c = ctx;
    return ds4_startup_warm_layers(c->prog, w, first, end, c->n_threads, NULL, NULL);
}
