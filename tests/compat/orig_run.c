/*
 * orig_run.c - runs token ids through the original ds4 engine (antirez/ds4)
 * on its CPU backend, through its public API (ds4.h) only, for the
 * comparisons of docs/COMPAT.md.  Built against a checkout of the original
 * by tests/compat/run.sh (it is no part of this engine's build):
 *
 *   orig_run MODEL CTX THREADS TOKENS NGEN LOGITS [--load IN.payload] [--save OUT.payload]
 *
 * TOKENS is a file of token ids (whitespace-separated).  The session is
 * synced to them (the original's prefill), or, with --load, restored from a
 * DSV4 session payload (TOKENS then unused: "-").  NGEN greedy steps follow:
 * before each, the logits of the next token (all of them, f32) are appended
 * to LOGITS, and the chosen token is printed ("tokens: a b c ...").  --save
 * writes the payload of the state after the prompt (before any step).
 * The original has no call that returns the logits: they are read from the
 * payload it writes (its third field, docs/MODEL.md 8.3).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4.h"

#define PAYLOAD_HEADER_U32 13
#define VOCAB              129280

static int read_tokens(const char *path, ds4_tokens *out) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int id;
    while (fscanf(f, "%d", &id) == 1) ds4_tokens_push(out, id);
    fclose(f);
    return out->len > 0 ? 0 : -1;
}

/* The next-token logits of the session: its payload's f32 block, which
 * follows the header and the token ids. */
static int session_logits(ds4_session *s, float *logits, char *err, size_t errlen) {
    ds4_session_snapshot snap = {0};
    if (ds4_session_save_snapshot(s, &snap, err, errlen) != 0) return -1;
    uint32_t n_tokens;
    memcpy(&n_tokens, snap.ptr + 7 * 4, 4);
    memcpy(logits, snap.ptr + (PAYLOAD_HEADER_U32 + (uint64_t)n_tokens) * 4, VOCAB * sizeof(float));
    ds4_session_snapshot_free(&snap);
    return 0;
}

static int load_payload(ds4_session *s, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    int rc = ds4_session_load_payload(s, f, (uint64_t)n, err, errlen);
    fclose(f);
    return rc;
}

static int save_payload(ds4_session *s, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot create %s", path);
        return -1;
    }
    int rc = ds4_session_save_payload(s, f, err, errlen);
    if (fclose(f) != 0) rc = -1;
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: orig_run MODEL CTX THREADS TOKENS NGEN LOGITS [--load IN] [--save OUT]\n");
        return 2;
    }
    const char *load = NULL, *save = NULL;
    for (int i = 7; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--load") == 0) load = argv[i + 1];
        else if (strcmp(argv[i], "--save") == 0) save = argv[i + 1];
        else return 2;
    }
    ds4_engine_options opt = {.model_path = argv[1], .backend = DS4_BACKEND_CPU, .n_threads = atoi(argv[3])};
    int ctx = atoi(argv[2]), ngen = atoi(argv[5]);
    ds4_engine *e = NULL;
    ds4_session *s = NULL;
    ds4_tokens prompt = {0};
    char err[256] = "";
    if (ds4_engine_open(&e, &opt) != 0 || ds4_session_create(&s, e, ctx) != 0) {
        fprintf(stderr, "orig_run: cannot open the engine or a session\n");
        return 1;
    }
    if (load) {
        if (load_payload(s, load, err, sizeof(err)) != 0) {
            fprintf(stderr, "orig_run: --load %s: %s\n", load, err);
            return 1;
        }
    } else if (read_tokens(argv[4], &prompt) != 0 || ds4_session_sync(s, &prompt, err, sizeof(err)) != 0) {
        fprintf(stderr, "orig_run: prompt %s: %s\n", argv[4], err);
        return 1;
    }
    if (save && save_payload(s, save, err, sizeof(err)) != 0) {
        fprintf(stderr, "orig_run: --save %s: %s\n", save, err);
        return 1;
    }
    FILE *out = fopen(argv[6], "wb");
    float *logits = malloc(VOCAB * sizeof(float));
    if (!out || !logits) return 1;
    printf("tokens:");
    for (int i = 0; i < ngen; i++) {
        if (session_logits(s, logits, err, sizeof(err)) != 0 || fwrite(logits, sizeof(float), VOCAB, out) != VOCAB) {
            fprintf(stderr, "orig_run: logits of step %d: %s\n", i, err);
            return 1;
        }
        int tok = ds4_session_argmax(s);
        printf(" %d", tok);
        fflush(stdout);
        if (i + 1 < ngen && ds4_session_eval(s, tok, err, sizeof(err)) != 0) {
            fprintf(stderr, "orig_run: step %d: %s\n", i, err);
            return 1;
        }
    }
    printf("\n");
    free(logits);
    fclose(out);
    ds4_tokens_free(&prompt);
    ds4_session_free(s);
    ds4_engine_close(e);
    return 0;
}
