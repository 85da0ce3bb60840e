#!/bin/sh
# fuzz_server.sh - build tests/fuzz/fuzz_server_request.c with clang's
# libFuzzer under ASan + UBSan and run it for FUZZ_SECONDS (default 30)
# from the seed corpus in tests/fuzz/corpus/server: JSON bodies through the
# four API adapters, the chat renderer with exact tool replay, and the
# answer builders.  Fails on any crash, sanitizer report, leak or broken
# invariant.  The sources it needs are compiled directly.
#   FUZZ_SECONDS=600 sh tests/suite/fuzz_server.sh     (the long run, docs/FUZZING.md)
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
need_libfuzzer
out=build/fuzz/server
mkdir -p "$out/corpus"
cp tests/fuzz/corpus/server/* "$out/corpus/"

srv=apps/ds4-server
"$clang" -g -O1 -std=gnu11 -D_GNU_SOURCE -Isrc -pthread \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -o "$out/fuzz_server_request" tests/fuzz/fuzz_server_request.c \
    $srv/common.c $srv/request.c $srv/openai_chat.c $srv/openai_completions.c $srv/openai_responses.c \
    $srv/anthropic_messages.c $srv/toolmem.c $srv/constrain.c \
    src/engine/sampler.c src/text/chat.c src/text/dsml_parse.c src/text/dsml_render.c src/text/pyjson.c \
    src/text/rendered.c src/text/strbuf.c src/text/utf8.c src/text/tokenizer.c src/text/tokens.c src/text/bpe.c \
    src/text/pretok.c src/text/vocab.c src/base/error.c src/base/rank.c -ljansson -lpcre2-8 -lm

seconds=${FUZZ_SECONDS:-30}
"$out/fuzz_server_request" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -dict=tests/fuzz/server.dict -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus"
