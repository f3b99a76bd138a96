"""Entry point for `python3 analysis/report OUT` (the directory run as a script) and
`python3 -m report OUT` (with analysis/ on the path): imports the package from its parent
directory, then runs report.cli.main."""

import signal
import sys
from pathlib import Path

# A stop signal (fastudy forwards SIGTERM; Ctrl-C sends the terminal's SIGINT to the whole group)
# ends the renderer quietly with the shell's code for it, not with a Python traceback.
for _sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(_sig, lambda signum, frame: sys.exit(128 + signum))

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from report.cli import main  # noqa: E402

sys.exit(main())
