/*
 * steering.h - directional steering (docs/STEERING.md): one direction per
 * layer, projected out of (or into) a sublayer's output row at run time.
 *
 * A direction file is n_layer x n_embd little-endian f32 values, layer by
 * layer, with no header (ds4's layout: 43 x 4096 for Flash).  Each layer's
 * row is a unit vector, or all zeros for a layer left alone.  With scale s
 * a sublayer output row y becomes
 *
 *     y - s * v * (v . y)
 *
 * after the FFN output and/or after the attention output (each with its own
 * scale), before the HC post adds it to the residual streams.  s = 1
 * removes the direction's component, s > 1 pushes y past it, s < 0 adds
 * more of it.  A scale of 0 runs the unchanged path.
 */
#ifndef DS4_MODEL_STEERING_H
#define DS4_MODEL_STEERING_H

#include <stdint.h>

#include "base/error.h"
#include "model/config.h"

/* The range the scales are accepted in (ds4's). */
#define DS4_STEER_SCALE_MAX 100.0

/* How far a row's norm may be from 1 (a file written as f32 by any tool). */
#define DS4_STEER_NORM_TOL 1e-3

typedef struct ds4_steering {
    uint32_t n_layer, n_embd;
    float *dir; /* n_layer x n_embd: unit rows, or zero rows */
} ds4_steering;

/* The directions of the file at path, checked against the model's shape
 * (its size names both shapes when they differ) and row by row (finite,
 * unit norm or zero). */
ds4_steering *ds4_steering_load(const char *path, const ds4_config *cfg, ds4_err *err);

/* The same checks on directions in memory (copied). */
ds4_steering *ds4_steering_from(const float *dir, uint32_t n_layer, uint32_t n_embd, ds4_err *err);

void ds4_steering_free(ds4_steering *s);

/* Write n_layer x n_embd floats as a direction file. */
int ds4_steering_write(const char *path, const float *dir, uint32_t n_layer, uint32_t n_embd, ds4_err *err);

/* The dot product v . y the projection uses, accumulated in double in
 * index order (the CUDA kernel reduces in double too). */
double ds4_steer_dot(const float *v, const float *y, uint32_t n);

/* y <- y - s * v * (v . y) for T rows of n floats, stride apart. */
void ds4_steer_rows(const float *v, float s, float *y, size_t stride, uint32_t T, uint32_t n);

/* Check a scale given by a user or a request: finite and within
 * +-DS4_STEER_SCALE_MAX ("what" names it in the message). */
int ds4_steer_scale_check(double s, const char *what, ds4_err *err);

#endif
