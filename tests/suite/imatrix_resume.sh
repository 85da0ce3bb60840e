#!/bin/sh
# imatrix_resume.sh - importance-matrix checkpoints (engine/imatrix_run.h):
# a collection stopped by --imatrix-max-prompts and continued with --resume
# writes the bytes of the uninterrupted run (checkpoints every 2 prompts and
# at the stop; ds4 and ds4-imatrix); a prompt cut by --imatrix-max-tokens
# counts as done;
# the finished run removes OUT.partial; a checkpoint of another dataset, a
# missing one and a damaged one are refused; a bad prompt names its line.
# On the CPU backend, a tiny model, token-id prompts.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/imatrix_resume.lock}"
for p in ds4 ds4-mkmodel ds4-imatrix; do [ -x "./$p" ] || make -s "$p"; done
dir=build/suite/imatrix_resume
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "imatrix_resume: FAIL: $*" >&2; exit 1; }

M=$dir/model.gguf
./ds4-mkmodel --preset tiny --recipe q8_0 --seed 11 -q -o "$M"
# seven prompts of token ids, of different lengths
i=0
for n in 9 17 5 23 12 30 8; do
    echo "===== DS4_IMATRIX_PROMPT $i ids"
    seq $((i * 7 + 3)) $((i * 7 + 2 + n)) | tr '\n' ' '
    echo
    echo
    i=$((i + 1))
done > "$dir/ds.txt"

imx() { ./ds4-imatrix "$M" --backend cpu --ctx 64 -t 2 --imatrix-dataset "$dir/ds.txt" "$@" 2> "$dir/err.txt"; }

imx --imatrix-out "$dir/all.dat" || fail "full run: $(cat "$dir/err.txt")"
grep -q "from 7 prompts, 104 tokens" "$dir/err.txt" || fail "full run summary: $(cat "$dir/err.txt")"
[ ! -e "$dir/all.dat.partial" ] || fail "a finished run left all.dat.partial"

# stopped after 3 prompts (checkpoints every 2 and at the stop), resumed
imx --imatrix-out "$dir/a.dat" --imatrix-max-prompts 3 --imatrix-save-every 2 || fail "3 prompts: $(cat "$dir/err.txt")"
[ -s "$dir/a.dat.partial" ] || fail "a run stopped by --imatrix-max-prompts left no a.dat.partial"
cmp -s "$dir/a.dat" "$dir/all.dat" && fail "3 prompts wrote the whole run's file"
imx --imatrix-out "$dir/a.dat" --resume || fail "resume: $(cat "$dir/err.txt")"
grep -q "from 7 prompts, 104 tokens" "$dir/err.txt" || fail "resumed summary: $(cat "$dir/err.txt")"
cmp -s "$dir/a.dat" "$dir/all.dat" || fail "stopped after 3 prompts and resumed: not the uninterrupted run's bytes"
[ ! -e "$dir/a.dat.partial" ] || fail "the resumed run, finished, left a.dat.partial"

# in two legs of 2 and 5 prompts by ds4 itself (the shared loop)
./ds4 -m "$M" --backend cpu -c 64 -t 2 --imatrix-dataset "$dir/ds.txt" --imatrix-out "$dir/c.dat" \
    --imatrix-max-prompts 2 2> "$dir/err.txt" || fail "ds4, 2 prompts: $(cat "$dir/err.txt")"
./ds4 -m "$M" --backend cpu -c 64 -t 2 --imatrix-dataset "$dir/ds.txt" --imatrix-out "$dir/c.dat" --resume \
    2> "$dir/err.txt" || fail "ds4 --resume: $(cat "$dir/err.txt")"
cmp -s "$dir/c.dat" "$dir/all.dat" || fail "ds4 in two legs: not the uninterrupted run's bytes"

# a token limit that cuts a prompt: the cut prompt counts as done, so the
# resumed run goes on with the next one (6 of the 9 tokens of prompt 4 lost)
imx --imatrix-out "$dir/t.dat" --imatrix-max-tokens 40 || fail "40 tokens: $(cat "$dir/err.txt")"
imx --imatrix-out "$dir/t.dat" --resume || fail "resume after 40 tokens: $(cat "$dir/err.txt")"
grep -q "from 7 prompts, 90 tokens" "$dir/err.txt" || fail "resumed after a cut prompt: $(cat "$dir/err.txt")"

# refusals
rm -f "$dir/none.dat.partial"
if imx --imatrix-out "$dir/none.dat" --resume; then fail "--resume without a checkpoint ran"; fi
grep -q "none.dat.partial" "$dir/err.txt" || fail "--resume without a checkpoint: $(cat "$dir/err.txt")"
imx --imatrix-out "$dir/o.dat" --imatrix-max-prompts 1 || fail "1 prompt: $(cat "$dir/err.txt")"
cp "$dir/ds.txt" "$dir/ds2.txt"
echo "===== DS4_IMATRIX_PROMPT 7 ids" >> "$dir/ds2.txt"
echo "1 2 3" >> "$dir/ds2.txt"
if ./ds4-imatrix "$M" --backend cpu --ctx 64 --imatrix-dataset "$dir/ds2.txt" --imatrix-out "$dir/o.dat" --resume \
    2> "$dir/err.txt"; then fail "a checkpoint of another dataset was resumed"; fi
grep -q "is of another run" "$dir/err.txt" || fail "another dataset: $(cat "$dir/err.txt")"
head -c 100 "$dir/o.dat.partial" > "$dir/cut.dat.partial"
if imx --imatrix-out "$dir/cut.dat" --resume; then fail "a truncated checkpoint was resumed"; fi
grep -q "cut.dat.partial: a checkpoint of the wrong size" "$dir/err.txt" || fail "truncated: $(cat "$dir/err.txt")"

# a prompt that is neither token ids nor text the model can take names its line
printf '===== DS4_IMATRIX_PROMPT 0 ids\n1 2 3\n\n===== DS4_IMATRIX_PROMPT 1 ids\n4 999999 5\n' > "$dir/bad.txt"
if ./ds4-imatrix "$M" --backend cpu --ctx 64 --imatrix-dataset "$dir/bad.txt" --imatrix-out "$dir/bad.dat" \
    2> "$dir/err.txt"; then fail "an out-of-vocabulary id was accepted"; fi
grep -q "bad.txt:5: prompt 2: token id outside the vocabulary" "$dir/err.txt" || fail "bad prompt: $(cat "$dir/err.txt")"
echo "imatrix_resume: ok"
