/*
 * sampler.h - choosing the next token from a logits vector.
 *
 * Greedy (temperature <= 0) is exactly the argmax, lowest index on ties.
 * Otherwise the filters run in this order over the full vocabulary:
 * temperature scaling, top-k (0 = off, capped at 1024), min-p (keep tokens
 * whose probability is at least min_p times the top token's), top-p
 * (smallest set of most likely tokens whose mass reaches top_p); then one
 * draw from the renormalised distribution with a seeded xorshift64*
 * generator, so the same seed and logits give the same tokens.
 * Defaults are ds4's (docs/MODEL.md 13): T 1, top-p 1, min-p 0.05.
 * ds4_argmax (base/rank.h) is the greedy choice everywhere.
 */
#ifndef DS4_ENGINE_SAMPLER_H
#define DS4_ENGINE_SAMPLER_H

#include <stdint.h>

#include "base/error.h"
#include "base/rank.h"

/* The parameters' bounds and defaults, for every program that takes them
 * (engine/cli.h's rows, the server's request fields). */
#define DS4_TEMP_MAX      100.0f /* temperatures above are refused (ds4's bound) */
#define DS4_TEMP_DEFAULT  1.0f
#define DS4_TOP_P_DEFAULT 1.0f
#define DS4_MIN_P_DEFAULT 0.05f
#define DS4_TOP_K_MAX     1024 /* larger top-k values are taken as this */

typedef struct ds4_sampler_params {
    float temperature;
    float top_p;
    float min_p;
    int top_k;
    uint64_t seed; /* 0 = choose from time and pid */
} ds4_sampler_params;

typedef struct ds4_sampler {
    ds4_sampler_params p;
    uint64_t state; /* xorshift64* state, never 0 */
    int n_vocab;
    int32_t *cand_id; /* scratch, n_vocab entries */
    float *cand_logit;
} ds4_sampler;

void ds4_sampler_defaults(ds4_sampler_params *p);

/* Check ranges (temperature 0..100, top_p and min_p 0..1, top_k >= 0). */
int ds4_sampler_params_check(const ds4_sampler_params *p, ds4_err *err);

int ds4_sampler_init(ds4_sampler *s, const ds4_sampler_params *p, int n_vocab, ds4_err *err);
void ds4_sampler_free(ds4_sampler *s);

/* Next token for these logits (n_vocab entries; -inf entries are never
 * chosen unless every entry is -inf, in which case 0 is returned). */
int32_t ds4_sample(ds4_sampler *s, const float *logits);

/* The distribution ds4_sample draws from for these logits, as n_vocab
 * probabilities (0 outside the filters' kept set; greedy: 1 at the
 * argmax). */
void ds4_sampler_dist(ds4_sampler *s, const float *logits, double *p);

/* One draw from a distribution (n_vocab weights >= 0, not necessarily
 * summing to 1): the residual of a rejected MTP draft. */
int32_t ds4_sample_dist(ds4_sampler *s, const double *p);

/* A uniform draw in [0, 1) from the sampler's generator. */
double ds4_sampler_uniform(ds4_sampler *s);

/* The k most likely tokens with their log-probabilities under the plain
 * softmax of `logits` (no temperature), most likely first in base/rank.h's
 * order.  Returns the number written (min(k, n); NaN logits are left out). */
int ds4_top_logprobs(const float *logits, int n, int k, int32_t *ids, float *logprobs);

/* log softmax(logits)[id], computed stably in double. */
double ds4_logprob_of(const float *logits, int n, int32_t id);

#endif
