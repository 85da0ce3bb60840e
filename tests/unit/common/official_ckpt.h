/*
 * official_ckpt.h - test helper: writes the tiny official-format DeepSeek V4
 * checkpoint of tests/reference/make_official_ckpt.py, byte for byte the
 * same tensors (same generator, same order; tests/golden/tools/tiny_ckpt.tsv
 * holds the digests both must match), so C tests need no Python.
 *
 * One tensor can be spoiled on the way out, to test error paths: its dtype
 * string replaced (same element size, so the file stays well-formed) or its
 * two dims swapped.  With mtp_block the checkpoint also holds a whole MTP
 * block (the official `mtp.0.*` names and encodings: a dense layer, FP8
 * e_proj / h_proj, BF16 norms, F32 HC head), after every tensor above, so
 * those keep their bytes.
 */
#ifndef DS4_TEST_OFFICIAL_CKPT_H
#define DS4_TEST_OFFICIAL_CKPT_H

#include <stdbool.h>

typedef struct official_ckpt_opts {
    const char *spoil;       /* HF name of the tensor to spoil, or NULL */
    const char *spoil_dtype; /* replacement dtype string, or NULL */
    bool spoil_transpose;    /* swap its two dims */
    bool pro;                /* DeepSeek V4 Pro's pattern instead of Flash's: ratio 128 on layers 0-1,
                               * one head an output group (4), 8 experts, routed scale 2.5 (no Python
                               * twin: the generator's bytes are the same function of the order) */
    bool mtp_block;          /* a whole MTP block after the other tensors */
    const char *drop;        /* HF name of a tensor left out, or NULL */
} official_ckpt_opts;

/* Shards, index and config.json into dir (which must exist). */
void official_ckpt_write(const char *dir, const official_ckpt_opts *opts);

#endif
