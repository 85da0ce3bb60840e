/*
 * request.c - request fields the four APIs share: the JSON body itself
 * (UTF-8, limits), sampling parameters, token limits, stop lists, the
 * thinking/reasoning controls and model aliases (the fields ds4's server
 * honours), message text.  Every wrong type or range is a 400 that names
 * the field.
 *
 * The body's parse is bounded before it starts, since a JSON tree costs
 * far more memory than its text (48 MB of "[]," would be millions of
 * arrays): nesting depth and the number of values are counted by a scan
 * of the text, and the parse itself may hold at most a budget of memory
 * (jansson's allocator counts, per thread, while a body is parsed).
 *
 * NUL characters are valid JSON ("\u0000", e.g. in a binary tool output)
 * and accepted; the prompt shows each as the six characters \u0000, so a
 * conversation that once carried one keeps working.  Content parts the
 * model cannot read (images, audio, files) become a placeholder text that
 * says so, the same in every API.
 */
#include <float.h>
#include <malloc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "constrain.h"
#include "server.h"
#include "text/pyjson.h"

/* At most this many values (containers, elements, members) in a body. */
#define MAX_JSON_VALUES 500000
/* Memory a body's parse may hold: this plus 3 times its size. */
#define JSON_PARSE_BASE (64u << 20)

/* ------------------------------------------------------------ limits */

/* Deepest array/object nesting of a JSON text and its number of values
 * (roughly: containers and commas), ignoring what is inside strings;
 * stops once past the limits. */
static void json_shape(const char *s, size_t n, int *depth_out, size_t *values_out) {
    int depth = 0, max = 0;
    size_t values = 1;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == ',') values++;
        else if (c == '[' || c == '{') {
            values++;
            if (++depth > max) max = depth;
            if (max > MAX_JSON_DEPTH) break;
        } else if (c == ']' || c == '}') {
            depth--;
        }
        if (values > MAX_JSON_VALUES) break;
    }
    *depth_out = max;
    *values_out = values;
}

/* The parse budget of this thread: 0 when no body is being parsed. */
static __thread size_t parse_budget, parse_used;

static void *counted_malloc(size_t n) {
    void *p = malloc(n);
    if (p && parse_budget) {
        parse_used += malloc_usable_size(p);
        if (parse_used > parse_budget) {
            parse_used -= malloc_usable_size(p);
            free(p);
            return NULL;
        }
    }
    return p;
}

static void counted_free(void *p) {
    if (p && parse_budget) {
        size_t n = malloc_usable_size(p);
        parse_used = n < parse_used ? parse_used - n : 0;
    }
    free(p);
}

void req_json_limits_install(void) { json_set_alloc_funcs(counted_malloc, counted_free); }

/* Keys under which a big number (text/pyjson.h) stays one: the values the
 * prompt writes back with json.dumps (a tool's parameter schema, a response
 * format's schema, a tool call's arguments).  "input" counts below the top level only (an Anthropic
 * tool_use block's arguments; the top-level "input" of a Responses request
 * is the conversation). */
static bool keeps_big_numbers(const char *key, int depth) {
    static const char *const keys[] = {"parameters", "input_schema", "schema", "arguments", NULL};
    for (int i = 0; keys[i]; i++)
        if (strcmp(key, keys[i]) == 0) return true;
    return depth > 0 && strcmp(key, "input") == 0;
}

/* Elsewhere a big number is held as a jansson string (pyjson.h), which a
 * field expecting text would take for one: it becomes the nearest number
 * jansson holds (+-DBL_MAX, and DBL_MAX for NaN, which has none), so the
 * field's own checks refuse it as they refuse any other number. */
static json_t *demoted(const json_t *v) {
    const char *t = ds4_pyjson_big_number(v);
    if (!t) return NULL;
    return json_real(t[0] == '-' ? -DBL_MAX : DBL_MAX);
}

static void demote_big_numbers(json_t *v, int depth) {
    if (json_is_object(v)) {
        const char *key;
        json_t *child;
        void *tmp;
        json_object_foreach_safe(v, tmp, key, child) {
            if (keeps_big_numbers(key, depth)) continue;
            json_t *d = demoted(child);
            if (d) json_object_set_new(v, key, d);
            else demote_big_numbers(child, depth + 1);
        }
    } else if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *d = demoted(json_array_get(v, i));
            if (d) json_array_set_new(v, i, d);
            else demote_big_numbers(json_array_get(v, i), depth + 1);
        }
    }
}

json_t *req_load_json(const char *body, size_t n, api_error *e) {
    if (n == 0) {
        api_fail(e, 400, "invalid JSON request: empty body");
        return NULL;
    }
    int depth;
    size_t values;
    json_shape(body, n, &depth, &values);
    if (depth > MAX_JSON_DEPTH) {
        api_fail(e, 400, "invalid JSON request: nested deeper than %d levels", MAX_JSON_DEPTH);
        return NULL;
    }
    if (values > MAX_JSON_VALUES) {
        api_fail(e, 413, "invalid JSON request: more than %d values", MAX_JSON_VALUES);
        return NULL;
    }
    /* Read as the official encoder's json.loads reads it: integers beyond
     * 64 bits and numbers like 1e400 in tool schemas and arguments are
     * numbers, written back exactly (text/pyjson.h). */
    ds4_err je = {0};
    parse_budget = JSON_PARSE_BASE + 3 * n;
    parse_used = 0;
    json_t *v = ds4_pyjson_load(body, n, &je);
    parse_budget = 0;
    if (!v && je.code == DS4_ENOMEM) {
        api_fail(e, 413, "invalid JSON request: parsing it needs more than %zu MB", (JSON_PARSE_BASE + 3 * n) >> 20);
        return NULL;
    }
    if (!v) {
        api_fail(e, 400, "invalid JSON request: %s", je.msg);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        api_fail(e, 400, "invalid JSON request: the body must be a JSON object");
        return NULL;
    }
    demote_big_numbers(v, 0);
    return v;
}

static int get_number(const json_t *body, const char *field, double lo, double hi, double *out, bool *set,
                      api_error *e) {
    const json_t *v = json_object_get(body, field);
    *set = false;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return api_fail(e, 400, "%s must be a number", field);
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return api_fail(e, 400, "%s must be between %g and %g", field, lo, hi);
    *out = x;
    *set = true;
    return 0;
}

int req_sampling(const json_t *body, srv_request *r, bool with_min_p_seed, api_error *e) {
    ds4_sampler_defaults(&r->sp);
    double x;
    bool set;
    if (get_number(body, "temperature", 0, DS4_TEMP_MAX, &x, &set, e)) return -1;
    if (set) r->sp.temperature = (float)x;
    if (get_number(body, "top_p", 0, 1, &x, &set, e)) return -1;
    if (set) r->sp.top_p = (float)x;
    const json_t *k = json_object_get(body, "top_k");
    if (k && !json_is_null(k)) {
        if (!json_is_integer(k) || json_integer_value(k) < 0)
            return api_fail(e, 400, "top_k must be a non-negative integer");
        json_int_t v = json_integer_value(k);
        r->sp.top_k = v > DS4_TOP_K_MAX ? DS4_TOP_K_MAX : (int)v;
    }
    if (!with_min_p_seed) return 0;
    if (get_number(body, "min_p", 0, 1, &x, &set, e)) return -1;
    if (set) r->sp.min_p = (float)x;
    const json_t *seed = json_object_get(body, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return api_fail(e, 400, "seed must be an integer");
        r->sp.seed = (uint64_t)json_integer_value(seed);
        if (r->sp.seed == 0) r->sp.seed = 1; /* 0 means "random" to the sampler */
    }
    return 0;
}

int req_steering(const json_t *body, srv_request *r, api_error *e) {
    const json_t *st = json_object_get(body, "dir_steering");
    if (!st || json_is_null(st)) return 0;
    if (!json_is_object(st)) return api_fail(e, 400, "dir_steering must be an object {\"ffn\": F, \"attn\": F}");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)st, key, v) {
        if (strcmp(key, "ffn") && strcmp(key, "attn"))
            return api_fail(e, 400, "dir_steering.%s: unknown field (ffn and attn are the scales)", key);
    }
    double x;
    bool set;
    if (get_number(st, "ffn", -DS4_STEER_SCALE_MAX, DS4_STEER_SCALE_MAX, &x, &set, e)) return -1;
    if (set) r->steer_ffn = (float)x, r->steer_ffn_set = true;
    if (get_number(st, "attn", -DS4_STEER_SCALE_MAX, DS4_STEER_SCALE_MAX, &x, &set, e)) return -1;
    if (set) r->steer_attn = (float)x, r->steer_attn_set = true;
    return 0;
}

int req_max_tokens(const json_t *body, const char *const *names, srv_request *r, api_error *e) {
    for (int i = 0; names[i]; i++) {
        const json_t *v = json_object_get(body, names[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return api_fail(e, 400, "%s must be a positive integer", names[i]);
        json_int_t n = json_integer_value(v);
        r->max_tokens = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
        return 0;
    }
    return 0;
}

static int add_stop(srv_request *r, const json_t *s, const char *field, api_error *e) {
    if (!json_is_string(s)) return api_fail(e, 400, "%s must be a string or an array of strings", field);
    if (json_string_length(s) == 0) return 0;
    if (strlen(json_string_value(s)) != json_string_length(s))
        return api_fail(e, 400, "%s: a stop sequence must not contain NUL", field);
    if (r->n_stop >= MAX_STOP) return api_fail(e, 400, "%s: at most %d stop sequences", field, MAX_STOP);
    if (json_string_length(s) > 1024) return api_fail(e, 400, "%s: stop sequences are limited to 1024 bytes", field);
    r->stop[r->n_stop++] = strdup(json_string_value(s));
    return 0;
}

int req_stop(const json_t *v, const char *field, srv_request *r, api_error *e) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) return add_stop(r, v, field, e);
    if (!json_is_array(v)) return api_fail(e, 400, "%s must be a string or an array of strings", field);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (add_stop(r, json_array_get(v, i), field, e)) return -1;
    return 0;
}

int req_bool(const json_t *body, const char *field, bool *out, api_error *e) {
    const json_t *v = json_object_get(body, field);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return api_fail(e, 400, "%s must be a boolean", field);
    *out = json_is_true(v);
    return 0;
}

int req_effort(const char *effort, const char *field, ds4_think_mode *out, api_error *e) {
    static const char *const high[] = {"xhigh", "high", "medium", "low", "minimal", NULL};
    if (strcmp(effort, "max") == 0) {
        *out = DS4_THINK_MAX;
        return 0;
    }
    if (strcmp(effort, "none") == 0) {
        *out = DS4_THINK_OFF;
        return 0;
    }
    for (int i = 0; high[i]; i++)
        if (strcmp(effort, high[i]) == 0) {
            *out = DS4_THINK_HIGH;
            return 0;
        }
    return api_fail(e, 400, "%s: unknown reasoning effort \"%s\" (none, minimal, low, medium, high, xhigh, max)", field,
                    effort);
}

int req_thinking_field(const json_t *v, const char *field, int *out, api_error *e) {
    *out = -1;
    if (!v || json_is_null(v)) return 0;
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    if (!json_is_object(v)) return api_fail(e, 400, "%s must be a boolean or an object with a type", field);
    const char *type = json_string_value(json_object_get(v, "type"));
    if (!type) return api_fail(e, 400, "%s.type must be a string", field);
    if (strcmp(type, "enabled") == 0 || strcmp(type, "adaptive") == 0) *out = 1;
    else if (strcmp(type, "disabled") == 0) *out = 0;
    else return api_fail(e, 400, "%s.type must be \"enabled\" or \"disabled\"", field);
    return 0;
}

void req_model(const json_t *body, srv_request *r, int explicit_think) {
    const json_t *v = json_object_get(body, "model");
    /* a number beyond 64 bits is read as a marked string (text/pyjson.h):
     * not a name */
    const char *m = ds4_pyjson_big_number(v) ? NULL : json_string_value(v);
    r->model = strdup(m && *m ? m : DS4_MODEL_ID);
    if (explicit_think || !m) return;
    if (strcmp(m, "deepseek-chat") == 0) r->think = DS4_THINK_OFF;
    else if (strcmp(m, "deepseek-reasoner") == 0) r->think = DS4_THINK_HIGH;
}

/* ------------------------------------------------------------ answers */

static const json_t *tool_named(const json_t *tools, const char *name) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        const char *n = json_string_value(json_object_get(fn, "name"));
        if (n && strcmp(n, name) == 0) return fn;
    }
    return NULL;
}

int req_tool_choice(srv_request *r, tool_choice c, const char *name, const char *field, api_error *e) {
    r->tool_choice = c;
    if (c == TOOL_NONE) {
        json_decref(r->tools);
        r->tools = NULL;
        return 0;
    }
    if (c == TOOL_AUTO) return 0;
    if (!json_array_size(r->tools))
        return api_fail(e, 400, "%s: a tool call is required but the request has no tools", field);
    if (c == TOOL_NAMED) {
        if (!tool_named(r->tools, name)) return api_fail(e, 400, "%s: no tool named \"%s\" in tools", field, name);
        free(r->tool_name);
        r->tool_name = strdup(name);
    }
    return 0;
}

int req_json_answer(srv_request *r, const json_t *schema, const json_t *shown, const char *field, api_error *e) {
    char why[400];
    jschema *js = schema ? jschema_compile(schema, why, sizeof(why)) : jschema_any_object();
    if (!js) {
        if (!schema) return api_fail(e, 500, "out of memory");
        return api_fail(e, 400, "%s: %s", field, why);
    }
    jschema_free(r->schema);
    r->schema = js;
    json_decref(r->response_format);
    r->response_format = json_incref((json_t *)shown);
    return 0;
}

int req_logprobs(srv_request *r, const json_t *top, const char *field, int max, api_error *e) {
    r->logprobs = 0;
    if (!top || json_is_null(top)) return 0;
    if (!json_is_integer(top) || json_integer_value(top) < 0 || json_integer_value(top) > max)
        return api_fail(e, 400, "%s must be an integer from 0 to %d", field, max);
    r->logprobs = (int)json_integer_value(top);
    return 0;
}

int req_finalize(srv_request *r, api_error *e) {
    req_escape_nul(r->messages);
    req_escape_nul(r->tools);
    if (r->response_format) {
        /* The official template shows it in the first system message. */
        json_t *first = json_array_get(r->messages, 0);
        const char *role = json_string_value(json_object_get(first, "role"));
        if (!role || strcmp(role, "system") != 0) {
            first = json_pack("{s:s,s:s}", "role", "system", "content", "");
            if (!first || json_array_insert_new(r->messages, 0, first) != 0) return api_fail(e, 500, "out of memory");
        }
        json_object_set(first, "response_format", r->response_format);
    }
    return 0;
}

/* ------------------------------------------------------------ content */

/* What the prompt says instead of content the model cannot read. */
static const struct {
    const char *type;
    const char *text;
} UNREADABLE[] = {
    {"image", "[image not shown: this model reads text only]"},
    {"image_url", "[image not shown: this model reads text only]"},
    {"input_image", "[image not shown: this model reads text only]"},
    {"input_audio", "[audio not shown: this model reads text only]"},
    {"audio", "[audio not shown: this model reads text only]"},
    {"file", "[file not shown: this model reads text only]"},
    {"input_file", "[file not shown: this model reads text only]"},
    {"document", "[file not shown: this model reads text only]"},
};

const char *req_placeholder(const char *type) {
    for (size_t i = 0; type && i < sizeof(UNREADABLE) / sizeof(UNREADABLE[0]); i++)
        if (strcmp(type, UNREADABLE[i].type) == 0) return UNREADABLE[i].text;
    return NULL;
}

/* Part types whose text is in a field of that name ("text" or "refusal"). */
static const char *text_field(const char *type) {
    static const char *const text[] = {"text", "input_text", "output_text", "summary_text", "reasoning_text", NULL};
    for (int i = 0; type && text[i]; i++)
        if (strcmp(type, text[i]) == 0) return "text";
    return type && strcmp(type, "refusal") == 0 ? "refusal" : NULL;
}

int req_part(const json_t *p, const char *field, size_t i, ds4_strbuf *out, api_error *e) {
    if (json_is_string(p)) {
        ds4_strbuf_append(out, json_string_value(p), json_string_length(p));
        return 0;
    }
    if (!json_is_object(p)) return api_fail(e, 400, "%s[%zu] must be an object", field, i);
    const char *type = json_string_value(json_object_get(p, "type"));
    const json_t *text = json_object_get(p, type ? text_field(type) : "text");
    if (json_is_string(text) && (!type || text_field(type))) {
        ds4_strbuf_append(out, json_string_value(text), json_string_length(text));
        return 0;
    }
    const json_t *src = json_object_get(p, "source");
    const char *st = json_string_value(json_object_get(src, "type"));
    const json_t *data = json_object_get(src, "data");
    if (type && strcmp(type, "document") == 0 && st && strcmp(st, "text") == 0 && json_is_string(data)) {
        ds4_strbuf_append(out, json_string_value(data), json_string_length(data));
        return 0;
    }
    const char *ph = req_placeholder(type);
    if (ph) {
        ds4_strbuf_puts(out, ph);
        return 0;
    }
    if (type && text_field(type)) return api_fail(e, 400, "%s[%zu].%s must be a string", field, i, text_field(type));
    return api_fail(e, 400, "%s[%zu]: content of type \"%s\" is not supported", field, i, type ? type : "?");
}

int req_text(const json_t *v, const char *field, ds4_strbuf *out, api_error *e) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        ds4_strbuf_append(out, json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v)) return api_fail(e, 400, "%s must be a string or an array of content parts", field);
    for (size_t i = 0; i < json_array_size(v); i++)
        if (req_part(json_array_get(v, i), field, i, out, e)) return -1;
    return 0;
}

/* A copy of s[0..n) with each NUL written as the six characters \u0000. */
static json_t *nul_escaped(const char *s, size_t n) {
    ds4_strbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        size_t k = i;
        while (k < n && s[k]) k++;
        ds4_strbuf_append(&b, s + i, k - i);
        if (k < n) ds4_strbuf_puts(&b, "\\u0000");
        i = k;
    }
    json_t *v = b.failed ? NULL : json_stringn(b.p ? b.p : "", b.len);
    ds4_strbuf_free(&b);
    return v;
}

static bool has_nul(const json_t *v) {
    return json_is_string(v) && strlen(json_string_value(v)) != json_string_length(v);
}

/* An `arguments` JSON text that spells a NUL ("\u0000") parses to strings
 * with NUL, which the renderer would not take: parsed here and escaped. */
static json_t *nul_arguments(const json_t *v) {
    const char *s = json_string_value(v);
    if (!s || !strstr(s, "\\u0000")) return NULL;
    json_t *a = json_loadb(s, json_string_length(v), JSON_ALLOW_NUL, NULL);
    if (!json_is_object(a)) {
        json_decref(a);
        return NULL;
    }
    req_escape_nul(a);
    return a;
}

void req_escape_nul(json_t *v) {
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *x = json_array_get(v, i);
            if (has_nul(x)) json_array_set_new(v, i, nul_escaped(json_string_value(x), json_string_length(x)));
            else req_escape_nul(x);
        }
    } else if (json_is_object(v)) {
        const char *key;
        json_t *x;
        void *tmp;
        json_object_foreach_safe(v, tmp, key, x) {
            json_t *args = strcmp(key, "arguments") == 0 ? nul_arguments(x) : NULL;
            if (args) json_object_set_new(v, key, args);
            else if (has_nul(x)) json_object_set_new(v, key, nul_escaped(json_string_value(x), json_string_length(x)));
            else req_escape_nul(x);
        }
    }
}

json_t *req_openai_tool(const char *name, const json_t *description, const json_t *parameters) {
    json_t *fn = json_object();
    json_object_set_new(fn, "name", json_string(name));
    if (json_is_string(description)) json_object_set(fn, "description", (json_t *)description);
    if (parameters) json_object_set(fn, "parameters", (json_t *)parameters);
    else json_object_set_new(fn, "parameters", json_pack("{s:s,s:{}}", "type", "object", "properties"));
    return json_pack("{s:s,s:o}", "type", "function", "function", fn);
}
