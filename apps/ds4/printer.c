/*
 * printer.c - streaming generated text to stdout (see printer.h).
 */
#include "printer.h"

#include <stdio.h>

#define DIM   "\033[90m"
#define RESET "\033[0m"

void printer_start(printer *p, const ds4_engine *e, int32_t think_end, bool thinking, bool color) {
    *p = (printer){.v = e->vocab,
                   .eos = e->eos,
                   .think_end = think_end,
                   .color = color,
                   .thinking = thinking,
                   .at_line_start = true};
    ds4_detok_stream_init(&p->ds, e->vocab, false);
    if (p->thinking && p->color) fputs(DIM, stdout);
}

/* On a terminal, control characters the model produced (an escape
 * sequence could redraw the screen) are shown in caret notation. */
static void write_visible(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7f) {
            putchar('^');
            putchar(c ^ 0x40);
        } else {
            putchar(c);
        }
    }
}

static void emit(printer *p) {
    if (p->buf.len == 0) return;
    if (p->color) write_visible(p->buf.p, p->buf.len);
    else fwrite(p->buf.p, 1, p->buf.len, stdout);
    p->at_line_start = p->buf.p[p->buf.len - 1] == '\n';
    ds4_strbuf_truncate(&p->buf, 0);
}

void printer_token(printer *p, int32_t tok) {
    if (tok == p->eos) return;
    ds4_detok_stream_push(&p->ds, tok, &p->buf, NULL);
    if (p->thinking && tok == p->think_end) {
        ds4_detok_stream_finish(&p->ds, &p->buf);
        emit(p);
        p->thinking = false;
        if (p->color) {
            fputs(RESET "\n", stdout);
            p->at_line_start = true;
        }
    }
    emit(p);
    fflush(stdout);
}

void printer_finish(printer *p) {
    ds4_detok_stream_finish(&p->ds, &p->buf);
    emit(p);
    if (p->color && p->thinking) fputs(RESET, stdout);
    if (!p->at_line_start) fputc('\n', stdout);
    p->at_line_start = true;
    fflush(stdout);
}

void printer_free(printer *p) { ds4_strbuf_free(&p->buf); }
