/*
 * test_tok_unit.c - targeted tokenizer tests: UTF-8 and byte-level helpers,
 * the official vocabulary's layout (ids, token types, BOS/EOS), where
 * special tokens are and are not recognised, our definition for invalid
 * UTF-8, the streaming detokenizer's hold-back rules, the piece cache under
 * pressure, and the errors for malformed vocabularies and tokenizer.json.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "text/tokenizer.h"
#include "text/utf8.h"
#include "text_testdata.h"

static ds4_tokenizer *new_tok(void) {
    ds4_err err = {0};
    ds4_tokenizer *t = ds4_tokenizer_new(test_vocab(), &err);
    assert_non_null(t);
    return t;
}

static ds4_tokens encode(ds4_tokenizer *t, const char *s, size_t n, int transcript) {
    ds4_tokens out = {0};
    ds4_err err = {0};
    int rc = transcript ? ds4_tokenize_transcript(t, s, n, &out, &err) : ds4_tokenize_text(t, s, n, &out, &err);
    assert_int_equal(rc, 0);
    return out;
}

static void test_utf8_decoding(void **state) {
    (void)state;
    uint32_t cp;
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xC3\xA8", 2, &cp), 2);
    assert_int_equal(cp, 0xE8);
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xF0\x9F\x98\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x1F600);
    /* Overlong, surrogate, beyond U+10FFFF, truncated, stray continuation. */
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xC0\xAF", 2, &cp), 0);
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xE0\x80\xAF", 3, &cp), 0);
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xED\xA0\x80", 3, &cp), 0);
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xF4\x90\x80\x80", 4, &cp), 0);
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\xE2\x82", 2, &cp), 0);
    assert_int_equal(ds4_utf8_decode((const uint8_t *)"\x80", 1, &cp), 0);
    for (uint32_t c = 0; c < 0x110000; c += 97) {
        char b[4];
        int l = ds4_utf8_encode(c, b);
        if (c >= 0xD800 && c <= 0xDFFF) continue;
        assert_int_equal(ds4_utf8_decode((const uint8_t *)b, (size_t)l, &cp), l);
        assert_int_equal(cp, c);
    }
    assert_int_equal(ds4_utf8_valid_prefix((const uint8_t *)"ab\xC3\xA8\xFF", 5), 4);
    /* Incomplete tails a later byte could complete, and those it could not. */
    assert_int_equal(ds4_utf8_incomplete_tail((const uint8_t *)"x\xE2\x82", 3), 2);
    assert_int_equal(ds4_utf8_incomplete_tail((const uint8_t *)"x\xF0\x9F\x98", 4), 3);
    assert_int_equal(ds4_utf8_incomplete_tail((const uint8_t *)"x\xE0\x80", 3), 0);
    assert_int_equal(ds4_utf8_incomplete_tail((const uint8_t *)"x\xC3\xA8", 3), 0);
    assert_int_equal(ds4_utf8_invalid_len((const uint8_t *)"\xE2\x82"
                                                           "A",
                                          3),
                     2);
    assert_int_equal(ds4_utf8_invalid_len((const uint8_t *)"\xFF\x82", 2), 1);
}

static void test_bytelevel_alphabet(void **state) {
    (void)state;
    int seen[0x200] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = ds4_bytelevel_cp((uint8_t)b);
        assert_true(cp < 0x200);
        assert_int_equal(seen[cp]++, 0);
        assert_int_equal(ds4_bytelevel_byte(cp), b);
    }
    assert_int_equal(ds4_bytelevel_cp(' '), 0x120);  /* "Ġ" */
    assert_int_equal(ds4_bytelevel_cp('\n'), 0x10A); /* "Ċ" */
    assert_int_equal(ds4_bytelevel_cp(0), 0x100);
    assert_int_equal(ds4_bytelevel_cp(127), 0x121);
    assert_int_equal(ds4_bytelevel_cp(173), 0x143);
    assert_int_equal(ds4_bytelevel_cp('A'), 'A');
    assert_int_equal(ds4_bytelevel_byte(0x144), -1);
    assert_int_equal(ds4_bytelevel_byte(' '), -1); /* a raw space is not in the alphabet */
}

static void test_official_vocabulary_layout(void **state) {
    (void)state;
    const ds4_vocab *v = test_vocab();
    assert_int_equal(ds4_vocab_size(v), 129280);
    assert_int_equal(ds4_vocab_n_merges(v), 127741);
    assert_int_equal(ds4_vocab_bos(v), 0);
    assert_int_equal(ds4_vocab_eos(v), 1);
    int counts[8] = {0};
    for (int32_t id = 0; id < 129280; id++) counts[ds4_vocab_type(v, id)]++;
    /* llama.cpp's converter rules: 1277 control, these 6 user-defined. */
    assert_int_equal(counts[DS4_TOKEN_CONTROL], 1277);
    assert_int_equal(counts[DS4_TOKEN_USER_DEFINED], 6);
    assert_int_equal(counts[DS4_TOKEN_UNUSED], 0);
    assert_int_equal(counts[DS4_TOKEN_NORMAL], 129280 - 1283);
    static const struct {
        int32_t id;
        const char *s;
    } user[] = {
        {128821, "<think>"}, {128822, "</think>"}, {128825, "｜DSML｜"},
        {128840, "<dsml:"},  {128841, "</dsml:"},  {129265, "<｜/table>｜"},
    };
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(ds4_vocab_type(v, user[i].id), DS4_TOKEN_USER_DEFINED);
        assert_int_equal(ds4_vocab_find_added(v, user[i].s, strlen(user[i].s)), user[i].id);
    }
    static const struct {
        int32_t id;
        const char *s;
    } ctl[] = {
        {0, "<｜begin▁of▁sentence｜>"}, {1, "<｜end▁of▁sentence｜>"},      {128803, "<｜User｜>"},
        {128804, "<｜Assistant｜>"},    {128828, "<｜latest_reminder｜>"}, {128829, "<｜action｜>"},
        {129279, "<｜image｜>"},
    };
    for (size_t i = 0; i < sizeof(ctl) / sizeof(ctl[0]); i++) {
        assert_int_equal(ds4_vocab_type(v, ctl[i].id), DS4_TOKEN_CONTROL);
        assert_int_equal(ds4_vocab_find_added(v, ctl[i].s, strlen(ctl[i].s)), ctl[i].id);
        ds4_str b = ds4_vocab_token_bytes(v, ctl[i].id);
        assert_int_equal(b.len, strlen(ctl[i].s));
        assert_memory_equal(b.ptr, ctl[i].s, b.len);
    }
    /* A normal token is stored byte-level and decodes to raw bytes. */
    int32_t id = ds4_vocab_find(v, "Ġworld", strlen("Ġworld"));
    assert_int_equal(id, 2058);
    ds4_str b = ds4_vocab_token_bytes(v, id);
    assert_int_equal(b.len, 6);
    assert_memory_equal(b.ptr, " world", 6);
    assert_int_equal(ds4_vocab_find_added(v, "Ġworld", strlen("Ġworld")), -1);
}

/* Digest of n strings joined by NUL (as tok_goldens.py writes them). */
static void strings_sha(const ds4_str *s, size_t n, char out[65]) {
    ds4_strbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (i) ds4_strbuf_putc(&b, '\0');
        ds4_strbuf_append(&b, s[i].ptr, s[i].len);
    }
    test_sha256_hex(b.p, b.len, out);
    ds4_strbuf_free(&b);
}

/* The importer's arrays equal llama.cpp's converter layout, re-derived
 * independently in Python (tok_goldens.py "gguf" lines). */
static void test_import_layout_matches_llama_cpp(void **state) {
    (void)state;
    ds4_tokjson tj;
    ds4_err err = {0};
    assert_int_equal(ds4_tokjson_load(TEST_TOKENIZER_JSON, TEST_TOKENIZER_CONFIG, 129280, &tj, &err), 0);
    size_t len;
    char *gold = test_read_file("tests/golden/text/tok_goldens.txt", &len);
    char sha[65], want[65];
    size_t count;
    const char *line = strstr(gold, "\ngguf tokens ");
    assert_non_null(line);
    assert_int_equal(sscanf(line, "\ngguf tokens %zu %64s", &count, want), 2);
    assert_int_equal(count, tj.n_tokens);
    strings_sha(tj.tokens, tj.n_tokens, sha);
    assert_string_equal(sha, want);
    line = strstr(gold, "\ngguf types ");
    assert_non_null(line);
    assert_int_equal(sscanf(line, "\ngguf types %zu %64s", &count, want), 2);
    test_sha256_hex(tj.types, tj.n_tokens * sizeof(int32_t), sha);
    assert_string_equal(sha, want);
    line = strstr(gold, "\ngguf merges ");
    assert_non_null(line);
    assert_int_equal(sscanf(line, "\ngguf merges %zu %64s", &count, want), 2);
    assert_int_equal(count, tj.n_merges);
    strings_sha(tj.merges, tj.n_merges, sha);
    assert_string_equal(sha, want);
    assert_int_equal(tj.bos_id, 0);
    assert_int_equal(tj.eos_id, 1);
    assert_int_equal(tj.pad_id, 1);
    assert_false(tj.add_bos);
    assert_false(tj.add_eos);
    free(gold);
    ds4_tokjson_free(&tj);
}

static void test_specials_only_where_placed(void **state) {
    (void)state;
    ds4_tokenizer *t = new_tok();
    const char *s = "hi <｜Assistant｜></think>｜DSML｜";
    ds4_tokens plain = encode(t, s, strlen(s), 0);
    for (size_t i = 0; i < plain.n; i++) assert_true(ds4_vocab_type(test_vocab(), plain.ids[i]) == DS4_TOKEN_NORMAL);
    ds4_tokens trans = encode(t, s, strlen(s), 1);
    int32_t want[] = {6366, 223, 128804, 128822, 128825};
    assert_int_equal(trans.n, 5);
    assert_memory_equal(trans.ids, want, sizeof(want));

    /* Segments: the renderer's special token, then user text spelling it. */
    const char *text = "<think><think>";
    ds4_segment segs[] = {{DS4_SEG_SPECIAL, 0, 7}, {DS4_SEG_TEXT, 7, 7}};
    ds4_tokens out = {0};
    ds4_err err = {0};
    assert_int_equal(ds4_tokenize_segments(t, text, segs, 2, &out, &err), 0);
    assert_int_equal(out.ids[0], 128821);
    ds4_tokens user = encode(t, "<think>", 7, 0);
    assert_true(user.n > 1);
    assert_int_equal(out.n, 1 + user.n);
    assert_memory_equal(out.ids + 1, user.ids, user.n * sizeof(int32_t));

    /* Plain text runs on across segments into trusted text, which
     * recognises added tokens: the same as one transcript string. */
    const char *mixed = "hello world<think>x";
    ds4_segment mseg[] = {{DS4_SEG_TEXT, 0, 9}, {DS4_SEG_TRUSTED, 9, 10}};
    out.n = 0;
    assert_int_equal(ds4_tokenize_segments(t, mixed, mseg, 2, &out, &err), 0);
    ds4_tokens whole = encode(t, mixed, strlen(mixed), 1);
    assert_int_equal(out.n, whole.n);
    assert_memory_equal(out.ids, whole.ids, whole.n * sizeof(int32_t));
    ds4_tokens_free(&whole);

    /* Segments must tile the text in order. */
    ds4_segment gap[] = {{DS4_SEG_TEXT, 0, 3}, {DS4_SEG_TEXT, 5, 2}};
    assert_int_equal(ds4_tokenize_segments(t, text, gap, 2, &out, &err), -1);
    assert_int_equal(err.code, DS4_EINVAL);

    /* A SPECIAL segment must name an added token exactly. */
    ds4_segment bad[] = {{DS4_SEG_SPECIAL, 0, 6}};
    out.n = 0;
    assert_int_equal(ds4_tokenize_segments(t, text, bad, 1, &out, &err), -1);
    assert_int_equal(err.code, DS4_ENOTFOUND);
    assert_non_null(strstr(err.msg, "<think"));
    ds4_tokens_free(&plain);
    ds4_tokens_free(&trans);
    ds4_tokens_free(&user);
    ds4_tokens_free(&out);
    ds4_tokenizer_free(t);
}

static void test_invalid_utf8_is_bytewise(void **state) {
    (void)state;
    ds4_tokenizer *t = new_tok();
    const ds4_vocab *v = test_vocab();
    const char s[] = "abc\xFF"
                     "def\xE2\x82";
    ds4_tokens got = encode(t, s, sizeof(s) - 1, 0);
    ds4_tokens a = encode(t, "abc", 3, 0), d = encode(t, "def", 3, 0);
    ds4_tokens want = {0};
    ds4_tokens_append(&want, a.ids, a.n);
    ds4_tokens_push(&want, ds4_vocab_byte_id(v, 0xFF));
    ds4_tokens_append(&want, d.ids, d.n);
    ds4_tokens_push(&want, ds4_vocab_byte_id(v, 0xE2));
    ds4_tokens_push(&want, ds4_vocab_byte_id(v, 0x82));
    assert_int_equal(got.n, want.n);
    assert_memory_equal(got.ids, want.ids, got.n * sizeof(int32_t));

    /* Exact round trip; lossy decoding replaces maximal subparts. */
    ds4_strbuf raw = {0}, lossy = {0};
    ds4_err err = {0};
    assert_int_equal(ds4_detokenize(v, got.ids, got.n, &raw, &err), 0);
    assert_int_equal(raw.len, sizeof(s) - 1);
    assert_memory_equal(raw.p, s, raw.len);
    ds4_detok_stream st;
    ds4_detok_stream_init(&st, v, true);
    for (size_t i = 0; i < got.n; i++) assert_int_equal(ds4_detok_stream_push(&st, got.ids[i], &lossy, &err), 0);
    ds4_detok_stream_finish(&st, &lossy);
    assert_string_equal(lossy.p, "abc\xEF\xBF\xBD"
                                 "def\xEF\xBF\xBD");
    ds4_strbuf_free(&raw);
    ds4_strbuf_free(&lossy);
    ds4_tokens_free(&got);
    ds4_tokens_free(&a);
    ds4_tokens_free(&d);
    ds4_tokens_free(&want);
    ds4_tokenizer_free(t);
}

static void test_stream_holds_back_partial_characters(void **state) {
    (void)state;
    const ds4_vocab *v = test_vocab();
    ds4_err err = {0};
    /* "é😀" fed one byte-token at a time. */
    const uint8_t bytes[] = {0xC3, 0xA9, 0xF0, 0x9F, 0x98, 0x80, 'x'};
    const size_t expect_len[] = {0, 2, 2, 2, 2, 6, 7};
    for (int lossy = 0; lossy < 2; lossy++) {
        ds4_detok_stream st;
        ds4_detok_stream_init(&st, v, lossy);
        ds4_strbuf out = {0};
        for (size_t i = 0; i < sizeof(bytes); i++) {
            assert_int_equal(ds4_detok_stream_push(&st, ds4_vocab_byte_id(v, bytes[i]), &out, &err), 0);
            assert_int_equal(out.len, expect_len[i]);
        }
        ds4_detok_stream_finish(&st, &out);
        assert_int_equal(out.len, 7);
        assert_memory_equal(out.p, bytes, 7);
        ds4_strbuf_free(&out);
    }
    /* A held start that the next byte breaks is flushed, then the byte. */
    ds4_detok_stream st;
    ds4_detok_stream_init(&st, v, false);
    ds4_strbuf out = {0};
    ds4_detok_stream_bytes(&st, "\xF0\x9F", 2, &out);
    assert_int_equal(out.len, 0);
    ds4_detok_stream_bytes(&st, "A\xE2", 2, &out);
    assert_int_equal(out.len, 3);
    assert_memory_equal(out.p,
                        "\xF0\x9F"
                        "A",
                        3);
    ds4_detok_stream_finish(&st, &out);
    assert_int_equal(out.len, 4);
    ds4_strbuf_free(&out);
    ds4_detok_stream_init(&st, v, true);
    ds4_detok_stream_bytes(&st, "\xF0\x9F", 2, &out);
    ds4_detok_stream_bytes(&st, "A", 1, &out);
    assert_string_equal(out.p, "\xEF\xBF\xBD"
                               "A");
    ds4_strbuf_free(&out);
    /* Out-of-range ids are errors, not crashes. */
    assert_int_equal(ds4_detok_stream_push(&st, 129280, &out, &err), -1);
    assert_int_equal(err.code, DS4_ERANGE);
    int32_t bad = -5;
    assert_int_equal(ds4_detokenize(v, &bad, 1, &out, &err), -1);
    ds4_strbuf_free(&out);
}

/* More distinct pieces than the cache holds: results stay identical. */
static void test_cache_pressure(void **state) {
    (void)state;
    ds4_strbuf text = {0};
    char w[8];
    for (int i = 0; i < 90000; i++) {
        int x = i * 7919 % 456976;
        for (int k = 0; k < 4; k++, x /= 26) w[k] = (char)('a' + x % 26);
        w[4] = ' ';
        ds4_strbuf_append(&text, w, 5);
    }
    ds4_tokenizer *t = new_tok();
    ds4_tokens first = encode(t, text.p, text.len, 0);
    ds4_tokens second = encode(t, text.p, text.len, 0);
    ds4_tokenizer_free(t);
    t = new_tok();
    /* From the space before a word: the pieces there are the same as in the
     * whole text (" word"). */
    size_t cut = text.len / 2 - 1;
    ds4_tokens tail = encode(t, text.p + cut, text.len - cut, 0);
    assert_int_equal(first.n, second.n);
    assert_memory_equal(first.ids, second.ids, first.n * sizeof(int32_t));
    /* The second half tokenizes alike with a cold cache. */
    assert_true(tail.n <= first.n);
    assert_memory_equal(first.ids + first.n - tail.n, tail.ids, tail.n * sizeof(int32_t));
    ds4_tokens_free(&first);
    ds4_tokens_free(&second);
    ds4_tokens_free(&tail);
    ds4_tokenizer_free(t);
    ds4_strbuf_free(&text);
}

static void test_empty_and_nul(void **state) {
    (void)state;
    ds4_tokenizer *t = new_tok();
    ds4_tokens e = encode(t, "", 0, 0);
    assert_int_equal(e.n, 0);
    ds4_tokens n = encode(t, "a\0b", 3, 1);
    ds4_strbuf out = {0};
    ds4_err err = {0};
    assert_int_equal(ds4_detokenize(test_vocab(), n.ids, n.n, &out, &err), 0);
    assert_int_equal(out.len, 3);
    assert_memory_equal(out.p, "a\0b", 3);
    ds4_strbuf_free(&out);
    ds4_tokens_free(&e);
    ds4_tokens_free(&n);
    ds4_tokenizer_free(t);
}

static ds4_vocab *small_vocab(const char *const *toks, const int32_t *types, uint32_t n, const char *const *merges,
                              uint32_t nm, const char *pre, ds4_err *err) {
    ds4_str ts[16], ms[16];
    for (uint32_t i = 0; i < n; i++) ts[i] = (ds4_str){toks[i], strlen(toks[i])};
    for (uint32_t i = 0; i < nm; i++) ms[i] = (ds4_str){merges[i], strlen(merges[i])};
    ds4_vocab_src src = {n, ts, types, nm, ms, 0, 1, pre};
    return ds4_vocab_new(&src, err);
}

/* A limit stops tokenization past it (DS4_ERANGE), however long the text;
 * below it the result is the unlimited one. */
static void test_limit(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_tokenizer *t = ds4_tokenizer_new(test_vocab(), &err);
    size_t n = 4 << 20;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++) text[i] = "ab cd "[i % 6];
    text[n] = 0;
    ds4_tokens all = {0}, some = {0};
    assert_int_equal(ds4_tokenize_text(t, text, 6000, &all, &err), 0);
    ds4_tokenizer_set_limit(t, all.n);
    assert_int_equal(ds4_tokenize_text(t, text, 6000, &some, &err), 0);
    assert_int_equal(some.n, all.n);
    assert_memory_equal(some.ids, all.ids, all.n * sizeof(int32_t));
    ds4_tokens_free(&some);
    ds4_tokenizer_set_limit(t, 1000);
    assert_int_equal(ds4_tokenize_text(t, text, n, &some, &err), -1);
    assert_int_equal(err.code, DS4_ERANGE);
    assert_true(some.n > 1000 && some.n < 1100); /* it stopped right there */
    ds4_tokens_free(&some);
    ds4_tokenizer_set_limit(t, 0);
    ds4_tokens_free(&all);
    free(text);
    ds4_tokenizer_free(t);
}

static void test_vocab_errors(void **state) {
    (void)state;
    const char *toks[] = {"<s>", "</s>", "a", "b", "ab", "[PAD5]"};
    const int32_t types[] = {3, 3, 1, 1, 1, 5};
    ds4_err err = {0};
    const char *good[] = {"a b"};
    ds4_vocab *v = small_vocab(toks, types, 6, good, 1, NULL, &err);
    assert_non_null(v);
    int32_t rank, merged;
    assert_true(ds4_vocab_merge(v, 2, 3, &rank, &merged));
    assert_int_equal(rank, 0);
    assert_int_equal(merged, 4);
    assert_false(ds4_vocab_merge(v, 3, 2, &rank, &merged));
    assert_int_equal(ds4_vocab_token_bytes(v, 5).len, 0); /* UNUSED decodes to nothing */
    ds4_vocab_free(v);

    const char *missing[] = {"a c"};
    assert_null(small_vocab(toks, types, 6, missing, 1, NULL, &err));
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_non_null(strstr(err.msg, "merge 0"));
    const char *unmerged[] = {"b a"};
    assert_null(small_vocab(toks, types, 6, unmerged, 1, NULL, &err));
    assert_non_null(strstr(err.msg, "merged token"));
    const char *spaces[] = {"a  b"};
    assert_null(small_vocab(toks, types, 6, spaces, 1, NULL, &err));
    assert_non_null(strstr(err.msg, "one space"));
    assert_null(small_vocab(toks, types, 6, good, 1, "gpt2", &err));
    assert_int_equal(err.code, DS4_EUNSUPPORTED);
    const int32_t bad_types[] = {3, 3, 1, 1, 9, 5};
    assert_null(small_vocab(toks, bad_types, 6, good, 1, NULL, &err));
    assert_non_null(strstr(err.msg, "token 4"));
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

/* clang-format off */
#define PRE_OK                                                                                                  \
    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["                                              \
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}{1,3}\"},\"behavior\":\"Isolated\",\"invert\":false},"     \
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[一-龥぀-ゟ゠-ヿ]+\"},\"behavior\":\"Isolated\",\"invert\":false}," \
    "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[!\\\"#$%&'()*+,\\\\-./:;<=>?@\\\\[\\\\\\\\\\\\]^_`{|}~][A-Za-z]+|"   \
    "[^\\r\\n\\\\p{L}\\\\p{P}\\\\p{S}]?[\\\\p{L}\\\\p{M}]+| ?[\\\\p{P}\\\\p{S}]+[\\r\\n]*|\\\\s*[\\r\\n]+|\\\\s+(?!\\\\S)|"   \
    "\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"                                                   \
    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]}"
/* clang-format on */

/* A small tokenizer.json: a gap at id 4, a user-defined token with "▁". */
static void test_tokjson_layout_and_errors(void **state) {
    (void)state;
    char dir[] = "/tmp/ds4-tokjson-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], bad[256];
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    snprintf(bad, sizeof(bad), "%s/bad.json", dir);
    write_file(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":2,\"b\":3,\"ab\":5},\"merges\":[[\"a\",\"b\"]]},"
                     "\"added_tokens\":[{\"id\":0,\"content\":\"<｜begin▁of▁sentence｜>\",\"special\":true},"
                     "{\"id\":1,\"content\":\"<｜end▁of▁sentence｜>\",\"special\":true},"
                     "{\"id\":6,\"content\":\"<my▁tok>\",\"special\":false},"
                     "{\"id\":7,\"content\":\"<|EOT|>\",\"special\":false}]," PRE_OK "}");
    ds4_tokjson tj;
    ds4_err err = {0};
    assert_int_equal(ds4_tokjson_load(path, NULL, 10, &tj, &err), 0);
    assert_int_equal(tj.n_tokens, 10);
    assert_int_equal(tj.bos_id, 0);
    assert_int_equal(tj.eos_id, 1);
    assert_int_equal(tj.pad_id, 1);
    static const char *const want[] = {"<｜begin▁of▁sentence｜>",
                                       "<｜end▁of▁sentence｜>",
                                       "a",
                                       "b",
                                       "[PAD4]",
                                       "ab",
                                       "<my tok>",
                                       "<|EOT|>",
                                       "[PAD8]",
                                       "[PAD9]"};
    static const int32_t want_type[] = {3, 3, 1, 1, 5, 1, 4, 3, 5, 5};
    for (int i = 0; i < 10; i++) {
        assert_int_equal(tj.tokens[i].len, strlen(want[i]));
        assert_memory_equal(tj.tokens[i].ptr, want[i], tj.tokens[i].len);
        assert_int_equal(tj.types[i], want_type[i]);
    }
    assert_int_equal(tj.n_merges, 1);
    assert_memory_equal(tj.merges[0].ptr, "a b", 3);
    ds4_vocab_src src = ds4_tokjson_src(&tj);
    ds4_vocab *v = ds4_vocab_new(&src, &err);
    assert_non_null(v);
    ds4_vocab_free(v);
    ds4_tokjson_free(&tj);

    /* A different pre-tokenizer is refused, not silently mis-tokenized. */
    write_file(bad, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":"
                    "{\"type\":\"ByteLevel\",\"add_prefix_space\":false}}");
    assert_int_equal(ds4_tokjson_load(bad, NULL, 0, &tj, &err), -1);
    assert_int_equal(err.code, DS4_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "bad.json"));
    write_file(bad, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\"]]}," PRE_OK "}");
    assert_int_equal(ds4_tokjson_load(bad, NULL, 0, &tj, &err), -1);
    assert_non_null(strstr(err.msg, "merges[0]"));
    write_file(bad, "{\"model\":");
    assert_int_equal(ds4_tokjson_load(bad, NULL, 0, &tj, &err), -1);
    assert_int_equal(err.code, DS4_EFORMAT);
    assert_int_equal(ds4_tokjson_load("/nonexistent/tokenizer.json.xz", NULL, 0, &tj, &err), -1);
    unlink(path);
    unlink(bad);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_decoding),
        cmocka_unit_test(test_bytelevel_alphabet),
        cmocka_unit_test(test_official_vocabulary_layout),
        cmocka_unit_test(test_import_layout_matches_llama_cpp),
        cmocka_unit_test(test_specials_only_where_placed),
        cmocka_unit_test(test_invalid_utf8_is_bytewise),
        cmocka_unit_test(test_stream_holds_back_partial_characters),
        cmocka_unit_test(test_cache_pressure),
        cmocka_unit_test(test_empty_and_nul),
        cmocka_unit_test(test_vocab_errors),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_tokjson_layout_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
