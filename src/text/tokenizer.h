/*
 * tokenizer.h - text <-> token ids for DeepSeek V4 (docs/MODEL.md 10).
 *
 * Three ways in, one per level of trust:
 *
 *  - ds4_tokenize_text: plain text, never recognising special tokens.  User
 *    messages, tool results, tool schemas: a user who types "<｜Assistant｜>"
 *    or "</think>" gets ordinary text tokens, never a control token.
 *  - ds4_tokenize_segments: what the chat renderer produces (rendered.h,
 *    chat.h): a text covered by contiguous segments, each plain text, one
 *    special token named by its exact string, or trusted text.  The result
 *    is the tokenization of the whole text in which exactly the SPECIAL
 *    segments and the added tokens inside TRUSTED segments are control
 *    tokens: plain text running across segment boundaries is pre-tokenized
 *    as one string, as HF would.  The renderer decides where control tokens
 *    go.
 *  - ds4_tokenize_transcript: trusted text in which every added token
 *    (CONTROL or USER_DEFINED) is recognised wherever it occurs, leftmost
 *    longest, like HF `tokenizers`' encode.  For the CLI's raw mode and for
 *    replaying DSML the model itself sampled.
 *
 * Plain text is pre-tokenized (pretok.h) and merged (bpe.h); on valid UTF-8
 * the ids equal HF `tokenizers` on the official tokenizer.json.  HF only
 * accepts valid strings; we define invalid UTF-8 as follows: every byte that
 * does not belong to a valid character is a piece of its own and becomes
 * its single-byte token, and the valid runs between such bytes are
 * tokenized independently.  So any byte string tokenizes, and
 * decode(encode(x)) == x byte for byte.
 *
 * A ds4_tokenizer holds scratch space and a cache: use one per thread (they
 * can share one ds4_vocab).
 */
#ifndef DS4_TEXT_TOKENIZER_H
#define DS4_TEXT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "text/strbuf.h"
#include "text/tokens.h"
#include "text/vocab.h"

typedef enum ds4_seg_kind {
    DS4_SEG_TEXT = 0,    /* plain text: no special tokens */
    DS4_SEG_SPECIAL = 1, /* exactly one added token, spelled by the range */
    DS4_SEG_TRUSTED = 2, /* text with added-token recognition (transcript) */
} ds4_seg_kind;

/* A range [off, off + len) of a rendered text buffer. */
typedef struct ds4_segment {
    ds4_seg_kind kind;
    size_t off;
    size_t len;
} ds4_segment;

typedef struct ds4_tokenizer ds4_tokenizer;

ds4_tokenizer *ds4_tokenizer_new(const ds4_vocab *v, ds4_err *err);
void ds4_tokenizer_free(ds4_tokenizer *t);
const ds4_vocab *ds4_tokenizer_vocab(const ds4_tokenizer *t);

/* Stop with DS4_ERANGE once `out` would hold more than max_tokens ids (0,
 * the default: no limit), so that a text that cannot fit a context is not
 * tokenized to its end. */
void ds4_tokenizer_set_limit(ds4_tokenizer *t, size_t max_tokens);

/* Each appends ids to `out`; 0 or -1 with a message. */
int ds4_tokenize_text(ds4_tokenizer *t, const char *s, size_t n, ds4_tokens *out, ds4_err *err);
int ds4_tokenize_transcript(ds4_tokenizer *t, const char *s, size_t n, ds4_tokens *out, ds4_err *err);
/* Fails (DS4_ENOTFOUND) when a SPECIAL segment names no added token, and
 * (DS4_EINVAL) when the segments are not contiguous and in order. */
int ds4_tokenize_segments(ds4_tokenizer *t, const char *text, const ds4_segment *segs, size_t n_segs, ds4_tokens *out,
                          ds4_err *err);

/* Bytes of a token sequence, exactly (no replacement of invalid UTF-8).
 * Fails on an id outside the vocabulary. */
int ds4_detokenize(const ds4_vocab *v, const int32_t *ids, size_t n, ds4_strbuf *out, ds4_err *err);

/* Streaming detokenizer: each push appends only whole characters, holding
 * back the start of a character that later tokens may complete, so no
 * output chunk ever ends in the middle of a UTF-8 sequence.  Bytes that
 * can no longer become a character are passed through (raw mode, so the
 * concatenated output equals ds4_detokenize) or replaced, one U+FFFD per
 * maximal ill-formed subpart (lossy mode: always valid UTF-8, identical to
 * HF's decode).  finish() flushes a held incomplete tail the same way. */
typedef struct ds4_detok_stream {
    const ds4_vocab *v;
    bool lossy;
    uint8_t pend[4];
    int npend;
} ds4_detok_stream;

void ds4_detok_stream_init(ds4_detok_stream *s, const ds4_vocab *v, bool lossy);
int ds4_detok_stream_push(ds4_detok_stream *s, int32_t id, ds4_strbuf *out, ds4_err *err);
/* Feed raw bytes instead of a token (used by push; also handy for tests). */
void ds4_detok_stream_bytes(ds4_detok_stream *s, const char *bytes, size_t n, ds4_strbuf *out);
void ds4_detok_stream_finish(ds4_detok_stream *s, ds4_strbuf *out);

#endif
