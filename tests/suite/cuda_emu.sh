#!/bin/sh
# cuda_emu.sh - the CUDA backend's tests on the CPU emulation of CUDA
# (tests/cuda/emu): the backend's .cu sources compiled as C++ run their
# kernels on the CPU, so the default suite checks the GPU code's logic
# against the CPU reference without a GPU.  The `smoke` subset of
# tests/cuda/run.sh (its comment says what it covers and why); the whole
# emulation set is `make test-cuda-emu`, the GPU set `make test-cuda`.
set -eu
cd "$(dirname "$0")/../.."
. tests/suite/lib/suite.sh
command -v "${CXX:-g++}" >/dev/null 2>&1 || skip "no C++ compiler (${CXX:-g++}) for the emulation"
make -j2 build/emu/test_cuda build/emu/test_cuda_kernels build/emu/test_emu build/emu/bin/ds4-forward ds4-mkmodel
tests/cuda/run.sh build/emu smoke
