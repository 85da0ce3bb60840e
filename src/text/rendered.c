/*
 * rendered.c - building a rendered prompt (see rendered.h).
 */
#include "text/rendered.h"

#include <stdlib.h>
#include <string.h>

/* Append s to the text as a segment of `kind`, extending the previous
 * segment when it has the same kind (a SPECIAL never extends). */
static void add(ds4_rendered *r, ds4_seg_kind kind, const char *s, size_t n) {
    if (r->failed) return;
    if (n == 0) return;
    size_t off = r->text.len;
    ds4_strbuf_append(&r->text, s, n);
    if (r->text.failed) {
        r->failed = true;
        return;
    }
    if (kind != DS4_SEG_SPECIAL && r->n_segs && r->segs[r->n_segs - 1].kind == kind) {
        r->segs[r->n_segs - 1].len += n;
        return;
    }
    if (r->n_segs == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 32;
        ds4_segment *p = realloc(r->segs, cap * sizeof(*p));
        if (!p) {
            r->failed = true;
            return;
        }
        r->segs = p;
        r->cap = cap;
    }
    r->segs[r->n_segs++] = (ds4_segment){kind, off, n};
}

void ds4_rendered_text(ds4_rendered *r, const char *s, size_t n) { add(r, DS4_SEG_TEXT, s, n); }
void ds4_rendered_puts(ds4_rendered *r, const char *s) { add(r, DS4_SEG_TEXT, s, strlen(s)); }
void ds4_rendered_special(ds4_rendered *r, const char *token) { add(r, DS4_SEG_SPECIAL, token, strlen(token)); }
void ds4_rendered_trusted(ds4_rendered *r, const char *s, size_t n) { add(r, DS4_SEG_TRUSTED, s, n); }

void ds4_rendered_template(ds4_rendered *r, const char *s, const char *const *specials) {
    const char *p = s;
    while (*p) {
        /* Earliest special spelling in the rest of the template. */
        const char *best = NULL, *best_tok = NULL;
        for (const char *const *sp = specials; *sp; sp++) {
            const char *hit = strstr(p, *sp);
            if (hit && (!best || hit < best || (hit == best && strlen(*sp) > strlen(best_tok)))) {
                best = hit;
                best_tok = *sp;
            }
        }
        if (!best) {
            ds4_rendered_puts(r, p);
            return;
        }
        ds4_rendered_text(r, p, (size_t)(best - p));
        ds4_rendered_special(r, best_tok);
        p = best + strlen(best_tok);
    }
}

int ds4_rendered_check(const ds4_rendered *r, ds4_err *err) {
    if (r->failed || r->text.failed) return ds4_err_set(err, DS4_ENOMEM, "rendering prompt: out of memory");
    return 0;
}

void ds4_rendered_free(ds4_rendered *r) {
    ds4_strbuf_free(&r->text);
    free(r->segs);
    memset(r, 0, sizeof(*r));
}

int ds4_tokenize_rendered(ds4_tokenizer *t, const ds4_rendered *r, ds4_tokens *out, ds4_err *err) {
    if (ds4_rendered_check(r, err)) return -1;
    return ds4_tokenize_segments(t, r->text.p ? r->text.p : "", r->segs, r->n_segs, out, err);
}

int ds4_tokenize_rendered_from(ds4_tokenizer *t, const ds4_rendered *r, size_t off, ds4_tokens *out, ds4_err *err) {
    if (ds4_rendered_check(r, err)) return -1;
    if (off > r->text.len)
        return ds4_err_set(err, DS4_EINVAL, "offset %zu is past the rendered text (%zu bytes)", off, r->text.len);
    size_t first = 0;
    while (first < r->n_segs && r->segs[first].off + r->segs[first].len <= off) first++;
    if (first == r->n_segs) return 0;
    ds4_segment *segs = malloc((r->n_segs - first) * sizeof(*segs));
    if (!segs) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = first; i < r->n_segs; i++) {
        ds4_segment s = r->segs[i];
        if (s.off < off) {
            if (s.kind == DS4_SEG_SPECIAL) {
                free(segs);
                return ds4_err_set(err, DS4_EINVAL, "offset %zu falls inside a special token", off);
            }
            s.len -= off - s.off;
            s.off = off;
        }
        s.off -= off;
        segs[n++] = s;
    }
    int rc = ds4_tokenize_segments(t, r->text.p + off, segs, n, out, err);
    free(segs);
    return rc;
}
