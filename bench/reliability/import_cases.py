"""Untrusted files and careless setups around imported studies, replayed: crafted import files, special
files in a checkpoint's place, names and folders from other stacks, damaged provenance, full disks,
long working directories and the smaller cases of the same round, each as one fastudy command under a
time bound, judged as bench/reliability/hostile_cases.py judges its cases (its Expect, execute and
judge): the expected exit code, an error line naming the file, tensor or key, no crash, no hang, no
file outside the study touched; and, where a case says so, the right numbers (check).

The imported runs come from tests/import/write_hostile_imports.py (two runs of one step each, [grid]
seed = [1, 2]); a trained study (for the cases of trained studies) from hostile_cases.py's grid.

Run (from the repository root; about a minute):
  /usr/bin/python3 bench/reliability/import_cases.py build [--only NAME,NAME] [--timeout S]
Prints one row per case (its class: the item of the round it replays) and exits 1 when any case fails.
"""
import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from hostile_cases import Expect, ROOT, error_lines, execute, judge, tree  # noqa: E402  (this script's folder)
from byte_flips import GRID  # noqa: E402

WRITER = ROOT / "tests/import/write_hostile_imports.py"


class Case:
    def __init__(self, name, folder, fastudy, runs, trained):
        self.name, self.dir, self.fastudy, self.runs, self.trained = name, folder, fastudy, runs, trained
        self.out = folder / "out"

    def grid(self, kase, file="step_{step}.safetensors", extra=""):
        """A grid over the runs of write_hostile_imports.py's case `kase` (copied into this case's folder)."""
        src = self.runs / kase
        dst = self.dir / "runs" / kase
        if not dst.exists():
            shutil.copytree(src, dst, symlinks=True)
        g = self.dir / "grid.toml"
        g.write_text(f'[study]\nname = "hostile"\nout = "{self.out}"\n[import]\npath = "runs/{kase}/s{{seed}}/{file}"\n'
                     f"{extra}[grid]\nseed = [1, 2]\n")
        return g

    def run(self, *args, env=None, cwd=None):
        r = subprocess.run([self.fastudy, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
        return r.returncode, r.stdout + r.stderr


def refused(kase, file, names, job="plan"):
    """`fastudy JOB` on the case's runs: exit 2, an error line naming `names`, nothing written."""
    def case(c):
        g = c.grid(kase, file)
        return Expect([c.fastudy, job, g], (2,), c.out, names=names,
                      check=lambda r: ["the study was written"] if c.out.exists() else [])
    case.__doc__ = f"{kase}: `fastudy {job}` refuses it naming {names!r}"
    return case


def special(kase, file, victim, make, names):
    """A special file (make(path)) in place of one run's file: refused, named, no hang, no unbounded read."""
    def case(c):
        g = c.grid(kase, file)
        p = c.dir / "runs" / kase / victim
        if p.exists() or p.is_symlink():
            p.unlink()
        make(p)
        return Expect([c.fastudy, "plan", g], (2,), c.out, names=names, own=(p,))
    case.__doc__ = f"{victim} is {make.__doc__}: plan names it, without a hang or an unbounded read"
    return case


def fifo(p):
    """a FIFO"""
    os.mkfifo(p)


def dev_zero(p):
    """/dev/zero"""
    p.symlink_to("/dev/zero")


def libhdf5_crash(p):
    """a file that crashes libhdf5 itself (tests/fuzz/regressions)"""
    shutil.copyfile(ROOT / "tests/fuzz/regressions/hdf5/libhdf5-symbol-table-null-read.h5", p)


def deviation_rows(out):
    text = (Path(out) / "deviation.csv").read_text()
    return list(csv.reader(io.StringIO("\n".join(l for l in text.splitlines() if not l.startswith("#")))))


def reduced(kase, file, check_rows, what):
    """`fastudy reduce` of the case: exit 0 and deviation.csv as check_rows(rows) wants (a list of problems)."""
    def case(c):
        g = c.grid(kase, file)
        return Expect([c.fastudy, "reduce", g, "-q"], (0,), c.out, check=lambda r: check_rows(deviation_rows(c.out)))
    case.__doc__ = f"{kase}: reduce reads it ({what})"
    return case


def has_tensors(*names):
    def check(rows):
        tensors = {r[1] for r in rows[1:]}
        return [] if tensors == set(names) else [f"tensors {sorted(tensors)}, expected {sorted(names)}"]
    return check


def view_ok(rows):
    """W1 of the whole model between s1 and s2 (elements 1 and 3 of w + 0.01 and + 0.02): 0.01 within two
    fp32 roundings at 0.3 (2 * 2^-24 * 0.3 < 4e-8)."""
    w1 = [float(r[4]) for r in rows[1:] if r[1] == "model"]
    return [] if len(w1) == 1 and abs(w1[0] - 0.01) < 4e-8 else [f"model W1 {w1}, expected 0.01"]


def names_case(c):
    """Names from other stacks (a TF path, mathtext, HTML and '|'): reduce and report, every name as text."""
    g = c.grid("st_names")

    def check(r):
        code, text = c.run("report", c.out, "-q")
        if code != 0:
            return [f"report: exit {code}: {text[-300:]}"]
        md = (c.out / "report.md").read_text()
        problems = []
        if "<b>x</b>" in md or "&lt;b&gt;x&lt;/b&gt;\\|y\\\\" not in md:
            problems.append("report.md carries the name's HTML, or splits its cell")
        if "could not be rendered" in md:
            problems.append("a section failed (mathtext?)")
        out = subprocess.run([sys.executable, "-c", "import h5py,sys; f=h5py.File(sys.argv[1]);"
                              "print(sorted(g.attrs['name'] for g in f['steps/10'].values()))", c.out / "deviation.h5"],
                             capture_output=True, text=True).stdout
        if "'enc/layer0/w'" not in out:
            problems.append(f"deviation.h5 names: {out.strip()}")
        return problems

    return Expect([c.fastudy, "reduce", g, "-q"], (0,), c.out, check=check)


def many_tensors(c):
    """300 tensors per file: each file opened once by the reduce (the -v debug lines)."""
    g = c.grid("st_many")

    def check(r):
        opens = [l for l in r.output.splitlines() if "reduce: opened " in l]
        return [] if len(opens) == 2 else [f"{len(opens)} opens of 2 files"]

    return Expect([c.fastudy, "reduce", g, "-v"], (0,), c.out, check=check)


def odd_folder(c):
    """An import folder holding a tab, a newline, a comma and a quote, on 2 ranks: imported.csv has 3
    fields a row, the path escaped onto one line."""
    odd = c.dir / "runs" / 'imp\tx\ny,"q'
    shutil.copytree(c.runs / "st_good", odd)
    g = c.dir / "grid.toml"
    g.write_text(f'[study]\nname = "hostile"\nout = "{c.out}"\n[import]\npath = "runs/imp\\tx\\ny,\\"q/s{{seed}}/step_{{step}}.safetensors"\n'
                 "[grid]\nseed = [1, 2]\n")

    def check(r):
        lines = [l for l in (c.out / "imported.csv").read_text().splitlines() if l and not l.startswith("#")]
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
        return [] if len(rows) == 3 and all(len(x) == 3 for x in rows) and "\\t" in rows[1][0] else [f"imported.csv rows {rows}"]

    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return Expect(["mpirun", "-n", "2", "--oversubscribe", c.fastudy, "reduce", g, "-q"], (0,), c.out, env=env, check=check)


def imported_csv(damage, names):
    def case(c):
        g = c.grid("st_good")
        code, text = c.run("reduce", g, "-q")
        if code != 0:
            raise RuntimeError(f"the first reduce failed: {text[-300:]}")
        damage(c.out / "imported.csv")
        return Expect([c.fastudy, "reduce", c.out], (0,), c.out, check=lambda r: (
            [] if names in r.output and "changed since" not in r.output else [f"no warning {names!r}, or a false change"]))
    case.__doc__ = f"imported.csv {damage.__doc__}: the next reduce warns ({names!r}), compares nothing with it"
    return case


def flip(p):
    """with a flipped byte"""
    data = bytearray(p.read_bytes())
    data[-3] ^= 1
    p.write_bytes(bytes(data))


def fifo_in_place(p):
    """replaced by a FIFO"""
    p.unlink()
    os.mkfifo(p)


def garbage(p):
    """replaced by garbage and resealed"""
    import zlib
    data = b"path,bytes,crc32\nnot,a,number\n"
    p.write_bytes(data)
    Path(f"{p}.crc").write_text(f"fastudy-crc32/1 {len(data)} {zlib.crc32(data):08x}\n")


def fifo_crc(c):
    """OUT/study.toml.crc replaced by a FIFO: `fastudy status` names study.toml, without a hang."""
    g = c.grid("st_good")
    code, text = c.run("reduce", g, "-q")
    if code != 0:
        raise RuntimeError(f"the reduce failed: {text[-300:]}")
    (c.out / "study.toml.crc").unlink()
    os.mkfifo(c.out / "study.toml.crc")
    return Expect([c.fastudy, "status", c.out], (1, 2), c.out, names="study.toml")


def limited(limit_kib, argv):
    """argv with files larger than limit_kib KiB unwritable (EFBIG: a full disk for the files that meet it)."""
    return ["bash", "-c", f"ulimit -f {limit_kib} && trap '' XFSZ && exec \"$@\"", "limited", *map(str, argv)]


def write_failed(c, file_name, system_error):
    def check(r):
        lines = error_lines(r.output)
        problems = []
        if not lines or "cannot write " not in lines[0] or file_name not in lines[0] or "(the file system mounted at" not in lines[0]:
            problems.append(f"error lines {lines[:1]}")
        if system_error and lines and "File too large" not in lines[0]:
            problems.append("no system error in the line")
        if list(c.out.rglob("*.tmp*")):
            problems.append("a temporary file was left behind")
        return problems
    return check


def reduce_full_disk(c):
    """reduce of 300 tensors whose deviation.h5 cannot be written (a file size limit of 64 KiB, as a full
    disk for it): one error line naming the file, the system's error and the file system, exit 1, no
    crash at the end (MPI_Finalize), no temporary left."""
    g = c.grid("st_many")
    return Expect(limited(64, [c.fastudy, "reduce", g, "-q"]), (1,), c.out, check=write_failed(c, "deviation.h5", True))


SAVED = """[study]
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


def saved_outputs_full_disk(c):
    """microbench with save_outputs whose file cannot be written (a file size limit of 128 KiB): one error
    line naming microbench_outputs.h5 and the file system, exit 1, no temporary left."""
    g = c.dir / "saved.toml"
    g.write_text(SAVED.format(out=c.out))
    return Expect(limited(128, [c.fastudy, "microbench", g, "-q"]), (1,), c.out,
                  check=write_failed(c, "microbench_outputs.h5", False))


def long_cwd(c):
    """A working directory of 5,000 characters (more than PATH_MAX) and a relative --out: refused naming
    PATH_MAX before the lock, nothing left behind."""
    g = c.grid("st_good")
    part = "d" * 200
    fd = os.open(c.dir, os.O_RDONLY)
    for _ in range(25):  # made by openat: the path as a whole is too long for mkdir(2)
        os.mkdir(part, dir_fd=fd)
        nfd = os.open(part, os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    # The shell enters it one relative step at a time (no absolute path that long can be passed).
    cd = " && ".join([f"cd '{c.dir}'"] + [f"cd {part}"] * 25)

    def check(r):
        found = subprocess.run(["find", str(c.dir), "-name", "rel", "-o", "-name", "fastudy.lock"], capture_output=True, text=True)
        return ["left behind"] if found.stdout.strip() else []

    return Expect(["bash", "-c", f"{cd} && exec '{c.fastudy}' reduce '{g}' --out rel"], (2,), c.out,
                  names="longer than PATH_MAX", own=(c.dir / part,), check=check)


def out_loop(c):
    """--out a symbolic link to itself: exit 2 naming it."""
    loop = c.dir / "loop"
    loop.symlink_to(loop)
    g = c.grid("st_good")
    return Expect([c.fastudy, "reduce", g, "--out", loop], (2,), loop, names="cannot be the study's output directory",
                  own=(loop,))


def from_minus_one(c):
    """replay --from -1 on a trained study: named as no step, not "is required"."""
    out = c.dir / "study"
    shutil.copytree(c.trained, out, symlinks=True)
    return Expect([c.fastudy, "replay", out, "--variant", "flash-fp32", "--from", "-1"], (2,), out,
                  names="--from -1 is not a step")


def running_without_job(c):
    """status.csv says a variant is running, no job holds the lock (its end was never recorded): status
    shows it failed, with the repair."""
    import zlib
    out = c.dir / "study"
    shutil.copytree(c.trained, out, symlinks=True)
    status = out / "status.csv"
    text = status.read_text().replace(",done,", ",running,", 1)
    status.write_text(text)
    Path(f"{status}.crc").write_text(f"fastudy-crc32/1 {len(text.encode())} {zlib.crc32(text.encode()):08x}\n")
    return Expect([c.fastudy, "status", out], (1,), out, names="no job runs the study")


CASES = [
    (1, "st-deep-shape", refused("st_deep_shape", "step_{step}.safetensors", "nests JSON more than 64 levels deep")),
    (1, "pt-deep-nesting", refused("pt_deep_nesting", "step_{step}.pt", "nests containers more than 64 levels deep")),
    (1, "pt-self-dict", refused("pt_self_dict", "step_{step}.pt", "holds itself")),
    (1, "pt-odd-dict", refused("pt_odd_dict", "step_{step}.pt", "odd number of items")),
    (1, "h5-libhdf5-crash", special("h5_dag", "step_{step}.h5", "s2/step_10.h5", libhdf5_crash, "HDF5 crashed reading it")),
    (1, "pt-unknown-opcode", refused("pt_unknown_opcode", "step_{step}.pt", "holds opcode 0x95")),
    (1, "pt-pop-below-mark", refused("pt_pop_below_mark", "step_{step}.pt", "above the last MARK")),
    (1, "pt-memo-gap", refused("pt_memo_gap", "step_{step}.pt", "stores memo entry 4294967295")),
    (1, "h5-deep-groups", refused("h5_deep_groups", "step_{step}.h5", "groups nest more than 64 levels deep")),
    (1, "h5-soft-cycle", reduced("h5_soft_cycle", "step_{step}.h5", has_tensors("w", "model"), "each object once")),
    (1, "h5-hard-cycle", reduced("h5_hard_cycle", "step_{step}.h5", has_tensors("g.w", "model"), "each object once")),
    (2, "pt-view-past-storage", refused("pt_view_past_storage", "step_{step}.pt", "reaches past the 16 bytes", "reduce")),
    (2, "pt-storage-lies", refused("pt_storage_lies", "step_{step}.pt", "reaches past the 16 bytes", "reduce")),
    (2, "pt-view-ok", reduced("pt_view_ok", "step_{step}.pt", view_ok, "a strided view, exact")),
    (3, "fifo-safetensors", special("fifo_safetensors", "step_{step}.safetensors", "s2/step_10.safetensors", fifo, "is a FIFO")),
    (3, "fifo-index", special("fifo_index", "step_{step}/model.safetensors.index.json", "s2/step_10/model.safetensors.index.json", fifo, "is a FIFO")),
    (3, "fifo-shard", special("fifo_shard", "step_{step}/model.safetensors.index.json", "s2/step_10/model-00001-of-00001.safetensors", fifo, "is a FIFO")),
    (3, "fifo-pt", special("devzero_pt", "step_{step}.pt", "s2/step_10.pt", fifo, "is a FIFO")),
    (3, "dev-zero-pt", special("devzero_pt", "step_{step}.pt", "s2/step_10.pt", dev_zero, "character device")),
    (3, "fifo-crc-status", fifo_crc),
    (3, "h5-dag", reduced("h5_dag", "step_{step}.h5", has_tensors("g0.w", "model"), "41 groups, 2^40 paths")),
    (4, "st-overflow", refused("st_overflow", "step_{step}.safetensors", "needs more than 2^64")),
    (4, "st-json-range", refused("st_json_range", "step_{step}.safetensors", "number overflow")),
    (4, "st-tab-name", refused("st_tab_name", "step_{step}.safetensors", "holds a control character")),
    (4, "pt-bad-utf8", refused("pt_bad_utf8", "step_{step}.pt", "is not valid UTF-8")),
    (4, "pt-bad-version", refused("pt_bad_version", "step_{step}.pt", "cannot read this torch.save file")),
    (4, "h5-unwritten", refused("h5_unwritten", "step_{step}.h5", "not every element was ever written")),
    (4, "odd-folder-2-ranks", odd_folder),
    (5, "names-from-other-stacks", names_case),
    (6, "many-tensors-opened-once", many_tensors),
    (7, "imported-csv-flipped", imported_csv(flip, "checksum mismatch")),
    (7, "imported-csv-garbage", imported_csv(garbage, "is not path,bytes,crc32")),
    (3, "imported-csv-fifo", imported_csv(fifo_in_place, "cannot be read (not a regular file)")),
    (8, "reduce-full-disk", reduce_full_disk),
    (8, "save-outputs-full-disk", saved_outputs_full_disk),
    (9, "long-working-directory", long_cwd),
    (10, "h5-external-link", refused("h5_external", "step_{step}.h5", "is an external link")),
    (10, "h5-virtual-dataset", refused("h5_vds", "step_{step}.h5", "virtual dataset")),
    (10, "h5-external-storage", refused("h5_external_storage", "step_{step}.h5", "keeps its data in external files")),
    (11, "h5-truncated", refused("h5_truncated", "step_{step}.h5", "HDF5 cannot open it")),
    (11, "out-symlink-loop", out_loop),
    (11, "replay-from-minus-one", from_minus_one),
    (11, "status-running-without-job", running_without_job),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--timeout", type=float, default=180)
    args = ap.parse_args()
    fastudy = str(Path(args.build).resolve() / "fastudy")
    work = Path(tempfile.mkdtemp(prefix="fastudy-imports-"))
    runs = work / "runs"
    kases = sorted({"st_deep_shape", "st_overflow", "st_json_range", "st_tab_name", "st_names", "st_many", "st_good",
                    "fifo_safetensors", "fifo_index", "fifo_shard", "pt_deep_nesting", "pt_view_past_storage",
                    "pt_storage_lies", "pt_view_ok", "pt_self_dict", "pt_bad_version", "pt_odd_dict", "devzero_pt",
                    "pt_unknown_opcode", "pt_pop_below_mark", "pt_memo_gap", "pt_bad_utf8", "h5_deep_groups",
                    "h5_external_storage",
                    "h5_soft_cycle", "h5_hard_cycle", "h5_dag", "h5_external", "h5_vds", "h5_unwritten", "h5_truncated"})
    subprocess.run([sys.executable, WRITER, runs, *kases], check=True)
    trained = work / "trained"
    (work / "trained.toml").write_text(GRID.format(out=trained))
    r = subprocess.run([fastudy, work / "trained.toml", "-q"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"the trained study failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    only = set(filter(None, args.only.split(",")))
    print(f"{'case':32s} {'item':>4s} {'exit':>5s} {'want':>5s} {'s':>6s} {'RSS MiB':>8s}  result  first error line / problem")
    failed = 0
    for item, name, make in CASES:
        if only and name not in only:
            continue
        folder = work / name
        folder.mkdir()
        try:
            e = make(Case(name, folder, fastudy, runs, trained))
        except Exception as exc:
            failed += 1
            print(f"{name:32s} {item:4d} {'-':>5s} {'-':>5s} {'-':>6s} {'-':>8s}  FAIL    setup: {type(exc).__name__}: {exc}"[:200])
            continue
        if e is None:
            print(f"{name:32s} {item:4d} {'-':>5s} {'-':>5s} {'-':>6s} {'-':>8s}  skip    needs root and unshare")
            continue
        e.argv = [str(a) for a in e.argv]
        skip = (Path(e.out), *map(Path, e.own))
        outside_before = tree(folder, skip)
        res = execute(e, args.timeout)
        problems = judge(e, res, outside_before, tree(folder, skip), None)
        if e.check is not None:
            try:
                problems += e.check(res)
            except Exception as exc:
                problems.append(f"check: {type(exc).__name__}: {exc}")
        lines = error_lines(res.output)
        note = problems[0] if problems else (lines[0][7:] if lines else "")
        failed += bool(problems)
        print(f"{name:32s} {item:4d} {str(res.code):>5s} {'/'.join(map(str, e.codes)):>5s} {res.seconds:6.1f} "
              f"{res.max_rss_mib:8.0f}  {'FAIL' if problems else 'pass':6s}  {note[:110]}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    print("every case as promised" if failed == 0 else f"{failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
