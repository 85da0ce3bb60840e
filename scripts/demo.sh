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
./ds4 -m build/models/demo.gguf --nothink --temp 0 -n 24 -p "Write a haiku about the sea."
