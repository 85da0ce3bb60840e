/*
 * test_quantize.c - ./ds4-quantize end to end on the tiny official
 * checkpoint (tests/unit/common/official_ckpt.c).
 *
 *  - f32 recipe: every tensor is bit-identical to the all-F32 reference that
 *    numpy decoded independently (tests/golden/tools/tiny_ref_f32.tsv), in
 *    layout order, and the deepseek4.* metadata reads back as config.json.
 *  - q2 recipe: the recipe's types, values close to the f32 ones, and the
 *    same bytes with 1 and 3 threads.
 *  - imatrix: provenance keys, different IQ2_XXS bytes than the synthetic
 *    fallback, --imatrix-strict and size mismatches refused.
 *  - tokenizer metadata copied from --tokenizer-gguf; --tensor-type;
 *    --dry-run writes nothing; --overwrite; usage errors exit 2.
 *  - corrupt inputs (missing shard, wrong dtype, shape mismatch, truncated
 *    shard) fail with messages naming file and tensor, and leave no output.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/official_ckpt.h"
#include "common/st_build.h"
#include "common/tool_run.h"
#include "convert/hf.h"
#include "format/gguf.h"
#include "format/imatrix.h"
#include "format/quants.h"
#include "model/backends.h"
#include "model/weights.h"

static char *ckpt;    /* a clean checkpoint shared by the tests */
static char *scratch; /* outputs */

static char *path_in(const char *dir, const char *file) {
    static char bufs[4][1024];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 1024, "%s/%s", dir, file);
    return b;
}

static int setup(void **state) {
    (void)state;
    if (!file_exists("./ds4-quantize")) {
        fprintf(stderr, "./ds4-quantize is missing: run make first\n");
        return -1;
    }
    ckpt = st_tempdir();
    official_ckpt_write(ckpt, NULL);
    scratch = st_tempdir();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    st_rmdir(ckpt);
    st_rmdir(scratch);
    free(ckpt);
    free(scratch);
    return 0;
}

static void sha_hex(const void *data, size_t n, char out[65]) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(data, n, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

static void quantize_ok(const char *extra, const char *out) {
    static char log[1 << 16];
    unlink(out);
    int rc = run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --quiet %s", ckpt, out, extra);
    if (rc != 0) fail_msg("ds4-quantize %s failed (%d): %s", extra, rc, log);
}

static void test_f32_matches_numpy_reference(void **state) {
    (void)state;
    char *out = path_in(scratch, "f32.gguf");
    quantize_ok("--recipe f32 --threads 2", out);
    ds4_gguf *g = gguf_open_or_fail(out);
    FILE *f = fopen("tests/golden/tools/tiny_ref_f32.tsv", "r");
    assert_non_null(f);
    char name[128], dims[64], sha[65], got[65];
    unsigned type;
    uint64_t i = 0;
    while (fscanf(f, "%127s\t%u\t%63s\t%64s", name, &type, dims, sha) == 4) {
        assert_true(i < g->n_tensors);
        const ds4_gguf_tensor *t = &g->tensors[i++];
        assert_string_equal(t->name, name); /* same order as the reference */
        assert_int_equal(t->type, type);
        char d[64] = "";
        for (uint32_t k = 0; k < t->ndim; k++)
            snprintf(d + strlen(d), sizeof(d) - strlen(d), "%s%llu", k ? "," : "", (unsigned long long)t->ne[k]);
        assert_string_equal(d, dims);
        sha_hex(t->data, t->nbytes, got);
        if (strcmp(got, sha) != 0) fail_msg("%s differs from the numpy reference", name);
    }
    fclose(f);
    assert_int_equal(i, g->n_tensors);

    ds4_err err = {0};
    ds4_config c;
    ds4_hf_config hc;
    if (ds4_config_from_gguf(g, &c, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(ds4_hf_config_load(path_in(ckpt, "config.json"), &hc, &err), 0);
    assert_memory_equal(&c, &hc.cfg, sizeof(c));
    ds4_str arch;
    assert_int_equal(ds4_gguf_get_str(g, "general.architecture", &arch, &err), 0);
    assert_true(ds4_str_eq(arch, "deepseek4"));
    assert_null(ds4_gguf_find_kv(g, "quantize.imatrix.file"));
    ds4_gguf_close(g);
}

/* Logits after each of `n` tokens from the CPU backend; caller frees. */
static float *forward_logits(const char *model, const uint32_t *tokens, uint32_t n, uint32_t *n_vocab) {
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(model, &err);
    if (!w) fail_msg("%s", err.msg);
    ds4_backend_opts bo = {.n_threads = 2};
    ds4_backend *b = ds4_backend_create("cpu", w, &bo, &err);
    if (!b) fail_msg("%s", err.msg);
    *n_vocab = w->cfg.n_vocab;
    float *logits = malloc((size_t)n * *n_vocab * sizeof(float));
    if (ds4_backend_prefill(b, tokens, n, logits, &err) != 0) fail_msg("%s", err.msg);
    ds4_backend_free(b);
    ds4_weights_close(w);
    return logits;
}

static const uint32_t logit_tokens[8] = {1, 5, 9, 200, 33, 7, 100, 511};

/* The engine's logits on our f32 output equal its logits on the reference
 * GGUF (decoded from the checkpoint independently, in numpy, and written by
 * gguf-py) to 1e-4 relative.  tests/golden/tools/tiny_ref_logits.f32 is a
 * regression golden written by this engine (./ds4-forward on that reference
 * file, make_official_ckpt.py): it pins the conversion, not the forward
 * pass, whose independent references are the transformers goldens. */
static void test_f32_logits_match_reference(void **state) {
    (void)state;
    char *out = path_in(scratch, "f32.gguf");
    if (!file_exists(out)) quantize_ok("--recipe f32", out);
    uint32_t nv;
    float *got = forward_logits(out, logit_tokens, 8, &nv);
    float *want = malloc((size_t)8 * nv * sizeof(float));
    FILE *f = fopen("tests/golden/tools/tiny_ref_logits.f32", "rb");
    assert_non_null(f);
    assert_int_equal(fread(want, sizeof(float), (size_t)8 * nv, f), (size_t)8 * nv);
    fclose(f);
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < (size_t)8 * nv; i++) {
        max_diff = fmax(max_diff, fabs((double)got[i] - want[i]));
        max_ref = fmax(max_ref, fabs((double)want[i]));
    }
    if (max_diff > 1e-4 * max_ref) fail_msg("logits differ: max |diff| %g, max |ref| %g", max_diff, max_ref);
    free(got);
    free(want);
}

static double rel_rms(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += (a[i] - b[i]) * (double)(a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

static double tensor_error(const ds4_gguf *q, const ds4_gguf *ref, const char *name) {
    const ds4_gguf_tensor *a = ds4_gguf_find_tensor(q, name), *b = ds4_gguf_find_tensor(ref, name);
    assert_non_null(a);
    float *da = malloc(a->nelements * sizeof(float));
    ds4_dequantize_row(a->type, a->data, da, (int64_t)a->nelements);
    double e = rel_rms(da, b->data, a->nelements);
    free(da);
    return e;
}

static void test_q2_types_values_and_threads(void **state) {
    (void)state;
    char *ref = path_in(scratch, "f32.gguf"), *q1 = path_in(scratch, "q2-1.gguf"), *q3 = path_in(scratch, "q2-3.gguf");
    if (!file_exists(ref)) quantize_ok("--recipe f32", ref);
    quantize_ok("--recipe q2 --threads 1", q1);
    quantize_ok("--recipe q2 --threads 3", q3);
    ds4_gguf *a = gguf_open_or_fail(q1), *b = gguf_open_or_fail(q3), *r = gguf_open_or_fail(ref);
    assert_int_equal(a->n_tensors, r->n_tensors);
    const ds4_recipe *q2 = ds4_recipe_get("q2");
    ds4_err err = {0};
    ds4_config c;
    assert_int_equal(ds4_config_from_gguf(a, &c, &err), 0);
    size_t n = ds4_layout_count(&c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    ds4_layout_build(&c, specs);
    for (size_t i = 0; i < n; i++) {
        const ds4_gguf_tensor *t = ds4_gguf_find_tensor(a, specs[i].name);
        if (!t) {
            assert_true(specs[i].optional);
            continue;
        }
        assert_int_equal(t->type, q2->type[specs[i].cls]);
        const ds4_gguf_tensor *u = ds4_gguf_find_tensor(b, specs[i].name);
        assert_int_equal(t->nbytes, u->nbytes);
        if (memcmp(t->data, u->data, t->nbytes) != 0) fail_msg("%s: 1 and 3 threads differ", t->name);
    }
    free(specs);
    /* 2-bit experts lose a lot, but far less than random; 8-bit is close. */
    assert_true(tensor_error(a, r, "blk.1.ffn_gate_exps.weight") < 0.6);
    assert_true(tensor_error(a, r, "blk.3.ffn_down_exps.weight") < 0.6);
    assert_true(tensor_error(a, r, "blk.2.attn_q_b.weight") < 0.02);
    assert_true(tensor_error(a, r, "token_embd.weight") < 1e-3);
    /* The q2 model loads and runs. */
    uint32_t nv;
    float *logits = forward_logits(q1, logit_tokens, 8, &nv);
    for (size_t i = 0; i < (size_t)8 * nv; i++) assert_true(isfinite(logits[i]));
    free(logits);
    ds4_gguf_close(a);
    ds4_gguf_close(b);
    ds4_gguf_close(r);
}

/* An imatrix with packed vectors for every routed tensor of the tiny
 * model, emphasising the first columns. */
static void write_imatrix(const char *p, bool complete, uint32_t wrong_len) {
    ds4_err err = {0};
    ds4_imatrix *im = ds4_imatrix_new(&err);
    const char *parts[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int il = 0; il < 4; il++)
        for (int k = 0; k < 3; k++) {
            if (!complete && il == 3 && k == 2) continue;
            char name[64];
            snprintf(name, sizeof(name), "blk.%d.%s.weight", il, parts[k]);
            uint32_t n = wrong_len && il == 1 ? wrong_len : 4 * 256;
            ds4_imatrix_entry *e = ds4_imatrix_entry_get(im, name, n, &err);
            for (uint32_t i = 0; i < n; i++) e->values[i] = (float)(1 + (i % 256 < 16 ? 1000 : i % 7));
            e->ncall = 3;
        }
    ds4_imatrix_set_trailer(im, 5, "prompts.txt", &err);
    assert_int_equal(ds4_imatrix_save(im, p, &err), 0);
    ds4_imatrix_free(im);
}

static void test_imatrix(void **state) {
    (void)state;
    char *im = path_in(scratch, "im.dat"), *out = path_in(scratch, "q2-im.gguf");
    char *plain = path_in(scratch, "q2-1.gguf");
    if (!file_exists(plain)) quantize_ok("--recipe q2", plain);
    write_imatrix(im, true, 0);
    char args[1200];
    snprintf(args, sizeof(args), "--recipe q2 --imatrix %s --imatrix-strict", im);
    quantize_ok(args, out);
    ds4_gguf *g = gguf_open_or_fail(out), *p = gguf_open_or_fail(plain);
    ds4_err err = {0};
    ds4_str s;
    uint64_t v;
    assert_int_equal(ds4_gguf_get_str(g, "quantize.imatrix.file", &s, &err), 0);
    assert_true(ds4_str_eq(s, im));
    assert_int_equal(ds4_gguf_get_u64(g, "quantize.imatrix.entries_count", &v, &err), 0);
    assert_int_equal(v, 12);
    assert_int_equal(ds4_gguf_get_u64(g, "quantize.imatrix.chunks_count", &v, &err), 0);
    assert_int_equal(v, 5);
    assert_int_equal(ds4_gguf_get_str(g, "quantize.imatrix.dataset", &s, &err), 0);
    assert_true(ds4_str_eq(s, "prompts.txt"));
    const ds4_gguf_tensor *a = ds4_gguf_find_tensor(g, "blk.2.ffn_gate_exps.weight");
    const ds4_gguf_tensor *b = ds4_gguf_find_tensor(p, "blk.2.ffn_gate_exps.weight");
    assert_int_equal(a->nbytes, b->nbytes);
    assert_true(memcmp(a->data, b->data, a->nbytes) != 0);
    const ds4_gguf_tensor *x = ds4_gguf_find_tensor(g, "blk.2.attn_q_a.weight");
    const ds4_gguf_tensor *y = ds4_gguf_find_tensor(p, "blk.2.attn_q_a.weight");
    assert_memory_equal(x->data, y->data, x->nbytes); /* Q8_0 ignores importance */
    ds4_gguf_close(g);
    ds4_gguf_close(p);

    char log[1 << 14];
    write_imatrix(im, false, 0);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --quiet --overwrite %s", ckpt, out, args), 1);
    assert_contains(log, "blk.3.ffn_down_exps.weight: no imatrix vector for expert 0 (--imatrix-strict)");
    write_imatrix(im, true, 100);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --quiet --overwrite %s", ckpt, out, args), 1);
    assert_contains(log, "imatrix entry blk.1.ffn_gate_exps.weight has 100 values, expected 256 or 4 x 256");
}

static void test_tokenizer_and_overrides(void **state) {
    (void)state;
    char *tok = path_in(scratch, "tok.gguf"), *out = path_in(scratch, "tok-out.gguf");
    ds4_err err = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_open(tok, 0, &err);
    const char *tokens[3] = {"<bos>", "a", "b"};
    const char *merges[1] = {"a b"};
    ds4_gguf_w_str(w, "general.architecture", "deepseek4");
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, 3);
    ds4_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, NULL, 1);
    ds4_gguf_w_str(w, "tokenizer.ggml.pre", "joyai-llm");
    assert_int_equal(ds4_gguf_writer_close(w, &err), 0);
    char args[1200];
    snprintf(args, sizeof(args),
             "--recipe q2 --tokenizer-gguf %s --tensor-type blk.1.=f16 --experts q4_k "
             "--name tiny",
             tok);
    quantize_ok(args, out);
    ds4_gguf *g = gguf_open_or_fail(out);
    const ds4_gguf_array *a;
    assert_int_equal(ds4_gguf_get_arr(g, "tokenizer.ggml.tokens", DS4_GGUF_STRING, &a, &err), 0);
    assert_int_equal(a->count, 3);
    assert_true(ds4_str_eq(a->strs[2], "b"));
    ds4_str s;
    assert_int_equal(ds4_gguf_get_str(g, "tokenizer.ggml.pre", &s, &err), 0);
    assert_int_equal(ds4_gguf_get_str(g, "general.name", &s, &err), 0);
    assert_true(ds4_str_eq(s, "tiny"));
    assert_int_equal(ds4_gguf_find_tensor(g, "blk.1.ffn_gate_exps.weight")->type, DS4_TYPE_F16);
    assert_int_equal(ds4_gguf_find_tensor(g, "blk.1.attn_q_a.weight")->type, DS4_TYPE_F16);
    assert_int_equal(ds4_gguf_find_tensor(g, "blk.1.attn_norm.weight")->type, DS4_TYPE_F32);
    assert_int_equal(ds4_gguf_find_tensor(g, "blk.2.ffn_down_exps.weight")->type, DS4_TYPE_Q4_K);
    assert_int_equal(ds4_gguf_find_tensor(g, "blk.2.attn_q_a.weight")->type, DS4_TYPE_Q8_0);
    ds4_gguf_close(g);
}

static void test_cli(void **state) {
    (void)state;
    char log[1 << 16];
    char *out = path_in(scratch, "cli.gguf");
    unlink(out);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --dry-run --recipe q4", ckpt), 0);
    assert_contains(log, "blk.3.ffn_down_exps.weight");
    assert_contains(log, "I8       -> q4_k");
    assert_contains(log, "tensors: 116");
    assert_false(file_exists(out));
    quantize_ok("--recipe f16", out);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe f16", ckpt, out), 1);
    assert_contains(log, "exists (use --overwrite");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe f16 --overwrite --quiet", ckpt, out),
        0);
    assert_contains(log, "elements/s");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q3", ckpt, out), 2);
    assert_contains(log, "unknown recipe \"q3\"");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --experts q5_k", ckpt, out), 2);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --out %s", out), 2);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --threads 0", ckpt, out), 2);
    assert_int_equal(
        run_capture(log, sizeof(log),
                    "./ds4-quantize --hf %s --out %s --tensor-type blk.0.attn_norm.weight=q8_0 --overwrite", ckpt, out),
        1);
    assert_contains(log, "blk.0.attn_norm.weight: type q8_0 (from --tensor-type) is not accepted");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe f16 --overwrite --quiet", ckpt, out),
        0);
    assert_contains(log, "warning: no tokenizer");
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-quantize --hf %s --out %s --recipe f16 --overwrite "
                                 "--tokenizer data/tokenizer/deepseek-v4-tokenizer.json.xz",
                                 ckpt, out),
                     1);
    assert_contains(log, "129280 tokens, more than the model's vocab_size 512");
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --tokenizer a --tokenizer-gguf b", ckpt, out),
        2);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --help"), 0);
    assert_contains(log, "--routed-w2");
}

static void test_compare_tensor(void **state) {
    (void)state;
    char log[1 << 14];
    char *q2 = path_in(scratch, "cmp-q2.gguf"), *bad = path_in(scratch, "cmp-bad.gguf");
    quantize_ok("--recipe q2", q2);
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-quantize --hf %s --compare-tensor blk.2.ffn_up_exps.weight "
                                 "--compare-gguf %s",
                                 ckpt, q2),
                     0);
    assert_contains(log, "blk.2.ffn_up_exps.weight iq2_xxs 67584 bytes");
    assert_contains(log, "identical");
    /* Flip one byte of that tensor in a copy. */
    ds4_gguf *g = gguf_open_or_fail(q2);
    uint64_t off = (uint64_t)((const uint8_t *)ds4_gguf_find_tensor(g, "blk.2.ffn_up_exps.weight")->data - g->base);
    uint8_t *copy = malloc(g->size);
    memcpy(copy, g->base, g->size);
    copy[off + 1000] ^= 0x40;
    st_write_file(bad, copy, g->size);
    free(copy);
    ds4_gguf_close(g);
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-quantize --hf %s --compare-tensor blk.2.ffn_up_exps.weight "
                                 "--compare-gguf %s",
                                 ckpt, bad),
                     1);
    assert_contains(log, "1 bytes differ, first at offset 1000");
    assert_int_equal(run_capture(log, sizeof(log),
                                 "./ds4-quantize --hf %s --compare-tensor blk.9.attn_kv.weight "
                                 "--compare-gguf %s",
                                 ckpt, q2),
                     1);
    assert_contains(log, "no such tensor in the model");
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --compare-tensor x", ckpt), 2);
}

static void expect_failure(const official_ckpt_opts *opts, void (*damage)(const char *dir), const char *w1,
                           const char *w2) {
    char *dir = st_tempdir();
    official_ckpt_write(dir, opts);
    if (damage) damage(dir);
    char log[1 << 14];
    char *out = path_in(scratch, "bad.gguf");
    unlink(out);
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --quiet", dir, out), 1);
    assert_contains(log, w1);
    assert_contains(log, w2);
    assert_false(file_exists(out));
    st_rmdir(dir);
    free(dir);
}

static void drop_shard(const char *dir) { unlink(path_in(dir, "model-00003-of-00003.safetensors")); }

static void truncate_shard(const char *dir) {
    char *p = path_in(dir, "model-00002-of-00003.safetensors");
    struct stat st;
    stat(p, &st);
    assert_int_equal(truncate(p, st.st_size - 1000), 0);
}

static void test_corrupt_inputs(void **state) {
    (void)state;
    expect_failure(NULL, drop_shard, "model-00003-of-00003.safetensors", "missing");
    expect_failure(NULL, truncate_shard, "model-00002-of-00003.safetensors", "truncated");
    official_ckpt_opts o = {.spoil = "layers.2.ffn.gate.tid2eid", .spoil_dtype = "F64"};
    expect_failure(&o, NULL, "layers.2.ffn.gate.tid2eid: dtype F64 cannot hold blk.2.ffn_gate_tid2eid.weight",
                   "model-00002-of-00003.safetensors");
    o = (official_ckpt_opts){.spoil = "layers.3.ffn.experts.2.w1.weight", .spoil_transpose = true};
    expect_failure(&o, NULL, "layers.3.ffn.experts.2.w1.weight: shape [128, 256], expected [256, 128]",
                   "for blk.3.ffn_gate_exps.weight");
    o = (official_ckpt_opts){.spoil = "layers.0.attn.wq_b.scale", .spoil_dtype = "I8"};
    expect_failure(&o, NULL, "layers.0.attn.wq_b.scale: dtype ", "expected F8_E8M0 or U8");
}

/* --mtp-out: the checkpoint's MTP block in a file of its own, with the
 * policy's types (the recipe, --experts, --tensor-type), that the loader
 * binds to the main file and the CPU backend drafts with; a checkpoint
 * missing one of its tensors is refused naming it, before anything is
 * written. */
static void test_mtp_block(void **state) {
    (void)state;
    char *dir = st_tempdir(), *dir2 = st_tempdir();
    official_ckpt_opts mo = {.mtp_block = true};
    official_ckpt_write(dir, &mo);
    static char log[1 << 16];
    char out[1024], mtp[1024];
    snprintf(out, sizeof(out), "%s", path_in(scratch, "mtp-main.gguf"));
    snprintf(mtp, sizeof(mtp), "%s", path_in(scratch, "mtp-block.gguf"));
    unlink(out);
    unlink(mtp);
    int rc = run_capture(log, sizeof(log),
                         "./ds4-quantize --hf %s --out %s --mtp-out %s --quiet --recipe q2 --experts q4_k "
                         "--tensor-type mtp.0.e_proj.weight=f16",
                         dir, out, mtp);
    if (rc != 0) fail_msg("ds4-quantize --mtp-out failed (%d): %s", rc, log);
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(out, &err);
    if (!w) fail_msg("%s", err.msg);
    assert_null(ds4_gguf_find_tensor(w->gguf, "mtp.0.e_proj.weight")); /* the main file has no block */
    ds4_mtp_weights *m = ds4_mtp_open(mtp, w, &err);
    if (!m) fail_msg("%s", err.msg);
    assert_int_equal(m->blk.gate_exps.type, DS4_TYPE_Q4_K);
    assert_int_equal(m->blk.down_exps.type, DS4_TYPE_Q4_K);
    assert_int_equal(m->e_proj.type, DS4_TYPE_F16);
    assert_int_equal(m->h_proj.type, w->layers[0].q_a.type); /* the recipe's attention projections */
    assert_int_equal(m->blk.q_a.type, w->layers[0].q_a.type);
    assert_int_equal(m->enorm.type, DS4_TYPE_F32);
    /* the CPU backend drafts with it: finite logits */
    ds4_backend_opts bo = {.n_threads = 1, .ctx_size = 64, .mtp = m};
    ds4_backend *b = ds4_backend_create("cpu", w, &bo, &err);
    if (!b) fail_msg("%s", err.msg);
    uint32_t toks[3] = {1, 2, 3};
    assert_int_equal(ds4_backend_prefill(b, toks, 3, NULL, &err), 0);
    ds4_seq *ms = ds4_mtp_seq_new(b, 0, &err);
    assert_non_null(ms);
    float *lg = malloc(w->cfg.n_vocab * sizeof(float));
    ds4_row r = ds4_mtp_row(ms, 4, DS4_ROW_LOGITS, b->main, 2);
    ds4_step_out so = {lg, NULL};
    assert_int_equal(ds4_backend_mtp_step(b, &r, 1, &so, &err), 0);
    for (uint32_t v = 0; v < w->cfg.n_vocab; v++) assert_true(isfinite(lg[v]));
    free(lg);
    ds4_seq_free(b, ms);
    ds4_backend_free(b);
    ds4_mtp_close(m);
    ds4_weights_close(w);
    /* the plan of both files */
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --dry-run --mtp-out %s", dir, mtp), 0);
    assert_contains(log, "MTP block (");
    assert_contains(log, "mtp.0.ffn_gate_exps.weight");
    /* a checkpoint without h_proj: refused naming it, nothing written */
    official_ckpt_opts drop = {.mtp_block = true, .drop = "mtp.0.h_proj.weight"};
    official_ckpt_write(dir2, &drop);
    unlink(out);
    unlink(mtp);
    assert_int_equal(
        run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --mtp-out %s --quiet", dir2, out, mtp), 1);
    assert_contains(log, "the MTP block");
    assert_contains(log, "mtp.0.h_proj.weight");
    assert_false(file_exists(out));
    assert_false(file_exists(mtp));
    /* the default checkpoint has no block to convert */
    assert_int_equal(run_capture(log, sizeof(log), "./ds4-quantize --hf %s --mtp-out %s --quiet", ckpt, mtp), 1);
    assert_contains(log, "mtp.0.");
    st_rmdir(dir);
    st_rmdir(dir2);
    free(dir);
    free(dir2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_matches_numpy_reference),
        cmocka_unit_test(test_f32_logits_match_reference),
        cmocka_unit_test(test_q2_types_values_and_threads),
        cmocka_unit_test(test_imatrix),
        cmocka_unit_test(test_tokenizer_and_overrides),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_compare_tensor),
        cmocka_unit_test(test_corrupt_inputs),
        cmocka_unit_test(test_mtp_block),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
