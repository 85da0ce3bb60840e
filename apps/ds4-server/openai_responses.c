/*
 * openai_responses.c - POST /v1/responses (as ds4 serves it).
 *
 * Request: `instructions` (a leading system message) and `input`, a string
 * or a list of items: messages (text parts; images and files become a
 * placeholder text), function_call and function_call_output,
 * custom_tool_call and its output, reasoning items (their text becomes the
 * next assistant turn's reasoning), Codex's hosted-tool history
 * (local_shell_call, web_search_call, image_generation_call,
 * tool_search_call, rendered as calls, and their *_output items;
 * tool_search_output also loads the tools it found).  Consecutive
 * assistant text and calls form one assistant turn.  Server-side state
 * (previous_response_id, conversation) is refused: clients replay the full
 * input.
 *
 * Tools: function tools; custom tools (free text, e.g. Codex's
 * apply_patch with its grammar), shown to the model as a function with one
 * string parameter `input` that carries the grammar; namespace groups,
 * flattened to NAMESPACE+NAME for the model; the hosted tool_search, run
 * by the client.  Their calls come back as what the client declared:
 * custom_tool_call with `input`, function_call with `namespace`,
 * tool_search_call.  Other hosted tools are not ours to run and are
 * skipped.  tool_choice (none, auto, required, a function or custom tool,
 * allowed_tools), parallel_tool_calls, text.format (json_object,
 * json_schema: constrained decoding), top_logprobs with include
 * message.output_text.logprobs, reasoning.effort / reasoning.summary,
 * sampling, max_output_tokens, stream.
 *
 * Answer: a response object whose output holds a reasoning item (only
 * when a summary was asked for), the message (output_text) and the call
 * items; streamed as the Responses event sequence with a sequence_number
 * in every event; text events carry `logprobs` (empty unless asked for).
 */
#include <stdlib.h>
#include <string.h>

#include "server.h"

enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL };

#define LOGPROBS_INCLUDE "message.output_text.logprobs"

/* The assistant turn that calls attach to: the last message when it is an
 * assistant turn, else a new one. */
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

/* ------------------------------------------------------------ tools */

/* Remember how a prompt tool name maps back to what the client declared. */
static void add_kind(srv_request *r, const char *prompt_name, const char *type, const char *name, const char *ns) {
    if (!r->tool_kinds) r->tool_kinds = json_object();
    json_t *k = json_pack("{s:s,s:s}", "type", type, "name", name);
    if (ns) json_object_set_new(k, "namespace", json_string(ns));
    json_object_set_new(r->tool_kinds, prompt_name, k);
}

static void add_tool(srv_request *r, json_t *tool) {
    if (!r->tools) r->tools = json_array();
    json_array_append_new(r->tools, tool);
}

/* A custom tool for the model: a function whose one string parameter
 * carries the free text and, when the client gave one, its grammar. */
static json_t *custom_tool(const char *name, const json_t *description, const json_t *format) {
    ds4_strbuf d = {0};
    ds4_strbuf_puts(&d, "The tool's free-form input.");
    const char *ft = json_string_value(json_object_get(format, "type"));
    const json_t *def = json_object_get(format, "definition");
    if (ft && strcmp(ft, "grammar") == 0 && json_is_string(def)) {
        const char *syntax = json_string_value(json_object_get(format, "syntax"));
        ds4_strbuf_printf(&d, " It must follow this %s grammar:\n", syntax ? syntax : "");
        ds4_strbuf_append(&d, json_string_value(def), json_string_length(def));
    }
    json_t *params = json_pack("{s:s,s:{s:{s:s,s:s#}},s:[s]}", "type", "object", "properties", "input", "type",
                               "string", "description", d.p ? d.p : "", d.len, "required", "input");
    ds4_strbuf_free(&d);
    json_t *t = req_openai_tool(name, description, params);
    json_decref(params);
    return t;
}

static int parse_tool(const json_t *t, const char *field, srv_request *r, api_error *e);

/* namespace {name, tools}: each function as NAMESPACE+NAME. */
static int parse_namespace(const json_t *t, const char *field, srv_request *r, api_error *e) {
    const char *ns = json_string_value(json_object_get(t, "name"));
    const json_t *tools = json_object_get(t, "tools");
    if (!ns) return api_fail(e, 400, "%s.name must be a string", field);
    if (!json_is_array(tools)) return api_fail(e, 400, "%s.tools must be an array", field);
    for (size_t k = 0; k < json_array_size(tools); k++) {
        const json_t *f = json_array_get(tools, k);
        const char *type = json_string_value(json_object_get(f, "type"));
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!json_is_object(f) || (type && strcmp(type, "function") != 0))
            return api_fail(e, 400, "%s.tools[%zu]: only function tools can be in a namespace", field, k);
        if (!name) return api_fail(e, 400, "%s.tools[%zu].name must be a string", field, k);
        const json_t *params = json_object_get(f, "parameters");
        if (!params) params = json_object_get(f, "input_schema");
        size_t pl = strlen(ns) + strlen(name) + 1;
        char *prompt_name = malloc(pl);
        if (!prompt_name) return api_fail(e, 500, "out of memory");
        snprintf(prompt_name, pl, "%s%s", ns, name);
        add_tool(r, req_openai_tool(prompt_name, json_object_get(f, "description"), params));
        add_kind(r, prompt_name, "function", name, ns);
        free(prompt_name);
    }
    return 0;
}

static int parse_tool(const json_t *t, const char *field, srv_request *r, api_error *e) {
    if (!json_is_object(t)) return api_fail(e, 400, "%s must be an object", field);
    const char *type = json_string_value(json_object_get(t, "type"));
    const char *name = json_string_value(json_object_get(t, "name"));
    if (!type || strcmp(type, "function") == 0) {
        if (!name) return api_fail(e, 400, "%s.name must be a string", field);
        add_tool(r, req_openai_tool(name, json_object_get(t, "description"), json_object_get(t, "parameters")));
    } else if (strcmp(type, "custom") == 0) {
        if (!name) return api_fail(e, 400, "%s.name must be a string", field);
        add_tool(r, custom_tool(name, json_object_get(t, "description"), json_object_get(t, "format")));
        add_kind(r, name, "custom", name, NULL);
    } else if (strcmp(type, "namespace") == 0) {
        return parse_namespace(t, field, r, e);
    } else if (strcmp(type, "tool_search") == 0) {
        const json_t *d = json_object_get(t, "description");
        json_t *desc = json_is_string(d) ? json_incref((json_t *)d) : json_string("Search available tools.");
        add_tool(r, req_openai_tool("tool_search", desc, json_object_get(t, "parameters")));
        json_decref(desc);
        add_kind(r, "tool_search", "tool_search", "tool_search", NULL);
    }
    /* Other hosted tools (web_search, file_search, ...) are not ours to run. */
    return 0;
}

static int parse_tools(const json_t *tools, srv_request *r, api_error *e) {
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) return api_fail(e, 400, "tools must be an array");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        char field[32];
        snprintf(field, sizeof(field), "tools[%zu]", i);
        if (parse_tool(json_array_get(tools, i), field, r, e)) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ input */

/* A call's arguments as the chat renderer takes them: a string as is
 * (function_call.arguments, JSON text), an object as is. */
static json_t *call_args(const json_t *v) {
    if (json_is_string(v) || json_is_object(v)) return json_copy((json_t *)v);
    return json_object();
}

/* Hosted-tool calls in the history, as the calls they were. */
static const struct {
    const char *type;
    const char *name;
} HOSTED_CALLS[] = {
    {"local_shell_call", "local_shell"},
    {"web_search_call", "web_search_call"},
    {"image_generation_call", "image_generation_call"},
    {"tool_search_call", "tool_search"},
};

static const char *hosted_call_name(const char *type) {
    for (size_t i = 0; i < sizeof(HOSTED_CALLS) / sizeof(HOSTED_CALLS[0]); i++)
        if (strcmp(type, HOSTED_CALLS[i].type) == 0) return HOSTED_CALLS[i].name;
    return NULL;
}

static bool is_call_output(const char *type) {
    static const char *const outs[] = {
        "function_call_output", "custom_tool_call_output", "local_shell_call_output",      "web_search_call_output",
        "tool_search_output",   "tool_search_call_output", "image_generation_call_output", NULL};
    for (int i = 0; outs[i]; i++)
        if (strcmp(type, outs[i]) == 0) return true;
    return false;
}

static int parse_call(const json_t *it, const char *type, size_t i, json_t *msgs, json_t **pending, api_error *e) {
    const char *call_id = json_string_value(json_object_get(it, "call_id"));
    if (!call_id) call_id = json_string_value(json_object_get(it, "id"));
    const char *hosted = hosted_call_name(type);
    json_t *args;
    char *name;
    if (hosted) {
        const json_t *a = json_object_get(it, "action");
        if (!a) a = json_object_get(it, "arguments");
        if (!a) a = json_object_get(it, "input");
        args = call_args(a);
        name = strdup(hosted);
    } else {
        bool custom = strcmp(type, "custom_tool_call") == 0;
        const char *n = json_string_value(json_object_get(it, "name"));
        const char *ns = json_string_value(json_object_get(it, "namespace"));
        const json_t *a = json_object_get(it, custom ? "input" : "arguments");
        if (!n) return api_fail(e, 400, "input[%zu].name must be a string", i);
        if (!json_is_string(a))
            return api_fail(e, 400, "input[%zu].%s must be a string", i, custom ? "input" : "arguments");
        /* A custom tool's text is its one parameter for the model. */
        args = custom ? json_pack("{s:O}", "input", (json_t *)a) : json_copy((json_t *)a);
        size_t nl = strlen(n) + (ns && !custom ? strlen(ns) : 0) + 1;
        if ((name = malloc(nl))) snprintf(name, nl, "%s%s", ns && !custom ? ns : "", n);
    }
    if (!name || !args) {
        free(name);
        json_decref(args);
        return api_fail(e, 500, "out of memory");
    }
    add_call(assistant_turn(msgs, pending), call_id, name, args);
    free(name);
    return 0;
}

static int parse_call_output(const json_t *it, const char *type, size_t i, json_t *msgs, srv_request *r, api_error *e) {
    const char *call_id = json_string_value(json_object_get(it, "call_id"));
    if (!call_id) call_id = json_string_value(json_object_get(it, "id"));
    if (!call_id) return api_fail(e, 400, "input[%zu].call_id must be a string", i);
    char field[64];
    snprintf(field, sizeof(field), "input[%zu].output", i);
    const json_t *out = json_object_get(it, "output");
    if (!out) out = json_object_get(it, "result");
    const json_t *tools = json_object_get(it, "tools");
    ds4_strbuf t = {0};
    int rc = 0;
    if (strcmp(type, "tool_search_output") == 0 && tools) {
        /* The tools it found join the prompt's; their list is the result. */
        if (!json_is_array(tools)) return api_fail(e, 400, "input[%zu].tools must be an array", i);
        snprintf(field, sizeof(field), "input[%zu].tools", i);
        for (size_t k = 0; k < json_array_size(tools) && rc == 0; k++) {
            char f[128];
            snprintf(f, sizeof(f), "%s[%zu]", field, k);
            rc = parse_tool(json_array_get(tools, k), f, r, e);
        }
        char *s = rc == 0 && !out ? json_dumps(tools, JSON_COMPACT) : NULL;
        if (s) ds4_strbuf_puts(&t, s);
        free(s);
    }
    if (rc == 0 && out && !json_is_string(out) && !json_is_array(out)) {
        char *s = json_dumps(out, JSON_COMPACT | JSON_ENCODE_ANY);
        if (s) ds4_strbuf_puts(&t, s);
        free(s);
    } else if (rc == 0 && out) {
        rc = req_text(out, field, &t, e);
    }
    if (rc == 0)
        json_array_append_new(msgs, json_pack("{s:s,s:s,s:s#}", "role", "tool", "tool_call_id", call_id, "content",
                                              t.p ? t.p : "", t.len));
    ds4_strbuf_free(&t);
    return rc;
}

static int parse_item(const json_t *it, size_t i, srv_request *r, json_t **pending_reasoning, api_error *e) {
    json_t *msgs = r->messages;
    if (!json_is_object(it)) return api_fail(e, 400, "input[%zu] must be an object", i);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    const json_t *status = json_object_get(it, "status");
    if (json_is_string(status) && strcmp(json_string_value(status), "completed") != 0)
        return api_fail(e, 400, "input[%zu]: items with status \"%s\" cannot be replayed", i,
                        json_string_value(status));
    char field[64];
    snprintf(field, sizeof(field), "input[%zu].content", i);
    if (!type || strcmp(type, "message") == 0) {
        if (!role) return api_fail(e, 400, "input[%zu]: a message needs a role", i);
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))
            return api_fail(e, 400, "input[%zu].role \"%s\" is not supported", i, role);
        ds4_strbuf t = {0};
        if (req_text(json_object_get(it, "content"), field, &t, e)) {
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
            if (parts[k] && !json_is_null(parts[k]) && req_text(parts[k], field, &t, e)) {
                ds4_strbuf_free(&t);
                return -1;
            }
        }
        json_decref(*pending_reasoning);
        *pending_reasoning = json_stringn(t.p ? t.p : "", t.len);
        ds4_strbuf_free(&t);
        return 0;
    }
    if (strcmp(type, "function_call") == 0 || strcmp(type, "custom_tool_call") == 0 || hosted_call_name(type))
        return parse_call(it, type, i, msgs, pending_reasoning, e);
    if (is_call_output(type)) return parse_call_output(it, type, i, msgs, r, e);
    if (strcmp(type, "compaction") == 0 || strcmp(type, "context_compaction") == 0) return 0;
    return api_fail(e, 400, "input[%zu]: item type \"%s\" is not supported", i, type);
}

/* ------------------------------------------------------------ options */

/* The prompt name of a tool the client names (a namespaced function is
 * NAMESPACE+NAME in the prompt). */
static const char *prompt_name_of(const srv_request *r, const char *name, const char *ns) {
    const char *key;
    const json_t *k;
    json_object_foreach((json_t *)r->tool_kinds, key, k) {
        const char *kn = json_string_value(json_object_get(k, "name"));
        const char *kns = json_string_value(json_object_get(k, "namespace"));
        if (kn && strcmp(kn, name) == 0 && (!ns || (kns && strcmp(kns, ns) == 0)) && (kns || !ns)) return key;
    }
    return name;
}

/* allowed_tools {mode, tools}: only those tools stay in the prompt. */
static int allowed_tools(const json_t *tc, srv_request *r, api_error *e) {
    const char *mode = json_string_value(json_object_get(tc, "mode"));
    const json_t *list = json_object_get(tc, "tools");
    if (!json_is_array(list)) return api_fail(e, 400, "tool_choice.tools must be an array");
    json_t *keep = json_array();
    for (size_t i = 0; i < json_array_size(r->tools); i++) {
        json_t *t = json_array_get(r->tools, i);
        const char *pn = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
        for (size_t k = 0; pn && k < json_array_size(list); k++) {
            const json_t *a = json_array_get(list, k);
            const char *n = json_string_value(json_object_get(a, "name"));
            if (!n) n = json_string_value(json_object_get(a, "type")); /* hosted: tool_search */
            if (n && strcmp(prompt_name_of(r, n, json_string_value(json_object_get(a, "namespace"))), pn) == 0) {
                json_array_append(keep, t);
                break;
            }
        }
    }
    json_decref(r->tools);
    r->tools = keep;
    if (!mode || strcmp(mode, "auto") == 0) return req_tool_choice(r, TOOL_AUTO, NULL, "tool_choice", e);
    if (strcmp(mode, "required") == 0) return req_tool_choice(r, TOOL_REQUIRED, NULL, "tool_choice", e);
    return api_fail(e, 400, "tool_choice.mode must be \"auto\" or \"required\"");
}

static int parse_tool_choice(const json_t *b, srv_request *r, api_error *e) {
    bool parallel = true;
    if (req_bool(b, "parallel_tool_calls", &parallel, e)) return -1;
    r->serial_calls = !parallel;
    const json_t *tc = json_object_get(b, "tool_choice");
    if (!tc || json_is_null(tc)) return 0;
    const char *c = json_string_value(tc);
    if (c) {
        if (strcmp(c, "none") == 0) return req_tool_choice(r, TOOL_NONE, NULL, "tool_choice", e);
        if (strcmp(c, "auto") == 0) return req_tool_choice(r, TOOL_AUTO, NULL, "tool_choice", e);
        if (strcmp(c, "required") == 0) return req_tool_choice(r, TOOL_REQUIRED, NULL, "tool_choice", e);
        return api_fail(e, 400, "tool_choice \"%s\" is not supported (none, auto, required)", c);
    }
    const char *type = json_string_value(json_object_get(tc, "type"));
    const char *name = json_string_value(json_object_get(tc, "name"));
    if (!json_is_object(tc) || !type) return api_fail(e, 400, "tool_choice must be a string or an object with a type");
    if (strcmp(type, "allowed_tools") == 0) return allowed_tools(tc, r, e);
    if ((strcmp(type, "function") == 0 || strcmp(type, "custom") == 0) && name)
        return req_tool_choice(r, TOOL_NAMED,
                               prompt_name_of(r, name, json_string_value(json_object_get(tc, "namespace"))),
                               "tool_choice", e);
    if (strcmp(type, "tool_search") == 0) return req_tool_choice(r, TOOL_NAMED, "tool_search", "tool_choice", e);
    return api_fail(e, 400,
                    "tool_choice of type \"%s\" is not supported (a function or custom tool by name, "
                    "allowed_tools)",
                    type);
}

/* text.format: text, json_object, json_schema {name, schema, strict}. */
static int parse_text_format(const json_t *b, srv_request *r, api_error *e) {
    const json_t *text = json_object_get(b, "text");
    if (!text || json_is_null(text)) return 0;
    if (!json_is_object(text)) return api_fail(e, 400, "text must be an object");
    const json_t *f = json_object_get(text, "format");
    if (!f || json_is_null(f)) return 0;
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type) return api_fail(e, 400, "text.format must be an object with a type");
    if (strcmp(type, "text") == 0) return 0;
    if (strcmp(type, "json_object") == 0) return req_json_answer(r, NULL, f, "text.format", e);
    if (strcmp(type, "json_schema") != 0)
        return api_fail(e, 400, "text.format.type \"%s\" is not supported (text, json_object, json_schema)", type);
    const json_t *schema = json_object_get(f, "schema");
    if (!json_is_object(schema)) return api_fail(e, 400, "text.format.schema must be an object");
    return req_json_answer(r, schema, f, "text.format.schema", e);
}

/* Logprobs when include names them or top_logprobs asks for alternatives. */
static int parse_logprobs(const json_t *b, srv_request *r, api_error *e) {
    const json_t *inc = json_object_get(b, "include");
    const json_t *top = json_object_get(b, "top_logprobs");
    bool want = top && !json_is_null(top);
    if (inc && !json_is_null(inc) && !json_is_array(inc)) return api_fail(e, 400, "include must be an array");
    for (size_t i = 0; i < json_array_size(inc); i++) {
        const char *s = json_string_value(json_array_get(inc, i));
        if (s && strcmp(s, LOGPROBS_INCLUDE) == 0) want = true;
    }
    return want ? req_logprobs(r, top, "top_logprobs", MAX_TOP_LOGPROBS, e) : 0;
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
    /* Tools first: a tool_search_output in the input adds to them. */
    if (parse_tools(json_object_get(b, "tools"), r, e)) return -1;
    const json_t *instr = json_object_get(b, "instructions");
    if (json_is_string(instr))
        json_array_append_new(r->messages, json_pack("{s:s,s:O}", "role", "system", "content", (json_t *)instr));
    else if (instr && !json_is_null(instr)) return api_fail(e, 400, "instructions must be a string");
    if (json_is_string(input)) {
        json_array_append_new(r->messages, json_pack("{s:s,s:O}", "role", "user", "content", (json_t *)input));
    } else if (json_is_array(input)) {
        json_t *pending = NULL;
        for (size_t i = 0; i < json_array_size(input); i++) {
            if (parse_item(json_array_get(input, i), i, r, &pending, e)) {
                json_decref(pending);
                return -1;
            }
        }
        json_decref(pending);
    } else {
        return api_fail(e, 400, "input must be a string or an array of items");
    }
    if (json_array_size(r->messages) == 0) return api_fail(e, 400, "input must not be empty");
    if (parse_tool_choice(b, r, e) || parse_text_format(b, r, e) || parse_logprobs(b, r, e)) return -1;
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
    if (req_sampling(b, r, false, e) || req_steering(b, r, e) || req_max_tokens(b, max_names, r, e) ||
        req_bool(b, "stream", &r->stream, e))
        return -1;
    req_model(b, r, explicit_think);
    return req_finalize(r, e);
}

/* ------------------------------------------------------------- answers */

/* How a generated call is answered: NULL (a function), or the client's
 * declaration {"type", "name", "namespace"}. */
static const json_t *kind_of(const job *j, const gen_call *c) { return json_object_get(j->req.tool_kinds, c->name); }

static bool kind_is(const json_t *k, const char *type) {
    const char *t = json_string_value(json_object_get(k, "type"));
    return t && strcmp(t, type) == 0;
}

static void fc_id(const gen_call *c, char *out, size_t n) {
    const char *hex = strncmp(c->id, "call_", 5) == 0 ? c->id + 5 : c->id;
    snprintf(out, n, "fc_%s", hex);
}

/* A custom tool call's text: the `input` parameter (the whole arguments
 * when the model wrote something else). */
static json_t *custom_input(const gen_call *c) {
    json_t *a = json_loadb(c->args.p ? c->args.p : "{}", c->args.p ? c->args.len : 2, JSON_ALLOW_NUL, NULL);
    json_t *in = json_object_get(a, "input");
    json_t *out = json_is_string(in) && json_object_size(a) == 1
                      ? json_incref(in)
                      : json_stringn(c->args.p ? c->args.p : "", c->args.len);
    json_decref(a);
    return out;
}

static json_t *reasoning_item(const char *id, const gen_out *o, bool done) {
    return json_pack("{s:s,s:s,s:[{s:s,s:s#}],s:s}", "type", "reasoning", "id", id, "summary", "type", "summary_text",
                     "text", o->reasoning.p ? o->reasoning.p : "", o->reasoning.len, "status",
                     done && o->think_closed ? "completed"
                     : done                  ? "incomplete"
                                             : "in_progress");
}

static json_t *message_item(const job *j, const char *id, const char *text, size_t n, const char *status) {
    json_t *content = json_array();
    if (strcmp(status, "in_progress") != 0) {
        json_t *part = json_pack("{s:s,s:s#,s:[]}", "type", "output_text", "text", text, n, "annotations");
        if (j->req.logprobs >= 0) json_object_set_new(part, "logprobs", logprobs_entries(&j->out, 0, j->out.n_lp));
        json_array_append_new(content, part);
    }
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", id, "status", status, "role", "assistant",
                     "content", content);
}

static json_t *call_item(const job *j, const gen_call *c, const char *status, bool with_args) {
    char id[64];
    fc_id(c, id, sizeof(id));
    const json_t *k = kind_of(j, c);
    const char *args = with_args && c->args.p ? c->args.p : "";
    size_t n = with_args ? c->args.len : 0;
    if (kind_is(k, "tool_search")) {
        json_t *a = json_loadb(with_args && c->args.p ? c->args.p : "{}", with_args && c->args.p ? c->args.len : 2, 0,
                               NULL);
        if (!json_is_object(a)) {
            json_decref(a);
            a = json_object();
        }
        return json_pack("{s:s,s:s,s:s,s:s,s:s,s:o}", "type", "tool_search_call", "id", id, "status", status, "call_id",
                         c->id, "execution", "client", "arguments", a);
    }
    if (kind_is(k, "custom"))
        return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s}", "type", "custom_tool_call", "id", id, "call_id", c->id, "name",
                         json_string_value(json_object_get(k, "name")), "input",
                         with_args ? custom_input(c) : json_string(""), "status", status);
    json_t *item = json_pack("{s:s,s:s,s:s,s:s,s:s#,s:s}", "type", "function_call", "id", id, "call_id", c->id, "name",
                             k ? json_string_value(json_object_get(k, "name")) : c->name, "arguments", args, n,
                             "status", status);
    const json_t *ns = json_object_get(k, "namespace");
    if (ns) json_object_set(item, "namespace", (json_t *)ns);
    return item;
}

static json_t *response_object(job *j, const char *status, json_t *output) {
    const srv_request *r = &j->req;
    json_t *resp = json_pack("{s:s,s:s,s:i,s:s,s:n,s:n,s:n,s:s,s:o,s:b,s:n,s:f,s:f,s:s,s:o,s:s,s:{s:{s:s}},s:n,s:{}}",
                             "id", j->id, "object", "response", "created_at", (json_int_t)j->created, "status", status,
                             "error", "incomplete_details", "instructions", "model", r->model, "output", output,
                             "parallel_tool_calls", !r->serial_calls, "previous_response_id", "temperature",
                             (double)r->sp.temperature, "top_p", (double)r->sp.top_p, "tool_choice",
                             r->tool_choice == TOOL_NONE   ? "none"
                             : r->tool_choice == TOOL_AUTO ? "auto"
                                                           : "required",
                             "tools", json_array(), "truncation", "disabled", "text", "format", "type",
                             r->schema ? "json_schema" : "text", "user", "metadata");
    if (r->response_format) json_object_set(json_object_get(resp, "text"), "format", r->response_format);
    json_object_set_new(resp, "reasoning",
                        json_pack("{s:s,s:n}", "effort",
                                  r->think == DS4_THINK_OFF   ? "none"
                                  : r->think == DS4_THINK_MAX ? "max"
                                                              : "high",
                                  "summary"));
    if (r->max_tokens) json_object_set_new(resp, "max_output_tokens", json_integer(r->max_tokens));
    if (r->logprobs >= 0) json_object_set_new(resp, "top_logprobs", json_integer(r->logprobs));
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
        json_array_append_new(
            output, message_item(j, j->ss.msg_item_id, o->content.p ? o->content.p : "", o->content.len, "completed"));
    }
    for (size_t i = 0; i < o->n_calls; i++)
        json_array_append_new(output, call_item(j, &o->calls[i], "completed", true));
    const char *status = final_status(o);
    json_t *resp = response_object(j, status, output);
    json_object_set_new(resp, "usage", usage_responses(o));
    if (strcmp(status, "incomplete") == 0)
        json_object_set_new(resp, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    if (strcmp(status, "failed") == 0)
        json_object_set_new(
            resp, "error",
            json_pack("{s:s,s:o}", "code", "server_error", "message", json_utf8(o->error, strlen(o->error))));
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
    json_t *part = json_pack("{s:s,s:s#}", "type", "summary_text", "text", o->reasoning.p ? o->reasoning.p : "",
                             o->reasoning.len);
    event(j, out, "response.reasoning_summary_text.done",
          json_pack("{s:s,s:i,s:i,s:s#}", "item_id", id, "output_index", ss->item, "summary_index", 0, "text",
                    o->reasoning.p ? o->reasoning.p : "", o->reasoning.len));
    event(j, out, "response.reasoning_summary_part.done",
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", ss->item, "summary_index", 0, "part", part));
    event(j, out, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", ss->item, "item", reasoning_item(id, o, true)));
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
          json_pack("{s:i,s:o}", "output_index", ss->item, "item",
                    message_item(j, ss->msg_item_id, "", 0, "in_progress")));
    event(j, out, "response.content_part.added",
          json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}", "item_id", ss->msg_item_id, "output_index", ss->item,
                    "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
}

/* The logprobs of the text since the last text event ([] unless asked). */
static json_t *text_logprobs(job *j, bool all) {
    gen_out *o = &j->out;
    if (j->req.logprobs < 0) return json_array();
    json_t *a = logprobs_entries(o, all ? 0 : o->lp_sent, o->n_lp);
    if (!all) o->lp_sent = o->n_lp;
    return a;
}

static void close_message(job *j, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    if (ss->block_kind != ITEM_MESSAGE) return;
    const gen_out *o = &j->out;
    const char *text = o->content.p ? o->content.p : "";
    event(j, out, "response.output_text.done",
          json_pack("{s:s,s:i,s:i,s:s#,s:o}", "item_id", ss->msg_item_id, "output_index", ss->item, "content_index", 0,
                    "text", text, o->content.len, "logprobs", text_logprobs(j, true)));
    json_t *part = json_pack("{s:s,s:s#,s:[]}", "type", "output_text", "text", text, o->content.len, "annotations");
    if (j->req.logprobs >= 0) json_object_set_new(part, "logprobs", text_logprobs(j, true));
    event(j, out, "response.content_part.done",
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", ss->msg_item_id, "output_index", ss->item, "content_index", 0,
                    "part", part));
    event(j, out, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", ss->item, "item",
                    message_item(j, ss->msg_item_id, text, o->content.len, "completed")));
    ss->block_kind = ITEM_NONE;
    ss->text_started = true;
}

static void stream_begin(job *j, ds4_strbuf *out) {
    event(j, out, "response.created", json_pack("{s:o}", "response", response_object(j, "in_progress", json_array())));
    event(j, out, "response.in_progress",
          json_pack("{s:o}", "response", response_object(j, "in_progress", json_array())));
}

/* A complete call (output.c answers calls whole): added, its arguments or
 * input, done. */
static void stream_call(job *j, int index, ds4_strbuf *out) {
    stream_state *ss = &j->ss;
    if (index >= 64) return;
    const gen_call *c = &j->out.calls[index];
    const json_t *k = kind_of(j, c);
    char id[64];
    fc_id(c, id, sizeof(id));
    ss->call_item[index] = ss->next_item++;
    ss->any_call_streamed = true;
    int oi = ss->call_item[index];
    event(j, out, "response.output_item.added",
          json_pack("{s:i,s:o}", "output_index", oi, "item", call_item(j, c, "in_progress", false)));
    if (kind_is(k, "custom")) {
        json_t *in = custom_input(c);
        event(j, out, "response.custom_tool_call_input.delta",
              json_pack("{s:s,s:i,s:O}", "item_id", id, "output_index", oi, "delta", in));
        event(j, out, "response.custom_tool_call_input.done",
              json_pack("{s:s,s:i,s:o}", "item_id", id, "output_index", oi, "input", in));
    } else if (!kind_is(k, "tool_search")) {
        const char *a = c->args.p ? c->args.p : "";
        event(j, out, "response.function_call_arguments.delta",
              json_pack("{s:s,s:i,s:s#}", "item_id", id, "output_index", oi, "delta", a, c->args.len));
        json_t *done = json_pack("{s:s,s:i,s:s,s:s#}", "item_id", id, "output_index", oi, "name",
                                 k ? json_string_value(json_object_get(k, "name")) : c->name, "arguments", a,
                                 c->args.len);
        if (json_object_get(k, "namespace")) json_object_set(done, "namespace", json_object_get(k, "namespace"));
        event(j, out, "response.function_call_arguments.done", done);
    }
    event(j, out, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", oi, "item", call_item(j, c, "completed", true)));
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
              json_pack("{s:s,s:i,s:i,s:s#,s:o}", "item_id", ss->msg_item_id, "output_index", ss->item, "content_index",
                        0, "delta", text, n, "logprobs", text_logprobs(j, false)));
        return;
    case EV_CALL_START:
        close_reasoning(j, out);
        close_message(j, out);
        return;
    case EV_CALL_ARGS: return;
    case EV_CALL_END: stream_call(j, index, out); return;
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
