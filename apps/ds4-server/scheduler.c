/*
 * scheduler.c - ds4-server's sessions and the scheduler (scheduler.h): the
 * sessions' memory and how many sessions there are, one thread each, the
 * bounded queue of jobs, which session a job goes to, shutdown, and
 * /v1/ds4/stats.
 *
 * Admission by memory (engine/capacity.h, docs/SERVER.md): a job's session
 * starts with its prompt and the first granule of the output it may
 * generate (its max_tokens, or the server's default clamped to what the
 * memory can hold; all of it when less than a granule), rounded up to a
 * granule (ds4_sized_capacity); the job runs when that fits the budget
 * beside what the other sessions hold - while a session grows, its old
 * state and the new one both count.  Otherwise it waits in the queue (at
 * most --queue jobs; 429 beyond), and the least recently used idle
 * sessions go to the disk cache (reason evict, with --kv-disk-dir) and
 * free their memory once enough of them would make room.  A job whose
 * session could never fit (more than the whole budget) is answered 400 at
 * once, naming the bytes needed and available.  With a backend whose
 * sequences keep their size (a pipeline) every session holds the whole
 * context from startup, and a job only waits for a free one.
 *
 * Growth (sched_grow): when the answer reaches its session's end, the
 * generation loop (engine/generate.h, its grow hook) asks for a granule
 * more, admitted as above: it grows when the larger state fits beside the
 * others, idle sessions go to the disk cache to make room, else it waits
 * for running jobs to end, the queue behind it (it was admitted first), at
 * most --grow-wait seconds and not for other sessions that wait to grow
 * (the later of two such gives up at once).  One that cannot grow ends its
 * answer there (finish length, the usage saying stopped_by_memory).  A
 * granule, not a doubling: the memory is what is scarce, a session holds
 * at most a granule it does not use, and a resize copies the state once a
 * granule of output, little beside generating it.  Where the growth to a
 * job's whole size could not fit even alone (the old state and the new
 * one together over the budget), the session is made at that size from
 * the start; a default output is lowered to what growth can reach.
 *
 * The oldest job goes first; it gets the free session that holds the most
 * of its prompt, in this order:
 *   1. the session whose live protocol continuation it answers (tool
 *      outputs for its calls, a Responses transcript that replays it);
 *   2. a session whose last prompt it continues (the conversation's own:
 *      its live tokens cover that prompt), the longest match first;
 *   3. an empty session;
 *   4. the least recently used one among those that share the longest
 *      prefix with it: its conversation goes to the disk cache (reason
 *      evict, with --kv-disk-dir) and comes back from there when its next
 *      turn arrives (the disk rung of the ladder, in whatever session).
 * While a session finishes an answer that is already out (the tool-call
 * canonicalization of worker.c), no job is handed out: its conversation's
 * next turn may be what comes next.
 *
 * Fairness: every running session has one request in each batched step
 * (decode rows first, then prefill chunks up to --batch-tokens in the
 * pacer's pieces, the batcher's rule), so N conversations advance together
 * and a long prompt is prefilled in pieces beside them.  A client that goes away cancels its
 * job: the session stops after the step in flight and takes the next job.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "constrain.h"
#include "base/meminfo.h"
#include "engine/batcher.h"
#include "engine/capacity.h"
#include "engine/generate.h"
#include "engine/startup.h"
#include "scheduler.h"

/* The most sessions a default --parallel makes. */
#define DEFAULT_PARALLEL_MAX 16

/* ------------------------------------------------------------ counters */

/* Generated tokens in the bucket of the current second. */
void sched_count_generated(sched *q, uint32_t n) {
    int64_t now = (int64_t)ds4_now();
    rate_ring *r = &q->rate;
    size_t i = (size_t)(now % (RATE_SECONDS + 1));
    pthread_mutex_lock(&q->s->stats_mu);
    if (r->second[i] != now) {
        r->second[i] = now;
        r->tokens[i] = 0;
    }
    r->tokens[i] += n;
    pthread_mutex_unlock(&q->s->stats_mu);
}

/* Tokens per second over the last RATE_SECONDS whole seconds (under
 * stats_mu). */
static double rate_now(const rate_ring *r) {
    int64_t now = (int64_t)ds4_now();
    uint64_t sum = 0;
    for (size_t i = 0; i <= RATE_SECONDS; i++)
        if (r->second[i] < now && r->second[i] >= now - RATE_SECONDS) sum += r->tokens[i];
    return (double)sum / RATE_SECONDS;
}

void sched_count_prefill(sched *q, const job *j, const char *source) {
    const gen_out *o = &j->out;
    counters *c = &q->c;
    pthread_mutex_lock(&q->s->stats_mu);
    c->prompt_tokens += o->prompt_tokens;
    c->reused_tokens += o->cached_tokens;
    c->prefilled_tokens += o->written_tokens;
    for (size_t i = 0; i < N_SOURCES; i++)
        if (strcmp(source, KV_SOURCES[i]) == 0) c->by_source[i]++;
    snprintf(c->last_source, sizeof(c->last_source), "%s", source);
    c->last_reused = o->cached_tokens;
    c->last_prefilled = o->written_tokens;
    pthread_mutex_unlock(&q->s->stats_mu);
}

void sched_count_outcome(sched *q, outcome k, uint32_t generated) {
    pthread_mutex_lock(&q->s->stats_mu);
    q->c.ended[k]++;
    q->c.generated_tokens += generated;
    pthread_mutex_unlock(&q->s->stats_mu);
}

void sched_count_mtp(slot *sl) {
    const ds4_spec *sp = ds4_session_spec(sl->sess);
    if (!sp) return;
    pthread_mutex_lock(&sl->s->stats_mu);
    sl->q->c.mtp.cycles += sp->stats.cycles - sl->mtp_seen.cycles;
    sl->q->c.mtp.drafted += sp->stats.drafted - sl->mtp_seen.drafted;
    sl->q->c.mtp.accepted += sp->stats.accepted - sl->mtp_seen.accepted;
    pthread_mutex_unlock(&sl->s->stats_mu);
    sl->mtp_seen = sp->stats;
}

/* The MTP counters of /v1/ds4/stats (null without a block). */
static json_t *mtp_stats(const server *s, const ds4_spec_stats *m) {
    if (!s->engine->mtp) return json_null();
    return json_pack("{s:i,s:I,s:I,s:I,s:f,s:f}", "draft", (int)s->o.mtp.draft, "verifications", (json_int_t)m->cycles,
                     "drafted", (json_int_t)m->drafted, "accepted", (json_int_t)m->accepted, "acceptance_rate",
                     m->drafted ? (double)m->accepted / (double)m->drafted : 0.0, "tokens_per_verification",
                     m->cycles ? (double)(m->accepted + m->cycles) / (double)m->cycles : 0.0);
}

/* ------------------------------------------------------------ dispatch */

static bool job_done(job *j) {
    pthread_mutex_lock(&j->mu);
    bool d = j->done;
    pthread_mutex_unlock(&j->mu);
    return d;
}

static uint32_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return (uint32_t)i;
}

/* How well an idle slot suits a job: the rank of the order in the file's
 * comment (higher is better) and, within it, the tokens it holds of the
 * job's prompt. */
typedef struct fit {
    int rank;
    uint32_t tokens;
} fit;

/* The job's prompt continues the slot's last one: its rendered text starts
 * with that prompt's (but for a final "<think>", which a replay without the
 * reasoning turns into "</think>").  Text, not tokens: the live tokens are
 * the model's own tokenization of what it sampled, which a re-rendered
 * history need not repeat (the memory-text rung takes care of that). */
static bool continues(const slot *sl, const job *j) {
    const ds4_strbuf *p = &sl->prompt_text, *t = &j->rendered.text;
    size_t n = p->len, tl = strlen(DS4_TOK_THINK);
    if (n >= tl && memcmp(p->p + n - tl, DS4_TOK_THINK, tl) == 0) n -= tl;
    return n > 0 && t->len >= n && memcmp(p->p, t->p, n) == 0;
}

/* The session's steering scales are the ones the job runs with (worker.c:
 * apply_steering starts a session over for others). */
static bool same_steering(const server *s, const slot *sl, const job *j) {
    float ffn = j->req.steer_ffn_set ? j->req.steer_ffn : s->o.steer.ffn;
    float attn = j->req.steer_attn_set ? j->req.steer_attn : s->o.steer.attn;
    float cur_ffn, cur_attn;
    ds4_session_steering(sl->sess, &cur_ffn, &cur_attn);
    return ffn == cur_ffn && attn == cur_attn;
}

static fit slot_fit(sched *q, const slot *sl, const job *j) {
    uint32_t n = ds4_session_n_tokens(sl->sess);
    /* a session steered otherwise keeps nothing for the job */
    if (!same_steering(q->s, sl, j)) return (fit){n == 0 ? 2 : 1, 0};
    const int32_t *live = ds4_session_tokens(sl->sess);
    uint32_t common = common_prefix(live, n, j->tokens.ids, j->tokens.n);
    /* the checkpoint of the last prompt (a retried request) */
    uint32_t ck = (uint32_t)sl->ck_tokens.n;
    if (ck && ck <= j->tokens.n && common_prefix(sl->ck_tokens.ids, ck, j->tokens.ids, j->tokens.n) == ck &&
        ck > common)
        common = ck;
    int a = cont_affinity(q->s, sl->cont, j);
    if (a) return (fit){4 + a, common};
    if (continues(sl, j)) return (fit){3, common};
    if (n == 0) return (fit){2, 0};
    return (fit){1, common};
}

static bool better(fit a, double used_a, fit b, double used_b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    if (a.tokens != b.tokens) return a.tokens > b.tokens;
    return used_a < used_b; /* least recently used */
}

/* The slot for job j, or -1 to wait (under q->mu). */
static int pick_slot(sched *q, const job *j) {
    int best = -1;
    fit bf = {0, 0};
    for (uint32_t i = 0; i < q->n; i++) {
        slot *sl = &q->slots[i];
        if (sl->job) {
            if (job_done(sl->job)) return -1; /* finishing: its next turn may be this one */
            continue;
        }
        if (sl->evicting) continue;
        fit f = slot_fit(q, sl, j);
        if (best < 0 || better(f, sl->last_used, bf, q->slots[best].last_used)) {
            best = (int)i;
            bf = f;
        }
    }
    return best;
}

/* ------------------------------------------------------------ memory */

/* What a session of cap tokens holds in each pool (0 tokens: nothing). */
static const uint64_t *cost_of(const sched *q, uint32_t cap) {
    uint32_t k = cap ? (cap + q->granule - 1) / q->granule : 0;
    return q->costs[k < q->n_costs ? k : q->n_costs - 1];
}

/* The session a job of this many tokens (prompt, output and the one
 * after) takes: sized, or the whole context. */
static uint32_t session_cap(const sched *q, uint64_t tokens) {
    if (!q->sized) return q->s->o.ctx;
    return ds4_sized_capacity(q->s->engine, q->s->o.ctx, q->granule, tokens);
}

/* Whether a session of cap tokens fits the budgets with nothing else held. */
static bool fits_alone(const sched *q, uint32_t cap) {
    const uint64_t *c = cost_of(q, cap);
    for (size_t p = 0; p < q->np; p++)
        if (c[p] > q->pools[p].budget) return false;
    return true;
}

/* The largest session that fits alone, of at most `most` tokens (0: none). */
static uint32_t largest_fitting(const sched *q, uint32_t most) {
    for (uint32_t k = q->n_costs; k-- > 1;) {
        uint32_t cap = session_cap(q, (uint64_t)k * q->granule);
        if (cap <= most && fits_alone(q, cap)) return cap;
    }
    return 0;
}

/* The memory accounted to sl becomes `now` (under q->mu). */
static void hold(sched *q, slot *sl, const uint64_t *now) {
    for (size_t p = 0; p < q->np; p++) {
        q->used[p] = q->used[p] - sl->held[p] + now[p];
        sl->held[p] = now[p];
    }
}

/* The memory accounted to sl becomes what its session takes at its
 * capacity now (under q->mu; from sl's own thread, or before it runs). */
static void hold_session(sched *q, slot *sl) {
    sl->tokens = ds4_session_capacity(sl->sess);
    hold(q, sl, cost_of(q, sl->tokens));
}

/* Whether the sessions' memory holds `want` in place of what sl holds. */
static bool fits_in_place(const sched *q, const slot *sl, const uint64_t *want) {
    for (size_t p = 0; p < q->np; p++)
        if (q->used[p] - sl->held[p] + want[p] > q->pools[p].budget) return false;
    return true;
}

/* What slot sl holds while it runs a job in a session of cap tokens: its
 * session as it is, and the larger one beside it while it grows. */
static void running_cost(const sched *q, const slot *sl, uint32_t cap, uint64_t *want) {
    uint32_t cur = ds4_session_capacity(sl->sess);
    const uint64_t *a = cost_of(q, cur), *b = cost_of(q, cap);
    for (size_t p = 0; p < q->np; p++) want[p] = a[p] + (cap > cur ? b[p] : 0);
}

/* Idle sessions to the disk cache and freed, the least recently used
 * first, until what they hold (with what the ones already on the way
 * free) covers `short_by` in every pool; none when all of them would not
 * (the running jobs then end first).  Under q->mu. */
static void make_room(sched *q, const uint64_t *short_by) {
    uint64_t freed[2] = {0, 0}, can[2] = {0, 0};
    for (uint32_t i = 0; i < q->n; i++) {
        const slot *sl = &q->slots[i];
        for (size_t p = 0; p < q->np; p++) {
            if (sl->evicting) freed[p] += sl->held[p];
            if (!sl->job) can[p] += sl->held[p];
        }
    }
    for (size_t p = 0; p < q->np; p++)
        if (can[p] < short_by[p]) return;
    for (;;) {
        bool enough = true;
        for (size_t p = 0; p < q->np; p++) enough = enough && freed[p] >= short_by[p];
        if (enough) return;
        slot *lru = NULL;
        for (uint32_t i = 0; i < q->n; i++) {
            slot *sl = &q->slots[i];
            bool holds = false;
            for (size_t p = 0; p < q->np; p++) holds = holds || sl->held[p] > 0;
            if (!sl->job && !sl->evicting && holds && (!lru || sl->last_used < lru->last_used)) lru = sl;
        }
        if (!lru) return;
        lru->evicting = true;
        for (size_t p = 0; p < q->np; p++) freed[p] += lru->held[p];
        pthread_cond_signal(&lru->cv);
    }
}

/* Account `want` to sl when it fits the memory beside what the others
 * hold (under q->mu); else ask idle sessions to make room (make_room) and
 * return false. */
static bool take_memory(sched *q, slot *sl, const uint64_t *want) {
    if (fits_in_place(q, sl, want)) {
        hold(q, sl, want);
        return true;
    }
    uint64_t short_by[2] = {0, 0};
    for (size_t p = 0; p < q->np; p++) {
        uint64_t after = q->used[p] - sl->held[p] + want[p];
        short_by[p] = after > q->pools[p].budget ? after - q->pools[p].budget : 0;
    }
    make_room(q, short_by);
    return false;
}

/* The session a job starts in: its prompt and the first granule of its
 * output (all of it when less), grown from there while it answers
 * (sched_grow). */
static uint32_t first_cap(const sched *q, uint64_t prompt, uint32_t max_out) {
    return session_cap(q, prompt + (max_out < q->granule ? max_out : q->granule) + 1);
}

/* Whether a session can go from `first` tokens to `full` with nothing else
 * held: `full` fits, and so does the last growth on the way, which holds
 * the state one granule smaller beside it (the largest of the steps). */
static bool reachable_alone(const sched *q, uint32_t first, uint32_t full) {
    if (!fits_alone(q, full)) return false;
    if (full <= first) return true;
    uint32_t prev = (full - 1) / q->granule * q->granule;
    if (prev < first) prev = first;
    const uint64_t *a = cost_of(q, prev), *b = cost_of(q, full);
    for (size_t p = 0; p < q->np; p++)
        if (a[p] + b[p] > q->pools[p].budget) return false;
    return true;
}

/* The largest session a job of this prompt can reach growing alone, of at
 * most `most` tokens (0: none). */
static uint32_t largest_reachable(const sched *q, uint64_t prompt, uint32_t most) {
    uint32_t first = first_cap(q, prompt, q->granule);
    for (uint32_t k = q->n_costs; k-- > 1;) {
        uint32_t cap = session_cap(q, (uint64_t)k * q->granule);
        if (cap <= most && reachable_alone(q, first, cap)) return cap;
    }
    return 0;
}

/* The session job j starts in, in slot sl: its prompt (a tool-output-only
 * request continues the slot's live tokens) and the first granule of its
 * output; its whole size (prompt and output, at most what the memory holds
 * alone) where growing there could not fit the memory even alone (a
 * max_tokens near the budget: the old and the new state together would
 * not fit). */
static uint32_t job_cap(const sched *q, const slot *sl, const job *j) {
    uint64_t prompt = j->tokens.n + (j->cont.tool_only ? ds4_session_n_tokens(sl->sess) : 0);
    uint32_t full = session_cap(q, prompt + j->max_out + 1);
    if (!q->sized) return full;
    if (!fits_alone(q, full)) {
        uint32_t most = largest_fitting(q, q->s->o.ctx);
        if (most) full = most;
    }
    uint32_t first = first_cap(q, prompt, j->max_out);
    if (first >= full) return full;
    return reachable_alone(q, first, full) ? first : full;
}

/* Hand queued jobs to free slots, oldest first, while their sessions fit
 * the memory (under q->mu); none once stopping (worker_stop answers
 * them), nor while a running session waits to grow (sched_grow).  A job
 * whose session does not fit waits, first in line, while idle sessions
 * make room (make_room). */
static void dispatch(sched *q) {
    /* memory may have been freed: the sessions waiting to grow look first,
     * and the queue waits for them (they were admitted before any of it) */
    if (q->n_growing) {
        pthread_cond_broadcast(&q->grow_cv);
        return;
    }
    while (q->qn > 0 && !q->stop) {
        job *j = q->queue[q->qhead];
        int i = pick_slot(q, j);
        if (i < 0) return;
        slot *sl = &q->slots[i];
        uint32_t cap = job_cap(q, sl, j);
        uint64_t want[2] = {0, 0};
        running_cost(q, sl, cap, want);
        if (!take_memory(q, sl, want)) return;
        q->qhead = (q->qhead + 1) % q->qcap;
        q->qn--;
        j->cap = cap;
        sl->job = j;
        pthread_mutex_lock(&j->mu);
        j->started = true;
        j->t_started = ds4_now();
        pthread_mutex_unlock(&j->mu);
        pthread_cond_signal(&sl->cv);
    }
}

static uint64_t steps_run(const server *s) {
    return s->engine->batch ? ds4_batcher_get_stats(s->engine->batch).steps : 0;
}

void job_cancel(server *s, job *j) {
    if (j->cancel) return;
    j->cancel_step = steps_run(s);
    j->t_cancel = ds4_now();
    j->cancel = 1;
}

/* A job that was cancelled while it ran: how many steps its session took
 * to be free. */
static void count_cancel(sched *q, const job *j) {
    if (!j->cancel || !j->t_started || j->t_cancel < j->t_started) return;
    uint64_t now = steps_run(q->s), d = now > j->cancel_step ? now - j->cancel_step : 0;
    pthread_mutex_lock(&q->s->stats_mu);
    if (d > q->c.cancel_free_steps_max) q->c.cancel_free_steps_max = d;
    pthread_mutex_unlock(&q->s->stats_mu);
}

void sched_resized(slot *sl) {
    sched *q = sl->q;
    pthread_mutex_lock(&q->mu);
    hold_session(q, sl);
    dispatch(q);
    pthread_mutex_unlock(&q->mu);
}

/* Idle sessions on their way to the disk cache (their memory is coming
 * back).  Under q->mu. */
static bool evicting_any(const sched *q) {
    for (uint32_t i = 0; i < q->n; i++)
        if (q->slots[i].evicting) return true;
    return false;
}

/* Other running jobs that will end and leave their sessions idle: not
 * those waiting to grow themselves (two sessions waiting for each other
 * would wait for nothing).  Under q->mu. */
static bool others_running(const sched *q, const slot *sl) {
    for (uint32_t i = 0; i < q->n; i++)
        if (&q->slots[i] != sl && q->slots[i].job && !q->slots[i].growing) return true;
    return false;
}

/* Wait on grow_cv (under q->mu) for at most `seconds`. */
static void wait_for_memory(sched *q, double seconds) { ds4_cond_wait_for(&q->grow_cv, &q->mu, seconds); }

/* Why a session could not grow to cap tokens, for the log (under q->mu). */
static void grow_refusal(const sched *q, uint32_t cap, bool alone, bool waited, char *out, size_t n) {
    const uint64_t *c = cost_of(q, cap);
    size_t p = q->np > 1 && c[0] <= q->pools[0].budget ? 1 : 0;
    char a[32], b[32];
    if (!alone)
        snprintf(out, n, "a session of %u tokens (%s) would not fit the %s of %s even alone", cap,
                 ds4_fmt_bytes(c[p], a), q->pools[p].name, ds4_fmt_bytes(q->pools[p].budget, b));
    else
        snprintf(out, n, "the sessions hold %s of the %s of %s, %s", ds4_fmt_bytes(q->used[p], a), q->pools[p].name,
                 ds4_fmt_bytes(q->pools[p].budget, b),
                 waited ? "still after --grow-wait" : "and no other running request would free any");
}

bool sched_grow(slot *sl, uint32_t need, const char *otherwise) {
    sched *q = sl->q;
    server *s = sl->s;
    const job *j = sl->job; /* the slot's own job: set before its thread runs it */
    uint32_t from = ds4_session_capacity(sl->sess), step = from + q->granule;
    uint32_t cap = session_cap(q, need > step ? need : step);
    double deadline = ds4_now() + s->o.grow_wait_s;
    bool held = false, alone = cap > from && fits_alone(q, cap), waited = false, said = false;
    char why[1100] = "";
    pthread_mutex_lock(&q->mu);
    while (alone && !q->stop && !j->cancel && !s->stopping) {
        uint64_t want[2] = {0, 0};
        running_cost(q, sl, cap, want); /* the old state and the new one */
        if ((held = take_memory(q, sl, want))) break;
        /* idle sessions freeing their memory: always worth the wait */
        if (!evicting_any(q)) {
            if (!others_running(q, sl)) break;
            if (ds4_now() >= deadline) {
                waited = true;
                break;
            }
            if (!said)
                srv_log("generate", "session %u waits for running requests to end to grow from %u to %u tokens",
                        sl->index, from, cap);
            said = true;
        }
        if (!sl->growing) {
            sl->growing = true;
            q->n_growing++;
        }
        wait_for_memory(q, 0.1); /* a while: a cancelled job or the deadline are seen */
    }
    if (sl->growing) {
        sl->growing = false;
        q->n_growing--;
        dispatch(q); /* the queue waited for it */
    }
    if (!held && !j->cancel && !s->stopping) grow_refusal(q, cap, alone, waited, why, sizeof(why));
    pthread_mutex_unlock(&q->mu);
    ds4_err err = {0};
    bool ok = held && ds4_session_reserve(sl->sess, cap, &err) == 0;
    if (held && !ok) snprintf(why, sizeof(why), "%s", err.msg);
    if (held) sched_resized(sl); /* what it holds now: grown, or the old state alone */
    if (ok || why[0]) {
        pthread_mutex_lock(&s->stats_mu);
        if (ok) q->c.grown++;
        else q->c.grow_refused++;
        pthread_mutex_unlock(&s->stats_mu);
    }
    if (ok) srv_log("generate", "session %u grew from %u to %u tokens", sl->index, from, cap);
    else if (why[0])
        srv_log("generate", "session %u cannot grow from %u to %u tokens: %s; %s", sl->index, from, cap, why,
                otherwise);
    return ok;
}

/* An eviction asked by make_room, then what it freed handed out. */
static void run_eviction(slot *sl) {
    sched *q = sl->q;
    pthread_mutex_unlock(&q->mu);
    slot_evict(sl);
    pthread_mutex_lock(&q->s->stats_mu);
    q->c.evicted_for_memory++;
    pthread_mutex_unlock(&q->s->stats_mu);
    pthread_mutex_lock(&q->mu);
    sl->evicting = false;
    hold_session(q, sl);
    dispatch(q);
}

static void *slot_main(void *arg) {
    slot *sl = arg;
    sched *q = sl->q;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!sl->job && !sl->evicting && !q->stop) pthread_cond_wait(&sl->cv, &q->mu);
        if (sl->evicting) {
            run_eviction(sl);
            continue;
        }
        if (!sl->job) break;
        job *j = sl->job;
        pthread_mutex_unlock(&q->mu);
        outcome k = slot_run(sl, j);
        sched_count_outcome(q, k, j->out.completion_tokens);
        count_cancel(q, j);
        sched_count_mtp(sl); /* a job that ended before its answer's end (generate counts those) */
        pthread_mutex_lock(&q->mu);
        sl->job = NULL;
        sl->last_used = ds4_now();
        hold_session(q, sl); /* what the session ended at */
        dispatch(q);
        pthread_mutex_unlock(&q->mu);
        job_unref(j);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ------------------------------------------------------------ sessions */

/* What a session of cap tokens takes: its sequence where the backend keeps
 * it, and in host memory its token list and the in-memory checkpoint of
 * its last prompt (a KV state of its size).  One pool where the backend
 * keeps the state in host memory (the CPU), else the backend's and the
 * host's. */
static void session_cost(const server *s, uint32_t cap, uint64_t *out) {
    ds4_seq_memory m;
    ds4_engine_seq_memory(s->engine, cap, &m);
    uint64_t kv = ds4_engine_kv_bytes(s->engine, cap);
    if (!m.bytes) { /* a backend that cannot tell (a pipeline): a KV state in host memory */
        m.bytes = kv;
        m.in_host = true;
    }
    uint64_t host = (uint64_t)cap * sizeof(int32_t) + (s->memory_checkpoint ? kv : 0) + m.host_bytes;
    out[0] = m.in_host ? m.bytes + host : m.bytes;
    out[1] = m.in_host ? 0 : host;
}

/* The cost of a session of every size (sched.costs). */
static int cost_table(sched *q, ds4_err *err) {
    server *s = q->s;
    q->n_costs = (s->o.ctx + q->granule - 1) / q->granule + 1;
    if (!(q->costs = calloc(q->n_costs, sizeof(*q->costs)))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (uint32_t k = 1; k < q->n_costs; k++) session_cost(s, session_cap(q, (uint64_t)k * q->granule), q->costs[k]);
    return 0;
}

/* The memories the sessions draw on (capacity.h), the least and the most
 * a session takes in each; shared: the disk cache's state (one for all)
 * and the backend's main sequence at its least. */
static size_t session_pools(sched *q, uint32_t least) {
    server *s = q->s;
    ds4_seq_memory m;
    ds4_engine_seq_memory(s->engine, s->engine->b->opts.main_ctx, &m);
    uint64_t kv = ds4_engine_kv_bytes(s->engine, s->o.ctx), main_seq = m.bytes;
    bool in_host = !m.bytes || m.in_host;
    const uint64_t *lo = cost_of(q, least), *hi = cost_of(q, s->o.ctx);
    uint64_t scratch = s->o.kv_dir ? kv : 0, given = s->o.kv_mem_mb << 20;
    if (in_host) {
        q->pools[0] = (ds4_mem_pool){"memory", m.room, m.host_weights, scratch + main_seq, given, lo[0], hi[0], 0};
        return 1;
    }
    q->pools[0] = (ds4_mem_pool){"GPU memory", m.room, 0, main_seq, given, lo[0], hi[0], 0};
    q->pools[1] = (ds4_mem_pool){"host memory", ds4_mem_available(), m.host_weights, scratch, 0, lo[1], hi[1], 0};
    return 2;
}

/* The startup line: how many sessions, the least and the most a session
 * takes, and the memory's arithmetic (docs/SERVER.md). */
static void log_sessions(const sched *q, uint32_t least) {
    const server *s = q->s;
    char a[32], b[32], d[32], e[32], f[32], why[2][256], tail[80] = "";
    for (size_t i = 0; i < q->np; i++) ds4_capacity_explain(&q->pools[i], why[i], sizeof(why[i]));
    if (!s->o.parallel_given)
        snprintf(tail, sizeof(tail), "; no --parallel: as many as the memory holds, at most %u", DEFAULT_PARALLEL_MAX);
    ds4_seq_memory m;
    ds4_engine_seq_memory(s->engine, least, &m);
    const uint64_t *lo = cost_of(q, least), *hi = cost_of(q, s->o.ctx);
    uint64_t kv = ds4_engine_kv_bytes(s->engine, least);
    srv_log("server",
            "%u session%s at most, each of %u to %u tokens: %s to %s (at %u tokens: state %s, checkpoint %s, token "
            "list %s); %s%s%s%s",
            q->n, q->n == 1 ? "" : "s", least, s->o.ctx, ds4_fmt_bytes(lo[0] + lo[1], a),
            ds4_fmt_bytes(hi[0] + hi[1], b), least, ds4_fmt_bytes((m.bytes ? m.bytes : kv) + m.host_bytes, d),
            ds4_fmt_bytes(s->memory_checkpoint ? kv : 0, e), ds4_fmt_bytes((uint64_t)least * sizeof(int32_t), f),
            why[0], q->np > 1 ? "; " : "", q->np > 1 ? why[1] : "", tail);
}

/* MTP for a session where the backend has an MTP sequence for it.  The
 * CUDA backend holds one, beside its main sequence: the first session
 * speculates and the others decode a token a step (said once), rather
 * than the server refusing to start. */
static int slot_enable_mtp(server *s, slot *sl, ds4_err *err) {
    ds4_err e = {0};
    if (ds4_session_enable_mtp(sl->sess, s->o.mtp.draft, s->o.mtp.margin, &e) == 0) return 0;
    if (e.code != DS4_EUNSUPPORTED || sl->index == 0) {
        *err = e;
        return -1;
    }
    if (sl->index == 1) srv_log("server", "MTP for session 0 only: %s", e.msg);
    return 0;
}

/* A slot and its session: sized (no state until a job needs it), or of the
 * whole context.  What the session holds from the start (the whole
 * context's, or an MTP session's first sequence) is accounted to it. */
static int slot_init(sched *q, slot *sl, uint32_t i, ds4_err *err) {
    server *s = q->s;
    sl->q = q;
    sl->s = s;
    sl->index = i;
    sl->cont = cont_binding_at(s, i);
    pthread_cond_init(&sl->cv, NULL);
    sl->sess = q->sized ? ds4_session_new_sized(s->engine, s->o.ctx, q->granule, err)
                        : ds4_session_new(s->engine, s->o.ctx, err);
    if (!sl->sess) return -1;
    if (s->engine->mtp && slot_enable_mtp(s, sl, err)) return -1;
    if (!(sl->tok = ds4_tokenizer_new(s->engine->vocab, err))) return -1;
    hold_session(q, sl);
    return 0;
}

static void slot_drop(slot *sl) {
    uint64_t none[2] = {0, 0};
    hold(sl->q, sl, none);
    slot_free_state(sl);
    pthread_cond_destroy(&sl->cv);
}

/* The sessions (q->n of them made, each to be freed).  Sessions of the
 * whole context (a pipeline's): a default --parallel keeps the sessions
 * that were made when one finds no room (less one as headroom for the
 * batched steps' own buffers where the memory was not measured); a
 * backend that holds fewer sequences than asked keeps the ones it has. */
static int make_slots(sched *q, uint32_t want, bool measured, ds4_err *err) {
    server *s = q->s;
    if (!(q->slots = calloc(want, sizeof(*q->slots)))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (ds4_engine_enable_batching(s->engine, s->o.batch_tokens, s->o.pace_stretch, err) != 0) return -1;
    for (uint32_t i = 0; i < want; i++) {
        ds4_err e = {0};
        q->n = i + 1;
        if (slot_init(q, &q->slots[i], i, &e) == 0) continue;
        if (q->sized || s->o.parallel_given || i == 0 || (e.code != DS4_ENOMEM && e.code != DS4_EUNSUPPORTED))
            return ds4_err_set(err, e.code, "session %u of %u: %s", i + 1, want, e.msg);
        slot_drop(&q->slots[i]);
        q->n = i;
        if (e.code == DS4_EUNSUPPORTED) { /* the backend holds no more sequences */
            srv_log("server", "%u session%s: %s", q->n, q->n == 1 ? "" : "s", e.msg);
            return 0;
        }
        if (!measured && i > 1) slot_drop(&q->slots[--q->n]);
        srv_log("server", "%u sessions fit the memory: %s", q->n, e.msg);
        return 0;
    }
    return 0;
}

static void log_kvc(void *ctx, const char *msg) {
    (void)ctx;
    srv_log("kvcache", "%s", msg);
}

static void restore_tool(void *ctx, const ds4_kvc_tool *t) {
    server *s = ctx;
    char id[DS4_KVC_MAX_ID + 1];
    snprintf(id, sizeof(id), "%.*s", (int)t->id_len, t->id);
    toolmem_put(s->tools, id, t->dsml, t->dsml_len);
}

static int open_store(sched *q, ds4_err *err) {
    server *s = q->s;
    ds4_kvc_opts ko = {.dir = s->o.kv_dir,
                       .budget_bytes = s->o.kv_space_mb << 20,
                       .min_tokens = s->o.kv_policy.min_tokens,
                       .quant_bits = ds4_engine_quant_bits(s->engine),
                       .reject_different_quant = s->o.kv_reject_different_quant,
                       .ctx = s->o.ctx,
                       .max_tools = 4 * (size_t)s->o.tool_memory_max_ids,
                       .vocab = s->engine->vocab,
                       .log = log_kvc};
    if (!(q->store = ds4_kvc_open(&ko, err)) || !(q->scratch = ds4_session_state_new(q->slots[0].sess, err))) return -1;
    ds4_kvc_stats st = ds4_kvc_get_stats(q->store);
    srv_log("kvcache", "%s: %llu files, %llu MB of %llu MB", s->o.kv_dir, (unsigned long long)st.files,
            (unsigned long long)(st.bytes >> 20), (unsigned long long)s->o.kv_space_mb);
    if (s->o.exact_replay) ds4_kvc_each_tool(q->store, restore_tool, s);
    return 0;
}

int worker_start(server *s, ds4_err *err) {
    sched *q = calloc(1, sizeof(*q));
    if (!q) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    s->sched = q;
    q->s = s;
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->grow_cv, NULL);
    pthread_mutex_init(&q->store_mu, NULL);
    /* The backend first: what sessions cost it and its room (capacity.h);
     * sessions sized by what they hold where it resizes sequences. */
    if (ds4_engine_open_backend(s->engine, s->o.ctx, err) != 0) return -1;
    q->sized = ds4_engine_can_resize(s->engine);
    q->granule = q->sized ? ds4_ctx_granule(s->o.ctx) : s->o.ctx;
    uint32_t least = session_cap(q, 1);
    if (cost_table(q, err) != 0) return -1;
    q->np = session_pools(q, least);
    ds4_capacity cap;
    if (ds4_capacity_plan(q->pools, q->np, least, s->o.parallel_given ? s->o.parallel : 0, DEFAULT_PARALLEL_MAX, &cap,
                          err) != 0)
        return -1;
    if (cont_bindings_new(s, cap.n, err) != 0 || make_slots(q, cap.n, cap.measured, err) != 0) return -1;
    if (!(s->cvocab = cvocab_new(s->engine->vocab, err))) return -1;
    q->user_tok = ds4_vocab_find_added(s->engine->vocab, DS4_TOK_USER, strlen(DS4_TOK_USER));
    q->assistant_tok = ds4_vocab_find_added(s->engine->vocab, DS4_TOK_ASSISTANT, strlen(DS4_TOK_ASSISTANT));
    if (s->o.kv_dir && open_store(q, err) != 0) return -1;
    q->qcap = s->o.queue_max;
    if (!(q->queue = calloc((size_t)q->qcap, sizeof(*q->queue)))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < q->n; i++) {
        if (pthread_create(&q->slots[i].thread, NULL, slot_main, &q->slots[i]) != 0)
            return ds4_err_set(err, DS4_EIO, "cannot start the thread of session %u", i);
        q->slots[i].started = true;
    }
    log_sessions(q, least);
    return 0;
}

/* The output job j may generate (its max_tokens, or the server's default),
 * and whether a session for its prompt and that output can ever fit the
 * sessions' memory: a default too large for it is lowered to what its
 * session can grow to alone; a given one, or a prompt alone, that does not
 * fit is a 400 naming the bytes (one that fits but could not be grown to
 * gets its session whole from the start, job_cap). */
static int size_job(sched *q, job *j, api_error *e) {
    const server *s = q->s;
    uint64_t prompt = j->tokens.n;
    j->max_out = j->req.max_tokens ? j->req.max_tokens : s->o.default_max_tokens;
    uint32_t cap = session_cap(q, prompt + j->max_out + 1);
    if (!q->sized) return 0;
    if (j->req.max_tokens ? fits_alone(q, cap) : reachable_alone(q, first_cap(q, prompt, j->max_out), cap)) return 0;
    uint32_t most = largest_reachable(q, prompt, s->o.ctx);
    if (!j->req.max_tokens) {
        if (most > prompt + 1) {
            j->max_out = most - (uint32_t)prompt - 1;
            return 0;
        }
        j->max_out = 1; /* the least it needs */
        cap = session_cap(q, prompt + 2);
    }
    const uint64_t *c = cost_of(q, cap);
    size_t p = c[0] > q->pools[0].budget ? 0 : 1;
    char a[32], b[32];
    api_fail(e, 400,
             "this request needs a session of %u tokens (a prompt of %llu tokens and %u of output), %s of %s, but "
             "the sessions have %s in all; lower max_tokens or shorten the prompt",
             cap, (unsigned long long)prompt, j->max_out, ds4_fmt_bytes(c[p], a), q->pools[p].name,
             ds4_fmt_bytes(q->pools[p].budget, b));
    e->code = "kv_memory_exceeded";
    return -1;
}

int worker_enqueue(server *s, job *j, api_error *e) {
    sched *q = s->sched;
    pthread_mutex_lock(&q->mu);
    int rc = 0; /* -1 queue full, -2 shutting down, -3 too large (e set) */
    if (q->stop || s->stopping) {
        api_fail(e, 503, "server shutting down");
        rc = -2;
    } else if (size_job(q, j, e) != 0) {
        rc = -3;
    } else if (q->qn >= q->qcap) {
        api_fail(e, 429, "too many requests queued; retry later");
        rc = -1;
    }
    if (rc == 0) {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        q->queue[(q->qhead + q->qn) % q->qcap] = j;
        q->qn++;
        dispatch(q);
    }
    pthread_mutex_unlock(&q->mu);
    pthread_mutex_lock(&s->stats_mu);
    if (rc == 0) {
        q->c.queued++;
        s->replay.replayed += j->calls.replayed;
        s->replay.canonical += j->calls.canonical;
    }
    if (rc == -1) q->c.rejected_queue_full++;
    if (rc == -2) q->c.rejected_shutting_down++;
    if (rc == -3) q->c.rejected_too_large++;
    pthread_mutex_unlock(&s->stats_mu);
    return rc ? -1 : 0;
}

void worker_stop(server *s) {
    sched *q = s->sched;
    if (!q) return;
    /* Running jobs are cancelled, the sessions' threads end, and the
     * queued jobs are answered 503. */
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    for (uint32_t i = 0; i < q->n; i++) {
        if (q->slots[i].job) job_cancel(s, q->slots[i].job);
        pthread_cond_signal(&q->slots[i].cv);
    }
    pthread_cond_broadcast(&q->grow_cv);
    pthread_mutex_unlock(&q->mu);
    for (uint32_t i = 0; i < q->n; i++)
        if (q->slots[i].started) pthread_join(q->slots[i].thread, NULL);
    for (; q->qn > 0; q->qn--, q->qhead = (q->qhead + 1) % q->qcap) {
        job *j = q->queue[q->qhead];
        api_error e = {0};
        api_fail(&e, 503, "server shutting down");
        if (j->req.stream) {
            ds4_strbuf b = {0};
            j->api->stream_error(j, e.message, &b);
            job_push(j, &b);
            ds4_strbuf_free(&b);
            job_finish(j, 200, NULL);
        } else {
            job_finish(j, 503, api_error_body(j->api, &e));
        }
        job_unref(j);
    }
    for (uint32_t i = 0; i < q->n; i++) {
        slot *sl = &q->slots[i];
        if (sl->sess) slot_save_live(sl, DS4_KVC_SHUTDOWN);
        slot_free_state(sl);
        pthread_cond_destroy(&sl->cv);
    }
    ds4_kvc_close(q->store);
    ds4_kv_state_free(q->scratch);
    free(q->queue);
    free(q->slots);
    free(q->costs);
    cont_bindings_free(s);
    cvocab_free(s->cvocab);
    s->cvocab = NULL;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->grow_cv);
    pthread_mutex_destroy(&q->store_mu);
    free(q);
    s->sched = NULL;
}

/* ------------------------------------------------------------ stats */

typedef struct live_view {
    int waiting, running, live, n;
    uint64_t held_tokens;
    double oldest_wait;
} live_view;

static live_view look(sched *q) {
    live_view v = {0};
    double now = ds4_now();
    pthread_mutex_lock(&q->mu);
    v.waiting = q->qn;
    v.n = (int)q->n;
    for (uint32_t i = 0; i < q->n; i++) {
        v.running += q->slots[i].job != NULL;
        /* an idle session's tokens do not change while the lock is held */
        v.live += q->slots[i].job != NULL || ds4_session_n_tokens(q->slots[i].sess) > 0;
        v.held_tokens += q->slots[i].tokens;
    }
    if (q->qn) v.oldest_wait = now - q->queue[q->qhead]->t_enqueued;
    pthread_mutex_unlock(&q->mu);
    return v;
}

static json_t *kv_stats(sched *q, const counters *c) {
    if (!q->store) return json_null();
    ds4_kvc_stats k = ds4_kvc_get_stats(q->store);
    json_t *by_reason = json_object();
    for (int i = 1; i <= DS4_KVC_SHUTDOWN; i++)
        json_object_set_new(by_reason, KV_REASON_NAMES[i], json_integer((json_int_t)c->disk_writes[i]));
    return json_pack("{s:I,s:I,s:I,s:o,s:I,s:I,s:I,s:I,s:I}", "files", (json_int_t)k.files, "bytes",
                     (json_int_t)k.bytes, "files_written", (json_int_t)k.stores, "files_written_by_reason", by_reason,
                     "writes_skipped_over_budget", (json_int_t)k.store_skips, "loads", (json_int_t)k.loads,
                     "load_failures", (json_int_t)k.load_failures, "files_evicted", (json_int_t)k.evictions,
                     "corrupt_files_deleted", (json_int_t)k.corrupt);
}

/* The sessions' memory by pool: its budget and what the sessions hold. */
static json_t *memory_stats(sched *q) {
    json_t *a = json_array();
    pthread_mutex_lock(&q->mu);
    for (size_t p = 0; p < q->np; p++) {
        const ds4_mem_pool *m = &q->pools[p];
        json_array_append_new(a, json_pack("{s:s,s:o,s:I}", "name", m->name, "budget_bytes",
                                           m->budget == UINT64_MAX ? json_null() : json_integer((json_int_t)m->budget),
                                           "held_bytes", (json_int_t)q->used[p]));
    }
    pthread_mutex_unlock(&q->mu);
    return a;
}

static json_t *batch_stats(const server *s) {
    if (!s->engine->batch) return json_null();
    ds4_batcher_stats b = ds4_batcher_get_stats(s->engine->batch);
    return json_pack("{s:I,s:I,s:f,s:f,s:I,s:I,s:o,s:o}", "steps", (json_int_t)b.steps, "rows", (json_int_t)b.rows,
                     "mean_rows", b.steps ? (double)b.rows / b.steps : 0.0, "mean_sessions",
                     b.steps ? (double)b.seqs / b.steps : 0.0, "max_rows", (json_int_t)b.max_rows, "max_sessions",
                     (json_int_t)b.max_seqs, "decode_step_ms", b.short_s > 0 ? json_real(b.short_s * 1e3) : json_null(),
                     "prefill_piece", b.piece > 0 ? json_integer((json_int_t)b.piece) : json_null());
}

json_t *worker_stats(server *s) {
    sched *q = s->sched;
    live_view v = look(q);
    pthread_mutex_lock(&s->stats_mu);
    counters c = q->c;
    replay_stats rs = s->replay;
    double tps = rate_now(&q->rate);
    pthread_mutex_unlock(&s->stats_mu);
    json_t *sources = json_object();
    for (size_t i = 0; i < N_SOURCES; i++)
        json_object_set_new(sources, KV_SOURCES[i], json_integer((json_int_t)c.by_source[i]));
    json_t *sessions = json_pack("{s:i,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "parallel", v.n, "live", v.live,
                                 "running", v.running, "ctx", (json_int_t)s->o.ctx, "held_tokens",
                                 (json_int_t)v.held_tokens, "evicted", (json_int_t)c.slots_evicted,
                                 "evicted_for_memory", (json_int_t)c.evicted_for_memory, "grown", (json_int_t)c.grown,
                                 "grow_refused", (json_int_t)c.grow_refused, "memory", memory_stats(q));
    return json_pack("{s:{s:I,s:i,s:i,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I},s:o,s:o,s:{s:I,s:I,s:I,s:I,s:f},s:o,"
                     "s:{s:s,s:i,s:i},s:o,s:{s:I,s:I,s:I,s:I},s:o}",
                     "jobs", "queued", (json_int_t)c.queued, "waiting", v.waiting, "running", v.running,
                     "oldest_wait_seconds", v.oldest_wait, "answered", (json_int_t)c.ended[ANSWERED], "failed",
                     (json_int_t)c.ended[FAILED], "cancelled", (json_int_t)c.ended[CANCELLED], "continuation_lost",
                     (json_int_t)c.ended[CONTINUATION_LOST], "rejected_queue_full", (json_int_t)c.rejected_queue_full,
                     "rejected_shutting_down", (json_int_t)c.rejected_shutting_down, "rejected_too_large",
                     (json_int_t)c.rejected_too_large, "cancel_free_steps_max", (json_int_t)c.cancel_free_steps_max,
                     "sessions", sessions, "batches", batch_stats(s), "tokens", "prompt", (json_int_t)c.prompt_tokens,
                     "reused", (json_int_t)c.reused_tokens, "prefilled", (json_int_t)c.prefilled_tokens, "generated",
                     (json_int_t)c.generated_tokens, "generated_per_second", tps, "prompts_by_kv_source", sources,
                     "last_prompt", "kv_source", c.last_source, "reused", (int)c.last_reused, "prefilled",
                     (int)c.last_prefilled, "kvcache", kv_stats(q, &c), "tool_memory", "ids_remembered",
                     (json_int_t)toolmem_count(s->tools), "history_turns_replayed_exact", (json_int_t)rs.replayed,
                     "history_turns_rendered_canonical", (json_int_t)rs.canonical, "live_tails_canonicalized",
                     (json_int_t)c.canonicalized, "mtp", mtp_stats(s, &c.mtp));
}
