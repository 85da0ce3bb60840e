/*
 * printer.h - writing generated tokens to stdout as they come.
 *
 * Text goes out whole characters at a time (the streaming detokenizer holds
 * back a split UTF-8 sequence), flushed after every token so the user sees
 * it live.  In thinking mode the reasoning comes first: on a terminal it is
 * dim grey, and a newline follows the "</think>" that closes it; control
 * characters are shown as ^X so model output cannot drive the terminal; piped
 * output is the plain text of the tokens, byte for byte (a script can
 * split at "</think>"), ended by a newline when it does not end in one.
 * The end-of-sentence token is not printed.
 */
#ifndef DS4_CLI_PRINTER_H
#define DS4_CLI_PRINTER_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"
#include "text/tokenizer.h"

typedef struct printer {
    const ds4_vocab *v;
    ds4_detok_stream ds;
    ds4_strbuf buf;
    int32_t eos, think_end;
    bool color;    /* a terminal: colour the reasoning */
    bool thinking; /* inside the reasoning */
    bool at_line_start;
} printer;

/* thinking: the prompt opened a <think> block.  think_end: the id of
 * "</think>" (-1 if the vocabulary lacks it). */
void printer_start(printer *p, const ds4_engine *e, int32_t think_end, bool thinking, bool color);
void printer_token(printer *p, int32_t tok);
/* Flush a held partial character, reset colours, end the line. */
void printer_finish(printer *p);
void printer_free(printer *p);

#endif
