#!/usr/bin/env bash
# Install fastudy's dependencies from Debian's packages and build the program, `fastudy` (Release, CPU;
# the CUDA parts too when this machine has a GPU and nvcc): what the demo needs. The tests and benchmarks are built by
# scripts/test.sh, in the same build folder, on top of this build. Usage: scripts/setup.sh [BUILD_DIR]
# (default: build)
# FASTUDY_EXTRA_PACKAGES (space-separated) adds Debian packages to the same install (scripts/test.sh
# uses it for what only the tests need). Safe to run again: apt skips what is installed and the build
# is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}

packages=(
  build-essential cmake pkg-config ccache git
  libtorch-dev libopenblas0-openmp            # LibTorch; OpenBLAS instead of the reference BLAS (~10x faster)
  libopenmpi-dev openmpi-bin                  # MPI
  libhdf5-openmpi-dev hdf5-tools zlib1g-dev   # parallel HDF5 (+ h5dump), zlib for checksums
  libdeflate-dev                              # the checksums' CRC-32, twice as fast as zlib's
  libboost-program-options-dev libtomlplusplus-dev nlohmann-json3-dev   # CLI, grid.toml, safetensors headers
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-matplotlib python3-h5py python3-scipy python3-numpy   # plots, report, scipy cross-checks
)

# shellcheck disable=SC2206  # word splitting of the package list is intended
packages+=(${FASTUDY_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA parts (kernels/cuda, the NCCL reducer) are built where a GPU is visible. Without one the demo
# runs none of them, and nvcc's compiles are about a third of the program's build: they are left out
# (FASTUDY_CUDA=OFF). scripts/test.sh builds them wherever nvcc is found (FASTUDY_SETUP_CUDA=AUTO), for
# the GPU code's compile checks.
cuda=${FASTUDY_SETUP_CUDA:-}
if [ -z "$cuda" ]; then
  if [ -e /dev/nvidiactl ] || nvidia-smi -L > /dev/null 2>&1; then cuda=AUTO; else cuda=OFF; fi
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DFASTUDY_CUDA="$cuda"
cmake --build "$build_dir" -j2 --target fastudy
echo "setup: built $build_dir/fastudy"
