#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer harnesses (tests/fuzz/harness) into OUT/<harness>/, from the
files the other tests write as users' programs write them: the safetensors, index and h5py fixtures of
tests/io/write_tensor_files.py and tests/import/write_import_runs.py, the torch.save files of
tests/train/write_torch_files.py (with python3-torch) and their pickles (data.pkl), the grids of
configs/, a checkpoint (with its sidecar) and sidecars written by FASTUDY itself on a tiny grid, and a few HDF5 files with
the links a hostile file may hold (a soft link cycle, hard links forming a DAG, an external link).

Usage: write_seeds.py FASTUDY OUT
"""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PYTHON = sys.executable

TINY_GRID = """[study]
name = "seed"
out = "{out}"
phases = ["train"]
[grid]
attention = ["baseline"]
precision = ["fp32"]
[model]
vocab = 16
d_model = 8
heads = 2
layers = 1
seq_len = 8
mlp_ratio = 2
[data]
span_len = 4
[train]
steps = 2
batch = 2
warmup = 1
checkpoint_every = 2
[attention]
block_q = 4
block_kv = 4
"""


def copy_matching(src, pattern, dst):
    for p in sorted(Path(src).rglob(pattern)):
        name = "-".join(p.relative_to(src).parts)
        shutil.copyfile(p, dst / name)


def hostile_hdf5(dst):
    import h5py
    import numpy as np
    with h5py.File(dst / "soft_cycle.h5", "w") as f:
        f["w"] = np.arange(4, dtype=np.float32)
        f["s"] = h5py.SoftLink("/")
    with h5py.File(dst / "hard_dag.h5", "w") as f:
        g = f.create_group("g0")
        g["w"] = np.ones(3, dtype=np.float32)
        for k in range(1, 6):
            h = f.create_group(f"g{k}")
            h["a"] = g
            h["b"] = g
            g = h
    with h5py.File(dst / "external.h5", "w") as f:
        f["w"] = np.ones(2, dtype=np.float16)
        f["e"] = h5py.ExternalLink("other.h5", "/w")
    with h5py.File(dst / "unwritten.h5", "w") as f:
        f.create_dataset("w", shape=(8,), dtype=np.float32)


def main(fastudy, out):
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    dirs = {n: out / n for n in ("safetensors", "safetensors_index", "hdf5", "torch_save", "pickle", "toml_grid",
                                  "checkpoint", "sidecar")}
    for d in dirs.values():
        d.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for d in ("io", "torch"):
            (tmp / d).mkdir()
        subprocess.run([PYTHON, ROOT / "tests/io/write_tensor_files.py", tmp / "io"], check=True)
        subprocess.run([PYTHON, ROOT / "tests/import/write_import_runs.py", tmp / "import", "good", "bf16", "h5", "sharded"],
                       check=True)
        for src in (tmp / "io", tmp / "import/good/runs/fa2-bf16-s1", tmp / "import/bf16/runs/math-fp32-s2"):
            copy_matching(src, "*.safetensors", dirs["safetensors"])
        copy_matching(tmp / "io", "*.index.json", dirs["safetensors_index"])
        copy_matching(tmp / "import/sharded/runs/math-fp32-s1", "*.index.json", dirs["safetensors_index"])
        (dirs["safetensors_index"] / "fixed-shards.json").write_text(
            '{"metadata": {"total_size": 32}, "weight_map": {"a.w": "model-00001-of-00002.safetensors", '
            '"b.w": "model-00002-of-00002.safetensors"}}')
        copy_matching(tmp / "io", "*.h5", dirs["hdf5"])
        copy_matching(tmp / "import/h5/runs/math-bf16-s1", "*.h5", dirs["hdf5"])
        hostile_hdf5(dirs["hdf5"])
        if subprocess.run([PYTHON, ROOT / "tests/train/write_torch_files.py", tmp / "torch"]).returncode == 0:
            copy_matching(tmp / "torch", "*.pt", dirs["torch_save"])
            for p in sorted(dirs["torch_save"].glob("*.pt")):
                if zipfile.is_zipfile(p):
                    with zipfile.ZipFile(p) as z:
                        for name in z.namelist():
                            if name.endswith("data.pkl"):
                                (dirs["pickle"] / (p.stem + ".pkl")).write_bytes(z.read(name))
        # A pickle of protocol 2 that nests lists, and one that builds a dict (LibTorch's subset).
        (dirs["pickle"] / "nested.pkl").write_bytes(b"\x80\x02]q\x00(]q\x01]q\x02ae.")
        (dirs["pickle"] / "dict.pkl").write_bytes(b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01u.")
        copy_matching(ROOT / "configs", "*.toml", dirs["toml_grid"])
        grid = tmp / "tiny.toml"
        grid.write_text(TINY_GRID.format(out=tmp / "study"))
        subprocess.run([fastudy, "train", str(grid), "-q"], check=True)
        for p in sorted((tmp / "study").rglob("step_*.h5")):  # with its sidecar (fuzz_checkpoint keeps it)
            shutil.copyfile(p, dirs["checkpoint"] / p.name)
            shutil.copyfile(f"{p}.crc", dirs["checkpoint"] / f"{p.name}.crc")
        for p in sorted((tmp / "study").rglob("*.crc")):
            shutil.copyfile(p, dirs["sidecar"] / p.name.replace("/", "-"))
    (dirs["sidecar"] / "two-lines.crc").write_text("fastudy-crc32/1 18 1c291ca3\nfastudy-crc32/1 7 00000000\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
