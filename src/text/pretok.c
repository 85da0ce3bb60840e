/*
 * pretok.c - the three-step regex pre-tokenizer over PCRE2 (see pretok.h).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretok.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/unicode_delta.h"
#include "text/utf8.h"

/* White_Space, as Oniguruma's \s: tab..CR, NEL and the separators. */
#define WS "\\t-\\r\\x{85}\\p{Z}"

/* The three steps, with the category classes as parameters, so the same
 * text gives PCRE2's own classes (fast) and the classes widened to Unicode
 * 16.0 (unicode_delta.h; used only for text containing such a code point,
 * since PCRE2's JIT checks explicit ranges for every character). */
/* clang-format off */
#define STEPS(L, M, N, P, S, Z)                                                   \
    {                                                                             \
        "[" N "]{1,3}",                                                           \
        "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",           \
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"                     \
        "|[^\\r\\n" L P S "]?[" L M "]+"                                            \
        "| ?[" P S "]+[\\r\\n]*"                                                    \
        "|[" WS Z "]*[\\r\\n]+"                                                     \
        "|[" WS Z "]+(?![^" WS Z "])"                                               \
        "|[" WS Z "]+",                                                           \
    }
/* clang-format on */

#define N_STEPS 3

static const char *const PATTERNS[2][N_STEPS] = {
    STEPS("\\p{L}", "\\p{M}", "\\p{N}", "\\p{P}", "\\p{S}", ""),
    STEPS("\\p{L}" DS4_UNICODE_NEW_L, "\\p{M}" DS4_UNICODE_NEW_M, "\\p{N}" DS4_UNICODE_NEW_N,
          "\\p{P}" DS4_UNICODE_NEW_P, "\\p{S}" DS4_UNICODE_NEW_S, DS4_UNICODE_NEW_Z),
};

static const uint32_t NEW_RANGES[][2] = {DS4_UNICODE_NEW_RANGES};
_Static_assert(DS4_UNICODE_NEW_MIN >= 0x800, "has_new_code_point skips 1- and 2-byte characters");

struct ds4_pretok {
    pcre2_code *code[2][N_STEPS];
    int jit[2][N_STEPS];
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jstack;
};

void ds4_pretok_free(ds4_pretok *p) {
    if (!p) return;
    for (int set = 0; set < 2; set++)
        for (int i = 0; i < N_STEPS; i++) pcre2_code_free(p->code[set][i]);
    pcre2_match_data_free(p->md);
    pcre2_match_context_free(p->mctx);
    pcre2_jit_stack_free(p->jstack);
    free(p);
}

/* The added ranges only bring PCRE2 up to Unicode 16.0 from 14.0 or newer. */
static int check_unicode_version(ds4_err *err) {
    char ver[32] = "";
    pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, ver);
    int major = 0;
    if (sscanf(ver, "%d", &major) == 1 && major >= 14) return 0;
    return ds4_err_set(err, DS4_EUNSUPPORTED,
                       "pre-tokenizer: PCRE2 knows Unicode %s; ds4 needs a PCRE2 with Unicode %s or newer", ver,
                       DS4_UNICODE_BASE_VERSION);
}

ds4_pretok *ds4_pretok_new(ds4_err *err) {
    if (check_unicode_version(err)) return NULL;
    ds4_pretok *p = calloc(1, sizeof(*p));
    if (!p) {
        ds4_err_set(err, DS4_ENOMEM, "pre-tokenizer: out of memory");
        return NULL;
    }
    for (int set = 0; set < 2; set++) {
        for (int i = 0; i < N_STEPS; i++) {
            int ec;
            PCRE2_SIZE eo;
            p->code[set][i] = pcre2_compile((PCRE2_SPTR)PATTERNS[set][i], PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                            &ec, &eo, NULL);
            if (!p->code[set][i]) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(ec, msg, sizeof(msg));
                ds4_err_set(err, DS4_EUNSUPPORTED, "pre-tokenizer regex %d at offset %zu: %s", i + 1, (size_t)eo,
                            (const char *)msg);
                ds4_pretok_free(p);
                return NULL;
            }
            /* JIT is an optimisation: without it (unsupported CPU) the
             * interpreter gives the same matches. */
            p->jit[set][i] = pcre2_jit_compile(p->code[set][i], PCRE2_JIT_COMPLETE) == 0;
        }
    }
    p->md = pcre2_match_data_create(2, NULL);
    p->mctx = pcre2_match_context_create(NULL);
    p->jstack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    if (!p->md || !p->mctx || !p->jstack) {
        ds4_err_set(err, DS4_ENOMEM, "pre-tokenizer match data: out of memory");
        ds4_pretok_free(p);
        return NULL;
    }
    pcre2_jit_stack_assign(p->mctx, NULL, p->jstack);
    return p;
}

/* Next match of step `step` in s[0..n) at or after `start`: 1 with its
 * bounds, 0 when there is none, -1 on a PCRE2 error. */
static int find_next(ds4_pretok *p, int set, int step, const char *s, size_t n, size_t start, size_t *ms, size_t *me,
                     ds4_err *err) {
    int rc;
    if (p->jit[set][step]) rc = pcre2_jit_match(p->code[set][step], (PCRE2_SPTR)s, n, start, 0, p->md, p->mctx);
    else rc = pcre2_match(p->code[set][step], (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, p->md, p->mctx);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return ds4_err_set(err, DS4_EFORMAT, "pre-tokenizer step %d at byte %zu: %s", step + 1, start,
                           (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

typedef struct split_ctx {
    ds4_pretok *p;
    int set;
    ds4_piece_fn fn;
    void *ctx;
    ds4_err *err;
} split_ctx;

/* Apply steps step..N_STEPS-1 to the piece s[0..n). */
static int split_step(split_ctx *c, int step, const char *s, size_t n) {
    if (n == 0) return 0;
    if (step == N_STEPS) return c->fn(c->ctx, s, n);
    size_t pos = 0;
    while (pos < n) {
        size_t ms, me;
        int found = find_next(c->p, c->set, step, s, n, pos, &ms, &me, c->err);
        if (found < 0) return -1;
        if (!found) break;
        int rc = split_step(c, step + 1, s + pos, ms - pos);
        if (rc) return rc;
        rc = split_step(c, step + 1, s + ms, me - ms);
        if (rc) return rc;
        pos = me;
        if (me == ms) break; /* no pattern matches empty; never loop on one */
    }
    return pos < n ? split_step(c, step + 1, s + pos, n - pos) : 0;
}

static bool is_new_code_point(uint32_t cp) {
    size_t lo = 0, hi = sizeof(NEW_RANGES) / sizeof(NEW_RANGES[0]);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < NEW_RANGES[mid][0]) hi = mid;
        else if (cp > NEW_RANGES[mid][1]) lo = mid + 1;
        else return true;
    }
    return false;
}

/* Does valid UTF-8 text contain a code point PCRE2 (Unicode 14) does not
 * know but HF (Unicode 16) classifies? */
static bool has_new_code_point(const char *text, size_t len) {
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0xE0) { /* ASCII and 2-byte characters are all below U+0897 */
            i++;
            continue;
        }
        uint32_t cp;
        int l = ds4_utf8_decode(s + i, len - i, &cp);
        if (l && is_new_code_point(cp)) return true;
        i += l ? (size_t)l : 1;
    }
    return false;
}

int ds4_pretok_split(ds4_pretok *p, const char *text, size_t len, ds4_piece_fn fn, void *ctx, ds4_err *err) {
    split_ctx c = {p, has_new_code_point(text, len), fn, ctx, err};
    return split_step(&c, 0, text, len);
}
