#!/usr/bin/env python3
"""Writes the fixtures of test_tensor_file.cpp into DIR, the way users' programs write them.

safetensors files are written by a few lines of Python (the format is an 8-byte little-endian header
length, a JSON header, then the raw little-endian buffers: huggingface/safetensors README "Format"),
so the test does not depend on the safetensors package. HDF5 files are written by h5py. Every tensor's
exact values are also stored as float64 in expected.h5, which the test compares with what fastudy reads.

Usage: write_tensor_files.py DIR
"""
import json
import os
import struct
import sys

import h5py
import numpy as np


def bf16_bits(x):
    """Round float32 values to bfloat16 (to nearest even) and return the 16-bit patterns."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def bf16_values(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def write_safetensors(path, tensors, metadata=None, order=None):
    """tensors: name -> (dtype word, shape, raw bytes). Buffers are laid out in `order` (default: name order)."""
    header, offset, blobs = {}, 0, []
    for name in order or sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the reference writer pads the header to a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main(out):
    rng = np.random.default_rng(20261124)
    expected = h5py.File(os.path.join(out, "expected.h5"), "w")

    # All four float dtypes, an integer tensor, a scalar and an empty tensor, buffers not in name order.
    f64 = rng.standard_normal((2, 3))
    f32 = rng.standard_normal((4,)).astype(np.float32)
    f16 = (rng.standard_normal((3, 2)) * 100).astype(np.float16)
    f16[0, 0] = np.float16(6.0e-8)   # a subnormal
    f16[0, 1] = np.float16(65504.0)  # the largest finite value
    b16 = bf16_bits(rng.standard_normal((2, 2, 2)).astype(np.float32) * 1e20)
    i64 = np.arange(5, dtype=np.int64)
    scalar = np.array(3.5, dtype=np.float32)
    tensors = {
        "w.f64": ("F64", f64.shape, f64.astype("<f8").tobytes()),
        "w.f32": ("F32", f32.shape, f32.astype("<f4").tobytes()),
        "w.f16": ("F16", f16.shape, f16.astype("<f2").tobytes()),
        "w.bf16": ("BF16", b16.shape, b16.astype("<u2").tobytes()),
        "steps": ("I64", i64.shape, i64.astype("<i8").tobytes()),
        "scalar": ("F32", (), scalar.astype("<f4").tobytes()),
        "empty": ("F32", (0, 4), b""),
    }
    write_safetensors(os.path.join(out, "all.safetensors"), tensors, metadata={"format": "pt"},
                      order=["w.bf16", "scalar", "w.f64", "empty", "steps", "w.f32", "w.f16"])
    for name, values in {"w.f64": f64, "w.f32": f32, "w.f16": f16, "w.bf16": bf16_values(b16),
                         "scalar": scalar}.items():
        expected.create_dataset("all/" + name, data=np.asarray(values, dtype=np.float64))

    # A sharded checkpoint: two shards and their index.
    a = rng.standard_normal((3, 3)).astype(np.float32)
    b = bf16_bits(rng.standard_normal((5,)).astype(np.float32))
    c = rng.standard_normal((2,)).astype(np.float32)
    write_safetensors(os.path.join(out, "model-00001-of-00002.safetensors"),
                      {"layer.0.w": ("F32", a.shape, a.tobytes()), "layer.0.b": ("BF16", b.shape, b.tobytes())})
    write_safetensors(os.path.join(out, "model-00002-of-00002.safetensors"),
                      {"layer.1.w": ("F32", c.shape, c.tobytes())})
    index = {"metadata": {"total_size": a.nbytes + b.nbytes + c.nbytes},
             "weight_map": {"layer.0.w": "model-00001-of-00002.safetensors",
                            "layer.0.b": "model-00001-of-00002.safetensors",
                            "layer.1.w": "model-00002-of-00002.safetensors"}}
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    expected.create_dataset("sharded/layer.0.w", data=a.astype(np.float64))
    expected.create_dataset("sharded/layer.0.b", data=bf16_values(b))
    expected.create_dataset("sharded/layer.1.w", data=c.astype(np.float64))

    # h5py: groups as name prefixes, fp16 and fp64 datasets, an integer dataset.
    g = rng.standard_normal((2, 4))
    h = (rng.standard_normal((3,)) * 10).astype(np.float16)
    with h5py.File(os.path.join(out, "h5py.h5"), "w") as f:
        f.create_dataset("blocks/0/attn/weight", data=g)
        f.create_dataset("blocks/0/ln.bias", data=h)
        f.create_dataset("count", data=np.int32(7))
    expected.create_dataset("h5py/blocks.0.attn.weight", data=g)
    expected.create_dataset("h5py/blocks.0.ln.bias", data=h.astype(np.float64))
    expected.close()

    # Damaged files. Each is a copy of a good one with one lie.
    good = open(os.path.join(out, "all.safetensors"), "rb").read()
    (n,) = struct.unpack("<Q", good[:8])
    damaged = {
        "truncated.safetensors": good[:-3],                                   # data cut short
        "short.safetensors": good[:5],                                        # not even a length
        "header_past_end.safetensors": struct.pack("<Q", len(good)) + good[8:],
        "not_json.safetensors": good[:8] + b"{" * n + good[8 + n:],
    }
    header = json.loads(good[8:8 + n])
    def with_header(h):
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + good[8 + n:]
    lie = json.loads(json.dumps(header))
    lie["w.f32"]["data_offsets"][1] += 10**6
    damaged["offsets_past_end.safetensors"] = with_header(lie)
    lie = json.loads(json.dumps(header))
    lie["w.f32"]["shape"] = [5]
    damaged["size_mismatch.safetensors"] = with_header(lie)
    lie = json.loads(json.dumps(header))
    begin = header["w.f64"]["data_offsets"][0]
    lie["w.f32"]["data_offsets"] = [begin, begin + 16]  # w.f32's 16 bytes inside w.f64's range
    damaged["overlap.safetensors"] = with_header(lie)
    lie = json.loads(json.dumps(header))
    lie["w.f32"]["dtype"] = "F31"
    damaged["unknown_dtype.safetensors"] = with_header(lie)
    for name, data in damaged.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)

    bad_index = {"weight_map": {"layer.0.w": "../model-00001-of-00002.safetensors"}}
    with open(os.path.join(out, "escape.safetensors.index.json"), "w") as f:
        json.dump(bad_index, f)
    missing = {"weight_map": {"layer.0.w": "model-00001-of-00002.safetensors",
                              "layer.9.w": "model-00001-of-00002.safetensors",
                              "layer.0.b": "model-00001-of-00002.safetensors",
                              "layer.1.w": "model-00002-of-00002.safetensors"}}
    with open(os.path.join(out, "missing.safetensors.index.json"), "w") as f:
        json.dump(missing, f)
    with open(os.path.join(out, "not_hdf5.h5"), "wb") as f:
        f.write(b"this is not HDF5")


if __name__ == "__main__":
    main(sys.argv[1])
