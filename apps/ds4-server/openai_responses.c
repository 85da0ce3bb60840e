/*
 * openai_responses.c - POST /v1/responses (as ds4 serves it).
 *
 * Request: `instructions` (a leading system message) and `input`, a string
 * or a list of items: messages (text parts only), function_call and
 * function_call_output, custom_tool_call and its output, reasoning items
 * (their text becomes the next assistant turn's reasoning).  Consecutive
 * assistant text and function calls form one assistant turn.  tools
 * (function tools), tool_choice (none / auto; required or forced ones are
 * refused), reasoning.effort / reasoning.summary, sampling,
 * max_output_tokens, stream.  Server-side state (previous_response_id,
 * conversation) is refused: clients replay the full input.
 *
 * Answer: a response object whose output holds a reasoning item (only
 * when a summary was asked for), the message (output_text) and the
 * function_call items; streamed as the Responses event sequence with a
 * sequence_number in every event, function-call arguments as they are
 * generated.
 */
#include <stdlib.h>
#include <string.h>

#include "server.h"

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

static bool text_part_type(const char *t) {
    static const char *const ok[] = {"input_text", "output_text", "text", "summary_text", "reasoning_text", NULL};
    for (int i = 0; t && ok[i]; i++)
        if (strcmp(t, ok[i]) == 0) return true;
    return false;
}

static int item_text(const json_t *content, const char *field, ds4_strbuf *out, api_error *e) {
    if (json_is_array(content)) {
        for (size_t k = 0; k < json_array_size(content); k++) {
            const json_t *p = json_array_get(content, k);
            const char *t = json_string_value(json_object_get(p, "type"));
            if (!json_is_object(p) || !text_part_type(t) || !json_is_string(json_object_get(p, "text")))
                return api_fail(e, 400, "%s[%zu]: content of type \"%s\" is not supported (text only)", field, k, t ? t : "?");
        }
    }
    return req_text(content, field, true, out, e);
}

/* The assistant turn that function calls attach to: the last message when
 * it is an assistant turn, else a new one. */
static json_t *assistant_turn(json_t *msgs, json_t **pending_reasoning) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (last && role && strcmp(role, "assistant") == 0 && !*pending_reasoning) return last;
    json_t *m = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    if (*pending_reasoning) {
        json_object_set_new(m, "reasoning_content", *pending_reasoning);
        *pending_reasoning = NULL;
    }
    json_array_append_new(msgs, m);
    return m;
}

static void add_call(json_t *turn, const char *call_id, const char *name, json_t *args) {
    json_t *calls = json_object_get(turn, "tool_calls");
    if (!calls) {
        calls = json_array();
        json_object_set_new(turn, "tool_calls", calls);
    }
    json_t *c = json_pack("{s:s,s:{s:s,s:o}}", "type", "function", "function", "name", name, "arguments", args);
    if (call_id) json_object_set_new(c, "id", json_string(call_id));
    json_array_append_new(calls, c);
}

static int parse_item(const json_t *it, size_t i, json_t *msgs, json_t **pending_reasoning, api_error *e) {
    if (!json_is_object(it)) return api_fail(e, 400, "input[%zu] must be an object", i);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    const json_t *status = json_object_get(it, "status");
    if (json_is_string(status) && strcmp(json_string_value(status), "completed") != 0)
        return api_fail(e, 400, "input[%zu]: items with status \"%s\" cannot be replayed", i, json_string_value(status));
    char field[64];
    snprintf(field, sizeof(field), "input[%zu].content", i);
    if (!type || strcmp(type, "message") == 0) {
        if (!role) return api_fail(e, 400, "input[%zu]: a message needs a role", i);
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))
            return api_fail(e, 400, "input[%zu].role \"%s\" is not supported", i, role);
        ds4_strbuf t = {0};
        if (item_text(json_object_get(it, "content"), field, &t, e)) {
            ds4_strbuf_free(&t);
            return -1;
        }
        json_t *m = json_pack("{s:s,s:s#}", "role", role, "content", t.p ? t.p : "", t.len);
        ds4_strbuf_free(&t);
        if (strcmp(role, "assistant") == 0 && *pending_reasoning) {
            json_object_set_new(m, "reasoning_content", *pending_reasoning);
            *pending_reasoning = NULL;
        }
        json_array_append_new(msgs, m);
        return 0;
    }
    if (strcmp(type, "reasoning") == 0) {
        ds4_strbuf t = {0};
        const json_t *parts[2] = {json_object_get(it, "summary"), json_object_get(it, "content")};
        for (int k = 0; k < 2; k++) {
            if (parts[k] && !json_is_null(parts[k]) && item_text(parts[k], field, &t, e)) {
                ds4_strbuf_free(&t);
                return -1;
            }
        }
        json_decref(*pending_reasoning);
        *pending_reasoning = json_stringn(t.p ? t.p : "", t.len);
        ds4_strbuf_free(&t);
        return 0;
    }
    if (strcmp(type, "function_call") == 0 || strcmp(type, "custom_tool_call") == 0) {
        bool custom = type[0] == 'c';
        const char *name = json_string_value(json_object_get(it, "name"));
        const char *call_id = json_string_value(json_object_get(it, "call_id"));
        const json_t *args = json_object_get(it, custom ? "input" : "arguments");
        if (!name) return api_fail(e, 400, "input[%zu].name must be a string", i);
        if (!json_is_string(args)) return api_fail(e, 400, "input[%zu].%s must be a string", i, custom ? "input" : "arguments");
        add_call(assistant_turn(msgs, pending_reasoning), call_id, name, json_copy((json_t *)args));
        return 0;
    }
    if (strcmp(type, "function_call_output") == 0 || strcmp(type, "custom_tool_call_output") == 0) {
        const char *call_id = json_string_value(json_object_get(it, "call_id"));
        if (!call_id) return api_fail(e, 400, "input[%zu].call_id must be a string", i);
        snprintf(field, sizeof(field), "input[%zu].output", i);
        ds4_strbuf t = {0};
        if (item_text(json_object_get(it, "output"), field, &t, e)) {
            ds4_strbuf_free(&t);
            return -1;
        }
        json_array_append_new(msgs, json_pack("{s:s,s:s,s:s#}", "role", "tool", "tool_call_id", call_id, "content",
                                              t.p ? t.p : "", t.len));
        ds4_strbuf_free(&t);
        return 0;
    }
    if (strcmp(type, "compaction") == 0 || strcmp(type, "context_compaction") == 0) return 0;
    return api_fail(e, 400, "input[%zu]: item type \"%s\" is not supported", i, type);
}

static int parse_tools(const json_t *tools, srv_request *r, api_error *e) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return api_fail(e, 400, "tools must be an array");
    r->tools = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        if (!json_is_object(t)) return api_fail(e, 400, "tools[%zu] must be an object", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") != 0) continue; /* hosted tools are not ours to run */
        const char *name = json_string_value(json_object_get(t, "name"));
        if (!name) return api_fail(e, 400, "tools[%zu].name must be a string", i);
        json_array_append_new(r->tools, req_openai_tool(name, json_object_get(t, "description"),
                                                        json_object_get(t, "parameters")));
    }
    if (json_array_size(r->tools) == 0) {
        json_decref(r->tools);
        r->tools = NULL;
    }
    return 0;
}

static int parse(const json_t *b, srv_request *r, api_error *e) {
    static const char *const max_names[] = {"max_output_tokens", "max_tokens", NULL};
    r->api = API_RESPONSES;
    const char *state_fields[] = {"previous_response_id", "conversation"};
    for (int k = 0; k < 2; k++) {
        const json_t *v = json_object_get(b, state_fields[k]);
        if (v && !json_is_null(v))
            return api_fail(e, 400, "%s is not supported; replay full input instead", state_fields[k]);
    }
    const json_t *input = json_object_get(b, "input");
    if (!input || json_is_null(input)) return api_fail(e, 400, "missing input");
    r->messages = json_array();
    const json_t *instr = json_object_get(b, "instructions");
    if (json_is_string(instr)) json_array_append_new(r->messages, json_pack("{s:s,s:O}", "role", "system", "content", (json_t *)instr));
    else if (instr && !json_is_null(instr)) return api_fail(e, 400, "instructions must be a string");
    if (json_is_string(input)) {
        json_array_append_new(r->messages, json_pack("{s:s,s:O}", "role", "user", "content", (json_t *)input));
    } else if (json_is_array(input)) {
        json_t *pending = NULL;
        for (size_t i = 0; i < json_array_size(input); i++) {
            if (parse_item(json_array_get(input, i), i, r->messages, &pending, e)) {
                json_decref(pending);
                return -1;
            }
        }
        json_decref(pending);
    } else {
        return api_fail(e, 400, "input must be a string or an array of items");
    }
    if (json_array_size(r->messages) == 0) return api_fail(e, 400, "input must not be empty");
    if (parse_tools(json_object_get(b, "tools"), r, e)) return -1;
    const json_t *tc = json_object_get(b, "tool_choice");
    if (json_is_string(tc)) {
        const char *c = json_string_value(tc);
        if (strcmp(c, "none") == 0) {
            json_decref(r->tools);
            r->tools = NULL;
        } else if (strcmp(c, "auto") != 0) {
            return api_fail(e, 400, "tool_choice=%s not supported", c);
        }
    } else if (tc && !json_is_null(tc)) {
        return api_fail(e, 400, "forced tool_choice not supported");
    }
    r->think = DS4_THINK_HIGH;
    int explicit_think = 0;
    const json_t *rs = json_object_get(b, "reasoning");
    if (rs && !json_is_null(rs)) {
        if (!json_is_object(rs)) return api_fail(e, 400, "reasoning must be an object");
        const json_t *eff = json_object_get(rs, "effort");
        if (json_is_string(eff)) {
            if (req_effort(json_string_value(eff), "reasoning.effort", &r->think, e)) return -1;
            explicit_think = 1;
        } else if (eff && !json_is_null(eff)) {
            return api_fail(e, 400, "reasoning.effort must be a string");
        }
        const char *sum = json_string_value(json_object_get(rs, "summary"));
        r->reasoning_summary = sum && (!strcmp(sum, "auto") || !strcmp(sum, "concise") || !strcmp(sum, "detailed"));
    }
    if (req_sampling(b, r, false, e) || req_max_tokens(b, max_names, r, e) || req_bool(b, "stream", &r->stream, e))
        return -1;
    req_model(b, r, explicit_think);
    return 0;
}

/* ------------------------------------------------------------- answers */

static void fc_id(const gen_call *c, char *out, size_t n) {
    const char *hex = strncmp(c->id, "call_", 5) == 0 ? c->id + 5 : c->id;
    snprintf(out, n, "fc_%s", hex);
}

static json_t *reasoning_item(const char *id, const gen_out *o, bool done) {
    return json_pack("{s:s,s:s,s:[{s:s,s:s#}],s:s}", "type", "reasoning", "id", id, "summary", "type", "summary_text",
                     "text", o->reasoning.p ? o->reasoning.p : "", o->reasoning.len, "status",
                     done && o->think_closed ? "completed" : done ? "incomplete" : "in_progress");
}

static json_t *message_item(const char *id, const char *text, size_t n, const char *status) {
    json_t *content = json_array();
    if (strcmp(status, "in_progress") != 0)
        json_array_append_new(content, json_pack("{s:s,s:s#,s:[]}", "type", "output_text", "text", text, n, "annotations"));
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", id, "status", status, "role", "assistant",
                     "content", content);
}

static json_t *call_item(const gen_call *c, const char *status, bool with_args) {
    char id[64];
    fc_id(c, id, sizeof(id));
    return json_pack("{s:s,s:s,s:s,s:s,s:s#,s:s}", "type", "function_call", "id", id, "call_id", c->id, "name", c->name,
                     "arguments", with_args && c->args.p ? c->args.p : "", with_args ? c->args.len : 0, "status", status);
}

static json_t *response_object(job *j, const char *status, json_t *output) {
    const srv_request *r = &j->req;
    json_t *resp = json_pack("{s:s,s:s,s:i,s:s,s:n,s:n,s:n,s:s,s:o,s:b,s:n,s:f,s:f,s:s,s:o,s:s,s:{s:{s:s}},s:n,s:{}}",
                             "id", j->id, "object", "response", "created_at", (json_int_t)j->created, "status", status,
                             "error", "incomplete_details", "instructions", "model", r->model, "output", output,
                             "parallel_tool_calls", 1, "previous_response_id", "temperature", (double)r->sp.temperature,
                             "top_p", (double)r->sp.top_p, "tool_choice", "auto", "tools", json_array(), "truncation",
                             "disabled", "text", "format", "type", "text", "user", "metadata");
    json_object_set_new(resp, "reasoning", json_pack("{s:s,s:n}", "effort",
                                                     r->think == DS4_THINK_OFF ? "none" : r->think == DS4_THINK_MAX ? "max" : "high",
                                                     "summary"));
    if (r->max_tokens) json_object_set_new(resp, "max_output_tokens", json_integer(r->max_tokens));
    return resp;
}

static const char *final_status(const gen_out *o) {
    if (strcmp(o->finish, "error") == 0) return "failed";
    if (strcmp(o->finish, "length") == 0) return "incomplete";
    return "completed";
}

static json_t *full_response(job *j) {
    const gen_out *o = &j->out;
    json_t *output = json_array();
    if (j->req.reasoning_summary && o->reasoning.len) {
        if (!j->ss.rs_item_id[0]) random_id(j->ss.rs_item_id, sizeof(j->ss.rs_item_id), "rs_", 24);
        json_array_append_new(output, reasoning_item(j->ss.rs_item_id, o, true));
    }
    if (o->content.len || !o->n_calls) {
        if (!j->ss.msg_item_id[0]) random_id(j->ss.msg_item_id, sizeof(j->ss.msg_item_id), "msg_", 24);
        json_array_append_new(output, message_item(j->ss.msg_item_id, o->content.p ? o->content.p : "", o->content.len,
                                                   "completed"));
    }
    for (size_t i = 0; i < o->n_calls; i++) json_array_append_new(output, call_item(&o->calls[i], "completed", true));
    const char *status = final_status(o);
    json_t *resp = response_object(j, status, output);
    json_object_set_new(resp, "usage", usage_responses(o));
    if (strcmp(status, "incomplete") == 0)
        json_object_set_new(resp, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    if (strcmp(status, "failed") == 0)
        json_object_set_new(resp, "error", json_pack("{s:s,s:s}", "code", "server_error", "message", o->error));
    return resp;
}

/* One event: type, then sequence_number, then the rest. */
static void event(job *j, ds4_strbuf *out, const char *type, json_t *rest) {
    json_t *ev = json_pack("{s:s,s:i}", "type", type, "sequence_number", j->ss.seq++);
    json_object_update(ev, rest);
    json_decref(rest);
    sse_data(out, NULL, ev);
}

static void close_reasoning(job *j, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    if (ss->block_kind != ITEM_REASONING) return;
    const gen_out *o = &j->out;
    const char *id = ss->rs_item_id;
    json_t *part = json_pack("{s:s,s:s#}", "type", "summary_text", "text", o->reasoning.p ? o->reasoning.p : "", o->reasoning.len);
    event(j, out, "response.reasoning_summary_text.done",
          json_pack("{s:s,s:i,s:i,s:s#}", "item_id", id, "output_index", ss->item, "summary_index", 0, "text",
                    o->reasoning.p ? o->reasoning.p : "", o->reasoning.len));
    event(j, out, "response.reasoning_summary_part.done",
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", ss->item, "summary_index", 0, "part", part));
    event(j, out, "response.output_item.done", json_pack("{s:i,s:o}", "output_index", ss->item, "item", reasoning_item(id, o, true)));
    ss->block_kind = ITEM_NONE;
}

static void open_message(job *j, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    close_reasoning(j, out);
    if (ss->block_kind == ITEM_MESSAGE) return;
    random_id(ss->msg_item_id, sizeof(ss->msg_item_id), "msg_", 24);
    ss->item = ss->next_item++;
    ss->block_kind = ITEM_MESSAGE;
    event(j, out, "response.output_item.added",
          json_pack("{s:i,s:o}", "output_index", ss->item, "item", message_item(ss->msg_item_id, "", 0, "in_progress")));
    event(j, out, "response.content_part.added",
          json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}", "item_id", ss->msg_item_id, "output_index", ss->item,
                    "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

static void close_message(job *j, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    if (ss->block_kind != ITEM_MESSAGE) return;
    const gen_out *o = &j->out;
    const char *text = o->content.p ? o->content.p : "";
    event(j, out, "response.output_text.done",
          json_pack("{s:s,s:i,s:i,s:s#}", "item_id", ss->msg_item_id, "output_index", ss->item, "content_index", 0,
                    "text", text, o->content.len));
    event(j, out, "response.content_part.done",
          json_pack("{s:s,s:i,s:i,s:{s:s,s:s#,s:[]}}", "item_id", ss->msg_item_id, "output_index", ss->item,
                    "content_index", 0, "part", "type", "output_text", "text", text, o->content.len, "annotations"));
    event(j, out, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", ss->item, "item", message_item(ss->msg_item_id, text, o->content.len, "completed")));
    ss->block_kind = ITEM_NONE;
    ss->text_started = true;
}

static void stream_begin(job *j, ds4_strbuf *out) {
    event(j, out, "response.created", json_pack("{s:o}", "response", response_object(j, "in_progress", json_array())));
    event(j, out, "response.in_progress", json_pack("{s:o}", "response", response_object(j, "in_progress", json_array())));
}

static void stream_event(job *j, ev_kind k, int index, const char *text, size_t n, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    switch (k) {
    case EV_REASONING:
        if (!j->req.reasoning_summary) return;
        if (ss->block_kind != ITEM_REASONING) {
            random_id(ss->rs_item_id, sizeof(ss->rs_item_id), "rs_", 24);
            ss->item = ss->next_item++;
            ss->block_kind = ITEM_REASONING;
            event(j, out, "response.output_item.added",
                  json_pack("{s:i,s:o}", "output_index", ss->item, "item",
                            json_pack("{s:s,s:s,s:[],s:s}", "type", "reasoning", "id", ss->rs_item_id, "summary",
                                      "status", "in_progress")));
            event(j, out, "response.reasoning_summary_part.added",
                  json_pack("{s:s,s:i,s:i,s:{s:s,s:s}}", "item_id", ss->rs_item_id, "output_index", ss->item,
                            "summary_index", 0, "part", "type", "summary_text", "text", ""));
        }
        event(j, out, "response.reasoning_summary_text.delta",
              json_pack("{s:s,s:i,s:i,s:s#}", "item_id", ss->rs_item_id, "output_index", ss->item, "summary_index", 0,
                        "delta", text, n));
        return;
    case EV_THINK_END: close_reasoning(j, out); return;
    case EV_CONTENT:
        open_message(j, out);
        event(j, out, "response.output_text.delta",
              json_pack("{s:s,s:i,s:i,s:s#}", "item_id", ss->msg_item_id, "output_index", ss->item, "content_index", 0,
                        "delta", text, n));
        return;
    case EV_CALL_START: {
        close_reasoning(j, out);
        close_message(j, out);
        if (index >= 64) return;
        ss->call_item[index] = ss->next_item++;
        ss->any_call_streamed = true;
        event(j, out, "response.output_item.added",
              json_pack("{s:i,s:o}", "output_index", ss->call_item[index], "item",
                        call_item(&j->out.calls[index], "in_progress", false)));
        return;
    }
    case EV_CALL_ARGS: {
        if (index >= 64) return;
        char id[64];
        fc_id(&j->out.calls[index], id, sizeof(id));
        event(j, out, "response.function_call_arguments.delta",
              json_pack("{s:s,s:i,s:s#}", "item_id", id, "output_index", ss->call_item[index], "delta", text, n));
        return;
    }
    case EV_CALL_END: {
        if (index >= 64) return;
        const gen_call *c = &j->out.calls[index];
        char id[64];
        fc_id(c, id, sizeof(id));
        event(j, out, "response.function_call_arguments.done",
              json_pack("{s:s,s:i,s:s,s:s#}", "item_id", id, "output_index", ss->call_item[index], "name", c->name,
                        "arguments", c->args.p ? c->args.p : "", c->args.len));
        event(j, out, "response.output_item.done",
              json_pack("{s:i,s:o}", "output_index", ss->call_item[index], "item", call_item(c, "completed", true)));
        return;
    }
    }
}

static void stream_end(job *j, ds4_strbuf *out) {
    close_reasoning(j, out);
    if (!j->ss.text_started && j->ss.block_kind != ITEM_MESSAGE && !j->out.n_calls) open_message(j, out);
    close_message(j, out);
    json_t *resp = full_response(j);
    const char *status = json_string_value(json_object_get(resp, "status"));
    const char *type = strcmp(status, "failed") == 0       ? "response.failed"
                       : strcmp(status, "incomplete") == 0 ? "response.incomplete"
                                                           : "response.completed";
    event(j, out, type, json_pack("{s:o}", "response", resp));
}

static void stream_error(job *j, const char *msg, ds4_strbuf *out) {
    snprintf(j->out.error, sizeof(j->out.error), "%s", msg);
    j->out.finish = "error";
    json_t *resp = full_response(j);
    event(j, out, "response.failed", json_pack("{s:o}", "response", resp));
}

const api_adapter API_RESPONSES_ADAPTER = {
    .kind = API_RESPONSES,
    .name = "responses",
    .parse = parse,
    .stream_begin = stream_begin,
    .stream_event = stream_event,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .final_body = full_response,
};
