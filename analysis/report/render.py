"""Render the document tree (doc.py) as self-contained HTML and as Markdown.

HTML: one file, images embedded as base64 PNG (the SVG files stay beside it for papers), no scripts,
no external resources, so it opens from file:// anywhere. Markdown: the same text and tables, images
referenced as files in report_files/ next to it.
"""

import base64
import html

from .doc import Bullets, Cell, Figure, Num, Pre, Table, Text, plain

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1100px; padding: 1.5em 2em; color: #1d1d1f; line-height: 1.45; }
h1 { font-size: 1.7em; margin-bottom: 0.1em; }
h2 { border-bottom: 2px solid #d0d4da; padding-bottom: 0.2em; margin-top: 1.8em; }
p.sub { color: #555; margin-top: 0; }
nav { background: #f4f6f8; padding: 0.5em 1em; border-radius: 6px; }
nav a { margin-right: 1.2em; }
div.table { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.92em; }
th, td { border: 1px solid #c8ccd2; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #eef1f4; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.s { white-space: nowrap; }
caption { caption-side: top; text-align: left; font-weight: 600; padding-bottom: 0.3em; }
figure { margin: 1em 0 1.6em; }
figure img { max-width: 100%; border: 1px solid #e3e6ea; }
figcaption { color: #333; font-size: 0.93em; margin-top: 0.3em; }
.lead { font-size: 1.12em; }
.good { background: #e7f6ea; border-left: 5px solid #2e9e4f; padding: 0.5em 0.9em; font-size: 1.1em; }
.bad { background: #fdecea; border-left: 5px solid #c9372c; padding: 0.5em 0.9em; font-size: 1.1em; }
.missing { background: #fff7e0; border-left: 5px solid #d9a400; padding: 0.4em 0.9em; }
.note { color: #444; font-size: 0.95em; }
pre { background: #f6f8fa; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
code { background: #f0f2f4; padding: 0 0.25em; border-radius: 3px; }
td.v { font-weight: 600; white-space: nowrap; }
td.v-good { background: #e7f6ea; } td.v-bad { background: #fdecea; } td.v-unsure { background: #fff7e0; }
td .sub { display: block; font-weight: normal; font-size: 0.88em; color: #555; white-space: normal; }
td details { font-size: 0.9em; } td details div { margin: 0.15em 0 0 0.8em; }
"""


def _html_parts(parts):
    if isinstance(parts, (str, Num)):
        parts = [parts]
    out = []
    for p in parts:
        if isinstance(p, Num):
            value = repr(float(p.value)) if p.value is not None else "nan"
            key = f' data-key="{html.escape(p.key)}"' if p.key else ""
            out.append(f'<span class="num"{key} data-value="{value}">{html.escape(p.text)}</span>')
        else:
            out.append(_inline_code(html.escape(str(p))))
    return "".join(out)


def _inline_code(escaped):
    """`text` -> <code>text</code> (backticks are the only inline markup the sections use)."""
    pieces = escaped.split("`")
    if len(pieces) < 3 or len(pieces) % 2 == 0:
        return escaped
    return "".join(f"<code>{s}</code>" if i % 2 else s for i, s in enumerate(pieces))


def _is_numeric(cell):
    return isinstance(cell, Num)


def _cell_class(cell):
    """Numbers right-aligned; short text (ids, intervals) kept on one line; long text wraps; a verdict
    (a Cell with a kind) coloured."""
    if isinstance(cell, Cell):
        return f' class="v v-{cell.kind}"' if cell.kind else ""
    if _is_numeric(cell):
        return ' class="n"'
    return ' class="s"' if len(plain(cell)) <= 34 else ""


def _html_cell(cell):
    """A cell's content: its text, then a second line and folded details where a Cell has them."""
    if not isinstance(cell, Cell):
        return _html_parts(cell)
    out = _html_parts(cell.parts)
    if cell.sub:
        out += f'<span class="sub">{_html_parts(cell.sub)}</span>'
    if cell.fold:
        lines = "".join(f"<div>{_html_parts(l)}</div>" for l in cell.fold.lines)
        out += f"<details><summary>{html.escape(cell.fold.summary)}</summary>{lines}</details>"
    return out


def _html_block(block):
    if isinstance(block, Text):
        cls = f' class="{block.kind}"' if block.kind else ""
        return f"<p{cls}>{_html_parts(block.parts)}</p>"
    if isinstance(block, Bullets):
        items = "".join(f"<li>{_html_parts(i)}</li>" for i in block.items)
        return f"<ul>{items}</ul>"
    if isinstance(block, Table):
        cap = f"<caption>{_html_parts(block.caption)}</caption>" if block.caption else ""
        head = "".join(f"<th>{_html_parts(c)}</th>" for c in block.columns)
        body = []
        for row in block.rows:
            cells = "".join(f"<td{_cell_class(c)}>{_html_cell(c)}</td>" for c in row)
            body.append(f"<tr>{cells}</tr>")
        name = f' id="table-{block.name}"' if block.name else ""
        # A table wider than the page scrolls inside its own box, never the page.
        return (f'<div class="table"><table{name}>{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
                "</table></div>")
    if isinstance(block, Figure):
        data = base64.b64encode(block.png.read_bytes()).decode("ascii")
        alt = html.escape(plain(block.caption))
        return (f'<figure id="fig-{block.name}"><img src="data:image/png;base64,{data}" alt="{alt}">'
                f"<figcaption>{_html_parts(block.caption)} "
                f"(files: <code>report_files/{block.png.name}</code>, <code>report_files/{block.svg.name}</code>)"
                f"</figcaption></figure>")
    if isinstance(block, Pre):
        return f"<details><summary>{html.escape(block.summary)}</summary><pre>{html.escape(block.text)}</pre></details>"
    raise TypeError(f"unknown block {type(block).__name__}")


def render_html(title, subtitle, sections):
    nav = "".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections)
    body = [f"<h1>{html.escape(title)}</h1>", f'<p class="sub">{_html_parts(subtitle)}</p>', f"<nav>{nav}</nav>"]
    for s in sections:
        body.append(f'<section id="{s.anchor}"><h2>{html.escape(s.title)}</h2>')
        body.extend(_html_block(b) for b in s.blocks)
        body.append("</section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _md_cell(cell):
    """A cell's text on one line: a Cell's second line follows in parentheses, its fold is listed under
    the table (_md_folds). Whatever a name in it holds stays text in its cell: '&', '<' and '>' are
    written as entities (no raw HTML), a backslash, '|' (a cell boundary) and the characters of inline
    markup ('*', '`', '[', ']', '~', '$': emphasis, code, links, math) escaped with a backslash."""
    text = plain(cell)
    if isinstance(cell, Cell) and cell.sub:
        text += f" ({plain(cell.sub)})"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("\\", "\\\\")
    for c in "|*`[]~$":
        text = text.replace(c, "\\" + c)
    return text.replace("\n", " ")


def _md_folds(rows):
    """Markdown has no folding: each folded cell's lines as a list under the table, under its label."""
    out = []
    for row in rows:
        for cell in row:
            if isinstance(cell, Cell) and cell.fold:
                out.append(f"\n{cell.fold.label or cell.fold.summary}:\n")
                out.extend(f"- {plain(l)}" for l in cell.fold.lines)
    return out


def _md_block(block):
    if isinstance(block, Text):
        t = plain(block.parts)
        if block.kind in ("good", "bad"):
            return f"> **{t}**"
        if block.kind == "missing":
            return f"> *Missing:* {t}"
        return t
    if isinstance(block, Bullets):
        return "\n".join(f"- {plain(i)}" for i in block.items)
    if isinstance(block, Table):
        lines = []
        if block.caption:
            lines.append(f"**{plain(block.caption)}**\n")
        lines.append("| " + " | ".join(_md_cell(c) for c in block.columns) + " |")
        lines.append("|" + "|".join("---:" if block.rows and _is_numeric(block.rows[0][i]) else "---"
                                    for i in range(len(block.columns))) + "|")
        lines.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows)
        lines.extend(_md_folds(block.rows))
        return "\n".join(lines)
    if isinstance(block, Figure):
        cap = plain(block.caption)
        return (f"![{cap}](report_files/{block.png.name})\n\n*{cap}* "
                f"([PNG](report_files/{block.png.name}), [SVG](report_files/{block.svg.name}))")
    if isinstance(block, Pre):
        return f"<details><summary>{block.summary}</summary>\n\n```\n{block.text.rstrip()}\n```\n\n</details>"
    raise TypeError(f"unknown block {type(block).__name__}")


def render_markdown(title, subtitle, sections):
    out = [f"# {title}", "", plain(subtitle), ""]
    out.append(" · ".join(f"[{s.title}](#{s.anchor})" for s in sections))
    for s in sections:
        out += ["", f'<a id="{s.anchor}"></a>', f"## {s.title}", ""]
        for b in s.blocks:
            out += [_md_block(b), ""]
    return "\n".join(out).rstrip() + "\n"
