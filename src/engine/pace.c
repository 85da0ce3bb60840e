/*
 * pace.c - the prefill piece beside decoding rows (pace.h).
 *
 * Two running means: a step of short rows alone, and the time a prefill row
 * adds (a mixed step's time beyond the short rows' mean, over its rows; a
 * step of prefill rows alone charges them all of it, which overstates a
 * row by the step's fixed cost and so errs towards smaller pieces).  The
 * means follow the context growing and the decoders coming and going: each
 * step moves them a quarter of the way.
 */
#include "engine/pace.h"

#define PACE_WEIGHT 0.25

static void follow(double *mean, double x) {
    *mean = *mean > 0 ? *mean + PACE_WEIGHT * (x - *mean) : x;
}

void ds4_pace_note(ds4_pacer *p, uint32_t short_rows, uint32_t long_rows, double secs) {
    if (secs <= 0) return;
    if (!long_rows) {
        if (short_rows) follow(&p->short_s, secs);
        return;
    }
    double extra = short_rows && p->short_s > 0 ? secs - p->short_s : short_rows ? 0 : secs;
    if (extra > 0) follow(&p->row_s, extra / long_rows);
}

uint32_t ds4_pace_piece(const ds4_pacer *p, uint32_t short_rows, uint32_t room) {
    if (!short_rows) return room;
    double rows = DS4_PACE_FIRST;
    if (p->short_s > 0 && p->row_s > 0) rows = (DS4_PACE_STRETCH - 1) * p->short_s / p->row_s;
    if (rows < DS4_PACE_MIN) rows = DS4_PACE_MIN;
    return rows >= room ? room : (uint32_t)rows;
}
