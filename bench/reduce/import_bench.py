#!/usr/bin/env python3
"""Reduce of an imported study at GPT-2 scale, against a physical anchor measured in the same run, and
`fastudy plan`'s estimate of it against what it took.

Writes 8 runs (attention math/flash x precision fp32/bf16 x seed 1/2) x 2 steps of synthetic
safetensors checkpoints with GPT-2 small's tensors (124.4M parameters at the default size; HF names,
transformer.h.N.*), as F32 (and BF16 with --dtypes fp32,bf16) files, then for each dtype, side by side:
  - the anchor (bench/reduce/import_anchor): reading every file once from the page cache plus one
    radix sort of as many fp32 values as the files hold; and the same work in one process against two
    processes at once on half the files each (`import_anchor --processes 1|2`): how this machine's
    memory-bound read and sort scale to two cores (the two share memory, caches and host as 2 ranks do);
  - `fastudy reduce` on 1, 2 (and, with --ranks 1,2,4, 4) ranks, each into a fresh study folder,
    interleaved, best of --repeats: wall time, peak RSS and CPU time (user + sys) per rank
    (/usr/bin/time -v), minor page faults, and rank 0's own account of its time in the steps' work (`-v`:
    start to end, waits for reads included);
  - `fastudy plan --ranks N` right before each reduce: its estimate of the reduce's compute time and
    peak memory per rank, compared with the measured ones.
Aims: 2 ranks within 2x of the anchor; 2 ranks at least 1.7x faster than 1; peak memory per rank at
most 1.1x the budget (two checkpoints as fp32 plus the per-tensor working set: every run's values of
the largest tensor and their sorted copy); the plan's estimates within 0.8-1.25x of the measured.
The machine's load (`uptime`) before and after is printed with the rows: on a shared machine the wall
times, and the rank scaling with them, move with what else runs.

With --against OTHER (another build folder, say one of the commit before a change), every reduce runs
with both builds, OTHER's right before BUILD's on the same files, and rows compare them: each one's
wall time and 1 rank / 2 ranks, peak RSS and minor page faults side by side.

Each plan and the reduce after it start after --settle seconds idle (default 20): on a virtual machine
whose freed memory goes back to its host (Linux's free page reporting), what the reduce before freed
comes back at memory speed for some seconds, and the plan would time its fresh pages on it; a user's
plan and reduce start on a machine that has been idle. The plan's row shows the fresh pages' rate it
measured.

  import_bench.py BUILD [--dir DIR] [--d-model 768] [--layers 12] [--vocab 50257] [--ctx 1024]
                        [--dtypes fp32] [--ranks 1,2,4] [--repeats 1] [--against OTHER] [--settle 20]
Prints the rows of bench/run.sh's table (bench/table.py imports rows() from here).
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time

import numpy as np

RUNS = [(a, p, s) for a in ("math", "flash") for p in ("fp32", "bf16") for s in (1, 2)]
STEPS = (1000, 2000)
GIB = 2 ** 30


def gpt2_tensors(d, layers, vocab, ctx):
    """(name, shape) of GPT-2's parameters in the order of its state dict."""
    t = [("transformer.wte.weight", (vocab, d)), ("transformer.wpe.weight", (ctx, d))]
    for i in range(layers):
        h = f"transformer.h.{i}."
        t += [(h + "ln_1.weight", (d,)), (h + "ln_1.bias", (d,)),
              (h + "attn.c_attn.weight", (d, 3 * d)), (h + "attn.c_attn.bias", (3 * d,)),
              (h + "attn.c_proj.weight", (d, d)), (h + "attn.c_proj.bias", (d,)),
              (h + "ln_2.weight", (d,)), (h + "ln_2.bias", (d,)),
              (h + "mlp.c_fc.weight", (d, 4 * d)), (h + "mlp.c_fc.bias", (4 * d,)),
              (h + "mlp.c_proj.weight", (4 * d, d)), (h + "mlp.c_proj.bias", (d,))]
    return t + [("transformer.ln_f.weight", (d,)), ("transformer.ln_f.bias", (d,))]


def bf16_bytes(x):
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def write_safetensors(path, tensors, dtype, values):
    header, offset, width = {}, 0, 4 if dtype == "fp32" else 2
    for name, shape in tensors:
        size = int(np.prod(shape)) * width
        header[name] = {"dtype": "F32" if dtype == "fp32" else "BF16", "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(values.astype("<f4").tobytes() if dtype == "fp32" else bf16_bytes(values))


def write_runs(root, tensors, dtype):
    """Every run's checkpoint at every step; values: the seed's start, a drift along the step shared by
    every run, and small nudges for flash and for bf16."""
    n = sum(int(np.prod(s)) for _, s in tensors)
    drift = np.random.default_rng(100).standard_normal(n, dtype=np.float32)
    nudge = np.random.default_rng(200).standard_normal(n, dtype=np.float32)
    files = []
    for seed in (1, 2):
        base = np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * np.float32(0.02)
        for a, p, s in RUNS:
            if s != seed:
                continue
            scale = np.float32((1e-6 if a == "flash" else 0) + (1e-5 if p == "bf16" else 0))
            for step in STEPS:
                w = base + drift * np.float32(1e-7 * step) + nudge * (scale * np.float32(step / 1000))
                folder = os.path.join(root, f"{a}-{p}-s{s}")
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, f"step_{step}.safetensors")
                write_safetensors(path, tensors, dtype, w)
                files.append(path)
    return files, n


def grid(root, out):
    return (f'[study]\nname = "bench"\nout = "{out}"\nphases = ["reduce"]\n'
            f'[import]\npath = "{root}/{{attention}}-{{precision}}-s{{seed}}/step_{{step}}.safetensors"\n'
            '[grid]\nattention = ["math", "flash"]\nprecision = ["fp32", "bf16"]\nseed = [1, 2]\n'
            '[axes.attention]\nbaseline = "math"\n')


def mpi(ranks):
    return ["mpirun", "-n", str(ranks), "--oversubscribe"] if ranks > 1 else []


def timed_reduce(build, toml, out, ranks, env):
    """One reduce into a fresh folder: {wall, rss: [bytes per rank], faults, computed (rank 0's time in
    the steps' work, start to end, from -v: what `fastudy plan` estimates), cpu: [user + sys per rank]}."""
    shutil.rmtree(out, ignore_errors=True)
    # Each rank's /usr/bin/time report goes to a file of its own (ranks writing to one pipe can cut
    # each other's lines).
    times = f"{out}.time"
    shutil.rmtree(times, ignore_errors=True)
    os.makedirs(times)
    report = os.path.join(times, "rank-${OMPI_COMM_WORLD_RANK:-0}")
    cmd = mpi(ranks) + ["sh", "-c", f'exec /usr/bin/time -v -o "{report}" "$@"', "sh", f"{build}/fastudy", "reduce",
                        toml, "-v"]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise RuntimeError(f"reduce on {ranks} rank(s) failed: {(r.stdout + r.stderr).strip()[-600:]}")
    reports = ""
    for name in sorted(os.listdir(times)):
        with open(os.path.join(times, name)) as f:
            reports += f.read()
    shutil.rmtree(times, ignore_errors=True)
    if len(re.findall(r"Maximum resident set size", reports)) != ranks:
        raise RuntimeError(f"reduce on {ranks} rank(s): expected {ranks} /usr/bin/time reports, got: {reports[-600:]}")
    text = r.stdout + r.stderr + reports
    rss = [int(k) * 1024 for k in re.findall(r"Maximum resident set size \(kbytes\): (\d+)", text)]
    faults = sum(int(k) for k in re.findall(r"Minor \(reclaiming a frame\) page faults: (\d+)", text))
    user = [float(k) for k in re.findall(r"User time \(seconds\): ([\d.]+)", text)]
    system = [float(k) for k in re.findall(r"System time \(seconds\): ([\d.]+)", text)]
    m = re.search(r"checked the files for [\d.e+-]+ s, computed for ([\d.e+-]+) s", text)
    computed = float(m.group(1)) if m else None
    return {"wall": wall, "rss": rss, "faults": faults, "computed": computed, "cpu": [u + s for u, s in zip(user, system)]}


def planned(build, toml, ranks, env):
    """`fastudy plan --ranks N`'s reduce estimate: (seconds in all, peak bytes per rank, the fresh pages'
    rate it measured in GB/s), for the ranks on this machine (its cores shared when there are more ranks
    than cores)."""
    r = subprocess.run([f"{build}/fastudy", "plan", toml, "--ranks", str(ranks)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"plan --ranks {ranks} failed: {(r.stdout + r.stderr).strip()[-600:]}")
    lines = [l for l in r.stdout.splitlines() if l.startswith("reduce estimate on")]
    line = lines[-1]  # "all on this machine's N cores" when there are more ranks than cores
    total = re.search(r" s per step, ([\d.]+) s", line)
    step = re.search(r": ([\d.e+]+) s per step", line)
    steps = len(STEPS)
    seconds = float(total.group(1)) if total else float(step.group(1)) * steps
    mem = re.search(r"peak memory ([\d.]+) (KiB|MiB|GiB|TiB)", line)
    unit = {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40}[mem.group(2)]
    fresh = re.search(r"fresh pages ([\d.e+-]+) GB/s", r.stdout)
    return seconds, float(mem.group(1)) * unit, float(fresh.group(1)) if fresh else float("nan")


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def rows(build, d_model=768, layers=12, vocab=50257, ctx=1024, dtypes=("fp32",), repeats=1, workdir=None,
         ranks=(1, 2, 4), against=None, settle=20.0):
    """[(figure, ours, anchor, ratio, aim, met)] for bench/run.sh's table."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    tensors = gpt2_tensors(d_model, layers, vocab, ctx)
    largest = max(int(np.prod(s)) for _, s in tensors)
    out_rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        for dtype in dtypes:
            load_before = load()
            root = os.path.join(d, "runs-" + dtype)
            files, n = write_runs(root, tensors, dtype)
            toml = os.path.join(d, f"grid-{dtype}.toml")
            with open(toml, "w") as f:
                f.write(grid(root, os.path.join(d, "out-" + dtype)))
            a = subprocess.run([f"{build}/bench/reduce/import_anchor", "4" if dtype == "fp32" else "2"] + files,
                               capture_output=True, text=True, check=True).stdout
            anchor = float(re.search(r"read_s (\S+)", a).group(1)) + float(re.search(r"sort_s (\S+)", a).group(1))
            # What two cores give this machine on the anchor's work: one process on every file against two
            # at once on half the files each, started together (interleaved, best of two). The two share
            # the memory, the caches and the host as two ranks do; the reduce's sorts are mostly of
            # tensors that fit the caches, so its scaling can pass this one.
            alone, together = [], []
            for _ in range(2):
                for procs, into in ((1, alone), (2, together)):
                    t = subprocess.run([f"{build}/bench/reduce/import_anchor", "--processes", str(procs),
                                        "4" if dtype == "fp32" else "2"] + files,
                                       capture_output=True, text=True, check=True).stdout
                    into.append(float(re.search(r"together_s (\S+)", t).group(1)))
            best, estimate, other = {}, {}, {}
            for _ in range(repeats):
                for k in ranks:
                    if against:
                        got = timed_reduce(against, toml, os.path.join(d, "out-" + dtype), k, env)
                        if k not in other or got["wall"] < other[k]["wall"]:
                            other[k] = got
                    # The memory the reduce before freed goes back to the host over some seconds on a guest
                    # with free page reporting; until then its first writes run at memory speed, later at the
                    # host's. The plan (and the reduce after it) run as a user's do: on a machine that has
                    # been idle --settle seconds.
                    time.sleep(settle)
                    planned_k = planned(build, toml, k, env)
                    got = timed_reduce(build, toml, os.path.join(d, "out-" + dtype), k, env)
                    if k not in best or got["wall"] < best[k]["wall"]:
                        best[k], estimate[k] = got, planned_k  # the plan made right before the best reduce
            label = f"{len(RUNS)} runs x {len(STEPS)} steps x {n / 1e6:.1f}M params, {dtype}"
            one, two = best[1]["wall"], best[2]["wall"]
            out_rows.append((f"import reduce, {label}: 2 ranks vs anchor (read once + radix sort)", f"{two:.3g} s",
                             f"{anchor:.3g} s", two / anchor, "<= 2", two / anchor <= 2))
            out_rows.append((f"import reduce, {label}: 1 rank vs 2 ranks (wall)", f"{two:.3g} s", f"{one:.3g} s",
                             one / two, ">= 1.7", one / two >= 1.7))
            out_rows.append((f"import reduce, {label}: the anchor's work in one process vs in two at once, half the "
                             f"files each (how this machine's read and sort scale to two cores; not a bound on the reduce)", f"{min(together):.3g} s",
                             f"{min(alone):.3g} s", min(alone) / min(together), "-", True))
            budget = 2 * n * 4 + 2 * len(RUNS) * largest * 4
            peak = max(best[2]["rss"] or [0])
            out_rows.append((f"import reduce, {label}: peak RSS per rank (2 ranks) vs 2 checkpoints + working set",
                             f"{peak / GIB:.2f} GiB", f"{budget / GIB:.2f} GiB", peak / budget, "<= 1.1",
                             peak / budget <= 1.1))
            for k in ranks:
                est_s, est_bytes, fresh = estimate[k]
                got = best[k]
                if got["computed"]:
                    out_rows.append((f"import reduce, {label}: `fastudy plan` time estimate / measured, {k} rank(s) "
                                     f"(the plan's fresh pages {fresh:.3g} GB/s)",
                                     f"{est_s:.3g} s", f"{got['computed']:.3g} s", est_s / got["computed"], "0.8 - 1.25",
                                     0.8 <= est_s / got["computed"] <= 1.25))
                peak_k = max(got["rss"] or [0])
                out_rows.append((f"import reduce, {label}: `fastudy plan` memory estimate / measured peak RSS, {k} rank(s)",
                                 f"{est_bytes / GIB:.2f} GiB", f"{peak_k / GIB:.2f} GiB", est_bytes / peak_k,
                                 "0.8 - 1.25", 0.8 <= est_bytes / peak_k <= 1.25))
            for k in ranks:
                cpu = best[k]["cpu"] or [0]
                out_rows.append((f"import reduce, {label}: {k} rank(s), CPU time (user + sys) of the busiest rank / "
                                 f"wall; ratio: the cores the ranks had (CPU of all ranks / wall)", f"{max(cpu):.3g} s",
                                 f"{best[k]['wall']:.3g} s", sum(cpu) / best[k]["wall"], "-", True))
                out_rows.append((f"import reduce, {label}: {k} rank(s), wall / rank 0's compute / minor page faults "
                                 f"(load average {load_before} before, {load()} after)", f"{best[k]['wall']:.3g} s",
                                 f"{best[k]['computed'] or 0:.3g} s", best[k]["faults"], "-", True))
            if against:
                for k in ranks:
                    a, b = other[k], best[k]
                    out_rows.append((f"import reduce, {label}: {k} rank(s), wall: this build / {against} (interleaved, "
                                     f"best of {repeats}); their peak RSS per rank {max(b['rss']) / GIB:.2f} / "
                                     f"{max(a['rss']) / GIB:.2f} GiB, minor page faults {b['faults']} / {a['faults']}",
                                     f"{b['wall']:.3g} s", f"{a['wall']:.3g} s", b["wall"] / a["wall"], "-", True))
                if 1 in other and 2 in other:
                    out_rows.append((f"import reduce, {label}: 1 rank vs 2 ranks (wall), {against}",
                                     f"{other[2]['wall']:.3g} s", f"{other[1]['wall']:.3g} s",
                                     other[1]["wall"] / other[2]["wall"], ">= 1.7", other[1]["wall"] / other[2]["wall"] >= 1.7))
            shutil.rmtree(root, ignore_errors=True)
    return out_rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--dir", default=None, help="where to write the runs (default: the system's temp folder)")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--dtypes", default="fp32")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--against", default=None, help="another build folder, run beside BUILD on the same files")
    ap.add_argument("--settle", type=float, default=20.0,
                    help="seconds idle before each plan and its reduce (default 20): on a virtual machine whose freed "
                         "memory goes back to the host, what a reduce freed comes back at memory speed for some seconds")
    args = ap.parse_args()
    if args.settle < 0:
        ap.error("--settle: seconds, 0 or more")
    for figure, ours, anchor, ratio, aim, met in rows(args.build, args.d_model, args.layers, args.vocab, args.ctx,
                                                      tuple(args.dtypes.split(",")), args.repeats, args.dir,
                                                      tuple(int(k) for k in args.ranks.split(",")), args.against,
                                                      args.settle):
        print(f"| {figure} | {ours} | {anchor} | {ratio:.3g}{'x' if aim != '-' else ''} | {aim} | {'yes' if met else 'no'} |")


if __name__ == "__main__":
    main()
