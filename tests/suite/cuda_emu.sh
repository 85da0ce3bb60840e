#!/bin/sh
# cuda_emu.sh - the CUDA backend's tests on the CPU emulation of CUDA
# (tests/cuda/emu): the backend's .cu sources compiled as C++ run their
# kernels on the CPU, so CI checks the GPU code's logic against the CPU
# reference and the HF goldens without a GPU (the QUICK subset of
# tests/cuda/run.sh; the full set runs on a GPU with `make test-cuda`).
set -eu
cd "$(dirname "$0")/../.."
command -v "${CXX:-g++}" >/dev/null 2>&1 || { echo "skip: no C++ compiler"; exit 0; }
make -j2 build/emu/test_cuda build/emu/test_cuda_kernels ds4-mkmodel
QUICK=1 tests/cuda/run.sh build/emu
