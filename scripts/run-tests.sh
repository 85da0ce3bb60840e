#!/bin/sh
# run-tests.sh - the test runner behind `make test` (the default suite) and
# `make perf-tools` (the checks of the measuring instruments).
#
#   scripts/run-tests.sh [ITEM...]
#
# Without ITEM, the default suite: every suite script (tests/suite/*.sh)
# and every unit-test binary (build/tests/test_*).  An ITEM is a program or
# a .sh script.  Each runs with its output in build/test-logs/NAME.log and
# its own instance lock file (DS4_LOCK_FILE, src/base/instance_lock.h), so
# that the programs it starts collide neither with another item nor with a
# model process on the machine.
#
# An item's exit status:
#   0    PASS (a cmocka binary's skipped cases are named after it)
#   77   SKIP: it cannot run on this machine (a tool is missing); its last
#        output line with "SKIP: REASON" (after a prefix such as the item's
#        name, if any) says why, and without one it is a FAIL
#   else FAIL, with the end of its log
#
# The output: a line per finished item (status, name, seconds); while items
# run, a line at least every 30 s naming each with the last line it
# printed; a closing line counting passed, failed and skipped.
#   TEST_JOBS=N      items run side by side (default 2, for 2 cores).  The
#                    longest (by the last run's times, kept in the log
#                    folder) start first; results do not depend on the order,
#                    as every item has its own files and lock.  A fixture that
#                    many items share is made by `make test` before they run
#                    (the Makefile's `test` target); items that write files
#                    of a group's own never run side by side (`groups` below).
#   TEST_TIMEOUT=S   an item still running after S seconds fails (default 3600:
#                    a hang, not a busy machine)
set -u
cd "$(dirname "$0")/.."

jobs=${TEST_JOBS:-2}
limit=${TEST_TIMEOUT:-3600}
beat=25 # seconds without a line before the running items are named
log_dir=build/test-logs
lock_dir=$PWD/build/test-locks
mkdir -p "$log_dir" "$lock_dir"

item_name() { n=$(basename "$1"); echo "${n%.sh}"; }

# Items that write files they share (a cache, a model made on first use),
# a line a group: the items of a group run one at a time.
groups="agent: test_agent agent agent_tui"

# The group of an item, or nothing.
group_of() {
    echo "$groups" | while read -r g members; do
        for m in $members; do [ "$m" = "$1" ] && echo "${g%:}"; done
    done
}

# The items, the longest of the last run first; items never timed first of
# all, in the order given.
order() {
    i=0
    for it in "$@"; do
        i=$((i + 1))
        secs=$(cat "$log_dir/$(item_name "$it").secs" 2>/dev/null || echo 999999)
        echo "$secs $i $it"
    done | sort -k1,1nr -k2,2n | cut -d' ' -f3-
}

if [ $# -eq 0 ]; then
    set -- tests/suite/*.sh build/tests/test_*
fi
for it in "$@"; do
    [ -f "$it" ] || { echo "run-tests: $it: no such test (build it first: make test)" >&2; exit 2; }
done
# shellcheck disable=SC2046 # item paths have no spaces
set -- $(order "$@")

# Start an item in the background: its output into NAME.log, the pid of
# its timeout(1) into NAME.pid (timeout leads a process group of its own,
# which an interrupt ends), its exit status into NAME.rc at the end.
start_item() {
    name=$(item_name "$1")
    case $1 in *.sh) cmd="sh $1";; *) cmd=$1;; esac
    rm -f "$log_dir/$name.rc"
    date +%s > "$log_dir/$name.start"
    (
        # shellcheck disable=SC2086 # cmd is a program and its script
        DS4_LOCK_FILE="$lock_dir/$name.lock" timeout -k 10 "$limit" $cmd > "$log_dir/$name.log" 2>&1 < /dev/null &
        echo $! > "$log_dir/$name.pid"
        wait $!
        echo $? > "$log_dir/$name.rc.tmp"
        mv "$log_dir/$name.rc.tmp" "$log_dir/$name.rc"
    ) &
    running="$running $name"
}

pass=0 fail=0 skip=0 partial=0
failed="" skipped=""
running=""
last_line=$(date +%s)
t0=$last_line

# The reason of a skip: what follows "SKIP: " in the last line that has it.
skip_reason() { sed -n 's/.*SKIP: //p' "$log_dir/$1.log" | tail -n 1; }

# A cmocka binary's skipped cases, by name.
skipped_cases() {
    sed -n 's/^\[  SKIPPED \] \([A-Za-z_][A-Za-z0-9_]*\)$/\1/p' "$log_dir/$1.log" | sort -u | tr '\n' ' ' | sed 's/ $//'
}

finish_item() {
    name=$1
    rc=$(cat "$log_dir/$name.rc")
    secs=$(( $(date +%s) - $(cat "$log_dir/$name.start") ))
    echo "$secs" > "$log_dir/$name.secs"
    note=""
    case $rc in
    0)  status=PASS; pass=$((pass + 1))
        cases=$(skipped_cases "$name")
        if [ -n "$cases" ]; then
            partial=$((partial + 1))
            note="  (cases skipped: $cases; the log says why)"
        fi;;
    77) reason=$(skip_reason "$name")
        if [ -n "$reason" ]; then
            status=SKIP; skip=$((skip + 1)); note="  $reason"; skipped="$skipped
  $name: $reason"
        else
            status=FAIL; note="  (exit status 77 without a 'SKIP: reason' line)"
        fi;;
    124) status=FAIL; note="  (still running after $limit s: stopped)";;
    *)  status=FAIL;;
    esac
    if [ "$status" = FAIL ]; then fail=$((fail + 1)); failed="$failed $name"; fi
    printf '%-4s %-30s %5ss%s\n' "$status" "$name" "$secs" "$note"
    [ "$status" = FAIL ] && tail -n 40 "$log_dir/$name.log" | sed 's/^/    /'
    rm -f "$log_dir/$name.rc" "$log_dir/$name.pid" "$log_dir/$name.start"
    last_line=$(date +%s)
}

# A line per running item: how long it has run, its last output line.
heartbeat() {
    now=$(date +%s)
    for name in $running; do
        last=$(tail -n 1 "$log_dir/$name.log" 2>/dev/null | tr -d '\r\n' | tr -c '[:print:]' ' ' | cut -c1-90)
        printf '...  %-30s %5ss  %s\n' "$name" "$((now - $(cat "$log_dir/$name.start")))" "$last"
    done
    last_line=$now
}

stop() {
    for name in $running; do
        [ -f "$log_dir/$name.pid" ] && kill -TERM "$(cat "$log_dir/$name.pid")" 2>/dev/null
    done
    wait
    echo "tests: interrupted"
    exit 130
}
trap stop INT TERM

# The first queued item whose group has no item running.
next_item() {
    for it in $queue; do
        g=$(group_of "$(item_name "$it")")
        if [ -n "$g" ]; then
            for r in $running; do [ "$(group_of "$r")" = "$g" ] && continue 2; done
        fi
        echo "$it"
        return
    done
}
dequeue() { q=""; for it in $queue; do [ "$it" = "$1" ] || q="$q $it"; done; queue=$q; }

echo "tests: $# items, $jobs at a time (logs in $log_dir)"
queue="$*"
while :; do
    while [ -n "$queue" ] && [ "$(echo $running | wc -w)" -lt "$jobs" ]; do
        it=$(next_item)
        [ -n "$it" ] || break
        start_item "$it"
        dequeue "$it"
    done
    [ -z "$running" ] && break
    sleep 1
    still=""
    for name in $running; do
        if [ -f "$log_dir/$name.rc" ]; then finish_item "$name"; else still="$still $name"; fi
    done
    running=$still
    [ -n "$running" ] && [ $(( $(date +%s) - last_line )) -ge $beat ] && heartbeat
done
wait

elapsed=$(( $(date +%s) - t0 ))
extra=""
[ $partial -gt 0 ] && extra=" ($partial with skipped cases)"
printf 'tests: %d passed%s, %d failed, %d skipped in %dm%02ds\n' $pass "$extra" $fail $skip \
    $((elapsed / 60)) $((elapsed % 60))
[ -n "$skipped" ] && echo "skipped:$skipped"
[ $fail -eq 0 ] || { echo "failed:$failed (logs in $log_dir)"; exit 1; }
