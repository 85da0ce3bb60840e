/*
 * test_capacity.c - the sessions' memory and their number
 * (engine/capacity.h), from given memory figures:
 *  - the budget: three quarters of the room left beside the weights and
 *    the shared state, at least one session of the least; --kv-mem-mb's
 *    when given; none when the room is not known;
 *  - without --parallel: as many of the least as the budgets hold, at most
 *    the cap; the tightest of two memories (a GPU's and the host's)
 *    decides;
 *  - a given --parallel must fit N of the least in every budget, else the
 *    error names the memory needed and the budget; a given budget below
 *    one session is refused;
 *  - the granule a context's sessions grow by;
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

static ds4_capacity plan(ds4_mem_pool *p, size_t n, uint32_t given, int want_rc, ds4_err *err) {
    ds4_capacity c;
    memset(err, 0, sizeof(*err));
    assert_int_equal(ds4_capacity_plan(p, n, 4096, given, 16, &c, err), want_rc);
    return c;
}

/* A pool: room, weights, shared, given, least, most. */
static ds4_mem_pool pool(const char *name, uint64_t room, uint64_t weights, uint64_t shared, uint64_t given,
                         uint64_t least, uint64_t most) {
    return (ds4_mem_pool){name, room, weights, shared, given, least, most, 0};
}

static void test_granule(void **state) {
    (void)state;
    assert_int_equal(ds4_ctx_granule(512), 256);
    assert_int_equal(ds4_ctx_granule(4096), 256);
    assert_int_equal(ds4_ctx_granule(8192), 512);
    assert_int_equal(ds4_ctx_granule(32768), 2048);
    assert_int_equal(ds4_ctx_granule(65536), 4096);
    assert_int_equal(ds4_ctx_granule(1048576), 4096);
}

static void test_default_from_memory(void **state) {
    (void)state;
    ds4_err err;
    /* 10 GiB available, 2 GiB of weights: 6 GiB for sessions, six of 1 GiB */
    ds4_mem_pool p = pool("memory", 10 * GIB, 2 * GIB, 0, 0, GIB, 4 * GIB);
    ds4_capacity c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(p.budget, 6 * GIB);
    assert_int_equal(c.n, 6);
    assert_true(c.measured);
    assert_int_equal(c.fits, 6);
    /* the shared state comes off first: 3/4 of 7 GiB holds five */
    p.shared = GIB;
    assert_int_equal(plan(&p, 1, 0, 0, &err).n, 5);
    /* plenty: the cap */
    p = pool("memory", 1000 * GIB, 2 * GIB, 0, 0, GIB, GIB);
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 16);
    assert_int_equal(c.fits, 748);
    /* less than the weights: one session of the least all the same */
    p = pool("memory", GIB, 2 * GIB, 0, 0, MIB, GIB);
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 1);
    assert_int_equal(p.budget, MIB);
    /* not known: the cap, nothing constrained */
    p = pool("memory", 0, 2 * GIB, 0, 0, GIB, GIB);
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(c.n, 16);
    assert_false(c.measured);
    assert_true(p.budget == UINT64_MAX);
}

static void test_two_memories(void **state) {
    (void)state;
    ds4_err err;
    /* the GPU holds 3/4 of 8 GiB / 2 GiB = 3, the host 3/4 of 40 GiB / 1 GiB = 30 */
    ds4_mem_pool p[2] = {pool("GPU memory", 8 * GIB, 0, 0, 0, 2 * GIB, 8 * GIB),
                         pool("host memory", 64 * GIB, 24 * GIB, 0, 0, GIB, GIB)};
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 3);
    /* the host is the tighter one */
    p[1].room = 26 * GIB;
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 1);
    /* a GPU whose room is not known: the host decides */
    p[0].room = 0;
    p[1].room = 64 * GIB;
    assert_int_equal(plan(p, 2, 0, 0, &err).n, 16);
    /* a given N over the GPU's budget names the GPU */
    p[0].room = 8 * GIB;
    plan(p, 2, 4, -1, &err);
    assert_int_equal(err.code, DS4_ENOMEM);
    assert_string_equal(err.msg, "--parallel 4: 4 sessions of at least 4096 tokens need 8.0 GiB of GPU memory (2.0 "
                                 "GiB each), but the sessions have 6.0 GiB (3/4 of 8.0 GiB available); lower "
                                 "--parallel");
    assert_int_equal(plan(p, 2, 3, 0, &err).n, 3);
}

static void test_given(void **state) {
    (void)state;
    ds4_err err;
    /* --parallel bounds the sessions: N of the least in the budget */
    ds4_mem_pool p = pool("memory", 10 * GIB, 2 * GIB, GIB, 0, GIB, 4 * GIB);
    ds4_capacity c = plan(&p, 1, 5, 0, &err);
    assert_int_equal(c.n, 5);
    plan(&p, 1, 6, -1, &err);
    assert_int_equal(err.code, DS4_ENOMEM);
    assert_string_equal(err.msg, "--parallel 6: 6 sessions of at least 4096 tokens need 6.0 GiB of memory (1.0 GiB "
                                 "each), but the sessions have 5.2 GiB (3/4 of 10.0 GiB available - 2.0 GiB weights "
                                 "- 1.0 GiB shared); lower --parallel");
    /* more than the cap is the user's to ask */
    p.room = 100 * GIB;
    assert_int_equal(plan(&p, 1, 40, 0, &err).n, 40);
    /* --kv-mem-mb: the budget, whatever the room */
    p.given = 3 * GIB;
    c = plan(&p, 1, 0, 0, &err);
    assert_int_equal(p.budget, 3 * GIB);
    assert_int_equal(c.n, 3);
    plan(&p, 1, 4, -1, &err);
    assert_non_null(strstr(err.msg, "but the sessions have 3.0 GiB (--kv-mem-mb)"));
    /* below one session of the least */
    p.given = 512 * MIB;
    plan(&p, 1, 0, -1, &err);
    assert_string_equal(err.msg, "a session of 4096 tokens needs 1.0 GiB of memory, but the sessions have 512.0 MiB "
                                 "(--kv-mem-mb); lower --ctx or free memory");
    /* not known: as asked */
    p = pool("memory", 0, 2 * GIB, 0, 0, GIB, GIB);
    assert_int_equal(plan(&p, 1, 4096, 0, &err).n, 4096);
}

static void test_explain(void **state) {
    (void)state;
    char buf[256];
    ds4_err err;
    ds4_mem_pool p = pool("memory", 10 * GIB, 2 * GIB, 0, 0, GIB, 4 * GIB);
    plan(&p, 1, 0, 0, &err);
    assert_string_equal(ds4_capacity_explain(&p, buf, sizeof(buf)),
                        "memory: 6.0 GiB for sessions (3/4 of 10.0 GiB available - 2.0 GiB weights), 6 of the least "
                        "or 1 of the most at once");
    p.shared = 512 * MIB;
    plan(&p, 1, 0, 0, &err);
    assert_string_equal(ds4_capacity_explain(&p, buf, sizeof(buf)),
                        "memory: 5.6 GiB for sessions (3/4 of 10.0 GiB available - 2.0 GiB weights - 512.0 MiB "
                        "shared), 5 of the least or 1 of the most at once");
    p.given = 8 * GIB;
    plan(&p, 1, 0, 0, &err);
    assert_string_equal(ds4_capacity_explain(&p, buf, sizeof(buf)),
                        "memory: 8.0 GiB for sessions (--kv-mem-mb), 8 of the least or 2 of the most at once");
    /* a GPU's: the weights are out of its room already */
    ds4_mem_pool g = pool("GPU memory", 8 * GIB, 0, 0, 0, 2 * GIB, 2 * GIB);
    plan(&g, 1, 0, 0, &err);
    assert_string_equal(ds4_capacity_explain(&g, buf, sizeof(buf)),
                        "GPU memory: 6.0 GiB for sessions (3/4 of 8.0 GiB available), 3 of the least or 3 of the most "
                        "at once");
    g.room = 0;
    plan(&g, 1, 0, 0, &err);
    assert_string_equal(ds4_capacity_explain(&g, buf, sizeof(buf)), "GPU memory: not known");
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
        cmocka_unit_test(test_granule),      cmocka_unit_test(test_default_from_memory),
        cmocka_unit_test(test_two_memories), cmocka_unit_test(test_given),
        cmocka_unit_test(test_explain),      cmocka_unit_test(test_cpu_backend_figures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
