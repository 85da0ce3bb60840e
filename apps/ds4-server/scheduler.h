/*
 * scheduler.h - ds4-server's sessions and the scheduler that hands them jobs
 * (scheduler.c), and what a session's thread does with a job (worker.c).
 *
 * The server holds --parallel sessions of the engine, each with its own
 * thread (a slot).  Their backend calls go through the engine's batcher
 * (engine/batcher.h): one stepper thread runs the rows every slot submits
 * (a decode token, a prefill chunk) together, up to --batch-tokens rows a
 * step, decode rows first, so N conversations advance in one forward pass
 * and a long prompt's prefill is spread over steps beside them.
 *
 * A slot keeps its session after a job: the next job of the same
 * conversation finds its KV state there (the reuse ladder of worker.c runs
 * per slot).  The scheduler gives the oldest queued job to the idle slot
 * that holds the most of it (scheduler.c: pick_slot), when the memory the
 * job's session takes fits beside what the other sessions hold
 * (engine/capacity.h), idle sessions going to the disk cache to make room.
 * Sessions are sized for what they hold (engine/session.h, sized
 * sessions) where the backend resizes sequences; else (a pipeline) each
 * is made at startup with state for the whole context.
 */
#ifndef DS4_SERVER_SCHEDULER_H
#define DS4_SERVER_SCHEDULER_H

#include "engine/capacity.h"
#include "engine/session.h"
#include "engine/spec.h"
#include "server.h"

/* Where a prompt's KV state came from (the reuse ladder of worker.c), in
 * order. */
#define N_SOURCES 9
extern const char *const KV_SOURCES[N_SOURCES];
/* Disk saves by reason (kvcache.h's ds4_kvc_reason). */
extern const char *const KV_REASON_NAMES[7];

/* How a queued job ended: exactly one of these. */
typedef enum outcome { ANSWERED, FAILED, CANCELLED, CONTINUATION_LOST } outcome;

/* The /v1/ds4/stats counters (worker_stats; docs/SERVER.md), under the
 * server's stats_mu: each name says what it counts. */
typedef struct counters {
    uint64_t queued, rejected_queue_full, rejected_shutting_down;
    uint64_t ended[4]; /* by outcome */
    /* jobs whose prefill finished: their prompts and where their KV came from */
    uint64_t prompt_tokens, reused_tokens, prefilled_tokens, by_source[N_SOURCES];
    uint64_t generated_tokens;      /* of every job */
    uint64_t disk_writes[7];        /* KVC files written, by save reason */
    uint64_t canonicalized;         /* live tails rewritten after a tool-call turn */
    uint64_t slots_evicted;         /* idle sessions given to an unrelated conversation */
    uint64_t evicted_for_memory;    /* idle sessions freed to make room for a job's */
    uint64_t grown;                 /* sessions grown while they answered (sched_grow) */
    uint64_t grow_refused;          /* growths the memory refused (sched_grow) */
    uint64_t rejected_too_large;    /* requests whose session could never fit the memory (400) */
    uint64_t cancel_free_steps_max; /* the most batched steps from a client's going away to its
                                       * session being free (of jobs running then) */
    ds4_spec_stats mtp;             /* MTP speculation, summed over the jobs of every session */
    char last_source[24];
    uint32_t last_reused, last_prefilled;
} counters;

/* Tokens generated per second over the last seconds: one bucket a second. */
#define RATE_SECONDS 10
typedef struct rate_ring {
    int64_t second[RATE_SECONDS + 1];
    uint64_t tokens[RATE_SECONDS + 1];
} rate_ring;

/* One session and its thread. */
typedef struct slot {
    sched *q;
    server *s;
    uint32_t index;
    ds4_session *sess;
    ds4_tokenizer *tok;     /* the thread's own */
    cont_binding *cont;     /* its live protocol continuation */
    uint32_t frontier_done; /* last continued frontier saved */
    /* After a thinking-mode answer: its prompt (ending with "<think>") and
     * how many tokens the session held then (worker.c: visible_prefix). */
    ds4_strbuf vis_prompt;
    uint32_t vis_tokens;
    /* The tokens of the in-memory checkpoint of the last prompt. */
    ds4_tokens ck_tokens;
    ds4_strbuf prompt_text;  /* the rendered text of the last prompt it ran */
    ds4_spec_stats mtp_seen; /* its session's MTP counts already in the server's */
    /* under q->mu */
    job *job; /* the job it runs, NULL when idle */
    double last_used;
    uint64_t held[2]; /* the memory accounted to its session, by pool (sched.pools) */
    uint32_t tokens;  /* its session's capacity when last accounted */
    bool evicting;    /* its thread is freeing its idle session to make room */
    bool growing;     /* its job waits for memory to grow its session (sched_grow) */
    pthread_t thread;
    bool started;
    pthread_cond_t cv; /* a job was given, an eviction asked, or stop */
} slot;

struct sched {
    server *s;
    slot *slots;
    uint32_t n;
    pthread_mutex_t mu;     /* the queue and the slots' job fields */
    pthread_cond_t grow_cv; /* memory was freed: a session waiting to grow looks again */
    uint32_t n_growing;     /* sessions waiting to grow: queued jobs wait behind them */
    job **queue;
    int qcap, qhead, qn;
    bool stop;
    counters c;     /* under s->stats_mu */
    rate_ring rate; /* under s->stats_mu */
    /* the disk KV cache: the store and the state its saves and loads go
     * through (as large as a session's: one, shared under store_mu) */
    ds4_kvc_store *store;
    ds4_kv_state *scratch;
    pthread_mutex_t store_mu;
    int32_t user_tok, assistant_tok;
    /* The sessions' memory (engine/capacity.h): its pools with their
     * budgets, what the sessions hold in each (under mu), and what a
     * session of each size takes (costs[k]: of ds4_sized_capacity(k
     * granules) tokens; costs[0] none). */
    ds4_mem_pool pools[2];
    size_t np;
    uint64_t used[2];
    bool sized; /* sessions sized by what they hold (else each of --ctx tokens) */
    uint32_t granule;
    uint64_t (*costs)[2];
    uint32_t n_costs;
};

/* worker.c: run a job in the slot's session to its answer. */
outcome slot_run(slot *sl, job *j);
/* worker.c: the slot's idle session freed (its conversation to the disk
 * cache first), to make room for another's. */
void slot_evict(slot *sl);
/* scheduler.c: the slot's session changed size: the memory accounted to
 * it follows, and queued jobs that now fit are handed out. */
void sched_resized(slot *sl);
/* scheduler.c: grow the session of the slot's running job to hold `need`
 * tokens (by a granule at least), when that fits the memory beside the
 * others: idle sessions go to the disk cache to make room, else it waits
 * (at most --grow-wait seconds) for running jobs to end.  false when it
 * may not grow (logged with `otherwise`, what the job does instead,
 * unless the job was cancelled). */
bool sched_grow(slot *sl, uint32_t need, const char *otherwise);
/* Save the slot's live session to the disk cache (when there is one). */
void slot_save_live(slot *sl, ds4_kvc_reason reason);
void slot_free_state(slot *sl);

/* scheduler.c: counters. */
void sched_count_generated(sched *q, uint32_t n);
void sched_count_prefill(sched *q, const job *j, const char *source);
void sched_count_outcome(sched *q, outcome k, uint32_t generated);
/* Add the MTP speculation sl's session did since the last call to the
 * server's counts: before a job's answer goes out, so that a client reading
 * /v1/ds4/stats after its answer sees it. */
void sched_count_mtp(slot *sl);

#endif
