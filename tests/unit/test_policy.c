/*
 * test_policy.c - per-tensor storage types: recipes as the base, ds4's class
 * options, prefix overrides (first match wins, "copy" keeps the recipe),
 * type-name spelling, and refusal of types a tensor cannot hold.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "convert/policy.h"
#include "format/quants.h"

static ds4_tensor_spec *specs;
static size_t nspecs;

static int setup(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    nspecs = ds4_layout_count(&c);
    specs = calloc(nspecs, sizeof(*specs));
    ds4_layout_build(&c, specs);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    free(specs);
    return 0;
}

static const ds4_tensor_spec *spec(const char *name) {
    for (size_t i = 0; i < nspecs; i++)
        if (strcmp(specs[i].name, name) == 0) return &specs[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static uint32_t type_of(const ds4_policy *p, const char *name) {
    uint32_t t;
    ds4_err err = {0};
    if (ds4_policy_type(p, spec(name), &t, &err) != 0) fail_msg("%s", err.msg);
    return t;
}

static void test_parse_type(void **state) {
    (void)state;
    uint32_t t;
    ds4_err err = {0};
    assert_int_equal(ds4_policy_parse_type("Q4_K", &t, &err), 0);
    assert_int_equal(t, DS4_TYPE_Q4_K);
    assert_int_equal(ds4_policy_parse_type("q4k", &t, &err), 0);
    assert_int_equal(t, DS4_TYPE_Q4_K);
    assert_int_equal(ds4_policy_parse_type("IQ2-XXS", &t, &err), 0);
    assert_int_equal(t, DS4_TYPE_IQ2_XXS);
    assert_int_equal(ds4_policy_parse_type("Q8_0", &t, &err), 0);
    assert_int_equal(t, DS4_TYPE_Q8_0);
    assert_int_equal(ds4_policy_parse_type("bf16", &t, &err), 0);
    assert_int_equal(t, DS4_TYPE_BF16);
    assert_int_equal(ds4_policy_parse_type("template", &t, &err), 0);
    assert_int_equal(t, DS4_POLICY_KEEP);
    assert_int_equal(ds4_policy_parse_type("q5_k", &t, &err), -1);
    assert_non_null(strstr(err.msg, "unknown tensor type \"q5_k\""));
}

static void test_recipe_and_class_options(void **state) {
    (void)state;
    ds4_policy p;
    ds4_policy_init(&p, ds4_recipe_get("q2"));
    assert_int_equal(type_of(&p, "blk.5.ffn_gate_exps.weight"), DS4_TYPE_IQ2_XXS);
    assert_int_equal(type_of(&p, "blk.5.ffn_down_exps.weight"), DS4_TYPE_Q2_K);
    assert_int_equal(type_of(&p, "blk.5.attn_q_a.weight"), DS4_TYPE_Q8_0);
    assert_int_equal(type_of(&p, "blk.5.hc_attn_fn.weight"), DS4_TYPE_F16);

    p.routed_w1 = p.routed_w2 = p.routed_w3 = DS4_TYPE_Q4_K;
    p.dense = DS4_TYPE_F16;
    assert_int_equal(type_of(&p, "blk.5.ffn_up_exps.weight"), DS4_TYPE_Q4_K);
    assert_int_equal(type_of(&p, "blk.5.attn_q_a.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "token_embd.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "output.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "blk.5.ffn_gate_shexp.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "blk.4.indexer.proj.weight"), DS4_TYPE_F16);
    /* dense leaves the HC mixers, router, vectors and tid2eid alone */
    assert_int_equal(type_of(&p, "blk.5.hc_ffn_fn.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "blk.5.ffn_gate_inp.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "blk.5.attn_norm.weight"), DS4_TYPE_F32);
    assert_int_equal(type_of(&p, "blk.0.ffn_gate_tid2eid.weight"), DS4_TYPE_I32);

    p.attention = DS4_TYPE_Q8_0;
    assert_int_equal(type_of(&p, "blk.5.attn_compressor_kv.weight"), DS4_TYPE_Q8_0);
    assert_int_equal(type_of(&p, "blk.5.attn_output_b.weight"), DS4_TYPE_Q8_0);
    p.attention_proj = DS4_TYPE_F32;
    assert_int_equal(type_of(&p, "blk.5.attn_output_b.weight"), DS4_TYPE_F32);
    assert_int_equal(type_of(&p, "blk.5.attn_compressor_kv.weight"), DS4_TYPE_Q8_0);
    p.output = DS4_TYPE_Q8_0;
    p.embedding = DS4_TYPE_BF16;
    p.shared = DS4_TYPE_F32;
    assert_int_equal(type_of(&p, "output.weight"), DS4_TYPE_Q8_0);
    assert_int_equal(type_of(&p, "token_embd.weight"), DS4_TYPE_BF16);
    assert_int_equal(type_of(&p, "blk.5.ffn_down_shexp.weight"), DS4_TYPE_F32);
    ds4_policy_free(&p);
}

static void test_overrides(void **state) {
    (void)state;
    ds4_policy p;
    ds4_policy_init(&p, ds4_recipe_get("q2"));
    ds4_err err = {0};
    p.routed_w1 = DS4_TYPE_Q4_K;
    assert_int_equal(ds4_policy_add_override(&p, "blk.40.ffn_gate_exps=copy", &err), 0);
    assert_int_equal(ds4_policy_add_override(&p, "blk.4.=q8_0", &err), 0);
    assert_int_equal(ds4_policy_add_override(&p, "blk.41.ffn_=Q4_K", &err), 0);
    assert_int_equal(ds4_policy_add_override(&p, "blk.41.ffn_down=f16", &err), 0);  /* shadowed */
    assert_int_equal(type_of(&p, "blk.40.ffn_gate_exps.weight"), DS4_TYPE_IQ2_XXS); /* copy: recipe */
    assert_int_equal(type_of(&p, "blk.39.ffn_gate_exps.weight"), DS4_TYPE_Q4_K);
    assert_int_equal(type_of(&p, "blk.4.ffn_down_exps.weight"), DS4_TYPE_Q8_0);
    assert_int_equal(type_of(&p, "blk.41.ffn_down_exps.weight"), DS4_TYPE_Q4_K);

    uint32_t t;
    assert_int_equal(ds4_policy_add_override(&p, "blk.3.=q8_0", &err), 0);
    assert_int_equal(type_of(&p, "blk.3.attn_norm.weight"), DS4_TYPE_F32); /* prefix: skips what cannot fit */
    assert_int_equal(type_of(&p, "blk.3.hc_attn_fn.weight"), DS4_TYPE_F16);
    assert_int_equal(type_of(&p, "blk.3.attn_q_a.weight"), DS4_TYPE_Q8_0);
    ds4_policy_free(&p);
    ds4_policy_init(&p, ds4_recipe_get("q2"));
    assert_int_equal(ds4_policy_add_override(&p, "blk.3.attn_norm.weight=q8_0", &err), 0);
    assert_int_equal(ds4_policy_type(&p, spec("blk.3.attn_norm.weight"), &t, &err), -1);
    assert_non_null(strstr(err.msg, "blk.3.attn_norm.weight: type q8_0 (from --tensor-type) is not accepted"));
    assert_int_equal(ds4_policy_add_override(&p, "noequals", &err), -1);
    assert_non_null(strstr(err.msg, "expected PREFIX=TYPE"));
    assert_int_equal(ds4_policy_add_override(&p, "x=q9", &err), -1);
    assert_non_null(strstr(err.msg, "unknown tensor type \"q9\""));
    ds4_policy_free(&p);
}

static void test_block_size_refused(void **state) {
    (void)state;
    ds4_config c;
    ds4_config_flash(&c);
    c.n_embd = 160;
    size_t n = ds4_layout_count(&c);
    ds4_tensor_spec *s = calloc(n, sizeof(*s));
    ds4_layout_build(&c, s);
    ds4_policy p;
    ds4_policy_init(&p, ds4_recipe_get("f16"));
    p.routed_w3 = DS4_TYPE_Q2_K;
    ds4_err err = {0};
    uint32_t t;
    size_t i = 0;
    while (strcmp(s[i].name, "blk.0.ffn_up_exps.weight") != 0) i++;
    assert_int_equal(ds4_policy_type(&p, &s[i], &t, &err), -1);
    assert_non_null(strstr(err.msg, "rows of 160 values are not a multiple of the q2_k block"));
    ds4_policy_free(&p);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_type),
        cmocka_unit_test(test_recipe_and_class_options),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_block_size_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
