#!/bin/sh
# tokenizer_tool.sh - ds4-tokenizer end to end: import writes the GGUF
# tokenizer metadata (checked with ds4-gguf), encode (plain and with special
# tokens, from tokenizer.json and from the GGUF) gives the ids HF gives,
# decode gives the bytes back, bench runs, the default tokenizer is found
# from any directory, bad input fails with a message naming the file once.
set -eu
cd "$(dirname "$0")/../.."
T=./ds4-tokenizer
[ -x "$T" ] || make -s ds4-tokenizer
out=build/suite/tokenizer_tool
mkdir -p "$out"

fail() { echo "tokenizer_tool: $*" >&2; exit 1; }

# Ids from HF tokenizers 0.23.3 on the official tokenizer.json.
got=$($T encode "Hello world 12345 ciao")
[ "$got" = "19923 2058 223 6895 1883 274 23144" ] || fail "encode: $got"
got=$($T encode --specials "hi <｜Assistant｜></think>｜DSML｜")
[ "$got" = "6366 223 128804 128822 128825" ] || fail "encode --specials: $got"
plain=$($T encode "hi <｜Assistant｜>")
case " $plain " in *" 128804 "*) fail "plain encode produced a control token: $plain" ;; esac

# decode(encode(x)) == x, through a file with multilingual text and no final newline.
printf 'Caro Renzo, 你好！ 안녕하세요 😀\n\tcode(x) { return 42; }  ' > "$out/in.txt"
ids=$($T encode -f "$out/in.txt")
$T decode $ids > "$out/out.txt"
cmp "$out/in.txt" "$out/out.txt" || fail "decode(encode(file)) differs"

# import -> GGUF metadata laid out as ds4's files; the same ids from it.
$T import data/tokenizer/deepseek-v4-tokenizer.json.xz "$out/tok.gguf" \
    --config data/tokenizer/deepseek-v4-tokenizer_config.json --vocab-size 129280
G=./ds4-gguf
[ -x "$G" ] || make -s ds4-gguf
$G info "$out/tok.gguf" > "$out/info.txt"
for want in 'tokenizer.ggml.model +str +"gpt2"' 'tokenizer.ggml.pre +str +"joyai-llm"' \
            'tokenizer.ggml.tokens +str\[129280\]' 'tokenizer.ggml.token_type +i32\[129280\]' \
            'tokenizer.ggml.merges +str\[127741\]' 'tokenizer.ggml.bos_token_id +u32 +0' \
            'tokenizer.ggml.eos_token_id +u32 +1'; do
    grep -Eq "$want" "$out/info.txt" || fail "import: no '$want' in $(cat "$out/info.txt")"
done
from_gguf=$($T -t "$out/tok.gguf" encode -f "$out/in.txt")
[ "$from_gguf" = "$ids" ] || fail "ids from the GGUF differ from tokenizer.json's"
got=$($T -t "$out/tok.gguf" encode --specials "hi <｜Assistant｜></think>｜DSML｜")
[ "$got" = "6366 223 128804 128822 128825" ] || fail "encode --specials from GGUF: $got"
if $T import "$out/in.txt" "$out/bad.gguf" 2>"$out/err.txt"; then fail "import accepted a non-JSON file"; fi
[ ! -e "$out/bad.gguf" ] || fail "failed import left a file"

$T bench "$out/in.txt" --repeat 2 | grep -q "MB/s" || fail "bench printed no throughput"
$T --help | grep -q "encode" || fail "--help"
if $T decode 99999999 2>"$out/err.txt"; then fail "decode accepted an id outside the vocabulary"; fi
grep -q "outside a vocabulary" "$out/err.txt" || fail "decode error message: $(cat "$out/err.txt")"
if $T -t /nonexistent/tokenizer.json encode x 2>"$out/err.txt"; then fail "missing tokenizer accepted"; fi
grep -q "/nonexistent/tokenizer.json" "$out/err.txt" || fail "missing tokenizer message: $(cat "$out/err.txt")"
# The default tokenizer is found next to the program, from any directory.
root=$PWD
got=$(cd "$out" && "$root/ds4-tokenizer" encode "Hello world 12345 ciao")
[ "$got" = "19923 2058 223 6895 1883 274 23144" ] || fail "encode from another directory: $got"
# Messages name the file once, with a position only when there is one.
if $T import /nonexistent/t.json "$out/x.gguf" 2>"$out/err.txt"; then fail "import of a missing file"; fi
grep -q "cannot open /nonexistent/t.json: No such file" "$out/err.txt" || fail "missing import: $(cat "$out/err.txt")"
[ "$(grep -o "/nonexistent/t.json" "$out/err.txt" | wc -l)" -eq 1 ] || fail "path named twice: $(cat "$out/err.txt")"
if $T -t "$out/in.txt" encode x 2>"$out/err.txt"; then fail "a text file taken for tokenizer.json"; fi
grep -q "in.txt:1:4: .\[. or .{. expected" "$out/err.txt" || fail "JSON error position: $(cat "$out/err.txt")"
printf 'not xz' > "$out/bad.json.xz"
if $T -t "$out/bad.json.xz" encode x 2>"$out/err.txt"; then fail "a broken .xz accepted"; fi
grep -q "bad.json.xz: xz -dc failed (exit status 1: not an xz file?)" "$out/err.txt" || fail "xz failure: $(cat "$out/err.txt")"
grep -q "status 256\|-1:-1" "$out/err.txt" && fail "raw status or position: $(cat "$out/err.txt")"
# Options that belong to another command are refused.
if $T decode --specials 1 2>"$out/err.txt"; then fail "decode --specials accepted"; fi
grep -q "ds4-tokenizer: --specials only applies to encode" "$out/err.txt" || fail "$(cat "$out/err.txt")"
echo "tokenizer_tool: ok"
