/*
 * options.c - parsing and checking the ds4 command line (see options.h).
 *
 * Hand-written rather than getopt: ds4's flag set includes "-sys", a
 * single-dash long option, and users know these spellings.  "--name=value"
 * is accepted as well as "--name value".
 */
#include "options.h"

#include "base/numparse.h"
#include "engine/startup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: ds4 [options]              interactive chat (no prompt given)\n"
            "       ds4 -p TEXT [options]      one-shot: answer TEXT and exit\n"
            "\n"
            "input and model:\n"
            "  -p, --prompt TEXT        user message (a text starting with <｜begin▁of▁sentence｜> is\n"
            "                           taken as an already rendered transcript)\n"
            "  --prompt-file FILE       read the prompt from FILE\n"
            "  -sys, --system TEXT      system prompt; \"\" for none (default \"" CLI_DEFAULT_SYSTEM "\")\n"
            "  -m, --model FILE         GGUF model (default " CLI_DEFAULT_MODEL ")\n"
            "  -c, --ctx N              context size in tokens, 1..%u (default %u)\n"
            "  -n, --tokens N           max generated tokens per turn (default %u)\n"
            "\n"
            "sampling:\n"
            "  --temp F                 temperature 0..100, 0 = greedy (default 1)\n"
            "  --top-p F                nucleus mass 0..1 (default 1)\n"
            "  --top-k N                keep the N most likely tokens, 0 = off (capped at %d; default 0)\n"
            "  --min-p F                keep tokens with p >= F * p(top), 0..1 (default 0.05)\n"
            "  --seed N                 random seed, nonzero (default: from time and pid)\n"
            "\n"
            "thinking:\n"
            "  --think                  reason before answering (default)\n"
            "  --think-max              maximum reasoning effort (needs --ctx >= %u)\n"
            "  --nothink                answer directly\n"
            "\n"
            "runtime:\n"
            "  --backend NAME, --cpu, --cuda   compute backend (default: the build's, %s)\n"
            "  -t, --threads N          CPU threads (default: $DS4_THREADS or all CPUs)\n"
            "  --warm-weights           read the whole model file in before generating (CPU backend:\n"
            "                           the first tokens do not wait for the disk)\n"
            "  --quality                accepted for ds4 compatibility: this engine's kernels have one\n"
            "                           precision, there is no approximate fast path to turn off\n"

            "\n"
            "diagnostics:\n"
            "  --dump-tokens            print the prompt's token ids and pieces (special tokens\n"
            "                           recognised), then exit; loads no weights\n"
            "  --dump-logprobs FILE     greedy continuation of the prompt; writes every step's token\n"
            "                           and top alternatives with logits and log-probabilities (JSON)\n"
            "  --logprobs-top-k N       alternatives per step, 1..%u (default 20)\n"
            "  --perplexity-file FILE   teacher-forced NLL of a raw text (no chat template): the first\n"
            "                           32 tokens are context, up to -n tokens are scored\n"
            "  --inspect                print the model's configuration, tensors and memory, then exit\n"
            "\n"
            "importance matrix (for ds4-quantize --imatrix; runs on the CPU backend):\n"
            "  --imatrix-dataset FILE   prompts separated by '===== DS4_IMATRIX_PROMPT' lines\n"
            "  --imatrix-out FILE       collect routed-expert statistics, write a legacy .dat\n"
            "  --imatrix-max-prompts N  stop after N prompts (default: all)\n"
            "  --imatrix-max-tokens N   stop after N prompt tokens (default: all)\n"
            "\n"
            "environment:\n"
            "  DS4_THREADS              CPU threads when -t is not given\n"
            "  DS4_LOCK_FILE            one model process runs per machine; this is its lock file\n"
            "                           (default /tmp/ds4.lock): another file allows a second process\n"
            "\n"
            "interactive commands: /help /think /think-max /nothink /ctx N /read FILE /quit\n",
            CLI_MAX_CTX, CLI_DEFAULT_CTX, CLI_DEFAULT_TOKENS, DS4_TOP_K_MAX, DS4_THINK_MAX_MIN_CTX,
#ifdef DS4_CUDA
            "cuda",
#else
            "cpu",
#endif
            CLI_LOGPROBS_TOP_K_MAX);
}

static int bad(const char *opt, const char *val, const char *want) {
    fprintf(stderr, "ds4: %s %s: %s (see ds4 --help)\n", opt, val ? val : "", want);
    return 2;
}

char *cli_read_file(const char *path, size_t *len, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int failed = ferror(f);
    fclose(f);
    if (!buf) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory reading %s", path);
        return NULL;
    }
    if (failed) {
        free(buf);
        ds4_err_set(err, DS4_EIO, "reading %s failed", path);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

/* Options that take a value, for "--name=value" splitting and lookups. */
static const char *const VALUED[] = {
    "-p", "--prompt", "--prompt-file", "-sys", "--system", "-m", "--model", "-c", "--ctx", "-n", "--tokens",
    "--temp", "--top-p", "--top-k", "--min-p", "--seed", "--backend", "-t", "--threads", "--dump-logprobs",
    "--logprobs-top-k", "--perplexity-file", "--imatrix-dataset", "--imatrix-out", "--imatrix-max-prompts",
    "--imatrix-max-tokens", NULL,
};

static bool takes_value(const char *name) {
    for (int i = 0; VALUED[i]; i++)
        if (!strcmp(VALUED[i], name)) return true;
    return false;
}

static bool is(const char *a, const char *s1, const char *s2) { return !strcmp(a, s1) || (s2 && !strcmp(a, s2)); }

/* Set the mode, refusing a second diagnostic. */
static int set_mode(cli_opts *o, cli_mode m, const char *opt) {
    if (o->mode != CLI_CHAT && o->mode != m)
        return bad(opt, NULL, "only one of --dump-tokens, --dump-logprobs, --perplexity-file, --inspect, --imatrix-out");
    o->mode = m;
    return 0;
}

/* One option with its value (NULL for flags). */
static int apply(cli_opts *o, const char *a, const char *v, const char **prompt_file) {
    uint64_t u;
    if (is(a, "-p", "--prompt")) {
        if (o->prompt || *prompt_file) return bad(a, NULL, "only one prompt (-p or --prompt-file)");
        if (!(o->prompt = strdup(v))) return bad(a, NULL, "out of memory");
        o->prompt_len = strlen(v);
    } else if (is(a, "--prompt-file", NULL)) {
        if (o->prompt || *prompt_file) return bad(a, NULL, "only one prompt (-p or --prompt-file)");
        *prompt_file = v;
    } else if (is(a, "-sys", "--system")) {
        o->system = v;
    } else if (is(a, "-m", "--model")) {
        o->model = v;
    } else if (is(a, "-c", "--ctx")) {
        if (ds4_parse_u64(v, 1, CLI_MAX_CTX, &u)) return bad(a, v, "must be an integer in 1..1048576");
        o->ctx = (uint32_t)u;
    } else if (is(a, "-n", "--tokens")) {
        if (ds4_parse_u64(v, 1, UINT32_MAX, &u)) return bad(a, v, "must be a positive integer");
        o->n_tokens = (uint32_t)u;
        o->n_tokens_given = true;
    } else if (is(a, "--temp", NULL)) {
        if (ds4_parse_float(v, 0.0f, 100.0f, &o->sampling.temperature)) return bad(a, v, "must be a number in 0..100");
    } else if (is(a, "--top-p", NULL)) {
        if (ds4_parse_float(v, 0.0f, 1.0f, &o->sampling.top_p)) return bad(a, v, "must be a number in 0..1");
    } else if (is(a, "--min-p", NULL)) {
        if (ds4_parse_float(v, 0.0f, 1.0f, &o->sampling.min_p)) return bad(a, v, "must be a number in 0..1");
    } else if (is(a, "--top-k", NULL)) {
        if (ds4_parse_u64(v, 0, INT32_MAX, &u)) return bad(a, v, "must be an integer >= 0");
        o->sampling.top_k = u > DS4_TOP_K_MAX ? DS4_TOP_K_MAX : (int)u;
    } else if (is(a, "--seed", NULL)) {
        if (ds4_parse_u64(v, 1, UINT64_MAX, &u)) return bad(a, v, "must be a nonzero 64-bit integer");
        o->sampling.seed = u;
    } else if (is(a, "--think", NULL)) {
        o->think = DS4_THINK_HIGH;
    } else if (is(a, "--think-max", NULL)) {
        o->think = DS4_THINK_MAX;
    } else if (is(a, "--nothink", NULL)) {
        o->think = DS4_THINK_OFF;
    } else if (is(a, "--backend", NULL)) {
        if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "metal")) return bad(a, v, "must be cpu, cuda or metal");
        o->backend = v;
    } else if (is(a, "--cpu", "--cuda") || is(a, "--metal", NULL)) {
        o->backend = a + 2;
    } else if (is(a, "-t", "--threads")) {
        if (ds4_parse_u64(v, 1, 4096, &u)) return bad(a, v, "must be an integer in 1..4096");
        o->threads = (int)u;
    } else if (is(a, "--warm-weights", NULL)) {
        o->warm_weights = true;
    } else if (is(a, "--quality", NULL)) {
        o->quality = true;
    } else if (is(a, "--dump-tokens", NULL)) {
        return set_mode(o, CLI_DUMP_TOKENS, a);
    } else if (is(a, "--dump-logprobs", NULL)) {
        o->logprobs_out = v;
        return set_mode(o, CLI_DUMP_LOGPROBS, a);
    } else if (is(a, "--logprobs-top-k", NULL)) {
        if (ds4_parse_u64(v, 1, UINT32_MAX, &u)) return bad(a, v, "must be a positive integer");
        o->logprobs_top_k = u > CLI_LOGPROBS_TOP_K_MAX ? CLI_LOGPROBS_TOP_K_MAX : (uint32_t)u;
    } else if (is(a, "--perplexity-file", NULL)) {
        o->perplexity_file = v;
        return set_mode(o, CLI_PERPLEXITY, a);
    } else if (is(a, "--imatrix-dataset", NULL)) {
        o->imatrix_dataset = v;
    } else if (is(a, "--imatrix-out", NULL)) {
        o->imatrix_out = v;
        return set_mode(o, CLI_IMATRIX, a);
    } else if (is(a, "--imatrix-max-prompts", NULL)) {
        if (ds4_parse_u64(v, 1, UINT64_MAX, &o->imatrix_max_prompts)) return bad(a, v, "must be a positive integer");
    } else if (is(a, "--imatrix-max-tokens", NULL)) {
        if (ds4_parse_u64(v, 1, UINT64_MAX, &o->imatrix_max_tokens)) return bad(a, v, "must be a positive integer");
    } else if (is(a, "--inspect", NULL)) {
        return set_mode(o, CLI_INSPECT, a);
    } else if (is(a, "--server", NULL)) {
        return bad(a, NULL, "the server is a separate program: use ds4-server");
    } else if (ds4_option_not_supported(a)) {
        return bad(a, NULL, ds4_option_not_supported(a));
    } else {
        return bad(a, NULL, "unknown option");
    }
    return 0;
}

/* Combinations that cannot work, and the prompt file. */
static int finish(cli_opts *o, const char *prompt_file) {
    if (prompt_file) {
        ds4_err err = {0};
        if (!(o->prompt = cli_read_file(prompt_file, &o->prompt_len, &err))) {
            fprintf(stderr, "ds4: --prompt-file: %s\n", err.msg);
            return 2;
        }
    }
    if ((o->mode == CLI_DUMP_TOKENS || o->mode == CLI_DUMP_LOGPROBS) && !o->prompt)
        return bad(o->mode == CLI_DUMP_TOKENS ? "--dump-tokens" : "--dump-logprobs", NULL,
                   "needs a prompt (-p or --prompt-file)");
    if ((o->mode == CLI_PERPLEXITY || o->mode == CLI_INSPECT || o->mode == CLI_IMATRIX) && o->prompt)
        return bad(o->mode == CLI_INSPECT ? "--inspect" : o->mode == CLI_IMATRIX ? "--imatrix-out" : "--perplexity-file",
                   NULL, "takes no prompt");
    if (o->mode == CLI_IMATRIX && !o->imatrix_dataset) return bad("--imatrix-out", NULL, "needs --imatrix-dataset FILE");
    if (o->mode != CLI_IMATRIX && (o->imatrix_dataset || o->imatrix_max_prompts || o->imatrix_max_tokens))
        return bad(o->imatrix_dataset ? "--imatrix-dataset" : o->imatrix_max_prompts ? "--imatrix-max-prompts"
                                                                                     : "--imatrix-max-tokens",
                   NULL, "needs --imatrix-out FILE");
    if (o->backend && !strcmp(o->backend, "metal")) return bad("--backend", "metal", "Metal is not supported by this engine (use cpu or cuda)");
    if (o->quality)
        fprintf(stderr, "ds4: --quality: nothing to change, this engine's kernels have one precision\n");
    if (o->mode == CLI_IMATRIX) {
        /* Only the CPU backend reports each routed expert's inputs. */
        if (o->backend && strcmp(o->backend, "cpu"))
            fprintf(stderr, "ds4: importance matrix collection runs on the CPU backend, not %s\n", o->backend);
        o->backend = "cpu";
    }
    return 0;
}

int cli_parse(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof(*o));
    o->model = CLI_DEFAULT_MODEL;
    o->system = CLI_DEFAULT_SYSTEM;
    o->ctx = CLI_DEFAULT_CTX;
    o->n_tokens = CLI_DEFAULT_TOKENS;
    o->think = DS4_THINK_HIGH;
    o->logprobs_top_k = 20;
    ds4_sampler_defaults(&o->sampling);
    const char *prompt_file = NULL;
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *a = argv[i], *v = NULL;
        if (is(a, "-h", "--help")) {
            usage(stdout);
            return 1;
        }
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof(name)) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = 0;
            if (ds4_option_not_supported(name)) return bad(name, NULL, ds4_option_not_supported(name));
            if (!takes_value(name)) return bad(name, NULL, "takes no value");
            a = name;
            v = eq + 1;
        } else if (takes_value(a)) {
            if (i + 1 >= argc) return bad(a, NULL, "needs a value");
            v = argv[++i];
        } else if (a[0] != '-') {
            return bad(a, NULL, "unexpected argument (the prompt goes after -p)");
        }
        int rc = apply(o, a, v, &prompt_file);
        if (rc) return rc;
    }
    return finish(o, prompt_file);
}

void cli_opts_free(cli_opts *o) {
    free(o->prompt);
    o->prompt = NULL;
}
