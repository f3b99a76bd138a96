"""The verdict table in a real browser (issue 30): report.html of a synthetic study opened in Debian's
headless Chromium at 1280x800. A copy of the page gets a script that writes the geometry of the verdict
table (getBoundingClientRect of its first column, the table and the page's scroll width) into the DOM,
once with every <details> closed and once with all of them open; Chromium's --dump-dom prints the DOM
and the test reads the numbers back. The report itself has no script. The tests skip, naming the reason,
where no Chromium runs (not installed, or it cannot start here).
Run: PYTHONPATH=analysis:tests/report /usr/bin/python3 -m unittest test_browser
"""

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

import synthetic
from report.cli import build_report

WIDTH, HEIGHT = 1280, 800
# Geometry of the verdict table, written into <html data-geometry-STATE='{...}'> after the page loaded.
PROBE = """<script>
function geometry() {
  const table = document.getElementById("table-verdict");
  if (!table) return {missing: "no element table-verdict"};
  const first = [...table.querySelectorAll("tr > :first-child")].map(c => c.getBoundingClientRect());
  const t = table.getBoundingClientRect();
  return {inner_width: window.innerWidth, inner_height: window.innerHeight,
          scroll_width: document.documentElement.scrollWidth, table_right: t.right,
          column_left: Math.min(...first.map(r => r.left)), column_right: Math.max(...first.map(r => r.right)),
          first_row_top: first.length > 1 ? first[1].top : null, rows: first.length - 1};
}
window.addEventListener("load", () => {
  document.documentElement.setAttribute("data-geometry-closed", JSON.stringify(geometry()));
  document.querySelectorAll("details").forEach(d => { d.open = true; });
  document.documentElement.setAttribute("data-geometry-open", JSON.stringify(geometry()));
});
</script>"""


def chromium():
    """The Chromium executable, or None."""
    for name in (os.environ.get("FASTUDY_CHROMIUM", ""), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def dump_dom(browser, page, profile):
    """(returncode, stdout, stderr) of Chromium printing the DOM of `page` at WIDTHxHEIGHT."""
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "--dump-dom", page.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


class VerdictInViewportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.browser = chromium()
        if cls.browser is None:
            raise unittest.SkipTest("no chromium on PATH (apt-get install chromium; scripts/test.sh installs it)")
        cls.dir = Path(tempfile.mkdtemp(prefix="fastudy-browser-test-"))
        probe = cls.dir / "probe.html"
        probe.write_text("<html><body><p id=x>ok</p><script>document.getElementById('x').textContent = 'ran'"
                         "</script></body></html>")
        try:
            code, out, err = dump_dom(cls.browser, probe, cls.dir / "profile")
        except (OSError, subprocess.TimeoutExpired) as e:
            shutil.rmtree(cls.dir, ignore_errors=True)
            raise unittest.SkipTest(f"chromium cannot run here: {e}")
        if code != 0 or ">ran<" not in out:
            shutil.rmtree(cls.dir, ignore_errors=True)
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise unittest.SkipTest(f"chromium cannot run here (exit {code}): {last}")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def geometry(self, out):
        """{state: geometry} of the verdict table of the study in `out`, with details closed and open."""
        html_path, _ = build_report(out)
        page = out / "report-probe.html"
        page.write_text(html_path.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"),
                        encoding="utf-8")
        code, dom, err = dump_dom(self.browser, page, self.dir / "profile")
        self.assertEqual(code, 0, err[-2000:])
        found = {}
        for state in ("closed", "open"):
            m = re.search(rf'data-geometry-{state}="([^"]*)"', dom)
            self.assertIsNotNone(m, f"the probe wrote no geometry ({state}): {dom[:500]}")
            found[state] = json.loads(html.unescape(m.group(1)))
            self.assertNotIn("missing", found[state])
        return found

    def check_in_viewport(self, found, rows):
        for state, g in found.items():
            with self.subTest(details=state):
                self.assertEqual((g["inner_width"], g["rows"]), (WIDTH, rows), g)
                # The verdict column lies inside the viewport, and nothing on the page needs sideways scrolling.
                self.assertGreaterEqual(g["column_left"], 0, g)
                self.assertLessEqual(g["column_right"], g["inner_width"], g)
                self.assertLessEqual(g["table_right"], g["inner_width"], g)
                self.assertLessEqual(g["scroll_width"], g["inner_width"], g)
        # Closed (as the page opens), the first verdict is on the first screen.
        closed = found["closed"]
        self.assertLess(closed["first_row_top"], closed["inner_height"], closed)

    def test_full_study(self):
        out = synthetic.full_study(self.dir / "full")
        self.check_in_viewport(self.geometry(out), rows=2)

    def test_three_precisions_outside_with_intervals(self):
        # The widest evidence: three precisions (two reference pairs per row), 3 seeds and a noise axis
        # (intervals, a measured floor), attention outside the bounds.
        grid = synthetic.GRID
        synthetic.GRID = [("attention", ["baseline", "flash"]), ("precision", ["fp32", "fp16", "bf16"]),
                          ("seed", ["1", "2", "3"]), ("repeat", ["1", "2"])]
        try:
            out = self.dir / "wide"
            out.mkdir()
            synthetic.write_study_toml(out)
            synthetic.write_reduce(out, attention_w1=1e-3, left_out=())
        finally:
            synthetic.GRID = grid
        self.check_in_viewport(self.geometry(out), rows=3)


if __name__ == "__main__":
    unittest.main()
