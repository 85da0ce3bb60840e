/*
 * gguf_value.c - GGUF metadata value types: sizes, names, and element
 * access for arrays.  Shared by the reader, the writer and the tools.
 */
#include "format/gguf.h"

#include <assert.h>
#include <math.h>
#include <string.h>

size_t ds4_gguf_vtype_size(ds4_gguf_vtype t) {
    switch (t) {
    case DS4_GGUF_U8:
    case DS4_GGUF_I8:
    case DS4_GGUF_BOOL: return 1;
    case DS4_GGUF_U16:
    case DS4_GGUF_I16: return 2;
    case DS4_GGUF_U32:
    case DS4_GGUF_I32:
    case DS4_GGUF_F32: return 4;
    case DS4_GGUF_U64:
    case DS4_GGUF_I64:
    case DS4_GGUF_F64: return 8;
    case DS4_GGUF_STRING:
    case DS4_GGUF_ARRAY:
    case DS4_GGUF_VTYPE_COUNT: return 0;
    }
    return 0;
}

const char *ds4_gguf_vtype_name(ds4_gguf_vtype t) {
    switch (t) {
    case DS4_GGUF_U8: return "u8";
    case DS4_GGUF_I8: return "i8";
    case DS4_GGUF_U16: return "u16";
    case DS4_GGUF_I16: return "i16";
    case DS4_GGUF_U32: return "u32";
    case DS4_GGUF_I32: return "i32";
    case DS4_GGUF_F32: return "f32";
    case DS4_GGUF_BOOL: return "bool";
    case DS4_GGUF_STRING: return "str";
    case DS4_GGUF_ARRAY: return "arr";
    case DS4_GGUF_U64: return "u64";
    case DS4_GGUF_I64: return "i64";
    case DS4_GGUF_F64: return "f64";
    case DS4_GGUF_VTYPE_COUNT: break;
    }
    return "invalid";
}

bool ds4_str_eq(ds4_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.ptr, cstr, n) == 0);
}

/* Elements are little-endian and possibly unaligned inside the mapping, so
 * they are read with memcpy (the build targets little-endian hosts only). */
/* clang-format off */
#define LOAD(T, p)                   \
    ({                               \
        T v_;                        \
        memcpy(&v_, (p), sizeof(T)); \
        v_;                          \
    })
/* clang-format on */

int64_t ds4_gguf_arr_i64(const ds4_gguf_array *a, uint64_t i) {
    assert(i < a->count);
    size_t sz = ds4_gguf_vtype_size(a->type);
    assert(sz != 0);
    const uint8_t *p = a->data + i * sz;
    switch (a->type) {
    case DS4_GGUF_U8: return LOAD(uint8_t, p);
    case DS4_GGUF_I8: return LOAD(int8_t, p);
    case DS4_GGUF_U16: return LOAD(uint16_t, p);
    case DS4_GGUF_I16: return LOAD(int16_t, p);
    case DS4_GGUF_U32: return LOAD(uint32_t, p);
    case DS4_GGUF_I32: return LOAD(int32_t, p);
    case DS4_GGUF_U64: return (int64_t)LOAD(uint64_t, p);
    case DS4_GGUF_I64: return LOAD(int64_t, p);
    case DS4_GGUF_BOOL: return LOAD(uint8_t, p) != 0;
    case DS4_GGUF_F32:
    case DS4_GGUF_F64: {
        /* Truncate toward zero, saturating, so a float element never leads
         * to undefined behaviour in the conversion. */
        double d = a->type == DS4_GGUF_F32 ? LOAD(float, p) : LOAD(double, p);
        if (isnan(d)) return 0;
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    default: return 0;
    }
}

double ds4_gguf_arr_f64(const ds4_gguf_array *a, uint64_t i) {
    assert(i < a->count);
    size_t sz = ds4_gguf_vtype_size(a->type);
    assert(sz != 0);
    const uint8_t *p = a->data + i * sz;
    switch (a->type) {
    case DS4_GGUF_F32: return LOAD(float, p);
    case DS4_GGUF_F64: return LOAD(double, p);
    case DS4_GGUF_U64: return (double)LOAD(uint64_t, p);
    default: return (double)ds4_gguf_arr_i64(a, i);
    }
}
