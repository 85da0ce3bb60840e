/*
 * test_dsml.c - DSML tool calls: rendering (official format, escapes), the
 * incremental parser on the official fixtures' assistant turns, render ->
 * parse round trips of random tool calls fed in random pieces, the
 * tolerated variants, and a corpus of malformed outputs that must parse
 * without crashing and report, not drop, what they could not parse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/dsml_parse.h"
#include "text/dsml_render.h"
#include "text/utf8.h"

/* Everything the events said, to compare with the result. */
typedef struct collected {
    ds4_strbuf reasoning, content;
    ds4_strbuf args[64];
    ds4_strbuf names[64];
    ds4_strbuf ends[64];
    int starts, end_count, think_ends;
    int bad_order;
} collected;

static void on_event(void *vctx, const ds4_dsml_event *ev) {
    collected *c = vctx;
    switch (ev->kind) {
    case DS4_DSML_REASONING: ds4_strbuf_append(&c->reasoning, ev->text, ev->len); break;
    case DS4_DSML_CONTENT: ds4_strbuf_append(&c->content, ev->text, ev->len); break;
    case DS4_DSML_THINK_END: c->think_ends++; break;
    case DS4_DSML_CALL_START:
        if (ev->index != c->starts || ev->index >= 64) c->bad_order++;
        else ds4_strbuf_append(&c->names[ev->index], ev->text, ev->len);
        c->starts++;
        break;
    case DS4_DSML_CALL_ARGS:
        if (ev->index != c->starts - 1) c->bad_order++;
        else if (ev->index < 64) ds4_strbuf_append(&c->args[ev->index], ev->text, ev->len);
        break;
    case DS4_DSML_CALL_END:
        if (ev->index != c->end_count || ev->index != c->starts - 1) c->bad_order++;
        else if (ev->index < 64) ds4_strbuf_append(&c->ends[ev->index], ev->text, ev->len);
        c->end_count++;
        break;
    }
}

static void collected_free(collected *c) {
    ds4_strbuf_free(&c->reasoning);
    ds4_strbuf_free(&c->content);
    for (int i = 0; i < 64; i++) {
        ds4_strbuf_free(&c->args[i]);
        ds4_strbuf_free(&c->names[i]);
        ds4_strbuf_free(&c->ends[i]);
    }
}

static uint64_t rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Feed `text` in random pieces (never splitting a UTF-8 character, as the
 * streaming detokenizer guarantees); returns finish()'s value. */
static int parse_pieces(const char *text, size_t n, bool thinking, collected *c, ds4_dsml_parser **out, int max_piece) {
    ds4_err err = {0};
    ds4_dsml_parser *p = ds4_dsml_parser_new(thinking, on_event, c, &err);
    assert_non_null(p);
    size_t i = 0;
    while (i < n) {
        size_t k = 1 + rnd() % (uint32_t)max_piece;
        if (k > n - i) k = n - i;
        while (i + k < n && ((uint8_t)text[i + k] & 0xC0) == 0x80) k++;
        assert_int_equal(ds4_dsml_feed(p, text + i, k, &err), 0);
        i += k;
    }
    int rc = ds4_dsml_finish(p, &err);
    *out = p;
    return rc;
}

static void test_render_official_format(void **state) {
    (void)state;
    json_t *calls = json_loads(
        "[{\"function\":{\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"location\\\": \\\"Beijing\\\", \\\"n\\\": 3, \\\"deep\\\": {\\\"a\\\": [1.5, true, null]}}\"}},"
        "{\"function\":{\"name\":\"noargs\",\"arguments\":\"{}\"}},"
        "{\"function\":{\"name\":\"bad\",\"arguments\":\"not json\"}},"
        "{\"function\":{\"name\":\"arr\",\"arguments\":[1]}},"
        "{\"function\":{\"name\":\"nul\"}}]",
        0, NULL);
    assert_non_null(calls);
    ds4_rendered r = {0};
    ds4_err err = {0};
    assert_int_equal(ds4_dsml_render_calls(&r, calls, &err), 0);
    const char *want =
        "\n\n<｜DSML｜tool_calls>\n"
        "<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"n\" string=\"false\">3</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"deep\" string=\"false\">{\"a\": [1.5, true, null]}</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"noargs\">\n\n</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"bad\">\n"
        "<｜DSML｜parameter name=\"arguments\" string=\"true\">not json</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"arr\">\n"
        "<｜DSML｜parameter name=\"arguments\" string=\"false\">[1]</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n"
        "<｜DSML｜invoke name=\"nul\">\n"
        "<｜DSML｜parameter name=\"arguments\" string=\"false\">null</｜DSML｜parameter>\n"
        "</｜DSML｜invoke>\n"
        "</｜DSML｜tool_calls>";
    assert_string_equal(r.text.p, want);
    /* The marker is the only special segment. */
    for (size_t i = 0; i < r.n_segs; i++)
        if (r.segs[i].kind == DS4_SEG_SPECIAL)
            assert_memory_equal(r.text.p + r.segs[i].off, DS4_DSML_MARKER, r.segs[i].len);
    ds4_rendered_free(&r);
    json_decref(calls);

    /* Escapes only where the official text would be ambiguous. */
    ds4_strbuf b = {0};
    const char *v = "a</｜DSML｜parameter>b&lt;/｜DSML｜parameter>&amp;x&";
    ds4_dsml_escape_string_value(&b, v, strlen(v));
    assert_string_equal(b.p, "a&lt;/｜DSML｜parameter>b&amp;lt;/｜DSML｜parameter>&amp;x&");
    ds4_strbuf_truncate(&b, 0);
    ds4_dsml_escape_name(&b, "a\"b&c&amp;<>", strlen("a\"b&c&amp;<>"));
    assert_string_equal(b.p, "a&quot;b&c&amp;amp;<>");
    ds4_strbuf_free(&b);
}

/* The official test parses the fixture's assistant turns back. */
static void test_parse_official_turns(void **state) {
    (void)state;
    const char *turn = "The user wants to know the weather in Beijing. I should use the get_weather tool.</think>\n\n"
                       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                       "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
                       "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
                       "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>";
    ds4_dsml_result r;
    ds4_err err = {0};
    assert_int_equal(ds4_dsml_parse(turn, strlen(turn), true, &r, &err), 0);
    assert_string_equal(r.reasoning.p,
                        "The user wants to know the weather in Beijing. I should use the get_weather tool.");
    assert_int_equal(r.content.len, 0);
    assert_true(r.think_closed);
    assert_int_equal(r.n_calls, 1);
    assert_string_equal(r.calls[0].name, "get_weather");
    assert_string_equal(r.calls[0].arguments, "{\"location\": \"Beijing\", \"unit\": \"celsius\"}");
    assert_memory_equal(r.raw_calls.p, "\n\n<｜DSML｜tool_calls>", strlen("\n\n<｜DSML｜tool_calls>"));
    assert_int_equal(r.status, DS4_DSML_OK);
    ds4_dsml_result_free(&r);

    const char *final = "Got the weather data.</think>The weather in Beijing is 22°C.<｜end▁of▁sentence｜>";
    assert_int_equal(ds4_dsml_parse(final, strlen(final), true, &r, &err), 0);
    assert_string_equal(r.content.p, "The weather in Beijing is 22°C.");
    assert_int_equal(r.n_calls, 0);
    ds4_dsml_result_free(&r);
}

/* ---- random tool calls ---- */

static const char *const PIECES[] = {
    "a",
    "Z",
    " ",
    "\n",
    "\t",
    "\"",
    "'",
    "\\",
    "&",
    "&amp;",
    "&lt;",
    "<",
    ">",
    "&&",
    "/",
    "{",
    "}",
    "é",
    "中文",
    "😀",
    "👨‍👩‍👧",
    "\u0301",
    "</｜DSML｜parameter>",
    "&lt;/｜DSML｜parameter>",
    "&amp;lt;/｜DSML｜parameter>",
    "</｜DSML｜invoke>",
    "</｜DSML｜tool_calls>",
    "<｜DSML｜parameter name=\"x\">",
    "｜DSML｜",
    "</think>",
    "<tool_calls>",
    "</parameter>",
    "\r\n",
    "0",
    "-1.5e3",
    "null",
    "\x01",
    "\x7f",
};

/* Random text from PIECES; `content` leaves out block openers, which
 * visible content cannot contain unambiguously. */
static json_t *random_text(int max_pieces, bool content) {
    ds4_strbuf b = {0};
    int n = (int)(rnd() % (uint32_t)max_pieces);
    for (int i = 0; i < n; i++) {
        const char *piece = PIECES[rnd() % (sizeof(PIECES) / sizeof(PIECES[0]))];
        if (content && strcmp(piece, "<tool_calls>") == 0) continue;
        ds4_strbuf_puts(&b, piece);
    }
    json_t *s = json_stringn(b.p ? b.p : "", b.len);
    ds4_strbuf_free(&b);
    return s;
}

static json_t *random_string(int max_pieces) { return random_text(max_pieces, false); }

static json_t *random_value(int depth) {
    switch (rnd() % (depth > 3 ? 5u : 7u)) {
    case 0: return json_integer((json_int_t)(rnd() % 2000001) - 1000000);
    case 1: {
        double x = ((double)rnd() / 4294967296.0 - 0.5) * 1e6;
        if (rnd() % 3 == 0) x *= 1e-12;
        return json_real(x);
    }
    case 2: return rnd() % 2 ? json_true() : json_false();
    case 3: return json_null();
    case 4: return random_string(12);
    case 5: {
        json_t *a = json_array();
        for (int i = (int)(rnd() % 4); i > 0; i--) json_array_append_new(a, random_value(depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (int i = (int)(rnd() % 4); i > 0; i--) {
            json_t *k = random_string(4);
            json_object_setn_new(o, json_string_value(k), json_string_length(k), random_value(depth + 1));
            json_decref(k);
        }
        return o;
    }
    }
}

static json_t *random_args(void) {
    json_t *o = json_object();
    for (int i = (int)(rnd() % 6); i > 0; i--) {
        json_t *k = random_string(3);
        json_t *v = rnd() % 2 ? random_string(rnd() % 10 ? 16 : 3000) : random_value(0);
        json_object_setn_new(o, json_string_value(k), json_string_length(k), v);
        json_decref(k);
    }
    return o;
}

static void test_round_trip_random_calls(void **state) {
    (void)state;
    rng_state = 12345;
    for (int iter = 0; iter < 400; iter++) {
        bool thinking = iter % 2;
        int n_calls = 1 + (int)(rnd() % 4);
        json_t *calls = json_array(), *args_list = json_array(), *names = json_array();
        for (int k = 0; k < n_calls; k++) {
            json_t *name = rnd() % 4 ? json_string("tool_name") : random_string(5);
            json_t *args = random_args();
            char *args_text = json_dumps(args, JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
            json_array_append_new(calls, json_pack("{s{sOss}}", "function", "name", name, "arguments", args_text));
            free(args_text);
            json_array_append_new(args_list, args);
            json_array_append_new(names, name);
        }
        json_t *content = random_text(6, true);
        /* Render the assistant turn alone: content + DSML. */
        ds4_rendered r = {0};
        ds4_err err = {0};
        ds4_strbuf text = {0};
        if (thinking) ds4_strbuf_puts(&text, "some reasoning with <｜DSML｜tool_calls> inside</think>");
        ds4_strbuf_append(&text, json_string_value(content), json_string_length(content));
        assert_int_equal(ds4_dsml_render_calls(&r, calls, &err), 0);
        ds4_strbuf_append(&text, r.text.p, r.text.len);
        ds4_rendered_free(&r);

        collected c = {0};
        ds4_dsml_parser *p;
        int rc = parse_pieces(text.p, text.len, thinking, &c, &p, 1 + (int)(rnd() % 40));
        const ds4_dsml_result *res = ds4_dsml_result_of(p);
        if (rc) fail_msg("iteration %d: %s\n%s", iter, res->error, text.p);
        assert_int_equal(c.bad_order, 0);
        assert_int_equal((int)res->n_calls, n_calls);
        assert_int_equal(c.starts, n_calls);
        assert_int_equal(c.end_count, n_calls);
        /* Content: the rendered content, minus trailing white space. */
        const char *ct = json_string_value(content);
        size_t cn = json_string_length(content);
        while (cn && strchr(" \t\r\n", ct[cn - 1])) cn--;
        assert_int_equal(res->content.len, cn);
        assert_int_equal(c.content.len, cn);
        if (cn) assert_memory_equal(c.content.p, ct, cn);
        if (thinking) assert_string_equal(c.reasoning.p, "some reasoning with <｜DSML｜tool_calls> inside");
        for (int k = 0; k < n_calls; k++) {
            const json_t *name = json_array_get(names, (size_t)k);
            assert_int_equal(res->calls[k].name_len, json_string_length(name));
            assert_memory_equal(res->calls[k].name, json_string_value(name), res->calls[k].name_len);
            assert_int_equal(c.names[k].len, json_string_length(name));
            /* Streamed fragments == final arguments == the original object. */
            assert_int_equal(c.args[k].len, res->calls[k].arguments_len);
            assert_memory_equal(c.args[k].p, res->calls[k].arguments, c.args[k].len);
            assert_int_equal(c.ends[k].len, res->calls[k].arguments_len);
            json_error_t je;
            json_t *got = json_loadb(res->calls[k].arguments, res->calls[k].arguments_len, JSON_ALLOW_NUL, &je);
            if (!got)
                fail_msg("iteration %d call %d: arguments do not parse (%s): %s", iter, k, je.text,
                         res->calls[k].arguments);
            if (!json_equal(got, json_array_get(args_list, (size_t)k))) {
                char *want = json_dumps(json_array_get(args_list, (size_t)k), JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
                fail_msg("iteration %d call %d:\n got %s\nwant %s", iter, k, res->calls[k].arguments, want);
            }
            json_decref(got);
        }
        collected_free(&c);
        ds4_dsml_parser_free(p);
        ds4_strbuf_free(&text);
        json_decref(content);
        json_decref(args_list);
        json_decref(names);
        json_decref(calls);
    }
}

static void expect_calls(const char *text, bool thinking, const char *content, int n, const char *const *names,
                         const char *const *args) {
    ds4_dsml_result r;
    ds4_err err = {0};
    if (ds4_dsml_parse(text, strlen(text), thinking, &r, &err)) fail_msg("%s: %s", text, err.msg);
    assert_string_equal(r.content.p ? r.content.p : "", content);
    assert_int_equal((int)r.n_calls, n);
    for (int i = 0; i < n; i++) {
        assert_string_equal(r.calls[i].name, names[i]);
        assert_string_equal(r.calls[i].arguments, args[i]);
    }
    ds4_dsml_result_free(&r);
}

static void test_tolerated_variants(void **state) {
    (void)state;
    const char *names[] = {"f", "g"};
    const char *one[] = {"{\"a\": \"x\"}"};
    expect_calls("hi<DSML｜tool_calls><DSML｜invoke name=\"f\"><DSML｜parameter name=\"a\" string=\"true\">x"
                 "</DSML｜parameter></DSML｜invoke></DSML｜tool_calls>",
                 false, "hi", 1, names, one);
    expect_calls("hi\n<|DSML|tool_calls>\n<|DSML|invoke name='f'>\n<|DSML|parameter string='true' name=\"a\">x"
                 "</|DSML|parameter>\n</|DSML|invoke>\n</|DSML|tool_calls>",
                 false, "hi", 1, names, one);
    /* Plain XML, no string attribute, missing </invoke>, two calls. */
    const char *two[] = {"{\"a\": \"x\"}", "{\"n\": 5, \"o\": {\"k\": \"v\", \"j\": [1]}}"};
    expect_calls("ok <tool_calls><invoke name=\"f\"><parameter name=\"a\">x</parameter>"
                 "<invoke name=\"g\"><parameter name=\"n\" string=\"false\"> 5 </parameter>"
                 "<parameter name=\"o\"><parameter name=\"k\">v</parameter>"
                 "<parameter name=\"j\" string=\"false\">[1]</parameter></parameter></tool_calls>",
                 false, "ok", 2, names, two);
    /* string="false" that is not JSON stays a string; entities in names. */
    const char *names2[] = {"a&b\"c"};
    const char *bad_json[] = {"{\"q\": \"not json\"}"};
    expect_calls("<｜DSML｜tool_calls><｜DSML｜invoke name=\"a&amp;b&quot;c\"><｜DSML｜parameter name=\"q\" "
                 "string=\"false\">not json</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>",
                 false, "", 1, names2, bad_json);
    /* A string value keeps entities and markup-like text verbatim. */
    const char *verb[] = {"{\"s\": \"&amp; <b> </parameter> \\\"q\\\"\"}"};
    expect_calls(
        "x\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"s\" string=\"true\">"
        "&amp; <b> </parameter> \"q\"</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        false, "x", 1, names, verb);
    /* Chat mode that opens with <think>; text after the block is content. */
    ds4_dsml_result r;
    ds4_err err = {0};
    const char *t = "<think>hmm</think>answer <｜DSML｜tool_calls></｜DSML｜tool_calls>  tail";
    assert_int_equal(ds4_dsml_parse(t, strlen(t), false, &r, &err), 0);
    assert_string_equal(r.reasoning.p, "hmm");
    assert_string_equal(r.content.p, "answertail");
    assert_int_equal(r.n_calls, 0);
    ds4_dsml_result_free(&r);
    /* DSML inside reasoning is reasoning; an open reasoning is reported. */
    t = "plan <｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">";
    assert_int_equal(ds4_dsml_parse(t, strlen(t), true, &r, &err), 0);
    assert_string_equal(r.reasoning.p, t);
    assert_int_equal(r.status, DS4_DSML_UNTERMINATED_REASONING);
    assert_false(r.think_closed);
    ds4_dsml_result_free(&r);
    /* Content that only looks like the start of markup is not held forever. */
    t = "a < b and <tool_c and <｜DSML｜tool_call";
    assert_int_equal(ds4_dsml_parse(t, strlen(t), false, &r, &err), 0);
    assert_string_equal(r.content.p, t);
    ds4_dsml_result_free(&r);
}

/* Streaming: no content event ever carries markup or the white space
 * before a block, and a value is streamed before its closing tag. */
static void test_streaming_holdback(void **state) {
    (void)state;
    const char *t = "Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
                    "string=\"true\">long value</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    collected c = {0};
    ds4_err err = {0};
    ds4_dsml_parser *p = ds4_dsml_parser_new(false, on_event, &c, &err);
    size_t n = strlen(t);
    const char *value_at = strstr(t, "long value") + 5;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(ds4_dsml_feed(p, t + i, 1, &err), 0);
        assert_true(c.content.len <= 5);
        if (t + i == value_at) assert_string_equal(c.args[0].p, "{\"a\": \"long v"); /* streamed so far */
    }
    assert_int_equal(ds4_dsml_finish(p, &err), 0);
    assert_string_equal(c.content.p, "Sure.");
    assert_string_equal(c.args[0].p, "{\"a\": \"long value\"}");
    collected_free(&c);
    ds4_dsml_parser_free(p);
}

/* Output cut short (a token limit): held-back text that may be markup is
 * dropped, a call in progress is dropped, the complete ones stay. */
static void test_cut(void **state) {
    (void)state;
    static const struct {
        const char *text;
        const char *content;
        size_t calls;
        ds4_dsml_status status;
    } cases[] = {
        {"Sure.\n\n<｜DSML｜tool_c", "Sure.", 0, DS4_DSML_OK},
        {"Sure.\n\n", "Sure.", 0, DS4_DSML_OK},
        {"a < b, then <", "a < b, then", 0, DS4_DSML_OK},
        {"Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"true\">va",
         "Sure.", 0, DS4_DSML_UNTERMINATED_CALLS},
        {"<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n<｜DSML｜par",
         "", 1, DS4_DSML_UNTERMINATED_CALLS},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        collected c = {0};
        ds4_err err = {0};
        ds4_dsml_parser *p = ds4_dsml_parser_new(false, on_event, &c, &err);
        assert_int_equal(ds4_dsml_feed(p, cases[i].text, strlen(cases[i].text), &err), 0);
        assert_int_equal(ds4_dsml_finish_cut(p, &err), 0);
        const ds4_dsml_result *r = ds4_dsml_result_of(p);
        assert_string_equal(c.content.p ? c.content.p : "", cases[i].content);
        assert_int_equal(r->n_calls, cases[i].calls);
        assert_int_equal(r->status, cases[i].status);
        assert_int_equal(r->raw_calls.len, 0); /* no block closed: nothing to replay */
        collected_free(&c);
        ds4_dsml_parser_free(p);
    }
    /* Thinking cut inside "</think>": the partial tag is not reasoning. */
    collected c = {0};
    ds4_err err = {0};
    ds4_dsml_parser *p = ds4_dsml_parser_new(true, on_event, &c, &err);
    assert_int_equal(ds4_dsml_feed(p, "I think</thi", 12, &err), 0);
    assert_int_equal(ds4_dsml_finish_cut(p, &err), 0);
    assert_string_equal(ds4_dsml_result_of(p)->reasoning.p, "I think");
    assert_int_equal(ds4_dsml_result_of(p)->status, DS4_DSML_UNTERMINATED_REASONING);
    collected_free(&c);
    ds4_dsml_parser_free(p);
    /* The block openers the server forbids are the parser's spellings. */
    const char *const spell[] = {"｜DSML｜", "DSML｜", "|DSML|", ""};
    for (int k = 0; k < 4; k++) {
        char want[64];
        snprintf(want, sizeof(want), "<%stool_calls>", spell[k]);
        assert_string_equal(DS4_DSML_BLOCK_OPENERS[k], want);
    }
    assert_null(DS4_DSML_BLOCK_OPENERS[4]);
}

static const char *const MALFORMED[] = {
    "x<｜DSML｜tool_calls>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\" string=\"true\">abc",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\" string=\"false\">{\"k\":",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"a\"><｜DSML｜parameter name=\"b\">",
    "x<｜DSML｜tool_calls>garbage</｜DSML｜tool_calls>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=f>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter string=\"true\">v</｜DSML｜parameter>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">text</｜DSML｜invoke></｜DSML｜tool_calls>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\" =\"g\">",
    "x<｜DSML｜tool_calls></｜DSML｜invoke>",
    "x<tool_calls><invoke name=\"f\"><parameter name=\"a\"",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"></｜DSML｜parameter>",
    "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\"/>",
};

static void test_malformed_corpus(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof(MALFORMED) / sizeof(MALFORMED[0]); i++) {
        const char *t = MALFORMED[i];
        for (int piece = 1; piece <= 7; piece += 6) {
            collected c = {0};
            ds4_dsml_parser *p;
            rng_state = i;
            int rc = parse_pieces(t, strlen(t), false, &c, &p, piece);
            const ds4_dsml_result *r = ds4_dsml_result_of(p);
            if (rc == 0) fail_msg("malformed[%zu] parsed without error: %s", i, t);
            assert_true(r->status == DS4_DSML_MALFORMED_CALLS || r->status == DS4_DSML_UNTERMINATED_CALLS);
            assert_non_null(strstr(r->error, "tool call block"));
            /* Nothing is lost: content before the block, the rest unparsed. */
            assert_string_equal(r->content.p, "x");
            assert_int_equal(r->unparsed.len, strlen(t) - 1);
            assert_memory_equal(r->unparsed.p, t + 1, r->unparsed.len);
            collected_free(&c);
            ds4_dsml_parser_free(p);
        }
    }
    /* Feeding after an error keeps everything. */
    ds4_err err = {0};
    ds4_dsml_parser *p = ds4_dsml_parser_new(false, NULL, NULL, &err);
    assert_int_equal(ds4_dsml_feed(p, "<tool_calls>junk", 16, &err), 0);
    assert_int_equal(ds4_dsml_feed(p, " more", 5, &err), 0);
    assert_int_equal(ds4_dsml_finish(p, &err), -1);
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_string_equal(ds4_dsml_result_of(p)->unparsed.p, "<tool_calls>junk more");
    assert_int_equal(ds4_dsml_feed(p, "x", 1, &err), -1);
    ds4_dsml_parser_free(p);
}

/* The chat renderer replays a parsed call identically. */
static void test_parse_then_render(void **state) {
    (void)state;
    const char *t = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n"
                    "<｜DSML｜parameter name=\"queries\" string=\"true\">小柴胡冲剂 布洛芬</｜DSML｜parameter>\n"
                    "<｜DSML｜parameter name=\"k\" string=\"false\">[1, {\"x\": 2.0}]</｜DSML｜parameter>\n"
                    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    ds4_dsml_result res;
    ds4_err err = {0};
    assert_int_equal(ds4_dsml_parse(t, strlen(t), false, &res, &err), 0);
    assert_int_equal(res.n_calls, 1);
    json_t *calls = json_pack("[{s{ssss}}]", "function", "name", res.calls[0].name, "arguments",
                              res.calls[0].arguments);
    ds4_rendered r = {0};
    assert_int_equal(ds4_dsml_render_calls(&r, calls, &err), 0);
    assert_string_equal(r.text.p, t);
    assert_string_equal(res.raw_calls.p, t);
    ds4_rendered_free(&r);
    json_decref(calls);
    ds4_dsml_result_free(&res);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_official_format),  cmocka_unit_test(test_parse_official_turns),
        cmocka_unit_test(test_round_trip_random_calls), cmocka_unit_test(test_tolerated_variants),
        cmocka_unit_test(test_streaming_holdback),      cmocka_unit_test(test_cut),
        cmocka_unit_test(test_malformed_corpus),        cmocka_unit_test(test_parse_then_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
