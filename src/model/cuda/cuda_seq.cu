/*
 * cuda_seq.cu - the batched step and the rewind on the GPU (backend.h,
 * "sequences").  A step is one prefill pass over its rows, in parts of one
 * sequence each (cu_forward_parts): every product takes all rows at once -
 * the routed experts grouped over them, so that each expert's weights are
 * read once a step however many sequences it advances - and each part's
 * attention, compressors and indexer run over its own sequence's state.
 * A row's logits depend on the other rows of its step only by the
 * rounding of the products over more rows (docs/DESIGN.md 7).
 *
 * As on the CPU (cpu_rewind.c), a mark and the rewindable passes after it
 * journal, per sequence, what they destroy of its state at the mark:
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
    if (j->segs) cudaFree(j->segs);
    if (j->front) cudaFree(j->front);
    if (j->proj) cudaFree(j->proj);
    free(j->logits);
    memset(j, 0, sizeof(*j));
}

static int journal_alloc(cuda_backend *b, ds4_err *err) {
    const ds4_config *c = b->cfg;
    cu_journal *j = &b->sq->jr;
    j->cap = DS4_REWIND_MAX;
    size_t raw_bytes = (size_t)j->cap * c->n_layer * c->head_dim * sizeof(float);
    if (cu_dev_alloc((void **)&j->raw, raw_bytes, "rewind journal", err) ||
        cu_dev_alloc((void **)&j->raw_row, raw_bytes, "rewind journal", err) ||
        cu_dev_alloc((void **)&j->rings, c->n_layer * sizeof(float *), "rewind journal", err) ||
        cu_dev_alloc((void **)&j->segs, 4 * c->n_layer * sizeof(cu_front_seg), "rewind journal", err) ||
        cu_dev_alloc((void **)&j->front, (front_off(c, c->n_layer) + 1) * sizeof(float), "rewind journal", err) ||
        cu_dev_alloc((void **)&j->proj, (proj_off(c, c->n_layer, j->cap) + 1) * sizeof(float), "rewind journal", err)) {
        cu_journal_free(j);
        return -1;
    }
    if (!(j->logits = (float *)malloc((size_t)(j->cap + 1) * c->n_vocab * sizeof(float)))) {
        cu_journal_free(j);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory for the rewind journal");
    }
    return cu_journal_bind(b, b->sq, err);
}

int cu_journal_bind(cuda_backend *b, cu_seq *s, ds4_err *err) {
    const ds4_config *c = b->cfg;
    float *rings[DS4_MAX_LAYERS];
    cu_front_seg segs[4 * DS4_MAX_LAYERS];
    uint32_t n = 0;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        const dlstate *L = &s->L[il];
        rings[il] = L->raw;
        if (L->ratio == 0) continue;
        uint32_t cn = ds4_state_frontier_rows(L->ratio) * ds4_state_frontier_width(c, L->ratio, false);
        uint32_t in = L->ratio == 4 ? ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true) : 0;
        float *parts[4] = {L->comp_kv, L->comp_score, L->idx_kv, L->idx_score};
        uint32_t sizes[4] = {cn, cn, in, in};
        float *f = s->jr.front + front_off(c, il);
        for (int i = 0; i < 4; i++) {
            if (sizes[i] == 0) continue;
            cu_front_seg g = {parts[i], f, sizes[i]};
            segs[n++] = g;
            f += sizes[i];
        }
    }
    s->jr.n_segs = n;
    CU_TRY(cu_upload(s->jr.rings, rings, c->n_layer * sizeof(float *)));
    if (n) CU_TRY(cu_upload(s->jr.segs, segs, n * sizeof(cu_front_seg)));
    return 0;
}

/* Every frontier segment to (save) or from the journal: a block row a
 * segment. */
static __global__ void fronts_copy_kernel(const cu_front_seg *segs, bool save) {
    dev_pdl_enter();
    cu_front_seg g = segs[blockIdx.y];
    const float *src = save ? g.state : g.jr;
    float *dst = save ? g.jr : g.state;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

/* The sequence's frontiers to (save) or from the journal, on st: one
 * launch for every layer (a copy a segment was some 150 host calls a mark
 * on Flash, each mark and rewind of a speculative cycle). */
static int copy_fronts(cuda_backend *b, bool save, ds4_err *err) {
    const cu_journal *j = &b->sq->jr;
    if (j->n_segs == 0) return 0;
    DS4_LAUNCH(fronts_copy_kernel, dim3(16, j->n_segs), 256, 0, b->st, (const cu_front_seg *)j->segs, save);
    CU_LAUNCHED();
    return 0;
}

/* Every layer's ring slot of position p0 + blockIdx.x into the journal's
 * row p0 + blockIdx.x - n0 (layer blockIdx.y). */
static __global__ void slots_save_kernel(float *const *rings, float *jr_raw, uint32_t cap_rows, uint32_t p0,
                                         uint32_t n0, uint32_t raw_cap, uint32_t hd) {
    dev_pdl_enter();
    uint32_t p = p0 + blockIdx.x, il = blockIdx.y;
    const float *src = rings[il] + (size_t)(p % raw_cap) * hd;
    float *dst = jr_raw + ((size_t)il * cap_rows + (p - n0)) * hd;
    for (uint32_t i = threadIdx.x; i < hd; i += blockDim.x) dst[i] = src[i];
}

/* The raw ring slots of positions [p0, p1) into the journal's rows
 * p0 - n0 .., as the pass about to write them finds them (a pass longer
 * than the ring finds a slot it writes twice as it was before it), every
 * layer in one launch. */
static int save_slots(cuda_backend *b, uint32_t p0, uint32_t p1, ds4_err *err) {
    const cu_journal *j = &b->sq->jr;
    if (p1 <= p0) return 0;
    DS4_LAUNCH(slots_save_kernel, dim3(p1 - p0, b->cfg->n_layer), 128, 0, b->st, (float *const *)j->rings, j->raw,
               j->cap, p0, j->n0, b->raw_cap, b->cfg->head_dim);
    CU_LAUNCHED();
    return 0;
}

int cu_journal_rows(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    if (!b->sq->jr.on) return 0;
    size_t hd = b->cfg->head_dim;
    CU_TRY(cudaMemcpyAsync(b->sq->jr.raw_row + ((size_t)il * b->sq->jr.cap + (b->sq->n_tokens - b->sq->jr.n0)) * hd,
                           b->kvbuf, T * hd * sizeof(float), cudaMemcpyDeviceToDevice, b->st));
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
    const cu_journal *j = &b->sq->jr;
    int64_t cap = b->raw_cap;
    ring_fix f;
    memset(&f, 0, sizeof(f));
    for (uint32_t p = n; p < cur && p < n + (uint32_t)cap; p++) {
        uint32_t slot = p % b->raw_cap;
        int64_t q = (int64_t)n - 1 - ((((int64_t)n - 1 - slot) % cap) + cap) % cap;
        f.slot[f.n] = slot;
        f.own[f.n] = q >= (int64_t)j->n0;
        f.row[f.n] = f.own[f.n] ? (uint32_t)(q - j->n0)
                                : (uint32_t)((((int64_t)slot - (int64_t)(j->n0 % cap)) % cap + cap) % cap);
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
    uint32_t ratio = b->sq->L[il].ratio;
    size_t cw = (size_t)ds4_compress_coff(ratio) * c->head_dim, iw = 2 * (size_t)c->idx_head_dim;
    float *bufs[4] = {b->ckv, b->cgate, b->ikv, b->igate};
    size_t widths[4] = {cw, cw, ratio == 4 ? iw : 0, ratio == 4 ? iw : 0};
    float *f = b->sq->jr.proj + proj_off(c, il, b->sq->jr.cap);
    for (int i = 0; i < 4; i++) {
        if (widths[i] == 0) continue;
        float *jr = f + (size_t)r0 * widths[i];
        CU_TRY(cudaMemcpyAsync(save ? jr : bufs[i], save ? bufs[i] : jr, T * widths[i] * sizeof(float),
                               cudaMemcpyDeviceToDevice, b->st));
        f += (size_t)b->sq->jr.cap * widths[i];
    }
    return 0;
}

int cu_journal_proj(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    if (!b->sq->jr.on || b->sq->L[il].ratio == 0) return 0;
    return copy_proj(b, il, b->sq->n_tokens - b->sq->jr.n0, T, true, err); /* the pass's rows start at n_tokens */
}

/* The mark: the frontiers (the decode windows folded into them first) and
 * the logits. */
int cu_seq_mark(ds4_backend *base, ds4_seq *s, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    const ds4_config *c = b->cfg;
    cu_seq *q = (cu_seq *)s;
    cu_journal *j = &q->jr;
    if (!s || s->owner != base) return ds4_err_set(err, DS4_EINVAL, "mark: the sequence is not this backend's");
    if (cu_stage(b)) return ds4_err_set(err, DS4_EUNSUPPORTED, "a pipeline stage does not journal rows for a rewind");
    if (cu_use(b, q, err) || (!j->raw && journal_alloc(b, err))) return -1;
    if (cu_comp_flush(b, err)) return ds4_err_prefix(err, "folding the decode steps' compressor windows");
    j->valid = false;
    j->n0 = b->sq->n_tokens;
    j->T = 0;
    if (copy_fronts(b, true, err)) return -1;
    j->had_logits = b->sq->has_logits;
    if (b->sq->has_logits) {
        const float *l = cu_seq_logits(b, q);
        if (!l) return ds4_err_set(err, DS4_EIO, "CUDA: reading the logits failed");
        memcpy(j->logits + (size_t)j->cap * c->n_vocab, l, c->n_vocab * sizeof(float));
    }
    CU_TRY(cudaStreamSynchronize(b->st));
    j->valid = true;
    return 0;
}

/* The parts of a step (runs of rows of one sequence), its rows checked:
 * a sequence's rows adjacent, all rewindable or none, within its context
 * and its journal. */
static int step_parts(cuda_backend *b, const ds4_row *rows, uint32_t n, cu_part *parts, uint32_t *n_parts,
                      ds4_err *err) {
    const ds4_config *c = b->cfg;
    if (n > b->chunk) return ds4_err_set(err, DS4_ERANGE, "a step of %u rows exceeds the %u a pass holds", n, b->chunk);
    uint32_t np = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!rows[i].seq || rows[i].seq->owner != &b->base)
            return ds4_err_set(err, DS4_EINVAL, "row %u: the sequence is not this backend's", i);
        if (cu_mtp_seq(b, rows[i].seq))
            return ds4_err_set(err, DS4_EINVAL, "row %u: the MTP block's sequence in a step of the main model", i);
        if (rows[i].token >= c->n_vocab)
            return ds4_err_set(err, DS4_EINVAL, "token %u at row %u is outside the vocabulary (%u)", rows[i].token, i,
                               c->n_vocab);
        cu_seq *s = (cu_seq *)rows[i].seq;
        if (i > 0 && rows[i - 1].seq == rows[i].seq) {
            if ((rows[i].want & DS4_ROW_REWIND) != (rows[i - 1].want & DS4_ROW_REWIND))
                return ds4_err_set(err, DS4_EINVAL, "row %u: the rows of a sequence are all rewindable or none is", i);
            parts[np - 1].n++;
            continue;
        }
        for (uint32_t k = 0; k < np; k++)
            if (parts[k].s == s)
                return ds4_err_set(err, DS4_EINVAL, "row %u: the rows of a sequence must be adjacent", i);
        if ((rows[i].want & DS4_ROW_REWIND) && !s->jr.valid)
            return ds4_err_set(err, DS4_EINVAL, "row %u: a rewindable row of a sequence without a mark", i);
        parts[np].s = s;
        parts[np].r0 = i;
        parts[np].n = 1;
        parts[np].pos0 = s->n_tokens;
        np++;
    }
    for (uint32_t k = 0; k < np; k++) {
        const cu_part *p = &parts[k];
        if ((rows[p->r0].want & DS4_ROW_REWIND) && p->pos0 + p->n - p->s->jr.n0 > DS4_REWIND_MAX)
            return ds4_err_set(err, DS4_ERANGE, "row %u: %u rewindable rows after the mark exceed %d", p->r0,
                               p->pos0 + p->n - p->s->jr.n0, DS4_REWIND_MAX);
        if ((uint64_t)p->pos0 + p->n > p->s->ctx)
            return ds4_err_set(err, DS4_ERANGE, "row %u: %u tokens after %u do not fit the context of %u", p->r0, p->n,
                               p->pos0, p->s->ctx);
    }
    *n_parts = np;
    return 0;
}

/* Before the pass: each part's sequence with its decode windows folded
 * (the pass extends the canonical frontiers), its mark dropped by plain
 * rows or its ring slots journaled for rewindable ones. */
static int parts_prepare(cuda_backend *b, const ds4_row *rows, const cu_part *parts, uint32_t np, ds4_err *err) {
    for (uint32_t k = 0; k < np; k++) {
        const cu_part *p = &parts[k];
        if (cu_use(b, p->s, err)) return -1;
        if (cu_comp_flush(b, err)) return ds4_err_prefix(err, "folding the decode steps' compressor windows");
        if (!(rows[p->r0].want & DS4_ROW_REWIND)) {
            p->s->jr.valid = false; /* drops the mark */
            continue;
        }
        if (save_slots(b, p->pos0, p->pos0 + p->n, err)) return -1;
    }
    return 0;
}

/* After the pass: each part's sequence advanced (tokens, position, fold,
 * journal), with its logits - those of its last row (host, in the rows
 * `need` marks; NULL: on the device, d_last_logits), every row's into the
 * journal for rewindable rows; none in a pipeline stage before the head.
 * The main sequence's next greedy token is set from them when the pass
 * had several parts (a one-part pass sets it itself: cu_step_end).
 * advanced: the pass (a captured one) advanced the positions on the
 * device. */
static int parts_finish(cuda_backend *b, const ds4_row *rows, const cu_part *parts, uint32_t np, const bool *need,
                        const float *host, bool advanced, ds4_err *err) {
    const ds4_config *c = b->cfg;
    size_t V = c->n_vocab;
    uint32_t h = 0; /* host rows before the part's */
    for (uint32_t k = 0; k < np; k++) {
        const cu_part *p = &parts[k];
        cu_seq *s = p->s;
        b->sq = s;
        bool rewindable = rows[p->r0].want & DS4_ROW_REWIND;
        for (uint32_t i = 0; i < p->n; i++) s->tokens[p->pos0 + i] = rows[p->r0 + i].token;
        if (rewindable) /* every row's logits were made (need) */
            memcpy(s->jr.logits + (size_t)(p->pos0 - s->jr.n0) * V, host + (size_t)h * V,
                   (size_t)p->n * V * sizeof(float));
        s->n_tokens = s->fold = p->pos0 + p->n; /* the pass left every position in the frontiers */
        if (rewindable) s->jr.T = s->n_tokens - s->jr.n0;
        s->has_logits = cu_head(b);
        if (!s->has_logits) {
            if (cu_set_step(b, np == 1 ? STEP_FOLD : STEP_POS | STEP_FOLD, s->n_tokens, 0, err)) return -1;
            continue;
        }
        if (!need) {
            s->logits_fresh = false;
            b->lg_owner = s;
        } else {
            for (uint32_t i = 0; i < p->n; i++) h += need[p->r0 + i];
            memcpy(s->logits_h, host + (size_t)(h - 1) * V, V * sizeof(float));
            s->logits_fresh = true;
        }
        if (np == 1) {
            if (cu_set_step(b, STEP_FOLD, s->n_tokens, 0, err)) return -1;
            continue;
        }
        if (!advanced && cu_set_step(b, STEP_POS | STEP_FOLD, s->n_tokens, 0, err)) return -1;
        if (s == &b->main_seq) { /* its next greedy token (cuda_greedy's graphs embed it) */
            CU_TRY(cudaMemcpyAsync(b->d_logits, s->logits_h, V * sizeof(float), cudaMemcpyHostToDevice, b->st));
            b->d_last_logits = b->d_logits;
            if (cu_step_end(b, 0, false, err)) return -1;
        }
    }
    return 0;
}

static void step_graph_free(cu_step_graph *g) {
    if (g->x) cudaGraphExecDestroy(g->x);
    free(g->seq);
    free(g->rows);
    memset(g, 0, sizeof(*g));
}

void cu_step_graphs_drop(cuda_backend *b, const cu_seq *s) {
    for (uint32_t i = 0; i < CU_STEP_GRAPHS; i++) {
        cu_step_graph *g = &b->steps[i];
        bool held = !s;
        for (uint32_t k = 0; k < g->n && !held; k++) held = g->seq[k] == s;
        if (held) step_graph_free(g);
    }
}

/* Whether a step is one a captured graph can run, sized for any position
 * of its sequences: a batched decode step (one plain row of each of
 * several sequences), or a verification (rewindable rows of one sequence,
 * the first at its mark: the journal's rows then start at 0 in every
 * replay), whose logits fit d_logits. */
static bool graph_step(const cuda_backend *b, const ds4_row *rows, uint32_t n, const cu_part *parts, uint32_t np) {
    /* host experts (cuda_offload.h) and the activation observer run host
     * code within a pass, a pipeline stage's residuals come and go around
     * it: eager passes only */
    if (n > b->logits_rows || ds4_prof_on || b->off || b->base.opts.act_observer || cu_stage(b)) return false;
    for (uint32_t i = 0; i < n; i++)
        if (rows[i].want & DS4_ROW_HIDDEN) return false;
    if (np == 1) return n >= 2 && (rows[0].want & DS4_ROW_REWIND) && parts[0].pos0 == parts[0].s->jr.n0;
    for (uint32_t k = 0; k < np; k++)
        if (parts[k].n != 1 || (rows[k].want & DS4_ROW_REWIND)) return false;
    return true;
}

/* The graph of these parts, captured unless one held is theirs (the least
 * recently run slot takes a new one): each part's work sized for the
 * longest context among them (cu_dec_cap), read from their dsteps. */
static int graph_for(cuda_backend *b, const cu_part *parts, uint32_t np, uint32_t n, cu_step_graph **out,
                     ds4_err *err) {
    const ds4_seq *q = &parts[0].s->base; /* the pass's steering scales (step_groups) */
    cu_step_graph *g = NULL, *lru = &b->steps[0];
    for (uint32_t i = 0; i < CU_STEP_GRAPHS && !g; i++) {
        cu_step_graph *h = &b->steps[i];
        bool same = h->x && h->n == np && h->steer[0] == q->steer_ffn && h->steer[1] == q->steer_attn;
        for (uint32_t k = 0; same && k < np; k++) same = h->seq[k] == parts[k].s && h->rows[k] == parts[k].n;
        if (same) g = h;
        else if (lru->x && (!h->x || h->used < lru->used)) lru = h;
    }
    if (!g) {
        g = lru;
        step_graph_free(g);
        g->seq = (cu_seq **)malloc(np * sizeof(cu_seq *));
        g->rows = (uint32_t *)malloc(np * sizeof(uint32_t));
        if (!g->seq || !g->rows) {
            step_graph_free(g);
            return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        }
        uint32_t ctx = 0;
        for (uint32_t k = 0; k < np; k++) {
            g->seq[k] = parts[k].s;
            g->rows[k] = parts[k].n;
            if (parts[k].s->ctx > ctx) ctx = parts[k].s->ctx;
        }
        cudaGraph_t cg;
        b->dec_ctx = ctx;
        CU_TRY(cudaStreamBeginCapture(b->st, CU_CAPTURE_MODE));
        b->capturing = true;
        int rc = cu_forward_parts(b, b->d_tokens, parts, np, n, false, NULL, NULL, err);
        b->capturing = false;
        b->dec_ctx = b->ctx;
        cudaError_t e = cudaStreamEndCapture(b->st, &cg);
        if (rc) {
            step_graph_free(g);
            return np > 1 ? ds4_err_prefix(err, "capturing the batched decode step of %u sequences", np)
                          : ds4_err_prefix(err, "capturing the verification of %u rows", n);
        }
        if (e == cudaSuccess) {
            e = cudaGraphInstantiate(&g->x, cg, 0);
            cudaGraphDestroy(cg);
        }
        if (e != cudaSuccess) {
            step_graph_free(g);
            CU_TRY(e);
        }
        g->n = np;
        g->steer[0] = q->steer_ffn;
        g->steer[1] = q->steer_attn;
    }
    g->used = ++b->steps_clock;
    *out = g;
    return 0;
}

/* A step through its graph: every row's logits to host. */
static int graph_run(cuda_backend *b, const cu_part *parts, uint32_t np, uint32_t n, float *host, ds4_err *err) {
    cu_step_graph *g = NULL;
    if (graph_for(b, parts, np, n, &g, err)) return -1;
    CU_TRY(cudaGraphLaunch(g->x, b->st));
    CU_TRY(cudaMemcpyAsync(host, b->d_logits, (size_t)n * b->cfg->n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                           b->st));
    CU_TRY(cudaStreamSynchronize(b->st));
    b->d_last_logits = b->d_logits + (size_t)(n - 1) * b->cfg->n_vocab;
    return 0;
}

/* One pass over the rows (or the batched decode graph, graph_step).  A
 * pipeline stage's: its rows' entering residuals `in` into S first (a
 * stage after the first), its rows' residuals out of S into `resid` after
 * (a stage before the head, which makes no logits). */
static int run_pass(cuda_backend *b, const ds4_row *rows, uint32_t n, const ds4_step_out *out, const float *in,
                    float *resid, ds4_err *err) {
    const ds4_config *c = b->cfg;
    size_t V = c->n_vocab, hcd = (size_t)c->n_hc * c->n_embd;
    bool head = cu_head(b);
    if (n == 0) return 0;
    cu_part *parts = (cu_part *)malloc(n * sizeof(cu_part));
    bool *need = (bool *)calloc(n, sizeof(bool));
    uint32_t *ids = (uint32_t *)malloc(n * sizeof(uint32_t));
    float *host = NULL;
    uint32_t np = 0;
    int rc = -1;
    bool graph = false;
    if (!parts || !need || !ids) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for a step of %u rows", n);
        goto out;
    }
    if (step_parts(b, rows, n, parts, &np, err)) goto out;
    {
        /* the logits made: the rows that ask, every row of a rewindable
         * part, each part's last row; none (the last row's, left on the
         * device) for one plain part that asks for none; none at all in a
         * stage before the head */
        bool any = np > 1 && head;
        uint32_t nh = 0;
        for (uint32_t k = 0; k < np; k++) {
            const cu_part *p = &parts[k];
            bool rw = rows[p->r0].want & DS4_ROW_REWIND;
            any = any || rw;
            for (uint32_t i = p->r0; i < p->r0 + p->n && head; i++) {
                need[i] = rw || i + 1 == p->r0 + p->n || ((rows[i].want & DS4_ROW_LOGITS) && out && out->logits);
                any = any || ((rows[i].want & DS4_ROW_LOGITS) && out && out->logits);
                nh += need[i];
            }
        }
        if (any && !(host = (float *)malloc((size_t)nh * V * sizeof(float)))) {
            ds4_err_set(err, DS4_ENOMEM, "out of memory for %u rows of logits", nh);
            goto out;
        }
    }
    if (parts_prepare(b, rows, parts, np, err)) goto out;
    for (uint32_t i = 0; i < n; i++) ids[i] = rows[i].token;
    if (cudaMemcpyAsync(b->d_tokens, ids, n * sizeof(uint32_t), cudaMemcpyHostToDevice, b->st) != cudaSuccess ||
        (in && cudaMemcpyAsync(b->S, in, n * hcd * sizeof(float), cudaMemcpyDefault, b->st) != cudaSuccess)) {
        ds4_err_set(err, DS4_EIO, "CUDA: copying the step's tokens%s failed", in ? " and residuals" : "");
        goto out;
    }
    graph = graph_step(b, rows, n, parts, np);
    for (uint32_t k = 0; k < np; k++) parts[k].s->jr.on = rows[parts[k].r0].want & DS4_ROW_REWIND;
    rc = graph ? graph_run(b, parts, np, n, host, err)
               : cu_forward_parts(b, b->d_tokens, parts, np, n, false, host ? need : NULL, host, err);
    for (uint32_t k = 0; k < np; k++) parts[k].s->jr.on = false;
    if (rc) {
        ds4_err_prefix(err, "step of %u rows of %u sequence%s", n, np, np == 1 ? "" : "s");
        goto out;
    }
    rc = -1;
    if (!head && cudaMemcpyAsync(resid, b->S, n * hcd * sizeof(float), cudaMemcpyDefault, b->st) != cudaSuccess) {
        ds4_err_set(err, DS4_EIO, "CUDA: reading the step's residuals failed");
        goto out;
    }
    {
        uint32_t nh = 0;
        for (uint32_t i = 0; i < n && head; i++)
            if ((rows[i].want & DS4_ROW_HIDDEN) && out && out->hidden &&
                cudaMemcpyAsync(out->hidden + hcd * nh++, b->S + hcd * i, hcd * sizeof(float), cudaMemcpyDeviceToHost,
                                b->st) != cudaSuccess) {
                ds4_err_set(err, DS4_EIO, "CUDA: reading the hidden state of row %u failed", i);
                goto out;
            }
    }
    if (parts_finish(b, rows, parts, np, host ? need : NULL, host, graph, err)) goto out;
    if (cudaStreamSynchronize(b->st) != cudaSuccess) {
        ds4_err_set(err, DS4_EIO, "CUDA: the step failed: %s", cudaGetErrorString(cudaGetLastError()));
        goto out;
    }
    for (uint32_t i = 0, k = 0, hrow = 0; i < n; i++) {
        if ((rows[i].want & DS4_ROW_LOGITS) && out && out->logits)
            memcpy(out->logits + (size_t)k++ * V, host + (size_t)hrow * V, V * sizeof(float));
        hrow += need[i];
    }
    rc = 0;
out:
    if (rc) /* the sequences are undefined: the caller resets them */
        for (uint32_t k = 0; k < np; k++) parts[k].s->jr.valid = false;
    free(parts);
    free(need);
    free(ids);
    free(host);
    return rc;
}

/* A step runs as passes over groups of its parts: a pass takes parts of one
 * steering scale (a kernel argument of the pass's steering launch), and
 * the plain one-row parts (decoding sequences), two or more beside other
 * parts (prefill chunks, drafts), go through the batched decode graph in
 * a pass of their own - the graph saves the host the decoders' per-part
 * launches, which cost more than reading their experts' weights a second
 * time.  group[k]: part k's pass, in the order they run; returns how many.
 * key, kind: room for np groups' first sequence and kind. */
static uint32_t step_groups(const cuda_backend *b, const ds4_row *rows, const cu_part *parts, uint32_t np,
                            uint32_t *group, const ds4_seq **key, bool *kind) {
    uint32_t nd = 0;
    for (uint32_t k = 0; k < np; k++)
        nd += parts[k].n == 1 && !(rows[parts[k].r0].want & (DS4_ROW_REWIND | DS4_ROW_HIDDEN));
    bool split = nd >= 2 && nd < np && nd <= b->logits_rows && !ds4_prof_on;
    uint32_t ng = 0;
    for (uint32_t k = 0; k < np; k++) {
        const ds4_seq *q = &parts[k].s->base;
        bool dec = split && parts[k].n == 1 && !(rows[parts[k].r0].want & (DS4_ROW_REWIND | DS4_ROW_HIDDEN));
        uint32_t g = 0;
        for (; g < ng; g++)
            if (kind[g] == dec &&
                (!b->d_steer || (key[g]->steer_ffn == q->steer_ffn && key[g]->steer_attn == q->steer_attn)))
                break;
        if (g == ng) {
            key[ng] = q;
            kind[ng++] = dec;
        }
        group[k] = g;
    }
    return ng;
}

int cu_seq_stage_pass(ds4_backend *base, const ds4_row *rows, uint32_t n, const float *in, float *resid,
                      const ds4_step_out *out, ds4_err *err) {
    return run_pass((cuda_backend *)base, rows, n, out, in, resid, err);
}

int cu_seq_step(ds4_backend *base, const ds4_row *rows, uint32_t n, const ds4_step_out *out, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    if (n == 0) return 0;
    const ds4_config *c = b->cfg;
    size_t V = c->n_vocab, H = (size_t)c->n_hc * c->n_embd;
    cu_part *parts = (cu_part *)malloc(n * sizeof(cu_part));
    uint32_t *group = (uint32_t *)malloc(n * sizeof(uint32_t)), *set = (uint32_t *)malloc(n * sizeof(uint32_t));
    ds4_row *sub = (ds4_row *)malloc(n * sizeof(ds4_row));
    const ds4_seq **key = (const ds4_seq **)malloc(n * sizeof(ds4_seq *));
    bool *kind = (bool *)malloc(n * sizeof(bool));
    float *lg = NULL, *hd = NULL;
    uint32_t np = 0, ng = 0;
    int rc = -1;
    if (!parts || !group || !set || !sub || !key || !kind) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for a step of %u rows", n);
        goto done;
    }
    if (step_parts(b, rows, n, parts, &np, err)) goto done;
    if ((ng = step_groups(b, rows, parts, np, group, key, kind)) == 1) {
        rc = run_pass(b, rows, n, out, NULL, NULL, err);
        goto done;
    }
    /* each group's rows in order, its outputs into scratch after the
     * earlier groups', then to out in the step's row order */
    if ((out && out->logits && !(lg = (float *)malloc((size_t)n * V * sizeof(float)))) ||
        (out && out->hidden && !(hd = (float *)malloc((size_t)n * H * sizeof(float))))) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory for a step of %u rows", n);
        goto done;
    }
    for (uint32_t k = 0; k < np; k++)
        for (uint32_t i = 0; i < parts[k].n; i++) set[parts[k].r0 + i] = group[k];
    {
        uint32_t *l0 = (uint32_t *)calloc(2 * (size_t)ng, sizeof(uint32_t)), *h0 = l0 ? l0 + ng : NULL;
        if (!l0) {
            ds4_err_set(err, DS4_ENOMEM, "out of memory");
            goto done;
        }
        uint32_t nl = 0, nh = 0;
        for (uint32_t g = 0; g < ng; g++) {
            uint32_t m = 0;
            for (uint32_t i = 0; i < n; i++)
                if (set[i] == g) sub[m++] = rows[i];
            l0[g] = nl;
            h0[g] = nh;
            ds4_step_out o = {lg ? lg + (size_t)nl * V : NULL, hd ? hd + (size_t)nh * H : NULL};
            if (run_pass(b, sub, m, &o, NULL, NULL, err)) {
                free(l0);
                goto done;
            }
            for (uint32_t i = 0; i < m; i++) {
                nl += (sub[i].want & DS4_ROW_LOGITS) != 0;
                nh += (sub[i].want & DS4_ROW_HIDDEN) != 0;
            }
        }
        for (uint32_t i = 0, kl = 0, kh = 0; i < n; i++) {
            if (lg && (rows[i].want & DS4_ROW_LOGITS))
                memcpy(out->logits + (size_t)kl++ * V, lg + (size_t)l0[set[i]]++ * V, V * sizeof(float));
            if (hd && (rows[i].want & DS4_ROW_HIDDEN))
                memcpy(out->hidden + (size_t)kh++ * H, hd + (size_t)h0[set[i]]++ * H, H * sizeof(float));
        }
        free(l0);
    }
    rc = 0;
done:
    free(parts);
    free(group);
    free(set);
    free(sub);
    free(key);
    free(kind);
    free(lg);
    free(hd);
    return rc;
}

int cu_seq_rewind(ds4_backend *base, ds4_seq *s, uint32_t n, ds4_err *err) {
    cuda_backend *b = (cuda_backend *)base;
    const ds4_config *c = b->cfg;
    if (!s || s->owner != base) return ds4_err_set(err, DS4_EINVAL, "rewind: the sequence is not this backend's");
    cu_seq *q = (cu_seq *)s;
    cu_journal *j = &q->jr;
    uint32_t cur = q->n_tokens;
    if (cu_use(b, q, err)) return -1;
    if (n == cur) return 0;
    if (n > cur) return ds4_err_set(err, DS4_EINVAL, "rewind to %u tokens: the sequence has %u", n, cur);
    if (!j->valid || n < j->n0)
        return ds4_err_set(err, DS4_EINVAL,
                           "rewind to %u tokens: only rows appended since the sequence's mark (at %u) "
                           "can be taken back",
                           n, j->valid ? j->n0 : cur);
    uint32_t keep = n - j->n0;
    if (cu_set_step(b, STEP_POS | STEP_FOLD, j->n0, 0, err) || fix_ring(b, n, cur, err) ||
        copy_fronts(b, false, err))
        return -1;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        if (b->sq->L[il].ratio == 0 || keep == 0) continue;
        if (copy_proj(b, il, 0, keep, false, err) || cu_compress(b, il, keep, j->n0, false, b->st, NULL, err))
            return ds4_err_prefix(err, "rewind: replaying layer %u", il);
    }
    b->sq->n_tokens = b->sq->fold = n;
    j->T = keep;
    if (cu_set_step(b, STEP_POS | STEP_FOLD, n, 0, err)) return -1;
    /* the logits after token n - 1 (before the step when none is kept) */
    b->sq->has_logits = keep ? true : j->had_logits;
    if (b->sq->has_logits) {
        const float *l = j->logits + (size_t)(keep ? keep - 1 : j->cap) * c->n_vocab;
        CU_TRY(cudaMemcpyAsync(b->d_logits, l, c->n_vocab * sizeof(float), cudaMemcpyHostToDevice, b->st));
        memcpy(b->sq->logits_h, l, c->n_vocab * sizeof(float));
        b->d_last_logits = b->d_logits;
        b->sq->logits_fresh = true;
        if (cu_step_end(b, 0, false, err)) return -1; /* the next greedy token */
    }
    CU_TRY(cudaStreamSynchronize(b->st));
    return 0;
}
