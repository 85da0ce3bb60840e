/*
 * output.c - turning generated tokens into an API answer, in the worker:
 * lossy streaming detokenization (no broken UTF-8), the DSML parser
 * (reasoning, content, tool calls: docs/MODEL.md 11.5), stop sequences
 * (held back while they may still match), tool-call ids, and the events
 * each adapter turns into SSE bytes.  The token callback also tells the
 * generation loop to sample greedily inside DSML markup and to stop once a
 * tool-call block has closed.
 *
 * A tool call is answered (streamed) once its invoke is complete, so that
 * an answer cut by max_tokens never carries a partial call: the cut drops
 * the call in progress and any text that may be the start of markup, and
 * finishes "length".  With parallel_tool_calls false, calls after the
 * first are dropped (the constraint closes the block after it anyway).
 *
 * The answer proper starts after "</think>" (at once without thinking):
 * there the sampler takes the client's settings (while thinking it used
 * ds4's defaults, unless --client-sampling-in-thinking) and the answer's
 * constraint starts (constrain.h).  logprobs are recorded for the tokens
 * of the visible answer.
 */
#include <stdlib.h>
#include <string.h>

#include "output.h"
#include "text/dsml_render.h"

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

/* The answer proper begins: the client's sampling settings, the
 * constraint. */
static void answer_begins(out_ctx *g) {
    if (g->switch_sp && g->smp) {
        g->smp->p = g->answer_sp;
        if (g->smp->p.top_k > DS4_TOP_K_MAX) g->smp->p.top_k = DS4_TOP_K_MAX;
        g->switch_sp = false;
    }
    g->cons_on = true;
}

/* The first call is complete and only one is wanted: the block closes. */
static void close_block_next(out_ctx *g) {
    static const char *const close[] = {"\n</" DS4_DSML_MARKER "tool_calls>", "</" DS4_DSML_MARKER "tool_calls>"};
    if (!g->cons) return;
    constraint_set_json(g->cons, NULL);
    constraint_set_forbid_blocks(g->cons, false);
    constraint_set_prefix(g->cons, close, 2, true);
    g->cons_on = true;
}

static void call_end(out_ctx *g) {
    gen_out *o = &g->j->out;
    if (!o->n_calls) return;
    gen_call *c = &o->calls[o->n_calls - 1];
    if (g->j->req.serial_calls && o->n_calls > 1) {
        srv_log("tool", "%s: dropped tool call \"%s\" after the first (parallel_tool_calls is false)", g->j->id,
                c->name);
        free(c->name);
        ds4_strbuf_free(&c->args);
        o->n_calls--;
        return;
    }
    c->complete = true;
    int i = (int)o->n_calls - 1;
    emit(g, EV_CALL_START, i, c->name, strlen(c->name));
    emit(g, EV_CALL_ARGS, i, c->args.p ? c->args.p : "", c->args.len);
    emit(g, EV_CALL_END, i, "", 0);
    if (g->j->req.serial_calls) close_block_next(g);
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
        g->in_reasoning = false;
        emit(g, EV_THINK_END, 0, "", 0);
        answer_begins(g);
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
        break;
    }
    case DS4_DSML_CALL_ARGS:
        if (o->n_calls) ds4_strbuf_append(&o->calls[o->n_calls - 1].args, ev->text, ev->len);
        break;
    case DS4_DSML_CALL_END: call_end(g); break;
    }
}

int out_init(out_ctx *g, job *j, const ds4_vocab *v, bool thinking, ds4_err *err) {
    memset(g, 0, sizeof(*g));
    g->j = j;
    g->eos = ds4_vocab_eos(v);
    g->in_reasoning = thinking;
    g->cons_on = !thinking;
    j->out.vocab = v;
    ds4_detok_stream_init(&g->detok, v, true);
    if (!j->req.raw_text && !(g->parser = ds4_dsml_parser_new(thinking, on_dsml, g, err))) return -1;
    return 0;
}

void out_restrict(void *ctx, float *logits, int n_vocab) {
    out_ctx *g = ctx;
    if (g->cons && g->cons_on) constraint_mask(g->cons, logits, n_vocab);
}

/* The tool-call block's opening and the invoke of `name`, as the model
 * writes them. */
static char *invoke_prefix(const char *name, size_t n) {
    ds4_strbuf b = {0};
    ds4_strbuf_puts(&b, "\n\n<" DS4_DSML_MARKER "tool_calls>\n<" DS4_DSML_MARKER "invoke name=\"");
    ds4_dsml_escape_name(&b, name, n);
    ds4_strbuf_puts(&b, "\">");
    if (b.failed) {
        ds4_strbuf_free(&b);
        return NULL;
    }
    return b.p;
}

/* tool_choice required / named: the answer starts with a call of an
 * allowed tool. */
static int require_call(out_ctx *g) {
    const srv_request *r = &g->j->req;
    size_t n = 0, cap = json_array_size(r->tools);
    char **alts = calloc(cap ? cap : 1, sizeof(*alts));
    if (!alts) return -1;
    int rc = 0;
    for (size_t i = 0; i < cap && rc == 0; i++) {
        const json_t *name = json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name");
        if (!json_is_string(name)) continue;
        if (r->tool_choice == TOOL_NAMED && strcmp(json_string_value(name), r->tool_name) != 0) continue;
        if (!(alts[n++] = invoke_prefix(json_string_value(name), json_string_length(name)))) rc = -1;
    }
    if (rc == 0) rc = constraint_set_prefix(g->cons, (const char *const *)alts, n, false);
    for (size_t i = 0; i < n; i++) free(alts[i]);
    free(alts);
    return rc;
}

int out_constrain(out_ctx *g, const cvocab *cv, ds4_err *err) {
    static const char *const block_start[] = {"<" DS4_DSML_MARKER "tool_calls>", "\n\n<" DS4_DSML_MARKER "tool_calls>"};
    const srv_request *r = &g->j->req;
    bool tools = json_array_size(r->tools) > 0;
    bool forced = tools && (r->tool_choice == TOOL_REQUIRED || r->tool_choice == TOOL_NAMED);
    if (!cv || !g->parser || !(r->schema || r->tool_choice == TOOL_NONE || forced || (tools && r->serial_calls)))
        return 0;
    if (!(g->cons = constraint_new(cv, err))) return -1;
    if (forced) {
        if (require_call(g) != 0) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return 0;
    }
    if (r->schema) constraint_set_json(g->cons, r->schema);
    if (r->schema && tools && constraint_set_prefix(g->cons, block_start, 2, false) != 0)
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (r->tool_choice == TOOL_NONE) constraint_set_forbid_blocks(g->cons, true);
    return 0;
}

void out_free(out_ctx *g) {
    constraint_free(g->cons);
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

/* The output stands in the visible answer's text (not reasoning, not a
 * tool-call block). */
static bool in_answer_text(const out_ctx *g) {
    return !g->parser || (!g->in_reasoning && ds4_dsml_position_of(g->parser) == DS4_DSML_AT_TEXT);
}

static void record_logprob(out_ctx *g, int32_t tok, const float *logits, int n_vocab) {
    gen_out *o = &g->j->out;
    if (o->n_lp == g->lp_cap) {
        size_t cap = g->lp_cap ? 2 * g->lp_cap : 64;
        tok_logprob *p = realloc(o->lp, cap * sizeof(*p));
        if (!p) return;
        o->lp = p;
        g->lp_cap = cap;
    }
    tok_logprob *e = &o->lp[o->n_lp++];
    e->id = tok;
    e->logprob = (float)ds4_logprob_of(logits, n_vocab, tok);
    int k = g->j->req.logprobs > MAX_TOP_LOGPROBS ? MAX_TOP_LOGPROBS : g->j->req.logprobs;
    e->n_top = k > 0 ? ds4_top_logprobs(logits, n_vocab, k, e->top_id, e->top_lp) : 0;
}

void out_token(out_ctx *g, int32_t tok, const float *logits, int n_vocab, ds4_gen_control *ctl) {
    /* The constraint follows the token it masked (a reset this token's
     * text triggers starts after it). */
    if (g->cons && g->cons_on) constraint_advance(g->cons, tok);
    if (tok == g->eos) return;
    if (g->j->req.logprobs >= 0 && logits && in_answer_text(g)) record_logprob(g, tok, logits, n_vocab);
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

bool out_in_tool_block(const out_ctx *g) { return g->parser && ds4_dsml_position_of(g->parser) != DS4_DSML_AT_TEXT; }

/* Calls whose invoke never closed were never answered: gone. */
static void drop_incomplete_calls(gen_out *o) {
    while (o->n_calls && !o->calls[o->n_calls - 1].complete) {
        gen_call *c = &o->calls[--o->n_calls];
        free(c->name);
        ds4_strbuf_free(&c->args);
    }
}

/* logprobs of tokens whose text did not reach the content (held back,
 * cut by a stop sequence or markup) are not answered. */
static void trim_logprobs(gen_out *o) {
    size_t bytes = 0, n = 0;
    while (n < o->n_lp) {
        size_t len = ds4_vocab_token_bytes(o->vocab, o->lp[n].id).len;
        if (bytes + len > o->content.len) break;
        bytes += len;
        n++;
    }
    if (n < o->lp_sent) n = o->lp_sent;
    o->n_lp = n;
}

void out_finish(out_ctx *g, ds4_finish finish) {
    gen_out *o = &g->j->out;
    ds4_strbuf_truncate(&g->piece, 0);
    ds4_detok_stream_finish(&g->detok, &g->piece);
    if (g->piece.len) feed_text(g, g->piece.p, g->piece.len);
    bool bad_block = false, cut = finish == DS4_FINISH_LENGTH;
    if (g->parser) {
        ds4_err err = {0};
        const ds4_dsml_result *r = ds4_dsml_result_of(g->parser);
        if (cut && r->status != DS4_DSML_MALFORMED_CALLS) {
            ds4_dsml_finish_cut(g->parser, NULL);
            if (r->status == DS4_DSML_UNTERMINATED_CALLS)
                srv_log("tool", "%s: max_tokens reached inside a tool call: the call in progress is dropped", g->j->id);
        } else if (ds4_dsml_finish(g->parser, &err) != 0) {
            drop_incomplete_calls(o);
            if (r->status == DS4_DSML_MALFORMED_CALLS && o->n_calls == 0 && !g->stopped) {
                /* Nothing was answered as a call: the text stays text. */
                srv_log("tool", "invalid tool call returned as assistant text: %s", err.msg);
                content_piece(g, r->unparsed.p ? r->unparsed.p : "", r->unparsed.len, false);
            } else {
                bad_block = true;
                snprintf(o->error, sizeof(o->error), "%s", err.msg);
            }
        }
    }
    drop_incomplete_calls(o);
    content_piece(g, "", 0, true);
    if (g->j->req.logprobs >= 0 && !g->j->req.raw_text) trim_logprobs(o);
    if (finish == DS4_FINISH_CANCELLED || finish == DS4_FINISH_ERROR || bad_block) o->finish = "error";
    else if (g->tool_stop || (o->n_calls && finish == DS4_FINISH_EOS)) o->finish = "tool_calls";
    else if (cut) o->finish = "length";
    else o->finish = "stop";
    if (bad_block && !o->error[0]) snprintf(o->error, sizeof(o->error), "unterminated tool call");
}

const char *out_raw_calls(const out_ctx *g, size_t *n) {
    const ds4_dsml_result *r = g->parser ? ds4_dsml_result_of(g->parser) : NULL;
    *n = r ? r->raw_calls.len : 0;
    return r && r->raw_calls.p ? r->raw_calls.p : "";
}
