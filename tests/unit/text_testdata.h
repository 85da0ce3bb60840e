/*
 * text_testdata.h - shared helpers for the text-layer tests (included by
 * test_tok*.c, test_chat*.c, test_dsml*.c; everything is static).
 *
 * Tests run from the repository root (scripts/run-tests.sh).  The official
 * tokenizer is read straight from data/tokenizer/ (xz-compressed) and the corpus
 * from tests/golden/text/ through `xz -dc`, so nothing needs building
 * first and nothing comes from the network.
 */
#ifndef DS4_TEST_TEXT_TESTDATA_H
#define DS4_TEST_TEXT_TESTDATA_H

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokjson.h"
#include "text/vocab.h"

#define TEST_TOKENIZER_JSON   "data/tokenizer/deepseek-v4-tokenizer.json.xz"
#define TEST_TOKENIZER_CONFIG "data/tokenizer/deepseek-v4-tokenizer_config.json"

/* The official vocabulary, loaded once per test program. */
static inline ds4_vocab *test_vocab(void) {
    static ds4_vocab *v;
    if (v) return v;
    ds4_err err = {0};
    ds4_tokjson tj;
    if (ds4_tokjson_load(TEST_TOKENIZER_JSON, TEST_TOKENIZER_CONFIG, 0, &tj, &err)) {
        fprintf(stderr, "loading %s: %s\n", TEST_TOKENIZER_JSON, err.msg);
        abort();
    }
    ds4_vocab_src src = ds4_tokjson_src(&tj);
    v = ds4_vocab_new(&src, &err);
    ds4_tokjson_free(&tj);
    if (!v) {
        fprintf(stderr, "building vocabulary: %s\n", err.msg);
        abort();
    }
    return v;
}

/* Whole file, decompressed with xz when the name ends in ".xz"; aborts on
 * failure (test data must be there).  NUL-terminated for convenience. */
static inline char *test_read_file(const char *path, size_t *len) {
    size_t n = strlen(path);
    FILE *f;
    int piped = n > 3 && strcmp(path + n - 3, ".xz") == 0;
    if (piped) {
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "xz -dc -- '%s'", path);
        f = popen(cmd, "r");
    } else {
        f = fopen(path, "rb");
    }
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        abort();
    }
    size_t cap = 1 << 16, used = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (used + 1 >= cap) buf = realloc(buf, cap *= 2);
        size_t r = fread(buf + used, 1, cap - used - 1, f);
        if (r == 0) break;
        used += r;
    }
    int rc = piped ? pclose(f) : fclose(f);
    if (rc != 0) {
        fprintf(stderr, "reading %s failed\n", path);
        abort();
    }
    buf[used] = '\0';
    *len = used;
    return buf;
}

static inline void test_sha256_hex(const void *data, size_t n, char out[65]) {
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_Digest(data, n, md, &mdlen, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

/* Documents of tests/golden/text/tok_corpus.bin.xz ("#doc NAME N\n" + bytes + "\n"). */
typedef struct test_doc {
    char name[96];
    const char *data;
    size_t len;
} test_doc;

static inline test_doc *test_corpus(size_t *n_docs, char **blob_out) {
    size_t len;
    char *blob = test_read_file("tests/golden/text/tok_corpus.bin.xz", &len);
    size_t cap = 256, n = 0;
    test_doc *docs = malloc(cap * sizeof(*docs));
    size_t pos = 0;
    while (pos < len) {
        char *nl = memchr(blob + pos, '\n', len - pos);
        size_t size = 0;
        if (!nl || sscanf(blob + pos, "#doc %95s %zu", docs[n].name, &size) != 2) {
            fprintf(stderr, "corpus: bad header at byte %zu\n", pos);
            abort();
        }
        docs[n].data = nl + 1;
        docs[n].len = size;
        pos = (size_t)(nl + 1 - blob) + size + 1;
        if (++n == cap) docs = realloc(docs, (cap *= 2) * sizeof(*docs));
    }
    *n_docs = n;
    *blob_out = blob;
    return docs;
}

#endif
