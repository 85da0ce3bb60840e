/*
 * check.h - the CUDA test programs' check (test_cuda.c,
 * test_cuda_kernels.cu, emu/test_emu.cpp): a failed condition prints
 * "FAIL file:line: message" and is counted in `failures`, which the
 * program's exit status reports; the program goes on to its next check.
 */
#ifndef DS4_TESTS_CUDA_CHECK_H
#define DS4_TESTS_CUDA_CHECK_H

#include <stdio.h>

static int failures;

/* clang-format off */
#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
            failures++;                                 \
        }                                               \
    } while (0)
/* clang-format on */

#endif
