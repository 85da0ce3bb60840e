/*
 * test_imatrix_tools.c - importance matrices collected from the engine and
 * used by the quantizer, on the tiny model from the official checkpoint.
 *
 *  - ./ds4-imatrix writes one packed entry per routed tensor; on hash
 *    layers, experts that no prompt token's tid2eid row names get zero
 *    vectors and the others do not (an independent check of the routing
 *    the collector saw); options and bad datasets.
 *  - Acceptance: a q2 model quantized with that imatrix has a lower
 *    importance-weighted expert error and a lower KL divergence from the
 *    f32 model on held-out prompts than one using the synthetic column
 *    energy (./ds4-qeval).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/official_ckpt.h"
#include "common/st_build.h"
#include "common/tool_run.h"
#include "format/gguf.h"
#include "format/imatrix.h"

static char *dir;
static char f32[1024], q2[1024], q2im[1024], calib[1024], eval[1024], im[1024];

static char *in_dir(char *buf, const char *name) {
    snprintf(buf, 1024, "%s/%s", dir, name);
    return buf;
}

/* A dataset of token-id prompts from a small LCG. */
static void write_dataset(const char *path, int prompts, int len, uint32_t seed) {
    FILE *f = fopen(path, "w");
    uint32_t x = seed;
    for (int p = 0; p < prompts; p++) {
        fprintf(f, "\n\n===== DS4_IMATRIX_PROMPT %d test tokens gen =====\n", p);
        for (int i = 0; i < len; i++) {
            x = x * 1664525u + 1013904223u;
            fprintf(f, "%u%c", (x >> 8) % 512, i % 16 == 15 ? '\n' : ' ');
        }
    }
    fclose(f);
}

static int setup(void **state) {
    (void)state;
    struct stat st;
    if (stat("./ds4-imatrix", &st) != 0 || stat("./ds4-qeval", &st) != 0 || stat("./ds4-quantize", &st) != 0) return -1;
    dir = st_tempdir();
    official_ckpt_write(dir, NULL);
    in_dir(f32, "f32.gguf");
    in_dir(q2, "q2.gguf");
    in_dir(q2im, "q2im.gguf");
    in_dir(im, "im.dat");
    write_dataset(in_dir(calib, "calib.txt"), 20, 64, 1);
    write_dataset(in_dir(eval, "eval.txt"), 8, 64, 2);
    char log[8192];
    if (run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe f32 --quiet", dir, f32) ||
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q2 --quiet", dir, q2) ||
        run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s -t 2", f32, calib, im) ||
        run_capture(log, sizeof(log),
                    "./ds4-quantize --hf %s --out %s --recipe q2 --imatrix %s --imatrix-strict --quiet", dir, q2im,
                    im)) {
        fprintf(stderr, "%s\n", log);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_rmdir(dir);
    free(dir);
    return 0;
}

static void test_collected_file(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_imatrix *m = ds4_imatrix_load(im, &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(m->n_entries, 12);
    assert_int_equal(m->chunks, 20);
    assert_string_equal(m->dataset, "calib.txt");
    const ds4_imatrix_entry *g = ds4_imatrix_find(m, "blk.2.ffn_gate_exps.weight");
    const ds4_imatrix_entry *u = ds4_imatrix_find(m, "blk.2.ffn_up_exps.weight");
    const ds4_imatrix_entry *d = ds4_imatrix_find(m, "blk.3.ffn_down_exps.weight");
    assert_non_null(g);
    assert_int_equal(g->nval, 4 * 256);
    assert_int_equal(d->nval, 4 * 256);
    assert_int_equal(g->ncall, 20);
    assert_memory_equal(g->values, u->values, g->nval * sizeof(float)); /* same input */
    ds4_imatrix_free(m);
}

/* Layer 0 routes by tid2eid: a prompt of tokens whose rows avoid expert 3
 * leaves expert 3's vectors at zero. */
static void test_hash_routing_seen(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_gguf *g = ds4_gguf_open(f32, &err);
    const ds4_gguf_tensor *t = ds4_gguf_find_tensor(g, "blk.0.ffn_gate_tid2eid.weight");
    const int32_t *tid = t->data;
    char path[1024], text[4096] = "===== DS4_IMATRIX_PROMPT 0\n";
    int used[4] = {0}, n = 0;
    for (uint32_t tok = 0; tok < 512 && n < 40; tok++) {
        if (tid[2 * tok] == 3 || tid[2 * tok + 1] == 3) continue;
        used[tid[2 * tok]] = used[tid[2 * tok + 1]] = 1;
        snprintf(text + strlen(text), sizeof(text) - strlen(text), "%u ", tok);
        n++;
    }
    ds4_gguf_close(g);
    assert_int_equal(n, 40);
    st_write_file(in_dir(path, "avoid3.txt"), text, strlen(text));
    char out[1024], log[4096];
    in_dir(out, "avoid3.dat");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s", f32, path, out), 0);
    assert_contains(log, "from 1 prompt, 40 tokens, 320 routed expert observations");
    ds4_imatrix *m = ds4_imatrix_load(out, &err);
    const ds4_imatrix_entry *e = ds4_imatrix_find(m, "blk.0.ffn_gate_exps.weight");
    const ds4_imatrix_entry *dn = ds4_imatrix_find(m, "blk.0.ffn_down_exps.weight");
    for (int x = 0; x < 4; x++) {
        double s = 0, sd = 0;
        for (int c = 0; c < 256; c++) s += e->values[x * 256 + c], sd += dn->values[x * 256 + c];
        if (used[x]) assert_true(s > 0 && sd > 0);
        else assert_true(s == 0 && sd == 0);
    }
    assert_false(used[3]);
    ds4_imatrix_free(m);
}

static void test_cli_errors(void **state) {
    (void)state;
    char log[4096], path[1024], out[1024];
    in_dir(out, "err.dat");
    st_write_file(in_dir(path, "text.txt"), "===== DS4_IMATRIX_PROMPT 1\nhello world\n", 39);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s", f32, path, out), 1);
    assert_contains(log, "text.txt:2: prompt 1: prompt is text, but the model has no tokenizer metadata");
    st_write_file(path, "===== DS4_IMATRIX_PROMPT 1\n1 2 900\n", 35);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s", f32, path, out), 1);
    assert_contains(log, "token id outside the vocabulary (512)");
    st_write_file(path, "\n\n", 2);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s", f32, path, out), 1);
    assert_contains(log, "no prompts");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-out %s", f32, out), 2);
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s "
                                 "--imatrix-max-prompts 3 --imatrix-max-tokens 100",
                                 f32, calib, out),
                     0);
    assert_contains(log, "from 2 prompts, 100 tokens");
}

/* GPT-2's byte-level alphabet: the UTF-8 spelling of byte b's token. */
static void byte_token(int b, char *out) {
    int cp;
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), out[2] = 0;
}

/* Rendered-text prompts go through the model's tokenizer: a model with a
 * byte-level vocabulary (256 bytes, BOS, EOS, one merge "h e"). */
static void test_text_prompts(void **state) {
    (void)state;
    char tokpath[1024], model[1024], ds[1024], out[1024], log[8192];
    static char names[259][8];
    const char *toks[259];
    int32_t types[259];
    for (int b = 0; b < 256; b++) byte_token(b, names[b]), toks[b] = names[b], types[b] = 1;
    toks[256] = "<｜begin▁of▁sentence｜>", types[256] = 3;
    toks[257] = "<｜end▁of▁sentence｜>", types[257] = 3;
    toks[258] = "he", types[258] = 1;
    const char *merges[1] = {"h e"};
    ds4_err err = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_open(in_dir(tokpath, "tok.gguf"), 0, &err);
    ds4_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    ds4_gguf_w_str(w, "tokenizer.ggml.pre", "joyai-llm");
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 259);
    ds4_gguf_w_arr(w, "tokenizer.ggml.token_type", DS4_GGUF_I32, types, 259);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1);
    ds4_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 256);
    ds4_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 257);
    assert_int_equal(ds4_gguf_writer_close(w, &err), 0);
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-quantize --hf %s --out %s --recipe f16 --quiet "
                                 "--tokenizer-gguf %s",
                                 dir, in_dir(model, "tok-model.gguf"), tokpath),
                     0);
    const char *text = "===== DS4_IMATRIX_PROMPT 0 text\n<｜begin▁of▁sentence｜>hello\n"
                       "===== DS4_IMATRIX_PROMPT 1 ids\n1 2 3\n";
    st_write_file(in_dir(ds, "text-ds.txt"), text, strlen(text));
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s", model, ds,
                                 in_dir(out, "text.dat")),
                     0);
    /* BOS, "he", "l", "l", "o" and three ids */
    assert_contains(log, "from 2 prompts, 8 tokens");
}

static void qeval(const char *model, double *werr, double *kl) {
    char log[4096];
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-qeval %s %s --imatrix %s --dataset %s -t 2", f32, model, im, eval), 0);
    const char *p = strstr(log, "weighted error total");
    const char *q = strstr(log, "KL(ref || test) mean");
    assert_non_null(p);
    assert_non_null(q);
    assert_int_equal(sscanf(strstr(p, "relative"), "relative %lf", werr), 1);
    assert_int_equal(sscanf(q, "KL(ref || test) mean %lf", kl), 1);
}

static void test_imatrix_beats_synthetic(void **state) {
    (void)state;
    double we_syn, kl_syn, we_im, kl_im;
    qeval(q2, &we_syn, &kl_syn);
    qeval(q2im, &we_im, &kl_im);
    print_message("weighted error: synthetic %.6f imatrix %.6f; KL: synthetic %.6f imatrix %.6f\n", we_syn, we_im,
                  kl_syn, kl_im);
    assert_true(we_im < we_syn);
    assert_true(kl_im < kl_syn);
    double we_self, kl_self;
    qeval(f32, &we_self, &kl_self);
    assert_true(we_self == 0.0 && kl_self < 1e-9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_collected_file),
        cmocka_unit_test(test_hash_routing_seen),
        cmocka_unit_test(test_cli_errors),
        cmocka_unit_test(test_text_prompts),
        cmocka_unit_test(test_imatrix_beats_synthetic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
