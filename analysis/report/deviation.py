"""Section 4, weight deviation (the paper's Section V): how far apart the variants' weights drifted.

  - the pairwise whole-model W1 heatmap at the final checkpoint, variants ordered by the grid's axes
    (first axis outermost), log colour scale;
  - W1 against training step (paper Fig. 8), one panel per source axis, one line per condition and
    value (the pairs that differ in that axis only, grouped by the values of the other non-replicate,
    non-noise axes, as analysis/ranking.hpp groups them): conditions are never pooled;
  - per tensor at the final step: small multiples (one panel per source, tensors on an axis, one
    marker per condition and value) and a table of the tensors that move most per source and condition;
  - each variant's distance to its fp64 twin (twins.csv) when the grid has fp64.
The noise floor (the noise axis's pairs, or 0 by construction without one) is on every plot of
distances, or in its caption when it is 0 (a log axis has no place for it).

Roles, baselines and replicate flags come from axes.csv (reduce); without it (an older reduce) the
sources are whole axes, pooled, and the section says so.
"""

import math

import numpy as np
from matplotlib.colors import LogNorm

from .doc import Section, Table, num, sig, text
from .figures import COLOURS, literal
from .readers import MODEL_TENSOR
from .verdict import NOISE_ZERO, condition_words

TOP_TENSORS = 3  # the per-tensor table names the tensors that move most per source and condition
SOURCE_ROLES = ("optimisation", "reference", "noise")  # the roles with per-condition groups


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
    groups = condition_groups(dev.variants, axes_of, data.axes) if data.axes else []
    sources = source_pairs(dev.variants, grid, axes_of)
    has_model = MODEL_TENSOR in dev.tensors
    tensors = [t for t in dev.tensors if t != MODEL_TENSOR]
    what = (f"{len(tensors)} tensors" if tensors else "no tensor ([reduce] per_tensor = false)") + \
        (" plus the whole model (every parameter flattened into one distribution)" if has_model else
         ", not the whole model ([reduce] whole_model = false)")
    sec.blocks.append(text(
        f"From {dev.source}: {len(dev.variants)} variants, checkpoints at steps {', '.join(map(str, dev.steps))}, "
        f"{what}. W1 is the 1-D Wasserstein distance between the two weight distributions "
        "(scipy.stats.wasserstein_distance); max |dW| the largest elementwise difference of the weights."))
    if dev.left_out:
        sec.blocks.append(text("Left out of the reduction: " + "; ".join(dev.left_out), kind="missing"))
    if not data.axes:
        sec.blocks.append(text("axes.csv is missing (written by an older `fastudy reduce`): the axes' roles are unknown, "
                               "so the sources below are whole axes pooled over every condition. Run `fastudy reduce "
                               "OUT` again for the per-condition view.", kind="missing"))
        groups = [{"axis": a, "role": "", "condition": "*", "value_a": "*", "value_b": "*", "pairs": p}
                  for a, p in sources.items()]
    noise = noise_curve(dev, groups) if has_model else None
    if has_model:
        sec.blocks.append(heatmap(dev, order, axes_of, grid, figs, noise))
    else:
        sec.blocks.append(text("The whole model's distances were not computed ([reduce] whole_model = false): no "
                               "heatmap, no W1 over the steps and no verdict; the per-tensor distances follow.",
                               kind="missing"))
    if groups:
        if has_model:
            sec.blocks.append(over_steps(dev, groups, noise, figs))
        if tensors:
            sec.blocks.append(tensor_figure(dev, groups, figs))
            sec.blocks.append(tensor_table(dev, groups))
        else:
            sec.blocks.append(text("Per-tensor distances were not computed ([reduce] per_tensor = false): the whole "
                                   "model's only.", kind="note"))
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


def heatmap(dev, order, axes_of, grid, figs, noise):
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
    caption = (f"Whole-model W1 between the pairs of variants at the final checkpoint (step {step}), variants "
               "ordered by the grid's axes (white lines separate the first axis's values); log colour scale, "
               "diagonal and missing pairs blank: reduce computes the pairs the verdict uses, those that differ in "
               "one axis (`[reduce] pairs = \"all\"` computes the rest). " +
               (noise_caption(noise) if noise is None or all(v == 0 for v in noise[1]) else
                f"Noise floor at this step: mean W1 {sig(noise[1][-1])} over the noise axis's pairs (the same variant "
                "run again)."))
    return figs.save(fig, "deviation_heatmap", caption)


def condition_groups(variants, axes_of, axes):
    """The sources as analysis/ranking.hpp groups them: for each optimisation, reference and noise axis,
    one group per condition (the values of the other non-replicate, non-noise axes with more than one
    value; "all" when there is none) and value (baseline -> value; a replicate axis: all its pairs,
    "*"), each [(i, j)] index pairs into `variants` that differ in that axis only, the baseline side
    first; a setting axis one pooled group (condition "*"). Conditions in order of first appearance,
    values in grid order."""
    vals = [dict(axes_of.get(v, [])) for v in variants]
    names = [a.name for a in axes]
    n = len(variants)
    out = []
    for ax in axes:
        single = [(i, j) for i in range(n) for j in range(i + 1, n) if vals[i] and vals[j]
                  and [k for k in names if vals[i].get(k) != vals[j].get(k)] == [ax.name]]
        if not single:
            continue
        if ax.role not in SOURCE_ROLES:
            out.append({"axis": ax.name, "role": ax.role, "condition": "*", "value_a": "*", "value_b": "*",
                        "pairs": single})
            continue
        cond_axes = [b.name for b in axes if b.name != ax.name and not b.replicate and b.role != "noise"
                     and len(b.values) > 1]
        base = ax.baseline if ax.baseline in ax.values else ax.values[0]
        conditions, groups = [], {}
        for i, j in single:
            cond = ";".join(f"{b}={vals[i][b]}" for b in cond_axes) or "all"
            if ax.replicate:
                other, pair = "*", (i, j)
            elif vals[i][ax.name] == base:
                other, pair = vals[j][ax.name], (i, j)
            elif vals[j][ax.name] == base:
                other, pair = vals[i][ax.name], (j, i)
            else:
                continue
            if cond not in conditions:
                conditions.append(cond)
            groups.setdefault((cond, other), []).append(pair)
        rank = {v: k for k, v in enumerate(ax.values)}
        for (cond, other), pairs in sorted(groups.items(), key=lambda kv: (conditions.index(kv[0][0]),
                                                                           rank.get(kv[0][1], -1))):
            out.append({"axis": ax.name, "role": ax.role, "condition": cond,
                        "value_a": "*" if other == "*" else base, "value_b": other, "pairs": pairs})
    return out


def group_label(g, with_condition=True):
    what = g["axis"] if g["value_a"] == "*" else f"{g['axis']}: {g['value_b']} vs {g['value_a']}"
    if with_condition and g["condition"] not in ("*",):
        what += f" @ {condition_words(g['condition'])}"
    return what


def noise_pairs(groups):
    return [p for g in groups if g["role"] == "noise" for p in g["pairs"]]


def noise_curve(dev, groups):
    """(steps, mean whole-model W1 of the noise axis's pairs per step), or None without a noise axis."""
    pairs = noise_pairs(groups)
    if not pairs:
        return None
    return dev.steps, [pair_stats(dev.matrices[s][MODEL_TENSOR]["w1"], pairs)[0] for s in dev.steps]


def noise_caption(noise):
    if noise is None:
        return ("Noise floor: " + NOISE_ZERO.split(": ", 1)[1] + "; 0 has no place on a log axis, so it is not "
                "drawn.")
    if all(v == 0 for v in noise[1]):
        return ("Noise floor: measured exactly 0 (the noise axis's pairs, the same variant run again, are "
                "bit-identical); 0 has no place on a log axis, so it is not drawn.")
    return "The dashed grey line is the noise floor: the noise axis's pairs (the same variant run again)."


def _panels(figs, n, height_each=3.6, width_each=5.2):
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    fig, axes = figs.new(ncols=ncols, nrows=nrows, width=min(width_each * ncols, 16.0), height=height_each * nrows)
    flat = [a for row in axes for a in row]
    for a in flat[n:]:
        a.set_visible(False)
    return fig, flat


def over_steps(dev, groups, noise, figs):
    """Small multiples: one panel per source axis, one line per condition and value (never pooled)."""
    axis_names = list(dict.fromkeys(g["axis"] for g in groups))
    fig, panels = _panels(figs, len(axis_names))
    for ax, name in zip(panels, axis_names):
        mine = [g for g in groups if g["axis"] == name]
        for k, g in enumerate(mine):
            colour = COLOURS[k % len(COLOURS)]
            stats = [pair_stats(dev.matrices[s][MODEL_TENSOR]["w1"], g["pairs"]) for s in dev.steps]
            mean = np.array([s[0] for s in stats])
            lo = np.array([s[1] for s in stats])
            hi = np.array([s[2] for s in stats])
            zero = np.all(mean[np.isfinite(mean)] == 0)
            label = group_label(g, with_condition=False).split(": ", 1)[-1]
            if g["condition"] != "*":
                label += f" @ {condition_words(g['condition'])}"
            label += f" ({len(g['pairs'])} pairs){' = 0: bit-identical' if zero else ''}"
            ax.plot(dev.steps, np.where(mean > 0, mean, np.nan), "o-", color=colour, label=label, lw=1.6, ms=3)
            ax.fill_between(dev.steps, np.where(lo > 0, lo, np.nan), np.where(hi > 0, hi, np.nan), color=colour,
                            alpha=0.15)
        if noise is not None and mine[0]["role"] != "noise":
            steps, level = noise
            level = np.array(level, dtype=float)
            ax.plot(steps, np.where(level > 0, level, np.nan), "--", color="0.45", lw=1.4, label="noise floor")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_ylabel("whole-model W1")
        role = mine[0]["role"]
        ax.set_title(f"{name}" + (f" ({role})" if role else ""))
        ax.legend(fontsize=7)
    caption = ("Whole-model W1 against training step (paper Fig. 8), one panel per source axis: each line is one "
               "condition and value — the pairs that differ in that axis only, under equal values of the other "
               "non-replicate axes (mean over the pairs, band = min–max); conditions are never pooled. Log scale. " +
               noise_caption(noise))
    return figs.save(fig, "deviation_over_steps", caption)


def tensor_means(dev, g, step):
    """tensor -> mean W1 over the group's pairs at `step` (tensors only, not the whole model)."""
    out = {}
    for t in dev.tensors:
        if t == MODEL_TENSOR or "w1" not in dev.matrices[step].get(t, {}):
            continue
        out[t] = pair_stats(dev.matrices[step][t]["w1"], g["pairs"])[0]
    return out


def tensor_figure(dev, groups, figs):
    """Small multiples: one panel per source axis, the tensors on the vertical axis, W1 on the horizontal,
    one marker per condition and value; the noise floor per tensor as grey bars."""
    step = dev.steps[-1]
    tensors = [t for t in dev.tensors if t != MODEL_TENSOR]
    axis_names = list(dict.fromkeys(g["axis"] for g in groups if g["role"] != "noise")) or \
        list(dict.fromkeys(g["axis"] for g in groups))
    noise = noise_pairs(groups)
    fig, panels = _panels(figs, len(axis_names), height_each=max(2.8, 0.28 * len(tensors) + 1.4), width_each=5.6)
    y = np.arange(len(tensors))
    markers = "osD^v<>ph*"
    for ax, name in zip(panels, axis_names):
        mine = [g for g in groups if g["axis"] == name]
        for k, g in enumerate(mine):
            means = tensor_means(dev, g, step)
            x = np.array([means.get(t, math.nan) for t in tensors])
            label = group_label(g, with_condition=False).split(": ", 1)[-1]
            if g["condition"] != "*":
                label += f" @ {condition_words(g['condition'])}"
            ax.plot(np.where(x > 0, x, np.nan), y, markers[k % len(markers)], color=COLOURS[k % len(COLOURS)],
                    label=label, ms=5, alpha=0.85)
        if noise:
            level = np.array([pair_stats(dev.matrices[step][t]["w1"], noise)[0] for t in tensors])
            ax.plot(np.where(level > 0, level, np.nan), y, "|", color="0.35", ms=12, label="noise floor")
        ax.set_xscale("log")
        ax.set_yticks(y, [literal(t) for t in tensors], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(f"W1 at step {step}")
        ax.set_title(name)
        ax.legend(fontsize=6)
    caption = (f"Where each source moves the weights: per-tensor W1 at step {step}, one panel per source axis, one "
               "marker per condition and value (mean over its pairs); a tensor with W1 = 0 there (bit-identical) has "
               "no marker on the log axis, and every value is in the table below and in deviation.csv. " +
               ("The grey bars are the noise floor per tensor (none where it is 0)." if noise else
                "Noise floor: " + NOISE_ZERO.split(": ", 1)[1] + " (not drawn on the log axis)."))
    return figs.save(fig, "deviation_tensors", caption)


def tensor_table(dev, groups):
    """Per source, condition and value: the tensors with the largest mean W1 at the final step."""
    step = dev.steps[-1]
    rows = []
    for g in groups:
        means = tensor_means(dev, g, step)
        top = sorted(((w, t) for t, w in means.items() if math.isfinite(w)), key=lambda x: -x[0])[:TOP_TENSORS]
        model = pair_stats(dev.matrices[step][MODEL_TENSOR]["w1"], g["pairs"])[0] \
            if MODEL_TENSOR in dev.matrices[step] else math.nan
        cells = [group_label(g, with_condition=False), condition_words(g["condition"]) if g["condition"] != "*"
                 else "pooled", str(len(g["pairs"]))]
        for k in range(TOP_TENSORS):
            cells.append([f"{top[k][1]} ", num(top[k][0])] if k < len(top) else "")
        cells.append(num(model))
        rows.append(cells)
    columns = ["source", "condition", "pairs"] + [f"tensor #{k + 1} (W1)" for k in range(TOP_TENSORS)] + \
              ["whole model W1"]
    return Table(columns, rows, caption=f"The tensors that move most per source, condition and value at step {step} "
                                        "(mean W1 over the pairs; every tensor is in deviation.csv)")


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
