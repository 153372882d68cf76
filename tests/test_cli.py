"""`python -m pytest_ortdiff`: merge (CI jobs' --ortdiff-json files into one table: text, markdown,
--strict on failed checks and failed tests, --output, bad files and rows), compare (a saved model file,
torch evaluator vs onnxruntime: its dtype, --ort-kernel, one-line errors for bad models and arguments),
demo (pytest's arguments passed through) and conformance (ONNX's node test suite through the evaluator:
the table, exit status, unknown ops)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_ortdiff import conformance, models
from pytest_ortdiff.cli import _model_dtype, main
from pytest_ortdiff.conformance import CaseResult
from pytest_ortdiff.runtimes.providers import unavailable_reason


def _report_lines(text: str) -> list[str]:
    """The command's lines without onnxruntime 1.31's note that it read the model's IR version as an older one
    (onnx 1.23 writes IR 14; every model of these tests needs less)."""
    return [line for line in text.splitlines() if not line.startswith("note: IR version ")]

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


def test_merge_reports_written_by_pytest_runs(pytester: pytest.Pytester, seed_test: Callable[..., str], cli: Callable[..., Any]) -> None:
    pytester.makepyfile(test_seed=seed_test('dtypes=["float32", "float16"]', dims='{"a": 2, "b": 8, "c": 16}'))
    pytester.runpytest("--ort-dtypes=float32", "--ortdiff-json=jobs/cpu-float32.json").assert_outcomes(passed=1)
    pytester.runpytest("--ort-dtypes=float16", "--ortdiff-json=jobs/cpu-float16.json").assert_outcomes(passed=1)
    out = cli("merge", "jobs/cpu-float32.json", "jobs/cpu-float16.json", "--rows", cwd=pytester.path)  # (two cases: the matrix without --rows)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["test", "provider", "dtype", "max", "abs", "max", "rel", "max", "ulp", "worst", "budget", "line", "result"]
    # sorted by test id: float16 before float32
    assert lines[1].startswith("test_seed.py::test_lnmm[CPU-float16]  CPU       float16  ")
    assert lines[2].startswith("test_seed.py::test_lnmm[CPU-float32]  CPU       float32  ")
    assert lines[1].endswith("passed") and lines[2].endswith("passed")
    assert "2 check(s) from 2 file(s): 2 passed, 0 failed" in lines


def test_merge_runs_without_pytest_torch_or_onnx(tmp_path: Path) -> None:
    """`tox -e merge` merges the jobs' files from the source tree with numpy alone: merge, --output and --html
    import neither pytest (the plugin's layer), nor torch, onnx or onnxruntime."""
    a = _write(tmp_path / "job-a.json", [_row("t.py::a[CPU-float32]", "float32", True)])
    b = _write(tmp_path / "job-b.json", [_row("t.py::a[CPU-float16]", "float16", False, max_abs=0.25)])
    code = (
        "import sys\n"
        "for name in ('pytest', '_pytest', 'torch', 'onnx', 'onnxruntime'):\n"
        "    sys.modules[name] = None  # (an import of it raises ImportError)\n"
        "from pytest_ortdiff.cli import main\n"
        f"sys.exit(main(['merge', '--strict', '--markdown', '--output', {str(tmp_path / 'all.json')!r}, '--html', {str(tmp_path / 'all.html')!r}, {str(a)!r}, {str(b)!r}]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stderr  # (--strict: one check failed)
    assert "1 passed, 1 failed" in out.stdout and out.stderr == ""
    assert (tmp_path / "all.html").read_text().startswith("<!DOCTYPE html>") and "results" in json.loads((tmp_path / "all.json").read_text())


def test_merge_markdown_strict_and_skips(tmp_path: Path, cli: Callable[..., Any]) -> None:
    a = _write(tmp_path / "job-a.json", [_row("t.py::a[CPU-float32]", "float32", True)])
    b = _write(
        tmp_path / "job-b.json",
        [_row("t.py::a[CPU-float16]", "float16", False, max_abs=0.25)],
        skips=[{"provider": "CPU", "dtype": "bfloat16", "reason": "CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for MatMul(13)", "test": "t.py::a[CPU-bfloat16]"}],
    )
    out = cli("merge", str(a), str(b), "--markdown", "--rows")  # (two cases: the matrix without --rows)
    assert out.returncode == 0  # a failed check is reported, not an error, without --strict
    lines = out.stdout.splitlines()
    assert lines[:4] == [
        "| test | provider | dtype | max abs | max rel | max ulp | worst budget line | result |",
        "|---|---|---|---|---|---|---|---|",
        "| t.py::a\\[CPU-float16] | CPU | float16 | 0.25 | 5.57e-07 | 3 | 585,826 &gt; 0.01 (24.83 %; allows 0.10 %) | failed |",
        "| t.py::a\\[CPU-float32] | CPU | float32 | 0.00015 | 5.57e-07 | 3 | 0 &gt; 0.01 (0 %; allows 0 %) | passed |",
    ]
    assert "2 check(s) from 2 file(s): 1 passed, 1 failed" in lines
    assert "- skipped: t.py::a\\[CPU-bfloat16]: CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for MatMul(13)" in lines
    strict = cli("merge", str(a), str(b), "--strict")
    assert strict.returncode == 1
    assert "1 passed, 1 failed" in strict.stdout
    assert cli("merge", str(a), "--strict").returncode == 0


def test_merge_label_from_file_and_output(tmp_path: Path, cli: Callable[..., Any]) -> None:
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


def test_merge_corrupt_json_is_a_clear_error(tmp_path: Path, cli: Callable[..., Any]) -> None:
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
def test_merge_wrong_files_exit_2(tmp_path: Path, cli: Callable[..., Any], content: str | None, message: str) -> None:
    path = tmp_path / "job.json"
    if content is not None:
        path.write_text(content)
    out = cli("merge", str(path))
    assert out.returncode == 2
    assert out.stderr == f"error: {path} {message}\n"
    assert out.stdout == ""


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"results": [{"provider": "CPU", "outcome": "passed"}]}', "results[0] has no 'test' (a string)"),
        ('{"results": [{"test": "t.py::a", "outcome": "passed"}, 3]}', "results[1] is not an object"),
        ('{"results": {"test": "t.py::a"}}', "'results' is not a list"),
        ('{"results": [], "tests": [{"test": "t.py::a", "outcome": "exploded"}]}', "tests[0] has outcome 'exploded'; valid: passed, failed, error, skipped, xfailed, xpassed"),
        ('{"results": [], "tests": [{"outcome": "failed"}]}', "tests[0] has no 'test' (a string)"),
        ('{"results": [], "skips": [7]}', "skips[0] is not an object"),
    ],
    ids=["row-without-test", "row-not-object", "results-not-list", "bad-outcome", "test-without-id", "bad-skip"],
)
def test_merge_malformed_rows_name_file_and_row(tmp_path: Path, cli: Callable[..., Any], content: str, message: str) -> None:
    path = tmp_path / "job.json"
    path.write_text(content)
    out = cli("merge", str(path))
    assert out.returncode == 2
    assert out.stderr == f"error: {path}: {message}: is it a file written by --ortdiff-json?\n"
    assert out.stdout == ""


def _outcomes(path: Path, rows: list[dict], tests: list[dict]) -> Path:
    path.write_text(json.dumps({"results": rows, "skips": [], "tests": tests}, indent=1))
    return path


def test_merge_old_and_new_files_strict_on_failed_tests(tmp_path: Path, cli: Callable[..., Any]) -> None:
    old = _write(tmp_path / "old.json", [_row("t.py::a[CPU-float32]", "float32", True)])  # no 'tests': still merges
    new = _outcomes(
        tmp_path / "new.json",
        [_row("t.py::a[CPU-float16]", "float16", True)],
        [
            {"test": "t.py::a[CPU-float16]", "outcome": "passed", "provider": "CPU", "dtype": "float16"},
            {"test": "t.py::b[CPU-float16]", "outcome": "failed", "provider": "CPU", "dtype": "float16", "message": "ValueError: bad feeds"},
            {"test": "t.py::c", "outcome": "skipped"},
        ],
    )
    out = cli("merge", str(old), str(new), "--label-from-file", "--strict", "--rows")  # (two cases: the matrix without --rows)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert lines[1:4] == [
        "t.py::a[CPU-float16] (new)  CPU       float16  0.00015  5.57e-07  3        0 > 0.01 (0 %; allows 0 %)  passed",
        "t.py::a[CPU-float32] (old)  CPU       float32  0.00015  5.57e-07  3        0 > 0.01 (0 %; allows 0 %)  passed",
        "t.py::b[CPU-float16] (new)  CPU       float16  -        -         -        no check ran                failed",
    ]
    assert "2 check(s) from 2 file(s): 2 passed, 0 failed" in lines
    assert "3 test(s): 1 passed, 1 failed, 0 error(s), 1 skipped" in lines
    assert "failed: t.py::b[CPU-float16] (new): ValueError: bad feeds" in lines
    assert cli("merge", str(old), str(new)).returncode == 0


def test_merge_failed_test_whose_checks_passed_gets_its_own_row(tmp_path: Path, cli: Callable[..., Any]) -> None:
    job = _outcomes(
        tmp_path / "job.json",
        [_row("t.py::a[CPU-float32]", "float32", True), {**_row("t.py::a[CPU-float32]", "float32", True), "test": "t.py::a[CPU-float32] [baseline out]"}],
        [{"test": "t.py::a[CPU-float32]", "outcome": "failed", "provider": "CPU", "dtype": "float32", "message": "assert 1 == 2"}],
    )
    out = cli("merge", str(job), "--strict")
    assert out.returncode == 1
    rows = [re.split(r"\s{2,}", line) for line in out.stdout.splitlines()[1:4]]
    assert [(r[0], r[-2], r[-1]) for r in rows] == [
        ("t.py::a[CPU-float32]", "0 > 0.01 (0 %; allows 0 %)", "passed"),
        ("t.py::a[CPU-float32]", "its checks passed; the test failed", "failed"),
        ("t.py::a[CPU-float32] [baseline out]", "0 > 0.01 (0 %; allows 0 %)", "passed"),
    ]


def test_merge_output_keeps_test_outcomes_and_merges_again(tmp_path: Path, cli: Callable[..., Any]) -> None:
    job = _outcomes(
        tmp_path / "cpu.json",
        [_row("t.py::a[CPU-float32]", "float32", True)],
        [{"test": "t.py::b", "outcome": "error", "message": "RuntimeError: fixture broke"}],
    )
    merged = tmp_path / "merged.json"
    assert cli("merge", str(job), "--label-from-file", "--output", str(merged)).returncode == 0
    data = json.loads(merged.read_text())
    assert [r["test"] for r in data["results"]] == ["t.py::a[CPU-float32] (cpu)"]  # no synthesized rows
    assert data["tests"] == [{"test": "t.py::b (cpu)", "outcome": "error", "message": "RuntimeError: fixture broke"}]
    again = cli("merge", str(merged), "--strict")
    assert again.returncode == 1
    assert "errored: t.py::b (cpu): RuntimeError: fixture broke" in again.stdout.splitlines()


def test_no_command_is_a_usage_error(cli: Callable[..., Any]) -> None:
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
    lines = _report_lines(out)
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
    # the one run through a fresh interpreter: the other tests call the same main() in-process
    out = subprocess.run([sys.executable, "-m", "pytest_ortdiff", "compare", str(model_file), "--dim", "a=1", "--dim", "b=2", "--dim", "c=4"], capture_output=True, text=True, check=False)
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
        (["{bf16}", "--dim", "a=1", "--dim", "b=2", "--dim", "c=4"], "no bfloat16 kernel for MatMul(13), so there is nothing to compare the torch evaluator with: use a provider that has it (e.g. --provider CUDA) or another --dtype"),
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


def _one_node(path: Path, op: str, *, domain: str = "", **attrs: object) -> Path:
    """A model of one float32 node X[a, 4] -> Y[a, 4]."""
    node = helper.make_node(op, ["X"], ["Y"], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", 4])], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["a", 4])]
    )
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


@pytest.mark.parametrize(
    ("make", "args", "message"),
    [
        ("trilu", ["--dim", "a=2"], "error: no torch kernel for com.microsoft::Trilu (opset 1); run it with onnxruntime instead: --ort-kernel com.microsoft::Trilu (or --missing=ort)\n"),
        ("unknown-op", ["--dim", "a=2"], "error: {path} fails onnx.checker: No Op registered for Foo with domain_version of 18 (Bad node spec for node. Name: OpType: Foo); fix the graph\n"),
        ("bad-attribute", ["--dim", "a=2"], "error: {path} fails onnx.checker: Unrecognized attribute: bogus for operator Relu (Bad node spec for node. Name: OpType: Relu); fix the graph\n"),
        ("garbage", ["--dim", "a=2"], "error: cannot load {path!r}: not an ONNX model (Error parsing message with type 'onnx.ModelProto': Wire format was corrupt)\n"),
        ("relu", ["--dim", "a=2", "--dim", "batch=3"], "error: --dim batch=3: the model has no symbolic dim 'batch'; its symbolic dims: a\n"),
        ("relu", ["--dim", "a=0"], "error: --dim a=0: expected a positive integer up to 2,147,483,647, e.g. --dim a=2\n"),
        ("relu", ["--dim", "a=2", "--ort-kernel", "Gelu"], "error: --ort-kernel Gelu: the model has no Gelu node; its ops: Relu\n"),
        ("relu", ["--dim", "a=2", "--ort-kernel", "::"], "error: --ort-kernel '::': expected OP or DOMAIN::OP, e.g. --ort-kernel LayerNormalization or --ort-kernel com.microsoft::FusedMatMul\n"),
    ],
    ids=["missing-kernel", "unknown-op", "fails-checker", "not-onnx", "unknown-dim", "zero-dim", "kernel-not-in-model", "bad-kernel"],
)
def test_compare_bad_model_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str, args: list[str], message: str
) -> None:
    path = tmp_path / f"{make}.onnx"
    if make == "trilu":
        _one_node(path, "Trilu", domain="com.microsoft")
    elif make == "unknown-op":
        _one_node(path, "Foo")
    elif make == "bad-attribute":
        _one_node(path, "Relu", bogus=1)
    elif make == "garbage":
        path.write_bytes(b"\x01\x02 not an onnx model")
    else:
        _one_node(path, "Relu")
    rc = main(["compare", str(path), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == message.format(path=str(path))


def test_compare_model_onnxruntime_rejects_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # onnx.checker (without shape inference) lets a mistyped output through; onnxruntime does not
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [2, 4])],
    )
    path = tmp_path / "mistyped.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert main(["compare", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: onnxruntime cannot run {path}: [ONNXRuntimeError] : ")
    assert "Type Error" in err
    assert err.count("\n") == 1


def _relu_then(path: Path, op: str, *, domain: str = "") -> Path:
    """X[a, 4] -> Relu -> op -> Y[a, 4]: a node the torch evaluator computes, then `op`."""
    nodes = [helper.make_node("Relu", ["X"], ["r"]), helper.make_node(op, ["r"], ["Y"], domain=domain)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", 4])], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["a", 4])]
    )
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def test_compare_ort_kernel_runs_the_op_with_onnxruntime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _relu_then(tmp_path / "trilu.onnx", "Trilu", domain="com.microsoft")
    rc = main(["compare", str(path), "--dim", "a=2", "--ort-kernel", "com.microsoft::Trilu"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    lines = _report_lines(out)
    assert lines[0] == f"{path}: torch evaluator vs onnxruntime CPU float32, dims {{'a': 2}}, seed 0; with onnxruntime: com.microsoft::Trilu"
    assert lines[1] == "passed (atol=0.0001 rtol=0.0001)"
    assert lines[2] == "output 'Y'  float32[2x4]  n=8"
    assert "         0           0       0 %" in [line.rstrip() for line in lines]  # the same kernel on both sides


def test_compare_judges_the_dtype_of_the_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a float16 embedding looked up by int64 ids: no floating input, yet a float16 model
    table = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float16).reshape(16, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("Relu", ["emb"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, ["n", 4])],
        initializer=[table],
    )
    path = tmp_path / "embedding.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert main(["compare", str(path), "--dim", "n=5"]) == 0
    lines = _report_lines(capsys.readouterr().out)
    assert lines[0] == f"{path}: torch evaluator vs onnxruntime CPU float16, dims {{'n': 5}}, seed 0"
    assert lines[1] == "passed (atol=0.01 rtol=0.01)"  # float16's default tolerance, not float32's
    assert lines[2] == "output 'Y'  float16[5x4]  n=20"


def _embedding_file(tmp_path: Path) -> Path:
    """BERT's embedding lookup in small: word ids index 16 rows, token type ids a table of 2 rows."""
    word = numpy_helper.from_array(np.linspace(-1, 1, 64, dtype=np.float32).reshape(16, 4), "word")
    token_type = numpy_helper.from_array(np.array([[0.5] * 4, [-0.5] * 4], dtype=np.float32), "token_type")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["word", "input_ids"], ["w"]),
            helper.make_node("Gather", ["token_type", "token_type_ids"], ["t"]),
            helper.make_node("Add", ["w", "t"], ["Y"]),
        ],
        "embedding",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "token_type_ids")],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "seq", 4])],
        initializer=[word, token_type],
    )
    path = tmp_path / "embedding.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_compare_feeds_from_a_file_and_input_ranges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _embedding_file(tmp_path)
    ids = np.array([[1, 15, 3], [0, 7, 2]], dtype=np.int64)
    both = tmp_path / "both.npz"
    np.savez(both, input_ids=ids, token_type_ids=np.array([[0, 0, 1], [0, 1, 1]], dtype=np.int64))
    assert main(["compare", str(path), "--feeds", str(both)]) == 0  # no --dim: the feeds fix batch and seq
    out = _report_lines(capsys.readouterr().out)
    assert out[0] == f"{path}: torch evaluator vs onnxruntime CPU float32, dims {{'batch': 2, 'seq': 3}}, seed 0; feeds from {both}: input_ids, token_type_ids"
    assert out[1:3] == ["passed (atol=0.0001 rtol=0.0001)", "output 'Y'  float32[2x3x4]  n=24"]
    # some inputs from the file, the others drawn in the range given (HI excluded: 0 and 1)
    ids_only = tmp_path / "ids.npz"
    np.savez(ids_only, input_ids=ids)
    assert main(["compare", str(path), "--feeds", str(ids_only), "--input-range", "token_type_ids=0:2", "--seed", "1"]) == 0
    out = _report_lines(capsys.readouterr().out)
    assert out[0].endswith(f"dims {{'batch': 2, 'seq': 3}}, seed 1; feeds from {ids_only}: input_ids; input ranges: token_type_ids=[0, 2)")
    assert out[1] == "passed (atol=0.0001 rtol=0.0001)"
    # without them, the token type ids drawn from [0, 10) index out of the table: onnxruntime says so in one line
    assert main(["compare", str(path), "--dim", "batch=2", "--dim", "seq=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: onnxruntime cannot run {path}: Error in execution: Non-zero status code returned while running Gather node.")
    assert err.endswith(
        "(integer inputs were drawn: input_ids from [0, 10), token_type_ids from [0, 10); give their range with "
        "--input-range NAME=LO:HI or their values with --feeds FILE.npz)\n"
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("arrays", "args", "message"),
    [
        ({"input_ids": [[1, 2]], "segment": [[0, 1]]}, [], "--feeds {npz}: 'segment' is not an input of the model; its inputs: input_ids: int64[batch, seq], token_type_ids: int64[batch, seq]"),
        ({"arr_0": [[1, 2]]}, [], "--feeds {npz}: 'arr_0' is not an input of the model; its inputs: input_ids: int64[batch, seq], token_type_ids: int64[batch, seq]; save them by name: numpy.savez(path, input_name=array, ...)"),
        ({"input_ids": np.array([[1, 2]], dtype=np.int32)}, ["--dim", "batch=1", "--dim", "seq=2"], "--feeds {npz}: feed 'input_ids' has dtype int32, the model declares int64[batch, seq]; cast it (e.g. .astype(numpy.int64))"),
        ({"input_ids": [1, 2]}, [], "--feeds {npz}: feed 'input_ids' has shape (2,) (rank 1), the model declares int64[batch, seq]"),
        ({"input_ids": [[1, 2]], "token_type_ids": [[0, 1, 1]]}, [], "--feeds {npz}: feed 'token_type_ids' has seq=3 (axis 1), but feed 'input_ids' has seq=2 (axis 1); the model declares both seq"),
        ({"input_ids": [[1, 2]]}, ["--dim", "seq=3"], "--dim seq=3: the feeds in {npz} have seq=2; drop --dim seq or change the file"),
        ({"input_ids": [[1, 2]]}, ["--input-range", "input_ids=0:4"], "--input-range input_ids=0:4: 'input_ids' comes from --feeds {npz}; drop one of the two"),
        ({}, ["--dim", "batch=1", "--dim", "seq=2", "--input-range", "token_type_ids=2:2"], "--input-range token_type_ids=2:2: LO must be below HI (HI is excluded: token_type_ids=0:2 draws 0 and 1)"),
        ({}, ["--dim", "batch=1", "--dim", "seq=2", "--input-range", "token_type_ids=0:1.5"], "--input-range token_type_ids=0:1.5: LO and HI must be integers ('token_type_ids' is int64), e.g. --input-range token_type_ids=0:2 (HI excluded: draws 0 and 1)"),
        ({}, ["--dim", "batch=1", "--dim", "seq=2", "--input-range", "segment=0:2"], "--input-range segment=0:2: the model has no input 'segment'; its inputs: input_ids, token_type_ids"),
        ({}, ["--dim", "batch=1", "--dim", "seq=2", "--input-range", "token_type_ids"], "--input-range 'token_type_ids': expected NAME=LO:HI, e.g. --input-range token_type_ids=0:2 (HI excluded: draws 0 and 1)"),
    ],
    ids=["unknown-name", "unnamed", "wrong-dtype", "wrong-rank", "inconsistent-dims", "dim-against-feeds", "range-of-a-fed-input", "empty-range", "float-bounds", "range-unknown-input", "range-format"],
)
def test_compare_bad_feeds_or_ranges_are_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arrays: dict[str, Any], args: list[str], message: str
) -> None:
    path = _embedding_file(tmp_path)
    npz = tmp_path / "feeds.npz"
    argv = ["compare", str(path), *args]
    if arrays:
        np.savez(npz, **{k: np.asarray(v) for k, v in arrays.items()})
        argv += ["--feeds", str(npz)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {message.format(npz=npz)}\n"


def test_compare_missing_ort_runs_the_ops_without_a_kernel_on_onnxruntime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _relu_then(tmp_path / "trilu.onnx", "Trilu", domain="com.microsoft")
    assert main(["compare", str(path), "--dim", "a=2", "--missing=ort"]) == 0
    lines = _report_lines(capsys.readouterr().out)
    assert lines[0].endswith("dims {'a': 2}, seed 0; ops without a torch kernel on onnxruntime")
    assert lines[1:4] == ["passed (atol=0.0001 rtol=0.0001)", "ran on onnxruntime (no torch kernel): com.microsoft::Trilu", "output 'Y'  float32[2x4]  n=8"]


def test_compare_with_every_node_on_onnxruntime_is_not_a_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A model of one com.microsoft op with --missing=ort passed: onnxruntime compared with itself."""
    path = _one_node(tmp_path / "trilu.onnx", "Trilu", domain="com.microsoft")
    for flags in (["--missing=ort"], ["--ort-kernel", "com.microsoft::Trilu"]):
        assert main(["compare", str(path), "--dim", "a=2", *flags]) == 1
        lines = _report_lines(capsys.readouterr().out)
        assert lines[1] == "ortdiff: torch evaluator vs onnxruntime CPU float32: onnxruntime compared with itself, not a pass"
        assert lines[2].startswith("  - every node ran on onnxruntime") and "the check compared onnxruntime with itself, nothing of the torch evaluator" in lines[2]


def test_model_dtype_order() -> None:

    def model(inputs: list[int], outputs: list[int], init: np.ndarray | None = None) -> onnx.ModelProto:
        graph = helper.make_graph(
            [],
            "g",
            [helper.make_tensor_value_info(f"i{k}", t, [1]) for k, t in enumerate(inputs)],
            [helper.make_tensor_value_info(f"o{k}", t, [1]) for k, t in enumerate(outputs)],
            initializer=[numpy_helper.from_array(init, "w")] if init is not None else [],
        )
        return helper.make_model(graph)

    assert _model_dtype(model([TensorProto.FLOAT], [TensorProto.INT64, TensorProto.BFLOAT16])) == "bfloat16"
    assert _model_dtype(model([TensorProto.FLOAT], [TensorProto.INT64], np.zeros(2, np.float64))) == "float64"
    assert _model_dtype(model([TensorProto.STRING, TensorProto.FLOAT16], [TensorProto.INT64])) == "float16"
    assert _model_dtype(model([TensorProto.INT64], [TensorProto.BOOL])) == "float32"



# -- demo ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "passed"),
    [
        (["demo", "-q"], ["-q"]),
        (["demo", "-q", "-k", "float16", "-x"], ["-q", "-k", "float16", "-x"]),
        (["demo", "--", "-q", "-x"], ["-q", "-x"]),
        (["demo"], []),
    ],
    ids=["one-flag", "flags-and-values", "after-double-dash", "none"],
)
def test_demo_passes_its_arguments_to_pytest(monkeypatch: pytest.MonkeyPatch, argv: list[str], passed: list[str]) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "call", lambda args: calls.append(list(args)) or 0)
    assert main(argv) == 0
    (args,) = calls
    assert args[:3] == [sys.executable, "-m", "pytest"]
    assert args[3].endswith("test_layer_norm_matmul_add.py")
    assert args[4:7] == ["--ort-providers=available", "--ort-dtypes=float32,float16", "--ortdiff-reports"]
    assert args[7:] == passed


def test_demo_runs_the_example_suite() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest_ortdiff", "demo", "-q", "-k", "CPU-float32"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    # pytest in a fresh interpreter: in-process it warned that pytest_ortdiff was imported before it
    assert re.match(r"1 passed, \d+ deselected in ", out.stdout.splitlines()[-1]), out.stdout
    assert " ortdiff reports " in out.stdout  # the demo's --ortdiff-reports


def test_demo_help_says_it_needs_the_checkout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "source checkout's examples/" in " ".join(capsys.readouterr().out.split())


def test_unknown_arguments_of_other_commands_are_still_rejected(model_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(model_file), "-q"])
    assert exc.value.code == 2
    assert "unrecognized arguments: -q" in capsys.readouterr().err


# -- conformance -------------------------------------------------------------------------------------


@pytest.fixture
def suite(pytestconfig: pytest.Config) -> None:
    """ONNX's node cases, loaded once per process, from pytest's cache when tests/test_conformance.py put them there."""
    cache = getattr(pytestconfig, "cache", None)
    conformance.load_cases(cache.mkdir("ortdiff-conformance") if cache is not None else None)


@pytest.mark.usefixtures("suite")
def test_conformance_table_for_one_op(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["conformance", "--op", "Relu"])
    lines = _report_lines(capsys.readouterr().out)
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


@pytest.mark.usefixtures("suite")
def test_conformance_one_unknown_op_among_known_ones_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--op", "Relu", "--op", "Relux"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: no case matches --op Relux; Relux is not an op of the suite (did you mean Relu, PRelu, Selu?)\n"


@pytest.mark.usefixtures("suite")
def test_conformance_suggests_the_case_insensitive_match_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--op", "relu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no case matches --op relu; relu is not an op of the suite (did you mean Relu, ")


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


# -- bad input from anyone (issue 12) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"provider": 1}, "results[0] has 'provider' 1 (int); expected a string or null"),
        ({"dtype": ["float32"]}, "results[0] has 'dtype' ['float32'] (list); expected a string or null"),
        ({"report": {"n": 4, "nan_mismatch": "many", "counts": {}}}, "results[0].report has 'nan_mismatch' 'many'; expected a count (an integer >= 0) or null: is it a file written by --ortdiff-json?"),
        ({"report": {"n": 4, "counts": {"0.0": 1.5}}}, "results[0].report.counts has 1.5 for '0.0'; expected a count (an integer >= 0): is it a file written by --ortdiff-json?"),
        ({"blame": [1]}, "results[0] has 'blame' [1] (list); expected an object"),
        ({"blame": {"rows": {"a": 1}}}, "results[0].blame has 'rows' {'a': 1} (dict); expected a list"),
        (None, "is nested too deeply to be a JSON report written by --ortdiff-json"),
    ],
    ids=["provider-int", "dtype-list", "count-str", "count-float", "blame-list", "blame-rows-object", "deep"],
)
def test_merge_wrongly_typed_or_deep_json_is_one_error_line(tmp_path: Path, cli: Callable[..., Any], content: dict | None, message: str) -> None:
    """Item 8: one `error:` line and exit 2, never a traceback and exit 1."""
    path = tmp_path / "job.json"
    if content is None:
        path.write_text('{"results": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        _write(path, [{**_row("t.py::a", "float32", True), **content}])
    argv = ["merge", str(path)]
    try:
        rc = main(argv)
    except BaseException as exc:
        pytest.fail(f"{argv} raised {type(exc).__name__}: {exc}")
    assert rc == 2
    out = cli(*argv)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr in (f"error: {path}: {message}\n", f"error: {path} {message}\n")


def test_merge_escapes_pipes_in_markdown_and_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 8: a `|` in a test id stays in its column; an ANSI escape in an id never reaches the terminal."""
    path = _write(tmp_path / "job.json", [_row("t.py::test_a[x|y]", "float32", True), _row("t.py::test_b[\x1b[2J\x1b[31m]", "float32", False)])
    assert main(["merge", str(path), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert all(line.replace("\\|", "").count("|") == 9 for line in lines), lines
    assert "| t.py::test_a\\[x\\|y] |" in out and "t.py::test_b\\[\\x1b\\[2J\\x1b\\[31m]" in out
    assert main(["merge", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "t.py::test_b[\\x1b[2J\\x1b[31m]" in out and "t.py::test_a[x|y]" in out


def test_merge_markdown_makes_no_link_or_image_of_a_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node or test named like markdown's `![alt](url)` would show a remote image in a pull-request comment:
    the `]` before `(` is escaped; the brackets of a test's parameters stay as they are."""
    node = "![i](https://evil.example/x.png)"
    row = {**_row("t.py::test_a[CPU-float32]", "float32", False), "blame": {"rows": [{"node": node, "op_type": "Add", "explained": 0.5, "exact": True}], "culprit": node}}
    path = _write(tmp_path / "job.json", [row])
    assert main(["merge", str(path), "--matrix", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "  - blame: !\\[i](https\\://evil.example/x.png) (Add) 50 %" in out and "![" not in out
    assert "- t.py::test_a\\[CPU-float32]: failed" in out


def _relu_model(path: Path, dims: list[Any], elem_type: int = TensorProto.FLOAT) -> Path:
    op = "Identity" if elem_type == TensorProto.STRING else "Relu"
    graph = helper.make_graph(
        [helper.make_node(op, ["X"], ["Y"])], "g", [helper.make_tensor_value_info("X", elem_type, dims)], [helper.make_tensor_value_info("Y", elem_type, dims)]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _external_model(directory: Path) -> Path:
    """A model whose initializer W lives in `model.onnx.data` next to it."""
    directory.mkdir()
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "W")
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in "XY")
    model = helper.make_model(helper.make_graph([helper.make_node("Add", ["X", "W"], ["Y"])], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 18)])
    path = directory / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return path


@pytest.mark.parametrize(
    ("case", "args", "message"),
    [
        ("data-missing", [], "error: model '{path}': tensor 'W' keeps its data in 'model.onnx.data', which does not exist next to the model"),
        ("data-symlink", [], "error: model '{path}': tensor 'W' keeps its data in 'model.onnx.data': '{dir}/model.onnx.data' is a symbolic link;"),
        ("data-escapes", [], "error: model '{path}': tensor 'W' keeps its data in '../secret.bin', which is not a file inside the model's directory"),
        ("unnamed-dim", [], "error: input 'X' (float32[?, 4]) has an unnamed dim (axis 0), which --dim cannot set; give its values with --feeds FILE.npz"),
        ("string", [], "error: input 'X' is string[2]: compare draws numeric tensors only"),
        ("huge", [], "error: input 'X' (float32[2147483648, 2147483648]) would have 4,611,686,018,427,387,904 elements"),
        ("relu", ["--dim", "a=2", "--seed", str(2**70)], f"error: --seed {2**70}: expected an integer from 0 to 2**63-1"),
        ("relu", ["--dim", f"a={2**70}"], f"error: --dim a={2**70}: expected a positive integer up to 2,147,483,647"),
    ],
    ids=["data-missing", "data-symlink", "data-escapes", "unnamed-dim", "string", "huge", "seed-70-bit", "dim-70-bit"],
)
def test_compare_hostile_models_and_arguments_are_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, args: list[str], message: str
) -> None:
    """Item 9: each one `error:` line and exit 2 (a traceback and exit 1 before)."""
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(4, 7, np.float32).tobytes())
    if case.startswith("data-"):
        path = _external_model(tmp_path / "m")
        data = path.parent / "model.onnx.data"
        data.unlink()
        if case == "data-symlink":
            data.symlink_to(secret)
        elif case == "data-escapes":
            proto = onnx.load(str(path), load_external_data=False)
            proto.graph.initializer[0].external_data[0].value = "../secret.bin"
            onnx.save(proto, str(path))
    elif case == "unnamed-dim":
        path = _relu_model(tmp_path / "m.onnx", [None, 4])
    elif case == "string":
        path = _relu_model(tmp_path / "m.onnx", [2], TensorProto.STRING)
    elif case == "huge":
        path = _relu_model(tmp_path / "m.onnx", [2**31, 2**31])
    else:
        path = _relu_model(tmp_path / "m.onnx", ["a", 4])
    argv = ["compare", str(path), *args]
    try:
        rc = main(argv)
    except BaseException as exc:
        pytest.fail(f"{argv} raised {type(exc).__name__}: {exc}")
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(message.format(path=path, dir=path.parent)), err


# -- issue 29 item 10: huge numbers in a job file -----------------------------------------------------


def _huge(path: Path, where: str, literal: str) -> Path:
    """A job file of one row whose `where` (a field of the row, or `report.FIELD`) holds the JSON text `literal`."""
    row = _row("t.py::test_a[CPU-float32]", "float32", True)
    row["report"] = {"n": 256, "max_abs": 1.5e-4, "counts": {"0.0": 39}, "argmax": [0, 1]}
    marker = "__HUGE__"
    if where.startswith("report."):
        row["report"][where.removeprefix("report.")] = marker
    else:
        row[where] = marker
    path.write_text(json.dumps({"results": [row]}).replace(f'"{marker}"', literal))
    return path


@pytest.mark.parametrize(
    ("where", "literal", "message"),
    [
        ("max_abs", "9" * 400, "results[0].max_abs is an integer of 400 digits"),
        ("max_ulp", "9" * 5000, "results[0].max_ulp is an integer of 5,000 digits"),
        ("report.n", "9" * 400, "results[0].report.n is an integer of 400 digits"),
        ("report.counts", '{"0.0": ' + "9" * 400 + "}", "results[0].report.counts['0.0'] is an integer of 400 digits"),
        ("report.argmax", '["x", "y"]', "results[0].report has 'argmax' ['x', 'y']; expected a list of integers or null"),
        ("report.max_abs", '"huge"', "results[0].report has 'max_abs' 'huge'; expected a number"),
    ],
    ids=["max-abs-400-digits", "int-5000-digits", "count-400-digits", "histogram-400-digits", "argmax-strings", "max-abs-string"],
)
@pytest.mark.parametrize("form", [[], ["--markdown"], ["--html", "r.html"]], ids=["text", "markdown", "html"])
def test_merge_huge_or_mistyped_numbers_are_one_named_error(tmp_path: Path, cli: Callable[..., Any], where: str, literal: str, message: str, form: list[str]) -> None:
    """Issue 29 item 10: OverflowError/ValueError tracebacks before; one line naming the file, the row and the field."""
    path = _huge(tmp_path / "job.json", where, literal)
    out = cli("merge", str(path), *form, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"error: {path}: {message}"), out.stderr
    assert out.stderr.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_merge_an_infinite_max_abs_renders(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """A 400-digit float literal is JSON's way to say inf: accepted, and shown as such."""
    path = _huge(tmp_path / "job.json", "max_abs", "9" * 400 + ".5")
    out = cli("merge", str(path), "--html", "r.html", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "t.py::test_a[CPU-float32]  CPU       float32  inf" in out.stdout


def test_merge_of_one_job_twice_is_refused(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """`merge j.json j.json --strict` exited 0 with every count doubled (one artifact downloaded twice)."""
    job = tmp_path / "j.json"
    _write(job, [_row("t.py::a[CPU-float32]", "float32", True)])
    copy = tmp_path / "copy.json"
    copy.write_bytes(job.read_bytes())
    out = cli("merge", str(job), str(job), "--strict")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"error: {job} and {job} are one file: a job merged twice counts every check twice; give each job's file once\n"
    # two files of the same bytes: two jobs that agree, or one artifact downloaded twice: merged, and said
    out = cli("merge", str(job), str(copy), "--strict")
    assert out.returncode == 0
    assert out.stderr == (
        f"note: {job} and {copy} hold the same report (identical bytes): if they are one job's file twice (one artifact downloaded "
        "twice), every count below is doubled\n"
    )
