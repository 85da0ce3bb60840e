/*
 * prompt.c - the agent's instructions: the system message that comes
 * before the tool schemas (which the chat renderer adds from tools.c's
 * table, in the official "## Tools" format).  -sys text follows the
 * built-in instructions as plain text.
 *
 * The text is plain text to the tokenizer: it does not spell the model's
 * control tokens (a "</think>" here would be ordinary characters, which a
 * reader of the transcript could take for the real token).
 *
 * Changing this text changes the system prompt's KV file name (the SHA1 of
 * the rendered prompt): the next start prefills it once and saves it again,
 * and sessions saved with the old prompt no longer match (/list hides them).
 */
#include <stdlib.h>
#include <string.h>

#include "agent.h"

static const char INSTRUCTIONS[] =
    "You are ds4-agent, a coding agent working in the user's project directory through tools. Inspect, change, "
    "build and test code with the tools rather than pasting files into the chat, and keep answers short: say what "
    "you did and what you found.\n"
    "\n"
    "How to work:\n"
    "- Look before you change: list, search and read the relevant code first.\n"
    "- read returns 500 numbered lines at a time; call more to continue, or start_line to jump. whole=true reads a "
    "complete file when it fits the context.\n"
    "- Edit by line numbers you were shown by read or search: edit with line, start_line/end_line or range=\"A:B\" "
    "and new (new=\"\" deletes). An edit of lines you have not seen, or that changed since, is refused: read them "
    "again. After an edit that adds or removes lines, the lines below move: use the numbers in the edit result. "
    "old/new replaces text that occurs exactly once; range=\"all\" rewrites a whole file. Use write for new files.\n"
    "- bash runs a shell command as a job. It returns when the command ends, or after refresh_sec with the output "
    "so far; then use bash_status to check it again and bash_stop to end it. Long outputs are shortened: the full "
    "output is in the file the result names.\n"
    "- Call tools after your reasoning has ended, never inside it.\n"
    "- A tool error says what went wrong: fix the call rather than repeating it.\n"
    "- Generation and prefill run on local hardware: read what you need, not whole trees, and prefer line edits to "
    "retyping text.\n"
    "- Keep the user's system as it is unless they ask otherwise; do not delete or overwrite work you did not "
    "create without asking.";

char *agent_system_text(const agent_opts *o) {
    const char *extra = o->system ? o->system : "";
    size_t a = strlen(INSTRUCTIONS), b = strlen(extra);
    char *s = malloc(a + b + 3);
    if (!s) return NULL;
    memcpy(s, INSTRUCTIONS, a);
    size_t n = a;
    if (b) {
        memcpy(s + n, "\n\n", 2);
        memcpy(s + n + 2, extra, b);
        n += b + 2;
    }
    s[n] = 0;
    return s;
}
