#!/bin/sh
# steering.sh - directional steering end to end (docs/STEERING.md) on a tiny
# random model with the real tokenizer:
#   - ds4-direction builds a direction file (n_layer x n_embd f32, unit or
#     zero rows) and its JSON metadata from two prompt
#     sets; a control set and --pair-normalize give other directions (the
#     control's still close to the first); bad prompt and evaluation
#     files are refused naming the line and the field;
#   - the sweep prints one row per scale; its scale-0 row is the unchanged
#     model (the same numbers as a sweep of a zero direction file);
#   - ds4 --dir-steering-file with --dir-steering-ffn 0 answers exactly as
#     without a file; with scales it answers otherwise, and --perplexity-file
#     scores otherwise; the interactive /steer command;
#   - ds4-server: the dir_steering request field (tests/server/steering.py).
# That a direction moves the NLL of its own two sets the expected way needs
# a trained model: tests/suite/steering_trained.sh.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/steering.lock}"
for p in ds4 ds4-direction ds4-mkmodel ds4-tokenizer ds4-server; do [ -x "./$p" ] || make -s "$p"; done
PY=${PYTHON:-python3}
dir=build/suite/steering
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "steering: FAIL: $*" >&2; exit 1; }
D=tests/data/steering
tok=$(suite_tokenizer)
M=$dir/model.gguf
./ds4-mkmodel --preset tiny --recipe f16 --tokenizer "$tok" --seed 11 -q -o "$M"
run() { "$@" > "$dir/out.txt" 2> "$dir/err.txt" || fail "$* exited $?: $(cat "$dir/err.txt")"; }

# --- building ----------------------------------------------------------------
run ./ds4-direction -m "$M" -c 512 --good-file $D/cheerful.txt --bad-file $D/gloomy.txt -o "$dir/dir.f32"
grep -q "good prompts: 6/6" "$dir/err.txt" || fail "progress: $(cat "$dir/err.txt")"
run ./ds4-direction -m "$M" -c 512 --good-file $D/cheerful.txt --bad-file $D/gloomy.txt --control-file $D/neutral.txt \
    -o "$dir/ctl.f32"
run ./ds4-direction -m "$M" -c 512 --good-file $D/cheerful.txt --bad-file $D/gloomy.txt --pair-normalize \
    --component attn -o "$dir/pair.f32"
"$PY" - "$dir" <<'PYEOF' || fail "direction files"
import array, json, math, sys
d = sys.argv[1]
meta = json.load(open(d + "/dir.json"))
L, D = meta["shape"]
assert meta["format"] == "ds4-directional-steering-v1" and meta["component"] == "ffn_out", meta
assert meta["good_prompts"] == 6 and meta["bad_prompts"] == 6, meta
assert json.load(open(d + "/pair.json"))["component"] == "attn_out"
vs = {}
for name in ("dir", "ctl", "pair"):
    v = array.array("f")
    v.frombytes(open(d + "/" + name + ".f32", "rb").read())
    assert len(v) == L * D, (name, len(v), L, D)
    rows = [v[i * D:(i + 1) * D] for i in range(L)]
    for r in rows:
        assert abs(math.sqrt(math.fsum(x * x for x in r)) - 1) < 1e-5, name
    vs[name] = rows
# the control set changes the direction but keeps most of it
for a, b in zip(vs["dir"], vs["ctl"]):
    cos = math.fsum(x * y for x, y in zip(a, b))
    assert 0.3 < cos < 1 - 1e-6, cos
assert vs["dir"] != vs["pair"]
print("direction files ok:", L, "x", D)
PYEOF

# bad input names the line and the field
printf 'fine\n{"text": "no prompt field"}\n' > "$dir/bad.txt"
if ./ds4-direction -m "$M" --good-file "$dir/bad.txt" --bad-file $D/gloomy.txt -o "$dir/x.f32" 2> "$dir/err.txt"; then
    fail "a prompt line without \"prompt\" was accepted"
fi
grep -q 'bad.txt:2: field "prompt" is missing' "$dir/err.txt" || fail "message: $(cat "$dir/err.txt")"
printf '{"prompt": "p", "good": "g", "bad": "b"}\n{"prompt": "p", "good": 3, "bad": "b"}\n' > "$dir/eval.jsonl"
if ./ds4-direction -m "$M" --sweep --direction "$dir/dir.f32" --eval-file "$dir/eval.jsonl" 2> "$dir/err.txt"; then
    fail "an evaluation line with a number for \"good\" was accepted"
fi
grep -q 'eval.jsonl:2: field "good" must be a string' "$dir/err.txt" || fail "message: $(cat "$dir/err.txt")"
printf '{"prompt": "p", "good": "g", "bad": "b"\n' > "$dir/eval.jsonl"
! ./ds4-direction -m "$M" --sweep --direction "$dir/dir.f32" --eval-file "$dir/eval.jsonl" 2> "$dir/err.txt" ||
    fail "malformed JSON accepted"
grep -q 'eval.jsonl:1: ' "$dir/err.txt" || fail "message: $(cat "$dir/err.txt")"
set +e
./ds4-direction -m "$M" --sweep --direction "$dir/dir.f32" 2> "$dir/err.txt"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "needs --direction FILE and --eval-file" "$dir/err.txt" || fail "usage: $rc $(cat "$dir/err.txt")"

# --- sweeping ----------------------------------------------------------------
run ./ds4-direction -m "$M" -c 512 --sweep --direction "$dir/dir.f32" --eval-file $D/eval.jsonl --scales=-2,0,1,2
cp "$dir/out.txt" "$dir/sweep.txt"
L=$("$PY" -c "import json; print(json.load(open('$dir/dir.json'))['shape'][0])")
E=$("$PY" -c "import json; print(json.load(open('$dir/dir.json'))['shape'][1])")
head -c $((L * E * 4)) /dev/zero > "$dir/zero.f32" # every layer left alone
run ./ds4-direction -m "$M" -c 512 --sweep --direction "$dir/zero.f32" --eval-file $D/eval.jsonl --scales=0,1
"$PY" - "$dir/sweep.txt" "$dir/out.txt" <<'PYEOF' || fail "sweep: $(cat "$dir/sweep.txt")"
import sys
def rows(p):
    return {float(l.split()[0]): [float(x) for x in l.split()[1:]]
            for l in open(p) if l.strip() and not l.startswith("#") and not l.split()[0] == "scale"}
a, z = rows(sys.argv[1]), rows(sys.argv[2])
assert sorted(a) == [-2, 0, 1, 2], a
assert a[0] == z[0] == z[1], (a[0], z)        # scale 0, and a zero direction: the unchanged model
for s in (-2, 1, 2):
    assert a[s] != a[0], (s, a)
for r in a.values():
    assert abs(r[2] - (r[1] - r[0])) < 2e-4, r
print("sweep ok")
PYEOF

# --- ds4 -----------------------------------------------------------------------
g() { ./ds4 -m "$M" -c 512 --nothink --temp 0 -n 24 -p "Tell me a story." "$@" 2> "$dir/err.txt" || fail "ds4 $*: $(cat "$dir/err.txt")"; }
g > "$dir/plain.txt"
g --dir-steering-file "$dir/dir.f32" --dir-steering-ffn 0 > "$dir/zero.txt"
cmp -s "$dir/plain.txt" "$dir/zero.txt" || fail "--dir-steering-ffn 0 changed the answer"
g --dir-steering-file "$dir/dir.f32" --dir-steering-ffn 8 --dir-steering-attn -4 > "$dir/on.txt"
cmp -s "$dir/plain.txt" "$dir/on.txt" && fail "steering at scales 8 / -4 did not change the answer"
for i in 1 2 3 4; do
    printf 'The quick brown fox jumps over the lazy dog while the sun shines on the quiet river bank today.\n'
done > "$dir/text.txt"
p() { ./ds4 -m "$M" -c 512 --perplexity-file "$dir/text.txt" "$@" 2>&1 | grep avg_nll || fail "perplexity $*"; }
[ "$(p)" != "$(p --dir-steering-file "$dir/dir.f32")" ] || fail "steering did not change the perplexity"
[ "$(p)" = "$(p --dir-steering-file "$dir/dir.f32" --dir-steering-ffn 0)" ] || fail "scale 0 changed the perplexity"

# the interactive /steer: shows the scales, sets them (the next turn prefills
# the whole conversation again), refuses bad values
printf 'Hello\n/steer\n/steer 2 0.5\nagain\n/steer x\n/steer 200\n' |
    ./ds4 -m "$M" -c 512 --dir-steering-file "$dir/dir.f32" --nothink --temp 0 -n 4 > "$dir/repl.txt" 2>&1 ||
    fail "repl: $(cat "$dir/repl.txt")"
grep -q "steering scales: ffn 1, attn 0" "$dir/repl.txt" && grep -q "steering scales: ffn 2, attn 0.5" "$dir/repl.txt" &&
    grep -q "/steer F \[A\]: the scales are numbers" "$dir/repl.txt" && grep -q "/steer: 200 is outside" "$dir/repl.txt" ||
    fail "/steer: $(cat "$dir/repl.txt")"
n1=$(grep -o "prefill [0-9]* tokens (0 reused)" "$dir/repl.txt" | sed -n 1p | cut -d' ' -f2)
n2=$(grep -o "prefill [0-9]* tokens (0 reused)" "$dir/repl.txt" | sed -n 2p | cut -d' ' -f2)
[ -n "$n2" ] && [ "$n2" -gt "$n1" ] || fail "/steer: the second turn did not prefill the conversation again: $(cat "$dir/repl.txt")"

# --- ds4-server ------------------------------------------------------------------
STEERING_DIR="$dir" "$PY" tests/server/steering.py || fail "server"
echo "steering: ok"
