/*
 * tokenizer.c - the tokenizer entry points and the detokenizers (see
 * tokenizer.h).  Pre-tokenization lives in pretok.c, merging in bpe.c.
 */
#include "text/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "text/bpe.h"
#include "text/pretok.h"
#include "text/utf8.h"

struct ds4_tokenizer {
    const ds4_vocab *v;
    ds4_pretok *pre;
    ds4_bpe *bpe;
    size_t limit; /* 0: none */
};

/* A piece callback's answer when the limit is reached. */
#define OVER_LIMIT 2

ds4_tokenizer *ds4_tokenizer_new(const ds4_vocab *v, ds4_err *err) {
    ds4_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) {
        ds4_err_set(err, DS4_ENOMEM, "tokenizer: out of memory");
        return NULL;
    }
    t->v = v;
    t->pre = ds4_pretok_new(err);
    if (t->pre) t->bpe = ds4_bpe_new(v, err);
    if (!t->bpe) {
        ds4_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void ds4_tokenizer_free(ds4_tokenizer *t) {
    if (!t) return;
    ds4_pretok_free(t->pre);
    ds4_bpe_free(t->bpe);
    free(t);
}

const ds4_vocab *ds4_tokenizer_vocab(const ds4_tokenizer *t) { return t->v; }

void ds4_tokenizer_set_limit(ds4_tokenizer *t, size_t max_tokens) { t->limit = max_tokens; }

typedef struct piece_ctx {
    ds4_bpe *bpe;
    ds4_tokens *out;
    size_t limit;
} piece_ctx;

static int on_piece(void *vctx, const char *s, size_t n) {
    piece_ctx *c = vctx;
    if (ds4_bpe_piece(c->bpe, s, n, c->out)) return -1;
    return c->limit && c->out->n > c->limit ? OVER_LIMIT : 0;
}

static int over_limit(const ds4_tokenizer *t, ds4_err *err) {
    return ds4_err_set(err, DS4_ERANGE, "more than %zu tokens", t->limit);
}

static int out_of_memory(ds4_tokens *out, ds4_err *err) {
    (void)out;
    return ds4_err_set(err, DS4_ENOMEM, "tokenizing: out of memory");
}

/* Plain text without the final allocation check (shared by all modes). */
static int tokenize_plain(ds4_tokenizer *t, const char *s, size_t n, ds4_tokens *out, ds4_err *err) {
    piece_ctx c = {t->bpe, out, t->limit};
    size_t pos = 0;
    while (pos < n) {
        size_t valid = ds4_utf8_valid_prefix((const uint8_t *)s + pos, n - pos);
        if (valid) {
            int rc = ds4_pretok_split(t->pre, s + pos, valid, on_piece, &c, err);
            if (rc == OVER_LIMIT) return over_limit(t, err);
            if (rc > 0 || (rc < 0 && out->failed)) return out_of_memory(out, err);
            if (rc < 0) return ds4_err_prefix(err, "tokenizing at byte %zu", pos);
            pos += valid;
        }
        /* Bytes that start no valid character: one piece each. */
        while (pos < n) {
            uint32_t cp;
            if (ds4_utf8_decode((const uint8_t *)s + pos, n - pos, &cp)) break;
            if (ds4_bpe_piece(t->bpe, s + pos, 1, out)) return out_of_memory(out, err);
            if (t->limit && out->n > t->limit) return over_limit(t, err);
            pos++;
        }
    }
    return 0;
}

int ds4_tokenize_text(ds4_tokenizer *t, const char *s, size_t n, ds4_tokens *out, ds4_err *err) {
    if (tokenize_plain(t, s, n, out, err)) return -1;
    return out->failed ? out_of_memory(out, err) : 0;
}

/* Tokenize the trusted range s[0..n): added tokens found in it are pushed
 * as ids, the text between them is appended to the pending plain run that
 * starts at `*run` (a pointer into the same buffer), flushed before each
 * added token.  Plain text across segment boundaries thus tokenizes as one
 * piece of text, exactly as if the whole prompt were one string. */
static int trusted_range(ds4_tokenizer *t, const char *s, size_t n, const char **run, ds4_tokens *out, ds4_err *err) {
    for (size_t i = 0; i < n; i++) {
        if (!ds4_vocab_added_first_byte(t->v, (uint8_t)s[i])) continue;
        size_t len;
        int32_t id = ds4_vocab_match_added(t->v, s + i, n - i, &len);
        if (id < 0) continue;
        if (tokenize_plain(t, *run, (size_t)(s + i - *run), out, err)) return -1;
        ds4_tokens_push(out, id);
        i += len - 1;
        *run = s + i + 1;
    }
    return 0;
}

int ds4_tokenize_transcript(ds4_tokenizer *t, const char *s, size_t n, ds4_tokens *out, ds4_err *err) {
    const char *run = s;
    if (trusted_range(t, s, n, &run, out, err) || tokenize_plain(t, run, (size_t)(s + n - run), out, err)) return -1;
    return out->failed ? out_of_memory(out, err) : 0;
}

int ds4_tokenize_segments(ds4_tokenizer *t, const char *text, const ds4_segment *segs, size_t n_segs, ds4_tokens *out,
                          ds4_err *err) {
    size_t end = n_segs ? segs[0].off : 0;
    const char *run = text + end;
    for (size_t i = 0; i < n_segs; i++) {
        const char *s = text + segs[i].off;
        size_t n = segs[i].len;
        if (segs[i].off != end)
            return ds4_err_set(err, DS4_EINVAL,
                               "segment %zu starts at byte %zu, expected %zu (segments must be contiguous)", i,
                               segs[i].off, end);
        end += n;
        switch (segs[i].kind) {
        case DS4_SEG_TEXT: break;
        case DS4_SEG_TRUSTED:
            if (trusted_range(t, s, n, &run, out, err)) return -1;
            break;
        case DS4_SEG_SPECIAL: {
            int32_t id = ds4_vocab_find_added(t->v, s, n);
            if (id < 0)
                return ds4_err_set(err, DS4_ENOTFOUND,
                                   "segment %zu: \"%.*s\" is not a special token of this vocabulary", i,
                                   (int)(n > 80 ? 80 : n), s);
            if (tokenize_plain(t, run, (size_t)(s - run), out, err)) return -1;
            ds4_tokens_push(out, id);
            run = s + n;
            break;
        }
        default: return ds4_err_set(err, DS4_EINVAL, "segment %zu: unknown kind %d", i, (int)segs[i].kind);
        }
    }
    if (tokenize_plain(t, run, (size_t)(text + end - run), out, err)) return -1;
    return out->failed ? out_of_memory(out, err) : 0;
}

static int check_id(const ds4_vocab *v, int32_t id, size_t where, ds4_err *err) {
    if (id >= 0 && (uint32_t)id < ds4_vocab_size(v)) return 0;
    return ds4_err_set(err, DS4_ERANGE, "token %zu: id %d outside a vocabulary of %u tokens", where, id,
                       ds4_vocab_size(v));
}

int ds4_detokenize(const ds4_vocab *v, const int32_t *ids, size_t n, ds4_strbuf *out, ds4_err *err) {
    for (size_t i = 0; i < n; i++) {
        if (check_id(v, ids[i], i, err)) return -1;
        ds4_str b = ds4_vocab_token_bytes(v, ids[i]);
        ds4_strbuf_append(out, b.ptr, b.len);
    }
    return ds4_strbuf_check(out, "detokenizing", err);
}

void ds4_detok_stream_init(ds4_detok_stream *s, const ds4_vocab *v, bool lossy) {
    memset(s, 0, sizeof(*s));
    s->v = v;
    s->lossy = lossy;
}

static const char REPLACEMENT[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Emit p[0..n) where the first k bytes are an ill-formed subpart. */
static void emit_invalid(ds4_detok_stream *s, const uint8_t *p, size_t k, ds4_strbuf *out) {
    if (s->lossy) ds4_strbuf_append(out, REPLACEMENT, sizeof(REPLACEMENT));
    else ds4_strbuf_append(out, p, k);
}

/* Emit the whole characters of p[0..n), invalid subparts as configured;
 * returns how many trailing bytes were held back (an incomplete start of a
 * character), unless `final`, which flushes them too. */
static size_t emit_chars(ds4_detok_stream *s, const uint8_t *p, size_t n, bool final, ds4_strbuf *out) {
    size_t i = 0;
    while (i < n) {
        size_t valid = ds4_utf8_valid_prefix(p + i, n - i);
        ds4_strbuf_append(out, p + i, valid);
        i += valid;
        if (i == n) break;
        int tail = ds4_utf8_incomplete_tail(p + i, n - i);
        if (!final && (size_t)tail == n - i) return n - i;
        size_t k = (size_t)ds4_utf8_invalid_len(p + i, n - i);
        emit_invalid(s, p + i, k, out);
        i += k;
    }
    return 0;
}

void ds4_detok_stream_bytes(ds4_detok_stream *s, const char *bytes, size_t n, ds4_strbuf *out) {
    /* Complete the held character first, using as few new bytes as needed. */
    size_t used = 0;
    while (s->npend && used < n) {
        s->pend[s->npend++] = (uint8_t)bytes[used++];
        size_t held = emit_chars(s, s->pend, (size_t)s->npend, false, out);
        if (held) {
            memmove(s->pend, s->pend + s->npend - held, held);
            s->npend = (int)held;
        } else {
            s->npend = 0;
        }
    }
    if (used == n) return;
    size_t held = emit_chars(s, (const uint8_t *)bytes + used, n - used, false, out);
    memcpy(s->pend, bytes + n - held, held);
    s->npend = (int)held;
}

int ds4_detok_stream_push(ds4_detok_stream *s, int32_t id, ds4_strbuf *out, ds4_err *err) {
    if (check_id(s->v, id, 0, err)) return -1;
    ds4_str b = ds4_vocab_token_bytes(s->v, id);
    ds4_detok_stream_bytes(s, b.ptr, b.len, out);
    return ds4_strbuf_check(out, "detokenizing", err);
}

void ds4_detok_stream_finish(ds4_detok_stream *s, ds4_strbuf *out) {
    emit_chars(s, s->pend, (size_t)s->npend, true, out);
    s->npend = 0;
}
