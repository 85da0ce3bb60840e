#!/bin/sh
# demo.sh - the README's first command after the build: make a tiny model
# with the real DeepSeek V4 tokenizer and run the ds4 CLI on it.
# The model has random weights, so the answer is gibberish; what the demo
# shows is the whole path working: GGUF, tokenizer, chat template, forward
# pass, sampling, detokenisation.
set -eu
cd "$(dirname "$0")/.."
mkdir -p build/models
if [ ! -f build/tokenizer.gguf ]; then
    xz -dc data/tokenizer/deepseek-v4-tokenizer.json.xz > build/tokenizer.json
    ./ds4-tokenizer import build/tokenizer.json build/tokenizer.gguf
fi
[ -f build/models/demo.gguf ] || ./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer build/tokenizer.gguf \
    --seed 7 -q -o build/models/demo.gguf

PROMPT="Write a haiku about the sea."
if [ -t 1 ]; then show() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }; else show() { printf '\n$ %s\n' "$*"; }; fi

show ./ds4 -m build/models/demo.gguf --dump-tokens -p "\"$PROMPT\""
./ds4 -m build/models/demo.gguf --dump-tokens -p "$PROMPT"

show ./ds4 -m build/models/demo.gguf --nothink --temp 0 -n 24 -p "\"$PROMPT\""
./ds4 -m build/models/demo.gguf --nothink --temp 0 -n 24 -p "$PROMPT"

cat <<'EOF'

The model above has random weights (6 layers, 256 wide) and the real DeepSeek V4
vocabulary, so its answer is noise; every stage of the real path ran. Next:
  ./ds4 -m build/models/demo.gguf             interactive chat (/help for commands)
  ./ds4 -m build/models/demo.gguf --inspect   what is in the model file
  ./ds4 -m ds4flash.gguf -p "..."             the real model (README, "The real model")
EOF
