/*
 * test_server_api.c - ds4-server's request parsing and answer mapping, without
 * HTTP or a model: each API's fields to the internal request (messages for
 * the chat renderer, tools, thinking, sampling, stops) and its refusals;
 * answers (tool calls, reasoning, usage) in each API's shape; error shapes;
 * the tool-id memory (LRU, limits) and its exact-replay rule.
 *
 * The adapters live in apps/ds4-server/; the Makefile links the server's
 * sources (all but main.c) into tests named test_server_*.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "text/dsml_parse.h"
#include "text/tokenizer.h"
#include "text_testdata.h"

/* Parse `json` with an adapter; returns the job (request in j->req) or
 * NULL with *e filled. */
static job *parse_with(const api_adapter *api, const char *json, api_error *e) {
    memset(e, 0, sizeof(*e));
    json_t *body = req_load_json(json, strlen(json), e);
    if (!body) return NULL;
    job *j = job_new(api);
    int rc = api->parse(body, &j->req, e);
    json_decref(body);
    if (rc != 0) {
        job_unref(j);
        return NULL;
    }
    return j;
}

static job *ok(const api_adapter *api, const char *json) {
    api_error e;
    job *j = parse_with(api, json, &e);
    if (!j) fail_msg("refused: %s (%s)", e.message, json);
    return j;
}

static void refused(const api_adapter *api, const char *json, int status, const char *needle) {
    api_error e;
    job *j = parse_with(api, json, &e);
    if (j) fail_msg("accepted: %s", json);
    assert_int_equal(e.status, status);
    if (!strstr(e.message, needle)) fail_msg("message \"%s\" lacks \"%s\"", e.message, needle);
}

static void assert_json(const json_t *v, const char *want) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (strcmp(s, want) != 0) fail_msg("got  %s\nwant %s", s, want);
    free(s);
}

static void test_chat_request(void **state) {
    (void)state;
    job *j = ok(
        &API_CHAT_ADAPTER,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image_url\",\"image_url\":{}},{\"type\":\"text\",\"text\":\"b\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":\"r\",\"extra\":1,"
        "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
        "{\"role\":\"function\",\"tool_call_id\":\"call_1\",\"content\":\"ok\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}},{\"type\":\"web\"}],"
        "\"temperature\":0.5,\"top_k\":5000,\"min_p\":0.1,\"seed\":9,\"stop\":\"END\",\"max_tokens\":7,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    assert_json(
        j->req.messages,
        "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"a[image not shown: this model reads text only]b\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"r\",\"tool_calls\":[{\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"},\"id\":\"call_1\"}]},"
        "{\"role\":\"tool\",\"content\":\"ok\",\"tool_call_id\":\"call_1\"}]");
    assert_json(j->req.tools,
                "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]");
    assert_true(j->req.sp.temperature == 0.5f && j->req.sp.top_k == DS4_TOP_K_MAX && j->req.sp.min_p == 0.1f);
    assert_int_equal(j->req.sp.seed, 9);
    assert_int_equal(j->req.max_tokens, 7);
    assert_int_equal(j->req.n_stop, 1);
    assert_string_equal(j->req.stop[0], "END");
    assert_true(j->req.stream && j->req.include_usage);
    assert_int_equal(j->req.think, DS4_THINK_HIGH);
    assert_string_equal(j->req.model, "m");
    job_unref(j);
    /* tool_choice none drops the tools; defaults. */
    j = ok(&API_CHAT_ADAPTER, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"none\","
                              "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}");
    assert_null(j->req.tools);
    assert_true(j->req.sp.temperature == 1.0f && j->req.sp.top_p == 1.0f && j->req.sp.min_p == 0.05f);
    assert_string_equal(j->req.model, DS4_MODEL_ID);
    job_unref(j);
}

static ds4_think_mode think_of(const api_adapter *api, const char *json) {
    job *j = ok(api, json);
    ds4_think_mode m = j->req.think;
    job_unref(j);
    return m;
}

static void test_thinking_mapping(void **state) {
    (void)state;
    const api_adapter *C = &API_CHAT_ADAPTER;
#define CH(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]" extra "}"
    assert_int_equal(think_of(C, CH("")), DS4_THINK_HIGH);
    assert_int_equal(think_of(C, CH(",\"thinking\":false")), DS4_THINK_OFF);
    assert_int_equal(think_of(C, CH(",\"thinking\":{\"type\":\"disabled\"}")), DS4_THINK_OFF);
    assert_int_equal(think_of(C, CH(",\"think\":false")), DS4_THINK_OFF);
    assert_int_equal(think_of(C, CH(",\"reasoning_effort\":\"none\"")), DS4_THINK_OFF);
    assert_int_equal(think_of(C, CH(",\"reasoning_effort\":\"max\"")), DS4_THINK_MAX);
    assert_int_equal(think_of(C, CH(",\"reasoning_effort\":\"low\"")), DS4_THINK_HIGH);
    assert_int_equal(think_of(C, CH(",\"thinking\":false,\"reasoning_effort\":\"max\"")), DS4_THINK_OFF);
    assert_int_equal(think_of(C, CH(",\"model\":\"deepseek-chat\"")), DS4_THINK_OFF);
    assert_int_equal(think_of(C, CH(",\"model\":\"deepseek-chat\",\"thinking\":true")), DS4_THINK_HIGH);
    assert_int_equal(think_of(C, CH(",\"model\":\"deepseek-reasoner\"")), DS4_THINK_HIGH);
    refused(C, CH(",\"reasoning_effort\":\"extreme\""), 400, "unknown reasoning effort");
    refused(C, CH(",\"thinking\":{\"type\":\"maybe\"}"), 400, "thinking.type");
    const api_adapter *R = &API_RESPONSES_ADAPTER;
    assert_int_equal(think_of(R, "{\"input\":\"x\",\"reasoning\":{\"effort\":\"none\"}}"), DS4_THINK_OFF);
    assert_int_equal(think_of(R, "{\"input\":\"x\",\"reasoning\":{\"effort\":\"xhigh\"}}"), DS4_THINK_HIGH);
    const api_adapter *M = &API_MESSAGES_ADAPTER;
#define MS(extra) "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]" extra "}"
    assert_int_equal(think_of(M, MS(",\"thinking\":{\"type\":\"disabled\"}")), DS4_THINK_OFF);
    assert_int_equal(think_of(M, MS(",\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":99}")), DS4_THINK_HIGH);
    assert_int_equal(think_of(M, MS(",\"output_config\":{\"effort\":\"max\"}")), DS4_THINK_MAX);
#undef CH
#undef MS
}

static void test_chat_refusals(void **state) {
    (void)state;
    const api_adapter *C = &API_CHAT_ADAPTER;
    refused(C, "{}", 400, "missing messages");
    refused(C, "{\"messages\":{}}", 400, "must be an array");
    refused(C, "{\"messages\":[]}", 400, "must not be empty");
    refused(C, "{\"messages\":[1]}", 400, "messages[0] must be an object");
    refused(C, "{\"messages\":[{\"role\":\"x\"}]}", 400, "not supported");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content");
    refused(C, "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]}", 400, "function.name");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":101}", 400, "between");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_p\":\"1\"}", 400, "top_p must be a number");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", 400, "positive");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", 400, "stop must be");
    refused(C,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\","
            "\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}",
            400, "at most 16");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":{}}", 400, "tools must be an array");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n must be 1");
    refused(&API_COMPLETIONS_ADAPTER, "{\"prompt\":[[1,2]]}", 400, "token ids");
    refused(&API_COMPLETIONS_ADAPTER, "{\"prompt\":[\"a\",\"b\"]}", 400, "2 prompts in one request");
    refused(&API_COMPLETIONS_ADAPTER, "{\"prompt\":\"x\",\"best_of\":3}", 400, "best_of");
    refused(&API_COMPLETIONS_ADAPTER, "{\"prompt\":\"x\",\"suffix\":\"y\"}", 400, "suffix");
    refused(&API_COMPLETIONS_ADAPTER, "{\"prompt\":\"x\",\"logprobs\":6}", 400,
            "logprobs must be an integer from 0 to 5");
    refused(&API_COMPLETIONS_ADAPTER, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo");
    api_error e;
    assert_null(parse_with(C, "{\"a\":", &e));
    assert_non_null(strstr(e.message, "invalid JSON"));
    assert_null(
        parse_with(C,
                   "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                   "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
                   "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
                   &e));
    assert_non_null(strstr(e.message, "nested deeper"));
    /* Brackets inside strings do not count. */
    job *j = ok(
        C,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"\"}]}");
    job_unref(j);
}

static void test_responses_request(void **state) {
    (void)state;
    job *j = ok(
        &API_RESPONSES_ADAPTER,
        "{\"instructions\":\"be brief\",\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"q\"}]},"
        "{\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"think\"}]},"
        "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"let me look\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"call_a\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\",\"status\":\"completed\"},"
        "{\"type\":\"function_call\",\"call_id\":\"call_b\",\"name\":\"g\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_a\",\"output\":\"A\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"call_b\",\"output\":[{\"type\":\"input_text\",\"text\":\"B\"}]}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}},"
        "{\"type\":\"web_search\"}],\"reasoning\":{\"summary\":\"auto\"},\"max_output_tokens\":3,\"tool_choice\":\"auto\"}");
    assert_json(
        j->req.messages,
        "[{\"role\":\"system\",\"content\":\"be brief\"},{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"let me look\",\"reasoning_content\":\"think\",\"tool_calls\":["
        "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},\"id\":\"call_a\"},"
        "{\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"},\"id\":\"call_b\"}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_a\",\"content\":\"A\"},{\"role\":\"tool\",\"tool_call_id\":\"call_b\",\"content\":\"B\"}]");
    assert_json(
        j->req.tools,
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}}]");
    assert_true(j->req.reasoning_summary);
    assert_int_equal(j->req.max_tokens, 3);
    job_unref(j);
    const api_adapter *R = &API_RESPONSES_ADAPTER;
    refused(R, "{}", 400, "missing input");
    refused(R, "{\"input\":\"x\",\"previous_response_id\":\"r\"}", 400, "replay full input");
    refused(R, "{\"input\":\"x\",\"conversation\":\"c\"}", 400, "conversation is not supported");
    refused(R, "{\"input\":\"x\",\"tool_choice\":\"required\"}", 400, "the request has no tools");
    refused(R, "{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}", 400, "no tools");
    refused(
        R,
        "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"g\"}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}",
        400, "no tool named \"f\"");
    refused(R, "{\"input\":\"x\",\"tool_choice\":{\"type\":\"web_search_preview\"}}", 400, "web_search_preview");
    refused(R, "{\"input\":[{\"type\":\"mystery_call\"}]}", 400, "not supported");
    refused(R, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_hologram\"}]}]}", 400, "not supported");
    refused(R,
            "{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\",\"status\":\"in_progress\"}]}",
            400, "in_progress");
}

static void test_anthropic_request(void **state) {
    (void)state;
    job *j = ok(
        &API_MESSAGES_ADAPTER,
        "{\"system\":[{\"type\":\"text\",\"text\":\"x-anthropic-billing-header: 1\"},{\"type\":\"text\",\"text\":\"sys\"}],"
        "\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"t\",\"signature\":\"s\"},"
        "{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"f\",\"input\":{\"k\":[1]}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":\"text\",\"text\":\"r\"}]},"
        "{\"type\":\"text\",\"text\":\"more\"}]}],"
        "\"tools\":[{\"name\":\"f\",\"input_schema\":{\"type\":\"object\"}},{\"type\":\"web_search_20250305\",\"name\":\"w\"}],"
        "\"stop_sequences\":[\"Z\"],\"max_tokens\":5,\"top_k\":3}");
    assert_json(
        j->req.messages,
        "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"q\"},"
        "{\"role\":\"assistant\",\"content\":\"a\",\"reasoning_content\":\"t\",\"tool_calls\":[{\"id\":\"toolu_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"k\":[1]}}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"r\"},{\"role\":\"user\",\"content\":\"more\"}]");
    assert_json(j->req.tools,
                "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]");
    assert_int_equal(j->req.sp.top_k, 3);
    assert_string_equal(j->req.stop[0], "Z");
    job_unref(j);
    const api_adapter *M = &API_MESSAGES_ADAPTER;
    refused(M, "{\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", 400, "user or assistant");
    refused(M, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"hologram\"}]}]}", 400, "not supported");
    refused(
        M,
        "{\"messages\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\"}]}]}",
        400, "input object");
    refused(M, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"system\":5}", 400, "system must be");
}

static void fill_output(job *j) {
    gen_out *o = &j->out;
    o->finish = "tool_calls";
    ds4_strbuf_puts(&o->reasoning, "why");
    ds4_strbuf_puts(&o->content, "calling");
    o->calls = calloc(1, sizeof(gen_call));
    o->n_calls = 1;
    snprintf(o->calls[0].id, sizeof(o->calls[0].id), "call_0123");
    o->calls[0].name = strdup("f");
    ds4_strbuf_puts(&o->calls[0].args, "{\"k\": 1}");
    o->prompt_tokens = 100;
    o->cached_tokens = 60;
    o->written_tokens = 40;
    o->completion_tokens = 9;
    snprintf(j->id, sizeof(j->id), "id_x");
    j->created = 5;
}

static void test_answers(void **state) {
    (void)state;
    job *j = ok(&API_CHAT_ADAPTER, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    fill_output(j);
    json_t *b = j->api->final_body(j);
    assert_json(
        b,
        "{\"id\":\"id_x\",\"object\":\"chat.completion\",\"created\":5,\"model\":\"m\",\"choices\":[{\"index\":0,"
        "\"message\":{\"role\":\"assistant\",\"content\":\"calling\",\"reasoning_content\":\"why\",\"tool_calls\":"
        "[{\"id\":\"call_0123\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"k\\\": 1}\"}}]},"
        "\"finish_reason\":\"tool_calls\",\"logprobs\":null}],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":9,"
        "\"total_tokens\":109,\"prompt_tokens_details\":{\"cached_tokens\":60,\"cache_write_tokens\":40}}}");
    json_decref(b);
    job_unref(j);

    j = ok(&API_MESSAGES_ADAPTER, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
    fill_output(j);
    b = j->api->final_body(j);
    assert_json(
        b,
        "{\"id\":\"id_x\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":["
        "{\"type\":\"thinking\",\"thinking\":\"why\",\"signature\":\"id_x\"},{\"type\":\"text\",\"text\":\"calling\"},"
        "{\"type\":\"tool_use\",\"id\":\"call_0123\",\"name\":\"f\",\"input\":{\"k\":1}}],\"stop_reason\":\"tool_use\","
        "\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":9,\"cache_read_input_tokens\":60,"
        "\"cache_creation_input_tokens\":40}}");
    json_decref(b);
    /* Stop-sequence answers. */
    j->out.stop_hit = "Z";
    j->out.finish = "stop";
    b = j->api->final_body(j);
    assert_string_equal(json_string_value(json_object_get(b, "stop_reason")), "stop_sequence");
    assert_string_equal(json_string_value(json_object_get(b, "stop_sequence")), "Z");
    json_decref(b);
    job_unref(j);

    j = ok(&API_RESPONSES_ADAPTER, "{\"input\":\"x\",\"reasoning\":{\"summary\":\"concise\"}}");
    fill_output(j);
    b = j->api->final_body(j);
    json_t *out = json_object_get(b, "output");
    assert_int_equal(json_array_size(out), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning");
    assert_string_equal(json_string_value(json_object_get(json_array_get(out, 1), "type")), "message");
    json_t *fc = json_array_get(out, 2);
    assert_string_equal(json_string_value(json_object_get(fc, "id")), "fc_0123");
    assert_string_equal(json_string_value(json_object_get(fc, "call_id")), "call_0123");
    assert_string_equal(json_string_value(json_object_get(fc, "arguments")), "{\"k\": 1}");
    assert_string_equal(json_string_value(json_object_get(b, "status")), "completed");
    assert_json(json_object_get(b, "usage"), "{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":60,"
                                             "\"cache_write_tokens\":40},\"output_tokens\":9,\"output_tokens_details\":"
                                             "{\"reasoning_tokens\":0},\"total_tokens\":109}");
    json_decref(b);
    job_unref(j);
}

static void test_error_shapes(void **state) {
    (void)state;
    api_error e = {.code = "context_length_exceeded", .param = "messages", .n_prompt = 9000, .n_ctx = 4096};
    api_fail(&e, 400, "Prompt has 9000 tokens, but the configured context size is 4096 tokens");
    json_t *b = api_error_body(&API_CHAT_ADAPTER, &e);
    assert_json(b, "{\"error\":{\"message\":\"Prompt has 9000 tokens, but the configured context size is 4096 tokens\","
                   "\"type\":\"invalid_request_error\",\"param\":\"messages\",\"code\":\"context_length_exceeded\","
                   "\"n_prompt_tokens\":9000,\"n_ctx\":4096}}");
    json_decref(b);
    b = api_error_body(&API_MESSAGES_ADAPTER, &e);
    assert_json(
        b, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"Prompt has 9000 tokens, "
           "but the configured context size is 4096 tokens\",\"n_prompt_tokens\":9000,\"n_ctx\":4096}}");
    json_decref(b);
    api_error e2 = {0};
    api_fail(&e2, 503, "server shutting down");
    b = api_error_body(&API_MESSAGES_ADAPTER, &e2);
    assert_json(b,
                "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"server shutting down\"}}");
    json_decref(b);
    api_fail(&e2, 429, "full");
    b = api_error_body(&API_RESPONSES_ADAPTER, &e2);
    assert_json(b, "{\"error\":{\"message\":\"full\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":null}}");
    json_decref(b);
}

static void test_new_request_fields(void **state) {
    (void)state;
    const api_adapter *C = &API_CHAT_ADAPTER, *R = &API_RESPONSES_ADAPTER, *M = &API_MESSAGES_ADAPTER;
/* clang-format off */
#define T2 \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}]"
    /* clang-format on */
    job *j = ok(C,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]," T2 ",\"tool_choice\":{\"type\":\"function\","
                "\"function\":{\"name\":\"g\"}},\"parallel_tool_calls\":false,\"logprobs\":true,\"top_logprobs\":3}");
    assert_int_equal(j->req.tool_choice, TOOL_NAMED);
    assert_string_equal(j->req.tool_name, "g");
    assert_true(j->req.serial_calls);
    assert_int_equal(j->req.logprobs, 3);
    assert_null(j->req.schema);
    job_unref(j);
    j = ok(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
              "\"json_schema\":{\"name\":\"r\",\"schema\":{\"type\":\"object\"}}}}");
    assert_non_null(j->req.schema);
    assert_int_equal(j->req.logprobs, -1);
    /* Shown to the model in the first system message (official template). */
    assert_json(json_array_get(j->req.messages, 0),
                "{\"role\":\"system\",\"content\":\"\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                "{\"name\":\"r\",\"schema\":{\"type\":\"object\"}}}}");
    job_unref(j);
    refused(C,
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
            "\"json_schema\":{\"schema\":{\"type\":\"string\",\"pattern\":\"a\"}}}}",
            400, "response_format.json_schema.schema: schema: keyword \"pattern\" is not supported");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"yaml\"}}", 400,
            "response_format.type \"yaml\"");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":21,\"logprobs\":true}", 400,
            "from 0 to 20");
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"sometimes\"}", 400,
            "tool_choice must be");
    j = ok(M, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}],"
              "\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true}}");
    assert_int_equal(j->req.tool_choice, TOOL_REQUIRED);
    assert_true(j->req.serial_calls);
    job_unref(j);
    j = ok(M, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"f\"}],"
              "\"tool_choice\":{\"type\":\"none\"}}");
    assert_int_equal(j->req.tool_choice, TOOL_NONE);
    assert_null(j->req.tools);
    job_unref(j);
    /* NUL: escaped in every string of the conversation, arguments included. */
    j = ok(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"},{\"role\":\"assistant\",\"tool_calls\":"
              "[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"k\\\":\\\"x\\\\u0000y\\\"}\"}}]},"
              "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"\\u0000\"}]}");
    assert_json(
        j->req.messages,
        "[{\"role\":\"user\",\"content\":\"a\\\\u0000b\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"k\":\"x\\\\u0000y\"}},\"id\":\"c\"}]},"
        "{\"role\":\"tool\",\"content\":\"\\\\u0000\",\"tool_call_id\":\"c\"}]");
    job_unref(j);
    refused(C, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":\"a\\u0000\"}", 400, "NUL");
    /* Responses: Codex's tools and history items. */
    j = ok(
        R,
        "{\"input\":[{\"role\":\"user\",\"content\":\"q\"},"
        "{\"type\":\"custom_tool_call\",\"call_id\":\"c1\",\"name\":\"apply_patch\",\"input\":\"P\"},"
        "{\"type\":\"custom_tool_call_output\",\"call_id\":\"c1\",\"output\":\"ok\"},"
        "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"read\",\"namespace\":\"ns__\",\"arguments\":\"{}\"},"
        "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":\"r\"},"
        "{\"type\":\"local_shell_call\",\"call_id\":\"c3\",\"action\":{\"command\":[\"ls\"]}},"
        "{\"type\":\"local_shell_call_output\",\"call_id\":\"c3\",\"output\":\"a\"},"
        "{\"type\":\"web_search_call\",\"id\":\"ws\",\"action\":{\"query\":\"q\"}},"
        "{\"type\":\"image_generation_call\",\"id\":\"ig\",\"result\":\"AAAA\"}],"
        "\"tools\":[{\"type\":\"custom\",\"name\":\"apply_patch\",\"format\":{\"type\":\"grammar\",\"syntax\":\"lark\","
        "\"definition\":\"start: x\"}},{\"type\":\"namespace\",\"name\":\"ns__\",\"tools\":[{\"type\":\"function\","
        "\"name\":\"read\"}]},{\"type\":\"tool_search\"},{\"type\":\"web_search\"}]}");
    assert_json(
        j->req.messages,
        "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":"
        "\"function\",\"function\":{\"name\":\"apply_patch\",\"arguments\":{\"input\":\"P\"}},\"id\":\"c1\"}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"ns__read\",\"arguments\":\"{}\"},\"id\":\"c2\"}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c2\",\"content\":\"r\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"local_shell\",\"arguments\":{\"command\":"
        "[\"ls\"]}},\"id\":\"c3\"}]},{\"role\":\"tool\",\"tool_call_id\":\"c3\",\"content\":\"a\"},{\"role\":"
        "\"assistant\",\"content\":\"\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":"
        "\"web_search_call\",\"arguments\":{\"query\":\"q\"}},\"id\":\"ws\"},{\"type\":\"function\",\"function\":"
        "{\"name\":\"image_generation_call\",\"arguments\":{}},\"id\":\"ig\"}]}]");
    assert_int_equal(json_array_size(j->req.tools), 3);
    assert_json(json_object_get(j->req.tool_kinds, "ns__read"),
                "{\"type\":\"function\",\"name\":\"read\",\"namespace\":\"ns__\"}");
    assert_json(json_object_get(j->req.tool_kinds, "apply_patch"), "{\"type\":\"custom\",\"name\":\"apply_patch\"}");
    const json_t *params = json_object_get(json_object_get(json_array_get(j->req.tools, 0), "function"), "parameters");
    assert_non_null(strstr(json_string_value(json_object_get(
                               json_object_get(json_object_get(params, "properties"), "input"), "description")),
                           "lark grammar:\nstart: x"));
    job_unref(j);
    /* An error message cut at its end stays UTF-8 (and keeps its field). */
    api_error e = {0};
    char big[3000];
    for (int i = 0; i < 1499; i++) memcpy(big + 2 * i, "\xc3\xa9", 2);
    big[2998] = 0;
    api_fail(&e, 400, "x%s", big);
    assert_true(strlen(e.message) < sizeof(e.message) && strlen(e.message) % 2 == 1);
    json_t *b = api_error_body(&API_CHAT_ADAPTER, &e);
    assert_non_null(json_string_value(json_object_get(json_object_get(b, "error"), "message")));
    json_decref(b);
    snprintf(e.message, sizeof(e.message), "bad \xff byte");
    b = api_error_body(&API_MESSAGES_ADAPTER, &e);
    assert_string_equal(json_string_value(json_object_get(json_object_get(b, "error"), "message")),
                        "bad \xef\xbf\xbd byte");
    json_decref(b);
#undef T2
}

#define BLOCK1               "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
/* clang-format off */
#define BLOCK2 "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"g\">\n" \
               "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
#define BLOCK3 "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"h\">\n<｜DSML｜parameter name=\"x\" string=\"true\">a" \
               "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"y\" string=\"false\">1</｜DSML｜parameter>\n" \
               "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
/* clang-format on */
/* Calls as clients send them back. */
#define CALL(id, name, args) "{\"id\":\"" id "\",\"function\":{\"name\":\"" name "\",\"arguments\":" args "}}"
#define FA(id)               CALL(id, "f", "\"{}\"")
#define GB(id)               CALL(id, "g", "{}")

/* Whether the calls replay; a replay must be exactly `block`, as one
 * trusted segment (its added-token spellings tokenize as control tokens),
 * and a refusal must leave the prompt untouched. */
static int replays(render_calls_ctx *c, const char *calls_json, const char *block) {
    json_t *calls = json_loads(calls_json, 0, NULL);
    ds4_rendered r = {0};
    int rc = toolmem_render_calls(c, calls, &r, NULL);
    if (rc == 1) {
        if (!block) fail_msg("%s replayed, expected the canonical rendering", calls_json);
        assert_int_equal(r.text.len, strlen(block));
        assert_memory_equal(r.text.p, block, r.text.len);
        assert_int_equal(r.n_segs, 1);
        assert_int_equal(r.segs[0].kind, DS4_SEG_TRUSTED);
        assert_int_equal(r.segs[0].off, 0);
        assert_int_equal(r.segs[0].len, strlen(block));
    } else {
        assert_int_equal(r.text.len, 0);
        assert_int_equal(r.n_segs, 0);
    }
    ds4_rendered_free(&r);
    json_decref(calls);
    return rc;
}

static void test_tool_memory(void **state) {
    (void)state;
    server s = {0};
    s.o.exact_replay = true;
    pthread_mutex_init(&s.stats_mu, NULL);
    s.tools = toolmem_new(5, 1 << 20);
    render_calls_ctx rc = {&s, 0, 0};
    const char *two[] = {"call_a", "call_b"};
    toolmem_put_many(s.tools, two, 2, BLOCK2, strlen(BLOCK2));
    toolmem_put(s.tools, "call_c", BLOCK1, strlen(BLOCK1));
    size_t n;
    char *b = toolmem_get(s.tools, "call_a", &n);
    assert_int_equal(n, strlen(BLOCK2));
    assert_memory_equal(b, BLOCK2, n);
    free(b);
    /* All ids of the turn, one block, as many calls as it holds, the same
     * calls in the same order. */
    assert_int_equal(replays(&rc, "[" FA("call_a") "," GB("call_b") "]", BLOCK2), 1);
    assert_int_equal(replays(&rc, "[" FA("call_a") "]", NULL), 0);                  /* one of two calls */
    assert_int_equal(replays(&rc, "[" FA("call_a") "," FA("call_c") "]", NULL), 0); /* two blocks */
    assert_int_equal(replays(&rc, "[" FA("call_c") "]", BLOCK1), 1);
    assert_int_equal(replays(&rc, "[{\"id\":\"nope\"}]", NULL), 0);
    assert_int_equal(replays(&rc, "[{}]", NULL), 0);
    assert_int_equal(rc.replayed, 2);
    assert_int_equal(rc.canonical, 4);
    assert_int_equal(replays(&rc, "[" GB("call_b") "," FA("call_a") "]", NULL), 0); /* reordered */
    assert_int_equal(replays(&rc, "[" CALL("call_c", "g", "\"{}\"") "]", NULL), 0); /* renamed */
    /* Arguments: equal as JSON replays (any spelling), an edit does not. */
    const char *three[] = {"call_h"};
    toolmem_put_many(s.tools, three, 1, BLOCK3, strlen(BLOCK3));
    assert_int_equal(replays(&rc, "[" CALL("call_h", "h", "\"{\\\"x\\\": \\\"a\\\", \\\"y\\\": 1}\"") "]", BLOCK3), 1);
    assert_int_equal(replays(&rc, "[" CALL("call_h", "h", "\"{\\\"y\\\":1,\\\"x\\\":\\\"a\\\"}\"") "]", BLOCK3), 1);
    assert_int_equal(replays(&rc, "[" CALL("call_h", "h", "{\"y\":1,\"x\":\"a\"}") "]", BLOCK3), 1);
    assert_int_equal(replays(&rc, "[" CALL("call_h", "h", "\"{\\\"x\\\": \\\"b\\\", \\\"y\\\": 1}\"") "]", NULL), 0);
    assert_int_equal(replays(&rc, "[" CALL("call_h", "h", "{\"x\":\"a\"}") "]", NULL), 0);
    assert_int_equal(replays(&rc, "[" CALL("call_h", "h", "\"not json\"") "]", NULL), 0);
    rc.replayed = 2;
    rc.canonical = 4;
    /* The server's own renderings replay the same way, uncounted. */
    json_t *calls = json_loads("[" FA("call_c") "]", 0, NULL);
    ds4_rendered r = {0};
    assert_int_equal(toolmem_render_calls_quiet(&rc, calls, &r, NULL), 1);
    assert_int_equal(r.text.len, strlen(BLOCK1));
    assert_memory_equal(r.text.p, BLOCK1, strlen(BLOCK1));
    ds4_rendered_free(&r);
    json_decref(calls);
    assert_int_equal(rc.replayed, 2);
    assert_int_equal(rc.canonical, 4);
    s.o.exact_replay = false;
    assert_int_equal(replays(&rc, "[" FA("call_c") "]", NULL), 0);
    /* Ids restored one at a time (from disk) still replay a shared block. */
    s.o.exact_replay = true;
    toolmem_put(s.tools, "call_x", BLOCK2, strlen(BLOCK2));
    toolmem_put(s.tools, "call_y", BLOCK2, strlen(BLOCK2));
    assert_int_equal(replays(&rc, "[" FA("call_x") "," GB("call_y") "]", BLOCK2), 1);
    /* Beyond 5 ids the least recently used goes: call_b (call_a was read). */
    assert_int_equal(toolmem_count(s.tools), 5);
    assert_null(toolmem_get(s.tools, "call_b", &n));
    free(toolmem_get(s.tools, "call_a", &n));
    /* Entries whose block occurs in a text (for KVC trailers). */
    const char *text = "prompt" BLOCK1 "<｜end▁of▁sentence｜>";
    size_t count;
    ds4_kvc_tool *t = toolmem_entries_in(s.tools, text, strlen(text), &count);
    assert_int_equal(count, 1);
    assert_memory_equal(t[0].id, "call_c", 6);
    toolmem_entries_free(t, count);
    toolmem_free(s.tools);
    /* The byte cap. */
    s.tools = toolmem_new(100, strlen(BLOCK2) + 20);
    toolmem_put(s.tools, "call_1", BLOCK2, strlen(BLOCK2));
    toolmem_put(s.tools, "call_2", BLOCK2, strlen(BLOCK2));
    assert_int_equal(toolmem_count(s.tools), 1);
    assert_null(toolmem_get(s.tools, "call_1", &n));
    toolmem_free(s.tools);
    pthread_mutex_destroy(&s.stats_mu);
}

/* The text-layer hooks the server relies on. */
static int fake_replay(void *ctx, const json_t *calls, ds4_rendered *r, ds4_err *err) {
    (void)err;
    int *n = ctx;
    (*n)++;
    if (json_array_size(calls) != 1) return 0;
    ds4_rendered_trusted(r, "\n\n<SAMPLED>", strlen("\n\n<SAMPLED>"));
    return 1;
}

/* Integers beyond 64 bits and numbers like 1e400 in a tool schema and in
 * tool-call arguments: the request is accepted, and the prompt has them as
 * the official encoder's json.loads/json.dumps write them (one parameter
 * per key, the integer's digits exact, 1e400 as Infinity). */
static void test_big_numbers(void **state) {
    (void)state;
    job *j = ok(&API_CHAT_ADAPTER,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
                "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
                "\"function\":{\"name\":\"f\",\"arguments\":"
                "\"{\\\"id\\\": 123456789012345678901234567890, \\\"x\\\": 1e400, \\\"s\\\": \\\"t\\\"}\"}}]},"
                "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"r\"}],"
                "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                "\"properties\":{\"id\":{\"type\":\"integer\",\"maximum\":-98765432109876543210987654321}}}}}]}");
    ds4_chat_opts o = {.think = DS4_THINK_OFF, .tools = j->req.tools};
    ds4_rendered r = {0};
    ds4_err err = {0};
    if (ds4_chat_render(j->req.messages, &o, &r, &err) != 0) fail_msg("%s", err.msg);
    static const char *const want[] = {
        "\"maximum\": -98765432109876543210987654321}",
        "<｜DSML｜parameter name=\"id\" string=\"false\">123456789012345678901234567890</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"x\" string=\"false\">Infinity</｜DSML｜parameter>\n"
        "<｜DSML｜parameter name=\"s\" string=\"true\">t</｜DSML｜parameter>\n",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (!strstr(r.text.p, want[i])) fail_msg("lacks %s:\n%s", want[i], r.text.p);
    ds4_rendered_free(&r);
    job_unref(j);
    /* What json.loads refuses is still a 400 naming the byte. */
    refused(&API_CHAT_ADAPTER, "{\"messages\": 01}", 400, "at byte 14");
}

static void test_text_hooks(void **state) {
    (void)state;
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"a\","
                              "\"tool_calls\":[{\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"r\"}]",
                              0, NULL);
    int calls = 0;
    ds4_chat_opts o = {.think = DS4_THINK_OFF, .render_calls = fake_replay, .render_calls_ctx = &calls};
    ds4_rendered r = {0};
    ds4_err err = {0};
    assert_int_equal(ds4_chat_render(msgs, &o, &r, &err), 0);
    assert_int_equal(calls, 1);
    if (!strstr(r.text.p, "</think>a\n\n<SAMPLED><｜end▁of▁sentence｜>")) fail_msg("%s", r.text.p);
    assert_null(strstr(r.text.p, "DSML"));

    /* Tokenizing from an offset: at a special token it continues the whole
     * tokenization exactly; inside one it is refused. */
    ds4_tokenizer *t = ds4_tokenizer_new(test_vocab(), &err);
    ds4_tokens all = {0}, tail = {0};
    assert_int_equal(ds4_tokenize_rendered(t, &r, &all, &err), 0);
    const char *eos = strstr(r.text.p, "<｜end▁of▁sentence｜>");
    size_t off = (size_t)(eos - r.text.p);
    assert_int_equal(ds4_tokenize_rendered_from(t, &r, off, &tail, &err), 0);
    assert_true(tail.n < all.n);
    assert_memory_equal(tail.ids, all.ids + (all.n - tail.n), tail.n * sizeof(int32_t));
    ds4_tokens_free(&tail);
    assert_int_equal(ds4_tokenize_rendered_from(t, &r, off + 3, &tail, &err), -1);
    assert_non_null(strstr(err.msg, "inside a special token"));
    assert_int_equal(ds4_tokenize_rendered_from(t, &r, r.text.len, &tail, &err), 0);
    assert_int_equal(tail.n, 0);
    ds4_tokens_free(&tail);
    ds4_tokens_free(&all);
    ds4_tokenizer_free(t);
    ds4_rendered_free(&r);
    json_decref(msgs);

    /* Parser position: text, markup (greedy), value, then the closed block. */
    ds4_dsml_parser *p = ds4_dsml_parser_new(false, NULL, NULL, &err);
    struct {
        const char *piece;
        ds4_dsml_position want;
        int closed;
    } steps[] = {
        {"Sure.", DS4_DSML_AT_TEXT, 0},
        {"\n\n<｜DSML｜tool_calls>\n", DS4_DSML_AT_MARKUP, 0},
        {"<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"k\" string=\"true\">", DS4_DSML_AT_VALUE, 0},
        {"some value", DS4_DSML_AT_VALUE, 0},
        {"</｜DSML｜parameter>\n</｜DSML｜invoke>\n", DS4_DSML_AT_MARKUP, 0},
        {"</｜DSML｜tool_calls>", DS4_DSML_AT_TEXT, 1},
    };
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        assert_int_equal(ds4_dsml_feed(p, steps[i].piece, strlen(steps[i].piece), &err), 0);
        assert_int_equal(ds4_dsml_position_of(p), steps[i].want);
        assert_int_equal(ds4_dsml_blocks_closed(p), steps[i].closed);
    }
    ds4_dsml_parser_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_request),       cmocka_unit_test(test_thinking_mapping),
        cmocka_unit_test(test_chat_refusals),      cmocka_unit_test(test_responses_request),
        cmocka_unit_test(test_anthropic_request),  cmocka_unit_test(test_answers),
        cmocka_unit_test(test_error_shapes),       cmocka_unit_test(test_tool_memory),
        cmocka_unit_test(test_text_hooks),         cmocka_unit_test(test_big_numbers),
        cmocka_unit_test(test_new_request_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
