/*
 * local.c - the model in this process (see agent.h, model_ops).
 *
 * The transcript is a token list, and it is the only truth: what the user
 * typed and what the tools returned are tokenized once and appended, what
 * the model sampled is appended token by token exactly as sampled, and the
 * engine session is brought to the transcript with ds4_session_sync, which
 * prefills only the part it does not hold yet.  Nothing is ever re-rendered
 * from messages, so the live KV cannot drift from the conversation.
 *
 * The layout is the official DeepSeek V4 encoding (text/chat.h): the
 * system prompt with the tool schemas, "<｜User｜>" turns, assistant turns
 * after "<｜Assistant｜><think>" (or "</think>") closed by the end token,
 * tool results as <tool_result> blocks in a user turn, text that follows
 * tool results joined to their turn by a blank line.  So the transcript's
 * text is what ds4-server renders for the same conversation, and the two
 * can reuse each other's KV files (docs/AGENT.md, "Sessions").
 *
 * Sessions are KVC files (engine/kvcache.h) named by the SHA1 of the
 * transcript text: the system prompt alone (reason agent-system, loaded at
 * start so the long tool prompt is prefilled once per machine), and the
 * saved conversations (agent-session).  Loading one restores the KV state
 * as it was: no token is prefilled.
 *
 * Every token the model produces goes through decode_round(), the one
 * place a faster decoder (MTP drafts, when the engine has them) would go.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#include "agent.h"
#include "app.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "engine/startup.h"
#include "text/chat.h"
#include "text/dsml_render.h"
#include "text/rendered.h"
#include "text/tokenizer.h"

typedef struct local {
    agent_model base;
    const agent_opts *o;
    const agent_hooks *h;
    agent_link *l;
    display *d;
    FILE *trace;
    ds4_engine *e;
    ds4_session *s;
    ds4_tokenizer *tok;
    ds4_sampler smp;
    bool greedy; /* --temp 0 */
    int32_t user, assistant, think, think_end, eos, dsml;
    bool thinking;  /* the effective mode opens <think> */
    ds4_tokens tx;  /* the transcript */
    ds4_tokens sys; /* the system prompt's tokens (a prefix of tx) */
    char *sys_text; /* and its text, the KV key */
    size_t sys_len;
    char sys_name[48];
    char *dir;
    int quant_bits;
} local;

static local *L_(agent_model *m) { return (local *)m; }

/* ------------------------------------------------------------ helpers */

static int32_t special(const ds4_vocab *v, const char *s) { return ds4_vocab_find_added(v, s, strlen(s)); }

static bool user_turn_open(const local *L) { return L->tx.n > L->sys.n && L->tx.ids[L->tx.n - 1] != L->eos; }

/* Plain text appended to the transcript (never control tokens). */
static int push_text(local *L, const char *s, size_t n, ds4_err *err) {
    size_t before = L->tx.n;
    if (ds4_tokenize_text(L->tok, s, n, &L->tx, err) != 0) {
        L->tx.n = before;
        return -1;
    }
    return L->tx.failed ? ds4_err_set(err, DS4_ENOMEM, "out of memory") : 0;
}

static int detok(const local *L, const int32_t *ids, size_t n, ds4_strbuf *out, ds4_err *err) {
    return ds4_detokenize(L->e->vocab, ids, n, out, err);
}

static int on_prefill(void *ctx, uint32_t done, uint32_t total) {
    local *L = ctx;
    link_update(L->l, link_status(L->l).state == ST_COMPACTING ? ST_COMPACTING : ST_PREFILL, done, total);
    return link_interrupted(L->l);
}

/* Restore the system prompt's saved state (no prefill).  0 when loaded,
 * 1 when there is no usable file, -1 on error. */
static int load_sys(local *L, ds4_err *err) {
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", L->dir, L->sys_name);
    if (access(path, R_OK) != 0) return 1;
    ds4_kv_state *st = ds4_session_state_new(L->s, err);
    if (!st) return -1;
    ds4_kvc_file f;
    ds4_err e2 = {0};
    int rc = ds4_kvc_read(path, st, L->e->vocab, L->sys_name, 400000, &f, &e2);
    if (rc == 0 && f.h.quant_bits != L->quant_bits)
        rc = ds4_err_set(&e2, DS4_EUNSUPPORTED, "written by a %u-bit model, this one is %d-bit", f.h.quant_bits,
                         L->quant_bits);
    if (rc == 0 && (f.text_len != L->sys_len || memcmp(f.text, L->sys_text, f.text_len) != 0))
        rc = ds4_err_set(&e2, DS4_EFORMAT, "its text is not this system prompt");
    if (rc == 0) rc = ds4_session_restore(L->s, st, &e2);
    if (rc == 0) {
        L->sys.n = 0;
        ds4_tokens_append(&L->sys, (const int32_t *)(const void *)st->tokens, st->n_tokens);
    } else {
        display_printf(L->d, OUT_ERROR, "system prompt cache skipped: %s\n", e2.msg);
    }
    if (rc == 0) ds4_kvc_file_free(&f);
    ds4_kv_state_free(st);
    return rc == 0 ? 0 : 1;
}

/* Bring the session to the transcript.  When the live state is not a
 * prefix of it (after compaction, a failed summary, /new), start from the
 * saved system prompt rather than from nothing. */
static int sync_tx(local *L, ds4_err *err) {
    uint32_t live = ds4_session_n_tokens(L->s);
    const int32_t *lt = ds4_session_tokens(L->s);
    bool prefix = live <= L->tx.n && (live == 0 || memcmp(lt, L->tx.ids, live * sizeof(int32_t)) == 0);
    if (!prefix && L->tx.n >= L->sys.n && memcmp(L->tx.ids, L->sys.ids, L->sys.n * sizeof(int32_t)) == 0) {
        ds4_session_reset(L->s);
        if (load_sys(L, err) < 0) return -1;
    }
    live = ds4_session_n_tokens(L->s);
    uint32_t total = (uint32_t)L->tx.n - (live <= L->tx.n ? live : 0);
    if (L->trace) trace_line(L->trace, "sync: transcript %zu tokens, live %u, prefill %u", L->tx.n, live, total);
    if (total) on_prefill(L, 0, total);
    int rc = ds4_session_sync(L->s, L->tx.ids, (uint32_t)L->tx.n, on_prefill, L, err);
    link_set_ctx(L->l, (uint32_t)L->tx.n, ds4_session_ctx(L->s));
    return rc;
}

static int save_file(local *L, const char *text, size_t n, ds4_kvc_reason reason, char name[48], ds4_err *err) {
    ds4_kvc_name(text, n, name);
    char path[1200];
    snprintf(path, sizeof(path), "%s/%s", L->dir, name);
    ds4_kv_state *st = ds4_session_state_new(L->s, err);
    if (!st) return -1;
    int rc = ds4_session_snapshot(L->s, st, err);
    uint64_t now = (uint64_t)time(NULL);
    ds4_kvc_header h = {.quant_bits = (uint8_t)L->quant_bits,
                        .reason = (uint8_t)reason,
                        .ctx = ds4_session_ctx(L->s),
                        .created = now,
                        .last_used = now};
    if (rc == 0) rc = ds4_kvc_write(path, &h, text, n, st, NULL, 0, err);
    ds4_kv_state_free(st);
    if (L->trace && rc == 0) trace_line(L->trace, "saved %s (%u tokens, reason %d)", name, h.n_tokens, reason);
    return rc;
}

/* ------------------------------------------------------------ conversation */

static uint32_t m_ctx(agent_model *m) { return ds4_session_ctx(L_(m)->s); }
static uint32_t m_used(agent_model *m) { return (uint32_t)L_(m)->tx.n; }
static bool m_has_user(agent_model *m) { return L_(m)->tx.n > L_(m)->sys.n; }
static uint64_t m_prefilled(agent_model *m) { return ds4_session_get_stats(L_(m)->s)->total_prefilled; }

static int m_add_user(agent_model *m, const char *text, ds4_err *err) {
    local *L = L_(m);
    size_t before = L->tx.n;
    if (user_turn_open(L)) {
        /* after tool results: the same turn, a blank line between (the
         * blank line and the text tokenize as one piece) */
        ds4_strbuf b = {0};
        ds4_strbuf_puts(&b, "\n\n");
        ds4_strbuf_puts(&b, text);
        int rc = ds4_strbuf_check(&b, "user text", err);
        if (rc == 0) rc = push_text(L, b.p, b.len, err);
        ds4_strbuf_free(&b);
        return rc;
    }
    ds4_tokens_push(&L->tx, L->user);
    if (push_text(L, text, strlen(text), err) != 0) {
        L->tx.n = before;
        return -1;
    }
    return 0;
}

/* The tool-result turn: "<tool_result>R</tool_result>" per call, joined
 * by a blank line (what the official encoder writes for tool messages). */
static int results_text(const json_t *results, bool join, ds4_strbuf *b, ds4_err *err) {
    if (join) ds4_strbuf_puts(b, "\n\n");
    for (size_t i = 0; i < json_array_size(results); i++) {
        const json_t *r = json_array_get(results, i);
        if (i) ds4_strbuf_puts(b, "\n\n");
        ds4_strbuf_puts(b, "<tool_result>");
        ds4_strbuf_append(b, json_string_value(r), json_string_length(r));
        ds4_strbuf_puts(b, "</tool_result>");
    }
    return ds4_strbuf_check(b, "tool results", err);
}

static int m_add_results(agent_model *m, const json_t *results, ds4_err *err) {
    local *L = L_(m);
    bool join = user_turn_open(L);
    ds4_strbuf b = {0};
    size_t before = L->tx.n;
    int rc = results_text(results, join, &b, err);
    if (rc == 0 && !join) ds4_tokens_push(&L->tx, L->user);
    if (rc == 0) rc = push_text(L, b.p, b.len, err);
    if (rc != 0) L->tx.n = before;
    ds4_strbuf_free(&b);
    return rc;
}

static int m_cost(agent_model *m, const json_t *results, uint32_t *tokens, ds4_err *err) {
    local *L = L_(m);
    ds4_strbuf b = {0};
    ds4_tokens t = {0};
    int rc = results_text(results, user_turn_open(L), &b, err);
    if (rc == 0) rc = ds4_tokenize_text(L->tok, b.p, b.len, &t, err);
    *tokens = (uint32_t)t.n + 1;
    ds4_tokens_free(&t);
    ds4_strbuf_free(&b);
    return rc;
}

/* ------------------------------------------------------------ a round */

typedef struct round_state {
    local *L;
    const gen_hooks *h;
    ds4_dsml_parser *p;
    ds4_detok_stream ds;
    ds4_strbuf piece;
    uint32_t generated;
    double t0;
    bool think_dsml;   /* a tool-call block inside the reasoning */
    size_t think_scan; /* reasoning bytes already scanned */
    bool in_think_block;
    bool summary;     /* compaction: plain text, stop at markup */
    ds4_strbuf *text; /* summary text */
    int err;
} round_state;

static void on_event(void *ctx, const ds4_dsml_event *ev) {
    round_state *r = ctx;
    if (r->h && r->h->event) r->h->event(r->h->ctx, ev);
    if (r->L->trace && (ev->kind == DS4_DSML_CALL_START || ev->kind == DS4_DSML_CALL_END))
        trace_text(r->L->trace, ev->kind == DS4_DSML_CALL_START ? "call" : "call-end", ev->text, ev->len);
}

/* A tool-call block inside <think>: the parser treats it as reasoning, so
 * look for its opening and closing tags in the reasoning text. */
static void scan_think(round_state *r) {
    const ds4_dsml_result *res = ds4_dsml_result_of(r->p);
    if (res->think_closed) return;
    static const char OPEN[] = "<" DS4_DSML_MARKER "tool_calls>", CLOSE[] = "</" DS4_DSML_MARKER "tool_calls>";
    size_t from = r->think_scan > sizeof(CLOSE) ? r->think_scan - sizeof(CLOSE) : 0;
    const char *s = res->reasoning.p;
    size_t n = res->reasoning.len;
    if (!s || n <= from) return;
    if (!r->in_think_block && memmem(s + from, n - from, OPEN, sizeof(OPEN) - 1)) r->in_think_block = true;
    if (r->in_think_block && memmem(s + from, n - from, CLOSE, sizeof(CLOSE) - 1)) r->think_dsml = true;
    r->think_scan = n;
}

static void on_token(void *ctx, int32_t tok, ds4_gen_control *ctl) {
    round_state *r = ctx;
    local *L = r->L;
    r->generated++;
    if (r->summary) {
        /* the summary is text: it ends at the first control token */
        if (tok == L->eos || tok == L->think_end || tok == L->dsml || tok == L->user || tok == L->assistant) {
            ctl->stop = true;
            ctl->append = false;
            return;
        }
    } else {
        ds4_tokens_push(&L->tx, tok);
    }
    if (L->trace) {
        ds4_str t = ds4_vocab_token_bytes(L->e->vocab, tok);
        char label[32];
        snprintf(label, sizeof(label), "token %d", tok);
        trace_text(L->trace, label, t.ptr, (size_t)t.len);
    }
    if (tok == L->eos) return;
    r->piece.len = 0;
    ds4_detok_stream_push(&r->ds, tok, &r->piece, NULL);
    if (r->summary) {
        ds4_strbuf_append(r->text, r->piece.p, r->piece.len);
        ds4_dsml_event ev = {.kind = DS4_DSML_CONTENT, .text = r->piece.p, .len = r->piece.len};
        if (r->piece.len && r->h && r->h->event) r->h->event(r->h->ctx, &ev);
    } else if (r->piece.len) {
        if (ds4_dsml_feed(r->p, r->piece.p, r->piece.len, NULL) != 0) r->err = 1;
        scan_think(r);
        ctl->greedy_next = ds4_dsml_position_of(r->p) == DS4_DSML_AT_MARKUP;
        /* a closed block ends the round (its calls run now); so does a
         * block that cannot parse (the model gets the error at once) */
        if (ds4_dsml_blocks_closed(r->p) > 0 || r->think_dsml || r->err ||
            ds4_dsml_result_of(r->p)->status == DS4_DSML_MALFORMED_CALLS)
            ctl->stop = true;
    }
    double dt = ds4_now() - r->t0;
    if (r->h && r->h->generated) r->h->generated(r->h->ctx, r->generated, dt > 0 ? r->generated / dt : 0);
}

/* Forced tokens of a test script, if one is set. */
static int script_tokens(local *L, ds4_tokens *out, ds4_err *err) {
    const char *text = L->h && L->h->script_next ? L->h->script_next(L->h->script_ctx) : NULL;
    if (!text) return 0;
    return ds4_tokenize_transcript(L->tok, text, strlen(text), out, err);
}

/* The decode loop of every round (the seam for a speculative decoder). */
static int decode_round(local *L, round_state *r, uint32_t max_tokens, bool greedy, ds4_gen_result *res, ds4_err *err) {
    ds4_tokens forced = {0};
    if (script_tokens(L, &forced, err) != 0) return -1;
    ds4_gen_opts go = {.max_tokens = max_tokens,
                       .cancel = link_cancel_flag(L->l),
                       .forced = forced.ids,
                       .n_forced = (uint32_t)forced.n};
    r->t0 = ds4_now();
    int rc = ds4_generate(L->s, greedy || L->greedy ? NULL : &L->smp, &go, on_token, r, res, err);
    ds4_tokens_free(&forced);
    if (L->trace)
        trace_line(L->trace, "generated %u tokens in %.3f s, finish %s", res->n_generated, res->seconds,
                   ds4_finish_name(res->finish));
    return rc;
}

static uint32_t room_for_generation(local *L) {
    uint32_t ctx = ds4_session_ctx(L->s), n = (uint32_t)L->tx.n;
    uint32_t room = ctx > n + 1 ? ctx - n - 1 : 0;
    return room < L->o->n_tokens ? room : L->o->n_tokens;
}

/* Close an assistant turn the model did not end itself. */
static void close_turn(local *L, bool in_reasoning) {
    if (L->tx.n && L->tx.ids[L->tx.n - 1] == L->eos) return;
    if (in_reasoning) ds4_tokens_push(&L->tx, L->think_end);
    ds4_tokens_push(&L->tx, L->eos);
}

/* The parsed calls as [{"name", "arguments"}]. */
static int collect_calls(const ds4_dsml_result *res, round_result *out) {
    out->calls = json_array();
    for (size_t i = 0; i < res->n_calls; i++) {
        json_error_t je;
        json_t *args = json_loadb(res->calls[i].arguments, res->calls[i].arguments_len, JSON_DECODE_ANY, &je);
        if (!args) {
            snprintf(out->error, sizeof(out->error), "the arguments of call %zu (%.*s) are not valid: %s", i + 1,
                     (int)res->calls[i].name_len, res->calls[i].name, je.text);
            return -1;
        }
        json_array_append_new(out->calls, json_pack("{s:s%, s:o}", "name", res->calls[i].name, res->calls[i].name_len,
                                                    "arguments", args));
    }
    return 0;
}

static int m_round(agent_model *m, const gen_hooks *h, round_result *out, ds4_err *err) {
    local *L = L_(m);
    memset(out, 0, sizeof(*out));
    ds4_tokens_push(&L->tx, L->assistant);
    ds4_tokens_push(&L->tx, L->thinking ? L->think : L->think_end);
    if (sync_tx(L, err) != 0) {
        bool intr = err && err->code == DS4_EINTERRUPTED;
        close_turn(L, L->thinking);
        if (!intr) return -1;
        out->end = ROUND_INTERRUPTED;
        return 0;
    }
    round_state r = {.L = L, .h = h};
    ds4_detok_stream_init(&r.ds, L->e->vocab, false);
    if (!(r.p = ds4_dsml_parser_new(L->thinking, on_event, &r, err))) {
        close_turn(L, L->thinking);
        return -1;
    }
    link_update(L->l, ST_GENERATING, 0, 0);
    ds4_gen_result res;
    int rc = decode_round(L, &r, room_for_generation(L), false, &res, err);
    r.piece.len = 0;
    ds4_detok_stream_finish(&r.ds, &r.piece);
    if (r.piece.len) ds4_dsml_feed(r.p, r.piece.p, r.piece.len, NULL);
    ds4_err perr = {0};
    /* a round cut short (limit, interrupt) may end in held-back markup:
     * drop it rather than show it */
    bool cut = rc == 0 && (res.finish == DS4_FINISH_LENGTH || res.finish == DS4_FINISH_CANCELLED);
    int prc = cut ? ds4_dsml_finish_cut(r.p, &perr) : ds4_dsml_finish(r.p, &perr);
    const ds4_dsml_result *pr = ds4_dsml_result_of(r.p);
    out->generated = r.generated;
    close_turn(L, L->thinking && !pr->think_closed);
    link_set_ctx(L->l, (uint32_t)L->tx.n, ds4_session_ctx(L->s));
    if (rc != 0) {
        /* the session reset itself; the transcript stays the truth */
    } else if (res.finish == DS4_FINISH_CANCELLED) {
        out->end = ROUND_INTERRUPTED;
    } else if (r.think_dsml) {
        out->end = ROUND_BAD_CALLS;
        snprintf(out->error, sizeof(out->error),
                 "tool calls are not allowed inside <think></think>: end the reasoning with </think> first, then "
                 "write the tool-call block");
    } else if (ds4_dsml_blocks_closed(r.p) > 0 && prc == 0) {
        out->end = collect_calls(pr, out) == 0 ? ROUND_CALLS : ROUND_BAD_CALLS;
    } else if (res.finish == DS4_FINISH_LENGTH) {
        out->end = ROUND_LENGTH; /* a block cut by the limit is not malformed */
    } else if (pr->status == DS4_DSML_MALFORMED_CALLS || prc != 0 || r.err) {
        out->end = ROUND_BAD_CALLS;
        snprintf(out->error, sizeof(out->error), "%.590s",
                 perr.msg[0] ? perr.msg : "the tool-call block does not parse");
    } else {
        out->end = ROUND_ANSWER;
    }
    ds4_dsml_parser_free(r.p);
    ds4_strbuf_free(&r.piece);
    return rc;
}

/* ------------------------------------------------------------ compaction */

static int m_summarize(agent_model *m, const char *request, uint32_t max_tokens, const gen_hooks *h,
                       ds4_strbuf *summary, ds4_err *err) {
    local *L = L_(m);
    size_t keep = L->tx.n;
    /* the request goes on a copy of the transcript: it is private */
    int rc = m_add_user(m, request, err);
    if (rc == 0) {
        ds4_tokens_push(&L->tx, L->assistant);
        ds4_tokens_push(&L->tx, L->think_end);
        rc = sync_tx(L, err);
    }
    uint32_t room = ds4_session_ctx(L->s) > L->tx.n + 1 ? ds4_session_ctx(L->s) - (uint32_t)L->tx.n - 1 : 0;
    L->tx.n = keep;
    if (rc != 0) return -1;
    if (room < 64) return ds4_err_set(err, DS4_ERANGE, "no room left in the context to write a summary");
    round_state r = {.L = L, .h = h, .summary = true, .text = summary};
    ds4_detok_stream_init(&r.ds, L->e->vocab, true);
    ds4_gen_result res;
    rc = decode_round(L, &r, max_tokens < room ? max_tokens : room, true, &res, err);
    r.piece.len = 0;
    ds4_detok_stream_finish(&r.ds, &r.piece);
    ds4_strbuf_append(summary, r.piece.p, r.piece.len);
    ds4_strbuf_free(&r.piece);
    if (rc == 0 && res.finish == DS4_FINISH_CANCELLED)
        rc = ds4_err_set(err, DS4_EINTERRUPTED, "compaction interrupted");
    return rc;
}

/* Whether the user turn starting at tx[i] (a "<｜User｜>") holds tool results. */
static bool tool_turn_at(local *L, size_t i) {
    ds4_strbuf b = {0};
    size_t n = L->tx.n - i - 1 < 8 ? L->tx.n - i - 1 : 8;
    bool yes = detok(L, L->tx.ids + i + 1, n, &b, NULL) == 0 && b.len >= 13 && !memcmp(b.p, "<tool_result>", 13);
    ds4_strbuf_free(&b);
    return yes;
}

/* Where the verbatim tail starts: a user turn within the budget, a real
 * one (not tool results) if there is one, else the last user turn. */
static size_t tail_start(local *L, uint32_t budget) {
    size_t n = L->tx.n, best = 0, last = 0;
    for (size_t i = L->sys.n; i < n; i++) {
        if (L->tx.ids[i] != L->user) continue;
        last = i;
        if (n - i > budget) continue;
        if (!best || (tool_turn_at(L, best) && !tool_turn_at(L, i))) best = i;
        if (!tool_turn_at(L, best)) break;
    }
    return best ? best : last ? last : n;
}

static int m_rebuild(agent_model *m, const char *summary, uint32_t tail_budget, uint32_t *tail_tokens, ds4_err *err) {
    local *L = L_(m);
    size_t from = tail_start(L, tail_budget);
    ds4_tokens old = L->tx;
    ds4_tokens nt = {0};
    ds4_tokens_append(&nt, L->sys.ids, L->sys.n);
    L->tx = nt;
    ds4_strbuf b = {0};
    ds4_strbuf_puts(&b, "\n\n[ds4-agent: the earlier part of this conversation was compacted to save context. "
                        "Summary of it:]\n");
    ds4_strbuf_puts(&b, summary);
    if (b.len && b.p[b.len - 1] != '\n') ds4_strbuf_putc(&b, '\n');
    ds4_strbuf_puts(&b, "[End of the summary. The most recent part of the conversation follows verbatim.]");
    int rc = ds4_strbuf_check(&b, "summary", err);
    if (rc == 0) rc = push_text(L, b.p, b.len, err);
    ds4_strbuf_free(&b);
    if (rc == 0) {
        ds4_tokens_append(&L->tx, old.ids + from, old.n - from);
        *tail_tokens = (uint32_t)(old.n - from);
        if (L->tx.failed) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    if (rc == 0 && L->tx.n + AGENT_RESULT_RESERVE >= ds4_session_ctx(L->s))
        rc = ds4_err_set(err, DS4_ERANGE, "the compacted conversation (%zu tokens) still does not fit the context",
                         L->tx.n);
    if (rc != 0) {
        ds4_tokens_free(&L->tx);
        L->tx = old;
        return -1;
    }
    if (L->trace) trace_line(L->trace, "compacted: %zu -> %zu tokens, tail from %zu", old.n, L->tx.n, from);
    ds4_tokens_free(&old);
    return sync_tx(L, err);
}

/* ------------------------------------------------------------ sessions */

static int m_save(agent_model *m, char id[41], uint32_t *tokens, ds4_err *err) {
    local *L = L_(m);
    if (sync_tx(L, err) != 0) return -1;
    ds4_strbuf text = {0};
    int rc = detok(L, L->tx.ids, L->tx.n, &text, err);
    char name[48];
    if (rc == 0) rc = save_file(L, text.p, text.len, DS4_KVC_AGENT_SESSION, name, err);
    if (rc == 0) {
        memcpy(id, name, 40);
        id[40] = 0;
        *tokens = (uint32_t)L->tx.n;
        /* older saves of this conversation (prefixes of it) go */
        DIR *dir = opendir(L->dir);
        struct dirent *de;
        while (dir && (de = readdir(dir))) {
            if (strlen(de->d_name) != 43 || strcmp(de->d_name + 40, ".kv") || !strcmp(de->d_name, name)) continue;
            char path[1200];
            snprintf(path, sizeof(path), "%s/%s", L->dir, de->d_name);
            ds4_kvc_file f;
            if (ds4_kvc_read(path, NULL, NULL, de->d_name, 400000, &f, NULL) != 0) continue;
            if (f.h.reason == DS4_KVC_AGENT_SESSION && f.text_len < text.len && !memcmp(f.text, text.p, f.text_len)) {
                unlink(path);
                if (L->trace) trace_line(L->trace, "removed %s: an older save of this session", de->d_name);
            }
            ds4_kvc_file_free(&f);
        }
        if (dir) closedir(dir);
    }
    ds4_strbuf_free(&text);
    return rc;
}

static const char *const REASONS[] = {"unknown",         "server cold",   "server continued", "server evict",
                                      "server shutdown", "system prompt", "session"};

static int m_list(agent_model *m, session_info **out, size_t *n_out, display *d, ds4_err *err) {
    local *L = L_(m);
    *out = NULL;
    *n_out = 0;
    DIR *dir = opendir(L->dir);
    if (!dir) return ds4_err_set(err, DS4_EIO, "%s: %s", L->dir, strerror(errno));
    session_info *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        size_t nl = strlen(de->d_name);
        if (nl != 43 || strcmp(de->d_name + 40, ".kv") || strspn(de->d_name, "0123456789abcdef") != 40) continue;
        char path[1200];
        snprintf(path, sizeof(path), "%s/%s", L->dir, de->d_name);
        ds4_kvc_file f;
        ds4_err e2 = {0};
        if (ds4_kvc_read(path, NULL, NULL, de->d_name, 400000, &f, &e2) != 0) {
            if (d) display_printf(d, OUT_ERROR, "skipping %.8s: %s\n", de->d_name, e2.msg);
            continue;
        }
        bool ours = f.h.reason != DS4_KVC_AGENT_SYSTEM && f.text_len > L->sys_len &&
                    !memcmp(f.text, L->sys_text, L->sys_len);
        if (ours) {
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                session_info *nv = realloc(v, cap * sizeof(*nv));
                if (!nv) {
                    ds4_kvc_file_free(&f);
                    break;
                }
                v = nv;
            }
            session_info *s = &v[n++];
            memset(s, 0, sizeof(*s));
            memcpy(s->id, de->d_name, 40);
            snprintf(s->path, sizeof(s->path), "%s", path);
            struct stat sb;
            s->mtime = stat(path, &sb) == 0 ? (uint64_t)sb.st_mtime : f.h.last_used;
            s->tokens = f.h.n_tokens;
            s->bytes = f.file_size;
            snprintf(s->kind, sizeof(s->kind), "%s", REASONS[f.h.reason]);
            /* the first user message follows the system prompt */
            const char *t = f.text + L->sys_len, *end = f.text + f.text_len;
            const char *u = memmem(t, (size_t)(end - t), DS4_TOK_USER, strlen(DS4_TOK_USER));
            if (u) {
                u += strlen(DS4_TOK_USER);
                const char *a = memmem(u, (size_t)(end - u), DS4_TOK_ASSISTANT, strlen(DS4_TOK_ASSISTANT));
                sessions_title(u, (size_t)((a ? a : end) - u), s->title);
            }
        }
        ds4_kvc_file_free(&f);
    }
    closedir(dir);
    *out = v;
    *n_out = n;
    return 0;
}

/* A file another program wrote may stop inside an assistant turn (the
 * server saves its live session as it is): close it, as a round closes. */
static void close_loaded_turn(local *L) {
    size_t i = L->tx.n;
    while (i > L->sys.n) {
        int32_t t = L->tx.ids[--i];
        if (t == L->eos || t == L->user) return;
        if (t == L->assistant) {
            bool reasoning = i + 1 < L->tx.n && L->tx.ids[i + 1] == L->think;
            for (size_t k = i + 2; reasoning && k < L->tx.n; k++)
                if (L->tx.ids[k] == L->think_end) reasoning = false;
            close_turn(L, reasoning);
            return;
        }
    }
}

static int m_load(agent_model *m, const session_info *si, ds4_err *err) {
    local *L = L_(m);
    ds4_kv_state *st = ds4_session_state_new(L->s, err);
    if (!st) return -1;
    char name[48];
    snprintf(name, sizeof(name), "%s.kv", si->id);
    ds4_kvc_file f;
    int rc = ds4_kvc_read(si->path, st, L->e->vocab, name, 400000, &f, err);
    if (rc == 0) {
        if (f.h.quant_bits != L->quant_bits)
            rc = ds4_err_set(err, DS4_EUNSUPPORTED, "%.8s was written by a %u-bit model, this one is %d-bit", si->id,
                             f.h.quant_bits, L->quant_bits);
        else if (st->n_tokens < L->sys.n || memcmp(st->tokens, L->sys.ids, L->sys.n * sizeof(int32_t)) != 0)
            rc = ds4_err_set(err, DS4_EINVAL, "%.8s does not start with this agent's system prompt", si->id);
        else if (st->n_tokens + AGENT_RESULT_RESERVE >= ds4_session_ctx(L->s))
            rc = ds4_err_set(err, DS4_ERANGE, "%.8s holds %u tokens, too many for a context of %u", si->id,
                             st->n_tokens, ds4_session_ctx(L->s));
        ds4_kvc_file_free(&f);
    }
    if (rc == 0) rc = ds4_session_restore(L->s, st, err);
    if (rc == 0) {
        L->tx.n = 0;
        ds4_tokens_append(&L->tx, (const int32_t *)(const void *)st->tokens, st->n_tokens);
        close_loaded_turn(L);
        link_set_ctx(L->l, (uint32_t)L->tx.n, ds4_session_ctx(L->s));
        utime(si->path, NULL); /* most recent first in /list and Tab completion */
        if (L->trace) trace_line(L->trace, "loaded %s: %u tokens, nothing prefilled", si->id, st->n_tokens);
    }
    ds4_kv_state_free(st);
    return rc;
}

/* ------------------------------------------------------------ messages */

static json_t *text_of(local *L, size_t a, size_t b) {
    ds4_strbuf s = {0};
    detok(L, L->tx.ids + a, b - a, &s, NULL);
    json_t *j = json_stringn_nocheck(s.p ? s.p : "", s.len);
    ds4_strbuf_free(&s);
    return j;
}

/* The transcript as messages: user turns (tool results as role "tool"),
 * assistant turns with reasoning, content and the names of their calls. */
static json_t *m_messages(agent_model *m, ds4_err *err) {
    local *L = L_(m);
    json_t *msgs = json_array();
    size_t n = L->tx.n, i = L->sys.n;
    while (i < n) {
        int32_t t = L->tx.ids[i];
        if (t == L->user) {
            size_t e = i + 1;
            while (e < n && L->tx.ids[e] != L->assistant) e++;
            json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", tool_turn_at(L, i) ? "tool" : "user", "content",
                                                  text_of(L, i + 1, e)));
            i = e;
        } else if (t == L->assistant) {
            size_t s = i + 1, e = s;
            if (s < n && (L->tx.ids[s] == L->think || L->tx.ids[s] == L->think_end)) s++, e++;
            bool reasoning = s > i + 1 && L->tx.ids[i + 1] == L->think;
            size_t split = reasoning ? s : e;
            while (e < n && L->tx.ids[e] != L->eos && L->tx.ids[e] != L->user) {
                if (reasoning && split == s && L->tx.ids[e] == L->think_end) split = e + 1;
                e++;
            }
            if (reasoning && split == s) split = e;
            json_t *content = text_of(L, split, e);
            const char *c = json_string_value(content);
            const char *blk = strstr(c, "<" DS4_DSML_MARKER "tool_calls>");
            json_t *msg = json_pack("{s:s}", "role", "assistant");
            if (reasoning) json_object_set_new(msg, "reasoning_content", text_of(L, s, split > s ? split - 1 : s));
            if (blk) {
                json_t *names = json_array();
                ds4_dsml_result pr;
                if (ds4_dsml_parse(blk, strlen(blk), false, &pr, NULL) == 0 || pr.n_calls) {
                    for (size_t k = 0; k < pr.n_calls; k++)
                        json_array_append_new(names, json_stringn_nocheck(pr.calls[k].name, pr.calls[k].name_len));
                }
                ds4_dsml_result_free(&pr);
                json_object_set_new(msg, "tool_calls", names);
                json_object_set_new(msg, "content", json_stringn_nocheck(c, (size_t)(blk - c)));
                json_decref(content);
            } else {
                json_object_set_new(msg, "content", content);
            }
            json_array_append_new(msgs, msg);
            i = e < n && L->tx.ids[e] == L->eos ? e + 1 : e;
        } else {
            i++; /* plain text after the system prompt: a compaction summary */
        }
    }
    if (!msgs) ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return msgs;
}

/* ------------------------------------------------------------ setup */

static void m_free(agent_model *m) {
    local *L = L_(m);
    if (!L) return;
    ds4_session_free(L->s);
    ds4_tokenizer_free(L->tok);
    ds4_sampler_free(&L->smp);
    ds4_engine_close(L->e);
    ds4_tokens_free(&L->tx);
    ds4_tokens_free(&L->sys);
    free(L->sys_text);
    free(L->dir);
    free(L);
}

/* Prefill the system prompt and save it for the next start. */
static int prefill_sys(local *L, ds4_err *err) {
    L->tx.n = 0;
    ds4_tokens_append(&L->tx, L->sys.ids, L->sys.n);
    display_printf(L->d, OUT_INFO, "system prompt: prefilling %zu tokens (saved for the next start)\n", L->sys.n);
    link_update(L->l, ST_PREFILL, 0, (uint32_t)L->sys.n);
    if (sync_tx(L, err) != 0) return -1;
    char name[48];
    ds4_err e2 = {0};
    if (save_file(L, L->sys_text, L->sys_len, DS4_KVC_AGENT_SYSTEM, name, &e2) != 0)
        display_printf(L->d, OUT_ERROR, "could not save the system prompt cache: %s\n", e2.msg);
    return 0;
}

/* Back to the system prompt: restored from its file, else prefilled (and
 * saved for the next start). */
static int m_reset(agent_model *m, ds4_err *err) {
    local *L = L_(m);
    uint32_t live = ds4_session_n_tokens(L->s);
    bool at_sys = live == L->sys.n && !memcmp(ds4_session_tokens(L->s), L->sys.ids, live * sizeof(int32_t));
    if (!at_sys) {
        ds4_session_reset(L->s);
        int rc = load_sys(L, err);
        if (rc < 0) return -1;
        if (rc == 0)
            display_printf(L->d, OUT_INFO, "system prompt: %zu tokens from the cache, nothing prefilled\n", L->sys.n);
        else if (prefill_sys(L, err) != 0) return -1;
    }
    L->tx.n = 0;
    ds4_tokens_append(&L->tx, L->sys.ids, L->sys.n);
    link_set_ctx(L->l, (uint32_t)L->tx.n, ds4_session_ctx(L->s));
    return 0;
}

static const model_ops LOCAL_OPS = {
    .name = "local",
    .ctx = m_ctx,
    .used = m_used,
    .reset = m_reset,
    .add_user = m_add_user,
    .add_results = m_add_results,
    .cost = m_cost,
    .round = m_round,
    .summarize = m_summarize,
    .rebuild = m_rebuild,
    .save = m_save,
    .list = m_list,
    .load = m_load,
    .messages = m_messages,
    .has_user = m_has_user,
    .prefilled = m_prefilled,
    .free = m_free,
};

/* The system prompt: instructions and -sys text, then the tool schemas,
 * rendered as the official encoder renders a system message with tools. */
static int render_system(local *L, ds4_err *err) {
    char *text = agent_system_text(L->o);
    json_t *msgs = text ? json_pack("[{s:s, s:s, s:o}]", "role", "system", "content", text, "tools",
                                    agent_tool_schemas())
                        : NULL;
    free(text);
    if (!msgs) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    ds4_chat_opts co = {.think = (ds4_think_mode)L->o->think, .ctx_size = L->o->ctx};
    L->thinking = ds4_chat_effective_think(&co) != DS4_THINK_OFF;
    ds4_rendered r = {0};
    int rc = ds4_chat_render(msgs, &co, &r, err);
    json_decref(msgs);
    if (rc == 0) rc = ds4_tokenize_rendered(L->tok, &r, &L->sys, err);
    if (rc == 0) {
        L->sys_text = ds4_strbuf_take(&r.text, &L->sys_len);
        ds4_kvc_name(L->sys_text, L->sys_len, L->sys_name);
    }
    ds4_rendered_free(&r);
    return rc;
}

/* --warm-weights stops at Ctrl+C (the UI is not running yet: the signal
 * handler only counts). */
static bool warm_stop(void *ctx) {
    (void)ctx;
    return app_sigint_count() > 0;
}

agent_model *local_model_new(const agent_opts *o, const agent_hooks *h, agent_link *l, display *d, FILE *trace,
                             ds4_err *err) {
    local *L = calloc(1, sizeof(*L));
    if (!L) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    L->base.ops = &LOCAL_OPS;
    L->o = o;
    L->h = h;
    L->l = l;
    L->d = d;
    L->trace = trace;
    if (!(L->dir = sessions_dir(o, err))) goto fail;
    if (ds4_model_file_check(o->model, err) != 0) goto fail;
    ds4_engine_opts eo = {.model_path = o->model,
                          .backend = o->backend,
                          .n_threads = o->threads,
                          .no_sim = o->no_sim,
                          .need_vocab = true,
                          .mtp_path = o->mtp.path};
    ds4_cli_steering_opts(&o->steer, &eo);
    if (!(L->e = ds4_engine_open(&eo, err))) goto fail;
    ds4_startup_print_memory("ds4-agent", L->e->backend_name, L->e->w, o->ctx);
    if (o->warm_weights && ds4_startup_warm("ds4-agent", L->e->w, o->threads, warm_stop, (void *)l) != 0) {
        ds4_err_set(err, DS4_EINTERRUPTED, "--warm-weights did not finish");
        goto fail;
    }
    if (!(L->tok = ds4_tokenizer_new(L->e->vocab, err))) goto fail;
    if (!(L->s = ds4_session_new(L->e, o->ctx, err))) goto fail;
    /* every round goes through ds4_generate, which drafts with the MTP block */
    if (L->e->mtp && ds4_session_enable_mtp(L->s, o->mtp.draft, o->mtp.margin, err) != 0) goto fail;
    if (ds4_sampler_init(&L->smp, &o->sampling, (int)L->e->w->cfg.n_vocab, err) != 0) goto fail;
    L->greedy = o->sampling.temperature <= 0;
    const ds4_vocab *v = L->e->vocab;
    L->user = special(v, DS4_TOK_USER);
    L->assistant = special(v, DS4_TOK_ASSISTANT);
    L->think = special(v, DS4_TOK_THINK);
    L->think_end = special(v, DS4_TOK_THINK_END);
    L->dsml = special(v, DS4_DSML_MARKER);
    L->eos = L->e->eos;
    if (L->user < 0 || L->assistant < 0 || L->think < 0 || L->think_end < 0 || L->eos < 0) {
        ds4_err_set(err, DS4_EFORMAT, "%s: the tokenizer lacks DeepSeek V4's chat tokens", o->model);
        goto fail;
    }
    L->quant_bits = ds4_engine_quant_bits(L->e);
    if (render_system(L, err) != 0) goto fail;
    link_set_ctx(l, 0, o->ctx);
    return &L->base;
fail:
    m_free(&L->base);
    return NULL;
}
