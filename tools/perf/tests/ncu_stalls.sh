#!/bin/sh
# ncu_stalls.sh - tools/perf/ncu_stalls.py, the summary of Nsight Compute's
# warp-state sampling by instruction, on a small CSV in the layout
# `ncu --page source --csv --print-source sass` writes (a line naming the
# kernel, the header, a row per instruction; empty cells for no samples):
# the reasons and opcodes in percent of all samples, predicates and
# modifiers dropped from the opcodes, "(Not Issued)" columns not counted
# twice, the top instructions in order; a CSV without the header, without
# the sampling column or without samples is refused with a message.
set -eu
cd "$(dirname "$0")/../../.."
dir=build/perf/ncu_stalls
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "ncu_stalls: FAIL: $*" >&2; exit 1; }
PY=${PYTHON:-python3}

cat > "$dir/src.csv" <<'EOF'
"Kernel Name","void k<16>(args)",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","stall_long_sb","stall_short_sb","stall_wait","stall_short_sb (Not Issued)"
"0x10","      IMMA.16832.S8.S8 R44, R48.ROW, R32.COL, RZ","50","40","0","40","10","40"
"0x20","@!P2  IMAD R2, R3, R4, R5","30","20","5","","25","0"
"0x30","      IMAD.SHL.U32 R9, R29, 0x4, RZ","15","15","15","0","0","0"
"0x40","      LDS R1, [R2]","5","","","","5",""
"0x50","      EXIT","","","","","",""
EOF
$PY tools/perf/ncu_stalls.py "$dir/src.csv" 3 > "$dir/out.md" || fail "refused a valid CSV"

want='void k<16>(args): 5 instructions, 100 samples

| stall reason | % of samples |
|---|---|
| short_sb | 40.0 |
| wait | 40.0 |
| long_sb | 20.0 |

| opcode | instructions | % of samples | main reasons |
|---|---|---|---|
| IMMA | 1 | 50.0 | short_sb 40.0, wait 10.0 |
| IMAD | 2 | 45.0 | wait 25.0, long_sb 20.0 |
| LDS | 1 | 5.0 | wait 5.0 |

| address | % of samples | instruction |
|---|---|---|
| 0x10 | 50.0 | `IMMA.16832.S8.S8 R44, R48.ROW, R32.COL, RZ` |
| 0x20 | 30.0 | `@!P2  IMAD R2, R3, R4, R5` |
| 0x30 | 15.0 | `IMAD.SHL.U32 R9, R29, 0x4, RZ` |'
got=$(cat "$dir/out.md")
[ "$got" = "$want" ] || fail "summary is
$got
expected
$want"

refused() { # file, text the message must hold
    status=0
    $PY tools/perf/ncu_stalls.py "$1" > "$dir/err.out" 2> "$dir/err" || status=$?
    [ "$status" != 0 ] || fail "$1 was not refused"
    grep -q "$2" "$dir/err" || fail "$1: message '$(cat "$dir/err")' lacks '$2'"
}
printf '"Kernel Name","k"\n"a","b"\n' > "$dir/nohdr.csv"
refused "$dir/nohdr.csv" "no header row"
printf '"Kernel Name","k"\n"Address","Source","stall_wait"\n"0x10","NOP","1"\n' > "$dir/nocol.csv"
refused "$dir/nocol.csv" "SourceCounters"
printf '"Kernel Name","k"\n"Address","Source","Warp Stall Sampling (All Samples)","stall_wait"\n"0x10","NOP","",""\n' > "$dir/empty.csv"
refused "$dir/empty.csv" "no samples"
echo "ok: ncu_stalls.py"
