/*
 * output.h - generated tokens to answer events (see output.c).
 */
#ifndef DS4_SERVER_OUTPUT_H
#define DS4_SERVER_OUTPUT_H

#include "constrain.h"
#include "engine/generate.h"
#include "server.h"
#include "text/dsml_parse.h"
#include "text/tokenizer.h"

typedef struct out_ctx {
    job *j;
    int32_t eos;
    ds4_detok_stream detok;
    ds4_dsml_parser *parser; /* NULL for raw text (completions) */
    ds4_strbuf piece;        /* decoded text of the current token */
    ds4_strbuf pending;      /* visible text held back for stop sequences */
    ds4_strbuf sse;          /* streaming bytes not yet pushed to the job */
    bool stopped;            /* a stop sequence matched */
    bool tool_stop;          /* a tool-call block closed */
    /* The answer after </think> (from the start without thinking): the
     * sampler switches to these settings and the constraint starts. */
    ds4_sampler *smp;
    ds4_sampler_params answer_sp;
    bool switch_sp;
    constraint *cons; /* NULL: none */
    bool cons_on;
    bool in_reasoning;
    size_t lp_cap;
} out_ctx;

/* `thinking`: the prompt ends with <think>, so output starts as reasoning.
 * smp: the sampler, whose settings become answer_sp at </think> when
 * switch_sp; cons: the answer's constraint (may be NULL). */
int out_init(out_ctx *g, job *j, const ds4_vocab *v, bool thinking, ds4_err *err);
void out_free(out_ctx *g);
/* The answer's constraint from the request (tool_choice, response_format,
 * parallel_tool_calls): g->cons, or nothing when the answer is free. */
int out_constrain(out_ctx *g, const cvocab *cv, ds4_err *err);
/* One sampled token (the generation callback's work); `logits` are the
 * ones it was chosen from (for logprobs), NULL when unknown. */
void out_token(out_ctx *g, int32_t tok, const float *logits, int n_vocab, ds4_gen_control *ctl);
/* Inside a tool-call block (no continued KV saves there). */
bool out_in_tool_block(const out_ctx *g);
/* End: flush held text, settle the finish reason.  A cut (max_tokens, a
 * full context) drops what could be the start of markup and a tool call
 * still in progress, and finishes "length". */
void out_finish(out_ctx *g, ds4_finish finish);
/* Push pending SSE bytes to the job. */
void out_flush(out_ctx *g);
/* The exact tool-call block text (for the replay memory). */
const char *out_raw_calls(const out_ctx *g, size_t *n);
/* The generation loop's restrict hook (ctx: the out_ctx). */
void out_restrict(void *ctx, float *logits, int n_vocab);

#endif
