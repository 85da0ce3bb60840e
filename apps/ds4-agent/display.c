/*
 * display.c - what the user sees of the model's output (see agent.h).
 *
 * Reasoning is grey; the answer goes through a small streaming markdown
 * renderer (bold, italic, inline code, fenced code blocks, headings) that
 * holds back only the characters that may still open or close a style;
 * tool calls are shown while the model is still writing them, from the
 * DSML parser's events, never as raw DSML: a header with the tool's short
 * arguments, the bash command as "$ command", the old and new text of an
 * edit as "-" and "+" lines, the size of a write growing.
 *
 * Without colours (no terminal, NO_COLOR) the same text is written with no
 * escape sequences and no markdown processing.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"

#define ESC_RESET "\033[0m"

static const char *const STYLE_ON[] = {
    [OUT_TEXT] = "",        [OUT_THINK] = "\033[38;5;245m",  [OUT_TOOL] = "\033[1;36m",
    [OUT_ARG] = "\033[33m", [OUT_RESULT] = "\033[38;5;244m", [OUT_DEL] = "\033[31m",
    [OUT_ADD] = "\033[32m", [OUT_ERROR] = "\033[1;31m",      [OUT_INFO] = "\033[36m",
    [OUT_ECHO] = "\033[1m", [OUT_COMPACT] = "\033[1;95m",
};

/* Streaming view of one tool call's arguments: the JSON object text the
 * DSML parser builds, decoded key by key as it arrives. */
typedef enum av_state {
    AV_START,
    AV_KEY_WAIT,
    AV_KEY,
    AV_COLON,
    AV_VALUE_WAIT,
    AV_STR,
    AV_ESC,
    AV_UHEX,
    AV_RAW,
    AV_DONE
} av_state;

typedef struct argview {
    av_state s;
    char key[64];
    size_t key_len;
    bool str;  /* the value is a JSON string */
    int depth; /* AV_RAW: nesting */
    bool raw_in_str, raw_esc;
    unsigned uval, uhex, hi_surrogate;
    /* the value of the key being streamed, for short arguments */
    char val[256];
    size_t val_len;
    size_t val_bytes, val_lines;
    int mode; /* how this value is shown (VIEW_*) */
    bool at_line_start;
} argview;

enum { VIEW_SHORT, VIEW_COMMAND, VIEW_DEL, VIEW_ADD, VIEW_SIZE };

struct display {
    agent_link *l;
    bool color;
    char last;     /* last byte written: '\n' at a line start */
    out_style cur; /* style in force */
    bool any_reasoning, any_content;
    /* markdown */
    bool md_bold, md_italic, md_code, md_block, md_heading, md_line_start;
    char md_hold[8]; /* backticks or stars not yet decided */
    size_t md_hold_len;
    bool md_fence_info; /* rest of an opening fence line */
    /* tool view */
    char tool[64];
    argview av;
    bool header_open; /* the tool header line is still being written */
};

display *display_new(agent_link *l, bool color) {
    display *d = calloc(1, sizeof(*d));
    if (!d) return NULL;
    d->l = l;
    d->color = color;
    d->last = '\n';
    return d;
}

void display_free(display *d) { free(d); }

static void raw(display *d, const char *s, size_t n) {
    if (!n) return;
    link_write(d->l, s, n);
    d->last = s[n - 1];
}

static void set_style(display *d, out_style st) {
    if (!d->color || st == d->cur) return;
    link_write(d->l, ESC_RESET, strlen(ESC_RESET));
    if (st != OUT_TEXT) link_write(d->l, STYLE_ON[st], strlen(STYLE_ON[st]));
    d->cur = st;
}

void display_newline(display *d) {
    if (d->last != '\n') {
        set_style(d, OUT_TEXT);
        raw(d, "\n", 1);
    }
}

void display_write(display *d, out_style st, const char *s, size_t n) {
    if (!n) return;
    set_style(d, st);
    raw(d, s, n);
}

void display_printf(display *d, out_style st, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0) return;
    display_write(d, st, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/* Lines of text with a prefix each ("- ", "+ "), in a style. */
static void prefixed_lines(display *d, out_style st, const char *prefix, const char *s, size_t n, int first_line) {
    size_t i = 0;
    int line = first_line;
    while (i < n) {
        size_t e = i;
        while (e < n && s[e] != '\n') e++;
        char num[24] = "";
        if (first_line > 0) snprintf(num, sizeof(num), "%5d ", line++);
        display_newline(d);
        set_style(d, st);
        raw(d, num, strlen(num));
        raw(d, prefix, strlen(prefix));
        raw(d, s + i, e - i);
        set_style(d, OUT_TEXT);
        raw(d, "\n", 1);
        i = e + 1;
    }
}

void display_diff(display *d, const char *old, size_t on, const char *nw, size_t nn, int first_line) {
    if (on) prefixed_lines(d, OUT_DEL, "- ", old, on, first_line);
    if (nn) prefixed_lines(d, OUT_ADD, "+ ", nw, nn, first_line);
}

/* ------------------------------------------------------------ markdown */

/* The attributes of the markdown state, as one escape sequence. */
static void md_apply(display *d) {
    if (!d->color) return;
    char seq[64] = ESC_RESET;
    if (d->md_block) strcat(seq, "\033[38;5;150m");
    else if (d->md_code) strcat(seq, "\033[38;5;180m");
    else {
        if (d->md_bold || d->md_heading) strcat(seq, "\033[1m");
        if (d->md_italic) strcat(seq, "\033[3m");
    }
    link_write(d->l, seq, strlen(seq));
    d->cur = OUT_TEXT; /* the markdown attributes are reset by set_style */
}

static void md_put(display *d, const char *s, size_t n) {
    raw(d, s, n);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') {
            if (d->md_heading) {
                d->md_heading = false;
                md_apply(d);
            }
            d->md_line_start = true;
        } else {
            d->md_line_start = false;
        }
    }
}

/* Decide held backticks or stars now that the next byte (or the end) is known. */
static void md_flush_hold(display *d, char next) {
    size_t n = d->md_hold_len;
    if (!n) return;
    char c = d->md_hold[0];
    bool line_start = d->md_line_start;
    d->md_hold_len = 0;
    if (c == '`') {
        if (n == 3 && line_start && !d->md_code) {
            d->md_block = !d->md_block;
            if (d->md_block) d->md_fence_info = true;
            md_apply(d);
            d->md_line_start = false;
            return;
        }
        if (n == 1 && !d->md_block) {
            d->md_code = !d->md_code;
            md_apply(d);
            return;
        }
        md_put(d, d->md_hold, n);
        return;
    }
    /* stars: "**" bold, "*" italic; a "* " at a line start is a bullet */
    if (d->md_code || d->md_block || n > 2 || (n == 1 && line_start && next == ' ')) {
        md_put(d, d->md_hold, n);
        return;
    }
    if (n == 2) d->md_bold = !d->md_bold;
    else d->md_italic = !d->md_italic;
    md_apply(d);
}

static void md_byte(display *d, char c) {
    if (d->md_fence_info) {
        /* the language name after an opening fence is not shown */
        if (c == '\n') {
            d->md_fence_info = false;
            md_put(d, "\n", 1);
        }
        return;
    }
    if (d->md_hold_len && (c != d->md_hold[0] || d->md_hold_len == sizeof(d->md_hold))) {
        md_flush_hold(d, c);
        if (d->md_fence_info && c == '\n') d->md_fence_info = false; /* a fence with no language */
    }
    if ((c == '`' || (c == '*' && !d->md_code && !d->md_block)) && d->md_hold_len < sizeof(d->md_hold)) {
        d->md_hold[d->md_hold_len++] = c;
        return;
    }
    if (c == '#' && d->md_line_start && !d->md_block) {
        d->md_heading = true;
        md_apply(d);
    }
    md_put(d, &c, 1);
}

static void md_text(display *d, const char *s, size_t n) {
    if (!d->color) {
        raw(d, s, n);
        return;
    }
    for (size_t i = 0; i < n; i++) md_byte(d, s[i]);
}

static void md_finish(display *d) {
    md_flush_hold(d, 0);
    bool styled = d->md_bold || d->md_italic || d->md_code || d->md_block || d->md_heading;
    d->md_bold = d->md_italic = d->md_code = d->md_block = d->md_heading = d->md_fence_info = false;
    if (styled && d->color) link_write(d->l, ESC_RESET, strlen(ESC_RESET));
    d->cur = OUT_TEXT;
}

/* ------------------------------------------------------------ tool view */

static int view_mode(const char *tool, const char *key) {
    if (!strcmp(tool, "bash") && !strcmp(key, "command")) return VIEW_COMMAND;
    if (!strcmp(tool, "edit") && !strcmp(key, "old")) return VIEW_DEL;
    if (!strcmp(tool, "edit") && !strcmp(key, "new")) return VIEW_ADD;
    if (!strcmp(tool, "write") && !strcmp(key, "content")) return VIEW_SIZE;
    return VIEW_SHORT;
}

static void value_begin(display *d) {
    argview *a = &d->av;
    a->mode = view_mode(d->tool, a->key);
    a->val_len = a->val_bytes = a->val_lines = 0;
    a->at_line_start = true;
    if (a->mode == VIEW_SHORT) return;
    d->header_open = false;
    display_newline(d);
    if (a->mode == VIEW_COMMAND) display_write(d, OUT_ARG, "$ ", 2);
}

static void value_bytes(display *d, const char *s, size_t n) {
    argview *a = &d->av;
    a->val_bytes += n;
    switch (a->mode) {
    case VIEW_SHORT:
        for (size_t i = 0; i < n && a->val_len + 1 < sizeof(a->val); i++)
            a->val[a->val_len++] = s[i] == '\n' ? ' ' : s[i];
        break;
    case VIEW_COMMAND: display_write(d, OUT_ARG, s, n); break;
    case VIEW_DEL:
    case VIEW_ADD: {
        out_style st = a->mode == VIEW_DEL ? OUT_DEL : OUT_ADD;
        size_t i = 0;
        while (i < n) {
            if (a->at_line_start) display_write(d, st, a->mode == VIEW_DEL ? "- " : "+ ", 2);
            size_t e = i;
            while (e < n && s[e] != '\n') e++;
            a->at_line_start = e < n;
            display_write(d, st, s + i, e - i + (e < n));
            i = e + (e < n);
        }
        break;
    }
    case VIEW_SIZE:
        for (size_t i = 0; i < n; i++) a->val_lines += s[i] == '\n';
        /* a dot per 16 KiB shows a long write is still coming */
        if (a->val_bytes / 16384 != (a->val_bytes - n) / 16384) display_write(d, OUT_RESULT, ".", 1);
        break;
    }
}

static void value_end(display *d) {
    argview *a = &d->av;
    switch (a->mode) {
    case VIEW_SHORT:
        if (!d->header_open) {
            display_newline(d);
            display_write(d, OUT_TOOL, "  ", 2);
            d->header_open = true;
        }
        display_printf(d, OUT_TOOL, " %s=%.*s%s", a->key, (int)a->val_len, a->val,
                       a->val_bytes > a->val_len ? "…" : "");
        break;
    case VIEW_COMMAND:
    case VIEW_DEL:
    case VIEW_ADD: display_newline(d); break;
    case VIEW_SIZE:
        display_printf(d, OUT_RESULT, "(%zu bytes, %zu lines)\n", a->val_bytes, a->val_lines + (a->val_bytes > 0));
        break;
    }
}

static void utf8_put(display *d, unsigned cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) b[0] = (char)cp, n = 1;
    else if (cp < 0x800) b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 63)), b[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 63)), b[2] = (char)(0x80 | ((cp >> 6) & 63)),
        b[3] = (char)(0x80 | (cp & 63)), n = 4;
    value_bytes(d, b, n);
}

static void av_byte(display *d, char c) {
    argview *a = &d->av;
    switch (a->s) {
    case AV_START:
        if (c == '{') a->s = AV_KEY_WAIT;
        break;
    case AV_KEY_WAIT:
        if (c == '"') {
            a->s = AV_KEY;
            a->key_len = 0;
        } else if (c == '}') {
            a->s = AV_DONE;
        }
        break;
    case AV_KEY:
        if (c == '"') {
            a->key[a->key_len] = 0;
            a->s = AV_COLON;
        } else if (a->key_len + 1 < sizeof(a->key)) {
            a->key[a->key_len++] = c;
        }
        break;
    case AV_COLON:
        if (c == ':') a->s = AV_VALUE_WAIT;
        break;
    case AV_VALUE_WAIT:
        if (c == ' ' || c == '\n' || c == '\t') break;
        a->str = c == '"';
        value_begin(d);
        if (a->str) {
            a->s = AV_STR;
        } else {
            a->s = AV_RAW;
            a->depth = 0;
            a->raw_in_str = a->raw_esc = false;
            av_byte(d, c);
        }
        break;
    case AV_STR:
        if (c == '\\') a->s = AV_ESC;
        else if (c == '"') {
            value_end(d);
            a->s = AV_KEY_WAIT;
        } else value_bytes(d, &c, 1);
        break;
    case AV_ESC: {
        static const char from[] = "nrtbf", to[] = "\n\r\t\b\f";
        const char *p = strchr(from, c);
        a->s = AV_STR;
        if (c == 'u') {
            a->s = AV_UHEX;
            a->uhex = a->uval = 0;
        } else if (p && c) {
            value_bytes(d, &to[p - from], 1);
        } else {
            value_bytes(d, &c, 1);
        }
        break;
    }
    case AV_UHEX: {
        int v = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (v < 0) {
            a->s = AV_STR;
            break;
        }
        a->uval = a->uval * 16 + (unsigned)v;
        if (++a->uhex < 4) break;
        a->s = AV_STR;
        if (a->uval >= 0xD800 && a->uval < 0xDC00) {
            a->hi_surrogate = a->uval;
        } else if (a->uval >= 0xDC00 && a->uval < 0xE000 && a->hi_surrogate) {
            utf8_put(d, 0x10000 + ((a->hi_surrogate - 0xD800) << 10) + (a->uval - 0xDC00));
            a->hi_surrogate = 0;
        } else {
            utf8_put(d, a->uval);
        }
        break;
    }
    case AV_RAW:
        if (a->raw_in_str) {
            if (a->raw_esc) a->raw_esc = false;
            else if (c == '\\') a->raw_esc = true;
            else if (c == '"') a->raw_in_str = false;
        } else if (c == '"') {
            a->raw_in_str = true;
        } else if (c == '{' || c == '[') {
            a->depth++;
        } else if (c == '}' || c == ']') {
            if (a->depth == 0) {
                value_end(d);
                a->s = AV_DONE;
                return;
            }
            a->depth--;
        } else if (c == ',' && a->depth == 0) {
            value_end(d);
            a->s = AV_KEY_WAIT;
            return;
        }
        value_bytes(d, &c, 1);
        break;
    case AV_DONE: break;
    }
}

/* ------------------------------------------------------------ events */

void display_round_begin(display *d) {
    d->any_reasoning = d->any_content = false;
    d->md_line_start = true;
    d->md_hold_len = 0;
    d->tool[0] = 0;
}

void display_event(display *d, const ds4_dsml_event *ev) {
    switch (ev->kind) {
    case DS4_DSML_REASONING:
        if (!d->any_reasoning) display_newline(d);
        d->any_reasoning = true;
        display_write(d, OUT_THINK, ev->text, ev->len);
        break;
    case DS4_DSML_THINK_END:
        if (d->any_reasoning) display_newline(d);
        break;
    case DS4_DSML_CONTENT: {
        /* leading blank lines of an answer after reasoning are noise */
        const char *s = ev->text;
        size_t n = ev->len;
        if (!d->any_content)
            while (n && (*s == '\n' || *s == ' ')) s++, n--;
        if (!n) break;
        if (!d->any_content) display_newline(d);
        d->any_content = true;
        set_style(d, OUT_TEXT);
        md_text(d, s, n);
        break;
    }
    case DS4_DSML_CALL_START:
        md_finish(d);
        display_newline(d);
        snprintf(d->tool, sizeof(d->tool), "%.*s", (int)ev->len, ev->text);
        display_printf(d, OUT_TOOL, "▸ %s", d->tool);
        d->header_open = true;
        memset(&d->av, 0, sizeof(d->av));
        break;
    case DS4_DSML_CALL_ARGS:
        for (size_t i = 0; i < ev->len; i++) av_byte(d, ev->text[i]);
        break;
    case DS4_DSML_CALL_END:
        display_newline(d);
        d->header_open = false;
        break;
    }
}

void display_round_end(display *d) {
    md_finish(d);
    set_style(d, OUT_TEXT);
    display_newline(d);
}
