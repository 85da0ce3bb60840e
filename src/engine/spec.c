/*
 * spec.c - MTP speculative decoding for one session (see spec.h).
 */
#include "engine/spec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int ds4_spec_init(ds4_spec *sp, ds4_engine *e, ds4_seq *main, uint32_t ctx, uint32_t draft, float margin,
                  ds4_err *err) {
    memset(sp, 0, sizeof(*sp));
    ds4_backend *b = e->b;
    sp->e = e;
    if (draft < 1 || draft > DS4_MTP_DRAFT_MAX)
        return ds4_err_set(err, DS4_ERANGE, "MTP draft of %u tokens: 1..%d", draft, DS4_MTP_DRAFT_MAX);
    sp->b = b;
    sp->main = main;
    sp->draft = draft;
    sp->margin = margin;
    if (!(sp->mseq = ds4_engine_mtp_seq_new(e, ctx, err))) return -1;
    ds4_spec_forget(sp, ds4_seq_len(b, main));
    return 0;
}

void ds4_spec_free(ds4_spec *sp) {
    ds4_engine_mtp_seq_free(sp->e, sp->mseq);
    memset(sp, 0, sizeof(*sp));
}

void ds4_spec_forget(ds4_spec *sp, uint32_t n) {
    ds4_engine_seq_op(sp->e, sp->mseq, DS4_SEQ_RESET, 0, NULL, NULL);
    sp->base = sp->hid_lo = n;
}

/* The oldest main position whose residual the main sequence still keeps. */
static uint32_t oldest_kept(const ds4_spec *sp, uint32_t n) {
    uint32_t lo = n > DS4_HIDDEN_KEEP ? n - DS4_HIDDEN_KEEP : 0;
    return lo > sp->hid_lo ? lo : sp->hid_lo;
}

int ds4_spec_begin(ds4_spec *sp, const int32_t *tokens, uint32_t n, int32_t tok, float *logits, ds4_err *err) {
    ds4_backend *b = sp->b;
    if (n == 0) return ds4_err_set(err, DS4_EINVAL, "MTP drafting needs a token before the one chosen");
    uint32_t first = sp->base + ds4_seq_len(b, sp->mseq), lo = oldest_kept(sp, n);
    if (first < lo || first > n - 1) { /* rows it lacks are gone (or it ran ahead): start over at lo */
        ds4_engine_seq_op(sp->e, sp->mseq, DS4_SEQ_RESET, 0, NULL, NULL);
        sp->base = first = lo < n - 1 ? lo : n - 1;
    }
    /* main positions first .. n - 1, each residual with the token after it */
    uint32_t chunk = b->opts.prefill_chunk;
    ds4_row rows[DS4_HIDDEN_KEEP + 1];
    for (uint32_t i = first; i < n;) {
        uint32_t m = 0;
        while (i + m < n && m < chunk && m < DS4_HIDDEN_KEEP + 1) {
            uint32_t p = i + m;
            rows[m] = ds4_mtp_row(sp->mseq, (uint32_t)(p + 1 < n ? tokens[p + 1] : tok),
                                  p + 1 == n ? DS4_ROW_LOGITS : 0, sp->main, p);
            m++;
        }
        ds4_step_out out = {logits, NULL};
        if (ds4_engine_step(sp->e, rows, m, &out, true, err) != 0) {
            ds4_spec_forget(sp, n);
            return ds4_err_prefix(err, "MTP catch-up");
        }
        i += m;
    }
    sp->mlen_begin = ds4_seq_len(b, sp->mseq);
    return ds4_engine_seq_op(sp->e, sp->mseq, DS4_SEQ_MARK, 0, NULL, err);
}

int ds4_spec_draft(ds4_spec *sp, int32_t d, float *logits, ds4_err *err) {
    uint32_t mlen = ds4_seq_len(sp->b, sp->mseq);
    ds4_row row = ds4_mtp_row(sp->mseq, (uint32_t)d, DS4_ROW_LOGITS | DS4_ROW_REWIND, sp->mseq, mlen - 1);
    ds4_step_out out = {logits, NULL};
    return ds4_engine_step(sp->e, &row, 1, &out, true, err);
}

int ds4_spec_verify(ds4_spec *sp, const int32_t *toks, uint32_t k, float *logits, ds4_err *err) {
    ds4_row rows[DS4_MTP_DRAFT_MAX + 1];
    if (k > DS4_MTP_DRAFT_MAX + 1) return ds4_err_set(err, DS4_ERANGE, "verification of %u rows", k);
    if (ds4_engine_seq_op(sp->e, sp->main, DS4_SEQ_MARK, 0, NULL, err) != 0) return -1;
    for (uint32_t i = 0; i < k; i++) rows[i] = ds4_row_of(sp->main, (uint32_t)toks[i], DS4_ROW_LOGITS | DS4_ROW_REWIND);
    ds4_step_out out = {logits, NULL};
    sp->stats.cycles++;
    sp->stats.drafted += k - 1;
    return ds4_engine_step(sp->e, rows, k, &out, false, err);
}

int ds4_spec_accept(ds4_spec *sp, uint32_t n0, uint32_t keep, ds4_err *err) {
    sp->stats.accepted += keep - 1;
    if (ds4_engine_seq_op(sp->e, sp->main, DS4_SEQ_REWIND, n0 + keep, NULL, err) != 0) return -1;
    return ds4_engine_seq_op(sp->e, sp->mseq, DS4_SEQ_REWIND, sp->mlen_begin, NULL, err);
}

bool ds4_spec_confident(const ds4_spec *sp, const float *logits, uint32_t n_vocab) {
    if (sp->margin <= 0.0f) return true;
    float a = -INFINITY, b2 = -INFINITY;
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (logits[i] > a) {
            b2 = a;
            a = logits[i];
        } else if (logits[i] > b2) {
            b2 = logits[i];
        }
    }
    return a - b2 >= sp->margin;
}

bool ds4_spec_accepts(ds4_sampler *smp, double *p, const double *q, int32_t d, int32_t *y) {
    if (q && q[d] > 0.0 && ds4_sampler_uniform(smp) * q[d] < p[d]) return true;
    if (q) {
        double left = 0.0;
        for (int i = 0; i < smp->n_vocab; i++) left += (p[i] = fmax(0.0, p[i] - q[i]));
        if (left <= 0.0) return *y = d, true; /* p == q: d was p's own draw */
    }
    *y = ds4_sample_dist(smp, p);
    return false;
}
