/*
 * pretok.h - the official DeepSeek V4 pre-tokenizer ("joyai-llm").
 *
 * tokenizer.json's pre_tokenizer is a Sequence of three Split steps, each a
 * regex with "Isolated" behaviour (every match and every gap between
 * matches becomes its own piece), each applied to every piece the previous
 * step produced, followed by ByteLevel without its own regex:
 *
 *   1. \p{N}{1,3}                               numbers in groups of three
 *   2. [一-龥぀-ゟ゠-ヿ]+                          CJK ideographs and kana
 *   3. [punct][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *      |  ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * HF `tokenizers` runs these with Oniguruma; we run them with PCRE2 (UTF,
 * UCP, JIT).  The two engines agree on ordered alternation and greedy
 * backtracking, but not on everything Unicode:
 *  - PCRE2's \s also matches U+180E MONGOLIAN VOWEL SEPARATOR (no longer a
 *    space since Unicode 6.3); Oniguruma's is the White_Space property.  So
 *    the patterns spell white space out as [\t-\r\x{85}\p{Z}] instead.
 *  - HF tokenizers 0.23.3 knows Unicode 16.0, Debian 12's PCRE2 Unicode
 *    14.0; for text that contains a code point assigned in between, the
 *    \p{..} classes are widened with those code points explicitly
 *    (unicode_delta.h; a second compiled set, since explicit ranges slow
 *    the JIT down for every character).  A PCRE2 older than Unicode 14 is
 *    refused.
 * The result was checked against HF on every code point (test_tok_hf.c).
 * Each piece is matched as its own subject, exactly as HF does, so `(?!\S)`
 * sees the end of the piece, not the text after it.
 *
 * A ds4_pretok holds PCRE2 match data: one per thread.
 */
#ifndef DS4_TEXT_PRETOK_H
#define DS4_TEXT_PRETOK_H

#include <stddef.h>

#include "base/error.h"

typedef struct ds4_pretok ds4_pretok;

ds4_pretok *ds4_pretok_new(ds4_err *err);
void ds4_pretok_free(ds4_pretok *p);

/* Called for each piece in order; a non-zero return stops the split and is
 * returned by ds4_pretok_split. */
typedef int (*ds4_piece_fn)(void *ctx, const char *piece, size_t len);

/* Split valid UTF-8 text (the caller guarantees validity) into pieces.
 * Returns 0, the callback's non-zero value, or -1 with a message if PCRE2
 * reports a matching error. */
int ds4_pretok_split(ds4_pretok *p, const char *text, size_t len, ds4_piece_fn fn, void *ctx, ds4_err *err);

#endif
