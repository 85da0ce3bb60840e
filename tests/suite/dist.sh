#!/bin/sh
# dist.sh - the pipeline over MPI (docs/DISTRIBUTED.md) on the committed
# tiny model (6 layers, ratios 0,0,4,128,4,128), ds4-forward under mpirun:
#  1. 2- and 3-rank pipelines give logits bit-identical to one process, in
#     prefill (chunks of 16: several in flight) and in decode, for even and
#     uneven splits and splits before a ratio-4 and a ratio-128 layer, and
#     with 5 sequences decoded side by side (micro-steps in flight);
#  2. a snapshot saved by a 3-rank run is byte for byte the 1-rank one, and
#     each resumes in the other with the uninterrupted run's logits;
#  3. a rank killed mid-decode ends the others inside 10 s with a message
#     naming it (mpirun's default, and --enable-recovery, where the
#     pipeline's heartbeats find it: a worker, or rank 0);
#  4. a rank started with another model file (another shape; the same
#     shape with other weights) and bad --layers are refused at start,
#     naming the difference; so is --gpus, under mpirun and in a CPU build;
#  5. ds4 under mpirun writes what one process writes; ds4-server under
#     mpirun answers, and answers 503 naming the rank once one is killed.
# SKIP when mpirun is absent.
set -u
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/dist.lock}"
BIN=./ds4-forward
MODEL=tests/golden/cpu/tiny-a.f16.gguf
OTHER=tests/golden/cpu/tiny-b.f16.gguf
T=build/tests/dist.$$
fail() { echo "FAIL: $*"; exit 1; }

command -v mpirun > /dev/null 2>&1 || skip "mpirun is not installed (make deps installs openmpi-bin)"
[ -x "$BIN" ] || fail "$BIN not built"
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
# Open MPI refuses root unless told; ranks share the machine's two cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 120 mpirun --oversubscribe --bind-to none"
V=256

awk 'BEGIN { s = 7; for (i = 0; i < 200; i++) { s = (s * 1103 + 12345) % 65536; printf "%d ", s % 256 } }' > "$T/all.txt"
awk '{ for (i = 1; i <= 120; i++) printf "%s ", $i }' "$T/all.txt" > "$T/head.txt"
awk '{ for (i = 121; i <= NF; i++) printf "%s ", $i }' "$T/all.txt" > "$T/tail.txt"
RUN="--tokens @$T/all.txt --split 120 --chunk 16 --top 0 -t 1"

$BIN $MODEL $RUN --logits-out "$T/one.f32" 2> "$T/one.err" || fail "one process: $(cat "$T/one.err")"

# pipeline NAME RANK-LAYERS...: one rank a layer range ("-" for the split by memory)
pipeline() {
    name=$1; shift
    args=""
    for l in "$@"; do
        lay=""
        [ "$l" = "-" ] || lay="--layers $l"
        if [ -z "$args" ]; then
            args="-np 1 $BIN $MODEL $RUN --logits-out $T/$name.f32 $lay"
        else
            args="$args : -np 1 $BIN $MODEL -t 1 $lay"
        fi
    done
    # shellcheck disable=SC2086
    $MPIRUN $args > "$T/$name.out" 2>&1 || fail "pipeline $name: $(cat "$T/$name.out")"
    cmp "$T/one.f32" "$T/$name.f32" > /dev/null || fail "pipeline $name: logits differ from one process"
    echo "ok: pipeline $name ($*): 200 tokens' logits (120 prefilled in chunks of 16, 80 decoded) bit-identical"
}
pipeline 2-even 0:2 3:output
pipeline 2-ratio4 0:1 2:output
pipeline 2-ratio128 0:2 3:5
pipeline 2-uneven 0:4 5:output
pipeline 3-ratio128 0:0 1:2 3:output
pipeline 3-ratio4 0:1 2:3 4:output
pipeline 3-auto - - -
grep -q "pipeline stage 2: layers .*output head" "$T/3-auto.out" || fail "the split by memory: $(cat "$T/3-auto.out")"

# sessions batched: 5 sequences decoded side by side, each step split into
# micro-steps that keep every stage busy; every sequence's logits agree
RUN="$RUN --seqs 5"
pipeline 3-batched 0:1 2:3 4:output
RUN=${RUN% --seqs 5}

# greedy decoding with the argmax taken on the last rank (4 bytes back a token)
$BIN $MODEL --random 50 --bench --gen 24 --top 2 -t 1 2>/dev/null | grep -E "greedy tokens|top" > "$T/g1.txt" || fail "greedy alone"
$MPIRUN -np 3 $BIN $MODEL --random 50 --bench --gen 24 --top 2 -t 1 2>/dev/null | grep -E "greedy tokens|top" > "$T/g3.txt" ||
    fail "greedy on 3 ranks"
cmp "$T/g1.txt" "$T/g3.txt" || fail "greedy on 3 ranks: $(cat "$T/g1.txt" "$T/g3.txt")"
echo "ok: greedy decoding on 3 ranks (argmax on the last rank): one process's tokens and final logits"

# bf16 residuals: not exact, but the same model (the best next token agrees)
$MPIRUN -np 2 $BIN $MODEL --tokens @"$T/all.txt" --top 1 -t 1 --pipe-dtype bf16 > "$T/bf16.out" 2>&1 ||
    fail "bf16 residuals: $(cat "$T/bf16.out")"
$BIN $MODEL --tokens @"$T/all.txt" --top 1 -t 1 > "$T/f32.out" 2>/dev/null || fail "top 1"
[ "$(grep next-token "$T/bf16.out" | cut -d'(' -f1)" = "$(grep next-token "$T/f32.out" | cut -d'(' -f1)" ] ||
    fail "bf16 residuals change the best next token: $(grep next-token "$T/bf16.out" "$T/f32.out")"
echo "ok: bf16 residuals keep the best next token"

# snapshots: one file whatever the ranks
$BIN $MODEL --tokens @"$T/head.txt" --save-state "$T/one.dsv4" --top 0 -t 1 2>/dev/null || fail "1-rank save"
$MPIRUN -np 3 $BIN $MODEL --tokens @"$T/head.txt" --save-state "$T/three.dsv4" --top 0 -t 1 > "$T/save.out" 2>&1 ||
    fail "3-rank save: $(cat "$T/save.out")"
cmp "$T/one.dsv4" "$T/three.dsv4" || fail "the 3-rank snapshot differs from the 1-rank one"
echo "ok: a 3-rank snapshot is byte for byte the 1-rank one"
tail -c $((80 * V * 4)) "$T/one.f32" > "$T/want.f32"
$MPIRUN -np 3 $BIN $MODEL --load-state "$T/one.dsv4" --tokens @"$T/tail.txt" --decode --logits-out "$T/r3.f32" \
    --top 0 -t 1 > "$T/r3.out" 2>&1 || fail "3-rank resume: $(cat "$T/r3.out")"
cmp "$T/want.f32" "$T/r3.f32" || fail "a 1-rank snapshot resumed by 3 ranks differs from the uninterrupted run"
$MPIRUN -np 1 $BIN $MODEL --load-state "$T/three.dsv4" --tokens @"$T/tail.txt" --decode --logits-out "$T/r1.f32" \
    --top 0 -t 1 : -np 1 $BIN $MODEL -t 1 > "$T/r1.out" 2>&1 || fail "2-rank resume: $(cat "$T/r1.out")"
cmp "$T/want.f32" "$T/r1.f32" || fail "a 3-rank snapshot resumed by 2 ranks differs from the uninterrupted run"
$BIN $MODEL --load-state "$T/three.dsv4" --tokens @"$T/tail.txt" --decode --logits-out "$T/r0.f32" --top 0 -t 1 \
    2>/dev/null || fail "1-process resume"
cmp "$T/want.f32" "$T/r0.f32" || fail "a 3-rank snapshot resumed by one process differs from the uninterrupted run"
echo "ok: snapshots resume across 1, 2 and 3 ranks with the uninterrupted run's logits"

# a rank killed mid-decode: the others end inside 10 s, the rank named
kill_test() { # kill_test MODE RANK [MPIRUN-OPTION]
    mode=$1; victim=$2; shift 2
    # shellcheck disable=SC2086
    $MPIRUN "$@" -np 3 $BIN $MODEL --random 30000 -c 30001 --decode --top 0 -t 1 > "$T/kill.out" 2>&1 &
    job=$!
    i=0
    while ! grep -q "pipeline stage 2" "$T/kill.out" 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 300 ] || fail "$mode: the pipeline did not start: $(cat "$T/kill.out")"; sleep 0.1
    done
    sleep 1
    pid=$(sed -n "s/.*stage $victim: .*(pid \([0-9]*\) on.*/\1/p" "$T/kill.out")
    [ -n "$pid" ] || fail "$mode: no pid for rank $victim: $(cat "$T/kill.out")"
    t0=$(date +%s%N)
    kill -9 "$pid"
    i=0
    while kill -0 $job 2>/dev/null; do
        i=$((i + 1)); [ $i -lt 150 ] || { kill $job; fail "$mode: the job still runs 15 s after rank $victim died"; }
        sleep 0.1
    done
    wait $job
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ $ms -lt 10000 ] || fail "$mode: the others took $ms ms to stop"
    grep -q "rank $victim" "$T/kill.out" || fail "$mode: no message names rank $victim: $(cat "$T/kill.out")"
    echo "ok: $mode: rank $victim killed mid-decode, every rank ended in $ms ms: $(grep -m1 -E "rank $victim .*(signal|sent nothing)" "$T/kill.out")"
}
kill_test "mpirun's default" 1
kill_test "--enable-recovery" 1 --enable-recovery
grep -q "rank 2: stopping: rank 1 .* sent nothing" "$T/kill.out" || fail "rank 2 did not say why it stopped: $(cat "$T/kill.out")"
kill_test "--enable-recovery, rank 0" 0 --enable-recovery
grep -q "rank [12]: stopping: rank 0 .* sent nothing" "$T/kill.out" || fail "the workers did not say why they stopped: $(cat "$T/kill.out")"

# refusals at start
refused() { # refused NEEDLE MPIRUN-ARGS...
    needle=$1; shift
    # shellcheck disable=SC2086
    $MPIRUN "$@" > "$T/ref.out" 2>&1 && fail "not refused: $*"
    grep -q -e "$needle" "$T/ref.out" || fail "the refusal of $* lacks '$needle': $(cat "$T/ref.out")"
    echo "ok: refused: $(grep -m1 -e "$needle" "$T/ref.out")"
}
refused "rank 1 .* was started with another model: $OTHER has layers 5" \
    -np 1 $BIN $MODEL --random 4 --top 0 : -np 1 $BIN $OTHER
cp $MODEL "$T/same-shape.gguf"
printf '\001' | dd of="$T/same-shape.gguf" bs=1 seek=16800 conv=notrunc 2>/dev/null # token_embd's first byte
refused "rank 1 .* was started with another model: the tensor table of .*same-shape.gguf differs" \
    -np 1 $BIN $MODEL --random 4 --top 0 : -np 1 $BIN "$T/same-shape.gguf"
refused "has --layers 4:5, but the stage before it ends at layer 2" \
    -np 1 $BIN $MODEL --random 4 --top 0 --layers 0:2 : -np 1 $BIN $MODEL --layers 4:output
refused "rank 1 .* has no --layers" -np 1 $BIN $MODEL --random 4 --top 0 --layers 0:2 : -np 1 $BIN $MODEL
refused "the last rank's layers end at 4" -np 1 $BIN $MODEL --random 4 --top 0 --layers 0:2 : -np 1 $BIN $MODEL --layers 3:4
refused "--layers 3:9: not a range" -np 1 $BIN $MODEL --random 4 --top 0 --layers 0:2 : -np 1 $BIN $MODEL --layers 3:9
refused "--gpus runs one process over GPUs of its host: not under mpirun" -np 2 $BIN $MODEL --random 4 --gpus 0,1
# --gpus without mpirun: the stages over GPUs, which a CPU build has not (status 2, before the model loads)
$BIN $MODEL --random 4 --gpus 0,1 > "$T/gpus.out" 2>&1
rc=$?
if [ $rc != 2 ] || ! grep -q "this is a CPU build" "$T/gpus.out"; then
    fail "--gpus in a CPU build: status $rc: $(cat "$T/gpus.out")"
fi
echo "ok: refused: $(cat "$T/gpus.out")"

# the programs: ds4's text, ds4-server's answers and its 503
CHAT=$T/chat.gguf
./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$(suite_tokenizer)" --seed 11 -q -o "$CHAT" || fail "mkmodel"
export NO_COLOR=1
./ds4 -m "$CHAT" -p "hello there" -n 12 --temp 0 -t 1 > "$T/ds4-1.txt" 2>/dev/null || fail "ds4 alone"
$MPIRUN -np 3 ./ds4 -m "$CHAT" -p "hello there" -n 12 --temp 0 -t 1 --warm-weights > "$T/ds4-3.txt" 2> "$T/ds4-3.err" ||
    fail "ds4 under mpirun: $(cat "$T/ds4-3.err")"
cmp "$T/ds4-1.txt" "$T/ds4-3.txt" || fail "ds4 on 3 ranks writes another text: $(cat "$T/ds4-1.txt" "$T/ds4-3.txt")"
echo "ok: ds4 on 3 ranks writes one process's text"
# --warm-weights: each rank reads its own stage in, together the whole model's tensors
[ "$(grep -c "ds4: warmed" "$T/ds4-3.err")" = 3 ] || fail "not every rank warmed its stage: $(cat "$T/ds4-3.err")"
echo "ok: --warm-weights on 3 ranks: $(grep "ds4: warmed" "$T/ds4-3.err" | sed 's/ in .*//; s/ds4: warmed //' | tr '\n' ' ')"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
$MPIRUN --enable-recovery -np 2 ./ds4-server -m "$CHAT" --port "$port" -t 1 -c 4096 > "$T/srv.out" 2>&1 &
job=$!
post() { # post: the status and body of a completion
    python3 - "$port" <<'PY'
import json, sys, urllib.request, urllib.error
req = urllib.request.Request("http://127.0.0.1:%s/v1/completions" % sys.argv[1],
                             data=json.dumps({"prompt": "hello", "max_tokens": 5, "temperature": 0}).encode(),
                             headers={"content-type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=30) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
except OSError as e:
    print(0, e)
PY
}
i=0
while ! grep -q "listening on" "$T/srv.out"; do
    i=$((i + 1)); [ $i -lt 300 ] || { kill $job; fail "ds4-server did not start: $(cat "$T/srv.out")"; }; sleep 0.1
done
ans=$(post)
[ "${ans%% *}" = 200 ] || { kill $job; fail "ds4-server on 2 ranks: $ans"; }
echo "ok: ds4-server on 2 ranks answers: $(echo "$ans" | cut -c1-120)"
kill -9 "$(sed -n 's/.*stage 1: .*(pid \([0-9]*\) on.*/\1/p' "$T/srv.out")"
i=0
while :; do
    ans=$(post)
    [ "${ans%% *}" = 503 ] && break
    i=$((i + 1)); [ $i -lt 40 ] || { kill $job; fail "no 503 10 s after rank 1 died: $ans"; }; sleep 0.25
done
kill $job
wait $job
echo "$ans" | grep -q "rank 1 .*sent nothing" || fail "the 503 does not name rank 1: $ans"
echo "ok: after rank 1 died: $ans"
exit 0
