/*
 * eval.h - ds4-eval, a capability regression harness (docs/EVAL.md): a
 * question set runs through the model, each answer is graded, and the
 * report (per question and totals, also as JSON) can be compared with
 * another run's.
 *
 *   questions.c  question files (JSON lines, docs/EVAL.md has the schema)
 *   grade.c      the "Answer: ..." extraction and the grading kinds
 *   run.c        one question through the model: rendering, generation with
 *                the thinking-budget controls, the scripted test model
 *   report.c     the final report, its JSON, --compare, --trace
 *   tui.c        the split-screen terminal UI (and the --plain lines)
 *   app.c        options and the run over the set (eval_main)
 *   main.c       the program: eval_main without hooks
 */
#ifndef DS4_EVAL_H
#define DS4_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "engine/cli.h"
#include "engine/sampler.h"

/* ------------------------------------------------------------ questions */

typedef enum eval_kind {
    EVAL_CHOICE,  /* multiple choice: a letter A.. */
    EVAL_INTEGER, /* an integer */
    EVAL_LINES,   /* a set of line numbers (0: none, the code is safe) */
} eval_kind;

#define EVAL_MAX_CHOICES 26
#define EVAL_MAX_LINES   64 /* line numbers in one answer or accepted set */

/* A set of line numbers, ascending, without repeats. */
typedef struct eval_lines {
    uint32_t v[EVAL_MAX_LINES];
    uint32_t n;
} eval_lines;

typedef struct eval_question {
    char *id;
    eval_kind kind;
    char *text; /* the question */
    char *code; /* EVAL_LINES: the code, shown with line numbers (may be NULL) */
    char *choices[EVAL_MAX_CHOICES];
    uint32_t n_choices;
    char answer_letter;   /* EVAL_CHOICE */
    long long answer_int; /* EVAL_INTEGER */
    eval_lines *accept;   /* EVAL_LINES: the accepted sets (the answer first) */
    uint32_t n_accept;
    char *source;      /* where the question comes from (may be NULL) */
    char *answer_text; /* the correct answer as the report shows it */
} eval_question;

typedef struct eval_set {
    eval_question *q;
    size_t n;
} eval_set;

/* Append the questions of a JSON-lines file; a malformed line is an error
 * naming the file, the line and the field. */
int eval_set_load(eval_set *s, const char *path, ds4_err *err);
void eval_set_free(eval_set *s);

/* The user message a question is asked with (instructions included);
 * malloc'ed. */
char *eval_prompt(const eval_question *q);

/* ------------------------------------------------------------ grading */

/* The text after the last "Answer:" of the reply (after the thinking),
 * trimmed, up to the end of its line; NULL when there is none.  Points into
 * reply; *len its length. */
const char *eval_extract(const char *reply, size_t *len);

/* Parsers of an extracted answer: 0 on success, -1 when it is not one. */
int eval_parse_letter(const char *s, size_t n, uint32_t n_choices, char *out);
int eval_parse_integer(const char *s, size_t n, long long *out);
int eval_parse_lines(const char *s, size_t n, eval_lines *out);

/* Grade a reply: whether it passes; what the model answered (normalised,
 * or "(no Answer: line)" / "(unreadable: ...)") into got; why, into why. */
bool eval_grade(const eval_question *q, const char *reply, char *got, size_t got_len, char *why, size_t why_len);

/* "3, 5-7" style. */
void eval_lines_format(const eval_lines *l, char *buf, size_t len);

/* ------------------------------------------------------------ results */

typedef enum eval_status {
    EVAL_PENDING,
    EVAL_PREFILL,
    EVAL_THINKING,
    EVAL_ANSWERING,
    EVAL_PASSED,
    EVAL_FAILED,
    EVAL_SKIPPED,
    EVAL_STOPPED,
} eval_status;

const char *eval_status_name(eval_status s);

typedef struct eval_result {
    eval_status status;
    uint32_t prompt_tokens, gen_tokens;
    char got[128]; /* the model's answer, normalised */
    char why[256]; /* the grading decision, or why it was skipped */
    double seconds;
} eval_result;

/* ------------------------------------------------------------ running */

typedef struct eval_opts {
    const char *model, *backend, *system;
    int threads;
    bool no_sim, plain, warm_weights;
    uint32_t ctx;         /* 0: the largest prompt plus --tokens */
    uint32_t max_tokens;  /* per question */
    uint32_t n_questions; /* 0: all */
    ds4_sampler_params sp;
    int think; /* ds4_think_mode */
    uint32_t soft_budget, hard_budget, close_rank;
    uint32_t pause_ms;
    const char *trace, *json_out;
    const char *compare; /* --compare A.json (B is the positional) */
    ds4_cli_steer steer;
} eval_opts;

/* The tests' scripted model (tests/eval/main_script.c): the text each
 * question's reply is forced to, special tokens included; NULL lets the
 * model answer.  A release ds4-eval has none. */
typedef struct eval_hooks {
    const char *(*script_for)(void *ctx, const char *id);
    void *ctx;
} eval_hooks;

/* What a question's run reports as it goes (the UI). */
typedef struct eval_sink {
    void (*status)(void *ctx, eval_status s);
    void (*text)(void *ctx, const char *s, size_t n, bool thinking);
    bool (*stop)(void *ctx); /* asked between tokens: true ends the question as stopped */
    void *ctx;
} eval_sink;

typedef struct eval_runner eval_runner;

/* The model (and session of ctx tokens, 0: sized for the set's largest
 * prompt plus max_tokens) for a set. */
eval_runner *eval_runner_new(const eval_opts *o, const eval_hooks *h, const eval_set *set, ds4_err *err);
void eval_runner_free(eval_runner *r);
const char *eval_runner_backend(const eval_runner *r);
uint32_t eval_runner_ctx(const eval_runner *r);

/* One question: status, tokens, the graded answer into res; a question
 * that does not fit is skipped with the reason.  -1 only on an engine
 * error. */
int eval_run_question(eval_runner *r, const eval_question *q, eval_result *res, const eval_sink *sink, FILE *trace,
                      ds4_err *err);

/* The run over the set with the split-screen UI (tui.c) or plain lines;
 * order[] is the order to run in (the UI may change it).  Returns the
 * status to exit with. */
int eval_tui(eval_runner *r, const eval_opts *o, const eval_set *s, eval_result *res, FILE *trace);
int eval_plain(eval_runner *r, const eval_opts *o, const eval_set *s, eval_result *res, FILE *trace);

/* The whole program (app.c); hooks NULL but in the tests' build. */
int eval_main(int argc, char **argv, const eval_hooks *hooks);

/* The report: per question and totals on `out`; as JSON into path (NULL:
 * none). */
void eval_report_print(FILE *out, const eval_set *s, const eval_result *r);
int eval_report_json(const char *path, const eval_set *s, const eval_result *r, const char *model, ds4_err *err);
/* --compare A.json B.json: which questions flipped; 0, or 1 on a bad file. */
int eval_compare(const char *a, const char *b, FILE *out, ds4_err *err);

#endif
