/*
 * numparse.c - strict parsing of option values (see numparse.h).
 */
#include "base/numparse.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

int ds4_parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return -1; /* no blank, sign or empty string */
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int ds4_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
    uint64_t v;
    if (ds4_parse_u64(s, lo, hi, &v)) return -1;
    *out = (uint32_t)v;
    return 0;
}

int ds4_parse_float(const char *s, float lo, float hi, float *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v) || v < lo || v > hi) return -1;
    *out = (float)v;
    return 0;
}

int ds4_parse_size(const char *s, uint64_t *out) {
    if (!s || *s < '0' || *s > '9') return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0) return -1;
    double mult = 1;
    const char *units = "KMGT";
    if (*end) {
        const char *u = end;
        char c = (char)(*u >= 'a' && *u <= 'z' ? *u - 32 : *u);
        int i = 0;
        while (units[i] && units[i] != c) i++;
        if (!units[i]) return -1;
        for (int j = 0; j <= i; j++) mult *= 1024;
        u++;
        if (*u == 'i') u++;
        if (*u == 'B' || *u == 'b') u++;
        if (*u) return -1;
    } else if (v != floor(v)) {
        return -1; /* bytes are whole */
    }
    double b = v * mult;
    if (b >= 18446744073709551615.0) return -1;
    *out = (uint64_t)b;
    return 0;
}
