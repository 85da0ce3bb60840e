/*
 * tui.c - the run over a question set as it shows (eval.h): the
 * split-screen terminal UI, or one line per question (--plain, or when
 * stdin or stdout is not a terminal).
 *
 * The UI: the left pane lists the questions with their status, the right
 * pane streams the current reply (the thinking in grey).  Keys, read
 * between tokens: p pauses and resumes, q (or Ctrl+C) stops the current
 * question and ends the run (the report follows), Up/Down select a question, Enter runs
 * the selected pending question next.  It draws on the alternate screen and
 * restores the terminal on every way out.
 */
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "eval.h"
#include "text/strbuf.h"

/* ------------------------------------------------------------ --plain */

/* Ctrl+C in the plain mode: the question running stops and the report
 * follows.  A signal handler can only reach a flag of the file. */
static volatile sig_atomic_t plain_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    plain_interrupted = 1;
}

static bool plain_stop(void *ctx) {
    (void)ctx;
    return plain_interrupted != 0;
}

int eval_plain(eval_runner *r, const eval_opts *o, const eval_set *s, eval_result *res, FILE *trace) {
    (void)o;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, &old);
    eval_sink sink = {NULL, NULL, plain_stop, NULL};
    int rc = 0;
    for (size_t i = 0; i < s->n && !plain_interrupted; i++) {
        ds4_err err = {0};
        if (eval_run_question(r, &s->q[i], &res[i], &sink, trace, &err)) {
            fprintf(stderr, "ds4-eval: %s: %s\n", s->q[i].id, err.msg);
            rc = 1;
            break;
        }
        const eval_result *x = &res[i];
        if (x->status == EVAL_SKIPPED) printf("[%zu/%zu] %s skipped: %s\n", i + 1, s->n, s->q[i].id, x->why);
        else
            printf("[%zu/%zu] %s %s: answer %s, correct %s (%u prompt + %u generated tokens, %.1f s)\n", i + 1, s->n,
                   s->q[i].id, eval_status_name(x->status), x->got, s->q[i].answer_text, x->prompt_tokens,
                   x->gen_tokens, x->seconds);
        fflush(stdout);
    }
    sigaction(SIGINT, &old, NULL);
    if (plain_interrupted && rc == 0) {
        fprintf(stderr, "ds4-eval: interrupted\n");
        rc = 130;
    }
    return rc;
}

/* ------------------------------------------------------------ the UI */

#define STREAM_KEEP 32768 /* bytes of the current reply kept for the right pane */

typedef struct tui {
    const eval_set *s;
    eval_result *res;
    size_t *order; /* the run order: order[next..n) not started yet */
    size_t next, current, selected;
    bool paused, quit;
    int esc;      /* where an arrow key's escape sequence is: 0 none, 1 after ESC, 2 after ESC [ */
    char *txt;    /* the current reply's last bytes */
    uint8_t *thk; /* whether each was thinking */
    size_t n;
    double last_draw;
    struct termios saved;
    int rows, cols;
} tui;

static void term_size(tui *t) {
    struct winsize ws;
    t->rows = 24;
    t->cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 4 && ws.ws_col > 30) {
        t->rows = ws.ws_row;
        t->cols = ws.ws_col;
    }
}

static const char *status_color(eval_status st) {
    switch (st) {
    case EVAL_PASSED: return "\033[32m";
    case EVAL_FAILED: return "\033[31m";
    case EVAL_SKIPPED:
    case EVAL_STOPPED: return "\033[33m";
    case EVAL_PENDING: return "\033[90m";
    default: return "\033[36m";
    }
}

/* Columns of a UTF-8 byte string (continuation bytes take none). */
static bool is_lead(unsigned char c) { return (c & 0xC0) != 0x80; }

static void draw(tui *t) {
    term_size(t);
    int lw = t->cols / 3 < 40 ? t->cols / 3 : 40, rw = t->cols - lw - 3;
    ds4_strbuf b = {0};
    uint32_t n[EVAL_STOPPED + 1] = {0};
    for (size_t i = 0; i < t->s->n; i++) n[t->res[i].status]++;
    uint32_t done = n[EVAL_PASSED] + n[EVAL_FAILED] + n[EVAL_SKIPPED] + n[EVAL_STOPPED];
    ds4_strbuf_printf(&b,
                      "\033[H\033[2J\033[1mds4-eval\033[0m  %u/%zu run, \033[32m%u passed\033[0m, "
                      "\033[31m%u failed\033[0m%s   p pause  q quit  Up/Down  Enter run next\r\n",
                      done, t->s->n, n[EVAL_PASSED], n[EVAL_FAILED], t->paused ? "  \033[7m PAUSED \033[0m" : "");
    int body = t->rows - 2;
    /* the list scrolls to keep the selection in view */
    size_t first = t->selected >= (size_t)body ? t->selected - (size_t)body + 1 : 0;
    /* the right pane: the current reply wrapped, its last lines */
    size_t starts[4096];
    size_t ns = 0, col = 0;
    starts[ns++] = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (t->txt[i] == '\n' || (is_lead((unsigned char)t->txt[i]) && col >= (size_t)rw)) {
            if (ns == 4096) {
                memmove(starts, starts + 2048, 2048 * sizeof(size_t));
                ns = 2048;
            }
            starts[ns++] = t->txt[i] == '\n' ? i + 1 : i;
            col = 0;
            if (t->txt[i] == '\n') continue;
        }
        if (is_lead((unsigned char)t->txt[i])) col++;
    }
    size_t from = ns > (size_t)body - 1 ? ns - ((size_t)body - 1) : 0;
    const eval_question *cq = t->current < t->s->n ? &t->s->q[t->current] : NULL;
    for (int row = 0; row < body; row++) {
        size_t qi = first + (size_t)row;
        if (qi < t->s->n) {
            const eval_result *x = &t->res[qi];
            ds4_strbuf_printf(&b, "%s%s%-9s\033[0m %-*.*s", qi == t->selected ? "\033[7m>" : " ",
                              status_color(x->status), eval_status_name(x->status), lw - 11, lw - 11, t->s->q[qi].id);
            if (qi == t->selected) ds4_strbuf_puts(&b, "\033[0m");
        } else {
            ds4_strbuf_printf(&b, "%*s", lw, "");
        }
        ds4_strbuf_puts(&b, " \033[90m|\033[0m ");
        if (row == 0 && cq) {
            ds4_strbuf_printf(&b, "\033[1m%.*s\033[0m (%s)", rw - 16, cq->id,
                              eval_status_name(t->res[t->current].status));
        } else if (row > 0 && from + (size_t)row - 1 < ns) {
            size_t a = starts[from + (size_t)row - 1], e = from + (size_t)row < ns ? starts[from + (size_t)row] : t->n;
            bool grey = false;
            for (size_t i = a; i < e; i++) {
                if (t->txt[i] == '\n') continue;
                if (t->thk[i] != grey) {
                    ds4_strbuf_puts(&b, t->thk[i] ? "\033[90m" : "\033[0m");
                    grey = t->thk[i];
                }
                char c = t->txt[i];
                ds4_strbuf_putc(&b, (unsigned char)c < 0x20 ? ' ' : c);
            }
            if (grey) ds4_strbuf_puts(&b, "\033[0m");
        }
        ds4_strbuf_puts(&b, "\r\n");
    }
    fwrite(b.p, 1, b.len, stdout);
    fflush(stdout);
    ds4_strbuf_free(&b);
    t->last_draw = ds4_now();
}

/* Run the selected question next, if it has not started. */
static void run_selected_next(tui *t) {
    for (size_t k = t->next; k < t->s->n; k++)
        if (t->order[k] == t->selected) {
            memmove(t->order + t->next + 1, t->order + t->next, (k - t->next) * sizeof(size_t));
            t->order[t->next] = t->selected;
            return;
        }
}

/* Handle the keys waiting (or, paused, wait for them); wait_ms > 0 waits
 * that long for keys in any case. */
static void keys(tui *t, int wait_ms) {
    double until = ds4_now() + wait_ms / 1000.0;
    for (;;) {
        double left = until - ds4_now();
        int timeout = t->paused && !t->quit ? 100 : left > 0 ? (int)(left * 1000) + 1 : 0;
        struct pollfd p = {STDIN_FILENO, POLLIN, 0};
        if (poll(&p, 1, timeout) > 0) {
            char k[64];
            ssize_t n = read(STDIN_FILENO, k, sizeof(k));
            for (ssize_t i = 0; i < n; i++) {
                if (t->esc == 1) {
                    t->esc = k[i] == '[' ? 2 : 0;
                } else if (t->esc == 2) {
                    if (k[i] == 'A' && t->selected > 0) t->selected--;
                    if (k[i] == 'B' && t->selected + 1 < t->s->n) t->selected++;
                    t->esc = 0;
                } else if (k[i] == 27) {
                    t->esc = 1;
                } else if (k[i] == 'p' || k[i] == 'P') {
                    t->paused = !t->paused;
                } else if (k[i] == 'q' || k[i] == 'Q' || k[i] == 3) {
                    t->quit = true;
                    t->paused = false;
                } else if (k[i] == '\r' || k[i] == '\n') {
                    run_selected_next(t);
                }
            }
            draw(t);
            continue;
        }
        if (t->quit || (!t->paused && ds4_now() >= until)) return;
    }
}

static void on_status(void *ctx, eval_status st) {
    tui *t = ctx;
    (void)st;
    draw(t);
}

static void on_text(void *ctx, const char *s, size_t n, bool thinking) {
    tui *t = ctx;
    if (t->n + n > STREAM_KEEP) {
        size_t drop = t->n + n - STREAM_KEEP > t->n ? t->n : t->n + n - STREAM_KEEP;
        memmove(t->txt, t->txt + drop, t->n - drop);
        memmove(t->thk, t->thk + drop, t->n - drop);
        t->n -= drop;
    }
    if (n > STREAM_KEEP) {
        s += n - STREAM_KEEP;
        n = STREAM_KEEP;
    }
    memcpy(t->txt + t->n, s, n);
    memset(t->thk + t->n, thinking, n);
    t->n += n;
    if (ds4_now() - t->last_draw > 0.05) draw(t);
}

static bool on_stop(void *ctx) {
    tui *t = ctx;
    keys(t, 0);
    return t->quit;
}

int eval_tui(eval_runner *r, const eval_opts *o, const eval_set *s, eval_result *res, FILE *trace) {
    tui t = {.s = s, .res = res};
    t.order = malloc(s->n * sizeof(size_t));
    t.txt = malloc(STREAM_KEEP);
    t.thk = malloc(STREAM_KEEP);
    if (!t.order || !t.txt || !t.thk) {
        free(t.order);
        free(t.txt);
        free(t.thk);
        fprintf(stderr, "ds4-eval: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < s->n; i++) t.order[i] = i;
    tcgetattr(STDIN_FILENO, &t.saved);
    struct termios raw = t.saved;
    /* Ctrl+C arrives as a key (3) and ends the run as q does, so that the
     * terminal is always restored and the report printed */
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO | ISIG);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    fputs("\033[?1049h\033[?25l", stdout);
    eval_sink sink = {on_status, on_text, on_stop, &t};
    int rc = 0;
    ds4_err err = {0};
    while (t.next < s->n && !t.quit) {
        keys(&t, 0);
        if (t.quit) break;
        t.current = t.order[t.next++];
        t.n = 0;
        if (eval_run_question(r, &s->q[t.current], &res[t.current], &sink, trace, &err)) {
            rc = 1;
            break;
        }
        draw(&t);
        keys(&t, (int)o->pause_ms);
    }
    fputs("\033[?25h\033[?1049l", stdout);
    fflush(stdout);
    tcsetattr(STDIN_FILENO, TCSANOW, &t.saved);
    if (rc) fprintf(stderr, "ds4-eval: %s: %s\n", s->q[t.current].id, err.msg);
    free(t.order);
    free(t.txt);
    free(t.thk);
    return rc;
}
