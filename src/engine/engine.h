/*
 * engine.h - a loaded model ready to serve: weights, tokenizer vocabulary
 * and the choice of compute backend.
 *
 * The engine is what every program opens first (ds4, ds4-server, ds4-bench,
 * the tools that run the model).  It owns the mmap'ed weights and the
 * vocabulary read from the same GGUF; sessions (session.h) are created from
 * it and each owns one backend instance with its KV state.
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
} ds4_engine;

/* The backend a build uses when none is named: "cuda" in CUDA builds. */
const char *ds4_default_backend(void);

ds4_engine *ds4_engine_open(const ds4_engine_opts *opts, ds4_err *err);
void ds4_engine_close(ds4_engine *e);

/* Bytes of KV state a session of `ctx` tokens holds (the memory estimate
 * programs print at startup). */
uint64_t ds4_engine_kv_bytes(const ds4_engine *e, uint32_t ctx);

/* Routed-expert quantization bits as the KVC header records them: 4 when
 * the first layer's routed gate is Q4_K, else 2 (spec/PRODUCT.md 3). */
int ds4_engine_quant_bits(const ds4_engine *e);

#endif
