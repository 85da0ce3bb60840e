/*
 * tokjson.h - reading the official Hugging Face tokenizer.json (and
 * tokenizer_config.json) into the arrays a ds4_vocab and the GGUF
 * `tokenizer.ggml.*` metadata are made of.
 *
 * The layout follows llama.cpp's converter (convert_hf_to_gguf.py,
 * get_vocab_base), which produced the published DeepSeek V4 GGUF files:
 *  - one token per id in [0, vocab_size), vocab_size = max(highest id + 1,
 *    the model's vocab_size when given); ids no entry defines become
 *    "[PAD<id>]" with type UNUSED;
 *  - model vocabulary entries are NORMAL, stored in byte-level form;
 *  - added tokens are CONTROL when marked special or when they look special
 *    ("<|...|>", "<｜...｜>", "<pad>", "<mask>", "<2mass>", "[@BOS@]",
 *    "<unused...>"), else USER_DEFINED with U+2581 replaced by a space;
 *  - merges as "LEFT RIGHT" strings in rank order;
 *  - BOS / EOS / padding ids from tokenizer_config.json's token strings.
 * For the DeepSeek V4 tokenizer.json the ids are exactly 0..129279 (128000
 * model tokens, 1280 added tokens above them, ids 0-2 in both), so no
 * padding is needed and the vocabulary matches the model's 129280 rows.
 *
 * The pre-tokenizer must be the official three-regex sequence (pretok.h);
 * anything else is refused rather than silently tokenized differently.
 */
#ifndef DS4_TEXT_TOKJSON_H
#define DS4_TEXT_TOKJSON_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "format/gguf.h"
#include "text/vocab.h"

typedef struct ds4_tokjson {
    uint32_t n_tokens;
    ds4_str *tokens;
    int32_t *types;
    uint32_t n_merges;
    ds4_str *merges;
    int32_t bos_id, eos_id, pad_id; /* -1 when not configured */
    bool add_bos, add_eos;
    char *arena; /* owns every string above */
} ds4_tokjson;

/* Load tokenizer.json (a path ending in ".xz" is decompressed with xz).  `config_path` (tokenizer_config.json) may be NULL:
 * BOS and EOS then default to "<｜begin▁of▁sentence｜>" and
 * "<｜end▁of▁sentence｜>", padding to EOS.  `min_vocab` is the model's
 * vocab_size (0 if unknown). */
int ds4_tokjson_load(const char *json_path, const char *config_path, uint32_t min_vocab, ds4_tokjson *out,
                     ds4_err *err);
void ds4_tokjson_free(ds4_tokjson *t);

/* A view of the loaded arrays for ds4_vocab_new. */
ds4_vocab_src ds4_tokjson_src(const ds4_tokjson *t);

/* Add the tokenizer.ggml.* metadata to a GGUF being written (tokjson_gguf.c;
 * the quantizer calls this for model files).  Fails only when out of
 * memory; the writer's own errors come from ds4_gguf_writer_close. */
int ds4_tokjson_write_gguf(const ds4_tokjson *t, ds4_gguf_writer *w, ds4_err *err);

/* tokenizer.json (+ tokenizer_config.json) -> a GGUF holding only the
 * tokenizer metadata, checked to build a vocabulary first. */
int ds4_tokjson_import(const char *json_path, const char *config_path, uint32_t min_vocab, const char *out_path,
                       ds4_err *err);

#endif
