"""Section 1, the verdict: for every optimisation (an axis whose role is `optimisation`: attention,
matmul, split_k, ...) and every condition it ran under, whether its deviation stays within the
deviation that the accepted references (role `reference`: init seed, training precision) cause under
the same condition; then the pooled ranking of every source as a summary.

Everything comes from reduce's outputs (analysis/ranking.hpp defines each number): verdict.csv (one
row per optimisation value, condition and reference), ranking.csv (per-condition and pooled rows) and
axes.csv (roles). The rules, printed in the report too:
  - condition: the values of every other axis that is neither a replicate (seed-like) nor a noise axis;
  - the reference under the same condition: pairs that differ in the reference only, with the
    optimisation at its baseline and the condition's other values; a non-replicate reference such as
    precision is the change from its baseline to the condition's value (at its baseline: to each other
    value);
  - ratios are optimisation / reference (<= 1: within the bound), at the final step (end-point) and
    of the per-pair least-squares slopes of W1 over the steps (slope); the verdict uses the slope
    ratio (the paper's measure, free of the offset a reference such as seed carries from step 0) and
    the end-point ratio where no slope ratio exists;
  - an interval is printed only when both sides rest on >= 3 independent pairs; otherwise "not
    informative (n pairs)" and the verdict rests on the point estimate.

The verdict also names the reading (attention precision policy, docs/readings.md) the study trained
with, from study.toml: [attention] policy, or the values of a `policy` grid axis; a custom policy is
named with the reading it starts from and its rounding mode.
"""

import math

from .doc import Bullets, Cell, Fold, Section, Table, num, sig, text
from .readers import RANKING_FLOATS, RANKING_INTS, VERDICT_FLOATS, VERDICT_INTS, typed_rows
from .readings import reading_words

MIN_INDEPENDENT = 3  # analysis/ranking.hpp kMinIndependentPairs
VERDICT_WORDS = {
    "within": "within the bounds",
    "outside": "OUTSIDE the bounds",
    "undecided": "undecided (an interval contains 1)",
    "bit-identical": "bit-identical: no deviation",
    "within noise": "within the noise floor",
    "no reference": "no reference under this condition",
}
NOISE_ZERO = ("noise floor: 0 by construction (deterministic CPU arithmetic); add a `repeat` axis to measure it")


def training_readings(data):
    """The reading(s) the study trained with, in words: ["`eager` (a framework-level ...)"], or [] when
    study.toml is unknown."""
    if not data.config:
        return []
    att = data.config.get("attention", {})
    names = [v for axis, values in data.grid() if axis == "policy" for v in values] or [att.get("policy", "mixed")]
    custom = att.get("policies", {})
    out = []
    for name in names:
        if name in custom:
            c = custom[name]
            preset = c.get("preset", "pure")
            out.append(f"custom policy `{name}` (from `{preset}`, {reading_words(preset)}; rounding "
                       f"{c.get('rounding', 'nearest')})")
        else:
            out.append(f"`{name}` ({reading_words(name)})")
    return out


def reading_text(data):
    readings = training_readings(data)
    if not readings:
        return None
    return text(("Training ran attention under the reading " if len(readings) == 1 else
                 "Training ran attention under the readings ") + "; ".join(readings) +
                " (docs/readings.md). The microbenchmark in section 2 shows how flash's error relative to "
                "baseline depends on the reading.", kind="note")


def ranking_rows(table):
    """ranking.csv rows with floats and ints parsed."""
    return typed_rows(table, RANKING_FLOATS, RANKING_INTS)


def verdict_rows(table):
    """verdict.csv rows with floats and ints parsed."""
    return typed_rows(table, VERDICT_FLOATS, VERDICT_INTS)


def final_step(rows):
    return max(r["step"] for r in rows) if rows else None


def condition_words(condition):
    """'precision=bf16;policy=mixed' -> 'precision bf16, policy mixed'; 'all' -> 'all variants'."""
    if condition in ("all", ""):
        return "all variants"
    return ", ".join(c.replace("=", " ", 1) for c in condition.split(";"))


def ratio_cell(c, measure, key):
    """'0.21 [0.12, 0.35]' or '0.21, not informative (2 pairs)': one comparison's ratio of `measure`."""
    q, lo, hi = (c["end_ratio"], c["end_lo"], c["end_hi"]) if measure == "end" else \
        (c["slope_ratio"], c["slope_lo"], c["slope_hi"])
    parts = [num(q, key)]
    if math.isnan(q):
        return parts + [" (undefined)" if measure == "end" else " (no slope: one step, or the reference does not grow)"]
    if c["informative"]:
        return parts + [" [", num(lo, key + ".lo"), ", ", num(hi, key + ".hi"), "]"]
    n = min(c["independent"], c["reference_independent"])
    return parts + [f", not informative ({n} pair{'s' if n != 1 else ''})"]


def group_comparisons(comps):
    """[(axis, value, condition, [rows])] in verdict.csv's order."""
    groups = []
    for c in comps:
        key = (c["axis"], c["value"], c["condition"])
        if not groups or groups[-1][:3] != key:
            groups.append((*key, []))
        groups[-1][3].append(c)
    return groups


def ref_label(c):
    """'precision fp32↔fp16' or 'seed': the reference of one comparison."""
    return c["reference"] + ("" if c["reference_pair"] == "*" else " " + c["reference_pair"].replace("<->", "↔"))


def deciding(rows):
    """The comparison whose ratio decides the verdict: the largest ratio, of the measure the verdict
    used, over the references (within: all <= 1; outside: one above 1), or None (no ratio exists)."""
    measure = rows[0]["measure"]
    col = "slope_ratio" if measure == "slope" else "end_ratio"
    found = [c for c in rows if c["reference"] and not math.isnan(c[col])]
    return max(found, key=lambda c: c[col]) if found else None


def deciding_cell(rows, base):
    """The deciding ratio, the reference it is against, and its interval (or why there is none)."""
    c = deciding(rows)
    if c is None:
        return Cell(["–"], sub=["no ratio: " + VERDICT_WORDS.get(rows[0]["verdict"], rows[0]["verdict"])])
    measure = "slope" if rows[0]["measure"] == "slope" else "end"
    key = f"{base}.decides"
    q, lo, hi = (c["slope_ratio"], c["slope_lo"], c["slope_hi"]) if measure == "slope" else \
        (c["end_ratio"], c["end_lo"], c["end_hi"])
    if c["informative"]:
        sub = ["95% interval [", num(lo, key + ".lo"), ", ", num(hi, key + ".hi"), "]"]
    else:
        n = min(c["independent"], c["reference_independent"])
        sub = [f"no interval: {n} independent pair{'s' if n != 1 else ''}"]
    return Cell([num(q, key), f" vs {ref_label(c)}"], sub=[f"{'slope' if measure == 'slope' else 'end-point'}; "] + sub)


def evidence_cell(rows, base, label):
    """W1 and pairs on the line; every reference's end-point and slope ratio and the noise floor folded."""
    first = rows[0]
    lines = []
    for c in rows:
        if not c["reference"]:
            continue
        key = f"{base}.{c['reference']}.{c['reference_pair']}"
        lines.append([f"vs {ref_label(c)}: end-point "] + ratio_cell(c, "end", key + ".end") + ["; slope "] +
                     ratio_cell(c, "slope", key + ".slope"))
    noise = first["noise_w1"]
    lines.append(["noise floor W1: ", num(noise, f"{base}.noise")] if not math.isnan(noise) else
                 ["noise floor W1: 0 (by construction)"])
    return Cell(["W1 ", num(first["w1"], f"{base}.w1"), f" · {first['pairs']} pair{'s' if first['pairs'] != 1 else ''} ({first['independent']} independent)"],
                fold=Fold("every ratio", lines, label))


def verdict_table(comps):
    """One row per optimisation value and condition: the verdict and the ratio that decides it first,
    then what and where, then the evidence (every reference's end-point and slope ratios) folded."""
    out = []
    for axis, value, condition, rows in group_comparisons(comps):
        base = f"verdict.{axis}.{value}.{condition}"
        what = f"{axis}: {value} vs {rows[0]['baseline']}"
        out.append([verdict_cell(rows), deciding_cell(rows, base), what, condition_words(condition),
                    evidence_cell(rows, base, f"{what}, {condition_words(condition)}")])
    return Table(["verdict", "deciding ratio", "optimisation", "condition", "evidence"], out, name="verdict",
                 caption="Verdict per optimisation and condition (ratio = optimisation W1 / reference W1 under the "
                         "same condition; <= 1: within the bound; the deciding ratio is the largest)")


VERDICT_KINDS = {"within": "good", "bit-identical": "good", "within noise": "good", "outside": "bad"}


def verdict_cell(rows):
    """The verdict in a word or two, coloured, with how it was decided on a second line."""
    first = rows[0]
    v = first["verdict"]
    words = VERDICT_WORDS.get(v, v)
    sub = None
    if v in ("within", "outside", "undecided"):
        words = words.split(" (")[0]
        over = ", ".join(ref_label(c) for c in rows if c["comparison"] == "outside")
        sub = ["an interval contains 1; " if v == "undecided" else f"vs {over}; " if v == "outside" else "",
               f"by the {'slope' if first['measure'] == 'slope' else 'end-point'} ratio"]
        c = deciding(rows)
        if c is not None and not c["informative"]:
            sub.append("; a point estimate (too few pairs for an interval)")
        else:
            loose = [ref_label(r) for r in rows if r["reference"] and not r["informative"]]
            if loose:
                sub.append("; point estimates vs " + ", ".join(loose))
    return Cell([words], sub=sub, kind=VERDICT_KINDS.get(v, "unsure"))


def disagreements(comps):
    """Per optimisation value whose conditions get different verdicts: one sentence."""
    by_value = {}
    for axis, value, condition, rows in group_comparisons(comps):
        by_value.setdefault((axis, value, rows[0]["baseline"]), []).append((condition, rows[0]["verdict"]))
    out = []
    for (axis, value, base), conds in by_value.items():
        kinds = []
        for _, v in conds:
            if v not in kinds:
                kinds.append(v)
        if len(kinds) > 1:
            out.append(f"{axis} {value} vs {base}: the conditions disagree — " + "; ".join(
                f"{VERDICT_WORDS.get(k, k)} at " + ", ".join(condition_words(c) for c, v in conds if v == k)
                for k in kinds) + ".")
    return out


def framework_kernels(data):
    """What in the study runs the framework's own kernels, whose GPU versions may be non-deterministic
    (atomics in backward passes): native arithmetic and the SDPA attention kinds, as words ([] if none)."""
    found = []
    if (data.config or {}).get("train", {}).get("arithmetic") == "native":
        found.append("[train] arithmetic = native")
    for values in data.variant_axes().values():
        for axis, value in values:
            word = (f"arithmetic = {value}" if axis == "arithmetic" and value == "native" else
                    f"attention = {value}" if axis == "attention" and str(value).startswith("sdpa_") else None)
            if word and word not in found:
                found.append(word)
    return found


def noise_statement(data, rows, step):
    """The noise floor in words: measured from the noise axis, or 0 by construction (not where the
    framework's own kernels run: they may be non-deterministic on a GPU)."""
    noise = [r for r in rows if r["role"] == "noise" and r["condition"] == "*" and r["value_a"] == "*"
             and r["step"] == step]
    if not noise and framework_kernels(data):
        return text("Noise floor: not measured. Variants with " + ", ".join(framework_kernels(data)) + " run the "
                    "framework's own kernels, which on a GPU may be non-deterministic (atomics in backward passes), "
                    "so a rerun need not give the same weights; add a `repeat` axis to measure the floor before "
                    "reading small distances as effects.", kind="missing")
    if not noise:
        return text(NOISE_ZERO[0].upper() + NOISE_ZERO[1:] + ". It is drawn on no log-scale plot (0 has no place "
                    "there); every figure's caption says so.", kind="note")
    r = noise[0]
    if r["w1_mean"] == 0:
        return text(f"Noise floor (axis `{r['axis']}`: the same variant run again, {r['pairs']} pairs): measured "
                    "exactly 0, the repeated runs are bit-identical (deterministic arithmetic); 0 has no place on "
                    "the log-scale plots, whose captions say so.", kind="note")
    return text(f"Noise floor (axis `{r['axis']}`: the same variant run again, {r['pairs']} pairs): mean W1 = ",
                num(r["w1_mean"], "verdict.noise.w1_mean"), f" at step {step}; drawn on every plot of distances. "
                "An optimisation whose W1 is at most the floor under its condition is within the noise.", kind="note")


def build(data, status_summary):
    """The verdict section. status_summary: the phases' state in words (what exists, what is missing)."""
    sec = Section("1. Verdict", "verdict")
    skipped = [n for n in (data.ranking.notes if data.ranking is not None else []) if "whole_model = false" in n]
    if skipped:
        sec.blocks.append(text("No verdict: " + skipped[0] + " (`[reduce] whole_model = true`, the default, computes "
                               "them). Section 4 shows the per-tensor distances.", kind="missing"))
        sec.blocks.append(Bullets(status_summary))
        return sec
    if (data.ranking is None or not data.ranking.rows) and not (data.planned("train") and data.planned("reduce")):
        sec.blocks.append(text("This study does not train or reduce ([study] phases), so there is no weight-level "
                               "verdict: the microbenchmark in section 2 is its result. A grid with train and reduce "
                               "phases ranks the deviation sources here.", kind="note"))
        sec.blocks.append(Bullets(status_summary))
        return sec
    if data.ranking is None or not data.ranking.rows:
        sec.blocks.append(text("No verdict yet: the reduce phase has not run (ranking.csv is missing), so the "
                               "deviation sources cannot be ranked. Run `fastudy reduce OUT` once training is "
                               "complete (or with --allow-missing).", kind="missing"))
        sec.blocks.append(Bullets(status_summary))
        return sec

    rows = ranking_rows(data.ranking)
    step = final_step(rows)
    comps = verdict_rows(data.verdict) if data.verdict is not None else []
    optimisations = sorted({c["axis"] for c in comps})
    if data.verdict is None:
        sec.blocks.append(text("verdict.csv is missing (written by an older `fastudy reduce`): run `fastudy reduce OUT` "
                               "again for the per-condition verdict; the pooled summary follows.", kind="missing"))
    elif not comps:
        sec.blocks.append(text("The grid has no optimisation axis with evidence (no two variants differ in an "
                               "optimisation axis alone), so there is nothing to bound; the table below only ranks "
                               "the grid's axes as deviation sources.", kind="lead"))
    else:
        groups = group_comparisons(comps)
        counts = {}
        for _, _, _, g in groups:
            counts[g[0]["verdict"]] = counts.get(g[0]["verdict"], 0) + 1
        sec.blocks.append(text(
            f"{len(groups)} verdicts at step {comps[0]['step']}, one per optimisation ({', '.join(optimisations)}), "
            "value and condition, each against the accepted references under the same condition: " +
            ", ".join(f"{n} {VERDICT_WORDS.get(k, k)}" for k, n in counts.items()) + ".", kind="lead"))
        outside = [(a, v, c) for a, v, c, g in groups if g[0]["verdict"] == "outside"]
        if outside:
            sec.blocks.append(text("Outside the accepted bounds under " + "; ".join(
                f"{a} {v} at {condition_words(c)}" for a, v, c in outside) + ".", kind="bad"))
        elif all(g[0]["verdict"] in ("within", "bit-identical", "within noise") for *_, g in groups):
            sec.blocks.append(text("Within the accepted bounds under every condition.", kind="good"))
        sec.blocks.append(verdict_table(comps))
        dis = disagreements(comps)
        if dis:
            sec.blocks.append(Bullets(dis))
        sec.blocks.append(text(
            "How to read it. Condition: the values of every other grid axis that is neither a replicate (seed-like: "
            "its values are independent draws) nor a noise axis; the optimisation's pairs under a condition differ "
            "in the optimisation only, one per replicate value. Reference under the same condition: the pairs that "
            "differ in the reference axis only, with the optimisation at its baseline and the condition's other "
            "values; for a non-replicate reference (precision) the change from its baseline to the condition's "
            "value, or at its baseline to each other value. Ratios are optimisation / reference: at the final step "
            "(end-point) and of the per-pair least-squares slopes of W1 over the checkpoints (slope). The verdict "
            "uses the slope ratio, the paper's measure (\"note the slope\"): references such as seed start apart at "
            "step 0 while the optimisation's pairs start from equal weights, so end-points favour the optimisation "
            "by the reference's initial offset; where a slope ratio does not exist (one checkpoint, a reference "
            "that does not grow) the end-point ratio decides. Within: ratio <= 1 against every reference; outside: "
            "above 1 against any. Intervals: 95% percentile bootstrap over pairs (fixed seed, deterministic), "
            f"printed only when both sides rest on at least {MIN_INDEPENDENT} independent pairs (pairs sharing "
            "no variant: k seeds give k optimisation pairs but only k/2 independent seed pairs); otherwise "
            "\"not informative (n pairs)\" and the verdict is a point estimate.", kind="note"))
    sec.blocks.append(noise_statement(data, rows, step))
    reading = reading_text(data)
    if reading is not None:
        sec.blocks.append(reading)
    sec.blocks.append(ranking_table(rows, step))
    # The noise floor and the disagreements between conditions are stated above in their own words.
    notes = [n for n in data.ranking.notes if not n.startswith("noise floor:")
             and not (comps and "the conditions disagree" in n)]
    if notes:
        sec.blocks.append(Bullets([f"note from reduce: {n}" for n in notes]))
    if status_summary:
        sec.blocks.append(text("State of the study:"))
        sec.blocks.append(Bullets(status_summary))
    return sec


def pooled_rows(rows, step):
    return [r for r in rows if r["step"] == step and r["condition"] == "*"]


def spread(rows, step, axis):
    """Largest / smallest per-condition mean W1 of an axis at `step` (NaN without two conditions)."""
    means = [r["w1_mean"] for r in rows if r["step"] == step and r["axis"] == axis and r["condition"] != "*"
             and math.isfinite(r["w1_mean"])]
    if len(means) < 2 or min(means) <= 0:
        return math.nan
    return max(means) / min(means)


def ranking_table(rows, step):
    """The summary: every source pooled over all conditions (whole axis, then its value pairs) at the
    final step, largest mean W1 first, with the spread of its per-condition means."""
    pooled = pooled_rows(rows, step)
    whole = sorted([r for r in pooled if r["value_a"] == "*"],
                   key=lambda r: -r["w1_mean"] if not math.isnan(r["w1_mean"]) else math.inf)
    out = []
    for rank, r in enumerate(whole, 1):
        out.append(_ranking_row(str(rank), r, f"{r['axis']} (all pairs)", spread(rows, step, r["axis"])))
        pairs = [p for p in pooled if p["axis"] == r["axis"] and p["value_a"] != "*"]
        if len(pairs) > 1:
            for p in sorted(pairs, key=lambda p: -p["w1_mean"] if not math.isnan(p["w1_mean"]) else math.inf):
                out.append(_ranking_row("", p, f"  {p['value_a']} ↔ {p['value_b']}", math.nan))
        elif len(pairs) == 1:
            out[-1][1] = f"{r['axis']}: {pairs[0]['value_a']} ↔ {pairs[0]['value_b']}"
    columns = ["rank", "source", "role", "pairs", "W1 mean", "W1 [min, max]", "max |dW| mean", "W1 slope (per step)",
               "spread over conditions"]
    return Table(columns, out, caption=f"Summary: deviation sources at step {step} pooled over every condition "
                                       "(whole-model weights), largest mean W1 first. Pooling mixes conditions whose "
                                       "distances can differ by orders of magnitude (spread = largest / smallest "
                                       "per-condition mean): the verdict above is per condition")


def _ranking_row(rank, r, label, spread_value):
    return [rank, label, r["role"] if rank else "", str(r["pairs"]), num(r["w1_mean"]),
            f"[{sig(r['w1_min'])}, {sig(r['w1_max'])}]", num(r["max_abs_mean"]), num(r["slope"]),
            num(spread_value, suffix="x") if not math.isnan(spread_value) else ""]
