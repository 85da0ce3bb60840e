/*
 * ds4-quantize - the official DeepSeek V4 Flash safetensors checkpoint, or
 * a ds4 GGUF, -> a ds4 GGUF (docs/TOOLCHAIN.md, docs/MODEL.md 2.6).
 *
 *   ds4-quantize --hf DIR --out FILE [--recipe q2|q4|q8_0|f16|f32] [options]
 *   ds4-quantize --gguf IN.gguf [--mtp-gguf IN-MTP.gguf] --out FILE ...
 *
 * The model shape comes from DIR/config.json, tensor names and order from
 * the tensor table (src/model/tensors.h), storage types from the recipe plus ds4's per-class
 * options and --tensor-type overrides (src/convert/policy.h).  Tokenizer
 * metadata is copied from --tokenizer-gguf.  Every source tensor is checked
 * (present, dtype, shape) before anything is written; tensors are then
 * streamed one at a time (experts a batch of threads at a time) into a
 * temporary file renamed into place at the end.  --mtp-out FILE converts
 * the checkpoint's MTP block (its `mtp.0.*` tensors, docs/MODEL.md 2.5)
 * into a file of its own, with the same storage types and checks.
 *
 * --gguf requantizes a file ds4 runs (source.c): the shape comes from its
 * deepseek4.* keys, every tensor is decoded to f32 and quantized as a
 * checkpoint's would be; its other metadata (tokenizer included) is
 * copied, all but the quantize.* keys that described its own making.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "engine/cli.h"
#include "format/quants.h"
#include "quantize.h"
#include "text/tokjson.h"
#include "text/vocab.h"

#define KV_IM_FILE    "quantize.imatrix.file"
#define KV_IM_DATASET "quantize.imatrix.dataset"
#define KV_IM_ENTRIES "quantize.imatrix.entries_count"
#define KV_IM_CHUNKS  "quantize.imatrix.chunks_count"
#define KV_SOURCE     "quantize.source" /* the GGUF a requantized file was decoded from */

/* Class options are collected as strings first: the recipe they refine
 * may be given after them. */
typedef struct raw_opts {
    const char *types[9]; /* indexes as in build_policy() */
    const char **overrides;
    int n_overrides;
} raw_opts;

/* --experts TYPE: the three routed matrices at once. */
static int experts_option(void *ctx, const char *v, ds4_err *err) {
    (void)err;
    raw_opts *raw = ctx;
    raw->types[0] = raw->types[1] = raw->types[2] = v;
    return 0;
}

/* --tensor-type PFX=TYPE, repeatable. */
static int override_option(void *ctx, const char *v, ds4_err *err) {
    (void)err;
    raw_opts *raw = ctx;
    raw->overrides[raw->n_overrides++] = v;
    return 0;
}

static const char ABOUT[] =
    "Convert an official DeepSeek V4 safetensors checkpoint, Flash or Pro (DIR with config.json and\n"
    "model.safetensors.index.json) into a ds4 GGUF, or requantize a ds4 GGUF (--gguf): its tensors are\n"
    "decoded to f32 and quantized again, so a file made from a Q8_0 one carries both roundings.\n"
    "\n"
    "TYPE: f32 f16 bf16 q8_0 q2_k q4_k iq2_xxs, or copy (keep the recipe's type); case, '-' and '_' do\n"
    "not matter.  Without an imatrix, IQ2_XXS uses each matrix's column energy (sum of w^2 over rows)\n"
    "as importance.";

/* Returns -1 to go on, else the status to exit with. */
static int parse_args(int argc, char **argv, qz_opts *o, raw_opts *raw) {
    memset(o, 0, sizeof(*o));
    memset(raw, 0, sizeof(*raw));
    if (!(raw->overrides = calloc((size_t)argc, sizeof(char *)))) return 1;
    char recipe_help[200];
    snprintf(recipe_help, sizeof(recipe_help), "base types: %s", ds4_recipe_names());
    ds4_opt table[] = {
        {DS4_OPT_STR("--hf", "DIR", &o->hf_dir, NULL, "checkpoint directory (the input: --hf or --gguf)")},
        {DS4_OPT_STR("--gguf", "FILE", &o->gguf_in, NULL, "a ds4 GGUF to requantize (metadata and tokenizer copied)"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--mtp-gguf", "FILE", &o->mtp_gguf, NULL, "with --gguf and --mtp-out: the MTP block's GGUF"),
         .def_text = "the --gguf file", .flags = DS4_OPT_IN},
        {DS4_OPT_STR("-o, --out", "FILE", &o->out, NULL, "output GGUF (required unless --dry-run or --compare-tensor)"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_STR("--mtp-out", "FILE", &o->mtp_out, NULL,
                     "also convert the MTP block (mtp.0.* tensors) into FILE, with the same storage types"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_STR("--recipe", "NAME", &o->recipe, "q2", recipe_help)},
        {DS4_OPT_STR("--tokenizer", "FILE", &o->tokenizer_json, NULL, "tokenizer.json (.xz too)"),
         .def_text = "DIR/tokenizer.json if present", .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--tokenizer-config", "FILE", &o->tokenizer_config, NULL, "tokenizer_config.json"),
         .def_text = "DIR/tokenizer_config.json if present", .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--tokenizer-gguf", "FILE", &o->tokenizer_gguf, NULL,
                     "copy tokenizer.* metadata from this GGUF instead"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_STR("--name", "TEXT", &o->name, NULL, "general.name"),
         .def_text = "the published model's name (DeepSeek V4 Flash / Pro), else DeepSeek V4"},

        {DS4_OPT_SECTION("storage types (TYPE below):")},
        {DS4_OPT_CALL("--experts, --routed", "TYPE", experts_option, raw, "all routed experts")},
        {DS4_OPT_STR("--routed-w1, --routed-gate", "TYPE", &raw->types[0], NULL, "routed gate")},
        {DS4_OPT_STR("--routed-w2, --routed-down", "TYPE", &raw->types[1], NULL, "routed down")},
        {DS4_OPT_STR("--routed-w3, --routed-up", "TYPE", &raw->types[2], NULL, "routed up")},
        {DS4_OPT_STR("--attention-proj, --attn-proj", "TYPE", &raw->types[3], NULL,
                     "attention q/kv/output projections")},
        {DS4_OPT_STR("--attention", "TYPE", &raw->types[4], NULL, "other attention matrices: compressor, indexer")},
        {DS4_OPT_STR("--shared", "TYPE", &raw->types[5], NULL, "shared expert")},
        {DS4_OPT_STR("--embedding", "TYPE", &raw->types[6], NULL, "token embedding")},
        {DS4_OPT_STR("--output", "TYPE", &raw->types[7], NULL, "output.weight (LM head)")},
        {DS4_OPT_STR("--dense", "TYPE", &raw->types[8], NULL,
                     "the above non-routed matrices whose own option is unset")},
        {DS4_OPT_CALL("--tensor-type", "PFX=TYPE", override_option, raw,
                      "tensors whose name starts with PFX (repeatable, first wins)")},
        {DS4_OPT_STR("--imatrix", "FILE", &o->imatrix_path, NULL,
                     "legacy .dat importance matrix (experts packed per tensor)"),
         .flags = DS4_OPT_IN},
        {DS4_OPT_FLAG("--imatrix-strict", &o->imatrix_strict, "fail when a 2/4-bit tensor has no imatrix vector")},

        {DS4_OPT_SECTION("running:")},
        DS4_CLI_THREADS(&o->threads),
        {DS4_OPT_FLAG("--dry-run", &o->dry_run, "print the plan and sizes, write nothing")},
        {DS4_OPT_FLAG("--overwrite", &o->overwrite, "replace an existing --out")},
        {DS4_OPT_FLAG("-q, --quiet", &o->quiet, "no per-tensor progress")},
        {DS4_OPT_STR("--compare-tensor", "NAME", &o->compare_tensor, NULL,
                     "regenerate one tensor in the type it has in --compare-gguf, compare bytes (and FNV-1a 64) "
                     "with it, write nothing")},
        {DS4_OPT_STR("--compare-gguf", "FILE", &o->compare_gguf, NULL, "reference GGUF for --compare-tensor"),
         .flags = DS4_OPT_IN},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-quantize",
                   .usage = "--hf DIR --out FILE [options]\n--gguf FILE --out FILE [options]",
                   .about = ABOUT,
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (!o->hf_dir == !o->gguf_in) return ds4_cli_usage(&cli, "give the input: --hf DIR or --gguf FILE (one of them)");
    if (o->mtp_gguf && (!o->gguf_in || !o->mtp_out))
        return ds4_cli_usage(&cli, "--mtp-gguf goes with --gguf and --mtp-out");
    if (o->gguf_in && o->tokenizer_config && !o->tokenizer_json)
        return ds4_cli_usage(&cli, "--tokenizer-config needs --tokenizer FILE with --gguf");
    if (!o->out && !o->mtp_out && !o->dry_run && !o->compare_tensor)
        return ds4_cli_usage(&cli, "--out FILE is required (or --mtp-out, --dry-run, --compare-tensor)");
    if (o->mtp_out && o->compare_tensor)
        return ds4_cli_usage(&cli, "--mtp-out and --compare-tensor exclude each other");
    if (!o->compare_tensor != !o->compare_gguf)
        return ds4_cli_usage(&cli, "--compare-tensor and --compare-gguf go together");
    if (o->tokenizer_gguf && (o->tokenizer_json || o->tokenizer_config))
        return ds4_cli_usage(&cli, "--tokenizer-gguf excludes --tokenizer and --tokenizer-config");
    if (o->imatrix_strict && !o->imatrix_path) return ds4_cli_usage(&cli, "--imatrix-strict needs --imatrix FILE");
    return -1;
}

static int build_policy(qz_opts *o, const raw_opts *raw) {
    const ds4_recipe *r = ds4_recipe_get(o->recipe);
    if (!r) {
        fprintf(stderr, "ds4-quantize: unknown recipe \"%s\" (expected %s)\n", o->recipe, ds4_recipe_names());
        return 2;
    }
    ds4_policy_init(&o->policy, r);
    uint32_t *slots[9] = {&o->policy.routed_w1,      &o->policy.routed_w2, &o->policy.routed_w3,
                          &o->policy.attention_proj, &o->policy.attention, &o->policy.shared,
                          &o->policy.embedding,      &o->policy.output,    &o->policy.dense};
    ds4_err err = {0};
    for (int i = 0; i < 9; i++)
        if (raw->types[i] && ds4_policy_parse_type(raw->types[i], slots[i], &err) != 0) {
            fprintf(stderr, "ds4-quantize: %s\n", err.msg);
            return 2;
        }
    for (int i = 0; i < raw->n_overrides; i++)
        if (ds4_policy_add_override(&o->policy, raw->overrides[i], &err) != 0) {
            fprintf(stderr, "ds4-quantize: %s\n", err.msg);
            return 2;
        }
    return 0;
}

/* ------------------------------------------------------------- planning */

/* The tensors of the main model, or (mtp) of the MTP block. */
static int plan(qz_job *j, bool mtp, ds4_err *err) {
    free(j->specs);
    free(j->items);
    j->nitems = 0;
    j->nspecs = mtp ? ds4_layout_mtp(&j->hc.cfg, NULL) : ds4_layout_count(&j->hc.cfg);
    j->specs = calloc(j->nspecs, sizeof(*j->specs));
    j->items = calloc(j->nspecs, sizeof(*j->items));
    if (!j->specs || !j->items) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    if (mtp) ds4_layout_mtp(&j->hc.cfg, j->specs);
    else ds4_layout_build(&j->hc.cfg, j->specs);
    qz_select_input(j, mtp);
    if (!mtp && j->src && !ds4_gguf_find_tensor(j->src, "token_embd.weight") &&
        ds4_gguf_find_tensor(j->src, "mtp.0.e_proj.weight"))
        return ds4_err_set(err, DS4_EINVAL, "%s holds an MTP block, not a model: give it with --mtp-gguf",
                           j->src->path);
    for (size_t i = 0; i < j->nspecs; i++) {
        const ds4_tensor_spec *t = &j->specs[i];
        bool routed = t->ndim == 3;
        if (t->optional && !qz_input_has(j, t)) continue;
        qz_item *it = &j->items[j->nitems];
        it->t = t;
        if (ds4_policy_type(&j->o->policy, t, &it->type, err) != 0) return -1;
        /* Check every source (each expert too) before writing anything. */
        for (int e = 0; e < (routed ? (int)t->ne[2] : 1); e++) {
            qz_source src;
            if (qz_resolve(j, t, routed ? e : -1, &src, err) != 0) return -1;
            if (e == 0) it->src_type = qz_source_type(&src);
        }
        int ok;
        uint64_t n = t->ne[0] * t->ne[1] * t->ne[2];
        it->nbytes = ds4_type_nbytes_checked(it->type, n, &ok);
        if (!ok) return ds4_err_set(err, DS4_ERANGE, "%s: size overflows", t->name);
        j->nitems++;
    }
    return 0;
}

/* A GGUF input's tensors that the plan leaves out (another version's
 * extras, or an MTP block nobody asked for) are worth a warning. */
static void warn_left_out(const qz_job *j, bool mtp) {
    const ds4_gguf *g = j->src;
    bool shared = !j->mtp_in; /* the MTP block, if any, is in the model file */
    size_t n = 0;
    const char *first = NULL;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const char *name = g->tensors[i].name;
        bool is_mtp = strncmp(name, "mtp.", 4) == 0;
        if (shared && (mtp ? !is_mtp : is_mtp && j->o->mtp_out)) continue; /* the other plan's */
        bool planned = false;
        for (size_t k = 0; k < j->nitems && !planned; k++) planned = strcmp(j->items[k].t->name, name) == 0;
        if (!planned && n++ == 0) first = name;
    }
    if (n)
        fprintf(stderr, "ds4-quantize: warning: %s: %zu tensor%s not in the %s's layout left out (%s%s)%s\n", g->path,
                n, n == 1 ? "" : "s", mtp ? "MTP block" : "model", first, n > 1 ? ", ..." : "",
                !mtp && !j->o->mtp_out && strncmp(first, "mtp.", 4) == 0 ? ": --mtp-out FILE converts the MTP block"
                                                                         : "");
}

static const char *human(double bytes, char *buf, size_t len) {
    const char *units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000 && u < 4) bytes /= 1000, u++;
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}

static void print_plan(const qz_job *j) {
    uint64_t total = 0, by_type[64] = {0}, count[64] = {0};
    char b1[32], dims[64];
    for (size_t i = 0; i < j->nitems; i++) {
        const qz_item *it = &j->items[i];
        const ds4_tensor_spec *t = it->t;
        snprintf(dims, sizeof(dims),
                 t->ndim == 1   ? "[%" PRIu64 "]"
                 : t->ndim == 2 ? "[%" PRIu64 ", %" PRIu64 "]"
                                : "[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]",
                 t->ne[0], t->ne[1], t->ne[2]);
        printf("%-40s %-22s %-8s -> %-8s %12s\n", t->name, dims, it->src_type, ds4_type_get(it->type)->name,
               human((double)it->nbytes, b1, sizeof(b1)));
        total += it->nbytes;
        by_type[it->type & 63] += it->nbytes;
        count[it->type & 63]++;
    }
    printf("tensors: %zu\n", j->nitems);
    for (int t = 0; t < 64; t++)
        if (count[t])
            printf("  %-8s %5" PRIu64 " tensors %12s\n", ds4_type_get((uint32_t)t)->name, count[t],
                   human((double)by_type[t], b1, sizeof(b1)));
    printf("tensor data: %" PRIu64 " bytes (%s)\n", total, human((double)total, b1, sizeof(b1)));
}

/* ------------------------------------------------------------- writing */

static int copy_tokenizer(const char *path, uint32_t n_vocab, ds4_gguf_writer *w, ds4_err *err) {
    ds4_gguf *g = ds4_gguf_open(path, err);
    if (!g) return ds4_err_prefix(err, "--tokenizer-gguf");
    int rc = 0;
    const ds4_gguf_kv *tokens = ds4_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!tokens || tokens->value.type != DS4_GGUF_ARRAY || tokens->value.a.type != DS4_GGUF_STRING)
        rc = ds4_err_set(err, DS4_EFORMAT, "%s: no tokenizer.ggml.tokens string array", path);
    else if (tokens->value.a.count > n_vocab)
        rc = ds4_err_set(err, DS4_EFORMAT, "%s: %" PRIu64 " tokens, more than the model's vocab_size %u", path,
                         tokens->value.a.count, n_vocab);
    for (uint64_t i = 0; i < g->n_kv && rc == 0; i++) {
        if (strncmp(g->kv[i].key, "tokenizer.", 10) != 0) continue;
        if (ds4_gguf_w_copy_kv(w, &g->kv[i]) != 0) rc = ds4_err_set(err, DS4_EIO, "copying %s failed", g->kv[i].key);
    }
    ds4_gguf_close(g);
    return rc;
}

/* tokenizer.json -> tokenizer.ggml.* (text/tokjson.h), checked to build a
 * vocabulary and to fit the model's vocab_size. */
static int import_tokenizer(const char *json, const char *config, uint32_t n_vocab, ds4_gguf_writer *w, ds4_err *err) {
    ds4_tokjson tj;
    if (ds4_tokjson_load(json, config, n_vocab, &tj, err) != 0) return -1;
    int rc = 0;
    if (tj.n_tokens > n_vocab) {
        rc = ds4_err_set(err, DS4_EFORMAT, "%s: %u tokens, more than the model's vocab_size %u", json, tj.n_tokens,
                         n_vocab);
    } else {
        ds4_vocab_src src = ds4_tokjson_src(&tj);
        ds4_vocab *v = ds4_vocab_new(&src, err);
        if (!v) rc = ds4_err_prefix(err, "%s", json);
        ds4_vocab_free(v);
    }
    if (rc == 0) rc = ds4_tokjson_write_gguf(&tj, w, err);
    ds4_tokjson_free(&tj);
    return rc;
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Keys this tool writes itself, or that describe how the input was made. */
static bool rewritten_key(const char *key) {
    static const char *const own[] = {"general.architecture", "general.name", "general.quantization_version",
                                      "general.alignment"};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (strcmp(key, own[i]) == 0) return true;
    return strncmp(key, "deepseek4.", 10) == 0 || strncmp(key, "quantize.", 9) == 0;
}

/* A GGUF input's metadata: its tokenizer (tokenizer.*), or every other key
 * but the rewritten ones (general.type, licence, training provenance...).
 * Returns how many were copied, -1 on error. */
static int copy_input_kvs(const ds4_gguf *g, bool tokenizer, ds4_gguf_writer *w, ds4_err *err) {
    int n = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const char *key = g->kv[i].key;
        bool tok = strncmp(key, "tokenizer.", 10) == 0;
        if (tok != tokenizer || rewritten_key(key)) continue;
        if (ds4_gguf_w_copy_kv(w, &g->kv[i]) != 0) return ds4_err_set(err, DS4_EIO, "copying %s failed", key);
        n++;
    }
    return n;
}

static int write_tokenizer(qz_job *j, ds4_gguf_writer *w, ds4_err *err) {
    const qz_opts *o = j->o;
    if (o->tokenizer_gguf) return copy_tokenizer(o->tokenizer_gguf, j->hc.cfg.n_vocab, w, err);
    if (j->in && o->tokenizer_json)
        return import_tokenizer(o->tokenizer_json, o->tokenizer_config, j->hc.cfg.n_vocab, w, err);
    if (j->in) {
        int n = copy_input_kvs(j->in, true, w, err);
        if (n == 0) fprintf(stderr, "ds4-quantize: warning: %s has no tokenizer metadata to copy\n", j->in->path);
        return n < 0 ? -1 : 0;
    }
    char json[4096], config[4096];
    snprintf(json, sizeof(json), "%s", o->tokenizer_json ? o->tokenizer_json : "");
    snprintf(config, sizeof(config), "%s", o->tokenizer_config ? o->tokenizer_config : "");
    if (!o->tokenizer_json) snprintf(json, sizeof(json), "%s/tokenizer.json", o->hf_dir);
    if (!o->tokenizer_config) snprintf(config, sizeof(config), "%s/tokenizer_config.json", o->hf_dir);
    if (!o->tokenizer_json && !file_exists(json)) {
        fprintf(stderr,
                "ds4-quantize: warning: no tokenizer (no %s; see --tokenizer, --tokenizer-gguf): "
                "the GGUF gets no tokenizer metadata\n",
                json);
        return 0;
    }
    return import_tokenizer(json, file_exists(config) || o->tokenizer_config ? config : NULL, j->hc.cfg.n_vocab, w,
                            err);
}

/* general.name: --name (" MTP" after it for the MTP block's file), else a
 * GGUF input's own (an MTP file's, or the model's with " MTP"), else the
 * published model's or a generic one. */
static void model_name(const qz_job *j, bool mtp, char *buf, size_t len) {
    const char *known = ds4_config_name(&j->hc.cfg);
    const ds4_gguf *g = mtp && j->mtp_in ? j->mtp_in : j->in;
    const ds4_gguf_kv *kv = g ? ds4_gguf_find_kv(g, "general.name") : NULL;
    const char *suffix = mtp && g != j->mtp_in ? " MTP" : "";
    if (!j->o->name && kv && kv->value.type == DS4_GGUF_STRING)
        snprintf(buf, len, "%.*s%s", (int)kv->value.s.len, kv->value.s.ptr, suffix);
    else snprintf(buf, len, "%s%s", j->o->name ? j->o->name : known ? known : "DeepSeek V4", mtp ? " MTP" : "");
}

/* The main file's metadata, or (mtp) the MTP block's: its model's shape
 * keys (what the loader checks it against), no tokenizer.  A GGUF input's
 * other keys follow, then the quantize.* provenance. */
static int write_metadata(qz_job *j, ds4_gguf_writer *w, bool mtp, ds4_err *err) {
    char name[300];
    model_name(j, mtp, name, sizeof(name));
    int rc = ds4_gguf_w_str(w, "general.architecture", "deepseek4");
    rc |= ds4_gguf_w_str(w, "general.name", name);
    rc |= ds4_gguf_w_u32(w, "general.quantization_version", 2);
    if (rc != 0) return ds4_err_set(err, DS4_EIO, "writing general.* metadata failed");
    if (ds4_config_to_gguf(&j->hc.cfg, w, err) != 0) return -1;
    if (!mtp && write_tokenizer(j, w, err) != 0) return -1;
    if (j->src && copy_input_kvs(j->src, false, w, err) < 0) return -1;
    if (j->src && ds4_gguf_w_str(w, KV_SOURCE, j->src->path) != 0)
        return ds4_err_set(err, DS4_EIO, "writing %s failed", KV_SOURCE);
    if (j->im) {
        rc = ds4_gguf_w_str(w, KV_IM_FILE, j->o->imatrix_path);
        rc |= ds4_gguf_w_u64(w, KV_IM_ENTRIES, j->im->n_entries);
        if (j->im->dataset) rc |= ds4_gguf_w_str(w, KV_IM_DATASET, j->im->dataset);
        if (j->im->chunks > 0) rc |= ds4_gguf_w_u64(w, KV_IM_CHUNKS, (uint64_t)j->im->chunks);
        if (rc != 0) return ds4_err_set(err, DS4_EIO, "writing quantize.imatrix.* metadata failed");
    }
    for (size_t i = 0; i < j->nitems; i++) {
        const ds4_tensor_spec *t = j->items[i].t;
        if (ds4_gguf_w_tensor(w, t->name, t->ndim, t->ne, j->items[i].type) != 0)
            return ds4_err_set(err, DS4_EIO, "declaring %s failed", t->name);
    }
    return 0;
}


typedef struct writer_sink {
    qz_sink base;
    ds4_gguf_writer *w;
    bool failed;
} writer_sink;

static int writer_put(qz_sink *s, const void *data, uint64_t n, ds4_err *err) {
    writer_sink *ws = (writer_sink *)s;
    if (ds4_gguf_w_data(ws->w, data, n) == 0) return 0;
    ws->failed = true;
    return ds4_err_set(err, DS4_EIO, "writing tensor data failed");
}

static int write_all(qz_job *j, const char *out, bool mtp, ds4_err *err) {
    ds4_gguf_writer *w = ds4_gguf_writer_open(out, 0, err);
    if (!w) return -1;
    if (write_metadata(j, w, mtp, err) != 0) {
        ds4_gguf_writer_abort(w);
        return -1;
    }
    writer_sink sink = {.base.put = writer_put, .w = w};
    double t0 = ds4_now();
    char b1[32];
    for (size_t i = 0; i < j->nitems; i++) {
        const qz_item *it = &j->items[i];
        double ts = ds4_now();
        if (qz_convert(j, it, &sink.base, err) != 0) {
            /* The writer holds the cause of its own failures. */
            if (sink.failed) ds4_gguf_writer_close(w, err);
            else ds4_gguf_writer_abort(w);
            return -1;
        }
        if (!j->o->quiet)
            fprintf(stderr, "[%4zu/%4zu] %-40s %-8s %12s %7.2fs\n", i + 1, j->nitems, it->t->name,
                    ds4_type_get(it->type)->name, human((double)it->nbytes, b1, sizeof(b1)), ds4_now() - ts);
    }
    if (ds4_gguf_writer_close(w, err) != 0) return -1;
    double dt = ds4_now() - t0;
    if (dt <= 0) dt = 1e-9;
    fprintf(stderr,
            "ds4-quantize: wrote %s: %zu tensors, %" PRIu64 " bytes in %.2fs with %d threads: "
            "%.3g elements/s, %.1f MB/s out\n",
            out, j->nitems, j->bytes_done, dt, ds4_pool_size(j->pool), (double)j->elements_done / dt,
            (double)j->bytes_done / dt / 1e6);
    if (j->im || j->synthetic_used)
        fprintf(stderr,
                "ds4-quantize: importance: %" PRIu64 " matrices from the imatrix, %" PRIu64 " from column energy\n",
                j->imatrix_used, j->synthetic_used);
    return 0;
}

/* ------------------------------------------------------------ compare */

typedef struct compare_sink {
    qz_sink base;
    const uint8_t *ref;
    uint64_t n, pos, ndiff, first_diff;
    uint64_t fnv;
} compare_sink;

static uint64_t fnv1a64(uint64_t h, const uint8_t *p, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
#define FNV_INIT 1469598103934665603ull

static int compare_put(qz_sink *s, const void *data, uint64_t n, ds4_err *err) {
    compare_sink *c = (compare_sink *)s;
    const uint8_t *p = data;
    if (c->pos + n > c->n) return ds4_err_set(err, DS4_EFORMAT, "more bytes than the reference tensor holds");
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != c->ref[c->pos + i] && c->ndiff++ == 0) c->first_diff = c->pos + i;
    c->fnv = fnv1a64(c->fnv, p, n);
    c->pos += n;
    return 0;
}

/* Regenerate one tensor in the reference's type and compare.  Returns 0
 * when identical, 1 when different, -1 on error. */
static int compare_tensor(qz_job *j, ds4_err *err) {
    qz_item *it = NULL;
    for (size_t i = 0; i < j->nitems && !it; i++)
        if (strcmp(j->items[i].t->name, j->o->compare_tensor) == 0) it = &j->items[i];
    if (!it)
        return ds4_err_set(err, DS4_ENOTFOUND, "--compare-tensor %s: no such tensor in the model",
                           j->o->compare_tensor);
    ds4_gguf *ref = ds4_gguf_open(j->o->compare_gguf, err);
    if (!ref) return -1;
    int rc = -1;
    const ds4_gguf_tensor *rt = ds4_gguf_find_tensor(ref, it->t->name);
    if (!rt) {
        ds4_err_set(err, DS4_ENOTFOUND, "%s has no tensor %s", j->o->compare_gguf, it->t->name);
    } else if (rt->ndim != it->t->ndim || memcmp(rt->ne, it->t->ne, it->t->ndim * sizeof(uint64_t)) != 0) {
        ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s has another shape", j->o->compare_gguf, it->t->name);
    } else if (!(it->t->allowed & (1ull << rt->type)) || (!ds4_policy_writable(rt->type) && rt->type != DS4_TYPE_I32)) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "%s: tensor %s has type %s, which ds4-quantize cannot write there",
                    j->o->compare_gguf, it->t->name, ds4_type_get(rt->type) ? ds4_type_get(rt->type)->name : "?");
    } else {
        it->type = rt->type;
        it->nbytes = rt->nbytes;
        compare_sink c = {.base.put = compare_put, .ref = rt->data, .n = rt->nbytes, .fnv = FNV_INIT};
        if (qz_convert(j, it, &c.base, err) == 0) {
            uint64_t ref_fnv = fnv1a64(FNV_INIT, rt->data, rt->nbytes);
            printf("%s %s %" PRIu64 " bytes: fnv1a64 new %016" PRIx64 " reference %016" PRIx64 ": ", it->t->name,
                   ds4_type_get(it->type)->name, rt->nbytes, c.fnv, ref_fnv);
            if (c.ndiff == 0) printf("identical\n");
            else printf("%" PRIu64 " bytes differ, first at offset %" PRIu64 "\n", c.ndiff, c.first_diff);
            rc = c.ndiff != 0;
        }
    }
    ds4_gguf_close(ref);
    return rc;
}

/* -------------------------------------------------------------- main */

/* plan(), then the warning about a GGUF input's tensors left out. */
static int plan_checked(qz_job *j, bool mtp, ds4_err *err) {
    if (plan(j, mtp, err) != 0) return -1;
    if (j->src) warn_left_out(j, mtp);
    return 0;
}

static int run(qz_job *j, ds4_err *err) {
    if (qz_open_input(j, err) != 0) return -1;
    if (j->o->imatrix_path && !(j->im = ds4_imatrix_load(j->o->imatrix_path, err))) return -1;
    if (j->o->dry_run) {
        if (plan_checked(j, false, err) != 0) return -1;
        print_plan(j);
        if (!j->o->mtp_out) return 0;
        if (plan_checked(j, true, err) != 0) return ds4_err_prefix(err, "the MTP block");
        printf("MTP block (%s):\n", j->o->mtp_out);
        print_plan(j);
        return 0;
    }
    /* every source of both files checked before anything is written */
    if (j->o->mtp_out && plan_checked(j, true, err) != 0) return ds4_err_prefix(err, "the MTP block");
    if (plan_checked(j, false, err) != 0) return -1;
    if (j->o->compare_tensor) {
        if (!(j->pool = ds4_pool_create(j->o->threads, err))) return -1;
        return compare_tensor(j, err);
    }
    struct stat st;
    const char *outs[2] = {j->o->out, j->o->mtp_out};
    for (int i = 0; i < 2; i++)
        if (outs[i] && !j->o->overwrite && stat(outs[i], &st) == 0)
            return ds4_err_set(err, DS4_EINVAL, "%s exists (use --overwrite to replace it)", outs[i]);
    if (!(j->pool = ds4_pool_create(j->o->threads, err))) return -1;
    if (j->o->out && write_all(j, j->o->out, false, err) != 0) return -1;
    if (!j->o->mtp_out) return 0;
    j->bytes_done = j->elements_done = 0;
    if (plan(j, true, err) != 0 || write_all(j, j->o->mtp_out, true, err) != 0)
        return ds4_err_prefix(err, "the MTP block");
    return 0;
}

int main(int argc, char **argv) {
    qz_opts o;
    raw_opts raw;
    int rc = parse_args(argc, argv, &o, &raw);
    if (rc >= 0) {
        free(raw.overrides);
        return rc;
    }
    rc = build_policy(&o, &raw);
    free(raw.overrides);
    if (rc != 0) {
        ds4_policy_free(&o.policy);
        return rc;
    }
    qz_job j = {.o = &o};
    ds4_err err = {0};
    rc = run(&j, &err);
    if (rc < 0) fprintf(stderr, "ds4-quantize: %s\n", err.msg);
    ds4_pool_free(j.pool);
    ds4_imatrix_free(j.im);
    qz_close_input(&j);
    free(j.specs);
    free(j.items);
    ds4_policy_free(&o.policy);
    return rc == 0 ? 0 : 1;
}
