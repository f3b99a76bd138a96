"""`fastudy report` end to end: the fastudy binary (FASTUDY_BIN) runs a tiny study (4 variants:
attention x seed, 10 steps, a 1-layer 16-wide model; a few seconds), and its report is checked like
the synthetic ones (test_report.py): embedded images, the Markdown's files, the verdict against
ranking.csv. Also the partial study (microbench only, then train without reduce) and the error when
the interpreter lacks the plotting modules.
Run: FASTUDY_BIN=build/fastudy PYTHONPATH=analysis:tests/report /usr/bin/python3 -m unittest test_e2e
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import checks

TINY = """
[study]
name = "tiny"
phases = ["microbench", "train", "reduce", "report"]

[grid]
attention = ["baseline", "flash"]
seed = [1, 2]

[model]
vocab = 16
d_model = 16
heads = 2
layers = 1
seq_len = 16
mlp_ratio = 2

[data]
kind = "synthetic"
span_len = 4

[train]
steps = 10
batch = 4
lr = 3e-3
min_lr = 3e-4
warmup = 2
checkpoint_every = 5

[attention]
block_q = 8
block_kv = 8

[microbench]
formats = ["fp32", "bf16"]
policies = ["mixed"]
seq_lens = [16]
head_dims = [8]
blocks = [[8, 8]]
loop_orders = ["q_outer"]
trials = 1
heads = 1
"""

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@unittest.skipUnless(os.environ.get("FASTUDY_BIN"), "FASTUDY_BIN (the fastudy binary) is not set")
class EndToEndTest(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp(prefix="fastudy-report-e2e-"))
        self.grid = self.dir / "tiny.toml"
        self.grid.write_text(TINY)
        self.env = dict(os.environ, **MPI_ENV)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def fastudy(self, *args, env=None, expect=0):
        r = subprocess.run([os.environ["FASTUDY_BIN"], *map(str, args)], capture_output=True, text=True,
                           env=env or self.env, timeout=240)
        self.assertEqual(r.returncode, expect, f"fastudy {' '.join(map(str, args))}:\n{r.stdout}\n{r.stderr}")
        return r

    def test_run_ends_with_the_report(self):
        out = self.dir / "out"
        r = self.fastudy(self.grid, "--out", out)
        self.assertIn(str(out / "report.html"), r.stdout + r.stderr)
        self.assertGreaterEqual(checks.html_images(self, out / "report.html"), 4)
        self.assertGreaterEqual(len(checks.md_files(self, out / "report.md")), 8)
        # attention x seed: one condition ("all variants"), compared with the seed reference; 2 seeds give 2
        # optimisation pairs and 1 independent seed pair, so no interval is printed.
        self.assertEqual(checks.verdict_matches_csv(self, out / "report.html", out / "verdict.csv"), 1)
        html = (out / "report.html").read_text()
        self.assertIn("attention: flash vs baseline</td><td class=\"s\">all variants</td>", html)
        self.assertIn("not informative (1 pair)", html)
        self.assertIn("Noise floor: 0 by construction (deterministic CPU arithmetic)", html)
        self.assertEqual(checks.prose_ratio_claims(out / "report.html"), [])  # every ratio computed
        roles = {r["axis"]: r["role"] for r in checks.csv_rows(out / "axes.csv")}
        self.assertEqual(roles, {"attention": "optimisation", "seed": "reference"})

    def test_partial_study(self):
        out = self.dir / "partial"
        self.fastudy("microbench", self.grid, "--out", out)
        self.fastudy("report", out)
        md = (out / "report.md").read_text()
        self.assertIn("No verdict yet", md)
        self.assertIn("train: not run", md)
        self.assertIn("Training has not run", md)
        checks.html_images(self, out / "report.html")

        self.fastudy("train", self.grid, "--out", out, "--resume")
        self.fastudy("report", out)
        md = (out / "report.md").read_text()
        self.assertIn("No verdict yet", md)
        self.assertIn("train: 4 of 4 variants done", md)
        self.assertIn("reduce: not run", md)
        self.assertIn("training_loss.png", md)
        checks.md_files(self, out / "report.md")

    def test_microbench_readings_rank_independent(self):
        # Readings x rounding modes x SRAM tile rules on sink inputs: the CSV rows are the same on 1 and 2 ranks
        # (stochastic rounding included: its seed comes from the point), the tiles are the rule's, and the
        # summary prints the ratio against the number of KV tiles.
        mpirun = shutil.which("mpirun")
        if not mpirun:
            self.skipTest("no mpirun")
        grid = self.dir / "readings.toml"
        grid.write_text(TINY.split("[microbench]")[0] + """
[microbench]
formats = ["bf16"]
policies = ["eager", "mixed"]
roundings = ["nearest", "stochastic"]
seq_lens = [32, 64]
head_dims = [8]
sram = [512]
tile_rules = ["paper", "swapped"]
loop_orders = ["kv_outer"]
distribution = "sink"
trials = 1
heads = 1
""")
        rows = {}
        for ranks in (1, 2):
            out = self.dir / f"mb{ranks}"
            r = subprocess.run([mpirun, "-n", str(ranks), "--oversubscribe", os.environ["FASTUDY_BIN"], "microbench",
                                str(grid), "--out", str(out)], capture_output=True, text=True, env=self.env, timeout=240)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("against the number of KV tiles", r.stdout + r.stderr)
            lines = [l for l in (out / "microbench.csv").read_text().splitlines() if not l.startswith("#")]
            rows[ranks] = lines
        self.assertEqual(rows[1], rows[2])
        header = rows[1][0].split(",")
        table = [dict(zip(header, l.split(","))) for l in rows[1][1:]]
        self.assertEqual(len(table), 2 * 2 * 2 * 2 * 3)  # policies x roundings x seq_lens x rules x algorithms
        for c in ("rounding", "sram", "tile_rule", "rmse", "mean_signed", "max_ulp", "repeated_max_rows"):
            self.assertIn(c, header)
        # d = 8, M = 512: ceil(M / 4d) = 16 > d, so paper gives 8 x 16 and swapped 16 x 8 (block_q x block_kv).
        for row in table:
            self.assertEqual(row["sram"], "512")
            expected = ("8", "16") if row["tile_rule"] == "paper" else ("16", "8")
            self.assertEqual((row["block_q"], row["block_kv"]), expected, row)
            if row["algorithm"] == "flash":
                self.assertEqual(int(row["tiles_kv"]), int(row["seq_len"]) // int(row["block_kv"]))
        self.assertEqual({r["rounding"] for r in table}, {"nearest", "stochastic"})

    def test_microbench_captured_inputs(self):
        # Q, K, V of the study's own trained model: refused (exit 2, nothing written) before the checkpoint
        # exists, then read from it after training; the rows have the model's shape and the variant's batch.
        grid = self.dir / "captured.toml"
        grid.write_text(TINY.split("[microbench]")[0] + """
[microbench]
formats = ["bf16"]
policies = ["eager", "mixed"]
blocks = [[8, 4]]
loop_orders = ["kv_outer"]
distribution = "captured"
captured_variant = "flash-s1"
captured_layer = 0
captured_batch = 2
trials = 1
""")
        out = self.dir / "captured"
        r = self.fastudy("microbench", grid, "--out", out, expect=2)
        self.assertIn("does not exist", r.stderr)
        self.assertFalse((out / "microbench.csv").exists())
        self.fastudy("train", grid, "--out", out)
        r = self.fastudy("microbench", grid, "--out", out, "--resume")
        self.assertIn("captured Q, K, V of layer 0 on batch 2", r.stdout + r.stderr)
        lines = [l for l in (out / "microbench.csv").read_text().splitlines() if not l.startswith("#")]
        header = lines[0].split(",")
        table = [dict(zip(header, l.split(","))) for l in lines[1:]]
        self.assertEqual(len(table), 2 * 3)  # policies x algorithms
        for row in table:
            self.assertEqual((row["distribution"], row["seq_len"], row["head_dim"]), ("captured", "16", "8"), row)
            self.assertGreater(float(row["max_abs"]), 0.0)
        bad = self.dir / "bad_layer.toml"
        bad.write_text(grid.read_text().replace("captured_layer = 0", "captured_layer = 3"))
        # Into the trained study a grid of another configuration is refused first, naming the setting.
        r = self.fastudy("microbench", bad, "--out", out, "--resume", expect=2)
        self.assertIn("captured_layer: 0 -> 3", r.stderr)
        r = self.fastudy("microbench", bad, "--out", self.dir / "bad_layer", expect=2)
        self.assertIn("captured_layer = 3 is not a layer of the model", r.stderr)
        bad.write_text(grid.read_text().replace('captured_variant = "flash-s1"', 'captured_variant = "flash-s9"'))
        r = self.fastudy("microbench", bad, "--out", self.dir / "bad_variant", expect=2)
        self.assertIn('captured_variant = "flash-s9" is not a variant of this study', r.stderr)
        self.assertIn("flash-s1", r.stderr)  # the hint lists the variants

    def test_missing_modules_give_a_hint(self):
        out = self.dir / "mb"
        self.fastudy("microbench", self.grid, "--out", out)
        # An interpreter that does not see Debian's modules: python3 -S skips site-packages/dist-packages.
        wrapper = self.dir / "python-without-site"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
        wrapper.chmod(0o755)
        r = self.fastudy("report", out, env=dict(self.env, FASTUDY_PYTHON=str(wrapper)), expect=1)
        self.assertIn("cannot import matplotlib", r.stderr)
        self.assertIn("apt-get install python3-matplotlib python3-h5py", r.stderr)
        self.assertFalse((out / "report.html").exists())

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("unshare") and shutil.which("mount"),
                         "a full disk is a small tmpfs in a private mount namespace: needs root, unshare and mount")
    def test_full_disk_is_one_line_and_leaves_nothing_behind(self):
        # Issue 28, item 12: the report on a file system with 48 KiB left (its plots and pages need more):
        # one error line naming the file system, no traceback, and the study exactly as before (no
        # report.html.tmp, no staging folder, the report of before untouched).
        # Where the disk fills up first: in the renderer (a plot; 48 KiB left), or in fastudy's own first
        # write, the manifest (one page left: the lock fits; the report's entries not yet listed).
        out = self.dir / "out"
        self.fastudy(self.grid, "--out", out)
        helper = Path(__file__).resolve().parent / "full_disk.py"
        for keep, extra, first_line in ((48 * 1024, [], "error: the report was not written: cannot write "),
                                        (4096, ["--unlisted-report"], f"error: cannot write {self.dir}/mnt/study/fastudy.manifest")):
            with self.subTest(keep=keep):
                mount = self.dir / "mnt"
                r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, str(helper),
                                    os.environ["FASTUDY_BIN"], str(out), str(mount), str(keep), *extra],
                                   capture_output=True, text=True, env=self.env, timeout=300)
                if r.returncode == 77:
                    self.skipTest(f"no tmpfs here: {r.stderr.strip()}")
                self.assertEqual(r.returncode, 0, r.stderr)
                result = json.loads(r.stdout)
                self.assertLess(result["free"], 64 * 1024, "the disk was not full")  # the fault is in place
                self.assertEqual(result["code"], 1, result)
                lines = [l for l in result["stderr"].strip().splitlines() if not l.startswith("hint: ")]
                self.assertEqual(len(lines), 1, result["stderr"])
                self.assertTrue(lines[0].startswith(first_line), lines[0])
                self.assertIn("No space left on device", lines[0])
                self.assertIn(f"(the file system mounted at {mount} has ", lines[0])
                self.assertNotIn("Traceback", result["stderr"] + result["stdout"])
                self.assertEqual(result["after"], result["before"])
                self.assertIn("report.html", result["before"])  # the report of before is still there, unchanged


if __name__ == "__main__":
    unittest.main()
