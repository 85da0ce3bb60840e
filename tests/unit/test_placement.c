/*
 * test_placement.c - routed experts between GPU memory and host RAM
 * (model/placement.h): the budget is never exceeded and the reported
 * device bytes are the sum of the allocations the backend makes; a budget
 * below the fixed bytes is refused with the minimum; without a profile
 * whole layers fill from the first, with one the most used experts go
 * first; expected bytes per token add up; profile files round-trip and bad
 * ones are refused; sizes parse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/numparse.h"
#include "format/imatrix.h"
#include "model/placement.h"

#define L     5
#define E     16
#define ALIGN 256

/* Layers of two sizes (0 and 3 have larger experts); down rows odd-sized
 * so that the alignment counts. */
static uint64_t dev_mat[L * DS4_PLACE_TENSORS], host_exp[L];

static ds4_place_in make_in(uint64_t budget, const ds4_expert_profile *p) {
    for (uint32_t l = 0; l < L; l++) {
        uint64_t s = l % 3 == 0 ? 3000 : 1000;
        dev_mat[l * 3 + 0] = s;
        dev_mat[l * 3 + 1] = s;
        dev_mat[l * 3 + 2] = s + 17;
        host_exp[l] = 3 * s - 5;
    }
    ds4_place_in in = {.n_layer = L,
                       .n_expert = E,
                       .k = 2,
                       .budget = budget,
                       .fixed = 100000,
                       .dev_mat = dev_mat,
                       .host_expert = host_exp,
                       .align = ALIGN,
                       .profile = p};
    return in;
}

/* What the backend allocates for a placement: each routed tensor of each
 * layer rounded up, computed here independently. */
static uint64_t allocated(const ds4_place_in *in, const ds4_placement *pl) {
    uint64_t t = in->fixed;
    for (uint32_t l = 0; l < L; l++) {
        uint32_t n = 0;
        for (uint32_t e = 0; e < E; e++) n += pl->on_gpu[l * E + e];
        assert_int_equal(n, pl->n_gpu[l]);
        for (int k = 0; k < 3; k++) t += (dev_mat[l * 3 + k] * n + ALIGN - 1) / ALIGN * ALIGN;
    }
    return t;
}

static void test_budgets(void **state) {
    (void)state;
    for (uint64_t budget = 100000; budget < 600000; budget += 7919) {
        ds4_place_in in = make_in(budget, NULL);
        ds4_placement pl;
        assert_int_equal(ds4_place_experts(&in, &pl, NULL), 0);
        assert_true(pl.dev_total <= budget);
        assert_true(pl.dev_total == allocated(&in, &pl));
        /* no expert left out would have fitted */
        for (uint32_t l = 0; l < L; l++)
            if (pl.n_gpu[l] < E) {
                uint64_t grow = ds4_place_layer_bytes(&in, l, pl.n_gpu[l] + 1) -
                                ds4_place_layer_bytes(&in, l, pl.n_gpu[l]);
                assert_true(pl.dev_total + grow > budget);
            }
        /* whole layers from the first: a layer is partly resident only when
         * every layer before it is whole, or one of them needs more room */
        uint32_t host = 0;
        for (uint32_t l = 0; l < L; l++) {
            for (uint32_t e = 1; e < E; e++) /* the lowest-numbered experts first */
                assert_true(pl.on_gpu[l * E + e] <= pl.on_gpu[l * E + e - 1]);
            host += E - pl.n_gpu[l];
        }
        assert_int_equal(host, pl.host_experts);
        ds4_placement_free(&pl);
    }
}

static void test_all_and_none(void **state) {
    (void)state;
    ds4_place_in in = make_in(UINT64_MAX / 2, NULL);
    ds4_placement pl;
    assert_int_equal(ds4_place_experts(&in, &pl, NULL), 0);
    assert_int_equal(pl.host_experts, 0);
    assert_true(pl.tok_host == 0.0);
    /* expected bytes a token reads: k experts a layer, uniform */
    double want = 0;
    for (uint32_t l = 0; l < L; l++) want += 2.0 * (double)(dev_mat[l * 3] + dev_mat[l * 3 + 1] + dev_mat[l * 3 + 2]);
    assert_true(pl.tok_dev > want * 0.999999 && pl.tok_dev < want * 1.000001);
    ds4_placement_free(&pl);

    in = make_in(100000, NULL); /* exactly the fixed bytes */
    assert_int_equal(ds4_place_experts(&in, &pl, NULL), 0);
    assert_int_equal(pl.host_experts, L * E);
    assert_true(pl.dev_total == 100000);
    double host = 0;
    for (uint32_t l = 0; l < L; l++) host += 2.0 * (double)host_exp[l];
    assert_true(pl.tok_host > host * 0.999999 && pl.tok_host < host * 1.000001);
    ds4_placement_free(&pl);
}

static void test_too_small(void **state) {
    (void)state;
    ds4_place_in in = make_in(99999, NULL);
    ds4_placement pl;
    ds4_err err = {0};
    assert_int_equal(ds4_place_experts(&in, &pl, &err), -1);
    assert_non_null(strstr(ds4_err_msg(&err), "100000 bytes"));
    assert_non_null(strstr(ds4_err_msg(&err), "at least"));
}

static void test_profile_order(void **state) {
    (void)state;
    ds4_expert_profile *p = ds4_expert_profile_new(L, E, NULL);
    assert_non_null(p);
    uint64_t s = 12345;
    for (uint32_t i = 0; i < L * E; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        p->use[i] = (double)(s >> 40);
    }
    ds4_place_in in = make_in(300000, p);
    ds4_placement pl;
    assert_int_equal(ds4_place_experts(&in, &pl, NULL), 0);
    assert_true(pl.dev_total == allocated(&in, &pl));
    assert_true(pl.dev_total <= 300000);
    /* within a layer, every resident expert is used at least as much as
     * every host one */
    for (uint32_t l = 0; l < L; l++) {
        double sum = 0, min_in = 1e300, max_out = -1;
        for (uint32_t e = 0; e < E; e++) sum += p->use[l * E + e];
        for (uint32_t e = 0; e < E; e++) {
            double v = p->use[l * E + e];
            if (pl.on_gpu[l * E + e]) min_in = v < min_in ? v : min_in;
            else max_out = v > max_out ? v : max_out;
        }
        if (pl.n_gpu[l] && pl.n_gpu[l] < E) assert_true(min_in >= max_out);
    }
    /* a profile moves host reads below the uniform placement's */
    ds4_place_in un = make_in(300000, NULL);
    ds4_placement pu;
    assert_int_equal(ds4_place_experts(&un, &pu, NULL), 0);
    double host_p = 0;
    for (uint32_t l = 0; l < L; l++) {
        double sum = 0;
        for (uint32_t e = 0; e < E; e++) sum += p->use[l * E + e];
        for (uint32_t e = 0; e < E; e++)
            if (!pl.on_gpu[l * E + e]) host_p += 2.0 * p->use[l * E + e] / sum * (double)host_exp[l];
    }
    assert_true(pl.tok_host > host_p * 0.999999 && pl.tok_host < host_p * 1.000001);
    ds4_placement_free(&pl);
    ds4_placement_free(&pu);

    /* save and load */
    char path[] = "test_placement_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    p->tokens = 777;
    assert_int_equal(ds4_expert_profile_save(p, path, NULL), 0);
    ds4_expert_profile *q = ds4_expert_profile_load(path, L, E, NULL);
    assert_non_null(q);
    assert_int_equal(q->tokens, 777);
    assert_memory_equal(q->use, p->use, L * E * sizeof(double));
    ds4_expert_profile_free(q);
    ds4_err err = {0};
    assert_null(ds4_expert_profile_load(path, L + 1, E, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "5 layers x 16 experts"));
    FILE *fp = fopen(path, "w");
    fprintf(fp, "ds4-expert-profile 1\nlayers 5 experts 16 tokens 3\n1 2 3\n");
    fclose(fp);
    assert_null(ds4_expert_profile_load(path, L, E, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "count 3"));
    unlink(path);
    ds4_expert_profile_free(p);
}

/* An imatrix serves as a profile: the sum of each expert's gate vector. */
static void test_imatrix_profile(void **state) {
    (void)state;
    ds4_imatrix *im = ds4_imatrix_new(NULL);
    assert_non_null(im);
    for (uint32_t l = 0; l < L; l++) {
        char name[64];
        snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", l);
        ds4_imatrix_entry *e = ds4_imatrix_entry_get(im, name, E * 4, NULL);
        assert_non_null(e);
        e->ncall = 10;
        for (uint32_t i = 0; i < E * 4; i++) e->values[i] = (float)(l + i / 4);
    }
    char path[] = "test_placement_im_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ds4_imatrix_save(im, path, NULL), 0);
    ds4_imatrix_free(im);
    ds4_expert_profile *p = ds4_expert_profile_load(path, L, E, NULL);
    assert_non_null(p);
    assert_true(p->use[2 * E + 3] == 4.0 * (2 + 3));
    ds4_expert_profile_free(p);
    unlink(path);
}

static void test_sizes(void **state) {
    (void)state;
    uint64_t v = 0;
    assert_int_equal(ds4_parse_size("24G", &v), 0);
    assert_true(v == 24ull << 30);
    assert_int_equal(ds4_parse_size("24GiB", &v), 0);
    assert_true(v == 24ull << 30);
    assert_int_equal(ds4_parse_size("512m", &v), 0);
    assert_true(v == 512ull << 20);
    assert_int_equal(ds4_parse_size("1.5T", &v), 0);
    assert_true(v == 3ull << 39);
    assert_int_equal(ds4_parse_size("81000000000", &v), 0);
    assert_true(v == 81000000000ull);
    const char *bad[] = {"", "G", "-1G", "24X", "24GG", "1.5", " 2G", "2G ", "1e30T"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) assert_int_equal(ds4_parse_size(bad[i], &v), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budgets),       cmocka_unit_test(test_all_and_none),    cmocka_unit_test(test_too_small),
        cmocka_unit_test(test_profile_order), cmocka_unit_test(test_imatrix_profile), cmocka_unit_test(test_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
