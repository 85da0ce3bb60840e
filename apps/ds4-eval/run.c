/*
 * run.c - one question through the model (eval.h): the question rendered
 * as a one-turn chat, generation with the thinking-budget controls, the
 * reply graded.
 *
 * The budget controls act while the model thinks, counting the tokens
 * left of --tokens: within the last --soft-limit-reply-budget of them,
 * </think> is chosen as soon as it ranks among the
 * --soft-limit-think-close-rank most likely tokens; within the last
 * --hard-limit-reply-budget it is forced.  So a long chain of thought
 * still leaves room for the answer line, as in ds4's eval.
 */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine/session.h"
#include "engine/startup.h"
#include "eval.h"
#include "text/chat.h"
#include "text/rendered.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"

struct eval_runner {
    const eval_opts *o;
    const eval_hooks *h;
    ds4_engine *e;
    ds4_session *s;
    ds4_tokenizer *tk;
    ds4_sampler smp;
    bool smp_ready;
    int32_t think_end, eos;
    uint32_t ctx;
};

static int render(eval_runner *r, const eval_question *q, ds4_tokens *out, ds4_err *err) {
    char *user = eval_prompt(q);
    json_t *msgs = json_array();
    if (r->o->system && *r->o->system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", r->o->system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", user));
    ds4_chat_opts co = {.think = (ds4_think_mode)r->o->think, .ctx_size = r->ctx};
    ds4_rendered rd = {0};
    int rc = ds4_chat_render(msgs, &co, &rd, err);
    if (rc == 0) rc = ds4_tokenize_rendered(r->tk, &rd, out, err);
    ds4_rendered_free(&rd);
    json_decref(msgs);
    free(user);
    return rc;
}

eval_runner *eval_runner_new(const eval_opts *o, const eval_hooks *h, const eval_set *set, ds4_err *err) {
    eval_runner *r = calloc(1, sizeof(*r));
    if (!r) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    r->o = o;
    r->h = h;
    ds4_engine_opts eo = {.model_path = o->model,
                          .backend = o->backend,
                          .n_threads = o->threads,
                          .no_sim = o->no_sim,
                          .need_vocab = true};
    ds4_cli_steering_opts(&o->steer, &eo);
    if (ds4_model_file_check(o->model, err) || !(r->e = ds4_engine_open(&eo, err)) ||
        !(r->tk = ds4_tokenizer_new(r->e->vocab, err)))
        goto fail;
    if (o->warm_weights && ds4_startup_warm("ds4-eval", r->e->w, o->threads, NULL, NULL) != 0) {
        ds4_err_set(err, DS4_EIO, "--warm-weights did not finish");
        goto fail;
    }
    r->think_end = ds4_vocab_find_added(r->e->vocab, DS4_TOK_THINK_END, strlen(DS4_TOK_THINK_END));
    r->eos = r->e->eos;
    r->ctx = o->ctx;
    if (!r->ctx) {
        /* the largest prompt plus the reply budget, within the model's limit */
        uint64_t most = 0;
        for (size_t i = 0; i < set->n; i++) {
            ds4_tokens t = {0};
            if (render(r, &set->q[i], &t, err)) goto fail;
            if (t.n > most) most = t.n;
            ds4_tokens_free(&t);
        }
        uint64_t want = most + o->max_tokens + 1;
        r->ctx = want > DS4_CTX_MAX ? DS4_CTX_MAX : (uint32_t)want;
    }
    ds4_startup_print_memory("ds4-eval", r->e->backend_name, r->e->w, r->ctx);
    if (!(r->s = ds4_session_new(r->e, r->ctx, err))) goto fail;
    if (ds4_sampler_init(&r->smp, &o->sp, (int)r->e->w->cfg.n_vocab, err)) goto fail;
    r->smp_ready = true;
    return r;
fail:
    eval_runner_free(r);
    return NULL;
}

void eval_runner_free(eval_runner *r) {
    if (!r) return;
    if (r->smp_ready) ds4_sampler_free(&r->smp);
    ds4_session_free(r->s);
    ds4_tokenizer_free(r->tk);
    ds4_engine_close(r->e);
    free(r);
}

const char *eval_runner_backend(const eval_runner *r) { return r->e->backend_name; }
uint32_t eval_runner_ctx(const eval_runner *r) { return r->ctx; }

/* How many tokens score above the </think> token. */
static uint32_t rank_of(const float *logits, uint32_t n, int32_t tok) {
    uint32_t above = 0;
    for (uint32_t i = 0; i < n; i++) above += logits[i] > logits[tok];
    return above;
}

/* The scripted reply's tokens (special tokens recognised), or none. */
static int script_tokens(eval_runner *r, const eval_question *q, ds4_tokens *out, bool *scripted, ds4_err *err) {
    const char *text = r->h && r->h->script_for ? r->h->script_for(r->h->ctx, q->id) : NULL;
    *scripted = text != NULL;
    if (!text) return 0;
    return ds4_tokenize_transcript(r->tk, text, strlen(text), out, err);
}

static void set_status(const eval_sink *sink, eval_result *res, eval_status st) {
    res->status = st;
    if (sink && sink->status) sink->status(sink->ctx, st);
}

int eval_run_question(eval_runner *r, const eval_question *q, eval_result *res, const eval_sink *sink, FILE *trace,
                      ds4_err *err) {
    const eval_opts *o = r->o;
    ds4_tokens prompt = {0}, script = {0};
    ds4_strbuf reply = {0};
    memset(res, 0, sizeof(*res));
    double t0 = ds4_now();
    int rc = -1;
    bool scripted = false;
    if (render(r, q, &prompt, err) || script_tokens(r, q, &script, &scripted, err)) goto done;
    res->prompt_tokens = (uint32_t)prompt.n;
    if (prompt.n + 1 >= r->ctx) {
        snprintf(res->why, sizeof(res->why), "the prompt's %zu tokens do not fit the context of %u", prompt.n, r->ctx);
        set_status(sink, res, EVAL_SKIPPED);
        rc = 0;
        goto done;
    }
    set_status(sink, res, EVAL_PREFILL);
    if (ds4_session_sync(r->s, prompt.ids, (uint32_t)prompt.n, NULL, NULL, err)) goto done;
    bool thinking = o->think != DS4_THINK_OFF && r->think_end >= 0;
    set_status(sink, res, thinking ? EVAL_THINKING : EVAL_ANSWERING);
    uint32_t V = r->e->w->cfg.n_vocab;
    size_t si = 0;
    bool stopped = false;
    while (res->gen_tokens < o->max_tokens && ds4_session_n_tokens(r->s) + 1 < r->ctx) {
        if (sink && sink->stop && sink->stop(sink->ctx)) {
            stopped = true;
            break;
        }
        const float *lg = ds4_session_logits(r->s);
        uint32_t left = o->max_tokens - res->gen_tokens;
        int32_t tok = -1;
        if (thinking && left <= o->hard_budget) tok = r->think_end;
        else if (thinking && left <= o->soft_budget && rank_of(lg, V, r->think_end) < o->close_rank) tok = r->think_end;
        if (tok >= 0 && scripted) {
            /* the script's own thinking is cut where the control closed it */
            while (si < script.n && script.ids[si] != r->think_end) si++;
            if (si < script.n) si++;
        } else if (tok < 0) {
            tok = scripted ? (si < script.n ? script.ids[si++] : r->eos) : ds4_sample(&r->smp, lg);
        }
        if (tok == r->eos) break;
        ds4_str piece = ds4_vocab_token_bytes(r->e->vocab, tok);
        ds4_strbuf_append(&reply, piece.ptr, piece.len);
        if (sink && sink->text) sink->text(sink->ctx, piece.ptr, piece.len, thinking);
        res->gen_tokens++;
        if (tok == r->think_end && thinking) {
            thinking = false;
            set_status(sink, res, EVAL_ANSWERING);
        }
        if (ds4_session_eval(r->s, tok, err)) goto done;
    }
    ds4_strbuf_putc(&reply, 0);
    if (stopped) {
        snprintf(res->got, sizeof(res->got), "-");
        snprintf(res->why, sizeof(res->why), "stopped by the user after %u tokens", res->gen_tokens);
        set_status(sink, res, EVAL_STOPPED);
    } else {
        bool ok = eval_grade(q, reply.p, res->got, sizeof(res->got), res->why, sizeof(res->why));
        set_status(sink, res, ok ? EVAL_PASSED : EVAL_FAILED);
    }
    rc = 0;
done:
    res->seconds = ds4_now() - t0;
    if (trace && rc == 0) {
        char *user = eval_prompt(q);
        fprintf(trace, "=== %s (%s)\n--- question\n%s\n--- reply (%u tokens)\n%s\n--- %s: %s\n\n", q->id,
                q->source ? q->source : "", user, res->gen_tokens, reply.p ? reply.p : "",
                eval_status_name(res->status), res->why);
        fflush(trace);
        free(user);
    }
    ds4_strbuf_free(&reply);
    ds4_tokens_free(&prompt);
    ds4_tokens_free(&script);
    return rc;
}
