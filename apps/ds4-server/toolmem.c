/*
 * toolmem.c - the tool-call id memory behind exact DSML replay
 * (as ds4 keeps it).
 *
 * When the model calls tools, the server gives each call an id and
 * remembers, for that id, the exact DSML block the model sampled (white
 * space before it included).  A later request that replays the assistant
 * turn carries those ids; if all the ids of that turn map to the same block
 * (and as many calls as the block holds), and the turn's calls are the
 * block's calls - the same names and arguments that are equal as JSON,
 * call by call - the chat renderer emits the sampled bytes instead of a
 * canonical rendering, so the prompt is exactly what the model produced
 * whatever the client did to the spelling of the arguments (key order,
 * spacing), and the live KV state stays reusable.  A client that changed
 * a call (edited its arguments, renamed it) gets its own call rendered.
 * Ids are never trusted to carry text: the bytes come from this memory
 * only.
 *
 * A hash table by id, blocks shared by the ids of one turn, least recently
 * used entries dropped beyond max_ids or max_bytes.  Thread-safe: the
 * connection threads render, the worker stores.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "text/dsml_parse.h"

typedef struct tblock {
    char *s;
    size_t n;
    int refs;
    int n_calls;
    json_t *calls; /* [{"name", "arguments" (parsed)}] of the block */
} tblock;

typedef struct tentry {
    char *id;
    tblock *b;
    struct tentry *prev, *next; /* LRU list, most recent first */
    struct tentry *hnext;
} tentry;

struct toolmem {
    pthread_mutex_t mu;
    tentry **buckets;
    size_t nbuckets;
    size_t count;
    uint64_t bytes;
    uint32_t max_ids;
    uint64_t max_bytes;
    tentry *head, *tail;
};

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

toolmem *toolmem_new(uint32_t max_ids, uint64_t max_bytes) {
    toolmem *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    m->nbuckets = 4096;
    m->buckets = calloc(m->nbuckets, sizeof(*m->buckets));
    if (!m->buckets) {
        free(m);
        return NULL;
    }
    m->max_ids = max_ids;
    m->max_bytes = max_bytes;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

static void unlink_lru(toolmem *m, tentry *e) {
    if (e->prev) e->prev->next = e->next;
    else m->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else m->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(toolmem *m, tentry *e) {
    e->next = m->head;
    e->prev = NULL;
    if (m->head) m->head->prev = e;
    m->head = e;
    if (!m->tail) m->tail = e;
}

static void release_block(toolmem *m, tblock *b) {
    if (--b->refs > 0) return;
    m->bytes -= b->n;
    json_decref(b->calls);
    free(b->s);
    free(b);
}

static void remove_entry(toolmem *m, tentry *e) {
    tentry **pp = &m->buckets[hash(e->id) % m->nbuckets];
    while (*pp != e) pp = &(*pp)->hnext;
    *pp = e->hnext;
    unlink_lru(m, e);
    m->bytes -= strlen(e->id);
    release_block(m, e->b);
    free(e->id);
    free(e);
    m->count--;
}

static tentry *find(toolmem *m, const char *id) {
    for (tentry *e = m->buckets[hash(id) % m->nbuckets]; e; e = e->hnext)
        if (strcmp(e->id, id) == 0) return e;
    return NULL;
}

void toolmem_free(toolmem *m) {
    if (!m) return;
    while (m->head) remove_entry(m, m->head);
    free(m->buckets);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* Store n ids sharing one block. */
void toolmem_put_many(toolmem *m, const char *const *ids, int n, const char *dsml, size_t len) {
    if (n <= 0 || len == 0) return;
    tblock *b = calloc(1, sizeof(*b));
    char *s = malloc(len + 1);
    if (!b || !s) {
        free(b);
        free(s);
        return;
    }
    memcpy(s, dsml, len);
    s[len] = '\0';
    /* How many calls the block holds (ids restored from disk come one at a
     * time, so this cannot be taken from n). */
    ds4_dsml_result pr;
    int n_calls = ds4_dsml_parse(s, len, false, &pr, NULL) == 0 ? (int)pr.n_calls : -1;
    json_t *calls = json_array();
    for (int i = 0; i < n_calls; i++) {
        json_t *a = json_loadb(pr.calls[i].arguments, pr.calls[i].arguments_len, JSON_DECODE_ANY | JSON_ALLOW_NUL,
                               NULL);
        json_array_append_new(calls, json_pack("{s:s#,s:o}", "name", pr.calls[i].name, pr.calls[i].name_len,
                                               "arguments", a ? a : json_null()));
    }
    ds4_dsml_result_free(&pr);
    *b = (tblock){s, len, 0, n_calls, calls};
    pthread_mutex_lock(&m->mu);
    m->bytes += len;
    b->refs = 1; /* held while adding */
    for (int i = 0; i < n; i++) {
        tentry *old = find(m, ids[i]);
        if (old) remove_entry(m, old);
        tentry *e = calloc(1, sizeof(*e));
        if (!e || !(e->id = strdup(ids[i]))) {
            free(e);
            continue;
        }
        e->b = b;
        b->refs++;
        size_t h = hash(e->id) % m->nbuckets;
        e->hnext = m->buckets[h];
        m->buckets[h] = e;
        push_front(m, e);
        m->count++;
        m->bytes += strlen(e->id);
    }
    release_block(m, b);
    while (m->tail && (m->count > m->max_ids || m->bytes > m->max_bytes)) remove_entry(m, m->tail);
    pthread_mutex_unlock(&m->mu);
}

void toolmem_put(toolmem *m, const char *id, const char *dsml, size_t n) { toolmem_put_many(m, &id, 1, dsml, n); }

char *toolmem_get(toolmem *m, const char *id, size_t *n) {
    pthread_mutex_lock(&m->mu);
    tentry *e = find(m, id);
    char *copy = NULL;
    if (e && (copy = malloc(e->b->n + 1))) {
        memcpy(copy, e->b->s, e->b->n + 1);
        *n = e->b->n;
        unlink_lru(m, e);
        push_front(m, e);
    }
    pthread_mutex_unlock(&m->mu);
    return copy;
}

size_t toolmem_count(toolmem *m) {
    pthread_mutex_lock(&m->mu);
    size_t n = m->count;
    pthread_mutex_unlock(&m->mu);
    return n;
}

ds4_kvc_tool *toolmem_entries_in(toolmem *m, const char *text, size_t n, size_t *count) {
    *count = 0;
    pthread_mutex_lock(&m->mu);
    ds4_kvc_tool *out = NULL;
    size_t cap = 0, scanned = 0;
    /* The most recent ids are the ones a live conversation holds. */
    for (tentry *e = m->head; e && scanned < 20000; e = e->next, scanned++) {
        if (e->b->n > n || !memmem(text, n, e->b->s, e->b->n)) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            ds4_kvc_tool *t = realloc(out, cap * sizeof(*t));
            if (!t) break;
            out = t;
        }
        char *id = strdup(e->id), *s = malloc(e->b->n);
        if (!id || !s) {
            free(id);
            free(s);
            break;
        }
        memcpy(s, e->b->s, e->b->n);
        out[(*count)++] = (ds4_kvc_tool){id, (uint32_t)strlen(id), s, (uint32_t)e->b->n};
    }
    pthread_mutex_unlock(&m->mu);
    return out;
}

void toolmem_entries_free(ds4_kvc_tool *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free((char *)t[i].id);
        free((char *)t[i].dsml);
    }
    free(t);
}

/* The client's call is the block's call i: same name, arguments equal as
 * JSON (a string is parsed first). */
static bool same_call(const tblock *b, size_t i, const json_t *call) {
    const json_t *fn = json_object_get(call, "function");
    const json_t *mine = json_array_get(b->calls, i);
    const char *name = json_string_value(json_object_get(fn, "name"));
    const char *bname = json_string_value(json_object_get(mine, "name"));
    if (!name || !bname || strcmp(name, bname) != 0) return false;
    const json_t *a = json_object_get(fn, "arguments");
    json_t *parsed = json_is_string(a) ? json_loadb(json_string_value(a), json_string_length(a),
                                                    JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL)
                                       : json_incref((json_t *)a);
    bool eq = parsed && json_equal(parsed, json_object_get(mine, "arguments"));
    json_decref(parsed);
    return eq;
}

/* Replay when every call of the turn has an id that maps to one block
 * holding exactly these calls, in this order; `count` says whether the
 * outcome goes into the replay statistics. */
static int render_calls(render_calls_ctx *c, const json_t *tool_calls, ds4_rendered *r, bool count) {
    server *s = c->s;
    if (!s->o.exact_replay || !json_is_array(tool_calls) || json_array_size(tool_calls) == 0) return 0;
    toolmem *m = s->tools;
    pthread_mutex_lock(&m->mu);
    tblock *b = NULL;
    bool ok = true;
    for (size_t i = 0; i < json_array_size(tool_calls) && ok; i++) {
        const char *id = json_string_value(json_object_get(json_array_get(tool_calls, i), "id"));
        tentry *e = id ? find(m, id) : NULL;
        if (!e || (b && (e->b->n != b->n || memcmp(e->b->s, b->s, b->n) != 0))) ok = false;
        else b = e->b;
    }
    ok = ok && b && b->n_calls == (int)json_array_size(tool_calls);
    for (size_t i = 0; ok && i < json_array_size(tool_calls); i++) ok = same_call(b, i, json_array_get(tool_calls, i));
    if (ok) ds4_rendered_trusted(r, b->s, b->n);
    pthread_mutex_unlock(&m->mu);
    if (count) {
        if (ok) c->replayed++;
        else c->canonical++;
    }
    return ok ? 1 : 0;
}

int toolmem_render_calls(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err) {
    (void)err;
    return render_calls(ctx, tool_calls, r, true);
}

int toolmem_render_calls_quiet(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err) {
    (void)err;
    return render_calls(ctx, tool_calls, r, false);
}
