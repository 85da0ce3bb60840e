#!/bin/sh
# fuzz_safetensors.sh - build the safetensors libFuzzer target with ASan and
# UBSan and run it briefly from the committed seed corpus.  The corpus copy
# lives under build/, so new inputs never dirty the tree.  Fails on any
# crash, sanitizer report or leak (the fuzzer's own exit status; findings
# go to build/fuzz/safetensors-*).  Longer runs:
#   FUZZ_SECONDS=600 sh tests/suite/fuzz_safetensors.sh
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
need_libfuzzer
secs=${FUZZ_SECONDS:-20}
out=build/fuzz
mkdir -p "$out/corpus-safetensors"
cp tests/fuzz/corpus/safetensors/* "$out/corpus-safetensors/"
"$clang" -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc -fsanitize=fuzzer,address,undefined \
    -fno-sanitize-recover=undefined \
    -o "$out/fuzz_safetensors" tests/fuzz/fuzz_safetensors.c \
    src/convert/safetensors.c src/format/gguf_index.c src/base/error.c -ljansson -lpthread
"$out/fuzz_safetensors" -max_total_time="$secs" -max_len=4096 -timeout=10 -print_final_stats=1 \
    -dict=tests/fuzz/safetensors.dict -artifact_prefix="$out/safetensors-" "$out/corpus-safetensors"
