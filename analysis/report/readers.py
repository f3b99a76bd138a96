"""Readers of a study's outputs: the only place that knows file names and column layouts.

Every phase writes CSV files that open with "# key: value" provenance lines (the first is
"# fastudy VERSION (git SHA)"); ranking.csv ends with "# note: ..." lines. The report reads only
these outputs (and deviation.h5 for the pairwise matrices), never the checkpoints. A file that is
missing gives None; a file that cannot be parsed is recorded in StudyData.problems so the report
can say so instead of failing as a whole.

Layout of OUT (see jobs/*.cpp):
  study.toml, provenance.txt                       resolved config, provenance of the last phase
  variants.csv                                     variant,hash,<one column per axis>: the grid's variants
  status.csv                                       variant,state,step,loss,wall_time_s,reason
  variants/<id>/train_log.csv, shadow.csv          per-step training log, shadow attention log
  microbench.csv                                   one row per point and algorithm
  deviation.h5 (/steps/<step>/<t>/<metric>)         V x V matrices of tensor t (its index; its name in the
                                                   group's attribute `name`); deviation.csv the same as rows
  axes.csv                                         each axis's role, baseline, replicate flag, values
  ranking.csv, verdict.csv, twins.csv              deviation sources per condition and pooled, the
                                                   verdict per optimisation/condition/reference, fp64 twins
"""

import csv
import io
import itertools
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MICROBENCH_FLOATS = ("max_abs", "mean_abs", "std_abs", "rel_l2", "rescales_per_row")
MICROBENCH_INTS = ("seq_len", "head_dim", "block_q", "block_kv", "causal", "trial", "tiles_kv")
# Columns added later (issue 12), with the value an older microbench.csv without them stands for.
MICROBENCH_OPTIONAL = {"rounding": "nearest", "sram": 0, "tile_rule": "blocks", "rmse": float("nan"),
                       "mean_signed": float("nan"), "max_ulp": float("nan"), "repeated_max_rows": float("nan"),
                       # issue 13: the CUDA rows' check against the CPU kernels ("-" on every other row)
                       "check": "-", "vs_cpu": 0.0, "check_bound": 0.0,
                       # issue 26: real code against the reading that claims to model it ("-" elsewhere)
                       "vs_reading": "-", "bit_identical": 0.0, "max_ulp_vs": 0.0}
RANKING_FLOATS = ("w1_mean", "w1_min", "w1_max", "max_abs_mean", "slope")
RANKING_INTS = ("pairs", "independent", "step")
VERDICT_FLOATS = ("w1", "reference_w1", "end_ratio", "end_lo", "end_hi", "slope", "reference_slope", "slope_ratio",
                  "slope_lo", "slope_hi", "noise_w1")
VERDICT_INTS = ("pairs", "independent", "reference_pairs", "reference_independent", "step", "informative")
REPORTED_METRICS = ("w1", "max_abs")  # the metrics the report shows (read only these from deviation.h5)
MODEL_TENSOR = "model"  # the whole-model pseudo-tensor of deviation.h5/.csv


@dataclass
class CsvTable:
    """A CSV output: provenance lines, trailing notes, the header and the rows (strings)."""
    path: Path
    provenance: dict
    notes: list
    columns: list
    rows: list


@dataclass
class TrainLog:
    """One variant's train_log.csv as numpy columns (step, loss, grad_norm, lr, loss_scale,
    skipped, spike, tokens_per_s)."""
    columns: dict


@dataclass
class Deviation:
    """Pairwise matrices: matrices[step][tensor][metric] is a V x V array over `variants` (metrics:
    REPORTED_METRICS)."""
    variants: list
    variant_axes: dict  # id -> [(axis, value)] in grid order
    steps: list
    tensors: list
    matrices: dict
    left_out: list
    provenance: dict
    source: str  # "deviation.h5" or "deviation.csv"


@dataclass
class AxisInfo:
    """One grid axis as reduce saw it (axes.csv): its role in the verdict (optimisation, reference, setting,
    noise), its baseline value, whether it is a replicate (seed-like) axis, and its values in grid order."""
    name: str
    role: str
    baseline: str
    replicate: bool
    values: list


@dataclass
class StudyData:
    out_dir: Path
    config: dict = None
    config_text: str = None
    provenance: dict = field(default_factory=dict)
    status: CsvTable = None
    train_logs: dict = field(default_factory=dict)
    shadow: dict = field(default_factory=dict)
    microbench: CsvTable = None
    deviation: Deviation = None
    ranking: CsvTable = None
    verdict: CsvTable = None
    axes: list = None  # [AxisInfo] from axes.csv, grid order; None for outputs of an older reduce
    variants: CsvTable = None  # variants.csv: every variant's value of every axis (None: older outputs)
    twins: CsvTable = None
    advice: CsvTable = None  # advice.csv (fastudy advise)
    replays: dict = field(default_factory=dict)  # replays/<name>/replay.csv by name (fastudy replay)
    bisects: dict = field(default_factory=dict)  # bisect/<name>.csv by name (fastudy bisect)
    problems: list = field(default_factory=list)

    def grid(self):
        """[(axis, [values as text])] in grid order: from axes.csv (reduce), else variants.csv (every
        phase; values in order of first appearance), else study.toml's [grid] (outputs of an older
        fastudy, whose grids were cross products)."""
        if self.axes:
            return [(a.name, list(a.values)) for a in self.axes]
        if self.variants and self.variants.columns:
            out = []
            for axis in self.variants.columns[2:]:
                values = []
                for r in self.variants.rows:
                    if r[axis] not in values:
                        values.append(r[axis])
                out.append((axis, values))
            return out
        if not self.config:
            return []
        return [(axis, [value_text(v) for v in values]) for axis, values in self.config.get("grid", {}).items()
                if axis != "vary"]

    def planned(self, phase):
        """Whether [study] phases includes `phase` (True when the config is unknown)."""
        if not self.config:
            return True
        return phase in self.config.get("study", {}).get("phases", [phase])

    def variant_axes(self):
        """id -> [(axis, value)]: variants.csv (written with study.toml by every phase); for older
        outputs deviation.h5's record when present, else the grid's cross product."""
        if self.variants and self.variants.columns:
            axes = self.variants.columns[2:]
            return {r["variant"]: [(a, r[a]) for a in axes] for r in self.variants.rows}
        if self.deviation and self.deviation.variant_axes:
            expanded = expand_grid(self.grid())
            expanded.update(self.deviation.variant_axes)
            return expanded
        return expand_grid(self.grid())


def value_text(v):
    """An axis value as the C++ side writes it (shortest round-trip text for floats)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


_ID_PREFIX = {"seed": "s", "data_seed": "d", "block_q": "bq", "block_kv": "bkv", "lr": "lr"}


def expand_grid(grid):
    """Variant ids and axes of the grid, first axis slowest (expand_variants, src/core/grid.cpp)."""
    if not grid:
        return {}
    out = {}
    for combo in itertools.product(*[values for _, values in grid]):
        axes = [(axis, value) for (axis, _), value in zip(grid, combo)]
        vid = "-".join(_ID_PREFIX.get(axis, "") + value for axis, value in axes)
        out[vid] = axes
    return out


def parse_provenance_lines(lines):
    prov, notes = {}, []
    for line in lines:
        body = line[1:].strip()
        if body.startswith("note:"):
            notes.append(body[len("note:"):].strip())
            continue
        m = re.match(r"fastudy (\S+) \(git (\S+)\)$", body)
        if m:
            prov["version"], prov["git"] = m.group(1), m.group(2)
        elif ":" in body:
            key, value = body.split(":", 1)
            prov[key.strip()] = value.strip()
    return prov, notes


def read_csv_table(path):
    """A CSV output with '#' provenance lines (any position) or None when the file is missing."""
    path = Path(path)
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    # Lines end at "\n" only (fastudy's CSV lines are one line each; str.splitlines would also split
    # at characters such as U+2028 or U+0085 that a quoted field may hold).
    lines = [l[:-1] if l.endswith("\r") else l for l in text.split("\n")]
    comments = [l for l in lines if l.startswith("#")]
    body = "\n".join(l for l in lines if l and not l.startswith("#"))
    prov, notes = parse_provenance_lines(comments)
    reader = csv.reader(io.StringIO(body))
    header = next(reader, None)
    if header is None:
        return CsvTable(path, prov, notes, [], [])
    rows = []
    for i, r in enumerate(reader):
        if len(r) != len(header):
            raise ValueError(f"{path}: data row {i + 1} has {len(r)} fields, the header has {len(header)}")
        rows.append(dict(zip(header, r)))
    return CsvTable(path, prov, notes, header, rows)


def to_float(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return math.nan


def read_train_log(path):
    table = read_csv_table(path)
    if table is None or not table.rows:
        return None
    cols = {c: np.array([to_float(r[c]) for r in table.rows]) for c in table.columns}
    return TrainLog(cols)


def read_deviation_h5(path, problems):
    try:
        import h5py
    except ImportError:
        problems.append("h5py is not installed: deviation.h5 was not read (apt-get install python3-h5py)")
        return None
    with h5py.File(path, "r") as f:
        attrs = {k: _text(v) for k, v in f.attrs.items()}
        variants = [v for v in attrs.get("variants", "").split("\n") if v]
        variant_axes = {}
        for vid, line in zip(variants, attrs.get("variant_axes", "").split("\n")):
            variant_axes[vid] = [tuple(kv.split("=", 1)) for kv in line.split(",") if "=" in kv]
        matrices, steps, tensors = {}, [], []
        for step_name, g in f["steps"].items():
            step = int(g.attrs.get("step", step_name))
            steps.append(step)
            matrices[step] = {}
            # fastudy-deviation/2: a tensor's group is named by its index, its name an attribute (a name
            # from another program's checkpoint may hold '/'); /1 named the groups by the tensors.
            groups = sorted(g.items(), key=lambda kv: int(kv[0]) if "name" in kv[1].attrs else 0)
            for key, tg in groups:
                tensor = _text(tg.attrs["name"]) if "name" in tg.attrs else key
                if tensor not in tensors:
                    tensors.append(tensor)
                matrices[step][tensor] = {m: np.array(tg[m]) for m in tg.keys() if m in REPORTED_METRICS}
    steps.sort()
    prov, _ = parse_provenance_lines(attrs.get("provenance", "").split("\n"))
    left_out = [l for l in attrs.get("left_out", "").split("\n") if l]
    return Deviation(variants, variant_axes, steps, tensors, matrices, left_out, prov, "deviation.h5")


def read_deviation_csv(path):
    table = read_csv_table(path)
    if table is None or not table.rows:
        return None
    variants = []
    for r in table.rows:
        for v in (r["variant_a"], r["variant_b"]):
            if v not in variants:
                variants.append(v)
    index = {v: i for i, v in enumerate(variants)}
    n = len(variants)
    matrices, tensors = {}, []
    for r in table.rows:
        step, tensor = int(r["step"]), r["tensor"]
        if tensor not in tensors:
            tensors.append(tensor)
        per = matrices.setdefault(step, {}).setdefault(tensor, {})
        i, j = index[r["variant_a"]], index[r["variant_b"]]
        for m in REPORTED_METRICS:
            if m in r:
                mat = per.setdefault(m, np.full((n, n), np.nan))
                mat[i, j] = mat[j, i] = to_float(r[m])
    return Deviation(variants, {}, sorted(matrices), tensors, matrices, [], table.provenance, "deviation.csv")


def read_axes(path):
    table = read_csv_table(path)
    if table is None:
        return None
    return [AxisInfo(r["axis"], r["role"], r["baseline"], r["replicate"] == "1", r["values"].split(";"))
            for r in table.rows]


def typed_rows(table, floats, ints):
    """The rows of a CsvTable with the named columns parsed (floats: '' -> NaN)."""
    rows = []
    for r in table.rows:
        row = dict(r)
        for c in floats:
            row[c] = float(r[c]) if r.get(c, "") != "" else math.nan
        for c in ints:
            row[c] = int(r[c])
        rows.append(row)
    return rows


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def _guard(problems, what, fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # a broken file must not sink the whole report
        problems.append(f"{what} could not be read: {e}")
        return None


def load_study(out_dir):
    """Everything the report needs from OUT; missing files stay None."""
    out = Path(out_dir)
    data = StudyData(out_dir=out)
    p = data.problems
    toml_path = out / "study.toml"
    if toml_path.is_file():
        data.config_text = toml_path.read_text(encoding="utf-8", errors="replace")
        data.config = _guard(p, "study.toml", tomllib.loads, data.config_text)
    prov_path = out / "provenance.txt"
    if prov_path.is_file():
        data.provenance, _ = parse_provenance_lines(
            [l for l in prov_path.read_text(errors="replace").split("\n") if l.startswith("#")])
    data.variants = _guard(p, "variants.csv", read_csv_table, out / "variants.csv")
    data.status = _guard(p, "status.csv", read_csv_table, out / "status.csv")
    data.microbench = _guard(p, "microbench.csv", read_csv_table, out / "microbench.csv")
    data.ranking = _guard(p, "ranking.csv", read_csv_table, out / "ranking.csv")
    data.verdict = _guard(p, "verdict.csv", read_csv_table, out / "verdict.csv")
    data.axes = _guard(p, "axes.csv", read_axes, out / "axes.csv")
    data.twins = _guard(p, "twins.csv", read_csv_table, out / "twins.csv")
    if (out / "deviation.h5").is_file():
        data.deviation = _guard(p, "deviation.h5", read_deviation_h5, out / "deviation.h5", p)
    if data.deviation is None and (out / "deviation.csv").is_file():
        data.deviation = _guard(p, "deviation.csv", read_deviation_csv, out / "deviation.csv")
    data.advice = _guard(p, "advice.csv", read_csv_table, out / "advice.csv")
    if (out / "replays").is_dir():
        for d in sorted((out / "replays").iterdir()):
            table = _guard(p, f"replays/{d.name}/replay.csv", read_csv_table, d / "replay.csv")
            if table is not None and table.rows:
                data.replays[d.name] = table
    if (out / "bisect").is_dir():
        for f in sorted((out / "bisect").glob("*.csv")):
            table = _guard(p, f"bisect/{f.name}", read_csv_table, f)
            if table is not None and table.rows:
                data.bisects[f.stem] = table
    variants_dir = out / "variants"
    if variants_dir.is_dir():
        for d in sorted(variants_dir.iterdir()):
            log = _guard(p, f"variants/{d.name}/train_log.csv", read_train_log, d / "train_log.csv")
            if log is not None:
                data.train_logs[d.name] = log
            shadow = _guard(p, f"variants/{d.name}/shadow.csv", read_csv_table, d / "shadow.csv")
            if shadow is not None and shadow.rows:
                data.shadow[d.name] = shadow
    return data
