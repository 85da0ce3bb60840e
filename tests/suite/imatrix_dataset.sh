#!/bin/sh
# imatrix_dataset.sh - ds4-imatrix-dataset: conversations (with tool calls),
# code and text rendered in both modes through the chat template, duplicates
# dropped, the manifest's counts, bad records named by line and field, and
# the result read by `ds4 --imatrix-dataset` on a tiny model.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/imatrix_dataset.lock}"
for p in ds4 ds4-mkmodel ds4-imatrix-dataset; do [ -x "./$p" ] || make -s "$p"; done
dir=build/suite/imatrix_dataset
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "imatrix_dataset: FAIL: $*" >&2; exit 1; }

cat > "$dir/conv.jsonl" <<'J'
{"category": "chat", "source": "t", "license": "CC0-1.0", "messages": [{"role": "user", "content": "Name a prime."}]}

{"category": "agent", "messages": [{"role": "user", "content": "List the files."}, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{\"command\": \"ls\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "a.c\nb.c"}], "tools": [{"type": "function", "function": {"name": "run", "description": "Run a command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]}
{"category": "chat", "source": "t", "license": "CC0-1.0", "messages": [{"role": "user", "content": "Name a prime."}]}
J
printf 'int add(int a, int b) {\n    return a + b;\n}\n' > "$dir/add.c"
printf 'The harbour filled with lanterns.\nThe keeper counted the ships.\n' > "$dir/notes.txt"
./ds4-imatrix-dataset -o "$dir/out" --license MIT "$dir/conv.jsonl" "$dir/add.c" "$dir/notes.txt" 2> "$dir/err.txt" \
    || fail "build: $(cat "$dir/err.txt")"
grep -q "8 prompts from 3 inputs (2 duplicates dropped)" "$dir/err.txt" || fail "summary: $(cat "$dir/err.txt")"
python3 - "$dir/out" <<'P' || fail "the dataset's contents"
import json, sys
d = sys.argv[1]
def prompts(name):
    t = open(d + "/" + name, encoding="utf-8").read()
    out = []
    for p in t.split("\n\n===== DS4_IMATRIX_PROMPT ")[1:]:
        head, _, body = p.partition(" =====\n")
        rid, cat, mode, src = head.split(" ")
        out.append((cat, mode, src, body))
    return out
allp = prompts("rendered_prompts.txt")
assert len(allp) == 8, len(allp)
assert [p[:2] for p in prompts("rendered_prompts_think.txt")] == [p[:2] for p in allp if p[1] == "think"]
assert len(prompts("rendered_prompts_nothink.txt")) == 4
BOS = "<｜begin▁of▁sentence｜>"
for cat, mode, src, body in allp:
    assert body.startswith(BOS), body[:40]
    end = "<｜Assistant｜><think>" if mode == "think" else "<｜Assistant｜></think>"
    assert body.endswith(end), (mode, body[-40:])
chat = [b for c, m, s, b in allp if c == "chat" and m == "nothink"]
assert chat == [BOS + "<｜User｜>Name a prime.<｜Assistant｜></think>"], chat
agent = [b for c, m, s, b in allp if c == "agent"]
assert all("<｜DSML｜invoke name=\"run\">" in b and "a.c\nb.c" in b and "Run a command" in b for b in agent), agent[0]
src = [b for c, m, s, b in allp if c == "source"]
assert len(src) == 2 and all("File: " in b and "```c\nint add(int a, int b) {" in b for b in src), src[0][-200:]
assert len([1 for c, m, s, b in allp if c == "text" and "The harbour filled with lanterns." in b]) == 2
m = json.load(open(d + "/manifest.json"))
assert m["record_count"] == 8 and m["duplicates_dropped"] == 2, m
assert m["categories"] == {"chat": 2, "agent": 2, "source": 2, "text": 2}, m["categories"]
assert m["modes"] == {"nothink": 4, "think": 4}, m["modes"]
assert m["rendered_utf8_bytes"] == sum(len(b.encode()) for c, mo, s, b in allp)
lic = {s["license"] for s in m["sources"]}
assert lic == {"CC0-1.0", "MIT"}, lic
P
# --modes, --chunk-bytes: one mode, a text cut at line ends
./ds4-imatrix-dataset -o "$dir/one" --modes think --chunk-bytes 256 "$dir/conv.jsonl" 2>/dev/null || fail "--modes think"
[ "$(grep -c 'DS4_IMATRIX_PROMPT' "$dir/one/rendered_prompts.txt")" -eq 2 ] || fail "--modes think kept other modes"
[ ! -s "$dir/one/rendered_prompts_nothink.txt" ] || fail "--modes think wrote non-thinking prompts"

# bad records: named by line and field, nothing written
printf '{"messages": [{"role": "user", "content": "ok"}]}\n{"messages": [' > "$dir/bad.jsonl"
if ./ds4-imatrix-dataset -o "$dir/bad" "$dir/bad.jsonl" 2> "$dir/err.txt"; then fail "a truncated line was taken"; fi
grep -q "bad.jsonl:2: not valid JSON" "$dir/err.txt" || fail "bad JSON message: $(cat "$dir/err.txt")"
[ ! -e "$dir/bad/rendered_prompts.txt" ] || fail "a failed build wrote prompts"
printf '{"msgs": []}\n' > "$dir/bad2.jsonl"
if ./ds4-imatrix-dataset -o "$dir/bad" "$dir/bad2.jsonl" 2> "$dir/err.txt"; then fail "a record without messages was taken"; fi
grep -q 'bad2.jsonl:1: "messages": a non-empty array is needed' "$dir/err.txt" || fail "field message: $(cat "$dir/err.txt")"
printf '{"messages": [{"role": "wizard", "content": "x"}]}\n' > "$dir/bad3.jsonl"
if ./ds4-imatrix-dataset -o "$dir/bad" "$dir/bad3.jsonl" 2> "$dir/err.txt"; then fail "an unknown role was taken"; fi
grep -q "bad3.jsonl:1" "$dir/err.txt" || fail "role message: $(cat "$dir/err.txt")"
if ./ds4-imatrix-dataset -o "$dir/bad" "$dir/none.jsonl" 2> "$dir/err.txt"; then fail "a missing input was taken"; fi
grep -q "none.jsonl: No such file" "$dir/err.txt" || fail "missing input message: $(cat "$dir/err.txt")"

# the dataset feeds the collection
tok=$(suite_tokenizer)
./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$tok" --seed 3 -q -o "$dir/m.gguf"
./ds4 -m "$dir/m.gguf" -c 4096 --imatrix-dataset "$dir/out/rendered_prompts.txt" --imatrix-out "$dir/im.dat" 2> "$dir/im.err" \
    || fail "collection: $(cat "$dir/im.err")"
grep -q "from 8 prompts" "$dir/im.err" || fail "collection read $(cat "$dir/im.err")"
echo "imatrix_dataset: ok"
