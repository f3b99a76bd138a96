#!/usr/bin/env python3
"""Writes the hostile imported runs of test_hostile_import.cpp into DIR/CASE: for each case two runs
(CASE/s1, CASE/s2) of one step (step_10.EXT), as a crafted or careless file from another stack would
be, for the grid [import] path = "CASE/s{seed}/step_{step}.EXT", [grid] seed = [1, 2].

Files are crafted byte by byte where no library writes them so: safetensors headers (an 8-byte length
and JSON), torch.save zips (Python's zipfile with the records LibTorch reads: archive/data.pkl,
archive/version, archive/data/KEY) around pickle programs assembled opcode by opcode (protocol 2, the
opcodes torch.save writes: Lib/pickletools.py), and h5py files with the links and layouts a hostile or
careless file may hold. Special files (FIFOs, /dev/zero) take the place of a file of a good case in
the test itself (fifo_safetensors, fifo_crc, fifo_index, fifo_shard, devzero_pt).

Usage: write_hostile_imports.py DIR CASE...   (a case not listed here is an error)
"""
import json
import os
import struct
import sys
import zipfile

import numpy as np


# ---- safetensors -------------------------------------------------------------------------------------

def safetensors_raw(path, header_text, data=b""):
    text = header_text.encode() if isinstance(header_text, str) else header_text
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def safetensors(path, tensors):
    """tensors: name -> float32 array."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        raw = np.asarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(np.shape(a)), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    safetensors_raw(path, json.dumps(header), b"".join(blobs))


# ---- torch.save: a zip around a pickle program --------------------------------------------------------

def unicode_(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def int_(i):
    return b"J" + struct.pack("<i", i)


def tuple_(items):
    return b"(" + b"".join(items) + b"t"


def tensor_(key, numel, offset, size, stride):
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks) as torch.save
    pickles a tensor, its storage a persistent id ("storage", torch.FloatStorage, key, "cpu", numel)."""
    storage = tuple_([unicode_("storage"), b"ctorch\nFloatStorage\n", unicode_(key), unicode_("cpu"), int_(numel)]) + b"Q"
    args = tuple_([storage, int_(offset), tuple_([int_(s) for s in size]), tuple_([int_(s) for s in stride]), b"\x89",
                   b"ccollections\nOrderedDict\n)R"])
    return b"ctorch._utils\n_rebuild_tensor_v2\n" + args + b"R"


def dict_(items):
    return b"}(" + b"".join(unicode_(k) + v for k, v in items) + b"u"


def torch_zip(path, program, storages, version="3\n"):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + program + b".")
        z.writestr("archive/version", version)
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)


def floats(values):
    return np.asarray(values, dtype="<f4").tobytes()


# ---- the cases -----------------------------------------------------------------------------------------

def case_files(root, case, seed):
    """Writes run `seed` of `case` under root/case/s{seed}/."""
    folder = os.path.join(root, case, f"s{seed}")
    os.makedirs(folder, exist_ok=True)
    w = np.arange(4, dtype=np.float32) * 0.25 + seed * 0.01
    st, pt, h5 = (os.path.join(folder, f"step_10.{e}") for e in ("safetensors", "pt", "h5"))
    if case == "st_deep_shape":  # a shape nested 100,000 arrays deep (its message used to dump it recursively)
        safetensors_raw(st, '{"w":{"dtype":"F32","shape":' + "[" * 100000 + "]" * 100000 + ',"data_offsets":[0,0]}}')
    elif case == "st_overflow":  # F64 of 2^61 elements: 2^64 bytes, which wraps to 0 in 64 bits
        safetensors_raw(st, '{"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}}')
    elif case == "st_json_range":  # a number too large for a double: json's out_of_range, not parse_error
        safetensors_raw(st, '{"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}}', floats([1]))
    elif case == "st_tab_name":
        safetensors(st, {"a\tb": w})
    elif case == "pt_bad_utf8":  # a name that is not UTF-8 (JSON parsers refuse one; a pickle's bytes are as written)
        torch_zip(pt, b"}(X" + struct.pack("<I", 3) + b"a\xffb" + tensor_("0", 4, 0, [4], [1]) + b"u", {"0": floats(w)})
    elif case == "st_names":  # names from other stacks: a TF/JAX path, mathtext, HTML and a table's '|'
        safetensors(st, {"enc/layer0/w": w, "$\\alpha_{x$": w * 2, "<b>x</b>|y\\": w * 3})
    elif case == "st_many":  # many small tensors (an MoE-like checkpoint)
        safetensors(st, {f"expert.{k}.w": w + k for k in range(300)})
    elif case in ("st_good", "fifo_safetensors", "fifo_crc"):
        safetensors(st, {"w": w})
    elif case in ("sharded_good", "fifo_index", "fifo_shard"):
        shard_dir = os.path.join(folder, "step_10")
        os.makedirs(shard_dir, exist_ok=True)
        safetensors(os.path.join(shard_dir, "model-00001-of-00001.safetensors"), {"w": w})
        with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"weight_map": {"w": "model-00001-of-00001.safetensors"}}, f)
    elif case == "pt_deep_nesting":  # lists nested 100,000 deep beside the tensor
        nested = b"(" * 100000 + b"l" * 100000
        torch_zip(pt, dict_([("w", tensor_("0", 4, 0, [4], [1])), ("deep", nested)]), {"0": floats(w)})
    elif case == "pt_view_past_storage":  # a 64-float view over a 4-float storage
        torch_zip(pt, dict_([("w", tensor_("0", 4, 0, [64], [1]))]), {"0": floats(w)})
    elif case == "pt_storage_lies":  # the pickle claims 64 floats, the record holds 4
        torch_zip(pt, dict_([("w", tensor_("0", 64, 0, [64], [1]))]), {"0": floats(w)})
    elif case in ("pt_view_ok", "devzero_pt"):  # a strided view inside its storage: elements 1, 3 of 4
        torch_zip(pt, dict_([("w", tensor_("0", 4, 1, [2], [2]))]), {"0": floats(w)})
    elif case == "pt_self_dict":  # a dict that holds itself (memo)
        torch_zip(pt, b"}q\x00(" + unicode_("w") + tensor_("0", 4, 0, [4], [1]) + unicode_("me") + b"h\x00u",
                  {"0": floats(w)})
    elif case == "pt_bad_version":  # the version record is no number: std::stoull's invalid_argument
        torch_zip(pt, dict_([("w", tensor_("0", 4, 0, [4], [1]))]), {"0": floats(w)}, version="abc\n")
    elif case == "pt_odd_dict":  # SETITEMS with a key and no value
        torch_zip(pt, b"}(" + unicode_("w") + b"u", {})
    elif case == "pt_unknown_global":  # os.system as a rebuild function: LibTorch's unpickler refuses it
        torch_zip(pt, dict_([("w", b"cos\nsystem\n" + tuple_([unicode_("touch pwned")]) + b"R")]), {})
    elif case == "pt_unknown_opcode":  # FRAME (protocol 4), which LibTorch's unpickler does not read
        torch_zip(pt, b"\x95" + struct.pack("<Q", 0) + dict_([("w", tensor_("0", 4, 0, [4], [1]))]), {"0": floats(w)})
    elif case == "pt_pop_below_mark":  # SETITEM right after a MARK: its dict lies below the mark
        torch_zip(pt, b"}(" + unicode_("w") + tensor_("0", 4, 0, [4], [1]) + b"s", {"0": floats(w)})
    elif case == "pt_memo_gap":  # a memo entry stored at index 2^32 - 1 (LibTorch would grow its table to it)
        torch_zip(pt, b"}r\xff\xff\xff\xff(" + unicode_("w") + tensor_("0", 4, 0, [4], [1]) + b"u", {"0": floats(w)})
    else:
        write_hdf5_case(case, h5, w, seed)


def write_hdf5_case(case, h5, w, seed):
    import h5py
    if case == "h5_soft_cycle":  # a soft link back to the root
        with h5py.File(h5, "w") as f:
            f["w"] = w
            f["s"] = h5py.SoftLink("/")
    elif case == "h5_deep_groups":  # 70 groups, each in the one before
        with h5py.File(h5, "w") as f:
            f.create_group("/".join(["g"] * 70))["w"] = w
    elif case == "h5_external_storage":  # the raw data kept in another file (HDF5's external storage)
        raw = os.path.join(os.path.dirname(h5), "w.bin")
        with open(raw, "wb") as f:
            f.write(floats(w))
        with h5py.File(h5, "w") as f:
            f.create_dataset("w", shape=(4,), dtype="<f4", external=[(raw, 0, 16)])
    elif case == "h5_hard_cycle":  # a hard link from a group back to the root
        with h5py.File(h5, "w") as f:
            g = f.create_group("g")
            g["w"] = w
            g["up"] = f["/"]
    elif case == "h5_dag":  # 40 levels, each group linked twice from the next: 2^40 paths, 41 groups
        with h5py.File(h5, "w") as f:
            g = f.create_group("g0")
            g["w"] = w
            for k in range(1, 41):
                h = f.create_group(f"g{k}")
                h["a"] = g
                h["b"] = g
                g = h
    elif case == "h5_external":  # an external link to a file outside the import folder
        outside = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(h5))), f"outside-{seed}.h5")
        with h5py.File(outside, "w") as f:
            f["w"] = w
        with h5py.File(h5, "w") as f:
            f["e"] = h5py.ExternalLink(outside, "/w")
    elif case == "h5_vds":  # a virtual dataset whose source file is missing (it would read as zeros)
        with h5py.File(h5, "w") as f:
            layout = h5py.VirtualLayout(shape=(4,), dtype="f4")
            layout[:] = h5py.VirtualSource("missing-source.h5", "w", shape=(4,))
            f.create_virtual_dataset("w", layout, fillvalue=0)
    elif case == "h5_unwritten":  # 10^12 elements declared, no chunk ever written
        with h5py.File(h5, "w") as f:
            f.create_dataset("w", shape=(10 ** 12,), dtype="f4", chunks=(1024,))
    elif case == "h5_truncated":  # cut in half: HDF5 itself refuses it
        with h5py.File(h5, "w") as f:
            f["w"] = np.tile(w, 256)
        size = os.path.getsize(h5)
        with open(h5, "r+b") as f:
            f.truncate(size // 2)
    else:
        sys.exit(f"write_hostile_imports.py: unknown case {case}")


def main(root, cases):
    for case in cases:
        for seed in (1, 2):
            case_files(root, case, seed)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2:])
