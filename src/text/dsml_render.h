/*
 * dsml_render.h - DSML tool calls as the official DeepSeek V4 encoder writes
 * them (encoding_dsv4.py; docs/MODEL.md 11.4):
 *
 *   \n\n<｜DSML｜tool_calls>
 *   <｜DSML｜invoke name="NAME">
 *   <｜DSML｜parameter name="KEY" string="true">RAW STRING</｜DSML｜parameter>
 *   <｜DSML｜parameter name="KEY2" string="false">PYTHON JSON</｜DSML｜parameter>
 *   </｜DSML｜invoke>
 *   </｜DSML｜tool_calls>
 *
 * Calls are joined by "\n", parameters by "\n", in the arguments' key
 * order; non-string values are json.dumps()ed (", " and ": " separators).
 * "｜DSML｜" is one special token; everything else is plain text.
 *
 * Arguments: an OpenAI `arguments` JSON string is parsed (as json.loads
 * reads it: integers beyond 64 bits and 1e400 stay numbers, pyjson.h); a
 * string that is not a JSON object becomes one string parameter named
 * "arguments" (the
 * official encoder would crash on a non-object, ds4 does this); a value that
 * is not a string (null, a number, an array) becomes one non-string
 * parameter "arguments", as the official encoder does; a raw JSON object is
 * used directly (an extension for clients that send objects).
 *
 * Escaping, only where the official output would be ambiguous, so the
 * output is byte-identical to the official encoder whenever it can be
 * parsed back at all:
 *  - string values: "</｜DSML｜parameter>" becomes "&lt;/｜DSML｜parameter>",
 *    and an "&" that already starts "(amp;)*lt;/｜DSML｜parameter>" gets one
 *    more "amp;", so a value spelling the escape itself survives too;
 *  - non-string values: "</｜DSML｜parameter>" (inside JSON strings) has its
 *    "<" written as \u003c;
 *  - names: '"' becomes "&quot;", and an "&" that starts one of the
 *    entities the parser decodes (&amp; &lt; &gt; &quot; &apos;) "&amp;".
 */
#ifndef DS4_TEXT_DSML_RENDER_H
#define DS4_TEXT_DSML_RENDER_H

#include <jansson.h>
#include <stddef.h>

#include "base/error.h"
#include "text/rendered.h"

#define DS4_DSML_MARKER "｜DSML｜"

/* Append the block for an OpenAI `tool_calls` array (objects with
 * function.name and function.arguments), including the leading "\n\n". */
int ds4_dsml_render_calls(ds4_rendered *r, const json_t *tool_calls, ds4_err *err);

/* Append one invoke element (no surrounding block) for a name and an
 * `arguments` value as described above. */
int ds4_dsml_render_invoke(ds4_rendered *r, const char *name, size_t name_len, const json_t *arguments, ds4_err *err);

/* Escapers, exposed for the parser's tests. */
void ds4_dsml_escape_string_value(ds4_strbuf *b, const char *s, size_t n);
void ds4_dsml_escape_name(ds4_strbuf *b, const char *s, size_t n);

#endif
