/*
 * pace.c - the prefill piece beside decoding rows (pace.h).
 *
 * The decoders' step alone is a running mean that each such step moves a
 * quarter of the way (it follows their context growing and their number
 * changing); the piece is scaled after each step that had one beside them.
 */
#include "engine/pace.h"

#define PACE_WEIGHT 0.25
#define PACE_MOVE   2.0 /* the most a piece grows, or shrinks, in one step */

void ds4_pace_note(ds4_pacer *p, uint32_t short_rows, uint32_t long_rows, double secs) {
    if (secs <= 0 || !short_rows) return;
    if (!long_rows) {
        p->short_s = p->short_s > 0 ? p->short_s + PACE_WEIGHT * (secs - p->short_s) : secs;
        return;
    }
    if (p->short_s <= 0) return;
    double allowed = (p->stretch - 1) * p->short_s, added = secs - p->short_s;
    double scale = added <= allowed / PACE_MOVE ? PACE_MOVE : allowed / added;
    if (scale < 1 / PACE_MOVE) scale = 1 / PACE_MOVE;
    p->piece = long_rows * scale;
    if (p->piece < DS4_PACE_MIN) p->piece = DS4_PACE_MIN;
}

int ds4_pace_check(double stretch, ds4_err *err) {
    if (stretch == 0 || stretch > 1) return 0;
    return ds4_err_set(err, DS4_EINVAL, "%g: 0 (no pacing) or above 1", stretch);
}

uint32_t ds4_pace_piece(const ds4_pacer *p, uint32_t short_rows, uint32_t room) {
    if (!short_rows || p->stretch <= 0) return room;
    double rows = p->piece > 0 ? p->piece : DS4_PACE_FIRST;
    return rows >= room ? room : (uint32_t)rows;
}
