/*
 * script.c - scripted model output for ds4-agent's tests (see script.h).
 */
#include "script.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

void agent_script_add(agent_script *s, const char *text) {
    char **n = realloc(s->items, (s->n + 1) * sizeof(*n));
    if (!n) return;
    s->items = n;
    s->items[s->n++] = text ? strdup(text) : NULL;
}

int agent_script_load(agent_script *s, const char *path, ds4_err *err) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!json_is_array(j)) {
        json_decref(j);
        return ds4_err_set(err, DS4_EFORMAT, "%s: %s", path, j ? "not a JSON array" : je.text);
    }
    for (size_t i = 0; i < json_array_size(j); i++) {
        const json_t *v = json_array_get(j, i);
        if (!json_is_string(v) && !json_is_null(v)) {
            json_decref(j);
            return ds4_err_set(err, DS4_EFORMAT, "%s: item %zu is neither a string nor null", path, i);
        }
        agent_script_add(s, json_string_value(v));
    }
    json_decref(j);
    return 0;
}

void agent_script_free(agent_script *s) {
    for (size_t i = 0; i < s->n; i++) free(s->items[i]);
    free(s->items);
    memset(s, 0, sizeof(*s));
}

const char *agent_script_next(void *ctx) {
    agent_script *s = ctx;
    if (s->next >= s->n) return NULL;
    size_t i = s->next++;
    if (s->on_next) s->on_next(s->ctx, i);
    return s->items[i];
}
