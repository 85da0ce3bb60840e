/*
 * test_tensors.c - the tensor table (model/tensors.h) and the inventory
 * derived from it (model/layout.h):
 *  - the rows cover the weight structs exactly: one ds4_wt field per row,
 *    no field twice, no field left out, names unique;
 *  - the Flash inventory is the one of docs/MODEL.md 2.3-2.4, tensor by
 *    tensor, names and dims copied from its tables (not from the code);
 *  - the layer list under another block's prefix gives the shared part of
 *    the MTP block of MODEL.md 2.5 (dense, router bias required), which is
 *    how a second kind of block uses the table;
 *  - the CPU-side walk over a model's views (ds4_weights_at) visits every
 *    field of the structs once, each with its own row.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layout.h"
#include "model/weights.h"

static void check_list(const ds4_tensor_row *rows, size_t n, size_t struct_first, size_t struct_bytes) {
    bool *seen = calloc(n, sizeof(bool));
    for (size_t i = 0; i < n; i++) {
        size_t off = rows[i].offset;
        assert_true(off >= struct_first && off + sizeof(ds4_wt) <= struct_first + struct_bytes);
        assert_int_equal((off - struct_first) % sizeof(ds4_wt), 0);
        size_t k = (off - struct_first) / sizeof(ds4_wt);
        if (seen[k]) fail_msg("%s: a second row for the same field", rows[i].name);
        seen[k] = true;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(rows[i].name, rows[j].name) == 0) fail_msg("GGUF name %s twice", rows[i].name);
            if (strcmp(rows[i].hf, rows[j].hf) == 0) fail_msg("HF name %s twice", rows[i].hf);
        }
    }
    free(seen);
}

static void test_rows_cover_the_structs(void **state) {
    (void)state;
    assert_int_equal(sizeof(ds4_layer_weights), DS4_N_LAYER_TENSORS * sizeof(ds4_wt));
    check_list(ds4_layer_rows, DS4_N_LAYER_TENSORS, 0, sizeof(ds4_layer_weights));
    /* The global fields sit together in ds4_weights, token_embd first. */
    check_list(ds4_global_rows, DS4_N_GLOBAL_TENSORS, offsetof(ds4_weights, token_embd),
               DS4_N_GLOBAL_TENSORS * sizeof(ds4_wt));
    assert_int_equal(ds4_layer_rows[0].offset, offsetof(ds4_layer_weights, hc_attn_fn));
    assert_int_equal(ds4_layer_rows[DS4_N_LAYER_TENSORS - 1].offset, offsetof(ds4_layer_weights, down_sh));
}

/* docs/MODEL.md 2.3-2.4 for the Flash shapes (GGUF dims). */
typedef struct want {
    const char *name;
    uint64_t ne[3];
} want;

static const want GLOBALS[] = {
    {"token_embd.weight", {4096, 129280, 1}}, {"output_hc_base.weight", {4, 1, 1}},
    {"output_hc_fn.weight", {16384, 4, 1}},   {"output_hc_scale.weight", {1, 1, 1}},
    {"output_norm.weight", {4096, 1, 1}},     {"output.weight", {4096, 129280, 1}},
};
static const want EVERY_LAYER[] = {
    {"hc_attn_fn.weight", {16384, 24, 1}},       {"hc_attn_scale.weight", {3, 1, 1}},
    {"hc_attn_base.weight", {24, 1, 1}},         {"attn_norm.weight", {4096, 1, 1}},
    {"attn_q_a.weight", {4096, 1024, 1}},        {"attn_q_a_norm.weight", {1024, 1, 1}},
    {"attn_q_b.weight", {1024, 32768, 1}},       {"attn_kv.weight", {4096, 512, 1}},
    {"attn_kv_a_norm.weight", {512, 1, 1}},      {"attn_sinks.weight", {64, 1, 1}},
    {"attn_output_a.weight", {4096, 8192, 1}},   {"attn_output_b.weight", {8192, 4096, 1}},
    {"hc_ffn_fn.weight", {16384, 24, 1}},        {"hc_ffn_scale.weight", {3, 1, 1}},
    {"hc_ffn_base.weight", {24, 1, 1}},          {"ffn_norm.weight", {4096, 1, 1}},
    {"ffn_gate_inp.weight", {4096, 256, 1}},     {"exp_probs_b.bias", {256, 1, 1}},
    {"ffn_gate_exps.weight", {4096, 2048, 256}}, {"ffn_up_exps.weight", {4096, 2048, 256}},
    {"ffn_down_exps.weight", {2048, 4096, 256}}, {"ffn_gate_shexp.weight", {4096, 2048, 1}},
    {"ffn_up_shexp.weight", {4096, 2048, 1}},    {"ffn_down_shexp.weight", {2048, 4096, 1}},
};
static const want HASH_LAYER[] = {{"ffn_gate_tid2eid.weight", {6, 129280, 1}}};
static const want RATIO4[] = {
    {"attn_compressor_ape.weight", {1024, 4, 1}},       {"attn_compressor_kv.weight", {4096, 1024, 1}},
    {"attn_compressor_gate.weight", {4096, 1024, 1}},   {"attn_compressor_norm.weight", {512, 1, 1}},
    {"indexer.attn_q_b.weight", {1024, 8192, 1}},       {"indexer.proj.weight", {4096, 64, 1}},
    {"indexer_compressor_ape.weight", {256, 4, 1}},     {"indexer_compressor_kv.weight", {4096, 256, 1}},
    {"indexer_compressor_gate.weight", {4096, 256, 1}}, {"indexer_compressor_norm.weight", {128, 1, 1}},
};
static const want RATIO128[] = {
    {"attn_compressor_ape.weight", {512, 128, 1}},
    {"attn_compressor_kv.weight", {4096, 512, 1}},
    {"attn_compressor_gate.weight", {4096, 512, 1}},
    {"attn_compressor_norm.weight", {512, 1, 1}},
};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The spec named prefix + w->name, with w's dims. */
static void expect(const ds4_tensor_spec *specs, size_t n, const char *prefix, const want *w) {
    char name[64];
    snprintf(name, sizeof(name), "%s%s", prefix, w->name);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(specs[i].name, name) != 0) continue;
        for (int d = 0; d < 3; d++)
            if (specs[i].ne[d] != w->ne[d])
                fail_msg("%s: ne[%d] = %llu, MODEL.md says %llu", name, d, (unsigned long long)specs[i].ne[d],
                         (unsigned long long)w->ne[d]);
        return;
    }
    fail_msg("%s is missing from the inventory", name);
}

static void expect_all(const ds4_tensor_spec *s, size_t n, const char *prefix, const want *w, size_t nw) {
    for (size_t i = 0; i < nw; i++) expect(s, n, prefix, &w[i]);
}

static void test_flash_inventory_is_the_documented_one(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    size_t n = ds4_layout_count(&c);
    ds4_tensor_spec *s = calloc(n, sizeof(*s));
    assert_int_equal(ds4_layout_build(&c, s), n);
    /* 43 layers: 0-2 hash-routed, 0-1 dense, ratio 4 on even layers from 2
     * (21 of them) and ratio 128 on odd ones from 3 (20). */
    size_t total = COUNT(GLOBALS) + 43 * COUNT(EVERY_LAYER) + 3 * COUNT(HASH_LAYER) + 21 * COUNT(RATIO4) +
                   20 * COUNT(RATIO128);
    assert_int_equal(n, total);
    expect_all(s, n, "", GLOBALS, COUNT(GLOBALS));
    size_t optional = 0, generated = 0;
    for (int il = 0; il < 43; il++) {
        char p[16];
        snprintf(p, sizeof(p), "blk.%d.", il);
        expect_all(s, n, p, EVERY_LAYER, COUNT(EVERY_LAYER));
        if (il < 3) expect_all(s, n, p, HASH_LAYER, COUNT(HASH_LAYER));
        if (il >= 2 && il % 2 == 0) expect_all(s, n, p, RATIO4, COUNT(RATIO4));
        if (il >= 3 && il % 2 == 1) expect_all(s, n, p, RATIO128, COUNT(RATIO128));
    }
    for (size_t i = 0; i < n; i++) {
        optional += s[i].optional;
        generated += s[i].generated;
        assert_true(s[i].optional == (s[i].cls == DS4_TC_ROUTER_BIAS));
    }
    /* The router bias: optional everywhere, not generated on hash layers. */
    assert_int_equal(optional, 43);
    assert_int_equal(generated, n - 3);
    /* File order: globals, then layer by layer; within a layer the
     * attention tensors, compressor, indexer, FFN. */
    assert_string_equal(s[0].name, "token_embd.weight");
    assert_string_equal(s[6].name, "blk.0.hc_attn_fn.weight");
    size_t i2 = 0;
    while (strcmp(s[i2].name, "blk.2.hc_attn_fn.weight") != 0) i2++;
    assert_string_equal(s[i2 + 12].name, "blk.2.attn_compressor_ape.weight");
    assert_string_equal(s[i2 + 16].name, "blk.2.indexer.attn_q_b.weight");
    assert_string_equal(s[i2 + 22].name, "blk.2.hc_ffn_fn.weight");
    assert_string_equal(s[n - 1].name, "blk.42.ffn_down_shexp.weight");
    free(s);
}

/* MODEL.md 2.5: the MTP block's tensors "with the same shapes as a
 * main-layer block", under "mtp.0.". */
static const char *const MTP_SHARED[] = {
    "hc_attn_fn.weight",     "hc_attn_scale.weight",  "hc_attn_base.weight",  "attn_norm.weight",
    "attn_q_a.weight",       "attn_q_a_norm.weight",  "attn_q_b.weight",      "attn_kv.weight",
    "attn_kv_a_norm.weight", "attn_sinks.weight",     "attn_output_a.weight", "attn_output_b.weight",
    "hc_ffn_fn.weight",      "hc_ffn_scale.weight",   "hc_ffn_base.weight",   "ffn_norm.weight",
    "ffn_gate_inp.weight",   "exp_probs_b.bias",      "ffn_gate_exps.weight", "ffn_up_exps.weight",
    "ffn_down_exps.weight",  "ffn_gate_shexp.weight", "ffn_up_shexp.weight",  "ffn_down_shexp.weight",
};

static void test_layer_list_under_another_prefix(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    ds4_block mtp = {.layer = -1, .prefix = "mtp.0.", .hf_prefix = "mtp.0.", .bias_required = true};
    size_t n = ds4_layout_block(&c, ds4_layer_rows, DS4_N_LAYER_TENSORS, &mtp, NULL);
    assert_int_equal(n, COUNT(MTP_SHARED));
    ds4_tensor_spec *s = calloc(n, sizeof(*s));
    assert_int_equal(ds4_layout_block(&c, ds4_layer_rows, DS4_N_LAYER_TENSORS, &mtp, s), n);
    ds4_block layer5 = ds4_block_layer(&c, 5);
    for (size_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof(name), "mtp.0.%s", MTP_SHARED[i]);
        assert_string_equal(s[i].name, name);
        assert_false(s[i].optional); /* the router bias is required here */
        assert_true(s[i].generated);
        assert_string_equal(s[i].hf_prefix, "mtp.0.");
        /* the same shapes as a main-layer block */
        for (int d = 0; d < 3; d++) assert_int_equal(s[i].ne[d], ds4_dim_value(&c, &layer5, s[i].row->ne[d]));
    }
    free(s);
}

static void test_views_walk_every_field(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    c.n_layer = 4;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_synthetic(&c, "q2", 1, &err);
    if (!w) fail_msg("%s", err.msg);
    size_t n = ds4_weights_count(w);
    assert_int_equal(n, 6 + 4 * DS4_N_LAYER_TENSORS);
    size_t present = 0;
    for (size_t i = 0; i < n; i++) {
        const ds4_tensor_row *row;
        const ds4_wt *t = ds4_weights_at(w, i, &row);
        if (!t->name) continue;
        present++;
        /* the view's own name ends with its row's GGUF name */
        size_t a = strlen(t->name), b = strlen(row->name);
        assert_true(a >= b && strcmp(t->name + a - b, row->name) == 0);
    }
    assert_ptr_equal(ds4_weights_at(w, 0, NULL), &w->token_embd);
    assert_ptr_equal(ds4_weights_at(w, 6 + DS4_N_LAYER_TENSORS + 4, NULL), &w->layers[1].q_a);
    assert_ptr_equal(ds4_weights_at(w, n - 1, NULL), &w->layers[3].down_sh);
    /* layers 0-2 hash-routed (no bias in generated weights), 0-1 dense, 2
     * ratio 4, 3 ratio 128 */
    assert_int_equal(present, 6 + 4 * 24 - 3 + 3 + 10 + 4);
    ds4_weights_close(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_cover_the_structs),
        cmocka_unit_test(test_flash_inventory_is_the_documented_one),
        cmocka_unit_test(test_layer_list_under_another_prefix),
        cmocka_unit_test(test_views_walk_every_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
