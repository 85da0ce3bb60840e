/*
 * cli.h - the vocabulary of the ds4 programs' command lines: the options
 * several programs share, each with one spelling, one range and one
 * default, as whole rows of the option tables of base/opts.h.  A program
 * (and a new one: ds4-agent) puts these rows in its table and adds its own
 * (opts.h says how); what a shared option means is decided here only.
 *
 *   -m, --model FILE     the GGUF model (ds4flash.gguf)
 *   -c, --ctx N          the session's context (DS4_CTX_DEFAULT, 1..DS4_CTX_MAX)
 *   -t, --threads N      CPU threads ($DS4_THREADS or all CPUs)
 *   --backend NAME, --cpu, --cuda   the compute backend (the build's)
 *   --no-sim, --warm-weights, --quality
 *   --temp, --top-p, --top-k, --min-p, --seed     sampling (engine/sampler.h)
 *   --think, --think-max, --nothink               thinking mode
 *   --mtp FILE, --mtp-draft N, --mtp-margin F     MTP speculative decoding
 *   --gpu-mem SIZE, --expert-profile FILE         routed experts beyond the GPU
 *                                                 in host RAM (CUDA builds)
 *   --dir-steering-file FILE, --dir-steering-ffn F, --dir-steering-attn F
 *                                                 directional steering
 *   --layers A:B, --gpus LIST, --pipe-dtype T, --pipe-timeout S
 *                                                 a pipeline (mpirun, or GPUs)
 *
 * Exit status, every program: 0 done, 1 an error (the message says what),
 * 2 a usage error or another model process holding the instance lock, 130
 * stopped by Ctrl+C (DS4_EXIT_* in engine/startup.h).
 */
#ifndef DS4_ENGINE_CLI_H
#define DS4_ENGINE_CLI_H

#include <math.h>
#include <stdbool.h>

#include "base/opts.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "engine/startup.h"
#include "model/steering.h"
#include "model/dist/dist.h"
#include "text/chat.h"

#define DS4_DEFAULT_MODEL "ds4flash.gguf"
#define DS4_THREADS_MAX   4096

/* The one-row macros take optional fields after dst (.seen = &given). */
/* clang-format off */
#define DS4_CLI_MODEL(dst, ...) \
    {DS4_OPT_STR("-m, --model", "FILE", dst, DS4_DEFAULT_MODEL, "the GGUF model file"), __VA_ARGS__}

#define DS4_CLI_CTX(dst, ...) \
    {DS4_OPT_U32("-c, --ctx", "N", dst, 1, DS4_CTX_MAX, DS4_CTX_DEFAULT, "context size in tokens"), __VA_ARGS__}

#define DS4_CLI_THREADS(dst, ...)                                                  \
    {DS4_OPT_INT("-t, --threads", "N", dst, 1, DS4_THREADS_MAX, 0, "CPU threads"), \
     .def_text = "$DS4_THREADS or all CPUs", __VA_ARGS__}

/* --backend NAME and its shorthands (seen, which may be NULL, tells whether
 * one was given); ds4_cli_check_backend() after parsing says whether this
 * build has the backend. */
#define DS4_CLI_BACKEND(dst, seen_)                                                                       \
    {DS4_OPT_STR("--backend", "NAME", dst, ds4_default_backend(), "compute backend: cpu, or cuda in CUDA builds"), \
     .seen = (seen_)},                                                                                    \
    {DS4_OPT_SETSTR("--cpu", dst, "cpu", "the CPU backend"), .seen = (seen_)},                            \
    {DS4_OPT_SETSTR("--cuda", dst, "cuda", "the CUDA backend (CUDA builds)"), .seen = (seen_)},           \
    {DS4_OPT_SETSTR("--metal", dst, "metal", "ds4's Metal backend (refused: not in this engine)"),        \
     .seen = (seen_), .flags = DS4_OPT_HIDDEN}

#define DS4_CLI_NO_SIM(dst, ...)                                                                    \
    {DS4_OPT_FLAG("--no-sim", dst,                                                                \
                  "turn the low-precision simulations off (FP8 KV rows, FP4 indexer, f16 raw rows): " \
                  "the forward pass of the reference transformers model"),                            \
     __VA_ARGS__}

#define DS4_CLI_WARM_WEIGHTS(dst, ...) \
    {DS4_OPT_FLAG("--warm-weights", dst, "read the whole model file in before the first token"), __VA_ARGS__}

/* Accepted for ds4 compatibility; prog names the program in its note. */
#define DS4_CLI_QUALITY(prog)                                                                           \
    {DS4_OPT_CALL("--quality", NULL, ds4_cli_quality_note, (void *)(prog),                              \
                  "accepted for ds4 compatibility: this engine's kernels have one precision, there is " \
                  "no approximate fast path to turn off")}
/* clang-format on */

/* MTP speculative decoding (engine/spec.h): the block's file, the most
 * drafts a step verifies, and the confidence it drafts on.  ds4 counts
 * its first draft, which the target already knows, in --mtp-draft: a
 * draft of N here verifies what ds4's N + 1 does. */
typedef struct ds4_cli_mtp {
    const char *path;
    uint32_t draft;
    float margin;
} ds4_cli_mtp;

#define DS4_MTP_DRAFT_DEFAULT  2
#define DS4_MTP_MARGIN_DEFAULT 3.0

/* clang-format off */
#define DS4_CLI_MTP(m)                                                                                          \
    {DS4_OPT_STR("--mtp", "FILE", &(m)->path, NULL,                                                             \
                 "the MTP block's GGUF: speculative decoding with its drafts (a model file that holds a "      \
                 "block uses its own)"),                                                                        \
     .flags = DS4_OPT_IN},                                                                                      \
    {DS4_OPT_U32("--mtp-draft", "N", &(m)->draft, 1, DS4_MTP_DRAFT_MAX, DS4_MTP_DRAFT_DEFAULT,                  \
                 "most draft tokens a step verifies")},                                                         \
    {DS4_OPT_FLOAT("--mtp-margin", "F", &(m)->margin, 0.0, 1000.0, DS4_MTP_MARGIN_DEFAULT,                      \
                   "draft on only while the MTP block's two best logits are at least F apart (0: always)")}
/* clang-format on */

/* The GPU's budget and the expert profile (ds4_backend_opts.gpu_mem,
 * model/placement.h): the routed experts that do not fit stay in host RAM,
 * computed by the CPU (docs/DESIGN.md 3.5). */
/* --gpu-mem's action: a size ("24G") into the uint64_t at ctx. */
int ds4_cli_parse_gpu_mem(void *ctx, const char *value, ds4_err *err);
/* --host-mapped's action: auto (0), none (-1) or a percentage 1..100 into
 * the int at ctx (ds4_backend_opts.host_mapped). */
int ds4_cli_parse_host_mapped(void *ctx, const char *value, ds4_err *err);

/* gpu_mem: a uint64_t (0: the GPU's free memory less a reserve); profile:
 * a const char * (NULL: whole layers from the first); mapped: an int
 * (ds4_backend_opts.host_mapped). */
/* clang-format off */
#define DS4_CLI_OFFLOAD(gpu_mem, profile, mapped)                                                                  \
    {DS4_OPT_CALL("--gpu-mem", "SIZE", ds4_cli_parse_gpu_mem, (gpu_mem),                                        \
                  "GPU memory the model may use (24G, 81000M, bytes): the routed experts that do not fit stay in "  \
                  "host RAM, computed by the CPU (CUDA)"),                                                          \
     .def_text = "the GPU's free memory less 1 GiB"},                                                               \
    {DS4_OPT_STR("--expert-profile", "FILE", (profile), NULL,                                                    \
                 "which routed experts go on the GPU first: an expert profile (ds4-bench --expert-profile-out) "    \
                 "or an imatrix; without it, whole layers from the first"),                                          \
     .flags = DS4_OPT_IN},                                                                                           \
    {DS4_OPT_CALL("--host-mapped", "PCT", ds4_cli_parse_host_mapped, (mapped),                                   \
                  "of each layer's routed experts in host RAM, the percentage the GPU reads itself over PCIe in "   \
                  "decode steps beside the CPU's share (auto: the share that balances the two, as measured at "     \
                  "start; none or 0: the CPU computes them all) (CUDA)"),                                             \
     .def_text = "auto"}
/* Importance-matrix checkpoints (engine/imatrix_run.h): save_every a
 * uint64_t (0: DS4_IMATRIX_SAVE_EVERY), resume a bool. */
#define DS4_CLI_IMATRIX_RESUME(save_every, resume)                                                           \
    {DS4_OPT_U64("--imatrix-save-every", "N", (save_every), 1, UINT64_MAX, 0,                                \
                 "save the progress to OUT.partial every N prompts (and when stopped)"),                    \
     .def_text = "256"},                                                                                      \
    {DS4_OPT_FLAG("--resume", (resume), "continue the collection from OUT.partial (a stopped or limited run)")}
/* clang-format on */

/* Directional steering (model/steering.h): the direction file and the two
 * scales.  After parsing, ds4_cli_steering_check() settles the FFN scale
 * (1 when a file is given without one) and ds4_cli_steering_opts() puts
 * them into the engine's options. */
typedef struct ds4_cli_steer {
    const char *path;
    float ffn, attn;
    bool ffn_given;
} ds4_cli_steer;

/* clang-format off */
#define DS4_CLI_STEERING(st)                                                                                   \
    {DS4_OPT_STR("--dir-steering-file", "FILE", &(st)->path, NULL,                                             \
                 "directional steering: n_layer x n_embd f32 directions, one unit vector per layer "           \
                 "(ds4-direction builds them)"),                                                                \
     .flags = DS4_OPT_IN},                                                                                     \
    {DS4_OPT_FLOAT("--dir-steering-ffn", "F", &(st)->ffn, -DS4_STEER_SCALE_MAX, DS4_STEER_SCALE_MAX, 0.0,      \
                   "steering scale after each FFN output: y - F v (v.y); > 0 removes the direction, < 0 adds it"), \
     .def_text = "1 with a file, else 0", .seen = &(st)->ffn_given},                                           \
    {DS4_OPT_FLOAT("--dir-steering-attn", "F", &(st)->attn, -DS4_STEER_SCALE_MAX, DS4_STEER_SCALE_MAX, 0.0,    \
                   "steering scale after each attention output")}

/* A pipeline (model/dist/dist.h, docs/DISTRIBUTED.md), into a
 * ds4_dist_opts: under mpirun this rank's layers, and (rank 0's) how
 * residuals travel and how long a silent rank is waited for; or --gpus,
 * the stages in this process over GPUs of its host, and their layers. */
#define DS4_CLI_DIST(o)                                                                                        \
    {DS4_OPT_STR("--layers", "A:B", &(o)->layers, NULL,                                                        \
                 "under mpirun: this rank's layers, inclusive; A:output ends with the output head; with "      \
                 "--gpus: a range a GPU, by commas (0:20,21:output)"),                                         \
     .def_text = "split by memory"},                                                                           \
    DS4_CLI_DIST_PIPE(o)

/* The pipeline's rows but --layers (ds4-bench gives --layers a second use). */
#define DS4_CLI_DIST_PIPE(o)                                                                                   \
    {DS4_OPT_CALL("--gpus", "LIST", ds4_cli_parse_gpus, (o),                                                   \
                  "a pipeline over these GPUs of the host in one process (0,1,...; CUDA builds): stage r on "   \
                  "the r-th, the layers split by their memory, the residuals between them by NCCL")},          \
    {DS4_OPT_CHOICE("--pipe-dtype", "T", &(o)->dtype, "f32|f16|bf16", "f32",                                    \
                    "under mpirun: the residuals between ranks in f32 (exact), f16 or bf16")},                 \
    {DS4_OPT_FLOAT("--pipe-timeout", "S", &(o)->timeout_s, 0.5, 3600.0, DS4_DIST_TIMEOUT_DEFAULT,               \
                   "under mpirun: a rank silent for S seconds has failed")}

/* Tensor parallelism (docs/DISTRIBUTED.md 7), into a uint32_t: each
 * layer split over the host's GPUs 0 .. N-1 (1: none). */
#define DS4_CLI_TP(n)                                                                                          \
    {DS4_OPT_U32("--tensor-parallel", "N", (n), 1, DS4_DIST_MAX_GPUS, 1,                                       \
                 "split each layer over the host's GPUs 0..N-1 (CUDA builds; CUDA_VISIBLE_DEVICES picks them): "  \
                 "a GPU its share of the heads and experts, the partial outputs summed by NCCL")}

/* Sampling, into a ds4_sampler_params. */
#define DS4_CLI_SAMPLING(p)                                                                                    \
    {DS4_OPT_FLOAT("--temp", "F", &(p)->temperature, 0.0, DS4_TEMP_MAX, DS4_TEMP_DEFAULT,                      \
                   "temperature, 0 = greedy")},                                                                \
    {DS4_OPT_FLOAT("--top-p", "F", &(p)->top_p, 0.0, 1.0, DS4_TOP_P_DEFAULT, "nucleus mass")},                 \
    {DS4_OPT_INT("--top-k", "N", &(p)->top_k, 0, DS4_TOP_K_MAX, 0, "keep the N most likely tokens, 0 = off"), \
     .flags = DS4_OPT_CLAMP},                                                                                  \
    {DS4_OPT_FLOAT("--min-p", "F", &(p)->min_p, 0.0, 1.0, DS4_MIN_P_DEFAULT,                                  \
                   "keep the tokens with p >= F x p(most likely)")},                                           \
    {DS4_OPT_U64("--seed", "N", &(p)->seed, 1, UINT64_MAX, 0, "random seed"), .def_text = "from the time and pid"}

/* Thinking mode, into a ds4_think_mode stored as int. */
#define DS4_CLI_THINK(dst)                                                                                   \
    {DS4_OPT_SET("--think", dst, DS4_THINK_HIGH, "reason before answering"), .flags = DS4_OPT_DEFAULT},     \
    {DS4_OPT_SET("--think-max", dst, DS4_THINK_MAX, "maximum reasoning effort (needs --ctx >= 393216)")}, \
    {DS4_OPT_SET("--nothink", dst, DS4_THINK_OFF, "answer directly")}

/* The environment every model program reads, for a table's notes. */
#define DS4_CLI_ENV_NOTES                                                                        \
    "environment:\n"                                                                             \
    "  DS4_THREADS              CPU threads when -t is not given\n"                              \
    "  DS4_LOCK_FILE            one model process runs per machine; this is its lock file\n"     \
    "                           (default /tmp/ds4.lock): another file allows a second process\n"
/* clang-format on */

/* --gpus's action: a list of two or more distinct GPU indices ("0,1,2")
 * into the ds4_dist_opts at ctx (gpus, n_gpus). */
int ds4_cli_parse_gpus(void *ctx, const char *value, ds4_err *err);

/* --tensor-parallel n with the pipeline's options: a usage error (2) for
 * the combinations it does not run (--gpus, --layers, mpirun), else 0. */
int ds4_cli_tp_check(const ds4_cli *cli, uint32_t n, const ds4_dist_opts *d);

/* The --quality row's action: a note on stderr that nothing changes. */
int ds4_cli_quality_note(void *prog, const char *value, ds4_err *err);

/* The default FFN scale; a usage error (returned: 2) for scales without a
 * file. */
int ds4_cli_steering_check(const ds4_cli *cli, ds4_cli_steer *st);
void ds4_cli_steering_opts(const ds4_cli_steer *st, ds4_engine_opts *eo);

/* 0 when this build has the backend; else prints the usage error ("--backend
 * metal: Metal is not supported ...") and returns 2. */
int ds4_cli_check_backend(const ds4_cli *cli, const char *name);

#endif
