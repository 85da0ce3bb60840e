/*
 * generate.c - the generation loop (see generate.h).
 */
#include "engine/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

int ds4_generate(ds4_session *s, ds4_sampler *smp, const ds4_gen_opts *opts, ds4_gen_token_fn fn, void *ctx,
                 ds4_gen_result *res, ds4_err *err) {
    memset(res, 0, sizeof(*res));
    ds4_engine *e = ds4_session_engine(s);
    int n_vocab = (int)e->w->cfg.n_vocab;
    if (smp && smp->n_vocab != n_vocab) {
        res->finish = DS4_FINISH_ERROR;
        return ds4_err_set(err, DS4_EINVAL, "sampler made for %d tokens, the model has %d", smp->n_vocab, n_vocab);
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
        if (ds4_session_n_tokens(s) + 1 >= ds4_session_ctx(s)) {
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
