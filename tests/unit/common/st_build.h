/*
 * st_build.h - test helper: safetensors files built in memory, including
 * deliberately malformed ones, for the reader and quantizer tests.
 */
#ifndef DS4_TEST_ST_BUILD_H
#define DS4_TEST_ST_BUILD_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_spec {
    const char *name;
    const char *dtype; /* header string, e.g. "F8_E4M3" */
    int ndim;
    uint64_t shape[4];
    const void *data; /* nbytes bytes (NULL: zeros) */
    size_t nbytes;
} st_spec;

/* A file from a raw header text and a data section.  Caller frees *out. */
void st_raw(const char *header, const void *data, size_t ndata, uint8_t **out, size_t *outlen);

/* A well-formed file holding the tensors in order (offsets computed), with
 * `metadata` (a JSON object text or NULL) as __metadata__ and the header
 * padded with spaces to a multiple of 8 bytes. */
void st_build(const st_spec *specs, size_t n, const char *metadata, uint8_t **out, size_t *outlen);

/* Write bytes to a file; aborts the test program on failure. */
void st_write_file(const char *path, const void *data, size_t n);

/* A fresh temporary directory (mkdtemp under $TMPDIR or /tmp). */
char *st_tempdir(void);
/* Remove a directory and the plain files in it. */
void st_rmdir(const char *dir);

#endif
