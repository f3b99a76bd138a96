"""bench/gpu-table.sh (bench/gpu_table.py): the GPU table from bench_train's JSON, with a stand-in
bench_train (a small script that writes Google Benchmark's JSON for known times), so that it runs on any
machine: the ratios and aims of every row, the exit status when a row is missing, and the
--benchmark_min_time spelling of both Google Benchmark versions (1.7 refuses "0.2s", 1.8 wants it).
Run: /usr/bin/python3 -m unittest -v test_gpu_table   (from tests/scripts; finds bench/ itself)
"""

import json
import os
import stat
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu-table.sh"

ROWS = {
    "BM_gpu_attention/fa2": {"tflops": 80.0, "tensor_cores": 1},
    "BM_gpu_attention/eager": {"tflops": 30.0, "tensor_cores": 1},
    "BM_gpu_attention/pure": {"tflops": 2.0, "tensor_cores": 0},
    "BM_gpu_attention/sdpa_flash": {"tflops": 200.0},
    "BM_device_step/paper_cuda_native_fa2": {"real_time": 12.0},
    "BM_device_step/paper_cuda_native_fa2_graph": {"real_time": 6.0},
    "BM_device_step/paper_cuda_emulated_fa2": {"real_time": 30.0},
    "BM_device_step/paper_cuda_emulated_fa2_graph": {"real_time": 9.0},
    "BM_plain_device_step/paper_cuda_autocast": {"real_time": 8.0},
    "BM_device_step/gpt2_cuda_emulated_fa2": {"tokens_per_s": 50000.0},
    "BM_device_step/gpt2_cuda_native_fa2": {"tokens_per_s": 100000.0},
}

# A stand-in for bench_train: writes the rows above (minus $DROP) to --benchmark_out; refuses the
# --benchmark_min_time spelling named by $REFUSE as Google Benchmark does.
FAKE = """#!{python}
import json, os, sys
rows = json.loads(os.environ["ROWS"])
refuse = os.environ.get("REFUSE", "")
out = None
for a in sys.argv[1:]:
    if a.startswith("--benchmark_min_time="):
        value = a.split("=", 1)[1]
        if (refuse == "unit" and value.endswith("s")) or (refuse == "plain" and not value.endswith("s")):
            sys.stderr.write("error: invalid value for --benchmark_min_time: " + value + "\\n")
            sys.exit(1)
    if a.startswith("--benchmark_out="):
        out = a.split("=", 1)[1]
drop = os.environ.get("DROP", "")
bench = []
for name, fields in rows.items():
    if name == drop:
        bench.append({{"name": name, "error_occurred": True, "error_message": "no CUDA device: none here"}})
        continue
    row = {{"name": name + "/real_time", "real_time": 1.0, "time_unit": "ms"}}
    row.update(fields)
    bench.append(row)
json.dump({{"benchmarks": bench}}, open(out, "w"))
"""


class GpuTableTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.build = Path(self.tmp.name) / "build"
        binary = self.build / "bench" / "train" / "bench_train"
        binary.parent.mkdir(parents=True)
        binary.write_text(FAKE.format(python=sys.executable))
        binary.chmod(binary.stat().st_mode | stat.S_IEXEC)

    def tearDown(self):
        self.tmp.cleanup()

    def table(self, **env):
        e = dict(os.environ, ROWS=json.dumps(ROWS), **env)
        p = subprocess.run(["sh", str(SCRIPT), str(self.build), str(Path(self.tmp.name) / "out")],
                           capture_output=True, text=True, env=e)
        return p.returncode, p.stdout + p.stderr

    def test_every_ratio_and_aim(self):
        code, out = self.table()
        self.assertEqual(code, 0, out)
        lines = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
        self.assertIn("0.4x | >= 0.25x | yes", lines["ours fa2 (tensor cores) fwd+bwd, causal bf16 B4 H16 N4096 d128, vs SDPA flash"])
        self.assertIn("0.15x | >= 0.1x | yes", lines["ours eager (tensor cores) fwd+bwd, causal bf16 B4 H16 N4096 d128, vs SDPA flash"])
        self.assertIn("0.01x | >= 0.01x | yes", lines["ours pure (CUDA cores) fwd+bwd, causal bf16 B4 H16 N4096 d128, vs SDPA flash"])
        self.assertIn("1.5x | <= 1.2x | no", lines["paper model, native step (op by op) vs plain LibTorch (autocast bf16)"])
        self.assertIn("0.75x | <= 1.2x | yes", lines["paper model, native step (CUDA graph) vs plain LibTorch (autocast bf16)"])
        self.assertIn("2.5x | <= 2x | no", lines["paper model, emulated fa2 step vs native (op by op)"])
        self.assertIn("1.5x | <= 2x | yes", lines["paper model, emulated fa2 step vs native (CUDA graph)"])
        self.assertIn("0.5x | >= 0.4x | yes", lines["GPT-2 small (124M, seq 1024), emulated fa2 vs native"])
        self.assertTrue((Path(self.tmp.name) / "out" / "table.md").read_text().startswith("GPU path"))

    def test_a_missing_row_fails_and_says_why(self):
        code, out = self.table(DROP="BM_gpu_attention/sdpa_flash")
        self.assertEqual(code, 1, out)
        self.assertIn("BM_gpu_attention/sdpa_flash: no CUDA device: none here", out)
        self.assertIn("| n/a |", out)

    def test_both_min_time_spellings(self):
        for refuse, used in (("unit", "--benchmark_min_time=0.2 "), ("plain", "--benchmark_min_time=0.2s ")):
            code, out = self.table(REFUSE=refuse)
            self.assertEqual(code, 0, out)
            self.assertIn(used, out)

    def test_usage(self):
        p = subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("Usage", p.stderr)


if __name__ == "__main__":
    unittest.main()
