/*
 * sampler.c - token selection (see sampler.h).
 */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void ds4_sampler_defaults(ds4_sampler_params *p) {
    p->temperature = DS4_TEMP_DEFAULT;
    p->top_p = DS4_TOP_P_DEFAULT;
    p->min_p = DS4_MIN_P_DEFAULT;
    p->top_k = 0;
    p->seed = 0;
}

int ds4_sampler_params_check(const ds4_sampler_params *p, ds4_err *err) {
    if (!(p->temperature >= 0.0f && p->temperature <= DS4_TEMP_MAX))
        return ds4_err_set(err, DS4_EINVAL, "temperature %g: must be in 0..%g", p->temperature, DS4_TEMP_MAX);
    if (!(p->top_p >= 0.0f && p->top_p <= 1.0f))
        return ds4_err_set(err, DS4_EINVAL, "top_p %g: must be in 0..1", p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return ds4_err_set(err, DS4_EINVAL, "min_p %g: must be in 0..1", p->min_p);
    if (p->top_k < 0) return ds4_err_set(err, DS4_EINVAL, "top_k %d: must be >= 0", p->top_k);
    return 0;
}

static uint64_t default_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
    return s ? s : 0x9E3779B97F4A7C15ull;
}

int ds4_sampler_init(ds4_sampler *s, const ds4_sampler_params *p, int n_vocab, ds4_err *err) {
    memset(s, 0, sizeof(*s));
    if (ds4_sampler_params_check(p, err) != 0) return -1;
    if (n_vocab <= 0) return ds4_err_set(err, DS4_EINVAL, "sampler: vocabulary size %d", n_vocab);
    s->p = *p;
    if (s->p.top_k > DS4_TOP_K_MAX) s->p.top_k = DS4_TOP_K_MAX;
    s->state = p->seed ? p->seed : default_seed();
    s->n_vocab = n_vocab;
    s->cand_id = malloc((size_t)n_vocab * sizeof(int32_t));
    s->cand_logit = malloc((size_t)n_vocab * sizeof(float));
    if (!s->cand_id || !s->cand_logit) {
        ds4_sampler_free(s);
        return ds4_err_set(err, DS4_ENOMEM, "sampler: out of memory");
    }
    return 0;
}

void ds4_sampler_free(ds4_sampler *s) {
    free(s->cand_id);
    free(s->cand_logit);
    s->cand_id = NULL;
    s->cand_logit = NULL;
}

/* xorshift64*: small, fast, and good enough for sampling. */
static double next_uniform(ds4_sampler *s) {
    uint64_t x = s->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->state = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* Order candidates by logit descending, lower id first on ties, so the
 * kept sets and the draw do not depend on the sort's stability. */
static void sort_candidates(int32_t *id, float *lg, int n) {
    for (int gap = n / 2; gap > 0; gap /= 2) {
        for (int i = gap; i < n; i++) {
            int32_t ti = id[i];
            float tl = lg[i];
            int j = i;
            while (j >= gap && (lg[j - gap] < tl || (lg[j - gap] == tl && id[j - gap] > ti))) {
                id[j] = id[j - gap];
                lg[j] = lg[j - gap];
                j -= gap;
            }
            id[j] = ti;
            lg[j] = tl;
        }
    }
}

/* Keep only the k best candidates, best first (base/rank.h's order: the
 * candidates are in id order, so a lower position is a lower id). */
static int select_top_k(int32_t *id, float *lg, int n, int k) {
    if (k <= 0 || k >= n) return n;
    int32_t pos[DS4_TOP_K_MAX], kid[DS4_TOP_K_MAX];
    float kl[DS4_TOP_K_MAX];
    int kept = ds4_top_k(lg, n, k, pos);
    for (int i = 0; i < kept; i++) {
        kid[i] = id[pos[i]];
        kl[i] = lg[pos[i]];
    }
    memcpy(id, kid, (size_t)kept * sizeof(*id));
    memcpy(lg, kl, (size_t)kept * sizeof(*lg));
    return kept;
}

/* The candidates the filters keep, into cand_id / cand_logit (scaled
 * logits, the top one 0), and the sum of their weights exp(l): their
 * count, or 0 when the draw is the argmax (greedy, no finite logit). */
static int candidates(ds4_sampler *s, const float *logits, double *total_out) {
    int n_vocab = s->n_vocab;
    int32_t top = ds4_argmax(logits, n_vocab);
    float max = logits[top];
    if (s->p.temperature <= 0.0f || !isfinite(max)) return 0;

    /* min-p as a logit threshold: p_i >= min_p * p_max  <=>
     * (l_i - max) / T >= ln(min_p). */
    float inv_t = 1.0f / s->p.temperature;
    double floor_scaled = s->p.min_p > 0.0f ? log((double)s->p.min_p) : -INFINITY;
    int n = 0;
    for (int i = 0; i < n_vocab; i++) {
        float l = (logits[i] - max) * inv_t;
        if (!(l >= floor_scaled) || l == -INFINITY) continue;
        s->cand_id[n] = i;
        s->cand_logit[n] = l;
        n++;
    }
    if (s->p.top_k > 0) n = select_top_k(s->cand_id, s->cand_logit, n, s->p.top_k);
    else if (s->p.top_p < 1.0f) sort_candidates(s->cand_id, s->cand_logit, n);

    double total = 0.0;
    for (int i = 0; i < n; i++) total += exp((double)s->cand_logit[i]);
    if (s->p.top_p < 1.0f) {
        /* Candidates are sorted: keep the smallest prefix reaching top_p. */
        double acc = 0.0, need = (double)s->p.top_p * total;
        int keep = 0;
        while (keep < n) {
            acc += exp((double)s->cand_logit[keep++]);
            if (acc >= need) break;
        }
        n = keep;
        total = acc;
    }
    *total_out = total;
    return n;
}

int32_t ds4_sample(ds4_sampler *s, const float *logits) {
    double total = 0.0;
    int n = candidates(s, logits, &total);
    if (n == 0) return ds4_argmax(logits, s->n_vocab);
    double r = next_uniform(s) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += exp((double)s->cand_logit[i]);
        if (r < acc) return s->cand_id[i];
    }
    return s->cand_id[n - 1];
}

void ds4_sampler_dist(ds4_sampler *s, const float *logits, double *p) {
    double total = 0.0;
    int n = candidates(s, logits, &total);
    memset(p, 0, (size_t)s->n_vocab * sizeof(double));
    if (n == 0) {
        p[ds4_argmax(logits, s->n_vocab)] = 1.0;
        return;
    }
    for (int i = 0; i < n; i++) p[s->cand_id[i]] = exp((double)s->cand_logit[i]) / total;
}

int32_t ds4_sample_dist(ds4_sampler *s, const double *p) {
    double total = 0.0;
    int32_t last = -1;
    for (int i = 0; i < s->n_vocab; i++)
        if (p[i] > 0.0) {
            total += p[i];
            last = i;
        }
    if (last < 0) return 0;
    double r = next_uniform(s) * total, acc = 0.0;
    for (int i = 0; i < s->n_vocab; i++) {
        acc += p[i];
        if (p[i] > 0.0 && r < acc) return i;
    }
    return last;
}

double ds4_sampler_uniform(ds4_sampler *s) { return next_uniform(s); }

static double log_sum_exp(const float *x, int n, float max) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - (double)max);
    return (double)max + log(sum);
}

double ds4_logprob_of(const float *logits, int n, int32_t id) {
    float max = logits[ds4_argmax(logits, n)];
    return (double)logits[id] - log_sum_exp(logits, n, max);
}

int ds4_top_logprobs(const float *logits, int n, int k, int32_t *ids, float *logprobs) {
    if (k <= 0 || n <= 0) return 0;
    double lse = log_sum_exp(logits, n, logits[ds4_argmax(logits, n)]);
    int kept = ds4_top_k(logits, n, k, ids);
    for (int i = 0; i < kept; i++) logprobs[i] = (float)((double)logits[ids[i]] - lse);
    return kept;
}
