/*
 * backend.c - what every backend shares (see backend.h): option defaults,
 * the generic greedy loop, a state sized for a backend's session.
 */
#include "model/backend.h"

#include "base/rank.h"

ds4_backend_opts ds4_backend_opts_resolve(const ds4_backend_opts *opts) {
    ds4_backend_opts o = {0};
    if (opts) o = *opts;
    if (o.ctx_size == 0) o.ctx_size = DS4_CTX_DEFAULT;
    if (o.main_ctx == 0 || o.main_ctx > o.ctx_size) o.main_ctx = o.ctx_size;
    if (o.prefill_chunk == 0) o.prefill_chunk = 2048; /* ds4's default, in DSV4 payloads (docs/MODEL.md 7) */
    return o;
}

int ds4_seq_greedy(ds4_backend *b, ds4_seq *s, uint32_t n, uint32_t *out, ds4_err *err) {
    if (b->ops->greedy) return b->ops->greedy(b, s, n, out, err);
    for (uint32_t i = 0; i < n; i++) {
        const float *l = ds4_seq_logits(b, s);
        if (!l) return ds4_err_set(err, DS4_EINVAL, "greedy generation needs logits (prefill first)");
        out[i] = (uint32_t)ds4_argmax(l, (int)b->w->cfg.n_vocab);
        if (ds4_seq_decode(b, s, out[i], err) != 0) return -1;
    }
    return 0;
}

ds4_kv_state *ds4_backend_state_new(const ds4_backend *b, ds4_err *err) {
    return ds4_kv_state_new(&b->w->cfg, b->opts.ctx_size, b->opts.prefill_chunk, err);
}
