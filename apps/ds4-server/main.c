/*
 * main.c - ds4-server: options (ds4-server's, plus --api-key, --queue,
 * --max-body-mb, the header and body deadlines, --allowed-hosts,
 * --client-sampling-in-thinking, --no-sim and the test hook;
 * docs/SERVER.md), startup, signals, shutdown.
 *
 * Startup (engine/startup.h): --chdir first, so every relative path (model,
 * trace, disk cache) is taken from there; the instance lock; the model,
 * with the memory estimate for --ctx; --warm-weights; the --parallel
 * sessions (scheduler.c: checked against the memory, or sized from it).
 *
 * Shutdown on SIGINT/SIGTERM: stop taking jobs (503), cancel the running
 * generations, answer the queued jobs, save the live sessions to the disk
 * cache ("shutdown"), close the listener.  A second signal exits at once
 * (status 130), and so does a signal that comes while --warm-weights reads
 * the model (nothing to save yet).
 */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/cli.h"
#include "engine/generate.h"
#include "engine/pace.h"
#include "engine/capacity.h"
#include "engine/startup.h"
#include "model/backends.h"
#include "server.h"


static const char NOTES[] = DS4_CLI_ENV_NOTES
    "  DS4_API_KEY              the key clients must send, when --api-key is not given\n"
    "\n"
    "exit status: 0 after a shutdown (SIGINT, SIGTERM), 1 an error, 2 a usage error or another\n"
    "model process running, 130 a second signal, or one during --warm-weights";

/* The command line (base/opts.h): srv_opts plus what main keeps apart.
 * Returns -1 to go on, else the status to exit with (0 after --help). */
/* ds4's options this program refuses, with the reason. */
static const char *refused(const char *name) { return ds4_option_not_supported(name); }

static int parse_args(int argc, char **argv, srv_opts *o, bool *no_ckpt) {
    memset(o, 0, sizeof(*o));
    ds4_kvc_policy kd;
    ds4_kvc_policy_defaults(&kd);
    const char *env_key = getenv("DS4_API_KEY");
    uint64_t max_body_mb;
    bool no_exact_replay;
    ds4_opt table[] = {
        {DS4_OPT_SECTION("model and runtime:")},
        DS4_CLI_MODEL(&o->model_path),
        DS4_CLI_CTX(&o->ctx),
        {DS4_OPT_U32("-n, --tokens", "N", &o->default_max_tokens, 1, UINT32_MAX, 393216,
                     "max output tokens of a request that sets no limit")},
        DS4_CLI_THREADS(&o->n_threads),
        DS4_CLI_BACKEND(&o->backend, NULL),
        DS4_CLI_DIST(&o->dist),
        DS4_CLI_TP(&o->tensor_parallel),
        {DS4_OPT_STR("--chdir", "DIR", &o->chdir_to, NULL,
                     "change to DIR first: relative paths (model, trace, disk cache) are taken from there")},
        DS4_CLI_WARM_WEIGHTS(&o->warm_weights),
        DS4_CLI_NO_SIM(&o->no_sim),
        DS4_CLI_QUALITY("ds4-server"),
        DS4_CLI_OFFLOAD(&o->gpu_mem, &o->expert_profile, &o->host_mapped),
        DS4_CLI_MTP(&o->mtp),
        DS4_CLI_STEERING(&o->steer),

        {DS4_OPT_SECTION("HTTP:")},
        {DS4_OPT_STR("--host", "HOST", &o->host, "127.0.0.1", "bind address")},
        {DS4_OPT_INT("--port", "N", &o->port, 0, 65535, 8000, "port; 0 picks a free one")},
        {DS4_OPT_FLAG("--cors", &o->cors, "add Access-Control-Allow-* headers")},
        {DS4_OPT_STR("--api-key", "KEY", &o->api_key, env_key && *env_key ? env_key : NULL,
                     "require this key (Authorization: Bearer or x-api-key)"),
         .def_text = "$DS4_API_KEY, else none"},
        {DS4_OPT_U32("--parallel", "N", &o->parallel, 1, 4096, 0,
                     "requests run at once at most, each in a session sized for its prompt and output, their "
                     "tokens batched into one forward pass per step; more than the memory holds of the "
                     "smallest sessions is refused at startup"),
         .seen = &o->parallel_given, .def_text = "as many as the memory holds, at most 16"},
        {DS4_OPT_U64("--kv-mem-mb", "N", &o->kv_mem_mb, 1, 1ull << 30, 0,
                     "memory the sessions' state may take in all, in MiB (the GPU's with CUDA): a request waits "
                     "until its session fits beside the others"),
         .def_text = "3/4 of what is free"},
        {DS4_OPT_U32("--batch-tokens", "N", &o->batch_tokens, 1, 1u << 20, 0,
                     "tokens a batched step runs at most: every decoding request's token, then prefill chunks "
                     "up to N (a long prompt is prefilled over several steps; beside decoding requests in "
                     "the pieces --pace-stretch allows)"),
         .def_text = "the backend's prefill chunk"},
        {DS4_OPT_FLOAT("--pace-stretch", "F", &o->pace_stretch, 0.0, 100.0, DS4_PACE_STRETCH,
                       "beside decoding requests a prompt goes in pieces cut so that each batched step takes about "
                       "F times their step alone (their time per token while it goes in); larger F prefills faster "
                       "(0: no pacing, pieces up to --batch-tokens)")},
        {DS4_OPT_INT("--grow-wait", "S", &o->grow_wait_s, 0, 86400, 60,
                     "a session that must grow while it answers and finds no memory free waits up to S seconds "
                     "for running requests to free some, then its answer ends there (finish length); 0: no wait")},
        {DS4_OPT_INT("--queue", "N", &o->queue_max, 1, 1000000, 256,
                     "requests waiting for a session before answering 429")},
        {DS4_OPT_U64("--max-body-mb", "N", &max_body_mb, 1, 4096, 64, "largest request body, in MiB")},
        {DS4_OPT_INT("--max-connections", "N", &o->max_connections, 1, 100000, 512, "simultaneous connections")},
        {DS4_OPT_INT("--timeout", "S", &o->connection_timeout_s, 1, 86400, 60, "idle connection timeout in seconds")},
        {DS4_OPT_INT("--header-timeout", "S", &o->header_timeout_s, 1, 86400, 10,
                     "a request's headers must arrive within S seconds of the connection")},
        {DS4_OPT_INT("--body-timeout", "S", &o->body_timeout_s, 1, 86400, 120,
                     "and its body within S seconds after them")},
        {DS4_OPT_STR("--allowed-hosts", "LIST", &o->allowed_hosts, NULL,
                     "Host header names accepted besides localhost, loopback addresses, the --host value and "
                     "(bound to 0.0.0.0) any IP address; comma-separated, \"*\" for any"),
         .def_text = "none"},
        {DS4_OPT_INT("--sse-keepalive-ms", "N", &o->sse_keepalive_ms, 10, 3600000, 5000,
                     "keepalive comment interval while streaming")},
        {DS4_OPT_STR("--trace", "FILE", &o->trace_path, NULL, "human-readable request trace")},

        {DS4_OPT_SECTION("disk KV cache:")},
        {DS4_OPT_STR("--kv-disk-dir", "DIR", &o->kv_dir, NULL, "disk KV cache directory"), .def_text = "off"},
        {DS4_OPT_U64("--kv-disk-space-mb", "N", &o->kv_space_mb, 1, 1ull << 40, 4096, "disk budget in MiB")},
        {DS4_OPT_U32("--kv-cache-min-tokens", "N", &o->kv_policy.min_tokens, 1, UINT32_MAX, kd.min_tokens,
                     "never save or load checkpoints shorter than N tokens")},
        {DS4_OPT_U32("--kv-cache-cold-max-tokens", "N", &o->kv_policy.cold_max_tokens, 0, UINT32_MAX,
                     kd.cold_max_tokens, "cold first prompts of up to N tokens are saved; 0 disables cold saves")},
        {DS4_OPT_U32("--kv-cache-continued-interval-tokens", "N", &o->kv_policy.continued_interval, 0, UINT32_MAX,
                     kd.continued_interval, "save long sessions about every N tokens; 0 disables")},
        {DS4_OPT_U32("--kv-cache-boundary-trim-tokens", "N", &o->kv_policy.boundary_trim, 0, UINT32_MAX,
                     kd.boundary_trim, "tail tokens left out of cold saves")},
        {DS4_OPT_U32("--kv-cache-boundary-align-tokens", "N", &o->kv_policy.boundary_align, 0, UINT32_MAX,
                     kd.boundary_align, "align saves down to multiples of N; 0 disables")},
        {DS4_OPT_FLAG("--kv-cache-reject-different-quant", &o->kv_reject_different_quant,
                      "refuse checkpoints written by a model with other routed-expert bits")},
        {DS4_OPT_FLAG("--no-memory-checkpoint", no_ckpt,
                      "do not keep an in-memory snapshot of the last prompt (it costs one more KV state of "
                      "memory; it makes retries and replies the client replays differently prefill only the "
                      "new part)")},

        {DS4_OPT_SECTION("sampling:")},
        {DS4_OPT_FLAG("--client-sampling-in-thinking", &o->client_sampling_in_thinking,
                      "apply the client's temperature, top_p, top_k and min_p while the model thinks too "
                      "(default: ds4's defaults until </think>, the client's values for the answer)")},

        {DS4_OPT_SECTION("tool calls:")},
        {DS4_OPT_FLAG("--disable-exact-dsml-tool-replay", &no_exact_replay,
                      "render replayed tool calls from their JSON instead of the DSML the model sampled")},
        {DS4_OPT_U32("--tool-memory-max-ids", "N", &o->tool_memory_max_ids, 1, 100000000, 100000,
                     "tool call ids remembered for exact replay")},
        /* Tests only: a JSON object name -> text; a request with the header
         * X-DS4-Test-Output: NAME generates exactly that text. */
        {DS4_OPT_STR("--test-force-output", "FILE", &o->test_force_output, NULL, "tests only"),
         .flags = DS4_OPT_HIDDEN | DS4_OPT_IN},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-server",
                   .usage = "[options]",
                   .about = "OpenAI (chat, completions, responses) and Anthropic (messages) API server for "
                            "DeepSeek V4 Flash.",
                   .opts = table,
                   .notes = NOTES,
                   .refused = refused};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    o->max_body = max_body_mb << 20;
    o->exact_replay = !no_exact_replay;
    if (o->api_key && !*o->api_key) return ds4_cli_usage(&cli, "--api-key: the key must not be empty");
    ds4_err perr = {0};
    if (ds4_pace_check(o->pace_stretch, &perr)) return ds4_cli_usage(&cli, "--pace-stretch %s", perr.msg);
    if (ds4_cli_check_backend(&cli, o->backend) != 0 || ds4_cli_steering_check(&cli, &o->steer) != 0 ||
        ds4_cli_tp_check(&cli, o->tensor_parallel, &o->dist) != 0)
        return 2;
    ds4_err err = {0};
    if (ds4_kvc_policy_check(&o->kv_policy, &err) != 0) return ds4_cli_usage(&cli, "%s", err.msg);
    return -1;
}

/* Whether SIGINT or SIGTERM waits (they are blocked in the main thread):
 * the stop callback of --warm-weights. */
static bool stop_signal_pending(void *ctx) {
    (void)ctx;
    sigset_t p;
    return sigpending(&p) == 0 && (sigismember(&p, SIGINT) == 1 || sigismember(&p, SIGTERM) == 1);
}

static void *shutdown_main(void *arg) {
    server *s = arg;
    srv_log("server", "shutting down");
    s->stopping = 1;
    worker_stop(s);
    http_stop(s);
    s->shutdown_done = 1;
    return NULL;
}

int main(int argc, char **argv) {
    server s = {0};
    bool no_ckpt;
    int prc = parse_args(argc, argv, &s.o, &no_ckpt);
    if (prc >= 0) return prc;
    if (s.o.chdir_to && chdir(s.o.chdir_to) != 0) {
        fprintf(stderr, "ds4-server: --chdir %s: %s\n", s.o.chdir_to, strerror(errno));
        return 1;
    }
    /* Under mpirun the ranks after the first serve their pipeline stage in
     * here (docs/DISTRIBUTED.md); rank 0 goes on as the server. */
    ds4_dist *d = NULL;
    ds4_warm_ctx warm = {"ds4-server", s.o.n_threads};
    if (s.o.warm_weights) s.o.dist.warm = ds4_startup_warm_stage, s.o.dist.warm_ctx = &warm;
    int drc = ds4_dist_start("ds4-server", s.o.model_path, s.o.backend, s.o.n_threads, &s.o.dist, &d);
    if (drc >= 0) return drc;
    int lrc = ds4_startup_lock("ds4-server");
    if (lrc) {
        ds4_dist_end(d);
        return lrc;
    }
    s.memory_checkpoint = !no_ckpt;
    /* glibc gives threads arenas of their own (up to 8 a core); what a
     * connection thread frees after a large body stays in its arena, out of
     * malloc_trim's reach, and with a thread per session and per connection
     * the process keeps growing by it.  Two arenas keep the memory handed
     * back (docs/SERVER.md, JSON). */
    mallopt(M_ARENA_MAX, 2);
    pthread_mutex_init(&s.stats_mu, NULL);
    render_pool_init(&s);
    signal(SIGPIPE, SIG_IGN);
    /* Signals go to the main thread only (sigwait below). */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);

    ds4_err err = {0};
    if (s.o.test_force_output) {
        json_error_t je;
        s.forced = json_load_file(s.o.test_force_output, 0, &je);
        if (!json_is_object(s.forced)) {
            fprintf(stderr, "ds4-server: --test-force-output %s: %s\n", s.o.test_force_output,
                    s.forced ? "not a JSON object" : je.text);
            return 2;
        }
    }
    if (s.o.trace_path && trace_open(&s.trace, s.o.trace_path, &err) != 0) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        return 1;
    }
    req_json_limits_install();
    ds4_engine_opts eo = {.model_path = s.o.model_path,
                          .backend = s.o.backend,
                          .n_threads = s.o.n_threads,
                          .no_sim = s.o.no_sim,
                          .need_vocab = true,
                          .dist = d,
                          .dist_opts = &s.o.dist,
                          .tensor_parallel = s.o.tensor_parallel,
                          .prog = "ds4-server",
                          .gpu_mem = s.o.gpu_mem,
                          .host_mapped = s.o.host_mapped,
                          /* a given --parallel: room on the GPU for the sessions after the first */
                          .extra_seqs = s.o.parallel_given ? s.o.parallel - 1 : 0,
                          /* the main sequence as short as a session can be (scheduler.c) */
                          .main_ctx = ds4_ctx_granule(s.o.ctx),
                          .expert_profile = s.o.expert_profile,
                          .mtp_path = s.o.mtp.path};
    ds4_cli_steering_opts(&s.o.steer, &eo);
    double t0 = ds4_now();
    if (ds4_model_file_check(s.o.model_path, &err) != 0 || !(s.engine = ds4_engine_open(&eo, &err))) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        ds4_dist_end(d);
        return 1;
    }
    char mem[160];
    srv_log("server", "model %s (%s backend) loaded in %.2f s; %s", s.o.model_path, s.engine->backend_name,
            ds4_now() - t0, ds4_memory_line(s.engine->w, s.o.ctx, mem, sizeof(mem)));
    if (s.engine->mtp)
        srv_log("server",
                "MTP speculative decoding: up to %u drafts a step, drafting while the block's top two "
                "logits are %.2f apart",
                s.o.mtp.draft, s.o.mtp.margin);
    if (s.o.no_sim) srv_log("server", "low-precision simulations off (--no-sim)");
    for (uint32_t id = 0; id < ds4_vocab_size(s.engine->vocab); id++) {
        size_t n = ds4_vocab_token_bytes(s.engine->vocab, (int32_t)id).len;
        if (n > s.max_token_bytes) s.max_token_bytes = n;
    }
    if (s.o.warm_weights) {
        uint32_t first = 0, end = s.engine->w->cfg.n_layer;
        if (d) ds4_dist_layers(d, &first, &end); /* a pipeline: this rank's stage */
        int wrc = d ? ds4_startup_warm_layers("ds4-server", s.engine->w, first, end, s.o.n_threads, stop_signal_pending,
                                              NULL)
                    : ds4_startup_warm("ds4-server", s.engine->w, s.o.n_threads, stop_signal_pending, NULL);
        if (wrc != 0) return wrc;
    }
    if (!(s.tools = toolmem_new(s.o.tool_memory_max_ids, 512ull << 20))) {
        fprintf(stderr, "ds4-server: out of memory\n");
        return 1;
    }
    if (worker_start(&s, &err) != 0 || http_start(&s, &err) != 0) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        s.stopping = 1;
        worker_stop(&s);
        return 1;
    }
    if (s.o.api_key) srv_log("server", "API key required");
    pthread_t shut;
    bool shutting = false;
    while (!s.shutdown_done) {
        struct timespec ts = {0, 100 * 1000000L};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        if (sig <= 0) continue;
        if (shutting) {
            srv_log("server", "second signal: exiting now");
            _exit(130);
        }
        shutting = true;
        pthread_create(&shut, NULL, shutdown_main, &s);
    }
    pthread_join(shut, NULL);
    toolmem_free(s.tools);
    render_pool_free(&s);
    ds4_engine_close(s.engine);
    ds4_dist_end(d);
    json_decref(s.forced);
    trace_close(&s.trace);
    srv_log("server", "bye");
    return 0;
}
