/*
 * grade.c - the "Answer: ..." extraction and the three grading kinds
 * (eval.h; docs/EVAL.md says what each accepts).
 *
 * An extracted answer is first folded to ASCII: the decimal digits of
 * other scripts (fullwidth, Arabic-Indic, Devanagari, ...) become 0-9, the
 * minus sign and the dashes '-', the Unicode spaces ' ', and markdown
 * emphasis and code marks go; anything else outside ASCII stays as '?', so
 * that an answer is never read from characters the parsers do not know.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

/* ------------------------------------------------------------ extraction */

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

const char *eval_extract(const char *reply, size_t *len) {
    const char *body = reply, *end_think = strstr(reply, "</think>");
    if (end_think) body = end_think + strlen("</think>");
    const char *last = NULL;
    for (const char *p = body; *p; p++)
        if (strncasecmp(p, "answer:", 7) == 0) last = p + 7;
    if (!last) return NULL;
    const char *p = last;
    /* "Answer:** B" and "Answer:\nB": the value may follow markup or a newline */
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '*') p++;
        if (*p != '\n' && *p != '\r') break;
        while (*p == '\n' || *p == '\r') p++;
    }
    const char *e = p;
    while (*e && *e != '\n' && *e != '\r') e++;
    while (e > p && (is_space(e[-1]) || e[-1] == '*')) e--;
    if (e == p) return NULL;
    *len = (size_t)(e - p);
    return p;
}

/* ------------------------------------------------------------ folding */

/* One UTF-8 character at s (n bytes left): its code point and length, or
 * -1 for a malformed sequence (one byte is then consumed). */
static long utf8_next(const unsigned char *s, size_t n, size_t *used) {
    *used = 1;
    if (s[0] < 0x80) return s[0];
    int k = (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!k || (size_t)k > n) return -1;
    long c = s[0] & (0x7F >> k);
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return -1;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *used = (size_t)k;
    return c;
}

/* The value of a decimal digit of any of the common scripts, or -1. */
static int unicode_digit(long c) {
    static const long zeros[] = {0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66,
                                 0x0CE6, 0x0D66, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x17E0, 0x1810, 0xFF10, 0x1D7CE};
    for (size_t i = 0; i < sizeof(zeros) / sizeof(zeros[0]); i++)
        if (c >= zeros[i] && c <= zeros[i] + 9) return (int)(c - zeros[i]);
    return -1;
}

/* s[0..n) folded to ASCII into out (NUL-terminated, at most cap - 1). */
static void fold(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0, i = 0;
    while (i < n && o + 1 < cap) {
        size_t used;
        long c = utf8_next((const unsigned char *)s + i, n - i, &used);
        i += used;
        int dig = unicode_digit(c);
        char a;
        if (c >= 0 && c < 0x80) a = (char)c;
        else if (dig >= 0) a = (char)('0' + dig);
        else if (c == 0x2212 || (c >= 0x2010 && c <= 0x2015) || c == 0xFE63 || c == 0xFF0D) a = '-';
        else if (c == 0x00A0 || c == 0x2009 || c == 0x202F || c == 0x2007 || c == 0x3000 ||
                 (c >= 0x2000 && c <= 0x200A))
            a = ' ';
        else if (c == 0xFF0C || c == 0x3001) a = ',';
        else a = '?';
        if (a == '*' || a == '`') continue;
        out[o++] = a;
    }
    out[o] = 0;
}

/* Drop LaTeX wrappers: "\boxed{X}", "\text{X}", "$X$" keep X. */
static void unwrap(char *s) {
    static const char *const wraps[] = {"\\boxed{", "\\text{", "\\mathbf{", "\\textbf{"};
    char *w = s;
    for (char *r = s; *r;) {
        bool skipped = false;
        for (size_t k = 0; k < sizeof(wraps) / sizeof(wraps[0]); k++)
            if (!strncmp(r, wraps[k], strlen(wraps[k]))) {
                r += strlen(wraps[k]);
                skipped = true;
            }
        if (skipped) continue;
        if (*r == '$' || *r == '}' || *r == '{') {
            r++;
            continue;
        }
        *w++ = *r++;
    }
    *w = 0;
}

static char *trim(char *s) {
    while (is_space(*s)) s++;
    size_t n = strlen(s);
    while (n && is_space(s[n - 1])) s[--n] = 0;
    return s;
}

/* ------------------------------------------------------------ the kinds */

int eval_parse_letter(const char *s, size_t n, uint32_t n_choices, char *out) {
    char buf[256];
    fold(s, n, buf, sizeof(buf));
    unwrap(buf);
    char *p = trim(buf);
    if (!strncasecmp(p, "option ", 7)) p = trim(p + 7);
    else if (!strncasecmp(p, "choice ", 7)) p = trim(p + 7);
    while (*p == '(' || *p == '[') p++;
    char c = (char)toupper((unsigned char)*p);
    if (c < 'A' || c >= 'A' + (int)n_choices) return -1;
    /* a lone lowercase letter counts; a word that starts with one does not */
    char next = p[1];
    if (isalnum((unsigned char)next)) return -1;
    if (islower((unsigned char)*p) && next && next != ')' && next != ']' && next != '.') return -1;
    *out = c;
    return 0;
}

int eval_parse_integer(const char *s, size_t n, long long *out) {
    char buf[256], digits[64];
    fold(s, n, buf, sizeof(buf));
    unwrap(buf);
    char *p = trim(buf);
    size_t len = strlen(p);
    while (len && (p[len - 1] == '.' || is_space(p[len - 1]))) p[--len] = 0; /* "42." ends a sentence */
    bool neg = false;
    if (*p == '-' || *p == '+') {
        neg = *p == '-';
        p++;
    }
    size_t nd = 0, group = 0;
    bool grouped = false;
    for (; *p; p++) {
        if (isdigit((unsigned char)*p)) {
            if (nd + 1 >= sizeof(digits)) return -1;
            digits[nd++] = *p;
            group++;
        } else if ((*p == ',' || *p == ' ') && nd > 0 && isdigit((unsigned char)p[1])) {
            /* thousands separators: groups of three after the first */
            if (grouped && group != 3) return -1;
            if (!grouped && group > 3) return -1;
            grouped = true;
            group = 0;
        } else if (*p == '.') {
            /* "42.0" is 42; "42.5" is not an integer */
            for (p++; *p; p++)
                if (*p != '0') return -1;
            break;
        } else {
            return -1;
        }
    }
    if (nd == 0 || (grouped && group != 3) || nd > 18) return -1;
    digits[nd] = 0;
    long long v = strtoll(digits, NULL, 10);
    *out = neg ? -v : v;
    return 0;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int lines_add(eval_lines *l, unsigned long v) {
    if (v > 1000000) return -1;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->v[i] == v) return 0;
    if (l->n == EVAL_MAX_LINES) return -1;
    l->v[l->n++] = (uint32_t)v;
    return 0;
}

int eval_parse_lines(const char *s, size_t n, eval_lines *out) {
    char buf[512];
    fold(s, n, buf, sizeof(buf));
    unwrap(buf);
    memset(out, 0, sizeof(*out));
    char *p = trim(buf);
    if (!*p) return -1;
    while (*p) {
        while (is_space(*p) || *p == ',' || *p == ';') p++;
        if (!*p) break;
        if (!strncasecmp(p, "and ", 4)) {
            p += 4;
            continue;
        }
        if (!strncasecmp(p, "lines ", 6)) p += 6;
        else if (!strncasecmp(p, "line ", 5)) p += 5;
        else if (*p == 'L' && isdigit((unsigned char)p[1])) p++;
        if (!isdigit((unsigned char)*p)) return -1;
        char *e;
        unsigned long a = strtoul(p, &e, 10), b = a;
        p = e;
        char *q = p;
        while (*q == ' ') q++;
        if (*q == '-' || !strncasecmp(q, "to ", 3)) {
            q += *q == '-' ? 1 : 3;
            while (*q == ' ') q++;
            if (!isdigit((unsigned char)*q)) return -1;
            b = strtoul(q, &e, 10);
            p = e;
            if (b < a || b - a >= EVAL_MAX_LINES) return -1;
        }
        for (unsigned long v = a; v <= b; v++)
            if (lines_add(out, v)) return -1;
        if (*p && !is_space(*p) && *p != ',' && *p != ';' && *p != '.') return -1;
        if (*p == '.') p++;
    }
    if (out->n == 0) return -1;
    qsort(out->v, out->n, sizeof(uint32_t), cmp_u32);
    return 0;
}

void eval_lines_format(const eval_lines *l, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (uint32_t i = 0; i < l->n && o + 1 < len;) {
        uint32_t j = i;
        while (j + 1 < l->n && l->v[j + 1] == l->v[j] + 1) j++;
        int w = j > i ? snprintf(buf + o, len - o, "%s%u-%u", o ? ", " : "", l->v[i], l->v[j])
                      : snprintf(buf + o, len - o, "%s%u", o ? ", " : "", l->v[i]);
        if (w < 0 || (size_t)w >= len - o) break;
        o += (size_t)w;
        i = j + 1;
    }
}

static bool lines_equal(const eval_lines *a, const eval_lines *b) {
    return a->n == b->n && !memcmp(a->v, b->v, a->n * sizeof(uint32_t));
}

bool eval_grade(const eval_question *q, const char *reply, char *got, size_t got_len, char *why, size_t why_len) {
    size_t n;
    const char *a = eval_extract(reply, &n);
    if (!a) {
        snprintf(got, got_len, "(no Answer: line)");
        snprintf(why, why_len, "no \"Answer:\" line after the thinking");
        return false;
    }
    switch (q->kind) {
    case EVAL_CHOICE: {
        char c;
        if (eval_parse_letter(a, n, q->n_choices, &c)) break;
        snprintf(got, got_len, "%c", c);
        bool ok = c == q->answer_letter;
        snprintf(why, why_len, "letter %c, %s %c", c, ok ? "is" : "expected", q->answer_letter);
        return ok;
    }
    case EVAL_INTEGER: {
        long long v;
        if (eval_parse_integer(a, n, &v)) break;
        snprintf(got, got_len, "%lld", v);
        bool ok = v == q->answer_int;
        snprintf(why, why_len, "integer %lld, %s %lld", v, ok ? "is" : "expected", q->answer_int);
        return ok;
    }
    case EVAL_LINES: {
        eval_lines l;
        if (eval_parse_lines(a, n, &l)) break;
        eval_lines_format(&l, got, got_len);
        for (uint32_t i = 0; i < q->n_accept; i++)
            if (lines_equal(&l, &q->accept[i])) {
                snprintf(why, why_len, "lines %s, %s", got, i == 0 ? "the answer" : "an accepted equivalent");
                return true;
            }
        snprintf(why, why_len, "lines %s, expected %s%s", got, q->answer_text,
                 q->n_accept > 1 ? " or an accepted equivalent" : "");
        return false;
    }
    }
    snprintf(got, got_len, "(unreadable: %.*s)", (int)(n > 60 ? 60 : n), a);
    snprintf(why, why_len, "\"Answer: %.*s\" is not a %s", (int)(n > 60 ? 60 : n), a,
             q->kind == EVAL_CHOICE    ? "choice letter"
             : q->kind == EVAL_INTEGER ? "integer"
                                       : "set of line numbers");
    return false;
}

const char *eval_status_name(eval_status s) {
    static const char *const names[] = {"pending", "prefill", "thinking", "answering",
                                        "passed",  "failed",  "skipped",  "stopped"};
    return names[s];
}
