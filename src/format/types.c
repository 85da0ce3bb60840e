/*
 * types.c - geometry of GGML tensor types: block size and bytes per block.
 *
 * The table covers every type id GGML has defined so that the byte size of
 * any tensor in a GGUF can be computed (and a file with an unknown id can be
 * rejected); `supported` marks the ones ds4 computes with (quants.h).
 */
#include "format/quants.h"

#include <stddef.h>

static const ds4_type_info type_table[] = {
    [0] = {"f32", 1, 4, 1},         [1] = {"f16", 1, 2, 1},         [2] = {"q4_0", 32, 18, 0},
    [3] = {"q4_1", 32, 20, 0},      [6] = {"q5_0", 32, 22, 0},      [7] = {"q5_1", 32, 24, 0},
    [8] = {"q8_0", 32, 34, 1},      [9] = {"q8_1", 32, 36, 0},      [10] = {"q2_k", 256, 84, 1},
    [11] = {"q3_k", 256, 110, 0},   [12] = {"q4_k", 256, 144, 1},   [13] = {"q5_k", 256, 176, 0},
    [14] = {"q6_k", 256, 210, 0},   [15] = {"q8_k", 256, 292, 0},   [16] = {"iq2_xxs", 256, 66, 1},
    [17] = {"iq2_xs", 256, 74, 0},  [18] = {"iq3_xxs", 256, 98, 0}, [19] = {"iq1_s", 256, 50, 0},
    [20] = {"iq4_nl", 32, 18, 0},   [21] = {"iq3_s", 256, 110, 0},  [22] = {"iq2_s", 256, 82, 0},
    [23] = {"iq4_xs", 256, 136, 0}, [24] = {"i8", 1, 1, 0},         [25] = {"i16", 1, 2, 0},
    [26] = {"i32", 1, 4, 1},        [27] = {"i64", 1, 8, 0},        [28] = {"f64", 1, 8, 0},
    [29] = {"iq1_m", 256, 56, 0},   [30] = {"bf16", 1, 2, 1},       [34] = {"tq1_0", 256, 54, 0},
    [35] = {"tq2_0", 256, 66, 0},   [39] = {"mxfp4", 32, 17, 0},
};

const ds4_type_info *ds4_type_get(uint32_t type) {
    if (type >= sizeof(type_table) / sizeof(type_table[0])) return NULL;
    const ds4_type_info *t = &type_table[type];
    return t->name ? t : NULL;
}

uint64_t ds4_type_nbytes_checked(uint32_t type, uint64_t nelements, int *ok) {
    const ds4_type_info *t = ds4_type_get(type);
    *ok = 0;
    if (!t || nelements % (uint64_t)t->block_elems != 0) return 0;
    uint64_t blocks = nelements / (uint64_t)t->block_elems;
    if (blocks > UINT64_MAX / t->block_bytes) return 0;
    *ok = 1;
    return blocks * t->block_bytes;
}

size_t ds4_row_bytes(uint32_t type, int64_t n) {
    int ok;
    if (n < 0) return 0;
    uint64_t bytes = ds4_type_nbytes_checked(type, (uint64_t)n, &ok);
    return ok && bytes <= SIZE_MAX ? (size_t)bytes : 0;
}
