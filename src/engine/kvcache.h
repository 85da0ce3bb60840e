/*
 * kvcache.h - the disk KV cache: KVC checkpoint files (docs/MODEL.md 8.4,
 * byte-compatible with ds4) in one directory, with a space budget.
 *
 * A checkpoint is a session state (the DSV4 payload of session_state.h)
 * keyed by the text of the prompt prefix it holds.  A later request whose
 * rendered prompt starts with that text loads the state and prefills only
 * the rest; this survives restarts.  File layout, all little-endian:
 *
 *   48-byte header   "KVC", version 1, quant bits, save reason, extension
 *                    flags, token count, hit count, context size, creation
 *                    and last-used times, payload byte count
 *   u32 text_len, key text        (SHA1 of the text, in hex, is the name)
 *   DSV4 payload                  (payload byte count long)
 *   optional "KTM" trailer        tool-call id -> exact sampled DSML block
 *
 * Writes are atomic: a temporary file in the directory, fsync, rename,
 * fsync of the directory, so a crash leaves either no file or a complete
 * one; a partly written temporary never has the ".kv" name.  At open,
 * only temporaries this naming scheme makes (SHA1.kv.tmp-PID-N) of a
 * process that no longer runs are removed; any other file is left alone.
 * Loads verify everything (magic, version, lengths, SHA1 of the text
 * against the name, the payload layout and length, the payload checksum,
 * the payload tokens against the key text, the trailer) before the state
 * is used; a file that fails is skipped, logged and deleted.
 *
 * The payload checksum (ours, not ds4's): a 32-bit hash of the payload
 * bytes in header bytes 20..23, which ds4 keeps reserved, flagged by
 * extension bit 3 (ds4 ignores flags it does not know).  Files without it
 * (written by ds4) load unverified, as ds4 loads them, and so do files of
 * ours whose header ds4 rewrote after loading them (it zeroes bytes
 * 20..23 and keeps the flags): a zero checksum counts as none.
 *
 * The store keeps an index of the directory (header, text length and name
 * of every file) so lookups do not read files: the longest key that is a
 * prefix of a request is found by hashing the request's prefixes of each
 * indexed length.  After every store, and at open, files are evicted while
 * the total exceeds the budget, lowest score first:
 *     score = (effective_hits + 1) * tokens / file_size,
 * hits decaying with a 6-hour half-life (below 0.01 they count as 0), ties
 * broken by older last use; the file just written is kept unless it alone
 * exceeds the budget.
 *
 * Save policy helpers (when the server saves: cold, continued, evict,
 * shutdown, as ds4's server saves) are at the end.
 */
#ifndef DS4_ENGINE_KVCACHE_H
#define DS4_ENGINE_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "model/session_state.h"
#include "text/vocab.h"

#define DS4_KVC_HEADER_BYTES 48
#define DS4_KVC_VERSION      1
#define DS4_KVC_MAX_ID       256                   /* tool id bytes */
#define DS4_KVC_MAX_DSML     ((uint32_t)512 << 20) /* tool block bytes */

typedef enum ds4_kvc_reason {
    DS4_KVC_UNKNOWN = 0,
    DS4_KVC_COLD = 1,
    DS4_KVC_CONTINUED = 2,
    DS4_KVC_EVICT = 3,
    DS4_KVC_SHUTDOWN = 4,
    DS4_KVC_AGENT_SYSTEM = 5,
    DS4_KVC_AGENT_SESSION = 6,
} ds4_kvc_reason;

/* Extension flags (header byte 6). */
#define DS4_KVC_EXT_TOOLMAP           0x01 /* KTM trailer present */
#define DS4_KVC_EXT_RESPONSES_VISIBLE 0x02 /* key is a Responses-visible transcript */
#define DS4_KVC_EXT_THINKING_VISIBLE  0x04 /* key is a thinking-visible transcript */
#define DS4_KVC_EXT_CHECKSUM          0x08 /* header bytes 20..23: payload checksum */

typedef struct ds4_kvc_header {
    uint8_t quant_bits; /* 2 or 4 */
    uint8_t reason;     /* ds4_kvc_reason */
    uint8_t ext;        /* DS4_KVC_EXT_* */
    uint32_t n_tokens;  /* nonzero */
    uint32_t hits;
    uint32_t ctx;                /* context the snapshot was written for */
    uint64_t created, last_used; /* Unix seconds */
    uint64_t payload_bytes;
    uint32_t checksum; /* with DS4_KVC_EXT_CHECKSUM */
} ds4_kvc_header;

/* One tool-call id and the exact DSML block the model sampled for it. */
typedef struct ds4_kvc_tool {
    const char *id;
    uint32_t id_len;
    const char *dsml;
    uint32_t dsml_len;
} ds4_kvc_tool;

void ds4_kvc_header_encode(const ds4_kvc_header *h, uint8_t out[DS4_KVC_HEADER_BYTES]);
/* Checks magic, version, quant bits, reason, flags and token count. */
int ds4_kvc_header_decode(const uint8_t in[DS4_KVC_HEADER_BYTES], ds4_kvc_header *h, ds4_err *err);

/* File name of a key: 40 hex digits of SHA1(text) + ".kv" (44 bytes + NUL). */
void ds4_kvc_name(const char *text, size_t n, char out[48]);

/* Write a KVC file to `path` atomically (temporary + fsync + rename).
 * h->n_tokens and h->payload_bytes are filled from the state; only tool
 * entries whose block occurs in the text are written (ext bit 0 set when
 * any is).  On failure nothing is left at `path` or in the directory. */
int ds4_kvc_write(const char *path, ds4_kvc_header *h, const char *text, size_t text_len, const ds4_kv_state *st,
                  const ds4_kvc_tool *tools, size_t n_tools, ds4_err *err);

/* A file read back: header, key text, tool entries (owned). */
typedef struct ds4_kvc_file {
    ds4_kvc_header h;
    char *text;
    size_t text_len;
    ds4_kvc_tool *tools;
    size_t n_tools;
    uint64_t file_size;
} ds4_kvc_file;

/* Read and verify a KVC file.  `st` may be NULL (header, text and trailer
 * only; the payload is skipped by its length); else the payload is loaded
 * into it and must hold h.n_tokens tokens.  When `vocab` is given and the
 * key is not a visible transcript, the text must equal the payload tokens
 * decoded.  `expect_name`, when given, must be SHA1(text) (the file name).
 * At most max_tools tool entries are accepted. */
int ds4_kvc_read(const char *path, ds4_kv_state *st, const ds4_vocab *vocab, const char *expect_name, size_t max_tools,
                 ds4_kvc_file *out, ds4_err *err);
void ds4_kvc_file_free(ds4_kvc_file *f);

/* Eviction score of a file at time `now` (see above). */
double ds4_kvc_score(const ds4_kvc_header *h, uint64_t file_size, uint64_t now);

/* ------------------------------------------------------------ store */

typedef void (*ds4_kvc_log_fn)(void *ctx, const char *msg);

typedef struct ds4_kvc_opts {
    const char *dir; /* created (mode 0700) when missing */
    uint64_t budget_bytes;
    uint32_t min_tokens; /* entries shorter than this are neither saved nor loaded */
    int quant_bits;      /* this model's routed-expert bits (2 or 4) */
    bool reject_different_quant;
    uint32_t ctx;           /* this process's context: larger snapshots do not load */
    size_t max_tools;       /* per file (0: 4 * 100000) */
    const ds4_vocab *vocab; /* for the key/payload check; may be NULL */
    ds4_kvc_log_fn log;     /* NULL: stderr */
    void *log_ctx;
} ds4_kvc_opts;

typedef struct ds4_kvc_stats {
    uint64_t files, bytes;
    uint64_t stores, store_skips, loads, load_failures, evictions, corrupt;
} ds4_kvc_stats;

typedef struct ds4_kvc_store ds4_kvc_store;

/* Open (scan, drop what does not verify, evict to the budget). */
ds4_kvc_store *ds4_kvc_open(const ds4_kvc_opts *opts, ds4_err *err);
void ds4_kvc_close(ds4_kvc_store *s);
ds4_kvc_stats ds4_kvc_get_stats(const ds4_kvc_store *s);

/* The best entry for a prompt text: the longest key that is a byte prefix
 * of text[0..n), usable here (tokens >= min, ctx <= ours, quant accepted).
 * Fills name, key length and tokens; false when none. */
typedef struct ds4_kvc_match {
    char name[48];
    size_t text_len;
    uint32_t n_tokens;
} ds4_kvc_match;
bool ds4_kvc_lookup(ds4_kvc_store *s, const char *text, size_t n, ds4_kvc_match *m);

/* Load a matched entry into st (sized for our context); updates its hit
 * count and last-used time.  A file that fails verification is deleted. */
int ds4_kvc_load(ds4_kvc_store *s, const ds4_kvc_match *m, ds4_kv_state *st, ds4_err *err);

/* True when a file for exactly this key text exists. */
bool ds4_kvc_contains(ds4_kvc_store *s, const char *text, size_t n);

/* Save a state under its key text, then evict to the budget.  Returns 1
 * when written, 0 when skipped (too short, already present, larger than
 * the whole budget), -1 on error. */
int ds4_kvc_save(ds4_kvc_store *s, ds4_kvc_reason reason, uint8_t ext, const char *text, size_t n,
                 const ds4_kv_state *st, const ds4_kvc_tool *tools, size_t n_tools, ds4_err *err);

/* Delete one entry by name. */
void ds4_kvc_remove(ds4_kvc_store *s, const char *name);

/* Call fn for every tool entry of every file (restoring the tool-id memory
 * at startup).  Files that do not verify are skipped. */
void ds4_kvc_each_tool(ds4_kvc_store *s, void (*fn)(void *ctx, const ds4_kvc_tool *t), void *ctx);

/* ----------------------------------------------------------- policy */

typedef struct ds4_kvc_policy {
    uint32_t min_tokens;         /* 512 */
    uint32_t cold_max_tokens;    /* 30000; 0 disables cold saves */
    uint32_t continued_interval; /* 10000; 0 disables continued saves */
    uint32_t boundary_trim;      /* 32 */
    uint32_t boundary_align;     /* 2048; 0 disables alignment */
} ds4_kvc_policy;

void ds4_kvc_policy_defaults(ds4_kvc_policy *p);
int ds4_kvc_policy_check(const ds4_kvc_policy *p, ds4_err *err);

/* Distance between continued-save frontiers: the interval rounded up to the
 * alignment (10000 -> 10240); 0 when disabled. */
uint32_t ds4_kvc_continued_step(const ds4_kvc_policy *p);

/* Where a cold prompt of n tokens is saved, or 0 for no cold save: the
 * position of the last `user` token before the first `assistant` token when
 * that is at least min_tokens (the shared system + tools prefix), else
 * (n - trim) aligned down; only for n in [min, cold_max]. */
uint32_t ds4_kvc_cold_boundary(const ds4_kvc_policy *p, const int32_t *tokens, uint32_t n, int32_t user_tok,
                               int32_t assistant_tok);

#endif
