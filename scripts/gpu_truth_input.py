#!/usr/bin/env python3
"""Turns one recorded case of a GPU truth file into a fastudy microbenchmark input file.

A truth file (shared/gpu-truth/*.h5, written on a GPU by running PyTorch's scaled_dot_product_attention
with one backend) holds groups cNN with attributes B, H, N, d, causal, format (fp16, bf16) and the raw
16-bit patterns of q, k, v, do and of the flash backend's outputs flash/o, flash/dq, flash/dk, flash/dv,
plus flash/lse in float32. This writes them as a safetensors file with the tensors q, k, v, do, o, lse,
dq, dk, dv ([B, H, N, d]; lse [B, H, N]) in their own dtypes (F16 or BF16; lse F32), which
`fastudy microbench` reads with distribution = "file": its "file" rows then compare the GPU kernel's
outputs with a reading, element by element (docs: "Bit for bit with the real kernel").

safetensors is a header length (8 bytes, little-endian), a JSON header naming each tensor's dtype, shape
and byte range, then the raw little-endian buffers: a few lines here, no package needed.

Usage: gpu_truth_input.py TRUTH.h5 GROUP OUT.safetensors [--heads FIRST:LAST] [--print-attrs]
  --heads keeps heads FIRST..LAST-1 of every batch entry (a smaller file for tests);
  --print-attrs prints "N d causal format heads batch" of the written file.
"""
import argparse
import json
import struct
import sys

import h5py
import numpy as np


def write_safetensors(path, tensors):
    """tensors: name -> (dtype word, numpy array); buffers in name order."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, array = tensors[name]
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("truth")
    parser.add_argument("group")
    parser.add_argument("out")
    parser.add_argument("--heads", help="FIRST:LAST, the heads to keep")
    parser.add_argument("--print-attrs", action="store_true")
    args = parser.parse_args()
    with h5py.File(args.truth, "r") as f:
        if args.group not in f:
            sys.exit(f"{args.truth}: no group {args.group}; it holds {', '.join(f.keys())}")
        g = f[args.group]
        fmt = text(g.attrs["format"])
        if fmt not in ("fp16", "bf16"):
            sys.exit(f"{args.truth}/{args.group}: format {fmt}; this converter reads fp16 and bf16 cases")
        word = "F16" if fmt == "fp16" else "BF16"
        heads = slice(None)
        if args.heads:
            first, last = (int(x) for x in args.heads.split(":"))
            heads = slice(first, last)
        tensors = {}
        for name, path in (("q", "q"), ("k", "k"), ("v", "v"), ("do", "do"), ("o", "flash/o"), ("dq", "flash/dq"),
                           ("dk", "flash/dk"), ("dv", "flash/dv")):
            bits = np.asarray(g[path], dtype=np.uint16)[:, heads]
            tensors[name] = (word, bits.astype("<u2"))
        lse = np.asarray(g["flash/lse"], dtype=np.float32)[:, heads]
        tensors["lse"] = ("F32", lse.astype("<f4"))
        write_safetensors(args.out, tensors)
        if args.print_attrs:
            b, h, n, d = tensors["q"][1].shape
            print(n, d, int(g.attrs["causal"]), fmt, h, b)


if __name__ == "__main__":
    main()
