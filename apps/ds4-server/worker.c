/*
 * worker.c - what a session's thread does with a job (scheduler.h): the KV
 * reuse ladder over its session, prefill with disk checkpoints, generation.
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
 * canonical rendering (canonicalize_tail) so that the next turn is a token hit.
 * Continued checkpoints are written whenever the live token count crosses
 * a multiple of the continued step, in prefill and in generation (not
 * inside a tool-call block), and the live session is saved at shutdown.
 *
 * Each session (slot) has its own ladder: its live tokens, its thinking
 * turn, its checkpoint, its continuation binding; the disk cache is shared
 * (saves and loads one at a time, through one scratch state).  Live and
 * checkpoint rungs only see the slot's own session: the scheduler sends a
 * job to the session that holds the most of it (scheduler.c).
 *
 * Cancellation: the connection thread sets job->cancel when its client goes
 * away; prefill checks it between chunks, the generation loop every token,
 * so the slot is free again after the step in flight.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "engine/session.h"
#include "constrain.h"
#include "output.h"
#include "scheduler.h"
#include "text/tokenizer.h"

const char *const KV_SOURCES[N_SOURCES] = {"responses-visible",
                                           "responses-tool-output",
                                           "anthropic-tool-output",
                                           "memory-token",
                                           "memory-text",
                                           "thinking-visible",
                                           "memory-checkpoint",
                                           "disk",
                                           "cold"};

const char *const KV_REASON_NAMES[7] = {"unknown",  "cold",         "continued",    "evict",
                                        "shutdown", "agent-system", "agent-session"};

/* ------------------------------------------------------------ disk saves */

/* The disk cache, or NULL while the slot's session is steered: a
 * checkpoint's key is its text, which does not say what steering computed
 * its state, so steered states are neither saved nor looked up. */
static ds4_kvc_store *disk_store(const slot *sl) {
    float ffn, attn;
    ds4_session_steering(sl->sess, &ffn, &attn);
    return ffn == 0.0f && attn == 0.0f ? sl->q->store : NULL;
}

void slot_save_live(slot *sl, ds4_kvc_reason reason) {
    uint32_t n = ds4_session_n_tokens(sl->sess);
    if (!disk_store(sl) || n < sl->s->o.kv_policy.min_tokens) return;
    ds4_strbuf text = {0};
    ds4_err err = {0};
    if (ds4_detokenize(sl->s->engine->vocab, ds4_session_tokens(sl->sess), n, &text, &err) != 0) {
        srv_log("kvcache", "save skipped: %s", err.msg);
        ds4_strbuf_free(&text);
        return;
    }
    if (ds4_kvc_contains(sl->q->store, text.p, text.len)) {
        ds4_strbuf_free(&text);
        return;
    }
    double t0 = ds4_now();
    size_t n_tools = 0;
    ds4_kvc_tool *tools = toolmem_entries_in(sl->s->tools, text.p, text.len, &n_tools);
    pthread_mutex_lock(&sl->q->store_mu);
    int rc = ds4_session_snapshot(sl->sess, sl->q->scratch, &err);
    if (rc == 0) rc = ds4_kvc_save(sl->q->store, reason, 0, text.p, text.len, sl->q->scratch, tools, n_tools, &err);
    pthread_mutex_unlock(&sl->q->store_mu);
    if (rc < 0) srv_log("kvcache", "%s save of %u tokens failed: %s", KV_REASON_NAMES[reason], n, err.msg);
    if (rc > 0) {
        srv_log("kvcache", "saved %u tokens (%s, %zu tool ids) in %.3f s", n, KV_REASON_NAMES[reason], n_tools,
                ds4_now() - t0);
        pthread_mutex_lock(&sl->s->stats_mu);
        sl->q->c.disk_writes[reason]++;
        pthread_mutex_unlock(&sl->s->stats_mu);
    }
    toolmem_entries_free(tools, n_tools);
    ds4_strbuf_free(&text);
}

/* ------------------------------------------------------------ reuse */

typedef struct reuse {
    ds4_tokens prompt; /* what the session will hold before generation */
    uint32_t kept;     /* tokens not prefilled */
    const char *source;
} reuse;

static bool live_token_prefix(slot *sl, const job *j) {
    uint32_t n = ds4_session_n_tokens(sl->sess);
    return n > 0 && n <= j->tokens.n && memcmp(ds4_session_tokens(sl->sess), j->tokens.ids, n * sizeof(int32_t)) == 0;
}

/* Live tokens + the rendered text after their bytes, when they decode to a
 * prefix of it. */
static bool live_text_prefix(slot *sl, const job *j, reuse *r) {
    uint32_t n = ds4_session_n_tokens(sl->sess);
    if (n == 0) return false;
    ds4_strbuf text = {0};
    bool ok = ds4_detokenize(sl->s->engine->vocab, ds4_session_tokens(sl->sess), n, &text, NULL) == 0 &&
              text.len <= j->rendered.text.len && memcmp(text.p, j->rendered.text.p, text.len) == 0;
    ds4_tokens suffix = {0};
    ok = ok && ds4_tokenize_rendered_from(sl->tok, &j->rendered, text.len, &suffix, NULL) == 0;
    if (ok) {
        ds4_tokens_append(&r->prompt, ds4_session_tokens(sl->sess), n);
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
static bool visible_prefix(slot *sl, const job *j, reuse *r) {
    uint32_t n = ds4_session_n_tokens(sl->sess);
    if (!sl->vis_tokens || n != sl->vis_tokens || !sl->vis_prompt.len) return false;
    ds4_strbuf live = {0};
    bool ok = false;
    const char *close = NULL;
    size_t pl = sl->vis_prompt.len, tl = strlen(DS4_TOK_THINK), cl = strlen(DS4_TOK_THINK_END);
    if (ds4_detokenize(sl->s->engine->vocab, ds4_session_tokens(sl->sess), n, &live, NULL) == 0 && live.len >= pl &&
        memcmp(live.p, sl->vis_prompt.p, pl) == 0)
        close = memmem(live.p + pl, live.len - pl, DS4_TOK_THINK_END, cl);
    for (int form = 0; close && form < 2 && !ok; form++) {
        /* The visible text, piece by piece: prompt (minus <think> when the
         * reasoning is dropped), then everything from </think> on. */
        size_t head = form == 0 ? pl - tl : pl, rest = live.len - (size_t)(close - live.p);
        const char *t = j->rendered.text.p;
        if (head + rest > j->rendered.text.len || memcmp(t, sl->vis_prompt.p, head) != 0 ||
            memcmp(t + head, close, rest) != 0)
            continue;
        ds4_tokens suffix = {0};
        if (ds4_tokenize_rendered_from(sl->tok, &j->rendered, head + rest, &suffix, NULL) == 0) {
            ds4_tokens_append(&r->prompt, ds4_session_tokens(sl->sess), n);
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
static bool checkpoint_prefix(slot *sl, const job *j, reuse *r) {
    uint32_t ck = ds4_session_checkpoint_tokens(sl->sess);
    if (!ck || ck != sl->ck_tokens.n || ck <= r->kept || ck > j->tokens.n ||
        memcmp(sl->ck_tokens.ids, j->tokens.ids, ck * sizeof(int32_t)) != 0)
        return false;
    slot_save_live(sl, DS4_KVC_EVICT);
    ds4_err err = {0};
    if (ds4_session_sync(sl->sess, sl->ck_tokens.ids, ck, NULL, NULL, &err) != 0 ||
        ds4_session_n_tokens(sl->sess) != ck) {
        srv_log("kvcache", "memory checkpoint not usable: %s", err.msg);
        ds4_session_reset(sl->sess);
        return false;
    }
    ds4_tokens_free(&r->prompt);
    ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
    r->kept = ck;
    r->source = "memory-checkpoint";
    sl->frontier_done = 0;
    return true;
}

static bool disk_prefix(slot *sl, const job *j, reuse *r) {
    ds4_kvc_match m;
    ds4_kvc_store *store = disk_store(sl);
    if (!store || !ds4_kvc_lookup(store, j->rendered.text.p, j->rendered.text.len, &m) || m.n_tokens <= r->kept)
        return false;
    /* The live session is about to be replaced. */
    slot_save_live(sl, DS4_KVC_EVICT);
    ds4_err err = {0};
    ds4_tokens suffix = {0};
    pthread_mutex_lock(&sl->q->store_mu);
    int rc = ds4_kvc_load(store, &m, sl->q->scratch, &err);
    if (rc == 0) rc = ds4_session_restore(sl->sess, sl->q->scratch, &err);
    pthread_mutex_unlock(&sl->q->store_mu);
    if (rc != 0 || ds4_tokenize_rendered_from(sl->tok, &j->rendered, m.text_len, &suffix, &err) != 0) {
        srv_log("kvcache", "disk hit %s not usable: %s", m.name, err.msg);
        ds4_session_reset(sl->sess);
        ds4_tokens_free(&suffix);
        return false;
    }
    srv_log("kvcache", "disk hit %s: %u tokens", m.name, m.n_tokens);
    if (sl->s->o.kv_policy.cold_max_tokens && m.n_tokens > sl->s->o.kv_policy.cold_max_tokens)
        ds4_kvc_remove(store, m.name);
    ds4_tokens_free(&r->prompt);
    ds4_tokens_append(&r->prompt, ds4_session_tokens(sl->sess), ds4_session_n_tokens(sl->sess));
    ds4_tokens_append(&r->prompt, suffix.ids, suffix.n);
    ds4_tokens_free(&suffix);
    r->kept = m.n_tokens;
    r->source = "disk";
    sl->frontier_done = 0;
    return true;
}

/* 0, or -1 with e set when the request needs a live continuation that is
 * gone (409). */
static int choose_reuse(slot *sl, job *j, reuse *r, api_error *e) {
    memset(r, 0, sizeof(*r));
    int c = cont_match(sl->s, sl->cont, j, ds4_session_tokens(sl->sess), ds4_session_n_tokens(sl->sess), sl->tok,
                       &r->prompt, &r->kept, &r->source, e);
    /* The session moves on from here: the binding it had no longer holds. */
    cont_leave(sl->s, sl->cont);
    if (c != 0) {
        sl->vis_tokens = 0;
        return c < 0 ? -1 : 0;
    }
    if (live_token_prefix(sl, j)) {
        ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
        r->kept = ds4_session_n_tokens(sl->sess);
        r->source = "memory-token";
    } else if (!live_text_prefix(sl, j, r) && !visible_prefix(sl, j, r)) {
        if (ds4_session_n_tokens(sl->sess))
            srv_log("kvcache", "live kv cache miss (%u live tokens)", ds4_session_n_tokens(sl->sess));
    }
    sl->vis_tokens = 0;
    if (!r->source) checkpoint_prefix(sl, j, r);
    if (disk_prefix(sl, j, r)) return 0;
    if (r->source) return 0;
    if (ds4_session_n_tokens(sl->sess)) {
        /* Another conversation's state: to the disk cache, then gone. */
        slot_save_live(sl, DS4_KVC_EVICT);
        pthread_mutex_lock(&sl->s->stats_mu);
        sl->q->c.slots_evicted++;
        pthread_mutex_unlock(&sl->s->stats_mu);
    }
    ds4_session_reset(sl->sess);
    sl->frontier_done = 0;
    ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
    r->source = "cold";
    return 0;
}

/* ------------------------------------------------------------ prefill */

/* Room in the slot's session for n tokens: grown through the scheduler's
 * admission where it has less (sched_grow); false when the memory refused
 * it (logged with `otherwise`, what the job does instead). */
static bool room_for(slot *sl, uint64_t n, const char *otherwise) {
    if (!sl->q->sized || n <= ds4_session_capacity(sl->sess)) return true;
    return sched_grow(sl, n < sl->s->o.ctx ? (uint32_t)n : sl->s->o.ctx, otherwise);
}

/* Room for the prompt the ladder chose and a first granule of output.  A
 * reused state may hold more than the request's own tokens (hidden
 * reasoning kept, the model's own tokenization), beyond the size the job
 * was admitted with (a tool-output-only request's was sized with the live
 * tokens).  Without the memory for it, the prompt is prefilled from the
 * start in the admitted session instead. */
static void room_for_prompt(slot *sl, const job *j, reuse *r) {
    uint32_t g = sl->q->granule, out = j->max_out < g ? j->max_out : g;
    if (j->cont.tool_only || r->prompt.n >= sl->s->o.ctx ||
        room_for(sl, r->prompt.n + out + 1, "the prompt is prefilled from the start instead"))
        return;
    ds4_session_reset(sl->sess);
    sl->frontier_done = 0;
    ds4_tokens_free(&r->prompt);
    ds4_tokens_append(&r->prompt, j->tokens.ids, j->tokens.n);
    r->kept = 0;
    r->source = "cold";
}

static int on_progress(void *ctx, uint32_t done, uint32_t total) {
    const slot *sl = ctx;
    (void)done, (void)total;
    return sl->job->cancel || sl->s->stopping;
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
static int prefill(slot *sl, const reuse *r, ds4_err *err) {
    uint32_t n = (uint32_t)r->prompt.n, at = ds4_session_n_tokens(sl->sess);
    save_point pts[66];
    uint32_t np = 0;
    if (disk_store(sl) && strcmp(r->source, "cold") == 0) {
        uint32_t b = ds4_kvc_cold_boundary(&sl->s->o.kv_policy, r->prompt.ids, n, sl->q->user_tok,
                                           sl->q->assistant_tok);
        if (b > at) pts[np++] = (save_point){b, true};
    }
    uint32_t step = disk_store(sl) ? ds4_kvc_continued_step(&sl->s->o.kv_policy) : 0;
    for (uint32_t f = step ? (at / step + 1) * step : 0; step && f <= n && np < 64; f += step)
        pts[np++] = (save_point){f, false};
    qsort(pts, np, sizeof(pts[0]), by_pos);
    for (uint32_t i = 0; i < np; i++) {
        if (i && pts[i].pos == pts[i - 1].pos) continue;
        if (ds4_session_sync(sl->sess, r->prompt.ids, pts[i].pos, on_progress, sl, err) != 0) return -1;
        slot_save_live(sl, pts[i].cold ? DS4_KVC_COLD : DS4_KVC_CONTINUED);
        if (!pts[i].cold) sl->frontier_done = pts[i].pos;
    }
    return ds4_session_sync(sl->sess, r->prompt.ids, n, on_progress, sl, err);
}

/* ------------------------------------------------------------ generation */

typedef struct gen_ctx {
    out_ctx out;
    slot *sl;
    job *j;
    uint32_t step;
    int32_t last;      /* the last token handed out */
    bool grow_refused; /* its session could not grow: the answer ended there */
} gen_ctx;

/* The generation loop's grow hook (engine/generate.h): the session at its
 * end grows through the scheduler's admission (sched_grow). */
static int on_grow(void *ctx, uint32_t need) {
    gen_ctx *g = ctx;
    if (sched_grow(g->sl, need, "its answer ends here (finish length)")) return 0;
    g->grow_refused = true;
    return -1;
}

static void on_token(void *ctx, int32_t t, ds4_gen_control *ctl) {
    gen_ctx *g = ctx;
    slot *sl = g->sl;
    uint32_t n = ds4_session_n_tokens(sl->sess);
    /* The logits the token was chosen from (the session has not taken it
     * yet), for logprobs; read before a checkpoint save. */
    const float *logits = ds4_session_logits(sl->sess);
    if (g->step && n % g->step == 0 && n > sl->frontier_done && !out_in_tool_block(&g->out)) {
        slot_save_live(sl, DS4_KVC_CONTINUED);
        sl->frontier_done = n;
    }
    g->last = t;
    sched_count_generated(sl->q, 1);
    out_token(&g->out, t, logits, (int)sl->s->engine->w->cfg.n_vocab, ctl);
}

/* The test hook's output: a string, or an array of strings tokenized one
 * by one (so a test can force a tokenization that is not the canonical one
 * of the same text, as sampling produces). */
static int forced_tokens(slot *sl, const job *j, ds4_tokens *out, ds4_err *err) {
    const json_t *t = json_object_get(sl->s->forced, j->req.force_name);
    for (size_t i = 0; json_is_array(t) && i < json_array_size(t); i++) {
        const json_t *p = json_array_get(t, i);
        if (!json_is_string(p) ||
            ds4_tokenize_transcript(sl->tok, json_string_value(p), json_string_length(p), out, err) != 0)
            return ds4_err_set(err, DS4_EINVAL, "test output \"%s\": element %zu is not a string", j->req.force_name,
                               i);
    }
    if (json_is_array(t)) return 0;
    if (!json_is_string(t)) return ds4_err_set(err, DS4_ENOTFOUND, "no test output named \"%s\"", j->req.force_name);
    return ds4_tokenize_transcript(sl->tok, json_string_value(t), json_string_length(t), out, err);
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

static int on_stop_only(void *ctx, uint32_t done, uint32_t total) {
    const server *s = ctx;
    (void)done, (void)total;
    return s->stopping;
}

/* Canonicalization (as ds4 does it; chat/completions and Anthropic, as
 * Responses keeps its live state): after a tool-call turn whose sampled
 * text is not what the client will send back (exact replay off, or its ids
 * forgotten), rewrite the live tail to the rendering of the turn the next
 * request will carry, while the client runs its tools; the next request is
 * then a plain token-prefix hit.  The session goes back to the longest
 * state it can reach (the in-memory checkpoint of the prompt, else a
 * rebuild) and prefills the rest. */
static void canonicalize_tail(slot *sl, job *j, int32_t last, bool pending) {
    ds4_tokens live = {0}, canon = {0};
    ds4_strbuf text = {0}, live_text = {0};
    ds4_tokens_append(&live, ds4_session_tokens(sl->sess), ds4_session_n_tokens(sl->sess));
    if (pending && last != ds4_vocab_find_added(sl->s->engine->vocab, DS4_TOK_EOS, strlen(DS4_TOK_EOS)))
        ds4_tokens_push(&live, last);
    if (cont_canonical(sl->s, j, sl->tok, &text, &canon) == 0 && canon.n < sl->s->o.ctx &&
        ds4_detokenize(sl->s->engine->vocab, live.ids, live.n, &live_text, NULL) == 0 &&
        (live_text.len != text.len || memcmp(live_text.p, text.p, text.len) != 0) &&
        room_for(sl, canon.n + 1, "the tool-call turn stays as sampled")) {
        uint32_t common = 0;
        while (common < live.n && common < canon.n && live.ids[common] == canon.ids[common]) common++;
        ds4_err err = {0};
        double t0 = ds4_now();
        if (ds4_session_sync(sl->sess, canon.ids, (uint32_t)canon.n, on_stop_only, sl->s, &err) == 0) {
            const ds4_session_stats *st = ds4_session_get_stats(sl->sess);
            srv_log(
                "tool",
                "%s %s: canonicalized the live tail (%zu live tokens, %u in common, %zu canonical; %llu restored, %llu prefilled in %.2f s)",
                j->api->name, j->id, live.n, common, canon.n, (unsigned long long)st->restored,
                (unsigned long long)st->prefilled, ds4_now() - t0);
            if (sl->vis_tokens) sl->vis_tokens = ds4_session_n_tokens(sl->sess);
            cont_rebind(sl->s, sl->cont, ds4_session_tokens(sl->sess), ds4_session_n_tokens(sl->sess));
            pthread_mutex_lock(&sl->s->stats_mu);
            sl->q->c.canonicalized++;
            pthread_mutex_unlock(&sl->s->stats_mu);
        } else {
            srv_log("tool", "%s %s: canonicalization failed: %s", j->api->name, j->id, err.msg);
            sl->vis_tokens = 0;
            cont_leave(sl->s, sl->cont);
        }
    }
    ds4_tokens_free(&live);
    ds4_tokens_free(&canon);
    ds4_strbuf_free(&text);
    ds4_strbuf_free(&live_text);
}

static outcome generate(slot *sl, job *j, const reuse *r, double t_prefill) {
    gen_out *o = &j->out;
    ds4_err err = {0};
    gen_ctx g = {.sl = sl, .j = j, .step = disk_store(sl) ? ds4_kvc_continued_step(&sl->s->o.kv_policy) : 0};
    ds4_sampler smp;
    ds4_tokens forced = {0};
    if (j->req.force_name && forced_tokens(sl, j, &forced, &err) != 0) {
        fail_job(j, 400, err.msg, NULL);
        return FAILED;
    }
    /* While the model thinks: ds4's default sampling (the client's seed),
     * the client's settings from </think> on (output.c). */
    bool thinking = prompt_thinking(j);
    ds4_sampler_params sp = j->req.sp;
    if (thinking && !sl->s->o.client_sampling_in_thinking) {
        ds4_sampler_defaults(&sp);
        sp.seed = j->req.sp.seed;
    }
    if (out_init(&g.out, j, sl->s->engine->vocab, thinking, &err) != 0 ||
        out_constrain(&g.out, sl->s->cvocab, &err) != 0 ||
        ds4_sampler_init(&smp, &sp, (int)sl->s->engine->w->cfg.n_vocab, &err) != 0) {
        out_free(&g.out);
        ds4_tokens_free(&forced);
        fail_job(j, 500, err.msg, NULL);
        return FAILED;
    }
    g.out.smp = &smp;
    g.out.answer_sp = j->req.sp;
    g.out.switch_sp = thinking && !sl->s->o.client_sampling_in_thinking;
    uint32_t room = sl->s->o.ctx - (uint32_t)r->prompt.n - 1;
    uint32_t max = j->max_out; /* its max_tokens, or the default the memory allows (scheduler.c) */
    ds4_gen_opts go = {.max_tokens = max < room ? max : room,
                       .cancel = &j->cancel,
                       .forced = forced.ids,
                       .n_forced = (uint32_t)forced.n,
                       .restrict_fn = g.out.cons ? out_restrict : NULL,
                       .restrict_ctx = &g.out,
                       .grow_fn = sl->q->sized ? on_grow : NULL,
                       .grow_ctx = &g};
    if (go.max_tokens == 0) go.max_tokens = 1;
    ds4_gen_result res;
    int rc = ds4_generate(sl->sess, &smp, &go, on_token, &g, &res, &err);
    /* A growth refused because the job was cancelled meanwhile ends it as
     * cancelled; otherwise the answer ends for want of memory. */
    if (g.grow_refused && res.finish == DS4_FINISH_LENGTH) {
        if (j->cancel || sl->s->stopping) res.finish = DS4_FINISH_CANCELLED;
        else o->memory_cut = true;
    }
    out_finish(&g.out, res.finish);
    o->completion_tokens = res.n_generated;
    if (rc != 0) snprintf(o->error, sizeof(o->error), "generation failed: %s", err.msg);
    if (res.finish == DS4_FINISH_CANCELLED)
        snprintf(o->error, sizeof(o->error), "%s", sl->s->stopping ? "shutdown requested" : "cancelled");
    size_t raw_n;
    const char *raw = out_raw_calls(&g.out, &raw_n);
    /* Remember a thinking answer for visible_prefix (see above). */
    ds4_strbuf_truncate(&sl->vis_prompt, 0);
    sl->vis_tokens = 0;
    if (prompt_thinking(j) && o->think_closed && strcmp(o->finish, "error") != 0) {
        ds4_strbuf_append(&sl->vis_prompt, j->rendered.text.p, j->rendered.text.len);
        sl->vis_tokens = sl->vis_prompt.failed ? 0 : ds4_session_n_tokens(sl->sess);
    }
    if (o->n_calls && raw_n) {
        const char *ids[64];
        int n = 0;
        for (size_t i = 0; i < o->n_calls && n < 64; i++) ids[n++] = o->calls[i].id;
        toolmem_put_many(sl->s->tools, ids, n, raw, raw_n);
    }
    /* Bind the live session to the protocol (after the replay memory: the
     * visible transcript renders the calls as the next request will). */
    bool pending = res.finish == DS4_FINISH_EOS || res.finish == DS4_FINISH_LENGTH || res.finish == DS4_FINISH_CALLBACK;
    if (res.n_generated)
        cont_remember(sl->s, sl->cont, j, ds4_session_tokens(sl->sess), ds4_session_n_tokens(sl->sess), g.last,
                      pending);
    bool canon = (j->api->kind == API_CHAT || j->api->kind == API_MESSAGES) && o->n_calls &&
                 !strcmp(o->finish, "tool_calls");
    srv_log("generate",
            "%s %s (session %u): prompt of %u tokens (KV from %s: %u reused, %u prefilled in %.2f s), generated %u in "
            "%.2f s (%.1f t/s), finish %s%s%s%s",
            j->api->name, j->id, sl->index, o->prompt_tokens, r->source, o->cached_tokens, o->written_tokens, t_prefill,
            res.n_generated, res.seconds, res.seconds > 0 ? res.n_generated / res.seconds : 0.0, o->finish,
            o->memory_cut ? " (stopped by memory: its session could not grow)" : "", o->error[0] ? ": " : "", o->error);
    outcome k = res.finish == DS4_FINISH_CANCELLED ? CANCELLED : strcmp(o->finish, "error") == 0 ? FAILED : ANSWERED;
    trace_result(&sl->s->trace, j);
    sched_count_mtp(sl);
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
    if (canon) canonicalize_tail(sl, j, g.last, pending);
    ds4_sampler_free(&smp);
    out_free(&g.out);
    ds4_tokens_free(&forced);
    return k;
}

/* The request's steering scales (the server's where it gives none).  A
 * change makes the slot's live state and memory checkpoint useless (they
 * were computed with other scales): the live one goes to the disk cache
 * first when it was unsteered, then the session starts over. */
static int apply_steering(slot *sl, job *j) {
    float ffn = j->req.steer_ffn_set ? j->req.steer_ffn : sl->s->o.steer.ffn;
    float attn = j->req.steer_attn_set ? j->req.steer_attn : sl->s->o.steer.attn;
    float cur_ffn, cur_attn;
    ds4_session_steering(sl->sess, &cur_ffn, &cur_attn);
    if (ffn == cur_ffn && attn == cur_attn) return 0;
    ds4_err err = {0};
    if (ds4_engine_steering_check(sl->s->engine, ffn, attn, &err) != 0) {
        fail_job(j, 400, "dir_steering: the server has no direction file (start it with --dir-steering-file)", NULL);
        return -1;
    }
    slot_save_live(sl, DS4_KVC_EVICT);
    if (ds4_session_set_steering(sl->sess, ffn, attn, &err) != 0) {
        fail_job(j, 400, err.msg, NULL);
        return -1;
    }
    ds4_tokens_free(&sl->ck_tokens);
    sl->frontier_done = 0;
    srv_log("steering", "scales ffn %g, attn %g: the session starts over", ffn, attn);
    return 0;
}

/* The slot's session made to hold the job's tokens (the size it was
 * admitted with, scheduler.c: its prompt and a first granule of output),
 * growing with its state kept.  Then, after the ladder dropped the state
 * (a cold start), a session larger than that shrinks to it: memory for
 * the jobs waiting.  It grows again as the answer needs (on_grow). */
static int size_session(slot *sl, job *j, bool after_ladder) {
    ds4_err err = {0};
    uint32_t have = ds4_session_capacity(sl->sess);
    int rc = 0;
    if (!after_ladder) rc = ds4_session_reserve(sl->sess, j->cap, &err);
    else if (ds4_session_n_tokens(sl->sess) == 0 && have > j->cap) rc = ds4_session_fit(sl->sess, j->cap, &err);
    if (ds4_session_capacity(sl->sess) != have) sched_resized(sl);
    if (rc == 0) return 0;
    char msg[1200];
    snprintf(msg, sizeof(msg), "a session of %u tokens: %s", j->cap, err.msg);
    srv_log("generate", "%s %s: %s", j->api->name, j->id, msg);
    fail_job(j, 503, msg, NULL);
    return -1;
}

void slot_evict(slot *sl) {
    slot_save_live(sl, DS4_KVC_EVICT);
    srv_log("kvcache", "session %u freed (%u tokens, %u held) for a waiting request", sl->index,
            ds4_session_n_tokens(sl->sess), ds4_session_capacity(sl->sess));
    ds4_session_release(sl->sess);
    cont_leave(sl->s, sl->cont);
    ds4_tokens_free(&sl->ck_tokens);
    ds4_strbuf_truncate(&sl->vis_prompt, 0);
    sl->vis_tokens = 0;
    ds4_strbuf_truncate(&sl->prompt_text, 0);
    sl->frontier_done = 0;
}

/* Run a job to its answer; how it ended. */
outcome slot_run(slot *sl, job *j) {
    gen_out *o = &j->out;
    /* set again once the prompt is prefilled (the scheduler reads it) */
    ds4_strbuf_truncate(&sl->prompt_text, 0);
    o->prompt_tokens = (uint32_t)j->tokens.n;
    if (j->cancel || sl->s->stopping) {
        fail_job(j, 503, sl->s->stopping ? "server shutting down" : "cancelled", NULL);
        return CANCELLED;
    }
    if (apply_steering(sl, j) != 0 || size_session(sl, j, false) != 0) return FAILED;
    reuse r;
    api_error ce = {0};
    if (choose_reuse(sl, j, &r, &ce) != 0) {
        trace_decision(&sl->s->trace, j, "continuation-lost");
        fail_job(j, ce.status, ce.message, NULL);
        ds4_tokens_free(&r.prompt);
        return CONTINUATION_LOST;
    }
    if (size_session(sl, j, true) != 0) {
        ds4_tokens_free(&r.prompt);
        return FAILED;
    }
    room_for_prompt(sl, j, &r);
    snprintf(j->reuse, sizeof(j->reuse), "%s", r.source);
    cont_warn_lost_reasoning(j, r.source);
    trace_decision(&sl->s->trace, j, r.source);
    if (r.prompt.n >= sl->s->o.ctx) {
        char msg[200];
        snprintf(msg, sizeof(msg), "Prompt has %zu tokens, but the configured context size is %u tokens", r.prompt.n,
                 sl->s->o.ctx);
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
    if (prefill(sl, &r, &err) != 0) {
        bool cancelled = err.code == DS4_EINTERRUPTED;
        bool broken = ds4_dist_failed(sl->s->engine->opts.dist, NULL); /* the pipeline lost a rank */
        srv_log("prefill", "%s %s: %s", j->api->name, j->id, err.msg);
        fail_job(j, cancelled || broken ? 503 : 500,
                 cancelled ? (sl->s->stopping ? "server shutting down" : "cancelled") : err.msg, NULL);
        ds4_tokens_free(&r.prompt);
        return cancelled ? CANCELLED : FAILED;
    }
    double t_prefill = ds4_now() - t0;
    ds4_strbuf_append(&sl->prompt_text, j->rendered.text.p, j->rendered.text.len);
    if (sl->prompt_text.failed) ds4_strbuf_truncate(&sl->prompt_text, 0);
    sched_count_prefill(sl->q, j, r.source);
    if (sl->s->memory_checkpoint) {
        ds4_tokens_free(&sl->ck_tokens);
        if (ds4_session_checkpoint(sl->sess, &err) == 0) ds4_tokens_append(&sl->ck_tokens, r.prompt.ids, r.prompt.n);
        else srv_log("kvcache", "memory checkpoint failed: %s", err.msg);
    }
    outcome k = generate(sl, j, &r, t_prefill);
    ds4_tokens_free(&r.prompt);
    return k;
}

void slot_free_state(slot *sl) {
    ds4_tokenizer_free(sl->tok);
    ds4_session_free(sl->sess);
    ds4_strbuf_free(&sl->vis_prompt);
    ds4_strbuf_free(&sl->prompt_text);
    ds4_tokens_free(&sl->ck_tokens);
    sl->tok = NULL;
    sl->sess = NULL;
}
