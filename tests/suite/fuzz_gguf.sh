#!/bin/sh
# fuzz_gguf.sh - build the GGUF fuzz target (tests/fuzz/fuzz_gguf.c: the
# reader, and the writer through a round trip) with clang's libFuzzer, ASan
# and UBSan, and run it for FUZZ_SECONDS (default 30) from a seed corpus of
# the valid golden files.  Exits non-zero on any finding (crash, sanitizer
# report, broken promise, allocation over 64 MB, or an input taking over
# 10 s); the input is left in build/fuzz/.
# Skips only when clang or its fuzzer runtime is missing.
#
#   FUZZ_SECONDS=600 sh tests/suite/fuzz_gguf.sh     # a longer run
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
need_libfuzzer

secs=${FUZZ_SECONDS:-30}
out=build/fuzz
mkdir -p "$out"

# The reader's sources compiled directly (not the gcc-built libds4.a), so
# all of them carry clang's coverage and sanitizer instrumentation.
"$clang" -std=gnu11 -g -O1 -D_GNU_SOURCE -Isrc -Wall -Wextra -Werror \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    src/base/error.c src/format/types.c src/format/gguf_index.c src/format/gguf_value.c \
    src/format/gguf_read.c src/format/gguf_write.c tests/fuzz/fuzz_gguf.c -o "$out/fuzz_gguf"

corpus="$out/gguf-corpus"
rm -rf "$corpus"
mkdir -p "$corpus"
cp tests/golden/gguf/*.gguf "$corpus/"

echo "fuzzing the GGUF reader for ${secs}s"
"$out/fuzz_gguf" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=64 -dict=tests/fuzz/gguf.dict -artifact_prefix="$out/gguf-" \
    -print_final_stats=1 "$corpus"
