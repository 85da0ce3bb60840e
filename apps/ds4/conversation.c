/*
 * conversation.c - the chat transcript over a live session (see
 * conversation.h).
 */
#include "conversation.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "printer.h"

/* Raw bytes as a JSON string: user text and generated text need not be
 * valid UTF-8, and the renderer copies the bytes as they are. */
static json_t *bytes_string(const char *s, size_t n) { return json_stringn_nocheck(s ? s : "", n); }

int convo_init(convo *c, ds4_engine *e, uint32_t ctx, const char *system, ds4_think_mode think, ds4_err *err) {
    memset(c, 0, sizeof(*c));
    c->e = e;
    c->think = think;
    c->term = cli_term_detect();
    c->think_end = ds4_vocab_find_added(e->vocab, DS4_TOK_THINK_END, strlen(DS4_TOK_THINK_END));
    if (!(c->tok = ds4_tokenizer_new(e->vocab, err))) return -1;
    if (!(c->messages = json_array())) {
        convo_free(c);
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    if (system && *system) {
        json_t *m = json_pack("{s:s, s:o}", "role", "system", "content", bytes_string(system, strlen(system)));
        if (!m || json_array_append_new(c->messages, m) != 0) {
            convo_free(c);
            return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        }
    }
    if (!(c->s = ds4_session_new(e, ctx, err))) {
        convo_free(c);
        return -1;
    }
    return 0;
}

void convo_free(convo *c) {
    ds4_session_free(c->s);
    ds4_tokenizer_free(c->tok);
    json_decref(c->messages);
    ds4_tokens_free(&c->known);
    ds4_strbuf_free(&c->known_text);
    ds4_strbuf_free(&c->pending_text);
    memset(c, 0, sizeof(*c));
}

uint32_t convo_ctx(const convo *c) { return ds4_session_ctx(c->s); }

int convo_enable_mtp(convo *c, uint32_t draft, float margin, ds4_err *err) {
    c->mtp_draft = c->e->mtp ? draft : 0;
    c->mtp_margin = margin;
    return c->mtp_draft ? ds4_session_enable_mtp(c->s, c->mtp_draft, margin, err) : 0;
}

/* The old session goes first: the engine makes its backend again for the
 * new context size only when no session holds a sequence of it. */
int convo_set_ctx(convo *c, uint32_t ctx, ds4_err *err) {
    uint32_t old = ds4_session_ctx(c->s);
    ds4_session_free(c->s);
    if ((c->s = ds4_session_new(c->e, ctx, err))) return convo_enable_mtp(c, c->mtp_draft, c->mtp_margin, err);
    ds4_err keep = *err;
    c->s = ds4_session_new(c->e, old, err);
    *err = keep;
    return -1;
}

void convo_set_think(convo *c, ds4_think_mode think) { c->think = think; }

ds4_think_mode convo_effective_think(const convo *c) {
    ds4_chat_opts co = {.think = c->think, .ctx_size = convo_ctx(c)};
    return ds4_chat_effective_think(&co);
}

void convo_rollback(convo *c) {
    size_t n = json_array_size(c->messages);
    if (!c->pending_raw && n > 0) json_array_remove(c->messages, n - 1);
}

/* Tokens of the render: the known tokens plus the tokenized rest when the
 * render continues their text at a segment boundary, else all of it. */
static int tokenize_render(convo *c, const ds4_rendered *r, ds4_tokens *out, ds4_err *err) {
    size_t k = c->known_text.len;
    if (k > 0 && c->known.n > 0 && r->text.len > k && memcmp(r->text.p, c->known_text.p, k) == 0) {
        for (size_t i = 0; i < r->n_segs; i++) {
            if (r->segs[i].off != k) continue;
            ds4_tokens_append(out, c->known.ids, c->known.n);
            return ds4_tokenize_segments(c->tok, r->text.p, r->segs + i, r->n_segs - i, out, err);
        }
    }
    return ds4_tokenize_rendered(c->tok, r, out, err);
}

int convo_prompt(convo *c, const char *text, size_t len, ds4_tokens *out, ds4_err *err) {
    json_t *m = json_pack("{s:s, s:o}", "role", "user", "content", bytes_string(text, len));
    if (!m || json_array_append_new(c->messages, m) != 0) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    c->pending_raw = false;
    ds4_chat_opts co = {.think = c->think, .ctx_size = convo_ctx(c), .keep_reasoning = true};
    ds4_rendered r = {0};
    out->n = 0;
    int rc = ds4_chat_render(c->messages, &co, &r, err);
    if (rc == 0) rc = tokenize_render(c, &r, out, err);
    if (rc == 0) {
        ds4_strbuf_truncate(&c->pending_text, 0);
        ds4_strbuf_append(&c->pending_text, r.text.p, r.text.len);
        rc = ds4_strbuf_check(&c->pending_text, "prompt", err);
    }
    ds4_rendered_free(&r);
    if (rc != 0) convo_rollback(c);
    return rc;
}

int convo_prompt_raw(convo *c, const char *text, size_t len, ds4_tokens *out, ds4_err *err) {
    c->pending_raw = true;
    out->n = 0;
    if (ds4_tokenize_transcript(c->tok, text, len, out, err) != 0) return -1;
    ds4_strbuf_truncate(&c->pending_text, 0);
    ds4_strbuf_append(&c->pending_text, text, len);
    return ds4_strbuf_check(&c->pending_text, "prompt", err);
}

/* Tokens sync will prefill: all but the live prefix it can extend. */
static uint32_t to_prefill(const convo *c, const ds4_tokens *p) {
    uint32_t live = ds4_session_n_tokens(c->s), i = 0;
    const int32_t *t = ds4_session_tokens(c->s);
    while (i < live && i < p->n && t[i] == p->ids[i]) i++;
    return i == live ? (uint32_t)p->n - i : (uint32_t)p->n;
}

int convo_prefill(convo *c, const ds4_tokens *prompt, turn_stats *st, ds4_err *err) {
    st->prompt_tokens = (uint32_t)prompt->n;
    if (cli_interrupted) { /* Ctrl+C came before the work started */
        convo_rollback(c);
        st->interrupted = st->rolled_back = true;
        return 1;
    }
    if (prompt->n >= convo_ctx(c)) {
        convo_rollback(c);
        if (prompt->n == convo_ctx(c))
            return ds4_err_set(err, DS4_ERANGE,
                               "the conversation is %zu tokens and fills the context of %u tokens: no room is "
                               "left for an answer (a larger context: /ctx N or -c N)",
                               prompt->n, convo_ctx(c));
        return ds4_err_set(err, DS4_ERANGE,
                           "the conversation is %zu tokens, more than the context of %u tokens holds "
                           "(a larger context: /ctx N or -c N)",
                           prompt->n, convo_ctx(c));
    }
    cli_progress pr = {.show = c->term.err_tty};
    cli_progress_start(&pr, to_prefill(c, prompt));
    double t0 = ds4_now();
    int rc = ds4_session_sync(c->s, prompt->ids, (uint32_t)prompt->n, cli_progress_fn, &pr, err);
    st->prefill_s = ds4_now() - t0;
    cli_progress_clear(&pr);
    const ds4_session_stats *ss = ds4_session_get_stats(c->s);
    st->reused = (uint32_t)(ss->reused + ss->restored);
    st->prefilled = (uint32_t)ss->prefilled;
    if (rc != 0) {
        convo_rollback(c);
        if (err && err->code == DS4_EINTERRUPTED) {
            st->interrupted = st->rolled_back = true;
            return 1;
        }
        return -1;
    }
    return 0;
}

/* Bytes of gen[a..b). */
static int detok_range(const ds4_vocab *v, const int32_t *gen, uint32_t a, uint32_t b, ds4_strbuf *out, ds4_err *err) {
    ds4_strbuf_truncate(out, 0);
    return b > a ? ds4_detokenize(v, gen + a, b - a, out, err) : 0;
}

/* The assistant message: reasoning up to the first "</think>" when the
 * prompt opened a think block, content after it, EOS left out. */
static int add_assistant(convo *c, const int32_t *gen, uint32_t n, ds4_err *err) {
    uint32_t end = n > 0 && gen[n - 1] == c->e->eos ? n - 1 : n, split = 0;
    bool thinking = convo_effective_think(c) != DS4_THINK_OFF;
    if (thinking) {
        while (split < end && gen[split] != c->think_end) split++;
    }
    ds4_strbuf reasoning = {0}, content = {0};
    int rc = 0;
    if (thinking) {
        rc = detok_range(c->e->vocab, gen, 0, split, &reasoning, err);
        uint32_t from = split < end ? split + 1 : end;
        if (rc == 0) rc = detok_range(c->e->vocab, gen, from, end, &content, err);
    } else {
        rc = detok_range(c->e->vocab, gen, 0, end, &content, err);
    }
    if (rc == 0) {
        json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", bytes_string(content.p, content.len));
        if (m && thinking) json_object_set_new(m, "reasoning_content", bytes_string(reasoning.p, reasoning.len));
        if (!m || json_array_append_new(c->messages, m) != 0) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    }
    ds4_strbuf_free(&reasoning);
    ds4_strbuf_free(&content);
    return rc;
}

int convo_commit(convo *c, const ds4_tokens *prompt, const int32_t *gen, uint32_t n, ds4_err *err) {
    if (n == 0) {
        convo_rollback(c);
        return 0;
    }
    if (!c->pending_raw && add_assistant(c, gen, n, err) != 0) return -1;
    c->known.n = 0;
    ds4_tokens_append(&c->known, prompt->ids, prompt->n);
    ds4_tokens_append(&c->known, gen, n);
    ds4_strbuf_truncate(&c->known_text, 0);
    ds4_strbuf_append(&c->known_text, c->pending_text.p, c->pending_text.len);
    ds4_strbuf tail = {0};
    int rc = ds4_detokenize(c->e->vocab, gen, n, &tail, err);
    ds4_strbuf_append(&c->known_text, tail.p, tail.len);
    ds4_strbuf_free(&tail);
    if (rc == 0 && c->known.failed) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (rc == 0) rc = ds4_strbuf_check(&c->known_text, "transcript", err);
    if (rc != 0) {
        c->known.n = 0;
        ds4_strbuf_truncate(&c->known_text, 0);
    }
    return rc;
}

bool convo_opens_think(const convo *c, const ds4_tokens *prompt) {
    if (!c->pending_raw) return convo_effective_think(c) != DS4_THINK_OFF;
    int32_t open = ds4_vocab_find_added(c->e->vocab, DS4_TOK_THINK, strlen(DS4_TOK_THINK));
    return prompt->n > 0 && prompt->ids[prompt->n - 1] == open;
}

/* Generation callback: print and record. */
typedef struct turn_sink {
    printer pr;
    ds4_tokens gen;
} turn_sink;

static void on_token(void *ctx, int32_t tok, ds4_gen_control *ctl) {
    (void)ctl;
    turn_sink *t = ctx;
    ds4_tokens_push(&t->gen, tok);
    printer_token(&t->pr, tok);
}

int convo_turn(convo *c, const ds4_tokens *prompt, ds4_sampler *smp, uint32_t max_tokens, turn_stats *st,
               ds4_err *err) {
    memset(st, 0, sizeof(*st));
    cli_busy(true);
    int rc = convo_prefill(c, prompt, st, err);
    if (rc != 0) {
        cli_busy(false);
        return rc > 0 ? 0 : -1;
    }
    turn_sink t = {0};
    printer_start(&t.pr, c->e, c->think_end, convo_opens_think(c, prompt), c->term.out_tty);
    ds4_gen_opts go = {.max_tokens = max_tokens, .cancel = &cli_interrupted};
    ds4_spec *sp = ds4_session_spec(c->s);
    ds4_spec_stats before = sp ? sp->stats : (ds4_spec_stats){0};
    rc = ds4_generate(c->s, smp, &go, on_token, &t, &st->gen, err);
    if (sp) {
        st->spec.cycles = sp->stats.cycles - before.cycles;
        st->spec.drafted = sp->stats.drafted - before.drafted;
        st->spec.accepted = sp->stats.accepted - before.accepted;
    }
    cli_busy(false);
    printer_finish(&t.pr);
    printer_free(&t.pr);
    st->interrupted = st->gen.finish == DS4_FINISH_CANCELLED;
    st->context_full = st->gen.finish == DS4_FINISH_LENGTH && (!max_tokens || st->gen.n_generated < max_tokens);
    if (rc == 0 && t.gen.failed) rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (rc == 0) {
        st->rolled_back = t.gen.n == 0;
        rc = convo_commit(c, prompt, t.gen.ids, (uint32_t)t.gen.n, err);
    } else {
        convo_rollback(c);
        st->rolled_back = true;
    }
    ds4_tokens_free(&t.gen);
    return rc;
}

void convo_print_stats(const turn_stats *st) {
    double pre = st->prefill_s > 0 ? st->prefilled / st->prefill_s : 0.0;
    double gen = st->gen.seconds > 0 ? st->gen.n_generated / st->gen.seconds : 0.0;
    /* ds4's line first (scripts read it), then what it leaves out. */
    fprintf(stderr,
            "ds4: prefill: %.2f t/s, generation: %.2f t/s; prefill %u token%s (%u reused), generation %u token%s", pre,
            gen, st->prefilled, ds4_plural(st->prefilled), st->reused, st->gen.n_generated,
            ds4_plural(st->gen.n_generated));
    if (st->spec.cycles)
        fprintf(stderr, ", MTP: %llu of %llu drafts accepted (%.0f%%), %.2f tokens a verification",
                (unsigned long long)st->spec.accepted, (unsigned long long)st->spec.drafted,
                st->spec.drafted ? 100.0 * (double)st->spec.accepted / (double)st->spec.drafted : 0.0,
                (double)(st->spec.accepted + st->spec.cycles) / (double)st->spec.cycles);
    if (st->interrupted) fprintf(stderr, ", interrupted%s", st->rolled_back ? " (turn taken back)" : "");
    else if (st->context_full) fputs(", stopped: the context is full (a larger one: -c N or /ctx N)", stderr);
    else if (st->gen.finish == DS4_FINISH_LENGTH) fputs(", stopped at the token limit (-n)", stderr);
    fputc('\n', stderr);
    cli_warn_nan(st->gen.nan_steps, st->gen.n_generated);
}
