"""A full disk under `fastudy reduce` and `fastudy microbench` with save_outputs, through the command line:
before the work, the disk check of the job's own outputs refuses a file system too small for them (exit
2, the bytes needed and free named, nothing written); during the work, a write that fails (here: a file
size limit, RLIMIT_FSIZE, so that the small files of the study fit and the results do not, on one and
on two ranks) is one error line naming the file, its file system and the error, exit 1, no crash (no
signal: HDF5 handles are closed, or the job ends without MPI_Finalize when HDF5 could not close one),
and no temporary file left behind.

The small file system is a tmpfs in a private mount namespace (root, unshare and mount); those cases
are skipped elsewhere. Run by ctest (test_full_disk) with FASTUDY_BIN, FASTUDY_SOURCE_DIR and the MPI
environment.
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

FASTUDY = os.environ.get("FASTUDY_BIN", "fastudy")
SOURCE = Path(os.environ.get("FASTUDY_SOURCE_DIR", Path(__file__).resolve().parents[2]))

MICROBENCH = """[study]
name = "saved"
out = "{out}"
phases = ["microbench"]
[microbench]
formats = ["bf16"]
seq_lens = [64]
head_dims = [16]
blocks = [[16, 16]]
trials = 1
batch = 2
heads = 4
save_outputs = true
"""


def limited(limit):
    """A preexec function: files larger than `limit` bytes cannot be written (EFBIG; SIGXFSZ ignored)."""
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def limited_ranks(limit, cmd):
    """`cmd` for mpirun's ranks, each with the file size limit of limited() (mpirun and its daemon need
    larger files of their own: the limit is set in the ranks only)."""
    return ["bash", "-c", f"ulimit -f {limit // 1024} && trap '' XFSZ && exec \"$@\"", "ranks", *cmd]


def temporaries(out):
    return sorted(str(p) for p in Path(out).rglob("*.tmp*"))


class FullDisk(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = Path(tempfile.mkdtemp(prefix="fastudy-full-disk-"))
        subprocess.run([sys.executable, SOURCE / "tests/import/write_hostile_imports.py", cls.dir / "runs", "st_many"], check=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def grid(self, name):
        out = self.dir / f"out-{name}"
        g = self.dir / f"{name}.toml"
        g.write_text(f'[study]\nname = "disk"\nout = "{out}"\n[import]\npath = "runs/st_many/s{{seed}}/step_{{step}}.safetensors"\n'
                     "[grid]\nseed = [1, 2]\n")
        return g, out

    def run_fastudy(self, args, ranks=0, limit=0):
        cmd = [FASTUDY, *map(str, args)]
        env = dict(os.environ)
        if ranks:
            # TCP between the ranks: Open MPI's shared-memory segments are files larger than the limit.
            env["OMPI_MCA_btl"] = "self,tcp"
            cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", *(limited_ranks(limit, cmd) if limit else cmd)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600,
                              preexec_fn=limited(limit) if limit and not ranks else None)

    def assert_one_named_failure(self, r, file_name, system_error=True):
        """Exit 1 (a negative code would be a signal: a crash), the first error line naming the file, its
        file system and, for a serial file, the system's error (the MPI-IO driver reports only that a
        write failed)."""
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        errors = [l for l in r.stderr.splitlines() if l.startswith("error: ")]
        self.assertTrue(errors, r.stderr)
        self.assertIn("cannot write ", errors[0])
        self.assertIn(file_name, errors[0])
        if system_error:
            self.assertIn("File too large", errors[0])
        self.assertIn("(the file system mounted at ", errors[0])

    def test_a_reduce_whose_results_do_not_fit_fails_naming_the_file_without_a_crash(self):
        for ranks in (0, 2):
            with self.subTest(ranks=ranks):
                g, out = self.grid(f"reduce-{ranks}")
                # 64 KiB: the study's own small files fit, deviation.h5 (301 tensors) does not.
                r = self.run_fastudy(["reduce", g, "-q"], ranks, 64 * 1024)
                self.assert_one_named_failure(r, "deviation.h5")
                self.assertEqual(temporaries(out), [])
                self.assertFalse((out / "deviation.h5").exists())
                # The same study on a file system with room: the reduce goes on (nothing was left broken).
                r = self.run_fastudy(["reduce", out, "-q"], ranks)
                self.assertEqual(r.returncode, 0, r.stderr)

    def test_save_outputs_that_do_not_fit_fail_naming_the_file_and_leave_no_temporary(self):
        out = self.dir / "out-saved"
        g = self.dir / "saved.toml"
        g.write_text(MICROBENCH.format(out=out))
        # A point's inputs and outputs (2 x 4 x 64 x 16 float64 values each, 64 KiB) do not fit in 128 KiB.
        r = self.run_fastudy(["microbench", g, "-q"], 0, 128 * 1024)
        self.assert_one_named_failure(r, "microbench_outputs.h5", system_error=False)
        self.assertEqual(temporaries(out), [])

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("unshare") and shutil.which("mount"),
                         "a small file system is a tmpfs in a private mount namespace: needs root, unshare and mount")
    def test_outputs_that_cannot_fit_are_refused_before_any_work(self):
        helper = Path(__file__).resolve().parent / "small_disk.py"
        g, out = self.grid("preflight")
        saved = self.dir / "saved-preflight.toml"
        cases = (("reduce", g, "the reduce's results (deviation.h5, deviation.csv, ...) needs about"),
                 ("microbench", saved, "microbench_outputs.h5 (save_outputs"))
        for job, grid, text in cases:
            with self.subTest(job=job):
                mount = self.dir / f"mnt-{job}"
                saved.write_text(MICROBENCH.format(out=mount / "out"))
                r = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable, str(helper), FASTUDY,
                                    job, str(grid), str(mount), str(64 * 1024)], capture_output=True, text=True, timeout=600)
                if r.returncode == 77:
                    self.skipTest(f"no tmpfs here: {r.stderr.strip()}")
                self.assertEqual(r.returncode, 0, r.stderr)
                res = json.loads(r.stdout)
                self.assertEqual(res["code"], 2, res)
                self.assertIn(text, res["stderr"])
                self.assertIn("free (nothing was run or written)", res["stderr"])
                self.assertEqual(res["files"], [], "nothing may be written")


if __name__ == "__main__":
    unittest.main()
