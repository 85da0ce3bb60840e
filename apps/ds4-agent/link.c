/*
 * link.c - what the UI thread and the worker thread share (see agent.h):
 * output bytes, status, the prompt queue, the interrupt flag and the
 * question being asked, under one mutex.
 *
 * The worker never blocks on the UI except in link_ask.  The UI learns of
 * news through a pipe (link_wake_fd) that holds at most one byte: bursts
 * of tokens do not fill it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"

struct agent_link {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* queue items, answers */
    int wake[2];
    bool wake_pending;
    ds4_strbuf out;
    agent_status st;
    char **q;
    size_t nq, capq;
    bool stop, busy, no_ui;
    volatile sig_atomic_t cancel;
    char *question, *choices;
    int answer; /* -1 while waiting */
};

agent_link *link_new(void) {
    agent_link *l = calloc(1, sizeof(*l));
    if (!l) return NULL;
    if (pipe(l->wake) != 0) {
        free(l);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        fcntl(l->wake[i], F_SETFL, fcntl(l->wake[i], F_GETFL) | O_NONBLOCK);
        fcntl(l->wake[i], F_SETFD, FD_CLOEXEC);
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->answer = -1;
    return l;
}

void link_free(agent_link *l) {
    if (!l) return;
    for (size_t i = 0; i < l->nq; i++) free(l->q[i]);
    free(l->q);
    ds4_strbuf_free(&l->out);
    free(l->question);
    free(l->choices);
    close(l->wake[0]);
    close(l->wake[1]);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

/* Called with the mutex held. */
static void wake_locked(agent_link *l) {
    if (l->wake_pending) return;
    char b = 1;
    if (write(l->wake[1], &b, 1) == 1) l->wake_pending = true;
}

int link_wake_fd(const agent_link *l) { return l->wake[0]; }

void link_drain_wake(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    char buf[16];
    while (read(l->wake[0], buf, sizeof(buf)) > 0) {}
    l->wake_pending = false;
    pthread_mutex_unlock(&l->mu);
}

void link_write(agent_link *l, const char *s, size_t n) {
    if (!n) return;
    pthread_mutex_lock(&l->mu);
    ds4_strbuf_append(&l->out, s, n);
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

size_t link_take_output(agent_link *l, ds4_strbuf *out) {
    pthread_mutex_lock(&l->mu);
    size_t n = l->out.len;
    if (n) ds4_strbuf_append(out, l->out.p, n);
    ds4_strbuf_truncate(&l->out, 0);
    l->out.failed = false;
    pthread_mutex_unlock(&l->mu);
    return n;
}

void link_set_status(agent_link *l, const agent_status *st) {
    pthread_mutex_lock(&l->mu);
    l->st = *st;
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

void link_update(agent_link *l, agent_state state, uint32_t done, uint32_t total) {
    pthread_mutex_lock(&l->mu);
    if (l->st.state != state) {
        l->st.generated = 0;
        l->st.tps = 0;
        if (state != ST_ERROR && state != ST_TOOL) l->st.detail[0] = 0;
    }
    l->st.state = state;
    l->st.done = done;
    l->st.total = total;
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

void link_set_ctx(agent_link *l, uint32_t used, uint32_t size) {
    pthread_mutex_lock(&l->mu);
    l->st.ctx_used = used;
    l->st.ctx_size = size;
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

void link_set_gen(agent_link *l, uint32_t generated, double tps) {
    pthread_mutex_lock(&l->mu);
    l->st.generated = generated;
    l->st.tps = tps;
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

void link_set_detail(agent_link *l, const char *detail) {
    pthread_mutex_lock(&l->mu);
    snprintf(l->st.detail, sizeof(l->st.detail), "%s", detail ? detail : "");
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

agent_status link_status(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    agent_status st = l->st;
    pthread_mutex_unlock(&l->mu);
    return st;
}

/* ------------------------------------------------------------ queue */

void link_queue_push(agent_link *l, const char *text) {
    char *copy = strdup(text);
    if (!copy) return;
    pthread_mutex_lock(&l->mu);
    if (l->nq == l->capq) {
        size_t cap = l->capq ? l->capq * 2 : 8;
        char **nq = realloc(l->q, cap * sizeof(*nq));
        if (!nq) {
            pthread_mutex_unlock(&l->mu);
            free(copy);
            return;
        }
        l->q = nq;
        l->capq = cap;
    }
    l->q[l->nq++] = copy;
    pthread_cond_broadcast(&l->cv);
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

static char *pop_locked(agent_link *l) {
    if (!l->nq) return NULL;
    char *t = l->q[0];
    memmove(l->q, l->q + 1, (l->nq - 1) * sizeof(*l->q));
    l->nq--;
    wake_locked(l);
    return t;
}

char *link_queue_pop(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    while (!l->nq && !l->stop) pthread_cond_wait(&l->cv, &l->mu);
    char *t = l->stop ? NULL : pop_locked(l);
    /* Busy from the moment an item is taken, so the UI never sees an idle
     * worker with an item in flight. */
    if (t) l->busy = true;
    pthread_mutex_unlock(&l->mu);
    return t;
}

char *link_queue_try_pop(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    char *t = pop_locked(l);
    pthread_mutex_unlock(&l->mu);
    return t;
}

char *link_queue_take_back(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    char *t = pop_locked(l);
    pthread_mutex_unlock(&l->mu);
    return t;
}

size_t link_queue_len(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    size_t n = l->nq;
    pthread_mutex_unlock(&l->mu);
    return n;
}

char *link_queue_peek(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    char *t = l->nq ? strdup(l->q[0]) : NULL;
    pthread_mutex_unlock(&l->mu);
    return t;
}

bool link_prompt_waiting(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    bool yes = false;
    for (size_t i = 0; i < l->nq && !yes; i++) yes = l->q[i][0] != '/';
    pthread_mutex_unlock(&l->mu);
    return yes;
}

void link_stop(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    l->cancel = 1;
    if (l->answer < 0 && l->question) l->answer = 0;
    pthread_cond_broadcast(&l->cv);
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

bool link_stopped(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    bool s = l->stop;
    pthread_mutex_unlock(&l->mu);
    return s;
}

void link_set_busy(agent_link *l, bool busy) {
    pthread_mutex_lock(&l->mu);
    l->busy = busy;
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
}

bool link_busy(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    bool b = l->busy;
    pthread_mutex_unlock(&l->mu);
    return b;
}

/* ------------------------------------------------------------ interrupt */

void link_interrupt(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    l->cancel = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void link_clear_interrupt(agent_link *l) {
    pthread_mutex_lock(&l->mu);
    l->cancel = l->stop ? 1 : 0;
    pthread_mutex_unlock(&l->mu);
}

bool link_interrupted(agent_link *l) { return l->cancel != 0; }

volatile sig_atomic_t *link_cancel_flag(agent_link *l) { return &l->cancel; }

/* ------------------------------------------------------------ questions */

void link_set_no_ui(agent_link *l, bool no_ui) {
    pthread_mutex_lock(&l->mu);
    l->no_ui = no_ui;
    pthread_mutex_unlock(&l->mu);
}

int link_ask(agent_link *l, const char *question, const char *choices) {
    pthread_mutex_lock(&l->mu);
    if (l->no_ui || l->stop) {
        pthread_mutex_unlock(&l->mu);
        return -1;
    }
    free(l->question);
    free(l->choices);
    l->question = strdup(question);
    l->choices = strdup(choices);
    l->answer = -1;
    wake_locked(l);
    while (l->answer < 0 && !l->stop && !l->cancel) pthread_cond_wait(&l->cv, &l->mu);
    int a = l->answer < 0 ? 0 : l->answer;
    free(l->question);
    free(l->choices);
    l->question = l->choices = NULL;
    l->answer = -1;
    wake_locked(l);
    pthread_mutex_unlock(&l->mu);
    return a;
}

bool link_question(agent_link *l, char *buf, size_t n, char *choices, size_t cn) {
    pthread_mutex_lock(&l->mu);
    bool yes = l->question && l->answer < 0;
    if (yes) {
        snprintf(buf, n, "%s", l->question);
        snprintf(choices, cn, "%s", l->choices);
    }
    pthread_mutex_unlock(&l->mu);
    return yes;
}

void link_answer(agent_link *l, int choice) {
    pthread_mutex_lock(&l->mu);
    if (l->question) {
        l->answer = choice;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
}
