"""The HTML report in a real headless browser: a pytester run of the seeds' scenario on CPU float32 and
float16, merged with a second job that conflicts with it and a drifted baseline, is loaded by chromium,
screenshotted, and the sizes the browser laid out are read back from its DOM dump."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_ortdiff.numerics.results import BaselineRow, ResultsFile, TestOutcome
from pytest_ortdiff.reports.htmlreport import write_html
from pytest_ortdiff.reports.matrix import pivot

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: appended to a copy of the report: opens every check, then writes what the browser laid out into the DOM
MEASURE = """<script>
for (const d of document.querySelectorAll('details')) d.open = true;
const box = e => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
const heat = document.querySelector('table.heat');
const m = {
  heat: box(heat),
  rows: heat.querySelectorAll('tbody tr').length,
  cells: Array.from(heat.querySelectorAll('tbody td'), box),
  conflicts: Array.from(heat.querySelectorAll('td.conflict'), box),
  charts: Array.from(document.querySelectorAll('svg.hist'), svg => ({
    box: box(svg),
    bars: Array.from(svg.querySelectorAll('rect.bar'), r => box(r)[1]),
    ticks: svg.querySelectorAll('text.xl').length,
  })),
};
const out = document.createElement('pre'); out.id = 'ortdiff-measured'; out.textContent = JSON.stringify(m);
document.body.appendChild(out);
</script>"""

SUITE = """
import pytest
from pytest_ortdiff import models

DIMS = {"a": 2, "b": 16, "c": 32}

@pytest.mark.ortdiff(budget={1e-3: 0.01, 1.0: 0})
def test_lnmm(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    ortdiff.check(model, models.random_feeds(model, dims=DIMS, seed=0))

def test_oracle(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    ortdiff.check(model, models.random_feeds(model, dims=DIMS, seed=0), reference="float64")
"""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        f"no headless browser on PATH ({', '.join(BROWSERS)}): install one, e.g. `apt-get install chromium` (Debian) to run this test"
    )


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_report_renders_in_headless_chromium(pytester: pytest.Pytester, tmp_path: Path) -> None:
    browser = _browser()
    pytester.makepyfile(test_seed=SUITE)
    result = pytester.runpytest_inprocess(
        "--ort-dtypes=float32,float16", "--ortdiff-json=job.json", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=3, failed=1)  # test_lnmm fails its budget on float16
    job = ResultsFile.read(pytester.path / "job.json")
    # a second job that saw the float32 budget check fail (a conflict), with a drifted baseline
    lnmm32 = next(r for r in job.results if r.test.endswith("test_lnmm[CPU-float32]"))
    drift = replace(lnmm32, test=lnmm32.test + " [baseline out]", outcome="failed", passed=False)
    other = replace(
        job,
        results=(
            *(
                replace(r, outcome="failed", passed=False) if r is lnmm32 else r
                for r in job.results
            ),
            drift,
        ),
        tests=(*job.tests, TestOutcome(lnmm32.test, "failed", "CPU", "float32")),
        baselines=(
            BaselineRow(
                "out",
                "drift",
                "b/out.npz",
                False,
                lnmm32.test,
                drift.max_abs,
                (("onnxruntime", "1.31.0", "1.32.0"),),
            ),
        ),
    )
    files = [job, other]
    report = tmp_path / "report.html"
    write_html(report, files, ["job A", "job B"])
    page = tmp_path / "measured.html"
    page.write_text(
        report.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8"
    )

    shot = tmp_path / "shot.png"
    cmd = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600", f"--screenshot={shot}", "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    m = re.search(r'<pre id="ortdiff-measured">(.*?)</pre>', proc.stdout, re.S)
    assert m is not None, (
        f"{browser} did not render the page (rc {proc.returncode}): {proc.stderr[-2000:]}"
    )
    measured: dict[str, Any] = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert _png_size(shot) == (1280, 1600) and shot.stat().st_size > 10_000

    matrix = pivot(files, ["job A", "job B"])
    heat_w, heat_h = measured["heat"]
    assert heat_w > 200 and heat_h > 20 * len(matrix.tests)
    assert measured["rows"] == len(matrix.tests) == 2
    assert len(measured["cells"]) == len(matrix.tests) * len(matrix.columns) == 4
    assert all(w > 20 and h > 10 for w, h in measured["cells"])
    assert len(measured["conflicts"]) == 1 and all(
        w > 20 and h > 10 for w, h in measured["conflicts"]
    )
    # one chart per check of both jobs, each laid out at its size, its bars as tall as their counts
    rows = [r for f in files for r in f.results]
    assert len(measured["charts"]) == len(rows) == 13
    for chart in measured["charts"]:
        w, h = chart["box"]
        assert w > 300 and h > 150
        assert chart["ticks"] >= 10 and chart["bars"] and all(h > 0 for h in chart["bars"])
    drawn = sorted(len(chart["bars"]) for chart in measured["charts"])
    counted = sorted(sum(1 for c in (r.report or {}).get("counts", {}).values() if c) for r in rows)
    assert drawn == counted
