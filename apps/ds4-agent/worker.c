/*
 * worker.c - the worker thread (see agent.h): it owns the model and the
 * tools.  First it brings the model to the system prompt (from its KV file
 * when one was saved), then it runs what the UI queues, one item at a
 * time: prompts as turns, "/..." lines as commands.  A /save typed while
 * it was busy runs at the next safe point (between tool rounds, or after
 * the item).  /quit ends the thread and the program.
 */
#include <stdlib.h>
#include <string.h>

#include "agent.h"

struct worker {
    pthread_t thread;
    agent *a;
    agent_link *l;
};

void worker_item(agent *a, agent_link *l, const char *item, bool *quit) {
    *quit = false;
    if (item[0] == '/' && item[1] != '/') {
        agent_command(a, item, quit);
    } else {
        agent_turn(a, item[0] == '/' ? item + 1 : item);
    }
    if (agent_take_save_request(a)) agent_save(a);
    (void)l;
}

static void *run(void *arg) {
    worker *w = arg;
    agent_start(w->a);
    link_set_busy(w->l, false);
    for (;;) {
        char *item = link_queue_pop(w->l);
        if (!item) break;
        bool quit;
        worker_item(w->a, w->l, item, &quit);
        free(item);
        link_set_busy(w->l, false);
        if (quit) {
            link_stop(w->l);
            break;
        }
    }
    return NULL;
}

worker *worker_start(agent *a, agent_link *l, ds4_err *err) {
    worker *w = calloc(1, sizeof(*w));
    if (!w) {
        ds4_err_set(err, DS4_ENOMEM, "out of memory");
        return NULL;
    }
    w->a = a;
    w->l = l;
    /* busy from now, so the UI does not take the start for idleness */
    link_set_busy(l, true);
    if (pthread_create(&w->thread, NULL, run, w) != 0) {
        link_set_busy(l, false);
        free(w);
        ds4_err_set(err, DS4_EIO, "cannot start the worker thread");
        return NULL;
    }
    return w;
}

void worker_join(worker *w) {
    if (!w) return;
    pthread_join(w->thread, NULL);
    free(w);
}
