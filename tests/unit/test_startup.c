/*
 * test_startup.c - what engine programs share at startup (engine/startup.h):
 *  - the weights' byte count is the sum of the file's tensors, and the
 *    memory line adds the KV state for the context (model/session_state.h)
 *    with the exact text programs print;
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

static void test_weight_bytes_and_memory_line(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(MODEL, &err);
    if (!w) fail_msg("%s", err.msg);
    uint64_t sum = 0;
    for (uint64_t i = 0; i < w->gguf->n_tensors; i++) sum += w->gguf->tensors[i].nbytes;
    assert_int_equal(ds4_weights_bytes(w), sum);

    char line[160], a[32], b[32], c[32], want[200];
    uint64_t kv = ds4_kv_state_bytes(&w->cfg, 4096);
    snprintf(want, sizeof(want), "memory: weights %s + context 4096 tokens %s = %s", ds4_fmt_bytes(sum, a),
             ds4_fmt_bytes(kv, b), ds4_fmt_bytes(sum + kv, c));
    assert_string_equal(ds4_memory_line(w, 4096, line, sizeof(line)), want);
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
    assert_non_null(strstr(ds4_option_not_supported("--mtp"), "MTP"));
    assert_non_null(strstr(ds4_option_not_supported("--dir-steering-ffn"), "steering"));
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
