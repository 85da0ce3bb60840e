/*
 * repl.c - `ds4` without a prompt: an interactive, multi-turn chat.
 *
 * Each line is a user message (a line ending in a backslash continues on
 * the next one); lines starting with "/" are commands.  The conversation
 * keeps its live session, so a turn prefills only what it adds
 * (conversation.h).  On a terminal the line editor is libedit with a
 * persistent history in ~/.ds4_history; Ctrl+C clears the line being
 * typed, stops a generation (the answer so far stays in the conversation)
 * or a prefill (the turn is taken back); Ctrl+D or /quit leaves.  Piped
 * input is read line by line without editing.
 */
#include <errno.h>
#include <histedit.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#include "base/numparse.h"
#include "conversation.h"
#include "engine/session.h"
#include "model/steering.h"
#include "modes.h"

#define HISTORY_FILE ".ds4_history"
#define HISTORY_SIZE 512

/* ------------------------------------------------------------ input */

typedef struct input {
    EditLine *el; /* NULL: not a terminal */
    History *hist;
    char *hist_path;
    const char *prompt;
    char *line; /* getline buffer (no terminal) */
    size_t line_cap;
} input;

static input *current_input; /* for the libedit prompt callback */

static const char *prompt_fn(EditLine *el) {
    (void)el;
    return current_input->prompt;
}

/* Wait for input unless Ctrl+C came.  A Ctrl+C typed before the editor put
 * the terminal in raw mode arrives as a signal while we are not waiting yet,
 * so the flag is tested with SIGINT blocked and ppoll() unblocks it
 * atomically: no interrupt can fall between the test and the wait. */
static int wait_input(void) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = -1;
    if (!cli_interrupted) {
        struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
        rc = ppoll(&p, 1, NULL, &old);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* libedit's character source.  Returning -1 makes el_gets give up the line
 * (Ctrl+C). */
static int read_char(EditLine *el, wchar_t *wc) {
    (void)el;
    mbstate_t st;
    memset(&st, 0, sizeof(st));
    for (;;) {
        if (wait_input() < 0) {
            if (errno == EINTR && !cli_interrupted) continue;
            return -1;
        }
        char b;
        ssize_t k = read(STDIN_FILENO, &b, 1);
        if (k == 0) return 0;
        if (k < 0) {
            if (errno == EINTR && !cli_interrupted) continue;
            return -1;
        }
        /* A Ctrl+D typed while the terminal was still in canonical mode
         * (during an answer, or just before the editor took the terminal)
         * reaches us as a NUL byte once the editor switches to raw mode;
         * it was a Ctrl+D, so it is given back as one. */
        if (b == 0) b = 4;
        wchar_t w;
        size_t r = mbrtowc(&w, &b, 1, &st);
        if (r == (size_t)-2) continue; /* more bytes of this character */
        if (r == (size_t)-1) {
            memset(&st, 0, sizeof(st));
            w = (unsigned char)b;
        }
        *wc = w;
        return 1;
    }
}

static void input_open(input *in, const char *argv0) {
    memset(in, 0, sizeof(*in));
    current_input = in;
    in->prompt = "ds4> ";
    if (!isatty(STDIN_FILENO)) return;
    in->el = el_init(argv0, stdin, stdout, stderr);
    if (!in->el) return;
    el_set(in->el, EL_EDITOR, "emacs");
    el_set(in->el, EL_PROMPT, prompt_fn);
    el_wset(in->el, EL_GETCFN, read_char);
    HistEvent ev;
    if ((in->hist = history_init())) {
        history(in->hist, &ev, H_SETSIZE, HISTORY_SIZE);
        history(in->hist, &ev, H_SETUNIQUE, 1);
        el_set(in->el, EL_HIST, history, in->hist);
        const char *home = getenv("HOME");
        if (home && *home && (in->hist_path = malloc(strlen(home) + sizeof(HISTORY_FILE) + 1))) {
            sprintf(in->hist_path, "%s/%s", home, HISTORY_FILE);
            history(in->hist, &ev, H_LOAD, in->hist_path);
        }
    }
}

static void input_close(input *in) {
    if (in->el) el_end(in->el);
    if (in->hist) history_end(in->hist);
    free(in->hist_path);
    free(in->line);
    current_input = NULL;
}

static void input_remember(input *in, const char *line) {
    if (!in->hist || !*line) return;
    HistEvent ev;
    history(in->hist, &ev, H_ENTER, line);
    if (in->hist_path) history(in->hist, &ev, H_SAVE, in->hist_path);
}

typedef enum { LINE_OK, LINE_EOF, LINE_INTERRUPTED } line_status;

/* One physical line without its newline, in *out (valid until the next
 * call). */
static line_status read_line(input *in, const char **out) {
    cli_interrupted = 0;
    if (!in->el) {
        if (isatty(STDOUT_FILENO)) {
            fputs(in->prompt, stdout);
            fflush(stdout);
        }
        ssize_t n = getline(&in->line, &in->line_cap, stdin);
        if (n < 0) {
            if (!cli_interrupted) return LINE_EOF;
            clearerr(stdin);
            return LINE_INTERRUPTED;
        }
        if (n > 0 && in->line[n - 1] == '\n') in->line[--n] = 0;
        *out = in->line;
        return LINE_OK;
    }
    int n = 0;
    const char *l = el_gets(in->el, &n);
    if (!l) {
        if (cli_interrupted) {
            el_reset(in->el);
            fputs("^C\n", stdout);
            return LINE_INTERRUPTED;
        }
        return LINE_EOF;
    }
    free(in->line);
    in->line = strdup(l);
    if (!in->line) return LINE_EOF;
    size_t len = strlen(in->line);
    if (len && in->line[len - 1] == '\n') in->line[len - 1] = 0;
    *out = in->line;
    return LINE_OK;
}

/* A whole message: lines ending in '\' continue on the next one. */
static line_status read_message(input *in, char **msg) {
    size_t len = 0;
    char *buf = NULL;
    in->prompt = "ds4> ";
    for (;;) {
        const char *l;
        line_status s = read_line(in, &l);
        if (s != LINE_OK) {
            free(buf);
            in->prompt = "ds4> ";
            return s;
        }
        size_t n = strlen(l);
        bool more = n > 0 && l[n - 1] == '\\';
        char *nb = realloc(buf, len + n + 2);
        if (!nb) {
            free(buf);
            return LINE_EOF;
        }
        buf = nb;
        memcpy(buf + len, l, more ? n - 1 : n);
        len += more ? n - 1 : n;
        buf[len] = 0;
        if (!more) break;
        buf[len++] = '\n';
        buf[len] = 0;
        in->prompt = "...> ";
    }
    in->prompt = "ds4> ";
    *msg = buf;
    return LINE_OK;
}

/* ------------------------------------------------------------ commands */

typedef struct repl {
    convo c;
    ds4_engine *e;
    const cli_opts *o;
    ds4_sampler *smp;
    float steer_ffn, steer_attn; /* the steering scales (/steer), kept across /ctx */
} repl;

static void help(void) {
    fputs("commands:\n"
          "  /help          this list\n"
          "  /think         reason before answering (the default)\n"
          "  /think-max     maximum reasoning effort (needs a context of at least 393216 tokens)\n"
          "  /nothink       answer directly\n"
          "  /ctx N         new context of N tokens (the conversation is prefilled again)\n"
          "  /steer [F [A]] show or set the steering scales after the FFN (F) and attention (A)\n"
          "                 outputs (needs --dir-steering-file; the conversation is prefilled again)\n"
          "  /read FILE     send the contents of FILE as the next message\n"
          "  /quit, /exit   leave (also Ctrl+D)\n"
          "a line ending in \\ continues on the next line; Ctrl+C stops a generation.\n"
          "changing the thinking mode re-renders the conversation, so the next turn prefills it again.\n",
          stderr);
}

static void think_warning(const convo *c) {
    if (c->think == DS4_THINK_MAX && convo_effective_think(c) != DS4_THINK_MAX)
        fprintf(stderr, "ds4: think-max needs a context of at least %u tokens (now %u): using normal thinking\n",
                DS4_THINK_MAX_MIN_CTX, convo_ctx(c));
}

static void turn(repl *r, const char *text, size_t len) {
    ds4_err err = {0};
    ds4_tokens prompt = {0};
    turn_stats st = {0};
    int rc = convo_prompt(&r->c, text, len, &prompt, &err);
    if (rc == 0) rc = convo_turn(&r->c, &prompt, r->smp, r->o->n_tokens, &st, &err);
    if (rc != 0) fprintf(stderr, "ds4: %s\n", err.msg);
    else convo_print_stats(&st);
    ds4_tokens_free(&prompt);
}

/* Returns false when the conversation lost its session (leave). */
static bool cmd_ctx(repl *r, const char *arg) {
    uint32_t v;
    if (ds4_parse_u32(arg, 1, DS4_CTX_MAX, &v) != 0) {
        fprintf(stderr, "ds4: /ctx N: N must be an integer in 1..%u\n", DS4_CTX_MAX);
        return true;
    }
    ds4_err err = {0};
    if (convo_set_ctx(&r->c, v, &err) != 0) {
        fprintf(stderr, "ds4: /ctx: %s\n", err.msg);
        if (r->c.s) return true;
        fputs("ds4: the context of the old size could not be made again either; leaving\n", stderr);
        return false;
    }
    cli_print_memory(r->e, v);
    think_warning(&r->c);
    if (ds4_session_set_steering(r->c.s, r->steer_ffn, r->steer_attn, &err) != 0)
        fprintf(stderr, "ds4: /ctx: %s\n", err.msg);
    return true;
}

/* /steer: the scales now, or new ones (the FFN's, then optionally the
 * attention's; the latter stays when only one is given). */
static void cmd_steer(repl *r, const char *arg) {
    if (!*arg) {
        fprintf(stderr, "ds4: steering scales: ffn %g, attn %g%s\n", r->steer_ffn, r->steer_attn,
                r->e->steer ? "" : " (no --dir-steering-file)");
        return;
    }
    char *end;
    double f = strtod(arg, &end), a = r->steer_attn;
    bool ok = end != arg;
    if (ok && *end) {
        const char *p = end + strspn(end, " ");
        a = strtod(p, &end);
        ok = end != p && !*(end + strspn(end, " "));
    }
    ds4_err err = {0};
    if (!ok) {
        fputs("ds4: /steer F [A]: the scales are numbers\n", stderr);
    } else if (ds4_steer_scale_check(f, "/steer", &err) || ds4_steer_scale_check(a, "/steer", &err) ||
               ds4_session_set_steering(r->c.s, (float)f, (float)a, &err)) {
        fprintf(stderr, "ds4: %s\n", err.msg);
    } else {
        r->steer_ffn = (float)f;
        r->steer_attn = (float)a;
        fprintf(stderr, "ds4: steering scales: ffn %g, attn %g\n", f, a);
    }
}

static void cmd_read(repl *r, const char *path) {
    if (!*path) {
        fputs("ds4: /read FILE: which file?\n", stderr);
        return;
    }
    ds4_err err = {0};
    size_t len;
    char *text = cli_read_file(path, &len, &err);
    if (!text) {
        fprintf(stderr, "ds4: /read: %s\n", err.msg);
        return;
    }
    fprintf(stderr, "ds4: sending %s (%zu bytes)\n", path, len);
    turn(r, text, len);
    free(text);
}

/* Returns false to leave. */
static bool command(repl *r, const char *line) {
    const char *sp = strchr(line, ' ');
    size_t n = sp ? (size_t)(sp - line) : strlen(line);
    const char *arg = sp ? sp + strspn(sp, " ") : "";
#define IS(name) (n == strlen(name) && !strncmp(line, name, n))
    if (IS("/quit") || IS("/exit")) return false;
    if (IS("/help")) {
        help();
    } else if (IS("/think")) {
        convo_set_think(&r->c, DS4_THINK_HIGH);
        fputs("ds4: thinking on\n", stderr);
    } else if (IS("/nothink")) {
        convo_set_think(&r->c, DS4_THINK_OFF);
        fputs("ds4: thinking off\n", stderr);
    } else if (IS("/think-max")) {
        convo_set_think(&r->c, DS4_THINK_MAX);
        fputs("ds4: thinking at maximum effort\n", stderr);
        think_warning(&r->c);
    } else if (IS("/ctx")) {
        return cmd_ctx(r, arg);
    } else if (IS("/read")) {
        cmd_read(r, arg);
    } else if (IS("/steer")) {
        cmd_steer(r, arg);
    } else {
        fprintf(stderr, "ds4: unknown command %.*s (see /help)\n", (int)n, line);
    }
#undef IS
    return true;
}

int run_repl(ds4_engine *e, const cli_opts *o, ds4_sampler *smp) {
    repl r = {.e = e, .o = o, .smp = smp, .steer_ffn = o->steer.ffn, .steer_attn = o->steer.attn};
    ds4_err err = {0};
    if (convo_init(&r.c, e, o->ctx, o->system, o->think, &err) != 0 ||
        convo_enable_mtp(&r.c, o->mtp.draft, o->mtp.margin, &err) != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        convo_free(&r.c); /* (a convo that failed to start is already empty) */
        return 1;
    }
    input in;
    input_open(&in, "ds4");
    fputs("ds4: interactive chat; /help for commands, Ctrl+D to leave\n", stderr);
    for (;;) {
        char *msg = NULL;
        line_status s = read_message(&in, &msg);
        if (s == LINE_EOF) break;
        if (s == LINE_INTERRUPTED) continue;
        input_remember(&in, msg);
        bool go_on = true;
        if (msg[0] == '/') go_on = command(&r, msg);
        else if (msg[strspn(msg, " \t\n")]) turn(&r, msg, strlen(msg));
        free(msg);
        if (!go_on) break;
    }
    input_close(&in);
    convo_free(&r.c);
    return 0;
}
