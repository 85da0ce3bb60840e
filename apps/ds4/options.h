/*
 * options.h - the ds4 command line (ds4's, README.md): what was asked
 * for and with which settings, checked once so the rest of the program can
 * trust every value.
 *
 * The options are one table (options.c) in the form of base/opts.h, with
 * the rows every program shares from engine/cli.h.  Invalid values,
 * unknown options, files that cannot be read or written and contradictory
 * combinations are usage errors: one line naming the option and what is
 * accepted, exit status 2, before any model is loaded.
 */
#ifndef DS4_CLI_OPTIONS_H
#define DS4_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/cli.h"
#include "engine/sampler.h"
#include "text/chat.h"

#define CLI_DEFAULT_SYSTEM     "You are a helpful assistant"
#define CLI_DEFAULT_TOKENS     50000u
#define CLI_LOGPROBS_TOP_K_MAX 128u

/* What the run does; exactly one. */
typedef enum cli_mode {
    CLI_CHAT,          /* one-shot with a prompt, else the REPL */
    CLI_DUMP_TOKENS,   /* print the prompt's token ids and pieces */
    CLI_DUMP_LOGPROBS, /* greedy continuation with top-k log-probabilities (JSON) */
    CLI_PERPLEXITY,    /* teacher-forced NLL over a raw text file */
    CLI_INSPECT,       /* model summary */
    CLI_IMATRIX,       /* collect a routed-expert importance matrix over a dataset */
} cli_mode;

typedef struct cli_opts {
    cli_mode mode;
    const char *model;
    char *prompt; /* -p text or --prompt-file contents (owned); NULL: REPL */
    size_t prompt_len;
    const char *system; /* "" disables the system message */
    uint32_t ctx;
    uint32_t n_tokens;
    ds4_sampler_params sampling;
    ds4_think_mode think;
    const char *backend; /* "cpu", "cuda" */
    bool backend_given;
    int threads;                /* 0: $DS4_THREADS or all CPUs */
    bool warm_weights;          /* read the whole model file before the first token */
    bool no_sim;                /* low-precision simulations off */
    ds4_cli_mtp mtp;            /* MTP speculative decoding */
    uint64_t gpu_mem;           /* --gpu-mem (0: the GPU's free memory) */
    int host_mapped;            /* --host-mapped (ds4_backend_opts.host_mapped) */
    const char *expert_profile; /* --expert-profile */
    ds4_cli_steer steer;        /* directional steering */
    ds4_dist_opts dist;         /* under mpirun: this rank's stage (docs/DISTRIBUTED.md) */
    uint32_t tensor_parallel;   /* --tensor-parallel: GPUs each layer is split over (1: none) */
    const char *logprobs_out;
    uint32_t logprobs_top_k;
    const char *perplexity_file;
    const char *imatrix_dataset, *imatrix_out;
    uint64_t imatrix_max_prompts, imatrix_max_tokens; /* 0: unlimited */
    uint64_t imatrix_save_every;                      /* 0: the default */
    bool imatrix_resume;
    /* As given, before cli_parse settles the prompt and the mode. */
    const char *prompt_arg, *prompt_file;
    bool dump_tokens, inspect;
} cli_opts;

/* Parse argv.  Returns 0 to run, 1 when --help was printed (exit 0), 2 on
 * a usage error (already reported on stderr). */
int cli_parse(int argc, char **argv, cli_opts *o);
void cli_opts_free(cli_opts *o);

/* Read a whole file into a NUL-terminated buffer (also used by /read and
 * --perplexity-file).  NULL with a message naming the file on failure. */
char *cli_read_file(const char *path, size_t *len, ds4_err *err);

#endif
