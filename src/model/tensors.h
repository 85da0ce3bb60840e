/*
 * tensors.h - the one table of the model's tensors (docs/MODEL.md 2.3-2.5).
 *
 * Every tensor of a ds4 GGUF is one row of the lists below, which give:
 *
 *   field  the ds4_wt that holds it in the weight structs (weights.h; the
 *          CUDA backend's device copies have the same fields)
 *   gguf   its GGUF name, after the block's prefix ("blk.N." for a layer)
 *   hf     its name in the official Hugging Face checkpoint, after the
 *          block's prefix ("layers.N."); %d stands for the expert id
 *   cls    what it is (ds4_tclass): the quantization recipes and options
 *          choose storage types by class
 *   types  the storage types the engine accepts for it
 *   when   which blocks have it (ds4_when)
 *   init   how ds4's generators draw random values for it (ds4_init)
 *   ne     its shape, GGUF order (ne0 is the row length), as symbols
 *          resolved against a config and a block (layout.h, ds4_dim_value)
 *
 * Everything that spells or walks tensors derives from these rows: the
 * structs (the field column expanded below and in cuda_internal.h), the
 * inventory files are checked against and written from (layout.c), the
 * binding of a file's tensors to the fields (weights.c), the HF names
 * (convert/hf_names.c) and the upload to the GPU (cuda_weights.cu).  The
 * row order is the canonical order of the tensors in a file.  Adding a
 * tensor is adding one row.
 *
 * There is one list per kind of block.  The global tensors fill ds4_weights
 * itself; the layer tensors fill one ds4_layer_weights per layer; the MTP
 * block's own fill ds4_mtp_weights, beside its ds4_layer_weights.  A
 * different kind of block reuses the layer list under its own prefix and
 * with its own ds4_block (layout.h) saying which optional parts it has, and
 * brings its own few extra tensors as a list of its own.  The MTP block of
 * MODEL.md 2.5 is such a block: the layer tensors under "mtp.0." with no
 * compressor, indexer or hash table and a required router bias, plus
 * e_proj, h_proj, enorm, hnorm, norm and its own HC head.
 */
#ifndef DS4_MODEL_TENSORS_H
#define DS4_MODEL_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "format/quants.h"

/* What a tensor is, for quantization policy and type checks. */
typedef enum ds4_tclass {
    DS4_TC_TOKEN_EMBD,     /* token_embd */
    DS4_TC_OUTPUT,         /* output (LM head) */
    DS4_TC_HC_FN,          /* hc_{attn,ffn}_fn, output_hc_fn: HC mixers */
    DS4_TC_VECTOR,         /* norms, HC scale/base, sinks: always F32 in ds4 files */
    DS4_TC_ATTN_PROJ,      /* attn_q_a, attn_q_b, attn_kv, attn_output_a, attn_output_b */
    DS4_TC_COMPRESSOR,     /* attn_compressor_{kv,gate} */
    DS4_TC_COMPRESSOR_APE, /* attn_compressor_ape, indexer_compressor_ape */
    DS4_TC_INDEXER,        /* indexer.attn_q_b, indexer.proj, indexer_compressor_{kv,gate} */
    DS4_TC_ROUTER,         /* ffn_gate_inp */
    DS4_TC_ROUTER_BIAS,    /* exp_probs_b */
    DS4_TC_HASH,           /* ffn_gate_tid2eid (I32) */
    DS4_TC_EXP_GATE,       /* ffn_gate_exps (w1) */
    DS4_TC_EXP_UP,         /* ffn_up_exps (w3) */
    DS4_TC_EXP_DOWN,       /* ffn_down_exps (w2) */
    DS4_TC_SHARED,         /* ffn_{gate,up,down}_shexp */
    DS4_TC_COUNT
} ds4_tclass;

/* Storage types accepted (bit t: ggml type t).  Matrices may be any float
 * type or Q8_0; routed experts also the 2/4-bit K-quants of the published
 * files. */
#define DS4_TYPE_BIT(t)  (1ull << (t))
#define DS4_TYPES_F32    DS4_TYPE_BIT(DS4_TYPE_F32)
#define DS4_TYPES_I32    DS4_TYPE_BIT(DS4_TYPE_I32)
#define DS4_TYPES_FLOAT  (DS4_TYPE_BIT(DS4_TYPE_F32) | DS4_TYPE_BIT(DS4_TYPE_F16) | DS4_TYPE_BIT(DS4_TYPE_BF16))
#define DS4_TYPES_MATRIX (DS4_TYPES_FLOAT | DS4_TYPE_BIT(DS4_TYPE_Q8_0))
/* clang-format off */
#define DS4_TYPES_EXPERT \
    (DS4_TYPES_MATRIX | DS4_TYPE_BIT(DS4_TYPE_Q2_K) | DS4_TYPE_BIT(DS4_TYPE_Q4_K) | DS4_TYPE_BIT(DS4_TYPE_IQ2_XXS))
/* clang-format on */

/* Which blocks have a tensor. */
typedef enum ds4_when {
    DS4_WHEN_ALWAYS,
    DS4_WHEN_COMPRESSED, /* compression ratio != 0 */
    DS4_WHEN_INDEXER,    /* the lightning indexer (ratio 4) */
    DS4_WHEN_HASH,       /* hash-routed layers */
    DS4_WHEN_LEARNED,    /* the router bias: written for learned-routing
                          * layers (the official checkpoint has none on
                          * hash layers), optional on reading unless the
                          * block requires it */
} ds4_when;

/* How ds4-mkmodel and the synthetic weights draw a tensor's values: scales
 * that keep activations of order one through the layers. */
typedef enum ds4_init {
    DS4_INIT_FANIN,    /* N(0, 1/sqrt(row length)): matrices */
    DS4_INIT_UNIT,     /* N(0, 1): the embedding, attention sinks */
    DS4_INIT_NEAR_ONE, /* 1 + N(0, 0.1): norms and HC scales */
    DS4_INIT_HALF,     /* N(0, 0.5): HC bases, compressor APEs */
    DS4_INIT_BIAS,     /* N(0, 0.05): the router bias */
    DS4_INIT_HASH,     /* n_expert_used distinct experts per token */
} ds4_init;

/* Shape symbols (values: ds4_dim_value in layout.h). */
typedef enum ds4_dim {
    DS4_DIM_ONE,
    DS4_DIM_HC_SCALES,    /* 3: the pre, post and comb scales of an HC site */
    DS4_DIM_EMBD,         /* n_embd */
    DS4_DIM_VOCAB,        /* n_vocab */
    DS4_DIM_HC,           /* n_hc */
    DS4_DIM_HC_FLAT,      /* n_hc * n_embd */
    DS4_DIM_HC_MIX,       /* (2 + n_hc) * n_hc */
    DS4_DIM_Q_RANK,       /* q_lora_rank */
    DS4_DIM_Q_OUT,        /* n_head * head_dim */
    DS4_DIM_HEAD_DIM,     /* head_dim */
    DS4_DIM_N_HEAD,       /* n_head */
    DS4_DIM_O_GROUP_IN,   /* n_head * head_dim / o_groups: one group's heads */
    DS4_DIM_O_LOW,        /* o_groups * o_lora_rank */
    DS4_DIM_RATIO,        /* the block's compression ratio */
    DS4_DIM_COMP_WIDTH,   /* coff(ratio) * head_dim */
    DS4_DIM_IDX_Q_OUT,    /* idx_n_head * idx_head_dim */
    DS4_DIM_IDX_N_HEAD,   /* idx_n_head */
    DS4_DIM_IDX_WIDTH,    /* coff(ratio) * idx_head_dim */
    DS4_DIM_IDX_HEAD_DIM, /* idx_head_dim */
    DS4_DIM_EXPERTS,      /* n_expert */
    DS4_DIM_EXPERTS_USED, /* n_expert_used */
    DS4_DIM_FF,           /* n_ff_exp */
} ds4_dim;

/* X(field, gguf, hf, cls, types, when, init, ne0, ne1, ne2) */
/* clang-format off */
#define DS4_GLOBAL_TENSORS(X)                                                                                          \
    X(token_embd,      "token_embd.weight",      "embed.weight",                                                       \
      TOKEN_EMBD, MATRIX, ALWAYS, UNIT,     EMBD,    VOCAB, ONE)                                                       \
    X(output_hc_base,  "output_hc_base.weight",  "hc_head_base",                                                       \
      VECTOR,     F32,    ALWAYS, HALF,     HC,      ONE,   ONE)                                                       \
    X(output_hc_fn,    "output_hc_fn.weight",    "hc_head_fn",                                                         \
      HC_FN,      FLOAT,  ALWAYS, FANIN,    HC_FLAT, HC,    ONE)                                                       \
    X(output_hc_scale, "output_hc_scale.weight", "hc_head_scale",                                                      \
      VECTOR,     F32,    ALWAYS, NEAR_ONE, ONE,     ONE,   ONE)                                                       \
    X(output_norm,     "output_norm.weight",     "norm.weight",                                                        \
      VECTOR,     F32,    ALWAYS, NEAR_ONE, EMBD,    ONE,   ONE)                                                       \
    X(output,          "output.weight",          "head.weight",                                                        \
      OUTPUT,     MATRIX, ALWAYS, FANIN,    EMBD,    VOCAB, ONE)

#define DS4_LAYER_TENSORS(X)                                                                                           \
    /* attention sublayer */                                                                                           \
    X(hc_attn_fn,    "hc_attn_fn.weight",              "hc_attn_fn",                                                   \
      HC_FN,          FLOAT,  ALWAYS,     FANIN,    HC_FLAT,      HC_MIX,     ONE)                                     \
    X(hc_attn_scale, "hc_attn_scale.weight",           "hc_attn_scale",                                                \
      VECTOR,         F32,    ALWAYS,     NEAR_ONE, HC_SCALES,    ONE,        ONE)                                     \
    X(hc_attn_base,  "hc_attn_base.weight",            "hc_attn_base",                                                 \
      VECTOR,         F32,    ALWAYS,     HALF,     HC_MIX,       ONE,        ONE)                                     \
    X(attn_norm,     "attn_norm.weight",               "attn_norm.weight",                                             \
      VECTOR,         F32,    ALWAYS,     NEAR_ONE, EMBD,         ONE,        ONE)                                     \
    X(q_a,           "attn_q_a.weight",                "attn.wq_a.weight",                                             \
      ATTN_PROJ,      MATRIX, ALWAYS,     FANIN,    EMBD,         Q_RANK,     ONE)                                     \
    X(q_a_norm,      "attn_q_a_norm.weight",           "attn.q_norm.weight",                                           \
      VECTOR,         F32,    ALWAYS,     NEAR_ONE, Q_RANK,       ONE,        ONE)                                     \
    X(q_b,           "attn_q_b.weight",                "attn.wq_b.weight",                                             \
      ATTN_PROJ,      MATRIX, ALWAYS,     FANIN,    Q_RANK,       Q_OUT,      ONE)                                     \
    X(kv,            "attn_kv.weight",                 "attn.wkv.weight",                                              \
      ATTN_PROJ,      MATRIX, ALWAYS,     FANIN,    EMBD,         HEAD_DIM,   ONE)                                     \
    X(kv_norm,       "attn_kv_a_norm.weight",          "attn.kv_norm.weight",                                          \
      VECTOR,         F32,    ALWAYS,     NEAR_ONE, HEAD_DIM,     ONE,        ONE)                                     \
    X(sinks,         "attn_sinks.weight",              "attn.attn_sink",                                               \
      VECTOR,         F32,    ALWAYS,     UNIT,     N_HEAD,       ONE,        ONE)                                     \
    /* grouped output: each of the o_groups blocks of o_lora_rank rows reads one group's heads */                      \
    X(out_a,         "attn_output_a.weight",           "attn.wo_a.weight",                                             \
      ATTN_PROJ,      MATRIX, ALWAYS,     FANIN,    O_GROUP_IN,   O_LOW,      ONE)                                     \
    X(out_b,         "attn_output_b.weight",           "attn.wo_b.weight",                                             \
      ATTN_PROJ,      MATRIX, ALWAYS,     FANIN,    O_LOW,        EMBD,       ONE)                                     \
    /* compressor */                                                                                                   \
    X(comp_ape,      "attn_compressor_ape.weight",     "attn.compressor.ape",                                          \
      COMPRESSOR_APE, FLOAT,  COMPRESSED, HALF,     COMP_WIDTH,   RATIO,      ONE)                                     \
    X(comp_kv,       "attn_compressor_kv.weight",      "attn.compressor.wkv.weight",                                   \
      COMPRESSOR,     MATRIX, COMPRESSED, FANIN,    EMBD,         COMP_WIDTH, ONE)                                     \
    X(comp_gate,     "attn_compressor_gate.weight",    "attn.compressor.wgate.weight",                                 \
      COMPRESSOR,     MATRIX, COMPRESSED, FANIN,    EMBD,         COMP_WIDTH, ONE)                                     \
    X(comp_norm,     "attn_compressor_norm.weight",    "attn.compressor.norm.weight",                                  \
      VECTOR,         F32,    COMPRESSED, NEAR_ONE, HEAD_DIM,     ONE,        ONE)                                     \
    /* lightning indexer */                                                                                            \
    X(idx_q_b,       "indexer.attn_q_b.weight",        "attn.indexer.wq_b.weight",                                     \
      INDEXER,        MATRIX, INDEXER,    FANIN,    Q_RANK,       IDX_Q_OUT,  ONE)                                     \
    X(idx_proj,      "indexer.proj.weight",            "attn.indexer.weights_proj.weight",                             \
      INDEXER,        MATRIX, INDEXER,    FANIN,    EMBD,         IDX_N_HEAD, ONE)                                     \
    X(idx_ape,       "indexer_compressor_ape.weight",  "attn.indexer.compressor.ape",                                  \
      COMPRESSOR_APE, FLOAT,  INDEXER,    HALF,     IDX_WIDTH,    RATIO,      ONE)                                     \
    X(idx_kv,        "indexer_compressor_kv.weight",   "attn.indexer.compressor.wkv.weight",                           \
      INDEXER,        MATRIX, INDEXER,    FANIN,    EMBD,         IDX_WIDTH,  ONE)                                     \
    X(idx_gate,      "indexer_compressor_gate.weight", "attn.indexer.compressor.wgate.weight",                         \
      INDEXER,        MATRIX, INDEXER,    FANIN,    EMBD,         IDX_WIDTH,  ONE)                                     \
    X(idx_norm,      "indexer_compressor_norm.weight", "attn.indexer.compressor.norm.weight",                          \
      VECTOR,         F32,    INDEXER,    NEAR_ONE, IDX_HEAD_DIM, ONE,        ONE)                                     \
    /* FFN sublayer */                                                                                                 \
    X(hc_ffn_fn,     "hc_ffn_fn.weight",               "hc_ffn_fn",                                                    \
      HC_FN,          FLOAT,  ALWAYS,     FANIN,    HC_FLAT,      HC_MIX,     ONE)                                     \
    X(hc_ffn_scale,  "hc_ffn_scale.weight",            "hc_ffn_scale",                                                 \
      VECTOR,         F32,    ALWAYS,     NEAR_ONE, HC_SCALES,    ONE,        ONE)                                     \
    X(hc_ffn_base,   "hc_ffn_base.weight",             "hc_ffn_base",                                                  \
      VECTOR,         F32,    ALWAYS,     HALF,     HC_MIX,       ONE,        ONE)                                     \
    X(ffn_norm,      "ffn_norm.weight",                "ffn_norm.weight",                                              \
      VECTOR,         F32,    ALWAYS,     NEAR_ONE, EMBD,         ONE,        ONE)                                     \
    X(gate_inp,      "ffn_gate_inp.weight",            "ffn.gate.weight",                                              \
      ROUTER,         FLOAT,  ALWAYS,     FANIN,    EMBD,         EXPERTS,    ONE)                                     \
    X(exp_bias,      "exp_probs_b.bias",               "ffn.gate.bias",                                                \
      ROUTER_BIAS,    F32,    LEARNED,    BIAS,     EXPERTS,      ONE,        ONE)                                     \
    X(tid2eid,       "ffn_gate_tid2eid.weight",        "ffn.gate.tid2eid",                                             \
      HASH,           I32,    HASH,       HASH,     EXPERTS_USED, VOCAB,      ONE)                                     \
    X(gate_exps,     "ffn_gate_exps.weight",           "ffn.experts.%d.w1.weight",                                     \
      EXP_GATE,       EXPERT, ALWAYS,     FANIN,    EMBD,         FF,         EXPERTS)                                 \
    X(up_exps,       "ffn_up_exps.weight",             "ffn.experts.%d.w3.weight",                                     \
      EXP_UP,         EXPERT, ALWAYS,     FANIN,    EMBD,         FF,         EXPERTS)                                 \
    X(down_exps,     "ffn_down_exps.weight",           "ffn.experts.%d.w2.weight",                                     \
      EXP_DOWN,       EXPERT, ALWAYS,     FANIN,    FF,           EMBD,       EXPERTS)                                 \
    X(gate_sh,       "ffn_gate_shexp.weight",          "ffn.shared_experts.w1.weight",                                 \
      SHARED,         MATRIX, ALWAYS,     FANIN,    EMBD,         FF,         ONE)                                     \
    X(up_sh,         "ffn_up_shexp.weight",            "ffn.shared_experts.w3.weight",                                 \
      SHARED,         MATRIX, ALWAYS,     FANIN,    EMBD,         FF,         ONE)                                     \
    X(down_sh,       "ffn_down_shexp.weight",          "ffn.shared_experts.w2.weight",                                 \
      SHARED,         MATRIX, ALWAYS,     FANIN,    FF,           EMBD,       ONE)

/* The MTP block's own tensors (docs/MODEL.md 2.5, 9), beside its layer
 * tensors (the list above under "mtp.0.", dense, router bias required). */
#define DS4_MTP_TENSORS(X)                                                                                             \
    X(hc_head_base,  "hc_head_base.weight",  "hc_head_base",                                                           \
      VECTOR,    F32,    ALWAYS, HALF,     HC,      ONE,  ONE)                                                         \
    X(hc_head_fn,    "hc_head_fn.weight",    "hc_head_fn",                                                             \
      HC_FN,     FLOAT,  ALWAYS, FANIN,    HC_FLAT, HC,   ONE)                                                         \
    X(hc_head_scale, "hc_head_scale.weight", "hc_head_scale",                                                          \
      VECTOR,    F32,    ALWAYS, NEAR_ONE, ONE,     ONE,  ONE)                                                         \
    X(e_proj,        "e_proj.weight",        "e_proj.weight",                                                          \
      ATTN_PROJ, MATRIX, ALWAYS, FANIN,    EMBD,    EMBD, ONE)                                                         \
    X(h_proj,        "h_proj.weight",        "h_proj.weight",                                                          \
      ATTN_PROJ, MATRIX, ALWAYS, FANIN,    EMBD,    EMBD, ONE)                                                         \
    X(enorm,         "enorm.weight",         "enorm.weight",                                                           \
      VECTOR,    F32,    ALWAYS, NEAR_ONE, EMBD,    ONE,  ONE)                                                         \
    X(hnorm,         "hnorm.weight",         "hnorm.weight",                                                           \
      VECTOR,    F32,    ALWAYS, NEAR_ONE, EMBD,    ONE,  ONE)                                                         \
    X(norm,          "norm.weight",          "norm.weight",                                                            \
      VECTOR,    F32,    ALWAYS, NEAR_ONE, EMBD,    ONE,  ONE)
/* clang-format on */

/* Tensors per list. */
#define DS4_TENSOR_COUNT(...) +1
enum {
    DS4_N_GLOBAL_TENSORS = 0 DS4_GLOBAL_TENSORS(DS4_TENSOR_COUNT),
    DS4_N_LAYER_TENSORS = 0 DS4_LAYER_TENSORS(DS4_TENSOR_COUNT),
    DS4_N_MTP_TENSORS = 0 DS4_MTP_TENSORS(DS4_TENSOR_COUNT),
};

/* One row, as data. */
typedef struct ds4_tensor_row {
    const char *name; /* GGUF name after the block prefix */
    const char *hf;   /* HF name after the block's HF prefix; %d = expert */
    ds4_tclass cls;
    uint64_t types; /* accepted storage types */
    ds4_when when;
    ds4_init init;
    ds4_dim ne[3];
    size_t offset; /* of the ds4_wt in the struct the list fills */
} ds4_tensor_row;

/* The lists as data, in file order (tensors.c).  Offsets are into
 * ds4_weights for the globals, into ds4_layer_weights for the layers. */
extern const ds4_tensor_row ds4_global_rows[DS4_N_GLOBAL_TENSORS];
extern const ds4_tensor_row ds4_layer_rows[DS4_N_LAYER_TENSORS];
extern const ds4_tensor_row ds4_mtp_rows[DS4_N_MTP_TENSORS]; /* offsets into ds4_mtp_weights */

/* Mean and standard deviation of a tensor's random values (rows of n
 * values); ds4-mkmodel and the CUDA backend's synthetic weights agree. */
void ds4_init_dist(ds4_init init, uint64_t n, float *mean, float *std);

#endif
