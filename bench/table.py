"""Run fastudy's benchmarks and print one table of figures against their anchors (see bench/run.sh).

Every figure is a ratio of two times measured side by side in the same process run (the machine is
shared and noisy): the kernel benchmarks use each thread's CPU time, the trainer and checkpoint
benchmarks wall time. Google Benchmark programs run with --benchmark_format=json; the checkpoint
benchmark prints its own table, parsed here.

Exit status: 0 when every figure of the table has a value; 1 when one is n/a (its benchmark failed, or
reported nothing) or a program failed. Benchmarks that need a GPU and skip on a machine without one
("no CUDA device: ...", bench/train/bench_train.cpp) are listed under the table and do not count.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

problems = []     # failures: the run exits 1
gpu_skipped = []  # benchmarks that need a GPU, skipped here: listed, not failures
NO_GPU = "no CUDA device"  # how a GPU benchmark says it skipped (bench_train.cpp skip_without)


def run(cmd, env=None):
    """stdout of cmd, or None (with the reason kept for the end) when it fails."""
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        return out.stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        err = getattr(e, "stderr", "") or str(e)
        problems.append(f"{' '.join(cmd[:2])}: {err.strip().splitlines()[-1] if err.strip() else e}")
        return None


def gbench(binary, pattern, min_time):
    """{name: benchmark dict} of a Google Benchmark program's JSON output."""
    out = run([binary, f"--benchmark_filter={pattern}", f"--benchmark_min_time={min_time}",
               "--benchmark_format=json"])
    if out is None:
        return {}
    rows = {}
    for b in json.loads(out)["benchmarks"]:
        name = b["name"].split("/min_time")[0].split("/real_time")[0]
        if b.get("error_occurred"):
            message = b.get("error_message", "skipped")
            (gpu_skipped if message.startswith(NO_GPU) else problems).append(f"{name}: {message}")
            continue
        rows[name] = b
    return rows


def timed(cmd, env):
    """Wall time of cmd in seconds, or None (reason kept) when it fails."""
    import time
    start = time.perf_counter()
    if run(cmd, env=env) is None:
        return None
    return time.perf_counter() - start


def fmt(x, unit=""):
    return "n/a" if x is None else f"{x:.3g}{unit}"


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    table = []  # (figure, ours, anchor, ratio, aim, met)

    def add(figure, ours, anchor, ratio, aim, ok):
        table.append((figure, ours, anchor, fmt(ratio, "x"), aim, "n/a" if ratio is None else ("yes" if ok(ratio) else "no")))

    att = gbench(f"{build}/bench/kernels/bench_attention",
                 "BM_fma|BM_torch_forward/steady|BM_flash_forward/(fp32|bf16|eager_bf16|mixed_bf16_stochastic|"
                 "eager_bf16_stochastic|fp8_e4m3|fa2_fp16|fa2_bf16|fa3_bf16|fa3_fp8_e4m3)/|"
                 "BM_flash_backward/(fp32|bf16|fa2_bf16)/", 0.5)
    # The kernel benchmarks keep the fastest iteration's thread CPU time in their counters (GFLOP/s,
    # x_torch, x_fp32, x_forward); Google Benchmark's own cpu_time is a mean over iterations and, for the
    # backward, includes the untimed forward call that precedes each timed backward.
    ctr = lambda name, key: att.get(name, {}).get(key)  # noqa: E731
    ratio = lambda a, b: None if a is None or b is None else a / b  # noqa: E731
    ms_of = lambda gflops, flops: None if gflops is None else flops / gflops * 1e-6  # noqa: E731
    fwd_flops = 4.0 * 8 * 8 * 1024 * 1024 * 64  # bench_attention's problem: B=8 H=8 N=1024 d=64
    peak = ctr("BM_fma_peak/iterations:1", "GFLOP/s")
    gflops = ctr("BM_flash_forward/fp32", "GFLOP/s")
    f32 = ms_of(gflops, fwd_flops)
    add("flash forward fp32, share of the measured FMA peak", fmt(gflops, " GFLOP/s"), fmt(peak, " GFLOP/s"),
        ratio(gflops, peak), ">= 0.6", lambda r: r >= 0.6)
    x_torch = ctr("BM_flash_forward/fp32", "x_torch")
    add("flash forward fp32 vs LibTorch matmul+softmax (steady state)", fmt(f32, " ms"),
        fmt(None if x_torch is None or f32 is None else f32 * x_torch, " ms"), x_torch, ">= 1 (speed-up)",
        lambda r: r >= 1)
    for name, label, aim in (("bf16", "mixed bf16", 1.5), ("eager_bf16", "eager bf16", 1.5),
                             ("mixed_bf16_stochastic", "mixed bf16 stochastic", 1.5),
                             ("eager_bf16_stochastic", "eager bf16 stochastic", 1.5),
                             ("fp8_e4m3", "mixed fp8 e4m3", 1.5), ("fa2_fp16", "fa2 fp16", 1.5),
                             ("fa2_bf16", "fa2 bf16", 1.5), ("fa3_bf16", "fa3 bf16", 1.5),
                             ("fa3_fp8_e4m3", "fa3 fp8 e4m3 (block quantization, incoherent)", 1.5)):
        t = ms_of(ctr(f"BM_flash_forward/{name}", "GFLOP/s"), fwd_flops)
        add(f"flash forward {label} time / fp32", fmt(t, " ms"), fmt(f32, " ms"), ratio(t, f32), f"<= {aim}",
            lambda r, a=aim: r <= a)
    b32 = ms_of(ctr("BM_flash_backward/fp32", "GFLOP/s"), 2.5 * fwd_flops)
    add("flash backward fp32 time / forward fp32", fmt(b32, " ms"), fmt(f32, " ms"),
        ctr("BM_flash_backward/fp32", "x_forward"), "<= 3", lambda r: r <= 3)
    b16 = ms_of(ctr("BM_flash_backward/bf16", "GFLOP/s"), 2.5 * fwd_flops)
    add("flash backward mixed bf16 time / fp32 backward", fmt(b16, " ms"), fmt(b32, " ms"), ratio(b16, b32), "<= 1.3",
        lambda r: r <= 1.3)
    bfa2 = ms_of(ctr("BM_flash_backward/fa2_bf16", "GFLOP/s"), 2.5 * fwd_flops)
    add("flash backward fa2 bf16 time / fp32 backward", fmt(bfa2, " ms"), fmt(b32, " ms"), ratio(bfa2, b32), "<= 1.3",
        lambda r: r <= 1.3)

    env = dict(os.environ)
    tr = gbench(f"{build}/bench/train/bench_train", "paper|threads", 2)
    tok = lambda name: tr[name]["tokens_per_s"] if name in tr else None  # noqa: E731
    plain, base, flash = tok("BM_plain_libtorch_step/paper"), tok("BM_train_step/paper_fp32_baseline"), \
        tok("BM_train_step/paper_fp32_flash")
    add("paper model fp32 baseline vs plain LibTorch modules (tokens/s)", fmt(base), fmt(plain), ratio(base, plain),
        ">= 1.0", lambda r: r >= 1.0)
    add("paper model flash vs baseline (tokens/s)", fmt(flash), fmt(base), ratio(flash, base), ">= 1.2",
        lambda r: r >= 1.2)
    b16t = tok("BM_train_step/paper_bf16_baseline")
    add("paper model bf16 step time / fp32 (baseline)", fmt(b16t), fmt(base), ratio(base, b16t), "<= 1.3",
        lambda r: r <= 1.3)
    # The default thread count (this rank's CPUs) against one thread; both give the same bits.
    many, one = tok("BM_train_threads/threads:0"), tok("BM_train_threads/threads:1")
    n = tr.get("BM_train_threads/threads:0", {}).get("threads")
    add(f"paper model fp32 flash, default threads ({fmt(n)}) vs 1 (tokens/s)", fmt(many), fmt(one),
        ratio(many, one), ">= 1.5 on 2 cores", lambda r: r >= 1.5)

    with tempfile.TemporaryDirectory() as d:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        out = run(["mpirun", "-n", "2", "--oversubscribe", f"{build}/bench/runner/checkpoint_write_bench", "--dir", d,
                   "--reps", "5"], env=env)
    if out is not None:
        rows = {}
        for line in out.splitlines():
            m = re.match(r"(.+?)\s+(yes|no)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s+([\d.]+)$", line)
            if m:
                rows[(m.group(1).strip(), m.group(2))] = (float(m.group(3)), float(m.group(5)))
        posix = rows.get(("posix write() 1 rank", "no"))
        best = max((v for k, v in rows.items() if k[1] == "no" and "collective" in k[0]), default=None,
                   key=lambda v: v[1])
        add("checkpoint write (collective parallel HDF5) vs plain write()", fmt(best and best[0], " s"),
            fmt(posix and posix[0], " s"), best and best[1], ">= 0.7", lambda r: r >= 0.7)

    # Reduce on 1 and 2 ranks (wall time of `fastudy reduce`, best of 3 each, interleaved), on a study
    # with one checkpoint per variant; and one training run of the demo model with and without
    # transparent huge pages (FASTUDY_HUGEPAGES=0), best of 2 each.
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as d:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
        out_dir = os.path.join(d, "reduce")
        if run([f"{build}/fastudy", "train", os.path.join(here, "reduce", "reduce_scaling.toml"), "--out", out_dir, "-q"],
               env=env) is not None:
            times = {1: [], 2: []}
            for _ in range(3):
                for ranks in (1, 2):
                    t = timed(["mpirun", "-n", str(ranks), "--oversubscribe", f"{build}/fastudy", "reduce", out_dir, "-q"], env)
                    if t is not None:
                        times[ranks].append(t)
            one, two = min(times[1], default=None), min(times[2], default=None)
            add("reduce, 24 variants x 1.9M parameters, 1 checkpoint: 2 ranks vs 1 (wall)", fmt(two, " s"), fmt(one, " s"),
                one / two if one and two else None, ">= 1.7", lambda r: r >= 1.7)
        grid = os.path.join(here, "..", "configs", "quick.toml")
        hp = {"on": [], "off": []}
        for _ in range(2):
            for mode in ("on", "off"):
                e = dict(env, FASTUDY_HUGEPAGES="1" if mode == "on" else "0")
                e.pop("GLIBC_TUNABLES", None)
                t = timed([f"{build}/fastudy", "train", grid, "--out", os.path.join(d, "hp-" + mode), "--force",
                           "--variant", "flash-bf16-s1", "-q"], e)
                if t is not None:
                    hp[mode].append(t)
        on, off = min(hp["on"], default=None), min(hp["off"], default=None)
        add("demo training run (quick.toml, one variant): huge pages vs 4 KiB pages (wall)", fmt(on, " s"), fmt(off, " s"),
            off / on if on and off else None, "> 1 (speed-up)", lambda r: r > 1)

        # The train phase of the demo grid (18 variants x 200 steps) on 1 and 2 ranks, each right after
        # `fastudy plan --ranks N`, whose time estimate is compared with the measured wall time. One
        # rank runs as users run it, without mpirun (which would bind it to one core): it trains on
        # every core; each of 2 ranks under mpirun is bound to one core.
        measured, estimate = {}, {}
        for ranks in (1, 2):
            plan = run([f"{build}/fastudy", "plan", grid, "--ranks", str(ranks)], env=env)
            m = plan and re.search(r"time estimate, train phase: ([\d.]+) s", plan)
            estimate[ranks] = float(m.group(1)) if m else None
            launch = ["mpirun", "-n", str(ranks), "--oversubscribe"] if ranks > 1 else []
            measured[ranks] = timed(launch + [f"{build}/fastudy", "train", grid,
                                              "--out", os.path.join(d, f"train-{ranks}"), "-q"], env)
        add("demo grid train phase (18 variants x 200 steps): 2 ranks vs 1 rank on all cores (wall)", fmt(measured[2], " s"),
            fmt(measured[1], " s"), measured[1] / measured[2] if measured[1] and measured[2] else None,
            "> 1 (scaling)", lambda r: r > 1)
        for ranks in (1, 2):
            est, got = estimate[ranks], measured[ranks]
            add(f"`fastudy plan` train-phase estimate / measured, demo grid, {ranks} rank{'s' if ranks > 1 else ''}",
                fmt(est, " s"), fmt(got, " s"), est / got if est and got else None, "0.7 - 1.3",
                lambda r: 0.7 <= r <= 1.3)

    # The reduce of an imported study at GPT-2 scale (bench/reduce/import_bench.py): 8 runs x 2 steps of
    # 124M-parameter safetensors checkpoints, fp32 and bf16, on 1 and 2 ranks, against reading every file
    # once plus one radix sort of as many values (about 12 GiB of files, written to the temp folder).
    sys.path.insert(0, os.path.join(here, "reduce"))
    try:
        import import_bench
        for figure, ours, anchor, r, aim, met in import_bench.rows(build):
            table.append((figure, ours, anchor, fmt(r, "x"), aim, "yes" if met else "no"))
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        problems.append(f"import_bench: {e}")
    # The reduce at model scale (bench/reduce/scale_bench.py): `fastudy plan`'s estimate against a
    # 100-run simulation on 1, 2 and 4 ranks, and the plan of 100 runs of a 7B model on 64 ranks.
    try:
        import scale_bench
        for figure, ours, anchor, r, aim, met in scale_bench.rows(build):
            table.append((figure, ours, anchor, fmt(r, "x"), aim, "yes" if met else "no"))
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        problems.append(f"scale_bench: {e}")

    w1 = run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "analysis", "run_w1_vs_scipy.sh"), build])
    if w1 is not None:
        m = re.search(r"speed-up over scipy: (\d+)x wall clock, (\d+)x CPU", w1)
        add("pairwise W1 vs scipy.stats.wasserstein_distance (CPU time)", "C++", "scipy",
            float(m.group(2)) if m else None, "> 1 (speed-up)", lambda r: r > 1)

    widths = [max(len(str(row[i])) for row in table + [("figure", "ours", "anchor", "ratio", "aim", "met")])
              for i in range(6)]
    head = ("figure", "ours", "anchor", "ratio", "aim", "met")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in table:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |")
    for p in problems:
        print(f"n/a: {p}")
    for p in gpu_skipped:
        print(f"skipped (needs a GPU): {p}")
    return exit_code(table)


def exit_code(table):
    """0 when every figure has a value and nothing failed; 1 otherwise (a figure without a value and
    no failure recorded is named: its benchmark reported nothing). GPU-only skips do not count."""
    missing = [row[0] for row in table if row[3] == "n/a"]
    if missing and not problems:
        problems.extend(f"{figure}: no value (its benchmark reported nothing)" for figure in missing)
        for figure in missing:
            print(f"n/a: {figure}: no value (its benchmark reported nothing)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
