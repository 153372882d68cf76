"""Reports say what a person means (issue 30): a passing check off by 4.77e-07 at its output's scale is
"4 ulp" in the summary, the matrix, the heat map and to `max_ulp`, not the 4,690 ULPs of its elements
near zero; the raw distance stays in the full report and the JSON."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from pytest_ortdiff import Checker, Tolerance, compare, models
from pytest_ortdiff.numerics.report import render_table
from pytest_ortdiff.numerics.results import CheckRow, ResultsFile
from pytest_ortdiff.reports.htmlreport import render
from pytest_ortdiff.reports.matrix import pivot


@pytest.fixture(scope="module")
def llama_row() -> CheckRow:
    """The README's llama_attention float32 check on CPU (max abs 1.19e-07, floored rel 4.77e-07: 4 ULPs at
    the output's scale, 4.69e+03 raw), judged by max_ulp=4."""
    model = models.llama_attention(dtype="float32")
    feeds = models.random_feeds(model, dims={"batch": 4, "seq": 4, "past": 4}, seed=0)
    result = Checker("CPU", "float32", tolerance={"max_ulp": 4}).check(model, feeds)  # raised before: 4.69e+03 > 4
    report = result.report
    assert report.max_rel_floored == pytest.approx(4.77e-07, rel=1e-2)
    assert (report.max_ulp_floored, report.max_ulp) == (4, pytest.approx(4690, rel=1e-2))
    (row,) = result.rows()
    return replace(row, test="t.py::test_llama[CPU-float32]", outcome="passed")


def test_max_ulp_judges_the_floored_ulps(llama_row: CheckRow) -> None:
    assert llama_row.passed and llama_row.tolerance == "max_ulp=4"
    assert llama_row.worst == "max 4 ulp (allows 4)"
    assert llama_row.ulp == 4 and llama_row.max_ulp == pytest.approx(4690, rel=1e-2)  # (the JSON keeps the raw distance)
    assert llama_row.to_dict()["report"]["max_ulp"] == llama_row.max_ulp


def test_summary_matrix_and_heat_map_show_the_floored_ulps(llama_row: CheckRow) -> None:
    head, line = render_table([llama_row]).splitlines()
    assert head.split()[7:9] == ["max", "ulp"] and line.split()[5] == "4", line
    matrix = pivot([ResultsFile((llama_row,))])
    cell = matrix.cell("t.py::test_llama", matrix.columns[0])
    assert cell is not None and cell.text == "ok 1.19e-07 (4 ulp)"
    assert "| t.py::test_llama | ✅ 1.19e-07 (4 ulp) |" in matrix.render_markdown()
    html = render([ResultsFile((llama_row,))])
    (td,) = re.findall(r'<td class="passed"[^>]*><a [^>]*>[^<]*</a></td>', html)
    assert ">4 ulp</a></td>" in td and "hsl(120,55%,87%)" in td, td  # pale: 4 ULPs (4.69e+03 took 0.74 of the scale: hsl(78,55%,74%))
    assert "max ulp 4 · " not in html and "max abs 1.19e-07 · max ulp 4</span>" in html
    assert "<dt>max ulp</dt><dd>4 at the output&#x27;s scale (raw 4.69e+03)</dd>" in html


def test_max_ulp_near_zero_and_a_broken_one_naming_both_distances() -> None:
    import torch

    expected = torch.tensor([1000.0, 1000.0, 1e-3])
    got = expected.clone()
    for _ in range(7):  # the element near zero moved 7 ULPs: 7 of its own, nothing at the output's scale (1024)
        got[2] = torch.nextafter(got[2:3], torch.tensor([1.0]))[0]
    report = compare(expected, got)
    assert report.max_ulp == 7 and report.max_ulp_floored is not None and report.max_ulp_floored < 1e-5
    assert Tolerance(max_ulp=4).check(report) == []  # failed before: 7 raw ULPs > 4
    (v,) = Tolerance(max_ulp=0).check(report)
    assert v.message == f"max ULP error {report.max_ulp_floored:.3g} exceeds max_ulp=0 (ULPs at the output's scale; raw 7)"
