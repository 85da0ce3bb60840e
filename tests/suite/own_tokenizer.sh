#!/bin/sh
# own_tokenizer.sh - the engine honours a model's own tokenizer (docs/MODEL.md
# 10; docs/TRAINING.md 3): a 600-token byte-level BPE with the DeepSeek V4
# pre-tokenizer and special tokens at other ids than the official ones
# (tests/reference/small_tok_golden.py, trained by tools/train/bpe.py):
#  1. its tokenizer.json and the GGUF ds4-tokenizer imports from it give the
#     ids HF tokenizers gave the test text (tests/golden/text/small-bpe.ids),
#     and decoding them gives the text back byte for byte;
#  2. a model of that vocabulary (ds4-mkmodel, random weights) loads with the
#     tokenizer from its own file and answers through the chat template,
#     whose markers it finds in that vocabulary.
set -eu
cd "$(dirname "$0")/../.."
mkdir -p build/test-locks build/tests
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/own_tokenizer.lock}"
G=tests/golden/text
T=build/tests/own_tokenizer.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

./ds4-tokenizer -t $G/small-bpe.json encode -f $G/small-bpe.txt > "$T/json.ids"
cmp -s "$T/json.ids" $G/small-bpe.ids || fail "ids from small-bpe.json differ from tokenizers'"
./ds4-tokenizer import $G/small-bpe.json "$T/tok.gguf" > /dev/null
./ds4-tokenizer -t "$T/tok.gguf" encode -f $G/small-bpe.txt > "$T/gguf.ids"
cmp -s "$T/gguf.ids" $G/small-bpe.ids || fail "ids from the imported GGUF differ from tokenizers'"
# shellcheck disable=SC2046
./ds4-tokenizer -t "$T/tok.gguf" decode $(cat $G/small-bpe.ids) > "$T/decoded.txt"
cmp -s "$T/decoded.txt" $G/small-bpe.txt || fail "decoding the ids does not give the text back"
echo "ok: $(wc -w < $G/small-bpe.ids) ids equal tokenizers' (tokenizer.json and GGUF), decoded byte for byte"

./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$T/tok.gguf" --seed 3 -q -o "$T/m.gguf"
./ds4 -m "$T/m.gguf" --inspect > "$T/inspect.txt" 2>&1 || fail "inspect: $(cat "$T/inspect.txt")"
./ds4 -m "$T/m.gguf" --nothink --temp 0 -n 8 -t 1 -p "Hello" > "$T/answer.txt" 2> "$T/answer.err" \
    || fail "a one-shot answer with the model's own vocabulary: $(cat "$T/answer.err")"
grep -q "prefill: " "$T/answer.err" || fail "no end-of-run line: $(cat "$T/answer.err")"
echo "ok: a model of 600 tokens answers through the chat template with its own vocabulary"
