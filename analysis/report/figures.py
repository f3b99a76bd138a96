"""Figure output: every plot is written as PNG (embedded in report.html) and SVG (for papers) into
report_files/, with one style (readable fonts, grid lines) applied through an rc context. A file that
cannot be written raises WriteError, which stops the report (cli.py prints one line and exits 4).
"""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from .doc import Figure  # noqa: E402

STYLE = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
    "savefig.dpi": 110,
    "svg.hashsalt": "fastudy",  # stable ids: the same data gives the same SVG
}

# Colours by order of appearance (tab10), and the two attention kinds always in the same colours.
COLOURS = plt.get_cmap("tab10").colors
KIND_COLOURS = {"flash": "#1f77b4", "baseline": "#d62728", "flash_vs_baseline": "#7f7f7f"}
FORMAT_ORDER = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8_e5m2", "fp8_e4m3", "e5m2", "e4m3")


def style():
    return matplotlib.rc_context(STYLE)


def literal(label):
    """A name from another program's file (a tensor's) as a matplotlib label that shows it as it is:
    every '$' escaped, so that no pair of them is parsed as mathtext (which fails on a bad formula)."""
    return str(label).replace("$", r"\$")


def format_key(f):
    """Sort key: wider formats first, unknown ones last in name order."""
    return (FORMAT_ORDER.index(f) if f in FORMAT_ORDER else len(FORMAT_ORDER), f)


class WriteError(Exception):
    """A file of the report could not be written (a full disk, a quota, a read-only file system): the
    report stops there, unlike a section that cannot be built (which becomes a note)."""

    def __init__(self, path, error):
        self.path, self.error = path, error
        super().__init__(f"cannot write {path}: {error.strerror or error}{_free_space_note(path)}")


def _free_space_note(path):
    """' (the file system mounted at M has N free)' for the file system that holds path."""
    import os
    mount = os.path.abspath(os.path.dirname(str(path)) or ".")
    while not os.path.ismount(mount) and os.path.dirname(mount) != mount:
        mount = os.path.dirname(mount)
    try:
        st = os.statvfs(mount)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    size = next(f"{free / 1024 ** k:.1f} {u}" for k, u in ((3, "GiB"), (2, "MiB"), (1, "KiB"), (0, "B"))
                if free >= 1024 ** k or k == 0)
    return f" (the file system mounted at {mount} has {size} free)"


def write_text(path, content):
    """Writes a text file whole (a temporary beside it, renamed over it); WriteError when it fails."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(content, encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise WriteError(path, e) from None


class FigureWriter:
    """Saves matplotlib figures under files_dir and returns doc.Figure blocks."""

    def __init__(self, files_dir):
        self.files_dir = files_dir
        self.files_dir.mkdir(parents=True, exist_ok=True)

    def new(self, ncols=1, nrows=1, width=None, height=None, **kw):
        width = width or min(6.0 * ncols, 13.0)
        height = height or 4.0 * nrows
        return plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False, **kw)

    def save(self, fig, name, caption):
        png = self.files_dir / f"{name}.png"
        svg = self.files_dir / f"{name}.svg"
        fig.tight_layout()
        try:
            for path, fmt, meta in ((png, "png", {"Software": None}), (svg, "svg", {"Date": None, "Creator": None})):
                try:
                    fig.savefig(path, format=fmt, metadata=meta)
                except OSError as e:
                    raise WriteError(path, e) from None
        finally:
            plt.close(fig)
        return Figure(name, caption, png, svg)
