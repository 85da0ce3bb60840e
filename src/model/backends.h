/*
 * backends.h - the compute backends of this build, by name: "cpu" always,
 * "cuda" in CUDA builds (`make cuda`).
 *
 * The interface they implement is model/backend.h; this is the one place
 * that knows every implementation, so the interface does not depend on
 * them.
 */
#ifndef DS4_MODEL_BACKENDS_H
#define DS4_MODEL_BACKENDS_H

#include <stddef.h>

#include "base/error.h"
#include "model/backend.h"

/* 0 when this build has the named backend (NULL: the default); else why
 * not ("metal", "cuda" in a CPU build, unknown names).  Programs check
 * before loading the model. */
int ds4_backend_check_name(const char *name, ds4_err *err);

/* Create the named backend ("cpu"; "cuda" in CUDA builds) over loaded
 * weights, which must outlive it. */
ds4_backend *ds4_backend_create(const char *name, const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* The CPU reference backend (src/model/cpu/). */
ds4_backend *ds4_cpu_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* The CUDA backend (src/model/cuda/, CUDA builds only).  Also accepts
 * synthetic weights (ds4_weights_synthetic), which it fills on the GPU.
 * Its prefill chunk defaults to 2048. */
ds4_backend *ds4_cuda_backend_create(const ds4_weights *w, const ds4_backend_opts *opts, ds4_err *err);

/* CUDA builds: the device's copy bandwidth (bytes read + written per second,
 * a large device-to-device copy, best of several), and its name. */
int ds4_cuda_copy_bandwidth(double *bytes_per_s, char *name, size_t name_len, ds4_err *err);

#endif
