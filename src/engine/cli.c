/*
 * cli.c - the shared options' actions (see cli.h).
 */
#include "engine/cli.h"

#include <stdio.h>
#include <string.h>

#include "base/numparse.h"

#include "model/backends.h"

_Static_assert(sizeof(ds4_think_mode) == sizeof(int), "DS4_CLI_THINK stores the mode as an int");

int ds4_cli_quality_note(void *prog, const char *value, ds4_err *err) {
    (void)value;
    (void)err;
    fprintf(stderr, "%s: --quality: nothing to change, this engine's kernels have one precision\n", (const char *)prog);
    return 0;
}

int ds4_cli_check_backend(const ds4_cli *cli, const char *name) {
    ds4_err err = {0};
    if (ds4_backend_check_name(name, &err) == 0) return 0;
    return ds4_cli_usage(cli, "--backend %s: %s", name ? name : "", err.msg);
}

int ds4_cli_parse_gpu_mem(void *ctx, const char *value, ds4_err *err) {
    uint64_t v;
    if (ds4_parse_size(value, &v) || v == 0)
        return ds4_err_set(err, DS4_EINVAL, "a size in bytes, or with K, M, G or T (24G), above 0");
    *(uint64_t *)ctx = v;
    return 0;
}
int ds4_cli_parse_host_mapped(void *ctx, const char *value, ds4_err *err) {
    int *pct = ctx;
    if (!strcmp(value, "auto")) {
        *pct = 0;
        return 0;
    }
    if (!strcmp(value, "none")) {
        *pct = -1;
        return 0;
    }
    uint32_t v;
    if (ds4_parse_u32(value, 0, 100, &v))
        return ds4_err_set(err, DS4_EINVAL, "auto, none, or a percentage from 0 to 100");
    *pct = v ? (int)v : -1;
    return 0;
}
int ds4_cli_parse_gpus(void *ctx, const char *value, ds4_err *err) {
    ds4_dist_opts *o = ctx;
    int n = 0;
    for (const char *p = value;;) {
        size_t len = strcspn(p, ",");
        char num[16];
        uint32_t g;
        if (len == 0 || len >= sizeof(num))
            return ds4_err_set(err, DS4_EINVAL, "GPU indices by commas (0,1,2), each below %d", DS4_DIST_MAX_GPUS);
        memcpy(num, p, len);
        num[len] = 0;
        if (ds4_parse_u32(num, 0, DS4_DIST_MAX_GPUS - 1, &g))
            return ds4_err_set(err, DS4_EINVAL, "GPU indices by commas (0,1,2), each below %d", DS4_DIST_MAX_GPUS);
        for (int i = 0; i < n; i++)
            if (o->gpus[i] == (int)g) return ds4_err_set(err, DS4_EINVAL, "GPU %u is listed twice", g);
        o->gpus[n++] = (int)g; /* distinct and below the bound: at most DS4_DIST_MAX_GPUS */
        if (!p[len]) break;
        p += len + 1;
    }
    if (n < 2)
        return ds4_err_set(err, DS4_EINVAL,
                           "a pipeline over GPUs takes two or more (0,1); one process on one GPU needs no --gpus "
                           "(CUDA_VISIBLE_DEVICES picks it)");
    o->n_gpus = n;
    return 0;
}

int ds4_cli_tp_check(const ds4_cli *cli, uint32_t n, const ds4_dist_opts *d) {
    if (n < 2) return 0;
    const char *with = d->n_gpus ? "--gpus" : d->layers ? "--layers" : ds4_dist_launched() ? "mpirun" : NULL;
    if (with)
        return ds4_cli_usage(cli, "--tensor-parallel does not combine with a pipeline (%s) yet: each runs alone", with);
    return 0;
}

int ds4_cli_steering_check(const ds4_cli *cli, ds4_cli_steer *st) {
    if (!st->ffn_given && st->path) st->ffn = 1.0f;
    if (!st->path && (st->ffn != 0.0f || st->attn != 0.0f))
        return ds4_cli_usage(cli, "--dir-steering-%s needs --dir-steering-file", st->ffn != 0.0f ? "ffn" : "attn");
    return 0;
}

void ds4_cli_steering_opts(const ds4_cli_steer *st, ds4_engine_opts *eo) {
    eo->steer_path = st->path;
    eo->steer_ffn = st->ffn;
    eo->steer_attn = st->attn;
}
