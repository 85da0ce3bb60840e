/*
 * engine.h - a loaded model ready to serve: weights, tokenizer vocabulary
 * and the choice of compute backend.
 *
 * The engine is what every program opens first (ds4, ds4-server, ds4-bench,
 * the tools that run the model).  It owns the mmap'ed weights, the
 * vocabulary read from the same GGUF and one compute backend; sessions
 * (session.h) are created from it, each a sequence of that backend (its
 * main one for the first), so that many sessions share the weights and can
 * be advanced together in one batched step.
 */
#ifndef DS4_ENGINE_ENGINE_H
#define DS4_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "model/backend.h"
#include "model/dist/dist.h"
#include "model/weights.h"
#include "text/vocab.h"

typedef struct ds4_engine_opts {
    const char *model_path;      /* GGUF file */
    const char *backend;         /* "cpu", "cuda"; NULL: the build's default */
    int n_threads;               /* CPU threads; <= 0: all cores */
    bool no_sim;                 /* low-precision simulations off (testing) */
    bool need_vocab;             /* fail when the GGUF has no tokenizer */
    const char *mtp_path;        /* the MTP block's GGUF (NULL: the model file's own block, if any) */
    uint64_t gpu_mem;            /* ds4_backend_opts.gpu_mem */
    int host_mapped;             /* ds4_backend_opts.host_mapped */
    uint32_t extra_seqs;         /* ds4_backend_opts.extra_seqs */
    uint32_t main_ctx;           /* ds4_backend_opts.main_ctx (programs whose sessions are sized by
                                  * what they hold: engine/session.h ds4_session_new_sized) */
    const char *expert_profile;  /* a profile file (model/placement.h), or NULL */
    const char *steer_path;      /* a direction file (model/steering.h), or NULL */
    float steer_ffn, steer_attn; /* the steering scales sessions start with (need steer_path when not 0) */
    /* the backend's activation observer (model/backend.h), or NULL */
    void (*act_observer)(void *ctx, uint32_t il, bool ffn, uint32_t T, const float *y);
    void *act_ctx;
    /* Under mpirun, rank 0's job (ds4_dist_start): the model runs as a
     * pipeline of the job's ranks (docs/DISTRIBUTED.md), this process the
     * first stage with `backend`; NULL: one process. */
    ds4_dist *dist;
    const ds4_dist_opts *dist_opts; /* this rank's --layers, --pipe-* */
    uint32_t tensor_parallel;       /* ds4_backend_opts.tensor_parallel (--tensor-parallel) */
    const char *prog;               /* names the program in the pipeline's startup lines */
    bool header_only;               /* read the shapes alone (ds4_weights_open_header): for
                              * inspecting; such an engine runs nothing */
} ds4_engine_opts;

typedef struct ds4_engine {
    ds4_engine_opts opts;
    char *backend_name;
    ds4_weights *w;
    ds4_vocab *vocab;                   /* NULL when the model has no tokenizer */
    ds4_mtp_weights *mtp;               /* the MTP block, or NULL */
    struct ds4_expert_profile *profile; /* opts.expert_profile's, or NULL */
    struct ds4_steering *steer;         /* the directions of opts.steer_path, or NULL */
    int32_t eos, bos;                   /* -1 without a vocabulary */
    ds4_backend *b;                     /* made by the first session (ds4_engine_seq_new) or before it */
    struct ds4_batcher *batch;          /* NULL: sessions call the backend themselves, one thread at a time */
    uint32_t n_seqs;                    /* sequences sessions hold */
    bool main_held;                     /* one of them is the backend's main sequence */
    uint32_t main_ctx;                  /* the tokens the main sequence holds now */
} ds4_engine;

/* The backend a build uses when none is named: "cuda" in CUDA builds. */
const char *ds4_default_backend(void);

ds4_engine *ds4_engine_open(const ds4_engine_opts *opts, ds4_err *err);
void ds4_engine_close(ds4_engine *e);

/* A sequence of ctx tokens for a session: the backend's main one when it is
 * free (resized to ctx where the backend resizes sequences), else a new
 * one.  The backend is made at the first call, and made again for another
 * context size when no sequence is held.  A main sequence given back goes
 * back to the size it was made with (ds4_backend_opts.main_ctx). */
ds4_seq *ds4_engine_seq_new(ds4_engine *e, uint32_t ctx, ds4_err *err);
/* The same of cap tokens from a backend of ctx (a sized session's). */
ds4_seq *ds4_engine_seq_new_sized(ds4_engine *e, uint32_t ctx, uint32_t cap, ds4_err *err);
void ds4_engine_seq_free(ds4_engine *e, ds4_seq *s);
/* ds4_seq_resize between steps (through the batcher when there is one). */
int ds4_engine_seq_resize(ds4_engine *e, ds4_seq *s, uint32_t ctx, ds4_err *err);
/* Whether the backend resizes sequences (sessions can then be sized by
 * what they hold).  Needs the backend. */
bool ds4_engine_can_resize(const ds4_engine *e);
/* A sequence of the MTP block (the backend made with one). */
ds4_seq *ds4_engine_mtp_seq_new(ds4_engine *e, uint32_t ctx, ds4_err *err);
void ds4_engine_mtp_seq_free(ds4_engine *e, ds4_seq *s);

/* Whether scales (ffn, attn) can be used: 0 when both are 0 or the engine
 * has directions; else an error saying that a direction file is needed. */
int ds4_engine_steering_check(const ds4_engine *e, float ffn, float attn, ds4_err *err);

/* Continuous batching (engine/batcher.h): from now on sessions may run in
 * threads of their own, their rows packed into steps of up to `budget`
 * rows (0: the backend's prefill chunk).  Needs the backend (a session made
 * first). */
int ds4_engine_enable_batching(ds4_engine *e, uint32_t budget, double stretch, ds4_err *err);

/* The backend calls of sessions, through the batcher when there is one: a
 * step (ds4_run_rows), and the other calls on one sequence. */
int ds4_engine_step(ds4_engine *e, const ds4_row *rows, uint32_t n, const ds4_step_out *out, bool mtp, ds4_err *err);
typedef enum ds4_seq_op { DS4_SEQ_MARK, DS4_SEQ_REWIND, DS4_SEQ_RESET, DS4_SEQ_SNAPSHOT, DS4_SEQ_RESTORE } ds4_seq_op;
/* n: the rewind's length; state: the snapshot's destination or the
 * restore's source. */
int ds4_engine_seq_op(ds4_engine *e, ds4_seq *s, ds4_seq_op op, uint32_t n, ds4_kv_state *state, ds4_err *err);

/* Bytes of KV state a session of `ctx` tokens holds (the memory estimate
 * programs print at startup). */
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, uint32_t ctx);

/* Make the backend for sessions of ctx tokens, as the first session
 * would (its main sequence is that session's state), so that what
 * sessions cost can be asked before any is made.  0 when there is one. */
int ds4_engine_open_backend(ds4_engine *e, uint32_t ctx, ds4_err *err);

/* What a session's sequence of ctx tokens costs the backend and the room
 * it has for them (model/backend.h; all 0 where it cannot tell).  Needs
 * the backend (ds4_engine_open_backend). */
void ds4_engine_seq_memory(const ds4_engine *e, uint32_t ctx, ds4_seq_memory *m);

/* Routed-expert quantization bits as the KVC header records them: 4 when
 * the first layer's routed gate is Q4_K, else 2 (docs/MODEL.md 8.4). */
int ds4_engine_quant_bits(const ds4_engine *e);

#endif
