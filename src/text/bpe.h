/*
 * bpe.h - byte-pair merging of one pre-tokenized piece (docs/MODEL.md 10.4),
 * with a per-thread cache of piece -> ids.
 *
 * The piece's raw bytes become one symbol each (the byte-level token for
 * that byte); then the adjacent pair with the lowest merge rank is merged,
 * leftmost first on a tie, until no pair merges - the same result as HF's
 * priority-queue merge.  Short pieces use a linear scan over a small array,
 * long ones (whitespace or digit-free letter runs of any length) a heap over
 * a linked list, so the cost stays O(n log n).
 *
 * Text repeats words endlessly, so results for pieces up to 64 bytes are
 * cached in an open-addressing table over a fixed arena; when either fills
 * up the cache is simply emptied (bounded memory, no per-piece malloc).
 */
#ifndef DS4_TEXT_BPE_H
#define DS4_TEXT_BPE_H

#include <stddef.h>

#include "base/error.h"
#include "text/tokens.h"
#include "text/vocab.h"

typedef struct ds4_bpe ds4_bpe;

ds4_bpe *ds4_bpe_new(const ds4_vocab *v, ds4_err *err);
void ds4_bpe_free(ds4_bpe *b);

/* Append the ids of the piece s[0..n) to out (allocation failures are
 * recorded in out->failed or returned as -1 for scratch space). */
int ds4_bpe_piece(ds4_bpe *b, const char *s, size_t n, ds4_tokens *out);

#endif
