/*
 * config.h - the hyperparameters of a DeepSeek V4 Flash-architecture model,
 * read from and written to the `deepseek4.*` GGUF metadata
 * (docs/MODEL.md 1.1, 1.2).
 *
 * The real model has fixed shapes, but every shape here comes from the
 * metadata so that the same engine runs the tiny test models the project
 * generates.  ds4_config_validate() checks internal consistency (the forward
 * pass relies on it); ds4_config_is_flash() / _is_pro() tell whether a
 * config is one of the published models.
 */
#ifndef DS4_MODEL_CONFIG_H
#define DS4_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "format/gguf.h"

#define DS4_MAX_LAYERS 128

typedef struct ds4_config {
    uint32_t n_layer;                        /* block_count */
    uint32_t n_embd;                         /* embedding_length */
    uint32_t n_vocab;                        /* vocab_size */
    uint32_t n_head;                         /* attention.head_count */
    uint32_t n_head_kv;                      /* attention.head_count_kv (1: MQA) */
    uint32_t head_dim;                       /* attention.key_length == value_length */
    uint32_t rope_dim;                       /* rope.dimension_count: RoPE'd tail of a head */
    uint32_t q_lora_rank;                    /* attention.q_lora_rank */
    uint32_t o_lora_rank;                    /* attention.output_lora_rank (per group) */
    uint32_t o_groups;                       /* attention.output_group_count */
    uint32_t n_expert;                       /* expert_count */
    uint32_t n_expert_used;                  /* expert_used_count */
    uint32_t n_expert_shared;                /* expert_shared_count (1) */
    uint32_t n_ff_exp;                       /* expert_feed_forward_length */
    uint32_t n_hash_layer;                   /* hash_layer_count */
    uint32_t sliding_window;                 /* attention.sliding_window */
    uint32_t idx_n_head;                     /* attention.indexer.head_count */
    uint32_t idx_head_dim;                   /* attention.indexer.key_length */
    uint32_t idx_top_k;                      /* attention.indexer.top_k */
    uint32_t n_hc;                           /* hyper_connection.count */
    uint32_t hc_sinkhorn_iters;              /* hyper_connection.sinkhorn_iterations */
    float hc_eps;                            /* hyper_connection.epsilon */
    float rms_eps;                           /* attention.layer_norm_rms_epsilon */
    float rope_base;                         /* rope.freq_base (dense layers) */
    float compress_rope_base;                /* attention.compress_rope_freq_base */
    float yarn_factor;                       /* rope.scaling.factor */
    uint64_t yarn_orig_ctx;                  /* rope.scaling.original_context_length */
    float yarn_beta_fast;                    /* rope.scaling.yarn_beta_fast */
    float yarn_beta_slow;                    /* rope.scaling.yarn_beta_slow */
    float expert_weights_scale;              /* expert_weights_scale */
    bool expert_weights_norm;                /* expert_weights_norm */
    uint64_t context_length;                 /* context_length (informational, 0 if absent) */
    uint32_t compress_ratio[DS4_MAX_LAYERS]; /* attention.compress_ratios: 0, 4 or 128 */
    float swiglu_clamp[DS4_MAX_LAYERS];      /* swiglu_clamp_exp */
} ds4_config;

/* The published shapes: DeepSeek V4 Flash (284B) and Pro (1.6T; docs/MODEL.md
 * 1.3, as PyPI nano-deepseek-v4 0.2.0's DeepSeekV4Config.pro() has them). */
void ds4_config_flash(ds4_config *c);
void ds4_config_pro(ds4_config *c);

/* The compress-ratio schedule of both for c->n_layer layers: layers 0-1
 * first_ratio (Flash 0, Pro 128), then 4 on even and 128 on odd layers;
 * SwiGLU clamp 10 everywhere. */
void ds4_config_schedule(ds4_config *c, uint32_t first_ratio);

/* Read every deepseek4.* key (MODEL.md 1.1) and validate.  Errors name the
 * key and what was wrong with it. */
int ds4_config_from_gguf(const ds4_gguf *g, ds4_config *c, ds4_err *err);

/* Write every deepseek4.* key. */
int ds4_config_to_gguf(const ds4_config *c, ds4_gguf_writer *w, ds4_err *err);

/* Internal consistency: ranges, divisors (heads by output groups), ratios
 * in {0,4,128}, ...  No width needs a particular divisibility here: block
 * sizes come with the storage types (checked per tensor by the loader) and
 * with the simulations (below). */
int ds4_config_validate(const ds4_config *c, ds4_err *err);

/* What the low-precision simulations (lowprec.h) need of the shapes: FP8
 * KV blocks of 64 non-RoPE values, 128-wide indexer rows.  A backend
 * checks it when it runs them. */
int ds4_config_check_sim(const ds4_config *c, ds4_err *err);

/* Whether any layer has ratio 4 (and so an indexer). */
bool ds4_config_has_indexer(const ds4_config *c);

/* True when every shape equals the published model's. */
bool ds4_config_is_flash(const ds4_config *c);
bool ds4_config_is_pro(const ds4_config *c);
/* "DeepSeek V4 Flash", "DeepSeek V4 Pro", or NULL for any other shape. */
const char *ds4_config_name(const ds4_config *c);

/* Derived quantities used everywhere. */
static inline bool ds4_layer_is_hash(const ds4_config *c, uint32_t il) { return il < c->n_hash_layer; }
static inline uint32_t ds4_layer_ratio(const ds4_config *c, uint32_t il) { return c->compress_ratio[il]; }
static inline bool ds4_layer_has_indexer(const ds4_config *c, uint32_t il) { return c->compress_ratio[il] == 4; }
/* Compressor width: 2 lanes (overlapping windows) for ratio 4, 1 for ratio 128. */
static inline uint32_t ds4_compress_coff(uint32_t ratio) { return ratio == 4 ? 2 : 1; }
static inline uint32_t ds4_hc_mix(const ds4_config *c) { return (2 + c->n_hc) * c->n_hc; }

#endif
