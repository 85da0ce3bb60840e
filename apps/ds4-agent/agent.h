/*
 * agent.h - ds4-agent's core: the conversation with the model, the turn
 * loop, and the channel to the terminal (docs/AGENT.md).
 *
 * Two threads.  The UI thread (tui.c, or line mode without a terminal)
 * owns the terminal: it reads prompts, keeps the queue, draws the output
 * and the status footer.  The worker thread (worker.c) owns the model and
 * the tools: it takes prompts and commands from the queue and runs them.
 * They meet in an agent_link (link.c): output bytes, status, prompt queue,
 * the interrupt flag and yes/no questions, under one mutex.
 *
 * The model is behind agent_model (model_ops): local.c runs the engine in
 * this process, the transcript being the exact token list the live KV
 * holds; remote.c drives a ds4-server over HTTP, the transcript being the
 * message list it sends.  turn.c is the loop both share: user message ->
 * assistant round -> tool calls -> tool results -> next round, with
 * compaction when the context fills up.
 */
#ifndef DS4_AGENT_AGENT_H
#define DS4_AGENT_AGENT_H

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "options.h"
#include "text/dsml_parse.h"
#include "text/strbuf.h"

/* Limits of docs/AGENT.md. */
#define AGENT_RESULT_RESERVE       1024u /* tokens kept free after a tool result */
#define AGENT_COMPACT_SOFT_PERCENT 85u
#define AGENT_COMPACT_MIN_FREE     8192u
#define AGENT_COMPACT_SUMMARY_MAX  4096u
#define AGENT_COMPACT_TAIL_CAP     50000u /* verbatim tail: ctx / 10, at most this */

/* ------------------------------------------------------------ status */

typedef enum agent_state {
    ST_IDLE,
    ST_PREFILL,
    ST_GENERATING,
    ST_TOOL,
    ST_COMPACTING,
    ST_SAVING,
    ST_LOADING,
    ST_ERROR,
    ST_INTERRUPTED,
} agent_state;

typedef struct agent_status {
    agent_state state;
    uint32_t ctx_used, ctx_size;
    uint32_t done, total; /* prefill progress */
    uint32_t generated;
    double tps;
    char detail[300]; /* error text, running tool */
} agent_status;

/* ------------------------------------------------------------ link */

typedef struct agent_link agent_link;

agent_link *link_new(void);
void link_free(agent_link *l);

/* Worker -> UI output (already styled). */
void link_write(agent_link *l, const char *s, size_t n);
/* UI: move the pending output into out; returns bytes moved. */
size_t link_take_output(agent_link *l, ds4_strbuf *out);
/* Readable when output, status or a question changed (UI polls it). */
int link_wake_fd(const agent_link *l);
void link_drain_wake(agent_link *l);

void link_set_status(agent_link *l, const agent_status *st);
void link_update(agent_link *l, agent_state state, uint32_t done, uint32_t total);
void link_set_ctx(agent_link *l, uint32_t used, uint32_t size);
void link_set_gen(agent_link *l, uint32_t generated, double tps);
void link_set_detail(agent_link *l, const char *detail);
agent_status link_status(agent_link *l);

/* The prompt queue: prompts and commands typed while the worker is busy,
 * run in order.  pop blocks until an item or link_stop; NULL after stop. */
void link_queue_push(agent_link *l, const char *text);
char *link_queue_pop(agent_link *l);
/* Without waiting: NULL when empty. */
char *link_queue_try_pop(agent_link *l);
/* Ctrl+X: the first queued item back (caller frees), NULL when none. */
char *link_queue_take_back(agent_link *l);
size_t link_queue_len(agent_link *l);
/* Copy of the first queued item for the footer (caller frees). */
char *link_queue_peek(agent_link *l);
/* True when a queued user prompt (not a command) waits: the current tool
 * round is closed without running its calls. */
bool link_prompt_waiting(agent_link *l);
void link_stop(agent_link *l);
bool link_stopped(agent_link *l);

/* Busy flag: the worker is running an item. */
void link_set_busy(agent_link *l, bool busy);
bool link_busy(agent_link *l);

/* Interrupt the running generation, prefill, tool wait or compaction. */
void link_interrupt(agent_link *l);
void link_clear_interrupt(agent_link *l);
bool link_interrupted(agent_link *l);
volatile sig_atomic_t *link_cancel_flag(agent_link *l);

/* Questions to the user (permission prompts, "save?").  The worker asks
 * and blocks; the UI shows the question and answers with one of the
 * choice characters, or 0 (declined: Ctrl+C, ESC).  -1: nobody can answer
 * (no terminal, shutting down). */
int link_ask(agent_link *l, const char *question, const char *choices);
/* UI side: copy the pending question (false when none). */
bool link_question(agent_link *l, char *buf, size_t n, char *choices, size_t cn);
void link_answer(agent_link *l, int choice);
/* No UI will ever answer (line mode without a terminal): questions get 0. */
void link_set_no_ui(agent_link *l, bool no_ui);

/* ------------------------------------------------------------ display */

typedef enum out_style {
    OUT_TEXT,
    OUT_THINK,  /* reasoning: grey */
    OUT_TOOL,   /* a tool call header */
    OUT_ARG,    /* a tool argument being streamed (the bash command) */
    OUT_RESULT, /* tool output shown to the user: dim */
    OUT_DEL,    /* diff: removed lines */
    OUT_ADD,    /* diff: added lines */
    OUT_ERROR,
    OUT_INFO,    /* agent messages */
    OUT_ECHO,    /* the submitted prompt */
    OUT_COMPACT, /* COMPACTING marker */
} out_style;

typedef struct display display;

display *display_new(agent_link *l, bool color);
void display_free(display *d);
/* A model round starts: reset markdown, thinking and tool-view state. */
void display_round_begin(display *d);
/* What the model streams (reasoning, content, tool calls). */
void display_event(display *d, const ds4_dsml_event *ev);
/* The round ended: flush held markdown, close the line. */
void display_round_end(display *d);
void display_write(display *d, out_style st, const char *s, size_t n);
void display_printf(display *d, out_style st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Start output on a fresh line. */
void display_newline(display *d);
/* A unified-style view of a replacement: "- old" and "+ new" lines. */
void display_diff(display *d, const char *old, size_t on, const char *nw, size_t nn, int first_line);

/* ------------------------------------------------------------ hooks */

typedef struct agent_hooks {
    /* Tests only: what the next model round produces.  Local model: the
     * exact text to force, tokenized with its special tokens (a round that
     * does not end in <｜end▁of▁sentence｜> or a closed tool-call block goes
     * on sampling); remote: the X-DS4-Test-Output name.  NULL: sample. */
    const char *(*script_next)(void *ctx);
    void *script_ctx;
} agent_hooks;

/* ------------------------------------------------------------ model */

typedef struct agent_model agent_model;

/* What a model round streams back while it runs. */
typedef struct gen_hooks {
    void *ctx;
    void (*event)(void *ctx, const ds4_dsml_event *ev);
    void (*prefill)(void *ctx, uint32_t done, uint32_t total);
    void (*generated)(void *ctx, uint32_t n, double tps);
} gen_hooks;

typedef enum round_end {
    ROUND_ANSWER,    /* a plain answer (end of turn) */
    ROUND_CALLS,     /* a complete tool-call block */
    ROUND_BAD_CALLS, /* malformed DSML, DSML inside <think>: error holds why */
    ROUND_LENGTH,    /* -n tokens or a full context */
    ROUND_INTERRUPTED,
} round_end;

typedef struct round_result {
    round_end end;
    json_t *calls; /* ROUND_CALLS: [{"name", "arguments": object, "id"?}] */
    char error[600];
    uint32_t generated;
} round_result;

/* A saved session, for /list and /switch. */
typedef struct session_info {
    char id[41]; /* hex SHA1: the file name without extension */
    char path[1280];
    uint64_t mtime; /* last used, Unix seconds */
    uint32_t tokens;
    uint64_t bytes;
    char kind[24];  /* "session", or who wrote it ("server cold", ...) */
    char title[80]; /* first user message */
} session_info;

typedef struct model_ops {
    const char *name;
    uint32_t (*ctx)(agent_model *m);
    /* Tokens the conversation holds now (remote: as last reported). */
    uint32_t (*used)(agent_model *m);
    /* Back to the system prompt only (/new). */
    int (*reset)(agent_model *m, ds4_err *err);
    /* Append user text.  After tool results (an open user turn) it joins
     * that turn, as the official encoder does. */
    int (*add_user)(agent_model *m, const char *text, ds4_err *err);
    /* Append tool results (a JSON array of strings, one per call). */
    int (*add_results)(agent_model *m, const json_t *results, ds4_err *err);
    /* Tokens add_results would add. */
    int (*cost)(agent_model *m, const json_t *results, uint32_t *tokens, ds4_err *err);
    /* One assistant round: prefill what is new, generate, stop at a closed
     * tool-call block.  The transcript holds the round afterwards. */
    int (*round)(agent_model *m, const gen_hooks *h, round_result *out, ds4_err *err);
    /* Compaction: ask for a summary without changing the transcript ... */
    int (*summarize)(agent_model *m, const char *request, uint32_t max_tokens, const gen_hooks *h, ds4_strbuf *summary,
                     ds4_err *err);
    /* ... and rebuild it as system prompt + summary + recent tail. */
    int (*rebuild)(agent_model *m, const char *summary, uint32_t tail_budget, uint32_t *tail_tokens, ds4_err *err);
    /* Sessions. */
    int (*save)(agent_model *m, char id[41], uint32_t *tokens, ds4_err *err);
    int (*list)(agent_model *m, session_info **out, size_t *n, display *d, ds4_err *err);
    int (*load)(agent_model *m, const session_info *s, ds4_err *err);
    /* The conversation as OpenAI-style messages (for /history). */
    json_t *(*messages)(agent_model *m, ds4_err *err);
    /* True once the transcript has a user turn. */
    bool (*has_user)(agent_model *m);
    /* Tokens prefilled since the start (remote: 0, the server counts). */
    uint64_t (*prefilled)(agent_model *m);
    void (*free)(agent_model *m);
} model_ops;

struct agent_model {
    const model_ops *ops;
};

/* local.c: the engine in this process. */
agent_model *local_model_new(const agent_opts *o, const agent_hooks *h, agent_link *l, display *d, FILE *trace,
                             ds4_err *err);
/* remote.c: a ds4-server over HTTP. */
agent_model *remote_model_new(const agent_opts *o, const agent_hooks *h, agent_link *l, display *d, FILE *trace,
                              ds4_err *err);

/* The system prompt's instructions (prompt.c): the built-in text plus -sys
 * text, and the tool list in OpenAI form (tools.c). */
char *agent_system_text(const agent_opts *o);
json_t *agent_tool_schemas(void);

/* Sessions shared by both models (sessions.c). */
int sessions_resolve(const session_info *s, size_t n, const char *prefix, size_t *which, ds4_err *err);
void sessions_sort_recent(session_info *s, size_t n);
void sessions_print(display *d, const session_info *s, size_t n);
void sessions_history(display *d, const json_t *messages, int n_user_turns);
/* Title: the first line of the first user message, at most 70 characters. */
void sessions_title(const char *text, size_t n, char out[80]);
/* Session directory: --kv-dir or ~/.ds4/kvcache (created, mode 0700). */
char *sessions_dir(const agent_opts *o, ds4_err *err);
/* Ids of the sessions in dir starting with prefix, most recent first, for
 * Tab completion (reads only file names and headers: safe from the UI
 * thread).  Caller frees each and the array. */
char **sessions_complete(const char *dir, const char *prefix, size_t *n);

/* Trace lines (--trace): "[HH:MM:SS.mmm] what", escaped text. */
void trace_line(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void trace_text(FILE *f, const char *label, const char *s, size_t n);

/* ------------------------------------------------------------ the agent */

typedef struct agent agent;

agent *agent_new(const agent_opts *o, agent_model *m, agent_link *l, display *d, FILE *trace, ds4_err *err);
void agent_free(agent *a);

/* Bring the model to the system prompt (its KV file, else a prefill). */
int agent_start(agent *a);
/* One user prompt: rounds until a plain answer, an error or an interrupt. */
int agent_turn(agent *a, const char *text);
/* A line starting with '/': true when it was a command (quit is set for
 * /quit and /exit, which the UI handles). */
bool agent_command(agent *a, const char *line, bool *quit);
/* Save now (deferred /save runs here at the next safe point). */
int agent_save(agent *a);
void agent_request_save(agent *a);
bool agent_take_save_request(agent *a);
bool agent_dirty(agent *a);

/* worker.c: the worker thread around an agent. */
typedef struct worker worker;
/* One queued item: a prompt ("//x" sends the text "/x"), or a command. */
void worker_item(agent *a, agent_link *l, const char *item, bool *quit);
worker *worker_start(agent *a, agent_link *l, ds4_err *err);
void worker_join(worker *w);

#endif
