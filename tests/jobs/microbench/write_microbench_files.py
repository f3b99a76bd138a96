#!/usr/bin/env python3
"""Writes the input files of test_microbench_file.cpp and of the CLI's file-input tests into DIR, as a
user's framework would save q, k, v and do ([microbench] distribution = "file").

Good files: inputs.safetensors (bf16, all four tensors), inputs.h5 (h5py: q, k, v fp32, do fp16),
forward_only.safetensors (no do). Bad files, each one lie: a missing tensor, a rank-3 tensor, shapes that
disagree, an empty dimension, NaN and an infinity, an integer and an fp8 dtype, a truncated
safetensors file, a header whose offsets point past the end, and a truncated HDF5 file. The exact values
of the good files are stored as float64 in expected.h5.

Usage: write_microbench_files.py DIR
"""
import os
import struct
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "io"))
from write_tensor_files import bf16_bits, bf16_values, write_safetensors  # noqa: E402

SHAPE = (1, 2, 40, 16)  # B, H, N, d


def bf16(name, values):
    bits = bf16_bits(values)
    return name, ("BF16", bits.shape, bits.astype("<u2").tobytes()), bf16_values(bits)


def main(out):
    rng = np.random.default_rng(20261125)
    expected = h5py.File(os.path.join(out, "expected.h5"), "w")
    tensors, exact = {}, {}
    for name in ("q", "k", "v", "do"):
        _, entry, values = bf16(name, rng.standard_normal(SHAPE).astype(np.float32))
        tensors[name], exact[name] = entry, values
        expected.create_dataset("safetensors/" + name, data=values)
    write_safetensors(os.path.join(out, "inputs.safetensors"), tensors, metadata={"format": "pt"})
    write_safetensors(os.path.join(out, "forward_only.safetensors"),
                      {n: tensors[n] for n in ("q", "k", "v")})

    h5_values = {n: rng.standard_normal(SHAPE).astype(np.float32) for n in ("q", "k", "v")}
    h5_values["do"] = rng.standard_normal(SHAPE).astype(np.float16)
    with h5py.File(os.path.join(out, "inputs.h5"), "w") as f:
        for name, values in h5_values.items():
            f.create_dataset(name, data=values)
            expected.create_dataset("h5/" + name, data=values.astype(np.float64))
    expected.close()

    def variant(name, change):
        t = dict(tensors)
        change(t)
        write_safetensors(os.path.join(out, name), t)

    variant("missing_v.safetensors", lambda t: t.pop("v"))
    q3 = bf16_bits(rng.standard_normal(SHAPE[1:]).astype(np.float32))
    variant("rank3.safetensors", lambda t: t.update(q=("BF16", q3.shape, q3.astype("<u2").tobytes())))
    k41 = bf16_bits(rng.standard_normal((1, 2, 41, 16)).astype(np.float32))
    variant("shape_mismatch.safetensors", lambda t: t.update(k=("BF16", k41.shape, k41.astype("<u2").tobytes())))
    variant("empty_dim.safetensors", lambda t: t.update(q=("BF16", (1, 0, 40, 16), b""),
                                                        k=("BF16", (1, 0, 40, 16), b""),
                                                        v=("BF16", (1, 0, 40, 16), b""),
                                                        do=("BF16", (1, 0, 40, 16), b"")))
    nan = exact["v"].astype(np.float32).copy()
    nan[0, 1, 7, 3] = np.nan
    variant("nan.safetensors", lambda t: t.update(v=("F32", nan.shape, nan.astype("<f4").tobytes())))
    ints = np.arange(np.prod(SHAPE), dtype=np.int32).reshape(SHAPE)
    variant("int_dtype.safetensors", lambda t: t.update(k=("I32", ints.shape, ints.astype("<i4").tobytes())))
    fp8 = np.zeros(SHAPE, dtype=np.uint8)
    variant("fp8_dtype.safetensors", lambda t: t.update(k=("F8_E4M3", fp8.shape, fp8.tobytes())))
    with h5py.File(os.path.join(out, "inf.h5"), "w") as f:
        for name, values in h5_values.items():
            values = values.copy()
            if name == "q":
                values[0, 0, 2, 5] = -np.inf
            f.create_dataset(name, data=values)

    good = open(os.path.join(out, "inputs.safetensors"), "rb").read()
    with open(os.path.join(out, "truncated.safetensors"), "wb") as f:
        f.write(good[:-100])
    (n,) = struct.unpack("<Q", good[:8])
    header = good[8:8 + n].replace(b'"data_offsets": [0, 2560]', b'"data_offsets": [0, 9999999]')
    assert header != good[8:8 + n], "the first entry's (do) offsets were not found"
    with open(os.path.join(out, "offsets_lie.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + good[8 + n:])
    h5 = open(os.path.join(out, "inputs.h5"), "rb").read()
    with open(os.path.join(out, "truncated.h5"), "wb") as f:
        f.write(h5[:len(h5) // 2])


if __name__ == "__main__":
    main(sys.argv[1])
