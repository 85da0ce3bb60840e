/*
 * ds4-bench - prefill and generation throughput at growing context
 * frontiers, with ds4's options and CSV (docs/PERFORMANCE.md).
 *
 *   ds4-bench [-m MODEL | --synthetic RECIPE] [options]
 *
 * Loads once and walks a fixed token sequence frontier by frontier (ctx-start,
 * then + step-incr or x step-mul up to ctx-max): prefills only the new
 * interval (incremental), snapshots the session to RAM, generates a fixed
 * number of greedy tokens, restores the snapshot and goes on.  One CSV row
 * per frontier:
 *
 *   ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes
 *
 * (kvcache_bytes: the DSV4 payload size of the snapshot at that frontier).
 * A summary on stderr gives, for generation, the weight bytes a token
 * streams and the effective bandwidth, against the device copy bandwidth
 * measured in the same run (CUDA).
 *
 * --synthetic q2|q4 runs the published Flash shapes without a file: the CUDA
 * backend fills a full-size model with seeded random valid blocks in GPU
 * memory (ds4_weights_synthetic), so speed is measured at the real sizes.
 * The token sequence is, in order of preference: --prompt-file (raw text,
 * tokenized without a chat template, as ds4's bench; I Promessi Sposi,
 * Project Gutenberg ebook #45334, is the customary one), --chat-prompt-file (the text as
 * one non-thinking user message of the chat template, system text from
 * -sys), --tokens-file (ids, as ds4-forward reads them), or seeded random
 * ids (the only choice with --synthetic, which has no tokenizer).
 *
 * The model is -m FILE, ds4flash.gguf when neither it nor --synthetic is
 * given (as in ds4's bench).
 *
 * Options: --backend NAME, --cpu, --cuda (cuda in CUDA builds, else cpu),
 * --warm-weights (read the model file in first), --ctx-start N
 * (2048), --ctx-max N (32768), --ctx-alloc N (ctx-max + gen + 1), --step-mul F
 * (1), --step-incr N (2048), --gen-tokens N (128), --chunk N, --seed N,
 * --no-sim, -t/--threads N, --csv FILE (default stdout).  --quality is
 * accepted for ds4 compatibility (this engine has one kernel precision).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/numparse.h"
#include "engine/startup.h"
#include "model/backend.h"
#include "model/weights.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

typedef struct opts {
    const char *model, *synthetic, *backend, *tokens_file, *prompt_file, *chat_file, *system, *csv;
    bool warm_weights;
    uint32_t ctx_start, ctx_max, ctx_alloc, step_incr, gen, seed;
    double step_mul;
    ds4_backend_opts bo;
} opts;

static void usage(FILE *f) {
    fprintf(f, "usage: ds4-bench [-m MODEL (default ds4flash.gguf) | --synthetic q2|q4] [--backend NAME | --cpu | --cuda]\n"
               "                 [--seed N] [--warm-weights]\n"
               "                 [--prompt-file FILE | --chat-prompt-file FILE [-sys TEXT] | --tokens-file FILE]\n"
               "                 [--ctx-start N] [--ctx-max N] [--ctx-alloc N] [--step-mul F] [--step-incr N]\n"
               "                 [--gen-tokens N] [--chunk N] [--no-sim] [-t N] [--csv FILE]\n"
               "  DS4_LOCK_FILE: the instance lock file (default /tmp/ds4.lock)\n");
}

static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof(*o));
    o->ctx_start = 2048;
    o->ctx_max = 32768;
    o->step_incr = 2048;
    o->step_mul = 1.0;
    o->gen = 128;
    o->seed = 1;
#if DS4_CUDA
    o->backend = "cuda";
#else
    o->backend = "cpu";
#endif
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t u;
#define VAL() do { if (!v) { fprintf(stderr, "ds4-bench: %s needs a value\n", a); return -1; } i++; } while (0)
#define U32(dst) do { VAL(); if (ds4_parse_u32(v, 0, UINT32_MAX, &u)) { fprintf(stderr, "ds4-bench: %s: bad number '%s'\n", a, v); return -1; } dst = u; } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); o->model = v; }
        else if (!strcmp(a, "--synthetic")) { VAL(); o->synthetic = v; }
        else if (!strcmp(a, "--backend")) { VAL(); o->backend = v; }
        else if (!strcmp(a, "--cpu") || !strcmp(a, "--cuda") || !strcmp(a, "--metal")) o->backend = a + 2;
        else if (!strcmp(a, "--warm-weights")) o->warm_weights = true;
        else if (!strcmp(a, "--quality"))
            fprintf(stderr, "ds4-bench: --quality: nothing to change, this engine's kernels have one precision\n");
        else if (!strcmp(a, "--tokens-file")) { VAL(); o->tokens_file = v; }
        else if (!strcmp(a, "--prompt-file")) { VAL(); o->prompt_file = v; }
        else if (!strcmp(a, "--chat-prompt-file")) { VAL(); o->chat_file = v; }
        else if (!strcmp(a, "-sys") || !strcmp(a, "--system")) { VAL(); o->system = v; }
        else if (!strcmp(a, "--csv")) { VAL(); o->csv = v; }
        else if (!strcmp(a, "--ctx-start")) U32(o->ctx_start);
        else if (!strcmp(a, "--ctx-max")) U32(o->ctx_max);
        else if (!strcmp(a, "--ctx-alloc")) U32(o->ctx_alloc);
        else if (!strcmp(a, "--step-incr")) U32(o->step_incr);
        else if (!strcmp(a, "--gen-tokens") || !strcmp(a, "--tokens") || !strcmp(a, "-n")) U32(o->gen);
        else if (!strcmp(a, "--seed")) U32(o->seed);
        else if (!strcmp(a, "--chunk")) U32(o->bo.prefill_chunk);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { U32(u); o->bo.n_threads = (int)u; }
        else if (!strcmp(a, "--no-sim")) o->bo.no_sim = true;
        else if (!strcmp(a, "--step-mul")) {
            VAL();
            float m;
            if (ds4_parse_float(v, 1.0f, 1e6f, &m)) { fprintf(stderr, "ds4-bench: --step-mul must be a number >= 1\n"); return -1; }
            o->step_mul = m;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        else if (ds4_option_not_supported(a)) { fprintf(stderr, "ds4-bench: %s: %s\n", a, ds4_option_not_supported(a)); return -1; }
        else { fprintf(stderr, "ds4-bench: unknown option %s\n", a); usage(stderr); return -1; }
#undef U32
#undef VAL
    }
    if (o->model && o->synthetic) { fprintf(stderr, "ds4-bench: give one of -m MODEL or --synthetic RECIPE\n"); return -1; }
    if (!o->model && !o->synthetic) o->model = "ds4flash.gguf";
    ds4_err err = {0};
    if (ds4_backend_check_name(o->backend, &err) != 0) { fprintf(stderr, "ds4-bench: --backend: %s\n", err.msg); return -1; }
    if (!!o->tokens_file + !!o->prompt_file + !!o->chat_file > 1) {
        fprintf(stderr, "ds4-bench: give at most one of --prompt-file, --chat-prompt-file, --tokens-file\n");
        return -1;
    }
    if (o->synthetic && (o->prompt_file || o->chat_file)) {
        fprintf(stderr, "ds4-bench: --synthetic has no tokenizer: use --tokens-file or random ids\n");
        return -1;
    }
    if (o->system && !o->chat_file) { fprintf(stderr, "ds4-bench: -sys only applies to --chat-prompt-file\n"); return -1; }
    if (o->ctx_start == 0 || o->ctx_max < o->ctx_start) { fprintf(stderr, "ds4-bench: need 0 < ctx-start <= ctx-max\n"); return -1; }
    if (!o->ctx_alloc) o->ctx_alloc = o->ctx_max + o->gen + 1;
    if (o->ctx_alloc <= o->ctx_max + o->gen) { fprintf(stderr, "ds4-bench: ctx-alloc must exceed ctx-max + gen-tokens\n"); return -1; }
    o->bo.ctx_size = o->ctx_alloc;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Weight bytes one generated token reads: every tensor once (the embedding:
 * one row), and n_expert_used of the routed experts' matrices per layer. */
static double bytes_per_token(const ds4_weights *w) {
    double total = (double)w->token_embd.row_bytes;
    const ds4_wt *g = &w->output_hc_base;
    for (int i = 0; i < 5; i++) total += (double)g[i].row_bytes * g[i].ne[1] * g[i].ne[2];
    size_t nl = sizeof(ds4_layer_weights) / sizeof(ds4_wt);
    for (uint32_t il = 0; il < w->cfg.n_layer; il++) {
        const ds4_wt *t = (const ds4_wt *)&w->layers[il];
        for (size_t i = 0; i < nl; i++) {
            if (!t[i].name || &t[i] == &w->layers[il].tid2eid) continue;
            double mats = t[i].ne[2] > 1 ? (double)w->cfg.n_expert_used : (double)t[i].ne[2];
            total += (double)t[i].row_bytes * t[i].ne[1] * mats;
        }
    }
    return total;
}

static char *read_file(const char *path, size_t *len, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap = cap ? cap * 2 : 1 << 20);
            if (!nb) {
                free(buf);
                fclose(f);
                ds4_err_set(err, DS4_ENOMEM, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        ds4_err_set(err, DS4_EIO, "reading %s failed", path);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The prompt file's tokens: raw text, or one non-thinking user message. */
static int text_tokens(const opts *o, const ds4_weights *w, ds4_tokens *out, ds4_err *err) {
    const char *path = o->prompt_file ? o->prompt_file : o->chat_file;
    size_t len = 0;
    char *text = read_file(path, &len, err);
    if (!text) return -1;
    ds4_vocab *v = ds4_vocab_from_gguf(w->gguf, err);
    ds4_tokenizer *tk = v ? ds4_tokenizer_new(v, err) : NULL;
    int rc = -1;
    if (tk && o->prompt_file) {
        rc = ds4_tokenize_text(tk, text, len, out, err);
    } else if (tk) {
        json_t *msgs = json_array();
        if (o->system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
        json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "user", "content", text, len));
        ds4_chat_opts co = {.think = DS4_THINK_OFF};
        ds4_rendered r = {0};
        rc = ds4_chat_render(msgs, &co, &r, err);
        if (rc == 0) rc = ds4_tokenize_rendered(tk, &r, out, err);
        ds4_rendered_free(&r);
        json_decref(msgs);
    }
    ds4_tokenizer_free(tk);
    ds4_vocab_free(v);
    free(text);
    return rc;
}

static uint32_t *load_tokens(const opts *o, const ds4_weights *w, uint32_t n, ds4_err *err) {
    uint32_t vocab = w->cfg.n_vocab;
    uint32_t *t = malloc((size_t)n * sizeof(uint32_t));
    if (!t) { ds4_err_set(err, DS4_ENOMEM, "out of memory"); return NULL; }
    if (o->prompt_file || o->chat_file) {
        ds4_tokens ids = {0};
        int rc = text_tokens(o, w, &ids, err);
        if (rc == 0 && ids.n < n)
            rc = ds4_err_set(err, DS4_EINVAL, "%s gives %zu tokens, ctx-max needs %u",
                             o->prompt_file ? o->prompt_file : o->chat_file, ids.n, n);
        if (rc == 0)
            for (uint32_t i = 0; i < n; i++) t[i] = (uint32_t)ids.ids[i];
        ds4_tokens_free(&ids);
        if (rc != 0) { free(t); return NULL; }
        return t;
    }
    if (!o->tokens_file) {
        uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + 1;
        for (uint32_t i = 0; i < n; i++) {
            s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
            t[i] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 33) % vocab;
        }
        return t;
    }
    FILE *f = fopen(o->tokens_file, "r");
    if (!f) { ds4_err_set(err, DS4_EIO, "cannot open %s: %s", o->tokens_file, strerror(errno)); free(t); return NULL; }
    uint32_t m = 0;
    unsigned long v;
    while (m < n && fscanf(f, " %lu%*[, \t\n]", &v) == 1) {
        if (v >= vocab) { ds4_err_set(err, DS4_EINVAL, "%s: token %lu outside the vocabulary", o->tokens_file, v); break; }
        t[m++] = (uint32_t)v;
    }
    fclose(f);
    if (m < n) {
        if (!err || !err->msg[0]) ds4_err_set(err, DS4_EINVAL, "%s holds %u tokens, ctx-max needs %u", o->tokens_file, m, n);
        free(t);
        return NULL;
    }
    return t;
}

static int run(const opts *o, ds4_err *err) {
    int rc = -1;
    ds4_weights *w = NULL;
    if (o->synthetic) {
        ds4_config c;
        ds4_config_flash(&c);
        w = ds4_weights_synthetic(&c, o->synthetic, o->seed, err);
    } else if (ds4_model_file_check(o->model, err) == 0) {
        w = ds4_weights_open(o->model, err);
    }
    if (!w) return -1;
    if (o->warm_weights && ds4_startup_warm("ds4-bench", w, o->bo.n_threads) != 0) {
        ds4_weights_close(w);
        return ds4_err_set(err, DS4_EIO, "--warm-weights failed");
    }
    ds4_backend *b = NULL;
    ds4_kv_state *snap = NULL;
    uint32_t *toks = NULL, *gen = NULL;
    FILE *out = stdout;
    double t0 = now_s();
    if (!(b = ds4_backend_create(o->backend, w, &o->bo, err))) goto done;
    fprintf(stderr, "ds4-bench: %s backend, %s, ready in %.1f s\n", b->ops->name,
            o->synthetic ? "synthetic Flash weights" : o->model, now_s() - t0);
    ds4_startup_print_memory("ds4-bench", b->ops->name, w, o->ctx_alloc);
    double copy_bw = 0;
#if DS4_CUDA
    char dev[128] = "";
    if (!strcmp(b->ops->name, "cuda")) {
        if (ds4_cuda_copy_bandwidth(&copy_bw, dev, sizeof(dev), err)) goto done;
        fprintf(stderr, "ds4-bench: %s, device copy bandwidth %.0f GB/s (read + write)\n", dev, copy_bw / 1e9);
    }
#endif
    double bpt = bytes_per_token(w);
    fprintf(stderr, "ds4-bench: a generated token reads %.2f GB of weights\n", bpt / 1e9);
    if (!(toks = load_tokens(o, w, o->ctx_max, err))) goto done;
    if (!(gen = malloc((o->gen + 1) * sizeof(uint32_t))) || !(snap = ds4_backend_state_new(b, err))) {
        if (!snap && !gen) ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    if (o->csv && !(out = fopen(o->csv, "w"))) {
        ds4_err_set(err, DS4_EIO, "cannot create %s: %s", o->csv, strerror(errno));
        out = stdout;
        goto done;
    }
    fprintf(out, "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes\n");
    fflush(out);
    uint32_t done_tok = 0;
    for (uint32_t f = o->ctx_start;;) {
        uint32_t n = f - done_tok;
        double a = now_s();
        if (ds4_backend_prefill(b, toks + done_tok, n, NULL, err)) goto done;
        double pre = now_s() - a;
        done_tok = f;
        if (ds4_backend_snapshot(b, snap, err)) goto done;
        uint64_t kv = ds4_kv_state_payload_bytes(snap);
        a = now_s();
        if (o->gen && ds4_backend_greedy(b, o->gen, gen, err)) goto done;
        double g = now_s() - a;
        if (ds4_backend_restore(b, snap, err)) goto done;
        double gtps = o->gen ? o->gen / g : 0;
        fprintf(out, "%u,%u,%.2f,%u,%.2f,%llu\n", f, n, n / pre, o->gen, gtps, (unsigned long long)kv);
        fflush(out);
        fprintf(stderr, "ctx %6u: prefill %6u tokens %8.1f t/s | generate %4u tokens %7.2f t/s = %.0f GB/s of weights%s",
                f, n, n / pre, o->gen, gtps, gtps * bpt / 1e9, copy_bw > 0 ? "" : "\n");
        if (copy_bw > 0) fprintf(stderr, " (%.0f%% of the copy bandwidth)\n", 100.0 * gtps * bpt / copy_bw);
        if (f >= o->ctx_max) break;
        uint64_t next = o->step_mul > 1.0 ? (uint64_t)((double)f * o->step_mul) : (uint64_t)f + o->step_incr;
        f = next > o->ctx_max ? o->ctx_max : (uint32_t)next;
    }
    rc = 0;
done:
    if (out != stdout && fclose(out) != 0 && rc == 0) rc = ds4_err_set(err, DS4_EIO, "writing %s failed", o->csv);
    ds4_kv_state_free(snap);
    ds4_backend_free(b);
    ds4_weights_close(w);
    free(toks);
    free(gen);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    if (parse_args(argc, argv, &o) != 0) return 2;
    int lrc = ds4_startup_lock("ds4-bench");
    if (lrc) return lrc;
    ds4_err err = {0};
    if (run(&o, &err) != 0) {
        fprintf(stderr, "ds4-bench: %s\n", ds4_err_msg(&err));
        return 1;
    }
    return 0;
}
