/*
 * cuda_seq.cu - the batched step and the rewind on the GPU (backend.h,
 * "sequences"), for the backend's one sequence: a step of several rows (an
 * MTP verification) is a prefill pass.  As on the CPU (cpu_rewind.c), a
 * mark and the rewindable passes after it journal what they destroy of the
 * state at the mark:
 *   - the raw ring slots their rows overwrite (device copies of the slot
 *     before the pass, and of the row the pass puts there: a ring shorter
 *     than the rows since the mark has slots written twice);
 *   - the compressor and indexer frontiers, after the deferred decode
 *     windows were folded into them (cu_comp_flush), so that they are the
 *     canonical frontiers of MODEL.md 6.2;
 *   - each row's compressor projections, copied out of the pass buffers by
 *     the pass itself (cu_journal_proj, called where they are made);
 *   - every row's logits (host memory: the step reads them anyway).
 * Rewinding to n gives each ring slot a rejected row wrote the row of the
 * latest kept position of that slot (one launch for every layer), restores
 * the frontiers, then replays the kept rows' compressor steps from their
 * journaled projections with the pass's own kernels (cu_compress over the
 * kept rows): the state is the one a sequence that never saw the rejected
 * rows has.
 */
#include "model/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

static size_t front_floats(const ds4_config *c, uint32_t ratio) {
    if (ratio == 0) return 0;
    size_t n = 2 * (size_t)ds4_state_frontier_rows(ratio) * ds4_state_frontier_width(c, ratio, false);
    if (ratio == 4) n += 2 * (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
    return n;
}

/* Floats of one row's projections at a layer of this ratio: ckv, cgate,
 * (ratio 4) ikv, igate. */
static size_t proj_row_floats(const ds4_config *c, uint32_t ratio) {
    if (ratio == 0) return 0;
    size_t n = 2 * (size_t)ds4_compress_coff(ratio) * c->head_dim;
    if (ratio == 4) n += 4 * (size_t)c->idx_head_dim;
    return n;
}

/* Offsets of layer il's frontiers and projections in the journal. */
static size_t front_off(const ds4_config *c, uint32_t il) {
    size_t off = 0;
    for (uint32_t i = 0; i < il; i++) off += front_floats(c, ds4_layer_ratio(c, i));
    return off;
}
static size_t proj_off(const ds4_config *c, uint32_t il, uint32_t cap) {
    size_t off = 0;
    for (uint32_t i = 0; i < il; i++) off += (size_t)cap * proj_row_floats(c, ds4_layer_ratio(c, i));
    return off;
}

void cu_journal_free(cu_journal *j) {
    if (j->raw) cudaFree(j->raw);
    if (j->raw_row) cudaFree(j->raw_row);
    if (j->rings) cudaFree(j->rings);
    if (j->front) cudaFree(j->front);
    if (j->proj) cudaFree(j->proj);
    free(j->logits);
    memset(j, 0, sizeof(*j));
}

static int journal_alloc(cuda_backend *b, ds4_err *err) {
    const ds4_config *c = b->cfg;
    cu_journal *j = &b->jr;
    j->cap = DS4_REWIND_MAX;
    size_t raw_bytes = (size_t)j->cap * c->n_layer * c->head_dim * sizeof(float);
    if (cu_dev_alloc((void **)&j->raw, raw_bytes, "rewind journal", err) ||
        cu_dev_alloc((void **)&j->raw_row, raw_bytes, "rewind journal", err) ||
        cu_dev_alloc((void **)&j->rings, c->n_layer * sizeof(float *), "rewind journal", err) ||
        cu_dev_alloc((void **)&j->front, (front_off(c, c->n_layer) + 1) * sizeof(float), "rewind journal", err) ||
        cu_dev_alloc((void **)&j->proj, (proj_off(c, c->n_layer, j->cap) + 1) * sizeof(float), "rewind journal",
                     err)) {
        cu_journal_free(j);
        return -1;
    }
    if (!(j->logits = (float *)malloc((size_t)(j->cap + 1) * c->n_vocab * sizeof(float)))) {
        cu_journal_free(j);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory for the rewind journal");
    }
    float *rings[DS4_MAX_LAYERS];
    for (uint32_t il = 0; il < c->n_layer; il++) rings[il] = b->L[il].raw;
    CU_TRY(cudaMemcpy(j->rings, rings, c->n_layer * sizeof(float *), cudaMemcpyHostToDevice));
    return 0;
}

/* Copy layer il's frontiers to (save) or from the journal, on st. */
static int copy_fronts(cuda_backend *b, uint32_t il, bool save, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlstate *L = &b->L[il];
    if (L->ratio == 0) return 0;
    size_t cn = (size_t)ds4_state_frontier_rows(L->ratio) * ds4_state_frontier_width(c, L->ratio, false);
    size_t in = L->ratio == 4 ? (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true) : 0;
    float *parts[4] = {L->comp_kv, L->comp_score, L->idx_kv, L->idx_score};
    size_t sizes[4] = {cn, cn, in, in};
    float *f = b->jr.front + front_off(c, il);
    for (int i = 0; i < 4; i++) {
        if (sizes[i] == 0) continue;
        CU_TRY(cudaMemcpyAsync(save ? f : parts[i], save ? parts[i] : f, sizes[i] * sizeof(float),
                               cudaMemcpyDeviceToDevice, b->st));
        f += sizes[i];
    }
    return 0;
}

/* The raw ring slots of positions [p0, p1) into the journal's rows
 * p0 - n0 .., as the pass about to write them finds them (a pass longer
 * than the ring finds a slot it writes twice as it was before it). */
static int save_slots(cuda_backend *b, uint32_t il, uint32_t p0, uint32_t p1, ds4_err *err) {
    size_t hd = b->cfg->head_dim;
    for (uint32_t p = p0; p < p1;) {
        uint32_t slot = p % b->raw_cap, run = b->raw_cap - slot;
        if (run > p1 - p) run = p1 - p;
        CU_TRY(cudaMemcpyAsync(b->jr.raw + ((size_t)il * b->jr.cap + (p - b->jr.n0)) * hd,
                               b->L[il].raw + (size_t)slot * hd, run * hd * sizeof(float), cudaMemcpyDeviceToDevice,
                               b->st));
        p += run;
    }
    return 0;
}

int cu_journal_rows(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    if (!b->jr.on) return 0;
    size_t hd = b->cfg->head_dim;
    CU_TRY(cudaMemcpyAsync(b->jr.raw_row + ((size_t)il * b->jr.cap + (b->n_tokens - b->jr.n0)) * hd, b->kvbuf,
                           T * hd * sizeof(float), cudaMemcpyDeviceToDevice, b->st));
    return 0;
}

/* The ring slots a rewind rewrites, and where each one's row comes from:
 * a journaled row of the pass (own) or a slot as the mark left it. */
typedef struct ring_fix {
    uint32_t n;
    uint32_t slot[DS4_REWIND_MAX];
    uint32_t row[DS4_REWIND_MAX]; /* journal row */
    uint8_t own[DS4_REWIND_MAX];
} ring_fix;

/* Every layer's slots (a block per slot and layer). */
static __global__ void ring_fix_kernel(ring_fix f, float *const *rings, const float *jr_old, const float *jr_own,
                                       uint32_t cap_rows, uint32_t hd) {
    dev_pdl_enter();
    uint32_t e = blockIdx.x, il = blockIdx.y;
    const float *src = (f.own[e] ? jr_own : jr_old) + ((size_t)il * cap_rows + f.row[e]) * hd;
    float *dst = rings[il] + (size_t)f.slot[e] * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = src[i];
}

/* The slots the rows [n, cur) wrote: each gets the row of the latest
 * position before n that maps to it - the pass's own when that position
 * is at least the mark's, else the slot as the mark left it (what the
 * first row after the mark to write the slot found there). */
static int fix_ring(cuda_backend *b, uint32_t n, uint32_t cur, ds4_err *err) {
    const cu_journal *j = &b->jr;
    int64_t cap = b->raw_cap;
    ring_fix f;
    memset(&f, 0, sizeof(f));
    for (uint32_t p = n; p < cur && p < n + (uint32_t)cap; p++) {
        uint32_t slot = p % b->raw_cap;
        int64_t q = (int64_t)n - 1 - ((((int64_t)n - 1 - slot) % cap) + cap) % cap;
        f.slot[f.n] = slot;
        f.own[f.n] = q >= (int64_t)j->n0;
        f.row[f.n] = f.own[f.n] ? (uint32_t)(q - j->n0) : (uint32_t)((((int64_t)slot - (int64_t)(j->n0 % cap)) % cap + cap) % cap);
        f.n++;
    }
    if (f.n == 0) return 0;
    DS4_LAUNCH(ring_fix_kernel, dim3(f.n, b->cfg->n_layer), 128, 0, b->st, f, (float *const *)j->rings,
               (const float *)j->raw, (const float *)j->raw_row, j->cap, b->cfg->head_dim);
    CU_LAUNCHED();
    return 0;
}

/* The pass buffers' projections of rows [0, T) at layer il to (save) or
 * from the journal's rows r0 .. r0 + T. */
static int copy_proj(cuda_backend *b, uint32_t il, uint32_t r0, uint32_t T, bool save, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t ratio = b->L[il].ratio;
    size_t cw = (size_t)ds4_compress_coff(ratio) * c->head_dim, iw = 2 * (size_t)c->idx_head_dim;
    float *bufs[4] = {b->ckv, b->cgate, b->ikv, b->igate};
    size_t widths[4] = {cw, cw, ratio == 4 ? iw : 0, ratio == 4 ? iw : 0};
    float *f = b->jr.proj + proj_off(c, il, b->jr.cap);
    for (int i = 0; i < 4; i++) {
        if (widths[i] == 0) continue;
        float *jr = f + (size_t)r0 * widths[i];
        CU_TRY(cudaMemcpyAsync(save ? jr : bufs[i], save ? bufs[i] : jr, T * widths[i] * sizeof(float),
                               cudaMemcpyDeviceToDevice, b->st));
        f += (size_t)b->jr.cap * widths[i];
    }
    return 0;
}

int cu_journal_proj(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    if (!b->jr.on || b->L[il].ratio == 0) return 0;
    return copy_proj(b, il, b->n_tokens - b->jr.n0, T, true, err); /* the pass's rows start at n_tokens */
}

/* The mark: the frontiers (the decode windows folded into them first) and
 * the logits. */
int cu_seq_mark(ds4_backend *base, ds4_seq *s, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    const ds4_config *c = b->cfg;
    cu_journal *j = &b->jr;
    if (s != &b->main_seq) return ds4_err_set(err, DS4_EINVAL, "mark: the sequence is not this backend's");
    if (!j->raw && journal_alloc(b, err)) return -1;
    if (cu_comp_flush(b, err)) return ds4_err_prefix(err, "folding the decode steps' compressor windows");
    j->valid = false;
    j->n0 = b->n_tokens;
    j->T = 0;
    for (uint32_t il = 0; il < c->n_layer; il++)
        if (copy_fronts(b, il, true, err)) return -1;
    j->had_logits = b->has_logits;
    if (b->has_logits) {
        const float *l = b->base.ops->logits(&b->base, &b->main_seq);
        if (!l) return ds4_err_set(err, DS4_EIO, "CUDA: reading the logits failed");
        memcpy(j->logits + (size_t)j->cap * c->n_vocab, l, c->n_vocab * sizeof(float));
    }
    CU_TRY(cudaStreamSynchronize(b->st));
    j->valid = true;
    return 0;
}

static int check_rows(const cuda_backend *b, const ds4_row *rows, uint32_t n, ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (n > b->chunk) return ds4_err_set(err, DS4_ERANGE, "a step of %u rows exceeds the %u a pass holds", n, b->chunk);
    for (uint32_t i = 0; i < n; i++) {
        if (!rows[i].seq || rows[i].seq->owner != &b->base)
            return ds4_err_set(err, DS4_EINVAL, "row %u: the sequence is not this backend's", i);
        if (rows[i].seq != &b->main_seq)
            return ds4_err_set(err, DS4_EUNSUPPORTED, "row %u: the CUDA backend holds one sequence", i);
        if (rows[i].token >= c->n_vocab)
            return ds4_err_set(err, DS4_EINVAL, "token %u at row %u is outside the vocabulary (%u)", rows[i].token, i,
                               c->n_vocab);
        if ((rows[i].want & DS4_ROW_REWIND) != (rows[0].want & DS4_ROW_REWIND))
            return ds4_err_set(err, DS4_EINVAL, "row %u: the rows of a sequence are all rewindable or none is", i);
    }
    if ((rows[0].want & DS4_ROW_REWIND) && !b->jr.valid)
        return ds4_err_set(err, DS4_EINVAL, "row 0: a rewindable row of a sequence without a mark");
    if ((rows[0].want & DS4_ROW_REWIND) && b->n_tokens + n - b->jr.n0 > DS4_REWIND_MAX)
        return ds4_err_set(err, DS4_ERANGE, "%u rewindable rows after the mark exceed %d", b->n_tokens + n - b->jr.n0,
                           DS4_REWIND_MAX);
    if ((uint64_t)b->n_tokens + n > b->ctx)
        return ds4_err_set(err, DS4_ERANGE, "%u tokens after %u do not fit the context of %u", n, b->n_tokens, b->ctx);
    return 0;
}

int cu_seq_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    const ds4_config *c = b->cfg;
    if (n == 0) return 0;
    if (check_rows(b, rows, n, err)) return -1;
    bool rewindable = rows[0].want & DS4_ROW_REWIND;
    uint32_t nl = 0;
    for (uint32_t i = 0; i < n; i++) nl += (rows[i].want & DS4_ROW_LOGITS) && out && out->logits;
    if (cu_comp_flush(b, err)) return ds4_err_prefix(err, "folding the decode steps' compressor windows");
    if (!rewindable) b->jr.valid = false; /* drops the mark */
    for (uint32_t il = 0; rewindable && il < c->n_layer; il++)
        if (save_slots(b, il, b->n_tokens, b->n_tokens + n, err)) return -1;
    /* every row's logits when some are asked for or kept, else the last's */
    float *all = rewindable ? b->jr.logits + (size_t)(b->n_tokens - b->jr.n0) * c->n_vocab : NULL;
    if (!all && nl && !(all = (float *)malloc((size_t)n * c->n_vocab * sizeof(float))))
        return ds4_err_set(err, DS4_ENOMEM, "out of memory for %u rows of logits", n);
    uint32_t tok[DS4_REWIND_MAX], *ids = n <= DS4_REWIND_MAX ? tok : (uint32_t *)malloc(n * sizeof(uint32_t));
    int rc = -1;
    if (!ids) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < n; i++) ids[i] = rows[i].token;
    if (cudaMemcpyAsync(b->d_tokens, ids, n * sizeof(uint32_t), cudaMemcpyHostToDevice, b->st) != cudaSuccess) {
        ds4_err_set(err, DS4_EIO, "CUDA: copying the step's tokens failed");
        goto out;
    }
    b->jr.on = rewindable;
    rc = cu_forward(b, b->d_tokens, n, b->n_tokens, false, all, err);
    b->jr.on = false;
    if (rc) {
        ds4_err_prefix(err, "step of %u rows at %u", n, b->n_tokens);
        goto out;
    }
    rc = -1;
    {
        size_t hcd = (size_t)c->n_hc * c->n_embd;
        uint32_t nh = 0;
        for (uint32_t i = 0; i < n; i++)
            if ((rows[i].want & DS4_ROW_HIDDEN) && out && out->hidden &&
                cudaMemcpyAsync(out->hidden + hcd * nh++, b->S + hcd * i, hcd * sizeof(float), cudaMemcpyDeviceToHost,
                                b->st) != cudaSuccess) {
                ds4_err_set(err, DS4_EIO, "CUDA: reading the hidden state of row %u failed", i);
                goto out;
            }
    }
    memcpy(b->tokens + b->n_tokens, ids, n * sizeof(uint32_t));
    b->n_tokens += n;
    if (rewindable) b->jr.T = b->n_tokens - b->jr.n0;
    b->fold = b->n_tokens; /* the pass left every position in the frontiers */
    if (cu_set_step(b, STEP_FOLD, b->n_tokens, 0, err)) goto out;
    if (cudaStreamSynchronize(b->st) != cudaSuccess) {
        ds4_err_set(err, DS4_EIO, "CUDA: the step failed: %s", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
    b->has_logits = true;
    b->logits_fresh = false;
    for (uint32_t i = 0, k = 0; i < n; i++)
        if ((rows[i].want & DS4_ROW_LOGITS) && out && out->logits)
            memcpy(out->logits + (size_t)k++ * c->n_vocab, all + (size_t)i * c->n_vocab, c->n_vocab * sizeof(float));
    rc = 0;
out:
    if (ids != tok) free(ids);
    if (all && !rewindable) free(all);
    if (rc) b->jr.valid = false; /* the sequence is undefined: the caller resets it */
    return rc;
}

int cu_seq_rewind(ds4_backend *base, ds4_seq *s, uint32_t n, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    const ds4_config *c = b->cfg;
    cu_journal *j = &b->jr;
    uint32_t cur = b->n_tokens;
    if (s != &b->main_seq) return ds4_err_set(err, DS4_EINVAL, "rewind: the sequence is not this backend's");
    if (n == cur) return 0;
    if (n > cur) return ds4_err_set(err, DS4_EINVAL, "rewind to %u tokens: the sequence has %u", n, cur);
    if (!j->valid || n < j->n0)
        return ds4_err_set(err, DS4_EINVAL,
                           "rewind to %u tokens: only rows appended since the sequence's mark (at %u) "
                           "can be taken back",
                           n, j->valid ? j->n0 : cur);
    uint32_t keep = n - j->n0;
    if (cu_set_step(b, STEP_POS | STEP_FOLD, j->n0, 0, err) || fix_ring(b, n, cur, err)) return -1;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        if (copy_fronts(b, il, false, err)) return -1;
        if (b->L[il].ratio == 0 || keep == 0) continue;
        if (copy_proj(b, il, 0, keep, false, err) || cu_compress(b, il, keep, j->n0, false, b->st, NULL, err))
            return ds4_err_prefix(err, "rewind: replaying layer %u", il);
    }
    b->n_tokens = b->fold = n;
    j->T = keep;
    if (cu_set_step(b, STEP_POS | STEP_FOLD, n, 0, err)) return -1;
    /* the logits after token n - 1 (before the step when none is kept) */
    b->has_logits = keep ? true : j->had_logits;
    if (b->has_logits) {
        const float *l = j->logits + (size_t)(keep ? keep - 1 : j->cap) * c->n_vocab;
        CU_TRY(cudaMemcpyAsync(b->d_logits, l, c->n_vocab * sizeof(float), cudaMemcpyHostToDevice, b->st));
        memcpy(b->logits_h, l, c->n_vocab * sizeof(float));
        b->d_last_logits = b->d_logits;
        b->logits_fresh = true;
        if (cu_step_end(b, 0, false, err)) return -1; /* the next greedy token */
    }
    CU_TRY(cudaStreamSynchronize(b->st));
    return 0;
}
