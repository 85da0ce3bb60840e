/*
 * cuda_weights.cu - the model's tensors in GPU memory (see cuda_internal.h
 * for the repacked row layout).
 *
 * Loading copies every tensor of a ds4_weights once, regrouping the bytes
 * of the quantized block formats so that a warp reads a row's quants with
 * 16-byte coalesced loads and the block scales separately; the values are
 * the file's, bit for bit.  Synthesis fills the same layout with seeded
 * random but valid data directly on the GPU (the full-size speed runs: an
 * 81 GB file need not exist), with the value scales ds4-mkmodel uses.
 */
#include <stdlib.h>
#include <string.h>

#include "model/cuda/cuda_internal.h"

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

size_t cu_row_bytes(uint32_t type, uint32_t n) {
    size_t b;
    switch (type) {
    case DS4_TYPE_I32: return (size_t)n * 4; /* the hash table stays a dense array */
    case DS4_TYPE_F32: b = (size_t)n * 4; break;
    case DS4_TYPE_F16:
    case DS4_TYPE_BF16: b = (size_t)n * 2; break;
    case DS4_TYPE_Q8_0:
        if (n % 32) return 0;
        b = (size_t)n + (size_t)n / 32 * 2;
        break;
    case DS4_TYPE_Q2_K:
        if (n % 256) return 0;
        b = (size_t)n / 256 * 84;
        break;
    case DS4_TYPE_Q4_K:
        if (n % 256) return 0;
        b = (size_t)n / 256 * 144;
        break;
    case DS4_TYPE_IQ2_XXS:
        if (n % 256) return 0;
        b = (size_t)n / 256 * 66;
        break;
    default: return 0;
    }
    return align_up(b, 16);
}

void cu_repack_row(uint32_t type, uint32_t n, const uint8_t *src, uint8_t *dst, size_t row_bytes) {
    memset(dst, 0, row_bytes);
    uint32_t nb = n / 256;
    switch (type) {
    case DS4_TYPE_Q8_0:
        for (uint32_t b = 0; b < n / 32; b++) {
            memcpy(dst + 32 * (size_t)b, src + 34 * (size_t)b + 2, 32);
            memcpy(dst + n + 2 * (size_t)b, src + 34 * (size_t)b, 2);
        }
        return;
    case DS4_TYPE_Q2_K: /* scales[16] qs[64] d dmin */
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *s = src + 84 * (size_t)b;
            memcpy(dst + 64 * (size_t)b, s + 16, 64);
            memcpy(dst + 64 * (size_t)nb + 16 * b, s, 16);
            memcpy(dst + 80 * (size_t)nb + 4 * b, s + 80, 4);
        }
        return;
    case DS4_TYPE_Q4_K: /* d dmin scales[12] qs[128] */
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *s = src + 144 * (size_t)b;
            memcpy(dst + 128 * (size_t)b, s + 16, 128);
            memcpy(dst + 128 * (size_t)nb + 12 * b, s + 4, 12);
            memcpy(dst + 140 * (size_t)nb + 4 * b, s, 4);
        }
        return;
    case DS4_TYPE_IQ2_XXS: /* d qs[64] */
        for (uint32_t b = 0; b < nb; b++) {
            const uint8_t *s = src + 66 * (size_t)b;
            memcpy(dst + 64 * (size_t)b, s + 2, 64);
            memcpy(dst + 64 * (size_t)nb + 2 * b, s, 2);
        }
        return;
    default: memcpy(dst, src, ds4_row_bytes(type, n)); return;
    }
}

/* Device tensor i, in the order of ds4_weights_at: offsets of the fields
 * the tensor table gives dweights and dlayer (and dmtp, the MTP block's). */
#define DEV_OFFSET(type, field, ...) offsetof(type, field),
#define DEV_GLOBAL(...)              DEV_OFFSET(dweights, __VA_ARGS__)
#define DEV_LAYER(...)               DEV_OFFSET(dlayer, __VA_ARGS__)
#define DEV_MTP(...)                 DEV_OFFSET(dmtp, __VA_ARGS__)
static const size_t dev_global_offsets[] = {DS4_GLOBAL_TENSORS(DEV_GLOBAL)};
static const size_t dev_layer_offsets[] = {DS4_LAYER_TENSORS(DEV_LAYER)};
static const size_t dev_mtp_offsets[] = {DS4_MTP_TENSORS(DEV_MTP)};

static dwt *dev_tensor(dweights *dw, size_t i) {
    if (i < DS4_N_GLOBAL_TENSORS) return (dwt *)((char *)dw + dev_global_offsets[i]);
    i -= DS4_N_GLOBAL_TENSORS;
    return (dwt *)((char *)&dw->layers[i / DS4_N_LAYER_TENSORS] + dev_layer_offsets[i % DS4_N_LAYER_TENSORS]);
}

/* Which routed tensor device tensor i is (0 gate, 1 up, 2 down), or -1;
 * and its layer. */
static int routed_of(size_t i, uint32_t *il) {
    if (i < DS4_N_GLOBAL_TENSORS) return -1;
    i -= DS4_N_GLOBAL_TENSORS;
    *il = (uint32_t)(i / DS4_N_LAYER_TENSORS);
    size_t off = dev_layer_offsets[i % DS4_N_LAYER_TENSORS];
    return off == offsetof(dlayer, gate_exps)   ? 0
           : off == offsetof(dlayer, up_exps)   ? 1
           : off == offsetof(dlayer, down_exps) ? 2
                                                : -1;
}

/* Bytes of one tensor's allocation. */
static size_t tensor_bytes(const dwt *d) { return align_up(d->row_bytes * d->rows * d->mats, 256); }

/* A host tensor, its table row, its device copy, and for a routed tensor
 * its layer (slots of resident experts), else -1; with `part`, the device
 * copy holds rows [row0, row0 + rows) and values [col0, col0 + n) of each
 * of them (a rank's share under tensor parallelism, cuda_tp.cu). */
typedef struct tref {
    const ds4_wt *h;
    const ds4_tensor_row *row;
    dwt *d;
    int il;
    bool part;
    uint32_t row0, rows, col0, n;
} tref;

/* Every tensor of w (in the order of ds4_weights_at), with tp's shares
 * (NULL: whole); NULL without memory. */
static tref *model_refs(dweights *dw, const ds4_weights *w, const cu_tp *tp, size_t *n) {
    *n = ds4_weights_count(w);
    tref *r = (tref *)calloc(*n, sizeof(tref));
    if (!r) return NULL;
    for (size_t i = 0; i < *n; i++) {
        uint32_t il;
        r[i].h = ds4_weights_at(w, i, &r[i].row);
        r[i].d = dev_tensor(dw, i);
        r[i].il = routed_of(i, &il) >= 0 ? (int)il : -1;
        if (!tp || i < DS4_N_GLOBAL_TENSORS || !r[i].h->name) continue;
        r[i].row0 = r[i].col0 = 0;
        r[i].rows = (uint32_t)r[i].h->ne[1];
        r[i].n = (uint32_t)r[i].h->ne[0];
        size_t field = dev_layer_offsets[(i - DS4_N_GLOBAL_TENSORS) % DS4_N_LAYER_TENSORS];
        r[i].part = cu_tp_part(tp, &w->cfg, field, &r[i].row0, &r[i].rows, &r[i].col0, &r[i].n);
    }
    return r;
}

/* Device shapes from the host tensors (their parts); a routed tensor keeps
 * n_gpu[layer] experts when n_gpu is given. */
static int shape(const tref *r, size_t count, const uint32_t *n_gpu, ds4_err *err) {
    for (size_t i = 0; i < count; i++) {
        const ds4_wt *h = r[i].h;
        dwt *d = r[i].d;
        memset(d, 0, sizeof(*d));
        if (!h->name) continue; /* absent optional tensor */
        d->type = h->type;
        d->n = (uint32_t)h->ne[0];
        d->rows = (uint32_t)h->ne[1];
        d->mats = (uint32_t)h->ne[2];
        if (n_gpu && r[i].il >= 0) d->mats = n_gpu[r[i].il];
        if (r[i].part) d->n = r[i].n, d->rows = r[i].rows;
        d->row_bytes = cu_row_bytes(h->type, d->n);
        if (!d->row_bytes)
            return ds4_err_set(err, DS4_EUNSUPPORTED,
                               "tensor %s: storage type %u with rows of %u is not supported on CUDA", h->name, h->type,
                               d->n);
    }
    return 0;
}

/* Whether device tensor i belongs to a backend of layers [first, end) of
 * n_layer: a layer's tensors to its stage, the embedding to the first,
 * the output head to the last. */
static bool in_stage(size_t i, uint32_t n_layer, uint32_t first, uint32_t end) {
    if (i < DS4_N_GLOBAL_TENSORS)
        return dev_global_offsets[i] == offsetof(dweights, token_embd) ? first == 0 : end == n_layer;
    size_t il = (i - DS4_N_GLOBAL_TENSORS) / DS4_N_LAYER_TENSORS;
    return il >= first && il < end;
}

int cu_weights_shape(dweights *dw, const ds4_weights *w, const cu_tp *tp, const uint32_t *n_gpu, uint32_t first,
                     uint32_t end, ds4_err *err) {
    free(dw->layers);
    /* the model's layers, and one more for the MTP block's (cu_mtp_weights_load) */
    dw->layers = (dlayer *)calloc(w->cfg.n_layer + 1, sizeof(dlayer));
    if (!dw->layers) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    size_t n;
    tref *r = model_refs(dw, w, tp, &n);
    if (!r) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = shape(r, n, n_gpu, err);
    for (size_t i = 0; rc == 0 && i < n; i++) /* another stage's: absent here (nothing planned or read) */
        if (!in_stage(i, w->cfg.n_layer, first, end)) memset(r[i].d, 0, sizeof(*r[i].d));
    free(r);
    return rc;
}

size_t cu_weights_bytes(const dweights *dw, const ds4_config *c, size_t *routed) {
    size_t total = 0, r = 0, count = DS4_N_GLOBAL_TENSORS + (size_t)c->n_layer * DS4_N_LAYER_TENSORS;
    for (size_t i = 0; i < count; i++) {
        const dwt *d = dev_tensor((dweights *)dw, i);
        uint32_t il;
        if (routed_of(i, &il) >= 0) r += tensor_bytes(d);
        else total += tensor_bytes(d);
    }
    if (routed) *routed = r;
    return total + r;
}

/* One device allocation (*block, *bytes) for every shaped tensor (an empty
 * one - a routed tensor with no expert on the GPU - keeps p NULL). */
static int plan(const tref *r, size_t count, void **block, size_t *bytes, ds4_err *err) {
    size_t total = 0;
    for (size_t i = 0; i < count; i++) total += tensor_bytes(r[i].d);
    *bytes = total;
    if (cu_dev_alloc(block, total, "weights", err)) return -1;
    size_t off = 0;
    for (size_t i = 0; i < count; i++) {
        size_t b = tensor_bytes(r[i].d);
        if (b) r[i].d->p = (const uint8_t *)*block + off;
        off += b;
    }
    return 0;
}

/* Repack every planned tensor's rows through a pinned staging buffer, 64 MiB
 * at a time; a routed tensor's resident experts into their slots when slot
 * (n_expert per layer, -1: on the host) is given. */
static int upload(const tref *r, size_t count, const int32_t *slot, uint32_t E, cudaStream_t st, ds4_err *err) {
    int rc = 0;
    const size_t STAGE = (size_t)64 << 20;
    uint8_t *stage[2] = {NULL, NULL};
    cudaEvent_t done[2] = {NULL, NULL};
    CU_TRY(cudaMallocHost(&stage[0], STAGE));
    CU_TRY(cudaMallocHost(&stage[1], STAGE));
    CU_TRY(cudaEventCreate(&done[0]));
    CU_TRY(cudaEventCreate(&done[1]));
    int which = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        const ds4_wt *h = r[i].h;
        dwt *d = r[i].d;
        if (!d->p) continue;
        if (!h->data) {
            rc = ds4_err_set(err, DS4_EINVAL, "tensor %s has no data (synthetic weights need the synthetic loader)",
                             h->name);
            break;
        }
        size_t per = STAGE / d->row_bytes;
        if (per == 0) {
            rc = ds4_err_set(err, DS4_EUNSUPPORTED, "tensor %s: a row of %zu bytes exceeds the staging buffer", h->name,
                             d->row_bytes);
            break;
        }
        /* matrix by matrix: a routed tensor's resident experts into their slots */
        uint32_t il = r[i].il >= 0 ? (uint32_t)r[i].il : 0;
        bool routed = slot && r[i].il >= 0;
        uint32_t n_src = routed ? E : 1;
        for (uint32_t e = 0; e < n_src && rc == 0; e++) {
            int32_t to = routed ? slot[(size_t)il * E + e] : 0;
            if (to < 0) continue;
            size_t rows = routed ? d->rows : (size_t)d->rows * d->mats;
            const uint8_t *src = (const uint8_t *)h->data + (size_t)e * d->rows * h->row_bytes;
            if (r[i].part) /* a share: its first row, its first value's block */
                src = (const uint8_t *)h->data + (size_t)r[i].row0 * h->row_bytes + ds4_row_bytes(d->type, r[i].col0);
            uint8_t *dst = (uint8_t *)d->p + (size_t)to * d->rows * d->row_bytes;
            for (size_t r0 = 0; r0 < rows && rc == 0; r0 += per) {
                size_t nr = rows - r0 < per ? rows - r0 : per;
                if (cudaEventSynchronize(done[which]) != cudaSuccess) {
                    rc = ds4_err_set(err, DS4_EIO, "CUDA: staging");
                    break;
                }
                for (size_t q = 0; q < nr; q++)
                    cu_repack_row(d->type, d->n, src + (r0 + q) * h->row_bytes, stage[which] + q * d->row_bytes,
                                  d->row_bytes);
                if (ds4_cuda_check(cudaMemcpyAsync(dst + r0 * d->row_bytes, stage[which], nr * d->row_bytes,
                                                   cudaMemcpyHostToDevice, st),
                                   "upload", __FILE__, __LINE__, err) ||
                    ds4_cuda_check(cudaEventRecord(done[which], st), "event", __FILE__, __LINE__, err))
                    rc = -1;
                which ^= 1;
            }
        }
    }
    if (rc == 0) rc = ds4_cuda_check(cudaStreamSynchronize(st), "upload", __FILE__, __LINE__, err);
    cudaEventDestroy(done[0]);
    cudaEventDestroy(done[1]);
    cudaFreeHost(stage[0]);
    cudaFreeHost(stage[1]);
    return rc;
}

int cu_weights_load(dweights *dw, const ds4_weights *w, const cu_tp *tp, const int32_t *slot, cudaStream_t st,
                    ds4_err *err) {
    size_t n;
    tref *r = model_refs(dw, w, tp, &n);
    if (!r) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = plan(r, n, &dw->block, &dw->bytes, err);
    if (rc == 0) rc = upload(r, n, slot, w->cfg.n_expert, st, err);
    free(r);
    return rc;
}

/* ------------------------------------------------------------ synthetic */

static __device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static __device__ __forceinline__ float uniform01(uint64_t h) { return (float)((h >> 40) + 1) * (1.0f / 16777217.0f); }

static __device__ float normal_at(uint64_t seed, uint64_t i) {
    float u1 = uniform01(mix64(seed + 2 * i)), u2 = uniform01(mix64(seed + 2 * i + 1));
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

/* Float tensors: mean + std * N(0,1) per element. */
static __global__ void synth_float(uint8_t *p, uint32_t type, size_t count, uint64_t seed, float mean, float std) {
    dev_pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        float v = mean + std * normal_at(seed, i);
        if (type == DS4_TYPE_F32) ((float *)p)[i] = v;
        else if (type == DS4_TYPE_F16) ((uint16_t *)p)[i] = dev_to_f16(v);
        else ((uint16_t *)p)[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}

/* Quantized tensors: random bytes everywhere, then the block scales set so
 * the values have about the wanted standard deviation (as ds4-mkmodel's
 * --random-blocks). */
static __global__ void synth_bytes(uint8_t *p, size_t words, uint64_t seed) {
    dev_pdl_enter();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < words; i += (size_t)gridDim.x * blockDim.x)
        ((uint64_t *)p)[i] = mix64(seed ^ (i * 0x9E3779B97F4A7C15ull));
}

static __global__ void synth_scales(uint8_t *p, uint32_t type, uint32_t n, size_t row_bytes, size_t rows, float std) {
    dev_pdl_enter();
    uint32_t nb = n / 256;
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < rows; r += (size_t)gridDim.x * blockDim.x) {
        uint8_t *row = p + r * row_bytes;
        uint16_t *d;
        switch (type) {
        case DS4_TYPE_Q8_0:
            d = (uint16_t *)(row + n);
            for (uint32_t b = 0; b < n / 32; b++) d[b] = dev_to_f16(std / 74.0f);
            break;
        case DS4_TYPE_Q2_K:
            d = (uint16_t *)(row + 80 * (size_t)nb);
            for (uint32_t b = 0; b < 2 * nb; b++) d[b] = dev_to_f16(std / 8.0f);
            break;
        case DS4_TYPE_Q4_K:
            d = (uint16_t *)(row + 140 * (size_t)nb);
            for (uint32_t b = 0; b < 2 * nb; b++) d[b] = dev_to_f16(std / 150.0f);
            break;
        case DS4_TYPE_IQ2_XXS:
            d = (uint16_t *)(row + 64 * (size_t)nb);
            for (uint32_t b = 0; b < nb; b++) d[b] = dev_to_f16(std / 40.0f);
            break;
        default: break;
        }
    }
}

/* Hash routing table: k distinct experts per token. */
static __global__ void synth_hash(int32_t *tab, uint32_t k, uint32_t vocab, uint32_t n_expert, uint64_t seed) {
    dev_pdl_enter();
    for (uint32_t tok = blockIdx.x * blockDim.x + threadIdx.x; tok < vocab; tok += gridDim.x * blockDim.x) {
        int32_t *row = tab + (size_t)tok * k;
        uint64_t s = seed ^ ((uint64_t)tok * 0xD1B54A32D192ED03ull);
        for (uint32_t j = 0; j < k; j++) {
            for (;;) {
                s = mix64(s + 0x9E3779B97F4A7C15ull);
                int32_t e = (int32_t)(s % n_expert);
                uint32_t m = 0;
                while (m < j && row[m] != e) m++;
                if (m == j) {
                    row[j] = e;
                    break;
                }
            }
        }
    }
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* Seeded random values in every planned tensor, at the scales ds4-mkmodel uses. */
static int synthesise(const tref *r, size_t count, uint32_t n_expert, uint64_t seed, cudaStream_t st, ds4_err *err) {
    for (size_t i = 0; i < count; i++) {
        const ds4_tensor_row *row = r[i].row;
        const ds4_wt *h = r[i].h;
        dwt *d = r[i].d;
        if (!d->p) continue;
        uint64_t s = seed ^ name_hash(h->name);
        size_t rows = (size_t)d->rows * d->mats;
        float mean, std; /* the value scale ds4-mkmodel gives the tensor */
        ds4_init_dist(row->init, d->n, &mean, &std);
        uint8_t *p = (uint8_t *)d->p;
        if (d->type == DS4_TYPE_I32) {
            DS4_LAUNCH(synth_hash, 256, 256, 0, st, (int32_t *)p, d->n, d->rows, n_expert, s);
        } else if (d->type == DS4_TYPE_F32 || d->type == DS4_TYPE_F16 || d->type == DS4_TYPE_BF16) {
            size_t cnt = rows * d->row_bytes / (d->type == DS4_TYPE_F32 ? 4 : 2);
            DS4_LAUNCH(synth_float, 4096, 256, 0, st, p, d->type, cnt, s, mean, std);
        } else {
            DS4_LAUNCH(synth_bytes, 4096, 256, 0, st, p, rows * d->row_bytes / 8, s);
            CU_LAUNCHED();
            DS4_LAUNCH(synth_scales, 1024, 256, 0, st, p, d->type, d->n, d->row_bytes, rows, std);
        }
        CU_LAUNCHED();
    }
    CU_TRY(cudaStreamSynchronize(st));
    return 0;
}

int cu_weights_synth(dweights *dw, const ds4_weights *w, uint64_t seed, cudaStream_t st, ds4_err *err) {
    size_t n;
    tref *r = model_refs(dw, w, NULL, &n);
    if (!r) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    int rc = plan(r, n, &dw->block, &dw->bytes, err);
    if (rc == 0) rc = synthesise(r, n, w->cfg.n_expert, seed, st, err);
    free(r);
    return rc;
}

int cu_mtp_weights_load(dmtp *dm, dlayer *dl, const ds4_mtp_weights *m, bool synth, uint64_t seed, cudaStream_t st,
                        ds4_err *err) {
    tref r[DS4_N_MTP_TENSORS + DS4_N_LAYER_TENSORS];
    size_t n = 0;
    for (size_t i = 0; i < DS4_N_MTP_TENSORS; i++, n++)
        r[n] = (tref){(const ds4_wt *)((const char *)m + ds4_mtp_rows[i].offset), &ds4_mtp_rows[i],
                      (dwt *)((char *)dm + dev_mtp_offsets[i]), -1, false, 0, 0, 0, 0};
    for (size_t i = 0; i < DS4_N_LAYER_TENSORS; i++, n++)
        r[n] = (tref){(const ds4_wt *)((const char *)&m->blk + ds4_layer_rows[i].offset), &ds4_layer_rows[i],
                      (dwt *)((char *)dl + dev_layer_offsets[i]), -1, false, 0, 0, 0, 0};
    if (shape(r, n, NULL, err) || plan(r, n, &dm->block, &dm->bytes, err)) return -1;
    return synth ? synthesise(r, n, m->cfg.n_expert, seed, st, err) : upload(r, n, NULL, m->cfg.n_expert, st, err);
}

void cu_weights_free(dweights *dw) {
    if (dw->block) cudaFree(dw->block);
    free(dw->layers);
    memset(dw, 0, sizeof(*dw));
}
