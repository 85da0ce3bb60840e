/*
 * quants.h - numeric block formats of ds4 files (docs/MODEL.md 3):
 * type geometry, dequantization, quantization, and dot products of a weight
 * row against an activation vector.
 *
 * Weight types and the activation format each one is multiplied with:
 *
 *   weight   block  bytes  activation          accumulation
 *   F32        1      4    f32                 double
 *   F16        1      2    f32                 f32
 *   BF16       1      2    f32                 f32
 *   Q8_0      32     34    ds4_block_q8_0x     f32 over blocks, int32 inside
 *   Q2_K     256     84    ds4_block_q8_K      f32 over blocks, int32 inside
 *   Q4_K     256    144    ds4_block_q8_K      "
 *   IQ2_XXS  256     66    ds4_block_q8_K      "
 *
 * Stored blocks are bit-compatible with GGML (and gguf-py).  Activation
 * blocks are in-memory only.  Every dot product has a portable scalar
 * version, which is the definition, and SIMD versions (AVX2+FMA) chosen at
 * run time; docs/QUANTS.md states how closely they agree.
 */
#ifndef DS4_FORMAT_QUANTS_H
#define DS4_FORMAT_QUANTS_H

#include <stddef.h>
#include <stdint.h>

/* GGML type ids.  Only the ones ds4 computes with have names here; the
 * geometry table also knows the other GGML ids so byte sizes of any tensor
 * in a GGUF can be computed. */
typedef enum ds4_type {
    DS4_TYPE_F32 = 0,
    DS4_TYPE_F16 = 1,
    DS4_TYPE_Q8_0 = 8,
    DS4_TYPE_Q2_K = 10,
    DS4_TYPE_Q4_K = 12,
    DS4_TYPE_Q8_K = 15,
    DS4_TYPE_IQ2_XXS = 16,
    DS4_TYPE_I32 = 26,
    DS4_TYPE_BF16 = 30,
} ds4_type;

#define DS4_QK8_0 32
#define DS4_QK_K  256

/* Stored block layouts (little-endian, packed as in GGML). */
typedef struct {
    uint16_t d; /* f16 */
    int8_t qs[DS4_QK8_0];
} ds4_block_q8_0;

typedef struct {
    uint8_t scales[DS4_QK_K / 16]; /* low nibble scale, high nibble min */
    uint8_t qs[DS4_QK_K / 4];
    uint16_t d;    /* f16 */
    uint16_t dmin; /* f16 */
} ds4_block_q2_K;

typedef struct {
    uint16_t d;    /* f16 */
    uint16_t dmin; /* f16 */
    uint8_t scales[12];
    uint8_t qs[DS4_QK_K / 2];
} ds4_block_q4_K;

typedef struct {
    uint16_t d; /* f16 */
    uint16_t qs[DS4_QK_K / 8];
} ds4_block_iq2_xxs;

/* IQ2_XXS decoding, shared by every decoder (CPU dots, the GPU's tables):
 * grid(g) as 8 bytes (each 8, 25 or 43), element k in byte k (iq2_grid.c),
 * and the sign byte of a 7-bit sign index (the index plus the even-parity
 * bit 7). */
extern const uint64_t ds4_iq2xxs_grid[256];
static inline uint8_t ds4_iq2_sign_byte(uint32_t s7) {
    return (uint8_t)(s7 | ((uint32_t)__builtin_popcount(s7 & 127) & 1) << 7);
}

/* Activation blocks (memory only). */
typedef struct {
    float d; /* amax / 127 */
    int8_t qs[DS4_QK8_0];
} ds4_block_q8_0x;

typedef struct {
    float d;
    int8_t qs[DS4_QK_K];
    int16_t bsums[DS4_QK_K / 16];
} ds4_block_q8_K;

typedef struct ds4_type_info {
    const char *name; /* "q8_0", ... as gguf-py names them */
    int64_t block_elems;
    size_t block_bytes;
    int supported; /* ds4 can dequantize it */
} ds4_type_info;

/* Geometry of a GGML type id; NULL for an id no GGML version defines. */
const ds4_type_info *ds4_type_get(uint32_t type);

/* Bytes of `n` elements of `type`, or 0 when n is not a multiple of the block
 * size or the type is unknown.  Callers check for overflow before (see
 * ds4_type_nbytes_checked). */
size_t ds4_row_bytes(uint32_t type, int64_t n);

/* Bytes of `nelements` elements with overflow checking: returns 0 and sets
 * *ok = 0 when the count is not a whole number of blocks or the size does not
 * fit in 64 bits. */
uint64_t ds4_type_nbytes_checked(uint32_t type, uint64_t nelements, int *ok);

/* ------------------------------------------------------- dequantization */

/* Decode n elements (n a multiple of the block size) to f32.  Bit-identical
 * to gguf.quants.dequantize for every supported type (NaN payloads aside).
 * Also decodes Q8_K activation blocks (d * q) and I32 (converted to float);
 * any other type, or n not a whole number of blocks, fills dst with NaN. */
void ds4_dequantize_row(uint32_t type, const void *src, float *dst, int64_t n);

/* --------------------------------------------------------- quantization */

/* Encode n elements of `type` from f32.  `importance` (n per-column weights,
 * may be NULL) steers the error minimisation of Q2_K, Q4_K and IQ2_XXS; Q8_0
 * ignores it and is byte-identical to gguf.quants.quantize.  IQ2_XXS without
 * importance uses the column-energy fallback given by the caller through
 * ds4_column_energy(); passing NULL uses x^2 of the row itself.
 * Returns the number of bytes written. */
size_t ds4_quantize_row(uint32_t type, const float *src, void *dst, int64_t n, const float *importance);

/* Synthetic importance for a [rows x cols] f32 matrix when no imatrix is
 * available: out[c] = sum over rows of w[r][c]^2 (docs/MODEL.md 2.6). */
void ds4_column_energy(const float *w, int64_t rows, int64_t cols, float *out);

/* ------------------------------------------------ activations and dots */

/* The activation type a weight type is multiplied with (F32, Q8_0 meaning
 * ds4_block_q8_0x, or Q8_K); UINT32_MAX for a type that is not a weight
 * type ds4 computes with. */
uint32_t ds4_act_type(uint32_t weight_type);

/* Bytes needed for n activations in the format used against `weight_type`
 * (0 when n is not a whole number of activation blocks). */
size_t ds4_act_bytes(uint32_t weight_type, int64_t n);

/* Prepare an activation vector for dots against `weight_type` rows.  For
 * F32/F16/BF16 weights this copies the floats. */
void ds4_quantize_act(uint32_t weight_type, const float *x, void *dst, int64_t n);

/* Individual activation quantizers (docs/MODEL.md 3.7, 3.8).  Their int8
 * values lie in [-127, 127], which the dot kernels rely on: activations
 * built by other means must keep to that range. */
void ds4_quantize_q8_0x(const float *x, ds4_block_q8_0x *y, int64_t n);
void ds4_quantize_q8_K(const float *x, ds4_block_q8_K *y, int64_t n);

/* Dot product of one weight row (n elements of weight_type) with a prepared
 * activation.  Uses the fastest kernel the CPU supports; every kernel returns
 * the same bits (docs/QUANTS.md).  NaN for an unsupported type or an n that
 * is not a whole number of blocks. */
float ds4_vec_dot(uint32_t weight_type, int64_t n, const void *w_row, const void *act);

/* y[r] = dot(row r, act) for r in [0, nrows); rows are `row_stride` bytes apart. */
void ds4_vec_dot_rows(uint32_t weight_type, int64_t n, int64_t nrows, const void *w, size_t row_stride, const void *act,
                      float *y);

/* y[a * y_stride + r] = dot(row r, activation a) for r < nrows, a < nacts;
 * rows are `row_stride` bytes apart, activations `act_stride` bytes apart
 * (y_stride in floats).  Dots several activations at once, unpacking each
 * weight block once for all of them (the batched matrix products of
 * prefill); every value has the bits ds4_vec_dot gives for its pair. */
void ds4_vec_dot_rows_multi(uint32_t weight_type, int64_t n, int64_t nrows, const void *w, size_t row_stride,
                            const void *acts, size_t act_stride, int64_t nacts, float *y, size_t y_stride);

/* Kernel selection, for tests and benchmarks: DS4_SIMD_SCALAR forces the
 * portable kernels, DS4_SIMD_AUTO picks the best available. */
typedef enum { DS4_SIMD_AUTO = 0, DS4_SIMD_SCALAR = 1, DS4_SIMD_AVX2 = 2 } ds4_simd_level;
void ds4_set_simd(ds4_simd_level level);
ds4_simd_level ds4_get_simd(void); /* what is in use now */
int ds4_cpu_has_avx2_fma(void);

#endif
