/*
 * ds4-imatrix-dataset - builds an imatrix calibration set: prompt sources
 * rendered through the model's real chat template into the dataset format
 * that `ds4-imatrix` and `ds4 --imatrix-dataset` read (and ds4's imatrix
 * tools: the same marker lines), with a manifest of what went in.
 *
 *   ds4-imatrix-dataset -o DIR [options] INPUT...
 *
 * An INPUT is one of:
 *   *.jsonl  conversations, one JSON object a line:
 *            {"messages": [...], "tools": [...], "category": "...",
 *             "source": "...", "license": "..."}
 *            (messages and tools as in the OpenAI chat API; an assistant
 *            turn may carry tool_calls and a tool turn their result, so
 *            the set holds DSML tool calls and results as agents send them);
 *   a code file (by extension: .c .h .cc .cpp .cu .py .go .rs .js .ts .java
 *            .sh .rb .lua .zig ...): cut into chunks of at most
 *            --chunk-bytes at line ends, each asked about in a user turn
 *            (explain, review, test, document: chosen by the chunk's hash)
 *            with the code in a fenced block - long-context code;
 *   any other file: plain text, cut the same way, each chunk with a prose
 *            task (summarise, extract facts, rewrite, answer questions).
 * Every source is rendered in both modes the model runs in (--modes): ending
 * with "<｜Assistant｜><think>" (thinking) and "<｜Assistant｜></think>"
 * (non-thinking).  Identical renders are kept once.
 *
 * DIR gets:
 *   rendered_prompts.txt          every prompt, each after a line
 *                                 "===== DS4_IMATRIX_PROMPT ID CATEGORY MODE SOURCE ====="
 *   rendered_prompts_think.txt    the thinking ones only
 *   rendered_prompts_nothink.txt  the non-thinking ones only
 *   manifest.json                 counts and bytes per category and mode, a
 *                                 rough token estimate (bytes / 4), and every
 *                                 source with its licence
 */
#include <errno.h>
#include <jansson.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/opts.h"
#include "format/imatrix.h"
#include "text/chat.h"
#include "text/rendered.h"
#include "text/strbuf.h"

#define CHUNK_DEFAULT 24576u

typedef struct opts {
    const char *out_dir;
    const char *modes;   /* "both", "think", "nothink" */
    const char *license; /* of the file inputs (JSONL records carry theirs) */
    const char *system;  /* system message of the file prompts; "" for none */
    uint32_t chunk;      /* bytes of a code or text chunk */
    const char **inputs;
    size_t n_inputs;
} opts;

/* One rendered prompt. */
typedef struct record {
    char *id, *category, *mode, *source;
    char *text;
    size_t len;
    uint64_t hash;
} record;

typedef struct dataset {
    record *v;
    size_t n, cap;
    size_t duplicates;
    json_t *sources; /* [{"source", "category", "license"}] */
} dataset;

static int add_input(void *ctx, const char *value, ds4_err *err) {
    opts *o = ctx;
    const char **v = realloc(o->inputs, (o->n_inputs + 1) * sizeof(*v));
    if (!v) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    o->inputs = v;
    o->inputs[o->n_inputs++] = value;
    return 0;
}

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A marker field: no spaces or newlines (they separate the fields). */
static char *field(const char *s) {
    char *f = strdup(s && s[0] ? s : "-");
    for (char *p = f; p && *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') *p = '_';
    return f;
}

/* Render messages (+ tools) in one mode and keep the result unless an
 * identical render is already kept. */
static int add_render(dataset *d, const json_t *messages, const json_t *tools, bool think, const char *category,
                      const char *source, ds4_err *err) {
    ds4_chat_opts co = {.think = think ? DS4_THINK_HIGH : DS4_THINK_OFF,
                        .tools = tools && json_array_size(tools) ? tools : NULL};
    ds4_rendered r = {0};
    if (ds4_chat_render(messages, &co, &r, err) != 0 || ds4_rendered_check(&r, err) != 0) {
        ds4_rendered_free(&r);
        return -1;
    }
    uint64_t h = fnv1a(r.text.p, r.text.len);
    for (size_t i = 0; i < d->n; i++)
        if (d->v[i].hash == h && d->v[i].len == r.text.len && memcmp(d->v[i].text, r.text.p, r.text.len) == 0) {
            d->duplicates++;
            ds4_rendered_free(&r);
            return 0;
        }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        record *v = realloc(d->v, cap * sizeof(*v));
        if (!v) {
            ds4_rendered_free(&r);
            return ds4_err_set(err, DS4_ENOMEM, "out of memory");
        }
        d->v = v;
        d->cap = cap;
    }
    record *rec = &d->v[d->n++];
    char id[24];
    snprintf(id, sizeof(id), "%016llx", (unsigned long long)h);
    *rec = (record){.id = strdup(id),
                    .category = field(category),
                    .mode = strdup(think ? "think" : "nothink"),
                    .source = field(source),
                    .len = r.text.len,
                    .hash = h};
    size_t len;
    rec->text = ds4_strbuf_take(&r.text, &len);
    ds4_rendered_free(&r);
    if (!rec->id || !rec->category || !rec->mode || !rec->source || !rec->text)
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return 0;
}

static int add_both(dataset *d, const opts *o, const json_t *messages, const json_t *tools, const char *category,
                    const char *source, const char *license, ds4_err *err) {
    json_t *src = json_pack("{s:s, s:s, s:s}", "source", source, "category", category, "license", license);
    if (!src || json_array_append_new(d->sources, src) != 0) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (strcmp(o->modes, "think") != 0 && add_render(d, messages, tools, false, category, source, err) != 0) return -1;
    if (strcmp(o->modes, "nothink") != 0 && add_render(d, messages, tools, true, category, source, err) != 0) return -1;
    return 0;
}

/* ------------------------------------------------------------ conversations */

static const char *str_or(const json_t *o, const char *key, const char *def) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : def;
}

static int add_jsonl(dataset *d, const opts *o, const char *path, ds4_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    for (unsigned lineno = 1; rc == 0 && (n = getline(&line, &cap, f)) >= 0; lineno++) {
        if (strspn(line, " \t\r\n") == (size_t)n) continue;
        json_error_t je;
        json_t *rec = json_loadb(line, (size_t)n, 0, &je);
        const json_t *msgs = rec ? json_object_get(rec, "messages") : NULL, *tools = json_object_get(rec, "tools");
        if (!rec)
            rc = ds4_err_set(err, DS4_EFORMAT, "%s:%u: not valid JSON (column %d: %s)", path, lineno, je.column,
                             je.text);
        else if (!json_is_object(rec))
            rc = ds4_err_set(err, DS4_EFORMAT, "%s:%u: a record is a JSON object", path, lineno);
        else if (!json_is_array(msgs) || json_array_size(msgs) == 0)
            rc = ds4_err_set(err, DS4_EFORMAT, "%s:%u: \"messages\": a non-empty array is needed", path, lineno);
        else if (tools && !json_is_array(tools))
            rc = ds4_err_set(err, DS4_EFORMAT, "%s:%u: \"tools\": an array is needed", path, lineno);
        if (rc == 0) {
            char source[512];
            snprintf(source, sizeof(source), "%s:%u", str_or(rec, "source", path), lineno);
            rc = add_both(d, o, msgs, tools, str_or(rec, "category", "conversation"), source,
                          str_or(rec, "license", o->license), err);
            if (rc != 0) ds4_err_prefix(err, "%s:%u", path, lineno);
        }
        json_decref(rec);
    }
    free(line);
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------ code and text */

static const char *const CODE_EXT[] = {".c",  ".h",   ".cc",  ".cpp",   ".hpp",   ".cu",   ".cuh", ".m",
                                       ".py", ".go",  ".rs",  ".js",    ".ts",    ".java", ".kt",  ".sh",
                                       ".rb", ".lua", ".zig", ".swift", ".metal", ".sql",  NULL};

static const char *const CODE_TASKS[] = {
    "Explain what this code does, function by function, and how the pieces fit together.",
    "Review this code: list the bugs, edge cases and undefined behaviour you can find, with line references.",
    "Write unit tests for the functions in this code, covering the edge cases.",
    "Suggest how to make this code simpler and faster without changing what it does, and show the changes.",
    "Write the documentation comment each function here is missing.",
};

static const char *const TEXT_TASKS[] = {
    "Summarise the following text in five sentences.",
    "List the facts stated in the following text, one per line.",
    "Rewrite the following text to be shorter and clearer, keeping every fact.",
    "Write three questions a careful reader could answer from the following text, and answer them.",
    "Translate the first paragraph of the following text into Italian, then explain any hard choices.",
};

/* The language tag of a fenced block: the extension without its dot. */
static const char *code_lang(const char *path) {
    for (int i = 0; CODE_EXT[i]; i++)
        if (ends_with(path, CODE_EXT[i])) return CODE_EXT[i] + 1;
    return NULL;
}

static char *read_all(const char *path, size_t *len, ds4_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s: %s", path, strerror(errno));
        return NULL;
    }
    ds4_strbuf b = {0};
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) ds4_strbuf_append(&b, buf, n);
    int rc = ferror(f) ? ds4_err_set(err, DS4_EIO, "%s: read failed", path) : ds4_strbuf_check(&b, path, err);
    fclose(f);
    if (rc != 0) {
        ds4_strbuf_free(&b);
        return NULL;
    }
    return ds4_strbuf_take(&b, len);
}

/* The end of the chunk starting at s: at most max bytes, cut after the last
 * newline in its second half when there is one. */
static size_t chunk_end(const char *s, size_t n, size_t max) {
    if (n <= max) return n;
    for (size_t i = max; i > max / 2; i--)
        if (s[i - 1] == '\n') return i;
    return max;
}

static int add_file(dataset *d, const opts *o, const char *path, ds4_err *err) {
    size_t len;
    char *text = read_all(path, &len, err);
    if (!text) return -1;
    const char *lang = code_lang(path);
    int rc = 0;
    for (size_t at = 0, part = 0; rc == 0 && at < len; part++) {
        size_t n = chunk_end(text + at, len - at, o->chunk);
        const char *task = lang ? CODE_TASKS[fnv1a(text + at, n) % 5] : TEXT_TASKS[fnv1a(text + at, n) % 5];
        ds4_strbuf u = {0};
        if (lang) ds4_strbuf_printf(&u, "%s\n\nFile: %s\n\n```%s\n", task, path, lang);
        else ds4_strbuf_printf(&u, "%s\n\n", task);
        ds4_strbuf_append(&u, text + at, n);
        if (lang) ds4_strbuf_puts(&u, n && text[at + n - 1] == '\n' ? "```" : "\n```");
        json_t *msgs = json_array();
        if (o->system[0]) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", o->system));
        json_t *um = u.p ? json_pack("{s:s, s:s%}", "role", "user", "content", u.p, u.len) : NULL;
        if (!um) rc = ds4_err_set(err, DS4_EFORMAT, "%s: not UTF-8 text (chunk %zu)", path, part);
        else json_array_append_new(msgs, um);
        char source[512];
        snprintf(source, sizeof(source), "%s#%zu", path, part);
        if (rc == 0) rc = add_both(d, o, msgs, NULL, lang ? "source" : "text", source, o->license, err);
        json_decref(msgs);
        ds4_strbuf_free(&u);
        at += n;
    }
    free(text);
    return rc;
}

/* ------------------------------------------------------------ output */

/* The output directory and its parents. */
static int make_dirs(const char *dir, ds4_err *err) {
    char p[4096];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c != '\0') continue;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return ds4_err_set(err, DS4_EIO, "cannot make %s: %s", p, strerror(errno));
        *s = c;
        if (c == '\0') return 0;
    }
}

static int write_prompts(const dataset *d, const char *dir, const char *name, const char *mode, ds4_err *err) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return ds4_err_set(err, DS4_EIO, "cannot write %s: %s", path, strerror(errno));
    for (size_t i = 0; i < d->n; i++) {
        const record *r = &d->v[i];
        if (mode && strcmp(r->mode, mode) != 0) continue;
        fprintf(f, "\n\n%s %s %s %s %s =====\n", DS4_IMATRIX_MARKER, r->id, r->category, r->mode, r->source);
        fwrite(r->text, 1, r->len, f);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return ds4_err_set(err, DS4_EIO, "cannot write %s", path);
    return 0;
}

static void count(json_t *obj, const char *key, json_int_t by) {
    json_object_set_new(obj, key, json_integer(json_integer_value(json_object_get(obj, key)) + by));
}

static int write_manifest(const dataset *d, const char *dir, ds4_err *err) {
    json_t *cats = json_object(), *modes = json_object(), *bytes = json_object();
    json_int_t total = 0;
    for (size_t i = 0; i < d->n; i++) {
        count(cats, d->v[i].category, 1);
        count(modes, d->v[i].mode, 1);
        count(bytes, d->v[i].category, (json_int_t)d->v[i].len);
        total += (json_int_t)d->v[i].len;
    }
    json_t *m = json_pack("{s:s, s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:{s:s, s:s, s:s}, s:O}", "purpose",
                          "DeepSeek V4 imatrix calibration prompts", "record_count", (json_int_t)d->n,
                          "duplicates_dropped", (json_int_t)d->duplicates, "rendered_utf8_bytes", total,
                          "rough_token_estimate_bytes_div_4", total / 4, "categories", cats, "modes", modes,
                          "bytes_by_category", bytes, "files", "all_rendered", "rendered_prompts.txt", "think_rendered",
                          "rendered_prompts_think.txt", "nothink_rendered", "rendered_prompts_nothink.txt", "sources",
                          d->sources);
    char path[4096];
    snprintf(path, sizeof(path), "%s/manifest.json", dir);
    int rc = m && json_dump_file(m, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) == 0
                 ? 0
                 : ds4_err_set(err, DS4_EIO, "cannot write %s", path);
    json_decref(m);
    return rc;
}

static void dataset_free(dataset *d) {
    for (size_t i = 0; i < d->n; i++) {
        free(d->v[i].id);
        free(d->v[i].category);
        free(d->v[i].mode);
        free(d->v[i].source);
        free(d->v[i].text);
    }
    free(d->v);
    json_decref(d->sources);
}

int main(int argc, char **argv) {
    opts o = {0};
    ds4_opt table[] = {
        {DS4_OPT_STR("-o, --out", "DIR", &o.out_dir, NULL, "the output directory (made if missing)"),
         .flags = DS4_OPT_REQUIRED},
        {DS4_OPT_CHOICE("--modes", "M", &o.modes, "both|think|nothink", "both",
                        "render every source ending in thinking mode, non-thinking mode, or both")},
        {DS4_OPT_U32("--chunk-bytes", "N", &o.chunk, 256, 1u << 24, CHUNK_DEFAULT,
                     "the largest piece of a code or text file in one prompt")},
        {DS4_OPT_STR("--license", "NAME", &o.license, "unspecified",
                     "the licence of the file inputs, recorded in the manifest (JSONL records may name theirs)")},
        {DS4_OPT_STR("--system", "TEXT", &o.system, "You are a helpful assistant",
                     "system message of the code and text prompts; \"\" for none")},
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_CALL("INPUT", NULL, add_input, &o, "conversations (*.jsonl), code files (by extension) or text files"),
         .flags = DS4_OPT_MANY | DS4_OPT_REQUIRED},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-imatrix-dataset",
                   .usage = "-o DIR [options] INPUT...",
                   .about = "Build an imatrix calibration set: conversations, code and text rendered through the "
                            "chat template\nin thinking and non-thinking mode, in the format ds4-imatrix reads.",
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) {
        free(o.inputs);
        return status;
    }
    ds4_err err = {0};
    dataset d = {.sources = json_array()};
    int rc = d.sources ? 0 : ds4_err_set(&err, DS4_ENOMEM, "out of memory");
    for (size_t i = 0; rc == 0 && i < o.n_inputs; i++)
        rc = ends_with(o.inputs[i], ".jsonl") ? add_jsonl(&d, &o, o.inputs[i], &err)
                                              : add_file(&d, &o, o.inputs[i], &err);
    if (rc == 0 && make_dirs(o.out_dir, &err) != 0) rc = -1;
    if (rc == 0) rc = write_prompts(&d, o.out_dir, "rendered_prompts.txt", NULL, &err);
    if (rc == 0) rc = write_prompts(&d, o.out_dir, "rendered_prompts_think.txt", "think", &err);
    if (rc == 0) rc = write_prompts(&d, o.out_dir, "rendered_prompts_nothink.txt", "nothink", &err);
    if (rc == 0) rc = write_manifest(&d, o.out_dir, &err);
    if (rc == 0)
        fprintf(stderr, "ds4-imatrix-dataset: %zu prompt%s from %zu input%s (%zu duplicate%s dropped) in %s\n", d.n,
                ds4_plural(d.n), o.n_inputs, ds4_plural(o.n_inputs), d.duplicates, ds4_plural(d.duplicates), o.out_dir);
    else fprintf(stderr, "ds4-imatrix-dataset: %s\n", err.msg);
    dataset_free(&d);
    free(o.inputs);
    return rc == 0 ? 0 : 1;
}
