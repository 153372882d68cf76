"""Rendering: the report block (maxima with where and both values, histogram rows with shares and bars
proportional to counts), the one-line summary, the summary table (text and markdown) and the worst
budget line."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from pytest_ortdiff import compare
from pytest_ortdiff.numerics.diff import DiffReport
from pytest_ortdiff.numerics.report import render_table, summary_line, worst_budget_line

BAR = "█"


@pytest.fixture(scope="module")
def report() -> DiffReport:
    """2,000 float32 elements: 1,000 off by 2**-9, 500 off by 0.5 (the first at (1, 0)), 500 exact."""
    e = torch.ones(2, 1000)
    g = e.clone()
    g.view(-1)[0:1000] = 1.0 + 2**-9
    g.view(-1)[1000:1500] = 1.5
    return compare({"Z": e}, {"Z": g})


def _rows(text: str) -> dict[str, str]:
    """Histogram rows of a rendered block, by threshold."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("|diff| >")) + 1
    out = {}
    for line in lines[start:]:
        if not line.startswith("   ") or line.startswith("  max"):
            break
        out[line.split()[0]] = line
    return out


def test_render_header_and_maxima(report: DiffReport) -> None:
    lines = report.render().splitlines()
    assert lines[0] == "output 'Z'  float32[2x1000]  n=2,000"
    assert lines[1] == "  max abs   0.5        at (1, 0): expected 1, got 1.5"
    # issue 14 (6): the floored errors beside the raw ones; every |expected| is 1, the floor (RMS) too
    assert lines[2] == "  max rel   0.5        floored 0.5       (|expected| floored at 1, its RMS as a power of two)"
    assert lines[3] == "  max ulp   4.19e+06   floored 4.19e+06"  # 1.5 - 1.0 = 2**22 float32 ULPs of 1
    assert lines[4] == "  mean abs  0.126"  # (1000 * 2**-9 + 500 * 0.5) / 2000
    assert lines[5] == "  NaN mismatch 0   Inf mismatch 0"
    assert lines[6].rstrip() == "  |diff| >   elements   share"


def test_render_histogram_rows_with_shares_and_bars(report: DiffReport) -> None:
    rows = _rows(report.render())
    assert list(rows) == ["0", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1", "10", "100"]
    assert rows["0"] == "         0       1,500   75.00 %  " + BAR * 30
    assert rows["0.001"] == "     0.001       1,500   75.00 %  " + BAR * 30
    assert rows["0.01"] == "      0.01         500   25.00 %  " + BAR * 10
    assert rows["0.1"] == "       0.1         500   25.00 %  " + BAR * 10
    assert rows["1"].rstrip() == "         1           0       0 %"
    assert BAR not in rows["100"]


def test_bars_are_proportional_and_nonzero_counts_show() -> None:
    e = torch.zeros(1_000_000)
    g = e.clone()
    g[0] = 5.0  # one element above 1
    g[1:334] = 0.05  # 333 more above 0.01
    r = compare(e, g)
    rows = _rows(r.render(width=40))
    assert rows["0.01"] == "      0.01         334    0.03 %  " + BAR * 40
    assert rows["1"].endswith("         1  0.0001 %  " + BAR)  # round(40 / 334) = 0, but a count shows
    assert rows["10"].rstrip().endswith("0 %")
    assert r.render().splitlines()[0] == "output  float32[1000000]  n=1,000,000"
    bars = {t: row.count(BAR) for t, row in _rows(r.render(width=30)).items()}
    assert bars == {"0": 30, "1e-06": 30, "1e-05": 30, "0.0001": 30, "0.001": 30, "0.01": 30, "0.1": 1, "1": 1, "10": 0, "100": 0}


def test_render_nan_mismatch_and_scalar() -> None:
    r = compare(torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([1.0, 2.0, 3.5]), name="Y")
    text = r.render()
    assert text.splitlines()[0] == "output 'Y'  float32[3]  n=3"
    assert "  max abs   0.5        at (2): expected 3, got 3.5" in text
    assert "  NaN mismatch 1   Inf mismatch 0" in text
    s = compare(torch.tensor(1.0), torch.tensor(2.0)).render()
    assert s.splitlines()[0] == "output  float32[scalar]  n=1"
    assert "at (): expected 1, got 2" in s


def test_render_allclose_line() -> None:
    e = torch.tensor([1.0, 2.0, 4.0, 8.0])
    g = torch.tensor([1.0, 2.0, 4.5, 8.0])
    text = compare(e, g, tolerance=(1e-3, 1e-3)).render()
    assert "  outside atol=0.001 rtol=0.001: 1 (25.00 %)" in text.splitlines()


def test_render_several_outputs_has_a_header_and_a_block_each() -> None:
    e = {"Z": torch.zeros(2, 3), "W": torch.zeros(4, dtype=torch.float16)}
    g = {"Z": torch.full((2, 3), 0.25), "W": torch.tensor([0.0, 0.0, 0.0, 2.0], dtype=torch.float16)}
    text = compare(e, g).render()
    lines = text.splitlines()
    # maxima over the outputs; every expected value is 0, so the floor is float32's smallest normal and the
    # floored ULPs count its spacing (2**-149): 0.25 * 2**149 (the raw ULP distance crosses binades)
    assert lines[0] == "2 outputs, 10 elements: max abs 2, max rel 2.13e+37, max ulp 1.05e+09 (floored: rel 2.13e+37, ulp 1.78e+44)"
    assert "output 'Z'  float32[2x3]  n=6" in lines
    assert "output 'W'  float16[4]  n=4" in lines
    assert "  max abs   2          at (3): expected 0, got 2" in lines


def test_summary_is_one_line(report: DiffReport) -> None:
    text = report.summary()
    assert "\n" not in text
    # issue 14 (3): rel and ulp "there" are the max abs element's; the maxima over all elements are labelled
    assert text == "max abs 0.5 at Z (1, 0) (there: rel 0.5, 4.19e+06 ulp); max rel 0.5 (floored 0.5), max ulp 4.19e+06 (floored 4.19e+06); 1,500/2,000 differ, 500 > 0.1"
    assert str(report) == text
    assert summary_line(compare(torch.ones(2), torch.ones(2), name="Q")) == "Q: max abs 0; 0/2 differ"


def test_summary_mentions_mismatches() -> None:
    r = compare(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, float("-inf")]), name="Y")
    assert r.summary().endswith("; NaN mismatch 0, Inf mismatch 1")


def test_render_survives_the_json_round_trip(report: DiffReport) -> None:
    back = DiffReport.from_dict(report.to_dict())
    assert back.render() == report.render()
    assert back.summary() == report.summary()


# -- summary table ---------------------------------------------------------------------------------

ROWS = [
    {"test": "t.py::a[CPU-float32]", "provider": "CPU", "dtype": "float32", "max_abs": 0.000153, "max_rel": 5.57e-07, "worst": "0 > 0.01 (0 %; allows 0 %)", "outcome": "passed"},
    {"test": "t.py::b[CUDA-float16]", "provider": "CUDA", "dtype": "float16", "max_abs": 0.25, "max_rel": None, "worst": "585,826 > 0.01 (24.83 %)", "outcome": "failed"},
]


def test_render_table_text() -> None:
    lines = render_table(ROWS).splitlines()
    assert lines == [
        "test                   provider  dtype    max abs   max rel   max ulp  worst budget line           result",
        "t.py::a[CPU-float32]   CPU       float32  0.000153  5.57e-07  -        0 > 0.01 (0 %; allows 0 %)  passed",
        "t.py::b[CUDA-float16]  CUDA      float16  0.25      -         -        585,826 > 0.01 (24.83 %)    failed",
    ]


def test_render_table_markdown() -> None:
    lines = render_table(ROWS, markdown=True).splitlines()
    assert lines == [
        "| test | provider | dtype | max abs | max rel | max ulp | worst budget line | result |",
        "|---|---|---|---|---|---|---|---|",
        "| t.py::a[CPU-float32] | CPU | float32 | 0.000153 | 5.57e-07 | - | 0 > 0.01 (0 %; allows 0 %) | passed |",
        "| t.py::b[CUDA-float16] | CUDA | float16 | 0.25 | - | - | 585,826 > 0.01 (24.83 %) | failed |",
    ]


def test_render_table_empty() -> None:
    assert render_table([]) == "test  provider  dtype  max abs  max rel  max ulp  worst budget line  result"


# -- worst budget line --------------------------------------------------------------------------------


def test_worst_budget_line_picks_the_line_most_used(report: DiffReport) -> None:
    # >0.01: 500 of an allowed 600 (83 % used); >1: 0 of 200 (0 %)
    assert worst_budget_line(report, {1e-2: 0.3, 1.0: 0.1}) == "500 > 0.01 (25.00 %; allows 30 %)"
    # >0.01: 500 of 1,000 (50 %); >0.1: 500 of 600 (83 %)
    assert worst_budget_line(report, {1e-2: 0.5, 0.1: 0.3}) == "500 > 0.1 (25.00 %; allows 30 %)"
    # any element over a zero allowance is the worst
    assert worst_budget_line(report, {1e-3: 0.9, 0.1: 0.0}) == "500 > 0.1 (25.00 %; allows 0 %)"
    # nothing used: the first (smallest) threshold
    assert worst_budget_line(report, {1.0: 0.0, 10.0: 0.0}) == "0 > 1 (0 %; allows 0 %)"


def test_worst_budget_line_without_budget(report: DiffReport) -> None:
    assert worst_budget_line(report, None) == "500 > 0.1 (25.00 %)"
    exact = compare(torch.ones(3), torch.ones(3))
    assert worst_budget_line(exact, None) == "exact"


def test_all_mismatches_point_at_the_first_nan_inf_mismatch_not_at_a_max_abs() -> None:
    # float16 log of an underflowed square: every element -inf where the truth is finite
    e = torch.tensor([-28.1, -20.0, 1.0], dtype=torch.float16)
    g = torch.tensor([-math.inf, -math.inf, math.nan], dtype=torch.float16)
    text = compare(e, g).render()
    assert "max abs   0          over finite pairs; first NaN/Inf mismatch at (0): expected -28.09375, got -inf" in text
    assert "NaN mismatch 1   Inf mismatch 2" in text
    # with a finite difference, the line is the usual one
    text = compare(e, torch.tensor([-math.inf, -20.5, 1.0], dtype=torch.float16)).render()
    assert "max abs   0.5        at (1): expected -20, got -20.5" in text


def test_render_table_names_nan_inf_mismatches_instead_of_the_budget_line() -> None:
    # 50 of 256 elements NaN where the reference is finite, one finite pair off by 0.25
    e = torch.zeros(256)
    g = e.clone()
    g[:50] = math.nan
    g[100] = 0.25
    r = compare(e, g)
    assert worst_budget_line(r, None) == "50 > 100 (19.53 %)"  # the histogram counts the mismatches too
    row = {"test": "t.py::a", "provider": "CPU", "dtype": "float32", "max_abs": r.max_abs, "max_rel": r.max_rel, "worst": worst_budget_line(r, None), "outcome": "failed", "report": r.to_dict()}
    lines = render_table([row]).splitlines()
    assert re.split(r"\s{2,}", lines[1]) == ["t.py::a", "CPU", "float32", "0.25", "2.13e+37", "1.78e+44", "50 NaN, 0 Inf mismatches", "failed"]
    inf = compare(torch.tensor([1.0, math.inf, 2.0]), torch.tensor([1.0, -math.inf, math.inf]))
    row = {**row, "max_abs": inf.max_abs, "worst": worst_budget_line(inf, None), "report": inf.to_dict()}
    assert "| 0 NaN, 2 Inf mismatches | failed |" in render_table([row], markdown=True)
    # rows without a report (older files) or without mismatches keep their budget line
    assert "| 50 > 100 (19.53 %) | failed |" in render_table([{**row, "worst": "50 > 100 (19.53 %)", "report": None}], markdown=True)


# -- issue 14: honest one-line summary (3), the row's worst line without a budget (2) ----------------


def test_summary_rel_and_ulp_there_are_the_max_abs_elements_own() -> None:
    """max abs at a large value (small rel there), max rel at a near-zero value elsewhere: the line says
    which is which, with the numbers numpy gives for each element."""
    e = np.array([3.0, 1e-3, 2.0, 0.0], np.float32)
    g = np.array([3.0 + 2**-20, 1e-3, 2.0 + 2**-21, 1e-7], np.float32)
    r = compare(torch.from_numpy(e), torch.from_numpy(g))
    d = np.abs(e - g).astype(np.float64)
    assert r.argmax == (0,) and r.max_abs == d[0]
    rel0 = d[0] / 3.0
    ulp0 = int(g[:1].view(np.int32)[0]) - int(e[:1].view(np.int32)[0])  # same sign: bit patterns apart
    assert (r.rel_at_max, r.ulp_at_max) == (rel0, float(ulp0))
    assert r.max_rel == float(np.float32(1e-7)) / 2.0**-126  # the near-zero element, elsewhere
    assert r.summary().startswith(f"max abs {d[0]:.3g} at (0) (there: rel {rel0:.3g}, {ulp0} ulp); max rel {r.max_rel:.3g} (floored ")


def test_summary_of_mismatches_only_and_of_several_outputs() -> None:
    r = compare(torch.tensor([1.0, 2.0]), torch.tensor([math.nan, 2.0]), name="Y")
    assert r.summary() == "Y: max abs 0; 1/2 differ, 1 > 100; NaN mismatch 1, Inf mismatch 0"
    nested = compare({"a": torch.zeros(2), "b": torch.tensor([1.0, 8.0], dtype=torch.float16)}, {"a": torch.zeros(2), "b": torch.tensor([1.0, 8.5], dtype=torch.float16)})
    assert nested.rel_at_max == 0.5 / 8 and nested.ulp_at_max == 64.0  # float16 spacing at 8 is 2**-7
    assert "max abs 0.5 at b (1) (there: rel 0.0625, 64 ulp)" in nested.summary()
    # the output holding the max abs error is named, also when another one has a NaN mismatch
    mixed = compare({"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([4.0])}, {"a": torch.tensor([math.nan, 2.1]), "b": torch.tensor([6.0])})
    assert mixed.summary().startswith("max abs 2 at b (0) (there: rel 0.5, 4.19e+06 ulp); ")


def test_worst_line_says_where_the_report_stands_against_each_stated_rule() -> None:
    from pytest_ortdiff import Tolerance
    from pytest_ortdiff.numerics.report import worst_line

    e = torch.tensor([1.0, 2.0, 4.0, 8.0])
    g = torch.tensor([1.0, 2.0, 4.5, 8.0])
    defaults = Tolerance().for_dtype("float32")  # what a test stating no rule gets
    r = compare(e, g, tolerance=defaults.allclose, thresholds=[0, 0.1])
    assert worst_line(r, defaults) == "1 outside atol=0.0001 rtol=0.0001 (25.00 %)"
    close = compare(e, e + 1e-6, tolerance=defaults.allclose)
    assert worst_line(close, defaults) == "0 outside atol=0.0001 rtol=0.0001 (0 %)"  # never "4 > 0 (100 %)"
    same = compare(e, e, tolerance=defaults.allclose)
    assert worst_line(same, defaults) == "exact"
    budget = Tolerance(budget={0.1: 0.5}).for_dtype("float32")
    assert worst_line(r, budget) == "1 > 0.1 (25.00 %; allows 50 %)"
    ulp = Tolerance(max_ulp=4).for_dtype("float32")
    assert worst_line(r, ulp) == f"max {r.max_ulp:.3g} ulp (allows 4)"
    both = Tolerance(atol=0.1, rtol=0.0, max_ulp=4).for_dtype("float32")
    assert worst_line(compare(e, g, tolerance=both.allclose), both) == f"1 outside atol=0.1 rtol=0 (25.00 %); max {r.max_ulp:.3g} ulp (allows 4)"
    bitwise = Tolerance(atol=0.0, rtol=0.0)
    assert (worst_line(r, bitwise), worst_line(same, bitwise)) == ("1 of 4 differ (25.00 %)", "exact")
    assert worst_line(same, budget) == "0 > 0.1 (0 %; allows 50 %)"  # a budget set: its line, as ever
    assert worst_line(r, Tolerance()) == "-"  # no rule stated, none resolved: nothing to stand against
