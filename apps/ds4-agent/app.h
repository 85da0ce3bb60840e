/*
 * app.h - the program around the agent core: agent_app_main runs
 * ds4-agent (main.c calls it with no hooks; the test build passes a
 * script, see agent_hooks), tui_run is the terminal UI.
 */
#ifndef DS4_AGENT_APP_H
#define DS4_AGENT_APP_H

#include "agent.h"

int agent_app_main(int argc, char **argv, const agent_hooks *hooks);

/* The terminal UI until /quit, Ctrl+D or the worker stops.  sigfd is
 * readable after SIGINT or SIGWINCH. */
int tui_run(agent *a, agent_link *l, const agent_opts *o, display *d, const char *session_dir, int sigfd);

/* SIGINT/SIGWINCH to a pipe (fds[0] readable after one); SIGPIPE ignored. */
int app_signals(int fds[2]);
int app_sigint_count(void);

#endif
