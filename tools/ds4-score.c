/*
 * ds4-score - teacher-forced quality scoring of a ds4 GGUF on reference
 * continuations (docs/TOOLCHAIN.md).
 *
 *   ds4-score MODEL MANIFEST OUT.tsv [CTX] [options]   (ds4-score --help lists them)
 *
 * MANIFEST is ds4's quality manifest: tab-separated lines
 * `ID<TAB>PROMPT<TAB>TARGET[<TAB>...]` ('#' starts a comment line; further
 * columns, such as the response file ds4's collector records, are
 * ignored).  As in ds4, PROMPT is a text file holding a user message,
 * rendered as a non-thinking chat turn without a system prompt
 * (BOS <｜User｜> text <｜Assistant｜> </think>), and TARGET a text file
 * tokenized as plain text.  With --token-ids both are files of token ids
 * instead (separated by spaces, commas or newlines), so that any rendering
 * can be scored.  A relative path is taken from the manifest's directory
 * when the file is there, else from the current directory (ds4's collector
 * writes paths as seen from where it ran).
 *
 * For each case the prompt is prefilled, then the target is fed one token
 * at a time; before each target token the model's distribution gives
 *   nll         sum over the target of -log p(token)   (nats)
 *   avg_nll     nll / target tokens
 *   first_match 1 when the argmax before the first target token is it
 *   greedy_lcp  how many leading target tokens are each the argmax
 * OUT.tsv gets one row per case in ds4's layout (columns id, prompt_tokens,
 * target_tokens, nll, avg_nll, first_match, greedy_lcp; NLLs with 9
 * decimals); stderr a summary.  Compare two runs with ds4-score-compare.
 * The backend is the build's default (cuda in CUDA builds: scoring the real
 * model on the CPU takes hours) unless --backend says otherwise.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cli.h"
#include "engine/engine.h"
#include "engine/startup.h"
#include "model/backends.h"
#include "model/weights.h"
#include "text/chat.h"
#include "text/rendered.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

typedef struct ids {
    uint32_t *v;
    uint32_t n, cap;
} ids;

static int push(ids *a, uint32_t x) {
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 256;
        uint32_t *v = realloc(a->v, cap * sizeof(*v));
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Token ids of a file, each checked against the vocabulary. */
static int read_ids(const char *path, uint32_t n_vocab, ids *out, ds4_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
    int c, rc = 0;
    unsigned long long v = 0;
    bool in_num = false;
    long pos = 0;
    while (rc == 0) {
        c = fgetc(f);
        if (c != EOF && isdigit(c)) {
            v = v * 10 + (unsigned)(c - '0');
            if (v >= n_vocab)
                rc = ds4_err_set(err, DS4_ERANGE, "%s: byte %ld: token id outside the vocabulary (%u)", path, pos,
                                 n_vocab);
            in_num = true;
        } else {
            if (in_num && push(out, (uint32_t)v) != 0) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
            in_num = false;
            v = 0;
            if (c == EOF) break;
            if (!isspace(c) && c != ',')
                rc = ds4_err_set(err, DS4_EFORMAT, "%s: byte %ld: unexpected character '%c' in a token list", path, pos,
                                 c);
        }
        pos++;
    }
    fclose(f);
    return rc;
}

/* The whole of a text file, NUL-terminated. */
static char *read_text(const char *path, size_t *len, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
        return NULL;
    }
    ds4_strbuf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) ds4_strbuf_append(&b, chunk, n);
    ds4_strbuf_putc(&b, '\0');
    int rc = ferror(f) ? ds4_err_set(err, DS4_EIO, "%s: read failed", path) : ds4_strbuf_check(&b, path, err);
    fclose(f);
    if (rc != 0) {
        ds4_strbuf_free(&b);
        return NULL;
    }
    *len = b.len - 1;
    return b.p;
}

static int take_tokens(ids *out, const ds4_tokens *t, ds4_err *err) {
    for (size_t i = 0; i < t->n; i++)
        if (push(out, (uint32_t)t->ids[i]) != 0) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return 0;
}

/* A prompt file as ds4 renders it: one user message, no system prompt,
 * thinking off. */
static int read_prompt_text(ds4_tokenizer *tk, const char *path, ids *out, ds4_err *err) {
    size_t len;
    char *text = read_text(path, &len, err);
    if (!text) return -1;
    json_t *msgs = json_pack("[{s:s, s:s%}]", "role", "user", "content", text, len);
    free(text);
    if (!msgs) return ds4_err_set(err, DS4_EFORMAT, "%s: not valid UTF-8 text", path);
    ds4_chat_opts co = {.think = DS4_THINK_OFF};
    ds4_rendered r = {0};
    ds4_tokens t = {0};
    int rc = ds4_chat_render(msgs, &co, &r, err);
    if (rc == 0) rc = ds4_tokenize_rendered(tk, &r, &t, err);
    if (rc == 0) rc = take_tokens(out, &t, err);
    if (rc != 0) ds4_err_prefix(err, "%s", path);
    ds4_tokens_free(&t);
    ds4_rendered_free(&r);
    json_decref(msgs);
    return rc;
}

/* A target file as plain text (no special tokens). */
static int read_target_text(ds4_tokenizer *tk, const char *path, ids *out, ds4_err *err) {
    size_t len;
    char *text = read_text(path, &len, err);
    if (!text) return -1;
    ds4_tokens t = {0};
    int rc = ds4_tokenize_text(tk, text, len, &t, err);
    if (rc == 0) rc = take_tokens(out, &t, err);
    else ds4_err_prefix(err, "%s", path);
    ds4_tokens_free(&t);
    free(text);
    return rc;
}

typedef struct score {
    double nll;
    int first_match;
    uint32_t lcp;
} score;

/* -log softmax(logits)[t] in double, and whether t is the argmax
 * (base/rank.h). */
static double token_nll(const float *logits, uint32_t n, uint32_t t, bool *is_argmax) {
    uint32_t best = (uint32_t)ds4_argmax(logits, (int)n);
    double m = logits[best], sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)logits[i] - m);
    *is_argmax = best == t;
    return log(sum) - ((double)logits[t] - m);
}

static int score_case(ds4_backend *b, uint32_t n_vocab, const ids *prompt, const ids *target, score *s, ds4_err *err) {
    ds4_backend_reset(b);
    memset(s, 0, sizeof(*s));
    if (ds4_backend_prefill(b, prompt->v, prompt->n, NULL, err) != 0) return -1;
    bool greedy = true;
    for (uint32_t j = 0; j < target->n; j++) {
        bool top;
        s->nll += token_nll(ds4_backend_logits(b), n_vocab, target->v[j], &top);
        if (j == 0) s->first_match = top;
        greedy = greedy && top;
        s->lcp += greedy;
        if (j + 1 < target->n && ds4_backend_decode(b, target->v[j], err) != 0) return -1;
    }
    return 0;
}

/* Path of a manifest entry: relative to the manifest's directory when the
 * file is there, else as given (from the current directory). */
static void resolve(const char *manifest, const char *p, char *out, size_t len) {
    const char *slash = strrchr(manifest, '/');
    if (p[0] == '/' || !slash) {
        snprintf(out, len, "%s", p);
        return;
    }
    snprintf(out, len, "%.*s/%s", (int)(slash - manifest), manifest, p);
    FILE *f = fopen(out, "rb");
    if (f) fclose(f);
    else snprintf(out, len, "%s", p);
}

/* How the manifest's files are read: ds4's text files (a tokenizer), or
 * token-id lists (tk NULL). */
typedef struct reader {
    ds4_tokenizer *tk;
    uint32_t n_vocab;
} reader;

static int read_case(const reader *rd, const char *path, bool is_prompt, ids *out, ds4_err *err) {
    if (!rd->tk) return read_ids(path, rd->n_vocab, out, err);
    return is_prompt ? read_prompt_text(rd->tk, path, out, err) : read_target_text(rd->tk, path, out, err);
}

typedef struct totals {
    int cases, first;
    double sum_avg;
    uint64_t targets, lcp;
} totals;

static int run_manifest(ds4_backend *b, const ds4_weights *w, const reader *rd, const char *manifest, FILE *out,
                        totals *t, ds4_err *err) {
    FILE *mf = fopen(manifest, "r");
    if (!mf) return ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", manifest, strerror(errno));
    char line[8192];
    int lineno = 0, rc = 0;
    uint32_t ctx = b->opts.ctx_size;
    fprintf(out, "id\tprompt_tokens\ttarget_tokens\tnll\tavg_nll\tfirst_match\tgreedy_lcp\n");
    while (rc == 0 && fgets(line, sizeof(line), mf)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#') continue;
        char *id = strtok(line, "\t"), *pp = strtok(NULL, "\t"), *tp = strtok(NULL, "\t");
        if (!id || !pp || !tp) {
            rc = ds4_err_set(err, DS4_EFORMAT, "%s:%d: expected ID<TAB>PROMPT_FILE<TAB>TARGET_FILE", manifest, lineno);
            break;
        }
        char path[4096];
        ids prompt = {0}, target = {0};
        resolve(manifest, pp, path, sizeof(path));
        rc = read_case(rd, path, true, &prompt, err);
        resolve(manifest, tp, path, sizeof(path));
        if (rc == 0) rc = read_case(rd, path, false, &target, err);
        if (rc == 0 && (prompt.n == 0 || target.n == 0))
            rc = ds4_err_set(err, DS4_EFORMAT, "case %s: empty prompt or target", id);
        if (rc == 0 && (uint64_t)prompt.n + target.n > ctx)
            rc = ds4_err_set(err, DS4_ERANGE, "case %s: %u + %u tokens exceed the context of %u (give a larger CTX)",
                             id, prompt.n, target.n, ctx);
        score s;
        if (rc == 0 && score_case(b, w->cfg.n_vocab, &prompt, &target, &s, err) != 0) {
            ds4_err_prefix(err, "case %s", id);
            rc = -1;
        }
        if (rc == 0) {
            fprintf(out, "%s\t%u\t%u\t%.9f\t%.9f\t%d\t%u\n", id, prompt.n, target.n, s.nll, s.nll / target.n,
                    s.first_match, s.lcp);
            t->cases++;
            t->first += s.first_match;
            t->sum_avg += s.nll / target.n;
            t->targets += target.n;
            t->lcp += s.lcp;
        }
        free(prompt.v);
        free(target.v);
    }
    fclose(mf);
    return rc;
}

int main(int argc, char **argv) {
    ds4_backend_opts bo = {0};
    const char *backend, *model, *manifest, *out_path;
    bool token_ids = false;
    ds4_opt table[] = {
        DS4_CLI_CTX(&bo.ctx_size),
        {DS4_OPT_FLAG("--token-ids", &token_ids,
                      "the manifest's files are token ids, not ds4's text files (prompt: a user message, "
                      "target: plain text)")},
        DS4_CLI_THREADS(&bo.n_threads),
        DS4_CLI_NO_SIM(&bo.no_sim),
        DS4_CLI_BACKEND(&backend, NULL),
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_STR("MODEL", NULL, &model, NULL, "the GGUF model file"), .flags = DS4_OPT_REQUIRED},
        {DS4_OPT_STR("MANIFEST", NULL, &manifest, NULL,
                     "ds4's quality manifest: lines ID<TAB>PROMPT_FILE<TAB>TARGET_FILE (text files, or token "
                     "ids with --token-ids; paths relative to the manifest's directory, else to the current "
                     "one; '#' starts a comment)"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {DS4_OPT_STR("OUT.tsv", NULL, &out_path, NULL, "one row per case"), .flags = DS4_OPT_REQUIRED | DS4_OPT_OUT},
        {DS4_OPT_U32("CTX", NULL, &bo.ctx_size, 1, DS4_CTX_MAX, DS4_CTX_DEFAULT,
                     "context size, as -c (ds4's position for it)")},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-score",
                   .usage = "MODEL MANIFEST OUT.tsv [CTX] [options]",
                   .about = "Teacher-forced quality scoring of a ds4 GGUF on reference continuations: the NLL "
                            "of each case's\ntarget after its prompt, its first-token match and greedy "
                            "prefix.  Compare two runs with\nds4-score-compare.",
                   .opts = table,
                   .notes = DS4_CLI_ENV_NOTES,
                   .refused = ds4_option_not_supported};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (ds4_cli_check_backend(&cli, backend) != 0) return 2;
    ds4_err err = {0};
    int lrc = ds4_startup_lock("ds4-score");
    if (lrc) return lrc;
    ds4_weights *w = ds4_weights_open(model, &err);
    ds4_backend *b = w ? ds4_backend_create(backend, w, &bo, &err) : NULL;
    if (b) ds4_startup_print_memory("ds4-score", b->ops->name, w, b->opts.ctx_size);
    reader rd = {.n_vocab = w ? w->cfg.n_vocab : 0};
    ds4_vocab *vocab = NULL;
    bool ready = b != NULL;
    if (ready && !token_ids) {
        if (!(vocab = ds4_vocab_from_gguf(w->gguf, &err)) || !(rd.tk = ds4_tokenizer_new(vocab, &err))) {
            ds4_err_prefix(&err, "%s has no usable tokenizer for ds4's text manifest (--token-ids reads token ids)",
                           model);
            ready = false;
        }
    }
    FILE *out = ready ? fopen(out_path, "w") : NULL;
    totals t = {0};
    int rc = -1;
    if (ready && !out) ds4_err_set(&err, DS4_EIO, "%s: %s", out_path, strerror(errno));
    if (out) rc = run_manifest(b, w, &rd, manifest, out, &t, &err);
    if (out && fclose(out) != 0 && rc == 0) rc = ds4_err_set(&err, DS4_EIO, "%s: write failed", out_path);
    if (rc == 0)
        fprintf(stderr,
                "ds4-score: %d case%s, %llu target token%s: avg_nll %.6f, first-token matches %d/%d, "
                "avg greedy LCP %.3f\n",
                t.cases, ds4_plural((unsigned long long)t.cases), (unsigned long long)t.targets, ds4_plural(t.targets),
                t.cases ? t.sum_avg / t.cases : 0.0, t.first, t.cases, t.cases ? (double)t.lcp / t.cases : 0.0);
    else fprintf(stderr, "ds4-score: %s\n", err.msg);
    ds4_tokenizer_free(rd.tk);
    ds4_vocab_free(vocab);
    ds4_backend_free(b);
    ds4_weights_close(w);
    return rc == 0 ? 0 : 1;
}
