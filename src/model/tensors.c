/*
 * tensors.c - the tensor table as data (see tensors.h): one ds4_tensor_row
 * per row of the lists, with the offset of its field in the weight struct.
 */
#include "model/tensors.h"

#include <math.h>

#include "model/weights.h"

/* clang-format off */
#define ROW(type, field, gguf, hf, cls, types, when, init, ne0, ne1, ne2)                                 \
    {gguf, hf, DS4_TC_##cls, DS4_TYPES_##types, DS4_WHEN_##when, DS4_INIT_##init,                          \
     {DS4_DIM_##ne0, DS4_DIM_##ne1, DS4_DIM_##ne2}, offsetof(type, field)},
/* clang-format on */
#define GLOBAL_ROW(...) ROW(ds4_weights, __VA_ARGS__)
#define LAYER_ROW(...)  ROW(ds4_layer_weights, __VA_ARGS__)
#define MTP_ROW(...)    ROW(ds4_mtp_weights, __VA_ARGS__)

const ds4_tensor_row ds4_global_rows[DS4_N_GLOBAL_TENSORS] = {DS4_GLOBAL_TENSORS(GLOBAL_ROW)};
const ds4_tensor_row ds4_layer_rows[DS4_N_LAYER_TENSORS] = {DS4_LAYER_TENSORS(LAYER_ROW)};
const ds4_tensor_row ds4_mtp_rows[DS4_N_MTP_TENSORS] = {DS4_MTP_TENSORS(MTP_ROW)};

void ds4_init_dist(ds4_init init, uint64_t n, float *mean, float *std) {
    *mean = 0.0f;
    switch (init) {
    case DS4_INIT_UNIT: *std = 1.0f; return;
    case DS4_INIT_NEAR_ONE:
        *mean = 1.0f;
        *std = 0.1f;
        return;
    case DS4_INIT_HALF: *std = 0.5f; return;
    case DS4_INIT_BIAS: *std = 0.05f; return;
    case DS4_INIT_FANIN:
    case DS4_INIT_HASH: break;
    }
    *std = 1.0f / sqrtf((float)n);
}
