/*
 * st_build.c - safetensors files for tests (see st_build.h).
 */
#include "common/st_build.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void st_raw(const char *header, const void *data, size_t ndata, uint8_t **out, size_t *outlen) {
    size_t h = strlen(header);
    uint8_t *buf = malloc(8 + h + ndata + 1);
    if (!buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, header, h);
    if (ndata) memcpy(buf + 8 + h, data, ndata);
    *out = buf;
    *outlen = 8 + h + ndata;
}

void st_build(const st_spec *specs, size_t n, const char *metadata, uint8_t **out, size_t *outlen) {
    size_t cap = 256 + (metadata ? strlen(metadata) : 0);
    for (size_t i = 0; i < n; i++) cap += strlen(specs[i].name) + 160;
    char *hdr = malloc(cap + 8);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += specs[i].nbytes;
    uint8_t *data = calloc(total ? total : 1, 1);
    if (!hdr || !data) abort();
    size_t len = 0, off = 0;
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    if (metadata) len += (size_t)snprintf(hdr + len, cap - len, "\"__metadata__\":%s%s", metadata, n ? "," : "");
    for (size_t i = 0; i < n; i++) {
        const st_spec *s = &specs[i];
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", s->name,
                                s->dtype);
        for (int d = 0; d < s->ndim; d++)
            len += (size_t)snprintf(hdr + len, cap - len, "%s%" PRIu64, d ? "," : "", s->shape[d]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + s->nbytes);
        if (s->data && s->nbytes) memcpy(data + off, s->data, s->nbytes);
        off += s->nbytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    hdr[len] = '\0';
    st_raw(hdr, data, total, out, outlen);
    free(hdr);
    free(data);
}

void st_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "st_write_file %s failed\n", path);
        abort();
    }
}

char *st_tempdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof(tmpl), "%s/ds4test-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    if (!d) abort();
    return strdup(d);
}

void st_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[1024];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}
