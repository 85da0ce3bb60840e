/*
 * tui.c - the terminal UI (see app.h and docs/AGENT.md, "The screen").
 *
 * The screen is split with an ANSI scroll region: the model's output
 * scrolls in the upper part while the bottom rows stay put, holding (top
 * to bottom) a preview of the first queued prompt, the status footer, and
 * the input line, edited with libedit.  The input area grows with what is
 * typed (one spare row below it, so libedit never wraps onto the last line
 * of the screen) and the output area shrinks to make room.
 *
 * libedit reads its characters through getc_fn, which is the UI's event
 * loop: while it waits for a key it also copies the worker's output into
 * the scroll region (cursor saved and restored around it, so the line
 * being edited never moves), redraws the footer (at most 5 times a second
 * unless the state changes), shows and answers permission questions, and
 * handles the keys that are not editing: ESC alone (interrupt, and the
 * queued prompt goes next), Ctrl+C (interrupt, or clear the line), and
 * bracketed paste (a pasted block with line breaks becomes a placeholder
 * in the line, expanded when the line is sent).  Tab after /switch
 * completes session ids, most recent first; Ctrl+X takes the first queued
 * prompt back into the editor.
 */
#include <errno.h>
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <wchar.h>

#include "app.h"
#include "engine/generate.h"

#define PROMPT         "› "
#define PROMPT_COLS    2
#define HISTORY_FILE   ".ds4_agent_history"
#define FOOTER_PERIOD  0.2
#define MAX_QUEUE_ROWS 3
#define PASTE_START    "\033[200~"
#define PASTE_END      "\033[201~"

typedef struct ui {
    agent *a;
    agent_link *l;
    const agent_opts *o;
    display *d;
    const char *dir;
    int sigfd;
    EditLine *el;
    History *hist;
    char *hist_path;
    int rows, cols;
    int out_bottom;    /* last row of the output region (1-based) */
    int out_col;       /* output cursor column, 0-based; cols = wrap pending */
    ds4_strbuf sgr;    /* SGR sequences in force in the output */
    ds4_strbuf recent; /* the last output, shown again after a resize */
    int reserve;       /* rows under the output region */
    int input_rows, queue_rows;
    char footer[600];
    agent_state footer_state;
    double footer_at;
    bool question; /* a question is on the footer */
    char qtext[600], qchoices[16];
    unsigned char in[256]; /* bytes read ahead, not yet given to libedit */
    size_t nin;
    ds4_strbuf pasting; /* inside a bracketed paste */
    bool in_paste;
    char **paste; /* pasted blocks of the line being edited */
    size_t npaste;
    int seen_sigint;
    bool quit;
} ui;

static void out(const char *s, size_t n) {
    while (n) {
        ssize_t w = write(STDOUT_FILENO, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void outs(const char *s) { out(s, strlen(s)); }

static void outf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void outf(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0) out(buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

static void term_size(ui *u) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        u->rows = ws.ws_row;
        u->cols = ws.ws_col;
    } else {
        u->rows = 24;
        u->cols = 80;
    }
    if (u->rows < 6) u->rows = 6;
    if (u->cols < 20) u->cols = 20;
}

/* ------------------------------------------------------------ output */

/* Track the output cursor and the SGR state across a chunk of output. */
static void track(ui *u, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == 0x1b && i + 1 < n && s[i + 1] == '[') {
            size_t j = i + 2;
            while (j < n && ((s[j] >= '0' && s[j] <= '9') || s[j] == ';')) j++;
            if (j < n && s[j] == 'm') {
                bool reset = j == i + 2 || (j == i + 3 && s[i + 2] == '0');
                if (reset) ds4_strbuf_truncate(&u->sgr, 0);
                else ds4_strbuf_append(&u->sgr, s + i, j + 1 - i);
                if (u->sgr.len > 256) ds4_strbuf_truncate(&u->sgr, 0); /* never grows unbounded */
            }
            i = j + 1;
            continue;
        }
        if (c == '\n') {
            u->out_col = 0;
            i++;
            continue;
        }
        if (c == '\r') {
            u->out_col = 0;
            i++;
            continue;
        }
        /* one character: its width */
        wchar_t wc;
        mbstate_t st;
        memset(&st, 0, sizeof(st));
        size_t k = mbrtowc(&wc, s + i, n - i, &st);
        int w = 1;
        if (k == (size_t)-1 || k == (size_t)-2 || k == 0) k = 1;
        else w = wcwidth(wc);
        if (w < 0) w = 0;
        if (u->out_col >= u->cols) u->out_col = 0;
        u->out_col += w;
        i += k;
    }
}

#define RECENT_MAX (64u << 10)

/* Keep the last RECENT_MAX bytes of output, cut at a line start. */
static void remember(ui *u, const char *s, size_t n) {
    ds4_strbuf_append(&u->recent, s, n);
    if (u->recent.len <= RECENT_MAX) return;
    const char *from = u->recent.p + u->recent.len - RECENT_MAX / 2;
    const char *nl = memchr(from, '\n', u->recent.p + u->recent.len - from);
    size_t keep = nl ? (size_t)(u->recent.p + u->recent.len - nl - 1) : 0;
    memmove(u->recent.p, u->recent.p + u->recent.len - keep, keep);
    ds4_strbuf_truncate(&u->recent, keep);
}

/* Output bytes into the scroll region, the cursor (in the input line)
 * saved and restored around them. */
static void show_output(ui *u, const char *s, size_t n) {
    if (!n) return;
    ds4_strbuf b = {0};
    ds4_strbuf_puts(&b, "\0337\033[?25l");
    if (u->out_col >= u->cols) {
        /* a full line: the wrap the terminal had pending */
        ds4_strbuf_printf(&b, "\033[%d;1H\n", u->out_bottom);
        u->out_col = 0;
    } else {
        ds4_strbuf_printf(&b, "\033[%d;%dH", u->out_bottom, u->out_col + 1);
    }
    ds4_strbuf_append(&b, u->sgr.p, u->sgr.len);
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') ds4_strbuf_puts(&b, "\033[K\r\n");
        else ds4_strbuf_putc(&b, s[i]);
    }
    track(u, s, n);
    ds4_strbuf_puts(&b, "\033[0m\0338\033[?25h");
    out(b.p, b.len);
    ds4_strbuf_free(&b);
    remember(u, s, n);
}

static void ui_message(ui *u, const char *s) { show_output(u, s, strlen(s)); }

/* ------------------------------------------------------------ footer */

static void fmt_k(uint32_t n, char *buf, size_t len) {
    if (n < 1000) snprintf(buf, len, "%u", n);
    else if (n < 100000) snprintf(buf, len, "%.1fk", n / 1000.0);
    else snprintf(buf, len, "%uk", n / 1000);
}

static void progress_bar(uint32_t done, uint32_t total, char *buf, size_t len) {
    const int width = 20;
    int filled = total ? (int)((uint64_t)done * width / total) : 0;
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (int i = 0; i < width && o + 4 < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s", i < filled ? "▶" : "·");
    snprintf(buf + o, len - o, "]");
}

static void status_text(ui *u, const agent_status *st, char *buf, size_t len) {
    char used[16], size[16];
    fmt_k(st->ctx_used, used, sizeof(used));
    fmt_k(st->ctx_size, size, sizeof(size));
    int o = snprintf(buf, len, "ctx %s/%s | ", used, size);
    if (o < 0 || (size_t)o >= len) return;
    char bar[128];
    switch (st->state) {
    case ST_PREFILL:
        progress_bar(st->done, st->total, bar, sizeof(bar));
        snprintf(buf + o, len - (size_t)o, "prefill %s %u/%u %.1f%%", bar, st->done, st->total,
                 st->total ? 100.0 * st->done / st->total : 0.0);
        break;
    case ST_GENERATING:
        snprintf(buf + o, len - (size_t)o, "generation %u tokens %.1f t/s", st->generated, st->tps);
        break;
    case ST_TOOL: snprintf(buf + o, len - (size_t)o, "%s", st->detail[0] ? st->detail : "running a tool"); break;
    case ST_COMPACTING:
        if (st->total && st->done < st->total) {
            progress_bar(st->done, st->total, bar, sizeof(bar));
            snprintf(buf + o, len - (size_t)o, "COMPACTING prefill %s %u/%u", bar, st->done, st->total);
        } else {
            snprintf(buf + o, len - (size_t)o, "COMPACTING summary %u tokens %.1f t/s", st->generated, st->tps);
        }
        break;
    case ST_SAVING: snprintf(buf + o, len - (size_t)o, "saving session"); break;
    case ST_LOADING: snprintf(buf + o, len - (size_t)o, "loading session"); break;
    case ST_ERROR: snprintf(buf + o, len - (size_t)o, "error: %s", st->detail); break;
    case ST_INTERRUPTED: snprintf(buf + o, len - (size_t)o, "interrupted"); break;
    case ST_IDLE: snprintf(buf + o, len - (size_t)o, "idle"); break;
    }
    (void)u;
}

/* Write s on `row`, at most cols columns, in a style. */
static void row_text(ui *u, int row, const char *style, const char *s) {
    ds4_strbuf b = {0};
    ds4_strbuf_printf(&b, "\033[%d;1H\033[2K%s", row, style);
    int w = 0;
    mbstate_t st;
    memset(&st, 0, sizeof(st));
    for (size_t i = 0; s[i] && w < u->cols - 1;) {
        wchar_t wc;
        size_t k = mbrtowc(&wc, s + i, strlen(s + i), &st);
        if (k == (size_t)-1 || k == (size_t)-2 || k == 0) {
            memset(&st, 0, sizeof(st));
            k = 1;
            wc = '?';
        }
        int cw = wcwidth(wc);
        if (cw < 0) cw = 0;
        if (w + cw > u->cols - 1) break;
        if (s[i] == '\n' || s[i] == '\t') ds4_strbuf_putc(&b, ' ');
        else ds4_strbuf_append(&b, s + i, k);
        w += cw;
        i += k;
    }
    ds4_strbuf_puts(&b, "\033[0m");
    out(b.p, b.len);
    ds4_strbuf_free(&b);
}

static int footer_row(const ui *u) { return u->out_bottom + u->queue_rows + 1; }

static void draw_footer(ui *u, bool force) {
    agent_status st = link_status(u->l);
    double now = ds4_now();
    char text[600];
    if (u->question) {
        snprintf(text, sizeof(text), "%s", u->qtext);
    } else {
        status_text(u, &st, text, sizeof(text));
        size_t q = link_queue_len(u->l);
        if (q) snprintf(text + strlen(text), sizeof(text) - strlen(text), " | %zu queued", q);
    }
    bool changed = strcmp(text, u->footer) != 0;
    if (!changed && !force) return;
    if (!force && !u->question && st.state == u->footer_state && now - u->footer_at < FOOTER_PERIOD) return;
    snprintf(u->footer, sizeof(u->footer), "%s", text);
    u->footer_state = st.state;
    u->footer_at = now;
    outs("\0337\033[?25l");
    row_text(u, footer_row(u), u->question ? "\033[1;30;43m" : "\033[48;5;238;38;5;252m", text);
    if (u->queue_rows) {
        char *first = link_queue_peek(u->l);
        if (first) {
            char line[700];
            snprintf(line, sizeof(line), "queued: %s  (Ctrl+X: edit, ESC: send now)", first);
            row_text(u, u->out_bottom + 1, "\033[1;96m", line);
            free(first);
        }
    }
    outs("\0338\033[?25h");
}

/* ------------------------------------------------------------ layout */

/* Rows the input needs: the prompt and the text, wrapped, plus a spare. */
static int input_rows_needed(ui *u) {
    const LineInfoW *li = el_wline(u->el);
    int w = PROMPT_COLS;
    for (const wchar_t *p = li->buffer; p < li->lastchar; p++) {
        int cw = wcwidth(*p);
        w += cw < 0 ? 2 : cw; /* control characters show as ^X */
    }
    int rows = w / u->cols + 1 + 1;
    int max = u->rows / 2;
    return rows < 2 ? 2 : rows > max ? max : rows;
}

static void set_region(ui *u) { outf("\033[1;%dr", u->out_bottom); }

/* The input line drawn again from its first row (inside el_gets only:
 * libedit redraws from where it believes the prompt starts). */
static void redraw_input(ui *u) {
    outs("\033[?25l");
    for (int r = footer_row(u) + 1; r <= u->rows; r++) outf("\033[%d;1H\033[2K", r);
    outf("\033[%d;1H", footer_row(u) + 1);
    el_set(u->el, EL_REFRESH);
    outs("\033[?25h");
}

/* Recompute the bottom area; move the output region when it changes. */
static void layout(ui *u, bool force, bool in_edit) {
    int qrows = link_queue_len(u->l) ? 1 : 0;
    int irows = input_rows_needed(u);
    int reserve = qrows + 1 + irows;
    if (reserve == u->reserve && !force) return;
    int old_bottom = u->out_bottom;
    int bottom = u->rows - reserve;
    if (bottom < 2) bottom = 2;
    outs("\033[?25l");
    if (old_bottom && bottom < old_bottom) {
        /* the output area shrinks: scroll it up so its last lines stay */
        outf("\033[%d;1H", old_bottom);
        for (int i = 0; i < old_bottom - bottom; i++) outs("\n");
    } else if (old_bottom && bottom > old_bottom) {
        /* it grows: move the text down into the new rows */
        outf("\033[1;%dr\033[1;1H", bottom);
        for (int i = 0; i < bottom - old_bottom; i++) outs("\033M");
    }
    u->out_bottom = bottom;
    u->reserve = u->rows - bottom;
    u->queue_rows = qrows;
    u->input_rows = u->rows - bottom - qrows - 1;
    set_region(u);
    for (int r = bottom + 1; r <= u->rows; r++) outf("\033[%d;1H\033[2K", r);
    u->footer[0] = 0;
    draw_footer(u, true);
    outf("\033[%d;1H", footer_row(u) + 1);
    outs("\033[?25h");
    if (in_edit) redraw_input(u);
}

static void ui_start_screen(ui *u) {
    term_size(u);
    /* make room at the bottom without erasing what is on the screen */
    outf("\033[%d;1H", u->rows);
    for (int i = 0; i < 4; i++) outs("\n");
    u->out_bottom = 0;
    u->out_col = 0;
    outs("\033[?2004h"); /* bracketed paste */
}

static void ui_end_screen(ui *u) {
    outs("\033[?2004l\033[r");
    for (int r = u->out_bottom + 1; r <= u->rows; r++) outf("\033[%d;1H\033[2K", r);
    outf("\033[%d;1H", u->out_bottom + 1);
}

/* A new terminal size: lay the screen out again and show the recent
 * output (the terminal reflowed or cut what it had). */
static void on_resize(ui *u) {
    term_size(u);
    el_resize(u->el);
    u->out_bottom = 0;
    outs("\033[r\033[2J");
    u->out_col = 0;
    ds4_strbuf_truncate(&u->sgr, 0);
    layout(u, true, true);
    ds4_strbuf again = u->recent;
    u->recent = (ds4_strbuf){0};
    if (again.len) show_output(u, again.p, again.len);
    ds4_strbuf_free(&again);
}

/* ------------------------------------------------------------ input */

/* More input from the terminal within ms milliseconds. */
static bool stdin_ready(int ms) {
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    return poll(&p, 1, ms) > 0 && (p.revents & (POLLIN | POLLHUP));
}


static void read_more(ui *u) {
    if (u->nin >= sizeof(u->in)) return;
    ssize_t r = read(STDIN_FILENO, u->in + u->nin, sizeof(u->in) - u->nin);
    if (r > 0) u->nin += (size_t)r;
}

static int take_byte(ui *u) {
    if (!u->nin) return -1;
    int c = u->in[0];
    memmove(u->in, u->in + 1, --u->nin);
    return c;
}

/* A paste ended: text without line breaks or tabs is typed in; a block
 * becomes "[paste #N: L lines]", expanded on Enter. */
static void paste_done(ui *u) {
    ds4_strbuf *p = &u->pasting;
    bool block = false;
    for (size_t i = 0; i < p->len; i++)
        if (p->p[i] == '\n' || p->p[i] == '\r' || p->p[i] == '\t') block = true;
    if (!p->len) return;
    if (!block) {
        ds4_strbuf_putc(p, 0);
        el_insertstr(u->el, p->p);
    } else {
        char **np = realloc(u->paste, (u->npaste + 1) * sizeof(*np));
        if (np) {
            u->paste = np;
            for (size_t i = 0; i < p->len; i++)
                if (p->p[i] == '\r') p->p[i] = '\n';
            u->paste[u->npaste] = ds4_strbuf_take(p, NULL);
            int lines = 1;
            for (const char *s = u->paste[u->npaste]; *s; s++) lines += *s == '\n';
            char ph[64];
            snprintf(ph, sizeof(ph), "[paste #%zu: %d lines]", ++u->npaste, lines);
            el_insertstr(u->el, ph);
        }
    }
    ds4_strbuf_truncate(p, 0);
    layout(u, false, true);
    redraw_input(u);
}

/* Collect a bracketed paste from the bytes at hand; true while inside it. */
static bool feed_paste(ui *u) {
    while (u->nin) {
        size_t el = strlen(PASTE_END);
        if (u->in[0] == 0x1b) {
            if (u->nin < el) {
                if (!stdin_ready(50)) return true;
                read_more(u);
                if (u->nin < el) continue;
            }
            if (!memcmp(u->in, PASTE_END, el)) {
                memmove(u->in, u->in + el, u->nin -= el);
                u->in_paste = false;
                paste_done(u);
                return false;
            }
        }
        ds4_strbuf_putc(&u->pasting, (char)take_byte(u));
    }
    return true;
}

static void answer(ui *u, int c) {
    link_answer(u->l, c);
    u->question = false;
    char msg[700];
    snprintf(msg, sizeof(msg), "%s -> %s\n", u->qtext,
             c == 'y'   ? "yes"
             : c == 'a' ? "always"
             : c == 'n' ? "no"
                        : "cancelled");
    ui_message(u, msg);
    u->footer[0] = 0;
    draw_footer(u, true);
}

/* Ctrl+C: answer no, interrupt the worker, or (idle) clear the line:
 * true when the line is to be cleared. */
static bool handle_sigint(ui *u) {
    if (u->question) {
        answer(u, 0);
        link_interrupt(u->l);
    } else if (link_busy(u->l)) {
        link_interrupt(u->l);
        ui_message(u, "\033[38;5;244m^C interrupting\033[0m\n");
    } else {
        return true;
    }
    return false;
}

/* Worker news: output, footer, questions, the end. */
static void pump_worker(ui *u) {
    link_drain_wake(u->l);
    ds4_strbuf o = {0};
    if (link_take_output(u->l, &o)) show_output(u, o.p, o.len);
    ds4_strbuf_free(&o);
    char q[600], ch[16];
    if (!u->question && link_question(u->l, q, sizeof(q), ch, sizeof(ch))) {
        u->question = true;
        snprintf(u->qtext, sizeof(u->qtext), "%s", q);
        snprintf(u->qchoices, sizeof(u->qchoices), "%s", ch);
        outs("\a");
        draw_footer(u, true);
    }
    layout(u, false, true);
    draw_footer(u, false);
}

/* libedit's character source and the UI's event loop. */
static int getc_fn(EditLine *el, wchar_t *wc) {
    ui *u;
    el_get(el, EL_CLIENTDATA, &u);
    layout(u, false, true);
    for (;;) {
        if (u->in_paste && feed_paste(u)) {
            /* inside a paste: wait for the rest (a terminal that never
             * sends the end marker gets the paste ended after 2 s) */
            if (stdin_ready(2000)) {
                read_more(u);
            } else {
                u->in_paste = false;
                paste_done(u);
            }
            continue;
        }
        if (link_stopped(u->l)) {
            u->quit = true;
            return -1;
        }
        if (u->nin) {
            int c = u->in[0];
            if (u->question) {
                take_byte(u);
                if (c < 128 && strchr(u->qchoices, c) && c) answer(u, c);
                else if (c == 0x1b || c == 3) answer(u, 0);
                continue;
            }
            if (c == 0x1b) {
                /* a bare ESC, or the start of a sequence? */
                if (u->nin == 1 && !stdin_ready(40)) {
                    take_byte(u);
                    if (link_busy(u->l)) {
                        link_interrupt(u->l);
                        ui_message(u, "\033[38;5;244mESC: interrupted, the queued prompt goes next\033[0m\n");
                    }
                    continue;
                }
                if (u->nin < strlen(PASTE_START) && stdin_ready(40)) read_more(u);
                if (u->nin >= strlen(PASTE_START) && !memcmp(u->in, PASTE_START, strlen(PASTE_START))) {
                    memmove(u->in, u->in + strlen(PASTE_START), u->nin -= strlen(PASTE_START));
                    u->in_paste = true;
                    ds4_strbuf_truncate(&u->pasting, 0);
                    continue;
                }
            }
            if (c == 3) { /* Ctrl+C as a byte (no ISIG) */
                take_byte(u);
                if (handle_sigint(u)) {
                    *wc = 0x15; /* Ctrl+U: kill the line */
                    return 1;
                }
                continue;
            }
            /* one character to libedit */
            mbstate_t st;
            memset(&st, 0, sizeof(st));
            size_t k = mbrtowc(wc, (const char *)u->in, u->nin, &st);
            if (k == (size_t)-2) {
                if (stdin_ready(50)) {
                    read_more(u);
                    continue;
                }
                k = (size_t)-1;
            }
            if (k == (size_t)-1 || k == 0) {
                *wc = u->in[0];
                k = 1;
            }
            memmove(u->in, u->in + k, u->nin -= k);
            return 1;
        }
        struct pollfd p[3] = {{.fd = STDIN_FILENO, .events = POLLIN},
                              {.fd = link_wake_fd(u->l), .events = POLLIN},
                              {.fd = u->sigfd, .events = POLLIN}};
        int r = poll(p, 3, (int)(FOOTER_PERIOD * 1000));
        if (r < 0 && errno != EINTR) return -1;
        if (p[2].revents) {
            char b[32];
            ssize_t k = read(u->sigfd, b, sizeof(b));
            for (ssize_t i = 0; i < k; i++)
                if (b[i] == SIGWINCH) on_resize(u);
            bool clear = false;
            while (u->seen_sigint != app_sigint_count()) {
                u->seen_sigint++;
                clear |= handle_sigint(u);
            }
            if (clear) {
                *wc = 0x15;
                return 1;
            }
        }
        pump_worker(u);
        if (p[0].revents & (POLLIN | POLLHUP)) {
            size_t before = u->nin;
            read_more(u);
            if (u->nin == before && (p[0].revents & POLLHUP)) return 0;
        }
    }
}

/* ------------------------------------------------------------ keys */

static unsigned char key_take_back(EditLine *el, int ch) {
    (void)ch;
    ui *u;
    el_get(el, EL_CLIENTDATA, &u);
    char *t = link_queue_take_back(u->l);
    if (!t) return CC_REFRESH_BEEP;
    if (strchr(t, '\n')) {
        /* a multi-line prompt comes back as a paste */
        ds4_strbuf_truncate(&u->pasting, 0);
        ds4_strbuf_puts(&u->pasting, t);
        paste_done(u);
    } else {
        el_insertstr(el, t);
    }
    free(t);
    u->footer[0] = 0;
    return CC_REFRESH;
}

static const char *const COMMANDS[] = {"/help", "/save", "/list", "/switch ", "/history", "/new", "/quit", "/exit"};

static unsigned char key_complete(EditLine *el, int ch) {
    (void)ch;
    ui *u;
    el_get(el, EL_CLIENTDATA, &u);
    const LineInfo *li = el_line(el);
    size_t n = (size_t)(li->cursor - li->buffer);
    char line[256];
    if (n >= sizeof(line)) return CC_REFRESH_BEEP;
    memcpy(line, li->buffer, n);
    line[n] = 0;
    if (line[0] == '/' && !strchr(line, ' ')) {
        const char *hit = NULL;
        int hits = 0;
        for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++)
            if (!strncmp(COMMANDS[i], line, n)) hit = COMMANDS[i], hits++;
        if (hits != 1) return CC_REFRESH_BEEP;
        el_insertstr(el, hit + n);
        return CC_REFRESH;
    }
    if (strncmp(line, "/switch ", 8)) return CC_REFRESH_BEEP;
    const char *prefix = line + 8;
    prefix += strspn(prefix, " ");
    size_t pl = strlen(prefix), k = 0;
    char **ids = sessions_complete(u->dir, prefix, &k);
    if (!k) return CC_REFRESH_BEEP;
    /* the longest common prefix, at least 8 digits when unique */
    size_t common = 40;
    for (size_t i = 1; i < k; i++) {
        size_t j = 0;
        while (j < common && ids[0][j] == ids[i][j]) j++;
        common = j;
    }
    if (k == 1) common = 8 > pl ? 8 : pl;
    if (common > pl) {
        char add[48];
        snprintf(add, sizeof(add), "%.*s", (int)(common - pl), ids[0] + pl);
        el_insertstr(el, add);
    }
    if (k > 1) {
        ds4_strbuf b = {0};
        ds4_strbuf_puts(&b, "\033[36msessions, most recent first:");
        for (size_t i = 0; i < k && i < 20; i++) ds4_strbuf_printf(&b, " %.8s", ids[i]);
        if (k > 20) ds4_strbuf_printf(&b, " (+%zu)", k - 20);
        ds4_strbuf_puts(&b, "\033[0m\n");
        show_output(u, b.p, b.len);
        ds4_strbuf_free(&b);
    }
    for (size_t i = 0; i < k; i++) free(ids[i]);
    free(ids);
    return CC_REFRESH;
}

static const char *prompt_fn(EditLine *el) {
    (void)el;
    return PROMPT;
}

/* The line with its paste placeholders expanded. */
static char *expand_pastes(ui *u, const char *line) {
    ds4_strbuf b = {0};
    const char *p = line;
    while (*p) {
        unsigned idx;
        int len = 0, lines;
        if (*p == '[' && sscanf(p, "[paste #%u: %d lines]%n", &idx, &lines, &len) == 2 && len > 0 && idx >= 1 &&
            idx <= u->npaste) {
            ds4_strbuf_puts(&b, u->paste[idx - 1]);
            p += len;
        } else {
            ds4_strbuf_putc(&b, *p++);
        }
    }
    for (size_t i = 0; i < u->npaste; i++) free(u->paste[i]);
    free(u->paste);
    u->paste = NULL;
    u->npaste = 0;
    return ds4_strbuf_take(&b, NULL);
}

static void banner(ui *u) {
    char b[800];
    snprintf(b, sizeof(b),
             "\033[1mds4-agent\033[0m  %s%s  ctx %u  root %s\n"
             "\033[38;5;244mbash/write/edit: %s. /help for commands; Enter while busy queues, ESC interrupts, "
             "Ctrl+D leaves.\033[0m\n",
             u->o->server ? "server " : "model ", u->o->server ? u->o->server : u->o->model, u->o->ctx, u->o->root,
             u->o->allow == AGENT_ALLOW_ALL ? "allowed (--yolo)"
             : u->o->allow                  ? "some allowed (--allow), others ask"
                                            : "ask first");
    ui_message(u, b);
}

int tui_run(agent *a, agent_link *l, const agent_opts *o, display *d, const char *session_dir, int sigfd) {
    const char *loc = setlocale(LC_CTYPE, "");
    if (!loc || strcmp(nl_langinfo(CODESET), "UTF-8") != 0) setlocale(LC_CTYPE, "C.UTF-8");
    ui u = {.a = a, .l = l, .o = o, .d = d, .dir = session_dir, .sigfd = sigfd};
    u.el = el_init("ds4-agent", stdin, stdout, stderr);
    if (!u.el) return 1;
    el_set(u.el, EL_EDITOR, "emacs");
    el_set(u.el, EL_CLIENTDATA, &u);
    el_set(u.el, EL_PROMPT, prompt_fn);
    el_wset(u.el, EL_GETCFN, getc_fn);
    el_set(u.el, EL_ADDFN, "ds4-complete", "complete a command or a session id", key_complete);
    el_set(u.el, EL_BIND, "^I", "ds4-complete", NULL);
    el_set(u.el, EL_ADDFN, "ds4-take-back", "edit the first queued prompt", key_take_back);
    el_set(u.el, EL_BIND, "^X", "ds4-take-back", NULL);
    HistEvent ev;
    if ((u.hist = history_init())) {
        history(u.hist, &ev, H_SETSIZE, 1000);
        history(u.hist, &ev, H_SETUNIQUE, 1);
        el_set(u.el, EL_HIST, history, u.hist);
        const char *home = getenv("HOME");
        if (home && *home && (u.hist_path = malloc(strlen(home) + sizeof(HISTORY_FILE) + 2))) {
            sprintf(u.hist_path, "%s/%s", home, HISTORY_FILE);
            history(u.hist, &ev, H_LOAD, u.hist_path);
        }
    }
    ui_start_screen(&u);
    layout(&u, true, false);
    banner(&u);
    while (!u.quit) {
        int n = 0;
        outf("\033[%d;1H", footer_row(&u) + 1);
        const char *line = el_gets(u.el, &n);
        if (!line) {
            if (u.quit || link_stopped(l)) break;
            /* Ctrl+D on an empty line: leave, as /quit does */
            if (link_busy(l)) {
                link_interrupt(l);
                char *t;
                while ((t = link_queue_try_pop(l))) free(t);
            }
            link_queue_push(l, "/quit");
            u.quit = false;
            continue;
        }
        char *text = expand_pastes(&u, line);
        if (!text) continue;
        size_t len = strlen(text);
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = 0;
        if (text[strspn(text, " \t")]) {
            if (u.hist) {
                history(u.hist, &ev, H_ENTER, text);
                if (u.hist_path) history(u.hist, &ev, H_SAVE, u.hist_path);
            }
            bool quit = !strcmp(text, "/quit") || !strcmp(text, "/exit");
            if (quit && link_busy(l)) {
                /* leave now: what runs is interrupted, what is queued is dropped */
                link_interrupt(l);
                char *t;
                while ((t = link_queue_try_pop(l))) free(t);
                link_queue_push(l, text);
            } else if (!strcmp(text, "/save") && link_busy(l)) {
                agent_request_save(a);
                ui_message(&u, "\033[36m/save: at the next safe point\033[0m\n");
            } else {
                link_queue_push(l, text);
            }
        }
        free(text);
        layout(&u, true, false);
    }
    ui_end_screen(&u);
    if (u.hist) history_end(u.hist);
    el_end(u.el);
    free(u.hist_path);
    for (size_t i = 0; i < u.npaste; i++) free(u.paste[i]);
    free(u.paste);
    ds4_strbuf_free(&u.sgr);
    ds4_strbuf_free(&u.recent);
    ds4_strbuf_free(&u.pasting);
    return 0;
}
