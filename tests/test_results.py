"""Typed results and their JSON schema: rows survive to_dict/from_dict, a file of the first layout (no
"schema") still merges, an unknown or newer version is one error line; atomic writes leave no half file
and no temporary; one rule says which runtime is closer to the oracle; numbers format one way."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_ortdiff.numerics.formatting import g, pct, pct_frac, shortest, table
from pytest_ortdiff.numerics.results import (
    SCHEMA_VERSION,
    BaselineRow,
    CheckRow,
    ResultsFile,
    ResultsFileError,
    SkipRow,
    TestOutcome,
    closer_to_oracle,
    write_atomically,
)

ROW = CheckRow(
    test="t.py::a[CPU-float16] [fuzz]",
    provider="CPU",
    dtype="float16",
    max_abs=0.25,
    max_rel=1e-3,
    max_ulp=1.0,
    worst="5 > 0.01 (0.50 %)",
    passed=False,
    tolerance="atol=0.01 rtol=0.01",
    report={"n": 1000, "nan_mismatch": 0},
    outcome="failed",
    ran_on_ort=("Conv", "com.microsoft::FusedMatMul"),
)


@pytest.mark.parametrize(
    "item",
    [
        ROW,
        CheckRow("t.py::b", worst="no check ran", outcome="error"),
        SkipRow("CPU", "bfloat16", "CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for MatMul(13)", "t.py::c"),
        BaselineRow("logits", "created", "b/t.logits.npz", True, "t.py::d"),
        TestOutcome("t.py::e", "failed", "CPU", "float32", "ValueError: bad feeds"),
        TestOutcome("t.py::f", "xfailed"),
    ],
    ids=["check", "uncovered", "skip", "baseline", "outcome", "outcome-bare"],
)
def test_rows_survive_their_json_form(item: Any) -> None:
    assert type(item).from_dict(json.loads(json.dumps(item.to_dict()))) == item


def test_a_file_round_trips_with_its_schema_version(tmp_path: Path) -> None:
    data = ResultsFile((ROW,), (SkipRow("CPU", "bfloat16", "hole", "t.py::c"),), (TestOutcome("t.py::a[CPU-float16]", "failed", "CPU", "float16"),))
    path = tmp_path / "jobs" / "job.json"
    data.write(path)
    raw = json.loads(path.read_text())
    assert raw["schema"] == SCHEMA_VERSION == 3
    assert raw["results"][0]["ran_on_ort"] == ["Conv", "com.microsoft::FusedMatMul"]
    assert ResultsFile.read(path) == data
    assert [p.name for p in path.parent.iterdir()] == ["job.json"]  # no temporary left


def test_a_file_without_schema_reads_as_version_1(tmp_path: Path) -> None:
    # the first layout: no "schema", no "tests", no "ran_on_ort"; rows carry only what the plugin wrote then
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"results": [{"test": "t.py::a", "provider": "CPU", "dtype": "float32", "max_abs": 1e-4, "passed": True, "outcome": "passed"}], "skips": []}))
    old = ResultsFile.read(path)
    assert old.schema == 1 and old.tests == () and old.results[0].ran_on_ort == () and old.results[0].max_rel is None


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (4, "{path}: schema version 4 is newer than this pytest-ortdiff reads (1 to 3); upgrade pytest-ortdiff to merge it"),
        ("2.0", "{path}: unknown schema version '2.0' (this pytest-ortdiff reads versions 1 to 3)"),
    ],
    ids=["newer", "unknown"],
)
def test_merge_names_a_version_it_cannot_read(tmp_path: Path, cli: Callable[..., Any], schema: object, message: str) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"schema": schema, "results": []}))
    with pytest.raises(ResultsFileError, match="schema version"):
        ResultsFile.read(path)
    out = cli("merge", str(path))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == f"error: {message.format(path=path)}\n"


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_atomically(path, "old")

    def broken(f: Any) -> None:
        f.write(b"half of a new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, broken)
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"] and path.read_text() == "old"
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o644


def test_closer_to_the_oracle_is_one_rule() -> None:
    def runtime(ulp: float, off: int) -> Any:
        return SimpleNamespace(max_ulp=ulp, mismatches=off)

    assert closer_to_oracle(runtime(1, 5), runtime(2, 1)) == "onnxruntime"  # max ULP first
    assert closer_to_oracle(runtime(1, 5), runtime(1, 3)) == "torch"  # then elements off
    assert closer_to_oracle(runtime(1, 3), runtime(1, 3)) == "tie"


def test_numbers_format_one_way() -> None:
    assert [g(x) for x in (None, 0.0, -0.0, 1e-4, 0.000183, 1234.5, float("nan"), float("inf"))] == ["-", "0", "0", "0.0001", "0.000183", "1.23e+03", "nan", "inf"]
    assert g({"float16": 0.5, "float32": 1e-4}) == "{float16: 0.5, float32: 0.0001}"
    # shares: two decimals, two significant digits below 0.01 % (the report and the violations agree)
    assert [pct(c, 1_000_000) for c in (0, 1, 12, 334, 250_000)] == ["0 %", "0.0001 %", "0.0012 %", "0.03 %", "25.00 %"]
    assert pct_frac(0.001) == "0.10 %" and pct(3, 0) == "0 %"
    # a value in as few digits as read back as it in its dtype
    assert shortest(0.1, "float64") == "0.1" and shortest(float.fromhex("0x1.99999ap-4"), "float32") == "0.1"
    assert shortest(285.25, "float16") == "285.2" and shortest(2.0, "int64") == "2" and shortest(1.0, "bool") == "True"
    assert table(("a", "bb"), [("xyz", "1"), ("p", "")], indent="  ") == ["  a    bb", "  xyz  1", "  p"]


def test_an_incomplete_file_reads_as_an_error(tmp_path: Path) -> None:
    """Issue 12, item 3: the file a run writes when it starts fails `merge --strict`, even with its error
    row removed, and an unreadable "complete" is a malformed file."""
    path = tmp_path / "job.json"
    ResultsFile.running().write(path)
    back = ResultsFile.read(path)
    assert not back.complete and [(t.test, t.outcome) for t in back.tests] == [("pytest run (did not finish)", "error")]
    data = json.loads(path.read_text())
    data["tests"] = []
    path.write_text(json.dumps(data))
    assert [t.outcome for t in ResultsFile.read(path).tests] == ["error"]
    data["complete"] = "yes"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsFileError, match="'complete' is not true or false"):
        ResultsFile.read(path)
    assert ResultsFile().complete and ResultsFile.read(_written(tmp_path)).complete


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "done.json"
    ResultsFile(tests=(TestOutcome("t.py::a", "passed"),)).write(path)
    return path
