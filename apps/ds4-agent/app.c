/*
 * app.c - ds4-agent from the command line to exit: options, the instance
 * lock, the model (local engine or --server), the worker thread, and the
 * user interface: the terminal UI (tui.c) when stdin and stdout are a
 * terminal, else line mode, where every input line is a prompt or a
 * command, output goes to stdout as plain text and the program ends when
 * the input ends and the work queued is done.  In line mode nobody can
 * answer a permission question: bash, write and edit run only as --allow
 * or --yolo say.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"
#include "engine/startup.h"

/* The only process-wide state: the SIGINT counter the handler bumps (a
 * signal handler has no context) and the pipe that wakes the UI loop. */
static volatile sig_atomic_t sigint_count;
static int sig_pipe = -1;

static void on_signal(int sig) {
    if (sig == SIGINT) sigint_count++;
    if (sig_pipe >= 0) {
        char b = (char)sig;
        ssize_t w = write(sig_pipe, &b, 1);
        (void)w;
    }
}

int app_signals(int fds[2]) {
    if (pipe(fds) != 0) return -1;
    sig_pipe = fds[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGWINCH, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

int app_sigint_count(void) { return sigint_count; }

static void write_all(int fd, const char *s, size_t n) {
    while (n) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* Line mode: stdin lines in, plain output out. */
static int line_mode(agent_link *l, int sigfd) {
    link_set_no_ui(l, true);
    ds4_strbuf out = {0}, line = {0};
    bool eof = false;
    int seen_int = 0;
    for (;;) {
        struct pollfd p[3] = {{.fd = link_wake_fd(l), .events = POLLIN},
                              {.fd = sigfd, .events = POLLIN},
                              {.fd = eof ? -1 : STDIN_FILENO, .events = POLLIN}};
        poll(p, 3, 200);
        if (p[1].revents) {
            char b[16];
            while (read(sigfd, b, sizeof(b)) > 0) {}
        }
        if (app_sigint_count() != seen_int) {
            int now = app_sigint_count();
            if (link_busy(l) && now - seen_int < 2) link_interrupt(l);
            else {
                link_stop(l);
                break;
            }
            seen_int = now;
        }
        link_drain_wake(l);
        out.len = 0;
        if (link_take_output(l, &out)) write_all(STDOUT_FILENO, out.p, out.len);
        if (p[2].revents) {
            char buf[4096];
            ssize_t r = read(STDIN_FILENO, buf, sizeof(buf));
            if (r <= 0) eof = true;
            for (ssize_t i = 0; i < r; i++) {
                if (buf[i] != '\n') {
                    ds4_strbuf_putc(&line, buf[i]);
                    continue;
                }
                if (line.len && line.p[strspn(line.p, " \t")]) link_queue_push(l, line.p);
                ds4_strbuf_truncate(&line, 0);
            }
            if (eof && line.len) {
                link_queue_push(l, line.p);
                ds4_strbuf_truncate(&line, 0);
            }
        }
        if (link_stopped(l)) break;
        if (eof && !link_busy(l) && link_queue_len(l) == 0) {
            link_stop(l);
            break;
        }
    }
    out.len = 0;
    if (link_take_output(l, &out)) write_all(STDOUT_FILENO, out.p, out.len);
    ds4_strbuf_free(&out);
    ds4_strbuf_free(&line);
    return 0;
}

static bool want_color(void) {
    const char *term = getenv("TERM");
    return isatty(STDOUT_FILENO) && !getenv("NO_COLOR") && !(term && !strcmp(term, "dumb"));
}

int agent_app_main(int argc, char **argv, const agent_hooks *hooks) {
    agent_opts o;
    int rc = agent_parse_options(argc, argv, &o);
    if (rc >= 0) return rc;
    static const agent_hooks none = {0};
    if (!hooks) hooks = &none;
    FILE *trace = NULL;
    if (o.trace && !(trace = fopen(o.trace, "w"))) {
        fprintf(stderr, "ds4-agent: --trace %s: %s\n", o.trace, strerror(errno));
        return 1;
    }
    if (!o.server && (rc = ds4_startup_lock("ds4-agent")) != 0) {
        if (trace) fclose(trace);
        return rc;
    }
    if (o.think == DS4_THINK_MAX && o.ctx < DS4_THINK_MAX_MIN_CTX && !o.server)
        fprintf(stderr, "ds4-agent: --think-max needs a context of at least %u tokens (-c %u): using normal thinking\n",
                DS4_THINK_MAX_MIN_CTX, o.ctx);
    const char *term = getenv("TERM");
    bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO) && term && *term && strcmp(term, "dumb") != 0;
    int sig[2] = {-1, -1};
    agent_link *l = link_new();
    display *d = l ? display_new(l, want_color()) : NULL;
    ds4_err err = {0};
    agent_model *m = NULL;
    agent *a = NULL;
    worker *w = NULL;
    if (!l || !d || app_signals(sig) != 0) {
        fprintf(stderr, "ds4-agent: out of resources at startup\n");
        rc = 1;
        goto done;
    }
    m = o.server ? remote_model_new(&o, hooks, l, d, trace, &err) : local_model_new(&o, hooks, l, d, trace, &err);
    if (m) a = agent_new(&o, m, l, d, trace, &err);
    if (!m || !a) {
        fprintf(stderr, "ds4-agent: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    /* the worker and the job pump leave signals to this thread */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGWINCH);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    w = worker_start(a, l, &err);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!w) {
        fprintf(stderr, "ds4-agent: %s\n", err.msg);
        rc = 1;
        goto done;
    }
    if (o.prompt) link_queue_push(l, o.prompt);
    char *dir = sessions_dir(&o, &err);
    rc = tty ? tui_run(a, l, &o, d, dir, sig[0]) : line_mode(l, sig[0]);
    free(dir);
    link_stop(l);
    worker_join(w);
    {
        ds4_strbuf out = {0};
        if (link_take_output(l, &out)) write_all(STDOUT_FILENO, out.p, out.len);
        ds4_strbuf_free(&out);
    }
done:
    agent_free(a);
    if (m) m->ops->free(m);
    display_free(d);
    link_free(l);
    if (sig[0] >= 0) {
        sig_pipe = -1;
        close(sig[0]);
        close(sig[1]);
    }
    if (trace) fclose(trace);
    return rc;
}
