/*
 * numparse.h - the strict number parsing every program's options share:
 * a whole argument that is a decimal number in a given range, or an error.
 * strtoul alone accepts leading blanks, a sign ("-1" wraps to a huge
 * value), trailing text and overflow; these do not, so "--ctx 4k", "-t -2"
 * and "--seed 1e3" are refused instead of silently becoming something else.
 */
#ifndef DS4_BASE_NUMPARSE_H
#define DS4_BASE_NUMPARSE_H

#include <stdint.h>

/* Digits only, value in [lo, hi]: 0 and *out set, else -1 (*out untouched). */
int ds4_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
int ds4_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out);

/* A finite decimal or exponent float (strtod syntax, no trailing text) in
 * [lo, hi]: 0 and *out set, else -1. */
int ds4_parse_float(const char *s, float lo, float hi, float *out);

/* A size in bytes: "24G", "24GiB", "512M", "1.5T" (K, M, G, T: powers of
 * 1024, optionally followed by "iB" or "B") or a whole number of bytes.
 * 0 and *out set, else -1. */
int ds4_parse_size(const char *s, uint64_t *out);

#endif
