/*
 * jobs.c - bash commands as tracked asynchronous jobs, and the bash,
 * bash_status and bash_stop tools (see tools.h).
 *
 * A job is `sh -c COMMAND` in its own process group (so a stop or a
 * timeout reaches everything it started), stdin from /dev/null, stdout
 * and stderr into one pipe.  A pump thread drains every job's pipe as
 * output arrives, so a chatty job never blocks on a full pipe while the
 * model is busy elsewhere, and enforces timeouts (SIGTERM to the group,
 * SIGKILL a second later).  Output is bounded twice: the first 16 MiB go
 * to a private temporary file (for the head, and for the model to look at
 * with other commands), the last 32 KiB stay in memory (the tail); bytes
 * and lines are counted whatever the volume.
 *
 * What the model reads: the first look at a job shows the head of its
 * output (100 lines / 8 KiB; a job that ended with more also shows its
 * last 20 lines), later looks show what is new, tail-biased (4 lines while
 * it runs, 20 when it has ended).  A job reported as ended is forgotten.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/generate.h"
#include "tools.h"

#define JOB_FILE_MAX        (16u << 20)
#define JOB_TAIL            (32u << 10)
#define JOB_HEAD_LINES      100
#define JOB_HEAD_BYTES      8192
#define JOB_RUNNING_LINES   4
#define JOB_FINAL_LINES     20
#define JOB_TIMEOUT_DEFAULT 3600
#define JOB_TIMEOUT_MAX     86400
#define JOB_REFRESH_DEFAULT 60
#define JOB_REFRESH_MAX     3600

typedef struct job {
    int id;
    pid_t pid;
    int fd;   /* pipe, -1 once closed */
    int file; /* output file, -1 when none */
    char path[128];
    char *cmd;
    double start, timeout, term_at, end;
    uint64_t bytes, lines;
    char last;           /* last output byte */
    char tail[JOB_TAIL]; /* ring of the last output bytes */
    size_t tail_pos;     /* next write position */
    bool running, timed_out, stopping;
    int status;              /* exit code, or 128 + signal */
    bool observed;           /* seen at least once */
    uint64_t observed_bytes; /* output already reported */
    struct job *next;
} job;

struct jobs {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a job ended */
    pthread_t thread;
    bool thread_on, quit;
    int ctl[2]; /* wakes the pump (new job, quit) */
    job *head;
    int next_id;
    char **kept; /* output files of forgotten jobs, deleted at the end */
    size_t n_kept;
};

static void *pump(void *arg);

jobs *jobs_new(ds4_err *err) {
    jobs *j = calloc(1, sizeof(*j));
    if (!j) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    if (pipe(j->ctl) != 0) {
        free(j);
        ds4_err_set(err, DS4_EIO, "pipe: %s", strerror(errno));
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(j->ctl[i], F_SETFL, fcntl(j->ctl[i], F_GETFL) | O_NONBLOCK);
        fcntl(j->ctl[i], F_SETFD, FD_CLOEXEC);
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->next_id = 1;
    return j;
}

static void poke(jobs *j) {
    char b = 1;
    ssize_t w = write(j->ctl[1], &b, 1);
    (void)w;
}

static void job_close(job *x) {
    if (x->fd >= 0) close(x->fd);
    if (x->file >= 0) close(x->file);
    x->fd = x->file = -1;
}

static void job_free(job *x) {
    job_close(x);
    if (x->path[0]) unlink(x->path);
    free(x->cmd);
    free(x);
}

void jobs_free(jobs *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    for (job *x = j->head; x; x = x->next)
        if (x->running) kill(-x->pid, SIGKILL);
    j->quit = true;
    pthread_mutex_unlock(&j->mu);
    poke(j);
    if (j->thread_on) pthread_join(j->thread, NULL);
    for (job *x = j->head, *n; x; x = n) {
        n = x->next;
        if (x->running) waitpid(x->pid, NULL, 0);
        job_free(x);
    }
    for (size_t i = 0; i < j->n_kept; i++) {
        unlink(j->kept[i]);
        free(j->kept[i]);
    }
    free(j->kept);
    close(j->ctl[0]);
    close(j->ctl[1]);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* ------------------------------------------------------------ pump */

static void take_output(job *x, const char *buf, size_t n) {
    if (x->file >= 0 && x->bytes < JOB_FILE_MAX) {
        size_t keep = n < JOB_FILE_MAX - x->bytes ? n : (size_t)(JOB_FILE_MAX - x->bytes);
        if (pwrite(x->file, buf, keep, (off_t)x->bytes) < 0) {
            close(x->file);
            x->file = -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        x->lines += buf[i] == '\n';
        x->tail[x->tail_pos] = buf[i];
        x->tail_pos = (x->tail_pos + 1) % JOB_TAIL;
    }
    x->bytes += n;
    x->last = buf[n - 1];
}

static void finish(jobs *j, job *x, int st) {
    x->running = false;
    x->end = ds4_now();
    x->status = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
    pthread_cond_broadcast(&j->cv);
}

/* What the pipe holds now (non-blocking reads up to EAGAIN; EOF closes
 * it): the output an exited job wrote before its end, which the pump's
 * last poll may not have seen.  buf: room for a read. */
static void drain(job *x, char *buf, size_t cap) {
    while (x->fd >= 0) {
        ssize_t r = read(x->fd, buf, cap);
        if (r > 0) {
            take_output(x, buf, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r == 0 || errno != EAGAIN) {
            close(x->fd);
            x->fd = -1;
        }
        return;
    }
}

/* Reap, enforce timeouts and stops.  With the mutex held.  A reaped job's
 * pipe is drained before it is reported done: its last output (up to a
 * pipe's buffer, 64 KiB) was otherwise lost when the exit was seen before
 * the data (`yes | head -c 20000000`: 48 KB short). */
static void check_processes(jobs *j, char *buf, size_t cap) {
    double now = ds4_now();
    for (job *x = j->head; x; x = x->next) {
        if (!x->running) continue;
        int st;
        pid_t r = waitpid(x->pid, &st, WNOHANG);
        if (r == x->pid) {
            drain(x, buf, cap);
            finish(j, x, st);
            continue;
        }
        if (r < 0 && errno == ECHILD) {
            x->running = false;
            x->status = -1;
            x->end = now;
            pthread_cond_broadcast(&j->cv);
            continue;
        }
        if (!x->stopping && !x->timed_out && now - x->start >= x->timeout) {
            x->timed_out = true;
            x->term_at = now;
            kill(-x->pid, SIGTERM);
        }
        if ((x->stopping || x->timed_out) && now - x->term_at >= 1.0) kill(-x->pid, SIGKILL);
    }
}

static void *pump(void *arg) {
    jobs *j = arg;
    struct pollfd fds[65];
    job *who[65];
    char buf[65536];
    pthread_mutex_lock(&j->mu);
    while (!j->quit) {
        int n = 0;
        fds[n++] = (struct pollfd){.fd = j->ctl[0], .events = POLLIN};
        for (job *x = j->head; x && n < 65; x = x->next)
            if (x->fd >= 0) {
                who[n] = x;
                fds[n++] = (struct pollfd){.fd = x->fd, .events = POLLIN};
            }
        pthread_mutex_unlock(&j->mu);
        poll(fds, (nfds_t)n, 100);
        pthread_mutex_lock(&j->mu);
        if (fds[0].revents) {
            while (read(j->ctl[0], buf, sizeof(buf)) > 0) {}
        }
        for (int i = 1; i < n; i++) {
            if (!fds[i].revents) continue;
            job *x = who[i];
            /* the job may have been forgotten while the lock was released */
            job *y = j->head;
            while (y && y != x) y = y->next;
            if (!y || x->fd < 0) continue;
            ssize_t r = read(x->fd, buf, sizeof(buf));
            if (r > 0) take_output(x, buf, (size_t)r);
            else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
                close(x->fd);
                x->fd = -1;
            }
        }
        check_processes(j, buf, sizeof(buf));
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* ------------------------------------------------------------ api */

int jobs_start(jobs *j, const char *cmd, const char *cwd, double timeout_s, int *id, int *pid_out, ds4_err *err) {
    int p[2];
    if (pipe(p) != 0) return ds4_err_set(err, DS4_EIO, "pipe: %s", strerror(errno));
    job *x = calloc(1, sizeof(*x));
    if (!x || !(x->cmd = strdup(cmd))) {
        free(x);
        close(p[0]);
        close(p[1]);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(x->path, sizeof(x->path), "%s/ds4-agent-job-XXXXXX", tmp && *tmp && strlen(tmp) < 80 ? tmp : "/tmp");
    x->file = mkstemp(x->path);
    if (x->file < 0) x->path[0] = 0;
    else fcntl(x->file, F_SETFD, FD_CLOEXEC);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        if (devnull >= 0) close(devnull);
        job_free(x);
        return ds4_err_set(err, DS4_EIO, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        /* only async-signal-safe calls until exec */
        setpgid(0, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGTSTP, SIG_DFL);
        if (devnull >= 0) dup2(devnull, STDIN_FILENO);
        dup2(p[1], STDOUT_FILENO);
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        close(p[1]);
        if (cwd && chdir(cwd) != 0) _exit(126);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid); /* also here: no window where a stop misses the group */
    close(p[1]);
    if (devnull >= 0) close(devnull);
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    fcntl(p[0], F_SETFD, FD_CLOEXEC);
    x->pid = pid;
    x->fd = p[0];
    x->start = ds4_now();
    x->timeout = timeout_s;
    x->running = true;
    pthread_mutex_lock(&j->mu);
    x->id = j->next_id++;
    x->next = j->head;
    j->head = x;
    bool start_thread = !j->thread_on;
    if (start_thread) j->thread_on = pthread_create(&j->thread, NULL, pump, j) == 0;
    pthread_mutex_unlock(&j->mu);
    poke(j);
    *id = x->id;
    if (pid_out) *pid_out = pid;
    return 0;
}

static job *find(jobs *j, int id) {
    for (job *x = j->head; x; x = x->next)
        if (x->id == id) return x;
    return NULL;
}

int jobs_find(jobs *j, int id, int pid) {
    pthread_mutex_lock(&j->mu);
    int r = 0;
    for (job *x = j->head; x && !r; x = x->next)
        if ((id > 0 && x->id == id) || (id <= 0 && pid > 0 && x->pid == pid)) r = x->id;
    pthread_mutex_unlock(&j->mu);
    return r;
}

void jobs_wait(jobs *j, int id, double seconds, volatile sig_atomic_t *cancel) {
    double until = ds4_now() + seconds;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        job *x = find(j, id);
        if (!x || !x->running || (cancel && *cancel)) break;
        double now = ds4_now();
        if (now >= until) break;
        ds4_cond_wait_for(&j->cv, &j->mu, until - now < 0.1 ? until - now : 0.1);
    }
    pthread_mutex_unlock(&j->mu);
}

void jobs_stop(jobs *j, int id) {
    pthread_mutex_lock(&j->mu);
    job *x = find(j, id);
    if (x && x->running && !x->stopping) {
        x->stopping = true;
        x->term_at = ds4_now();
        kill(-x->pid, SIGTERM);
    }
    pthread_mutex_unlock(&j->mu);
    poke(j);
    jobs_wait(j, id, 3.0, NULL);
}

static void fmt_size(uint64_t b, char *buf, size_t n) {
    if (b < 1024) snprintf(buf, n, "%llu B", (unsigned long long)b);
    else if (b < (1u << 20)) snprintf(buf, n, "%.1f KiB", b / 1024.0);
    else snprintf(buf, n, "%.1f MiB", b / 1048576.0);
}

void jobs_footer(jobs *j, int id, char *buf, size_t n) {
    buf[0] = 0;
    pthread_mutex_lock(&j->mu);
    job *x = find(j, id);
    if (x && x->running) {
        char sz[32];
        fmt_size(x->bytes, sz, sizeof(sz));
        snprintf(buf, n, "bash job %d running %.0f s, %s", x->id, ds4_now() - x->start, sz);
    }
    pthread_mutex_unlock(&j->mu);
}

/* The last `max_lines` lines of the output after byte `from` (within the
 * in-memory tail).  With the mutex held. */
static void tail_lines(const job *x, uint64_t from, int max_lines, ds4_strbuf *out, bool *cut) {
    uint64_t avail = x->bytes < JOB_TAIL ? x->bytes : JOB_TAIL;
    uint64_t want = x->bytes - from;
    *cut = want > avail;
    if (want > avail) want = avail;
    /* copy the last `want` bytes out of the ring */
    char *tmp = calloc(want + 1, 1);
    if (!tmp) return;
    for (uint64_t i = 0; i < want; i++) tmp[i] = x->tail[(x->tail_pos + JOB_TAIL - want + i) % JOB_TAIL];
    size_t start = 0;
    int nl = 0;
    for (size_t i = want; i > 0; i--)
        if (tmp[i - 1] == '\n' && i != want && ++nl >= max_lines) {
            start = i;
            *cut = true;
            break;
        }
    ds4_strbuf_append(out, tmp + start, want - start);
    if (want - start && tmp[want - 1] != '\n') ds4_strbuf_putc(out, '\n');
    free(tmp);
}

/* The head of the output from the file: at most JOB_HEAD_LINES lines and
 * JOB_HEAD_BYTES bytes.  Returns the bytes taken. */
static size_t head_lines(const job *x, ds4_strbuf *out) {
    size_t have = x->bytes < JOB_FILE_MAX ? (size_t)x->bytes : JOB_FILE_MAX;
    size_t n = have < JOB_HEAD_BYTES ? have : JOB_HEAD_BYTES;
    char buf[JOB_HEAD_BYTES];
    if (x->file < 0 || pread(x->file, buf, n, 0) != (ssize_t)n) {
        /* no file: the output so far is in the tail when short enough */
        bool cut;
        tail_lines(x, 0, JOB_HEAD_LINES, out, &cut);
        return (size_t)x->bytes;
    }
    size_t take = 0;
    int lines = 0;
    while (take < n && lines < JOB_HEAD_LINES)
        if (buf[take++] == '\n') lines++;
    ds4_strbuf_append(out, buf, take);
    if (take && buf[take - 1] != '\n') ds4_strbuf_putc(out, '\n');
    return take;
}

char *jobs_observe(jobs *j, int id, char **shown, bool *failed) {
    ds4_strbuf b = {0}, body = {0};
    *shown = NULL;
    *failed = false;
    pthread_mutex_lock(&j->mu);
    job *x = find(j, id);
    if (!x) {
        pthread_mutex_unlock(&j->mu);
        return tool_error("bash job %d not found (it ended and was reported, or never existed)", id);
    }
    double t = (x->running ? ds4_now() : x->end) - x->start;
    ds4_strbuf_printf(&b, "bash job=%d pid=%d status=%s elapsed_sec=%.1f", x->id, (int)x->pid,
                      x->running ? "running" : "done", t);
    if (x->running) ds4_strbuf_printf(&b, " timeout_sec=%.0f", x->timeout);
    else {
        ds4_strbuf_printf(&b, " exit_status=%d", x->status);
        if (x->timed_out) ds4_strbuf_printf(&b, " timed_out=true (killed after %.0f s)", x->timeout);
        if (x->stopping) ds4_strbuf_puts(&b, " stopped=true");
    }
    ds4_strbuf_puts(&b, "\n");
    *failed = !x->running && x->status != 0;
    uint64_t lines = x->lines + (x->bytes && x->last != '\n');
    bool whole = !x->running && !x->observed && x->bytes <= JOB_HEAD_BYTES && lines <= JOB_HEAD_LINES;
    if (x->bytes == 0) {
        ds4_strbuf_puts(&b, "(no output)\n");
    } else if (whole) {
        ds4_strbuf_puts(&b, "<output>\n");
        head_lines(x, &body);
        ds4_strbuf_append(&b, body.p, body.len);
        ds4_strbuf_puts(&b, "</output>\n");
    } else {
        char sz[32];
        fmt_size(x->bytes, sz, sizeof(sz));
        ds4_strbuf_printf(&b, "output: %s, %llu lines", sz, (unsigned long long)lines);
        if (x->path[0])
            ds4_strbuf_printf(&b, "; the first %s are in %s (look with bash: sed -n, tail, grep)",
                              x->bytes > JOB_FILE_MAX ? "16 MiB" : "bytes", x->path);
        ds4_strbuf_puts(&b, "\n");
        if (!x->observed) {
            ds4_strbuf_printf(&b, "<head lines=%d>\n", JOB_HEAD_LINES);
            size_t took = head_lines(x, &body);
            ds4_strbuf_append(&b, body.p, body.len);
            ds4_strbuf_puts(&b, "</head>\n");
            if (!x->running && took < x->bytes) {
                ds4_strbuf t2 = {0};
                bool cut;
                tail_lines(x, took, JOB_FINAL_LINES, &t2, &cut);
                ds4_strbuf_printf(&b, "<tail lines=%d>\n", JOB_FINAL_LINES);
                ds4_strbuf_append(&b, t2.p, t2.len);
                ds4_strbuf_puts(&b, "</tail>\n");
                ds4_strbuf_puts(&body, "[...]\n");
                ds4_strbuf_append(&body, t2.p, t2.len);
                ds4_strbuf_free(&t2);
            }
        } else if (x->bytes == x->observed_bytes) {
            ds4_strbuf_puts(&b, "(no new output since the last look)\n");
        } else {
            int max = x->running ? JOB_RUNNING_LINES : JOB_FINAL_LINES;
            bool cut;
            tail_lines(x, x->observed_bytes, max, &body, &cut);
            char nsz[32];
            fmt_size(x->bytes - x->observed_bytes, nsz, sizeof(nsz));
            ds4_strbuf_printf(&b, "new output since the last look: %s%s\n", nsz, cut ? ", its last lines:" : ":");
            ds4_strbuf_printf(&b, "<tail lines=%d>\n", max);
            ds4_strbuf_append(&b, body.p, body.len);
            ds4_strbuf_puts(&b, "</tail>\n");
        }
    }
    if (x->running)
        ds4_strbuf_printf(&b,
                          "The job is still running: bash_status job=%d to look again, bash_stop job=%d to end it.\n",
                          x->id, x->id);
    x->observed = true;
    x->observed_bytes = x->bytes;
    if (!x->running) {
        /* reported as ended: forget it (its file stays for the model when
         * the output was not shown whole) */
        for (job **p = &j->head; *p; p = &(*p)->next)
            if (*p == x) {
                *p = x->next;
                break;
            }
        if (!whole && x->path[0] && x->bytes > 0) {
            char **k = realloc(j->kept, (j->n_kept + 1) * sizeof(*k));
            if (k && (k[j->n_kept] = strdup(x->path))) {
                j->kept = k;
                j->n_kept++;
                x->path[0] = 0; /* kept until the agent exits */
            } else if (k) {
                j->kept = k;
            }
        }
        job_free(x);
    }
    pthread_mutex_unlock(&j->mu);
    if (body.len) *shown = ds4_strbuf_take(&body, NULL);
    ds4_strbuf_free(&body);
    return tool_text(&b);
}

char *jobs_running_note(jobs *j) {
    ds4_strbuf b = {0};
    pthread_mutex_lock(&j->mu);
    for (job *x = j->head; x; x = x->next) {
        if (!x->running) continue;
        if (!b.len)
            ds4_strbuf_puts(&b, "[ds4-agent: the conversation was compacted; these bash jobs are still running. "
                                "Use bash_status or bash_stop with their job numbers.]\n");
        char sz[32];
        fmt_size(x->bytes, sz, sizeof(sz));
        ds4_strbuf_printf(&b, "job=%d pid=%d running %.0f s, %s of output: %.200s\n", x->id, (int)x->pid,
                          ds4_now() - x->start, sz, x->cmd);
    }
    pthread_mutex_unlock(&j->mu);
    if (!b.len) return NULL;
    return tool_text(&b);
}

/* ------------------------------------------------------------ tools */

/* Wait for a job while keeping the footer current. */
static void wait_showing(tool_env *env, int id, double seconds) {
    double until = ds4_now() + seconds;
    volatile sig_atomic_t *cancel = link_cancel_flag(env->link);
    for (;;) {
        char f[160];
        jobs_footer(env->jobs, id, f, sizeof(f));
        if (!f[0] || *cancel) break;
        link_set_detail(env->link, f);
        double left = until - ds4_now();
        if (left <= 0) break;
        jobs_wait(env->jobs, id, left < 0.5 ? left : 0.5, cancel);
    }
    link_set_detail(env->link, "");
}

static char *observe(tool_env *env, int id) {
    char *shown;
    bool failed;
    char *r = jobs_observe(env->jobs, id, &shown, &failed);
    if (shown) {
        display_newline(env->d);
        display_write(env->d, failed ? OUT_ERROR : OUT_RESULT, shown, strlen(shown));
        free(shown);
    }
    if (r) {
        size_t n = strcspn(r, "\n");
        display_printf(env->d, failed ? OUT_ERROR : OUT_RESULT, "  %.*s\n", (int)n, r);
    }
    if (r && link_interrupted(env->link) && strstr(r, "status=running")) {
        ds4_strbuf b = {0};
        ds4_strbuf_puts(&b, r);
        ds4_strbuf_puts(&b, "(The user interrupted the wait; the job goes on.)\n");
        free(r);
        r = tool_text(&b);
    }
    return r;
}

char *tool_bash(tool_env *env, const json_t *args) {
    const char *cmd = arg_str(args, "command");
    long long timeout = JOB_TIMEOUT_DEFAULT, refresh = JOB_REFRESH_DEFAULT;
    if (arg_int(args, "timeout_sec", &timeout) && (timeout < 1 || timeout > JOB_TIMEOUT_MAX))
        return tool_error("bash: timeout_sec must be 1 to %d, not %lld", JOB_TIMEOUT_MAX, timeout);
    if (arg_int(args, "refresh_sec", &refresh) && (refresh < 1 || refresh > JOB_REFRESH_MAX))
        return tool_error("bash: refresh_sec must be 1 to %d, not %lld", JOB_REFRESH_MAX, refresh);
    if (!cmd[strspn(cmd, " \t\n")]) return tool_error("bash: the command is empty");
    char what[300], *denied;
    snprintf(what, sizeof(what), "%.240s%s", cmd, strlen(cmd) > 240 ? "…" : "");
    for (char *p = what; *p; p++)
        if (*p == '\n') *p = ' ';
    if (!tools_permit(env, AGENT_ALLOW_BASH, what, &denied)) return denied;
    int id, pid;
    ds4_err err = {0};
    if (jobs_start(env->jobs, cmd, env->jail.root, (double)timeout, &id, &pid, &err) != 0)
        return tool_error("bash: could not start the command: %s", err.msg);
    if (env->trace) trace_line(env->trace, "bash job %d pid %d started", id, pid);
    wait_showing(env, id, (double)refresh);
    return observe(env, id);
}

static int job_arg(tool_env *env, const char *tool, const json_t *args, char **err) {
    long long id = 0, pid = 0;
    bool has_id = arg_int(args, "job", &id), has_pid = arg_int(args, "pid", &pid);
    *err = NULL;
    if (!has_id && !has_pid) {
        *err = tool_error("%s: give job (the job number bash reported) or pid", tool);
        return 0;
    }
    int found = jobs_find(env->jobs, has_id ? (int)id : 0, has_id ? 0 : (int)pid);
    if (!found)
        *err = has_id ? tool_error("%s: no bash job %lld (ended jobs are forgotten once reported)", tool, id)
                      : tool_error("%s: no bash job with pid %lld", tool, pid);
    return found;
}

char *tool_bash_status(tool_env *env, const json_t *args) {
    char *e;
    int id = job_arg(env, "bash_status", args, &e);
    if (!id) return e;
    long long refresh = 0;
    if (arg_int(args, "refresh_sec", &refresh) && (refresh < 0 || refresh > JOB_REFRESH_MAX))
        return tool_error("bash_status: refresh_sec must be 0 to %d, not %lld", JOB_REFRESH_MAX, refresh);
    if (refresh > 0) wait_showing(env, id, (double)refresh);
    return observe(env, id);
}

char *tool_bash_stop(tool_env *env, const json_t *args) {
    char *e;
    int id = job_arg(env, "bash_stop", args, &e);
    if (!id) return e;
    jobs_stop(env->jobs, id);
    return observe(env, id);
}
