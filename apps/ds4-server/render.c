/*
 * render.c - a parsed request to prompt tokens, in the connection thread:
 * the chat renderer (src/text/chat.h, with the tool-id memory's exact
 * replay hook) and the tokenizer, then the context check (400
 * context_length_exceeded with the counts, as ds4 answers).
 * Tokenizers hold per-thread scratch space, so connection threads borrow
 * one from a small pool.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "text/tokenizer.h"

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static ds4_tokenizer *pool[8]; /* each holds a BPE cache of up to ~9 MB */
static int pool_n;

ds4_tokenizer *render_tokenizer_borrow(const ds4_vocab *v, ds4_err *err) {
    pthread_mutex_lock(&pool_mu);
    ds4_tokenizer *t = pool_n ? pool[--pool_n] : NULL;
    pthread_mutex_unlock(&pool_mu);
    return t ? t : ds4_tokenizer_new(v, err);
}

void render_tokenizer_return(ds4_tokenizer *t) {
    pthread_mutex_lock(&pool_mu);
    if (pool_n < (int)(sizeof(pool) / sizeof(pool[0]))) {
        pool[pool_n++] = t;
        t = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    ds4_tokenizer_free(t);
}

static const char *prompt_param(api_kind k) {
    return k == API_COMPLETIONS ? "prompt" : k == API_RESPONSES ? "input" : "messages";
}

ds4_chat_opts render_opts(server *s, const job *j) {
    return (ds4_chat_opts){.think = j->req.think, .ctx_size = s->o.ctx, .tools = j->req.tools,
                           .render_calls = toolmem_render_calls, .render_calls_ctx = s};
}

int render_request(server *s, job *j, api_error *e) {
    ds4_chat_opts o = render_opts(s, j);
    ds4_err err = {0};
    if (ds4_chat_render(j->req.messages, &o, &j->rendered, &err) != 0)
        return api_fail(e, 400, "cannot render the conversation: %s", err.msg);
    ds4_tokenizer *t = render_tokenizer_borrow(s->engine->vocab, &err);
    if (!t) return api_fail(e, 500, "tokenizer: %s", err.msg);
    int rc = ds4_tokenize_rendered(t, &j->rendered, &j->tokens, &err);
    render_tokenizer_return(t);
    if (rc != 0) return api_fail(e, 400, "cannot tokenize the prompt: %s", err.msg);
    if (j->tokens.n >= s->o.ctx) {
        e->code = "context_length_exceeded";
        e->param = prompt_param(j->api->kind);
        e->n_prompt = (long)j->tokens.n;
        e->n_ctx = (long)s->o.ctx;
        return api_fail(e, 400, "Prompt has %zu tokens, but the configured context size is %u tokens", j->tokens.n,
                        s->o.ctx);
    }
    return 0;
}

void render_pool_free(void) {
    pthread_mutex_lock(&pool_mu);
    while (pool_n) ds4_tokenizer_free(pool[--pool_n]);
    pthread_mutex_unlock(&pool_mu);
}
