/*
 * ds4-bench - prefill and generation throughput at growing context
 * frontiers, with ds4's options and CSV (docs/PERFORMANCE.md).
 *
 *   ds4-bench [-m MODEL | --synthetic RECIPE] [options]
 *
 * Loads once and walks a fixed token sequence frontier by frontier (ctx-start,
 * then + step-incr or x step-mul up to ctx-max): prefills only the new
 * interval (incremental), snapshots the session to RAM, generates a fixed
 * number of greedy tokens, restores the snapshot and goes on.  One CSV row
 * per frontier:
 *
 *   ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes
 *
 * (kvcache_bytes: the DSV4 payload size of the snapshot at that frontier).
 *
 * --parallel 1,4,8,16,32,64 measures many sessions at once instead: a
 * context of --session-ctx tokens is prefilled once and restored into each
 * of N sessions (sequences of one backend), which then generate
 * --gen-tokens greedy tokens together, one token each per batched step.
 * For each N one CSV row gives the aggregate tokens/s and the median and
 * 99th-percentile time per output token (a session's time between two of
 * its tokens: a step's).  Then --arrive tokens of a new prompt arrive
 * among --arrive-among decoding sessions and are prefilled in pieces
 * beside their rows, as the server cuts them (engine/pace.h: each step
 * about 1.75 times the decoders' step alone), or of --step-rows rows a
 * step in all: the decoders' times per token while it goes in, against
 * theirs before it came.
 *
 *   mode,sessions,ctx_tokens,steps,agg_tps,p50_ms,p99_ms
 *
 * With an MTP block (--mtp FILE, or --mtp-draft N with --synthetic: a
 * synthetic block of the same recipe) each frontier also runs speculative
 * generation of gen-tokens tokens with N drafts a cycle, drafts verified in
 * one batched step of N + 1 rows, and the row gains
 *
 *   mtp_draft,mtp_forced,step_ms,verify_ms,verify_ratio,draft_ms,
 *   mtp_tps,tokens_per_verify,accept_rate,proj_tps_a08
 *
 * step_ms: a plain decode step (the generation above); verify_ms: the
 * verification step, verify_ratio its cost in 1-row steps; draft_ms: the
 * MTP block's passes of a cycle (N drafts, the rows that catch up with the
 * accepted tokens); mtp_tps: tokens committed a second; proj_tps_a08: the
 * rate the measured cycle gives at a per-draft acceptance of 0.8
 * ((1 - 0.8^(N+1)) / 0.2 tokens a cycle).  Greedy verification accepts the
 * longest prefix of drafts the target agrees with; --mtp-forced accepts
 * every draft (a benchmark-only mode: its rate is an upper bound, never a
 * model's output).
 * A summary on stderr gives, for generation, the weight bytes a token
 * streams and the effective bandwidth, against the device copy bandwidth
 * measured in the same run (CUDA).  When routed experts stay in host RAM
 * (--gpu-mem, docs/DESIGN.md 3.5) it also gives the host's measured read
 * bandwidth, the routed bytes the CPU reads a token, and generation
 * against the rate that bandwidth allows for them.  --expert-profile-out
 * writes the experts' use over the run (model/placement.h), for a later
 * --expert-profile.
 *
 * --synthetic SHAPE-RECIPE (flash-q2, flash-q4, pro-q2, pro-q4; q2 and q4
 * mean Flash's) runs a published model's shapes without a file: the CUDA
 * backend fills a full-size model with seeded random valid blocks in GPU
 * memory (ds4_weights_synthetic), so speed is measured at the real sizes.
 * --layers A:B keeps layers A..B (inclusive, ds4's spelling) of it (their ratios and hash routing as
 * in the whole model, with the embedding and output head): a model too large
 * for one GPU (Pro: 61 layers, 433 GiB at q2) is measured a slice at a time
 * at its real width, and the whole model's speed is projected from the
 * slice's per-layer cost for one GPU with the experts that do not fit read
 * from host memory, and for pipelines over 4 and 8 GPUs (project_whole: the
 * assumptions are printed with the numbers).
 * The token sequence is, in order of preference: --prompt-file (raw text,
 * tokenized without a chat template, as ds4's bench; I Promessi Sposi,
 * Project Gutenberg ebook #45334, is the customary one), --chat-prompt-file (the text as
 * one non-thinking user message of the chat template, system text from
 * -sys), --tokens-file (ids, as ds4-forward reads them), or seeded random
 * ids (the only choice with --synthetic, which has no tokenizer).
 *
 * The model is -m FILE, ds4flash.gguf when neither it nor --synthetic is
 * given (as in ds4's bench).  The options are the table in parse_args
 * (ds4-bench --help prints it).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <math.h>

#include "base/clock.h"
#include "base/numparse.h"
#include "base/rank.h"
#include "engine/cli.h"
#include "engine/pace.h"
#include "engine/spec.h"
#include "engine/startup.h"
#include "base/threads.h"
#include "model/backends.h"
#include "model/imatrix_collect.h"
#include "model/placement.h"
#include "model/weights.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

typedef struct opts {
    const char *model, *synthetic, *backend, *tokens_file, *prompt_file, *chat_file, *system, *csv, *layers;
    const char *profile, *profile_out;
    bool model_given, warm_weights, imatrix;
    uint32_t ctx_start, ctx_max, ctx_alloc, step_incr, gen, seed;
    const char *mtp;          /* the MTP block's file */
    uint32_t draft;           /* drafts a cycle; with an MTP block, speculative generation too */
    bool draft_given, forced; /* forced: every draft accepted (an upper bound) */
    float step_mul;
    bool ctx_alloc_given;
    /* --parallel: the session counts, each session's context, the prompt
     * arriving among the decoders, their number, the rows a step holds */
    uint32_t par[16], n_par, sess_ctx, arrive, among, step_rows;
    float stretch; /* --pace-stretch */
    float gpu_gib, host_gbps, link_gbps, hop_us; /* the projection's assumptions */
    ds4_backend_opts bo;
    ds4_cli_steer steer;
    ds4_dist_opts dist;
    /* derived */
    ds4_config full;         /* the synthetic model's whole shape */
    const char *recipe;      /* its recipe */
    uint32_t layer0, layer1; /* --layers: the slice [layer0, layer1) */
} opts;

static const char ABOUT[] =
    "Prefill and generation throughput at growing context frontiers.  The model loads once; a fixed\n"
    "token sequence is walked frontier by frontier (ctx-start, then + step-incr or x step-mul up to\n"
    "ctx-max): only the new interval is prefilled, the session is snapshotted, gen-tokens greedy tokens\n"
    "are generated, the snapshot is restored.  One CSV row per frontier:\n"
    "  ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes\n"
    "The tokens: --prompt-file, --chat-prompt-file or --tokens-file, else seeded random ids (said so\n"
    "on stderr; the only choice with --synthetic, which has no tokenizer).";

/* ds4's options this program refuses, with the reason. */
static const char *refused(const char *name) {
    if (!strcmp(name, "--mtp-margin"))
        return "ds4-bench drafts --mtp-draft tokens every cycle, whatever the block's confidence";
    return ds4_option_not_supported(name);
}

/* Steps the arriving prompt takes at most, a piece beside the decoders'
 * rows. */
static uint32_t par_arrive_steps(const opts *o) {
    if (!o->arrive) return 0;
    uint32_t piece = o->step_rows ? o->step_rows - o->among : DS4_PACE_MIN;
    return (o->arrive + piece - 1) / piece;
}

/* --parallel LIST: session counts, 1 to 1024 each, comma-separated. */
static int parse_parallel(void *ctx, const char *value, ds4_err *err) {
    opts *o = ctx;
    o->n_par = 0;
    for (const char *p = value;;) {
        char item[16];
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof(item))
            return ds4_err_set(err, DS4_EINVAL, "'%s' is not a list of session counts (like 1,4,8)", value);
        memcpy(item, p, n);
        item[n] = 0;
        if (o->n_par == sizeof(o->par) / sizeof(o->par[0]))
            return ds4_err_set(err, DS4_EINVAL, "at most %zu session counts", sizeof(o->par) / sizeof(o->par[0]));
        if (ds4_parse_u32(item, 1, 1024, &o->par[o->n_par++]))
            return ds4_err_set(err, DS4_EINVAL, "session count '%s': need 1 to 1024", item);
        if (!p[n]) return 0;
        p += n + 1;
    }
}

/* Returns -1 to run, else the status to exit with. */
static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof(*o));
    ds4_opt table[] = {
        {DS4_OPT_SECTION("model and runtime:")},
        DS4_CLI_MODEL(&o->model, .seen = &o->model_given),
        {DS4_OPT_CHOICE("--synthetic", "SHAPE-RECIPE", &o->synthetic, "flash-q2|flash-q4|pro-q2|pro-q4|q2|q4", NULL,
                        "instead of a file, a full-size model of the published shapes (q2, q4: Flash's) of seeded "
                        "random valid blocks built in GPU memory (CUDA backend)")},
        {DS4_OPT_STR("--layers", "A:B", &o->layers, NULL,
                     "layers A..B, inclusive (ds4's spelling): under mpirun this rank's stage (A:output ends "
                     "with the output head); with --gpus a range a GPU, by commas; else, with --synthetic, a "
                     "slice of the model (with the embedding and output head) whose per-layer cost projects the "
                     "whole model's speed"),
         .def_text = "all; under mpirun split by memory"},

        {DS4_OPT_SECTION("projection (with --layers):")},
        {DS4_OPT_FLOAT("--gpu-gib", "GIB", &o->gpu_gib, 1.0, 1e6, 141.0,
                       "memory of one GPU of the projection (141: an H200)")},
        {DS4_OPT_FLOAT("--host-gbps", "GB/S", &o->host_gbps, 0.1, 1e6, 50.0,
                       "host to GPU bandwidth for experts that do not fit one GPU (50: PCIe 5 x16 in practice)")},
        {DS4_OPT_FLOAT("--link-gbps", "GB/S", &o->link_gbps, 0.1, 1e6, 400.0,
                       "GPU to GPU bandwidth of a pipeline hop (400: NVLink 4 one way)")},
        {DS4_OPT_FLOAT("--hop-us", "US", &o->hop_us, 0.0, 1e6, 10.0, "fixed latency of a pipeline hop")},
        DS4_CLI_BACKEND(&o->backend, NULL),
        DS4_CLI_THREADS(&o->bo.n_threads),
        DS4_CLI_DIST_PIPE(&o->dist),
        DS4_CLI_TP(&o->bo.tensor_parallel),
        DS4_CLI_WARM_WEIGHTS(&o->warm_weights),
        DS4_CLI_NO_SIM(&o->bo.no_sim),
        DS4_CLI_QUALITY("ds4-bench"),
        DS4_CLI_OFFLOAD(&o->bo.gpu_mem, &o->profile, &o->bo.host_mapped),
        {DS4_OPT_STR("--expert-profile-out", "FILE", &o->profile_out, NULL,
                     "write how often each routed expert was chosen over the run: an expert profile for "
                     "--expert-profile (CUDA)"),
         .flags = DS4_OPT_OUT},
        DS4_CLI_STEERING(&o->steer),
        {DS4_OPT_U32("--chunk", "N", &o->bo.prefill_chunk, 1, DS4_CTX_MAX, 0, "tokens per batched prefill pass"),
         .def_text = "2048"},
        {DS4_OPT_U32("--seed", "N", &o->seed, 0, UINT32_MAX, 1, "seed of the random ids and synthetic weights")},
        {DS4_OPT_FLAG("--imatrix", &o->imatrix,
                      "collect an importance matrix in the prefills (as ds4-imatrix), to time what it costs")},

        {DS4_OPT_SECTION("tokens:")},
        {DS4_OPT_STR("--prompt-file", "FILE", &o->prompt_file, NULL,
                     "raw text, tokenized without a chat template (as ds4's bench)"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--chat-prompt-file", "FILE", &o->chat_file, NULL,
                     "the text as one non-thinking user message of the chat template"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("-sys, --system", "TEXT", &o->system, NULL, "system prompt of --chat-prompt-file"),
         .def_text = "none"},
        {DS4_OPT_STR("--tokens-file", "FILE", &o->tokens_file, NULL, "token ids (as ds4-forward reads them)"),
         .flags = DS4_OPT_IN},

        {DS4_OPT_SECTION("frontiers:")},
        {DS4_OPT_U32("--ctx-start", "N", &o->ctx_start, 1, DS4_CTX_MAX, 2048, "first frontier")},
        {DS4_OPT_U32("--ctx-max", "N", &o->ctx_max, 1, DS4_CTX_MAX, 32768, "last frontier")},
        {DS4_OPT_U32("--ctx-alloc", "N", &o->ctx_alloc, 1, DS4_CTX_MAX, 0,
                     "context allocated (must exceed ctx-max + gen-tokens)"),
         .def_text = "ctx-max + gen-tokens (+ mtp-draft) + 1", .seen = &o->ctx_alloc_given},
        {DS4_OPT_FLOAT("--step-mul", "F", &o->step_mul, 1.0, HUGE_VAL, 1.0,
                       "multiply the frontier by F (1: add --step-incr instead)")},
        {DS4_OPT_U32("--step-incr", "N", &o->step_incr, 1, DS4_CTX_MAX, 2048, "tokens added per frontier")},
        {DS4_OPT_U32("-n, --tokens, --gen-tokens", "N", &o->gen, 0, DS4_CTX_MAX, 128,
                     "greedy tokens generated at each frontier")},
        {DS4_OPT_STR("--csv", "FILE", &o->csv, NULL, "write the CSV to FILE"), .def_text = "stdout",
         .flags = DS4_OPT_OUT},

        {DS4_OPT_SECTION("MTP speculative decoding:")},
        {DS4_OPT_STR("--mtp", "FILE", &o->mtp, NULL,
                     "the MTP block's GGUF: each frontier also generates speculatively (with --synthetic, "
                     "--mtp-draft alone makes a synthetic block)"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_U32("--mtp-draft", "N", &o->draft, 1, DS4_MTP_DRAFT_MAX, 2, "drafts a cycle verifies"),
         .seen = &o->draft_given},
        {DS4_OPT_FLAG("--mtp-forced", &o->forced,
                      "accept every draft: the rate a perfect draft would give (an upper bound, for benchmarks only)")},

        {DS4_OPT_SECTION("many sessions at once (instead of frontiers):")},
        {DS4_OPT_CALL("--parallel", "LIST", parse_parallel, o,
                      "session counts to measure, comma-separated (1,4,8,16,32,64): each generates gen-tokens "
                      "tokens beside the others")},
        {DS4_OPT_U32("--session-ctx", "N", &o->sess_ctx, 1, DS4_CTX_MAX, 4096,
                     "tokens of context each session starts with")},
        {DS4_OPT_U32("--arrive", "N", &o->arrive, 0, DS4_CTX_MAX, 32768,
                     "then a prompt of N tokens arriving among decoding sessions (0: none)")},
        {DS4_OPT_U32("--arrive-among", "N", &o->among, 1, 1024, 16, "the decoding sessions it arrives among")},
        {DS4_OPT_U32("--step-rows", "N", &o->step_rows, 0, DS4_CTX_MAX, 0,
                     "rows a step holds while the prompt goes in (its decoders' and a piece of it); 0: pieces "
                     "cut as the server cuts them (--pace-stretch)")},
        {DS4_OPT_FLOAT("--pace-stretch", "F", &o->stretch, 0.0, 100.0, DS4_PACE_STRETCH,
                       "the arriving prompt's pieces cut so that each step takes about F times the decoders' "
                       "alone, as ds4-server --pace-stretch (0: no pacing, pieces of all the room)")},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-bench",
                   .usage = "[-m MODEL | --synthetic SHAPE-RECIPE [--layers A:B]] [options]",
                   .about = ABOUT,
                   .opts = table,
                   .notes = DS4_CLI_ENV_NOTES,
                   .refused = refused};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (o->model_given && o->synthetic) return ds4_cli_usage(&cli, "give one of -m MODEL or --synthetic RECIPE");
    if (o->synthetic) {
        o->model = NULL;
        const char *dash = strchr(o->synthetic, '-');
        o->recipe = dash ? dash + 1 : o->synthetic;
        if (dash && !strncmp(o->synthetic, "pro", 3)) ds4_config_pro(&o->full);
        else ds4_config_flash(&o->full);
        o->layer0 = 0;
        o->layer1 = o->full.n_layer;
    }
    if (o->layers && (ds4_dist_launched() || o->dist.n_gpus)) {
        o->dist.layers = o->layers; /* this rank's stage; with --gpus, every GPU's */
    } else if (o->layers) {
        if (!o->synthetic)
            return ds4_cli_usage(&cli, "--layers needs --synthetic (a slice of a synthetic model) or mpirun");
        char *end, *e2 = NULL;
        unsigned long a = strtoul(o->layers, &end, 10), b = 0;
        bool parsed = end != o->layers && *end == ':' && end[1] >= '0' && end[1] <= '9';
        if (parsed) b = strtoul(end + 1, &e2, 10);
        if (!parsed || *e2 || b < a || b >= o->full.n_layer)
            return ds4_cli_usage(&cli, "--layers %s: need A:B with 0 <= A <= B < %u (the model's layers, inclusive)",
                                 o->layers, o->full.n_layer);
        o->layer0 = (uint32_t)a;
        o->layer1 = (uint32_t)b + 1;
    }
    if (ds4_cli_check_backend(&cli, o->backend) != 0 || ds4_cli_steering_check(&cli, &o->steer) != 0 ||
        ds4_cli_tp_check(&cli, o->bo.tensor_parallel, &o->dist) != 0)
        return 2;
    if (!!o->tokens_file + !!o->prompt_file + !!o->chat_file > 1)
        return ds4_cli_usage(&cli, "give at most one of --prompt-file, --chat-prompt-file, --tokens-file");
    if (o->synthetic && (o->prompt_file || o->chat_file))
        return ds4_cli_usage(&cli, "--synthetic has no tokenizer: use --tokens-file or random ids");
    if (o->system && !o->chat_file) return ds4_cli_usage(&cli, "-sys only applies to --chat-prompt-file");
    if (o->mtp && o->synthetic)
        return ds4_cli_usage(&cli, "--synthetic makes its MTP block itself: give --mtp-draft N without --mtp");
    if ((o->draft_given || o->forced) && !o->mtp && !o->synthetic)
        return ds4_cli_usage(&cli, "--mtp-draft and --mtp-forced need an MTP block (--mtp FILE, or --synthetic)");
    if (o->forced && !o->draft_given && !o->mtp)
        return ds4_cli_usage(&cli, "--mtp-forced with --synthetic needs --mtp-draft N");
    if (o->n_par && (o->mtp || o->draft_given || o->forced))
        return ds4_cli_usage(&cli, "--parallel measures plain decoding: it takes no MTP options");
    if (o->n_par) {
        ds4_err perr = {0};
        if (ds4_pace_check(o->stretch, &perr)) return ds4_cli_usage(&cli, "--pace-stretch %s", perr.msg);
        if (o->arrive && o->step_rows && o->step_rows <= o->among)
            return ds4_cli_usage(&cli, "--step-rows %u leaves no room beside %u decoding sessions", o->step_rows,
                                 o->among);
        if (!o->ctx_alloc_given) {
            uint32_t longest = o->sess_ctx > o->arrive ? o->sess_ctx : o->arrive;
            o->ctx_alloc = longest + o->gen + par_arrive_steps(o) + 1;
        }
        o->ctx_max = o->sess_ctx > o->arrive ? o->sess_ctx : o->arrive; /* the tokens it reads */
        if (o->ctx_start > o->ctx_max) o->ctx_start = o->ctx_max;
        o->bo.ctx_size = o->ctx_alloc;
        return -1;
    }
    if (o->ctx_max < o->ctx_start)
        return ds4_cli_usage(&cli, "need ctx-start <= ctx-max (%u > %u)", o->ctx_start, o->ctx_max);
    /* speculative generation's last verification may reach N tokens past gen-tokens */
    uint32_t over = o->mtp || (o->synthetic && o->draft_given) ? o->draft : 0;
    if (!o->ctx_alloc) o->ctx_alloc = o->ctx_max + o->gen + over + 1;
    if ((uint64_t)o->ctx_alloc <= (uint64_t)o->ctx_max + o->gen + over)
        return ds4_cli_usage(&cli, "--ctx-alloc %u must exceed ctx-max + gen-tokens + mtp-draft (%u + %u + %u)",
                             o->ctx_alloc, o->ctx_max, o->gen, over);
    o->bo.ctx_size = o->ctx_alloc;
    o->bo.count_experts = o->profile_out != NULL;
    if (o->profile_out && o->backend && strcmp(o->backend, "cuda") != 0)
        return ds4_cli_usage(&cli, "--expert-profile-out counts on the CUDA backend");
    return -1;
}

/* Weight bytes one generated token reads: every tensor once (the embedding:
 * one row), and n_expert_used of the routed experts' matrices per layer. */
static double bytes_per_token(const ds4_weights *w) {
    double total = 0;
    for (size_t i = 0; i < ds4_weights_count(w); i++) {
        const ds4_tensor_row *row;
        const ds4_wt *t = ds4_weights_at(w, i, &row);
        if (!t->name || row->cls == DS4_TC_HASH) continue;
        if (row->cls == DS4_TC_TOKEN_EMBD) {
            total += (double)t->row_bytes;
            continue;
        }
        double mats = t->ne[2] > 1 ? (double)w->cfg.n_expert_used : (double)t->ne[2];
        total += (double)t->row_bytes * t->ne[1] * mats;
    }
    return total;
}

/* ------------------------------------------------- slices and projection */

/* Layers [layer0, layer1) of the whole shape as a model of their own: their
 * ratios, and hash routing where the whole model has it (its first layers). */
static void slice_config(const opts *o, ds4_config *c) {
    *c = o->full;
    uint32_t n = o->layer1 - o->layer0;
    c->n_layer = n;
    for (uint32_t il = 0; il < DS4_MAX_LAYERS; il++) {
        c->compress_ratio[il] = il < n ? o->full.compress_ratio[o->layer0 + il] : 0;
        c->swiglu_clamp[il] = il < n ? o->full.swiglu_clamp[o->layer0 + il] : 0.0f;
    }
    uint32_t hash_end = o->full.n_hash_layer < o->layer1 ? o->full.n_hash_layer : o->layer1;
    c->n_hash_layer = hash_end > o->layer0 ? hash_end - o->layer0 : 0;
}

/* Bytes of the tensors of a class set (routed experts, or all but them). */
static double class_bytes(const ds4_weights *w, bool experts) {
    double total = 0;
    for (size_t i = 0; i < ds4_weights_count(w); i++) {
        const ds4_tensor_row *row;
        const ds4_wt *t = ds4_weights_at(w, i, &row);
        if (!t->name) continue;
        bool is_exp = row->cls == DS4_TC_EXP_GATE || row->cls == DS4_TC_EXP_UP || row->cls == DS4_TC_EXP_DOWN;
        if (is_exp == experts) total += (double)t->row_bytes * t->ne[1] * (t->ne[2] ? t->ne[2] : 1);
    }
    return total;
}

/* What a generated token reads outside the layers: one embedding row, the
 * output HC and head. */
static double head_bytes_per_token(const ds4_weights *w) {
    double total = 0;
    for (size_t i = 0; i < DS4_N_GLOBAL_TENSORS; i++) { /* the globals come first */
        const ds4_tensor_row *row;
        const ds4_wt *t = ds4_weights_at(w, i, &row);
        if (!t->name) continue;
        total += row->cls == DS4_TC_TOKEN_EMBD ? (double)t->row_bytes : (double)t->row_bytes * t->ne[1];
    }
    return total;
}

/* The whole model's speed from the slice's (docs/PERFORMANCE.md, "Pro"):
 *  - per layer: decode, the slice's step time less the head's share of the
 *    bytes a token reads, over its layers (decode streams weights); prefill,
 *    the slice's time a token over its layers (the head runs once a chunk);
 *    the slice's mix of ratio-4 and ratio-128 layers stands for the model's;
 *  - 1 GPU: the dense weights, the KV state and 4 GiB of workspace resident,
 *    as many experts as fit the rest; each token reads the active experts
 *    that do not fit from host memory (uniform routing, no caching), a
 *    prefill chunk every non-resident expert once;
 *  - G GPUs: a pipeline of whole layers (the slowest stage holds
 *    ceil(N/G)); one stream decodes through every stage in turn plus G-1
 *    hops of the n_hc x n_embd residual; prefill keeps every stage busy
 *    (a long prompt's chunks in flight), its rate the slowest stage's. */
static void project_whole(const opts *o, const ds4_weights *w, uint32_t ctx, double pre_s_per_tok,
                          double dec_s_per_tok) {
    const ds4_config *f = &o->full;
    ds4_err err = {0};
    ds4_weights *whole = ds4_weights_synthetic(f, o->recipe, o->seed, &err); /* shapes only */
    if (!whole) {
        fprintf(stderr, "ds4-bench: projection: %s\n", ds4_err_msg(&err));
        return;
    }
    double L = (double)(o->layer1 - o->layer0), N = (double)f->n_layer;
    double bpt = bytes_per_token(w), head = head_bytes_per_token(w);
    double t_head = dec_s_per_tok * head / bpt, t_layer = (dec_s_per_tok - t_head) / L, p_layer = pre_s_per_tok / L;
    double experts = class_bytes(whole, true), dense = class_bytes(whole, false);
    double kv = (double)ds4_kv_state_bytes(f, ctx), gpu = (double)o->gpu_gib * 1073741824.0, work = 4.0 * 1073741824.0;
    double per_expert = experts / (N * f->n_expert), active = N * f->n_expert_used * per_expert;
    double chunk = o->bo.prefill_chunk ? o->bo.prefill_chunk : 2048;
    fprintf(stderr,
            "ds4-bench: projection of the whole model (%u layers, %.1f GiB) from layers %u..%u at ctx %u: decode "
            "%.3f ms a layer + %.3f ms head, prefill %.1f us a token a layer\n",
            f->n_layer, (experts + dense) / 1073741824.0, o->layer0, o->layer1 - 1, ctx, t_layer * 1e3, t_head * 1e3,
            p_layer * 1e6);
    double budget = gpu - dense - kv - work;
    double resident = budget <= 0 ? 0 : budget >= experts ? 1 : budget / experts;
    if (budget <= 0) {
        fprintf(stderr, "  1 GPU  (%.0f GiB): the dense weights and KV state alone do not fit\n", o->gpu_gib);
    } else {
        double dec = t_head + N * t_layer + (1 - resident) * active / (o->host_gbps * 1e9);
        double pre = N * p_layer + (1 - resident) * experts / chunk / (o->host_gbps * 1e9);
        fprintf(stderr,
                "  1 GPU  (%.0f GiB): %3.0f%% of the experts resident, the rest from host at %.0f GB/s: decode "
                "%.2f t/s, prefill %.0f t/s\n",
                o->gpu_gib, 100 * resident, o->host_gbps, 1 / dec, 1 / pre);
    }
    for (int g = 4; g <= 8; g += 4) {
        double stage_layers = ceil(N / g), per_gpu = (experts + dense + kv) / g;
        double hop = o->hop_us * 1e-6 + (double)f->n_hc * f->n_embd * 4 / (o->link_gbps * 1e9);
        double dec = t_head + N * t_layer + (g - 1) * hop, pre = stage_layers * p_layer;
        fprintf(stderr, "  %d GPUs (pipeline, %.0f GiB each of %.0f): decode %.2f t/s, prefill %.0f t/s%s\n", g,
                per_gpu / 1073741824.0, o->gpu_gib, 1 / dec, 1 / pre,
                per_gpu + work > gpu ? " (does not fit: more GPUs needed)" : "");
    }
    fprintf(stderr,
            "  assumptions: hops %.0f us + residual at %.0f GB/s; 4 GiB workspace a GPU; uniform routing; the "
            "slice's layer mix stands for the model's\n",
            o->hop_us, o->link_gbps);
    ds4_weights_close(whole);
}

#if DS4_CUDA
/* The host's share of generated tokens with routed experts in host RAM:
 * its hand-offs, entries and CPU seconds (ds4_offload_info) before and
 * after, so the report tells the CPU's work from the waits around it. */
typedef struct host_work {
    uint64_t jobs, entries;
    double sec;
} host_work;

static host_work host_work_now(ds4_backend *b) {
    host_work h = {0, 0, 0};
    ds4_offload_info oi;
    if (!strcmp(b->ops->name, "cuda") && ds4_cuda_offload_info(b, &oi) == 0 && oi.on) {
        h.jobs = oi.host_jobs;
        h.entries = oi.host_entries;
        h.sec = oi.host_sec;
    }
    return h;
}

static void host_work_report(const host_work *a, const host_work *z, uint32_t tokens, double sec) {
    double jobs = (double)(z->jobs - a->jobs), cpu = z->sec - a->sec;
    if (jobs <= 0) return;
    fprintf(stderr,
            "          host experts: %.1f hand-offs and %.1f (token, expert) entries a token; the CPU's work %.2f ms "
            "a token (%.0f us a hand-off) of the token's %.2f ms\n",
            jobs / tokens, (double)(z->entries - a->entries) / tokens, 1e3 * cpu / tokens, 1e6 * cpu / jobs,
            1e3 * sec / tokens);
}

/* The host's read bandwidth: `threads` threads each summing its part of a
 * buffer far beyond the caches, best of three passes. */
typedef struct bw_task {
    const uint64_t *p;
    size_t words;
    uint64_t *sums;
} bw_task;

static void bw_read(void *ctx, int64_t a, int64_t z, int thread) {
    const bw_task *t = ctx;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = (size_t)a * 4096; i < (size_t)z * 4096 && i < t->words; i += 4) {
        s0 += t->p[i];
        s1 += t->p[i + 1];
        s2 += t->p[i + 2];
        s3 += t->p[i + 3];
    }
    t->sums[thread] += s0 ^ s1 ^ s2 ^ s3;
}

static double host_bandwidth(int threads, ds4_err *err) {
    size_t bytes = (size_t)4 << 30, words = bytes / 8;
    uint64_t *p = malloc(bytes);
    ds4_pool *pool = ds4_pool_create(threads, err);
    uint64_t *sums = pool ? calloc((size_t)ds4_pool_size(pool), sizeof(uint64_t)) : NULL;
    if (!p || !pool || !sums) {
        free(p);
        free(sums);
        ds4_pool_free(pool);
        if (!err->msg[0]) ds4_err_set(err, DS4_ENOMEM, "no room for the host bandwidth probe");
        return -1;
    }
    for (size_t i = 0; i < words; i++) p[i] = i * 0x9E3779B97F4A7C15ull;
    bw_task t = {p, words, sums};
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double a = ds4_now();
        ds4_pool_run(pool, (int64_t)(words / 4096), 64, bw_read, &t);
        double s = ds4_now() - a;
        if (s < best) best = s;
    }
    uint64_t x = 0;
    for (int i = 0; i < ds4_pool_size(pool); i++) x ^= sums[i];
    free(p);
    free(sums);
    ds4_pool_free(pool);
    return x == 1 ? 0 : (double)bytes / best; /* x keeps the sums alive */
}
#endif

static char *read_file(const char *path, size_t *len, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap = cap ? cap * 2 : 1 << 20);
            if (!nb) {
                free(buf);
                fclose(f);
                ds4_err_set(err, DS4_ENOMEM, "out of memory reading %s", path);
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        ds4_err_set(err, DS4_EIO, "reading %s failed", path);
        return NULL;
    }
    *len = n;
    return buf;
}

/* The prompt file's tokens: raw text, or one non-thinking user message. */
static int text_tokens(const opts *o, const ds4_weights *w, ds4_tokens *out, ds4_err *err) {
    const char *path = o->prompt_file ? o->prompt_file : o->chat_file;
    size_t len = 0;
    char *text = read_file(path, &len, err);
    if (!text) return -1;
    ds4_vocab *v = ds4_vocab_from_gguf(w->gguf, err);
    ds4_tokenizer *tk = v ? ds4_tokenizer_new(v, err) : NULL;
    int rc = -1;
    if (tk && o->prompt_file) {
        rc = ds4_tokenize_text(tk, text, len, out, err);
    } else if (tk) {
        json_t *msgs = json_array();
        if (o->system) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
        json_array_append_new(msgs, json_pack("{s:s,s:s%}", "role", "user", "content", text, len));
        ds4_chat_opts co = {.think = DS4_THINK_OFF};
        ds4_rendered r = {0};
        rc = ds4_chat_render(msgs, &co, &r, err);
        if (rc == 0) rc = ds4_tokenize_rendered(tk, &r, out, err);
        ds4_rendered_free(&r);
        json_decref(msgs);
    }
    ds4_tokenizer_free(tk);
    ds4_vocab_free(v);
    free(text);
    return rc;
}

static uint32_t *load_tokens(const opts *o, const ds4_weights *w, uint32_t n, ds4_err *err) {
    uint32_t vocab = w->cfg.n_vocab;
    uint32_t *t = malloc((size_t)n * sizeof(uint32_t));
    if (!t) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    if (o->prompt_file || o->chat_file) {
        ds4_tokens ids = {0};
        int rc = text_tokens(o, w, &ids, err);
        if (rc == 0 && ids.n < n)
            rc = ds4_err_set(err, DS4_EINVAL, "%s gives %zu tokens, ctx-max needs %u",
                             o->prompt_file ? o->prompt_file : o->chat_file, ids.n, n);
        if (rc == 0)
            for (uint32_t i = 0; i < n; i++) t[i] = (uint32_t)ids.ids[i];
        ds4_tokens_free(&ids);
        if (rc != 0) {
            free(t);
            return NULL;
        }
        return t;
    }
    if (!o->tokens_file) {
        uint64_t s = o->seed * 0x9E3779B97F4A7C15ull + 1;
        for (uint32_t i = 0; i < n; i++) {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            t[i] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 33) % vocab;
        }
        return t;
    }
    FILE *f = fopen(o->tokens_file, "r");
    if (!f) {
        ds4_err_set(err, DS4_EIO, "cannot open %s: %s", o->tokens_file, strerror(errno));
        free(t);
        return NULL;
    }
    uint32_t m = 0;
    unsigned long v;
    while (m < n && fscanf(f, " %lu%*[, \t\n]", &v) == 1) {
        if (v >= vocab) {
            ds4_err_set(err, DS4_EINVAL, "%s: token %lu outside the vocabulary", o->tokens_file, v);
            break;
        }
        t[m++] = (uint32_t)v;
    }
    fclose(f);
    if (m < n) {
        if (!err || !err->msg[0])
            ds4_err_set(err, DS4_EINVAL, "%s holds %u tokens, ctx-max needs %u", o->tokens_file, m, n);
        free(t);
        return NULL;
    }
    return t;
}

/* The frontier after f: x step-mul or + step-incr, at least one token
 * more, at most ctx-max. */
static uint32_t next_frontier(const opts *o, uint32_t f) {
    uint64_t next = o->step_mul > 1.0f ? (uint64_t)((double)f * o->step_mul) : (uint64_t)f + o->step_incr;
    if (next <= f) next = (uint64_t)f + 1;
    return next > o->ctx_max ? o->ctx_max : (uint32_t)next;
}

/* ------------------------------------------------ many sessions at once */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The q-quantile of n times (sorted in place), nearest rank. */
static double quantile(double *t, uint32_t n, double q) {
    qsort(t, n, sizeof(double), cmp_double);
    uint32_t i = (uint32_t)(q * n + 0.999999);
    return t[i ? i - 1 : 0];
}

/* The sessions of a measurement: sequences, the token each appends next. */
typedef struct par_run {
    ds4_backend *b;
    ds4_seq **seq;
    uint32_t *next;
    ds4_row *rows;
    float *logits;
} par_run;

/* Every session of the n first back to the snapshot, its next token the
 * argmax of the snapshot's logits. */
static int par_restore(par_run *r, uint32_t n, const ds4_kv_state *snap, ds4_err *err) {
    for (uint32_t k = 0; k < n; k++) {
        if (ds4_seq_restore(r->b, r->seq[k], snap, err)) return -1;
        r->next[k] = (uint32_t)ds4_argmax(snap->logits, (int)r->b->w->cfg.n_vocab);
    }
    return 0;
}

/* One step: a token for each of the n first sessions (a lone session: its
 * decode, through the backend's single-stream path), then `extra` rows
 * of sequence xs (tokens xt; their last one's logits asked for when last). */
static int par_step(par_run *r, uint32_t n, ds4_seq *xs, const uint32_t *xt, uint32_t extra, bool last, ds4_err *err) {
    size_t V = r->b->w->cfg.n_vocab;
    if (n == 1 && extra == 0) return ds4_seq_greedy(r->b, r->seq[0], 1, &r->next[0], err);
    for (uint32_t k = 0; k < n; k++) r->rows[k] = ds4_row_of(r->seq[k], r->next[k], DS4_ROW_LOGITS);
    for (uint32_t i = 0; i < extra; i++)
        r->rows[n + i] = ds4_row_of(xs, xt[i], last && i + 1 == extra ? DS4_ROW_LOGITS : 0);
    ds4_step_out out = {r->logits, NULL};
    if (ds4_backend_step(r->b, r->rows, n + extra, &out, err)) return -1;
    for (uint32_t k = 0; k < n; k++) r->next[k] = (uint32_t)ds4_argmax(r->logits + k * V, (int)V);
    return 0;
}

/* gen steps of the n first sessions: their times into t. */
static int par_decode(par_run *r, uint32_t n, uint32_t gen, double *t, ds4_err *err) {
    for (uint32_t i = 0; i < gen; i++) {
        double a = ds4_now();
        if (par_step(r, n, NULL, NULL, 0, false, err)) return -1;
        t[i] = ds4_now() - a;
    }
    return 0;
}

static void par_row(FILE *out, const char *mode, uint32_t n, uint32_t ctx, double *t, uint32_t steps) {
    double sum = 0;
    for (uint32_t i = 0; i < steps; i++) sum += t[i];
    double agg = steps ? n * steps / sum : 0, p50 = steps ? quantile(t, steps, 0.5) * 1e3 : 0,
           p99 = steps ? quantile(t, steps, 0.99) * 1e3 : 0;
    fprintf(out, "%s,%u,%u,%u,%.2f,%.3f,%.3f\n", mode, n, ctx, steps, agg, p50, p99);
    fflush(out);
    fprintf(stderr, "ds4-bench: %-14s %3u sessions at %u: %8.1f tokens/s in all, per token p50 %.2f ms, p99 %.2f ms\n",
            mode, n, ctx, agg, p50, p99);
}

/* The prompt of o->arrive tokens goes in beside o->among decoders, in the
 * pacer's pieces or of step_rows - among rows a step; their times per
 * token before (gen steps) and while it goes in. */
static int par_arrival(const opts *o, par_run *r, const ds4_kv_state *snap, const uint32_t *prompt, FILE *out,
                       ds4_err *err) {
    uint32_t n = o->among, most = par_arrive_steps(o), steps = 0;
    uint32_t room = (o->step_rows ? o->step_rows : r->b->opts.prefill_chunk) - n;
    double *t = malloc((size_t)(o->gen + most + 1) * sizeof(double));
    ds4_pacer pace = {.stretch = o->stretch};
    ds4_seq *a = NULL;
    int rc = -1;
    if (!t) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (!(a = ds4_seq_new(r->b, o->arrive + 1, err)) || par_restore(r, n, snap, err) ||
        par_decode(r, n, o->gen, t, err))
        goto done;
    for (uint32_t i = 0; i < o->gen; i++) ds4_pace_note(&pace, n, 0, t[i]);
    double steady = quantile(t, o->gen, 0.99);
    double a0 = ds4_now();
    for (uint32_t done_tok = 0; done_tok < o->arrive; steps++) {
        uint32_t piece = o->step_rows ? room : ds4_pace_piece(&pace, n, room);
        uint32_t m = o->arrive - done_tok < piece ? o->arrive - done_tok : piece;
        double s0 = ds4_now();
        if (par_step(r, n, a, prompt + done_tok, m, done_tok + m == o->arrive, err)) goto done;
        t[steps] = ds4_now() - s0;
        ds4_pace_note(&pace, n, m, t[steps]);
        done_tok += m;
    }
    double took = ds4_now() - a0;
    par_row(out, "prefill+decode", n, o->sess_ctx, t, steps);
    double during = quantile(t, steps, 0.99);
    fprintf(stderr,
            "ds4-bench: a %u-token prompt went in beside %u decoding sessions in %.2f s (%.0f tokens/s, %u steps, "
            "%.0f rows a piece); their p99 per token %.2f ms, %.2fx their steady %.2f ms\n",
            o->arrive, n, took, o->arrive / took, steps, (double)o->arrive / steps, during * 1e3, during / steady,
            steady * 1e3);
    rc = 0;
done:
    ds4_seq_free(r->b, a);
    free(t);
    return rc;
}

/* --parallel: the session context prefilled once (the main sequence),
 * snapshotted, restored into every session of each measurement. */
static int run_parallel(const opts *o, ds4_backend *b, const uint32_t *toks, FILE *out, ds4_err *err) {
    size_t V = b->w->cfg.n_vocab;
    uint32_t most = o->arrive ? o->among : 1;
    for (uint32_t i = 0; i < o->n_par; i++)
        if (o->par[i] > most) most = o->par[i];
    uint32_t seq_ctx = o->sess_ctx + o->gen + par_arrive_steps(o) + 1;
    if (most > b->opts.prefill_chunk)
        return ds4_err_set(err, DS4_EINVAL, "%u sessions exceed the %u rows a step holds (--chunk)", most,
                           b->opts.prefill_chunk);
    uint32_t step_rows = o->step_rows ? o->step_rows : b->opts.prefill_chunk;
    if (o->arrive && step_rows > b->opts.prefill_chunk)
        return ds4_err_set(err, DS4_EINVAL, "--step-rows %u exceeds the %u rows a step holds (--chunk)", o->step_rows,
                           b->opts.prefill_chunk);
    /* logits: a row for each decoder and, in the arrival's last step, the
     * prompt's last row */
    par_run r = {b, calloc(most, sizeof(ds4_seq *)), calloc(most, sizeof(uint32_t)),
                 calloc(most + step_rows, sizeof(ds4_row)), malloc((size_t)(most + 1) * V * sizeof(float))};
    double *t = malloc((size_t)(o->gen + 1) * sizeof(double));
    ds4_kv_state *snap = ds4_backend_state_new(b, err);
    int rc = -1;
    if (!r.seq || !r.next || !r.rows || !r.logits || !t) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    if (!snap) goto done;
    fprintf(stderr, "ds4-bench: prefilling the sessions' context of %u tokens\n", o->sess_ctx);
    double a = ds4_now();
    if (ds4_backend_prefill(b, toks, o->sess_ctx, NULL, err) || ds4_backend_snapshot(b, snap, err)) goto done;
    fprintf(stderr, "ds4-bench: %u tokens prefilled at %.1f tokens/s\n", o->sess_ctx, o->sess_ctx / (ds4_now() - a));
    r.seq[0] = b->main;
    for (uint32_t k = 1; k < most; k++)
        if (!(r.seq[k] = ds4_seq_new(b, seq_ctx, err))) {
            ds4_err_prefix(err, "session %u of %u", k + 1, most);
            goto done;
        } else {
            ds4_seq_set_steering(r.seq[k], b->main->steer_ffn,
                                 b->main->steer_attn); /* as the main one (--dir-steering-*) */
        }
    fprintf(out, "mode,sessions,ctx_tokens,steps,agg_tps,p50_ms,p99_ms\n");
    fflush(out);
    for (uint32_t i = 0; i < o->n_par; i++) {
        uint32_t n = o->par[i];
        if (par_restore(&r, n, snap, err) || par_decode(&r, n, o->gen, t, err)) goto done;
        par_row(out, "decode", n, o->sess_ctx, t, o->gen);
    }
    if (o->arrive && par_arrival(o, &r, snap, toks, out, err)) goto done;
    rc = 0;
done:
    for (uint32_t k = 1; r.seq && k < most; k++) ds4_seq_free(b, r.seq[k]);
    ds4_kv_state_free(snap);
    free(r.seq);
    free(r.next);
    free(r.rows);
    free(r.logits);
    free(t);
    return rc;
}

/* Whether the frontiers run speculative generation too. */
static bool mtp_on(const opts *o) { return o->mtp || (o->synthetic && o->draft_given); }

static uint32_t argmax_of(const float *x, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* One frontier's speculative generation: what the CSV row reports. */
typedef struct mtp_res {
    double verify_s, draft_s, total_s;
    uint64_t cycles, committed, drafted, accepted;
} mtp_res;

/* An MTP step of one row (timed into *t): token paired with hseq's
 * residual at hpos; its logits into lg. */
static int mtp_row(ds4_backend *b, ds4_seq *ms, uint32_t token, uint32_t want, ds4_seq *hseq, uint32_t hpos, float *lg,
                   double *t, ds4_err *err) {
    ds4_row r = ds4_mtp_row(ms, token, want, hseq, hpos);
    ds4_step_out out = {lg, NULL};
    double a = ds4_now();
    int rc = ds4_backend_mtp_step(b, &r, 1, &out, err);
    *t += ds4_now() - a;
    return rc;
}

/* gen tokens after the main sequence's n (its logits the next token's),
 * N drafts a cycle: the drafts (greedy on the block's logits), their
 * verification in one rewindable step of N + 1 rows, the longest agreeing
 * prefix kept (every draft with forced) and the rest rewound, the MTP
 * sequence's drafts dropped and its rows for the kept tokens made.  The
 * caller restores the main sequence. */
static int mtp_generate(ds4_backend *b, const opts *o, mtp_res *r, ds4_err *err) {
    uint32_t N = o->draft, V = b->w->cfg.n_vocab, n = ds4_seq_len(b, b->main);
    memset(r, 0, sizeof(*r));
    const float *cur = ds4_backend_logits(b);
    if (!cur) return ds4_err_set(err, DS4_EINVAL, "MTP generation needs the logits of a prefill");
    float *lg = malloc((size_t)(N + 1) * V * sizeof(float)), *ml = malloc((size_t)V * sizeof(float));
    ds4_seq *ms = ds4_mtp_seq_new(b, 0, err);
    uint32_t tok = argmax_of(cur, V), d[DS4_MTP_DRAFT_MAX + 1];
    ds4_row rows[DS4_MTP_DRAFT_MAX + 1];
    int rc = -1;
    if (!lg || !ml) ds4_err_set(err, DS4_ENOMEM, "out of memory");
    /* the block's first row: the last position's residual with the chosen token */
    if (!lg || !ml || !ms || mtp_row(b, ms, tok, DS4_ROW_LOGITS, b->main, n - 1, ml, &r->draft_s, err)) goto done;
    double t0 = ds4_now();
    while (r->committed < o->gen) {
        d[0] = argmax_of(ml, V);
        if (ds4_backend_mark(b, ms, err)) goto done;
        uint32_t mlen = ds4_seq_len(b, ms);
        for (uint32_t k = 1; k < N; k++) {
            if (mtp_row(b, ms, d[k - 1], DS4_ROW_LOGITS | DS4_ROW_REWIND, ms, mlen + k - 2, ml, &r->draft_s, err))
                goto done;
            d[k] = argmax_of(ml, V);
        }
        if (ds4_backend_mark(b, b->main, err)) goto done;
        rows[0] = ds4_row_of(b->main, tok, DS4_ROW_LOGITS | DS4_ROW_REWIND);
        for (uint32_t k = 0; k < N; k++) rows[k + 1] = ds4_row_of(b->main, d[k], DS4_ROW_LOGITS | DS4_ROW_REWIND);
        ds4_step_out out = {lg, NULL};
        double a = ds4_now();
        if (ds4_backend_step(b, rows, N + 1, &out, err)) goto done;
        r->verify_s += ds4_now() - a;
        uint32_t keep = 1; /* rows kept: tok and the drafts the target agrees with */
        while (keep <= N && (o->forced || argmax_of(lg + (size_t)(keep - 1) * V, V) == d[keep - 1])) keep++;
        uint32_t next = argmax_of(lg + (size_t)(keep - 1) * V, V);
        a = ds4_now();
        if ((keep <= N && ds4_backend_rewind(b, b->main, n + keep, err)) || ds4_backend_rewind(b, ms, mlen, err))
            goto done;
        /* the block's rows for the kept positions, each residual with the token after it */
        for (uint32_t i = 0; i < keep; i++)
            rows[i] = ds4_mtp_row(ms, i + 1 < keep ? d[i] : next, i + 1 == keep ? DS4_ROW_LOGITS : 0, b->main, n + i);
        out.logits = ml;
        if (ds4_backend_mtp_step(b, rows, keep, &out, err)) goto done;
        r->draft_s += ds4_now() - a;
        n += keep;
        r->committed += keep;
        r->accepted += keep - 1;
        r->drafted += N;
        r->cycles++;
        tok = next;
    }
    r->total_s = ds4_now() - t0;
    rc = 0;
done:
    if (ms) ds4_seq_free(b, ms);
    free(lg);
    free(ml);
    return rc;
}

/* The MTP columns of a frontier's row, and its summary line. */
static void mtp_report(FILE *out, const opts *o, const mtp_res *r, double step_s) {
    double cyc = r->cycles ? (double)r->cycles : 1.0, tps = r->committed / r->total_s;
    double verify_ms = 1e3 * r->verify_s / cyc, draft_ms = 1e3 * r->draft_s / cyc, step_ms = 1e3 * step_s;
    double a = 0.8, per_cycle = (1.0 - pow(a, o->draft + 1)) / (1.0 - a), proj = per_cycle / (r->total_s / cyc);
    double acc = r->drafted ? (double)r->accepted / (double)r->drafted : 0.0, tpv = r->committed / cyc;
    fprintf(out, ",%u,%d,%.3f,%.3f,%.3f,%.3f,%.2f,%.3f,%.4f,%.2f", o->draft, o->forced, step_ms, verify_ms,
            step_ms > 0 ? verify_ms / step_ms : 0.0, draft_ms, tps, tpv, acc, proj);
    fprintf(stderr,
            "          MTP, %u drafts a cycle%s: verifying %u rows %.2f ms = %.2fx a 1-row step (%.2f ms), drafting "
            "%.2f ms a cycle; %.1f t/s committed, %.2f tokens a verification, %.0f%% of drafts accepted; at "
            "acceptance 0.8: %.1f t/s\n",
            o->draft, o->forced ? " (forced acceptance: an upper bound)" : "", o->draft + 1, verify_ms,
            step_ms > 0 ? verify_ms / step_ms : 0.0, step_ms, draft_ms, tps, tpv, 100.0 * acc, proj);
}

/* The backend: the pipeline's under mpirun (d), else the named one. */
static ds4_backend *make_backend(const opts *o, ds4_dist *d, const ds4_weights *w, const ds4_backend_opts *bo,
                                 ds4_err *err) {
    if (!d) return ds4_backend_create(o->backend, w, bo, err);
    if (ds4_dist_plan(d, "ds4-bench", w, &o->dist, err) != 0) return NULL;
    uint32_t first, end;
    ds4_dist_layers(d, &first, &end);
    if (o->warm_weights && ds4_startup_warm_layers("ds4-bench", w, first, end, o->bo.n_threads, NULL, NULL) != 0) {
        ds4_err_set(err, DS4_EIO, "--warm-weights failed");
        return NULL;
    }
    return ds4_dist_backend_create(d, o->backend, w, bo, err);
}

static int run(const opts *o, ds4_dist *d, ds4_err *err) {
    int rc = -1;
    ds4_weights *w = NULL;
    if (o->synthetic) {
        ds4_config c;
        slice_config(o, &c);
        w = ds4_weights_synthetic(&c, o->recipe, o->seed, err);
    } else if (ds4_model_file_check(o->model, err) == 0) {
        w = ds4_weights_open(o->model, err);
    }
    if (!w) return -1;
    ds4_expert_profile *prof = NULL;
    if (o->profile && !(prof = ds4_expert_profile_load(o->profile, w->cfg.n_layer, w->cfg.n_expert, err))) {
        ds4_weights_close(w);
        return -1;
    }
    ds4_backend_opts bo = o->bo;
    bo.expert_profile = prof;
    ds4_mtp_weights *mtp = NULL;
    if (mtp_on(o)) {
        mtp = o->mtp ? ds4_mtp_open(o->mtp, w, err) : ds4_mtp_synthetic(w, o->synthetic, err);
        if (!mtp) {
            ds4_expert_profile_free(prof);
            ds4_weights_close(w);
            return -1;
        }
        bo.mtp = mtp;
    }
    if (o->warm_weights && !d && ds4_startup_warm("ds4-bench", w, o->bo.n_threads, NULL, NULL) != 0) {
        ds4_mtp_close(mtp);
        ds4_weights_close(w);
        ds4_expert_profile_free(prof);
        return ds4_err_set(err, DS4_EIO, "--warm-weights failed");
    }
    ds4_backend *b = NULL;
    ds4_imcol *col = NULL;
    ds4_steering *steer = NULL;
    ds4_kv_state *snap = NULL;
    uint32_t *toks = NULL, *gen = NULL;
    FILE *out = stdout;
    double t0 = ds4_now();
    if (o->steer.path && !(bo.steer = steer = ds4_steering_load(o->steer.path, &w->cfg, err))) goto done;
    if (o->imatrix && !(bo.imatrix = col = ds4_imcol_new(&w->cfg, err))) goto done;
    double copy_bw = 0;
#if DS4_CUDA
    /* before the model fills the GPU: the probe's two 4 GiB buffers find no
     * room beside a model that leaves only the runtime's reserve free */
    char dev[128] = "";
    if (!d && o->backend && !strcmp(o->backend, "cuda")) {
        if (ds4_cuda_copy_bandwidth(&copy_bw, dev, sizeof(dev), err)) goto done;
        fprintf(stderr, "ds4-bench: %s, device copy bandwidth %.0f GB/s (read + write)\n", dev, copy_bw / 1e9);
    }
#endif
    if (!(b = make_backend(o, d, w, &bo, err))) goto done;
    ds4_seq_set_steering(b->main, o->steer.ffn, o->steer.attn);
    char what[96];
    if (o->synthetic)
        snprintf(what, sizeof(what), "synthetic %s %s weights, layers %u..%u of %u", ds4_config_name(&o->full),
                 o->recipe, o->layer0, o->layer1 - 1, o->full.n_layer);
    fprintf(stderr, "ds4-bench: %s backend, %s, ready in %.1f s\n", b->ops->name, o->synthetic ? what : o->model,
            ds4_now() - t0);
    ds4_startup_print_memory("ds4-bench", b->ops->name, w, o->ctx_alloc);
    double bpt = bytes_per_token(w), host_bw = 0, tok_host = 0;
    fprintf(stderr, "ds4-bench: a generated token reads %.2f GB of weights\n", bpt / 1e9);
#if DS4_CUDA
    ds4_offload_info oi;
    if (!strcmp(b->ops->name, "cuda") && ds4_cuda_offload_info(b, &oi) == 0 && oi.on) {
        if ((host_bw = host_bandwidth(o->bo.n_threads, err)) < 0) goto done;
        tok_host = oi.tok_host;
        bpt -= tok_host; /* what the GPU reads */
        fprintf(stderr,
                "ds4-bench: %u of %u routed experts in host RAM; a token reads %.2f GB of them on the host "
                "(%.2f GB on the GPU); host read bandwidth %.1f GB/s: at most %.1f tokens/s\n",
                oi.host_experts, oi.total_experts, tok_host / 1e9, bpt / 1e9, host_bw / 1e9, host_bw / tok_host);
        if (oi.mapped_experts)
            fprintf(stderr,
                    "ds4-bench: of them %u (%.2f GiB pinned) read by the GPU over PCIe in decode steps, the others "
                    "computed by the CPU\n",
                    oi.mapped_experts, oi.mapped_bytes / (1024.0 * 1024.0 * 1024.0));
    }
#endif
    if (!o->prompt_file && !o->chat_file && !o->tokens_file)
        fprintf(stderr,
                "ds4-bench: no --prompt-file, --chat-prompt-file or --tokens-file: benchmarking seeded random "
                "token ids (seed %u)\n",
                o->seed);
    if (!(toks = load_tokens(o, w, o->ctx_max, err))) goto done;
    if (o->csv && !(out = fopen(o->csv, "w"))) {
        ds4_err_set(err, DS4_EIO, "cannot create %s: %s", o->csv, strerror(errno));
        out = stdout;
        goto done;
    }
    if (o->n_par) {
        rc = run_parallel(o, b, toks, out, err);
        goto done;
    }
    if (!(gen = malloc((o->gen + 1) * sizeof(uint32_t))) || !(snap = ds4_backend_state_new(b, err))) {
        if (!snap && !gen) ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    fprintf(out, "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes%s\n",
            mtp ? ",mtp_draft,mtp_forced,step_ms,verify_ms,verify_ratio,draft_ms,mtp_tps,tokens_per_verify,accept_rate,"
                  "proj_tps_a08"
                : "");
    fflush(out);
    uint32_t done_tok = 0, n_frontiers = 0, i = 0;
    double pre_all = 0;
    for (uint32_t f = o->ctx_start;; f = next_frontier(o, f)) {
        n_frontiers++;
        if (f >= o->ctx_max) break;
    }
    for (uint32_t f = o->ctx_start;; f = next_frontier(o, f)) {
        uint32_t n = f - done_tok;
        fprintf(stderr, "ds4-bench: frontier %u/%u: ctx %u, prefilling %u token%s, then generating %u\n", ++i,
                n_frontiers, f, n, ds4_plural(n), o->gen);
        double a = ds4_now();
        if (ds4_backend_prefill(b, toks + done_tok, n, NULL, err)) goto done;
        double pre = ds4_now() - a;
        pre_all += pre;
        done_tok = f;
        if (ds4_backend_snapshot(b, snap, err)) goto done;
        uint64_t kv = ds4_kv_state_payload_bytes(snap);
        /* speculative first: the prefill's final residuals are the ones its
         * first MTP row pairs with */
        mtp_res mr;
        if (mtp && o->gen && (mtp_generate(b, o, &mr, err) || ds4_backend_restore(b, snap, err))) goto done;
#if DS4_CUDA
        host_work hw0 = host_work_now(b);
#endif
        a = ds4_now();
        if (o->gen && ds4_backend_greedy(b, o->gen, gen, err)) goto done;
        double g = ds4_now() - a;
#if DS4_CUDA
        host_work hw1 = host_work_now(b);
#endif
        if (ds4_backend_restore(b, snap, err)) goto done;
        double gtps = o->gen ? o->gen / g : 0;
        fprintf(out, "%u,%u,%.2f,%u,%.2f,%llu", f, n, n / pre, o->gen, gtps, (unsigned long long)kv);
        fprintf(stderr,
                "ctx %6u: prefill %6u tokens %8.1f t/s | generate %4u tokens %7.2f t/s = %.0f GB/s of weights%s", f, n,
                n / pre, o->gen, gtps, gtps * bpt / 1e9, copy_bw > 0 ? "" : "\n");
        if (copy_bw > 0)
            fprintf(stderr, " (%.0f%% of the copy bandwidth)%s", 100.0 * gtps * bpt / copy_bw,
                    tok_host > 0 ? "" : "\n");
        if (tok_host > 0) {
            fprintf(stderr, "; host experts %.1f GB/s = %.0f%% of the host bandwidth's %.1f tokens/s\n",
                    gtps * tok_host / 1e9, 100.0 * gtps * tok_host / host_bw, host_bw / tok_host);
#if DS4_CUDA
            if (o->gen) host_work_report(&hw0, &hw1, o->gen, g);
#endif
        }
        if (mtp && o->gen) mtp_report(out, o, &mr, g / o->gen);
        else if (mtp) fprintf(out, ",%u,%d,,,,,,,,", o->draft, o->forced);
        fprintf(out, "\n");
        fflush(out);
        if (o->layers && o->synthetic && o->gen) project_whole(o, w, f, pre / n, g / o->gen);
        if (f >= o->ctx_max) break;
    }
    fprintf(stderr, "ds4-bench: prefill of all %u tokens: %.1f t/s%s\n", done_tok, done_tok / pre_all,
            o->imatrix ? ", collecting an importance matrix" : "");
    if (o->imatrix) {
        double a = ds4_now();
        if (ds4_backend_imatrix_flush(b, err)) goto done;
        double h = 2.9e6 / (done_tok / pre_all) / 3600.0;
        fprintf(stderr,
                "ds4-bench: imatrix: %llu routed (token, expert) pairs summed, read back in %.2f s; 2.9 M "
                "tokens at this rate: %.2f h\n",
                (unsigned long long)ds4_imcol_routes(col), ds4_now() - a, h);
    }
#if DS4_CUDA
    if (o->profile_out) {
        ds4_expert_profile *p = ds4_expert_profile_new(w->cfg.n_layer, w->cfg.n_expert, err);
        int prc = !p || ds4_cuda_expert_counts(b, p, err) || ds4_expert_profile_save(p, o->profile_out, err);
        ds4_expert_profile_free(p);
        if (prc) goto done;
        fprintf(stderr, "ds4-bench: expert profile written to %s\n", o->profile_out);
    }
#endif
    rc = 0;
done:
    if (out != stdout && fclose(out) != 0 && rc == 0) rc = ds4_err_set(err, DS4_EIO, "writing %s failed", o->csv);
    ds4_kv_state_free(snap);
    ds4_backend_free(b);
    ds4_imcol_free(col);
    ds4_expert_profile_free(prof);
    ds4_mtp_close(mtp);
    ds4_steering_free(steer);
    ds4_weights_close(w);
    free(toks);
    free(gen);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    int prc = parse_args(argc, argv, &o);
    if (prc >= 0) return prc;
    ds4_dist *d = NULL; /* under mpirun: the ranks after the first serve their stage in here */
    ds4_warm_ctx warm = {"ds4-bench", o.bo.n_threads};
    if (o.warm_weights) o.dist.warm = ds4_startup_warm_stage, o.dist.warm_ctx = &warm;
    int drc = ds4_dist_start("ds4-bench", o.synthetic ? NULL : o.model, o.backend, o.bo.n_threads, &o.dist, &d);
    if (drc >= 0) return drc;
    int lrc = ds4_startup_lock("ds4-bench");
    if (lrc) {
        ds4_dist_end(d);
        return lrc;
    }
    ds4_err err = {0};
    int rc = 0;
    if (run(&o, d, &err) != 0) {
        fprintf(stderr, "ds4-bench: %s\n", ds4_err_msg(&err));
        rc = 1;
    }
    ds4_dist_end(d);
    return rc;
}
