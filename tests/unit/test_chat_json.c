/*
 * test_chat_json.c - the Python-compatible JSON writer behind the chat and
 * DSML renderers: json.dumps(ensure_ascii=False) of 1,500 doubles (random
 * bit patterns, decimal-looking values, edge cases: -0.0, 1e16, 5e-324)
 * and of objects with control characters, Unicode, nesting and duplicate
 * keys.  Goldens: tests/golden/text/pyjson.txt from
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
            json_t *v = json_loadb(json_string_value(in), json_string_length(in), JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            assert_non_null(v);
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
    assert_int_equal(dumps, 6);
    free(gold);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_python),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
