#!/bin/sh
# cpu_quant.sh - the CPU forward pass on generated models with the
# published quantization recipes (q8_0, q2 = IQ2_XXS/Q2_K experts, q4 = Q4_K
# experts; ds4-mkmodel): each runs, prefill equals token-by-token decode
# bit for bit and does not depend on the thread count; a Q8_0 output head
# alone stays within Q8_0 precision of the F32 model.
set -u
cd "$(dirname "$0")/../.."
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/cpu_quant.lock}"
T=build/tests/cpu_quant.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -x ./ds4-forward ] || fail "ds4-forward not built"
[ -x ./ds4-mkmodel ] || fail "ds4-mkmodel not built"

for r in q8_0 q2 q4; do
    ./ds4-mkmodel -q -o "$T/$r.gguf" --preset tiny --recipe "$r" --seed 3 || fail "mkmodel $r"
    ./ds4-forward "$T/$r.gguf" --random 48 --logits-out "$T/p.f32" --top 0 -t 2 || fail "prefill $r"
    ./ds4-forward "$T/$r.gguf" --random 48 --decode --logits-out "$T/d.f32" --top 0 -t 1 || fail "decode $r"
    cmp "$T/p.f32" "$T/d.f32" || fail "$r: prefill and decode differ"
    echo "ok: $r prefill == decode (2 vs 1 threads)"
done

# Only the LM head quantized: logits within a few Q8_0 steps of F32.
./ds4-mkmodel -q -o "$T/f32.gguf" --preset tiny --recipe f32 --seed 3 || fail "mkmodel f32"
./ds4-mkmodel -q -o "$T/out8.gguf" --preset tiny --recipe f32 --type output=q8_0 --seed 3 || fail "mkmodel out8"
./ds4-forward "$T/f32.gguf" --random 16 --logits-out "$T/a.f32" --top 0 || fail "f32 run"
./ds4-forward "$T/out8.gguf" --random 16 --logits-out "$T/b.f32" --top 0 || fail "q8_0 head run"
od -An -v -f "$T/a.f32" | tr -s ' ' '\n' | grep -v '^$' > "$T/a.txt"
od -An -v -f "$T/b.f32" | tr -s ' ' '\n' | grep -v '^$' > "$T/b.txt"
paste "$T/a.txt" "$T/b.txt" | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > dmax) dmax = d; a = $1 < 0 ? -$1 : $1; if (a > amax) amax = a }
    END { printf "q8_0 head: max|d| %g of max|logit| %g\n", dmax, amax; exit !(dmax <= 0.03 * amax && dmax > 0) }' \
    || fail "q8_0 head too far from f32"
exit 0
