/*
 * output.c - turning generated tokens into an API answer, in the worker:
 * lossy streaming detokenization (no broken UTF-8), the DSML parser
 * (reasoning, content, tool calls: docs/MODEL.md 11.5), stop sequences
 * (held back while they may still match), tool-call ids, and the events
 * each adapter turns into SSE bytes.  The token callback also tells the
 * generation loop to sample greedily inside DSML markup and to stop once a
 * tool-call block has closed.
 */
#include <stdlib.h>
#include <string.h>

#include "output.h"

/* ------------------------------------------------------- stop sequences */

/* Longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t stop_hold(const srv_request *r, const char *s, size_t n) {
    size_t hold = 0;
    for (int k = 0; k < r->n_stop; k++) {
        size_t l = strlen(r->stop[k]);
        for (size_t h = l - 1 < n ? l - 1 : n; h > hold; h--)
            if (memcmp(s + n - h, r->stop[k], h) == 0) {
                hold = h;
                break;
            }
    }
    return hold;
}

static void emit(out_ctx *g, ev_kind k, int index, const char *s, size_t n) {
    if (g->j->req.stream) g->j->api->stream_event(g->j, k, index, s, n, &g->sse);
}

/* Visible text through the stop filter. */
static void content_piece(out_ctx *g, const char *s, size_t n, bool final) {
    if (g->stopped) return;
    gen_out *o = &g->j->out;
    const srv_request *r = &g->j->req;
    ds4_strbuf_append(&g->pending, s, n);
    const char *p = g->pending.p ? g->pending.p : "";
    size_t len = g->pending.len, cut = len, skip = 0;
    for (int k = 0; k < r->n_stop; k++) {
        const char *hit = memmem(p, len, r->stop[k], strlen(r->stop[k]));
        if (hit && (size_t)(hit - p) < cut) {
            cut = (size_t)(hit - p);
            o->stop_hit = r->stop[k];
        }
    }
    if (o->stop_hit) {
        g->stopped = true;
        skip = len;
    } else if (!final) {
        cut = len - stop_hold(r, p, len);
        skip = cut;
    } else {
        skip = len;
    }
    if (cut) {
        ds4_strbuf_append(&o->content, p, cut);
        emit(g, EV_CONTENT, 0, p, cut);
    }
    if (len > skip) memmove(g->pending.p, p + skip, len - skip);
    ds4_strbuf_truncate(&g->pending, len - skip);
}

static void on_dsml(void *ctx, const ds4_dsml_event *ev) {
    out_ctx *g = ctx;
    gen_out *o = &g->j->out;
    if (g->stopped) return;
    switch (ev->kind) {
    case DS4_DSML_REASONING:
        ds4_strbuf_append(&o->reasoning, ev->text, ev->len);
        emit(g, EV_REASONING, 0, ev->text, ev->len);
        break;
    case DS4_DSML_THINK_END:
        o->think_closed = true;
        emit(g, EV_THINK_END, 0, "", 0);
        break;
    case DS4_DSML_CONTENT: content_piece(g, ev->text, ev->len, false); break;
    case DS4_DSML_CALL_START: {
        content_piece(g, "", 0, true); /* text before the block is final */
        gen_call *c = realloc(o->calls, (o->n_calls + 1) * sizeof(*c));
        if (!c) return;
        o->calls = c;
        c = &o->calls[o->n_calls];
        memset(c, 0, sizeof(*c));
        random_id(c->id, sizeof(c->id), g->j->api->kind == API_MESSAGES ? "toolu_" : "call_", 32);
        c->name = strndup(ev->text, ev->len);
        o->n_calls++;
        emit(g, EV_CALL_START, (int)o->n_calls - 1, ev->text, ev->len);
        break;
    }
    case DS4_DSML_CALL_ARGS:
        if (!o->n_calls) return;
        ds4_strbuf_append(&o->calls[o->n_calls - 1].args, ev->text, ev->len);
        emit(g, EV_CALL_ARGS, (int)o->n_calls - 1, ev->text, ev->len);
        break;
    case DS4_DSML_CALL_END:
        if (o->n_calls) emit(g, EV_CALL_END, (int)o->n_calls - 1, "", 0);
        break;
    }
}

int out_init(out_ctx *g, job *j, const ds4_vocab *v, bool thinking, ds4_err *err) {
    memset(g, 0, sizeof(*g));
    g->j = j;
    g->eos = ds4_vocab_eos(v);
    ds4_detok_stream_init(&g->detok, v, true);
    if (!j->req.raw_text && !(g->parser = ds4_dsml_parser_new(thinking, on_dsml, g, err))) return -1;
    return 0;
}

void out_free(out_ctx *g) {
    ds4_dsml_parser_free(g->parser);
    ds4_strbuf_free(&g->pending);
    ds4_strbuf_free(&g->sse);
    ds4_strbuf_free(&g->piece);
}

void out_flush(out_ctx *g) {
    if (!g->sse.len) return;
    job_push(g->j, &g->sse);
    ds4_strbuf_truncate(&g->sse, 0);
}

static void feed_text(out_ctx *g, const char *s, size_t n) {
    gen_out *o = &g->j->out;
    ds4_strbuf_append(&o->raw, s, n);
    if (g->parser) {
        if (ds4_dsml_feed(g->parser, s, n, NULL) != 0) g->stopped = true;
    } else {
        content_piece(g, s, n, false);
    }
}

void out_token(out_ctx *g, int32_t tok, ds4_gen_control *ctl) {
    if (tok == g->eos) return;
    ds4_strbuf_truncate(&g->piece, 0);
    ds4_detok_stream_push(&g->detok, tok, &g->piece, NULL);
    if (g->piece.len) feed_text(g, g->piece.p, g->piece.len);
    if (g->parser) {
        if (ds4_dsml_blocks_closed(g->parser) > 0) {
            g->tool_stop = true;
            ctl->stop = true;
        }
        ctl->greedy_next = ds4_dsml_position_of(g->parser) == DS4_DSML_AT_MARKUP;
    }
    if (g->stopped) ctl->stop = true;
    out_flush(g);
}

bool out_in_tool_block(const out_ctx *g) {
    return g->parser && ds4_dsml_position_of(g->parser) != DS4_DSML_AT_TEXT;
}

void out_finish(out_ctx *g, ds4_finish finish) {
    gen_out *o = &g->j->out;
    ds4_strbuf_truncate(&g->piece, 0);
    ds4_detok_stream_finish(&g->detok, &g->piece);
    if (g->piece.len) feed_text(g, g->piece.p, g->piece.len);
    bool bad_block = false;
    if (g->parser) {
        ds4_err err = {0};
        if (ds4_dsml_finish(g->parser, &err) != 0) {
            const ds4_dsml_result *r = ds4_dsml_result_of(g->parser);
            if (o->n_calls == 0 && !g->stopped) {
                /* Nothing was announced as a call: the text stays text. */
                srv_log("tool", "invalid tool call returned as assistant text: %s", err.msg);
                content_piece(g, r->unparsed.p ? r->unparsed.p : "", r->unparsed.len, false);
            } else {
                bad_block = true;
                snprintf(o->error, sizeof(o->error), "%s", err.msg);
            }
        }
    }
    content_piece(g, "", 0, true);
    if (finish == DS4_FINISH_CANCELLED || finish == DS4_FINISH_ERROR || bad_block) o->finish = "error";
    else if (g->tool_stop || (o->n_calls && finish == DS4_FINISH_EOS)) o->finish = "tool_calls";
    else if (finish == DS4_FINISH_LENGTH) o->finish = "length";
    else o->finish = "stop";
    if (bad_block && !o->error[0]) snprintf(o->error, sizeof(o->error), "unterminated tool call");
}

const char *out_raw_calls(const out_ctx *g, size_t *n) {
    const ds4_dsml_result *r = g->parser ? ds4_dsml_result_of(g->parser) : NULL;
    *n = r ? r->raw_calls.len : 0;
    return r && r->raw_calls.p ? r->raw_calls.p : "";
}
