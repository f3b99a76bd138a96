"""Entry point for `python3 analysis/report OUT` (the directory run as a script) and
`python3 -m report OUT` (with analysis/ on the path): imports the package from its parent
directory, then runs report.cli.main."""

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from report.cli import main  # noqa: E402

sys.exit(main())
