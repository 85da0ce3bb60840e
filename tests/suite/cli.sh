#!/bin/sh
# cli.sh - the ds4 program end to end on a tiny random model with the real
# DeepSeek V4 tokenizer: one-shot greedy runs are deterministic and equal the
# argmax of the logits that --dump-logprobs writes, which equal ds4-forward's
# (an independent path: one raw prefill); seeds; pre-rendered transcripts;
# --perplexity-file against an NLL computed from ds4-forward's logits;
# --dump-tokens against ds4-tokenizer; --inspect; --imatrix-out writes the
# same bytes as ds4-imatrix (one shared collector); usage errors exit 2;
# a missing model explains itself; files named by options are checked before
# the model loads; --no-sim; the messages for a full context, the token
# limit, a tokenizer-only GGUF, a q8_0 model's quant bits and NaN weights;
# the interactive mode through a pseudo-terminal (cli_repl.py).
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
# Our own instance lock (src/base/instance_lock.h) unless the runner chose one.
mkdir -p build/test-locks
export DS4_LOCK_FILE="${DS4_LOCK_FILE:-$PWD/build/test-locks/cli.lock}"
for p in ds4 ds4-mkmodel ds4-tokenizer ds4-forward ds4-imatrix ds4-score; do [ -x "./$p" ] || make -s "$p"; done
dir=build/suite/cli
rm -rf "$dir"
mkdir -p "$dir"

fail() { echo "cli: FAIL: $*" >&2; exit 1; }

tok=$(suite_tokenizer)
M=$dir/model.gguf
./ds4-mkmodel --preset tiny --recipe q8_0 --tokenizer "$tok" --seed 11 -q -o "$M"
V=129280
BOS='<｜begin▁of▁sentence｜>'
RENDERED="${BOS}You are a helpful assistant<｜User｜>Hello<｜Assistant｜></think>"

# --- one-shot greedy: deterministic, and exactly the argmax chain --------------
./ds4 -m "$M" -c 4096 --nothink --temp 0 -n 16 -p Hello > "$dir/g1.txt" 2> "$dir/g1.err"
./ds4 -m "$M" -c 4096 --nothink --temp 0 -n 16 -p Hello > "$dir/g2.txt" 2>/dev/null
cmp -s "$dir/g1.txt" "$dir/g2.txt" || fail "greedy runs differ"
[ -s "$dir/g1.txt" ] || fail "greedy run printed nothing"
grep -q "memory: weights .* + context 4096 tokens" "$dir/g1.err" || fail "no memory estimate: $(cat "$dir/g1.err")"
grep -Eq "^ds4: prefill: [0-9.]+ t/s, generation: [0-9.]+ t/s; prefill [0-9]+ tokens \(0 reused\), generation 16 tokens" "$dir/g1.err" || fail "timing line: $(cat "$dir/g1.err")"

./ds4 -m "$M" -c 4096 --nothink -n 16 -p Hello --dump-logprobs "$dir/lp.json" --logprobs-top-k 5 > "$dir/lp.out" 2>/dev/null
[ -s "$dir/lp.out" ] && fail "--dump-logprobs printed text: $(cat "$dir/lp.out")"
# The prompt's ids from the hand-written transcript, then every generated
# token but the last, through ds4-forward in one prefill.
./ds4 -m "$M" --dump-tokens -p "$RENDERED" 2>/dev/null | cut -f1 > "$dir/prompt.ids"
python3 -c "
import json, sys
d = json.load(open('$dir/lp.json'))
ids = open('$dir/prompt.ids').read().split() + [str(s['selected']['id']) for s in d['steps'][:-1]]
open('$dir/chain.ids', 'w').write(' '.join(ids))
"
./ds4-forward "$M" --tokens "@$dir/chain.ids" --ctx 4096 --logits-out "$dir/chain.logits" --top 0
python3 tests/suite/cli_check.py greedy "$dir/lp.json" "$dir/chain.logits" "$(wc -l < "$dir/prompt.ids")" $V \
    "$dir/g1.txt" 1

# --no-sim: the same greedy chain check against ds4-forward --no-sim, and
# logits that differ from those with the simulations on.
./ds4 -m "$M" -c 4096 --nothink -n 16 -p Hello --no-sim --dump-logprobs "$dir/lpns.json" --logprobs-top-k 5 2>/dev/null
python3 -c "
import json
d = json.load(open('$dir/lpns.json'))
ids = open('$dir/prompt.ids').read().split() + [str(s['selected']['id']) for s in d['steps'][:-1]]
open('$dir/chainns.ids', 'w').write(' '.join(ids))
on = json.load(open('$dir/lp.json'))['steps'][0]['top_logprobs'][0]['logit']
assert d['steps'][0]['top_logprobs'][0]['logit'] != on, 'the first logit is the same with and without the simulations'
"
./ds4-forward "$M" --tokens "@$dir/chainns.ids" --ctx 4096 --no-sim --logits-out "$dir/chainns.logits" --top 0 2>/dev/null
./ds4 -m "$M" -c 4096 --nothink --temp 0 -n 16 -p Hello --no-sim > "$dir/gns.txt" 2>/dev/null
python3 tests/suite/cli_check.py greedy "$dir/lpns.json" "$dir/chainns.logits" "$(wc -l < "$dir/prompt.ids")" $V \
    "$dir/gns.txt" 1

# A pre-rendered transcript runs as is: the same tokens, the same answer.
./ds4 -m "$M" -c 4096 --temp 0 -n 16 -p "$RENDERED" > "$dir/raw.txt" 2>/dev/null
cmp -s "$dir/g1.txt" "$dir/raw.txt" || fail "the rendered transcript answers differently from the chat prompt"

# --- sampling: same seed same text, another seed another text ----------------
sample() { ./ds4 -m "$M" -c 4096 --nothink --temp 1 --min-p 0 --seed "$1" -n 24 -p Hello 2>/dev/null; }
sample 42 > "$dir/s42a.txt"
sample 42 > "$dir/s42b.txt"
sample 43 > "$dir/s43.txt"
cmp -s "$dir/s42a.txt" "$dir/s42b.txt" || fail "seed 42 gave two different texts"
cmp -s "$dir/s42a.txt" "$dir/s43.txt" && fail "seeds 42 and 43 gave the same text"
cmp -s "$dir/s42a.txt" "$dir/g1.txt" && fail "sampling at T=1 gave the greedy text"
# top-k 1 is greedy whatever the temperature.
./ds4 -m "$M" -c 4096 --nothink --temp 5 --top-k 1 --seed 3 -n 16 -p Hello > "$dir/k1.txt" 2>/dev/null
cmp -s "$dir/g1.txt" "$dir/k1.txt" || fail "--top-k 1 is not greedy"

# --- perplexity against an independent NLL -----------------------------------
cat > "$dir/text.txt" <<'EOF'
The lighthouse keeper counted the ships every evening, writing their names in a small
notebook with a green cover. Some nights there were none; on others the harbour filled
with lanterns, and he had to climb down to the quay to read the painted letters.
EOF
./ds4 -m "$M" -c 4096 --perplexity-file "$dir/text.txt" > "$dir/ppl.txt" 2>/dev/null
./ds4-tokenizer -t "$tok" encode -f "$dir/text.txt" | tr '\n' ' ' > "$dir/text.ids"
./ds4-forward "$M" --tokens "@$dir/text.ids" --ctx 4096 --logits-out "$dir/text.logits" --top 0
python3 tests/suite/cli_check.py ppl "$dir/text.logits" "$dir/text.ids" $V 32 "$dir/ppl.txt"
./ds4 -m "$M" -c 4096 -n 10 --perplexity-file "$dir/text.txt" > "$dir/ppl10.txt" 2>/dev/null
grep -q " scored=10 " "$dir/ppl10.txt" || fail "-n 10 did not limit the scored tokens: $(cat "$dir/ppl10.txt")"
python3 tests/suite/cli_check.py ppl "$dir/text.logits" "$dir/text.ids" $V 32 "$dir/ppl10.txt"
./ds4 -m "$M" -c 40 --perplexity-file "$dir/text.txt" > "$dir/ppl40.txt" 2> "$dir/ppl40.err"
grep -q " scored=8 " "$dir/ppl40.txt" || fail "-c 40 should leave 8 scored tokens: $(cat "$dir/ppl40.txt")"
# ... and says that the context left the rest of the text out.
grep -q "the text has 55 tokens; a context of 40 tokens scores the first 8 after the 32 context tokens, not the other 15" \
    "$dir/ppl40.err" || fail "-c 40 did not say it scores part of the text: $(cat "$dir/ppl40.err")"
./ds4 -m "$M" -c 4096 --perplexity-file "$dir/text.txt" 2>&1 >/dev/null | grep -q "not the other" \
    && fail "a text that fits the context got the note"
echo "short" > "$dir/short.txt"
if ./ds4 -m "$M" --perplexity-file "$dir/short.txt" 2> "$dir/err.txt"; then fail "a 2-token text was scored"; fi
grep -q "more than 32 are needed" "$dir/err.txt" || fail "short text message: $(cat "$dir/err.txt")"

# --- dump-tokens: ds4-tokenizer's ids, specials recognised, no weights ---------
text="Ciao <｜User｜>你好 </think>
x	y"
./ds4 -m "$M" --dump-tokens -p "$text" > "$dir/dt.txt" 2>/dev/null
got=$(cut -f1 "$dir/dt.txt" | tr '\n' ' ' | sed 's/ $//')
want=$(./ds4-tokenizer -t "$tok" encode --specials "$text")
[ "$got" = "$want" ] || fail "--dump-tokens ids '$got', ds4-tokenizer '$want'"
grep -qP '^128803\t<｜User｜>$' "$dir/dt.txt" || fail "--dump-tokens pieces: $(cat "$dir/dt.txt")"
grep -qF '\n' "$dir/dt.txt" || fail "--dump-tokens does not escape the newline: $(cat "$dir/dt.txt")"
# The tokenizer metadata alone is enough: a GGUF with no tensors works.
./ds4 -m "$tok" --dump-tokens -p "$text" > "$dir/dt2.txt" 2>/dev/null
cmp -s "$dir/dt.txt" "$dir/dt2.txt" || fail "--dump-tokens needed more than the tokenizer metadata"

# --- inspect ---------------------------------------------------------------
./ds4 -m "$M" --inspect -c 4096 > "$dir/inspect.txt"
for want in "layers 6, embedding 256, vocabulary 129280" "compress ratios: 0 0 4 128 4 128" \
            "routed-w1 +6 .* q8_0" "embedding +1 .* f16" "hash +3 .* i32" "total +178 " \
            "tokenizer: 129280 tokens, 127741 merges, bos 0, eos 1" "KV state for 4096 tokens"; do
    grep -Eq "$want" "$dir/inspect.txt" || fail "--inspect lacks '$want': $(cat "$dir/inspect.txt")"
done
kv4k=$(sed -n 's/^kv_bytes: //p' "$dir/inspect.txt")
kv8k=$(./ds4 -m "$M" --inspect -c 8192 | sed -n 's/^kv_bytes: //p')
[ "$kv8k" -gt "$kv4k" ] || fail "KV bytes do not grow with the context ($kv4k, $kv8k)"

# --- importance matrix: ds4-imatrix's collection, byte for byte ------------------
# Rendered chat text (special tokens recognised), plain text and token ids.
{
    echo "===== DS4_IMATRIX_PROMPT 0 chat think"
    echo "${BOS}You are helpful.<｜User｜>Write a haiku about rain.<｜Assistant｜><think>"
    echo
    echo "===== DS4_IMATRIX_PROMPT 1 ids"
    echo "5 6 7 8 9 10 11 12 13 14 15 16"
    echo
    echo "===== DS4_IMATRIX_PROMPT 2 prose"
    cat "$dir/text.txt"
} > "$dir/im.txt"
imatrix_pair() { # imatrix_pair NAME OPTIONS...: the two programs, same bytes
    name=$1; shift
    ./ds4 -m "$M" -c 64 -t 2 --imatrix-dataset "$dir/im.txt" --imatrix-out "$dir/$name.cli.dat" "$@" \
        > "$dir/im.out" 2> "$dir/im.err" || fail "ds4 --imatrix-out $*: $(cat "$dir/im.err")"
    [ ! -s "$dir/im.out" ] || fail "ds4 --imatrix-out printed on stdout: $(cat "$dir/im.out")"
    ./ds4-imatrix "$M" --ctx 64 -t 2 --imatrix-dataset "$dir/im.txt" --imatrix-out "$dir/$name.tool.dat" "$@" \
        2>/dev/null || fail "ds4-imatrix $*"
    cmp -s "$dir/$name.cli.dat" "$dir/$name.tool.dat" || fail "ds4 and ds4-imatrix wrote different files ($*)"
}
imatrix_pair all
grep -q "wrote .*all.cli.dat from 3 prompts, " "$dir/im.err" || fail "imatrix summary: $(cat "$dir/im.err")"
imatrix_pair two --imatrix-max-prompts 2
grep -q "from 2 prompts, " "$dir/im.err" || fail "--imatrix-max-prompts: $(cat "$dir/im.err")"
imatrix_pair t20 --imatrix-max-tokens 20
grep -q "from 2 prompts, 20 tokens" "$dir/im.err" || fail "--imatrix-max-tokens: $(cat "$dir/im.err")"
cmp -s "$dir/all.cli.dat" "$dir/two.cli.dat" && fail "--imatrix-max-prompts changed nothing"
if ./ds4 -m "$M" --imatrix-dataset "$dir/none.txt" --imatrix-out "$dir/x.dat" 2> "$dir/err.txt"; then
    fail "a missing dataset was collected"
fi
grep -q "none.txt: No such file" "$dir/err.txt" || fail "missing dataset message: $(cat "$dir/err.txt")"
[ ! -e "$dir/x.dat" ] || fail "a failed collection wrote its output"

# --- ds4-score on ds4's quality manifest (text files) ------------------------------
# The manifest as ds4's collector writes it (a header comment, a fourth column,
# paths from the current directory); the same cases as token ids rendered by
# hand (BOS, user turn, non-thinking assistant; the user's text and the
# continuation as plain text, so a "<think>" typed by the user stays text, as
# in ds4) must score the same, row for row.
q=$dir/q
mkdir -p "$q/prompts" "$q/continuations"
printf 'Name three prime numbers.' > "$q/prompts/case_1.txt"
printf 'Two, three and five.\nAll of them are prime.' > "$q/continuations/case_1.txt"
printf 'Qual è la capitale d’Italia? <think>' > "$q/prompts/case_2.txt"
printf 'Roma è la capitale.' > "$q/continuations/case_2.txt"
printf '# id\tprompt_file\tcontinuation_file\tresponse_file\n' > "$q/manifest.tsv"
: > "$q/ids.tsv"
for i in 1 2; do
    printf 'case_%s\t%s\t%s\t%s\n' $i "$q/prompts/case_$i.txt" "$q/continuations/case_$i.txt" "$q/r$i.json" >> "$q/manifest.tsv"
    { ./ds4-tokenizer -t "$tok" encode --specials "${BOS}<｜User｜>"; ./ds4-tokenizer -t "$tok" encode -f "$q/prompts/case_$i.txt"
      ./ds4-tokenizer -t "$tok" encode --specials "<｜Assistant｜></think>"; } > "$q/p$i.ids"
    ./ds4-tokenizer -t "$tok" encode -f "$q/continuations/case_$i.txt" > "$q/c$i.ids"
    printf 'case_%s\tp%s.ids\tc%s.ids\n' $i $i $i >> "$q/ids.tsv"
done
./ds4-score "$M" "$q/manifest.tsv" "$q/text.tsv" 4096 2>/dev/null || fail "ds4-score on ds4's manifest"
./ds4-score --token-ids "$M" "$q/ids.tsv" "$q/ids-out.tsv" 4096 2>/dev/null || fail "ds4-score --token-ids"
cmp -s "$q/text.tsv" "$q/ids-out.tsv" || fail "text manifest scored differently: $(cat "$q/text.tsv" "$q/ids-out.tsv")"
[ "$(wc -l < "$q/text.tsv")" -eq 3 ] || fail "ds4-score rows: $(cat "$q/text.tsv")"
head -1 "$q/text.tsv" | grep -qx "$(printf 'id\tprompt_tokens\ttarget_tokens\tnll\tavg_nll\tfirst_match\tgreedy_lcp')" \
    || fail "ds4-score header: $(head -1 "$q/text.tsv")"
tail -n +2 "$q/text.tsv" | cut -f4,5 | grep -Evq "^[0-9]+\.[0-9]{9}$(printf '\t')[0-9]+\.[0-9]{9}$" \
    && fail "ds4-score NLLs are not written as ds4 writes them: $(cat "$q/text.tsv")"
./ds4-mkmodel --preset tiny --recipe q8_0 --seed 11 -q -o "$q/notok.gguf"
if ./ds4-score "$q/notok.gguf" "$q/manifest.tsv" "$q/x.tsv" 4096 2> "$q/err.txt"; then fail "scored text without a tokenizer"; fi
grep -q "has no usable tokenizer for ds4's text manifest (--token-ids reads token ids)" "$q/err.txt" \
    || fail "no-tokenizer message: $(cat "$q/err.txt")"

# --- system prompt: the default one, a custom one, none ---------------------------
prompt_len() { ./ds4 -m "$M" -c 4096 --nothink --temp 0 -n 1 -p Hello "$@" 2>&1 >/dev/null | sed -n 's/^ds4: prefill: .* t\/s; prefill \([0-9]*\) tokens.*/\1/p'; }
count() { ./ds4-tokenizer -t "$tok" encode --specials "$1" | wc -w; }
[ "$(prompt_len)" -eq "$(count "$RENDERED")" ] || fail "default system prompt: $(prompt_len) tokens"
[ "$(prompt_len -sys "")" -eq "$(count "${BOS}<｜User｜>Hello<｜Assistant｜></think>")" ] || fail "-sys '' kept a system prompt"
[ "$(prompt_len -sys "Be brief.")" -eq "$(count "${BOS}Be brief.<｜User｜>Hello<｜Assistant｜></think>")" ] || fail "-sys TEXT"

# --- interactive mode with piped input (no line editor) ------------------------
printf 'Hello\n/nothink\nagain\n/quit\nnever sent\n' | ./ds4 -m "$M" -c 4096 --temp 0 -n 4 > "$dir/pipe.out" 2> "$dir/pipe.err" \
    || fail "piped REPL failed: $(cat "$dir/pipe.err")"
[ "$(grep -c '^ds4: prefill: ' "$dir/pipe.err")" -eq 2 ] || fail "piped REPL: $(cat "$dir/pipe.err")"
grep -q "thinking off" "$dir/pipe.err" || fail "piped REPL ignored /nothink"

# --- thinking modes -----------------------------------------------------------
./ds4 -m "$M" -c 4096 --think-max --temp 0 -n 4 -p Hello > /dev/null 2> "$dir/tm.err"
grep -q "think-max needs --ctx of at least 393216" "$dir/tm.err" || fail "no Think Max warning: $(cat "$dir/tm.err")"
./ds4 -m "$M" -c 4096 --think --temp 0 -n 4 -p Hello > "$dir/think.txt" 2>/dev/null
cmp -s "$dir/think.txt" "$dir/g1.txt" && fail "thinking and non-thinking prompts answered the same"

# --- messages: a full context, the token limit, counts ------------------------------
n=$(count "$RENDERED")
set +e
./ds4 -m "$M" -c "$n" --temp 0 -n 4 -p "$RENDERED" > /dev/null 2> "$dir/full.err"
rc=$?
set -e
[ $rc -eq 1 ] || fail "a prompt filling the context exited $rc"
grep -q "the conversation is $n tokens and fills the context of $n tokens: no room is left for an answer" \
    "$dir/full.err" || fail "prompt filling the context: $(cat "$dir/full.err")"
./ds4 -m "$M" -c $((n - 2)) --temp 0 -n 4 -p "$RENDERED" 2>&1 >/dev/null \
    | grep -q "the conversation is $n tokens, more than the context of $((n - 2)) tokens holds" \
    || fail "prompt beyond the context"
./ds4 -m "$M" -c $((n + 3)) --temp 0 -n 100 -p "$RENDERED" 2>&1 >/dev/null \
    | grep -q "generation 3 tokens, stopped: the context is full" || fail "a full context read as the token limit"
./ds4 -m "$M" -c 4096 --temp 0 -n 3 -p "$RENDERED" 2>&1 >/dev/null | grep -q ", stopped at the token limit (-n)$" \
    || fail "the token limit"
./ds4 -m "$M" -c 4096 --temp 0 -n 1 -p "$RENDERED" 2>&1 >/dev/null | grep -Eq "^ds4: prefill: .* t/s; prefill $n tokens \(0 reused\), generation 1 token(,|$)" \
    || fail "generation of one token"
./ds4 -m "$M" --dump-tokens -p "$BOS" 2>&1 >/dev/null | grep -qx "ds4: 1 token" || fail "--dump-tokens of one token"

# --- what the model file holds -----------------------------------------------------
./ds4 -m "$M" --inspect | grep -q "^routed experts: q8_0 (KV cache files record quant bits 2: ds4's format knows only 2 and 4)$" \
    || fail "--inspect quant bits of a q8_0 model: $(./ds4 -m "$M" --inspect | grep -i quant)"
if ./ds4 -m "$tok" -p hi > /dev/null 2> "$dir/err.txt"; then fail "a tokenizer-only GGUF ran"; fi
grep -q "$tok: a tokenizer-only GGUF (tokenizer metadata, no model weights" "$dir/err.txt" \
    || fail "tokenizer-only GGUF: $(cat "$dir/err.txt")"
# A model whose weights are NaN runs, with a warning (every float tensor set to 0xff bytes: NaN).
./ds4-gguf info --json "$M" > "$dir/m.json"
python3 -c "
import json, shutil
d = json.load(open('$dir/m.json'))
shutil.copy('$M', '$dir/nan.gguf')
with open('$dir/nan.gguf', 'r+b') as f:
    for t in d['tensors']:
        if t['type'] in ('f32', 'f16', 'q8_0'):
            f.seek(d['data_offset'] + t['offset'])
            f.write(b'\xff' * t['bytes'])
"
./ds4 -m "$dir/nan.gguf" -c 256 --nothink --temp 0 -n 3 -p hi 2>&1 >/dev/null \
    | grep -q "^ds4: warning: the logits held NaN at 3 of 3 steps" || fail "no warning for a NaN model"
./ds4 -m "$M" -c 256 --nothink --temp 0 -n 3 -p hi 2>&1 >/dev/null | grep -q "warning" && fail "a warning for a sound model"
./ds4 -m "$dir/nan.gguf" -c 256 --perplexity-file "$dir/text.txt" 2>&1 >/dev/null \
    | grep -q "^ds4: warning: the log-likelihood is NaN" || fail "no NaN warning from --perplexity-file"

# --- files are checked before the model loads (none.gguf does not exist) ----------
expect_early() { # expect_early NEEDLE ARGS...: status 2, the file named, no model touched
    want=$1; shift
    set +e
    ./ds4 -m "$dir/none.gguf" "$@" > /dev/null 2> "$dir/err.txt"
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "ds4 $* exited $rc, want 2"
    grep -q -- "$want" "$dir/err.txt" || fail "ds4 $*: $(cat "$dir/err.txt")"
    grep -q "make demo" "$dir/err.txt" && fail "ds4 $*: the model was looked at first"
    return 0
}
expect_early "--dump-logprobs: cannot write $dir/no/dir/x.json: directory $dir/no/dir: No such file" \
    --dump-logprobs "$dir/no/dir/x.json" -p hi
expect_early "--dump-logprobs: cannot write $dir: it is a directory" --dump-logprobs "$dir" -p hi
expect_early "--perplexity-file: cannot open $dir/none.txt: No such file" --perplexity-file "$dir/none.txt"
expect_early "--imatrix-out: cannot write" --imatrix-dataset "$dir/im.txt" --imatrix-out "$dir/no/x.dat"

# --- usage errors: exit status 2 and a message naming the option ---------------
expect_usage() {
    want=$1; shift
    set +e
    ./ds4 -m "$M" "$@" > "$dir/out.txt" 2> "$dir/err.txt"
    rc=$?
    set -e
    [ $rc -eq 2 ] || fail "ds4 $* exited $rc, want 2"
    grep -q -- "$want" "$dir/err.txt" || fail "ds4 $*: message lacks '$want': $(cat "$dir/err.txt")"
}
expect_usage "-c 0: must be an integer" -c 0
expect_usage "--ctx abc" --ctx abc
expect_usage "-n 0" -n 0
expect_usage "--temp 101: must be a number in 0..100" --temp 101
expect_usage "--top-p 1.5" --top-p 1.5
expect_usage "--min-p -0.1" --min-p -0.1
expect_usage "--top-k -1" --top-k -1
expect_usage "--seed 0: must be a positive integer" --seed 0
expect_usage "-t 0" -t 0
expect_usage "--logprobs-top-k 0" --logprobs-top-k 0 --dump-logprobs x -p a
expect_usage "unknown option" --bogus
expect_usage "needs a value" -p
expect_usage "only one prompt" -p a --prompt-file "$dir/text.txt"
expect_usage "needs a prompt" --dump-tokens
expect_usage "only one of" --inspect --dump-tokens -p a
expect_usage "use ds4-server" --server
expect_usage "Metal is not supported" --metal
expect_usage "cannot open" --prompt-file /nonexistent/prompt.txt
expect_usage "takes no value" --nothink=1
expect_usage "needs --imatrix-dataset" --imatrix-out "$dir/x.dat"
expect_usage "needs --imatrix-out" --imatrix-dataset "$dir/im.txt"
expect_usage "needs --imatrix-out" --imatrix-max-tokens 5
expect_usage "--imatrix-max-prompts 0: must be a positive" --imatrix-max-prompts 0 --imatrix-out x --imatrix-dataset y
expect_usage "takes no prompt" --imatrix-out x --imatrix-dataset "$dir/im.txt" -p hi
expect_usage "only one of" --imatrix-out x --imatrix-dataset "$dir/im.txt" --inspect
./ds4 --help | grep -q -- "--dump-logprobs FILE" || fail "--help"

# --- a missing model explains where models come from ---------------------------
if ./ds4 -m "$dir/none.gguf" -p hi > /dev/null 2> "$dir/err.txt"; then fail "a missing model ran"; fi
grep -q "none.gguf" "$dir/err.txt" && grep -q "make demo" "$dir/err.txt" || fail "missing model message: $(cat "$dir/err.txt")"
if ./ds4 -m "$dir/none.gguf" --dump-tokens -p hi > /dev/null 2> "$dir/err.txt"; then fail "--dump-tokens without a model ran"; fi
grep -q "make demo" "$dir/err.txt" || fail "--dump-tokens missing model message: $(cat "$dir/err.txt")"
if ./ds4 -m tests/golden/cpu/tiny-a.f16.gguf -p hi > /dev/null 2> "$dir/err.txt"; then fail "a model without a tokenizer ran"; fi
grep -q "tiny-a.f16.gguf: tokenizer" "$dir/err.txt" || fail "no-tokenizer message: $(cat "$dir/err.txt")"
[ "$(grep -o "tiny-a.f16.gguf" "$dir/err.txt" | wc -l)" -eq 1 ] || fail "the path is named twice: $(cat "$dir/err.txt")"
if ./ds4 -m tests/golden/cpu/tiny-a.f16.gguf --dump-tokens -p hi > /dev/null 2> "$dir/err.txt"; then fail "--dump-tokens without a tokenizer ran"; fi
[ "$(grep -o "tiny-a.f16.gguf" "$dir/err.txt" | wc -l)" -eq 1 ] || fail "--dump-tokens names the path twice: $(cat "$dir/err.txt")"

# --- the interactive mode through a pseudo-terminal ------------------------------
python3 tests/suite/cli_repl.py ./ds4 "$M" ./ds4-tokenizer "$tok" "$dir/repl"
echo "cli: ok"
