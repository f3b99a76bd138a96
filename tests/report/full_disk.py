"""`fastudy report` on a full disk, in a private mount namespace (test_e2e.py runs it under
`unshare -m --propagation private`, as root): mounts a tmpfs at MOUNT just large enough for a copy of
STUDY, copies the study onto it, fills the rest but KEEP bytes, runs `fastudy report` on the copy and
prints one JSON object: the exit code, stdout and stderr, the free bytes before the report, and every
file of the copy (path -> [size, sha256]) before and after. The mount ends with the namespace.
With --unlisted-report, the report's entries are taken out of the copy's manifest first (resealed),
so that fastudy's own first write, the manifest's, is the one that meets the full disk.
Exit code 77 (with the reason on stderr) when the tmpfs cannot be mounted.
Usage: full_disk.py FASTUDY STUDY MOUNT KEEP [--unlisted-report]
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zlib


def files_of(root):
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.isdir(path) and not os.path.islink(path):
                found[rel] = ["dir", ""]
            else:
                with open(path, "rb") as f:
                    data = f.read()
                found[rel] = [len(data), hashlib.sha256(data).hexdigest()]
    return found


def main():
    fastudy, study, mount, keep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(study) for f in fs)
    size = (size * 2 + (1 << 20)) // 4096 * 4096  # room for the copy, its per-file pages and the filler
    os.makedirs(mount, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"cannot mount a tmpfs: {r.stderr.strip()}", file=sys.stderr)
        return 77
    copy = os.path.join(mount, "study")
    shutil.copytree(study, copy, symlinks=True)
    if "--unlisted-report" in sys.argv[5:]:
        manifest = os.path.join(copy, "fastudy.manifest")
        with open(manifest) as f:
            lines = [l for l in f if l.split(" ")[1:2] != ["report"]]
        data = "".join(lines).encode()
        with open(manifest, "wb") as f:
            f.write(data)
        with open(manifest + ".crc", "w") as f:
            f.write(f"fastudy-crc32/1 {len(data)} {zlib.crc32(data):08x}\n")
    st = os.statvfs(mount)
    filler = st.f_bavail * st.f_frsize - keep
    with open(os.path.join(mount, "filler"), "wb") as f:
        f.write(b"\0" * max(filler, 0))
    st = os.statvfs(mount)
    before = files_of(copy)
    run = subprocess.run([fastudy, "report", copy], capture_output=True, text=True, timeout=240)
    print(json.dumps({"code": run.returncode, "stdout": run.stdout, "stderr": run.stderr,
                      "free": st.f_bavail * st.f_frsize, "before": before, "after": files_of(copy)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
