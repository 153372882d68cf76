"""The CI matrix (pytest_ortdiff.reports.matrix) and `merge` over it: test ids without their provider/dtype part,
three fake jobs of two onnxruntime versions pivoted into one matrix with a conflict cell (the markdown pinned),
`--strict` on failures and on conflicts, files of schema 2 still merged, text fitted to a width, job labels."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from pytest_ortdiff.cli import main
from pytest_ortdiff.numerics.results import BaselineRow, Environment, ResultsFile
from pytest_ortdiff.reports.matrix import Column, elide, job_labels, pivot, test_key


@pytest.mark.parametrize(
    ("nodeid", "key"),
    [
        ("t.py::test_x[CPU-float16]", "t.py::test_x"),
        ("t.py::test_y[CPU-float32-7]", "t.py::test_y[7]"),
        ("t.py::test_y[7-CUDA-bfloat16]", "t.py::test_y[7]"),
        ("t.py::T::test_z[a-TensorRT-float16-b]", "t.py::T::test_z[a-b]"),
        ("t.py::test_plain", "t.py::test_plain"),
        ("t.py::test_w[CPUs-float32]", "t.py::test_w[CPUs-float32]"),  # not a case id: kept whole
    ],
)
def test_key_drops_the_provider_dtype_part(nodeid: str, key: str) -> None:
    assert test_key(nodeid) == key


# -- three fake CI jobs ----------------------------------------------------------------------------------


def _env(ort: str, dtypes: list[str]) -> dict[str, Any]:
    return {
        "onnxruntime": ort,
        "torch": "2.13.0",
        "onnx": "1.23.0",
        "numpy": "2.3.1",
        "python": "3.11.9",
        "platform": "Linux x86_64",
        "device": "AMD EPYC 7B13",
        "providers": ["CPU"],
        "dtypes": dtypes,
    }


def _row(test: str, dtype: str, max_abs: float, ulp: float, passed: bool, worst: str) -> dict[str, Any]:
    return {
        "test": test,
        "provider": "CPU",
        "dtype": dtype,
        "max_abs": max_abs,
        "max_rel": max_abs / 4,
        "max_ulp": ulp,
        "worst": worst,
        "passed": passed,
        "tolerance": "budget >0.01: 0.10 %",
        "report": None,
        "outcome": "passed" if passed else "failed",
        "ran_on_ort": [],
    }


def _test(test: str, outcome: str, dtype: str | None = "float32", message: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"test": test, "outcome": outcome}
    if dtype:
        out |= {"provider": "CPU", "dtype": dtype}
    return out | ({"message": message} if message else {})


LNMM32, LNMM16, GELU16 = "t.py::test_lnmm[CPU-float32]", "t.py::test_lnmm[CPU-float16]", "t.py::test_gelu[CPU-float16-7]"
# onnxruntime 1.31.0, float32: passes
JOB_A = {
    "schema": 3,
    "environment": _env("1.31.0", ["float32"]),
    "results": [_row(LNMM32, "float32", 1.2e-06, 3.0, True, "0 > 0.01 (0 %; allows 0.10 %)")],
    "tests": [_test(LNMM32, "passed")],
}
# onnxruntime 1.31.0 too, float32 and float16: float32 disagrees with job A (a conflict), float16 fails, gelu is a hole
JOB_B = {
    "schema": 3,
    "environment": _env("1.31.0", ["float32", "float16"]),
    "results": [
        _row(LNMM32, "float32", 0.031, 2.6e5, False, "12 > 0.01 (2.34 %; allows 0.10 %)"),
        _row(LNMM16, "float16", 0.25, 1.2e4, False, "585 > 0.01 (57.13 %; allows 0.10 %)"),
    ],
    "skips": [{"provider": "CPU", "dtype": "float16", "reason": "CPU-float16: onnxruntime CPUExecutionProvider has no float16 kernel for Gelu(20)", "test": GELU16}],
    "tests": [_test(LNMM32, "failed", message="OrtDiffFailure: tolerance broken"), _test(LNMM16, "failed", "float16"), _test(GELU16, "skipped", "float16")],
}
# onnxruntime 1.32.0, float16: lnmm passes (two checks fold into one cell), gelu fails on a missing baseline, a plain test fails
JOB_C = {
    "schema": 3,
    "environment": _env("1.32.0", ["float16"]),
    "results": [
        _row(LNMM16, "float16", 0.00391, 1.0, True, "47 > 0.001 (18.36 %; allows 25 %)"),
        _row(LNMM16 + " [baseline out]", "float16", 0.0, 0.0, True, "exact"),
        _row(GELU16, "float16", 0.000977, 2.0, True, "3 > 0.0001 (1.20 %; allows 5 %)"),
    ],
    "tests": [
        _test(LNMM16, "passed", "float16"),
        _test(GELU16, "failed", "float16", "OrtDiffFailure: ortdiff: no baseline 'gelu'"),
        _test("t.py::test_plain", "failed", None, "assert 1 == 2"),
    ],
    "baselines": [{"name": "gelu", "action": "missing", "path": "b/gelu.npz", "passed": False, "test": GELU16, "max_abs": None, "environment_changes": []}],
}

MARKDOWN = """\
**ortdiff**: 2 tests × 3 cases from 3 jobs, 5 cells: 1 passed, 2 failed, 1 skipped, 1 conflict

| test | CPU float32 ort 1.31.0 | CPU float16 ort 1.31.0 | CPU float16 ort 1.32.0 |
|---|---|---|---|
| t.py::test_gelu\\[7] | - | ⏭️ skipped | ❌ 0.000977 (2 ulp) |
| t.py::test_lnmm | ⚠️ ✅ 1.2e-06 (3 ulp) / ❌ 0.031 (2.6e+05 ulp) | ❌ 0.25 (1.2e+04 ulp) | ✅ 0.00391 (1 ulp) |

✅ passed · ❌ failed · 💥 error · ⏭️ skipped · 🟡 failed as expected (xfail) · ⚠️ jobs disagree; numbers: max abs error (worst ULP error at the output's scale)

<details><summary>❌ t.py::test_gelu[7] · CPU float16 ort 1.32.0: baseline 'gelu' missing: OrtDiffFailure: ortdiff: no baseline 'gelu'</summary>

- t.py::test_gelu\\[CPU-float16-7] (job C): passed, max abs 0.000977, max rel 0.000244, max ULP 2; 3 &gt; 0.0001 (1.20 %; allows 5 %); tolerance budget &gt;0.01: 0.10 %
- t.py::test_gelu\\[CPU-float16-7] (job C): failed: OrtDiffFailure: ortdiff: no baseline 'gelu'

</details>

<details><summary>⚠️ t.py::test_lnmm · CPU float32 ort 1.31.0: 2 different results</summary>

- ✅ ok 1.2e-06 (3 ulp) (job A)
- t.py::test_lnmm\\[CPU-float32] (job A): passed, max abs 1.2e-06, max rel 3e-07, max ULP 3; 0 &gt; 0.01 (0 %; allows 0.10 %); tolerance budget &gt;0.01: 0.10 %
- ❌ FAIL 0.031 (2.6e+05 ulp) (job B): 12 &gt; 0.01 (2.34 %; allows 0.10 %)
- t.py::test_lnmm\\[CPU-float32] (job B): failed, max abs 0.031, max rel 0.00775, max ULP 2.6e+05; 12 &gt; 0.01 (2.34 %; allows 0.10 %); tolerance budget &gt;0.01: 0.10 %

</details>

<details><summary>❌ t.py::test_lnmm · CPU float16 ort 1.31.0: 585 &gt; 0.01 (57.13 %; allows 0.10 %)</summary>

- t.py::test_lnmm\\[CPU-float16] (job B): failed, max abs 0.25, max rel 0.0625, max ULP 1.2e+04; 585 &gt; 0.01 (57.13 %; allows 0.10 %); tolerance budget &gt;0.01: 0.10 %

</details>

<details><summary>⏭️ 1 skipped cell</summary>

- t.py::test_gelu\\[7] · CPU float16 ort 1.31.0: CPU-float16: onnxruntime CPUExecutionProvider has no float16 kernel for Gelu(20)

</details>

Failed outside the matrix:
- ❌ t.py::test_plain (job C): assert 1 == 2

Jobs:
- job A: **CPU float32 · ort 1.31.0 · torch 2.13.0**: onnxruntime 1.31.0, torch 2.13.0, onnx 1.23.0, numpy 2.3.1, python 3.11.9, Linux x86_64, AMD EPYC 7B13
- job B: **CPU float32,float16 · ort 1.31.0 · torch 2.13.0**: onnxruntime 1.31.0, torch 2.13.0, onnx 1.23.0, numpy 2.3.1, python 3.11.9, Linux x86_64, AMD EPYC 7B13
- job C: **CPU float16 · ort 1.32.0 · torch 2.13.0**: onnxruntime 1.32.0, torch 2.13.0, onnx 1.23.0, numpy 2.3.1, python 3.11.9, Linux x86_64, AMD EPYC 7B13

6 check(s) from 3 file(s): 4 passed, 2 failed
7 test(s): 2 passed, 4 failed, 0 error(s), 1 skipped
1 conflicting cell(s): jobs report one test and case differently (see the matrix)
"""


def _jobs(tmp_path: Path, *jobs: tuple[str, dict[str, Any]]) -> list[str]:
    paths = []
    for name, data in jobs:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        paths.append(str(path))
    return paths


def _merge(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["merge", *argv])
    out, err = capsys.readouterr()
    assert err == ""
    return rc, out


def test_three_jobs_merge_into_one_markdown_matrix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two onnxruntime versions split the float16 column; jobs A and B report CPU float32 differently: a
    conflict cell holding both results; lnmm's two float16 checks (one a baseline) fold into one cell; gelu
    failed on a missing baseline after its check passed: failed, saying so."""
    files = _jobs(tmp_path, ("cpu-a", JOB_A), ("cpu-b", JOB_B), ("cpu-c", JOB_C))
    assert _merge(capsys, *files, "--markdown") == (0, MARKDOWN)
    assert _merge(capsys, *files, "--markdown", "--strict") == (1, MARKDOWN)
    rc, text = _merge(capsys, *files, "--width", "100")
    assert rc == 0
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    headers = [line for line in lines if line.startswith("test  ")]  # (a second block holds the columns that do not fit)
    assert [h.split()[1:] for h in headers] == [["CPU", "float32", "ort", "1.31.0", "CPU", "float16", "ort", "1.31.0"], ["CPU", "float16", "ort", "1.32.0"]]
    assert any(line.startswith("CONFLICT  t.py::test_lnmm · CPU float32 ort 1.31.0: job A: ok 1.2e-06 (3 ulp); job B: FAIL 0.031") for line in lines), text


def test_strict_fails_on_a_conflict_alone_and_agreeing_jobs_are_no_conflict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    same = copy.deepcopy(JOB_A)
    other = copy.deepcopy(JOB_A)
    other["results"][0]["max_abs"] = 2.4e-06  # passes too, with other numbers
    rc = main(["merge", *_jobs(tmp_path, ("a", JOB_A), ("same", same)), "--matrix", "--strict"])
    out, err = capsys.readouterr()
    assert rc == 0 and "CONFLICT  " not in out and "conflicting" not in out
    assert err.startswith("note: ") and "hold the same report (identical bytes)" in err  # (agreeing to the byte: said)
    matrix = pivot([ResultsFile.from_dict(JOB_A), ResultsFile.from_dict(same)], ["a", "same"])
    cell = matrix.cell("t.py::test_lnmm", Column("CPU", "float32"))
    assert cell is not None and (cell.verdict, cell.jobs, len(cell.rows)) == ("passed", ("a", "same"), 2)
    rc, out = _merge(capsys, *_jobs(tmp_path, ("a", JOB_A), ("other", other)), "--matrix", "--strict", "--label", "first", "--label", "second")
    assert rc == 1
    assert "CONFLICT  t.py::test_lnmm · CPU float32: job A: ok 1.2e-06 (3 ulp); job B: ok 2.4e-06 (3 ulp)" in out
    assert "  job A  first: onnxruntime 1.31.0" in out and "1 conflicting cell(s)" in out
    assert main(["merge", *_jobs(tmp_path, ("a", JOB_A)), "--label", "x", "--label", "y"]) == 2
    assert "--label given 2 time(s) for 1 file(s)" in capsys.readouterr().err


def test_a_schema_2_file_merges_with_a_schema_3_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = {"schema": 2, "complete": True, "results": [_row(LNMM16, "float16", 0.004, 1.0, True, "exact")], "skips": [], "tests": [_test(LNMM16, "passed", "float16")]}
    data = ResultsFile.from_dict(old)
    assert data.environment == Environment() and data.baselines == ()
    rc, out = _merge(capsys, *_jobs(tmp_path, ("old-job", old), ("new-job", JOB_A)), "--strict")
    assert rc == 0
    lines = out.splitlines()
    assert lines[:3] == ["test         CPU float32         CPU float16", "t.py", "  test_lnmm  ok 1.2e-06 (3 ulp)  ok 0.004 (1 ulp)"]
    assert "  job A  old-job: environment not recorded (a file of an older pytest-ortdiff)" in lines
    assert "  job B  CPU float32 · ort 1.31.0 · torch 2.13.0: onnxruntime 1.31.0, torch 2.13.0, onnx 1.23.0, numpy 2.3.1, python 3.11.9, Linux x86_64, AMD EPYC 7B13" in lines


def test_text_matrix_fits_narrow_widths_keeping_parametrize_ids() -> None:
    long = "tests/models/transformers/encoders/test_bert_encoder_layer_against_onnxruntime.py::test_encoder"
    rows = [_row(f"{long}[CPU-{d}-{n}]", d, 1e-3, 4.0, True, "exact") for d in ("float32", "float16", "bfloat16") for n in ("seq128", "seq512")]
    matrix = pivot([ResultsFile.from_dict({"results": rows})])
    assert matrix.tests == (f"{long}[seq128]", f"{long}[seq512]") and matrix.cases == 3
    for width in (60, 80, 120):
        lines = matrix.render_text(width).splitlines()
        assert max(map(len, lines)) <= width, (width, lines)
        assert sum("[seq128]" in line for line in lines) >= 1 and sum("[seq512]" in line for line in lines) >= 1
    short = elide(f"{long}[CPU-float16]", 60)
    assert len(short) == 60 and short.endswith("::test_encoder[CPU-float16]") and short.startswith("tests/")


def test_job_labels_and_the_environment_round_trip() -> None:
    gpu = Environment(onnxruntime="1.32.0", torch="2.13.0+cu128", device="NVIDIA H100 80GB HBM3", providers=("CUDA",), dtypes=("float16",))
    assert gpu.label == "CUDA float16 · NVIDIA H100 80GB HBM3 · ort 1.32.0 · torch 2.13.0+cu128"
    assert Environment.from_dict(json.loads(json.dumps(gpu.to_dict()))) == gpu
    assert Environment.from_dict({"onnxruntime": 1, "providers": "CPU", "unknown": "x"}) == Environment()  # tolerant, never a verdict
    here = Environment.current(("CPU",), ("float32",))
    assert here.label.startswith("CPU float32 · ort ") and here.onnxruntime == __import__("onnxruntime").__version__
    cpu = ResultsFile(environment=Environment(onnxruntime="1.32.0", providers=("CPU",), dtypes=("float32",)))
    assert job_labels([cpu, cpu, ResultsFile()], ["a", "b", "c"]) == ["CPU float32 · ort 1.32.0 (a)", "CPU float32 · ort 1.32.0 (b)", "c"]


def test_a_job_that_skipped_its_cuda_cases_is_labelled_by_what_ran() -> None:
    """A CPU machine running --ort-providers=CPU,CUDA with --ort-skip-unavailable skips its CUDA cases: its
    label names CPU only, and never shows the CPU's model as if it were a GPU."""
    from pytest_ortdiff.numerics.results import TestOutcome
    from pytest_ortdiff.reports.matrix import ran_environment

    env = Environment(onnxruntime="1.32.0", device="AMD EPYC 7B13", providers=("CPU", "CUDA"), dtypes=("float32",))
    ran = [TestOutcome("t.py::test_x[CPU-float32]", "passed", "CPU", "float32")]
    skipped = [TestOutcome("t.py::test_x[CUDA-float32]", "skipped", "CUDA", "float32")]
    job = ResultsFile(environment=env, tests=tuple(ran + skipped))
    assert ran_environment(job).providers == ("CPU",)
    assert job_labels([job]) == ["CPU float32 · ort 1.32.0"]
    only_skips = ResultsFile(environment=env, tests=tuple(skipped))
    assert job_labels([only_skips]) == ["CUDA float32 · AMD EPYC 7B13 · ort 1.32.0"]  # (what it was asked to run)


def test_baseline_rows_carry_drift_and_read_old_rows() -> None:
    row = BaselineRow("out", "drift", "b/out.npz", False, "t.py::a[CPU-float32]", 0.0039, (("onnxruntime", "1.31.0", "1.32.0"),), "drifted")
    assert BaselineRow.from_dict(json.loads(json.dumps(row.to_dict()))) == row
    old = BaselineRow.from_dict({"name": "out", "action": "unchanged", "path": "b/out.npz", "passed": True})
    assert (old.max_abs, old.env_changes, old.message) == (None, (), None)


@pytest.mark.skipif(importlib.util.find_spec("pytest_ortdiff.reports.htmlreport") is None, reason="pytest_ortdiff.reports.htmlreport (merge --html's renderer) is not in this checkout")
def test_merge_html_writes_the_report_of_every_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "site" / "ortdiff.html"
    rc, _ = _merge(capsys, *_jobs(tmp_path, ("cpu-a", JOB_A), ("cpu-b", JOB_B), ("cpu-c", JOB_C)), "--html", str(out), "--label-from-file")
    html = out.read_text()
    assert rc == 0 and "cpu-b" in html and "test_lnmm" in html  # (what it shows: tests/test_htmlreport.py)


def test_xdist_group_suffix_is_not_part_of_the_test() -> None:
    """`--dist loadgroup` appends `@group` to the ids of grouped tests (the plugin groups GPU cases)."""
    from pytest_ortdiff.reports.matrix import test_key

    assert test_key("t.py::test_x[CUDA-float16]@ortdiff-gpu") == "t.py::test_x"
    assert test_key("t.py::test_y[CUDA-float32-7]@ortdiff-gpu") == "t.py::test_y[7]"


def test_merge_never_writes_over_a_file_that_is_not_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """merge --output/--html as pytest's --ortdiff-json/--ortdiff-html: a path holding something else (a test
    module given by mistake) is refused and kept byte for byte; our own report there is replaced."""
    jobs = _jobs(tmp_path, ("cpu-a", JOB_A))
    module = tmp_path / "test_models.py"
    module.write_text("def test_x():\n    pass\n")
    for flag in ("--output", "--html"):
        rc = main(["merge", *jobs, flag, str(module)])
        err = capsys.readouterr().err
        assert rc == 2 and module.read_text() == "def test_x():\n    pass\n"
    assert f"error: --html {module}: is not a report written by pytest-ortdiff, so it is not overwritten" in err
    out_json, out_html = tmp_path / "merged.json", tmp_path / "merged.html"
    for _ in range(2):  # (the second time over the first's own reports)
        rc, _ = _merge(capsys, *jobs, "--output", str(out_json), "--html", str(out_html))
        assert rc == 0 and json.loads(out_json.read_text())["results"] and "<!DOCTYPE html>" in out_html.read_text()
