/*
 * test_tok_hf.c - the tokenizer against HF `tokenizers` on the official
 * tokenizer.json: token ids of a 2.5 MB multilingual corpus (plain and
 * transcript modes), an exhaustive probe of every Unicode code point, and
 * HF's decode of random id sequences.  Goldens: tests/golden/text/
 * tok_goldens.txt, written by tests/reference/tok_goldens.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "text/tokenizer.h"
#include "text/utf8.h"
#include "text_testdata.h"

#define GOLDENS "tests/golden/text/tok_goldens.txt"

static void ids_sha(const int32_t *ids, size_t n, char out[65]) {
    /* The goldens hash little-endian int32; so does this (x86/ARM). */
    test_sha256_hex(ids, n * sizeof(int32_t), out);
}

static const test_doc *find_doc(const test_doc *docs, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(docs[i].name, name) == 0) return &docs[i];
    return NULL;
}

/* Print where a token sequence departs from the golden's first ids. */
static void report_first_ids(const char *name, const int32_t *ids, size_t n, const char *first) {
    size_t i = 0;
    const char *p = first;
    while (*p && *p != '-' && i < n) {
        long want = strtol(p, (char **)&p, 10);
        if (want != ids[i]) {
            print_error("%s: first difference at token %zu: got %d, HF %ld\n", name, i, ids[i], want);
            return;
        }
        i++;
        if (*p == ',') p++;
    }
    print_error("%s: first %zu ids agree; difference is further on\n", name, i);
}

static void test_corpus_ids_match_hf(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_tokenizer *t = ds4_tokenizer_new(test_vocab(), &err);
    assert_non_null(t);
    size_t n_docs;
    char *blob;
    test_doc *docs = test_corpus(&n_docs, &blob);
    size_t len;
    char *gold = test_read_file(GOLDENS, &len);
    int checked = 0, failures = 0;
    for (char *line = strtok(gold, "\n"); line; line = strtok(NULL, "\n")) {
        char name[96], sha_p[65], sha_t[65], first[1024], nt[32];
        size_t np;
        if (sscanf(line, "doc %95s %zu %64s %31s %64s %1023s", name, &np, sha_p, nt, sha_t, first) != 6) continue;
        const test_doc *d = find_doc(docs, n_docs, name);
        assert_non_null(d);
        ds4_tokens out = {0};
        assert_int_equal(ds4_tokenize_text(t, d->data, d->len, &out, &err), 0);
        char got[65];
        ids_sha(out.ids, out.n, got);
        if (out.n != np || strcmp(got, sha_p) != 0) {
            print_error("%s (plain): %zu ids, HF %zu\n", name, out.n, np);
            report_first_ids(name, out.ids, out.n, first);
            failures++;
        }
        if (strcmp(nt, "-") != 0) {
            out.n = 0;
            assert_int_equal(ds4_tokenize_transcript(t, d->data, d->len, &out, &err), 0);
            ids_sha(out.ids, out.n, got);
            if (out.n != strtoul(nt, NULL, 10) || strcmp(got, sha_t) != 0) {
                print_error("%s (transcript): %zu ids, HF %s\n", name, out.n, nt);
                failures++;
            }
        }
        ds4_tokens_free(&out);
        checked++;
    }
    assert_int_equal(checked, (int)n_docs);
    assert_int_equal(failures, 0);
    free(gold);
    free(docs);
    free(blob);
    ds4_tokenizer_free(t);
}

/* Same probe as tok_goldens.py. */
static size_t probe(uint32_t cp, char *out) {
    static const char *const parts[] = {"a", ".", " x", "1", "\n", " ", "A", "一", NULL};
    char c[4];
    int cl = ds4_utf8_encode(cp, c);
    size_t n = 0;
    for (int i = 0; parts[i]; i++) {
        size_t pl = strlen(parts[i]);
        memcpy(out + n, parts[i], pl);
        n += pl;
        memcpy(out + n, c, (size_t)cl);
        n += (size_t)cl;
        if (i == 0) { /* "a" + c + c */
            memcpy(out + n, c, (size_t)cl);
            n += (size_t)cl;
        }
    }
    return n;
}

static void test_every_code_point_matches_hf(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_tokenizer *t = ds4_tokenizer_new(test_vocab(), &err);
    assert_non_null(t);
    size_t len;
    char *gold = test_read_file(GOLDENS, &len);
    int blocks = 0, failures = 0;
    ds4_tokens ids = {0};
    for (char *line = strtok(gold, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned block;
        char sha[65];
        if (sscanf(line, "probe %u %64s", &block, sha) != 2) continue;
        ids.n = 0;
        for (uint32_t cp = block * 4096u; cp < block * 4096u + 4096u; cp++) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            char text[64];
            size_t n = probe(cp, text);
            assert_int_equal(ds4_tokenize_text(t, text, n, &ids, &err), 0);
            ds4_tokens_push(&ids, -1);
        }
        char got[65];
        ids_sha(ids.ids, ids.n, got);
        if (strcmp(got, sha) != 0) {
            print_error("code points U+%04X..U+%04X tokenize differently from HF\n", block * 4096u,
                        block * 4096u + 4095u);
            failures++;
        }
        blocks++;
    }
    assert_int_equal(blocks, 0x110000 / 4096);
    assert_int_equal(failures, 0);
    ds4_tokens_free(&ids);
    free(gold);
    ds4_tokenizer_free(t);
}

static void test_decode_matches_hf(void **state) {
    (void)state;
    const ds4_vocab *v = test_vocab();
    size_t len;
    char *gold = test_read_file(GOLDENS, &len);
    int checked = 0;
    for (char *line = strtok(gold, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "decode ", 7) != 0) continue;
        int32_t ids[64];
        size_t n = 0;
        char *p = line + 7;
        while (*p && *p != ' ') {
            ids[n++] = (int32_t)strtol(p, &p, 10);
            if (*p == ',') p++;
        }
        const char *sha = p + 1;
        /* Lossy streaming, one token at a time: HF's from_utf8_lossy. */
        ds4_detok_stream s;
        ds4_detok_stream_init(&s, v, true);
        ds4_strbuf out = {0};
        ds4_err err = {0};
        for (size_t i = 0; i < n; i++) {
            size_t before = out.len;
            assert_int_equal(ds4_detok_stream_push(&s, ids[i], &out, &err), 0);
            /* Every chunk is whole characters. */
            assert_int_equal(ds4_utf8_valid_prefix((const uint8_t *)out.p + before, out.len - before),
                             out.len - before);
        }
        ds4_detok_stream_finish(&s, &out);
        char got[65];
        test_sha256_hex(out.p ? out.p : "", out.len, got);
        assert_string_equal(got, sha);
        /* Raw streaming concatenates to the exact bytes. */
        ds4_strbuf raw = {0}, whole = {0};
        ds4_detok_stream_init(&s, v, false);
        for (size_t i = 0; i < n; i++) assert_int_equal(ds4_detok_stream_push(&s, ids[i], &raw, &err), 0);
        ds4_detok_stream_finish(&s, &raw);
        assert_int_equal(ds4_detokenize(v, ids, n, &whole, &err), 0);
        assert_int_equal(raw.len, whole.len);
        assert_memory_equal(raw.p ? raw.p : "", whole.p ? whole.p : "", raw.len);
        ds4_strbuf_free(&out);
        ds4_strbuf_free(&raw);
        ds4_strbuf_free(&whole);
        checked++;
    }
    assert_true(checked >= 40);
    free(gold);
}

/* decode(encode(x)) == x for every document (valid or not), in both modes,
 * and streamed decoding never splits a character of valid text. */
static void test_corpus_round_trip(void **state) {
    (void)state;
    ds4_err err = {0};
    const ds4_vocab *v = test_vocab();
    ds4_tokenizer *t = ds4_tokenizer_new(v, &err);
    size_t n_docs;
    char *blob;
    test_doc *docs = test_corpus(&n_docs, &blob);
    for (size_t i = 0; i < n_docs; i++) {
        for (int mode = 0; mode < 2; mode++) {
            ds4_tokens ids = {0};
            int rc = mode ? ds4_tokenize_transcript(t, docs[i].data, docs[i].len, &ids, &err)
                          : ds4_tokenize_text(t, docs[i].data, docs[i].len, &ids, &err);
            assert_int_equal(rc, 0);
            ds4_strbuf out = {0};
            ds4_detok_stream s;
            ds4_detok_stream_init(&s, v, false);
            int valid = ds4_utf8_valid_prefix((const uint8_t *)docs[i].data, docs[i].len) == docs[i].len;
            for (size_t k = 0; k < ids.n; k++) {
                size_t before = out.len;
                assert_int_equal(ds4_detok_stream_push(&s, ids.ids[k], &out, &err), 0);
                if (valid)
                    assert_int_equal(ds4_utf8_valid_prefix((const uint8_t *)out.p + before, out.len - before),
                                     out.len - before);
            }
            ds4_detok_stream_finish(&s, &out);
            if (out.len != docs[i].len || memcmp(out.p ? out.p : "", docs[i].data, out.len) != 0)
                fail_msg("%s: decode(encode(x)) != x (mode %d)", docs[i].name, mode);
            ds4_strbuf_free(&out);
            ds4_tokens_free(&ids);
        }
    }
    free(docs);
    free(blob);
    ds4_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_ids_match_hf),
        cmocka_unit_test(test_corpus_round_trip),
        cmocka_unit_test(test_decode_matches_hf),
        cmocka_unit_test(test_every_code_point_matches_hf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
