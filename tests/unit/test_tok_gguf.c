/*
 * test_tok_gguf.c - the tokenizer through GGUF metadata: importing the
 * official tokenizer.json writes the tokenizer.ggml.* keys; reading them
 * back gives the same vocabulary (every token, type, decoded form and
 * merge) and the same token ids; malformed tokenizer metadata is refused
 * with a message naming the key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "format/gguf.h"
#include "text/chat.h"
#include "text/dsml_render.h"
#include "text/rendered.h"
#include "text/tokenizer.h"
#include "text_testdata.h"

static char tmpdir[] = "/tmp/ds4-tokgguf-XXXXXX";

static void path_in_tmp(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

static void test_import_round_trip(void **state) {
    (void)state;
    char path[256];
    path_in_tmp(path, sizeof(path), "tok.gguf");
    ds4_err err = {0};
    assert_int_equal(ds4_tokjson_import(TEST_TOKENIZER_JSON, TEST_TOKENIZER_CONFIG, 129280, path, &err), 0);
    ds4_gguf *g = ds4_gguf_open(path, &err);
    assert_non_null(g);
    ds4_str s;
    assert_int_equal(ds4_gguf_get_str(g, "tokenizer.ggml.model", &s, &err), 0);
    assert_true(ds4_str_eq(s, "gpt2"));
    assert_int_equal(ds4_gguf_get_str(g, "tokenizer.ggml.pre", &s, &err), 0);
    assert_true(ds4_str_eq(s, "joyai-llm"));
    uint32_t id;
    assert_int_equal(ds4_gguf_get_u32(g, "tokenizer.ggml.padding_token_id", &id, &err), 0);
    assert_int_equal(id, 1);
    bool b = true;
    assert_int_equal(ds4_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b, &err), 0);
    assert_false(b);

    ds4_vocab *v = ds4_vocab_from_gguf(g, &err);
    assert_non_null(v);
    const ds4_vocab *ref = test_vocab();
    assert_int_equal(ds4_vocab_size(v), ds4_vocab_size(ref));
    assert_int_equal(ds4_vocab_n_merges(v), ds4_vocab_n_merges(ref));
    assert_int_equal(ds4_vocab_bos(v), 0);
    assert_int_equal(ds4_vocab_eos(v), 1);
    for (int32_t i = 0; i < (int32_t)ds4_vocab_size(v); i++) {
        ds4_str a = ds4_vocab_token(v, i), r = ds4_vocab_token(ref, i);
        assert_int_equal(a.len, r.len);
        assert_memory_equal(a.ptr, r.ptr, a.len);
        assert_int_equal(ds4_vocab_type(v, i), ds4_vocab_type(ref, i));
        a = ds4_vocab_token_bytes(v, i);
        r = ds4_vocab_token_bytes(ref, i);
        assert_int_equal(a.len, r.len);
        assert_memory_equal(a.ptr, r.ptr, a.len);
    }
    /* Same ids on a slice of the corpus, in both modes. */
    size_t n_docs;
    char *blob;
    test_doc *docs = test_corpus(&n_docs, &blob);
    ds4_tokenizer *ta = ds4_tokenizer_new(v, &err), *tb = ds4_tokenizer_new(ref, &err);
    for (size_t i = 0; i < n_docs; i += 7) {
        ds4_tokens x = {0}, y = {0};
        assert_int_equal(ds4_tokenize_transcript(ta, docs[i].data, docs[i].len, &x, &err), 0);
        assert_int_equal(ds4_tokenize_transcript(tb, docs[i].data, docs[i].len, &y, &err), 0);
        assert_int_equal(x.n, y.n);
        assert_memory_equal(x.ids, y.ids, x.n * sizeof(int32_t));
        ds4_tokens_free(&x);
        ds4_tokens_free(&y);
    }
    ds4_tokenizer_free(ta);
    ds4_tokenizer_free(tb);
    free(docs);
    free(blob);
    ds4_vocab_free(v);
    ds4_gguf_close(g);
    unlink(path);
}

/* A small GGUF with tokenizer metadata, optionally broken by `mode`. */
static void write_small(const char *path, int mode) {
    ds4_err err = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_non_null(w);
    const char *tokens[] = {"<s>", "</s>", "a", "b", "ab"};
    const int32_t types[] = {3, 3, 1, 1, 1};
    const char *merges[] = {"a b"};
    ds4_gguf_w_str(w, "tokenizer.ggml.model", mode == 1 ? "llama" : "gpt2");
    ds4_gguf_w_str(w, "tokenizer.ggml.pre", mode == 2 ? "qwen2" : "joyai-llm");
    if (mode != 3) ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, 5);
    ds4_gguf_w_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, types, mode == 4 ? 4 : 5);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1);
    ds4_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 0);
    ds4_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", mode == 5 ? 9 : 1);
    assert_int_equal(ds4_gguf_writer_close(w, &err), 0);
}

static void test_bad_metadata(void **state) {
    (void)state;
    static const struct {
        int mode;
        ds4_errcode code;
        const char *needle;
    } cases[] = {
        {0, DS4_OK, NULL},
        {1, DS4_EUNSUPPORTED, "tokenizer.ggml.model"},
        {2, DS4_EUNSUPPORTED, "qwen2"},
        {3, DS4_ENOTFOUND, "tokenizer.ggml.tokens"},
        {4, DS4_EFORMAT, "tokenizer.ggml.token_type"},
        {5, DS4_ERANGE, "EOS"},
    };
    char path[256];
    path_in_tmp(path, sizeof(path), "small.gguf");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_small(path, cases[i].mode);
        ds4_err err = {0};
        ds4_gguf *g = ds4_gguf_open(path, &err);
        assert_non_null(g);
        ds4_vocab *v = ds4_vocab_from_gguf(g, &err);
        if (cases[i].code == DS4_OK) {
            assert_non_null(v);
            assert_int_equal(ds4_vocab_size(v), 5);
        } else {
            assert_null(v);
            assert_int_equal(err.code, cases[i].code);
            if (!strstr(err.msg, cases[i].needle) || !strstr(err.msg, "small.gguf"))
                fail_msg("case %zu: \"%s\"", i, err.msg);
        }
        ds4_vocab_free(v);
        ds4_gguf_close(g);
    }
    unlink(path);
}

/* Without tokenizer.ggml.token_type the DeepSeek V4 control tokens are
 * found by spelling (as the original ds4 does) and the rendered chat
 * markers become their ids; everything else is NORMAL. */
static void test_types_absent(void **state) {
    (void)state;
    char path[256];
    path_in_tmp(path, sizeof(path), "untyped.gguf");
    ds4_err err = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_non_null(w);
    const char *tokens[] = {DS4_TOK_BOS,
                            DS4_TOK_EOS,
                            "a",
                            "b",
                            "ab",
                            DS4_TOK_USER,
                            DS4_TOK_ASSISTANT,
                            DS4_TOK_THINK,
                            DS4_TOK_THINK_END,
                            DS4_DSML_MARKER,
                            DS4_TOK_LATEST_REMINDER,
                            "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>"};
    enum { N = sizeof(tokens) / sizeof(tokens[0]) };
    const char *merges[] = {"a b"};
    ds4_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, N);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1);
    assert_int_equal(ds4_gguf_writer_close(w, &err), 0);

    ds4_gguf *g = ds4_gguf_open(path, &err);
    assert_non_null(g);
    ds4_vocab *v = ds4_vocab_from_gguf(g, &err);
    if (!v) fail_msg("%s", err.msg);
    for (int32_t i = 0; i < N; i++) {
        bool control = i < 2 || (i >= 5 && i <= 10);
        assert_int_equal(ds4_vocab_type(v, i), control ? DS4_TOKEN_CONTROL : DS4_TOKEN_NORMAL);
        assert_int_equal(ds4_vocab_find_added(v, tokens[i], strlen(tokens[i])), control ? i : -1);
    }
    /* A rendered special segment (what failed with "is not a special token
     * of this vocabulary") now tokenizes to its id. */
    ds4_tokenizer *t = ds4_tokenizer_new(v, &err);
    assert_non_null(t);
    ds4_rendered r = {0};
    ds4_rendered_special(&r, DS4_TOK_BOS);
    ds4_rendered_puts(&r, "ab");
    ds4_rendered_special(&r, DS4_TOK_USER);
    assert_int_equal(ds4_rendered_check(&r, &err), 0);
    ds4_tokens ids = {0};
    if (ds4_tokenize_segments(t, r.text.p, r.segs, r.n_segs, &ids, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(ids.n, 3);
    assert_int_equal(ids.ids[0], 0);
    assert_int_equal(ids.ids[1], 4);
    assert_int_equal(ids.ids[2], 5);
    ds4_tokens_free(&ids);
    ds4_rendered_free(&r);
    ds4_tokenizer_free(t);
    ds4_vocab_free(v);
    ds4_gguf_close(g);
    unlink(path);
}

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return rmdir(tmpdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_import_round_trip),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_types_absent),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
