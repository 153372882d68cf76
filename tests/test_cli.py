"""`python -m pytest_ortdiff`: merge (CI jobs' --ortdiff-json files into one table: text, markdown,
--strict, --output, bad files), compare (a saved model file, torch evaluator vs onnxruntime) and
conformance (ONNX's node test suite through the evaluator: the table, exit status, unknown ops)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from pytest_ortdiff import conformance, models
from pytest_ortdiff.cli import main
from pytest_ortdiff.conformance import CaseResult
from pytest_ortdiff.providers import unavailable_reason

SEED_TEST = """
import pytest
from pytest_ortdiff import models

@pytest.mark.ortdiff(dtypes=["float32", "float16"])
def test_lnmm(ortdiff):
    model = models.layer_norm_matmul_add(dtype=ortdiff.dtype)
    feeds = models.random_feeds(model, dims={"a": 2, "b": 8, "c": 16}, seed=0, device=ortdiff.device)
    ortdiff.check(model, feeds)
"""


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_ortdiff", *args], capture_output=True, text=True, cwd=cwd, check=False)


def _row(test: str, dtype: str, passed: bool, max_abs: float = 1.5e-4) -> dict:
    """One result row as plugin.py writes it (suffix popped, test and outcome added)."""
    return {
        "provider": "CPU",
        "dtype": dtype,
        "max_abs": max_abs,
        "max_rel": 5.57e-07,
        "max_ulp": 3.0,
        "worst": "0 > 0.01 (0 %; allows 0 %)" if passed else "585,826 > 0.01 (24.83 %; allows 0.10 %)",
        "passed": passed,
        "tolerance": "budget >0.01: 0.10 %",
        "report": {"name": "", "n": 256, "max_abs": max_abs, "counts": {"0.0": 39}},
        "test": test,
        "outcome": "passed" if passed else "failed",
    }


def _write(path: Path, rows: list[dict], skips: list[dict] | None = None) -> Path:
    path.write_text(json.dumps({"results": rows, "skips": skips or []}, indent=1))
    return path


# -- merge ------------------------------------------------------------------------------------------


def test_merge_reports_written_by_pytest_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_seed=SEED_TEST)
    pytester.runpytest("--ort-dtypes=float32", "--ortdiff-json=jobs/cpu-float32.json").assert_outcomes(passed=1)
    pytester.runpytest("--ort-dtypes=float16", "--ortdiff-json=jobs/cpu-float16.json").assert_outcomes(passed=1)
    out = cli("merge", "jobs/cpu-float32.json", "jobs/cpu-float16.json", cwd=pytester.path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["test", "provider", "dtype", "max", "abs", "max", "rel", "worst", "budget", "line", "result"]
    # sorted by test id: float16 before float32
    assert lines[1].startswith("test_seed.py::test_lnmm[CPU-float16]  CPU       float16  ")
    assert lines[2].startswith("test_seed.py::test_lnmm[CPU-float32]  CPU       float32  ")
    assert lines[1].endswith("passed") and lines[2].endswith("passed")
    assert "2 check(s) from 2 file(s): 2 passed, 0 failed" in lines


def test_merge_markdown_strict_and_skips(tmp_path: Path) -> None:
    a = _write(tmp_path / "job-a.json", [_row("t.py::a[CPU-float32]", "float32", True)])
    b = _write(
        tmp_path / "job-b.json",
        [_row("t.py::a[CPU-float16]", "float16", False, max_abs=0.25)],
        skips=[{"provider": "CPU", "dtype": "bfloat16", "reason": "CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for MatMul(13)", "test": "t.py::a[CPU-bfloat16]"}],
    )
    out = cli("merge", str(a), str(b), "--markdown")
    assert out.returncode == 0  # a failed check is reported, not an error, without --strict
    lines = out.stdout.splitlines()
    assert lines[:4] == [
        "| test | provider | dtype | max abs | max rel | worst budget line | result |",
        "|---|---|---|---|---|---|---|",
        "| t.py::a[CPU-float16] | CPU | float16 | 0.25 | 5.57e-07 | 585,826 > 0.01 (24.83 %; allows 0.10 %) | failed |",
        "| t.py::a[CPU-float32] | CPU | float32 | 0.00015 | 5.57e-07 | 0 > 0.01 (0 %; allows 0 %) | passed |",
    ]
    assert "2 check(s) from 2 file(s): 1 passed, 1 failed" in lines
    assert "skipped: t.py::a[CPU-bfloat16]: CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for MatMul(13)" in lines
    strict = cli("merge", str(a), str(b), "--strict")
    assert strict.returncode == 1
    assert "1 passed, 1 failed" in strict.stdout
    assert cli("merge", str(a), "--strict").returncode == 0


def test_merge_label_from_file_and_output(tmp_path: Path) -> None:
    a = _write(tmp_path / "ort-1.20.json", [_row("t.py::a[CPU-float32]", "float32", True)])
    b = _write(tmp_path / "ort-1.21.json", [_row("t.py::a[CPU-float32]", "float32", True, max_abs=2e-4)])
    merged = tmp_path / "merged.json"
    out = cli("merge", str(a), str(b), "--label-from-file", "--output", str(merged))
    assert out.returncode == 0
    assert "t.py::a[CPU-float32] (ort-1.20)" in out.stdout
    assert "t.py::a[CPU-float32] (ort-1.21)" in out.stdout
    data = json.loads(merged.read_text())
    assert [r["test"] for r in data["results"]] == ["t.py::a[CPU-float32] (ort-1.20)", "t.py::a[CPU-float32] (ort-1.21)"]
    assert [r["max_abs"] for r in data["results"]] == [1.5e-4, 2e-4]
    assert data["skips"] == []


def test_merge_corrupt_json_is_a_clear_error(tmp_path: Path) -> None:
    good = _write(tmp_path / "good.json", [_row("t.py::a", "float32", True)])
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": [')  # a job killed while writing
    out = cli("merge", str(good), str(bad))
    assert out.returncode == 2
    assert out.stderr.startswith(f"error: {bad} is not a JSON report written by --ortdiff-json (Expecting value: line 1")
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[]", "has no 'results': is it a file written by --ortdiff-json?"),
        ('{"rows": []}', "has no 'results': is it a file written by --ortdiff-json?"),
        (None, "does not exist"),
    ],
    ids=["list", "no-results", "missing"],
)
def test_merge_wrong_files_exit_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "job.json"
    if content is not None:
        path.write_text(content)
    out = cli("merge", str(path))
    assert out.returncode == 2
    assert out.stderr == f"error: {path} {message}\n"
    assert out.stdout == ""


def test_no_command_is_a_usage_error() -> None:
    out = cli()
    assert out.returncode == 2
    assert "the following arguments are required: command" in out.stderr


# -- compare -------------------------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "lnmma.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="float32"), str(path))
    return path


def test_compare_prints_a_report(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["compare", str(model_file), "--dim", "a=2", "--dim", "b=8", "--dim", "c=16", "--provider", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"{model_file}: torch evaluator vs onnxruntime CPU float32, dims {{'a': 2, 'b': 8, 'c': 16}}, seed 0"
    assert lines[1] == "passed (atol=0.0001 rtol=0.0001)"
    assert lines[2] == "output 'Z'  float32[2x8x16]  n=256"
    assert lines[3].startswith("  max abs   ")
    assert "  outside atol=0.0001 rtol=0.0001: 0 (0 %)" in lines  # float32's default tolerance
    assert any(line.startswith("         0  ") for line in lines)  # the histogram


def test_compare_float16_model_uses_its_dtype(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "half.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="float16"), str(path))
    rc = main(["compare", str(path), "--dim", "a=1", "--dim", "b=4", "--dim", "c=8", "--seed", "3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.splitlines()[0].endswith("torch evaluator vs onnxruntime CPU float16, dims {'a': 1, 'b': 4, 'c': 8}, seed 3")
    assert out.splitlines()[2] == "output 'Z'  float16[1x4x8]  n=32"
    assert "  outside atol=0.01 rtol=0.01: 0 (0 %)" in out


def test_compare_through_python_m(model_file: Path) -> None:
    out = cli("compare", str(model_file), "--dim", "a=1", "--dim", "b=2", "--dim", "c=4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[2] == "output 'Z'  float32[1x2x4]  n=8"


def _bfloat16_file(tmp_path: Path) -> Path:
    path = tmp_path / "bf16.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="bfloat16"), str(path))
    return path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{model}"], "--dim"),
        (["{missing}", "--dim", "a=1"], "does not exist"),
        (["{model}", "--dim", "a", "--dim", "b=2", "--dim", "c=4"], "NAME=VALUE"),
        (["{model}", "--dim", "a=1", "--dim", "b=2", "--dim", "c=4", "--provider", "CUDA"], "CUDAExecutionProvider"),
        (["{bf16}", "--dim", "a=1", "--dim", "b=2", "--dim", "c=4"], "no bfloat16 kernel for"),
    ],
    ids=["no-dims", "missing-file", "bad-dim", "cuda-unavailable", "bf16-unsupported"],
)
def test_compare_bad_input_is_a_clear_error(
    tmp_path: Path, model_file: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    if "CUDA" in args and unavailable_reason("CUDA") is None:
        pytest.skip("CUDA is usable here")
    paths = {"model": str(model_file), "missing": str(tmp_path / "nope.onnx"), "bf16": str(_bfloat16_file(tmp_path))}
    argv = ["compare", *(a.format(**paths) for a in args)]
    try:
        rc = main(argv)
    except BaseException as exc:  # pytest's Skipped is a BaseException: it must fail this test, not skip it
        pytest.fail(f"{argv} raised {type(exc).__name__}: {exc}")
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ")
    assert message in err


# -- conformance -------------------------------------------------------------------------------------


@pytest.fixture
def suite(pytestconfig: pytest.Config) -> None:
    """ONNX's node cases, loaded once per process, from pytest's cache when tests/test_conformance.py put them there."""
    cache = getattr(pytestconfig, "cache", None)
    conformance.load_cases(cache.mkdir("ortdiff-conformance") if cache is not None else None)


@pytest.mark.usefixtures("suite")
def test_conformance_table_for_one_op(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["conformance", "--op", "Relu"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert lines[0].split() == ["op", "cases", "pass", "wrong", "unsupported", "no", "kernel", "error"]
    assert lines[2].split() == ["Relu", "2", "2", "0", "0", "0", "0"]  # test_relu, test_relu_expanded_ver18
    assert lines[4].split() == ["total", "2", "2", "0", "0", "0", "0"]
    assert "2 of 2 cases pass, 0 wrong, 0 unsupported, 0 without a kernel, 0 errors; 1 op with a kernel, 0 without" in lines
    assert lines[-1].endswith(" s, case generation included)")


@pytest.mark.usefixtures("suite")
def test_conformance_unknown_op_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--op", "Relux"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: no case matches --op Relux; Relux is not an op of the suite (did you mean Relu, PRelu, Selu?)\n"


def test_conformance_exits_1_on_a_wrong_case_unless_known(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    results = [
        CaseResult("test_made_up_relu", "Relu", "pass", ops=("Relu",)),
        CaseResult("test_made_up_softmax", "Softmax", "wrong", "output 'y': 1 of 4 values off", ("Softmax",)),
    ]
    monkeypatch.setattr(conformance, "run_cases", lambda **_: results)
    assert main(["conformance", "-v"]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 cases pass, 1 wrong, 0 unsupported, 0 without a kernel, 0 errors; 2 ops with a kernel, 0 without" in out
    assert out.split("\n\nwrong:\n")[1].startswith("  test_made_up_softmax [Softmax]: output 'y': 1 of 4 values off\n")
    monkeypatch.setitem(conformance.KNOWN_UNSUPPORTED, "test_made_up_softmax", "made up")
    assert main(["conformance"]) == 0
    assert "1 wrong (1 known)" in capsys.readouterr().out
    results.append(CaseResult("test_made_up_clip", "Clip", "error", "run: RuntimeError: boom", ("Clip",)))
    assert main(["conformance"]) == 1


def test_conformance_help_lists_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["conformance", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m pytest_ortdiff conformance [-h] [--op OP] [-k PATTERN] [-v]\n")
    assert "Exit status 1 when a case is wrong" in " ".join(out.split())
