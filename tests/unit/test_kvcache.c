/*
 * test_kvcache.c - KVC checkpoint files and the disk store (src/engine/kvcache.h):
 * the header's byte layout (docs/MODEL.md 8.4), a write/read round trip that
 * restores bit-identical logits, every structural corruption and a
 * truncation at every offset rejected, the store's longest-prefix lookup,
 * hit counting, eviction order and protection under the budget, corrupt and
 * unfinished files skipped at open with a log line, and the save-policy
 * arithmetic (continued step, cold boundary).
 * Model: tests/golden/cpu/tiny-a.f16.gguf (no tokenizer needed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/kvcache.h"
#include "engine/session.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"
#define CTX   256

static ds4_engine *E;
static ds4_session *S;
static char DIR_[256];

static int setup(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_engine_opts o = {.model_path = MODEL, .backend = "cpu", .n_threads = 2};
    if (!(E = ds4_engine_open(&o, &err)) || !(S = ds4_session_new(E, CTX, &err))) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    snprintf(DIR_, sizeof(DIR_), "/tmp/ds4-kvc-test-%d", (int)getpid());
    return 0;
}

static void rm_dir(void) {
    DIR *d = opendir(DIR_);
    if (!d) return;
    struct dirent *de;
    char p[600];
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof(p), "%s/%s", DIR_, de->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(DIR_);
}

static int teardown(void **state) {
    (void)state;
    ds4_session_free(S);
    ds4_engine_close(E);
    rm_dir();
    return 0;
}

/* A state holding n tokens (deterministic ids). */
static ds4_kv_state *state_of(uint32_t n, uint32_t seed) {
    ds4_err err = {0};
    int32_t t[CTX];
    for (uint32_t i = 0; i < n; i++) t[i] = (int32_t)((i * 7919u + seed * 31u) % E->w->cfg.n_vocab);
    if (ds4_session_sync(S, t, n, NULL, NULL, &err)) fail_msg("%s", err.msg);
    ds4_kv_state *st = ds4_session_state_new(S, &err);
    if (!st || ds4_session_snapshot(S, st, &err)) fail_msg("%s", err.msg);
    return st;
}

static void payload_bytes(const ds4_kv_state *st, char **buf, size_t *len) {
    FILE *f = open_memstream(buf, len);
    assert_int_equal(ds4_kv_state_save(st, f, NULL), 0);
    fclose(f);
}

static void test_header_layout(void **state) {
    (void)state;
    ds4_kvc_header h = {.quant_bits = 4,
                        .reason = DS4_KVC_CONTINUED,
                        .ext = DS4_KVC_EXT_TOOLMAP,
                        .n_tokens = 0x01020304,
                        .hits = 7,
                        .ctx = 32768,
                        .created = 0x1122334455667788ull,
                        .last_used = 9,
                        .payload_bytes = 0xAABBCCDDull};
    uint8_t b[48];
    ds4_kvc_header_encode(&h, b);
    const uint8_t want[48] = {'K', 'V',  'C', 1, 4, 2, 1, 0, 4,    3,    2,    1,    7,    0,    0,    0,
                              0,   0x80, 0,   0, 0, 0, 0, 0, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
                              9,   0,    0,   0, 0, 0, 0, 0, 0xDD, 0xCC, 0xBB, 0xAA, 0,    0,    0,    0};
    assert_memory_equal(b, want, 48);
    ds4_kvc_header d;
    assert_int_equal(ds4_kvc_header_decode(b, &d, NULL), 0);
    assert_int_equal(d.quant_bits, 4);
    assert_int_equal(d.reason, DS4_KVC_CONTINUED);
    assert_int_equal(d.ext, DS4_KVC_EXT_TOOLMAP);
    assert_int_equal(d.n_tokens, h.n_tokens);
    assert_int_equal(d.hits, 7);
    assert_int_equal(d.ctx, 32768);
    assert_int_equal(d.created, h.created);
    assert_int_equal(d.last_used, 9);
    assert_int_equal(d.payload_bytes, h.payload_bytes);
    /* Each check of the decoder. */
    struct {
        int off;
        uint8_t val;
    } bad[] = {{0, 'X'}, {2, 'D'}, {3, 2}, {4, 3}, {4, 8}, {5, 7}, {6, 0x10}, {8, 0}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t c[48];
        memcpy(c, b, 48);
        c[bad[i].off] = bad[i].val;
        if (bad[i].off == 8) c[9] = c[10] = c[11] = 0;
        ds4_err err = {0};
        assert_int_equal(ds4_kvc_header_decode(c, &d, &err), -1);
        assert_true(strlen(err.msg) > 0);
    }
    /* SHA1 names: the FIPS 180 test vector. */
    char name[48];
    ds4_kvc_name("abc", 3, name);
    assert_string_equal(name, "a9993e364706816aba3e25717850c26c9cd0d89d.kv");
}

static char *write_test_file(const ds4_kv_state *st, const char *text, ds4_kvc_header *h) {
    static char path[600];
    mkdir(DIR_, 0700);
    char name[48];
    ds4_kvc_name(text, strlen(text), name);
    snprintf(path, sizeof(path), "%s/%s", DIR_, name);
    ds4_kvc_tool tools[2] = {{"call_in", 7, "<DSML block>", 12}, {"call_out", 8, "not in the text", 15}};
    *h = (ds4_kvc_header){.quant_bits = 2, .reason = DS4_KVC_COLD, .ctx = CTX, .created = 100, .last_used = 100};
    ds4_err err = {0};
    if (ds4_kvc_write(path, h, text, strlen(text), st, tools, 2, &err)) fail_msg("%s", err.msg);
    return path;
}

static void test_round_trip(void **state) {
    (void)state;
    ds4_kv_state *st = state_of(40, 1);
    const char *text = "system prompt <DSML block> and the rest";
    ds4_kvc_header h;
    char *path = write_test_file(st, text, &h);
    assert_int_equal(h.n_tokens, 40);
    assert_int_equal(h.ext, DS4_KVC_EXT_TOOLMAP | DS4_KVC_EXT_CHECKSUM);

    ds4_err err = {0};
    ds4_kv_state *back = ds4_session_state_new(S, &err);
    ds4_kvc_file f;
    char name[48];
    ds4_kvc_name(text, strlen(text), name);
    if (ds4_kvc_read(path, back, NULL, name, 10, &f, &err)) fail_msg("%s", err.msg);
    assert_int_equal(f.h.n_tokens, 40);
    assert_int_equal(f.h.payload_bytes, h.payload_bytes);
    assert_int_equal(f.text_len, strlen(text));
    assert_memory_equal(f.text, text, strlen(text));
    /* Only the tool whose block occurs in the text was written. */
    assert_int_equal(f.n_tools, 1);
    assert_memory_equal(f.tools[0].id, "call_in", 7);
    assert_memory_equal(f.tools[0].dsml, "<DSML block>", 12);
    char *a, *b;
    size_t al, bl;
    payload_bytes(st, &a, &al);
    payload_bytes(back, &b, &bl);
    assert_int_equal(al, bl);
    assert_int_equal(al, h.payload_bytes);
    assert_memory_equal(a, b, al);
    /* Restored into a session, the logits are those of the original. */
    assert_int_equal(ds4_session_restore(S, back, &err), 0);
    assert_memory_equal(ds4_session_logits(S), st->logits, E->w->cfg.n_vocab * sizeof(float));
    free(a);
    free(b);
    ds4_kvc_file_free(&f);
    ds4_kv_state_free(back);
    ds4_kv_state_free(st);
    unlink(path);
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const char *path, const char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static int read_with_state(const char *path, const char *name, ds4_err *err) {
    ds4_kv_state *back = ds4_session_state_new(S, NULL);
    ds4_kvc_file f;
    int rc = ds4_kvc_read(path, back, NULL, name, 10, &f, err);
    if (rc == 0) ds4_kvc_file_free(&f);
    ds4_kv_state_free(back);
    return rc;
}

static void test_corruptions_and_truncations(void **state) {
    (void)state;
    ds4_kv_state *st = state_of(24, 2);
    const char *text = "key text <DSML block>";
    ds4_kvc_header h;
    char *path = write_test_file(st, text, &h);
    char name[48];
    ds4_kvc_name(text, strlen(text), name);
    size_t n;
    char *orig = slurp(path, &n);
    size_t text_at = 52, payload_at = text_at + strlen(text), trailer_at = payload_at + h.payload_bytes;
    char cut[700];
    snprintf(cut, sizeof(cut), "%s/cut.kv", DIR_);

    /* Truncation at every offset fails: every offset through the header,
     * text and trailer, and every 61st inside the payload (checked loading
     * the payload), and every offset with the payload skipped by length. */
    spit(cut, orig, n);
    for (size_t k = n; k-- > 0;) {
        assert_int_equal(truncate(cut, (off_t)k), 0);
        ds4_kvc_file f;
        ds4_err err = {0};
        bool full = k < payload_at + 64 || k >= trailer_at - 64 || k % 61 == 0;
        int rc = full ? read_with_state(cut, NULL, &err) : ds4_kvc_read(cut, NULL, NULL, NULL, 10, &f, &err);
        if (rc == 0) fail_msg("truncation at %zu of %zu accepted", k, n);
        assert_non_null(strstr(err.msg, "cut.kv"));
    }
    /* The complete file reads. */
    spit(cut, orig, n);
    ds4_err err = {0};
    assert_int_equal(read_with_state(cut, NULL, &err), 0);

    /* Structural corruptions. */
    struct {
        const char *what;
        size_t off;
        int delta;
    } bad[] = {
        {"magic", 0, 1},
        {"version", 3, 1},
        {"quant bits", 4, 1},
        {"reason", 5, 9},
        {"unknown flag", 6, 0x10},
        {"toolmap flag cleared", 6, -1},
        {"token count", 8, 1},
        {"text length", 48, 1},
        {"text byte (SHA1 mismatch)", text_at + 2, 1},
        {"payload length", 40, 1},
        {"payload length short", 40, -1},
        {"payload magic", payload_at, 1},
        {"payload version", payload_at + 4, 1},
        {"payload layer count", payload_at + 32, 1},
        {"payload token count", payload_at + 28, 1},
        {"payload live raw rows", payload_at + 48, 1},
        {"payload token id", payload_at + 52 + 3, 1}, /* high byte of token 0: outside the vocabulary */
        {"trailer magic", trailer_at, 1},
        {"trailer version", trailer_at + 3, 1},
        {"trailer count", trailer_at + 4, 1},
        {"trailer id length", trailer_at + 8, 100},
        {"trailer block length", trailer_at + 12, 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *c = malloc(n);
        memcpy(c, orig, n);
        c[bad[i].off] = (char)(c[bad[i].off] + bad[i].delta);
        spit(cut, c, n);
        free(c);
        err = (ds4_err){0};
        if (read_with_state(cut, name, &err) == 0) fail_msg("corruption of the %s accepted", bad[i].what);
    }
    /* One byte too many. */
    char *c = malloc(n + 1);
    memcpy(c, orig, n);
    c[n] = 0;
    spit(cut, c, n + 1);
    free(c);
    assert_int_equal(read_with_state(cut, name, &err), -1);
    /* A flipped payload byte that keeps the layout valid (a float of the
     * state): only the checksum sees it. */
    c = malloc(n);
    memcpy(c, orig, n);
    c[trailer_at - 9] ^= 0x20;
    spit(cut, c, n);
    err = (ds4_err){0};
    assert_int_equal(read_with_state(cut, name, &err), -1);
    assert_non_null(strstr(err.msg, "checksum"));
    /* ds4's files have no checksum (bit 3 clear, bytes 20..23 reserved):
     * they load as ds4 loads them, unverified. */
    c[6] &= (char)~DS4_KVC_EXT_CHECKSUM;
    memset(c + 20, 0, 4);
    spit(cut, c, n);
    free(c);
    err = (ds4_err){0};
    if (read_with_state(cut, name, &err) != 0) fail_msg("a file without a checksum: %s", err.msg);
    /* ds4 rewrites the header of a file it loads (hits, last use) with
     * bytes 20..23 zero but the flags kept: bit 3 with a zero checksum is
     * such a file, and loads unverified too (it is not damaged). */
    c = malloc(n);
    memcpy(c, orig, n);
    memset(c + 20, 0, 4);
    c[12]++;
    spit(cut, c, n);
    free(c);
    err = (ds4_err){0};
    if (read_with_state(cut, name, &err) != 0) fail_msg("a file whose header ds4 rewrote: %s", err.msg);
    /* Fields a load does not depend on may change: hits, times, reserved. */
    size_t free_fields[] = {7, 12, 24, 32};
    for (size_t i = 0; i < sizeof(free_fields) / sizeof(free_fields[0]); i++) {
        c = malloc(n);
        memcpy(c, orig, n);
        c[free_fields[i]] ^= 0x55;
        spit(cut, c, n);
        free(c);
        err = (ds4_err){0};
        if (read_with_state(cut, name, &err) != 0) fail_msg("offset %zu: %s", free_fields[i], err.msg);
    }
    unlink(cut);
    unlink(path);
    free(orig);
    ds4_kv_state_free(st);
}

typedef struct logbuf {
    char text[8192];
} logbuf;

static void log_to(void *ctx, const char *msg) {
    logbuf *l = ctx;
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof(l->text) - n, "%s\n", msg);
}

static ds4_kvc_store *open_store(uint64_t budget, logbuf *lb) {
    ds4_kvc_opts o = {.dir = DIR_,
                      .budget_bytes = budget,
                      .min_tokens = 8,
                      .quant_bits = 2,
                      .ctx = CTX,
                      .log = log_to,
                      .log_ctx = lb};
    ds4_err err = {0};
    ds4_kvc_store *s = ds4_kvc_open(&o, &err);
    if (!s) fail_msg("%s", err.msg);
    return s;
}

static void test_store_lookup_and_load(void **state) {
    (void)state;
    rm_dir();
    logbuf lb = {{0}};
    ds4_kvc_store *s = open_store(1ull << 30, &lb);
    ds4_kv_state *a = state_of(20, 3), *b = state_of(30, 3), *tiny = state_of(4, 3);
    ds4_err err = {0};
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "hello", 5, a, NULL, 0, &err), 1);
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_CONTINUED, 0, "hello world", 11, b, NULL, 0, &err), 1);
    /* Same key again: kept, not rewritten; below min_tokens: skipped. */
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "hello", 5, a, NULL, 0, &err), 0);
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "hel", 3, tiny, NULL, 0, &err), 0);
    assert_int_equal(ds4_kvc_get_stats(s).files, 2);
    assert_true(ds4_kvc_contains(s, "hello", 5));

    ds4_kvc_match m;
    assert_true(ds4_kvc_lookup(s, "hello world, again", 18, &m));
    assert_int_equal(m.text_len, 11);
    assert_int_equal(m.n_tokens, 30);
    assert_true(ds4_kvc_lookup(s, "hello there", 11, &m));
    assert_int_equal(m.text_len, 5);
    assert_false(ds4_kvc_lookup(s, "help", 4, &m));
    assert_false(ds4_kvc_lookup(s, "hell", 4, &m));

    ds4_kv_state *back = ds4_session_state_new(S, &err);
    assert_true(ds4_kvc_lookup(s, "hello world!", 12, &m));
    if (ds4_kvc_load(s, &m, back, &err)) fail_msg("%s", err.msg);
    assert_int_equal(back->n_tokens, 30);
    assert_memory_equal(back->logits, b->logits, E->w->cfg.n_vocab * sizeof(float));
    ds4_kvc_close(s);

    /* Reopened: the index comes from the files, the hit was recorded. */
    s = open_store(1ull << 30, &lb);
    assert_int_equal(ds4_kvc_get_stats(s).files, 2);
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", DIR_, m.name);
    ds4_kvc_file f;
    assert_int_equal(ds4_kvc_read(p, NULL, NULL, m.name, 10, &f, &err), 0);
    assert_int_equal(f.h.hits, 1);
    assert_int_equal(f.h.reason, DS4_KVC_CONTINUED);
    ds4_kvc_file_free(&f);

    /* A file corrupted behind the store's back: the load fails, logs, deletes. */
    size_t n;
    char *bytes = slurp(p, &n);
    bytes[52 + 11 + 52 + 3] ^= 0x7f; /* high byte of the first token id */
    spit(p, bytes, n);
    free(bytes);
    assert_true(ds4_kvc_lookup(s, "hello world!", 12, &m));
    lb.text[0] = 0;
    assert_int_equal(ds4_kvc_load(s, &m, back, &err), -1);
    assert_non_null(strstr(lb.text, "corrupt"));
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(ds4_kvc_get_stats(s).files, 1);
    ds4_kvc_close(s);

    /* Garbage and unfinished writes in the directory at open: only a
     * temporary of this naming scheme whose writer is gone is removed. */
    snprintf(p, sizeof(p), "%s/%040d.kv", DIR_, 0);
    spit(p, "KVC garbage", 11);
    pid_t gone = fork();
    if (gone == 0) _exit(0);
    waitpid(gone, NULL, 0);
    char tmp[700], live[700], other[700], near[700];
    snprintf(tmp, sizeof(tmp), "%s/%040d.kv.tmp-%d-2", DIR_, 1, (int)gone);
    snprintf(live, sizeof(live), "%s/%040d.kv.tmp-%d-3", DIR_, 2, (int)getppid());
    snprintf(other, sizeof(other), "%s/notes.kv.tmp-%d-2", DIR_, (int)gone);
    snprintf(near, sizeof(near), "%s/%040d.kv.tmp-%d-2.bak", DIR_, 3, (int)gone);
    spit(tmp, "KVC", 3);
    spit(live, "KVC", 3);
    spit(other, "mine", 4);
    spit(near, "mine", 4);
    lb.text[0] = 0;
    s = open_store(1ull << 30, &lb);
    assert_int_equal(ds4_kvc_get_stats(s).files, 1);
    assert_int_equal(ds4_kvc_get_stats(s).corrupt, 1);
    assert_non_null(strstr(lb.text, "skipping corrupt cache file"));
    assert_non_null(strstr(lb.text, "unfinished write"));
    assert_non_null(strstr(lb.text, "which may be writing it, is running"));
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(access(live, F_OK), 0);
    assert_int_equal(access(other, F_OK), 0);
    assert_int_equal(access(near, F_OK), 0);
    unlink(live);
    unlink(other);
    unlink(near);
    ds4_kvc_close(s);

    ds4_kv_state_free(a);
    ds4_kv_state_free(b);
    ds4_kv_state_free(tiny);
    ds4_kv_state_free(back);
}

static void test_quant_and_ctx_rules(void **state) {
    (void)state;
    rm_dir();
    logbuf lb = {{0}};
    ds4_kvc_store *s = open_store(1ull << 30, &lb); /* writes quant bits 2, ctx 256 */
    ds4_kv_state *a = state_of(20, 6);
    ds4_err err = {0};
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "quant", 5, a, NULL, 0, &err), 1);
    ds4_kvc_close(s);
    ds4_kvc_match m;
    /* A 4-bit model accepts a 2-bit checkpoint unless told to reject it. */
    ds4_kvc_opts o = {.dir = DIR_,
                      .budget_bytes = 1ull << 30,
                      .min_tokens = 8,
                      .quant_bits = 4,
                      .ctx = CTX,
                      .log = log_to,
                      .log_ctx = &lb};
    s = ds4_kvc_open(&o, &err);
    assert_true(ds4_kvc_lookup(s, "quantized", 9, &m));
    ds4_kvc_close(s);
    o.reject_different_quant = true;
    s = ds4_kvc_open(&o, &err);
    assert_false(ds4_kvc_lookup(s, "quantized", 9, &m));
    ds4_kvc_close(s);
    /* A smaller context than the snapshot's, or a higher minimum: not usable. */
    o.reject_different_quant = false;
    o.ctx = CTX / 2;
    s = ds4_kvc_open(&o, &err);
    assert_false(ds4_kvc_lookup(s, "quantized", 9, &m));
    ds4_kvc_close(s);
    o.ctx = CTX;
    o.min_tokens = 21;
    s = ds4_kvc_open(&o, &err);
    assert_false(ds4_kvc_lookup(s, "quantized", 9, &m));
    ds4_kvc_close(s);
    ds4_kv_state_free(a);
}

static void test_score(void **state) {
    (void)state;
    ds4_kvc_header h = {.n_tokens = 100, .hits = 3, .last_used = 1000};
    assert_true(ds4_kvc_score(&h, 50, 1000) == 8.0);                        /* (3 + 1) * 100 / 50 */
    assert_true(fabs(ds4_kvc_score(&h, 50, 1000 + 6 * 3600) - 5.0) < 1e-9); /* half-life: 1.5 hits */
    h.hits = 1;
    /* 2^-7 = 0.0078 < 0.01: no hits left. */
    assert_true(ds4_kvc_score(&h, 50, 1000 + 7 * 6 * 3600) == 2.0);
}

static void test_eviction_order(void **state) {
    (void)state;
    rm_dir();
    logbuf lb = {{0}};
    ds4_kvc_store *s = open_store(1ull << 30, &lb);
    ds4_kv_state *a = state_of(20, 4), *b = state_of(40, 4), *c = state_of(60, 4);
    ds4_err err = {0};
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "aaaa", 4, a, NULL, 0, &err), 1);
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "bbbb", 4, b, NULL, 0, &err), 1);
    uint64_t total = ds4_kvc_get_stats(s).bytes;
    /* Hit "aaaa" three times: its score (tokens per byte times hits + 1)
     * beats "bbbb", which holds more tokens per byte but has no hits. */
    ds4_kvc_match m;
    ds4_kv_state *back = ds4_session_state_new(S, &err);
    for (int i = 0; i < 3; i++) {
        assert_true(ds4_kvc_lookup(s, "aaaa", 4, &m));
        assert_int_equal(ds4_kvc_load(s, &m, back, &err), 0);
    }
    ds4_kvc_close(s);
    /* A budget for two files: storing a third evicts the lowest score,
     * never the file just written. */
    s = open_store(total + total / 2, &lb);
    assert_int_equal(ds4_kvc_get_stats(s).files, 2);
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "cccc", 4, c, NULL, 0, &err), 1);
    assert_true(ds4_kvc_contains(s, "cccc", 4));
    assert_true(ds4_kvc_contains(s, "aaaa", 4));
    assert_false(ds4_kvc_contains(s, "bbbb", 4));
    assert_int_equal(ds4_kvc_get_stats(s).evictions, 1);
    assert_true(ds4_kvc_get_stats(s).bytes <= total + total / 2);
    ds4_kvc_close(s);
    /* Reopening with a smaller budget evicts at open. */
    s = open_store(1000, &lb);
    assert_int_equal(ds4_kvc_get_stats(s).files, 0);
    /* A file larger than the whole budget is not kept at all. */
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_COLD, 0, "dddd", 4, c, NULL, 0, &err), 0);
    assert_int_equal(ds4_kvc_get_stats(s).files, 0);
    ds4_kvc_close(s);
    ds4_kv_state_free(a);
    ds4_kv_state_free(b);
    ds4_kv_state_free(c);
    ds4_kv_state_free(back);
}

typedef struct seen_ids {
    int n;
    char id[16];
} seen_ids;

static void got(void *ctx, const ds4_kvc_tool *t) {
    seen_ids *seen = ctx;
    seen->n++;
    snprintf(seen->id, sizeof(seen->id), "%.*s", (int)t->id_len, t->id);
}

static void test_tool_ids_restored(void **state) {
    (void)state;
    rm_dir();
    logbuf lb = {{0}};
    ds4_kvc_store *s = open_store(1ull << 30, &lb);
    ds4_kv_state *a = state_of(20, 5);
    ds4_kvc_tool tools[] = {{"call_1", 6, "[block one]", 11}, {"call_2", 6, "[block two]", 11}};
    ds4_err err = {0};
    const char *text = "prompt [block one] tail";
    assert_int_equal(ds4_kvc_save(s, DS4_KVC_EVICT, 0, text, strlen(text), a, tools, 2, &err), 1);
    ds4_kvc_close(s);
    s = open_store(1ull << 30, &lb);
    seen_ids seen = {0};
    ds4_kvc_each_tool(s, got, &seen);
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.id, "call_1");
    ds4_kvc_close(s);
    ds4_kv_state_free(a);
}

static void test_policy(void **state) {
    (void)state;
    ds4_kvc_policy p;
    ds4_kvc_policy_defaults(&p);
    assert_int_equal(ds4_kvc_continued_step(&p), 10240);
    p.boundary_align = 0;
    assert_int_equal(ds4_kvc_continued_step(&p), 10000);
    p.continued_interval = 0;
    assert_int_equal(ds4_kvc_continued_step(&p), 0);

    ds4_kvc_policy_defaults(&p);
    p.min_tokens = 10;
    p.cold_max_tokens = 100;
    p.boundary_trim = 4;
    p.boundary_align = 8;
    enum { U = 1, A = 2 };
    int32_t t[100];
    for (int i = 0; i < 100; i++) t[i] = 50;
    /* The last User before the first Assistant, when past min. */
    t[5] = U;
    t[30] = U;
    t[40] = A;
    t[60] = U;
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 80, U, A), 30);
    /* Too early: (n - trim) aligned down. */
    t[30] = 50;
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 80, U, A), 72);
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 77, U, A), 72);
    /* Outside [min, cold_max]: none. */
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 9, U, A), 0);
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 100, U, A), 72 + 24);
    p.cold_max_tokens = 99;
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 100, U, A), 0);
    p.cold_max_tokens = 0;
    assert_int_equal(ds4_kvc_cold_boundary(&p, t, 50, U, A), 0);
    ds4_err err = {0};
    p.cold_max_tokens = 5;
    assert_int_equal(ds4_kvc_policy_check(&p, &err), -1);
    assert_non_null(strstr(err.msg, "cold-max"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_layout),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corruptions_and_truncations),
        cmocka_unit_test(test_store_lookup_and_load),
        cmocka_unit_test(test_quant_and_ctx_rules),
        cmocka_unit_test(test_score),
        cmocka_unit_test(test_eviction_order),
        cmocka_unit_test(test_tool_ids_restored),
        cmocka_unit_test(test_policy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
