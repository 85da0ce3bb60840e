#!/bin/sh
# cli_runtime.sh - ds4 and ds4-server at run time (tests/suite/cli_runtime.py):
# Ctrl+C before and during the work, during --warm-weights, in the
# diagnostics (status 130), and --no-sim reaching both programs' forward pass.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/cli_runtime.lock}"
for p in ds4 ds4-server ds4-mkmodel ds4-tokenizer; do [ -x "./$p" ] || make -s "$p"; done
# the tokenizer before the Python harness would make it (a shared file)
suite_tokenizer > /dev/null
exec python3 tests/suite/cli_runtime.py build/suite/cli_runtime
