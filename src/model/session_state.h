/*
 * session_state.h - the KV / session state of one sequence (docs/MODEL.md
 * 8.1) in host memory, and its "DSV4" payload serialisation (8.3).
 *
 * This struct is the backend-neutral form of the state: the CPU backend
 * computes on it directly; other backends copy their device state into it
 * to snapshot and out of it to restore.  Everything in it is a pure function
 * of the tokens processed: compressor frontiers are kept canonical (rows
 * past the current partial window hold 0 values and -inf scores, MODEL.md
 * 6.2) after every token, so a payload does not depend on how the tokens
 * were batched.
 *
 * Per layer:
 *   raw        ring of the last `raw_cap` KV rows (row of position p at
 *              p % raw_cap), raw_cap = min(sliding_window, ctx)
 *   comp       compressed attention rows, floor(n / ratio) live (ratio != 0)
 *   comp_kv/comp_score   compressor frontier, SR x width each
 *              (SR = coff*ratio, width = coff*head_dim)
 *   idx        indexer rows, floor(n / 4) live (ratio 4)
 *   idx_kv/idx_score     indexer compressor frontier, 8 x 2*idx_head_dim
 */
#ifndef DS4_MODEL_SESSION_STATE_H
#define DS4_MODEL_SESSION_STATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "model/config.h"

#define DS4_DSV4_MAGIC    0x34565344u /* "DSV4" */
#define DS4_DSV4_VERSION  1u
#define DS4_SCORE_NEG_INF (-1e30f) /* empty compressor slot (MODEL.md 6.2) */

typedef struct ds4_layer_state {
    uint32_t ratio;
    float *raw;
    float *comp, *comp_kv, *comp_score;
    float *idx, *idx_kv, *idx_score;
} ds4_layer_state;

typedef struct ds4_kv_state {
    const ds4_config *cfg;
    uint32_t layer_first;   /* the layers whose state it holds: [layer_first, */
    uint32_t layer_end;     /* layer_end); all of them but in a pipeline stage */
    uint32_t ctx;           /* capacity in tokens */
    uint32_t prefill_chunk; /* recorded in payloads (MODEL.md 8.3) */
    uint32_t raw_cap;
    uint32_t n_tokens; /* tokens processed */
    uint32_t *tokens;  /* ctx entries */
    float *logits;     /* n_vocab: logits for the next token */
    bool has_logits;
    ds4_layer_state *layers;
} ds4_kv_state;

/* Allocate an empty state for `ctx` tokens. */
ds4_kv_state *ds4_kv_state_new(const ds4_config *cfg, uint32_t ctx, uint32_t prefill_chunk, ds4_err *err);

/* The state of layers [first, end) only (a pipeline stage's, docs/
 * DISTRIBUTED.md): the other layers' entries are empty (NULL arrays).
 * Such a state copies to and from a whole one (the layers both hold) but
 * is not saved as a payload. */
ds4_kv_state *ds4_kv_state_new_layers(const ds4_config *cfg, uint32_t ctx, uint32_t prefill_chunk, uint32_t first,
                                      uint32_t end, ds4_err *err);

/* Bytes of the layer slice [first, end) of a state of n tokens, as
 * ds4_kv_state_pack_layers writes it: per layer the whole raw ring, the
 * live compressed and indexer rows and the frontiers. */
uint64_t ds4_kv_state_slice_bytes(const ds4_kv_state *s, uint32_t n, uint32_t first, uint32_t end);
/* Write layers [first, end) of s (which holds them) to buf; read them back
 * into a state holding them, whose n_tokens is n (the slice's). */
void ds4_kv_state_pack_layers(const ds4_kv_state *s, uint32_t first, uint32_t end, void *buf);
void ds4_kv_state_unpack_layers(ds4_kv_state *s, uint32_t n, uint32_t first, uint32_t end, const void *buf);
void ds4_kv_state_free(ds4_kv_state *s);

/* Host bytes a state of `ctx` tokens occupies (memory estimates); of
 * layers [first, end) only: a pipeline stage's. */
uint64_t ds4_kv_state_bytes(const ds4_config *cfg, uint32_t ctx);
uint64_t ds4_kv_state_bytes_layers(const ds4_config *cfg, uint32_t ctx, uint32_t first, uint32_t end);

/* Back to zero tokens: empty rows, frontiers 0 / -inf. */
void ds4_kv_state_reset(ds4_kv_state *s);

/* Copy the live part of `src` into `dst` (same config; dst->ctx must hold
 * src's tokens): the tokens, the logits and the layers both states hold.
 * The contexts may differ (a sequence resized: backend.h ds4_seq_resize),
 * and so may the raw rings where one is shorter than the window. */
int ds4_kv_state_copy(ds4_kv_state *dst, const ds4_kv_state *src, ds4_err *err);

/* Geometry helpers. */
uint32_t ds4_state_comp_cap(const ds4_kv_state *s, uint32_t ratio);
uint32_t ds4_state_frontier_rows(uint32_t ratio); /* SR */
uint32_t ds4_state_frontier_width(const ds4_config *c, uint32_t ratio, bool indexer);

/* Set frontier rows [r0, r1) to the empty slot: value 0, score -inf. */
void ds4_frontier_clear(float *kv, float *score, uint32_t width, uint32_t r0, uint32_t r1);

/* Bytes ds4_kv_state_save writes for this state. */
uint64_t ds4_kv_state_payload_bytes(const ds4_kv_state *s);

/* DSV4 payload v1, byte layout of MODEL.md 8.3 (little-endian).  Whole
 * states only. */
int ds4_kv_state_save(const ds4_kv_state *s, FILE *f, ds4_err *err);
int ds4_kv_state_load(ds4_kv_state *s, FILE *f, ds4_err *err);
int ds4_kv_state_save_file(const ds4_kv_state *s, const char *path, ds4_err *err);
int ds4_kv_state_load_file(ds4_kv_state *s, const char *path, ds4_err *err);

#endif
