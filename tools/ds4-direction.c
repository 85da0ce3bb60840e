/*
 * ds4-direction - build directional-steering vectors from two prompt sets,
 * and sweep steering scales over an evaluation set (docs/STEERING.md).
 *
 *   ds4-direction -m MODEL --good-file G --bad-file B [--control-file C] -o OUT.f32
 *       Every prompt is rendered as a one-turn chat (system prompt, user
 *       message, the assistant's turn opened as ds4 renders it; --raw: the
 *       text as it is) and run
 *       through the model; the activation of its last token at the steering
 *       point (--component ffn: after each layer's FFN output; attn: after
 *       its attention output) is averaged per layer over each set.  The
 *       direction of layer l is mean_good(l) - mean_bad(l) (--pair-normalize:
 *       the mean of the unit per-pair differences), made orthogonal to the
 *       control set's mean when one is given, and normalised.  OUT.f32 gets
 *       n_layer x n_embd f32 (the --dir-steering-file format), OUT.json what
 *       it was built from.
 *
 *   ds4-direction -m MODEL --sweep --direction OUT.f32 --eval-file E.jsonl
 *       Each line of E is {"prompt": ..., "good": ..., "bad": ...}; for each
 *       scale of --scales the mean NLL per token of the good and of the bad
 *       continuations after the rendered prompt is computed with that
 *       steering scale (at --component), and a table is printed.
 *
 * Prompt files: one prompt per line (blank lines and lines starting with
 * '#' skipped), or JSON lines {"prompt": "..."} (a line starting with '{'
 * is read as JSON).  With the direction as built, a positive scale removes
 * what sets the good prompts apart and a negative one adds more of it.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/cli.h"
#include "engine/session.h"
#include "engine/startup.h"
#include "model/steering.h"
#include "text/chat.h"
#include "text/rendered.h"
#include "text/tokenizer.h"

#define DEFAULT_SCALES "-2,-1,-0.5,0,0.5,1,2"
#define MAX_SCALES     64

typedef struct opts {
    const char *model, *backend, *system;
    const char *good, *bad, *control, *out;
    const char *direction, *eval, *scales, *component;
    bool sweep, think, raw, pair_normalize, no_sim;
    int threads;
    uint32_t ctx;
} opts;

/* ------------------------------------------------------------ input */

typedef struct prompts {
    char **v;
    size_t n;
} prompts;

static void prompts_free(prompts *p) {
    for (size_t i = 0; i < p->n; i++) free(p->v[i]);
    free(p->v);
    memset(p, 0, sizeof(*p));
}

static int prompts_add(prompts *p, const char *s, size_t len, ds4_err *err) {
    char **nv = realloc(p->v, (p->n + 1) * sizeof(char *));
    if (!nv) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->v = nv;
    if (!(p->v[p->n] = strndup(s, len))) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    p->n++;
    return 0;
}

/* A string field of a JSON line, named in the error as PATH:LINE: field. */
static const char *json_field(json_t *o, const char *key, const char *path, size_t line, ds4_err *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        ds4_err_set(err, DS4_EFORMAT, "%s:%zu: field \"%s\" %s", path, line, key,
                    v ? "must be a string" : "is missing");
        return NULL;
    }
    return json_string_value(v);
}

/* Calls line(ctx, text, len, lineno) for each line that is not blank or a
 * '#' comment. */
static int each_line(const char *path, int (*line)(void *, const char *, size_t, size_t, ds4_err *), void *ctx,
                     ds4_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, no = 0;
    ssize_t n;
    int rc = 0;
    while (rc == 0 && (n = getline(&buf, &cap, f)) >= 0) {
        no++;
        while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) n--;
        size_t a = 0;
        while (a < (size_t)n && (buf[a] == ' ' || buf[a] == '\t')) a++;
        if (a == (size_t)n || buf[a] == '#') continue;
        rc = line(ctx, buf, (size_t)n, no, err);
    }
    free(buf);
    fclose(f);
    return rc;
}

typedef struct prompt_reader {
    prompts *p;
    const char *path;
} prompt_reader;

static int prompt_line(void *ctx, const char *s, size_t n, size_t no, ds4_err *err) {
    prompt_reader *r = ctx;
    size_t a = 0;
    while (a < n && (s[a] == ' ' || s[a] == '\t')) a++;
    if (s[a] != '{') return prompts_add(r->p, s, n, err);
    json_error_t je;
    json_t *o = json_loadb(s, n, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return ds4_err_set(err, DS4_EFORMAT, "%s:%zu: %s", r->path, no, o ? "not a JSON object" : je.text);
    }
    const char *text = json_field(o, "prompt", r->path, no, err);
    int rc = text ? prompts_add(r->p, text, strlen(text), err) : -1;
    json_decref(o);
    return rc;
}

static int read_prompts(const char *path, prompts *p, ds4_err *err) {
    prompt_reader r = {p, path};
    if (each_line(path, prompt_line, &r, err)) return -1;
    if (p->n == 0) return ds4_err_set(err, DS4_EFORMAT, "%s: no prompts", path);
    return 0;
}

/* The evaluation set: prompt, good and bad continuation per item. */
typedef struct eval_set {
    prompts prompt, good, bad;
    const char *path;
} eval_set;

static int eval_line(void *ctx, const char *s, size_t n, size_t no, ds4_err *err) {
    eval_set *e = ctx;
    json_error_t je;
    json_t *o = json_loadb(s, n, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return ds4_err_set(err, DS4_EFORMAT, "%s:%zu: %s", e->path, no, o ? "not a JSON object" : je.text);
    }
    const char *p = json_field(o, "prompt", e->path, no, err), *g = p ? json_field(o, "good", e->path, no, err) : NULL,
               *b = g ? json_field(o, "bad", e->path, no, err) : NULL;
    int rc = -1;
    if (b && !*g) ds4_err_set(err, DS4_EFORMAT, "%s:%zu: field \"good\" is empty", e->path, no);
    else if (b && !*b) ds4_err_set(err, DS4_EFORMAT, "%s:%zu: field \"bad\" is empty", e->path, no);
    else if (b)
        rc = prompts_add(&e->prompt, p, strlen(p), err) || prompts_add(&e->good, g, strlen(g), err) ||
                     prompts_add(&e->bad, b, strlen(b), err)
                 ? -1
                 : 0;
    json_decref(o);
    return rc;
}

/* ------------------------------------------------------------ the model */

typedef struct run {
    const opts *o;
    ds4_engine *e;
    ds4_session *s;
    ds4_tokenizer *tk;
    uint32_t L, D;
    bool ffn;       /* the component */
    bool recording; /* the observer adds what it sees to acc */
    double *acc;    /* L x D: the last token's activations */
} run;

static void observe(void *ctx, uint32_t il, bool ffn, uint32_t T, const float *y) {
    run *r = ctx;
    if (!r->recording || ffn != r->ffn) return;
    const float *row = y + (size_t)(T - 1) * r->D;
    double *a = r->acc + (size_t)il * r->D;
    for (uint32_t d = 0; d < r->D; d++) a[d] += row[d];
}

/* The chat rendering of one user message (and the system prompt); with
 * --raw the text alone (a model without the chat template's tokens). */
static int render(run *r, const char *user, ds4_tokens *out, ds4_err *err) {
    if (r->o->raw) return ds4_tokenize_text(r->tk, user, strlen(user), out, err);
    json_t *msgs = json_array();
    if (r->o->system && *r->o->system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", r->o->system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", user));
    ds4_chat_opts co = {.think = r->o->think ? DS4_THINK_HIGH : DS4_THINK_OFF};
    ds4_rendered rd = {0};
    int rc = ds4_chat_render(msgs, &co, &rd, err);
    if (rc == 0) rc = ds4_tokenize_rendered(r->tk, &rd, out, err);
    ds4_rendered_free(&rd);
    json_decref(msgs);
    return rc;
}

/* One line of progress on stderr: "what  [#####.....] i/n". */
static void progress(const char *what, size_t i, size_t n) {
    if (!isatty(STDERR_FILENO)) {
        if (i == n) fprintf(stderr, "ds4-direction: %s: %zu/%zu\n", what, i, n);
        return;
    }
    char bar[31];
    size_t fill = n ? i * 30 / n : 30;
    for (size_t k = 0; k < 30; k++) bar[k] = k < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r%-24s [%s] %zu/%zu\033[K%s", what, bar, i, n, i == n ? "\n" : "");
    fflush(stderr);
}

/* Prefill the prompt's tokens but the last, then the last alone with the
 * observer recording: its activations are added to r->acc. */
static int capture_one(run *r, const char *text, ds4_err *err) {
    ds4_tokens t = {0};
    int rc = render(r, text, &t, err);
    if (rc == 0 && t.n + 1 >= ds4_session_ctx(r->s))
        rc = ds4_err_set(err, DS4_ERANGE, "%zu tokens do not fit the context of %u (--ctx)", t.n,
                         ds4_session_ctx(r->s));
    if (rc == 0) rc = ds4_session_sync(r->s, t.ids, (uint32_t)t.n - 1, NULL, NULL, err);
    if (rc == 0) {
        r->recording = true;
        rc = ds4_session_append(r->s, t.ids + t.n - 1, 1, NULL, NULL, err);
        r->recording = false;
    }
    ds4_tokens_free(&t);
    return rc;
}

/* The mean last-token activation of every prompt of a set (L x D doubles,
 * into mean); with per (n x L x D), each prompt's own too. */
static int capture_set(run *r, const char *what, const prompts *p, double *mean, double *per, ds4_err *err) {
    size_t LD = (size_t)r->L * r->D;
    memset(mean, 0, LD * sizeof(double));
    for (size_t i = 0; i < p->n; i++) {
        progress(what, i, p->n);
        memset(r->acc, 0, LD * sizeof(double));
        if (capture_one(r, p->v[i], err)) return ds4_err_prefix(err, "%s prompt %zu", what, i + 1);
        for (size_t k = 0; k < LD; k++) mean[k] += r->acc[k] / (double)p->n;
        if (per) memcpy(per + i * LD, r->acc, LD * sizeof(double));
    }
    progress(what, p->n, p->n);
    return 0;
}

static double dot(const double *a, const double *b, uint32_t n) {
    double s = 0;
    for (uint32_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* v <- v / |v| (zero stays zero); returns the norm. */
static double normalise(double *v, uint32_t n) {
    double norm = sqrt(dot(v, v, n));
    if (norm > 0)
        for (uint32_t i = 0; i < n; i++) v[i] /= norm;
    return norm;
}

static int write_metadata(const run *r, const char *f32, const prompts *g, const prompts *b, const prompts *c,
                          ds4_err *err) {
    size_t n = strlen(f32);
    char *path = malloc(n + 6);
    if (!path) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    size_t stem = n > 4 && !strcmp(f32 + n - 4, ".f32") ? n - 4 : n;
    snprintf(path, n + 6, "%.*s.json", (int)stem, f32);
    const opts *o = r->o;
    json_t *j = json_pack(
        "{s:s,s:[i,i],s:s,s:s,s:s,s:s,s:s?,s:i,s:i,s:i,s:b,s:s?}", "format", "ds4-directional-steering-v1", "shape",
        (int)r->L, (int)r->D, "component", r->ffn ? "ffn_out" : "attn_out", "thinking",
        o->raw     ? "raw"
        : o->think ? "think"
                   : "nothink",
        "good_file", o->good, "bad_file", o->bad, "control_file", o->control, "good_prompts", (int)g->n, "bad_prompts",
        (int)b->n, "control_prompts", c ? (int)c->n : 0, "pair_normalize", o->pair_normalize, "system", o->system);
    json_object_set_new(j, "flags",
                        json_string(r->ffn ? "--dir-steering-ffn 1" : "--dir-steering-ffn 0 --dir-steering-attn 1"));
    char *text = json_dumps(j, JSON_INDENT(2));
    FILE *f = text ? fopen(path, "w") : NULL;
    bool ok = f && fprintf(f, "%s\n", text) > 0;
    if (f && fclose(f) != 0) ok = false;
    free(text);
    int rc = ok ? 0 : ds4_err_set(err, DS4_EIO, "cannot write %s", path);
    if (rc == 0) fprintf(stderr, "ds4-direction: wrote %s\n", path);
    json_decref(j);
    free(path);
    return rc;
}

static int build(run *r, ds4_err *err) {
    const opts *o = r->o;
    prompts g = {0}, b = {0}, c = {0};
    size_t LD = (size_t)r->L * r->D;
    double *mg = NULL, *mb = NULL, *mc = NULL, *pg = NULL, *pb = NULL;
    float *out = NULL;
    int rc = -1;
    if (read_prompts(o->good, &g, err) || read_prompts(o->bad, &b, err) ||
        (o->control && read_prompts(o->control, &c, err)))
        goto done;
    if (o->pair_normalize && g.n != b.n) {
        ds4_err_set(err, DS4_EINVAL, "--pair-normalize pairs the prompts: %s has %zu, %s %zu", o->good, g.n, o->bad,
                    b.n);
        goto done;
    }
    mg = calloc(LD, sizeof(double));
    mb = calloc(LD, sizeof(double));
    mc = calloc(LD, sizeof(double));
    out = malloc(LD * sizeof(float));
    if (o->pair_normalize) {
        pg = malloc(g.n * LD * sizeof(double));
        pb = malloc(b.n * LD * sizeof(double));
    }
    if (!mg || !mb || !mc || !out || (o->pair_normalize && (!pg || !pb))) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    if (capture_set(r, "good prompts", &g, mg, pg, err) || capture_set(r, "bad prompts", &b, mb, pb, err) ||
        (o->control && capture_set(r, "control prompts", &c, mc, NULL, err)))
        goto done;
    uint32_t zero = 0;
    for (uint32_t il = 0; il < r->L; il++) {
        double *v = mg + (size_t)il * r->D; /* the direction, in place */
        if (o->pair_normalize) {
            memset(v, 0, r->D * sizeof(double));
            for (size_t i = 0; i < g.n; i++) {
                double *d = pg + i * LD + (size_t)il * r->D;
                const double *e = pb + i * LD + (size_t)il * r->D;
                for (uint32_t k = 0; k < r->D; k++) d[k] -= e[k];
                normalise(d, r->D);
                for (uint32_t k = 0; k < r->D; k++) v[k] += d[k] / (double)g.n;
            }
        } else {
            for (uint32_t k = 0; k < r->D; k++) v[k] -= mb[(size_t)il * r->D + k];
        }
        if (o->control) {
            double *m = mc + (size_t)il * r->D;
            if (normalise(m, r->D) > 0) {
                double p = dot(v, m, r->D);
                for (uint32_t k = 0; k < r->D; k++) v[k] -= p * m[k];
            }
        }
        /* a layer where the sets do not differ gets a zero row: left alone */
        if (normalise(v, r->D) <= 1e-12) {
            memset(v, 0, r->D * sizeof(double));
            zero++;
        }
        for (uint32_t k = 0; k < r->D; k++) out[(size_t)il * r->D + k] = (float)v[k];
    }
    ds4_steering *check = ds4_steering_from(out, r->L, r->D, err);
    if (!check) goto done;
    ds4_steering_free(check);
    if (ds4_steering_write(o->out, out, r->L, r->D, err)) goto done;
    fprintf(stderr, "ds4-direction: wrote %s (%u x %u, %s; %u layer%s without a difference left zero)\n", o->out, r->L,
            r->D, r->ffn ? "after the FFN output" : "after the attention output", zero, ds4_plural(zero));
    rc = write_metadata(r, o->out, &g, &b, o->control ? &c : NULL, err);
done:
    prompts_free(&g);
    prompts_free(&b);
    prompts_free(&c);
    free(mg);
    free(mb);
    free(mc);
    free(pg);
    free(pb);
    free(out);
    return rc;
}

/* ------------------------------------------------------------ sweep */

/* Mean NLL per token of `cont` after the rendered prompt (nats), and its
 * token count. */
static int continuation_nll(run *r, const char *prompt, const char *cont, double *nll, size_t *n_tok, ds4_err *err) {
    ds4_tokens p = {0}, c = {0};
    float *lg = NULL;
    int rc = render(r, prompt, &p, err);
    if (rc == 0) rc = ds4_tokenize_text(r->tk, cont, strlen(cont), &c, err);
    if (rc == 0 && p.n + c.n >= ds4_session_ctx(r->s))
        rc = ds4_err_set(err, DS4_ERANGE, "%zu + %zu tokens do not fit the context of %u (--ctx)", p.n, c.n,
                         ds4_session_ctx(r->s));
    uint32_t V = r->e->w->cfg.n_vocab;
    if (rc == 0 && !(lg = malloc(c.n * (size_t)V * sizeof(float)))) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (rc == 0) rc = ds4_session_sync(r->s, p.ids, (uint32_t)p.n, NULL, NULL, err);
    if (rc == 0) {
        /* the row before token i: the logits after the prompt, then after c[i - 1] */
        memcpy(lg, ds4_session_logits(r->s), V * sizeof(float));
        if (c.n > 1) rc = ds4_session_append_logits(r->s, c.ids, (uint32_t)c.n - 1, lg + V, NULL, NULL, err);
    }
    if (rc == 0) {
        double sum = 0;
        for (size_t i = 0; i < c.n; i++) {
            const float *row = lg + i * V;
            float mx = row[0];
            for (uint32_t k = 1; k < V; k++) mx = row[k] > mx ? row[k] : mx;
            double z = 0;
            for (uint32_t k = 0; k < V; k++) z += exp((double)row[k] - mx);
            sum += log(z) + mx - row[c.ids[i]];
        }
        *nll = sum / (double)c.n;
        *n_tok = c.n;
    }
    free(lg);
    ds4_tokens_free(&p);
    ds4_tokens_free(&c);
    return rc;
}

static int parse_scales(const char *s, float *out, int *n, ds4_err *err) {
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || (*end && *end != ','))
            return ds4_err_set(err, DS4_EINVAL, "--scales %s: not a comma-separated list of numbers", s);
        if (ds4_steer_scale_check(v, "--scales", err)) return -1;
        if (*n == MAX_SCALES) return ds4_err_set(err, DS4_EINVAL, "--scales: at most %d", MAX_SCALES);
        out[(*n)++] = (float)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return ds4_err_set(err, DS4_EINVAL, "--scales: empty");
    return 0;
}

static int sweep(run *r, const float *scales, int n_scales, ds4_err *err) {
    eval_set e = {.path = r->o->eval};
    int rc = -1;
    if (each_line(r->o->eval, eval_line, &e, err)) goto done;
    if (e.prompt.n == 0) {
        ds4_err_set(err, DS4_EFORMAT, "%s: no items", r->o->eval);
        goto done;
    }
    printf("# %s: %zu items, steering %s; mean NLL per token (nats)\n", r->o->eval, e.prompt.n,
           r->ffn ? "after the FFN output (--dir-steering-ffn)" : "after the attention output (--dir-steering-attn)");
    printf("%8s %10s %10s %12s\n", "scale", "nll_good", "nll_bad", "bad-good");
    for (int k = 0; k < n_scales; k++) {
        if (ds4_session_set_steering(r->s, r->ffn ? scales[k] : 0.0f, r->ffn ? 0.0f : scales[k], err)) goto done;
        double sg = 0, sb = 0;
        char what[48];
        snprintf(what, sizeof(what), "scale %g", scales[k]);
        for (size_t i = 0; i < e.prompt.n; i++) {
            progress(what, i, e.prompt.n);
            double g, b;
            size_t ng, nb;
            if (continuation_nll(r, e.prompt.v[i], e.good.v[i], &g, &ng, err) ||
                continuation_nll(r, e.prompt.v[i], e.bad.v[i], &b, &nb, err)) {
                ds4_err_prefix(err, "%s item %zu", r->o->eval, i + 1);
                goto done;
            }
            sg += g;
            sb += b;
        }
        progress(what, e.prompt.n, e.prompt.n);
        size_t n = e.prompt.n;
        printf("%8g %10.4f %10.4f %12.4f\n", scales[k], sg / n, sb / n, (sb - sg) / n);
        fflush(stdout);
    }
    rc = 0;
done:
    prompts_free(&e.prompt);
    prompts_free(&e.good);
    prompts_free(&e.bad);
    return rc;
}

/* ------------------------------------------------------------ main */

static const char ABOUT[] =
    "Build directional-steering vectors (n_layer x n_embd f32, the --dir-steering-file format) from two\n"
    "prompt sets, or sweep steering scales over an evaluation set (docs/STEERING.md).";

static const char NOTES[] =
    "prompt files: one prompt per line ('#' comments, blank lines skipped) or JSON lines {\"prompt\": ...}\n"
    "evaluation file (--sweep): JSON lines {\"prompt\": ..., \"good\": ..., \"bad\": ...}\n"
    "the direction of each layer is normalise(mean(good) - mean(bad)), orthogonal to the control mean\n"
    "when --control-file is given: a positive steering scale removes it, a negative one adds more.\n\n" DS4_CLI_ENV_NOTES;

static int parse_args(int argc, char **argv, opts *o, float *scales, int *n_scales) {
    memset(o, 0, sizeof(*o));
    ds4_opt table[] = {
        DS4_CLI_MODEL(&o->model),
        DS4_CLI_CTX(&o->ctx),
        DS4_CLI_BACKEND(&o->backend, NULL),
        DS4_CLI_THREADS(&o->threads),
        DS4_CLI_NO_SIM(&o->no_sim),
        {DS4_OPT_STR("-sys, --system", "TEXT", &o->system, "You are a helpful assistant.",
                     "system prompt of every rendered prompt; \"\" for none")},
        {DS4_OPT_FLAG("--think", &o->think, "render the assistant turn opened for thinking (default: without)")},
        {DS4_OPT_FLAG("--raw", &o->raw, "no chat template: prompts are tokenized as they are")},
        {DS4_OPT_CHOICE("--component", "WHERE", &o->component, "ffn|attn", "ffn",
                        "the steering point: after the FFN output or after the attention output")},

        {DS4_OPT_SECTION("building (the default mode):")},
        {DS4_OPT_STR("--good-file", "FILE", &o->good, NULL, "prompts of the behaviour the direction points to"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--bad-file", "FILE", &o->bad, NULL, "contrasting prompts"), .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--control-file", "FILE", &o->control, NULL,
                     "prompts whose mean activation the direction is made orthogonal to"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_FLAG("--pair-normalize", &o->pair_normalize,
                      "average the unit differences of prompt pairs (line i of each file) instead of "
                      "subtracting the means")},
        {DS4_OPT_STR("-o, --out", "FILE", &o->out, NULL, "the direction file (and FILE.json beside it)"),
         .flags = DS4_OPT_OUT},

        {DS4_OPT_SECTION("sweeping:")},
        {DS4_OPT_FLAG("--sweep", &o->sweep, "score a grid of scales instead of building")},
        {DS4_OPT_STR("--direction", "FILE", &o->direction, NULL, "the direction file to sweep"), .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--eval-file", "FILE", &o->eval, NULL, "JSON lines {\"prompt\", \"good\", \"bad\"}"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--scales", "LIST", &o->scales, DEFAULT_SCALES, "comma-separated scales")},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-direction",
                   .usage = "-m MODEL --good-file G --bad-file B -o OUT.f32 | --sweep ...",
                   .about = ABOUT,
                   .opts = table,
                   .notes = NOTES,
                   .refused = ds4_option_not_supported};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (ds4_cli_check_backend(&cli, o->backend) != 0) return 2;
    if (o->raw && o->think) return ds4_cli_usage(&cli, "--think renders a chat turn: not with --raw");
    if (o->sweep) {
        if (!o->direction || !o->eval)
            return ds4_cli_usage(&cli, "--sweep needs --direction FILE and --eval-file FILE");
        if (o->good || o->bad || o->control || o->out || o->pair_normalize)
            return ds4_cli_usage(&cli, "--sweep takes no building options (--good-file, --bad-file, --control-file, "
                                       "--pair-normalize, -o)");
        ds4_err err = {0};
        if (parse_scales(o->scales, scales, n_scales, &err)) return ds4_cli_usage(&cli, "%s", err.msg);
    } else {
        if (!o->good || !o->bad || !o->out) return ds4_cli_usage(&cli, "building needs --good-file, --bad-file and -o");
        if (o->direction || o->eval) return ds4_cli_usage(&cli, "--direction and --eval-file are for --sweep");
    }
    return -1;
}

int main(int argc, char **argv) {
    opts o;
    float scales[MAX_SCALES];
    int n_scales = 0;
    int prc = parse_args(argc, argv, &o, scales, &n_scales);
    if (prc >= 0) return prc;
    int lrc = ds4_startup_lock("ds4-direction");
    if (lrc) return lrc;
    ds4_err err = {0};
    run r = {.o = &o, .ffn = !strcmp(o.component, "ffn")};
    ds4_engine_opts eo = {.model_path = o.model,
                          .backend = o.backend,
                          .n_threads = o.threads,
                          .no_sim = o.no_sim,
                          .need_vocab = true,
                          .steer_path = o.sweep ? o.direction : NULL};
    if (!o.sweep) {
        eo.act_observer = observe;
        eo.act_ctx = &r;
    }
    int rc = 1;
    if (ds4_model_file_check(o.model, &err) || !(r.e = ds4_engine_open(&eo, &err))) goto done;
    r.L = r.e->w->cfg.n_layer;
    r.D = r.e->w->cfg.n_embd;
    ds4_startup_print_memory("ds4-direction", r.e->backend_name, r.e->w, o.ctx);
    if (!(r.tk = ds4_tokenizer_new(r.e->vocab, &err)) || !(r.s = ds4_session_new(r.e, o.ctx, &err))) goto done;
    if (!o.sweep && !(r.acc = calloc((size_t)r.L * r.D, sizeof(double)))) {
        ds4_err_set(&err, DS4_ENOMEM, "out of memory");
        goto done;
    }
    rc = (o.sweep ? sweep(&r, scales, n_scales, &err) : build(&r, &err)) ? 1 : 0;
done:
    if (rc) fprintf(stderr, "ds4-direction: %s\n", err.msg);
    free(r.acc);
    ds4_session_free(r.s);
    ds4_tokenizer_free(r.tk);
    ds4_engine_close(r.e);
    return rc;
}
