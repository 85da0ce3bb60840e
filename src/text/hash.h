/*
 * hash.h - the byte-string hash used by the text layer's private tables
 * (vocabulary lookup, BPE merges, the tokenizer's piece cache).
 *
 * Eight bytes per step with a multiply-fold mix: fast on the short strings
 * that dominate tokenization, and good enough spread for open addressing
 * with power-of-two tables.  Not for untrusted-key DoS resistance: the keys
 * are vocabulary strings and pieces of text we tokenize ourselves, and the
 * cache is bounded.
 */
#ifndef DS4_TEXT_HASH_H
#define DS4_TEXT_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t ds4_hash_mix(uint64_t a, uint64_t b) {
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t ds4_hash_bytes(const void *data, size_t n) {
    const uint8_t *p = data;
    const uint64_t k0 = 0xa0761d6478bd642full, k1 = 0xe7037ed1a0b428dbull;
    uint64_t h = k0 ^ (n * k1);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = ds4_hash_mix(h ^ w, k1);
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    return ds4_hash_mix(h ^ w ^ k0, k1 ^ 0x8ebc6af09c88c6e3ull);
}

static inline uint64_t ds4_hash_u64(uint64_t x) {
    return ds4_hash_mix(x ^ 0xa0761d6478bd642full, 0xe7037ed1a0b428dbull);
}

#endif
