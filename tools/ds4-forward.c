/*
 * ds4-forward - run the forward pass of a ds4 GGUF on a list of token ids,
 * for tests and benchmarks: the logits after every token (--logits-out),
 * the best next tokens, the session state (--save-state, --load-state), or
 * timings (--bench).  The options are the table in parse_args (ds4-forward
 * --help prints it).
 *
 * Exit status 0 on success, 1 on any error (the message names the cause),
 * 2 on a usage error.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/numparse.h"
#include "base/paths.h"
#include "base/rank.h"
#include "engine/cli.h"
#include "engine/startup.h"
#include "model/backends.h"
#include "model/weights.h"

typedef struct opts {
    const char *model, *tokens, *logits_out, *load_state, *save_state, *backend;
    uint32_t n_random, seed, split, top, gen, seqs;
    bool decode, bench, has_split;
    ds4_backend_opts bo;
    ds4_dist_opts dist;
} opts;

/* Returns -1 to run, else the status to exit with. */
static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof(*o));
    ds4_opt table[] = {
        {DS4_OPT_SECTION("input:")},
        {DS4_OPT_STR("--tokens", "LIST", &o->tokens, NULL,
                     "comma- or space-separated token ids; @FILE reads them from FILE")},
        {DS4_OPT_U32("--random", "N", &o->n_random, 1, DS4_CTX_MAX, 0, "N seeded random token ids instead"),
         .def_text = "none"},
        {DS4_OPT_U32("--seed", "S", &o->seed, 0, UINT32_MAX, 1, "seed of --random")},
        {DS4_OPT_STR("--load-state", "FILE", &o->load_state, NULL, "start from a DSV4 session payload"),
         .flags = DS4_OPT_IN},

        {DS4_OPT_SECTION("running:")},
        {DS4_OPT_FLAG("--decode", &o->decode, "feed the tokens one by one (default: one prefill)")},
        {DS4_OPT_U32("--seqs", "K", &o->seqs, 1, 64, 1,
                     "decode K sequences of the same tokens side by side, one batched step a token (their logits "
                     "must agree)")},
        {DS4_OPT_U32("--split", "K", &o->split, 0, UINT32_MAX, 0, "prefill the first K tokens, then decode the rest"),
         .seen = &o->has_split, .def_text = "all prefilled"},
        DS4_CLI_CTX(&o->bo.ctx_size),
        {DS4_OPT_U32("--chunk", "N", &o->bo.prefill_chunk, 1, DS4_CTX_MAX, 0, "tokens per batched prefill pass"),
         .def_text = "2048"},
        DS4_CLI_THREADS(&o->bo.n_threads),
        DS4_CLI_NO_SIM(&o->bo.no_sim),
        DS4_CLI_BACKEND(&o->backend, NULL),
        DS4_CLI_DIST(&o->dist),
        DS4_CLI_TP(&o->bo.tensor_parallel),

        {DS4_OPT_SECTION("output:")},
        {DS4_OPT_STR("--logits-out", "FILE", &o->logits_out, NULL,
                     "write the f32 logits after every token (n x n_vocab, little-endian)"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_STR("--save-state", "FILE", &o->save_state, NULL, "write the DSV4 session payload at the end"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_U32("--top", "N", &o->top, 0, UINT32_MAX, 5, "print the N best next tokens (0: none)")},
        {DS4_OPT_FLAG("--bench", &o->bench, "time the prefill, then --gen greedy decode steps (their tokens printed)")},
        {DS4_OPT_U32("--gen", "G", &o->gen, 0, UINT32_MAX, 16, "greedy decode steps of --bench")},

        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_STR("MODEL", NULL, &o->model, NULL, "the GGUF model file"), .flags = DS4_OPT_REQUIRED},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-forward",
                   .usage = "MODEL [--tokens LIST|@FILE | --random N] [options]",
                   .about = "Run the forward pass of a ds4 GGUF on token ids: logits, the best next tokens, "
                            "session states,\ntimings.",
                   .opts = table,
                   .notes = DS4_CLI_ENV_NOTES,
                   .refused = ds4_option_not_supported};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (o->tokens && o->n_random) return ds4_cli_usage(&cli, "give one of --tokens or --random");
    ds4_err err = {0};
    if (o->tokens && o->tokens[0] == '@' && ds4_path_check_readable(o->tokens + 1, &err) != 0)
        return ds4_cli_usage(&cli, "--tokens: %s", err.msg);
    if (ds4_cli_check_backend(&cli, o->backend) != 0 || ds4_cli_tp_check(&cli, o->bo.tensor_parallel, &o->dist) != 0)
        return 2;
    return -1;
}

/* Token ids from "1,2 3" or from the file named after '@'. */
static uint32_t *read_tokens(const char *spec, uint32_t *n, ds4_err *err) {
    char *text = NULL;
    if (spec[0] == '@') {
        FILE *f = fopen(spec + 1, "rb");
        if (!f) {
            ds4_err_set(err, DS4_EIO, "cannot open %s: %s", spec + 1, strerror(errno));
            return NULL;
        }
        size_t cap = 0, len = 0;
        for (;;) {
            if (len + 4096 + 1 > cap) {
                cap = 2 * cap + 8192;
                char *t = realloc(text, cap);
                if (!t) break;
                text = t;
            }
            size_t r = fread(text + len, 1, 4096, f);
            len += r;
            if (r == 0) break;
        }
        fclose(f);
        if (!text) {
            ds4_err_set(err, DS4_ENOMEM, "out of memory");
            return NULL;
        }
        text[len] = 0;
    } else {
        text = strdup(spec);
    }
    uint32_t *toks = malloc((strlen(text) / 2 + 1) * sizeof(uint32_t));
    uint32_t m = 0;
    for (char *tok = strtok(text, ", \t\n"); tok; tok = strtok(NULL, ", \t\n")) {
        if (ds4_parse_u32(tok, 0, UINT32_MAX, &toks[m])) {
            ds4_err_set(err, DS4_EINVAL, "bad token id '%s'", tok);
            free(toks);
            free(text);
            return NULL;
        }
        m++;
    }
    free(text);
    *n = m;
    return toks;
}

/* The k best next tokens, in base/rank.h's order. */
static int print_top(const float *logits, uint32_t n_vocab, uint32_t k, ds4_err *err) {
    if (k > n_vocab) k = n_vocab;
    int32_t *ids = malloc((size_t)k * sizeof(int32_t));
    if (!ids) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int n = ds4_top_k(logits, (int)n_vocab, (int)k, ids);
    printf("next-token top %u:", k);
    for (int j = 0; j < n; j++) printf(" %d (%.4f)", ids[j], logits[ids[j]]);
    printf("\n");
    free(ids);
    return 0;
}

/* Tokens [from, n) decoded by k sequences side by side - the main one
 * (after its prefill of toks[0, from)) and k - 1 more brought to the same
 * point (st: a loaded state, or the same prefill) - one step of k rows a
 * token; every sequence's logits must be the main one's, which go to
 * logits. */
static int batched_decode(ds4_backend *b, uint32_t k, const ds4_kv_state *st, const uint32_t *toks, uint32_t from,
                          uint32_t n, float *logits, ds4_err *err) {
    uint32_t V = b->w->cfg.n_vocab;
    ds4_seq *seqs[64] = {b->main};
    float *lg = malloc((size_t)k * V * sizeof(float));
    int rc = lg ? 0 : ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (uint32_t j = 1; rc == 0 && j < k; j++) {
        if (!(seqs[j] = ds4_seq_new(b, 0, err))) rc = -1;
        else if (st && ds4_seq_restore(b, seqs[j], st, err) != 0) rc = -1;
        else if (ds4_seq_prefill(b, seqs[j], toks, from, NULL, err) != 0) rc = -1;
    }
    for (uint32_t i = from; rc == 0 && i < n; i++) {
        ds4_row rows[64];
        for (uint32_t j = 0; j < k; j++) rows[j] = ds4_row_of(seqs[j], toks[i], DS4_ROW_LOGITS);
        ds4_step_out out = {lg, NULL};
        if ((rc = ds4_backend_step(b, rows, k, &out, err)) != 0) break;
        for (uint32_t j = 1; rc == 0 && j < k; j++)
            if (memcmp(lg, lg + (size_t)j * V, V * sizeof(float)) != 0)
                rc = ds4_err_set(err, DS4_EINVAL, "token %u: sequence %u's logits differ from sequence 0's", i, j);
        memcpy(logits + (size_t)i * V, lg, V * sizeof(float));
    }
    for (uint32_t j = 1; j < k; j++) ds4_seq_free(b, seqs[j]);
    free(lg);
    return rc;
}

/* The backend: the pipeline's under mpirun (d), else the named one. */
static ds4_backend *make_backend(const opts *o, ds4_dist *d, const ds4_weights *w, ds4_err *err) {
    if (!d) return ds4_backend_create(o->backend, w, &o->bo, err);
    if (ds4_dist_plan(d, "ds4-forward", w, &o->dist, err) != 0) return NULL;
    return ds4_dist_backend_create(d, o->backend, w, &o->bo, err);
}

static int run(const opts *o, ds4_dist *d, ds4_err *err) {
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
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            toks[i] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 33) % c->n_vocab;
        }
    }
    if (!(b = make_backend(o, d, w, err))) goto out;
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
    double t0 = ds4_now();
    if (ds4_backend_prefill(b, toks, n_pre, logits, err) != 0) goto out;
    double t1 = ds4_now();
    if (o->seqs > 1) {
        if (batched_decode(b, o->seqs, st, toks, n_pre, n, logits, err) != 0) goto out;
    } else {
        for (uint32_t i = n_pre; i < n; i++) {
            if (ds4_backend_decode(b, toks[i], err) != 0) goto out;
            memcpy(logits + (size_t)i * c->n_vocab, ds4_backend_logits(b), c->n_vocab * sizeof(float));
        }
    }
    double t2 = ds4_now();
    if (o->bench) {
        printf("backend %s, %d threads, sims %s\n", b->ops->name, b->opts.n_threads, o->bo.no_sim ? "off" : "on");
        if (n_pre)
            printf("prefill: %u token%s in %.3f s = %.2f tokens/s\n", n_pre, ds4_plural(n_pre), t1 - t0,
                   n_pre / (t1 - t0));
        if (n > n_pre)
            printf("decode (fed): %u token%s in %.3f s = %.2f tokens/s\n", n - n_pre, ds4_plural(n - n_pre), t2 - t1,
                   (n - n_pre) / (t2 - t1));
        uint32_t *gen = o->gen ? malloc(o->gen * sizeof(uint32_t)) : NULL;
        if (o->gen && !gen) {
            ds4_err_set(err, DS4_ENOMEM, "out of memory");
            goto out;
        }
        double t3 = ds4_now();
        if (o->gen && ds4_backend_greedy(b, o->gen, gen, err) != 0) {
            free(gen);
            goto out;
        }
        double t4 = ds4_now();
        if (o->gen) {
            printf("decode (greedy): %u token%s in %.3f s = %.2f tokens/s\n", o->gen, ds4_plural(o->gen), t4 - t3,
                   o->gen / (t4 - t3));
            printf("greedy tokens:");
            for (uint32_t g = 0; g < o->gen; g++) printf(" %u", gen[g]);
            printf("\n");
        }
        free(gen);
    }
    if (o->logits_out && n) {
        FILE *f = fopen(o->logits_out, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)n * c->n_vocab, f) != (size_t)n * c->n_vocab) {
            if (f) fclose(f);
            ds4_err_set(err, DS4_EIO, "writing %s failed", o->logits_out);
            goto out;
        }
        if (fclose(f) != 0) {
            ds4_err_set(err, DS4_EIO, "writing %s failed", o->logits_out);
            goto out;
        }
    }
    if (o->save_state) {
        if (!st && !(st = ds4_backend_state_new(b, err))) goto out;
        if (ds4_backend_snapshot(b, st, err) != 0 || ds4_kv_state_save_file(st, o->save_state, err) != 0) goto out;
    }
    if (o->top && ds4_backend_logits(b) && print_top(ds4_backend_logits(b), c->n_vocab, o->top, err) != 0) goto out;
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
    int prc = parse_args(argc, argv, &o);
    if (prc >= 0) return prc;
    ds4_dist *d = NULL; /* under mpirun: the ranks after the first serve their stage in here */
    int drc = ds4_dist_start("ds4-forward", o.model, o.backend, o.bo.n_threads, &o.dist, &d);
    if (drc >= 0) return drc;
    int lrc = ds4_startup_lock("ds4-forward");
    if (lrc) {
        ds4_dist_end(d);
        return lrc;
    }
    ds4_err err = {0};
    int rc = 0;
    if (run(&o, d, &err) != 0) {
        fprintf(stderr, "ds4-forward: %s\n", ds4_err_msg(&err));
        rc = 1;
    }
    ds4_dist_end(d);
    return rc;
}
