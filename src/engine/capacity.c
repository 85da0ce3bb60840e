/*
 * capacity.c - the sessions' memory and their number (see capacity.h).
 */
#include "engine/capacity.h"

#include <stdio.h>

#include "engine/startup.h"

uint32_t ds4_ctx_granule(uint32_t ctx) {
    uint32_t g = 256;
    while (g < 4096 && g * 2 <= ctx / 16) g *= 2;
    return g;
}

/* What pool p has beside the weights and the shared part (0 when those
 * take it all). */
static uint64_t usable(const ds4_mem_pool *p) {
    uint64_t kept = p->weights + p->shared;
    return p->room > kept ? p->room - kept : 0;
}

/* The sessions' budget: the given one, else three quarters of what is
 * left, but one session of the least all the same (a host whose available
 * memory the mapped weights nearly fill still serves). */
static uint64_t budget_of(const ds4_mem_pool *p) {
    if (p->given) return p->given;
    if (!p->room) return UINT64_MAX;
    uint64_t b = usable(p) / 4 * 3;
    return b > p->least ? b : p->least;
}

static uint64_t holds(const ds4_mem_pool *p, uint64_t per) { return p->budget / (per ? per : 1); }

/* " (3/4 of 10.0 GiB available - 2.0 GiB weights - 2.0 MiB shared)", or
 * " (--kv-mem-mb)": where a budget comes from. */
static const char *budget_text(const ds4_mem_pool *p, char *buf, size_t len) {
    char a[32], b[48], c[48];
    if (p->given) {
        snprintf(buf, len, " (--kv-mem-mb)");
        return buf;
    }
    if (p->weights) snprintf(b, sizeof(b), " - %s weights", ds4_fmt_bytes(p->weights, a));
    else b[0] = 0;
    if (p->shared) snprintf(c, sizeof(c), " - %s shared", ds4_fmt_bytes(p->shared, a));
    else c[0] = 0;
    snprintf(buf, len, " (3/4 of %s available%s%s)", ds4_fmt_bytes(p->room, a), b, c);
    return buf;
}

int ds4_capacity_plan(ds4_mem_pool *pools, size_t n_pools, uint32_t least_tokens, uint32_t given, uint32_t max,
                      ds4_capacity *out, ds4_err *err) {
    out->n = given ? given : max;
    out->measured = false;
    out->fits = UINT64_MAX;
    for (size_t i = 0; i < n_pools; i++) {
        ds4_mem_pool *p = &pools[i];
        p->budget = budget_of(p);
        if (p->budget == UINT64_MAX) continue;
        out->measured = true;
        uint64_t fits = holds(p, p->least);
        if (fits < out->fits) out->fits = fits;
        char a[32], b[32], c[32], why[160];
        if (fits == 0)
            return ds4_err_set(err, DS4_ENOMEM,
                               "a session of %u tokens needs %s of %s, but the sessions have %s%s; lower --ctx or "
                               "free memory",
                               least_tokens, ds4_fmt_bytes(p->least, a), p->name, ds4_fmt_bytes(p->budget, b),
                               budget_text(p, why, sizeof(why)));
        if (given && fits < given)
            return ds4_err_set(err, DS4_ENOMEM,
                               "--parallel %u: %u sessions of at least %u tokens need %s of %s (%s each), but the "
                               "sessions have %s%s; lower --parallel",
                               given, given, least_tokens, ds4_fmt_bytes((uint64_t)given * p->least, a), p->name,
                               ds4_fmt_bytes(p->least, b), ds4_fmt_bytes(p->budget, c),
                               budget_text(p, why, sizeof(why)));
    }
    if (!given && out->measured) out->n = out->fits < max ? (uint32_t)out->fits : max;
    return 0;
}

const char *ds4_capacity_explain(const ds4_mem_pool *p, char *buf, size_t len) {
    char a[32], why[160];
    if (p->budget == UINT64_MAX) {
        snprintf(buf, len, "%s: not known", p->name);
        return buf;
    }
    snprintf(buf, len, "%s: %s for sessions%s, %llu of the least or %llu of the most at once", p->name,
             ds4_fmt_bytes(p->budget, a), budget_text(p, why, sizeof(why)), (unsigned long long)holds(p, p->least),
             (unsigned long long)holds(p, p->most));
    return buf;
}
