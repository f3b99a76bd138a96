"""Section 1, the verdict: the deviation sources ranked at the final step, the bound in words, and
whether the optimisation (the attention axis: flash vs baseline) stays within the accepted bounds.

Rule (stated in the report too): the optimisation is within the accepted bounds when its mean
whole-model W1 at the final checkpoint is no larger than the mean W1 of every accepted reference
source the grid contains. Accepted references are the factors the paper treats as harmless: a
change of init seed (axis `seed`) and a change of training precision (axis `precision`). The numbers
are ranking.csv's whole-axis rows ("*"), as computed by `fastudy reduce` (analysis/ranking.hpp).

The verdict also names the reading (attention precision policy, README "Readings") the study trained
with, from study.toml: [attention] policy, or the values of a `policy` grid axis; a custom policy is
named with the reading it starts from and its rounding mode.
"""

import math

from .doc import Bullets, Section, Table, num, sig, text
from .readers import RANKING_FLOATS

ATTENTION = "attention"
REFERENCES = (("seed", "a change of init seed"), ("precision", "a change of training precision"))
AXIS_WORDS = {
    "attention": "attention kernel",
    "seed": "init seed",
    "precision": "training precision",
    "init": "init scheme",
    "data_seed": "data order",
    "policy": "attention precision policy",
    "block_q": "query block size",
    "block_kv": "key/value block size",
    "loop_order": "attention loop order",
    "lr": "learning rate",
}


READINGS = {"pure": "every step in the format", "eager": "a framework-level re-implementation: each op in fp32, "
            "its output and flash's state between key/value tiles in the format",
            "mixed": "GPU kernels: fp32 accumulators, statistics and running O"}


def training_readings(data):
    """The reading(s) the study trained with, in words: ["`mixed` (GPU kernels: ...)"], or [] when
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
            out.append(f"custom policy `{name}` (from `{preset}`, {READINGS.get(preset, preset)}; rounding "
                       f"{c.get('rounding', 'nearest')})")
        else:
            out.append(f"`{name}` ({READINGS.get(name, 'unknown reading')})")
    return out


def reading_text(data):
    readings = training_readings(data)
    if not readings:
        return None
    return text(("Training ran attention under the reading " if len(readings) == 1 else
                 "Training ran attention under the readings ") + "; ".join(readings) +
                " (README \"Readings\"). The microbenchmark in section 2 shows how flash's error relative to "
                "baseline depends on the reading.", kind="note")


def ranking_rows(table):
    """ranking.csv rows with floats and ints parsed."""
    rows = []
    for r in table.rows:
        row = dict(r)
        for c in RANKING_FLOATS:
            row[c] = float(r[c]) if r.get(c, "") != "" else math.nan
        row["pairs"] = int(r["pairs"])
        row["step"] = int(r["step"])
        rows.append(row)
    return rows


def final_step(rows):
    return max(r["step"] for r in rows) if rows else None


def whole_axis_rows(rows, step):
    return [r for r in rows if r["step"] == step and r["value_a"] == "*"]


def pair_rows(rows, step, axis):
    return [r for r in rows if r["step"] == step and r["axis"] == axis and r["value_a"] != "*"]


NUMERIC_AXES = ("seed", "data_seed", "block_q", "block_kv", "lr")


def pair_words(row):
    """'flash vs baseline' for the attention pair (baseline, flash): the later value against the first
    (the change against the reference); numeric axes in grid order ('1 vs 2')."""
    if row["axis"] in NUMERIC_AXES:
        return f"{row['value_a']} vs {row['value_b']}"
    return f"{row['value_b']} vs {row['value_a']}"


def axis_pairs_words(rows, step, axis):
    pairs = pair_rows(rows, step, axis)
    if not pairs:
        return axis
    if len(pairs) > 3:
        return f"{len(pairs)} value pairs of {axis}"
    return ", ".join(pair_words(p) for p in pairs)


def axis_values(rows, step, axis):
    """The axis's values in the order its value pairs name them."""
    values = []
    for p in pair_rows(rows, step, axis):
        for v in (p["value_a"], p["value_b"]):
            if v not in values:
                values.append(v)
    return values


def source_words(rows, step, axis):
    """'a change of init seed (seed 1 vs 2)', 'bf16 vs fp32 training (precision)', or with several
    value pairs 'a change of training precision (fp32, fp16, bf16)'."""
    pairs = pair_rows(rows, step, axis)
    if len(pairs) > 1:
        values = ", ".join(axis_values(rows, step, axis))
        if axis == "seed":
            return f"a change of init seed (seeds {values})"
        if axis == "precision":
            return f"a change of training precision ({values})"
        return f"a change of {AXIS_WORDS.get(axis, axis)} ({axis} {values})"
    words = axis_pairs_words(rows, step, axis)
    if axis == "seed":
        return f"a change of init seed (seed {words})"
    if axis == "precision":
        return f"{words} training (precision)"
    return f"{AXIS_WORDS.get(axis, axis)} {words} ({axis})"


def _headline(ref, rows, step):
    """'4.2x smaller than bf16 vs fp32 training (precision)' for one reference source."""
    ratio = ref["ratio_to_attention"]
    what = source_words(rows, step, ref["axis"])
    key = f"verdict.{ref['axis']}"
    if math.isnan(ratio):
        return [f"not comparable with {what} (one side has no pairs at step {step})"]
    if math.isinf(ratio):
        return [f"zero, while {what} moves the weights"]
    if ratio >= 1:
        return [num(ratio, key + ".ratio", suffix="x"), f" smaller than {what}"]
    return [num(1.0 / ratio, key + ".inverse_ratio", suffix="x"), f" LARGER than {what}"]


def _detail(ref, rows, step):
    """The evidence behind one headline comparison: the reference's W1 and the ratio's interval."""
    key = f"verdict.{ref['axis']}"
    parts = [f"{source_words(rows, step, ref['axis'])}: W1 = ", num(ref["w1_mean"], key + ".w1_mean"),
             " [", num(ref["w1_min"], key + ".w1_min"), "–", num(ref["w1_max"], key + ".w1_max"),
             f"] over {ref['pairs']} pairs; ratio to attention ", num(ref["ratio_to_attention"], key + ".ratio_detail"),
             ", 95% bootstrap interval [", num(ref["ratio_lo"], key + ".ratio_lo"), ", ",
             num(ref["ratio_hi"], key + ".ratio_hi"), "]"]
    if ref["ratio_lo"] <= 1.0 <= ref["ratio_hi"]:
        parts.append(" (the interval contains 1: these pairs cannot tell the two apart)")
    pairs = pair_rows(rows, step, ref["axis"])
    if len(pairs) > 1:
        parts.append("; per value pair: ")
        for i, p in enumerate(sorted(pairs, key=lambda p: -p["ratio_to_attention"])):
            parts += [", " if i else "", f"{pair_words(p)} ", num(p["ratio_to_attention"], suffix="x")]
    return parts


def build(data, status_summary):
    """The verdict section. status_summary: the phases' state in words (what exists, what is missing)."""
    sec = Section("1. Verdict", "verdict")
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
    whole = sorted(whole_axis_rows(rows, step), key=lambda r: -r["w1_mean"] if not math.isnan(r["w1_mean"]) else math.inf)
    by_axis = {r["axis"]: r for r in whole}
    att = by_axis.get(ATTENTION)
    refs = [(by_axis[a], words) for a, words in REFERENCES if a in by_axis]

    if att is None:
        sec.blocks.append(text("The grid has no attention axis, so there is no optimisation to bound; the table "
                               "below only ranks the grid's axes as deviation sources.", kind="lead"))
    else:
        lead = [f"{axis_pairs_words(rows, step, ATTENTION)}: W1 = ", num(att["w1_mean"], "verdict.attention.w1_mean"),
                " [", num(att["w1_min"], "verdict.attention.w1_min"), "–", num(att["w1_max"], "verdict.attention.w1_max"),
                f"] (whole-model 1-D Wasserstein distance, mean [min–max] over {att['pairs']} pairs at step {step})"]
        for i, (ref, _) in enumerate(refs):
            lead += ["; " if i == 0 else ", "] + _headline(ref, rows, step)
        lead.append(".")
        sec.blocks.append(text(*lead, kind="lead"))
        sec.blocks.append(_verdict_text(att, refs))
        if refs:
            sec.blocks.append(Bullets([_detail(ref, rows, step) for ref, _ in refs]))
        sec.blocks.append(text(
            "Rule: the optimisation is within the accepted bounds when its mean whole-model W1 at the final "
            "checkpoint is no larger than that of each accepted reference source present in the grid. Accepted "
            "references (the factors the paper treats as harmless): " +
            "; ".join(f"{w} (axis `{a}`)" for a, w in REFERENCES) + ". Present in this grid: " +
            (", ".join(f"`{r['axis']}`" for r, _ in refs) if refs else "none") +
            ". W1 is measured between the weights of two variants that differ in that axis only.", kind="note"))
    reading = reading_text(data)
    if reading is not None:
        sec.blocks.append(reading)

    sec.blocks.append(ranking_table(rows, step, whole))
    notes = list(data.ranking.notes)
    if notes:
        sec.blocks.append(Bullets([f"note from reduce: {n}" for n in notes]))
    if status_summary:
        sec.blocks.append(text("State of the study:"))
        sec.blocks.append(Bullets(status_summary))
    return sec


def _verdict_text(att, refs):
    if not refs:
        return text("Cannot judge the bound: the grid has no accepted reference axis (seed or precision). "
                    "Add one to [grid] so the optimisation's deviation has something to be compared with.", kind="bad")
    over = [r["axis"] for r, _ in refs if not (att["w1_mean"] <= r["w1_mean"])]
    if not over:
        return text("Within the accepted bounds: the optimisation moves the weights no more than " +
                    " and no more than ".join(w for _, w in refs) + ".", kind="good")
    return text("Outside the accepted bounds: the optimisation moves the weights more than " +
                " and ".join(w for r, w in refs if r["axis"] in over) + ".", kind="bad")


def ranking_table(rows, step, whole):
    """Every source (whole axis, then its value pairs) at the final step, largest mean W1 first."""
    out = []
    for rank, r in enumerate(whole, 1):
        out.append(_ranking_row(str(rank), r, f"{r['axis']} (all pairs)"))
        pairs = pair_rows(rows, step, r["axis"])
        if len(pairs) > 1:
            for p in sorted(pairs, key=lambda p: -p["w1_mean"] if not math.isnan(p["w1_mean"]) else math.inf):
                out.append(_ranking_row("", p, f"  {pair_words(p)}"))
        elif len(pairs) == 1:
            out[-1][1] = f"{r['axis']}: {pair_words(pairs[0])}"
    columns = ["rank", "source", "pairs", "W1 mean", "W1 [min, max]", "max |dW| mean", "W1 slope (per step)",
               "W1 / attention W1 [95% CI]"]
    return Table(columns, out, caption=f"Deviation sources at step {step} (whole-model weights), largest mean W1 first")


def _ranking_row(rank, r, label):
    ci = f"{sig(r['ratio_to_attention'])} [{sig(r['ratio_lo'])}, {sig(r['ratio_hi'])}]"
    return [rank, label, str(r["pairs"]), num(r["w1_mean"]), f"[{sig(r['w1_min'])}, {sig(r['w1_max'])}]",
            num(r["max_abs_mean"]), num(r["slope"]), ci]
