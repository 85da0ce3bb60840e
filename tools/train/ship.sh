#!/bin/sh
# ship.sh - put a training run's model into the tree (docs/TRAINING.md 7):
#
#   sh tools/train/ship.sh OUTDIR
#
# Copies the Q8_0 model and MTP block, the run's summary and held-out text
# to data/models/, writes the greedy golden of tests/suite/small_model.sh
# with the engine, runs that test, and checks the 24 MB budget of what the
# repository ships.  Run tools/train/check.sh OUTDIR first (it needs the
# F32 export, which is not shipped).  Commits nothing: it prints the files
# to add.
set -eu
cd "$(dirname "$0")/../.."
[ $# -eq 1 ] || { echo "usage: sh tools/train/ship.sh OUTDIR" >&2; exit 2; }
out=$1
for f in ds4-small.gguf ds4-small-mtp.gguf summary.json held_out.txt; do
    [ -f "$out/$f" ] || { echo "ship.sh: $out/$f missing" >&2; exit 1; }
done
[ -x ./ds4 ] || { echo "ship.sh: ./ds4 not built (make)" >&2; exit 1; }
mkdir -p data/models tests/golden/small
cp "$out/ds4-small.gguf" "$out/ds4-small-mtp.gguf" data/models/
cp "$out/summary.json" data/models/ds4-small.json
cp "$out/held_out.txt" data/models/ds4-small-heldout.txt
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/train-ship.lock}"
./ds4 -m data/models/ds4-small.gguf --nothink --temp 0 -n 48 -t 2 \
    -p "Return the number of items in the queue." > tests/golden/small/greedy.txt
echo "greedy answer (tests/golden/small/greedy.txt):"
cat tests/golden/small/greedy.txt
total=$(cat data/models/* | wc -c)
echo "data/models: $total bytes"
[ "$total" -le 24000000 ] || { echo "ship.sh: over the 24 MB the repository ships" >&2; exit 1; }
sh tests/suite/small_model.sh
echo "to commit: git add data/models tests/golden/small/greedy.txt"
