/*
 * options.c - the ds4 command line (see options.h): one table of options,
 * then the checks of combinations and the prompt file.
 *
 * ds4's spellings are kept: "-sys", a single-dash long option, and both
 * "--name=value" and "--name value" (base/opts.h has the conventions).
 */
#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cli.h"

static const char USAGE[] = "[options]              interactive chat (no prompt given)\n"
                            "-p TEXT [options]      one-shot: answer TEXT and exit";

static const char NOTES[] = DS4_CLI_ENV_NOTES
    "\n"
    "interactive commands: /help /think /think-max /nothink /ctx N /read FILE /steer [F [A]] /quit\n"
    "exit status: 0 done, 1 an error, 2 a usage error or another model process running,\n"
    "130 stopped by Ctrl+C";

/* ds4's options this program refuses, with the reason. */
static const char *refused(const char *name) {
    if (!strcmp(name, "--server")) return "the server is a separate program: use ds4-server";
    return ds4_option_not_supported(name);
}

char *cli_read_file(const char *path, size_t *len, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory reading %s", path);
        return NULL;
    }
    if (failed) {
        free(buf);
        ds4_err_set(err, DS4_EIO, "reading %s failed", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* Combinations that cannot work, the mode, and the prompt file. */
static int finish(const ds4_cli *cli, cli_opts *o) {
    if (o->prompt_arg && o->prompt_file) return ds4_cli_usage(cli, "only one prompt (-p or --prompt-file)");
    int modes = o->dump_tokens + !!o->logprobs_out + !!o->perplexity_file + o->inspect + !!o->imatrix_out;
    if (modes > 1)
        return ds4_cli_usage(cli, "only one of --dump-tokens, --dump-logprobs, --perplexity-file, --inspect, "
                                  "--imatrix-out");
    o->mode = o->dump_tokens       ? CLI_DUMP_TOKENS
              : o->logprobs_out    ? CLI_DUMP_LOGPROBS
              : o->perplexity_file ? CLI_PERPLEXITY
              : o->inspect         ? CLI_INSPECT
              : o->imatrix_out     ? CLI_IMATRIX
                                   : CLI_CHAT;
    bool has_prompt = o->prompt_arg || o->prompt_file;
    if ((o->mode == CLI_DUMP_TOKENS || o->mode == CLI_DUMP_LOGPROBS) && !has_prompt)
        return ds4_cli_usage(cli, "%s: needs a prompt (-p or --prompt-file)",
                             o->mode == CLI_DUMP_TOKENS ? "--dump-tokens" : "--dump-logprobs");
    if ((o->mode == CLI_PERPLEXITY || o->mode == CLI_INSPECT || o->mode == CLI_IMATRIX) && has_prompt)
        return ds4_cli_usage(cli, "%s: takes no prompt",
                             o->mode == CLI_INSPECT   ? "--inspect"
                             : o->mode == CLI_IMATRIX ? "--imatrix-out"
                                                      : "--perplexity-file");
    if (o->mode == CLI_IMATRIX && !o->imatrix_dataset)
        return ds4_cli_usage(cli, "--imatrix-out: needs --imatrix-dataset FILE");
    if (o->mode != CLI_IMATRIX && (o->imatrix_dataset || o->imatrix_max_prompts || o->imatrix_max_tokens ||
                                   o->imatrix_save_every || o->imatrix_resume))
        return ds4_cli_usage(cli, "%s: needs --imatrix-out FILE",
                             o->imatrix_dataset       ? "--imatrix-dataset"
                             : o->imatrix_max_prompts ? "--imatrix-max-prompts"
                             : o->imatrix_max_tokens  ? "--imatrix-max-tokens"
                             : o->imatrix_save_every  ? "--imatrix-save-every"
                                                      : "--resume");
    if (ds4_cli_check_backend(cli, o->backend) != 0 || ds4_cli_steering_check(cli, &o->steer) != 0 ||
        ds4_cli_tp_check(cli, o->tensor_parallel, &o->dist) != 0)
        return 2;
    if (o->prompt_file) {
        ds4_err err = {0};
        if (!(o->prompt = cli_read_file(o->prompt_file, &o->prompt_len, &err)))
            return ds4_cli_usage(cli, "--prompt-file: %s", err.msg);
    } else if (o->prompt_arg) {
        if (!(o->prompt = strdup(o->prompt_arg))) return ds4_cli_usage(cli, "out of memory");
        o->prompt_len = strlen(o->prompt);
    }
    return 0;
}

int cli_parse(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof(*o));
    ds4_opt table[] = {
        {DS4_OPT_SECTION("input and model:")},
        {DS4_OPT_STR("-p, --prompt", "TEXT", &o->prompt_arg, NULL,
                     "user message (a text starting with " DS4_TOK_BOS " is taken as an already rendered transcript)")},
        {DS4_OPT_STR("--prompt-file", "FILE", &o->prompt_file, NULL, "read the prompt from FILE"), .flags = DS4_OPT_IN},
        {DS4_OPT_STR("-sys, --system", "TEXT", &o->system, CLI_DEFAULT_SYSTEM, "system prompt; \"\" for none")},
        DS4_CLI_MODEL(&o->model),
        DS4_CLI_CTX(&o->ctx),
        {DS4_OPT_U32("-n, --tokens", "N", &o->n_tokens, 1, UINT32_MAX, CLI_DEFAULT_TOKENS,
                     "max generated tokens per turn (and scored tokens of --perplexity-file)")},

        {DS4_OPT_SECTION("sampling:")},
        DS4_CLI_SAMPLING(&o->sampling),

        {DS4_OPT_SECTION("thinking:")},
        DS4_CLI_THINK((int *)&o->think),

        {DS4_OPT_SECTION("runtime:")},
        DS4_CLI_BACKEND(&o->backend, &o->backend_given),
        DS4_CLI_THREADS(&o->threads),
        DS4_CLI_DIST(&o->dist),
        DS4_CLI_TP(&o->tensor_parallel),
        DS4_CLI_WARM_WEIGHTS(&o->warm_weights),
        DS4_CLI_NO_SIM(&o->no_sim),
        DS4_CLI_QUALITY("ds4"),
        DS4_CLI_MTP(&o->mtp),
        DS4_CLI_OFFLOAD(&o->gpu_mem, &o->expert_profile, &o->host_mapped),
        DS4_CLI_STEERING(&o->steer),

        {DS4_OPT_SECTION("diagnostics:")},
        {DS4_OPT_FLAG("--dump-tokens", &o->dump_tokens,
                      "print the prompt's token ids and pieces (special tokens recognised), then exit; loads "
                      "no weights")},
        {DS4_OPT_STR("--dump-logprobs", "FILE", &o->logprobs_out, NULL,
                     "greedy continuation of the prompt; writes every step's token and top alternatives with "
                     "logits and log-probabilities (JSON)"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_U32("--logprobs-top-k", "N", &o->logprobs_top_k, 1, CLI_LOGPROBS_TOP_K_MAX, 20,
                     "alternatives per step"),
         .flags = DS4_OPT_CLAMP},
        {DS4_OPT_STR("--perplexity-file", "FILE", &o->perplexity_file, NULL,
                     "teacher-forced NLL of a raw text (no chat template): the first 32 tokens are context, "
                     "then up to -n tokens, as many as the context holds, are scored"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_FLAG("--inspect", &o->inspect, "print the model's configuration, tensors and memory, then exit")},

        {DS4_OPT_SECTION("importance matrix (for ds4-quantize --imatrix; on --backend):")},
        {DS4_OPT_STR("--imatrix-dataset", "FILE", &o->imatrix_dataset, NULL,
                     "prompts separated by '===== DS4_IMATRIX_PROMPT' lines"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--imatrix-out", "FILE", &o->imatrix_out, NULL,
                     "collect routed-expert statistics, write a legacy .dat"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_U64("--imatrix-max-prompts", "N", &o->imatrix_max_prompts, 1, UINT64_MAX, 0, "stop after N prompts"),
         .def_text = "all"},
        {DS4_OPT_U64("--imatrix-max-tokens", "N", &o->imatrix_max_tokens, 1, UINT64_MAX, 0,
                     "stop after N prompt tokens"),
         .def_text = "all"},
        DS4_CLI_IMATRIX_RESUME(&o->imatrix_save_every, &o->imatrix_resume),
        {0},
    };
    ds4_cli cli = {.prog = "ds4",
                   .usage = USAGE,
                   .about = "Chat with DeepSeek V4 Flash from the command line, or run one of the diagnostics "
                            "that compare\nengines and model files.",
                   .opts = table,
                   .notes = NOTES,
                   .stray = "(the prompt goes after -p)",
                   .refused = refused};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status == 0 ? 1 : 2;
    return finish(&cli, o);
}

void cli_opts_free(cli_opts *o) {
    free(o->prompt);
    o->prompt = NULL;
}
