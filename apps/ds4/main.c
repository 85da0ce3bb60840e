/*
 * main.c - the ds4 program (ds4's CLI, README.md): chat with DeepSeek V4
 * Flash from the command line, one-shot or interactive, plus the
 * diagnostics that compare engines and model files.
 *
 * Files of this program: options.c (command line), runtime.c (model
 * opening, memory line, Ctrl+C, terminal), conversation.c (the chat over a
 * live session), printer.c (streaming output), oneshot.c and repl.c (the
 * two chat modes), dump_tokens.c, logprobs.c, perplexity.c, inspect.c (the
 * diagnostics), imatrix.c (importance-matrix collection).
 *
 * Exit status: 0 done, 1 an error (the message says what), 2 a usage error
 * or another ds4 process already running (the instance lock), 130 stopped
 * by Ctrl+C.
 */
#include <langinfo.h>
#include <locale.h>
#include <stdio.h>
#include <string.h>

#include "engine/startup.h"
#include "modes.h"
#include "runtime.h"

/* Line editing works in characters: make sure the C library decodes
 * UTF-8 even when the environment names no locale. */
static void utf8_locale(void) {
    const char *l = setlocale(LC_CTYPE, "");
    if (!l || strcmp(nl_langinfo(CODESET), "UTF-8") != 0) setlocale(LC_CTYPE, "C.UTF-8");
}

static int run_chat(ds4_engine *e, const cli_opts *o) {
    if (o->think == DS4_THINK_MAX && o->ctx < DS4_THINK_MAX_MIN_CTX)
        fprintf(stderr, "ds4: --think-max needs --ctx of at least %u (now %u): using normal thinking\n",
                DS4_THINK_MAX_MIN_CTX, o->ctx);
    ds4_sampler smp;
    ds4_err err = {0};
    if (ds4_sampler_init(&smp, &o->sampling, (int)e->w->cfg.n_vocab, &err) != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return 2;
    }
    int rc = o->prompt ? run_oneshot(e, o, &smp) : run_repl(e, o, &smp);
    ds4_sampler_free(&smp);
    return rc;
}

int main(int argc, char **argv) {
    utf8_locale();
    cli_opts o;
    int rc = cli_parse(argc, argv, &o);
    if (rc != 0) {
        cli_opts_free(&o);
        return rc == 1 ? 0 : 2;
    }
    cli_signals_init();
    if (o.mode == CLI_DUMP_TOKENS) {
        rc = run_dump_tokens(&o);
        cli_opts_free(&o);
        return rc;
    }
    /* Under mpirun the ranks after the first serve their pipeline stage in
     * here (docs/DISTRIBUTED.md); rank 0 goes on as the CLI. */
    ds4_dist *d = NULL;
    ds4_warm_ctx warm = {"ds4", o.threads};
    if (o.warm_weights) o.dist.warm = ds4_startup_warm_stage, o.dist.warm_ctx = &warm;
    if ((rc = ds4_dist_start("ds4", o.model, o.backend, o.threads, &o.dist, &d)) >= 0) {
        cli_opts_free(&o);
        return rc;
    }
    /* One model process per machine; --dump-tokens above loads no weights. */
    if ((rc = ds4_startup_lock("ds4")) != 0) {
        ds4_dist_end(d);
        cli_opts_free(&o);
        return rc;
    }
    ds4_err err = {0};
    ds4_engine *e = NULL;
    cli_loading(true);
    e = cli_engine_open(&o, d, &err);
    cli_loading(false);
    if (!e) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    if (o.mode != CLI_INSPECT) cli_print_memory(e, o.ctx);
    if (o.warm_weights && o.mode != CLI_INSPECT) {
        cli_busy(true);
        uint32_t first = 0, end = e->w->cfg.n_layer;
        if (d) ds4_dist_layers(d, &first, &end); /* a pipeline: this rank's stage */
        rc = d ? ds4_startup_warm_layers("ds4", e->w, first, end, o.threads, cli_stop_requested, NULL)
               : ds4_startup_warm("ds4", e->w, o.threads, cli_stop_requested, NULL);
        cli_busy(false);
        if (rc != 0) goto out;
    }
    if (cli_interrupted && o.mode != CLI_INSPECT) { /* pressed before the work began: kept */
        rc = cli_report_interrupt();
        goto out;
    }
    switch (o.mode) {
    case CLI_INSPECT: rc = run_inspect(e, &o); break;
    case CLI_IMATRIX: rc = run_imatrix(e, &o); break;
    case CLI_PERPLEXITY: rc = run_perplexity(e, &o); break;
    case CLI_DUMP_LOGPROBS: rc = run_dump_logprobs(e, &o); break;
    case CLI_CHAT: rc = run_chat(e, &o); break;
    case CLI_DUMP_TOKENS: break;
    }
out:
    ds4_engine_close(e);
    ds4_dist_end(d);
    cli_opts_free(&o);
    return rc;
}
