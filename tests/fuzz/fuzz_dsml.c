/*
 * fuzz_dsml.c - libFuzzer target for the DSML parser and renderer.
 *
 * Input: one control byte (bit 0: thinking mode; bits 1-7: piece size for
 * the chunked run), then model output.  Checks, aborting on violation:
 *  - the parser never crashes or leaks (ASan, UBSan);
 *  - feeding the output in pieces gives exactly the result of feeding it
 *    whole (streaming decisions never depend on where pieces end);
 *  - the events concatenate to the result (reasoning, content, each call's
 *    argument fragments = its arguments);
 *  - on valid UTF-8, every parsed call's arguments are a JSON object
 *    (jansson, the checker, refuses only keys containing U+0000);
 *  - when the output is itself a JSON object, rendering it as a call's
 *    arguments and parsing that back gives the same object.
 * Build and run: tests/suite/fuzz_dsml.sh (FUZZ_SECONDS=600 for a long run).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/dsml_parse.h"
#include "text/dsml_render.h"
#include "text/utf8.h"

/* clang-format off */
#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "fuzz_dsml: check failed at line %d: %s\n", __LINE__, #cond); \
            abort();                                                                  \
        }                                                                             \
    } while (0)
/* clang-format on */

typedef struct events {
    ds4_strbuf reasoning, content, args;
    size_t calls;
} events;

static void on_event(void *vctx, const ds4_dsml_event *ev) {
    events *e = vctx;
    switch (ev->kind) {
    case DS4_DSML_REASONING: ds4_strbuf_append(&e->reasoning, ev->text, ev->len); break;
    case DS4_DSML_CONTENT: ds4_strbuf_append(&e->content, ev->text, ev->len); break;
    case DS4_DSML_CALL_START: ds4_strbuf_truncate(&e->args, 0); break;
    case DS4_DSML_CALL_ARGS: ds4_strbuf_append(&e->args, ev->text, ev->len); break;
    case DS4_DSML_CALL_END:
        CHECK(ev->len == e->args.len && memcmp(ev->text, e->args.p, ev->len) == 0);
        e->calls++;
        break;
    case DS4_DSML_THINK_END: break;
    }
}

static int same(const ds4_strbuf *a, const ds4_strbuf *b) {
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

static ds4_dsml_parser *run(const char *s, size_t n, int thinking, size_t piece, events *e, int *rc) {
    ds4_dsml_parser *p = ds4_dsml_parser_new(thinking, on_event, e, NULL);
    CHECK(p);
    for (size_t i = 0; i < n; i += piece) CHECK(ds4_dsml_feed(p, s + i, n - i < piece ? n - i : piece, NULL) == 0);
    *rc = ds4_dsml_finish(p, NULL);
    return p;
}

static void check_round_trip(const char *s, size_t n) {
    json_t *obj = json_loadb(s, n, JSON_ALLOW_NUL, NULL);
    if (!json_is_object(obj)) {
        json_decref(obj);
        return;
    }
    ds4_rendered r = {0};
    json_t *calls = json_pack("[{s{sssO}}]", "function", "name", "f", "arguments", obj);
    CHECK(calls);
    CHECK(ds4_dsml_render_calls(&r, calls, NULL) == 0);
    ds4_dsml_result res;
    CHECK(ds4_dsml_parse(r.text.p, r.text.len, 0, &res, NULL) == 0);
    CHECK(res.n_calls == 1);
    json_t *back = json_loadb(res.calls[0].arguments, res.calls[0].arguments_len, JSON_ALLOW_NUL, NULL);
    CHECK(back && json_equal(back, obj));
    json_decref(back);
    ds4_dsml_result_free(&res);
    ds4_rendered_free(&r);
    json_decref(calls);
    json_decref(obj);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int thinking = data[0] & 1;
    size_t piece = 1 + (data[0] >> 1);
    const char *s = (const char *)data + 1;
    size_t n = size - 1;

    events whole_ev = {0}, piece_ev = {0};
    int rc_whole, rc_piece;
    ds4_dsml_parser *whole = run(s, n, thinking, n ? n : 1, &whole_ev, &rc_whole);
    ds4_dsml_parser *pieces = run(s, n, thinking, piece, &piece_ev, &rc_piece);
    const ds4_dsml_result *a = ds4_dsml_result_of(whole), *b = ds4_dsml_result_of(pieces);

    CHECK(rc_whole == rc_piece && a->status == b->status);
    CHECK(same(&a->reasoning, &b->reasoning) && same(&a->content, &b->content));
    CHECK(same(&a->raw_calls, &b->raw_calls) && same(&a->unparsed, &b->unparsed));
    CHECK(a->n_calls == b->n_calls);
    for (size_t i = 0; i < a->n_calls; i++) {
        CHECK(a->calls[i].name_len == b->calls[i].name_len &&
              memcmp(a->calls[i].name, b->calls[i].name, a->calls[i].name_len) == 0);
        CHECK(a->calls[i].arguments_len == b->calls[i].arguments_len &&
              memcmp(a->calls[i].arguments, b->calls[i].arguments, a->calls[i].arguments_len) == 0);
    }
    CHECK(same(&whole_ev.reasoning, &a->reasoning) && same(&whole_ev.content, &a->content));
    CHECK(whole_ev.calls == a->n_calls);

    if (ds4_utf8_valid_prefix((const uint8_t *)s, n) == n) {
        for (size_t i = 0; i < a->n_calls; i++) {
            json_error_t je;
            json_t *j = json_loadb(a->calls[i].arguments, a->calls[i].arguments_len, JSON_ALLOW_NUL, &je);
            /* Valid JSON that jansson cannot hold: a key with U+0000. */
            CHECK(json_is_object(j) || strstr(je.text, "NUL byte in object key"));
            json_decref(j);
        }
        check_round_trip(s, n);
    }

    ds4_dsml_parser_free(whole);
    ds4_dsml_parser_free(pieces);
    ds4_strbuf_free(&whole_ev.reasoning);
    ds4_strbuf_free(&whole_ev.content);
    ds4_strbuf_free(&whole_ev.args);
    ds4_strbuf_free(&piece_ev.reasoning);
    ds4_strbuf_free(&piece_ev.content);
    ds4_strbuf_free(&piece_ev.args);
    return 0;
}
