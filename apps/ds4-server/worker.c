/*
 * worker.c - the one thread that owns the engine session: a bounded FIFO of
 * jobs, the KV reuse ladder, prefill with disk checkpoints, generation.
 *
 * KV reuse, in order (ds4's ladder, with the rungs it lacks):
 *   responses-visible, responses-tool-output, anthropic-tool-output
 *                 live protocol continuations (continuation.c): the live
 *                 session continues the turn the client answers, whatever
 *                 hidden reasoning it holds; a tool-output-only request
 *                 whose live state is gone is answered 409
 *   memory-token  the live session's tokens are a prefix of the prompt's
 *   memory-text   the live tokens decode to a byte prefix of the rendered
 *                 prompt: keep them (the model's own tokenization of what it
 *                 sampled) and tokenize only the rest
 *   thinking-visible  the previous answer was a thinking turn and the client
 *                 replays it without the reasoning (as the chat template
 *                 drops it, or as clients do that never send it back): keep
 *                 the live state, hidden reasoning included
 *   memory-checkpoint  the last prompt (an in-memory snapshot taken after
 *                 its prefill) is a token prefix of this one: a retried
 *                 request, an answer the client replays differently
 *   disk          the longest KVC checkpoint whose key text is a prefix of
 *                 the rendered prompt, when it holds more than the live
 *                 session could reuse (the live session is saved first,
 *                 reason "evict", since it is about to be replaced)
 *   cold          full prefill; a cold checkpoint at the system/tools
 *                 boundary on the way (kvcache.h policy)
 * After a chat/completions or Anthropic tool-call turn whose sampled text
 * is not what the client will send back, the live tail is rewritten to the
 * canonical rendering (canonicalize) so that the next turn is a token hit.
 * Continued checkpoints are written whenever the live token count crosses
 * a multiple of the continued step, in prefill and in generation (not
 * inside a tool-call block), and the live session is saved at shutdown.
 *
 * Cancellation: the connection thread sets job->cancel when its client goes
 * away; prefill checks it between chunks, the generation loop every token.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "engine/session.h"
#include "engine/spec.h"
#include "constrain.h"
#include "output.h"
#include "server.h"
#include "text/tokenizer.h"

/* Where a prompt's KV state came from (the reuse ladder above), in order. */
static const char *const SOURCES[] = {"responses-visible", "responses-tool-output", "anthropic-tool-output",
                                      "memory-token",      "memory-text",           "thinking-visible",
                                      "memory-checkpoint", "disk",                  "cold"};
#define N_SOURCES (sizeof(SOURCES) / sizeof(SOURCES[0]))

/* How a queued job ended: exactly one of these. */
typedef enum outcome { ANSWERED, FAILED, CANCELLED, CONTINUATION_LOST } outcome;

/* The /v1/ds4/stats counters (worker_stats; docs/SERVER.md): each name
 * says what it counts. */
typedef struct counters {
    uint64_t queued, rejected_queue_full, rejected_shutting_down;
    uint64_t ended[4];                /* by outcome */
    /* jobs whose prefill finished: their prompts and where their KV came from */
    uint64_t prompt_tokens, reused_tokens, prefilled_tokens, by_source[N_SOURCES];
    uint64_t generated_tokens;        /* of every job */
    uint64_t disk_writes[7];          /* KVC files written, by save reason */
    uint64_t canonicalized;           /* live tails rewritten after a tool-call turn */
    ds4_spec_stats mtp;               /* MTP speculation of every job (the session's totals) */
    char last_source[24];
    uint32_t last_reused, last_prefilled;
} counters;

static server *S;
static ds4_session *sess;
static ds4_kv_state *scratch;      /* snapshots for disk saves and loads (only with a disk cache:
                                    * it is as large as the session's state) */
static ds4_tokenizer *tok;
static ds4_kvc_store *store;
static int32_t user_tok, assistant_tok;
static uint32_t frontier_done;     /* last continued frontier saved */

/* The live session after a thinking-mode answer: its prompt (ending with
 * "<think>") and how many tokens the session held then.  A client that
 * replays the conversation without the hidden reasoning renders the turn
 * as "</think>" + answer, which the live tokens (with the reasoning) do not
 * spell; see visible_prefix. */
static ds4_strbuf vis_prompt;
static uint32_t vis_tokens;

/* The tokens of the in-memory checkpoint the session keeps of the last
 * prompt (taken after its prefill; see checkpoint_prefix). */
static ds4_tokens ck_tokens;

static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t qcv = PTHREAD_COND_INITIALIZER;
static job **queue;
static int qcap, qhead, qn;
static bool qstop;
static job *current;
static pthread_t thread;
static bool thread_started;
static counters C;

/* ------------------------------------------------------------ disk saves */

static const char *const REASON_NAMES[] = {"unknown", "cold", "continued", "evict", "shutdown", "agent-system",
                                           "agent-session"};

static void save_live(ds4_kvc_reason reason) {
    uint32_t n = ds4_session_n_tokens(sess);
    if (!store || n < S->o.kv_policy.min_tokens) return;
    ds4_strbuf text = {0};
    ds4_err err = {0};
    if (ds4_detokenize(S->engine->vocab, ds4_session_tokens(sess), n, &text, &err) != 0) {
        srv_log("kvcache", "save skipped: %s", err.msg);
        ds4_strbuf_free(&text);
        return;
    }
    if (ds4_kvc_contains(store, text.p, text.len)) {
        ds4_strbuf_free(&text);
        return;
    }
    double t0 = ds4_now();
    size_t n_tools = 0;
    ds4_kvc_tool *tools = toolmem_entries_in(S->tools, text.p, text.len, &n_tools);
    int rc = ds4_session_snapshot(sess, scratch, &err);
    if (rc == 0) rc = ds4_kvc_save(store, reason, 0, text.p, text.len, scratch, tools, n_tools, &err);
    if (rc < 0) srv_log("kvcache", "%s save of %u tokens failed: %s", REASON_NAMES[reason], n, err.msg);
    if (rc > 0) {
        srv_log("kvcache", "saved %u tokens (%s, %zu tool ids) in %.3f s", n, REASON_NAMES[reason], n_tools, ds4_now() - t0);
        pthread_mutex_lock(&S->stats_mu);
        C.disk_writes[reason]++;
        pthread_mutex_unlock(&S->stats_mu);
    }
    toolmem_entries_free(tools, n_tools);
    ds4_strbuf_free(&text);
}

/* ------------------------------------------------------------ reuse */

typedef struct reuse {
    ds4_tokens prompt;  /* what the session will hold before generation */
    uint32_t kept;      /* tokens not prefilled */
    const char *source;
} reuse;

static bool live_token_prefix(const job *j) {
    uint32_t n = ds4_session_n_tokens(sess);
    return n > 0 && n <= j->tokens.n && memcmp(ds4_session_tokens(sess), j->tokens.ids, n * sizeof(int32_t)) == 0;
}

/* Live tokens + the rendered text after their bytes, when they decode to a
 * prefix of it. */
static bool live_text_prefix(const job *j, reuse *r) {
    uint32_t n = ds4_session_n_tokens(sess);
    if (n == 0) return false;
    ds4_strbuf text = {0};
    bool ok = ds4_detokenize(S->engine->vocab, ds4_session_tokens(sess), n, &text, NULL) == 0 &&
              text.len <= j->rendered.text.len && memcmp(text.p, j->rendered.text.p, text.len) == 0;
    ds4_tokens suffix = {0};
    ok = ok && ds4_tokenize_rendered_from(tok, &j->rendered, text.len, &suffix, NULL) == 0;
    if (ok) {
        ds4_tokens_append(&r->prompt, ds4_session_tokens(sess), n);
        ds4_tokens_append(&r->prompt, suffix.ids, suffix.n);
        r->kept = n;
        r->source = "memory-text";
    }
    ds4_tokens_free(&suffix);
    ds4_strbuf_free(&text);
    return ok;
}

/* thinking-visible (the ladder's fifth rung): the live session holds
 * P + reasoning + "</think>" + rest, P the previous prompt ending with
 * "<think>".  A replay without the reasoning renders that turn either as
 * P minus "<think>" + "</think>" + rest (reasoning dropped: no tools) or as
 * P + "</think>" + rest (tools: reasoning kept, but the client sent none).
 * When the new prompt starts with one of those, keep the live state, hidden
 * reasoning included, and prefill only what follows. */
static bool visible_prefix(const job *j, reuse *r) {
    uint32_t n = ds4_session_n_tokens(sess);
    if (!vis_tokens || n != vis_tokens || !vis_prompt.len) return false;
    ds4_strbuf live = {0};
    bool ok = false;
    const char *close = NULL;
    size_t pl = vis_prompt.len, tl = strlen(DS4_TOK_THINK), cl = strlen(DS4_TOK_THINK_END);
    if (ds4_detokenize(S->engine->vocab, ds4_session_tokens(sess), n, &live, NULL) == 0 && live.len >= pl &&
        memcmp(live.p, vis_prompt.p, pl) == 0)
        close = memmem(live.p + pl, live.len - pl, DS4_TOK_THINK_END, cl);
    for (int form = 0; close && form < 2 && !ok; form++) {
        /* The visible text, piece by piece: prompt (minus <think> when the
         * reasoning is dropped), then everything from </think> on. */
        size_t head = form == 0 ? pl - tl : pl, rest = live.len - (size_t)(close - live.p);
        const char *t = j->rendered.text.p;
        if (head + rest > j->rendered.text.len || memcmp(t, vis_prompt.p, head) != 0 ||
            memcmp(t + head, close, rest) != 0)
            continue;
        ds4_tokens suffix = {0};
        if (ds4_tokenize_rendered_from(tok, &j->rendered, head + rest, &suffix, NULL) == 0) {
            ds4_tokens_append(&r->prompt, ds4_session_tokens(sess), n);
            ds4_tokens_append(&r->prompt, suffix.ids, suffix.n);
            r->kept = n;
            r->source = "thinking-visible";
            ok = true;
        }
        ds4_tokens_free(&suffix);
    }
    ds4_strbuf_free(&live);
    return ok;
}

/* memory-checkpoint: the last prompt, as it was before generation, is a
 * token prefix of this one, though the live state (which went on with the
 * answer) is not: a retried or regenerated request, an answer the client
 * changed (a stop sequence cut it, tool calls rendered canonically, an
 * edit).  Restore the checkpoint and prefill from there. */
static bool checkpoint_prefix(const job *j, reuse *r) {
    uint32_t ck = ds4_session_checkpoint_tokens(sess);
    if (!ck || ck != ck_tokens.n || ck <= r->kept || ck > j->tokens.n ||
        memcmp(ck_tokens.ids, j->tokens.ids, ck * sizeof(int32_t)) != 0)
        return false;
    save_live(DS4_KVC_EVICT);
    ds4_err err = {0};
    if (ds4_session_sync(sess, ck_tokens.ids, ck, NULL, NULL, &err) != 0 || ds4_session_n_tokens(sess) != ck) {
        srv_log("kvcache", "memory checkpoint not usable: %s", err.msg);
        ds4_session_reset(sess);
        return false;
    }
    ds4_tokens_free(&r->prompt);
    ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
    r->kept = ck;
    r->source = "memory-checkpoint";
    frontier_done = 0;
    return true;
}

static bool disk_prefix(const job *j, reuse *r) {
    ds4_kvc_match m;
    if (!store || !ds4_kvc_lookup(store, j->rendered.text.p, j->rendered.text.len, &m) || m.n_tokens <= r->kept)
        return false;
    /* The live session is about to be replaced. */
    save_live(DS4_KVC_EVICT);
    ds4_err err = {0};
    ds4_tokens suffix = {0};
    if (ds4_kvc_load(store, &m, scratch, &err) != 0 || ds4_session_restore(sess, scratch, &err) != 0 ||
        ds4_tokenize_rendered_from(tok, &j->rendered, m.text_len, &suffix, &err) != 0) {
        srv_log("kvcache", "disk hit %s not usable: %s", m.name, err.msg);
        ds4_session_reset(sess);
        ds4_tokens_free(&suffix);
        return false;
    }
    srv_log("kvcache", "disk hit %s: %u tokens", m.name, m.n_tokens);
    if (S->o.kv_policy.cold_max_tokens && m.n_tokens > S->o.kv_policy.cold_max_tokens) ds4_kvc_remove(store, m.name);
    ds4_tokens_free(&r->prompt);
    ds4_tokens_append(&r->prompt, ds4_session_tokens(sess), ds4_session_n_tokens(sess));
    ds4_tokens_append(&r->prompt, suffix.ids, suffix.n);
    ds4_tokens_free(&suffix);
    r->kept = m.n_tokens;
    r->source = "disk";
    frontier_done = 0;
    return true;
}

/* 0, or -1 with e set when the request needs a live continuation that is
 * gone (409). */
static int choose_reuse(job *j, reuse *r, api_error *e) {
    memset(r, 0, sizeof(*r));
    int c = cont_match(S, j, ds4_session_tokens(sess), ds4_session_n_tokens(sess), tok, &r->prompt, &r->kept, &r->source, e);
    /* The session moves on from here: the binding it had no longer holds. */
    cont_leave();
    if (c != 0) {
        vis_tokens = 0;
        return c < 0 ? -1 : 0;
    }
    if (live_token_prefix(j)) {
        ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
        r->kept = ds4_session_n_tokens(sess);
        r->source = "memory-token";
    } else if (!live_text_prefix(j, r) && !visible_prefix(j, r)) {
        if (ds4_session_n_tokens(sess)) srv_log("kvcache", "live kv cache miss (%u live tokens)", ds4_session_n_tokens(sess));
    }
    vis_tokens = 0;
    if (!r->source) checkpoint_prefix(j, r);
    if (disk_prefix(j, r)) return 0;
    if (r->source) return 0;
    save_live(DS4_KVC_EVICT);
    ds4_session_reset(sess);
    frontier_done = 0;
    ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
    r->source = "cold";
    return 0;
}

/* ------------------------------------------------------------ prefill */

static int on_progress(void *ctx, uint32_t done, uint32_t total) {
    job *j = ctx;
    (void)done, (void)total;
    return j->cancel || S->stopping;
}

typedef struct save_point {
    uint32_t pos;
    bool cold;
} save_point;

static int by_pos(const void *a, const void *b) {
    uint32_t x = ((const save_point *)a)->pos, y = ((const save_point *)b)->pos;
    return x < y ? -1 : x > y;
}

/* Prefill to the whole prompt, stopping at checkpoint positions to save:
 * the cold boundary (cold prompts) and the continued frontiers. */
static int prefill(job *j, const reuse *r, ds4_err *err) {
    uint32_t n = (uint32_t)r->prompt.n, at = ds4_session_n_tokens(sess);
    save_point pts[66];
    uint32_t np = 0;
    if (store && strcmp(r->source, "cold") == 0) {
        uint32_t b = ds4_kvc_cold_boundary(&S->o.kv_policy, r->prompt.ids, n, user_tok, assistant_tok);
        if (b > at) pts[np++] = (save_point){b, true};
    }
    uint32_t step = store ? ds4_kvc_continued_step(&S->o.kv_policy) : 0;
    for (uint32_t f = step ? (at / step + 1) * step : 0; step && f <= n && np < 64; f += step)
        pts[np++] = (save_point){f, false};
    qsort(pts, np, sizeof(pts[0]), by_pos);
    for (uint32_t i = 0; i < np; i++) {
        if (i && pts[i].pos == pts[i - 1].pos) continue;
        if (ds4_session_sync(sess, r->prompt.ids, pts[i].pos, on_progress, j, err) != 0) return -1;
        save_live(pts[i].cold ? DS4_KVC_COLD : DS4_KVC_CONTINUED);
        if (!pts[i].cold) frontier_done = pts[i].pos;
    }
    return ds4_session_sync(sess, r->prompt.ids, n, on_progress, j, err);
}

/* ------------------------------------------------------------ generation */

typedef struct gen_ctx {
    out_ctx out;
    job *j;
    uint32_t step;
    int32_t last;       /* the last token handed out */
} gen_ctx;

static void on_token(void *ctx, int32_t t, ds4_gen_control *ctl) {
    gen_ctx *g = ctx;
    uint32_t n = ds4_session_n_tokens(sess);
    /* The logits the token was chosen from (the session has not taken it
     * yet), for logprobs; read before a checkpoint save. */
    const float *logits = ds4_session_logits(sess);
    if (g->step && n % g->step == 0 && n > frontier_done && !out_in_tool_block(&g->out)) {
        save_live(DS4_KVC_CONTINUED);
        frontier_done = n;
    }
    g->last = t;
    out_token(&g->out, t, logits, (int)S->engine->w->cfg.n_vocab, ctl);
}

/* The test hook's output: a string, or an array of strings tokenized one
 * by one (so a test can force a tokenization that is not the canonical one
 * of the same text, as sampling produces). */
static int forced_tokens(const job *j, ds4_tokens *out, ds4_err *err) {
    const json_t *t = json_object_get(S->forced, j->req.force_name);
    for (size_t i = 0; json_is_array(t) && i < json_array_size(t); i++) {
        const json_t *p = json_array_get(t, i);
        if (!json_is_string(p) ||
            ds4_tokenize_transcript(tok, json_string_value(p), json_string_length(p), out, err) != 0)
            return ds4_err_set(err, DS4_EINVAL, "test output \"%s\": element %zu is not a string", j->req.force_name, i);
    }
    if (json_is_array(t)) return 0;
    if (!json_is_string(t)) return ds4_err_set(err, DS4_ENOTFOUND, "no test output named \"%s\"", j->req.force_name);
    return ds4_tokenize_transcript(tok, json_string_value(t), json_string_length(t), out, err);
}

static bool prompt_thinking(const job *j) {
    const char *t = j->rendered.text.p;
    size_t n = j->rendered.text.len, l = strlen(DS4_TOK_THINK);
    return n >= l && memcmp(t + n - l, DS4_TOK_THINK, l) == 0;
}

static void fail_job(job *j, int status, const char *msg, const char *code) {
    api_error e = {.status = status, .code = code};
    snprintf(e.message, sizeof(e.message), "%s", msg);
    snprintf(j->out.error, sizeof(j->out.error), "%s", msg);
    if (j->req.stream) {
        ds4_strbuf b = {0};
        j->api->stream_error(j, msg, &b);
        job_push(j, &b);
        ds4_strbuf_free(&b);
        job_finish(j, 200, NULL);
    } else {
        job_finish(j, status, api_error_body(j->api, &e));
    }
}

/* A job's prefill finished: its prompt's tokens and KV source. */
static void count_prefill(const job *j, const char *source) {
    const gen_out *o = &j->out;
    pthread_mutex_lock(&S->stats_mu);
    C.prompt_tokens += o->prompt_tokens;
    C.reused_tokens += o->cached_tokens;
    C.prefilled_tokens += o->written_tokens;
    for (size_t i = 0; i < N_SOURCES; i++)
        if (strcmp(source, SOURCES[i]) == 0) C.by_source[i]++;
    snprintf(C.last_source, sizeof(C.last_source), "%s", source);
    C.last_reused = o->cached_tokens;
    C.last_prefilled = o->written_tokens;
    pthread_mutex_unlock(&S->stats_mu);
}

static void count_outcome(outcome k, uint32_t generated) {
    const ds4_spec *sp = ds4_session_spec(sess);
    pthread_mutex_lock(&S->stats_mu);
    C.ended[k]++;
    C.generated_tokens += generated;
    if (sp) C.mtp = sp->stats;
    pthread_mutex_unlock(&S->stats_mu);
}

static int on_stop_only(void *ctx, uint32_t done, uint32_t total) {
    (void)ctx, (void)done, (void)total;
    return S->stopping;
}

/* Canonicalization (as ds4 does it; chat/completions and Anthropic, as
 * Responses keeps its live state): after a tool-call turn whose sampled
 * text is not what the client will send back (exact replay off, or its ids
 * forgotten), rewrite the live tail to the rendering of the turn the next
 * request will carry, while the client runs its tools; the next request is
 * then a plain token-prefix hit.  The session goes back to the longest
 * state it can reach (the in-memory checkpoint of the prompt, else a
 * rebuild) and prefills the rest. */
static void canonicalize_tail(job *j, int32_t last, bool pending) {
    ds4_tokens live = {0}, canon = {0};
    ds4_strbuf text = {0}, live_text = {0};
    ds4_tokens_append(&live, ds4_session_tokens(sess), ds4_session_n_tokens(sess));
    if (pending && last != ds4_vocab_find_added(S->engine->vocab, DS4_TOK_EOS, strlen(DS4_TOK_EOS)))
        ds4_tokens_push(&live, last);
    if (cont_canonical(S, j, tok, &text, &canon) == 0 && canon.n < S->o.ctx &&
        ds4_detokenize(S->engine->vocab, live.ids, live.n, &live_text, NULL) == 0 &&
        (live_text.len != text.len || memcmp(live_text.p, text.p, text.len) != 0)) {
        uint32_t common = 0;
        while (common < live.n && common < canon.n && live.ids[common] == canon.ids[common]) common++;
        ds4_err err = {0};
        double t0 = ds4_now();
        if (ds4_session_sync(sess, canon.ids, (uint32_t)canon.n, on_stop_only, NULL, &err) == 0) {
            const ds4_session_stats *st = ds4_session_get_stats(sess);
            srv_log("tool", "%s %s: canonicalized the live tail (%zu live tokens, %u in common, %zu canonical; %llu restored, %llu prefilled in %.2f s)",
                    j->api->name, j->id, live.n, common, canon.n, (unsigned long long)st->restored,
                    (unsigned long long)st->prefilled, ds4_now() - t0);
            if (vis_tokens) vis_tokens = ds4_session_n_tokens(sess);
            cont_rebind(ds4_session_tokens(sess), ds4_session_n_tokens(sess));
            pthread_mutex_lock(&S->stats_mu);
            C.canonicalized++;
            pthread_mutex_unlock(&S->stats_mu);
        } else {
            srv_log("tool", "%s %s: canonicalization failed: %s", j->api->name, j->id, err.msg);
            vis_tokens = 0;
            cont_leave();
        }
    }
    ds4_tokens_free(&live);
    ds4_tokens_free(&canon);
    ds4_strbuf_free(&text);
    ds4_strbuf_free(&live_text);
}

static outcome generate(job *j, const reuse *r, double t_prefill) {
    gen_out *o = &j->out;
    ds4_err err = {0};
    gen_ctx g = {.j = j, .step = store ? ds4_kvc_continued_step(&S->o.kv_policy) : 0};
    ds4_sampler smp;
    ds4_tokens forced = {0};
    if (j->req.force_name && forced_tokens(j, &forced, &err) != 0) {
        fail_job(j, 400, err.msg, NULL);
        return FAILED;
    }
    /* While the model thinks: ds4's default sampling (the client's seed),
     * the client's settings from </think> on (output.c). */
    bool thinking = prompt_thinking(j);
    ds4_sampler_params sp = j->req.sp;
    if (thinking && !S->o.client_sampling_in_thinking) {
        ds4_sampler_defaults(&sp);
        sp.seed = j->req.sp.seed;
    }
    if (out_init(&g.out, j, S->engine->vocab, thinking, &err) != 0 || out_constrain(&g.out, S->cvocab, &err) != 0 ||
        ds4_sampler_init(&smp, &sp, (int)S->engine->w->cfg.n_vocab, &err) != 0) {
        out_free(&g.out);
        ds4_tokens_free(&forced);
        fail_job(j, 500, err.msg, NULL);
        return FAILED;
    }
    g.out.smp = &smp;
    g.out.answer_sp = j->req.sp;
    g.out.switch_sp = thinking && !S->o.client_sampling_in_thinking;
    uint32_t room = S->o.ctx - (uint32_t)r->prompt.n - 1;
    uint32_t max = j->req.max_tokens ? j->req.max_tokens : S->o.default_max_tokens;
    ds4_gen_opts go = {.max_tokens = max < room ? max : room, .cancel = &j->cancel, .forced = forced.ids,
                       .n_forced = (uint32_t)forced.n, .restrict_fn = g.out.cons ? out_restrict : NULL,
                       .restrict_ctx = &g.out};
    if (go.max_tokens == 0) go.max_tokens = 1;
    ds4_gen_result res;
    int rc = ds4_generate(sess, &smp, &go, on_token, &g, &res, &err);
    out_finish(&g.out, res.finish);
    o->completion_tokens = res.n_generated;
    if (rc != 0) snprintf(o->error, sizeof(o->error), "generation failed: %s", err.msg);
    if (res.finish == DS4_FINISH_CANCELLED)
        snprintf(o->error, sizeof(o->error), "%s", S->stopping ? "shutdown requested" : "cancelled");
    size_t raw_n;
    const char *raw = out_raw_calls(&g.out, &raw_n);
    /* Remember a thinking answer for visible_prefix (see above). */
    ds4_strbuf_truncate(&vis_prompt, 0);
    vis_tokens = 0;
    if (prompt_thinking(j) && o->think_closed && strcmp(o->finish, "error") != 0) {
        ds4_strbuf_append(&vis_prompt, j->rendered.text.p, j->rendered.text.len);
        vis_tokens = vis_prompt.failed ? 0 : ds4_session_n_tokens(sess);
    }
    if (o->n_calls && raw_n) {
        const char *ids[64];
        int n = 0;
        for (size_t i = 0; i < o->n_calls && n < 64; i++) ids[n++] = o->calls[i].id;
        toolmem_put_many(S->tools, ids, n, raw, raw_n);
    }
    /* Bind the live session to the protocol (after the replay memory: the
     * visible transcript renders the calls as the next request will). */
    bool pending = res.finish == DS4_FINISH_EOS || res.finish == DS4_FINISH_LENGTH || res.finish == DS4_FINISH_CALLBACK;
    if (res.n_generated) cont_remember(S, j, ds4_session_tokens(sess), ds4_session_n_tokens(sess), g.last, pending);
    bool canon = (j->api->kind == API_CHAT || j->api->kind == API_MESSAGES) && o->n_calls && !strcmp(o->finish, "tool_calls");
    srv_log("generate", "%s %s: prompt of %u tokens (KV from %s: %u reused, %u prefilled in %.2f s), generated %u in "
            "%.2f s (%.1f t/s), finish %s%s%s",
            j->api->name, j->id, o->prompt_tokens, r->source, o->cached_tokens, o->written_tokens, t_prefill,
            res.n_generated, res.seconds, res.seconds > 0 ? res.n_generated / res.seconds : 0.0, o->finish,
            o->error[0] ? ": " : "", o->error);
    outcome k = res.finish == DS4_FINISH_CANCELLED ? CANCELLED : strcmp(o->finish, "error") == 0 ? FAILED : ANSWERED;
    trace_result(j);
    if (j->req.stream) {
        if (!strcmp(o->finish, "error") && j->api->kind != API_RESPONSES) j->api->stream_error(j, o->error, &g.out.sse);
        else j->api->stream_end(j, &g.out.sse);
        out_flush(&g.out);
        job_finish(j, 200, NULL);
    } else if (!strcmp(o->finish, "error")) {
        api_error e = {.status = 500};
        snprintf(e.message, sizeof(e.message), "%s", o->error);
        job_finish(j, 500, api_error_body(j->api, &e));
    } else {
        job_finish(j, 200, j->api->final_body(j));
    }
    /* After the answer went out: the client does not wait for it. */
    if (canon) canonicalize_tail(j, g.last, pending);
    ds4_sampler_free(&smp);
    out_free(&g.out);
    ds4_tokens_free(&forced);
    return k;
}

/* Run a job to its answer; how it ended. */
static outcome run(job *j) {
    gen_out *o = &j->out;
    o->prompt_tokens = (uint32_t)j->tokens.n;
    if (j->cancel || S->stopping) {
        fail_job(j, 503, S->stopping ? "server shutting down" : "cancelled", NULL);
        return CANCELLED;
    }
    reuse r;
    api_error ce = {0};
    if (choose_reuse(j, &r, &ce) != 0) {
        trace_decision(j, "continuation-lost");
        fail_job(j, ce.status, ce.message, NULL);
        ds4_tokens_free(&r.prompt);
        return CONTINUATION_LOST;
    }
    snprintf(j->reuse, sizeof(j->reuse), "%s", r.source);
    cont_warn_lost_reasoning(j, r.source);
    trace_decision(j, r.source);
    if (r.prompt.n >= S->o.ctx) {
        char msg[200];
        snprintf(msg, sizeof(msg), "Prompt has %zu tokens, but the configured context size is %u tokens", r.prompt.n, S->o.ctx);
        fail_job(j, 400, msg, "context_length_exceeded");
        ds4_tokens_free(&r.prompt);
        return FAILED;
    }
    o->prompt_tokens = (uint32_t)r.prompt.n;
    o->cached_tokens = r.kept;
    o->written_tokens = (uint32_t)r.prompt.n - r.kept;
    if (j->req.stream) {
        ds4_strbuf b = {0};
        j->api->stream_begin(j, &b);
        job_push(j, &b);
        ds4_strbuf_free(&b);
    }
    ds4_err err = {0};
    double t0 = ds4_now();
    if (prefill(j, &r, &err) != 0) {
        bool cancelled = err.code == DS4_EINTERRUPTED;
        srv_log("prefill", "%s %s: %s", j->api->name, j->id, err.msg);
        fail_job(j, cancelled ? 503 : 500, cancelled ? (S->stopping ? "server shutting down" : "cancelled") : err.msg, NULL);
        ds4_tokens_free(&r.prompt);
        return cancelled ? CANCELLED : FAILED;
    }
    double t_prefill = ds4_now() - t0;
    count_prefill(j, r.source);
    if (S->memory_checkpoint) {
        ds4_tokens_free(&ck_tokens);
        if (ds4_session_checkpoint(sess, &err) == 0) ds4_tokens_append(&ck_tokens, r.prompt.ids, r.prompt.n);
        else srv_log("kvcache", "memory checkpoint failed: %s", err.msg);
    }
    outcome k = generate(j, &r, t_prefill);
    ds4_tokens_free(&r.prompt);
    return k;
}

static void run_job(job *j) {
    outcome k = run(j);
    count_outcome(k, j->out.completion_tokens);
}

/* ------------------------------------------------------------ queue */

static void *worker_main(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&qmu);
        while (qn == 0 && !qstop) pthread_cond_wait(&qcv, &qmu);
        if (qn == 0) {
            pthread_mutex_unlock(&qmu);
            break;
        }
        job *j = queue[qhead];
        qhead = (qhead + 1) % qcap;
        qn--;
        current = j;
        pthread_mutex_lock(&j->mu);
        j->started = true;
        pthread_mutex_unlock(&j->mu);
        pthread_mutex_unlock(&qmu);
        run_job(j);
        pthread_mutex_lock(&qmu);
        current = NULL;
        pthread_mutex_unlock(&qmu);
        job_unref(j);
    }
    return NULL;
}

static void log_kvc(void *ctx, const char *msg) {
    (void)ctx;
    srv_log("kvcache", "%s", msg);
}

static void restore_tool(void *ctx, const ds4_kvc_tool *t) {
    server *s = ctx;
    char id[DS4_KVC_MAX_ID + 1];
    snprintf(id, sizeof(id), "%.*s", (int)t->id_len, t->id);
    toolmem_put(s->tools, id, t->dsml, t->dsml_len);
}

int worker_start(server *s, ds4_err *err) {
    S = s;
    if (!(sess = ds4_session_new(s->engine, s->o.ctx, err)) ||
        (s->engine->mtp && ds4_session_enable_mtp(sess, s->o.mtp.draft, s->o.mtp.margin, err)) ||
        !(tok = ds4_tokenizer_new(s->engine->vocab, err)) ||
        !(s->cvocab = cvocab_new(s->engine->vocab, err)))
        return -1;
    user_tok = ds4_vocab_find_added(s->engine->vocab, DS4_TOK_USER, strlen(DS4_TOK_USER));
    assistant_tok = ds4_vocab_find_added(s->engine->vocab, DS4_TOK_ASSISTANT, strlen(DS4_TOK_ASSISTANT));
    if (s->o.kv_dir) {
        ds4_kvc_opts ko = {.dir = s->o.kv_dir, .budget_bytes = s->o.kv_space_mb << 20,
                           .min_tokens = s->o.kv_policy.min_tokens, .quant_bits = ds4_engine_quant_bits(s->engine),
                           .reject_different_quant = s->o.kv_reject_different_quant, .ctx = s->o.ctx,
                           .max_tools = 4 * (size_t)s->o.tool_memory_max_ids, .vocab = s->engine->vocab,
                           .log = log_kvc};
        if (!(store = ds4_kvc_open(&ko, err)) || !(scratch = ds4_session_state_new(sess, err))) return -1;
        ds4_kvc_stats st = ds4_kvc_get_stats(store);
        srv_log("kvcache", "%s: %llu files, %llu MB of %llu MB", s->o.kv_dir, (unsigned long long)st.files,
                (unsigned long long)(st.bytes >> 20), (unsigned long long)s->o.kv_space_mb);
        if (s->o.exact_replay) ds4_kvc_each_tool(store, restore_tool, s);
    }
    qcap = s->o.queue_max;
    if (!(queue = calloc((size_t)qcap, sizeof(*queue)))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (pthread_create(&thread, NULL, worker_main, NULL) != 0) return ds4_err_set(err, DS4_EIO, "cannot start the worker thread");
    thread_started = true;
    return 0;
}

int worker_enqueue(job *j) {
    pthread_mutex_lock(&qmu);
    int rc = 0;
    if (qstop || S->stopping) rc = -2;
    else if (qn >= qcap) rc = -1;
    if (rc == 0) {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        queue[(qhead + qn) % qcap] = j;
        qn++;
        pthread_cond_signal(&qcv);
    }
    pthread_mutex_unlock(&qmu);
    pthread_mutex_lock(&S->stats_mu);
    if (rc == 0) {
        C.queued++;
        S->replay.replayed += j->calls.replayed;
        S->replay.canonical += j->calls.canonical;
    }
    if (rc == -1) C.rejected_queue_full++;
    if (rc == -2) C.rejected_shutting_down++;
    pthread_mutex_unlock(&S->stats_mu);
    return rc;
}

int worker_queue_depth(void) {
    pthread_mutex_lock(&qmu);
    int n = qn;
    pthread_mutex_unlock(&qmu);
    return n;
}

static int worker_running(void) {
    pthread_mutex_lock(&qmu);
    int n = current != NULL;
    pthread_mutex_unlock(&qmu);
    return n;
}

void worker_stop(void) {
    if (!thread_started) return;
    pthread_mutex_lock(&qmu);
    qstop = true;
    if (current) current->cancel = 1;
    /* Queued jobs are answered 503 by run_job (S->stopping is set). */
    pthread_cond_broadcast(&qcv);
    pthread_mutex_unlock(&qmu);
    pthread_join(thread, NULL);
    thread_started = false;
    save_live(DS4_KVC_SHUTDOWN);
    ds4_kvc_close(store);
    store = NULL;
    ds4_tokenizer_free(tok);
    ds4_kv_state_free(scratch);
    ds4_session_free(sess);
    ds4_strbuf_free(&vis_prompt);
    ds4_tokens_free(&ck_tokens);
    cont_free();
    free(queue);
    cvocab_free(S->cvocab);
    S->cvocab = NULL;
}

json_t *worker_stats(void) {
    pthread_mutex_lock(&S->stats_mu);
    counters c = C;
    replay_stats rs = S->replay;
    pthread_mutex_unlock(&S->stats_mu);
    json_t *kv = json_null();
    if (store) {
        ds4_kvc_stats k = ds4_kvc_get_stats(store);
        json_t *by_reason = json_object();
        for (int i = 1; i <= DS4_KVC_SHUTDOWN; i++)
            json_object_set_new(by_reason, REASON_NAMES[i], json_integer((json_int_t)c.disk_writes[i]));
        kv = json_pack("{s:I,s:I,s:I,s:o,s:I,s:I,s:I,s:I,s:I}", "files", (json_int_t)k.files, "bytes", (json_int_t)k.bytes,
                       "files_written", (json_int_t)k.stores, "files_written_by_reason", by_reason,
                       "writes_skipped_over_budget", (json_int_t)k.store_skips, "loads", (json_int_t)k.loads,
                       "load_failures", (json_int_t)k.load_failures, "files_evicted", (json_int_t)k.evictions,
                       "corrupt_files_deleted", (json_int_t)k.corrupt);
    }
    json_t *sources = json_object();
    for (size_t i = 0; i < N_SOURCES; i++) json_object_set_new(sources, SOURCES[i], json_integer((json_int_t)c.by_source[i]));
    json_t *mtp = json_null();
    if (S->engine->mtp) {
        const ds4_spec_stats *m = &c.mtp;
        mtp = json_pack("{s:i,s:I,s:I,s:I,s:f,s:f}", "draft", (int)S->o.mtp.draft, "verifications", (json_int_t)m->cycles,
                        "drafted", (json_int_t)m->drafted, "accepted", (json_int_t)m->accepted, "acceptance_rate",
                        m->drafted ? (double)m->accepted / (double)m->drafted : 0.0, "tokens_per_verification",
                        m->cycles ? (double)(m->accepted + m->cycles) / (double)m->cycles : 0.0);
    }
    return json_pack("{s:{s:I,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I},s:{s:I,s:I,s:I,s:I},s:o,s:{s:s,s:i,s:i},s:o,"
                     "s:{s:I,s:I,s:I,s:I},s:o}",
                     "jobs", "queued", (json_int_t)c.queued, "waiting", worker_queue_depth(), "running", worker_running(),
                     "answered", (json_int_t)c.ended[ANSWERED], "failed", (json_int_t)c.ended[FAILED], "cancelled",
                     (json_int_t)c.ended[CANCELLED], "continuation_lost", (json_int_t)c.ended[CONTINUATION_LOST],
                     "rejected_queue_full", (json_int_t)c.rejected_queue_full, "rejected_shutting_down",
                     (json_int_t)c.rejected_shutting_down,
                     "tokens", "prompt", (json_int_t)c.prompt_tokens, "reused", (json_int_t)c.reused_tokens, "prefilled",
                     (json_int_t)c.prefilled_tokens, "generated", (json_int_t)c.generated_tokens,
                     "prompts_by_kv_source", sources,
                     "last_prompt", "kv_source", c.last_source, "reused", (int)c.last_reused, "prefilled",
                     (int)c.last_prefilled,
                     "kvcache", kv,
                     "tool_memory", "ids_remembered", (json_int_t)toolmem_count(S->tools), "history_turns_replayed_exact",
                     (json_int_t)rs.replayed, "history_turns_rendered_canonical", (json_int_t)rs.canonical,
                     "live_tails_canonicalized", (json_int_t)c.canonicalized, "mtp", mtp);
}
