#!/bin/sh
# agent.sh - ds4-agent as a program, on the tiny test model
# (tests/agent/model.sh):
#  - options: help, usage errors (exit 2), ds4 options this engine lacks;
#  - a smoke run with a tool round trip end to end: the first round is
#    forced to a bash call (a random-weights model writes no DSML), the
#    command really runs, its result goes back, and the real model then
#    samples the next round greedily.  The tokens it sampled must equal a
#    fresh greedy run of ./ds4 on the same prompt tokens, so the KV the
#    agent built piece by piece (system prompt from disk, incremental
#    prefills, forced decode) is the KV of the whole transcript;
#  - sessions are the server's KV files: a session the agent saved gives
#    ds4-server --kv-disk-dir a disk hit of all its tokens for the same
#    conversation, and the agent starts from the system-prompt file the
#    server wrote (cold save) and /switch-es into the server's shutdown
#    save, prefilling nothing;
#  - --server: the same loop against a ds4-server, tool calls included,
#    through the OpenAI and the Anthropic API, sessions as JSON files.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/agent.lock}"
for p in ds4 ds4-agent ds4-server; do [ -x "./$p" ] || make -s "$p"; done
[ -x build/tests/ds4-agent-script ] || make -s build/tests/ds4-agent-script
M=$(sh tests/agent/model.sh)
A=build/tests/ds4-agent-script
dir=build/suite/agent
rm -rf "$dir"
mkdir -p "$dir"
SRV_PID=
cleanup() { [ -n "$SRV_PID" ] && kill "$SRV_PID" 2>/dev/null; true; }
trap cleanup EXIT
fail() { echo "agent: FAIL: $*" >&2; exit 1; }
script() { python3 tests/agent/mkscript.py "$@"; }
kvc() { python3 tests/agent/kvc.py "$@"; }
# the one agent-session (or given reason) file of a directory
kvfile() {
    for f in "$1"/*.kv; do [ "$(kvc reason "$f")" = "${2:-agent-session}" ] && echo "$f"; done | head -1
}
# the system prompt's KV file, prefilled once and copied into each session
# directory (test_agent shares the same cache)
syscache=build/agent-test/syscache
if ! ls "$syscache"/*.kv > /dev/null 2>&1; then
    mkdir -p "$syscache"
    ./ds4-agent -m "$M" -c 8192 --kv-dir "$syscache" < /dev/null > /dev/null 2>&1 || fail "could not make the system prompt cache"
fi
seed() { mkdir -p "$1"; cp "$syscache"/*.kv "$1/"; }

# --- options ---------------------------------------------------------------
echo "agent: options"
./ds4-agent --help > "$dir/help.txt"
for want in "--allow LIST" "--yolo" "--root DIR" "--server URL" "--api NAME" "-sys, --system TEXT" "/switch ID"; do
    grep -qF -- "$want" "$dir/help.txt" || fail "--help lacks $want"
done
usage() { # usage EXPECTED-MESSAGE ARGS...: exit status 2 with the message
    want=$1
    shift
    if ./ds4-agent "$@" < /dev/null > /dev/null 2> "$dir/err.txt"; then fail "ds4-agent $* succeeded"; else rc=$?; fi
    [ "$rc" = 2 ] || fail "ds4-agent $*: exit $rc, want 2"
    grep -qF -- "$want" "$dir/err.txt" || fail "ds4-agent $*: $(cat "$dir/err.txt")"
}
usage "mtp.gguf" --mtp mtp.gguf
usage "--mtp-draft" --mtp-draft 17
usage "unknown option" --bogus
usage "only with --server URL" --api anthropic
usage "must be an integer in 1024..1048576" -c 10
usage "must be a comma list of bash, write, edit" --allow rm
usage "must be an http:// or https:// URL" --server localhost:8000
usage "runs no local model" --server http://127.0.0.1:1 --cpu
if ./ds4-agent -m "$dir/missing.gguf" --kv-dir "$dir/kv0" < /dev/null > /dev/null 2> "$dir/err.txt"; then
    fail "a missing model started"
fi
grep -q "missing.gguf" "$dir/err.txt" || fail "missing model: $(cat "$dir/err.txt")"

# --- smoke: a tool round trip, the real model continuing --------------------
echo "agent: smoke: a tool round trip, the real model continuing"
mkdir -p "$dir/root"
seed "$dir/kv"
script "$dir/smoke.json" "call:bash:command=echo smoke-ok > smoke.txt; cat smoke.txt" free
printf 'run the smoke test\n/save\n' | $A --script "$dir/smoke.json" -m "$M" -c 8192 -n 64 --temp 0 --nothink \
    --allow bash --kv-dir "$dir/kv" --root "$dir/root" --trace "$dir/trace.txt" > "$dir/smoke.out" 2> "$dir/smoke.err" ||
    fail "smoke run: $(cat "$dir/smoke.err")"
[ "$(cat "$dir/root/smoke.txt")" = smoke-ok ] || fail "the bash call did not run"
grep -q '^smoke-ok$' "$dir/smoke.out" || fail "the command's output was not shown: $(cat "$dir/smoke.out")"
grep -q 'saved session' "$dir/smoke.out" || fail "no save: $(cat "$dir/smoke.out")"
for want in 'sync: transcript [0-9]+ tokens, live [0-9]+, prefill [0-9]+' 'token [0-9]+: "' 'call: "bash"' \
    'tool bash \{"command":"echo smoke-ok' 'result: "bash job=1' 'generated 64 tokens in' 'saved [0-9a-f]{40}\.kv'; do
    grep -Eq "^\[[0-9:.]{12}\] $want" "$dir/trace.txt" || fail "--trace lacks '$want'"
done
S=$(kvfile "$dir/kv")
[ -n "$S" ] || fail "no session file in $dir/kv"
kvc text "$S" > "$dir/smoke.txt"
python3 - "$dir" <<'EOF' || fail "smoke transcript"
import sys
d = sys.argv[1]
t = open(d + "/smoke.txt", encoding="utf-8", errors="surrogateescape").read()
mark = "</tool_result><｜Assistant｜></think>"
assert "<｜User｜>run the smoke test<｜Assistant｜></think>Calling a tool." in t, t[-2000:]
assert "<｜User｜><tool_result>bash job=1 pid=" in t and "exit_status=0" in t and "smoke-ok" in t, t[-2000:]
assert t.count(mark) == 1 and t.endswith("<｜end▁of▁sentence｜>"), t[-500:]
open(d + "/prefix.txt", "w", encoding="utf-8", errors="surrogateescape").write(t[: t.index(mark) + len(mark)])
EOF
# the same prompt tokens through ./ds4, fresh: the same greedy tokens
./ds4 -m "$M" -c 8192 --dump-tokens --prompt-file "$dir/prefix.txt" 2> /dev/null | cut -f1 > "$dir/prefix.ids"
./ds4 -m "$M" -c 8192 --temp 0 -n 64 --prompt-file "$dir/prefix.txt" --dump-logprobs "$dir/lp.json" \
    --logprobs-top-k 1 > /dev/null 2>&1
kvc ids "$S" > "$dir/session.ids"
python3 - "$dir" <<'EOF' || fail "the agent's free round differs from ./ds4 on the same tokens"
import json, sys
d = sys.argv[1]
prefix = [int(x) for x in open(d + "/prefix.ids").read().split()]
ids = [int(x) for x in open(d + "/session.ids").read().split()]
steps = [s["selected"]["id"] for s in json.load(open(d + "/lp.json"))["steps"]]
assert ids[: len(prefix)] == prefix, "the prompt tokens differ"
free = ids[len(prefix):]
# the agent closed the round with the end token when it stopped at -n
if len(free) > len(steps) or free[-1] != steps[len(free) - 1]:
    free = free[:-1]
assert len(free) >= 1 and free == steps[: len(free)], (free, steps)
print("agent: smoke: %d free tokens equal ./ds4's greedy tokens" % len(free))
EOF

# --- the agent's session, reused by ds4-server ------------------------------
echo "agent: the agent's session, reused by ds4-server"
start_server() { # start_server KVDIR [EXTRA...]: sets SRV_PID and URL
    kvd=$1
    shift
    ./ds4-server -m "$M" -c 8192 --port 0 --kv-disk-dir "$kvd" "$@" 2> "$dir/server.err" &
    SRV_PID=$!
    n=150
    while ! grep -q "listening on" "$dir/server.err" 2>/dev/null; do
        sleep 0.1
        n=$((n - 1))
        [ "$n" -gt 0 ] && kill -0 "$SRV_PID" 2>/dev/null || fail "ds4-server did not start: $(cat "$dir/server.err")"
    done
    # the line may still be being written: ask the server until it answers
    n=50
    until URL=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$dir/server.err" | head -1) &&
        python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + '/health', timeout=5)" "$URL" 2> /dev/null; do
        sleep 0.1
        n=$((n - 1))
        [ "$n" -gt 0 ] || fail "ds4-server does not answer: $(cat "$dir/server.err")"
    done
}
stop_server() {
    kill "$SRV_PID"
    wait "$SRV_PID" || true
    SRV_PID=
}
seed "$dir/kvA"
script "$dir/a.json" "say:Hi there."
printf 'hello\n/save\n' | $A --script "$dir/a.json" -m "$M" -c 8192 --nothink --kv-dir "$dir/kvA" \
    --root "$dir/root" > "$dir/a.out" 2>&1 || fail "agent run: $(cat "$dir/a.out")"
SA=$(kvfile "$dir/kvA")
tokens=$(kvc tokens "$SA")
start_server "$dir/kvA"
cached=$(python3 tests/agent/chat.py "$URL" "$SA" - '{"role":"user","content":"hello"}' \
    '{"role":"assistant","content":"Hi there."}' '{"role":"user","content":"and now?"}')
stop_server
[ "$cached" = "$tokens" ] || fail "ds4-server reused $cached tokens of the agent's $tokens-token session"

# --- the server's files, used by the agent ----------------------------------
echo "agent: the server's files, used by the agent"
mkdir -p "$dir/kvB"
printf '{"hi": "Hello from the server.<｜end▁of▁sentence｜>"}' > "$dir/forced.json"
start_server "$dir/kvB" --test-force-output "$dir/forced.json"
python3 tests/agent/chat.py "$URL" "$SA" hi '{"role":"user","content":"hello server"}' > /dev/null
stop_server # saves the live session (reason shutdown)
[ -n "$(kvfile "$dir/kvB" cold)" ] || fail "the server wrote no cold save: $(ls "$dir/kvB")"
[ -n "$(kvfile "$dir/kvB" shutdown)" ] || fail "the server wrote no shutdown save: $(ls "$dir/kvB")"
script "$dir/b.json"
printf '/list\n' | $A --script "$dir/b.json" -m "$M" -c 8192 --nothink --kv-dir "$dir/kvB" --root "$dir/root" \
    > "$dir/b.out" 2>&1 || fail "agent on the server's files: $(cat "$dir/b.out")"
grep -q "system prompt: [0-9]* tokens from the cache, nothing prefilled" "$dir/b.out" ||
    fail "the server's cold save of the system prompt was not used: $(cat "$dir/b.out")"
grep -q "hello server  \[server shutdown\]" "$dir/b.out" || fail "/list: $(cat "$dir/b.out")"
id=$(grep "hello server" "$dir/b.out" | cut -c1-8)
printf '/switch %s\nthanks\n' "$id" | $A --script "$dir/a.json" -m "$M" -c 8192 --nothink --kv-dir "$dir/kvB" \
    --root "$dir/root" > "$dir/b2.out" 2>&1 || fail "switch: $(cat "$dir/b2.out")"
grep -q "switched to $id: [0-9]* tokens in [0-9.]* s, nothing prefilled" "$dir/b2.out" || fail "$(cat "$dir/b2.out")"
grep -q "Hello from the server." "$dir/b2.out" || fail "no history after the switch: $(cat "$dir/b2.out")"
grep -q "Hi there." "$dir/b2.out" || fail "no answer after the switch: $(cat "$dir/b2.out")"

# --- --server: the loop against ds4-server ----------------------------------
echo "agent: --server: the loop against ds4-server"
python3 - "$dir/forced2.json" <<'EOF'
import json, sys
call = ('Running it.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="bash">\n'
        '<｜DSML｜parameter name="command" string="true">echo remote-$API > remote-$API.txt</｜DSML｜parameter>\n'
        '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
json.dump({"call": call, "done": "Remote done.<｜end▁of▁sentence｜>"}, open(sys.argv[1], "w"), ensure_ascii=False)
EOF
mkdir -p "$dir/kvS"
start_server "$dir/kvS" --test-force-output "$dir/forced2.json"
for api in openai anthropic; do
    mkdir -p "$dir/remote-$api"
    script "$dir/r.json" name:call name:done
    printf 'do it\n/save\n/list\n' | API=$api $A --script "$dir/r.json" --server "$URL" --api $api --nothink -n 64 \
        --allow bash --kv-dir "$dir/remote-$api" --root "$dir/root" > "$dir/r-$api.out" 2>&1 ||
        fail "--server --api $api: $(cat "$dir/r-$api.out")"
    [ "$(cat "$dir/root/remote-$api.txt" 2>/dev/null)" = "remote-$api" ] || fail "--api $api: the tool did not run: $(cat "$dir/r-$api.out")"
    grep -q "Remote done." "$dir/r-$api.out" || fail "--api $api: no answer after the tool: $(cat "$dir/r-$api.out")"
    grep -q "do it" "$dir/r-$api.out" || fail "--api $api: /list: $(cat "$dir/r-$api.out")"
    ls "$dir/remote-$api"/*.json > /dev/null 2>&1 || fail "--api $api: no session file"
done
stop_server
echo "agent: ok"
