#!/bin/sh
# gpus.sh BINDIR [quick] - the pipeline over a host's GPUs in one process
# (--gpus; docs/DISTRIBUTED.md), a step of tests/cuda/run.sh: BINDIR's
# ds4-forward on the committed tiny model (6 layers, ratios 0,0,4,128,4,128),
# 24 tokens - 20 prefilled in chunks of 4 (several in flight), 4 decoded -
# then 3 greedy tokens (the argmax taken on the last GPU):
#  1. 2 GPUs split by their memory, and 3 GPUs listed out of order (2,0,1:
#     stage 0 on GPU 2) split at the ratio-4 and the ratio-128 layer
#     (--layers 0:1,2:2,3:output), give one CUDA process's logits and
#     greedy tokens bit for bit, and save its snapshot byte for byte;
#  2. 3 GPUs of unequal memory get unequal stages (the split by memory),
#     and one CUDA process's snapshot resumes on 2 GPUs as the
#     uninterrupted run goes on, bit for bit;
#  3. refusals: a GPU the process does not see, a stage its GPU cannot
#     hold (the stage's error, and every thread ends), f16 residuals, a
#     --layers list of the wrong length, --backend cpu;
#  4. (the emulation) a GPU failing mid-prefill ends the program with the
#     stage named, no thread or transfer left waiting;
#  5. (before 4) --tensor-parallel 2 gives one process's greedy tokens, and
#     is refused beside --gpus and for heads that do not divide.
# quick (the default suite's smoke set): 1. with 2 GPUs only, 12 tokens (10
# prefilled: 3 chunks in flight), 2 greedy.
# BINDIR is build/emu/bin (the CPU emulation of CUDA: DS4_EMU_GPUS
# emulates 3 GPUs, DS4_EMU_GPU_MEM their memory) or build/cuda/bin (real
# GPUs: SKIP, status 77, with fewer than 3).
# shellcheck disable=SC2086 # option lists ($RUN, $one) split into words on purpose
set -u
BIN=$(cd "${1:?usage: gpus.sh BINDIR [quick]}" && pwd)/ds4-forward
QUICK=${2:-}
cd "$(dirname "$0")/../.." || exit 1
fail() { echo "gpus: FAIL: $*"; exit 1; }
[ -x "$BIN" ] || fail "$BIN not built"
export DS4_EMU_GPUS=3
EMU=1
if [ "${BIN#*/build/emu/}" = "$BIN" ]; then
    EMU=0
    n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
    [ "$n" -ge 3 ] || { echo "gpus: SKIP: $n GPUs (3 needed)"; exit 77; }
fi
MODEL=tests/golden/cpu/tiny-a.f16.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export DS4_LOCK_FILE="$T/ds4.lock"

N=24 PRE=20 GEN=3
[ "$QUICK" = quick ] && N=12 PRE=10 GEN=2
awk -v n=$N 'BEGIN { s = 7; for (i = 0; i < n; i++) { s = (s * 1103 + 12345) % 65536; printf "%d ", s % 256 } }' \
    > "$T/all.txt"
awk -v p=$PRE '{ for (i = 1; i <= p; i++) printf "%s ", $i }' "$T/all.txt" > "$T/head.txt"
awk -v p=$PRE '{ for (i = p + 1; i <= NF; i++) printf "%s ", $i }' "$T/all.txt" > "$T/tail.txt"
RUN="--tokens @$T/all.txt --split $PRE --chunk 4 --top 0 -t 1 -c 64 --bench --gen $GEN"

# run NAME OPTS...: ds4-forward on the model, its output kept in NAME.out
run() {
    name=$1
    shift
    timeout 600 "$BIN" $MODEL "$@" > "$T/$name.out" 2>&1 || fail "$name: $(cat "$T/$name.out")"
}
greedy() { grep "greedy tokens" "$T/$1.out"; }
same() { # same NAME: NAME's logits, greedy tokens and snapshot are one process's
    cmp "$T/one.f32" "$T/$1.f32" > /dev/null || fail "$1: logits differ from one CUDA process"
    [ "$(greedy "$1")" = "$(greedy one)" ] || fail "$1: $(greedy "$1"), one CUDA process $(greedy one)"
    cmp "$T/one.dsv4" "$T/$1.dsv4" > /dev/null || fail "$1: the snapshot differs from one CUDA process's"
}

# 1. bit for bit one CUDA process
run one $RUN --backend cuda --logits-out "$T/one.f32" --save-state "$T/one.dsv4"
run two $RUN --gpus 0,1 --logits-out "$T/two.f32" --save-state "$T/two.dsv4"
same two
grep -q "stage 1: layers 3..5 + output head on cuda .*, GPU 1" "$T/two.out" || fail "the even split: $(cat "$T/two.out")"
echo "ok: --gpus 0,1 (split by memory: $(grep -o 'stage 0: layers [0-9.]*' "$T/two.out")): $N tokens' logits ($PRE prefilled in chunks of 4, $((N - PRE)) decoded), $(greedy two | tr -d '\n'), the snapshot: one CUDA process's bit for bit"
[ "$QUICK" = quick ] && exit 0
run three $RUN --gpus 2,0,1 --layers 0:1,2:2,3:output --logits-out "$T/three.f32" --save-state "$T/three.dsv4"
same three
grep -q "stage 0: layers 0..1 + embedding on cuda .*, GPU 2" "$T/three.out" || fail "3 GPUs: $(cat "$T/three.out")"
echo "ok: --gpus 2,0,1 --layers 0:1,2:2,3:output (stages from the ratio-4 and the ratio-128 layer, stage 0 on GPU 2): one CUDA process's logits, greedy tokens and snapshot bit for bit"

# 2. unequal memory (a GPU's budget is its free memory less 1 GiB, in
# whole GiB: 5, 2 and 2), a resumed snapshot
DS4_EMU_GPU_MEM=6G,3G,3G run uneven $RUN --gpus 0,1,2 --logits-out "$T/uneven.f32"
cmp "$T/one.f32" "$T/uneven.f32" > /dev/null || fail "uneven memory: logits differ from one CUDA process"
[ "$(greedy uneven)" = "$(greedy one)" ] || fail "uneven memory: $(greedy uneven), one CUDA process $(greedy one)"
stages=$(grep -o 'stage [0-9]: layers [0-9.]*' "$T/uneven.out" | tr '\n' ';')
[ "$stages" = "stage 0: layers 0..3;stage 1: layers 4..4;stage 2: layers 5..5;" ] ||
    fail "GPUs of 6, 3 and 3 GiB: $stages ($(cat "$T/uneven.out"))"
echo "ok: GPUs of 6, 3 and 3 GiB split by memory ($stages): one CUDA process's logits and greedy tokens"
run head --tokens @"$T/head.txt" --chunk 4 --top 0 -t 1 -c 64 --backend cuda --save-state "$T/head.dsv4"
tail -c $(((N - PRE) * 256 * 4)) "$T/one.f32" > "$T/one-tail.f32"
run resume --load-state "$T/head.dsv4" --tokens @"$T/tail.txt" --decode --top 0 -t 1 -c 64 --gpus 1,2 \
    --logits-out "$T/resume.f32"
cmp "$T/one-tail.f32" "$T/resume.f32" > /dev/null || fail "a resumed snapshot: logits differ from the uninterrupted run"
echo "ok: one CUDA process's snapshot resumed on --gpus 1,2: the uninterrupted run's logits"

# 3. refusals
refused() { # refused STATUS NEEDLE OPTS...: refused with that status, the message says NEEDLE
    want=$1 needle=$2
    shift 2
    timeout 600 "$BIN" $MODEL --tokens 1,2,3 --top 0 -t 1 -c 64 "$@" > "$T/ref.out" 2>&1
    got=$?
    [ "$got" = "$want" ] || fail "$*: status $got, want $want: $(cat "$T/ref.out")"
    grep -q -e "$needle" "$T/ref.out" || fail "$*: the refusal lacks '$needle': $(cat "$T/ref.out")"
    echo "ok: refused ($got): $(grep -m1 -e "$needle" "$T/ref.out")"
}
refused 1 "GPU 3: the process sees 3 GPUs" --gpus 0,3
DS4_EMU_GPU_MEM=16G,1G refused 1 "stage 1 (GPU 1): CUDA backend: the pipeline stage of layers .* needs" --gpus 0,1
refused 1 "residuals between GPUs (--gpus) travel in f32" --gpus 0,1 --pipe-dtype f16
refused 1 "one range a GPU of --gpus (3)" --gpus 0,1,2 --layers 0:2,3:output
refused 2 "not --backend cpu" --gpus 0,1 --backend cpu
refused 2 "listed twice" --gpus 0,1,0

# 5. the program's --tensor-parallel (test_cuda tp holds its logits to one
# GPU's): the same greedy tokens; refused beside a pipeline
run tp $RUN --tensor-parallel 2
[ "$(greedy tp)" = "$(greedy one)" ] || fail "--tensor-parallel 2: $(greedy tp), one CUDA process $(greedy one)"
echo "ok: --tensor-parallel 2: one CUDA process's $(greedy tp | tr -d '\n')"
refused 2 "does not combine with a pipeline (--gpus)" --gpus 0,1 --tensor-parallel 2
refused 1 "do not divide among 3 GPUs" --tensor-parallel 3

# 4. a GPU that fails mid-prefill (the emulation's DS4_EMU_FAIL_LAUNCH: the
# 400th launch on GPU 1, in stage 1's third chunk): the program ends with
# status 1 naming the stage, its threads and NCCL's transfers with it
[ "$EMU" = 1 ] || exit 0
start=$(date +%s)
DS4_EMU_FAIL_LAUNCH=1:400 timeout 120 "$BIN" $MODEL $RUN --gpus 0,1 > "$T/fault.out" 2>&1
rc=$?
[ $rc = 1 ] || fail "a failing GPU: status $rc, want 1: $(cat "$T/fault.out")"
grep -q "pipeline failed: stage 1 (GPU 1) failed: .*launch failure" "$T/fault.out" ||
    fail "a failing GPU: the message does not name stage 1: $(cat "$T/fault.out")"
echo "ok: a GPU failing mid-prefill ends the program in $(($(date +%s) - start)) s: $(tail -n 1 "$T/fault.out")"
exit 0
