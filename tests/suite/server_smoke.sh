#!/bin/sh
# server_smoke.sh - ds4-server end to end with the Python standard library
# only (tests/server/smoke.py): every endpoint streaming and not, tool calls
# in the three chat APIs, prefix reuse and disk-cache counters, error
# shapes, limits, auth, cancellation.  Needs ./ds4-server, ./ds4-mkmodel and
# ./ds4-tokenizer (built by `make`); makes its tiny model under build/models.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/server_smoke.lock}"
# the tokenizer before the Python harness would make it (a shared file)
suite_tokenizer > /dev/null
exec python3 tests/server/smoke.py
