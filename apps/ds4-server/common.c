/*
 * common.c - pieces every part of the server uses: jobs (shared between a
 * connection thread and the worker, reference counted), SSE framing,
 * random ids, usage objects, error bodies in each API's shape, logging.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "constrain.h"
#include "server.h"
#include "text/utf8.h"

void srv_log(const char *cat, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-9s %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, cat, msg);
}

int api_fail(api_error *e, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    /* A message cut short must not end inside a character. */
    if (n >= (int)sizeof(e->message)) {
        size_t len = strlen(e->message);
        e->message[len - (size_t)ds4_utf8_incomplete_tail((const uint8_t *)e->message, len)] = '\0';
    }
    e->status = status;
    return -1;
}

json_t *json_utf8(const char *s, size_t n) {
    ds4_strbuf b = {0};
    size_t i = 0;
    while (i < n) {
        size_t v = ds4_utf8_valid_prefix((const uint8_t *)s + i, n - i);
        ds4_strbuf_append(&b, s + i, v);
        i += v;
        if (i < n) {
            ds4_strbuf_puts(&b, "\xEF\xBF\xBD"); /* U+FFFD */
            i += (size_t)ds4_utf8_invalid_len((const uint8_t *)s + i, n - i);
        }
    }
    json_t *j = json_stringn(b.p ? b.p : "", b.len);
    ds4_strbuf_free(&b);
    return j ? j : json_string("");
}

void srv_request_free(srv_request *r) {
    free(r->model);
    json_decref(r->messages);
    json_decref(r->tools);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->force_name);
    free(r->tool_name);
    json_decref(r->response_format);
    jschema_free(r->schema);
    json_decref(r->tool_kinds);
    memset(r, 0, sizeof(*r));
}

/* ---------------------------------------------------------------- jobs */

job *job_new(const api_adapter *api) {
    job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    j->api = api;
    j->refs = 1;
    j->created = (long)time(NULL);
    j->ss.block = -1;
    j->ss.item = -1;
    j->req.logprobs = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    return j;
}

static void gen_out_free(gen_out *o) {
    ds4_strbuf_free(&o->reasoning);
    ds4_strbuf_free(&o->content);
    ds4_strbuf_free(&o->raw);
    for (size_t i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        ds4_strbuf_free(&o->calls[i].args);
    }
    free(o->calls);
    free(o->lp);
}

void cont_req_free(cont_req *c) {
    free(c->ids);
    ds4_tokens_free(&c->tail);
    memset(c, 0, sizeof(*c));
}

void job_unref(job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    srv_request_free(&j->req);
    ds4_rendered_free(&j->rendered);
    ds4_tokens_free(&j->tokens);
    cont_req_free(&j->cont);
    ds4_strbuf_free(&j->sse);
    json_decref(j->body);
    gen_out_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void job_push(job *j, const ds4_strbuf *bytes) {
    if (!bytes->len) return;
    pthread_mutex_lock(&j->mu);
    /* Drop what the connection already sent before growing the buffer. */
    if (j->sse_pos && j->sse_pos == j->sse.len) {
        ds4_strbuf_truncate(&j->sse, 0);
        j->sse_pos = 0;
    }
    ds4_strbuf_append(&j->sse, bytes->p, bytes->len);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void job_finish(job *j, int status, json_t *body) {
    pthread_mutex_lock(&j->mu);
    j->status = status;
    json_decref(j->body);
    j->body = body;
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ----------------------------------------------------------------- SSE */

void sse_data(ds4_strbuf *out, const char *event, json_t *data) {
    char *s = json_dumps(data, JSON_COMPACT);
    if (event) ds4_strbuf_printf(out, "event: %s\n", event);
    ds4_strbuf_puts(out, "data: ");
    ds4_strbuf_puts(out, s ? s : "{}");
    ds4_strbuf_puts(out, "\n\n");
    free(s);
    json_decref(data);
}

void random_id(char *out, size_t cap, const char *prefix, int hex_digits) {
    unsigned char b[32];
    int nb = (hex_digits + 1) / 2;
    if (nb > 32) nb = 32;
    if (getrandom(b, (size_t)nb, 0) != nb) {
        /* getrandom on Linux does not fail for <= 256 bytes once seeded;
         * keep ids unique anyway. */
        static unsigned long counter;
        for (int i = 0; i < nb; i++)
            b[i] = (unsigned char)((unsigned long)time(NULL) * 31 + ++counter * 131 + (unsigned)i);
    }
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (int i = 0; i < hex_digits && n + 1 < cap; i++, n++)
        out[n] = "0123456789abcdef"[(b[i / 2] >> ((i % 2) ? 0 : 4)) & 15];
    out[n < cap ? n : cap - 1] = '\0';
}

/* ------------------------------------------------------------ logprobs */

/* A token's text: its bytes when they are UTF-8, else "bytes:\\xNN..." as
 * OpenAI writes a piece of a character. */
static json_t *token_text(ds4_str t) {
    const uint8_t *p = (const uint8_t *)t.ptr;
    if (ds4_utf8_valid_prefix(p, t.len) == t.len) return json_stringn(t.ptr, t.len);
    ds4_strbuf b = {0};
    ds4_strbuf_puts(&b, "bytes:");
    for (uint64_t i = 0; i < t.len; i++) ds4_strbuf_printf(&b, "\\x%02x", p[i]);
    json_t *j = json_stringn(b.p ? b.p : "", b.len);
    ds4_strbuf_free(&b);
    return j;
}

static json_t *token_bytes(ds4_str t) {
    json_t *a = json_array();
    for (uint64_t i = 0; i < t.len; i++) json_array_append_new(a, json_integer((uint8_t)t.ptr[i]));
    return a;
}

static json_t *entry(const ds4_vocab *v, int32_t id, float lp) {
    ds4_str t = ds4_vocab_token_bytes(v, id);
    return json_pack("{s:o,s:f,s:o}", "token", token_text(t), "logprob", (double)lp, "bytes", token_bytes(t));
}

json_t *logprobs_entries(const gen_out *o, size_t from, size_t to) {
    json_t *a = json_array();
    for (size_t i = from; i < to && i < o->n_lp; i++) {
        const tok_logprob *e = &o->lp[i];
        json_t *x = entry(o->vocab, e->id, e->logprob), *top = json_array();
        for (int k = 0; k < e->n_top; k++) json_array_append_new(top, entry(o->vocab, e->top_id[k], e->top_lp[k]));
        json_object_set_new(x, "top_logprobs", top);
        json_array_append_new(a, x);
    }
    return a;
}

json_t *logprobs_completions(const gen_out *o, size_t from, size_t to, size_t text_offset) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    for (size_t i = from; i < to && i < o->n_lp; i++) {
        const tok_logprob *e = &o->lp[i];
        ds4_str t = ds4_vocab_token_bytes(o->vocab, e->id);
        json_array_append_new(tokens, token_text(t));
        json_array_append_new(lps, json_real(e->logprob));
        json_t *top = json_object();
        for (int k = 0; k < e->n_top; k++) {
            json_t *name = token_text(ds4_vocab_token_bytes(o->vocab, e->top_id[k]));
            json_object_set_new(top, json_string_value(name), json_real(e->top_lp[k]));
            json_decref(name);
        }
        json_array_append_new(tops, top);
        json_array_append_new(offs, json_integer((json_int_t)text_offset));
        text_offset += t.len;
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs", tops, "text_offset",
                     offs);
}

/* --------------------------------------------------------------- usage */

/* An answer that ended because its session could not grow (finish
 * length for want of memory, docs/SERVER.md) says so in its usage. */
static json_t *with_memory_note(json_t *usage, const gen_out *o) {
    if (usage && o->memory_cut) json_object_set_new(usage, "stopped_by_memory", json_true());
    return usage;
}

json_t *usage_openai(const gen_out *o) {
    return with_memory_note(json_pack("{s:i,s:i,s:i,s:{s:i,s:i}}", "prompt_tokens", (json_int_t)o->prompt_tokens,
                                      "completion_tokens", (json_int_t)o->completion_tokens, "total_tokens",
                                      (json_int_t)(o->prompt_tokens + o->completion_tokens), "prompt_tokens_details",
                                      "cached_tokens", (json_int_t)o->cached_tokens, "cache_write_tokens",
                                      (json_int_t)o->written_tokens),
                            o);
}

json_t *usage_responses(const gen_out *o) {
    return with_memory_note(json_pack("{s:i,s:{s:i,s:i},s:i,s:{s:i},s:i}", "input_tokens", (json_int_t)o->prompt_tokens,
                                      "input_tokens_details", "cached_tokens", (json_int_t)o->cached_tokens,
                                      "cache_write_tokens", (json_int_t)o->written_tokens, "output_tokens",
                                      (json_int_t)o->completion_tokens, "output_tokens_details", "reasoning_tokens", 0,
                                      "total_tokens", (json_int_t)(o->prompt_tokens + o->completion_tokens)),
                            o);
}

json_t *usage_anthropic(const gen_out *o) {
    uint32_t other = o->prompt_tokens - o->cached_tokens - o->written_tokens;
    if (o->cached_tokens + o->written_tokens > o->prompt_tokens) other = 0;
    return with_memory_note(json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", (json_int_t)other, "output_tokens",
                                      (json_int_t)o->completion_tokens, "cache_read_input_tokens",
                                      (json_int_t)o->cached_tokens, "cache_creation_input_tokens",
                                      (json_int_t)o->written_tokens),
                            o);
}

/* -------------------------------------------------------------- errors */

static const char *openai_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "server_error";
    default: return "invalid_request_error";
    }
}

static const char *anthropic_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 500: return "api_error";
    case 503: return "overloaded_error";
    default: return "invalid_request_error";
    }
}

json_t *api_error_body(const api_adapter *api, const api_error *e) {
    json_t *err = json_object();
    if (api && api->anthropic_errors) {
        json_object_set_new(err, "type", json_string(e->type ? e->type : anthropic_type(e->status)));
        json_object_set_new(err, "message", json_utf8(e->message, strlen(e->message)));
        if (e->code && strcmp(e->code, "context_length_exceeded") == 0) {
            json_object_set_new(err, "n_prompt_tokens", json_integer(e->n_prompt));
            json_object_set_new(err, "n_ctx", json_integer(e->n_ctx));
        }
        return json_pack("{s:s,s:o}", "type", "error", "error", err);
    }
    json_object_set_new(err, "message", json_utf8(e->message, strlen(e->message)));
    json_object_set_new(err, "type", json_string(e->type ? e->type : openai_type(e->status)));
    json_object_set_new(err, "param", e->param ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    if (e->code && strcmp(e->code, "context_length_exceeded") == 0) {
        json_object_set_new(err, "n_prompt_tokens", json_integer(e->n_prompt));
        json_object_set_new(err, "n_ctx", json_integer(e->n_ctx));
    }
    return json_pack("{s:o}", "error", err);
}
