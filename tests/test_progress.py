"""Progress bars: drawn on a terminal (or when forced), silent in CI, in xdist workers, under -q and when
output is piped; inside a test the bar reaches the terminal past pytest's capture."""

from __future__ import annotations

import io

import pytest

from pytest_ortdiff import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("CI", "PYTEST_XDIST_WORKER", "ORTDIFF_PROGRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(progress, "_stream", None)
    monkeypatch.setattr(progress, "_allowed", None)


def _draw(total: int = 60, **kw: object) -> str:
    out = _Tty()
    progress.configure(out, None)
    with progress.bar(total, "conformance", unit="case", **kw) as shown:  # type: ignore[arg-type]
        for _ in range(total):
            shown.update()
    return out.getvalue()


def test_a_terminal_gets_a_bar() -> None:
    text = _draw()
    assert "conformance" in text and "/60 " in text


@pytest.mark.parametrize("var", ["CI", "PYTEST_XDIST_WORKER"])
def test_ci_and_xdist_workers_are_silent(monkeypatch: pytest.MonkeyPatch, var: str) -> None:
    monkeypatch.setenv(var, "1")
    assert _draw() == ""


def test_short_work_and_pipes_are_silent() -> None:
    assert _draw(10, min_total=50) == ""
    piped = io.StringIO()  # not a terminal
    progress.configure(piped, None)
    with progress.bar(100, "x") as shown:
        shown.update(100)
    assert piped.getvalue() == ""


def test_plugin_says_no_and_the_environment_forces(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _Tty()
    progress.configure(out, False)  # pytest -q
    with progress.bar(100, "x") as shown:
        shown.update(100)
    assert out.getvalue() == ""
    monkeypatch.setenv("ORTDIFF_PROGRESS", "1")
    with progress.bar(100, "x") as shown:
        shown.update(100)
    assert "/100 " in out.getvalue()
    monkeypatch.setenv("ORTDIFF_PROGRESS", "0")
    assert _draw() == ""


_BLAME_TEST = """
from pytest_ortdiff import models, progress
from pytest_ortdiff import blame

progress.BLAME_MIN_NODES = 1  # a tiny graph, as if it were a large one

def test_blame():
    model = models.layer_norm_matmul_add(dtype="float32")
    feeds = models.random_feeds(model, dims={"a": 1, "b": 4, "c": 8}, seed=0)
    assert len(blame(model, feeds).rows) == 3
"""


@pytest.mark.parametrize("forced", [True, False])
def test_blame_bar_reaches_the_terminal_past_capture(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, forced: bool) -> None:
    """Inside a test (output captured), the bar is drawn on pytest's terminal; a run whose output is not a
    terminal (this subprocess's is a pipe) shows none unless forced."""
    if forced:
        monkeypatch.setenv("ORTDIFF_PROGRESS", "1")
    pytester.makepyfile(test_b=_BLAME_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert ("ortdiff blame" in result.stdout.str()) is forced


def test_long_fuzz_run_counts_its_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fuzz run of 50 examples or more draws a bar counting them (forced here: output is not a terminal)."""
    from pytest_ortdiff import Checker, models
    from pytest_ortdiff.analyses.fuzz import fuzz

    out = _Tty()
    progress.configure(out, None)
    monkeypatch.setenv("ORTDIFF_PROGRESS", "1")
    result = fuzz(Checker("CPU", "float32"), models.layer_norm_matmul_add, dims={"a": (1, 2), "b": (1, 2), "c": (1, 8)}, max_examples=50)
    assert "ortdiff fuzz" in out.getvalue() and "/50 " in out.getvalue()
    assert result.examples >= 1
