/*
 * test_weights.c - the model loader (src/model/weights.c) on the committed
 * tiny model and on corrupted copies of it: a missing tensor, a wrong
 * shape, a storage type the layout does not accept, a foreign tensor, a hash
 * table pointing outside the experts, missing or wrong metadata and a
 * truncated file must each fail with a message naming the culprit.
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

#include "common/gguf_edit.h"
#include "format/quants.h"
#include "model/layout.h"
#include "model/weights.h"

#define MODEL "tests/golden/cpu/tiny-a.f16.gguf"

static void test_good_model_binds_every_tensor(void **state) {
    (void)state;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(MODEL, &err);
    if (!w) fail_msg("%s", ds4_err_msg(&err));
    const ds4_config *c = &w->cfg;
    assert_int_equal(c->n_layer, 6);
    assert_int_equal(w->token_embd.type, DS4_TYPE_F16);
    assert_int_equal(w->token_embd.ne[1], c->n_vocab);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        const ds4_layer_weights *L = &w->layers[il];
        assert_non_null(L->q_b.data);
        assert_true((L->comp_kv.data != NULL) == (c->compress_ratio[il] != 0));
        assert_true((L->idx_q_b.data != NULL) == (c->compress_ratio[il] == 4));
        assert_true((L->tid2eid.data != NULL) == (il < c->n_hash_layer));
        /* the optional selection bias is absent from the hash layers here */
        assert_true((L->exp_bias.data != NULL) == (il >= c->n_hash_layer));
        assert_int_equal(L->gate_exps.ne[2], c->n_expert);
        assert_int_equal(L->gate_exps.row_bytes, c->n_embd * 2);
    }
    ds4_weights_close(w);
}

static void expect_failure(const gguf_edit *e, const char *needle) {
    char path[96];
    snprintf(path, sizeof(path), "build/tests/bad-model.%d.gguf", (int)getpid());
    ds4_err err = {0};
    if (gguf_copy_edited(MODEL, path, e, &err) != 0) fail_msg("making the bad copy: %s", ds4_err_msg(&err));
    ds4_weights *w = ds4_weights_open(path, &err);
    unlink(path);
    if (w) {
        ds4_weights_close(w);
        fail_msg("a model expected to fail with '%s' loaded", needle);
    }
    printf("  %s\n", ds4_err_msg(&err));
    if (!strstr(ds4_err_msg(&err), needle)) fail_msg("message '%s' does not name '%s'", ds4_err_msg(&err), needle);
}

static void test_bad_tensors(void **state) {
    (void)state;
    expect_failure(&(gguf_edit){.drop_tensor = "blk.3.attn_compressor_kv.weight"},
                   "blk.3.attn_compressor_kv.weight is missing");
    expect_failure(&(gguf_edit){.drop_tensor = "output.weight"}, "output.weight is missing");
    expect_failure(&(gguf_edit){.short_tensor = "blk.2.attn_sinks.weight"},
                   "blk.2.attn_sinks.weight: shape [3], expected [4]");
    expect_failure(&(gguf_edit){.short_tensor = "blk.4.ffn_down_exps.weight"}, "blk.4.ffn_down_exps.weight: shape");
    expect_failure(&(gguf_edit){.f16_tensor = "blk.1.attn_norm.weight"}, "blk.1.attn_norm.weight: storage type f16");
    expect_failure(&(gguf_edit){.extra_tensor = "blk.0.attn_foo.weight"}, "blk.0.attn_foo.weight is not part");
    expect_failure(&(gguf_edit){.bad_hash = "blk.1.ffn_gate_tid2eid.weight"},
                   "blk.1.ffn_gate_tid2eid.weight: token 0 maps to expert");
}

static void test_bad_metadata(void **state) {
    (void)state;
    expect_failure(&(gguf_edit){.drop_key = "deepseek4.expert_count"}, "deepseek4.expert_count");
    expect_failure(&(gguf_edit){.ratio_key = "deepseek4.attention.compress_ratios"}, "compress_ratios[2] = 3");
    /* a consistent but different shape: every tensor then disagrees */
    expect_failure(&(gguf_edit){.u32_key = "deepseek4.attention.head_count", .u32_value = 8},
                   "blk.0.attn_q_b.weight: shape");
    expect_failure(&(gguf_edit){.u32_key = "deepseek4.block_count", .u32_value = 5},
                   "compress_ratios: 6 entries for deepseek4.block_count = 5");
    expect_failure(&(gguf_edit){.u32_key = "deepseek4.attention.output_group_count", .u32_value = 3},
                   "output_group_count 3");
    /* A ratio list of the wrong length names the key (6 layers: 6 entries,
     * or 7 with the MTP layer's 0, are right). */
    expect_failure(&(gguf_edit){.resize_key = "deepseek4.attention.compress_ratios", .resize_count = 5},
                   "deepseek4.attention.compress_ratios: 5 entries for deepseek4.block_count = 6");
    expect_failure(&(gguf_edit){.resize_key = "deepseek4.attention.compress_ratios", .resize_count = 8},
                   "deepseek4.attention.compress_ratios: 8 entries");
    /* Metadata of one model over tensors of another: the shape error names
     * the key the expected shape comes from. */
    expect_failure(&(gguf_edit){.u32_key = "deepseek4.expert_count", .u32_value = 12},
                   "expected [64, 12] by the metadata (deepseek4.expert_count)");
    expect_failure(
        &(gguf_edit){.u32_key = "deepseek4.embedding_length", .u32_value = 112},
        "token_embd.weight: shape [64, 256], expected [112, 256] by the metadata (deepseek4.embedding_length)");
}

/* The MTP layer's trailing 0 in the ratio list (as the official config
 * writes it) is accepted. */
static void test_ratio_list_with_mtp_entry(void **state) {
    (void)state;
    char path[96];
    snprintf(path, sizeof(path), "build/tests/mtp-ratios.%d.gguf", (int)getpid());
    ds4_err err = {0};
    gguf_edit e = {.resize_key = "deepseek4.attention.compress_ratios", .resize_count = 7};
    if (gguf_copy_edited(MODEL, path, &e, &err) != 0) fail_msg("%s", ds4_err_msg(&err));
    ds4_weights *w = ds4_weights_open(path, &err);
    unlink(path);
    if (!w) fail_msg("%s", ds4_err_msg(&err));
    ds4_weights_close(w);
}

static void test_truncated_file(void **state) {
    (void)state;
    char path[96];
    snprintf(path, sizeof(path), "build/tests/truncated.%d.gguf", (int)getpid());
    ds4_err err = {0};
    assert_int_equal(file_truncated_copy(MODEL, path, 1000, &err), 0);
    ds4_weights *w = ds4_weights_open(path, &err);
    unlink(path);
    assert_null(w);
    printf("  %s\n", ds4_err_msg(&err));
    assert_non_null(strstr(ds4_err_msg(&err), path));
}

/* The simulations' widths are asked for only when they run: a shape the
 * FP8 KV blocks or the 128-wide indexer rows cannot take is valid, runs
 * with the simulations off, and is refused with them on, saying why. */
static void test_sim_shapes(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    ds4_err err = {0};
    assert_int_equal(ds4_config_check_sim(&c, &err), 0);
    c.head_dim = 160; /* 96 non-RoPE values: not whole FP8 blocks of 64 */
    assert_int_equal(ds4_config_validate(&c, &err), 0);
    assert_int_equal(ds4_config_check_sim(&c, &err), -1);
    assert_non_null(strstr(err.msg, "FP8 KV"));
    ds4_config_flash(&c);
    c.idx_head_dim = 96;
    assert_int_equal(ds4_config_validate(&c, &err), 0);
    assert_int_equal(ds4_config_check_sim(&c, &err), -1);
    assert_non_null(strstr(err.msg, "indexer.key_length 96"));
    for (uint32_t il = 0; il < c.n_layer; il++) c.compress_ratio[il] = il % 2 ? 128 : 0; /* no indexer */
    assert_int_equal(ds4_config_check_sim(&c, &err), 0);
}

/* A header-only file: the metadata of `meta`, the tensor table of `layout`
 * (recipe q2), no data. */
static void write_header_file(const char *path, const ds4_config *meta, const ds4_config *layout) {
    ds4_err err = {0};
    ds4_gguf_writer *w = ds4_gguf_writer_open(path, 0, &err);
    assert_non_null(w);
    ds4_gguf_w_str(w, "general.architecture", "deepseek4");
    assert_int_equal(ds4_config_to_gguf(meta, w, &err), 0);
    size_t n = ds4_layout_count(layout);
    ds4_tensor_spec *specs = calloc(n, sizeof(*specs));
    ds4_layout_build(layout, specs);
    const ds4_recipe *r = ds4_recipe_get("q2");
    for (size_t i = 0; i < n; i++) {
        uint32_t type;
        if (!specs[i].generated) continue;
        assert_int_equal(ds4_recipe_type_for(r, &specs[i], &type, &err), 0);
        assert_int_equal(ds4_gguf_w_tensor(w, specs[i].name, specs[i].ndim, specs[i].ne, type), 0);
    }
    free(specs);
    assert_int_equal(ds4_gguf_writer_close_header(w, &err), 0);
}

/* Pro's header is accepted as Pro; Pro metadata over Flash's tensors (or
 * the reverse) is refused, naming the key the expected shape comes from. */
static void test_pro_and_flash_headers(void **state) {
    (void)state;
    char path[96];
    snprintf(path, sizeof(path), "build/tests/pro-header.%d.gguf", (int)getpid());
    ds4_config pro, flash;
    ds4_config_pro(&pro);
    ds4_config_flash(&flash);
    ds4_err err = {0};
    assert_int_equal(ds4_config_validate(&pro, &err), 0);
    assert_true(ds4_config_is_pro(&pro) && !ds4_config_is_flash(&pro));
    assert_string_equal(ds4_config_name(&pro), "DeepSeek V4 Pro");
    assert_int_equal(pro.compress_ratio[0], 128);
    assert_int_equal(pro.compress_ratio[1], 128);
    assert_int_equal(pro.compress_ratio[2], 4);
    assert_int_equal(pro.compress_ratio[60], 4);

    write_header_file(path, &pro, &pro);
    ds4_weights *w = ds4_weights_open_header(path, &err);
    if (!w) fail_msg("%s", ds4_err_msg(&err));
    assert_true(ds4_config_is_pro(&w->cfg));
    assert_int_equal(w->layers[60].gate_exps.ne[2], 384);
    assert_null(w->layers[60].gate_exps.data);
    ds4_weights_close(w);
    /* without data it does not load for running */
    assert_null(ds4_weights_open(path, &err));
    assert_non_null(strstr(ds4_err_msg(&err), "header-only"));

    write_header_file(path, &pro, &flash);
    assert_null(ds4_weights_open_header(path, &err));
    printf("  %s\n", ds4_err_msg(&err));
    assert_non_null(strstr(ds4_err_msg(&err), "token_embd.weight: shape [4096, 129280], expected [7168, 129280] by the "
                                              "metadata (deepseek4.embedding_length)"));
    write_header_file(path, &flash, &pro);
    assert_null(ds4_weights_open_header(path, &err));
    printf("  %s\n", ds4_err_msg(&err));
    assert_non_null(strstr(ds4_err_msg(&err), "deepseek4.embedding_length"));
    /* Flash's width with Pro's experts: the first expert tensor names the count */
    ds4_config mixed = flash;
    mixed.n_expert = 384;
    write_header_file(path, &flash, &mixed);
    assert_null(ds4_weights_open_header(path, &err));
    printf("  %s\n", ds4_err_msg(&err));
    assert_non_null(strstr(ds4_err_msg(&err), "(deepseek4.expert_count)"));
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_model_binds_every_tensor),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_bad_metadata),
        cmocka_unit_test(test_truncated_file),
        cmocka_unit_test(test_ratio_list_with_mtp_entry),
        cmocka_unit_test(test_sim_shapes),
        cmocka_unit_test(test_pro_and_flash_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
