#!/bin/sh
# cuda_build.sh - the CUDA build (`make cuda`: the library with the CUDA
# backend, every program, the GPU test programs) compiles with warnings as
# errors, whenever nvcc is installed; skipped otherwise.  Running the GPU
# tests needs a GPU: `make test-cuda`.
set -eu
cd "$(dirname "$0")/../.."
NVCC=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
if ! [ -x "$NVCC" ] && ! command -v nvcc >/dev/null 2>&1; then
    echo "skip: no nvcc"
    exit 0
fi
make -j2 cuda
for p in build/cuda/bin/ds4-bench build/cuda/bin/ds4-forward build/cuda/test_cuda build/cuda/test_cuda_kernels; do
    [ -x "$p" ] || { echo "missing $p"; exit 1; }
done
echo "ok: make cuda"
