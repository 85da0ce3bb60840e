/*
 * test_quants_golden.c - dequantization of every ds4 block type, and Q8_0
 * quantization, against the outputs of gguf-py (gguf==0.19.0) recorded by
 * tests/reference/quant_goldens.py in tests/golden/quants/.
 *
 * The inputs are regenerated here from the same splitmix64 stream as the
 * script (its SHA-256 is in the manifest, so generator drift is caught); the
 * outputs must match bit for bit: explicitly for the first blocks of each set
 * (a mismatch names block, element and both values) and by SHA-256 per chunk
 * for all of them.  NaN outputs are canonicalised on both sides.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/quants.h"

#define GOLDEN_DIR "tests/golden/quants"

/* --------------------------------------------- the script's generators */

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9E3779B97F4A7C15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_bytes(uint64_t *s, uint8_t *out, size_t n) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rng_next(s);
        for (size_t k = 0; k < 8 && i + k < n; k++) out[i + k] = (uint8_t)(v >> (8 * k));
    }
}

static const uint16_t special_f16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00,
                                       0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7D55, 0xFFFF, 0x3C00, 0xBC00};

static uint16_t scale_value(uint64_t *s, uint64_t kase) {
    uint64_t v, sign;
    switch (kase) {
    case 1:
    case 6: return (uint16_t)(0x0400 + rng_next(s) % (0x3000 - 0x0400));
    case 2: return special_f16[rng_next(s) % (sizeof special_f16 / sizeof special_f16[0])];
    case 3:
        v = 0x7800 + rng_next(s) % 0x400;
        sign = rng_next(s) & 1;
        return (uint16_t)(v | sign << 15);
    case 4:
        v = 1 + rng_next(s) % 0x3FF;
        sign = rng_next(s) & 1;
        return (uint16_t)(v | sign << 15);
    default: return (uint16_t)(0x8400 + rng_next(s) % (0x3000 - 0x0400));
    }
}

static void gen_blocks(uint64_t seed, int64_t nblocks, size_t bb, const int *offs, int noffs, uint8_t *out) {
    uint64_t s = seed;
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *blk = out + (size_t)b * bb;
        rng_bytes(&s, blk, bb);
        uint64_t kase = rng_next(&s) % 8;
        if (kase == 5) {
            memset(blk, 0, bb);
        } else if (kase != 0) {
            if (kase == 6) memset(blk, 0xff, bb);
            for (int k = 0; k < noffs; k++) {
                uint16_t v = scale_value(&s, kase);
                blk[offs[k]] = (uint8_t)v;
                blk[offs[k] + 1] = (uint8_t)(v >> 8);
            }
        }
    }
}

static double sint24(uint64_t *s) { return (double)(int64_t)((rng_next(s) >> 40) % (1u << 24)) - (double)(1 << 23); }

static void gen_q8_0_input(uint64_t seed, int64_t nblocks, float *out) {
    uint64_t s = seed;
    for (int64_t b = 0; b < nblocks; b++) {
        float *blk = out + b * 32;
        memset(blk, 0, 32 * sizeof(float));
        uint64_t kase = rng_next(&s) % 6;
        if (kase == 0 || kase == 5) {
            int e = kase == 0 ? (int)(rng_next(&s) % 41) - 20 : 100 + (int)(rng_next(&s) % 28);
            for (int k = 0; k < 32; k++) blk[k] = (float)ldexp(sint24(&s), e - 23);
        } else if (kase == 1) {
            int e = (int)(rng_next(&s) % 21) - 10;
            for (int k = 0; k < 32; k++) blk[k] = (float)ldexp(((int)(rng_next(&s) % 509) - 254) / 2.0, e);
            int pos = (int)(rng_next(&s) % 32);
            blk[pos] = (float)ldexp(rng_next(&s) & 1 ? 127.0 : -127.0, e);
        } else if (kase == 3) {
            int pos = (int)(rng_next(&s) % 32);
            double v = sint24(&s);
            blk[pos] = (float)ldexp(v, (int)(rng_next(&s) % 41) - 43);
        } else if (kase == 4) {
            for (int k = 0; k < 32; k++) blk[k] = (float)ldexp(sint24(&s), -143);
            blk[0] = (float)ldexp(1.0 + (double)(rng_next(&s) % 1000) / 2048, -120);
        }
    }
}

/* ---------------------------------------------------------- utilities */

static void sha256_hex(const void *data, size_t len, char hex[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    assert_int_equal(EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL), 1);
    for (unsigned i = 0; i < mdlen; i++) sprintf(hex + 2 * i, "%02x", md[i]);
}

static void canonicalise_nan(float *v, int64_t n) {
    const uint32_t qnan = 0x7fc00000u;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(v[i])) memcpy(&v[i], &qnan, 4);
    }
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)sz + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    buf[sz] = 0;
    *len = (size_t)sz;
    return buf;
}

/* ------------------------------------------------------- one golden set */

typedef struct {
    const char *name;
    uint32_t type;
    int64_t elems;   /* per block */
    size_t in_bytes; /* per block */
    int offs[2], noffs;
} set_geom;

static const set_geom GEOMS[] = {
    {"f32", DS4_TYPE_F32, 32, 128, {0, 0}, 0},         {"q8_0", DS4_TYPE_Q8_0, 32, 34, {0, 0}, 1},
    {"q2_k", DS4_TYPE_Q2_K, 256, 84, {80, 82}, 2},     {"q4_k", DS4_TYPE_Q4_K, 256, 144, {0, 2}, 2},
    {"iq2_xxs", DS4_TYPE_IQ2_XXS, 256, 66, {0, 0}, 1}, {"f16", DS4_TYPE_F16, 32, 64, {0, 0}, 0},
    {"bf16", DS4_TYPE_BF16, 32, 64, {0, 0}, 0},
};

static const set_geom *geom_of(const char *name) {
    for (size_t i = 0; i < sizeof GEOMS / sizeof GEOMS[0]; i++) {
        if (strcmp(GEOMS[i].name, name) == 0) return &GEOMS[i];
    }
    fail_msg("manifest names unknown set %s", name);
    return NULL;
}

/* Regenerate the input of one set, run ds4 on it, and compare with the
 * explicit blocks and the chunk digests of the manifest. */
static void check_set(const char *manifest, const char *name, uint32_t type, const char *mode, uint64_t seed,
                      int64_t nblocks, int64_t chunk, int64_t explicit_blocks, const char *input_sha) {
    const set_geom *g = geom_of(name);
    int quantize = strcmp(mode, "quantize") == 0;
    assert_int_equal(g->type, type);
    size_t in_len = quantize ? (size_t)nblocks * 32 * sizeof(float) : (size_t)nblocks * g->in_bytes;
    size_t out_block = quantize ? 34 : (size_t)g->elems * sizeof(float);
    uint8_t *in = malloc(in_len);
    uint8_t *out = malloc((size_t)nblocks * out_block);
    assert_non_null(in);
    assert_non_null(out);

    if (quantize) gen_q8_0_input(seed, nblocks, (float *)in);
    else if (type == DS4_TYPE_F16 || type == DS4_TYPE_BF16)
        for (uint32_t c = 0; c < 65536; c++) memcpy(in + 2 * c, &(uint16_t){(uint16_t)c}, 2);
    else gen_blocks(seed, nblocks, g->in_bytes, g->offs, g->noffs, in);
    char hex[65];
    sha256_hex(in, in_len, hex);
    if (strcmp(hex, input_sha) != 0) fail_msg("%s %s: regenerated input differs from the script's", name, mode);

    if (quantize) {
        int64_t n = nblocks * 32;
        assert_int_equal(ds4_quantize_row(DS4_TYPE_Q8_0, (const float *)in, out, n, NULL), (size_t)nblocks * 34);
    } else {
        int64_t n = nblocks * g->elems;
        ds4_dequantize_row(type, in, (float *)out, n);
        canonicalise_nan((float *)out, n);
    }

    char path[256];
    snprintf(path, sizeof path, GOLDEN_DIR "/%s.%s.bin", name, mode);
    size_t exp_len;
    uint8_t *expect = read_file(path, &exp_len);
    assert_int_equal(exp_len, (size_t)explicit_blocks * out_block);
    for (int64_t b = 0; b < explicit_blocks; b++) {
        const uint8_t *got = out + (size_t)b * out_block, *want = expect + (size_t)b * out_block;
        if (memcmp(got, want, out_block) == 0) continue;
        for (size_t k = 0; k < out_block; k += quantize ? 1 : 4) {
            if (quantize && got[k] != want[k])
                fail_msg("%s quantize block %lld byte %zu: 0x%02x, gguf-py 0x%02x", name, (long long)b, k, got[k],
                         want[k]);
            if (!quantize && memcmp(got + k, want + k, 4) != 0) {
                float gv, wv;
                memcpy(&gv, got + k, 4);
                memcpy(&wv, want + k, 4);
                fail_msg("%s dequant block %lld element %zu: %a, gguf-py %a", name, (long long)b, k / 4, (double)gv,
                         (double)wv);
            }
        }
    }
    free(expect);

    /* digests of every chunk */
    int64_t checked = 0;
    for (const char *p = manifest; (p = strstr(p, "\nchunk ")) != NULL; p++) {
        char cname[32], cmode[16], want_hex[65];
        long long idx;
        if (sscanf(p + 1, "chunk %31s %15s %lld %64s", cname, cmode, &idx, want_hex) != 4) continue;
        if (strcmp(cname, name) != 0 || strcmp(cmode, mode) != 0) continue;
        int64_t b0 = idx * chunk, nb = nblocks - b0 < chunk ? nblocks - b0 : chunk;
        sha256_hex(out + (size_t)b0 * out_block, (size_t)nb * out_block, hex);
        if (strcmp(hex, want_hex) != 0)
            fail_msg("%s %s: blocks %lld..%lld differ from gguf-py", name, mode, (long long)b0,
                     (long long)(b0 + nb - 1));
        checked += nb;
    }
    assert_int_equal(checked, nblocks);
    free(in);
    free(out);
}

static void test_goldens(void **state) {
    (void)state;
    size_t len;
    char *manifest = (char *)read_file(GOLDEN_DIR "/manifest.txt", &len);
    int sets = 0;
    for (const char *p = manifest; (p = strstr(p, "\nset ")) != NULL; p++) {
        char name[32], mode[16], sha[65];
        unsigned type;
        unsigned long long seed;
        long long nblocks, chunk, explicit_blocks;
        assert_int_equal(sscanf(p + 1, "set %31s %u %15s %llx %lld %lld %lld %64s", name, &type, mode, &seed, &nblocks,
                                &chunk, &explicit_blocks, sha),
                         8);
        print_message("golden set %s %s: %lld blocks\n", name, mode, nblocks);
        check_set(manifest, name, type, mode, seed, nblocks, chunk, explicit_blocks, sha);
        sets++;
    }
    assert_int_equal(sets, 8);
    free(manifest);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
