/*
 * startup.c - instance lock and memory estimate at program start (see
 * startup.h).
 */
#include "engine/startup.h"

#include <stdio.h>

#include "base/instance_lock.h"
#include "model/session_state.h"

int ds4_startup_lock(const char *prog) {
    ds4_err err = {0};
    if (ds4_instance_lock(&err) == 0) return 0;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return err.code == DS4_EBUSY ? DS4_EXIT_LOCKED : 1;
}

static uint64_t tensor_bytes(const ds4_wt *t) {
    if (!t->name) return 0;
    uint64_t mats = t->ne[2] ? t->ne[2] : 1;
    return (uint64_t)t->row_bytes * t->ne[1] * mats;
}

uint64_t ds4_weights_bytes(const ds4_weights *w) {
    uint64_t total = 0;
    const ds4_wt *top[] = {&w->token_embd,      &w->output_hc_base, &w->output_hc_fn,
                           &w->output_hc_scale, &w->output_norm,    &w->output};
    for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++) total += tensor_bytes(top[i]);
    const size_t per_layer = sizeof(ds4_layer_weights) / sizeof(ds4_wt);
    for (uint32_t il = 0; il < w->cfg.n_layer; il++) {
        const ds4_wt *t = (const ds4_wt *)&w->layers[il];
        for (size_t i = 0; i < per_layer; i++) total += tensor_bytes(&t[i]);
    }
    return total;
}

const char *ds4_fmt_bytes(uint64_t b, char buf[32]) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0) snprintf(buf, 32, "%llu bytes", (unsigned long long)b);
    else snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}

const char *ds4_memory_line(const ds4_weights *w, uint32_t ctx, char *buf, size_t len) {
    char a[32], b[32], c[32];
    uint64_t wb = ds4_weights_bytes(w), kv = ds4_kv_state_bytes(&w->cfg, ctx);
    snprintf(buf, len, "memory: weights %s + context %u tokens %s = %s", ds4_fmt_bytes(wb, a), ctx,
             ds4_fmt_bytes(kv, b), ds4_fmt_bytes(wb + kv, c));
    return buf;
}

void ds4_startup_print_memory(const char *prog, const char *backend, const ds4_weights *w, uint32_t ctx) {
    char line[160];
    fprintf(stderr, "%s: backend %s; %s\n", prog, backend, ds4_memory_line(w, ctx, line, sizeof(line)));
}
