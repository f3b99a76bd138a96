"""Byte flips in the files fastudy reads back: for a checkpoint, deviation.h5, status.csv and
study.toml, 16 bytes are inverted at offsets spread over the whole file (--per-file, 40 by default),
and the job that reads the file runs under a time bound. Every case must end with a named error
(exit 1 or 2, the file's path in the message, no signal) or, where fastudy repairs the damage
(a checkpoint or status.csv with `train --resume`), with results equal to the clean run's.
Never a crash, a hang or a different result.

Run (from the repository root; a tiny study of 4 variants, a few seconds per case):
  /usr/bin/python3 bench/reliability/byte_flips.py build --per-file 40
Prints, per file, how many cases ended with a named error, with results equal to the clean run, and
how many crashed, hung or gave a different result (these must be 0).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GRID = """[study]
name = "flips"
out = "{out}"
phases = ["train", "reduce"]
[grid]
attention = ["baseline", "flash"]
precision = ["fp32", "bf16"]
[model]
vocab = 32
d_model = 16
heads = 2
layers = 1
seq_len = 16
mlp_ratio = 2
[data]
span_len = 4
[train]
steps = 4
batch = 4
warmup = 2
checkpoint_every = 2
[attention]
block_q = 8
block_kv = 8
"""


class Runner:
    def __init__(self, exe, timeout):
        self.exe, self.timeout = exe, timeout

    mpi_start_retries = 0

    def __call__(self, *args):
        # Open MPI's singleton start-up sometimes fails on a loaded machine ("ompi_rte_init failed",
        # before fastudy runs a line of its own): such a run is retried, and counted.
        for _ in range(3):
            try:
                r = subprocess.run([self.exe, *map(str, args)], capture_output=True, text=True,
                                   timeout=self.timeout, env=dict(os.environ, FASTUDY_PYTHON="/bin/true"))
            except subprocess.TimeoutExpired:
                return "timeout", ""
            if "ompi_rte_init failed" not in r.stdout + r.stderr:
                break
            Runner.mpi_start_retries += 1
        return r.returncode, r.stdout + r.stderr


def data_rows(path):
    """The rows of a CSV without its provenance header (which names the command)."""
    return [l for l in Path(path).read_text().splitlines() if not l.startswith("#")]


def status_states(path):
    return sorted((l.split(",")[0], l.split(",")[1], l.split(",")[2]) for l in data_rows(path)[1:])


def flip(path, at):
    data = bytearray(Path(path).read_bytes())
    at = max(0, min(at, len(data) - 16))
    for i in range(at, min(len(data), at + 16)):
        data[i] ^= 0xFF
    Path(path).write_bytes(bytes(data))


def classify(code, out, path):
    if code == "timeout" or (isinstance(code, int) and (code < 0 or code >= 128)):
        return "crash_or_hang"
    if code in (1, 2) and str(path) in out:
        return "named_error"
    if code == 0:
        return "ok"
    return "unnamed_error"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--per-file", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args()
    run = Runner(str(Path(args.build).resolve() / "fastudy"), args.timeout)
    work = Path(tempfile.mkdtemp(prefix="fastudy-byte-flips-"))
    out = work / "out"
    grid = work / "grid.toml"
    grid.write_text(GRID.format(out=out))
    code, text = run(grid, "-q")
    if code != 0:
        sys.exit(f"the clean run failed ({code}):\n{text}")
    clean_dev = data_rows(out / "deviation.csv")
    clean_status = status_states(out / "status.csv")
    pristine = work / "pristine"
    shutil.copytree(out, pristine)

    def restore():
        shutil.rmtree(out)
        shutil.copytree(pristine, out)

    targets = {
        "checkpoint": out / "checkpoints" / "flash-bf16" / "step_0000002.h5",
        "deviation.h5": out / "deviation.h5",
        "status.csv": out / "status.csv",
        "study.toml": out / "study.toml",
    }
    totals = {}
    bad = 0
    for label, path in targets.items():
        size = path.stat().st_size
        counts = {}
        for k in range(args.per_file):
            at = (size - 16) * k // max(1, args.per_file - 1)
            flip(path, at)
            if label == "checkpoint":
                code, text = run("reduce", out)
            elif label == "deviation.h5":
                code, text = run("report", out)
            else:
                code, text = run("status", out)
            outcome = classify(code, text, path)
            if outcome == "named_error" and label in ("checkpoint", "status.csv"):
                # Repair: --resume retrains from the last good checkpoint / rebuilds the status, and
                # the results must equal the clean run's.
                rcode, rtext = run("train", grid, "--out", out, "--resume", "-q")
                if label == "checkpoint":
                    dcode, dtext = run("reduce", out, "-q")
                    same = rcode == 0 and dcode == 0 and data_rows(out / "deviation.csv") == clean_dev
                else:
                    same = rcode == 0 and status_states(out / "status.csv") == clean_status
                outcome = "named_error_then_repaired_equal" if same else "repair_differs"
                if not same:
                    text += rtext
            elif outcome == "ok":
                outcome = "unused_bytes_equal_results"  # not expected: every byte is checksummed
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome in ("crash_or_hang", "unnamed_error", "repair_differs"):
                bad += 1
                print(f"BAD {label} flip at {at}: {outcome} (exit {code})\n{text[-600:]}", file=sys.stderr)
            restore()
        totals[label] = counts
        print(f"{label:13s} {size:7d} bytes, {args.per_file} flips: " +
              ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print(f"Open MPI start-up failures retried: {Runner.mpi_start_retries}")
    print("no crash, hang, unnamed error or different result" if bad == 0 else f"{bad} bad case(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
