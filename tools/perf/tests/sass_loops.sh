#!/bin/sh
# sass_loops.sh - tools/perf/sass_loops.py, the finder of loops that wait a
# memory round trip per iteration, on a small listing in the layout
# `cuobjdump -sass` prints: a loop with one global load is reported (with
# its kernel, address range, length and load), loops with several loads,
# with cp.async (LDGSTS) only, longer than --max-len or branching forward
# are not; a listing without a function is refused with a message.
set -eu
cd "$(dirname "$0")/../../.."
dir=build/perf/sass_loops
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "sass_loops: FAIL: $*" >&2; exit 1; }
PY=${PYTHON:-python3}

cat > "$dir/k.sass" <<'EOF'
	code for sm_90a
		Function : _Z6serialPKfPf
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                       /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_TID.X ;                           /* 0x0000000000007919 */
        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;                 /* 0x0000000404027981 */
        /*0030*/                   STS [R3], R2 ;                               /* 0x0000000203007388 */
        /*0040*/                   IADD3 R0, R0, 0x100, RZ ;                    /* 0x0000010000007810 */
        /*0050*/                   ISETP.GE.AND P0, PT, R0, 0x400, PT ;         /* 0x000004000000780c */
        /*0060*/              @!P0 BRA 0x20 ;                                   /* 0xfffffffc00008947 */
        /*0070*/                   BRA 0x90 ;                                   /* 0x0000000000007947 */
        /*0080*/                   NOP ;                                        /* 0x0000000000007918 */
        /*0090*/                   EXIT ;                                       /* 0x000000000000794d */
		..........
		Function : _Z7batchedPKfPf
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;             /* 0x0000000402047981 */
        /*0010*/                   LDG.E.128 R8, desc[UR4][R2.64+0x10] ;        /* 0x0000100402087981 */
        /*0020*/                   STS.128 [R12], R4 ;                          /* 0x000000040c007388 */
        /*0030*/                   STS.128 [R12+0x10], R8 ;                     /* 0x000010080c007388 */
        /*0040*/              @P0 BRA 0x0 ;                                     /* 0xfffffffc00000947 */
        /*0050*/                   LDGSTS.E.BYPASS.128 [R13], desc[UR4][R2.64] ; /* 0x0000000002 */
        /*0060*/                   LDGDEPBAR ;                                  /* 0x00000000000079af */
        /*0070*/              @P1 BRA 0x50 ;                                    /* 0xfffffffc00001947 */
        /*0080*/                   LDG.E R2, desc[UR4][R4.64] ;                 /* 0x0000000404027981 */
        /*0090*/                   FADD R6, R6, R2 ;                            /* 0x0000000206067221 */
        /*00a0*/                   IADD3 R4, P2, R4, 0x4, RZ ;                  /* 0x0000000404047810 */
        /*00b0*/                   IADD3 R7, R7, -0x1, RZ ;                     /* 0x0000000107077810 */
        /*00c0*/                   ISETP.NE.AND P2, PT, R7, RZ, PT ;            /* 0x000000000700720c */
        /*00d0*/              @P2 BRA 0x80 ;                                    /* 0xfffffffc00002947 */
        /*00e0*/                   EXIT ;                                       /* 0x000000000000794d */
		..........
EOF
$PY tools/perf/sass_loops.py "$dir/k.sass" > "$dir/out.txt" || fail "refused a valid listing"
want='_Z6serialPKfPf 0x20-0x60 5 instructions: LDG.E R2, desc[UR4][R4.64]
_Z7batchedPKfPf 0x80-0xd0 6 instructions: LDG.E R2, desc[UR4][R4.64]'
got=$(cat "$dir/out.txt")
[ "$got" = "$want" ] || fail "report is
$got
expected
$want"

# --max-len drops the longer loop; standard input works as the file does
got=$($PY tools/perf/sass_loops.py --max-len 5 < "$dir/k.sass")
[ "$got" = '_Z6serialPKfPf 0x20-0x60 5 instructions: LDG.E R2, desc[UR4][R4.64]' ] || fail "--max-len 5 gave
$got"

refused() { # input file, text the message must hold
    status=0
    $PY tools/perf/sass_loops.py "$1" > "$dir/err.out" 2> "$dir/err" || status=$?
    [ "$status" = 2 ] || fail "$1: exit status $status, not 2"
    grep -q "$2" "$dir/err" || fail "$1: message '$(cat "$dir/err")' lacks '$2'"
}
printf 'LDG.E R2, desc[UR4][R4.64] ;\n' > "$dir/nofunc.sass"
refused "$dir/nofunc.sass" "not the output of cuobjdump -sass"
refused "$dir/missing.sass" "No such file"
echo "ok: sass_loops.py"
