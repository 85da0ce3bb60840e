/*
 * dump_tokens.c - `ds4 --dump-tokens -p TEXT`: the prompt's token ids and
 * pieces, one per line ("ID<TAB>PIECE"), exactly as written: special
 * tokens are recognised wherever they occur, no chat template is added.
 *
 * The vocabulary lives in the model GGUF's tokenizer.* metadata, so only
 * the GGUF header is read (mapped): no weights are checked or touched and
 * no backend starts, which makes this instant even on the real model.
 * Pieces are the bytes of each token with control characters, backslashes
 * and bytes that are not part of valid UTF-8 escaped.
 */
#include <stdio.h>

#include "engine/startup.h"
#include "format/gguf.h"
#include "modes.h"
#include "runtime.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

/* The piece as a printable line fragment. */
static void print_piece(const char *s, size_t n) {
    static const char *const named[32] = {['\n'] = "\\n", ['\t'] = "\\t", ['\r'] = "\\r"};
    size_t i = 0;
    while (i < n) {
        unsigned char ch = (unsigned char)s[i];
        uint32_t cp;
        int len = ch >= 0x80 ? ds4_utf8_decode((const uint8_t *)s + i, n - i, &cp) : 1;
        if (ch == '\\') {
            fputs("\\\\", stdout);
        } else if (ch < 0x20 && named[ch]) {
            fputs(named[ch], stdout);
        } else if (ch < 0x20 || ch == 0x7f || len == 0) {
            printf("\\x%02x", ch); /* control or not part of valid UTF-8 */
            len = 1;
        } else {
            fwrite(s + i, 1, (size_t)len, stdout);
        }
        i += (size_t)len;
    }
}

int run_dump_tokens(const cli_opts *o) {
    ds4_err err = {0};
    if (ds4_model_file_check(o->model, &err) != 0) {
        fprintf(stderr, "ds4: %s\n", err.msg);
        return 1;
    }
    ds4_gguf *g = ds4_gguf_open(o->model, &err);
    ds4_vocab *v = g ? ds4_vocab_from_gguf(g, &err) : NULL;
    ds4_tokenizer *t = v ? ds4_tokenizer_new(v, &err) : NULL;
    ds4_tokens ids = {0};
    int status = 1;
    if (t && ds4_tokenize_transcript(t, o->prompt, o->prompt_len, &ids, &err) == 0) {
        for (size_t i = 0; i < ids.n; i++) {
            ds4_str b = ds4_vocab_token_bytes(v, ids.ids[i]);
            printf("%d\t", ids.ids[i]);
            print_piece(b.ptr, b.len);
            putchar('\n');
        }
        fprintf(stderr, "ds4: %zu token%s\n", ids.n, ds4_plural(ids.n));
        status = 0;
    } else {
        fprintf(stderr, "ds4: --dump-tokens: %s\n", err.msg); /* the message names the file */
    }
    ds4_tokens_free(&ids);
    ds4_tokenizer_free(t);
    ds4_vocab_free(v);
    ds4_gguf_close(g);
    return status;
}
