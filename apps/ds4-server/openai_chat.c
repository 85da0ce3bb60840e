/*
 * openai_chat.c - POST /v1/chat/completions (as ds4 serves it).
 *
 * Request: messages (system, developer, user, assistant with
 * reasoning_content and tool_calls, tool/function results), tools,
 * tool_choice (none, auto, required, a named function), parallel_tool_calls,
 * response_format (json_object, json_schema: constrained decoding),
 * logprobs / top_logprobs, thinking / think / reasoning_effort, sampling,
 * max_tokens / max_completion_tokens, stop, stream and
 * stream_options.include_usage.  Messages are normalised to the chat
 * renderer's input: content parts become one string (images, audio and
 * files as a placeholder text), tool calls keep only id, name and
 * arguments.
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
    if (req_text(json_object_get(m, "content"), field, &text, e)) {
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
        else if (rc && !json_is_null(rc))
            return api_fail(e, 400, "messages[%zu].reasoning_content must be a string", i);
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

/* tool_choice: "none", "auto", "required" or {"type": "function",
 * "function": {"name": N}}; parallel_tool_calls. */
static int parse_tool_choice(const json_t *b, srv_request *r, api_error *e) {
    const json_t *tc = json_object_get(b, "tool_choice");
    bool parallel = true;
    if (req_bool(b, "parallel_tool_calls", &parallel, e)) return -1;
    r->serial_calls = !parallel;
    if (!tc || json_is_null(tc)) return req_tool_choice(r, TOOL_AUTO, NULL, "tool_choice", e);
    const char *c = json_string_value(tc);
    if (c && strcmp(c, "none") == 0) return req_tool_choice(r, TOOL_NONE, NULL, "tool_choice", e);
    if (c && strcmp(c, "auto") == 0) return req_tool_choice(r, TOOL_AUTO, NULL, "tool_choice", e);
    if (c && strcmp(c, "required") == 0) return req_tool_choice(r, TOOL_REQUIRED, NULL, "tool_choice", e);
    const char *type = json_string_value(json_object_get(tc, "type"));
    const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    if (type && strcmp(type, "function") == 0 && name) return req_tool_choice(r, TOOL_NAMED, name, "tool_choice", e);
    return api_fail(e, 400,
                    "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}");
}

/* response_format: text, json_object or json_schema {name, schema, strict}. */
static int parse_response_format(const json_t *b, srv_request *r, api_error *e) {
    const json_t *rf = json_object_get(b, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type) return api_fail(e, 400, "response_format must be an object with a type");
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) return req_json_answer(r, NULL, rf, "response_format", e);
    if (strcmp(type, "json_schema") != 0)
        return api_fail(e, 400, "response_format.type \"%s\" is not supported (text, json_object, json_schema)", type);
    const json_t *js = json_object_get(rf, "json_schema");
    const json_t *schema = json_object_get(js, "schema");
    if (!json_is_object(js)) return api_fail(e, 400, "response_format.json_schema must be an object");
    if (!schema) return req_json_answer(r, NULL, rf, "response_format.json_schema.schema", e);
    return req_json_answer(r, schema, rf, "response_format.json_schema.schema", e);
}

/* logprobs (a boolean) and top_logprobs (0..20). */
static int parse_logprobs(const json_t *b, srv_request *r, api_error *e) {
    bool on = false;
    if (req_bool(b, "logprobs", &on, e)) return -1;
    const json_t *top = json_object_get(b, "top_logprobs");
    if (!on) {
        if (top && !json_is_null(top)) return api_fail(e, 400, "top_logprobs needs logprobs: true");
        return 0;
    }
    return req_logprobs(r, top, "top_logprobs", MAX_TOP_LOGPROBS, e);
}

int chat_common_fields(const json_t *b, srv_request *r, api_error *e) {
    static const char *const max_names[] = {"max_completion_tokens", "max_tokens", NULL};
    if (req_sampling(b, r, true, e) || req_steering(b, r, e) || req_max_tokens(b, max_names, r, e) ||
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
    if (parse_tools(json_object_get(b, "tools"), r, e) || parse_tool_choice(b, r, e) ||
        parse_response_format(b, r, e) || parse_logprobs(b, r, e) || chat_common_fields(b, r, e))
        return -1;
    return req_finalize(r, e);
}

/* ------------------------------------------------------------- answers */

/* The choice's logprobs: the tokens since the last ones sent. */
static json_t *choice_logprobs(job *j, bool all) {
    gen_out *o = &j->out;
    if (j->req.logprobs < 0) return json_null();
    size_t from = all ? 0 : o->lp_sent;
    json_t *lp = json_pack("{s:o,s:n}", "content", logprobs_entries(o, from, o->n_lp), "refusal");
    if (!all) o->lp_sent = o->n_lp;
    return lp;
}

static json_t *chunk_lp(job *j, json_t *delta, const char *finish, json_t *logprobs) {
    json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", 0, "delta", delta, "finish_reason",
                               finish ? json_string(finish) : json_null(), "logprobs",
                               logprobs ? logprobs : json_null());
    return json_pack("{s:s,s:s,s:i,s:s,s:[o]}", "id", j->id, "object", "chat.completion.chunk", "created",
                     (json_int_t)j->created, "model", j->req.model, "choices", choice);
}

static json_t *chunk(job *j, json_t *delta, const char *finish) { return chunk_lp(j, delta, finish, NULL); }

static void stream_begin(job *j, ds4_strbuf *out) {
    sse_data(out, NULL, chunk(j, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL));
}

static void stream_event(job *j, ev_kind k, int index, const char *text, size_t n, ds4_strbuf *out) {
    json_t *delta = NULL;
    switch (k) {
    case EV_REASONING: delta = json_pack("{s:s#}", "reasoning_content", text, n); break;
    case EV_CONTENT:
        sse_data(out, NULL, chunk_lp(j, json_pack("{s:s#}", "content", text, n), NULL, choice_logprobs(j, false)));
        return;
    case EV_CALL_START:
        delta = json_pack("{s:[{s:i,s:s,s:s,s:{s:s#,s:s}}]}", "tool_calls", "index", index, "id",
                          j->out.calls[index].id, "type", "function", "function", "name", text, n, "arguments", "");
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
    if (o->content.len || !o->n_calls)
        json_object_set_new(msg, "content", json_stringn(o->content.p ? o->content.p : "", o->content.len));
    else json_object_set_new(msg, "content", json_null());
    if (o->reasoning.len) json_object_set_new(msg, "reasoning_content", json_stringn(o->reasoning.p, o->reasoning.len));
    if (o->n_calls) json_object_set_new(msg, "tool_calls", chat_tool_calls_json(o));
    json_t *choice = json_pack("{s:i,s:o,s:s,s:o}", "index", 0, "message", msg, "finish_reason", o->finish, "logprobs",
                               choice_logprobs(j, true));
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
