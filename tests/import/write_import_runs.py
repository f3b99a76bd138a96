#!/usr/bin/env python3
"""Writes the imported runs of test_import.cpp into DIR/CASE: checkpoints of a made-up model as other
programs save them, for a grid of attention x precision x seed and steps 10 and 20.

  good       runs/{attention}-{precision}-s{seed}/step_{step}.safetensors (F32; tensor names with DDP's
             "module." prefix, and an integer buffer "module.counter" to exclude)
  bf16       the same runs with every tensor stored as BF16
  h5         the same runs written by h5py (groups as name prefixes: "module/w")
  sharded    the same runs as sharded safetensors: step_{step}/model.safetensors.index.json + 2 shards
  and the bad inputs, each a copy of `good` with one fault in run fa2-bf16-s2 at step 20 (or as said):
  missing, truncated, offsets (a header offset past the end), nan, inf, shape, dtype (F64 instead of
  F32), extra (a tensor the other runs lack), twice (step_20 and step_020 both present), empty (no file)
  names      `good` with "module.model" (the whole model's name once stripped) and an empty "module.none"
  and values that are not finite in the faulty file of other formats and places: nan-bf16 (the `bf16`
  runs, w[3, 5] NaN), inf-f16 (module.b stored as F16, b[7] = -Inf), inf-f64 (module.b as F64, b[7] Inf),
  nan-h5 (the `h5` runs, w[3, 5] NaN), nan-late (every run with a 600000-element "module.big", NaN at its
  element 400000: past the first MiB the check reads)

The weights drift with the step (in part along a direction of the seed's own); attention moves them by
a little, precision by more, the seed by most, so the verdict on attention is "within" both references. safetensors is written by a few lines here
(an 8-byte little-endian header length, the JSON header, the buffers), not by the safetensors package.

Usage: write_import_runs.py DIR CASE...
"""
import json
import os
import struct
import sys

import numpy as np

ATTENTION = ["math", "fa2"]
PRECISION = ["fp32", "bf16"]
SEEDS = [1, 2]
STEPS = [10, 20]
FAULTY = ("fa2", "bf16", 2, 20)


def bf16_bits(x):
    """Round float32 values to bfloat16 (to nearest even) and return the 16-bit patterns."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def write_safetensors(path, tensors):
    """tensors: name -> numpy array (float32, float64, int64) or ("BF16", array)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        value = tensors[name]
        if isinstance(value, tuple):
            dtype, raw, shape = "BF16", bf16_bits(value[1]).astype("<u2").tobytes(), value[1].shape
        else:
            dtype = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.float16): "F16",
                     np.dtype(np.int64): "I64"}[value.dtype]
            raw, shape = value.astype(value.dtype.newbyteorder("<")).tobytes(), value.shape
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def weights(attention, precision, seed, step):
    """The run's tensors at a step: seed sets the start, attention and precision nudge the drift."""
    base = np.random.default_rng(seed)
    drift = np.random.default_rng(100)
    w = base.standard_normal((8, 16)) * 0.1 + (drift.standard_normal((8, 16)) + base.standard_normal((8, 16))) * 1e-3 * step
    b = base.standard_normal(16) * 0.1 + (drift.standard_normal(16) + base.standard_normal(16)) * 1e-3 * step
    for rng, scale in ((np.random.default_rng(1000), 1e-5 if attention == "fa2" else 0),
                       (np.random.default_rng(2000), 1e-4 if precision == "bf16" else 0)):
        w = w + rng.standard_normal(w.shape) * scale * step
        b = b + rng.standard_normal(b.shape) * scale * step
    return {"module.w": w.astype(np.float32), "module.b": b.astype(np.float32),
            "module.counter": np.array([step], dtype=np.int64)}


def runs():
    for a in ATTENTION:
        for p in PRECISION:
            for s in SEEDS:
                for step in STEPS:
                    yield a, p, s, step


def write_case(root, case):
    for a, p, s, step in runs():
        t = weights(a, p, s, step)
        folder = os.path.join(root, "runs", f"{a}-{p}-s{s}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"step_{step}.safetensors")
        faulty = (a, p, s, step) == FAULTY
        if faulty and case in ("nan-bf16", "nan-h5"):
            t["module.w"][3, 5] = np.nan
        if case == "nan-late":
            t["module.big"] = np.zeros(600000, dtype=np.float32)
            if faulty:
                t["module.big"][400000] = np.nan
        if faulty and case == "inf-f16":
            t["module.b"] = t["module.b"].astype(np.float16)
            t["module.b"][7] = -np.inf
        if faulty and case == "inf-f64":
            t["module.b"] = t["module.b"].astype(np.float64)
            t["module.b"][7] = np.inf
        if case in ("bf16", "nan-bf16"):
            write_safetensors(path, {k: ("BF16", v) if v.dtype == np.float32 else v for k, v in t.items()})
        elif case in ("h5", "nan-h5"):
            import h5py
            with h5py.File(os.path.join(folder, f"step_{step}.h5"), "w") as f:
                for k, v in t.items():
                    f.create_dataset(k.replace(".", "/"), data=v)
        elif case == "sharded":
            shard_dir = os.path.join(folder, f"step_{step}")
            os.makedirs(shard_dir, exist_ok=True)
            shards = {"model-00001-of-00002.safetensors": {"module.w": t["module.w"]},
                      "model-00002-of-00002.safetensors": {"module.b": t["module.b"], "module.counter": t["module.counter"]}}
            weight_map = {}
            for shard, tensors in shards.items():
                write_safetensors(os.path.join(shard_dir, shard), tensors)
                weight_map.update({k: shard for k in tensors})
            with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
        else:
            if faulty and case == "nan":
                t["module.w"][3, 5] = np.nan
            if faulty and case == "inf":
                t["module.b"][7] = np.inf
            if faulty and case == "shape":
                t["module.b"] = np.zeros(15, dtype=np.float32)
            if faulty and case == "dtype":
                t["module.w"] = t["module.w"].astype(np.float64)
            if faulty and case == "extra":
                t["module.extra"] = np.zeros(3, dtype=np.float32)
            if case == "names":  # a tensor that becomes "model" after the strip, and one without elements
                t["module.model"] = t["module.b"] * 2
                t["module.none"] = np.zeros((0, 4), dtype=np.float32)
            if case == "empty":
                continue
            if faulty and case == "missing":
                continue
            write_safetensors(path, t)
            if faulty and case == "truncated":
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) - 10)
            if faulty and case == "offsets":
                with open(path, "rb") as f:
                    data = f.read()
                n = struct.unpack("<Q", data[:8])[0]
                header = json.loads(data[8:8 + n])
                begin, end = header["module.w"]["data_offsets"]
                header["module.w"]["data_offsets"] = [begin + 4096, end + 4096]
                text = json.dumps(header).encode()
                text += b" " * (n - len(text)) if len(text) <= n else b""
                with open(path, "wb") as f:
                    f.write(struct.pack("<Q", len(text)))
                    f.write(text)
                    f.write(data[8 + n:])
            if faulty and case == "twice":
                write_safetensors(os.path.join(folder, "step_020.safetensors"), t)


def main(out, cases):
    for case in cases:
        write_case(os.path.join(out, case), case)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
