#!/bin/sh
# check.sh - check a training run's export with the engine (docs/TRAINING.md):
#
#   sh tools/train/check.sh OUTDIR
#
#  1. `ds4 --perplexity-file held_out.txt` on the F32 export, simulations off,
#     equals the NLL train.py computed with torch (summary.json) to 1e-3
#     relative: the same tokens and the same forward pass, trained routing and
#     indexer selection included;
#  2. the Q8_0 export's NLL on the same text (simulations on, as ds4 runs);
#  3. greedy answers with and without the MTP block's drafts are the same
#     text (speculative decoding is lossless), on the Q8_0 files.
# Needs ./ds4 (make) and python3 (standard library only).  Exit status 0
# when every check passes.
set -u
cd "$(dirname "$0")/../.."
[ $# -eq 1 ] || { echo "usage: sh tools/train/check.sh OUTDIR" >&2; exit 2; }
out=$1
DS4=${DS4:-./ds4}
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/train-check.lock}"
mkdir -p build
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$DS4" ] || fail "$DS4 not built (make)"
for f in ds4-small.gguf ds4-small-f32.gguf ds4-small-mtp.gguf held_out.txt summary.json; do
    [ -f "$out/$f" ] || fail "$out/$f missing"
done

field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['held_out_text'][sys.argv[2]])" \
    "$out/summary.json" "$1"; }
ntok=$(field tokens)
torch_nll=$(field nll)
ctx=$((ntok + 64))

ppl() { # ppl MODEL [flags]: nll=X of the line of ds4 --perplexity-file
    m=$1; shift
    "$DS4" -m "$m" -c "$ctx" --perplexity-file "$out/held_out.txt" "$@" 2>/dev/null |
        tr ' ' '\n' | sed -n 's/^nll=//p'
}
f32_nll=$(ppl "$out/ds4-small-f32.gguf" --no-sim)
[ -n "$f32_nll" ] || fail "ds4 --perplexity-file on the F32 export gave no NLL"
python3 - "$torch_nll" "$f32_nll" "$ntok" <<'EOF' || exit 1
import sys
t, e, n = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rel = abs(e - t) / abs(t)
print(f"F32, simulations off: engine NLL {e:.6f}, torch {t:.6f} over {n - 32} scored tokens: "
      f"relative difference {rel:.2e}")
if not rel <= 1e-3:
    print("FAIL: the engine's NLL differs from the training framework's by more than 1e-3")
    sys.exit(1)
EOF
q8_nll=$(ppl "$out/ds4-small.gguf")
q8_nosim=$(ppl "$out/ds4-small.gguf" --no-sim)
[ -n "$q8_nll" ] && [ -n "$q8_nosim" ] || fail "ds4 --perplexity-file on the Q8_0 export gave no NLL"
echo "Q8_0: NLL $q8_nll (simulations on), $q8_nosim (off)"

prompt="Return the number of items in the queue."
"$DS4" -m "$out/ds4-small.gguf" --nothink --temp 0 -n 48 -p "$prompt" > "$out/greedy.txt" 2>/dev/null \
    || fail "greedy answer"
"$DS4" -m "$out/ds4-small.gguf" --mtp "$out/ds4-small-mtp.gguf" --nothink --temp 0 -n 48 -p "$prompt" \
    > "$out/greedy-mtp.txt" 2>"$out/greedy-mtp.err" || fail "greedy answer with --mtp: $(cat "$out/greedy-mtp.err")"
cmp -s "$out/greedy.txt" "$out/greedy-mtp.txt" || fail "greedy answers differ with and without --mtp"
echo "MTP: the greedy answer with drafts equals the one without"
echo "ok"
