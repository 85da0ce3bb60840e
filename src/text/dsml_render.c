/*
 * dsml_render.c - rendering DSML tool calls (see dsml_render.h).
 */
#include "text/dsml_render.h"

#include <string.h>

#include "text/pyjson.h"

#define CLOSE_PARAM  "</" DS4_DSML_MARKER "parameter>"
#define ESCAPED_TAIL "lt;/" DS4_DSML_MARKER "parameter>"

static int starts_with(const char *s, size_t n, const char *lit) {
    size_t l = strlen(lit);
    return n >= l && memcmp(s, lit, l) == 0;
}

/* Length of "(amp;)*lt;/｜DSML｜parameter>" at s, 0 if it is not there. */
static size_t escaped_close_at(const char *s, size_t n) {
    size_t i = 0;
    while (starts_with(s + i, n - i, "amp;")) i += 4;
    return starts_with(s + i, n - i, ESCAPED_TAIL) ? i + strlen(ESCAPED_TAIL) : 0;
}

void ds4_dsml_escape_string_value(ds4_strbuf *b, const char *s, size_t n) {
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '<' && starts_with(s + i, n - i, CLOSE_PARAM)) {
            ds4_strbuf_append(b, s + run, i - run);
            ds4_strbuf_puts(b, "&lt;");
            run = i + 1;
        } else if (s[i] == '&' && escaped_close_at(s + i + 1, n - i - 1)) {
            ds4_strbuf_append(b, s + run, i + 1 - run);
            ds4_strbuf_puts(b, "amp;");
            run = i + 1;
        }
    }
    ds4_strbuf_append(b, s + run, n - run);
}

void ds4_dsml_escape_name(ds4_strbuf *b, const char *s, size_t n) {
    static const char *const entities[] = {"amp;", "lt;", "gt;", "quot;", "apos;", NULL};
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        const char *rep = NULL;
        if (s[i] == '"') {
            rep = "&quot;";
        } else if (s[i] == '&') {
            for (int k = 0; entities[k]; k++)
                if (starts_with(s + i + 1, n - i - 1, entities[k])) rep = "&amp;";
        }
        if (!rep) continue;
        ds4_strbuf_append(b, s + run, i - run);
        ds4_strbuf_puts(b, rep);
        run = i + 1;
    }
    ds4_strbuf_append(b, s + run, n - run);
}

/* "<｜DSML｜" + rest: the marker is the special token. */
static void open_tag(ds4_rendered *r, const char *lead, const char *rest) {
    ds4_rendered_puts(r, lead);
    ds4_rendered_special(r, DS4_DSML_MARKER);
    ds4_rendered_puts(r, rest);
}

static void render_name(ds4_rendered *r, const char *s, size_t n) {
    ds4_strbuf b = {0};
    ds4_dsml_escape_name(&b, s, n);
    ds4_rendered_text(r, b.p ? b.p : "", b.len);
    if (b.failed) r->failed = true;
    ds4_strbuf_free(&b);
}

static void render_param(ds4_rendered *r, const char *key, size_t key_len, const json_t *v) {
    int is_str = json_is_string(v) && !ds4_pyjson_big_number(v);
    open_tag(r, "<", "parameter name=\"");
    render_name(r, key, key_len);
    ds4_rendered_puts(r, is_str ? "\" string=\"true\">" : "\" string=\"false\">");
    ds4_strbuf b = {0};
    if (is_str) {
        ds4_dsml_escape_string_value(&b, json_string_value(v), json_string_length(v));
    } else {
        ds4_strbuf j = {0};
        ds4_pyjson_dump(&j, v);
        /* The closing tag can only occur inside a JSON string there. */
        for (size_t i = 0; i < j.len; i++) {
            if (j.p[i] == '<' && starts_with(j.p + i, j.len - i, CLOSE_PARAM)) ds4_strbuf_puts(&b, "\\u003c");
            else ds4_strbuf_putc(&b, j.p[i]);
        }
        if (j.failed) b.failed = true;
        ds4_strbuf_free(&j);
    }
    ds4_rendered_text(r, b.p ? b.p : "", b.len);
    if (b.failed) r->failed = true;
    ds4_strbuf_free(&b);
    open_tag(r, "</", "parameter>");
}

int ds4_dsml_render_invoke(ds4_rendered *r, const char *name, size_t name_len, const json_t *arguments, ds4_err *err) {
    json_t *parsed = NULL, *wrapped = NULL;
    const json_t *args = arguments;
    if (json_is_string(arguments)) {
        /* As json.loads reads it: big integers and 1e400 stay numbers. */
        ds4_err ignored = {0};
        parsed = ds4_pyjson_load(json_string_value(arguments), json_string_length(arguments), &ignored);
        if (json_is_object(parsed)) {
            args = parsed;
        } else {
            wrapped = json_pack("{sO}", "arguments", (json_t *)arguments);
            args = wrapped;
        }
    } else if (!json_is_object(arguments)) {
        wrapped = json_pack("{sO}", "arguments", arguments ? (json_t *)arguments : json_null());
        args = wrapped;
    }
    if (!args) {
        json_decref(parsed);
        return ds4_err_set(err, DS4_ENOMEM, "rendering tool call: out of memory");
    }
    open_tag(r, "<", "invoke name=\"");
    render_name(r, name, name_len);
    ds4_rendered_puts(r, "\">\n");
    const char *key;
    size_t key_len;
    json_t *val;
    int first = 1;
    json_object_keylen_foreach((json_t *)args, key, key_len, val) {
        if (!first) ds4_rendered_puts(r, "\n");
        first = 0;
        render_param(r, key, key_len, val);
    }
    ds4_rendered_puts(r, "\n");
    open_tag(r, "</", "invoke>");
    json_decref(parsed);
    json_decref(wrapped);
    return ds4_rendered_check(r, err);
}

int ds4_dsml_render_calls(ds4_rendered *r, const json_t *tool_calls, ds4_err *err) {
    if (!json_is_array(tool_calls)) return ds4_err_set(err, DS4_EINVAL, "tool_calls is not an array");
    ds4_rendered_puts(r, "\n\n");
    open_tag(r, "<", "tool_calls>\n");
    for (size_t i = 0; i < json_array_size(tool_calls); i++) {
        const json_t *fn = json_object_get(json_array_get(tool_calls, i), "function");
        const json_t *name = json_object_get(fn, "name");
        if (!json_is_string(name))
            return ds4_err_set(err, DS4_EINVAL, "tool_calls[%zu]: function.name missing or not a string", i);
        if (i) ds4_rendered_puts(r, "\n");
        if (ds4_dsml_render_invoke(r, json_string_value(name), json_string_length(name),
                                   json_object_get(fn, "arguments"), err))
            return ds4_err_prefix(err, "tool_calls[%zu]", i);
    }
    ds4_rendered_puts(r, "\n");
    open_tag(r, "</", "tool_calls>");
    return ds4_rendered_check(r, err);
}
