/*
 * test_chat_json.c - the Python-compatible JSON writer behind the chat and
 * DSML renderers: json.dumps(ensure_ascii=False) of 1,500 doubles (random
 * bit patterns, decimal-looking values, edge cases: -0.0, 1e16, 5e-324)
 * and of objects with control characters, Unicode, nesting and duplicate
 * keys, and the reader (json.loads: integers beyond 64 bits, 1e400, NaN;
 * what Python refuses refused).  Goldens: tests/golden/text/pyjson.txt from
 * tests/reference/pyjson_goldens.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "text/pyjson.h"
#include "text_testdata.h"

/* One JSON string at *p; advances past it. */
static json_t *next_string(const char **p) {
    json_error_t je;
    json_t *s = json_loadb(*p, strlen(*p), JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_ALLOW_NUL, &je);
    if (!json_is_string(s)) fail_msg("bad golden line near \"%.40s\": %s", *p, je.text);
    *p += je.position;
    while (**p == ' ') (*p)++;
    return s;
}

static void test_matches_python(void **state) {
    (void)state;
    size_t len;
    char *gold = test_read_file("tests/golden/text/pyjson.txt", &len);
    int floats = 0, dumps = 0;
    for (char *line = strtok(gold, "\n"); line; line = strtok(NULL, "\n")) {
        ds4_strbuf b = {0};
        if (strncmp(line, "float ", 6) == 0) {
            uint64_t bits = strtoull(line + 6, NULL, 16);
            double x;
            memcpy(&x, &bits, sizeof(x));
            ds4_pyjson_float(&b, x);
            const char *want = strchr(line + 6, ' ') + 1;
            if (strcmp(b.p, want) != 0) fail_msg("%016llx: got %s, Python %s", (unsigned long long)bits, b.p, want);
            floats++;
        } else if (strncmp(line, "dump ", 5) == 0) {
            const char *p = line + 5;
            json_t *in = next_string(&p), *want = next_string(&p);
            ds4_err err = {0};
            json_t *v = ds4_pyjson_load(json_string_value(in), json_string_length(in), &err);
            if (!v) fail_msg("%s", err.msg);
            ds4_pyjson_dump(&b, v);
            assert_int_equal(b.len, json_string_length(want));
            assert_memory_equal(b.p, json_string_value(want), b.len);
            json_decref(v);
            json_decref(in);
            json_decref(want);
            dumps++;
        }
        ds4_strbuf_free(&b);
    }
    assert_int_equal(floats, 1530);
    assert_int_equal(dumps, 9);
    free(gold);
}

/* What Python's json.loads refuses is refused (with the byte offset), what
 * it reads is read; a big number is told apart from a string that spells
 * the same digits. */
static void test_load_strictness(void **state) {
    (void)state;
    static const char *const bad[] = {"01",         "1.", "-",       "[1,]", "{\"a\" 1}",  "\"\\x\"",
                                      "{\"a\":1,}", "1e", "[1] x",   "tru",  "-Infinityx", "\"a\nb\"",
                                      "",           "[",  "{\"a\":", "\"abc"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ds4_err err = {0};
        json_t *v = ds4_pyjson_load(bad[i], strlen(bad[i]), &err);
        if (v) fail_msg("accepted \"%s\"", bad[i]);
        assert_int_equal(err.code, DS4_EFORMAT);
        assert_non_null(strstr(err.msg, "at byte"));
    }
    char digits[4310];
    memset(digits, '7', 4301);
    ds4_err err = {0};
    assert_null(ds4_pyjson_load(digits, 4301, &err));
    assert_int_equal(err.code, DS4_ERANGE);
    digits[0] = '-'; /* 4300 digits and a sign: Python reads it */
    json_t *v = ds4_pyjson_load(digits, 4301, &err);
    assert_non_null(v);
    assert_int_equal(strlen(ds4_pyjson_big_number(v)), 4301);
    json_decref(v);

    const char *doc = "{\"s\": \"123456789012345678901234567890\", \"n\": 123456789012345678901234567890, "
                      "\"i\": -9223372036854775808, \"r\": 1e400}";
    v = ds4_pyjson_load(doc, strlen(doc), &err);
    assert_non_null(v);
    assert_null(ds4_pyjson_big_number(json_object_get(v, "s")));
    assert_string_equal(ds4_pyjson_big_number(json_object_get(v, "n")), "123456789012345678901234567890");
    assert_true(json_is_integer(json_object_get(v, "i")));
    assert_true(json_integer_value(json_object_get(v, "i")) == INT64_MIN);
    assert_string_equal(ds4_pyjson_big_number(json_object_get(v, "r")), "Infinity");
    json_decref(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_python),
        cmocka_unit_test(test_load_strictness),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
