"""`fastudy JOB GRID --out MOUNT/out` on a file system with SIZE bytes (test_full_disk.py runs it under
`unshare -m --propagation private`, as root): mounts a tmpfs of SIZE bytes at MOUNT, runs the job with its
output on it and prints one JSON object: the exit code, stdout and stderr, and every file the job left
on the tmpfs. The mount ends with the namespace. Exit code 77 (the reason on stderr) when the tmpfs
cannot be mounted.
Usage: small_disk.py FASTUDY JOB GRID MOUNT SIZE
"""
import json
import os
import subprocess
import sys


def main():
    fastudy, job, grid, mount, size = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    os.makedirs(mount, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"cannot mount a tmpfs: {r.stderr.strip()}", file=sys.stderr)
        return 77
    run = subprocess.run([fastudy, job, grid, "--out", os.path.join(mount, "out")], capture_output=True, text=True,
                         timeout=540)
    files = sorted(os.path.relpath(os.path.join(d, f), mount) for d, _, fs in os.walk(mount) for f in fs)
    print(json.dumps({"code": run.returncode, "stdout": run.stdout, "stderr": run.stderr, "files": files}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
