#!/usr/bin/env python3
"""Writes the imported runs of test_reduce.cpp: 12 runs (attention math/fa2 x precision fp32/bf16 x seed
1/2/3) at steps 10 and 20, as safetensors (F32) of three tensors: "big" (300,000 values: at least
kSplitElements, so on several ranks it is sorted over all of them), "w" (4,096) and "b" (16). bf16 runs
hold bf16-rounded values (many ties); attention moves the weights a little, precision more, the seed
most.

Usage: write_reduce_runs.py DIR
"""
import json
import os
import struct
import sys

import numpy as np

ATTENTION = ["math", "fa2"]
PRECISION = ["fp32", "bf16"]
SEEDS = [1, 2, 3]
STEPS = [10, 20]
SIZES = {"big": 300_000, "w": 4096, "b": 16}


def bf16_round(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        raw = tensors[name].astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": [tensors[name].size], "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main(root):
    drift = {n: np.random.default_rng(100 + i).standard_normal(s).astype(np.float32) for i, (n, s) in enumerate(SIZES.items())}
    for a in ATTENTION:
        for p in PRECISION:
            for seed in SEEDS:
                base = {n: np.random.default_rng(seed * 10 + i).standard_normal(s).astype(np.float32) * np.float32(0.02)
                        for i, (n, s) in enumerate(SIZES.items())}
                nudge = {n: np.random.default_rng(1000 * seed + 7 * (a == "fa2") + i).standard_normal(s).astype(np.float32)
                         for i, (n, s) in enumerate(SIZES.items())}
                for step in STEPS:
                    t = {}
                    for n in SIZES:
                        w = base[n] + drift[n] * np.float32(1e-4 * step)
                        if a == "fa2":
                            w = w + nudge[n] * np.float32(1e-6 * step)
                        t[n] = bf16_round(w) if p == "bf16" else w
                    folder = os.path.join(root, f"{a}-{p}-s{seed}")
                    os.makedirs(folder, exist_ok=True)
                    write_safetensors(os.path.join(folder, f"step_{step}.safetensors"), t)


if __name__ == "__main__":
    main(sys.argv[1])
