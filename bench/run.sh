#!/bin/sh
# Every benchmark of fastudy in one run (a few minutes on 2 cores), printed as one table: figure, our
# value, the anchor measured in the same run, the ratio, the aim. docs/benchmarks.md's benchmark table is its
# output.
#   bench/run.sh [BUILD_DIR]          (default: build; the benchmarks must be built)
# Each benchmark checks its kernel before timing it (see bench/kernels/bench_attention.cpp); a figure
# whose benchmark failed or was skipped reads "n/a" with the reason below the table.
set -eu
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
exec /usr/bin/python3 "$here/table.py" "$build"
