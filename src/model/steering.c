/*
 * steering.c - direction files and the steering projection (steering.h).
 */
#include "model/steering.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Each row finite, and of unit norm or all zeros. */
static int check_rows(const float *dir, uint32_t n_layer, uint32_t n_embd, ds4_err *err) {
    for (uint32_t il = 0; il < n_layer; il++) {
        const float *v = dir + (size_t)il * n_embd;
        for (uint32_t d = 0; d < n_embd; d++)
            if (!isfinite(v[d]))
                return ds4_err_set(err, DS4_EFORMAT, "layer %u, value %u is %s (every value must be finite)", il, d,
                                   isnan(v[d]) ? "NaN" : "infinite");
        double norm = sqrt(ds4_steer_dot(v, v, n_embd));
        if (norm != 0.0 && fabs(norm - 1.0) > DS4_STEER_NORM_TOL)
            return ds4_err_set(err, DS4_EFORMAT,
                               "layer %u's direction has norm %.6g; each layer needs a unit vector (or zeros to "
                               "leave the layer alone)",
                               il, norm);
    }
    return 0;
}

ds4_steering *ds4_steering_from(const float *dir, uint32_t n_layer, uint32_t n_embd, ds4_err *err) {
    if (n_layer == 0 || n_embd == 0) {
        ds4_err_set(err, DS4_EINVAL, "directions of %u x %u values", n_layer, n_embd);
        return NULL;
    }
    if (check_rows(dir, n_layer, n_embd, err)) return NULL;
    ds4_steering *s = calloc(1, sizeof(*s));
    size_t n = (size_t)n_layer * n_embd;
    if (!s || !(s->dir = malloc(n * sizeof(float)))) {
        free(s);
        ds4_err_set(err, DS4_ENOMEM, "out of memory for %u x %u directions", n_layer, n_embd);
        return NULL;
    }
    memcpy(s->dir, dir, n * sizeof(float));
    s->n_layer = n_layer;
    s->n_embd = n_embd;
    return s;
}

/* The file's bytes, when its size is the model's shape. */
static float *read_dir_file(const char *path, const ds4_config *cfg, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    size_t want = (size_t)cfg->n_layer * cfg->n_embd * sizeof(float);
    float *dir = NULL;
    if (fstat(fileno(f), &st) != 0) {
        ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
    } else if ((uint64_t)st.st_size != want) {
        if (st.st_size % sizeof(float) == 0 && cfg->n_embd && (uint64_t)st.st_size % ((uint64_t)cfg->n_embd * 4) == 0)
            ds4_err_set(err, DS4_EFORMAT,
                        "%s: %llu bytes = %llu x %u f32, but the model has %u layers x %u (%zu bytes expected)", path,
                        (unsigned long long)st.st_size, (unsigned long long)st.st_size / ((uint64_t)cfg->n_embd * 4),
                        cfg->n_embd, cfg->n_layer, cfg->n_embd, want);
        else
            ds4_err_set(err, DS4_EFORMAT,
                        "%s: %llu bytes, but a direction file for this model is %u layers x %u f32 = %zu bytes", path,
                        (unsigned long long)st.st_size, cfg->n_layer, cfg->n_embd, want);
    } else if (!(dir = malloc(want))) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for %s", path);
    } else if (fread(dir, 1, want, f) != want) {
        ds4_err_set(err, DS4_EIO, "%s: short read", path);
        free(dir);
        dir = NULL;
    }
    fclose(f);
    return dir;
}

ds4_steering *ds4_steering_load(const char *path, const ds4_config *cfg, ds4_err *err) {
    float *dir = read_dir_file(path, cfg, err);
    if (!dir) return NULL;
    ds4_steering *s = ds4_steering_from(dir, cfg->n_layer, cfg->n_embd, err);
    free(dir);
    if (!s) ds4_err_prefix_path(err, path, "direction file");
    return s;
}

void ds4_steering_free(ds4_steering *s) {
    if (!s) return;
    free(s->dir);
    free(s);
}

int ds4_steering_write(const char *path, const float *dir, uint32_t n_layer, uint32_t n_embd, ds4_err *err) {
    FILE *f = fopen(path, "wb");
    if (!f) return ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
    size_t n = (size_t)n_layer * n_embd;
    bool ok = fwrite(dir, sizeof(float), n, f) == n;
    if (fclose(f) != 0) ok = false;
    if (!ok) return ds4_err_set(err, DS4_EIO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

double ds4_steer_dot(const float *v, const float *y, uint32_t n) {
    double acc = 0.0;
    for (uint32_t d = 0; d < n; d++) acc += (double)v[d] * (double)y[d];
    return acc;
}

void ds4_steer_rows(const float *v, float s, float *y, size_t stride, uint32_t T, uint32_t n) {
    for (uint32_t t = 0; t < T; t++) {
        float *row = y + (size_t)t * stride;
        float coef = s * (float)ds4_steer_dot(v, row, n);
        for (uint32_t d = 0; d < n; d++) row[d] -= coef * v[d];
    }
}

int ds4_steer_scale_check(double s, const char *what, ds4_err *err) {
    if (!isfinite(s) || s < -DS4_STEER_SCALE_MAX || s > DS4_STEER_SCALE_MAX)
        return ds4_err_set(err, DS4_EINVAL, "%s: %g is outside -%g..%g", what, s, DS4_STEER_SCALE_MAX,
                           DS4_STEER_SCALE_MAX);
    return 0;
}
