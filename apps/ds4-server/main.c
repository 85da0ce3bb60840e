/*
 * main.c - ds4-server: options (ds4-server's, plus --api-key,
 * --queue, --max-body-mb and the test hook), startup, signals, shutdown.
 *
 * Startup (engine/startup.h): --chdir first, so every relative path (model,
 * trace, disk cache) is taken from there; the instance lock; the model,
 * with the memory estimate for --ctx; --warm-weights.
 *
 * Shutdown on SIGINT/SIGTERM: stop taking jobs (503), cancel the running
 * generation, answer the queued jobs, save the live session to the disk
 * cache ("shutdown"), close the listener.  A second signal exits at once
 * (status 130).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/numparse.h"
#include "engine/generate.h"
#include "engine/startup.h"
#include "server.h"

server *SRV;
void http_set_keepalive_ms(int ms);
void render_pool_free(void);

static void usage(FILE *f) {
    fprintf(f,
            "usage: ds4-server [options]\n"
            "  -m, --model FILE          GGUF model (default ds4flash.gguf)\n"
            "  -c, --ctx N               context size (default 32768)\n"
            "  -n, --tokens N            default max output tokens (default 393216)\n"
            "  -t, --threads N           CPU threads (default: all cores)\n"
            "  --backend NAME, --cpu, --cuda\n"
            "  --chdir DIR               change to DIR first: relative paths (model, trace, disk\n"
            "                            cache) are taken from there\n"
            "  --warm-weights            read the whole model file in before serving\n"
            "  --quality                 accepted for ds4 compatibility (one kernel precision here)\n"
            "  --host HOST               bind address (default 127.0.0.1)\n"
            "  --port N                  port (default 8000; 0 picks a free one)\n"
            "  --cors                    add Access-Control-Allow-* headers\n"
            "  --trace FILE              human-readable request trace\n"
            "  --api-key KEY             require this key (Authorization: Bearer or x-api-key;\n"
            "                            also $DS4_API_KEY)\n"
            "  --queue N                 queued requests before answering 429 (default 256)\n"
            "  --max-body-mb N           largest request body (default 64)\n"
            "  --max-connections N       simultaneous connections (default 512)\n"
            "  --timeout S               idle connection timeout in seconds (default 60)\n"
            "  --sse-keepalive-ms N      keepalive comment interval while streaming (default 5000)\n"
            "  --kv-disk-dir DIR         disk KV cache directory (off by default)\n"
            "  --kv-disk-space-mb N      disk budget (default 4096)\n"
            "  --kv-cache-min-tokens N                 (default 512)\n"
            "  --kv-cache-cold-max-tokens N            (default 30000; 0 disables cold saves)\n"
            "  --kv-cache-continued-interval-tokens N  (default 10000; 0 disables)\n"
            "  --kv-cache-boundary-trim-tokens N       (default 32)\n"
            "  --kv-cache-boundary-align-tokens N      (default 2048; 0 disables)\n"
            "  --kv-cache-reject-different-quant\n"
            "  --disable-exact-dsml-tool-replay\n"
            "  --tool-memory-max-ids N   (default 100000)\n"
            "  --no-memory-checkpoint    do not keep an in-memory snapshot of the last prompt (it costs\n"
            "                            one more KV state of memory; it makes retries and replies the\n"
            "                            client replays differently prefill only the new part)\n"
            "  --test-force-output FILE  tests only: JSON object name -> text; a request with the\n"
            "                            header X-DS4-Test-Output: NAME generates exactly that text\n"
            "  -h, --help\n");
}

static int parse_uint(const char *opt, const char *v, unsigned long long lo, unsigned long long hi,
                      unsigned long long *out) {
    uint64_t x;
    if (ds4_parse_u64(v, lo, hi, &x)) {
        fprintf(stderr, "ds4-server: %s needs an integer in [%llu, %llu]\n", opt, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_args(int argc, char **argv, srv_opts *o, int *keepalive, bool *no_ckpt) {
    *o = (srv_opts){.model_path = "ds4flash.gguf", .ctx = 32768, .default_max_tokens = 393216, .host = "127.0.0.1",
                    .port = 8000, .queue_max = 256, .max_body = 64ull << 20, .max_connections = 512,
                    .connection_timeout_s = 60, .kv_space_mb = 4096, .exact_replay = true,
                    .tool_memory_max_ids = 100000};
    ds4_kvc_policy_defaults(&o->kv_policy);
    o->api_key = getenv("DS4_API_KEY");
    if (o->api_key && !*o->api_key) o->api_key = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long x;
#define NUM(name, lo, hi, dst)                                        \
    if (strcmp(a, name) == 0) {                                       \
        if (parse_uint(a, v, lo, hi, &x)) return -1;                  \
        dst = x;                                                      \
        i++;                                                          \
        continue;                                                     \
    }
#define STR(name, dst)                                                  \
    if (strcmp(a, name) == 0) {                                         \
        if (!v) {                                                       \
            fprintf(stderr, "ds4-server: %s needs a value\n", a);       \
            return -1;                                                  \
        }                                                               \
        dst = v;                                                        \
        i++;                                                            \
        continue;                                                       \
    }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        STR("-m", o->model_path) STR("--model", o->model_path)
        NUM("-c", 16, 1u << 30, o->ctx) NUM("--ctx", 16, 1u << 30, o->ctx)
        NUM("-n", 1, UINT32_MAX, o->default_max_tokens) NUM("--tokens", 1, UINT32_MAX, o->default_max_tokens)
        NUM("-t", 1, 4096, o->n_threads) NUM("--threads", 1, 4096, o->n_threads)
        STR("--backend", o->backend)
        if (!strcmp(a, "--cpu")) { o->backend = "cpu"; continue; }
        if (!strcmp(a, "--cuda")) { o->backend = "cuda"; continue; }
        if (!strcmp(a, "--metal")) { o->backend = "metal"; continue; }
        STR("--chdir", o->chdir_to)
        if (!strcmp(a, "--warm-weights")) { o->warm_weights = true; continue; }
        if (!strcmp(a, "--quality")) {
            fprintf(stderr, "ds4-server: --quality: nothing to change, this engine's kernels have one precision\n");
            continue;
        }
        STR("--host", o->host)
        NUM("--port", 0, 65535, o->port)
        if (!strcmp(a, "--cors")) { o->cors = true; continue; }
        STR("--trace", o->trace_path)
        STR("--api-key", o->api_key)
        NUM("--queue", 1, 1000000, o->queue_max)
        NUM("--max-body-mb", 1, 4096, o->max_body)
        NUM("--max-connections", 1, 100000, o->max_connections)
        NUM("--timeout", 1, 86400, o->connection_timeout_s)
        NUM("--sse-keepalive-ms", 10, 3600000, *keepalive)
        STR("--kv-disk-dir", o->kv_dir)
        NUM("--kv-disk-space-mb", 1, 1ull << 40, o->kv_space_mb)
        NUM("--kv-cache-min-tokens", 1, UINT32_MAX, o->kv_policy.min_tokens)
        NUM("--kv-cache-cold-max-tokens", 0, UINT32_MAX, o->kv_policy.cold_max_tokens)
        NUM("--kv-cache-continued-interval-tokens", 0, UINT32_MAX, o->kv_policy.continued_interval)
        NUM("--kv-cache-boundary-trim-tokens", 0, UINT32_MAX, o->kv_policy.boundary_trim)
        NUM("--kv-cache-boundary-align-tokens", 0, UINT32_MAX, o->kv_policy.boundary_align)
        if (!strcmp(a, "--kv-cache-reject-different-quant")) { o->kv_reject_different_quant = true; continue; }
        if (!strcmp(a, "--disable-exact-dsml-tool-replay")) { o->exact_replay = false; continue; }
        NUM("--tool-memory-max-ids", 1, 100000000, o->tool_memory_max_ids)
        STR("--test-force-output", o->test_force_output)
        if (!strcmp(a, "--no-memory-checkpoint")) { *no_ckpt = true; continue; }
#undef NUM
#undef STR
        if (ds4_option_not_supported(a)) {
            fprintf(stderr, "ds4-server: %s: %s\n", a, ds4_option_not_supported(a));
            return -1;
        }
        fprintf(stderr, "ds4-server: unknown option %s (see --help)\n", a);
        return -1;
    }
    o->max_body <<= 20;
    ds4_err err = {0};
    if (ds4_backend_check_name(o->backend, &err) != 0) {
        fprintf(stderr, "ds4-server: --backend: %s\n", err.msg);
        return -1;
    }
    if (ds4_kvc_policy_check(&o->kv_policy, &err) != 0) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static volatile sig_atomic_t shutdown_done;

static void *shutdown_main(void *arg) {
    server *s = arg;
    srv_log("server", "shutting down");
    s->stopping = 1;
    worker_stop();
    http_stop();
    shutdown_done = 1;
    return NULL;
}

int main(int argc, char **argv) {
    server s = {0};
    int keepalive = 5000;
    bool no_ckpt = false;
    if (parse_args(argc, argv, &s.o, &keepalive, &no_ckpt) != 0) return 2;
    if (s.o.chdir_to && chdir(s.o.chdir_to) != 0) {
        fprintf(stderr, "ds4-server: --chdir %s: %s\n", s.o.chdir_to, strerror(errno));
        return 1;
    }
    int lrc = ds4_startup_lock("ds4-server");
    if (lrc) return lrc;
    s.memory_checkpoint = !no_ckpt;
    http_set_keepalive_ms(keepalive);
    SRV = &s;
    pthread_mutex_init(&s.stats_mu, NULL);
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
    if (s.o.trace_path && trace_open(s.o.trace_path, &err) != 0) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        return 1;
    }
    ds4_engine_opts eo = {.model_path = s.o.model_path, .backend = s.o.backend, .n_threads = s.o.n_threads,
                          .need_vocab = true};
    double t0 = ds4_now();
    if (ds4_model_file_check(s.o.model_path, &err) != 0 || !(s.engine = ds4_engine_open(&eo, &err))) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        return 1;
    }
    char mem[160];
    srv_log("server", "model %s (%s backend) loaded in %.2f s; %s", s.o.model_path, s.engine->backend_name,
            ds4_now() - t0, ds4_memory_line(s.engine->w, s.o.ctx, mem, sizeof(mem)));
    if (s.o.warm_weights && ds4_startup_warm("ds4-server", s.engine->w, s.o.n_threads) != 0) return 1;
    if (!(s.tools = toolmem_new(s.o.tool_memory_max_ids, 512ull << 20))) {
        fprintf(stderr, "ds4-server: out of memory\n");
        return 1;
    }
    if (worker_start(&s, &err) != 0 || http_start(&s, &err) != 0) {
        fprintf(stderr, "ds4-server: %s\n", err.msg);
        s.stopping = 1;
        worker_stop();
        return 1;
    }
    if (s.o.api_key) srv_log("server", "API key required");
    pthread_t shut;
    bool shutting = false;
    while (!shutdown_done) {
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
    render_pool_free();
    ds4_engine_close(s.engine);
    json_decref(s.forced);
    trace_close();
    srv_log("server", "bye");
    return 0;
}
