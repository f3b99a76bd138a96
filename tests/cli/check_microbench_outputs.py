#!/usr/bin/env python3
"""Checks OUT/microbench_outputs.h5 against OUT/microbench.csv the way a user would use them, with h5py,
numpy and Python's PyTorch (the same LibTorch fastudy links):

  - every point group has the layout docs/microbench.md "Real kernels" documents (attributes, inputs, one group per
    algorithm with o or dq, dk, dv of shape [B, H, N, d]);
  - every row of microbench.csv is recomputed from the saved values: max |d| against the golden value (and
    flash_vs_baseline's against baseline) equal to the CSV's bit for bit, and the real code's bit_identical
    fraction against the reading it names (saved as ALGORITHM_reading);
  - a user's own framework run on the saved inputs: the baseline written in Python as PyTorch users write it,
    softmax((q @ k^T) * scale) @ v on bf16 tensors (autograd for the backward pass), gives torch_baseline's
    saved output bit for bit.

With a second directory OTHER (the same grid run on another number of ranks), also checks that its
microbench_outputs.h5 holds the same groups, attributes and values, bit for bit.

Prints one line per check; exits 1 with the first failure named.
Usage: check_microbench_outputs.py OUT [OTHER]
"""
import csv
import io
import math
import sys
from pathlib import Path

import h5py
import numpy as np
import torch

POINT_COLUMNS = ("sweep", "pass", "format", "policy", "seq_len", "head_dim", "block_q", "block_kv", "loop_order",
                 "causal", "trial", "distribution")


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def csv_rows(out):
    text = (out / "microbench.csv").read_text()
    body = "\n".join(l for l in text.splitlines() if l and not l.startswith("#"))
    return list(csv.DictReader(io.StringIO(body)))


def attr(g, name):
    v = g.attrs[name]
    return v.decode() if isinstance(v, bytes) else str(v)


def outputs(group, names):
    return np.concatenate([group[n][()].ravel() for n in names])


def python_baseline(q, k, v, dout, causal, backward):
    """The baseline as a PyTorch user writes it, on bf16 tensors (nanoGPT's attention)."""
    q, k, v = (torch.from_numpy(x).to(torch.bfloat16).requires_grad_(backward) for x in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    if causal:
        n = q.size(-2)
        att = att.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(att, dim=-1) @ v
    if not backward:
        return o.detach().double().numpy().ravel()
    o.backward(torch.from_numpy(dout).to(torch.bfloat16))
    return np.concatenate([t.grad.double().numpy().ravel() for t in (q, k, v)])


def main(out):
    out = Path(out)
    rows = csv_rows(out)
    f = h5py.File(out / "microbench_outputs.h5", "r")
    if attr(f, "format") != "fastudy-microbench-outputs/1":
        fail("the file's format attribute is " + attr(f, "format"))
    points = f["points"]
    checked = python_checked = 0
    for name in points:
        g = points[name]
        key = {c: attr(g, c) for c in POINT_COLUMNS}
        backward = key["pass"] == "backward"
        names = ["dq", "dk", "dv"] if backward else ["o"]
        shape = tuple(int(g.attrs[c]) for c in ("batch", "heads", "seq_len", "head_dim"))
        for t in ["q", "k", "v"] + (["do"] if backward else []):
            if g[t].shape != shape or g[t].dtype != np.float64:
                fail(f"{name}/{t} has shape {g[t].shape} and dtype {g[t].dtype}")
        mine = [r for r in rows if all(r[c] == key[c] for c in POINT_COLUMNS)]
        if not mine:
            fail(f"{name}: no row of microbench.csv has its columns {key}")
        golden = outputs(g["golden"], names)
        for r in mine:
            alg = r["algorithm"]
            ref_name = "baseline" if alg == "flash_vs_baseline" else "golden"
            values = outputs(g["flash" if alg == "flash_vs_baseline" else alg], names)
            ref = outputs(g[ref_name], names) if ref_name != "golden" else golden
            if float(r["max_abs"]) != float(np.max(np.abs(values - ref))):
                fail(f"{name} {alg}: max_abs {r['max_abs']} in microbench.csv, {np.max(np.abs(values - ref))!r} "
                     "from the saved values")
            if r["vs_reading"] != "-":
                # The reading's output the row was compared with, saved beside the real code's.
                if alg + "_reading" not in g:
                    fail(f"{name} {alg}: compared with {r['vs_reading']} in microbench.csv, but the file has no "
                         f"{alg}_reading")
                reading = outputs(g[alg + "_reading"], names)
                same = np.mean(values.view(np.uint64) == reading.view(np.uint64))
                if float(r["bit_identical"]) != float(same):
                    fail(f"{name} {alg}: bit_identical {r['bit_identical']} in microbench.csv, {same!r} from the "
                         "saved values")
            checked += 1
        if "torch_baseline" in g and key["format"] == "bf16":
            mine_py = python_baseline(g["q"][()], g["k"][()], g["v"][()], g["do"][()] if backward else None,
                                      key["causal"] == "1", backward)
            saved = outputs(g["torch_baseline"], names)
            if not np.array_equal(mine_py.view(np.uint64), saved.view(np.uint64)):
                fail(f"{name}: Python's PyTorch on the saved inputs differs from the saved torch_baseline on "
                     f"{np.sum(mine_py != saved)} of {saved.size} elements")
            python_checked += 1
    print(f"ok: {len(points)} points, {checked} rows recomputed from the saved values, {python_checked} points "
          "reproduced bit for bit by Python's PyTorch")


def same_file(out, other):
    a = h5py.File(Path(out) / "microbench_outputs.h5", "r")
    b = h5py.File(Path(other) / "microbench_outputs.h5", "r")
    names_a, names_b = [], []
    a.visit(names_a.append)
    b.visit(names_b.append)
    if names_a != names_b:
        fail(f"{other} holds other groups or datasets than {out}")
    datasets = 0
    for n in names_a:
        if dict(a[n].attrs) != dict(b[n].attrs):
            fail(f"{n}: attributes differ between {out} and {other}")
        if isinstance(a[n], h5py.Dataset):
            if not np.array_equal(a[n][()].view(np.uint64), b[n][()].view(np.uint64)):
                fail(f"{n}: values differ between {out} and {other}")
            datasets += 1
    print(f"ok: {other} holds the same {datasets} datasets bit for bit")


if __name__ == "__main__":
    main(sys.argv[1])
    if len(sys.argv) > 2:
        same_file(sys.argv[1], sys.argv[2])
