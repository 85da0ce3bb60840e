/*
 * vocab.c - building and querying the BPE vocabulary (see vocab.h).
 *
 * Three private tables make tokenization cheap: token string -> id (open
 * addressing over ids), (left id, right id) -> (rank, merged id) for the
 * merges, and the added tokens bucketed by first byte, longest first, for
 * leftmost-longest matching in pre-rendered transcripts.  All strings are
 * copied into one arena so the vocabulary outlives its source (a GGUF
 * mapping or a parsed JSON document).
 */
#include "text/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "text/hash.h"
#include "text/utf8.h"

typedef struct merge_slot {
    uint64_t key; /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t merged;
} merge_slot;

struct ds4_vocab {
    uint32_t n;
    char *arena;       /* token strings then decoded bytes, NUL-separated */
    uint64_t *str_off; /* stored string of token i */
    uint32_t *str_len;
    uint64_t *dec_off; /* decoded bytes of token i */
    uint32_t *dec_len;
    uint8_t *type;

    int32_t *str_slots; /* string -> id, -1 = empty */
    uint64_t str_mask;

    merge_slot *merge_slots;
    uint64_t merge_mask;
    uint32_t n_merges;

    int32_t byte_id[256];

    int32_t *added;            /* added token ids, by first byte, longest first */
    uint32_t added_start[257]; /* bucket of byte c: added[start[c] .. start[c+1]) */

    int32_t bos, eos;
};

static uint64_t table_size_for(uint64_t n) {
    uint64_t size = 16;
    while (size < n * 2) size *= 2;
    return size;
}

uint32_t ds4_vocab_size(const ds4_vocab *v) { return v->n; }
uint32_t ds4_vocab_n_merges(const ds4_vocab *v) { return v->n_merges; }
int32_t ds4_vocab_bos(const ds4_vocab *v) { return v->bos; }
int32_t ds4_vocab_eos(const ds4_vocab *v) { return v->eos; }

ds4_str ds4_vocab_token(const ds4_vocab *v, int32_t id) { return (ds4_str){v->arena + v->str_off[id], v->str_len[id]}; }

ds4_token_type ds4_vocab_type(const ds4_vocab *v, int32_t id) { return (ds4_token_type)v->type[id]; }

ds4_str ds4_vocab_token_bytes(const ds4_vocab *v, int32_t id) {
    return (ds4_str){v->arena + v->dec_off[id], v->dec_len[id]};
}

int32_t ds4_vocab_byte_id(const ds4_vocab *v, uint8_t b) { return v->byte_id[b]; }

int32_t ds4_vocab_find(const ds4_vocab *v, const char *s, size_t n) {
    uint64_t i = ds4_hash_bytes(s, n) & v->str_mask;
    for (;;) {
        int32_t id = v->str_slots[i];
        if (id < 0) return -1;
        if (v->str_len[id] == n && memcmp(v->arena + v->str_off[id], s, n) == 0) return id;
        i = (i + 1) & v->str_mask;
    }
}

static bool is_added_type(uint8_t t) { return t == DS4_TOKEN_CONTROL || t == DS4_TOKEN_USER_DEFINED; }

int32_t ds4_vocab_find_added(const ds4_vocab *v, const char *s, size_t n) {
    if (n == 0) return -1;
    uint8_t c = (uint8_t)s[0];
    for (uint32_t k = v->added_start[c]; k < v->added_start[c + 1]; k++) {
        int32_t id = v->added[k];
        if (v->str_len[id] == n && memcmp(v->arena + v->str_off[id], s, n) == 0) return id;
    }
    return -1;
}

bool ds4_vocab_merge(const ds4_vocab *v, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t i = ds4_hash_u64(key) & v->merge_mask;
    for (;;) {
        const merge_slot *s = &v->merge_slots[i];
        if (s->key == UINT64_MAX) return false;
        if (s->key == key) {
            *rank = s->rank;
            *merged = s->merged;
            return true;
        }
        i = (i + 1) & v->merge_mask;
    }
}

int32_t ds4_vocab_match_added(const ds4_vocab *v, const char *s, size_t n, size_t *len) {
    if (n == 0) return -1;
    uint8_t c = (uint8_t)s[0];
    for (uint32_t k = v->added_start[c]; k < v->added_start[c + 1]; k++) {
        int32_t id = v->added[k];
        uint32_t l = v->str_len[id];
        if (l <= n && memcmp(v->arena + v->str_off[id], s, l) == 0) {
            *len = l;
            return id;
        }
    }
    return -1;
}

bool ds4_vocab_added_first_byte(const ds4_vocab *v, uint8_t c) { return v->added_start[c] != v->added_start[c + 1]; }

void ds4_vocab_free(ds4_vocab *v) {
    if (!v) return;
    free(v->arena);
    free(v->str_off);
    free(v->str_len);
    free(v->dec_off);
    free(v->dec_len);
    free(v->type);
    free(v->str_slots);
    free(v->merge_slots);
    free(v->added);
    free(v);
}

/* Decoded form of a stored token string (HF ByteLevel decoder): the bytes
 * its characters stand for if every character is in the byte-level
 * alphabet, else the string itself.  Writes at most `n` bytes to out. */
static uint32_t decode_token_string(const char *s, uint32_t n, char *out) {
    uint32_t o = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t cp;
        int l = ds4_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        int b = l ? ds4_bytelevel_byte(cp) : -1;
        if (b < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)b;
        i += (uint32_t)l;
    }
    return o;
}

static int copy_tokens(ds4_vocab *v, const ds4_vocab_src *src, ds4_err *err) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < src->n_tokens; i++) {
        if (src->tokens[i].len > UINT32_MAX / 2)
            return ds4_err_set(err, DS4_ERANGE, "token %u: string of %llu bytes is too long", i,
                               (unsigned long long)src->tokens[i].len);
        total += 2 * (src->tokens[i].len + 1);
    }
    v->arena = malloc(total ? total : 1);
    v->str_off = malloc(sizeof(uint64_t) * (src->n_tokens + 1));
    v->str_len = malloc(sizeof(uint32_t) * (src->n_tokens + 1));
    v->dec_off = malloc(sizeof(uint64_t) * (src->n_tokens + 1));
    v->dec_len = malloc(sizeof(uint32_t) * (src->n_tokens + 1));
    v->type = malloc(src->n_tokens + 1);
    if (!v->arena || !v->str_off || !v->str_len || !v->dec_off || !v->dec_len || !v->type)
        return ds4_err_set(err, DS4_ENOMEM, "vocabulary of %u tokens: out of memory", src->n_tokens);

    uint64_t pos = 0;
    for (uint32_t i = 0; i < src->n_tokens; i++) {
        int32_t t = src->types ? src->types[i] : DS4_TOKEN_NORMAL;
        if (t < DS4_TOKEN_UNDEFINED || t > DS4_TOKEN_BYTE)
            return ds4_err_set(err, DS4_EFORMAT, "token %u: type %d is not a GGUF token type", i, t);
        v->type[i] = (uint8_t)t;
        uint32_t len = (uint32_t)src->tokens[i].len;
        v->str_off[i] = pos;
        v->str_len[i] = len;
        if (len) memcpy(v->arena + pos, src->tokens[i].ptr, len);
        v->arena[pos + len] = '\0';
        pos += len + 1;
        v->dec_off[i] = pos;
        v->dec_len[i] = t == DS4_TOKEN_UNUSED ? 0 : decode_token_string(src->tokens[i].ptr, len, v->arena + pos);
        v->arena[pos + v->dec_len[i]] = '\0';
        pos += v->dec_len[i] + 1;
    }
    return 0;
}

/* string -> id.  Duplicate strings keep the lowest id, as a reverse map
 * built in id order would. */
static int index_strings(ds4_vocab *v, ds4_err *err) {
    v->str_mask = table_size_for(v->n) - 1;
    v->str_slots = malloc(sizeof(int32_t) * (v->str_mask + 1));
    if (!v->str_slots) return ds4_err_set(err, DS4_ENOMEM, "vocabulary index: out of memory");
    memset(v->str_slots, 0xff, sizeof(int32_t) * (v->str_mask + 1));
    for (uint32_t id = 0; id < v->n; id++) {
        const char *s = v->arena + v->str_off[id];
        uint32_t n = v->str_len[id];
        if (ds4_vocab_find(v, s, n) >= 0) continue;
        uint64_t i = ds4_hash_bytes(s, n) & v->str_mask;
        while (v->str_slots[i] >= 0) i = (i + 1) & v->str_mask;
        v->str_slots[i] = (int32_t)id;
    }
    return 0;
}

static void merge_put(ds4_vocab *v, uint64_t key, int32_t rank, int32_t merged) {
    uint64_t i = ds4_hash_u64(key) & v->merge_mask;
    while (v->merge_slots[i].key != UINT64_MAX && v->merge_slots[i].key != key) i = (i + 1) & v->merge_mask;
    /* A repeated pair takes the later rank, as HF's merge map does. */
    v->merge_slots[i] = (merge_slot){key, rank, merged};
}

static int index_merges(ds4_vocab *v, const ds4_vocab_src *src, ds4_err *err) {
    v->n_merges = src->n_merges;
    v->merge_mask = table_size_for(src->n_merges) - 1;
    v->merge_slots = malloc(sizeof(merge_slot) * (v->merge_mask + 1));
    if (!v->merge_slots) return ds4_err_set(err, DS4_ENOMEM, "merge table: out of memory");
    memset(v->merge_slots, 0xff, sizeof(merge_slot) * (v->merge_mask + 1));

    char *joined = NULL;
    size_t joined_cap = 0;
    for (uint32_t r = 0; r < src->n_merges; r++) {
        const char *m = src->merges[r].ptr;
        size_t n = src->merges[r].len;
        const char *sp = memchr(m, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - m))) {
            free(joined);
            return ds4_err_set(err, DS4_EFORMAT, "merge %u \"%.*s\": expected exactly one space", r,
                               (int)(n > 64 ? 64 : n), m);
        }
        size_t la = (size_t)(sp - m), lb = n - la - 1;
        int32_t a = ds4_vocab_find(v, m, la);
        int32_t b = ds4_vocab_find(v, sp + 1, lb);
        if (joined_cap < la + lb) {
            joined_cap = (la + lb) * 2 + 16;
            char *p = realloc(joined, joined_cap);
            if (!p) {
                free(joined);
                return ds4_err_set(err, DS4_ENOMEM, "merge table: out of memory");
            }
            joined = p;
        }
        memcpy(joined, m, la);
        memcpy(joined + la, sp + 1, lb);
        int32_t ab = ds4_vocab_find(v, joined, la + lb);
        if (a < 0 || b < 0 || ab < 0) {
            free(joined);
            return ds4_err_set(err, DS4_EFORMAT, "merge %u \"%.*s\": %s is not in the vocabulary", r,
                               (int)(n > 64 ? 64 : n), m,
                               a < 0   ? "left side"
                               : b < 0 ? "right side"
                                       : "merged token");
        }
        merge_put(v, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, (int32_t)r, ab);
    }
    free(joined);
    return 0;
}

static int added_cmp_v(const void *x, const void *y, void *vv) {
    const ds4_vocab *v = vv;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    uint8_t ca = (uint8_t)v->arena[v->str_off[a]], cb = (uint8_t)v->arena[v->str_off[b]];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (v->str_len[a] != v->str_len[b]) return v->str_len[a] > v->str_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static int index_added(ds4_vocab *v, ds4_err *err) {
    uint32_t count = 0;
    for (uint32_t id = 0; id < v->n; id++)
        if (is_added_type(v->type[id]) && v->str_len[id] > 0) count++;
    v->added = malloc(sizeof(int32_t) * (count + 1));
    if (!v->added) return ds4_err_set(err, DS4_ENOMEM, "added tokens: out of memory");
    uint32_t k = 0;
    for (uint32_t id = 0; id < v->n; id++)
        if (is_added_type(v->type[id]) && v->str_len[id] > 0) v->added[k++] = (int32_t)id;
    qsort_r(v->added, count, sizeof(int32_t), added_cmp_v, v);
    memset(v->added_start, 0, sizeof(v->added_start));
    for (uint32_t i = 0; i < count; i++) v->added_start[(uint8_t)v->arena[v->str_off[v->added[i]]] + 1]++;
    for (int c = 0; c < 256; c++) v->added_start[c + 1] += v->added_start[c];
    return 0;
}

static void index_bytes(ds4_vocab *v) {
    for (int b = 0; b < 256; b++) {
        char s[4];
        int l = ds4_utf8_encode(ds4_bytelevel_cp((uint8_t)b), s);
        v->byte_id[b] = ds4_vocab_find(v, s, (size_t)l);
    }
}

ds4_vocab *ds4_vocab_new(const ds4_vocab_src *src, ds4_err *err) {
    const char *pre = src->pre ? src->pre : DS4_PRE_JOYAI;
    if (strcmp(pre, DS4_PRE_JOYAI) != 0 && strcmp(pre, DS4_PRE_DEEPSEEK_V3) != 0) {
        ds4_err_set(err, DS4_EUNSUPPORTED, "pre-tokenizer \"%s\" is not supported (expected \"%s\")", pre,
                    DS4_PRE_JOYAI);
        return NULL;
    }
    if (src->n_tokens == 0 || src->n_tokens > (uint32_t)INT32_MAX) {
        ds4_err_set(err, DS4_EFORMAT, "vocabulary has %u tokens", src->n_tokens);
        return NULL;
    }
    if (src->bos_id >= (int64_t)src->n_tokens || src->eos_id >= (int64_t)src->n_tokens || src->bos_id < -1 ||
        src->eos_id < -1) {
        ds4_err_set(err, DS4_ERANGE, "BOS id %d / EOS id %d outside a vocabulary of %u tokens", src->bos_id,
                    src->eos_id, src->n_tokens);
        return NULL;
    }
    ds4_vocab *v = calloc(1, sizeof(*v));
    if (!v) {
        ds4_err_set(err, DS4_ENOMEM, "vocabulary: out of memory");
        return NULL;
    }
    v->n = src->n_tokens;
    v->bos = src->bos_id;
    v->eos = src->eos_id;
    if (copy_tokens(v, src, err) || index_strings(v, err) || index_merges(v, src, err) || index_added(v, err)) {
        ds4_vocab_free(v);
        return NULL;
    }
    index_bytes(v);
    return v;
}
