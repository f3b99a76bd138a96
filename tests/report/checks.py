"""Checks on a rendered report shared by the synthetic and the end-to-end tests: self-containment of
report.html, the files report.md references, and the verdict's numbers against ranking.csv."""

import base64
import csv
import html
import io
import re
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NUM_SPAN = re.compile(r'<span class="num" data-key="([^"]*)" data-value="([^"]*)">([^<]*)</span>')


def html_images(testcase, html_path):
    """Every <img> is an embedded, decodable, non-empty PNG or SVG; no external resource is referenced.
    Returns the number of images."""
    text = Path(html_path).read_text(encoding="utf-8")
    srcs = re.findall(r'<img[^>]*\ssrc="([^"]*)"', text)
    for src in srcs:
        m = re.match(r"data:image/(png|svg\+xml);base64,(.*)$", src, re.S)
        testcase.assertIsNotNone(m, f"image not embedded: {src[:80]}")
        data = base64.b64decode(m.group(2), validate=True)
        if m.group(1) == "png":
            testcase.assertTrue(data.startswith(PNG_SIGNATURE), "embedded image is not a PNG")
            testcase.assertGreater(len(data), 1000, "embedded PNG is suspiciously small")
        else:
            testcase.assertIn(b"<svg", data)
    for attr in re.findall(r'\s(?:src|href)="([^"#][^"]*)"', text):
        testcase.assertTrue(attr.startswith("data:"), f"external reference in report.html: {attr[:80]}")
    testcase.assertNotIn("<script", text)
    return len(srcs)


def md_files(testcase, md_path):
    """Every file report.md links to exists and is a non-empty PNG or SVG. Returns the linked paths."""
    md_path = Path(md_path)
    text = md_path.read_text(encoding="utf-8")
    links = set(re.findall(r"\]\((report_files/[^)]+)\)", text))
    for link in links:
        f = md_path.parent / link
        testcase.assertTrue(f.is_file(), f"{link} does not exist")
        data = f.read_bytes()
        testcase.assertGreater(len(data), 1000, f"{link} is suspiciously small")
        if link.endswith(".png"):
            testcase.assertTrue(data.startswith(PNG_SIGNATURE), f"{link} is not a PNG")
        else:
            testcase.assertTrue(link.endswith(".svg"), link)
            testcase.assertIn(b"<svg", data[:2000])
    return links


def verdict_numbers(html_path):
    """key -> (exact value, printed text) of every number in the verdict section."""
    text = Path(html_path).read_text(encoding="utf-8")
    section = text.split('<section id="verdict">', 1)[1].split("</section>", 1)[0]
    return {html.unescape(k): (float(v), html.unescape(t)) for k, v, t in NUM_SPAN.findall(section) if k}


def csv_rows(path):
    lines = [l for l in Path(path).read_text().splitlines() if l and not l.startswith("#")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def three_sig(x):
    return f"{x:.3g}"


def same_number(testcase, got, expected, what):
    value, printed = got
    if expected != expected:  # NaN
        testcase.assertNotEqual(value, value, what)
        return
    testcase.assertEqual(value, expected, what)
    testcase.assertEqual(printed, three_sig(expected), what)


def verdict_matches_csv(testcase, html_path, verdict_csv):
    """The verdict table is verdict.csv: one table row per optimisation value and condition, in the
    file's order; every comparison's end-point and slope ratio exactly (data-value) and as printed (3
    significant digits); its interval when informative, else "not informative (n pairs)"; the deciding
    ratio (the largest of the verdict's measure) with its interval. Returns the number of table rows."""
    nums = verdict_numbers(html_path)
    text = Path(html_path).read_text(encoding="utf-8")
    section = text.split('<section id="verdict">', 1)[1].split("</section>", 1)[0]
    table = section.split("Verdict per optimisation and condition", 1)[1].split("</table>", 1)[0]
    rows = csv_rows(verdict_csv)
    groups = []
    for r in rows:
        key = (r["axis"], r["value"], r["condition"])
        if key not in groups:
            groups.append(key)
        base = f"verdict.{r['axis']}.{r['value']}.{r['condition']}"
        same_number(testcase, nums[base + ".w1"], float(r["w1"]), base + ".w1")
        if not r["reference"]:
            continue
        for measure, col in (("end", "end_ratio"), ("slope", "slope_ratio")):
            key = f"{base}.{r['reference']}.{r['reference_pair']}.{measure}"
            same_number(testcase, nums[key], float(r[col]), key)
            prefix = "end" if measure == "end" else "slope"
            if r["informative"] == "1":
                same_number(testcase, nums[key + ".lo"], float(r[prefix + "_lo"]), key + ".lo")
                same_number(testcase, nums[key + ".hi"], float(r[prefix + "_hi"]), key + ".hi")
            else:
                testcase.assertNotIn(key + ".lo", nums)
                n = min(int(r["independent"]), int(r["reference_independent"]))
                testcase.assertIn(f"not informative ({n} pair{'s' if n != 1 else ''})", table)
    # The deciding ratio of each row: the largest ratio, of the measure the verdict used, over its references.
    for a, v, c in groups:
        mine = [r for r in rows if (r["axis"], r["value"], r["condition"]) == (a, v, c) and r["reference"]]
        col = "slope_ratio" if mine and mine[0]["measure"] == "slope" else "end_ratio"
        finite = [r for r in mine if float(r[col]) == float(r[col])]
        key = f"verdict.{a}.{v}.{c}.decides"
        if not finite:
            testcase.assertNotIn(key, nums)
            continue
        top = max(finite, key=lambda r: float(r[col]))
        same_number(testcase, nums[key], float(top[col]), key)
        if top["informative"] == "1":
            prefix = col.split("_")[0]
            same_number(testcase, nums[key + ".lo"], float(top[prefix + "_lo"]), key + ".lo")
            same_number(testcase, nums[key + ".hi"], float(top[prefix + "_hi"]), key + ".hi")
    body = table.split("<tbody>", 1)[1]
    testcase.assertEqual(body.count("<tr>"), len(groups))
    # Each row names its condition, in verdict.csv's order.
    positions = [body.index(f"{a}: {v} vs ") for a, v, _ in groups[:1]]
    testcase.assertEqual(positions, sorted(positions))
    for a, v, c in groups:
        words = "all variants" if c == "all" else ", ".join(x.replace("=", " ", 1) for x in c.split(";"))
        testcase.assertIn(words, body)
    return len(groups)


# A ratio written in prose ("10x", "~10x", "0.614x").
# A ratio starts a word: "4x" inside a random folder name (fastudy-report-e2e-9q13zt4x) is no claim.
RATIO_WORD = re.compile(r"(?<![\w.])[~≈]?\d+(?:\.\d+)?\s?x\b")
# The one ratio the report states without computing it: the paper's headline (Fig. 4), a documented fact
# (analysis/report/microbench.py PAPER_RATIO), always attributed to the paper.
PAPER_FACT = "the paper's ~10x"


def prose_ratio_claims(html_path):
    """Ratios in report.html's visible text that are not computed numbers (<span class="num">) and not the
    paper's documented ~10x: each a piece of text around the claim. The resolved configuration is left out."""
    text = Path(html_path).read_text(encoding="utf-8")
    text = re.sub(r"<img [^>]*>|<style>.*?</style>", "", text, flags=re.S)
    text = re.sub(r"<details><summary>Resolved configuration.*?</details>", "", text, flags=re.S)
    text = re.sub(r'<span class="num"[^>]*>[^<]*</span>', "#", text)
    text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    text = text.replace(PAPER_FACT, "#").replace(PAPER_FACT[0].upper() + PAPER_FACT[1:], "#")
    return [text[max(0, m.start() - 60):m.end() + 20] for m in RATIO_WORD.finditer(text)]
