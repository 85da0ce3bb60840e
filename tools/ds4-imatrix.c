/*
 * ds4-imatrix - collect an importance matrix for the routed experts by
 * running the model over a dataset (docs/TOOLCHAIN.md).
 *
 *   ds4-imatrix MODEL --imatrix-dataset FILE --imatrix-out OUT.dat [options]
 *
 * The dataset holds prompts separated by `===== DS4_IMATRIX_PROMPT ...`
 * lines (format/imatrix.h).  A prompt is either a list of token ids (spaces,
 * commas or newlines between them) or rendered text, tokenized with the
 * model's own tokenizer metadata with every special token recognised
 * (text/tokenizer.h, ds4_tokenize_transcript).  Every prompt is
 * prefilled from an empty context (cut to --ctx tokens) on --backend (the
 * build's default: cuda in CUDA builds, which sums on the GPU); the
 * forward pass adds each routed expert's inputs to the collector
 * (model/imatrix_collect.h), which writes ds4's legacy .dat for
 * `ds4-quantize --imatrix`.  The loop is engine/imatrix_run.h, shared with
 * `ds4 --imatrix-dataset FILE --imatrix-out OUT.dat`: the two write the same
 * bytes.  Progress goes to stderr; OUT.partial holds a checkpoint every
 * --imatrix-save-every prompts and after Ctrl+C (which stops after the
 * current prompt), which --resume continues from.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cli.h"
#include "engine/imatrix_run.h"
#include "engine/startup.h"
#include "model/backend.h"
#include "model/backends.h"
#include "model/placement.h"
#include "model/weights.h"
#include "text/tokenizer.h"

typedef struct opts {
    const char *model;
    const char *backend;
    const char *profile;
    ds4_imatrix_run_opts run;
    ds4_backend_opts bo;
} opts;

/* Ctrl+C: the run stops after the current prompt, saving its progress for
 * --resume; a second one ends the program at once (SA_RESETHAND).  A
 * signal handler reaches only a file-scope flag. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}
static int stop_requested(void *ctx) {
    (void)ctx;
    return interrupted != 0;
}

static int collect(const opts *o, ds4_err *err) {
    ds4_weights *w = ds4_weights_open(o->model, err);
    if (!w) return -1;
    ds4_expert_profile *prof = NULL;
    if (o->profile && !(prof = ds4_expert_profile_load(o->profile, w->cfg.n_layer, w->cfg.n_expert, err))) {
        ds4_weights_close(w);
        return -1;
    }
    ds4_backend_opts bo = o->bo;
    bo.expert_profile = prof;
    ds4_imatrix_run_opts run = o->run;
    run.backend = o->backend;
    run.show_progress = true;
    run.stop = stop_requested;
    /* The tokenizer is optional: token-id datasets need none. */
    ds4_vocab *vocab = NULL;
    ds4_tokenizer *tok = NULL;
    int rc = 0;
    if (ds4_gguf_find_kv(w->gguf, "tokenizer.ggml.tokens") &&
        (!(vocab = ds4_vocab_from_gguf(w->gguf, err)) || !(tok = ds4_tokenizer_new(vocab, err))))
        rc = ds4_err_prefix(err, "%s: tokenizer", o->model);
    ds4_imatrix_run_stats st;
    if (rc == 0) {
        ds4_startup_print_memory("ds4-imatrix", o->backend, w, ds4_backend_opts_resolve(&bo).ctx_size);
        rc = ds4_imatrix_run(w, tok, &bo, &run, &st, err);
    }
    if (rc == 0)
        fprintf(stderr, "ds4-imatrix: wrote %s from %llu prompt%s, %llu token%s, %llu routed expert observations\n",
                o->run.out, (unsigned long long)st.prompts, ds4_plural(st.prompts), (unsigned long long)st.tokens,
                ds4_plural(st.tokens), (unsigned long long)st.routes);
    ds4_tokenizer_free(tok);
    ds4_vocab_free(vocab);
    ds4_expert_profile_free(prof);
    ds4_weights_close(w);
    return rc;
}

int main(int argc, char **argv) {
    opts o = {0};
    ds4_opt table[] = {
        {DS4_OPT_STR("--imatrix-dataset", "FILE", &o.run.dataset, NULL,
                     "prompts separated by '===== DS4_IMATRIX_PROMPT' lines"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {DS4_OPT_STR("--imatrix-out", "FILE", &o.run.out, NULL, "the legacy .dat to write"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_OUT},
        DS4_CLI_CTX(&o.bo.ctx_size),
        {DS4_OPT_U64("--imatrix-max-prompts", "N", &o.run.max_prompts, 1, UINT64_MAX, 0, "stop after N prompts"),
         .def_text = "all"},
        {DS4_OPT_U64("--imatrix-max-tokens", "N", &o.run.max_tokens, 1, UINT64_MAX, 0, "stop after N prompt tokens"),
         .def_text = "all"},
        DS4_CLI_IMATRIX_RESUME(&o.run.save_every, &o.run.resume),
        DS4_CLI_BACKEND(&o.backend, NULL),
        DS4_CLI_OFFLOAD(&o.bo.gpu_mem, &o.profile, &o.bo.host_mapped),
        DS4_CLI_THREADS(&o.bo.n_threads),
        DS4_CLI_NO_SIM(&o.bo.no_sim),
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_STR("MODEL", NULL, &o.model, NULL, "the GGUF model file"), .flags = DS4_OPT_REQUIRED},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-imatrix",
                   .usage = "MODEL --imatrix-dataset FILE --imatrix-out OUT.dat [options]",
                   .about = "Collect an importance matrix for the routed experts (for ds4-quantize --imatrix) by "
                            "running the\nmodel over a dataset.",
                   .opts = table,
                   .notes = DS4_CLI_ENV_NOTES,
                   .refused = ds4_option_not_supported};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (ds4_cli_check_backend(&cli, o.backend) != 0) return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    int lrc = ds4_startup_lock("ds4-imatrix");
    if (lrc) return lrc;
    ds4_err err = {0};
    if (collect(&o, &err) != 0) {
        fprintf(stderr, "ds4-imatrix: %s\n", err.msg);
        return err.code == DS4_EINTERRUPTED ? 130 : 1;
    }
    return 0;
}
