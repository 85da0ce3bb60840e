/*
 * cpu_rewind.c - taking back the last rows of a sequence exactly (the
 * rejected drafts of MTP verification; see ds4_backend_rewind).
 *
 * A mark starts a journal; the rewindable passes after it append rows in
 * order, and what they destroy of the state at the mark is small and
 * known in advance:
 *   - each row overwrites the raw ring slot of the position raw_cap before
 *     it, which a shorter sequence still sees (and when the ring is
 *     shorter than the rows since the mark, a slot may be written twice);
 *   - the compressor frontiers change with every row, and a row that
 *     closes a window pools, clears and (ratio 4) shifts them.
 * So the mark saves the frontiers, and each rewindable row journals the
 * ring slot as it was before the row, the row's own ring row, its
 * compressor inputs (its projections) and its logits.  Rewinding to n
 * gives each slot a rejected row wrote the row of the latest kept position
 * of that slot (journaled, or, when it is older than the mark, the slot as
 * the mark left it), restores the frontiers, and replays the compressor
 * steps of the kept rows from their journaled inputs - the same code on
 * the same values as the pass, so the state is bit for bit the one a
 * sequence that never saw the rejected rows has.  Compressed and indexer
 * rows written by rejected rows lie beyond the live ones (floor(n/ratio)):
 * nothing reads them, and the next rows overwrite them.
 */
#include <stdlib.h>
#include <string.h>

#include "model/cpu/cpu.h"

/* Floats of layer il's frontiers (attention compressor, and indexer). */
static size_t front_floats(const ds4_config *c, uint32_t il) {
    uint32_t r = ds4_layer_ratio(c, il);
    if (r == 0) return 0;
    size_t n = 2 * (size_t)ds4_state_frontier_rows(r) * ds4_state_frontier_width(c, r, false);
    if (r == 4) n += 2 * (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
    return n;
}

/* Floats of one row's compressor inputs at layer il: ckv, cgate, ikv, igate. */
static size_t proj_floats(const ds4_config *c, uint32_t il) {
    uint32_t r = ds4_layer_ratio(c, il);
    if (r == 0) return 0;
    size_t n = 2 * (size_t)ds4_compress_coff(r) * c->head_dim;
    if (r == 4) n += 4 * (size_t)c->idx_head_dim;
    return n;
}

static size_t front_off(const ds4_config *c, uint32_t il) {
    size_t off = 0;
    for (uint32_t i = 0; i < il; i++) off += front_floats(c, i);
    return off;
}

static size_t proj_off(const ds4_config *c, uint32_t il) {
    size_t off = 0;
    for (uint32_t i = 0; i < il; i++) off += proj_floats(c, i);
    return off;
}

void cpu_journal_free(cpu_journal *j) {
    free(j->raw);
    free(j->raw_row);
    free(j->front);
    free(j->proj);
    free(j->logits);
    memset(j, 0, sizeof(*j));
}

/* The bytes journal_alloc takes (a sequence's first rewindable step). */
uint64_t cpu_journal_bytes(const ds4_config *c) {
    uint64_t cap = DS4_REWIND_MAX;
    uint64_t floats = 2 * cap * c->n_layer * c->head_dim + front_off(c, c->n_layer) + 1 +
                      cap * proj_off(c, c->n_layer) + 1 + (cap + 1) * c->n_vocab;
    return floats * sizeof(float);
}

static int journal_alloc(const ds4_config *c, cpu_journal *j, ds4_err *err) {
    size_t cap = DS4_REWIND_MAX;
    j->cap = DS4_REWIND_MAX;
    j->cfg = c;
    j->raw = malloc(cap * c->n_layer * c->head_dim * sizeof(float));
    j->raw_row = malloc(cap * c->n_layer * c->head_dim * sizeof(float));
    j->front = malloc((front_off(c, c->n_layer) + 1) * sizeof(float));
    j->proj = malloc((cap * proj_off(c, c->n_layer) + 1) * sizeof(float));
    j->logits = malloc((cap + 1) * c->n_vocab * sizeof(float));
    if (!j->raw || !j->raw_row || !j->front || !j->proj || !j->logits) {
        cpu_journal_free(j);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory for the journal of a rewindable step");
    }
    return 0;
}

/* Copy layer il's frontiers to (save) or from (!save) the journal. */
static void copy_fronts(const ds4_config *c, ds4_layer_state *L, float *f, uint32_t il, bool save) {
    if (L->ratio == 0) return;
    size_t cn = (size_t)ds4_state_frontier_rows(L->ratio) * ds4_state_frontier_width(c, L->ratio, false);
    size_t in = L->ratio == 4 ? (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true) : 0;
    float *parts[4] = {L->comp_kv, L->comp_score, L->idx_kv, L->idx_score};
    size_t sizes[4] = {cn, cn, in, in};
    f += front_off(c, il);
    for (int i = 0; i < 4; i++) {
        if (sizes[i] == 0) continue;
        if (save) memcpy(f, parts[i], sizes[i] * sizeof(float));
        else memcpy(parts[i], f, sizes[i] * sizeof(float));
        f += sizes[i];
    }
}

int cpu_journal_begin(cpu_backend *b, cpu_seq *s, ds4_err *err) {
    const ds4_config *c = s->st->cfg;
    cpu_journal *j = &s->j;
    if (!j->raw && journal_alloc(c, j, err) != 0) return -1;
    j->n0 = s->st->n_tokens;
    j->T = 0;
    for (uint32_t il = 0; il < c->n_layer; il++) copy_fronts(c, &s->st->layers[il], j->front, il, true);
    memcpy(j->logits + (size_t)j->cap * c->n_vocab, s->st->logits, c->n_vocab * sizeof(float));
    j->had_logits = s->st->has_logits;
    j->valid = true;
    return 0;
}

void cpu_journal_raw(cpu_backend *b, cpu_journal *j, uint32_t jl, uint32_t p, const float *slot, bool mine) {
    const ds4_config *c = j->cfg;
    uint32_t k = p - j->n0;
    memcpy((mine ? j->raw_row : j->raw) + ((size_t)jl * j->cap + k) * c->head_dim, slot, c->head_dim * sizeof(float));
    if (k + 1 > j->T) j->T = k + 1;
}

/* What ring slot `slot` of layer il holds once the sequence is back to n
 * tokens: the row of the latest position < n that maps to it, journaled
 * when it is at least the mark's, else the slot as the mark left it (the
 * content before the first row since the mark that wrote it). */
static const float *ring_row_at(const cpu_journal *j, const ds4_kv_state *st, uint32_t il, uint32_t slot, uint32_t n) {
    size_t hd = j->cfg->head_dim, cap = st->raw_cap;
    int64_t q = (int64_t)n - 1 - (int64_t)(((int64_t)n - 1 - slot) % (int64_t)cap + cap) % (int64_t)cap;
    if (q >= (int64_t)j->n0) return j->raw_row + ((size_t)il * j->cap + (size_t)(q - j->n0)) * hd;
    uint32_t first = j->n0 + (uint32_t)(((int64_t)slot - (int64_t)(j->n0 % cap) + (int64_t)cap) % (int64_t)cap);
    return j->raw + ((size_t)il * j->cap + (first - j->n0)) * hd;
}

void cpu_journal_proj(cpu_backend *b, cpu_journal *j, uint32_t jl, uint32_t p, const float *ckv, const float *cgate,
                      const float *ikv, const float *igate) {
    const ds4_config *c = j->cfg;
    uint32_t r = ds4_layer_ratio(c, jl);
    if (r == 0) return;
    size_t cw = (size_t)ds4_compress_coff(r) * c->head_dim, iw = 2 * (size_t)c->idx_head_dim;
    float *f = j->proj + (size_t)(p - j->n0) * proj_off(c, c->n_layer) + proj_off(c, jl);
    memcpy(f, ckv, cw * sizeof(float));
    memcpy(f + cw, cgate, cw * sizeof(float));
    if (r != 4) return;
    memcpy(f + 2 * cw, ikv, iw * sizeof(float));
    memcpy(f + 2 * cw + iw, igate, iw * sizeof(float));
}

float *cpu_journal_logits_row(cpu_backend *b, cpu_seq *s, uint32_t p) {
    return s->j.logits + (size_t)(p - s->j.n0) * s->j.cfg->n_vocab;
}

void cpu_journal_logits(cpu_backend *b, cpu_seq *s, uint32_t p, const float *logits) {
    float *row = cpu_journal_logits_row(b, s, p);
    if (logits != row) memcpy(row, logits, s->j.cfg->n_vocab * sizeof(float));
}

int cpu_rewind(ds4_backend *base, ds4_seq *seq, uint32_t n, ds4_err *err) {
    cpu_backend *b = (cpu_backend *)base;
    cpu_seq *s = cpu_seq_of(seq);
    ds4_kv_state *st = s->st;
    const ds4_config *c = st->cfg;
    cpu_journal *j = &s->j;
    uint32_t cur = st->n_tokens;
    if (n == cur) return 0;
    if (n > cur) return ds4_err_set(err, DS4_EINVAL, "rewind to %u tokens: the sequence has %u", n, cur);
    if (!j->valid || n < j->n0)
        return ds4_err_set(err, DS4_EINVAL,
                           "rewind to %u tokens: only rows appended since the sequence's mark (at %u) "
                           "can be taken back",
                           n, j->valid ? j->n0 : cur);
    size_t pstride = proj_off(c, c->n_layer);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        ds4_layer_state *L = &st->layers[il];
        for (uint32_t p = n; p < cur; p++) {
            uint32_t slot = p % st->raw_cap;
            memcpy(L->raw + (size_t)slot * c->head_dim, ring_row_at(j, st, il, slot, n), c->head_dim * sizeof(float));
        }
        if (L->ratio == 0) continue;
        copy_fronts(c, L, j->front, il, false);
        cpu_layer cl = cpu_main_layer(b, il);
        size_t cw = (size_t)ds4_compress_coff(L->ratio) * c->head_dim, iw = 2 * (size_t)c->idx_head_dim;
        for (uint32_t p = j->n0; p < n; p++) {
            const float *f = j->proj + (size_t)(p - j->n0) * pstride + proj_off(c, il);
            cpu_compress_row(b, &cl, st, f, f + cw, f + 2 * cw, f + 2 * cw + iw, p);
        }
    }
    st->n_tokens = n;
    j->T = n - j->n0;
    if (n == j->n0) {
        memcpy(st->logits, j->logits + (size_t)j->cap * c->n_vocab, c->n_vocab * sizeof(float));
        st->has_logits = j->had_logits;
    } else {
        memcpy(st->logits, j->logits + (size_t)(n - 1 - j->n0) * c->n_vocab, c->n_vocab * sizeof(float));
        st->has_logits = true;
    }
    return 0;
}
