#!/bin/sh
# model.sh - the tiny random model with DeepSeek V4's real tokenizer that
# ds4-agent's tests run on (ds4-mkmodel, like tests/suite/cli.sh): made once
# in build/agent-test/, printed path.
set -eu
cd "$(dirname "$0")/../.."
dir=build/agent-test
M=$dir/model.gguf
if [ ! -f "$M" ]; then
    mkdir -p "$dir"
    for p in ds4-mkmodel ds4-tokenizer; do [ -x "./$p" ] || make -s "$p" >&2; done
    tok=build/tokenizer.gguf
    if [ ! -f "$tok" ]; then
        xz -dc data/tokenizer/deepseek-v4-tokenizer.json.xz > "$dir/tokenizer.json"
        ./ds4-tokenizer import "$dir/tokenizer.json" "$dir/tokenizer.tmp" >&2
        mv "$dir/tokenizer.tmp" "$tok"
        rm -f "$dir/tokenizer.json"
    fi
    # 4 indexer heads where the preset has 32: the agent's tests force the
    # model's text, and the indexer's scores over a long system prompt were a
    # quarter of their time
    ./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$tok" --seed 11 --set idx-heads=4 -q -o "$M.tmp" >&2
    mv "$M.tmp" "$M"
fi
echo "$M"
