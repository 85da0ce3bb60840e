/*
 * threads.c - fixed worker pool (see threads.h).
 *
 * One job at a time: ds4_pool_run() publishes the job under the mutex, bumps
 * a generation counter and wakes the workers.  Chunks are claimed with an
 * atomic counter, so uneven work balances itself.  The caller works too and
 * then waits until every worker has reported the generation as finished.
 */
#include "base/threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct ds4_pool {
    int nthreads;       /* including the calling thread */
    pthread_t *workers; /* nthreads - 1 */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a new job or shutdown */
    pthread_cond_t done; /* a worker finished its part */
    uint64_t generation; /* incremented per job */
    int finished;        /* workers done with the current generation */
    int shutdown;

    /* The current job. */
    ds4_task_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_int_fast64_t next; /* next unclaimed index */
};

typedef struct worker_arg {
    ds4_pool *pool;
    int index;
} worker_arg;

int ds4_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static void run_chunks(ds4_pool *p, int thread) {
    for (;;) {
        int64_t begin = atomic_fetch_add(&p->next, p->chunk);
        if (begin >= p->n) break;
        int64_t end = begin + p->chunk < p->n ? begin + p->chunk : p->n;
        p->fn(p->ctx, begin, end, thread);
    }
}

static void *worker_main(void *arg) {
    worker_arg *wa = arg;
    ds4_pool *p = wa->pool;
    int index = wa->index;
    free(wa);

    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->shutdown && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->shutdown) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);

        run_chunks(p, index);

        pthread_mutex_lock(&p->mu);
        p->finished++;
        pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static int threads_from_env(void) {
    const char *s = getenv("DS4_THREADS");
    if (!s || !*s) return 0;
    int n = atoi(s);
    return n > 0 ? n : 0;
}

ds4_pool *ds4_pool_create(int nthreads, ds4_err *err) {
    if (nthreads <= 0) nthreads = threads_from_env();
    if (nthreads <= 0) nthreads = ds4_cpu_count();
    if (nthreads > 1024) nthreads = 1024;

    ds4_pool *p = calloc(1, sizeof(*p));
    if (!p) {
        ds4_err_set(err, DS4_ENOMEM, "thread pool: out of memory");
        return NULL;
    }
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (nthreads == 1) return p;

    p->workers = calloc((size_t)nthreads - 1, sizeof(pthread_t));
    if (!p->workers) {
        ds4_pool_free(p);
        ds4_err_set(err, DS4_ENOMEM, "thread pool: out of memory");
        return NULL;
    }
    for (int i = 0; i < nthreads - 1; i++) {
        worker_arg *wa = malloc(sizeof(*wa));
        int rc = wa ? 0 : -1;
        if (wa) {
            wa->pool = p;
            wa->index = i + 1;
            rc = pthread_create(&p->workers[i], NULL, worker_main, wa);
            if (rc != 0) free(wa);
        }
        if (rc != 0) {
            p->nthreads = i + 1; /* only join what was started */
            ds4_pool_free(p);
            ds4_err_set(err, DS4_ENOMEM, "thread pool: cannot start thread %d of %d", i + 2, nthreads);
            return NULL;
        }
    }
    return p;
}

void ds4_pool_free(ds4_pool *p) {
    if (!p) return;
    if (p->workers) {
        pthread_mutex_lock(&p->mu);
        p->shutdown = 1;
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->workers[i], NULL);
        free(p->workers);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p);
}

int ds4_pool_size(const ds4_pool *p) { return p ? p->nthreads : 1; }

void ds4_pool_run(ds4_pool *p, int64_t n, int64_t grain, ds4_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->nthreads == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    /* Aim for a few chunks per thread so uneven ranges balance. */
    int64_t chunk = (n + (int64_t)p->nthreads * 4 - 1) / ((int64_t)p->nthreads * 4);
    if (chunk < grain) chunk = grain;

    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    p->finished = 0;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_chunks(p, 0);

    pthread_mutex_lock(&p->mu);
    while (p->finished < p->nthreads - 1) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
