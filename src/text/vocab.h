/*
 * vocab.h - the byte-level BPE vocabulary of DeepSeek V4 (docs/MODEL.md 10).
 *
 * A ds4_vocab is built from plain arrays - token strings, token types and
 * "LEFT RIGHT" merge strings, exactly the GGUF `tokenizer.ggml.*` metadata -
 * so it can come from a GGUF file (ds4_vocab_from_gguf, vocab_gguf.c) or
 * straight from the official tokenizer.json (tokjson.h).  Token id == array
 * index.  Once built it is immutable and may be shared by any number of
 * threads; the per-thread tokenizer state lives in ds4_tokenizer
 * (tokenizer.h).
 *
 * Token strings of NORMAL tokens are in GPT-2's byte-level alphabet ("Ġthe"
 * for " the"); added tokens (CONTROL, USER_DEFINED) are stored as their
 * literal text ("<｜User｜>", "<think>").  Decoding follows HF `tokenizers`'
 * ByteLevel decoder: a token whose every character belongs to the
 * byte-level alphabet decodes to those bytes, any other token to its own
 * UTF-8 text; UNUSED padding tokens decode to nothing.
 */
#ifndef DS4_TEXT_VOCAB_H
#define DS4_TEXT_VOCAB_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "format/gguf.h"

/* Token types, numbered as GGUF / llama.cpp store them. */
typedef enum ds4_token_type {
    DS4_TOKEN_UNDEFINED = 0,
    DS4_TOKEN_NORMAL = 1,
    DS4_TOKEN_UNKNOWN = 2,
    DS4_TOKEN_CONTROL = 3,
    DS4_TOKEN_USER_DEFINED = 4,
    DS4_TOKEN_UNUSED = 5,
    DS4_TOKEN_BYTE = 6,
} ds4_token_type;

/* The pre-tokenizer names ds4 accepts for `tokenizer.ggml.pre`.  Both name
 * the same three-regex sequence (pretok.h); ds4's files say "joyai-llm". */
#define DS4_PRE_JOYAI       "joyai-llm"
#define DS4_PRE_DEEPSEEK_V3 "deepseek-v3"

typedef struct ds4_vocab_src {
    uint32_t n_tokens;
    const ds4_str *tokens; /* n_tokens strings */
    const int32_t *types;  /* n_tokens ds4_token_type values; NULL: all NORMAL */
    uint32_t n_merges;
    const ds4_str *merges; /* "LEFT RIGHT", rank = index */
    int32_t bos_id;        /* -1: unknown */
    int32_t eos_id;        /* -1: unknown */
    const char *pre;       /* pre-tokenizer name; NULL means DS4_PRE_JOYAI */
} ds4_vocab_src;

typedef struct ds4_vocab ds4_vocab;

/* Build a vocabulary (copies everything it needs from src).  Fails when a
 * merge names a token that does not exist or whose concatenation is not a
 * token, when a type is out of range, when ids are out of range, or when the
 * pre-tokenizer is not one ds4 implements. */
ds4_vocab *ds4_vocab_new(const ds4_vocab_src *src, ds4_err *err);
void ds4_vocab_free(ds4_vocab *v);

uint32_t ds4_vocab_size(const ds4_vocab *v);
uint32_t ds4_vocab_n_merges(const ds4_vocab *v);
int32_t ds4_vocab_bos(const ds4_vocab *v);
int32_t ds4_vocab_eos(const ds4_vocab *v);

/* Stored string and type of a token (id must be < size). */
ds4_str ds4_vocab_token(const ds4_vocab *v, int32_t id);
ds4_token_type ds4_vocab_type(const ds4_vocab *v, int32_t id);
/* The bytes a token decodes to (see the header comment). */
ds4_str ds4_vocab_token_bytes(const ds4_vocab *v, int32_t id);

/* Id of the token whose stored string is exactly s[0..n), or -1. */
int32_t ds4_vocab_find(const ds4_vocab *v, const char *s, size_t n);

/* Id of an added (CONTROL or USER_DEFINED) token spelled exactly s[0..n),
 * or -1.  This is how the chat renderer's special strings become ids. */
int32_t ds4_vocab_find_added(const ds4_vocab *v, const char *s, size_t n);

/* ---- used by the tokenizer (tokenizer.c) ---- */

/* Token id of the single-byte symbol for raw byte b, -1 if the vocabulary
 * lacks it (HF then drops the byte; so do we). */
int32_t ds4_vocab_byte_id(const ds4_vocab *v, uint8_t b);

/* Merge of the adjacent pair (a, b): its rank and the id of the merged
 * token; false when the pair does not merge. */
bool ds4_vocab_merge(const ds4_vocab *v, int32_t a, int32_t b, int32_t *rank, int32_t *merged);

/* Longest added token starting exactly at s[0..n): its id, and its length
 * in *len; -1 when none starts there. */
int32_t ds4_vocab_match_added(const ds4_vocab *v, const char *s, size_t n, size_t *len);

/* True when byte c can begin an added token (a quick filter for scanning). */
bool ds4_vocab_added_first_byte(const ds4_vocab *v, uint8_t c);

/* From GGUF metadata (vocab_gguf.c): tokenizer.ggml.model must be "gpt2";
 * tokens, merges and (optionally) token_type, pre, bos_token_id and
 * eos_token_id as ds4-tokenizer import writes them. */
ds4_vocab *ds4_vocab_from_gguf(const ds4_gguf *g, ds4_err *err);

#endif
