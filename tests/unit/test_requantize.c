/*
 * test_requantize.c - ./ds4-quantize --gguf: a ds4 GGUF decoded and
 * quantized again, on tiny models from ./ds4-mkmodel and on the shipped
 * small model (data/models).
 *
 *  - The same type in and out gives the same bytes for F32, F16, BF16 and
 *    Q8_0 (the model file and the MTP block's), the metadata carried over
 *    key by key, the tokenizer too.
 *  - The shipped small model to the q8_0 recipe: every tensor that keeps
 *    its type keeps its bytes; the files load, the MTP block binds.
 *  - An imatrix collected by ./ds4-imatrix changes the 2- and 4-bit
 *    experts (nothing else) and lowers their importance-weighted error
 *    against the source (./ds4-qeval).
 *  - Truncated, foreign, tokenizer-only and damaged inputs, an MTP file in
 *    the wrong place and usage errors fail clearly and write nothing.
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
#include <unistd.h>

#include "common/gguf_edit.h"
#include "common/st_build.h"
#include "common/tool_run.h"
#include "format/gguf.h"
#include "format/quants.h"
#include "model/weights.h"

#define SMALL     "data/models/ds4-small.gguf"
#define SMALL_MTP "data/models/ds4-small-mtp.gguf"

static char *dir;
static char logbuf[1 << 16];

static char *in_dir(const char *name) {
    static char bufs[8][1024];
    static int k;
    char *b = bufs[k++ & 7];
    snprintf(b, 1024, "%s/%s", dir, name);
    return b;
}

static int setup(void **state) {
    (void)state;
    const char *progs[] = {"./ds4-quantize", "./ds4-mkmodel", "./ds4-imatrix", "./ds4-qeval"};
    for (size_t i = 0; i < sizeof(progs) / sizeof(progs[0]); i++)
        if (!file_exists(progs[i])) {
            fprintf(stderr, "%s is missing: run make first\n", progs[i]);
            return -1;
        }
    dir = st_tempdir();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_rmdir(dir);
    free(dir);
    return 0;
}

static void run_ok(const char *what, int rc) {
    if (rc != 0) fail_msg("%s failed (%d): %s", what, rc, logbuf);
}

/* A 4-layer tiny model and its MTP block in `recipe`, with extra options. */
static void mkmodel(const char *out, const char *mtp, const char *opts) {
    run_ok("ds4-mkmodel",
           run_capture(logbuf, sizeof(logbuf), "./ds4-mkmodel -q --set layers=4 -o %s --mtp %s %s", out, mtp, opts));
}

static void requantize(const char *in, const char *mtp_in, const char *out, const char *mtp_out, const char *opts) {
    run_ok("ds4-quantize --gguf",
           run_capture(logbuf, sizeof(logbuf),
                       "./ds4-quantize --gguf %s --mtp-gguf %s --out %s --mtp-out %s --quiet --overwrite %s", in,
                       mtp_in, out, mtp_out, opts));
}

static bool same_value(const ds4_gguf_value *a, const ds4_gguf_value *b) {
    if (a->type != b->type) return false;
    switch (a->type) {
    case DS4_GGUF_STRING: return a->s.len == b->s.len && memcmp(a->s.ptr, b->s.ptr, a->s.len) == 0;
    case DS4_GGUF_F32:
    case DS4_GGUF_F64: return a->f == b->f;
    case DS4_GGUF_BOOL: return a->b == b->b;
    case DS4_GGUF_ARRAY:
        if (a->a.type != b->a.type || a->a.count != b->a.count) return false;
        if (a->a.type != DS4_GGUF_STRING)
            return memcmp(a->a.data, b->a.data, a->a.count * ds4_gguf_vtype_size(a->a.type)) == 0;
        for (uint64_t i = 0; i < a->a.count; i++)
            if (a->a.strs[i].len != b->a.strs[i].len ||
                memcmp(a->a.strs[i].ptr, b->a.strs[i].ptr, a->a.strs[i].len) != 0)
                return false;
        return true;
    default: return a->u == b->u;
    }
}

/* Every key of `in` is in `out` with its value, but the quantizer's own. */
static void check_metadata_carried(const ds4_gguf *in, const ds4_gguf *out) {
    for (uint64_t i = 0; i < in->n_kv; i++) {
        const char *key = in->kv[i].key;
        if (strncmp(key, "quantize.", 9) == 0 || strcmp(key, "general.quantization_version") == 0) continue;
        const ds4_gguf_kv *kv = ds4_gguf_find_kv(out, key);
        if (!kv) fail_msg("%s: key %s not carried over", out->path, key);
        if (!same_value(&in->kv[i].value, &kv->value)) fail_msg("%s: key %s changed", out->path, key);
    }
    ds4_str s;
    ds4_err err = {0};
    assert_int_equal(ds4_gguf_get_str(out, "quantize.source", &s, &err), 0);
    assert_true(ds4_str_eq(s, in->path));
}

/* Tensors in the same order; returns how many kept their type, failing
 * when one of those changed its bytes. */
static int same_type_tensors_identical(const ds4_gguf *in, const ds4_gguf *out) {
    assert_int_equal(in->n_tensors, out->n_tensors);
    int kept = 0;
    for (uint64_t i = 0; i < in->n_tensors; i++) {
        const ds4_gguf_tensor *a = &in->tensors[i], *b = &out->tensors[i];
        assert_string_equal(a->name, b->name);
        if (a->type != b->type) continue;
        kept++;
        if (memcmp(a->data, b->data, a->nbytes) != 0)
            fail_msg("%s: %s (%s) differs after requantization", out->path, a->name, ds4_type_get(a->type)->name);
    }
    return kept;
}

static void check_identity(const char *name, const char *mk_opts, const char *q_opts) {
    char in[1024], mtp[1024], out[1024], mout[1024];
    snprintf(in, sizeof(in), "%s", in_dir("id-in.gguf"));
    snprintf(mtp, sizeof(mtp), "%s", in_dir("id-in-mtp.gguf"));
    snprintf(out, sizeof(out), "%s", in_dir("id-out.gguf"));
    snprintf(mout, sizeof(mout), "%s", in_dir("id-out-mtp.gguf"));
    mkmodel(in, mtp, mk_opts);
    requantize(in, mtp, out, mout, q_opts);
    ds4_gguf *a = gguf_open_or_fail(in), *b = gguf_open_or_fail(out), *ma = gguf_open_or_fail(mtp),
             *mb = gguf_open_or_fail(mout);
    print_message("%s: %d tensors, %d MTP tensors identical\n", name, same_type_tensors_identical(a, b),
                  same_type_tensors_identical(ma, mb));
    assert_int_equal(same_type_tensors_identical(a, b), (int)a->n_tensors);
    assert_int_equal(same_type_tensors_identical(ma, mb), (int)ma->n_tensors);
    check_metadata_carried(a, b);
    check_metadata_carried(ma, mb);
    ds4_gguf_close(a);
    ds4_gguf_close(b);
    ds4_gguf_close(ma);
    ds4_gguf_close(mb);
}

/* F32, F16, BF16 and Q8_0 decode to values their own encoder gives back
 * unchanged (Q8_0: the block's largest value decodes to 127 d, which
 * gives d again, and every other value to q d). */
static void test_same_type_identical(void **state) {
    (void)state;
    check_identity("f32", "--recipe f32", "--recipe f32");
    check_identity("f16", "--recipe f16", "--recipe f16");
    check_identity("q8_0", "--recipe q8_0", "--recipe q8_0");
    check_identity("bf16", "--recipe f16 --type routed-w1=bf16 --type shared=bf16 --type embedding=bf16",
                   "--recipe f16 --routed-w1 bf16 --shared bf16 --embedding bf16");
}

/* The shipped model (Q8_0, its tokenizer, training provenance) to the
 * q8_0 recipe, whose embedding, compressor and indexer are F16. */
static void test_small_model(void **state) {
    (void)state;
    char out[1024], mout[1024];
    snprintf(out, sizeof(out), "%s", in_dir("small-q8_0.gguf"));
    snprintf(mout, sizeof(mout), "%s", in_dir("small-q8_0-mtp.gguf"));
    requantize(SMALL, SMALL_MTP, out, mout, "--recipe q8_0");
    ds4_gguf *a = gguf_open_or_fail(SMALL), *b = gguf_open_or_fail(out), *ma = gguf_open_or_fail(SMALL_MTP),
             *mb = gguf_open_or_fail(mout);
    int kept = same_type_tensors_identical(a, b);
    print_message("ds4-small: %d of %d tensors keep type and bytes\n", kept, (int)a->n_tensors);
    assert_true(kept >= 150);
    assert_int_equal(ds4_gguf_find_tensor(b, "token_embd.weight")->type, DS4_TYPE_F16);
    assert_int_equal(same_type_tensors_identical(ma, mb), (int)ma->n_tensors);
    check_metadata_carried(a, b);
    check_metadata_carried(ma, mb);
    assert_non_null(ds4_gguf_find_kv(b, "tokenizer.ggml.merges"));
    assert_null(ds4_gguf_find_kv(mb, "tokenizer.ggml.tokens"));
    ds4_gguf_close(a);
    ds4_gguf_close(b);
    ds4_gguf_close(ma);
    ds4_gguf_close(mb);
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(out, &err);
    if (!w) fail_msg("%s", err.msg);
    ds4_mtp_weights *m = ds4_mtp_open(mout, w, &err);
    if (!m) fail_msg("%s", err.msg);
    ds4_mtp_close(m);
    ds4_weights_close(w);
    /* the plan names the source types */
    run_ok("--dry-run", run_capture(logbuf, sizeof(logbuf), "./ds4-quantize --gguf %s --dry-run --recipe q4", SMALL));
    assert_contains(logbuf, "q8_0     -> q4_k");
}

/* A dataset of token-id prompts from a small LCG. */
static void write_dataset(const char *path, int prompts, int len, uint32_t seed) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    uint32_t x = seed;
    for (int p = 0; p < prompts; p++) {
        fprintf(f, "===== DS4_IMATRIX_PROMPT %d\n", p);
        for (int i = 0; i < len; i++) {
            x = x * 1664525u + 1013904223u;
            fprintf(f, "%u%c", (x >> 8) % 1024, i % 16 == 15 ? '\n' : ' ');
        }
    }
    fclose(f);
}

static double weighted_error(const char *ref, const char *model, const char *im) {
    run_ok("ds4-qeval", run_capture(logbuf, sizeof(logbuf), "./ds4-qeval %s %s --imatrix %s -t 2", ref, model, im));
    const char *p = strstr(logbuf, "weighted error total");
    assert_non_null(p);
    double e;
    assert_int_equal(sscanf(strstr(p, "relative"), "relative %lf", &e), 1);
    return e;
}

static bool is_routed_name(const char *name) { return strstr(name, "_exps.") != NULL; }

/* With and without the imatrix: only the routed experts differ. */
static void check_only_experts_differ(const char *a_path, const char *b_path) {
    ds4_gguf *a = gguf_open_or_fail(a_path), *b = gguf_open_or_fail(b_path);
    int differ = 0;
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const ds4_gguf_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        bool same = x->nbytes == y->nbytes && memcmp(x->data, y->data, x->nbytes) == 0;
        if (is_routed_name(x->name)) differ += !same;
        else if (!same) fail_msg("%s changed with the imatrix", x->name);
    }
    assert_int_equal(differ, 4 * 3);
    ds4_err err = {0};
    uint64_t n;
    assert_int_equal(ds4_gguf_get_u64(b, "quantize.imatrix.entries_count", &n, &err), 0);
    assert_int_equal(n, 4 * 3);
    assert_null(ds4_gguf_find_kv(a, "quantize.imatrix.file"));
    ds4_gguf_close(a);
    ds4_gguf_close(b);
}

static void test_imatrix_applied(void **state) {
    (void)state;
    char f32[1024], mtp[1024], im[1024], calib[1024];
    snprintf(f32, sizeof(f32), "%s", in_dir("im-f32.gguf"));
    snprintf(mtp, sizeof(mtp), "%s", in_dir("im-f32-mtp.gguf"));
    snprintf(im, sizeof(im), "%s", in_dir("im.dat"));
    snprintf(calib, sizeof(calib), "%s", in_dir("calib.txt"));
    mkmodel(f32, mtp, "--recipe f32 --seed 3");
    write_dataset(calib, 16, 64, 7);
    run_ok("ds4-imatrix",
           run_capture(logbuf, sizeof(logbuf), "./ds4-imatrix %s --imatrix-dataset %s --imatrix-out %s -c 256 -t 2",
                       f32, calib, im));
    const char *recipes[2] = {"q2", "q4"};
    for (int r = 0; r < 2; r++) {
        char plain[1024], with[1024], opts[1200];
        snprintf(plain, sizeof(plain), "%s/%s.gguf", dir, recipes[r]);
        snprintf(with, sizeof(with), "%s/%s-im.gguf", dir, recipes[r]);
        snprintf(opts, sizeof(opts), "--recipe %s", recipes[r]);
        run_ok("ds4-quantize",
               run_capture(logbuf, sizeof(logbuf), "./ds4-quantize --gguf %s --out %s --quiet %s", f32, plain, opts));
        run_ok("ds4-quantize --imatrix",
               run_capture(logbuf, sizeof(logbuf),
                           "./ds4-quantize --gguf %s --out %s --quiet %s --imatrix %s --imatrix-strict", f32, with,
                           opts, im));
        assert_contains(logbuf, "96 matrices from the imatrix, 0 from column energy"); /* 4 x 3 x 8 experts */
        check_only_experts_differ(plain, with);
        double e_plain = weighted_error(f32, plain, im), e_with = weighted_error(f32, with, im);
        print_message("%s: importance-weighted expert error %.6f without the imatrix, %.6f with it\n", recipes[r],
                      e_plain, e_with);
        assert_true(e_with < e_plain);
    }
}

static void expect_failure(const char *args, const char *part1, const char *part2) {
    char *out = in_dir("bad-out.gguf");
    unlink(out);
    int rc = run_capture(logbuf, sizeof(logbuf), "./ds4-quantize %s --out %s --quiet", args, out);
    if (rc != 1) fail_msg("ds4-quantize %s: exit %d, expected 1: %s", args, rc, logbuf);
    assert_contains(logbuf, part1);
    assert_contains(logbuf, part2);
    assert_false(file_exists(out));
}

static void write_foreign(const char *path, bool tokenizer_only) {
    ds4_err err = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_non_null(w);
    const char *tokens[2] = {"a", "b"};
    if (tokenizer_only) {
        ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, 2);
    } else {
        ds4_gguf_w_str(w, "general.architecture", "llama");
        ds4_gguf_w_u32(w, "llama.block_count", 2);
        uint64_t ne[1] = {4};
        float v[4] = {1, 2, 3, 4};
        ds4_gguf_w_tensor(w, "output_norm.weight", 1, ne, DS4_TYPE_F32);
        ds4_gguf_w_data(w, v, sizeof(v));
    }
    assert_int_equal(ds4_gguf_writer_close(w, &err), 0);
}

static void test_bad_inputs(void **state) {
    (void)state;
    char good[1024], mtp[1024], other_mtp[1024], args[4096];
    snprintf(good, sizeof(good), "%s", in_dir("good.gguf"));
    snprintf(mtp, sizeof(mtp), "%s", in_dir("good-mtp.gguf"));
    snprintf(other_mtp, sizeof(other_mtp), "%s", in_dir("other-mtp.gguf"));
    mkmodel(good, mtp, "--recipe q8_0");
    mkmodel(in_dir("other.gguf"), other_mtp, "--recipe q8_0 --set ff=512");
    ds4_err err = {0};

    char *p = in_dir("truncated.gguf");
    assert_int_equal(file_truncated_copy(good, p, 1000, &err), 0);
    snprintf(args, sizeof(args), "--gguf %s", p);
    expect_failure(args, p, "past the end of the file");

    p = in_dir("llama.gguf");
    write_foreign(p, false);
    snprintf(args, sizeof(args), "--gguf %s", p);
    expect_failure(args, "--gguf: not a ds4 model: ", "architecture \"llama\"");

    p = in_dir("tok.gguf");
    write_foreign(p, true);
    snprintf(args, sizeof(args), "--gguf %s", p);
    expect_failure(args, p, "a tokenizer-only GGUF");

    snprintf(args, sizeof(args), "--gguf README.md");
    expect_failure(args, "README.md", "not a GGUF file");

    p = in_dir("dropped.gguf");
    gguf_edit e = {.drop_tensor = "blk.1.attn_q_a.weight"};
    assert_int_equal(gguf_copy_edited(good, p, &e, &err), 0);
    snprintf(args, sizeof(args), "--gguf %s", p);
    expect_failure(args, p, "has no tensor blk.1.attn_q_a.weight");

    p = in_dir("short.gguf");
    e = (gguf_edit){.short_tensor = "blk.1.attn_norm.weight"};
    assert_int_equal(gguf_copy_edited(good, p, &e, &err), 0);
    snprintf(args, sizeof(args), "--gguf %s", p);
    expect_failure(args, "tensor blk.1.attn_norm.weight has shape [255]", "the model's metadata gives [256]");

    p = in_dir("hash.gguf");
    e = (gguf_edit){.bad_hash = "blk.0.ffn_gate_tid2eid.weight"};
    assert_int_equal(gguf_copy_edited(good, p, &e, &err), 0);
    snprintf(args, sizeof(args), "--gguf %s", p);
    expect_failure(args, "blk.0.ffn_gate_tid2eid.weight: element 0 = 1048576", "outside [0, 8)");

    snprintf(args, sizeof(args), "--gguf %s", mtp);
    expect_failure(args, "holds an MTP block, not a model", "--mtp-gguf");
    snprintf(args, sizeof(args), "--gguf %s --mtp-gguf %s --mtp-out %s", good, other_mtp, in_dir("m.gguf"));
    expect_failure(args, other_mtp, "describes another model");
    snprintf(args, sizeof(args), "--gguf %s --mtp-out %s", good, in_dir("m.gguf"));
    expect_failure(args, "the MTP block", "has no tensor mtp.0.");

    /* usage errors */
    assert_int_equal(run_capture(logbuf, sizeof(logbuf), "./ds4-quantize --gguf %s --hf %s --out x", good, dir), 2);
    assert_contains(logbuf, "--hf DIR or --gguf FILE");
    assert_int_equal(run_capture(logbuf, sizeof(logbuf), "./ds4-quantize --gguf %s --mtp-gguf %s --out x", good, mtp),
                     2);
    assert_contains(logbuf, "--mtp-gguf goes with --gguf and --mtp-out");
}

/* A tensor the layout does not have is left out with a warning. */
static void test_extra_tensor_warned(void **state) {
    (void)state;
    char good[1024], extra[1024];
    snprintf(good, sizeof(good), "%s", in_dir("good.gguf"));
    snprintf(extra, sizeof(extra), "%s", in_dir("extra.gguf"));
    if (!file_exists(good)) mkmodel(good, in_dir("good-mtp.gguf"), "--recipe q8_0");
    ds4_err err = {0};
    gguf_edit e = {.extra_tensor = "blk.1.mystery.weight"};
    assert_int_equal(gguf_copy_edited(good, extra, &e, &err), 0);
    run_ok("ds4-quantize", run_capture(logbuf, sizeof(logbuf), "./ds4-quantize --gguf %s --out %s --quiet --overwrite",
                                       extra, in_dir("extra-out.gguf")));
    assert_contains(logbuf, "1 tensor not in the model's layout left out (blk.1.mystery.weight)");
    ds4_gguf *g = gguf_open_or_fail(in_dir("extra-out.gguf"));
    assert_null(ds4_gguf_find_tensor(g, "blk.1.mystery.weight"));
    ds4_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_type_identical), cmocka_unit_test(test_small_model),
        cmocka_unit_test(test_imatrix_applied),     cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_extra_tensor_warned),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
