/*
 * capacity.c - sessions the memory holds (see capacity.h).
 */
#include "engine/capacity.h"

#include <stdio.h>

#include "engine/startup.h"

/* What pool p has for sessions: its room less the weights' pages and
 * the shared part (0 when those take it all). */
static uint64_t usable(const ds4_mem_pool *p) {
    uint64_t kept = p->weights + p->shared;
    return p->room > kept ? p->room - kept : 0;
}

/* Sessions pool p holds: all of its usable part (a given --parallel) or
 * three quarters of it (a default). */
static uint64_t holds(const ds4_mem_pool *p, bool given) {
    uint64_t u = usable(p);
    if (!given) u = u / 4 * 3;
    return u / (p->per ? p->per : 1);
}

/* sep, then " 2.0 MiB shared" (", 2.0 MiB shared" for sep ","); "" when
 * nothing is shared. */
static const char *shared_text(const ds4_mem_pool *p, const char *sep, char *buf, size_t len) {
    char a[32];
    if (p->shared) snprintf(buf, len, "%s %s shared", sep, ds4_fmt_bytes(p->shared, a));
    else buf[0] = 0;
    return buf;
}

/* " beside 2.0 GiB of weights"; "" when none are kept. */
static const char *weights_text(const ds4_mem_pool *p, char *buf, size_t len) {
    char a[32];
    if (p->weights) snprintf(buf, len, " beside %s of weights", ds4_fmt_bytes(p->weights, a));
    else buf[0] = 0;
    return buf;
}

int ds4_capacity_plan(const ds4_mem_pool *pools, size_t n_pools, uint32_t ctx, uint32_t given, uint32_t max,
                      ds4_capacity *out, ds4_err *err) {
    out->n = given ? given : max;
    out->measured = false;
    out->fits = UINT64_MAX;
    for (size_t i = 0; i < n_pools; i++) {
        const ds4_mem_pool *p = &pools[i];
        if (!p->room) continue;
        out->measured = true;
        uint64_t fits = holds(p, given != 0);
        if (fits < out->fits) out->fits = fits;
        if (given && fits < given) {
            char a[32], b[32], c[48], d[32], e[48];
            return ds4_err_set(err, DS4_ENOMEM,
                               "--parallel %u: %u sessions of %u tokens need %s of %s (%s each%s), but %s is "
                               "available%s; lower --parallel or --ctx",
                               given, given, ctx, ds4_fmt_bytes((uint64_t)given * p->per + p->shared, a), p->name,
                               ds4_fmt_bytes(p->per, b), shared_text(p, ",", c, sizeof(c)),
                               ds4_fmt_bytes(p->room > p->weights ? p->room - p->weights : 0, d),
                               weights_text(p, e, sizeof(e)));
        }
    }
    if (!given && out->measured) out->n = out->fits < 1 ? 1 : out->fits < max ? (uint32_t)out->fits : max;
    return 0;
}

const char *ds4_capacity_explain(const ds4_mem_pool *p, uint32_t n, bool given, char *buf, size_t len) {
    char a[32], b[32], c[48], d[32], e[48];
    if (!p->room) {
        snprintf(buf, len, "%s: not known", p->name);
    } else if (given) {
        snprintf(buf, len, "%s: %u x %s%s = %s of %s available%s", p->name, n, ds4_fmt_bytes(p->per, a),
                 shared_text(p, " +", c, sizeof(c)), ds4_fmt_bytes((uint64_t)n * p->per + p->shared, b),
                 ds4_fmt_bytes(p->room > p->weights ? p->room - p->weights : 0, d), weights_text(p, e, sizeof(e)));
    } else {
        if (p->weights) snprintf(e, sizeof(e), " - %s weights", ds4_fmt_bytes(p->weights, b));
        else e[0] = 0;
        snprintf(buf, len, "%s: %s available%s%s, 3/4 of it holds %llu sessions of %s", p->name,
                 ds4_fmt_bytes(p->room, a), e, shared_text(p, " -", c, sizeof(c)), (unsigned long long)holds(p, false),
                 ds4_fmt_bytes(p->per, d));
    }
    return buf;
}
