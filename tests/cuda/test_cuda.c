/*
 * test_cuda.c - the CUDA backend against the CPU reference and against the
 * HF transformers goldens.  Built twice from this source: for a real GPU
 * (make cuda) and on the CPU emulation of CUDA (make test-cuda-emu, used by
 * the default suite).  tests/cuda/run.sh drives it.
 *
 *   test_cuda compare MODEL [--prompt N] [--steps N] [--chunk N] [--seed S]
 *                           [--no-sim] [--tol X] [--loose] [--graph-ctx N]
 *       prefill of N random tokens (all logits), the same prefill in uneven
 *       chunks of 37, N decode steps (N >= 4) fed with the CPU's greedy
 *       tokens, a prefill of 6 more tokens after them (all logits), DSV4
 *       payloads moved CPU -> CUDA at step N / 2 and back to
 *       a fresh CPU backend after min(16, N / 4) more steps (each side then
 *       checked over that many steps), and the CUDA greedy loop (device
 *       argmax) from a restored snapshot.  --graph-ctx N: the CUDA
 *       backend's smallest decode graph serves contexts below N
 *       (ds4_backend_opts.cuda_graph_ctx), so that a short session's decode
 *       steps go from one captured graph into the next.
 *
 *       Alongside runs a CPU "twin": the same model with one-ulp noise on
 *       the norm weights of every layer.  The model contains discontinuous
 *       functions (expert and indexer top-k selections; with the
 *       simulations, FP8 / FP4 / f16 grids; in the quantized recipes, the
 *       int8 quantization of every matrix input), so two correct
 *       implementations that round differently in the last bit now and then
 *       choose differently; the twin shows where and how much the CPU
 *       reference itself moves under such noise.
 *
 *       strict (default): every row within max |d| <= tol * max |logit|
 *       (tol 1e-3) with the same argmax, except rows where a twin also
 *       moves by more than tol / 2 (a near-tie of the model there; a second
 *       twin changes only one weight); greedy tokens identical.  Meant for F16 models with the simulations off,
 *       where the reference is continuous almost everywhere.
 *       --loose: the median row difference within 4x the twin's (or tol)
 *       and at most 2x + 3 as many argmax changes.  For the quantized
 *       recipes and the simulations, where the reference is chaotic: a
 *       one-ulp change moves its logits by tens of percent within a few
 *       hundred tokens.  The pieces behind the discontinuities are checked
 *       bit for bit in test_cuda_kernels (activation quantization, the
 *       simulations, the K-quant products).
 *
 *   test_cuda golden MODEL GOLDEN [N]
 *       with the simulations off, prefill and token-by-token decode (of the
 *       first N tokens; all by default) against transformers' logits,
 *       max |d| <= 1e-4 max |logit|, same argmax (the CPU's own criterion,
 *       tests/unit/test_cpu_golden.c).
 *
 *   test_cuda split MODEL [--prompt N] [--steps N] [--seed S] [--no-sim] [--tol X] [--quick]
 *       routed experts split between the GPU and host RAM
 *       (ds4_backend_opts.gpu_mem, docs/DESIGN.md 3.5) against the
 *       all-resident CUDA run: none on the GPU, whole layers (half the
 *       experts' bytes), random thirds by a random expert profile, in one
 *       chunk and in chunks of 5; prefill's host experts streamed to the
 *       GPU, computed by the CPU, and as the measured costs choose; in
 *       decode, none, all, the measured share or half of the host experts
 *       read by the GPU from pinned host memory (the mapped tier,
 *       host_mapped), the mapped counts checked.  Each: the device bytes allocated are
 *       those the placement printed and within the budget; prefill logits
 *       (every position), decode steps fed the reference's greedy tokens
 *       and a prefill after them within max |d| <= tol * max |logit| (1e-3)
 *       with the same argmax; the device greedy loop gives the reference's
 *       tokens.  A budget one byte below the least is refused, naming it;
 *       the reference's expert selection counts (ds4_cuda_expert_counts,
 *       the profile ds4-bench writes) add up to k a token in every layer.
 *       --quick: none on the GPU (streamed, none mapped) and the chunks of 5
 *       (CPU, half mapped: layers of resident and mapped experts) only.
 *
 *   test_cuda rewind MODEL [--no-sim] [--quick]
 *       rewindable steps of 2, 5 and 17 rows before and at the window
 *       boundaries, taken back to none, one and all but one of their rows:
 *       the state does not depend on the rejected rows (byte-identical
 *       payloads of two runs with different ones), and the kept rows'
 *       logits and three decode steps after the rewind are the CPU's
 *       within 1e-3 of max |logit|.
 *
 *   test_cuda mtp MODEL MTP MTP_GOLDEN [--quick]
 *       the MTP block (cuda_mtp.cu), simulations off, against transformers'
 *       MTPBlock logits (tests/reference/mtp_golden.py) within 1e-4 of max
 *       |logit| after prefills of several lengths (rows paired with the
 *       main model's residuals, in one step of many rows and one row at a
 *       time); then greedy generation through the engine with MTP drafts
 *       of 1, 2 and 4 tokens (verified in one batched step, rejected rows
 *       rewound) hands out the tokens plain decoding does, for prompts
 *       whose generation crosses the prefill / decode boundary and the
 *       ratio-4 and ratio-128 window ends.  --quick: a prefill of 24 and
 *       its 24 rows (12 in one step, 12 one at a time; the last, whose
 *       window the block holds whole, compares), drafts of 2 for 8 tokens
 *       after 122 (across a ratio-4 window's end and the ratio-128 one's
 *       at 127).
 *   test_cuda steer MODEL [--prompt N] [--steps N]
 *       directional steering against the CPU's (cmd_steer), simulations off.
 *   test_cuda batch MODEL [--no-sim] [--sessions N] [--steps N] [--snap-at N]
 *                         [--prompt-max N] [--tol X]
 *       N sessions (8 by default) with prompts of different lengths (3 to
 *       --prompt-max, 63 by default) and tokens, as sequences of one
 *       backend: one step takes every prompt
 *       (rows of every sequence: a prefill of each), then --steps steps
 *       of one row per session (each at its own position); the main
 *       sequence is one of them.  Against each session run alone (the
 *       main sequence of another backend: prefill, then the decode graph):
 *       the same greedy token at every step (the first batched decode
 *       step a pass of one-row parts, the others the captured batched
 *       decode graph), and every logit within
 *       max |d| <= 1e-3 max |logit| (the CUDA products round a row
 *       differently in a pass of more rows: docs/DESIGN.md 7).  At step
 *       --snap-at (half the steps by default) one session's snapshot,
 *       taken mid-batch, is its solo snapshot's (tokens, logits, every
 *       live row of the state within the same bound), and restored alone
 *       it goes on as the solo run does.  Then a step with a rewindable
 *       draft of one session beside the others' rows (the decoders through
 *       the graph, the draft in a pass of its own), taken back.  --tol: the
 *       bound (1e-3) for models whose products quantize their activations
 *       (a 1e-6 difference of a row may round an int8 value the other way:
 *       the same greedy tokens, ~1 % of the largest logit).
 *
 *   test_cuda tp MODEL [--tp N] [--prompt N] [--steps N] [--chunk N] [--no-sim] [--tol X]
 *       tensor parallelism (--tensor-parallel, ds4_backend_opts
 *       .tensor_parallel: each layer split over N GPUs, 2 by default)
 *       against one GPU: every GPU holds fewer device bytes than the one
 *       GPU; the logits of a prompt prefilled in passes of the chunk
 *       (every row), of decode steps (the captured graphs, with their
 *       all-reduces) fed one GPU's greedy tokens, and of a step of two
 *       sequences within max |d| <= tol * max |logit| with the same argmax
 *       (tol 1e-5 with the simulations off, where only the order of the
 *       sums differs; 1e-3 with them, whose FP8 / FP4 / f16 grids turn
 *       such differences into steps), with the simulations off also the
 *       snapshot's every live row; the device greedy loop's
 *       tokens one GPU's, also from one GPU's snapshot restored into a
 *       fresh group.  Refused, naming why: heads that do not divide among
 *       the GPUs, more GPUs than the process sees, the cpu backend.
 *
 *   test_cuda resize MODEL [--no-sim] [--quick | --long]
 *       sequences resized as they go (ds4_seq_resize): the main sequence
 *       of a backend made with a short main_ctx (its decode graphs captured
 *       again at every resize, over the same contexts: a 128-token graph
 *       and the backend's 512), then a second sequence (eager steps), each
 *       grown when full (the deferred compressor windows holding rows),
 *       shrunk to its tokens and grown again, against the same sequence of
 *       a backend of the whole context fed the same tokens: every logit row
 *       bit for bit, the device greedy loop's tokens, and the DSV4 payload
 *       at the end byte for byte.  A resize below its tokens or beyond the
 *       backend's context is refused, naming them.  --quick: the main
 *       sequence only, 9 decode steps; --long: also across the ratio-128
 *       window's end (127) in a context grown mid-window.
 *
 *   test_cuda stages MODEL [--prompt N] [--steps N] [--chunk N] [--no-sim] [--tol X] [--quick] [--gpus G]
 *       pipeline stages (ds4_backend_opts.layer_first/layer_end, the
 *       backends src/model/dist puts on MPI ranks) chained in one process:
 *       the residuals a stage leaves are the next one's input.  Splits into
 *       2 and 3 CUDA stages - uneven ones (the last layer alone, the first
 *       alone) and ones starting at the first ratio-4 and ratio-128 layers -
 *       against the whole CUDA model and against the same CPU stages: a
 *       prompt of --prompt tokens (120) in passes of --chunk rows (32; every
 *       logit), --steps decode steps (12) fed the CPU's greedy tokens (the
 *       stages' decode graphs), and a step of a second sequence's prompt
 *       beside a decode row (a pass of two sequences).  Each within max |d| <= tol * max
 *       |logit| (1e-3) with the same argmax (so the stages' greedy tokens
 *       are the CPU's), against the CPU stages except at rows where the
 *       whole CUDA model is itself off the CPU (judged by cmd_compare).
 *       Then the stages' snapshots gathered into one whole state (the
 *       first stage's directly, the others' layer slices packed and
 *       unpacked, as the pipeline's ranks send them) are the whole model's
 *       snapshot (tokens, logits, every live row of every layer, within
 *       the same bound), and that whole state restored into fresh stages
 *       goes on as the whole model does.  Each stage allocates less device
 *       memory than the whole model, and what a CUDA stage does not run is
 *       refused, naming it.  --quick: the 3 stages at the ratio-4 and
 *       ratio-128 layers and the last layer alone only.  --gpus G: CUDA
 *       stage k on GPU k % G (ds4_backend_opts.gpu), the chain run by one
 *       thread that calls each stage in turn - every entry point must make
 *       its backend's GPU current (the emulation stops a kernel sent to
 *       another device's stream or given another device's memory).
 *
 *   test_cuda imatrix MODEL [--prompt N] [--chunk N] [--no-split]
 *       importance-matrix collection (ds4_backend_opts.imatrix) on the GPU
 *       against the CPU's: two prompts (N and N / 2 + 3 random tokens, a
 *       reset between them) prefilled in chunks of --chunk, the sums read
 *       back once at the end; the same routed (token, expert) count, and
 *       every entry of the written .dat within 2e-4 of its largest value
 *       with the same ncall.  Also with half the routed experts in host RAM
 *       (streamed to the GPU in prefill) unless --no-split.  Simulations off.
 *
 * Plain C with its own checks (no test framework), so that it builds
 * wherever the CUDA toolkit does.  Exit status 0 only if every check passed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/generate.h"
#include "engine/session.h"
#include "engine/spec.h"
#include "format/gguf.h"
#include "format/imatrix.h"
#include "model/backends.h"
#include "model/imatrix_collect.h"
#include "model/placement.h"
#include "model/steering.h"

#include "check.h"

static void die(const char *what, const ds4_err *err) {
    printf("FAIL: %s: %s\n", what, ds4_err_msg(err));
    exit(1);
}

static uint32_t argmax(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Per-row comparison of n rows of v logits: the largest |got - want| of
 * each row, whether its argmax differs, and the largest |want| overall. */
typedef struct diff {
    uint32_t rows, cap;
    double *row_d;
    bool *row_arg;
    double amax;
} diff;

static void diff_add(diff *d, const float *got, const float *want, uint32_t rows, uint32_t v) {
    if (d->rows + rows > d->cap) {
        d->cap = (d->rows + rows) * 2;
        d->row_d = realloc(d->row_d, d->cap * sizeof(double));
        d->row_arg = realloc(d->row_arg, d->cap * sizeof(bool));
    }
    for (uint32_t r = 0; r < rows; r++) {
        const float *g = got + (size_t)r * v, *w = want + (size_t)r * v;
        double rd = 0;
        for (uint32_t i = 0; i < v; i++) {
            double e = fabs((double)g[i] - (double)w[i]);
            if (!(e <= rd)) rd = e; /* NaN counts as a failure */
            if (fabs(w[i]) > d->amax) d->amax = fabs(w[i]);
        }
        d->row_d[d->rows] = rd;
        d->row_arg[d->rows] = argmax(g, v) != argmax(w, v);
        d->rows++;
    }
}

static void diff_free(diff *d) {
    free(d->row_d);
    free(d->row_arg);
    memset(d, 0, sizeof(*d));
}

static double rel(const diff *d, uint32_t r) { return d->amax > 0 ? d->row_d[r] / d->amax : d->row_d[r]; }

static double diff_max(const diff *d) {
    double m = 0;
    for (uint32_t r = 0; r < d->rows; r++)
        if (!(rel(d, r) <= m)) m = rel(d, r);
    return m;
}

static uint32_t diff_args(const diff *d) {
    uint32_t n = 0;
    for (uint32_t r = 0; r < d->rows; r++) n += d->row_arg[r];
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double diff_median(const diff *d) {
    if (!d->rows) return 0;
    double *v = malloc(d->rows * sizeof(double));
    for (uint32_t r = 0; r < d->rows; r++) v[r] = rel(d, r);
    qsort(v, d->rows, sizeof(double), cmp_double);
    double m = v[d->rows / 2];
    free(v);
    return m;
}

/* Plain check (both sides should compute the same thing). */
static void diff_check(const char *what, const diff *d, double tol) {
    printf("%-34s max|d| = %.3g of max|logit| %.3f; argmax mismatches %u of %u\n", what, diff_max(d), d->amax,
           diff_args(d), d->rows);
    CHECK(diff_max(d) <= tol, "%s: relative difference %.3g exceeds %.1g", what, diff_max(d), tol);
    CHECK(diff_args(d) == 0, "%s: %u rows with a different argmax", what, diff_args(d));
}

/* Strict: every row within tol with the same argmax, except rows where the
 * CPU reference is itself discontinuous: its twin (the same model with
 * one-ulp weight noise) moves there by more than tol / 2 too (a near-tie
 * of an expert or indexer selection of this model at this position). */
static void strict_check(const char *what, const diff *cuda, const diff *twin, const diff *twin2, double tol) {
    uint32_t excused = 0, bad = 0, first_bad = 0;
    for (uint32_t r = 0; r < cuda->rows; r++) {
        if (rel(cuda, r) <= tol && !cuda->row_arg[r]) continue;
        if (rel(twin, r) > tol / 2 || twin->row_arg[r] || rel(twin2, r) > tol / 2 || twin2->row_arg[r]) excused++;
        else if (!bad++) first_bad = r;
    }
    printf("%-34s max|d| = %.3g of max|logit| %.3f; argmax mismatches %u of %u", what, diff_max(cuda), cuda->amax,
           diff_args(cuda), cuda->rows);
    if (excused)
        printf("; %u row(s) at the model's own near-ties (CPU twins move by up to %.3g / %.3g)", excused,
               diff_max(twin), diff_max(twin2));
    printf("\n");
    CHECK(bad == 0, "%s: %u rows beyond %.1g (max %.3g, first: row %u) where the CPU is continuous", what, bad, tol,
          diff_max(cuda), first_bad);
}

/* Loose: CUDA's distance to the CPU against the twin's, as medians over
 * the rows (single maxima of a chaotic difference are noise). */
static void loose_check(const char *what, const diff *cuda, const diff *twin, const diff *twin2, double tol) {
    (void)twin2;
    double mc = diff_median(cuda), mt = diff_median(twin);
    uint32_t ac = diff_args(cuda), at = diff_args(twin);
    printf("%-34s cuda: max %.3g median %.3g rel, %u/%u argmax | CPU twin: max %.3g median %.3g, %u/%u\n", what,
           diff_max(cuda), mc, ac, cuda->rows, diff_max(twin), mt, at, twin->rows);
    CHECK(mc <= (4 * mt > tol ? 4 * mt : tol), "%s: median %.3g relative, the twin %.3g", what, mc, mt);
    CHECK(ac <= 2 * at + 3, "%s: %u argmax mismatches, the twin %u", what, ac, at);
}

/* The CPU's own sensitivity: the model with one-ulp changes, from a copy
 * of the file in memory.  Twin 0: every element of every attn_norm and
 * ffn_norm moved by one ulp (alternately up and down), noise everywhere as
 * another implementation's rounding is; twin 1: a single element
 * (blk.0.attn_norm[7]) one ulp up. */
static ds4_weights *twin_weights(const char *path, const ds4_weights *w, int which, void **buf_out) {
    ds4_err err = {0};
    FILE *f = fopen(path, "rb");
    if (!f) die(path, &err);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)size);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        printf("FAIL: reading %s\n", path);
        exit(1);
    }
    fclose(f);
    for (uint32_t il = 0; il < (which ? 1 : w->cfg.n_layer); il++) {
        const ds4_wt *t[2] = {&w->layers[il].attn_norm, &w->layers[il].ffn_norm};
        for (int k = 0; k < (which ? 1 : 2); k++) {
            size_t off = (size_t)((const uint8_t *)t[k]->data - w->gguf->base);
            for (uint64_t i = which ? 7 : 0; i < (which ? 8 : t[k]->ne[0]); i++) {
                float v;
                memcpy(&v, buf + off + 4 * i, 4);
                v = nextafterf(v, which || (i + il) % 2 ? INFINITY : -INFINITY);
                memcpy(buf + off + 4 * i, &v, 4);
            }
        }
    }
    ds4_gguf *g = ds4_gguf_open_buffer(buf, (size_t)size, "twin", &err);
    ds4_weights *n = g ? ds4_weights_from_gguf(g, &err) : NULL;
    if (!n) die("twin", &err);
    *buf_out = buf;
    return n;
}

static ds4_backend *make(const char *name, const ds4_weights *w, uint32_t ctx, uint32_t chunk, bool no_sim,
                         uint32_t graph_ctx) {
    ds4_err err = {0};
    ds4_backend_opts o = {.ctx_size = ctx, .prefill_chunk = chunk, .no_sim = no_sim, .cuda_graph_ctx = graph_ctx};
    ds4_backend *b = ds4_backend_create(name, w, &o, &err);
    if (!b) die(name, &err);
    return b;
}

static float *xmalloc(size_t n) {
    float *p = malloc(n ? n : 1);
    if (!p) {
        printf("FAIL: out of memory\n");
        exit(1);
    }
    return p;
}

/* Move a state from one backend to another through a DSV4 file. */
static void move_state(ds4_backend *from, ds4_backend *to, const char *path) {
    ds4_err err = {0};
    ds4_kv_state *s = ds4_backend_state_new(from, &err);
    if (!s || ds4_backend_snapshot(from, s, &err) || ds4_kv_state_save_file(s, path, &err)) die("snapshot", &err);
    ds4_kv_state *t = ds4_backend_state_new(to, &err);
    if (!t || ds4_kv_state_load_file(t, path, &err) || ds4_backend_restore(to, t, &err)) die("restore", &err);
    ds4_kv_state_free(s);
    ds4_kv_state_free(t);
    unlink(path);
}

static int cmd_compare(int argc, char **argv) {
    if (argc < 1) return 2;
    const char *path = argv[0];
    uint32_t n = 300, steps = 500, chunk = 0, seed = 1, graph_ctx = 0;
    bool no_sim = false, loose = false;
    double tol = 1e-3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) {
            no_sim = true;
            continue;
        }
        if (!strcmp(argv[i], "--loose")) {
            loose = true;
            continue;
        }
        if (i + 1 >= argc) return 2;
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--prompt")) n = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--steps")) steps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--chunk")) chunk = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--seed")) seed = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--tol")) tol = strtod(v, NULL);
        else if (!strcmp(argv[i - 1], "--graph-ctx")) graph_ctx = (uint32_t)strtoul(v, NULL, 10);
        else return 2;
    }
    if (steps < 4) {
        printf("test_cuda compare: --steps %u: at least 4 (the state hand-over checks take two of the second half)\n",
               steps);
        return 2;
    }
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) die(path, &err);
    void *twin_buf = NULL, *twin2_buf = NULL;
    ds4_weights *tw = twin_weights(path, w, 0, &twin_buf), *tw2 = twin_weights(path, w, 1, &twin2_buf);
    uint32_t V = w->cfg.n_vocab, ctx = n + steps + 8;
    printf("%s: %u-token prompt, %u decode steps, simulations %s, %s check, tolerance %g\n", path, n, steps,
           no_sim ? "off" : "on", loose ? "loose" : "strict", tol);
    uint32_t *toks = malloc((n + steps + 1) * sizeof(uint32_t));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (uint32_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (uint32_t)(s >> 33) % V;
    }
    void (*check)(const char *, const diff *, const diff *, const diff *, double) = loose ? loose_check : strict_check;

    ds4_backend *cpu = make("cpu", w, ctx, 0, no_sim, 0), *twin = make("cpu", tw, ctx, 0, no_sim, 0);
    ds4_backend *twin2 = make("cpu", tw2, ctx, 0, no_sim, 0);
    ds4_backend *gpu = make("cuda", w, ctx, chunk, no_sim, graph_ctx);
    float *lc = xmalloc((size_t)n * V * 4), *lg = xmalloc((size_t)n * V * 4), *lt = xmalloc((size_t)n * V * 4);
    float *lt2 = xmalloc((size_t)n * V * 4);
    if (ds4_backend_prefill(cpu, toks, n, lc, &err)) die("cpu prefill", &err);
    if (ds4_backend_prefill(twin, toks, n, lt, &err)) die("twin prefill", &err);
    if (ds4_backend_prefill(twin2, toks, n, lt2, &err)) die("twin prefill", &err);
    if (ds4_backend_prefill(gpu, toks, n, lg, &err)) die("cuda prefill", &err);
    diff dg = {0}, dt = {0}, dt2 = {0};
    diff_add(&dg, lg, lc, n, V);
    diff_add(&dt, lt, lc, n, V);
    diff_add(&dt2, lt2, lc, n, V);
    check("prefill, every position", &dg, &dt, &dt2, tol);
    diff_free(&dg);
    diff_free(&dt);
    diff_free(&dt2);

    /* the same prompt in uneven chunks of 37: the chunk boundaries must not
     * change the result beyond rounding (against the one-chunk CUDA run) */
    ds4_backend *gpu2 = make("cuda", w, ctx, 37, no_sim, graph_ctx);
    if (ds4_backend_prefill(gpu2, toks, n, NULL, &err)) die("cuda chunked prefill", &err);
    diff_add(&dg, ds4_backend_logits(gpu2), lg + (size_t)(n - 1) * V, 1, V);
    diff_add(&dt, lt + (size_t)(n - 1) * V, lc + (size_t)(n - 1) * V, 1, V);
    diff_add(&dt2, lt2 + (size_t)(n - 1) * V, lc + (size_t)(n - 1) * V, 1, V);
    check("chunks of 37 vs one chunk, last", &dg, &dt, &dt2, tol);
    diff_free(&dg);
    diff_free(&dt);
    diff_free(&dt2);

    /* snapshot after the prompt, for the greedy run below */
    ds4_kv_state *after_prompt = ds4_backend_state_new(gpu, &err);
    if (!after_prompt || ds4_backend_snapshot(gpu, after_prompt, &err)) die("snapshot", &err);

    /* decode: the CPU picks greedy tokens, everyone is fed them */
    float *dc = xmalloc((size_t)steps * V * 4), *dgl = xmalloc((size_t)steps * V * 4),
          *dtl = xmalloc((size_t)steps * V * 4);
    float *dtl2 = xmalloc((size_t)steps * V * 4);
    uint32_t *greedy = toks + n;
    uint32_t half = steps / 2;
    const char *tmp = "test_cuda.dsv4";
    for (uint32_t i = 0; i < steps; i++) {
        greedy[i] = argmax(ds4_backend_logits(cpu), V);
        if (ds4_backend_decode(cpu, greedy[i], &err)) die("cpu decode", &err);
        if (ds4_backend_decode(gpu, greedy[i], &err)) die("cuda decode", &err);
        if (ds4_backend_decode(twin, greedy[i], &err)) die("twin decode", &err);
        if (ds4_backend_decode(twin2, greedy[i], &err)) die("twin decode", &err);
        memcpy(dc + (size_t)i * V, ds4_backend_logits(cpu), V * 4);
        memcpy(dgl + (size_t)i * V, ds4_backend_logits(gpu), V * 4);
        memcpy(dtl + (size_t)i * V, ds4_backend_logits(twin), V * 4);
        memcpy(dtl2 + (size_t)i * V, ds4_backend_logits(twin2), V * 4);
        if (i + 1 == half) move_state(cpu, gpu2, tmp); /* DSV4: CPU -> CUDA mid-sequence */
    }
    diff_add(&dg, dgl, dc, steps, V);
    diff_add(&dt, dtl, dc, steps, V);
    diff_add(&dt2, dtl2, dc, steps, V);
    check("decode, fed the CPU's tokens", &dg, &dt, &dt2, tol);
    diff_free(&dg);
    diff_free(&dt);
    diff_free(&dt2);

    /* a prefill after the decode steps (a conversation's next turn): the
     * CUDA backend first folds what the steps left in its compressors'
     * windows (cu_comp_flush), then pools the windows this pass closes */
    enum { MORE = 6 }; /* within the context's 8 spare tokens */
    ds4_backend *after[4] = {cpu, gpu, twin, twin2};
    float *ml[4];
    for (int b = 0; b < 4; b++) {
        ml[b] = xmalloc((size_t)MORE * V * 4);
        if (ds4_backend_prefill(after[b], toks, MORE, ml[b], &err)) die("prefill after decode", &err);
    }
    diff_add(&dg, ml[1], ml[0], MORE, V);
    diff_add(&dt, ml[2], ml[0], MORE, V);
    diff_add(&dt2, ml[3], ml[0], MORE, V);
    check("prefill after the decode steps", &dg, &dt, &dt2, tol);
    diff_free(&dg);
    diff_free(&dt);
    diff_free(&dt2);
    for (int b = 0; b < 4; b++) free(ml[b]);

    /* CPU -> CUDA: gpu2 continues from the CPU's state at `half` for `seg`
     * steps, then a fresh CPU backend from gpu2's state for `seg` more */
    uint32_t seg = (steps - half) / 2 < 16 ? (steps - half) / 2 : 16;
    for (uint32_t i = half; i < half + seg; i++) {
        if (ds4_backend_decode(gpu2, greedy[i], &err)) die("cuda decode after restore", &err);
        diff_add(&dg, ds4_backend_logits(gpu2), dc + (size_t)i * V, 1, V);
        diff_add(&dt, dtl + (size_t)i * V, dc + (size_t)i * V, 1, V);
        diff_add(&dt2, dtl2 + (size_t)i * V, dc + (size_t)i * V, 1, V);
    }
    check("CPU state restored on CUDA", &dg, &dt, &dt2, tol);
    diff_free(&dg);
    diff_free(&dt);
    diff_free(&dt2);

    /* CUDA -> CPU: a fresh CPU backend continues from gpu2's state */
    ds4_backend *cpu2 = make("cpu", w, ctx, 0, no_sim, 0);
    move_state(gpu2, cpu2, tmp);
    for (uint32_t i = half + seg; i < half + 2 * seg; i++) {
        if (ds4_backend_decode(cpu2, greedy[i], &err)) die("cpu decode after restore", &err);
        diff_add(&dg, ds4_backend_logits(cpu2), dc + (size_t)i * V, 1, V);
        diff_add(&dt, dtl + (size_t)i * V, dc + (size_t)i * V, 1, V);
        diff_add(&dt2, dtl2 + (size_t)i * V, dc + (size_t)i * V, 1, V);
    }
    check("CUDA state restored on the CPU", &dg, &dt, &dt2, tol);
    diff_free(&dg);
    diff_free(&dt);
    diff_free(&dt2);

    /* greedy on the device from the snapshot after the prompt */
    uint32_t *gen = malloc(steps * sizeof(uint32_t));
    if (ds4_backend_restore(gpu, after_prompt, &err) || ds4_backend_greedy(gpu, steps, gen, &err))
        die("cuda greedy", &err);
    uint32_t first_bad = steps;
    for (uint32_t i = 0; i < steps && first_bad == steps; i++)
        if (gen[i] != greedy[i]) first_bad = i;
    if (first_bad == steps) printf("%-34s identical (%u tokens)\n", "greedy tokens on the device", steps);
    else printf("%-34s first differs at %u of %u\n", "greedy tokens on the device", first_bad, steps);
    if (!loose) {
        CHECK(first_bad == steps, "greedy token %u: cuda %u, cpu %u", first_bad, gen[first_bad], greedy[first_bad]);
        if (first_bad == steps) {
            diff_add(&dg, ds4_backend_logits(gpu), dc + (size_t)(steps - 1) * V, 1, V);
            diff_check("logits after the greedy run", &dg, tol);
            diff_free(&dg);
        }
    }

    free(gen);
    ds4_kv_state_free(after_prompt);
    ds4_backend_free(cpu2);
    ds4_backend_free(gpu2);
    ds4_backend_free(gpu);
    ds4_backend_free(twin);
    ds4_backend_free(twin2);
    ds4_backend_free(cpu);
    free(dc);
    free(dgl);
    free(dtl);
    free(dtl2);
    free(lc);
    free(lg);
    free(lt);
    free(lt2);
    free(toks);
    ds4_weights_close(tw);
    ds4_weights_close(tw2);
    free(twin_buf);
    free(twin2_buf);
    ds4_weights_close(w);
    return 0;
}

/* tests/golden/cpu/NAME.golden: "DS4G", u32 version, count, vocab, tokens,
 * prefill logits, decode logits. */
static int cmd_golden(int argc, char **argv) {
    if (argc != 2 && argc != 3) return 2;
    FILE *f = fopen(argv[1], "rb");
    char magic[4];
    uint32_t h[3];
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "DS4G", 4) || fread(h, 4, 3, f) != 3 || h[0] != 1) {
        printf("FAIL: cannot read golden %s\n", argv[1]);
        return 1;
    }
    uint32_t n = h[1], V = h[2];
    uint32_t *toks = malloc(n * 4);
    float *pre = xmalloc((size_t)n * V * 4), *dec = xmalloc((size_t)n * V * 4), *got = xmalloc((size_t)n * V * 4);
    if (fread(toks, 4, n, f) != n || fread(pre, 4, (size_t)n * V, f) != (size_t)n * V ||
        fread(dec, 4, (size_t)n * V, f) != (size_t)n * V) {
        printf("FAIL: golden %s truncated\n", argv[1]);
        return 1;
    }
    fclose(f);
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(argv[0], &err);
    if (!w) die(argv[0], &err);
    ds4_backend *b = make("cuda", w, 1024, 0, true, 0);
    if (ds4_backend_prefill(b, toks, n, got, &err)) die("prefill", &err);
    diff d = {0};
    diff_add(&d, got, pre, n, V);
    diff_check("HF golden, prefill", &d, 1e-4);
    diff_free(&d);
    ds4_backend_reset(b);
    uint32_t nd = argc == 3 ? (uint32_t)strtoul(argv[2], NULL, 10) : n;
    if (nd > n) nd = n;
    for (uint32_t i = 0; i < nd; i++) {
        if (ds4_backend_decode(b, toks[i], &err)) die("decode", &err);
        memcpy(got + (size_t)i * V, ds4_backend_logits(b), V * 4);
    }
    diff_add(&d, got, dec, nd, V);
    diff_check("HF golden, decode", &d, 1e-4);
    diff_free(&d);
    ds4_backend_free(b);
    ds4_weights_close(w);
    free(toks);
    free(pre);
    free(dec);
    free(got);
    return 0;
}

/* The DSV4 payload of a backend's state, in memory. */
static char *payload(ds4_backend *b, size_t *len) {
    ds4_err err = {0};
    ds4_kv_state *st = ds4_backend_state_new(b, &err);
    if (!st || ds4_backend_snapshot(b, st, &err)) die("snapshot", &err);
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f || ds4_kv_state_save(st, f, &err)) die("payload", &err);
    fclose(f);
    ds4_kv_state_free(st);
    return buf;
}

/* A rewindable step of m rows after the state `at` (the first k rows
 * right, the others the right tokens xor `wrong`), taken back to the right
 * rows; returns the logits of the step's rows (m x V) in lg. */
static void step_and_rewind(ds4_backend *b, const ds4_kv_state *at, const uint32_t *tok, uint32_t m, uint32_t k,
                            uint32_t wrong, float *lg) {
    ds4_err err = {0};
    uint32_t n0 = at->n_tokens;
    ds4_row rows[DS4_REWIND_MAX];
    if (ds4_backend_restore(b, at, &err) || ds4_backend_mark(b, b->main, &err)) die("restore", &err);
    for (uint32_t i = 0; i < m; i++)
        rows[i] = ds4_row_of(b->main, tok[n0 + i] ^ (i >= k ? wrong : 0), DS4_ROW_LOGITS | DS4_ROW_REWIND);
    ds4_step_out out = {lg, NULL};
    if (ds4_backend_step(b, rows, m, &out, &err)) die("step", &err);
    if (ds4_backend_rewind(b, b->main, n0 + k, &err)) die("rewind", &err);
}

/* test_cuda rewind MODEL [--no-sim]: rewindable steps of m rows after n0
 * tokens, the first k right and the others wrong, taken back to n0 + k.
 * Two backends whose wrong rows differ end in byte-identical states (the
 * rejected rows leave no trace: the kept rows went through the same
 * kernels in both); the kept rows' logits, and the logits of three decode
 * steps after the rewind, are the CPU reference's within the strict
 * tolerance (the state is the right one, not merely a repeatable one).
 * The CUDA products are not batch-invariant to the bit (a pass of 2 rows
 * and a pass of 1 can round a row's product differently), so the state
 * after a rewind is compared with a never-rewound one through the CPU. */
static int cmd_rewind(int argc, char **argv) {
    if (argc < 1) return 2;
    bool no_sim = false, quick = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) no_sim = true;
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else return 2;
    }
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(argv[0], &err);
    if (!w) die(argv[0], &err);
    uint32_t V = w->cfg.n_vocab, N = 300;
    uint32_t *tok = malloc(N * sizeof(uint32_t));
    uint32_t s = 4242;
    for (uint32_t i = 0; i < N; i++) tok[i] = ((s = s * 1103515245u + 12345u) >> 8) % V;
    ds4_backend *cpu = make("cpu", w, 512, 0, no_sim, 0), *b = make("cuda", w, 512, 0, no_sim, 0),
                *r = make("cuda", w, 512, 0, no_sim, 0);
    float *want = xmalloc((size_t)N * V * 4), *lg = xmalloc((size_t)DS4_REWIND_MAX * V * 4),
          *lg2 = xmalloc((size_t)DS4_REWIND_MAX * V * 4), *dec = xmalloc((size_t)3 * V * 4);
    if (ds4_backend_prefill(cpu, tok, N, want, &err)) die("cpu prefill", &err);
    ds4_kv_state *at = ds4_backend_state_new(b, &err);
    if (!at) die("state", &err);
    /* before and at the ratio-4 and ratio-128 windows' ends (127, 255) */
    const uint32_t n0s[] = {5, 126, 253}, ms[] = {2, 5, 17};
    /* quick: a step longer than a 16-row window, across a ratio-4 window's
     * end, taken back to its first row and to all but its last */
    for (size_t a = quick ? 1 : 0; a < (quick ? 2 : sizeof(n0s) / sizeof(n0s[0])); a++) {
        uint32_t n0 = n0s[a];
        ds4_backend_reset(b);
        if (ds4_backend_prefill(b, tok, n0, NULL, &err) || ds4_backend_snapshot(b, at, &err)) die("prefill", &err);
        for (size_t c = quick ? 2 : 0; c < sizeof(ms) / sizeof(ms[0]); c++) {
            uint32_t m = ms[c];
            const uint32_t ks[] = {0, 1, m - 1};
            for (size_t e = quick ? 1 : 0; e < sizeof(ks) / sizeof(ks[0]); e++) {
                uint32_t k = ks[e];
                char what[96];
                snprintf(what, sizeof(what), "step of %u rows after %u taken back to %u", m, n0, n0 + k);
                step_and_rewind(b, at, tok, m, k, 1, lg);
                step_and_rewind(r, at, tok, m, k, 2, lg2);
                size_t la, lb;
                char *pa = payload(b, &la), *pb = payload(r, &lb);
                CHECK(la == lb && !memcmp(pa, pb, la), "%s: the payload depends on the rejected rows", what);
                free(pa);
                free(pb);
                diff d = {0};
                if (k) diff_add(&d, lg, want + (size_t)n0 * V, k, V);
                for (uint32_t q = 0; q < 3; q++) {
                    if (ds4_backend_decode(b, tok[n0 + k + q], &err)) die("decode", &err);
                    memcpy(dec + (size_t)q * V, ds4_backend_logits(b), V * 4);
                }
                diff_add(&d, dec, want + (size_t)(n0 + k) * V, 3, V);
                diff_check(what, &d, 1e-3);
                diff_free(&d);
            }
        }
    }
    ds4_kv_state_free(at);
    ds4_backend_free(cpu);
    ds4_backend_free(b);
    ds4_backend_free(r);
    ds4_weights_close(w);
    free(tok);
    free(want);
    free(lg);
    free(lg2);
    free(dec);
    return 0;
}

/* Largest |a - b| of n floats relative to the largest |b| (the empty
 * frontier slots, DS4_SCORE_NEG_INF, must be empty in both). */
static double state_rel(const float *a, const float *b, size_t n, bool *slots_differ) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        bool ea = a[i] <= -1e29f, eb = b[i] <= -1e29f;
        if (ea != eb) *slots_differ = true;
        if (ea || eb) continue;
        double x = fabs((double)a[i] - b[i]);
        if (x > d) d = x;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / m;
}

/* A snapshot against another: tokens and logits, and every live row of
 * every layer's state within tol (relative to the array's largest value). */
static void state_check(const char *what, const ds4_kv_state *got, const ds4_kv_state *want, double tol) {
    const ds4_config *c = want->cfg;
    CHECK(got->n_tokens == want->n_tokens, "%s: %u tokens, want %u", what, got->n_tokens, want->n_tokens);
    if (got->n_tokens != want->n_tokens) return;
    uint32_t n = want->n_tokens;
    CHECK(!memcmp(got->tokens, want->tokens, n * sizeof(uint32_t)), "%s: tokens differ", what);
    CHECK(got->has_logits == want->has_logits, "%s: logits present in one only", what);
    double worst = 0;
    bool slots = false;
    if (want->has_logits) worst = state_rel(got->logits, want->logits, c->n_vocab, &slots);
    for (uint32_t il = 0; il < c->n_layer; il++) {
        const ds4_layer_state *g = &got->layers[il], *w = &want->layers[il];
        uint32_t live = n < want->raw_cap ? n : want->raw_cap; /* ring slots written */
        double r = state_rel(g->raw, w->raw, (size_t)live * c->head_dim, &slots);
        if (r > worst) worst = r;
        if (!w->ratio) continue;
        size_t fr = (size_t)ds4_state_frontier_rows(w->ratio) * ds4_state_frontier_width(c, w->ratio, false);
        double parts[4] = {state_rel(g->comp, w->comp, (size_t)(n / w->ratio) * c->head_dim, &slots),
                           state_rel(g->comp_kv, w->comp_kv, fr, &slots),
                           state_rel(g->comp_score, w->comp_score, fr, &slots), 0};
        if (w->ratio == 4) {
            size_t ifr = (size_t)ds4_state_frontier_rows(4) * ds4_state_frontier_width(c, 4, true);
            double i1 = state_rel(g->idx, w->idx, (size_t)(n / 4) * c->idx_head_dim, &slots);
            double i2 = state_rel(g->idx_kv, w->idx_kv, ifr, &slots),
                   i3 = state_rel(g->idx_score, w->idx_score, ifr, &slots);
            parts[3] = i1 > i2 ? (i1 > i3 ? i1 : i3) : (i2 > i3 ? i2 : i3);
        }
        for (int k = 0; k < 4; k++)
            if (parts[k] > worst) worst = parts[k];
    }
    printf("%s: max relative |d| %.2e over the live state\n", what, worst);
    CHECK(!slots, "%s: empty frontier slots differ", what);
    CHECK(worst <= tol, "%s: the state differs by %.2e (tolerance %.0e)", what, worst, tol);
}

/* test_cuda batch MODEL [--no-sim] [--sessions N] [--steps N] [--snap-at N] [--prompt-max N] [--tol X] [--exact]
 * --exact: the batched steps' logits bit for bit those of each session alone */
static int cmd_batch(int argc, char **argv) {
    if (argc < 1) return 2;
    bool no_sim = false, exact = false;
    uint32_t N = 8, S = 8, snap_at = UINT32_MAX, pmax = 63;
    double tol = 1e-3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) no_sim = true;
        else if (!strcmp(argv[i], "--sessions") && i + 1 < argc) N = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) S = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--snap-at") && i + 1 < argc) snap_at = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt-max") && i + 1 < argc) pmax = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tol") && i + 1 < argc) tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--exact")) exact = true;
        else return 2;
    }
    if (N < 2 || S < 2 || pmax < 4 || !(tol > 0)) return 2;
    if (snap_at > S) snap_at = S / 2;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(argv[0], &err);
    if (!w) die(argv[0], &err);
    uint32_t V = w->cfg.n_vocab;
    /* prompts of 3 + 11 k mod (pmax - 2) tokens, of their own tokens */
    uint32_t *plen = calloc(N, sizeof(uint32_t)), total = 0, maxlen = 0;
    uint32_t **tok = calloc(N, sizeof(uint32_t *));
    uint32_t rs = 777;
    for (uint32_t k = 0; k < N; k++) {
        plen[k] = 3 + (11 * k) % (pmax - 2);
        tok[k] = malloc((plen[k] + S + 1) * sizeof(uint32_t));
        for (uint32_t i = 0; i < plen[k]; i++) tok[k][i] = ((rs = rs * 1103515245u + 12345u) >> 8) % V;
        total += plen[k];
        if (plen[k] > maxlen) maxlen = plen[k];
    }
    uint32_t ctx = maxlen + S + 8, chunk = total > N ? total : N;
    /* alone: each session the main sequence of its own run; its logits
     * after the prompt and after each of S greedy tokens */
    ds4_backend *solo = make("cuda", w, ctx, chunk, no_sim, 0);
    float *want = xmalloc((size_t)N * (S + 1) * V * 4);
    ds4_kv_state *solo_snap = ds4_backend_state_new(solo, &err), *bat_snap = ds4_backend_state_new(solo, &err);
    if (!solo_snap || !bat_snap) die("state", &err);
    uint32_t snap_k = N / 2 - 1 + (N > 2); /* a sequence other than the main one */
    for (uint32_t k = 0; k < N; k++) {
        ds4_backend_reset(solo);
        if (ds4_backend_prefill(solo, tok[k], plen[k], NULL, &err)) die("solo prefill", &err);
        for (uint32_t t = 0;; t++) {
            const float *l = ds4_backend_logits(solo);
            if (!l) die("solo logits", &err);
            memcpy(want + ((size_t)k * (S + 1) + t) * V, l, V * 4);
            if (k == snap_k && t == snap_at && ds4_backend_snapshot(solo, solo_snap, &err)) die("solo snapshot", &err);
            if (t == S) break;
            tok[k][plen[k] + t] = argmax(l, V);
            if (ds4_backend_decode(solo, tok[k][plen[k] + t], &err)) die("solo decode", &err);
        }
    }
    ds4_row *rows = calloc(total, sizeof(ds4_row));
    float *got = xmalloc((size_t)N * V * 4), *hid = xmalloc((size_t)N * w->cfg.n_hc * w->cfg.n_embd * 4);
    /* every prompt in one pass of N parts, as a server's chunk holds them:
     * its rows take the products of a pass of that many rows, where a
     * prompt alone of at most CU_FEW_PASS tokens takes the few-token
     * plans, which round differently (~1e-6 of the largest logit); with
     * int8 activations that can move an expert's selection, so the
     * prompts' logits are held to the tolerance and nothing goes on from
     * them */
    {
        ds4_backend *pb = make("cuda", w, ctx, chunk, no_sim, 0);
        ds4_seq **ps = calloc(N, sizeof(ds4_seq *));
        ps[0] = pb->main;
        for (uint32_t k = 1; k < N; k++)
            if (!(ps[k] = ds4_seq_new(pb, ctx, &err))) die("seq_new", &err);
        uint32_t n = 0;
        for (uint32_t k = 0; k < N; k++)
            for (uint32_t i = 0; i < plen[k]; i++)
                rows[n++] = ds4_row_of(ps[k], tok[k][i], i + 1 == plen[k] ? DS4_ROW_LOGITS : 0);
        if (ds4_backend_step(pb, rows, n, &(ds4_step_out){got, NULL}, &err)) die("the prompts' pass", &err);
        diff d = {0};
        for (uint32_t k = 0; k < N; k++) diff_add(&d, got + (size_t)k * V, want + (size_t)k * (S + 1) * V, 1, V);
        printf("%u prompts of 3 to %u tokens in one pass: ", N, maxlen);
        diff_check("against alone", &d, tol);
        diff_free(&d);
        for (uint32_t k = 1; k < N; k++) ds4_seq_free(pb, ps[k]);
        free(ps);
        ds4_backend_free(pb);
    }
    /* batched: session 0 is the main sequence, the others new ones, each
     * prompt a pass of its own (as alone), then S steps of one row of each */
    ds4_backend *b = make("cuda", w, ctx, chunk, no_sim, 0);
    ds4_seq **seq = calloc(N, sizeof(ds4_seq *));
    seq[0] = b->main;
    for (uint32_t k = 1; k < N; k++)
        if (!(seq[k] = ds4_seq_new(b, ctx, &err))) die("seq_new", &err);
    diff d = {0};
    uint32_t wrong = 0;
    for (uint32_t t = 0; t <= S; t++) {
        uint32_t n = 0;
        if (t == 0) {
            for (uint32_t k = 0; k < N; k++) {
                for (n = 0; n < plen[k]; n++) rows[n] = ds4_row_of(seq[k], tok[k][n], n + 1 == plen[k] ? DS4_ROW_LOGITS : 0);
                if (ds4_backend_step(b, rows, n, &(ds4_step_out){got + (size_t)k * V, NULL}, &err)) die("prompt", &err);
            }
        } else {
            /* step 1 also asks for the hidden states: a pass of one-row parts, not the graph */
            for (uint32_t k = 0; k < N; k++)
                rows[n++] = ds4_row_of(seq[k], tok[k][plen[k] + t - 1], DS4_ROW_LOGITS | (t == 1 ? DS4_ROW_HIDDEN : 0));
            ds4_step_out out = {got, t == 1 ? hid : NULL};
            if (ds4_backend_step(b, rows, n, &out, &err)) die("batched step", &err);
        }
        for (uint32_t k = 0; k < N; k++) {
            const float *wl = want + ((size_t)k * (S + 1) + t) * V;
            diff_add(&d, got + (size_t)k * V, wl, 1, V);
            /* the sequence's own logits are the step's row */
            const float *sl = ds4_seq_logits(b, seq[k]);
            CHECK(sl && !memcmp(sl, got + (size_t)k * V, V * 4), "session %u, step %u: ds4_seq_logits is not the row's",
                  k, t);
            if (argmax(got + (size_t)k * V, V) != argmax(wl, V)) wrong++;
        }
        if (t == snap_at) {
            char what[96];
            snprintf(what, sizeof(what), "session %u's snapshot after step %u (mid-batch)", snap_k, t);
            if (ds4_seq_snapshot(b, seq[snap_k], bat_snap, &err)) die("batched snapshot", &err);
            state_check(what, bat_snap, solo_snap, tol);
        }
    }
    printf("%u sessions (prompts of 3 to %u tokens), %u batched steps: ", N, maxlen, S);
    diff_check("batched against alone", &d, tol);
    CHECK(!exact || diff_max(&d) == 0, "batched against alone: not bit for bit (--exact)");
    /* where a failure is: the first rows beyond the tolerance (step 0: the
     * prompts) */
    for (uint32_t r = 0, shown = 0; r < d.rows && shown < 8; r++)
        if (!(rel(&d, r) <= tol)) {
            printf("  step %u, session %u (a prompt of %u tokens): max|d| = %.3g of max|logit|%s\n", r / N, r % N,
                   plen[r % N], rel(&d, r), d.row_arg[r] ? ", another argmax" : "");
            shown++;
        }
    CHECK(wrong == 0, "%u greedy tokens differ from the sessions' alone", wrong);
    diff_free(&d);
    /* the mid-batch snapshot restored alone goes on as the solo run */
    {
        diff r = {0};
        ds4_backend_reset(solo);
        if (ds4_backend_restore(solo, bat_snap, &err)) die("restore", &err);
        for (uint32_t t = snap_at; t < S; t++) {
            if (ds4_backend_decode(solo, tok[snap_k][plen[snap_k] + t], &err)) die("decode", &err);
            diff_add(&r, ds4_backend_logits(solo), want + ((size_t)snap_k * (S + 1) + t + 1) * V, 1, V);
        }
        if (r.rows) diff_check("the mid-batch snapshot restored alone", &r, tol);
        diff_free(&r);
    }
    /* a rewindable draft of 3 rows of session 1 beside one row of each
     * other, taken back to its first: session 1 then goes on as before */
    {
        ds4_seq *q = seq[1];
        uint32_t n0 = ds4_seq_len(b, q), n = 0;
        if (ds4_backend_mark(b, q, &err)) die("mark", &err);
        for (uint32_t k = 0; k < N; k++) {
            if (k == 1)
                for (uint32_t i = 0; i < 3; i++)
                    rows[n++] = ds4_row_of(q, (17 + 5 * i) % V, DS4_ROW_LOGITS | DS4_ROW_REWIND);
            else rows[n++] = ds4_row_of(seq[k], 3 + k, 0);
        }
        if (ds4_backend_step(b, rows, n, &(ds4_step_out){got, NULL}, &err)) die("step with a draft", &err);
        if (ds4_backend_rewind(b, q, n0, &err)) die("rewind", &err);
        CHECK(ds4_seq_len(b, q) == n0, "rewind: %u tokens, want %u", ds4_seq_len(b, q), n0);
        const float *l = ds4_seq_logits(b, q);
        diff r = {0};
        diff_add(&r, l, want + ((size_t)1 * (S + 1) + S) * V, 1, V);
        diff_check("a draft beside other sessions' rows, taken back", &r, tol);
        diff_free(&r);
    }
    for (uint32_t k = 1; k < N; k++) ds4_seq_free(b, seq[k]);
    for (uint32_t k = 0; k < N; k++) free(tok[k]);
    ds4_kv_state_free(solo_snap);
    ds4_kv_state_free(bat_snap);
    ds4_backend_free(b);
    ds4_backend_free(solo);
    ds4_weights_close(w);
    free(tok);
    free(plen);
    free(seq);
    free(rows);
    free(got);
    free(hid);
    free(want);
    return 0;
}

/* One side of cmd_resize: a backend and the sequence it resizes (or, the
 * reference, never does). */
typedef struct resize_side {
    ds4_backend *b;
    ds4_seq *s;
    bool resizes;
} resize_side;

/* The script's step on both sides: the same tokens, then the logits bit
 * for bit.  op: 'p' prefill n tokens from tok + at, 'd' n decode steps,
 * 'r' resize the resizing side to n tokens, 'g' n greedy tokens. */
static void resize_step(resize_side *sd, const uint32_t *tok, uint32_t *at, char op, uint32_t n, uint32_t V,
                        const char *what) {
    ds4_err err = {0};
    uint32_t got[2][16];
    const float *l[2];
    for (int k = 0; k < 2; k++) {
        ds4_backend *b = sd[k].b;
        ds4_seq *s = sd[k].s;
        int rc = 0;
        if (op == 'r') rc = sd[k].resizes ? ds4_seq_resize(b, s, n, &err) : 0;
        else if (op == 'p') rc = ds4_seq_prefill(b, s, tok + *at, n, NULL, &err);
        else if (op == 'g') rc = ds4_seq_greedy(b, s, n, got[k], &err);
        else
            for (uint32_t i = 0; i < n && !rc; i++) rc = ds4_seq_decode(b, s, tok[*at + i], &err);
        if (rc) die(what, &err);
        l[k] = ds4_seq_logits(b, s);
    }
    if (op != 'r') *at += n;
    if (op == 'g') CHECK(!memcmp(got[0], got[1], n * sizeof(uint32_t)), "%s: greedy tokens differ at %u", what, *at);
    CHECK(l[0] && l[1] && !memcmp(l[0], l[1], V * sizeof(float)), "%s: logits differ after %u tokens (op %c %u)", what,
          *at, op, n);
}

/* The DSV4 payload of a sequence, in memory. */
static char *seq_payload(ds4_backend *b, ds4_seq *s, size_t *len) {
    ds4_err err = {0};
    ds4_kv_state *st = ds4_backend_state_new(b, &err);
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!st || ds4_seq_snapshot(b, s, st, &err) || ds4_kv_state_save(st, f, &err)) die("payload", &err);
    fclose(f);
    ds4_kv_state_free(st);
    return buf;
}

/* The script of cmd_resize: op ('p' prefill, 'd' decode steps, 'r' resize,
 * 'g' greedy tokens) and count. */
typedef struct resize_op {
    char op;
    uint32_t n;
} resize_op;

/* The scripts of cmd_resize.  quick: decode steps only, the main sequence
 * full at 4 tokens, grown, shrunk to its tokens, grown to the whole (the
 * deferred windows hold rows at each resize: the payload's frontiers fold
 * them).  medium: a prefill too, full at 16.  long: also across the
 * ratio-128 window's end (127) in a context grown mid-window. */
static const resize_op quick_script[] = {{'d', 4}, {'r', 9}, {'d', 2}, {'r', 6}, {'r', 512}, {'d', 1}, {'g', 1}};
static const resize_op medium_script[] = {{'p', 12}, {'d', 4},   {'r', 40}, {'d', 3},
                                          {'r', 19}, {'r', 512}, {'d', 2},  {'g', 2}};
static const resize_op long_script[] = {{'p', 12}, {'d', 4},   {'r', 140}, {'d', 3}, {'p', 106},
                                        {'d', 4},  {'r', 129}, {'r', 512}, {'d', 2}, {'g', 3}};

/* test_cuda resize MODEL [--no-sim] [--quick | --long] */
static int cmd_resize(int argc, char **argv) {
    if (argc < 1) return 2;
    bool no_sim = false, quick = false, longer = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) no_sim = true;
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--long")) longer = true;
        else return 2;
    }
    const resize_op *script = quick ? quick_script : longer ? long_script : medium_script;
    size_t n_ops = quick    ? sizeof(quick_script) / sizeof(quick_script[0])
                   : longer ? sizeof(long_script) / sizeof(long_script[0])
                            : sizeof(medium_script) / sizeof(medium_script[0]);
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(argv[0], &err);
    if (!w) die(argv[0], &err);
    uint32_t V = w->cfg.n_vocab, tok[160], rs = 99;
    for (uint32_t i = 0; i < 160; i++) tok[i] = ((rs = rs * 1103515245u + 12345u) >> 8) % V;
    ds4_backend_opts o = {.ctx_size = 512, .prefill_chunk = 64, .no_sim = no_sim, .cuda_graph_ctx = 128};
    ds4_backend *big = ds4_backend_create("cuda", w, &o, &err);
    uint32_t first = script[0].op == 'p' ? 16 : 4; /* full after the first two steps */
    o.main_ctx = first;
    ds4_backend *small = big ? ds4_backend_create("cuda", w, &o, &err) : NULL;
    if (!small) die("cuda", &err);
    for (int phase = 0; phase < (quick ? 1 : 2); phase++) {
        const char *what = phase ? "a second sequence resized" : "the main sequence resized";
        resize_side sd[2] = {{small, small->main, true}, {big, big->main, false}};
        if (phase) {
            sd[0].s = ds4_seq_new(small, first, &err);
            sd[1].s = sd[0].s ? ds4_seq_new(big, 512, &err) : NULL;
            if (!sd[1].s) die("seq_new", &err);
        }
        uint32_t at = 0;
        for (size_t i = 0; i < n_ops; i++) resize_step(sd, tok, &at, script[i].op, script[i].n, V, what);
        size_t la, lb;
        char *pa = seq_payload(small, sd[0].s, &la), *pb = seq_payload(big, sd[1].s, &lb);
        CHECK(la == lb && !memcmp(pa, pb, la), "%s: the payload differs from the whole context's", what);
        printf("%s: %u tokens against the whole context's (logits, greedy tokens, payload)\n", what, at);
        free(pa);
        free(pb);
        CHECK(ds4_seq_resize(small, sd[0].s, at - 1, &err) && strstr(ds4_err_msg(&err), "holds"),
              "a resize below the tokens: '%s'", ds4_err_msg(&err));
        CHECK(ds4_seq_resize(small, sd[0].s, 513, &err) && strstr(ds4_err_msg(&err), "at most 512"),
              "a resize beyond the context: '%s'", ds4_err_msg(&err));
        if (phase) {
            ds4_seq_free(small, sd[0].s);
            ds4_seq_free(big, sd[1].s);
        }
    }
    ds4_backend_free(small);
    ds4_backend_free(big);
    ds4_weights_close(w);
    return 0;
}

/* The MTP block's logits against the transformers golden (the CPU test's
 * file, tests/unit/test_mtp.c): rows of the last DS4_HIDDEN_KEEP positions
 * after prefills of several lengths, the first half of them in one step. */
static void mtp_golden(const char *model, const char *mtp, const char *golden, bool quick) {
    FILE *f = fopen(golden, "rb");
    char magic[4];
    uint32_t h[3];
    if (!f || fread(magic, 1, 4, f) != 4 || memcmp(magic, "DS4M", 4) || fread(h, 4, 3, f) != 3) {
        printf("FAIL: cannot read MTP golden %s\n", golden);
        exit(1);
    }
    uint32_t n = h[1], V = h[2];
    uint32_t *tok = malloc(n * 4);
    float *want = xmalloc((size_t)(n - 1) * V * 4);
    if (fread(tok, 4, n, f) != n || fread(want, 4, (size_t)(n - 1) * V, f) != (size_t)(n - 1) * V) {
        printf("FAIL: MTP golden %s truncated\n", golden);
        exit(1);
    }
    fclose(f);
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(model, &err);
    if (!w) die(model, &err);
    ds4_mtp_weights *m = ds4_mtp_open(mtp, w, &err);
    if (!m) die(mtp, &err);
    ds4_backend_opts o = {.ctx_size = 512, .no_sim = true, .mtp = m};
    ds4_backend *b = ds4_backend_create("cuda", w, &o, &err);
    if (!b) die("cuda", &err);
    uint32_t W = w->cfg.sliding_window;
    float *got = xmalloc((size_t)DS4_HIDDEN_KEEP * V * 4);
    const uint32_t all[] = {2, 60, 130, 257, n - 1}, few[] = {24};
    const uint32_t *ns = quick ? few : all, nn = quick ? 1 : 5;
    double worst = 0;
    for (uint32_t a = 0; a < nn; a++) {
        uint32_t len = ns[a], lo = len > DS4_HIDDEN_KEEP ? len - DS4_HIDDEN_KEEP : 0, half = lo + (len - lo) / 2;
        ds4_backend_reset(b);
        if (ds4_backend_prefill(b, tok, len, NULL, &err)) die("prefill", &err);
        ds4_seq *ms = ds4_mtp_seq_new(b, 0, &err);
        if (!ms) die("MTP sequence", &err);
        ds4_row rows[DS4_HIDDEN_KEEP];
        for (uint32_t i = lo; i < half; i++) rows[i - lo] = ds4_mtp_row(ms, tok[i + 1], DS4_ROW_LOGITS, b->main, i);
        ds4_step_out out = {got, NULL};
        if (half > lo && ds4_backend_mtp_step(b, rows, half - lo, &out, &err)) die("MTP step", &err);
        for (uint32_t i = half; i < len; i++) {
            rows[0] = ds4_mtp_row(ms, tok[i + 1], DS4_ROW_LOGITS, b->main, i);
            out.logits = got + (size_t)(i - lo) * V;
            if (ds4_backend_mtp_step(b, rows, 1, &out, &err)) die("MTP step", &err);
        }
        for (uint32_t i = lo; i < len; i++) {
            if (i + 1 < lo + W && i + 1 != len) continue; /* its window reaches before the MTP rows */
            diff d = {0};
            diff_add(&d, got + (size_t)(i - lo) * V, want + (size_t)i * V, 1, V);
            double r = rel(&d, 0);
            CHECK(r <= 1e-4 && !d.row_arg[0], "MTP row at %u after %u tokens: max|d| / max|logit| %.3g%s", i, len, r,
                  d.row_arg[0] ? ", argmax differs" : "");
            if (r > worst) worst = r;
            diff_free(&d);
        }
        ds4_seq_free(b, ms);
    }
    printf("MTP block against transformers (%s): worst row max|d| / max|logit| = %.3g\n", model, worst);
    ds4_backend_free(b);
    ds4_mtp_close(m);
    ds4_weights_close(w);
    free(tok);
    free(want);
    free(got);
}

/* The MTP sequence's rewind (cuda_mtp.cu): after 127 rows and a mark, three
 * draft rows taken back (two of them overwrite ring slots the next row's
 * window reads) leave no trace - the next row's logits are those of a
 * sequence that never drafted, bit for bit (the same kernels), whatever the
 * drafts - and a rewind that keeps the first draft is the sequence that
 * appended that row alone. */
static void mtp_rewind(const char *model, const char *mtp) {
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(model, &err);
    if (!w) die(model, &err);
    ds4_mtp_weights *m = ds4_mtp_open(mtp, w, &err);
    if (!m) die(mtp, &err);
    ds4_backend_opts o = {.ctx_size = 256, .no_sim = true, .mtp = m};
    ds4_backend *b = ds4_backend_create("cuda", w, &o, &err);
    if (!b) die("cuda", &err);
    if (w->cfg.sliding_window > DS4_HIDDEN_KEEP) { /* the drafts' slots must be in the next row's window */
        printf("FAIL: the MTP rewind check needs a window of at most %d rows\n", DS4_HIDDEN_KEEP);
        exit(1);
    }
    uint32_t V = w->cfg.n_vocab, n = 140, lo = n - DS4_HIDDEN_KEEP, tok[141];
    for (uint32_t i = 0; i < 141; i++) tok[i] = (i * 37u + 5u) % V;
    if (ds4_backend_prefill(b, tok, n, NULL, &err)) die("prefill", &err);
    float *lg = xmalloc((size_t)5 * V * 4);
    ds4_seq *ms = ds4_mtp_seq_new(b, 0, &err);
    if (!ms) die("MTP sequence", &err);
    ds4_row rows[DS4_HIDDEN_KEEP];
    ds4_step_out out = {NULL, NULL};
    /* runs: 0 no drafts; 1, 2 drafts taken back; 3 the first draft kept; 4 it appended plainly */
    for (int run = 0; run < 5; run++) {
        ds4_seq_reset(b, ms);
        for (uint32_t i = lo; i < n - 1; i++) rows[i - lo] = ds4_mtp_row(ms, tok[i + 1], 0, b->main, i);
        out.logits = NULL;
        if (ds4_backend_mtp_step(b, rows, n - 1 - lo, &out, &err) || ds4_backend_mark(b, ms, &err))
            die("MTP rows", &err);
        uint32_t base = ds4_seq_len(b, ms);
        if (run >= 1 && run <= 3)
            for (uint32_t k = 0; k < 3; k++) {
                rows[0] = ds4_mtp_row(ms, (tok[k] + 7u * (uint32_t)run) % V, DS4_ROW_REWIND, ms, base - 1 + k);
                if (ds4_backend_mtp_step(b, rows, 1, &out, &err)) die("draft", &err);
            }
        if (run == 4) {
            rows[0] = ds4_mtp_row(ms, (tok[0] + 21u) % V, 0, ms, base - 1);
            if (ds4_backend_mtp_step(b, rows, 1, &out, &err)) die("draft", &err);
        }
        if ((run >= 1 && run <= 3) && ds4_backend_rewind(b, ms, base + (run == 3), &err)) die("rewind", &err);
        CHECK(ds4_seq_len(b, ms) == base + (run >= 3), "run %d: MTP sequence of %u rows after the rewind", run,
              ds4_seq_len(b, ms));
        /* the next row: the main model's last residual, or (3, 4) the kept draft's */
        rows[0] = run >= 3 ? ds4_mtp_row(ms, tok[n], DS4_ROW_LOGITS, ms, base)
                           : ds4_mtp_row(ms, tok[n], DS4_ROW_LOGITS, b->main, n - 1);
        out.logits = lg + (size_t)run * V;
        if (ds4_backend_mtp_step(b, rows, 1, &out, &err)) die("row", &err);
    }
    CHECK(!memcmp(lg + V, lg, V * 4) && !memcmp(lg + 2 * (size_t)V, lg, V * 4),
          "MTP rewind: rejected drafts left a trace in the next row's logits");
    CHECK(!memcmp(lg + 3 * (size_t)V, lg + 4 * (size_t)V, V * 4),
          "MTP rewind: a kept draft differs from the row appended plainly");
    ds4_seq_free(b, ms);
    free(lg);
    ds4_backend_free(b);
    ds4_mtp_close(m);
    ds4_weights_close(w);
}

typedef struct tokrec {
    int32_t tok[64];
    uint32_t n;
} tokrec;

static void record_token(void *ctx, int32_t t, ds4_gen_control *ctl) {
    (void)ctl;
    tokrec *r = ctx;
    if (r->n < 64) r->tok[r->n++] = t;
}

/* n greedy tokens after prompt p through an engine (draft 0: no MTP);
 * the session's verification steps into *st. */
static void generate_on(ds4_engine *e, const int32_t *p, uint32_t np, uint32_t n, uint32_t draft, tokrec *r,
                        ds4_spec_stats *st) {
    ds4_err err = {0};
    ds4_session *s = ds4_session_new(e, 512, &err);
    if (!s) die("session", &err);
    if (draft && ds4_session_enable_mtp(s, draft, 0.0f, &err)) die("MTP", &err);
    if (ds4_session_sync(s, p, np, NULL, NULL, &err)) die("prompt", &err);
    ds4_gen_opts o = {.max_tokens = n};
    ds4_gen_result res;
    memset(r, 0, sizeof(*r));
    if (ds4_generate(s, NULL, &o, record_token, r, &res, &err)) die("generate", &err);
    *st = ds4_session_spec(s) ? ds4_session_spec(s)->stats : (ds4_spec_stats){0};
    ds4_session_free(s);
}

/* Greedy generation with drafts of 1, 2 and 4 tokens hands out plain
 * decoding's tokens.  Prompts of 1 token (the first verification right
 * after the prefill), 118 (the 20 tokens cross the ratio-4 window ends and
 * the ratio-128 one at 127) and 250 (the ratio-128 one at 255). */
static void mtp_identity(const char *model, const char *mtp, bool quick) {
    ds4_err err = {0};
    ds4_engine_opts po = {.model_path = model, .backend = "cuda"}, so = po;
    so.mtp_path = mtp;
    ds4_engine *plain = ds4_engine_open(&po, &err), *spec = plain ? ds4_engine_open(&so, &err) : NULL;
    if (!plain || !spec) die("engine", &err);
    uint32_t V = plain->w->cfg.n_vocab;
    int32_t prompt[300];
    for (uint32_t i = 0; i < 300; i++) prompt[i] = (int32_t)((i * 2654435761u + 11u) % V);
    const uint32_t all_np[] = {1, 118, 250}, all_draft[] = {1, 2, 4}, q_np[] = {122}, q_draft[] = {2};
    const uint32_t *np = quick ? q_np : all_np, *draft = quick ? q_draft : all_draft, nn = quick ? 1 : 3,
                   nd = quick ? 1 : 3, ng = quick ? 8 : 20;
    for (uint32_t a = 0; a < nn; a++) {
        tokrec want, got;
        ds4_spec_stats st;
        generate_on(plain, prompt, np[a], ng, 0, &want, &st);
        for (uint32_t d = 0; d < nd; d++) {
            generate_on(spec, prompt, np[a], ng, draft[d], &got, &st);
            CHECK(got.n == want.n && !memcmp(got.tok, want.tok, want.n * sizeof(int32_t)),
                  "prompt of %u, drafts of %u: the tokens differ from plain decoding", np[a], draft[d]);
            CHECK(st.cycles > 0, "prompt of %u, drafts of %u: no verification step", np[a], draft[d]);
            printf("prompt of %u, drafts of %u: %u tokens in %llu verification steps, %llu of %llu drafts accepted\n",
                   np[a], draft[d], got.n, (unsigned long long)st.cycles, (unsigned long long)st.accepted,
                   (unsigned long long)st.drafted);
        }
    }
    ds4_engine_close(spec);
    ds4_engine_close(plain);
}

static int cmd_mtp(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 2;
    bool quick = argc == 4 && !strcmp(argv[3], "--quick");
    if (argc == 4 && !quick) return 2;
    mtp_golden(argv[0], argv[1], argv[2], quick);
    mtp_rewind(argv[0], argv[1]);
    mtp_identity(argv[0], argv[1], quick);
    return 0;
}

/* ------------------------------------------------------------ steering */

/* What an activation observer saw: every row of every call, in order. */
typedef struct obs_log {
    uint32_t D;
    float *rows;
    size_t n, cap; /* rows */
} obs_log;

static void obs_record(void *ctx, uint32_t il, bool ffn, uint32_t T, const float *y) {
    (void)il, (void)ffn;
    obs_log *o = ctx;
    if (o->n + T > o->cap) {
        o->cap = (o->n + T) * 2;
        o->rows = realloc(o->rows, o->cap * o->D * sizeof(float));
    }
    memcpy(o->rows + o->n * o->D, y, (size_t)T * o->D * sizeof(float));
    o->n += T;
}

/* Unit rows of a seeded Gaussian, layer 1 left zero (a layer steering
 * leaves alone). */
static float *steer_dirs(uint32_t L, uint32_t D) {
    float *v = xmalloc((size_t)L * D * sizeof(float));
    uint64_t s = 12345;
    for (uint32_t il = 0; il < L; il++) {
        double norm = 0;
        for (uint32_t d = 0; d < D; d++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            v[(size_t)il * D + d] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
            norm += (double)v[(size_t)il * D + d] * v[(size_t)il * D + d];
        }
        for (uint32_t d = 0; d < D; d++)
            v[(size_t)il * D + d] = il == 1 ? 0.0f : (float)(v[(size_t)il * D + d] / sqrt(norm));
    }
    return v;
}

/* A prefill of n tokens (every logits row) then `steps` decode steps fed
 * with the CPU's greedy tokens, on CPU and CUDA with the same directions
 * and scales; rows into d. */
static void steer_run(ds4_backend *cpu, ds4_backend *gpu, const uint32_t *toks, uint32_t n, uint32_t steps, diff *d) {
    ds4_err err = {0};
    uint32_t V = cpu->w->cfg.n_vocab;
    float *a = xmalloc((size_t)n * V * sizeof(float)), *b = xmalloc((size_t)n * V * sizeof(float));
    if (ds4_backend_prefill(cpu, toks, n, a, &err)) die("cpu prefill", &err);
    if (ds4_backend_prefill(gpu, toks, n, b, &err)) die("cuda prefill", &err);
    diff_add(d, b, a, n, V);
    for (uint32_t i = 0; i < steps; i++) {
        uint32_t t = argmax(ds4_backend_logits(cpu), V);
        if (ds4_backend_decode(cpu, t, &err)) die("cpu decode", &err);
        if (ds4_backend_decode(gpu, t, &err)) die("cuda decode", &err);
        diff_add(d, ds4_backend_logits(gpu), ds4_backend_logits(cpu), 1, V);
    }
    free(a);
    free(b);
}

/* test_cuda steer MODEL [--prompt N] [--steps N]: directional steering
 * (model/steering.h) on the CUDA backend against the CPU's, simulations
 * off (an F16 model): scales (1, 0.5), then (-1.5, 0) in the same backends
 * after a reset (the decode graphs captured again), each within 1e-3 of
 * max |logit| with the same argmax; the activations at the steering points
 * (observer) in a prefill within 1e-4 of their largest value; and scales of
 * 0 with directions bit-identical to a backend without them. */
static int cmd_steer(int argc, char **argv) {
    if (argc < 1) return 2;
    const char *path = argv[0];
    uint32_t n = 40, steps = 12;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompt")) n = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--steps")) steps = (uint32_t)strtoul(argv[i + 1], NULL, 10);
        else return 2;
    }
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) die(path, &err);
    uint32_t L = w->cfg.n_layer, D = w->cfg.n_embd, V = w->cfg.n_vocab, ctx = n + steps + 8;
    float *dirs = steer_dirs(L, D);
    ds4_steering *st = ds4_steering_from(dirs, L, D, &err);
    if (!st) die("directions", &err);
    uint32_t *toks = malloc(n * sizeof(uint32_t));
    uint64_t s = 77;
    for (uint32_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (uint32_t)((s >> 33) % V);
    }
    obs_log oc = {.D = D}, og = {.D = D};
    ds4_backend_opts o = {.ctx_size = ctx, .no_sim = true, .steer = st, .act_observer = obs_record, .act_ctx = &oc};
    ds4_backend *cpu = ds4_backend_create("cpu", w, &o, &err);
    if (!cpu) die("cpu", &err);
    o.act_ctx = &og;
    ds4_backend *gpu = ds4_backend_create("cuda", w, &o, &err);
    if (!gpu) die("cuda", &err);
    const float scales[2][2] = {{1.0f, 0.5f}, {-1.5f, 0.0f}};
    for (int k = 0; k < 2; k++) {
        ds4_backend_reset(cpu);
        ds4_backend_reset(gpu);
        ds4_seq_set_steering(cpu->main, scales[k][0], scales[k][1]);
        ds4_seq_set_steering(gpu->main, scales[k][0], scales[k][1]);
        oc.n = og.n = 0;
        diff d = {0};
        steer_run(cpu, gpu, toks, n, steps, &d);
        char what[64];
        snprintf(what, sizeof(what), "steered ffn %g attn %g", scales[k][0], scales[k][1]);
        diff_check(what, &d, 1e-3);
        diff_free(&d);
        /* the prefill's rows: 2 L calls of n rows (decode passes are not observed on CUDA) */
        CHECK(og.n == (size_t)2 * L * n && oc.n >= og.n, "observer rows: cuda %zu (want %zu), cpu %zu", og.n,
              (size_t)2 * L * n, oc.n);
        double amax = 0, dmax = 0;
        for (size_t i = 0; i < og.n * D && i < oc.n * D; i++) {
            if (fabs(oc.rows[i]) > amax) amax = fabs(oc.rows[i]);
            double e = fabs((double)oc.rows[i] - og.rows[i]);
            if (!(e <= dmax)) dmax = e;
        }
        printf("%-34s max|d| = %.3g of max|y| %.3f\n", "  activations at the steering points", dmax, amax);
        CHECK(dmax <= 1e-4 * amax, "activations: %.3g of %.3g", dmax, amax);
    }
    ds4_backend_free(cpu);
    ds4_backend_free(gpu);

    /* scales 0: the unchanged path */
    ds4_backend_opts p = {.ctx_size = ctx, .no_sim = true};
    ds4_backend *plain = ds4_backend_create("cuda", w, &p, &err);
    if (!plain) die("cuda", &err);
    p.steer = st;
    ds4_backend *zero = ds4_backend_create("cuda", w, &p, &err);
    if (!zero) die("cuda", &err);
    float *a = xmalloc((size_t)n * V * sizeof(float)), *b = xmalloc((size_t)n * V * sizeof(float));
    if (ds4_backend_prefill(plain, toks, n, a, &err) || ds4_backend_prefill(zero, toks, n, b, &err))
        die("prefill", &err);
    bool same = !memcmp(a, b, (size_t)n * V * sizeof(float));
    for (uint32_t i = 0; i < steps && same; i++) {
        uint32_t t = argmax(ds4_backend_logits(plain), V);
        if (ds4_backend_decode(plain, t, &err) || ds4_backend_decode(zero, t, &err)) die("decode", &err);
        same = !memcmp(ds4_backend_logits(plain), ds4_backend_logits(zero), V * sizeof(float));
    }
    printf("%-34s %s\n", "scales 0 vs no directions", same ? "bit-identical" : "DIFFERENT");
    CHECK(same, "scales of 0 changed the logits");
    ds4_backend_free(plain);
    ds4_backend_free(zero);
    free(a);
    free(b);
    free(oc.rows);
    free(og.rows);
    free(toks);
    free(dirs);
    ds4_steering_free(st);
    ds4_weights_close(w);
    return 0;
}

/* A backend with routed experts split by a GPU budget and a profile. */
static ds4_backend *make_split(const ds4_weights *w, uint32_t ctx, uint32_t chunk, bool no_sim, uint64_t gpu_mem,
                               const ds4_expert_profile *prof, int how, int mapped, ds4_err *err) {
    ds4_backend_opts o = {.ctx_size = ctx,
                          .prefill_chunk = chunk,
                          .no_sim = no_sim,
                          .cuda_graph_ctx = 64,
                          .gpu_mem = gpu_mem,
                          .expert_profile = prof,
                          .host_experts = how,
                          .host_mapped = mapped,
                          .count_experts = true}; /* as the reference, whose least budget they are given */
    return ds4_backend_create("cuda", w, &o, err);
}

static int cmd_split(int argc, char **argv) {
    if (argc < 1) return 2;
    const char *path = argv[0];
    uint32_t n = 40, steps = 12, seed = 1;
    bool no_sim = false, quick = false;
    double tol = 1e-3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) {
            no_sim = true;
            continue;
        }
        if (!strcmp(argv[i], "--quick")) {
            quick = true;
            continue;
        }
        if (i + 1 >= argc) return 2;
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--prompt")) n = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--steps")) steps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--seed")) seed = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--tol")) tol = strtod(v, NULL);
        else return 2;
    }
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) die(path, &err);
    const ds4_config *c = &w->cfg;
    uint32_t V = c->n_vocab, ctx = n + steps + 8, more = 5;
    printf("%s: routed experts split between GPU and host, %u-token prompt, %u steps, simulations %s, tolerance %g\n",
           path, n, steps, no_sim ? "off" : "on", tol);
    uint32_t *toks = malloc((n + steps + more) * sizeof(uint32_t));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (uint32_t i = 0; i < n + more; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (uint32_t)(s >> 33) % V;
    }
    /* the reference: every expert on the GPU, its selections counted */
    ds4_backend_opts ro = {.ctx_size = ctx, .no_sim = no_sim, .cuda_graph_ctx = 64, .count_experts = true};
    ds4_backend *ref = ds4_backend_create("cuda", w, &ro, &err);
    if (!ref) die("reference", &err);
    ds4_offload_info ri;
    CHECK(ds4_cuda_offload_info(ref, &ri) == 0 && !ri.on, "the reference has every expert on the GPU");
    float *lr = xmalloc((size_t)n * V * 4), *dr = xmalloc((size_t)steps * V * 4), *mr = xmalloc((size_t)more * V * 4);
    uint32_t *gref = malloc(steps * sizeof(uint32_t)), *gen = malloc(steps * sizeof(uint32_t));
    if (ds4_backend_prefill(ref, toks, n, lr, &err)) die("reference prefill", &err);
    for (uint32_t i = 0; i < steps; i++) {
        gref[i] = argmax(ds4_backend_logits(ref), V);
        if (ds4_backend_decode(ref, gref[i], &err)) die("reference decode", &err);
        memcpy(dr + (size_t)i * V, ds4_backend_logits(ref), V * 4);
    }
    if (ds4_backend_prefill(ref, toks + n, more, mr, &err)) die("reference prefill after decode", &err);
    /* every token of every pass chose k experts in every layer */
    ds4_expert_profile *counted = ds4_expert_profile_new(c->n_layer, c->n_expert, &err);
    if (!counted || ds4_cuda_expert_counts(ref, counted, &err)) die("expert counts", &err);
    uint32_t bad_layers = 0;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        double sum = 0;
        for (uint32_t e = 0; e < c->n_expert; e++) sum += counted->use[(size_t)l * c->n_expert + e];
        bad_layers += sum != (double)(n + steps + more) * c->n_expert_used;
    }
    printf("%-34s %u tokens counted, %u layer(s) off\n", "expert selections counted", (unsigned)counted->tokens,
           bad_layers);
    CHECK(bad_layers == 0 && counted->tokens == n + steps + more, "expert counts: %u layers off, %u tokens", bad_layers,
          (unsigned)counted->tokens);
    ds4_expert_profile_free(counted);
    ds4_backend_free(ref);
    uint64_t fixed = ri.dev_fixed, routed = ri.dev_allocated + 4096 - fixed;
    /* chunks of 5: smaller pass buffers, so less to keep */
    ds4_backend *ref5 = make("cuda", w, ctx, 5, no_sim, 64);
    ds4_offload_info ri5;
    CHECK(ds4_cuda_offload_info(ref5, &ri5) == 0 && !ri5.on, "the reference has every expert on the GPU");
    ds4_backend_free(ref5);
    uint64_t fixed5 = ri5.dev_fixed;

    /* a budget below the least is refused, naming the least */
    ds4_backend *bad = make_split(w, ctx, 0, no_sim, fixed - 1, NULL, DS4_HOST_AUTO, -1, &err);
    char want[64];
    snprintf(want, sizeof(want), "(%llu bytes", (unsigned long long)fixed);
    CHECK(!bad && strstr(ds4_err_msg(&err), want) && strstr(ds4_err_msg(&err), "at least"),
          "a budget below the least: %s", bad ? "accepted" : ds4_err_msg(&err));
    printf("%-34s %s\n", "budget one byte too small", bad ? "accepted" : ds4_err_msg(&err));
    ds4_backend_free(bad);

    ds4_expert_profile *prof = ds4_expert_profile_new(c->n_layer, c->n_expert, &err);
    if (!prof) die("profile", &err);
    for (size_t i = 0; i < (size_t)c->n_layer * c->n_expert; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prof->use[i] = (double)(s >> 44);
    }
    struct {
        const char *name;
        uint64_t budget;
        const ds4_expert_profile *prof;
        uint32_t chunk;
        int how, mapped; /* mapped: ds4_backend_opts.host_mapped */
    } splits[] = {
        {"none on the GPU, prefill streamed, none mapped", fixed, NULL, 0, DS4_HOST_STREAM, -1},
        {"whole layers, half, prefill on the CPU, all mapped", fixed + routed / 2, NULL, 0, DS4_HOST_CPU, 100},
        {"random third, prefill and mapped by cost", fixed + routed / 3, prof, 0, DS4_HOST_AUTO, 0},
        {"random two thirds, chunks of 5 on the CPU, half mapped", fixed5 + 2 * routed / 3, prof, 5, DS4_HOST_CPU, 50},
    };
    for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
        if (quick && k != 0 && k != 3) continue;
        printf("-- %s\n", splits[k].name);
        ds4_backend *b = make_split(w, ctx, splits[k].chunk, no_sim, splits[k].budget, splits[k].prof, splits[k].how,
                                    splits[k].mapped, &err);
        if (!b) die(splits[k].name, &err);
        ds4_offload_info bi;
        CHECK(ds4_cuda_offload_info(b, &bi) == 0 && bi.on, "%s: some experts on the host", splits[k].name);
        printf("%-34s %u of %u experts on the host; %llu bytes on the GPU (budget %llu)\n", "placement",
               bi.host_experts, bi.total_experts, (unsigned long long)bi.dev_allocated,
               (unsigned long long)splits[k].budget);
        CHECK(bi.dev_allocated == bi.dev_total, "%s: allocated %llu bytes, the placement counted %llu", splits[k].name,
              (unsigned long long)bi.dev_allocated, (unsigned long long)bi.dev_total);
        CHECK(bi.dev_total <= splits[k].budget, "%s: %llu bytes over a budget of %llu", splits[k].name,
              (unsigned long long)bi.dev_total, (unsigned long long)splits[k].budget);
        CHECK(k != 0 || bi.host_experts == bi.total_experts, "none on the GPU: %u of %u on the host", bi.host_experts,
              bi.total_experts);
        CHECK(k == 0 || bi.host_experts < bi.total_experts, "%s: every expert on the host", splits[k].name);
        /* the mapped tier: half of each layer's host experts (rounded), all, none */
        printf("%-34s %u of the host experts\n", "mapped tier", bi.mapped_experts);
        int pct = splits[k].mapped;
        CHECK(pct != 50 || (bi.mapped_experts > 0 && bi.mapped_experts < bi.host_experts) || bi.host_experts < 2,
              "%s: %u of %u mapped", splits[k].name, bi.mapped_experts, bi.host_experts);
        CHECK(pct != 100 || bi.mapped_experts == bi.host_experts, "%s: %u of %u mapped", splits[k].name,
              bi.mapped_experts, bi.host_experts);
        CHECK(pct != -1 || bi.mapped_experts == 0, "%s: %u mapped", splits[k].name, bi.mapped_experts);
        float *lb = xmalloc((size_t)n * V * 4), *mb = xmalloc((size_t)more * V * 4);
        diff d = {0};
        if (ds4_backend_prefill(b, toks, n, lb, &err)) die("split prefill", &err);
        diff_add(&d, lb, lr, n, V);
        diff_check("prefill, every position", &d, tol);
        diff_free(&d);
        ds4_kv_state *after = ds4_backend_state_new(b, &err);
        if (!after || ds4_backend_snapshot(b, after, &err)) die("snapshot", &err);
        for (uint32_t i = 0; i < steps; i++) {
            if (ds4_backend_decode(b, gref[i], &err)) die("split decode", &err);
            diff_add(&d, ds4_backend_logits(b), dr + (size_t)i * V, 1, V);
        }
        diff_check("decode steps", &d, tol);
        diff_free(&d);
        if (ds4_backend_prefill(b, toks + n, more, mb, &err)) die("split prefill after decode", &err);
        diff_add(&d, mb, mr, more, V);
        diff_check("prefill after the decode steps", &d, tol);
        diff_free(&d);
        if (ds4_backend_restore(b, after, &err) || ds4_backend_greedy(b, steps, gen, &err)) die("split greedy", &err);
        uint32_t first_bad = steps;
        for (uint32_t i = 0; i < steps && first_bad == steps; i++)
            if (gen[i] != gref[i]) first_bad = i;
        printf("%-34s %s\n", "greedy tokens on the device", first_bad == steps ? "identical" : "differ");
        CHECK(first_bad == steps, "%s: greedy token %u: %u, reference %u", splits[k].name, first_bad,
              gen[first_bad < steps ? first_bad : 0], gref[first_bad < steps ? first_bad : 0]);
        ds4_kv_state_free(after);
        ds4_backend_free(b);
        free(lb);
        free(mb);
    }
    ds4_expert_profile_free(prof);
    free(lr);
    free(dr);
    free(mr);
    free(gref);
    free(gen);
    free(toks);
    ds4_weights_close(w);
    return 0;
}

/* ------------------------------------------------------------- stages */

/* A model as pipeline stages chained in one process (one stage: the
 * whole model), each with its main sequence and a second one. */
typedef struct chain {
    ds4_backend *st[4];
    ds4_seq *seq[4][2];
    uint32_t n;
    float *a, *b; /* residuals between stages: chunk rows */
} chain;

/* Stage k on GPU k % gpus (a CUDA chain; 0: every stage on GPU 0). */
static void chain_make(chain *c, const char *backend, const ds4_weights *w, const uint32_t *bounds, uint32_t n,
                       uint32_t ctx, uint32_t chunk, bool no_sim, uint32_t gpus) {
    ds4_err err = {0};
    memset(c, 0, sizeof(*c));
    c->n = n;
    for (uint32_t k = 0; k < n; k++) {
        ds4_backend_opts o = {
            .ctx_size = ctx, .prefill_chunk = chunk, .no_sim = no_sim, .gpu = gpus ? (int)(k % gpus) : 0};
        if (n > 1) o.layer_first = bounds[k], o.layer_end = bounds[k + 1];
        if (!(c->st[k] = ds4_backend_create(backend, w, &o, &err))) die(backend, &err);
        c->seq[k][0] = c->st[k]->main;
        if (!(c->seq[k][1] = ds4_seq_new(c->st[k], ctx, &err))) die("seq_new", &err);
    }
    size_t hcd = (size_t)w->cfg.n_hc * w->cfg.n_embd;
    c->a = xmalloc(chunk * hcd * 4);
    c->b = xmalloc(chunk * hcd * 4);
}

static void chain_free(chain *c) {
    for (uint32_t k = 0; k < c->n; k++) {
        ds4_seq_free(c->st[k], c->seq[k][1]);
        ds4_backend_free(c->st[k]);
    }
    free(c->a);
    free(c->b);
}

/* One step of n rows (row i: token tok[i] of sequence which[i], 0 the main
 * one) down the chain, every row's logits into lg.  A whole model's one
 * main row is a decode step (its decode graph, as the stages' one-row
 * steps of the main sequence take theirs). */
static void chain_step(chain *c, const uint32_t *which, const uint32_t *tok, uint32_t n, float *lg, uint32_t V) {
    ds4_err err = {0};
    if (c->n == 1 && n == 1 && which[0] == 0) {
        if (ds4_backend_decode(c->st[0], tok[0], &err)) die("decode", &err);
        memcpy(lg, ds4_backend_logits(c->st[0]), V * 4);
        return;
    }
    ds4_row rows[64];
    float *in = NULL, *out = c->a;
    for (uint32_t k = 0; k < c->n; k++) {
        bool last = k + 1 == c->n;
        for (uint32_t i = 0; i < n; i++) rows[i] = ds4_row_of(c->seq[k][which[i]], tok[i], DS4_ROW_LOGITS);
        ds4_step_out o = {lg, NULL};
        if (ds4_backend_stage_step(c->st[k], rows, n, in, last ? NULL : out, last ? &o : NULL, &err))
            die("stage step", &err);
        in = out;
        out = out == c->a ? c->b : c->a;
    }
}

/* The chain's main sequence as one whole state: the first stage's layers
 * snapshot into it, each later stage's as the layer slice a pipeline rank
 * sends (packed, unpacked), the logits the last stage's. */
static ds4_kv_state *chain_gather(chain *c, const ds4_weights *w, uint32_t ctx, uint32_t chunk,
                                  const uint32_t *bounds) {
    ds4_err err = {0};
    ds4_kv_state *whole = ds4_kv_state_new(&w->cfg, ctx, chunk, &err);
    if (!whole || ds4_backend_snapshot(c->st[0], whole, &err)) die("snapshot of the first stage", &err);
    for (uint32_t k = 1; k < c->n; k++) {
        ds4_kv_state *s = ds4_kv_state_new_layers(&w->cfg, ctx, chunk, bounds[k], bounds[k + 1], &err);
        if (!s || ds4_backend_snapshot(c->st[k], s, &err)) die("snapshot of a stage", &err);
        size_t bytes = ds4_kv_state_slice_bytes(s, s->n_tokens, bounds[k], bounds[k + 1]);
        void *buf = malloc(bytes ? bytes : 1);
        ds4_kv_state_pack_layers(s, bounds[k], bounds[k + 1], buf);
        ds4_kv_state_unpack_layers(whole, s->n_tokens, bounds[k], bounds[k + 1], buf);
        if (k + 1 == c->n) {
            whole->has_logits = s->has_logits;
            memcpy(whole->logits, s->logits, w->cfg.n_vocab * 4);
        }
        free(buf);
        ds4_kv_state_free(s);
    }
    return whole;
}

/* The stages' logits (got) against the whole CUDA model's (whole) and the
 * CPU stages' (cpu), n rows: within tol with the same argmax; against the
 * CPU except where the whole CUDA model is itself off it (ref: the whole
 * CPU model's, which the CPU stages give bit for bit). */
static void stages_check(const char *what, const float *got, const float *whole, const float *cpu, const float *ref,
                         uint32_t n, uint32_t V, double tol) {
    diff dw = {0}, dc = {0}, dr = {0};
    diff_add(&dw, got, whole, n, V);
    diff_add(&dr, whole, ref, n, V);
    uint32_t same = !memcmp(got, whole, (size_t)n * V * 4), excused = 0;
    for (uint32_t r = 0; r < n; r++) {
        if (rel(&dr, r) > tol || dr.row_arg[r]) {
            excused++;
            continue;
        }
        diff_add(&dc, got + (size_t)r * V, cpu + (size_t)r * V, 1, V);
    }
    char line[160];
    snprintf(line, sizeof(line), "%s, against the whole model%s", what, same ? " (bit-identical)" : "");
    diff_check(line, &dw, tol);
    snprintf(line, sizeof(line), "%s, against the CPU stages", what);
    if (excused) printf("  (%u row(s) where the whole CUDA model is off the CPU left to the compare test)\n", excused);
    if (dc.rows) diff_check(line, &dc, tol);
    CHECK(!memcmp(cpu, ref, (size_t)n * V * 4), "%s: the CPU stages differ from the whole CPU model", what);
    diff_free(&dw);
    diff_free(&dc);
    diff_free(&dr);
}

/* The splits: each stage's first layer (the last entry the layer count),
 * chosen for the model's ratios. */
typedef struct stage_split {
    const char *name;
    uint32_t bounds[5], n;
} stage_split;

static uint32_t first_ratio(const ds4_config *c, uint32_t ratio) {
    for (uint32_t il = 1; il < c->n_layer; il++)
        if (ds4_layer_ratio(c, il) == ratio) return il;
    return 0;
}

static uint32_t make_splits(const ds4_config *c, bool quick, stage_split *out) {
    uint32_t L = c->n_layer, r4 = first_ratio(c, 4), r128 = first_ratio(c, 128), n = 0;
    stage_split all[] = {
        {"2 stages, the last layer alone", {0, L - 1, L}, 2},
        {"2 stages, the second from a ratio-4 layer", {0, r4, L}, 2},
        {"2 stages, the second from a ratio-128 layer", {0, r128, L}, 2},
        {"3 stages, the first layer alone", {0, 1, L - 1, L}, 3},
        {"3 stages, from ratio-4 and ratio-128 layers", {0, r4 < r128 ? r4 : r128, r4 < r128 ? r128 : r4, L}, 3},
    };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        bool ok = !quick || i == 0 || i == 4;
        for (uint32_t k = 0; k < all[i].n; k++) ok = ok && all[i].bounds[k] < all[i].bounds[k + 1];
        if (ok) out[n++] = all[i];
    }
    return n;
}

/* What a CUDA stage refuses, each naming it. */
static void stages_refusals(const ds4_weights *w, uint32_t ctx) {
    ds4_err err = {0};
    uint32_t L = w->cfg.n_layer;
    ds4_backend_opts o = {.ctx_size = ctx, .layer_first = 1, .layer_end = L, .count_experts = true};
    ds4_backend *b = ds4_backend_create("cuda", w, &o, &err);
    CHECK(!b && strstr(ds4_err_msg(&err), "does not run expert selection counts"), "expert counts in a stage: %s",
          b ? "accepted" : ds4_err_msg(&err));
    printf("%-34s %s\n", "refused", ds4_err_msg(&err));
    ds4_backend_free(b);
    o.count_experts = false;
    o.gpu_mem = 1 << 20; /* a stage that does not fit its GPU: no routed experts in host RAM */
    ds4_err_clear(&err);
    b = ds4_backend_create("cuda", w, &o, &err);
    CHECK(!b && strstr(ds4_err_msg(&err), "keeps no routed experts in host RAM"), "a stage beyond its GPU: %s",
          b ? "accepted" : ds4_err_msg(&err));
    printf("%-34s %s\n", "refused", ds4_err_msg(&err));
    ds4_backend_free(b);
    o.gpu_mem = 0;
    o.layer_end = L + 1;
    ds4_err_clear(&err);
    b = ds4_backend_create("cuda", w, &o, &err);
    CHECK(!b && strstr(ds4_err_msg(&err), "not a range"), "layers past the model: %s",
          b ? "accepted" : ds4_err_msg(&err));
    ds4_backend_free(b);
    o.layer_end = L - 1;
    ds4_err_clear(&err);
    if (!(b = ds4_backend_create("cuda", w, &o, &err))) die("a middle stage", &err);
    uint32_t tok = 1;
    ds4_row row = ds4_row_of(b->main, tok, 0);
    float *resid = xmalloc((size_t)w->cfg.n_hc * w->cfg.n_embd * 4);
    CHECK(ds4_backend_prefill(b, &tok, 1, NULL, &err) && strstr(ds4_err_msg(&err), "advances by stage steps"),
          "a prefill of a stage: %s", ds4_err_msg(&err));
    ds4_err_clear(&err);
    CHECK(ds4_backend_stage_step(b, &row, 1, NULL, resid, NULL, &err) &&
              strstr(ds4_err_msg(&err), "needs its rows' residuals"),
          "a stage step without the residuals in: %s", ds4_err_msg(&err));
    ds4_err_clear(&err);
    CHECK(ds4_backend_mark(b, b->main, &err) && strstr(ds4_err_msg(&err), "rewind"), "a mark in a stage: %s",
          ds4_err_msg(&err));
    printf("%-34s %s\n", "refused", ds4_err_msg(&err));
    free(resid);
    ds4_backend_free(b);
}

/* The tokens of a run: the prompt, the decode steps' (the CPU's greedy
 * tokens), one more for the main row of the last step, the second
 * sequence's prompt beside it (T2 rows). */
#define T2 8
typedef struct stage_run {
    uint32_t *toks, tok2[T2], n, steps, chunk, V;
} stage_run;

/* The prompt in passes of chunk rows and the decode steps (the CPU's
 * whole model picks the greedy tokens: pick), every row's logits into out
 * (n + steps rows). */
static void chain_prompt_decode(chain *ch, stage_run *r, bool pick, float *out) {
    const uint32_t which[64] = {0};
    size_t V = r->V;
    for (uint32_t off = 0; off < r->n; off += r->chunk) {
        uint32_t m = r->n - off < r->chunk ? r->n - off : r->chunk;
        chain_step(ch, which, r->toks + off, m, out + off * V, r->V);
    }
    for (uint32_t i = 0; i <= r->steps; i++) {
        if (pick) r->toks[r->n + i] = argmax(out + (r->n + i - 1) * V, r->V);
        if (i < r->steps) chain_step(ch, which, r->toks + r->n + i, 1, out + (r->n + i) * V, r->V);
    }
}

/* A step of two sequences: the main one's next token and the second one's
 * prompt (1 + T2 rows of logits into out). */
static void chain_mixed(chain *ch, const stage_run *r, float *out) {
    uint32_t which[1 + T2], tok[1 + T2];
    which[0] = 0;
    tok[0] = r->toks[r->n + r->steps];
    for (uint32_t i = 0; i < T2; i++) which[1 + i] = 1, tok[1 + i] = r->tok2[i];
    chain_step(ch, which, tok, 1 + T2, out, r->V);
}

/* Fresh stages of ch's split restored from a whole state, as a pipeline
 * does: the first stage from the whole state, each later one from its
 * layer slice (the last stage's logits stay on rank 0: none). */
static void chain_restore(chain *ch, const ds4_kv_state *whole, const ds4_weights *w, uint32_t ctx, uint32_t chunk,
                          const uint32_t *bounds) {
    ds4_err err = {0};
    if (ds4_backend_restore(ch->st[0], whole, &err)) die("restore of the first stage", &err);
    for (uint32_t k = 1; k < ch->n; k++) {
        ds4_kv_state *st = ds4_kv_state_new_layers(&w->cfg, ctx, chunk, bounds[k], bounds[k + 1], &err);
        if (!st) die("state", &err);
        size_t bytes = ds4_kv_state_slice_bytes(whole, whole->n_tokens, bounds[k], bounds[k + 1]);
        void *buf = malloc(bytes ? bytes : 1);
        ds4_kv_state_pack_layers(whole, bounds[k], bounds[k + 1], buf);
        ds4_kv_state_unpack_layers(st, whole->n_tokens, bounds[k], bounds[k + 1], buf);
        memcpy(st->tokens, whole->tokens, whole->n_tokens * sizeof(uint32_t));
        st->n_tokens = whole->n_tokens;
        if (ds4_backend_restore(ch->st[k], st, &err)) die("restore of a stage", &err);
        free(buf);
        ds4_kv_state_free(st);
    }
}

static uint64_t dev_bytes(const ds4_backend *b) {
    ds4_offload_info i;
    return ds4_cuda_offload_info(b, &i) == 0 ? i.dev_allocated : 0;
}

static int cmd_stages(int argc, char **argv) {
    if (argc < 1) return 2;
    stage_run r = {.n = 120, .steps = 12, .chunk = 32};
    bool no_sim = false, quick = false;
    uint32_t gpus = 0;
    double tol = 1e-3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) {
            no_sim = true;
            continue;
        }
        if (!strcmp(argv[i], "--quick")) {
            quick = true;
            continue;
        }
        if (i + 1 >= argc) return 2;
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--prompt")) r.n = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--steps")) r.steps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--chunk")) r.chunk = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--tol")) tol = strtod(v, NULL);
        else if (!strcmp(argv[i - 1], "--gpus")) gpus = (uint32_t)strtoul(v, NULL, 10);
        else return 2;
    }
    if (r.chunk < 1 + T2 || r.chunk > 64 || r.n < 1 || r.steps < 1) return 2;
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(argv[0], &err);
    if (!w) die(argv[0], &err);
    const ds4_config *c = &w->cfg;
    size_t V = r.V = c->n_vocab, rows = r.n + r.steps;
    uint32_t ctx = r.n + r.steps + 16, chunk = r.chunk;
    printf("%s: pipeline stages, a %u-token prompt in passes of %u, %u decode steps, simulations %s, tolerance %g\n",
           argv[0], r.n, chunk, r.steps, no_sim ? "off" : "on", tol);
    r.toks = malloc((rows + 1) * sizeof(uint32_t));
    uint64_t s = 0x5EED;
    for (uint32_t i = 0; i < r.n + T2; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        if (i < r.n) r.toks[i] = (uint32_t)(s >> 33) % V;
        else r.tok2[i - r.n] = (uint32_t)(s >> 33) % V;
    }
    /* the references: the whole CPU model (whose greedy tokens every run
     * is fed) and the whole CUDA model, with its snapshot after the decode
     * steps */
    const uint32_t whole_b[] = {0, c->n_layer};
    chain cpu, gpu;
    chain_make(&cpu, "cpu", w, whole_b, 1, ctx, chunk, no_sim, 0);
    chain_make(&gpu, "cuda", w, whole_b, 1, ctx, chunk, no_sim, 0);
    float *ref = xmalloc(rows * V * 4), *whole = xmalloc(rows * V * 4), *got = xmalloc(rows * V * 4),
          *cpul = xmalloc(rows * V * 4);
    float *mref = xmalloc((1 + T2) * V * 4), *mwhole = xmalloc((1 + T2) * V * 4), *mgot = xmalloc((1 + T2) * V * 4),
          *mcpu = xmalloc((1 + T2) * V * 4);
    chain_prompt_decode(&cpu, &r, true, ref);
    chain_prompt_decode(&gpu, &r, false, whole);
    ds4_kv_state *wsnap = ds4_backend_state_new(gpu.st[0], &err);
    if (!wsnap || ds4_backend_snapshot(gpu.st[0], wsnap, &err)) die("snapshot", &err);
    chain_mixed(&cpu, &r, mref);
    chain_mixed(&gpu, &r, mwhole);
    uint64_t whole_dev = dev_bytes(gpu.st[0]);
    chain_free(&cpu);
    chain_free(&gpu);

    stage_split sp[8];
    uint32_t nsp = make_splits(c, quick, sp);
    for (uint32_t k = 0; k < nsp; k++) {
        const uint32_t *bd = sp[k].bounds;
        printf("-- %s:", sp[k].name);
        for (uint32_t i = 0; i < sp[k].n; i++) printf(" %u..%u", bd[i], bd[i + 1] - 1);
        printf("\n");
        chain st, cs;
        chain_make(&st, "cuda", w, bd, sp[k].n, ctx, chunk, no_sim, gpus);
        chain_make(&cs, "cpu", w, bd, sp[k].n, ctx, chunk, no_sim, 0);
        for (uint32_t i = 0; i < st.n; i++) {
            uint64_t b = dev_bytes(st.st[i]);
            CHECK(b > 0 && b < whole_dev, "stage %u: %llu bytes on the device, the whole model %llu", i,
                  (unsigned long long)b, (unsigned long long)whole_dev);
            printf("%-34s stage %u: %.2f MiB (the whole model %.2f MiB)\n", i ? "" : "device memory", i,
                   (double)b / (1 << 20), (double)whole_dev / (1 << 20));
        }
        chain_prompt_decode(&st, &r, false, got);
        chain_prompt_decode(&cs, &r, false, cpul);
        stages_check("prompt, every row", got, whole, cpul, ref, r.n, V, tol);
        stages_check("decode steps", got + r.n * V, whole + r.n * V, cpul + r.n * V, ref + r.n * V, r.steps, V, tol);
        ds4_kv_state *g = chain_gather(&st, w, ctx, chunk, bd);
        state_check("the stages' snapshot, gathered", g, wsnap, tol);
        ds4_kv_state_free(g);
        chain_mixed(&st, &r, mgot);
        chain_mixed(&cs, &r, mcpu);
        stages_check("two sequences in a step", mgot, mwhole, mcpu, mref, 1 + T2, V, tol);
        chain_free(&st);
        chain_free(&cs);
        /* the whole model's state restored into fresh stages */
        chain_make(&st, "cuda", w, bd, sp[k].n, ctx, chunk, no_sim, gpus);
        chain_restore(&st, wsnap, w, ctx, chunk, bd);
        chain_mixed(&st, &r, mgot);
        diff d = {0};
        diff_add(&d, mgot, mwhole, 1 + T2, V);
        diff_check("the whole state restored, a step", &d, tol);
        diff_free(&d);
        chain_free(&st);
    }
    stages_refusals(w, ctx);
    ds4_kv_state_free(wsnap);
    free(ref);
    free(whole);
    free(got);
    free(cpul);
    free(mref);
    free(mwhole);
    free(mgot);
    free(mcpu);
    free(r.toks);
    ds4_weights_close(w);
    return 0;
}

/* A backend of the tp test: one GPU, or the group over n. */
static ds4_backend *tp_make(const ds4_weights *w, uint32_t n, uint32_t ctx, uint32_t chunk, bool no_sim) {
    ds4_err err = {0};
    ds4_backend_opts o = {
        .ctx_size = ctx, .prefill_chunk = chunk, .no_sim = no_sim, .cuda_graph_ctx = 64, .tensor_parallel = n};
    ds4_backend *b = ds4_backend_create("cuda", w, &o, &err);
    if (!b) die(n > 1 ? "tensor-parallel backend" : "cuda", &err);
    return b;
}

/* Logits of a prompt (one prefill of every row, in passes of the chunk),
 * then of decode steps fed tokens (NULL: each its own greedy token,
 * written to fed). */
static void tp_run(ds4_backend *b, const uint32_t *toks, uint32_t n, uint32_t steps, uint32_t *fed, bool feed,
                   uint32_t V, float *out) {
    ds4_err err = {0};
    if (ds4_backend_prefill(b, toks, n, out, &err)) die("prefill", &err);
    for (uint32_t i = 0; i < steps; i++) {
        const float *l = ds4_backend_logits(b);
        if (!l) die("logits", &err);
        if (!feed) fed[i] = argmax(l, V);
        if (ds4_backend_decode(b, fed[i], &err)) die("decode", &err);
        memcpy(out + (size_t)(n + i) * V, ds4_backend_logits(b), V * sizeof(float));
    }
}

/* A step of two sequences: a new one's prompt (all its rows' logits) and
 * the main sequence's next token. */
static void tp_mixed(ds4_backend *b, const uint32_t *toks, uint32_t n, uint32_t next, float *out) {
    ds4_err err = {0};
    ds4_seq *s2 = ds4_seq_new(b, 0, &err);
    if (!s2) die("seq_new", &err);
    ds4_row *rows = malloc((n + 1) * sizeof(ds4_row));
    for (uint32_t i = 0; i < n; i++) rows[i] = ds4_row_of(s2, toks[i], DS4_ROW_LOGITS);
    rows[n] = ds4_row_of(b->main, next, DS4_ROW_LOGITS);
    ds4_step_out o = {out, NULL};
    if (ds4_backend_step(b, rows, n + 1, &o, &err)) die("step", &err);
    free(rows);
    ds4_seq_free(b, s2);
}

/* What a group refuses, with the reason named. */
static void tp_refusals(const ds4_weights *w, uint32_t ctx) {
    const ds4_config *c = &w->cfg;
    struct {
        uint32_t n;
        const char *needle;
    } cases[] = {
        {c->n_head % 3 ? 3 : 0, "do not divide among 3 GPUs"},
        {DS4_DIST_MAX_GPUS, "the process sees"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (cases[i].n < 2) continue;
        ds4_err err = {0};
        ds4_backend_opts o = {.ctx_size = ctx, .prefill_chunk = 16, .tensor_parallel = cases[i].n};
        ds4_backend *b = ds4_backend_create("cuda", w, &o, &err);
        CHECK(!b && strstr(ds4_err_msg(&err), cases[i].needle), "%u GPUs: want a refusal naming '%s', got: %s",
              cases[i].n, cases[i].needle, b ? "a backend" : ds4_err_msg(&err));
        printf("%-34s %s\n", "refused", ds4_err_msg(&err));
        ds4_backend_free(b);
    }
    ds4_err err = {0};
    ds4_backend_opts o = {.ctx_size = ctx, .prefill_chunk = 16, .tensor_parallel = 2};
    ds4_backend *b = ds4_backend_create("cpu", w, &o, &err);
    CHECK(!b && strstr(ds4_err_msg(&err), "runs on CUDA GPUs"), "the cpu backend: %s",
          b ? "a backend" : ds4_err_msg(&err));
    ds4_backend_free(b);
}

static int cmd_tp(int argc, char **argv) {
    if (argc < 1) return 2;
    uint32_t n_gpu = 2, n = 40, steps = 8, chunk = 16;
    bool no_sim = false;
    double tol = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-sim")) {
            no_sim = true;
            continue;
        }
        if (i + 1 >= argc) return 2;
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--tp")) n_gpu = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--prompt")) n = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--steps")) steps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--chunk")) chunk = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--tol")) tol = strtod(v, NULL);
        else return 2;
    }
    if (n_gpu < 2 || n < 2 || steps < 1 || chunk < 1) return 2;
    if (tol == 0) tol = no_sim ? 1e-5 : 1e-3;
    ds4_err err = {0};
    uint64_t room;
    if (ds4_cuda_mem_available((int)n_gpu - 1, &room, &err) != 0) {
        printf("SKIP: tensor parallel over %u GPUs: %s\n", n_gpu, ds4_err_msg(&err));
        exit(77);
    }
    ds4_weights *w = ds4_weights_open(argv[0], &err);
    if (!w) die(argv[0], &err);
    const ds4_config *c = &w->cfg;
    uint32_t V = c->n_vocab, rows = n + steps, ctx = n + steps + 24, n2 = 5;
    printf("%s: tensor parallel over %u GPUs against one, a %u-token prompt in passes of %u, %u decode steps, "
           "simulations %s, tolerance %g\n",
           argv[0], n_gpu, n, chunk, steps, no_sim ? "off" : "on", tol);
    uint32_t *toks = malloc((n + n2) * sizeof(uint32_t)), *fed = malloc(steps * sizeof(uint32_t));
    uint64_t s = 0x7E45;
    for (uint32_t i = 0; i < n + n2; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (uint32_t)(s >> 33) % V;
    }
    float *want = xmalloc((size_t)rows * V * 4), *got = xmalloc((size_t)rows * V * 4);
    float *mwant = xmalloc((size_t)(n2 + 1) * V * 4), *mgot = xmalloc((size_t)(n2 + 1) * V * 4);
    uint32_t gwant[6], ggot[6];

    /* one GPU: the reference, its greedy tokens what both are fed */
    ds4_backend *one = tp_make(w, 1, ctx, chunk, no_sim);
    uint64_t whole = dev_bytes(one);
    tp_run(one, toks, n, steps, fed, false, V, want);
    ds4_kv_state *swant = ds4_backend_state_new(one, &err);
    if (!swant || ds4_backend_snapshot(one, swant, &err)) die("snapshot", &err);
    if (ds4_backend_greedy(one, 6, gwant, &err)) die("greedy", &err);
    tp_mixed(one, toks + n, n2, gwant[5], mwant);
    ds4_backend_free(one);

    ds4_backend *tp = tp_make(w, n_gpu, ctx, chunk, no_sim);
    for (uint32_t r = 0; r < n_gpu; r++) {
        uint64_t b = dev_bytes(ds4_tp_rank(tp, r));
        CHECK(b > 0 && b < whole, "GPU %u: %llu bytes, one GPU's whole model %llu", r, (unsigned long long)b,
              (unsigned long long)whole);
        printf("%-34s GPU %u: %.2f MiB (one GPU: %.2f MiB)\n", r ? "" : "device memory", r, (double)b / (1 << 20),
               (double)whole / (1 << 20));
    }
    tp_run(tp, toks, n, steps, fed, true, V, got);
    diff d = {0};
    diff_add(&d, got, want, n, V);
    diff_check("prompt, every row (chunked)", &d, tol);
    diff_free(&d);
    diff_add(&d, got + (size_t)n * V, want + (size_t)n * V, steps, V);
    diff_check("decode steps (the graphs)", &d, tol);
    diff_free(&d);
    ds4_kv_state *sgot = ds4_backend_state_new(tp, &err);
    if (!sgot || ds4_backend_snapshot(tp, sgot, &err)) die("snapshot", &err);
    if (no_sim) state_check("the snapshot", sgot, swant, tol); /* with the simulations its FP8 / f16 grids flip */
    if (ds4_backend_greedy(tp, 6, ggot, &err)) die("greedy", &err);
    CHECK(!memcmp(ggot, gwant, sizeof(ggot)), "greedy tokens differ from one GPU's");
    printf("%-34s %u %u %u %u %u %u (one GPU's)\n", "greedy tokens (device loop)", ggot[0], ggot[1], ggot[2], ggot[3],
           ggot[4], ggot[5]);
    tp_mixed(tp, toks + n, n2, gwant[5], mgot);
    diff_add(&d, mgot, mwant, n2 + 1, V);
    diff_check("a step of two sequences", &d, tol);
    diff_free(&d);
    /* the snapshot restored into a fresh group goes on as one GPU did */
    ds4_backend_free(tp);
    tp = tp_make(w, n_gpu, ctx, chunk, no_sim);
    if (ds4_backend_restore(tp, swant, &err) || ds4_backend_greedy(tp, 6, ggot, &err)) die("restore", &err);
    CHECK(!memcmp(ggot, gwant, sizeof(ggot)), "greedy tokens after a restore differ from one GPU's");
    printf("%-34s one GPU's greedy tokens\n", "one GPU's snapshot restored");
    ds4_backend_free(tp);
    tp_refusals(w, ctx);
    ds4_kv_state_free(swant);
    ds4_kv_state_free(sgot);
    free(want);
    free(got);
    free(mwant);
    free(mgot);
    free(toks);
    free(fed);
    ds4_weights_close(w);
    return 0;
}

/* The two prompts of cmd_imatrix through a backend collecting into a new
 * collector, written to path; returns the routed pairs observed. */
static uint64_t imatrix_collect(const char *name, const ds4_weights *w, const uint32_t *toks, uint32_t n,
                                uint32_t chunk, uint64_t gpu_mem, const char *path) {
    ds4_err err = {0};
    ds4_imcol *col = ds4_imcol_new(&w->cfg, &err);
    if (!col) die("collector", &err);
    ds4_backend_opts o = {.ctx_size = n + 8,
                          .prefill_chunk = chunk,
                          .no_sim = true,
                          .cuda_graph_ctx = 64,
                          .gpu_mem = gpu_mem,
                          .imatrix = col};
    ds4_backend *b = ds4_backend_create(name, w, &o, &err);
    if (!b) die(name, &err);
    if (gpu_mem) {
        ds4_offload_info bi;
        CHECK(ds4_cuda_offload_info(b, &bi) == 0 && bi.on && bi.host_experts < bi.total_experts,
              "the split backend has some experts on each side");
        printf("%-34s %u of %u experts on the host\n", "placement", bi.host_experts, bi.total_experts);
    }
    uint32_t lens[2] = {n, n / 2 + 3};
    for (int p = 0; p < 2; p++) {
        ds4_backend_reset(b);
        if (ds4_backend_prefill(b, toks + (p ? n : 0), lens[p], NULL, &err)) die("imatrix prefill", &err);
        ds4_imcol_end_prompt(col);
    }
    if (ds4_backend_imatrix_flush(b, &err) || ds4_backend_imatrix_flush(b, &err)) die("flush", &err);
    uint64_t routes = ds4_imcol_routes(col);
    if (ds4_imcol_save(col, path, "test", &err)) die(path, &err);
    ds4_backend_free(b);
    ds4_imcol_free(col);
    return routes;
}

/* Every entry of got within tol of want's largest value, same ncall. */
static void imatrix_compare(const char *what, const char *got_path, const char *want_path, double tol) {
    ds4_err err = {0};
    ds4_imatrix *got = ds4_imatrix_load(got_path, &err), *want = got ? ds4_imatrix_load(want_path, &err) : NULL;
    if (!got || !want) die("imatrix load", &err);
    CHECK(got->n_entries == want->n_entries && got->n_entries > 0, "%s: %u entries, want %u", what, got->n_entries,
          want->n_entries);
    double worst = 0;
    uint32_t nonzero = 0;
    for (uint32_t i = 0; i < want->n_entries; i++) {
        const ds4_imatrix_entry *w = &want->entries[i], *g = ds4_imatrix_find(got, w->name);
        CHECK(g && g->nval == w->nval && g->ncall == w->ncall, "%s: entry %s missing or of another shape", what,
              w->name);
        if (!g || g->nval != w->nval) continue;
        double amax = 0, dmax = 0;
        for (uint32_t j = 0; j < w->nval; j++) {
            if (w->values[j] > amax) amax = w->values[j];
            double d = fabs((double)g->values[j] - (double)w->values[j]);
            if (!(d <= dmax)) dmax = d;
            nonzero += w->values[j] > 0;
        }
        double r = amax > 0 ? dmax / amax : dmax;
        if (!(r <= worst)) worst = r;
        CHECK(r <= tol, "%s: %s differs by %.3g of its largest value %.3g", what, w->name, r, amax);
    }
    printf("%-34s %u entries, %u nonzero values; max |d| = %.3g of an entry's largest\n", what, want->n_entries,
           nonzero, worst);
    CHECK(nonzero > 0, "%s: every value is 0", what);
    ds4_imatrix_free(got);
    ds4_imatrix_free(want);
}

static int cmd_imatrix(int argc, char **argv) {
    if (argc < 1) return 2;
    const char *path = argv[0];
    uint32_t n = 40, chunk = 16;
    bool split = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-split")) {
            split = false;
            continue;
        }
        if (i + 1 >= argc) return 2;
        const char *v = argv[++i];
        if (!strcmp(argv[i - 1], "--prompt")) n = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(argv[i - 1], "--chunk")) chunk = (uint32_t)strtoul(v, NULL, 10);
        else return 2;
    }
    ds4_err err = {0};
    ds4_weights *w = ds4_weights_open(path, &err);
    if (!w) die(path, &err);
    uint32_t V = w->cfg.n_vocab, total = n + n / 2 + 3;
    uint32_t *toks = malloc(total * sizeof(uint32_t));
    uint64_t s = 4242;
    for (uint32_t i = 0; i < total; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (uint32_t)((s >> 33) % V);
    }
    printf("%s: imatrix collection, prompts of %u and %u tokens, chunks of %u\n", path, n, n / 2 + 3, chunk);
    uint64_t rc = imatrix_collect("cpu", w, toks, n, chunk, 0, "imx-cpu.dat");
    uint64_t rg = imatrix_collect("cuda", w, toks, n, chunk, 0, "imx-cuda.dat");
    printf("%-34s cpu %llu, cuda %llu (want %llu)\n", "routed (token, expert) pairs", (unsigned long long)rc,
           (unsigned long long)rg, (unsigned long long)total * w->cfg.n_expert_used * w->cfg.n_layer);
    CHECK(rc == rg && rc == (uint64_t)total * w->cfg.n_expert_used * w->cfg.n_layer,
          "routed pairs: cpu %llu, cuda %llu", (unsigned long long)rc, (unsigned long long)rg);
    imatrix_compare("cuda against cpu", "imx-cuda.dat", "imx-cpu.dat", 2e-4);
    if (split) {
        /* half the routed bytes on the GPU: the rest streamed in prefill */
        ds4_imcol *probe = ds4_imcol_new(&w->cfg, &err);
        ds4_backend_opts o = {
            .ctx_size = n + 8, .prefill_chunk = chunk, .no_sim = true, .cuda_graph_ctx = 64, .imatrix = probe};
        ds4_backend *ref = probe ? ds4_backend_create("cuda", w, &o, &err) : NULL;
        if (!ref) die("cuda", &err);
        ds4_offload_info ri;
        CHECK(ds4_cuda_offload_info(ref, &ri) == 0 && !ri.on, "every expert on the GPU");
        uint64_t budget = ri.dev_fixed + (ri.dev_allocated - ri.dev_fixed) / 2;
        ds4_backend_free(ref);
        ds4_imcol_free(probe);
        uint64_t rs = imatrix_collect("cuda", w, toks, n, chunk, budget, "imx-split.dat");
        CHECK(rs == rc, "split: routed pairs %llu, cpu %llu", (unsigned long long)rs, (unsigned long long)rc);
        imatrix_compare("cuda, half the experts streamed", "imx-split.dat", "imx-cpu.dat", 2e-4);
    }
    unlink("imx-cpu.dat");
    unlink("imx-cuda.dat");
    unlink("imx-split.dat");
    free(toks);
    ds4_weights_close(w);
    return 0;
}

int main(int argc, char **argv) {
    int rc = 2;
    if (argc >= 2 && !strcmp(argv[1], "compare")) rc = cmd_compare(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "rewind")) rc = cmd_rewind(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "golden")) rc = cmd_golden(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "batch")) rc = cmd_batch(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "split")) rc = cmd_split(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "mtp")) rc = cmd_mtp(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "steer")) rc = cmd_steer(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "imatrix")) rc = cmd_imatrix(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "stages")) rc = cmd_stages(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "resize")) rc = cmd_resize(argc - 2, argv + 2);
    else if (argc >= 2 && !strcmp(argv[1], "tp")) rc = cmd_tp(argc - 2, argv + 2);
    if (rc == 2) {
        fprintf(stderr,
                "usage: test_cuda compare MODEL [--prompt N] [--steps N] [--chunk N] [--seed S] [--no-sim]\n"
                "                         [--tol X] [--loose] [--graph-ctx N]\n"
                "       test_cuda golden MODEL GOLDEN [N]\n"
                "       test_cuda rewind MODEL [--no-sim] [--quick]\n"
                "       test_cuda batch MODEL [--no-sim] [--sessions N] [--steps N] [--snap-at N] [--prompt-max N] [--tol X]\n"
                "       test_cuda split MODEL [--prompt N] [--steps N] [--seed S] [--no-sim] [--tol X]\n"
                "                       [--quick]\n"
                "       test_cuda mtp MODEL MTP MTP_GOLDEN [--quick]\n"
                "       test_cuda steer MODEL [--prompt N] [--steps N]\n"
                "       test_cuda imatrix MODEL [--prompt N] [--chunk N] [--no-split]\n"
                "       test_cuda stages MODEL [--prompt N] [--steps N] [--chunk N] [--no-sim] [--tol X] [--quick]\n"
                "                        [--gpus G]\n"
                "       test_cuda resize MODEL [--no-sim] [--quick | --long]\n"
                "       test_cuda tp MODEL [--tp N] [--prompt N] [--steps N] [--chunk N] [--no-sim] [--tol X]\n");
        return 2;
    }
    if (rc == 0 && failures) printf("%d check(s) failed\n", failures);
    return rc || failures ? 1 : 0;
}
