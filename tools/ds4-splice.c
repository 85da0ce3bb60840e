/*
 * ds4-splice - mixed-precision GGUFs without requantising: copy the routed
 * expert tensors of chosen layers from a donor GGUF into a base GGUF, byte
 * for byte (docs/TOOLCHAIN.md).
 *
 *   ds4-splice --base Q2.gguf --donor Q4.gguf --out MIX.gguf --q4-layers 37-42
 *
 * Before writing, both files are checked to describe the same model: same
 * architecture, the same deepseek4.* configuration, the same tensor names
 * and shapes; the donor's types for the spliced tensors must be ones the
 * engine accepts for them (src/model/layout.c).  Metadata comes from the
 * base (plus splice.* provenance keys), every tensor not spliced is the
 * base's bytes, and payload is streamed from the mappings through the GGUF
 * writer into a temporary file renamed into place.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/opts.h"
#include "format/gguf.h"
#include "format/quants.h"
#include "model/config.h"
#include "model/layout.h"

#define PIECE (64ull << 20) /* bytes handed to the writer at a time */

typedef struct splice {
    const char *base_path, *donor_path, *out_path, *layers_spec;
    bool dry_run, force;
    ds4_gguf *base, *donor;
    ds4_config cfg;
    bool layer[DS4_MAX_LAYERS];
    ds4_tensor_spec *specs;
    size_t nspecs;
} splice;

/* "0-2,40-42" -> layer flags.  -1 with a message on a bad spec. */
static int parse_layers(const char *spec, uint32_t n_layer, bool *out, ds4_err *err) {
    memset(out, 0, DS4_MAX_LAYERS * sizeof(bool));
    const char *p = spec;
    int count = 0;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return ds4_err_set(err, DS4_EINVAL, "layer spec \"%s\": expected a number at \"%s\"", spec, p);
        p = end;
        if (*p == '-') {
            b = strtol(++p, &end, 10);
            if (end == p) return ds4_err_set(err, DS4_EINVAL, "layer spec \"%s\": range without an end", spec);
            p = end;
        }
        if (a < 0 || b < a || b >= (long)n_layer)
            return ds4_err_set(err, DS4_EINVAL, "layer spec \"%s\": %ld-%ld is not within 0..%u", spec, a, b,
                               n_layer - 1);
        for (long l = a; l <= b; l++) out[l] = true, count++;
        if (*p == ',') p++;
        else if (*p) return ds4_err_set(err, DS4_EINVAL, "layer spec \"%s\": unexpected \"%s\"", spec, p);
    }
    if (count == 0) return ds4_err_set(err, DS4_EINVAL, "layer spec is empty");
    return 0;
}

static bool is_routed(ds4_tclass cls) {
    return cls == DS4_TC_EXP_GATE || cls == DS4_TC_EXP_UP || cls == DS4_TC_EXP_DOWN;
}

static const ds4_tensor_spec *spec_of(const splice *s, const char *name) {
    for (size_t i = 0; i < s->nspecs; i++)
        if (strcmp(s->specs[i].name, name) == 0) return &s->specs[i];
    return NULL;
}

static bool spliced(const splice *s, const ds4_gguf_tensor *t) {
    const ds4_tensor_spec *sp = spec_of(s, t->name);
    return sp && is_routed(sp->cls) && s->layer[sp->layer];
}

/* ------------------------------------------------------- compatibility */

static int check_arch(const splice *s, ds4_err *err) {
    ds4_str a, b;
    ds4_err e2 = {0};
    if (ds4_gguf_get_str(s->base, "general.architecture", &a, err) != 0) return ds4_err_prefix(err, "%s", s->base_path);
    if (ds4_gguf_get_str(s->donor, "general.architecture", &b, &e2) != 0) {
        *err = e2;
        return ds4_err_prefix(err, "%s", s->donor_path);
    }
    if (a.len != b.len || memcmp(a.ptr, b.ptr, a.len) != 0 || !ds4_str_eq(a, "deepseek4"))
        return ds4_err_set(err, DS4_EUNSUPPORTED,
                           "architectures differ or are not deepseek4: %.*s (base) vs %.*s (donor)", (int)a.len, a.ptr,
                           (int)b.len, b.ptr);
    return 0;
}

static int check_config(splice *s, ds4_err *err) {
    ds4_config d;
    if (ds4_config_from_gguf(s->base, &s->cfg, err) != 0) return ds4_err_prefix(err, "%s", s->base_path);
    if (ds4_config_from_gguf(s->donor, &d, err) != 0) return ds4_err_prefix(err, "%s", s->donor_path);
    if (memcmp(&s->cfg, &d, sizeof(d)) != 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s and %s have different deepseek4.* configurations", s->base_path,
                           s->donor_path);
    s->nspecs = ds4_layout_count(&s->cfg);
    s->specs = calloc(s->nspecs, sizeof(*s->specs));
    if (!s->specs) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    ds4_layout_build(&s->cfg, s->specs);
    return 0;
}

static int check_tensors(const splice *s, ds4_err *err) {
    if (s->base->n_tensors != s->donor->n_tensors)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "base has %" PRIu64 " tensors, donor %" PRIu64, s->base->n_tensors,
                           s->donor->n_tensors);
    for (uint64_t i = 0; i < s->base->n_tensors; i++) {
        const ds4_gguf_tensor *b = &s->base->tensors[i];
        const ds4_gguf_tensor *d = ds4_gguf_find_tensor(s->donor, b->name);
        if (!d) return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: tensor %s is missing", s->donor_path, b->name);
        if (d->ndim != b->ndim || memcmp(d->ne, b->ne, sizeof(b->ne)) != 0)
            return ds4_err_set(err, DS4_EUNSUPPORTED, "tensor %s: shapes differ between base and donor", b->name);
        if (!spliced(s, b)) continue;
        const ds4_tensor_spec *sp = spec_of(s, b->name);
        const ds4_type_info *ti = ds4_type_get(d->type);
        if (!(sp->allowed & (1ull << d->type)) || !ti || !ti->supported)
            return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: tensor %s has type %s, which ds4 does not accept there",
                               s->donor_path, b->name, ti ? ti->name : "?");
    }
    return 0;
}

/* ------------------------------------------------------------- output */

static void print_plan(const splice *s) {
    int64_t delta = 0;
    size_t n = 0;
    for (uint64_t i = 0; i < s->base->n_tensors; i++) {
        const ds4_gguf_tensor *b = &s->base->tensors[i];
        if (!spliced(s, b)) continue;
        const ds4_gguf_tensor *d = ds4_gguf_find_tensor(s->donor, b->name);
        printf("%-32s %-8s -> %-8s %+14" PRId64 " bytes\n", b->name, ds4_type_get(b->type)->name,
               ds4_type_get(d->type)->name, (int64_t)d->nbytes - (int64_t)b->nbytes);
        delta += (int64_t)d->nbytes - (int64_t)b->nbytes;
        n++;
    }
    printf("spliced tensors: %zu of %" PRIu64 "\nsize change: %+" PRId64 " bytes (%+.2f GB), base file %" PRIu64
           " bytes\n",
           n, s->base->n_tensors, delta, (double)delta / 1e9, s->base->size);
}

static int write_metadata(const splice *s, ds4_gguf_writer *w, ds4_err *err) {
    for (uint64_t i = 0; i < s->base->n_kv; i++) {
        const ds4_gguf_kv *kv = &s->base->kv[i];
        /* The writer stores the alignment itself; earlier provenance of
         * another splice is replaced by this one's. */
        if (strcmp(kv->key, "general.alignment") == 0 || strncmp(kv->key, "splice.", 7) == 0) continue;
        if (ds4_gguf_w_copy_kv(w, kv) != 0) return ds4_err_set(err, DS4_EIO, "copying %s failed", kv->key);
    }
    const char *slash = strrchr(s->donor_path, '/');
    if (ds4_gguf_w_str(w, "splice.donor", slash ? slash + 1 : s->donor_path) != 0 ||
        ds4_gguf_w_str(w, "splice.layers", s->layers_spec) != 0)
        return ds4_err_set(err, DS4_EIO, "writing splice.* metadata failed");
    for (uint64_t i = 0; i < s->base->n_tensors; i++) {
        const ds4_gguf_tensor *b = &s->base->tensors[i];
        const ds4_gguf_tensor *t = spliced(s, b) ? ds4_gguf_find_tensor(s->donor, b->name) : b;
        if (ds4_gguf_w_tensor(w, b->name, b->ndim, b->ne, t->type) != 0)
            return ds4_err_set(err, DS4_EIO, "declaring %s failed", b->name);
    }
    return 0;
}

static int write_output(const splice *s, ds4_err *err) {
    ds4_gguf_writer *w = ds4_gguf_writer_open(s->out_path, s->base->alignment, err);
    if (!w) return -1;
    if (write_metadata(s, w, err) != 0) {
        ds4_gguf_writer_abort(w);
        return -1;
    }
    for (uint64_t i = 0; i < s->base->n_tensors; i++) {
        const ds4_gguf_tensor *b = &s->base->tensors[i];
        const ds4_gguf_tensor *t = spliced(s, b) ? ds4_gguf_find_tensor(s->donor, b->name) : b;
        const uint8_t *p = t->data;
        for (uint64_t off = 0; off < t->nbytes; off += PIECE) {
            uint64_t n = t->nbytes - off < PIECE ? t->nbytes - off : PIECE;
            if (ds4_gguf_w_data(w, p + off, n) != 0) break;
        }
    }
    return ds4_gguf_writer_close(w, err);
}

/* The output must not replace a file that is mapped as an input. */
static bool same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static int run(splice *s, ds4_err *err) {
    if (!(s->base = ds4_gguf_open(s->base_path, err))) return -1;
    if (!(s->donor = ds4_gguf_open(s->donor_path, err))) return -1;
    if (check_arch(s, err) != 0 || check_config(s, err) != 0) return -1;
    if (parse_layers(s->layers_spec, s->cfg.n_layer, s->layer, err) != 0) return -1;
    if (check_tensors(s, err) != 0) return -1;
    if (s->dry_run) {
        print_plan(s);
        return 0;
    }
    struct stat st;
    if (same_file(s->out_path, s->base_path) || same_file(s->out_path, s->donor_path))
        return ds4_err_set(err, DS4_EINVAL, "--out %s is one of the inputs", s->out_path);
    if (!s->force && stat(s->out_path, &st) == 0)
        return ds4_err_set(err, DS4_EINVAL, "%s exists (use --force to replace it)", s->out_path);
    return write_output(s, err);
}

int main(int argc, char **argv) {
    splice s = {0};
    ds4_opt table[] = {
        {DS4_OPT_STR("--base", "FILE", &s.base_path, NULL, "GGUF giving the metadata and every other tensor"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {DS4_OPT_STR("--donor", "FILE", &s.donor_path, NULL, "GGUF giving the routed experts of the chosen layers"),
         .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {DS4_OPT_STR("-o, --out", "FILE", &s.out_path, NULL, "the GGUF to write (required unless --dry-run)"),
         .flags = DS4_OPT_OUT},
        {DS4_OPT_STR("--q4-layers, --layers", "SPEC", &s.layers_spec, NULL, "layers, e.g. 37-42 or 0-2,40-42"),
         .flags = DS4_OPT_REQUIRED},
        {DS4_OPT_FLAG("--dry-run", &s.dry_run, "print the plan and size change, write nothing")},
        {DS4_OPT_FLAG("--force", &s.force, "replace an existing --out")},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-splice",
                   .usage = "--base FILE --donor FILE --out FILE --q4-layers SPEC [options]",
                   .about = "Copy the routed-expert tensors (ffn_gate/up/down_exps) of the layers in SPEC from the "
                            "donor GGUF\ninto the base GGUF without requantising; everything else comes from the "
                            "base.",
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    if (!s.out_path && !s.dry_run) return ds4_cli_usage(&cli, "--out FILE is required (or --dry-run)");
    ds4_err err = {0};
    int rc = run(&s, &err);
    if (rc != 0) fprintf(stderr, "ds4-splice: %s\n", err.msg);
    ds4_gguf_close(s.base);
    ds4_gguf_close(s.donor);
    free(s.specs);
    return rc == 0 ? 0 : err.code == DS4_EINVAL ? 2 : 1;
}
