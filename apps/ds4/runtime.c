/*
 * runtime.c - model opening, memory estimate, Ctrl+C and terminal (see
 * runtime.h).
 */
#include "runtime.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "engine/startup.h"

volatile sig_atomic_t cli_interrupted;
static volatile sig_atomic_t phase; /* enum below */
enum { PHASE_IDLE, PHASE_BUSY, PHASE_LOADING };

static void say(const char *msg, size_t n) {
    ssize_t w = write(STDERR_FILENO, msg, n);
    (void)w;
}

static void on_sigint(int sig) {
    (void)sig;
    if (phase == PHASE_LOADING) {
        static const char msg[] = "\nds4: interrupted\n";
        say(msg, sizeof(msg) - 1);
        _exit(DS4_EXIT_INTERRUPTED);
    }
    if (cli_interrupted && phase == PHASE_BUSY) {
        static const char msg[] = "\nds4: interrupted twice, exiting\n";
        say(msg, sizeof(msg) - 1);
        _exit(DS4_EXIT_INTERRUPTED);
    }
    cli_interrupted = 1;
}

void cli_signals_init(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    /* A parent may have started us with SIGINT blocked: Ctrl+C must work
     * (a press that is already pending arrives here, before any work). */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigprocmask(SIG_UNBLOCK, &s, NULL);
}

void cli_busy(bool b) { phase = b ? PHASE_BUSY : PHASE_IDLE; }

void cli_loading(bool b) { phase = b ? PHASE_LOADING : PHASE_IDLE; }

bool cli_stop_requested(void *ctx) {
    (void)ctx;
    return cli_interrupted != 0;
}

void cli_warn_nan(uint32_t nan_steps, uint32_t steps) {
    if (nan_steps == 0) return;
    fprintf(stderr,
            "ds4: warning: the logits held NaN at %u of %u step%s: the model's weights hold NaN or Inf values "
            "(or a kernel failed), and the tokens chosen from those rows mean nothing\n",
            nan_steps, steps, ds4_plural(steps));
}

int cli_report_interrupt(void) {
    fputs("ds4: interrupted\n", stderr);
    return DS4_EXIT_INTERRUPTED;
}

ds4_engine *cli_engine_open(const cli_opts *o, ds4_dist *d, ds4_err *err) {
    if (ds4_model_file_check(o->model, err) != 0) return NULL;
    ds4_engine_opts eo = {
        .model_path = o->model,
        .backend = o->backend,
        .n_threads = o->threads,
        .no_sim = o->no_sim,
        .mtp_path = o->mtp.path,
        /* token-id datasets need no tokenizer, nor does inspecting a file */
        .need_vocab = o->mode != CLI_IMATRIX && o->mode != CLI_INSPECT,
        .header_only = o->mode == CLI_INSPECT, /* a header-only file's shapes and memory */
        .gpu_mem = o->gpu_mem,
        .host_mapped = o->host_mapped,
        .expert_profile = o->expert_profile,
        .dist = d,
        .dist_opts = &o->dist,
        .tensor_parallel = o->tensor_parallel,
        .prog = "ds4",
    };
    ds4_cli_steering_opts(&o->steer, &eo);
    return ds4_engine_open(&eo, err); /* its messages start with the path */
}

void cli_print_memory(const ds4_engine *e, uint32_t ctx) {
    ds4_startup_print_memory("ds4", e->backend_name, e->w, ctx);
}

cli_term cli_term_detect(void) {
    cli_term t = {.out_tty = isatty(STDOUT_FILENO) == 1, .err_tty = isatty(STDERR_FILENO) == 1};
    const char *term = getenv("TERM");
    if (getenv("NO_COLOR") || (term && !strcmp(term, "dumb"))) t.out_tty = false;
    return t;
}

static void progress_draw(uint32_t done, uint32_t total) {
    fprintf(stderr, "\rprocessing %u input tokens: %u/%u (%u%%)\033[K", total, done, total,
            total ? (unsigned)((uint64_t)done * 100 / total) : 100u);
    fflush(stderr);
}

void cli_progress_start(cli_progress *p, uint32_t total) {
    p->shown = false;
    if (!p->show || total == 0) return;
    progress_draw(0, total);
    p->shown = true;
}

int cli_progress_fn(void *ctx, uint32_t done, uint32_t total) {
    cli_progress *p = ctx;
    if (p && p->shown) progress_draw(done, total);
    return cli_interrupted != 0;
}

void cli_progress_clear(cli_progress *p) {
    if (!p->shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    p->shown = false;
}
