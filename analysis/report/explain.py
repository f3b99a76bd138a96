"""Section 6, explanations: the precision advice (`fastudy advise`, OUT/advice.csv), the counterfactual
replays (`fastudy replay`, OUT/replays/*/replay.csv) and the first-divergent-op bisections (`fastudy
bisect`, OUT/bisect/*.csv), shown only when the study has them. Every number and sentence is computed
from those files.
"""

import math
import re

from .doc import Pre, Section, Table, num, text
from .figures import COLOURS
from .readers import to_float

BISECT_NAME = re.compile(r"^(?P<a>.+)--(?P<b>.+)-step(?P<step>\d+)$")
REPLAY_NAME = re.compile(r"^(?P<variant>.+?)-from(?P<step>\d+)(?P<sets>(\+[^+]+)*)$")


def present(data):
    return bool(data.replays or data.bisects or (data.advice is not None and data.advice.rows))


POINT_KEYS = ("sweep", "pass", "format", "policy", "rounding", "seq_len", "head_dim", "block_q", "block_kv",
              "loop_order", "causal", "distribution")


def advice_points(table):
    """[(point dict, [step rows])] in file order."""
    points, index = [], {}
    for r in table.rows:
        key = tuple(r[k] for k in POINT_KEYS)
        if key not in index:
            index[key] = len(points)
            points.append((r, []))
        points[index[key]][1].append(r)
    return points


def tiles(p):
    return -(-int(p["seq_len"]) // int(p["block_kv"]))


def point_label(p):
    return (f"{p['policy']} {p['format']} {p['pass']}, N {p['seq_len']}, d {p['head_dim']}, {tiles(p)} KV tiles"
            + (", causal" if p["causal"] == "1" else ""))


def minimal_set(steps):
    chosen = sorted((int(s["order"]), s["step"]) for s in steps if int(s["order"]) > 0)
    return [name for _, name in chosen]


def ratio(a, b):
    return a / b if b > 0 else math.nan


def advice_blocks(data, figs):
    points = advice_points(data.advice)
    blocks = []
    by_reading = {}
    for p, _ in points:
        by_reading.setdefault((p["policy"], p["format"]), []).append(p)
    for (policy, fmt), ps in by_reading.items():
        steps_of = {id(p): s for p, s in points}
        over = [p for p in ps if to_float(p["flash"]) > to_float(p["target"])]
        counts = {}
        for p in over:
            for name in minimal_set(steps_of[id(p)]):
                counts[name] = counts.get(name, 0) + 1
        reached = [ratio(to_float(p["reached"]), to_float(p["baseline"])) for p in over]
        met = sum(p["met"] == "1" for p in over)
        if not over:
            blocks.append(text(f"Under `{policy}` at {fmt}, flash is within the target at all {len(ps)} point(s): no "
                               "step needs fp32."))
            continue
        kept = ", ".join(f"`{k}` ({v} of {len(over)})" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"
        span = [num(min(reached), key=f"explain.advice.{policy}.{fmt}.reached_min")]
        if max(reached) != min(reached):
            span += ["–", num(max(reached), key=f"explain.advice.{policy}.{fmt}.reached_max")]
        blocks.append(text(f"Under `{policy}` at {fmt}, flash exceeds the target at {len(over)} of {len(ps)} point(s); "
                           f"the steps kept in fp32 there: {kept}; with them flash reaches ", *span,
                           f"x the baseline's error (target met at {met} of {len(over)})."))
    rows = []
    for p, steps in points:
        rows.append([point_label(p), num(to_float(p["flash"])), num(to_float(p["baseline"])),
                     num(ratio(to_float(p["flash"]), to_float(p["baseline"]))), num(to_float(p["target"])),
                     ", ".join(minimal_set(steps)) or "none",
                     num(ratio(to_float(p["reached"]), to_float(p["baseline"]))), "yes" if p["met"] == "1" else "no"])
    blocks.append(Table(["point", "flash error", "baseline error", "flash / baseline", "target",
                         "kept in fp32 (greedy order)", "flash / baseline with them", "target met"], rows,
                        caption="Precision advice (fastudy advise): errors as rel_l2 against fp64, the greedy minimal set "
                                "of steps kept in fp32 that brings flash within the target"))
    over = [(p, steps) for p, steps in points if to_float(p["flash"]) > to_float(p["target"])]
    if over:
        blocks.append(share_figure(over, figs))
    return blocks


def share_figure(points, figs):
    shown = points[:9]
    ncols = min(len(shown), 3)
    nrows = math.ceil(len(shown) / ncols)
    fig, axes = figs.new(ncols=ncols, nrows=nrows, width=min(4.6 * ncols + 0.5, 14), height=3.4 * nrows)
    for i, (p, steps) in enumerate(shown):
        ax = axes[i // ncols][i % ncols]
        cand = [s for s in steps if s["in_format"] == "1"]
        names = [s["step"] for s in cand]
        shares = [100 * to_float(s["share"]) for s in cand]
        colours = [COLOURS[1] if int(s["order"]) > 0 else COLOURS[0] for s in cand]
        ax.barh(range(len(names)), shares, color=colours)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names)
        ax.invert_yaxis()
        ax.set_xlabel("% of flash's excess error removed alone")
        ax.set_title(point_label(p), fontsize=8)
    for j in range(len(shown), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    caption = ("Each step's share of flash's excess error over the target, at the points where flash exceeds it: the "
               "part of it that promoting the step alone to fp32 removes (steps of the greedy minimal set in the "
               "second colour; shares need not add up to 100%: steps interact)"
               + (f"; the first 9 of {len(points)} points" if len(points) > 9 else ""))
    return figs.save(fig, "explain_advice", caption)


def replay_summary(name, table):
    """One row of the replay table: what was changed, what happened to the original's trouble."""
    m = REPLAY_NAME.match(name)
    variant, start = (m.group("variant"), int(m.group("step"))) if m else (name, math.nan)
    sets = ", ".join(s for s in (m.group("sets") if m else "").split("+") if s) or "none"
    rows = table.rows
    flag = lambda r, c: r.get(c, "0") == "1"
    orig_trouble = sum(flag(r, "original_spike") for r in rows) + sum(flag(r, "original_diverged") for r in rows)
    replay_trouble = sum(flag(r, "spike") for r in rows) + sum(flag(r, "diverged") for r in rows)
    describe = lambda spikes, div: (f"{spikes} spike(s)" + (f", diverged at step {div}" if div else ""))
    o_div = next((r["step"] for r in rows if flag(r, "original_diverged")), "")
    p_div = next((r["step"] for r in rows if flag(r, "diverged")), "")
    measured = [r for r in rows if r.get("max_abs", "") != ""]
    last = measured[-1] if measured else None
    losses_same = all(r["loss"] == r["original_loss"] for r in rows if r["loss"] and r["original_loss"])
    identical = bool(measured) and all(to_float(r["max_abs"]) == 0 for r in measured) and losses_same
    if orig_trouble:
        back = "yes" if replay_trouble else "no"
    else:
        back = "–" if not replay_trouble else "new trouble"
    end = rows[-1] if rows else {}
    return [variant, str(start), sets,
            describe(sum(flag(r, "original_spike") for r in rows), o_div),
            describe(sum(flag(r, "spike") for r in rows), p_div), back,
            num(to_float(end.get("original_loss", "")), key=f"explain.replay.{name}.original_loss"),
            num(to_float(end.get("loss", "")), key=f"explain.replay.{name}.loss"),
            num(to_float(last["w1"]) if last else math.nan, key=f"explain.replay.{name}.w1"),
            num(to_float(last["max_abs"]) if last else math.nan, key=f"explain.replay.{name}.max_abs"),
            "yes" if identical else "no"]


def layer_rows(table):
    """Per layer: the first op whose bits differ, the largest difference (in roundings) of its forward
    ops and of its gradients, and the ops beyond the bound."""
    layers = {}
    for r in table.rows:
        entry = layers.setdefault(r["layer"], {"first": "", "fwd": 0.0, "grad": 0.0, "beyond": []})
        ulps = to_float(r["ulps"])
        if r["identical"] != "1" and not entry["first"]:
            entry["first"] = r["op"]
        key = "grad" if r["op"].startswith("grad ") else "fwd"
        entry[key] = max(entry[key], ulps) if not math.isnan(ulps) else entry[key]
        if r["beyond"] == "1":
            entry["beyond"].append(r["op"])
    order = sorted(layers, key=lambda l: (l == "-", int(l) if l.isdigit() else 0))
    rows = []
    for layer in order:
        e = layers[layer]
        beyond = ", ".join(e["beyond"][:3]) + (f" (+{len(e['beyond']) - 3})" if len(e["beyond"]) > 3 else "")
        rows.append([layer if layer != "-" else "embedding, head, loss", e["first"] or "none (identical)",
                     num(e["fwd"]), num(e["grad"]), beyond or "none"])
    return rows


def bisect_sentence(name, table):
    m = BISECT_NAME.match(name)
    a, b, step = (m.group("a"), m.group("b"), m.group("step")) if m else (name, "?", "?")
    bound = to_float(table.rows[0]["bound_ulps"]) if table.rows else math.nan
    first = next((r for r in table.rows if r["first"] == "1"), None)
    differs = next((r for r in table.rows if r["identical"] != "1"), None)
    lead = f"`{a}` against `{b}`, one step from `{a}`'s weights after step {step}: "
    if first is not None:
        return text(lead, f"the first op beyond the bound ({num(bound).text} roundings) is `{first['op']}` (",
                    num(to_float(first["ulps"]), key=f"explain.bisect.{name}.first_ulps"),
                    " roundings of its largest output); every op before it agrees within the bound.")
    if differs is not None:
        return text(lead, f"every op agrees within the bound ({num(bound).text} roundings); the first whose bits "
                          f"differ is `{differs['op']}`.")
    return text(lead, "the two runs are bit-identical, op for op.")


def build(data, figs):
    sec = Section("6. Explanations: advice, replays and bisections", "explanations")
    if data.advice is not None and data.advice.rows:
        sec.blocks += advice_blocks(data, figs)
    if data.replays:
        rows = [replay_summary(name, table) for name, table in sorted(data.replays.items())]
        sec.blocks.append(Table(
            ["variant", "from step", "axes set", "original", "replay", "trouble comes back", "final loss (original)",
             "final loss (replay)", "W1 to original", "max |dW|", "bit-identical"], rows,
            caption="Counterfactual replays (fastudy replay): the variant resumed from its checkpoint with the axes "
                    "set, the same batches; spikes and divergence in the replayed steps, and the weight distance at the "
                    "last step where the original has a checkpoint"))
    for name, table in sorted(data.bisects.items()):
        sec.blocks.append(bisect_sentence(name, table))
        sec.blocks.append(Table(
            ["layer", "first op whose bits differ", "max roundings (forward)", "max roundings (gradients)",
             "ops beyond the bound"], layer_rows(table),
            caption=f"First divergent op (fastudy bisect), per layer: {name}"))
        full = "\n".join(f"{r['op']:<32} {r['ulps']:>14} {'beyond' if r['beyond'] == '1' else ''}" for r in table.rows)
        sec.blocks.append(Pre(full, f"every op of {name} (roundings of its largest output)"))
    return sec
