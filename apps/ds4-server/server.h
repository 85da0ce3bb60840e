/*
 * server.h - ds4-server's shared types: options, the internal request every
 * API is parsed into, the job that carries it from a connection thread to
 * the worker and the answer back, and the interface of the four API
 * adapters (the APIs ds4's server offers).
 *
 * The pipeline:
 *   connection thread (http.c)   check the headers (host, key, method,
 *                                type, size), read the body, let the
 *                                adapter parse it (request.c + one file
 *                                per API), render + tokenize it
 *                                (render.c), enqueue a job (worker.c)
 *   scheduler (worker.c)         --parallel sessions, one thread each, whose
 *                                backend rows run together in the engine
 *                                batcher's steps (engine/batcher.h); a
 *                                queued job goes to the free session that
 *                                holds the most of its prompt (its own
 *                                conversation, else an empty one, else the
 *                                least recently used, whose state goes to
 *                                the disk cache first)
 *   session thread (worker.c)    choose the KV reuse for its session (live
 *                                tokens, live text, disk, cold), prefill,
 *                                generate (constrain.c restricts
 *                                the tokens for tool_choice and JSON
 *                                answers); each piece of output goes
 *                                through output.c (DSML parser, stop
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
#include <stdio.h>

#include "engine/cli.h"
#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/sampler.h"
#include "text/chat.h"
#include "text/rendered.h"
#include "text/strbuf.h"
#include "text/tokenizer.h"
#include "text/tokens.h"

#define DS4_MODEL_ID      "deepseek-v4-flash"
#define DS4_MODEL_CREATED 1767225600
#define MAX_STOP          16
#define MAX_JSON_DEPTH    256

typedef struct srv_opts {
    const char *model_path;
    const char *backend;
    int n_threads;
    ds4_dist_opts dist; /* under mpirun: this rank's stage (docs/DISTRIBUTED.md) */
    uint32_t tensor_parallel; /* --tensor-parallel: GPUs each layer is split over (1: none) */
    bool warm_weights;
    bool no_sim;                /* low-precision simulations off */
    uint64_t gpu_mem;           /* --gpu-mem (0: the GPU's free memory) */
    int host_mapped;            /* --host-mapped (ds4_backend_opts.host_mapped) */
    const char *expert_profile; /* --expert-profile */
    ds4_cli_steer steer;        /* directional steering: the file and the default scales */
    const char *chdir_to;
    ds4_cli_mtp mtp; /* MTP speculative decoding: on whenever the model has a block */
    uint32_t ctx;
    uint32_t default_max_tokens;
    const char *host;
    int port;
    bool cors;
    const char *trace_path;
    const char *api_key;
    int queue_max;
    uint32_t parallel;     /* sessions at once */
    uint64_t kv_mem_mb;    /* --kv-mem-mb: the sessions' memory (0: 3/4 of what is free) */
    bool parallel_given;   /* else sized from the memory */
    uint32_t batch_tokens; /* rows a batched step may run; 0: the backend's prefill chunk */
    float pace_stretch;    /* --pace-stretch (engine/pace.h; 0: no pacing) */
    int grow_wait_s;       /* --grow-wait: how long a session that must grow waits for memory */
    uint64_t max_body;
    int max_connections;
    int connection_timeout_s;
    int sse_keepalive_ms;
    int header_timeout_s;      /* headers complete within this after the connection opens */
    int body_timeout_s;        /* body complete within this after the headers */
    const char *allowed_hosts; /* Host header allow-list, comma-separated; NULL: the default */
    /* disk KV cache */
    const char *kv_dir;
    uint64_t kv_space_mb;
    ds4_kvc_policy kv_policy;
    bool kv_reject_different_quant;
    /* tool calls */
    bool exact_replay;
    uint32_t tool_memory_max_ids;
    /* sampling */
    bool client_sampling_in_thinking;
    /* tests */
    const char *test_force_output;
} srv_opts;

typedef enum api_kind { API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES } api_kind;

/* An error answer: HTTP status and the fields of the API's error shape. */
typedef struct api_error {
    int status;
    const char *type; /* NULL: chosen from the status */
    const char *param;
    const char *code;
    char message[1300];
    long n_prompt, n_ctx; /* context_length_exceeded */
} api_error;

int api_fail(api_error *e, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A JSON string of s[0..n), invalid UTF-8 replaced by U+FFFD. */
json_t *json_utf8(const char *s, size_t n);

/* tool_choice, the same in every API. */
typedef enum tool_choice {
    TOOL_AUTO = 0,
    TOOL_NONE,     /* no tools in the prompt, no tool call in the answer */
    TOOL_REQUIRED, /* the answer starts with a call of one of the tools */
    TOOL_NAMED,    /* ... of this tool */
} tool_choice;

typedef struct jschema jschema; /* constrain.h */
typedef struct cvocab cvocab;

/* What every API is parsed into. */
typedef struct srv_request {
    api_kind api;
    char *model;      /* echoed back */
    json_t *messages; /* OpenAI-style messages for the chat renderer */
    json_t *tools;    /* OpenAI-style tool list, NULL when none (or tool_choice none) */
    ds4_think_mode think;
    ds4_sampler_params sp;
    uint32_t max_tokens; /* 0: the server default */
    char *stop[MAX_STOP];
    int n_stop;
    bool stream;
    bool include_usage;     /* OpenAI stream_options.include_usage */
    bool reasoning_summary; /* Responses: emit reasoning items */
    bool raw_text;          /* completions: answer with the raw generated text */
    char *force_name;       /* test hook: X-DS4-Test-Output */
    tool_choice tool_choice;
    char *tool_name;                    /* TOOL_NAMED: the tool's name in the prompt */
    bool serial_calls;                  /* parallel_tool_calls false: at most one call per turn */
    json_t *response_format;            /* shown to the model in the system prompt (official "## Response Format") */
    jschema *schema;                    /* the answer is JSON of this schema (constrained decoding), NULL: free */
    int logprobs;                       /* -1: none; else how many top alternatives per token (0..20) */
    json_t *tool_kinds;                 /* Responses: prompt name -> {"type", "name", "namespace"} of custom,
                               * namespaced and tool_search tools; NULL when none */
    float steer_ffn, steer_attn;        /* the dir_steering extension field's scales ... */
    bool steer_ffn_set, steer_attn_set; /* ... where given (else the server's) */
} srv_request;

void srv_request_free(srv_request *r);

typedef enum ev_kind { EV_REASONING, EV_THINK_END, EV_CONTENT, EV_CALL_START, EV_CALL_ARGS, EV_CALL_END } ev_kind;

typedef struct gen_call {
    char id[48];
    char *name;
    ds4_strbuf args;
    bool complete; /* its invoke closed (only complete calls are answered) */
} gen_call;

/* logprobs of one answer token: its own and the most likely ones, under
 * the model's distribution (the logits before sampling settings). */
#define MAX_TOP_LOGPROBS 20
typedef struct tok_logprob {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[MAX_TOP_LOGPROBS];
    float top_lp[MAX_TOP_LOGPROBS];
} tok_logprob;

/* The parsed answer, filled as generation goes. */
typedef struct gen_out {
    ds4_strbuf reasoning, content, raw;
    gen_call *calls;
    size_t n_calls;
    tok_logprob *lp;      /* answer (content) tokens, when the request asked */
    size_t n_lp, lp_sent; /* lp_sent: already streamed */
    bool think_closed;
    const char *finish;   /* "stop", "length", "tool_calls", "error" */
    bool memory_cut;      /* "length" because its session could not grow (scheduler.c: sched_grow) */
    const char *stop_hit; /* the stop sequence that ended it, or NULL */
    char error[1200];
    uint32_t prompt_tokens, cached_tokens, written_tokens, completion_tokens;
    const ds4_vocab *vocab; /* for the logprobs' token texts */
} gen_out;

typedef struct job job;
typedef struct server server;
typedef struct sched sched;               /* worker.c */
typedef struct cont_binding cont_binding; /* continuation.c */

/* The renderer's tool-call hook context (toolmem_render_calls). */
typedef struct render_calls_ctx {
    server *s;
    uint32_t replayed, canonical;
} render_calls_ctx;

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
    const char *name;      /* for logs and traces */
    bool anthropic_errors; /* error shape */
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
    int seq;   /* Responses sequence_number */
    int block; /* Anthropic: index of the open block, -1 none */
    int next_block;
    int block_kind; /* what the open block/item holds */
    int item;       /* Responses output_index of the open item */
    int next_item;
    bool text_started, role_sent, any_call_streamed;
    char msg_item_id[40], rs_item_id[40];
    int call_item[64]; /* Responses output index of each call */
} stream_state;

struct job {
    const api_adapter *api;
    srv_request req;
    ds4_rendered rendered;
    ds4_tokens tokens; /* the rendered prompt, tokenized */
    char id[48];       /* chatcmpl-..., resp_..., msg_... */
    long created;
    double t_enqueued;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    ds4_strbuf sse; /* streaming bytes not yet sent */
    size_t sse_pos;
    bool started; /* the worker took it */
    bool done;
    int status; /* non-streaming answer */
    json_t *body;
    volatile sig_atomic_t cancel;
    uint64_t cancel_step; /* the batched steps run when it was cancelled */
    double t_cancel;      /* and when */
    double t_started;     /* a session took it */

    /* Set when it is queued (worker_enqueue) and given a session: the
     * output it may generate (its max_tokens, or the server's default
     * clamped to the sessions' memory), and the tokens its session holds
     * for it to start with (scheduler.c admission; it grows from there as
     * the answer needs, sched_grow). */
    uint32_t max_out;
    uint32_t cap;

    gen_out out;
    stream_state ss;
    char reuse[24]; /* KV source: responses-visible, ..., memory-token, memory-text, disk, cold */
    cont_req cont;
    render_calls_ctx calls; /* how its history's tool-call turns rendered */
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

/* logprobs as OpenAI spells them: chat and Responses entries
 * ({token, logprob, bytes, top_logprobs}) for o->lp[from, to); the
 * completions object for the same range. */
json_t *logprobs_entries(const gen_out *o, size_t from, size_t to);
json_t *logprobs_completions(const gen_out *o, size_t from, size_t to, size_t text_offset);

/* Usage objects. */
json_t *usage_openai(const gen_out *o);
json_t *usage_responses(const gen_out *o);
json_t *usage_anthropic(const gen_out *o);

/* request.c: field parsing shared by the adapters. */
int req_sampling(const json_t *body, srv_request *r, bool with_min_p_seed, api_error *e);
/* The dir_steering extension field (docs/SERVER.md): {"ffn": F, "attn": F},
 * either optional, each in -100..100. */
int req_steering(const json_t *body, srv_request *r, api_error *e);
int req_max_tokens(const json_t *body, const char *const *names, srv_request *r, api_error *e);
int req_stop(const json_t *v, const char *field, srv_request *r, api_error *e);
int req_bool(const json_t *body, const char *field, bool *out, api_error *e);
int req_effort(const char *effort, const char *field, ds4_think_mode *out, api_error *e);
/* tool_choice for the request's tools (r->tools already parsed): none
 * drops them, required and named need them (a named tool must be one). */
int req_tool_choice(srv_request *r, tool_choice c, const char *name, const char *field, api_error *e);
/* A JSON answer: `schema` (NULL: any JSON object), shown to the model as
 * `shown`; a schema this server cannot enforce is refused naming `field`. */
int req_json_answer(srv_request *r, const json_t *schema, const json_t *shown, const char *field, api_error *e);
/* logprobs: top alternatives per token, 0..20 (the field names the limit). */
int req_logprobs(srv_request *r, const json_t *top, const char *field, int max, api_error *e);
/* Last step of every adapter's parse: NUL escaping, the response format
 * in the system prompt. */
int req_finalize(srv_request *r, api_error *e);
int req_thinking_field(const json_t *v, const char *field, int *out, api_error *e);
void req_model(const json_t *body, srv_request *r, int explicit_think);
/* Text of a content value: a string, or parts whose texts are
 * concatenated: text parts of every API, images, audio and files as a
 * placeholder (req_placeholder), anything else refused.  req_part does one
 * part (a string or an object; `i` is its index, for messages). */
int req_text(const json_t *v, const char *field, ds4_strbuf *out, api_error *e);
int req_part(const json_t *p, const char *field, size_t i, ds4_strbuf *out, api_error *e);
const char *req_placeholder(const char *type); /* NULL: not a media type */
/* Every string in v with a NUL gets it written as \u0000 (in place). */
void req_escape_nul(json_t *v);
json_t *req_openai_tool(const char *name, const json_t *description, const json_t *parameters);
/* The body as a JSON object, within the limits (UTF-8, nesting, values,
 * parse memory: 400 or 413).  req_json_limits_install makes jansson count
 * the parse's memory (once, at startup). */
json_t *req_load_json(const char *body, size_t n, api_error *e);
void req_json_limits_install(void);

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
/* The chat renderer hook (ds4_chat_opts.render_calls; ctx: a
 * render_calls_ctx) for a client's conversation, counting the assistant
 * tool-call turns rendered from the memory and canonically; the _quiet one
 * for the server's own renderings of a finished answer (continuation.c),
 * which count nothing. */
int toolmem_render_calls(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err);
int toolmem_render_calls_quiet(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err);

/* Tool-call turns of the history of queued requests (/v1/ds4/stats). */
typedef struct replay_stats {
    uint64_t replayed, canonical;
} replay_stats;

/* Tokenizers for the connection threads (render.c): each holds per-thread
 * scratch space, so a thread borrows one. */
typedef struct render_pool {
    pthread_mutex_t mu;
    ds4_tokenizer *t[8]; /* each holds a BPE cache of up to ~9 MB */
    int n;
} render_pool;

/* --trace FILE (trace.c): entries from different threads written whole. */
typedef struct trace_log {
    FILE *f;
    pthread_mutex_t mu;
} trace_log;

/* The running server: everything its threads share, passed explicitly. */
struct server {
    srv_opts o;
    ds4_engine *engine;
    toolmem *tools;
    replay_stats replay;
    pthread_mutex_t stats_mu;
    json_t *forced;           /* --test-force-output: name -> text */
    bool memory_checkpoint;   /* snapshot each prompt after its prefill */
    struct http_server *http; /* http.c */
    sched *sched;             /* worker.c */
    render_pool tokenizers;   /* render.c */
    trace_log trace;          /* trace.c */
    /* the live continuation of each session (continuation.c), under cont_mu */
    cont_binding *bindings;
    uint32_t n_bindings;
    pthread_mutex_t cont_mu;
    size_t max_token_bytes; /* the vocabulary's longest token, for the cheap context bound */
    cvocab *cvocab;         /* the vocabulary for constrained decoding */
    volatile sig_atomic_t stopping;
    volatile sig_atomic_t shutdown_done; /* the shutdown thread has finished (main.c) */
};

/* render.c: messages -> rendered prompt -> tokens (connection thread).
 * render_request refuses a prompt that does not fit the context (400
 * context_length_exceeded); render_count counts any prompt that could. */
int render_request(server *s, job *j, api_error *e);
int render_count(server *s, job *j, api_error *e);
ds4_chat_opts render_opts(server *s, const job *j, render_calls_ctx *calls);
ds4_tokenizer *render_tokenizer_borrow(server *s, ds4_err *err);
void render_tokenizer_return(server *s, ds4_tokenizer *t);
void render_pool_init(server *s);
void render_pool_free(server *s);

/* continuation.c: live protocol continuations (rungs 1-3 of the KV reuse
 * ladder, worker.c), one binding per session (s->bindings, under
 * s->cont_mu).  cont_prepare runs in the connection thread after
 * render_request: tool outputs with ids no binding knows are refused (400),
 * a tool-output-only request gets its tail tokens.  The scheduler asks
 * cont_affinity which session a job continues; the session's thread asks
 * cont_match first in its reuse ladder, calls cont_leave once the session
 * moves on, and cont_remember after each answer. */
int cont_prepare(server *s, job *j, api_error *e);
void cont_req_free(cont_req *c); /* common.c, with the job */
int cont_bindings_new(server *s, uint32_t n, ds4_err *err);
void cont_bindings_free(server *s);
cont_binding *cont_binding_at(server *s, uint32_t i);
/* 2: the job is a tool-output-only request for exactly this binding's
 * calls, 1: a Responses request that replays its visible transcript, 0:
 * neither. */
int cont_affinity(server *s, const cont_binding *b, const job *j);
/* 1 matched (prompt, kept, source set), 0 no live continuation, -1 the
 * request needs one that is gone (e holds the 409). */
int cont_match(server *s, cont_binding *b, const job *j, const int32_t *live, uint32_t n_live, ds4_tokenizer *t,
               ds4_tokens *prompt, uint32_t *kept, const char **source, api_error *e);
void cont_leave(server *s, cont_binding *b);
/* Log the Responses replay of a tool-call turn whose hidden reasoning no
 * live continuation restored. */
void cont_warn_lost_reasoning(const job *j, const char *source);
/* After an answer: `live`/`n_live` the session, `last` the last token
 * handed out and whether the session still lacks it. */
void cont_remember(server *s, cont_binding *b, const job *j, const int32_t *live, uint32_t n_live, int32_t last,
                   bool last_pending);
/* Canonicalization (chat/completions, Anthropic): the tokens and text of
 * the prompt plus the answer as the client replays it, reasoning included,
 * up to its EOS (excluded); -1 when it does not render as a continuation
 * of the prompt.  cont_rebind moves a live binding to a rewritten session. */
int cont_canonical(server *s, const job *j, ds4_tokenizer *t, ds4_strbuf *text, ds4_tokens *out);
void cont_rebind(server *s, cont_binding *b, const int32_t *live, uint32_t n_live);

/* worker.c: the sessions (--parallel, checked against the memory) and
 * their threads, the queue, the scheduler. */
int worker_start(server *s, ds4_err *err);
/* 0 queued; else -1 with e the answer: the queue full (429), shutting
 * down (503), a request whose session could never fit the sessions'
 * memory (400, the bytes needed and available). */
int worker_enqueue(server *s, job *j, api_error *e);
void worker_stop(server *s); /* finish the queue, save the live sessions */
json_t *worker_stats(server *s);
/* A client went away: its job stops at the next step (or is skipped). */
void job_cancel(server *s, job *j);

/* http.c */
int http_start(server *s, ds4_err *err);
void http_stop(server *s);

/* trace.c */
int trace_open(trace_log *t, const char *path, ds4_err *err);
void trace_close(trace_log *t);
void trace_request(trace_log *t, const job *j, const char *raw_body, size_t n);
void trace_decision(trace_log *t, const job *j, const char *what);
void trace_result(trace_log *t, const job *j);

/* Logging to stderr with a timestamp and a category. */
void srv_log(const char *cat, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
