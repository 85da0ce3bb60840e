/*
 * openai_chat.c - POST /v1/chat/completions (as ds4 serves it).
 *
 * Request: messages (system, developer, user, assistant with
 * reasoning_content and tool_calls, tool/function results), tools,
 * tool_choice ("none" disables the tools), thinking / think /
 * reasoning_effort, sampling, max_tokens / max_completion_tokens, stop,
 * stream and stream_options.include_usage.  Messages are normalised to the
 * chat renderer's input: content parts become one string (non-text parts
 * dropped), tool calls keep only id, name and arguments.
 *
 * Answer: chat.completion with reasoning_content and tool_calls, or a
 * stream of chat.completion.chunk: the role, reasoning and content deltas,
 * tool calls as they are generated (the call's id and name first, then
 * argument fragments that concatenate to the JSON object), the
 * finish_reason, the optional usage chunk and [DONE].
 */
#include <stdlib.h>
#include <string.h>

#include "server.h"

static int parse_tool_calls(const json_t *calls, size_t mi, json_t *out, api_error *e) {
    if (!json_is_array(calls)) return api_fail(e, 400, "messages[%zu].tool_calls must be an array", mi);
    json_t *list = json_array();
    json_object_set_new(out, "tool_calls", list);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *c = json_array_get(calls, k);
        const json_t *fn = json_object_get(c, "function");
        const json_t *name = json_object_get(fn, "name");
        const json_t *args = json_object_get(fn, "arguments");
        const json_t *id = json_object_get(c, "id");
        if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(name))
            return api_fail(e, 400, "messages[%zu].tool_calls[%zu].function.name must be a string", mi, k);
        if (id && !json_is_string(id) && !json_is_null(id))
            return api_fail(e, 400, "messages[%zu].tool_calls[%zu].id must be a string", mi, k);
        json_t *f = json_pack("{s:O}", "name", (json_t *)name);
        if (args) json_object_set(f, "arguments", (json_t *)args);
        else json_object_set_new(f, "arguments", json_string("{}"));
        json_t *call = json_pack("{s:s,s:o}", "type", "function", "function", f);
        if (json_is_string(id)) json_object_set(call, "id", (json_t *)id);
        json_array_append_new(list, call);
    }
    return 0;
}

static int parse_message(const json_t *m, size_t i, json_t *out_list, api_error *e) {
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function", NULL};
    if (!json_is_object(m)) return api_fail(e, 400, "messages[%zu] must be an object", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) return api_fail(e, 400, "messages[%zu].role must be a string", i);
    int known = 0;
    for (int k = 0; roles[k]; k++) known |= strcmp(role, roles[k]) == 0;
    if (!known) return api_fail(e, 400, "messages[%zu].role \"%s\" is not supported", i, role);
    char field[64];
    snprintf(field, sizeof(field), "messages[%zu].content", i);
    ds4_strbuf text = {0};
    if (req_text(json_object_get(m, "content"), field, false, &text, e)) {
        ds4_strbuf_free(&text);
        return -1;
    }
    json_t *out = json_pack("{s:s,s:s#}", "role", strcmp(role, "function") == 0 ? "tool" : role, "content",
                            text.p ? text.p : "", text.len);
    ds4_strbuf_free(&text);
    json_array_append_new(out_list, out);
    if (strcmp(role, "assistant") == 0) {
        const json_t *rc = json_object_get(m, "reasoning_content");
        if (json_is_string(rc)) json_object_set(out, "reasoning_content", (json_t *)rc);
        else if (rc && !json_is_null(rc)) return api_fail(e, 400, "messages[%zu].reasoning_content must be a string", i);
        const json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && parse_tool_calls(calls, i, out, e)) return -1;
    }
    const json_t *tid = json_object_get(m, "tool_call_id");
    if (json_is_string(tid)) json_object_set(out, "tool_call_id", (json_t *)tid);
    return 0;
}

/* tools: OpenAI function tools; other kinds are skipped. */
static int parse_tools(const json_t *tools, srv_request *r, api_error *e) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return api_fail(e, 400, "tools must be an array");
    r->tools = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *fn = json_object_get(t, "function");
        if (!json_is_object(t)) return api_fail(e, 400, "tools[%zu] must be an object", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && strcmp(type, "function") != 0) continue;
        if (!json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
            return api_fail(e, 400, "tools[%zu].function.name must be a string", i);
        json_array_append_new(r->tools, json_pack("{s:s,s:O}", "type", "function", "function", (json_t *)fn));
    }
    if (json_array_size(r->tools) == 0) {
        json_decref(r->tools);
        r->tools = NULL;
    }
    return 0;
}

/* thinking (bool or {type}), think (bool), reasoning_effort (string). */
int chat_thinking(const json_t *b, srv_request *r, int *explicit_think, api_error *e) {
    int t;
    r->think = DS4_THINK_HIGH;
    *explicit_think = 0;
    if (req_thinking_field(json_object_get(b, "thinking"), "thinking", &t, e)) return -1;
    if (t < 0 && req_thinking_field(json_object_get(b, "think"), "think", &t, e)) return -1;
    if (t >= 0) {
        r->think = t ? DS4_THINK_HIGH : DS4_THINK_OFF;
        *explicit_think = 1;
    }
    const json_t *eff = json_object_get(b, "reasoning_effort");
    if (eff && !json_is_null(eff)) {
        if (!json_is_string(eff)) return api_fail(e, 400, "reasoning_effort must be a string");
        ds4_think_mode m;
        if (req_effort(json_string_value(eff), "reasoning_effort", &m, e)) return -1;
        if (t != 0) r->think = m;
        *explicit_think = 1;
    }
    return 0;
}

int chat_common_fields(const json_t *b, srv_request *r, api_error *e) {
    static const char *const max_names[] = {"max_completion_tokens", "max_tokens", NULL};
    if (req_sampling(b, r, true, e) || req_max_tokens(b, max_names, r, e) ||
        req_stop(json_object_get(b, "stop"), "stop", r, e) || req_bool(b, "stream", &r->stream, e))
        return -1;
    const json_t *so = json_object_get(b, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return api_fail(e, 400, "stream_options must be an object");
        if (req_bool(so, "include_usage", &r->include_usage, e)) return -1;
    }
    const json_t *n = json_object_get(b, "n");
    if (n && !json_is_null(n) && (!json_is_integer(n) || json_integer_value(n) != 1))
        return api_fail(e, 400, "n must be 1 (one choice per request)");
    int explicit_think;
    if (chat_thinking(b, r, &explicit_think, e)) return -1;
    req_model(b, r, explicit_think);
    return 0;
}

static int parse(const json_t *b, srv_request *r, api_error *e) {
    r->api = API_CHAT;
    const json_t *msgs = json_object_get(b, "messages");
    if (!msgs || json_is_null(msgs)) return api_fail(e, 400, "missing messages");
    if (!json_is_array(msgs)) return api_fail(e, 400, "messages must be an array");
    if (json_array_size(msgs) == 0) return api_fail(e, 400, "messages must not be empty");
    r->messages = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++)
        if (parse_message(json_array_get(msgs, i), i, r->messages, e)) return -1;
    if (parse_tools(json_object_get(b, "tools"), r, e)) return -1;
    const json_t *tc = json_object_get(b, "tool_choice");
    if (json_is_string(tc) && strcmp(json_string_value(tc), "none") == 0) {
        json_decref(r->tools);
        r->tools = NULL;
    }
    return chat_common_fields(b, r, e);
}

/* ------------------------------------------------------------- answers */

static json_t *chunk(job *j, json_t *delta, const char *finish) {
    json_t *choice = json_pack("{s:i,s:o,s:o,s:n}", "index", 0, "delta", delta, "finish_reason",
                               finish ? json_string(finish) : json_null(), "logprobs");
    return json_pack("{s:s,s:s,s:i,s:s,s:[o]}", "id", j->id, "object", "chat.completion.chunk", "created",
                     (json_int_t)j->created, "model", j->req.model, "choices", choice);
}

static void stream_begin(job *j, ds4_strbuf *out) {
    sse_data(out, NULL, chunk(j, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL));
}

static void stream_event(job *j, ev_kind k, int index, const char *text, size_t n, ds4_strbuf *out) {
    json_t *delta = NULL;
    switch (k) {
    case EV_REASONING: delta = json_pack("{s:s#}", "reasoning_content", text, n); break;
    case EV_CONTENT: delta = json_pack("{s:s#}", "content", text, n); break;
    case EV_CALL_START:
        delta = json_pack("{s:[{s:i,s:s,s:s,s:{s:s#,s:s}}]}", "tool_calls", "index", index, "id", j->out.calls[index].id,
                          "type", "function", "function", "name", text, n, "arguments", "");
        break;
    case EV_CALL_ARGS:
        delta = json_pack("{s:[{s:i,s:{s:s#}}]}", "tool_calls", "index", index, "function", "arguments", text, n);
        break;
    default: return;
    }
    sse_data(out, NULL, chunk(j, delta, NULL));
}

static void stream_end(job *j, ds4_strbuf *out) {
    sse_data(out, NULL, chunk(j, json_object(), j->out.finish));
    if (j->req.include_usage) {
        json_t *c = json_pack("{s:s,s:s,s:i,s:s,s:[],s:o}", "id", j->id, "object", "chat.completion.chunk", "created",
                              (json_int_t)j->created, "model", j->req.model, "choices", "usage", usage_openai(&j->out));
        sse_data(out, NULL, c);
    }
    ds4_strbuf_puts(out, "data: [DONE]\n\n");
}

void openai_stream_error(job *j, const char *msg, ds4_strbuf *out) {
    sse_data(out, "error", json_pack("{s:{s:s,s:s}}", "error", "message", msg, "type", "server_error"));
    if (j->api->kind != API_RESPONSES) ds4_strbuf_puts(out, "data: [DONE]\n\n");
}

json_t *chat_tool_calls_json(const gen_out *o) {
    json_t *calls = json_array();
    for (size_t i = 0; i < o->n_calls; i++)
        json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s#}}", "id", o->calls[i].id, "type", "function",
                                               "function", "name", o->calls[i].name, "arguments",
                                               o->calls[i].args.p ? o->calls[i].args.p : "", o->calls[i].args.len));
    return calls;
}

static json_t *final_body(job *j) {
    const gen_out *o = &j->out;
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    if (o->content.len || !o->n_calls) json_object_set_new(msg, "content", json_stringn(o->content.p ? o->content.p : "", o->content.len));
    else json_object_set_new(msg, "content", json_null());
    if (o->reasoning.len) json_object_set_new(msg, "reasoning_content", json_stringn(o->reasoning.p, o->reasoning.len));
    if (o->n_calls) json_object_set_new(msg, "tool_calls", chat_tool_calls_json(o));
    json_t *choice = json_pack("{s:i,s:o,s:s,s:n}", "index", 0, "message", msg, "finish_reason", o->finish, "logprobs");
    return json_pack("{s:s,s:s,s:i,s:s,s:[o],s:o}", "id", j->id, "object", "chat.completion", "created",
                     (json_int_t)j->created, "model", j->req.model, "choices", choice, "usage", usage_openai(o));
}

const api_adapter API_CHAT_ADAPTER = {
    .kind = API_CHAT,
    .name = "chat.completions",
    .parse = parse,
    .stream_begin = stream_begin,
    .stream_event = stream_event,
    .stream_end = stream_end,
    .stream_error = openai_stream_error,
    .final_body = final_body,
};
