#!/bin/sh
# bench.sh - ds4-bench on the CPU backend with a tiny model: the CSV has the
# header of ds4's ds4-bench and one row per frontier with the
# incremental prefill sizes; text prompts go through the tokenizer (raw and
# chat), token files and random ids (announced) work, each frontier says when
# it starts; bad options, files that cannot be read or written (before the
# model loads) and short prompts are refused with a message.  With an MTP
# block (--mtp FILE --mtp-draft N) each row gains the speculative columns:
# forced acceptance keeps every draft (N + 1 tokens a verification, all
# accepted), greedy verification commits between 1 and N + 1 a cycle; bad
# MTP options are usage errors.  --parallel (many sessions at once, and a
# prompt arriving among them) gives its rows and refuses bad session
# counts.  Speed itself is measured by hand (docs/PERFORMANCE.md).
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/bench.lock}"
for p in ds4-bench ds4-mkmodel ds4-tokenizer; do [ -x "./$p" ] || make -s "$p"; done
dir=build/suite/bench
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "bench: FAIL: $*" >&2; exit 1; }

tok=$(suite_tokenizer)
M=$dir/model.gguf
./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$tok" --seed 3 -q -o "$M" --mtp "$dir/mtp.gguf"
# 20 KB of Italian prose (I Promessi Sposi, from the tokenizer test corpus)
text=$dir/text.txt
xz -dc tests/golden/text/tok_corpus.bin.xz | head -c 20000 > "$text"

./ds4-bench -m "$M" --prompt-file "$text" --ctx-start 128 --ctx-max 384 --step-incr 128 --gen-tokens 4 \
    --csv "$dir/raw.csv" 2> "$dir/raw.err"
head -1 "$dir/raw.csv" | grep -qx 'ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes' \
    || fail "csv header: $(head -1 "$dir/raw.csv")"
[ "$(tail -n +2 "$dir/raw.csv" | cut -d, -f1,2,4 | tr '\n' ' ')" = "128,128,4 256,128,4 384,128,4 " ] \
    || fail "frontiers: $(cat "$dir/raw.csv")"
# The KV payload grows with the frontier.
awk -F, 'NR > 2 && $6 <= prev { bad = 1 } NR > 1 { prev = $6 } END { exit bad }' "$dir/raw.csv" \
    || fail "kvcache_bytes does not grow: $(cat "$dir/raw.csv")"

./ds4-bench -m "$M" --chat-prompt-file "$text" -sys "Be brief." --ctx-start 64 --ctx-max 128 --step-mul 2 \
    --gen-tokens 2 > "$dir/chat.csv" 2>/dev/null
[ "$(tail -n +2 "$dir/chat.csv" | cut -d, -f1,2 | tr '\n' ' ')" = "64,64 128,64 " ] || fail "chat: $(cat "$dir/chat.csv")"

seq 1 300 > "$dir/ids.txt"
./ds4-bench -m "$M" --tokens-file "$dir/ids.txt" --ctx-start 100 --ctx-max 200 --step-incr 100 --gen-tokens 2 \
    > "$dir/ids.csv" 2>/dev/null
[ "$(wc -l < "$dir/ids.csv")" -eq 3 ] || fail "token file: $(cat "$dir/ids.csv")"

# Random ids are said to be random; each frontier says when it starts.
./ds4-bench -m "$M" --ctx-start 64 --ctx-max 192 --step-incr 64 --gen-tokens 2 --seed 9 > "$dir/rnd.csv" 2> "$dir/rnd.err"
grep -q "^ds4-bench: no --prompt-file, --chat-prompt-file or --tokens-file: benchmarking seeded random token ids (seed 9)$" \
    "$dir/rnd.err" || fail "random ids not announced: $(cat "$dir/rnd.err")"
for i in 1 2 3; do
    grep -q "^ds4-bench: frontier $i/3: ctx $((64 * i)), prefilling 64 tokens, then generating 2$" "$dir/rnd.err" \
        || fail "no progress line for frontier $i: $(cat "$dir/rnd.err")"
done
grep -q "benchmarking seeded random" "$dir/raw.err" && fail "a prompt file run said it uses random ids"
# A step multiplier too small to move the frontier still moves it.
./ds4-bench -m "$M" --tokens-file "$dir/ids.txt" --ctx-start 10 --ctx-max 12 --step-mul 1.01 --gen-tokens 0 \
    > "$dir/mul.csv" 2>/dev/null
[ "$(tail -n +2 "$dir/mul.csv" | cut -d, -f1 | tr '\n' ' ')" = "10 11 12 " ] || fail "--step-mul 1.01: $(cat "$dir/mul.csv")"

# --parallel: a CSV row per session count, then the arriving prompt's; each
# row's steps and a positive rate; the times per token ordered (p50 <= p99).
# The prompt arrives among as many sessions as the largest count: its last
# step's logits are a row more than the decoders' (they once overran the
# buffer sized for the decoders: a crash at the end).
./ds4-bench -m "$M" --parallel 1,2 --session-ctx 48 --gen-tokens 4 --arrive 60 --arrive-among 2 --step-rows 22 \
    --csv "$dir/par.csv" 2> "$dir/par.err"
head -1 "$dir/par.csv" | grep -qx 'mode,sessions,ctx_tokens,steps,agg_tps,p50_ms,p99_ms' \
    || fail "parallel csv header: $(head -1 "$dir/par.csv")"
[ "$(tail -n +2 "$dir/par.csv" | cut -d, -f1-4 | tr '\n' ' ')" = "decode,1,48,4 decode,2,48,4 prefill+decode,2,48,3 " ] \
    || fail "parallel rows: $(cat "$dir/par.csv")"
awk -F, 'NR > 1 && !($5 > 0 && $6 > 0 && $6 <= $7) { bad = 1 } END { exit bad }' "$dir/par.csv" \
    || fail "parallel rates or times: $(cat "$dir/par.csv")"
grep -q "a 60-token prompt went in beside 2 decoding sessions" "$dir/par.err" || fail "no arrival line: $(cat "$dir/par.err")"
# Without --step-rows the pacer cuts the pieces (engine/pace.h): the first
# DS4_PACE_FIRST (64) rows, then none smaller than DS4_PACE_MIN (16): 200
# tokens in 4 to 10 steps, the CSV row's steps the line's.
./ds4-bench -m "$M" --parallel 2 --session-ctx 48 --gen-tokens 4 --arrive 200 --arrive-among 2 \
    --csv "$dir/pace.csv" 2> "$dir/pace.err"
steps=$(sed -n 's/.*200-token prompt went in .*tokens\/s, \([0-9]*\) steps, .*/\1/p' "$dir/pace.err")
[ -n "$steps" ] && [ "$steps" -ge 4 ] && [ "$steps" -le 10 ] || fail "paced arrival steps '$steps': $(cat "$dir/pace.err")"
grep -q "^prefill+decode,2,48,$steps," "$dir/pace.csv" || fail "paced arrival csv: $(cat "$dir/pace.csv")"

expect_fail() {
    want=$1; shift
    if "$@" > "$dir/err.txt" 2>&1; then fail "expected failure: $*"; fi
    grep -q -- "$want" "$dir/err.txt" || fail "message lacks '$want': $(cat "$dir/err.txt")"
}
printf 'short' > "$dir/short.txt"
expect_fail "ctx-max needs" ./ds4-bench -m "$M" --prompt-file "$dir/short.txt" --ctx-start 64 --ctx-max 64
expect_fail "at most one of" ./ds4-bench -m "$M" --prompt-file "$text" --tokens-file "$dir/ids.txt"
expect_fail "ctx-start <= ctx-max" ./ds4-bench -m "$M" --ctx-start 512 --ctx-max 256
expect_fail "unknown option" ./ds4-bench -m "$M" --frobnicate
expect_fail "session count '0': need 1 to 1024" ./ds4-bench -m "$M" --parallel 0
expect_fail "session count 'x'" ./ds4-bench -m "$M" --parallel 2,x
expect_fail "auto, none, or a percentage from 0 to 100" ./ds4-bench -m "$M" --host-mapped 101
expect_fail "--pace-stretch 0.5: 0 (no pacing) or above 1" ./ds4-bench -m "$M" --parallel 2 --pace-stretch 0.5
expect_fail "auto, none, or a percentage from 0 to 100" ./ds4-bench -m "$M" --host-mapped half
expect_fail "leaves no room beside 16 decoding sessions" ./ds4-bench -m "$M" --parallel 2 --step-rows 16
expect_fail "4 sessions exceed the 3 rows a step holds" ./ds4-bench -m "$M" --parallel 4 --chunk 3 --arrive 0 --session-ctx 8
# Files are checked before the model loads (none.gguf does not exist).
expect_fail "ds4-bench: --prompt-file: cannot open $dir/missing.txt" ./ds4-bench -m "$dir/none.gguf" --prompt-file "$dir/missing.txt"
expect_fail "ds4-bench: --csv: cannot write $dir/no/x.csv" ./ds4-bench -m "$dir/none.gguf" --csv "$dir/no/x.csv"
expect_fail "ds4-bench: --tokens-file: cannot open" ./ds4-bench -m "$dir/none.gguf" --tokens-file "$dir/missing.ids"
expect_fail "--layers needs --synthetic (a slice of a synthetic model) or mpirun" ./ds4-bench -m "$M" --layers 0:4
expect_fail "--layers 8:61: need A:B with 0 <= A <= B < 61 (the model's layers, inclusive)" ./ds4-bench --synthetic pro-q2 --layers 8:61
expect_fail "--layers 5:4: need A:B" ./ds4-bench --synthetic flash-q2 --layers 5:4
expect_fail "--layers 4: need A:B" ./ds4-bench --synthetic flash-q2 --layers 4
expect_fail "only the cuda backend fills them" ./ds4-bench --synthetic pro-q2 --layers 0:2 --backend cpu
# MTP: the header's speculative columns, forced acceptance's exact counts
mtp_cols=mtp_draft,mtp_forced,step_ms,verify_ms,verify_ratio,draft_ms,mtp_tps,tokens_per_verify,accept_rate,proj_tps_a08
for draft in 1 3; do
    ./ds4-bench -m "$M" --mtp "$dir/mtp.gguf" --mtp-draft $draft --mtp-forced --ctx-start 120 --ctx-max 140 \
        --step-incr 20 --gen-tokens 12 > "$dir/mtp.csv" 2> "$dir/mtp.err"
    head -1 "$dir/mtp.csv" | grep -qx "ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes,$mtp_cols" \
        || fail "MTP csv header: $(head -1 "$dir/mtp.csv")"
    [ "$(tail -n +2 "$dir/mtp.csv" | wc -l)" = 2 ] || fail "MTP csv rows: $(cat "$dir/mtp.csv")"
    tail -n +2 "$dir/mtp.csv" | awk -F, -v n=$draft '
        NF != 16 || $7 != n || $8 != 1 || $14 != sprintf("%.3f", n + 1) || $15 != "1.0000" || $13 <= 0 || $12 <= 0 \
            { print "row: " $0; bad = 1 } END { exit bad }' || fail "MTP forced rows (drafts of $draft)"
    grep -q "forced acceptance: an upper bound" "$dir/mtp.err" || fail "the forced rate is not labelled an upper bound"
done
./ds4-bench -m "$M" --mtp "$dir/mtp.gguf" --mtp-draft 2 --ctx-start 64 --ctx-max 64 --gen-tokens 9 > "$dir/mtpg.csv" \
    2> /dev/null
tail -n +2 "$dir/mtpg.csv" | awk -F, '$8 != 0 || $14 < 1 || $14 > 3 || $15 < 0 || $15 > 1 { exit 1 }' \
    || fail "MTP greedy row: $(cat "$dir/mtpg.csv")"
expect_fail "mtp-draft 0: must be an integer in 1..16" ./ds4-bench -m "$M" --mtp "$dir/mtp.gguf" --mtp-draft 0
expect_fail "mtp-draft 17: must be an integer in 1..16" ./ds4-bench -m "$M" --mtp "$dir/mtp.gguf" --mtp-draft 17
expect_fail "need an MTP block" ./ds4-bench -m "$M" --mtp-draft 2
expect_fail "ds4-bench: --mtp: cannot open $dir/none.gguf" ./ds4-bench -m "$M" --mtp "$dir/none.gguf"
expect_fail "another model" ./ds4-bench -m "$M" --mtp tests/golden/cpu/tiny-b.mtp.gguf --ctx-start 64 --ctx-max 64
echo "bench: ok"
