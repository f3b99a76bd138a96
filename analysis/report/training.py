"""Section 3, training: loss curves of every variant grouped by grid axis (one panel per axis, colour
= the axis value), loss spikes (x), skipped fp16 steps (ticks at the bottom), diverged variants
(a red cross at their last step); the state table from status.csv; and the shadow-attention
deviation (|O_kind - O_other| per layer and step) when the study recorded it.
"""

import math

import numpy as np

from .doc import Section, Table, num, text
from .figures import COLOURS

STATE_ORDER = {"failed": 0, "diverged": 1, "running": 2, "queued": 3, "done": 4}


def status_rows(data):
    if data.status is None:
        return []
    return [dict(r) for r in data.status.rows]


def build(data, figs):
    sec = Section("3. Training", "training")
    rows = status_rows(data)
    logs = data.train_logs
    if not rows and not logs and not data.planned("train"):
        sec.blocks.append(text("Training is not part of this study ([study] phases).", kind="note"))
        return sec
    if not rows and not logs:
        sec.blocks.append(text("Training has not run (no status.csv, no variants/*/train_log.csv). Run "
                               "`fastudy train GRID.toml --out OUT`.", kind="missing"))
        return sec
    grid = [(a, vals) for a, vals in data.grid() if len(vals) > 1] or data.grid()
    axes_of = data.variant_axes()
    states = {r["variant"]: r["state"] for r in rows}
    if logs:
        sec.blocks.append(loss_figure(logs, grid, axes_of, states, figs))
    sec.blocks.append(state_table(rows, logs))
    sec.blocks += shadow_blocks(data, figs)
    return sec


def loss_figure(logs, grid, axes_of, states, figs):
    panels = grid or [("variant", sorted(logs))]
    ncols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = figs.new(ncols=ncols, nrows=nrows, width=min(4.8 * ncols + 0.5, 14), height=3.9 * nrows,
                         sharey=True)
    for pi, (axis, values) in enumerate(panels):
        ax = axes[pi // ncols][pi % ncols]
        colour_of = {v: COLOURS[i % len(COLOURS)] for i, v in enumerate(values)}
        for vid, log in sorted(logs.items()):
            value = dict(axes_of.get(vid, [])).get(axis, vid if axis == "variant" else None)
            colour = colour_of.get(value, "#999999")
            c = log.columns
            step, loss = c["step"], c["loss"]
            ax.plot(step, loss, color=colour, lw=1.0, alpha=0.8)
            spikes = c.get("spike", np.zeros_like(step)) > 0
            if spikes.any():
                ax.plot(step[spikes], loss[spikes], "x", color=colour, markersize=7, mew=1.5)
            skipped = c.get("skipped", np.zeros_like(step)) > 0
            if skipped.any():
                ax.plot(step[skipped], np.full(skipped.sum(), 0.04), "|", color=colour, markersize=14, mew=2,
                        transform=ax.get_xaxis_transform())
            if states.get(vid) == "diverged" and len(step):
                finite = np.isfinite(loss)
                y = loss[finite][-1] if finite.any() else np.nan
                ax.plot([step[-1]], [y], "X", color="#c9372c", markersize=11, mec="black")
        for v in values:
            ax.plot([], [], color=colour_of[v], label=f"{axis} = {v}")
        ax.plot([], [], "x", color="black", label="loss spike")
        ax.plot([], [], "|", color="black", markersize=10, label="skipped step (fp16 overflow)")
        ax.plot([], [], "X", color="#c9372c", mec="black", label="diverged")
        ax.set_title(f"grouped by {axis}")
        ax.set_xlabel("training step")
        ax.set_ylabel("training loss (cross-entropy, nats/token)")
        ax.legend(fontsize=8)
    for pi in range(len(panels), nrows * ncols):
        axes[pi // ncols][pi % ncols].set_visible(False)
    caption = ("Training loss of every variant; each panel colours the same curves by one grid axis, so an axis "
               "that separates the curves is visible at a glance. Crosses: loss spikes (loss above the spike "
               "threshold times the recent mean); ticks at the bottom: fp16 steps skipped after an overflow; red X: "
               "a diverged variant's last step.")
    return figs.save(fig, "training_loss", caption)


def state_table(rows, logs):
    out = []
    known = {r["variant"] for r in rows}
    for vid in sorted(set(logs) - known):
        rows.append({"variant": vid, "state": "unknown (not in status.csv)", "step": "", "loss": "", "wall_time_s": "",
                     "reason": ""})
    for r in rows:
        log = logs.get(r["variant"])
        spikes = int((log.columns.get("spike", np.zeros(0)) > 0).sum()) if log else 0
        skipped = int((log.columns.get("skipped", np.zeros(0)) > 0).sum()) if log else 0
        loss = float(r["loss"]) if r.get("loss") else math.nan
        wall = float(r["wall_time_s"]) if r.get("wall_time_s") else math.nan
        out.append(((STATE_ORDER.get(r["state"], -1), -loss if loss == loss else 0, r["variant"]),
                    [r["variant"], r["state"], r.get("step", ""), num(loss), str(spikes), str(skipped), num(wall),
                     r.get("reason", "")]))
    out.sort(key=lambda t: t[0])
    return Table(["variant", "state", "step", "final loss", "spikes", "skipped steps", "wall time (s)", "reason"],
                 [r for _, r in out],
                 caption="Variants (status.csv): failed and diverged first, then by final loss, highest first")


def shadow_blocks(data, figs):
    if not data.shadow:
        shadow_on = bool(data.config and data.config.get("train", {}).get("shadow_attention"))
        if shadow_on:
            return [text("Shadow attention is enabled but no variant has written shadow.csv yet.", kind="missing")]
        return [text("Shadow-attention deviation was not recorded (set `[train] shadow_attention = true` to run the "
                     "other attention kind beside every call and log |O_kind - O_other| per layer).", kind="note")]
    layers = sorted({int(r["layer"]) for t in data.shadow.values() for r in t.rows})
    fig, axes = figs.new(width=8, height=4.2)
    ax = axes[0][0]
    summary = []
    for li, layer in enumerate(layers):
        per_step = {}  # step -> max |d| of every variant at that step
        for vid, t in data.shadow.items():
            for r in t.rows:
                if int(r["layer"]) == layer:
                    per_step.setdefault(int(r["step"]), []).append((float(r["max_abs"]), float(r["mean_abs"]), vid))
        steps = sorted(per_step)
        med = [float(np.median([v[0] for v in per_step[s]])) for s in steps]
        lo = [min(v[0] for v in per_step[s]) for s in steps]
        hi = [max(v[0] for v in per_step[s]) for s in steps]
        colour = COLOURS[li % len(COLOURS)]
        ax.plot(steps, med, color=colour, lw=1.5, label=f"layer {layer} (median over variants)")
        ax.fill_between(steps, lo, hi, color=colour, alpha=0.15)
        every = [v for s in steps for v in per_step[s]]
        worst = max(every, key=lambda v: v[0])
        summary.append((float(np.median([v[0] for v in every])),
                        [str(layer), str(len({v[2] for v in every})), num(float(np.median([v[0] for v in every]))),
                         num(worst[0]), worst[2], num(float(np.median([v[1] for v in every])))]))
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("max |O_kind - O_other| (output units)")
    ax.legend(fontsize=8)
    caption = ("Shadow attention: every attention call also ran the other kind (flash beside baseline or the reverse) "
               "on the same inputs; max |difference| of the outputs per layer and step, median over the variants "
               "(band: min–max), log scale.")
    summary.sort(key=lambda t: -t[0])
    return [figs.save(fig, "training_shadow", caption),
            Table(["layer", "variants", "median max |d|", "largest max |d|", "in variant", "median mean |d|"],
                  [r for _, r in summary],
                  caption="Shadow-attention deviation per layer over all variants and steps, largest first")]
