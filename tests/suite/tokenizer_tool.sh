#!/bin/sh
# tokenizer_tool.sh - ds4-tokenizer end to end: encode (plain and with
# special tokens) gives the ids HF gives, decode gives the bytes back,
# bench runs, bad input fails with a message.
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

$T bench "$out/in.txt" --repeat 2 | grep -q "MB/s" || fail "bench printed no throughput"
$T --help | grep -q "encode" || fail "--help"
if $T decode 99999999 2>"$out/err.txt"; then fail "decode accepted an id outside the vocabulary"; fi
grep -q "outside a vocabulary" "$out/err.txt" || fail "decode error message: $(cat "$out/err.txt")"
if $T -t /nonexistent/tokenizer.json encode x 2>"$out/err.txt"; then fail "missing tokenizer accepted"; fi
grep -q "/nonexistent/tokenizer.json" "$out/err.txt" || fail "missing tokenizer message: $(cat "$out/err.txt")"
echo "tokenizer_tool: ok"
