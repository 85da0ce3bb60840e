/*
 * report.c - the final report (eval.h): a table per question and the
 * totals, the same as JSON (format ds4-eval-report-v1, docs/EVAL.md), and
 * --compare of two such files.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

static const char *kind_name(eval_kind k) {
    return k == EVAL_CHOICE ? "choice" : k == EVAL_INTEGER ? "integer" : "lines";
}

typedef struct totals {
    uint32_t n[EVAL_STOPPED + 1];
    uint64_t prompt_tokens, gen_tokens;
} totals;

static totals count(const eval_set *s, const eval_result *r) {
    totals t;
    memset(&t, 0, sizeof(t));
    for (size_t i = 0; i < s->n; i++) {
        t.n[r[i].status]++;
        t.prompt_tokens += r[i].prompt_tokens;
        t.gen_tokens += r[i].gen_tokens;
    }
    return t;
}

void eval_report_print(FILE *out, const eval_set *s, const eval_result *r) {
    fprintf(out, "%-24s %-8s %-8s %7s %7s  %-16s %s\n", "question", "kind", "result", "prompt", "gen", "answer",
            "correct");
    for (size_t i = 0; i < s->n; i++) {
        const eval_question *q = &s->q[i];
        fprintf(out, "%-24.24s %-8s %-8s %7u %7u  %-16.16s %s\n", q->id, kind_name(q->kind),
                eval_status_name(r[i].status), r[i].prompt_tokens, r[i].gen_tokens,
                r[i].status == EVAL_SKIPPED ? "-" : r[i].got, q->answer_text);
        if (r[i].status == EVAL_SKIPPED) fprintf(out, "%24s skipped: %s\n", "", r[i].why);
    }
    totals t = count(s, r);
    uint32_t graded = t.n[EVAL_PASSED] + t.n[EVAL_FAILED];
    fprintf(out, "total: %u/%u passed (%.1f%% of %u graded)", t.n[EVAL_PASSED], (unsigned)s->n,
            graded ? 100.0 * t.n[EVAL_PASSED] / graded : 0.0, graded);
    if (t.n[EVAL_SKIPPED]) fprintf(out, ", %u skipped", t.n[EVAL_SKIPPED]);
    if (t.n[EVAL_STOPPED]) fprintf(out, ", %u stopped", t.n[EVAL_STOPPED]);
    uint32_t pending = t.n[EVAL_PENDING] + t.n[EVAL_PREFILL] + t.n[EVAL_THINKING] + t.n[EVAL_ANSWERING];
    if (pending) fprintf(out, ", %u not run", pending);
    fprintf(out, "; %llu prompt tokens, %llu generated\n", (unsigned long long)t.prompt_tokens,
            (unsigned long long)t.gen_tokens);
}

int eval_report_json(const char *path, const eval_set *s, const eval_result *r, const char *model, ds4_err *err) {
    json_t *qs = json_array();
    for (size_t i = 0; i < s->n; i++) {
        const eval_question *q = &s->q[i];
        json_array_append_new(qs,
                              json_pack("{s:s,s:s,s:s,s:i,s:i,s:s,s:s,s:s,s:f}", "id", q->id, "kind",
                                        kind_name(q->kind), "result", eval_status_name(r[i].status), "prompt_tokens",
                                        (int)r[i].prompt_tokens, "gen_tokens", (int)r[i].gen_tokens, "answer", r[i].got,
                                        "correct", q->answer_text, "why", r[i].why, "seconds", r[i].seconds));
    }
    totals t = count(s, r);
    json_t *tot = json_pack("{s:i,s:i,s:i,s:i,s:i,s:I,s:I}", "questions", (int)s->n, "passed", (int)t.n[EVAL_PASSED],
                            "failed", (int)t.n[EVAL_FAILED], "skipped", (int)t.n[EVAL_SKIPPED], "stopped",
                            (int)t.n[EVAL_STOPPED], "prompt_tokens", (json_int_t)t.prompt_tokens, "gen_tokens",
                            (json_int_t)t.gen_tokens);
    json_t *j = json_pack("{s:s,s:s,s:o,s:o}", "format", "ds4-eval-report-v1", "model", model ? model : "", "questions",
                          qs, "totals", tot);
    int rc = json_dump_file(j, path, JSON_INDENT(1)) == 0 ? 0 : ds4_err_set(err, DS4_EIO, "cannot write %s", path);
    json_decref(j);
    return rc;
}

/* A report file's questions (array), checked. */
static json_t *load_report(const char *path, ds4_err *err) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        ds4_err_set(err, DS4_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
        return NULL;
    }
    json_t *f = json_object_get(j, "format"), *qs = json_object_get(j, "questions");
    if (!json_is_string(f) || strcmp(json_string_value(f), "ds4-eval-report-v1") || !json_is_array(qs)) {
        ds4_err_set(err, DS4_EFORMAT, "%s: not a ds4-eval report (format ds4-eval-report-v1)", path);
        json_decref(j);
        return NULL;
    }
    size_t i;
    json_t *q;
    json_array_foreach(qs, i, q) {
        if (!json_is_string(json_object_get(q, "id")) || !json_is_string(json_object_get(q, "result"))) {
            ds4_err_set(err, DS4_EFORMAT, "%s: question %zu has no \"id\" or \"result\"", path, i + 1);
            json_decref(j);
            return NULL;
        }
    }
    return j;
}

static const char *result_of(json_t *qs, const char *id, json_t **q_out) {
    size_t i;
    json_t *q;
    json_array_foreach(qs, i, q) {
        if (!strcmp(json_string_value(json_object_get(q, "id")), id)) {
            *q_out = q;
            return json_string_value(json_object_get(q, "result"));
        }
    }
    return NULL;
}

static uint32_t passed(json_t *qs) {
    uint32_t n = 0;
    size_t i;
    json_t *q;
    json_array_foreach(qs, i, q) n += !strcmp(json_string_value(json_object_get(q, "result")), "passed");
    return n;
}

static const char *str_or(json_t *q, const char *key) {
    json_t *v = json_object_get(q, key);
    return json_is_string(v) ? json_string_value(v) : "";
}

int eval_compare(const char *a, const char *b, FILE *out, ds4_err *err) {
    json_t *ja = load_report(a, err), *jb = ja ? load_report(b, err) : NULL;
    if (!ja || !jb) {
        json_decref(ja);
        return 1;
    }
    json_t *qa = json_object_get(ja, "questions"), *qb = json_object_get(jb, "questions");
    uint32_t lost = 0, gained = 0, other = 0, only = 0;
    size_t i;
    json_t *q;
    json_array_foreach(qa, i, q) {
        const char *id = json_string_value(json_object_get(q, "id")), *ra = str_or(q, "result");
        json_t *p = NULL;
        const char *rb = result_of(qb, id, &p);
        if (!rb) {
            fprintf(out, "only in A:        %s (%s)\n", id, ra);
            only++;
            continue;
        }
        if (!strcmp(ra, rb)) continue;
        bool pa = !strcmp(ra, "passed"), pb = !strcmp(rb, "passed");
        const char *tag = pa && !pb ? "passed -> failed" : !pa && pb ? "failed -> passed" : "changed";
        if (pa && !pb) lost++;
        else if (!pa && pb) gained++;
        else other++;
        fprintf(out, "%-17s %s: %s -> %s (answer %s -> %s, correct %s)\n", tag, id, ra, rb, str_or(q, "answer"),
                str_or(p, "answer"), str_or(q, "correct"));
    }
    json_array_foreach(qb, i, q) {
        json_t *p = NULL;
        const char *id = json_string_value(json_object_get(q, "id"));
        if (!result_of(qa, id, &p)) {
            fprintf(out, "only in B:        %s (%s)\n", id, str_or(q, "result"));
            only++;
        }
    }
    fprintf(out, "A %s: %u/%zu passed; B %s: %u/%zu passed; %u lost, %u gained, %u otherwise changed, %u in one only\n",
            a, passed(qa), json_array_size(qa), b, passed(qb), json_array_size(qb), lost, gained, other, only);
    json_decref(ja);
    json_decref(jb);
    return 0;
}
