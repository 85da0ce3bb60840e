/*
 * clock.c - the monotonic clock (see clock.h).
 */
#include "base/clock.h"

#include <time.h>

/* The condition variables take a deadline on the time of day (their
 * default clock). */
int ds4_cond_wait_for(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds) {
    if (seconds <= 0) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((seconds - (long)seconds) * 1e9);
    ts.tv_sec += (time_t)seconds + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    return pthread_cond_timedwait(cv, mu, &ts);
}

double ds4_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
