/*
 * session.c - token list + backend + reuse policy (see session.h).
 */
#include "engine/session.h"

#include <stdlib.h>
#include <string.h>

#include "engine/spec.h"
#include "model/backends.h"
#include "model/steering.h"

struct ds4_session {
    ds4_engine *e;
    ds4_backend *b;   /* the engine's */
    ds4_seq *seq;     /* this session's sequence in it; NULL while a sized session holds none */
    uint32_t ctx;     /* the most tokens it may hold */
    uint32_t cap;     /* what its sequence holds now (ctx unless sized; 0: no sequence) */
    uint32_t granule; /* a sized session's step (its capacity a multiple of it, or ctx); 0: not sized */
    uint32_t chunk;
    int32_t *tokens; /* cap entries, n live */
    uint32_t n;
    float steer_ffn, steer_attn; /* its steering scales (its sequence's) */
    ds4_kv_state *checkpoint;    /* NULL or a snapshot */
    ds4_session_stats stats;
    ds4_spec *spec;     /* MTP speculative decoding, or NULL */
    uint32_t spec_n0;   /* the length before the verification in flight */
    uint32_t mtp_draft; /* the MTP drafts asked for (0: none); a sized session remakes its spec with its sequence */
    float mtp_margin;
};

static void spec_drop(ds4_session *s) {
    if (s->spec) ds4_spec_free(s->spec);
    free(s->spec);
    s->spec = NULL;
}

/* The MTP sequence of a session whose sequence holds cap tokens: those
 * tokens, and the drafts of a cycle beyond them. */
static uint32_t spec_ctx(const ds4_session *s, uint32_t cap) {
    return s->granule && cap + DS4_REWIND_MAX < s->ctx ? cap + DS4_REWIND_MAX : s->ctx;
}

static int spec_make(ds4_session *s, ds4_err *err) {
    ds4_spec *sp = calloc(1, sizeof(*sp));
    if (!sp) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (ds4_spec_init(sp, s->e, s->seq, spec_ctx(s, s->cap), s->mtp_draft, s->mtp_margin, err) != 0) {
        free(sp);
        return -1;
    }
    s->spec = sp;
    return 0;
}

/* The session's sequence of cap tokens (none before), with its steering
 * scales and its MTP drafting. */
static int seq_make(ds4_session *s, uint32_t cap, ds4_err *err) {
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof(int32_t));
    if (!t) return ds4_err_set(err, DS4_ENOMEM, "out of memory for %u tokens", cap);
    s->tokens = t;
    if (!(s->seq = ds4_engine_seq_new_sized(s->e, s->ctx, cap, err))) return -1;
    s->b = s->e->b;
    s->chunk = s->b->opts.prefill_chunk;
    s->cap = cap;
    ds4_seq_set_steering(s->seq, s->steer_ffn, s->steer_attn);
    return s->mtp_draft ? spec_make(s, err) : 0;
}

uint32_t ds4_sized_capacity(const ds4_engine *e, uint32_t ctx, uint32_t granule, uint64_t n) {
    uint64_t g = granule, w = e->w->cfg.sliding_window, m = n > w ? n : w, c = (m + g - 1) / g * g;
    return c < ctx ? (uint32_t)c : ctx;
}

static uint32_t sized_cap(const ds4_session *s, uint64_t n) { return ds4_sized_capacity(s->e, s->ctx, s->granule, n); }

static ds4_session *session_new(ds4_engine *e, uint32_t ctx, uint32_t granule, ds4_err *err) {
    ds4_session *s = calloc(1, sizeof(*s));
    if (!s) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    s->e = e;
    s->ctx = ctx;
    s->granule = granule;
    s->steer_ffn = e->opts.steer_ffn;
    s->steer_attn = e->opts.steer_attn;
    if (!granule && seq_make(s, ctx, err) != 0) {
        ds4_session_free(s);
        return NULL;
    }
    return s;
}

ds4_session *ds4_session_new(ds4_engine *e, uint32_t ctx, ds4_err *err) { return session_new(e, ctx, 0, err); }

ds4_session *ds4_session_new_sized(ds4_engine *e, uint32_t ctx, uint32_t granule, ds4_err *err) {
    if (granule == 0) {
        ds4_err_set(err, DS4_EINVAL, "a sized session needs a granule of 1 token or more");
        return NULL;
    }
    return session_new(e, ctx, granule, err);
}

void ds4_session_free(ds4_session *s) {
    if (!s) return;
    spec_drop(s);
    ds4_engine_seq_free(s->e, s->seq);
    ds4_kv_state_free(s->checkpoint);
    free(s->tokens);
    free(s);
}

ds4_engine *ds4_session_engine(const ds4_session *s) { return s->e; }
uint32_t ds4_session_ctx(const ds4_session *s) { return s->ctx; }
uint32_t ds4_session_capacity(const ds4_session *s) { return s->cap; }
uint32_t ds4_session_n_tokens(const ds4_session *s) { return s->n; }
const int32_t *ds4_session_tokens(const ds4_session *s) { return s->tokens; }
const ds4_session_stats *ds4_session_get_stats(const ds4_session *s) { return &s->stats; }
const char *ds4_session_backend_name(const ds4_session *s) { return s->e->b->ops->name; }

const float *ds4_session_logits(ds4_session *s) { return s->n ? ds4_seq_logits(s->b, s->seq) : NULL; }

void ds4_session_reset(ds4_session *s) {
    if (s->seq) ds4_engine_seq_op(s->e, s->seq, DS4_SEQ_RESET, 0, NULL, NULL);
    s->n = 0;
    if (s->spec) ds4_spec_forget(s->spec, 0);
    s->stats.total_resets++;
}

int ds4_session_fit(ds4_session *s, uint32_t n, ds4_err *err) {
    if (!s->granule) {
        if (n > s->ctx) return ds4_err_set(err, DS4_ERANGE, "%u tokens do not fit the context of %u tokens", n, s->ctx);
        return 0;
    }
    if (n < s->n + 1) n = s->n + 1;
    if (n > s->ctx) return ds4_err_set(err, DS4_ERANGE, "%u tokens do not fit the context of %u tokens", n, s->ctx);
    uint32_t cap = sized_cap(s, n);
    if (cap == s->cap) return 0;
    if (!s->seq) return seq_make(s, cap, err);
    if (ds4_engine_seq_resize(s->e, s->seq, cap, err) != 0) return -1;
    if (s->spec && ds4_engine_seq_resize(s->e, s->spec->mseq, spec_ctx(s, cap), err) != 0) return -1;
    int32_t *t = realloc(s->tokens, (size_t)cap * sizeof(int32_t));
    if (t) s->tokens = t;
    else if (cap > s->cap) return ds4_err_set(err, DS4_ENOMEM, "out of memory for %u tokens", cap);
    s->cap = cap;
    return 0;
}

int ds4_session_reserve(ds4_session *s, uint32_t n, ds4_err *err) {
    return n <= s->cap ? 0 : ds4_session_fit(s, n, err);
}

void ds4_session_release(ds4_session *s) {
    ds4_session_drop_checkpoint(s);
    if (!s->granule) {
        ds4_session_reset(s);
        return;
    }
    spec_drop(s);
    ds4_engine_seq_free(s->e, s->seq);
    s->seq = NULL;
    s->n = s->cap = 0;
    s->stats.total_resets++;
}

/* Append n tokens in one step through the engine (all_logits: the logits
 * after each). */
static int session_rows(ds4_session *s, const int32_t *tokens, uint32_t n, float *all_logits, ds4_err *err) {
    ds4_row rows[n];
    for (uint32_t i = 0; i < n; i++) rows[i] = ds4_row_of(s->seq, (uint32_t)tokens[i], all_logits ? DS4_ROW_LOGITS : 0);
    ds4_step_out out = {all_logits, NULL};
    return ds4_engine_step(s->e, rows, n, all_logits ? &out : NULL, false, err);
}

/* Room for `more` tokens (and the one after them): a sized session grows. */
static int check_room(ds4_session *s, uint64_t more, ds4_err *err) {
    if ((uint64_t)s->n + more >= s->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%llu tokens do not fit the context of %u tokens",
                           (unsigned long long)(s->n + more), s->ctx);
    return ds4_session_reserve(s, s->n + (uint32_t)more + 1, err);
}

int ds4_session_append(ds4_session *s, const int32_t *tokens, uint32_t n, ds4_progress_fn progress, void *pctx,
                       ds4_err *err) {
    return ds4_session_append_logits(s, tokens, n, NULL, progress, pctx, err);
}

int ds4_session_append_logits(ds4_session *s, const int32_t *tokens, uint32_t n, float *all_logits,
                              ds4_progress_fn progress, void *pctx, ds4_err *err) {
    if (n == 0) return 0;
    if (check_room(s, n, err) != 0) return -1;
    uint32_t done = 0;
    while (done < n) {
        /* Chunk boundaries at absolute multiples of the chunk size. */
        uint32_t pos = s->n;
        uint32_t step = s->chunk - pos % s->chunk;
        if (step > n - done) step = n - done;
        float *lg = all_logits ? all_logits + (size_t)done * s->e->w->cfg.n_vocab : NULL;
        if (session_rows(s, tokens + done, step, lg, err) != 0) {
            /* A failed backend step leaves its state undefined: start over. */
            ds4_session_reset(s);
            return -1;
        }
        memcpy(s->tokens + pos, tokens + done, step * sizeof(int32_t));
        s->n += step;
        done += step;
        s->stats.prefilled += step;
        s->stats.total_prefilled += step;
        if (progress && progress(pctx, done, n) != 0 && done < n)
            return ds4_err_set(err, DS4_EINTERRUPTED, "prefill interrupted after %u of %u tokens", done, n);
    }
    return 0;
}

int ds4_session_eval(ds4_session *s, int32_t token, ds4_err *err) {
    if (check_room(s, 1, err) != 0) return -1;
    if (session_rows(s, &token, 1, NULL, err) != 0) {
        ds4_session_reset(s);
        return -1;
    }
    s->tokens[s->n++] = token;
    s->stats.total_decoded++;
    return 0;
}

static uint32_t common_prefix(const int32_t *a, uint32_t na, const int32_t *b, uint32_t nb) {
    uint32_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* The checkpoint is usable when its tokens are a prefix of the target and
 * it gets further than the live state would. */
static bool checkpoint_helps(const ds4_session *s, const int32_t *tokens, uint32_t n, uint32_t live_keep) {
    const ds4_kv_state *c = s->checkpoint;
    if (!c || c->n_tokens == 0 || c->n_tokens > n || c->n_tokens <= live_keep) return false;
    for (uint32_t i = 0; i < c->n_tokens; i++)
        if ((int32_t)c->tokens[i] != tokens[i]) return false;
    return true;
}

int ds4_session_sync(ds4_session *s, const int32_t *tokens, uint32_t n, ds4_progress_fn progress, void *pctx,
                     ds4_err *err) {
    if (n >= s->ctx)
        return ds4_err_set(err, DS4_ERANGE, "prompt of %u tokens does not fit the context of %u tokens", n, s->ctx);
    s->stats.reused = s->stats.restored = s->stats.prefilled = 0;
    uint32_t keep = common_prefix(s->tokens, s->n, tokens, n);
    /* The live state can only be extended: it is usable when all of it is
     * a prefix of the target.  Equal token lists need no work, but a target
     * that is a strict prefix of the live tokens cannot be reached. */
    bool live_ok = keep == s->n;
    if (checkpoint_helps(s, tokens, n, live_ok ? keep : 0)) {
        if (ds4_session_restore(s, s->checkpoint, err) != 0) return -1;
        s->stats.restored = s->n;
    } else if (!live_ok || (keep == n && n < s->n)) {
        ds4_session_reset(s);
    } else {
        s->stats.reused = keep;
    }
    if (s->n == n && n > 0) return 0;
    return ds4_session_append(s, tokens + s->n, n - s->n, progress, pctx, err);
}

ds4_kv_state *ds4_session_state_new(const ds4_session *s, ds4_err *err) {
    return ds4_kv_state_new(&s->e->w->cfg, s->ctx, s->e->b->opts.prefill_chunk, err);
}

int ds4_session_snapshot(ds4_session *s, ds4_kv_state *out, ds4_err *err) {
    if (!s->seq) { /* a sized session that holds nothing: the empty state */
        ds4_kv_state_reset(out);
        return 0;
    }
    return ds4_engine_seq_op(s->e, s->seq, DS4_SEQ_SNAPSHOT, 0, out, err);
}

int ds4_session_restore(ds4_session *s, const ds4_kv_state *in, ds4_err *err) {
    if (in->n_tokens >= s->ctx)
        return ds4_err_set(err, DS4_ERANGE, "state of %u tokens does not fit the context of %u tokens", in->n_tokens,
                           s->ctx);
    if (in->n_tokens + 1 > s->cap) {
        ds4_session_reset(s); /* its state is replaced: nothing to carry into the larger sequence */
        if (ds4_session_reserve(s, in->n_tokens + 1, err) != 0) return -1;
    }
    if (ds4_engine_seq_op(s->e, s->seq, DS4_SEQ_RESTORE, 0, (ds4_kv_state *)in, err) != 0) {
        ds4_session_reset(s);
        return -1;
    }
    for (uint32_t i = 0; i < in->n_tokens; i++) s->tokens[i] = (int32_t)in->tokens[i];
    s->n = in->n_tokens;
    if (s->spec) ds4_spec_forget(s->spec, s->n); /* a snapshot has no residuals */
    return 0;
}

int ds4_session_checkpoint(ds4_session *s, ds4_err *err) {
    /* a state of the session's capacity (a sized session's grows with it) */
    if (s->checkpoint && s->checkpoint->ctx != s->cap) ds4_session_drop_checkpoint(s);
    if (!s->checkpoint &&
        !(s->checkpoint = ds4_kv_state_new(&s->e->w->cfg, s->cap ? s->cap : 1, s->e->b->opts.prefill_chunk, err)))
        return -1;
    if (ds4_session_snapshot(s, s->checkpoint, err) != 0) {
        ds4_session_drop_checkpoint(s);
        return -1;
    }
    return 0;
}

uint32_t ds4_session_checkpoint_tokens(const ds4_session *s) { return s->checkpoint ? s->checkpoint->n_tokens : 0; }

int ds4_session_set_steering(ds4_session *s, float ffn, float attn, ds4_err *err) {
    if (ds4_steer_scale_check(ffn, "FFN steering scale", err) ||
        ds4_steer_scale_check(attn, "attention steering scale", err) || ds4_engine_steering_check(s->e, ffn, attn, err))
        return -1;
    if (ffn == s->steer_ffn && attn == s->steer_attn) return 0;
    ds4_session_reset(s);
    ds4_session_drop_checkpoint(s);
    s->steer_ffn = ffn;
    s->steer_attn = attn;
    if (s->seq) ds4_seq_set_steering(s->seq, ffn, attn);
    return 0;
}

void ds4_session_steering(const ds4_session *s, float *ffn, float *attn) {
    *ffn = s->steer_ffn;
    *attn = s->steer_attn;
}

void ds4_session_drop_checkpoint(ds4_session *s) {
    ds4_kv_state_free(s->checkpoint);
    s->checkpoint = NULL;
}

int ds4_session_save_file(ds4_session *s, const char *path, ds4_err *err) {
    ds4_kv_state *st = ds4_session_state_new(s, err);
    if (!st) return -1;
    int rc = ds4_session_snapshot(s, st, err);
    if (rc == 0) rc = ds4_kv_state_save_file(st, path, err);
    ds4_kv_state_free(st);
    return rc;
}

int ds4_session_load_file(ds4_session *s, const char *path, ds4_err *err) {
    ds4_kv_state *st = ds4_session_state_new(s, err);
    if (!st) return -1;
    int rc = ds4_kv_state_load_file(st, path, err);
    if (rc == 0) rc = ds4_session_restore(s, st, err);
    ds4_kv_state_free(st);
    return rc;
}

/* ------------------------------------------------- MTP speculation */

int ds4_session_enable_mtp(ds4_session *s, uint32_t draft, float margin, ds4_err *err) {
    spec_drop(s);
    s->mtp_draft = 0;
    if (draft == 0) return 0;
    if (!s->e->b || !s->e->b->opts.mtp)
        return ds4_err_set(err, DS4_EINVAL, "the model was loaded without an MTP block (--mtp FILE)");
    s->mtp_draft = draft;
    s->mtp_margin = margin;
    /* a sized session without a sequence makes its first now, so that
     * what the backend refuses is said now */
    int rc = s->seq ? spec_make(s, err) : seq_make(s, sized_cap(s, 1), err);
    if (rc != 0) s->mtp_draft = 0;
    return rc;
}

ds4_spec *ds4_session_spec(ds4_session *s) { return s->spec; }

int ds4_session_spec_verify(ds4_session *s, const int32_t *toks, uint32_t k, float *logits, ds4_err *err) {
    if (check_room(s, k, err) != 0) return -1;
    s->spec_n0 = s->n;
    if (ds4_spec_verify(s->spec, toks, k, logits, err) != 0) {
        ds4_session_reset(s);
        return -1;
    }
    memcpy(s->tokens + s->n, toks, k * sizeof(int32_t));
    s->n += k;
    return 0;
}

int ds4_session_spec_accept(ds4_session *s, uint32_t keep, ds4_err *err) {
    if (ds4_spec_accept(s->spec, s->spec_n0, keep, err) != 0) {
        ds4_session_reset(s);
        return -1;
    }
    s->n = s->spec_n0 + keep;
    s->stats.total_decoded += keep;
    return 0;
}
