/*
 * utf8.h - UTF-8 helpers for the text layer and GPT-2's byte-level alphabet.
 *
 * The tokenizer, the streaming detokenizer and the DSML parser all work on
 * raw bytes and need the same strict notion of "one valid character":
 * shortest form only, no surrogates, nothing above U+10FFFF (exactly what
 * Python and Rust accept, so our behaviour on valid text matches HF
 * `tokenizers`, which only ever sees valid strings).
 *
 * Byte-level BPE (docs/MODEL.md 10.1) stores every raw byte as one printable
 * code point: bytes 33-126, 161-172 and 174-255 stand for themselves, the
 * other 68 bytes map, in increasing order, to U+0100, U+0101, ...
 */
#ifndef DS4_TEXT_UTF8_H
#define DS4_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1-4) of the valid character starting at s[0], storing its code
 * point in *cp; 0 when s[0..n) does not start with a complete valid
 * character (invalid byte, overlong form, surrogate, out of range, or
 * truncated by n). */
int ds4_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);

/* Encode a code point (<= 0x10FFFF, surrogates allowed for tests) into
 * out[0..4); returns the number of bytes. */
int ds4_utf8_encode(uint32_t cp, char out[4]);

/* Length of the longest prefix of s[0..n) made of valid characters. */
size_t ds4_utf8_valid_prefix(const uint8_t *s, size_t n);

/* Number of bytes at the end of s[0..n) that form the beginning of a valid
 * character that more bytes could still complete (0-3).  Streaming
 * decoders hold these back. */
int ds4_utf8_incomplete_tail(const uint8_t *s, size_t n);

/* Length (1-3) of the maximal ill-formed subpart at s[0..n), which must not
 * start with a valid character: the longest prefix that could still have
 * become a character, at least one byte.  Lossy decoders replace each such
 * subpart with one U+FFFD, as Rust's from_utf8_lossy (HF) and Python do. */
int ds4_utf8_invalid_len(const uint8_t *s, size_t n);

/* GPT-2 byte-level alphabet: code point standing for a raw byte, and the
 * byte a code point stands for (-1 if none). */
uint32_t ds4_bytelevel_cp(uint8_t b);
int ds4_bytelevel_byte(uint32_t cp);

#endif
