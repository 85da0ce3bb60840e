/*
 * dsml_parse.c - incremental parsing of model output into reasoning,
 * content and DSML tool calls (see dsml_parse.h).
 *
 * Input accumulates in a pending buffer; each state consumes from its
 * front as much as it can decide, and leaves the rest until more text
 * arrives or finish() declares the end.  Matching helpers therefore answer
 * three ways: yes, no, or "undecided" (the pending text is a proper prefix
 * of what would match).
 */
#include "text/dsml_parse.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "text/dsml_render.h"
#include "text/pyjson.h"

#define THINK_OPEN  "<think>"
#define THINK_CLOSE "</think>"
#define EOS_TEXT    "<｜end▁of▁sentence｜>"
#define MAX_TAG     4096 /* an opening tag longer than this is malformed */
#define MAX_NESTING 32   /* nested parameter objects */

/* Tag spellings: the official marker first; "" is plain XML. */
static const char *const PREFIXES[] = {DS4_DSML_MARKER, "DSML｜", "|DSML|", ""};
#define N_PREFIXES 4
#define CANONICAL  0

enum { NO = 0, YES = 1, UNDECIDED = -1 };

typedef enum state {
    S_REASONING,
    S_CONTENT,
    S_BLOCK,      /* inside <tool_calls>, between invokes */
    S_INVOKE,     /* inside <invoke>, between parameters */
    S_PARAM_STR,  /* string="true" value: streamed */
    S_PARAM_JSON, /* string="false" value: until its closing tag */
    S_PARAM_RAW,  /* no string attribute: maybe nested parameters */
    S_ERROR,
} state;

struct ds4_dsml_parser {
    state st;
    bool thinking;
    bool final;
    bool after_block;   /* skip white space after </tool_calls> */
    bool think_checked; /* a leading <think> was looked for */
    ds4_dsml_event_fn fn;
    void *ctx;
    ds4_strbuf buf; /* pending text is buf.p[pos .. buf.len) */
    size_t pos;
    size_t offset; /* output offset of buf.p[pos] */
    size_t scan;   /* pending bytes known to hold no closing tag start */
    int depth;     /* S_PARAM_RAW nesting */

    int blocks_closed;
    bool raw_active; /* inside a tool-call block: consumed text goes to raw */
    ds4_strbuf raw;
    size_t block_offset;

    int prefix; /* spelling of the current parameter's opening tag */
    int n_params;
    ds4_strbuf name;
    ds4_strbuf args;
    ds4_dsml_result res;
    bool oom;
};

const ds4_dsml_result *ds4_dsml_result_of(const ds4_dsml_parser *p) { return &p->res; }

ds4_dsml_position ds4_dsml_position_of(const ds4_dsml_parser *p) {
    switch (p->st) {
    case S_BLOCK:
    case S_INVOKE: return DS4_DSML_AT_MARKUP;
    case S_PARAM_STR:
    case S_PARAM_JSON:
    case S_PARAM_RAW: return DS4_DSML_AT_VALUE;
    default: return DS4_DSML_AT_TEXT;
    }
}

int ds4_dsml_blocks_closed(const ds4_dsml_parser *p) { return p->blocks_closed; }

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* YES: s starts with lit; NO; UNDECIDED: s is a proper prefix of lit. */
static int lit_match(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    if (n >= l) return memcmp(s, lit, l) == 0 ? YES : NO;
    return memcmp(s, lit, n) == 0 ? UNDECIDED : NO;
}

/* Longest proper prefix of lit that ends s[0..n). */
static size_t partial_suffix(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    for (size_t h = (n < l - 1 ? n : l - 1); h > 0; h--)
        if (memcmp(s + n - h, lit, h) == 0) return h;
    return 0;
}

/* "<" or "</", a prefix spelling, the tag name (and ">" when closing).  An
 * opening tag's name must be followed by white space, '>' or '/'.  Only
 * spelling `only` and the canonical one are tried when only >= 0.  On YES,
 * *len covers the tag up to the name (opening) or to '>' (closing). */
static int match_tag(const char *s, size_t n, bool closing, const char *name, int only, size_t *len, int *prefix) {
    int result = NO;
    for (int k = 0; k < N_PREFIXES; k++) {
        if (only >= 0 && k != only && k != CANONICAL) continue;
        char lit[64];
        int l = snprintf(lit, sizeof(lit), "%s%s%s%s", closing ? "</" : "<", PREFIXES[k], name, closing ? ">" : "");
        int r = lit_match(s, n, lit);
        if (r == YES && !closing) {
            if ((size_t)l == n) r = UNDECIDED;
            else if (!is_ws(s[l]) && s[l] != '>' && s[l] != '/') r = NO;
        }
        if (r == YES) {
            *len = (size_t)l;
            *prefix = k;
            return YES;
        }
        if (r == UNDECIDED) result = UNDECIDED;
    }
    return result;
}

/* Decode &amp; &lt; &gt; &quot; &apos; (attribute values). */
static void entity_decode(ds4_strbuf *out, const char *s, size_t n) {
    static const char *const ent[][2] = {
        {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}};
    for (size_t i = 0; i < n;) {
        int done = 0;
        if (s[i] == '&') {
            for (size_t k = 0; k < 5 && !done; k++) {
                size_t l = strlen(ent[k][0]);
                if (n - i >= l && memcmp(s + i, ent[k][0], l) == 0) {
                    ds4_strbuf_puts(out, ent[k][1]);
                    i += l;
                    done = 1;
                }
            }
        }
        if (!done) ds4_strbuf_putc(out, s[i++]);
    }
}

typedef struct attrs {
    ds4_strbuf name;
    bool has_name;
    int string; /* 1 true, 0 false, -1 absent */
} attrs;

/* Attributes up to and including '>': YES (*len set), UNDECIDED, or NO. */
static int parse_attrs(const char *s, size_t n, attrs *a, size_t *len) {
    a->has_name = false;
    a->string = -1;
    ds4_strbuf_truncate(&a->name, 0);
    size_t i = 0;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) return UNDECIDED;
        if (s[i] == '>') {
            *len = i + 1;
            return YES;
        }
        if (s[i] == '/') {
            if (i + 1 >= n) return UNDECIDED;
            if (s[i + 1] != '>') return NO;
            *len = i + 2;
            return YES;
        }
        size_t ks = i;
        while (i < n && !is_ws(s[i]) && s[i] != '=' && s[i] != '>' && s[i] != '/') i++;
        size_t ke = i;
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) return UNDECIDED;
        if (ke == ks || s[i] != '=') return NO;
        i++;
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) return UNDECIDED;
        char q = s[i];
        if (q != '"' && q != '\'') return NO;
        const char *end = memchr(s + i + 1, q, n - i - 1);
        if (!end) return UNDECIDED;
        size_t vs = i + 1, ve = (size_t)(end - s);
        i = ve + 1;
        if (ke - ks == 4 && memcmp(s + ks, "name", 4) == 0) {
            ds4_strbuf_truncate(&a->name, 0);
            entity_decode(&a->name, s + vs, ve - vs);
            a->has_name = true;
        } else if (ke - ks == 6 && memcmp(s + ks, "string", 6) == 0) {
            a->string = !(ve - vs == 5 && memcmp(s + vs, "false", 5) == 0);
        }
    }
}

/* ---- string values: ds4's closing-tag escape ---- */

#define ESCAPE_TAIL "lt;/" DS4_DSML_MARKER "parameter>"

/* Length of "(amp;)*lt;/｜DSML｜parameter>" at s[0..n) (0 if absent);
 * *partial when s[0..n) is a proper prefix of one. */
static size_t escape_at(const char *s, size_t n, bool *partial) {
    size_t i = 0;
    *partial = false;
    for (;;) {
        int r = lit_match(s + i, n - i, "amp;");
        if (r == YES) {
            i += 4;
            continue;
        }
        if (r == UNDECIDED) {
            *partial = true;
            return 0;
        }
        break;
    }
    int r = lit_match(s + i, n - i, ESCAPE_TAIL);
    if (r == UNDECIDED) *partial = true;
    return r == YES ? i + strlen(ESCAPE_TAIL) : 0;
}

/* Append the decoded value s[0..n) to out: each escape loses one "amp;",
 * or its "&lt;" becomes "<". */
static void unescape_value(ds4_strbuf *out, const char *s, size_t n) {
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '&') continue;
        bool partial;
        size_t l = escape_at(s + i + 1, n - i - 1, &partial);
        if (!l) continue;
        ds4_strbuf_append(out, s + run, i - run);
        if (s[i + 1] == 'a') {
            ds4_strbuf_putc(out, '&');
            run = i + 5; /* drop one "amp;" */
        } else {
            ds4_strbuf_putc(out, '<');
            run = i + 4; /* "&lt;" */
        }
        i += l;
    }
    ds4_strbuf_append(out, s + run, n - run);
}

/* Earliest closing parameter tag (spelling `prefix` or canonical) in
 * s[from..n): its offset and length, or SIZE_MAX. */
static size_t find_closer(const char *s, size_t n, size_t from, int prefix, size_t *len) {
    for (size_t i = from; i < n; i++) {
        if (s[i] != '<') continue;
        int k;
        if (match_tag(s + i, n - i, true, "parameter", prefix, len, &k) == YES) return i;
    }
    return SIZE_MAX;
}

/* End of a parameter value without `string`: the closing tag that brings
 * the nesting depth to 0.  Scans from *scan with *depth; returns the offset
 * (and *len) or SIZE_MAX, leaving *scan where a later call resumes. */
static size_t find_raw_end(const char *s, size_t n, size_t *scan, int *depth, bool final, size_t *len) {
    size_t i = *scan;
    for (; i < n; i++) {
        if (s[i] != '<') continue;
        size_t l;
        int k;
        int rc = match_tag(s + i, n - i, true, "parameter", -1, &l, &k);
        if (rc == YES) {
            if (--*depth == 0) {
                *len = l;
                *scan = i;
                return i;
            }
            i += l - 1;
            continue;
        }
        int ro = match_tag(s + i, n - i, false, "parameter", -1, &l, &k);
        if (ro == YES) {
            ++*depth;
            i += l - 1;
            continue;
        }
        if ((rc == UNDECIDED || ro == UNDECIDED) && !final) break;
    }
    *scan = i;
    return SIZE_MAX;
}

static json_t *value_json(const char *s, size_t n, int string_kind, int level);

/* A parameter list "<parameter ...>v</parameter>..." as a JSON object, or
 * NULL if s[0..n) is not exactly that. */
static json_t *parse_nested(const char *s, size_t n, int level) {
    if (level > MAX_NESTING) return NULL;
    json_t *obj = json_object();
    attrs a = {0};
    size_t i = 0;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i == n) break;
        size_t l, al, cl;
        int prefix;
        if (match_tag(s + i, n - i, false, "parameter", -1, &l, &prefix) != YES) goto fail;
        if (parse_attrs(s + i + l, n - i - l, &a, &al) != YES || !a.has_name || a.name.failed) goto fail;
        i += l + al;
        size_t end;
        if (a.string < 0) {
            size_t scan = 0;
            int depth = 1;
            end = find_raw_end(s + i, n - i, &scan, &depth, true, &cl);
        } else {
            end = find_closer(s + i, n - i, 0, prefix, &cl);
        }
        if (end == SIZE_MAX) goto fail;
        json_t *v = value_json(s + i, end, a.string, level + 1);
        if (!v || json_object_setn_new(obj, a.name.p ? a.name.p : "", a.name.len, v)) goto fail;
        i += end + cl;
    }
    ds4_strbuf_free(&a.name);
    return obj;
fail:
    ds4_strbuf_free(&a.name);
    json_decref(obj);
    return NULL;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_ws(**s)) (*s)++, (*n)--;
    while (*n && is_ws((*s)[*n - 1])) (*n)--;
}

/* JSON text for a complete value: a string (1), JSON (0; kept as a string
 * when it does not parse), or either nested parameters or a string (-1). */
static json_t *value_json(const char *s, size_t n, int string_kind, int level) {
    const char *t = s;
    size_t tn = n;
    trim(&t, &tn);
    if (string_kind == 0) {
        /* Integers too big for jansson are still numbers (as reals). */
        json_t *v = json_loadb(t, tn, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!v) v = json_loadb(t, tn, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL);
        if (v) return v;
    } else if (string_kind < 0) {
        size_t l;
        int k;
        if (tn && match_tag(t, tn, false, "parameter", -1, &l, &k) == YES) {
            json_t *v = parse_nested(t, tn, level);
            if (v) return v;
        }
    }
    ds4_strbuf b = {0};
    unescape_value(&b, s, n);
    json_t *v = b.failed ? NULL : json_stringn_nocheck(b.p ? b.p : "", b.len);
    ds4_strbuf_free(&b);
    return v;
}

/* ---- events and results ---- */

static void emit(ds4_dsml_parser *p, ds4_dsml_event_kind kind, const char *s, size_t n) {
    if (n == 0 && (kind == DS4_DSML_REASONING || kind == DS4_DSML_CONTENT || kind == DS4_DSML_CALL_ARGS)) return;
    switch (kind) {
    case DS4_DSML_REASONING: ds4_strbuf_append(&p->res.reasoning, s, n); break;
    case DS4_DSML_CONTENT: ds4_strbuf_append(&p->res.content, s, n); break;
    case DS4_DSML_CALL_ARGS: ds4_strbuf_append(&p->args, s, n); break;
    default: break;
    }
    if (p->fn) {
        ds4_dsml_event ev = {kind, (int)p->res.n_calls, s, n};
        p->fn(p->ctx, &ev);
    }
}

static void emit_args(ds4_dsml_parser *p, const char *s) { emit(p, DS4_DSML_CALL_ARGS, s, strlen(s)); }

static void emit_args_buf(ds4_dsml_parser *p, ds4_strbuf *b) {
    if (b->failed) p->oom = true;
    emit(p, DS4_DSML_CALL_ARGS, b->p ? b->p : "", b->len);
}

/* The pending text (never a null pointer, even before any input). */
static const char *pending(const ds4_dsml_parser *p) { return p->buf.p ? p->buf.p + p->pos : ""; }

/* Remove n bytes from the front of the pending text. */
static void consume(ds4_dsml_parser *p, size_t n) {
    if (p->raw_active) ds4_strbuf_append(&p->raw, pending(p), n);
    p->pos += n;
    p->offset += n;
}

static void set_state(ds4_dsml_parser *p, state st) {
    p->st = st;
    p->scan = 0;
}

static int malformed(ds4_dsml_parser *p, const char *what) {
    p->res.status = DS4_DSML_MALFORMED_CALLS;
    p->res.error_offset = p->offset;
    snprintf(p->res.error, sizeof(p->res.error), "malformed tool call block (started at byte %zu): %s at byte %zu",
             p->block_offset, what, p->offset);
    ds4_strbuf_append(&p->res.unparsed, p->raw.p ? p->raw.p : "", p->raw.len);
    ds4_strbuf_append(&p->res.unparsed, pending(p), p->buf.len - p->pos);
    p->offset += p->buf.len - p->pos;
    p->pos = p->buf.len;
    p->raw_active = false;
    set_state(p, S_ERROR);
    return 0;
}

static void start_call(ds4_dsml_parser *p, const ds4_strbuf *name) {
    ds4_strbuf_truncate(&p->name, 0);
    ds4_strbuf_append(&p->name, name->p ? name->p : "", name->len);
    ds4_strbuf_truncate(&p->args, 0);
    p->n_params = 0;
    emit(p, DS4_DSML_CALL_START, p->name.p ? p->name.p : "", p->name.len);
}

static void end_call(ds4_dsml_parser *p) {
    emit_args(p, p->n_params ? "}" : "{}");
    ds4_dsml_call *calls = realloc(p->res.calls, (p->res.n_calls + 1) * sizeof(*calls));
    char *name = malloc(p->name.len + 1), *args = malloc(p->args.len + 1);
    if (!calls || !name || !args || p->name.failed || p->args.failed) {
        if (calls) p->res.calls = calls;
        free(name);
        free(args);
        p->oom = true;
        return;
    }
    memcpy(name, p->name.p ? p->name.p : "", p->name.len);
    name[p->name.len] = '\0';
    memcpy(args, p->args.p ? p->args.p : "", p->args.len);
    args[p->args.len] = '\0';
    p->res.calls = calls;
    calls[p->res.n_calls] = (ds4_dsml_call){name, p->name.len, args, p->args.len};
    emit(p, DS4_DSML_CALL_END, args, p->args.len);
    p->res.n_calls++;
}

/* ---- states: each returns 1 after progress, 0 when it needs more text ---- */

static int step_reasoning(ds4_dsml_parser *p, const char *s, size_t n) {
    if (!p->think_checked) {
        int r = lit_match(s, n, THINK_OPEN);
        if (r == UNDECIDED && !p->final) return 0;
        p->think_checked = true;
        if (r == YES) consume(p, strlen(THINK_OPEN));
        return 1;
    }
    const char *end = memmem(s, n, THINK_CLOSE, strlen(THINK_CLOSE));
    if (end) {
        emit(p, DS4_DSML_REASONING, s, (size_t)(end - s));
        consume(p, (size_t)(end - s) + strlen(THINK_CLOSE));
        p->res.think_closed = true;
        emit(p, DS4_DSML_THINK_END, "", 0);
        set_state(p, S_CONTENT);
        return 1;
    }
    size_t hold = p->final ? 0 : partial_suffix(s, n, THINK_CLOSE);
    emit(p, DS4_DSML_REASONING, s, n - hold);
    consume(p, n - hold);
    return 0;
}

/* "<" + each of PREFIXES + "tool_calls>". */
const char *const DS4_DSML_BLOCK_OPENERS[] = {"<" DS4_DSML_MARKER "tool_calls>", "<DSML｜tool_calls>",
                                              "<|DSML|tool_calls>", "<tool_calls>", NULL};

/* Start of a tool-call block: YES (*len), UNDECIDED or NO. */
static int match_block_open(const char *s, size_t n, size_t *len) {
    int result = NO;
    for (int k = 0; DS4_DSML_BLOCK_OPENERS[k]; k++) {
        int r = lit_match(s, n, DS4_DSML_BLOCK_OPENERS[k]);
        if (r == YES) {
            *len = strlen(DS4_DSML_BLOCK_OPENERS[k]);
            return YES;
        }
        if (r == UNDECIDED) result = UNDECIDED;
    }
    return result;
}

static int step_content(ds4_dsml_parser *p, const char *s, size_t n) {
    if (!p->thinking && !p->think_checked) {
        /* A chat-mode answer that opens with <think> is reasoning after all. */
        int r = lit_match(s, n, THINK_OPEN);
        if (r == UNDECIDED && !p->final) return 0;
        p->think_checked = true;
        if (r == YES) {
            consume(p, strlen(THINK_OPEN));
            set_state(p, S_REASONING);
        }
        return 1;
    }
    if (p->after_block) {
        size_t w = 0;
        while (w < n && is_ws(s[w])) w++;
        consume(p, w);
        if (w == n) return 0;
        p->after_block = false;
        return 1;
    }
    size_t stop = n; /* where undecided text begins */
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '<') continue;
        size_t len = 0;
        int r = match_block_open(s + i, n - i, &len);
        if (r == UNDECIDED && !p->final) {
            stop = i;
            break;
        }
        if (r != YES) continue;
        size_t ws = i;
        while (ws > 0 && is_ws(s[ws - 1])) ws--;
        emit(p, DS4_DSML_CONTENT, s, ws);
        consume(p, ws);
        p->raw_active = true;
        p->block_offset = p->offset;
        consume(p, i - ws + len);
        set_state(p, S_BLOCK);
        return 1;
    }
    size_t e = stop;
    if (!p->final)
        while (e > 0 && is_ws(s[e - 1])) e--; /* white space may precede a block */
    emit(p, DS4_DSML_CONTENT, s, e);
    consume(p, e);
    return 0;
}

static size_t skip_ws(ds4_dsml_parser *p, const char *s, size_t n) {
    size_t w = 0;
    while (w < n && is_ws(s[w])) w++;
    consume(p, w);
    return w;
}

/* Attributes of an opening tag whose name ends at s[l]: as parse_attrs,
 * but a tag longer than MAX_TAG is malformed however the text arrives. */
static int tag_attrs(const char *s, size_t n, size_t l, attrs *a, size_t *al) {
    int ra = parse_attrs(s + l, n - l, a, al);
    if (ra == YES && l + *al > MAX_TAG) return NO;
    if (ra == UNDECIDED && n > MAX_TAG) return NO;
    return ra;
}

static int step_block(ds4_dsml_parser *p, const char *s, size_t n, attrs *a) {
    size_t w = skip_ws(p, s, n);
    s += w;
    n -= w;
    if (n == 0) return 0;
    size_t l, al;
    int prefix;
    int rc = match_tag(s, n, true, "tool_calls", -1, &l, &prefix);
    if (rc == YES) {
        consume(p, l);
        ds4_strbuf_append(&p->res.raw_calls, p->raw.p ? p->raw.p : "", p->raw.len);
        ds4_strbuf_truncate(&p->raw, 0);
        p->raw_active = false;
        p->after_block = true;
        p->blocks_closed++;
        set_state(p, S_CONTENT);
        return 1;
    }
    int ro = match_tag(s, n, false, "invoke", -1, &l, &prefix);
    if (ro == YES) {
        int ra = tag_attrs(s, n, l, a, &al);
        if (ra == UNDECIDED && !p->final) return 0;
        if (ra != YES) return malformed(p, "bad invoke tag");
        if (!a->has_name) return malformed(p, "invoke without a name");
        consume(p, l + al);
        start_call(p, &a->name);
        set_state(p, S_INVOKE);
        return 1;
    }
    if ((rc == UNDECIDED || ro == UNDECIDED) && !p->final) return 0;
    return malformed(p, "expected <｜DSML｜invoke or </｜DSML｜tool_calls>");
}

static int step_invoke(ds4_dsml_parser *p, const char *s, size_t n, attrs *a) {
    size_t w = skip_ws(p, s, n);
    s += w;
    n -= w;
    if (n == 0) return 0;
    size_t l, al;
    int prefix;
    int rp = match_tag(s, n, false, "parameter", -1, &l, &prefix);
    if (rp == YES) {
        int ra = tag_attrs(s, n, l, a, &al);
        if (ra == UNDECIDED && !p->final) return 0;
        if (ra != YES) return malformed(p, "bad parameter tag");
        if (!a->has_name) return malformed(p, "parameter without a name");
        consume(p, l + al);
        ds4_strbuf head = {0};
        ds4_strbuf_puts(&head, p->n_params ? ", " : "{");
        ds4_pyjson_string(&head, a->name.p ? a->name.p : "", a->name.len);
        ds4_strbuf_puts(&head, a->string > 0 ? ": \"" : ": ");
        emit_args_buf(p, &head);
        ds4_strbuf_free(&head);
        p->n_params++;
        p->prefix = prefix;
        p->depth = 1;
        set_state(p, a->string > 0 ? S_PARAM_STR : a->string == 0 ? S_PARAM_JSON : S_PARAM_RAW);
        return 1;
    }
    int ri = match_tag(s, n, true, "invoke", -1, &l, &prefix);
    if (ri == YES) {
        consume(p, l);
        end_call(p);
        set_state(p, S_BLOCK);
        return 1;
    }
    /* A missing </invoke>: the next invoke or the end of the block closes it. */
    int rb = match_tag(s, n, true, "tool_calls", -1, &l, &prefix);
    int rn = match_tag(s, n, false, "invoke", -1, &l, &prefix);
    if (rb == YES || rn == YES) {
        end_call(p);
        set_state(p, S_BLOCK);
        return 1;
    }
    if ((rp == UNDECIDED || ri == UNDECIDED || rb == UNDECIDED || rn == UNDECIDED) && !p->final) return 0;
    return malformed(p, "expected a parameter or </｜DSML｜invoke>");
}

/* Stream the decided part of a string value as JSON string content. */
static void emit_str_value(ds4_dsml_parser *p, const char *s, size_t n) {
    if (!n) return;
    ds4_strbuf plain = {0}, json = {0};
    unescape_value(&plain, s, n);
    ds4_pyjson_string(&json, plain.p ? plain.p : "", plain.len);
    /* Without the quotes pyjson_string adds. */
    if (json.failed || plain.failed) p->oom = true;
    else emit(p, DS4_DSML_CALL_ARGS, json.p + 1, json.len - 2);
    ds4_strbuf_free(&plain);
    ds4_strbuf_free(&json);
}

static int step_param_str(ds4_dsml_parser *p, const char *s, size_t n) {
    size_t cl;
    size_t c = find_closer(s, n, 0, p->prefix, &cl);
    if (c != SIZE_MAX) {
        emit_str_value(p, s, c);
        emit_args(p, "\"");
        consume(p, c + cl);
        set_state(p, S_INVOKE);
        return 1;
    }
    if (p->final) return 0;
    /* Hold back a possible closing tag or escape: only the last '<' or '&'
     * can start one (neither contains another). */
    size_t limit = n;
    const char *lt = memrchr(s, '<', n);
    if (lt) {
        size_t l;
        int k;
        if (match_tag(lt, n - (size_t)(lt - s), true, "parameter", p->prefix, &l, &k) == UNDECIDED)
            limit = (size_t)(lt - s);
    }
    const char *amp = memrchr(s, '&', n);
    if (amp && (size_t)(amp - s) < limit) {
        bool partial;
        escape_at(amp + 1, n - (size_t)(amp - s) - 1, &partial);
        if (partial) limit = (size_t)(amp - s);
    }
    emit_str_value(p, s, limit);
    consume(p, limit);
    return 0;
}

/* Emit a complete non-streamed value and return to the invoke. */
static int finish_value(ds4_dsml_parser *p, const char *s, size_t end, size_t closer_len, int string_kind) {
    const char *t = s;
    size_t tn = end;
    trim(&t, &tn);
    json_t *valid = string_kind == 0
                        ? json_loadb(t, tn, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL)
                        : NULL;
    ds4_strbuf out = {0};
    if (valid) {
        ds4_strbuf_append(&out, t, tn); /* the model's own JSON text */
    } else {
        json_t *v = value_json(s, end, string_kind, 0);
        if (!v) p->oom = true;
        else ds4_pyjson_dump(&out, v);
        json_decref(v);
    }
    json_decref(valid);
    emit_args_buf(p, &out);
    ds4_strbuf_free(&out);
    consume(p, end + closer_len);
    set_state(p, S_INVOKE);
    return 1;
}

static int step_param_json(ds4_dsml_parser *p, const char *s, size_t n) {
    size_t cl;
    size_t c = find_closer(s, n, p->scan, p->prefix, &cl);
    if (c == SIZE_MAX) {
        p->scan = n > 64 ? n - 64 : 0; /* a closing tag is shorter than 64 bytes */
        return 0;
    }
    return finish_value(p, s, c, cl, 0);
}

static int step_param_raw(ds4_dsml_parser *p, const char *s, size_t n) {
    size_t cl;
    size_t c = find_raw_end(s, n, &p->scan, &p->depth, p->final, &cl);
    if (c == SIZE_MAX) return 0;
    return finish_value(p, s, c, cl, -1);
}

static void run(ds4_dsml_parser *p) {
    attrs a = {0};
    for (;;) {
        const char *s = pending(p);
        size_t n = p->buf.len - p->pos;
        int progress = 0;
        switch (p->st) {
        case S_REASONING: progress = step_reasoning(p, s, n); break;
        case S_CONTENT: progress = step_content(p, s, n); break;
        case S_BLOCK: progress = step_block(p, s, n, &a); break;
        case S_INVOKE: progress = step_invoke(p, s, n, &a); break;
        case S_PARAM_STR: progress = step_param_str(p, s, n); break;
        case S_PARAM_JSON: progress = step_param_json(p, s, n); break;
        case S_PARAM_RAW: progress = step_param_raw(p, s, n); break;
        case S_ERROR: break;
        }
        if (!progress) break;
    }
    if (a.name.failed) p->oom = true;
    ds4_strbuf_free(&a.name);
    /* Drop consumed text once it dominates the buffer. */
    if (p->pos > 4096 && p->pos * 2 > p->buf.len) {
        memmove(p->buf.p, p->buf.p + p->pos, p->buf.len - p->pos);
        ds4_strbuf_truncate(&p->buf, p->buf.len - p->pos);
        p->pos = 0;
    }
}

ds4_dsml_parser *ds4_dsml_parser_new(bool thinking, ds4_dsml_event_fn fn, void *ctx, ds4_err *err) {
    ds4_dsml_parser *p = calloc(1, sizeof(*p));
    if (!p) {
        ds4_err_set(err, DS4_ENOMEM, "DSML parser: out of memory");
        return NULL;
    }
    p->thinking = thinking;
    p->st = thinking ? S_REASONING : S_CONTENT;
    p->fn = fn;
    p->ctx = ctx;
    return p;
}

static bool any_failed(const ds4_dsml_parser *p) {
    return p->oom || p->buf.failed || p->raw.failed || p->name.failed || p->args.failed || p->res.reasoning.failed ||
           p->res.content.failed || p->res.raw_calls.failed || p->res.unparsed.failed;
}

int ds4_dsml_feed(ds4_dsml_parser *p, const char *text, size_t n, ds4_err *err) {
    if (p->final) return ds4_err_set(err, DS4_EINVAL, "DSML parser: feed after finish");
    if (p->st == S_ERROR) {
        ds4_strbuf_append(&p->res.unparsed, text, n);
        p->offset += n;
    } else {
        ds4_strbuf_append(&p->buf, text, n);
        run(p);
    }
    if (any_failed(p)) return ds4_err_set(err, DS4_ENOMEM, "DSML parser: out of memory");
    return 0;
}

int ds4_dsml_finish(ds4_dsml_parser *p, ds4_err *err) {
    if (!p->final) {
        p->final = true;
        if (p->st != S_ERROR) run(p);
    }
    if (any_failed(p)) return ds4_err_set(err, DS4_ENOMEM, "DSML parser: out of memory");
    switch (p->st) {
    case S_REASONING: p->res.status = DS4_DSML_UNTERMINATED_REASONING; return 0;
    case S_CONTENT: return 0;
    case S_ERROR: return ds4_err_set(err, DS4_EFORMAT, "%s", p->res.error);
    default:
        p->res.status = DS4_DSML_UNTERMINATED_CALLS;
        p->res.error_offset = p->offset;
        snprintf(p->res.error, sizeof(p->res.error), "unterminated tool call block (started at byte %zu)",
                 p->block_offset);
        ds4_strbuf_append(&p->res.unparsed, p->raw.p ? p->raw.p : "", p->raw.len);
        ds4_strbuf_append(&p->res.unparsed, pending(p), p->buf.len - p->pos);
        p->pos = p->buf.len;
        return ds4_err_set(err, DS4_EFORMAT, "%s", p->res.error);
    }
}

int ds4_dsml_finish_cut(ds4_dsml_parser *p, ds4_err *err) {
    if (any_failed(p)) return ds4_err_set(err, DS4_ENOMEM, "DSML parser: out of memory");
    p->final = true;
    switch (p->st) {
    case S_REASONING: p->res.status = DS4_DSML_UNTERMINATED_REASONING; break;
    case S_CONTENT:
    case S_ERROR: break;
    default:
        p->res.status = DS4_DSML_UNTERMINATED_CALLS;
        p->raw_active = false;
        break;
    }
    p->offset += p->buf.len - p->pos;
    p->pos = p->buf.len;
    return 0;
}

void ds4_dsml_result_free(ds4_dsml_result *r) {
    ds4_strbuf_free(&r->reasoning);
    ds4_strbuf_free(&r->content);
    ds4_strbuf_free(&r->raw_calls);
    ds4_strbuf_free(&r->unparsed);
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    memset(r, 0, sizeof(*r));
}

void ds4_dsml_parser_free(ds4_dsml_parser *p) {
    if (!p) return;
    ds4_dsml_result_free(&p->res);
    ds4_strbuf_free(&p->buf);
    ds4_strbuf_free(&p->raw);
    ds4_strbuf_free(&p->name);
    ds4_strbuf_free(&p->args);
    free(p);
}

int ds4_dsml_parse(const char *text, size_t n, bool thinking, ds4_dsml_result *out, ds4_err *err) {
    memset(out, 0, sizeof(*out));
    size_t eos = strlen(EOS_TEXT);
    if (n >= eos && memcmp(text + n - eos, EOS_TEXT, eos) == 0) n -= eos;
    ds4_dsml_parser *p = ds4_dsml_parser_new(thinking, NULL, NULL, err);
    if (!p) return -1;
    int rc = ds4_dsml_feed(p, text, n, err);
    if (rc == 0) rc = ds4_dsml_finish(p, err);
    *out = p->res;
    memset(&p->res, 0, sizeof(p->res));
    ds4_dsml_parser_free(p);
    return rc;
}
