#!/bin/sh
# cuda_build.sh - the CUDA build (`make cuda`: the library with the CUDA
# backend, every program, the GPU test programs) and its developer flavour
# (`make cuda-dev`, -DDS4_CUDA_DEV: the profiling and ablation switches;
# here its library and ds4-bench) compile with warnings as errors,
# whenever nvcc is installed; skipped (SKIP) otherwise.  A release binary
# must not read the developer switches: no DS4_CUDA_ variable may appear in
# its strings.  Running the GPU tests needs a GPU: `make test-cuda`.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if ! [ -x "$NVCC" ] && ! command -v nvcc >/dev/null 2>&1; then
    skip "no nvcc (the CUDA toolkit: $NVCC, or nvcc on the PATH)"
fi
make -j2 cuda
for p in build/cuda/bin/ds4-bench build/cuda/bin/ds4-forward build/cuda/test_cuda build/cuda/test_cuda_kernels; do
    [ -x "$p" ] || { echo "missing $p"; exit 1; }
done
if strings build/cuda/bin/ds4-bench build/cuda/bin/ds4 build/cuda/bin/ds4-server | grep DS4_CUDA_; then
    echo "a release binary names a developer switch"
    exit 1
fi
echo "ok: make cuda"
# the developer flavour: its library and one program that reads its switches
# (the other programs link the same library; building them all again, the
# kernel test's nvcc compile among them, doubled this item's time)
make -j2 BUILD=build/dev CUDA_DEV=1 build/dev/cuda/bin/ds4-bench
strings build/dev/cuda/bin/ds4-bench | grep -q DS4_CUDA_PROFILE || { echo "the developer build reads no DS4_CUDA_PROFILE"; exit 1; }
echo "ok: the developer build (library and ds4-bench)"
