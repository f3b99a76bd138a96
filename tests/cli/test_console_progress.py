"""The console's progress (issue 30), through the fastudy binary on a tiny grid: on a terminal (a
pseudo-terminal from Python's pty module) train, microbench and reduce (configs/ci.toml) keep one status line updated in
place (carriage return, erase line); with stdout a pipe (a log, Slurm) the progress comes as plain lines
without control characters; -q prints neither; the files written are the same in every mode. Each run is
read until the program closes its output (its end), never waited for by time.
Run: FASTUDY_BIN=build/fastudy /usr/bin/python3 -m unittest -v test_console_progress
"""

import os
import pty
import re
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

BIN = os.environ.get("FASTUDY_BIN", "build/fastudy")
ERASE = "\r\x1b[K"  # to the line's start, erase it (base/log.cpp)
# configs/ci.toml (8 variants, 20 steps each) with the phases that show progress, not the report.
CI_GRID = Path(__file__).resolve().parents[2] / "configs" / "ci.toml"
PHASES = 'phases = ["microbench", "train", "reduce"]\n'


def on_terminal(args):
    """(exit code, everything the program wrote) with stdout and stderr a pseudo-terminal."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(BIN, [BIN] + args)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the program closed the terminal (it ended)
            break
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")


def in_a_log(args):
    """(exit code, stdout and stderr) with both a pipe."""
    r = subprocess.run([BIN] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    return r.returncode, r.stdout


def files(out):
    """The study's file names (not their contents: times differ from run to run)."""
    return sorted(str(p.relative_to(out)) for p in Path(out).rglob("*"))


class ConsoleProgressTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = Path(tempfile.mkdtemp(prefix="fastudy-progress-test-"))
        cls.grid = cls.dir / "grid.toml"
        cls.grid.write_text(CI_GRID.read_text().replace("[study]\n", "[study]\n" + PHASES, 1))
        cls.runs = {}
        for mode, run, extra in (("terminal", on_terminal, []), ("log", in_a_log, []), ("quiet", on_terminal, ["-q"])):
            out = cls.dir / mode
            cls.runs[mode] = run([str(cls.grid), "--out", str(out)] + extra) + (out,)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_terminal_one_line_in_place(self):
        code, text, _ = self.runs["terminal"]
        self.assertEqual(code, 0, text)
        # Each phase draws its status line in place (the first at once, later ones at most 5 times a second).
        self.assertRegex(text, re.escape(ERASE) + r"microbench: [1-4]/4 points, [0-9.]+ points/s, ETA (\?|\d+s)")
        self.assertRegex(text, re.escape(ERASE) + r"reduce: \d+/36 tasks \(step x tensor\), [0-9.]+ tasks/s, ETA")
        self.assertRegex(text, re.escape(ERASE) + r"train: \d/8 variants, \d+/160 steps, [0-9.]+ steps/s, ETA (\?|\d+s)")
        # A variant's end is drawn at once: the last one shows the whole phase done.
        self.assertIn(ERASE + "train: 8/8 variants, 160/160 steps", text)
        # The status line is erased before the phase's last line, which starts a line of its own.
        self.assertIn(ERASE + "train: 8 done, 0 diverged, 0 failed", text)
        # On a terminal the status line stands for the per-step lines.
        self.assertNotIn("step 10/20", text)

    def test_log_plain_lines(self):
        code, text, _ = self.runs["log"]
        self.assertEqual(code, 0, text)
        self.assertNotIn("\r", text)
        self.assertNotIn("\x1b", text)
        # One progress line per variant finished, each on a line of its own, the last with 8/8.
        lines = re.findall(r"^train: (\d)/8 variants, (\d+)/160 steps, [0-9.]+ steps/s, ETA (?:\?|\d+s)$", text, re.M)
        self.assertEqual([n for n, _ in lines], [str(i) for i in range(1, 9)])
        self.assertEqual(lines[-1][1], "160")
        self.assertIn("step 10/20", text)  # in a log the per-step lines stay

    def test_quiet(self):
        code, text, _ = self.runs["quiet"]
        self.assertEqual(code, 0, text)
        self.assertEqual(text, "")

    def test_files_the_same_in_every_mode(self):
        names = {mode: files(out) for mode, (_, _, out) in self.runs.items()}
        self.assertGreater(len(names["log"]), 10)
        self.assertEqual(names["terminal"], names["log"])
        self.assertEqual(names["quiet"], names["log"])


if __name__ == "__main__":
    unittest.main()
