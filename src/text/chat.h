/*
 * chat.h - the DeepSeek V4 chat prompt, byte-identical to the official
 * encoder (encoding_dsv4.py, encode_messages; docs/MODEL.md 11 and the
 * fixtures in tests/golden/text/dsv4-encoding/).
 *
 * Input is the OpenAI-style message array the fixtures use (a jansson
 * array of objects): roles system, developer, user, assistant (content,
 * reasoning_content, tool_calls), tool / function (tool results, with
 * tool_call_id), latest_reminder; per-message fields tools and
 * response_format (system, developer), task (quick-instruction tasks:
 * action, query, authority, domain, title, read_url) and wo_eos.
 *
 * What the official encoder does, and so do we:
 *  - tool results are merged into user turns, consecutive results (and a
 *    user message following them) joined by "\n\n", and sorted into the
 *    order of the preceding assistant's tool calls;
 *  - in thinking mode, reasoning of assistant turns before the last user
 *    turn is dropped (and developer messages before it removed) unless
 *    keep_reasoning is set or any message carries tools;
 *  - Think Max puts the "Reasoning Effort: Absolute maximum..." prefix
 *    right after BOS (ds4 applies it only with a context of at least
 *    DS4_THINK_MAX_MIN_CTX tokens; below that Max is plain thinking);
 *  - after a user/developer turn that ends the conversation or precedes an
 *    assistant turn comes "<｜Assistant｜>" + "<think>" (thinking) or
 *    "</think>" (chat).
 * Where the official encoder would crash or print Python reprs (content
 * given as a list of parts, null contents), we render the text parts and
 * empty strings instead.
 *
 * The output is a ds4_rendered: the exact text plus segments in which only
 * the renderer's own markers are special tokens; message contents, tool
 * schemas and arguments are plain text, so "<｜Assistant｜>" typed by a
 * user never becomes a control token.
 */
#ifndef DS4_TEXT_CHAT_H
#define DS4_TEXT_CHAT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "text/rendered.h"

#define DS4_TOK_BOS             "<｜begin▁of▁sentence｜>"
#define DS4_TOK_EOS             "<｜end▁of▁sentence｜>"
#define DS4_TOK_USER            "<｜User｜>"
#define DS4_TOK_ASSISTANT       "<｜Assistant｜>"
#define DS4_TOK_LATEST_REMINDER "<｜latest_reminder｜>"
#define DS4_TOK_THINK           "<think>"
#define DS4_TOK_THINK_END       "</think>"

/* Think Max only with at least 384K tokens of context (ds4's rule). */
#define DS4_THINK_MAX_MIN_CTX 393216u

typedef enum ds4_think_mode {
    DS4_THINK_OFF = 0,  /* official thinking_mode "chat" */
    DS4_THINK_HIGH = 1, /* "thinking" (reasoning_effort none/high) */
    DS4_THINK_MAX = 2,  /* "thinking" with reasoning_effort "max" */
} ds4_think_mode;

typedef struct ds4_chat_opts {
    ds4_think_mode think;
    uint64_t ctx_size;   /* for the Think Max rule; 0 means "do not check" */
    bool keep_reasoning; /* official drop_thinking=False */
    bool no_bos;         /* official add_default_bos_token=False */
    const json_t *tools; /* optional OpenAI tool list for the first system
                            * message (an empty one is put first if there is
                            * none), as the official tests attach them */
    /* Optional: render an assistant turn's tool calls another way (the
     * server replays the exact DSML the model sampled for known call ids).
     * Returns 1 after appending the whole block (leading white space
     * included) to r, 0 to render the canonical block, -1 on error. */
    int (*render_calls)(void *ctx, const json_t *tool_calls, ds4_rendered *r, ds4_err *err);
    void *render_calls_ctx;
} ds4_chat_opts;

/* The mode actually rendered (MAX falls back to HIGH on a small context). */
ds4_think_mode ds4_chat_effective_think(const ds4_chat_opts *opts);

/* Render `messages` (a JSON array) into `out` (appended).  Errors name the
 * message index and field. */
int ds4_chat_render(const json_t *messages, const ds4_chat_opts *opts, ds4_rendered *out, ds4_err *err);

#endif
