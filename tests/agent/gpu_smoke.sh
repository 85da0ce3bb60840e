#!/bin/sh
# gpu_smoke.sh - ds4-agent on the CUDA backend (needs `make cuda` and a GPU;
# not part of `make test`):
#  - on the tiny test model: the system prompt prefilled on the GPU and
#    saved, loaded again by a second start (device -> host snapshot, host
#    -> device restore), a session saved and resumed with /switch with
#    nothing prefilled, then a turn after it;
#  - with DS4_AGENT_MODEL=/path/to/ds4flash.gguf, also the real model asked
#    to use a tool: the trace must show a tool call the model wrote itself.
# Usage: sh tests/agent/gpu_smoke.sh
set -eu
cd "$(dirname "$0")/../.."
A=build/cuda/bin/ds4-agent
[ -x "$A" ] || { echo "gpu_smoke: build it first: make cuda"; exit 2; }
M=$(sh tests/agent/model.sh)
dir=build/agent-gpu
rm -rf "$dir"
mkdir -p "$dir/kv" "$dir/root"
fail() { echo "gpu_smoke: FAIL: $*" >&2; exit 1; }
run() { "$A" --cuda -c 8192 --nothink --temp 0 -n 16 --kv-dir "$dir/kv" --root "$dir/root" "$@"; }

printf 'hello\n/save\n' | run -m "$M" > "$dir/1.out" 2>&1 || fail "first run: $(cat "$dir/1.out")"
grep -q "system prompt: prefilling" "$dir/1.out" || fail "no system prompt prefill: $(cat "$dir/1.out")"
id=$(sed -n 's/.*saved session \([0-9a-f]\{8\}\).*/\1/p' "$dir/1.out")
[ -n "$id" ] || fail "no save: $(cat "$dir/1.out")"
printf '/switch %s\nagain\n' "$id" | run -m "$M" > "$dir/2.out" 2>&1 || fail "second run: $(cat "$dir/2.out")"
grep -q "tokens from the cache, nothing prefilled" "$dir/2.out" || fail "system prompt not loaded: $(cat "$dir/2.out")"
grep -q "switched to $id: .* nothing prefilled" "$dir/2.out" || fail "switch: $(cat "$dir/2.out")"
grep -q "tokens generated" "$dir/2.out" || fail "no turn after the switch: $(cat "$dir/2.out")"
echo "gpu_smoke: tiny model ok"

if [ -n "${DS4_AGENT_MODEL:-}" ]; then
    printf 'one\ntwo\n' > "$dir/root/notes.txt"
    echo "How many lines does notes.txt have? Read it with the read tool, then answer with the number." |
        "$A" --cuda -m "$DS4_AGENT_MODEL" -c 32768 --temp 0 -n 2000 --yolo --kv-dir "$dir/kv-real" --root "$dir/root" \
            --trace "$dir/real.trace" > "$dir/real.out" 2>&1 || fail "real model: $(tail -20 "$dir/real.out")"
    grep -q 'call: "read"' "$dir/real.trace" || fail "the model called no read tool: $(tail -20 "$dir/real.out")"
    grep -q 'result: "notes.txt: lines 1-2 of 2' "$dir/real.trace" || fail "no read result: $(tail -20 "$dir/real.out")"
    echo "gpu_smoke: real model ok ($(grep -c '^\[.*\] call: ' "$dir/real.trace") tool calls)"
fi
