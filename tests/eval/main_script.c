/*
 * main_script.c - ds4-eval with scripted answers, for tests/suite/eval.sh:
 *
 *   ds4-eval-script SCRIPT.json [ds4-eval options] QUESTIONS.jsonl
 *
 * SCRIPT.json maps question ids to the exact text of their replies
 * (special tokens included, e.g. "<think>...</think>Answer: B"); the whole
 * program runs (rendering, prefill, generation through the model, budget
 * controls, grading, UI, report) with the reply's tokens forced.  A
 * question without an entry is answered by the model.  Only the tests
 * build this.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "eval.h"

static const char *script_for(void *ctx, const char *id) {
    json_t *v = json_object_get((json_t *)ctx, id);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ds4-eval-script SCRIPT.json [ds4-eval options]\n");
        return 2;
    }
    json_error_t je;
    json_t *script = json_load_file(argv[1], 0, &je);
    if (!json_is_object(script)) {
        fprintf(stderr, "ds4-eval-script: %s: %s\n", argv[1], script ? "not a JSON object" : je.text);
        json_decref(script);
        return 2;
    }
    eval_hooks h = {script_for, script};
    argv[1] = argv[0];
    int rc = eval_main(argc - 1, argv + 1, &h);
    json_decref(script);
    return rc;
}
