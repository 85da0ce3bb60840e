/*
 * test_strindex.c - the string index: every key found after growth,
 * duplicates reported without replacing, absent keys give SIZE_MAX.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "base/strindex.h"

static void test_put_get_grow(void **state) {
    (void)state;
    enum { N = 5000 };
    static char keys[N][16];
    ds4_strindex ix;
    assert_int_equal(ds4_strindex_init(&ix, 4), 0);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "blk.%d.w", i);
        assert_int_equal(ds4_strindex_put(&ix, keys[i], (size_t)i), 0);
    }
    assert_int_equal(ix.count, N);
    for (int i = 0; i < N; i++) assert_int_equal(ds4_strindex_get(&ix, keys[i]), (size_t)i);
    assert_int_equal(ds4_strindex_put(&ix, "blk.7.w", 99), 1);
    assert_int_equal(ds4_strindex_get(&ix, "blk.7.w"), 7);
    assert_int_equal(ds4_strindex_get(&ix, "blk.5000.w"), SIZE_MAX);
    assert_int_equal(ds4_strindex_get(&ix, ""), SIZE_MAX);
    ds4_strindex_free(&ix);
}

static void test_zeroed_index(void **state) {
    (void)state;
    ds4_strindex ix = {0};
    assert_int_equal(ds4_strindex_get(&ix, "a"), SIZE_MAX);
    assert_int_equal(ds4_strindex_put(&ix, "a", 3), 0);
    assert_int_equal(ds4_strindex_get(&ix, "a"), 3);
    ds4_strindex_free(&ix);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_grow),
        cmocka_unit_test(test_zeroed_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
