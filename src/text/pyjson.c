/*
 * pyjson.c - Python-compatible JSON serialisation (see pyjson.h).
 */
#include "text/pyjson.h"

#include <errno.h>
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
        if (nd > e + 1) ds4_strbuf_append(b, d + e + 1, (size_t)(nd - e - 1));
        else ds4_strbuf_putc(b, '0');
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
        if (ds4_pyjson_big_number(v)) ds4_strbuf_append(b, json_string_value(v) + 1, json_string_length(v) - 1);
        else ds4_pyjson_string(b, json_string_value(v), json_string_length(v));
        break;
    case JSON_INTEGER: ds4_strbuf_printf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: ds4_pyjson_float(b, json_real_value(v)); break;
    case JSON_TRUE: ds4_strbuf_puts(b, "true"); break;
    case JSON_FALSE: ds4_strbuf_puts(b, "false"); break;
    case JSON_NULL: ds4_strbuf_puts(b, "null"); break;
    }
}

/* ------------------------------------------------------------- loading */

#define BIG_MARK       '\xff'
#define MAX_DEPTH      2048 /* jansson's own nesting limit */
#define MAX_INT_DIGITS 4300 /* Python's int <-> str conversion limit */

typedef struct loader {
    const char *s;
    size_t n, i;
    ds4_err *err;
} loader;

static json_t *fail_at(loader *L, ds4_errcode code, const char *what) {
    ds4_err_set(L->err, code, "JSON: %s at byte %zu", what, L->i);
    return NULL;
}

static void skip_ws(loader *L) {
    while (L->i < L->n && (L->s[L->i] == ' ' || L->s[L->i] == '\t' || L->s[L->i] == '\n' || L->s[L->i] == '\r')) L->i++;
}

static bool take(loader *L, const char *lit) {
    size_t l = strlen(lit);
    if (L->n - L->i < l || memcmp(L->s + L->i, lit, l) != 0) return false;
    L->i += l;
    return true;
}

static json_t *big_number(loader *L, const char *text, size_t len) {
    char buf[MAX_INT_DIGITS + 8];
    buf[0] = BIG_MARK;
    memcpy(buf + 1, text, len);
    json_t *v = json_stringn_nocheck(buf, len + 1);
    return v ? v : fail_at(L, DS4_ENOMEM, "out of memory");
}

static size_t digits(loader *L) {
    size_t k = 0;
    while (L->i < L->n && L->s[L->i] >= '0' && L->s[L->i] <= '9') L->i++, k++;
    return k;
}

/* A number by JSON's grammar (Python's NUMBER_RE); what jansson cannot hold
 * becomes a big number with the text json.dumps writes for it. */
static json_t *load_number(loader *L) {
    size_t start = L->i;
    bool neg = L->s[L->i] == '-';
    if (neg) L->i++;
    if (L->i < L->n && L->s[L->i] == '0') L->i++;
    else if (digits(L) == 0) return fail_at(L, DS4_EFORMAT, "invalid number");
    bool real = false;
    if (L->i + 1 < L->n && L->s[L->i] == '.' && L->s[L->i + 1] >= '0' && L->s[L->i + 1] <= '9') {
        L->i++;
        digits(L);
        real = true;
    }
    if (L->i < L->n && (L->s[L->i] == 'e' || L->s[L->i] == 'E')) {
        size_t save = L->i++;
        if (L->i < L->n && (L->s[L->i] == '+' || L->s[L->i] == '-')) L->i++;
        if (digits(L) == 0) L->i = save; /* Python stops before a bare "e" */
        else real = true;
    }
    const char *t = L->s + start;
    size_t len = L->i - start;
    char buf[64];
    if (!real) {
        if (len - neg > MAX_INT_DIGITS) {
            L->i = start;
            return fail_at(L, DS4_ERANGE, "integer of more than 4300 digits");
        }
        /* Within int64 an integer as jansson holds it; beyond, exact digits. */
        if (len < sizeof(buf)) {
            memcpy(buf, t, len);
            buf[len] = '\0';
            errno = 0;
            long long x = strtoll(buf, NULL, 10);
            if (errno == 0) {
                json_t *v = json_integer(x);
                return v ? v : fail_at(L, DS4_ENOMEM, "out of memory");
            }
        }
        return big_number(L, t, len);
    }
    char *tmp = malloc(len + 1);
    if (!tmp) return fail_at(L, DS4_ENOMEM, "out of memory");
    memcpy(tmp, t, len);
    tmp[len] = '\0';
    double x = strtod(tmp, NULL);
    free(tmp);
    if (isinf(x)) return big_number(L, neg ? "-Infinity" : "Infinity", neg ? 9 : 8);
    json_t *v = json_real(x);
    return v ? v : fail_at(L, DS4_ENOMEM, "out of memory");
}

/* A string literal: its extent found here, its decoding (escapes,
 * surrogates, UTF-8 validity) left to jansson. */
static json_t *load_string(loader *L) {
    size_t start = L->i++;
    while (L->i < L->n && L->s[L->i] != '"') L->i += L->s[L->i] == '\\' ? 2 : 1;
    if (L->i >= L->n) {
        L->i = start;
        return fail_at(L, DS4_EFORMAT, "unterminated string");
    }
    L->i++;
    json_error_t je;
    json_t *v = json_loadb(L->s + start, L->i - start, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v) {
        L->i = start + (je.position > 0 ? (size_t)je.position - 1 : 0);
        return fail_at(L, strstr(je.text, "out of memory") ? DS4_ENOMEM : DS4_EFORMAT, je.text);
    }
    return v;
}

static json_t *load_value(loader *L, int depth);

static json_t *load_object(loader *L, int depth) {
    json_t *o = json_object();
    if (!o) return fail_at(L, DS4_ENOMEM, "out of memory");
    L->i++;
    skip_ws(L);
    if (take(L, "}")) return o;
    for (;;) {
        skip_ws(L);
        if (L->i >= L->n || L->s[L->i] != '"') goto bad_key;
        json_t *k = load_string(L);
        if (!k) goto fail;
        skip_ws(L);
        if (!take(L, ":")) {
            json_decref(k);
            fail_at(L, DS4_EFORMAT, "':' expected");
            goto fail;
        }
        json_t *v = load_value(L, depth + 1);
        int rc = v ? json_object_setn_new_nocheck(o, json_string_value(k), json_string_length(k), v) : -1;
        json_decref(k);
        if (!v) goto fail;
        if (rc) {
            fail_at(L, DS4_ENOMEM, "out of memory");
            goto fail;
        }
        skip_ws(L);
        if (take(L, "}")) return o;
        if (!take(L, ",")) {
            fail_at(L, DS4_EFORMAT, "',' or '}' expected");
            goto fail;
        }
    }
bad_key:
    fail_at(L, DS4_EFORMAT, "string key expected");
fail:
    json_decref(o);
    return NULL;
}

static json_t *load_array(loader *L, int depth) {
    json_t *a = json_array();
    if (!a) return fail_at(L, DS4_ENOMEM, "out of memory");
    L->i++;
    skip_ws(L);
    if (take(L, "]")) return a;
    for (;;) {
        json_t *v = load_value(L, depth + 1);
        if (!v) break;
        if (json_array_append_new(a, v)) {
            fail_at(L, DS4_ENOMEM, "out of memory");
            break;
        }
        skip_ws(L);
        if (take(L, "]")) return a;
        if (!take(L, ",")) {
            fail_at(L, DS4_EFORMAT, "',' or ']' expected");
            break;
        }
    }
    json_decref(a);
    return NULL;
}

static json_t *load_value(loader *L, int depth) {
    if (depth > MAX_DEPTH) return fail_at(L, DS4_EFORMAT, "nested too deeply");
    skip_ws(L);
    if (L->i >= L->n) return fail_at(L, DS4_EFORMAT, "value expected");
    char c = L->s[L->i];
    json_t *v = NULL;
    if (c == '{') return load_object(L, depth);
    if (c == '[') return load_array(L, depth);
    if (c == '"') return load_string(L);
    if (take(L, "true")) v = json_true();
    else if (take(L, "false")) v = json_false();
    else if (take(L, "null")) v = json_null();
    else if (take(L, "NaN")) return big_number(L, "NaN", 3);
    else if (take(L, "Infinity")) return big_number(L, "Infinity", 8);
    else if (take(L, "-Infinity")) return big_number(L, "-Infinity", 9);
    else if (c == '-' || (c >= '0' && c <= '9')) return load_number(L);
    else return fail_at(L, DS4_EFORMAT, "value expected");
    return v;
}

json_t *ds4_pyjson_load(const char *s, size_t n, ds4_err *err) {
    loader L = {s, n, 0, err};
    json_t *v = load_value(&L, 1);
    if (!v) return NULL;
    skip_ws(&L);
    if (L.i < n) {
        json_decref(v);
        return fail_at(&L, DS4_EFORMAT, "extra data");
    }
    return v;
}

const char *ds4_pyjson_big_number(const json_t *v) {
    const char *s = json_string_value(v);
    return s && s[0] == BIG_MARK ? s + 1 : NULL;
}
