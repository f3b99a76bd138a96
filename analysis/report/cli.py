"""`python3 analysis/report OUT [--into DIR]`: read a study's outputs and write report.html, report.md
and report_files/ (PNG and SVG of every plot) into OUT, or into DIR (`fastudy report` passes a fresh
staging folder and moves the finished report into OUT itself). Exit codes: 0 written; 1 failure (a
section that failed is written as a note, the error printed); 2 usage error; 4 a file could not be
written (a full disk: one line names the file and the file system, nothing else is printed).
"""

import argparse
import sys
import traceback
from pathlib import Path

from . import deviation, explain, microbench, provenance, training, verdict
from .doc import Section, text
from .figures import FigureWriter, WriteError, style, write_text
from .readers import load_study
from .render import render_html, render_markdown


SECTIONS = (
    ("1. Verdict", "verdict", lambda data, figs, state: verdict.build(data, state)),
    ("2. Microbenchmark", "microbench", lambda data, figs, state: microbench.build(data, figs)),
    ("3. Training", "training", lambda data, figs, state: training.build(data, figs)),
    ("4. Weight deviation", "deviation", lambda data, figs, state: deviation.build(data, figs)),
    ("5. Provenance", "provenance", lambda data, figs, state: provenance.build(data)),
)


# The names the renderer gives its plots in report_files/ (an earlier report's are removed there
# when it writes into OUT itself; other files are left alone).
PLOT_SUFFIXES = (".png", ".svg")


def build_report(out_dir, errors=None, into=None):
    """Render the report of the study in out_dir into `into` (default out_dir); returns (html path,
    markdown path). A section that fails is replaced by a note with the error (appended to `errors`
    when given, else raised), so one unexpected file does not cost the reader the rest of the report;
    a file that cannot be written raises WriteError."""
    out = Path(out_dir)
    dest = Path(into) if into is not None else out
    data = load_study(out)
    files = dest / "report_files"
    if files.is_dir() and not files.is_symlink():
        for old in files.iterdir():  # plots of an earlier report must not linger beside the new one
            if old.suffix in PLOT_SUFFIXES and old.is_file() and not old.is_symlink():
                old.unlink()
    figs = FigureWriter(files)
    sections = []
    with style():
        state = provenance.phase_state(data)
        sections_of_study = SECTIONS + ((("6. Explanations", "explanations",
                                           lambda data, figs, state: explain.build(data, figs)),)
                                         if explain.present(data) else ())
        for title, anchor, build in sections_of_study:
            try:
                sections.append(build(data, figs, state))
            except WriteError:
                raise
            except Exception as e:
                if errors is None:
                    raise
                errors.append(f"section {title}: {traceback.format_exc()}")
                sections.append(Section(title, anchor, [text(f"This section could not be rendered: "
                                                             f"{type(e).__name__}: {e}", kind="bad")]))
    name = (data.config or {}).get("study", {}).get("name", out.name)
    prov = data.provenance or {}
    phases = ", ".join(p for p in ("microbench", "train", "reduce") if data.planned(p)) or "none yet"
    subtitle = [f"Study `{name}` in {out.resolve()} — fastudy {prov.get('version', '?')} (git {prov.get('git', '?')}), "
                    f"report of the files its phases wrote ({phases}). How to read it: section 1 "
                    "answers whether the optimisation's effect on the weights stays within the deviation that accepted "
                    "practices (another init seed, another training precision) already cause; sections 2–4 show the "
                    "evidence; section 5 how it was produced; section 6, when present, the replays and bisections run on it."]
    title = f"fastudy deviation-bound report: {name}"
    html_path, md_path = dest / "report.html", dest / "report.md"
    write_text(md_path, render_markdown(title, subtitle, sections))
    write_text(html_path, render_html(title, subtitle, sections))
    return html_path, md_path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="fastudy-report", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the study's output directory (OUT)")
    parser.add_argument("--quiet", action="store_true", help="print errors only (fastudy report prints the paths)")
    parser.add_argument("--into", help="write the report into this folder instead of OUT (fastudy report's staging)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        print(f"error: {out} is not a directory", file=sys.stderr)
        return 2
    if not any((out / f).exists() for f in ("study.toml", "microbench.csv", "status.csv", "ranking.csv")):
        print(f"error: {out} holds no fastudy outputs (no study.toml, microbench.csv, status.csv or ranking.csv)\n"
              "hint: run a phase first, e.g. fastudy microbench GRID.toml --out OUT", file=sys.stderr)
        return 2
    errors = []
    try:
        html_path, md_path = build_report(out, errors, args.into)
    except WriteError as e:
        print(f"error: the report was not written: {e}", file=sys.stderr)
        return 4
    if not args.quiet:
        print(f"report: {html_path}")
        print(f"report: {md_path} (plots in {out / 'report_files'})")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0
