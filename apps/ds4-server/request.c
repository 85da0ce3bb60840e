/*
 * request.c - request fields the four APIs share: the JSON body itself
 * (UTF-8, nesting limit), sampling parameters, token limits, stop lists,
 * the thinking/reasoning controls and model aliases (the
 * fields ds4's server honours), message text.  Every wrong type or range is a 400 that
 * names the field.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* Deepest array/object nesting of a JSON text, ignoring brackets inside
 * strings; stops counting once past `limit`. */
static int json_depth(const char *s, size_t n, int limit) {
    int depth = 0, max = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
            continue;
        }
        if (c == '"') in_str = true;
        else if (c == '[' || c == '{') {
            if (++depth > max) max = depth;
            if (max > limit) return max;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return max;
}

json_t *req_load_json(const char *body, size_t n, api_error *e) {
    if (n == 0) {
        api_fail(e, 400, "invalid JSON request: empty body");
        return NULL;
    }
    if (json_depth(body, n, MAX_JSON_DEPTH) > MAX_JSON_DEPTH) {
        api_fail(e, 400, "invalid JSON request: nested deeper than %d levels", MAX_JSON_DEPTH);
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(body, n, 0, &je);
    if (!v) {
        api_fail(e, 400, "invalid JSON request: %s (at byte %d)", je.text, je.position);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        api_fail(e, 400, "invalid JSON request: the body must be a JSON object");
        return NULL;
    }
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
        if (!json_is_integer(k) || json_integer_value(k) < 0) return api_fail(e, 400, "top_k must be a non-negative integer");
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
    return api_fail(e, 400, "%s: unknown reasoning effort \"%s\" (none, minimal, low, medium, high, xhigh, max)",
                    field, effort);
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
    const char *m = json_string_value(json_object_get(body, "model"));
    r->model = strdup(m && *m ? m : DS4_MODEL_ID);
    if (explicit_think || !m) return;
    if (strcmp(m, "deepseek-chat") == 0) r->think = DS4_THINK_OFF;
    else if (strcmp(m, "deepseek-reasoner") == 0) r->think = DS4_THINK_HIGH;
}

int req_text(const json_t *v, const char *field, bool strict, ds4_strbuf *out, api_error *e) {
    if (!v || json_is_null(v)) return 0;
    if (json_is_string(v)) {
        ds4_strbuf_append(out, json_string_value(v), json_string_length(v));
        return 0;
    }
    if (!json_is_array(v)) return api_fail(e, 400, "%s must be a string or an array of content parts", field);
    for (size_t i = 0; i < json_array_size(v); i++) {
        const json_t *p = json_array_get(v, i);
        const json_t *text = json_object_get(p, "text");
        if (json_is_string(p)) {
            ds4_strbuf_append(out, json_string_value(p), json_string_length(p));
        } else if (json_is_object(p) && json_is_string(text)) {
            ds4_strbuf_append(out, json_string_value(text), json_string_length(text));
        } else if (!json_is_object(p)) {
            return api_fail(e, 400, "%s[%zu] must be an object", field, i);
        } else if (strict) {
            const char *type = json_string_value(json_object_get(p, "type"));
            return api_fail(e, 400, "%s[%zu]: content of type \"%s\" is not supported (text only)", field, i,
                            type ? type : "?");
        }
    }
    return 0;
}

json_t *req_openai_tool(const char *name, const json_t *description, const json_t *parameters) {
    json_t *fn = json_object();
    json_object_set_new(fn, "name", json_string(name));
    if (json_is_string(description)) json_object_set(fn, "description", (json_t *)description);
    if (parameters) json_object_set(fn, "parameters", (json_t *)parameters);
    else json_object_set_new(fn, "parameters", json_pack("{s:s,s:{}}", "type", "object", "properties"));
    return json_pack("{s:s,s:o}", "type", "function", "function", fn);
}
