#!/bin/sh
# engine_startup.sh - what every engine program does at startup
# (README.md; src/engine/startup.h):
#  1. the instance lock: while one model process runs, every engine program
#     started on the same lock file exits with status 2 and "another ds4
#     process is already running (pid N)" naming it; another lock file
#     (DS4_LOCK_FILE) runs alongside; --dump-tokens (no weights) needs no
#     lock; after the holder exits, normally or by SIGKILL (the file then
#     still names the dead pid), programs run again;
#  2. the memory estimate: each program prints the same "memory: weights W +
#     context N tokens K" line for the model and context it was given, K
#     being what `ds4 --inspect` reports for N tokens;
#  3. options from ds4's command lines: --warm-weights (ds4, ds4-server,
#     ds4-bench) reads the model in, --quality is accepted, ds4-server
#     --chdir takes relative paths from there, ds4-bench's default model is
#     ./ds4flash.gguf; MTP and Metal options are refused with their reason
#     and status 2, as are invalid values in every program and files that
#     cannot be read or written (checked before the model loads); steering
#     scales without a direction file, out of range, and a direction file
#     of the wrong shape are refused (docs/STEERING.md).
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
for p in ds4 ds4-server ds4-bench ds4-forward ds4-score ds4-imatrix ds4-qeval ds4-mkmodel ds4-tokenizer; do
    [ -x "./$p" ] || make -s "$p"
done
root=$PWD
dir=$root/build/suite/engine_startup
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "engine_startup: FAIL: $*" >&2; exit 1; }

tok=$(suite_tokenizer)
M=$dir/model.gguf
./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$tok" --seed 5 -q -o "$M"
LOCK=$dir/ds4.lock
export DS4_LOCK_FILE="$LOCK"

# Wait until process $1 holds the lock (its pid in the file).
wait_lock() {
    i=0
    while [ "$(cat "$LOCK" 2>/dev/null)" != "$1" ]; do
        kill -0 "$1" 2>/dev/null || fail "process $1 exited before taking the lock"
        i=$((i + 1))
        [ $i -lt 600 ] || fail "process $1 did not take the lock"
        sleep 0.05
    done
}

# Wait until the server $1 logging to $2 listens.
wait_listen() {
    i=0
    until grep -q "listening on" "$2"; do
        kill -0 "$1" 2>/dev/null || fail "ds4-server exited: $(cat "$2")"
        i=$((i + 1))
        [ $i -lt 600 ] || fail "ds4-server did not start: $(cat "$2")"
        sleep 0.05
    done
}

# expect_locked PID PROGRAM ARGS...: exit 2 and the message naming PID.
expect_locked() {
    pid=$1; shift
    set +e
    "$@" > "$dir/out.txt" 2> "$dir/err.txt"
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "$* exited $rc while pid $pid holds the lock: $(cat "$dir/err.txt")"
    grep -q "another ds4 process is already running (pid $pid)" "$dir/err.txt" \
        || fail "$*: message: $(cat "$dir/err.txt")"
    [ ! -s "$dir/out.txt" ] || fail "$* printed output while locked out: $(cat "$dir/out.txt")"
}

echo "===== DS4_IMATRIX_PROMPT 0
1 2 3 4 5 6 7 8" > "$dir/ids.txt"
echo "1 2 3 4 5 6 7 8" > "$dir/plain.ids"
printf 'p1\t%s\t%s\n' "$dir/plain.ids" "$dir/plain.ids" > "$dir/manifest.tsv"
seq 1 200 > "$dir/bench.ids"

# --- a REPL holds the lock; everything else on that file is refused ---------------
mkfifo "$dir/repl.in"
./ds4 -m "$M" -c 256 --nothink --temp 0 -n 2 < "$dir/repl.in" > "$dir/repl.out" 2> "$dir/repl.err" &
holder=$!
exec 3> "$dir/repl.in"
wait_lock $holder
expect_locked $holder ./ds4 -m "$M" -c 256 -n 2 -p hi
expect_locked $holder ./ds4 -m "$M" --inspect
expect_locked $holder ./ds4-server -m "$M" -c 256 --port 0
expect_locked $holder ./ds4-bench -m "$M" --tokens-file "$dir/bench.ids" --ctx-start 64 --ctx-max 64 --gen-tokens 1
expect_locked $holder ./ds4-forward "$M" --random 4 --top 0
expect_locked $holder ./ds4-score --token-ids "$M" "$dir/manifest.tsv" "$dir/score.tsv" 64
expect_locked $holder ./ds4-imatrix "$M" --imatrix-dataset "$dir/ids.txt" --imatrix-out "$dir/x.dat"
expect_locked $holder ./ds4-qeval "$M" "$M" --dataset "$dir/ids.txt"
[ ! -e "$dir/score.tsv" ] && [ ! -e "$dir/x.dat" ] || fail "a locked-out program wrote its output"
# Another lock file is another instance; --dump-tokens takes no lock.
DS4_LOCK_FILE=$dir/other.lock ./ds4 -m "$M" -c 256 --nothink --temp 0 -n 2 -p hi > /dev/null 2>&1 \
    || fail "a program on another lock file was refused"
./ds4 -m "$M" --dump-tokens -p hi > /dev/null 2>&1 || fail "--dump-tokens was refused"

# The REPL answers a line, then exits at end of input: the lock is free.
echo "Hello" >&3
exec 3>&-
wait $holder || fail "the REPL holding the lock failed: $(cat "$dir/repl.err")"
./ds4 -m "$M" -c 256 --nothink --temp 0 -n 2 -p hi > /dev/null 2> "$dir/after.err" \
    || fail "refused after the holder exited: $(cat "$dir/after.err")"

# --- a server killed with SIGKILL leaves a stale file that blocks nobody -----------
./ds4-server -m "$M" -c 512 --port 0 > "$dir/server.log" 2>&1 &
srv=$!
wait_lock $srv
wait_listen $srv "$dir/server.log"
expect_locked $srv ./ds4 -m "$M" -c 256 -n 2 -p hi
kill -9 $srv
wait $srv 2>/dev/null || true
[ "$(cat "$LOCK")" = "$srv" ] || fail "the killed server's pid is not in the lock file"
./ds4 -m "$M" -c 256 --nothink --temp 0 -n 2 -p hi > /dev/null 2> "$dir/after.err" \
    || fail "a stale lock file blocked: $(cat "$dir/after.err")"

# --- the memory estimate, the same line everywhere ----------------------------------
kv() { ./ds4 -m "$M" --inspect -c "$1" | sed -n "s/^memory: weights .* + KV state for $1 tokens \(.*\) = .*/\1/p"; }
kv512=$(kv 512)
kv256=$(kv 256)
[ -n "$kv512" ] && [ "$kv512" != "$kv256" ] || fail "--inspect memory lines: '$kv512' '$kv256'"
want512="context 512 tokens $kv512 ="
grep -q "server .*loaded in .*; memory: weights .* + $want512" "$dir/server.log" || fail "ds4-server: $(cat "$dir/server.log")"
./ds4 -m "$M" -c 512 --nothink --temp 0 -n 1 -p hi 2>&1 >/dev/null | grep -q "^ds4: backend cpu; memory: weights .* + $want512" \
    || fail "ds4 memory line"
./ds4-forward "$M" --random 4 --top 0 --ctx 512 2>&1 | grep -q "^ds4-forward: backend cpu; memory: .* + $want512" \
    || fail "ds4-forward memory line"
./ds4-bench -m "$M" --tokens-file "$dir/bench.ids" --ctx-start 64 --ctx-max 64 --gen-tokens 1 --ctx-alloc 256 \
    2>&1 >/dev/null | grep -q "^ds4-bench: backend cpu; memory: .* + context 256 tokens $kv256 =" \
    || fail "ds4-bench memory line"
./ds4-imatrix "$M" --ctx 512 --imatrix-dataset "$dir/ids.txt" --imatrix-out "$dir/x.dat" 2>&1 \
    | grep -q "^ds4-imatrix: backend cpu; memory: .* + $want512" || fail "ds4-imatrix memory line"
./ds4-score --token-ids "$M" "$dir/manifest.tsv" "$dir/score.tsv" 512 2>&1 \
    | grep -q "^ds4-score: backend cpu; memory: .* + $want512" || fail "ds4-score memory line"

# --- options from ds4's command lines --------------------------------------------
./ds4 -m "$M" -c 256 --warm-weights --quality --nothink --temp 0 -n 1 -p hi > /dev/null 2> "$dir/warm.err" \
    || fail "ds4 --warm-weights --quality: $(cat "$dir/warm.err")"
grep -q "^ds4: warmed .* of weights in" "$dir/warm.err" || fail "ds4 --warm-weights: $(cat "$dir/warm.err")"
grep -q "^ds4: --quality: nothing to change" "$dir/warm.err" || fail "ds4 --quality: $(cat "$dir/warm.err")"
./ds4-bench -m "$M" --cpu --threads 2 --warm-weights --quality --tokens-file "$dir/bench.ids" --ctx-start 64 \
    --ctx-max 64 --gen-tokens 1 > /dev/null 2> "$dir/warm.err" || fail "ds4-bench options: $(cat "$dir/warm.err")"
grep -q "^ds4-bench: warmed .* of weights" "$dir/warm.err" || fail "ds4-bench --warm-weights: $(cat "$dir/warm.err")"
# ds4-bench without -m runs ./ds4flash.gguf.
mkdir "$dir/cwd"
ln -s "$M" "$dir/cwd/ds4flash.gguf"
(cd "$dir/cwd" && "$root/ds4-bench" --tokens-file "$dir/bench.ids" --ctx-start 64 --ctx-max 64 --gen-tokens 1 \
    > bench.csv 2> bench.err) || fail "ds4-bench with the default model: $(cat "$dir/cwd/bench.err")"
[ "$(wc -l < "$dir/cwd/bench.csv")" -eq 2 ] || fail "default-model bench: $(cat "$dir/cwd/bench.csv")"
# ds4-server --chdir: the model and the trace file are taken from there.
./ds4-server --chdir "$dir/cwd" -m ds4flash.gguf --trace trace.txt -c 256 --port 0 --warm-weights \
    > "$dir/chdir.log" 2>&1 &
srv=$!
wait_listen $srv "$dir/chdir.log"
kill $srv
wait $srv || fail "ds4-server --chdir did not stop cleanly: $(cat "$dir/chdir.log")"
grep -q "ds4-server: warmed .* of weights" "$dir/chdir.log" || fail "ds4-server --warm-weights: $(cat "$dir/chdir.log")"
[ -f "$dir/cwd/trace.txt" ] || fail "ds4-server --chdir: the trace file is not in the new directory"

# Options of ds4 this engine does not have: refused with their reason.
expect_refused() { # expect_refused NEEDLE PROGRAM ARGS...
    want=$1; shift
    set +e
    "$@" > /dev/null 2> "$dir/err.txt"
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "$* exited $rc, want 2"
    grep -q -- "$want" "$dir/err.txt" || fail "$*: message lacks '$want': $(cat "$dir/err.txt")"
}
for p in ./ds4 ./ds4-server ./ds4-bench; do
    expect_refused "Metal is not supported" $p -m "$M" --metal
done
# Steering: checked before loading (status 2), the file's shape at loading
# (status 1, both sizes named).
head -c 16 /dev/zero > "$dir/short.f32"
for p in ./ds4 ./ds4-server ./ds4-bench ./ds4-agent; do
    expect_refused "no-such.f32" $p -m "$M" --dir-steering-file no-such.f32
    expect_refused "needs --dir-steering-file" $p -m "$M" --dir-steering-ffn 0.5
    expect_refused "needs --dir-steering-file" $p -m "$M" --dir-steering-attn -1
    expect_refused "dir-steering-ffn" $p -m "$M" --dir-steering-file "$dir/short.f32" --dir-steering-ffn 101
done
set +e
./ds4 -m "$M" --dir-steering-file "$dir/short.f32" -p hi -n 1 > /dev/null 2> "$dir/err.txt"
rc=$?
set -e
[ $rc -eq 1 ] || fail "ds4 with a 16-byte direction file exited $rc, want 1"
grep -q "16 bytes" "$dir/err.txt" || fail "direction file message: $(cat "$dir/err.txt")"
# ds4, ds4-server and ds4-bench draft with an MTP block: their options are
# checked before any loading
for p in ./ds4 ./ds4-server ./ds4-bench; do
    expect_refused "mtp.gguf" $p -m "$M" --mtp mtp.gguf
    expect_refused "--mtp-draft" $p -m "$M" --mtp-draft 17
    expect_refused "--mtp-draft" $p -m "$M" --mtp-draft 0
done
expect_refused "--mtp-margin" ./ds4 -m "$M" --mtp-margin=-1
expect_refused "--mtp-margin" ./ds4-server -m "$M" --mtp-margin=-1
expect_refused "Metal build" ./ds4 -m "$M" --metal-graph-test
expect_refused "unknown backend 'tpu'" ./ds4-server -m "$M" --backend tpu

# Invalid values are usage errors (status 2) in every engine program, worded
# from the one option table (base/opts.h) with the one context range.
expect_refused "Metal is not supported" ./ds4-score "$M" "$dir/manifest.tsv" "$dir/s.tsv" --backend metal
expect_refused "ds4-score: -t 0: must be an integer in 1..4096" ./ds4-score "$M" "$dir/manifest.tsv" "$dir/s.tsv" -t 0
expect_refused "ds4-qeval: --ctx abc: must be an integer in 1..1048576" ./ds4-qeval "$M" "$M" --dataset "$dir/ids.txt" --ctx abc
expect_refused "ds4-qeval: -t 0: must be an integer in 1..4096" ./ds4-qeval "$M" "$M" --dataset "$dir/ids.txt" -t 0
expect_refused "ds4-forward: --ctx abc: must be an integer in 1..1048576" ./ds4-forward "$M" --ctx abc
expect_refused "unknown backend 'tpu'" ./ds4-forward "$M" --backend tpu
expect_refused "ds4-imatrix: --ctx 0: must be an integer in 1..1048576" ./ds4-imatrix "$M" --imatrix-dataset x --imatrix-out y --ctx 0
expect_refused "ds4-bench: --ctx-start x: must be an integer in 1..1048576" ./ds4-bench -m "$M" --ctx-start x
expect_refused "ds4-server: -c 0: must be an integer in 1..1048576" ./ds4-server -m "$M" -c 0
expect_refused "ds4: -c 1048577: must be an integer in 1..1048576" ./ds4 -m "$M" -c 1048577
expect_refused "ds4-score: CTX 0: must be an integer in 1..1048576" ./ds4-score "$M" "$dir/manifest.tsv" "$dir/s.tsv" 0
# Files named on the command line are checked before the model loads
# (none.gguf does not exist: the file, not the model, is what they name).
N=$dir/none.gguf
expect_refused "ds4-score: MANIFEST: cannot open $dir/none.tsv" ./ds4-score "$N" "$dir/none.tsv" "$dir/s.tsv"
expect_refused "ds4-score: OUT.tsv: cannot write $dir/no/s.tsv" ./ds4-score "$N" "$dir/manifest.tsv" "$dir/no/s.tsv"
expect_refused "ds4-imatrix: --imatrix-out: cannot write" ./ds4-imatrix "$N" --imatrix-dataset "$dir/ids.txt" --imatrix-out "$dir/no/x.dat"
expect_refused "ds4-imatrix: --imatrix-dataset: cannot open" ./ds4-imatrix "$N" --imatrix-dataset "$dir/no.txt" --imatrix-out "$dir/x.dat"
expect_refused "ds4-forward: --logits-out: cannot write" ./ds4-forward "$N" --random 4 --logits-out "$dir/no/l.f32"
expect_refused "ds4-forward: --tokens: cannot open $dir/no.ids" ./ds4-forward "$N" --tokens "@$dir/no.ids"
expect_refused "ds4-qeval: --dataset: cannot open" ./ds4-qeval "$M" "$M" --dataset "$dir/no.txt"
expect_refused "ds4-qeval: nothing to measure: give --imatrix FILE (weighted error), --dataset FILE" ./ds4-qeval "$M" "$M"
expect_refused "ds4-server: --test-force-output: cannot open" ./ds4-server -m "$N" --test-force-output "$dir/no.json"
[ ! -e "$dir/s.tsv" ] || fail "a refused ds4-score wrote its output"
./ds4-score --token-ids --cpu "$M" "$dir/manifest.tsv" "$dir/s.tsv" 64 2>/dev/null || fail "ds4-score --cpu"
echo "engine_startup: ok"
