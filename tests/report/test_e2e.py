"""`fastudy report` end to end: the fastudy binary (FASTUDY_BIN) runs a tiny study (4 variants:
attention x seed, 10 steps, a 1-layer 16-wide model; a few seconds), and its report is checked like
the synthetic ones (test_report.py): embedded images, the Markdown's files, the verdict against
ranking.csv. Also the partial study (microbench only, then train without reduce) and the error when
the interpreter lacks the plotting modules.
Run: FASTUDY_BIN=build/fastudy PYTHONPATH=analysis:tests/report /usr/bin/python3 -m unittest test_e2e
"""

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
        self.assertEqual(checks.verdict_matches_ranking(self, out / "report.html", out / "ranking.csv"), 1)
        html = (out / "report.html").read_text()
        self.assertIn("Present in this grid: <code>seed</code>", html)
        self.assertIn("accepted bounds", html)

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


if __name__ == "__main__":
    unittest.main()
