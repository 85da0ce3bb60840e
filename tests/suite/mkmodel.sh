#!/bin/sh
# mkmodel.sh - ds4-mkmodel writes deterministic files (same seed, any thread
# count: same bytes), every recipe produces a file the GGUF reader accepts
# with the expected tensor types, and bad options fail with a message.
set -eu
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

for r in f32 f16 q8_0 q2 q4; do
    ./ds4-mkmodel -q --recipe "$r" --seed 5 -t 1 -o "$dir/$r-1.gguf"
    ./ds4-mkmodel -q --recipe "$r" --seed 5 -t 2 -o "$dir/$r-2.gguf"
    cmp "$dir/$r-1.gguf" "$dir/$r-2.gguf"
    ./ds4-gguf info "$dir/$r-1.gguf" > "$dir/$r.txt"
done
grep -q 'blk.2.ffn_gate_exps.weight *iq2_xxs' "$dir/q2.txt"
grep -q 'blk.2.ffn_down_exps.weight *q2_k' "$dir/q2.txt"
grep -q 'blk.2.ffn_up_exps.weight *q4_k' "$dir/q4.txt"
grep -q 'blk.0.attn_q_b.weight *q8_0' "$dir/q2.txt"
grep -q 'token_embd.weight *f16' "$dir/q2.txt"
grep -q 'blk.0.ffn_gate_tid2eid.weight *i32' "$dir/f32.txt"
grep -q 'blk.3.exp_probs_b.bias *f32' "$dir/f32.txt"
if grep -q 'blk.0.exp_probs_b.bias' "$dir/f32.txt"; then echo "hash layer has a router bias"; exit 1; fi

# A different seed changes the bytes.
./ds4-mkmodel -q --seed 6 -o "$dir/s6.gguf"
./ds4-mkmodel -q --seed 5 -o "$dir/s5.gguf"
if cmp -s "$dir/s5.gguf" "$dir/s6.gguf"; then echo "seed ignored"; exit 1; fi

# The MTP block (--mtp) of every recipe and of other shapes: a file the
# loader binds to its model and a speculative run drafts with (forced
# acceptance: the drafts' rows and the verification run); another shape's
# model refuses it naming a key.
[ -x ./ds4-bench ] || make -s ds4-bench
for r in f32 f16 q8_0 q2 q4; do
    ./ds4-mkmodel -q --recipe "$r" --seed 5 -o "$dir/m-$r.gguf" --mtp "$dir/mtp-$r.gguf"
    ./ds4-gguf info "$dir/mtp-$r.gguf" | grep -q 'mtp.0.e_proj.weight' || { echo "$r: no mtp.0.e_proj"; exit 1; }
    ./ds4-bench -m "$dir/m-$r.gguf" --backend cpu --mtp "$dir/mtp-$r.gguf" --mtp-draft 2 --mtp-forced --ctx-start 8 \
        --ctx-max 8 --gen-tokens 3 > "$dir/mtp-$r.csv" 2> "$dir/mtp-$r.err" || { cat "$dir/mtp-$r.err"; exit 1; }
done
./ds4-mkmodel -q --preset small --recipe q8_0 --set layers=3 --set window=16 --seed 5 -o "$dir/m-s.gguf" \
    --mtp "$dir/mtp-s.gguf"
./ds4-bench -m "$dir/m-s.gguf" --backend cpu --mtp "$dir/mtp-s.gguf" --mtp-draft 3 --ctx-start 20 --ctx-max 20 \
    --gen-tokens 4 > /dev/null 2> "$dir/mtp-s.err" || { cat "$dir/mtp-s.err"; exit 1; }
if ./ds4-bench -m "$dir/m-s.gguf" --backend cpu --mtp "$dir/mtp-q8_0.gguf" --ctx-start 8 --ctx-max 8 \
    > /dev/null 2> "$dir/err.txt"; then echo "a tiny block bound to a small model"; exit 1; fi
grep -q "an MTP block of another model" "$dir/err.txt" || { cat "$dir/err.txt"; exit 1; }

# Shapes that a recipe cannot hold, unknown names, bad values: clear errors.
expect_fail() {
    want=$1; shift
    if "$@" >"$dir/err.txt" 2>&1; then echo "expected failure: $*"; exit 1; fi
    grep -q -- "$want" "$dir/err.txt" || { echo "message lacks '$want':"; cat "$dir/err.txt"; exit 1; }
}
expect_fail "not a multiple of the iq2_xxs block" ./ds4-mkmodel -q --recipe q2 --set embd=64 -o "$dir/x.gguf"
expect_fail "unknown recipe" ./ds4-mkmodel -q --recipe q3 -o "$dir/x.gguf"
expect_fail "--preset huge: must be one of tiny, small, mid, flash or pro" ./ds4-mkmodel -q --preset huge -o "$dir/x.gguf"
expect_fail "--set layers=0: not KEY=VALUE" ./ds4-mkmodel -q --set layers=0 -o "$dir/x.gguf"
expect_fail "must divide head_count" ./ds4-mkmodel -q --set o-groups=3 -o "$dir/x.gguf"
[ ! -e "$dir/x.gguf" ] || { echo "a failed run left an output file"; exit 1; }

# A shape only the simulations cannot take (96 non-RoPE values: not whole
# FP8 KV blocks of 64) is written and runs with them off; with them on the
# backend refuses it, saying why.
./ds4-mkmodel -q --recipe f16 --set head-dim=160 --set embd=80 --set o-rank=16 -o "$dir/odd.gguf"
./ds4-forward "$dir/odd.gguf" --random 8 --top 0 --no-sim > "$dir/odd.txt" 2>&1 || { cat "$dir/odd.txt"; exit 1; }
expect_fail "FP8 KV simulation" ./ds4-forward "$dir/odd.gguf" --random 8 --top 0
echo "mkmodel: ok"
