/*
 * modes.h - the things ds4 can do, one entry point each; main.c picks one
 * from the options.  Each returns the process exit status.
 */
#ifndef DS4_CLI_MODES_H
#define DS4_CLI_MODES_H

#include "engine/engine.h"
#include "engine/sampler.h"
#include "options.h"

/* Chat: answer the prompt and exit (oneshot.c), or converse (repl.c). */
int run_oneshot(ds4_engine *e, const cli_opts *o, ds4_sampler *smp);
int run_repl(ds4_engine *e, const cli_opts *o, ds4_sampler *smp);

/* Diagnostics.  dump_tokens needs only the GGUF's tokenizer metadata, so it
 * opens the file itself; the others take the loaded engine. */
int run_dump_tokens(const cli_opts *o);
int run_dump_logprobs(ds4_engine *e, const cli_opts *o); /* logprobs.c */
int run_perplexity(ds4_engine *e, const cli_opts *o);    /* perplexity.c */
int run_inspect(ds4_engine *e, const cli_opts *o);       /* inspect.c */
int run_imatrix(ds4_engine *e, const cli_opts *o);       /* imatrix.c */

#endif
