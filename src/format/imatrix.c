/*
 * imatrix.c - legacy `.dat` importance matrices (see imatrix.h).
 */
#include "format/imatrix.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/paths.h"
#include "format/gguf_index.h"

void ds4_imatrix_free(ds4_imatrix *im) {
    if (!im) return;
    for (uint32_t i = 0; i < im->n_entries; i++) {
        free(im->entries[i].name);
        free(im->entries[i].values);
    }
    free(im->entries);
    if (im->index) {
        ds4_name_index_free(im->index);
        free(im->index);
    }
    free(im->dataset);
    free(im->path);
    free(im);
}

ds4_imatrix *ds4_imatrix_new(ds4_err *err) {
    ds4_imatrix *im = calloc(1, sizeof(*im));
    if (im) im->index = calloc(1, sizeof(ds4_name_index));
    if (!im || !im->index || ds4_name_index_init(im->index, 64, NULL) != 0) {
        ds4_imatrix_free(im);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    im->chunks = -1;
    return im;
}

/* Append an entry that takes ownership of name and values. */
static int append(ds4_imatrix *im, char *name, int32_t ncall, uint32_t nval, float *values, ds4_err *err) {
    ds4_imatrix_entry *grown = realloc(im->entries, (im->n_entries + 1) * sizeof(*grown));
    if (!grown) {
        free(name);
        free(values);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    im->entries = grown;
    im->entries[im->n_entries] = (ds4_imatrix_entry){.name = name, .ncall = ncall, .nval = nval, .values = values};
    uint64_t old;
    int rc = ds4_name_index_put(im->index, name, im->n_entries, &old, NULL);
    im->n_entries++;
    if (rc < 0) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (rc == 0) return ds4_err_set(err, DS4_EFORMAT, "entry %s appears twice", name);
    return 0;
}

const ds4_imatrix_entry *ds4_imatrix_find(const ds4_imatrix *im, const char *name) {
    uint64_t i;
    return ds4_name_index_get(im->index, name, &i) ? &im->entries[i] : NULL;
}

ds4_imatrix_entry *ds4_imatrix_entry_get(ds4_imatrix *im, const char *name, uint32_t nval, ds4_err *err) {
    uint64_t i;
    if (ds4_name_index_get(im->index, name, &i)) {
        if (im->entries[i].nval != nval) {
            ds4_err_set(err, DS4_EINVAL, "imatrix entry %s has %u values, not %u", name, im->entries[i].nval, nval);
            return NULL;
        }
        return &im->entries[i];
    }
    char *copy = strdup(name);
    float *values = calloc(nval ? nval : 1, sizeof(float));
    if (!copy || !values) {
        free(copy);
        free(values);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    if (append(im, copy, 0, nval, values, err) != 0) return NULL;
    return &im->entries[im->n_entries - 1];
}

int ds4_imatrix_set_trailer(ds4_imatrix *im, int32_t chunks, const char *dataset, ds4_err *err) {
    char *copy = NULL;
    if (dataset && !(copy = strdup(dataset))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    free(im->dataset);
    im->dataset = copy;
    im->chunks = chunks;
    return 0;
}

/* ------------------------------------------------------------- reading */

typedef struct reader {
    const char *path;
    FILE *fp;
    uint64_t pos;
    uint64_t size;
} reader;

static int read_bytes(reader *r, void *dst, uint64_t n, const char *what, ds4_err *err) {
    if (n > r->size - r->pos)
        return ds4_err_set(err, DS4_EFORMAT, "%s: offset %" PRIu64 ": file ends inside %s (truncated?)", r->path,
                           r->pos, what);
    if (n && fread(dst, 1, (size_t)n, r->fp) != n)
        return ds4_err_set(err, DS4_EIO, "%s: offset %" PRIu64 ": read failed", r->path, r->pos);
    r->pos += n;
    return 0;
}

static int read_i32(reader *r, int32_t *v, const char *what, ds4_err *err) {
    uint8_t b[4];
    if (read_bytes(r, b, 4, what, err) != 0) return -1;
    *v = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
    return 0;
}

static int read_values(reader *r, const char *name, uint32_t nval, float **out, ds4_err *err) {
    if ((uint64_t)nval * 4 > r->size - r->pos)
        return ds4_err_set(err, DS4_EFORMAT, "%s: entry %s: %u values run past the end of the file (truncated?)",
                           r->path, name, nval);
    float *v = malloc((size_t)nval * sizeof(float));
    if (!v) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    uint8_t *raw = (uint8_t *)v;
    if (read_bytes(r, raw, (uint64_t)nval * 4, "values", err) != 0) {
        free(v);
        return -1;
    }
    for (uint32_t j = 0; j < nval; j++) {
        uint32_t bits = (uint32_t)raw[4 * j] | (uint32_t)raw[4 * j + 1] << 8 | (uint32_t)raw[4 * j + 2] << 16 |
                        (uint32_t)raw[4 * j + 3] << 24;
        memcpy(&v[j], &bits, 4);
        if (!isfinite(v[j]) || v[j] < 0) {
            ds4_err_set(err, DS4_EFORMAT, "%s: entry %s: value %u is %g (must be finite and >= 0)", r->path, name, j,
                        v[j]);
            free(v);
            return -1;
        }
    }
    *out = v;
    return 0;
}

static int read_entry(reader *r, ds4_imatrix *im, uint32_t i, ds4_err *err) {
    int32_t len, ncall, nval;
    uint64_t at = r->pos;
    if (read_i32(r, &len, "an entry name length", err) != 0) return -1;
    if (len <= 0 || len > DS4_IMATRIX_MAX_NAME)
        return ds4_err_set(err, DS4_EFORMAT, "%s: offset %" PRIu64 ": entry %u: name length %d is not in 1..%d",
                           r->path, at, i, len, DS4_IMATRIX_MAX_NAME);
    char *name = malloc((size_t)len + 1);
    if (!name) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (read_bytes(r, name, (uint64_t)len, "an entry name", err) != 0) {
        free(name);
        return -1;
    }
    name[len] = '\0';
    if (strlen(name) != (size_t)len) {
        free(name);
        return ds4_err_set(err, DS4_EFORMAT, "%s: offset %" PRIu64 ": entry %u: name contains a NUL byte", r->path, at,
                           i);
    }
    if (read_i32(r, &ncall, "a call count", err) != 0 || read_i32(r, &nval, "a value count", err) != 0) {
        free(name);
        return -1;
    }
    if (ncall < 0 || nval <= 0) {
        ds4_err_set(err, DS4_EFORMAT, "%s: entry %s: ncall %d, nval %d (need ncall >= 0, nval >= 1)", r->path, name,
                    ncall, nval);
        free(name);
        return -1;
    }
    float *values = NULL;
    if (read_values(r, name, (uint32_t)nval, &values, err) != 0) {
        free(name);
        return -1;
    }
    if (append(im, name, ncall, (uint32_t)nval, values, err) != 0) return ds4_err_prefix(err, "%s", r->path);
    return 0;
}

static int read_trailer(reader *r, ds4_imatrix *im, ds4_err *err) {
    if (r->pos == r->size) return 0;
    int32_t chunks, dlen;
    if (read_i32(r, &chunks, "the chunk count", err) != 0 || read_i32(r, &dlen, "the dataset name length", err) != 0)
        return -1;
    if (dlen < 0 || (uint64_t)dlen > r->size - r->pos)
        return ds4_err_set(err, DS4_EFORMAT, "%s: dataset name length %d does not fit the file", r->path, dlen);
    char *ds = malloc((size_t)dlen + 1);
    if (!ds) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (read_bytes(r, ds, (uint64_t)dlen, "the dataset name", err) != 0) {
        free(ds);
        return -1;
    }
    ds[dlen] = '\0';
    im->chunks = chunks;
    im->dataset = ds;
    if (r->pos != r->size)
        return ds4_err_set(err, DS4_EFORMAT, "%s: %" PRIu64 " unexpected bytes after the trailer", r->path,
                           r->size - r->pos);
    return 0;
}

ds4_imatrix *ds4_imatrix_load(const char *path, ds4_err *err) {
    ds4_imatrix *im = ds4_imatrix_new(err);
    if (!im) return NULL;
    reader r = {.path = path, .fp = fopen(path, "rb")};
    int rc = -1;
    if (!r.fp) {
        ds4_err_set(err, errno == ENOENT ? DS4_ENOTFOUND : DS4_EIO, "%s: %s", path, strerror(errno));
        goto done;
    }
    off_t size = -1;
    if (fseeko(r.fp, 0, SEEK_END) != 0 || (size = ftello(r.fp)) < 0 || fseeko(r.fp, 0, SEEK_SET) != 0) {
        ds4_err_set(err, DS4_EIO, "%s: cannot determine size", path);
        goto done;
    }
    r.size = (uint64_t)size;
    int32_t n;
    if (read_i32(&r, &n, "the entry count", err) != 0) goto done;
    if (n < 0) {
        ds4_err_set(err, DS4_EFORMAT, "%s: entry count %d is negative", path, n);
        goto done;
    }
    for (uint32_t i = 0; i < (uint32_t)n; i++)
        if (read_entry(&r, im, i, err) != 0) goto done;
    if (read_trailer(&r, im, err) != 0) goto done;
    if (!(im->path = strdup(path))) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    rc = 0;
done:
    if (r.fp) fclose(r.fp);
    if (rc != 0) {
        ds4_imatrix_free(im);
        return NULL;
    }
    return im;
}

/* ------------------------------------------------------------- writing */

static int write_i32(FILE *fp, int32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)((uint32_t)v >> 8), (uint8_t)((uint32_t)v >> 16),
                    (uint8_t)((uint32_t)v >> 24)};
    return fwrite(b, 1, 4, fp) == 4 ? 0 : -1;
}

static int write_entry(FILE *fp, const ds4_imatrix_entry *e) {
    size_t len = strlen(e->name);
    if (write_i32(fp, (int32_t)len) || fwrite(e->name, 1, len, fp) != len || write_i32(fp, e->ncall) ||
        write_i32(fp, (int32_t)e->nval))
        return -1;
    for (uint32_t j = 0; j < e->nval; j++) {
        uint32_t bits;
        memcpy(&bits, &e->values[j], 4);
        if (write_i32(fp, (int32_t)bits)) return -1;
    }
    return 0;
}

int ds4_imatrix_save(const ds4_imatrix *im, const char *path, ds4_err *err) {
    ds4_atomic_file a;
    if (ds4_atomic_open(&a, path, err)) return -1;
    FILE *fp = a.f;
    int bad = write_i32(fp, (int32_t)im->n_entries);
    for (uint32_t i = 0; i < im->n_entries && !bad; i++) bad = write_entry(fp, &im->entries[i]);
    if (!bad && (im->chunks >= 0 || im->dataset)) {
        size_t dlen = im->dataset ? strlen(im->dataset) : 0;
        bad = write_i32(fp, im->chunks < 0 ? 0 : im->chunks) || write_i32(fp, (int32_t)dlen) ||
              (dlen && fwrite(im->dataset, 1, dlen, fp) != dlen);
    }
    return ds4_atomic_commit(&a, bad, err);
}

/* ------------------------------------------------------------- lookup */

static void copy_mean(const ds4_imatrix_entry *e, uint64_t first, int64_t ncols, float *out) {
    float scale = e->ncall > 0 ? 1.0f / (float)e->ncall : 1.0f;
    for (int64_t c = 0; c < ncols; c++) out[c] = e->values[first + (uint64_t)c] * scale;
}

int ds4_imatrix_lookup(const ds4_imatrix *im, const char *name, int64_t ncols, int expert, int n_expert, float *out,
                       ds4_err *err) {
    if (expert >= 0) {
        /* Per-expert entries first, in the two spellings collectors use. */
        static const char *const fmts[] = {"%s.expert.%d", "%s.expert_%d"};
        char buf[DS4_IMATRIX_MAX_NAME + 32];
        for (int f = 0; f < 2; f++) {
            snprintf(buf, sizeof(buf), fmts[f], name, expert);
            const ds4_imatrix_entry *e = ds4_imatrix_find(im, buf);
            if (!e) continue;
            if ((int64_t)e->nval != ncols)
                return ds4_err_set(err, DS4_EFORMAT, "imatrix entry %s has %u values, expected %" PRId64, buf, e->nval,
                                   ncols);
            copy_mean(e, 0, ncols, out);
            return 1;
        }
    }
    const ds4_imatrix_entry *e = ds4_imatrix_find(im, name);
    if (!e) return 0;
    if ((int64_t)e->nval == ncols) {
        copy_mean(e, 0, ncols, out);
        return 1;
    }
    if (expert >= 0 && expert < n_expert && (int64_t)e->nval == ncols * n_expert) {
        copy_mean(e, (uint64_t)expert * (uint64_t)ncols, ncols, out);
        return 1;
    }
    return ds4_err_set(err, DS4_EFORMAT, "imatrix entry %s has %u values, expected %" PRId64 " or %d x %" PRId64, name,
                       e->nval, ncols, n_expert, ncols);
}

/* ------------------------------------------------------------ datasets */

/* First marker at or after `from` that starts a line, or n. */
static size_t find_marker(const char *text, size_t n, size_t from) {
    size_t m = sizeof(DS4_IMATRIX_MARKER) - 1;
    for (size_t i = from; i + m <= n; i++) {
        if ((i == 0 || text[i - 1] == '\n') && memcmp(text + i, DS4_IMATRIX_MARKER, m) == 0) return i;
    }
    return n;
}

int ds4_imatrix_dataset_next(const char *text, size_t n, size_t *pos, size_t *start, size_t *len) {
    for (;;) {
        size_t p = *pos;
        if (p >= n) return 0;
        size_t begin;
        if (p == 0 && find_marker(text, n, 0) == n) {
            begin = 0; /* no markers at all: the whole text */
        } else {
            size_t mk = find_marker(text, n, p);
            if (mk == n) {
                *pos = n;
                return 0;
            }
            const char *nl = memchr(text + mk, '\n', n - mk);
            begin = nl ? (size_t)(nl - text) + 1 : n;
        }
        size_t end = find_marker(text, n, begin);
        *pos = end;
        size_t e = end;
        while (e > begin && (text[e - 1] == '\n' || text[e - 1] == '\r')) e--;
        if (e > begin) {
            *start = begin;
            *len = e - begin;
            return 1;
        }
        if (end >= n) return 0;
    }
}
