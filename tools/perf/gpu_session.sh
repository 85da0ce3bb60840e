#!/bin/sh
# gpu_session.sh OUTDIR - what a run on a GPU machine checks and measures,
# in one command: the GPU tests, compute-sanitizer memcheck on the kernel
# test and a short comparison, and the synthetic full Flash benchmark.
# Expects the CUDA build (make cuda) in build/cuda, and for the prof part
# the developer build (make cuda-dev) in build/dev/cuda; logs and the
# benchmark CSV go to OUTDIR.  Each part has its own time limit.
#   PARTS="tests san prof ncu ncustep ncusrc bench mtp par offload imx pro"
#             which parts, in this order (default: tests san prof bench)
#             mtp      the MTP benchmark: a 1-row step, and verify steps of
#                      N + 1 rows with every draft accepted, N = MTP_DRAFTS
#             par      many sessions at once (PAR_LIST sessions of 4k each,
#                      then a 32k prompt arriving among 16 decoders)
#             offload  decode with the routed experts beyond GPU_MEMS (each
#                      a --gpu-mem, or free: the default) in host RAM
#             imx      prefill with and without imatrix collection
#             pro      a slice of the Pro shape (PRO_LAYERS) and the
#                      whole model's projection
#   SLICE     extra ds4-bench arguments of the bench, mtp, par and imx parts,
#             e.g. "--layers 0:29": a slice of the model that fits a GPU
#             smaller than the whole (ds4-bench then also projects the
#             whole model's rate)
#   TESTS_TIME, PROF_TIME, BENCH_TIME, NCU_TIME   their time limits in seconds
#   PROF_MODE  DS4_CUDA_PROFILE of the prof part: 1 per kernel (default), 2 per kernel and grid
#   NCU_CTX   the context of the ncustep run (default 1024)
#   NCU_KERNEL, NCU_SKIP   ncusrc: the kernel (an ncu --kernel-name regex over
#             demangled names) and how many of its launches to skip first
#   BUILD_COMMIT   a file naming the commit the binaries were built from
#             (default .cudawork/COMMIT): a build carried to the GPU
#             machine need not be of the checkout's commit there
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: gpu_session.sh OUTDIR}
PARTS=${PARTS:-tests san prof bench}
mkdir -p "$OUT"
BC=${BUILD_COMMIT:-.cudawork/COMMIT}
{
    date -u
    if [ -f "$BC" ]; then echo "binaries built from commit $(cat "$BC")"; else echo "checkout at $(git log -1 --format=%H 2>/dev/null)"; fi
    nvidia-smi
    nproc
} > "$OUT/machine.txt" 2>&1
for part in $PARTS; do
    case $part in
    tests)
        timeout ${TESTS_TIME:-300} tests/cuda/run.sh build/cuda > "$OUT/tests.log" 2>&1; echo "tests: rc $?";;
    san)
        {
            timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 build/cuda/test_cuda_kernels; echo "rc $?"
            T=$(mktemp -d)
            build/cuda/bin/ds4-mkmodel -q --recipe q2 --seed 11 -o "$T/q2.gguf"
            timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 build/cuda/test_cuda compare "$T/q2.gguf" --loose --prompt 70 --steps 6; echo "rc $?"
            rm -rf "$T"
        } > "$OUT/sanitizer.log" 2>&1; echo "sanitizer: $(grep -c '^rc 0' "$OUT/sanitizer.log")/2 clean";;
    prof)
        DS4_CUDA_PROFILE=${PROF_MODE:-1} timeout ${PROF_TIME:-120} build/dev/cuda/bin/ds4-bench --synthetic q2 --ctx-start 4096 --ctx-max 4096 \
            --gen-tokens 8 > "$OUT/profile.log" 2>&1; echo "profile: rc $?";;
    ncu)
        timeout 100 ncu --clock-control none --kernel-name gemv_kernel --launch-skip 40 --launch-count 3 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
            build/cuda/bin/ds4-bench --synthetic q2 --ctx-start 64 --ctx-max 64 --gen-tokens 2 > "$OUT/ncu.log" 2>&1
        echo "ncu: rc $?";;
    ncustep)
        # every kernel of a short run, one at a time: tools/perf/ncu_table.py
        # turns the CSV into the per-kernel table of one decode step
        timeout ${NCU_TIME:-330} ncu --csv --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
            build/cuda/bin/ds4-bench --synthetic q2 --ctx-start ${NCU_CTX:-1024} --ctx-max ${NCU_CTX:-1024} --gen-tokens 3 > "$OUT/ncustep.csv" 2> "$OUT/ncustep.err"
        echo "ncustep: rc $?"
        python3 tools/perf/ncu_table.py "$OUT/ncustep.csv" > "$OUT/ncustep.md" && gzip -f "$OUT/ncustep.csv";;
    ncusrc)
        # where one launch of one kernel waits, by instruction: tools/perf/ncu_stalls.py
        timeout ${NCU_TIME:-200} ncu --clock-control none --kernel-name-base demangled \
            --kernel-name "regex:${NCU_KERNEL:-gemm_q_kernel}" --launch-skip ${NCU_SKIP:-2} --launch-count 1 \
            --section SourceCounters --section WarpStateStats -o "$OUT/ncusrc" \
            build/cuda/bin/ds4-bench --synthetic q2 --ctx-start 4096 --ctx-max 4096 --gen-tokens 1 > "$OUT/ncusrc.log" 2>&1
        echo "ncusrc: rc $?"
        ncu --import "$OUT/ncusrc.ncu-rep" --page source --csv --print-source sass > "$OUT/ncusrc.csv" 2>> "$OUT/ncusrc.log" &&
            python3 tools/perf/ncu_stalls.py "$OUT/ncusrc.csv" > "$OUT/ncusrc.md" && gzip -f "$OUT/ncusrc.csv"
        rm -f "$OUT/ncusrc.ncu-rep";;
    bench)
        timeout ${BENCH_TIME:-240} build/cuda/bin/ds4-bench --synthetic q2 ${SLICE:-} ${BENCH_ARGS:---ctx-start 4096 --ctx-max 65536 --step-incr 61440 --gen-tokens 64} \
            --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1; echo "bench: rc $?";;
    mtp)
        for n in ${MTP_DRAFTS:-1 2 3 4}; do
            timeout ${MTP_TIME:-60} build/cuda/bin/ds4-bench --synthetic q2 ${SLICE:-} --ctx-start 4096 --ctx-max 4096 --gen-tokens 64 \
                --mtp-draft $n --mtp-forced --csv "$OUT/mtp$n.csv" > "$OUT/mtp$n.log" 2>&1; echo "mtp $n: rc $?"
        done;;
    par)
        timeout ${PAR_TIME:-200} build/cuda/bin/ds4-bench --synthetic q2 ${SLICE:-} --parallel ${PAR_LIST:-1,4,8,16,32,64} \
            --session-ctx 4096 --gen-tokens 64 --arrive 32768 --arrive-among 16 --csv "$OUT/par.csv" > "$OUT/par.log" 2>&1
        echo "par: rc $?";;
    offload)
        for g in ${GPU_MEMS:-free 24G}; do
            f="--gpu-mem $g"; [ $g = free ] && f= # free: the GPU's free memory less 1 GiB (the default)
            timeout ${OFFLOAD_TIME:-150} build/cuda/bin/ds4-bench --synthetic q2 $f --ctx-start 4096 --ctx-max 4096 \
                --gen-tokens 32 --csv "$OUT/offload-$g.csv" > "$OUT/offload-$g.log" 2>&1; echo "offload $g: rc $?"
        done;;
    imx)
        for m in plain imatrix; do
            f=; [ $m = imatrix ] && f=--imatrix
            timeout ${IMX_TIME:-90} build/cuda/bin/ds4-bench --synthetic q2 ${SLICE:-} $f --ctx-start 4096 --ctx-max 32768 --step-incr 28672 \
                --gen-tokens 1 --csv "$OUT/imx-$m.csv" > "$OUT/imx-$m.log" 2>&1; echo "imx $m: rc $?"
        done;;
    pro)
        timeout ${PRO_TIME:-120} build/cuda/bin/ds4-bench --synthetic pro-q2 --layers ${PRO_LAYERS:-2:9} --ctx-start 4096 \
            --ctx-max 4096 --gen-tokens 32 --csv "$OUT/pro.csv" > "$OUT/pro.log" 2>&1; echo "pro: rc $?";;
    esac
done
tail -n 3 "$OUT/tests.log" 2>/dev/null; cat "$OUT/bench.log" 2>/dev/null | tail -n 8
