/*
 * fuzz_server_request.c - libFuzzer target for ds4-server's request path:
 * JSON body -> internal request (the four API adapters) -> chat rendering
 * (with the exact-replay hook and a tool memory that knows some ids), and
 * the answer builders (non-streaming bodies, stream start/end events, error
 * bodies) on whatever the request held.
 *
 * Input: one control byte (API in the low 2 bits) then the body.  Besides
 * memory and UB errors, it aborts when a refused request has no message or
 * a status outside 4xx/5xx, an accepted one has no message array, or a
 * rendered prompt's segments do not cover its text.  Built and run by
 * tests/suite/fuzz_server.sh (ASan + UBSan).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../apps/ds4-server/server.h"

static server S;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    S.o.exact_replay = true;
    S.o.ctx = 1u << 20;
    S.tools = toolmem_new(64, 1 << 20);
    pthread_mutex_init(&S.stats_mu, NULL);
    static const char block[] = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
                                "string=\"true\">x</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    toolmem_put(S.tools, "call_1", block, sizeof(block) - 1);
    toolmem_put(S.tools, "toolu_1", block, sizeof(block) - 1);
    return 0;
}

static void check(int cond, const char *what) {
    if (!cond) {
        fprintf(stderr, "invariant broken: %s\n", what);
        abort();
    }
}

static void answers(job *j) {
    j->out.finish = "stop";
    ds4_strbuf_puts(&j->out.content, "answer");
    snprintf(j->id, sizeof(j->id), "id_1");
    json_decref(j->api->final_body(j));
    ds4_strbuf sse = {0};
    j->api->stream_begin(j, &sse);
    j->api->stream_event(j, EV_CONTENT, 0, "hi", 2, &sse);
    j->api->stream_end(j, &sse);
    j->api->stream_error(j, "oops", &sse);
    check(!sse.failed, "SSE buffer");
    ds4_strbuf_free(&sse);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const api_adapter *const apis[] = {&API_CHAT_ADAPTER, &API_COMPLETIONS_ADAPTER, &API_RESPONSES_ADAPTER,
                                              &API_MESSAGES_ADAPTER};
    if (size < 1) return 0;
    const api_adapter *api = apis[data[0] & 3];
    api_error e = {0};
    json_t *body = req_load_json((const char *)data + 1, size - 1, &e);
    if (!body) {
        check((e.status == 400 || e.status == 413) && e.message[0], "load error");
        json_decref(api_error_body(api, &e));
        return 0;
    }
    job *j = job_new(api);
    int rc = api->parse(body, &j->req, &e);
    json_decref(body);
    if (rc != 0) {
        check(e.status >= 400 && e.status < 600 && e.message[0], "parse error");
        json_decref(api_error_body(api, &e));
        job_unref(j);
        return 0;
    }
    check(json_is_array(j->req.messages) && j->req.model != NULL, "parsed request");
    render_calls_ctx calls = {&S, 0, 0};
    ds4_chat_opts o = {.think = j->req.think,
                       .ctx_size = S.o.ctx,
                       .tools = j->req.tools,
                       .render_calls = toolmem_render_calls,
                       .render_calls_ctx = &calls};
    ds4_err err = {0};
    if (ds4_chat_render(j->req.messages, &o, &j->rendered, &err) == 0) {
        size_t end = 0;
        for (size_t i = 0; i < j->rendered.n_segs; i++) {
            check(j->rendered.segs[i].off == end, "segments contiguous");
            end += j->rendered.segs[i].len;
        }
        check(end == j->rendered.text.len, "segments cover the text");
    } else {
        check(err.msg[0] != 0, "render error message");
    }
    answers(j);
    job_unref(j);
    return 0;
}
