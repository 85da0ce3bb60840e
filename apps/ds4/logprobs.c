/*
 * logprobs.c - `ds4 --dump-logprobs FILE -p TEXT`: the greedy continuation
 * of a prompt with, at every step, the chosen token and the most likely
 * alternatives, written as JSON for comparing engines and quantizations
 * (e.g. against official API log-probabilities).
 *
 * The prompt is rendered as a one-shot run would render it; generation is
 * greedy (argmax, lowest id on ties) and stops at EOS or -n tokens.  Each
 * step records the logits the choice was made from:
 *
 *   {"model": ..., "prompt_tokens": N, "top_k": K, "finish": "stop"|"length"|...,
 *    "steps": [{"token": ID, "text": "...", "bytes": [..], "logit": L, "logprob": P,
 *               "top": [{"token", "text", "bytes", "logit", "logprob"}, ... K entries]}]}
 *
 * logprob is the log-softmax of the raw logits (no temperature); text is
 * the token's bytes as UTF-8 with U+FFFD for bytes that are not valid on
 * their own, bytes the exact ones.  Nothing is printed on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conversation.h"
#include "modes.h"

typedef struct dump {
    convo *c;
    uint32_t k;
    int32_t *ids;
    float *lps;
    json_t *steps;
    bool failed;
} dump;

/* {"token", "text", "bytes", "logit", "logprob"} for one token. */
static json_t *token_entry(const ds4_vocab *v, int32_t id, float logit, double logprob) {
    ds4_str b = ds4_vocab_token_bytes(v, id);
    ds4_detok_stream ds;
    ds4_strbuf text = {0};
    ds4_detok_stream_init(&ds, v, true);
    ds4_detok_stream_bytes(&ds, b.ptr, b.len, &text);
    ds4_detok_stream_finish(&ds, &text);
    json_t *bytes = json_array();
    for (uint64_t i = 0; bytes && i < b.len; i++) json_array_append_new(bytes, json_integer((unsigned char)b.ptr[i]));
    json_t *o = json_pack("{s:i, s:s%, s:o, s:f, s:f}", "token", (json_int_t)id, "text", text.p ? text.p : "",
                          text.len, "bytes", bytes, "logit", (double)logit, "logprob", logprob);
    ds4_strbuf_free(&text);
    return o;
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
    /* One log-sum-exp (in double) for every entry, so the chosen token and
     * its copy among the alternatives carry the same number. */
    double lse = (double)logits[tok] - ds4_logprob_of(logits, n_vocab, tok);
    json_t *top = json_array();
    for (int i = 0; top && i < n; i++) {
        float l = logits[d->ids[i]];
        if (json_array_append_new(top, token_entry(e->vocab, d->ids[i], l, (double)l - lse)) != 0) d->failed = true;
    }
    json_t *step = token_entry(e->vocab, tok, logits[tok], (double)logits[tok] - lse);
    if (!top || !step || json_object_set_new(step, "top", top) != 0 || json_array_append_new(d->steps, step) != 0)
        d->failed = true;
}

/* The header keys, then one compact line per step. */
static int write_json(const char *path, const json_t *root, const json_t *steps) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    char *head = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    int rc = head ? 0 : -1;
    if (rc == 0) {
        size_t n = strlen(head);
        fwrite(head, 1, n - 1, f); /* without the closing brace */
        fputs(json_object_size(root) ? ",\n\"steps\":[" : "\"steps\":[", f);
        for (size_t i = 0; i < json_array_size(steps) && rc == 0; i++) {
            fputs(i ? ",\n" : "\n", f);
            rc = json_dumpf(json_array_get(steps, i), f, JSON_COMPACT | JSON_PRESERVE_ORDER);
        }
        fputs("\n]}\n", f);
    }
    free(head);
    if (ferror(f)) rc = -1;
    if (fclose(f) != 0) rc = -1;
    return rc;
}

static int dump_run(convo *c, const cli_opts *o, const ds4_tokens *prompt, json_t *root, bool *interrupted,
                    ds4_err *err) {
    turn_stats st = {0};
    cli_busy(true);
    int rc = convo_prefill(c, prompt, &st, err);
    if (rc > 0) rc = ds4_err_set(err, DS4_EINTERRUPTED, "interrupted during the prompt");
    dump d = {.c = c, .k = o->logprobs_top_k, .steps = json_array()};
    d.ids = malloc(d.k * sizeof(int32_t));
    d.lps = malloc(d.k * sizeof(float));
    if (rc == 0 && (!d.ids || !d.lps || !d.steps)) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (rc == 0) {
        ds4_gen_opts go = {.max_tokens = o->n_tokens, .cancel = &cli_interrupted};
        rc = ds4_generate(c->s, NULL, &go, on_token, &d, &st.gen, err);
    }
    cli_busy(false);
    if (rc == 0 && d.failed) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory building the JSON");
    /* Stopped by Ctrl+C during generation: the steps so far are written,
     * and the exit status says it was interrupted. */
    if (rc == 0 && st.gen.finish == DS4_FINISH_CANCELLED) *interrupted = true;
    if (rc == 0) {
        json_object_set_new(root, "prompt_tokens", json_integer((json_int_t)prompt->n));
        json_object_set_new(root, "top_k", json_integer(d.k));
        json_object_set_new(root, "finish", json_string(ds4_finish_name(st.gen.finish)));
        if (write_json(o->logprobs_out, root, d.steps) != 0)
            rc = ds4_err_set(err, DS4_EIO, "cannot write %s", o->logprobs_out);
        fprintf(stderr, "ds4: %u step%s (%s), prefill %.2f s, generation %.2f s\n", st.gen.n_generated,
                ds4_plural(st.gen.n_generated), ds4_finish_name(st.gen.finish), st.prefill_s, st.gen.seconds);
        cli_warn_nan(st.gen.nan_steps, st.gen.n_generated);
    }
    json_decref(d.steps);
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
    json_t *root = json_pack("{s:s}", "model", o->model);
    if (rc == 0 && !root) rc = ds4_err_set(&err, DS4_ENOMEM, "out of memory");
    bool interrupted = false;
    if (rc == 0) rc = dump_run(&c, o, &prompt, root, &interrupted, &err);
    if (rc != 0) fprintf(stderr, "ds4: --dump-logprobs: %s\n", err.msg);
    json_decref(root);
    ds4_tokens_free(&prompt);
    convo_free(&c);
    if (interrupted) return cli_report_interrupt();
    if (rc != 0 && err.code == DS4_EINTERRUPTED) return DS4_EXIT_INTERRUPTED;
    return rc == 0 ? 0 : 1;
}
