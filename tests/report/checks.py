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
    return {k: (float(v), html.unescape(t)) for k, v, t in NUM_SPAN.findall(section) if k}


def ranking_final(ranking_csv):
    """axis -> whole-axis row ('*') of ranking.csv at its last step, values as text."""
    lines = [l for l in Path(ranking_csv).read_text().splitlines() if l and not l.startswith("#")]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    last = max(int(r["step"]) for r in rows)
    return {r["axis"]: r for r in rows if int(r["step"]) == last and r["value_a"] == "*"}, last


def three_sig(x):
    return f"{x:.3g}"


def verdict_matches_ranking(testcase, html_path, ranking_csv, references=("seed", "precision")):
    """The verdict's numbers are ranking.csv's, exactly (data-value) and as printed (3 significant digits)."""
    nums = verdict_numbers(html_path)
    final, _ = ranking_final(ranking_csv)
    att = final["attention"]
    for col in ("w1_mean", "w1_min", "w1_max"):
        value, printed = nums[f"verdict.attention.{col}"]
        testcase.assertEqual(value, float(att[col]), col)
        testcase.assertEqual(printed, three_sig(float(att[col])), col)
    checked = 0
    for axis in references:
        if axis not in final:
            continue
        ref = final[axis]
        value, printed = nums[f"verdict.{axis}.w1_mean"]
        testcase.assertEqual(value, float(ref["w1_mean"]))
        testcase.assertEqual(printed, three_sig(float(ref["w1_mean"])))
        ratio = float(ref["ratio_to_attention"])
        if ratio >= 1:
            value, printed = nums[f"verdict.{axis}.ratio"]
            testcase.assertEqual(value, ratio)
            testcase.assertEqual(printed, three_sig(ratio) + "x")
        else:
            value, printed = nums[f"verdict.{axis}.inverse_ratio"]
            testcase.assertAlmostEqual(value, 1 / ratio, delta=1e-12 / ratio)
        for col in ("ratio_lo", "ratio_hi"):
            value, printed = nums[f"verdict.{axis}.{col}"]
            testcase.assertEqual(value, float(ref[col]))
            testcase.assertEqual(printed, three_sig(float(ref[col])))
        checked += 1
    return checked
