/*
 * threads.h - a fixed pool of worker threads for data-parallel loops.
 *
 * The CPU backend splits every large operation (matrix-vector products,
 * attention heads, experts) into index ranges and hands them to the pool.
 * ds4_pool_run() blocks until every range is done; the calling thread takes
 * part in the work, so a pool of N threads has N-1 helper threads.
 */
#ifndef DS4_BASE_THREADS_H
#define DS4_BASE_THREADS_H

#include <stdint.h>

#include "base/error.h"

typedef struct ds4_pool ds4_pool;

/* Work on [begin, end); `thread` is in [0, ds4_pool_size()) and is stable
 * for the duration of one call, so it can index per-thread scratch. */
typedef void (*ds4_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* nthreads <= 0 means "all online CPUs" (or $DS4_THREADS when set). */
ds4_pool *ds4_pool_create(int nthreads, ds4_err *err);
void ds4_pool_free(ds4_pool *pool);
int ds4_pool_size(const ds4_pool *pool);

/* Split [0, n) into chunks of at least `grain` items and run `fn` over them
 * on all threads.  Returns when every chunk has finished.  A NULL pool runs
 * everything on the calling thread. */
void ds4_pool_run(ds4_pool *pool, int64_t n, int64_t grain, ds4_task_fn fn, void *ctx);

/* Number of online CPUs (at least 1). */
int ds4_cpu_count(void);

#endif
