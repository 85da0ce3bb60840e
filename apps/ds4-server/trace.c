/*
 * trace.c - the human-readable session trace of --trace FILE
 * (as ds4's): per request the header (API, model, stream,
 * tools, thinking, sampling, limits), the raw request JSON, the rendered
 * prompt, the KV reuse decision, and the parsed answer (finish, token
 * counts, reasoning, content, each tool call).  Entries from different
 * threads are written whole, under a lock.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "server.h"

int trace_open(trace_log *t, const char *path, ds4_err *err) {
    pthread_mutex_init(&t->mu, NULL);
    if (!(t->f = fopen(path, "a"))) return ds4_err_set(err, DS4_EIO, "cannot open the trace file %s", path);
    setvbuf(t->f, NULL, _IOLBF, 0);
    return 0;
}

void trace_close(trace_log *t) {
    if (!t->f) return;
    fclose(t->f);
    t->f = NULL;
    pthread_mutex_destroy(&t->mu);
}

static void stamp(FILE *tf) {
    char b[64];
    time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(b, sizeof(b), "%Y-%m-%d %H:%M:%S", &tm);
    fprintf(tf, "[%s] ", b);
}

static const char *think_name(ds4_think_mode m) {
    return m == DS4_THINK_OFF ? "off" : m == DS4_THINK_MAX ? "max" : "high";
}

void trace_request(trace_log *t, const job *j, const char *raw, size_t n) {
    FILE *tf = t->f;
    if (!tf) return;
    const srv_request *r = &j->req;
    pthread_mutex_lock(&t->mu);
    stamp(tf);
    fprintf(tf,
            "=== request %s (%s) model=%s stream=%d tools=%zu think=%s temperature=%g top_p=%g top_k=%d min_p=%g "
            "seed=%llu max_tokens=%u stop=%d include_usage=%d prompt_tokens=%zu\n",
            j->id, j->api->name, r->model, r->stream, r->tools ? json_array_size(r->tools) : 0, think_name(r->think),
            (double)r->sp.temperature, (double)r->sp.top_p, r->sp.top_k, (double)r->sp.min_p,
            (unsigned long long)r->sp.seed, r->max_tokens, r->n_stop, r->include_usage, j->tokens.n);
    fprintf(tf, "--- request json\n%.*s\n--- rendered prompt\n%.*s\n", (int)n, raw, (int)j->rendered.text.len,
            j->rendered.text.p ? j->rendered.text.p : "");
    pthread_mutex_unlock(&t->mu);
}

void trace_decision(trace_log *t, const job *j, const char *what) {
    FILE *tf = t->f;
    if (!tf) return;
    pthread_mutex_lock(&t->mu);
    stamp(tf);
    fprintf(tf, "--- %s: kv reuse %s\n", j->id, what);
    pthread_mutex_unlock(&t->mu);
}

void trace_result(trace_log *t, const job *j) {
    FILE *tf = t->f;
    if (!tf) return;
    const gen_out *o = &j->out;
    pthread_mutex_lock(&t->mu);
    stamp(tf);
    fprintf(tf, "--- %s: finish=%s prompt=%u cached=%u prefilled=%u generated=%u%s%s\n", j->id, o->finish,
            o->prompt_tokens, o->cached_tokens, o->written_tokens, o->completion_tokens, o->error[0] ? " error=" : "",
            o->error);
    fprintf(tf, "--- generated text\n%.*s\n", (int)o->raw.len, o->raw.p ? o->raw.p : "");
    if (o->reasoning.len) fprintf(tf, "--- reasoning\n%.*s\n", (int)o->reasoning.len, o->reasoning.p);
    fprintf(tf, "--- content\n%.*s\n", (int)o->content.len, o->content.p ? o->content.p : "");
    for (size_t i = 0; i < o->n_calls; i++)
        fprintf(tf, "--- tool call %zu id=%s name=%s arguments=%.*s\n", i, o->calls[i].id, o->calls[i].name,
                (int)o->calls[i].args.len, o->calls[i].args.p ? o->calls[i].args.p : "");
    fprintf(tf, "=== end %s\n\n", j->id);
    pthread_mutex_unlock(&t->mu);
}
