#!/bin/sh
# fuzz_dsml.sh - build tests/fuzz/fuzz_dsml.c with clang's libFuzzer under
# ASan + UBSan and run it for FUZZ_SECONDS (default 30) from the seed corpus
# in tests/fuzz/corpus/dsml.  Fails on any crash, sanitizer report, leak or
# broken invariant.  The sources it needs are compiled directly, so this
# does not depend on how `make` builds the library.
#   FUZZ_SECONDS=600 sh tests/suite/fuzz_dsml.sh     (the long run, docs/FUZZING.md)
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
need_libfuzzer
out=build/fuzz/dsml
mkdir -p "$out/corpus"
cp tests/fuzz/corpus/dsml/* "$out/corpus/"

"$clang" -g -O1 -std=gnu11 -D_GNU_SOURCE -Isrc \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -o "$out/fuzz_dsml" tests/fuzz/fuzz_dsml.c \
    src/text/dsml_parse.c src/text/dsml_render.c src/text/pyjson.c src/text/rendered.c \
    src/text/strbuf.c src/text/utf8.c src/text/tokenizer.c src/text/tokens.c src/text/bpe.c \
    src/text/pretok.c src/text/vocab.c src/base/error.c -ljansson -lpcre2-8

seconds=${FUZZ_SECONDS:-30}
"$out/fuzz_dsml" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus"
