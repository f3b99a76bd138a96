#!/bin/sh
# The radix sort of this tree against the one of COMMIT, side by side in one process on the same values
# (N(0, 0.02) weights; interleaved, medians), at the sizes a reduce sorts: GPT-2's tensors (0.59M-2.4M
# values), 2^24 (what `fastudy plan` times), 2^25 and 2^27 (whole models' shares) and 2^24 in sorted
# runs of 2^20 (the whole model's sort).
#   bench/analysis/radix_sort_against.sh COMMIT [N ...]
set -eu
commit=${1:?usage: radix_sort_against.sh COMMIT [N ...]}
shift
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/analysis"
git -C "$root" show "$commit:analysis/radix_sort.cpp" > "$dir/analysis/radix_sort.cpp"
flags="-O3 -DNDEBUG -std=c++17"
# The other commit's sort in namespace fastudy_before (its headers are this tree's: the interface is
# the same), this tree's as it is.
g++ $flags -I"$root" -Dfastudy=fastudy_before -c "$dir/analysis/radix_sort.cpp" -o "$dir/before.o"
g++ $flags -I"$root" -Dfastudy=fastudy_before -DSORT_SIDE=before -c "$root/bench/analysis/radix_sort_against.cpp" -o "$dir/side_before.o"
g++ $flags -I"$root" -c "$root/analysis/radix_sort.cpp" -o "$dir/after.o"
g++ $flags -I"$root" -DSORT_SIDE=after -c "$root/bench/analysis/radix_sort_against.cpp" -o "$dir/side_after.o"
g++ $flags -I"$root" "$root/bench/analysis/radix_sort_against.cpp" "$dir/before.o" "$dir/side_before.o" "$dir/after.o" \
  "$dir/side_after.o" -o "$dir/radix_sort_against"
if [ $# -gt 0 ]; then
  for n in "$@"; do "$dir/radix_sort_against" "$n"; done
else
  for n in 589824 1769472 2359296 16777216 33554432 134217728; do "$dir/radix_sort_against" "$n"; done
  "$dir/radix_sort_against" 16777216 1048576
fi
