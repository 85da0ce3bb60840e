#!/bin/sh
# dist.sh BINDIR - pipeline stages on the CUDA backend under mpirun (a step
# of tests/cuda/run.sh; docs/DISTRIBUTED.md), BINDIR's ds4-forward on the
# committed tiny model (6 layers, ratios 0,0,4,128,4,128), 136 tokens: 120
# prefilled in chunks of 16 (several in flight), 16 decoded (across the
# ratio-128 window's end at 127):
#  1. 2 and 3 CUDA ranks (splits before the ratio-4 and the ratio-128
#     layers, and the last layer alone) give one CUDA process's logits bit
#     for bit, and save its snapshot byte for byte;
#  2. mixed ranks, each with its own --backend - a CUDA rank before a CPU
#     one, a CPU rank before a CUDA one, cuda / cpu / cuda - give one CPU
#     process's logits within 1e-3 of max |logit| with the same argmax on
#     every row (simulations off), and a mixed pipeline resumes one CPU
#     process's snapshot as the uninterrupted CPU run goes on;
#  3. a CPU and a CUDA rank split by memory (no --layers; the CUDA rank
#     counts its GPU's free memory) give one CPU process's logits, and the
#     stage lines say which rank runs on what.
# BINDIR is build/cuda/bin (a GPU: every CUDA rank shares it) or
# build/emu/bin (the CPU emulation of CUDA).  SKIP when mpirun is absent.
# shellcheck disable=SC2086 # option lists ($RUN, $opts, $args) split into words on purpose
set -u
BIN=$(cd "${1:?usage: dist.sh BINDIR}" && pwd)/ds4-forward
cd "$(dirname "$0")/../.." || exit 1
fail() { echo "dist: FAIL: $*"; exit 1; }
command -v mpirun > /dev/null 2>&1 || { echo "dist: SKIP: mpirun is not installed (make deps installs openmpi-bin)"; exit 0; }
[ -x "$BIN" ] || fail "$BIN not built"
MODEL=tests/golden/cpu/tiny-a.f16.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export DS4_LOCK_FILE="$T/ds4.lock"
# Open MPI refuses root unless told; the ranks share the machine's cores
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="timeout 600 mpirun --oversubscribe --bind-to none"

awk 'BEGIN { s = 7; for (i = 0; i < 136; i++) { s = (s * 1103 + 12345) % 65536; printf "%d ", s % 256 } }' > "$T/all.txt"
awk '{ for (i = 1; i <= 120; i++) printf "%s ", $i }' "$T/all.txt" > "$T/head.txt"
awk '{ for (i = 121; i <= NF; i++) printf "%s ", $i }' "$T/all.txt" > "$T/tail.txt"
RUN="--tokens @$T/all.txt --split 120 --chunk 16 --top 0 -t 1 -c 256"

# close NAME WANT GOT: GOT's logits within 1e-3 of WANT's largest, the same argmax on every row
close() {
    python3 - "$T/$2.f32" "$T/$3.f32" "$1" << 'PY' || exit 1
import sys
from array import array
def load(p):
    a = array("f")
    with open(p, "rb") as f:
        a.frombytes(f.read())
    return a
want, got, name = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
V = 256
if len(want) != len(got) or len(want) % V:
    sys.exit("dist: FAIL: %s: %d logits, want %d" % (name, len(got), len(want)))
amax = max(abs(x) for x in want)
worst = max(abs(x - y) for x, y in zip(got, want)) / amax
rows = len(want) // V
def best(a, r):
    row = a[r * V:(r + 1) * V]
    return row.index(max(row))
args = sum(best(got, r) != best(want, r) for r in range(rows))
if worst > 1e-3 or args:
    sys.exit("dist: FAIL: %s: max|d| %.3g of max|logit| %.3f, %d of %d argmax differ" % (name, worst, amax, args, rows))
print("ok: %s: %d rows within %.2g of max|logit|, the same argmax" % (name, rows, worst))
PY
}

# pipeline NAME OPTS RANK...: a rank is BACKEND:LAYERS ("-" layers: the split by memory)
pipeline() {
    name=$1 opts=$2
    shift 2
    args=""
    for r in "$@"; do
        be=${r%%:*} lay=${r#*:}
        [ "$lay" = "-" ] && lay="" || lay="--layers $lay"
        if [ -z "$args" ]; then
            args="-np 1 $BIN $MODEL $opts --backend $be $lay"
        else
            args="$args : -np 1 $BIN $MODEL -t 1 --backend $be $lay"
        fi
    done
    $MPIRUN $args > "$T/$name.out" 2>&1 || fail "pipeline $name: $(cat "$T/$name.out")"
}

# 1. CUDA ranks against one CUDA process: the same bits
"$BIN" $MODEL $RUN --backend cuda --logits-out "$T/cuda.f32" > "$T/cuda.out" 2>&1 || fail "one CUDA process: $(cat "$T/cuda.out")"
"$BIN" $MODEL --tokens @"$T/head.txt" --chunk 16 --top 0 -t 1 -c 256 --backend cuda --save-state "$T/cuda.dsv4" \
    > "$T/cuda-save.out" 2>&1 || fail "one CUDA process's snapshot: $(cat "$T/cuda-save.out")"
for split in "2-ratio128 cuda:0:2 cuda:3:output" "2-last-alone cuda:0:4 cuda:5:output" \
    "3-ratio4-ratio128 cuda:0:1 cuda:2:2 cuda:3:output"; do
    set -- $split
    name=$1
    shift
    pipeline "$name" "$RUN --logits-out $T/$name.f32" "$@"
    cmp "$T/cuda.f32" "$T/$name.f32" > /dev/null || fail "CUDA pipeline $name ($*): logits differ from one CUDA process"
    echo "ok: CUDA pipeline $name ($*): 136 tokens' logits (120 prefilled in chunks of 16, 16 decoded) bit-identical to one CUDA process"
done
pipeline save "--tokens @$T/head.txt --chunk 16 --top 0 -t 1 -c 256 --save-state $T/pipe.dsv4" cuda:0:2 cuda:3:output
cmp "$T/cuda.dsv4" "$T/pipe.dsv4" > /dev/null || fail "the 2-rank CUDA snapshot differs from one CUDA process's"
echo "ok: a snapshot of 2 CUDA ranks is byte for byte one CUDA process's"

# 2. mixed ranks against one CPU process (simulations off: the reference is continuous)
NS="$RUN --no-sim"
"$BIN" $MODEL $NS --backend cpu --logits-out "$T/cpu.f32" > "$T/cpu.out" 2>&1 || fail "one CPU process: $(cat "$T/cpu.out")"
pipeline mix-cuda-cpu "$NS --logits-out $T/mix1.f32" cuda:0:2 cpu:3:output
close "a CUDA rank before a CPU rank" cpu mix1
pipeline mix-cpu-cuda "$NS --logits-out $T/mix2.f32" cpu:0:1 cuda:2:output
close "a CPU rank before a CUDA rank" cpu mix2
pipeline mix-3 "$NS --logits-out $T/mix3.f32" cuda:0:1 cpu:2:3 cuda:4:output
close "cuda, cpu, cuda ranks" cpu mix3
if ! { grep -q "pipeline stage 1: layers 2..3 on cpu" "$T/mix-3.out" &&
    grep -q "stage 2: layers 4..5 + output head on cuda" "$T/mix-3.out"; }; then
    fail "the stage lines do not say each rank's backend: $(cat "$T/mix-3.out")"
fi
"$BIN" $MODEL --tokens @"$T/head.txt" --chunk 16 --top 0 -t 1 -c 256 --no-sim --backend cpu --save-state "$T/cpu.dsv4" \
    > "$T/cpu-save.out" 2>&1 || fail "one CPU process's snapshot: $(cat "$T/cpu-save.out")"
tail -c $((16 * 256 * 4)) "$T/cpu.f32" > "$T/cpu-tail.f32"
pipeline resume "--load-state $T/cpu.dsv4 --tokens @$T/tail.txt --decode --top 0 -t 1 -c 256 --no-sim --logits-out $T/resume.f32" \
    cuda:0:2 cpu:3:output
close "a CPU snapshot resumed by a CUDA and a CPU rank" cpu-tail resume

# 3. the split by memory: the CUDA rank's share from its GPU's free memory
pipeline auto "$NS --logits-out $T/auto.f32" cpu:- cuda:-
close "cpu and cuda ranks split by memory" cpu auto
if ! { grep -q "stage 0: layers 0\.\.[0-9]* + embedding on cpu" "$T/auto.out" &&
    grep -q "+ output head on cuda" "$T/auto.out"; }; then
    fail "the split by memory: $(cat "$T/auto.out")"
fi
echo "ok: the split by memory: $(grep -o 'stage [01]: layers [^(]*' "$T/auto.out" | tr '\n' ';')"
exit 0
