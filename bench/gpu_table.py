"""The GPU path's speed as ratios measured side by side in one run on one GPU (see bench/gpu-table.sh).

Runs the GPU rows of bench_train (bench/train/bench_train.cpp: BM_gpu_attention, BM_device_step and
BM_plain_device_step on CUDA) once, with Google Benchmark's JSON output, and prints one markdown table:

  ours fa2 / eager / pure, fwd+bwd causal bf16 B4 H16 N4096 d128   TFLOP/s as a share of SDPA flash's
  paper model, native step vs plain LibTorch (autocast bf16)         step time ratio (op by op, CUDA graph)
  paper model, emulated fa2 step vs native                           step time ratio
  GPT-2 small (124M, seq 1024), emulated fa2 vs native               tokens/s ratio

Usage: gpu_table.py BUILD_DIR [OUTDIR]   (OUTDIR, default BUILD_DIR/gpu-table: the JSON and table.md)
Exit status: 0 when every figure has a value; 1 when one is missing (its row failed or skipped: the
reason is printed under the table) or the program failed; 2 for bad usage.
"""
import datetime
import json
import os
import subprocess
import sys

ROWS = ("BM_gpu_attention/|BM_device_step/(paper|gpt2)_cuda|BM_plain_device_step/paper_cuda")
MIN_TIME = "0.2"


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             check=True, capture_output=True, text=True).stdout.strip().splitlines()
        return out[0] if out else "unknown GPU"
    except (OSError, subprocess.CalledProcessError):
        return "unknown GPU (no nvidia-smi)"


def run_benchmarks(binary, json_path):
    """Google Benchmark 1.8 wants a unit on --benchmark_min_time ("0.2s"), 1.7 refuses one ("0.2")."""
    last = None
    for min_time in (MIN_TIME + "s", MIN_TIME):
        cmd = [binary, f"--benchmark_filter={ROWS}", f"--benchmark_min_time={min_time}",
               "--benchmark_format=json", f"--benchmark_out={json_path}", "--benchmark_out_format=json"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            return " ".join(cmd)
        last = proc
        if "min_time" not in (proc.stderr + proc.stdout):
            break
    sys.stderr.write(last.stderr[-4000:] if last is not None else "")
    raise SystemExit(f"gpu-table: {binary} failed (exit {last.returncode if last is not None else '?'})")


def main():
    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    build = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else os.path.join(build, "gpu-table")
    binary = os.path.join(build, "bench", "train", "bench_train")
    if not os.access(binary, os.X_OK):
        sys.stderr.write(f"gpu-table: {binary} is not built (cmake --build {build} --target bench_train)\n")
        return 2
    os.makedirs(out, exist_ok=True)
    json_path = os.path.join(out, "bench_train_gpu.json")
    command = run_benchmarks(binary, json_path)
    with open(json_path) as f:
        data = json.load(f)
    rows, notes = {}, []
    for b in data["benchmarks"]:
        name = b["name"].split("/min_time")[0].split("/real_time")[0]
        if b.get("error_occurred"):
            notes.append(f"{name}: {b.get('error_message', 'skipped')}")
            continue
        rows[name] = b

    def value(name, key):
        b = rows.get(name)
        if b is None:
            return None
        return b.get(key) if key != "time" else b["real_time"]

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    table = []  # (what, ours, anchor, ratio, aim, met)

    def add(what, ours, anchor, r, aim, ok, unit):
        fmt = lambda x: "n/a" if x is None else f"{x:.4g} {unit}"  # noqa: E731
        table.append((what, fmt(ours), fmt(anchor), "n/a" if r is None else f"{r:.3g}x", aim,
                      "n/a" if r is None else ("yes" if ok(r) else "no")))

    sdpa = value("BM_gpu_attention/sdpa_flash", "tflops")
    for reading, aim in (("fa2", 0.25), ("eager", 0.10), ("pure", 0.01)):
        ours = value(f"BM_gpu_attention/{reading}", "tflops")
        cores = value(f"BM_gpu_attention/{reading}", "tensor_cores")
        path = "" if cores is None else (" (tensor cores)" if cores else " (CUDA cores)")
        add(f"ours {reading}{path} fwd+bwd, causal bf16 B4 H16 N4096 d128, vs SDPA flash", ours, sdpa,
            ratio(ours, sdpa), f">= {aim:g}x", lambda r, a=aim: r >= a, "TFLOP/s")
    plain = value("BM_plain_device_step/paper_cuda_autocast", "time")
    for suffix, label in (("_fa2", "op by op"), ("_fa2_graph", "CUDA graph")):
        native = value(f"BM_device_step/paper_cuda_native{suffix}", "time")
        add(f"paper model, native step ({label}) vs plain LibTorch (autocast bf16)", native, plain,
            ratio(native, plain), "<= 1.2x", lambda r: r <= 1.2, "ms")
    for suffix, label in (("_fa2", "op by op"), ("_fa2_graph", "CUDA graph")):
        emulated = value(f"BM_device_step/paper_cuda_emulated{suffix}", "time")
        native = value(f"BM_device_step/paper_cuda_native{suffix}", "time")
        add(f"paper model, emulated fa2 step vs native ({label})", emulated, native, ratio(emulated, native),
            "<= 2x", lambda r: r <= 2.0, "ms")
    emulated = value("BM_device_step/gpt2_cuda_emulated_fa2", "tokens_per_s")
    native = value("BM_device_step/gpt2_cuda_native_fa2", "tokens_per_s")
    add("GPT-2 small (124M, seq 1024), emulated fa2 vs native", emulated, native, ratio(emulated, native),
        ">= 0.4x", lambda r: r >= 0.4, "tokens/s")

    lines = [f"GPU path, ratios measured side by side: {gpu_name()}, "
             f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
             f"command: {command}", "",
             "| what | ours | anchor | ratio | aim | met |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in table]
    context = [f"  {n} {rows[n]['real_time']:.4g} {rows[n]['time_unit']}" for n in sorted(rows)]
    lines += ["", "rows (wall time per iteration):"] + context
    if notes:
        lines += ["", "rows that did not run:"] + [f"  {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(text)
    return 1 if any(r[3] == "n/a" for r in table) else 0


if __name__ == "__main__":
    sys.exit(main())
