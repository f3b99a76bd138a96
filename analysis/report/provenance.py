"""Section 5, provenance, and the study's state in words (which phases ran, what is missing).

Provenance comes from the "# key: value" header every output file carries (version, git SHA,
command, config hash, ranks, hosts, start time), from status.csv (training wall time, failed and
diverged variants), from deviation.h5 (variants left out) and from study.toml (grid, resolved config).
"""

import math
import platform

import matplotlib
import numpy as np

from .doc import Bullets, Pre, Section, Table, num, text

PROVENANCE_FIELDS = ("version", "git", "command", "config_hash", "ranks", "hosts", "started")


def phase_state(data):
    """Bullets: what each phase left in OUT, and what is missing (with the command that makes it)."""
    items = []
    grid_size = len(data.variant_axes())
    if data.microbench and data.microbench.rows:
        items.append(f"microbench: done ({len(data.microbench.rows)} rows in microbench.csv)")
    elif not data.planned("microbench"):
        items.append("microbench: not part of this study ([study] phases)")
    else:
        items.append("microbench: not run (no microbench.csv)")
    status = data.status.rows if data.status else []
    if status:
        counts = {}
        for r in status:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        total = max(grid_size, len(status))
        parts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        done = counts.get("done", 0)
        line = f"train: {done} of {total} variants done ({parts})"
        unfinished = counts.get("queued", 0) + counts.get("running", 0) + max(0, grid_size - len(status))
        if unfinished:
            line += (f"; training is incomplete ({unfinished} variants not finished), so deviation numbers cover only "
                     "the variants and checkpoints that existed when reduce ran")
        items.append(line)
    elif data.train_logs:
        items.append(f"train: {len(data.train_logs)} variants have a train_log.csv but status.csv is missing")
    elif not data.planned("train"):
        items.append("train: not part of this study ([study] phases)")
    else:
        items.append("train: not run (no status.csv)")
    if data.ranking and data.ranking.rows:
        steps = sorted({int(r["step"]) for r in data.ranking.rows})
        items.append(f"reduce: done (ranking.csv at steps {', '.join(map(str, steps))})")
    elif data.ranking and data.deviation and data.deviation.steps:
        items.append(f"reduce: done (deviation.h5 at steps {', '.join(map(str, data.deviation.steps))}; no ranking: "
                     f"{'; '.join(data.ranking.notes) or 'ranking.csv has no rows'})")
    elif status or data.train_logs:
        items.append("reduce: not run (no ranking.csv, deviation.h5): run `fastudy reduce OUT` for the weight "
                     "deviation and the verdict")
    elif not data.planned("reduce"):
        items.append("reduce: not part of this study ([study] phases)")
    else:
        items.append("reduce: not run (needs training first)")
    for p in data.problems:
        items.append(f"problem: {p}")
    return items


def file_provenance(data):
    """(file, provenance dict) for every output that records one."""
    out = []
    for name, table in (("microbench.csv", data.microbench), ("ranking.csv", data.ranking)):
        if table is not None and table.provenance:
            out.append((name, table.provenance))
    if data.deviation is not None and data.deviation.provenance:
        out.append((data.deviation.source, data.deviation.provenance))
    if data.provenance:
        out.append(("provenance.txt (last phase started)", data.provenance))
    return out


def build(data):
    sec = Section("5. Provenance", "provenance")
    files = file_provenance(data)
    if files:
        rows = [[name] + [p.get(k, "") for k in PROVENANCE_FIELDS] for name, p in files]
        sec.blocks.append(Table(["file"] + list(PROVENANCE_FIELDS), rows,
                                caption="Provenance recorded by each phase (the '#' header of its output)"))
        shas = {p.get("git") for _, p in files if p.get("git")}
        if len(shas) > 1:
            sec.blocks.append(text("The phases ran with different fastudy builds (git " + ", ".join(sorted(shas)) +
                                   "): results of different builds are mixed in this study.", kind="note"))
        hashes = {p.get("config_hash") for _, p in files if p.get("config_hash")}
        if len(hashes) > 1:
            sec.blocks.append(text("The outputs were written for different configurations (config hashes " +
                                   ", ".join(sorted(hashes)) + "): some files are stale; rerun the phases with "
                                   "--resume or --force.", kind="bad"))
    else:
        sec.blocks.append(text("No output carries a provenance header yet.", kind="missing"))

    grid = data.grid()
    if grid:
        n = int(np.prod([len(v) for _, v in grid]))
        sec.blocks.append(Table(["axis", "values", "count"], [[a, ", ".join(v), str(len(v))] for a, v in grid],
                                caption=f"Grid: {n} variants (cross product, first axis slowest)"))

    sec.blocks += wall_time(data)
    sec.blocks += left_out(data)
    if data.config_text:
        sec.blocks.append(Pre(data.config_text, "Resolved configuration (study.toml)"))
    else:
        sec.blocks.append(text("study.toml is missing: the resolved configuration is unknown.", kind="missing"))
    sec.blocks.append(text(f"Report rendered by analysis/report with Python {platform.python_version()}, "
                           f"matplotlib {matplotlib.__version__}, numpy {np.__version__}, from the files in "
                           f"{data.out_dir.resolve()} only.", kind="note"))
    return sec


def wall_time(data):
    rows = data.status.rows if data.status else []
    times = [float(r["wall_time_s"]) for r in rows if r.get("wall_time_s")]
    times = [t for t in times if not math.isnan(t)]
    if not times:
        return []
    return [text("Wall time: training took ", duration(sum(times)), " summed over variants (longest variant ",
                 duration(max(times)), "; a resumed variant counts its last run only). The microbenchmark and reduce "
                 "phases do not record their duration; their start times are in the table above.")]


def duration(seconds):
    """'0.38 s', '291 s', '21.5 min (1290 s)', '2.1 h (7560 s)'."""
    if seconds < 600:
        return num(seconds, suffix=" s")
    if seconds < 3 * 3600:
        return num(seconds / 60, suffix=f" min ({seconds:.0f} s)")
    return num(seconds / 3600, suffix=f" h ({seconds:.0f} s)")


def left_out(data):
    items = []
    for r in (data.status.rows if data.status else []):
        if r["state"] != "done":
            reason = f": {r['reason']}" if r.get("reason") else ""
            items.append(f"{r['variant']} is {r['state']} at step {r.get('step', '?')}{reason}")
    if data.deviation is not None:
        items += [f"left out of reduce: {l}" for l in data.deviation.left_out]
    grid_ids = set(data.variant_axes())
    if data.status is not None and grid_ids:
        missing = sorted(grid_ids - {r["variant"] for r in data.status.rows})
        items += [f"{v} has no status row (never scheduled)" for v in missing]
    if not items and data.status is not None and data.deviation is not None:
        return [text("Every variant of the grid trained to the end and was reduced.")]
    if not items:
        return []
    return [text("Variants that failed, diverged, are unfinished or were left out:"), Bullets(items)]
