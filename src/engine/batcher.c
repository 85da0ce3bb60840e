/*
 * batcher.c - continuous batching through one stepper thread (see
 * batcher.h).
 */
#include "engine/batcher.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "engine/pace.h"

/* A request: rows for a step (fn NULL), or a call to run alone. */
typedef struct req {
    const ds4_row *rows;
    uint32_t n, done; /* rows, rows run so far (a prefill may take several steps) */
    const ds4_step_out *out;
    bool mtp;
    int (*fn)(void *ctx, ds4_err *err);
    void *ctx;
    int rc;
    ds4_err err;
    bool finished;
    struct req *next;
} req;

struct ds4_batcher {
    ds4_backend *b;
    uint32_t budget;
    pthread_t thread;
    bool started, stop;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    req *head;
    /* the sequences whose rows the last step finished: the stepper waits a
     * little for them to come back before the next step */
    ds4_seq **back;
    uint32_t n_back;
    double last_step; /* seconds the last step took */
    ds4_pacer pace;   /* the prefill piece beside decoding rows */
    ds4_batcher_stats st;
    /* the step being assembled */
    req **pack;
    ds4_row *rows;
    float **lrow, **hrow; /* where each row's logits / hidden state go */
};

static void enqueue(ds4_batcher *bt, req *r) {
    req **p = &bt->head;
    while (*p) p = &(*p)->next;
    *p = r;
    pthread_cond_signal(&bt->work);
}

static void unlink_req(ds4_batcher *bt, req *r) {
    for (req **p = &bt->head; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            return;
        }
}

static void finish(ds4_batcher *bt, req *r, int rc) {
    r->rc = rc;
    r->finished = true;
    pthread_cond_broadcast(&bt->done);
}

/* Whether every sequence of the last step has come back with rows. */
static bool all_back(const ds4_batcher *bt) {
    for (uint32_t i = 0; i < bt->n_back; i++) {
        bool found = false;
        for (const req *r = bt->head; r && !found; r = r->next) found = !r->fn && r->rows[0].seq == bt->back[i];
        if (!found) return false;
    }
    return true;
}

/* How long to wait for them: a tenth of a step, 100 us to 2 ms. */
static double gather_window(const ds4_batcher *bt) {
    double w = 0.1 * bt->last_step;
    return w < 1e-4 ? 1e-4 : w > 2e-3 ? 2e-3 : w;
}

static void wait_until(ds4_batcher *bt, double deadline) {
    ds4_cond_wait_for(&bt->work, &bt->mu, deadline - ds4_now());
}

/* Rows of request r before row i that ask for logits / hidden states (where
 * row i's go in r's outputs). */
static uint32_t count_want(const req *r, uint32_t i, uint32_t want) {
    uint32_t k = 0;
    for (uint32_t j = 0; j < i; j++) k += (r->rows[j].want & want) != 0;
    return k;
}

int ds4_run_rows(ds4_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp, ds4_err *err) {
    bool plain = !mtp, none = true, all = out && out->logits;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t want = rows[i].want;
        plain = plain && rows[i].seq == rows[0].seq && !(want & (DS4_ROW_HIDDEN | DS4_ROW_REWIND));
        none = none && !(want & DS4_ROW_LOGITS);
        all = all && (want & DS4_ROW_LOGITS);
    }
    if (plain && n == 1 && none) return ds4_seq_decode(b, rows[0].seq, rows[0].token, err);
    if (plain && (none || all)) {
        uint32_t tok[n];
        for (uint32_t i = 0; i < n; i++) tok[i] = rows[i].token;
        return ds4_seq_prefill(b, rows[0].seq, tok, n, all ? out->logits : NULL, err);
    }
    return mtp ? ds4_backend_mtp_step(b, rows, n, out, err) : ds4_backend_step(b, rows, n, out, err);
}

/* One backend pass over the packed rows (a lone request's through
 * ds4_run_rows). */
static int run_step(ds4_batcher *bt, uint32_t n_req, uint32_t n_rows, bool mtp, ds4_err *err) {
    ds4_backend *b = bt->b;
    size_t V = b->w->cfg.n_vocab, H = (size_t)b->w->cfg.n_hc * b->w->cfg.n_embd;
    if (n_req == 1) {
        const req *r = bt->pack[0];
        ds4_step_out out = {NULL, NULL};
        if (r->out && r->out->logits) out.logits = r->out->logits + count_want(r, r->done, DS4_ROW_LOGITS) * V;
        if (r->out && r->out->hidden) out.hidden = r->out->hidden + count_want(r, r->done, DS4_ROW_HIDDEN) * H;
        return ds4_run_rows(b, r->rows + r->done, n_rows, r->out ? &out : NULL, mtp, err);
    }
    /* a general step: its rows in order, each output where its request wants it */
    uint32_t k = 0, nl = 0, nh = 0;
    for (uint32_t q = 0; q < n_req; q++) {
        const req *r = bt->pack[q];
        uint32_t m = r->n - r->done < n_rows - k ? r->n - r->done : n_rows - k;
        uint32_t li = count_want(r, r->done, DS4_ROW_LOGITS), hi = count_want(r, r->done, DS4_ROW_HIDDEN);
        for (uint32_t i = 0; i < m; i++, k++) {
            bt->rows[k] = r->rows[r->done + i];
            bool wl = (bt->rows[k].want & DS4_ROW_LOGITS) && r->out && r->out->logits;
            bool wh = (bt->rows[k].want & DS4_ROW_HIDDEN) && r->out && r->out->hidden;
            bt->lrow[k] = wl ? r->out->logits + li++ * V : NULL;
            bt->hrow[k] = wh ? r->out->hidden + hi++ * H : NULL;
            if (!wl) bt->rows[k].want &= ~(uint32_t)DS4_ROW_LOGITS;
            if (!wh) bt->rows[k].want &= ~(uint32_t)DS4_ROW_HIDDEN;
            nl += wl;
            nh += wh;
        }
    }
    /* the backend writes the asked rows consecutively: into scratch, then
     * to each request */
    float *lg = nl ? malloc(nl * V * sizeof(float)) : NULL, *hd = nh ? malloc(nh * H * sizeof(float)) : NULL;
    if ((nl && !lg) || (nh && !hd)) {
        free(lg);
        free(hd);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory for a step's outputs");
    }
    ds4_step_out out = {lg, hd};
    int rc = mtp ? ds4_backend_mtp_step(b, bt->rows, n_rows, &out, err)
                 : ds4_backend_step(b, bt->rows, n_rows, &out, err);
    for (uint32_t i = 0, a = 0, c = 0; rc == 0 && i < n_rows; i++) {
        if (bt->lrow[i]) memcpy(bt->lrow[i], lg + a++ * V, V * sizeof(float));
        if (bt->hrow[i]) memcpy(bt->hrow[i], hd + c++ * H, H * sizeof(float));
    }
    free(lg);
    free(hd);
    return rc;
}

/* Pack the pending step requests of the first one's kind (main or MTP) up
 * to the budget, the short ones first (batcher.h), each group in queue
 * order, the long ones beside short ones in the pacer's piece (pace.h);
 * returns the rows, *n_req the requests, *n_short the short rows. */
static uint32_t pack(ds4_batcher *bt, uint32_t *n_req, uint32_t *n_short, bool *mtp) {
    uint32_t rows = 0, q = 0, cap = bt->budget;
    int kind = -1;
    for (const req *r = bt->head; r && kind < 0; r = r->next)
        if (!r->fn) kind = r->mtp;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            *n_short = rows;
            cap = rows + ds4_pace_piece(&bt->pace, rows, bt->budget - rows);
        }
        for (req *r = bt->head; r && rows < cap; r = r->next) {
            uint32_t m = r->n - r->done;
            if (r->fn || (int)r->mtp != kind || (pass == 0) != (m <= DS4_BATCH_SHORT_ROWS)) continue;
            if (m > cap - rows) m = cap - rows;
            bt->pack[q++] = r;
            rows += m;
        }
    }
    *n_req = q;
    *mtp = kind == 1;
    return rows;
}

static void *stepper(void *arg) {
    ds4_batcher *bt = arg;
    pthread_mutex_lock(&bt->mu);
    for (;;) {
        while (!bt->stop && !bt->head) pthread_cond_wait(&bt->work, &bt->mu);
        if (!bt->head) break;
        if (bt->head->fn) { /* a call, alone */
            req *r = bt->head;
            bt->head = r->next;
            pthread_mutex_unlock(&bt->mu);
            int rc = r->fn(r->ctx, &r->err);
            pthread_mutex_lock(&bt->mu);
            bt->st.calls++;
            finish(bt, r, rc);
            continue;
        }
        double deadline = ds4_now() + gather_window(bt);
        while (!bt->stop && !all_back(bt) && ds4_now() < deadline) wait_until(bt, deadline);
        uint32_t n_req, n_short;
        bool mtp;
        uint32_t n_rows = pack(bt, &n_req, &n_short, &mtp);
        pthread_mutex_unlock(&bt->mu);
        ds4_err err = {0};
        double t0 = ds4_now();
        int rc = run_step(bt, n_req, n_rows, mtp, &err);
        double t1 = ds4_now();
        pthread_mutex_lock(&bt->mu);
        bt->last_step = t1 - t0;
        if (rc == 0) ds4_pace_note(&bt->pace, n_short, n_rows - n_short, t1 - t0);
        bt->st.steps++;
        bt->st.rows += n_rows;
        if (n_rows > bt->st.max_rows) bt->st.max_rows = n_rows;
        bt->st.seqs += n_req;
        if (n_req > bt->st.max_seqs) bt->st.max_seqs = n_req;
        bt->n_back = 0;
        uint32_t left = n_rows;
        for (uint32_t q = 0; q < n_req; q++) {
            req *r = bt->pack[q];
            uint32_t m = r->n - r->done < left ? r->n - r->done : left;
            r->done += m;
            left -= m;
            if (rc != 0) r->err = err;
            if (rc != 0 || r->done == r->n) {
                unlink_req(bt, r);
                bt->back[bt->n_back++] = r->rows[0].seq;
                finish(bt, r, rc);
            }
        }
    }
    pthread_mutex_unlock(&bt->mu);
    return NULL;
}

static int wait_for(ds4_batcher *bt, req *r, ds4_err *err) {
    pthread_mutex_lock(&bt->mu);
    if (bt->stop) {
        pthread_mutex_unlock(&bt->mu);
        return ds4_err_set(err, DS4_EINVAL, "the engine is shutting down");
    }
    enqueue(bt, r);
    while (!r->finished) pthread_cond_wait(&bt->done, &bt->mu);
    pthread_mutex_unlock(&bt->mu);
    if (r->rc != 0 && err) *err = r->err;
    return r->rc;
}

int ds4_batcher_step(ds4_batcher *bt, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp,
                     ds4_err *err) {
    if (n == 0) return 0;
    for (uint32_t i = 1; i < n; i++)
        if (rows[i].seq != rows[0].seq)
            return ds4_err_set(err, DS4_EINVAL, "a batched request holds rows of one sequence");
    req r = {.rows = rows, .n = n, .out = out, .mtp = mtp};
    return wait_for(bt, &r, err);
}

int ds4_batcher_call(ds4_batcher *bt, int (*fn)(void *ctx, ds4_err *err), void *ctx, ds4_err *err) {
    req r = {.fn = fn, .ctx = ctx};
    return wait_for(bt, &r, err);
}

ds4_batcher_stats ds4_batcher_get_stats(ds4_batcher *bt) {
    pthread_mutex_lock(&bt->mu);
    ds4_batcher_stats s = bt->st;
    s.short_s = bt->pace.short_s;
    s.piece = bt->pace.piece < bt->budget ? bt->pace.piece : bt->budget;
    pthread_mutex_unlock(&bt->mu);
    return s;
}

ds4_batcher *ds4_batcher_new(ds4_backend *b, uint32_t budget, double stretch, ds4_err *err) {
    if (budget == 0 || budget > b->opts.prefill_chunk) budget = b->opts.prefill_chunk;
    ds4_batcher *bt = calloc(1, sizeof(*bt));
    if (!bt) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    bt->b = b;
    bt->budget = budget;
    bt->pace.stretch = stretch;
    pthread_mutex_init(&bt->mu, NULL);
    pthread_cond_init(&bt->work, NULL);
    pthread_cond_init(&bt->done, NULL);
    bt->pack = calloc(budget, sizeof(*bt->pack));
    bt->back = calloc(budget, sizeof(*bt->back));
    bt->rows = calloc(budget, sizeof(*bt->rows));
    bt->lrow = calloc(budget, sizeof(*bt->lrow));
    bt->hrow = calloc(budget, sizeof(*bt->hrow));
    if (!bt->pack || !bt->back || !bt->rows || !bt->lrow || !bt->hrow) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        ds4_batcher_free(bt);
        return NULL;
    }
    int e = pthread_create(&bt->thread, NULL, stepper, bt);
    if (e != 0) {
        ds4_err_set(err, DS4_EIO, "cannot start the batching thread: %s", strerror(e));
        ds4_batcher_free(bt);
        return NULL;
    }
    bt->started = true;
    return bt;
}

void ds4_batcher_free(ds4_batcher *bt) {
    if (!bt) return;
    if (bt->started) {
        pthread_mutex_lock(&bt->mu);
        bt->stop = true;
        pthread_cond_broadcast(&bt->work);
        pthread_mutex_unlock(&bt->mu);
        pthread_join(bt->thread, NULL);
    }
    pthread_mutex_destroy(&bt->mu);
    pthread_cond_destroy(&bt->work);
    pthread_cond_destroy(&bt->done);
    free(bt->pack);
    free(bt->back);
    free(bt->rows);
    free(bt->lrow);
    free(bt->hrow);
    free(bt);
}
