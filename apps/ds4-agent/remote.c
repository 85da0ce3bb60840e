/*
 * remote.c - the model on a ds4-server (--server URL; see agent.h).
 *
 * For a laptop that talks to the GPU machine: the same turn loop, tools,
 * compaction and sessions, but every round is one streamed request to the
 * server's OpenAI Chat Completions API (default) or Anthropic Messages API
 * (--api anthropic).  The transcript here is the message list the request
 * carries; the server turns it into tokens with the same chat renderer the
 * local model uses, and keeps its own live KV and disk cache, so each round
 * prefills only what is new there too.  Token counts come from the usage
 * the server reports; a tool result not yet sent is estimated at one token
 * per 3 bytes (DeepSeek's tokenizer averages more bytes than that, so the
 * estimate errs on the side of compacting early).
 *
 * Sessions are JSON files in the session directory (<sha1>.json: the
 * system prompt, the messages and their token count); /switch sends the
 * conversation again and the server finds its KV in its caches if it
 * still has it.
 *
 * HTTP is libcurl: streaming, TLS for https:// URLs, and the transfer is
 * aborted at once when the user interrupts.
 */
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

#include "agent.h"
#include "engine/generate.h"
#include "engine/kvcache.h"

#define BYTES_PER_TOKEN 3
#define SESSION_FORMAT  "ds4-agent-remote-session"

typedef struct remote {
    agent_model base;
    const agent_opts *o;
    const agent_hooks *h;
    agent_link *l;
    display *d;
    FILE *trace;
    char *url;     /* base, no trailing slash */
    char *system;  /* the instructions */
    json_t *tools; /* OpenAI function tools */
    json_t *msgs;  /* the conversation, OpenAI-style, system excluded */
    char *summary; /* compaction summary, appended to the system text */
    uint32_t ctx;
    uint32_t used; /* last reported, plus estimates since */
    char *dir;
    CURL *curl;
} remote;

static remote *R_(agent_model *m) { return (remote *)m; }

static uint32_t estimate(size_t bytes) { return (uint32_t)(bytes / BYTES_PER_TOKEN) + 4; }

/* ------------------------------------------------------------ http */

typedef struct http_call {
    remote *r;
    ds4_strbuf body; /* non-streaming answer, or an error body */
    ds4_strbuf line; /* SSE: the line being assembled */
    char event[64];  /* SSE: the current event name */
    bool stream;
    bool status_known;
    long status;
    void (*on_data)(void *ctx, const char *event, json_t *data);
    void *ctx;
} http_call;

static void sse_line(http_call *c, const char *s, size_t n) {
    if (n == 0) {
        c->event[0] = 0;
        return;
    }
    if (n > 6 && !strncmp(s, "event:", 6)) {
        size_t k = 6 + (s[6] == ' ');
        snprintf(c->event, sizeof(c->event), "%.*s", (int)(n - k), s + k);
        return;
    }
    if (n < 5 || strncmp(s, "data:", 5)) return;
    size_t k = 5 + (s[5] == ' ');
    if (n - k == 6 && !strncmp(s + k, "[DONE]", 6)) return;
    json_t *j = json_loadb(s + k, n - k, 0, NULL);
    if (j) {
        c->on_data(c->ctx, c->event, j);
        json_decref(j);
    }
}

static size_t on_write(char *p, size_t sz, size_t nm, void *ud) {
    http_call *c = ud;
    size_t n = sz * nm;
    if (!c->status_known) {
        curl_easy_getinfo(c->r->curl, CURLINFO_RESPONSE_CODE, &c->status);
        c->status_known = true;
    }
    if (!c->stream || c->status != 200) {
        if (c->body.len < (8u << 20)) ds4_strbuf_append(&c->body, p, n);
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\n') {
            size_t l = c->line.len;
            if (l && c->line.p[l - 1] == '\r') l--;
            sse_line(c, c->line.p ? c->line.p : "", l);
            ds4_strbuf_truncate(&c->line, 0);
        } else {
            ds4_strbuf_putc(&c->line, p[i]);
        }
    }
    return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un) {
    (void)dt, (void)dn, (void)ut, (void)un;
    http_call *c = ud;
    return link_interrupted(c->r->l) ? 1 : 0;
}

/* The server's error message from an error body, else the status. */
static void http_error(http_call *c, ds4_err *err) {
    json_t *j = json_loadb(c->body.p ? c->body.p : "", c->body.len, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    ds4_err_set(err, DS4_EIO, "%s: HTTP %ld%s%s", c->r->url, c->status, msg ? ": " : "", msg ? msg : "");
    json_decref(j);
}

/* GET or POST (body != NULL) to path; the answer streams into on_data when
 * stream is set, else lands in c->body. */
static int http(remote *r, const char *path, const json_t *body, bool stream, http_call *c, ds4_err *err) {
    char url[1200];
    snprintf(url, sizeof(url), "%s%s", r->url, path);
    char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !payload) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    CURL *h = r->curl;
    curl_easy_reset(h);
    struct curl_slist *hdr = NULL;
    hdr = curl_slist_append(hdr, "Content-Type: application/json");
    if (stream) hdr = curl_slist_append(hdr, "Accept: text/event-stream");
    char line[600];
    if (r->o->api_key) {
        snprintf(line, sizeof(line), "Authorization: Bearer %s", r->o->api_key);
        hdr = curl_slist_append(hdr, line);
        snprintf(line, sizeof(line), "x-api-key: %s", r->o->api_key);
        hdr = curl_slist_append(hdr, line);
    }
    if (r->o->api == AGENT_API_ANTHROPIC) hdr = curl_slist_append(hdr, "anthropic-version: 2023-06-01");
    const char *forced = stream && r->h && r->h->script_next ? r->h->script_next(r->h->script_ctx) : NULL;
    if (forced) {
        snprintf(line, sizeof(line), "X-DS4-Test-Output: %s", forced);
        hdr = curl_slist_append(hdr, line);
    }
    c->r = r;
    c->stream = stream;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    if (payload) curl_easy_setopt(h, CURLOPT_POSTFIELDS, payload);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (r->trace)
        trace_line(r->trace, "http %s %s (%zu bytes)", payload ? "POST" : "GET", url, payload ? strlen(payload) : 0);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
    curl_slist_free_all(hdr);
    free(payload);
    if (rc == CURLE_ABORTED_BY_CALLBACK) return ds4_err_set(err, DS4_EINTERRUPTED, "interrupted");
    if (rc != CURLE_OK) return ds4_err_set(err, DS4_EIO, "%s: %s", url, curl_easy_strerror(rc));
    if (c->status != 200) {
        http_error(c, err);
        return -1;
    }
    return 0;
}

static void call_free(http_call *c) {
    ds4_strbuf_free(&c->body);
    ds4_strbuf_free(&c->line);
}

/* ------------------------------------------------------------ requests */

static char *system_text(remote *r) {
    ds4_strbuf b = {0};
    ds4_strbuf_puts(&b, r->system);
    if (r->summary) {
        ds4_strbuf_puts(&b, "\n\n[ds4-agent: the earlier part of this conversation was compacted to save context. "
                            "Summary of it:]\n");
        ds4_strbuf_puts(&b, r->summary);
        ds4_strbuf_puts(&b, "\n[End of the summary. The most recent part of the conversation follows verbatim.]");
    }
    return ds4_strbuf_take(&b, NULL);
}

/* Anthropic form of the conversation: content blocks, tool results in
 * user messages. */
static json_t *anthropic_messages(const json_t *msgs) {
    json_t *out = json_array();
    json_t *cur = NULL; /* the user message being built */
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *content = json_object_get(m, "content");
        if (!strcmp(role, "assistant")) {
            cur = NULL;
            json_t *blocks = json_array();
            const json_t *rc = json_object_get(m, "reasoning_content");
            if (json_string_length(rc))
                json_array_append_new(blocks,
                                      json_pack("{s:s,s:O,s:s}", "type", "thinking", "thinking", rc, "signature", ""));
            if (json_string_length(content))
                json_array_append_new(blocks, json_pack("{s:s,s:O}", "type", "text", "text", content));
            const json_t *calls = json_object_get(m, "tool_calls");
            for (size_t k = 0; k < json_array_size(calls); k++) {
                const json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
                json_t *input = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
                json_array_append_new(blocks, json_pack("{s:s,s:O,s:O,s:o}", "type", "tool_use", "id",
                                                        json_object_get(c, "id"), "name", json_object_get(fn, "name"),
                                                        "input", input ? input : json_object()));
            }
            if (!json_array_size(blocks))
                json_array_append_new(blocks, json_pack("{s:s,s:s}", "type", "text", "text", ""));
            json_array_append_new(out, json_pack("{s:s,s:o}", "role", "assistant", "content", blocks));
            continue;
        }
        if (!cur) {
            cur = json_pack("{s:s,s:[]}", "role", "user", "content");
            json_array_append_new(out, cur);
        }
        json_t *blocks = json_object_get(cur, "content");
        if (!strcmp(role, "tool"))
            json_array_append_new(blocks, json_pack("{s:s,s:O,s:O}", "type", "tool_result", "tool_use_id",
                                                    json_object_get(m, "tool_call_id"), "content", content));
        else json_array_append_new(blocks, json_pack("{s:s,s:O}", "type", "text", "text", content));
    }
    return out;
}

static json_t *anthropic_tools(const json_t *tools) {
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *fn = json_object_get(json_array_get(tools, i), "function");
        json_array_append_new(out, json_pack("{s:O,s:O,s:O}", "name", json_object_get(fn, "name"), "description",
                                             json_object_get(fn, "description"), "input_schema",
                                             json_object_get(fn, "parameters")));
    }
    return out;
}

/* The request body for msgs (plus an extra user message for compaction). */
static json_t *request(remote *r, const json_t *msgs, bool think, uint32_t max_tokens, bool greedy) {
    char *sys = system_text(r);
    json_t *b;
    if (r->o->api == AGENT_API_ANTHROPIC) {
        b = json_pack("{s:s,s:s,s:o,s:o,s:b,s:i}", "model", "deepseek-v4-flash", "system", sys ? sys : "", "messages",
                      anthropic_messages(msgs), "tools", anthropic_tools(r->tools), "stream", 1, "max_tokens",
                      (json_int_t)max_tokens);
        json_object_set_new(b, "thinking", json_pack("{s:s}", "type", think ? "enabled" : "disabled"));
        if (think && r->o->think == DS4_THINK_MAX)
            json_object_set_new(b, "output_config", json_pack("{s:s}", "effort", "max"));
    } else {
        json_t *all = json_array();
        json_array_append_new(all, json_pack("{s:s,s:s}", "role", "system", "content", sys ? sys : ""));
        json_array_extend(all, (json_t *)msgs);
        b = json_pack("{s:s,s:o,s:O,s:b,s:i,s:{s:b}}", "model", "deepseek-v4-flash", "messages", all, "tools", r->tools,
                      "stream", 1, "max_tokens", (json_int_t)max_tokens, "stream_options", "include_usage", 1);
        json_object_set_new(b, "thinking", json_boolean(think));
        if (think && r->o->think == DS4_THINK_MAX) json_object_set_new(b, "reasoning_effort", json_string("max"));
    }
    free(sys);
    json_object_set_new(b, "temperature", json_real(greedy ? 0.0 : r->o->sampling.temperature));
    if (!greedy) {
        json_object_set_new(b, "top_p", json_real(r->o->sampling.top_p));
        json_object_set_new(b, "min_p", json_real(r->o->sampling.min_p));
        if (r->o->sampling.top_k) json_object_set_new(b, "top_k", json_integer(r->o->sampling.top_k));
        if (r->o->sampling.seed) json_object_set_new(b, "seed", json_integer((json_int_t)r->o->sampling.seed));
    }
    return b;
}

/* ------------------------------------------------------------ a round */

typedef struct stream_state {
    remote *r;
    const gen_hooks *h;
    ds4_strbuf reasoning, content;
    json_t *calls; /* [{"id","name","args" strbuf as string}] built as they come */
    ds4_strbuf args[64];
    char ids[64][64], names[64][64];
    int n_calls;
    bool think_done, any;
    const char *finish; /* "stop", "length", "tool_calls" */
    char error[300];
    uint32_t prompt, completion;
    uint32_t generated;
    double t0;
    int block_kind[128]; /* anthropic: what each content block is */
    int block_call[128];
} stream_state;

enum { BK_TEXT, BK_THINK, BK_TOOL };

static void emit(stream_state *s, ds4_dsml_event_kind k, int index, const char *t, size_t n) {
    ds4_dsml_event ev = {.kind = k, .index = index, .text = t, .len = n};
    if (s->h && s->h->event) s->h->event(s->h->ctx, &ev);
}

static void count(stream_state *s) {
    s->generated++;
    double dt = ds4_now() - s->t0;
    if (s->h && s->h->generated) s->h->generated(s->h->ctx, s->generated, dt > 0 ? s->generated / dt : 0);
}

static void got_reasoning(stream_state *s, const char *t, size_t n) {
    if (!n) return;
    ds4_strbuf_append(&s->reasoning, t, n);
    emit(s, DS4_DSML_REASONING, 0, t, n);
    count(s);
}

static void got_content(stream_state *s, const char *t, size_t n) {
    if (!n) return;
    if (!s->think_done && s->reasoning.len) emit(s, DS4_DSML_THINK_END, 0, "", 0);
    s->think_done = true;
    ds4_strbuf_append(&s->content, t, n);
    emit(s, DS4_DSML_CONTENT, 0, t, n);
    count(s);
}

static int got_call(stream_state *s, int index, const char *id, const char *name) {
    if (index < 0 || index >= 64) return -1;
    while (s->n_calls <= index) {
        s->ids[s->n_calls][0] = s->names[s->n_calls][0] = 0;
        s->n_calls++;
    }
    if (id) snprintf(s->ids[index], sizeof(s->ids[index]), "%s", id);
    if (name && !s->names[index][0]) {
        snprintf(s->names[index], sizeof(s->names[index]), "%s", name);
        if (!s->think_done && s->reasoning.len) emit(s, DS4_DSML_THINK_END, 0, "", 0);
        s->think_done = true;
        emit(s, DS4_DSML_CALL_START, index, name, strlen(name));
    }
    return 0;
}

static void got_args(stream_state *s, int index, const char *t, size_t n) {
    if (index < 0 || index >= s->n_calls || !n) return;
    ds4_strbuf_append(&s->args[index], t, n);
    emit(s, DS4_DSML_CALL_ARGS, index, t, n);
    count(s);
}

static void on_openai(void *ctx, const char *event, json_t *d) {
    (void)event;
    stream_state *s = ctx;
    const json_t *err = json_object_get(d, "error");
    if (err)
        snprintf(s->error, sizeof(s->error), "%s",
                 json_string_value(json_object_get(err, "message")) ?: "server error");
    const json_t *usage = json_object_get(d, "usage");
    if (json_is_object(usage)) {
        s->prompt = (uint32_t)json_integer_value(json_object_get(usage, "prompt_tokens"));
        s->completion = (uint32_t)json_integer_value(json_object_get(usage, "completion_tokens"));
    }
    const json_t *ch = json_array_get(json_object_get(d, "choices"), 0);
    if (!ch) return;
    const json_t *delta = json_object_get(ch, "delta");
    const json_t *rc = json_object_get(delta, "reasoning_content"), *c = json_object_get(delta, "content");
    if (json_is_string(rc)) got_reasoning(s, json_string_value(rc), json_string_length(rc));
    if (json_is_string(c)) got_content(s, json_string_value(c), json_string_length(c));
    const json_t *calls = json_object_get(delta, "tool_calls");
    for (size_t k = 0; k < json_array_size(calls); k++) {
        const json_t *tc = json_array_get(calls, k), *fn = json_object_get(tc, "function");
        int index = (int)json_integer_value(json_object_get(tc, "index"));
        if (got_call(s, index, json_string_value(json_object_get(tc, "id")),
                     json_string_value(json_object_get(fn, "name"))))
            continue;
        const json_t *a = json_object_get(fn, "arguments");
        if (json_is_string(a)) got_args(s, index, json_string_value(a), json_string_length(a));
    }
    const char *fin = json_string_value(json_object_get(ch, "finish_reason"));
    if (fin) s->finish = !strcmp(fin, "tool_calls") ? "tool_calls" : !strcmp(fin, "length") ? "length" : "stop";
}

static void on_anthropic(void *ctx, const char *event, json_t *d) {
    stream_state *s = ctx;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) type = event;
    if (!strcmp(type, "error")) {
        snprintf(s->error, sizeof(s->error), "%s",
                 json_string_value(json_object_get(json_object_get(d, "error"), "message")) ?: "server error");
    } else if (!strcmp(type, "message_start")) {
        const json_t *u = json_object_get(json_object_get(d, "message"), "usage");
        s->prompt = (uint32_t)(json_integer_value(json_object_get(u, "input_tokens")) +
                               json_integer_value(json_object_get(u, "cache_read_input_tokens")) +
                               json_integer_value(json_object_get(u, "cache_creation_input_tokens")));
    } else if (!strcmp(type, "content_block_start")) {
        int bi = (int)json_integer_value(json_object_get(d, "index"));
        const json_t *cb = json_object_get(d, "content_block");
        const char *bt = json_string_value(json_object_get(cb, "type"));
        if (bi < 0 || bi >= 128 || !bt) return;
        s->block_kind[bi] = !strcmp(bt, "thinking") ? BK_THINK : !strcmp(bt, "tool_use") ? BK_TOOL : BK_TEXT;
        if (s->block_kind[bi] == BK_TOOL) {
            s->block_call[bi] = s->n_calls;
            got_call(s, s->n_calls, json_string_value(json_object_get(cb, "id")),
                     json_string_value(json_object_get(cb, "name")));
        }
    } else if (!strcmp(type, "content_block_delta")) {
        int bi = (int)json_integer_value(json_object_get(d, "index"));
        const json_t *dl = json_object_get(d, "delta");
        const char *dt = json_string_value(json_object_get(dl, "type"));
        if (bi < 0 || bi >= 128 || !dt) return;
        const json_t *v;
        if (!strcmp(dt, "thinking_delta") && (v = json_object_get(dl, "thinking")))
            got_reasoning(s, json_string_value(v), json_string_length(v));
        else if (!strcmp(dt, "text_delta") && (v = json_object_get(dl, "text")))
            got_content(s, json_string_value(v), json_string_length(v));
        else if (!strcmp(dt, "input_json_delta") && (v = json_object_get(dl, "partial_json")) &&
                 s->block_kind[bi] == BK_TOOL)
            got_args(s, s->block_call[bi], json_string_value(v), json_string_length(v));
    } else if (!strcmp(type, "message_delta")) {
        const char *sr = json_string_value(json_object_get(json_object_get(d, "delta"), "stop_reason"));
        if (sr) s->finish = !strcmp(sr, "tool_use") ? "tool_calls" : !strcmp(sr, "max_tokens") ? "length" : "stop";
        const json_t *u = json_object_get(d, "usage");
        if (u) s->completion = (uint32_t)json_integer_value(json_object_get(u, "output_tokens"));
    }
}

static void stream_free(stream_state *s) {
    ds4_strbuf_free(&s->reasoning);
    ds4_strbuf_free(&s->content);
    for (int i = 0; i < 64; i++) ds4_strbuf_free(&s->args[i]);
}

static const char *api_path(const remote *r) {
    return r->o->api == AGENT_API_ANTHROPIC ? "/v1/messages" : "/v1/chat/completions";
}

/* One streamed request for msgs; the state holds what came back. */
static int stream_request(remote *r, const json_t *msgs, bool think, uint32_t max_tokens, bool greedy,
                          const gen_hooks *h, stream_state *s, ds4_err *err) {
    memset(s, 0, sizeof(*s));
    s->r = r;
    s->h = h;
    s->t0 = ds4_now();
    json_t *body = request(r, msgs, think, max_tokens, greedy);
    if (!body) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    http_call c = {.on_data = r->o->api == AGENT_API_ANTHROPIC ? on_anthropic : on_openai, .ctx = s};
    link_update(r->l, link_status(r->l).state == ST_COMPACTING ? ST_COMPACTING : ST_GENERATING, 0, 0);
    int rc = http(r, api_path(r), body, true, &c, err);
    json_decref(body);
    call_free(&c);
    if (rc == 0 && s->error[0]) rc = ds4_err_set(err, DS4_EIO, "%s: %s", r->url, s->error);
    if (s->prompt || s->completion) r->used = s->prompt + s->completion;
    return rc;
}

static uint32_t m_ctx(agent_model *m) { return R_(m)->ctx; }
static uint32_t m_used(agent_model *m) { return R_(m)->used; }
static bool m_has_user(agent_model *m) { return json_array_size(R_(m)->msgs) > 0; }
static uint64_t m_prefilled(agent_model *m) {
    (void)m;
    return 0;
}

static uint32_t base_tokens(remote *r) {
    char *t = json_dumps(r->tools, JSON_COMPACT);
    uint32_t n = estimate(strlen(r->system) + (t ? strlen(t) : 0) + (r->summary ? strlen(r->summary) : 0));
    free(t);
    return n;
}

static int m_reset(agent_model *m, ds4_err *err) {
    (void)err;
    remote *r = R_(m);
    json_array_clear(r->msgs);
    free(r->summary);
    r->summary = NULL;
    r->used = base_tokens(r);
    link_set_ctx(r->l, r->used, r->ctx);
    return 0;
}

static int m_add_user(agent_model *m, const char *text, ds4_err *err) {
    remote *r = R_(m);
    /* text after tool results joins their turn in the server's rendering */
    if (json_array_append_new(r->msgs, json_pack("{s:s,s:s}", "role", "user", "content", text)) != 0)
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    r->used += estimate(strlen(text));
    return 0;
}

/* The ids of the last assistant message's calls, for the results. */
static const json_t *last_calls(remote *r) {
    for (size_t i = json_array_size(r->msgs); i > 0; i--) {
        const json_t *m = json_array_get(r->msgs, i - 1);
        if (!strcmp(json_string_value(json_object_get(m, "role")), "assistant"))
            return json_object_get(m, "tool_calls");
    }
    return NULL;
}

static int m_add_results(agent_model *m, const json_t *results, ds4_err *err) {
    remote *r = R_(m);
    const json_t *calls = last_calls(r);
    for (size_t i = 0; i < json_array_size(results); i++) {
        const char *id = json_string_value(json_object_get(json_array_get(calls, i), "id"));
        const json_t *res = json_array_get(results, i);
        if (!id) {
            /* results for a block that did not parse: a user note */
            if (m_add_user(m, json_string_value(res), err) != 0) return -1;
            continue;
        }
        json_array_append_new(r->msgs, json_pack("{s:s,s:s,s:O}", "role", "tool", "tool_call_id", id, "content", res));
        r->used += estimate(json_string_length(res));
    }
    return 0;
}

static int m_cost(agent_model *m, const json_t *results, uint32_t *tokens, ds4_err *err) {
    (void)m, (void)err;
    uint32_t t = 0;
    for (size_t i = 0; i < json_array_size(results); i++)
        t += estimate(json_string_length(json_array_get(results, i))) + 8;
    *tokens = t;
    return 0;
}

static int m_round(agent_model *m, const gen_hooks *h, round_result *out, ds4_err *err) {
    remote *r = R_(m);
    memset(out, 0, sizeof(*out));
    uint32_t room = r->ctx > r->used + 1 ? r->ctx - r->used - 1 : 1;
    stream_state s;
    int rc = stream_request(r, r->msgs, r->o->think != DS4_THINK_OFF, room < r->o->n_tokens ? room : r->o->n_tokens,
                            false, h, &s, err);
    bool intr = rc != 0 && err->code == DS4_EINTERRUPTED;
    out->generated = s.generated;
    if (rc != 0 && !intr) {
        stream_free(&s);
        return -1;
    }
    /* the assistant message, whatever came of it */
    json_t *msg = json_pack("{s:s,s:s%}", "role", "assistant", "content", s.content.p ? s.content.p : "",
                            s.content.len);
    if (s.reasoning.len) json_object_set_new(msg, "reasoning_content", json_stringn(s.reasoning.p, s.reasoning.len));
    bool calls_ok = !intr && s.n_calls > 0;
    if (calls_ok) {
        json_t *tc = json_array(), *calls = json_array();
        for (int i = 0; i < s.n_calls; i++) {
            emit(&s, DS4_DSML_CALL_END, i, s.args[i].p ? s.args[i].p : "{}", s.args[i].len);
            const char *a = s.args[i].len ? s.args[i].p : "{}";
            json_error_t je;
            json_t *args = json_loads(a, JSON_DECODE_ANY, &je);
            if (!args && calls_ok) {
                snprintf(out->error, sizeof(out->error), "the arguments of call %d (%s) are not valid JSON: %s", i + 1,
                         s.names[i], je.text);
                calls_ok = false;
            }
            json_array_append_new(tc, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", s.ids[i][0] ? s.ids[i] : "call", "type",
                                                "function", "function", "name", s.names[i], "arguments", a));
            if (args)
                json_array_append_new(
                    calls, json_pack("{s:s,s:o,s:s}", "name", s.names[i], "arguments", args, "id", s.ids[i]));
        }
        json_object_set_new(msg, "tool_calls", tc);
        if (calls_ok) out->calls = calls;
        else json_decref(calls);
    }
    json_array_append_new(r->msgs, msg);
    if (!s.prompt) r->used += estimate(s.content.len + s.reasoning.len);
    if (intr) out->end = ROUND_INTERRUPTED;
    else if (s.n_calls && !calls_ok) out->end = ROUND_BAD_CALLS;
    else if (calls_ok) out->end = ROUND_CALLS;
    else if (s.finish && !strcmp(s.finish, "length")) out->end = ROUND_LENGTH;
    else out->end = ROUND_ANSWER;
    link_set_ctx(r->l, r->used, r->ctx);
    stream_free(&s);
    return 0;
}

static int m_summarize(agent_model *m, const char *request_text, uint32_t max_tokens, const gen_hooks *h,
                       ds4_strbuf *summary, ds4_err *err) {
    remote *r = R_(m);
    json_t *msgs = json_copy(r->msgs);
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", request_text));
    gen_hooks quiet = *h;
    stream_state s;
    int rc = stream_request(r, msgs, false, max_tokens, true, &quiet, &s, err);
    json_decref(msgs);
    if (rc == 0) {
        /* the summary is text: nothing after a tool call */
        ds4_strbuf_append(summary, s.content.p, s.content.len);
    }
    stream_free(&s);
    return rc;
}

/* Bytes of a message, for the tail budget. */
static size_t msg_bytes(const json_t *m) {
    char *t = json_dumps(m, JSON_COMPACT);
    size_t n = t ? strlen(t) : 0;
    free(t);
    return n;
}

static int m_rebuild(agent_model *m, const char *summary, uint32_t tail_budget, uint32_t *tail_tokens, ds4_err *err) {
    remote *r = R_(m);
    size_t n = json_array_size(r->msgs), from = n, last_user = n;
    size_t bytes = 0;
    for (size_t i = n; i > 0; i--) {
        const json_t *msg = json_array_get(r->msgs, i - 1);
        bytes += msg_bytes(msg);
        bool user = !strcmp(json_string_value(json_object_get(msg, "role")), "user");
        if (user && last_user == n) last_user = i - 1;
        if (estimate(bytes) > tail_budget) break;
        if (user) from = i - 1;
    }
    if (from == n) from = last_user;
    json_t *tail = json_array();
    uint32_t t = 0;
    for (size_t i = from; i < n; i++) {
        json_array_append(tail, json_array_get(r->msgs, i));
        t += estimate(msg_bytes(json_array_get(r->msgs, i)));
    }
    json_decref(r->msgs);
    r->msgs = tail;
    free(r->summary);
    r->summary = strdup(summary);
    if (!r->summary) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    r->used = base_tokens(r) + t;
    *tail_tokens = t;
    link_set_ctx(r->l, r->used, r->ctx);
    return 0;
}

/* ------------------------------------------------------------ sessions */

static json_t *session_json(remote *r) {
    return json_pack("{s:s,s:i,s:s,s:s?,s:O,s:i,s:i}", "format", SESSION_FORMAT, "version", 1, "system", r->system,
                     "summary", r->summary, "messages", r->msgs, "tokens", (json_int_t)r->used, "saved",
                     (json_int_t)time(NULL));
}

static int m_save(agent_model *m, char id[41], uint32_t *tokens, ds4_err *err) {
    remote *r = R_(m);
    char *key = json_dumps(r->msgs, JSON_COMPACT);
    json_t *doc = session_json(r);
    char *text = doc ? json_dumps(doc, JSON_INDENT(1)) : NULL;
    int rc = 0;
    if (!key || !text) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    char name[48], path[1200], tmp[1300];
    if (rc == 0) {
        ds4_strbuf k = {0};
        ds4_strbuf_puts(&k, r->system);
        ds4_strbuf_puts(&k, r->summary ? r->summary : "");
        ds4_strbuf_puts(&k, key);
        ds4_kvc_name(k.p, k.len, name);
        ds4_strbuf_free(&k);
        memcpy(id, name, 40);
        id[40] = 0;
        snprintf(path, sizeof(path), "%s/%.40s.json", r->dir, name);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
            rc = ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    if (rc == 0) {
        *tokens = r->used;
        /* older saves of this conversation (whose messages are a prefix) go */
        DIR *d = opendir(r->dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (strlen(de->d_name) != 45 || strcmp(de->d_name + 40, ".json") || !strncmp(de->d_name, name, 40))
                continue;
            char p2[1200];
            snprintf(p2, sizeof(p2), "%s/%s", r->dir, de->d_name);
            json_t *o = json_load_file(p2, 0, NULL);
            const json_t *om = json_object_get(o, "messages");
            bool prefix = o && json_is_array(om) && json_array_size(om) < json_array_size(r->msgs) &&
                          json_equal(json_object_get(o, "system"), json_object_get(doc, "system"));
            for (size_t i = 0; prefix && i < json_array_size(om); i++)
                prefix = json_equal(json_array_get(om, i), json_array_get(r->msgs, i));
            if (prefix) unlink(p2);
            json_decref(o);
        }
        if (d) closedir(d);
    }
    free(key);
    free(text);
    json_decref(doc);
    return rc;
}

static int m_list(agent_model *m, session_info **out, size_t *n_out, display *d, ds4_err *err) {
    remote *r = R_(m);
    *out = NULL;
    *n_out = 0;
    DIR *dir = opendir(r->dir);
    if (!dir) return ds4_err_set(err, DS4_EIO, "%s: %s", r->dir, strerror(errno));
    session_info *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dir))) {
        if (strlen(de->d_name) != 45 || strcmp(de->d_name + 40, ".json") ||
            strspn(de->d_name, "0123456789abcdef") != 40)
            continue;
        char path[1200];
        snprintf(path, sizeof(path), "%s/%s", r->dir, de->d_name);
        json_error_t je;
        json_t *o = json_load_file(path, 0, &je);
        const char *fmt = json_string_value(json_object_get(o, "format"));
        if (!o || !fmt || strcmp(fmt, SESSION_FORMAT) || !json_is_array(json_object_get(o, "messages"))) {
            if (d)
                display_printf(d, OUT_ERROR, "skipping %.8s: %s\n", de->d_name,
                               o ? "not a ds4-agent session" : je.text);
            json_decref(o);
            continue;
        }
        const char *sys = json_string_value(json_object_get(o, "system"));
        if (!sys || strcmp(sys, r->system)) {
            json_decref(o);
            continue; /* another system prompt: not resumable here */
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            session_info *nv = realloc(v, cap * sizeof(*nv));
            if (!nv) {
                json_decref(o);
                break;
            }
            v = nv;
        }
        session_info *s = &v[n++];
        memset(s, 0, sizeof(*s));
        memcpy(s->id, de->d_name, 40);
        snprintf(s->path, sizeof(s->path), "%s", path);
        struct stat st;
        s->mtime = stat(path, &st) == 0 ? (uint64_t)st.st_mtime : 0;
        s->bytes = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
        s->tokens = (uint32_t)json_integer_value(json_object_get(o, "tokens"));
        snprintf(s->kind, sizeof(s->kind), "session");
        const json_t *msgs = json_object_get(o, "messages");
        for (size_t i = 0; i < json_array_size(msgs); i++) {
            const json_t *mm = json_array_get(msgs, i);
            if (strcmp(json_string_value(json_object_get(mm, "role")), "user")) continue;
            const json_t *c = json_object_get(mm, "content");
            sessions_title(json_string_value(c), json_string_length(c), s->title);
            break;
        }
        json_decref(o);
    }
    closedir(dir);
    *out = v;
    *n_out = n;
    return 0;
}

static int m_load(agent_model *m, const session_info *si, ds4_err *err) {
    remote *r = R_(m);
    json_error_t je;
    json_t *o = json_load_file(si->path, 0, &je);
    const json_t *msgs = json_object_get(o, "messages");
    if (!o || !json_is_array(msgs)) {
        json_decref(o);
        return ds4_err_set(err, DS4_EFORMAT, "%s: %s", si->path, o ? "no messages" : je.text);
    }
    json_decref(r->msgs);
    r->msgs = json_incref((json_t *)msgs);
    free(r->summary);
    const char *sum = json_string_value(json_object_get(o, "summary"));
    r->summary = sum ? strdup(sum) : NULL;
    r->used = (uint32_t)json_integer_value(json_object_get(o, "tokens"));
    json_decref(o);
    utime(si->path, NULL);
    link_set_ctx(r->l, r->used, r->ctx);
    return 0;
}

static json_t *m_messages(agent_model *m, ds4_err *err) {
    remote *r = R_(m);
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(r->msgs); i++) {
        json_t *msg = json_deep_copy(json_array_get(r->msgs, i));
        const json_t *tc = json_object_get(msg, "tool_calls");
        if (tc) {
            json_t *names = json_array();
            for (size_t k = 0; k < json_array_size(tc); k++)
                json_array_append(names, json_object_get(json_object_get(json_array_get(tc, k), "function"), "name"));
            json_object_set_new(msg, "tool_calls", names);
        }
        json_array_append_new(out, msg);
    }
    if (!out) ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return out;
}

static void m_free(agent_model *m) {
    remote *r = R_(m);
    if (!r) return;
    if (r->curl) curl_easy_cleanup(r->curl);
    curl_global_cleanup();
    json_decref(r->tools);
    json_decref(r->msgs);
    free(r->url);
    free(r->system);
    free(r->summary);
    free(r->dir);
    free(r);
}

static const model_ops REMOTE_OPS = {
    .name = "remote",
    .ctx = m_ctx,
    .used = m_used,
    .reset = m_reset,
    .add_user = m_add_user,
    .add_results = m_add_results,
    .cost = m_cost,
    .round = m_round,
    .summarize = m_summarize,
    .rebuild = m_rebuild,
    .save = m_save,
    .list = m_list,
    .load = m_load,
    .messages = m_messages,
    .has_user = m_has_user,
    .prefilled = m_prefilled,
    .free = m_free,
};

agent_model *remote_model_new(const agent_opts *o, const agent_hooks *h, agent_link *l, display *d, FILE *trace,
                              ds4_err *err) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        ds4_err_set(err, DS4_EIO, "libcurl did not initialize");
        return NULL;
    }
    remote *r = calloc(1, sizeof(*r));
    if (!r) {
        curl_global_cleanup();
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    r->base.ops = &REMOTE_OPS;
    r->o = o;
    r->h = h;
    r->l = l;
    r->d = d;
    r->trace = trace;
    r->url = strdup(o->server);
    r->system = agent_system_text(o);
    r->tools = agent_tool_schemas();
    r->msgs = json_array();
    r->curl = curl_easy_init();
    if (!r->url || !r->system || !r->tools || !r->msgs || !r->curl) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t n = strlen(r->url); n && r->url[n - 1] == '/'; n--) r->url[n - 1] = 0;
    if (!(r->dir = sessions_dir(o, err))) goto fail;
    /* the server's context size (its /v1/models says) */
    http_call c = {0};
    if (http(r, "/v1/models", NULL, false, &c, err) != 0) {
        ds4_err_prefix(err, "--server");
        call_free(&c);
        goto fail;
    }
    json_t *j = json_loadb(c.body.p ? c.body.p : "", c.body.len, 0, NULL);
    call_free(&c);
    json_int_t sctx = json_integer_value(
        json_object_get(json_array_get(json_object_get(j, "data"), 0), "context_length"));
    json_decref(j);
    r->ctx = sctx > 0 ? (uint32_t)sctx : o->ctx;
    if (o->ctx_given && o->ctx < r->ctx) r->ctx = o->ctx;
    fprintf(stderr, "ds4-agent: server %s, context %u tokens, %s API\n", r->url, r->ctx,
            o->api == AGENT_API_ANTHROPIC ? "Anthropic Messages" : "OpenAI Chat Completions");
    r->used = base_tokens(r);
    link_set_ctx(l, r->used, r->ctx);
    return &r->base;
fail:
    m_free(&r->base);
    return NULL;
}
