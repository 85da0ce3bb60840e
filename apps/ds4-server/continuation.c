/*
 * continuation.c - live protocol continuations (rungs 1-3 of the KV reuse
 * ladder, worker.c): the Responses and Anthropic turns
 * the live session can continue without matching the prompt against its
 * tokens.
 *
 * After a Responses or Anthropic answer the worker binds the live session
 * to the protocol (cont_remember):
 *   - the frontier: the turn's tokens, i.e. the session's plus the last
 *     token handed out when the session does not hold it yet (the closing
 *     marker of a tool-call block; a final EOS is left out);
 *   - the call ids of the answer's tool calls;
 *   - Responses only: the visible transcript, the prompt of the next turn
 *     up to this answer's EOS as the client will replay it (the request's
 *     items plus the answer's output items; the hidden reasoning is not
 *     among them unless a summary was emitted).
 * The next request then continues the live state, hidden reasoning
 * included, in one of three ways (cont_match):
 *   responses-visible      its rendered text starts with the visible
 *                          transcript: frontier + EOS + the rest, tokenized
 *   responses-tool-output  it carries only function_call_output items whose
 *                          call ids are exactly the live ones: frontier +
 *                          EOS + "<｜User｜><tool_result>…" + "<｜Assistant｜>"
 *   anthropic-tool-output  the same for Anthropic tool_result blocks
 * The tail of a tool-output request is rendered by the chat renderer (the
 * official encoding, results in the order of the live calls), and each
 * piece after EOS starts a new segment, so the prompt has the tokens a
 * full re-render of the conversation would give.
 *
 * Ids are checked when the request arrives (cont_prepare): a tool output
 * whose id neither answers a call earlier in the same request nor belongs
 * to the live binding is refused (400).  The ids of a binding stay known
 * after the session moved on (cont_leave), so that a late tool-output-only
 * request learns the state is gone (409, cont_match) rather than that its
 * ids are unknown.
 *
 * Each session has its binding (s->bindings[i]), which its thread owns;
 * connection threads and the scheduler read them under s->cont_mu.  A tool
 * output is known when any session's binding holds its id, and a
 * tool-output-only request is sent to that session (cont_affinity).
 */
#include <stdlib.h>
#include <string.h>

#include "server.h"

typedef char call_id[48];

struct cont_binding {
    api_kind api;    /* API_RESPONSES or API_MESSAGES when bound */
    bool live;       /* the session still holds the frontier */
    uint32_t n_live; /* session tokens when bound */
    ds4_tokens frontier;
    ds4_strbuf visible; /* Responses; empty when not known */
    call_id *ids;
    size_t n_ids;
};

int cont_bindings_new(server *s, uint32_t n, ds4_err *err) {
    pthread_mutex_init(&s->cont_mu, NULL);
    if (!(s->bindings = calloc(n, sizeof(*s->bindings)))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    s->n_bindings = n;
    return 0;
}

cont_binding *cont_binding_at(server *s, uint32_t i) { return &s->bindings[i]; }

void cont_bindings_free(server *s) {
    if (!s->bindings) return;
    for (uint32_t i = 0; i < s->n_bindings; i++) {
        cont_binding *b = &s->bindings[i];
        free(b->ids);
        ds4_tokens_free(&b->frontier);
        ds4_strbuf_free(&b->visible);
    }
    free(s->bindings);
    s->bindings = NULL;
    s->n_bindings = 0;
    pthread_mutex_destroy(&s->cont_mu);
}

static const char *api_word(api_kind k) { return k == API_RESPONSES ? "Responses" : "Anthropic"; }

static const char *history_word(api_kind k) { return k == API_RESPONSES ? "input" : "messages"; }

static bool has_id(const call_id *ids, size_t n, const char *id) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0) return true;
    return false;
}

/* Index of id in a binding's calls (n_ids when not there). */
static size_t live_index(const cont_binding *b, const char *id) {
    size_t i = 0;
    while (i < b->n_ids && strcmp(b->ids[i], id) != 0) i++;
    return i;
}

/* The binding whose calls hold id, NULL when none (under cont_mu). */
static const cont_binding *binding_of(const server *s, const char *id) {
    for (uint32_t i = 0; i < s->n_bindings; i++)
        if (live_index(&s->bindings[i], id) < s->bindings[i].n_ids) return &s->bindings[i];
    return NULL;
}

/* ------------------------------------------------- connection thread */

/* A call with this id among the assistant turns before message `before`. */
static bool earlier_call(const json_t *msgs, size_t before, const char *id) {
    for (size_t i = 0; i < before; i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *calls = json_object_get(m, "tool_calls");
        for (size_t c = 0; role && strcmp(role, "assistant") == 0 && c < json_array_size(calls); c++) {
            const char *cid = json_string_value(json_object_get(json_array_get(calls, c), "id"));
            if (cid && strcmp(cid, id) == 0) return true;
        }
    }
    return false;
}

/* Every tool output answers a call of the same request or a live one. */
static int check_ids(server *s, const json_t *msgs, api_kind k, api_error *e) {
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *id = json_string_value(json_object_get(m, "tool_call_id"));
        if (!role || strcmp(role, "tool") != 0 || !id || earlier_call(msgs, i, id)) continue;
        pthread_mutex_lock(&s->cont_mu);
        bool live = binding_of(s, id) != NULL;
        pthread_mutex_unlock(&s->cont_mu);
        if (!live)
            return api_fail(e, 400,
                            "%s continuation state is not available for %s %s; retry by replaying the full %s history",
                            api_word(k), k == API_RESPONSES ? "call_id" : "tool_use_id", id, history_word(k));
    }
    return 0;
}

/* Only tool outputs (and system text, already in the live prompt). */
static bool tool_only(const json_t *msgs) {
    size_t tools = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const char *role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
        if (role && strcmp(role, "tool") == 0) tools++;
        else if (!role || strcmp(role, "system") != 0) return false;
    }
    return tools > 0;
}

static int by_live_order(const void *a, const void *b, void *ctx) {
    const cont_binding *bd = ctx;
    const char *x = json_string_value(json_object_get(*(json_t *const *)a, "tool_call_id"));
    const char *y = json_string_value(json_object_get(*(json_t *const *)b, "tool_call_id"));
    size_t i = bd ? live_index(bd, x) : 0, k = bd ? live_index(bd, y) : 0;
    return i < k ? -1 : i > k;
}

/* The tool outputs as the turn that follows the live answer: the chat
 * renderer's user turn of tool results (sorted by the live calls' order,
 * as it sorts them after the calling turn) and the assistant transition. */
static int render_tail(server *s, job *j, api_error *e) {
    const json_t *msgs = j->req.messages;
    json_t **tools = calloc(json_array_size(msgs), sizeof(*tools));
    json_t *arr = json_array();
    cont_req *c = &j->cont;
    c->ids = calloc(json_array_size(msgs), sizeof(*c->ids));
    if (!tools || !arr || !c->ids) {
        free(tools);
        json_decref(arr);
        return api_fail(e, 500, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (strcmp(json_string_value(json_object_get(m, "role")), "tool") != 0) continue;
        tools[n] = m;
        snprintf(c->ids[n++], sizeof(call_id), "%s", json_string_value(json_object_get(m, "tool_call_id")));
    }
    c->n_ids = n;
    pthread_mutex_lock(&s->cont_mu);
    /* Live ids are distinct; equal keys (an id sent twice) fail the id-set
     * check at execution anyway, so qsort's instability does not matter.
     * The order is the one of the binding that holds the first id (the
     * ids of the others then fail the check too). */
    qsort_r(tools, n, sizeof(*tools), by_live_order, n ? (void *)binding_of(s, c->ids[0]) : NULL);
    pthread_mutex_unlock(&s->cont_mu);
    for (size_t i = 0; i < n; i++) json_array_append(arr, tools[i]);
    free(tools);
    /* No BOS, no tools block (both are in the live prompt); Think Max's
     * prefix belongs after BOS only, the marker is the same as High's. */
    ds4_chat_opts o = {.think = j->req.think == DS4_THINK_MAX ? DS4_THINK_HIGH : j->req.think, .no_bos = true};
    ds4_rendered r = {0};
    ds4_err err = {0};
    int rc = ds4_chat_render(arr, &o, &r, &err);
    json_decref(arr);
    if (rc != 0) {
        ds4_rendered_free(&r);
        return api_fail(e, 400, "cannot render the tool outputs: %s", err.msg);
    }
    ds4_tokenizer *t = render_tokenizer_borrow(s, &err);
    rc = t ? ds4_tokenize_rendered(t, &r, &c->tail, &err) : -1;
    if (t) render_tokenizer_return(s, t);
    ds4_rendered_free(&r);
    if (rc != 0) return api_fail(e, 500, "cannot tokenize the tool outputs: %s", err.msg);
    c->tool_only = true;
    return 0;
}

int cont_prepare(server *s, job *j, api_error *e) {
    api_kind k = j->api->kind;
    if (k != API_RESPONSES && k != API_MESSAGES) return 0;
    if (check_ids(s, j->req.messages, k, e)) return -1;
    return tool_only(j->req.messages) ? render_tail(s, j, e) : 0;
}

/* ------------------------------------------------------------ worker */

static bool same_id_set(const cont_binding *b, const cont_req *c) {
    if (c->n_ids != b->n_ids) return false;
    for (size_t i = 0; i < c->n_ids; i++)
        if (!has_id(b->ids, b->n_ids, c->ids[i]) || !has_id((const call_id *)c->ids, c->n_ids, b->ids[i])) return false;
    return true;
}

static int eos_token(server *s) { return ds4_vocab_find_added(s->engine->vocab, DS4_TOK_EOS, strlen(DS4_TOK_EOS)); }

/* frontier + EOS + tail */
static void continued_prompt(server *s, const cont_binding *b, const int32_t *tail, size_t n, ds4_tokens *prompt) {
    ds4_tokens_append(prompt, b->frontier.ids, b->frontier.n);
    ds4_tokens_push(prompt, eos_token(s));
    ds4_tokens_append(prompt, tail, n);
}

int cont_affinity(server *s, const cont_binding *b, const job *j) {
    api_kind k = j->api->kind;
    int a = 0;
    pthread_mutex_lock(&s->cont_mu);
    if (b->live && b->api == k) {
        const ds4_strbuf *text = &j->rendered.text;
        if (j->cont.tool_only) a = same_id_set(b, &j->cont) ? 2 : 0;
        else if (k == API_RESPONSES && b->visible.len && text->len >= b->visible.len &&
                 memcmp(text->p, b->visible.p, b->visible.len) == 0)
            a = 1;
    }
    pthread_mutex_unlock(&s->cont_mu);
    return a;
}

/* The session's thread owns its binding: reading it needs no lock, changing
 * it takes cont_mu (connection threads read the ids). */
int cont_match(server *s, cont_binding *b, const job *j, const int32_t *live, uint32_t n_live, ds4_tokenizer *t,
               ds4_tokens *prompt, uint32_t *kept, const char **source, api_error *e) {
    api_kind k = j->api->kind;
    bool state = b->live && b->api == k && n_live && n_live == b->n_live && n_live <= b->frontier.n &&
                 eos_token(s) >= 0 && memcmp(live, b->frontier.ids, n_live * sizeof(int32_t)) == 0;
    if (j->cont.tool_only) {
        if (!state || !same_id_set(b, &j->cont)) {
            srv_log("kvcache", "%s tool outputs: live continuation state is gone", api_word(k));
            return api_fail(e, 409, "%s continuation state is not available; retry by replaying the full %s history",
                            api_word(k), history_word(k));
        }
        continued_prompt(s, b, j->cont.tail.ids, j->cont.tail.n, prompt);
        *kept = n_live;
        *source = k == API_RESPONSES ? "responses-tool-output" : "anthropic-tool-output";
        return 1;
    }
    const ds4_strbuf *text = &j->rendered.text;
    if (k != API_RESPONSES || !state || !b->visible.len || text->len < b->visible.len ||
        memcmp(text->p, b->visible.p, b->visible.len) != 0)
        return 0;
    ds4_tokens rest = {0};
    if (ds4_tokenize_rendered_from(t, &j->rendered, b->visible.len, &rest, NULL) != 0) {
        ds4_tokens_free(&rest);
        return 0;
    }
    continued_prompt(s, b, rest.ids, rest.n, prompt);
    ds4_tokens_free(&rest);
    *kept = n_live;
    *source = "responses-visible";
    return 1;
}

void cont_warn_lost_reasoning(const job *j, const char *source) {
    if (j->api->kind != API_RESPONSES || j->req.think == DS4_THINK_OFF || !strncmp(source, "responses-", 10) ||
        !strcmp(source, "thinking-visible"))
        return;
    const json_t *msgs = j->req.messages;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "assistant") && json_array_size(json_object_get(m, "tool_calls")) &&
            !json_object_get(m, "reasoning_content")) {
            srv_log("warning",
                    "responses %s: input[] replays a tool-call turn without its reasoning item and no live "
                    "state holds it: the model continues without its reasoning (lower fidelity)",
                    j->id);
            return;
        }
    }
}

void cont_leave(server *s, cont_binding *b) {
    pthread_mutex_lock(&s->cont_mu);
    b->live = false;
    pthread_mutex_unlock(&s->cont_mu);
}

/* The request's messages plus the answer as the client replays it
 * (reasoning only when `reasoning`), then an empty user turn: rendered,
 * everything before that turn is the next request's prompt up to this
 * answer's EOS (a following user turn is what decides how the answer
 * renders, reasoning dropped or kept).  Accepted only when it leaves the
 * prompt untouched but for its final <think> turning into </think>: the
 * live tokens spell the same text with the hidden reasoning in between.
 * Returns the length of that text in r (0 when not accepted). */
static size_t render_answer(server *s, const job *j, bool reasoning, ds4_rendered *r) {
    const gen_out *o = &j->out;
    json_t *msgs = json_copy(j->req.messages);
    json_t *a = json_pack("{s:s,s:s#}", "role", "assistant", "content", o->content.p ? o->content.p : "",
                          o->content.len);
    if (reasoning && o->reasoning.len)
        json_object_set_new(a, "reasoning_content", json_stringn(o->reasoning.p, o->reasoning.len));
    if (o->n_calls) {
        json_t *calls = json_array();
        for (size_t i = 0; i < o->n_calls; i++)
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s#}}", "id", o->calls[i].id, "type", "function",
                                                   "function", "name", o->calls[i].name, "arguments",
                                                   o->calls[i].args.p ? o->calls[i].args.p : "", o->calls[i].args.len));
        json_object_set_new(a, "tool_calls", calls);
    }
    json_array_append_new(msgs, a);
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", ""));
    render_calls_ctx quiet = {0};
    ds4_chat_opts opts = render_opts(s, j, &quiet);
    opts.render_calls = toolmem_render_calls_quiet;
    ds4_err err = {0};
    bool think = j->req.think != DS4_THINK_OFF;
    ds4_strbuf tail = {0};
    ds4_strbuf_puts(&tail, DS4_TOK_USER DS4_TOK_ASSISTANT);
    ds4_strbuf_puts(&tail, think ? DS4_TOK_THINK : DS4_TOK_THINK_END);
    const ds4_strbuf *p = &j->rendered.text;
    size_t tl = strlen(DS4_TOK_THINK), el = strlen(DS4_TOK_EOS), n = 0;
    if (ds4_chat_render(msgs, &opts, r, &err) == 0 && r->text.len >= tail.len + el &&
        memcmp(r->text.p + r->text.len - tail.len, tail.p, tail.len) == 0) {
        size_t len = r->text.len - tail.len;
        const char *v = r->text.p;
        bool ends_eos = memcmp(v + len - el, DS4_TOK_EOS, el) == 0;
        bool same = len >= p->len && memcmp(v, p->p, p->len) == 0;
        bool dropped = think && p->len >= tl && len >= p->len - tl + strlen(DS4_TOK_THINK_END) &&
                       memcmp(p->p + p->len - tl, DS4_TOK_THINK, tl) == 0 && memcmp(v, p->p, p->len - tl) == 0 &&
                       memcmp(v + p->len - tl, DS4_TOK_THINK_END, strlen(DS4_TOK_THINK_END)) == 0;
        if (ends_eos && (same || dropped)) n = len;
    } else if (err.msg[0]) {
        srv_log("kvcache", "answer transcript not rendered: %s", err.msg);
    }
    ds4_strbuf_free(&tail);
    json_decref(msgs);
    return n;
}

/* Responses: the client replays the reasoning only as the summary it was
 * shown. */
static void visible_text(server *s, const job *j, ds4_strbuf *out) {
    ds4_rendered r = {0};
    size_t n = render_answer(s, j, j->req.reasoning_summary, &r);
    if (n) ds4_strbuf_append(out, r.text.p, n);
    ds4_rendered_free(&r);
}

int cont_canonical(server *s, const job *j, ds4_tokenizer *t, ds4_strbuf *text, ds4_tokens *out) {
    ds4_rendered r = {0};
    size_t n = render_answer(s, j, true, &r);
    int rc = -1;
    /* The rendering ends with EOS and the three markers of the empty user
     * turn, one special token each. */
    if (n && ds4_tokenize_rendered(t, &r, out, NULL) == 0 && out->n > 4 && out->ids[out->n - 4] == eos_token(s)) {
        out->n -= 4;
        ds4_strbuf_append(text, r.text.p, n - strlen(DS4_TOK_EOS));
        rc = text->failed || out->failed ? -1 : 0;
    }
    ds4_rendered_free(&r);
    return rc;
}

void cont_rebind(server *s, cont_binding *b, const int32_t *live, uint32_t n_live) {
    pthread_mutex_lock(&s->cont_mu);
    if (b->live) {
        ds4_tokens_free(&b->frontier);
        ds4_tokens_append(&b->frontier, live, n_live);
        b->n_live = n_live;
        b->live = !b->frontier.failed;
    }
    pthread_mutex_unlock(&s->cont_mu);
}

void cont_remember(server *s, cont_binding *b, const job *j, const int32_t *live, uint32_t n_live, int32_t last,
                   bool last_pending) {
    const gen_out *o = &j->out;
    api_kind k = j->api->kind;
    bool calls = o->n_calls && strcmp(o->finish, "tool_calls") == 0;
    bool ended = strcmp(o->finish, "stop") == 0 && !o->stop_hit;
    if (o->error[0] || !((k == API_RESPONSES && (calls || ended)) || (k == API_MESSAGES && calls))) return;
    ds4_strbuf visible = {0};
    /* A tool-output-only prompt is not a transcript the client replays. */
    if (k == API_RESPONSES && !j->cont.tool_only) visible_text(s, j, &visible);
    call_id *ids = calloc(o->n_calls ? o->n_calls : 1, sizeof(*ids));
    if (!ids || visible.failed) {
        free(ids);
        ds4_strbuf_free(&visible);
        return;
    }
    for (size_t i = 0; i < o->n_calls; i++) snprintf(ids[i], sizeof(call_id), "%s", o->calls[i].id);
    pthread_mutex_lock(&s->cont_mu);
    free(b->ids);
    b->ids = ids;
    b->n_ids = calls ? o->n_calls : 0;
    b->api = k;
    b->n_live = n_live;
    ds4_tokens_free(&b->frontier);
    ds4_tokens_append(&b->frontier, live, n_live);
    if (last_pending && last != eos_token(s)) ds4_tokens_push(&b->frontier, last);
    ds4_strbuf_free(&b->visible);
    b->visible = visible;
    b->live = !b->frontier.failed;
    size_t nf = b->frontier.n, ni = b->n_ids, nv = b->visible.len;
    pthread_mutex_unlock(&s->cont_mu);
    srv_log("kvcache", "%s live continuation: %zu tokens, %zu call ids, visible transcript %zu bytes", api_word(k), nf,
            ni, nv);
}
