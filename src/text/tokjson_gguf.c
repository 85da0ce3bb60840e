/*
 * tokjson_gguf.c - writing the imported tokenizer as GGUF metadata, the
 * keys and layout llama.cpp's converter gives ds4's model files:
 *
 *   tokenizer.ggml.model            "gpt2"
 *   tokenizer.ggml.pre              "joyai-llm"
 *   tokenizer.ggml.tokens           string[n]   (id = index)
 *   tokenizer.ggml.token_type       i32[n]      (1 normal, 3 control, 4 user-defined, 5 unused)
 *   tokenizer.ggml.merges           string[m]   ("LEFT RIGHT", rank = index)
 *   tokenizer.ggml.bos_token_id     u32
 *   tokenizer.ggml.eos_token_id     u32
 *   tokenizer.ggml.padding_token_id u32
 *   tokenizer.ggml.add_bos_token    bool
 *   tokenizer.ggml.add_eos_token    bool
 */
#include <stdlib.h>

#include "text/tokjson.h"

int ds4_tokjson_write_gguf(const ds4_tokjson *t, ds4_gguf_writer *w, ds4_err *err) {
    uint64_t n = t->n_tokens, m = t->n_merges;
    const char **strs = malloc(sizeof(char *) * (n > m ? n : m) + 1);
    uint64_t *lens = malloc(sizeof(uint64_t) * (n > m ? n : m) + 1);
    if (!strs || !lens) {
        free(strs);
        free(lens);
        return ds4_err_set(err, DS4_ENOMEM, "writing tokenizer metadata: out of memory");
    }
    /* The writer keeps its first error and reports it at close. */
    ds4_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    ds4_gguf_w_str(w, "tokenizer.ggml.pre", DS4_PRE_JOYAI);
    for (uint64_t i = 0; i < n; i++) {
        strs[i] = t->tokens[i].ptr;
        lens[i] = t->tokens[i].len;
    }
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", strs, lens, n);
    ds4_gguf_w_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, t->types, n);
    for (uint64_t i = 0; i < m; i++) {
        strs[i] = t->merges[i].ptr;
        lens[i] = t->merges[i].len;
    }
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", strs, lens, m);
    ds4_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)t->bos_id);
    ds4_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)t->eos_id);
    if (t->pad_id >= 0) ds4_gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)t->pad_id);
    ds4_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", t->add_bos);
    ds4_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", t->add_eos);
    free(strs);
    free(lens);
    return 0;
}

int ds4_tokjson_import(const char *json_path, const char *config_path, uint32_t min_vocab, const char *out_path,
                       ds4_err *err) {
    ds4_tokjson t;
    if (ds4_tokjson_load(json_path, config_path, min_vocab, &t, err)) return -1;
    /* Refuse to write what could not be loaded back. */
    ds4_vocab_src src = ds4_tokjson_src(&t);
    ds4_vocab *v = ds4_vocab_new(&src, err);
    if (!v) {
        ds4_tokjson_free(&t);
        return ds4_err_prefix(err, "%s", json_path);
    }
    ds4_vocab_free(v);
    ds4_gguf_writer *w = ds4_gguf_writer_open(out_path, 0, err);
    if (!w) {
        ds4_tokjson_free(&t);
        return -1;
    }
    int rc = ds4_tokjson_write_gguf(&t, w, err);
    if (rc) ds4_gguf_writer_abort(w);
    else rc = ds4_gguf_writer_close(w, err);
    ds4_tokjson_free(&t);
    return rc;
}
