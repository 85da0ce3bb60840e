#!/bin/sh
# imatrix-experiment.sh - does an imatrix collected from the engine beat the
# synthetic column-energy fallback?  On the tiny official-format checkpoint:
# f32 model, imatrix from 20 random-token prompts, q2 with and without it,
# then ./ds4-qeval on 8 held-out prompts (importance-weighted expert error,
# KL divergence from the f32 model).  The same experiment runs as
# tests/unit/test_imatrix_tools.c; results are in docs/TOOLCHAIN.md.
#
#   make && make venv && .venv/bin/python tests/reference/make_official_ckpt.py
#   sh scripts/imatrix-experiment.sh [CKPT_DIR] [WORK_DIR]
set -eu
ckpt=${1:-build/tiny-official}
work=${2:-build/imatrix-experiment}
mkdir -p "$work"
dataset() { # prompts length seed file: token ids from the test's LCG
    awk -v P="$1" -v N="$2" -v S="$3" 'BEGIN {
        x = S; M = 4294967296
        for (p = 0; p < P; p++) {
            printf "\n\n===== DS4_IMATRIX_PROMPT %d test tokens gen =====\n", p
            for (i = 0; i < N; i++) {
                x = (x * 1664525 + 1013904223) % M
                printf "%d%s", int(x / 256) % 512, (i % 16 == 15) ? "\n" : " "
            }
        }
    }' > "$4"
}
dataset 20 64 1 "$work/calib.txt"
dataset 8 64 2 "$work/eval.txt"
./ds4-quantize --hf "$ckpt" --out "$work/f32.gguf" --recipe f32 --quiet --overwrite
./ds4-quantize --hf "$ckpt" --out "$work/q2.gguf" --recipe q2 --quiet --overwrite
./ds4-imatrix "$work/f32.gguf" --imatrix-dataset "$work/calib.txt" --imatrix-out "$work/im.dat"
./ds4-quantize --hf "$ckpt" --out "$work/q2-imatrix.gguf" --recipe q2 --imatrix "$work/im.dat" --quiet --overwrite
for m in q2 q2-imatrix; do
    echo "== $m"
    ./ds4-qeval "$work/f32.gguf" "$work/$m.gguf" --imatrix "$work/im.dat" --dataset "$work/eval.txt"
done
