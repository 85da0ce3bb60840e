#!/bin/sh
# run-tests.sh - the default test suite (what `make test` and CI run).
# Runs every unit-test binary, then the suite scripts in tests/suite/*.sh
# (end-to-end and fuzz smoke runs), and prints one summary line per item.
# Every item gets its own instance lock file (DS4_LOCK_FILE, see
# src/base/instance_lock.h): the programs a test runs do not collide with
# another test suite, or a real model process, on the same machine.
set -u
cd "$(dirname "$0")/.."

pass=0
fail=0
failed=""
log_dir=build/test-logs
lock_dir=$PWD/build/test-locks
mkdir -p "$log_dir" "$lock_dir"

run_one() {
    name=$1; shift
    start=$(date +%s)
    if DS4_LOCK_FILE="$lock_dir/$name.lock" "$@" >"$log_dir/$name.log" 2>&1; then
        pass=$((pass + 1)); status=PASS
    else
        fail=$((fail + 1)); status=FAIL; failed="$failed $name"
    fi
    printf '%-6s %-40s %4ss\n' "$status" "$name" "$(( $(date +%s) - start ))"
    [ "$status" = FAIL ] && tail -n 40 "$log_dir/$name.log"
    return 0
}

for t in build/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for s in tests/suite/*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s" .sh)" sh "$s"
done

echo "tests: $pass passed, $fail failed"
[ "$fail" -eq 0 ] || { echo "failed:$failed (logs in $log_dir)"; exit 1; }
