#!/usr/bin/env bash
# Runs one libFuzzer harness of tests/fuzz from its seeds and regression inputs: RUNS executions from
# seed 1 (reproducible: the same inputs in the same order every time), or, with RUNS = 0, for SECONDS
# (the long runs by hand). The new inputs it finds go to WORK/corpus (emptied first), a crash, leak,
# timeout or out-of-memory input to WORK/artifacts/; exit 0 when there was no finding. The last lines
# are libFuzzer's statistics (stat::number_of_executed_units: the executions).
#   run_fuzzer.sh HARNESS SEEDS REGRESSIONS RUNS WORK SECONDS
set -euo pipefail
[ $# -eq 6 ] || { echo "usage: run_fuzzer.sh HARNESS SEEDS REGRESSIONS RUNS WORK SECONDS" >&2; exit 2; }
harness=$1 seeds=$2 regressions=$3 runs=$4 work=$5 seconds=$6
rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts" "$work/tmp"
corpora=("$work/corpus" "$seeds")
[ -d "$regressions" ] && corpora+=("$regressions")
limit=(-max_total_time="$seconds")
[ "$runs" -gt 0 ] && limit+=(-runs="$runs")
# Leaks are not findings of a reader (HDF5 and LibTorch keep caches for the life of the process); the
# heap is bounded per input instead (-malloc_limit_mb: FASTUDY_FUZZ_MALLOC_LIMIT_MB, 2048 by default,
# 16384 for the HDF5 harness, whose reader process allocates what libhdf5 asks for from a file's
# metadata before the read past the file's end fails), as the time is (-timeout).
malloc_limit=2048
[ "$(basename "$harness")" = fuzz_hdf5 ] && malloc_limit=16384
malloc_limit=${FASTUDY_FUZZ_MALLOC_LIMIT_MB:-$malloc_limit}
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
export TMPDIR="$work/tmp"
exec "$harness" -seed=1 "${limit[@]}" -timeout=20 -rss_limit_mb=3072 -malloc_limit_mb="$malloc_limit" -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${corpora[@]}"
