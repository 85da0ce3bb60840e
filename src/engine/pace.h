/*
 * pace.h - how many prefill rows a batched step takes beside decoding ones.
 *
 * A long prompt goes into batched steps in pieces (batcher.h).  A piece
 * large enough to prefill fast makes every decoding session beside it
 * wait for the whole piece: the step of 16 decoders and 496 prompt rows at
 * 32k took 6.5 times their step alone on an H100.  The pacer learns, from
 * the steps it is told of, what a step of decoding rows alone takes and
 * what each prompt row adds, and cuts pieces so that a step with decoders
 * in it takes about DS4_PACE_STRETCH times their step alone: their time
 * per token stays within that of their steady one while the prompt goes
 * in as fast as that allows.  Without decoders a piece takes all the room.
 * The batcher and ds4-bench's arrival test cut their pieces with it.
 */
#ifndef DS4_ENGINE_PACE_H
#define DS4_ENGINE_PACE_H

#include <stdint.h>

/* A step with decoders and a piece takes about this many times their step
 * alone (the decoders' time per token, at most twice their steady one,
 * with room for the steps' spread). */
#define DS4_PACE_STRETCH 1.6
/* The piece beside decoders before any step was timed, and the least. */
#define DS4_PACE_FIRST 64
#define DS4_PACE_MIN 16

typedef struct ds4_pacer {
    double short_s; /* seconds of a step of short rows alone (0: none seen) */
    double row_s;   /* seconds a prefill row adds to a step (0: none seen) */
} ds4_pacer;

/* A step ran: short_rows decoding rows (decode tokens, MTP verifications
 * and drafts) and long_rows prefill rows in `secs`. */
void ds4_pace_note(ds4_pacer *p, uint32_t short_rows, uint32_t long_rows, double secs);

/* Prefill rows the next step may take: all of `room` without decoding rows
 * in it, else the piece that keeps it within the stretch (at least
 * DS4_PACE_MIN, at most room). */
uint32_t ds4_pace_piece(const ds4_pacer *p, uint32_t short_rows, uint32_t room);

#endif
