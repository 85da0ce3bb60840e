/*
 * pyjson.h - JSON text exactly as Python's json.dumps(value, ensure_ascii=False)
 * writes it, for jansson values.
 *
 * The official DeepSeek V4 encoder (encoding_dsv4.py) serialises tool
 * schemas, response formats and non-string tool arguments with Python's
 * json.dumps, so byte-exact prompts need the same text: separators ", " and
 * ": ", keys in insertion order, non-ASCII characters written raw, only
 * '"', '\\' and control characters escaped (\n \r \t \b \f, others as
 * \u00xx in lower-case hex), and floats in Python's repr form (shortest
 * round-trip digits; "1.0", "1e-05", "1e+16", "-0.0").
 */
#ifndef DS4_TEXT_PYJSON_H
#define DS4_TEXT_PYJSON_H

#include <jansson.h>
#include <stddef.h>

#include "text/strbuf.h"

/* Append json.dumps(v, ensure_ascii=False). */
void ds4_pyjson_dump(ds4_strbuf *b, const json_t *v);

/* Append a JSON string literal for s[0..n) (quotes included). */
void ds4_pyjson_string(ds4_strbuf *b, const char *s, size_t n);

/* Append Python's repr() of a double (finite; NaN and infinities give
 * "NaN", "Infinity", "-Infinity" as json.dumps does). */
void ds4_pyjson_float(ds4_strbuf *b, double x);

#endif
