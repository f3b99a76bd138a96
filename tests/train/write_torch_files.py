#!/usr/bin/env python3
"""Writes the fixtures of test_torch_file.cpp into DIR with PyTorch's own torch.save (Debian's
python3-torch), and each tensor's exact values as float64 in expected.h5 (h5py).

Usage: write_torch_files.py DIR   (exit 3 when PyTorch cannot be imported)
"""
import os
import sys

import h5py
import numpy as np

try:
    import torch
except ImportError:
    sys.exit(3)


def main(out):
    torch.manual_seed(20261124)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    sd = model.state_dict()
    tensors = {k: v.clone() for k, v in sd.items()}
    tensors["bf"] = torch.randn(2, 3).to(torch.bfloat16)
    tensors["half"] = (torch.randn(5) * 100).half()
    tensors["wide"] = torch.randn(3, dtype=torch.float64)
    tensors["strided"] = torch.arange(10.0)[1:9:3]          # a view: offset and stride in its storage
    tensors["steps"] = torch.arange(4)                       # int64: listed, not read as floats
    torch.save(tensors, os.path.join(out, "plain.pt"))        # a plain dict: LibTorch 1.13 reads it
    torch.save({"model": tensors, "step": 7}, os.path.join(out, "nested.pt"))
    torch.save(sd, os.path.join(out, "state_dict.pt"))        # an OrderedDict: it cannot
    torch.save(tensors, os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    with h5py.File(os.path.join(out, "expected.h5"), "w") as f:
        for k, v in tensors.items():
            if v.is_floating_point():
                f.create_dataset(k, data=v.double().numpy())


if __name__ == "__main__":
    main(sys.argv[1])
