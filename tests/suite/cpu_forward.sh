#!/bin/sh
# cpu_forward.sh - ds4-forward end to end on the committed tiny model:
#  1. a session saved as a DSV4 payload and continued in a new process gives
#     bit-identical logits to an uninterrupted run (simulations on);
#  2. bad inputs (a truncated model, a missing file, a bad session file)
#     end with a clear message and exit status 1.
set -u
cd "$(dirname "$0")/../.."
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/cpu_forward.lock}"
BIN=./ds4-forward
MODEL=tests/golden/cpu/tiny-a.f16.gguf
T=build/tests/cpu_forward.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

[ -x "$BIN" ] || fail "$BIN not built"
V=256
awk 'BEGIN { s = 7; for (i = 0; i < 260; i++) { s = (s * 1103 + 12345) % 65536; printf "%d ", s % 256 } }' > "$T/all.txt"
awk '{ for (i = 1; i <= 170; i++) printf "%s ", $i }' "$T/all.txt" > "$T/head.txt"
awk '{ for (i = 171; i <= NF; i++) printf "%s ", $i }' "$T/all.txt" > "$T/tail.txt"

$BIN $MODEL --tokens @"$T/all.txt" --logits-out "$T/all.f32" --top 0 || fail "uninterrupted run"
$BIN $MODEL --tokens @"$T/head.txt" --save-state "$T/s.dsv4" --top 0 || fail "first half"
$BIN $MODEL --load-state "$T/s.dsv4" --tokens @"$T/tail.txt" --decode --logits-out "$T/tail.f32" --top 0 -t 1 \
    || fail "continuation"
tail -c $((90 * V * 4)) "$T/all.f32" > "$T/want.f32"
cmp "$T/want.f32" "$T/tail.f32" || fail "continued session differs from the uninterrupted run"
echo "ok: DSV4 session continued in a new process, bit-identical"

expect_error() { # expect_error NEEDLE ARGS...: exit 1 with NEEDLE in the message
    needle=$1; shift
    $BIN "$@" --random 4 --top 0 > "$T/out.txt" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "exit status $rc for $*"
    grep -q "$needle" "$T/out.txt" || fail "message for $* lacks '$needle': $(cat "$T/out.txt")"
    echo "ok: $(cat "$T/out.txt")"
}
head -c 2000000 $MODEL > "$T/trunc.gguf"
expect_error "past the end of the file" "$T/trunc.gguf"
expect_error "cannot open" "$T/missing.gguf"
head -c 1000 "$T/s.dsv4" > "$T/bad.dsv4"
expect_error "truncated" $MODEL --load-state "$T/bad.dsv4"
exit 0
