#!/bin/sh
# steering_trained.sh - a direction built by ds4-direction moves a trained
# model the expected way (docs/STEERING.md): built from Python code (good)
# against English prose (bad), raw text, then swept over continuations of
# both kinds: adding the direction (scale -2) makes the code continuations
# relatively more likely than at scale 0 (nll_bad - nll_good grows), and
# removing it past zero (scale 2) makes them relatively less likely.
# A random model has no such structure: this needs a trained one, the
# shipped small model data/models/ds4-small.gguf (docs/SMALL_MODEL.md) or
# DS4_TRAINED_MODEL (a GGUF this engine runs); without one the item skips.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
M=${DS4_TRAINED_MODEL:-data/models/ds4-small.gguf}
[ -f "$M" ] || skip "no trained model: $M is not in the tree (or set DS4_TRAINED_MODEL to a trained GGUF)"
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/steering_trained.lock}"
[ -x ./ds4-direction ] || make -s ds4-direction
dir=build/suite/steering_trained
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "steering_trained: FAIL: $*" >&2; exit 1; }
D=tests/data/steering
./ds4-direction -m "$M" -c 1024 --raw --good-file $D/code.txt --bad-file $D/prose.txt -o "$dir/code.f32" \
    2> "$dir/err.txt" || fail "build: $(cat "$dir/err.txt")"
./ds4-direction -m "$M" -c 1024 --raw --sweep --direction "$dir/code.f32" --eval-file $D/code_eval.jsonl \
    --scales=-2,0,2 > "$dir/sweep.txt" 2> "$dir/err.txt" || fail "sweep: $(cat "$dir/err.txt")"
cat "$dir/sweep.txt"
awk '!/^#/ && $1 != "scale" { gap[$1] = $4 }
     END { if (!(gap["-2"] > gap["0"] && gap["0"] > gap["2"])) { print "gaps", gap["-2"], gap["0"], gap["2"]; exit 1 } }' \
    "$dir/sweep.txt" || fail "the direction does not move the NLL gap the expected way"
echo "steering_trained: ok"
