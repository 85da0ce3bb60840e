/*
 * oneshot.c - `ds4 -p TEXT`: answer one prompt on stdout and exit.
 *
 * The prompt is the user message of a fresh conversation (system prompt and
 * thinking mode from the options), or, when it starts with the BOS marker,
 * a transcript someone already rendered, run as is.  Exit status 130 when
 * Ctrl+C stopped it.
 */
#include <stdio.h>
#include <string.h>

#include "conversation.h"
#include "modes.h"

int run_oneshot(ds4_engine *e, const cli_opts *o, ds4_sampler *smp) {
    ds4_err err = {0};
    convo c;
    if (convo_init(&c, e, o->ctx, o->system, o->think, &err) != 0 ||
        convo_enable_mtp(&c, o->mtp.draft, o->mtp.margin, &err) != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        convo_free(&c); /* (a convo that failed to start is already empty) */
        return 1;
    }
    ds4_tokens prompt = {0};
    bool raw = strncmp(o->prompt, DS4_TOK_BOS, strlen(DS4_TOK_BOS)) == 0;
    int rc = raw ? convo_prompt_raw(&c, o->prompt, o->prompt_len, &prompt, &err)
                 : convo_prompt(&c, o->prompt, o->prompt_len, &prompt, &err);
    turn_stats st = {0};
    if (rc == 0) rc = convo_turn(&c, &prompt, smp, o->n_tokens, &st, &err);
    int status = 0;
    if (rc != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        status = 1;
    } else {
        convo_print_stats(&st);
        if (st.interrupted) status = 130;
    }
    ds4_tokens_free(&prompt);
    convo_free(&c);
    return status;
}
