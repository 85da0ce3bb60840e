/*
 * options.c - the ds4-agent option table and its parser (see options.h).
 *
 * Every option is one row: spellings, what it sets, its range and its help
 * line.  "--name=value" works as well as "--name value"; "-sys" is a
 * single-dash long option because ds4 users know it that way.  Options of
 * ds4's agent that this engine does not have (MTP, steering) are refused
 * with the reason (engine/startup.h) rather than accepted and ignored.
 */
#include "options.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/numparse.h"
#include "engine/startup.h"

typedef enum opt_kind {
    OPT_STR,      /* const char * */
    OPT_U32,      /* uint32_t in [lo, hi] */
    OPT_U64,      /* uint64_t in [lo, hi] */
    OPT_FLOAT,    /* float in [lo, hi] */
    OPT_TRUE,     /* bool set to true */
    OPT_INT_SET,  /* int set to `lo` */
    OPT_BACKEND,  /* --backend NAME / --cpu / --cuda */
    OPT_ALLOW,    /* comma list of bash, write, edit */
    OPT_API,      /* openai | anthropic */
} opt_kind;

typedef struct opt_def {
    const char *name, *alias;
    opt_kind kind;
    size_t off;
    double lo, hi;
    const char *arg;   /* value placeholder in the help, NULL for flags */
    const char *help;
} opt_def;

#define F(field) offsetof(agent_opts, field)

static const opt_def OPTIONS[] = {
    {"--model", "-m", OPT_STR, F(model), 0, 0, "FILE", "GGUF model (default " AGENT_DEFAULT_MODEL ")"},
    {"--ctx", "-c", OPT_U32, F(ctx), 1024, AGENT_MAX_CTX, "N", "context size in tokens (default 100000)"},
    {"--tokens", "-n", OPT_U32, F(n_tokens), 1, UINT32_MAX, "N", "max generated tokens per assistant round (default 50000)"},
    {"--prompt", "-p", OPT_STR, F(prompt), 0, 0, "TEXT", "submit TEXT as the first prompt after startup"},
    {"--system", "-sys", OPT_STR, F(system), 0, 0, "TEXT",
     "extra system text after the built-in instructions (plain text; \"\" for none)"},
    {"--trace", NULL, OPT_STR, F(trace), 0, 0, "FILE", "write a prompt/token/DSML/tool trace with timestamps"},
    {"--temp", NULL, OPT_FLOAT, F(sampling.temperature), 0, 100, "F", "temperature, 0 = greedy (default 1)"},
    {"--top-p", NULL, OPT_FLOAT, F(sampling.top_p), 0, 1, "F", "nucleus mass (default 1)"},
    {"--top-k", NULL, OPT_U32, F(sampling.top_k), 0, DS4_TOP_K_MAX, "N", "keep the N most likely tokens, 0 = off (default 0)"},
    {"--min-p", NULL, OPT_FLOAT, F(sampling.min_p), 0, 1, "F", "keep tokens with p >= F * p(top) (default 0.05)"},
    {"--seed", NULL, OPT_U64, F(sampling.seed), 1, (double)UINT64_MAX, "N", "random seed (default: time and pid)"},
    {"--think", NULL, OPT_INT_SET, F(think), DS4_THINK_HIGH, 0, NULL, "reason before answering (default)"},
    {"--think-max", NULL, OPT_INT_SET, F(think), DS4_THINK_MAX, 0, NULL, "maximum reasoning effort (needs --ctx >= 393216)"},
    {"--nothink", NULL, OPT_INT_SET, F(think), DS4_THINK_OFF, 0, NULL, "answer directly"},
    {"--allow", NULL, OPT_ALLOW, F(allow), 0, 0, "LIST",
     "run these without asking: comma list of bash, write, edit (default: ask each time)"},
    {"--yolo", NULL, OPT_TRUE, F(yolo), 0, 0, NULL, "run every bash/write/edit without asking"},
    {"--root", NULL, OPT_STR, F(root), 0, 0, "DIR", "file tools stay inside DIR; bash starts there (default: .)"},
    {"--kv-dir", NULL, OPT_STR, F(kv_dir), 0, 0, "DIR", "where sessions are kept (default ~/.ds4/kvcache)"},
    {"--server", NULL, OPT_STR, F(server), 0, 0, "URL", "drive a remote ds4-server (http://host:port) instead of a local model"},
    {"--api", NULL, OPT_API, F(api), 0, 0, "NAME", "with --server: openai (default) or anthropic"},
    {"--api-key", NULL, OPT_STR, F(api_key), 0, 0, "KEY", "with --server: the server's key (default $DS4_API_KEY)"},
    {"--backend", NULL, OPT_BACKEND, F(backend), 0, 0, "NAME", "compute backend: cpu or cuda (default: the build's)"},
    {"--cpu", NULL, OPT_BACKEND, F(backend), 0, 0, NULL, "the CPU backend"},
    {"--cuda", NULL, OPT_BACKEND, F(backend), 0, 0, NULL, "the CUDA backend"},
    {"--threads", "-t", OPT_U32, F(threads), 1, 4096, "N", "CPU threads (default: all CPUs)"},
    {"--warm-weights", NULL, OPT_TRUE, F(warm_weights), 0, 0, NULL, "read the whole model file in before the first prompt"},
    {"--quality", NULL, OPT_TRUE, F(quality), 0, 0, NULL, "accepted for ds4 compatibility (one kernel precision here)"},
};
#define N_OPTIONS (sizeof(OPTIONS) / sizeof(OPTIONS[0]))

static void usage(FILE *f) {
    fputs("usage: ds4-agent [options]      a coding agent in the terminal\n\n", f);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_def *d = &OPTIONS[i];
        char spell[64];
        snprintf(spell, sizeof(spell), "%s%s%s%s%s", d->alias ? d->alias : "", d->alias ? ", " : "", d->name,
                 d->arg ? " " : "", d->arg ? d->arg : "");
        fprintf(f, "  %-24s %s\n", spell, d->help);
    }
    fputs("\ncommands: /help /save /list /switch ID /history [N] /new /quit (see docs/AGENT.md)\n"
          "keys: Enter while busy queues the prompt, ESC interrupts and sends it, Ctrl+X takes it\n"
          "back, Ctrl+C interrupts or clears the line, Ctrl+D on an empty line leaves.\n",
          f);
}

static int bad(const char *opt, const char *val, const char *want) {
    fprintf(stderr, "ds4-agent: %s%s%s: %s (see ds4-agent --help)\n", opt, val ? " " : "", val ? val : "", want);
    return 2;
}

static const opt_def *find(const char *name) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!strcmp(OPTIONS[i].name, name) || (OPTIONS[i].alias && !strcmp(OPTIONS[i].alias, name))) return &OPTIONS[i];
    return NULL;
}

static bool takes_value(const opt_def *d) { return d->arg != NULL; }

/* "bash,write" -> bits. */
static int parse_allow(const char *v, unsigned *out) {
    static const struct {
        const char *name;
        unsigned bit;
    } names[] = {{"bash", AGENT_ALLOW_BASH}, {"write", AGENT_ALLOW_WRITE}, {"edit", AGENT_ALLOW_EDIT}, {"all", AGENT_ALLOW_ALL}};
    unsigned bits = 0;
    const char *p = v;
    while (*p) {
        size_t n = strcspn(p, ",");
        bool found = false;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            if (n == strlen(names[i].name) && !strncmp(p, names[i].name, n)) {
                bits |= names[i].bit;
                found = true;
            }
        if (!found) return -1;
        p += n;
        if (*p == ',') p++;
    }
    if (!bits) return -1;
    *out |= bits;
    return 0;
}

static int apply(agent_opts *o, const opt_def *d, const char *spelled, const char *v) {
    char *base = (char *)o + d->off;
    switch (d->kind) {
    case OPT_STR:
        *(const char **)base = v;
        return 0;
    case OPT_U32: {
        uint32_t x;
        if (ds4_parse_u32(v, (uint32_t)d->lo, (uint32_t)d->hi, &x)) {
            char want[96];
            snprintf(want, sizeof(want), "must be an integer in %.0f..%.0f", d->lo, d->hi);
            return bad(spelled, v, want);
        }
        if (d->off == F(sampling.top_k)) o->sampling.top_k = (int)x;
        else *(uint32_t *)base = x;
        if (d->off == F(ctx)) o->ctx_given = true;
        return 0;
    }
    case OPT_U64:
        if (ds4_parse_u64(v, 1, UINT64_MAX, (uint64_t *)base)) return bad(spelled, v, "must be a nonzero 64-bit integer");
        return 0;
    case OPT_FLOAT:
        if (ds4_parse_float(v, (float)d->lo, (float)d->hi, (float *)base)) {
            char want[96];
            snprintf(want, sizeof(want), "must be a number in %g..%g", d->lo, d->hi);
            return bad(spelled, v, want);
        }
        return 0;
    case OPT_TRUE:
        *(bool *)base = true;
        return 0;
    case OPT_INT_SET:
        *(int *)base = (int)d->lo;
        return 0;
    case OPT_BACKEND:
        if (!v) v = d->name + 2;
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) return bad(spelled, v, "must be cpu or cuda");
        o->backend = v;
        return 0;
    case OPT_ALLOW:
        if (parse_allow(v, &o->allow)) return bad(spelled, v, "must be a comma list of bash, write, edit (or all)");
        o->allow_list = v;
        return 0;
    case OPT_API:
        if (!strcmp(v, "openai")) o->api = AGENT_API_OPENAI;
        else if (!strcmp(v, "anthropic")) o->api = AGENT_API_ANTHROPIC;
        else return bad(spelled, v, "must be openai or anthropic");
        o->api_name = v;
        return 0;
    }
    return bad(spelled, v, "internal: unknown option kind");
}

/* Combinations that cannot work. */
static int finish(agent_opts *o) {
    if (o->yolo) o->allow = AGENT_ALLOW_ALL;
    if (!o->server && (o->api_name || o->api_key))
        return bad(o->api_name ? "--api" : "--api-key", NULL, "only with --server URL");
    if (o->server && strncmp(o->server, "http://", 7) && strncmp(o->server, "https://", 8))
        return bad("--server", o->server, "must be an http:// or https:// URL");
    if (o->server && (o->backend || o->threads || o->warm_weights))
        return bad("--server", NULL, "runs no local model: --backend, --threads, --warm-weights do not apply");
    if (!o->api_key) {
        const char *k = getenv("DS4_API_KEY");
        if (k && *k) o->api_key = k;
    }
    if (o->quality) fprintf(stderr, "ds4-agent: --quality: nothing to change, this engine's kernels have one precision\n");
    return 0;
}

int agent_parse_options(int argc, char **argv, agent_opts *o) {
    memset(o, 0, sizeof(*o));
    o->model = AGENT_DEFAULT_MODEL;
    o->system = AGENT_DEFAULT_SYSTEM;
    o->ctx = AGENT_DEFAULT_CTX;
    o->n_tokens = AGENT_DEFAULT_TOKENS;
    o->think = DS4_THINK_HIGH;
    o->root = ".";
    ds4_sampler_defaults(&o->sampling);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        char name[64];
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof(name)) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = 0;
            a = name;
            v = eq + 1;
        }
        if (ds4_option_not_supported(a)) return bad(a, NULL, ds4_option_not_supported(a));
        const opt_def *d = find(a);
        if (!d) return bad(a, NULL, a[0] == '-' ? "unknown option" : "unexpected argument (a prompt goes after -p)");
        if (takes_value(d) && !v) {
            if (i + 1 >= argc) return bad(a, NULL, "needs a value");
            v = argv[++i];
        } else if (!takes_value(d) && v) {
            return bad(a, NULL, "takes no value");
        }
        int rc = apply(o, d, a, v);
        if (rc) return rc;
    }
    return finish(o);
}
