#!/bin/sh
# run.sh BUILD_DIR - the CUDA backend tests (tests/cuda/test_cuda.c) on the
# tiny models: CPU vs CUDA for every quantization recipe, and the HF
# transformers goldens.  BUILD_DIR is build/cuda (a real GPU, `make
# test-cuda`) or build/emu (the CPU emulation of CUDA).
#   QUICK=1      shorter runs (the emulation is slow)
#   SANITIZE=1   run every test under compute-sanitizer memcheck
set -eu
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: run.sh BUILD_DIR}
TEST=$BUILD/test_cuda
MK=./ds4-mkmodel
[ -x "$BUILD/bin/ds4-mkmodel" ] && MK=$BUILD/bin/ds4-mkmodel
[ -x "$TEST" ] || { echo "$TEST not built"; exit 1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
WRAP=""
[ "${SANITIZE:-0}" = 1 ] && WRAP="compute-sanitizer --tool memcheck --error-exitcode 3 --leak-check full"

if [ "${QUICK:-0}" = 1 ]; then
    RECIPES="f16 q2"; ARGS="--prompt 140 --steps 24"
else
    RECIPES="f16 q8_0 q2 q4"; ARGS="--prompt 300 --steps 500"
fi
fail=0
for r in $RECIPES; do
    $MK -q --recipe "$r" --seed 11 -o "$T/tiny-$r.gguf"
    echo "== tiny $r"
    (cd "$T" && $WRAP "$OLDPWD/$TEST" compare "tiny-$r.gguf" $ARGS) || fail=1
done
if [ "${QUICK:-0}" != 1 ]; then
    $MK -q --preset small --recipe q2 --seed 12 -o "$T/small-q2.gguf"
    echo "== small q2"
    (cd "$T" && $WRAP "$OLDPWD/$TEST" compare small-q2.gguf --prompt 600 --steps 200) || fail=1
fi
for g in tiny-a tiny-b; do
    echo "== HF golden $g"
    $WRAP "$TEST" golden tests/golden/cpu/$g.f16.gguf tests/golden/cpu/$g.golden || fail=1
done
[ $fail = 0 ] && echo "cuda tests: all passed" || { echo "cuda tests: FAILED"; exit 1; }
