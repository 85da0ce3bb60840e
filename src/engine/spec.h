/*
 * spec.h - MTP speculative decoding for one session (docs/MODEL.md 9,
 * docs/DESIGN.md "Many tokens in flight").
 *
 * A cycle, with the session holding n tokens and the logits for the next:
 *
 *   begin(tok)      tok is the token the target chose for position n.  The
 *                   MTP sequence catches up: one MTP pass over the main
 *                   positions it has not seen, each residual H_i paired
 *                   with token i + 1, the last pairing H_{n-1} with tok;
 *                   its logits are the first draft's distribution.
 *   draft(d)        one more MTP row: d paired with the MTP block's own
 *                   last residual; its logits are the next draft's.
 *   verify(toks)    tok and the drafts through the main model in ONE
 *                   rewindable step: the logits after each.
 *   accept(keep)    the main sequence keeps its first `keep` verified rows
 *                   (the others are rewound exactly), the MTP sequence
 *                   drops its draft rows (they paired the MTP's own
 *                   residuals, not the main model's: the next begin()
 *                   redoes those positions with the verified residuals).
 *
 * Whatever the drafts, the session's state after accept() is that of a
 * session that appended the kept tokens one by one: speculation changes
 * speed, never the tokens (greedy) or their distribution (sampling, see
 * generate.c).
 */
#ifndef DS4_ENGINE_SPEC_H
#define DS4_ENGINE_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"

/* Drafts a cycle may propose at most (DS4_REWIND_MAX bounds the rows of a
 * verification: drafts + 1). */
#define DS4_MTP_DRAFT_MAX 16

typedef struct ds4_spec_stats {
    uint64_t cycles;   /* verification steps */
    uint64_t drafted;  /* draft tokens verified */
    uint64_t accepted; /* draft tokens the target agreed with */
} ds4_spec_stats;

typedef struct ds4_spec {
    ds4_engine *e; /* its calls go through the engine (batching) */
    ds4_backend *b;
    ds4_seq *main; /* the session's sequence */
    ds4_seq *mseq; /* the MTP block's: its row r pairs main position base + r */
    uint32_t base;
    uint32_t hid_lo;     /* main positions >= hid_lo have their residual in main's ring */
    uint32_t mlen_begin; /* the MTP sequence's length after begin() */
    uint32_t draft;      /* most drafts a cycle */
    float margin;        /* stop drafting when the draft's top-2 logit margin is below (0: never) */
    ds4_spec_stats stats;
} ds4_spec;

/* MTP sequences of the session's backend (made with an MTP block). */
int ds4_spec_init(ds4_spec *sp, ds4_engine *e, ds4_seq *main, uint32_t ctx, uint32_t draft, float margin, ds4_err *err);
void ds4_spec_free(ds4_spec *sp);

/* The main sequence's state was replaced (reset, restore): it holds n
 * tokens whose residuals are gone. */
void ds4_spec_forget(ds4_spec *sp, uint32_t n);

/* One cycle, as above.  tokens: the main sequence's n tokens. */
int ds4_spec_begin(ds4_spec *sp, const int32_t *tokens, uint32_t n, int32_t tok, float *logits, ds4_err *err);
int ds4_spec_draft(ds4_spec *sp, int32_t d, float *logits, ds4_err *err);
int ds4_spec_verify(ds4_spec *sp, const int32_t *toks, uint32_t k, float *logits, ds4_err *err);
int ds4_spec_accept(ds4_spec *sp, uint32_t n0, uint32_t keep, ds4_err *err);

/* The speculative sampling rule (Leviathan et al.; Chen et al.), which
 * leaves the distribution of every token exactly the target's: draft d,
 * drawn from q (NULL: chosen without a distribution, e.g. greedily), is
 * accepted with probability min(1, p(d) / q(d)); otherwise *y is drawn from
 * the residual max(0, p - q) normalised (from p itself when q is NULL).  p
 * (the target's distribution, n_vocab entries) is overwritten. */
bool ds4_spec_accepts(ds4_sampler *smp, double *p, const double *q, int32_t d, int32_t *y);

/* Whether a draft distribution is confident enough to draft on. */
bool ds4_spec_confident(const ds4_spec *sp, const float *logits, uint32_t n_vocab);

#endif
