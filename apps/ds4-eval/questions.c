/*
 * questions.c - question files (eval.h): JSON lines in ds4-eval's schema,
 * or in the field names of the public sets ds4 uses (GPQA Diamond's
 * columns, SuperGPQA's, AIME's), which users download themselves; a .csv
 * file (GPQA's own form) is read by its header row.
 * docs/EVAL.md has the schema; a malformed line is refused naming the
 * file, the line and the field.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "eval.h"
#include "text/strbuf.h"

typedef struct where {
    const char *path;
    size_t line;
    ds4_err *err;
} where;

static int bad(const where *w, const char *field, const char *what) {
    return ds4_err_set(w->err, DS4_EFORMAT, "%s:%zu: field \"%s\" %s", w->path, w->line, field, what);
}

static int get_text(json_t *o, const char *const *names, bool required, bool allow_int, char **out, const where *w);

/* The first of the names that the object has. */
static json_t *get_any(json_t *o, const char *const *names, const char **which) {
    for (size_t i = 0; names[i]; i++) {
        json_t *v = json_object_get(o, names[i]);
        if (v && !json_is_null(v)) {
            *which = names[i];
            return v;
        }
    }
    *which = names[0];
    return NULL;
}

static int get_string(json_t *o, const char *const *names, bool required, char **out, const where *w) {
    return get_text(o, names, required, false, out, w);
}

/* With allow_int, an integer is taken as its decimal text (ids). */
static int get_text(json_t *o, const char *const *names, bool required, bool allow_int, char **out, const where *w) {
    const char *name;
    json_t *v = get_any(o, names, &name);
    *out = NULL;
    if (!v) return required ? bad(w, name, "is missing") : 0;
    if (allow_int && json_is_integer(v)) {
        char buf[32];
        snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v));
        *out = strdup(buf);
    } else if (!json_is_string(v)) {
        return bad(w, name, "must be a string");
    } else {
        *out = strdup(json_string_value(v));
    }
    return *out ? 0 : ds4_err_set(w->err, DS4_ENOMEM, "out of memory");
}

/* A deterministic order of GPQA's four answers from the question's id, so
 * that the correct one is not always first (as GPQA's own evaluations
 * shuffle them). */
static uint32_t fnv(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static int load_choices(json_t *o, eval_question *q, const where *w) {
    static const char *const lists[] = {"choices", "options", NULL};
    const char *name;
    json_t *arr = get_any(o, lists, &name);
    if (arr) {
        if (!json_is_array(arr) || json_array_size(arr) < 2 || json_array_size(arr) > EVAL_MAX_CHOICES)
            return bad(w, name, "must be an array of 2 to 26 strings");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            json_t *c = json_array_get(arr, i);
            if (!json_is_string(c)) return bad(w, name, "must be an array of 2 to 26 strings");
            if (!(q->choices[q->n_choices++] = strdup(json_string_value(c))))
                return ds4_err_set(w->err, DS4_ENOMEM, "out of memory");
        }
        static const char *const letters[] = {"answer_letter", "answer", NULL};
        char *a = NULL;
        if (get_string(o, letters, true, &a, w)) return -1;
        char c;
        int rc = eval_parse_letter(a, strlen(a), q->n_choices, &c);
        free(a);
        if (rc) return bad(w, "answer", "must be the letter of one of the choices");
        q->answer_letter = c;
        return 0;
    }
    /* GPQA's columns: the correct answer and three incorrect ones */
    static const char *const correct[] = {"Correct Answer", NULL};
    char *right = NULL, *wrong[3] = {NULL, NULL, NULL};
    if (get_string(o, correct, true, &right, w)) return -1;
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof(key), "Incorrect Answer %d", i + 1);
        const char *names[] = {key, NULL};
        if (get_string(o, names, true, &wrong[i], w)) {
            free(right);
            for (int k = 0; k < i; k++) free(wrong[k]);
            return -1;
        }
    }
    uint32_t pos = fnv(q->id) % 4;
    for (uint32_t i = 0, k = 0; i < 4; i++) q->choices[i] = i == pos ? right : wrong[k++];
    q->n_choices = 4;
    q->answer_letter = (char)('A' + pos);
    return 0;
}

static int lines_value(json_t *v, eval_lines *out, const char *field, const where *w) {
    memset(out, 0, sizeof(*out));
    if (json_is_integer(v)) {
        out->v[0] = (uint32_t)json_integer_value(v);
        out->n = 1;
        return json_integer_value(v) < 0 ? bad(w, field, "must hold line numbers >= 0") : 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (eval_parse_lines(s, strlen(s), out)) return bad(w, field, "is not a list of line numbers (\"3, 7-9\")");
        return 0;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(w, field, "must be line numbers (an array or \"3, 7-9\")");
    char buf[512];
    size_t o = 0;
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0) return bad(w, field, "must hold line numbers >= 0");
        o += (size_t)snprintf(buf + o, sizeof(buf) - o, "%lld,", (long long)json_integer_value(x));
        if (o >= sizeof(buf)) return bad(w, field, "has too many line numbers");
    }
    if (eval_parse_lines(buf, o, out)) return bad(w, field, "has too many line numbers");
    return 0;
}

static int load_lines(json_t *o, eval_question *q, const where *w) {
    json_t *a = json_object_get(o, "answer"), *acc = json_object_get(o, "accept");
    if (!a) return bad(w, "answer", "is missing");
    size_t extra = json_is_array(acc) ? json_array_size(acc) : 0;
    if (acc && !json_is_null(acc) && !json_is_array(acc)) return bad(w, "accept", "must be an array of line sets");
    if (!(q->accept = calloc(1 + extra, sizeof(eval_lines)))) return ds4_err_set(w->err, DS4_ENOMEM, "out of memory");
    if (lines_value(a, &q->accept[0], "answer", w)) return -1;
    for (size_t i = 0; i < extra; i++)
        if (lines_value(json_array_get(acc, i), &q->accept[1 + i], "accept", w)) return -1;
    q->n_accept = (uint32_t)(1 + extra);
    return 0;
}

static void question_free(eval_question *q) {
    free(q->id);
    free(q->text);
    free(q->code);
    for (uint32_t i = 0; i < q->n_choices; i++) free(q->choices[i]);
    free(q->accept);
    free(q->source);
    free(q->answer_text);
    memset(q, 0, sizeof(*q));
}

static int load_question(json_t *o, eval_question *q, size_t index, const where *w) {
    static const char *const ids[] = {"id", "Record ID", "uuid", "ID", NULL};
    static const char *const texts[] = {"question", "problem", "Question", NULL};
    static const char *const codes[] = {"code", NULL};
    static const char *const sources[] = {"source", NULL};
    if (get_text(o, ids, false, true, &q->id, w) || get_string(o, texts, true, &q->text, w) ||
        get_string(o, codes, false, &q->code, w) || get_string(o, sources, false, &q->source, w))
        return -1;
    if (!q->id) {
        char buf[32];
        snprintf(buf, sizeof(buf), "q%zu", index + 1);
        if (!(q->id = strdup(buf))) return ds4_err_set(w->err, DS4_ENOMEM, "out of memory");
    }
    json_t *kind = json_object_get(o, "kind");
    if (kind && !json_is_string(kind)) return bad(w, "kind", "must be \"choice\", \"integer\" or \"lines\"");
    const char *k = kind ? json_string_value(kind)
                    : json_object_get(o, "choices") || json_object_get(o, "options") ||
                            json_object_get(o, "Correct Answer")
                        ? "choice"
                        : "integer";
    char buf[160];
    if (!strcmp(k, "choice")) {
        q->kind = EVAL_CHOICE;
        if (load_choices(o, q, w)) return -1;
        snprintf(buf, sizeof(buf), "%c", q->answer_letter);
    } else if (!strcmp(k, "integer")) {
        q->kind = EVAL_INTEGER;
        json_t *a = json_object_get(o, "answer");
        if (!a) return bad(w, "answer", "is missing");
        if (json_is_integer(a)) {
            q->answer_int = json_integer_value(a);
        } else if (!json_is_string(a) ||
                   eval_parse_integer(json_string_value(a), strlen(json_string_value(a)), &q->answer_int)) {
            return bad(w, "answer", "must be an integer");
        }
        snprintf(buf, sizeof(buf), "%lld", q->answer_int);
    } else if (!strcmp(k, "lines")) {
        q->kind = EVAL_LINES;
        if (load_lines(o, q, w)) return -1;
        eval_lines_format(&q->accept[0], buf, sizeof(buf));
    } else {
        return bad(w, "kind", "must be \"choice\", \"integer\" or \"lines\"");
    }
    return (q->answer_text = strdup(buf)) ? 0 : ds4_err_set(w->err, DS4_ENOMEM, "out of memory");
}

/* Append the question of one JSON object (the line's, or a CSV record's). */
static int add_question(eval_set *s, json_t *o, const where *w) {
    eval_question *nq = realloc(s->q, (s->n + 1) * sizeof(*nq));
    if (!nq) return ds4_err_set(w->err, DS4_ENOMEM, "out of memory");
    s->q = nq;
    memset(&s->q[s->n], 0, sizeof(eval_question));
    if (load_question(o, &s->q[s->n], s->n, w)) {
        question_free(&s->q[s->n]);
        return -1;
    }
    s->n++;
    return 0;
}

static int load_jsonl(eval_set *s, FILE *f, where *w) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = getline(&line, &cap, f)) >= 0) {
        w->line++;
        size_t a = 0;
        while (a < (size_t)n && (line[a] == ' ' || line[a] == '\t' || line[a] == '\n' || line[a] == '\r')) a++;
        if (a == (size_t)n || line[a] == '#') continue;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)n, 0, &je);
        if (!json_is_object(o))
            rc = ds4_err_set(w->err, DS4_EFORMAT, "%s:%zu: %s", w->path, w->line, o ? "not a JSON object" : je.text);
        else rc = add_question(s, o, w);
        json_decref(o);
    }
    free(line);
    return rc;
}

/* One CSV record (RFC 4180: quoted fields may hold commas, quotes as "",
 * and newlines) into fields; *line advances over its lines.  0 at the end
 * of the file, 1 for a record, -1 on an unterminated quote. */
static int csv_record(FILE *f, json_t *fields, size_t *line) {
    ds4_strbuf cur = {0};
    bool quoted = false, any = false;
    int c;
    json_array_clear(fields);
    while ((c = fgetc(f)) != EOF) {
        any = true;
        if (quoted) {
            if (c == '"') {
                int d = fgetc(f);
                if (d == '"') ds4_strbuf_putc(&cur, '"');
                else {
                    quoted = false;
                    if (d != EOF) ungetc(d, f);
                }
            } else {
                if (c == '\n') (*line)++;
                ds4_strbuf_putc(&cur, (char)c);
            }
        } else if (c == '"') {
            quoted = true;
        } else if (c == ',') {
            json_array_append_new(fields, json_stringn(cur.p ? cur.p : "", cur.len));
            ds4_strbuf_truncate(&cur, 0);
        } else if (c == '\n') {
            (*line)++;
            break;
        } else if (c != '\r') {
            ds4_strbuf_putc(&cur, (char)c);
        }
    }
    if (any) json_array_append_new(fields, json_stringn(cur.p ? cur.p : "", cur.len));
    ds4_strbuf_free(&cur);
    if (quoted) return -1;
    return any ? 1 : 0;
}

/* A CSV file with a header row (GPQA's): each record an object of the
 * header's names. */
static int load_csv(eval_set *s, FILE *f, where *w) {
    json_t *head = json_array(), *rec = json_array();
    size_t next = 1;
    int rc = csv_record(f, head, &next) == 1 ? 0 : ds4_err_set(w->err, DS4_EFORMAT, "%s: no header row", w->path);
    while (rc == 0) {
        w->line = next;
        int r = csv_record(f, rec, &next);
        if (r == 0) break;
        if (r < 0) {
            rc = ds4_err_set(w->err, DS4_EFORMAT, "%s:%zu: a quoted field is not closed", w->path, w->line);
            break;
        }
        if (json_array_size(rec) == 1 && !*json_string_value(json_array_get(rec, 0))) continue; /* a blank line */
        if (json_array_size(rec) != json_array_size(head)) {
            rc = ds4_err_set(w->err, DS4_EFORMAT, "%s:%zu: %zu fields, the header has %zu", w->path, w->line,
                             json_array_size(rec), json_array_size(head));
            break;
        }
        json_t *o = json_object();
        for (size_t i = 0; i < json_array_size(head); i++)
            json_object_set(o, json_string_value(json_array_get(head, i)), json_array_get(rec, i));
        rc = add_question(s, o, w);
        json_decref(o);
    }
    json_decref(head);
    json_decref(rec);
    return rc;
}

int eval_set_load(eval_set *s, const char *path, ds4_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
    where w = {path, 0, err};
    size_t n = strlen(path);
    int rc = n > 4 && !strcasecmp(path + n - 4, ".csv") ? load_csv(s, f, &w) : load_jsonl(s, f, &w);
    fclose(f);
    if (rc == 0 && s->n == 0) rc = ds4_err_set(err, DS4_EFORMAT, "%s: no questions", path);
    return rc;
}

void eval_set_free(eval_set *s) {
    for (size_t i = 0; i < s->n; i++) question_free(&s->q[i]);
    free(s->q);
    memset(s, 0, sizeof(*s));
}

char *eval_prompt(const eval_question *q) {
    ds4_strbuf b = {0};
    ds4_strbuf_printf(&b, "%s\n", q->text);
    switch (q->kind) {
    case EVAL_CHOICE:
        ds4_strbuf_append(&b, "\n", 1);
        for (uint32_t i = 0; i < q->n_choices; i++) ds4_strbuf_printf(&b, "%c) %s\n", 'A' + i, q->choices[i]);
        ds4_strbuf_printf(&b, "\nGive your final answer on its own line as \"Answer: X\", where X is the letter of "
                              "the correct choice.");
        break;
    case EVAL_INTEGER:
        ds4_strbuf_printf(&b, "\nGive your final answer on its own line as \"Answer: N\", where N is an integer.");
        break;
    case EVAL_LINES:
        if (q->code) {
            ds4_strbuf_printf(&b, "\n```\n");
            uint32_t no = 1;
            for (const char *p = q->code; *p; no++) {
                const char *e = strchr(p, '\n');
                size_t len = e ? (size_t)(e - p) : strlen(p);
                ds4_strbuf_printf(&b, "%3u | %.*s\n", no, (int)len, p);
                p += len + (e ? 1 : 0);
            }
            ds4_strbuf_printf(&b, "```\n");
        }
        ds4_strbuf_printf(&b, "\nGive your final answer on its own line as \"Answer: L\", where L lists the line "
                              "numbers (for example \"Answer: 12, 15-17\"), or \"Answer: 0\" when there is none.");
        break;
    }
    char *out = ds4_strbuf_take(&b, NULL);
    return out ? out : strdup("");
}
