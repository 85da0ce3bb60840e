/*
 * constrain.c - constrained decoding (see constrain.h): JSON schemas
 * compiled to a byte-level matcher, prefix and forbidden strings, and the
 * token mask computed over the sorted vocabulary.
 */
#include "constrain.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/dsml_parse.h"
#include "text/dsml_render.h"
#include "text/pyjson.h"

#define JMAX_DEPTH       24
#define JMAX_WS          16
#define JMAX_INT_DIGITS  18 /* an integer part fits in 64 bits */
#define JMAX_FRAC_DIGITS 24
#define JMAX_EXP_DIGITS  2 /* a double's range */
#define MAX_PROPS        64
#define MAX_ALTS         64
#define N_FORBID         8

/* ============================================================ schemas */

typedef enum jkind { J_ANY, J_OBJECT, J_ARRAY, J_STRING, J_NUMBER, J_INTEGER, J_LITERALS, J_UNION } jkind;

/* How a JSON value starts. */
enum { C_OBJ, C_ARR, C_STR, C_NUM, C_TRUE, C_FALSE, C_NULL, N_CLASSES };

typedef struct jnode {
    jkind kind;
    bool ready; /* compiled (a $ref target may be in progress) */
    /* J_OBJECT: keys as they are spelled in JSON (escaped, no quotes), sorted */
    size_t n_props;
    char **keys;
    size_t *key_lens;
    struct jnode **props;
    uint64_t required;        /* bit i: keys[i] */
    struct jnode *additional; /* NULL: no other keys */
    /* J_ARRAY */
    struct jnode *items;
    uint32_t min_items, max_items;
    /* J_STRING (code points) */
    uint32_t min_len, max_len;
    /* J_LITERALS: compact JSON texts, sorted */
    size_t n_lits;
    char **lits;
    size_t *lit_lens;
    /* J_UNION: the alternative for each way a value starts */
    struct jnode *alt[N_CLASSES];
    struct jnode *next; /* all nodes of a schema, for freeing */
} jnode;

typedef struct ref_memo {
    char *ref;
    jnode *node;
} ref_memo;

struct jschema {
    jnode *root;
    jnode *all;
    jnode *any, *any_obj, *any_arr, *any_str, *any_num, *lit_true, *lit_false, *lit_null;
    /* compilation */
    const json_t *doc;
    ref_memo *refs;
    size_t n_refs;
    char *why;
    size_t why_cap;
    bool oom;
};

static jnode *node_new(jschema *s, jkind k) {
    jnode *n = calloc(1, sizeof(*n));
    if (!n) {
        s->oom = true;
        return NULL;
    }
    n->kind = k;
    n->max_items = UINT32_MAX;
    n->max_len = UINT32_MAX;
    n->next = s->all;
    s->all = n;
    return n;
}

static void node_free(jnode *n) {
    for (size_t i = 0; i < n->n_props; i++) free(n->keys[i]);
    free(n->keys);
    free(n->key_lens);
    free(n->props);
    for (size_t i = 0; i < n->n_lits; i++) free(n->lits[i]);
    free(n->lits);
    free(n->lit_lens);
    free(n);
}

void jschema_free(jschema *s) {
    if (!s) return;
    for (jnode *n = s->all, *nx; n; n = nx) {
        nx = n->next;
        node_free(n);
    }
    for (size_t i = 0; i < s->n_refs; i++) free(s->refs[i].ref);
    free(s->refs);
    free(s);
}

static int why(jschema *s, const char *path, const char *fmt, const char *arg) {
    if (s->why && !s->why[0]) {
        int n = snprintf(s->why, s->why_cap, "%s: ", path[0] ? path : "schema");
        if (n > 0 && (size_t)n < s->why_cap) snprintf(s->why + n, s->why_cap - (size_t)n, fmt, arg);
    }
    return -1;
}

static int cmp_bytes(const char *a, size_t na, const char *b, size_t nb) {
    int c = memcmp(a, b, na < nb ? na : nb);
    return c ? c : (na > nb) - (na < nb);
}

/* Add a literal (compact JSON text of v), keeping them sorted and unique. */
static int add_literal(jschema *s, jnode *n, const json_t *v) {
    /* An integer beyond 64 bits is its digits; NaN and infinities have no
     * JSON spelling an answer could use. */
    const char *big = ds4_pyjson_big_number(v);
    if (big && !(big[0] == '-' || (big[0] >= '0' && big[0] <= '9')))
        return why(s, "", "enum/const value %s has no JSON spelling", big);
    char *t = big ? strdup(big) : json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t) return s->oom = true, -1;
    size_t len = strlen(t), at = 0;
    while (at < n->n_lits && cmp_bytes(n->lits[at], n->lit_lens[at], t, len) < 0) at++;
    if (at < n->n_lits && cmp_bytes(n->lits[at], n->lit_lens[at], t, len) == 0) {
        free(t);
        return 0;
    }
    char **l = realloc(n->lits, (n->n_lits + 1) * sizeof(*l));
    if (l) n->lits = l;
    size_t *ll = realloc(n->lit_lens, (n->n_lits + 1) * sizeof(*ll));
    if (ll) n->lit_lens = ll;
    if (!l || !ll) {
        free(t);
        return s->oom = true, -1;
    }
    memmove(n->lits + at + 1, n->lits + at, (n->n_lits - at) * sizeof(*l));
    memmove(n->lit_lens + at + 1, n->lit_lens + at, (n->n_lits - at) * sizeof(*ll));
    n->lits[at] = t;
    n->lit_lens[at] = len;
    n->n_lits++;
    return 0;
}

static int class_of_byte(unsigned char b) {
    switch (b) {
    case '{': return C_OBJ;
    case '[': return C_ARR;
    case '"': return C_STR;
    case 't': return C_TRUE;
    case 'f': return C_FALSE;
    case 'n': return C_NULL;
    default: return (b == '-' || (b >= '0' && b <= '9')) ? C_NUM : -1;
    }
}

/* The classes a node's values start with (a bit mask). */
static unsigned classes_of(const jnode *n) {
    switch (n->kind) {
    case J_ANY: return (1u << N_CLASSES) - 1;
    case J_OBJECT: return 1u << C_OBJ;
    case J_ARRAY: return 1u << C_ARR;
    case J_STRING: return 1u << C_STR;
    case J_NUMBER:
    case J_INTEGER: return 1u << C_NUM;
    case J_LITERALS: {
        unsigned m = 0;
        for (size_t i = 0; i < n->n_lits; i++) m |= 1u << class_of_byte((unsigned char)n->lits[i][0]);
        return m;
    }
    case J_UNION: {
        unsigned m = 0;
        for (int c = 0; c < N_CLASSES; c++)
            if (n->alt[c]) m |= 1u << c;
        return m;
    }
    }
    return 0;
}

/* Literal nodes holding only the literals of one class. */
static jnode *literals_of_class(jschema *s, const jnode *n, int cls) {
    jnode *r = node_new(s, J_LITERALS);
    if (!r) return NULL;
    for (size_t i = 0; i < n->n_lits; i++) {
        if (class_of_byte((unsigned char)n->lits[i][0]) != cls) continue;
        json_t *v = json_loadb(n->lits[i], n->lit_lens[i], JSON_DECODE_ANY, NULL);
        int rc = v ? add_literal(s, r, v) : -1;
        json_decref(v);
        if (rc) return NULL;
    }
    r->ready = true;
    return r;
}

/* Put alternative `a` into the union `u`, by the classes it starts with. */
static int union_add(jschema *s, jnode *u, jnode *a, const char *path) {
    if (!a->ready) return why(s, path, "%s", "a recursive $ref as an alternative is not supported");
    unsigned m = classes_of(a);
    for (int c = 0; c < N_CLASSES; c++) {
        if (!(m & (1u << c))) continue;
        jnode *part = a;
        if (a->kind == J_UNION) part = a->alt[c];
        else if (a->kind == J_LITERALS && (m & ~(1u << c))) part = literals_of_class(s, a, c);
        else if (a->kind == J_ANY) {
            jnode *any[N_CLASSES] = {s->any_obj,  s->any_arr,   s->any_str, s->any_num,
                                     s->lit_true, s->lit_false, s->lit_null};
            part = any[c];
        }
        if (!part) return -1;
        jnode *have = u->alt[c];
        if (have && have->kind == J_LITERALS && part->kind == J_LITERALS) {
            for (size_t i = 0; i < part->n_lits; i++) {
                json_t *v = json_loadb(part->lits[i], part->lit_lens[i], JSON_DECODE_ANY, NULL);
                int rc = v ? add_literal(s, have, v) : -1;
                json_decref(v);
                if (rc) return -1;
            }
        } else if (have && have != part) {
            static const char *const names[] = {"an object", "an array", "a string", "a number",
                                                "true",      "false",    "null"};
            return why(s, path, "alternatives that both can be %s are not supported", names[c]);
        } else {
            u->alt[c] = part;
        }
    }
    return 0;
}

static int compile_into(jschema *s, jnode *n, const json_t *sc, const char *path);
static jnode *resolve_ref(jschema *s, const char *ref, const char *path);

/* Keywords that only describe. */
static bool annotation(const char *k) {
    static const char *const ann[] = {"description", "title", "default",     "examples",   "format",
                                      "$schema",     "$id",   "$comment",    "deprecated", "readOnly",
                                      "writeOnly",   "$defs", "definitions", NULL};
    for (int i = 0; ann[i]; i++)
        if (strcmp(k, ann[i]) == 0) return true;
    return false;
}

/* The only keyword of sc besides annotations (and "nullable") is `k`. */
static bool sole_keyword(const json_t *sc, const char *k) {
    const char *key;
    const json_t *v;
    if (!json_object_get(sc, k)) return false;
    json_object_foreach((json_t *)sc, key, v) {
        if (strcmp(key, k) != 0 && strcmp(key, "nullable") != 0 && !annotation(key)) return false;
    }
    return true;
}

static jnode *compile(jschema *s, const json_t *sc, const char *path) {
    jnode *n = NULL;
    const json_t *ref = json_object_get(sc, "$ref");
    const json_t *all = json_object_get(sc, "allOf");
    if (ref) {
        if (!json_is_string(ref)) return why(s, path, "%s must be a string", "$ref"), NULL;
        if (!sole_keyword(sc, "$ref"))
            return why(s, path, "%s", "$ref next to other constraints is not supported"), NULL;
        n = resolve_ref(s, json_string_value(ref), path);
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1 || !sole_keyword(sc, "allOf"))
            return why(s, path, "%s", "allOf is supported with exactly one schema and nothing next to it"), NULL;
        char sub[512];
        snprintf(sub, sizeof(sub), "%s.allOf[0]", path);
        n = compile(s, json_array_get(all, 0), sub);
    } else {
        n = node_new(s, J_ANY);
        if (n && compile_into(s, n, sc, path) != 0) n = NULL;
    }
    if (n && json_is_true(json_object_get(sc, "nullable"))) {
        jnode *u = node_new(s, J_UNION);
        if (!u || union_add(s, u, n, path) || union_add(s, u, s->lit_null, path)) return NULL;
        u->ready = true;
        n = u;
    }
    return n;
}

static jnode *resolve_ref(jschema *s, const char *ref, const char *path) {
    for (size_t i = 0; i < s->n_refs; i++)
        if (strcmp(s->refs[i].ref, ref) == 0) return s->refs[i].node;
    const json_t *target = NULL;
    const char *name = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) target = json_object_get(s->doc, "$defs"), name = ref + 8;
    else if (strncmp(ref, "#/definitions/", 14) == 0) target = json_object_get(s->doc, "definitions"), name = ref + 14;
    else if (strcmp(ref, "#") == 0) target = NULL, name = NULL;
    else {
        why(s, path, "$ref \"%s\" is not supported (only #, #/$defs/NAME and #/definitions/NAME)", ref);
        return NULL;
    }
    const json_t *def = name ? json_object_get(target, name) : s->doc;
    if (!def) {
        why(s, path, "$ref \"%s\" names no definition", ref);
        return NULL;
    }
    jnode *n = node_new(s, J_ANY);
    ref_memo *m = realloc(s->refs, (s->n_refs + 1) * sizeof(*m));
    if (!n || !m) {
        s->oom = true;
        return NULL;
    }
    s->refs = m;
    s->refs[s->n_refs++] = (ref_memo){strdup(ref), n};
    char sub[512];
    snprintf(sub, sizeof(sub), "%s", ref);
    return compile_into(s, n, def, sub) == 0 ? n : NULL;
}

static bool keyword_known(const char *k) {
    static const char *const ok[] = {"type",      "properties",  "required",    "additionalProperties",
                                     "items",     "minItems",    "maxItems",    "minLength",
                                     "maxLength", "enum",        "const",       "anyOf",
                                     "oneOf",     "allOf",       "nullable",    "$ref",
                                     "$defs",     "definitions", "description", "title",
                                     "default",   "examples",    "format",      "$schema",
                                     "$id",       "$comment",    "deprecated",  "readOnly",
                                     "writeOnly", NULL};
    for (int i = 0; ok[i]; i++)
        if (strcmp(k, ok[i]) == 0) return true;
    return false;
}

static int get_count(jschema *s, const json_t *sc, const char *k, uint32_t *out, const char *path) {
    const json_t *v = json_object_get(sc, k);
    if (!v) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX - 1)
        return why(s, path, "%s must be a non-negative integer", k);
    *out = (uint32_t)json_integer_value(v);
    return 0;
}

static int compile_object(jschema *s, jnode *n, const json_t *sc, const char *path) {
    n->kind = J_OBJECT;
    const json_t *props = json_object_get(sc, "properties");
    const json_t *req = json_object_get(sc, "required");
    const json_t *add = json_object_get(sc, "additionalProperties");
    if (props && !json_is_object(props)) return why(s, path, "%s must be an object", "properties");
    if (req && !json_is_array(req)) return why(s, path, "%s must be an array", "required");
    if (json_object_size(props) > MAX_PROPS) return why(s, path, "more than %s properties", "64");
    size_t np = json_object_size(props);
    n->keys = calloc(np ? np : 1, sizeof(*n->keys));
    n->key_lens = calloc(np ? np : 1, sizeof(*n->key_lens));
    n->props = calloc(np ? np : 1, sizeof(*n->props));
    if (!n->keys || !n->key_lens || !n->props) return s->oom = true, -1;
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)props, key, v) {
        json_t *ks = json_string(key);
        char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!enc) return s->oom = true, -1;
        size_t len = strlen(enc) - 2, at = 0;
        memmove(enc, enc + 1, len);
        enc[len] = '\0';
        while (at < n->n_props && cmp_bytes(n->keys[at], n->key_lens[at], enc, len) < 0) at++;
        memmove(n->keys + at + 1, n->keys + at, (n->n_props - at) * sizeof(*n->keys));
        memmove(n->key_lens + at + 1, n->key_lens + at, (n->n_props - at) * sizeof(*n->key_lens));
        memmove(n->props + at + 1, n->props + at, (n->n_props - at) * sizeof(*n->props));
        n->keys[at] = enc;
        n->key_lens[at] = len;
        n->n_props++;
        char sub[512];
        snprintf(sub, sizeof(sub), "%s.properties.%s", path, key);
        if (!(n->props[at] = compile(s, v, sub))) return -1;
    }
    for (size_t i = 0; i < json_array_size(req); i++) {
        const char *r = json_string_value(json_array_get(req, i));
        if (!r) return why(s, path, "%s must hold strings", "required");
        json_t *ks = json_string(r);
        char *enc = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
        json_decref(ks);
        if (!enc) return s->oom = true, -1;
        size_t k = 0;
        while (k < n->n_props &&
               !(n->key_lens[k] == strlen(enc) - 2 && memcmp(n->keys[k], enc + 1, n->key_lens[k]) == 0))
            k++;
        free(enc);
        if (k == n->n_props) return why(s, path, "required property \"%s\" is not among the properties", r);
        n->required |= 1ull << k;
    }
    if (!add || json_is_true(add)) n->additional = s->any;
    else if (json_is_false(add)) n->additional = NULL;
    else if (json_is_object(add)) {
        char sub[512];
        snprintf(sub, sizeof(sub), "%s.additionalProperties", path);
        if (!(n->additional = compile(s, add, sub))) return -1;
    } else {
        return why(s, path, "%s must be a boolean or a schema", "additionalProperties");
    }
    return 0;
}

/* One "type" value with the schema's keywords. */
static int compile_type(jschema *s, jnode *n, const char *type, const json_t *sc, const char *path) {
    if (strcmp(type, "object") == 0) return compile_object(s, n, sc, path);
    if (strcmp(type, "array") == 0) {
        n->kind = J_ARRAY;
        const json_t *items = json_object_get(sc, "items");
        char sub[512];
        snprintf(sub, sizeof(sub), "%s.items", path);
        if (!items) n->items = s->any;
        else if (!json_is_object(items) && !json_is_boolean(items)) return why(s, path, "%s must be a schema", "items");
        else if (!(n->items = compile(s, items, sub))) return -1;
        if (get_count(s, sc, "minItems", &n->min_items, path) || get_count(s, sc, "maxItems", &n->max_items, path))
            return -1;
        if (n->min_items > n->max_items) return why(s, path, "%s", "minItems is above maxItems");
        return 0;
    }
    if (strcmp(type, "string") == 0) {
        n->kind = J_STRING;
        if (get_count(s, sc, "minLength", &n->min_len, path) || get_count(s, sc, "maxLength", &n->max_len, path))
            return -1;
        if (n->min_len > n->max_len) return why(s, path, "%s", "minLength is above maxLength");
        return 0;
    }
    if (strcmp(type, "number") == 0 || strcmp(type, "integer") == 0) {
        n->kind = type[0] == 'n' ? J_NUMBER : J_INTEGER;
        return 0;
    }
    n->kind = J_LITERALS;
    if (strcmp(type, "boolean") == 0) {
        json_t *t = json_true(), *f = json_false();
        int rc = add_literal(s, n, t) || add_literal(s, n, f) ? -1 : 0;
        json_decref(t);
        json_decref(f);
        return rc;
    }
    if (strcmp(type, "null") == 0) {
        json_t *z = json_null();
        int rc = add_literal(s, n, z);
        json_decref(z);
        return rc;
    }
    return why(s, path, "unknown type \"%s\"", type);
}

static int compile_body(jschema *s, jnode *n, const json_t *sc, const char *path);

static int compile_into(jschema *s, jnode *n, const json_t *sc, const char *path) {
    if (compile_body(s, n, sc, path) != 0) return -1;
    n->ready = true;
    return 0;
}

static int compile_body(jschema *s, jnode *n, const json_t *sc, const char *path) {
    if (json_is_true(sc)) return 0; /* J_ANY */
    if (json_is_false(sc)) return why(s, path, "%s", "the schema false admits no value");
    if (!json_is_object(sc)) return why(s, path, "%s", "a schema must be an object or a boolean");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)sc, k, v) {
        if (!keyword_known(k)) return why(s, path, "keyword \"%s\" is not supported by constrained decoding", k);
    }
    const json_t *en = json_object_get(sc, "enum");
    const json_t *cst = json_object_get(sc, "const");
    const json_t *any = json_object_get(sc, "anyOf");
    if (!any) any = json_object_get(sc, "oneOf");
    const json_t *type = json_object_get(sc, "type");
    char sub[512];
    if (json_object_get(sc, "allOf") || json_object_get(sc, "$ref"))
        return why(s, path, "%s", "$ref and allOf are supported alone only");
    if (en || cst) {
        n->kind = J_LITERALS;
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return why(s, path, "%s must be a non-empty array", "enum");
        if (cst && add_literal(s, n, cst)) return -1;
        for (size_t i = 0; i < json_array_size(en); i++)
            if (add_literal(s, n, json_array_get(en, i))) return -1;
    } else if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0)
            return why(s, path, "%s must be a non-empty array", "anyOf");
        n->kind = J_UNION;
        for (size_t i = 0; i < json_array_size(any); i++) {
            snprintf(sub, sizeof(sub), "%s.anyOf[%zu]", path, i);
            jnode *a = compile(s, json_array_get(any, i), sub);
            if (!a || union_add(s, n, a, path)) return -1;
        }
    } else if (json_is_array(type)) {
        n->kind = J_UNION;
        for (size_t i = 0; i < json_array_size(type); i++) {
            const char *t = json_string_value(json_array_get(type, i));
            if (!t) return why(s, path, "%s must hold strings", "type");
            jnode *a = node_new(s, J_ANY);
            if (!a || compile_type(s, a, t, sc, path)) return -1;
            a->ready = true;
            if (union_add(s, n, a, path)) return -1;
        }
    } else if (json_is_string(type)) {
        if (compile_type(s, n, json_string_value(type), sc, path)) return -1;
    } else if (type) {
        return why(s, path, "%s must be a string or an array of strings", "type");
    } else if (json_object_get(sc, "properties") || json_object_get(sc, "required") ||
               json_object_get(sc, "additionalProperties")) {
        if (compile_object(s, n, sc, path)) return -1;
    } else if (json_object_get(sc, "items")) {
        if (compile_type(s, n, "array", sc, path)) return -1;
    }
    return 0;
}

static int make_builtins(jschema *s) {
    s->any = node_new(s, J_ANY);
    s->any_obj = node_new(s, J_OBJECT);
    s->any_arr = node_new(s, J_ARRAY);
    s->any_str = node_new(s, J_STRING);
    s->any_num = node_new(s, J_NUMBER);
    s->lit_true = node_new(s, J_LITERALS);
    s->lit_false = node_new(s, J_LITERALS);
    s->lit_null = node_new(s, J_LITERALS);
    if (s->oom) return -1;
    s->any_obj->additional = s->any;
    s->any_arr->items = s->any;
    json_t *t = json_true(), *f = json_false(), *z = json_null();
    int rc = add_literal(s, s->lit_true, t) || add_literal(s, s->lit_false, f) || add_literal(s, s->lit_null, z);
    json_decref(t);
    json_decref(f);
    json_decref(z);
    for (jnode *n = s->all; n; n = n->next) n->ready = true;
    return rc ? -1 : 0;
}

/* Any value is a union of the builtin shapes: no J_ANY at run time. */
static void resolve_any(jschema *s) {
    jnode *b[N_CLASSES] = {s->any_obj, s->any_arr, s->any_str, s->any_num, s->lit_true, s->lit_false, s->lit_null};
    for (jnode *n = s->all; n; n = n->next)
        if (n->kind == J_ANY) {
            n->kind = J_UNION;
            memcpy(n->alt, b, sizeof(b));
        }
}

jschema *jschema_compile(const json_t *schema, char *why_buf, size_t why_cap) {
    jschema *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->doc = schema;
    s->why = why_buf;
    s->why_cap = why_cap;
    if (why_buf && why_cap) why_buf[0] = '\0';
    if (make_builtins(s) == 0) s->root = compile(s, schema, "");
    if (s->root) resolve_any(s);
    if (!s->root) {
        if (s->oom && why_buf && !why_buf[0]) snprintf(why_buf, why_cap, "out of memory");
        jschema_free(s);
        return NULL;
    }
    for (size_t i = 0; i < s->n_refs; i++) free(s->refs[i].ref);
    free(s->refs);
    s->refs = NULL;
    s->n_refs = 0;
    return s;
}

jschema *jschema_any_object(void) {
    jschema *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    if (make_builtins(s) != 0) {
        jschema_free(s);
        return NULL;
    }
    s->root = s->any_obj;
    resolve_any(s);
    return s;
}

/* ============================================================ matcher */

enum phase {
    P_VALUE,     /* before a value */
    P_OBJ_OPEN,  /* after "{" */
    P_KEY,       /* inside a key */
    P_COLON,     /* after a key */
    P_OBJ_NEXT,  /* after a member's value */
    P_OBJ_COMMA, /* after "," in an object */
    P_ARR_OPEN,  /* after "[" */
    P_ARR_NEXT,  /* after an element */
    P_ARR_COMMA, /* after "," in an array */
    P_STR,       /* inside a string value */
    P_NUM,       /* inside a number */
    P_LIT,       /* inside a literal */
};

/* Number states. */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

typedef struct jframe {
    const jnode *n;
    uint8_t phase;
    uint8_t sub;    /* string: 0, 1 after "\", 2..5 hex digits left + 1; number: N_* */
    uint8_t utf8;   /* continuation bytes still due */
    uint8_t other;  /* object: the key being read is not a known property */
    uint8_t ws;     /* white space bytes in a row */
    uint8_t digits; /* number: digits of the current part */
    uint16_t pad;
    uint32_t count;       /* string: code points; array: elements */
    uint32_t lo, hi, off; /* key or literal candidates [lo, hi) after off bytes */
    int32_t prop;         /* object: the key just read (-1: another key) */
    uint64_t seen;        /* object: keys seen */
} jframe;

typedef struct jstate {
    uint8_t depth;
    uint8_t done; /* the top-level value is complete */
    uint8_t ws;   /* white space after it */
    uint8_t pad;
    jframe f[JMAX_DEPTH];
} jstate;

static bool is_ws(unsigned char b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

static bool push(jstate *st, const jnode *n) {
    if (st->depth >= JMAX_DEPTH) return false;
    jframe *f = &st->f[st->depth++];
    memset(f, 0, sizeof(*f));
    f->n = n;
    f->phase = P_VALUE;
    f->prop = -1;
    return true;
}

/* The value of the top frame is complete: pop it. */
static void complete(jstate *st) {
    st->depth--;
    if (st->depth == 0) st->done = 1;
}

static bool feed(jstate *st, unsigned char b);

/* Literal candidates among lits[lo, hi) whose byte `off` is b. */
static bool narrow(char *const *lits, const size_t *lens, uint32_t *lo, uint32_t *hi, uint32_t off, unsigned char b) {
    uint32_t l = *lo, h = *hi;
    while (l < h && (lens[l] <= off || (unsigned char)lits[l][off] < b)) l++;
    uint32_t e = l;
    while (e < h && lens[e] > off && (unsigned char)lits[e][off] == b) e++;
    *lo = l;
    *hi = e;
    return l < e;
}

/* An exact literal among [lo, hi) after off bytes (it sorts first). */
static int exact(char *const *lits, const size_t *lens, uint32_t lo, uint32_t hi, uint32_t off) {
    (void)lits;
    return lo < hi && lens[lo] == off ? (int)lo : -1;
}

/* String bytes: escapes, UTF-8, control characters.  1 accepted, 0 the
 * closing quote, -1 refused. */
static int string_byte(jframe *f, unsigned char b) {
    if (f->utf8) {
        if ((b & 0xC0) != 0x80) return -1;
        f->utf8--;
        return 1;
    }
    if (f->sub == 1) {
        if (b == 'u') f->sub = 5;
        else if (strchr("\"\\/bfnrt", b) && b) f->sub = 0;
        else return -1;
        if (f->sub == 0) f->count++;
        return 1;
    }
    if (f->sub >= 2) {
        if (!((b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'))) return -1;
        if (--f->sub == 1) {
            f->sub = 0;
            f->count++;
        }
        return 1;
    }
    if (b == '"') return 0;
    if (b < 0x20) return -1;
    if (b == '\\') {
        f->sub = 1;
        return 1;
    }
    if (b < 0x80) f->count++;
    else if (b >= 0xC2 && b <= 0xDF) f->utf8 = 1, f->count++;
    else if (b >= 0xE0 && b <= 0xEF) f->utf8 = 2, f->count++;
    else if (b >= 0xF0 && b <= 0xF4) f->utf8 = 3, f->count++;
    else return -1;
    return 1;
}

/* Start a value of node n in frame f with its first byte b. */
static bool value_start(jstate *st, jframe *f, unsigned char b) {
    const jnode *n = f->n;
    int cls = class_of_byte(b);
    if (cls < 0) return false;
    if (n->kind == J_UNION) {
        if (!n->alt[cls]) return false;
        f->n = n = n->alt[cls];
        return value_start(st, f, b);
    }
    switch (n->kind) {
    case J_OBJECT:
        if (b != '{') return false;
        f->phase = P_OBJ_OPEN;
        return true;
    case J_ARRAY:
        if (b != '[') return false;
        f->phase = P_ARR_OPEN;
        return true;
    case J_STRING:
        if (b != '"') return false;
        f->phase = P_STR;
        return true;
    case J_NUMBER:
    case J_INTEGER:
        if (cls != C_NUM) return false;
        f->phase = P_NUM;
        f->sub = b == '-' ? N_MINUS : b == '0' ? N_ZERO : N_INT;
        f->digits = b == '-' ? 0 : 1;
        return true;
    case J_LITERALS:
        f->phase = P_LIT;
        f->lo = 0;
        f->hi = (uint32_t)n->n_lits;
        f->off = 0;
        if (!narrow(n->lits, n->lit_lens, &f->lo, &f->hi, 0, b)) return false;
        f->off = 1;
        if (f->hi - f->lo == 1 && n->lit_lens[f->lo] == 1) complete(st);
        return true;
    default: return false;
    }
}

static bool number_accepting(const jframe *f) {
    return f->sub == N_ZERO || f->sub == N_INT || f->sub == N_FRAC || f->sub == N_EXP;
}

/* 1 consumed, 0 the number ended before b, -1 refused. */
static int number_byte(jframe *f, unsigned char b) {
    bool digit = b >= '0' && b <= '9', integer = f->n->kind == J_INTEGER;
    switch (f->sub) {
    case N_MINUS:
        if (!digit) return -1;
        f->sub = b == '0' ? N_ZERO : N_INT;
        f->digits = 1;
        return 1;
    case N_ZERO:
        if (!integer && b == '.') return f->sub = N_DOT, 1;
        if (!integer && (b == 'e' || b == 'E')) return f->sub = N_E, 1;
        return digit ? -1 : 0;
    case N_INT:
        if (digit) return ++f->digits > JMAX_INT_DIGITS ? -1 : 1;
        if (!integer && b == '.') return f->sub = N_DOT, 1;
        if (!integer && (b == 'e' || b == 'E')) return f->sub = N_E, 1;
        return 0;
    case N_DOT:
        if (!digit) return -1;
        f->sub = N_FRAC;
        f->digits = 1;
        return 1;
    case N_FRAC:
        if (digit) return ++f->digits > JMAX_FRAC_DIGITS ? -1 : 1;
        if (b == 'e' || b == 'E') return f->sub = N_E, 1;
        return 0;
    case N_E:
        if (b == '+' || b == '-') return f->sub = N_ESIGN, 1;
        if (!digit) return -1;
        f->sub = N_EXP;
        f->digits = 1;
        return 1;
    case N_ESIGN:
        if (!digit) return -1;
        f->sub = N_EXP;
        f->digits = 1;
        return 1;
    case N_EXP:
        if (digit) return ++f->digits > JMAX_EXP_DIGITS ? -1 : 1;
        return 0;
    }
    return -1;
}

/* A key byte.  Known keys are matched literally; another key (when the
 * object allows them) is any JSON string. */
static bool key_byte(jframe *f, unsigned char b) {
    const jnode *n = f->n;
    if (b == '"' && f->sub == 0 && f->utf8 == 0) {
        int k = f->other ? -1 : exact(n->keys, n->key_lens, f->lo, f->hi, f->off);
        if (k >= 0) {
            if (f->seen & (1ull << k)) return false;
            f->seen |= 1ull << k;
        } else if (!n->additional) {
            return false;
        }
        f->prop = k;
        f->phase = P_COLON;
        f->ws = 0;
        return true;
    }
    if (string_byte(f, b) != 1) return false;
    if (!f->other) {
        uint32_t lo = f->lo, hi = f->hi;
        bool unseen = false;
        if (narrow(n->keys, n->key_lens, &lo, &hi, f->off, b))
            for (uint32_t k = lo; k < hi && !unseen; k++) unseen = !(f->seen & (1ull << k));
        if (unseen) {
            f->lo = lo, f->hi = hi, f->off++;
            return true;
        }
        if (!n->additional) return false;
        f->other = 1;
    }
    return true;
}

static bool object_can_close(const jframe *f) { return (f->seen & f->n->required) == f->n->required; }

static bool object_has_more(const jframe *f) {
    if (f->n->additional) return true;
    uint64_t all = f->n->n_props >= 64 ? ~0ull : (1ull << f->n->n_props) - 1;
    return (f->seen & all) != all;
}

static bool ws_ok(jframe *f, unsigned char b) {
    if (!is_ws(b)) {
        f->ws = 0;
        return false;
    }
    return ++f->ws <= JMAX_WS;
}

static bool feed(jstate *st, unsigned char b) {
    if (st->done) return is_ws(b) && ++st->ws <= JMAX_WS;
    jframe *f = &st->f[st->depth - 1];
    switch (f->phase) {
    case P_VALUE:
        if (is_ws(b)) return ++f->ws <= JMAX_WS;
        f->ws = 0;
        return value_start(st, f, b);
    case P_OBJ_OPEN:
        if (ws_ok(f, b)) return true;
        if (f->ws > JMAX_WS) return false;
        if (b == '}') {
            if (!object_can_close(f)) return false;
            complete(st);
            return true;
        }
        if (b != '"' || !object_has_more(f)) return false;
        f->phase = P_KEY, f->lo = 0, f->hi = (uint32_t)f->n->n_props, f->off = 0, f->other = 0, f->sub = 0, f->utf8 = 0;
        return true;
    case P_KEY: return key_byte(f, b);
    case P_COLON:
        if (ws_ok(f, b)) return true;
        if (f->ws > JMAX_WS || b != ':') return false;
        f->phase = P_OBJ_NEXT;
        return push(st, f->prop >= 0 ? f->n->props[f->prop] : f->n->additional);
    case P_OBJ_NEXT:
        if (ws_ok(f, b)) return true;
        if (f->ws > JMAX_WS) return false;
        if (b == '}') {
            if (!object_can_close(f)) return false;
            complete(st);
            return true;
        }
        if (b != ',' || !object_has_more(f)) return false;
        f->phase = P_OBJ_COMMA;
        return true;
    case P_OBJ_COMMA:
        if (ws_ok(f, b)) return true;
        if (f->ws > JMAX_WS || b != '"') return false;
        f->phase = P_KEY, f->lo = 0, f->hi = (uint32_t)f->n->n_props, f->off = 0, f->other = 0, f->sub = 0, f->utf8 = 0;
        return true;
    case P_ARR_OPEN:
    case P_ARR_COMMA:
        if (ws_ok(f, b)) return true;
        if (f->ws > JMAX_WS) return false;
        if (b == ']' && f->phase == P_ARR_OPEN) {
            if (f->n->min_items > 0) return false;
            complete(st);
            return true;
        }
        if (f->count >= f->n->max_items) return false;
        f->count++;
        f->phase = P_ARR_NEXT;
        return push(st, f->n->items) && feed(st, b);
    case P_ARR_NEXT:
        if (ws_ok(f, b)) return true;
        if (f->ws > JMAX_WS) return false;
        if (b == ']') {
            if (f->count < f->n->min_items) return false;
            complete(st);
            return true;
        }
        if (b != ',' || f->count >= f->n->max_items) return false;
        f->phase = P_ARR_COMMA;
        return true;
    case P_STR: {
        if (f->count >= f->n->max_len && b != '"' && !f->utf8 && !f->sub) return false;
        int r = string_byte(f, b);
        if (r < 0) return false;
        if (r == 0) {
            if (f->count < f->n->min_len) return false;
            complete(st);
        }
        return true;
    }
    case P_NUM: {
        int r = number_byte(f, b);
        if (r < 0) return false;
        if (r == 1) return true;
        complete(st);
        return feed(st, b);
    }
    case P_LIT: {
        const jnode *n = f->n;
        uint32_t lo = f->lo, hi = f->hi;
        if (narrow(n->lits, n->lit_lens, &lo, &hi, f->off, b)) {
            f->lo = lo, f->hi = hi, f->off++;
            if (hi - lo == 1 && n->lit_lens[lo] == f->off) complete(st);
            return true;
        }
        if (exact(n->lits, n->lit_lens, f->lo, f->hi, f->off) < 0) return false;
        complete(st);
        return feed(st, b);
    }
    }
    return false;
}

/* The value can end here (EOS): complete, or a number or literal that is. */
static bool json_can_end(const jstate *st) {
    if (st->done) return true;
    if (st->depth != 1) return false;
    const jframe *f = &st->f[0];
    if (f->phase == P_NUM) return number_accepting(f);
    if (f->phase == P_LIT) return exact(f->n->lits, f->n->lit_lens, f->lo, f->hi, f->off) >= 0;
    return false;
}

/* The forbidden strings of tool_choice none: every opening of a tool-call
 * block the parser knows, and the DSML marker itself (never text). */
static const char *forbidden(int k) {
    static const char *const marker = DS4_DSML_MARKER;
    int n = 0;
    while (DS4_DSML_BLOCK_OPENERS[n]) n++;
    return k < n ? DS4_DSML_BLOCK_OPENERS[k] : k == n ? marker : NULL;
}

/* Matched length of f after p matched bytes and then b: the longest
 * prefix of f that ends the text there. */
static size_t match_step(const char *f, size_t p, unsigned char b) {
    for (size_t k = p + 1; k > 0; k--)
        if ((unsigned char)f[k - 1] == b && memcmp(f, f + p - (k - 1), k - 1) == 0) return k;
    return 0;
}

/* ============================================================ vocabulary */

typedef struct ventry {
    int32_t id;
    uint32_t off; /* into bytes */
    uint16_t len;
    uint16_t lcp;    /* common prefix with the previous entry of its list */
    uint8_t special; /* an added token (control, user-defined) */
} ventry;

struct cvocab {
    uint32_t n_vocab;
    int32_t eos;
    char *bytes;
    ventry *all, *noplain;
    size_t n_all, n_noplain;
    uint8_t *plain;   /* [id]: allowed anywhere inside a free JSON string */
    uint8_t *opener;  /* [id]: holds a whole forbidden string (forbidden()) */
    uint8_t *special; /* [id] */
    uint32_t *off_of; /* [id]: its bytes */
    uint16_t *len_of;
    size_t first[257]; /* all[first[b] .. first[b + 1]): the tokens whose first byte is b */
    size_t max_len;
};

static int by_bytes(const void *a, const void *b, void *base) {
    const ventry *x = a, *y = b;
    const char *p = base;
    int c = cmp_bytes(p + x->off, x->len, p + y->off, y->len);
    return c ? c : (x->id > y->id) - (x->id < y->id);
}

static void set_lcp(const char *base, ventry *e, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint16_t l = 0;
        if (i) {
            const char *a = base + e[i - 1].off, *b = base + e[i].off;
            size_t m = e[i - 1].len < e[i].len ? e[i - 1].len : e[i].len;
            while (l < m && a[l] == b[l]) l++;
        }
        e[i].lcp = l;
    }
}

/* Bytes that can sit anywhere inside a JSON string without changing its
 * state: no quote, backslash or control character, whole UTF-8 characters. */
static bool plain_bytes(const unsigned char *p, size_t n) {
    if (n == 0) return false;
    for (size_t i = 0; i < n;) {
        unsigned char b = p[i];
        size_t k;
        if (b < 0x80) {
            if (b < 0x20 || b == '"' || b == '\\') return false;
            k = 0;
        } else if (b >= 0xC2 && b <= 0xDF) k = 1;
        else if (b >= 0xE0 && b <= 0xEF) k = 2;
        else if (b >= 0xF0 && b <= 0xF4) k = 3;
        else return false;
        if (i + k >= n) return false;
        for (size_t j = 1; j <= k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return false;
        i += k + 1;
    }
    return true;
}

cvocab *cvocab_new(const ds4_vocab *v, ds4_err *err) {
    cvocab *cv = calloc(1, sizeof(*cv));
    uint32_t n = ds4_vocab_size(v);
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) total += ds4_vocab_token_bytes(v, (int32_t)i).len;
    if (cv) {
        cv->n_vocab = n;
        cv->eos = ds4_vocab_eos(v);
        cv->bytes = malloc(total ? total : 1);
        cv->all = calloc(n ? n : 1, sizeof(ventry));
        cv->noplain = calloc(n ? n : 1, sizeof(ventry));
        cv->plain = calloc(n ? n : 1, 1);
        cv->opener = calloc(n ? n : 1, 1);
        cv->special = calloc(n ? n : 1, 1);
        cv->off_of = calloc(n ? n : 1, sizeof(uint32_t));
        cv->len_of = calloc(n ? n : 1, sizeof(uint16_t));
    }
    if (!cv || !cv->bytes || !cv->all || !cv->noplain || !cv->plain || !cv->opener || !cv->special || !cv->off_of ||
        !cv->len_of) {
        cvocab_free(cv);
        ds4_err_set(err, DS4_ENOMEM, "constrained decoding: out of memory");
        return NULL;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        ds4_str t = ds4_vocab_token_bytes(v, (int32_t)i);
        ds4_token_type ty = ds4_vocab_type(v, (int32_t)i);
        if (t.len == 0 || t.len > UINT16_MAX || (int32_t)i == cv->eos) continue;
        memcpy(cv->bytes + off, t.ptr, t.len);
        cv->off_of[i] = (uint32_t)off;
        cv->len_of[i] = (uint16_t)t.len;
        bool special = ty == DS4_TOKEN_CONTROL || ty == DS4_TOKEN_USER_DEFINED;
        ventry e = {(int32_t)i, (uint32_t)off, (uint16_t)t.len, 0, special};
        cv->all[cv->n_all++] = e;
        cv->special[i] = special;
        cv->plain[i] = !special && plain_bytes((const unsigned char *)t.ptr, t.len);
        if (!cv->plain[i]) cv->noplain[cv->n_noplain++] = e;
        for (int k = 0; forbidden(k); k++)
            if (memmem(t.ptr, t.len, forbidden(k), strlen(forbidden(k)))) cv->opener[i] = 1;
        if (t.len > cv->max_len) cv->max_len = t.len;
        off += t.len;
    }
    qsort_r(cv->all, cv->n_all, sizeof(ventry), by_bytes, cv->bytes);
    qsort_r(cv->noplain, cv->n_noplain, sizeof(ventry), by_bytes, cv->bytes);
    set_lcp(cv->bytes, cv->all, cv->n_all);
    set_lcp(cv->bytes, cv->noplain, cv->n_noplain);
    for (size_t i = 0, b = 0; b <= 256; b++) {
        while (i < cv->n_all && (unsigned char)cv->bytes[cv->all[i].off] < b) i++;
        cv->first[b] = i;
    }
    return cv;
}

void cvocab_free(cvocab *cv) {
    if (!cv) return;
    free(cv->bytes);
    free(cv->all);
    free(cv->noplain);
    free(cv->plain);
    free(cv->opener);
    free(cv->special);
    free(cv->off_of);
    free(cv->len_of);
    free(cv);
}

/* ============================================================ constraint */

/* The state over the answer's bytes (copied per byte in the mask walk:
 * only the used JSON frames are copied). */
typedef struct cstate {
    uint8_t pre_alive;         /* the prefix alternatives can still match */
    uint8_t json_alive;        /* the JSON value can still match */
    uint8_t free;              /* a prefix matched: anything goes (but the forbidden) */
    uint8_t closed;            /* a final prefix matched: only EOS */
    uint8_t partial[N_FORBID]; /* bytes of each forbidden string matched at the end */
    uint32_t lo, hi, off;      /* prefix candidates [lo, hi) after off bytes */
    jstate js;
} cstate;

struct constraint {
    const cvocab *cv;
    char **alts; /* prefix alternatives, sorted */
    size_t *alt_lens;
    size_t n_alts;
    bool final; /* the answer ends with the prefix */
    const jschema *schema;
    bool forbid;
    bool off;   /* a forced token broke it: nothing enforced */
    bool ended; /* EOS was chosen */
    cstate cur;
    cstate *stack;    /* per byte depth, for the walk */
    uint8_t *allowed; /* [n_vocab] */
};

static size_t cstate_bytes(const cstate *s) { return offsetof(cstate, js.f) + s->js.depth * sizeof(jframe); }

static void cstate_copy(cstate *dst, const cstate *src) { memcpy(dst, src, cstate_bytes(src)); }

static void restart(constraint *c) {
    cstate *s = &c->cur;
    memset(s, 0, sizeof(*s));
    s->pre_alive = c->n_alts > 0;
    s->hi = (uint32_t)c->n_alts;
    s->json_alive = c->schema != NULL;
    if (c->schema) push(&s->js, c->schema->root);
    s->free = !s->pre_alive && !s->json_alive;
    c->off = false;
    c->ended = false;
}

constraint *constraint_new(const cvocab *cv, ds4_err *err) {
    constraint *c = calloc(1, sizeof(*c));
    if (c) {
        c->cv = cv;
        c->stack = malloc((cv->max_len + 2) * sizeof(cstate));
        c->allowed = malloc(cv->n_vocab ? cv->n_vocab : 1);
    }
    if (!c || !c->stack || !c->allowed) {
        constraint_free(c);
        ds4_err_set(err, DS4_ENOMEM, "constrained decoding: out of memory");
        return NULL;
    }
    restart(c);
    return c;
}

static void free_alts(constraint *c) {
    for (size_t i = 0; i < c->n_alts; i++) free(c->alts[i]);
    free(c->alts);
    free(c->alt_lens);
    c->alts = NULL;
    c->alt_lens = NULL;
    c->n_alts = 0;
}

void constraint_free(constraint *c) {
    if (!c) return;
    free_alts(c);
    free(c->stack);
    free(c->allowed);
    free(c);
}

int constraint_set_prefix(constraint *c, const char *const *alts, size_t n, bool final) {
    free_alts(c);
    c->final = final;
    if (n > MAX_ALTS) n = MAX_ALTS;
    c->alts = calloc(n ? n : 1, sizeof(*c->alts));
    c->alt_lens = calloc(n ? n : 1, sizeof(*c->alt_lens));
    if (!c->alts || !c->alt_lens) return -1;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(alts[i]), at = 0;
        char *a = strdup(alts[i]);
        if (!a) return -1;
        while (at < c->n_alts && cmp_bytes(c->alts[at], c->alt_lens[at], a, len) < 0) at++;
        memmove(c->alts + at + 1, c->alts + at, (c->n_alts - at) * sizeof(*c->alts));
        memmove(c->alt_lens + at + 1, c->alt_lens + at, (c->n_alts - at) * sizeof(*c->alt_lens));
        c->alts[at] = a;
        c->alt_lens[at] = len;
        c->n_alts++;
    }
    restart(c);
    return 0;
}

void constraint_set_json(constraint *c, const jschema *s) {
    c->schema = s;
    restart(c);
}

void constraint_set_forbid_blocks(constraint *c, bool on) {
    c->forbid = on;
    restart(c);
}

bool constraint_idle(const constraint *c) {
    return c->off || c->ended || (c->cur.free && !c->cur.closed && !c->forbid);
}

bool constraint_json_done(const constraint *c) { return c->schema && c->cur.json_alive && c->cur.js.done; }

/* One byte of the answer. */
static bool cfeed(const constraint *c, cstate *s, unsigned char b) {
    if (c->forbid)
        for (int k = 0; k < N_FORBID && forbidden(k); k++) {
            const char *f = forbidden(k);
            size_t p = match_step(f, s->partial[k], b);
            if (f[p] == '\0') return false;
            s->partial[k] = (uint8_t)p;
        }
    if (s->closed) return false;
    if (s->free) return true;
    bool ok = false;
    if (s->pre_alive) {
        uint32_t lo = s->lo, hi = s->hi;
        if (narrow(c->alts, c->alt_lens, &lo, &hi, s->off, b)) {
            s->lo = lo, s->hi = hi, s->off++;
            if (exact(c->alts, c->alt_lens, lo, hi, s->off) >= 0) {
                s->free = 1;
                s->closed = c->final;
            }
            ok = true;
        } else {
            s->pre_alive = 0;
        }
    }
    if (s->json_alive) {
        if (feed(&s->js, b)) ok = true;
        else s->json_alive = 0;
    }
    return ok || s->free;
}

static bool partials_clear(const cstate *s) {
    for (int k = 0; k < N_FORBID; k++)
        if (s->partial[k]) return false;
    return true;
}

/* Walk a sorted token list, marking the tokens whose bytes the state
 * accepts; the state of a common prefix is reused, a dead prefix skips
 * every token that shares it. */
static void walk(constraint *c, const ventry *list, size_t n, bool specials) {
    const char *bytes = c->cv->bytes;
    cstate *st = c->stack;
    cstate_copy(&st[0], &c->cur);
    size_t valid = 0; /* st[0..valid] hold the states after that many bytes of the previous token */
    long dead = -1;   /* the previous token died at this byte */
    for (size_t i = 0; i < n; i++) {
        const ventry *e = &list[i];
        size_t l = e->lcp;
        if (dead >= 0 && (long)l > dead) continue;
        dead = -1;
        if (e->special && !specials) {
            if (valid > l) valid = l;
            continue;
        }
        size_t d = l < valid ? l : valid;
        const unsigned char *p = (const unsigned char *)bytes + e->off;
        size_t k = d;
        for (; k < e->len; k++) {
            cstate_copy(&st[k + 1], &st[k]);
            if (!cfeed(c, &st[k + 1], p[k])) break;
        }
        if (k < e->len) {
            dead = (long)k;
            valid = k;
            continue;
        }
        valid = e->len;
        c->allowed[e->id] = 1;
    }
}

static bool can_end(const constraint *c) {
    const cstate *s = &c->cur;
    return s->free || (s->json_alive && json_can_end(&s->js));
}

/* The top of the JSON state is a free string value: plain tokens pass. */
static bool in_free_string(const cstate *s) {
    if (s->pre_alive || !s->json_alive || s->js.done || !s->js.depth) return false;
    const jframe *f = &s->js.f[s->js.depth - 1];
    return f->phase == P_STR && f->sub == 0 && f->utf8 == 0 && f->n->max_len == UINT32_MAX;
}

void constraint_mask(constraint *c, float *logits, int n_vocab) {
    if (constraint_idle(c)) return;
    const cvocab *cv = c->cv;
    uint32_t n = cv->n_vocab < (uint32_t)n_vocab ? cv->n_vocab : (uint32_t)n_vocab;
    const cstate *s = &c->cur;
    bool specials = s->pre_alive || s->free;
    if (s->closed) {
        memset(c->allowed, 0, n);
    } else if (s->free) {
        /* Only forbidden strings: a token holding one whole is out; one
         * that may finish a string begun before it is walked - it starts
         * with a byte that takes a partial match two bytes or more. */
        for (uint32_t i = 0; i < n; i++) c->allowed[i] = !cv->opener[i];
        for (int b = 0; b < 256 && !partials_clear(s); b++) {
            bool continues = false;
            for (int k = 0; k < N_FORBID && forbidden(k) && !continues; k++)
                continues = s->partial[k] && match_step(forbidden(k), s->partial[k], (unsigned char)b) >= 2;
            if (continues) {
                for (size_t i = cv->first[b]; i < cv->first[b + 1]; i++) c->allowed[cv->all[i].id] = 0;
                walk(c, cv->all + cv->first[b], cv->first[b + 1] - cv->first[b], specials);
            }
        }
    } else if (in_free_string(s) && partials_clear(s)) {
        for (uint32_t i = 0; i < n; i++) c->allowed[i] = cv->plain[i] && !cv->opener[i];
        walk(c, cv->noplain, cv->n_noplain, specials);
    } else {
        memset(c->allowed, 0, n);
        walk(c, cv->all, cv->n_all, specials);
    }
    bool eos = cv->eos >= 0 && (uint32_t)cv->eos < n && can_end(c);
    bool any = eos;
    for (uint32_t i = 0; i < n && !any; i++) any = c->allowed[i];
    if (!any) eos = true; /* nothing fits (limits): end rather than break the shape */
    if (cv->eos >= 0 && (uint32_t)cv->eos < n) c->allowed[cv->eos] = eos;
    for (uint32_t i = 0; i < n; i++)
        if (!c->allowed[i]) logits[i] = -INFINITY;
    for (int i = (int)n; i < n_vocab; i++) logits[i] = -INFINITY;
}

void constraint_advance(constraint *c, int32_t tok) {
    if (c->off || c->ended) return;
    if (tok == c->cv->eos) {
        c->ended = true;
        return;
    }
    if (tok < 0 || (uint32_t)tok >= c->cv->n_vocab) {
        c->off = true;
        return;
    }
    const unsigned char *p = (const unsigned char *)c->cv->bytes + c->cv->off_of[tok];
    for (uint32_t k = 0; k < c->cv->len_of[tok]; k++)
        if (!cfeed(c, &c->cur, p[k])) {
            c->off = true;
            return;
        }
}
