#!/bin/sh
# ab_bench.sh OUTDIR VARIANT... - several builds and settings of ds4-bench
# timed in one run on the GPU machine, in turns, so that a drift of the
# machine shows in every variant alike; round r starts at the r-th variant
# (the order rotated), so that over as many rounds as variants each takes
# every place in a round alike.
#
#   VARIANT   NAME=BINDIR or NAME=BINDIR:VAR=VALUE,VAR=VALUE...
#             the ds4-bench in BINDIR, run with those environment settings
#   BENCH_ARGS   the benchmark's arguments (default: the synthetic q2 Flash
#                at 4k context, 64 generated tokens)
#   REPEAT       rounds (default 2)
#
# Example (two builds made on another machine and carried in .cudawork by
# tools/perf/carry.sh; the third variant a developer build, `make cuda-dev`,
# with the HC launches left out of its decode graph):
#   sh tools/perf/ab_bench.sh $OUT/ab main=.cudawork/b/main/build/cuda/bin \
#       new=.cudawork/b/new/build/cuda/bin abl=build/dev/cuda/bin:DS4_CUDA_ABLATE=hc_mix
# OUTDIR/ab.txt (written anew) gets one line a run: name, round, the benchmark's result line;
# OUTDIR/summary.txt one line a variant: the mean prefill and generation
# t/s over its rounds (of the result lines that have them), and the runs.
set -u
OUT=${1:?usage: ab_bench.sh OUTDIR NAME=BINDIR[:VAR=VALUE,...]...}
shift
[ $# -gt 0 ] || { echo "ab_bench.sh: no variants" >&2; exit 2; }
for v in "$@"; do
    case $v in
    *=*) ;;
    *) echo "ab_bench.sh: '$v' is not NAME=BINDIR[:VAR=VALUE,...]" >&2; exit 2;;
    esac
    bin=${v#*=}; bin=${bin%%:*}
    [ -x "$bin/ds4-bench" ] || { echo "ab_bench.sh: no ds4-bench in '$bin'" >&2; exit 2; }
done
ARGS=${BENCH_ARGS:---synthetic q2 --ctx-start 4096 --ctx-max 4096 --gen-tokens 64}
mkdir -p "$OUT"
: > "$OUT/ab.txt"
run_variant() { # run_variant ROUND VARIANT
    name=${2%%=*}; rest=${2#*=}; bin=${rest%%:*}; envs=""
    [ "$rest" != "$bin" ] && envs=$(echo "${rest#*:}" | tr ',' ' ')
    # shellcheck disable=SC2086 # the settings and arguments are word lists
    line=$(env $envs timeout 300 "$bin/ds4-bench" $ARGS 2>&1 | grep '^ctx' | tr '\n' ' ' | sed 's/ $//')
    echo "$name round $1: ${line:-FAILED}" | tee -a "$OUT/ab.txt"
}
round=1
while [ "$round" -le "${REPEAT:-2}" ]; do
    first=$(( (round - 1) % $# )) # this round's order: variants first.., then ..first - 1
    i=0
    for v in "$@"; do
        [ "$i" -ge "$first" ] && run_variant "$round" "$v"
        i=$((i + 1))
    done
    i=0
    for v in "$@"; do
        [ "$i" -lt "$first" ] && run_variant "$round" "$v"
        i=$((i + 1))
    done
    round=$((round + 1))
done
# the means, per variant, in the order given
for v in "$@"; do
    name=${v%%=*}
    awk -v n="$name" '
        index($0, n " round ") == 1 {
            runs++
            if (match($0, /prefill +[0-9]+ tokens +[0-9.]+ t\/s/)) { f = substr($0, RSTART, RLENGTH); split(f, a, " +"); p += a[4]; np++ }
            if (match($0, /generate +[0-9]+ tokens +[0-9.]+ t\/s/)) { f = substr($0, RSTART, RLENGTH); split(f, a, " +"); g += a[4]; ng++ }
        }
        END {
            printf "%s: prefill %s t/s, generate %s t/s (%d runs, %d with numbers)\n", n,
                np ? sprintf("%.1f", p / np) : "-", ng ? sprintf("%.2f", g / ng) : "-", runs, ng
        }' "$OUT/ab.txt"
done | tee "$OUT/summary.txt"
