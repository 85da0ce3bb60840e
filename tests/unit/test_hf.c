/*
 * test_hf.c - the official checkpoint as a weight source.
 *
 *  - The C generator of the tiny official checkpoint makes exactly the
 *    tensors of tests/reference/make_official_ckpt.py (per-tensor SHA-256
 *    against tests/golden/tools/tiny_ckpt.tsv), and the safetensors reader
 *    reads a file written by the safetensors library itself.
 *  - Every layout tensor of the tiny model decodes (FP8 blocks with partial
 *    edges, FP4 experts, BF16, F32, I64 tid2eid) to bytes identical to the
 *    all-F32 reference GGUF that numpy decoded independently
 *    (tests/golden/tools/tiny_ref_f32.tsv).
 *  - DeepSeek V4 Pro's layout: its names (61 layers, 384 experts, a
 *    compressor on layer 0), and a tiny checkpoint of its pattern (ratio
 *    128 on layers 0-1, one head an output group, routed scale 2.5)
 *    converted by ds4-quantize into a model that loads with those shapes
 *    and runs, spliced (ds4-splice) and scored (ds4-score).
 *  - Names follow docs/MODEL.md 2.6 for the full Flash layout; config.json
 *    maps to the expected ds4_config and bad files are refused clearly;
 *    missing, mistyped and misshapen sources give errors naming them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/official_ckpt.h"
#include "common/st_build.h"
#include "common/tool_run.h"
#include "convert/hf.h"
#include "model/backends.h"
#include "model/weights.h"

static void sha_hex(const void *data, size_t n, char out[65]) {
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(data, n, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

typedef struct golden_row {
    char name[128], type[16], dims[64], sha[65];
} golden_row;

static size_t load_golden(const char *path, golden_row *rows, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s", path);
    size_t n = 0;
    while (n < cap && fscanf(f, "%127s\t%15s\t%63s\t%64s", rows[n].name, rows[n].type, rows[n].dims, rows[n].sha) == 4)
        n++;
    fclose(f);
    return n;
}

static char *tiny_dir(const official_ckpt_opts *opts) {
    char *dir = st_tempdir();
    official_ckpt_write(dir, opts);
    return dir;
}

static void test_generator_matches_python(void **state) {
    (void)state;
    static golden_row rows[512];
    size_t n = load_golden("tests/golden/tools/tiny_ckpt.tsv", rows, 512);
    assert_int_equal(n, 234);
    char *dir = tiny_dir(NULL);
    ds4_err err = {0};
    ds4_st_ckpt *ck = ds4_st_ckpt_open(dir, &err);
    if (!ck) fail_msg("%s", err.msg);
    assert_int_equal(ds4_st_ckpt_count(ck), n);
    for (size_t i = 0; i < n; i++) {
        const ds4_st_tensor *t = ds4_st_ckpt_get(ck, rows[i].name, &err);
        if (!t) fail_msg("%s", err.msg);
        char dims[64] = "", sha[65];
        for (uint32_t d = 0; d < t->ndim; d++)
            snprintf(dims + strlen(dims), sizeof(dims) - strlen(dims), "%s%llu", d ? "," : "",
                     (unsigned long long)t->shape[d]);
        assert_string_equal(ds4_st_dtype_name(t->dtype), rows[i].type);
        assert_string_equal(dims, rows[i].dims);
        sha_hex(t->data, t->nbytes, sha);
        if (strcmp(sha, rows[i].sha) != 0) fail_msg("%s: bytes differ from the Python generator", rows[i].name);
    }
    ds4_st_ckpt_close(ck);
    st_rmdir(dir);
    free(dir);
}

static void test_reads_library_file(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_st_file *f = ds4_st_open("tests/golden/tools/st_library.safetensors", &err);
    if (!f) fail_msg("%s", err.msg);
    assert_int_equal(f->n_tensors, 4);
    const ds4_st_tensor *a = ds4_st_find(f, "a.f32");
    assert_int_equal(a->dtype, DS4_ST_F32);
    float av[6];
    memcpy(av, a->data, sizeof(av));
    for (int i = 0; i < 6; i++) assert_true(av[i] == (float)i - 2.5f);
    const ds4_st_tensor *c = ds4_st_find(f, "c.i64");
    int64_t cv[4];
    memcpy(cv, c->data, sizeof(cv));
    assert_true(cv[0] == -1 && cv[1] == 7 && cv[2] == (1ll << 40) && cv[3] == 0);
    assert_int_equal(ds4_st_find(f, "b.f16")->dtype, DS4_ST_F16);
    assert_int_equal(ds4_st_find(f, "d.i8")->shape[0], 4);
    ds4_st_close(f);
}

static int load_tiny(const char *dir, ds4_hf_config *hc, ds4_tensor_spec **specs, size_t *n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    ds4_err err = {0};
    if (ds4_hf_config_load(path, hc, &err) != 0) fail_msg("%s", err.msg);
    *n = ds4_layout_count(&hc->cfg);
    *specs = calloc(*n, sizeof(**specs));
    ds4_layout_build(&hc->cfg, *specs);
    return 0;
}

/* Decode every layout tensor and hash it as the F32 (or I32) GGUF data. */
static void test_decode_matches_numpy_reference(void **state) {
    (void)state;
    static golden_row rows[256];
    size_t nref = load_golden("tests/golden/tools/tiny_ref_f32.tsv", rows, 256);
    char *dir = tiny_dir(NULL);
    ds4_hf_config hc;
    ds4_tensor_spec *specs;
    size_t n;
    load_tiny(dir, &hc, &specs, &n);
    ds4_err err = {0};
    ds4_st_ckpt *ck = ds4_st_ckpt_open(dir, &err);
    size_t matched = 0;
    for (size_t i = 0; i < n; i++) {
        const ds4_tensor_spec *t = &specs[i];
        char hf[160];
        assert_int_equal(ds4_hf_name(t, 0, hf, sizeof(hf), &err), 0);
        if (t->optional && !ds4_st_ckpt_has(ck, hf)) continue;
        uint64_t nel = t->ne[0] * t->ne[1] * t->ne[2];
        uint8_t *buf = malloc(nel * 4);
        int nexp = t->ndim == 3 ? (int)t->ne[2] : 1;
        uint64_t per = nel / (uint64_t)nexp;
        for (int e = 0; e < nexp; e++) {
            ds4_hf_source src;
            if (ds4_hf_resolve(ck, &hc, t, t->ndim == 3 ? e : -1, &src, &err) != 0) fail_msg("%s", err.msg);
            int rc = t->cls == DS4_TC_HASH
                         ? ds4_hf_decode_i32(&src, hc.cfg.n_expert, (int32_t *)buf, &err)
                         : ds4_hf_decode_rows(&src, 0, src.rows, (float *)buf + per * (uint64_t)e, &err);
            if (rc != 0) fail_msg("%s", err.msg);
        }
        char sha[65];
        sha_hex(buf, nel * 4, sha);
        free(buf);
        size_t r = 0;
        while (r < nref && strcmp(rows[r].name, t->name) != 0) r++;
        if (r == nref) fail_msg("%s missing from the reference", t->name);
        if (strcmp(sha, rows[r].sha) != 0) fail_msg("%s: decoded values differ from numpy's", t->name);
        matched++;
    }
    assert_int_equal(matched, nref);
    ds4_st_ckpt_close(ck);
    free(specs);
    st_rmdir(dir);
    free(dir);
}

static void test_names_of_flash_layout(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    size_t n = ds4_layout_count(&c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    ds4_layout_build(&c, specs);
    ds4_err err = {0};
    char buf[160];
    for (size_t i = 0; i < n; i++)
        if (ds4_hf_name(&specs[i], 255, buf, sizeof(buf), &err) != 0) fail_msg("%s", err.msg);
    static const struct {
        const char *gguf, *hf;
    } want[] = {
        {"token_embd.weight", "embed.weight"},
        {"output_hc_fn.weight", "hc_head_fn"},
        {"blk.0.ffn_gate_tid2eid.weight", "layers.0.ffn.gate.tid2eid"},
        {"blk.42.attn_sinks.weight", "layers.42.attn.attn_sink"},
        {"blk.42.indexer.proj.weight", "layers.42.attn.indexer.weights_proj.weight"},
        {"blk.41.attn_compressor_ape.weight", "layers.41.attn.compressor.ape"},
        {"blk.4.indexer_compressor_gate.weight", "layers.4.attn.indexer.compressor.wgate.weight"},
        {"blk.7.exp_probs_b.bias", "layers.7.ffn.gate.bias"},
        {"blk.7.ffn_up_shexp.weight", "layers.7.ffn.shared_experts.w3.weight"},
        {"blk.7.ffn_down_exps.weight", "layers.7.ffn.experts.255.w2.weight"},
        {"blk.7.ffn_up_exps.weight", "layers.7.ffn.experts.255.w3.weight"},
    };
    for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
        size_t i = 0;
        while (i < n && strcmp(specs[i].name, want[w].gguf) != 0) i++;
        assert_true(i < n);
        assert_int_equal(ds4_hf_name(&specs[i], 255, buf, sizeof(buf), &err), 0);
        assert_string_equal(buf, want[w].hf);
    }
    assert_int_equal(ds4_hf_scale_name("layers.1.attn.wkv.weight", buf, sizeof(buf), &err), 0);
    assert_string_equal(buf, "layers.1.attn.wkv.scale");
    assert_int_equal(ds4_hf_scale_name("hc_head_fn", buf, sizeof(buf), &err), -1);
    free(specs);
}

static void test_config_json(void **state) {
    (void)state;
    ds4_hf_config hc;
    ds4_err err = {0};
    /* A copy of the official config.json (shared/reference/config.json). */
    if (ds4_hf_config_load("tests/golden/tools/flash_config.json", &hc, &err) != 0) fail_msg("%s", err.msg);
    assert_true(ds4_config_is_flash(&hc.cfg));
    assert_int_equal(hc.fp8_block_out, 128);

    char *dir = st_tempdir();
    char path[1024];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    static const struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"hidden_size\":", "config.json: line"},
        {"[1]", "not a JSON object"},
        {"{\"num_hidden_layers\":4}", "missing key \"hidden_size\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        st_write_file(path, bad[i].json, strlen(bad[i].json));
        assert_int_equal(ds4_hf_config_load(path, &hc, &err), -1);
        assert_contains(err.msg, bad[i].expect);
    }
    st_rmdir(dir);
    free(dir);
}

static void expect_resolve_error(const official_ckpt_opts *opts, const char *gguf, const char *want1,
                                 const char *want2) {
    char *dir = tiny_dir(opts);
    ds4_hf_config hc;
    ds4_tensor_spec *specs;
    size_t n;
    load_tiny(dir, &hc, &specs, &n);
    ds4_err err = {0};
    ds4_st_ckpt *ck = ds4_st_ckpt_open(dir, &err);
    size_t i = 0;
    while (i < n && strcmp(specs[i].name, gguf) != 0) i++;
    assert_true(i < n);
    ds4_hf_source src;
    assert_int_equal(ds4_hf_resolve(ck, &hc, &specs[i], specs[i].ndim == 3 ? 1 : -1, &src, &err), -1);
    assert_contains(err.msg, want1);
    assert_contains(err.msg, want2);
    ds4_st_ckpt_close(ck);
    free(specs);
    st_rmdir(dir);
    free(dir);
}

static void test_bad_sources(void **state) {
    (void)state;
    official_ckpt_opts o = {.spoil = "layers.0.ffn.gate.tid2eid", .spoil_dtype = "F64"};
    expect_resolve_error(&o, "blk.0.ffn_gate_tid2eid.weight", "dtype F64 cannot hold blk.0.ffn_gate_tid2eid.weight",
                         "expected I64 or I32");
    o = (official_ckpt_opts){.spoil = "layers.1.attn.wkv.scale", .spoil_dtype = "I8"};
    expect_resolve_error(&o, "blk.1.attn_kv.weight", "layers.1.attn.wkv.scale: dtype I8, expected F8_E8M0 or U8",
                         "for blk.1.attn_kv.weight");
    o = (official_ckpt_opts){.spoil = "layers.1.attn.wkv.weight", .spoil_transpose = true};
    expect_resolve_error(&o, "blk.1.attn_kv.weight",
                         "tensor layers.1.attn.wkv.weight: shape [256, 128], expected [128, 256]",
                         "model-00002-of-00003.safetensors");
    o = (official_ckpt_opts){.spoil = "layers.3.ffn.experts.1.w2.scale", .spoil_transpose = true};
    expect_resolve_error(&o, "blk.3.ffn_down_exps.weight", "layers.3.ffn.experts.1.w2.scale: shape [8, 256]",
                         "expected [256, 8]");
    o = (official_ckpt_opts){.spoil = "layers.2.attn_norm.weight", .spoil_dtype = "I16"};
    expect_resolve_error(&o, "blk.2.attn_norm.weight", "dtype I16 cannot hold blk.2.attn_norm.weight", "float");
}

static void test_pro_layout(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_pro(&c);
    size_t n = ds4_layout_count(&c);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    ds4_layout_build(&c, specs);
    ds4_err err = {0};
    static const struct {
        const char *gguf, *hf;
        int expert;
    } want[] = {
        {"blk.0.attn_compressor_ape.weight", "layers.0.attn.compressor.ape", 0},
        {"blk.1.attn_compressor_kv.weight", "layers.1.attn.compressor.wkv.weight", 0},
        {"blk.60.indexer.attn_q_b.weight", "layers.60.attn.indexer.wq_b.weight", 0},
        {"blk.60.ffn_down_exps.weight", "layers.60.ffn.experts.383.w2.weight", 383},
        {"blk.59.attn_output_a.weight", "layers.59.attn.wo_a.weight", 0},
    };
    char buf[160];
    for (size_t w = 0; w < sizeof(want) / sizeof(want[0]); w++) {
        size_t i = 0;
        while (i < n && strcmp(specs[i].name, want[w].gguf) != 0) i++;
        if (i == n) fail_msg("%s is not in Pro's layout", want[w].gguf);
        assert_int_equal(ds4_hf_name(&specs[i], want[w].expert, buf, sizeof(buf), &err), 0);
        assert_string_equal(buf, want[w].hf);
    }
    free(specs);

    /* A checkpoint of Pro's pattern, converted and run. */
    struct stat st;
    if (stat("./ds4-quantize", &st) != 0) {
        printf("SKIP: ./ds4-quantize is not built\n");
        skip();
    }
    char *dir = tiny_dir(&(official_ckpt_opts){.pro = true});
    ds4_hf_config hc;
    char path[1024], log[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    if (ds4_hf_config_load(path, &hc, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(hc.cfg.compress_ratio[0], 128);
    assert_int_equal(hc.cfg.compress_ratio[1], 128);
    assert_int_equal(hc.cfg.o_groups, 4);
    assert_int_equal(hc.cfg.n_expert, 8);
    assert_true(hc.cfg.expert_weights_scale == 2.5f);
    snprintf(path, sizeof(path), "%s/pro.gguf", dir);
    if (run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q8_0 --quiet", dir, path) != 0)
        fail_msg("ds4-quantize: %s", log);
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) fail_msg("%s", err.msg);
    assert_int_equal(w->cfg.compress_ratio[0], 128);
    assert_non_null(w->layers[0].comp_kv.data);
    assert_true(w->cfg.expert_weights_scale == 2.5f);
    ds4_backend_opts o = {.n_threads = 2, .ctx_size = 256};
    ds4_backend *b = ds4_backend_create("cpu", w, &o, &err);
    if (!b) fail_msg("%s", err.msg);
    uint32_t toks[140];
    for (uint32_t i = 0; i < 140; i++) toks[i] = (i * 37 + 11) % 512; /* a ratio-128 row closes */
    assert_int_equal(ds4_backend_prefill(b, toks, 140, NULL, &err), 0);
    const float *lg = ds4_backend_logits(b);
    for (uint32_t v = 0; v < 512; v++)
        if (!isfinite(lg[v])) fail_msg("logit %u is %g", v, lg[v]);
    ds4_backend_free(b);
    ds4_weights_close(w);

    /* The splicer and the scorer on it: layers 0-1's experts from a q2
     * conversion, then scored on a case of token ids. */
    char q2[1100], spliced[1100], out[1100];
    snprintf(q2, sizeof(q2), "%s/pro-q2.gguf", dir);
    snprintf(spliced, sizeof(spliced), "%s/pro-spliced.gguf", dir);
    if (run_capture(log, sizeof(log), "./ds4-quantize --hf %s --out %s --recipe q2 --quiet", dir, q2) != 0 ||
        run_capture(log, sizeof(log), "./ds4-splice --base %s --donor %s --out %s --layers 0-1", path, q2, spliced) !=
            0)
        fail_msg("%s", log);
    w = ds4_weights_open(spliced, &err);
    if (!w) fail_msg("%s", err.msg);
    assert_int_equal(w->layers[0].gate_exps.type, DS4_TYPE_IQ2_XXS);
    assert_int_equal(w->layers[2].gate_exps.type, DS4_TYPE_Q8_0);
    ds4_weights_close(w);
    snprintf(out, sizeof(out), "%s/p.txt", dir);
    FILE *f = fopen(out, "w");
    for (uint32_t i = 0; i < 140; i++) fprintf(f, "%u ", toks[i]);
    fclose(f);
    snprintf(out, sizeof(out), "%s/t.txt", dir);
    f = fopen(out, "w");
    fprintf(f, "5 9 200\n");
    fclose(f);
    snprintf(out, sizeof(out), "%s/manifest.tsv", dir);
    f = fopen(out, "w");
    fprintf(f, "case1\tp.txt\tt.txt\n");
    fclose(f);
    if (run_capture(log, sizeof(log), "./ds4-score %s %s %s/scores.tsv 512 -t 2 --token-ids", spliced, out, dir) != 0)
        fail_msg("ds4-score: %s", log);
    st_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generator_matches_python),
        cmocka_unit_test(test_reads_library_file),
        cmocka_unit_test(test_decode_matches_numpy_reference),
        cmocka_unit_test(test_names_of_flash_layout),
        cmocka_unit_test(test_config_json),
        cmocka_unit_test(test_bad_sources),
        cmocka_unit_test(test_pro_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
