#!/usr/bin/env bash
# Set up (install + build) and run the whole test suite: unit tests, MPI tests under mpirun with 1, 2
# and 4 ranks, and end-to-end runs of the CLI. Usage: scripts/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
# What only the tests need: PyTorch (Debian's python3-torch, on the LibTorch already installed) to
# write torch.save files and run examples/pytorch; headless Chromium to lay the report out at 1280x800
# (tests/report/test_browser.py); clang with libFuzzer and the sanitizers' runtimes for the fuzz
# harnesses of the readers of untrusted files (tests/fuzz).
# The CUDA parts wherever nvcc is found (setup.sh alone builds them only where a GPU is visible).
FASTUDY_SETUP_CUDA=AUTO FASTUDY_EXTRA_PACKAGES="python3-torch chromium clang libclang-rt-dev ${FASTUDY_EXTRA_PACKAGES:-}" \
  scripts/setup.sh "$build_dir"
# Everything else (the tests, the benchmarks), on top of the program setup.sh built.
cmake --build "$build_dir" -j2
# A single-node Slurm (munge, slurmctld, slurmd) for the real-Slurm test; the test starts and stops it.
if [ "$(id -u)" -eq 0 ]; then
  bash scripts/slurm-local.sh install || echo "test: Slurm could not be installed; the real-Slurm test will skip"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ctest --test-dir "$build_dir" --output-on-failure -j2 --timeout 900
