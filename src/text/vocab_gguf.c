/*
 * vocab_gguf.c - the vocabulary from a GGUF file's `tokenizer.ggml.*`
 * metadata (docs/MODEL.md 2.2, 10.1): the same arrays tokjson.c reads from
 * tokenizer.json, as ds4-tokenizer import (tokjson_gguf.c) and the
 * published ds4 files store them.
 */
#include "text/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/dsml_render.h"

#define KEY_MODEL  "tokenizer.ggml.model"
#define KEY_PRE    "tokenizer.ggml.pre"
#define KEY_TOKENS "tokenizer.ggml.tokens"
#define KEY_TYPES  "tokenizer.ggml.token_type"
#define KEY_MERGES "tokenizer.ggml.merges"
#define KEY_BOS    "tokenizer.ggml.bos_token_id"
#define KEY_EOS    "tokenizer.ggml.eos_token_id"

/* The control tokens of DeepSeek V4 (docs/MODEL.md 10.2): the markers the
 * chat renderer places.  A file without token types (the original ds4
 * finds these by spelling and ignores the types) still gets them as added
 * tokens; every other token is NORMAL. */
static const char *const CONTROL_SPELLINGS[] = {
    DS4_TOK_BOS,   DS4_TOK_EOS,       DS4_TOK_USER,    DS4_TOK_ASSISTANT, DS4_TOK_LATEST_REMINDER,
    DS4_TOK_THINK, DS4_TOK_THINK_END, DS4_DSML_MARKER,
};

static bool is_control_spelling(ds4_str s) {
    for (size_t k = 0; k < sizeof(CONTROL_SPELLINGS) / sizeof(CONTROL_SPELLINGS[0]); k++)
        if (ds4_str_eq(s, CONTROL_SPELLINGS[k])) return true;
    return false;
}

/* Types for a file that stores none: NORMAL, CONTROL for the spellings
 * above. */
static int default_types(const ds4_gguf_array *tokens, int32_t **types, ds4_err *err) {
    *types = malloc(sizeof(int32_t) * (tokens->count + 1));
    if (!*types) return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", KEY_TYPES);
    for (uint64_t i = 0; i < tokens->count; i++)
        (*types)[i] = is_control_spelling(tokens->strs[i]) ? DS4_TOKEN_CONTROL : DS4_TOKEN_NORMAL;
    return 0;
}

/* An optional token id: -1 when the key is absent. */
static int optional_id(const ds4_gguf *g, const char *key, int32_t *id, ds4_err *err) {
    *id = -1;
    if (!ds4_gguf_find_kv(g, key)) return 0;
    uint32_t v;
    if (ds4_gguf_get_u32(g, key, &v, err)) return -1;
    if (v > INT32_MAX) return ds4_err_set(err, DS4_ERANGE, "%s: %u is not a token id", key, v);
    *id = (int32_t)v;
    return 0;
}

static int read_src(const ds4_gguf *g, ds4_vocab_src *src, int32_t **types, char *pre, size_t pre_cap, ds4_err *err) {
    ds4_str model;
    if (ds4_gguf_get_str(g, KEY_MODEL, &model, err)) return -1;
    if (!ds4_str_eq(model, "gpt2"))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s is \"%.*s\", ds4 needs \"gpt2\" (byte-level BPE)", KEY_MODEL,
                           (int)(model.len > 64 ? 64 : model.len), model.ptr);
    src->pre = NULL;
    if (ds4_gguf_find_kv(g, KEY_PRE)) {
        ds4_str p;
        if (ds4_gguf_get_str(g, KEY_PRE, &p, err)) return -1;
        if (p.len >= pre_cap) return ds4_err_set(err, DS4_EUNSUPPORTED, "%s is too long", KEY_PRE);
        memcpy(pre, p.ptr, p.len);
        pre[p.len] = '\0';
        src->pre = pre;
    }
    const ds4_gguf_array *tokens, *merges, *ttypes = NULL;
    if (ds4_gguf_get_arr(g, KEY_TOKENS, DS4_GGUF_STRING, &tokens, err)) return -1;
    if (ds4_gguf_get_arr(g, KEY_MERGES, DS4_GGUF_STRING, &merges, err)) return -1;
    if (tokens->count > INT32_MAX || merges->count > INT32_MAX)
        return ds4_err_set(err, DS4_ERANGE, "%s / %s: too many entries", KEY_TOKENS, KEY_MERGES);
    if (ds4_gguf_find_kv(g, KEY_TYPES)) {
        if (ds4_gguf_get_arr(g, KEY_TYPES, DS4_GGUF_VTYPE_COUNT, &ttypes, err)) return -1;
        if (ttypes->count != tokens->count)
            return ds4_err_set(err, DS4_EFORMAT, "%s has %llu entries for %llu tokens", KEY_TYPES,
                               (unsigned long long)ttypes->count, (unsigned long long)tokens->count);
        if (ttypes->type == DS4_GGUF_STRING || ttypes->type == DS4_GGUF_F32 || ttypes->type == DS4_GGUF_F64 ||
            ttypes->type == DS4_GGUF_BOOL)
            return ds4_err_set(err, DS4_EFORMAT, "%s is an array of %s, expected integers", KEY_TYPES,
                               ds4_gguf_vtype_name(ttypes->type));
        *types = malloc(sizeof(int32_t) * (ttypes->count + 1));
        if (!*types) return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", KEY_TYPES);
        for (uint64_t i = 0; i < ttypes->count; i++) {
            int64_t t = ds4_gguf_arr_i64(ttypes, i);
            (*types)[i] = t < 0 || t > 255 ? -1 : (int32_t)t; /* vocab_new rejects -1 */
        }
    } else if (default_types(tokens, types, err)) {
        return -1;
    }
    src->n_tokens = (uint32_t)tokens->count;
    src->tokens = tokens->strs;
    src->types = *types;
    src->n_merges = (uint32_t)merges->count;
    src->merges = merges->strs;
    if (optional_id(g, KEY_BOS, &src->bos_id, err) || optional_id(g, KEY_EOS, &src->eos_id, err)) return -1;
    return 0;
}

ds4_vocab *ds4_vocab_from_gguf(const ds4_gguf *g, ds4_err *err) {
    ds4_vocab_src src = {0};
    int32_t *types = NULL;
    char pre[64];
    ds4_vocab *v = NULL;
    if (read_src(g, &src, &types, pre, sizeof(pre), err) == 0) v = ds4_vocab_new(&src, err);
    free(types);
    if (!v) ds4_err_prefix_path(err, g->path, "tokenizer");
    return v;
}
