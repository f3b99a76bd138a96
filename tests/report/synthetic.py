"""A synthetic fastudy study written file by file in the layouts the phases write (jobs/*.cpp), so the
report can be tested in well under a second per case, including what a real tiny run rarely shows:
several sequence lengths and block sizes, loss spikes, skipped fp16 steps, a diverged variant, shadow
attention, a variant left out of reduce.

Grid: attention [baseline, flash] x precision [fp32, bf16] x seed [1, 2] (8 variants).
Whole-model W1 between two variants = the sum of a per-axis contribution for every axis they differ
in, growing linearly with the step; `attention_w1` sets the optimisation's contribution.
"""

import itertools
import math
from pathlib import Path

import h5py
import numpy as np

GRID = [("attention", ["baseline", "flash"]), ("precision", ["fp32", "bf16"]), ("seed", ["1", "2"])]
STEPS = [10, 20]
TENSORS = ["tok_emb.weight", "blocks.0.attn.qkv.weight", "lm_head.weight"]
PROVENANCE = ("# fastudy 0.1.0 (git 0123456789ab)\n# command: fastudy {phase} tiny.toml\n# grid: tiny.toml\n"
              "# config_hash: 00000000deadbeef\n# ranks: 2\n# hosts: node1,node2\n# started: 2026-01-01T00:00:00Z\n")


def variants():
    out = []
    for combo in itertools.product(*[v for _, v in GRID]):
        axes = list(zip([a for a, _ in GRID], combo))
        vid = "-".join(("s" + v) if a == "seed" else v for a, v in axes)
        out.append((vid, axes))
    return out


def write_study_toml(out, phases=("microbench", "train", "reduce", "report")):
    grid = "\n".join(f"{a} = [ {', '.join(repr(v) if a != 'seed' else v for v in vals)} ]" for a, vals in GRID)
    out.joinpath("study.toml").write_text(
        "[study]\nname = 'synthetic'\nout = 'out/synthetic'\nphases = [ " + ", ".join(f"'{p}'" for p in phases) +
        " ]\n\n[train]\nsteps = 20\ncheckpoint_every = 10\nshadow_attention = true\n\n[grid]\n" + grid + "\n")
    out.joinpath("provenance.txt").write_text(PROVENANCE.format(phase="train"))


# Readings sweep: flash/baseline ratio (of max |d| and rel_l2) per reading at `tiles` KV tiles.
READING_RATIO = {"pure": lambda tiles: 0.2, "eager": lambda tiles: 1 + 0.04 * tiles, "mixed": lambda tiles: 0.95}


def write_microbench(out, sweeps=("formats", "seq_len", "block_area", "readings"), legacy=False,
                     reading_ratio=READING_RATIO):
    """microbench.csv; legacy: the columns before issue 12 (no rounding, sram, tile_rule, rmse, mean_signed,
    max_ulp, repeated_max_rows)."""
    cols = ("sweep,algorithm,pass,format,policy,seq_len,head_dim,block_q,block_kv,loop_order,causal,trial,"
            "distribution,max_abs,mean_abs,std_abs,rel_l2,rescales_per_row,tiles_kv")
    if not legacy:
        cols = ("sweep,algorithm,pass,format,policy,rounding,seq_len,head_dim,block_q,block_kv,sram,tile_rule,"
                "loop_order,causal,trial,distribution,max_abs,mean_abs,std_abs,rel_l2,rmse,mean_signed,max_ulp,"
                "repeated_max_rows,rescales_per_row,tiles_kv")
    unit = {"fp64": 2.0 ** -53, "fp32": 2.0 ** -24, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
    lines = [PROVENANCE.format(phase="microbench") + cols]

    def add(sweep, ps, fmt, policy, n, bq, bkv, order, trial, ratio=None):
        tiles = math.ceil(n / bkv)
        base = unit[fmt] * math.sqrt(n) * (1 + 0.1 * trial)
        flash = base * (ratio if ratio is not None else (1 + 0.5 * tiles) * (1.5 if order == "kv_outer" else 1.0))
        for alg, err, resc, tk in (("flash", flash, tiles - 1, tiles), ("baseline", base, 0, 1),
                                   ("flash_vs_baseline", flash * 0.9, tiles - 1, tiles)):
            if legacy:
                lines.append(f"{sweep},{alg},{ps},{fmt},{policy},{n},16,{bq},{bkv},{order},0,{trial},normal,"
                             f"{err!r},{err / 5!r},{err / 7!r},{err / 3!r},{resc},{tk}")
            else:
                lines.append(f"{sweep},{alg},{ps},{fmt},{policy},nearest,{n},16,{bq},{bkv},0,blocks,{order},0,"
                             f"{trial},normal,{err!r},{err / 5!r},{err / 7!r},{err / 3!r},{err / 4!r},"
                             f"{-err / 50!r},{err / unit[fmt]!r},0.01,{resc},{tk}")

    if "formats" in sweeps:
        for ps, fmt, policy, order, trial in itertools.product(("forward", "backward"), unit, ("pure", "mixed"),
                                                               ("kv_outer", "q_outer"), (0, 1)):
            add("formats", ps, fmt, policy, 64, 16, 16, order, trial)
    if "seq_len" in sweeps:
        for fmt, n, trial in itertools.product(("fp16", "bf16"), (32, 64, 128, 256), (0, 1)):
            add("seq_len", "forward", fmt, "pure", n, 16, 16, "q_outer", trial)
    if "block_area" in sweeps:
        for fmt, (bq, bkv), order in itertools.product(("fp16", "bf16"),
                                                       ((8, 8), (16, 16), (32, 32), (8, 32), (32, 8)),
                                                       ("kv_outer", "q_outer")):
            add("block_area", "forward", fmt, "pure", 128, bq, bkv, order, 0)
    if "readings" in sweeps:
        for fmt, policy, bkv in itertools.product(("fp16", "bf16"), ("pure", "eager", "mixed"), (256, 64, 16, 4)):
            add("readings", "forward", fmt, policy, 1024, 64, bkv, "kv_outer", 0,
                ratio=reading_ratio[policy](math.ceil(1024 / bkv)))
    out.joinpath("microbench.csv").write_text("\n".join(lines) + "\n")


def write_training(out, states=None, diverged="flash-bf16-s2"):
    """status.csv and per-variant logs; `states` overrides the state of some variants (id -> state)."""
    states = states or {}
    rows = ["variant,state,step,loss,wall_time_s,reason"]
    for i, (vid, axes) in enumerate(variants()):
        state = states.get(vid, "diverged" if vid == diverged else "done")
        last = 20 if state == "done" else (14 if state == "diverged" else 8 if state == "running" else 0)
        vdir = out / "variants" / vid
        vdir.mkdir(parents=True, exist_ok=True)
        log = ["step,loss,grad_norm,lr,loss_scale,skipped,spike,tokens_per_s"]
        loss = math.nan
        for s in range(1, last + 1):
            loss = 3.5 - 0.04 * s + 0.01 * i + (0.8 if s == 12 else 0.0)
            if state == "diverged" and s == last:
                loss = math.nan
            skipped = 1 if dict(axes)["precision"] == "bf16" and s in (3, 4) else 0
            log.append(f"{s},{loss},{1.5 + 0.01 * s},{0.003},{65536.0 if skipped else 1.0},{skipped},"
                       f"{1 if s == 12 else 0},{20000.0}")
        vdir.joinpath("train_log.csv").write_text("\n".join(log) + "\n")
        if last:
            shadow = ["step,layer,max_abs,mean_abs"] + [f"{s},{layer},{1e-4 * s * (layer + 1)!r},{1e-5 * s!r}"
                                                       for s in range(1, last + 1) for layer in (0, 1)]
            vdir.joinpath("shadow.csv").write_text("\n".join(shadow) + "\n")
        reason = '"loss is NaN at step 14"' if state == "diverged" else ""
        loss_text = "" if state in ("queued",) or math.isnan(loss) else repr(loss)
        rows.append(f"{vid},{state},{last},{loss_text},{1.5 + i / 10!r},{reason}")
    out.joinpath("status.csv").write_text("\n".join(rows) + "\n")


def contribution(axis, attention_w1):
    return {"attention": attention_w1, "precision": 3e-5, "seed": 4e-4}[axis]


def matrices(vs, step, attention_w1, scale=1.0):
    n = len(vs)
    w1 = np.zeros((n, n))
    mx = np.zeros((n, n))
    for i, j in itertools.product(range(n), range(n)):
        if i == j:
            continue
        a, b = dict(vs[i][1]), dict(vs[j][1])
        diff = sum(contribution(k, attention_w1) for k in a if a[k] != b[k]) * step / 20 * scale
        jitter = 1 + 0.05 * ((i * 7 + j * 7) % 5)
        w1[i, j] = diff * jitter
        mx[i, j] = diff * jitter * 300
    return {"w1": w1, "w2": w1 * 1.3, "max_abs": mx, "mean_abs": w1 * 0.9, "rel_l2": w1 * 10}


def write_reduce(out, attention_w1=1e-5, left_out=("flash-bf16-s2: loss is NaN at step 14",)):
    """deviation.h5, deviation.csv, ranking.csv, twins.csv over the variants not left out."""
    left_ids = {l.split(":")[0] for l in left_out}
    vs = [v for v in variants() if v[0] not in left_ids]
    per_step = {s: {t: matrices(vs, s, attention_w1, scale=1 + k) for k, t in enumerate(TENSORS + ["model"])}
                for s in STEPS}
    with h5py.File(out / "deviation.h5", "w") as f:
        f.attrs["format"] = "fastudy-deviation/1"
        f.attrs["provenance"] = PROVENANCE.format(phase="reduce")
        f.attrs["config_hash"] = "00000000deadbeef"
        f.attrs["variants"] = "".join(v + "\n" for v, _ in vs)
        f.attrs["variant_axes"] = "".join(",".join(f"{a}={x}" for a, x in axes) + "\n" for _, axes in vs)
        f.attrs["left_out"] = "".join(l + "\n" for l in left_out)
        for s, tensors in per_step.items():
            g = f.create_group(f"steps/{s}")
            g.attrs["step"] = np.int64(s)
            for t, mats in tensors.items():
                tg = g.create_group(t)
                for m, a in mats.items():
                    tg.create_dataset(m, data=a)
    lines = [PROVENANCE.format(phase="reduce") + "step,tensor,variant_a,variant_b,w1,w2,max_abs,mean_abs,rel_l2"]
    for s, tensors in per_step.items():
        for t, mats in tensors.items():
            for i, j in itertools.combinations(range(len(vs)), 2):
                vals = ",".join(repr(float(mats[m][i, j])) for m in ("w1", "w2", "max_abs", "mean_abs", "rel_l2"))
                lines.append(f"{s},{t},{vs[i][0]},{vs[j][0]},{vals}")
    out.joinpath("deviation.csv").write_text("\n".join(lines) + "\n")
    write_ranking(out, vs, per_step)
    out.joinpath("twins.csv").write_text(PROVENANCE.format(phase="reduce") + "variant,twin,precision,step,w1,max_abs\n")


def write_ranking(out, vs, per_step):
    rows = [PROVENANCE.format(phase="reduce") +
            "axis,value_a,value_b,pairs,step,w1_mean,w1_min,w1_max,max_abs_mean,slope,ratio_to_attention,ratio_lo,ratio_hi"]
    stats = {}
    for axis, values in GRID:
        pairs = [(i, j) for i, j in itertools.combinations(range(len(vs)), 2)
                 if [k for k in dict(vs[i][1]) if dict(vs[i][1])[k] != dict(vs[j][1])[k]] == [axis]]
        for s in STEPS:
            w = np.array([per_step[s]["model"]["w1"][i, j] for i, j in pairs])
            m = np.array([per_step[s]["model"]["max_abs"][i, j] for i, j in pairs])
            stats[axis, s] = (len(pairs), float(w.mean()), float(w.min()), float(w.max()), float(m.mean()))
    for axis, values in GRID:
        means = [stats[axis, s][1] for s in STEPS]
        slope = (means[-1] - means[0]) / (STEPS[-1] - STEPS[0])
        for label in (("*", "*"), (values[0], values[1])):
            for s in STEPS:
                n, mean, lo, hi, mx = stats[axis, s]
                ratio = mean / stats["attention", s][1]
                rlo, rhi = (1.0, 1.0) if axis == "attention" and label[0] == "*" else (ratio * 0.8, ratio * 1.25)
                rows.append(f"{axis},{label[0]},{label[1]},{n},{s},{mean!r},{lo!r},{hi!r},{mx!r},{slope!r},{ratio!r},"
                            f"{rlo!r},{rhi!r}")
    rows.append("# note: left out flash-bf16-s2: loss is NaN at step 14")
    out.joinpath("ranking.csv").write_text("\n".join(rows) + "\n")


def full_study(out, attention_w1=1e-5):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_study_toml(out)
    write_microbench(out)
    write_training(out)
    write_reduce(out, attention_w1)
    return out
