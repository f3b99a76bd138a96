#!/usr/bin/env bash
# Run a command in a private mount namespace in which the system's Open MPI, parallel HDF5, Boost,
# toml++, GoogleTest and Google Benchmark are hidden: an empty tmpfs over their folders, /dev/null
# over their libraries and programs, and a loader cache rebuilt without them. A stand-in for a GPU
# image that lacks them, to rehearse the offline path of scripts/gpu-check.sh on a Debian machine
# that has them installed:
#
#   tests/scripts/hide-system-deps.sh scripts/gpu-check.sh --rehearse --packages DIR --build /tmp/b
#
# --foreign-mpi also plants what a GPU image's own Open MPI and PMIx leave at the very paths Debian's
# packages were built for: components in /usr/lib/<triplet>/pmix2/lib/pmix and
# /usr/lib/<triplet>/openmpi/lib/openmpi3 that another version of the library would fail to load
# ("undefined symbol: pmix_output_info"), PMIx's parameter file naming them, and an environment that
# steers Open MPI (OMPI_MCA_pml=ucx, PMIX_MCA_gds=hash). The unpacked prefix must not see any of it:
#
#   tests/scripts/hide-system-deps.sh --foreign-mpi scripts/gpu-check.sh --rehearse --packages DIR \
#       --build /tmp/b --only deps,mpi-smoke
#
# Root only (unshare -m); nothing outside the namespace changes, and it ends with the command.
set -euo pipefail
foreign=0
if [ "${1:-}" = --foreign-mpi ]; then foreign=1; shift; fi
[ $# -gt 0 ] || { echo "usage: $0 [--foreign-mpi] COMMAND [ARGS...]" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "hide-system-deps: needs root (unshare -m)" >&2; exit 2; }
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
foreign_so=""
if [ "$foreign" -eq 1 ]; then
  # A component of another version: it needs a symbol this version's library does not have, as
  # data, so that the loader fails at dlopen (lazy binding would defer a function).
  foreign_so=$(mktemp -d)/foreign.so
  printf 'extern int pmix_output_info;\nint *fastudy_foreign_component = &pmix_output_info;\n' |
    gcc -shared -fPIC -x c -o "$foreign_so" -
fi
# shellcheck disable=SC2016  # the inner script expands its own variables
FOREIGN_SO=$foreign_so exec unshare -m --propagation private bash -c '
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
if [ -n "$FOREIGN_SO" ]; then
  mkdir -p $L/pmix2/lib/pmix $L/pmix2/share $L/openmpi/lib/openmpi3
  for c in pcompress_zlib prm_default prm_slurm psec_native gds_hash; do cp "$FOREIGN_SO" $L/pmix2/lib/pmix/pmix_mca_$c.so; done
  for c in pml_ucx btl_tcp ess_pmi pmix_ext3x; do cp "$FOREIGN_SO" $L/openmpi/lib/openmpi3/mca_$c.so; done
  printf "mca_base_component_path = $L/pmix2/lib/pmix\n" > $L/pmix2/share/pmix-mca-params.conf
  export OMPI_MCA_pml=ucx PMIX_MCA_gds=hash
fi
exec "$@"' hide-system-deps "$multiarch" "$@"
