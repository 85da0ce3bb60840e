#!/bin/sh
# apps.sh BINDIR - the CUDA builds of ds4 and ds4-server end to end (a step
# of tests/cuda/run.sh): on a tiny f16 model with the real DeepSeek V4
# tokenizer, made by BINDIR's ds4-tokenizer and ds4-mkmodel,
#   - ds4 answers a one-shot greedy prompt on the CUDA backend, saying so,
#     with the text the same binary answers on the CPU backend (--cpu);
#   - ds4-server, on each backend in turn, with two sessions and the
#     model's MTP block (the CUDA backend has one MTP sequence: the second
#     session decodes without it), answers two greedy chat completions at
#     once (HTTP, Python's standard library), each with the same message,
#     finish reason and token count;
#   - both again as a pipeline over 2 GPUs in one process (--gpus 0,1; no
#     MTP there): the same answers (skipped on a machine with one GPU).
# BINDIR is build/cuda/bin (a GPU) or build/emu/bin (the CPU emulation of
# CUDA, which runs the same logic without a GPU: `make test-cuda-emu`; it
# emulates 2 GPUs here).
# Greedy answers of 12 tokens; the model's seed has no near-tie among them
# (a tie that the backends' last-bit differences could flip would show here
# as a different token, with both answers printed).
set -eu
BIN=$(cd "${1:?usage: apps.sh BINDIR}" && pwd)
cd "$(dirname "$0")/../.."
for p in ds4 ds4-server ds4-tokenizer ds4-mkmodel; do
    [ -x "$BIN/$p" ] || { echo "apps: FAIL: $BIN/$p not built"; exit 1; }
    # a build carried to another machine needs its libraries there
    missing=$(ldd "$BIN/$p" 2>/dev/null | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' | tr '\n' ' ')
    [ -z "$missing" ] || { echo "apps: FAIL: $p needs $missing(scripts/deps.sh installs them)"; exit 1; }
done
T=$(mktemp -d)
server=""
trap '[ -z "$server" ] || kill "$server" 2>/dev/null; rm -rf "$T"' EXIT
fail() { echo "apps: FAIL: $*"; exit 1; }
export DS4_LOCK_FILE="$T/ds4.lock" # programs of this test only, one at a time

"$BIN/ds4-tokenizer" import data/tokenizer/deepseek-v4-tokenizer.json.xz "$T/tok.gguf" > /dev/null
M=$T/model.gguf
"$BIN/ds4-mkmodel" -q --preset tiny --recipe f16 --tokenizer "$T/tok.gguf" --seed 21 -o "$M" --mtp "$T/mtp.gguf"

# --- ds4: one-shot greedy answer ---------------------------------------------
oneshot() { # oneshot NAME BACKEND OPTS...: the answer into $T/NAME.txt, on BACKEND (its name in ds4's lines)
    name=$1 be=$2
    shift 2
    "$BIN/ds4" -m "$M" "$@" -c 1024 --nothink --temp 0 -n 12 -p "Write a haiku about rain." \
        > "$T/$name.txt" 2> "$T/$name.err" || fail "ds4 $* exited $?: $(cat "$T/$name.err")"
    grep -q "^ds4: backend $be;" "$T/$name.err" || fail "ds4 $* does not say it runs on $be: $(cat "$T/$name.err")"
    grep -Eq "^ds4: prefill: [0-9.]+ t/s, generation: [0-9.]+ t/s; .*generation [0-9]+ tokens" "$T/$name.err" || fail "ds4 $* has no timing line: $(cat "$T/$name.err")"
    [ -s "$T/$name.txt" ] || fail "ds4 $* printed no answer"
}
oneshot cuda cuda --cuda
oneshot cpu cpu --cpu
cmp -s "$T/cuda.txt" "$T/cpu.txt" || fail "ds4's answers differ:
  cuda: $(cat "$T/cuda.txt")
  cpu:  $(cat "$T/cpu.txt")"
echo "apps: ds4 answered on cuda as on cpu ($(wc -c < "$T/cuda.txt") bytes)"

# --- ds4-server: a chat completion -------------------------------------------
serve() { # serve NAME BACKEND OPTS...: the completion's message, finish reason and tokens into $T/NAME.json
    name=$1 be=$2
    shift 2
    "$BIN/ds4-server" -m "$M" "$@" --port 0 -c 1024 --parallel 2 > "$T/server-$name.log" 2>&1 &
    server=$!
    port=""
    start=$(date +%s)
    while [ -z "$port" ]; do
        kill -0 "$server" 2>/dev/null || fail "ds4-server $name exited: $(cat "$T/server-$name.log")"
        [ $(( $(date +%s) - start )) -lt 180 ] || fail "ds4-server $name not listening after 180 s: $(cat "$T/server-$name.log")"
        port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9][0-9]*\).*/\1/p' "$T/server-$name.log" | head -n 1)
        [ -n "$port" ] || sleep 0.2
    done
    grep -q "($be backend)" "$T/server-$name.log" || fail "ds4-server $name does not say it runs on $be: $(cat "$T/server-$name.log")"
    python3 - "$port" > "$T/$name.json" 2> "$T/$name.perr" <<'EOF' || fail "ds4-server $name: $(cat "$T/$name.perr") $(cat "$T/server-$name.log")"
import json, sys, urllib.request
body = {"model": "deepseek-v4-flash", "max_tokens": 12, "temperature": 0, "thinking": False,
        "messages": [{"role": "system", "content": "You are a helpful assistant"},
                     {"role": "user", "content": "Write a haiku about rain."}]}
import threading
def ask(out):
    req = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % sys.argv[1],
                                 json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.load(r)
    c = d["choices"][0]
    out.append(json.dumps({"message": c["message"], "finish_reason": c["finish_reason"],
                           "completion_tokens": d["usage"]["completion_tokens"]}, sort_keys=True))
    if c["finish_reason"] not in ("length", "stop", "tool_calls") or not 1 <= d["usage"]["completion_tokens"] <= 12:
        out.append("unexpected answer: %s" % json.dumps(d))
got = []
ts = [threading.Thread(target=ask, args=(got,)) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
if len(got) != 2 or got[0] != got[1]:
    sys.exit("two sessions answered differently (or not at all): %s" % got)
print(got[0])
EOF
    kill "$server"
    wait "$server" || true
    server=""
}
serve cuda cuda --cuda --mtp "$T/mtp.gguf"
serve cpu cpu --cpu --mtp "$T/mtp.gguf"
cmp -s "$T/cuda.json" "$T/cpu.json" || fail "ds4-server's answers differ:
  cuda: $(cat "$T/cuda.json")
  cpu:  $(cat "$T/cpu.json")"
echo "apps: ds4-server answered on cuda as on cpu: $(cat "$T/cuda.json")"

# --- --gpus: a pipeline over 2 GPUs in one process ---------------------------
export DS4_EMU_GPUS=2
if [ "${BIN#*/build/emu/}" = "$BIN" ] && [ "$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')" -lt 2 ]; then
    echo "apps: --gpus skipped: fewer than 2 GPUs"
    exit 0
fi
oneshot gpus cuda --gpus 0,1
grep -q "pipeline stage 1: .* GPU 1" "$T/gpus.err" || fail "ds4 --gpus 0,1 names no stage on GPU 1: $(cat "$T/gpus.err")"
cmp -s "$T/cuda.txt" "$T/gpus.txt" || fail "ds4 --gpus 0,1 answered otherwise:
  cuda:        $(cat "$T/cuda.txt")
  --gpus 0,1:  $(cat "$T/gpus.txt")"
serve gpus cuda --gpus 0,1
cmp -s "$T/cuda.json" "$T/gpus.json" || fail "ds4-server --gpus 0,1 answered otherwise:
  cuda:        $(cat "$T/cuda.json")
  --gpus 0,1:  $(cat "$T/gpus.json")"
echo "apps: ds4 and ds4-server on --gpus 0,1 answered as on one GPU"
