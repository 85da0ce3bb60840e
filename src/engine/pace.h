/*
 * pace.h - how many prefill rows a batched step takes beside decoding ones.
 *
 * A long prompt goes into batched steps in pieces (batcher.h).  A piece
 * large enough to prefill fast makes every decoding session beside it
 * wait for the whole piece: the step of 16 decoders and 496 prompt rows at
 * 32k took 6.5 times their step alone on an H100.  The pacer keeps a step
 * with decoders in it at about DS4_PACE_STRETCH times their step alone:
 * it follows the time of their steps alone, and after each step with a
 * piece scales the piece by how far the time the piece added is from the
 * time it may add.  A piece's time is not proportional to its rows (a pass
 * reads the weights its rows route to whatever their number, and small
 * passes take other kernels than large ones), so the pacer does not model
 * it: if a piece of r rows added e seconds where t were allowed, the next
 * is r t / e (at most twice, at least half the last), which settles where
 * e = t whenever some piece fits, and at DS4_PACE_MIN where none does.
 * Without decoders a piece takes all the room.  The batcher and
 * ds4-bench's arrival test cut their pieces with it.
 */
#ifndef DS4_ENGINE_PACE_H
#define DS4_ENGINE_PACE_H

#include <stdint.h>

#include "base/error.h"

/* A step with decoders and a piece takes about this many times their step
 * alone (their time per token within twice their steady one, with room
 * for the steps' spread). */
#define DS4_PACE_STRETCH 1.75
/* The piece beside decoders before any step with one was timed, and the
 * least. */
#define DS4_PACE_FIRST 64
#define DS4_PACE_MIN 16

typedef struct ds4_pacer {
    double stretch; /* the step's time over the decoders' alone, above 1 (0: no pacing, all the room) */
    double short_s; /* seconds of a step of short rows alone (0: none seen) */
    double piece;   /* the next piece's rows (0: none timed yet) */
} ds4_pacer;

/* A user's stretch (--pace-stretch): 0 or above 1, else an error saying so. */
int ds4_pace_check(double stretch, ds4_err *err);

/* A step ran: short_rows decoding rows (decode tokens, MTP verifications
 * and drafts) and long_rows prefill rows in `secs`. */
void ds4_pace_note(ds4_pacer *p, uint32_t short_rows, uint32_t long_rows, double secs);

/* Prefill rows the next step may take: all of `room` without decoding rows
 * in it, else the pacer's piece (at least DS4_PACE_MIN, at most room). */
uint32_t ds4_pace_piece(const ds4_pacer *p, uint32_t short_rows, uint32_t room);

#endif
