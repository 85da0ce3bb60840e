/*
 * clock.h - the one clock every timing in ds4 reads: seconds of the
 * monotonic clock (never set back, unlike the time of day), as a double;
 * and the timed wait on a condition variable.
 */
#ifndef DS4_BASE_CLOCK_H
#define DS4_BASE_CLOCK_H

#include <pthread.h>

/* Monotonic seconds since an arbitrary origin; subtract two readings. */
double ds4_now(void);

/* pthread_cond_timedwait on cv (mu held) for at most `seconds` from now
 * (none when seconds <= 0); its result. */
int ds4_cond_wait_for(pthread_cond_t *cv, pthread_mutex_t *mu, double seconds);

#endif
