/*
 * clock.h - the one clock every timing in ds4 reads: seconds of the
 * monotonic clock (never set back, unlike the time of day), as a double.
 */
#ifndef DS4_BASE_CLOCK_H
#define DS4_BASE_CLOCK_H

/* Monotonic seconds since an arbitrary origin; subtract two readings. */
double ds4_now(void);

#endif
