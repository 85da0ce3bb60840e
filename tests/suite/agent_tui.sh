#!/bin/sh
# agent_tui.sh - ds4-agent's terminal UI driven through tmux (send-keys,
# paste-buffer, capture-pane) with a scripted model on the tiny test model:
# the pinned status footer, the prefill progress bar (a bracketed paste long
# enough to cross a prefill chunk), a permission prompt answered with a key,
# a prompt queued while a bash job runs (shown above the footer, taken back
# with Ctrl+X, sent again, ESC interrupting the job's wait so it runs next),
# /save, /new, /switch completed with Tab, and Ctrl+D leaving.
# Exits 77 (SKIP) when tmux is not installed.
set -eu
cd "$(dirname "$0")/../.."
if ! command -v tmux >/dev/null 2>&1; then
    echo "agent_tui: SKIP: tmux is not installed (apt-get install tmux)"
    exit 77
fi
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/agent_tui.lock}"
[ -x build/tests/ds4-agent-script ] || make -s build/tests/ds4-agent-script
M=$(sh tests/agent/model.sh)
dir=$PWD/build/suite/agent_tui
rm -rf "$dir"
mkdir -p "$dir/root" "$dir/kv"
cp build/agent-test/syscache/*.kv "$dir/kv/" 2>/dev/null || true
printf 'one\ntwo\n' > "$dir/root/a.txt"
python3 tests/agent/mkscript.py "$dir/script.json" \
    "call:write:path=x.txt:content=hi" "say:Declined, fine." \
    "call:bash:command=sleep 4; echo slept:refresh_sec=#20" "say:Got the queued text."

S=ds4-agent-tui-$$
SOCK="$dir/tmux.sock"
T="tmux -S $SOCK"
cleanup() { $T kill-server 2>/dev/null || true; }
trap cleanup EXIT
fail() {
    echo "agent_tui: FAIL: $*" >&2
    echo "--- screen:" >&2
    $T capture-pane -t "$S" -p >&2 || true
    exit 1
}
cap() { $T capture-pane -t "$S" -p; }
# wait_for REGEX [tenths of a second]
wait_for() {
    n=${2:-150}
    while [ "$n" -gt 0 ]; do
        cap | grep -Eq "$1" && return 0
        sleep 0.1
        n=$((n - 1))
    done
    fail "no '$1' on the screen"
}

$T -f /dev/null new-session -d -s "$S" -x 100 -y 30 \
    "cd '$dir' && DS4_LOCK_FILE='$DS4_LOCK_FILE' '$PWD/build/tests/ds4-agent-script' --script script.json -m '$PWD/$M' \
     -c 16384 --kv-dir kv --root root --nothink --allow bash 2> stderr.txt; echo \"exit status \$?\" > status.txt; sleep 60"

# the footer pinned at the bottom, idle once the system prompt is loaded
wait_for 'ctx 1\.7k/16\.4k \| idle'
[ "$(cap | grep -n 'ctx 1.7k/16.4k | idle' | cut -d: -f1)" -ge 27 ] || fail "the footer is not at the bottom"
cap | grep -q 'bash/write/edit: some allowed' || fail "no banner"

# a long bracketed paste: a placeholder in the line, the whole text sent
python3 -c "print('\n'.join('pasted line %d with some words in it to fill the context' % i for i in range(60)))" \
    > "$dir/paste.txt"
$T load-buffer "$dir/paste.txt"
$T paste-buffer -p -t "$S"
wait_for '\[paste #1: 6[01] lines\]'
$T send-keys -t "$S" Enter
# the prefill crosses the 2048-token chunk boundary: a partial progress bar
wait_for 'prefill \[▶+·+\] [1-9][0-9]*/[0-9]+ [0-9.]+%' 300
# the write needs permission: the question on the footer, answered "n"
wait_for 'allow write: create x.txt \(2 bytes\)\? \[y\]es / \[n\]o / \[a\]lways'
$T send-keys -t "$S" n
wait_for 'Declined, fine\.'
[ ! -e "$dir/root/x.txt" ] || fail "the declined write happened"
cap | grep -Eq '\[\.\.\. 5[45] more lines' || fail "the long prompt was not shortened in the echo"

# a prompt queued while a bash job runs
$T send-keys -t "$S" 'run the job' Enter
wait_for 'bash job 1 running'
$T send-keys -t "$S" 'queued text' Enter
wait_for 'queued: queued text'
wait_for '\| 1 queued'
$T send-keys -t "$S" C-x
wait_for '› queued text'
cap | grep -q 'queued: queued text' && fail "Ctrl+X left the prompt in the queue"
$T send-keys -t "$S" Enter
wait_for 'queued: queued text'
$T send-keys -t "$S" Escape
wait_for 'Got the queued text\.' 100
cap | grep -q 'bash job=1 pid=[0-9]* status=running' || fail "ESC did not cut the job's wait short"

# sessions: save, new, switch back with Tab completion
$T send-keys -t "$S" '/save' Enter
wait_for 'saved session [0-9a-f]{8}'
id=$(cap | sed -n 's/.*saved session \([0-9a-f]\{8\}\).*/\1/p' | tail -1)
$T send-keys -t "$S" '/new' Enter
wait_for 'new session'
$T send-keys -t "$S" '/switch ' Tab
wait_for "› /switch $id"
$T send-keys -t "$S" Enter
wait_for "switched to $id: [0-9]+ tokens in [0-9.]+ s, nothing prefilled"
wait_for '› queued text'

# Ctrl+D leaves (nothing changed since the switch: no question)
$T send-keys -t "$S" C-d
n=100
while [ ! -s "$dir/status.txt" ] && [ "$n" -gt 0 ]; do sleep 0.1; n=$((n - 1)); done
grep -q 'exit status 0' "$dir/status.txt" 2>/dev/null || fail "did not exit cleanly: $(cat "$dir/status.txt" "$dir/stderr.txt" 2>/dev/null)"
echo "agent_tui: ok"
