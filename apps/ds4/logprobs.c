/*
 * logprobs.c - `ds4 --dump-logprobs FILE -p TEXT`: the greedy continuation
 * of a prompt with, at every step, the chosen token and the most likely
 * alternatives, written as JSON for comparing engines and quantizations
 * (e.g. against official API log-probabilities).
 *
 * The prompt is rendered as a one-shot run would render it; generation is
 * greedy (argmax, lowest id on ties) and stops at EOS (the EOS step is
 * written) or -n tokens.  The file has ds4's layout, byte for byte, so the
 * scripts that read ds4's dumps read these:
 *
 *   {
 *     "source":"ds4",
 *     "prompt_tokens":N,
 *     "ctx":C,
 *     "top_k":K,
 *     "steps":[
 *       {"step":0,"selected":TOKEN,"top_logprobs":[{"token":TOKEN,"logit":L,"logprob":P}, ...]},
 *       ...
 *     ]
 *   }
 *
 * with TOKEN = {"id":ID,"text":"...","bytes":[...]}: text is the token's
 * bytes as a JSON string (when they are not valid UTF-8 on their own, each
 * byte >= 0x80 is written as \u00XX: the bytes array is the exact one),
 * logprob the log-softmax of the raw logits (no temperature) rounded to
 * float, both printed with 9 significant digits.  Nothing goes to stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conversation.h"
#include "modes.h"
#include "text/utf8.h"

typedef struct dump {
    convo *c;
    FILE *f;
    uint32_t k;
    uint32_t steps;
    int32_t *ids;
    float *lps;
} dump;

/* A JSON string as ds4 writes one: quote, backslash, \n, \r, \t and
 * other control bytes escaped; bytes >= 0x80 raw when the whole piece is
 * valid UTF-8, else escaped one by one. */
static void write_json_string(FILE *f, const char *s, size_t n) {
    bool utf8 = ds4_utf8_valid_prefix((const uint8_t *)s, n) == n;
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20 || (c >= 0x80 && !utf8)) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* {"id":ID,"text":"...","bytes":[...]} */
static void write_token(FILE *f, const ds4_vocab *v, int32_t id) {
    ds4_str b = ds4_vocab_token_bytes(v, id);
    fprintf(f, "{\"id\":%d,\"text\":", id);
    write_json_string(f, b.ptr, b.len);
    fputs(",\"bytes\":[", f);
    for (uint64_t i = 0; i < b.len; i++) fprintf(f, i ? ",%u" : "%u", (unsigned char)b.ptr[i]);
    fputs("]}", f);
}

static void on_token(void *ctx, int32_t tok, ds4_gen_control *ctl) {
    (void)ctl;
    dump *d = ctx;
    const ds4_engine *e = d->c->e;
    int n_vocab = (int)e->w->cfg.n_vocab;
    /* The callback runs before the token is appended: the session's
     * logits are the ones it was chosen from. */
    const float *logits = ds4_session_logits(d->c->s);
    int n = ds4_top_logprobs(logits, n_vocab, (int)d->k, d->ids, d->lps);
    fprintf(d->f, "%s    {\"step\":%u,\"selected\":", d->steps ? ",\n" : "", d->steps);
    write_token(d->f, e->vocab, tok);
    fputs(",\"top_logprobs\":[", d->f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",{\"token\":" : "{\"token\":", d->f);
        write_token(d->f, e->vocab, d->ids[i]);
        fprintf(d->f, ",\"logit\":%.9g,\"logprob\":%.9g}", (double)logits[d->ids[i]], (double)d->lps[i]);
    }
    fputs("]}", d->f);
    d->steps++;
}

static int dump_run(convo *c, const cli_opts *o, const ds4_tokens *prompt, bool *interrupted, ds4_err *err) {
    turn_stats st = {0};
    dump d = {.c = c, .k = o->logprobs_top_k};
    d.ids = malloc(d.k * sizeof(int32_t));
    d.lps = malloc(d.k * sizeof(float));
    int rc = d.ids && d.lps ? 0 : ds4_err_set(err, DS4_ENOMEM, "out of memory");
    cli_busy(true);
    if (rc == 0 && (rc = convo_prefill(c, prompt, &st, err)) > 0)
        rc = ds4_err_set(err, DS4_EINTERRUPTED, "interrupted during the prompt");
    if (rc == 0 && !(d.f = fopen(o->logprobs_out, "w")))
        rc = ds4_err_set(err, DS4_EIO, "cannot write %s", o->logprobs_out);
    if (rc == 0) {
        fprintf(d.f,
                "{\n  \"source\":\"ds4\",\n  \"prompt_tokens\":%zu,\n  \"ctx\":%u,\n  \"top_k\":%u,\n  \"steps\":[\n",
                prompt->n, o->ctx, d.k);
        ds4_gen_opts go = {.max_tokens = o->n_tokens, .cancel = &cli_interrupted};
        rc = ds4_generate(c->s, NULL, &go, on_token, &d, &st.gen, err);
        fputs("\n  ]\n}\n", d.f);
        if (ferror(d.f) && rc == 0) rc = ds4_err_set(err, DS4_EIO, "cannot write %s", o->logprobs_out);
    }
    if (d.f && fclose(d.f) != 0 && rc == 0) rc = ds4_err_set(err, DS4_EIO, "cannot write %s", o->logprobs_out);
    cli_busy(false);
    /* Stopped by Ctrl+C during generation: the steps so far are written,
     * and the exit status says it was interrupted. */
    if (rc == 0 && st.gen.finish == DS4_FINISH_CANCELLED) *interrupted = true;
    if (rc == 0) {
        fprintf(stderr, "ds4: %u step%s (%s), prefill %.2f s, generation %.2f s\n", st.gen.n_generated,
                ds4_plural(st.gen.n_generated), ds4_finish_name(st.gen.finish), st.prefill_s, st.gen.seconds);
        cli_warn_nan(st.gen.nan_steps, st.gen.n_generated);
    }
    free(d.ids);
    free(d.lps);
    return rc;
}

int run_dump_logprobs(ds4_engine *e, const cli_opts *o) {
    ds4_err err = {0};
    convo c;
    if (convo_init(&c, e, o->ctx, o->system, o->think, &err) != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return 1;
    }
    ds4_tokens prompt = {0};
    bool raw = strncmp(o->prompt, DS4_TOK_BOS, strlen(DS4_TOK_BOS)) == 0;
    int rc = raw ? convo_prompt_raw(&c, o->prompt, o->prompt_len, &prompt, &err)
                 : convo_prompt(&c, o->prompt, o->prompt_len, &prompt, &err);
    bool interrupted = false;
    if (rc == 0) rc = dump_run(&c, o, &prompt, &interrupted, &err);
    if (rc != 0) fprintf(stderr, "ds4: --dump-logprobs: %s\n", err.msg);
    ds4_tokens_free(&prompt);
    convo_free(&c);
    if (interrupted) return cli_report_interrupt();
    if (rc != 0 && err.code == DS4_EINTERRUPTED) return DS4_EXIT_INTERRUPTED;
    return rc == 0 ? 0 : 1;
}
