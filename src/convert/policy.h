/*
 * policy.h - which storage type each tensor gets when quantizing: a recipe
 * (layout.h) as the base, ds4's per-class options on top, and exact-name or
 * prefix overrides above all, as in ds4's quantizer (docs/TOOLCHAIN.md).
 *
 *   routed_w1/w2/w3  routed gate/down/up experts (--experts sets all three)
 *   embedding        token_embd               (else dense)
 *   output           output.weight            (else dense)
 *   shared           shared experts           (else dense)
 *   attention_proj   attn q_a/q_b/kv/output_a/output_b (else attention, dense)
 *   attention        compressor and indexer matrices, incl. APE (else dense)
 *   dense            the tensors above whose own option is unset
 * HC mixers, router, vectors, router bias and tid2eid keep the recipe type
 * unless an override names them.  An override applies to the tensors whose
 * name starts with its prefix and that can hold its type ("blk.3.=f16"
 * leaves the F32-only vectors of layer 3 alone); one naming a tensor
 * exactly must fit it.  Every choice is checked against the
 * types layout.c accepts for the tensor and against its block size.
 */
#ifndef DS4_CONVERT_POLICY_H
#define DS4_CONVERT_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "model/layout.h"

/* "keep the recipe's type" */
#define DS4_POLICY_KEEP UINT32_MAX

typedef struct ds4_type_override {
    char *prefix;
    uint32_t type;
} ds4_type_override;

typedef struct ds4_policy {
    const ds4_recipe *recipe;
    uint32_t routed_w1, routed_w2, routed_w3;
    uint32_t embedding, output, shared, attention_proj, attention, dense;
    ds4_type_override *overrides;
    size_t n_overrides;
} ds4_policy;

/* All options KEEP, no overrides. */
void ds4_policy_init(ds4_policy *p, const ds4_recipe *recipe);
void ds4_policy_free(ds4_policy *p);

/* Type name as ds4 spells them, case-, dash- and underscore-insensitive:
 * f32, f16, bf16, q8_0, q2_k, q4_k, iq2_xxs; "copy", "template" and "keep"
 * give DS4_POLICY_KEEP. */
int ds4_policy_parse_type(const char *s, uint32_t *type, ds4_err *err);

/* Whether the quantizer can encode a type (the list above). */
bool ds4_policy_writable(uint32_t type);

/* Add "PREFIX=TYPE" (repeatable; the first matching override wins). */
int ds4_policy_add_override(ds4_policy *p, const char *spec, ds4_err *err);

/* The type for tensor t, validated. */
int ds4_policy_type(const ds4_policy *p, const ds4_tensor_spec *t, uint32_t *type, ds4_err *err);

#endif
