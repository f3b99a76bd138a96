#!/usr/bin/env bash
# Download the Debian packages that fastudy's build needs and a GPU image usually lacks, for a GPU
# machine without internet (scripts/gpu-check.sh --packages DIR unpacks them into a private prefix,
# no root needed).
#
#   scripts/gpu-packages.sh DIR [--no-fabrics] [--list]
#
# Run it on a Debian/Ubuntu machine of the GPU machine's architecture that reaches the archive
# (`apt-get download` works as root or as a user; run `apt-get update` first if apt has no lists).
# Pick the release whose glibc is not newer than the GPU machine's: gpu-check refuses packages that
# need a newer libc6/libstdc++6 than it finds. It writes into DIR:
#   *.deb           the packages (the closure of ROOTS below over Depends/Pre-Depends, minus EXCLUDE)
#   MANIFEST.tsv    package, version, architecture, sha256, bytes, file (one line each, '#' header)
# and prints the folder's size and its biggest packages.
#
# What is left out, and why (EXCLUDE): packages that every Debian/Ubuntu base image has (the C and
# C++ runtimes, zlib and the compression libraries of dpkg/apt, installer plumbing); the compilers
# and Fortran bindings that Debian's -dev packages pull in but fastudy does not use (it compiles C and
# C++ only, HDF5's C API only); the -dev packages of libraries that fastudy does not compile against
# (their runtime libraries stay in); documentation JavaScript and ssh (mpirun on one node needs none).
# gpu-check checks at unpack time that every shared library the prefix needs resolves, and names the
# missing one if a base image lacks something excluded here.
#
# --no-fabrics also leaves out Open MPI's network transports (libfabric, UCX, PSM/PSM2, verbs):
# mpirun on one node uses shared memory (vader) and TCP, which need none of them; gpu-check then
# disables the Open MPI components that would need them. Multi-node runs over InfiniBand need them.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# What fastudy's build and tests need (README "Quick start" and docs/build.md: the same list as scripts/setup.sh,
# without LibTorch and Python, which the GPU machine has from PyTorch).
ROOTS=(
  openmpi-bin libopenmpi-dev             # Open MPI: mpirun, mpicc/mpicxx wrappers, headers, libmpi
  libhdf5-openmpi-dev                    # parallel HDF5 (C API)
  libboost-program-options-dev           # Boost.Program_options
  libtomlplusplus-dev                    # toml++
  nlohmann-json3-dev                     # nlohmann-json (safetensors headers; header-only)
  libgtest-dev libgmock-dev              # GoogleTest / GoogleMock
  libbenchmark-dev                       # Google Benchmark
  zlib1g-dev                             # zlib headers (checksums)
  libdeflate-dev                         # libdeflate (the checksums' CRC-32; zlib's when absent)
)

# Never downloaded (nor their dependencies). Shell patterns.
EXCLUDE=(
  # in every Debian/Ubuntu base image: C/C++ runtimes, zlib, dpkg's and apt's libraries, installer bits
  libc6 libc-bin libgcc-s1 libstdc++6 zlib1g libzstd1 liblzma5 libbz2-1.0 libcrypt1 libselinux1
  libpcre2-8-0 libacl1 libattr1 libaudit1 libaudit-common libcap-ng0 libcap2 libmd0 libtinfo6
  libgpg-error0 libgcrypt20 liblz4-1 libxxhash0 libsystemd0 libdb5.3 libseccomp2 libsemanage2
  libsemanage-common libsepol2 libpam0g libpam-modules libpam-modules-bin libpam-runtime
  debconf 'debconf-2.0' cdebconf dpkg perl-base tar sensible-utils base-files base-passwd
  'libc-dev-bin' 'libc6-dev' 'linux-libc-dev' 'libcrypt-dev' 'libnsl-dev' 'libtirpc-dev' 'rpcsvc-proto'
  # compilers and Fortran: the GPU machine has its own g++; fastudy uses no Fortran
  'gcc' 'gcc-[0-9]*' 'g++' 'g++-[0-9]*' 'cpp' 'cpp-[0-9]*' 'gfortran*' 'flang*' 'libgfortran*'
  'libgcc-[0-9]*-dev' 'libstdc++-[0-9]*-dev' 'binutils*' 'libasan*' 'libtsan*' 'liblsan*' 'libubsan*'
  'libhdf5-openmpi-fortran-*' 'libhdf5-openmpi-hl-fortran-*' 'libhdf5-openmpi-cpp-*'
  'libhdf5-openmpi-hl-cpp-*' 'libhdf5-openmpi-hl-[0-9]*'
  # -dev packages of libraries fastudy does not compile against (their runtime libraries stay in)
  libibverbs-dev libhwloc-dev libevent-dev libpmix-dev libnl-3-dev libnl-route-3-dev 'libjpeg*-dev'
  'libcurl*-dev' libssl-dev libaec-dev libnuma-dev libltdl-dev libxml2-dev libudev-dev
  # optional plugins: hwloc's (X11, OpenCL, NVML, libxml2 topology import; libxml2 pulls in 10 MB
  # of ICU); the core library detects a Linux machine's topology on its own
  libhwloc-plugins
  # documentation, remote start-up, and the postinst helpers of packages that are never installed
  'libjs-*' openssh-client 'ssh-client' adduser passwd
)
FABRICS=('libfabric*' 'libucx*' 'libpsm2-*' 'libpsm-infinipath*' 'libibverbs*' 'ibverbs-providers'
         'librdmacm*' 'libefa*' 'libmlx*')

dir=""
list_only=0
no_fabrics=0
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --list) list_only=1 ;;
    --no-fabrics) no_fabrics=1 ;;
    -*) echo "gpu-packages: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$dir" ] || { echo "gpu-packages: one DIR only (see --help)" >&2; exit 2; }; dir=$1 ;;
  esac
  shift
done
[ -n "$dir" ] || [ "$list_only" -eq 1 ] || { usage >&2; exit 2; }
for tool in apt-cache apt-get dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || { echo "gpu-packages: needs $tool (a Debian/Ubuntu machine)" >&2; exit 2; }
done
[ "$no_fabrics" -eq 0 ] || EXCLUDE+=("${FABRICS[@]}")

excluded() {
  local p
  for p in "${EXCLUDE[@]}"; do
    # shellcheck disable=SC2053  # a pattern on purpose
    [[ $1 == $p ]] && return 0
  done
  return 1
}

# The direct dependencies of one package, one per line. Each Depends/Pre-Depends group
# ("a | b | <virtual>") gives its first real member, or the first provider of a virtual member; a group
# with an excluded member is dropped whole ("gfortran-12 | <gfortran-mod-15>", "libcurl4-openssl-dev |
# <libcurl-dev>"): an excluded alternative means the group is not needed.
direct_deps() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
      --no-enhances "$1" |
    awk 'NR == 1 { next }
         /^ *\|?(Pre)?Depends: / {
           if (!cont && group != "") print group
           if (!cont) group = ""
           cont = ($0 ~ /^ *\|/)
           group = group (group == "" ? "" : " ") $2
           next }
         /^    [^ ]/ { group = group "=" $1; next }
         END { if (group != "") print group }' |
    while read -r -a members; do
      local chosen="" drop=0 m name provider
      for m in "${members[@]}"; do
        name=${m%%=*}
        provider=""
        if [[ $name == \<*\> ]]; then
          name=${name#<}; name=${name%>}
          [[ $m == *=* ]] && { provider=${m#*=}; provider=${provider%%=*}; }
        fi
        if excluded "$name" || { [ -n "$provider" ] && excluded "$provider"; }; then drop=1; break; fi
        if [ -z "$chosen" ]; then
          if [ -n "$provider" ]; then chosen=$provider
          elif [[ ${m%%=*} != \<*\> ]]; then chosen=$name
          fi
        fi
      done
      [ "$drop" -eq 1 ] || [ -z "$chosen" ] || echo "$chosen"
    done
}

# The closure of ROOTS, breadth first.
declare -A seen=()
queue=()
for r in "${ROOTS[@]}"; do
  excluded "$r" || { seen[$r]=1; queue+=("$r"); }
done
i=0
while [ "$i" -lt "${#queue[@]}" ]; do
  pkg=${queue[$i]}
  i=$((i + 1))
  while read -r dep; do
    [ -n "$dep" ] || continue
    dep=${dep%:any}
    if [ -z "${seen[$dep]:-}" ] && ! excluded "$dep"; then
      seen[$dep]=1
      queue+=("$dep")
    fi
  done < <(direct_deps "$pkg")
done
mapfile -t packages < <(printf '%s\n' "${queue[@]}" | sort)

if [ "$list_only" -eq 1 ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
echo "gpu-packages: downloading ${#packages[@]} packages into $dir"
# apt-get download writes into the working directory; as root it warns that the download is
# unsandboxed (the _apt user cannot write to DIR), which is harmless here.
(cd "$dir" || exit 1; apt-get download -q "${packages[@]}" 2>&1) | { grep -v 'unsandboxed' || true; }

manifest=$dir/MANIFEST.tsv
{
  printf '# fastudy GPU-machine packages, from %s (%s), %s\n' \
    "$(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"')" "$(dpkg --print-architecture)" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  printf '# package\tversion\tarchitecture\tsha256\tbytes\tfile\n'
  missing=()
  for p in "${packages[@]}"; do
    shopt -s nullglob
    files=("$dir/${p}_"*.deb)
    shopt -u nullglob
    if [ ${#files[@]} -ne 1 ]; then missing+=("$p"); continue; fi
    f=${files[0]}
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$p" "$(dpkg-deb -f "$f" Version)" \
      "$(dpkg-deb -f "$f" Architecture)" "$(sha256sum "$f" | cut -d' ' -f1)" "$(stat -c %s "$f")" \
      "$(basename "$f")"
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "gpu-packages: not downloaded (or more than one file each): ${missing[*]}" >&2
    echo "hint: run apt-get update, then this script again" >&2
    exit 1
  fi
} > "$manifest"

total=$(awk -F'\t' '!/^#/ { s += $5 } END { print s }' "$manifest")
echo "gpu-packages: ${#packages[@]} packages, $((total / 1024)) KiB in .deb files ($(du -sh "$dir" | cut -f1) on disk); manifest: $manifest"
echo "gpu-packages: the biggest:"
awk -F'\t' '!/^#/ { printf "  %8d KiB  %s %s\n", $5 / 1024, $1, $2 }' "$manifest" | sort -rn | head -12
