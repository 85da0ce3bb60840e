/*
 * options.c - the ds4-agent command line (see options.h): one table in the
 * form every ds4 program uses (base/opts.h), with the rows the programs
 * share (engine/cli.h) and the agent's own.  Options of ds4's agent this
 * engine does not have (ds4's Metal diagnostics) are refused with the
 * reason.
 */
#include "options.h"

#include <stdlib.h>
#include <string.h>

#include "engine/cli.h"

static const char NOTES[] =
    "commands: /help /save /list /switch ID /history [N] /new /quit (docs/AGENT.md)\n"
    "keys: Enter while busy queues the prompt, ESC interrupts and sends it, Ctrl+X takes it back,\n"
    "Ctrl+C interrupts or clears the line, Ctrl+D on an empty line leaves.\n"
    "\n" DS4_CLI_ENV_NOTES "  DS4_API_KEY              the key for --server, when --api-key is not given\n"
    "  NO_COLOR, TERM=dumb      no colours (TERM=dumb: line mode, as without a terminal)\n"
    "\n"
    "exit status: 0 done, 1 an error, 2 a usage error or another model process running";

/* --allow bash,write,edit (or all) into AGENT_ALLOW_* bits. */
static int parse_allow(void *ctx, const char *v, ds4_err *err) {
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {
        {"bash", AGENT_ALLOW_BASH}, {"write", AGENT_ALLOW_WRITE}, {"edit", AGENT_ALLOW_EDIT}, {"all", AGENT_ALLOW_ALL}};
    unsigned *allow = ctx, bits = 0;
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (n == strlen(names[i].name) && !strncmp(p, names[i].name, n)) {
                bits |= names[i].bit;
                found = true;
            }
        if (!found) return ds4_err_set(err, DS4_EINVAL, "must be a comma list of bash, write, edit (or all)");
        p += n + (p[n] == ',');
    }
    if (!bits) return ds4_err_set(err, DS4_EINVAL, "must be a comma list of bash, write, edit (or all)");
    *allow |= bits;
    return 0;
}

int agent_parse_options(int argc, char **argv, agent_opts *o) {
    memset(o, 0, sizeof(*o));
    const char *env_key = getenv("DS4_API_KEY");
    const char *api = NULL;
    bool backend_given = false, threads_given = false, api_given = false, key_given = false;
    ds4_opt table[] = {
        {DS4_OPT_SECTION("model:")},
        DS4_CLI_MODEL(&o->model),
        {DS4_OPT_U32("-c, --ctx", "N", &o->ctx, 1024, DS4_CTX_MAX, AGENT_DEFAULT_CTX, "context size in tokens"),
         .seen = &o->ctx_given},
        {DS4_OPT_U32("-n, --tokens", "N", &o->n_tokens, 1, UINT32_MAX, AGENT_DEFAULT_TOKENS,
                     "most tokens generated in one assistant round")},
        {DS4_OPT_STR("-p, --prompt", "TEXT", &o->prompt, NULL, "a first prompt, sent after startup")},
        {DS4_OPT_STR("-sys, --system", "TEXT", &o->system, AGENT_DEFAULT_SYSTEM,
                     "text after the built-in instructions (plain text); \"\" for none")},
        {DS4_OPT_STR("--trace", "FILE", &o->trace, NULL,
                     "write prefills, sampled tokens, tool calls and results, saves, with times"),
         .flags = DS4_OPT_OUT},
        DS4_CLI_SAMPLING(&o->sampling),
        DS4_CLI_THINK(&o->think),

        {DS4_OPT_SECTION("tools:")},
        {DS4_OPT_CALL("--allow", "LIST", parse_allow, &o->allow,
                      "run these without asking: a comma list of bash, write, edit (or all)"),
         .def_text = "ask each time"},
        {DS4_OPT_FLAG("--yolo", &o->yolo, "run every bash, write and edit without asking")},
        {DS4_OPT_STR("--root", "DIR", &o->root, ".", "the file tools stay inside DIR; bash commands start there")},
        {DS4_OPT_STR("--kv-dir", "DIR", &o->kv_dir, NULL, "where sessions and the system prompt's KV are kept"),
         .def_text = "~/.ds4/kvcache"},

        {DS4_OPT_SECTION("remote model:")},
        {DS4_OPT_STR("--server", "URL", &o->server, NULL,
                     "use a ds4-server (http://host:port) instead of a local model")},
        {DS4_OPT_CHOICE("--api", "NAME", &api, "openai|anthropic", "openai",
                        "with --server: Chat Completions (openai) or Messages (anthropic)"),
         .seen = &api_given},
        {DS4_OPT_STR("--api-key", "KEY", &o->api_key, env_key && *env_key ? env_key : NULL,
                     "with --server: the server's key"),
         .def_text = "$DS4_API_KEY", .seen = &key_given},

        {DS4_OPT_SECTION("runtime:")},
        DS4_CLI_THREADS(&o->threads, .seen = &threads_given),
        DS4_CLI_BACKEND(&o->backend, &backend_given),
        DS4_CLI_WARM_WEIGHTS(&o->warm_weights),
        DS4_CLI_NO_SIM(&o->no_sim),
        DS4_CLI_QUALITY("ds4-agent"),
        DS4_CLI_MTP(&o->mtp),
        DS4_CLI_STEERING(&o->steer),
        {0},
    };
    ds4_cli cli = {.prog = "ds4-agent",
                   .usage = "[options]",
                   .about = "A coding agent in the terminal: the model reads, searches and edits files and runs\n"
                            "commands through tools; sessions are saved as KV files (docs/AGENT.md).",
                   .opts = table,
                   .notes = NOTES,
                   .refused = ds4_option_not_supported};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (o->yolo) o->allow = AGENT_ALLOW_ALL;
    o->api = api && !strcmp(api, "anthropic") ? AGENT_API_ANTHROPIC : AGENT_API_OPENAI;
    if (!o->server && (api_given || key_given))
        return ds4_cli_usage(&cli, "%s: only with --server URL", api_given ? "--api" : "--api-key");
    if (o->server && strncmp(o->server, "http://", 7) && strncmp(o->server, "https://", 8))
        return ds4_cli_usage(&cli, "--server %s: must be an http:// or https:// URL", o->server);
    if (o->server && (backend_given || threads_given || o->warm_weights || o->no_sim || o->steer.path))
        return ds4_cli_usage(&cli, "--server runs no local model: --backend, --threads, --warm-weights, --no-sim "
                                   "and --dir-steering-file do not apply");
    if (o->api_key && !*o->api_key) return ds4_cli_usage(&cli, "--api-key: the key must not be empty");
    if (!o->server && ds4_cli_check_backend(&cli, o->backend) != 0) return 2;
    if (ds4_cli_steering_check(&cli, &o->steer) != 0) return 2;
    return -1;
}
