/*
 * test_agent.c - ds4-agent's core against a scripted model: the real
 * engine on a tiny random model with DeepSeek V4's tokenizer
 * (tests/agent/model.sh), the real DSML parser, tools, transcript and KV
 * files, with each model round's text forced by a script
 * (tests/agent/script.h) so the output is known.
 *
 * Covered: every tool and its error paths (unseen or changed lines,
 * ambiguous old/new, binary files, paths outside the root and through
 * symlinks, bad arguments, job timeout and stop, runaway output), bad DSML
 * and DSML inside the reasoning, the permission policy, compaction at both
 * triggers (with a running job re-announced), sessions (save replaces its
 * older prefixes, list, switch with zero tokens prefilled, history,
 * corrupt and foreign files skipped), the queue closing a tool round
 * unrun, and interruption.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "engine/kvcache.h"
#include "script.h"
#include "tools.h"

#define EOS       "<｜end▁of▁sentence｜>"
#define DIR_BASE  "build/agent-test"
#define SYS_CACHE DIR_BASE "/syscache"

static char MODEL[512];

typedef struct harness {
    agent_opts o;
    agent_link *l;
    display *d;
    agent_model *m;
    agent *a;
    agent_script s;
    agent_hooks hooks;
    char root[256], kv[256];
    ds4_strbuf out;
    /* answers to permission questions, taken by a responder thread */
    const char *answers;
    int answered;
    pthread_t resp;
    volatile int stop;
} harness;

/* ------------------------------------------------------------ helpers */

static void sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    if (system(cmd) != 0) fail_msg("command failed: %s", cmd);
}

static void put(harness *t, const char *rel, const char *content) {
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", t->root, rel);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    fwrite(content, 1, strlen(content), f);
    fclose(f);
}

static char *get(harness *t, const char *rel) {
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", t->root, rel);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

/* A DSML tool-call block after the text `pre`: one or more invokes, each
 * a name, key/value pairs and NULL; a second NULL ends the block.  A value
 * starting with '#' is written with string="false" (numbers, booleans). */
static char *block(char *buf, size_t n, const char *pre, ...) {
    size_t o = (size_t)snprintf(buf, n, "%s\n\n<｜DSML｜tool_calls>\n", pre);
    va_list ap;
    va_start(ap, pre);
    const char *name;
    while ((name = va_arg(ap, const char *))) {
        o += (size_t)snprintf(buf + o, n - o, "<｜DSML｜invoke name=\"%s\">\n", name);
        const char *k;
        while ((k = va_arg(ap, const char *))) {
            const char *v = va_arg(ap, const char *);
            bool raw = v[0] == '#';
            o += (size_t)snprintf(buf + o, n - o,
                                  "<｜DSML｜parameter name=\"%s\" string=\"%s\">%s</｜DSML｜parameter>\n", k,
                                  raw ? "false" : "true", raw ? v + 1 : v);
        }
        o += (size_t)snprintf(buf + o, n - o, "</｜DSML｜invoke>\n");
    }
    va_end(ap);
    snprintf(buf + o, n - o, "</｜DSML｜tool_calls>");
    return buf;
}

static void say(harness *t, const char *text) { agent_script_add(&t->s, text); }

/* One round calling the tools listed: CALLS(t, "read", "path", "a", END, "list", END) */
#define END NULL
/* clang-format off */
#define CALLS(t, ...)                                                      \
    do {                                                                   \
        char b_[16384];                                                    \
        say(t, block(b_, sizeof(b_), "Working on it.", __VA_ARGS__, NULL)); \
    } while (0)
/* clang-format on */

static void *responder(void *arg) {
    harness *t = arg;
    while (!t->stop) {
        char q[700], ch[16];
        if (link_question(t->l, q, sizeof(q), ch, sizeof(ch))) {
            char a = t->answers && t->answers[t->answered] ? t->answers[t->answered++] : 'n';
            link_answer(t->l, a);
        }
        usleep(2000);
    }
    return NULL;
}

static void open_h(harness *t, uint32_t ctx, int think, unsigned allow, const char *answers) {
    memset(t, 0, sizeof(*t));
    snprintf(t->root, sizeof(t->root), DIR_BASE "/rootXXXXXX");
    snprintf(t->kv, sizeof(t->kv), DIR_BASE "/kvXXXXXX");
    assert_non_null(mkdtemp(t->root));
    assert_non_null(mkdtemp(t->kv));
    /* the system prompt's KV, prefilled once for all the tests */
    sh("mkdir -p " SYS_CACHE " && for f in " SYS_CACHE "/*.kv; do [ -f \"$f\" ] && cp \"$f\" %s/; done; true", t->kv);
    t->o = (agent_opts){.model = MODEL,
                        .ctx = ctx,
                        .n_tokens = 2000,
                        .system = AGENT_DEFAULT_SYSTEM,
                        .think = think,
                        .root = t->root,
                        .kv_dir = t->kv,
                        .allow = allow,
                        .backend = "cpu",
                        .threads = 2};
    ds4_sampler_defaults(&t->o.sampling);
    t->o.sampling.temperature = 0; /* what is not scripted is greedy: reproducible */
    t->hooks = (agent_hooks){.script_next = agent_script_next, .script_ctx = &t->s};
    assert_non_null(t->l = link_new());
    assert_non_null(t->d = display_new(t->l, false));
    t->answers = answers;
    if (answers) pthread_create(&t->resp, NULL, responder, t);
    else link_set_no_ui(t->l, true);
    ds4_err err = {0};
    t->m = local_model_new(&t->o, &t->hooks, t->l, t->d,
                           getenv("AGENT_TRACE") ? fopen(getenv("AGENT_TRACE"), "a") : NULL, &err);
    if (!t->m) fail_msg("%s", err.msg);
    t->a = agent_new(&t->o, t->m, t->l, t->d, NULL, &err);
    if (!t->a) fail_msg("%s", err.msg);
    assert_int_equal(agent_start(t->a), 0);
    sh("cp -n %s/*.kv " SYS_CACHE "/ 2>/dev/null; true", t->kv);
}

static void take(harness *t) { link_take_output(t->l, &t->out); }

static void close_h(harness *t) {
    if (getenv("AGENT_TEST_VERBOSE")) {
        take(t);
        fprintf(stderr, "----- shown:\n%s\n-----\n", t->out.p ? t->out.p : "");
    }
    t->stop = 1;
    if (t->answers) pthread_join(t->resp, NULL);
    agent_free(t->a);
    t->m->ops->free(t->m);
    display_free(t->d);
    link_free(t->l);
    agent_script_free(&t->s);
    ds4_strbuf_free(&t->out);
    sh("rm -rf %s %s", t->root, t->kv);
}

static void turn(harness *t, const char *text) {
    assert_int_equal(agent_turn(t->a, text), 0);
    take(t);
}

/* The k-th tool result of the transcript (from 0; the <tool_result>
 * blocks of every tool turn, in order). */
static const char *result(harness *t, size_t k) {
    static char buf[1 << 16];
    json_t *msgs = t->m->ops->messages(t->m, NULL);
    size_t seen = 0;
    const char *r = NULL;
    for (size_t i = 0; i < json_array_size(msgs) && !r; i++) {
        const json_t *m = json_array_get(msgs, i);
        if (strcmp(json_string_value(json_object_get(m, "role")), "tool")) continue;
        const char *c = json_string_value(json_object_get(m, "content"));
        while (!r && (c = strstr(c, "<tool_result>"))) {
            c += strlen("<tool_result>");
            const char *e = strstr(c, "</tool_result>");
            if (!e) break;
            if (seen++ == k) {
                snprintf(buf, sizeof(buf), "%.*s", (int)(e - c), c);
                r = buf;
            }
            c = e;
        }
    }
    json_decref(msgs);
    if (!r) fail_msg("no tool result %zu", k);
    return r;
}

static void has(const char *s, const char *part) {
    if (!s || !strstr(s, part)) fail_msg("expected \"%s\" in:\n%s", part, s ? s : "(null)");
}

static void lacks(const char *s, const char *part) {
    if (s && strstr(s, part)) fail_msg("did not expect \"%s\" in:\n%s", part, s);
}

/* ------------------------------------------------------------ tools */

static void test_read_edit_lines(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    put(&t, "f.c", "one\ntwo\nthree\nfour\nfive\n");
    CALLS(&t, "read", "path", "f.c", END, "edit", "path", "f.c", "line", "#2", "new", "TWO", END, "edit", "path", "f.c",
          "range", "4:5", "new", "4\n5\n6", END, "edit", "path", "f.c", "old", "three", "new", "3", END, "edit", "path",
          "f.c", "start_line", "#6", "end_line", "#6", "new", "", END);
    say(&t, "All done." EOS);
    turn(&t, "fix f.c");
    assert_string_equal(get(&t, "f.c"), "one\nTWO\n3\n4\n5\n");
    has(result(&t, 0), "f.c: lines 1-5 of 5\n1\tone\n2\ttwo\n");
    has(result(&t, 1), "Edited f.c (lines): lines 2-2 replaced by 1 line; the file has 5 lines.");
    has(result(&t, 2), "lines 4-5 replaced by 3 lines; the file has 6 lines.\nLines after 5 moved by +1");
    has(result(&t, 3), "Edited f.c (old/new): lines 3-3 replaced by 1 line");
    has(result(&t, 4), "(deleted): lines 6-6 replaced by 0 lines; the file has 5 lines.");
    has(t.out.p, "- two"); /* the diff shown to the user */
    has(t.out.p, "+ TWO");
    has(t.out.p, "All done.");
    close_h(&t);
}

/* Lines not shown, changed on disk, or shifted by an edit are refused;
 * old/new must match once. */
static void change_file(void *ctx, size_t index) {
    harness *t = ctx;
    if (index == 1) put(t, "g.txt", "alpha\nBETA\ngamma\nalpha\n");
}

static void test_edit_refusals(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    t.s.on_next = change_file;
    t.s.ctx = &t;
    put(&t, "g.txt", "alpha\nbeta\ngamma\nalpha\n");
    put(&t, "h.txt", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n");
    CALLS(&t, "edit", "path", "g.txt", "line", "#1", "new", "x", END,         /* never read */
          "read", "path", "g.txt", "max_lines", "#3", END);                   /* the file changes after this */
    CALLS(&t, "edit", "path", "g.txt", "line", "#2", "new", "x", END,         /* changed on disk */
          "edit", "path", "g.txt", "line", "#4", "new", "x", END,             /* line 4 never shown */
          "edit", "path", "g.txt", "old", "alpha", "new", "x", END,           /* twice */
          "edit", "path", "g.txt", "old", "delta", "new", "x", END,           /* absent */
          "edit", "path", "g.txt", "line", "#9", "new", "x", END,             /* past the end */
          "edit", "path", "g.txt", "line", "#1", "old", "a", "new", "x", END, /* two modes */
          "edit", "path", "missing.txt", "old", "a", "new", "b", END, "read", "path", "h.txt", END, "edit", "path",
          "h.txt", "range", "1:1", "new", "a1\na2", END,           /* lines below move */
          "edit", "path", "h.txt", "line", "#9", "new", "x", END); /* shifted: read again */
    say(&t, "Stopping." EOS);
    turn(&t, "edit g.txt");
    has(result(&t, 0), "Tool error: edit g.txt: lines 1-1 were never shown to you");
    has(result(&t, 2), "Tool error: edit g.txt: line 2 changed since you read it");
    has(result(&t, 3), "line 4 was not shown to you");
    has(result(&t, 4), "Tool error: edit g.txt: old text occurs 2 times (at lines 1, 4)");
    has(result(&t, 5), "Tool error: edit g.txt: old text not found");
    has(result(&t, 6), "line 9 does not exist, the file has 4 lines");
    has(result(&t, 7), "give only one of line, start_line/end_line, range, old");
    has(result(&t, 8), "Tool error: edit missing.txt:");
    has(result(&t, 8), "(use write to create a file)");
    has(result(&t, 10), "Lines after 1 moved by +1");
    has(result(&t, 11), "line 9 was not shown to you since the file last changed");
    assert_string_equal(get(&t, "g.txt"), "alpha\nBETA\ngamma\nalpha\n");
    assert_string_equal(get(&t, "h.txt"), "a1\na2\n2\n3\n4\n5\n6\n7\n8\n9\n10\n");
    close_h(&t);
}

static void test_paths_binary_search_list(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    sh("mkdir -p %s/sub %s/.git && ln -s /etc %s/etc-link && printf 'a\\0b' > %s/bin.dat", t.root, t.root, t.root,
       t.root);
    put(&t, "a.txt", "first\nthe needle here\nlast\n");
    put(&t, "sub/b.c", "int needle;\nint neeedle;\n");
    put(&t, ".git/c", "needle in git\n");
    CALLS(&t, "read", "path", "etc-link/passwd", END, "read", "path", "../outside.txt", END, "write", "path",
          "/tmp/ds4-agent-test-outside", "content", "x", END, "read", "path", "bin.dat", END, "search", "query",
          "needle", END, "search", "query", "needle", "glob", "*.c", END, "search", "query", "ne+dle", "mode", "regex",
          "path", "sub", END, "search", "query", "NEEDLE", "case_sensitive", "#false", "context", "#1", "path", "a.txt",
          END, "search", "query", "(", "mode", "regex", END, "list", "path", ".", END, "write", "path", "new/dir/x.txt",
          "content", "hello\n", END, "edit", "path", "sub/b.c", "line", "#2", "new", "int needle2;",
          END); /* shown by search */
    say(&t, "Done." EOS);
    turn(&t, "look around");
    has(result(&t, 0), "etc-link/passwd resolves to /etc/passwd, outside the working root");
    has(result(&t, 1), "../outside.txt is outside the working root");
    has(result(&t, 2), "/tmp/ds4-agent-test-outside is outside the working root");
    assert_int_equal(access("/tmp/ds4-agent-test-outside", F_OK), -1);
    has(result(&t, 3), "it is a binary file (3 bytes)");
    const char *s = result(&t, 4);
    has(s, "2 matches in 2 files");
    has(s, "1 binary files skipped");
    has(s, "a.txt:2\tthe needle here");
    has(s, "sub/b.c:1\tint needle;");
    lacks(s, ".git");
    s = result(&t, 5);
    has(s, "1 match in 1 file");
    lacks(s, "a.txt");
    s = result(&t, 6);
    has(s, "2 matches");
    has(s, "sub/b.c:2\tint neeedle;");
    s = result(&t, 7);
    has(s, "a.txt-1\tfirst\na.txt:2\tthe needle here\na.txt-3\tlast");
    has(result(&t, 8), "Tool error: search: bad regular expression");
    s = result(&t, 9);
    has(s, "d .git/");
    has(s, "- a.txt 27");
    has(s, "l etc-link -> /etc");
    has(s, "d sub/");
    has(result(&t, 10), "Created new/dir/x.txt: 6 bytes, 1 lines");
    assert_string_equal(get(&t, "new/dir/x.txt"), "hello\n");
    has(result(&t, 11), "Edited sub/b.c (lines)");
    assert_string_equal(get(&t, "sub/b.c"), "int needle;\nint needle2;\n");
    close_h(&t);
}

static void test_tool_arguments(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    put(&t, "a.txt", "1\n2\n3\n4\n5\n");
    CALLS(&t, "frobnicate", "x", "1", END, "read", "path", "a.txt", "foo", "1", END, "read", "start_line", "#1", END,
          "read", "path", "a.txt", "start_line", "abc", END, "read", "path", "a.txt", "whole", "maybe", END, "read",
          "path", "#12", END, "bash", "command", "true", "timeout_sec", "#0", END, "search", "query", "x", "context",
          "#9", END, "read", "path", "a.txt", "max_lines", "#2", END, /* string="false" numbers are fine */
          "more", "count", "2", END,                                  /* and so are numbers in strings */
          "more", END, "more", END);
    say(&t, "ok" EOS);
    turn(&t, "args");
    has(result(&t, 0),
        "Tool error: unknown tool 'frobnicate' (the tools are: read, more, write, edit, search, list, bash");
    has(result(&t, 1),
        "Tool error: read: unknown argument 'foo' (read takes: path, start_line, max_lines, whole, raw)");
    has(result(&t, 2), "Tool error: read: missing required argument 'path'");
    has(result(&t, 3), "Tool error: read: argument 'start_line' must be an integer, got the string \"abc\"");
    has(result(&t, 4), "Tool error: read: argument 'whole' must be true or false, got the string \"maybe\"");
    has(result(&t, 5), "Tool error: read: argument 'path' must be a string (string=\"true\"), got a number");
    has(result(&t, 6), "Tool error: bash: timeout_sec must be 1 to 86400, not 0");
    has(result(&t, 7), "Tool error: search: context must be 0 to 5, not 9");
    has(result(&t, 8), "a.txt: lines 1-2 of 5; continue_offset=3");
    has(result(&t, 9), "a.txt: lines 3-4 of 5; continue_offset=5");
    has(result(&t, 10), "a.txt: lines 5-5 of 5\n5\t5");
    has(result(&t, 11), "Tool error: more: nothing to continue");
    close_h(&t);
}

static void test_bad_dsml(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_HIGH, AGENT_ALLOW_ALL, NULL);
    char b[2048];
    /* a tool call written inside the reasoning */
    say(&t, block(b, sizeof(b), "Let me think.", "list", "path", ".", END, NULL));
    /* an invoke without a name */
    say(&t,
        "Done thinking.</think>Calling.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>");
    /* a correct one, after the reasoning */
    say(&t, block(b, sizeof(b), "Fine.</think>Now properly.", "list", "path", ".", END, NULL));
    say(&t, "Good.</think>Listed." EOS);
    turn(&t, "list it");
    has(result(&t, 0), "Tool error: invalid DSML tool call: tool calls are not allowed inside <think></think>");
    has(result(&t, 1), "Tool error: invalid DSML tool call: malformed tool call block");
    has(result(&t, 1), "invoke without a name");
    has(result(&t, 2), ": 0 entries");
    has(t.out.p, "Listed.");
    /* the reasoning of the first round was closed for the transcript */
    json_t *msgs = t.m->ops->messages(t.m, NULL);
    const json_t *a0 = json_array_get(msgs, 1);
    assert_string_equal(json_string_value(json_object_get(a0, "role")), "assistant");
    has(json_string_value(json_object_get(a0, "reasoning_content")), "Let me think.");
    json_decref(msgs);
    close_h(&t);
}

static void test_permissions(void **state) {
    (void)state;
    harness t;
    /* answers: no to the bash, yes to the write, always to the edits */
    open_h(&t, 8192, DS4_THINK_OFF, 0, "nya");
    put(&t, "a.txt", "x\n");
    CALLS(&t, "bash", "command", "touch ran", END, "write", "path", "w.txt", "content", "w", END, "read", "path",
          "a.txt", END, "edit", "path", "a.txt", "line", "#1", "new", "y", END, "edit", "path", "a.txt", "line", "#1",
          "new", "z", END); /* no question: always */
    say(&t, "ok" EOS);
    turn(&t, "go");
    has(result(&t, 0), "Tool error: the user declined this bash");
    assert_null(get(&t, "ran"));
    has(result(&t, 1), "Created w.txt");
    has(result(&t, 3), "Edited a.txt");
    has(result(&t, 4), "Edited a.txt");
    assert_string_equal(get(&t, "a.txt"), "z\n");
    assert_int_equal(t.answered, 3);
    close_h(&t);
    /* nobody to ask: refused with a way out */
    open_h(&t, 8192, DS4_THINK_OFF, AGENT_ALLOW_WRITE, NULL);
    CALLS(&t, "bash", "command", "touch ran", END, "write", "path", "w.txt", "content", "w", END);
    say(&t, "ok" EOS);
    turn(&t, "go");
    has(result(&t, 0), "bash needs the user's permission and no one can answer here");
    has(result(&t, 0), "--allow bash");
    assert_null(get(&t, "ran"));
    has(result(&t, 1), "Created w.txt");
    close_h(&t);
}

static void test_bash_jobs(void **state) {
    (void)state;
    harness t;
    open_h(&t, 16384, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    CALLS(&t, "bash", "command", "echo hi; echo err >&2; exit 3", END, "bash", "command", "sleep 1.5; echo late",
          "refresh_sec", "#1", END, "bash_status", "job", "#2", "refresh_sec", "#10", END, "bash", "command",
          "sleep 60 & sleep 60; echo never", "refresh_sec", "#1", END, "bash_stop", "job", "#3", END, "bash", "command",
          "sleep 30", "timeout_sec", "#1", "refresh_sec", "#10", END, "bash", "command",
          "yes 0123456789abcdef | head -c 20000000", END, "bash_status", "job", "#99", END, "bash_status", "job", "#1",
          END, "bash", "command", "pwd", END);
    say(&t, "ok" EOS);
    turn(&t, "run things");
    const char *r = result(&t, 0);
    has(r, "bash job=1 pid=");
    has(r, "status=done");
    has(r, "exit_status=3");
    has(r, "<output>\nhi\nerr\n</output>");
    r = result(&t, 1);
    has(r, "bash job=2");
    has(r, "status=running");
    has(r, "bash_status job=2 to look again");
    r = result(&t, 2);
    has(r, "status=done");
    has(r, "exit_status=0");
    has(r, "late");
    r = result(&t, 4);
    has(r, "bash job=3");
    has(r, "stopped=true");
    has(r, "exit_status=143");
    lacks(r, "never");
    r = result(&t, 5);
    has(r, "timed_out=true (killed after 1 s)");
    r = result(&t, 6);
    has(r, "output: 19.1 MiB, 1176471 lines");
    has(r, "<head lines=100>");
    has(r, "<tail lines=20>");
    assert_true(strlen(r) < 20000); /* bounded, whatever the command printed */
    has(result(&t, 7), "Tool error: bash_status: no bash job 99");
    has(result(&t, 8), "no bash job 1 (ended jobs are forgotten once reported)");
    has(result(&t, 9), t.root + strlen(DIR_BASE) + 1); /* runs in the root */
    close_h(&t);
}

/* ------------------------------------------------------------ compaction */

/* A long answer: n words. */
static char *words(int n, const char *end) {
    ds4_strbuf b = {0};
    for (int i = 0; i < n; i++) ds4_strbuf_printf(&b, "word%d ", i % 97);
    ds4_strbuf_puts(&b, end);
    return ds4_strbuf_take(&b, NULL);
}

/* A long prompt: a label and n words (two tokens each), so the context
 * fills by prefill, which is fast, rather than by generation. */
static char *long_prompt(const char *label, int n) {
    char *w = words(n, "");
    ds4_strbuf b = {0};
    ds4_strbuf_printf(&b, "%s: %s", label, w);
    free(w);
    return ds4_strbuf_take(&b, NULL);
}

/* Every byte a job wrote is in its observation once it is done: the pump
 * once reaped a job between two reads of its pipe and dropped what the
 * pipe still held (up to 64 KiB: `yes | head -c 20000000` came out 48 KB
 * short on a loaded machine, in test_bash_jobs).  The race needs the pump
 * preempted between a read and its reaping, so this is a stress of the
 * path, not a reproduction: 300,000 bytes of 17-byte lines, many times,
 * beside jobs that keep the CPUs busy: 17,648 lines each. */
static void test_job_output_complete(void **state) {
    (void)state;
    ds4_err err = {0};
    jobs *j = jobs_new(&err);
    assert_non_null(j);
    int short_ones = 0, busy[4];
    for (int i = 0; i < 4; i++) {
        int pid = 0;
        assert_int_equal(jobs_start(j, "while :; do :; done", "/tmp", 60, &busy[i], &pid, &err), 0);
    }
    for (int i = 0; i < 60; i++) {
        int id = 0, pid = 0;
        assert_int_equal(jobs_start(j, "yes 0123456789abcdef | head -c 300000", "/tmp", 30, &id, &pid, &err), 0);
        jobs_wait(j, id, 30, NULL);
        char *shown = NULL;
        bool failed = false;
        char *obs = jobs_observe(j, id, &shown, &failed);
        assert_non_null(obs);
        if (!strstr(obs, "status=done") || !strstr(obs, ", 17648 lines")) {
            if (!short_ones++) fprintf(stderr, "job %d: %.200s\n", i, obs);
        }
        free(obs);
        free(shown);
    }
    for (int i = 0; i < 4; i++) jobs_stop(j, busy[i]);
    jobs_free(j);
    fprintf(stderr, "%d of 60 jobs' outputs short\n", short_ones);
    assert_int_equal(short_ones, 0);
}

static void test_compaction_soft(void **state) {
    (void)state;
    harness t;
    open_h(&t, 4096, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    /* a job that outlives the compaction */
    CALLS(&t, "bash", "command", "sleep 20", "refresh_sec", "#1", END);
    say(&t, "ok." EOS);
    say(&t, "ok." EOS);
    say(&t, "ok." EOS);
    say(&t, "SUMMARY: the user asked three questions; a sleep job runs." EOS); /* the compaction */
    say(&t, "After compaction." EOS);
    char *q1 = long_prompt("question one", 250), *q2 = long_prompt("question two", 250),
         *q3 = long_prompt("question three", 250);
    turn(&t, q1);
    uint32_t u1 = t.m->ops->used(t.m);
    turn(&t, q2);
    turn(&t, q3);
    free(q1);
    free(q2);
    free(q3);
    uint32_t before = t.m->ops->used(t.m);
    assert_true(before * 100 >= 4096u * 75); /* past the free-space trigger (ctx/4) */
    lacks(t.out.p, "COMPACTING");
    uint64_t pre = t.m->ops->prefilled(t.m);
    turn(&t, "question four");
    has(t.out.p, "COMPACTING");
    has(t.out.p, "SUMMARY: the user asked");
    uint32_t after = t.m->ops->used(t.m);
    assert_true(after < before);
    assert_true(after < u1 + 200);
    /* the summary replaced the old turns; the last turn is verbatim */
    json_t *msgs = t.m->ops->messages(t.m, NULL);
    char *dump = json_dumps(msgs, 0);
    lacks(dump, "question one");
    has(dump, "question four");
    has(dump, "After compaction.");
    has(dump, "these bash jobs are still running");
    free(dump);
    json_decref(msgs);
    /* the KV was rebuilt from the saved system prompt: only the request,
     * the summary and the tail were prefilled */
    assert_true(t.m->ops->prefilled(t.m) - pre < 1000);
    close_h(&t);
}

static void test_compaction_hard(void **state) {
    (void)state;
    harness t;
    open_h(&t, 4096, DS4_THINK_OFF, AGENT_ALLOW_ALL, NULL);
    ds4_strbuf f = {0};
    for (int i = 0; i < 400; i++) ds4_strbuf_printf(&f, "lorem ipsum dolor sit amet %d\n", i);
    put(&t, "big.txt", f.p);
    ds4_strbuf_free(&f);
    say(&t, "ok." EOS);
    /* ~1100 tokens: too many with the first turn, fine without it */
    CALLS(&t, "read", "path", "big.txt", "max_lines", "#100", END);
    say(&t, "SUMMARY one." EOS);
    CALLS(&t, "read", "path", "big.txt", "max_lines", "#400", END); /* ~4400 tokens: never fits */
    say(&t, "SUMMARY two." EOS);
    CALLS(&t, "read", "path", "big.txt", "whole", "#true", END); /* refused by read itself */
    say(&t, "done" EOS);
    char *q1 = long_prompt("one", 250); /* more than the tail keeps (ctx / 10) */
    turn(&t, q1);
    free(q1);
    uint32_t before = t.m->ops->used(t.m);
    turn(&t, "read it");
    has(t.out.p, "COMPACTING");
    has(t.out.p, "a tool result would not fit");
    has(result(&t, 0), "big.txt: lines 1-100 of 400");
    assert_true(t.m->ops->used(t.m) < before + 1300);
    has(result(&t, 1), "Tool error: the tool result was too large for the context");
    has(t.out.p, "tool result too large");
    has(result(&t, 2), "Tool error: read big.txt whole: 400 lines do not fit in the free context");
    json_t *msgs = t.m->ops->messages(t.m, NULL);
    char *dump = json_dumps(msgs, 0);
    lacks(dump, "one: word0");
    free(dump);
    json_decref(msgs);
    close_h(&t);
}

/* ------------------------------------------------------------ sessions */

static int count_kv(const char *dir, int reason) {
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls %s", dir);
    FILE *p = popen(cmd, "r");
    char name[256];
    int n = 0;
    while (p && fgets(name, sizeof(name), p)) {
        name[strcspn(name, "\n")] = 0;
        char path[900];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        ds4_kvc_file f;
        if (ds4_kvc_read(path, NULL, NULL, name, 1000, &f, NULL) == 0) {
            n += f.h.reason == reason;
            ds4_kvc_file_free(&f);
        }
    }
    if (p) pclose(p);
    return n;
}

static void command(harness *t, const char *line) {
    bool quit;
    assert_true(agent_command(t->a, line, &quit));
    take(t);
}

static void test_sessions(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_HIGH, AGENT_ALLOW_ALL, "n");
    say(&t, "Think.</think>First answer." EOS);
    say(&t, "Think more.</think>Second answer." EOS);
    say(&t, "Again.</think>Third answer." EOS);
    turn(&t, "first question");
    command(&t, "/save");
    assert_int_equal(count_kv(t.kv, DS4_KVC_AGENT_SESSION), 1);
    turn(&t, "second question");
    assert_true(agent_dirty(t.a));
    command(&t, "/save");
    /* the first save was a prefix of the second: replaced */
    assert_int_equal(count_kv(t.kv, DS4_KVC_AGENT_SESSION), 1);
    uint32_t saved = t.m->ops->used(t.m);
    has(t.out.p, "saved session ");
    const char *sv = strstr(t.out.p, "saved session ");
    sv = strstr(sv + 1, "saved session ");
    char id[9];
    memcpy(id, sv + 14, 8);
    id[8] = 0;
    /* the file: a KVC file keyed by the transcript text, which an
     * independent read checks against its tokens */
    char path[600], name[64];
    snprintf(name, sizeof(name), "%s", id);
    sh("ls %s | grep '^%s' > %s/name.txt", t.kv, id, t.root);
    char *nm = get(&t, "name.txt");
    nm[strcspn(nm, "\n")] = 0;
    snprintf(path, sizeof(path), "%s/%s", t.kv, nm);
    ds4_kvc_file f;
    ds4_err err = {0};
    if (ds4_kvc_read(path, NULL, NULL, nm, 1000, &f, &err) != 0) fail_msg("%s", err.msg);
    assert_int_equal(f.h.reason, DS4_KVC_AGENT_SESSION);
    assert_int_equal(f.h.n_tokens, saved);
    has(f.text, "<｜User｜>first question<｜Assistant｜><think>Think.</think>First answer.<｜end▁of▁sentence｜>");
    has(f.text,
        "<｜User｜>second question<｜Assistant｜><think>Think more.</think>Second answer.<｜end▁of▁sentence｜>");
    ds4_kvc_file_free(&f);
    /* a corrupt file and a foreign one are skipped */
    sh("printf 'KVC garbage' > %s/0000000000000000000000000000000000000000.kv", t.kv);
    command(&t, "/list");
    has(t.out.p, "skipping 00000000:");
    has(t.out.p, "first question");
    /* a fresh session, then back: nothing prefilled */
    command(&t, "/new"); /* not dirty: no question */
    assert_int_equal(t.answered, 0);
    assert_false(t.m->ops->has_user(t.m));
    uint64_t pre = t.m->ops->prefilled(t.m);
    char sw[64];
    snprintf(sw, sizeof(sw), "/switch %s", id);
    command(&t, sw);
    assert_int_equal(t.m->ops->prefilled(t.m), pre);
    assert_int_equal(t.m->ops->used(t.m), saved);
    has(t.out.p, "nothing prefilled");
    has(t.out.p, "› second question");
    /* the next turn prefills only its own tokens */
    turn(&t, "third question");
    assert_true(t.m->ops->prefilled(t.m) - pre < 20);
    command(&t, "/history 1");
    const char *h = strrchr(t.out.p, '/');
    has(h, "› third question");
    has(h, "Third answer.");
    lacks(h, "second question");
    /* switching away from a changed session asks to save it: "n" */
    command(&t, sw);
    assert_int_equal(t.answered, 1);
    command(&t, "/switch 0000");
    has(t.out.p, "no saved session starts with 0000");
    command(&t, "/switch zz");
    has(t.out.p, "'zz' is not a session id");
    /* a session of another quantization is refused */
    sh("printf '\\004' | dd of=%s bs=1 seek=4 conv=notrunc 2>/dev/null", path);
    command(&t, sw);
    has(t.out.p, "was written by a 4-bit model, this one is 2-bit");
    close_h(&t);
}

/* ------------------------------------------------------------ queue, interrupt */

static void queue_then_interrupt(void *ctx, size_t index) {
    harness *t = ctx;
    if (index == 0) link_queue_push(t->l, "the queued prompt");
    if (index == 2) link_interrupt(t->l);
}

static void test_queue_and_interrupt(void **state) {
    (void)state;
    harness t;
    open_h(&t, 8192, DS4_THINK_HIGH, AGENT_ALLOW_ALL, NULL);
    t.s.on_next = queue_then_interrupt;
    t.s.ctx = &t;
    char b[2048];
    say(&t, block(b, sizeof(b), "Plan.</think>Running it.", "bash", "command", "touch ran", END, NULL));
    say(&t, "Ok.</think>Answering the queued prompt." EOS);
    char *w = words(200, EOS);
    say(&t, w);
    free(w);
    say(&t, "Fine.</think>After the interruption." EOS);
    ds4_err err = {0};
    worker *wk = worker_start(t.a, t.l, &err);
    assert_non_null(wk);
    link_queue_push(t.l, "first prompt");
    /* the first turn closes its round unrun, the queued prompt follows */
    for (int i = 0; i < 1000 && (link_busy(t.l) || link_queue_len(t.l) || t.s.next < 2); i++) usleep(10000);
    link_queue_push(t.l, "interrupt me");
    for (int i = 0; i < 1000 && (link_busy(t.l) || link_queue_len(t.l) || t.s.next < 3); i++) usleep(10000);
    link_queue_push(t.l, "after");
    for (int i = 0; i < 1000 && (link_busy(t.l) || link_queue_len(t.l) || t.s.next < 4); i++) usleep(10000);
    link_queue_push(t.l, "/quit");
    worker_join(wk);
    take(&t);
    assert_null(get(&t, "ran"));
    has(result(&t, 0), "Tool call not run: the user sent a new message, which follows.");
    has(t.out.p, "not run: a queued prompt goes first");
    json_t *msgs = t.m->ops->messages(t.m, NULL);
    char *dump = json_dumps(msgs, 0);
    /* the queued prompt joins the turn of the unrun results */
    has(dump, "</tool_result>\\n\\nthe queued prompt");
    has(dump, "Answering the queued prompt.");
    has(dump, "After the interruption.");
    lacks(dump, "word5 "); /* the interrupted round produced nothing */
    free(dump);
    json_decref(msgs);
    has(t.out.p, "interrupted");
    close_h(&t);
}

static int setup(void **state) {
    (void)state;
    FILE *p = popen("sh tests/agent/model.sh", "r");
    if (!p || !fgets(MODEL, sizeof(MODEL), p)) {
        fprintf(stderr, "test_agent: tests/agent/model.sh failed\n");
        if (p) pclose(p);
        return -1;
    }
    pclose(p);
    MODEL[strcspn(MODEL, "\n")] = 0;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_edit_lines),
        cmocka_unit_test(test_edit_refusals),
        cmocka_unit_test(test_paths_binary_search_list),
        cmocka_unit_test(test_tool_arguments),
        cmocka_unit_test(test_bad_dsml),
        cmocka_unit_test(test_permissions),
        cmocka_unit_test(test_bash_jobs),
        cmocka_unit_test(test_job_output_complete),
        cmocka_unit_test(test_compaction_soft),
        cmocka_unit_test(test_compaction_hard),
        cmocka_unit_test(test_sessions),
        cmocka_unit_test(test_queue_and_interrupt),
    };
    /* AGENT_TEST=NAME runs one test; AGENT_TEST_VERBOSE=1 prints what each
     * showed the user; AGENT_TRACE=FILE appends the --trace lines */
    cmocka_set_test_filter(getenv("AGENT_TEST") ? getenv("AGENT_TEST") : "*");
    return cmocka_run_group_tests(tests, setup, NULL);
}
