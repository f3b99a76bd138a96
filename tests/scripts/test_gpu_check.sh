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

  rc=0
  out=$("$script" --jobs zero 2>&1) || rc=$?
  [ "$rc" -eq 2 ] || fail "--jobs zero: exit $rc, want 2 (usage)"
  echo "gpu_check_cli: --help, exit 3 naming nvidia-smi, exit 2 on bad usage: ok"
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
echo "gpu_check_unpack: unpack, checksum, architecture and glibc checks: ok"
