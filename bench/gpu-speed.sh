#!/bin/sh
# The GPU path's checks and figures in one command, on a GPU machine with fastudy built against a CUDA
# LibTorch (scripts/gpu-check.sh builds it; or cmake -DFASTUDY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90):
#   1. the tensor-core kernels and the GPU trainer: test_attention_cuda (device against the host twin,
#      bit for bit; a difference names its block, warp, lane and fragment), test_train_cuda (CUDA-graph
#      steps against steps op by op, bit for bit; the device profile), test_mma_sim and test_tile_math
#      (the same code on the CPU);
#   2. the table of ratios: bench/gpu-table.sh (ours vs SDPA flash, the step vs plain LibTorch, emulated
#      vs native, GPT-2 small);
#   3. where the paper model's step spends its time: fastudy train configs/paper-profile.toml --profile on
#      the GPU, op by op and with --cuda-graph.
#   bench/gpu-speed.sh BUILD_DIR [OUTDIR]      (OUTDIR default BUILD_DIR/gpu-speed; logs and table.md)
# About 3 minutes on an H100/H200 once built. Exit status: 0 all passed and every figure measured, 1 a
# test failed or a figure is missing (every part runs regardless), 2 bad usage.
set -u
[ $# -ge 1 ] && [ $# -le 2 ] || { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
build=$(cd "$1" 2>/dev/null && pwd) || { echo "gpu-speed: no build folder $1" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
out=${2:-$build/gpu-speed}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -x "$build/fastudy" ] || { echo "gpu-speed: $build/fastudy is not built" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
step() { printf '\n==== %s\n' "$*"; }

step "1. GPU tests (tensor-core kernels, trainer) and their CPU twins"
if ! ctest --test-dir "$build" -R 'CudaAttention|TrainCuda|MmaLayout|MmaWarp|MmaKernels|TileMath' \
      --output-on-failure --timeout 900 -j 4 > "$out/ctest.log" 2>&1; then
  status=1
fi
grep -E 'tests passed|tests failed|Failed|\*\*\*|Which is|FAILED' "$out/ctest.log" | head -40
grep -E 'Skipped|no CUDA device' "$out/ctest.log" | head -5

step "2. the table (bench/gpu-table.sh)"
sh "$here/gpu-table.sh" "$build" "$out/table" || status=1

step "3. the paper model's step, phase by phase (configs/paper-profile.toml)"
for graph in "" "--cuda-graph"; do
  rm -rf "$out/profile"
  echo "fastudy train configs/paper-profile.toml --device cuda --profile $graph"
  if ! "$build/fastudy" train "$src/configs/paper-profile.toml" --out "$out/profile" --device cuda --profile $graph \
       > "$out/profile$graph.log" 2>&1; then
    status=1
    tail -20 "$out/profile$graph.log"
  fi
  awk '/^profile of/ { on = 1; print; next } on && /^  / { print; next } { on = 0 }' "$out/profile$graph.log"
done
rm -rf "$out/profile"
printf '\ngpu-speed: %s (logs in %s)\n' "$([ $status -eq 0 ] && echo "all passed" || echo "FAILED: see above")" "$out"
exit $status
