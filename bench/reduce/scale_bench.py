#!/usr/bin/env python3
"""The reduce at model scale: 100 runs of a 7B-class model on 64 ranks, from `fastudy plan`'s estimate
with rates measured here, checked by a scaled simulation measured in the same run.

  1. The simulation: 100 imported runs (attention x precision x 5 data orders x 5 seeds, the grid of
     bench/reduce/plan_7b.toml) of a small model with fastudy's tensor layout (--d-model 256: 2.7M
     parameters, F32 safetensors), one step, reduced on 1, 2 and 4 ranks: rank 0's compute time and the
     peak RSS per rank, each against `fastudy plan --ranks N`'s estimate (aim 0.8-1.25x).
  2. The target: `fastudy plan bench/reduce/plan_7b.toml --ranks 64` (6.7B parameters, 100 runs, 500
     pairs): time per step and peak memory per rank, each rank with a core as fast as this machine's
     (aims: <= 10 min per step, <= 64 GiB per rank).
  3. The simulation scaled to the target: every term of the cost grows with the values per rank and
     run (P / N), so the measured time and share memory at N ranks times (6.7e9 / 64) / (P / N) is what
     the same code would take there; printed beside the plan's figure.

  scale_bench.py BUILD [--dir DIR] [--d-model 256] [--ranks 1,2,4]
Prints the rows of bench/run.sh's table (bench/table.py imports rows() from here).
"""
import argparse
import json
import os
import re
import struct
import subprocess
import tempfile

import numpy as np

from import_bench import GIB, load, timed_reduce

AXES = {"attention": ["baseline", "flash"], "precision": ["bf16", "fp32"], "data_seed": [1, 2, 3, 4, 5],
        "seed": [1, 2, 3, 4, 5]}
HERE = os.path.dirname(os.path.abspath(__file__))


def model_tensors(d, layers, vocab, ctx):
    """fastudy's GPT layout (src/train/model_params.cpp): (name, elements)."""
    t = [("tok_emb.weight", vocab * d), ("pos_emb.weight", ctx * d)]
    for i in range(layers):
        b = f"blocks.{i}."
        t += [(b + "ln1.weight", d), (b + "ln1.bias", d), (b + "attn.qkv.weight", 3 * d * d), (b + "attn.qkv.bias", 3 * d),
              (b + "attn.proj.weight", d * d), (b + "attn.proj.bias", d), (b + "ln2.weight", d), (b + "ln2.bias", d),
              (b + "mlp.fc.weight", 4 * d * d), (b + "mlp.fc.bias", 4 * d), (b + "mlp.proj.weight", 4 * d * d),
              (b + "mlp.proj.bias", d)]
    return t + [("ln_f.weight", d), ("ln_f.bias", d), ("lm_head.weight", vocab * d)]


def write_runs(root, tensors):
    n = sum(s for _, s in tensors)
    header, offset = {}, 0
    for name, size in tensors:
        header[name] = {"dtype": "F32", "shape": [size], "data_offsets": [offset, offset + 4 * size]}
        offset += 4 * size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    drift = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
    for a in AXES["attention"]:
        for p in AXES["precision"]:
            for ds in AXES["data_seed"]:
                for s in AXES["seed"]:
                    w = np.random.default_rng(s).standard_normal(n, dtype=np.float32) * np.float32(0.02)
                    w += drift * np.float32(1e-4 * ds + (1e-6 if a == "flash" else 0) + (1e-5 if p == "bf16" else 0))
                    folder = os.path.join(root, f"{a}-{p}-d{ds}-s{s}")
                    os.makedirs(folder, exist_ok=True)
                    with open(os.path.join(folder, "step_1000.safetensors"), "wb") as f:
                        f.write(struct.pack("<Q", len(text)))
                        f.write(text)
                        f.write(w.astype("<f4").tobytes())
    return n


def grid(root, out):
    return (f'[study]\nname = "scale"\nout = "{out}"\nphases = ["reduce"]\n'
            f'[import]\npath = "{root}/{{attention}}-{{precision}}-d{{data_seed}}-s{{seed}}/step_{{step}}.safetensors"\n'
            '[grid]\n' + "".join(f"{k} = {json.dumps(v)}\n" for k, v in AXES.items()) +
            '[axes.attention]\nbaseline = "baseline"\n')


def plan_estimate(build, toml, ranks, env, which="last"):
    """(seconds per step, peak bytes per rank, share bytes, the pairs line) from `fastudy plan --ranks N`."""
    r = subprocess.run([f"{build}/fastudy", "plan", toml, "--ranks", str(ranks)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"plan {toml} --ranks {ranks} failed: {(r.stdout + r.stderr).strip()[-600:]}")
    lines = [l for l in r.stdout.splitlines() if l.startswith("reduce estimate on")]
    line = lines[-1] if which == "last" else lines[0]
    unit = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}
    step = float(re.search(r": ([\d.e+]+) s per step", line).group(1))
    mem = re.search(r"peak memory ([\d.]+) (B|KiB|MiB|GiB|TiB)", line)
    share = re.search(r"shares ([\d.]+) (B|KiB|MiB|GiB|TiB)", line)
    pairs = next(l for l in r.stdout.splitlines() if l.startswith("reduce: "))
    return step, float(mem.group(1)) * unit[mem.group(2)], float(share.group(1)) * unit[share.group(2)], pairs


def measured(build, toml, out, ranks, env):
    """(rank 0's opening + computing time, the largest peak RSS of a rank, the most CPU time of a rank)."""
    got = timed_reduce(build, toml, out, ranks, env)
    return got["computed"], max(got["rss"]), max(got["cpu"] or [0])


def rows(build, d_model=256, workdir=None, ranks=(1, 2, 4)):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out_rows = []
    target_step, target_peak, target_share, target_pairs = plan_estimate(build, os.path.join(HERE, "plan_7b.toml"), 64, env,
                                                                         which="first")
    p_target = sum(s for _, s in model_tensors(4096, 32, 32000, 4096))
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        load_before = load()
        tensors = model_tensors(d_model, 2, 8 * d_model, d_model)
        n = write_runs(os.path.join(d, "runs"), tensors)
        toml = os.path.join(d, "grid.toml")
        with open(toml, "w") as f:
            f.write(grid(os.path.join(d, "runs"), os.path.join(d, "out")))
        scaled = {}
        for k in ranks:
            step, peak, share, _ = plan_estimate(build, toml, k, env)
            got_s, got_rss, got_cpu = measured(build, toml, os.path.join(d, "out"), k, env)
            label = f"scaled simulation, 100 runs x {n / 1e6:.2f}M params, {k} rank(s)"
            out_rows.append((f"{label}: CPU time (user + sys) of the busiest rank / rank 0's compute (wall)",
                             f"{got_cpu:.3g} s", f"{got_s:.3g} s", got_cpu / got_s, "-", True))
            out_rows.append((f"{label}: `fastudy plan` time estimate / measured compute", f"{step:.3g} s", f"{got_s:.3g} s",
                             step / got_s, "0.8 - 1.25", 0.8 <= step / got_s <= 1.25))
            out_rows.append((f"{label}: `fastudy plan` memory estimate / measured peak RSS", f"{peak / GIB:.2f} GiB",
                             f"{got_rss / GIB:.2f} GiB", peak / got_rss, "0.8 - 1.25", 0.8 <= peak / got_rss <= 1.25))
            # Ranks beyond this machine's cores share them: a rank's own compute is the measured time over
            # that share.
            own = got_s / max(1.0, k / (os.cpu_count() or 1))
            scaled[k] = (own * (p_target / 64) / (n / k), share * (p_target / 64) / (n / k))
        out_rows.append((f"7B x 100 runs on 64 ranks ({target_pairs.split(' (')[0][len('reduce: '):]}): plan's time per step, "
                         f"a core per rank (load average {load_before} before, {load()} after)", f"{target_step:.3g} s", "600 s",
                         target_step / 600, "<= 1 (10 min)", target_step <= 600))
        out_rows.append(("7B x 100 runs on 64 ranks: plan's peak memory per rank", f"{target_peak / GIB:.1f} GiB", "64 GiB",
                         target_peak / (64 * GIB), "<= 1", target_peak <= 64 * GIB))
        k = max(r for r in ranks if r <= (os.cpu_count() or 1))
        out_rows.append((f"7B x 100 runs on 64 ranks: the simulation on {k} rank(s) scaled by the values per rank (time per step)",
                         f"{scaled[k][0]:.3g} s", f"{target_step:.3g} s", scaled[k][0] / target_step, "0.8 - 1.25",
                         0.8 <= scaled[k][0] / target_step <= 1.25))
    return out_rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--ranks", default="1,2,4")
    args = ap.parse_args()
    for figure, ours, anchor, ratio, aim, met in rows(args.build, args.d_model, args.dir,
                                                      tuple(int(k) for k in args.ranks.split(","))):
        print(f"| {figure} | {ours} | {anchor} | {ratio:.3g}{'x' if aim != '-' else ''} | {aim} | {'yes' if met else 'no'} |")


if __name__ == "__main__":
    main()
