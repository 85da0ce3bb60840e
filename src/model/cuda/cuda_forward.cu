/*
 * cuda_forward.cu - one pass of T tokens through the model on the GPU:
 * the order of docs/MODEL.md 6 (attention sublayer, FFN sublayer, per layer;
 * then the output head), as host code that only enqueues kernels on the
 * backend's stream.  A decode pass (T = 1) is what the backend captures
 * into its graph: it fuses the products that read the same activation into
 * one launch and sizes every grid for the largest position the session can
 * reach, so the captured work is valid at any position.  A prefill pass
 * sizes grids for its own positions and uses the tensor-core products.
 *
 * Every HC post is fused with the next HC pre (the next sublayer's, or the
 * output head's) into one launch that also produces that sublayer's
 * normalised input: each sublayer starts with its input ready and ends
 * with the launch that prepares the next one.
 *
 * A decode step runs the work that does not feed the next launch on a side
 * stream, forked and joined within the sublayer (parallel branches of the
 * step's graph): a ratio layer's compressor beside the query path, the
 * shared expert beside the routing and the routed experts.
 */
#include "model/cuda/cuda_internal.h"

/* Token t's row of an activation (a form it lacks stays NULL: the
 * attention heads of a Q8_0 attn_output_a are Q8_0 rows alone). */
static dact act_row(const dact *a, uint32_t t) {
    dact v = *a;
    v.f = a->f ? a->f + (size_t)t * a->fs : NULL;
    v.q8 = a->q8 ? a->q8 + (size_t)t * a->q8s : NULL;
    v.qk = a->qk ? a->qk + (size_t)t * a->qks : NULL;
    return v;
}

/* out[t][r] = W[mat] row (row0 + r) . x[t] for a prefill pass. */
static int mm(cuda_backend *b, const dwt *W, uint32_t row0, uint32_t rows, const dact *x, uint32_t off, uint32_t T,
              float *out, size_t stride, ds4_err *err) {
    return cu_gemm(W, 0, row0, rows, x, off, T, out, stride, NULL, b->split, b->st, err);
}

/* Whether a pass of T tokens takes plans of a few tokens (cu_gemv_tokens)
 * for layer il's dense products: every one of them Q8_0 or float rows,
 * every input row and head group starting on 16 bytes (else the tile
 * products, which take any shape). */
static bool few_pass(const cuda_backend *b, uint32_t il, uint32_t T, bool decode) {
    const ds4_config *c = b->cfg;
    if (decode || T > CU_FEW_PASS) return false;
    if (b->xn.fs % 4 || (c->n_head * c->head_dim / c->o_groups) % 16) return false;
    const dlayer *w = &b->W.layers[il];
    const dwt *dense[] = {&w->q_a,     &w->kv,       &w->q_b,    &w->out_a,    &w->out_b,    &w->comp_kv,
                          &w->comp_gate, &w->idx_kv, &w->idx_gate, &w->idx_proj, &w->idx_q_b, &w->gate_inp,
                          &w->gate_sh, &w->up_sh,    &w->down_sh};
    for (size_t i = 0; i < sizeof(dense) / sizeof(dense[0]); i++)
        if (dense[i]->p && !cu_gemv_few_fits(dense[i])) return false;
    return true;
}

/* Segment of a plan of the pass's tokens (one: a decode step; a few:
 * cu_gemv_tokens): token t reads row t of x, writes out + t stride. */
static void add_rows(gemv_plan *p, const dwt *W, uint32_t row0, uint32_t rows, const dact *x, uint32_t act_off,
                     float *out, size_t stride) {
    gemv_tok tk = {1, stride, 0, 0};
    cu_gemv_add_tok(p, W, 0, NULL, 0, row0, rows, x, act_off, out, tk);
}

/* The compressors' projections of layer il (the attention's; at a ratio-4
 * layer also the indexer's) into a plan. */
static void compressor_segments(cuda_backend *b, const dlayer *w, uint32_t ratio, gemv_plan *p) {
    const ds4_config *c = b->cfg;
    uint32_t width = ds4_compress_coff(ratio) * c->head_dim, iw2 = 2 * c->idx_head_dim;
    add_rows(p, &w->comp_kv, 0, width, &b->xn, 0, b->ckv, width);
    add_rows(p, &w->comp_gate, 0, width, &b->xn, 0, b->cgate, width);
    if (ratio == 4) {
        add_rows(p, &w->idx_kv, 0, iw2, &b->xn, 0, b->ikv, iw2);
        add_rows(p, &w->idx_gate, 0, iw2, &b->xn, 0, b->igate, iw2);
    }
}

static int attention_projections(cuda_backend *b, uint32_t il, uint32_t T, bool decode, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    uint32_t ratio = ds4_layer_ratio(c, il);
    bool idx = ratio == 4;
    if (few_pass(b, il, T, decode)) { /* one launch: the compressors' too */
        gemv_plan p;
        cu_gemv_tokens(&p, T);
        add_rows(&p, &w->q_a, 0, c->q_lora_rank, &b->xn, 0, b->qa_raw, c->q_lora_rank);
        add_rows(&p, &w->kv, 0, c->head_dim, &b->xn, 0, b->kvbuf, c->head_dim);
        if (ratio) compressor_segments(b, w, ratio, &p);
        if (idx) add_rows(&p, &w->idx_proj, 0, c->idx_n_head, &b->xn, 0, b->iw, c->idx_n_head);
        return cu_gemv_run(&p, b->st, err);
    }
    if (decode) { /* the compressors' projections are their branch's (compressor_projections) */
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, &w->q_a, 0, NULL, 0, 0, c->q_lora_rank, &b->xn, 0, b->qa_raw);
        cu_gemv_add(&p, &w->kv, 0, NULL, 0, 0, c->head_dim, &b->xn, 0, b->kvbuf);
        if (idx) cu_gemv_add(&p, &w->idx_proj, 0, NULL, 0, 0, c->idx_n_head, &b->xn, 0, b->iw);
        return cu_gemv_run(&p, b->st, err);
    }
    if (mm(b, &w->q_a, 0, c->q_lora_rank, &b->xn, 0, T, b->qa_raw, c->q_lora_rank, err) ||
        mm(b, &w->kv, 0, c->head_dim, &b->xn, 0, T, b->kvbuf, c->head_dim, err))
        return -1;
    if (ratio && cu_comp_products(b, il, &b->xn, T, b->st, err)) return -1;
    if (idx && mm(b, &w->idx_proj, 0, c->idx_n_head, &b->xn, 0, T, b->iw, c->idx_n_head, err)) return -1;
    return 0;
}

/* A decode step's compressor projections (the attention's and, at a ratio-4
 * layer, the indexer's), on the compressor's branch: the query path waits
 * only for q_a and kv, and these stream while its latency-bound launches
 * (qkv_post, q post) leave the DRAM idle. */
static int compressor_projections(cuda_backend *b, const dlayer *w, uint32_t ratio, cudaStream_t st, ds4_err *err) {
    gemv_plan p;
    memset(&p, 0, sizeof(p));
    compressor_segments(b, w, ratio, &p);
    return cu_gemv_run(&p, st, err);
}

/* The query heads are the backend's own (cu_tp: all of them but under
 * tensor parallelism); the indexer's are every backend's. */
static int query_projections(cuda_backend *b, uint32_t il, bool idx, uint32_t T, bool decode, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    uint32_t qd = b->tp.heads * c->head_dim, iqd = c->idx_n_head * c->idx_head_dim;
    bool few = few_pass(b, il, T, decode);
    if (decode || few) {
        gemv_plan p;
        cu_gemv_tokens(&p, few ? T : 0);
        add_rows(&p, &w->q_b, 0, qd, &b->qr, 0, b->q, qd);
        if (idx) add_rows(&p, &w->idx_q_b, 0, iqd, &b->qr, 0, b->iq, iqd);
        return cu_gemv_run(&p, b->st, err);
    }
    if (mm(b, &w->q_b, 0, qd, &b->qr, 0, T, b->q, qd, err)) return -1;
    if (idx && mm(b, &w->idx_q_b, 0, iqd, &b->qr, 0, T, b->iq, iqd, err)) return -1;
    return 0;
}

/* Grouped output projection (docs/MODEL.md 6.1 A11) and attn_output_b, of
 * the backend's own groups (cu_tp): under tensor parallelism a part of
 * the attention's output, which cu_tp_reduce_attn sums. */
static int output_projection(cuda_backend *b, uint32_t il, uint32_t T, bool decode, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    bool few = few_pass(b, il, T, decode) && b->tp.groups <= CU_MAX_SEGS;
    uint32_t gin = c->n_head * c->head_dim / c->o_groups, olr = c->o_lora_rank;
    /* decode: a Q8_0 attn_output_b reads the low-rank row as Q8_0, which
     * the attn_output_a launch then makes itself, 32 rows a block */
    bool fused = decode && w->out_a.type == DS4_TYPE_Q8_0 && w->out_b.type == DS4_TYPE_Q8_0 && b->low.q8 &&
                 olr % 32 == 0;
    if (decode) {
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        for (uint32_t g = 0; g < b->tp.groups; g++) {
            float *out = b->low.f + (size_t)g * olr;
            if (fused) cu_gemv_add_q8(&p, &w->out_a, g * olr, olr, &b->heads, g * gin, out, &b->low, g * olr);
            else cu_gemv_add(&p, &w->out_a, 0, NULL, 0, g * olr, olr, &b->heads, g * gin, out);
        }
        if (cu_gemv_run(&p, b->st, err)) return -1;
    } else if (few) { /* the groups in one launch */
        gemv_plan p;
        cu_gemv_tokens(&p, T);
        for (uint32_t g = 0; g < b->tp.groups; g++)
            add_rows(&p, &w->out_a, g * olr, olr, &b->heads, g * gin, b->low.f + (size_t)g * olr, b->low.fs);
        if (cu_gemv_run(&p, b->st, err)) return -1;
    } else {
        for (uint32_t g = 0; g < b->tp.groups; g++)
            if (cu_gemm(&w->out_a, 0, g * olr, olr, &b->heads, g * gin, T, b->low.f + (size_t)g * olr, b->low.fs, NULL,
                        b->split, b->st, err))
                return -1;
    }
    if (!fused && cu_quantize(&b->low, T, b->st, err)) return -1;
    if (decode) {
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, &w->out_b, 0, NULL, 0, 0, c->n_embd, &b->low, 0, b->y);
        return cu_gemv_run(&p, b->st, err);
    }
    return mm(b, &w->out_b, 0, c->n_embd, &b->low, 0, T, b->y, c->n_embd, err);
}

/* The form of the activation a product with W reads (none: W absent). */
static unsigned read_form(const dwt *W) { return W->p ? cu_act_form(W->type) : 0; }

/* The HC sites that feed layer il's attention, its FFN and the output
 * head, each with the forms of its sublayer's input the products read.
 * In a decode pass a site's Sinkhorn is hosted by the sublayer it
 * prepares (sink_later): by a block of the attention launch, of the
 * shared expert's SwiGLU launch. */
static hc_site attn_site(cuda_backend *b, uint32_t il, bool decode) {
    const dlayer *w = &b->W.layers[il];
    unsigned forms = read_form(&w->q_a) | read_form(&w->kv) | read_form(&w->comp_kv) | read_form(&w->comp_gate) |
                     read_form(&w->idx_kv) | read_form(&w->idx_gate) | read_form(&w->idx_proj);
    hc_site s = {&w->hc_attn_fn, &w->hc_attn_scale, &w->hc_attn_base, &w->attn_norm, false, &b->xn, decode, forms};
    return s;
}
static hc_site ffn_site(cuda_backend *b, uint32_t il, bool decode) {
    const dlayer *w = &b->W.layers[il];
    unsigned forms = read_form(&w->gate_inp) | read_form(&w->gate_sh) | read_form(&w->up_sh) |
                     read_form(&w->gate_exps) | read_form(&w->up_exps);
    hc_site s = {&w->hc_ffn_fn, &w->hc_ffn_scale, &w->hc_ffn_base, &w->ffn_norm, false, &b->xn, decode, forms};
    return s;
}
static hc_site head_site(cuda_backend *b) {
    const dweights *W = &b->W;
    hc_site s = {&W->output_hc_fn,     &W->output_hc_scale, &W->output_hc_base, &W->output_norm, true, &b->hz, false,
                 read_form(&W->output)};
    return s;
}
/* The MTP block's head: its own HC head and norm, the model's output matrix. */
static hc_site mtp_head_site(cuda_backend *b) {
    const dmtp *M = cu_mtp_dev(b);
    hc_site s = {&M->hc_head_fn, &M->hc_head_scale,      &M->hc_head_base, &M->norm, true, &b->hz,
                 false,          read_form(&b->W.output)};
    return s;
}

/* A branch of decode work on the side stream: side_fork() makes it start
 * after what st has enqueued so far, side_join() marks its end, and
 * side_wait() makes st wait for that mark before the first launch that
 * reads the branch's results.  Captured, the branch is a parallel path of
 * the step's graph.  Work the side stream runs past the mark (the
 * compressor's frontier) is joined by the next branch's mark: the side
 * stream runs in order, and every layer's FFN forks and joins one. */
static int side_fork(cuda_backend *b, ds4_err *err) {
    CU_TRY(cudaEventRecord(b->ev_fork, b->st));
    CU_TRY(cudaStreamWaitEvent(b->side, b->ev_fork, 0));
    return 0;
}
static int side_join(cuda_backend *b, ds4_err *err) {
    CU_TRY(cudaEventRecord(b->ev_join, b->side));
    return 0;
}
static int side_wait(cuda_backend *b, ds4_err *err) {
    CU_TRY(cudaStreamWaitEvent(b->st, b->ev_join, 0));
    return 0;
}

/* The shared expert of a decode step, whole (gate / up, SwiGLU, down into
 * sout), on the side stream: it needs only the FFN input.  Its SwiGLU
 * launch hosts the Sinkhorn of the FFN's HC site, whose post / comb only
 * the next HC launch reads, after the join: beside the routed experts,
 * off their path, where the routing launch that hosted it before (one
 * warp's work, shorter than the Sinkhorn's 20 dependent iterations) is
 * (9622911: +0.3 % decode at 4k, docs/PERFORMANCE.md). */
static int shared_expert(cuda_backend *b, uint32_t il, const hc_site *sink, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    gemv_plan p;
    memset(&p, 0, sizeof(p));
    cu_gemv_add(&p, &w->gate_sh, 0, NULL, 0, 0, b->tp.ff, &b->xn, 0, b->sg);
    cu_gemv_add(&p, &w->up_sh, 0, NULL, 0, 0, b->tp.ff, &b->xn, 0, b->su);
    if (cu_gemv_run(&p, b->side, err) || cu_swiglu(b, il, 1, SWIGLU_SHARED, sink, b->side, err)) return -1;
    memset(&p, 0, sizeof(p));
    cu_gemv_add(&p, &w->down_sh, 0, NULL, 0, 0, c->n_embd, &b->smid, 0, b->sout);
    return cu_gemv_run(&p, b->side, err);
}

/* The backend as the pass of part p alone sees it at layer il: its
 * sequence, and the pass buffers that the sequence's own work (q / kv
 * post, compressor, indexer, attention) reads and writes from the part's
 * first row on.  That work of a pass of several parts runs part by part,
 * each as a pass of its rows alone would run it; the products around it
 * take every row of the pass at once. */
static cuda_backend part_view(const cuda_backend *b, const cu_part *p, uint32_t il) {
    const ds4_config *c = b->cfg;
    size_t r = p->r0, hd = c->head_dim, ihd = c->idx_head_dim, ih = c->idx_n_head;
    cuda_backend v = *b;
    v.sq = p->s;
    v.qa_raw = b->qa_raw + r * c->q_lora_rank;
    v.qr = act_row(&b->qr, p->r0);
    v.kvbuf = b->kvbuf + r * hd;
    v.q = b->q + r * b->tp.heads * hd;
    v.iq = b->iq + r * ih * ihd;
    v.iw = b->iw + r * ih;
    size_t cw = (size_t)ds4_compress_coff(ds4_layer_ratio(c, il)) * hd;
    v.ckv = b->ckv + r * cw;
    v.cgate = b->cgate + r * cw;
    v.ikv = b->ikv + r * 2 * ihd;
    v.igate = b->igate + r * 2 * ihd;
    v.idx_scores = b->idx_scores + r * b->comp_cap4;
    v.vis = b->vis + r * c->idx_top_k;
    v.nvis = b->nvis + r;
    v.heads = act_row(&b->heads, p->r0);
    v.xn = act_row(&b->xn, p->r0);
    return v;
}

/* The view of part i of a pass of n_parts on its lane (a pass of one part:
 * the backend's own stream and scratch).  Parts on the tensor-core
 * attention share its split rows (attn_tc_rows): they all take lane 0. */
static cuda_backend lane_view(const cuda_backend *b, const cu_part *parts, uint32_t n_parts, uint32_t i, uint32_t il) {
    cuda_backend v = part_view(b, &parts[i], il);
    if (n_parts > 1) {
        uint32_t l = cu_attn_tc(b, parts[i].n) ? 0 : i % CU_LANES;
        v.st = b->lane[l];
        v.attn_part = b->lane_attn_part[l];
        v.attn_count = b->lane_attn_count[l];
        v.attn_queries = 1;
    }
    return v;
}

/* The lanes of a pass of n_parts start after what st has enqueued (fork),
 * or st waits for them (join). */
static int lanes_fork(cuda_backend *b, uint32_t n_parts, ds4_err *err) {
    if (n_parts < 2) return 0;
    CU_TRY(cudaEventRecord(b->ev_fork, b->st));
    for (uint32_t l = 0; l < CU_LANES && l < n_parts; l++) CU_TRY(cudaStreamWaitEvent(b->lane[l], b->ev_fork, 0));
    return 0;
}
static int lanes_join(cuda_backend *b, uint32_t n_parts, ds4_err *err) {
    if (n_parts < 2) return 0;
    for (uint32_t l = 0; l < CU_LANES && l < n_parts; l++) {
        CU_TRY(cudaEventRecord(b->lane_ev[l], b->lane[l]));
        CU_TRY(cudaStreamWaitEvent(b->st, b->lane_ev[l], 0));
    }
    return 0;
}

/* A prefill pass's attention up to the heads: the q / kv post of each
 * part (its positions, its ring) and the journal's copies, the query
 * products of every row, then each part's compressor, indexer and
 * attention over its own state; the parts' own work on the lanes. */
static int attention_parts(cuda_backend *b, uint32_t il, const cu_part *parts, uint32_t n_parts, uint32_t T,
                           ds4_err *err) {
    uint32_t ratio = ds4_layer_ratio(b->cfg, il);
    if (lanes_fork(b, n_parts, err)) return -1;
    for (uint32_t i = 0; i < n_parts; i++) {
        cuda_backend v = lane_view(b, parts, n_parts, i, il);
        uint32_t n = parts[i].n;
        if (cu_qkv_post(&v, il, n, err) || cu_journal_rows(&v, il, n, err) || cu_journal_proj(&v, il, n, err))
            return -1;
    }
    if (lanes_join(b, n_parts, err) || query_projections(b, il, ratio == 4, T, false, err) ||
        lanes_fork(b, n_parts, err))
        return -1;
    /* a captured step's parts (one row each) are sized for any position,
     * as a decode step is: their compressors pool with the frontiers, their
     * indexer and attention grids cover the whole context */
    bool any_pos = b->capturing;
    for (uint32_t i = 0; i < n_parts; i++) {
        cuda_backend v = lane_view(b, parts, n_parts, i, il);
        uint32_t n = parts[i].n, pos0 = parts[i].pos0;
        if (cu_q_post(&v, il, n, false, err) || (ratio && cu_compress(&v, il, n, pos0, any_pos, v.st, NULL, err)) ||
            (ratio == 4 && cu_indexer(&v, il, n, pos0, any_pos, err)) || cu_attend(&v, il, n, pos0, NULL, err))
            return -1;
    }
    return lanes_join(b, n_parts, err);
}

int cu_attention_layer(cuda_backend *b, uint32_t il, const cu_part *parts, uint32_t n_parts, uint32_t T, bool decode,
                       ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    uint32_t ratio = ds4_layer_ratio(c, il), pos0 = parts[0].pos0;
    bool idx = ratio == 4;
    if (!decode) {
        if (attention_projections(b, il, T, false, err) || attention_parts(b, il, parts, n_parts, T, err) ||
            output_projection(b, il, T, false, err) || cu_tp_reduce_attn(b, T, err))
            return -1;
        hc_post_src src = {b->y, NULL, NULL, 0, NULL, NULL};
        if (cu_steer(b, il, T, false, false, &src, err)) return -1;
        hc_site ffn = ffn_site(b, il, false);
        return cu_hc_step(b, &src, &ffn, T, err);
    }
    /* decode: the compressor needs only the layer's input and its own
     * state; its projections and pooling run beside the query path, which
     * waits for the emitted rows before the indexer (the join's event,
     * recorded by cu_compress before the frontier's rebuild).  A deferred
     * layer (dlstate.win) does that only in the steps that close its
     * window, for the whole window; the others keep their input in it (q
     * post).  Its projections, 6 % of the bytes a step reads, slowed the
     * indexer and attention they ran beside (b1c07d4, docs/DESIGN.md
     * 4.3). */
    bool deferred = b->sq->L[il].win, closes = deferred && cu_kind_closes(b->dec_kind, ratio);
    bool branch = ratio && (!deferred || closes);
    if (branch && side_fork(b, err)) return -1;
    if (closes && cu_compress_window(b, il, b->side, b->ev_join, err)) return -1;
    if (branch && !closes &&
        (compressor_projections(b, w, ratio, b->side, err) ||
         cu_compress(b, il, T, pos0, decode, b->side, b->ev_join, err)))
        return -1;
    if (attention_projections(b, il, T, decode, err)) return -1;
    if (cu_qkv_post(b, il, T, err) || query_projections(b, il, idx, T, decode, err) ||
        cu_q_post(b, il, T, deferred && !closes, err))
        return -1;
    if (branch && side_wait(b, err)) return -1;
    if (idx && cu_indexer(b, il, T, pos0, decode, err)) return -1;
    hc_site here = attn_site(b, il, decode);
    if (cu_attend(b, il, T, pos0, &here, err) || output_projection(b, il, T, decode, err) ||
        cu_tp_reduce_attn(b, T, err))
        return -1;
    hc_post_src src = {b->y, NULL, NULL, 0, NULL, NULL};
    if (cu_steer(b, il, T, false, decode, &src, err)) return -1;
    hc_site ffn = ffn_site(b, il, decode);
    return cu_hc_step(b, &src, &ffn, T, err);
}

/* The routed experts of a pass of a few tokens (CU_FEW_PASS at most), gate
 * and up (else down), in one launch: each (token, expert) entry as a
 * decode step reads its expert (a plan of reps, cu_gemv_reps, an entry a
 * rep), into the entry's rows (token x k + slot), where the grouped
 * product puts them.  The grouped tile product, 64 entries a tile, spent a
 * tile on each of the few entries of an expert (25 % of a verification's
 * kernel time on an H100, twice the weights' reading time); a launch a
 * token left most of the GPU idle in each.  The entries run in expert
 * order (cu_entry_order, made with gate and up, kept for down): the blocks
 * of the entries of one expert run side by side, so that its weights come
 * from DRAM once and from the L2 for the others (32 sessions select 136
 * distinct experts a layer in 192 entries, 64 sessions 199 in 384). */
static int few_experts(cuda_backend *b, const dlayer *w, const int *esel, uint32_t T, bool gate_up, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t k = c->n_expert_used, F = c->n_ff_exp, D = c->n_embd;
    if (gate_up && cu_entry_order(esel, T * k, b->few_order, b->st, err)) return -1;
    gemv_plan p;
    cu_gemv_reps(&p, T * k);
    p.order = b->few_order;
    if (gate_up) {
        gemv_tok tk = {1, F, 1, k}; /* entry q: row q / k of xn, rows q of eg and eu */
        cu_gemv_add_tok(&p, &w->gate_exps, 0, esel, 0, 0, F, &b->xn, 0, b->eg, tk);
        cu_gemv_add_tok(&p, &w->up_exps, 0, esel, 0, 0, F, &b->xn, 0, b->eu, tk);
    } else {
        gemv_tok tk = {1, D, 1, 0}; /* entry q: row q of mid and eout */
        cu_gemv_add_tok(&p, &w->down_exps, 0, esel, 0, 0, D, &b->mid, 0, b->eout, tk);
    }
    return cu_gemv_run(&p, b->st, err);
}

/* A decode step's routed experts of layer il, gate and up (else down):
 * the resident ones (gpu) and those of the mapped tier (nmap, read from
 * pinned host memory: cuda_offload.h), each product selecting the slots of
 * its own tier. */
int cu_decode_experts(cuda_backend *b, uint32_t il, const int *esel, bool gpu, uint32_t nmap, bool gate_up,
                      ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    uint32_t k = c->n_expert_used, F = c->n_ff_exp, D = c->n_embd;
    for (int tier = 0; tier < 2; tier++) {
        if (tier == 0 ? !gpu : !nmap) continue;
        const dwt *mg = tier ? &b->off->map_w[(size_t)il * 3] : &w->gate_exps;
        const dwt *mu = tier ? mg + 1 : &w->up_exps, *md = tier ? mg + 2 : &w->down_exps;
        int32_t lo = tier ? (int32_t)b->off->place.n_gpu[il] : 0;
        uint32_t n = tier ? nmap : nmap ? b->off->place.n_gpu[il] : UINT32_MAX;
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        for (uint32_t i = 0; i < k; i++) {
            if (gate_up) {
                cu_gemv_add(&p, mg, 0, esel, i, 0, F, &b->xn, 0, b->eg + (size_t)i * F);
                cu_gemv_sel_range(&p, lo, n);
                cu_gemv_add(&p, mu, 0, esel, i, 0, F, &b->xn, 0, b->eu + (size_t)i * F);
                cu_gemv_sel_range(&p, lo, n);
            } else {
                dact m = act_row(&b->mid, i);
                cu_gemv_add(&p, md, 0, esel, i, 0, D, &m, 0, b->eout + (size_t)i * D);
                cu_gemv_sel_range(&p, lo, n);
            }
        }
        if (cu_gemv_run(&p, b->st, err)) return -1;
    }
    return 0;
}

/* Layer il's FFN.  With routed experts on the host (cuda_offload.h) the
 * GPU's products read the selected experts' device slots (msel; a host
 * expert's -1 is skipped) while the host branch computes the others, and
 * the HC post takes each slot's output from its side.  Under tensor
 * parallelism (cu_tp) likewise the rank's own experts, another rank's
 * being -1, and its rows of the shared expert: a part of the output,
 * which cu_tp_reduce_ffn sums. */
int cu_ffn_layer(cuda_backend *b, uint32_t il, const uint32_t *tok, uint32_t T, bool decode, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dlayer *w = &b->W.layers[il];
    uint32_t k = c->n_expert_used, F = c->n_ff_exp, D = c->n_embd, Fs = b->tp.ff;
    bool host = cu_offload_host(b->off, il), gpu = cu_offload_gpu(b->off, il), stream = false;
    const int *esel = host || b->tp.n > 1 ? b->msel : b->sel;
    if (decode) {
        hc_site here = ffn_site(b, il, true);
        if (side_fork(b, err) || shared_expert(b, il, &here, err) || side_join(b, err)) return -1;
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        cu_gemv_add(&p, &w->gate_inp, 0, NULL, 0, 0, c->n_expert, &b->xn, 0, b->router);
        bool routed = cu_gemv_route(b, il, tok, &p);
        if (cu_gemv_run(&p, b->st, err) || (!routed && cu_route(b, il, tok, T, true, err))) return -1;
        if (host && cu_offload_branch(b, il, T, true, err)) return -1;
        uint32_t nmap = cu_offload_mapped(b->off, il);
        if ((gpu || nmap) &&
            (cu_decode_experts(b, il, esel, gpu, nmap, true, err) ||
             cu_swiglu(b, il, T, SWIGLU_ROUTED, NULL, b->st, err) ||
             cu_decode_experts(b, il, esel, gpu, nmap, false, err)))
            return -1;
        if (side_wait(b, err)) return -1; /* the HC reads sout */
    } else if (few_pass(b, il, T, decode)) { /* the router and the shared expert's gate / up in one launch */
        gemv_plan p;
        cu_gemv_tokens(&p, T);
        add_rows(&p, &w->gate_inp, 0, c->n_expert, &b->xn, 0, b->router, c->n_expert);
        add_rows(&p, &w->gate_sh, 0, Fs, &b->xn, 0, b->sg, Fs);
        add_rows(&p, &w->up_sh, 0, Fs, &b->xn, 0, b->su, Fs);
        if (cu_gemv_run(&p, b->st, err) || cu_route(b, il, tok, T, false, err)) return -1;
    } else {
        if (mm(b, &w->gate_inp, 0, c->n_expert, &b->xn, 0, T, b->router, c->n_expert, err) ||
            mm(b, &w->gate_sh, 0, Fs, &b->xn, 0, T, b->sg, Fs, err) ||
            mm(b, &w->up_sh, 0, Fs, &b->xn, 0, T, b->su, Fs, err) || cu_route(b, il, tok, T, false, err))
            return -1;
    }
    if (!decode) {
        /* the host experts by the CPU, or streamed when the chunk uses them
         * enough (cuda_offload.h) */
        if (host && cu_offload_pick_stream(b, il, T, &stream, err)) return -1;
        if (host && !stream && cu_offload_branch(b, il, T, false, err)) return -1;
        cu_group g;
        bool few = gpu && !host && T <= CU_FEW_PASS && T * k <= CU_FEW_ENTRIES;
        if (few && few_experts(b, w, esel, T, true, err)) return -1;
        if (gpu && !few &&
            (cu_group_tokens(b, esel, T, &g, err) ||
             cu_gemm(&w->gate_exps, 0, 0, F, &b->xn, 0, T, b->eg, F, &g, NULL, b->st, err) ||
             cu_gemm(&w->up_exps, 0, 0, F, &b->xn, 0, T, b->eu, F, &g, NULL, b->st, err)))
            return -1;
        if (cu_swiglu(b, il, T, gpu ? SWIGLU_ALL : SWIGLU_SHARED, NULL, b->st, err)) return -1;
        g.act_div = 1;
        if (few && few_experts(b, w, esel, T, false, err)) return -1;
        if (gpu && !few && cu_gemm(&w->down_exps, 0, 0, D, &b->mid, 0, T, b->eout, D, &g, NULL, b->st, err))
            return -1;
        if (mm(b, &w->down_sh, 0, D, &b->smid, 0, T, b->sout, D, err)) return -1;
        if (stream && cu_offload_stream(b, il, T, err)) return -1;
        if (cu_imatrix_sum(b, il, T, err)) return -1;
    }
    bool cpu = host && !stream;
    if (cpu && cu_offload_join(b, err)) return -1;
    hc_post_src src = {NULL, b->eout, b->sout, k, cpu ? b->msel : NULL, cpu ? b->off->h_out : NULL};
    if (cu_tp_reduce_ffn(b, T, &src, err) || cu_steer(b, il, T, true, decode, &src, err)) return -1;
    if (il + 1 == b->layer_end && !cu_head(b))
        return cu_hc_step(b, &src, NULL, T, err); /* the next is another stage's */
    hc_site next = il + 1 < c->n_layer    ? attn_site(b, il + 1, decode)
                   : il + 1 == c->n_layer ? head_site(b)
                                          : mtp_head_site(b); /* the MTP block's layer, n_layer */
    return cu_hc_step(b, &src, &next, T, err);
}

/* The vocabulary product of the collapsed, normed rows (hz, from the last
 * HC step): for the last row into d_logits row 0, or (host) for the rows
 * `need` marks (NULL: every row), copied out in order, a run of adjacent
 * rows a product at a time.  Sets b->d_last_logits (to the last row made). */
static int output_head(cuda_backend *b, uint32_t T, const bool *need, float *host, ds4_err *err) {
    const ds4_config *c = b->cfg;
    const dweights *W = &b->W;
    if (!host) {
        gemv_plan p;
        memset(&p, 0, sizeof(p));
        dact last = act_row(&b->hz, T - 1);
        cu_gemv_add(&p, &W->output, 0, NULL, 0, 0, c->n_vocab, &last, 0, b->d_logits);
        b->d_last_logits = b->d_logits;
        return cu_gemv_run(&p, b->st, err);
    }
    for (uint32_t t0 = 0; t0 < T;) {
        if (need && !need[t0]) {
            t0++;
            continue;
        }
        uint32_t n = 1;
        while (t0 + n < T && n < b->logits_rows && (!need || need[t0 + n])) n++;
        dact part = act_row(&b->hz, t0);
        if (cu_gemm(&W->output, 0, 0, c->n_vocab, &part, 0, n, b->d_logits, c->n_vocab, NULL, b->split, b->st, err))
            return -1;
        CU_TRY(
            cudaMemcpyAsync(host, b->d_logits, (size_t)n * c->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, b->st));
        CU_TRY(cudaStreamSynchronize(b->st));
        b->d_last_logits = b->d_logits + (size_t)(n - 1) * c->n_vocab;
        host += (size_t)n * c->n_vocab;
        t0 += n;
    }
    return 0;
}

/* The final residuals the MTP block pairs with (cu_mtp_keep_hidden): the
 * main sequence's rows of the pass (the block pairs with it alone). */
static int keep_hidden_parts(cuda_backend *b, const cu_part *parts, uint32_t n_parts, ds4_err *err) {
    size_t hcd = (size_t)b->cfg->n_hc * b->cfg->n_embd;
    for (uint32_t i = 0; i < n_parts; i++) {
        if (parts[i].s != &b->main_seq) continue;
        cuda_backend v = *b;
        v.sq = parts[i].s;
        v.S = b->S + parts[i].r0 * hcd;
        if (cu_mtp_keep_hidden(&v, parts[i].n, false, err)) return -1;
    }
    return 0;
}

int cu_forward_parts(cuda_backend *b, const uint32_t *d_tok, const cu_part *parts, uint32_t n_parts, uint32_t T,
                     bool decode, const bool *need, float *host, ds4_err *err) {
    const ds4_config *c = b->cfg;
    /* a decode pass's launches are shaped for one token (the hosted
     * Sinkhorn reads one token's sums) */
    if (decode && (T != 1 || n_parts != 1))
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a decode pass of %u tokens (it takes one)", T);
    b->sq = parts[0].s;
    /* the first stage embeds the tokens; a later one (a pipeline stage)
     * starts from the residuals its step put in S */
    hc_site first = attn_site(b, b->layer_first, decode);
    if ((b->layer_first == 0 && cu_embed_tokens(b, d_tok, T, err)) || cu_hc_step(b, NULL, &first, T, err)) return -1;
    for (uint32_t il = b->layer_first; il < b->layer_end; il++)
        if (cu_attention_layer(b, il, parts, n_parts, T, decode, err) || cu_ffn_layer(b, il, d_tok, T, decode, err))
            return -1;
    if (b->mtp && keep_hidden_parts(b, parts, n_parts, err)) return -1;
    if (!cu_head(b)) /* a stage before the head: its residuals stay in S for the step to read */
        return n_parts == 1 ? cu_step_end(b, T, decode, err) : 0;
    if (b->capturing && !decode) { /* a captured step of several rows: every row's logits, positions advanced */
        if (cu_gemm(&b->W.output, 0, 0, c->n_vocab, &b->hz, 0, T, b->d_logits, c->n_vocab, NULL, b->split, b->st, err))
            return -1;
        if (n_parts == 1) { /* a verification: its next greedy token too */
            b->d_last_logits = b->d_logits + (size_t)(T - 1) * c->n_vocab;
            return cu_step_end(b, T, false, err);
        }
        for (uint32_t i = 0; i < n_parts; i++) {
            b->sq = parts[i].s;
            if (cu_advance(b, err)) return -1;
        }
        return 0;
    }
    if (output_head(b, T, need, host, err)) return -1;
    /* a pass of several parts: the caller sets each one's position */
    return n_parts == 1 ? cu_step_end(b, T, decode, err) : 0;
}

int cu_forward(cuda_backend *b, const uint32_t *d_tok, uint32_t T, uint32_t pos0, bool decode, float *host_all,
               ds4_err *err) {
    cu_part p = {b->sq, 0, T, pos0};
    return cu_forward_parts(b, d_tok, &p, 1, T, decode, NULL, host_all, err);
}

int cu_forward_mtp(cuda_backend *b, const uint32_t *d_tok, uint32_t T, uint32_t pos0, bool decode, float *host_all,
                   ds4_err *err) {
    uint32_t il = b->cfg->n_layer;
    hc_site first = attn_site(b, il, decode);
    cu_part p = {b->sq, 0, T, pos0};
    if (cu_hc_step(b, NULL, &first, T, err) || cu_attention_layer(b, il, &p, 1, T, decode, err) ||
        cu_ffn_layer(b, il, d_tok, T, decode, err) || cu_mtp_keep_hidden(b, T, true, err) ||
        output_head(b, T, NULL, host_all, err))
        return -1;
    return cu_step_end(b, T, false, err);
}
