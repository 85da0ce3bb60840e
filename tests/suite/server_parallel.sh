#!/bin/sh
# server_parallel.sh - ds4-server with many sessions at once
# (tests/server/parallel.py): concurrent requests of every API answer as a
# one-session server does, a client that goes away frees its session within
# one step, 429 beyond --queue, conversations find their sessions, eviction
# to the disk cache and back, the stats, --parallel's startup checks,
# sessions that grow while they answer (and what happens without room).
# Needs ./ds4-server, ./ds4-mkmodel and ./ds4-tokenizer (built by `make`).
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/server_parallel.lock}"
# the tokenizer before the Python harness would make it (a shared file)
suite_tokenizer > /dev/null
exec python3 tests/server/parallel.py
