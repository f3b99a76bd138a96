#!/usr/bin/python3
"""`fastudy slurm` against a real Slurm: a single-node Slurm on localhost (scripts/slurm-local.sh).

1. An uninterrupted job for configs/ci.toml (every phase; srun --mpi=pmix when Slurm has it, else
   mpirun; 2 tasks): the job completes with exit code 0, every variant is done with its final
   checkpoint, and the microbench and reduce outputs exist.
2. The same study with mpirun (and again with srun when Slurm has pmix); mid-run the batch shell
   gets the warning signal (`scancel --signal=USR1 --batch`). fastudy checkpoints and stops, the
   script requeues the job, and the requeued job resumes: Slurm counts one restart, the log shows both runs, the checkpoints
   written before the signal were not rewritten (the second run did not start over), and the final
   weights and optimizer state are bit-identical to an uninterrupted run of the same grid (mpirun,
   2 ranks, no Slurm).

Exit codes: 0 passed, 1 failed, 77 skipped (not root, Slurm/munge missing or not startable, no h5py).
The daemons are stopped at the end whatever happens: by this script when it ends or gets SIGTERM, and,
when ctest kills it (a timeout), by the ctest fixture cleanup `test_slurm_local.py --stop`, which reads
the daemons' state directory from WORK.state (written before they start).
Usage: test_slurm_local.py --fastudy BUILD/fastudy --source SRC --work DIR
       test_slurm_local.py --stop --source SRC --work DIR
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}
STEPS = 300  # [train] steps of slurm_grid.toml


class Failure(Exception):
    pass


def log(msg):
    print("slurm test: " + msg, flush=True)


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def job_info(job, env):
    """scontrol's fields of a job as a dict (JobState, ExitCode, Restarts, ...)."""
    r = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True)
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def wait_job(job, env, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        info = job_info(job, env)
        if info.get("JobState") in TERMINAL:
            return info
        time.sleep(0.5)
    raise Failure("job %s did not end within %d s (state %s)" % (job, timeout, job_info(job, env).get("JobState")))


def submit(args, grid, out, launcher, env):
    cmd = [args.fastudy, "slurm", grid, "--out", out, "--nodes", "1", "--ntasks-per-node", "2",
           "--time", "00:10:00", "--launcher", launcher, "--submit", "-q"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    check(r.returncode == 0, "fastudy slurm --submit failed (%d): %s%s" % (r.returncode, r.stdout, r.stderr))
    job = r.stdout.strip()
    check(job.isdigit(), "fastudy slurm --submit -q printed %r, not a job id" % job)
    log("submitted %s (launcher %s) -> job %s" % (out, launcher, job))
    return job


def read(path):
    with open(path) as f:
        return f.read()


def status_rows(out):
    lines = read(os.path.join(out, "status.csv")).splitlines()
    rows = [l.split(",") for l in lines if l and not l.startswith("#")]
    return {r[0]: r for r in rows[1:]}


def check_finished(out, job, info, variants=("s1", "s2"), steps=STEPS):
    slurm_log = read(os.path.join(out, "slurm-%s.out" % job))
    check(info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0",
          "job %s ended %s with exit code %s; log:\n%s" % (job, info.get("JobState"), info.get("ExitCode"), slurm_log))
    check("fastudy exited with code 0" in slurm_log, "the log does not show fastudy's exit code 0:\n" + slurm_log)
    rows = status_rows(out)
    check(sorted(rows) == sorted(variants), "status.csv has variants %s, expected %s" % (sorted(rows), sorted(variants)))
    for v, row in rows.items():
        check(row[1] == "done" and row[2] == str(steps), "variant %s is %s at step %s" % (v, row[1], row[2]))
        final = os.path.join(out, "checkpoints", v, "step_%07d.h5" % steps)
        check(os.path.exists(final), "missing final checkpoint " + final)
    return slurm_log


def compare_weights(ref, other):
    import h5py
    import numpy as np
    for v in ("s1", "s2"):
        a_path = os.path.join(ref, "checkpoints", v, "step_%07d.h5" % STEPS)
        b_path = os.path.join(other, "checkpoints", v, "step_%07d.h5" % STEPS)
        with h5py.File(a_path, "r") as a, h5py.File(b_path, "r") as b:
            names = []
            a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
            check(any(n.startswith("params/") for n in names), "no params/ datasets in " + a_path)
            for n in names:
                check(n in b, "%s lacks %s" % (b_path, n))
                x, y = a[n][()], b[n][()]
                # Bit-identical: same dtype, shape and bytes (NaN-safe, unlike ==).
                check(x.dtype == y.dtype and np.shape(x) == np.shape(y) and
                      np.asarray(x).tobytes() == np.asarray(y).tobytes(),
                      "%s differs between the uninterrupted and the requeued job (%s)" % (n, v))
        log("%s: %d datasets bit-identical to the uninterrupted run" % (v, len(names)))


def check_resumed(out, slurm_log):
    """Each variant the signal stopped at step K resumed from step K: its checkpoints up to K are those of
    the first run (written before the step-K checkpoint), the later ones were written after it."""
    stopped = {v: int(k) for v, k in re.findall(r"failed (\S+) at step (\d+)[^(\n]*\(stopped by a signal", slurm_log)}
    check(stopped, "no variant was stopped by the signal; log:\n" + slurm_log)
    check(any(k < STEPS for k in stopped.values()), "the signal came after training ended: %s" % stopped)
    for v, k in stopped.items():
        if k == 0:
            continue
        ckpts = {int(re.search(r"step_(\d+)\.h5$", p).group(1)): os.stat(p).st_mtime_ns
                 for p in glob.glob(os.path.join(out, "checkpoints", v, "step_*.h5"))}
        check(k in ckpts, "%s: no checkpoint at the stop step %d (have %s)" % (v, k, sorted(ckpts)))
        earlier = [s for s in ckpts if s < k]
        later = [s for s in ckpts if s > k]
        check(later, "%s: nothing was written after the stop at step %d" % (v, k))
        for s in earlier:
            check(ckpts[s] <= ckpts[k], "%s: step %d was rewritten after the stop at step %d: the job started over" % (v, s, k))
        for s in later:
            check(ckpts[s] > ckpts[k], "%s: step %d is older than the stop checkpoint %d" % (v, s, k))
        log("%s: stopped at step %d, resumed from it (kept checkpoints %s, wrote %s)" % (v, k, sorted(earlier), sorted(later)))


def wait_for_progress(out, job, env, min_step, timeout):
    """Waits until some variant's train_log.csv has passed min_step (the job is mid-run)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for path in glob.glob(os.path.join(out, "variants", "*", "train_log.csv")):
            try:
                rows = read(path).splitlines()
            except OSError:
                continue
            if len(rows) > min_step + 1:
                return os.path.basename(os.path.dirname(path)), len(rows) - 1
        if job_info(job, env).get("JobState") in TERMINAL:
            raise Failure("job %s ended before training got under way" % job)
        time.sleep(0.05)
    raise Failure("no variant of job %s passed step %d within %d s" % (job, min_step, timeout))


def run_cases(args, env, work):
    grid = os.path.join(args.source, "tests", "slurm", "slurm_grid.toml")
    mpi = subprocess.run(["srun", "--mpi=list"], env=env, capture_output=True, text=True)
    ci_launcher = "srun" if re.search(r"\bpmix\b", mpi.stdout + mpi.stderr) else "mpirun"

    # 1. The CI grid, every phase, uninterrupted.
    ci = os.path.join(work, "ci")
    job = submit(args, os.path.join(args.source, "configs", "ci.toml"), ci, ci_launcher, env)
    info = wait_job(job, env, 120)
    ci_variants = [a + "-" + p + "-s" + s for a in ("baseline", "flash") for p in ("fp32", "bf16") for s in "12"]
    check_finished(ci, job, info, ci_variants, 20)
    for name in ("microbench.csv", "deviation.h5", "ranking.csv"):
        check(os.path.exists(os.path.join(ci, name)), "the CI study lacks " + name)
    log("case 1 passed: job %s ran configs/ci.toml (%s): %d variants done" % (job, ci_launcher, len(ci_variants)))

    # The reference for case 2: the test grid trained without Slurm, uninterrupted, on 2 ranks.
    ref = os.path.join(work, "ref")
    r = subprocess.run([shutil.which("mpirun", path=env.get("PATH")) or "mpirun", "-n", "2", "--oversubscribe",
                        args.fastudy, "train", grid, "--out", ref, "-q"], env=env, capture_output=True, text=True)
    check(r.returncode == 0, "the reference run failed (%d): %s%s" % (r.returncode, r.stdout, r.stderr))

    # 2. Warning signal mid-run, requeue, resume: with mpirun, and with srun when Slurm has pmix.
    for launcher in ["mpirun"] + (["srun"] if ci_launcher == "srun" else []):
        signal_case(args, env, grid, os.path.join(work, "signal-" + launcher), launcher, ref)
    if ci_launcher != "srun":
        log("srun --mpi=pmix is not available here: the srun launcher was not tested")


def signal_case(args, env, grid, out, launcher, ref):
    job = submit(args, grid, out, launcher, env)
    variant, step = wait_for_progress(out, job, env, 70, 90)
    r = subprocess.run(["scancel", "--signal=USR1", "--batch", job], env=env, capture_output=True, text=True)
    check(r.returncode == 0, "scancel --signal=USR1 --batch failed: " + r.stdout + r.stderr)
    log("sent USR1 to the batch shell of job %s (%s at step %d)" % (job, variant, step))
    info = wait_job(job, env, 150)
    slurm_log = check_finished(out, job, info)
    check(info.get("Restarts") == "1", "job %s restarted %s times, expected 1; log:\n%s" % (job, info.get("Restarts"), slurm_log))
    for needle in ("SIGUSR1 received", "stopped by a signal; run the same command with --resume",
                   "requeueing job " + job, "(restart 1)"):
        check(needle in slurm_log, "the log lacks %r:\n%s" % (needle, slurm_log))
    check_resumed(out, slurm_log)
    compare_weights(ref, out)
    log("case 2 (%s) passed: job %s was requeued once, resumed and matches the uninterrupted run" % (launcher, job))


def stop_recorded(script, record):
    """Stops the daemons whose state directory `record` names (left by a run that was killed)."""
    if not os.path.exists(record):
        return
    state = read(record).strip()
    if state and os.path.isdir(state):
        env = dict(os.environ, SLURM_CONF=os.path.join(state, "slurm.conf"))
        subprocess.run([script, "stop", state], env=env)
        shutil.rmtree(state, ignore_errors=True)
    os.remove(record)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fastudy")
    p.add_argument("--source", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--stop", action="store_true", help="stop the daemons a killed run left behind, and exit")
    args = p.parse_args()
    script = os.path.join(args.source, "scripts", "slurm-local.sh")
    record = os.path.abspath(args.work) + ".state"
    if args.stop:
        stop_recorded(script, record)
        return 0
    if not args.fastudy:
        p.error("--fastudy is required")

    if os.geteuid() != 0:
        print("SKIP: the local Slurm runs its daemons as root; run this test as root")
        return SKIP
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        print("SKIP: /usr/bin/python3 lacks h5py/numpy (apt-get install python3-h5py)")
        return SKIP

    work = os.path.abspath(args.work)
    stop_recorded(script, record)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    # The daemons' state in a short path (the munge socket path must fit a sockaddr_un), recorded for
    # the fixture cleanup.
    state = tempfile.mkdtemp(prefix="fastudy-slurm-")
    with open(record, "w") as f:
        f.write(state + "\n")
    env = dict(os.environ, SLURM_CONF=os.path.join(state, "slurm.conf"), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run([script, "start", state], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        if r.returncode == SKIP:
            print("SKIP: could not start a local Slurm (install it with: scripts/slurm-local.sh install)")
            shutil.rmtree(state, ignore_errors=True)
            os.remove(record)
            return SKIP
        return 1
    log(r.stdout.strip())
    # A timeout (ctest sends SIGTERM) still runs the `finally` below that stops the daemons.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAILED: terminated (timeout?)"))
    t0 = time.time()
    try:
        run_cases(args, env, work)
        log("passed in %.0f s" % (time.time() - t0))
        return 0
    except Failure as e:
        print("FAILED: %s" % e)
        for name in ("slurmctld.log", "slurmd.log"):
            path = os.path.join(state, name)
            if os.path.exists(path):
                print("--- %s (tail)\n%s" % (path, "".join(open(path).readlines()[-20:])))
        return 1
    finally:
        stop_recorded(script, record)


if __name__ == "__main__":
    sys.exit(main())
