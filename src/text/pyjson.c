/*
 * pyjson.c - Python-compatible JSON serialisation (see pyjson.h).
 */
#include "text/pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ds4_pyjson_string(ds4_strbuf *b, const char *s, size_t n) {
    ds4_strbuf_putc(b, '"');
    size_t run = 0; /* start of the pending unescaped run */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof(u), "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        ds4_strbuf_append(b, s + run, i - run);
        ds4_strbuf_puts(b, esc);
        run = i + 1;
    }
    ds4_strbuf_append(b, s + run, n - run);
    ds4_strbuf_putc(b, '"');
}

/* Shortest "%.*e" form that reads back as x: its digits and exponent. */
static void shortest_digits(double x, char *digits, int *exp10) {
    char buf[40];
    for (int prec = 0; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*e", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf is "d.ddde[+-]XX" (x > 0 here). */
    char *e = strchr(buf, 'e');
    *exp10 = atoi(e + 1);
    int n = 0;
    for (char *p = buf; p < e; p++)
        if (*p != '.') digits[n++] = *p;
    while (n > 1 && digits[n - 1] == '0') n--; /* "%.0e" of 10 gives "1e+01" */
    digits[n] = '\0';
}

void ds4_pyjson_float(ds4_strbuf *b, double x) {
    if (isnan(x)) {
        ds4_strbuf_puts(b, "NaN");
        return;
    }
    if (isinf(x)) {
        ds4_strbuf_puts(b, x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    if (signbit(x)) ds4_strbuf_putc(b, '-');
    x = fabs(x);
    if (x == 0) {
        ds4_strbuf_puts(b, "0.0");
        return;
    }
    char d[24];
    int e;
    shortest_digits(x, d, &e);
    int nd = (int)strlen(d);
    if (e < -4 || e >= 16) {
        /* d[.ddd]e+XX / e-XX, at least two exponent digits. */
        ds4_strbuf_putc(b, d[0]);
        if (nd > 1) {
            ds4_strbuf_putc(b, '.');
            ds4_strbuf_append(b, d + 1, (size_t)nd - 1);
        }
        ds4_strbuf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    } else if (e < 0) {
        ds4_strbuf_puts(b, "0.");
        for (int i = -1; i > e; i--) ds4_strbuf_putc(b, '0');
        ds4_strbuf_append(b, d, (size_t)nd);
    } else {
        /* Integer part: digits 0..e (padded with zeros), then the rest or ".0". */
        for (int i = 0; i <= e; i++) ds4_strbuf_putc(b, i < nd ? d[i] : '0');
        ds4_strbuf_putc(b, '.');
        if (nd > e + 1)
            ds4_strbuf_append(b, d + e + 1, (size_t)(nd - e - 1));
        else
            ds4_strbuf_putc(b, '0');
    }
}

void ds4_pyjson_dump(ds4_strbuf *b, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        ds4_strbuf_putc(b, '{');
        const char *key;
        size_t key_len;
        json_t *val;
        int first = 1;
        json_object_keylen_foreach((json_t *)v, key, key_len, val) {
            if (!first) ds4_strbuf_puts(b, ", ");
            first = 0;
            ds4_pyjson_string(b, key, key_len);
            ds4_strbuf_puts(b, ": ");
            ds4_pyjson_dump(b, val);
        }
        ds4_strbuf_putc(b, '}');
        break;
    }
    case JSON_ARRAY: {
        ds4_strbuf_putc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ds4_strbuf_puts(b, ", ");
            ds4_pyjson_dump(b, json_array_get(v, i));
        }
        ds4_strbuf_putc(b, ']');
        break;
    }
    case JSON_STRING:
        ds4_pyjson_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER:
        ds4_strbuf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case JSON_REAL:
        ds4_pyjson_float(b, json_real_value(v));
        break;
    case JSON_TRUE:
        ds4_strbuf_puts(b, "true");
        break;
    case JSON_FALSE:
        ds4_strbuf_puts(b, "false");
        break;
    case JSON_NULL:
        ds4_strbuf_puts(b, "null");
        break;
    }
}
