/*
 * ds4-gguf - look inside a GGUF file.
 *
 *   ds4-gguf info [--json] [--full] FILE
 *
 * Prints the header, every metadata entry (arrays shortened to their first
 * elements unless --full) and the tensor table (name, type, dims, bytes,
 * offset in the data section).  --json prints the same as one JSON object.
 * A file the reader rejects gives its error message and exit status 1, so
 * this is also the quickest way to validate a file.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/opts.h"
#include "format/gguf.h"
#include "format/quants.h"

#define SHOWN_ELEMS     8   /* array elements shown without --full */
#define SHOWN_STR_BYTES 160 /* bytes of a string shown without --full */

typedef struct opts {
    bool json;
    bool full;
    const char *path;
} opts;

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_seq(const uint8_t *s, uint64_t n) {
    uint32_t c = s[0];
    size_t len;
    uint32_t min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        min = 0x80;
        c &= 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        min = 0x800;
        c &= 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        min = 0x10000;
        c &= 0x07;
    } else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    return len;
}

/* A string for a person: quoted, valid UTF-8 as is, control characters and
 * bad bytes escaped. */
static void print_text_str(FILE *out, const char *p, uint64_t len, bool full) {
    const uint8_t *s = (const uint8_t *)p;
    uint64_t shown = full || len <= SHOWN_STR_BYTES ? len : SHOWN_STR_BYTES;
    fputc('"', out);
    for (uint64_t i = 0; i < shown;) {
        size_t k = utf8_seq(s + i, len - i);
        if (k == 1 && s[i] >= 0x20 && s[i] != 0x7f && s[i] != '"' && s[i] != '\\') fputc(s[i], out);
        else if (k == 1 && s[i] == '\n') fputs("\\n", out);
        else if (k == 1 && s[i] == '\t') fputs("\\t", out);
        else if (k == 1 && (s[i] == '"' || s[i] == '\\')) fprintf(out, "\\%c", s[i]);
        else if (k > 1) fwrite(s + i, 1, k, out);
        else {
            fprintf(out, "\\x%02x", s[i]);
            k = 1;
        }
        i += k;
    }
    fputc('"', out);
    if (shown < len) fprintf(out, "... (%" PRIu64 " bytes)", len);
}

/* A JSON string: escapes per RFC 8259, bad UTF-8 bytes as U+FFFD. */
static void print_json_str(FILE *out, const char *p, uint64_t len) {
    const uint8_t *s = (const uint8_t *)p;
    fputc('"', out);
    for (uint64_t i = 0; i < len;) {
        size_t k = utf8_seq(s + i, len - i);
        if (k == 0) {
            fputs("\\ufffd", out);
            k = 1;
        } else if (k > 1) fwrite(s + i, 1, k, out);
        else if (s[i] == '"' || s[i] == '\\') fprintf(out, "\\%c", s[i]);
        else if (s[i] == '\n') fputs("\\n", out);
        else if (s[i] == '\t') fputs("\\t", out);
        else if (s[i] < 0x20) fprintf(out, "\\u%04x", s[i]);
        else fputc(s[i], out);
        i += k;
    }
    fputc('"', out);
}

static void print_cstr(FILE *out, const char *s, bool json) {
    if (json) print_json_str(out, s, strlen(s));
    else print_text_str(out, s, strlen(s), true);
}

/* A float: shortest form that reads back exactly; JSON has no NaN or
 * infinities, so those become strings there. */
static void print_float(FILE *out, double v, bool is_f32, bool json) {
    if (isnan(v) || isinf(v)) {
        const char *s = isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity";
        fprintf(out, json ? "\"%s\"" : "%s", s);
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v) break;
    }
    fputs(buf, out);
}

static void print_array_elem(FILE *out, const ds4_gguf_array *a, uint64_t i, const opts *o) {
    uint64_t u;
    switch (a->type) {
    case DS4_GGUF_STRING:
        if (o->json) print_json_str(out, a->strs[i].ptr, a->strs[i].len);
        else print_text_str(out, a->strs[i].ptr, a->strs[i].len, o->full);
        break;
    case DS4_GGUF_F32:
    case DS4_GGUF_F64: print_float(out, ds4_gguf_arr_f64(a, i), a->type == DS4_GGUF_F32, o->json); break;
    case DS4_GGUF_BOOL: fputs(ds4_gguf_arr_i64(a, i) ? "true" : "false", out); break;
    case DS4_GGUF_U64:
        memcpy(&u, a->data + 8 * i, 8);
        fprintf(out, "%" PRIu64, u);
        break;
    default: fprintf(out, "%" PRId64, ds4_gguf_arr_i64(a, i)); break;
    }
}

static void print_value(FILE *out, const ds4_gguf_value *v, const opts *o) {
    switch (v->type) {
    case DS4_GGUF_U8:
    case DS4_GGUF_U16:
    case DS4_GGUF_U32:
    case DS4_GGUF_U64: fprintf(out, "%" PRIu64, v->u); break;
    case DS4_GGUF_I8:
    case DS4_GGUF_I16:
    case DS4_GGUF_I32:
    case DS4_GGUF_I64: fprintf(out, "%" PRId64, v->i); break;
    case DS4_GGUF_F32:
    case DS4_GGUF_F64: print_float(out, v->f, v->type == DS4_GGUF_F32, o->json); break;
    case DS4_GGUF_BOOL: fputs(v->b ? "true" : "false", out); break;
    case DS4_GGUF_STRING:
        if (o->json) print_json_str(out, v->s.ptr, v->s.len);
        else print_text_str(out, v->s.ptr, v->s.len, o->full);
        break;
    default: {
        const ds4_gguf_array *a = &v->a;
        uint64_t shown = o->full || a->count <= SHOWN_ELEMS ? a->count : SHOWN_ELEMS;
        fputc('[', out);
        for (uint64_t i = 0; i < shown; i++) {
            if (i) fputs(", ", out);
            print_array_elem(out, a, i, o);
        }
        if (shown < a->count && !o->json) fprintf(out, ", ... %" PRIu64 " more", a->count - shown);
        fputc(']', out);
        break;
    }
    }
}

/* A key or tensor name for a terminal: control bytes shown as '?'. */
static const char *printable(const char *name, char *buf, size_t cap) {
    size_t i = 0;
    for (; name[i] && i + 1 < cap; i++) buf[i] = (unsigned char)name[i] < 0x20 || name[i] == 0x7f ? '?' : name[i];
    buf[i] = '\0';
    return buf;
}

static const char *type_name(uint32_t type) {
    const ds4_type_info *ti = ds4_type_get(type);
    return ti ? ti->name : "?";
}

static void print_dims(FILE *out, const ds4_gguf_tensor *t) {
    fputc('[', out);
    for (uint32_t d = 0; d < t->ndim; d++) fprintf(out, d ? ", %" PRIu64 : "%" PRIu64, t->ne[d]);
    fputc(']', out);
}

static void print_text(FILE *out, const ds4_gguf *g, const opts *o) {
    fprintf(out, "%s: GGUF v%u, %" PRIu64 " bytes, alignment %u, data section at offset %" PRIu64 "\n", g->path,
            g->version, g->size, g->alignment, g->data_offset);
    size_t width = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (strlen(g->kv[i].key) > width) width = strlen(g->kv[i].key);
    if (width > 48) width = 48;
    fprintf(out, "\nmetadata (%" PRIu64 " entries):\n", g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const ds4_gguf_kv *kv = &g->kv[i];
        char type[32];
        if (kv->value.type == DS4_GGUF_ARRAY)
            snprintf(type, sizeof(type), "%s[%" PRIu64 "]", ds4_gguf_vtype_name(kv->value.a.type), kv->value.a.count);
        else snprintf(type, sizeof(type), "%s", ds4_gguf_vtype_name(kv->value.type));
        char name[512];
        fprintf(out, "  %-*s  %-12s ", (int)width, printable(kv->key, name, sizeof(name)), type);
        print_value(out, &kv->value, o);
        fputc('\n', out);
    }
    fprintf(out, "\ntensors (%" PRIu64 "):\n", g->n_tensors);
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        char name[512];
        fprintf(out, "  %-40s %-8s ", printable(t->name, name, sizeof(name)), type_name(t->type));
        char dims[200];
        FILE *m = fmemopen(dims, sizeof(dims), "w");
        if (m) {
            print_dims(m, t);
            fclose(m);
        } else {
            snprintf(dims, sizeof(dims), "?");
        }
        fprintf(out, "%-26s %14" PRIu64 " bytes  at %" PRIu64 "\n", dims, t->nbytes, t->offset);
        total += t->nbytes;
    }
    fprintf(out, "  total %" PRIu64 " bytes of tensor data\n", total);
}

static void print_json(FILE *out, const ds4_gguf *g, const opts *o) {
    fputs("{\"file\": ", out);
    print_cstr(out, g->path, true);
    fprintf(out,
            ", \"version\": %u, \"size\": %" PRIu64 ", \"alignment\": %u, \"data_offset\": %" PRIu64
            ",\n \"metadata\": [",
            g->version, g->size, g->alignment, g->data_offset);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const ds4_gguf_kv *kv = &g->kv[i];
        fputs(i ? ",\n  {\"key\": " : "\n  {\"key\": ", out);
        print_cstr(out, kv->key, true);
        fprintf(out, ", \"type\": \"%s\"", ds4_gguf_vtype_name(kv->value.type));
        if (kv->value.type == DS4_GGUF_ARRAY) {
            const ds4_gguf_array *a = &kv->value.a;
            fprintf(out, ", \"elem_type\": \"%s\", \"count\": %" PRIu64 ", \"truncated\": %s",
                    ds4_gguf_vtype_name(a->type), a->count, !o->full && a->count > SHOWN_ELEMS ? "true" : "false");
        }
        fputs(", \"value\": ", out);
        print_value(out, &kv->value, o);
        fputc('}', out);
    }
    fputs("],\n \"tensors\": [", out);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const ds4_gguf_tensor *t = &g->tensors[i];
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", out);
        print_cstr(out, t->name, true);
        fprintf(out, ", \"type\": \"%s\", \"type_id\": %u, \"dims\": ", type_name(t->type), t->type);
        print_dims(out, t);
        fprintf(out, ", \"elements\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"offset\": %" PRIu64 "}", t->nelements,
                t->nbytes, t->offset);
    }
    fputs("]}\n", out);
}

int main(int argc, char **argv) {
    opts o = {0};
    const char *command;
    char full_help[160];
    snprintf(full_help, sizeof(full_help),
             "every array element and whole strings (default: the first %d elements "
             "and %d bytes)",
             SHOWN_ELEMS, SHOWN_STR_BYTES);
    ds4_opt table[] = {
        {DS4_OPT_FLAG("--json", &o.json,
                      "one JSON object (strings that are not valid UTF-8 have their bad bytes replaced by U+FFFD)")},
        {DS4_OPT_FLAG("--full", &o.full, full_help)},
        {DS4_OPT_SECTION("arguments:")},
        {DS4_OPT_CHOICE("COMMAND", NULL, &command, "info", NULL,
                        "what to do: info prints the file's metadata and "
                        "tensor table"),
         .flags = DS4_OPT_REQUIRED},
        {DS4_OPT_STR("FILE", NULL, &o.path, NULL, "a GGUF file"), .flags = DS4_OPT_REQUIRED | DS4_OPT_IN},
        {0},
    };
    ds4_cli cli = {.prog = "ds4-gguf",
                   .usage = "info [--json] [--full] FILE",
                   .about = "Print the header, metadata and tensor table of a GGUF file (name, type, dims, bytes, "
                            "offset in the\ndata section), a header-only file's too.  A file the reader rejects gives "
                            "its error and exit\nstatus 1.",
                   .opts = table};
    int status;
    if (!ds4_cli_parse(&cli, argc, argv, &status)) return status;
    ds4_err err;
    /* A header-only file (ds4-mkmodel --header-only) has a table to print;
     * a file with data gets every check of the reader. */
    ds4_gguf *g = ds4_gguf_open_header(o.path, &err);
    if (g && g->size > g->data_offset) {
        ds4_gguf_close(g);
        g = ds4_gguf_open(o.path, &err);
    }
    if (!g) {
        fprintf(stderr, "ds4-gguf: %s\n", err.msg);
        return 1;
    }
    if (o.json) print_json(stdout, g, &o);
    else print_text(stdout, g, &o);
    ds4_gguf_close(g);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("ds4-gguf: writing output");
        return 1;
    }
    return 0;
}
