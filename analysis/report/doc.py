"""The report as a small document tree, and number formatting.

Sections build blocks (Text, Bullets, Table, Figure, Pre); render.py turns the same tree into HTML
and Markdown, so both files always say the same thing. A table cell is text (str | Num | a list of
them) or a Cell: text with a second line, a colour, or details folded under it (a Fold). A Num is a number with its exact value kept
beside the printed text: the HTML carries the exact value in a data attribute (tests compare it
with the CSV it came from), the Markdown only the printed text.
"""

import math
from dataclasses import dataclass, field


@dataclass
class Num:
    value: float
    text: str
    key: str = ""  # a stable name for tests, e.g. "verdict.attention.w1_mean"


@dataclass
class Text:
    parts: list  # str | Num
    kind: str = ""  # "" | "lead" | "good" | "bad" | "missing" | "note"


@dataclass
class Bullets:
    items: list  # each a list of str | Num


@dataclass
class Fold:
    """Details a reader opens on demand: in HTML a <details> element whose `summary` is shown closed; in
    Markdown (no folding there) the lines are listed under the table, each group under its `label`."""
    summary: str
    lines: list  # each a list of str | Num
    label: str = ""


@dataclass
class Cell:
    parts: list             # str | Num: the cell's text
    sub: list = None        # a second, smaller line under it (str | Num), or None
    kind: str = ""          # "" | "good" | "bad" | "unsure": the cell's colour (a verdict)
    fold: Fold = None       # details folded under the text, or None


@dataclass
class Table:
    columns: list
    rows: list  # lists of cells: str | Num | list of them | Cell
    caption: str = ""
    name: str = ""  # the HTML table's id ("table-NAME"), for links and the browser test


@dataclass
class Figure:
    name: str
    caption: str
    png: object  # Path
    svg: object  # Path


@dataclass
class Pre:
    text: str
    summary: str


@dataclass
class Section:
    title: str
    anchor: str
    blocks: list = field(default_factory=list)


def sig(x, digits=3):
    """x with `digits` significant digits; '–' for NaN, '∞' for infinities."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == 0:
        return "0"
    return f"{x:.{digits}g}"


def num(x, key="", digits=3, suffix=""):
    return Num(x, sig(x, digits) + suffix, key)


def text(*parts, kind=""):
    return Text(list(parts), kind)


def plain(parts):
    """The printed text of a list of parts (of a Cell: its first line)."""
    if isinstance(parts, Cell):
        parts = parts.parts
    if isinstance(parts, (str, Num)):
        parts = [parts]
    return "".join(p.text if isinstance(p, Num) else str(p) for p in parts)
