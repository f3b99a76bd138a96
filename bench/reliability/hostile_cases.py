"""Hostile and careless use of the command line, replayed (issue 28): each case sets up a study (or a
folder, a grid, a lock) the way a careless or hostile user would, runs one fastudy command under a
time bound, and checks the promise it tests. A case passes when fastudy ends with the expected exit
code: 0 with the right result, or 1/2 with an error line that names the problem; and in every case
with no crash (a signal, other than the one a case sends), no hang (the time bound), no file outside
the study touched (everything else in the case's folder is compared before and after, and no marker
file of an injected command appears), and, where the case says so, the verdict (verdict.csv) equal to
a clean run's. The peak memory (max RSS) of the command's process is printed for every case.

Run (from the repository root; a tiny study of 4 variants is trained once, then about a minute):
  /usr/bin/python3 bench/reliability/hostile_cases.py build [--only NAME,NAME] [--timeout S]
Prints one row per case and exits 1 when any case fails.

A case is a function taking a Case (its folder, the clean study, helpers) that sets up the files,
returns the command to run and what to expect (Expect), and optionally checks the result further
(check(result) -> list of problems). Add it to CASES with the issue item it tests.
"""
import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The tiny study of byte_flips.py (4 variants, train and reduce, a few seconds).
from byte_flips import GRID, data_rows  # noqa: E402  (this script's folder is on the path)

MARKERS = re.compile(r"^(pwned.*|M[0-9])$")  # files an injected command would create


@dataclass
class Expect:
    argv: list                   # the command (strings), argv[0] the fastudy binary
    codes: tuple                 # accepted exit codes
    out: Path                    # the study folder: everything else in the case's folder must stay as it was
    names: str = ""              # for exit 1/2: a text an error line must contain
    cwd: Path = None
    env: dict = None
    verdict_same: bool = False   # verdict.csv equal to the clean run's afterwards
    during: object = None        # during(pid): called once the command runs (readiness, then a signal)
    check: object = None         # check(result) -> list of problems
    expected_signal: int = 0     # the signal the case itself sends with kill -9 (not a crash)
    own: tuple = ()              # paths outside the study the case itself writes (a stand-in's files)


@dataclass
class Result:
    code: object = None  # exit code, -signal, or "timeout"
    output: str = ""
    seconds: float = 0.0
    max_rss_mib: float = 0.0


class Case:
    def __init__(self, name, folder, fastudy, clean):
        self.name, self.dir, self.fastudy, self.clean = name, folder, fastudy, clean
        self.out = folder / "out"
        self.grid = folder / "grid.toml"
        self.grid.write_text(GRID.format(out=self.out))

    def study(self):
        """A copy of the clean study in self.out (train and reduce done)."""
        shutil.copytree(self.clean, self.out, symlinks=True)
        return self.out

    def run(self, *args, env=None, cwd=None):
        r = subprocess.run([self.fastudy, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
        return r.returncode, r.stdout + r.stderr


def tree(root, skip=()):
    """path -> (kind, size, sha256 of the bytes or the link target) for everything under root but the
    paths in skip (and what is under them)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath) / d not in skip]  # not walked into
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if any(p == s or s in p.parents for s in skip):
                continue
            if p.is_symlink():
                found[str(p)] = ("link", 0, os.readlink(p))
            elif p.is_dir():
                found[str(p)] = ("dir", 0, "")
            else:
                data = p.read_bytes()
                found[str(p)] = ("file", len(data), hashlib.sha256(data).hexdigest())
    return found


def execute(e, timeout):
    """Runs e.argv; returns a Result with its exit code (or -signal, or "timeout") and peak memory."""
    with tempfile.TemporaryFile() as log:
        p = subprocess.Popen(e.argv, stdout=log, stderr=subprocess.STDOUT, cwd=e.cwd, env=e.env)
        timer = threading.Timer(timeout, p.kill)
        t0 = time.monotonic()
        timer.start()
        timed_out = False
        try:
            if e.during is not None:
                e.during(p.pid)
            _, status, usage = os.wait4(p.pid, 0)
        finally:
            timed_out = not timer.is_alive() and time.monotonic() - t0 >= timeout
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read().decode(errors="replace")
    code = "timeout" if timed_out else p.returncode
    return Result(code, output, time.monotonic() - t0, usage.ru_maxrss / 1024.0)


def wait_for(ready, timeout=120):
    """Polls ready() until it holds; the sleep is the polling interval, not a synchronisation."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ready():
            return True
        time.sleep(0.005)
    return False


def error_lines(output):
    return [l for l in output.splitlines() if l.startswith("error: ")]


# ---- the cases ----------------------------------------------------------------------------------------

def force_fake_study(c):
    """--force on a folder whose study.toml fastudy did not write (with the user's thesis and data)."""
    c.out.mkdir()
    (c.out / "study.toml").write_text('[study]\nname = "mine"\n')
    (c.out / "thesis.tex").write_text("\\documentclass{article}")
    (c.out / "data").mkdir()
    (c.out / "data" / "x.csv").write_text("1\n")
    before = tree(c.out)
    return Expect([c.fastudy, "train", c.grid, "--force"], (2,), c.out, names="without fastudy.manifest",
                  check=lambda r: [] if tree(c.out) == before else ["the folder changed"])


def force_out_dot(c):
    """`cd project && fastudy study.toml --out . --force`: the user's own grid is called study.toml."""
    project = c.dir / "project"
    (project / "src").mkdir(parents=True)
    (project / "study.toml").write_text(GRID.format(out="unused"))
    (project / "README").write_text("mine")
    (project / "src" / "main.c").write_text("int main() {}")
    before = tree(project)
    return Expect([c.fastudy, "study.toml", "--out", ".", "--force"], (2,), project, cwd=project,
                  names="without fastudy.manifest", check=lambda r: [] if tree(project) == before else ["the project changed"])


def force_keeps_user_files(c):
    """run --force on a study with the user's notes in it: they stay, the study starts over, same verdict."""
    out = c.study()
    (out / "notes.txt").write_text("my notes")
    (out / "variants" / "flash-fp32" / "mine.txt").write_text("mine")
    notes = {p: (out / p).read_text() for p in ("notes.txt", "variants/flash-fp32/mine.txt")}
    return Expect([c.fastudy, c.grid, "--force", "-q"], (0,), out, verdict_same=True,
                  check=lambda r: [f"{p} changed" for p, t in notes.items() if not (out / p).exists() or (out / p).read_text() != t])


def reduce_force_keeps_checkpoints(c):
    """reduce --force deletes only reduce's files: the checkpoints stay, the verdict is the same."""
    out = c.study()
    before = tree(out / "checkpoints")
    return Expect([c.fastudy, "reduce", out, "--force", "-q"], (0,), out, verdict_same=True,
                  check=lambda r: [] if tree(out / "checkpoints") == before else ["the checkpoints changed"])


def force_damaged_manifest(c):
    """--force on a study whose manifest does not match its checksum: refused, nothing deleted."""
    out = c.study()
    m = out / "fastudy.manifest"
    data = bytearray(m.read_bytes())
    data[len(data) // 2] ^= 0xFF
    m.write_bytes(bytes(data))
    before = tree(out)
    return Expect([c.fastudy, "train", c.grid, "--force"], (2,), out, names="fastudy.manifest",
                  check=lambda r: [] if tree(out) == before else ["the study changed"])


def slurm_hostile_paths(c):
    """slurm with a grid path holding newlines, $(...), backticks, quotes and ';', and an --out with $(...),
    backticks and ';': the script passes bash -n, runs nothing else, and hands fastudy the exact paths. (A
    study name like that never reaches the script: the naming rule refuses it at load, see
    study-name-with-newline.)"""
    gdir = c.dir / "g\nid>pwned\n$(touch M1)`touch M2`;touch M3 'q\" \\"
    gdir.mkdir()
    grid = gdir / "grid.toml"
    grid.write_text(GRID.format(out="unused"))
    out = c.dir / "o$(touch${IFS}M6)`touch${IFS}M7`;touch${IFS}M8"
    run, stub = c.dir / "run", c.dir / "bin"
    run.mkdir()
    stub.mkdir()
    (stub / "srun").write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" > '{c.dir}/srun.args'\n")
    (stub / "srun").chmod(0o755)

    def check(r):
        script = out / "fastudy.sbatch"
        problems = []
        if subprocess.run(["bash", "-n", str(script)], cwd=run).returncode != 0:
            problems.append("bash -n fails")
        env = dict(os.environ, PATH=f"{stub}:/usr/bin:/bin", SLURM_JOB_ID="7")
        subprocess.run(["bash", str(script)], cwd=run, env=env, capture_output=True)
        args = (c.dir / "srun.args").read_bytes().split(b"\0")[:-1] if (c.dir / "srun.args").exists() else []
        if [a.decode() for a in args[3:]] != ["run", str(grid), "--out", str(out), "--resume"]:
            problems.append(f"srun got {args}")
        text = script.read_text()
        head = text[:text.rfind("\n#SBATCH ")]
        if any(not l.startswith("#") for l in head.splitlines()):
            problems.append("a line before the last #SBATCH line is not a comment")
        return problems

    return Expect([c.fastudy, "slurm", grid, "--out", out, "--time", "00:10:00"], (0,), out, cwd=run, check=check)


def slurm_out_with_newline(c):
    """slurm --out with a newline: an #SBATCH line cannot hold it; refused before anything is written."""
    out = c.dir / "o\nut"
    return Expect([c.fastudy, "slurm", c.grid, "--out", out, "--time", "00:10:00"], (2,), out, names="cannot hold",
                  check=lambda r: ["the folder was created"] if out.exists() else [])


def status_csv_directory(c):
    """status.csv replaced by a directory: --resume sets it aside (never deletes it) and rebuilds it."""
    out = c.study()
    (out / "status.csv").unlink()
    (out / "status.csv").mkdir()
    (out / "status.csv" / "note.txt").write_text("mine")

    def check(r):
        problems = []
        if (out / "status.csv.set-aside-1" / "note.txt").read_text() != "mine":
            problems.append("the directory was not set aside")
        code, text = c.run("status", out)
        if code != 0 or "4 variants: 4 done" not in text:
            problems.append(f"status after the repair: exit {code}")
        return problems

    return Expect([c.fastudy, "train", c.grid, "--resume", "-q"], (0,), out, verdict_same=True, check=check)


def reseal(path):
    """Writes the checksum sidecar of `path` again (as fastudy does): a tampered file that no checksum tells."""
    data = Path(path).read_bytes()
    Path(f"{path}.crc").write_text(f"fastudy-crc32/1 {len(data)} {zlib.crc32(data):08x}\n")


def retag(path, **attrs):
    """Rewrites root attributes of a checkpoint (h5py) and reseals it."""
    import h5py
    with h5py.File(path, "r+") as f:
        for k, v in attrs.items():
            f.attrs[k] = v
    reseal(path)


def csv_problems(out):
    """Every CSV of a study read back as the report reads it: '#' lines and rows of the header's width."""
    import csv
    import io
    problems = []
    for path in sorted(Path(out).glob("*.csv")):
        lines = [l for l in path.read_text().split("\n") if l]
        body = [l for l in lines if not l.startswith("#")]
        rows = list(csv.reader(io.StringIO("\n".join(body))))
        if any(len(r) != len(rows[0]) for r in rows):
            problems.append(f"{path.name}: rows of another width than the header")
        if path.name not in ("status.csv", "variants.csv") and sum(l.startswith("# grid: ") for l in lines) != 1:
            problems.append(f"{path.name}: the '# grid:' header is not one line")
    return problems


def grid_path_newline(c):
    """A grid in a folder whose name holds a newline, a comma and a quote: the study runs, and every CSV's
    provenance header stays one line per key (the same verdict)."""
    gdir = c.dir / 'g\nx,"y'
    gdir.mkdir()
    grid = gdir / "grid.toml"
    grid.write_text(GRID.format(out=c.out))
    return Expect([c.fastudy, grid, "-q"], (0,), c.out, verdict_same=True, check=lambda r: csv_problems(c.out))


def quiet_failed_variant(c):
    """-q with a variant that fails (its checkpoints say they were trained with another configuration, and
    --resume without --force does not retrain it): exit 1 and an error line."""
    out = c.study()
    for p in (out / "checkpoints" / "flash-fp32").glob("step_*.h5"):
        retag(p, config_hash="00000000deadbeef")
    return Expect([c.fastudy, "train", c.grid, "--resume", "-q"], (1,), out, names="flash-fp32 failed")


def copy_checkpoint(src, dst):
    for suffix in ("", ".crc"):
        shutil.copy(f"{src}{suffix}", f"{dst}{suffix}")


def checkpoint_case(job, src_variant, src_step, dst_variant, dst_step, names, retag_hash=False):
    """A checkpoint copied with its valid sidecar into another place (or trained with another configuration):
    `job` catches it (status, reduce, report: exit 1 naming it), or --resume repairs it to the clean verdict."""
    def case(c):
        out = c.study()
        dst = out / "checkpoints" / dst_variant / f"step_{dst_step:07d}.h5"
        if retag_hash:
            retag(dst, config_hash="00000000deadbeef")
        else:
            copy_checkpoint(out / "checkpoints" / src_variant / f"step_{src_step:07d}.h5", dst)
        if job == "resume":
            def check(r):
                code, text = c.run("reduce", out, "-q")
                return [] if code == 0 else [f"reduce after the repair: exit {code}"]
            return Expect([c.fastudy, "train", c.grid, "--resume", "-q"], (0,), out, verdict_same=True, check=check)
        return Expect([c.fastudy, job, out], (1,), out, names=names, env=dict(os.environ, FASTUDY_PYTHON="/bin/true"),
                      check=lambda r: [] if str(dst) in r.output else ["the checkpoint is not named"])
    what = "another configuration's checkpoint" if retag_hash else f"{src_variant} step {src_step} copied over {dst_variant} step {dst_step}"
    case.__doc__ = f"{what}: {job}"
    return case


def fake_renderer(c, body):
    """A stand-in for the report's Python: passes the module check, runs body, writes c.dir/ready, loops."""
    script = c.dir / "python"
    ready = c.dir / "ready"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = \"-c\" ] && exit 0\n{body}\necho $$ > '{ready}.tmp' && mv '{ready}.tmp' '{ready}'\n"
                      "while :; do sleep 0.05; done\n")
    script.chmod(0o755)
    return dict(os.environ, FASTUDY_PYTHON=str(script)), ready


def report_sigint(c):
    """SIGINT while the renderer runs (it has written a plot into its staging folder): nothing new in the
    study, and the message that says nothing was written is true."""
    out = c.study()
    env, ready = fake_renderer(c, 'mkdir -p "$6/report_files" && echo png > "$6/report_files/new.png"')
    before = tree(out)
    staged = []

    def during(pid):
        if wait_for(ready.exists):
            staged.extend(out.rglob("new.png"))  # the fault in place: a plot was written before the signal
            os.kill(pid, signal.SIGINT)

    def check(r):
        if not staged:
            return ["the renderer wrote no plot before the signal (its folder is not --into DIR)"]
        after = {k: v for k, v in tree(out).items() if not k.endswith(("fastudy.manifest", "fastudy.manifest.crc"))}
        kept = {k: v for k, v in before.items() if not k.endswith(("fastudy.manifest", "fastudy.manifest.crc"))}
        return [] if after == kept and "nothing was written" in r.output else ["the study changed, or no such message"]

    return Expect([c.fastudy, "report", out], (1,), out, env=env, names="stopped by a signal", during=during, check=check,
                  own=(ready,))


def report_kill9(c):
    """kill -9 of `fastudy report`: its renderer (which never ends by itself) must end with it."""
    out = c.study()
    env, ready = fake_renderer(c, "")
    child = {}

    def during(pid):
        if wait_for(ready.exists):
            child["pid"] = int(ready.read_text())
            os.kill(pid, signal.SIGKILL)

    def ended(pid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        return stat[stat.rfind(")") + 2] == "Z"

    def check(r):
        pid = child.get("pid")
        if pid is None:
            return ["the renderer never started"]
        if not wait_for(lambda: ended(pid), 60):
            os.kill(pid, signal.SIGKILL)
            return ["the renderer outlived fastudy"]
        return []

    return Expect([c.fastudy, "report", out], (-signal.SIGKILL,), out, env=env, during=during, check=check,
                  expected_signal=signal.SIGKILL, own=(ready,))


def report_full_disk(c):
    """report on a full file system (a small tmpfs in a private mount namespace; root): one error line
    naming the file system, the study byte for byte as before (its manifest aside)."""
    out = c.study()
    helper = ROOT / "tests" / "report" / "full_disk.py"
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    import json

    def check(r):
        try:
            res = json.loads(r.output)
        except ValueError:
            return [f"the helper failed: {r.output[-300:]}"]
        lines = [l for l in res["stderr"].splitlines() if l.startswith("error: ")]
        problems = []
        if res["code"] != 1 or len(lines) != 1 or "No space left on device" not in lines[0] or "mounted at" not in lines[0]:
            problems.append(f"exit {res['code']}, error lines {lines}")
        # The manifest may gain the report's entries (registered before the renderer starts).
        before, after = ({k: v for k, v in res[t].items() if not k.startswith("fastudy.manifest")} for t in ("before", "after"))
        if after != before or "Traceback" in res["stderr"]:
            problems.append("the study changed, or a traceback")
        r.code, r.output, e.codes = res["code"], res["stderr"], (1,)  # the table shows fastudy's, not the helper's
        return problems

    e = Expect(["unshare", "-m", "--propagation", "private", sys.executable, str(helper), c.fastudy, str(out),
                str(c.dir / "mnt"), str(48 * 1024)], (0,), out, check=check, own=(c.dir / "mnt",))
    return e


def lock_case(content, what):
    def case(c):
        out = c.study()
        lock = out / "fastudy.lock"
        if content is None:
            lock.symlink_to(c.dir / "elsewhere")
        else:
            lock.write_bytes(content)
        return Expect([c.fastudy, "train", c.grid, "--resume"], (2,), out, names=what,
                      check=lambda r: [] if os.path.lexists(lock) else ["the lock was cleared"])
    case.__doc__ = f"a lock that is {what}: refused as unreadable with how to remove it, never cleared"
    return case


def lock_zombie(c):
    """a lock whose holder is a zombie (ended, not reaped): it is gone, the lock is taken over."""
    out = c.study()
    zombie = subprocess.Popen(["true"])
    wait_for(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().split(")")[1].split()[0] == "Z")
    start = Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    (out / "fastudy.lock").write_text(f"host={os.uname().nodename}\npid={zombie.pid}\nstart={start}\n"
                                      "since=2026-01-01T00:00:00Z\ncommand=fastudy train held.toml\n")

    def check(r):
        zombie.wait()
        return [] if "taking over the lock" in r.output else ["the lock was not taken over"]

    return Expect([c.fastudy, "train", c.grid, "--resume"], (0,), out, verdict_same=True, check=check)


def unknown_job(c):
    """a misspelt job name: named as an unknown job, the jobs listed."""
    return Expect([c.fastudy, "trian", c.grid], (2,), c.out, names="unknown job 'trian'")


def status_missing_folder(c):
    """status of a folder that does not exist."""
    return Expect([c.fastudy, "status", c.out], (2,), c.out, names="does not exist")


def grace_not_a_number(c):
    """FASTUDY_STOP_GRACE_S=abc: refused before anything runs."""
    return Expect([c.fastudy, "train", c.grid], (2,), c.out, env=dict(os.environ, FASTUDY_STOP_GRACE_S="abc"),
                  names="FASTUDY_STOP_GRACE_S", check=lambda r: ["the study was written"] if c.out.exists() else [])


def nothing_written(c):
    return lambda r: ["the study was written"] if c.out.exists() else []


def policy_named_as_path(c):
    """A custom policy named like a path that would become OUT/checkpoints/<id> (item 1): refused at load,
    naming the policy and the rule; nothing written inside or outside the study."""
    grid = GRID.format(out=c.out).replace('precision = ["fp32", "bf16"]',
                                          'precision = ["fp32", "bf16"]\npolicy = ["../../../x", "mixed"]')
    c.grid.write_text(grid + '[attention.policies."../../../x"]\npreset = "mixed"\n')
    return Expect([c.fastudy, c.grid], (2,), c.out, names="holds '/'", check=nothing_written(c))


def study_name_with_newline(c):
    """A study name with a newline and a NUL escape (items 1, 9): refused at load, naming the key."""
    c.grid.write_text(GRID.format(out=c.out).replace('name = "flips"', 'name = "a\\nb"'))
    return Expect([c.fastudy, c.grid], (2,), c.out, names="[study] name", check=nothing_written(c))


def deep_dotted_key(c):
    """A dotted key 100,000 levels deep (item 4): refused before the TOML parser recurses."""
    c.grid.write_text(GRID.format(out=c.out) + "x" + ".a" * 100000 + " = 1\n")
    return Expect([c.fastudy, "plan", c.grid], (2,), c.out, names="levels deep", check=nothing_written(c))


def grid_dev_zero(c):
    """/dev/zero as the grid (item 5): named as not a regular file, no unbounded read."""
    return Expect([c.fastudy, "plan", "/dev/zero"], (2,), c.out, names="/dev/zero")


def grid_fifo(c):
    """A FIFO nobody writes to as the grid (item 5): named, no hang."""
    fifo = c.dir / "grid.fifo"
    os.mkfifo(fifo)
    # own: the harness's snapshot of the case's folder must not open the FIFO itself
    return Expect([c.fastudy, "plan", fifo], (2,), c.out, names="grid.fifo", own=(fifo,))


def grid_empty(c):
    """An empty grid and /dev/null (item 5): refused at load, not run as one default variant."""
    c.grid.write_text("# nothing here\n\n")
    return Expect([c.fastudy, c.grid], (2,), c.out, names="sets nothing", check=nothing_written(c))


def huge_grid(c):
    """2 x 10^9 variants (item 6): refused within seconds, counted from the axis sizes, never expanded."""
    seeds = "[" + ", ".join(str(i) for i in range(1, 1001)) + "]"
    grid = GRID.format(out=c.out).replace('precision = ["fp32", "bf16"]',
                                          f"seed = {seeds}\nrepeat = {seeds}\nlr = [" +
                                          ", ".join(f"0.{i:04d}" for i in range(1, 1001)) + "]")
    c.grid.write_text(grid)
    return Expect([c.fastudy, "plan", c.grid], (2,), c.out, names="max_variants",
                  check=lambda r: [f"took {r.seconds:.1f} s"] if r.seconds > 10 else [])


def changed_configuration(c):
    """A grid of another configuration into a trained study (item 8): refused naming the setting; study.toml
    and the verdict stay as they were."""
    out = c.study()
    before = (out / "study.toml").read_text()
    c.grid.write_text(GRID.format(out=out).replace("warmup = 2", "warmup = 3"))
    return Expect([c.fastudy, "reduce", c.grid, "--resume", "--force"], (2,), out, names="train.warmup",
                  verdict_same=True,
                  check=lambda r: [] if (out / "study.toml").read_text() == before else ["study.toml was rewritten"])

CASES = [
    (2, "force-fake-study", force_fake_study),
    (2, "force-out-dot", force_out_dot),
    (2, "force-keeps-user-files", force_keeps_user_files),
    (2, "reduce-force-keeps-checkpoints", reduce_force_keeps_checkpoints),
    (2, "force-damaged-manifest", force_damaged_manifest),
    (1, "policy-named-as-path", policy_named_as_path),
    (1, "study-name-with-newline", study_name_with_newline),
    (4, "deep-dotted-key", deep_dotted_key),
    (5, "grid-dev-zero", grid_dev_zero),
    (5, "grid-fifo", grid_fifo),
    (5, "grid-empty", grid_empty),
    (6, "huge-grid", huge_grid),
    (8, "changed-configuration", changed_configuration),
    (3, "slurm-hostile-paths", slurm_hostile_paths),
    (3, "slurm-out-with-newline", slurm_out_with_newline),
    (10, "status-csv-directory", status_csv_directory),
    (11, "quiet-failed-variant", quiet_failed_variant),
    (9, "grid-path-newline", grid_path_newline),
    (7, "step-copied-status", checkpoint_case("status", "flash-fp32", 2, "flash-fp32", 4, "at step 2, not variant")),
    (7, "step-copied-reduce", checkpoint_case("reduce", "flash-fp32", 2, "flash-fp32", 4, "at step 2, not variant")),
    (7, "step-copied-resume", checkpoint_case("resume", "flash-fp32", 2, "flash-fp32", 4, "")),
    (7, "variant-swapped-status", checkpoint_case("status", "baseline-fp32", 4, "flash-bf16", 4, "'baseline-fp32' at step 4")),
    (7, "variant-swapped-reduce", checkpoint_case("reduce", "baseline-fp32", 4, "flash-bf16", 4, "'baseline-fp32' at step 4")),
    (7, "variant-swapped-report", checkpoint_case("report", "baseline-fp32", 4, "flash-bf16", 4, "'baseline-fp32' at step 4")),
    (7, "variant-swapped-resume", checkpoint_case("resume", "baseline-fp32", 4, "flash-bf16", 4, "")),
    (7, "other-config-reduce", checkpoint_case("reduce", None, 0, "baseline-bf16", 2, "configuration hash", retag_hash=True)),
    (7, "other-config-resume", checkpoint_case("resume", None, 0, "baseline-bf16", 2, "", retag_hash=True)),
    (12, "report-sigint", report_sigint),
    (12, "report-kill-9", report_kill9),
    (12, "report-full-disk", report_full_disk),
    (13, "lock-empty", lock_case(b"", "is unreadable (empty)")),
    (13, "lock-garbage", lock_case(b"\x01garbage\n", "is unreadable")),
    (13, "lock-symlink", lock_case(None, "is a symbolic link")),
    (13, "lock-zombie-holder", lock_zombie),
    (13, "unknown-job", unknown_job),
    (13, "status-missing-folder", status_missing_folder),
    (13, "grace-not-a-number", grace_not_a_number),
]


def judge(e, r, outside_before, outside_after, clean_verdict):
    """The promises every case keeps (before its own check runs)."""
    problems = []
    if r.code == "timeout":
        problems.append("hang (time bound)")
    elif r.code not in e.codes:
        problems.append(f"exit {r.code}, expected {'/'.join(map(str, e.codes))}")
    elif isinstance(r.code, int) and r.code < 0 and -r.code != e.expected_signal:
        problems.append(f"crash (signal {-r.code})")
    if r.code in (1, 2) and e.names and not any(e.names in l for l in error_lines(r.output)):
        problems.append(f"no error line naming '{e.names}'")
    if outside_after != outside_before:
        changed = sorted(set(outside_after.items()) ^ set(outside_before.items()))
        problems.append(f"touched outside the study: {changed[0][0]}")
    if e.verdict_same and data_rows(e.out / "verdict.csv") != clean_verdict:
        problems.append("the verdict changed")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    fastudy = str(Path(args.build).resolve() / "fastudy")
    work = Path(tempfile.mkdtemp(prefix="fastudy-hostile-"))
    clean = work / "clean"
    (work / "clean.toml").write_text(GRID.format(out=clean))
    r = subprocess.run([fastudy, work / "clean.toml", "-q"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the clean run failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    clean_verdict = data_rows(clean / "verdict.csv")
    only = set(filter(None, args.only.split(",")))
    print(f"{'case':32s} {'item':>4s} {'exit':>5s} {'want':>5s} {'s':>6s} {'RSS MiB':>8s}  result  first error line / problem")
    failed = 0
    for item, name, make in CASES:
        if only and name not in only:
            continue
        folder = work / name
        folder.mkdir()
        try:
            e = make(Case(name, folder, fastudy, clean))
        except Exception as exc:  # a setup that assumes what this build does not write: the case fails
            failed += 1
            print(f"{name:32s} {item:4d} {'-':>5s} {'-':>5s} {'-':>6s} {'-':>8s}  FAIL    setup: {type(exc).__name__}: {exc}"[:200])
            continue
        if e is None:
            print(f"{name:32s} {item:4d} {'-':>5s} {'-':>5s} {'-':>6s} {'-':>8s}  skip    needs root and unshare")
            continue
        e.argv = [str(a) for a in e.argv]
        skip = (Path(e.out), *map(Path, e.own))
        outside_before = tree(folder, skip)
        r = execute(e, args.timeout)
        problems = judge(e, r, outside_before, tree(folder, skip), clean_verdict)
        if e.check is not None:
            try:
                problems += e.check(r)  # may run what fastudy wrote (the sbatch script): markers after it
            except Exception as exc:
                problems.append(f"check: {type(exc).__name__}: {exc}")
        markers = [p for p in folder.rglob("*") if MARKERS.match(p.name)]
        if markers:
            problems.append(f"an injected command ran: {markers[0]}")
        lines = error_lines(r.output)
        note = problems[0] if problems else (lines[0][7:] if lines else "")
        failed += bool(problems)
        print(f"{name:32s} {item:4d} {str(r.code):>5s} {'/'.join(map(str, e.codes)):>5s} {r.seconds:6.1f} "
              f"{r.max_rss_mib:8.0f}  {'FAIL' if problems else 'pass':6s}  {note[:110]}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print("every case as promised" if failed == 0 else f"{failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
