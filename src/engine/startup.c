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
    static const struct {
        const char *name, *why;
    } table[] = {
        {"--head-test", DIAG},
        {"--first-token-test", DIAG},
        {"--metal-graph-test", DIAG},
        {"--metal-graph-full-test", DIAG},
        {"--metal-graph-prompt-test", DIAG},
        {"--metal-graph-generate", "removed from ds4 itself"},
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (!strcmp(name, table[i].name)) return table[i].why;
    return NULL;
}

static uint64_t tensor_bytes(const ds4_wt *t) {
    if (!t->name) return 0;
    uint64_t mats = t->ne[2] ? t->ne[2] : 1;
    return (uint64_t)t->row_bytes * t->ne[1] * mats;
}

uint64_t ds4_weights_bytes(const ds4_weights *w) {
    uint64_t total = 0;
    for (size_t i = 0; i < ds4_weights_count(w); i++) total += tensor_bytes(ds4_weights_at(w, i, NULL));
    return total;
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

int ds4_weights_warm(const ds4_weights *w, int n_threads, bool (*stop)(void *ctx), void *stop_ctx, uint64_t *bytes,
                     ds4_err *err) {
    *bytes = 0;
    if (w->synthetic || !w->gguf || !w->gguf->owns_map) return 0;
    const uint8_t *base = w->gguf->base;
    size_t size = (size_t)w->gguf->size, page = (size_t)sysconf(_SC_PAGESIZE);
    /* Start the kernel's read-ahead over the whole file, then fault every
     * page in from several threads (one thread waiting on one page at a
     * time leaves a fast disk idle). */
    (void)madvise((void *)base, size, MADV_WILLNEED);
    ds4_pool *pool = ds4_pool_create(n_threads, err);
    if (!pool) return ds4_err_prefix(err, "warming the weights");
    int64_t pages = (int64_t)((size + page - 1) / page), slice = (int64_t)(WARM_SLICE_BYTES / page);
    int rc = 0;
    for (int64_t first = 0; first < pages; first += slice) {
        if (stop && stop(stop_ctx)) {
            rc = ds4_err_set(err, DS4_EINTERRUPTED, "warming the weights: interrupted");
            break;
        }
        warm_job j = {.base = base + (size_t)first * page, .page = page};
        ds4_pool_run(pool, pages - first < slice ? pages - first : slice, 256, warm_pages, &j);
        *bytes = (uint64_t)(first + slice) * page < size ? (uint64_t)(first + slice) * page : size;
    }
    ds4_pool_free(pool);
    return rc;
}

int ds4_startup_warm(const char *prog, const ds4_weights *w, int n_threads, bool (*stop)(void *ctx), void *stop_ctx) {
    ds4_err err = {0};
    uint64_t bytes;
    double t0 = ds4_now();
    if (ds4_weights_warm(w, n_threads, stop, stop_ctx, &bytes, &err) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return err.code == DS4_EINTERRUPTED ? DS4_EXIT_INTERRUPTED : 1;
    }
    char b[32];
    double dt = ds4_now() - t0;
    if (bytes)
        fprintf(stderr, "%s: warmed %s of weights in %.2f s (%.2f GB/s)\n", prog, ds4_fmt_bytes(bytes, b), dt,
                dt > 0 ? (double)bytes / dt / 1e9 : 0.0);
    else
        fprintf(stderr, "%s: --warm-weights: synthetic weights have no file to read\n", prog);
    return 0;
}
