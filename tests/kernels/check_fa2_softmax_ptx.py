#!/usr/bin/env python3
"""Reads in nvcc's PTX for fa2_softmax_ptx.cu which floating-point steps of FlashAttention-2's online softmax
nvcc contracts into an fma, and fails unless they are the ones kernels/detail/fa2_pytorch.hpp models:

  rescale_and_sum  per row, exactly one fma: row_sum * scores_scale (scores_scale the ex2.approx of the
                   rescale) + the P of the row's first column (an ex2.approx), whose result starts the
                   chain of adds over the row's other columns; no fma inside the exponent arguments
                   (UNFUSE_FMA: __fmul_rn, then a subtraction).
  normalize_lse    per row: fma(row_max, softmax_scale, lg2.approx(sum) * ln 2), the product by ln 2
                   (0f3F317218, __logf) rounded on its own.

Usage: check_fa2_softmax_ptx.py NVCC SOURCE.cu   (compiles for sm_90 with nvcc's default flags, -O3)
"""
import re
import subprocess
import sys
import tempfile

ROWS = 2  # kRows of fa2_softmax_ptx.cu


def kernels(ptx):
    """name -> list of (opcode, dest, sources) of the kernel's body."""
    out = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\((.*?)\)\s*\{(.*?)\n\}", ptx, re.S):
        body = []
        for line in m.group(3).splitlines():
            line = line.split("//")[0].strip().rstrip(";")
            op = re.match(r"([a-z][\w.]*)\s+(.*)", line)
            if not op:
                continue
            args = [a.strip() for a in op.group(2).split(",")]
            body.append((op.group(1), args[0], args[1:]))
        out[m.group(1)] = body
    return out


def fail(msg):
    sys.exit("check_fa2_softmax_ptx: " + msg)


def main():
    nvcc, source = sys.argv[1], sys.argv[2]
    with tempfile.NamedTemporaryFile(suffix=".ptx") as f:
        subprocess.run([nvcc, "-arch=sm_90", "-O3", "-ptx", source, "-o", f.name], check=True)
        ptx = open(f.name).read()
    ks = kernels(ptx)
    for name in ("rescale_and_sum", "normalize_lse"):
        if name not in ks:
            fail(f"no kernel {name} in the PTX of {source}")

    body = ks["rescale_and_sum"]
    defs = {dest: op for op, dest, _ in body}
    fmas = [(dest, srcs) for op, dest, srcs in body if op.startswith("fma")]
    if len(fmas) != ROWS:
        fail(f"rescale_and_sum: {len(fmas)} fma, expected {ROWS} (one per row): {fmas}")
    for dest, (a, b, c) in fmas:
        kinds = sorted(defs.get(x, "input") for x in (a, b))
        if not (kinds[0].startswith("ex2") and kinds[1].startswith("ld")) or not defs.get(c, "").startswith("ex2"):
            fail(f"rescale_and_sum: {dest} = fma({a}, {b}, {c}) is not row_sum * scores_scale + P")
        users = [op for op, _, srcs in body if dest in srcs]
        if users != ["add.f32"]:
            fail(f"rescale_and_sum: the fma {dest} feeds {users}, not the next add of the row sum")
    print(f"rescale_and_sum: {ROWS} rows, row_sum = fma(row_sum, scores_scale, P[0]) then adds")

    body = ks["normalize_lse"]
    defs = {dest: (op, srcs) for op, dest, srcs in body}
    found = 0
    for op, dest, (a, b, c) in [(op, d, s) for op, d, s in body if op.startswith("fma")]:
        mop, msrcs = defs.get(c, ("", []))
        if mop == "mul.f32" and "0f3F317218" in msrcs and any(defs.get(x, ("",))[0].startswith("lg2.approx") for x in msrcs):
            found += 1
    if found != ROWS:
        fail(f"normalize_lse: {found} rows with fma(row_max, softmax_scale, lg2.approx(sum) * ln2), expected {ROWS}")
    print(f"normalize_lse: {ROWS} rows, lse = fma(row_max, softmax_scale, lg2.approx(sum) * 0f3F317218)")


if __name__ == "__main__":
    main()
