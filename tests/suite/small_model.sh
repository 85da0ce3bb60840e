#!/bin/sh
# small_model.sh - the shipped small trained model (data/models/ds4-small.gguf,
# docs/SMALL_MODEL.md), where trained behaviour matters:
#  1. the engine's tokenizer, read from the model file, gives the held-out
#     text the token ids HF tokenizers gave it in training (the summary's
#     ids), and its NLL on the committed held-out text (Q8_0, simulations on, as ds4
#     runs) is within 2 % of the NLL torch computed on the F32 weights at the
#     end of training (data/models/ds4-small.json): the trained forward pass
#     survives export, quantization and the low-precision simulations;
#  2. the greedy answer to a known prompt is the committed one
#     (tests/golden/small/greedy.txt) and reads as text (printable ASCII);
#  3. with the MTP block's drafts the greedy answer is the same text, and the
#     trained block gets at least a third of its drafts accepted.
# SKIPs while the model is not in the tree.  After a new model is committed,
# write the golden with:
#   ./ds4 -m data/models/ds4-small.gguf --nothink --temp 0 -n 48 -t 2 \
#       -p "Return the number of items in the queue." > tests/golden/small/greedy.txt
set -u
cd "$(dirname "$0")/../.."
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/small_model.lock}"
M=data/models/ds4-small.gguf
MTP=data/models/ds4-small-mtp.gguf
SUMMARY=data/models/ds4-small.json
TEXT=data/models/ds4-small-heldout.txt
GOLDEN=tests/golden/small/greedy.txt
PROMPT="Return the number of items in the queue."
if [ ! -f "$M" ]; then
    echo "SKIP: $M is not in the tree (docs/SMALL_MODEL.md says how it is trained)"
    exit 77
fi
T=build/tests/small_model.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for f in "$MTP" "$SUMMARY" "$TEXT" "$GOLDEN"; do [ -f "$f" ] || fail "$f missing (it belongs with $M)"; done

# 1. tokens and NLL against the training framework's
./ds4-tokenizer -t "$M" encode -f "$TEXT" > "$T/ids.txt" || fail "ds4-tokenizer encode"
python3 - "$SUMMARY" "$T/ids.txt" <<'EOF' || exit 1
import json, sys
want = json.load(open(sys.argv[1]))["held_out_text"]["ids"]
got = [int(x) for x in open(sys.argv[2]).read().split()]
if got != want:
    i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    sys.exit(f"FAIL: the engine's tokens differ from tokenizers' at index {i} ({len(got)} vs {len(want)} ids)")
print(f"tokenizer: the engine's {len(got)} ids of the held-out text equal tokenizers'")
EOF
./ds4 -m "$M" -c 8192 -t 2 --perplexity-file "$TEXT" > "$T/ppl.txt" 2>"$T/ppl.err" || fail "perplexity: $(cat "$T/ppl.err")"
python3 - "$SUMMARY" "$T/ppl.txt" <<'EOF' || exit 1
import json, sys
want = json.load(open(sys.argv[1]))["held_out_text"]
got = dict(kv.split("=", 1) for kv in open(sys.argv[2]).read().split())
n, avg = int(got["scored"]), float(got["avg_nll"])
rel = abs(avg - want["avg_nll"]) / want["avg_nll"]
print(f"held-out NLL: engine (Q8_0) {avg:.5f} nats/token, torch (F32) {want['avg_nll']:.5f}; relative {rel:.2e}")
if n != want["scored"]:
    sys.exit(f"FAIL: the engine scored {n} tokens, torch {want['scored']}: the tokenizations differ")
if rel > 0.02:
    sys.exit("FAIL: more than 2 % from torch's NLL")
EOF

# 2. greedy answer
./ds4 -m "$M" --nothink --temp 0 -n 48 -t 2 -p "$PROMPT" > "$T/greedy.txt" 2>"$T/greedy.err" \
    || fail "greedy answer: $(cat "$T/greedy.err")"
cmp -s "$T/greedy.txt" "$GOLDEN" || fail "greedy answer changed:
--- want
$(cat "$GOLDEN")
--- got
$(cat "$T/greedy.txt")"
python3 - "$T/greedy.txt" <<'EOF' || exit 1
import sys
t = open(sys.argv[1], "rb").read()
ok = sum(32 <= b < 127 or b in (9, 10) for b in t) / max(1, len(t))
print(f"greedy answer: {len(t)} bytes, {ok:.0%} printable ASCII")
if len(t) < 40 or ok < 0.95:
    sys.exit("FAIL: the answer does not read as text")
EOF

# 3. MTP drafts
./ds4 -m "$M" --mtp "$MTP" --nothink --temp 0 -n 48 -t 2 -p "$PROMPT" > "$T/mtp.txt" 2>"$T/mtp.err" \
    || fail "greedy answer with --mtp: $(cat "$T/mtp.err")"
cmp -s "$T/mtp.txt" "$GOLDEN" || fail "the greedy answer with MTP drafts differs from the one without"
rate=$(sed -n 's/.*MTP: \([0-9]*\) of \([0-9]*\) drafts accepted.*/\1 \2/p' "$T/mtp.err" | tail -1)
[ -n "$rate" ] || fail "no MTP statistics in: $(cat "$T/mtp.err")"
set -- $rate
echo "MTP: $1 of $2 drafts accepted"
[ "$2" -gt 0 ] && [ $(($1 * 3)) -ge "$2" ] || fail "the trained MTP block has under a third of its drafts accepted"
echo "ok"
