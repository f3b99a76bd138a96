#!/bin/sh
# Run the C++ pairwise W1 benchmark and scipy.stats.wasserstein_distance on the same data, in one run,
# and print the speed-up, the agreement of the values and the bandwidth floor.
#   bench/analysis/run_w1_vs_scipy.sh BUILD_DIR [PAIRS]
# PAIRS: how many pairs scipy times before extrapolating to all 276 (default 12), or "all" (~5 min).
set -eu
build=${1:?usage: run_w1_vs_scipy.sh BUILD_DIR [PAIRS]}
pairs=${2:-12}
here=$(cd "$(dirname "$0")" && pwd)
bin=$(find "$build" -name bench_wasserstein -type f -perm -u+x | head -n 1)
if [ -z "$bin" ]; then
  echo "run_w1_vs_scipy.sh: no bench_wasserstein under $build" >&2
  echo "hint: cmake --build $build -j2 --target bench_wasserstein" >&2
  exit 2
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" --export "$dir" --reps 3
/usr/bin/python3 "$here/compare_scipy.py" "$dir" --pairs "$pairs"
