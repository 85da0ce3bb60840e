/*
 * openai_completions.c - POST /v1/completions (as ds4 serves it).
 *
 * As ds4 does, the prompt is not raw text: it becomes the user message of
 * a chat with the fixed system prompt "You are a helpful assistant", in
 * thinking mode unless disabled, and the answer is the raw generated text
 * (reasoning and "</think>" included), as one text_completion or a stream
 * of them ending with the finish_reason, the optional usage and [DONE].
 * logprobs N (0..5) adds the legacy logprobs object (tokens,
 * token_logprobs, top_logprobs, text_offset).  One prompt per request:
 * several prompts, echo, suffix and best_of above 1 are refused.
 */
#include <string.h>

#include "server.h"

static int parse(const json_t *b, srv_request *r, api_error *e) {
    r->api = API_COMPLETIONS;
    r->raw_text = true;
    const json_t *p = json_object_get(b, "prompt");
    if (!p || json_is_null(p)) return api_fail(e, 400, "missing prompt");
    if (json_is_array(p)) {
        if (json_array_size(p) == 0) return api_fail(e, 400, "prompt must not be empty");
        if (json_array_size(p) > 1)
            return api_fail(e, 400, "prompt: %zu prompts in one request are not supported; send one request per prompt",
                            json_array_size(p));
        p = json_array_get(p, 0);
        if (!json_is_string(p))
            return api_fail(e, 400, "prompt must be a string or an array of strings (token ids are not supported)");
    }
    if (!json_is_string(p)) return api_fail(e, 400, "prompt must be a string or an array of strings");
    r->messages = json_pack("[{s:s,s:s},{s:s,s:O}]", "role", "system", "content", "You are a helpful assistant", "role",
                            "user", "content", (json_t *)p);
    const json_t *echo = json_object_get(b, "echo");
    if (json_is_true(echo)) return api_fail(e, 400, "echo is not supported");
    const json_t *suffix = json_object_get(b, "suffix");
    if (json_is_string(suffix) && json_string_length(suffix)) return api_fail(e, 400, "suffix is not supported");
    const json_t *best = json_object_get(b, "best_of");
    if (best && !json_is_null(best) && (!json_is_integer(best) || json_integer_value(best) != 1))
        return api_fail(e, 400, "best_of must be 1 (one completion per request)");
    const json_t *lp = json_object_get(b, "logprobs");
    if (lp && !json_is_null(lp) && req_logprobs(r, lp, "logprobs", 5, e)) return -1;
    if (chat_common_fields(b, r, e)) return -1;
    return req_finalize(r, e);
}

/* The logprobs of the tokens since the last chunk (all of them at the
 * end of a non-streaming answer), text offsets counted from the answer's
 * start. */
static json_t *choice_logprobs(job *j, bool all) {
    gen_out *o = &j->out;
    if (j->req.logprobs < 0) return json_null();
    size_t from = all ? 0 : o->lp_sent, offset = 0;
    for (size_t i = 0; i < from; i++) offset += ds4_vocab_token_bytes(o->vocab, o->lp[i].id).len;
    json_t *lp = logprobs_completions(o, from, o->n_lp, offset);
    if (!all) o->lp_sent = o->n_lp;
    return lp;
}

static json_t *chunk_lp(job *j, const char *text, size_t n, const char *finish, json_t *logprobs) {
    json_t *choice = json_pack("{s:s#,s:i,s:o,s:o}", "text", text, n, "index", 0, "logprobs",
                               logprobs ? logprobs : json_null(), "finish_reason",
                               finish ? json_string(finish) : json_null());
    return json_pack("{s:s,s:s,s:i,s:s,s:[o]}", "id", j->id, "object", "text_completion", "created",
                     (json_int_t)j->created, "model", j->req.model, "choices", choice);
}

static json_t *chunk(job *j, const char *text, size_t n, const char *finish) {
    return chunk_lp(j, text, n, finish, NULL);
}

static void stream_begin(job *j, ds4_strbuf *out) { (void)j, (void)out; }

static void stream_event(job *j, ev_kind k, int index, const char *text, size_t n, ds4_strbuf *out) {
    (void)index;
    if (k == EV_CONTENT) sse_data(out, NULL, chunk_lp(j, text, n, NULL, choice_logprobs(j, false)));
}

static void stream_end(job *j, ds4_strbuf *out) {
    sse_data(out, NULL, chunk(j, "", 0, j->out.finish));
    if (j->req.include_usage) {
        json_t *c = json_pack("{s:s,s:s,s:i,s:s,s:[],s:o}", "id", j->id, "object", "text_completion", "created",
                              (json_int_t)j->created, "model", j->req.model, "choices", "usage", usage_openai(&j->out));
        sse_data(out, NULL, c);
    }
    ds4_strbuf_puts(out, "data: [DONE]\n\n");
}

static json_t *final_body(job *j) {
    json_t *c = chunk_lp(j, j->out.content.p ? j->out.content.p : "", j->out.content.len, j->out.finish,
                         choice_logprobs(j, true));
    json_object_set_new(c, "usage", usage_openai(&j->out));
    return c;
}

const api_adapter API_COMPLETIONS_ADAPTER = {
    .kind = API_COMPLETIONS,
    .name = "completions",
    .parse = parse,
    .stream_begin = stream_begin,
    .stream_event = stream_event,
    .stream_end = stream_end,
    .stream_error = openai_stream_error,
    .final_body = final_body,
};
