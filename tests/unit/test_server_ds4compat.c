/*
 * test_server_ds4compat.c - files the original ds4 engine (antirez/ds4)
 * wrote, read here (tests/golden/compat/, README.md there says how they were
 * made): no model is needed.
 *
 *  - Prompts its server rendered, with the requests they came from: this
 *    server's chat adapter and renderer give the same bytes, and the
 *    tokenizer the same ids as the original's KV file holds.
 *  - A KV file of its server's disk cache (a cold save, Flash, q2): read and
 *    verified (header, key text = its token ids decoded, file name =
 *    SHA1 of the text, the DSV4 payload checked against the Flash shape),
 *    its payload written back byte for byte, and the KV file written back
 *    with the same bytes but the checksum this engine adds (extension bit
 *    3 and header bytes 20..23, which the original reads as reserved).
 *
 * With the model the file came from, tests/compat/run.sh resumes from it
 * (docs/COMPAT.md).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kvcache.h"
#include "model/config.h"
#include "model/session_state.h"
#include "server.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text_testdata.h"

#define DIR         "tests/golden/compat/"
#define KV_NAME     "fe7f47b94401263993cc9572cbbb66ede1beb9e3.kv"
#define KV_CHAT     2 /* the request whose prompt the KV file holds */
#define N_CHATS     3
#define KV_TOKENS   9
#define KV_CTX      256
#define KV_TEXT_OFF (DS4_KVC_HEADER_BYTES + 4)

/* Request i's prompt as this server renders it. */
static void render_chat(int i, ds4_rendered *r) {
    char path[256];
    snprintf(path, sizeof(path), DIR "chat-%d.json", i);
    size_t len;
    char *body = test_read_file(path, &len);
    api_error e = {0};
    json_t *b = req_load_json(body, len, &e);
    if (!b) fail_msg("%s: %s", path, e.message);
    job *j = job_new(&API_CHAT_ADAPTER);
    if (API_CHAT_ADAPTER.parse(b, &j->req, &e) != 0) fail_msg("%s refused: %s", path, e.message);
    ds4_chat_opts o = {.think = j->req.think, .ctx_size = KV_CTX, .tools = j->req.tools};
    ds4_err err = {0};
    if (ds4_chat_render(j->req.messages, &o, r, &err) != 0) fail_msg("%s: %s", path, err.msg);
    json_decref(b);
    job_unref(j);
    free(body);
}

static void test_rendered_prompts(void **state) {
    (void)state;
    for (int i = 1; i <= N_CHATS; i++) {
        char path[256];
        snprintf(path, sizeof(path), DIR "chat-%d.txt", i);
        size_t len;
        char *want = test_read_file(path, &len);
        ds4_rendered r = {0};
        render_chat(i, &r);
        if (r.text.len != len || memcmp(r.text.p, want, len) != 0)
            fail_msg("chat-%d rendered\n%s\nthe original rendered\n%s", i, r.text.p, want);
        ds4_rendered_free(&r);
        free(want);
    }
}

/* The fixture, decompressed into a temporary file (ds4_kvc_read reads a
 * path); its bytes in *bytes. */
static char *kv_fixture(char **bytes, size_t *len) {
    *bytes = test_read_file(DIR KV_NAME ".xz", len);
    char *path = strdup("/tmp/ds4-compat-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, *bytes, *len), (ssize_t)*len);
    close(fd);
    return path;
}

static void test_original_kv_file(void **state) {
    (void)state;
    size_t len;
    char *orig;
    char *path = kv_fixture(&orig, &len);
    ds4_config cfg;
    ds4_config_flash(&cfg);
    ds4_err err = {0};
    ds4_kv_state *st = ds4_kv_state_new(&cfg, KV_CTX, KV_CTX, &err);
    assert_non_null(st);
    ds4_kvc_file f = {0};
    if (ds4_kvc_read(path, st, test_vocab(), KV_NAME, 0, &f, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(f.h.n_tokens, KV_TOKENS);
    assert_int_equal(st->n_tokens, KV_TOKENS);
    assert_int_equal(f.h.ctx, KV_CTX);
    assert_int_equal(f.h.quant_bits, 2);
    assert_int_equal(f.h.reason, DS4_KVC_COLD);
    assert_int_equal(f.h.ext, 0);
    assert_true(st->has_logits);

    /* The key is the prompt of request KV_CHAT, which renders and
     * tokenizes here to the ids the file holds. */
    ds4_rendered r = {0};
    render_chat(KV_CHAT, &r);
    assert_int_equal(f.text_len, r.text.len);
    assert_memory_equal(f.text, r.text.p, r.text.len);
    ds4_tokenizer *t = ds4_tokenizer_new(test_vocab(), &err);
    ds4_tokens ids = {0};
    if (!t || ds4_tokenize_rendered(t, &r, &ids, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(ids.n, KV_TOKENS);
    for (size_t i = 0; i < ids.n; i++) assert_int_equal((uint32_t)ids.ids[i], st->tokens[i]);

    /* The payload, written back, is the original's to the byte. */
    char *pay;
    size_t pay_len;
    FILE *m = open_memstream(&pay, &pay_len);
    assert_int_equal(ds4_kv_state_save(st, m, &err), 0);
    fclose(m);
    size_t off = KV_TEXT_OFF + f.text_len;
    assert_int_equal(pay_len, f.h.payload_bytes);
    assert_int_equal(off + pay_len, len);
    assert_memory_equal(pay, orig + off, pay_len);

    /* So is the whole file, but for the checksum this engine adds. */
    ds4_kvc_header h = f.h;
    char *out = strdup("/tmp/ds4-compat-out-XXXXXX");
    close(mkstemp(out));
    if (ds4_kvc_write(out, &h, f.text, f.text_len, st, NULL, 0, &err) != 0) fail_msg("%s", err.msg);
    size_t out_len;
    char *mine = test_read_file(out, &out_len);
    assert_int_equal(out_len, len);
    assert_int_equal((uint8_t)mine[6], DS4_KVC_EXT_CHECKSUM);
    mine[6] = 0;
    memset(mine + 20, 0, 4);
    assert_memory_equal(mine, orig, len);

    ds4_kvc_file_free(&f);
    ds4_tokens_free(&ids);
    ds4_tokenizer_free(t);
    ds4_rendered_free(&r);
    ds4_kv_state_free(st);
    unlink(out);
    unlink(path);
    free(mine);
    free(out);
    free(pay);
    free(path);
    free(orig);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rendered_prompts),
        cmocka_unit_test(test_original_kv_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
