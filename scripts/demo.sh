#!/bin/sh
# demo.sh - the README's first command after the build: run the ds4 CLI on
# the small trained DeepSeek V4 model the repository ships
# (data/models/ds4-small.gguf, docs/SMALL_MODEL.md): a one-shot answer and a
# short interactive session.  In a tree without that file it makes a tiny
# model with random weights and the real DeepSeek V4 tokenizer instead,
# whose answer is noise but runs the same path: GGUF, tokenizer, chat
# template, forward pass, sampling, detokenisation.
set -eu
cd "$(dirname "$0")/.."
if [ -t 1 ]; then show() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }; else show() { printf '\n$ %s\n' "$*"; }; fi

SMALL=data/models/ds4-small.gguf
if [ -f "$SMALL" ]; then
    PROMPT="Return the greatest common divisor of a and b."
    show ./ds4 -m $SMALL --nothink --temp 0 -n 96 -p "\"$PROMPT\""
    ./ds4 -m $SMALL --nothink --temp 0 -n 96 -p "$PROMPT"

    TURNS='Return True if the path is an absolute path.
Split a string into a list of words.
Return the number of items in the queue.'
    show "printf '%s\n' ... | ./ds4 -m $SMALL --nothink --temp 0 -n 64    # an interactive session, three turns"
    echo "$TURNS" | sed 's/^/  > /'
    echo "$TURNS" | ./ds4 -m $SMALL --nothink --temp 0 -n 64

    cat <<'EOF'

The model above is ds4-small: 6 layers of the exact DeepSeek V4 Flash architecture
(hyper-connections, compressed attention with the lightning indexer, hash and top-k
experts, an MTP block), trained in minutes on the Python standard library. It writes
Python-like code and docstring English, nothing more (docs/SMALL_MODEL.md). Next:
  ./ds4 -m data/models/ds4-small.gguf                         interactive chat (/help)
  ./ds4 -m data/models/ds4-small.gguf --mtp data/models/ds4-small-mtp.gguf -p "..."
                                                              speculative decoding
  ./ds4 -m ds4flash.gguf -p "..."                             the real model (README)
EOF
    exit 0
fi

mkdir -p build/models
if [ ! -f build/tokenizer.gguf ]; then
    xz -dc data/tokenizer/deepseek-v4-tokenizer.json.xz > build/tokenizer.json
    ./ds4-tokenizer import build/tokenizer.json build/tokenizer.gguf
fi
[ -f build/models/demo.gguf ] || ./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer build/tokenizer.gguf \
    --seed 7 -q -o build/models/demo.gguf

PROMPT="Write a haiku about the sea."
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
