/*
 * rope.h - tail RoPE with adjacent-pair rotation and YaRN frequency blending
 * (docs/MODEL.md 4.5).
 *
 * Only the last rope_dim values of a head rotate, in pairs (2k, 2k+1).
 * Dense (ratio 0) layers use rope.freq_base without scaling; compressed
 * layers use compress_rope_freq_base with YaRN, and no magnitude scaling.
 * The frequency table is computed once per kind in f32 the way HF
 * transformers computes it (base^(2k/d) in f32, then 1/x), so the angles
 * p * inv_freq[k] match the reference to the last bit or two.
 */
#ifndef DS4_MODEL_ROPE_H
#define DS4_MODEL_ROPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model/config.h"

#define DS4_ROPE_MAX_PAIRS 128

typedef struct ds4_rope {
    uint32_t n_pairs;                   /* rope_dim / 2 */
    float inv_freq[DS4_ROPE_MAX_PAIRS]; /* angle of pair k at position p: p * inv_freq[k] */
} ds4_rope;

/* Table for dense layers (compressed = false) or compressed layers. */
void ds4_rope_init(ds4_rope *r, const ds4_config *c, bool compressed);

/* Rotate the 2*n_pairs values at `tail` for position `pos`; `inverse`
 * rotates by the negative angle (used on the attention output). */
void ds4_rope_apply(const ds4_rope *r, float *tail, uint32_t pos, bool inverse);

#endif
