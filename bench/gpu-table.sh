#!/bin/sh
# The GPU path's speed in one command on a GPU machine: the GPU rows of bench_train run once, side by
# side, printed as one table of ratios (ours vs SDPA flash, fastudy's step vs plain LibTorch, emulated
# vs native, GPT-2 small tokens/s); bench/gpu_table.py says which rows and aims.
#   bench/gpu-table.sh BUILD_DIR [OUTDIR]      (OUTDIR default BUILD_DIR/gpu-table: JSON and table.md)
# Needs bench_train built with CUDA LibTorch and the CUDA kernels (scripts/gpu-check.sh builds it).
# Exit status: 0 every figure measured; 1 a figure missing or the benchmark failed; 2 bad usage.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
python=$(command -v python3 || true)
[ -n "$python" ] || { echo "gpu-table: no python3 on PATH" >&2; exit 2; }
exec "$python" "$here/gpu_table.py" "$@"
