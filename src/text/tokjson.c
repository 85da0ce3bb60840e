/*
 * tokjson.c - tokenizer.json -> vocabulary arrays (see tokjson.h).
 */
#include "text/tokjson.h"

#include <errno.h>
#include <jansson.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/paths.h"
#include "text/strbuf.h"

/* The official pre_tokenizer regexes, verbatim from tokenizer.json. */
static const char *const OFFICIAL_SPLITS[3] = {
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};

#define BOS_DEFAULT "<｜begin▁of▁sentence｜>"
#define EOS_DEFAULT "<｜end▁of▁sentence｜>"

extern char **environ;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Parse a JSON file; "*.xz" files are read through `xz -dc` (xz-utils is a
 * build dependency), so the compressed copy in data/ is used as is. */
static json_t *load_json(const char *path, ds4_err *err) {
    json_error_t je;
    if (ds4_path_check_readable(path, err) != 0) return NULL; /* before xz or jansson word it */
    if (!ends_with(path, ".xz")) {
        json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
        if (!j && je.line > 0) ds4_err_set(err, DS4_EFORMAT, "%s:%d:%d: %s", path, je.line, je.column, je.text);
        else if (!j) ds4_err_set(err, DS4_EFORMAT, "%s: %s", path, je.text);
        return j;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        ds4_err_set(err, DS4_EIO, "%s: pipe: %s", path, strerror(errno));
        return NULL;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    char *argv[] = {"xz", "-dc", "--", (char *)path, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "xz", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        ds4_err_set(err, DS4_EIO, "%s: cannot run xz: %s", path, strerror(rc));
        return NULL;
    }
    FILE *f = fdopen(fds[0], "r");
    json_t *j = f ? json_loadf(f, JSON_ALLOW_NUL, &je) : NULL;
    if (f) fclose(f);
    else close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        json_decref(j);
        if (WIFEXITED(status))
            ds4_err_set(err, DS4_EIO, "%s: xz -dc failed (exit status %d: not an xz file?)", path, WEXITSTATUS(status));
        else
            ds4_err_set(err, DS4_EIO, "%s: xz -dc was killed by signal %d", path,
                        WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        return NULL;
    }
    if (!j && je.line > 0)
        ds4_err_set(err, DS4_EFORMAT, "%s (decompressed):%d:%d: %s", path, je.line, je.column, je.text);
    else if (!j) ds4_err_set(err, DS4_EFORMAT, "%s (decompressed): %s", path, je.text);
    return j;
}

static bool str_is(json_t *j, const char *s) { return json_is_string(j) && strcmp(json_string_value(j), s) == 0; }

static int check_pre_tokenizer(json_t *root, const char *path, ds4_err *err) {
    json_t *pre = json_object_get(root, "pre_tokenizer");
    json_t *seq = json_object_get(pre, "pretokenizers");
    if (!str_is(json_object_get(pre, "type"), "Sequence") || json_array_size(seq) != 4)
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "%s: pre_tokenizer is not the DeepSeek V4 sequence of three splits and ByteLevel", path);
    for (size_t i = 0; i < 3; i++) {
        json_t *s = json_array_get(seq, i);
        json_t *rx = json_object_get(json_object_get(s, "pattern"), "Regex");
        if (!str_is(json_object_get(s, "type"), "Split") || !str_is(rx, OFFICIAL_SPLITS[i]) ||
            !str_is(json_object_get(s, "behavior"), "Isolated") || json_is_true(json_object_get(s, "invert")))
            return ds4_err_set(err, DS4_EUNSUPPORTED,
                               "%s: pre_tokenizer step %zu differs from the DeepSeek V4 (joyai-llm) split", path,
                               i + 1);
    }
    json_t *bl = json_array_get(seq, 3);
    if (!str_is(json_object_get(bl, "type"), "ByteLevel") || json_is_true(json_object_get(bl, "use_regex")) ||
        json_is_true(json_object_get(bl, "add_prefix_space")))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: last pre_tokenizer step is not a plain ByteLevel", path);
    return 0;
}

/* llama.cpp's does_token_look_special. */
static bool looks_special(const char *s, size_t n) {
    static const char *const exact[] = {"<pad>", "<mask>", "<2mass>", "[@BOS@]"};
    for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++)
        if (n == strlen(exact[i]) && memcmp(s, exact[i], n) == 0) return true;
#define STARTS(p) (n >= sizeof(p) - 1 && memcmp(s, p, sizeof(p) - 1) == 0)
#define ENDS(p)   (n >= sizeof(p) - 1 && memcmp(s + n - (sizeof(p) - 1), p, sizeof(p) - 1) == 0)
    if (STARTS("<|") && ENDS("|>")) return true;
    if (STARTS("<｜") && ENDS("｜>")) return true;
    if (STARTS("<unused") && ENDS(">")) return true;
#undef STARTS
#undef ENDS
    return false;
}

typedef struct builder {
    ds4_strbuf bytes;
    size_t *off; /* per token: offset in bytes, or SIZE_MAX when unset */
    size_t *len;
} builder;

static void put_token(builder *b, ds4_tokjson *t, uint32_t id, const char *s, size_t n, int32_t type) {
    b->off[id] = b->bytes.len;
    b->len[id] = n;
    ds4_strbuf_append(&b->bytes, s, n);
    t->types[id] = type;
}

/* U+2581 -> ' ', as llama.cpp pre-normalizes user-defined tokens. */
static void put_user_defined(builder *b, ds4_tokjson *t, uint32_t id, const char *s, size_t n) {
    size_t start = b->bytes.len;
    for (size_t i = 0; i < n; i++) {
        if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            ds4_strbuf_putc(&b->bytes, ' ');
            i += 2;
        } else {
            ds4_strbuf_putc(&b->bytes, s[i]);
        }
    }
    b->off[id] = start;
    b->len[id] = b->bytes.len - start;
    t->types[id] = DS4_TOKEN_USER_DEFINED;
}

static int vocab_extent(json_t *vocab, json_t *added, uint32_t min_vocab, uint32_t *n, const char *path, ds4_err *err) {
    json_int_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX)
            return ds4_err_set(err, DS4_EFORMAT, "%s: model.vocab[\"%.60s\"] is not a valid id", path, key);
        if (json_integer_value(val) > max_id) max_id = json_integer_value(val);
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX ||
            !json_is_string(json_object_get(a, "content")))
            return ds4_err_set(err, DS4_EFORMAT, "%s: added_tokens[%zu] lacks a valid id or content", path, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return ds4_err_set(err, DS4_EFORMAT, "%s: empty vocabulary", path);
    *n = (uint32_t)max_id + 1 > min_vocab ? (uint32_t)max_id + 1 : min_vocab;
    return 0;
}

static int fill_tokens(json_t *vocab, json_t *added, builder *b, ds4_tokjson *t, const char *path, ds4_err *err) {
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        put_token(b, t, (uint32_t)json_integer_value(val), key, strlen(key), DS4_TOKEN_NORMAL);
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        uint32_t id = (uint32_t)json_integer_value(json_object_get(a, "id"));
        json_t *c = json_object_get(a, "content");
        const char *s = json_string_value(c);
        size_t n = json_string_length(c);
        if (json_is_true(json_object_get(a, "special")) || looks_special(s, n))
            put_token(b, t, id, s, n, DS4_TOKEN_CONTROL);
        else put_user_defined(b, t, id, s, n);
    }
    char pad[32];
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        if (b->off[id] != SIZE_MAX) continue;
        int n = snprintf(pad, sizeof(pad), "[PAD%u]", id);
        put_token(b, t, id, pad, (size_t)n, DS4_TOKEN_UNUSED);
    }
    return ds4_strbuf_check(&b->bytes, path, err);
}

static int fill_merges(json_t *merges, ds4_strbuf *bytes, size_t *moff, size_t *mlen, const char *path, ds4_err *err) {
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        moff[i] = bytes->len;
        if (json_is_string(m)) {
            ds4_strbuf_append(bytes, json_string_value(m), json_string_length(m));
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
            ds4_strbuf_append(bytes, json_string_value(l), json_string_length(l));
            ds4_strbuf_putc(bytes, ' ');
            ds4_strbuf_append(bytes, json_string_value(r), json_string_length(r));
        } else {
            return ds4_err_set(err, DS4_EFORMAT, "%s: model.merges[%zu] is neither \"A B\" nor [A, B]", path, i);
        }
        mlen[i] = bytes->len - moff[i];
    }
    return ds4_strbuf_check(bytes, path, err);
}

/* A token setting of tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int32_t find_token(const ds4_tokjson *t, const char *s) {
    if (!s) return -1;
    size_t n = strlen(s);
    for (uint32_t id = 0; id < t->n_tokens; id++)
        if (t->tokens[id].len == n && memcmp(t->tokens[id].ptr, s, n) == 0) return (int32_t)id;
    return -1;
}

static int read_config(const char *config_path, ds4_tokjson *t, ds4_err *err) {
    const char *bos = BOS_DEFAULT, *eos = EOS_DEFAULT, *pad = NULL;
    json_t *cfg = NULL;
    if (config_path) {
        cfg = load_json(config_path, err);
        if (!cfg) return -1;
        if (config_token(cfg, "bos_token")) bos = config_token(cfg, "bos_token");
        if (config_token(cfg, "eos_token")) eos = config_token(cfg, "eos_token");
        pad = config_token(cfg, "pad_token");
        t->add_bos = json_is_true(json_object_get(cfg, "add_bos_token"));
        t->add_eos = json_is_true(json_object_get(cfg, "add_eos_token"));
    }
    t->bos_id = find_token(t, bos);
    t->eos_id = find_token(t, eos);
    t->pad_id = pad ? find_token(t, pad) : t->eos_id;
    int rc = 0;
    if (t->bos_id < 0 || t->eos_id < 0)
        rc = ds4_err_set(err, DS4_ENOTFOUND, "%s: BOS \"%s\" or EOS \"%s\" is not in the vocabulary",
                         config_path ? config_path : "defaults", bos, eos);
    json_decref(cfg);
    return rc;
}

static int load_root(json_t *root, const char *path, const char *config_path, uint32_t min_vocab, ds4_tokjson *t,
                     ds4_err *err) {
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (!str_is(json_object_get(model, "type"), "BPE") || !json_is_object(vocab) || !json_is_array(merges))
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: model is not a BPE with vocab and merges", path);
    if (added && !json_is_array(added)) return ds4_err_set(err, DS4_EFORMAT, "%s: added_tokens is not an array", path);
    if (check_pre_tokenizer(root, path, err)) return -1;
    if (vocab_extent(vocab, added, min_vocab, &t->n_tokens, path, err)) return -1;
    if (json_array_size(merges) > UINT32_MAX) return ds4_err_set(err, DS4_ERANGE, "%s: too many merges", path);
    t->n_merges = (uint32_t)json_array_size(merges);

    builder b = {0};
    size_t n = t->n_tokens, m = t->n_merges;
    b.off = malloc(sizeof(size_t) * n);
    b.len = malloc(sizeof(size_t) * n);
    size_t *moff = malloc(sizeof(size_t) * (m + 1)), *mlen = malloc(sizeof(size_t) * (m + 1));
    t->types = malloc(sizeof(int32_t) * n);
    t->tokens = malloc(sizeof(ds4_str) * n);
    t->merges = malloc(sizeof(ds4_str) * (m + 1));
    int rc = 0;
    if (!b.off || !b.len || !moff || !mlen || !t->types || !t->tokens || !t->merges) {
        rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", path);
    } else {
        memset(b.off, 0xff, sizeof(size_t) * n);
        rc = fill_tokens(vocab, added, &b, t, path, err);
        if (!rc) rc = fill_merges(merges, &b.bytes, moff, mlen, path, err);
    }
    if (!rc) {
        t->arena = ds4_strbuf_take(&b.bytes, NULL);
        for (size_t i = 0; i < n; i++) t->tokens[i] = (ds4_str){t->arena + b.off[i], b.len[i]};
        for (size_t i = 0; i < m; i++) t->merges[i] = (ds4_str){t->arena + moff[i], mlen[i]};
        rc = read_config(config_path, t, err);
    }
    ds4_strbuf_free(&b.bytes);
    free(b.off);
    free(b.len);
    free(moff);
    free(mlen);
    return rc;
}

int ds4_tokjson_load(const char *json_path, const char *config_path, uint32_t min_vocab, ds4_tokjson *out,
                     ds4_err *err) {
    memset(out, 0, sizeof(*out));
    json_t *root = load_json(json_path, err);
    if (!root) return -1;
    int rc = load_root(root, json_path, config_path, min_vocab, out, err);
    json_decref(root);
    if (rc) ds4_tokjson_free(out);
    return rc;
}

void ds4_tokjson_free(ds4_tokjson *t) {
    free(t->tokens);
    free(t->types);
    free(t->merges);
    free(t->arena);
    memset(t, 0, sizeof(*t));
}

ds4_vocab_src ds4_tokjson_src(const ds4_tokjson *t) {
    return (ds4_vocab_src){
        .n_tokens = t->n_tokens,
        .tokens = t->tokens,
        .types = t->types,
        .n_merges = t->n_merges,
        .merges = t->merges,
        .bos_id = t->bos_id,
        .eos_id = t->eos_id,
        .pre = DS4_PRE_JOYAI,
    };
}
