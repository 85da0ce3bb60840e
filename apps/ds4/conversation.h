/*
 * conversation.h - a chat held in a live session: the messages so far, the
 * exact tokens the session was given, and one turn at a time.
 *
 * Every turn renders the whole conversation with the official chat
 * renderer (text/chat.h), so what the model sees is the DeepSeek V4
 * encoding; but the tokens of earlier turns are the ones the session
 * already holds, including the assistant's own sampled tokens (which need
 * not be the canonical tokenization of their text).  When the new render
 * starts with the text of those tokens, only the rest is tokenized, and
 * ds4_session_sync then prefills just that suffix.  Anything else (a
 * changed thinking mode, a new context size) falls back to tokenizing the
 * whole render, and sync reuses whatever prefix still matches.  Earlier
 * turns keep their reasoning (the encoder's drop_thinking=False) so the
 * render stays a continuation of what the session holds.
 *
 * A turn that Ctrl+C stops keeps what was generated as the assistant's
 * message; one stopped before any token (during prefill or before the
 * first token) is taken back entirely.
 */
#ifndef DS4_CLI_CONVERSATION_H
#define DS4_CLI_CONVERSATION_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/generate.h"
#include "engine/session.h"
#include "engine/spec.h"
#include "runtime.h"
#include "text/chat.h"
#include "text/tokenizer.h"

typedef struct convo {
    ds4_engine *e;
    ds4_session *s;
    ds4_tokenizer *tok;
    json_t *messages; /* the transcript, OpenAI-style */
    ds4_think_mode think;
    int32_t think_end;       /* id of "</think>" */
    ds4_tokens known;        /* tokens of the last prompt plus its generated tokens */
    ds4_strbuf known_text;   /* their exact text */
    ds4_strbuf pending_text; /* text of the prompt being run, until commit */
    bool pending_raw;        /* it is a raw transcript: no messages to keep */
    cli_term term;
    uint32_t mtp_draft; /* MTP drafts a step (0: no speculation) */
    float mtp_margin;
} convo;

/* What a turn did, for the timing line and the tests that read it. */
typedef struct turn_stats {
    uint32_t prompt_tokens; /* the whole prompt */
    uint32_t reused;        /* of which the session already held */
    uint32_t prefilled;     /* of which were prefilled this turn */
    double prefill_s;
    ds4_gen_result gen;
    ds4_spec_stats spec; /* MTP speculation during the turn */
    bool interrupted;    /* Ctrl+C (prefill or generation) */
    bool context_full;   /* generation stopped because the context filled up */
    bool rolled_back;    /* the turn left no trace */
} turn_stats;

/* system: "" for none. */
int convo_init(convo *c, ds4_engine *e, uint32_t ctx, const char *system, ds4_think_mode think, ds4_err *err);

/* Speculative decoding with the engine's MTP block, drafts of up to draft
 * tokens (the session made by /ctx too).  Nothing when the engine has no
 * block. */
int convo_enable_mtp(convo *c, uint32_t draft, float margin, ds4_err *err);
void convo_free(convo *c);

/* A new session of ctx tokens; the transcript is kept (the next turn
 * prefills it again). */
int convo_set_ctx(convo *c, uint32_t ctx, ds4_err *err);
void convo_set_think(convo *c, ds4_think_mode think);
/* The thinking mode rendered for the current context (Max needs a large one). */
ds4_think_mode convo_effective_think(const convo *c);
uint32_t convo_ctx(const convo *c);

/* Add a user message and produce the prompt's tokens in *out (reset first).
 * On failure the message is taken back. */
int convo_prompt(convo *c, const char *text, size_t len, ds4_tokens *out, ds4_err *err);
/* A pre-rendered transcript (starts with BOS): tokens with every special
 * token recognised, no message added. */
int convo_prompt_raw(convo *c, const char *text, size_t len, ds4_tokens *out, ds4_err *err);

/* Whether the prompt ends inside an open <think> block (the reasoning
 * comes first). */
bool convo_opens_think(const convo *c, const ds4_tokens *prompt);

/* Bring the session to the prompt (prefix reuse, progress line, Ctrl+C).
 * Returns 0, 1 when interrupted (the turn is taken back), -1 on error. */
int convo_prefill(convo *c, const ds4_tokens *prompt, turn_stats *st, ds4_err *err);

/* After generation: record the assistant's tokens (gen[0..n), possibly
 * ending in EOS) and message, or take the turn back when n is 0. */
int convo_commit(convo *c, const ds4_tokens *prompt, const int32_t *gen, uint32_t n, ds4_err *err);
/* Take back the last user message (a turn that produced nothing). */
void convo_rollback(convo *c);

/* One whole turn printed to stdout: prompt (from convo_prompt/_raw),
 * prefill, generation with the sampler (NULL: greedy) up to max_tokens,
 * commit.  Returns 0 (see st for an interruption) or -1. */
int convo_turn(convo *c, const ds4_tokens *prompt, ds4_sampler *smp, uint32_t max_tokens, turn_stats *st, ds4_err *err);

/* "prefill: ... t/s, generation: ... t/s" on stderr. */
void convo_print_stats(const turn_stats *st);

#endif
