#!/usr/bin/env python3
"""No code the linker shares between translation units is compiled for AVX2 or AVX-512.

The attention kernels are compiled three times, under `#pragma GCC target` for AVX-512 and AVX2 and for
the portable baseline (kernels/attention_isa_*.cpp), and called by the CPU's features. An inline function
or template first defined inside such a target region is compiled for that target and emitted as a weak
(COMDAT) symbol; the linker keeps one instance for every caller, so the portable path can run AVX-512
instructions and die with SIGILL on a CPU without them. Each binary given is read with nm (its weak
functions) and objdump (the functions that use a ymm or zmm register); any function in both fails,
named. x86-64 only.

  check_isa_linkage.py BINARY...
"""
import platform
import re
import subprocess
import sys


def weak_functions(binary):
    out = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    return {parts[2] for parts in (line.split() for line in out.splitlines()) if len(parts) == 3 and parts[1] in "Ww"}


def vector_functions(binary):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True,
                         check=True).stdout
    found, current = set(), None
    label = re.compile(r"^[0-9a-f]+ <(.+)>:$")
    for line in out.splitlines():
        m = label.match(line)
        if m:
            current = m.group(1)
        elif current and ("%ymm" in line or "%zmm" in line):
            found.add(current)
    return found


def main():
    if platform.machine() not in ("x86_64", "AMD64"):
        print("not x86-64: nothing to check")
        return 0
    bad = 0
    for binary in sys.argv[1:]:
        shared = sorted(weak_functions(binary) & vector_functions(binary))
        if shared:
            names = subprocess.run(["c++filt"], input="\n".join(shared), capture_output=True, text=True).stdout
            print(f"{binary}: {len(shared)} weak function(s) use AVX2/AVX-512 registers; the linker may call them "
                  "on any CPU (define their headers before the `#pragma GCC target`):\n  " +
                  "\n  ".join(names.splitlines()[:20]))
            bad += 1
        else:
            print(f"{binary}: no weak function uses AVX2/AVX-512 registers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
