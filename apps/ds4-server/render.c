/*
 * render.c - a parsed request to prompt tokens, in the connection thread:
 * the chat renderer (src/text/chat.h, with the tool-id memory's exact
 * replay hook) and the tokenizer, then the context check (400
 * context_length_exceeded with the counts, as ds4 answers).
 * Tokenizers hold per-thread scratch space, so connection threads borrow
 * one from a small pool.
 *
 * The context check costs little however large the prompt: a text longer
 * than ctx times the longest token's bytes cannot fit and is refused
 * without tokenizing it, and tokenization stops as soon as the prompt
 * holds more tokens than the context (the error then says "at least").
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "text/tokenizer.h"

void render_pool_init(server *s) { pthread_mutex_init(&s->tokenizers.mu, NULL); }

ds4_tokenizer *render_tokenizer_borrow(server *s, ds4_err *err) {
    render_pool *p = &s->tokenizers;
    pthread_mutex_lock(&p->mu);
    ds4_tokenizer *t = p->n ? p->t[--p->n] : NULL;
    pthread_mutex_unlock(&p->mu);
    return t ? t : ds4_tokenizer_new(s->engine->vocab, err);
}

void render_tokenizer_return(server *s, ds4_tokenizer *t) {
    if (!t) return;
    render_pool *p = &s->tokenizers;
    ds4_tokenizer_set_limit(t, 0);
    pthread_mutex_lock(&p->mu);
    if (p->n < (int)(sizeof(p->t) / sizeof(p->t[0]))) {
        p->t[p->n++] = t;
        t = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    ds4_tokenizer_free(t);
}

static const char *prompt_param(api_kind k) {
    return k == API_COMPLETIONS ? "prompt" : k == API_RESPONSES ? "input" : "messages";
}

ds4_chat_opts render_opts(server *s, const job *j, render_calls_ctx *calls) {
    calls->s = s;
    return (ds4_chat_opts){.think = j->req.think,
                           .ctx_size = s->o.ctx,
                           .tools = j->req.tools,
                           .render_calls = toolmem_render_calls,
                           .render_calls_ctx = calls};
}

static int too_long(server *s, const job *j, size_t n_tokens, bool at_least, api_error *e) {
    e->code = "context_length_exceeded";
    e->param = prompt_param(j->api->kind);
    e->n_prompt = (long)n_tokens;
    e->n_ctx = (long)s->o.ctx;
    return api_fail(e, 400, "Prompt has %s%zu tokens, but the configured context size is %u tokens",
                    at_least ? "at least " : "", n_tokens, s->o.ctx);
}

/* Render, refuse a text that cannot fit by its length alone, tokenize
 * (stopping past `limit` tokens when nonzero). */
static int render_tokens(server *s, job *j, size_t limit, api_error *e) {
    ds4_chat_opts o = render_opts(s, j, &j->calls);
    ds4_err err = {0};
    if (ds4_chat_render(j->req.messages, &o, &j->rendered, &err) != 0)
        return api_fail(e, 400, "cannot render the conversation: %s", err.msg);
    size_t mtb = s->max_token_bytes;
    if (mtb && j->rendered.text.len / mtb >= s->o.ctx) return too_long(s, j, j->rendered.text.len / mtb, true, e);
    ds4_tokenizer *t = render_tokenizer_borrow(s, &err);
    if (!t) return api_fail(e, 500, "tokenizer: %s", err.msg);
    ds4_tokenizer_set_limit(t, limit);
    int rc = ds4_tokenize_rendered(t, &j->rendered, &j->tokens, &err);
    render_tokenizer_return(s, t);
    if (rc != 0 && err.code == DS4_ERANGE) return too_long(s, j, j->tokens.n, true, e);
    if (rc != 0) return api_fail(e, 400, "cannot tokenize the prompt: %s", err.msg);
    return 0;
}

int render_request(server *s, job *j, api_error *e) {
    if (render_tokens(s, j, s->o.ctx, e) != 0) return -1;
    if (j->tokens.n >= s->o.ctx) return too_long(s, j, j->tokens.n, false, e);
    return 0;
}

int render_count(server *s, job *j, api_error *e) { return render_tokens(s, j, 0, e); }

void render_pool_free(server *s) {
    render_pool *p = &s->tokenizers;
    while (p->n) ds4_tokenizer_free(p->t[--p->n]);
    pthread_mutex_destroy(&p->mu);
}
