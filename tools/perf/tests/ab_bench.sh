#!/bin/sh
# ab_bench.sh - a check of tools/perf/ab_bench.sh, the one-run A/B of
# several ds4-bench builds and settings, against a fake ds4-bench (a shell script) that
# prints its environment setting and arguments as a result line: the
# variants run in turns for REPEAT rounds, each with its own binary and
# settings (and none leaks into the next), each round's order rotated by
# one, BENCH_ARGS reach the benchmark,
# a failing run is recorded as FAILED, bad variants are refused (status 2);
# summary.txt has each variant's mean prefill and generation t/s over its
# rounds (a fake in the real result format, other numbers each round).
set -eu
cd "$(dirname "$0")/../../.."
dir=build/perf/ab_bench
rm -rf "$dir"
mkdir -p "$dir/a" "$dir/b"
fail() { echo "ab_bench check: FAIL: $*" >&2; exit 1; }

for v in a b; do
    cat > "$dir/$v/ds4-bench" <<EOF
#!/bin/sh
[ "\${FAKE_FAIL:-}" = 1 ] && exit 1
echo "noise"
echo "ctx $v X=\${X:-unset} Y=\${Y:-unset} args=\$*"
EOF
    chmod +x "$dir/$v/ds4-bench"
done

# a fake in ds4-bench's result format: round r (its count file) prints
# prefill 1000 + 10 r and generation 100 + r t/s
mkdir -p "$dir/n"
cat > "$dir/n/ds4-bench" <<EOF
#!/bin/sh
echo x >> "$dir/n/count"
r=\$(wc -l < "$dir/n/count")
echo "ctx_tokens,prefill_tokens,prefill_tps"
echo "ctx   4096: prefill   4096 tokens   \$((1000 + 10 * r)).0 t/s | generate   64 tokens  \$((100 + r)).50 t/s = 9 GB/s"
EOF
chmod +x "$dir/n/ds4-bench"

REPEAT=2 BENCH_ARGS="--foo 1" sh tools/perf/ab_bench.sh "$dir/out" one="$dir/a" two="$dir/b:X=5,Y=7" \
    three="$dir/a:FAKE_FAIL=1" > "$dir/log"
got=$(cat "$dir/out/ab.txt")
want="one round 1: ctx a X=unset Y=unset args=--foo 1
two round 1: ctx b X=5 Y=7 args=--foo 1
three round 1: FAILED
two round 2: ctx b X=5 Y=7 args=--foo 1
three round 2: FAILED
one round 2: ctx a X=unset Y=unset args=--foo 1"
[ "$got" = "$want" ] || fail "ab.txt is
$got
expected
$want"

got=$(cat "$dir/out/summary.txt")
want="one: prefill - t/s, generate - t/s (2 runs, 0 with numbers)
two: prefill - t/s, generate - t/s (2 runs, 0 with numbers)
three: prefill - t/s, generate - t/s (2 runs, 0 with numbers)"
[ "$got" = "$want" ] || fail "summary.txt is
$got
expected
$want"

REPEAT=3 sh tools/perf/ab_bench.sh "$dir/out3" real="$dir/n" > /dev/null
got=$(cat "$dir/out3/summary.txt")
want="real: prefill 1020.0 t/s, generate 102.50 t/s (3 runs, 3 with numbers)"
[ "$got" = "$want" ] || fail "summary of the real format is '$got', expected '$want'"
[ "$(wc -l < "$dir/out3/ab.txt")" = 3 ] || fail "ab.txt not written anew"
REPEAT=1 sh tools/perf/ab_bench.sh "$dir/out3" real="$dir/n" > /dev/null
[ "$(wc -l < "$dir/out3/ab.txt")" = 1 ] || fail "ab.txt kept the lines of an earlier run"

status=0
sh tools/perf/ab_bench.sh "$dir/out2" nonsense > /dev/null 2>&1 || status=$?
[ "$status" = 2 ] || fail "a variant without NAME=BINDIR: status $status, expected 2"
status=0
sh tools/perf/ab_bench.sh "$dir/out2" x="$dir/missing" > /dev/null 2>&1 || status=$?
[ "$status" = 2 ] || fail "a BINDIR without ds4-bench: status $status, expected 2"
status=0
sh tools/perf/ab_bench.sh "$dir/out2" > /dev/null 2>&1 || status=$?
[ "$status" = 2 ] || fail "no variants: status $status, expected 2"
echo "ok: ab_bench.sh"
