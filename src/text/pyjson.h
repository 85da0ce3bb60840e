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
 *
 * Reading as Python's json.loads does (ds4_pyjson_load): jansson holds
 * neither integers beyond 64 bits nor numbers beyond the double range, which
 * Python reads as an exact int and as an infinity.  Such a number becomes a
 * "big number": a jansson string whose first byte is 0xFF (a byte no JSON
 * string holds, jansson's strings being valid UTF-8) followed by the text
 * json.dumps writes for it (the integer's digits, "Infinity", "-Infinity",
 * "NaN"), so the dump below writes it back exactly.
 */
#ifndef DS4_TEXT_PYJSON_H
#define DS4_TEXT_PYJSON_H

#include <jansson.h>
#include <stddef.h>

#include "base/error.h"
#include "text/strbuf.h"

/* json.loads of s[0..n) (any value at the top): NULL with a message naming
 * the byte offset on malformed input.  Numbers jansson cannot hold become
 * big numbers (above); NaN, Infinity and -Infinity are accepted as Python
 * accepts them; integers of more than 4300 digits are refused, as Python's
 * int conversion refuses them. */
json_t *ds4_pyjson_load(const char *s, size_t n, ds4_err *err);

/* The text of a big number (see above), or NULL when v is not one. */
const char *ds4_pyjson_big_number(const json_t *v);

/* Append json.dumps(v, ensure_ascii=False). */
void ds4_pyjson_dump(ds4_strbuf *b, const json_t *v);

/* Append a JSON string literal for s[0..n) (quotes included). */
void ds4_pyjson_string(ds4_strbuf *b, const char *s, size_t n);

/* Append Python's repr() of a double (finite; NaN and infinities give
 * "NaN", "Infinity", "-Infinity" as json.dumps does). */
void ds4_pyjson_float(ds4_strbuf *b, double x);

#endif
