"""Every documented configuration key and command-line option, through the fastudy binary, with its visible
effect on the output asserted: a file, a column, a value or a message. A key that changes nothing fails
its row.

The table's lists are checked against the docs, so that the docs cannot gain a key the table does not
cover: every key of the configuration reference (docs/configuration.md, "Sections and keys"), every
`[section] key` any docs/ page names, every key of docs/import.md's example tables, every environment
variable of docs/build.md's table, every option of each job's `--help` and every option of a
`fastudy JOB ...` command written in the docs must have a row, and a row for something the docs no
longer list fails too. A row either runs its check on the studies below or points to another CLI-level
test that asserts the same effect (the table checks that the test exists and names the key). PENDING
lists the keys documented but not yet connected, with the branch that connects them: their rows are
ready but skipped, and the lead removes them from PENDING when that branch lands.

The studies are tiny (a model of 8 dimensions, a few steps, microbenchmark points of 8 x 4) and run
once each, two at a time; each row reads the outputs of one or more of them.
Run: FASTUDY_BIN=build/fastudy /usr/bin/python3 -m unittest -v test_documented_keys
"""

import concurrent.futures
import csv
import io
import json
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import unittest
from pathlib import Path

import h5py
import numpy as np

BIN = os.environ.get("FASTUDY_BIN", "build/fastudy")
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

# fp32's unit roundoff, the bound of one rounding of an fp32 result relative to it.
U32 = 2.0**-24

# Documented keys that nothing reads yet, and the branch that connects them. Their rows below are
# complete and are skipped while listed here: remove a line when its branch lands.
PENDING = {
}


# ---------------------------------------------------------------------------------------------------
# What the docs list
# ---------------------------------------------------------------------------------------------------

IDENT = re.compile(r"^[a-z][a-z0-9_]*$")


def top_level_code_spans(text):
    """The `code` spans of text that are not inside parentheses (those hold values and remarks)."""
    spans, depth, i = [], 0, 0
    while i < len(text):
        c = text[i]
        if c == "`":
            j = text.index("`", i + 1)
            if depth == 0:
                spans.append(text[i + 1 : j])
            i = j + 1
            continue
        depth += c == "("
        depth -= c == ")" and depth > 0
        i += 1
    return spans


def reference_keys():
    """The keys of docs/configuration.md's "Sections and keys": each bullet `[section]` lists its keys
    outside parentheses; a `[table]` named in a bullet's first line holds the keys of its nested bullets,
    an array of tables (`[[x]]`) overrides the section's keys and holds none of its own. Tables count
    as entries of their own ("grid.vary")."""
    text = (DOCS / "configuration.md").read_text()
    body = text.split("## Sections and keys", 1)[1].split("\n## ", 1)[0]
    keys = set()
    for bullet in re.split(r"\n- ", "\n" + body)[1:]:
        m = re.match(r"\*\*`\[([a-z.]+)\]`\*\*(?: and \*\*`\[([a-zA-Z.]+)\]`\*\*)?", bullet)
        if not m:
            continue
        section = m.group(1)
        if m.group(2):
            keys.add(m.group(2))
        head, _, nested = bullet[m.end():].partition("\n  - ")
        container = section
        for span in top_level_code_spans(head):
            if span.startswith("[["):
                keys.add(span.strip("[]"))
            elif span.startswith("["):
                container = span.strip("[]")
                keys.add(container)
            elif IDENT.match(span):
                keys.add(f"{section}.{span}")
        for span in top_level_code_spans(nested):
            if span.startswith("[["):
                keys.add(span.strip("[]"))
            elif span.startswith("["):
                keys.add(span.strip("[]"))
            elif IDENT.match(span):
                keys.add(f"{container}.{span}")
    return keys


def named_keys():
    """Every `[section] key` written in a docs/ page (as in "`[train] device`")."""
    keys = set()
    for page in DOCS.glob("*.md"):
        for section, key in re.findall(r"`\[([a-z]+)\] ([a-z_]+)", page.read_text()):
            keys.add(f"{section}.{key}")
    return keys


def import_keys():
    """The keys of the [import] and [axes.NAME] tables in docs/import.md's example (commented-out ones
    included: they are documented options)."""
    text = (DOCS / "import.md").read_text()
    example = text.split("```toml", 1)[1].split("```", 1)[0]
    keys, table = set(), None
    for line in example.splitlines():
        head = re.match(r"\[([a-z_.]+)\]", line)
        if head:
            name = head.group(1)
            table = "import" if name == "import" else "axes.NAME" if name.startswith("axes.") else None
            continue
        key = re.match(r"\s*#?\s*([a-z_]+)\s*=", line)
        if table and key:
            keys.add(f"{table}.{key.group(1)}")
    return keys


def documented_keys():
    return reference_keys() | named_keys() | import_keys()


def documented_environment():
    """The variables of docs/build.md's table "Environment variables"."""
    text = (DOCS / "build.md").read_text().split("## Environment variables", 1)[1]
    return set(re.findall(r"^\| `(FASTUDY_[A-Z_]+)=", text, re.M))


def jobs_and_help():
    """{job: its `--help` text} for every job `fastudy --help` lists."""
    top = subprocess.run([BIN, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    jobs = re.findall(r"^  ([a-z]+) {2,}", top.split("jobs:", 1)[1].split("\n\n", 1)[0], re.M)
    return {job: subprocess.run([BIN, job, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=60).stdout for job in jobs}


def help_options(helps):
    """"JOB --option" for every option of each job's --help ("common options" as job "*")."""
    options = set()
    for job, text in helps.items():
        for part in re.split(r"\n(?=\S)", text):
            owner = "*" if part.startswith("common options") else job if part.startswith("options of") else None
            if owner is None:
                continue
            for long in re.findall(r"^  (?:-[a-z] \[ )?(--[a-z-]+)", part, re.M):
                options.add(f"{owner} {long}")
    return options


def docs_options(jobs):
    """"JOB --option" for every option of a `fastudy JOB ...` command in the docs (code blocks, indented
    code and code spans), with "*" for the common options; `fastudy GRID` is `run`."""
    common = {"--out", "--resume", "--force", "--quiet", "--verbose", "--help", "--version"}
    short = {"-q": "--quiet", "-v": "--verbose", "-h": "--help", "-o": "--out", "-n": "--ranks"}
    options = set()
    for page in list(DOCS.glob("*.md")) + [ROOT / "README.md"]:
        text = page.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        spans = re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
        commands = [span[span.index("fastudy "):].replace("\n", " ") for span in spans if "fastudy " in span]
        for block in blocks:
            commands += [line for line in block.splitlines() if line.lstrip().startswith("fastudy ")]
        commands += [line.strip() for line in text.splitlines() if line.startswith("    fastudy ")]
        for command in commands:
            words = command.split("#", 1)[0].split()
            job = words[1] if len(words) > 1 and words[1] in jobs else "run"
            alternatives = [j for j in words[1].split("|") if j in jobs] if len(words) > 1 else []
            for opt in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[qvhon])\b", " ".join(words[1:])):
                opt = short.get(opt, opt)
                for j in alternatives or [job]:
                    options.add(f"* {opt}" if opt in common else f"{j} {opt}")
    return options


# ---------------------------------------------------------------------------------------------------
# Running fastudy and reading what it wrote
# ---------------------------------------------------------------------------------------------------

class Result:
    def __init__(self, code, output, out=None):
        self.code, self.output, self.out = code, output, Path(out) if out else None


def fastudy(*args, env=None, expect=0, cwd=None):
    environ = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "FASTUDY_TORCH_THREADS": "1", **(env or {})}
    r = subprocess.run([BIN] + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=environ, timeout=600, cwd=cwd)
    if expect is not None and r.returncode != expect:
        raise AssertionError(f"fastudy {' '.join(map(str, args))} exited {r.returncode}, not {expect}:\n{r.stdout}")
    return Result(r.returncode, r.stdout)


def csv_rows(path):
    """The rows of a CSV fastudy wrote, without its '#' provenance lines."""
    lines = [line for line in Path(path).read_text().splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def train_log(out, variant):
    return csv_rows(Path(out) / "variants" / variant / "train_log.csv")


def checkpoint(out, variant, step):
    """(params, exp_avg, exp_avg_sq, attributes) of a checkpoint, as float64 arrays."""
    with h5py.File(Path(out) / "checkpoints" / variant / f"step_{step:07d}.h5", "r") as f:
        params = {k: f["params"][k][()].astype(np.float64) for k in f["params"]}
        opt = f["optimizer"]
        m = {k[: -len(".exp_avg")]: opt[k][()].astype(np.float64) for k in opt if k.endswith(".exp_avg")}
        v = {k[: -len(".exp_avg_sq")]: opt[k][()].astype(np.float64) for k in opt if k.endswith(".exp_avg_sq")}
        attrs = {k: (a.decode() if isinstance(a, bytes) else a) for k, a in f.attrs.items()}
    return params, m, v, attrs


def same_params(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def variant_by_axes(out, step, **axes):
    """The id of the variant whose checkpoint at `step` records exactly these axis values (others free)."""
    found = []
    for d in sorted((Path(out) / "checkpoints").iterdir()):
        with h5py.File(d / f"step_{step:07d}.h5", "r") as f:
            attrs = {k: (a.decode() if isinstance(a, bytes) else str(a)) for k, a in f.attrs.items()}
        if all(attrs.get(f"axis.{k}") == str(v) for k, v in axes.items()):
            found.append(d.name)
    if len(found) != 1:
        raise AssertionError(f"{len(found)} variants of {out} have {axes}: {found}")
    return found[0]


def error_columns(row):
    return tuple(row[c] for c in ("max_abs", "mean_abs", "rel_l2", "rmse", "mean_signed"))


def rows_of(out, **where):
    """microbench.csv rows matching every column = value given."""
    return [r for r in csv_rows(Path(out) / "microbench.csv") if all(r[k] == str(v) for k, v in where.items())]


def errors(out, **where):
    rows = rows_of(out, **where)
    if not rows:
        raise AssertionError(f"no microbench.csv rows of {out} with {where}")
    return [error_columns(r) for r in rows]


def safetensors(path, tensors):
    """Writes a safetensors file (the format's 8-byte header length, JSON header, raw little-endian data)."""
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ---------------------------------------------------------------------------------------------------
# The studies: each a grid written here and the commands run on it, once, on first use
# ---------------------------------------------------------------------------------------------------

# The knobs study's model: every [model] value off its default (vocab 64, d_model 64, heads 4, layers 2,
# seq_len 64, mlp_ratio 4), three layers for the captured inputs.
KNOBS_MODEL = "[model]\nvocab = 16\nd_model = 8\nheads = 2\nlayers = 3\nseq_len = 8\nmlp_ratio = 2\n"
# The knobs study's [train]: every value off its default. Checkpoints at every step (the AdamW algebra
# reads steps 1 and 2); the loss rises at steps 3-5 of this run, so that spikes show.
KNOBS_TRAIN = """[train]
steps = 6
batch = 4
lr = 0.05
min_lr = 0.01
warmup = 2
beta1 = 0.8
beta2 = 0.9
eps = 1e-3
weight_decay = 0.5
grad_clip = 0.5
checkpoint_every = 1
log_every = 2
shadow_attention = true
spike_window = 2
spike_threshold = 1.0001
loss_scale = 4
loss_scale_window = 2
"""
KNOBS_ATTENTION = "[attention]\nblock_q = 4\nblock_kv = 4\n"
# Captured inputs of the knobs study's own model, one key changed per sweep against `cap`.
KNOBS_MICROBENCH = """[microbench]
formats = ["bf16"]
policies = ["pure"]
blocks = [[4, 4]]
loop_orders = ["kv_outer"]
trials = 1
distribution = "captured"
captured_variant = "fp32"
[[microbench.sweeps]]
name = "cap"
[[microbench.sweeps]]
name = "cap_variant"
captured_variant = "fp16"
[[microbench.sweeps]]
name = "cap_step"
captured_step = 3
[[microbench.sweeps]]
name = "cap_layer"
captured_layer = 2
[[microbench.sweeps]]
name = "cap_batch"
captured_batch = 1
"""

# The grid study: a 2-layer model, two steps with a checkpoint each.
GRID_TABLES = {"model": {"vocab": 16, "d_model": 8, "heads": 2, "layers": 2, "seq_len": 8, "mlp_ratio": 1},
               "data": {"span_len": 2}, "train": {"steps": 2, "batch": 8, "warmup": 0, "checkpoint_every": 1},
               "attention": {"block_q": 4, "block_kv": 4}}


def toml_tables(tables):
    return "".join(f"[{t}]\n" + "".join(f"{k} = {toml_list(v)}\n" for k, v in keys.items()) for t, keys in tables.items())


# Two combinations of grid axes, each with a variant per axis that leaves that axis out (sets it to
# another value): every axis must change the weights within its combination, and the same values set
# study-wide ([attention], [numerics], [train], [data]) must give the combination's weights bit for bit.
COMBO_A = {"attention": "flash", "block_kv": 2, "loop_order": "kv_outer", "matmul": "bf16",
           "split_k": 2, "layernorm": "welford", "gelu": "tanh", "dp_width": 4, "allreduce": "tree",
           "grad_accum": 2, "lr": 0.02, "init": "scaled", "seed": 2, "data_seed": 5}
OTHER_A = {"attention": "baseline", "block_kv": 4, "loop_order": "q_outer", "matmul": "fp32",
           "split_k": 1, "layernorm": "torch", "gelu": "erf", "dp_width": 2, "allreduce": "rank",
           "grad_accum": 1, "lr": 0.01, "init": "normal", "seed": 1, "data_seed": 6}
# A's reading is mixed (fp32 inside ops), where the loop order changes the fp32 arithmetic; the Q block
# does not (rows are independent, dK and dV accumulate row by row), so it is B's, at bf16 with the eager
# reading, whose backward rounds per Q block. (fa2 and fa3 have their own loop: no loop_order.)
A_FIXED = {"policy": "mixed", "block_q": 4}
COMBO_B = {"attention": "flash", "precision": "bf16", "policy": "eager", "arithmetic": "native", "block_q": 2}
OTHER_B = {"attention": "baseline", "precision": "fp32", "policy": "mixed", "arithmetic": "emulated", "block_q": 4}
# B keeps A's tiles and settings (not its numerics: native arithmetic takes none of them).
B_FIXED = {k: COMBO_A[k] for k in ("block_kv", "loop_order", "lr", "init", "seed", "data_seed")}
# Where each axis is also a study-wide key (configuration.md); the others stay one-valued [grid] axes.
STUDY_WIDE = {"block_q": "attention.block_q", "block_kv": "attention.block_kv", "loop_order": "attention.loop_order",
              "policy": "attention.policy", "matmul": "numerics.matmul", "split_k": "numerics.split_k",
              "layernorm": "numerics.layernorm", "gelu": "numerics.gelu", "dp_width": "train.dp_width",
              "allreduce": "train.allreduce", "grad_accum": "train.grad_accum", "lr": "train.lr",
              "arithmetic": "train.arithmetic", "data_seed": "data.seed"}


def toml_value(v):
    return f'"{v}"' if isinstance(v, str) else str(v)


def vary_table(axes):
    return "[[grid.vary]]\n" + "".join(f"{k} = [{toml_value(v)}]\n" for k, v in axes.items())


def grid_study_text(out):
    text = f'[study]\nname = "grid"\nout = "{out}"\nphases = ["train"]\n' + toml_tables(GRID_TABLES)
    # A microbenchmark section the phases leave out.
    text += '[microbench]\nformats = ["bf16"]\npolicies = ["pure"]\nseq_lens = [8]\nhead_dims = [4]\ntrials = 1\n'
    for combo, other, fixed in ((COMBO_A, OTHER_A, A_FIXED), (COMBO_B, OTHER_B, B_FIXED)):
        text += vary_table({**fixed, **combo})
        for axis in combo:
            text += vary_table({**fixed, **combo, axis: other[axis]})
    text += "[[grid.vary]]\nrecompute = [\"off\", \"on\"]\n[[grid.vary]]\nrepeat = [0, 1]\n"
    return text


def study_wide_text(name, out, axes):
    """The grid study's base with `axes` set study-wide where they have a key, as one-valued [grid] axes
    elsewhere."""
    tables = {t: dict(keys) for t, keys in GRID_TABLES.items()}
    for axis, value in axes.items():
        table, key = STUDY_WIDE[axis].split(".") if axis in STUDY_WIDE else ("grid", axis)
        tables.setdefault(table, {})[key] = [value] if table == "grid" else value
    return f'[study]\nname = "{name}"\nout = "{out}"\nphases = ["train"]\n' + toml_tables(tables)


# The attention policies study: the pure bf16 reading with one step (or option) changed per policy.
STEPS = ["q", "k", "v", "s", "p", "o", "o_running", "accum", "stats", "stats_running", "softmax", "exp_arg",
         "rescale", "division", "grad"]
# Each step to fp32 on the pure reading (every step bf16), except two that pure hides: `o` after a bf16
# division and `division` before a bf16 `o` give the same value either way, so those two are changed on
# the mixed reading (fp32 inside ops, storage in bf16): o to fp32, division to bf16.
ON_MIXED = {"o": "fp32", "division": "bf16"}
POLICY_TABLES = "".join(f'[attention.policies.x_{s}]\n' + (f'preset = "mixed"\n{s} = "{ON_MIXED[s]}"\n' if s in ON_MIXED
                        else f'{s} = "fp32"\n') for s in STEPS) + """
[attention.policies.x_flash.flash]
s = "fp32"
[attention.policies.x_baseline.baseline]
s = "fp32"
[attention.policies.x_preset]
preset = "mixed"
[attention.policies.x_rounding]
rounding = "zero"
[attention.policies.x_scale]
scale = "before"
[attention.policies.x_quantization]
preset = "fa3"
quantization = "none"
[attention.policies.x_incoherent]
preset = "fa3"
incoherent_processing = false
[attention.policies.x_max_offset]
preset = "eager"
max_offset = 2.0
"""
# Head dim 8: the scale 1/sqrt(8) is no power of two, so where it is applied (`scale`) and the storage of
# the scaled scores (`s`) show.
POLICIES_MICROBENCH = """[microbench]
seq_lens = [8]
head_dims = [8]
blocks = [[4, 4]]
loop_orders = ["kv_outer"]
trials = 1
heads = 1
[[microbench.sweeps]]
name = "steps"
formats = ["bf16"]
passes = ["forward", "backward"]
policies = ["pure", "mixed", %s, "x_flash", "x_baseline", "x_preset", "x_rounding", "x_scale"]
[[microbench.sweeps]]
name = "fp8"
formats = ["fp8_e4m3"]
passes = ["forward"]
policies = ["fa3", "x_quantization", "x_incoherent"]
[[microbench.sweeps]]
name = "max_offset"
formats = ["bf16"]
distribution = "repeated_max"
policies = ["eager", "x_max_offset"]
""" % ", ".join(f'"x_{s}"' for s in STEPS)

# The microbenchmark keys study: one key changed per sweep against `base` (or the sweep named).
MICROBENCH_SWEEPS = {
    "base": {},
    "formats": {"formats": ["fp16"]},
    "policies": {"policies": ["mixed"]},
    "roundings": {"roundings": ["stochastic"]},
    "passes": {"passes": ["backward"]},
    "trials": {"trials": 2},
    "seed": {"seed": 8},
    "seq_lens": {"seq_lens": [16]},
    "head_dims": {"head_dims": [8]},
    "batch": {"batch": 2},
    "heads": {"heads": 2},
    "causal": {"causal": [True]},
    "loop_orders": {"loop_orders": ["q_outer"], "passes": ["backward"]},
    "loop_orders_base": {"passes": ["backward"]},
    "blocks": {"blocks": [[2, 2]]},
    "sram": {"sram": [128]},
    "tile_rules": {"sram": [128], "tile_rules": ["swapped"]},
    "uniform": {"distribution": "uniform"},
    "outliers": {"distribution": "outliers", "outlier_fraction": 0.2},
    "outlier_fraction": {"distribution": "outliers", "outlier_fraction": 0.5},
    "outlier_scale": {"distribution": "outliers", "outlier_fraction": 0.2, "outlier_scale": 50.0},
    "sink": {"distribution": "sink"},
    "sink_logit": {"distribution": "sink", "sink_logit": 5.0},
    "repeated_max": {"distribution": "repeated_max"},
    "repeated_keys": {"distribution": "repeated_max", "repeated_keys": 2},
    "framework": {"framework": ["torch_baseline"]},
}


def toml_list(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(toml_list(x) for x in v) + "]"
    return toml_value(v)


def microbench_keys_text(out):
    text = f'[study]\nname = "mbkeys"\nout = "{out}"\nphases = ["microbench"]\n' + """[microbench]
formats = ["bf16"]
policies = ["pure"]
passes = ["forward"]
seq_lens = [8]
head_dims = [4]
loop_orders = ["kv_outer"]
trials = 1
heads = 1
save_outputs = true
"""
    for name, keys in MICROBENCH_SWEEPS.items():
        text += f'[[microbench.sweeps]]\nname = "{name}"\n'
        if "sram" not in keys and "blocks" not in keys:
            text += "blocks = [[4, 4]]\n"
        text += "".join(f"{k} = {toml_list(v)}\n" for k, v in keys.items())
    return text


class Studies:
    """Each study once, on first use, safe to ask for from several threads."""

    def __init__(self, root):
        self.root = Path(root)
        self.done, self.failed, self.locks, self.guard = {}, {}, {}, threading.Lock()

    def __getitem__(self, name):
        """The study's results; a study that failed fails every row that reads it, without running again."""
        with self.guard:
            lock = self.locks.setdefault(name, threading.Lock())
        with lock:
            if name in self.failed:
                raise AssertionError(f"study {name} failed: {self.failed[name]}")
            if name not in self.done:
                try:
                    self.done[name] = getattr(self, "study_" + name)()
                except Exception as e:
                    self.failed[name] = e
                    raise
            return self.done[name]

    def grid_file(self, name, text):
        path = self.root / f"{name}.toml"
        path.write_text(text)
        return path

    def out(self, name):
        return self.root / ("out-" + name)

    # -- training ------------------------------------------------------------------------------------

    def knobs_text(self, out, precisions='["fp32", "fp16"]', extra=""):
        return (f'[study]\nname = "knobs"\nout = "{out}"\nphases = ["train"]\n[grid]\nprecision = {precisions}\n'
                + KNOBS_MODEL + "[data]\nspan_len = 2\n" + KNOBS_TRAIN + KNOBS_ATTENTION + KNOBS_MICROBENCH + extra)

    def study_knobs(self):
        """Two variants (fp32, fp16) with every [train] knob off its default, then the captured-input
        microbenchmark on their checkpoints (--resume), after a refusal without it."""
        out = self.out("knobs")
        grid = self.grid_file("knobs", self.knobs_text(out))
        r = fastudy(grid, env={"FASTUDY_TORCH_THREADS": "2"})
        refused = fastudy("microbench", grid, expect=2)
        mb = fastudy("microbench", grid, "--resume", "-q")
        return Result(r.code, r.output, out), refused, mb

    def one_step(self, name, change, model=KNOBS_MODEL, data="[data]\nspan_len = 2\n", steps=1, args=()):
        """The knobs study's fp32 variant for one step with one change: its first loss depends only on the
        initial weights, the data and the model, not on the optimizer's knobs."""
        out = self.out(name)
        text = self.knobs_text(out, '["fp32"]').replace(KNOBS_MODEL, model).replace("[data]\nspan_len = 2\n", data)
        text = text.replace("steps = 6\n", f"steps = {steps}\n").replace("warmup = 2\n", f"warmup = {min(2, steps)}\n")
        for old, new in change:
            assert old in text, old
            text = text.replace(old, new)
        r = fastudy("train", self.grid_file(name, text), "-q", *args)
        return Result(r.code, r.output, out)

    def study_batch(self):
        # steps 3 with a constant schedule: the lr column shows `schedule` (the knobs run is cosine).
        return self.one_step("batch", [("batch = 4\n", "batch = 2\nschedule = \"constant\"\n")], steps=3)

    def study_heads(self):
        # Written to --out, not to [study] out.
        r = self.one_step("heads", [("heads = 2\n", "heads = 1\n")], args=("--out", self.out("heads-elsewhere")))
        return Result(r.code, r.output, self.out("heads-elsewhere"))

    def study_span(self):
        return self.one_step("span", [("span_len = 2\n", "span_len = 3\n")])

    def data_file(self, name, salt):
        """One file, three readings: uint32 ids below the vocabulary (70000) whose upper halves alternate 0
        and 1, so that read as uint16 ids they are ids too (and not all odd ones 0, which the preflight
        takes for a uint32 file), and read as text, bytes."""
        path = self.root / name
        ids = [(i * 7 + salt) % 251 + 65536 * (i % 2) for i in range(512)]
        path.write_bytes(np.array(ids, dtype="<u4").tobytes())
        return path

    def read_data(self, name, kind, token_bytes=None, salt=3):
        path = self.data_file(f"{name}.bin", salt)
        data = f'[data]\nkind = "{kind}"\npath = "{path}"\nspan_len = 2\n'
        if token_bytes:
            data += f"token_bytes = {token_bytes}\n"
        return self.one_step(name, [], model=KNOBS_MODEL.replace("vocab = 16", "vocab = 70000"), data=data)

    def study_text(self):
        return self.read_data("text", "text")

    def study_tokens2(self):
        return self.read_data("tokens2", "tokens")

    def study_tokens4(self):
        return self.read_data("tokens4", "tokens", 4)

    def study_tokens4_other(self):
        return self.read_data("tokens4_other", "tokens", 4, salt=5)

    def study_grid(self):
        out = self.out("grid")
        r = fastudy(self.grid_file("grid", grid_study_text(out)), "-q")
        return Result(r.code, r.output, out)

    def wide(self, name, axes):
        out = self.out(name)
        r = fastudy("train", self.grid_file(name, study_wide_text(name, out, axes)), "-q")
        return Result(r.code, r.output, out)

    def study_wide_a(self):
        return self.wide("wide_a", {**A_FIXED, **COMBO_A})

    def study_wide_b(self):
        return self.wide("wide_b", {**B_FIXED, **COMBO_B})

    def study_replay(self):
        """Replay of the grid study's combination-A variant from step 1, one step, attention = baseline."""
        out = self[("grid")].out
        variant = variant_by_axes(out, 2, **A_FIXED, **COMBO_A)
        r = fastudy("replay", out, "--variant", variant, "--from", 1, "--steps", 1, "--set", "attention=baseline", "-q")
        return Result(r.code, r.output, out), variant

    def study_bisect(self):
        out = self["grid"].out
        a = variant_by_axes(out, 2, **A_FIXED, **COMBO_A)
        b = variant_by_axes(out, 2, **A_FIXED, **{**COMBO_A, "attention": "baseline"})
        r = fastudy("bisect", out, "--variant", a, "--against", b, "--step", 1)
        return Result(r.code, r.output, out), a, b

    def small_text(self, out, seeds="[1, 2, 3]", phases='["train", "reduce"]'):
        return (f'[study]\nname = "small"\nout = "{out}"\nphases = {phases}\n[grid]\nseed = {seeds}\n'
                + toml_tables(GRID_TABLES).replace("steps = 2\n", "steps = 1\n").replace("layers = 2", "layers = 1"))

    def study_small(self):
        """Three seeds, one step, the reduce phase only: --variant, --force, -q/-v, --allow-missing."""
        out = self.out("small")
        grid = self.grid_file("small", self.small_text(out, phases='["reduce"]'))
        one = fastudy("train", grid, "--variant", "s2")
        trained_one = sorted(p.name for p in (out / "checkpoints").iterdir())
        refused = fastudy("train", grid, expect=2)
        forced = fastudy("train", grid, "--force", "-q")
        # The run job with --variant trains only that one, in a study of its own.
        other = self.out("small-run")
        run = fastudy("run", self.grid_file("small_run", self.small_text(other, phases='["train"]')), "--variant", "s3",
                      "-q")
        # s3's checkpoint damaged: reduce (and run, whose phase it is) refuses, naming it; --allow-missing
        # leaves it out.
        ckpt = out / "checkpoints" / "s3" / "step_0000001.h5"
        ckpt.write_bytes(ckpt.read_bytes()[:100])
        missing = fastudy("reduce", out, expect=1)
        run_missing = fastudy("run", grid, "--resume", expect=1)
        allowed = fastudy("reduce", out, "--allow-missing", "-v")
        run_allowed = fastudy("run", grid, "--resume", "--allow-missing")
        return dict(out=out, one=one, trained_one=trained_one, refused=refused, forced=forced, run=run, run_out=other,
                    missing=missing, run_missing=run_missing, allowed=allowed, run_allowed=run_allowed)

    def study_device(self):
        """device = "cuda" in the grid and --device cuda on the command line: on a build whose LibTorch has
        no CUDA both are refused naming what asked for it; with a GPU both train there."""
        out = self.out("device")
        text = self.small_text(out, "[1]", '["train"]').replace("warmup = 0\n", 'warmup = 0\ndevice = "cuda"\n')
        key = fastudy("train", self.grid_file("device", text), expect=None)
        plain = self.grid_file("device_option", self.small_text(self.out("device-option"), "[1]", '["train"]'))
        option = fastudy("train", plain, "--device", "cuda", expect=None)
        cpu = fastudy("train", plain, "--device", "cpu", "--out", self.out("device-cpu"), "-q")
        return key, option, cpu

    # -- plan ----------------------------------------------------------------------------------------

    def plan(self, name, text, *args, expect=0):
        return fastudy("plan", self.grid_file(name, text), *args, expect=expect)

    def study_plans(self):
        base = f'[study]\nname = "planned"\nout = "{self.out("plans")}"\n' + toml_tables(GRID_TABLES)
        return {
            # The base plan: 2 ranks (-n, --ranks' short form), no time estimate.
            "base": self.plan("plan_base", base, "-n", 2, "--measure-steps", 0),
            "measured": self.plan("plan_measured", base, "--measure-steps", 1),
            "ranks": self.plan("plan_ranks", base.replace("warmup = 0\n", "warmup = 0\nranks_per_variant = 2\n"),
                               "--ranks", 2, "--measure-steps", 0),
            "recompute_axis": self.plan("plan_rc_axis", base + '[grid]\nrecompute = ["on"]\n', "--measure-steps", 0),
            "recompute_key": self.plan("plan_rc_key", base + '[numerics]\nrecompute = "on"\n', "--measure-steps", 0),
            "repeat_key": self.plan("plan_repeat", base.replace("warmup = 0\n", "warmup = 0\nrepeat = 1\n"),
                                    "--measure-steps", 0),
            "max_variants": self.plan("plan_max", base.replace("[study]\n", "[study]\nmax_variants = 2\n")
                                      + "[grid]\nseed = [1, 2, 3]\n", "--measure-steps", 0, expect=2),
        }

    # -- microbenchmark ------------------------------------------------------------------------------

    def study_policies(self):
        out = self.out("policies")
        text = f'[study]\nname = "policies"\nout = "{out}"\nphases = ["microbench"]\n' + POLICY_TABLES + POLICIES_MICROBENCH
        r = fastudy(self.grid_file("policies", text), "-q")
        return Result(r.code, r.output, out)

    def study_microbench(self):
        out = self.out("microbench")
        r = fastudy("microbench", self.grid_file("microbench", microbench_keys_text(out)), "-q")
        return Result(r.code, r.output, out)

    def study_devices(self):
        out = self.out("devices")
        text = microbench_keys_text(out).split("[[microbench.sweeps]]")[0] + 'devices = ["cpu", "cuda"]\n'
        r = fastudy("microbench", self.grid_file("devices", text), expect=None)
        return Result(r.code, r.output, out)

    def study_input_file(self):
        """Q, K, V, dO of shape [1, 1, 16, 4] from an h5py file, against the same grid on normal inputs."""
        path = self.root / "qkv.h5"
        rng = np.random.default_rng(11)
        with h5py.File(path, "w") as f:
            for name in ("q", "k", "v", "do"):
                f[name] = rng.standard_normal((1, 1, 16, 4)).astype(np.float32)
        out = self.out("input_file")
        text = microbench_keys_text(out).split("[[microbench.sweeps]]")[0]
        text += f'[[microbench.sweeps]]\nname = "file"\ndistribution = "file"\ninput_file = "{path}"\n'
        text += 'passes = ["forward", "backward"]\nblocks = [[4, 4]]\n'
        r = fastudy("microbench", self.grid_file("input_file", text), "-q", expect=None)
        return Result(r.code, r.output, out), path

    def study_advise(self):
        out = self.out("advise")
        text = (f'[study]\nname = "advise"\nout = "{out}"\n[microbench]\nformats = ["bf16"]\npolicies = ["eager"]\n'
                'passes = ["forward"]\nseq_lens = [8]\nhead_dims = [4]\nblocks = [[4, 4]]\nloop_orders = ["kv_outer"]\n'
                "trials = 1\nheads = 1\n")
        grid = self.grid_file("advise", text)
        plain = fastudy("advise", grid, "--out", out)
        strict = fastudy("advise", grid, "--out", self.out("advise-strict"), "--target-ulps", 0.001)
        return plain, strict

    # -- reduce, imported ----------------------------------------------------------------------------

    def imported_runs(self):
        """Checkpoints written here as safetensors: impl (a, b) x seed (1, 2) x order (p, q) at steps 10,
        20, 30, each tensor under DDP's prefix `module.`."""
        runs = self.root / "runs"
        if runs.exists():
            return runs
        rng = np.random.default_rng(5)
        base = {"w.weight": rng.standard_normal((4, 4)), "w.bias": rng.standard_normal(4),
                "v.weight": rng.standard_normal((3, 4))}
        for impl in ("a", "b"):
            for seed in (1, 2):
                for order in ("p", "q"):
                    for step in (10, 20, 30):
                        moved = {k: x + step * 1e-3 * rng.standard_normal(x.shape) * (2 if impl == "a" else 1)
                                 for k, x in base.items()}
                        safetensors(runs / f"{impl}-s{seed}-{order}" / f"step_{step}.safetensors",
                                    {"module." + k: x for k, x in moved.items()})
        return runs

    def import_text(self, name, import_extra="", reduce_extra="", replicate="replicate = true\n"):
        self.imported_runs()
        return (f'[study]\nname = "{name}"\nout = "{self.out(name)}"\n'
                '[import]\npath = "runs/{impl}-s{seed}-{order}/step_{step}.safetensors"\n'
                'strip_prefix = ["module."]\nrename = { "v.weight" = "renamed.weight" }\nexclude = ["*.bias"]\n'
                + import_extra + '[grid]\nimpl = ["a", "b"]\nseed = [1, 2]\norder = ["p", "q"]\n'
                '[axes.impl]\nrole = "optimisation"\nbaseline = "b"\n[axes.order]\nrole = "setting"\n' + replicate
                + reduce_extra)

    def reduce_import(self, name, **kw):
        r = fastudy("reduce", self.grid_file(name, self.import_text(name, **kw)), "-q")
        return Result(r.code, r.output, self.out(name))

    def study_imported(self):
        return self.reduce_import("imported")

    def study_imported_steps(self):
        return self.reduce_import("imported_steps", import_extra="steps = [10, 20]\n")

    def study_reduce_steps(self):
        return self.reduce_import("reduce_steps", reduce_extra="[reduce]\nsteps = [20]\n")

    def study_not_replicate(self):
        return self.reduce_import("not_replicate", replicate="")

    def study_reduce_metrics(self):
        return self.reduce_import("reduce_metrics", reduce_extra='[reduce]\nmetrics = ["w1", "max_abs"]\nper_tensor = false\n')

    def study_reduce_whole(self):
        return self.reduce_import("reduce_whole", reduce_extra="[reduce]\nwhole_model = false\n")

    # -- slurm ---------------------------------------------------------------------------------------

    def study_slurm(self):
        out = self.out("slurm")
        grid = self.grid_file("slurm", self.small_text(out))
        r = fastudy("slurm", grid, "--nodes", 3, "--ntasks-per-node", 5, "--gpus-per-node", 2, "--cpus-per-task", 4,
                    "--time", "02:03:04", "--partition", "pz", "--account", "acct", "--launcher", "mpirun")
        script = (out / "fastudy.sbatch").read_text()
        # --submit hands the script to sbatch: here a stand-in that records its arguments.
        bindir = self.root / "fake-bin"
        bindir.mkdir(exist_ok=True)
        record = self.root / "sbatch-args"
        (bindir / "sbatch").write_text(f'#!/bin/sh\necho "$@" > {record}\necho "Submitted batch job 42"\n')
        (bindir / "sbatch").chmod(0o755)
        submitted = fastudy("slurm", grid, "--out", self.out("slurm-submit"), "--submit",
                            env={"PATH": f"{bindir}:{os.environ.get('PATH', '')}"})
        return r, script, submitted, record.read_text() if record.exists() else ""


# ---------------------------------------------------------------------------------------------------
# The table: every documented key, option and environment variable, and how its effect is asserted
# ---------------------------------------------------------------------------------------------------

KEYS, OPTIONS, ENVIRONMENT = {}, {}, {}


class Check:
    def __init__(self, studies, fn):
        self.studies, self.fn = studies, fn


class Pointer:
    """The effect is asserted by another CLI-level test: `file` holds `test` and its body names `mention`."""

    def __init__(self, file, test, mention):
        self.file, self.test, self.mention = file, test, mention


def rows(table, *names, studies=()):
    def register(fn):
        for name in names:
            table[name] = Check(studies, fn)
        return fn
    return register


def key(*names, studies=()):
    return rows(KEYS, *names, studies=studies)


def option(*names, studies=()):
    return rows(OPTIONS, *names, studies=studies)


def loss1(result):
    return train_log(result.out, "fp32")[0]["loss"]


def knobs(s):
    return s["knobs"][0]


# -- [study] ------------------------------------------------------------------------------------------

@key("study.name", studies=("plans",))
def _(t, s, name):
    t.assertIn("# study planned (", s["plans"]["base"].output)


@key("study.out", studies=("knobs",))
def _(t, s, name):
    r = knobs(s)
    t.assertTrue((r.out / "study.toml").is_file(), r.output)
    t.assertTrue((r.out / "checkpoints" / "fp32").is_dir())


@key("study.phases", studies=("grid",))
def _(t, s, name):
    # The grid study lists only train: its [microbench] section is not run.
    out = s["grid"].out
    t.assertTrue((out / "checkpoints").is_dir())
    t.assertFalse((out / "microbench.csv").exists())


KEYS["microbench.sm_count"] = Pointer("tests/cli/test_microbench_file.cpp", "MicrobenchFile, SmCountChangesTheSplit",
                                      "sm_count = ")
KEYS["reduce.pairs"] = Pointer("tests/cli/test_reduce.cpp", "Reduce, PairsAllComputesEveryPairAndChangesNoVerdict",
                               "pairs = \\\"all\\\"")
KEYS["study.memory_check"] = Pointer("tests/cli/test_reliability_preflight.cpp",
                                     "Preflight, LayoutMemoryDiskAndReportAllAtOnceBeforeAnythingIsWritten",
                                     "memory_check = false")


@key("study.max_variants", studies=("plans",))
def _(t, s, name):
    r = s["plans"]["max_variants"]
    t.assertEqual(r.code, 2)
    t.assertIn("max_variants", r.output)


# -- [grid] axes, [[grid.vary]] and their study-wide keys -----------------------------------------------

def combination_effect(t, s, axis):
    """The combination holding `axis` differs, in its final weights, from the one that leaves it out."""
    out = s["grid"].out
    combo, other = (COMBO_A, OTHER_A) if axis in COMBO_A else (COMBO_B, OTHER_B)
    fixed = A_FIXED if combo is COMBO_A else B_FIXED
    with_axis = variant_by_axes(out, 2, **fixed, **combo)
    without = variant_by_axes(out, 2, **fixed, **{**combo, axis: other[axis]})
    t.assertFalse(same_params(checkpoint(out, with_axis, 2)[0], checkpoint(out, without, 2)[0]),
                  f"{axis} = {combo[axis]} and {other[axis]} gave the same weights ({with_axis}, {without})")


@key(*(f"grid.{axis}" for axis in list(COMBO_A) + list(COMBO_B)), studies=("grid",))
def _(t, s, name):
    combination_effect(t, s, name.split(".", 1)[1])


@key("grid.vary", studies=("grid",))
def _(t, s, name):
    # The design is the union of the tables, not their cross product: 15 + 6 + 2 + 1 variants (the
    # all-baseline one shared by the recompute and repeat tables).
    t.assertEqual(len(list((s["grid"].out / "checkpoints").iterdir())), len(COMBO_A) + 1 + len(COMBO_B) + 1 + 2 + 1)


def study_wide(t, s, which):
    """The study-wide run equals, bit for bit, the grid's combination with the same values."""
    out = s["grid"].out
    combo = (variant_by_axes(out, 2, **A_FIXED, **COMBO_A) if which == "wide_a"
             else variant_by_axes(out, 2, **B_FIXED, **COMBO_B))
    wide = s[which].out
    (variant,) = [d.name for d in (wide / "checkpoints").iterdir()]
    t.assertTrue(same_params(checkpoint(out, combo, 2)[0], checkpoint(wide, variant, 2)[0]),
                 f"{which} differs from the grid's {combo}")


@key(*(STUDY_WIDE[axis] for axis in COMBO_A if axis in STUDY_WIDE), studies=("grid", "wide_a"))
def _(t, s, name):
    study_wide(t, s, "wide_a")


@key(*(STUDY_WIDE[axis] for axis in COMBO_B if axis in STUDY_WIDE), studies=("grid", "wide_b"))
def _(t, s, name):
    study_wide(t, s, "wide_b")


@key("grid.recompute", studies=("grid", "plans"))
def _(t, s, name):
    # Recomputation is a control: the same bits; the plan counts its extra work and smaller memory.
    out = s["grid"].out
    # Ids: the axis prefix and value of what is off its baseline; "default" has every axis at it.
    t.assertTrue(same_params(checkpoint(out, "recompute_on", 2)[0], checkpoint(out, "default", 2)[0]))
    t.assertEqual(checkpoint(out, "recompute_on", 2)[3]["axis.recompute"], "on")
    t.assertIn("recompute 4/3x", s["plans"]["recompute_axis"].output)
    t.assertNotIn("recompute 4/3x", s["plans"]["base"].output)
    t.assertLess(memory_estimate(s["plans"]["recompute_axis"]), memory_estimate(s["plans"]["base"]))


@key("numerics.recompute", studies=("plans",))
def _(t, s, name):
    t.assertIn("recompute 4/3x", s["plans"]["recompute_key"].output)
    t.assertLess(memory_estimate(s["plans"]["recompute_key"]), memory_estimate(s["plans"]["base"]))


def memory_estimate(result):
    m = re.search(r"memory per rank \(estimate, training\): ([0-9.]+) (B|KiB|MiB|GiB)", result.output)
    assert m, result.output
    return float(m.group(1)) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)]


def plan_hashes(result):
    return re.findall(r"^\S+\s+([0-9a-f]{16})\s", result.output, re.M)


@key("grid.repeat", studies=("grid",))
def _(t, s, name):
    # A replicate of the same arithmetic: its own id and hash, the same weights (CPU: noise floor 0).
    out = s["grid"].out
    r1, r0 = "r1", "default"
    t.assertEqual(checkpoint(out, r1, 2)[3]["axis.repeat"], "1")
    hashes = {row["variant"]: row["hash"] for row in csv_rows(out / "variants.csv")}
    t.assertNotEqual(hashes[r1], hashes[r0])
    t.assertTrue(same_params(checkpoint(out, r1, 2)[0], checkpoint(out, r0, 2)[0]))


@key("train.repeat", studies=("plans",))
def _(t, s, name):
    t.assertNotEqual(plan_hashes(s["plans"]["repeat_key"]), plan_hashes(s["plans"]["base"]))
    t.assertEqual(len(plan_hashes(s["plans"]["base"])), 1)


# -- [model] ------------------------------------------------------------------------------------------

@key("model.vocab", "model.d_model", "model.layers", "model.seq_len", "model.mlp_ratio", studies=("knobs",))
def _(t, s, name):
    params = checkpoint(knobs(s).out, "fp32", 6)[0]
    shapes = {"model.vocab": ("tok_emb.weight", (16, 8)), "model.d_model": ("ln_f.weight", (8,)),
              "model.seq_len": ("pos_emb.weight", (8, 8)), "model.mlp_ratio": ("blocks.0.mlp.fc.weight", (16, 8)),
              "model.layers": ("blocks.2.ln1.weight", (8,))}
    tensor, shape = shapes[name]
    t.assertEqual(params[tensor].shape, shape)
    if name == "model.layers":
        t.assertNotIn("blocks.3.ln1.weight", params)


@key("model.heads", studies=("knobs", "heads"))
def _(t, s, name):
    t.assertNotEqual(loss1(s["heads"]), loss1(knobs(s)))


# -- [data] -------------------------------------------------------------------------------------------

@key("data.span_len", studies=("knobs", "span"))
def _(t, s, name):
    t.assertNotEqual(loss1(s["span"]), loss1(knobs(s)))


@key("data.kind", studies=("text", "tokens2"))
def _(t, s, name):
    # One file read as bytes (text) and as uint16 ids (tokens): other sequences, another first loss.
    t.assertNotEqual(loss1(s["text"]), loss1(s["tokens2"]))


@key("data.token_bytes", studies=("tokens2", "tokens4"))
def _(t, s, name):
    t.assertNotEqual(loss1(s["tokens2"]), loss1(s["tokens4"]))


@key("data.path", studies=("tokens4", "tokens4_other"))
def _(t, s, name):
    t.assertNotEqual(loss1(s["tokens4"]), loss1(s["tokens4_other"]))


# -- [train] ------------------------------------------------------------------------------------------

@key("train.steps", studies=("knobs",))
def _(t, s, name):
    t.assertEqual([int(r["step"]) for r in train_log(knobs(s).out, "fp32")], list(range(1, 7)))


@key("train.batch", studies=("knobs", "batch"))
def _(t, s, name):
    t.assertNotEqual(loss1(s["batch"]), loss1(knobs(s)))


def cosine_lr(step, lr=0.05, min_lr=0.01, warmup=2, steps=6):
    """docs/configuration.md's schedule: linear warmup to lr, then cosine to min_lr at the last step."""
    if step <= warmup:
        return lr * step / warmup
    progress = (step - warmup) / (steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


@key("train.min_lr", "train.warmup", studies=("knobs",))
def _(t, s, name):
    for row in train_log(knobs(s).out, "fp32"):
        t.assertAlmostEqual(float(row["lr"]), cosine_lr(int(row["step"])), delta=1e-9, msg=row)


@key("train.schedule", studies=("batch",))
def _(t, s, name):
    # constant: lr after the warmup (2 steps), where cosine would have decayed to min_lr at step 3.
    t.assertEqual([float(r["lr"]) for r in train_log(s["batch"].out, "fp32")], [0.025, 0.05, 0.05])


def adamw_step2_residual(t, out, beta1, beta2, eps, weight_decay, lr=0.05):
    """max over elements of |p2 - AdamW(p1, m2, v2)| / bound, from the checkpoints of steps 1 and 2:
    p2 = p1 (1 - lr wd) - lr / (1 - b1^2) * m2 / (sqrt(v2) / sqrt(1 - b2^2) + eps), decay on matrices only
    (src/train/engine.cpp). The trainer computes it in fp32 from the stored m2 and v2: about 8 roundings
    along the way, so the bound is 8 u (|p1 (1 - lr wd)| + |update|), u = 2^-24."""
    p1, _, _, _ = checkpoint(out, "fp32", 1)
    p2, m2, v2, _ = checkpoint(out, "fp32", 2)
    worst = 0.0
    for k in p2:
        decayed = p1[k] * (1 - lr * weight_decay) if p2[k].ndim >= 2 else p1[k]
        update = lr / (1 - beta1**2) * m2[k] / (np.sqrt(v2[k]) / np.sqrt(1 - beta2**2) + eps)
        bound = 8 * U32 * (np.abs(decayed) + np.abs(update)) + 1e-30
        worst = max(worst, float(np.max(np.abs(p2[k] - (decayed - update)) / bound)))
    return worst


@key("train.eps", "train.weight_decay", studies=("knobs",))
def _(t, s, name):
    out = knobs(s).out
    t.assertLessEqual(adamw_step2_residual(t, out, 0.8, 0.9, 1e-3, 0.5), 1.0)
    default = {"train.eps": dict(eps=1e-8, weight_decay=0.5), "train.weight_decay": dict(eps=1e-3, weight_decay=0.1)}
    t.assertGreater(adamw_step2_residual(t, out, 0.8, 0.9, **default[name]), 1.0, "the default fits as well")


@key("train.beta1", "train.beta2", studies=("knobs",))
def _(t, s, name):
    # After one step exp_avg = (1 - b1) g and exp_avg_sq = (1 - b2) g^2: their ratio is (1 - b1) / sqrt(1 - b2)
    # in magnitude for every element with g != 0, up to two roundings of each moment (4 u).
    _, m, v, _ = checkpoint(knobs(s).out, "fp32", 1)
    ratio = np.concatenate([np.abs(m[k][v[k] > 0] / np.sqrt(v[k][v[k] > 0])) for k in m])
    expected = 0.2 / np.sqrt(0.1)
    np.testing.assert_allclose(ratio, expected, rtol=4 * U32)
    t.assertGreater(abs(expected - 0.1 / np.sqrt(0.05)), 0.1)  # the defaults' ratio is far from it


@key("train.grad_clip", studies=("knobs",))
def _(t, s, name):
    # ||exp_avg|| / (1 - b1) after step 1 is the clipped gradient's norm: clip * norm / (norm + 1e-6), the
    # step's norm (above the clip) from train_log.csv; each element is within 2 u.
    _, m, _, _ = checkpoint(knobs(s).out, "fp32", 1)
    norm = float(train_log(knobs(s).out, "fp32")[0]["grad_norm"])
    t.assertGreater(norm, 0.5)
    clipped = np.sqrt(sum(float((x**2).sum()) for x in m.values())) / 0.2
    t.assertAlmostEqual(clipped, 0.5 * norm / (norm + 1e-6), delta=0.5 * 4 * U32 + 1e-8)


@key("train.checkpoint_every", studies=("knobs",))
def _(t, s, name):
    steps = sorted(p.name for p in (knobs(s).out / "checkpoints" / "fp32").glob("step_*.h5"))
    t.assertEqual(steps, [f"step_{i:07d}.h5" for i in range(1, 7)])


@key("train.log_every", studies=("knobs",))
def _(t, s, name):
    # The step lines of a log (not a terminal): every log_every-th step, and every spike.
    printed = {int(m) for m in re.findall(r"^  fp32 step (\d+)/6 ", knobs(s).output, re.M)}
    spikes = {int(r["step"]) for r in train_log(knobs(s).out, "fp32") if r["spike"] == "1"}
    t.assertEqual(printed, {2, 4, 6} | spikes, knobs(s).output)
    t.assertTrue({2, 4, 6} - spikes, "every multiple of log_every is a spike: the default would print the same")


@key("train.shadow_attention", studies=("knobs",))
def _(t, s, name):
    rows = csv_rows(knobs(s).out / "variants" / "fp32" / "shadow.csv")
    t.assertEqual({(int(r["step"]), int(r["layer"])) for r in rows}, {(i, j) for i in range(1, 7) for j in range(3)})


@key("train.spike_window", "train.spike_threshold", studies=("knobs",))
def _(t, s, name):
    # spike: loss > threshold x the mean of the previous `window` losses (none before `window` steps).
    log = train_log(knobs(s).out, "fp32")
    losses = [float(r["loss"]) for r in log]
    expected = [int(i >= 2 and losses[i] > 1.0001 * sum(losses[i - 2 : i]) / 2) for i in range(len(losses))]
    t.assertEqual([int(r["spike"]) for r in log], expected)
    t.assertIn(1, expected, "no spike: the run no longer shows the rule")


@key("train.loss_scale", "train.loss_scale_window", studies=("knobs",))
def _(t, s, name):
    # fp16: the scale starts at loss_scale and doubles after every loss_scale_window finite steps.
    log = train_log(knobs(s).out, "fp16")
    scale, good, expected = 4.0, 0, []
    for row in log:
        expected.append(scale)
        if int(row["skipped"]):
            scale, good = scale / 2, 0
        else:
            good += 1
            if good >= 2:
                scale, good = scale * 2, 0
    t.assertEqual([float(r["loss_scale"]) for r in log], expected)


@key("train.ranks_per_variant", studies=("plans",))
def _(t, s, name):
    t.assertIn("ranks: 2 -> 1 group of 2 ranks", s["plans"]["ranks"].output)
    t.assertIn("ranks: 2 -> 2 groups of 1 rank", s["plans"]["base"].output)


@key("train.device", studies=("device",))
def _(t, s, name):
    refused_or_ran(t, s["device"][0])


def refused_or_ran(t, r):
    """A CPU-only LibTorch refuses CUDA before any work, naming the device asked for; a CUDA one trains."""
    if r.code == 2:
        t.assertIn('device = "cuda" needs a CUDA LibTorch', r.output)
    else:
        t.assertEqual(r.code, 0, r.output)
        t.assertIn("cuda", r.output.lower())


# -- [attention] policies ------------------------------------------------------------------------------

def policy_differs(t, out, policy, base, sweep, algorithms=("flash", "baseline")):
    """Some row of `policy` differs from `base`'s, in the sweep's every pass and format."""
    changed = [a for a in algorithms if errors(out, sweep=sweep, policy=policy, algorithm=a)
               != errors(out, sweep=sweep, policy=base, algorithm=a)]
    t.assertTrue(changed, f"policy {policy} gives {base}'s rows")
    return changed


@key(*(f"attention.policies.NAME.{step}" for step in STEPS), studies=("policies",))
def _(t, s, name):
    step = name.rsplit(".", 1)[1]
    policy_differs(t, s["policies"].out, f"x_{step}", "mixed" if step in ON_MIXED else "pure", "steps")


@key("attention.policies.NAME", studies=("policies",))
def _(t, s, name):
    # Each [attention.policies.NAME] is a policy the sweeps can name: its rows carry the name.
    t.assertLessEqual({f"x_{step}" for step in STEPS}, {r["policy"] for r in rows_of(s["policies"].out, sweep="steps")})


@key("attention.policies.NAME.flash", "attention.policies.NAME.baseline", studies=("policies",))
def _(t, s, name):
    kind = name.rsplit(".", 1)[1]
    t.assertEqual(policy_differs(t, s["policies"].out, f"x_{kind}", "pure", "steps"), [kind])


@key("attention.policies.NAME.preset", studies=("policies",))
def _(t, s, name):
    out = s["policies"].out
    for a in ("flash", "baseline"):
        t.assertEqual(errors(out, sweep="steps", policy="x_preset", algorithm=a),
                      errors(out, sweep="steps", policy="mixed", algorithm=a))
    policy_differs(t, out, "x_preset", "pure", "steps")


@key("attention.policies.NAME.rounding", studies=("policies",))
def _(t, s, name):
    out = s["policies"].out
    t.assertEqual({r["rounding"] for r in rows_of(out, sweep="steps", policy="x_rounding")}, {"zero"})
    policy_differs(t, out, "x_rounding", "pure", "steps")


@key("attention.policies.NAME.scale", studies=("policies",))
def _(t, s, name):
    t.assertEqual(policy_differs(t, s["policies"].out, "x_scale", "pure", "steps"), ["baseline"])


@key("attention.policies.NAME.quantization", "attention.policies.NAME.incoherent_processing", studies=("policies",))
def _(t, s, name):
    policy = "x_quantization" if name.endswith("quantization") else "x_incoherent"
    policy_differs(t, s["policies"].out, policy, "fa3", "fp8")


@key("attention.policies.NAME.max_offset", studies=("policies",))
def _(t, s, name):
    policy_differs(t, s["policies"].out, "x_max_offset", "eager", "max_offset")


# -- [microbench] -------------------------------------------------------------------------------------

def sweep_differs(t, out, sweep, against="base", column=None, value=None):
    if column:
        t.assertEqual({r[column] for r in rows_of(out, sweep=sweep)}, {str(value)})
    t.assertNotEqual(errors(out, sweep=sweep), errors(out, sweep=against), f"sweep {sweep} gives {against}'s errors")


MICROBENCH_COLUMNS = {"formats": ("format", "fp16"), "policies": ("policy", "mixed"), "roundings": ("rounding", "stochastic"),
                      "passes": ("pass", "backward"), "seq_lens": ("seq_len", 16), "head_dims": ("head_dim", 8),
                      "causal": ("causal", 1), "blocks": ("block_q", 2), "batch": (None, None), "heads": (None, None),
                      "seed": (None, None)}


@key(*(f"microbench.{k}" for k in MICROBENCH_COLUMNS), studies=("microbench",))
def _(t, s, name):
    k = name.split(".", 1)[1]
    sweep_differs(t, s["microbench"].out, k, "base", *MICROBENCH_COLUMNS[k])


@key("microbench.trials", studies=("microbench",))
def _(t, s, name):
    out = s["microbench"].out
    t.assertEqual({r["trial"] for r in rows_of(out, sweep="trials")}, {"0", "1"})
    t.assertNotEqual(errors(out, sweep="trials", trial=1), errors(out, sweep="trials", trial=0))


@key("microbench.loop_orders", studies=("microbench",))
def _(t, s, name):
    sweep_differs(t, s["microbench"].out, "loop_orders", "loop_orders_base", "loop_order", "q_outer")


@key("microbench.sram", studies=("microbench",))
def _(t, s, name):
    out = s["microbench"].out
    # M = 128, d = 4: B_c = ceil(M / 4d) = 8 (clipped to N = 8), B_r = min(B_c, d) = 4 (the paper's rule).
    t.assertEqual({(r["sram"], r["tile_rule"], r["block_q"], r["block_kv"]) for r in rows_of(out, sweep="sram")},
                  {("128", "paper", "4", "8")})
    sweep_differs(t, out, "sram", "base")


@key("microbench.tile_rules", studies=("microbench",))
def _(t, s, name):
    out = s["microbench"].out
    t.assertEqual({(r["tile_rule"], r["block_q"], r["block_kv"]) for r in rows_of(out, sweep="tile_rules")},
                  {("swapped", "8", "4")})
    sweep_differs(t, out, "tile_rules", "sram")


DISTRIBUTIONS = ["uniform", "outliers", "sink", "repeated_max"]


@key("microbench.distribution", studies=("microbench",))
def _(t, s, name):
    for d in DISTRIBUTIONS:
        sweep_differs(t, s["microbench"].out, d, "base", "distribution", d)


@key("microbench.distribution=captured", "microbench.captured_variant", "microbench.captured_step",
     "microbench.captured_layer", "microbench.captured_batch", studies=("knobs",))
def _(t, s, name):
    out = knobs(s).out
    rows = csv_rows(out / "microbench.csv")
    t.assertEqual({r["distribution"] for r in rows}, {"captured"})
    # The model's shape: seq_len 8, head dim d_model / heads = 4.
    t.assertEqual({(r["seq_len"], r["head_dim"]) for r in rows}, {("8", "4")})
    if name != "microbench.distribution=captured":
        sweep = {"captured_variant": "cap_variant", "captured_step": "cap_step", "captured_layer": "cap_layer",
                 "captured_batch": "cap_batch"}[name.split(".", 1)[1]]
        sweep_differs(t, out, sweep, "cap")


@key("microbench.outlier_fraction", "microbench.outlier_scale", studies=("microbench",))
def _(t, s, name):
    sweep_differs(t, s["microbench"].out, name.split(".", 1)[1], "outliers")


@key("microbench.sink_logit", studies=("microbench",))
def _(t, s, name):
    sweep_differs(t, s["microbench"].out, "sink_logit", "sink")


@key("microbench.repeated_keys", studies=("microbench",))
def _(t, s, name):
    sweep_differs(t, s["microbench"].out, "repeated_keys", "repeated_max")


@key("microbench.sweeps", studies=("microbench",))
def _(t, s, name):
    t.assertEqual({r["sweep"] for r in csv_rows(s["microbench"].out / "microbench.csv")}, set(MICROBENCH_SWEEPS))


@key("microbench.save_outputs", studies=("microbench", "policies"))
def _(t, s, name):
    with h5py.File(s["microbench"].out / "microbench_outputs.h5", "r") as f:
        t.assertGreater(len(f["points"]), 0)
    t.assertFalse((s["policies"].out / "microbench_outputs.h5").exists())


@key("microbench.devices", studies=("devices",))
def _(t, s, name):
    r = s["devices"]
    if r.code == 0:
        t.assertTrue(rows_of(r.out, algorithm="cuda_flash"))
    else:
        t.assertEqual(r.code, 2, r.output)
        t.assertIn("devices", r.output)


@key("microbench.framework", studies=("microbench",))
def _(t, s, name):
    rows = rows_of(s["microbench"].out, sweep="framework", algorithm="torch_baseline")
    t.assertTrue(rows)
    t.assertTrue(all(r["vs_reading"] != "-" for r in rows), rows)


@key("microbench.input_file", "microbench.distribution=file", studies=("input_file",))
def _(t, s, name):
    r, _ = s["input_file"]
    t.assertEqual(r.code, 0, r.output)
    rows = rows_of(r.out, sweep="file")
    # The file's shape replaces the sweep's (seq_len 16, head dim 4).
    t.assertEqual({(x["distribution"], x["seq_len"], x["head_dim"]) for x in rows}, {("file", "16", "4")})
    t.assertEqual({x["pass"] for x in rows}, {"forward", "backward"})


# -- [reduce], [import], [axes.NAME] ----------------------------------------------------------------------

def deviation(result):
    return csv_rows(result.out / "deviation.csv")


@key("reduce.steps", studies=("imported", "reduce_steps"))
def _(t, s, name):
    t.assertEqual({r["step"] for r in deviation(s["imported"])}, {"10", "20", "30"})
    t.assertEqual({r["step"] for r in deviation(s["reduce_steps"])}, {"20"})


@key("import.steps", studies=("imported_steps",))
def _(t, s, name):
    t.assertEqual({r["step"] for r in deviation(s["imported_steps"])}, {"10", "20"})


@key("import.path", studies=("imported",))
def _(t, s, name):
    listed = (s["imported"].out / "imported.csv").read_text()
    t.assertEqual(len(re.findall(r"/runs/[ab]-s[12]-[pq]/step_[123]0\.safetensors,", listed)), 24)


@key("import.strip_prefix", "import.rename", "import.exclude", studies=("imported",))
def _(t, s, name):
    tensors = {r["tensor"] for r in deviation(s["imported"])}
    t.assertEqual(tensors, {"model", "w.weight", "renamed.weight"})


@key("axes.NAME", "axes.NAME.role", "axes.NAME.baseline", studies=("imported",))
def _(t, s, name):
    axes = {r["axis"]: r for r in csv_rows(s["imported"].out / "axes.csv")}
    t.assertEqual((axes["impl"]["role"], axes["impl"]["baseline"]), ("optimisation", "b"))
    t.assertEqual(axes["order"]["role"], "setting")
    verdict = csv_rows(s["imported"].out / "verdict.csv")
    t.assertEqual({(r["axis"], r["baseline"], r["value"]) for r in verdict}, {("impl", "b", "a")})


@key("axes.NAME.replicate", studies=("imported", "not_replicate"))
def _(t, s, name):
    # A replicate is never part of a condition; without it the order's values split impl's conditions.
    conditions = {r["condition"] for r in csv_rows(s["imported"].out / "verdict.csv") if r["axis"] == "impl"}
    t.assertEqual(conditions, {"all"})
    split = {r["condition"] for r in csv_rows(s["not_replicate"].out / "verdict.csv") if r["axis"] == "impl"}
    t.assertEqual(split, {"order=p", "order=q"})


@key("reduce.metrics", "reduce.per_tensor", studies=("reduce_metrics",))
def _(t, s, name):
    rows = deviation(s["reduce_metrics"])
    if name == "reduce.metrics":
        t.assertIn("max_abs", rows[0])
        t.assertNotIn("mean_abs", rows[0])  # a default metric left out of the list is not written
    else:
        t.assertEqual({r["tensor"] for r in rows}, {"model"})


@key("reduce.whole_model", studies=("reduce_whole",))
def _(t, s, name):
    t.assertNotIn("model", {r["tensor"] for r in deviation(s["reduce_whole"])})


# -- command-line options -----------------------------------------------------------------------------

@option("* --help", studies=())
def _(t, s, name):
    for job in ("train", "plan"):
        r = fastudy(job, "--help")
        t.assertIn(f"options of `{job}`", r.output)
        t.assertIn("common options", r.output)


@option("* --version", studies=())
def _(t, s, name):
    t.assertRegex(fastudy("--version").output, r"fastudy \d+\.\d+\.\d+")


@option("readings --json", studies=())
def _(t, s, name):
    # The readings table as a reader sees it, then as the report's renderer reads it (analysis/report/readings.py).
    text = fastudy("readings").output
    for reading in ("pure", "eager", "fa2", "fa3", "mixed"):
        t.assertRegex(text, rf"(?m)^  {reading} +\S")
    t.assertIn("source: Dao-AILab/flash-attention csrc/flash_attn/src", text)
    t.assertIn("runs on: the CPU and the CUDA kernels", text)
    rows = json.loads(fastudy("readings", "--json").output)["readings"]
    t.assertEqual([r["name"] for r in rows], ["pure", "eager", "fa2", "fa3", "mixed"])
    t.assertEqual([r["name"] for r in rows if r["gpu_kernel"]], ["fa2", "fa3"])
    t.assertTrue(all(r["cuda"] for r in rows))
    t.assertEqual(rows[2]["report"], "the FlashAttention-2 CUDA kernel")
    bad = fastudy("readings", "--xml", expect=2)
    t.assertIn("`fastudy readings` takes no argument but --json (got '--xml')", bad.output)


@option("* --out", studies=("heads",))
def _(t, s, name):
    t.assertTrue((s["heads"].out / "checkpoints" / "fp32").is_dir())
    t.assertFalse(s.out("heads").exists(), "written to [study] out despite --out")


@option("* --resume", studies=("knobs",))
def _(t, s, name):
    refused, resumed = s["knobs"][1], s["knobs"][2]
    t.assertIn("--resume", refused.output)
    t.assertTrue((knobs(s).out / "microbench.csv").is_file())
    t.assertEqual(resumed.code, 0)


@option("* --force", studies=("small",))
def _(t, s, name):
    r = s["small"]
    t.assertEqual(r["refused"].code, 2)
    t.assertIn("--force", r["refused"].output)
    t.assertEqual(r["forced"].code, 0)
    t.assertEqual(sorted(p.name for p in (r["out"] / "checkpoints").iterdir()), ["s1", "s2", "s3"])


@option("* --quiet", studies=("small",))
def _(t, s, name):
    t.assertEqual(s["small"]["forced"].output.strip(), "")


@option("* --verbose", studies=("small",))
def _(t, s, name):
    t.assertIn("debug: reduce: rank 0 checked the files", s["small"]["allowed"].output)
    t.assertNotIn("debug:", s["small"]["missing"].output)


@option("train --variant", "run --variant", studies=("small",))
def _(t, s, name):
    r = s["small"]
    if name.startswith("train"):
        t.assertEqual(r["trained_one"], ["s2"])
        t.assertIn("train: 1 variants", r["one"].output)
    else:
        t.assertEqual(sorted(p.name for p in (r["run_out"] / "checkpoints").iterdir()), ["s3"])


@option("reduce --allow-missing", "run --allow-missing", studies=("small",))
def _(t, s, name):
    r = s["small"]
    refused, allowed = (r["missing"], r["allowed"]) if name.startswith("reduce") else (r["run_missing"], r["run_allowed"])
    t.assertIn("cannot reduce variant s3", refused.output)
    t.assertIn("--allow-missing", refused.output)
    t.assertIn("left out s3", allowed.output)
    t.assertEqual({(x["variant_a"], x["variant_b"]) for x in csv_rows(r["out"] / "deviation.csv")}, {("s1", "s2")})


@option("train --device", "run --device", studies=("device",))
def _(t, s, name):
    _, option_run, cpu = s["device"]
    refused_or_ran(t, option_run)
    t.assertEqual(checkpoint(s.out("device-cpu"), "s1", 1)[3]["device"], "cpu")


@option("plan --ranks", studies=("plans",))
def _(t, s, name):
    t.assertIn("ranks: 2 -> 2 groups of 1 rank", s["plans"]["base"].output)
    t.assertIn("ranks: 1 -> 1 group of 1 rank", s["plans"]["measured"].output)


OPTIONS["train --profile"] = Pointer("tests/cli/test_cli.cpp", "Cli, TrainProfilePrintsWhereTheStepsSpendTheirTime",
                                   "--profile")
OPTIONS["train --cuda-graph"] = Pointer("tests/cli/test_cli.cpp", "Cli, TrainProfilePrintsWhereTheStepsSpendTheirTime",
                                   "--cuda-graph")
OPTIONS["run --profile"] = Pointer("tests/cli/test_cli.cpp", "Cli, TrainProfilePrintsWhereTheStepsSpendTheirTime",
                                   "--profile")
OPTIONS["run --cuda-graph"] = Pointer("tests/cli/test_cli.cpp", "Cli, TrainProfilePrintsWhereTheStepsSpendTheirTime",
                                   "--cuda-graph")
OPTIONS["plan --gpus-per-node"] = Pointer("tests/cli/test_cli.cpp", "Cli, PlanShowsEachGroupsReducer", "--gpus-per-node 2")
OPTIONS["plan --ranks-per-node"] = Pointer("tests/cli/test_cli.cpp", "Cli, PlanShowsEachGroupsReducer", "--ranks-per-node 1")


@option("plan --measure-steps", studies=("plans",))
def _(t, s, name):
    t.assertIn("time estimate", s["plans"]["measured"].output)
    t.assertNotRegex(s["plans"]["base"].output, r"time estimate: [0-9]")


@option("advise --target-ulps", studies=("advise",))
def _(t, s, name):
    plain, strict = s["advise"]
    t.assertNotEqual(csv_rows(s.out("advise") / "advice.csv"), csv_rows(s.out("advise-strict") / "advice.csv"))
    t.assertIn("0.001", strict.output)


@option("replay --variant", "replay --from", "replay --steps", "replay --set", studies=("replay",))
def _(t, s, name):
    (r, variant) = s["replay"]
    folder = r.out / "replays" / f"{variant}-from1+attention=baseline"
    rows = csv_rows(folder / "replay.csv")
    t.assertEqual([int(x["step"]) for x in rows], [2])  # from step 1, one step
    t.assertGreater(float(rows[0]["max_abs"]), 0.0)  # the attention changed: other weights at step 2


@option("bisect --variant", "bisect --against", "bisect --step", studies=("bisect",))
def _(t, s, name):
    r, a, b = s["bisect"]
    t.assertTrue((r.out / "bisect" / f"{a}--{b}-step1.csv").is_file(), r.output)
    t.assertIn("attn.out", r.output)


SLURM_LINES = {"slurm --nodes": "#SBATCH --nodes=3", "slurm --ntasks-per-node": "#SBATCH --ntasks-per-node=5",
               "slurm --gpus-per-node": "#SBATCH --gpus-per-node=2", "slurm --cpus-per-task": "#SBATCH --cpus-per-task=4",
               "slurm --time": "#SBATCH --time=02:03:04", "slurm --partition": "#SBATCH --partition=pz",
               "slurm --account": "#SBATCH --account=acct", "slurm --launcher": "mpirun"}


@option(*SLURM_LINES, studies=("slurm",))
def _(t, s, name):
    t.assertIn(SLURM_LINES[name], s["slurm"][1])


@option("slurm --submit", studies=("slurm",))
def _(t, s, name):
    _, _, submitted, args = s["slurm"]
    t.assertIn(str(s.out("slurm-submit") / "fastudy.sbatch"), args)
    t.assertIn("42", submitted.output)


# -- environment variables (docs/build.md) --------------------------------------------------------------

@rows(ENVIRONMENT, "FASTUDY_TORCH_THREADS", studies=("knobs", "small"))
def _(t, s, name):
    t.assertIn("2 LibTorch thread(s) on rank 0", knobs(s).output)
    t.assertIn("1 LibTorch thread(s) on rank 0", s["small"]["one"].output)


ENVIRONMENT["FASTUDY_HUGEPAGES"] = Pointer("tests/cli/test_cli.cpp",
                                           "Hugepages, TheProcessReexecutesWithTheTunableAndGetsHugePages",
                                           "FASTUDY_HUGEPAGES=0")
ENVIRONMENT["FASTUDY_STOP_GRACE_S"] = Pointer("tests/cli/test_reliability_signals.cpp",
                                              "Signals, GracePeriodAfterTheFirstSigtermEndsAHungJob",
                                              "FASTUDY_STOP_GRACE_S")


# ---------------------------------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------------------------------

def pending_branch(name):
    return PENDING.get(name)


def pointer_holds(p):
    """The test exists in its file and its body (up to the next TEST) names the key."""
    text = (ROOT / p.file).read_text()
    m = re.search(r"^TEST(?:_F)?\(" + re.escape(p.test) + r"\) \{$", text, re.M)
    if not m:
        return f"{p.file} has no TEST({p.test})"
    body = re.split(r"^TEST(?:_F)?\(", text[m.end():], maxsplit=1, flags=re.M)[0]
    return None if p.mention in body else f"TEST({p.test}) in {p.file} does not name {p.mention}"


STUDIES = None


def setUpModule():
    global STUDIES
    STUDIES = Studies(tempfile.mkdtemp(prefix="fastudy-keys-test-"))
    needed = sorted({study for table in (KEYS, OPTIONS, ENVIRONMENT) for name, row in table.items()
                     if isinstance(row, Check) and not pending_branch(name) for study in row.studies})
    # Two at a time (ctest runs this beside other tests on 2 cores); a failure shows in the rows that read it.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        concurrent.futures.wait([pool.submit(STUDIES.__getitem__, n) for n in needed])


def tearDownModule():
    shutil.rmtree(STUDIES.root, ignore_errors=True)


class DocumentedKeysTest(unittest.TestCase):
    maxDiff = None

    def test_every_documented_key_has_a_row(self):
        missing = documented_keys() - KEYS.keys() - {k.split("=")[0] for k in KEYS}
        self.assertEqual(missing, set(), "documented keys without a row in this table")

    def test_every_row_is_a_documented_key(self):
        documented = documented_keys()
        stale = {k for k in KEYS if k.split("=")[0] not in documented}
        self.assertEqual(stale, set(), "rows for keys the docs do not list")

    def test_every_documented_option_has_a_row(self):
        helps = jobs_and_help()
        documented = help_options(helps) | docs_options(set(helps))
        self.assertEqual(documented - OPTIONS.keys(), set(), "documented options without a row")
        self.assertEqual(OPTIONS.keys() - documented, set(), "rows for options no --help or page lists")

    def test_every_documented_environment_variable_has_a_row(self):
        self.assertEqual(documented_environment(), ENVIRONMENT.keys())

    def test_pending_keys_have_rows(self):
        self.assertEqual(PENDING.keys() - KEYS.keys(), set())


def add_row_tests(table, prefix):
    for name, row in table.items():
        def test(self, name=name, row=row):
            branch = pending_branch(name)
            if branch:
                self.skipTest(f"pending: connected by branch {branch}")
            if isinstance(row, Pointer):
                self.assertIsNone(pointer_holds(row))
                return
            row.fn(self, STUDIES, name)
        setattr(DocumentedKeysTest, f"test_{prefix}_{re.sub(r'[^a-zA-Z0-9]+', '_', name).strip('_')}", test)


add_row_tests(KEYS, "key")
add_row_tests(OPTIONS, "option")
add_row_tests(ENVIRONMENT, "env")

if __name__ == "__main__":
    unittest.main()
