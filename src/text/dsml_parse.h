/*
 * dsml_parse.h - incremental parser of DeepSeek V4 model output: reasoning,
 * visible content and DSML tool calls (docs/MODEL.md 11.4-11.5), for the
 * server's streamed events and the CLI.
 *
 * Feed decoded text piece by piece (whole UTF-8 characters, e.g. from the
 * lossy ds4_detok_stream) as the model samples it; the parser calls back
 * with events as soon as each is certain, holding back only text that could
 * still turn out to be markup ("</thi", "<｜DSML｜tool_c", trailing white
 * space before a tool block, a partial closing tag inside a value):
 *
 *   REASONING  delta of the reasoning (thinking mode: everything up to
 *              "</think>"; a stray leading "<think>" is skipped)
 *   THINK_END  "</think>" was seen
 *   CONTENT    delta of the visible answer
 *   CALL_START a tool call begins (index, name), once its invoke tag is complete
 *   CALL_ARGS  a fragment of the call's arguments; the fragments of one
 *              call concatenate to a JSON object: {"key": value, ...} with
 *              string="true" values as JSON strings, other values as the
 *              JSON text the model wrote
 *   CALL_END   the call is complete (text = the whole arguments object)
 *
 * The block is found only outside reasoning, as "<｜DSML｜tool_calls>"
 * (usually after "\n\n", which is not content) and, tolerating what models
 * drift into, "<DSML｜tool_calls>", "<|DSML|tool_calls>" or
 * "<tool_calls>"; tags inside it may use any of those spellings, white
 * space between tags is free, attributes may be in any order and quoted
 * either way, `string` defaults to "true", a missing </invoke> is implied
 * by the next <invoke> or </tool_calls>, and a parameter without `string`
 * whose value is itself parameters becomes a JSON object.  Values are not
 * otherwise decoded: string="true" text is taken as is (the official
 * format), except for the escape ds4's renderer writes for a value that
 * spells the closing tag ("&lt;/｜DSML｜parameter>", with one more "amp;"
 * per level, see dsml_render.h).  A string="false" value that is not
 * valid JSON is kept as a string rather than lost.  Names are
 * entity-decoded (&amp; &lt; &gt; &quot; &apos;).
 *
 * Nothing is dropped silently: a block that is malformed or still open at
 * the end makes ds4_dsml_finish() fail with a message and byte offset, and
 * the text of the block from its start is in result.unparsed; a reasoning
 * section never closed is reported in result.status.
 */
#ifndef DS4_TEXT_DSML_PARSE_H
#define DS4_TEXT_DSML_PARSE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/error.h"
#include "text/strbuf.h"

/* The spellings of a tool-call block's opening tag the parser recognizes,
 * the official one first; NULL-terminated.  Each has one "<", its first
 * byte. */
extern const char *const DS4_DSML_BLOCK_OPENERS[];

typedef enum ds4_dsml_event_kind {
    DS4_DSML_REASONING,
    DS4_DSML_THINK_END,
    DS4_DSML_CONTENT,
    DS4_DSML_CALL_START,
    DS4_DSML_CALL_ARGS,
    DS4_DSML_CALL_END,
} ds4_dsml_event_kind;

typedef struct ds4_dsml_event {
    ds4_dsml_event_kind kind;
    int index;        /* tool call index (CALL_*), counting from 0 */
    const char *text; /* delta, call name, argument fragment or arguments */
    size_t len;
} ds4_dsml_event;

typedef void (*ds4_dsml_event_fn)(void *ctx, const ds4_dsml_event *ev);

typedef enum ds4_dsml_status {
    DS4_DSML_OK = 0,
    DS4_DSML_UNTERMINATED_REASONING, /* output ended inside <think> (not an error) */
    DS4_DSML_UNTERMINATED_CALLS,     /* output ended inside a tool-call block */
    DS4_DSML_MALFORMED_CALLS,        /* a tool-call block that does not parse */
} ds4_dsml_status;

typedef struct ds4_dsml_call {
    char *name;
    size_t name_len;
    char *arguments; /* JSON object text, as streamed */
    size_t arguments_len;
} ds4_dsml_call;

/* Everything parsed so far (complete after ds4_dsml_finish). */
typedef struct ds4_dsml_result {
    ds4_strbuf reasoning;
    ds4_strbuf content;
    ds4_dsml_call *calls;
    size_t n_calls;
    ds4_strbuf raw_calls; /* exact text of the tool-call block(s), leading white space included: for replay */
    bool think_closed;
    ds4_dsml_status status;
    ds4_strbuf unparsed; /* malformed or unterminated block text, from its start */
    size_t error_offset; /* byte offset in the whole output */
    char error[256];
} ds4_dsml_result;

typedef struct ds4_dsml_parser ds4_dsml_parser;

/* `thinking`: the prompt ended with "<think>", so output starts as
 * reasoning.  `fn` may be NULL (use the result only). */
ds4_dsml_parser *ds4_dsml_parser_new(bool thinking, ds4_dsml_event_fn fn, void *ctx, ds4_err *err);
void ds4_dsml_parser_free(ds4_dsml_parser *p);

/* Feed the next piece of output.  -1 only when out of memory. */
int ds4_dsml_feed(ds4_dsml_parser *p, const char *text, size_t n, ds4_err *err);

/* End of output: flush held text and check the structure.  0, or -1 with a
 * message when the tool-call block is malformed or unterminated (see
 * result.status / unparsed). */
int ds4_dsml_finish(ds4_dsml_parser *p, ds4_err *err);

/* End of output that was cut short (a token limit): nothing held back is
 * flushed, since it may be the start of markup ("<｜DSML｜tool_c", white
 * space before a block, a partial "</think>"); an open tool-call block is
 * abandoned: the calls it completed stay in the result, the one in
 * progress is dropped (no CALL_END), and status says
 * DS4_DSML_UNTERMINATED_CALLS.  Returns 0 (-1 only when out of memory). */
int ds4_dsml_finish_cut(ds4_dsml_parser *p, ds4_err *err);

const ds4_dsml_result *ds4_dsml_result_of(const ds4_dsml_parser *p);

/* Where the output stands, for the sampler: inside tool-call markup (tags,
 * parameter headers, between elements: the server samples greedily there
 * so the structure does not drift), inside a parameter value, or outside
 * any block.  Also: how many tool-call blocks have closed so far. */
typedef enum ds4_dsml_position {
    DS4_DSML_AT_TEXT = 0,
    DS4_DSML_AT_MARKUP,
    DS4_DSML_AT_VALUE,
} ds4_dsml_position;
ds4_dsml_position ds4_dsml_position_of(const ds4_dsml_parser *p);
int ds4_dsml_blocks_closed(const ds4_dsml_parser *p);

/* One-shot parse of a whole completion (a trailing "<｜end▁of▁sentence｜>"
 * is ignored).  The result must be released with ds4_dsml_result_free. */
int ds4_dsml_parse(const char *text, size_t n, bool thinking, ds4_dsml_result *out, ds4_err *err);
void ds4_dsml_result_free(ds4_dsml_result *r);

#endif
