/*
 * turn.c - the agent: the turn loop, compaction and the session commands
 * (see agent.h and docs/AGENT.md).
 *
 * A turn: the user's text joins the transcript, then model rounds follow
 * one another for as long as each ends in a tool-call block (there is no
 * limit on the number of rounds: the model's answer, an error or the user
 * ends a turn).  After a round with calls, every call of the block runs in
 * order and their results go back as one tool-result turn.  A tool-call
 * block that does not parse, or one written inside the reasoning, gets a
 * tool error back instead, so the model can write it again.  When the user
 * has queued a prompt meanwhile, the calls are answered "not run" and the
 * turn ends, so the prompt is read as soon as possible.
 *
 * Compaction keeps the conversation inside the context: before a user
 * turn or a round, when the transcript holds 85 % of the context or fewer
 * than min(8192, ctx/4) tokens are free (soft trigger), and when a tool
 * result would not fit with 1024 tokens to spare (hard trigger: compact,
 * try again, else the result is replaced by an error saying it was too
 * large).  The model writes a summary (greedy, no thinking, at most 4096
 * tokens) and the transcript becomes system prompt + summary + the most
 * recent user turns verbatim (a tenth of the context, at most 50000
 * tokens); bash jobs still running are announced again.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/generate.h"
#include "tools.h"

struct agent {
    const agent_opts *o;
    agent_model *m;
    agent_link *l;
    display *d;
    FILE *trace;
    tool_env tools;
    bool started;        /* the system prompt is in place */
    bool dirty;          /* changed since the last save or load */
    bool save_requested; /* /save while busy: at the next safe point */
    pthread_mutex_t mu;  /* save_requested and dirty, read by the UI */
};

static const char COMPACT_REQUEST[] =
    "[ds4-agent internal request, not from the user] The context is nearly full. Write a summary of the "
    "conversation so far that lets you carry on the work without it: the user's goals, constraints and "
    "preferences; the files you read or changed (paths, what changed and why); the commands you ran and what "
    "they showed; decisions taken, approaches that failed, problems still open; what is done, what is left, and "
    "the next step. Keep exact paths, line numbers, names and commands. Do not invent anything, do not call "
    "tools, do not go on with the task: write only the summary.";

static uint32_t result_room(void *ctx, const char *text, size_t n);

agent *agent_new(const agent_opts *o, agent_model *m, agent_link *l, display *d, FILE *trace, ds4_err *err) {
    agent *a = calloc(1, sizeof(*a));
    if (!a) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    a->o = o;
    a->m = m;
    a->l = l;
    a->d = d;
    a->trace = trace;
    pthread_mutex_init(&a->mu, NULL);
    if (tools_init(&a->tools, o, l, d, trace, err) != 0) {
        pthread_mutex_destroy(&a->mu);
        free(a);
        return NULL;
    }
    a->tools.room = result_room;
    a->tools.room_ctx = a;
    return a;
}

void agent_free(agent *a) {
    if (!a) return;
    tools_free(&a->tools);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

static void set_dirty(agent *a, bool v) {
    pthread_mutex_lock(&a->mu);
    a->dirty = v;
    pthread_mutex_unlock(&a->mu);
}

bool agent_dirty(agent *a) {
    pthread_mutex_lock(&a->mu);
    bool v = a->dirty;
    pthread_mutex_unlock(&a->mu);
    return v;
}

void agent_request_save(agent *a) {
    pthread_mutex_lock(&a->mu);
    a->save_requested = true;
    pthread_mutex_unlock(&a->mu);
}

bool agent_take_save_request(agent *a) {
    pthread_mutex_lock(&a->mu);
    bool v = a->save_requested;
    a->save_requested = false;
    pthread_mutex_unlock(&a->mu);
    return v;
}

static void show_error(agent *a, const char *what, const ds4_err *err) {
    display_newline(a->d);
    display_printf(a->d, OUT_ERROR, "%s: %s\n", what, err->msg);
    agent_status st = link_status(a->l);
    st.state = ST_ERROR;
    snprintf(st.detail, sizeof(st.detail), "%.*s", (int)sizeof(st.detail) - 1, err->msg);
    link_set_status(a->l, &st);
    if (a->trace) trace_line(a->trace, "error: %s: %s", what, err->msg);
}

static void update_ctx(agent *a) { link_set_ctx(a->l, a->m->ops->used(a->m), a->m->ops->ctx(a->m)); }

/* ------------------------------------------------------------ hooks */

static void h_event(void *ctx, const ds4_dsml_event *ev) { display_event(((agent *)ctx)->d, ev); }

static void h_generated(void *ctx, uint32_t n, double tps) { link_set_gen(((agent *)ctx)->l, n, tps); }

static void h_summary(void *ctx, const ds4_dsml_event *ev) {
    agent *a = ctx;
    if (ev->kind == DS4_DSML_CONTENT) display_write(a->d, OUT_THINK, ev->text, ev->len);
}

/* Tokens a tool result may take (0: it does not fit). */
static uint32_t result_room(void *ctx, const char *text, size_t n) {
    agent *a = ctx;
    json_t *r = json_pack("[s%]", text, n);
    uint32_t cost = 0;
    int rc = r ? a->m->ops->cost(a->m, r, &cost, NULL) : -1;
    json_decref(r);
    uint32_t used = a->m->ops->used(a->m), ctx_n = a->m->ops->ctx(a->m);
    if (rc != 0 || used + cost + AGENT_RESULT_RESERVE >= ctx_n) return 0;
    return ctx_n - used - cost - AGENT_RESULT_RESERVE;
}

/* ------------------------------------------------------------ compaction */

static bool should_compact(agent *a) {
    if (!a->m->ops->has_user(a->m)) return false;
    uint32_t ctx = a->m->ops->ctx(a->m), used = a->m->ops->used(a->m);
    uint32_t min_free = AGENT_COMPACT_MIN_FREE < ctx / 4 ? AGENT_COMPACT_MIN_FREE : ctx / 4;
    return (uint64_t)used * 100 >= (uint64_t)ctx * AGENT_COMPACT_SOFT_PERCENT || ctx - used <= min_free;
}

/* After a failed soft compaction: whether the turn can go on anyway (not
 * when the user interrupted it). */
static bool room_left(agent *a) {
    return !link_interrupted(a->l) && a->m->ops->used(a->m) + 2 * AGENT_RESULT_RESERVE < a->m->ops->ctx(a->m);
}

static int compact(agent *a, const char *reason) {
    uint32_t before = a->m->ops->used(a->m), ctx = a->m->ops->ctx(a->m);
    display_newline(a->d);
    display_write(a->d, OUT_COMPACT, "COMPACTING", 10);
    display_printf(a->d, OUT_INFO, " %s (%u of %u tokens): summarizing the conversation\n", reason, before, ctx);
    if (a->trace) trace_line(a->trace, "compaction: %s, %u tokens", reason, before);
    link_update(a->l, ST_COMPACTING, 0, 0);
    gen_hooks h = {.ctx = a, .event = h_summary, .generated = h_generated};
    ds4_strbuf summary = {0};
    ds4_err err = {0};
    int rc = a->m->ops->summarize(a->m, COMPACT_REQUEST, AGENT_COMPACT_SUMMARY_MAX, &h, &summary, &err);
    display_newline(a->d);
    if (rc == 0 && !summary.len) rc = ds4_err_set(&err, DS4_EFORMAT, "the model wrote an empty summary");
    uint32_t budget = ctx / 10 < AGENT_COMPACT_TAIL_CAP ? ctx / 10 : AGENT_COMPACT_TAIL_CAP, tail = 0;
    if (rc == 0) rc = ds4_strbuf_check(&summary, "summary", &err);
    if (rc == 0) rc = a->m->ops->rebuild(a->m, summary.p, budget, &tail, &err);
    ds4_strbuf_free(&summary);
    if (rc != 0) {
        show_error(a, "compaction failed", &err);
        return -1;
    }
    char *note = jobs_running_note(a->tools.jobs);
    if (note) {
        if (a->m->ops->add_user(a->m, note, &err) != 0) show_error(a, "compaction", &err);
        display_write(a->d, OUT_RESULT, note, strlen(note));
        free(note);
    }
    display_write(a->d, OUT_COMPACT, "COMPACTING", 10);
    display_printf(a->d, OUT_INFO, " done: %u -> %u tokens (the last %u kept verbatim)\n", before,
                   a->m->ops->used(a->m), tail);
    set_dirty(a, true);
    update_ctx(a);
    return 0;
}

/* ------------------------------------------------------------ tools */

static json_t *not_run(size_t n, const char *why) {
    json_t *r = json_array();
    for (size_t i = 0; i < (n ? n : 1); i++) json_array_append_new(r, json_string(why));
    return r;
}

static json_t *run_calls(agent *a, const json_t *calls) {
    json_t *results = json_array();
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *c = json_array_get(calls, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        if (link_interrupted(a->l)) {
            json_array_append_new(results, json_string("Tool call not run: the user interrupted."));
            continue;
        }
        char detail[120];
        snprintf(detail, sizeof(detail), "tool %s", name);
        link_update(a->l, ST_TOOL, 0, 0);
        link_set_detail(a->l, detail);
        if (a->trace) {
            char *args = json_dumps(json_object_get(c, "arguments"), JSON_COMPACT | JSON_ENCODE_ANY);
            trace_line(a->trace, "tool %s %s", name, args ? args : "");
            free(args);
        }
        char *r = tools_run(&a->tools, name, json_object_get(c, "arguments"));
        if (a->trace) trace_text(a->trace, "result", r ? r : "", r ? strlen(r) : 0);
        json_array_append_new(results, json_string_nocheck(r ? r : "Tool error: out of memory"));
        free(r);
    }
    link_set_detail(a->l, "");
    return results;
}

/* Results that do not fit even after compaction become one short error each. */
static json_t *too_large(agent *a, const json_t *results, uint32_t cost) {
    json_t *r = json_array();
    char msg[400];
    snprintf(msg, sizeof(msg),
             "Tool error: the tool result was too large for the context (about %u tokens with %u of %u in use, even "
             "after compaction): ask for less output (a line range, a narrower search, head/tail of a command).",
             cost, a->m->ops->used(a->m), a->m->ops->ctx(a->m));
    for (size_t i = 0; i < json_array_size(results); i++) json_array_append_new(r, json_string(msg));
    return r;
}

static bool fits(agent *a, const json_t *results, uint32_t *cost) {
    if (a->m->ops->cost(a->m, results, cost, NULL) != 0) return false;
    return a->m->ops->used(a->m) + *cost + AGENT_RESULT_RESERVE < a->m->ops->ctx(a->m);
}

/* Add the results of a round, compacting first when they do not fit. */
static int add_results(agent *a, json_t *results) {
    uint32_t cost = 0;
    if (!fits(a, results, &cost)) {
        if (compact(a, "a tool result would not fit") != 0) return -1;
        if (!fits(a, results, &cost)) {
            json_t *r = too_large(a, results, cost);
            json_decref(results);
            results = r;
            display_printf(a->d, OUT_ERROR, "tool result too large (%u tokens): the model gets an error instead\n",
                           cost);
            if (!fits(a, results, &cost)) {
                json_decref(results);
                ds4_err err;
                ds4_err_set(&err, DS4_ERANGE, "the context is full even after compaction");
                show_error(a, "turn stopped", &err);
                return -1;
            }
        }
    }
    ds4_err err = {0};
    int rc = a->m->ops->add_results(a->m, results, &err);
    json_decref(results);
    if (rc != 0) show_error(a, "adding tool results", &err);
    update_ctx(a);
    return rc;
}

/* ------------------------------------------------------------ turn */

/* The prompt as sent, its first lines only when it is long (a paste). */
static void echo(agent *a, const char *text) {
    enum { SHOW_LINES = 6 };
    const char *p = text;
    int lines = 0;
    while (lines < SHOW_LINES && (p = strchr(p, '\n'))) p++, lines++;
    size_t shown = p && lines == SHOW_LINES ? (size_t)(p - text) : strlen(text);
    display_newline(a->d);
    display_write(a->d, OUT_ECHO, "› ", strlen("› "));
    display_write(a->d, OUT_ECHO, text, shown);
    display_newline(a->d);
    if (shown < strlen(text)) {
        int more = 0;
        for (const char *q = text + shown; *q; q++) more += *q == '\n';
        display_printf(a->d, OUT_RESULT, "  [... %d more lines, %zu bytes in all]\n", more + 1, strlen(text));
    }
}

int agent_turn(agent *a, const char *text) {
    ds4_err err = {0};
    double t0 = ds4_now();
    uint32_t gen_total = 0;
    /* an interrupted (or failed) start is taken up again */
    if (!a->started && agent_start(a) != 0) return -1;
    link_clear_interrupt(a->l);
    echo(a, text);
    if (a->trace) trace_text(a->trace, "user", text, strlen(text));
    if (should_compact(a) && compact(a, "the context is filling up") != 0 && !room_left(a)) return -1;
    if (a->m->ops->add_user(a->m, text, &err) != 0) {
        show_error(a, "prompt", &err);
        return -1;
    }
    set_dirty(a, true);
    for (int round = 0;; round++) {
        if (round > 0 && should_compact(a) && compact(a, "the context is filling up") != 0 && !room_left(a)) return -1;
        gen_hooks h = {.ctx = a, .event = h_event, .generated = h_generated};
        round_result rr;
        display_round_begin(a->d);
        int rc = a->m->ops->round(a->m, &h, &rr, &err);
        display_round_end(a->d);
        gen_total += rr.generated;
        update_ctx(a);
        if (rc != 0) {
            json_decref(rr.calls);
            show_error(a, "generation failed", &err);
            return -1;
        }
        if (a->trace) trace_line(a->trace, "round %d: end %d, %u tokens", round, rr.end, rr.generated);
        if (rr.end == ROUND_ANSWER || rr.end == ROUND_LENGTH || rr.end == ROUND_INTERRUPTED) {
            if (rr.end == ROUND_LENGTH)
                display_printf(a->d, OUT_ERROR,
                               "stopped: the round reached the token limit (-n %u) or the context is full\n",
                               a->o->n_tokens);
            if (rr.end == ROUND_INTERRUPTED) display_printf(a->d, OUT_INFO, "interrupted\n");
            json_decref(rr.calls);
            break;
        }
        size_t n_calls = rr.end == ROUND_CALLS ? json_array_size(rr.calls) : 1;
        json_t *results;
        bool stop_after = false;
        if (link_prompt_waiting(a->l)) {
            results = not_run(n_calls, "Tool call not run: the user sent a new message, which follows.");
            display_printf(a->d, OUT_INFO, "tool call%s not run: a queued prompt goes first\n",
                           n_calls == 1 ? "" : "s");
            stop_after = true;
        } else if (rr.end == ROUND_BAD_CALLS) {
            char msg[800];
            snprintf(msg, sizeof(msg), "Tool error: invalid DSML tool call: %s", rr.error);
            display_printf(a->d, OUT_ERROR, "✗ invalid tool call: %s\n", rr.error);
            results = not_run(1, msg);
        } else {
            results = run_calls(a, rr.calls);
            stop_after = link_interrupted(a->l);
        }
        json_decref(rr.calls);
        if (add_results(a, results) != 0) return -1;
        if (agent_take_save_request(a)) agent_save(a);
        if (stop_after) {
            if (link_interrupted(a->l)) display_printf(a->d, OUT_INFO, "interrupted\n");
            break;
        }
    }
    double dt = ds4_now() - t0;
    display_printf(a->d, OUT_RESULT, "  [%u tokens generated in %.1f s; context %u of %u]\n", gen_total, dt,
                   a->m->ops->used(a->m), a->m->ops->ctx(a->m));
    link_update(a->l, link_interrupted(a->l) ? ST_INTERRUPTED : ST_IDLE, 0, 0);
    return 0;
}

/* ------------------------------------------------------------ commands */

int agent_start(agent *a) {
    ds4_err err = {0};
    link_clear_interrupt(a->l);
    if (a->m->ops->reset(a->m, &err) != 0) {
        show_error(a, "system prompt", &err);
        return -1;
    }
    a->started = true;
    update_ctx(a);
    link_update(a->l, ST_IDLE, 0, 0);
    return 0;
}

int agent_save(agent *a) {
    if (!a->m->ops->has_user(a->m)) {
        display_printf(a->d, OUT_INFO, "nothing to save yet: no user message in this session\n");
        return 0;
    }
    link_update(a->l, ST_SAVING, 0, 0);
    char id[41];
    uint32_t tokens = 0;
    ds4_err err = {0};
    double t0 = ds4_now();
    int rc = a->m->ops->save(a->m, id, &tokens, &err);
    if (rc != 0) {
        show_error(a, "save failed", &err);
        return -1;
    }
    set_dirty(a, false);
    display_printf(a->d, OUT_INFO, "saved session %.8s (%u tokens, %.1f s)\n", id, tokens, ds4_now() - t0);
    link_update(a->l, ST_IDLE, 0, 0);
    return 0;
}

/* Offer to save before the conversation is replaced or left.  False when
 * the user interrupted (Ctrl+C or ESC at the question). */
static bool offer_save(agent *a) {
    if (!agent_dirty(a) || !a->m->ops->has_user(a->m)) return true;
    int c = link_ask(a->l, "save the current session first? [y]es / [n]o", "yn");
    if (c == 'y') agent_save(a);
    return c != 0;
}

static void help(agent *a) {
    display_printf(a->d, OUT_INFO,
                   "commands:\n"
                   "  /save           save this session (a KV file: switching back prefills nothing)\n"
                   "  /list           saved sessions, most recent first\n"
                   "  /switch ID      resume a saved session (an unambiguous id prefix; Tab completes)\n"
                   "  /history [N]    the last N user turns with their answers (default 3)\n"
                   "  /new            a fresh session\n"
                   "  /quit, /exit    leave (also Ctrl+D on an empty line)\n"
                   "keys: Enter while the model works queues the prompt (it runs next, and a tool round in\n"
                   "progress is closed without running its calls); ESC interrupts and sends the queued prompt\n"
                   "now; Ctrl+X takes the queued prompt back into the editor; Ctrl+C interrupts, or clears\n"
                   "the line.\n");
}

static int list_sessions(agent *a, session_info **s, size_t *n) {
    ds4_err err = {0};
    if (a->m->ops->list(a->m, s, n, a->d, &err) != 0) {
        show_error(a, "listing sessions", &err);
        return -1;
    }
    sessions_sort_recent(*s, *n);
    return 0;
}

static void history(agent *a, int n) {
    ds4_err err = {0};
    json_t *msgs = a->m->ops->messages(a->m, &err);
    if (!msgs) {
        show_error(a, "history", &err);
        return;
    }
    sessions_history(a->d, msgs, n);
    json_decref(msgs);
}

static void cmd_switch(agent *a, const char *arg) {
    session_info *s = NULL;
    size_t n = 0, which = 0;
    ds4_err err = {0};
    if (list_sessions(a, &s, &n) != 0) return;
    if (sessions_resolve(s, n, arg, &which, &err) != 0) {
        show_error(a, "/switch", &err);
    } else if (offer_save(a)) {
        link_update(a->l, ST_LOADING, 0, 0);
        double t0 = ds4_now();
        if (a->m->ops->load(a->m, &s[which], &err) != 0) {
            show_error(a, "/switch", &err);
        } else {
            views_clear(&a->tools.views);
            free(a->tools.more_path);
            a->tools.more_path = NULL;
            set_dirty(a, false);
            display_printf(a->d, OUT_INFO, "switched to %.8s: %u tokens in %.1f s, nothing prefilled\n", s[which].id,
                           a->m->ops->used(a->m), ds4_now() - t0);
            history(a, 3);
            link_update(a->l, ST_IDLE, 0, 0);
        }
    }
    update_ctx(a);
    free(s);
}

static void cmd_new(agent *a) {
    if (!offer_save(a)) return;
    ds4_err err = {0};
    if (a->m->ops->reset(a->m, &err) != 0) {
        show_error(a, "/new", &err);
        return;
    }
    views_clear(&a->tools.views);
    free(a->tools.more_path);
    a->tools.more_path = NULL;
    set_dirty(a, false);
    update_ctx(a);
    display_printf(a->d, OUT_INFO, "new session\n");
    link_update(a->l, ST_IDLE, 0, 0);
}

bool agent_command(agent *a, const char *line, bool *quit) {
    *quit = false;
    if (line[0] != '/') return false;
    size_t n = strcspn(line, " \t");
    const char *arg = line + n;
    arg += strspn(arg, " \t");
    char argbuf[200];
    snprintf(argbuf, sizeof(argbuf), "%s", arg);
    for (size_t k = strlen(argbuf); k && (argbuf[k - 1] == ' ' || argbuf[k - 1] == '\n'); k--) argbuf[k - 1] = 0;
#define IS(s) (n == strlen(s) && !strncmp(line, s, n))
    link_clear_interrupt(a->l);
    display_newline(a->d);
    display_write(a->d, OUT_ECHO, line, strlen(line));
    display_newline(a->d);
    if (IS("/quit") || IS("/exit")) {
        *quit = offer_save(a);
    } else if (IS("/help")) {
        help(a);
        link_update(a->l, ST_IDLE, 0, 0);
    } else if (IS("/save")) {
        agent_save(a);
    } else if (IS("/list")) {
        session_info *s = NULL;
        size_t k = 0;
        if (list_sessions(a, &s, &k) == 0) {
            sessions_print(a->d, s, k);
            link_update(a->l, ST_IDLE, 0, 0);
        }
        free(s);
    } else if (IS("/switch")) {
        cmd_switch(a, argbuf);
    } else if (IS("/history")) {
        long v = 3;
        char *end;
        if (argbuf[0]) {
            v = strtol(argbuf, &end, 10);
            if (*end || v < 1 || v > 200) {
                display_printf(a->d, OUT_ERROR, "/history N: N must be 1 to 200\n");
                return true;
            }
        }
        history(a, (int)v);
        link_update(a->l, ST_IDLE, 0, 0);
    } else if (IS("/new")) {
        cmd_new(a);
    } else {
        display_printf(a->d, OUT_ERROR, "unknown command %.*s (/help lists them)\n", (int)n, line);
    }
#undef IS
    return true;
}
