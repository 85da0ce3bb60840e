/*
 * cuda_offload.cu - routed experts in host RAM beside the CUDA backend
 * (cuda_offload.h; docs/DESIGN.md 3.5): the placement at creation, the
 * host experts' data (the mmap'ed file's, or synthetic), and the host
 * branch of a layer's FFN - the hand-off launch, the CPU's experts, the
 * join.
 *
 * The CPU computes exactly what the CPU reference does for an expert
 * (format/quants.h kernels: the activation quantized per MODEL.md 3.8,
 * integer block dots; clamped SwiGLU times the routing weight before the
 * down projection), so a host expert's output differs from the GPU's only
 * in the order of float sums.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/cuda/cuda_internal.h"

extern "C" {
#include "base/clock.h"
#include "base/fp.h"
#include "format/quants.h"
}

#define HOST_TILE   32                  /* weight rows a CPU task takes */
#define DEV_RESERVE ((uint64_t)1 << 30) /* the default budget leaves this much of the free memory to the runtime */

#define STAGE_CAP ((size_t)256 << 20) /* bytes of a stage's experts at most */
#define STAGE_MAX 64                  /* experts of a stage at most */

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }
static size_t r256(size_t x) { return (x + 255) / 256 * 256; }

/* The three routed tensors of a layer. */
static const ds4_wt *routed_wt(const ds4_weights *w, uint32_t il, int t) {
    const ds4_layer_weights *L = &w->layers[il];
    return t == 0 ? &L->gate_exps : t == 1 ? &L->up_exps : &L->down_exps;
}
static const dwt *routed_dwt(const dweights *W, uint32_t il, int t) {
    const dlayer *L = &W->layers[il];
    return t == 0 ? &L->gate_exps : t == 1 ? &L->up_exps : &L->down_exps;
}

/* A stage: S experts' gate, up and down matrices, each part sized for the
 * largest layer's; S a quarter of a layer's experts (so that a chunk
 * that uses them all streams in several batches, each copied while the
 * one before is multiplied), at most STAGE_CAP bytes. */
static uint32_t stage_geometry(const cuda_backend *b, size_t part[3]) {
    const ds4_config *c = b->cfg;
    size_t expert = 0;
    part[0] = part[1] = part[2] = 0;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        size_t e = 0;
        for (int t = 0; t < 3; t++) {
            const dwt *d = routed_dwt(&b->W, l, t);
            size_t m = d->row_bytes * d->rows;
            if (m > part[t]) part[t] = m;
            e += m;
        }
        if (e > expert) expert = e;
    }
    uint32_t S = (c->n_expert + 3) / 4;
    if (S > STAGE_MAX) S = STAGE_MAX;
    size_t cap = expert ? STAGE_CAP / expert : S;
    if (cap < 1) cap = 1;
    if (S > cap) S = (uint32_t)cap;
    for (int t = 0; t < 3; t++) part[t] = r256(part[t] * S);
    return S;
}

size_t cu_offload_dev_bytes(const cuda_backend *b) {
    const ds4_config *c = b->cfg;
    size_t part[3];
    stage_geometry(b, part);
    return 2 * r256((size_t)c->n_layer * c->n_expert * sizeof(int32_t)) + r256(2 * (part[0] + part[1] + part[2])) +
           r256(2 * (size_t)b->chunk * c->n_expert_used * sizeof(int));
}

/* Bytes of RAM the machine has (all of it: file pages), or that are
 * available for new allocations (synthetic experts); 0 when unknown. */
static uint64_t host_ram(bool available) {
    if (!available) {
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
    }
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof(line), fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    fclose(fp);
    return (uint64_t)kb * 1024;
}

static void print_placement(const cu_offload *o, const ds4_place_in *in, uint64_t fixed_w, bool profile) {
    const ds4_placement *p = &o->place;
    uint32_t total = p->n_layer * p->n_expert;
    fprintf(stderr,
            "ds4: the model does not fit the GPU budget of %.2f GiB: %.2f GiB on the GPU = %.2f GiB of weights "
            "other than the routed experts + %.2f GiB of session state and buffers + %.2f GiB of routed experts "
            "(%u of %u)\n",
            gib(in->budget), gib(p->dev_total), gib(fixed_w), gib(in->fixed - fixed_w), gib(p->dev_routed),
            total - p->host_experts, total);
    fprintf(stderr, "ds4: %.2f GiB of routed experts (%u) stay in host RAM, computed by the CPU\n", gib(p->host_bytes),
            p->host_experts);
    fprintf(stderr, "ds4: routed-expert bytes a token reads (%s): %.1f MB on the GPU, %.1f MB on the host\n",
            profile ? "by the expert profile" : "every expert equally likely", p->tok_dev / 1e6, p->tok_host / 1e6);
    fprintf(stderr, "ds4: experts on the GPU by layer:");
    for (uint32_t l = 0; l < p->n_layer; l++) fprintf(stderr, " %u", p->n_gpu[l]);
    fprintf(stderr, "\n");
}

int cu_offload_plan(cuda_backend *b, const ds4_weights *w, uint64_t fixed, uint64_t budget, cu_offload **out,
                    ds4_err *err) {
    const ds4_config *c = b->cfg;
    *out = NULL;
    uint32_t L = c->n_layer, E = c->n_expert;
    uint64_t *dev_mat = (uint64_t *)calloc((size_t)L * DS4_PLACE_TENSORS, sizeof(uint64_t));
    uint64_t *host_exp = (uint64_t *)calloc(L, sizeof(uint64_t));
    cu_offload *o = (cu_offload *)calloc(1, sizeof(cu_offload));
    if (!dev_mat || !host_exp || !o) {
        free(dev_mat);
        free(host_exp);
        free(o);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    for (uint32_t l = 0; l < L; l++)
        for (int t = 0; t < DS4_PLACE_TENSORS; t++) {
            const dwt *d = routed_dwt(&b->W, l, t);
            const ds4_wt *h = routed_wt(w, l, t);
            dev_mat[(size_t)l * DS4_PLACE_TENSORS + t] = (uint64_t)d->row_bytes * d->rows;
            host_exp[l] += (uint64_t)h->row_bytes * h->ne[1];
        }
    ds4_place_in in = {L, E, c->n_expert_used, budget, fixed, dev_mat, host_exp, 256, b->base.opts.expert_profile};
    o->cfg = c;
    int rc = ds4_place_experts(&in, &o->place, err);
    if (rc == 0 && o->place.host_experts) {
        uint64_t fixed_w = fixed;
        size_t routed = 0, all = cu_weights_bytes(&b->W, c, &routed);
        fixed_w = all - routed;
        print_placement(o, &in, fixed_w, in.profile != NULL);
        uint64_t ram = host_ram(w->synthetic);
        if (ram && o->place.host_bytes > ram)
            rc = ds4_err_set(err, DS4_ENOMEM,
                             "the %u routed experts left in host RAM need %.2f GiB; this machine has %.2f GiB %s: "
                             "give the GPU more (--gpu-mem) or use a machine with more RAM",
                             o->place.host_experts, gib(o->place.host_bytes), gib(ram),
                             w->synthetic ? "available" : "of RAM");
    }
    free(dev_mat);
    free(host_exp);
    if (rc || o->place.host_experts == 0) {
        cu_offload_free(o);
        return rc;
    }
    o->slot = (int32_t *)malloc((size_t)L * E * sizeof(int32_t));
    if (!o->slot) {
        cu_offload_free(o);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    for (uint32_t l = 0; l < L; l++) {
        int32_t s = 0;
        for (uint32_t e = 0; e < E; e++) o->slot[(size_t)l * E + e] = o->place.on_gpu[(size_t)l * E + e] ? s++ : -1;
    }
    *out = o;
    return 0;
}

/* ----------------------------------------------------- synthetic experts */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct synth_task {
    uint8_t *p;
    size_t rows, row_bytes;
    uint32_t type, n;
    uint64_t seed;
    float mean, std;
} synth_task;

/* Rows [r0, r1): random bytes, then the block scales set so the values
 * have about the wanted standard deviation (as the GPU's synthetic
 * weights and ds4-mkmodel's --random-blocks do), in the GGUF layout. */
static void synth_rows(void *ctx, int64_t r0, int64_t r1, int thread) {
    const synth_task *s = (const synth_task *)ctx;
    for (int64_t r = r0; r < r1; r++) {
        uint8_t *row = s->p + (size_t)r * s->row_bytes;
        uint64_t h = s->seed ^ ((uint64_t)r * 0x9E3779B97F4A7C15ull);
        if (s->type == DS4_TYPE_F32 || s->type == DS4_TYPE_F16 || s->type == DS4_TYPE_BF16) {
            for (uint32_t i = 0; i < s->n; i++) {
                h = mix64(h + 1);
                float u1 = (float)((h >> 40) + 1) * (1.0f / 16777217.0f),
                      u2 = (float)(h & 0xffffff) * (1.0f / 16777216.0f);
                float v = s->mean + s->std * sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
                if (s->type == DS4_TYPE_F32) ((float *)row)[i] = v;
                else if (s->type == DS4_TYPE_F16) ((uint16_t *)row)[i] = ds4_f32_to_f16(v);
                else ((uint16_t *)row)[i] = ds4_f32_to_bf16(v);
            }
            continue;
        }
        for (size_t i = 0; i + 8 <= s->row_bytes; i += 8) {
            h = mix64(h + 1);
            memcpy(row + i, &h, 8);
        }
        uint32_t nb = s->n / 256;
        switch (s->type) {
        case DS4_TYPE_Q8_0:
            for (uint32_t b = 0; b < s->n / 32; b++) {
                uint16_t d = ds4_f32_to_f16(s->std / 74.0f);
                memcpy(row + 34 * (size_t)b, &d, 2);
            }
            break;
        case DS4_TYPE_Q2_K:
            for (uint32_t b = 0; b < nb; b++) {
                uint16_t d = ds4_f32_to_f16(s->std / 8.0f);
                memcpy(row + 84 * (size_t)b + 80, &d, 2);
                memcpy(row + 84 * (size_t)b + 82, &d, 2);
            }
            break;
        case DS4_TYPE_Q4_K:
            for (uint32_t b = 0; b < nb; b++) {
                uint16_t d = ds4_f32_to_f16(s->std / 150.0f);
                memcpy(row + 144 * (size_t)b, &d, 2);
                memcpy(row + 144 * (size_t)b + 2, &d, 2);
            }
            break;
        case DS4_TYPE_IQ2_XXS:
            for (uint32_t b = 0; b < nb; b++) {
                uint16_t d = ds4_f32_to_f16(s->std / 40.0f);
                memcpy(row + 66 * (size_t)b, &d, 2);
            }
            break;
        default: break;
        }
    }
}

/* The table row (value distribution) of a tensor view of w. */
static const ds4_tensor_row *row_of(const ds4_weights *w, const ds4_wt *t) {
    size_t count = ds4_weights_count(w);
    for (size_t i = 0; i < count; i++) {
        const ds4_tensor_row *row;
        if (ds4_weights_at(w, i, &row) == t) return row;
    }
    return NULL;
}

/* Synthetic weights have no host data: the host experts get seeded random
 * blocks of their own, in one allocation. */
static int synth_host(cu_offload *o, const ds4_weights *w, ds4_err *err) {
    const ds4_config *c = o->cfg;
    uint32_t L = c->n_layer, E = c->n_expert;
    size_t total = 0;
    for (uint32_t l = 0; l < L; l++)
        for (int t = 0; t < 3; t++) {
            const ds4_wt *h = routed_wt(w, l, t);
            total += (size_t)(E - o->place.n_gpu[l]) * h->ne[1] * h->row_bytes;
        }
    o->synth = (uint8_t *)malloc(total ? total : 1);
    if (!o->synth) return ds4_err_set(err, DS4_ENOMEM, "no room for %.2f GiB of synthetic host experts", gib(total));
    o->synth_bytes = total;
    size_t off = 0;
    for (uint32_t l = 0; l < L; l++)
        for (int t = 0; t < 3; t++) {
            const ds4_wt *h = routed_wt(w, l, t);
            size_t mat = h->ne[1] * h->row_bytes;
            const ds4_tensor_row *row = row_of(w, h);
            synth_task s = {o->synth + off, 0, h->row_bytes, h->type, (uint32_t)h->ne[0], 0, 0.0f, 0.02f};
            if (row) ds4_init_dist(row->init, h->ne[0], &s.mean, &s.std);
            s.seed = w->synthetic_seed ^ ((uint64_t)(l * 3 + t) << 32) ^ 0x5DEECE66Dull;
            for (uint32_t e = 0; e < E; e++)
                if (o->slot[(size_t)l * E + e] < 0) {
                    o->hmat[((size_t)l * 3 + t) * E + e] = o->synth + off;
                    off += mat;
                    s.rows += h->ne[1];
                }
            ds4_pool_run(o->pool, (int64_t)s.rows, 64, synth_rows, &s);
        }
    return 0;
}

/* --------------------------------------------------------------- create */

static int calibrate(cu_offload *o, ds4_err *err);
static int build_mapped(cuda_backend *b, cu_offload *o, ds4_err *err);

int cu_offload_init(cuda_backend *b, cu_offload *o, const ds4_weights *w, ds4_err *err) {
    const ds4_config *c = b->cfg;
    uint32_t L = c->n_layer, E = c->n_expert, k = c->n_expert_used, D = c->n_embd, F = c->n_ff_exp;
    o->chunk = b->chunk;
    size_t C = o->chunk, NE = C * k;
    o->pool = ds4_pool_create(b->base.opts.n_threads, err);
    if (!o->pool) return -1;
    o->hmat = (const uint8_t **)calloc((size_t)L * 3 * E, sizeof(uint8_t *));
    o->hwt = (const ds4_wt **)calloc((size_t)L * 3, sizeof(ds4_wt *));
    o->clamp = (float *)calloc(L, sizeof(float));
    o->jobs = (cu_host_job *)calloc(L, sizeof(cu_host_job));
    o->gjobs = (cu_host_job *)calloc(L, sizeof(cu_host_job));
    o->ent = (uint32_t *)malloc(NE * sizeof(uint32_t));
    o->ent_off = (uint32_t *)malloc((E + 1) * sizeof(uint32_t));
    o->used = (uint32_t *)malloc(E * sizeof(uint32_t));
    if (!o->hmat || !o->hwt || !o->clamp || !o->jobs || !o->gjobs || !o->ent || !o->ent_off || !o->used)
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    size_t xg = 0, xu = 0, mr = 0;
    for (uint32_t l = 0; l < L; l++) {
        o->clamp[l] = c->swiglu_clamp[l];
        o->jobs[l].o = o->gjobs[l].o = o;
        o->jobs[l].il = o->gjobs[l].il = l;
        o->gjobs[l].T = 1;
        o->gjobs[l].mapped = true;
        for (int t = 0; t < 3; t++) {
            const ds4_wt *h = routed_wt(w, l, t);
            o->hwt[(size_t)l * 3 + t] = h;
            size_t ab = ds4_act_bytes(h->type, (int64_t)h->ne[0]);
            if (!ab)
                return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor %s: type %u cannot be computed on the CPU", h->name,
                                   h->type);
            size_t *m = t == 0 ? &xg : t == 1 ? &xu : &mr;
            if (ab > *m) *m = ab;
            if (!w->synthetic)
                for (uint32_t e = 0; e < E; e++)
                    if (o->slot[(size_t)l * E + e] < 0)
                        o->hmat[((size_t)l * 3 + t) * E + e] = (const uint8_t *)ds4_wt_row(h, e, 0);
        }
    }
    o->xrow_g = (xg + 63) / 64 * 64;
    o->xrow_u = (xu + 63) / 64 * 64;
    o->mrow = (mr + 63) / 64 * 64;
    o->xact_g = (uint8_t *)malloc(NE * o->xrow_g);
    o->xact_u = (uint8_t *)malloc(NE * o->xrow_u);
    o->mact = (uint8_t *)malloc(NE * o->mrow);
    o->eg = (float *)malloc(NE * F * sizeof(float));
    o->eu = (float *)malloc(NE * F * sizeof(float));
    o->dout = (float *)malloc(NE * D * sizeof(float));
    if (!o->xact_g || !o->xact_u || !o->mact || !o->eg || !o->eu || !o->dout)
        return ds4_err_set(err, DS4_ENOMEM, "out of memory (host scratch of the host experts)");
    if (w->synthetic && synth_host(o, w, err)) return -1;
    /* mapped: the hand-off launch writes the first three and the HC post
     * reads the last where they are (the same address on the device) */
    const unsigned mapped = cudaHostAllocMapped | cudaHostAllocPortable;
    CU_TRY(cudaHostAlloc(&o->h_x, C * D * sizeof(float), mapped));
    CU_TRY(cudaHostAlloc(&o->h_sel, NE * sizeof(int), mapped));
    CU_TRY(cudaHostAlloc(&o->h_selw, NE * sizeof(float), mapped));
    CU_TRY(cudaHostAlloc(&o->h_out, NE * D * sizeof(float), mapped));
    CU_TRY(cudaStreamCreateWithFlags(&o->hs, cudaStreamNonBlocking));
    CU_TRY(cudaEventCreateWithFlags(&o->ev_route, cudaEventDisableTiming));
    CU_TRY(cudaEventCreateWithFlags(&o->ev_host, cudaEventDisableTiming));
    size_t sb = r256((size_t)L * E * sizeof(int32_t));
    if (cu_dev_alloc((void **)&o->d_slot, sb, "expert slots", err)) return -1;
    b->dev_bytes += sb;
    CU_TRY(cu_upload(o->d_slot, o->slot, (size_t)L * E * sizeof(int32_t)));
    if (cu_dev_alloc((void **)&o->d_slot1, sb, "expert slots of a decode step", err)) return -1;
    b->dev_bytes += sb;
    /* the prefill stages */
    o->S = stage_geometry(b, o->stage_part);
    o->stage_bytes = o->stage_part[0] + o->stage_part[1] + o->stage_part[2];
    if (cu_dev_alloc((void **)&o->stage_d, 2 * o->stage_bytes, "expert stages", err)) return -1;
    b->dev_bytes += r256(2 * o->stage_bytes);
    if (cu_dev_alloc((void **)&o->ssel_d, 2 * NE * sizeof(int), "expert stage selections", err)) return -1;
    b->dev_bytes += r256(2 * NE * sizeof(int));
    o->batch_slot = (int32_t *)malloc(E * sizeof(int32_t));
    if (!o->batch_slot) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (uint32_t e = 0; e < E; e++) o->batch_slot[e] = -1;
    CU_TRY(cudaStreamCreateWithFlags(&o->cs, cudaStreamNonBlocking));
    for (int h = 0; h < 2; h++) {
        CU_TRY(cudaMallocHost(&o->stage_h[h], o->stage_bytes));
        CU_TRY(cudaMallocHost(&o->ssel_h[h], NE * sizeof(int)));
        CU_TRY(cudaEventCreateWithFlags(&o->ev_copied[h], cudaEventDisableTiming));
        CU_TRY(cudaEventCreateWithFlags(&o->ev_free[h], cudaEventDisableTiming));
    }
    return calibrate(o, err) || build_mapped(b, o, err);
}

void cu_offload_free(cu_offload *o) {
    if (!o) return;
    if (o->hs) cudaStreamSynchronize(o->hs);
    if (o->cs) cudaStreamSynchronize(o->cs);
    for (int h = 0; h < 2; h++) {
        if (o->stage_h[h]) cudaFreeHost(o->stage_h[h]);
        if (o->ssel_h[h]) cudaFreeHost(o->ssel_h[h]);
        if (o->ev_copied[h]) cudaEventDestroy(o->ev_copied[h]);
        if (o->ev_free[h]) cudaEventDestroy(o->ev_free[h]);
    }
    if (o->cs) cudaStreamDestroy(o->cs);
    if (o->stage_d) cudaFree(o->stage_d);
    if (o->ssel_d) cudaFree(o->ssel_d);
    free(o->batch_slot);
    if (o->ev_route) cudaEventDestroy(o->ev_route);
    if (o->ev_host) cudaEventDestroy(o->ev_host);
    if (o->hs) cudaStreamDestroy(o->hs);
    if (o->d_slot) cudaFree(o->d_slot);
    if (o->d_slot1) cudaFree(o->d_slot1);
    if (o->map) cudaFreeHost(o->map);
    free(o->n_map);
    free(o->slot1);
    free(o->map_w);
    if (o->h_x) cudaFreeHost(o->h_x);
    if (o->h_sel) cudaFreeHost(o->h_sel);
    if (o->h_selw) cudaFreeHost(o->h_selw);
    if (o->h_out) cudaFreeHost(o->h_out);
    ds4_pool_free(o->pool);
    ds4_placement_free(&o->place);
    free(o->slot);
    free(o->hmat);
    free(o->hwt);
    free(o->synth);
    free(o->clamp);
    free(o->jobs);
    free(o->gjobs);
    free(o->ent);
    free(o->ent_off);
    free(o->used);
    free(o->xact_g);
    free(o->xact_u);
    free(o->mact);
    free(o->eg);
    free(o->eu);
    free(o->dout);
    free(o);
}

/* ------------------------------------------------------- the CPU's part */

/* One layer's host work of a pass: its entries (token t, slot i) whose
 * expert is on the host, grouped by expert. */
typedef struct host_pass {
    cu_offload *o;
    uint32_t il, n_used;
    const ds4_wt *wt[3];
} host_pass;

static void quantize_inputs(void *ctx, int64_t a, int64_t z, int thread) {
    const host_pass *hp = (const host_pass *)ctx;
    const cu_offload *o = hp->o;
    uint32_t k = o->cfg->n_expert_used, D = o->cfg->n_embd;
    for (int64_t i = a; i < z; i++) {
        const float *x = o->h_x + (size_t)(o->ent[i] / k) * D;
        ds4_quantize_act(hp->wt[0]->type, x, o->xact_g + (size_t)i * o->xrow_g, D);
        if (hp->wt[1]->type != hp->wt[0]->type || o->xrow_u != o->xrow_g)
            ds4_quantize_act(hp->wt[1]->type, x, o->xact_u + (size_t)i * o->xrow_u, D);
    }
}

/* Task j: used expert j / (2 tiles), gate or up, a tile of HOST_TILE rows. */
static void gate_up_rows(void *ctx, int64_t a, int64_t z, int thread) {
    const host_pass *hp = (const host_pass *)ctx;
    const cu_offload *o = hp->o;
    uint32_t F = o->cfg->n_ff_exp, D = o->cfg->n_embd, E = o->cfg->n_expert, tiles = (F + HOST_TILE - 1) / HOST_TILE;
    bool same = hp->wt[1]->type == hp->wt[0]->type && o->xrow_u == o->xrow_g;
    for (int64_t j = a; j < z; j++) {
        uint32_t u = (uint32_t)(j / (2 * tiles)), rest = (uint32_t)(j % (2 * tiles)), t = rest / tiles;
        uint32_t r0 = (rest % tiles) * HOST_TILE, nr = F - r0 < HOST_TILE ? F - r0 : HOST_TILE;
        uint32_t e = o->used[u], e0 = o->ent_off[e], m = o->ent_off[e + 1] - e0;
        const ds4_wt *W = hp->wt[t];
        const uint8_t *rows = o->hmat[((size_t)hp->il * 3 + t) * E + e] + (size_t)r0 * W->row_bytes;
        const uint8_t *act = t == 0 || same ? o->xact_g + (size_t)e0 * o->xrow_g : o->xact_u + (size_t)e0 * o->xrow_u;
        size_t arow = t == 0 || same ? o->xrow_g : o->xrow_u;
        float *y = (t == 0 ? o->eg : o->eu) + (size_t)e0 * F + r0;
        ds4_vec_dot_rows_multi(W->type, D, nr, rows, W->row_bytes, act, arow, m, y, F);
    }
}

/* silu(min(g, L)) * clamp(u, -L, L), as the CPU reference. */
static float host_swiglu(float g, float u, float limit) {
    if (limit > 1e-6f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
    }
    float s = g >= 0 ? 1.0f / (1.0f + expf(-g)) : expf(g) / (1.0f + expf(g));
    return g * s * u;
}

static void swiglu_entries(void *ctx, int64_t a, int64_t z, int thread) {
    const host_pass *hp = (const host_pass *)ctx;
    const cu_offload *o = hp->o;
    uint32_t F = o->cfg->n_ff_exp;
    float limit = o->clamp[hp->il];
    for (int64_t i = a; i < z; i++) {
        float w = o->h_selw[o->ent[i]];
        float *g = o->eg + (size_t)i * F;
        const float *u = o->eu + (size_t)i * F;
        for (uint32_t f = 0; f < F; f++) g[f] = host_swiglu(g[f], u[f], limit) * w;
        ds4_quantize_act(hp->wt[2]->type, g, o->mact + (size_t)i * o->mrow, F);
    }
}

/* Task j: used expert j / tiles, a tile of down rows; one entry's rows go
 * straight to its place in h_out, several through dout. */
static void down_rows(void *ctx, int64_t a, int64_t z, int thread) {
    const host_pass *hp = (const host_pass *)ctx;
    const cu_offload *o = hp->o;
    uint32_t F = o->cfg->n_ff_exp, D = o->cfg->n_embd, E = o->cfg->n_expert, tiles = (D + HOST_TILE - 1) / HOST_TILE;
    const ds4_wt *W = hp->wt[2];
    for (int64_t j = a; j < z; j++) {
        uint32_t u = (uint32_t)(j / tiles), r0 = (uint32_t)(j % tiles) * HOST_TILE,
                 nr = D - r0 < HOST_TILE ? D - r0 : HOST_TILE;
        uint32_t e = o->used[u], e0 = o->ent_off[e], m = o->ent_off[e + 1] - e0;
        const uint8_t *rows = o->hmat[((size_t)hp->il * 3 + 2) * E + e] + (size_t)r0 * W->row_bytes;
        float *y = m == 1 ? o->h_out + (size_t)o->ent[e0] * D + r0 : o->dout + (size_t)e0 * D + r0;
        ds4_vec_dot_rows_multi(W->type, F, nr, rows, W->row_bytes, o->mact + (size_t)e0 * o->mrow, o->mrow, m, y, D);
    }
}

static void scatter_outputs(void *ctx, int64_t a, int64_t z, int thread) {
    const host_pass *hp = (const host_pass *)ctx;
    const cu_offload *o = hp->o;
    uint32_t D = o->cfg->n_embd;
    for (int64_t u = a; u < z; u++) {
        uint32_t e = o->used[u], e0 = o->ent_off[e], m = o->ent_off[e + 1] - e0;
        if (m == 1) continue;
        for (uint32_t i = e0; i < e0 + m; i++)
            memcpy(o->h_out + (size_t)o->ent[i] * D, o->dout + (size_t)i * D, D * sizeof(float));
    }
}

/* Layer il's host experts for the T tokens in h_x / h_sel / h_selw (in a
 * decode step, mapped, those of the mapped tier left to the GPU); the
 * entries computed. */
static uint32_t host_experts(cu_offload *o, uint32_t il, uint32_t T, bool mapped) {
    const ds4_config *c = o->cfg;
    uint32_t E = c->n_expert, k = c->n_expert_used, F = c->n_ff_exp, D = c->n_embd;
    const int32_t *slot = (mapped ? o->slot1 : o->slot) + (size_t)il * E;
    uint32_t *off = o->ent_off;
    memset(off, 0, (E + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < T * k; i++) {
        int e = o->h_sel[i];
        if (slot[e] < 0) off[e + 1]++;
    }
    host_pass hp = {o, il, 0, {o->hwt[(size_t)il * 3], o->hwt[(size_t)il * 3 + 1], o->hwt[(size_t)il * 3 + 2]}};
    for (uint32_t e = 0; e < E; e++) {
        if (off[e + 1]) o->used[hp.n_used++] = e;
        off[e + 1] += off[e];
    }
    uint32_t n = off[E];
    if (n == 0) return 0;
    double t0 = ds4_now();
    for (uint32_t i = 0; i < T * k; i++) { /* entries in (token, slot) order within each expert */
        int e = o->h_sel[i];
        if (slot[e] < 0) o->ent[off[e]++] = i;
    }
    for (uint32_t e = E; e > 0; e--) off[e] = off[e - 1]; /* the cursors ran to the next expert's start */
    off[0] = 0;
    ds4_pool_run(n > 1 ? o->pool : NULL, n, 1, quantize_inputs, &hp);
    uint32_t ftiles = (F + HOST_TILE - 1) / HOST_TILE, dtiles = (D + HOST_TILE - 1) / HOST_TILE;
    ds4_pool_run(o->pool, (int64_t)hp.n_used * 2 * ftiles, 1, gate_up_rows, &hp);
    ds4_pool_run(n > 1 ? o->pool : NULL, n, 1, swiglu_entries, &hp);
    ds4_pool_run(o->pool, (int64_t)hp.n_used * dtiles, 1, down_rows, &hp);
    if (n > hp.n_used) ds4_pool_run(o->pool, hp.n_used, 1, scatter_outputs, &hp);
    /* the measured cost of a (token, expert), for cu_offload_pick_stream */
    double per = (ds4_now() - t0) / n;
    o->sec_per_entry = o->sec_per_entry > 0 ? 0.75 * o->sec_per_entry + 0.25 * per : per;
    return n;
}

static void CUDART_CB host_job(void *arg) {
    cu_host_job *j = (cu_host_job *)arg;
    double t0 = ds4_now();
    j->o->host_entries += host_experts(j->o, j->il, j->T, j->mapped);
    j->o->host_jobs++;
    j->o->host_sec += ds4_now() - t0;
}

/* ------------------------------------------------------------ the branch */

/* The hand-off: the pass's FFN inputs (f32), selections and weights into
 * pinned host memory, written by the GPU directly. */
static __global__ void handoff_kernel(const float *x, size_t xs, const int *sel, const float *selw, uint32_t T,
                                      uint32_t D, uint32_t k, float *hx, int *hsel, float *hselw) {
    dev_pdl_enter();
    uint32_t t = blockIdx.x;
    for (uint32_t d = threadIdx.x; d < D; d += blockDim.x) hx[(size_t)t * D + d] = x[(size_t)t * xs + d];
    if (threadIdx.x < k) {
        hsel[(size_t)t * k + threadIdx.x] = sel[(size_t)t * k + threadIdx.x];
        hselw[(size_t)t * k + threadIdx.x] = selw[(size_t)t * k + threadIdx.x];
    }
}

int cu_offload_branch(cuda_backend *b, uint32_t il, uint32_t T, bool decode, ds4_err *err) {
    cu_offload *o = b->off;
    const ds4_config *c = b->cfg;
    /* a captured step's host function runs at every replay, with T = 1; an
     * eager pass may enqueue the next chunk's layers before this one's host
     * work ran: the job (its T) is reused only once the last is done */
    cu_host_job *job = &o->gjobs[il];
    if (!b->capturing) {
        CU_TRY(cudaStreamSynchronize(o->hs));
        job = &o->jobs[il];
        job->T = T;
        job->mapped = decode;
    } else if (T != 1 || !decode) {
        return ds4_err_set(err, DS4_EINVAL, "CUDA backend: a captured pass of %u tokens with host experts", T);
    }
    /* the hand-off on the main stream, ahead of the GPU's own expert
     * products: on a stream of its own it waited for SMs behind them (the
     * mapped tier's read over PCIe for most of a millisecond), and the CPU
     * started late (24 GB on an H100: 47 ms a token where the two tiers
     * take about 0.7 ms a layer each) */
    DS4_LAUNCH(handoff_kernel, T, 256, 0, b->st, (const float *)b->xn.f, b->xn.fs, (const int *)b->sel,
               (const float *)b->selw, T, c->n_embd, c->n_expert_used, o->h_x, o->h_sel, o->h_selw);
    CU_LAUNCHED();
    CU_TRY(cudaEventRecord(o->ev_route, b->st));
    CU_TRY(cudaStreamWaitEvent(o->hs, o->ev_route, 0));
    CU_TRY(cudaLaunchHostFunc(o->hs, host_job, job));
    CU_TRY(cudaEventRecord(o->ev_host, o->hs));
    return 0;
}

int cu_offload_join(cuda_backend *b, ds4_err *err) {
    CU_TRY(cudaStreamWaitEvent(b->st, b->off->ev_host, 0));
    return 0;
}

/* ---------------------------------------------------- prefill streaming */

/* The measurements the choice between the CPU and streaming starts from:
 * a stage copied in, and one token through the host experts of the first
 * layer that has them. */
static int calibrate(cu_offload *o, ds4_err *err) {
    const ds4_config *c = o->cfg;
    uint32_t E = c->n_expert, k = c->n_expert_used;
    memset(o->stage_h[0], 0, o->stage_bytes);
    double t0 = ds4_now();
    CU_TRY(cu_upload(o->stage_d, o->stage_h[0], o->stage_bytes));
    double dt = ds4_now() - t0;
    o->pcie_bw = (double)o->stage_bytes / (dt > 1e-9 ? dt : 1e-9);
    uint32_t l = 0;
    while (o->place.n_gpu[l] == E) l++; /* the offload has host experts */
    memset(o->h_x, 0, (size_t)c->n_embd * sizeof(float));
    uint32_t i = 0;
    for (uint32_t e = 0; e < E && i < k; e++)
        if (o->slot[(size_t)l * E + e] < 0) o->h_sel[i++] = (int)e;
    for (uint32_t e = 0; e < E && i < k; e++)
        if (o->slot[(size_t)l * E + e] >= 0) o->h_sel[i++] = (int)e; /* a layer with fewer than k on the host */
    for (i = 0; i < k; i++) o->h_selw[i] = 1.0f;
    o->sec_per_entry = 0;
    host_experts(o, l, 1, false);
    size_t expert = 0;
    for (int t = 0; t < 3; t++) {
        const ds4_wt *h = o->hwt[(size_t)l * 3 + t];
        expert += h->row_bytes * h->ne[1];
    }
    fprintf(stderr,
            "ds4: host experts: %d CPU threads, %.0f us a (token, expert); PCIe %.1f GB/s, %.0f us an expert: a "
            "prefill chunk streams a layer's host experts to the GPU when they serve more than %.2f tokens each\n",
            ds4_pool_size(o->pool), o->sec_per_entry * 1e6, o->pcie_bw / 1e9, (double)expert / o->pcie_bw * 1e6,
            (double)expert / o->pcie_bw / (o->sec_per_entry > 0 ? o->sec_per_entry : 1e-9));
    return 0;
}

/* ------------------------------------------------------- the mapped tier */

/* The share of each layer's host experts the GPU reads itself in decode:
 * opts.host_mapped's percentage, none for -1, else the CPU's cost of an
 * entry against PCIe's of an expert, so that both sides end together (the
 * GPU's own products overlap the CPU's too). */
static double map_share(const cuda_backend *b, const cu_offload *o, size_t expert) {
    int pct = b->base.opts.host_mapped;
    if (pct < 0) return 0.0;
    if (pct > 0) return pct >= 100 ? 1.0 : pct / 100.0;
    double cpu = o->sec_per_entry, pcie = (double)expert / o->pcie_bw;
    return cpu > 0 ? cpu / (cpu + pcie) : 0.0;
}

/* Layer l's host experts, the most used first by the expert profile (else
 * in expert order), into list; how many. */
static uint32_t host_order(const cuda_backend *b, const cu_offload *o, uint32_t l, uint32_t *list) {
    uint32_t E = o->cfg->n_expert, n = 0;
    const ds4_expert_profile *pr = b->base.opts.expert_profile;
    for (uint32_t e = 0; e < E; e++) {
        if (o->slot[(size_t)l * E + e] >= 0) continue;
        uint32_t i = n++;
        if (pr) /* insertion: stable, so ties keep expert order */
            for (; i > 0 && pr->use[(size_t)l * E + list[i - 1]] < pr->use[(size_t)l * E + e]; i--) list[i] = list[i - 1];
        list[i] = e;
    }
    return n;
}

typedef struct map_task {
    const cu_offload *o;
    const uint32_t *lay, *exp; /* mapped expert x: layer, expert */
    const uint32_t *idx;       /* its index in its layer's tier */
} map_task;

/* Task j: mapped expert j / 3's matrix j % 3, into the pinned tier in the
 * device's row layout. */
static void map_matrices(void *ctx, int64_t a, int64_t z, int thread) {
    const map_task *m = (const map_task *)ctx;
    const cu_offload *o = m->o;
    for (int64_t j = a; j < z; j++) {
        uint32_t x = (uint32_t)(j / 3), t = (uint32_t)(j % 3), l = m->lay[x], e = m->exp[x];
        const dwt *d = &o->map_w[(size_t)l * 3 + t];
        const ds4_wt *h = o->hwt[(size_t)l * 3 + t];
        const uint8_t *src = o->hmat[((size_t)l * 3 + t) * o->cfg->n_expert + e];
        uint8_t *dst = (uint8_t *)d->p + (size_t)m->idx[x] * d->row_bytes * d->rows;
        for (uint32_t row = 0; row < d->rows; row++)
            cu_repack_row(d->type, d->n, src + (size_t)row * h->row_bytes, dst + (size_t)row * d->row_bytes,
                          d->row_bytes);
    }
}

/* The mapped tier (cuda_offload.h): its share of each layer's host experts,
 * as much as the host's available RAM allows less 8 GiB, repacked into
 * pinned memory; the decode step's slot table. */
static int build_mapped(cuda_backend *b, cu_offload *o, ds4_err *err) {
    const ds4_config *c = o->cfg;
    uint32_t L = c->n_layer, E = c->n_expert;
    o->n_map = (uint32_t *)calloc(L, sizeof(uint32_t));
    o->slot1 = (int32_t *)malloc((size_t)L * E * sizeof(int32_t));
    o->map_w = (dwt *)calloc((size_t)L * 3, sizeof(dwt));
    uint32_t *order = (uint32_t *)malloc((size_t)L * E * sizeof(uint32_t)), *nh = (uint32_t *)calloc(L, sizeof(uint32_t));
    uint32_t *lay = (uint32_t *)malloc((size_t)L * E * sizeof(uint32_t));
    uint32_t *exp = (uint32_t *)malloc((size_t)L * E * sizeof(uint32_t));
    uint32_t *idx = (uint32_t *)malloc((size_t)L * E * sizeof(uint32_t));
    uint64_t *per = (uint64_t *)calloc(L, sizeof(uint64_t));
    int rc = -1;
    if (!o->n_map || !o->slot1 || !o->map_w || !order || !nh || !lay || !exp || !idx || !per) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    {
        memcpy(o->slot1, o->slot, (size_t)L * E * sizeof(int32_t));
        size_t expert = 0; /* the largest layer's, device layout */
        for (uint32_t l = 0; l < L; l++) {
            for (int t = 0; t < 3; t++) per[l] += routed_dwt(&b->W, l, t)->row_bytes * routed_dwt(&b->W, l, t)->rows;
            if (per[l] > expert) expert = per[l];
            nh[l] = host_order(b, o, l, order + (size_t)l * E);
        }
        double share = map_share(b, o, expert);
        uint64_t avail = host_ram(true), keep = (uint64_t)8 << 30, cap = avail > keep ? avail - keep : 0;
        uint64_t total = 0;
        for (uint32_t l = 0; l < L; l++) total += (uint64_t)(share * nh[l] + 0.5) * per[l];
        if (total > cap) share *= (double)cap / (double)total;
        total = 0;
        uint32_t n = 0;
        for (uint32_t l = 0; l < L; l++) {
            o->n_map[l] = (uint32_t)(share * nh[l] + 0.5);
            if (o->n_map[l] > nh[l]) o->n_map[l] = nh[l];
            for (uint32_t j = 0; j < o->n_map[l]; j++) {
                uint32_t e = order[(size_t)l * E + j];
                o->slot1[(size_t)l * E + e] = (int32_t)(o->place.n_gpu[l] + j);
                lay[n] = l;
                exp[n] = e;
                idx[n++] = j;
            }
            total += (uint64_t)o->n_map[l] * per[l];
        }
        /* mapped: the GPU reads it at the same address.  A host that will
         * not pin that much (a locked-memory limit) runs without the tier:
         * the CPU computes every host expert, as before it */
        if (total && cudaHostAlloc(&o->map, total, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
            fprintf(stderr, "ds4: could not pin %.2f GiB of host memory (%s): the CPU computes every host expert\n",
                    gib(total), cudaGetErrorString(cudaGetLastError()));
            o->map = NULL;
            memcpy(o->slot1, o->slot, (size_t)L * E * sizeof(int32_t));
            memset(o->n_map, 0, L * sizeof(uint32_t));
            n = 0;
            total = 0;
            share = 0;
        }
        o->map_experts = n;
        o->map_bytes = total;
        if (total) {
            uint8_t *at = o->map;
            for (uint32_t l = 0; l < L; l++)
                for (int t = 0; t < 3; t++) {
                    dwt *d = &o->map_w[(size_t)l * 3 + t];
                    *d = *routed_dwt(&b->W, l, t);
                    d->mats = o->n_map[l];
                    d->p = o->n_map[l] ? at : NULL;
                    at += (size_t)o->n_map[l] * d->row_bytes * d->rows;
                }
            map_task m = {o, lay, exp, idx};
            ds4_pool_run(o->pool, (int64_t)n * 3, 1, map_matrices, &m);
        }
        if (ds4_cuda_check(cu_upload(o->d_slot1, o->slot1, (size_t)L * E * sizeof(int32_t)), "cu_upload", __FILE__,
                           __LINE__, err))
            goto done;
        uint32_t host = o->place.host_experts;
        if (host)
            fprintf(stderr,
                    "ds4: of the %u host experts, %u (%.2f GiB pinned, %.0f %% of each layer's) are read by the GPU "
                    "over PCIe in decode steps (%.0f us an expert at %.1f GB/s; the CPU's %.0f us an entry)\n",
                    host, n, gib(total), 100.0 * share, (double)expert / o->pcie_bw * 1e6, o->pcie_bw / 1e9,
                    o->sec_per_entry * 1e6);
        rc = 0;
    }
done:
    free(order);
    free(nh);
    free(lay);
    free(exp);
    free(idx);
    free(per);
    return rc;
}

/* The mapped tier was sized by the copy engine's rate; the products read
 * it their own way (rows a warp, loads in flight), slower where PCIe's
 * latency leaves them short of loads (H100: 150 us an expert, 47 GB/s,
 * where the copy engine does 54).  So they are timed here as a decode step runs
 * them - the mapped experts of the layer with the most, k of them selected
 * - and each layer's tier is cut back to the share that balances the
 * measured time against the CPU's, its other experts left to the CPU (the
 * pinned memory stays; a share given by the caller stays too). */
int cu_offload_measure(cuda_backend *b, ds4_err *err) {
    cu_offload *o = b->off;
    const ds4_config *c = b->cfg;
    uint32_t L = c->n_layer, E = c->n_expert, k = c->n_expert_used;
    if (!o || !o->map_experts || b->base.opts.host_mapped != 0 || o->sec_per_entry <= 0) return 0;
    uint32_t l = 0;
    for (uint32_t i = 1; i < L; i++)
        if (o->n_map[i] > o->n_map[l]) l = i;
    uint32_t m = o->n_map[l] < k ? o->n_map[l] : k, nmap = o->n_map[l];
    int *sel = (int *)malloc(k * sizeof(int));
    if (!sel) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < k; i++) sel[i] = i < m ? (int)(o->place.n_gpu[l] + i) : -1;
    cudaError_t ce = cudaMemcpyAsync(b->msel, sel, k * sizeof(int), cudaMemcpyHostToDevice, b->st);
    free(sel);
    CU_TRY(ce);
    double best = 0;
    for (int r = 0; r < 4; r++) { /* the first warms up */
        CU_TRY(cudaStreamSynchronize(b->st));
        double t0 = ds4_now();
        if (cu_decode_experts(b, l, b->msel, false, nmap, true, err) ||
            cu_decode_experts(b, l, b->msel, false, nmap, false, err))
            return ds4_err_prefix(err, "timing the mapped experts of layer %u", l);
        CU_TRY(cudaStreamSynchronize(b->st));
        double t = ds4_now() - t0;
        if (r == 1 || (r > 1 && t < best)) best = t;
    }
    size_t expert = 0;
    for (int t = 0; t < 3; t++) expert += routed_dwt(&b->W, l, t)->row_bytes * routed_dwt(&b->W, l, t)->rows;
    double per = best / m, share = o->sec_per_entry / (o->sec_per_entry + per);
    uint32_t kept = 0;
    for (uint32_t il = 0; il < L; il++) {
        uint32_t nh = 0;
        for (uint32_t e = 0; e < E; e++) nh += o->slot[(size_t)il * E + e] < 0;
        uint32_t n = (uint32_t)(share * nh + 0.5);
        if (n < o->n_map[il]) { /* only ever cut: a larger tier would need more pinned memory */
            for (uint32_t e = 0; e < E; e++) {
                int32_t *s1 = &o->slot1[(size_t)il * E + e];
                if (o->slot[(size_t)il * E + e] < 0 && *s1 >= (int32_t)(o->place.n_gpu[il] + n)) *s1 = -1;
            }
            o->n_map[il] = n;
        }
        kept += o->n_map[il];
    }
    fprintf(stderr,
            "ds4: the GPU's products read a mapped expert in %.0f us (%.1f GB/s), balancing %.0f %% of each layer's "
            "host experts against the CPU: %u of the %u mapped experts stay in the tier\n",
            per * 1e6, expert / per / 1e9, 100.0 * share, kept, o->map_experts);
    if (kept == o->map_experts) return 0;
    o->map_experts = kept;
    CU_TRY(cu_upload(o->d_slot1, o->slot1, (size_t)L * E * sizeof(int32_t)));
    return 0;
}

int cu_offload_pick_stream(cuda_backend *b, uint32_t il, uint32_t T, bool *stream, ds4_err *err) {
    cu_offload *o = b->off;
    const ds4_config *c = b->cfg;
    uint32_t E = c->n_expert, k = c->n_expert_used, n = T * k;
    CU_TRY(cudaMemcpyAsync(o->h_sel, b->sel, n * sizeof(int), cudaMemcpyDeviceToHost, b->st));
    CU_TRY(cudaStreamSynchronize(b->st));
    const int32_t *slot = o->slot + (size_t)il * E;
    uint32_t *seen = o->ent_off; /* scratch: E + 1 */
    memset(seen, 0, (E + 1) * sizeof(uint32_t));
    uint32_t entries = 0, used = 0;
    for (uint32_t i = 0; i < n; i++) {
        int e = o->h_sel[i];
        if (slot[e] >= 0) continue;
        entries++;
        if (!seen[e]++) used++;
    }
    size_t expert = 0;
    for (int t = 0; t < 3; t++) expert += routed_dwt(&b->W, il, t)->row_bytes * routed_dwt(&b->W, il, t)->rows;
    double stream_s = (double)used * (double)expert / o->pcie_bw, cpu_s = entries * o->sec_per_entry;
    int how = b->base.opts.host_experts;
    *stream = used > 0 && (how == DS4_HOST_STREAM || (how == DS4_HOST_AUTO && stream_s < cpu_s));
    return 0;
}

typedef struct repack_task {
    const cu_offload *o;
    const ds4_wt *hw[3];
    const dwt *dw[3];
    const uint8_t *src[3][STAGE_MAX];
    uint8_t *dst;
    uint32_t nb;
} repack_task;

/* Task j: expert j / 3, matrix j % 3, into the stage in the device's
 * row layout. */
static void repack_matrices(void *ctx, int64_t a, int64_t z, int thread) {
    const repack_task *r = (const repack_task *)ctx;
    const cu_offload *o = r->o;
    for (int64_t j = a; j < z; j++) {
        uint32_t x = (uint32_t)(j / 3), t = (uint32_t)(j % 3);
        const dwt *d = r->dw[t];
        const ds4_wt *h = r->hw[t];
        size_t mat = d->row_bytes * d->rows, off = 0;
        for (uint32_t u = 0; u < t; u++) off += o->stage_part[u];
        uint8_t *dst = r->dst + off + (size_t)x * mat;
        for (uint32_t row = 0; row < d->rows; row++)
            cu_repack_row(d->type, d->n, r->src[t][x] + (size_t)row * h->row_bytes, dst + (size_t)row * d->row_bytes,
                          d->row_bytes);
    }
}

/* A stage's matrices as device tensors of S experts. */
static dwt stage_view(const cu_offload *o, const dwt *d, int t, int h) {
    dwt v = *d;
    size_t off = 0;
    for (int u = 0; u < t; u++) off += o->stage_part[u];
    v.p = o->stage_d + (size_t)h * o->stage_bytes + off;
    v.mats = o->S;
    return v;
}

int cu_offload_stream(cuda_backend *b, uint32_t il, uint32_t T, ds4_err *err) {
    cu_offload *o = b->off;
    const ds4_config *c = b->cfg;
    uint32_t E = c->n_expert, k = c->n_expert_used, n = T * k, F = c->n_ff_exp, D = c->n_embd;
    const int32_t *slot = o->slot + (size_t)il * E;
    repack_task r;
    r.o = o;
    for (int t = 0; t < 3; t++) {
        r.hw[t] = o->hwt[(size_t)il * 3 + t];
        r.dw[t] = routed_dwt(&b->W, il, t);
    }
    /* the used host experts in expert order (h_sel holds the selections:
     * cu_offload_pick_stream) */
    uint32_t *list = o->used, n_used = 0;
    uint32_t *seen = o->ent_off;
    memset(seen, 0, (E + 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++)
        if (slot[o->h_sel[i]] < 0) seen[o->h_sel[i]] = 1;
    for (uint32_t e = 0; e < E; e++)
        if (seen[e]) list[n_used++] = e;
    uint32_t S = o->S;
    for (uint32_t b0 = 0, bi = 0; b0 < n_used; b0 += S, bi++) {
        int h = (int)(bi & 1);
        uint32_t nb = n_used - b0 < S ? n_used - b0 : S;
        /* the pinned stage is free once its last copy is done */
        CU_TRY(cudaEventSynchronize(o->ev_copied[h]));
        for (uint32_t x = 0; x < nb; x++) {
            uint32_t e = list[b0 + x];
            o->batch_slot[e] = (int32_t)x;
            for (int t = 0; t < 3; t++) r.src[t][x] = o->hmat[((size_t)il * 3 + t) * E + e];
        }
        r.dst = o->stage_h[h];
        r.nb = nb;
        ds4_pool_run(o->pool, (int64_t)nb * 3, 1, repack_matrices, &r);
        int *ss = o->ssel_h[h];
        for (uint32_t i = 0; i < n; i++) ss[i] = o->batch_slot[o->h_sel[i]];
        for (uint32_t x = 0; x < nb; x++) o->batch_slot[list[b0 + x]] = -1;
        /* copy in once the GPU is done with the device stage's last batch */
        int *sd = o->ssel_d + (size_t)h * o->chunk * k;
        CU_TRY(cudaStreamWaitEvent(o->cs, o->ev_free[h], 0));
        for (int t = 0; t < 3; t++) {
            dwt v = stage_view(o, r.dw[t], t, h);
            size_t off = 0;
            for (int u = 0; u < t; u++) off += o->stage_part[u];
            CU_TRY(cudaMemcpyAsync((void *)v.p, o->stage_h[h] + off, (size_t)nb * v.row_bytes * v.rows,
                                   cudaMemcpyHostToDevice, o->cs));
        }
        CU_TRY(cudaMemcpyAsync(sd, ss, n * sizeof(int), cudaMemcpyHostToDevice, o->cs));
        CU_TRY(cudaEventRecord(o->ev_copied[h], o->cs));
        /* the GPU's products of the batch, as of its own experts */
        CU_TRY(cudaStreamWaitEvent(b->st, o->ev_copied[h], 0));
        dwt vg = stage_view(o, r.dw[0], 0, h), vu = stage_view(o, r.dw[1], 1, h), vd = stage_view(o, r.dw[2], 2, h);
        cu_group g;
        if (cu_group_tokens(b, sd, T, &g, err) || cu_gemm(&vg, 0, 0, F, &b->xn, 0, T, b->eg, F, &g, NULL, b->st, err) ||
            cu_gemm(&vu, 0, 0, F, &b->xn, 0, T, b->eu, F, &g, NULL, b->st, err) ||
            cu_swiglu(b, il, T, SWIGLU_ROUTED, NULL, b->st, err) || cu_group_tokens(b, sd, T, &g, err))
            return -1;
        g.act_div = 1;
        if (cu_gemm(&vd, 0, 0, D, &b->mid, 0, T, b->eout, D, &g, NULL, b->st, err)) return -1;
        CU_TRY(cudaEventRecord(o->ev_free[h], b->st));
    }
    return 0;
}
