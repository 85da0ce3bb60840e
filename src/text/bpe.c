/*
 * bpe.c - BPE merging of one piece and the piece cache (see bpe.h).
 */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "text/hash.h"

#define SMALL_MAX         48 /* symbols merged by linear scan */
#define CACHE_MAX_PIECE   64 /* longest cached piece, bytes */
#define CACHE_SLOTS       (1u << 17)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_ARENA       (6u << 20)

typedef struct cache_slot {
    uint64_t hash; /* 0 = empty (real hashes have the low bit set) */
    uint32_t off;  /* arena offset: key bytes, then the ids (4-aligned) */
    uint16_t klen;
    uint16_t nids;
} cache_slot;

typedef struct heap_entry {
    uint64_t key;   /* (rank << 32) | position of the left symbol */
    uint32_t ver;   /* the left symbol's version when pushed */
    int32_t merged; /* the pair's merge */
} heap_entry;

/* A symbol of a long piece.  `ver` changes whenever the pair starting at
 * this symbol changes (it merges, its right neighbour merges, or it is
 * absorbed), so a heap entry is current exactly when its version is. */
typedef struct node {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    uint32_t ver;
} node;

struct ds4_bpe {
    const ds4_vocab *v;
    cache_slot *slots;
    uint32_t n_entries;
    uint8_t *arena;
    size_t arena_used;

    int32_t *sym; /* symbols of the current piece */
    size_t sym_cap;
    node *nodes; /* long pieces */
    heap_entry *heap;
    size_t big_cap; /* nodes: big_cap, heap: 3 * big_cap */
};

void ds4_bpe_free(ds4_bpe *b) {
    if (!b) return;
    free(b->slots);
    free(b->arena);
    free(b->sym);
    free(b->nodes);
    free(b->heap);
    free(b);
}

ds4_bpe *ds4_bpe_new(const ds4_vocab *v, ds4_err *err) {
    ds4_bpe *b = calloc(1, sizeof(*b));
    if (b) {
        b->v = v;
        b->slots = calloc(CACHE_SLOTS, sizeof(cache_slot));
        b->arena = malloc(CACHE_ARENA);
        b->sym_cap = 256;
        b->sym = malloc(b->sym_cap * sizeof(int32_t));
    }
    if (!b || !b->slots || !b->arena || !b->sym) {
        ds4_bpe_free(b);
        ds4_err_set(err, DS4_ENOMEM, "BPE tokenizer state: out of memory");
        return NULL;
    }
    return b;
}

static bool ensure_sym(ds4_bpe *b, size_t n) {
    if (n <= b->sym_cap) return true;
    size_t cap = b->sym_cap;
    while (cap < n) cap *= 2;
    int32_t *p = realloc(b->sym, cap * sizeof(int32_t));
    if (!p) return false;
    b->sym = p;
    b->sym_cap = cap;
    return true;
}

static bool ensure_big(ds4_bpe *b, size_t n) {
    if (n <= b->big_cap) return true;
    size_t cap = b->big_cap ? b->big_cap : 1024;
    while (cap < n) cap *= 2;
    node *nodes = realloc(b->nodes, cap * sizeof(node));
    if (!nodes) return false;
    b->nodes = nodes;
    heap_entry *heap = realloc(b->heap, 3 * cap * sizeof(heap_entry));
    if (!heap) return false;
    b->heap = heap;
    b->big_cap = cap;
    return true;
}

/* Scratch space grown for a very long piece is given back after it, so
 * that one huge word does not keep megabytes per tokenizer. */
#define SCRATCH_KEEP ((size_t)1 << 16)
static void shrink_scratch(ds4_bpe *b) {
    if (b->big_cap > SCRATCH_KEEP) {
        free(b->nodes);
        free(b->heap);
        b->nodes = NULL;
        b->heap = NULL;
        b->big_cap = 0;
    }
    if (b->sym_cap > SCRATCH_KEEP) {
        int32_t *p = realloc(b->sym, 256 * sizeof(int32_t));
        if (p) {
            b->sym = p;
            b->sym_cap = 256;
        }
    }
}

/* Rank of the pair (a, b), INT32_MAX when it does not merge. */
static inline int32_t pair_rank(const ds4_vocab *v, int32_t a, int32_t b, int32_t *merged) {
    int32_t rank;
    return ds4_vocab_merge(v, a, b, &rank, merged) ? rank : INT32_MAX;
}

/* Linear-scan merging of sym[0..n); returns the new count. */
static size_t merge_small(const ds4_vocab *v, int32_t *sym, size_t n) {
    int32_t rank[SMALL_MAX], merged[SMALL_MAX];
    for (size_t i = 0; i + 1 < n; i++) rank[i] = pair_rank(v, sym[i], sym[i + 1], &merged[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT32_MAX) break;
        sym[best] = merged[best];
        /* Drop symbol best+1 and the pair that started at it. */
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof(int32_t));
        if (best + 2 < n) {
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof(int32_t));
            memmove(merged + best + 1, merged + best + 2, (n - best - 3) * sizeof(int32_t));
        }
        n--;
        if (best > 0) rank[best - 1] = pair_rank(v, sym[best - 1], sym[best], &merged[best - 1]);
        if (best + 1 < n) rank[best] = pair_rank(v, sym[best], sym[best + 1], &merged[best]);
    }
    return n;
}

/* A 4-ary min-heap on `key`: lowest rank first, then leftmost, exactly
 * HF's (rank, pos) order.  Four children per node halve the depth, which
 * matters for the long pieces this path exists for. */
static void sift_down(heap_entry *h, size_t n, size_t i, heap_entry e) {
    for (;;) {
        size_t c = 4 * i + 1;
        if (c >= n) break;
        size_t end = c + 4 < n ? c + 4 : n, best = c;
        for (size_t k = c + 1; k < end; k++)
            if (h[k].key < h[best].key) best = k;
        if (h[best].key >= e.key) break;
        h[i] = h[best];
        i = best;
    }
    h[i] = e;
}

static void heap_push(heap_entry *h, size_t *n, heap_entry e) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 4;
        if (e.key >= h[parent].key) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, size_t *n) {
    heap_entry top = h[0];
    if (--*n) sift_down(h, *n, 0, h[*n]);
    return top;
}

/* The heap entry for the pair starting at pos; false if it does not merge. */
static bool pair_entry(const ds4_vocab *v, const node *nd, int32_t pos, heap_entry *e) {
    int32_t merged, rank = pair_rank(v, nd[pos].id, nd[nd[pos].next].id, &merged);
    if (rank == INT32_MAX) return false;
    *e = (heap_entry){((uint64_t)(uint32_t)rank << 32) | (uint32_t)pos, nd[pos].ver, merged};
    return true;
}

/* Heap merging of sym[0..n) for long pieces; returns the new count. */
static size_t merge_big(ds4_bpe *b, int32_t *sym, size_t n) {
    node *nd = b->nodes;
    heap_entry *h = b->heap, e;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) nd[i] = (node){sym[i], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 0};
    for (size_t i = 0; i + 1 < n; i++)
        if (pair_entry(b->v, nd, (int32_t)i, &e)) h[hn++] = e;
    for (size_t i = hn > 1 ? (hn - 2) / 4 + 1 : 0; i-- > 0;) sift_down(h, hn, i, h[i]);
    while (hn) {
        e = heap_pop(h, &hn);
        int32_t pos = (int32_t)(uint32_t)e.key;
        node *left = &nd[pos];
        if (left->ver != e.ver) continue; /* made stale by an earlier merge */
        int32_t right = left->next;
        left->id = e.merged;
        left->ver++;
        nd[right].ver++;
        left->next = nd[right].next;
        if (left->next >= 0) nd[left->next].prev = pos;
        if (left->prev >= 0) {
            nd[left->prev].ver++;
            if (pair_entry(b->v, nd, left->prev, &e)) heap_push(h, &hn, e);
        }
        if (left->next >= 0 && pair_entry(b->v, nd, pos, &e)) heap_push(h, &hn, e);
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = nd[i].next) sym[m++] = nd[i].id;
    return m;
}

static void cache_clear(ds4_bpe *b) {
    memset(b->slots, 0, CACHE_SLOTS * sizeof(cache_slot));
    b->n_entries = 0;
    b->arena_used = 0;
}

/* a[0..n) == b[0..n) for the short keys of the cache, without a call. */
static inline bool key_equal(const uint8_t *a, const char *b, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        if (x != y) return false;
    }
    for (; i < n; i++)
        if (a[i] != (uint8_t)b[i]) return false;
    return true;
}

static cache_slot *cache_find(ds4_bpe *b, const char *s, size_t n, uint64_t hash) {
    uint32_t i = (uint32_t)(hash >> 32) & (CACHE_SLOTS - 1);
    for (;;) {
        cache_slot *c = &b->slots[i];
        if (c->hash == 0) return c;
        if (c->hash == hash && c->klen == n && key_equal(b->arena + c->off, s, n)) return c;
        i = (i + 1) & (CACHE_SLOTS - 1);
    }
}

static void cache_put(ds4_bpe *b, const char *s, size_t n, uint64_t hash, const int32_t *ids, size_t nids) {
    size_t off = b->arena_used;
    size_t ids_off = (off + n + 3) & ~(size_t)3;
    size_t end = ids_off + nids * sizeof(int32_t);
    if (b->n_entries >= CACHE_MAX_ENTRIES || end > CACHE_ARENA) {
        cache_clear(b);
        off = 0;
        ids_off = (n + 3) & ~(size_t)3;
        end = ids_off + nids * sizeof(int32_t);
    }
    cache_slot *c = cache_find(b, s, n, hash);
    memcpy(b->arena + off, s, n);
    memcpy(b->arena + ids_off, ids, nids * sizeof(int32_t));
    *c = (cache_slot){hash, (uint32_t)off, (uint16_t)n, (uint16_t)nids};
    b->arena_used = end;
    b->n_entries++;
}

int ds4_bpe_piece(ds4_bpe *b, const char *s, size_t n, ds4_tokens *out) {
    uint64_t hash = 0;
    if (n <= CACHE_MAX_PIECE) {
        hash = ds4_hash_bytes(s, n) | 1;
        cache_slot *c = cache_find(b, s, n, hash);
        if (c->hash) {
            const uint32_t ids_off = (c->off + c->klen + 3) & ~3u;
            ds4_tokens_append(out, (const int32_t *)(const void *)(b->arena + ids_off), c->nids);
            return 0;
        }
    }
    if (!ensure_sym(b, n)) return -1;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ds4_vocab_byte_id(b->v, (uint8_t)s[i]);
        if (id >= 0) b->sym[m++] = id;
    }
    if (m > SMALL_MAX) {
        if (!ensure_big(b, m)) return -1;
        m = merge_big(b, b->sym, m);
    } else {
        m = merge_small(b->v, b->sym, m);
    }
    if (n <= CACHE_MAX_PIECE) cache_put(b, s, n, hash, b->sym, m);
    ds4_tokens_append(out, b->sym, m);
    shrink_scratch(b);
    return 0;
}
