"""`merge --markdown` as a pull-request comment (issue 29 items 3 and 4): it stays under the limit it states
whatever the files hold, saying what it left out; and nothing from a job file forms a link, an image, a
reference definition, HTML, a mention, or breaks the table, as GitHub's renderer (cmark-gfm) reads it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_ortdiff.reports.matrix import MARKDOWN_LIMIT

HOSTILE = (
    "t.py::test_a[[x]: https://evil.example/x.png]",  # a reference definition...
    "t.py::test_b[![approved][x] [click to approve][x] [x]]",  # ...used as an image, a link and a shortcut
    "t.py::test_c[<img src=x onerror=alert(1)> &lt;b&gt; `code` **bold** ~~gone~~]",
    "t.py::test_d[https://evil.example www.evil.example a@evil.example @octocat #1]",
    "t.py::test_e[x](https://evil.example) | injected | column | \\|",
)


def _row(test: str, dtype: str, passed: bool, message: str = "") -> dict[str, Any]:
    return {
        "test": test,
        "provider": "CPU",
        "dtype": dtype,
        "max_abs": 0.25 if not passed else 1e-6,
        "max_rel": 1e-3,
        "max_ulp": 300.0,
        "worst": message or ("585,826 > 0.01 (24.83 %; allows 0.10 %)" if not passed else "0 > 0.01 (0 %)"),
        "passed": passed,
        "tolerance": "budget >0.01: 0.10 %",
        "report": {"n": 256, "max_abs": 0.25, "counts": {"0.0": 39}},
        "outcome": "passed" if passed else "failed",
    }


def _job(path: Path, rows: list[dict[str, Any]], tests: list[dict[str, Any]] | None = None, skips: list[dict[str, Any]] | None = None) -> Path:
    path.write_text(json.dumps({"results": rows, "tests": tests or [], "skips": skips or []}))
    return path


def _hostile_files(tmp_path: Path) -> list[Path]:
    rows_a = [_row(f"{t}-CPU-float32", "float32", i % 2 == 0, message=t) for i, t in enumerate(HOSTILE)]
    rows_b = [_row(f"{t}-CPU-float16", "float16", False, message=t) for t in HOSTILE]
    outside = [{"test": t, "outcome": "error", "message": t} for t in HOSTILE]
    skips = [{"provider": "CPU", "dtype": "bfloat16", "reason": t, "test": f"{t}-CPU-bfloat16"} for t in HOSTILE]
    return [_job(tmp_path / "a.json", rows_a, outside), _job(tmp_path / "b.json", rows_b, skips=skips)]


@pytest.mark.parametrize("form", [["--matrix"], ["--rows"]], ids=["matrix", "rows"])
def test_markdown_forms_no_link_image_html_or_column_from_a_job_file(tmp_path: Path, cli: Callable[..., Any], form: list[str]) -> None:
    out = cli("merge", *map(str, _hostile_files(tmp_path)), "--markdown", *form)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # the escaped text, precisely: a reference definition and its uses are text, and so are tags
    assert "t.py::test_a\\[\\[x]: https\\://evil.example/x.png]" in text
    assert "!\\[approved]\\[x] \\[click to approve]\\[x] \\[x]" in text
    assert "&lt;img src=x onerror=alert(1)&gt; &amp;lt;b&amp;gt; \\`code\\` \\*\\*bold\\*\\* \\~\\~gone\\~\\~" in text
    assert "https\\://evil.example www\\.evil.example a@\u2060evil.example @\u2060octocat \\#1" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    columns = {line.replace("\\|", "").count("|") for line in table}
    assert len(columns) == 1, table  # no row has a column more than the header
    cmarkgfm = pytest.importorskip("cmarkgfm")  # (GitHub's renderer, where installed: the `test` extra has it)
    from cmarkgfm.cmark import Options

    html = cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE)
    assert "evil" in html and "<a " not in html and "<img" not in html and "mailto" not in html, html
    # the only tags are the comment's own (the table, the details, the lists, emphasis of our notes)
    assert set(re.findall(r"</?([a-z0-9]+)", html)) <= {"p", "table", "thead", "tbody", "tr", "th", "td", "details", "summary", "ul", "li", "strong", "em", "code"}, html
    assert "onerror" not in re.sub(r"&lt;img src=x onerror", "", html)


def _many_failures(tmp_path: Path, tests: int, jobs: int) -> list[Path]:
    files = []
    for j in range(jobs):
        rows = [_row(f"tests/test_models.py::test_model_{i:04d}[CPU-float{16 if j % 2 else 32}-seed{j}]", f"float{16 if j % 2 else 32}", False) for i in range(tests)]
        for r in rows:
            r["provider"] = ["CPU", "CUDA", "TensorRT"][j]
            r["test"] = r["test"].replace("CPU-", f"{r['provider']}-")
        files.append(_job(tmp_path / f"job{j}.json", rows))
    return files


@pytest.mark.parametrize("form", [["--matrix"], ["--rows"]], ids=["matrix", "rows"])
def test_markdown_of_2000_failing_tests_times_3_jobs_stays_under_its_limit(tmp_path: Path, cli: Callable[..., Any], form: list[str]) -> None:
    """236,704 characters before (every failing row stayed); GitHub refuses a comment over 65,536."""
    out = cli("merge", *map(str, _many_failures(tmp_path, 2000, 3)), "--markdown", *form)
    assert out.returncode == 0, out.stderr
    assert MARKDOWN_LIMIT == 60_000 and len(out.stdout) <= MARKDOWN_LIMIT, len(out.stdout)
    note = re.search(r"_(?:[^_]|\\_)*not shown(?:[^_]|\\_)*_", out.stdout)
    assert note is not None, out.stdout[-2000:]
    assert "to stay under 60,000 characters" in note.group() and ("--html" in note.group())
    assert "6000 check(s) from 3 file(s): 0 passed, 6000 failed" in out.stdout


def test_markdown_of_one_enormous_test_id_stays_under_its_limit(tmp_path: Path, cli: Callable[..., Any]) -> None:
    huge = "t.py::test_x[" + "y" * 200_000 + "]"
    rows = [_row(huge + "-CPU-float32", "float32", False, message="z" * 100_000), _row("t.py::test_ok[CPU-float16]", "float16", True)]
    for form in (["--matrix"], ["--rows"]):
        out = cli("merge", str(_job(tmp_path / "a.json", rows)), "--markdown", *form)
        assert out.returncode == 0 and len(out.stdout) <= MARKDOWN_LIMIT, (form, len(out.stdout))
        assert "t.py::test_x\\[yyyy" in out.stdout and "…" in out.stdout
