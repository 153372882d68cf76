"""The HTML report (htmlreport.render / write_html) from real Checker results of the seeds' scenario:
the histogram chart against the DiffReport and the Tolerance's own verdict, the oracle verdict against the
Checker's, blame and baselines when present, conflicts in the heat map, escaping, atomic writing, size."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_ortdiff import Checker, models
from pytest_ortdiff.engine.check import CheckResult, ToleranceBroken
from pytest_ortdiff.numerics.results import (
    UNFINISHED_RUN,
    BaselineRow,
    CheckRow,
    Environment,
    ResultsFile,
    TestOutcome,
)
from pytest_ortdiff.reports.htmlreport import render, write_html

DIMS = {"a": 2, "b": 16, "c": 32}
#: fails on float16 at these dims (about 20 % of elements off by more than 1e-3), passes on float32
BUDGET = {1e-3: 0.01, 1.0: 0}


@dataclass(frozen=True)
class Seed:
    """One case of the seeds' scenario: the budget check (torch reference) and the float64-oracle check."""

    dtype: str
    budget: CheckResult
    oracle: CheckResult
    model: Any
    feeds: Any


def _check(checker: Checker, model: Any, feeds: Any, **kwargs: Any) -> CheckResult:
    try:
        return checker.check(model, feeds, **kwargs)
    except ToleranceBroken as exc:
        assert isinstance(exc.result, CheckResult)
        return exc.result


@pytest.fixture(scope="module")
def seeds() -> dict[str, Seed]:
    out = {}
    for dtype in ("float32", "float16"):
        model = models.layer_norm_matmul_add(dtype=dtype)
        feeds = models.random_feeds(model, dims=DIMS, seed=0)
        budget = _check(Checker("CPU", dtype, tolerance={"budget": BUDGET}), model, feeds)
        oracle = _check(Checker("CPU", dtype), model, feeds, reference="float64")
        out[dtype] = Seed(dtype, budget, oracle, model, feeds)
    return out


def _rows(result: CheckResult, test: str) -> list[CheckRow]:
    """The rows as the session files them: the test id with the judgement's suffix, the outcome set."""
    return [
        replace(r, test=test + r.suffix, suffix="", outcome="passed" if r.passed else "failed")
        for r in result.rows()
    ]


def _file(seeds: dict[str, Seed], **kwargs: Any) -> ResultsFile:
    rows, tests = [], []
    for dtype, s in seeds.items():
        for name, result in (("test_lnmm", s.budget), ("test_oracle", s.oracle)):
            test = f"t.py::{name}[CPU-{dtype}]"
            rows += _rows(result, test)
            tests.append(TestOutcome(test, "passed" if result.passed else "failed", "CPU", dtype))
    return ResultsFile(tuple(rows), (), tuple(tests), **kwargs)


def _sections(html: str) -> dict[str, str]:
    """test id -> the HTML of its check section."""
    out = {}
    for m in re.finditer(
        r'<details class="check[^"]*" id="c\d+"[^>]*><summary>.*?<code>(.*?)</code>(.*?)</details>',
        html,
        re.S,
    ):
        out[m.group(1).replace("&amp;", "&")] = m.group(0)
    return out


def _svg(section: str) -> ET.Element:
    m = re.search(r"<svg .*?</svg>", section, re.S)
    assert m is not None, "no chart in the section"
    return ET.fromstring(m.group(0))


def _threshold(bar: ET.Element) -> str:
    """The threshold of a bar, from its tooltip ("3,103 elements (25.25 %) with |diff| > 0.01")."""
    return bar.findtext("title", "").rsplit("> ", 1)[1]


def test_chart_draws_the_histogram_and_marks_the_broken_budget_lines(
    seeds: dict[str, Seed],
) -> None:
    html = render([_file(seeds)])
    for dtype, s in seeds.items():
        report, tol = s.budget.report, s.budget.tolerance
        svg = _svg(_sections(html)[f"t.py::test_lnmm[CPU-{dtype}]"])
        bars = {float(_threshold(e)): e for e in svg if e.tag == "rect"}
        # a bar per threshold some element exceeds, its tooltip the DiffReport's count
        assert sorted(bars) == [t for t in report.thresholds if report.counts[t]]
        assert all(
            int(e.findtext("title", "").split()[0].replace(",", "")) == report.counts[t]
            for t, e in bars.items()
        )
        assert [e.text for e in svg if e.get("class") == "xl"] == [
            f"{t:g}" for t in report.thresholds
        ]  # every threshold on the axis
        heights = {t: float(e.get("height", "nan")) for t, e in bars.items()}
        for a in heights:
            for b in heights:
                assert (heights[a] > heights[b]) == (report.counts[a] > report.counts[b]), (a, b)
        # a red bar exactly where the Tolerance itself says the budget is broken, and a cap per budget line
        over = {t for t, e in bars.items() if "over" in e.get("class", "")}
        broken = {t for t, frac in BUDGET.items() if report.counts[t] > frac * report.n}
        assert over == broken
        assert bool(broken) == any(v.rule == "budget" for v in tol.check(report))
        assert len([e for e in svg if e.get("class") == "cap"]) == len(BUDGET)
    assert (
        not seeds["float16"].budget.passed and seeds["float32"].budget.passed
    )  # both sides exercised


def test_chart_draws_atol_where_it_falls_between_thresholds(seeds: dict[str, Seed]) -> None:
    # the oracle checks run under the dtype's default atol/rtol: a dashed line at log10(atol) on the axis
    html = render([_file(seeds)])
    for dtype, s in seeds.items():
        atol = s.oracle.report.tolerance[0]  # type: ignore[index]
        svg = _svg(_sections(html)[f"t.py::test_oracle[CPU-{dtype}] [ort vs float64]"])
        ts = s.oracle.report.thresholds
        centres = {
            t: float(e.get("x", "nan"))
            for t, e in zip(ts, [e for e in svg if e.get("class") == "xl"], strict=True)
        }
        (line,) = [e for e in svg if e.get("class") == "atol"]
        x = float(line.get("x1", "nan"))
        below = max(t for t in ts if t <= atol)
        above = min((t for t in ts if t >= atol), default=below)
        assert centres[below] - 0.05 <= x <= centres[above] + 0.05
        if below != above:
            share = (math.log10(atol) - math.log10(below)) / (math.log10(above) - math.log10(below))
            assert x == pytest.approx(
                centres[below] + share * (centres[above] - centres[below]), abs=0.1
            )
        assert f"atol {atol:g}" in "".join(svg.itertext())


def test_oracle_verdict_is_the_checkers(seeds: dict[str, Seed]) -> None:
    html = render([_file(seeds)])
    names = {"onnxruntime": "onnxruntime", "torch": "the torch evaluator", "tie": "neither (a tie)"}
    for dtype, s in seeds.items():
        assert s.oracle.closer is not None
        for suffix in (" [ort vs float64]", " [torch vs float64]"):
            section = _sections(html)[f"t.py::test_oracle[CPU-{dtype}]{suffix}"]
            assert f"Closer to the float64 oracle: {names[s.oracle.closer]}</b>" in section
            r_ort, r_torch = s.oracle.judgements[0].report, s.oracle.judgements[1].report
            assert (
                f"{r_ort.mismatches:,} elements off; torch evaluator: max {r_torch.max_ulp:g} ulp, {r_torch.mismatches:,}"
                in section
            )
    # the heat map's cells of the oracle test say it too, in their tooltip
    heat = html[html.index('<table class="heat">') :]
    row = heat[heat.index("<code>t.py::test_oracle</code>") :].split("</tr>", 1)[0]
    tips = re.findall(r' title="([^"]*)"', row)
    assert len(tips) == 2  # CPU float32, CPU float16
    for tip, s in zip(tips, (seeds["float32"], seeds["float16"]), strict=True):
        assert f"closer to the float64 oracle: {names[s.oracle.closer]}" in tip  # type: ignore[index]


@dataclass(frozen=True)
class _BlamedRow(CheckRow):
    """A row carrying its check's BlameTable.to_dict(), as the session would need it to (see the report)."""

    blame: dict[str, Any] | None = None


def test_blame_table_and_module_scopes_when_the_row_carries_them(seeds: dict[str, Seed]) -> None:
    s = seeds["float32"]
    table = Checker("CPU", "float32").blame(s.model, s.feeds)
    # scopes as an exporter's metadata would give them, so that by_scope has something to sum
    table.rows = [
        replace(r, scope=f"block.{'norm' if r.op_type == 'LayerNormalization' else 'proj'}")
        for r in table.rows
    ]
    blame = table.to_dict()
    row = _BlamedRow(
        **{**_rows(s.budget, "t.py::test_blamed[CPU-float32]")[0].__dict__, "blame": blame}
    )
    html = render([ResultsFile((row,))])
    section = _sections(html)["t.py::test_blamed[CPU-float32]"]
    for r in table.rows:
        assert f"<code>{r.node}</code></td><td>{r.op_type}</td>" in section
        assert f"{r.explained * 100:.0f} %</td>" in section
    for sc in table.by_scope():
        if sc.explained > 0:
            assert (
                f"<li><code>{sc.scope}</code>: {sc.explained * 100:.0f} % of the gap ({sc.nodes} node{'' if sc.nodes == 1 else 's'};"
                in section
            )
    assert (
        table.culprit is not None and f"most to blame: <code>{table.culprit.node}</code>" in section
    )
    assert (
        "Blame" not in _sections(render([_file(seeds)]))["t.py::test_lnmm[CPU-float32]"]
    )  # absent: nothing drawn


def test_baseline_drift_with_its_environment_changes(seeds: dict[str, Seed]) -> None:
    s = seeds["float16"]
    test = "t.py::test_base[CPU-float16]"
    drift = replace(
        _rows(s.budget, test)[0], test=test + " [baseline out]", outcome="failed", passed=False
    )
    rows = (
        BaselineRow(
            "out",
            "drift",
            "baselines/t/test_base.out.npz",
            False,
            test,
            max_abs=drift.max_abs,
            env_changes=(("onnxruntime", "1.31.0", "1.32.0"),),
        ),
        BaselineRow(
            "gone", "missing", "baselines/t/test_gone.npz", False, "t.py::test_gone[CPU-float16]"
        ),
    )
    tests = (
        TestOutcome(test, "failed", "CPU", "float16"),
        TestOutcome("t.py::test_gone[CPU-float16]", "failed", "CPU", "float16", "baseline missing"),
    )
    html = render([ResultsFile((drift,), (), tests, baselines=rows)])
    section = _sections(html)[test + " [baseline out]"]
    assert f"<b>Baseline out</b>: drift, max abs drift {drift.max_abs:.3g}" in section
    assert "<tr><td>onnxruntime</td><td>1.31.0</td><td>1.32.0</td></tr>" in section
    baselines = html[html.index('<section id="baselines">') :]
    assert "onnxruntime: 1.31.0 → 1.32.0" in baselines and ">missing</span>" in baselines
    # the test that failed on its missing baseline is listed with why, though no check of it failed
    failures = html[html.index('<section id="failures">') :]
    assert (
        "t.py::test_gone[CPU-float16]" in failures
        and "baseline &#x27;gone&#x27; missing" in failures
    )


def test_jobs_heat_map_and_a_conflict_between_jobs(seeds: dict[str, Seed]) -> None:
    one = _file(
        seeds,
        environment=Environment(
            onnxruntime="1.32.0", torch="2.13.0", providers=("CPU",), dtypes=("float32", "float16")
        ),
    )
    # a second job that saw the float32 budget check fail: the same cell reported differently
    flipped = tuple(
        replace(r, outcome="failed", passed=False, max_abs=0.5)
        if r.test == "t.py::test_lnmm[CPU-float32]"
        else r
        for r in one.results
    )
    two = replace(one, results=flipped)
    html = render([one, two], ["job A", "job B"])
    assert "<td>job A</td>" in html and "<td>job B</td>" in html and "onnxruntime: 1.32.0" in html
    heat = html[
        html.index('<table class="heat">') : html.index(
            "</table>", html.index('<table class="heat">')
        )
    ]
    assert heat.count("<tr>") == 3  # the header, test_lnmm, test_oracle
    assert [m for m in re.findall(r'<th scope="col">(.*?)</th>', heat)] == [
        "test",
        "CPU float32",
        "CPU float16",
    ]
    conflict = re.findall(r'<td class="conflict"[^>]*>(.*?)</td>', heat)
    assert (
        len(conflict) == 1 and "≠" in conflict[0] and "FAIL" in conflict[0] and "ok" in conflict[0]
    )
    assert "1 conflicting cell(s)" in html
    # every check of both jobs has its section, each cell links to one that exists
    assert len(_sections(html)) == len({r.test for r in one.results}) and html.count(
        '<svg class="hist"'
    ) == 2 * len(one.results)
    ids = set(re.findall(r'<details class="check[^"]*" id="(c\d+)"', html))
    assert set(re.findall(r'href="#(c\d+)"', heat)) <= ids


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [k for k, _ in attrs]


def test_hostile_test_ids_and_messages_stay_text(seeds: dict[str, Seed]) -> None:
    evil = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
    one = _file(seeds)
    rows = tuple(
        replace(
            r,
            test=r.test.replace("t.py::", f"t.py::{evil}"),
            tolerance=evil,
            worst=evil,
            provider=evil,
        )
        for r in one.results
    )
    tests = (*one.tests, TestOutcome(f"t.py::{evil}", "failed", message=evil))
    html = render([replace(one, results=rows, tests=tests)], [evil])
    parser = _Tags()
    parser.feed(html)
    assert "img" not in parser.tags and parser.tags.count("script") == 1  # ours, in the head
    assert not any(a.startswith("on") for a in parser.attrs)
    assert html.count("&lt;img src=x onerror=&quot;alert(1)&quot;&gt;") > len(rows)


def test_unfinished_run_and_empty_input() -> None:
    html = render([ResultsFile.running()])
    assert "did not finish" in html and UNFINISHED_RUN in html and "No check ran." in html
    assert "pytest-ortdiff report" in render([])


def test_write_html_atomically_self_contained(tmp_path: Path, seeds: dict[str, Seed]) -> None:
    target = tmp_path / "reports" / "ortdiff.html"
    write_html(target, [_file(seeds)])
    text = target.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")
    assert (
        not re.search(r"""(src|href)=["']?(https?:)?//""", text) and "@import" not in text
    )  # nothing fetched
    assert [p.name for p in target.parent.iterdir()] == ["ortdiff.html"]  # no temporary left behind


def test_five_hundred_checks_one_chart_each(seeds: dict[str, Seed]) -> None:
    row = _rows(seeds["float16"].budget, "")[0]
    rows = tuple(replace(row, test=f"t.py::test_many[CPU-float16-{i}]") for i in range(500))
    html = render([ResultsFile(rows)])
    assert html.count('<svg class="hist"') == 500 and len(_sections(html)) == 500
    assert len(html.encode()) < 500 * 5000  # a chart and its numbers: a few kB per check


def test_nan_mismatches_are_named_beside_the_chart() -> None:
    import numpy as np

    from pytest_ortdiff import compare

    expected = np.array([1.0, np.nan, 3.0, 4.0], dtype=np.float32)
    report = compare(expected, np.array([1.0, 2.0, 3.0, 4.5], dtype=np.float32))
    row = CheckRow(
        "t.py::test_nan[CPU-float32]", "CPU", "float32", report=report.to_dict(), outcome="failed"
    )
    section = _sections(render([ResultsFile((row,))]))["t.py::test_nan[CPU-float32]"]
    assert (
        f"<dt>NaN / Inf mismatches</dt><dd>{report.nan_mismatch} / {report.inf_mismatch}</dd>"
        in section
    )
    assert "count above every threshold" in section and report.nan_mismatch == 1
    bars = {
        float(_threshold(e)): int(e.findtext("title", "").split()[0])
        for e in _svg(section)
        if e.tag == "rect"
    }
    assert bars == {t: c for t, c in report.counts.items() if c}


def test_the_jobs_table_counts_every_skipped_test(seeds: dict[str, Seed]) -> None:
    """Jobs whose tests were skipped for 'no provider × dtype left' showed 'skipped 0' (only holes counted)."""
    one = _file(seeds)
    skipped = replace(one, tests=(*one.tests, TestOutcome("t.py::test_cuda_only", "skipped", None, None, "no provider × dtype left")))
    html = render([skipped], ["job A"])
    row = re.search(r"<tr><td>job A</td>(.*?)</tr>", html, re.S)
    assert row is not None
    assert re.findall(r"<td>([^<]*)</td>", row.group(1))[:3] == [f"{len(one.results):,}", f"{len(one.tests) + 1:,}", "1"]
