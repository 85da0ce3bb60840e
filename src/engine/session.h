/*
 * session.h - one conversation's state: the token list, the backend that
 * holds its KV state, and the logits for the next token.
 *
 * Programs never drive a backend directly; they tell the session which
 * tokens it should hold and the session does the least work to get there:
 *
 *   sync(tokens)   keep the longest prefix already processed and prefill
 *                  only the rest.  The live state cannot be rewound in
 *                  general (compressor frontiers and the raw window forget),
 *                  so when the new tokens diverge from the live ones the
 *                  session falls back to its checkpoint (a snapshot taken
 *                  with checkpoint()) if that is a prefix, else starts over.
 *   eval(token)    append one token (decode).
 *
 * Prefill runs in chunks aligned to absolute multiples of the backend's
 * chunk size (docs/MODEL.md 7), reporting progress between chunks; the
 * progress callback can cancel, leaving the session consistent at a chunk
 * boundary.  Counters record how many tokens were reused and prefilled, so
 * tests can prove prefix reuse.
 */
#ifndef DS4_ENGINE_SESSION_H
#define DS4_ENGINE_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/engine.h"
#include "model/session_state.h"

typedef struct ds4_session ds4_session;

typedef struct ds4_session_stats {
    uint64_t reused;    /* tokens kept from the live state by the last sync */
    uint64_t restored;  /* tokens taken from the checkpoint by the last sync */
    uint64_t prefilled; /* tokens prefilled by the last sync */
    uint64_t total_prefilled, total_decoded, total_resets;
} ds4_session_stats;

/* Called between prefill chunks; return nonzero to stop (the sync then
 * fails with DS4_EINTERRUPTED, the session holding the tokens done). */
typedef int (*ds4_progress_fn)(void *ctx, uint32_t done, uint32_t total);

/* A session of ctx tokens: its state sized for all of them from the start. */
ds4_session *ds4_session_new(ds4_engine *e, uint32_t ctx, ds4_err *err);
/* A sized session: at most ctx tokens, its state sized for what it holds.
 * It has no sequence until it needs one; its capacity is then what
 * ds4_sized_capacity says for its tokens, and grows - the sequence
 * resized, its state kept exactly (model/backend.h ds4_seq_resize) - when
 * tokens would not fit it, or as ds4_session_reserve / ds4_session_fit
 * ask.  The engine's backend must resize sequences (ds4_engine_can_resize). */
ds4_session *ds4_session_new_sized(ds4_engine *e, uint32_t ctx, uint32_t granule, ds4_err *err);
/* The capacity such a session takes for n tokens: n and the sliding window
 * (a raw ring of the window's size whatever the capacity: a resize then
 * keeps the sequence's mark, model/backend.h), the larger rounded up to
 * the granule, at most ctx. */
uint32_t ds4_sized_capacity(const ds4_engine *e, uint32_t ctx, uint32_t granule, uint64_t n);
void ds4_session_free(ds4_session *s);

ds4_engine *ds4_session_engine(const ds4_session *s);
uint32_t ds4_session_ctx(const ds4_session *s);
/* Tokens its sequence has room for now: ctx, or a sized session's
 * capacity (0: no sequence). */
uint32_t ds4_session_capacity(const ds4_session *s);
/* A sized session's room for n tokens (its capacity at least n, grown if
 * less; a session of ctx tokens has it or fails); n at most ctx. */
int ds4_session_reserve(ds4_session *s, uint32_t n, ds4_err *err);
/* A sized session's capacity made the least that holds n tokens and its
 * own plus one, grown or shrunk (its state kept). */
int ds4_session_fit(ds4_session *s, uint32_t n, ds4_err *err);
/* Drop the state and the checkpoint; a sized session frees its sequence
 * (capacity 0), the memory going back to the backend. */
void ds4_session_release(ds4_session *s);
uint32_t ds4_session_n_tokens(const ds4_session *s);
const int32_t *ds4_session_tokens(const ds4_session *s);
const ds4_session_stats *ds4_session_get_stats(const ds4_session *s);
const char *ds4_session_backend_name(const ds4_session *s);

/* Logits for the next token (n_vocab floats); NULL when empty. */
const float *ds4_session_logits(ds4_session *s);

/* Hold exactly tokens[0..n), reusing what can be reused (see above).
 * n must be below the context size (a sized session grows to hold it). */
int ds4_session_sync(ds4_session *s, const int32_t *tokens, uint32_t n, ds4_progress_fn progress, void *pctx,
                     ds4_err *err);

/* Append tokens by prefill (the common case of sync). */
int ds4_session_append(ds4_session *s, const int32_t *tokens, uint32_t n, ds4_progress_fn progress, void *pctx,
                       ds4_err *err);

/* Append tokens by prefill and write the logits after each of them to
 * all_logits (n * n_vocab floats): teacher-forced scoring (perplexity)
 * with batched passes instead of one decode per token.  Chunking,
 * progress and cancellation as in append. */
int ds4_session_append_logits(ds4_session *s, const int32_t *tokens, uint32_t n, float *all_logits,
                              ds4_progress_fn progress, void *pctx, ds4_err *err);

/* Append one token by decode. */
int ds4_session_eval(ds4_session *s, int32_t token, ds4_err *err);

/* Back to zero tokens (the checkpoint is kept). */
void ds4_session_reset(ds4_session *s);

/* Directional steering scales for what the session computes from now on
 * (model/steering.h; the engine's defaults at first).  A change drops the
 * live state and the checkpoint, which were computed with other scales:
 * the next sync prefills everything.  Scales other than 0 need the
 * engine's directions. */
int ds4_session_set_steering(ds4_session *s, float ffn, float attn, ds4_err *err);
void ds4_session_steering(const ds4_session *s, float *ffn, float *attn);

/* Remember the current state in memory; sync() falls back to it.  Replaces
 * the previous checkpoint (a state of the session's capacity). */
int ds4_session_checkpoint(ds4_session *s, ds4_err *err);
uint32_t ds4_session_checkpoint_tokens(const ds4_session *s); /* 0 if none */
void ds4_session_drop_checkpoint(ds4_session *s);

/* Snapshot into / restore from a backend-neutral state (same engine). */
int ds4_session_snapshot(ds4_session *s, ds4_kv_state *out, ds4_err *err);
int ds4_session_restore(ds4_session *s, const ds4_kv_state *in, ds4_err *err);
/* A state of the session's context (ctx tokens: any state it can hold). */
ds4_kv_state *ds4_session_state_new(const ds4_session *s, ds4_err *err);

/* MTP speculative decoding (engine/spec.h): drafts of up to `draft`
 * tokens (1..16; 0 turns it off), stopping where the draft's top-2 logit
 * margin falls below `margin` (0: never).  The engine's backend must have
 * the MTP block. */
int ds4_session_enable_mtp(ds4_session *s, uint32_t draft, float margin, ds4_err *err);
struct ds4_spec *ds4_session_spec(ds4_session *s); /* NULL when off */

/* A speculative cycle's main-model part (the generation loop's): append
 * toks[0..k) in one rewindable step, the logits after each into logits
 * (k x n_vocab); then keep the first `keep` of them. */
int ds4_session_spec_verify(ds4_session *s, const int32_t *toks, uint32_t k, float *logits, ds4_err *err);
int ds4_session_spec_accept(ds4_session *s, uint32_t keep, ds4_err *err);

/* DSV4 payload files (docs/MODEL.md 8.3). */
int ds4_session_save_file(ds4_session *s, const char *path, ds4_err *err);
int ds4_session_load_file(ds4_session *s, const char *path, ds4_err *err);

#endif
