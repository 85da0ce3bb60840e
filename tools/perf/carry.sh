#!/bin/sh
# carry.sh - CUDA builds made on a development machine, carried to a GPU
# machine and run there (compile where no GPU is needed, keep the GPU for
# what needs it).
#
#   sh tools/perf/carry.sh pack NAME [TREE]
#       the binaries of TREE's build/cuda (default: this checkout; a git
#       worktree of another commit works too) - ds4-bench, ds4-mkmodel, the
#       two test programs, the programs tests/cuda/apps.sh runs (ds4,
#       ds4-server, ds4-tokenizer), ds4-direction, ds4-eval and ds4-forward
#       (tests/cuda/dist.sh) - debug sections stripped, and the
#       commit they were built from,
#       into .cudawork/NAME.tar.xz of this checkout (.cudawork is the folder
#       to copy to the GPU machine)
#   sh tools/perf/carry.sh unpack NAME [install]
#       on the GPU machine: into .cudawork/b/NAME/build/cuda (its bin/ is a
#       BINDIR for ab_bench.sh); with install, also into build/cuda, and the
#       commit into .cudawork/COMMIT, where gpu_session.sh reads it
#
# Example: two builds timed against each other, the second then tested:
#   sh tools/perf/carry.sh pack base ../wt-base; sh tools/perf/carry.sh pack new
#   (on the GPU machine) sh tools/perf/carry.sh unpack base && sh tools/perf/carry.sh unpack new install &&
#       sh tools/perf/ab_bench.sh $OUT/ab base=.cudawork/b/base/build/cuda/bin new=.cudawork/b/new/build/cuda/bin &&
#       PARTS="tests san" sh tools/perf/gpu_session.sh $OUT/s
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
case ${1:-} in
pack)
    NAME=${2:?usage: carry.sh pack NAME [TREE]}
    TREE=$(cd "${3:-$ROOT}" && pwd)
    mkdir -p "$ROOT/.cudawork"
    git -C "$TREE" rev-parse HEAD > "$TREE/build/cuda/COMMIT"
    # debug sections stripped: what is carried to the GPU machine travels
    # with the working tree under a size limit
    S=$(mktemp -d)
    trap 'rm -rf "$S"' EXIT
    mkdir -p "$S/build/cuda/bin"
    cp "$TREE/build/cuda/COMMIT" "$S/build/cuda/"
    for f in bin/ds4-bench bin/ds4-mkmodel bin/ds4 bin/ds4-server bin/ds4-tokenizer bin/ds4-direction \
        bin/ds4-eval bin/ds4-forward test_cuda test_cuda_kernels; do
        strip --strip-debug -o "$S/build/cuda/$f" "$TREE/build/cuda/$f"
    done
    # one dictionary over every file: each binary holds the same device code
    tar -C "$S" -cf - build | xz -6 --lzma2=preset=6,dict=192MiB -T1 > "$ROOT/.cudawork/$NAME.tar.xz"
    echo "$(du -h "$ROOT/.cudawork/$NAME.tar.xz" | cut -f1)"
    echo "$ROOT/.cudawork/$NAME.tar.xz: $(git -C "$TREE" log -1 --format='%h %s')";;
unpack)
    NAME=${2:?usage: carry.sh unpack NAME [install]}
    mkdir -p "$ROOT/.cudawork/b/$NAME"
    tar -C "$ROOT/.cudawork/b/$NAME" -xJf "$ROOT/.cudawork/$NAME.tar.xz"
    if [ "${3:-}" = install ]; then
        mkdir -p "$ROOT/build/cuda/bin"
        cp -a "$ROOT/.cudawork/b/$NAME/build/cuda/." "$ROOT/build/cuda/"
        cp "$ROOT/.cudawork/b/$NAME/build/cuda/COMMIT" "$ROOT/.cudawork/COMMIT"
    fi;;
*)
    echo "usage: carry.sh pack NAME [TREE] | unpack NAME [install]" >&2
    exit 2;;
esac
