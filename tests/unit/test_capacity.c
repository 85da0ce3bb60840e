/*
 * test_capacity.c - how many sessions the memory holds (engine/capacity.h),
 * from given memory figures:
 *  - without --parallel: three quarters of the room left beside the
 *    weights and the shared state, at least 1, at most the cap; the
 *    tightest of two memories (a GPU's and the host's) decides; a memory
 *    whose room is not known decides nothing;
 *  - a given --parallel must fit all of the room left, else the error
 *    names the memory needed and the memory available;
 *  - the startup line's arithmetic, word for word;
 *  - the CPU backend reports a sequence's state as the KV state's bytes,
 *    the host's available memory as its room and every weight as kept.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/meminfo.h"
#include "engine/capacity.h"
#include "model/backends.h"
#include "model/session_state.h"
#include "model/weights.h"

#define GIB   (1ull << 30)
#define MIB   (1ull << 20)
#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"

static ds4_capacity plan(const ds4_mem_pool *p, size_t n, uint32_t given, int want_rc, ds4_err *err) {
    ds4_capacity c;
    memset(err, 0, sizeof(*err));
    assert_int_equal(ds4_capacity_plan(p, n, 4096, given, 16, &c, err), want_rc);
    return c;
}

static void test_default_from_memory(void **state) {
    (void)state;
    ds4_err err;
    /* 10 GiB available, 2 GiB of weights: 3/4 of 8 GiB holds six 1 GiB sessions */
    ds4_mem_pool p = {"memory", 10 * GIB, 2 * GIB, 0, GIB};
    ds4_capacity c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 6);
    assert_true(c.measured);
    assert_int_equal(c.fits, 6);
    /* the shared state comes off first: 3/4 of 7 GiB holds five */
    p.shared = GIB;
    assert_int_equal(plan(&p, 1, 0, 0, &err).n, 5);
    /* plenty: the cap */
    p = (ds4_mem_pool){"memory", 1000 * GIB, 2 * GIB, 0, GIB};
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 16);
    assert_int_equal(c.fits, 748);
    /* less than the weights: one session all the same */
    p = (ds4_mem_pool){"memory", GIB, 2 * GIB, 0, MIB};
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.fits, 0);
    /* not known: the cap, to be tried */
    p = (ds4_mem_pool){"memory", 0, 2 * GIB, 0, GIB};
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 16);
    assert_false(c.measured);
}

static void test_two_memories(void **state) {
    (void)state;
    ds4_err err;
    /* the GPU holds 3/4 of 8 GiB / 2 GiB = 3, the host 3/4 of 40 GiB / 1 GiB = 30 */
    ds4_mem_pool p[2] = {{"GPU memory", 8 * GIB, 0, 0, 2 * GIB}, {"host memory", 64 * GIB, 24 * GIB, 0, GIB}};
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 3);
    /* the host is the tighter one */
    p[1].room = 28 * GIB;
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 3);
    p[1].room = 26 * GIB;
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 1);
    /* a GPU whose room is not known: the host decides */
    p[0].room = 0;
    p[1].room = 64 * GIB;
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 16);
    /* a given N over the GPU's room names the GPU */
    p[0].room = 8 * GIB;
    plan(p, 2, 5, -1, &err);
    assert_int_equal(err.code, DS4_ENOMEM);
    assert_string_equal(err.msg, "--parallel 5: 5 sessions of 4096 tokens need 10.0 GiB of GPU memory (2.0 GiB "
                                 "each), but 8.0 GiB is available; lower --parallel or --ctx");
    assert_int_equal(plan(p, 2, 4, 0, &err).n, 4);
}

static void test_given(void **state) {
    (void)state;
    ds4_err err;
    /* a given N may fill all of the room left (not three quarters) */
    ds4_mem_pool p = {"memory", 10 * GIB, 2 * GIB, GIB, GIB};
    ds4_capacity c = plan(&p, 1, 7, 0, &err);
    assert_int_equal(c.n, 7);
    assert_int_equal(c.fits, 7);
    plan(&p, 1, 8, -1, &err);
    assert_int_equal(err.code, DS4_ENOMEM);
    assert_string_equal(err.msg, "--parallel 8: 8 sessions of 4096 tokens need 9.0 GiB of memory (1.0 GiB each, "
                                 "1.0 GiB shared), but 8.0 GiB is available beside 2.0 GiB of weights; lower "
                                 "--parallel or --ctx");
    /* more than the cap is the user's to ask */
    p.room = 100 * GIB;
    assert_int_equal(plan(&p, 1, 40, 0, &err).n, 40);
    /* not known: as asked, the sessions find out */
    p.room = 0;
    assert_int_equal(plan(&p, 1, 4096, 0, &err).n, 4096);
}

static void test_explain(void **state) {
    (void)state;
    char buf[192];
    ds4_mem_pool p = {"memory", 10 * GIB, 2 * GIB, 0, GIB};
    assert_string_equal(ds4_capacity_explain(&p, 6, false, buf, sizeof(buf)),
                        "memory: 10.0 GiB available - 2.0 GiB weights, 3/4 of it holds 6 sessions of 1.0 GiB");
    p.shared = 512 * MIB;
    assert_string_equal(ds4_capacity_explain(&p, 5, false, buf, sizeof(buf)),
                        "memory: 10.0 GiB available - 2.0 GiB weights - 512.0 MiB shared, 3/4 of it holds 5 "
                        "sessions of 1.0 GiB");
    assert_string_equal(ds4_capacity_explain(&p, 3, true, buf, sizeof(buf)),
                        "memory: 3 x 1.0 GiB + 512.0 MiB shared = 3.5 GiB of 8.0 GiB available beside 2.0 GiB of "
                        "weights");
    /* a GPU's: the weights are out of its room already */
    ds4_mem_pool g = {"GPU memory", 8 * GIB, 0, 0, 2 * GIB};
    assert_string_equal(ds4_capacity_explain(&g, 3, false, buf, sizeof(buf)),
                        "GPU memory: 8.0 GiB available, 3/4 of it holds 3 sessions of 2.0 GiB");
    assert_string_equal(ds4_capacity_explain(&g, 3, true, buf, sizeof(buf)),
                        "GPU memory: 3 x 2.0 GiB = 6.0 GiB of 8.0 GiB available");
    p.room = 0;
    assert_string_equal(ds4_capacity_explain(&p, 3, true, buf, sizeof(buf)), "memory: not known");
}

static void test_cpu_backend_figures(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(MODEL, &err);
    if (!w) fail_msg("%s", err.msg);
    ds4_backend_opts bo = {.n_threads = 1, .ctx_size = 4096};
    ds4_backend *b = ds4_backend_create("cpu", w, &bo, &err);
    if (!b) fail_msg("%s", err.msg);
    ds4_seq_memory m;
    ds4_seq_memory_of(b, 4096, &m);
    assert_int_equal(m.bytes, ds4_kv_state_bytes(&w->cfg, 4096));
    assert_int_equal(m.bytes, 2874368); /* test_startup.c: MODEL.md 8.1 for this model */
    assert_int_equal(m.host_bytes, 0);
    assert_true(m.in_host);
    assert_int_equal(m.host_weights, ds4_weights_bytes(w));
    /* MemAvailable, read a moment apart */
    uint64_t avail = ds4_mem_available();
    assert_true(m.room > 0 && avail > 0);
    assert_true(m.room / 2 < avail && avail / 2 < m.room);
    ds4_backend_free(b);
    ds4_weights_close(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_from_memory),
        cmocka_unit_test(test_two_memories),
        cmocka_unit_test(test_given),
        cmocka_unit_test(test_explain),
        cmocka_unit_test(test_cpu_backend_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
