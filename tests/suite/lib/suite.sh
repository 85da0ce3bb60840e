# suite.sh - what the suite scripts (tests/suite/*.sh) share; sourced from
# the repository root:  . tests/suite/lib/suite.sh
#
# An item that cannot run on this machine says why and exits 77, which
# scripts/run-tests.sh reports as SKIP with that reason (never as PASS).

# skip REASON...: end the item as skipped.
skip() {
    echo "SKIP: $*"
    exit 77
}

# need_libfuzzer: skip unless clang ($CLANG, default clang) can build a
# libFuzzer target with ASan and UBSan (scripts/deps.sh installs clang and
# libclang-rt-dev, its runtime).
need_libfuzzer() {
    clang=${CLANG:-clang}
    command -v "$clang" >/dev/null 2>&1 || skip "$clang not found (apt-get install clang libclang-rt-dev)"
    probe=$(mktemp -d)
    printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
        > "$probe/probe.c"
    if ! "$clang" -fsanitize=fuzzer,address,undefined "$probe/probe.c" -o "$probe/probe" > "$probe/log" 2>&1; then
        cat "$probe/log"
        rm -rf "$probe"
        skip "$clang cannot link libFuzzer with the sanitizers (apt-get install libclang-rt-dev)"
    fi
    rm -rf "$probe"
}

# suite_tokenizer: the path of the real DeepSeek V4 tokenizer as a GGUF
# (build/tokenizer.gguf, which `make test` makes first), made here when
# missing.  The import writes its file whole or not at all, so items
# running side by side may both make it.
suite_tokenizer() {
    [ -f build/tokenizer.gguf ] ||
        ./ds4-tokenizer import data/tokenizer/deepseek-v4-tokenizer.json.xz build/tokenizer.gguf >&2
    echo build/tokenizer.gguf
}
