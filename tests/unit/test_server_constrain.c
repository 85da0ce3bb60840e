/*
 * test_server_constrain.c - ds4-server's constrained decoding
 * (apps/ds4-server/constrain.c) on the real DeepSeek V4 vocabulary:
 * which JSON schemas compile and which are refused by name; answers
 * tokenized as the tokenizer would split them pass or fail the mask token
 * by token; a random "model" (random logits, argmax of the masked ones)
 * always writes JSON that parses and fits its schema; prefixes (tool calls
 * required) and forbidden tool-call blocks (tool_choice none).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "constrain.h"
#include "server.h"
#include "text/tokenizer.h"
#include "text_testdata.h"

static cvocab *CV;
static ds4_tokenizer *TOK;
static float *LOGITS;
static int NV;

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    CV = cvocab_new(test_vocab(), &err);
    TOK = ds4_tokenizer_new(test_vocab(), &err);
    NV = (int)ds4_vocab_size(test_vocab());
    LOGITS = malloc((size_t)NV * sizeof(float));
    return CV && TOK && LOGITS ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    cvocab_free(CV);
    ds4_tokenizer_free(TOK);
    free(LOGITS);
    return 0;
}

/* Every token of `text` (split as the tokenizer splits it) is allowed in
 * turn; with `end`, EOS is allowed after it (and only EOS, for JSON). */
static bool passes(constraint *c, const char *text, bool end) {
    ds4_tokens t = {0};
    ds4_err err = {0};
    if (ds4_tokenize_text(TOK, text, strlen(text), &t, &err)) fail_msg("%s", err.msg);
    bool ok = true;
    for (size_t i = 0; i < t.n && ok; i++) {
        for (int k = 0; k < NV; k++) LOGITS[k] = 0;
        constraint_mask(c, LOGITS, NV);
        ok = LOGITS[t.ids[i]] != -INFINITY;
        if (!ok && getenv("DEBUG_CONSTRAIN")) {
            ds4_str b = ds4_vocab_token_bytes(test_vocab(), t.ids[i]);
            fprintf(stderr, "refused token %zu [%.*s] of [%s]\n", i, (int)b.len, b.ptr, text);
        }
        constraint_advance(c, t.ids[i]);
    }
    if (ok && end) {
        for (int k = 0; k < NV; k++) LOGITS[k] = 0;
        constraint_mask(c, LOGITS, NV);
        ok = LOGITS[ds4_vocab_eos(test_vocab())] == 0;
    }
    ds4_tokens_free(&t);
    return ok;
}

static jschema *schema(const char *json) {
    json_t *v = json_loads(json, JSON_DECODE_ANY, NULL);
    char why[400];
    jschema *s = jschema_compile(v, why, sizeof(why));
    json_decref(v);
    if (!s) fail_msg("schema %s refused: %s", json, why);
    return s;
}

static void refused(const char *json, const char *needle) {
    json_t *v = json_loads(json, JSON_DECODE_ANY, NULL);
    char why[400];
    jschema *s = jschema_compile(v, why, sizeof(why));
    json_decref(v);
    if (s) fail_msg("schema %s accepted", json);
    if (!strstr(why, needle)) fail_msg("\"%s\" lacks \"%s\"", why, needle);
}

/* A JSON answer for a schema: passes (with EOS after) or not. */
static bool json_ok(const jschema *s, const char *text) {
    ds4_err err = {0};
    constraint *c = constraint_new(CV, &err);
    constraint_set_json(c, s);
    bool ok = passes(c, text, true);
    constraint_free(c);
    return ok;
}

static void test_schema_compile(void **state) {
    (void)state;
    jschema_free(schema("{}"));
    jschema_free(schema("true"));
    jschema_free(schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"description\":\"d\","
                        "\"format\":\"date\"}},\"required\":[\"a\"],\"additionalProperties\":false,\"title\":\"t\"}"));
    jschema_free(schema("{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/N\"}}}},"
                        "\"$ref\":\"#/$defs/N\"}"));
    jschema_free(schema("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"null\"}]}"));
    jschema_free(schema("{\"type\":[\"string\",\"null\"],\"maxLength\":3}"));
    refused("{\"type\":\"string\",\"pattern\":\"^a$\"}", "keyword \"pattern\"");
    refused("{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1}}}",
            ".properties.n: keyword \"minimum\"");
    refused("{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"properties\":{}}]}", "both can be an object");
    refused("{\"type\":\"object\",\"required\":[\"x\"]}", "required property \"x\"");
    refused("{\"$ref\":\"#/$defs/missing\"}", "names no definition");
    refused("{\"$ref\":\"http://example.com/s.json\"}", "not supported");
    refused("false", "admits no value");
    refused("{\"type\":\"mystery\"}", "unknown type");
    refused("{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", "allOf");
}

static void test_json_answers(void **state) {
    (void)state;
    jschema *s = schema(
        "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"n\":{\"type\":\"integer\"},"
        "\"tag\":{\"enum\":[\"red\",\"green\"]}},\"required\":[\"ok\",\"n\"],\"additionalProperties\":false}");
    assert_true(json_ok(s, "{\"ok\":true,\"n\":12}"));
    assert_true(json_ok(s, "{\"n\": -3, \"ok\": false, \"tag\": \"green\"}"));
    assert_true(json_ok(s, "\n{\n  \"ok\": true,\n  \"n\": 0\n}\n"));
    assert_false(json_ok(s, "{\"ok\":true}"));           /* n required */
    assert_false(json_ok(s, "{\"ok\":true,\"n\":1.5}")); /* integer */
    assert_false(json_ok(s, "{\"ok\":true,\"n\":01}"));  /* leading zero */
    assert_false(json_ok(s, "{\"ok\":\"yes\",\"n\":1}"));
    assert_false(json_ok(s, "{\"ok\":true,\"n\":1,\"x\":2}"));      /* no other keys */
    assert_false(json_ok(s, "{\"ok\":true,\"n\":1,\"ok\":false}")); /* no key twice */
    assert_false(json_ok(s, "{\"ok\":true,\"n\":1,\"tag\":\"blue\"}"));
    assert_false(json_ok(s, "{\"ok\":true,\"nn\":1}"));
    assert_false(json_ok(s, "{\"ok\":true,\"n<x\":1}"));
    assert_false(json_ok(s, "{\"ok\":true,\"n\":1} and more"));
    assert_false(json_ok(s, "Sure! {\"ok\":true,\"n\":1}"));
    assert_false(json_ok(s, "{\"ok\":true,\"n\":1}                    ")); /* white space is bounded */
    jschema_free(s);
    /* Any object (json_object), with nesting, escapes and Unicode. */
    s = jschema_any_object();
    assert_true(json_ok(s, "{\"a\":[1,2.5e-3,{\"b\":null}],\"c\\\"\\u00e9\":\"x\\ny \xc3\xa9\xe2\x82\xac\"}"));
    assert_true(json_ok(s, "{}"));
    assert_false(json_ok(s, "[1]"));
    assert_false(json_ok(s, "{\"a\":tru}"));
    assert_false(json_ok(s, "{\"a\":\"\x01\"}"));
    assert_false(json_ok(s, "{\"a\":\"\\x\"}"));
    assert_false(json_ok(s, "{\"a\":1,}"));
    jschema_free(s);
    /* Arrays, strings with limits, unions, a recursive definition. */
    s = schema(
        "{\"type\":\"array\",\"items\":{\"type\":[\"string\",\"null\"],\"maxLength\":3},\"minItems\":1,\"maxItems\":2}");
    assert_true(json_ok(s, "[\"abc\",null]"));
    assert_true(json_ok(s, "[\"\xc3\xa9t\xc3\xa9\"]")); /* three characters, five bytes */
    assert_false(json_ok(s, "[]"));
    assert_false(json_ok(s, "[\"a\",\"b\",\"c\"]"));
    assert_false(json_ok(s, "[\"abcd\"]"));
    assert_false(json_ok(s, "[1]"));
    jschema_free(s);
    s = schema(
        "{\"$defs\":{\"N\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"$ref\":\"#/$defs/N\"}},"
        "\"required\":[\"v\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/N\"}");
    assert_true(json_ok(s, "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3}}}"));
    assert_false(json_ok(s, "{\"v\":1,\"next\":{\"next\":{\"v\":3}}}"));
    jschema_free(s);
    s = schema("{\"enum\":[1,12,\"a\"]}");
    assert_true(json_ok(s, "1"));
    assert_true(json_ok(s, "12"));
    assert_true(json_ok(s, "\"a\""));
    assert_false(json_ok(s, "123"));
    assert_false(json_ok(s, "2"));
    jschema_free(s);
}

/* A random model: random logits, the mask, argmax; returns the text up to
 * EOS (NULL when it did not end within max steps). */
static char *random_answer(constraint *c, unsigned seed, int max) {
    ds4_strbuf out = {0};
    int32_t eos = ds4_vocab_eos(test_vocab());
    srand(seed);
    for (int step = 0; step < max; step++) {
        for (int k = 0; k < NV; k++) LOGITS[k] = (float)rand() / (float)RAND_MAX;
        constraint_mask(c, LOGITS, NV);
        int32_t best = ds4_argmax(LOGITS, NV);
        constraint_advance(c, best);
        if (best == eos) return out.p ? out.p : strdup("");
        ds4_str b = ds4_vocab_token_bytes(test_vocab(), best);
        ds4_strbuf_append(&out, b.ptr, b.len);
    }
    ds4_strbuf_free(&out);
    return NULL;
}

static void test_random_model_writes_valid_json(void **state) {
    (void)state;
    const char *schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"mood\":{\"enum\":[\"calm\",\"angry\"]}},"
        "\"required\":[\"ok\",\"mood\"],\"additionalProperties\":false}",
        "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":3}",
        "{\"type\":[\"boolean\",\"null\"]}",
    };
    for (size_t i = 0; i < sizeof(schemas) / sizeof(schemas[0]); i++) {
        jschema *s = schema(schemas[i]);
        for (unsigned seed = 1; seed <= 4; seed++) {
            ds4_err err = {0};
            constraint *c = constraint_new(CV, &err);
            constraint_set_json(c, s);
            char *text = random_answer(c, seed * 7 + (unsigned)i, 400);
            /* These schemas leave a bounded choice at every step: it ends. */
            if (!text) fail_msg("schema %zu seed %u: no end within 400 tokens", i, seed);
            {
                json_error_t je;
                json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
                if (!v) fail_msg("schema %zu seed %u: %s is not JSON: %s", i, seed, text, je.text);
                /* and it fits: the same text passes the mask again */
                constraint *c2 = constraint_new(CV, &err);
                constraint_set_json(c2, s);
                assert_true(passes(c2, text, true));
                constraint_free(c2);
                json_decref(v);
                free(text);
            }
            constraint_free(c);
        }
        jschema_free(s);
    }
}

static void test_prefix_and_forbidden(void **state) {
    (void)state;
    ds4_err err = {0};
    constraint *c = constraint_new(CV, &err);
    const char *alts[] = {"\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">",
                          "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">"};
    constraint_set_prefix(c, alts, 2, false);
    assert_false(constraint_idle(c));
    /* The tokenizer's split of the official spelling. */
    ds4_tokens t = {0};
    const char *call = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter";
    assert_int_equal(ds4_tokenize_transcript(TOK, call, strlen(call), &t, &err), 0);
    for (size_t i = 0; i < t.n; i++) {
        for (int k = 0; k < NV; k++) LOGITS[k] = 0;
        constraint_mask(c, LOGITS, NV);
        assert_true(LOGITS[t.ids[i]] == 0);
        constraint_advance(c, t.ids[i]);
    }
    assert_true(constraint_idle(c)); /* matched: free from here */
    ds4_tokens_free(&t);
    constraint_set_prefix(c, alts, 2, false);
    assert_false(passes(c, "It is sunny", false));
    constraint_set_prefix(c, alts, 2, false);
    assert_false(passes(c, "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_stock\">", false));
    /* A prefix that ends the answer: nothing may follow it but EOS. */
    const char *close[] = {"</｜DSML｜tool_calls>"};
    constraint_set_prefix(c, close, 1, true);
    assert_true(passes(c, "</｜DSML｜tool_calls>", true));
    constraint_set_prefix(c, close, 1, true);
    assert_false(passes(c, "</｜DSML｜tool_calls>.", false));
    /* tool_choice none: no block opening, in any spelling. */
    constraint_set_prefix(c, NULL, 0, false);
    constraint_set_forbid_blocks(c, true);
    assert_true(passes(c, "Use <b>bold</b> and a <tool> tag; x < y.", true));
    constraint_set_forbid_blocks(c, true);
    assert_false(passes(c, "Sure.\n\n<tool_calls>", false));
    constraint_set_forbid_blocks(c, true);
    assert_false(passes(c, "a <|DSML|tool_calls>", false));
    constraint_set_forbid_blocks(c, true);
    assert_false(passes(c, "｜DSML｜", false));
    constraint_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_compile),
        cmocka_unit_test(test_json_answers),
        cmocka_unit_test(test_random_model_writes_valid_json),
        cmocka_unit_test(test_prefix_and_forbidden),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
