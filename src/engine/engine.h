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
#include "model/weights.h"
#include "text/vocab.h"

typedef struct ds4_engine_opts {
    const char *model_path;  /* GGUF file */
    const char *backend;     /* "cpu", "cuda"; NULL: the build's default */
    int n_threads;           /* CPU threads; <= 0: all cores */
    bool no_sim;             /* low-precision simulations off (testing) */
    bool need_vocab;         /* fail when the GGUF has no tokenizer */
} ds4_engine_opts;

typedef struct ds4_engine {
    ds4_engine_opts opts;
    char *backend_name;
    ds4_weights *w;
    ds4_vocab *vocab;        /* NULL when the model has no tokenizer */
    int32_t eos, bos;        /* -1 without a vocabulary */
    ds4_backend *b;          /* made by the first session (ds4_engine_seq_new) */
    uint32_t n_seqs;         /* sequences sessions hold */
    bool main_held;          /* one of them is the backend's main sequence */
} ds4_engine;

/* The backend a build uses when none is named: "cuda" in CUDA builds. */
const char *ds4_default_backend(void);

ds4_engine *ds4_engine_open(const ds4_engine_opts *opts, ds4_err *err);
void ds4_engine_close(ds4_engine *e);

/* A sequence of ctx tokens for a session: the backend's main one when it is
 * free, else a new one.  The backend is made at the first call, and made
 * again for another context size when no sequence is held. */
ds4_seq *ds4_engine_seq_new(ds4_engine *e, uint32_t ctx, ds4_err *err);
void ds4_engine_seq_free(ds4_engine *e, ds4_seq *s);

/* Bytes of KV state a session of `ctx` tokens holds (the memory estimate
 * programs print at startup). */
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, uint32_t ctx);

/* Routed-expert quantization bits as the KVC header records them: 4 when
 * the first layer's routed gate is Q4_K, else 2 (docs/MODEL.md 8.4). */
int ds4_engine_quant_bits(const ds4_engine *e);

#endif
