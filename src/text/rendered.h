/*
 * rendered.h - a rendered prompt: its text and how to tokenize it.
 *
 * The chat renderer (chat.h) and the DSML renderer (dsml.h) append to a
 * ds4_rendered: plain text (user content, tool schemas, template prose),
 * special tokens (the renderer's own role and control markers), or trusted
 * text (exact DSML the model sampled earlier, where added-token spellings
 * are control tokens).  The text is the prompt exactly as the official
 * encoder writes it; the segments cover it contiguously and in order, and
 * say which parts are control tokens (see ds4_tokenize_segments).
 */
#ifndef DS4_TEXT_RENDERED_H
#define DS4_TEXT_RENDERED_H

#include <stdbool.h>
#include <stddef.h>

#include "base/error.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"

typedef struct ds4_rendered {
    ds4_strbuf text;
    ds4_segment *segs;
    size_t n_segs;
    size_t cap;
    bool failed; /* an allocation failed (see ds4_rendered_check) */
} ds4_rendered;

/* Plain text: tokenized without special-token recognition. */
void ds4_rendered_text(ds4_rendered *r, const char *s, size_t n);
void ds4_rendered_puts(ds4_rendered *r, const char *s);
/* Exactly one special token, given by its spelling (e.g. "<｜User｜>"). */
void ds4_rendered_special(ds4_rendered *r, const char *token);
/* Template text written by the renderer itself: the special spellings it
 * contains (`specials`, a NULL-terminated list) become special tokens, the
 * rest plain text. */
void ds4_rendered_template(ds4_rendered *r, const char *s, const char *const *specials);
/* Trusted text: every added token in it is recognised. */
void ds4_rendered_trusted(ds4_rendered *r, const char *s, size_t n);

int ds4_rendered_check(const ds4_rendered *r, ds4_err *err);
void ds4_rendered_free(ds4_rendered *r);

/* Token ids of a rendered prompt (appended to out). */
int ds4_tokenize_rendered(ds4_tokenizer *t, const ds4_rendered *r, ds4_tokens *out, ds4_err *err);

/* Token ids of the rendered text from byte `off` on, as if it started
 * there (the server keeps the tokens it already holds for text[0..off) and
 * tokenizes only the rest).  Fails (DS4_EINVAL) when off falls inside a
 * special token. */
int ds4_tokenize_rendered_from(ds4_tokenizer *t, const ds4_rendered *r, size_t off, ds4_tokens *out, ds4_err *err);

#endif
