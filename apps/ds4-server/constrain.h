/*
 * constrain.h - constrained decoding: which tokens may come next so that
 * the answer has a required shape.
 *
 * Three shapes, combined as (prefix OR json) AND NOT forbidden:
 *   prefix     the answer starts with one of a few strings, then is free
 *              (tool_choice required or named: the tool-call block and
 *              the invoke of an allowed tool; parallel_tool_calls false:
 *              the block's close right after the first call);
 *   json       the answer is one JSON value of a schema, then ends
 *              (response_format);
 *   forbidden  the answer never contains the start of a tool-call block
 *              (tool_choice none).
 * The state is kept over the answer's bytes, so a token is allowed when
 * its bytes keep the answer a possible one, however the tokenizer split
 * it.  Tokens are checked in the byte order of the vocabulary with the
 * state of their common prefix reused; inside a JSON string, tokens of
 * plain characters are allowed without a walk.
 *
 * JSON schemas (jschema_compile) may use: type (one or a list), properties,
 * required, additionalProperties (true, false or a schema), items,
 * minItems, maxItems, minLength, maxLength, enum, const, anyOf / oneOf
 * whose alternatives start differently (an object and a string, not two
 * objects), nullable, $ref to #/$defs or #/definitions (recursion
 * included), allOf of one schema, and the annotations description, title,
 * default, examples, format, $schema, $id, $comment, deprecated, readOnly,
 * writeOnly.  Anything else (pattern, minimum, ...) is refused by name:
 * a schema is enforced fully or not accepted.  Generated JSON has at most
 * 16 white-space bytes in a row, 24 levels of nesting, and numbers that
 * common parsers take: 18 integer digits, 24 fraction digits, 2 exponent
 * digits.
 */
#ifndef DS4_SERVER_CONSTRAIN_H
#define DS4_SERVER_CONSTRAIN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "text/vocab.h"

typedef struct jschema jschema;

/* NULL with `why` (the path and the keyword) when the schema uses what
 * cannot be enforced.  jschema_any_object: any JSON object. */
jschema *jschema_compile(const json_t *schema, char *why, size_t why_cap);
jschema *jschema_any_object(void);
void jschema_free(jschema *s);

/* The vocabulary as byte strings in sorted order, built once. */
typedef struct cvocab cvocab;
cvocab *cvocab_new(const ds4_vocab *v, ds4_err *err);
void cvocab_free(cvocab *cv);

typedef struct constraint constraint;
constraint *constraint_new(const cvocab *cv, ds4_err *err);
void constraint_free(constraint *c);

/* Set the shape (each call replaces its part; the state restarts).  With
 * `final`, the answer ends with the prefix (only EOS may follow; the
 * block's close after a call with parallel_tool_calls false). */
int constraint_set_prefix(constraint *c, const char *const *alts, size_t n, bool final);
void constraint_set_json(constraint *c, const jschema *s);
void constraint_set_forbid_blocks(constraint *c, bool on);
/* Nothing left to enforce (no shape, or a prefix matched and nothing is
 * forbidden): no mask needed. */
bool constraint_idle(const constraint *c);
/* Set the logits of tokens that may not come next to -inf.  When no token
 * fits (a schema deeper than the limits), only EOS is left. */
void constraint_mask(constraint *c, float *logits, int n_vocab);
/* The token chosen (forced tokens too).  A token the shape does not allow
 * (a forced one) turns the constraint off. */
void constraint_advance(constraint *c, int32_t tok);
/* The JSON value is complete. */
bool constraint_json_done(const constraint *c);

#endif
