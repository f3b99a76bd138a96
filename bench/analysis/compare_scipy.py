#!/usr/bin/python3
"""Time scipy.stats.wasserstein_distance on the data set bench_wasserstein exported, check that its
values agree with the C++ W1 matrix, and print the speed ratio and the memory-bandwidth floor.

Run with Debian's interpreter (it sees python3-scipy):
    bench_wasserstein --export DIR && /usr/bin/python3 bench/analysis/compare_scipy.py DIR [--pairs K]
or both at once: bench/analysis/run_w1_vs_scipy.sh BUILD_DIR [K].

DIR holds variants.f32 (V*n float32, variant-major), w1.f64 (V*V float64, the C++ matrix) and
meta.txt (sizes and the C++ timings, seconds, best of K repetitions).

scipy takes about 1 s per pair of 1e6-element arrays here, so all 276 pairs take ~5 minutes: by
default K = 12 pairs spread evenly over the upper triangle are timed and the full-matrix time is
extrapolated as (mean time per pair) x (number of pairs); --pairs all times every pair. The C++ side
reports the median of its repetitions. Wall-clock and CPU-time ratios are both printed: on a shared
machine the CPU-time one is the less disturbed by other jobs.
"""
import argparse
import os
import sys
import time

import numpy as np

try:
    import scipy
    from scipy.stats import wasserstein_distance
except ImportError:
    sys.exit("compare_scipy.py: scipy is not importable by " + sys.executable +
             "\nhint: apt-get install python3-scipy and run with /usr/bin/python3")

U = 2.0 ** -53  # fp64 unit roundoff


def agreement_bound(w1, lo, hi):
    """Largest |scipy - C++| the two fp64 computations can differ by, for W1 = w1 on support [lo, hi].
    Ours is within 2^9 u w1 of the exact value (tests/analysis/test_pairwise.cpp). scipy sums
    |F_u - F_v| * delta over the merged support, with F = i/n rounded (error <= u each): the CDF
    difference is off by <= 2u absolutely however small it is, so the integral by <= 2u (hi - lo), plus
    one rounding per product (u w1) and numpy's pairwise sum of 2n terms (<= (log2(2n) + 1) u w1).
    Round 2^9 + 23 up to 2^10 and 2u (hi - lo) up to 4u (hi - lo)."""
    return 2.0 ** 10 * U * w1 + 4 * U * (hi - lo)


def read_meta(path):
    meta = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition("=")
            meta[key.strip()] = value.strip()
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--pairs", default="12", help="number of pairs to time with scipy, or 'all'")
    args = ap.parse_args()

    meta = read_meta(os.path.join(args.dir, "meta.txt"))
    V, n = int(meta["variants"]), int(meta["n"])
    x = np.fromfile(os.path.join(args.dir, "variants.f32"), dtype="<f4")
    if x.size != V * n:
        sys.exit(f"compare_scipy.py: variants.f32 has {x.size} values, expected {V} x {n}")
    x = x.reshape(V, n)
    w1_cpp = np.fromfile(os.path.join(args.dir, "w1.f64"), dtype="<f8").reshape(V, V)

    all_pairs = [(i, j) for i in range(V) for j in range(i + 1, V)]
    k = len(all_pairs) if args.pairs == "all" else max(1, min(int(args.pairs), len(all_pairs)))
    chosen = [all_pairs[(t * len(all_pairs)) // k] for t in range(k)]

    worst = 0.0
    times, cpu_times = [], []
    for i, j in chosen:
        t0, c0 = time.perf_counter(), time.process_time()
        w = wasserstein_distance(x[i], x[j])
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        lo = float(min(x[i].min(), x[j].min()))
        hi = float(max(x[i].max(), x[j].max()))
        diff, bound = abs(w - w1_cpp[i, j]), agreement_bound(w, lo, hi)
        worst = max(worst, diff / bound)
        if diff > bound:
            sys.exit(f"compare_scipy.py: pair ({i}, {j}): scipy {w!r} vs C++ {w1_cpp[i, j]!r} "
                     f"differ by {diff:.2e} > the bound {bound:.2e}")

    per_pair = sum(times) / len(times)
    scipy_total = per_pair * len(all_pairs)
    scipy_cpu = sum(cpu_times) / len(cpu_times) * len(all_pairs)
    cpp_total = float(meta["cpp_total_seconds"])
    cpp_cpu = float(meta["cpp_total_cpu_seconds"])
    cpp_sort = float(meta["cpp_sort_seconds"])
    cpp_pairs = float(meta["cpp_pairs_seconds"])
    stream = float(meta["stream_seconds"])
    gbps = float(meta["stream_gbps"])
    mb = float(meta["stream_bytes"]) / 1e6
    how = "measured" if k == len(all_pairs) else f"extrapolated from {k} timed pairs"

    print(f"# W1 matrix, {V} variants x {n} float32 parameters, {len(all_pairs)} pairs, one thread")
    print(f"# scipy {scipy.__version__}, numpy {np.__version__}; load average {os.getloadavg()[0]:.2f}")
    print(f"values: scipy and C++ agree on {k} pairs; the largest difference is {worst:.2g} of its "
          f"rounding bound")
    print(f"scipy.stats.wasserstein_distance: {per_pair:.3f} s per pair, {scipy_total:.1f} s for the "
          f"matrix ({how})")
    print(f"C++ (sort each variant once + {len(all_pairs)} linear passes, median of {meta['reps']}): "
          f"{cpp_total:.3f} s (sort {cpp_sort:.3f} s, pairs {cpp_pairs:.3f} s)")
    print(f"speed-up over scipy: {scipy_total / cpp_total:.0f}x wall clock, {scipy_cpu / cpp_cpu:.0f}x CPU "
          f"time (target >= 300x)")
    print(f"bandwidth floor: one streaming read of the {mb:.0f} MB takes {stream * 1e3:.1f} ms "
          f"({gbps:.1f} GB/s); the pair passes take {cpp_pairs / stream:.1f}x that, the whole job "
          f"{cpp_total / stream:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
