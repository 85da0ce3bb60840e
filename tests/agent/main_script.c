/*
 * main_script.c - ds4-agent with a scripted model, for the tests that run
 * the whole program (tests/suite/agent.sh: the terminal UI under tmux, the
 * smoke run on a tiny model, --server): "--script FILE" (a JSON array, see
 * script.h) comes first, the other arguments are ds4-agent's.  Built as
 * build/tests/ds4-agent-script, never installed.
 */
#include <stdio.h>
#include <string.h>

#include "../../apps/ds4-agent/app.h"
#include "script.h"

int main(int argc, char **argv) {
    agent_script s = {0};
    if (argc < 3 || strcmp(argv[1], "--script") != 0) {
        fprintf(stderr, "usage: ds4-agent-script --script FILE [ds4-agent options]\n");
        return 2;
    }
    ds4_err err = {0};
    if (agent_script_load(&s, argv[2], &err) != 0) {
        fprintf(stderr, "ds4-agent-script: %s\n", err.msg);
        return 2;
    }
    argv[2] = argv[0];
    agent_hooks h = {.script_next = agent_script_next, .script_ctx = &s};
    int rc = agent_app_main(argc - 2, argv + 2, &h);
    agent_script_free(&s);
    return rc;
}
