/*
 * test_numparse.c - option values: whole decimal numbers in range are
 * accepted with their exact value; blanks, signs, trailing text, overflow
 * and out-of-range values are refused and leave the output untouched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "base/numparse.h"

static void test_u64_accepts(void **state) {
    (void)state;
    uint64_t v = 7;
    assert_int_equal(ds4_parse_u64("0", 0, 10, &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(ds4_parse_u64("4096", 1, 4096, &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(ds4_parse_u64("18446744073709551615", 0, UINT64_MAX, &v), 0);
    assert_true(v == UINT64_MAX);
    assert_int_equal(ds4_parse_u64("007", 0, 10, &v), 0);
    assert_int_equal(v, 7);
}

static void test_u64_refuses(void **state) {
    (void)state;
    const char *bad[] = {"", " 5", "+5", "-1", "5 ", "5x", "4k", "1e3", "0x10", "18446744073709551616", "4097", "0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 42;
        assert_int_equal(ds4_parse_u64(bad[i], 1, 4096, &v), -1);
        assert_int_equal(v, 42);
    }
    uint64_t v = 42;
    assert_int_equal(ds4_parse_u64(NULL, 0, 10, &v), -1);
}

static void test_u32_range(void **state) {
    (void)state;
    uint32_t v = 3;
    assert_int_equal(ds4_parse_u32("4294967295", 0, UINT32_MAX, &v), 0);
    assert_true(v == UINT32_MAX);
    v = 3;
    assert_int_equal(ds4_parse_u32("4294967296", 0, UINT32_MAX, &v), -1);
    assert_int_equal(v, 3);
    assert_int_equal(ds4_parse_u32("15", 16, 1u << 24, &v), -1);
    assert_int_equal(ds4_parse_u32("16", 16, 1u << 24, &v), 0);
    assert_int_equal(v, 16);
}

static void test_float(void **state) {
    (void)state;
    float f = 9.0f;
    assert_int_equal(ds4_parse_float("0.5", 0.0f, 1.0f, &f), 0);
    assert_true(f == 0.5f);
    assert_int_equal(ds4_parse_float("1e-1", 0.0f, 1.0f, &f), 0);
    assert_true(f == 0.1f);
    const char *bad[] = {"", "x", "0.5x", "nan", "inf", "1.5", "-0.1", "1e999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        f = 9.0f;
        assert_int_equal(ds4_parse_float(bad[i], 0.0f, 1.0f, &f), -1);
        assert_true(f == 9.0f);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_u64_accepts),
        cmocka_unit_test(test_u64_refuses),
        cmocka_unit_test(test_u32_range),
        cmocka_unit_test(test_float),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
