/*
 * test_threads.c - the worker pool covers every index exactly once, for
 * pool sizes from 1 to 8 and ranges smaller and larger than the pool.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdlib.h>

#include "base/threads.h"

typedef struct {
    atomic_int *hits;
    int nthreads;
    atomic_int bad_thread;
} cover_ctx;

static void cover(void *vctx, int64_t begin, int64_t end, int thread) {
    cover_ctx *c = vctx;
    if (thread < 0 || thread >= c->nthreads) atomic_fetch_add(&c->bad_thread, 1);
    for (int64_t i = begin; i < end; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_pool_covers_each_index_once(void **state) {
    (void)state;
    const int64_t sizes[] = {0, 1, 2, 7, 64, 1000, 100003};
    for (int nt = 1; nt <= 8; nt++) {
        ds4_err err;
        ds4_pool *pool = ds4_pool_create(nt, &err);
        assert_non_null(pool);
        assert_int_equal(ds4_pool_size(pool), nt);
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            int64_t n = sizes[s];
            cover_ctx c = {.nthreads = nt};
            c.hits = calloc((size_t)n + 1, sizeof(atomic_int));
            for (int rep = 0; rep < 3; rep++) ds4_pool_run(pool, n, 1 + rep * 5, cover, &c);
            for (int64_t i = 0; i < n; i++) assert_int_equal(atomic_load(&c.hits[i]), 3);
            assert_int_equal(atomic_load(&c.bad_thread), 0);
            free(c.hits);
        }
        ds4_pool_free(pool);
    }
}

static void test_null_pool_runs_inline(void **state) {
    (void)state;
    atomic_int hits[10] = {0};
    cover_ctx c = {.hits = hits, .nthreads = 1};
    ds4_pool_run(NULL, 10, 1, cover, &c);
    for (int i = 0; i < 10; i++) assert_int_equal(atomic_load(&hits[i]), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_covers_each_index_once),
        cmocka_unit_test(test_null_pool_runs_inline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
