/*
 * chat.c - the DeepSeek V4 chat renderer (see chat.h).
 *
 * Three passes, as in the official encoder: merge tool results into user
 * turns (and sort them by call order), drop old reasoning in thinking mode,
 * then render each message, looking at its neighbours for the transition
 * tokens.
 */
#include "text/chat.h"

#include <stdlib.h>
#include <string.h>

#include "text/dsml_render.h"
#include "text/pyjson.h"

static const char THINK_MAX_PREFIX[] =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

static const char TOOLS_HEAD[] =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";

static const char TOOLS_TAIL[] =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

static const char RESPONSE_FORMAT_HEAD[] =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

/* Special spellings inside the renderer's own template text. */
static const char *const TEMPLATE_SPECIALS[] = {DS4_DSML_MARKER, DS4_TOK_THINK, DS4_TOK_THINK_END, NULL};

static const char *const TASKS[][2] = {
    {"action", "<｜action｜>"}, {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
    {"domain", "<｜domain｜>"}, {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"},
};

typedef enum role {
    ROLE_SYSTEM,
    ROLE_DEVELOPER,
    ROLE_USER,
    ROLE_ASSISTANT,
    ROLE_LATEST_REMINDER,
    ROLE_TOOL,
} role;

/* A part of a merged user turn: its text, or a tool result. */
typedef struct block {
    int is_tool;
    const json_t *content;
    const char *tool_id;
} block;

typedef struct cmsg {
    role role;
    size_t index;        /* in the caller's array, for messages; SIZE_MAX if made up */
    const json_t *src;   /* the message object (NULL for a made-up system message) */
    const json_t *tools; /* non-empty tool array, or NULL */
    block *blocks;       /* user turns */
    size_t n_blocks;
    const char *task; /* special token of the quick-instruction task, or NULL */
    int wo_eos;
    int drop_reasoning;
} cmsg;

typedef struct conv {
    cmsg *m;
    size_t n;
    const ds4_chat_opts *opts;
    int thinking;
    int drop;
} conv;

ds4_think_mode ds4_chat_effective_think(const ds4_chat_opts *opts) {
    if (opts->think == DS4_THINK_MAX && opts->ctx_size && opts->ctx_size < DS4_THINK_MAX_MIN_CTX) return DS4_THINK_HIGH;
    return opts->think;
}

/* Python truthiness of a JSON value (absent counts as None). */
static int truthy(const json_t *v) {
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

static void free_conv(conv *c) {
    for (size_t i = 0; i < c->n; i++) free(c->m[i].blocks);
    free(c->m);
    c->m = NULL;
    c->n = 0;
}

static cmsg *push_msg(conv *c, ds4_err *err) {
    cmsg *m = realloc(c->m, (c->n + 1) * sizeof(*m));
    if (!m) {
        ds4_err_set(err, DS4_ENOMEM, "rendering chat: out of memory");
        return NULL;
    }
    c->m = m;
    memset(&m[c->n], 0, sizeof(m[c->n]));
    return &m[c->n++];
}

static int push_block(cmsg *m, block b, ds4_err *err) {
    block *p = realloc(m->blocks, (m->n_blocks + 1) * sizeof(*p));
    if (!p) return ds4_err_set(err, DS4_ENOMEM, "rendering chat: out of memory");
    m->blocks = p;
    p[m->n_blocks++] = b;
    return 0;
}

static int parse_role(const json_t *msg, size_t i, role *out, ds4_err *err) {
    static const struct {
        const char *name;
        role r;
    } roles[] = {
        {"system", ROLE_SYSTEM},
        {"developer", ROLE_DEVELOPER},
        {"user", ROLE_USER},
        {"assistant", ROLE_ASSISTANT},
        {"latest_reminder", ROLE_LATEST_REMINDER},
        {"tool", ROLE_TOOL},
        {"function", ROLE_TOOL},
    };
    const char *name = json_string_value(json_object_get(msg, "role"));
    if (!json_is_object(msg) || !name) return ds4_err_set(err, DS4_EINVAL, "messages[%zu]: no role", i);
    for (size_t k = 0; k < sizeof(roles) / sizeof(roles[0]); k++) {
        if (strcmp(name, roles[k].name) == 0) {
            *out = roles[k].r;
            return 0;
        }
    }
    return ds4_err_set(err, DS4_EINVAL, "messages[%zu]: unknown role \"%s\"", i, name);
}

static int parse_task(const json_t *msg, size_t i, const char **task, ds4_err *err) {
    const json_t *t = json_object_get(msg, "task");
    *task = NULL;
    if (!t || json_is_null(t)) return 0;
    for (size_t k = 0; k < sizeof(TASKS) / sizeof(TASKS[0]); k++) {
        if (json_is_string(t) && strcmp(json_string_value(t), TASKS[k][0]) == 0) {
            *task = TASKS[k][1];
            return 0;
        }
    }
    return ds4_err_set(err, DS4_EINVAL,
                       "messages[%zu]: invalid task (valid: action, query, authority, domain, "
                       "title, read_url)",
                       i);
}

static int parse_tools(const json_t *tools, size_t i, const json_t **out, ds4_err *err) {
    *out = NULL;
    if (!truthy(tools)) return 0;
    if (!json_is_array(tools)) return ds4_err_set(err, DS4_EINVAL, "messages[%zu]: tools is not an array", i);
    *out = tools;
    return 0;
}

/* merge_tool_messages: tool results join (or start) a user turn; a user
 * message joins a preceding user turn that has no task. */
static int merge_messages(conv *c, const json_t *messages, ds4_err *err) {
    const json_t *first = json_array_get(messages, 0);
    role r0;
    int first_is_system = first && parse_role(first, 0, &r0, NULL) == 0 && r0 == ROLE_SYSTEM;
    if (truthy(c->opts->tools) && !first_is_system) {
        cmsg *m = push_msg(c, err);
        if (!m) return -1;
        m->role = ROLE_SYSTEM;
        m->index = SIZE_MAX;
        if (parse_tools(c->opts->tools, 0, &m->tools, err)) return ds4_err_prefix(err, "options");
    }
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const json_t *msg = json_array_get(messages, i);
        role r;
        if (parse_role(msg, i, &r, err)) return -1;
        cmsg *last = c->n ? &c->m[c->n - 1] : NULL;
        if (r == ROLE_TOOL || r == ROLE_USER) {
            const char *task = NULL;
            if (r == ROLE_USER && parse_task(msg, i, &task, err)) return -1;
            block b = {r == ROLE_TOOL, json_object_get(msg, "content"),
                       json_string_value(json_object_get(msg, "tool_call_id"))};
            int join = last && last->role == ROLE_USER && (r == ROLE_TOOL || !last->task);
            if (!join) {
                if (!(last = push_msg(c, err))) return -1;
                last->role = ROLE_USER;
                last->index = i;
                last->src = msg;
                last->task = task;
                last->wo_eos = r == ROLE_USER && truthy(json_object_get(msg, "wo_eos"));
            }
            if (push_block(last, b, err)) return -1;
            continue;
        }
        cmsg *m = push_msg(c, err);
        if (!m) return -1;
        m->role = r;
        m->index = i;
        m->src = msg;
        m->wo_eos = truthy(json_object_get(msg, "wo_eos"));
        if (parse_task(msg, i, &m->task, err)) return -1;
        const json_t *tools = json_object_get(msg, "tools");
        if (i == 0 && first_is_system && truthy(c->opts->tools)) tools = c->opts->tools;
        if (parse_tools(tools, i, &m->tools, err)) return -1;
    }
    return 0;
}

/* Id of an assistant tool call: "id", or "function"."id". */
static const char *call_id(const json_t *tc) {
    const char *id = json_string_value(json_object_get(tc, "id"));
    if (!id || !*id) id = json_string_value(json_object_get(json_object_get(tc, "function"), "id"));
    return id && *id ? id : NULL;
}

/* Position of a tool result's id among the last assistant's calls (0 when
 * unknown, as the official encoder's dict.get(id, 0); a repeated id counts
 * at its last position, as a dict built in order keeps it). */
static size_t call_order(const json_t *calls, const char *id) {
    size_t pos = 0;
    for (size_t k = 0; id && k < json_array_size(calls); k++) {
        const char *cid = call_id(json_array_get(calls, k));
        if (cid && strcmp(cid, id) == 0) pos = k;
    }
    return pos;
}

/* sort_tool_results_by_call_order: a stable sort of the tool results of
 * each user turn by the preceding tool calls' order, text parts staying
 * where they are. */
static int sort_tool_results(conv *c, ds4_err *err) {
    const json_t *calls = NULL; /* last assistant tool_calls with at least one id */
    for (size_t i = 0; i < c->n; i++) {
        cmsg *m = &c->m[i];
        if (m->role == ROLE_ASSISTANT && m->src && truthy(json_object_get(m->src, "tool_calls"))) {
            const json_t *tc = json_object_get(m->src, "tool_calls");
            calls = NULL;
            for (size_t k = 0; k < json_array_size(tc); k++)
                if (call_id(json_array_get(tc, k))) calls = tc;
            continue;
        }
        if (m->role != ROLE_USER || !calls) continue;
        size_t nt = 0;
        for (size_t k = 0; k < m->n_blocks; k++) nt += (size_t)m->blocks[k].is_tool;
        if (nt < 2) continue;
        /* Stable insertion sort of the tool results by call order, written
         * back into the slots the tool results occupied. */
        block *tools = malloc(nt * sizeof(*tools));
        if (!tools) return ds4_err_set(err, DS4_ENOMEM, "rendering chat: out of memory");
        size_t n = 0;
        for (size_t k = 0; k < m->n_blocks; k++) {
            if (!m->blocks[k].is_tool) continue;
            block b = m->blocks[k];
            size_t key = call_order(calls, b.tool_id), j = n++;
            while (j > 0 && call_order(calls, tools[j - 1].tool_id) > key) {
                tools[j] = tools[j - 1];
                j--;
            }
            tools[j] = b;
        }
        for (size_t k = 0, t = 0; k < m->n_blocks; k++)
            if (m->blocks[k].is_tool) m->blocks[k] = tools[t++];
        free(tools);
    }
    return 0;
}

static size_t last_user_index(const conv *c) {
    for (size_t i = c->n; i-- > 0;)
        if (c->m[i].role == ROLE_USER || c->m[i].role == ROLE_DEVELOPER) return i;
    return SIZE_MAX;
}

/* _drop_thinking_messages: before the last user turn, assistant turns lose
 * their reasoning and developer turns disappear. */
static void drop_old_reasoning(conv *c) {
    size_t last = last_user_index(c), out = 0;
    for (size_t i = 0; i < c->n; i++) {
        cmsg m = c->m[i];
        int before = last != SIZE_MAX && i < last;
        if (!before || m.role == ROLE_USER || m.role == ROLE_SYSTEM || m.role == ROLE_LATEST_REMINDER) {
            c->m[out++] = m;
        } else if (m.role == ROLE_ASSISTANT) {
            m.drop_reasoning = 1;
            c->m[out++] = m;
        } else {
            free(m.blocks);
        }
    }
    c->n = out;
}

/* ---- rendering ---- */

static int content_error(const cmsg *m, const char *field, const char *what, ds4_err *err) {
    if (m->index == SIZE_MAX) return ds4_err_set(err, DS4_EINVAL, "options: %s %s", field, what);
    return ds4_err_set(err, DS4_EINVAL, "messages[%zu]: %s %s", m->index, field, what);
}

/* Message text: a string, null/absent (""), or a list of text parts
 * (concatenated; other part types are refused). */
static int render_content(ds4_rendered *r, const cmsg *m, const char *field, const json_t *v, ds4_err *err) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        ds4_rendered_text(r, json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v)) return content_error(m, field, "is neither a string nor a list of parts", err);
    for (size_t k = 0; k < json_array_size(v); k++) {
        const json_t *part = json_array_get(v, k);
        const json_t *text = json_object_get(part, "text");
        const char *type = json_string_value(json_object_get(part, "type"));
        if (json_is_string(part)) {
            ds4_rendered_text(r, json_string_value(part), json_string_length(part));
        } else if (json_is_string(text) && (!type || strcmp(type, "text") == 0)) {
            ds4_rendered_text(r, json_string_value(text), json_string_length(text));
        } else {
            return content_error(m, field, "has a part that is not text", err);
        }
    }
    return 0;
}

/* A tool result's content: text, or a list whose text parts are joined by
 * blank lines and whose other parts read "[Unsupported TYPE]". */
static int render_tool_result(ds4_rendered *r, const cmsg *m, const json_t *v, ds4_err *err) {
    ds4_rendered_puts(r, "<tool_result>");
    if (json_is_array(v)) {
        for (size_t k = 0; k < json_array_size(v); k++) {
            const json_t *part = json_array_get(v, k);
            const char *type = json_string_value(json_object_get(part, "type"));
            if (k) ds4_rendered_puts(r, "\n\n");
            if (type && strcmp(type, "text") == 0) {
                if (render_content(r, m, "tool result text", json_object_get(part, "text"), err)) return -1;
            } else {
                ds4_rendered_puts(r, "[Unsupported ");
                ds4_rendered_puts(r, type ? type : "None");
                ds4_rendered_puts(r, "]");
            }
        }
    } else if (render_content(r, m, "content", v, err)) {
        return -1;
    }
    ds4_rendered_puts(r, "</tool_result>");
    return 0;
}

static void render_json(ds4_rendered *r, const json_t *v) {
    ds4_strbuf b = {0};
    ds4_pyjson_dump(&b, v);
    ds4_rendered_text(r, b.p ? b.p : "", b.len);
    if (b.failed) r->failed = true;
    ds4_strbuf_free(&b);
}

/* "\n\n" + tools block, then "\n\n" + response format, when present. */
static void render_tools_and_format(ds4_rendered *r, const cmsg *m) {
    if (m->tools) {
        ds4_rendered_puts(r, "\n\n");
        ds4_rendered_template(r, TOOLS_HEAD, TEMPLATE_SPECIALS);
        for (size_t k = 0; k < json_array_size(m->tools); k++) {
            const json_t *tool = json_array_get(m->tools, k);
            const json_t *fn = json_object_get(tool, "function");
            if (k) ds4_rendered_puts(r, "\n");
            render_json(r, fn ? fn : tool);
        }
        ds4_rendered_template(r, TOOLS_TAIL, TEMPLATE_SPECIALS);
    }
    const json_t *rf = m->src ? json_object_get(m->src, "response_format") : NULL;
    if (truthy(rf)) {
        ds4_rendered_puts(r, "\n\n");
        ds4_rendered_puts(r, RESPONSE_FORMAT_HEAD);
        render_json(r, rf);
    }
}

static int render_user(ds4_rendered *r, const cmsg *m, ds4_err *err) {
    ds4_rendered_special(r, DS4_TOK_USER);
    for (size_t k = 0; k < m->n_blocks; k++) {
        if (k) ds4_rendered_puts(r, "\n\n");
        int rc = m->blocks[k].is_tool ? render_tool_result(r, m, m->blocks[k].content, err)
                                      : render_content(r, m, "content", m->blocks[k].content, err);
        if (rc) return -1;
    }
    return 0;
}

static int render_assistant(ds4_rendered *r, const conv *c, size_t i, size_t last_user, ds4_err *err) {
    const cmsg *m = &c->m[i];
    int prev_has_task = i > 0 && c->m[i - 1].task;
    if (c->thinking && !prev_has_task && (!c->drop || (last_user == SIZE_MAX || i > last_user))) {
        if (!m->drop_reasoning &&
            render_content(r, m, "reasoning_content", json_object_get(m->src, "reasoning_content"), err))
            return -1;
        ds4_rendered_special(r, DS4_TOK_THINK_END);
    }
    if (render_content(r, m, "content", json_object_get(m->src, "content"), err)) return -1;
    const json_t *calls = json_object_get(m->src, "tool_calls");
    if (truthy(calls)) {
        int replayed = c->opts->render_calls ? c->opts->render_calls(c->opts->render_calls_ctx, calls, r, err) : 0;
        if (replayed < 0 || (replayed == 0 && ds4_dsml_render_calls(r, calls, err)))
            return ds4_err_prefix(err, "messages[%zu]", m->index);
    }
    if (!m->wo_eos) ds4_rendered_special(r, DS4_TOK_EOS);
    return 0;
}

/* What follows a message: nothing when the next one is not an assistant or
 * latest_reminder turn; else the task token(s), or for a user/developer
 * turn "<｜Assistant｜>" + <think> or </think>. */
static void render_transition(ds4_rendered *r, const conv *c, size_t i, size_t last_user) {
    const cmsg *m = &c->m[i];
    if (i + 1 < c->n && c->m[i + 1].role != ROLE_ASSISTANT && c->m[i + 1].role != ROLE_LATEST_REMINDER) return;
    if (m->task) {
        if (strcmp(m->task, TASKS[0][1]) != 0) {
            ds4_rendered_special(r, m->task);
        } else {
            ds4_rendered_special(r, DS4_TOK_ASSISTANT);
            ds4_rendered_special(r, c->thinking ? DS4_TOK_THINK : DS4_TOK_THINK_END);
            ds4_rendered_special(r, m->task);
        }
    } else if (m->role == ROLE_USER || m->role == ROLE_DEVELOPER) {
        ds4_rendered_special(r, DS4_TOK_ASSISTANT);
        int open = c->thinking && (!c->drop || last_user == SIZE_MAX || i >= last_user);
        ds4_rendered_special(r, open ? DS4_TOK_THINK : DS4_TOK_THINK_END);
    }
}

static int render_message(ds4_rendered *r, const conv *c, size_t i, size_t last_user, ds4_err *err) {
    const cmsg *m = &c->m[i];
    if (i == 0 && ds4_chat_effective_think(c->opts) == DS4_THINK_MAX) ds4_rendered_puts(r, THINK_MAX_PREFIX);
    const json_t *content = m->src ? json_object_get(m->src, "content") : NULL;
    switch (m->role) {
    case ROLE_SYSTEM:
        if (render_content(r, m, "content", content, err)) return -1;
        render_tools_and_format(r, m);
        break;
    case ROLE_DEVELOPER:
        if (!truthy(content)) return content_error(m, "content", "is empty (a developer message needs content)", err);
        ds4_rendered_special(r, DS4_TOK_USER);
        if (render_content(r, m, "content", content, err)) return -1;
        render_tools_and_format(r, m);
        break;
    case ROLE_USER:
        if (render_user(r, m, err)) return -1;
        break;
    case ROLE_LATEST_REMINDER:
        ds4_rendered_special(r, DS4_TOK_LATEST_REMINDER);
        if (render_content(r, m, "content", content, err)) return -1;
        break;
    case ROLE_ASSISTANT:
        if (render_assistant(r, c, i, last_user, err)) return -1;
        break;
    case ROLE_TOOL: /* merged away */ break;
    }
    render_transition(r, c, i, last_user);
    return 0;
}

int ds4_chat_render(const json_t *messages, const ds4_chat_opts *opts, ds4_rendered *out, ds4_err *err) {
    if (!json_is_array(messages)) return ds4_err_set(err, DS4_EINVAL, "messages is not an array");
    conv c = {.opts = opts, .thinking = opts->think != DS4_THINK_OFF, .drop = !opts->keep_reasoning};
    if (merge_messages(&c, messages, err) || sort_tool_results(&c, err)) {
        free_conv(&c);
        return -1;
    }
    for (size_t i = 0; i < c.n; i++)
        if (c.m[i].tools) c.drop = 0; /* tools anywhere keep every turn's reasoning */
    if (c.thinking && c.drop) drop_old_reasoning(&c);

    if (!opts->no_bos) ds4_rendered_special(out, DS4_TOK_BOS);
    size_t last_user = last_user_index(&c);
    int rc = 0;
    for (size_t i = 0; i < c.n && rc == 0; i++) rc = render_message(out, &c, i, last_user, err);
    free_conv(&c);
    if (rc) return -1;
    return ds4_rendered_check(out, err);
}
