/*
 * anthropic_messages.c - POST /v1/messages, the Anthropic Messages API
 * (as ds4 serves it).
 *
 * Request: system (a string or text blocks; "x-anthropic-" billing blocks
 * dropped), messages whose content is a string or blocks: text, thinking,
 * tool_use (id, name, input object), tool_result (tool_use_id, content);
 * images and documents become a placeholder text (request.c).  tools
 * (name, input_schema; server tools skipped), tool_choice (auto, any,
 * tool with a name, none; disable_parallel_tool_use), output_format /
 * output_config.format (json_schema: constrained decoding), thinking
 * {type}, output_config.effort / reasoning_effort, sampling, max_tokens,
 * stop_sequences, stream.
 *
 * Answer: a message with thinking (signature = the message id), text and
 * tool_use blocks, stop_reason end_turn / max_tokens / tool_use /
 * stop_sequence; streamed as message_start, content blocks (thinking,
 * signature, text and input_json_delta fragments as the arguments are
 * generated), message_delta and message_stop.
 */
#include <stdlib.h>
#include <string.h>

#include "server.h"

enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL };

static void join(ds4_strbuf *b, const char *s, size_t n) {
    if (b->len) ds4_strbuf_puts(b, "\n\n");
    ds4_strbuf_append(b, s, n);
}

static int parse_user(const json_t *content, size_t i, json_t *msgs, api_error *e) {
    ds4_strbuf text = {0};
    char field[80];
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *b = json_array_get(content, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type) {
            ds4_strbuf_free(&text);
            return api_fail(e, 400, "messages[%zu].content[%zu] must be a block with a type", i, k);
        }
        if (strcmp(type, "text") == 0) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) {
                ds4_strbuf_free(&text);
                return api_fail(e, 400, "messages[%zu].content[%zu].text must be a string", i, k);
            }
            join(&text, json_string_value(t), json_string_length(t));
        } else if (strcmp(type, "tool_result") == 0) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            snprintf(field, sizeof(field), "messages[%zu].content[%zu].content", i, k);
            ds4_strbuf r = {0};
            if (!id || req_text(json_object_get(b, "content"), field, &r, e)) {
                ds4_strbuf_free(&r);
                ds4_strbuf_free(&text);
                return id ? -1 : api_fail(e, 400, "messages[%zu].content[%zu].tool_use_id must be a string", i, k);
            }
            json_array_append_new(msgs, json_pack("{s:s,s:s,s:s#}", "role", "tool", "tool_call_id", id, "content",
                                                  r.p ? r.p : "", r.len));
            ds4_strbuf_free(&r);
        } else if (req_placeholder(type) || strcmp(type, "document") == 0) {
            ds4_strbuf part = {0};
            snprintf(field, sizeof(field), "messages[%zu].content", i);
            if (req_part(b, field, k, &part, e)) {
                ds4_strbuf_free(&part);
                ds4_strbuf_free(&text);
                return -1;
            }
            join(&text, part.p ? part.p : "", part.len);
            ds4_strbuf_free(&part);
        } else {
            ds4_strbuf_free(&text);
            return api_fail(e, 400, "messages[%zu].content[%zu]: content of type \"%s\" is not supported", i, k, type);
        }
    }
    if (text.len || json_array_size(content) == 0)
        json_array_append_new(msgs, json_pack("{s:s,s:s#}", "role", "user", "content", text.p ? text.p : "", text.len));
    ds4_strbuf_free(&text);
    return 0;
}

static int parse_assistant(const json_t *content, size_t i, json_t *msgs, api_error *e) {
    ds4_strbuf text = {0}, reasoning = {0};
    json_t *calls = json_array();
    int rc = 0;
    for (size_t k = 0; k < json_array_size(content) && rc == 0; k++) {
        const json_t *b = json_array_get(content, k);
        const char *type = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !type) {
            rc = api_fail(e, 400, "messages[%zu].content[%zu] must be a block with a type", i, k);
        } else if (strcmp(type, "text") == 0) {
            const json_t *t = json_object_get(b, "text");
            if (!json_is_string(t)) rc = api_fail(e, 400, "messages[%zu].content[%zu].text must be a string", i, k);
            else join(&text, json_string_value(t), json_string_length(t));
        } else if (strcmp(type, "thinking") == 0) {
            const json_t *t = json_object_get(b, "thinking");
            if (!json_is_string(t)) rc = api_fail(e, 400, "messages[%zu].content[%zu].thinking must be a string", i, k);
            else ds4_strbuf_append(&reasoning, json_string_value(t), json_string_length(t));
        } else if (strcmp(type, "redacted_thinking") == 0) {
            continue;
        } else if (strcmp(type, "tool_use") == 0) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            const json_t *input = json_object_get(b, "input");
            if (!id || !name || !json_is_object(input))
                rc = api_fail(e, 400, "messages[%zu].content[%zu]: tool_use needs an id, a name and an input object", i,
                              k);
            else
                json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:O}}", "id", id, "type", "function",
                                                       "function", "name", name, "arguments", (json_t *)input));
        } else if (req_placeholder(type)) {
            join(&text, req_placeholder(type), strlen(req_placeholder(type)));
        } else {
            rc = api_fail(e, 400, "messages[%zu].content[%zu]: content of type \"%s\" is not supported", i, k, type);
        }
    }
    if (rc == 0) {
        json_t *m = json_pack("{s:s,s:s#}", "role", "assistant", "content", text.p ? text.p : "", text.len);
        if (reasoning.len) json_object_set_new(m, "reasoning_content", json_stringn(reasoning.p, reasoning.len));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        json_array_append_new(msgs, m);
    }
    json_decref(calls);
    ds4_strbuf_free(&text);
    ds4_strbuf_free(&reasoning);
    return rc;
}

static int parse_system(const json_t *sys, json_t *msgs, api_error *e) {
    if (!sys || json_is_null(sys)) return 0;
    ds4_strbuf t = {0};
    if (json_is_string(sys)) {
        ds4_strbuf_append(&t, json_string_value(sys), json_string_length(sys));
    } else if (json_is_array(sys)) {
        for (size_t k = 0; k < json_array_size(sys); k++) {
            const json_t *txt = json_object_get(json_array_get(sys, k), "text");
            if (!json_is_string(txt)) {
                ds4_strbuf_free(&t);
                return api_fail(e, 400, "system[%zu] must be a text block", k);
            }
            if (strncmp(json_string_value(txt), "x-anthropic-", 12) == 0) continue;
            join(&t, json_string_value(txt), json_string_length(txt));
        }
    } else {
        return api_fail(e, 400, "system must be a string or an array of text blocks");
    }
    json_array_append_new(msgs, json_pack("{s:s,s:s#}", "role", "system", "content", t.p ? t.p : "", t.len));
    ds4_strbuf_free(&t);
    return 0;
}

static int parse_tools(const json_t *tools, srv_request *r, api_error *e) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return api_fail(e, 400, "tools must be an array");
    r->tools = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        if (!json_is_object(t)) return api_fail(e, 400, "tools[%zu] must be an object", i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && strcmp(type, "custom") != 0) continue; /* server tools run elsewhere */
        const char *name = json_string_value(json_object_get(t, "name"));
        const json_t *schema = json_object_get(t, "input_schema");
        if (!name) return api_fail(e, 400, "tools[%zu].name must be a string", i);
        if (schema && !json_is_object(schema)) return api_fail(e, 400, "tools[%zu].input_schema must be an object", i);
        json_array_append_new(r->tools, req_openai_tool(name, json_object_get(t, "description"), schema));
    }
    if (json_array_size(r->tools) == 0) {
        json_decref(r->tools);
        r->tools = NULL;
    }
    return 0;
}

/* tool_choice {type: auto | any | tool (name) | none,
 * disable_parallel_tool_use}. */
static int parse_tool_choice(const json_t *b, srv_request *r, api_error *e) {
    const json_t *tc = json_object_get(b, "tool_choice");
    if (!tc || json_is_null(tc)) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type) return api_fail(e, 400, "tool_choice must be an object with a type");
    bool serial = false;
    if (req_bool(tc, "disable_parallel_tool_use", &serial, e)) return -1;
    r->serial_calls = serial;
    if (strcmp(type, "auto") == 0) return req_tool_choice(r, TOOL_AUTO, NULL, "tool_choice", e);
    if (strcmp(type, "none") == 0) return req_tool_choice(r, TOOL_NONE, NULL, "tool_choice", e);
    if (strcmp(type, "any") == 0) return req_tool_choice(r, TOOL_REQUIRED, NULL, "tool_choice", e);
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (strcmp(type, "tool") == 0 && name) return req_tool_choice(r, TOOL_NAMED, name, "tool_choice", e);
    return api_fail(e, 400, "tool_choice.type must be auto, any, none, or tool with a name");
}

/* Structured output: output_format or output_config.format
 * {type: "json_schema", schema}. */
static int parse_output_format(const json_t *b, srv_request *r, api_error *e) {
    const char *field = "output_format";
    const json_t *f = json_object_get(b, field);
    if (!f || json_is_null(f)) {
        f = json_object_get(json_object_get(b, "output_config"), "format");
        field = "output_config.format";
    }
    if (!f || json_is_null(f)) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type || strcmp(type, "json_schema") != 0) return api_fail(e, 400, "%s.type must be \"json_schema\"", field);
    const json_t *schema = json_object_get(f, "schema");
    char where[64];
    snprintf(where, sizeof(where), "%s.schema", field);
    if (!json_is_object(schema)) return api_fail(e, 400, "%s must be an object", where);
    json_t *shown = json_pack("{s:s,s:O}", "type", "json_schema", "schema", (json_t *)schema);
    int rc = req_json_answer(r, schema, shown, where, e);
    json_decref(shown);
    return rc;
}

static int parse_thinking(const json_t *b, srv_request *r, int *explicit_think, api_error *e) {
    int t;
    r->think = DS4_THINK_HIGH;
    *explicit_think = 0;
    if (req_thinking_field(json_object_get(b, "thinking"), "thinking", &t, e)) return -1;
    if (t >= 0) {
        r->think = t ? DS4_THINK_HIGH : DS4_THINK_OFF;
        *explicit_think = 1;
    }
    const json_t *eff = json_object_get(json_object_get(b, "output_config"), "effort");
    if (!eff || json_is_null(eff)) eff = json_object_get(b, "reasoning_effort");
    if (eff && !json_is_null(eff)) {
        if (!json_is_string(eff)) return api_fail(e, 400, "effort must be a string");
        ds4_think_mode m;
        if (req_effort(json_string_value(eff), "effort", &m, e)) return -1;
        if (t != 0) r->think = m;
        *explicit_think = 1;
    }
    return 0;
}

static int parse(const json_t *b, srv_request *r, api_error *e) {
    static const char *const max_names[] = {"max_tokens", NULL};
    r->api = API_MESSAGES;
    const json_t *msgs = json_object_get(b, "messages");
    if (!msgs || json_is_null(msgs)) return api_fail(e, 400, "missing messages");
    if (!json_is_array(msgs)) return api_fail(e, 400, "messages must be an array");
    if (json_array_size(msgs) == 0) return api_fail(e, 400, "messages must not be empty");
    r->messages = json_array();
    if (parse_system(json_object_get(b, "system"), r->messages, e)) return -1;
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !role) return api_fail(e, 400, "messages[%zu] needs a role", i);
        bool user = strcmp(role, "user") == 0;
        if (!user && strcmp(role, "assistant") != 0)
            return api_fail(e, 400, "messages[%zu].role must be user or assistant", i);
        if (json_is_string(content)) {
            json_array_append_new(r->messages, json_pack("{s:s,s:O}", "role", role, "content", (json_t *)content));
            continue;
        }
        if (!json_is_array(content))
            return api_fail(e, 400, "messages[%zu].content must be a string or an array of blocks", i);
        if ((user ? parse_user : parse_assistant)(content, i, r->messages, e)) return -1;
    }
    int explicit_think;
    if (parse_tools(json_object_get(b, "tools"), r, e) || parse_tool_choice(b, r, e) || parse_output_format(b, r, e) ||
        parse_thinking(b, r, &explicit_think, e) || req_sampling(b, r, false, e) || req_steering(b, r, e) ||
        req_max_tokens(b, max_names, r, e) || req_stop(json_object_get(b, "stop_sequences"), "stop_sequences", r, e) ||
        req_bool(b, "stream", &r->stream, e))
        return -1;
    req_model(b, r, explicit_think);
    return req_finalize(r, e);
}

/* ------------------------------------------------------------- answers */

static const char *stop_reason(const gen_out *o) {
    if (o->stop_hit) return "stop_sequence";
    if (strcmp(o->finish, "length") == 0) return "max_tokens";
    if (strcmp(o->finish, "tool_calls") == 0) return "tool_use";
    return "end_turn";
}

static json_t *message_object(job *j, json_t *content, bool final) {
    const gen_out *o = &j->out;
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:o,s:o}", "id", j->id, "type", "message", "role", "assistant", "model",
                     j->req.model, "content", content, "stop_reason", final ? json_string(stop_reason(o)) : json_null(),
                     "stop_sequence", final && o->stop_hit ? json_string(o->stop_hit) : json_null(), "usage",
                     usage_anthropic(o));
}

static json_t *tool_input(const gen_call *c) {
    json_t *v = json_loadb(c->args.p ? c->args.p : "{}", c->args.p ? c->args.len : 2, JSON_DECODE_ANY, NULL);
    if (!json_is_object(v)) {
        json_decref(v);
        v = json_object();
    }
    return v;
}

static json_t *final_body(job *j) {
    const gen_out *o = &j->out;
    json_t *content = json_array();
    if (o->reasoning.len)
        json_array_append_new(content, json_pack("{s:s,s:s#,s:s}", "type", "thinking", "thinking", o->reasoning.p,
                                                 o->reasoning.len, "signature", j->id));
    if (o->content.len || !o->n_calls)
        json_array_append_new(
            content, json_pack("{s:s,s:s#}", "type", "text", "text", o->content.p ? o->content.p : "", o->content.len));
    for (size_t i = 0; i < o->n_calls; i++)
        json_array_append_new(content, json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use", "id", o->calls[i].id, "name",
                                                 o->calls[i].name, "input", tool_input(&o->calls[i])));
    return message_object(j, content, true);
}

static void ev(ds4_strbuf *out, const char *type, json_t *rest) {
    json_t *e = json_pack("{s:s}", "type", type);
    json_object_update(e, rest);
    json_decref(rest);
    sse_data(out, type, e);
}

static void close_block(job *j, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    if (ss->block < 0) return;
    if (ss->block_kind == BLOCK_THINKING)
        ev(out, "content_block_delta",
           json_pack("{s:i,s:{s:s,s:s}}", "index", ss->block, "delta", "type", "signature_delta", "signature", j->id));
    ev(out, "content_block_stop", json_pack("{s:i}", "index", ss->block));
    ss->block = -1;
    ss->block_kind = BLOCK_NONE;
}

static void open_block(job *j, ds4_strbuf *out, int kind, json_t *block) {
    stream_state *ss = &j->ss;
    close_block(j, out);
    ss->block = ss->next_block++;
    ss->block_kind = kind;
    if (kind != BLOCK_THINKING) ss->text_started = true;
    ev(out, "content_block_start", json_pack("{s:i,s:o}", "index", ss->block, "content_block", block));
}

static void stream_begin(job *j, ds4_strbuf *out) {
    ev(out, "message_start", json_pack("{s:o}", "message", message_object(j, json_array(), false)));
}

static void delta(job *j, ds4_strbuf *out, json_t *d) {
    ev(out, "content_block_delta", json_pack("{s:i,s:o}", "index", j->ss.block, "delta", d));
}

static void stream_event(job *j, ev_kind k, int index, const char *text, size_t n, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    switch (k) {
    case EV_REASONING:
        if (ss->block_kind != BLOCK_THINKING)
            open_block(j, out, BLOCK_THINKING,
                       json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
        delta(j, out, json_pack("{s:s,s:s#}", "type", "thinking_delta", "thinking", text, n));
        return;
    case EV_THINK_END:
        if (ss->block_kind == BLOCK_THINKING) close_block(j, out);
        return;
    case EV_CONTENT:
        if (ss->block_kind != BLOCK_TEXT)
            open_block(j, out, BLOCK_TEXT, json_pack("{s:s,s:s}", "type", "text", "text", ""));
        delta(j, out, json_pack("{s:s,s:s#}", "type", "text_delta", "text", text, n));
        return;
    case EV_CALL_START:
        open_block(j, out, BLOCK_TOOL,
                   json_pack("{s:s,s:s,s:s#,s:{}}", "type", "tool_use", "id", j->out.calls[index].id, "name", text, n,
                             "input"));
        return;
    case EV_CALL_ARGS:
        delta(j, out, json_pack("{s:s,s:s#}", "type", "input_json_delta", "partial_json", text, n));
        return;
    case EV_CALL_END: close_block(j, out); return;
    }
}

static void stream_end(job *j, ds4_strbuf *out) {
    close_block(j, out);
    if (!j->ss.text_started) {
        open_block(j, out, BLOCK_TEXT, json_pack("{s:s,s:s}", "type", "text", "text", ""));
        close_block(j, out);
    }
    const gen_out *o = &j->out;
    json_t *usage = usage_anthropic(o);
    ev(out, "message_delta",
       json_pack("{s:{s:s,s:o},s:o}", "delta", "stop_reason", stop_reason(o), "stop_sequence",
                 o->stop_hit ? json_string(o->stop_hit) : json_null(), "usage", usage));
    ev(out, "message_stop", json_object());
}

static void stream_error(job *j, const char *msg, ds4_strbuf *out) {
    (void)j;
    sse_data(out, "error",
             json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", "api_error", "message", msg));
}

const api_adapter API_MESSAGES_ADAPTER = {
    .kind = API_MESSAGES,
    .name = "messages",
    .anthropic_errors = true,
    .parse = parse,
    .stream_begin = stream_begin,
    .stream_event = stream_event,
    .stream_end = stream_end,
    .stream_error = stream_error,
    .final_body = final_body,
};
