/*
 * safetensors.c - safetensors files and sharded checkpoints (see
 * safetensors.h).  JSON is parsed with jansson; everything the JSON says
 * about sizes and offsets is checked against the file before use.
 */
#include "convert/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/gguf_index.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[DS4_ST_DTYPE_COUNT] = {
    [DS4_ST_BOOL] = {"BOOL", 1},       [DS4_ST_U8] = {"U8", 1},           [DS4_ST_I8] = {"I8", 1},
    [DS4_ST_F8_E4M3] = {"F8_E4M3", 1}, [DS4_ST_F8_E5M2] = {"F8_E5M2", 1}, [DS4_ST_F8_E8M0] = {"F8_E8M0", 1},
    [DS4_ST_U16] = {"U16", 2},         [DS4_ST_I16] = {"I16", 2},         [DS4_ST_F16] = {"F16", 2},
    [DS4_ST_BF16] = {"BF16", 2},       [DS4_ST_U32] = {"U32", 4},         [DS4_ST_I32] = {"I32", 4},
    [DS4_ST_F32] = {"F32", 4},         [DS4_ST_U64] = {"U64", 8},         [DS4_ST_I64] = {"I64", 8},
    [DS4_ST_F64] = {"F64", 8},
};

const char *ds4_st_dtype_name(ds4_st_dtype t) { return (unsigned)t < DS4_ST_DTYPE_COUNT ? dtypes[t].name : "?"; }

size_t ds4_st_dtype_size(ds4_st_dtype t) { return (unsigned)t < DS4_ST_DTYPE_COUNT ? dtypes[t].size : 0; }

int ds4_st_dtype_parse(const char *s, ds4_st_dtype *out) {
    for (int i = 0; i < DS4_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (ds4_st_dtype)i;
            return 0;
        }
    }
    return -1;
}

const char *ds4_st_shape_str(const ds4_st_tensor *t, char *buf, size_t len) {
    size_t n = 0;
    if (len == 0) return buf;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, len - n, "[");
    for (uint32_t i = 0; i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
    if (n < len) snprintf(buf + n, len - n, "]");
    return buf;
}

/* ------------------------------------------------------------ one file */

static void free_tensors(ds4_st_file *f) {
    for (size_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    f->tensors = NULL;
    f->n_tensors = 0;
}

void ds4_st_close(ds4_st_file *f) {
    if (!f) return;
    if (f->index) {
        ds4_name_index_free(f->index);
        free(f->index);
    }
    free_tensors(f);
    if (f->owns_map && f->base && f->size) munmap((void *)f->base, f->size);
    free(f->path);
    free(f);
}

/* Read one JSON number as a non-negative 64-bit integer. */
static int json_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    if (i < 0) return -1;
    *out = (uint64_t)i;
    return 0;
}

static int parse_shape(ds4_st_file *f, const char *name, const json_t *shape, ds4_st_tensor *t, ds4_err *err) {
    if (!json_is_array(shape))
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: \"shape\" is not an array", f->path, name);
    size_t nd = json_array_size(shape);
    if (nd > DS4_ST_MAX_DIMS)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: tensor %s: %zu dims, at most %d are supported", f->path, name,
                           nd, DS4_ST_MAX_DIMS);
    t->ndim = (uint32_t)nd;
    t->nelements = 1;
    for (size_t i = 0; i < nd; i++) {
        if (json_u64(json_array_get(shape, i), &t->shape[i]) != 0)
            return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: shape[%zu] is not a non-negative integer", f->path,
                               name, i);
        if (t->shape[i] != 0 && t->nelements > UINT64_MAX / t->shape[i])
            return ds4_err_set(err, DS4_ERANGE, "%s: tensor %s: element count overflows 64 bits", f->path, name);
        t->nelements *= t->shape[i];
    }
    return 0;
}

static int parse_offsets(ds4_st_file *f, const char *name, const json_t *offs, ds4_st_tensor *t, ds4_err *err) {
    uint64_t begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || json_u64(json_array_get(offs, 0), &begin) != 0 ||
        json_u64(json_array_get(offs, 1), &end) != 0)
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: \"data_offsets\" must be [begin, end] integers", f->path,
                           name);
    uint64_t data_size = f->size - f->data_offset;
    if (begin > end || end > data_size)
        return ds4_err_set(err, DS4_ERANGE,
                           "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] outside the %" PRIu64
                           "-byte data section (file truncated?)",
                           f->path, name, begin, end, data_size);
    size_t es = ds4_st_dtype_size(t->dtype);
    if (t->nelements > UINT64_MAX / es)
        return ds4_err_set(err, DS4_ERANGE, "%s: tensor %s: byte size overflows 64 bits", f->path, name);
    t->nbytes = t->nelements * es;
    if (end - begin != t->nbytes)
        return ds4_err_set(err, DS4_EFORMAT,
                           "%s: tensor %s: %" PRIu64 " bytes in data_offsets, but %s x %" PRIu64
                           " elements needs %" PRIu64,
                           f->path, name, end - begin, ds4_st_dtype_name(t->dtype), t->nelements, t->nbytes);
    t->offset = f->data_offset + begin;
    t->data = f->base + t->offset;
    return 0;
}

static int parse_entry(ds4_st_file *f, const char *name, const json_t *v, ds4_st_tensor *t, ds4_err *err) {
    memset(t, 0, sizeof(*t));
    t->file = f->path;
    if (!json_is_object(v))
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: entry is not an object", f->path, name);
    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: missing string \"dtype\"", f->path, name);
    if (ds4_st_dtype_parse(json_string_value(dt), &t->dtype) != 0)
        return ds4_err_set(err, DS4_EUNSUPPORTED, "%s: tensor %s: unknown dtype \"%s\"", f->path, name,
                           json_string_value(dt));
    if (parse_shape(f, name, json_object_get(v, "shape"), t, err) != 0) return -1;
    if (parse_offsets(f, name, json_object_get(v, "data_offsets"), t, err) != 0) return -1;
    t->name = strdup(name);
    if (!t->name) return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", f->path);
    return 0;
}

static int cmp_offset(const void *a, const void *b) {
    const ds4_st_tensor *const *x = a, *const *y = b;
    return (*x)->offset < (*y)->offset ? -1 : (*x)->offset > (*y)->offset;
}

/* Two tensors sharing bytes would alias each other's weights. */
static int check_no_overlap(ds4_st_file *f, ds4_err *err) {
    if (f->n_tensors < 2) return 0;
    const ds4_st_tensor **order = malloc(f->n_tensors * sizeof(*order));
    if (!order) return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, f->n_tensors, sizeof(*order), cmp_offset);
    int rc = 0;
    for (size_t i = 1; i < f->n_tensors; i++) {
        const ds4_st_tensor *a = order[i - 1], *b = order[i];
        if (a->offset + a->nbytes > b->offset) {
            rc = ds4_err_set(err, DS4_EFORMAT, "%s: tensors %s and %s overlap in the data section", f->path, a->name,
                             b->name);
            break;
        }
    }
    free(order);
    return rc;
}

static int build_index(ds4_st_file *f, ds4_err *err) {
    ds4_name_index *ix = calloc(1, sizeof(*ix));
    if (!ix || ds4_name_index_init(ix, f->n_tensors, NULL) != 0) {
        free(ix);
        return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", f->path);
    }
    f->index = ix;
    for (size_t i = 0; i < f->n_tensors; i++)
        switch (ds4_name_index_put(ix, f->tensors[i].name, i, &(uint64_t){0}, NULL)) {
        case 1: break;
        case 0: return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s appears twice", f->path, f->tensors[i].name);
        default: return ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", f->path);
        }
    return 0;
}

static int parse_header(ds4_st_file *f, ds4_err *err) {
    if (f->size < 8)
        return ds4_err_set(err, DS4_EFORMAT, "%s: %" PRIu64 " bytes, too short for a safetensors header", f->path,
                           f->size);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)f->base[i] << (8 * i);
    if (hlen == 0 || hlen > DS4_ST_MAX_HEADER)
        return ds4_err_set(err, DS4_EFORMAT, "%s: header length %" PRIu64 " is not in 1..%llu", f->path, hlen,
                           DS4_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return ds4_err_set(err, DS4_EFORMAT,
                           "%s: header length %" PRIu64 " runs past the end of the %" PRIu64 "-byte file (truncated?)",
                           f->path, hlen, f->size);
    f->data_offset = 8 + hlen;
    if (f->base[8] != '{') return ds4_err_set(err, DS4_EFORMAT, "%s: header does not start with '{'", f->path);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return ds4_err_set(err, DS4_EFORMAT, "%s: header JSON, byte %d: %s", f->path, jerr.position + 8, jerr.text);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = ds4_err_set(err, DS4_EFORMAT, "%s: header is not a JSON object", f->path);
        goto done;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof(*f->tensors));
    if (!f->tensors) {
        rc = ds4_err_set(err, DS4_ENOMEM, "%s: out of memory", f->path);
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        if (parse_entry(f, key, val, &f->tensors[f->n_tensors], err) != 0) {
            rc = -1;
            goto done;
        }
        f->n_tensors++;
    }
    if (check_no_overlap(f, err) != 0 || build_index(f, err) != 0) rc = -1;
done:
    json_decref(root);
    return rc;
}

static ds4_st_file *open_common(ds4_st_file *f, ds4_err *err) {
    if (parse_header(f, err) != 0) {
        ds4_st_close(f);
        return NULL;
    }
    return f;
}

ds4_st_file *ds4_st_open_buffer(const void *buf, size_t size, const char *name, ds4_err *err) {
    ds4_st_file *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(name ? name : "<memory>"))) {
        free(f);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    f->base = buf;
    f->size = size;
    return open_common(f, err);
}

ds4_st_file *ds4_st_open(const char *path, ds4_err *err) {
    ds4_st_file *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path))) {
        free(f);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ds4_err_set(err, errno == ENOENT ? DS4_ENOTFOUND : DS4_EIO, "%s: %s", path, strerror(errno));
        ds4_st_close(f);
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ds4_err_set(err, DS4_EIO, "%s: %s", path, strerror(errno));
        close(fd);
        ds4_st_close(f);
        return NULL;
    }
    f->size = (uint64_t)st.st_size;
    if (f->size > 0) {
        void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            ds4_err_set(err, DS4_EIO, "%s: mmap: %s", path, strerror(errno));
            close(fd);
            f->size = 0;
            ds4_st_close(f);
            return NULL;
        }
        f->base = m;
        f->owns_map = 1;
    }
    close(fd);
    return open_common(f, err);
}

const ds4_st_tensor *ds4_st_find(const ds4_st_file *f, const char *name) {
    if (!f->index) return NULL;
    uint64_t i;
    return ds4_name_index_get(f->index, name, &i) ? &f->tensors[i] : NULL;
}

int ds4_st_expect(const ds4_st_tensor *t, const ds4_st_dtype *want, size_t nwant, uint32_t ndim, const uint64_t *shape,
                  ds4_err *err) {
    bool ok = nwant == 0;
    for (size_t i = 0; i < nwant; i++) ok |= t->dtype == want[i];
    if (!ok) {
        char list[128] = "";
        size_t n = 0;
        for (size_t i = 0; i < nwant && n < sizeof(list); i++)
            n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? " or " : "", ds4_st_dtype_name(want[i]));
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: dtype %s, expected %s", t->file, t->name,
                           ds4_st_dtype_name(t->dtype), list);
    }
    if (!shape) return 0;
    bool same = t->ndim == ndim;
    for (uint32_t i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char got[160], exp[160];
        ds4_st_tensor tmp = {.ndim = ndim};
        memcpy(tmp.shape, shape, ndim * sizeof(*shape));
        return ds4_err_set(err, DS4_EFORMAT, "%s: tensor %s: shape %s, expected %s", t->file, t->name,
                           ds4_st_shape_str(t, got, sizeof(got)), ds4_st_shape_str(&tmp, exp, sizeof(exp)));
    }
    return 0;
}

/* ---------------------------------------------------------- checkpoints */

typedef struct shard {
    char *file;      /* as written in the index */
    char *path;      /* dir/file */
    ds4_st_file *st; /* NULL until first use */
} shard;

struct ds4_st_ckpt {
    char *dir;
    size_t n; /* tensors in the weight map */
    char **names;
    size_t *shard_of;
    ds4_name_index names_ix;
    size_t n_shards;
    shard *shards;
    pthread_mutex_t lock;
};

static char *join_path(const char *dir, const char *file) {
    size_t a = strlen(dir), b = strlen(file);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, file, b + 1);
    return p;
}

void ds4_st_ckpt_close(ds4_st_ckpt *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) free(c->names[i]);
    free(c->names);
    free(c->shard_of);
    ds4_name_index_free(&c->names_ix);
    for (size_t i = 0; i < c->n_shards; i++) {
        free(c->shards[i].file);
        free(c->shards[i].path);
        ds4_st_close(c->shards[i].st);
    }
    free(c->shards);
    pthread_mutex_destroy(&c->lock);
    free(c->dir);
    free(c);
}

/* Shard names come from a file we do not control: keep them inside dir. */
static bool safe_shard_name(const char *s) {
    if (!*s || s[0] == '/') return false;
    const char *p = s;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.') return false;
        if (!slash) return true;
        p = slash + 1;
    }
}

static int shard_id(ds4_st_ckpt *c, const char *file, size_t *out, ds4_err *err) {
    for (size_t i = 0; i < c->n_shards; i++) {
        if (strcmp(c->shards[i].file, file) == 0) {
            *out = i;
            return 0;
        }
    }
    shard *grown = realloc(c->shards, (c->n_shards + 1) * sizeof(*grown));
    if (!grown) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    c->shards = grown;
    shard *s = &c->shards[c->n_shards];
    memset(s, 0, sizeof(*s));
    s->file = strdup(file);
    s->path = join_path(c->dir, file);
    c->n_shards++;
    if (!s->file || !s->path) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    *out = c->n_shards - 1;
    return 0;
}

static int add_weight(ds4_st_ckpt *c, const char *name, const char *file, ds4_err *err) {
    size_t sid;
    if (shard_id(c, file, &sid, err) != 0) return -1;
    c->names[c->n] = strdup(name);
    if (!c->names[c->n]) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    c->shard_of[c->n] = sid;
    /* JSON_REJECT_DUPLICATES already refused repeated names. */
    int rc = ds4_name_index_put(&c->names_ix, c->names[c->n], c->n, &(uint64_t){0}, NULL);
    c->n++;
    if (rc < 0) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return 0;
}

static int alloc_weights(ds4_st_ckpt *c, size_t n, ds4_err *err) {
    c->names = calloc(n ? n : 1, sizeof(*c->names));
    c->shard_of = calloc(n ? n : 1, sizeof(*c->shard_of));
    if (!c->names || !c->shard_of || ds4_name_index_init(&c->names_ix, n, NULL) != 0)
        return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    return 0;
}

static int load_index(ds4_st_ckpt *c, const char *index_path, ds4_err *err) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return ds4_err_set(err, DS4_EFORMAT, "%s: line %d: %s", index_path, jerr.line, jerr.text);
    int rc = 0;
    const json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        rc = ds4_err_set(err, DS4_EFORMAT, "%s: no \"weight_map\" object", index_path);
        goto done;
    }
    if (alloc_weights(c, json_object_size(map), err) != 0) {
        rc = -1;
        goto done;
    }
    const char *name;
    json_t *file;
    json_object_foreach((json_t *)map, name, file) {
        if (!json_is_string(file) || !safe_shard_name(json_string_value(file))) {
            rc = ds4_err_set(err, DS4_EFORMAT, "%s: weight_map[%s] is not a shard file name inside the directory",
                             index_path, name);
            goto done;
        }
        if (add_weight(c, name, json_string_value(file), err) != 0) {
            rc = -1;
            goto done;
        }
    }
done:
    json_decref(root);
    return rc;
}

/* Without an index, the directory holds one `model.safetensors`. */
static int load_single(ds4_st_ckpt *c, ds4_err *err) {
    const char *file = "model.safetensors";
    char *path = join_path(c->dir, file);
    if (!path) return ds4_err_set(err, DS4_ENOMEM, "out of memory");
    ds4_st_file *st = ds4_st_open(path, err);
    free(path);
    if (!st) return -1;
    size_t sid;
    if (alloc_weights(c, st->n_tensors, err) != 0 || shard_id(c, file, &sid, err) != 0) {
        ds4_st_close(st);
        return -1;
    }
    c->shards[sid].st = st;
    for (size_t i = 0; i < st->n_tensors; i++)
        if (add_weight(c, st->tensors[i].name, file, err) != 0) return -1;
    return 0;
}

static int check_shards_exist(ds4_st_ckpt *c, const char *index_path, ds4_err *err) {
    for (size_t s = 0; s < c->n_shards; s++) {
        struct stat st;
        if (stat(c->shards[s].path, &st) == 0 && S_ISREG(st.st_mode)) continue;
        const char *first = "?";
        size_t count = 0;
        for (size_t i = 0; i < c->n; i++) {
            if (c->shard_of[i] != s) continue;
            if (count++ == 0) first = c->names[i];
        }
        return ds4_err_set(err, DS4_ENOTFOUND,
                           "%s maps %zu tensors (first: %s) to shard %s, which is missing or not a regular file",
                           index_path, count, first, c->shards[s].path);
    }
    return 0;
}

ds4_st_ckpt *ds4_st_ckpt_open(const char *dir, ds4_err *err) {
    ds4_st_ckpt *c = calloc(1, sizeof(*c));
    if (!c || !(c->dir = strdup(dir))) {
        free(c);
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    char *index_path = join_path(dir, "model.safetensors.index.json");
    int rc;
    if (!index_path) {
        rc = ds4_err_set(err, DS4_ENOMEM, "out of memory");
    } else if (access(index_path, F_OK) == 0) {
        rc = load_index(c, index_path, err);
        if (rc == 0) rc = check_shards_exist(c, index_path, err);
    } else {
        rc = load_single(c, err);
        if (rc != 0 && err && err->code == DS4_ENOTFOUND)
            ds4_err_prefix(err, "%s: neither model.safetensors.index.json nor model.safetensors", dir);
    }
    free(index_path);
    if (rc != 0) {
        ds4_st_ckpt_close(c);
        return NULL;
    }
    return c;
}

const char *ds4_st_ckpt_dir(const ds4_st_ckpt *c) { return c->dir; }
size_t ds4_st_ckpt_count(const ds4_st_ckpt *c) { return c->n; }
const char *ds4_st_ckpt_name(const ds4_st_ckpt *c, size_t i) { return i < c->n ? c->names[i] : NULL; }

bool ds4_st_ckpt_has(const ds4_st_ckpt *c, const char *name) {
    uint64_t i;
    return ds4_name_index_get(&c->names_ix, name, &i);
}

size_t ds4_st_ckpt_shards_open(const ds4_st_ckpt *c) {
    size_t n = 0;
    pthread_mutex_lock((pthread_mutex_t *)&c->lock);
    for (size_t i = 0; i < c->n_shards; i++) n += c->shards[i].st != NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
    return n;
}

const ds4_st_tensor *ds4_st_ckpt_get(ds4_st_ckpt *c, const char *name, ds4_err *err) {
    uint64_t i;
    if (!ds4_name_index_get(&c->names_ix, name, &i)) {
        ds4_err_set(err, DS4_ENOTFOUND, "checkpoint %s has no tensor %s", c->dir, name);
        return NULL;
    }
    shard *s = &c->shards[c->shard_of[i]];
    pthread_mutex_lock(&c->lock);
    if (!s->st) s->st = ds4_st_open(s->path, err);
    ds4_st_file *st = s->st;
    pthread_mutex_unlock(&c->lock);
    if (!st) {
        ds4_err_prefix(err, "tensor %s", name);
        return NULL;
    }
    const ds4_st_tensor *t = ds4_st_find(st, name);
    if (!t)
        ds4_err_set(err, DS4_ENOTFOUND, "%s: no tensor %s, although the checkpoint index maps it to this shard",
                    s->path, name);
    return t;
}
