"""Section 4, weight deviation (the paper's Section V): how far apart the variants' weights drifted.

  - the pairwise whole-model W1 heatmap at the final checkpoint, variants ordered by the grid's axes
    (first axis outermost), log colour scale;
  - W1 and max |dW| against training step per source (paper Fig. 7/8): a source is a grid axis, its
    pairs are the variant pairs that differ in that axis only (as in analysis/ranking.hpp); line =
    mean over the pairs, band = min..max;
  - per tensor at the final step, the mean W1 and max |dW| of each source: where the deviation
    concentrates;
  - each variant's distance to its fp64 twin (twins.csv) when the grid has fp64.
"""

import math

import numpy as np
from matplotlib.colors import LogNorm

from .doc import Section, Table, num, text
from .figures import COLOURS
from .readers import MODEL_TENSOR
from .verdict import ATTENTION

MAX_TENSOR_ROWS = 20  # the per-tensor table shows the tensors with the most deviation


def build(data, figs):
    sec = Section("4. Weight deviation", "deviation")
    dev = data.deviation
    if (dev is None or not dev.steps) and not data.planned("reduce"):
        sec.blocks.append(text("Weight deviation is not part of this study ([study] phases).", kind="note"))
        return sec
    if dev is None or not dev.steps:
        sec.blocks.append(text("No weight deviation yet: the reduce phase has not run (deviation.h5 and deviation.csv "
                               "are missing). Run `fastudy reduce OUT` after training.", kind="missing"))
        return sec
    grid = data.grid()
    axes_of = data.variant_axes()
    order = ordered_variants(dev.variants, grid, axes_of)
    sources = source_pairs(dev.variants, grid, axes_of)
    sec.blocks.append(text(
        f"From {dev.source}: {len(dev.variants)} variants, checkpoints at steps {', '.join(map(str, dev.steps))}, "
        f"{len(dev.tensors) - (MODEL_TENSOR in dev.tensors)} tensors plus the whole model (every parameter "
        "flattened into one distribution). W1 is the 1-D Wasserstein distance between the two weight distributions "
        "(scipy.stats.wasserstein_distance); max |dW| the largest elementwise difference of the weights."))
    if dev.left_out:
        sec.blocks.append(text("Left out of the reduction: " + "; ".join(dev.left_out), kind="missing"))
    sec.blocks.append(heatmap(dev, order, axes_of, grid, figs))
    if sources:
        sec.blocks.append(over_steps(dev, sources, figs))
        sec.blocks.append(tensor_table(dev, sources))
    else:
        sec.blocks.append(text("No pair of variants differs in exactly one axis, so no source can be measured.",
                               kind="missing"))
    sec.blocks += twins_table(data)
    return sec


def ordered_variants(variants, grid, axes_of):
    """Variants sorted by their axis values in grid order (values in the grid's order)."""
    def key(vid):
        d = dict(axes_of.get(vid, []))
        return tuple(vals.index(d[a]) if d.get(a) in vals else len(vals) for a, vals in grid) + (vid,)
    return sorted(variants, key=key)


def source_pairs(variants, grid, axes_of):
    """axis -> [(i, j)] index pairs into `variants` that differ in that axis only."""
    out = {}
    for axis, _ in grid:
        pairs = []
        for i in range(len(variants)):
            for j in range(i + 1, len(variants)):
                a, b = dict(axes_of.get(variants[i], [])), dict(axes_of.get(variants[j], []))
                if not a or not b:
                    continue
                diff = [k for k in a if a.get(k) != b.get(k)]
                if diff == [axis]:
                    pairs.append((i, j))
        if pairs:
            out[axis] = pairs
    return out


def pair_stats(matrix, pairs):
    vals = np.array([matrix[i, j] for i, j in pairs], dtype=float)
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return math.nan, math.nan, math.nan, 0
    return float(vals.mean()), float(vals.min()), float(vals.max()), len(vals)


def heatmap(dev, order, axes_of, grid, figs):
    step = dev.steps[-1]
    m = dev.matrices[step][MODEL_TENSOR]["w1"]
    idx = [dev.variants.index(v) for v in order]
    sub = m[np.ix_(idx, idx)].astype(float)
    np.fill_diagonal(sub, np.nan)
    positive = sub[np.isfinite(sub) & (sub > 0)]
    n = len(order)
    size = min(max(5.0, 0.55 * n + 3), 13)
    fig, axes = figs.new(width=size + 1.2, height=size)
    ax = axes[0][0]
    norm = LogNorm(vmin=positive.min(), vmax=positive.max()) if len(positive) else None
    masked = np.ma.masked_where(~(np.isfinite(sub) & (sub > 0)), sub)
    im = ax.imshow(masked, cmap="viridis", norm=norm)
    ax.set_xticks(range(n), order, rotation=60, ha="right", fontsize=8 if n > 12 else 10)
    ax.set_yticks(range(n), order, fontsize=8 if n > 12 else 10)
    ax.grid(False)
    if n <= 12:
        for i in range(n):
            for j in range(n):
                if np.isfinite(sub[i, j]):
                    bright = norm is not None and sub[i, j] > 0 and norm(sub[i, j]) > 0.6
                    ax.text(j, i, f"{sub[i, j]:.2g}", ha="center", va="center", fontsize=7,
                            color="black" if bright else "white")
    first_axis = grid[0][0] if grid else None
    first = [dict(axes_of.get(v, [])).get(first_axis) for v in order]
    for k in range(1, n):
        if first[k] != first[k - 1]:
            ax.axhline(k - 0.5, color="white", lw=2)
            ax.axvline(k - 0.5, color="white", lw=2)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="whole-model W1 (weight units)")
    ax.set_title(f"pairwise whole-model W1 at step {step}")
    caption = (f"Whole-model W1 between every pair of variants at the final checkpoint (step {step}), variants "
               "ordered by the grid's axes (white lines separate the first axis's values); log colour scale, "
               "diagonal and missing pairs blank.")
    return figs.save(fig, "deviation_heatmap", caption)


def over_steps(dev, sources, figs):
    fig, axes = figs.new(ncols=2, width=12.5, height=4.4)
    for si, (axis, pairs) in enumerate(sources.items()):
        colour = COLOURS[si % len(COLOURS)]
        for ax, metric in ((axes[0][0], "w1"), (axes[0][1], "max_abs")):
            stats = [pair_stats(dev.matrices[s][MODEL_TENSOR][metric], pairs) for s in dev.steps]
            mean = np.array([s[0] for s in stats])
            lo = np.array([s[1] for s in stats])
            hi = np.array([s[2] for s in stats])
            style = "o-" if axis == ATTENTION else "s--"
            ax.plot(dev.steps, mean, style, color=colour, label=f"{axis} ({len(pairs)} pairs)",
                    lw=2.2 if axis == ATTENTION else 1.4)
            ax.fill_between(dev.steps, lo, hi, color=colour, alpha=0.15)
    for ax, what in ((axes[0][0], "whole-model W1 (weight units)"), (axes[0][1], "whole-model max |dW| (weight units)")):
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_ylabel(what)
        ax.legend()
    axes[0][0].set_title("(a) Wasserstein-1 distance (paper Fig. 8)")
    axes[0][1].set_title("(b) max weight difference (paper Fig. 7)")
    caption = ("Deviation per source against training step: for each grid axis, the pairs of variants that differ "
               "in that axis only; line = mean over the pairs, band = min–max. The attention axis (the optimisation) "
               "is the thick line; log scale.")
    return figs.save(fig, "deviation_over_steps", caption)


def tensor_table(dev, sources):
    step = dev.steps[-1]
    tensors = [t for t in dev.tensors if t != MODEL_TENSOR] + ([MODEL_TENSOR] if MODEL_TENSOR in dev.tensors else [])
    axes = list(sources)
    lead = ATTENTION if ATTENTION in sources else axes[0]
    rows = []
    for t in tensors:
        mats = dev.matrices[step].get(t, {})
        cells, w1_lead = [t], math.nan
        for a in axes:
            w1 = pair_stats(mats["w1"], sources[a])[0] if "w1" in mats else math.nan
            mx = pair_stats(mats["max_abs"], sources[a])[0] if "max_abs" in mats else math.nan
            if a == lead:
                w1_lead = w1
            cells += [num(w1), num(mx)]
        rows.append((w1_lead, t == MODEL_TENSOR, cells))
    rows.sort(key=lambda r: (r[1], -r[0] if r[0] == r[0] else math.inf))
    tensors_only = [r for r in rows if not r[1]]
    shown = tensors_only[:MAX_TENSOR_ROWS] + [r for r in rows if r[1]]
    columns = ["tensor"]
    for a in axes:
        columns += [f"{a} W1", f"{a} max |dW|"]
    more = (f"; the {len(tensors_only) - MAX_TENSOR_ROWS} tensors with less deviation are in deviation.csv"
            if len(tensors_only) > MAX_TENSOR_ROWS else "")
    return Table(columns, [r[2] for r in shown],
                 caption=f"Where the deviation concentrates: mean over each source's pairs per tensor at step {step}, "
                         f"sorted by the {lead} W1 (largest first; the whole model last){more}")


def twins_table(data):
    if data.twins is None or not data.twins.rows:
        return []
    rows = data.twins.rows
    last = max(int(r["step"]) for r in rows)
    out = [(float(r["w1"]), [r["variant"], r["twin"], r["precision"], num(float(r["w1"])), num(float(r["max_abs"]))])
           for r in rows if int(r["step"]) == last]
    out.sort(key=lambda t: -t[0])
    return [Table(["variant", "fp64 twin", "precision", "W1", "max |dW|"], [r for _, r in out],
                  caption=f"Distance of each variant to its fp64 twin (same other axes) at step {last}, largest first")]
