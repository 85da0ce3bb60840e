/*
 * cuda_tp.cu - tensor parallelism inside one CUDA backend (docs/
 * DISTRIBUTED.md 7): the share of each layer a backend of rank r of n
 * holds and computes (cu_tp, cuda_internal.h), and the sums that make
 * the ranks' partial sublayer outputs whole.
 *
 * The parts that split are those whose outputs add up: a query head's
 * attention reaches the residual only through its output group's
 * attn_output_a rows and then attn_output_b's columns of that group's
 * low-rank rows, a shared-expert row through its SwiGLU value and
 * down's column of it, a routed expert through its own product.  So rank
 * r holds the q_b rows and attention sinks of its heads, the attn_output_a
 * rows of its groups and attn_output_b's columns of them, the gate / up
 * rows and down columns of its shared-expert rows, and its routed experts;
 * its attention and FFN end with a partial output that an all-reduce over
 * the ranks sums (the results are one GPU's up to the order of those
 * sums).  Everything else - the HC mixes, norms, q_a, kv, the compressors
 * and indexer (the KV is one head: the same state on every rank), the
 * router and the output head - every rank computes whole, from the same
 * summed residuals, so every rank routes alike and holds the same KV.
 */
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_internal.h"

/* What a split tensor is divided by: the heads, the output groups, the
 * shared expert's rows. */
enum { TP_HEADS, TP_GROUPS, TP_FF };

/* The tensors that split, and how: by rows of the whole, or by values of
 * each row (`cols`); cu_tp_part gives the rows or values of a head (q_b:
 * head_dim rows; the sinks: one value), a group (o_lora_rank) or an FF
 * row (one). */
typedef struct tp_split {
    size_t field;
    int by;
    bool cols;
} tp_split;

static const tp_split tp_splits[] = {
    {offsetof(dlayer, q_b), TP_HEADS, false},    {offsetof(dlayer, sinks), TP_HEADS, true},
    {offsetof(dlayer, out_a), TP_GROUPS, false}, {offsetof(dlayer, out_b), TP_GROUPS, true},
    {offsetof(dlayer, gate_sh), TP_FF, false},   {offsetof(dlayer, up_sh), TP_FF, false},
    {offsetof(dlayer, down_sh), TP_FF, true},
};

bool cu_tp_part(const cu_tp *tp, const ds4_config *c, size_t field, uint32_t *row0, uint32_t *rows, uint32_t *col0,
                uint32_t *n) {
    if (tp->n < 2) return false;
    for (size_t i = 0; i < sizeof(tp_splits) / sizeof(tp_splits[0]); i++) {
        const tp_split *s = &tp_splits[i];
        if (s->field != field) continue;
        uint32_t first, count, unit; /* in heads / groups / rows, and the values or rows of one */
        if (s->by == TP_HEADS) first = tp->head0, count = tp->heads, unit = s->cols ? 1 : c->head_dim;
        else if (s->by == TP_GROUPS) first = tp->group0, count = tp->groups, unit = c->o_lora_rank;
        else first = tp->ff0, count = tp->ff, unit = 1;
        if (s->cols) *col0 = first * unit, *n = count * unit;
        else *row0 = first * unit, *rows = count * unit;
        return true;
    }
    return false;
}

/* What the ranks cannot share: the blocks of a quantized row cut at a
 * rank's first value (attn_output_b's columns of its groups, the shared
 * down's of its rows). */
static int check_blocks(const ds4_weights *w, const cu_tp *tp, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    for (uint32_t il = 0; il < c->n_layer; il++) {
        const ds4_layer_weights *l = &w->layers[il];
        uint32_t og = tp->groups * c->o_lora_rank;
        if (!cu_row_bytes(l->out_b.type, og))
            return ds4_err_set(err, DS4_EUNSUPPORTED,
                               "layer %u's attn_output_b rows would split into %u values a GPU of %u, not whole blocks "
                               "of its type %u",
                               il, og, tp->n, l->out_b.type);
        if (!cu_row_bytes(l->down_sh.type, tp->ff))
            return ds4_err_set(err, DS4_EUNSUPPORTED,
                               "layer %u's shared-expert down rows would split into %u values a GPU of %u, not whole "
                               "blocks of its type %u",
                               il, tp->ff, tp->n, l->down_sh.type);
    }
    return 0;
}

/* What a backend of a tensor-parallel group does not run. */
static const char *tp_refused(const ds4_backend_opts *o) {
    return o->mtp                                      ? "the MTP block (speculative decoding, --mtp)"
           : o->layer_first || o->layer_end            ? "as a pipeline stage (--layers, --gpus, mpirun)"
           : o->imatrix                                ? "an importance-matrix collection"
           : o->host_experts != DS4_HOST_AUTO          ? "routed experts in host RAM"
           : o->tp_rank >= o->tensor_parallel          ? "a rank outside the group"
           : !o->tp_clique                             ? "without the group's NCCL communicators"
                                                       : NULL;
}

/* Routed expert e of every layer on rank e % n, in slot e / n. */
static int own_experts(cu_tp *tp, const ds4_config *c, ds4_err *err) {
    size_t L = c->n_layer, E = c->n_expert;
    tp->slot = (int32_t *)malloc(L * E * sizeof(int32_t));
    tp->n_own = (uint32_t *)calloc(L, sizeof(uint32_t));
    if (!tp->slot || !tp->n_own) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (size_t il = 0; il < L; il++)
        for (uint32_t e = 0; e < E; e++) {
            bool own = e % tp->n == tp->rank;
            tp->slot[il * E + e] = own ? (int32_t)(e / tp->n) : -1;
            tp->n_own[il] += own;
        }
    if (cu_dev_alloc((void **)&tp->d_slot, L * E * sizeof(int32_t), "the routed experts' slots", err)) return -1;
    CU_TRY(cu_upload(tp->d_slot, tp->slot, L * E * sizeof(int32_t)));
    return 0;
}

int cu_tp_init(cuda_backend *b, const ds4_weights *w, ds4_err *err) {
    const ds4_config *c = &w->cfg;
    const ds4_backend_opts *o = &b->base.opts;
    cu_tp *tp = &b->tp;
    uint32_t n = o->tensor_parallel > 1 ? o->tensor_parallel : 1;
    *tp = cu_tp{0, 1, NULL, c->n_head, 0, c->o_groups, 0, c->n_ff_exp, 0, NULL, NULL, NULL};
    if (n == 1) return 0;
    const char *no = tp_refused(o);
    if (no) return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor parallelism does not run %s", no);
    const char *what = c->n_head % n ? "query heads" : c->o_groups % n ? "output groups" : NULL;
    uint32_t count = c->n_head % n ? c->n_head : c->o_groups;
    if (!what && (c->n_ff_exp % n || c->n_ff_exp / n % 4)) what = "shared-expert rows (4 or more a GPU, by 4)", count = c->n_ff_exp;
    if (what)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "the model's %u %s do not divide among %u GPUs", count, what, n);
    tp->rank = o->tp_rank;
    tp->n = n;
    tp->clique = o->tp_clique;
    tp->heads = c->n_head / n, tp->head0 = tp->rank * tp->heads;
    tp->groups = c->o_groups / n, tp->group0 = tp->rank * tp->groups;
    tp->ff = c->n_ff_exp / n, tp->ff0 = tp->rank * tp->ff;
    if (check_blocks(w, tp, err)) return -1;
    return own_experts(tp, c, err);
}

void cu_tp_free(cu_tp *tp) {
    if (tp->d_slot) cudaFree(tp->d_slot);
    free(tp->slot);
    free(tp->n_own);
    tp->d_slot = tp->slot = NULL;
    tp->n_own = NULL;
}

int cu_tp_reduce_attn(cuda_backend *b, uint32_t T, ds4_err *err) {
    if (b->tp.n < 2) return 0;
    return cu_nccl_allreduce(b->tp.clique, (int)b->tp.rank, b->y, (size_t)T * b->cfg->n_embd, b->st, err);
}

#define TP_SUM_THREADS 256

/* Row t of the rank's FFN output: its selected routed experts (slots
 * msel >= 0, in slot order) and its part of the shared expert. */
static __global__ void tp_ffn_sum_kernel(float *y, const float *eout, const float *sout, const int *msel, uint32_t k,
                                         uint32_t D) {
    dev_pdl_enter();
    uint32_t t = blockIdx.x;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) {
        float routed = 0.0f;
        for (uint32_t i = 0; i < k; i++)
            if (msel[(size_t)t * k + i] >= 0) routed += eout[((size_t)t * k + i) * D + d];
        y[(size_t)t * D + d] = routed + sout[(size_t)t * D + d];
    }
}

int cu_tp_reduce_ffn(cuda_backend *b, uint32_t T, hc_post_src *post, ds4_err *err) {
    if (b->tp.n < 2) return 0;
    uint32_t D = b->cfg->n_embd;
    DS4_LAUNCH(tp_ffn_sum_kernel, T, TP_SUM_THREADS, 0, b->st, b->y, (const float *)b->eout, (const float *)b->sout,
               (const int *)b->msel, b->cfg->n_expert_used, D);
    CU_LAUNCHED();
    if (cu_nccl_allreduce(b->tp.clique, (int)b->tp.rank, b->y, (size_t)T * D, b->st, err)) return -1;
    *post = hc_post_src{b->y, NULL, NULL, 0, NULL, NULL};
    return 0;
}
