/*
 * tools.h - the agent's tools (docs/AGENT.md, "Tools"): the table that
 * defines them (names, parameters, types: the schemas in the system prompt
 * and the argument checks come from it), their shared environment, and
 * the pieces they are built from:
 *
 *   jail     paths resolved (symlinks included) and kept inside --root
 *   views    which lines of which file the model was shown, by checksum,
 *            so a line edit of an unseen or changed line is refused
 *   jobs     bash commands as tracked asynchronous jobs (jobs.c)
 *
 * Every tool returns the text the model reads as its result; failures are
 * results too, starting "Tool error: ", worded so the model can act on them.
 */
#ifndef DS4_AGENT_TOOLS_H
#define DS4_AGENT_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent.h"

#define TOOL_FILE_MAX     (16u << 20) /* read/edit/search: larger files are refused */
#define TOOL_READ_LINES   500
#define TOOL_SEARCH_DEPTH 24

/* ------------------------------------------------------------ jail */

typedef struct jail {
    char *root; /* real path, no trailing slash (except "/") */
    size_t root_len;
} jail;

int jail_init(jail *j, const char *dir, ds4_err *err);
void jail_free(jail *j);
/* The real absolute path of `path` (relative to the root), symlinks of the
 * existing part resolved; refused when it leaves the root. */
char *jail_resolve(const jail *j, const char *path, ds4_err *err);
/* The path as shown to the model: relative to the root when inside it. */
const char *jail_show(const jail *j, const char *abs);

/* ------------------------------------------------------------ views */

typedef struct file_view file_view;
typedef struct views {
    file_view *head;
} views;

void views_free(views *v);
void views_clear(views *v);
/* Remember that lines [first, first + n) of path (1-based) were shown,
 * with these contents (line i is text[i], without its newline). */
void views_see(views *v, const char *path, int first, int n, const char *const *lines, const size_t *lens);
/* Whether lines [first, last] were shown and still read the same.  On
 * failure, msg says which line and why. */
bool views_check(views *v, const char *path, int first, int last, const char *const *lines, const size_t *lens,
                 int total, char *msg, size_t msg_len);
/* After an edit that replaced lines [first, last] by n_new lines (shown to
 * the model in the result): lines after it move, the new ones are known. */
void views_edited(views *v, const char *path, int first, int last, int n_new, const char *const *lines,
                  const size_t *lens, int total);
void views_forget(views *v, const char *path);

/* ------------------------------------------------------------ jobs */

typedef struct jobs jobs;

jobs *jobs_new(ds4_err *err);
/* Stops every running job (their process groups) and deletes the output files. */
void jobs_free(jobs *j);
/* Start `sh -c cmd` in its own process group in directory cwd. */
int jobs_start(jobs *j, const char *cmd, const char *cwd, double timeout_s, int *id, int *pid, ds4_err *err);
/* Wait until the job ends, `seconds` pass or *cancel is set. */
void jobs_wait(jobs *j, int id, double seconds, volatile sig_atomic_t *cancel);
/* SIGTERM to the group, SIGKILL after a second. */
void jobs_stop(jobs *j, int id);
/* The job with this id (or, id 0, this pid); 0 when none. */
int jobs_find(jobs *j, int id, int pid);
/* The observation the model reads: status, exit code, output since the
 * last observation (first one head-biased, later ones tail-biased).
 * *shown: the output part for the screen (caller frees). A job seen done
 * is forgotten. */
char *jobs_observe(jobs *j, int id, char **shown, bool *failed);
/* A note on the jobs still running (after compaction), NULL when none. */
char *jobs_running_note(jobs *j);
/* "bash job 2 running 12 s, 4.1 KiB" for the footer, "" when none. */
void jobs_footer(jobs *j, int id, char *buf, size_t n);

/* ------------------------------------------------------------ tools */

typedef struct tool_env tool_env;

/* What tools share: set up by the agent, one per agent. */
struct tool_env {
    jail jail;
    views views;
    jobs *jobs;
    unsigned allow; /* AGENT_ALLOW_* granted (grows with "always") */
    agent_link *link;
    display *d;
    FILE *trace;
    /* the read that `more` continues */
    char *more_path;
    int more_next;
    bool more_raw;
    /* tokens a tool result may still take (whole-file reads check it) */
    uint32_t (*room)(void *ctx, const char *text, size_t n);
    void *room_ctx;
};

int tools_init(tool_env *env, const agent_opts *o, agent_link *l, display *d, FILE *trace, ds4_err *err);
void tools_free(tool_env *env);

/* Run one call: check the arguments against the table, ask permission
 * for side effects, run.  The result is malloc'ed text. */
char *tools_run(tool_env *env, const char *name, const json_t *args);

/* Argument access after the check: NULL / false when absent. */
const char *arg_str(const json_t *args, const char *name);
bool arg_int(const json_t *args, const char *name, long long *out);
bool arg_bool(const json_t *args, const char *name, bool def);

/* Results. */
char *tool_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The text of b as a result (b is emptied). */
char *tool_text(ds4_strbuf *b);

/* search.c and bash (jobs.c users) */
char *tool_search(tool_env *env, const json_t *args);
char *tool_bash(tool_env *env, const json_t *args);
char *tool_bash_status(tool_env *env, const json_t *args);
char *tool_bash_stop(tool_env *env, const json_t *args);

/* File helpers shared by the file tools and search. */
typedef struct file_lines {
    char *data;
    size_t len;
    const char **line; /* start of each line */
    size_t *len_of;    /* length without the newline */
    int n;
    bool final_newline;
    bool crlf; /* lines end in \r\n */
} file_lines;
int file_load(const char *path, file_lines *f, ds4_err *err);
void file_lines_free(file_lines *f);
/* NUL bytes in the first 8 KiB: a binary file. */
bool looks_binary(const char *data, size_t len);

/* Ask before a side effect unless allowed: true to go on.  kind is one
 * AGENT_ALLOW_* bit; what describes the action. */
bool tools_permit(tool_env *env, unsigned kind, const char *what, char **denied);

#endif
