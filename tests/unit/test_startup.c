/*
 * test_startup.c - what engine programs share at startup (engine/startup.h):
 *  - the weights' byte count is the sum of the file's tensors, the KV
 *    state's is MODEL.md 8.1's sizes written out by hand for the tiny
 *    model, and the memory line is the exact text programs print;
 *  - --warm-weights leaves every page of the mapping resident (mincore),
 *    starting from a file whose pages were dropped from the page cache;
 *  - backend names and ds4 options this engine lacks get their own messages;
 *    a missing model file explains where models come from.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/st_build.h"
#include "engine/startup.h"
#include "format/gguf.h"
#include "model/backends.h"
#include "model/session_state.h"
#include "model/weights.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"

/* The KV state of the tiny model (MODEL.md 8.1 spelled out for its config:
 * 6 layers with ratios 0 0 4 128 4 128, head_dim 128, window 128, indexer
 * rows of 128, vocabulary 256), in 4-byte values: the token list and the
 * logits; per layer the raw ring of min(ctx, window) rows; per compressed
 * layer ctx/ratio + 2 compressed rows and two frontiers (values and scores)
 * of coff*ratio rows of coff*head_dim (coff = 2 for ratio 4, 1 for 128);
 * on ratio-4 layers the same again for the indexer. */
static uint64_t tiny_kv_bytes(uint64_t ctx) {
    uint64_t raw = ctx < 128 ? ctx : 128;
    uint64_t f = ctx + 256 + 6 * raw * 128;
    f += 2 * ((ctx / 4 + 2) * 128 + 2 * 8 * 256);     /* ratio 4: attention */
    f += 2 * ((ctx / 4 + 2) * 128 + 2 * 8 * 256);     /* ratio 4: indexer */
    f += 2 * ((ctx / 128 + 2) * 128 + 2 * 128 * 128); /* ratio 128 */
    return 4 * f;
}

static void test_weight_bytes_and_memory_line(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(MODEL, &err);
    if (!w) fail_msg("%s", err.msg);
    const ds4_config *c = &w->cfg;
    static const uint32_t ratios[6] = {0, 0, 4, 128, 4, 128};
    assert_int_equal(c->n_layer, 6);
    assert_memory_equal(c->compress_ratio, ratios, sizeof(ratios));
    assert_int_equal(c->head_dim, 128);
    assert_int_equal(c->sliding_window, 128);
    assert_int_equal(c->idx_head_dim, 128);
    assert_int_equal(c->n_vocab, 256);

    /* Weights: every tensor of the file, as the reader lists them. */
    uint64_t sum = 0;
    for (uint64_t i = 0; i < w->gguf->n_tensors; i++) sum += w->gguf->tensors[i].nbytes;
    assert_int_equal(sum, 2404836);
    assert_int_equal(ds4_weights_bytes(w), sum);
    /* Context: the formula above, inside and past the raw window. */
    assert_int_equal(tiny_kv_bytes(4096), 2874368);
    assert_int_equal(ds4_kv_state_bytes(c, 4096), tiny_kv_bytes(4096));
    assert_int_equal(tiny_kv_bytes(100), 693648);
    assert_int_equal(ds4_kv_state_bytes(c, 100), tiny_kv_bytes(100));
    /* The line programs print, for those numbers. */
    char line[160], a[32];
    assert_string_equal(ds4_memory_line(w, 4096, line, sizeof(line)),
                        "memory: weights 2.3 MiB + context 4096 tokens 2.7 MiB = 5.0 MiB");
    assert_string_equal(ds4_memory_line(w, 100, line, sizeof(line)),
                        "memory: weights 2.3 MiB + context 100 tokens 677.4 KiB = 3.0 MiB");
    ds4_weights_close(w);

    assert_string_equal(ds4_fmt_bytes(1023, a), "1023 bytes");
    assert_string_equal(ds4_fmt_bytes(1536, a), "1.5 KiB");
    assert_string_equal(ds4_fmt_bytes(81ull << 30, a), "81.0 GiB");
}

static void copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* Resident pages of [p, p + n). */
static size_t resident(const void *p, size_t n) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (n + page - 1) / page, count = 0;
    unsigned char *vec = malloc(pages);
    assert_int_equal(mincore((void *)p, n, vec), 0);
    for (size_t i = 0; i < pages; i++) count += vec[i] & 1;
    free(vec);
    return count;
}

static void test_warm_reads_every_page(void **state) {
    (void)state;
    char *dir = st_tempdir(), path[1024];
    snprintf(path, sizeof(path), "%s/model.gguf", dir);
    copy_file(MODEL, path);
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) fail_msg("%s", err.msg);
    /* Opening validates the tensors, which reads the pages: drop them from
     * this mapping, then from the page cache, so that warming has
     * something to do. */
    assert_int_equal(madvise((void *)w->gguf->base, w->gguf->size, MADV_DONTNEED), 0);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    fdatasync(fd);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (w->gguf->size + page - 1) / page;
    size_t before = resident(w->gguf->base, w->gguf->size);
    uint64_t warmed = 0;
    assert_int_equal(ds4_weights_warm(w, 2, NULL, NULL, &warmed, &err), 0);
    assert_int_equal(warmed, w->gguf->size);
    assert_int_equal(resident(w->gguf->base, w->gguf->size), pages);
    if (before == pages) print_message("page cache did not drop the file: the before state proves nothing\n");
    else assert_true(before < pages);
    ds4_weights_close(w);

    /* Synthetic weights have no file: nothing to read, no error. */
    ds4_config c;
    ds4_config_flash(&c);
    ds4_weights *s = ds4_weights_synthetic(&c, "q2", 1, &err);
    assert_non_null(s);
    assert_int_equal(ds4_weights_warm(s, 1, NULL, NULL, &warmed, &err), 0);
    assert_int_equal(warmed, 0);
    ds4_weights_close(s);
    st_rmdir(dir);
    free(dir);
}

static bool stop_now(void *ctx) {
    ++*(int *)ctx;
    return true;
}

/* Ctrl+C during --warm-weights: the stop callback is asked before the
 * first slice of the file and ends the reading. */
static void test_warm_stops_when_asked(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(MODEL, &err);
    if (!w) fail_msg("%s", err.msg);
    int asked = 0;
    uint64_t warmed = 1;
    assert_int_equal(ds4_weights_warm(w, 2, stop_now, &asked, &warmed, &err), -1);
    assert_int_equal(err.code, DS4_EINTERRUPTED);
    assert_string_equal(err.msg, "warming the weights: interrupted");
    assert_int_equal(asked, 1);
    assert_int_equal(warmed, 0);
    assert_int_equal(ds4_startup_warm("test", w, 2, stop_now, &asked), DS4_EXIT_INTERRUPTED);
    ds4_weights_close(w);
}

static void test_names_and_messages(void **state) {
    (void)state;
    ds4_err err = {0};
    assert_int_equal(ds4_backend_check_name(NULL, &err), 0);
    assert_int_equal(ds4_backend_check_name("cpu", &err), 0);
    assert_int_equal(ds4_backend_check_name("metal", &err), -1);
    assert_non_null(strstr(err.msg, "Metal is not supported"));
    assert_int_equal(ds4_backend_check_name("tpu", &err), -1);
    assert_non_null(strstr(err.msg, "unknown backend 'tpu'"));
#if DS4_CUDA
    assert_int_equal(ds4_backend_check_name("cuda", &err), 0);
#else
    assert_int_equal(ds4_backend_check_name("cuda", &err), -1);
    assert_non_null(strstr(err.msg, "make cuda"));
#endif
    assert_null(ds4_option_not_supported("--mtp"));              /* implemented now */
    assert_null(ds4_option_not_supported("--dir-steering-ffn")); /* implemented now */
    assert_non_null(ds4_option_not_supported("--metal-graph-test"));
    assert_null(ds4_option_not_supported("--ctx"));
    assert_null(ds4_option_not_supported("--mtp-drafts"));

    assert_int_equal(ds4_model_file_check(MODEL, &err), 0);
    assert_int_equal(ds4_model_file_check("no/such/model.gguf", &err), -1);
    assert_int_equal(err.code, DS4_ENOTFOUND);
    assert_non_null(strstr(err.msg, "model file no/such/model.gguf: No such file or directory"));
    assert_non_null(strstr(err.msg, "make demo"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_bytes_and_memory_line),
        cmocka_unit_test(test_warm_reads_every_page),
        cmocka_unit_test(test_warm_stops_when_asked),
        cmocka_unit_test(test_names_and_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
