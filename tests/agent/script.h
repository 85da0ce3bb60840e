/*
 * script.h - scripted model output for ds4-agent's tests (agent_hooks):
 * the text each model round produces, in order, so the whole agent runs
 * (engine, DSML parser, tools, transcript, KV files) with known output.
 * Only the tests link this; a release ds4-agent has no way to take one.
 *
 * An item is the exact text of a round, special tokens included
 * ("<｜DSML｜tool_calls>...", "<｜end▁of▁sentence｜>"); the local model
 * forces its tokens and goes on sampling if it does not end the round.  A
 * null item (or running out of items) lets the model sample.  With
 * --server, items are X-DS4-Test-Output names.
 */
#ifndef DS4_TEST_AGENT_SCRIPT_H
#define DS4_TEST_AGENT_SCRIPT_H

#include <stddef.h>

#include "base/error.h"

typedef struct agent_script {
    char **items; /* NULL entries: sample */
    size_t n, next;
    /* called as each item is taken (index), e.g. to queue a prompt or
     * interrupt at a known point */
    void (*on_next)(void *ctx, size_t index);
    void *ctx;
} agent_script;

/* Load a JSON array of strings and nulls. */
int agent_script_load(agent_script *s, const char *path, ds4_err *err);
void agent_script_add(agent_script *s, const char *text);
void agent_script_free(agent_script *s);
/* agent_hooks.script_next */
const char *agent_script_next(void *ctx);

#endif
