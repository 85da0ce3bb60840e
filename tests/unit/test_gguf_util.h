/*
 * test_gguf_util.h - helpers shared by the GGUF unit tests: a byte builder
 * for writing GGUF files by hand (independently of the ds4 writer), a small
 * hand-built file whose field offsets are recorded so tests can corrupt one
 * field at a time, and temporary-directory helpers.
 */
#ifndef DS4_TEST_GGUF_UTIL_H
#define DS4_TEST_GGUF_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/gguf.h"

/* ------------------------------------------------------------- builder */

typedef struct bbuf {
    uint8_t *p;
    size_t n, cap;
} bbuf;

static inline void bb_put(bbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static inline void bb_u8(bbuf *b, uint8_t v) { bb_put(b, &v, 1); }
static inline void bb_u32(bbuf *b, uint32_t v) { bb_put(b, &v, 4); }
static inline void bb_u64(bbuf *b, uint64_t v) { bb_put(b, &v, 8); }

static inline void bb_str(bbuf *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static inline void bb_pad(bbuf *b, size_t align) {
    while (b->n % align) bb_u8(b, 0);
}

static inline void patch_u32(uint8_t *buf, uint64_t at, uint32_t v) { memcpy(buf + at, &v, 4); }
static inline void patch_u64(uint8_t *buf, uint64_t at, uint64_t v) { memcpy(buf + at, &v, 8); }

/* ------------------------------------------------ the small hand-built file
 *
 * Header, then 6 kv entries:
 *   k.s1 = "hello"            (string)
 *   k.s2 = [u16 1, 2, 3]      (array)
 *   k.s3 = ["x", "yz"]        (string array)
 *   k.s4 = true               (bool)
 *   k.s5 = -7                 (i32)
 *   general.alignment = 32    (u32)
 * then 2 tensors:
 *   t1: f32 [4, 2]  at data offset 0  (32 bytes)
 *   t2: q8_0 [32]   at data offset 32 (34 bytes)
 * then padding to 32 and the data (66 bytes, then padding to 32 again).
 */
#define SMALL_NKV 6
#define SMALL_NT  2

typedef struct small_layout {
    uint64_t kv[SMALL_NKV];       /* entry start (key length) */
    uint64_t kv_type[SMALL_NKV];  /* value type field */
    uint64_t kv_value[SMALL_NKV]; /* value (strings: length field) */
    uint64_t arr_count;           /* k.s2 count field */
    uint64_t sarr_count;          /* k.s3 count field */
    uint64_t sarr_elem1;          /* k.s3 second string's length field */
    uint64_t t[SMALL_NT];         /* tensor info start */
    uint64_t t_ndim[SMALL_NT];
    uint64_t t_dims[SMALL_NT];
    uint64_t t_type[SMALL_NT];
    uint64_t t_offset[SMALL_NT];
    uint64_t data_offset;
    uint64_t data_end; /* end of the last tensor's bytes */
} small_layout;

static inline uint8_t small_data_byte(uint64_t j) { return (uint8_t)(j * 7 + 1); }

/* Returns a malloc'd file; *size and *lay describe it. */
static inline uint8_t *build_small(size_t *size, small_layout *lay) {
    bbuf b = {0};
    bb_u32(&b, DS4_GGUF_MAGIC);
    bb_u32(&b, 3);
    bb_u64(&b, SMALL_NT);
    bb_u64(&b, SMALL_NKV);

    lay->kv[0] = b.n;
    bb_str(&b, "k.s1");
    lay->kv_type[0] = b.n;
    bb_u32(&b, DS4_GGUF_STRING);
    lay->kv_value[0] = b.n;
    bb_str(&b, "hello");

    lay->kv[1] = b.n;
    bb_str(&b, "k.s2");
    lay->kv_type[1] = b.n;
    bb_u32(&b, DS4_GGUF_ARRAY);
    lay->kv_value[1] = b.n;
    bb_u32(&b, DS4_GGUF_U16);
    lay->arr_count = b.n;
    bb_u64(&b, 3);
    for (uint16_t v = 1; v <= 3; v++) bb_put(&b, &v, 2);

    lay->kv[2] = b.n;
    bb_str(&b, "k.s3");
    lay->kv_type[2] = b.n;
    bb_u32(&b, DS4_GGUF_ARRAY);
    lay->kv_value[2] = b.n;
    bb_u32(&b, DS4_GGUF_STRING);
    lay->sarr_count = b.n;
    bb_u64(&b, 2);
    bb_str(&b, "x");
    lay->sarr_elem1 = b.n;
    bb_str(&b, "yz");

    lay->kv[3] = b.n;
    bb_str(&b, "k.s4");
    lay->kv_type[3] = b.n;
    bb_u32(&b, DS4_GGUF_BOOL);
    lay->kv_value[3] = b.n;
    bb_u8(&b, 1);

    lay->kv[4] = b.n;
    bb_str(&b, "k.s5");
    lay->kv_type[4] = b.n;
    bb_u32(&b, DS4_GGUF_I32);
    lay->kv_value[4] = b.n;
    bb_u32(&b, (uint32_t)-7);

    lay->kv[5] = b.n;
    bb_str(&b, "general.alignment");
    lay->kv_type[5] = b.n;
    bb_u32(&b, DS4_GGUF_U32);
    lay->kv_value[5] = b.n;
    bb_u32(&b, 32);

    const char *names[SMALL_NT] = {"t1", "t2"};
    const uint32_t ndims[SMALL_NT] = {2, 1};
    const uint64_t dims[SMALL_NT][2] = {{4, 2}, {32, 0}};
    const uint32_t types[SMALL_NT] = {0, 8};
    const uint64_t offsets[SMALL_NT] = {0, 32};
    for (int i = 0; i < SMALL_NT; i++) {
        lay->t[i] = b.n;
        bb_str(&b, names[i]);
        lay->t_ndim[i] = b.n;
        bb_u32(&b, ndims[i]);
        lay->t_dims[i] = b.n;
        for (uint32_t d = 0; d < ndims[i]; d++) bb_u64(&b, dims[i][d]);
        lay->t_type[i] = b.n;
        bb_u32(&b, types[i]);
        lay->t_offset[i] = b.n;
        bb_u64(&b, offsets[i]);
    }
    bb_pad(&b, 32);
    lay->data_offset = b.n;
    for (uint64_t j = 0; j < 66; j++) bb_u8(&b, small_data_byte(j));
    lay->data_end = b.n;
    bb_pad(&b, 32);
    *size = b.n;
    return b.p;
}

/* ------------------------------------------------------------ temp dirs */

static inline char *make_temp_dir(void) {
    char tmpl[] = "/tmp/ds4-test-gguf-XXXXXX";
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

static inline char *path_in(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Number of entries in a directory whose name starts with `prefix` (all
 * for ""), to check that no temporary file is left behind. */
static inline int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

static inline void remove_temp_dir(char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = path_in(dir, e->d_name);
            unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
    free(dir);
}

static inline uint8_t *read_whole_file(const char *path, size_t *size) {
    *size = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return p;
}

#endif
