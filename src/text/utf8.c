/*
 * utf8.c - strict UTF-8 decoding and the byte-level alphabet (see utf8.h).
 */
#include "text/utf8.h"

int ds4_utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    int len;
    uint32_t c, min;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        len = 2;
        c = b0 & 0x1F;
        min = 0x80;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        c = b0 & 0x0F;
        min = 0x800;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        c = b0 & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

int ds4_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t ds4_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int l = ds4_utf8_decode(s + i, n - i, &cp);
        if (!l) break;
        i += (size_t)l;
    }
    return i;
}

/* Could s[0..n) (n < expected length) still become a valid character?  The
 * second byte carries the range restrictions of E0, ED, F0 and F4. */
static int utf8_viable_prefix(const uint8_t *s, size_t n) {
    uint8_t b0 = s[0];
    size_t need;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) need = 3;
    else if (b0 >= 0xF0 && b0 <= 0xF4) need = 4;
    else return 0;
    if (n >= need) return 0;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (n >= 2) {
        uint8_t b1 = s[1];
        if (b0 == 0xE0 && b1 < 0xA0) return 0;
        if (b0 == 0xED && b1 > 0x9F) return 0;
        if (b0 == 0xF0 && b1 < 0x90) return 0;
        if (b0 == 0xF4 && b1 > 0x8F) return 0;
    }
    return 1;
}

int ds4_utf8_incomplete_tail(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const uint8_t *p = s + n - k;
        if ((p[0] & 0xC0) == 0x80) continue; /* continuation: look further back */
        return utf8_viable_prefix(p, k) ? (int)k : 0;
    }
    return 0;
}

int ds4_utf8_invalid_len(const uint8_t *s, size_t n) {
    int best = 1;
    for (size_t k = 2; k <= 3 && k <= n; k++)
        if (utf8_viable_prefix(s, k)) best = (int)k;
    return best;
}

static int bytelevel_is_printable(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

uint32_t ds4_bytelevel_cp(uint8_t b) {
    if (bytelevel_is_printable(b)) return b;
    /* Rank of b among the non-printable bytes, in increasing order. */
    uint32_t rank;
    if (b <= 32) rank = b;                    /* 0..32   -> 0..32  */
    else if (b <= 160) rank = 33 + (b - 127); /* 127..160 -> 33..66 */
    else rank = 67;                           /* 173 */
    return 256 + rank;
}

int ds4_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return bytelevel_is_printable(cp) ? (int)cp : -1;
    if (cp > 256 + 67) return -1;
    uint32_t rank = cp - 256;
    if (rank <= 32) return (int)rank;
    if (rank <= 66) return (int)(127 + rank - 33);
    return 173;
}
