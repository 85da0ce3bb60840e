/*
 * server.h - ds4-server's shared types: options, the internal request every
 * API is parsed into, the job that carries it from a connection thread to
 * the worker and the answer back, and the interface of the four API
 * adapters (the APIs ds4's server offers).
 *
 * The pipeline:
 *   connection thread (http.c)   read the body, check auth and limits, let
 *                                the adapter parse it (request.c + one
 *                                file per API), render + tokenize it
 *                                (render.c), enqueue a job (worker.c)
 *   worker thread (worker.c)     owns the engine session: choose the KV
 *                                reuse (live tokens, live text, disk, cold),
 *                                prefill, generate; each piece of output
 *                                goes through output.c (DSML parser, stop
 *                                sequences, tool-call ids) to the adapter,
 *                                which writes SSE bytes into the job or, at
 *                                the end, the whole JSON answer
 *   connection thread            stream the job's bytes (keepalive comments
 *                                while waiting) or send the final answer;
 *                                a client that goes away cancels the job.
 */
#ifndef DS4_SERVER_SERVER_H
#define DS4_SERVER_SERVER_H

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "text/chat.h"
#include "text/rendered.h"
#include "text/strbuf.h"
#include "text/tokens.h"

#define DS4_MODEL_ID "deepseek-v4-flash"
#define DS4_MODEL_CREATED 1767225600
#define MAX_STOP 16
#define MAX_JSON_DEPTH 256

typedef struct srv_opts {
    const char *model_path;
    const char *backend;
    int n_threads;
    bool warm_weights;
    bool no_sim;                /* low-precision simulations off */
    const char *chdir_to;
    uint32_t ctx;
    uint32_t default_max_tokens;
    const char *host;
    int port;
    bool cors;
    const char *trace_path;
    const char *api_key;
    int queue_max;
    uint64_t max_body;
    int max_connections;
    int connection_timeout_s;
    /* disk KV cache */
    const char *kv_dir;
    uint64_t kv_space_mb;
    ds4_kvc_policy kv_policy;
    bool kv_reject_different_quant;
    /* tool calls */
    bool exact_replay;
    uint32_t tool_memory_max_ids;
    /* tests */
    const char *test_force_output;
} srv_opts;

typedef enum api_kind { API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES } api_kind;

/* An error answer: HTTP status and the fields of the API's error shape. */
typedef struct api_error {
    int status;
    const char *type;    /* NULL: chosen from the status */
    const char *param;
    const char *code;
    char message[1300];
    long n_prompt, n_ctx; /* context_length_exceeded */
} api_error;

int api_fail(api_error *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* What every API is parsed into. */
typedef struct srv_request {
    api_kind api;
    char *model;              /* echoed back */
    json_t *messages;         /* OpenAI-style messages for the chat renderer */
    json_t *tools;            /* OpenAI-style tool list, NULL when none (or tool_choice none) */
    ds4_think_mode think;
    ds4_sampler_params sp;
    uint32_t max_tokens;      /* 0: the server default */
    char *stop[MAX_STOP];
    int n_stop;
    bool stream;
    bool include_usage;       /* OpenAI stream_options.include_usage */
    bool reasoning_summary;   /* Responses: emit reasoning items */
    bool raw_text;            /* completions: answer with the raw generated text */
    char *force_name;         /* test hook: X-DS4-Test-Output */
} srv_request;

void srv_request_free(srv_request *r);

typedef enum ev_kind { EV_REASONING, EV_THINK_END, EV_CONTENT, EV_CALL_START, EV_CALL_ARGS, EV_CALL_END } ev_kind;

typedef struct gen_call {
    char id[48];
    char *name;
    ds4_strbuf args;
} gen_call;

/* The parsed answer, filled as generation goes. */
typedef struct gen_out {
    ds4_strbuf reasoning, content, raw;
    gen_call *calls;
    size_t n_calls;
    bool think_closed;
    const char *finish;       /* "stop", "length", "tool_calls", "error" */
    const char *stop_hit;     /* the stop sequence that ended it, or NULL */
    char error[1200];
    uint32_t prompt_tokens, cached_tokens, written_tokens, completion_tokens;
} gen_out;

typedef struct job job;

/* A Responses / Anthropic request that carries only tool outputs, for the
 * live continuation (continuation.c): the output ids in the order of the
 * live calls and the tokens of the turn they add (the "<｜User｜>" turn
 * with the results and the "<｜Assistant｜>" transition). */
typedef struct cont_req {
    bool tool_only;
    char (*ids)[48];
    size_t n_ids;
    ds4_tokens tail;
} cont_req;

typedef struct api_adapter {
    api_kind kind;
    const char *name;         /* for logs and traces */
    bool anthropic_errors;    /* error shape */
    int (*parse)(const json_t *body, srv_request *req, api_error *e);
    /* Streaming: bytes appended to out. */
    void (*stream_begin)(job *j, ds4_strbuf *out);
    void (*stream_event)(job *j, ev_kind k, int index, const char *text, size_t n, ds4_strbuf *out);
    void (*stream_end)(job *j, ds4_strbuf *out);
    void (*stream_error)(job *j, const char *msg, ds4_strbuf *out);
    /* Non-streaming answer. */
    json_t *(*final_body)(job *j);
} api_adapter;

extern const api_adapter API_CHAT_ADAPTER, API_COMPLETIONS_ADAPTER, API_RESPONSES_ADAPTER, API_MESSAGES_ADAPTER;

/* Per-API streaming state, kept in the job. */
typedef struct stream_state {
    int seq;                  /* Responses sequence_number */
    int block;                /* Anthropic: index of the open block, -1 none */
    int next_block;
    int block_kind;           /* what the open block/item holds */
    int item;                 /* Responses output_index of the open item */
    int next_item;
    bool text_started, role_sent, any_call_streamed;
    char msg_item_id[40], rs_item_id[40];
    int call_item[64];        /* Responses output index of each call */
} stream_state;

struct job {
    const api_adapter *api;
    srv_request req;
    ds4_rendered rendered;
    ds4_tokens tokens;        /* the rendered prompt, tokenized */
    char id[48];              /* chatcmpl-..., resp_..., msg_... */
    long created;
    double t_enqueued;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    ds4_strbuf sse;           /* streaming bytes not yet sent */
    size_t sse_pos;
    bool started;             /* the worker took it */
    bool done;
    int status;               /* non-streaming answer */
    json_t *body;
    volatile sig_atomic_t cancel;

    gen_out out;
    stream_state ss;
    char reuse[24];           /* KV source: responses-visible, ..., memory-token, memory-text, disk, cold */
    cont_req cont;
};

job *job_new(const api_adapter *api);
void job_unref(job *j);
/* Worker side: append SSE bytes / finish, waking the connection thread. */
void job_push(job *j, const ds4_strbuf *bytes);
void job_finish(job *j, int status, json_t *body);

/* Error bodies in each API's shape. */
json_t *api_error_body(const api_adapter *api, const api_error *e);
/* SSE framing. */
void sse_data(ds4_strbuf *out, const char *event, json_t *data); /* steals data */
/* Random ids: prefix + hex digits. */
void random_id(char *out, size_t cap, const char *prefix, int hex_digits);

/* Usage objects. */
json_t *usage_openai(const gen_out *o);
json_t *usage_responses(const gen_out *o);
json_t *usage_anthropic(const gen_out *o);

/* request.c: field parsing shared by the adapters. */
int req_sampling(const json_t *body, srv_request *r, bool with_min_p_seed, api_error *e);
int req_max_tokens(const json_t *body, const char *const *names, srv_request *r, api_error *e);
int req_stop(const json_t *v, const char *field, srv_request *r, api_error *e);
int req_bool(const json_t *body, const char *field, bool *out, api_error *e);
int req_effort(const char *effort, const char *field, ds4_think_mode *out, api_error *e);
int req_thinking_field(const json_t *v, const char *field, int *out, api_error *e);
void req_model(const json_t *body, srv_request *r, int explicit_think);
/* Text of a content value: a string or parts with a text field (others
 * skipped when `strict` is false, refused when true). */
int req_text(const json_t *v, const char *field, bool strict, ds4_strbuf *out, api_error *e);
json_t *req_openai_tool(const char *name, const json_t *description, const json_t *parameters);
/* Body pre-checks: valid UTF-8 (jansson) and nesting depth. */
json_t *req_load_json(const char *body, size_t n, api_error *e);

/* openai_chat.c, shared with the other OpenAI adapters. */
int chat_thinking(const json_t *b, srv_request *r, int *explicit_think, api_error *e);
int chat_common_fields(const json_t *b, srv_request *r, api_error *e);
void openai_stream_error(job *j, const char *msg, ds4_strbuf *out);

/* Tool-call id memory (toolmem.c). */
typedef struct toolmem toolmem;
toolmem *toolmem_new(uint32_t max_ids, uint64_t max_bytes);
void toolmem_free(toolmem *m);
void toolmem_put(toolmem *m, const char *id, const char *dsml, size_t n);
void toolmem_put_many(toolmem *m, const char *const *ids, int n, const char *dsml, size_t len);
/* Copy of the block for an id (caller frees), NULL when unknown. */
char *toolmem_get(toolmem *m, const char *id, size_t *n);
size_t toolmem_count(toolmem *m);
/* Entries whose block occurs in text (for KVC trailers); caller frees with toolmem_entries_free. */
ds4_kvc_tool *toolmem_entries_in(toolmem *m, const char *text, size_t n, size_t *count);
void toolmem_entries_free(ds4_kvc_tool *t, size_t n);
/* The chat renderer hook (ds4_chat_opts.render_calls) for a client's
 * conversation, counted in the replay statistics; the _quiet one for the
 * server's own renderings of a finished answer (continuation.c), which run
 * after the answer is sent and must not move the counters a client reads. */
int toolmem_render_calls(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err);
int toolmem_render_calls_quiet(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err);

typedef struct replay_stats {
    uint64_t replayed, canonical;
} replay_stats;

/* The running server. */
typedef struct server {
    srv_opts o;
    ds4_engine *engine;
    toolmem *tools;
    replay_stats replay;
    pthread_mutex_t stats_mu;
    json_t *forced;            /* --test-force-output: name -> text */
    bool memory_checkpoint;    /* snapshot each prompt after its prefill */
    volatile sig_atomic_t stopping;
} server;

extern server *SRV;

/* render.c: messages -> rendered prompt -> tokens (connection thread). */
int render_request(server *s, job *j, api_error *e);
ds4_chat_opts render_opts(server *s, const job *j);
ds4_tokenizer *render_tokenizer_borrow(const ds4_vocab *v, ds4_err *err);
void render_tokenizer_return(ds4_tokenizer *t);

/* continuation.c: live protocol continuations (rungs 1-3 of the KV reuse
 * ladder, worker.c).  cont_prepare runs in the connection thread after
 * render_request: tool outputs with unknown ids are refused (400), a
 * tool-output-only request gets its tail tokens.  The worker asks
 * cont_match first in its reuse ladder, calls cont_leave once the live
 * session moves on, and cont_remember after each answer. */
int cont_prepare(server *s, job *j, api_error *e);
void cont_req_free(cont_req *c); /* common.c, with the job */
/* 1 matched (prompt, kept, source set), 0 no live continuation, -1 the
 * request needs one that is gone (e holds the 409). */
int cont_match(server *s, const job *j, const int32_t *live, uint32_t n_live, ds4_tokenizer *t, ds4_tokens *prompt,
               uint32_t *kept, const char **source, api_error *e);
void cont_leave(void);
/* Log the Responses replay of a tool-call turn whose hidden reasoning no
 * live continuation restored. */
void cont_warn_lost_reasoning(const job *j, const char *source);
/* After an answer: `live`/`n_live` the session, `last` the last token
 * handed out and whether the session still lacks it. */
void cont_remember(server *s, const job *j, const int32_t *live, uint32_t n_live, int32_t last, bool last_pending);
/* Canonicalization (chat/completions, Anthropic): the tokens and text of
 * the prompt plus the answer as the client replays it, reasoning included,
 * up to its EOS (excluded); -1 when it does not render as a continuation
 * of the prompt.  cont_rebind moves a live binding to a rewritten session. */
int cont_canonical(server *s, const job *j, ds4_tokenizer *t, ds4_strbuf *text, ds4_tokens *out);
void cont_rebind(const int32_t *live, uint32_t n_live);
void cont_free(void);

/* worker.c */
int worker_start(server *s, ds4_err *err);
/* 0 queued; -1 queue full (429); -2 shutting down (503). */
int worker_enqueue(job *j);
void worker_stop(void);         /* finish the queue, save the live session */
json_t *worker_stats(void);
int worker_queue_depth(void);

/* http.c */
int http_start(server *s, ds4_err *err);
void http_stop(void);

/* trace.c */
int trace_open(const char *path, ds4_err *err);
void trace_close(void);
void trace_request(const job *j, const char *raw_body, size_t n);
void trace_decision(const job *j, const char *what);
void trace_result(const job *j);

/* Logging to stderr with a timestamp and a category. */
void srv_log(const char *cat, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
