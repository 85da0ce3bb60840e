/*
 * views.c - which lines of which files the model has seen (see tools.h).
 *
 * A line edit names lines by number, and numbers go stale: the file may
 * have changed on disk, or an earlier edit shifted everything below it.
 * So each file the model read or searched keeps, per line, whether it was
 * shown and a 64-bit hash of the text it had then.  An edit of lines the
 * model never saw, or whose text is no longer what it saw, is refused
 * with a message telling it to read them again.  After an edit the lines
 * below that moved count as unseen (an old number must not hit a line that
 * merely looks the same, a lone "}" say) until the model reads them again,
 * and the replaced lines count as seen, since the result shows them.
 */
#include <stdlib.h>
#include <string.h>

#include "tools.h"

typedef struct line_seen {
    bool known;
    uint64_t hash;
} line_seen;

struct file_view {
    char *path;
    line_seen *lines;
    int n, cap;
    file_view *next;
};

static uint64_t hash_line(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static file_view *find(views *v, const char *path, bool create) {
    for (file_view *f = v->head; f; f = f->next)
        if (!strcmp(f->path, path)) return f;
    if (!create) return NULL;
    file_view *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return NULL;
    }
    f->next = v->head;
    v->head = f;
    return f;
}

/* Make room for n lines (new ones unknown). */
static bool resize(file_view *f, int n) {
    if (n > f->cap) {
        int cap = f->cap ? f->cap : 256;
        while (cap < n) cap *= 2;
        line_seen *nl = realloc(f->lines, (size_t)cap * sizeof(*nl));
        if (!nl) return false;
        f->lines = nl;
        f->cap = cap;
    }
    for (int i = f->n; i < n; i++) f->lines[i] = (line_seen){0};
    f->n = n;
    return true;
}

static void free_view(file_view *f) {
    free(f->path);
    free(f->lines);
    free(f);
}

void views_clear(views *v) {
    while (v->head) {
        file_view *n = v->head->next;
        free_view(v->head);
        v->head = n;
    }
}

void views_free(views *v) { views_clear(v); }

void views_forget(views *v, const char *path) {
    for (file_view **p = &v->head; *p; p = &(*p)->next)
        if (!strcmp((*p)->path, path)) {
            file_view *f = *p;
            *p = f->next;
            free_view(f);
            return;
        }
}

void views_see(views *v, const char *path, int first, int n, const char *const *lines, const size_t *lens) {
    file_view *f = find(v, path, true);
    if (!f || n <= 0) return;
    if (first - 1 + n > f->n && !resize(f, first - 1 + n)) return;
    for (int i = 0; i < n; i++) f->lines[first - 1 + i] = (line_seen){true, hash_line(lines[i], lens[i])};
}

bool views_check(views *v, const char *path, int first, int last, const char *const *lines, const size_t *lens,
                 int total, char *msg, size_t msg_len) {
    file_view *f = find(v, path, false);
    if (!f) {
        snprintf(msg, msg_len, "lines %d-%d were never shown to you: read them first (or use old/new)", first, last);
        return false;
    }
    for (int ln = first; ln <= last; ln++) {
        if (ln > total) {
            snprintf(msg, msg_len, "line %d does not exist: the file has %d lines now", ln, total);
            return false;
        }
        if (ln > f->n || !f->lines[ln - 1].known) {
            snprintf(msg, msg_len, "line %d was not shown to you since the file last changed: read lines %d-%d again",
                     ln, first, last);
            return false;
        }
        if (f->lines[ln - 1].hash != hash_line(lines[ln - 1], lens[ln - 1])) {
            snprintf(msg, msg_len, "line %d changed since you read it: read lines %d-%d again", ln, first, last);
            return false;
        }
    }
    return true;
}

void views_edited(views *v, const char *path, int first, int last, int n_new, const char *const *lines,
                  const size_t *lens, int total) {
    file_view *f = find(v, path, true);
    if (!f) return;
    int removed = last - first + 1, old_n = f->n;
    line_seen *old = old_n ? malloc((size_t)old_n * sizeof(*old)) : NULL;
    if (old_n && !old) {
        views_forget(v, path);
        return;
    }
    if (old_n) memcpy(old, f->lines, (size_t)old_n * sizeof(*old));
    f->n = 0;
    if (!resize(f, total)) {
        free(old);
        views_forget(v, path);
        return;
    }
    for (int i = 0; i < total; i++) {
        int ln = i + 1;
        if (ln < first) f->lines[i] = ln <= old_n ? old[i] : (line_seen){0};
        else if (ln < first + n_new) f->lines[i] = (line_seen){true, hash_line(lines[i], lens[i])};
        else if (n_new == removed && ln <= old_n) f->lines[i] = old[i];
        else f->lines[i] = (line_seen){0};
    }
    free(old);
}
