#!/usr/bin/env bash
# The CPU time of a clean build: configure SRC into a fresh BUILD folder (CPU-only, Release, ccache
# off) and build TARGET (default: every target) with -j2, every compile timed. Prints the build's CPU
# time (user + system, /usr/bin/time), its wall time, the load average before and after (CPU time is
# what to compare on a shared machine: it moves little with the load, wall time moves with it), the
# CPU time per target and the costliest files. Figures and their commands: docs/benchmarks.md
# "Build time".
#
#   bench/build_time.sh [SRC] [BUILD] [TARGET]      (defaults: this checkout, build-time, all)
#
# Before and after a change, side by side on one machine: run it on two checkouts (e.g.
# `git worktree add /tmp/before REV`) with two BUILD folders, at the same time or one after the other.
# BUILD is deleted first, so it must be absent or a folder this script made.
#
# The script is also its own compiler launcher: CMake runs it (FASTUDY_CCACHE) with the compile
# command while FASTUDY_BUILD_TIME_LOG names the log, and it appends "user system wall object".
set -euo pipefail

if [ -n "${FASTUDY_BUILD_TIME_LOG:-}" ]; then
  # Configure asks the launcher for ccache's sloppiness (CMakeLists.txt): there is none.
  [ "${1:-}" = "--get-config" ] && exit 0
  object="" previous=""
  for arg in "$@"; do
    [ "$previous" = "-o" ] && object=$arg
    previous=$arg
  done
  exec /usr/bin/time -a -o "$FASTUDY_BUILD_TIME_LOG" -f "%U %S %e $object" "$@"
fi

self=$(readlink -f "$0")
src=$(readlink -f "${1:-$(dirname "$self")/..}")
build=$(readlink -m "${2:-build-time}")
target=${3:-all}
[ -x /usr/bin/time ] || { echo "build_time: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
if [ -e "$build" ] && [ ! -e "$build/.fastudy-build-time" ]; then
  echo "build_time: $build exists and was not made by this script; name another BUILD folder" >&2
  exit 2
fi
rm -rf "$build"
mkdir -p "$build"
touch "$build/.fastudy-build-time"
log=$build/compiles.log
export FASTUDY_BUILD_TIME_LOG=$log CCACHE_DISABLE=1

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DFASTUDY_CUDA=OFF -DFASTUDY_CCACHE="$self" > "$build/configure.log"
/usr/bin/time -o "$build/build.time" -f "%U %S %e" cmake --build "$build" -j2 --target "$target" > "$build/build.log"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

read -r user sys wall < "$build/build.time"
echo "build_time: $src, target $target: $(awk -v u="$user" -v s="$sys" 'BEGIN { print u + s }') s of CPU" \
     "(user $user, system $sys), $wall s wall; load average $load_before before, $load_after after"
# Per target (the CMakeFiles/<target>.dir of each object) and the ten costliest compiles.
awk 'NF == 4 && $1 ~ /^[0-9.]+$/ {
       cpu = $1 + $2; total += cpu; n++
       t = $4; sub(/^.*CMakeFiles\//, "", t); sub(/\.dir\/.*$/, "", t); by[t] += cpu
     }
     END {
       printf "compiles: %d files, %.0f s of CPU; by target:", n, total
       for (t in by) printf " %s %.0f", t, by[t]
       printf "\n"
     }' "$log"
echo "costliest compiles (s of CPU, object):"
awk 'NF == 4 && $1 ~ /^[0-9.]+$/ { printf "%8.1f %s\n", $1 + $2, $4 }' "$log" | sort -rn | sed -n 1,10p
