#!/usr/bin/env python3
"""Cross-check fastudy's deviation.csv against scipy.stats.wasserstein_distance on the checkpoint
tensors themselves (read with h5py): every tensor and the whole model, every pair, every step.

usage: check_w1_scipy.py OUT     (exit 0 when all agree)
"""
import csv
import sys

import h5py
import numpy as np
from scipy.stats import wasserstein_distance

# fastudy accumulates W1 exactly and rounds once; scipy sums in float64 over a merged support, with
# relative error about n * 2^-53 for n values (n <= 1e5 here): 1e-9 leaves a wide margin.
REL_TOL = 1e-9


def params(out, variant, step):
    path = f"{out}/checkpoints/{variant}/step_{int(step):07d}.h5"
    with h5py.File(path, "r") as f:
        return {name: np.asarray(f["params"][name][...], dtype=np.float64).ravel() for name in f["params"]}


def main(out):
    rows = [r for r in csv.DictReader(line for line in open(f"{out}/deviation.csv") if not line.startswith("#"))]
    cache = {}
    checked = 0
    for r in rows:
        for v in (r["variant_a"], r["variant_b"]):
            if (v, r["step"]) not in cache:
                cache[(v, r["step"])] = params(out, v, r["step"])
        pa, pb = cache[(r["variant_a"], r["step"])], cache[(r["variant_b"], r["step"])]
        if r["tensor"] == "model":
            a, b = np.concatenate(list(pa.values())), np.concatenate(list(pb.values()))
        else:
            a, b = pa[r["tensor"]], pb[r["tensor"]]
        w1 = wasserstein_distance(a, b)
        mine = float(r["w1"])
        if abs(mine - w1) > REL_TOL * max(abs(w1), 1e-300):
            print(f"W1 mismatch step {r['step']} {r['tensor']} {r['variant_a']} {r['variant_b']}: fastudy {mine!r} scipy {w1!r}")
            return 1
        max_abs = float(np.max(np.abs(a - b)))
        if float(r["max_abs"]) != max_abs:
            print(f"max_abs mismatch {r}: numpy {max_abs!r}")
            return 1
        checked += 1
    print(f"checked {checked} rows against scipy.stats.wasserstein_distance")
    return 0 if checked else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
