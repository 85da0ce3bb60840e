/*
 * options.h - the ds4-agent command line (docs/AGENT.md, "Options").
 *
 * One table (options.c, in the form of base/opts.h) names every option,
 * its value, range and default; the parser and --help both come from it.
 * Invalid values, unknown options and contradictory combinations are usage
 * errors: one line naming the option and what it accepts, exit status 2.
 */
#ifndef DS4_AGENT_OPTIONS_H
#define DS4_AGENT_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/cli.h"
#include "engine/sampler.h"
#include "text/chat.h"

#define AGENT_DEFAULT_SYSTEM "You are a helpful coding assistant running inside ds4-agent."
#define AGENT_DEFAULT_CTX    100000u
#define AGENT_DEFAULT_TOKENS 50000u

/* Side effects that need the user's permission (--allow). */
enum {
    AGENT_ALLOW_BASH = 1,
    AGENT_ALLOW_WRITE = 2,
    AGENT_ALLOW_EDIT = 4,
    AGENT_ALLOW_ALL = 7,
};

typedef enum agent_api { AGENT_API_OPENAI = 0, AGENT_API_ANTHROPIC = 1 } agent_api;

typedef struct agent_opts {
    const char *model;
    const char *backend; /* the build's default unless given */
    int threads;         /* 0: $DS4_THREADS or all CPUs */
    bool warm_weights, no_sim;
    ds4_cli_mtp mtp;     /* MTP speculative decoding (local mode) */
    ds4_cli_steer steer; /* directional steering (local mode) */
    uint32_t ctx;
    bool ctx_given;
    uint32_t n_tokens;
    const char *prompt; /* -p: submitted after startup */
    const char *system; /* -sys: appended to the built-in instructions; "" for none */
    const char *trace;  /* --trace FILE */
    ds4_sampler_params sampling;
    int think;      /* ds4_think_mode */
    unsigned allow; /* AGENT_ALLOW_* granted up front */
    bool yolo;
    const char *root;    /* --root DIR: file tools stay inside (default ".") */
    const char *kv_dir;  /* session directory (default ~/.ds4/kvcache) */
    const char *server;  /* --server URL: a remote ds4-server instead of the engine */
    int api;             /* agent_api */
    const char *api_key; /* --api-key or $DS4_API_KEY */
} agent_opts;

/* Parse argv.  -1: run; otherwise exit with the status returned (0 after
 * --help, 2 after a usage error, reported on stderr). */
int agent_parse_options(int argc, char **argv, agent_opts *o);

#endif
