#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step functions are called through run_step
# One command on a GPU machine: build fastudy against the machine's PyTorch (LibTorch with CUDA), run
# the GPU tests, a GPU microbenchmark, the CI study on the GPU and the CPU, a whole study through its
# report under mpirun, the GPU benchmarks, and print a summary. Every step's log, its outputs and the
# summary are under one folder (BUILD/gpu-check); --archive packs it into one small .tar.gz.
#
#   scripts/gpu-check.sh [--packages DIR] [--use-packages] [--build DIR] [--keep-going] [--jobs N]
#                        [--only STEP,...|--from STEP] [--deadline SECONDS] [--archive FILE.tar.gz]
#   scripts/gpu-check.sh --rehearse [--packages DIR] [--use-packages] [--build DIR] [--only|--from ...]
#   scripts/gpu-check.sh --unpack-only --packages DIR --prefix PREFIX
#   scripts/gpu-check.sh --list
#
# Needs: an NVIDIA GPU that nvidia-smi sees, nvcc (PATH or /usr/local/cuda/bin), python3 importing a
# CUDA build of torch with the C++11 ABI (PyTorch >= 2.7), cmake >= 3.25, g++. MPI, parallel HDF5,
# Boost.Program_options, toml++, GoogleTest and Google Benchmark come from the system or, where the
# system lacks one, from DIR: Debian packages made by scripts/gpu-packages.sh on a machine with the
# archive, unpacked with dpkg-deb -x into BUILD/gpu-deps (no root, no network) and isolated from any
# other MPI or PMIx on the machine. NCCL comes from the FASTUDY_NCCL_INCLUDE_DIR /
# FASTUDY_NCCL_LIBRARY environment variables, python's nvidia.nccl package (the one PyTorch loads) or
# /usr/local/cuda, in that order.
#
# Steps, in this order (each PASS, FAIL or SKIP with its log under BUILD/gpu-check/logs):
#   deps        unpack DIR (checksums against MANIFEST.tsv, architecture, glibc/libstdc++ versions,
#               every shared library resolvable), or SKIP when the system has everything
#   mpi-smoke   mpirun -n 2 of an MPI program and a 2-rank parallel-HDF5 write with the unpacked
#               prefix; fails on any warning box of Open MPI or PMIx
#   configure   cmake -DFASTUDY_TORCH_FROM_PYTHON=ON -DFASTUDY_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native
#               (90 when native fails)
#   build       only the targets the selected steps run (fastudy, the GPU tests, the GPU benchmarks)
#   ctest-gpu   ctest -L gpu; fails on a skipped test, but for those that need more GPUs than the
#               machine has (listed in the summary as not run)
#   microbench  fastudy microbench configs/gpu-microbench.toml under mpirun: our CUDA kernels and
#               LibTorch's SDPA against the readings (fa2, fa3 and the framework's), on shapes where
#               PyTorch's flash forward splits the keys (split-KV) and where it does not
#   train-*     configs/ci.toml with [train] ranks_per_variant = 1 and 2 (2 ranks share the GPU when
#               there is one: MPI on host copies), --device cuda and --device cpu
#   weights     the final checkpoints, GPU against CPU per variant and rank layout: max |diff| per
#               tensor, bit-identical or not (reported; fails only on NaN or a missing tensor/file)
#   report      configs/ci.toml, every phase through the report, under mpirun -n 2 on the GPU (the
#               report phase after CUDA training in the same processes)
#   bench       bench/gpu-table.sh BUILD OUT: the GPU rows of bench_train and bench_attention as ratios
#               side by side (SKIP while that script is not in the checkout)
#   ctest-all   the whole suite (not in the default check: --only ctest-all, or --from ctest-all)
#
# --packages DIR      the folder from scripts/gpu-packages.sh, used for what the system lacks
# --use-packages      take every dependency from DIR even where the system has it
# --build DIR         build folder (default build-gpu); the check's files go to DIR/gpu-check, and a
#                     later call with --from or --only reuses the build (a warm machine keeps it)
# --only STEP,...     run these steps only (in the order above)
# --from STEP         run STEP and every later default step
# --keep-going        run the later steps after a failed one
# --jobs N            build and test parallelism (default: all cores)
# --deadline S        start no step after S seconds, and give each step only the time left (it is
#                     stopped at the deadline): the summary and the archive are written in any case
# --archive FILE      write BUILD/gpu-check as one .tar.gz (files over 4 MiB left out and listed in
#                     it, so that it stays under 16 MiB) at the end, also after a failure or a signal
# --rehearse          no GPU needed: skip the GPU prerequisites and run deps, mpi-smoke and configure
#                     only (CUDA arch 90, LibTorch as CMake finds it), to try the offline prefix anywhere
# --unpack-only       unpack DIR into PREFIX and check it (the deps step alone; used by the tests)
# --list              print the steps (default ones marked) and exit
#
# Google Benchmark programs get FASTUDY_BENCH_MIN_TIME=0.2: a plain number of seconds, which Google
# Benchmark 1.7 requires (it refuses "0.2s") and later versions accept.
#
# Exit status: 0 every selected step passed (or skipped for a stated reason); 1 a step failed or the
# deadline stopped one; 2 bad usage; 3 a prerequisite is missing (the message names it).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '/^# shellcheck/d; $d; s/^# \{0,1\}//'; }
say() { printf 'gpu-check: %s\n' "$*"; }
die_usage() { printf 'gpu-check: %s (see --help)\n' "$*" >&2; exit 2; }

# The steps: name, function, in the default check (1/0), needs a GPU (1/0). One table.
STEPS=(
  "deps         step_deps          1 0"
  "mpi-smoke    step_mpi_smoke     1 0"
  "configure    step_configure     1 0"
  "build        step_build         1 1"
  "ctest-gpu    step_ctest_gpu     1 1"
  "microbench   step_microbench    1 1"
  "train-gpu-r1 step_train_gpu_r1  1 1"
  "train-gpu-r2 step_train_gpu_r2  1 1"
  "train-cpu-r1 step_train_cpu_r1  1 1"
  "train-cpu-r2 step_train_cpu_r2  1 1"
  "weights      step_weights       1 1"
  "report       step_report        1 1"
  "bench        step_bench         1 1"
  "ctest-all    step_ctest_all     0 1"
)
step_field() { local f; read -r -a f <<< "$1"; echo "${f[$2]}"; }
step_names() { local row; for row in "${STEPS[@]}"; do step_field "$row" 0; done; }
is_step() { local row; for row in "${STEPS[@]}"; do [ "$(step_field "$row" 0)" != "$1" ] || return 0; done; return 1; }

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
command_line="$*"
packages=""
use_packages=0
build=""
keep_going=0
jobs=$(nproc 2>/dev/null || echo 4)
rehearse=0
unpack_only=0
prefix=""
only=""
from=""
deadline=""
archive=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --list)
      for row in "${STEPS[@]}"; do
        printf '%-13s %s\n' "$(step_field "$row" 0)" "$([ "$(step_field "$row" 2)" = 1 ] && echo default || echo "on request (--only/--from)")"
      done
      exit 0 ;;
    --packages) [ $# -ge 2 ] || die_usage "--packages needs a folder"; packages=$2; shift ;;
    --use-packages) use_packages=1 ;;
    --build) [ $# -ge 2 ] || die_usage "--build needs a folder"; build=$2; shift ;;
    --keep-going) keep_going=1 ;;
    --jobs) [ $# -ge 2 ] || die_usage "--jobs needs a number"; jobs=$2; shift ;;
    --rehearse) rehearse=1 ;;
    --unpack-only) unpack_only=1 ;;
    --prefix) [ $# -ge 2 ] || die_usage "--prefix needs a folder"; prefix=$2; shift ;;
    --only) [ $# -ge 2 ] || die_usage "--only needs steps (STEP,STEP,...)"; only=$2; shift ;;
    --from) [ $# -ge 2 ] || die_usage "--from needs a step"; from=$2; shift ;;
    --deadline) [ $# -ge 2 ] || die_usage "--deadline needs seconds"; deadline=$2; shift ;;
    --archive) [ $# -ge 2 ] || die_usage "--archive needs a file name (.tar.gz)"; archive=$2; shift ;;
    *) die_usage "unknown argument $1" ;;
  esac
  shift
done
[[ $jobs =~ ^[1-9][0-9]*$ ]] || die_usage "--jobs wants a positive integer, not '$jobs'"
[ -z "$deadline" ] || [[ $deadline =~ ^[1-9][0-9]*$ ]] || die_usage "--deadline wants a positive number of seconds, not '$deadline'"
[ -z "$only" ] || [ -z "$from" ] || die_usage "--only and --from exclude each other: pass one"
if [ -n "$archive" ]; then
  case "$archive" in *.tar.gz|*.tgz) ;; *) die_usage "--archive $archive: the name must end in .tar.gz" ;; esac
  [ -d "$(dirname "$archive")" ] || die_usage "--archive $archive: no folder $(dirname "$archive")"
  archive="$(cd "$(dirname "$archive")" && pwd)/$(basename "$archive")"
fi
if [ -n "$packages" ]; then
  [ -d "$packages" ] || die_usage "--packages $packages: no such folder"
  packages=$(cd "$packages" && pwd)
fi
[ "$use_packages" -eq 0 ] || [ -n "$packages" ] || die_usage "--use-packages needs --packages DIR"

t_start=$(date +%s)
# The selected steps (names, in table order).
selected=()
if [ -n "$only" ]; then
  IFS=, read -r -a wanted <<< "$only"
  for w in "${wanted[@]}"; do is_step "$w" || die_usage "--only: no step '$w' (steps: $(step_names | tr '\n' ' '))"; done
  for row in "${STEPS[@]}"; do
    n=$(step_field "$row" 0)
    for w in "${wanted[@]}"; do [ "$w" != "$n" ] || { selected+=("$n"); break; }; done
  done
elif [ -n "$from" ]; then
  is_step "$from" || die_usage "--from: no step '$from' (steps: $(step_names | tr '\n' ' '))"
  on=0
  for row in "${STEPS[@]}"; do
    n=$(step_field "$row" 0)
    [ "$n" != "$from" ] || on=1
    # From a step on: that step, and the default steps after it.
    if [ "$on" -eq 1 ] && { [ "$n" = "$from" ] || [ "$(step_field "$row" 2)" = 1 ]; }; then selected+=("$n"); fi
  done
else
  for row in "${STEPS[@]}"; do [ "$(step_field "$row" 2)" = 0 ] || selected+=("$(step_field "$row" 0)"); done
fi
if [ "$rehearse" -eq 1 ]; then
  for n in "${selected[@]}"; do
    for row in "${STEPS[@]}"; do
      [ "$(step_field "$row" 0)" != "$n" ] || [ "$(step_field "$row" 3)" = 0 ] || {
        [ -z "$only" ] || die_usage "--rehearse runs no GPU step ($n): choose among deps, mpi-smoke, configure"
        continue 2; }
    done
  done
  rehearsal=()
  for n in "${selected[@]}"; do case "$n" in deps|mpi-smoke|configure) rehearsal+=("$n") ;; esac; done
  selected=("${rehearsal[@]}")
fi
selected_has() { local n; for n in "${selected[@]}"; do [ "$n" != "$1" ] || return 0; done; return 1; }

# ---- the private prefix: unpack, verify, relocate ---------------------------------------------

# The Debian architecture name of this machine.
machine_arch() {
  if command -v dpkg >/dev/null; then dpkg --print-architecture; return; fi
  case "$(uname -m)" in
    x86_64) echo amd64 ;; aarch64) echo arm64 ;; ppc64le) echo ppc64el ;; *) uname -m ;;
  esac
}

# "a <= b" for Debian-style versions (sort -V is close enough for glibc and gcc versions).
version_le() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }

# The highest "(>= V)" that the packages (files $2...) require of package $1 (empty when none does).
required_version() {
  local want=$1 deb
  shift
  for deb in "$@"; do
    dpkg-deb -f "$deb" Depends Pre-Depends 2>/dev/null | sed 's/^[A-Za-z-]*: //; s/[,|]/\n/g' |
      sed -n "s/^[[:space:]]*${want}[[:space:]]*(>=[[:space:]]*\([^)]*\)).*/\1/p"
  done | sed 's/^[0-9]*://; s/[-+~].*//' | sort -V | tail -1
}

# Unpack every .deb of $1 into $2 and check that the result can work here. Libraries whose every
# shared object the system already has (ldconfig -p) are not unpacked: the prefix's copies would
# shadow the system's for every program started with its LD_LIBRARY_PATH.
unpack_packages() {
  local dir=$1 pfx=$2 deb want arch glibc need_libc need_cxx have_cxx sonames so skip missing
  command -v dpkg-deb >/dev/null || { echo "FAIL: dpkg-deb is needed to unpack $dir"; return 1; }
  shopt -s nullglob
  local debs=("$dir"/*.deb)
  shopt -u nullglob
  [ ${#debs[@]} -gt 0 ] || { echo "FAIL: no .deb files in $dir (make them with scripts/gpu-packages.sh $dir)"; return 1; }
  if [ -f "$dir/MANIFEST.tsv" ]; then
    echo "checking the sha256 of ${#debs[@]} packages against $dir/MANIFEST.tsv"
    awk -F'\t' '!/^#/ && NF >= 6 { print $4 "  " $6 }' "$dir/MANIFEST.tsv" > "$pfx.sha256"
    (cd "$dir" && sha256sum --quiet -c "$pfx.sha256") ||
      { echo "FAIL: a package in $dir does not match MANIFEST.tsv (damaged in transfer?)"; return 1; }
  else
    echo "warning: $dir has no MANIFEST.tsv; the packages' checksums are not checked"
  fi
  want=$(machine_arch)
  for deb in "${debs[@]}"; do
    arch=$(dpkg-deb -f "$deb" Architecture)
    if [ "$arch" != all ] && [ "$arch" != "$want" ]; then
      echo "FAIL: $(basename "$deb") is for $arch, this machine is $want"
      echo "hint: run scripts/gpu-packages.sh on a $want machine"
      return 1
    fi
  done
  # Which packages to unpack: a runtime library package is left out when the system has every
  # shared object it ships.
  local ldconfig=/sbin/ldconfig system_sonames pkg todo=()
  command -v ldconfig >/dev/null && ldconfig=ldconfig
  system_sonames=$("$ldconfig" -p 2>/dev/null | awk 'NR > 1 { print $1 }' | sort -u)
  for deb in "${debs[@]}"; do
    pkg=$(dpkg-deb -f "$deb" Package)
    skip=0
    case "$pkg" in
      *-dev|libopenmpi*|openmpi-*|libhdf5-*|libpmix*|libboost*|libtomlplusplus*|libbenchmark*|libgtest*|libgmock*|googletest) ;;
      lib*)
        sonames=$(dpkg-deb -c "$deb" | awk '{ print $6 }' | grep -E '/lib[^/]*\.so\.[0-9]+$' | sed 's|.*/||' || true)
        if [ -n "$sonames" ]; then
          skip=1
          for so in $sonames; do
            grep -qxF "$so" <<< "$system_sonames" || { skip=0; break; }
          done
        fi ;;
    esac
    if [ "$skip" -eq 1 ]; then
      echo "  $pkg: the system has $(echo "$sonames" | tr '\n' ' ')- not unpacked"
    else
      todo+=("$deb")
    fi
  done
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  need_libc=$(required_version libc6 "${todo[@]}")
  if [ -n "$need_libc" ] && [ -n "$glibc" ] && ! version_le "$need_libc" "$glibc"; then
    echo "FAIL: the packages to unpack need glibc >= $need_libc (libc6), this machine has $glibc"
    echo "hint: make the packages on an older release (its glibc <= $glibc) with scripts/gpu-packages.sh"
    return 1
  fi
  need_cxx=$(required_version 'libstdc++6' "${todo[@]}")
  have_cxx=""
  command -v dpkg-query >/dev/null && have_cxx=$(dpkg-query -W -f='${Version}' 'libstdc++6' 2>/dev/null || true)
  have_cxx=${have_cxx%%-*}
  if [ -n "$need_cxx" ] && [ -n "$have_cxx" ] && ! version_le "$need_cxx" "$have_cxx"; then
    echo "FAIL: the packages need libstdc++6 >= $need_cxx, this machine has $have_cxx"
    return 1
  fi
  echo "this machine: $want, glibc ${glibc:-unknown} (packages need ${need_libc:-any}), libstdc++6 ${have_cxx:-unknown} (need ${need_cxx:-any})"
  mkdir -p "$pfx"
  for deb in "${todo[@]}"; do
    dpkg-deb -x "$deb" "$pfx"
    echo "  $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version): unpacked"
  done
  # PMIx's parameter file names its component folder by its absolute system path: the prefix's copy
  # names the prefix's instead (prefix_env sets PMIX_SYSCONFDIR to it).
  local conf
  for conf in "$pfx"/usr/lib/*/pmix2/share/pmix-mca-params.conf; do
    [ -f "$conf" ] || continue
    local sys_pmix=${conf#"$pfx"}
    sys_pmix=${sys_pmix%/share/pmix-mca-params.conf}
    sed -i "s|$sys_pmix|$pfx$sys_pmix|g" "$conf"
  done
  prefix_env "$pfx"
  # Open MPI's wrappers and launcher under their plain names (dpkg's alternatives are not made).
  if [ -x "$pfx/usr/bin/opal_wrapper" ]; then
    mkdir -p "$pfx/bin"
    local w
    for w in mpicc mpicxx mpic++ mpiCC; do ln -sfn ../usr/bin/opal_wrapper "$pfx/bin/$w"; done
    for w in mpirun mpiexec; do ln -sfn ../usr/bin/orterun "$pfx/bin/$w"; done
    ln -sfn ../usr/bin/ompi_info "$pfx/bin/ompi_info"
    # Components whose libraries are not there (e.g. packages made with --no-fabrics) are set aside,
    # so that Open MPI does not warn about each one at every start.
    local comp
    for comp in "$pfx"/usr/lib/*/openmpi/lib/openmpi3/mca_*.so; do
      [ -e "$comp" ] || continue
      local lost
      lost=$(ldd "$comp" 2>&1 | awk '/not found/ {print $1}' | tr '\n' ' ' || true)
      if [ -n "$lost" ]; then
        mv "$comp" "$comp.disabled"
        echo "  Open MPI component $(basename "$comp") disabled: ${lost}missing"
      fi
    done
  fi
  # Every shared library and program the build and the runs use must resolve.
  missing=""
  local f
  for f in "$pfx"/usr/bin/orterun "$pfx"/usr/bin/opal_wrapper "$pfx"/usr/lib/*/libmpi.so.* \
           "$pfx"/usr/lib/*/libhdf5_openmpi.so.* "$pfx"/usr/lib/*/libboost_program_options.so.* \
           "$pfx"/usr/lib/*/libbenchmark.so.* "$pfx"/usr/lib/*/libgtest.so.* "$pfx"/usr/lib/*/libtomlplusplus.so.*; do
    if [ ! -e "$f" ] || [ -L "$f" ]; then continue; fi
    local nf
    nf=$(ldd "$f" 2>&1 | awk '/not found|error/ {print $1}' | tr '\n' ' ' || true)
    [ -z "$nf" ] || missing+="$(basename "$f") needs: $nf"$'\n'
  done
  if [ -n "$missing" ]; then
    echo "FAIL: shared libraries not found (neither in the system nor in $dir):"
    printf '%s' "$missing"
    echo "hint: add the Debian packages that hold them to $dir (scripts/gpu-packages.sh: remove them from EXCLUDE)"
    return 1
  fi
  echo "prefix $pfx: $(du -sh "$pfx" | cut -f1), every library resolves"
}

# The environment that makes the unpacked prefix usable: programs, libraries, Open MPI and PMIx
# relocated, and nothing of another MPI installation in the way. A GPU image often has its own Open
# MPI and PMIx at the very paths Debian's packages were built for (/usr/lib/<triplet>/openmpi,
# /usr/lib/<triplet>/pmix2): without this, the unpacked libpmix loads the image's PMIx components
# ("undefined symbol: pmix_output_info") and every mpirun prints a box of warnings.
prefix_env() {
  local pfx=$1 triplet=""
  local d
  for d in "$pfx"/usr/lib/*-linux-gnu*; do [ -d "$d" ] && triplet=$(basename "$d") && break; done
  [ -n "$triplet" ] || return 0
  # Settings of another MPI in the environment (an image's OMPI_MCA_pml=ucx, OPAL_PREFIX of HPC-X,
  # PMIX_MCA_gds, ...) would steer the unpacked one: they are dropped, and named in the log.
  local v dropped=()
  for v in $(compgen -e); do
    case "$v" in
      OMPI_MCA_rmaps_base_oversubscribe) ;;  # the check's own (below)
      OMPI_MCA_*|PMIX_MCA_*|OPAL_*|PMIX_INSTALL_PREFIX|PMIX_PREFIX|PMIX_PKG*|PMIX_SYSCONFDIR|PRTE_*|MPI_HOME|MPI_ROOT)
        dropped+=("$v=${!v}"); unset "$v" ;;
    esac
  done
  [ ${#dropped[@]} -eq 0 ] || printf 'environment of another MPI, dropped for the unpacked one: %s\n' "${dropped[*]}"
  export PATH="$pfx/bin:$PATH"
  export LD_LIBRARY_PATH="$pfx/usr/lib/$triplet:$pfx/lib/$triplet:$pfx/usr/lib/$triplet/hdf5/openmpi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$pfx/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  # Open MPI finds its components, help texts and wrapper data relative to OPAL_PREFIX; its
  # configuration files are under /etc (not relocated), so the prefix's are named explicitly (which
  # also leaves out ~/.openmpi/mca-params.conf); hwloc must not load another installation's plugins.
  export OPAL_PREFIX="$pfx/usr"
  export OMPI_MCA_mca_base_param_files="$pfx/etc/openmpi/openmpi-mca-params.conf"
  export OMPI_MCA_orte_default_hostfile="$pfx/etc/openmpi/openmpi-default-hostfile"
  export HWLOC_PLUGINS_PATH="$pfx/usr/lib/$triplet/hwloc"
  # PMIx does not follow OPAL_PREFIX, and Debian's build names its folders one by one (a prefix
  # alone does not move them): its components (PMIX_PKGLIBDIR), help texts (PMIX_PKGDATADIR) and
  # parameter file (PMIX_SYSCONFDIR) are named here; PMIX_INSTALL_PREFIX (PMIx 4) and PMIX_PREFIX
  # (PMIx 5) for the rest. (PMIX_MCA_mca_base_component_path is not enough: tried, the image's
  # components still load.)
  local pmix="$pfx/usr/lib/$triplet/pmix2"
  export PMIX_INSTALL_PREFIX="$pmix" PMIX_PREFIX="$pmix"
  export PMIX_PKGLIBDIR="$pmix/lib/pmix" PMIX_PKGDATADIR="$pmix/share/pmix" PMIX_SYSCONFDIR="$pmix/share"
  export HDF5_ROOT="$pfx/usr/lib/$triplet/hdf5/openmpi"
  PREFIX_TRIPLET=$triplet
}

if [ "$unpack_only" -eq 1 ]; then
  [ -n "$packages" ] || die_usage "--unpack-only needs --packages DIR"
  [ -n "$prefix" ] || die_usage "--unpack-only needs --prefix PREFIX"
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
  unpack_packages "$packages" "$prefix"
  exit $?
fi
[ -z "$prefix" ] || die_usage "--prefix goes with --unpack-only (the check unpacks into BUILD/gpu-deps)"

# ---- prerequisites ----------------------------------------------------------------------------
build=${build:-$src/build-gpu}
mkdir -p "$build"
build=$(cd "$build" && pwd)
check=$build/gpu-check
logs=$check/logs
mkdir -p "$logs"

missing=()
gpu_name="" gpu_driver="" nvcc="" torch_version="" torch_cuda="" torch_prefix=""
if [ "$rehearse" -eq 0 ]; then
  if ! command -v nvidia-smi >/dev/null; then
    missing+=("no nvidia-smi on PATH: no NVIDIA driver (or not on PATH), so no GPU to check")
  elif ! gpus=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1) || [ -z "$gpus" ]; then
    missing+=("nvidia-smi sees no GPU (nvidia-smi: $(head -c 200 <<< "${gpus:-no output}"))")
  else
    gpu_name=$(head -1 <<< "$gpus" | cut -d, -f1)
    gpu_driver=$(head -1 <<< "$gpus" | cut -d, -f2 | tr -d ' ')
    [ "$(wc -l <<< "$gpus")" -eq 1 ] || gpu_name="$gpu_name (x$(wc -l <<< "$gpus"))"
  fi
  nvcc=$(command -v nvcc || true)
  [ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; } ||
    missing+=("no nvcc (CUDA toolkit) on PATH or in /usr/local/cuda/bin")
  if ! command -v python3 >/dev/null; then
    missing+=("no python3 (PyTorch's LibTorch is taken from python3's torch)")
  elif ! torch_info=$(python3 -c 'import torch, torch.utils
print(torch.__version__); print(torch.version.cuda or ""); print(torch.utils.cmake_prefix_path)
print(int(torch.compiled_with_cxx11_abi()))' 2> "$logs/torch-import.err"); then
    missing+=("python3 cannot import torch: $(tail -1 "$logs/torch-import.err")")
  else
    torch_version=$(sed -n 1p <<< "$torch_info")
    torch_cuda=$(sed -n 2p <<< "$torch_info")
    torch_prefix=$(sed -n 3p <<< "$torch_info")
    [ -n "$torch_cuda" ] || missing+=("python3's torch $torch_version is a CPU build (torch.version.cuda is None)")
    [ "$(sed -n 4p <<< "$torch_info")" = 1 ] ||
      missing+=("python3's torch $torch_version uses the pre-C++11 ABI (torch.compiled_with_cxx11_abi() is False); fastudy needs PyTorch >= 2.7")
  fi
fi
command -v cmake >/dev/null || missing+=("no cmake (>= 3.25)")
command -v g++ >/dev/null || missing+=("no g++")
if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do echo "gpu-check: missing prerequisite: $m" >&2; done
  [ "$rehearse" -eq 1 ] || echo "hint: without a GPU, --rehearse --packages DIR tries the package and configure steps" >&2
  exit 3
fi

# ---- where each dependency comes from ------------------------------------------------------------
have_any() { local g; for g in "$@"; do compgen -G "$g" >/dev/null && return 0; done; return 1; }
declare -A from=()
sys_mpi=0; command -v mpicxx >/dev/null && command -v mpirun >/dev/null && sys_mpi=1
sys_hdf5=0
for h in /usr/include/hdf5/openmpi/H5pubconf.h /usr/include/H5pubconf.h /usr/local/include/H5pubconf.h \
         ${HDF5_ROOT:+"$HDF5_ROOT/include/H5pubconf.h"}; do
  [ -f "$h" ] && grep -q 'define H5_HAVE_PARALLEL 1' "$h" && sys_hdf5=1 && break
done
# A dependency is in the system when its CMake package file is in one of the usual places.
cmake_dirs=(/usr/lib/*-linux-gnu*/cmake /usr/lib/cmake /usr/lib64/cmake /usr/share/cmake /usr/local/lib/cmake
            /usr/local/lib/*-linux-gnu*/cmake /usr/local/share/cmake)
have_config() {
  local d
  for d in "${cmake_dirs[@]}"; do have_any "$d/$1" && return 0; done
  return 1
}
from[boost]=packages; have_config 'boost_program_options-*/boost_program_options-config.cmake' && from[boost]=system
from[tomlplusplus]=packages; have_config tomlplusplus/tomlplusplusConfig.cmake && from[tomlplusplus]=system
from[nlohmann_json]=packages; have_config nlohmann_json/nlohmann_jsonConfig.cmake && from[nlohmann_json]=system
from[gtest]=packages; have_config GTest/GTestConfig.cmake && from[gtest]=system
from[benchmark]=packages; have_config benchmark/benchmarkConfig.cmake && from[benchmark]=system
# Debian's parallel HDF5 is built against Debian's Open MPI: the two come together.
if [ "$sys_mpi" -eq 1 ] && [ "$sys_hdf5" -eq 1 ]; then from[mpi+hdf5]=system; else from[mpi+hdf5]=packages; fi
if [ "$use_packages" -eq 1 ]; then for k in "${!from[@]}"; do from[$k]=packages; done; fi
need_packages=0
for k in "${!from[@]}"; do [ "${from[$k]}" = system ] || need_packages=1; done
if [ "$need_packages" -eq 1 ] && [ -z "$packages" ] && { selected_has deps || [ ! -f "$build/gpu-deps/.gpu-check-unpacked" ]; }; then
  lacking=()
  for k in "${!from[@]}"; do [ "${from[$k]}" = system ] || lacking+=("$k"); done
  echo "gpu-check: missing prerequisite: the system lacks ${lacking[*]} and no --packages DIR was given" >&2
  echo "hint: on a machine with Debian's archive run scripts/gpu-packages.sh DIR, copy DIR here, pass --packages DIR" >&2
  exit 3
fi

# ---- step machinery -------------------------------------------------------------------------------
names=() states=() notes=() times=() logfiles=()
failed=0
stopping=""      # why no further step starts (a signal, the deadline)
step_pid=""      # the process group of the step that runs now
# A signal (the machine's time is up, Ctrl-C) stops the step that runs, and the check goes on to its
# summary and archive.
on_signal() {
  stopping="stopped by signal $1"
  [ -z "$step_pid" ] || kill -TERM -- "-$step_pid" 2>/dev/null || true
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

seconds_left() { echo $(( deadline - ($(date +%s) - t_start) )); }

# run_step NAME FUNCTION: runs FUNCTION (with set -e, in a process group of its own, stdin from
# /dev/null) into logs/NAME.log. The function returns 0 (PASS), 77 (SKIP) or anything else (FAIL);
# its last line starting "NOTE: " / "SKIP: " / "FAIL: " becomes the note in the summary. With
# --deadline the step is stopped (SIGTERM to its group, SIGKILL 10 s later) when the time is up.
run_step() {
  local name=$1 fn=$2 log="$logs/$1.log" rc t0 state note left=""
  if [ -n "$stopping" ]; then
    names+=("$name"); states+=(SKIP); notes+=("not started: $stopping"); times+=(0); logfiles+=("-"); return 0
  fi
  if [ "$failed" -eq 1 ] && [ "$keep_going" -eq 0 ]; then
    names+=("$name"); states+=(SKIP); notes+=("not run: an earlier step failed (--keep-going runs it)")
    times+=(0); logfiles+=("-"); return 0
  fi
  if [ -n "$deadline" ]; then
    left=$(seconds_left)
    if [ "$left" -lt 15 ]; then
      stopping="the deadline (--deadline $deadline) was reached"; failed=1
      names+=("$name"); states+=(SKIP); notes+=("not started: $stopping"); times+=(0); logfiles+=("-"); return 0
    fi
  fi
  say "$name ... (log: $log)"
  t0=$(date +%s)
  set +e
  set -m
  ( set -e; "$fn" ) < /dev/null > "$log" 2>&1 &
  step_pid=$!
  set +m
  if [ -n "$left" ]; then
    ( end=$(( $(date +%s) + left ))
      while kill -0 "$step_pid" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$end" ]; then
          echo "FAIL: stopped at the deadline (--deadline $deadline) after ${left} s" >> "$log"
          kill -TERM -- "-$step_pid" 2>/dev/null; sleep 10; kill -KILL -- "-$step_pid" 2>/dev/null; exit 0
        fi
        sleep 1
      done ) &
  fi
  rc=0
  wait "$step_pid" || rc=$?
  # A trapped signal ends the wait early: wait for the step itself, now stopping.
  while kill -0 "$step_pid" 2>/dev/null; do wait "$step_pid" || rc=$?; done
  step_pid=""
  if grep -q '^FAIL: stopped at the deadline' "$log"; then stopping="the deadline (--deadline $deadline) was reached"; fi
  set -e
  [ -z "$stopping" ] || { [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || echo "FAIL: $stopping" >> "$log"; }
  case "$rc" in 0) state=PASS ;; 77) state=SKIP ;; *) state=FAIL; failed=1 ;; esac
  note=$(grep -E '^(NOTE|SKIP|FAIL): ' "$log" | tail -1 | sed -E 's/^(NOTE|SKIP|FAIL): //' || true)
  [ "$state" != FAIL ] || [ -n "$note" ] || note="exit $rc; last line: $(tail -1 "$log")"
  names+=("$name"); states+=("$state"); notes+=("$note"); times+=($(( $(date +%s) - t0 ))); logfiles+=("$log")
  say "$name: $state${note:+ ($note)}"
}

deps_prefix=$build/gpu-deps
deps_marker=$deps_prefix/.gpu-check-unpacked  # written last: the prefix is whole
step_deps() {
  if [ "$need_packages" -eq 0 ]; then echo "SKIP: every dependency is in the system"; return 77; fi
  for k in "${!from[@]}"; do echo "$k: ${from[$k]}"; done
  rm -rf "$deps_prefix"
  mkdir -p "$deps_prefix"
  unpack_packages "$packages" "$deps_prefix"
  sha256sum "$packages/MANIFEST.tsv" 2>/dev/null | cut -d' ' -f1 > "$deps_marker" || echo none > "$deps_marker"
  echo "NOTE: $(grep -c ': unpacked$' "$logs/deps.log" || true) packages unpacked into $deps_prefix"
}

step_mpi_smoke() {
  if [ "${from[mpi+hdf5]}" != packages ]; then echo "SKIP: the system's MPI and HDF5 (checked by ctest)"; return 77; fi
  echo "mpirun: $(command -v mpirun); OPAL_PREFIX=$OPAL_PREFIX; PMIX_PKGLIBDIR=$PMIX_PKGLIBDIR"
  local d=$check/mpi-smoke out
  mkdir -p "$d"
  # Open MPI and PMIx report a relocation they cannot follow (a help file, a component, another
  # installation's component: "undefined symbol") in boxes like "Sorry! You were supposed to get
  # help about ..." and carry on: such output fails the step.
  local complaints='Sorry!|WARNING|cannot open|unable to|undefined symbol'
  out=$(mpirun -n 2 --oversubscribe hostname 2>&1)
  echo "$out"
  if grep -qE "$complaints" <<< "$out"; then
    echo "FAIL: mpirun ran but complained (see above): the relocated Open MPI is incomplete"
    return 1
  fi
  cat > "$d/h5write.c" <<'C'
/* Two ranks write one dataset of a file collectively with parallel HDF5; rank 0 reads it back. */
#include <hdf5.h>
#include <mpi.h>
#include <stdio.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_fapl_mpio(fapl, MPI_COMM_WORLD, MPI_INFO_NULL);
  hid_t f = H5Fcreate(argv[1], H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  hsize_t n = (hsize_t)size, one = 1, start = (hsize_t)rank;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t d = H5Dcreate2(f, "ranks", H5T_NATIVE_INT, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &one, NULL);
  hid_t mem = H5Screate_simple(1, &one, NULL);
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE);
  herr_t w = H5Dwrite(d, H5T_NATIVE_INT, mem, space, dxpl, &rank);
  H5Pclose(dxpl); H5Sclose(mem); H5Sclose(space); H5Dclose(d); H5Fclose(f); H5Pclose(fapl);
  int ok = w >= 0;
  if (rank == 0 && ok) {
    int got[64] = {0};
    hid_t g = H5Fopen(argv[1], H5F_ACC_RDONLY, H5P_DEFAULT);
    hid_t gd = H5Dopen2(g, "ranks", H5P_DEFAULT);
    H5Dread(gd, H5T_NATIVE_INT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got);
    for (int i = 0; i < size && i < 64; ++i) ok = ok && got[i] == i;
    H5Dclose(gd); H5Fclose(g);
    printf("parallel HDF5 %s: %d ranks wrote %s\n", ok ? "ok" : "WRONG", size, argv[1]);
  }
  MPI_Finalize();
  return ok ? 0 : 1;
}
C
  mpicc -o "$d/h5write" "$d/h5write.c" -I"$HDF5_ROOT/include" -L"$HDF5_ROOT" -lhdf5
  out=$(mpirun -n 2 --oversubscribe "$d/h5write" "$d/ranks.h5" 2>&1)
  echo "$out"
  grep -q '^parallel HDF5 ok' <<< "$out" || { echo "FAIL: the 2-rank HDF5 write did not report ok"; return 1; }
  if grep -qE "$complaints" <<< "$out"; then echo "FAIL: mpirun complained (see above)"; return 1; fi
  echo "NOTE: mpirun -n 2 and a 2-rank collective HDF5 write with $OPAL_PREFIX"
}

nccl_inc="" nccl_lib=""
find_nccl() {
  if [ -n "${FASTUDY_NCCL_INCLUDE_DIR:-}" ] && [ -n "${FASTUDY_NCCL_LIBRARY:-}" ]; then
    nccl_inc=$FASTUDY_NCCL_INCLUDE_DIR; nccl_lib=$FASTUDY_NCCL_LIBRARY; echo "NCCL from the environment"; return
  fi
  local d
  # PyTorch's own NCCL (pip: nvidia-nccl-cu1x). It may ship only libnccl.so.2 (no libnccl.so for
  # find_library): the full path is passed instead. Header: the package's, else the CUDA toolkit's.
  d=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -z "$d" ]; then  # another layout of the nvidia namespace (e.g. nvidia/cu13): search it
    local n
    for n in $(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null || true); do
      d=$(find "$n" -maxdepth 4 -name 'libnccl.so*' 2>/dev/null | head -1 || true)
      [ -z "$d" ] || { d=$(dirname "$(dirname "$d")"); break; }
    done
  fi
  if [ -n "$d" ]; then
    nccl_lib=$(find "$d" -name 'libnccl.so*' \( -type f -o -type l \) 2>/dev/null | sort | head -1 || true)
    local h
    h=$(find "$d" -name nccl.h 2>/dev/null | head -1 || true)
    [ -n "$h" ] || { [ -f /usr/local/cuda/include/nccl.h ] && h=/usr/local/cuda/include/nccl.h; }
    [ -z "$h" ] || nccl_inc=$(dirname "$h")
    if [ -n "$nccl_lib" ] && [ -n "$nccl_inc" ]; then echo "NCCL from python's nvidia.nccl ($d)"; return; fi
  fi
  if [ -f /usr/local/cuda/include/nccl.h ]; then
    nccl_inc=/usr/local/cuda/include
    nccl_lib=$(find /usr/local/cuda/lib64/ /usr/local/cuda/lib/ /usr/lib/*-linux-gnu/ -maxdepth 1 -name 'libnccl.so*' 2>/dev/null | sort | head -1 || true)
    [ -z "$nccl_lib" ] || { echo "NCCL from /usr/local/cuda"; return; }
  fi
  nccl_inc="" nccl_lib=""
  echo "no NCCL found: the NCCL reducer and its test are not built"
}

cmake_args=()
step_configure() {
  cmake_args=(-S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release)
  command -v ninja >/dev/null && [ ! -f "$build/Makefile" ] && cmake_args+=(-G Ninja)
  if [ "$rehearse" -eq 1 ]; then
    cmake_args+=(-DFASTUDY_CUDA=AUTO -DCMAKE_CUDA_ARCHITECTURES=90)
  else
    cmake_args+=(-DFASTUDY_TORCH_FROM_PYTHON=ON -DFASTUDY_CUDA=ON "-DCMAKE_CUDA_COMPILER=$nvcc")
    find_nccl
    [ -z "$nccl_lib" ] || cmake_args+=("-DFASTUDY_NCCL_INCLUDE_DIR=$nccl_inc" "-DFASTUDY_NCCL_LIBRARY=$nccl_lib")
  fi
  # The report and scipy tests run under FASTUDY_PYTHON (CMake's default: /usr/bin/python3); a GPU
  # image often has matplotlib/h5py/scipy only in the python3 on PATH.
  local p
  for p in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [ -x "$p" ] && "$p" -c 'import matplotlib, numpy, h5py, scipy' 2>/dev/null; then
      cmake_args+=("-DFASTUDY_PYTHON=$p"); echo "FASTUDY_PYTHON: $p (has matplotlib, numpy, h5py, scipy)"; break
    fi
  done
  if [ "${from[mpi+hdf5]}" = packages ]; then
    cmake_args+=("-DMPI_C_COMPILER=$deps_prefix/bin/mpicc" "-DMPI_CXX_COMPILER=$deps_prefix/bin/mpicxx"
                 "-DMPIEXEC_EXECUTABLE=$deps_prefix/bin/mpiexec" "-DHDF5_ROOT=$HDF5_ROOT"
                 -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON)
  fi
  local cm="$deps_prefix/usr/lib/${PREFIX_TRIPLET:-none}/cmake" d
  if [ "${from[boost]}" = packages ]; then
    d=$(compgen -G "$cm/Boost-*" | head -1) && cmake_args+=("-DBoost_DIR=$d" -DBoost_NO_SYSTEM_PATHS=ON)
  fi
  [ "${from[tomlplusplus]}" = system ] || cmake_args+=("-Dtomlplusplus_DIR=$cm/tomlplusplus")
  [ "${from[nlohmann_json]}" = system ] || cmake_args+=("-Dnlohmann_json_DIR=$deps_prefix/usr/share/cmake/nlohmann_json")
  [ "${from[gtest]}" = system ] || cmake_args+=("-DGTest_DIR=$cm/GTest")
  [ "${from[benchmark]}" = system ] || cmake_args+=("-Dbenchmark_DIR=$cm/benchmark")
  local arch=native
  [ "$rehearse" -eq 1 ] && arch=90
  echo "cmake ${cmake_args[*]} -DCMAKE_CUDA_ARCHITECTURES=$arch"
  if ! cmake "${cmake_args[@]}" "-DCMAKE_CUDA_ARCHITECTURES=$arch"; then
    [ "$arch" = native ] || return 1
    echo "configure with CMAKE_CUDA_ARCHITECTURES=native failed; again with 90"
    rm -f "$build/CMakeCache.txt"
    cmake "${cmake_args[@]}" -DCMAKE_CUDA_ARCHITECTURES=90
    arch=90
  fi
  echo "found (CMakeCache.txt):"
  grep -E '^(MPI_CXX_COMPILER|MPI_CXX_HEADER_DIR|MPI_mpi_LIBRARY|MPIEXEC_EXECUTABLE|HDF5_C_INCLUDE_DIR|HDF5_hdf5_LIBRARY_RELEASE|HDF5_C_LIBRARY_hdf5|Boost_DIR|boost_program_options_DIR|tomlplusplus_DIR|nlohmann_json_DIR|GTest_DIR|benchmark_DIR|Torch_DIR|FASTUDY_NCCL_INCLUDE_DIR|FASTUDY_NCCL_LIBRARY|CMAKE_CUDA_ARCHITECTURES|CMAKE_CUDA_COMPILER|FASTUDY_PYTHON):' \
    "$build/CMakeCache.txt" | sed 's/^/  /'
  local torch
  torch=$(grep -E '^Torch_DIR:' "$build/CMakeCache.txt" | cut -d= -f2)
  echo "NOTE: CUDA arch $arch, LibTorch ${torch%/share/cmake/Torch}${nccl_lib:+, NCCL $nccl_lib}"
}

# The targets the selected steps run: fastudy (with fastudy-main, fastudy-lite, fastudy-spawn), the GPU
# tests (the target gpu_tests, tests/gpu/CMakeLists.txt) and, for the bench step, the benchmarks its
# script times. ctest-all builds everything itself.
step_build() {
  [ -f "$build/CMakeCache.txt" ] || { echo "FAIL: $build is not configured: run the configure step first (--from configure)"; return 1; }
  local targets=(fastudy)
  selected_has ctest-gpu && targets+=(gpu_tests)
  if selected_has bench && [ -f "$src/bench/gpu-table.sh" ]; then targets+=(bench_train bench_attention); fi
  echo "cmake --build $build -j $jobs --target ${targets[*]}"
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
  echo "NOTE: built ${targets[*]} with $jobs jobs"
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Google Benchmark 1.7 takes --benchmark_min_time as a plain number of seconds (it refuses "0.2s");
# later versions accept the plain number too. Benchmark scripts read this instead of writing a unit.
export FASTUDY_BENCH_MIN_TIME=0.2

# The tests that skipped in a ctest -V log, one "name<TAB>reason" a line: gtest prints the reason on
# the line after "...: Skipped" and then "[  SKIPPED ] Suite.Test (N ms)"; ctest prefixes each line
# with the test's number, which keeps parallel tests apart.
skipped_tests() {
  awk '{
      gsub(/\033\[[0-9;]*m/, "")  # colours (gtest under mpirun writes to a terminal)
      p = $1; line = $0; sub(/^[0-9]+: /, "", line)
      if (wait_reason[p]) { reason[p] = line; wait_reason[p] = 0; next }
      if (line ~ /: Skipped$/) { wait_reason[p] = 1; next }
      if (line ~ /^\[  SKIPPED \] .* \([0-9]+ ms\)$/) {
        name = line; sub(/^\[  SKIPPED \] /, "", name); sub(/ \([0-9]+ ms\)$/, "", name)
        print name "\t" reason[p]
      }
    }' "$1" | sort -u
}

# Skips that are not gaps of this check: tests that need more GPUs than the machine has (recorded as
# not run), and the refusal path of a machine without a device.
not_a_gap='^(needs more GPUs|a CUDA device exists)'

step_ctest_gpu() {
  local log=$check/ctest-gpu.out rc=0
  GTEST_COLOR=no ctest --test-dir "$build" -L gpu -V -j "$jobs" --timeout 900 > "$log" 2>&1 || rc=$?
  tail -40 "$log"
  grep -q 'Total Tests: [1-9]\|tests passed' "$log" || { echo "FAIL: no test has the label gpu"; return 1; }
  skipped_tests "$log" > "$check/ctest-gpu-skipped.tsv"
  awk -F'\t' '$2 ~ /^needs more GPUs/' "$check/ctest-gpu-skipped.tsv" > "$check/not-run-on-this-gpu.tsv"
  local gaps
  gaps=$(awk -F'\t' -v re="$not_a_gap" '$2 !~ re' "$check/ctest-gpu-skipped.tsv" | wc -l)
  if [ "$gaps" -gt 0 ] || grep -qE '\*\*\*Not Run|Could not find executable' "$log"; then
    awk -F'\t' -v re="$not_a_gap" '$2 !~ re' "$check/ctest-gpu-skipped.tsv" | head -20 || true
    grep -E '\*\*\*Not Run|Could not find executable' "$log" | head -5 || true
    echo "FAIL: $gaps GPU test(s) skipped or not run (the GPU tests must run here; see above)"
    return 1
  fi
  [ "$rc" -eq 0 ] || { echo "FAIL: $(grep -E 'tests passed' "$log" | tail -1)"; return 1; }
  local not_run
  not_run=$(wc -l < "$check/not-run-on-this-gpu.tsv")
  echo "NOTE: $(grep -E 'tests passed' "$log" | tail -1); none skipped$([ "$not_run" -eq 0 ] || echo ", but $not_run that need more GPUs (not-run-on-this-gpu.tsv)")"
}

step_ctest_all() {
  local log=$check/ctest-all.out rc=0
  cmake --build "$build" -j "$jobs"
  ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 900 > "$log" 2>&1 || rc=$?
  tail -60 "$log"
  local line
  line=$(grep -E 'tests passed' "$log" | tail -1)
  [ "$rc" -eq 0 ] || { echo "FAIL: $line"; return 1; }
  echo "NOTE: $line; skipped: $(grep -c '\*\*\*Skipped' "$log" || true)"
}

# The microbenchmark's ranks: its CPU kernels (the readings) take most of the time, the GPU points
# share the one device; 4 ranks or the cores, whichever is less.
microbench_ranks() { echo $(( jobs < 4 ? jobs : 4 )); }

step_microbench() {
  local cfg=$src/configs/gpu-microbench.toml out=$check/microbench ranks
  [ -f "$cfg" ] || { echo "SKIP: configs/gpu-microbench.toml is not in this checkout"; return 77; }
  ranks=$(microbench_ranks)
  rm -rf "$out"
  mpirun -n "$ranks" "$build/fastudy" microbench "$cfg" --out "$out"
  [ -s "$out/microbench.csv" ] || { echo "FAIL: no $out/microbench.csv"; return 1; }
  head -5 "$out/microbench.csv"
  echo "NOTE: $(($(grep -cv '^#' "$out/microbench.csv") - 1)) rows in $out/microbench.csv ($ranks ranks)"
}

# A whole study under mpirun on the GPU, every phase through the report: the report phase runs in the
# processes that trained on the GPU (a CUDA context, the reducers' state, MPI's transports) and starts
# the renderer from them.
step_report() {
  local out=$check/report-study
  rm -rf "$out"
  mpirun -n 2 "$build/fastudy" "$src/configs/ci.toml" --out "$out" --device cuda
  [ -s "$out/report.html" ] || { echo "FAIL: no $out/report.html"; return 1; }
  grep -q '== phase report' "$logs/report.log" || { echo "FAIL: the run did not reach the report phase"; return 1; }
  echo "NOTE: mpirun -n 2 fastudy configs/ci.toml --device cuda: every phase; report.html $(du -h "$out/report.html" | cut -f1)"
}

# The GPU benchmarks, as ratios side by side in one run (bench/gpu-table.sh BUILD OUTDIR).
step_bench() {
  local script=$src/bench/gpu-table.sh out=$check/bench
  [ -f "$script" ] || { echo "SKIP: bench/gpu-table.sh is not in this checkout (it comes with the GPU benchmarks)"; return 77; }
  rm -rf "$out"
  mkdir -p "$out"
  bash "$script" "$build" "$out"
  echo "NOTE: the table and its runs are in $out"
}

# A python3 that has h5py and numpy (Debian's is /usr/bin/python3).
h5python() {
  local p
  for p in python3 /usr/bin/python3; do
    command -v "$p" >/dev/null && "$p" -c 'import h5py, numpy' 2>/dev/null && { echo "$p"; return 0; }
  done
  return 1
}

# configs/ci.toml with [train] ranks_per_variant = $1, written to $2; the result is parsed back and
# must equal the original but for that key. Python >= 3.11 (tomllib).
derive_grid() {
  local py
  py=$(for p in python3 /usr/bin/python3; do command -v "$p" >/dev/null &&
         "$p" -c 'import tomllib' 2>/dev/null && echo "$p" && break; done || true)
  [ -n "$py" ] || { echo "FAIL: no python3 >= 3.11 (tomllib) to write the derived grids"; return 1; }
  "$py" - "$src/configs/ci.toml" "$1" "$2" <<'PY'
import re, sys, tomllib
src, ranks, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
text = open(src, encoding="utf-8").read()
lines = text.splitlines(keepends=True)
table, at, header = None, None, None
for i, line in enumerate(lines):
    m = re.match(r"\s*\[\s*([A-Za-z0-9_.\-]+)\s*\]\s*(#.*)?$", line)
    if m:
        table = m.group(1)
        if table == "train":
            header = i
        continue
    if table == "train" and re.match(r"\s*ranks_per_variant\s*=", line):
        at = i
key = f"ranks_per_variant = {ranks}\n"
if at is not None:
    lines[at] = key
elif header is not None:
    lines.insert(header + 1, key)
else:
    lines.append(f"\n[train]\n{key}")
out = "".join(lines)
want = tomllib.loads(text)
want.setdefault("train", {})["ranks_per_variant"] = ranks
if tomllib.loads(out) != want:
    sys.exit(f"derive_grid: editing {src} changed more than [train] ranks_per_variant")
open(dst, "w", encoding="utf-8").write(out)
print(f"{dst}: {src} with [train] ranks_per_variant = {ranks}")
PY
}

# train_run DEVICE RANKS: configs/ci.toml on DEVICE with RANKS ranks per variant (mpirun -n RANKS).
train_run() {
  local device=$1 ranks=$2 grid="$check/ci-r$2.toml" out="$check/train-$1-r$2"
  local help
  help=$("$build/fastudy" train --help 2>&1 || true)
  if ! grep -q -- '--device' <<< "$help"; then
    echo "SKIP: \`fastudy train --help\` has no --device option in this checkout"; return 77
  fi
  derive_grid "$ranks" "$grid"
  rm -rf "$out"
  mkdir -p "$out"
  mpirun -n "$ranks" "$build/fastudy" train "$grid" --out "$out" --device "$device" 2>&1 | tee "$out.log"
  local n reducer
  n=$(find "$out/checkpoints" -name 'step_*.h5' 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "FAIL: no checkpoint under $out/checkpoints"; return 1; }
  # The reducer each group got (printed for groups on GPUs: NCCL, or MPI on host copies).
  reducer=$(sed -n '/train: reducer of group 0 /{s/.*train: reducer of group 0 ([^)]*): //p;q;}' "$out.log")
  echo "NOTE: $n checkpoints under $out/checkpoints${reducer:+; reducer: $reducer}"
}
step_train_gpu_r1() { train_run cuda 1; }
step_train_gpu_r2() { train_run cuda 2; }
step_train_cpu_r1() { train_run cpu 1; }
step_train_cpu_r2() { train_run cpu 2; }

step_weights() {
  local py ranks table=$check/weights.tsv
  py=$(h5python) || { echo "FAIL: no python3 with h5py and numpy to compare the checkpoints"; return 1; }
  [ -d "$check/train-cuda-r1" ] || [ -d "$check/train-cuda-r2" ] ||
    { echo "SKIP: no GPU training run to compare"; return 77; }
  : > "$table"
  local notes=() rc=0
  for ranks in 1 2; do
    "$py" - "$check/train-cuda-r$ranks" "$check/train-cpu-r$ranks" "$ranks" "$table" <<'PY' || rc=1
# The last checkpoint of every variant, GPU run against CPU run: max |diff| per tensor of /params
# and /optimizer (src/io/checkpoint.hpp), bit-identical or not. Fails on a missing variant, file or
# tensor, or a NaN; differences are reported, not judged.
import glob, os, sys
import h5py, numpy as np
gpu, cpu, ranks, table = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def last(run):
    out = {}
    for d in sorted(glob.glob(os.path.join(run, "checkpoints", "*"))):
        steps = sorted(glob.glob(os.path.join(d, "step_*.h5")))
        if steps:
            out[os.path.basename(d)] = steps[-1]
    return out
g, c = last(gpu), last(cpu)
bad = []
if not g or not c:
    sys.exit(f"FAIL: no checkpoints in {gpu if not g else cpu}")
if set(g) != set(c):
    bad.append(f"variants differ: only GPU {sorted(set(g) - set(c))}, only CPU {sorted(set(c) - set(g))}")
identical = 0
worst = (0.0, "")
rows = []
for v in sorted(set(g) & set(c)):
    if os.path.basename(g[v]) != os.path.basename(c[v]):
        bad.append(f"{v}: last checkpoints differ: {os.path.basename(g[v])} vs {os.path.basename(c[v])}")
    with h5py.File(g[v], "r") as fg, h5py.File(c[v], "r") as fc:
        names = [f"params/{k}" for k in fc["params"]] + [f"optimizer/{k}" for k in fc.get("optimizer", {})]
        same_all = True
        for n in names:
            if n not in fg:
                bad.append(f"{v}: {n} missing from the GPU checkpoint")
                continue
            a, b = fg[n][()], fc[n][()]
            if a.shape != b.shape:
                bad.append(f"{v}: {n} shape {a.shape} (GPU) vs {b.shape} (CPU)")
                continue
            if np.isnan(a).any() or np.isnan(b).any():
                bad.append(f"{v}: {n} has NaN ({'GPU' if np.isnan(a).any() else 'CPU'})")
            same = a.dtype == b.dtype and a.tobytes() == b.tobytes()
            same_all = same_all and same
            d = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            rows.append(f"r{ranks}\t{v}\t{n}\t{d:.3e}\t{'identical' if same else 'differs'}")
            if d > worst[0]:
                worst = (d, f"{v} {n}")
        identical += same_all
with open(table, "a") as t:
    t.write("".join(r + "\n" for r in rows))
print("\n".join(rows))
for b in bad:
    print("problem:", b)
n = len(set(g) & set(c))
summary = (f"r{ranks}: {identical}/{n} variants bit-identical GPU vs CPU, max |diff| {worst[0]:.3e}"
           + (f" ({worst[1]})" if worst[1] else ""))
print("RESULT:", summary)
sys.exit(1 if bad else 0)
PY
    notes+=("$(grep '^RESULT: r'"$ranks" "$logs/weights.log" | tail -1 | sed 's/^RESULT: //')")
  done
  [ "$rc" -eq 0 ] || { echo "FAIL: NaN, missing variant/tensor or no checkpoints (problem: lines above)"; return 1; }
  local joined
  joined=$(printf '%s; ' "${notes[@]}")
  echo "NOTE: ${joined}per tensor: $table"
}

# ---- run --------------------------------------------------------------------------------------------
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
rm -f "$check/not-run-on-this-gpu.tsv"
if [ "$need_packages" -eq 1 ] && ! selected_has deps; then
  # A later call on the same build (--from, --only): the prefix unpacked by an earlier deps step.
  if [ ! -f "$deps_marker" ]; then
    echo "gpu-check: missing prerequisite: $deps_prefix was not unpacked (or not completely)" >&2
    echo "hint: run the deps step first: scripts/gpu-check.sh --packages ${packages:-DIR} --from deps" >&2
    exit 3
  fi
  prefix_env "$deps_prefix" > "$logs/environment.log"
fi
for row in "${STEPS[@]}"; do
  step=$(step_field "$row" 0)
  selected_has "$step" || continue
  run_step "$step" "$(step_field "$row" 1)"
  if [ "$step" = deps ] && [ "$need_packages" -eq 1 ] && [ "${states[${#states[@]}-1]}" = PASS ]; then
    prefix_env "$deps_prefix" >> "$logs/deps.log"
  fi
done

# ---- summary and archive -------------------------------------------------------------------------
{
  echo
  echo "fastudy gpu-check ($started, git $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)$([ "$rehearse" -eq 1 ] && echo ', REHEARSAL: no GPU steps'))"
  echo "  command:   scripts/gpu-check.sh $command_line"
  echo "  GPU:       ${gpu_name:-none} (driver ${gpu_driver:-none})"
  echo "  CUDA:      nvcc ${nvcc:-none} $( [ -n "$nvcc" ] && "$nvcc" --version | sed -n 's/.*release \([^,]*\).*/\1/p'); torch.version.cuda ${torch_cuda:-none}"
  echo "  PyTorch:   ${torch_version:-none}; LibTorch: ${torch_prefix:-as CMake finds it}"
  deps_line=""
  for k in mpi+hdf5 boost tomlplusplus nlohmann_json gtest benchmark; do deps_line+="$k=${from[$k]} "; done
  echo "  deps:      $deps_line${packages:+(packages: $packages)}"
  echo "  time:      $(( $(date +%s) - t_start )) s${deadline:+ (deadline $deadline s)}${stopping:+; $stopping}"
  echo
  printf '  %-13s %-5s %6s  %s\n' step state secs note
  for i in "${!names[@]}"; do
    printf '  %-13s %-5s %6s  %s\n' "${names[$i]}" "${states[$i]}" "${times[$i]}" "${notes[$i]}"
  done
  if [ -s "$check/not-run-on-this-gpu.tsv" ]; then
    echo
    echo "  not run on this machine (they need more GPUs than it has):"
    sed 's/^/    /; s/\t/: /' "$check/not-run-on-this-gpu.tsv"
  fi
  echo
  echo "  logs and outputs: $check${archive:+; archive: $archive}"
} | tee "$check/summary.txt"

# The check's folder as one .tar.gz small enough to copy off a machine: files of 4 MiB or more (1 MiB
# when that is still over 16 MiB) are left out and listed in archive-omitted.txt inside it.
write_archive() {
  local limit list=$check/.archive-files
  for limit in 4194304 1048576; do
    (cd "$build" && find gpu-check -type f -size -"${limit}"c ! -name .archive-files | sort) > "$list"
    (cd "$build" && find gpu-check -type f ! -size -"${limit}"c | sort) > "$check/archive-omitted.txt"
    echo gpu-check/archive-omitted.txt >> "$list"
    tar -czf "$archive" -C "$build" -T "$list"
    [ "$(stat -c %s "$archive")" -ge $((16 * 1024 * 1024)) ] || break
  done
  rm -f "$list"
  say "archive: $archive ($(du -h "$archive" | cut -f1); $(wc -l < "$check/archive-omitted.txt") large file(s) left out: archive-omitted.txt)"
}
[ -z "$archive" ] || write_archive
[ -z "$stopping" ] || failed=1
exit "$failed"
