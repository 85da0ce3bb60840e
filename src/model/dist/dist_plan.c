/*
 * dist_plan.c - the start of a pipeline (see dist.h): every rank's model
 * file compared with rank 0's, and the layers split into stages, from the
 * ranks' --layers or in proportion to each rank's available memory (the
 * in-process stages of --gpus: one model, each stage's GPU's memory).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/meminfo.h"
#include "base/numparse.h"
#include "model/backends.h"
#include "model/dist/dist_internal.h"

/* A message into msg (cut at n bytes, as every message here may be). */
static void say(char *msg, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *msg, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, n, fmt, ap);
    va_end(ap);
}

/* FNV-1a over the tensor table - names, types, shapes and offsets - and
 * the first bytes of every tensor, so that two files of one shape with
 * other weights differ too (a page a tensor read). */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t table_hash(const ds4_weights *w) {
    uint64_t h = 0xcbf29ce484222325ull;
    const ds4_gguf *g = w->gguf;
    for (uint64_t i = 0; g && i < g->n_tensors; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        h = fnv(h, t->name, strlen(t->name) + 1);
        h = fnv(h, &t->type, sizeof(t->type));
        h = fnv(h, t->ne, sizeof(t->ne[0]) * t->ndim);
        h = fnv(h, &t->offset, sizeof(t->offset));
        h = fnv(h, t->data, t->nbytes < 32 ? t->nbytes : 32);
    }
    return h;
}

/* Memory a rank may fill: its GPU's for a backend on one (the CUDA
 * backend's budget), else MemAvailable; in whole GiB so that ranks of one
 * machine that read it a moment apart agree. */
static uint64_t mem_available(const char *backend, int gpu) {
    uint64_t bytes = ds4_backend_mem_available(backend, gpu);
    if (!bytes) bytes = ds4_mem_available();
    uint64_t gib = bytes >> 30;
    return (gib ? gib : 1) << 30;
}

/* "A:B" (inclusive) or "A:output" -> [first, end); ds4's spelling. */
static int parse_layers(const char *s, uint32_t n_layer, int32_t *first, int32_t *end, char *msg, size_t n) {
    const char *colon = strchr(s, ':');
    uint32_t a, b;
    char head[32];
    if (!colon || (size_t)(colon - s) >= sizeof(head)) goto bad;
    memcpy(head, s, (size_t)(colon - s));
    head[colon - s] = 0;
    if (ds4_parse_u32(head, 0, UINT32_MAX, &a) != 0) goto bad;
    if (strcmp(colon + 1, "output") == 0) b = n_layer - 1;
    else if (ds4_parse_u32(colon + 1, 0, UINT32_MAX, &b) != 0) goto bad;
    if (a > b || b >= n_layer) {
        say(msg, n, "--layers %s: not a range of the model's layers 0..%u", s, n_layer - 1);
        return -1;
    }
    *first = (int32_t)a;
    *end = (int32_t)b + 1;
    return 0;
bad:
    say(msg, n, "--layers %s: expected A:B (inclusive) or A:output", s);
    return -1;
}

static uint64_t tensor_bytes(const ds4_wt *t) {
    return t->data || t->name ? t->ne[1] * (t->ne[2] ? t->ne[2] : 1) * t->row_bytes : 0;
}

/* Bytes of weights each layer reads (the embedding counted with layer 0,
 * the head with the last). */
static void layer_bytes(const ds4_weights *w, uint64_t *bytes) {
    const ds4_config *c = &w->cfg;
    memset(bytes, 0, c->n_layer * sizeof(uint64_t));
    for (size_t i = 0; i < ds4_weights_count(w); i++) {
        const ds4_wt *t = ds4_weights_at(w, i, NULL);
        if (i < DS4_N_GLOBAL_TENSORS) bytes[t == &w->token_embd ? 0 : c->n_layer - 1] += tensor_bytes(t);
        else bytes[(i - DS4_N_GLOBAL_TENSORS) / DS4_N_LAYER_TENSORS] += tensor_bytes(t);
    }
}

/* Contiguous stages whose weights are in proportion to the ranks' memory:
 * stage r ends at the layer boundary nearest to its share, leaving every
 * rank at least one layer. */
static void split_by_memory(ds4_dist *d, const ds4_weights *w) {
    uint32_t L = w->cfg.n_layer;
    uint64_t bytes[DS4_MAX_LAYERS];
    layer_bytes(w, bytes);
    double total = 0, mem = 0;
    for (uint32_t il = 0; il < L; il++) total += (double)bytes[il];
    for (int r = 0; r < d->size; r++) mem += (double)d->peers[r].mem_bytes;
    double cum_mem = 0, cum = 0;
    uint32_t il = 0;
    for (int r = 0; r < d->size; r++) {
        d->first[r] = il;
        cum_mem += (double)d->peers[r].mem_bytes;
        double target = total * cum_mem / mem;
        uint32_t left = (uint32_t)(d->size - 1 - r); /* ranks after this one, a layer each */
        if (r == d->size - 1) {
            il = L;
        } else {
            do cum += (double)bytes[il++];
            while (il < L - left && cum + (double)bytes[il] / 2 < target);
        }
        d->end[r] = il;
    }
}

static int check_same_model(const ds4_dist *d, int r, char *msg, size_t n) {
    const dist_peer *a = &d->peers[0], *b = &d->peers[r];
    char name[128];
    dist_peer_name(d, r, name, sizeof(name));
    struct {
        const char *what;
        uint64_t x, y;
    } diff[] = {
        {"layers", a->n_layer, b->n_layer},
        {"embedding width", a->n_embd, b->n_embd},
        {"hyper-connection streams", a->n_hc, b->n_hc},
        {"vocabulary", a->n_vocab, b->n_vocab},
        {"routed experts", a->n_expert, b->n_expert},
        {"routed expert type (quantization)", a->expert_type, b->expert_type},
        {"file size", a->file_bytes, b->file_bytes},
    };
    for (size_t i = 0; i < sizeof(diff) / sizeof(diff[0]); i++)
        if (diff[i].x != diff[i].y) {
            say(msg, n, "%s was started with another model: %s has %s %" PRIu64 ", rank 0's %s has %" PRIu64, name,
                b->model, diff[i].what, diff[i].y, a->model, diff[i].x);
            return -1;
        }
    if (a->table_hash != b->table_hash) {
        say(msg, n, "%s was started with another model: the tensor table of %s differs from rank 0's %s", name,
            b->model, a->model);
        return -1;
    }
    return 0;
}

/* The stages from every rank's --layers: contiguous, in rank order, from
 * layer 0 to the last. */
static int check_requested(ds4_dist *d, uint32_t n_layer, char *msg, size_t n) {
    int given = 0;
    for (int r = 0; r < d->size; r++) given += d->peers[r].want_first >= 0;
    if (given == 0) return 1;
    char name[128];
    if (given != d->size) {
        for (int r = 0; r < d->size; r++)
            if (d->peers[r].want_first < 0) {
                say(msg, n, "%s has no --layers: give them to every rank or to none (a split by memory)",
                    dist_peer_name(d, r, name, sizeof(name)));
                return -1;
            }
    }
    uint32_t next = 0;
    for (int r = 0; r < d->size; r++) {
        const dist_peer *p = &d->peers[r];
        if ((uint32_t)p->want_first != next) {
            say(msg, n,
                "%s has --layers %d:%d, but the stage before it ends at layer %d: the ranks' layers "
                "must follow each other from 0",
                dist_peer_name(d, r, name, sizeof(name)), p->want_first, p->want_end - 1, (int)next - 1);
            return -1;
        }
        d->first[r] = (uint32_t)p->want_first;
        d->end[r] = next = (uint32_t)p->want_end;
    }
    if (next != n_layer) {
        say(msg, n,
            "the last rank's layers end at %u: the model has %u (the last rank holds the output head: "
            "--layers A:output)",
            next - 1, n_layer);
        return -1;
    }
    return 0;
}

static int parse_dtype(const char *s, ds4_dist_dtype *t) {
    if (!s || strcmp(s, "f32") == 0) *t = DS4_DIST_F32;
    else if (strcmp(s, "f16") == 0) *t = DS4_DIST_F16;
    else if (strcmp(s, "bf16") == 0) *t = DS4_DIST_BF16;
    else return -1;
    return 0;
}

static const char *dtype_name(ds4_dist_dtype t) {
    return t == DS4_DIST_F32 ? "f32" : t == DS4_DIST_F16 ? "f16" : "bf16";
}

/* What rank 0 decides, as it travels. */
typedef struct dist_decision {
    int32_t ok;
    char msg[DIST_MSG];
    int32_t dtype;
    double timeout_s;
    uint32_t first[DIST_MAX_RANKS], end[DIST_MAX_RANKS];
} dist_decision;

static void decide(ds4_dist *d, const ds4_weights *w, const ds4_dist_opts *o, dist_decision *dec) {
    memset(dec, 0, sizeof(*dec));
    char *msg = dec->msg;
    size_t n = sizeof(dec->msg);
    ds4_dist_dtype dt;
    for (int r = 0; r < d->size; r++) {
        if (d->peers[r].layers_err[0]) {
            char name[128];
            say(msg, n, "%s: %s", dist_peer_name(d, r, name, sizeof(name)), d->peers[r].layers_err);
            return;
        }
        if (r > 0 && check_same_model(d, r, msg, n) != 0) return;
    }
    if (parse_dtype(o ? o->dtype : NULL, &dt) != 0) {
        say(msg, n, "--pipe-dtype %s: expected f32, f16 or bf16", o->dtype);
        return;
    }
    if (d->loc && dt != DS4_DIST_F32) {
        say(msg, n, "--pipe-dtype %s: the residuals between GPUs (--gpus) travel in f32, exactly", o->dtype);
        return;
    }
    if ((uint32_t)d->size > w->cfg.n_layer) {
        say(msg, n, "%d ranks for %u layers: a stage holds at least one layer", d->size, w->cfg.n_layer);
        return;
    }
    int rc = check_requested(d, w->cfg.n_layer, msg, n);
    if (rc < 0) return;
    if (rc > 0) split_by_memory(d, w);
    for (int r = 0; r < d->size; r++) dec->first[r] = d->first[r], dec->end[r] = d->end[r];
    dec->dtype = (int32_t)dt;
    dec->timeout_s = o && o->timeout_s > 0 ? o->timeout_s : DS4_DIST_TIMEOUT_DEFAULT;
    dec->ok = 1;
}

static void describe_self(const ds4_dist *d, const ds4_weights *w, const ds4_dist_opts *o, dist_peer *me) {
    memset(me, 0, sizeof(*me));
    me->pid = (int32_t)getpid();
    gethostname(me->host, sizeof(me->host) - 1);
    const char *path = w->gguf ? w->gguf->path : "(synthetic)";
    snprintf(me->model, sizeof(me->model), "%s", path);
    me->file_bytes = w->gguf ? w->gguf->size : 0;
    me->table_hash = table_hash(w);
    const ds4_config *c = &w->cfg;
    me->n_layer = c->n_layer, me->n_embd = c->n_embd, me->n_hc = c->n_hc, me->n_vocab = c->n_vocab;
    me->n_expert = c->n_expert;
    me->expert_type = w->layers[0].gate_exps.type;
    me->want_first = me->want_end = -1;
    if (o && o->layers)
        parse_layers(o->layers, c->n_layer, &me->want_first, &me->want_end, me->layers_err, sizeof(me->layers_err));
    me->mem_bytes = mem_available(d->local, d->gpu);
    snprintf(me->backend, sizeof(me->backend), "%s", d->local ? d->local : "cpu");
}

/* The in-process stages (--gpus): stage 0's description for each, with
 * its GPU's memory and its range of --layers, one a GPU by commas. */
static void describe_stages(ds4_dist *d, const ds4_weights *w, const ds4_dist_opts *o) {
    dist_peer *p = d->peers;
    describe_self(d, w, NULL, &p[0]);
    const char *list = o ? o->layers : NULL;
    for (int r = 0; r < d->size; r++) {
        if (r > 0) p[r] = p[0];
        p[r].mem_bytes = mem_available(d->local, dist_local_gpu(d, r));
        if (!list) continue;
        const char *comma = strchr(list, ',');
        char range[64];
        size_t len = comma ? (size_t)(comma - list) : strlen(list);
        snprintf(range, sizeof(range), "%.*s", (int)(len < sizeof(range) ? len : sizeof(range) - 1), list);
        if (parse_layers(range, w->cfg.n_layer, &p[r].want_first, &p[r].want_end, p[r].layers_err,
                         sizeof(p[r].layers_err)) == 0 &&
            (r + 1 < d->size) != (comma != NULL))
            say(p[r].layers_err, sizeof(p[r].layers_err), "--layers %s: one range a GPU of --gpus (%d), by commas",
                o->layers, d->size);
        list = comma ? comma + 1 : list + len;
    }
}

int ds4_dist_plan(ds4_dist *d, const char *prog, const ds4_weights *w, const ds4_dist_opts *o, ds4_err *err) {
    d->prog = prog;
    d->plan_tried = true;
    if (d->planned) return ds4_err_set(err, DS4_EINVAL, "the pipeline's stages are already set");
    d->peers = calloc((size_t)d->size, sizeof(dist_peer));
    d->first = calloc((size_t)d->size, sizeof(uint32_t));
    d->end = calloc((size_t)d->size, sizeof(uint32_t));
    dist_decision *dec = calloc(1, sizeof(*dec));
    if (!d->peers || !d->first || !d->end || !dec) {
        free(dec);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    if (d->loc) {
        describe_stages(d, w, o);
        decide(d, w, o, dec);
    } else {
        dist_peer me;
        describe_self(d, w, o, &me);
        /* the start is collective and blocking: every rank is there, or
         * mpirun ends the job when one does not start */
        d->mpi.Allgather(&me, sizeof(me), d->mpi.byte, d->peers, sizeof(me), d->mpi.byte, d->comm);
        if (d->rank == 0) decide(d, w, o, dec);
        d->mpi.Bcast(dec, sizeof(*dec), d->mpi.byte, 0, d->comm);
    }
    if (!dec->ok) {
        ds4_err_set(err, DS4_EINVAL, "pipeline: %s", dec->msg);
        free(dec);
        return -1;
    }
    for (int r = 0; r < d->size; r++) d->first[r] = dec->first[r], d->end[r] = dec->end[r];
    d->dtype = (ds4_dist_dtype)dec->dtype;
    d->timeout_s = dec->timeout_s;
    free(dec);
    if (d->rank == 0) {
        char name[128];
        uint64_t bytes[DS4_MAX_LAYERS];
        layer_bytes(w, bytes);
        for (int r = 0; r < d->size; r++) {
            uint64_t b = 0;
            for (uint32_t il = d->first[r]; il < d->end[r]; il++) b += bytes[il];
            bool gib = b >= (1u << 30);
            d->peers[r].backend[sizeof(d->peers[r].backend) - 1] = 0;
            if (d->loc) snprintf(name, sizeof(name), "GPU %d", dist_local_gpu(d, r));
            else dist_peer_name(d, r, name, sizeof(name));
            fprintf(stderr, "%s: pipeline stage %d: layers %u..%u%s%s on %s (%.2f %s of weights), %s\n", prog, r,
                    d->first[r], d->end[r] - 1, r == 0 ? " + embedding" : "", r == d->size - 1 ? " + output head" : "",
                    d->peers[r].backend, (double)b / (gib ? 1u << 30 : 1u << 20), gib ? "GiB" : "MiB", name);
        }
        if (d->loc) fprintf(stderr, "%s: pipeline: residuals in f32 from GPU to GPU by NCCL, a stage a thread\n", prog);
        else
            fprintf(stderr, "%s: pipeline: residuals in %s, a rank silent for %.1f s fails it\n", prog,
                    dtype_name(d->dtype), d->timeout_s);
    }
    d->planned = true;
    return d->tr->start(d, w, o, err);
}

void ds4_dist_layers(const ds4_dist *d, uint32_t *first, uint32_t *end) {
    *first = d->first[d->rank];
    *end = d->end[d->rank];
}
