/*
 * test_eval.c - ds4-eval's grading and question files (apps/ds4-eval):
 *   - the "Answer:" extraction: the last one after the thinking, markdown
 *     around it, the value on the next line, none at all;
 *   - letters, integers and line sets on edge cases: extra text, several
 *     Answer: lines, unicode digits and minus signs, thousands separators,
 *     LaTeX boxes, ranges (hyphen, en dash, "to"), "0" for none, accepted
 *     equivalent sets, garbage refused;
 *   - question files: each schema (ds4-eval's, GPQA's columns, SuperGPQA's,
 *     AIME's) loads, GPQA's CSV too (quoted fields with commas, quotes and
 *     newlines); malformed lines name the file, the line and the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "eval.h"

static void test_extract(void **state) {
    (void)state;
    size_t n;
    const char *a = eval_extract("blah\nAnswer: B\n", &n);
    assert_non_null(a);
    assert_int_equal(n, 1);
    assert_memory_equal(a, "B", 1);
    /* the last one counts; one inside the thinking does not */
    a = eval_extract("<think>Answer: A</think>first Answer: C then\nAnswer: D", &n);
    assert_memory_equal(a, "D", n);
    a = eval_extract("<think>so Answer: A</think>no final line", &n);
    assert_null(a);
    a = eval_extract("**Answer:** 42  \n", &n);
    assert_int_equal(n, 2);
    assert_memory_equal(a, "42", 2);
    a = eval_extract("answer:\n\n  7, 9\n", &n);
    assert_memory_equal(a, "7, 9", n);
    assert_null(eval_extract("Answer:   \n", &n));
    assert_null(eval_extract("no answer here", &n));
}

static void test_letters(void **state) {
    (void)state;
    char c;
/* clang-format off */
#define L(s, want)                                                          \
    do {                                                                    \
        assert_int_equal(eval_parse_letter(s, strlen(s), 4, &c), 0);       \
        assert_int_equal(c, want);                                          \
    } while (0)
/* clang-format on */
#define NOT_L(s) assert_int_equal(eval_parse_letter(s, strlen(s), 4, &c), -1)
    L("B", 'B');
    L("(C)", 'C');
    L("D. 3.2 eV, because the gap is wide", 'D');
    L("A) the first one", 'A');
    L("b", 'B');
    L("Option C", 'C');
    L("\\boxed{A}", 'A');
    L("**B**", 'B');
    L("[D]", 'D');
    NOT_L("E");             /* only four choices */
    NOT_L("Both");          /* a word, not a letter */
    NOT_L("a bit of both"); /* a lowercase article */
    NOT_L("");
    NOT_L("42");
#undef L
#undef NOT_L
}

static void test_integers(void **state) {
    (void)state;
    long long v;
/* clang-format off */
#define I(s, want)                                                     \
    do {                                                               \
        assert_int_equal(eval_parse_integer(s, strlen(s), &v), 0);    \
        assert_int_equal(v, want);                                     \
    } while (0)
/* clang-format on */
#define NOT_I(s) assert_int_equal(eval_parse_integer(s, strlen(s), &v), -1)
    I("42", 42);
    I("042", 42);
    I(" 42. ", 42);
    I("-17", -17);
    I("\xe2\x88\x92"
      "17",
      -17); /* U+2212 minus sign */
    I("1,234", 1234);
    I("1 234 567", 1234567);
    I("1\xe2\x80\xaf"
      "234",
      1234); /* narrow no-break space */
    I("\\boxed{204}", 204);
    I("$204$", 204);
    I("42.0", 42);
    I("\xef\xbc\x94\xef\xbc\x92", 42); /* fullwidth ４２ */
    I("\xd9\xa4\xd9\xa2", 42);         /* Arabic-Indic ٤٢ */
    I("\xe0\xa5\xaa\xe0\xa5\xa8", 42); /* Devanagari ४२ */
    I("**73**", 73);
    NOT_I("42.5");
    NOT_I("4/3");
    NOT_I("12,34"); /* not a thousands group */
    NOT_I("42 or 43");
    NOT_I("forty-two");
    NOT_I("");
    NOT_I("-");
    NOT_I("4\xe2\x82\x82"); /* a subscript is no digit here */
#undef I
#undef NOT_I
}

static void lines_is(const char *s, const char *want) {
    eval_lines l;
    if (eval_parse_lines(s, strlen(s), &l) != 0) fail_msg("\"%s\" not parsed", s);
    char buf[256];
    eval_lines_format(&l, buf, sizeof(buf));
    if (strcmp(buf, want)) fail_msg("\"%s\" -> \"%s\", want \"%s\"", s, buf, want);
}

static void test_lines(void **state) {
    (void)state;
    lines_is("12", "12");
    lines_is("15-17, 12", "12, 15-17");
    lines_is("lines 3 and 5", "3, 5");
    lines_is("line 7 to 9", "7-9");
    lines_is("L4, L6", "4, 6");
    lines_is("8\xe2\x80\x93"
             "10",
             "8-10"); /* en dash */
    lines_is("3, 3, 4", "3-4");
    lines_is("0", "0");
    lines_is("\xef\xbc\x91\xef\xbc\x92", "12");
    lines_is("12.", "12");
    eval_lines l;
    assert_int_equal(eval_parse_lines("10-5", 5, &l), -1);   /* backwards */
    assert_int_equal(eval_parse_lines("1-1000", 6, &l), -1); /* too many */
    assert_int_equal(eval_parse_lines("none", 4, &l), -1);
    assert_int_equal(eval_parse_lines("12 because", 10, &l), -1);
    assert_int_equal(eval_parse_lines("", 0, &l), -1);
}

/* A question set in a temporary file (suffix: ".csv" or ""). */
static char *write_set_as(const char *text, const char *suffix) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/ds4-eval-XXXXXX%s", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static char *write_set(const char *text) { return write_set_as(text, ""); }

static void test_grade(void **state) {
    (void)state;
    const char *set =
        "{\"id\": \"c1\", \"kind\": \"choice\", \"question\": \"Q?\", \"choices\": [\"x\", \"y\", \"z\"], \"answer\": \"B\"}\n"
        "{\"id\": \"i1\", \"kind\": \"integer\", \"question\": \"2+2?\", \"answer\": 4}\n"
        "{\"id\": \"l1\", \"kind\": \"lines\", \"question\": \"Which?\", \"code\": \"a\\nb\\nc\", \"answer\": [2, 3],"
        " \"accept\": [\"2\", [3]]}\n";
    char *path = write_set(set);
    eval_set s = {0};
    ds4_err err = {0};
    if (eval_set_load(&s, path, &err)) fail_msg("%s", err.msg);
    unlink(path);
    assert_int_equal(s.n, 3);
    char got[128], why[256];
    assert_true(eval_grade(&s.q[0], "<think>maybe A</think>It is y.\nAnswer: B", got, sizeof(got), why, sizeof(why)));
    assert_string_equal(got, "B");
    assert_false(eval_grade(&s.q[0], "Answer: B\nWait, no.\nAnswer: C", got, sizeof(got), why, sizeof(why)));
    assert_string_equal(why, "letter C, expected B");
    assert_false(eval_grade(&s.q[0], "I think y", got, sizeof(got), why, sizeof(why)));
    assert_string_equal(got, "(no Answer: line)");
    assert_true(eval_grade(&s.q[1], "Answer: \xef\xbc\x94", got, sizeof(got), why, sizeof(why)));
    assert_false(eval_grade(&s.q[1], "Answer: four", got, sizeof(got), why, sizeof(why)));
    assert_non_null(strstr(got, "(unreadable: four)"));
    assert_true(eval_grade(&s.q[2], "Answer: 2-3", got, sizeof(got), why, sizeof(why)));
    assert_string_equal(why, "lines 2-3, the answer");
    assert_true(eval_grade(&s.q[2], "Answer: line 3", got, sizeof(got), why, sizeof(why)));
    assert_string_equal(why, "lines 3, an accepted equivalent");
    assert_false(eval_grade(&s.q[2], "Answer: 1-3", got, sizeof(got), why, sizeof(why)));
    assert_string_equal(why, "lines 1-3, expected 2-3 or an accepted equivalent");
    char *p = eval_prompt(&s.q[2]);
    assert_non_null(strstr(p, "  2 | b\n"));
    assert_non_null(strstr(p, "Answer: 0"));
    free(p);
    p = eval_prompt(&s.q[0]);
    assert_non_null(strstr(p, "B) y\nC) z\n"));
    free(p);
    eval_set_free(&s);
}

static void test_public_schemas(void **state) {
    (void)state;
    const char *set =
        "{\"Record ID\": \"rec1\", \"Question\": \"Q?\", \"Correct Answer\": \"right\", \"Incorrect Answer 1\": \"w1\","
        " \"Incorrect Answer 2\": \"w2\", \"Incorrect Answer 3\": \"w3\"}\n"
        "{\"uuid\": \"u1\", \"question\": \"Q?\", \"options\": [\"a\", \"b\", \"c\", \"d\", \"e\"], \"answer_letter\": \"E\"}\n"
        "# AIME\n"
        "{\"id\": \"aime-1\", \"problem\": \"Find N.\", \"answer\": \"070\"}\n";
    char *path = write_set(set);
    eval_set s = {0};
    ds4_err err = {0};
    if (eval_set_load(&s, path, &err)) fail_msg("%s", err.msg);
    unlink(path);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.q[0].kind, EVAL_CHOICE);
    assert_int_equal(s.q[0].n_choices, 4);
    assert_string_equal(s.q[0].choices[s.q[0].answer_letter - 'A'], "right");
    assert_string_equal(s.q[1].id, "u1");
    assert_int_equal(s.q[1].answer_letter, 'E');
    assert_int_equal(s.q[2].kind, EVAL_INTEGER);
    assert_int_equal(s.q[2].answer_int, 70);
    eval_set_free(&s);
}

static void test_gpqa_csv(void **state) {
    (void)state;
    const char *csv = "Pre-Revision Question,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,"
                      "Incorrect Answer 3,Record ID\r\n"
                      "x,\"Which is right?\nIt has \"\"quotes\"\", commas\",right,w1,w2,w3,recA\r\n"
                      "\r\n"
                      "y,Second?,r2,a,b,c,recB\r\n";
    char *path = write_set_as(csv, ".csv");
    eval_set s = {0};
    ds4_err err = {0};
    if (eval_set_load(&s, path, &err)) fail_msg("%s", err.msg);
    unlink(path);
    assert_int_equal(s.n, 2);
    assert_string_equal(s.q[0].id, "recA");
    assert_string_equal(s.q[0].text, "Which is right?\nIt has \"quotes\", commas");
    assert_string_equal(s.q[0].choices[s.q[0].answer_letter - 'A'], "right");
    assert_string_equal(s.q[1].choices[s.q[1].answer_letter - 'A'], "r2");
    eval_set_free(&s);
    path = write_set_as("Question,Correct Answer\nq,\"open\n", ".csv");
    assert_int_equal(eval_set_load(&s, path, &err), -1);
    assert_non_null(strstr(err.msg, ":2: a quoted field is not closed"));
    eval_set_free(&s);
    unlink(path);
    path = write_set_as("Question,Correct Answer\nq,a,extra\n", ".csv");
    assert_int_equal(eval_set_load(&s, path, &err), -1);
    assert_non_null(strstr(err.msg, ":2: 3 fields, the header has 2"));
    eval_set_free(&s);
    unlink(path);
}

static void bad_set(const char *text, const char *want) {
    char *path = write_set(text);
    eval_set s = {0};
    ds4_err err = {0};
    assert_int_equal(eval_set_load(&s, path, &err), -1);
    char full[256];
    snprintf(full, sizeof(full), "%s:%s", path, want);
    if (!strstr(err.msg, full)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, full);
    unlink(path);
    eval_set_free(&s);
}

static void test_malformed(void **state) {
    (void)state;
    bad_set("{\"question\": \"a\", \"answer\": 1}\n{\"question\": 3, \"answer\": 1}\n",
            "2: field \"question\" must be a string");
    bad_set("{\"question\": \"a\"}\n", "1: field \"answer\" is missing");
    bad_set("\n{\"question\": \"a\", \"kind\": \"essay\", \"answer\": 1}\n", "2: field \"kind\" must be");
    bad_set("{\"question\": \"a\", \"choices\": [\"x\", \"y\"], \"answer\": \"C\"}\n",
            "1: field \"answer\" must be the letter of one of the choices");
    bad_set("{\"question\": \"a\", \"kind\": \"lines\", \"answer\": \"x\"}\n",
            "1: field \"answer\" is not a list of line numbers");
    bad_set("{\"question\": \"a\", \"kind\": \"lines\", \"answer\": [1], \"accept\": [[-2]]}\n",
            "1: field \"accept\" must hold line numbers >= 0");
    bad_set("{\"question\": \"a\", \"answer\": \"3.5\"}\n", "1: field \"answer\" must be an integer");
    bad_set("{\"question\": \"a\", \"answer\": 1\n", "1: ");
    bad_set("[1, 2]\n", "1: not a JSON object");
    bad_set("# nothing\n", " no questions");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_extract),   cmocka_unit_test(test_letters),  cmocka_unit_test(test_integers),
        cmocka_unit_test(test_lines),     cmocka_unit_test(test_grade),    cmocka_unit_test(test_public_schemas),
        cmocka_unit_test(test_malformed), cmocka_unit_test(test_gpqa_csv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
