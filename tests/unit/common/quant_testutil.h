/*
 * quant_testutil.h - deterministic random data for the block-format tests
 * (test_quants_dot.c, test_quants_quality.c): a seeded xorshift generator,
 * uniform and normal floats, and random but well-formed weight blocks.
 */
#ifndef DS4_TEST_QUANT_TESTUTIL_H
#define DS4_TEST_QUANT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s;
} qt_rng;

void qt_seed(qt_rng *r, uint64_t seed);
uint64_t qt_next(qt_rng *r);
double qt_uniform(qt_rng *r); /* (0, 1) */
float qt_gauss(qt_rng *r);    /* N(0, 1) */
void qt_gauss_fill(qt_rng *r, float *x, int64_t n, float sigma);

/* `bytes` random bytes, then every f16 scale field of each block of `type`
 * set to a random positive or negative value of magnitude 2^-12 .. 2^-4 so
 * the block decodes to finite values. */
void qt_random_blocks(qt_rng *r, uint32_t type, void *dst, int64_t n);

#endif
