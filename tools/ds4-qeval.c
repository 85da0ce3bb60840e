/*
 * ds4-qeval - how far a quantized GGUF is from a reference GGUF of the same
 * model, in the two measures the imatrix is meant to improve.
 *
 *   ds4-qeval REF.gguf TEST.gguf --imatrix FILE | --dataset FILE [options]
 *
 * --imatrix: importance-weighted error of the routed experts.  For every
 *   routed expert matrix, sum over rows and columns of imp[c] * (w - q)^2,
 *   with imp the importance vector of that expert (format/imatrix.h);
 *   reported per tensor kind and in total, relative to sum imp[c] * w^2.
 *   With imp the collected E[x^2] of the inputs this estimates the mean
 *   squared error the quantization adds to the expert's outputs.
 * --dataset: output divergence.  Both models run over the prompts of a
 *   dataset (token-id prompts, DS4_IMATRIX_PROMPT separators); reported are
 *   the mean and maximum KL(ref || test) of the next-token distributions
 *   over all positions, and how often both pick the same top token.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rank.h"
#include "engine/cli.h"
#include "format/imatrix.h"
#include "format/quants.h"
#include "engine/startup.h"
#include "model/backends.h"
#include "model/layout.h"
#include "model/weights.h"

/* ------------------------------------------------------- weighted error */

typedef struct werr {
    double err, ref;
} werr;

static int matrix_error(const ds4_wt *r, const ds4_wt *t, const ds4_imatrix *im, uint32_t e, uint32_t n_expert,
                        werr *acc, ds4_err *err) {
    int64_t cols = (int64_t)r->ne[0];
    float *a = malloc((size_t)cols * sizeof(float)), *b = malloc((size_t)cols * sizeof(float));
    float *imp = malloc((size_t)cols * sizeof(float));
    int rc = 0;
    if (!a || !b || !imp) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int found = rc == 0 ? ds4_imatrix_lookup(im, r->name, cols, (int)e, (int)n_expert, imp, err) : -1;
    if (found == 0) rc = ds4_err_set(err, DS4_ENOTFOUND, "imatrix has no vector for %s expert %u", r->name, e);
    if (found < 0) rc = -1;
    for (uint64_t row = 0; rc == 0 && row < r->ne[1]; row++) {
        ds4_dequantize_row(r->type, ds4_wt_row(r, e, row), a, cols);
        ds4_dequantize_row(t->type, ds4_wt_row(t, e, row), b, cols);
        for (int64_t c = 0; c < cols; c++) {
            double d = (double)a[c] - b[c];
            acc->err += imp[c] * d * d;
            acc->ref += imp[c] * (double)a[c] * a[c];
        }
    }
    free(a);
    free(b);
    free(imp);
    return rc;
}

static int weighted_error(const ds4_weights *r, const ds4_weights *t, const char *im_path, ds4_err *err) {
    ds4_imatrix *im = ds4_imatrix_load(im_path, err);
    if (!im) return -1;
    werr kinds[3] = {{0, 0}, {0, 0}, {0, 0}};
    int rc = 0;
    uint32_t ne = r->cfg.n_expert;
    for (uint32_t il = 0; il < r->cfg.n_layer && rc == 0; il++) {
        const ds4_layer_weights *a = &r->layers[il], *b = &t->layers[il];
        const ds4_wt *pairs[3][2] = {
            {&a->gate_exps, &b->gate_exps}, {&a->up_exps, &b->up_exps}, {&a->down_exps, &b->down_exps}};
        for (int k = 0; k < 3 && rc == 0; k++)
            for (uint32_t e = 0; e < ne && rc == 0; e++)
                rc = matrix_error(pairs[k][0], pairs[k][1], im, e, ne, &kinds[k], err);
    }
    if (rc == 0) {
        static const char *names[3] = {"gate (w1)", "up (w3)", "down (w2)"};
        double te = 0, tr = 0;
        for (int k = 0; k < 3; k++) {
            printf("weighted error %-10s %.6e (relative %.6f)\n", names[k], kinds[k].err, kinds[k].err / kinds[k].ref);
            te += kinds[k].err, tr += kinds[k].ref;
        }
        printf("weighted error total      %.6e (relative %.6f)\n", te, te / tr);
    }
    ds4_imatrix_free(im);
    return rc;
}

/* ------------------------------------------------------------ divergence */

typedef struct kl_acc {
    double sum, max;
    uint64_t n, same_top;
} kl_acc;

static void add_position(const float *p_logits, const float *q_logits, uint32_t nv, kl_acc *acc) {
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0;
    int32_t ap = ds4_argmax(p_logits, (int)nv), aq = ds4_argmax(q_logits, (int)nv);
    for (uint32_t i = 0; i < nv; i++) mp = fmax(mp, p_logits[i]), mq = fmax(mq, q_logits[i]);
    for (uint32_t i = 0; i < nv; i++) zp += exp(p_logits[i] - mp), zq += exp(q_logits[i] - mq);
    double kl = 0;
    for (uint32_t i = 0; i < nv; i++) {
        double lp = p_logits[i] - mp - log(zp), lq = q_logits[i] - mq - log(zq);
        kl += exp(lp) * (lp - lq);
    }
    acc->sum += kl;
    acc->max = fmax(acc->max, kl);
    acc->n++;
    acc->same_top += ap == aq;
}

static int parse_ids(const char *s, size_t n, uint32_t nv, uint32_t *ids, uint32_t cap, uint32_t *count) {
    uint32_t k = 0;
    for (size_t i = 0; i < n;) {
        if (isspace((unsigned char)s[i]) || s[i] == ',') {
            i++;
            continue;
        }
        if (!isdigit((unsigned char)s[i])) return -1;
        unsigned long long v = 0;
        while (i < n && isdigit((unsigned char)s[i]) && v < nv) v = v * 10 + (unsigned)(s[i++] - '0');
        if (v >= nv) return -1;
        if (k < cap) ids[k++] = (uint32_t)v;
    }
    *count = k;
    return 0;
}

/* Positions whose logits one prefill call returns: bounds the two logits
 * buffers (QEVAL_BATCH x vocabulary floats each) whatever the context. */
#define QEVAL_BATCH 256

static int divergence(const ds4_weights *r, const ds4_weights *t, const char *path, const ds4_backend_opts *bo,
                      ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    size_t got = text ? fread(text, 1, (size_t)len, f) : 0;
    fclose(f);
    uint32_t nv = r->cfg.n_vocab;
    ds4_backend *br = ds4_backend_create("cpu", r, bo, err);
    ds4_backend *bt = br ? ds4_backend_create("cpu", t, bo, err) : NULL;
    if (bt) {
        /* Two sessions, one per model. */
        ds4_startup_print_memory("ds4-qeval", "cpu", r, br->opts.ctx_size);
        ds4_startup_print_memory("ds4-qeval", "cpu", t, bt->opts.ctx_size);
    }
    uint32_t cap = br ? br->opts.ctx_size : 0;
    uint32_t *ids = malloc((size_t)cap * sizeof(uint32_t) + 1);
    float *lr = malloc((size_t)QEVAL_BATCH * nv * sizeof(float)),
          *lt = malloc((size_t)QEVAL_BATCH * nv * sizeof(float));
    int rc = bt && text && ids && lr && lt ? 0 : (bt ? ds4_err_set(err, DS4_ENOMEM, "out of memory") : -1);
    kl_acc acc = {0};
    size_t pos = 0, start, plen;
    while (rc == 0 && ds4_imatrix_dataset_next(text, got, &pos, &start, &plen)) {
        uint32_t n;
        if (parse_ids(text + start, plen, nv, ids, cap, &n) != 0) {
            rc = ds4_err_set(err, DS4_EFORMAT, "%s: a prompt is not a list of token ids below %u", path, nv);
            break;
        }
        if (n == 0) continue;
        ds4_backend_reset(br);
        ds4_backend_reset(bt);
        for (uint32_t done = 0; rc == 0 && done < n;) {
            uint32_t b = n - done < QEVAL_BATCH ? n - done : QEVAL_BATCH;
            if (ds4_backend_prefill(br, ids + done, b, lr, err) != 0 ||
                ds4_backend_prefill(bt, ids + done, b, lt, err) != 0) {
                rc = -1;
                break;
            }
            for (uint32_t i = 0; i < b; i++) add_position(lr + (size_t)i * nv, lt + (size_t)i * nv, nv, &acc);
            done += b;
        }
    }
    if (rc == 0 && acc.n == 0) rc = ds4_err_set(err, DS4_EINVAL, "%s: no prompts", path);
    if (rc == 0)
        printf("KL(ref || test) mean %.6f max %.6f over %llu positions; same top token %.2f%%\n", acc.sum / acc.n,
               acc.max, (unsigned long long)acc.n, 100.0 * acc.same_top / acc.n);
    ds4_backend_free(br);
    ds4_backend_free(bt);
    free(ids);
    free(lr);
    free(lt);
    free(text);
    return rc;
}

int main(int argc, char **argv) {
    const char *im, *ds, *ref, *test;
    ds4_backend_opts bo = {0};
    ds4_opt table[] = {
        {DS4_OPT_STR("--imatrix", "FILE", &im, NULL,
                     "importance-weighted error of the routed experts, with this legacy .dat imatrix"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--dataset", "FILE", &ds, NULL,
                     "KL divergence of the next-token distributions over these token-id prompts "
                     "(DS4_IMATRIX_PROMPT separators; each cut to --ctx tokens)"),
         .flags = DS4_OPT_IN},
        DS4_CLI_CTX(&bo.ctx_size),
        DS4_CLI_THREADS(&bo.n_threads),
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_STR("REF.gguf", NULL, &ref, NULL, "the reference model"), .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {DS4_OPT_STR("TEST.gguf", NULL, &test, NULL, "the same model quantized otherwise"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-qeval",
                   .usage = "REF.gguf TEST.gguf --imatrix FILE | --dataset FILE [options]",
                   .about = "How far a quantized GGUF is from a reference GGUF of the same model: the "
                            "importance-weighted\nerror of the routed experts (--imatrix), the divergence of "
                            "the outputs (--dataset), or both.\nRuns on the CPU backend.",
                   .opts = table,
                   .notes = DS4_CLI_ENV_NOTES,
                   .refused = ds4_option_not_supported};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (!im && !ds)
        return ds4_cli_usage(&cli, "nothing to measure: give --imatrix FILE (weighted error), --dataset FILE "
                                   "(output divergence), or both");
    int lrc = ds4_startup_lock("ds4-qeval");
    if (lrc) return lrc;
    ds4_err err = {0};
    ds4_weights *r = ds4_weights_open(ref, &err);
    ds4_weights *t = r ? ds4_weights_open(test, &err) : NULL;
    int rc = t ? 0 : -1;
    if (rc == 0 && memcmp(&r->cfg, &t->cfg, sizeof(r->cfg)) != 0)
        rc = ds4_err_set(&err, DS4_EINVAL, "the two files describe different models");
    if (rc == 0 && im) rc = weighted_error(r, t, im, &err);
    if (rc == 0 && ds) rc = divergence(r, t, ds, &bo, &err);
    if (rc != 0) fprintf(stderr, "ds4-qeval: %s\n", err.msg);
    ds4_weights_close(r);
    ds4_weights_close(t);
    return rc == 0 ? 0 : 1;
}
