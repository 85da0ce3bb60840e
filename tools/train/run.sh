#!/bin/sh
# run.sh - train the small DeepSeek V4 model on one GPU and export it
# (docs/TRAINING.md): the one command of a training run.
#
#   sh tools/train/run.sh OUTDIR [train.py options]
#
# Needs python3 with torch, transformers, tokenizers and numpy (no network:
# the corpus is the running Python's standard library).  The defaults are
# sized for one H100 in under 10 minutes; training stops after 7 minutes at
# the latest (the log says so, and such a run is not reproducible).
set -eu
[ $# -ge 1 ] || { echo "usage: sh tools/train/run.sh OUTDIR [train.py options]" >&2; exit 2; }
out=$1
shift
mkdir -p "$out"
exec python3 "$(dirname "$0")/train.py" "$out" --steps 1500 --batch 64 --seq 512 --max-minutes 7 "$@"
