/*
 * generate.c - the generation loop (see generate.h).
 */
#include "engine/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/spec.h"

const char *ds4_finish_name(ds4_finish f) {
    switch (f) {
    case DS4_FINISH_NONE: return "none";
    case DS4_FINISH_EOS: return "stop";
    case DS4_FINISH_LENGTH: return "length";
    case DS4_FINISH_CALLBACK: return "callback";
    case DS4_FINISH_CANCELLED: return "cancelled";
    case DS4_FINISH_ERROR: return "error";
    }
    return "?";
}

static int32_t pick(ds4_sampler *smp, const float *logits, const ds4_gen_opts *o, int32_t eos, bool greedy,
                    float *scratch, int n_vocab) {
    const float *l = logits;
    if ((o->exclude_eos && eos >= 0) || o->restrict_fn) {
        memcpy(scratch, logits, (size_t)n_vocab * sizeof(float));
        if (o->exclude_eos && eos >= 0) scratch[eos] = -INFINITY;
        if (o->restrict_fn) o->restrict_fn(o->restrict_ctx, scratch, n_vocab);
        l = scratch;
    }
    return greedy || !smp ? ds4_argmax(l, n_vocab) : ds4_sample(smp, l);
}

/* Room in the session to append one token (and the one after it, as
 * session.h's check wants): a session at the end of its capacity asks the
 * caller's grow hook, where there is one. */
static bool room_for_token(ds4_session *s, const ds4_gen_opts *o) {
    uint32_t need = ds4_session_n_tokens(s) + 2;
    if (!o->grow_fn || need <= ds4_session_capacity(s)) return true;
    return o->grow_fn(o->grow_ctx, need) == 0 && need <= ds4_session_capacity(s);
}

/* ------------------------------------------------ with MTP drafts */

/* The speculative loop's buffers and state (see the comment of
 * spec_generate). */
typedef struct spec_loop {
    ds4_session *s;
    ds4_spec *sp;
    ds4_sampler *smp;
    const ds4_gen_opts *o;
    ds4_gen_token_fn fn;
    void *ctx;
    ds4_gen_result *res;
    int n_vocab;
    int32_t eos;
    bool greedy;  /* the callback asked for the argmax next */
    bool q_valid; /* qd holds this cycle's draft distributions */
    float *ql;    /* draft logits, one row a draft */
    float *vl;    /* verification logits, one row a verified token */
    double *qd;   /* sampling: the draft distributions, one row a draft */
    double *pd;   /* sampling: a target distribution */
} spec_loop;

/* Logits as the loop sees them: with EOS excluded when asked; a target's
 * (not a draft's) also without what the restrict hook refuses after the
 * tokens handed out so far. */
static float *usable(const spec_loop *L, float *row, bool target) {
    if (L->o->exclude_eos && L->eos >= 0) row[L->eos] = -INFINITY;
    if (target && L->o->restrict_fn) L->o->restrict_fn(L->o->restrict_ctx, row, L->n_vocab);
    return row;
}

static bool sampling(const spec_loop *L) { return !L->greedy && L->smp && L->smp->p.temperature > 0.0f; }

/* Hand one token to the caller, the session holding `held` tokens before
 * it; true when generation ends with it (the token is then not appended,
 * as in the plain loop).  *append: whether the caller wants it appended. */
static bool hand_out(spec_loop *L, int32_t tok, uint32_t held, bool *append) {
    ds4_gen_control ctl = {.append = true};
    ds4_gen_result *res = L->res;
    res->n_generated++;
    if (L->fn) L->fn(L->ctx, tok, &ctl);
    L->greedy = ctl.greedy_next;
    *append = ctl.append;
    if (tok == L->eos && !L->o->exclude_eos) res->finish = DS4_FINISH_EOS;
    else if (ctl.stop) res->finish = DS4_FINISH_CALLBACK;
    else if (L->o->max_tokens && res->n_generated >= L->o->max_tokens) res->finish = DS4_FINISH_LENGTH;
    else if (held + 1 >= ds4_session_ctx(L->s)) res->finish = DS4_FINISH_LENGTH;
    return res->finish != DS4_FINISH_NONE;
}

/* The drafts after tok (at most max): each the argmax of the MTP block's
 * logits, or a draw from its distribution when sampling, while the block is
 * confident.  Returns how many. */
static int draft_tokens(spec_loop *L, int32_t tok, uint32_t max, int32_t *d, uint32_t *k, ds4_err *err) {
    ds4_session *s = L->s;
    *k = 0;
    if (ds4_spec_begin(L->sp, ds4_session_tokens(s), ds4_session_n_tokens(s), tok, L->ql, err) != 0) return -1;
    L->q_valid = sampling(L);
    for (uint32_t j = 0; j < max; j++) {
        float *q = usable(L, L->ql + (size_t)j * L->n_vocab, false);
        if (!ds4_spec_confident(L->sp, q, (uint32_t)L->n_vocab)) break;
        if (L->q_valid) {
            ds4_sampler_dist(L->smp, q, L->qd + (size_t)j * L->n_vocab);
            d[j] = ds4_sample_dist(L->smp, L->qd + (size_t)j * L->n_vocab);
        } else {
            d[j] = ds4_argmax(q, L->n_vocab);
        }
        *k = j + 1;
        if (j + 1 < max && ds4_spec_draft(L->sp, d[j], L->ql + (size_t)(j + 1) * L->n_vocab, err) != 0) return -1;
    }
    return 0;
}

/* Whether the target accepts draft d at the position whose logits are v
 * (draft distribution q when the draft was sampled); on a rejection *y is
 * the token the target puts there instead. */
static bool accept_draft(spec_loop *L, float *v, int32_t d, const double *q, int32_t *y) {
    v = usable(L, v, true);
    if (!sampling(L)) {
        *y = ds4_argmax(v, L->n_vocab);
        return *y == d;
    }
    ds4_sampler_dist(L->smp, v, L->pd);
    return ds4_spec_accepts(L->smp, L->pd, q, d, y);
}

/* The loop of ds4_generate with MTP drafts.  Each turn hands out the
 * target's token tok (chosen as the plain loop chooses it, or the token a
 * rejection put in place of a draft), asks the MTP block for drafts after
 * it, verifies tok and the drafts in one step of the main model, and hands
 * out the drafts the target accepts, in order; the session then keeps tok
 * and the accepted drafts (the rest is rewound exactly).  The tokens handed
 * out, and the session's state after each, are those of the plain loop
 * (greedy: the same tokens; sampling: the same distribution). */
static int spec_generate(spec_loop *L, ds4_err *err) {
    ds4_session *s = L->s;
    const ds4_gen_opts *o = L->o;
    ds4_gen_result *res = L->res;
    int32_t next = -1, d[DS4_MTP_DRAFT_MAX + 1];
    for (;;) {
        if (o->cancel && *o->cancel) {
            res->finish = DS4_FINISH_CANCELLED;
            return 0;
        }
        const float *logits = ds4_session_logits(s);
        if (!logits && next < 0) {
            res->finish = DS4_FINISH_ERROR;
            return ds4_err_set(err, DS4_EINVAL, "generation needs a prompt of at least one token");
        }
        int32_t tok = next;
        if (tok < 0) {
            memcpy(L->vl, logits, (size_t)L->n_vocab * sizeof(float));
            const float *l = usable(L, L->vl, true);
            tok = sampling(L) ? ds4_sample(L->smp, l) : ds4_argmax(l, L->n_vocab);
        }
        next = -1;
        bool append;
        uint32_t n = ds4_session_n_tokens(s), ctx = ds4_session_ctx(s), max = L->sp->draft;
        if (hand_out(L, tok, n, &append)) return 0;
        if (!append) continue;
        if (!room_for_token(s, o)) {
            res->finish = DS4_FINISH_LENGTH;
            return 0;
        }

        /* room for tok and the drafts (within the session's capacity when
         * the caller admits its growth), and no more drafts than tokens
         * left */
        if (o->grow_fn) ctx = ds4_session_capacity(s);
        if (ctx < n + 2 + max) max = ctx > n + 2 ? ctx - n - 2 : 0;
        if (o->max_tokens && o->max_tokens - res->n_generated < max) max = o->max_tokens - res->n_generated;
        uint32_t k = 0;
        if (max && draft_tokens(L, tok, max, d + 1, &k, err) != 0) goto failed;
        if (k == 0) { /* nothing worth verifying: a plain step */
            if (ds4_session_eval(s, tok, err) != 0) goto failed;
            continue;
        }
        d[0] = tok;
        if (ds4_session_spec_verify(s, d, k + 1, L->vl, err) != 0) goto failed;
        uint32_t keep = 1;
        for (uint32_t j = 0; j < k; j++) {
            const double *q = L->q_valid ? L->qd + (size_t)j * L->n_vocab : NULL;
            if (!accept_draft(L, L->vl + (size_t)j * L->n_vocab, d[j + 1], q, &next)) break;
            next = -1;
            if (hand_out(L, d[j + 1], n + keep, &append) || !append) break;
            keep++;
        }
        if (ds4_session_spec_accept(s, keep, err) != 0) goto failed;
        if (res->finish) return 0;
    }
failed:
    res->finish = DS4_FINISH_ERROR;
    return -1;
}

int ds4_generate(ds4_session *s, ds4_sampler *smp, const ds4_gen_opts *opts, ds4_gen_token_fn fn, void *ctx,
                 ds4_gen_result *res, ds4_err *err) {
    memset(res, 0, sizeof(*res));
    ds4_engine *e = ds4_session_engine(s);
    int n_vocab = (int)e->w->cfg.n_vocab;
    if (smp && smp->n_vocab != n_vocab) {
        res->finish = DS4_FINISH_ERROR;
        return ds4_err_set(err, DS4_EINVAL, "sampler made for %d tokens, the model has %d", smp->n_vocab, n_vocab);
    }
    ds4_spec *sp = ds4_session_spec(s);
    if (sp && opts->n_forced == 0) { /* (the forced tokens of the server's test hook take the plain loop) */
        size_t V = (size_t)n_vocab, D = sp->draft;
        spec_loop L = {s,
                       sp,
                       smp,
                       opts,
                       fn,
                       ctx,
                       res,
                       n_vocab,
                       e->eos,
                       false,
                       false,
                       malloc(D * V * sizeof(float)),
                       malloc((D + 1) * V * sizeof(float)),
                       NULL,
                       NULL};
        bool sampled = smp && smp->p.temperature > 0.0f;
        if (sampled) {
            L.qd = malloc(D * V * sizeof(double));
            L.pd = malloc(V * sizeof(double));
        }
        int rc = -1;
        if (!L.ql || !L.vl || (sampled && (!L.qd || !L.pd))) {
            res->finish = DS4_FINISH_ERROR;
            ds4_err_set(err, DS4_ENOMEM, "out of memory for %zu drafts", D);
        } else {
            double t0 = ds4_now();
            rc = spec_generate(&L, err);
            res->seconds = ds4_now() - t0;
        }
        free(L.ql);
        free(L.vl);
        free(L.qd);
        free(L.pd);
        return rc;
    }
    bool copy = opts->exclude_eos || opts->restrict_fn;
    float *scratch = copy ? malloc((size_t)n_vocab * sizeof(float)) : NULL;
    if (copy && !scratch) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    double t0 = ds4_now();
    bool greedy = false, forcing = opts->n_forced > 0;
    int rc = 0;

    for (;;) {
        if (opts->cancel && *opts->cancel) {
            res->finish = DS4_FINISH_CANCELLED;
            break;
        }
        const float *logits = ds4_session_logits(s);
        if (!logits) {
            rc = ds4_err_set(err, DS4_EINVAL, "generation needs a prompt of at least one token");
            res->finish = DS4_FINISH_ERROR;
            break;
        }
        if (ds4_any_nan(logits, n_vocab)) res->nan_steps++;
        forcing = forcing && res->n_generated < opts->n_forced;
        int32_t tok;
        if (forcing && opts->restrict_fn) {
            /* A forced token the constraint refuses ends the forcing. */
            memcpy(scratch, logits, (size_t)n_vocab * sizeof(float));
            opts->restrict_fn(opts->restrict_ctx, scratch, n_vocab);
            int32_t f = opts->forced[res->n_generated];
            forcing = f >= 0 && f < n_vocab && scratch[f] != -INFINITY;
            tok = forcing ? f : greedy || !smp ? ds4_argmax(scratch, n_vocab) : ds4_sample(smp, scratch);
        } else {
            tok = forcing ? opts->forced[res->n_generated] : pick(smp, logits, opts, e->eos, greedy, scratch, n_vocab);
        }
        ds4_gen_control ctl = {.append = true};
        res->n_generated++;
        if (fn) fn(ctx, tok, &ctl);
        greedy = ctl.greedy_next;
        if (tok == e->eos && !opts->exclude_eos) {
            res->finish = DS4_FINISH_EOS;
            break;
        }
        if (ctl.stop) {
            res->finish = DS4_FINISH_CALLBACK;
            break;
        }
        if (opts->max_tokens && res->n_generated >= opts->max_tokens) {
            res->finish = DS4_FINISH_LENGTH;
            break;
        }
        if (ds4_session_n_tokens(s) + 1 >= ds4_session_ctx(s) || (ctl.append && !room_for_token(s, opts))) {
            res->finish = DS4_FINISH_LENGTH;
            break;
        }
        if (ctl.append && ds4_session_eval(s, tok, err) != 0) {
            res->finish = DS4_FINISH_ERROR;
            rc = -1;
            break;
        }
    }
    res->seconds = ds4_now() - t0;
    free(scratch);
    return rc;
}
