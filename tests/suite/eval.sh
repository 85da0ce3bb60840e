#!/bin/sh
# eval.sh - ds4-eval end to end (docs/EVAL.md) with scripted replies
# (build/tests/ds4-eval-script: each reply's tokens forced through a tiny
# random model with the real tokenizer, so rendering, prefill, generation,
# the budget controls, grading, UI and report all run):
#   - the shipped set, every answer right but two: 19 of 21 pass, the report
#     and its JSON say which and why (several Answer: lines: the last
#     counts; thousands separators);
#   - the hard reply budget closes a long thinking with </think> so that the
#     answer still comes; without it the thinking runs to the token limit;
#   - Ctrl+C in the plain mode stops the question and prints the report;
#   - a question larger than the context is skipped with the reason, the
#     others run;
#   - a malformed question file names the line and the field;
#   - --compare names the questions that flipped;
#   - the split-screen UI in tmux: the list, the stream, p pauses, Enter
#     runs the selected question next, q ends the run with the report.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/eval.lock}"
for p in ds4-eval ds4-mkmodel ds4-tokenizer; do [ -x "./$p" ] || make -s "$p"; done
[ -x build/tests/ds4-eval-script ] || make -s build/tests/ds4-eval-script
E=$PWD/build/tests/ds4-eval-script
dir=$PWD/build/suite/eval
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "eval: FAIL: $*" >&2; exit 1; }
tok=$(suite_tokenizer)
M=$dir/model.gguf
./ds4-mkmodel --preset tiny --recipe f16 --tokenizer "$tok" --seed 11 -q -o "$M"
SET=data/eval/ds4-eval-basic.jsonl

# script NAME [ID=TEXT...]: every question of the set answered right, then
# the given replacements
script() {
    out=$1; shift
    python3 - "$SET" "$out" "$@" <<'PYEOF'
import json, sys
s = {}
for l in open(sys.argv[1]):
    if l.startswith("#") or not l.strip():
        continue
    q = json.loads(l)
    a = q["answer"]
    a = ", ".join(map(str, a)) if isinstance(a, list) else a
    s[q["id"]] = "<think>Let me work it out.</think>\n\nSo:\nAnswer: %s" % a
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    s[k] = v
json.dump(s, open(sys.argv[2], "w"), ensure_ascii=False)
PYEOF
}

# --- the shipped set ------------------------------------------------------------
script "$dir/a.json" "arith-02=<think>sum</think>Answer: 31,375" \
    "sci-01=<think>hmm</think>Answer: C\nActually no.\nAnswer: B" \
    "vuln-02=<think>the loop</think>Answer: 3" "code-04=<think>x</think>I am not sure."
"$E" "$dir/a.json" -m "$M" --plain --json "$dir/ra.json" --trace "$dir/trace.txt" $SET > "$dir/out.txt" 2> "$dir/err.txt" ||
    fail "run: $(cat "$dir/err.txt")"
grep -q "total: 19/21 passed" "$dir/out.txt" || fail "totals: $(tail -3 "$dir/out.txt")"
grep -q "^\[17/21\] sci-01 failed: answer B, correct C" "$dir/out.txt" || fail "sci-01: $(cat "$dir/out.txt")"
python3 - "$dir/ra.json" <<'PYEOF' || fail "report JSON"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["format"] == "ds4-eval-report-v1"
q = {x["id"]: x for x in r["questions"]}
assert r["totals"]["passed"] == 19 and r["totals"]["failed"] == 2 and r["totals"]["questions"] == 21, r["totals"]
assert q["arith-02"]["result"] == "passed" and q["arith-02"]["answer"] == "31375", q["arith-02"]
assert q["sci-01"]["why"] == "letter B, expected C", q["sci-01"]
assert q["vuln-02"]["why"] == "lines 3, an accepted equivalent", q["vuln-02"]
assert q["code-04"]["answer"] == "(no Answer: line)", q["code-04"]
assert all(x["prompt_tokens"] > 0 and x["gen_tokens"] > 0 for x in r["questions"])
print("report ok")
PYEOF
grep -q "^=== vuln-01 (C vulnerability localisation)" "$dir/trace.txt" || fail "trace: $(head "$dir/trace.txt")"
grep -q "^--- failed: letter B, expected C" "$dir/trace.txt" || fail "trace decision"

# --- the budget controls ---------------------------------------------------------
long="<think>$(python3 -c 'print(" ".join(["step"] * 200))')</think>Answer: 4"
printf '{"id": "b1", "kind": "integer", "question": "What is 2 + 2?", "answer": 4}\n' > "$dir/b.jsonl"
python3 -c 'import json, sys; json.dump({"b1": sys.argv[1]}, open(sys.argv[2], "w"))' "$long" "$dir/b.json"
"$E" "$dir/b.json" -m "$M" --plain -n 60 --hard-limit-reply-budget 16 --soft-limit-reply-budget 16 \
    --json "$dir/rb.json" --trace "$dir/tb.txt" "$dir/b.jsonl" > "$dir/out.txt" 2> "$dir/err.txt" || fail "budget: $(cat "$dir/err.txt")"
grep -q "b1 passed: answer 4" "$dir/out.txt" || fail "hard budget: $(cat "$dir/out.txt") $(cat "$dir/tb.txt")"
grep -q "reply (4[4-9] tokens)\|reply ([5-9][0-9] tokens)" "$dir/tb.txt" && ! grep -q "step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step step" "$dir/tb.txt" ||
    fail "the thinking was not cut at the budget: $(cat "$dir/tb.txt")"
"$E" "$dir/b.json" -m "$M" --plain -n 60 --hard-limit-reply-budget 0 --soft-limit-reply-budget 0 \
    "$dir/b.jsonl" > "$dir/out.txt" 2> "$dir/err.txt" || fail "no budget: $(cat "$dir/err.txt")"
grep -q "b1 failed: answer (no Answer: line)" "$dir/out.txt" || fail "without a budget: $(cat "$dir/out.txt")"

# --- Ctrl+C in the plain mode: the question stops, the report follows (status 130)
python3 -c 'import json, sys; json.dump({"b1": "<think>" + " ".join(["step"] * 4000) + "</think>Answer: 4"}, open(sys.argv[1], "w"))' "$dir/long.json"
"$E" "$dir/long.json" -m "$M" --plain -n 6000 --hard-limit-reply-budget 16 --json "$dir/ri.json" "$dir/b.jsonl" \
    > "$dir/out.txt" 2> "$dir/err.txt" &
pid=$!
sleep 3
kill -INT $pid
set +e
wait $pid
rc=$?
set -e
[ $rc -eq 130 ] || fail "Ctrl+C: status $rc: $(cat "$dir/err.txt")"
grep -q "total: 0/1 passed .*1 stopped" "$dir/out.txt" || fail "Ctrl+C report: $(cat "$dir/out.txt")"
grep -q '"result": "stopped"' "$dir/ri.json" || fail "Ctrl+C JSON"

# --- a question larger than the context --------------------------------------------
big=$(python3 -c 'print(" ".join(["word"] * 400))')
printf '{"id": "small", "question": "1 + 1?", "answer": 2}\n{"id": "big", "question": "%s", "answer": 1}\n' "$big" > "$dir/c.jsonl"
python3 -c 'import json; json.dump({"small": "<think>x</think>Answer: 2", "big": "Answer: 1"}, open("'"$dir"'/c.json", "w"))'
"$E" "$dir/c.json" -m "$M" --plain -c 128 -n 32 --hard-limit-reply-budget 8 --json "$dir/rc.json" "$dir/c.jsonl" \
    > "$dir/out.txt" 2> "$dir/err.txt" || fail "context: $(cat "$dir/err.txt")"
grep -q "big skipped: the prompt's 4[0-9][0-9] tokens do not fit the context of 128" "$dir/out.txt" ||
    fail "skip: $(cat "$dir/out.txt")"
grep -q "small passed" "$dir/out.txt" || fail "the other question: $(cat "$dir/out.txt")"
grep -q "total: 1/2 passed (100.0% of 1 graded), 1 skipped" "$dir/out.txt" || fail "totals: $(cat "$dir/out.txt")"

# --- malformed files ------------------------------------------------------------------
printf '{"id": "ok", "question": "q", "answer": 1}\n{"id": "x", "kind": "choice", "question": "q", "choices": ["a", "b"], "answer": "Z"}\n' > "$dir/bad.jsonl"
set +e
"$E" "$dir/a.json" -m "$M" --plain "$dir/bad.jsonl" > /dev/null 2> "$dir/err.txt"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q 'bad.jsonl:2: field "answer" must be the letter of one of the choices' "$dir/err.txt" ||
    fail "malformed file: $rc $(cat "$dir/err.txt")"
set +e
./ds4-eval -m "$M" --hard-limit-reply-budget 100 -n 50 $SET > /dev/null 2> "$dir/err.txt"; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "must be below --tokens" "$dir/err.txt" || fail "budget check: $rc $(cat "$dir/err.txt")"

# --- --compare -------------------------------------------------------------------------
script "$dir/b2.json" "arith-01=<think>x</think>Answer: 10064" "sci-01=<think>x</think>Answer: C"
"$E" "$dir/b2.json" -m "$M" --plain --json "$dir/rb2.json" $SET > /dev/null 2> "$dir/err.txt" || fail "run B"
./ds4-eval --compare "$dir/ra.json" "$dir/rb2.json" > "$dir/cmp.txt" || fail "compare"
grep -q "^passed -> failed  arith-01: passed -> failed (answer 10063 -> 10064, correct 10063)" "$dir/cmp.txt" ||
    fail "compare: $(cat "$dir/cmp.txt")"
grep -q "^failed -> passed  sci-01: failed -> passed" "$dir/cmp.txt" &&
    grep -q "^failed -> passed  code-04: failed -> passed" "$dir/cmp.txt" || fail "compare: $(cat "$dir/cmp.txt")"
[ "$(grep -c -- "->" "$dir/cmp.txt")" -eq 3 ] || fail "compare lists unchanged questions: $(cat "$dir/cmp.txt")"
grep -q "19/21 passed; B .*: 20/21 passed; 1 lost, 2 gained" "$dir/cmp.txt" || fail "compare totals: $(cat "$dir/cmp.txt")"
set +e
./ds4-eval --compare "$dir/ra.json" "$dir/a.json" > /dev/null 2> "$dir/err.txt"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "not a ds4-eval report" "$dir/err.txt" || fail "compare of a non-report: $rc"

# --- the split-screen UI ------------------------------------------------------------------
if ! command -v tmux >/dev/null 2>&1; then
    echo "eval: the UI part needs tmux (apt-get install tmux); the rest passed"
    skip "tmux is not installed"
fi
head -5 $SET > "$dir/t.jsonl" # the comment line and four questions
S=ds4-eval-tui-$$
T="tmux -S $dir/tmux.sock"
cleanup() { $T kill-server 2>/dev/null || true; }
trap cleanup EXIT
cap() { $T capture-pane -t "$S" -p; }
wait_for() {
    n=${2:-200}
    while [ "$n" -gt 0 ]; do
        cap | grep -Eq "$1" && return 0
        sleep 0.1
        n=$((n - 1))
    done
    echo "--- screen:" >&2
    cap >&2
    fail "no '$1' on the screen"
}
$T new-session -d -s "$S" -x 120 -y 30 \
    "$E $dir/a.json -m $M --pause-ms 5000 --json $dir/rt.json --trace $dir/tt.txt $dir/t.jsonl; echo EXIT=\$?; sleep 60"
wait_for "ds4-eval .*run"
# after the first result (5 s of pause): pause, select the third question,
# run it next, resume
wait_for "arith-01 \(passed\)"
$T send-keys -t "$S" p
wait_for "PAUSED"
cap | grep -q "Answer: 10063" || fail "the stream pane does not show the reply: $(cap)"
$T send-keys -t "$S" Down Down Enter
sleep 0.5
$T send-keys -t "$S" p
wait_for "arith-03 \(passed\)"
$T send-keys -t "$S" q
wait_for "EXIT=0"
# q between questions: the ones not reached are reported as not run
cap | grep -q "total: 2/4 passed (100.0% of 2 graded), 2 not run" || fail "report after q: $(cap)"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); q = {x["id"]: x["result"] for x in r["questions"]};
assert q == {"arith-01": "passed", "arith-02": "pending", "arith-03": "passed", "arith-04": "pending"}, q' \
    "$dir/rt.json" || fail "UI report JSON"
grep "^=== " "$dir/tt.txt" | head -2 | tr '\n' ' ' | grep -q "=== arith-01 .*=== arith-03" ||
    fail "Enter did not run the selected question next: $(grep '^=== ' "$dir/tt.txt")"
echo "eval: ok"
