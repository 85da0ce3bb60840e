#!/bin/sh
# server_protocol.sh - ds4-server on the protocol edge cases agents hit
# (tests/server/protocol.py): truncated and edited tool calls, NUL and
# images in the history, half-closed clients, tool_choice and
# parallel_tool_calls, JSON answers by constrained decoding, logprobs,
# Codex's Responses tools, thinking-mode sampling, the stats counters.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/server_protocol.lock}"
# the tokenizer before the Python harness would make it (a shared file)
suite_tokenizer > /dev/null
exec python3 tests/server/protocol.py
