#!/usr/bin/env bash
# Run a command in a private mount namespace in which the system's Open MPI, parallel HDF5, Boost,
# toml++, GoogleTest and Google Benchmark are hidden: an empty tmpfs over their folders, /dev/null
# over their libraries and programs, and a loader cache rebuilt without them. A stand-in for a GPU
# image that lacks them, to rehearse the offline path of scripts/gpu-check.sh on a Debian machine
# that has them installed:
#
#   tests/scripts/hide-system-deps.sh scripts/gpu-check.sh --rehearse --packages DIR --build /tmp/b
#
# Root only (unshare -m); nothing outside the namespace changes, and it ends with the command.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "hide-system-deps: needs root (unshare -m)" >&2; exit 2; }
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
# shellcheck disable=SC2016  # the inner script expands its own variables
exec unshare -m --propagation private bash -c '
set -euo pipefail
L=/usr/lib/$1
shift
for d in $L/openmpi $L/pmix2 $L/hdf5 $L/hwloc /usr/include/hdf5 /usr/include/boost /usr/include/toml++ \
         /usr/include/gtest /usr/include/gmock /usr/include/benchmark /usr/share/openmpi /etc/openmpi \
         $L/cmake/Boost-* $L/cmake/boost_* $L/cmake/tomlplusplus $L/cmake/GTest $L/cmake/benchmark \
         /usr/include/nlohmann /usr/share/cmake/nlohmann_json; do
  if [ -d "$d" ]; then mount -t tmpfs none "$d"; fi
done
for f in $L/libmpi*.so* $L/libopen-rte.so* $L/libopen-pal.so* $L/libhdf5_openmpi*.so* $L/libpmix.so* \
         $L/libhwloc.so* $L/libevent*.so* $L/libboost_program_options.so* $L/libtomlplusplus.so* \
         $L/libgtest*.so* $L/libgmock*.so* $L/libbenchmark*.so* /usr/bin/opal_wrapper /usr/bin/orterun \
         /usr/bin/h5pcc.openmpi; do
  if [ -e "$f" ] && [ ! -L "$f" ]; then mount --bind /dev/null "$f"; fi
done
cache=$(mktemp)
ldconfig -X -C "$cache" 2>/dev/null  # -X: links stay as they are (the hidden folders are not gone)
mount --bind "$cache" /etc/ld.so.cache
exec "$@"' hide-system-deps "$multiarch" "$@"
