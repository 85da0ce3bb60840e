#!/bin/sh
# server_bad_inputs.sh - ds4-server against a corpus of bad input
# (tests/server/bad_inputs.py): broken HTTP, huge headers and bodies, slow
# and stalled clients, wrong JSON types for every field, random bytes.
# Every case gets a proper error, the server keeps serving and leaks no
# file descriptors.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/server_bad_inputs.lock}"
# the tokenizer before the Python harness would make it (a shared file)
suite_tokenizer > /dev/null
exec python3 tests/server/bad_inputs.py
