"""bench/run.sh's exit status (bench/table.py, issue 30): benchmarks that need a GPU and skip without one
("no CUDA device: ...") are listed and do not fail the run; a failed CPU benchmark, or a figure left
without a value, does. Google Benchmark's JSON is made up here; nothing is timed.
Run: /usr/bin/python3 -m unittest -v test_bench_table   (from tests/scripts; finds bench/ itself)
"""

import json
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import table  # noqa: E402


def gbench_json(*rows):
    return json.dumps({"benchmarks": [dict(name=name, **fields) for name, fields in rows]})


class BenchExitTest(unittest.TestCase):
    def setUp(self):
        table.problems.clear()
        table.gpu_skipped.clear()
        self.run_was = table.run

    def tearDown(self):
        table.run = self.run_was

    def rows_of(self, *rows):
        table.run = lambda cmd, env=None: gbench_json(*rows)
        return table.gbench("bench_train", "paper", 1)

    @staticmethod
    def row(figure, ratio):
        return (figure, "1", "1", ratio, ">= 1", "yes")

    def test_gpu_rows_skipped_without_a_gpu_pass(self):
        got = self.rows_of(("BM_train_step/paper_fp32_flash", {"tokens_per_s": 5.0}),
                           ("BM_device_step/paper_cuda_native", {"error_occurred": True,
                            "error_message": "no CUDA device: LibTorch sees none (or has no CUDA)"}))
        self.assertEqual(list(got), ["BM_train_step/paper_fp32_flash"])
        self.assertEqual(table.problems, [])
        self.assertEqual(len(table.gpu_skipped), 1)
        self.assertEqual(table.exit_code([self.row("paper model flash vs baseline", "1.3x")]), 0)

    def test_a_failed_cpu_benchmark_fails(self):
        self.rows_of(("BM_train_step/paper_fp32_flash", {"error_occurred": True,
                      "error_message": "flash differs from the fp64 reference"}))
        self.assertEqual(len(table.problems), 1)
        self.assertEqual(table.exit_code([self.row("paper model flash vs baseline", "n/a")]), 1)

    def test_a_figure_without_a_value_fails(self):
        # Nothing failed, yet a CPU figure has no value (its benchmark printed nothing): that fails too.
        self.rows_of(("BM_device_step/paper_cuda_native", {"error_occurred": True, "error_message": "no CUDA device: x"}))
        self.assertEqual(table.exit_code([self.row("a", "1.1x"), self.row("b", "n/a")]), 1)
        self.assertEqual(table.problems, ["b: no value (its benchmark reported nothing)"])


if __name__ == "__main__":
    unittest.main()
