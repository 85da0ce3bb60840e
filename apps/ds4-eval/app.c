/*
 * app.c - ds4-eval's command line and the run over a question set
 * (eval.h, docs/EVAL.md).  eval_main is the whole program: main.c calls it
 * without hooks, the tests' build (tests/eval/main_script.c) with scripted
 * answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/startup.h"
#include "eval.h"

static const char ABOUT[] =
    "Capability regression harness: a question set (JSON lines, docs/EVAL.md) runs through the model;\n"
    "each reply's \"Answer: ...\" line is graded (a choice letter, an integer, a set of line numbers), and\n"
    "the report (per question and totals, --json for a file) can be compared with another run's\n"
    "(--compare A.json B.json).  data/eval/ds4-eval-basic.jsonl is a small set that ships with ds4.";

static const char NOTES[] =
    "keys (split-screen UI): p pause/resume, q quit and report, Up/Down select, Enter run the selected\n"
    "question next\n\n" DS4_CLI_ENV_NOTES;

static const char *refused(const char *name) {
    if (!strncmp(name, "--mtp", 5)) return "MTP speculative decoding is in ds4 and ds4-agent; ds4-eval does not draft";
    return ds4_option_not_supported(name);
}

/* -1 to go on, else the status to exit with. */
static int parse_args(int argc, char **argv, eval_opts *o, const char **set_path) {
    memset(o, 0, sizeof(*o));
    bool soft_given = false;
    ds4_opt table[] = {
        {DS4_OPT_STR("FILE", NULL, set_path, NULL, "the question set (with --compare: report B)"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        DS4_CLI_MODEL(&o->model),
        {DS4_OPT_U32("-c, --ctx", "N", &o->ctx, 1, DS4_CTX_MAX, 0, "context size in tokens"),
         .def_text = "the largest prompt + --tokens"},
        {DS4_OPT_U32("-n, --tokens", "N", &o->max_tokens, 1, 1000000, 16000, "most tokens generated per question")},
        {DS4_OPT_U32("--questions", "N", &o->n_questions, 1, UINT32_MAX, 0, "only the first N questions"),
         .def_text = "all"},
        {DS4_OPT_STR("-sys, --system", "TEXT", &o->system, NULL, "system prompt"), .def_text = "none"},

        {DS4_OPT_SECTION("sampling:")},
        {DS4_OPT_FLOAT("--temp", "F", &o->sp.temperature, 0.0, DS4_TEMP_MAX, 0.0, "temperature, 0 = greedy")},
        {DS4_OPT_FLOAT("--top-p", "F", &o->sp.top_p, 0.0, 1.0, 1.0, "nucleus mass")},
        {DS4_OPT_INT("--top-k", "N", &o->sp.top_k, 0, DS4_TOP_K_MAX, 0, "keep the N most likely tokens, 0 = off"),
         .flags = DS4_OPT_CLAMP},
        {DS4_OPT_FLOAT("--min-p", "F", &o->sp.min_p, 0.0, 1.0, DS4_MIN_P_DEFAULT,
                       "keep the tokens with p >= F x p(most likely)")},
        {DS4_OPT_U64("--seed", "N", &o->sp.seed, 1, UINT64_MAX, 0, "random seed"), .def_text = "from the time and pid"},

        {DS4_OPT_SECTION("thinking:")},
        DS4_CLI_THINK(&o->think),
        {DS4_OPT_U32("--soft-limit-reply-budget", "N", &o->soft_budget, 0, 1000000, 1024,
                     "within the last N tokens, close the thinking as soon as </think> ranks high enough"),
         .seen = &soft_given},
        {DS4_OPT_U32("--hard-limit-reply-budget", "N", &o->hard_budget, 0, 1000000, 512,
                     "with N tokens left, force </think> (below --tokens, at most the soft budget)")},
        {DS4_OPT_U32("--soft-limit-think-close-rank", "N", &o->close_rank, 1, 1000, 3,
                     "the soft close takes </think> when it is among the N most likely tokens")},

        {DS4_OPT_SECTION("runtime:")},
        DS4_CLI_BACKEND(&o->backend, NULL),
        DS4_CLI_THREADS(&o->threads),
        DS4_CLI_NO_SIM(&o->no_sim),
        DS4_CLI_WARM_WEIGHTS(&o->warm_weights),
        DS4_CLI_QUALITY("ds4-eval"),
        DS4_CLI_STEERING(&o->steer),

        {DS4_OPT_SECTION("output:")},
        {DS4_OPT_FLAG("--plain", &o->plain, "one line per question instead of the split-screen UI"),
         .def_text = "the UI on a terminal"},
        {DS4_OPT_U32("--pause-ms", "N", &o->pause_ms, 0, 60000, 350, "pause after each result in the UI")},
        {DS4_OPT_STR("--trace", "FILE", &o->trace, NULL, "questions, replies and grading decisions"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_STR("--json", "FILE", &o->json_out, NULL, "the report as JSON (for --compare)"), .flags = DS4_OPT_OUT},
        {DS4_OPT_STR("--compare", "A.json", &o->compare, NULL,
                     "compare report A with report B (the FILE argument): which questions flipped"),
         .flags = DS4_OPT_IN},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-eval",
                   .usage = "[options] QUESTIONS.jsonl | --compare A.json B.json",
                   .about = ABOUT,
                   .opts = table,
                   .notes = NOTES,
                   .refused = refused};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (o->compare) return -1;
    if (ds4_cli_check_backend(&cli, o->backend) != 0 || ds4_cli_steering_check(&cli, &o->steer) != 0) return 2;
    if (o->hard_budget >= o->max_tokens)
        return ds4_cli_usage(&cli, "--hard-limit-reply-budget %u must be below --tokens %u", o->hard_budget,
                             o->max_tokens);
    if (!soft_given && o->soft_budget < o->hard_budget) o->soft_budget = o->hard_budget;
    if (o->hard_budget > o->soft_budget)
        return ds4_cli_usage(&cli, "--hard-limit-reply-budget %u must be at most --soft-limit-reply-budget %u",
                             o->hard_budget, o->soft_budget);
    return -1;
}

int eval_main(int argc, char **argv, const eval_hooks *hooks) {
    eval_opts o;
    const char *path = NULL;
    int prc = parse_args(argc, argv, &o, &path);
    if (prc >= 0) return prc;
    ds4_err err = {0};
    if (o.compare) {
        if (eval_compare(o.compare, path, stdout, &err)) {
            fprintf(stderr, "ds4-eval: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    eval_set set = {0};
    if (eval_set_load(&set, path, &err)) {
        fprintf(stderr, "ds4-eval: %s\n", err.msg);
        eval_set_free(&set);
        return 1;
    }
    size_t loaded = set.n; /* the questions past --questions are freed with the rest */
    if (o.n_questions && o.n_questions < set.n) set.n = o.n_questions;
    int lrc = ds4_startup_lock("ds4-eval");
    if (lrc) {
        eval_set_free(&set);
        return lrc;
    }
    int rc = 1;
    FILE *trace = NULL;
    eval_result *res = calloc(set.n, sizeof(*res));
    eval_runner *r = res ? eval_runner_new(&o, hooks, &set, &err) : NULL;
    if (!r) {
        fprintf(stderr, "ds4-eval: %s\n", res ? err.msg : "out of memory");
        goto done;
    }
    if (o.trace && !(trace = fopen(o.trace, "w"))) {
        fprintf(stderr, "ds4-eval: cannot write %s\n", o.trace);
        goto done;
    }
    bool ui = !o.plain && isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    rc = ui ? eval_tui(r, &o, &set, res, trace) : eval_plain(r, &o, &set, res, trace);
    eval_report_print(stdout, &set, res);
    if (o.json_out && eval_report_json(o.json_out, &set, res, o.model, &err)) {
        fprintf(stderr, "ds4-eval: %s\n", err.msg);
        rc = 1;
    }
done:
    if (trace) fclose(trace);
    eval_runner_free(r);
    free(res);
    set.n = loaded;
    eval_set_free(&set);
    return rc;
}
