/*
 * rank.h - the largest values of a float vector (logits), in one order
 * that every greedy path, sampler and report shares: the larger value
 * first, the lower index first among equal values, and NaN never chosen.
 * Greedy decoding on the CPU, the CUDA argmax kernel (same rule, written
 * for the device in cuda_ffn.cu), the sampler, --dump-logprobs and the
 * tools all pick the same token from the same row, even a row with NaN in
 * it, so a broken row cannot make two paths disagree.
 */
#ifndef DS4_BASE_RANK_H
#define DS4_BASE_RANK_H

#include <stdbool.h>
#include <stdint.h>

/* Index of the largest value (the lowest index among equal ones); NaN
 * never wins; 0 when no value is a number or n <= 0. */
int32_t ds4_argmax(const float *x, int n);

/* Indices of the k largest values, largest first, in the argmax order
 * (ids[0] is ds4_argmax(x, n)).  NaN is never chosen.  Returns how many
 * were written: min(k, the values that are not NaN). */
int ds4_top_k(const float *x, int n, int k, int32_t *ids);

/* Whether any of the n values is NaN. */
bool ds4_any_nan(const float *x, int n);

#endif
