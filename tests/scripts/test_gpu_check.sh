#!/usr/bin/env bash
# Checks of scripts/gpu-check.sh that need no GPU (see CMakeLists.txt here).
#   test_gpu_check.sh cli|unpack PATH/TO/gpu-check.sh WORKDIR
set -euo pipefail
what=$1 script=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
fail() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

if [ "$what" = cli ]; then
  out=$("$script" --help) || fail "--help exited with $?"
  grep -q -- '--packages DIR' <<< "$out" || fail "--help does not describe --packages: $out"
  grep -q -- '--rehearse' <<< "$out" || fail "--help does not describe --rehearse"

  # A driver that does not answer, first on PATH: the check must stop before any work, exit 3, and
  # say that nvidia-smi is the problem.
  mkdir -p "$work/bin"
  printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver" >&2\nexit 9\n' \
    > "$work/bin/nvidia-smi"
  chmod +x "$work/bin/nvidia-smi"
  rc=0
  out=$(PATH="$work/bin:$PATH" "$script" --build "$work/build" 2>&1) || rc=$?
  [ "$rc" -eq 3 ] || fail "with a failing nvidia-smi: exit $rc, want 3; output: $out"
  grep -q 'missing prerequisite: nvidia-smi sees no GPU' <<< "$out" || fail "the message does not name nvidia-smi: $out"
  [ ! -e "$work/build/CMakeCache.txt" ] || fail "configured a build although a prerequisite is missing"

  # Bad usage: exit 2 before anything runs, naming the option.
  usage_case() {  # usage_case EXPECTED-TEXT ARGS...
    local want=$1 rc=0 out
    shift
    out=$("$script" "$@" 2>&1) || rc=$?
    [ "$rc" -eq 2 ] || fail "$*: exit $rc, want 2 (usage); output: $out"
    grep -qF -- "$want" <<< "$out" || fail "$*: the message does not say '$want': $out"
  }
  usage_case "--jobs wants a positive integer" --jobs zero
  usage_case "--only: no step 'nosuch'" --only deps,nosuch
  usage_case "--from: no step 'nosuch'" --from nosuch
  usage_case "--only and --from exclude each other" --only deps --from build
  usage_case "--deadline wants a positive number" --deadline soon
  usage_case "must end in .tar.gz" --archive "$work/check.zip"
  usage_case "--rehearse runs no GPU step (build)" --rehearse --only configure,build

  # The step list: every step, the default ones marked.
  out=$("$script" --list)
  for step in deps mpi-smoke configure build ctest-gpu microbench train-gpu-r1 weights report bench ctest-all; do
    grep -qE "^$step +" <<< "$out" || fail "--list lacks $step: $out"
  done
  grep -qE '^ctest-all +on request' <<< "$out" || fail "--list: ctest-all is not marked as on request: $out"
  grep -qE '^report +default' <<< "$out" || fail "--list: report is not a default step: $out"

  # A rehearsal of the steps that need no GPU nor packages (this machine has its dependencies, or the
  # check stops with exit 3 before any step): the selected steps only, their logs and the summary in
  # one folder, and that folder as one archive. Then a deadline that has passed: no step starts, the
  # summary says why, exit 1, and the archive is written all the same.
  rc=0
  out=$("$script" --rehearse --build "$work/b" --only deps,mpi-smoke --archive "$work/check.tar.gz" 2>&1) || rc=$?
  if [ "$rc" -eq 3 ]; then
    echo "gpu_check_cli: this machine lacks a dependency (exit 3): the rehearsal part is not checked: $out"
  else
    [ "$rc" -eq 0 ] || fail "--rehearse --only deps,mpi-smoke: exit $rc; output: $out"
    grep -qE '^  deps +(PASS|SKIP)' "$work/b/gpu-check/summary.txt" || fail "no deps row in the summary: $out"
    grep -qE '^  mpi-smoke +(PASS|SKIP)' "$work/b/gpu-check/summary.txt" || fail "no mpi-smoke row: $out"
    ! grep -qE '^  configure ' "$work/b/gpu-check/summary.txt" || fail "--only ran configure: $out"
    listing=$(tar -tzf "$work/check.tar.gz") || fail "no readable archive at $work/check.tar.gz"
    for f in gpu-check/summary.txt gpu-check/logs/deps.log gpu-check/logs/mpi-smoke.log gpu-check/archive-omitted.txt; do
      grep -qxF "$f" <<< "$listing" || fail "the archive lacks $f: $listing"
    done
    rc=0
    out=$("$script" --rehearse --build "$work/b" --only configure --deadline 1 --archive "$work/late.tar.gz" 2>&1) || rc=$?
    [ "$rc" -eq 1 ] || fail "a passed deadline: exit $rc, want 1; output: $out"
    grep -qE '^  configure +SKIP .*not started: the deadline \(--deadline 1\) was reached' "$work/b/gpu-check/summary.txt" ||
      fail "the summary does not say that the deadline stopped configure: $(cat "$work/b/gpu-check/summary.txt")"
    [ ! -e "$work/b/CMakeCache.txt" ] || fail "configure ran after the deadline"
    # The listing is read whole before grep looks at it: `tar | grep -q` under pipefail fails when
    # grep stops at its first match and tar gets SIGPIPE.
    listing=$(tar -tzf "$work/late.tar.gz") || fail "no readable archive after the deadline"
    grep -qxF gpu-check/summary.txt <<< "$listing" || fail "no summary in the archive after the deadline: $listing"
  fi
  echo "gpu_check_cli: --help, --list, exit 3 naming nvidia-smi, exit 2 on bad usage, --only, --deadline, --archive: ok"
  exit 0
fi

[ "$what" = unpack ] || fail "unknown check '$what'"
arch=$(dpkg --print-architecture 2>/dev/null || true)
[ -n "$arch" ] || case "$(uname -m)" in x86_64) arch=amd64 ;; aarch64) arch=arm64 ;; *) arch=$(uname -m) ;; esac

# make_deb NAME ARCH DEPENDS: a package with one file and one relative symlink.
make_deb() {
  local root="$work/src/$1"
  mkdir -p "$root/DEBIAN" "$root/usr/share/$1"
  printf 'Package: %s\nVersion: 1.0\nArchitecture: %s\nMaintainer: fastudy tests <none@example.org>\nDescription: test package\n' \
    "$1" "$2" > "$root/DEBIAN/control"
  [ -z "$3" ] || printf 'Depends: %s\n' "$3" >> "$root/DEBIAN/control"
  echo "payload of $1" > "$root/usr/share/$1/data.txt"
  ln -s data.txt "$root/usr/share/$1/link.txt"
  mkdir -p "$work/debs-$1"
  dpkg-deb -Zgzip -b "$root" "$work/debs-$1/$1_1.0_$2.deb" > /dev/null
}
manifest() {  # manifest DIR: MANIFEST.tsv as scripts/gpu-packages.sh writes it
  local f
  { printf '# test\n# package\tversion\tarchitecture\tsha256\tbytes\tfile\n'
    for f in "$1"/*.deb; do
      printf '%s\t1.0\t%s\t%s\t%s\t%s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Architecture)" \
        "$(sha256sum "$f" | cut -d' ' -f1)" "$(stat -c %s "$f")" "$(basename "$f")"
    done; } > "$1/MANIFEST.tsv"
}

# A good package: unpacked, the symlink kept.
make_deb fastudy-test-good "$arch" "libc6 (>= 2.2)"
manifest "$work/debs-fastudy-test-good"
"$script" --unpack-only --packages "$work/debs-fastudy-test-good" --prefix "$work/p1" > "$work/good.log" 2>&1 ||
  fail "unpacking a good package failed: $(cat "$work/good.log")"
[ "$(cat "$work/p1/usr/share/fastudy-test-good/link.txt")" = "payload of fastudy-test-good" ] ||
  fail "the package's file or symlink is not in the prefix"

# A package changed after the manifest was written.
cp -r "$work/debs-fastudy-test-good" "$work/debs-damaged"
sed -i -E 's/\t[0-9a-f]{64}\t/\t0000000000000000000000000000000000000000000000000000000000000000\t/' "$work/debs-damaged/MANIFEST.tsv"
rc=0
"$script" --unpack-only --packages "$work/debs-damaged" --prefix "$work/p2" > "$work/damaged.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a checksum mismatch was accepted"
grep -q 'does not match MANIFEST.tsv' "$work/damaged.log" || fail "no checksum message: $(cat "$work/damaged.log")"
[ ! -e "$work/p2/usr/share" ] || fail "unpacked although the checksum does not match"

# A package for another architecture.
other=s390x
[ "$arch" != s390x ] || other=amd64
make_deb fastudy-test-arch "$other" ""
manifest "$work/debs-fastudy-test-arch"
rc=0
"$script" --unpack-only --packages "$work/debs-fastudy-test-arch" --prefix "$work/p3" > "$work/arch.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a package for $other was accepted on $arch"
grep -q "is for $other, this machine is $arch" "$work/arch.log" || fail "no architecture message: $(cat "$work/arch.log")"

# A package that needs a newer glibc than any machine has.
if getconf GNU_LIBC_VERSION > /dev/null 2>&1; then
  make_deb fastudy-test-glibc "$arch" "libc6 (>= 99.0)"
  manifest "$work/debs-fastudy-test-glibc"
  rc=0
  "$script" --unpack-only --packages "$work/debs-fastudy-test-glibc" --prefix "$work/p4" > "$work/glibc.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "a package needing glibc 99.0 was accepted"
  grep -q 'need glibc >= 99.0' "$work/glibc.log" || fail "no glibc message: $(cat "$work/glibc.log")"
fi
# Isolation from another MPI: the settings of another Open MPI or PMIx in the environment are dropped
# (and named), and PMIx's parameter file in the prefix names the prefix's components, not the
# system's (where an image keeps its own PMIx).
triplet=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
root="$work/src/fastudy-test-pmix"
mkdir -p "$root/DEBIAN" "$root/usr/lib/$triplet/pmix2/share" "$root/usr/lib/$triplet/pmix2/lib/pmix"
printf 'Package: libpmix-fastudy-test\nVersion: 1.0\nArchitecture: %s\nMaintainer: fastudy tests <none@example.org>\nDescription: test package\n' \
  "$arch" > "$root/DEBIAN/control"
printf 'mca_base_component_path = /usr/lib/%s/pmix2/lib/pmix\n' "$triplet" > "$root/usr/lib/$triplet/pmix2/share/pmix-mca-params.conf"
mkdir -p "$work/debs-pmix"
dpkg-deb -Zgzip -b "$root" "$work/debs-pmix/libpmix-fastudy-test_1.0_$arch.deb" > /dev/null
manifest "$work/debs-pmix"
OMPI_MCA_pml=ucx PMIX_MCA_gds=hash OPAL_PREFIX=/opt/other/ompi \
  "$script" --unpack-only --packages "$work/debs-pmix" --prefix "$work/p5" > "$work/pmix.log" 2>&1 ||
  fail "unpacking the PMIx test package failed: $(cat "$work/pmix.log")"
for v in OMPI_MCA_pml=ucx PMIX_MCA_gds=hash OPAL_PREFIX=/opt/other/ompi; do
  grep -q "environment of another MPI, dropped for the unpacked one: .*$v" "$work/pmix.log" ||
    fail "$v was not dropped (or not named): $(cat "$work/pmix.log")"
done
grep -qxF "mca_base_component_path = $work/p5/usr/lib/$triplet/pmix2/lib/pmix" "$work/p5/usr/lib/$triplet/pmix2/share/pmix-mca-params.conf" ||
  fail "the prefix's PMIx parameter file still names the system's components: $(cat "$work/p5/usr/lib/$triplet/pmix2/share/pmix-mca-params.conf")"
echo "gpu_check_unpack: unpack, checksum, architecture and glibc checks, isolation from another MPI: ok"
