/*
 * ds4-forward - run the forward pass of a ds4 GGUF on a list of token ids,
 * for tests and benchmarks.
 *
 *   ds4-forward MODEL [options]
 *     --tokens LIST      comma- or space-separated token ids ("@FILE" reads them from FILE)
 *     --random N         N random token ids (--seed S, default 1)
 *     --decode           feed the tokens one by one (default: one prefill)
 *     --split K          prefill the first K tokens, then decode the rest
 *     --logits-out FILE  write the f32 logits after every token (n x n_vocab, little-endian)
 *     --load-state FILE  start from a DSV4 session payload
 *     --save-state FILE  write the DSV4 session payload at the end
 *     --top N            print the N best next tokens (default 5)
 *     --bench            time a prefill of the tokens, then --gen G decode steps (default 16)
 *     -t N               threads (default: all CPUs)
 *     --ctx N, --chunk N context size and prefill chunk
 *     --no-sim           turn the low-precision simulations off
 *     --backend NAME     cpu (default), or cuda in CUDA builds (make cuda)
 *
 * Exit status 0 on success, 1 on any error (the message names the cause).
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

typedef struct opts {
    const char *model, *tokens, *logits_out, *load_state, *save_state, *backend;
    uint32_t n_random, seed, split, top, gen;
    bool decode, bench, has_split;
    ds4_backend_opts bo;
} opts;

static void usage(void) {
    fprintf(stderr, "usage: ds4-forward MODEL [--tokens LIST|@FILE | --random N [--seed S]] [--decode | --split K]\n"
                    "       [--logits-out FILE] [--load-state FILE] [--save-state FILE] [--top N]\n"
                    "       [--bench [--gen G]] [-t N] [--ctx N] [--chunk N] [--no-sim] [--backend cpu|cuda]\n");
}

static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof(*o));
    o->seed = 1;
    o->top = 5;
    o->gen = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint32_t u;
#define NEED_VALUE() do { if (!v) { fprintf(stderr, "ds4-forward: %s needs a value\n", a); return -1; } i++; } while (0)
#define NEED_U32(dst) do { NEED_VALUE(); if (ds4_parse_u32(v, 0, UINT32_MAX, &u)) { fprintf(stderr, "ds4-forward: %s: bad number '%s'\n", a, v); return -1; } dst = u; } while (0)
        if (!strcmp(a, "--tokens")) { NEED_VALUE(); o->tokens = v; }
        else if (!strcmp(a, "--random")) NEED_U32(o->n_random);
        else if (!strcmp(a, "--seed")) NEED_U32(o->seed);
        else if (!strcmp(a, "--decode")) o->decode = true;
        else if (!strcmp(a, "--split")) { NEED_U32(o->split); o->has_split = true; }
        else if (!strcmp(a, "--logits-out")) { NEED_VALUE(); o->logits_out = v; }
        else if (!strcmp(a, "--load-state")) { NEED_VALUE(); o->load_state = v; }
        else if (!strcmp(a, "--save-state")) { NEED_VALUE(); o->save_state = v; }
        else if (!strcmp(a, "--top")) NEED_U32(o->top);
        else if (!strcmp(a, "--bench")) o->bench = true;
        else if (!strcmp(a, "--gen")) NEED_U32(o->gen);
        else if (!strcmp(a, "-t")) { NEED_U32(u); o->bo.n_threads = (int)u; }
        else if (!strcmp(a, "--ctx")) NEED_U32(o->bo.ctx_size);
        else if (!strcmp(a, "--chunk")) NEED_U32(o->bo.prefill_chunk);
        else if (!strcmp(a, "--no-sim")) o->bo.no_sim = true;
        else if (!strcmp(a, "--backend")) { NEED_VALUE(); o->backend = v; }
        else if (!strcmp(a, "--cpu") || !strcmp(a, "--cuda")) o->backend = a + 2;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(); exit(0); }
        else if (a[0] == '-') { fprintf(stderr, "ds4-forward: unknown option %s\n", a); return -1; }
        else if (!o->model) o->model = a;
        else { fprintf(stderr, "ds4-forward: unexpected argument %s\n", a); return -1; }
#undef NEED_U32
#undef NEED_VALUE
    }
    if (!o->model) { usage(); return -1; }
    ds4_err err = {0};
    if (ds4_backend_check_name(o->backend, &err) != 0) { fprintf(stderr, "ds4-forward: --backend: %s\n", err.msg); return -1; }
    return 0;
}

/* Token ids from "1,2 3" or from the file named after '@'. */
static uint32_t *read_tokens(const char *spec, uint32_t *n, ds4_err *err) {
    char *text = NULL;
    if (spec[0] == '@') {
        FILE *f = fopen(spec + 1, "rb");
        if (!f) { ds4_err_set(err, DS4_EIO, "cannot open %s: %s", spec + 1, strerror(errno)); return NULL; }
        size_t cap = 0, len = 0;
        for (;;) {
            if (len + 4096 + 1 > cap) { cap = 2 * cap + 8192; char *t = realloc(text, cap); if (!t) break; text = t; }
            size_t r = fread(text + len, 1, 4096, f);
            len += r;
            if (r == 0) break;
        }
        fclose(f);
        if (!text) { ds4_err_set(err, DS4_ENOMEM, "out of memory"); return NULL; }
        text[len] = 0;
    } else {
        text = strdup(spec);
    }
    uint32_t *toks = malloc((strlen(text) / 2 + 1) * sizeof(uint32_t));
    uint32_t m = 0;
    for (char *tok = strtok(text, ", \t\n"); tok; tok = strtok(NULL, ", \t\n")) {
        if (ds4_parse_u32(tok, 0, UINT32_MAX, &toks[m])) {
            ds4_err_set(err, DS4_EINVAL, "bad token id '%s'", tok);
            free(toks); free(text);
            return NULL;
        }
        m++;
    }
    free(text);
    *n = m;
    return toks;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++) if (x[i] > x[best]) best = i;
    return best;
}

static void print_top(const float *logits, uint32_t n_vocab, uint32_t k) {
    bool *used = calloc(n_vocab, 1);
    printf("next-token top %u:", k);
    for (uint32_t j = 0; j < k && j < n_vocab; j++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t i = 0; i < n_vocab; i++)
            if (!used[i] && (best == UINT32_MAX || logits[i] > logits[best])) best = i;
        used[best] = true;
        printf(" %u (%.4f)", best, logits[best]);
    }
    printf("\n");
    free(used);
}

static int run(const opts *o, ds4_err *err) {
    int rc = -1;
    uint32_t n = 0, *toks = NULL;
    float *logits = NULL;
    ds4_kv_state *st = NULL;
    ds4_backend *b = NULL;
    ds4_weights *w = ds4_weights_open(o->model, err);
    if (!w) return -1;
    const ds4_config *c = &w->cfg;
    if (o->tokens) {
        if (!(toks = read_tokens(o->tokens, &n, err))) goto out;
    } else if (o->n_random) {
        n = o->n_random;
        toks = malloc(n * sizeof(uint32_t));
        uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + 1;
        for (uint32_t i = 0; i < n; i++) { /* xorshift64* */
            s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
            toks[i] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 33) % c->n_vocab;
        }
    }
    if (!(b = ds4_backend_create(o->backend, w, &o->bo, err))) goto out;
    ds4_startup_print_memory("ds4-forward", b->ops->name, w, b->opts.ctx_size);
    if (o->load_state) {
        if (!(st = ds4_backend_state_new(b, err)) || ds4_kv_state_load_file(st, o->load_state, err) != 0 ||
            ds4_backend_restore(b, st, err) != 0)
            goto out;
    }
    if (n && !(logits = malloc((size_t)n * c->n_vocab * sizeof(float)))) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for logits");
        goto out;
    }
    uint32_t n_pre = o->decode ? 0 : o->has_split ? (o->split < n ? o->split : n) : n;
    double t0 = now_s();
    if (ds4_backend_prefill(b, toks, n_pre, logits, err) != 0) goto out;
    double t1 = now_s();
    for (uint32_t i = n_pre; i < n; i++) {
        if (ds4_backend_decode(b, toks[i], err) != 0) goto out;
        memcpy(logits + (size_t)i * c->n_vocab, ds4_backend_logits(b), c->n_vocab * sizeof(float));
    }
    double t2 = now_s();
    if (o->bench) {
        printf("backend %s, %d threads, sims %s\n", b->ops->name, b->opts.n_threads, o->bo.no_sim ? "off" : "on");
        if (n_pre) printf("prefill: %u tokens in %.3f s = %.2f tokens/s\n", n_pre, t1 - t0, n_pre / (t1 - t0));
        if (n > n_pre) printf("decode (fed): %u tokens in %.3f s = %.2f tokens/s\n", n - n_pre, t2 - t1, (n - n_pre) / (t2 - t1));
        uint32_t next = ds4_backend_logits(b) ? argmax(ds4_backend_logits(b), c->n_vocab) : 0;
        double t3 = now_s();
        for (uint32_t g = 0; g < o->gen; g++) {
            if (ds4_backend_decode(b, next, err) != 0) goto out;
            next = argmax(ds4_backend_logits(b), c->n_vocab);
        }
        double t4 = now_s();
        if (o->gen) printf("decode (greedy): %u tokens in %.3f s = %.2f tokens/s\n", o->gen, t4 - t3, o->gen / (t4 - t3));
    }
    if (o->logits_out && n) {
        FILE *f = fopen(o->logits_out, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)n * c->n_vocab, f) != (size_t)n * c->n_vocab) {
            if (f) fclose(f);
            ds4_err_set(err, DS4_EIO, "writing %s failed", o->logits_out);
            goto out;
        }
        if (fclose(f) != 0) { ds4_err_set(err, DS4_EIO, "writing %s failed", o->logits_out); goto out; }
    }
    if (o->save_state) {
        if (!st && !(st = ds4_backend_state_new(b, err))) goto out;
        if (ds4_backend_snapshot(b, st, err) != 0 || ds4_kv_state_save_file(st, o->save_state, err) != 0) goto out;
    }
    if (o->top && ds4_backend_logits(b)) print_top(ds4_backend_logits(b), c->n_vocab, o->top);
    rc = 0;
out:
    ds4_kv_state_free(st);
    ds4_backend_free(b);
    ds4_weights_close(w);
    free(logits);
    free(toks);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    if (parse_args(argc, argv, &o) != 0) return 2; /* usage errors, as in every program */
    int lrc = ds4_startup_lock("ds4-forward");
    if (lrc) return lrc;
    ds4_err err = {0};
    if (run(&o, &err) != 0) {
        fprintf(stderr, "ds4-forward: %s\n", ds4_err_msg(&err));
        return 1;
    }
    return 0;
}
