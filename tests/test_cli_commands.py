"""The command line people expect (issue 30): `blame MODEL`, `diff ORIGINAL DEPLOYED`, tolerance flags and
`--dtype` on `compare`, `--json` on compare/blame/diff (a stable schema), `--missing` wherever a model runs,
and `--help` and argument errors before any heavy import; with the inputs from someone else's files
(`--feeds` .npz bombs, names with escape sequences) refused in one line (issue 29 items 5 and 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pytest_ortdiff import models
from pytest_ortdiff.analyses.precision.keep import convert_half

DIMS = ["--dim", "a=2", "--dim", "b=8", "--dim", "c=16"]


@pytest.fixture
def lnmm32(tmp_path: Path) -> Path:
    path = tmp_path / "lnmm32.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="float32"), str(path))
    return path


@pytest.fixture
def lnmm16(tmp_path: Path) -> Path:
    path = tmp_path / "lnmm16.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="float16"), str(path))
    return path


def _no_kernel(path: Path, name: str = "X") -> Path:
    """X[a, 4] -> com.microsoft::Trilu -> Y: an op onnxruntime has and the torch evaluator has no kernel for."""
    node = helper.make_node("Trilu", [name], ["Y"], domain="com.microsoft", upper=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["a", 4])], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["a", 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]), str(path))
    return path


# -- --help and argument errors: nothing heavy imported ----------------------------------------------------

HEAVY = ("torch", "onnxruntime", "onnx", "numpy")


def test_help_and_argument_errors_import_no_heavy_module(tmp_path: Path, lnmm32: Path) -> None:
    """A missing file took 14.5 s to be reported (torch imported first). Each case runs main() in one fresh
    interpreter and says which heavy modules it imported by the time it returned: none. (The time, as a ratio
    to `python -c pass`: benchmarks/bench_cli.py.)"""
    missing = str(tmp_path / "nope.onnx")
    cases = {
        "help": ["--help"],
        "compare-help": ["compare", "--help"],
        "blame-help": ["blame", "--help"],
        "diff-help": ["diff", "--help"],
        "compare-missing-file": ["compare", missing],
        "blame-missing-file": ["blame", missing],
        "diff-missing-file": ["diff", str(lnmm32), missing],
        "precision-missing-file": ["precision", missing],
        "compare-missing-feeds": ["compare", str(lnmm32), "--feeds", str(tmp_path / "nope.npz")],
        "bad-dim": ["compare", str(lnmm32), "--dim", "a"],
        "bad-atol": ["compare", str(lnmm32), "--atol", "-1"],
        "bad-budget": ["blame", str(lnmm32), "--budget", "0.01"],
        "bad-provider": ["compare", str(lnmm32), "--provider", "TPU"],
        "bad-range": ["compare", str(lnmm32), "--input-range", "X=1"],
        "bad-seed": ["compare", str(lnmm32), "--seed", "-1"],
        "bad-dtype": ["compare", str(lnmm32), "--dtype", "float8"],
        "directory": ["compare", str(tmp_path)],
    }
    script = textwrap.dedent(
        f"""
        import contextlib, io, json, sys
        from pytest_ortdiff.cli import main
        out = {{}}
        for name, argv in json.loads(sys.argv[1]).items():
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                try:
                    rc = main(argv)
                except SystemExit as exc:
                    rc = exc.code
            out[name] = [rc, err.getvalue(), [m for m in {HEAVY!r} if m in sys.modules]]
        print(json.dumps(out))
        """
    )
    run = subprocess.run([sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True, check=True)
    results = json.loads(run.stdout)
    for name, (rc, err, heavy) in results.items():
        assert heavy == [], f"{name}: imported {heavy}"
        assert rc == (0 if name.endswith("help") else 2), (name, rc, err)
    assert results["compare-missing-file"][1] == f"error: model file {missing!r} does not exist\n"
    assert results["compare-missing-feeds"][1] == f"error: --feeds {tmp_path / 'nope.npz'}: the file does not exist\n"
    assert results["bad-atol"][1] == "error: --atol -1: expected a number >= 0\n"
    assert results["bad-budget"][1].startswith("error: --budget '0.01': expected THRESHOLD:FRACTION, e.g. --budget 0.01:0.001")
    assert results["bad-provider"][1].startswith("error: --provider TPU: unknown provider 'TPU'")
    assert results["directory"][1] == f"error: model file {str(tmp_path)!r} is a directory, not a file\n"
    assert "invalid choice: 'float8'" in results["bad-dtype"][1]


def test_an_unknown_flag_gets_the_commands_usage_and_the_flag_meant(lnmm32: Path, cli: Callable[..., Any]) -> None:
    """`compare M --dims a=2` showed the top-level usage and no hint (a new user's typo)."""
    out = cli("compare", str(lnmm32), "--dims", "a=2")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("usage: python -m pytest_ortdiff compare ")
    assert out.stderr.splitlines()[-1] == "python -m pytest_ortdiff compare: error: unrecognized arguments: --dims a=2; did you mean --dim?"
    far = cli("precision", str(lnmm32), "--json")  # nothing near: the flags it takes
    assert far.returncode == 2
    last = far.stderr.splitlines()[-1]
    assert last.startswith("python -m pytest_ortdiff precision: error: unrecognized arguments: --json; precision takes --atol, --budget, --dim, --dtype,")


def test_dtype_names_pytest_takes_the_command_line_takes(lnmm32: Path, cli: Callable[..., Any]) -> None:
    """`--ort-dtypes=fp16` worked in pytest and `compare --dtype fp16` was an invalid choice."""
    for alias in ("fp16", "half", "FLOAT16"):
        out = cli("compare", str(lnmm32), *DIMS, "--dtype", alias, "--json")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["dtype"] == "float16"
    out = cli("compare", str(lnmm32), *DIMS, "--dtype", "fp8")
    assert out.returncode == 2 and "invalid choice: 'fp8' (choose from 'float32', 'float16', 'bfloat16')" in out.stderr


def test_a_closed_pipe_ends_the_output_quietly(lnmm32: Path) -> None:
    """`compare M | head -1` ended in a BrokenPipeError traceback."""
    for command in ("compare", "blame"):
        argv = [sys.executable, "-m", "pytest_ortdiff", command, str(lnmm32), *DIMS]
        # the reader gone before the first line (the interpreter's start-up alone outlasts the close): every write
        # goes into a closed pipe, whatever the machine's speed
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            err = proc.stderr.read().decode()
            assert proc.wait(timeout=120) == 141, err
        assert err == "", err


# -- compare: tolerance flags, --dtype, --json ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "rc", "tolerance"),
    [
        ([], 0, "passed (atol=0.0001 rtol=0.0001)"),
        (["--atol", "0", "--rtol", "0"], 1, "ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken (atol=0 rtol=0)"),
        (["--max-ulp", "2"], 0, "passed (max_ulp=2)"),  # (floored 2; 3 raw)
        (["--max-ulp", "1"], 1, "ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken (max_ulp=1)"),
        (["--budget", "1e-7:0.2", "--budget", "1e-6:0"], 0, "passed (budget >1e-07: 20.00 %, >1e-06: 0 %)"),
        (["--budget", "1e-7:0.1"], 1, "ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken (budget >1e-07: 10.00 %)"),
    ],
    ids=["defaults", "bitwise", "max-ulp-2", "max-ulp-1", "budget-passes", "budget-breaks"],
)
def test_compare_tolerance_flags_change_the_exit_code(lnmm32: Path, cli: Callable[..., Any], flags: list[str], rc: int, tolerance: str) -> None:
    """The seeds' graph in float32 on CPU: max abs 9.54e-07, 3 ULPs raw (2 at the output's scale), 39 of 256
    elements differ (15 %)."""
    out = cli("compare", str(lnmm32), *DIMS, *flags)
    assert (out.returncode, out.stderr) == (rc, "")
    assert out.stdout.splitlines()[1] == tolerance


def test_compare_json_has_a_stable_schema(lnmm32: Path, cli: Callable[..., Any]) -> None:
    out = cli("compare", str(lnmm32), *DIMS, "--atol", "0", "--rtol", "0", "--json")
    assert out.returncode == 1 and out.stderr == ""
    data = json.loads(out.stdout)  # the whole stdout is one JSON document
    assert list(data) == [
        "schema", "command", "model", "provider", "dtype", "converted_from", "dims", "seed", "feeds", "input_ranges",
        "ort_kernels", "missing", "tolerance", "passed", "violations", "ran_on_ort", "notes", "report", "judged_dtype",
    ]  # fmt: skip
    assert (data["schema"], data["command"], data["model"], data["provider"], data["dtype"]) == (1, "compare", str(lnmm32), "CPU", "float32")
    assert (data["converted_from"], data["dims"], data["seed"], data["feeds"], data["missing"]) == (None, {"a": 2, "b": 8, "c": 16}, 0, None, "error")
    assert data["tolerance"] == {"atol": 0.0, "rtol": 0.0, "max_ulp": None, "budget": None, "text": "atol=0 rtol=0"}
    assert data["passed"] is False
    assert data["violations"] == [{"rule": "allclose", "output": "Z", "message": data["violations"][0]["message"]}]
    assert data["violations"][0]["message"].startswith("39 of 256 elements (15.23 %) exceed atol=0 + rtol=0*|expected|")
    report = data["report"]
    assert (report["dtype"], report["n"], report["max_ulp"], report["max_ulp_floored"]) == ("float32", 256, 3.0, 2.0)
    assert [(o["name"], o["shape"]) for o in report["outputs"]] == [("Z", [2, 8, 16])]  # (one per output: DiffReport.to_dict)


def test_compare_dtype_converts_a_float32_model(lnmm32: Path, cli: Callable[..., Any]) -> None:
    out = cli("compare", str(lnmm32), *DIMS, "--dtype", "float16")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        f"{lnmm32}: torch evaluator vs onnxruntime CPU float16, dims {{'a': 2, 'b': 8, 'c': 16}}, seed 0; "
        "converted from float32 by onnxruntime's float16 converter, every node"
    )
    assert lines[1] == "passed (atol=0.01 rtol=0.01)" and lines[2] == "output 'Z'  float16[2x8x16]  n=256"
    data = json.loads(cli("compare", str(lnmm32), *DIMS, "--dtype", "float16", "--json").stdout)
    assert (data["dtype"], data["converted_from"], data["report"]["dtype"]) == ("float16", "float32", "float16")


def test_compare_dtype_the_other_way_is_one_error_line(lnmm16: Path, cli: Callable[..., Any]) -> None:
    out = cli("compare", str(lnmm16), *DIMS, "--dtype", "float32")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == "error: --dtype float32: the model computes in float16; compare converts a float32 model to float16 or bfloat16, not back (give the float32 model, or leave --dtype out)\n"


# -- blame ---------------------------------------------------------------------------------------------------


def test_blame_prints_the_table(lnmm16: Path, cli: Callable[..., Any]) -> None:
    out = cli("blame", str(lnmm16), *DIMS)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"{lnmm16}: blame, torch evaluator vs onnxruntime CPU float16, dims {{'a': 2, 'b': 8, 'c': 16}}, seed 0"
    assert lines[1].startswith("blame: torch evaluator vs onnxruntime CPU float16: gap max abs ")
    assert lines[2].split() == ["node", "op", "explained", "vs", "ort", "vs", "torch", "local", "abs", "local", "ulp", "drift", "abs", "vs", "f64", "abs", "vs", "f64", "ulp"]
    assert {line.split()[0] for line in lines[3:6]} == {"layer_norm", "matmul", "add"}
    assert "against the float64 oracle (in the tested dtype; ULPs at the output's scale):" in lines
    assert any(line.startswith(("most to blame: ", "no single node explains 10 % of the gap")) for line in lines)


def test_blame_json(lnmm16: Path, cli: Callable[..., Any]) -> None:
    out = cli("blame", str(lnmm16), *DIMS, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data)[:6] == ["schema", "command", "model", "provider", "dtype", "converted_from"]
    assert (data["schema"], data["command"], data["dtype"]) == (1, "blame", "float16")
    table = data["blame"]
    assert table["nodes"] == 3 and len(table["rows"]) == 3
    assert {r["node"] for r in table["rows"]} == {"layer_norm", "matmul", "add"}
    assert set(table) >= {"provider", "dtype", "gap", "rows", "by_op_type", "oracle", "first_divergence", "culprit", "closer_to_oracle", "notes"}


def test_blame_missing_ort_and_ort_kernel(tmp_path: Path, cli: Callable[..., Any]) -> None:
    path = _no_kernel(tmp_path / "qg.onnx")
    out = cli("blame", str(path), "--dim", "a=2")
    assert out.returncode == 2
    assert out.stderr.startswith("error: no torch kernel for com.microsoft::Trilu (opset 1); run it with onnxruntime instead: --ort-kernel com.microsoft::Trilu (or --missing=ort)")
    for flags in (["--missing", "ort"], ["--ort-kernel", "com.microsoft::Trilu"]):
        out = cli("blame", str(path), "--dim", "a=2", *flags)
        assert out.returncode == 0, out.stderr
        assert "no discrepancy: nothing to blame" in out.stdout


# -- diff: did my deployment step move the numbers? ------------------------------------------------------


@pytest.fixture
def deployed(tmp_path: Path) -> Path:
    """The float32 seeds' graph converted to float16 by onnxruntime's converter, its inputs and outputs kept float32."""
    path = tmp_path / "lnmm_fp16.onnx"
    onnx.save(convert_half(models.layer_norm_matmul_add(dtype="float32"), (), dtype="float16", keep_io_types=True), str(path))
    return path


def test_diff_compares_outputs_and_names_the_first_divergence(lnmm32: Path, deployed: Path, cli: Callable[..., Any]) -> None:
    # float32 outputs of a float16 computation (keep_io_types=True): judged as float16, as check_deployment judges it
    out = cli("diff", str(lnmm32), str(deployed), *DIMS)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        f"{lnmm32} -> {deployed}: onnxruntime CPU, the same feeds (dims {{'a': 2, 'b': 8, 'c': 16}}, seed 0), outputs compared as float16 "
        "(the deployed model's compute dtype: it computes in float16 behind its outputs' dtype)"
    )
    assert lines[1] == "outputs within the tolerance (atol=0.01 rtol=0.01)"
    tight = cli("diff", str(lnmm32), str(deployed), *DIMS, "--atol", "1e-4", "--rtol", "1e-4")
    assert tight.returncode == 1, tight.stderr
    lines = tight.stdout.splitlines()
    assert lines[1] == "outputs moved beyond the tolerance (atol=0.0001 rtol=0.0001):"
    assert lines[2].startswith("  - Z: ") and "exceed atol=0.0001 + rtol=0.0001*|expected|" in lines[2]
    assert "output 'Z'  float16[2x8x16]  n=256" in lines
    assert "node by node (the values of the two graphs aligned):" in lines
    assert any(line.startswith("first divergence beyond tolerance: row ") and "'norm' (LayerNormalization)" in line for line in lines), lines


def test_diff_and_check_deployment_give_one_verdict(lnmm32: Path, deployed: Path, cli: Callable[..., Any]) -> None:
    """The command line and the fixture's check_deployment judge one deployment alike (a new user met them
    disagreeing on a keep_io_types float16 conversion: float32 on the command line, float16 in the fixture)."""
    from pytest_ortdiff.analyses.align import check_deployment
    from pytest_ortdiff.numerics.tolerance import Tolerance

    feeds = {k: v.numpy() for k, v in models.random_feeds(onnx.load(str(lnmm32)), dims={"a": 2, "b": 8, "c": 16}, seed=0).items()}
    for tol, flags in ((None, []), (Tolerance(atol=1e-4, rtol=1e-4), ["--atol", "1e-4", "--rtol", "1e-4"])):
        report = check_deployment(str(lnmm32), str(deployed), feeds, tolerance=tol)
        out = cli("diff", str(lnmm32), str(deployed), *DIMS, *flags, "--json")
        data = json.loads(out.stdout)
        assert (data["passed"], data["dtype"], data["compute_dtype"]) == (report.passed, report.dtype, report.compute_dtype) == (tol is None, "float16", "float16")
        assert out.returncode == (0 if report.passed else 1)


def _scaled(path: Path, factor: float) -> Path:
    """X[a, 16] -> Mul(factor) -> Z: a model, and (factor != 1) its deployment that moved the numbers."""
    k = onnx.numpy_helper.from_array(np.array(factor, np.float32), "k")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "k"], ["Z"])], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", 16])],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["a", 16])], [k],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_diff_failing_at_the_default_tolerance_says_how_to_give_one(tmp_path: Path, cli: Callable[..., Any]) -> None:
    original, moved = _scaled(tmp_path / "one.onnx", 1.0), _scaled(tmp_path / "moved.onnx", 1.01)
    out = cli("diff", str(original), str(moved), "--dim", "a=4")
    assert out.returncode == 1, out.stderr
    hint = (
        "  (that is float32's default tolerance; a deployment step such as quantization moves outputs by design: "
        "give the one it is allowed, e.g. --atol 0.01 --rtol 0.01 or --budget 0.01:0.001)"
    )
    assert hint in out.stdout.splitlines()
    given = cli("diff", str(original), str(moved), "--dim", "a=4", "--atol", "1e-6")
    assert given.returncode == 1 and "default tolerance" not in given.stdout


def test_diff_of_models_taking_different_inputs_is_one_error_line(lnmm32: Path, tmp_path: Path, cli: Callable[..., Any]) -> None:
    """Same input names, another width (a user's diff of two unrelated exports): one line, exit 2 (1 would read as 'the numbers moved')."""
    wide = tmp_path / "wide.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Z"])], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b", 64])], [helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["a", "b", 64])]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(wide))
    narrow = tmp_path / "narrow.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["X"], ["Z"])], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["a", "b", 32])], [helper.make_tensor_value_info("Z", TensorProto.FLOAT, ["a", "b", 32])]
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(narrow))
    for flags in ([], ["--json"]):
        out = cli("diff", str(narrow), str(wide), "--dim", "a=2", "--dim", "b=3", *flags)
        assert out.returncode == 2 and out.stdout == "", out.stdout
        assert out.stderr.startswith(f"error: {wide} does not take the inputs drawn for {narrow}: feed 'X' has shape (2, 3, 32), the model declares float32[a, b, 64] (axis 2 must be 64);")
        assert len(out.stderr.splitlines()) == 1 and "Traceback" not in out.stderr


def test_diff_of_two_unrelated_models_is_one_error_line(lnmm32: Path, tmp_path: Path, cli: Callable[..., Any]) -> None:
    other = _no_kernel(tmp_path / "qg.onnx")
    out = cli("diff", str(lnmm32), str(other), *DIMS)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"error: {other} has 1 input(s) (X) and {lnmm32} 5 (X, scale, bias, weights, bias2):")


# -- precision: --missing, the samples' wording -------------------------------------------------------------


def test_precision_missing_ort_and_samples(tmp_path: Path, cli: Callable[..., Any]) -> None:
    path = _no_kernel(tmp_path / "qg.onnx")
    out = cli("precision", str(path), "--dim", "a=2")
    assert out.returncode == 2 and out.stderr.startswith("error: no torch kernel for com.microsoft::Trilu (opset 1); run it with onnxruntime instead:")
    out = cli("precision", str(path), "--dim", "a=2", "--missing", "ort", "--samples", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == f"{path}: 2 samples (seeds 0 and 1), dims {{'a': 2}}; ops without a torch kernel on onnxruntime"


# -- names from a model file never reach the terminal raw (issue 29 item 5) ---------------------------------


def test_names_from_a_model_file_are_escaped_in_errors(tmp_path: Path, cli: Callable[..., Any]) -> None:
    name = "x\x1b]0;pwned\x07\x1b[2J"
    path = _no_kernel(tmp_path / "evil.onnx", name=name)
    for argv in (["compare", str(path)], ["precision", str(path)], ["blame", str(path)], ["compare", str(path), "--dim", "a=2", "--input-range", "nope=0:1"]):
        out = cli(*argv)
        assert out.returncode == 2 and "\x1b" not in out.stderr and "\x07" not in out.stderr, (argv, out.stderr)
        assert out.stderr.count("\n") == 1
    assert "its inputs: x\\x1b]0;pwned\\x07\\x1b[2J" in cli("compare", str(path), "--dim", "a=2", "--input-range", "nope=0:1").stderr


# -- .npz feeds from someone else (issue 29 item 8) ------------------------------------------------------------


def _npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    header = f"{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape!r}, }}".encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def test_npz_member_claiming_1e13_elements_is_one_error_line(tmp_path: Path, cli: Callable[..., Any]) -> None:
    path = _no_kernel(tmp_path / "qg.onnx")
    for member in ("junk", "X"):
        npz = tmp_path / f"{member}.npz"
        with zipfile.ZipFile(npz, "w") as z:
            if member == "junk":  # (an input as it should be, and a member claiming 40 TB beside it)
                z.writestr("X.npy", _npy_header((2, 4)) + np.zeros((2, 4), np.float32).tobytes())
            z.writestr(f"{member}.npy", _npy_header((10**13,)))
        assert npz.stat().st_size < 600
        out = cli("compare", str(path), "--missing", "ort", "--feeds", str(npz))
        assert out.returncode == 2 and out.stdout == "", out.stderr
        if member == "junk":
            assert out.stderr == f"error: --feeds {npz}: 'junk' is not an input of the model; its inputs: X: float32[a, 4]\n"
        else:
            assert out.stderr == (
                f"error: --feeds {npz}: 'X' claims shape (10000000000000,) of float32: 40,000,000,000,000 bytes, "
                "more than --feeds reads (2,147,483,648 bytes a member)\n"
            )


def test_npz_with_an_unused_deflated_member_is_refused_before_inflating(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """A 1 MB file with an unused 1 GiB member took 1.26 GiB before the tool said the member is not an input:
    here 64 MiB, and the refusal costs under 4 MiB."""
    path = _no_kernel(tmp_path / "qg.onnx")
    npz = tmp_path / "bomb.npz"
    with zipfile.ZipFile(npz, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("X.npy", _npy_header((2, 4)) + np.ones((2, 4), np.float32).tobytes())
        with z.open("unused.npy", "w", force_zip64=True) as f:
            f.write(_npy_header((16 * 2**20,)))
            for _ in range(64):
                f.write(bytes(2**20))
    assert npz.stat().st_size < 2**20
    tracemalloc.start()
    try:
        out = cli("compare", str(path), "--missing", "ort", "--feeds", str(npz))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out.returncode == 2 and out.stderr == f"error: --feeds {npz}: 'unused' is not an input of the model; its inputs: X: float32[a, 4]\n"
    assert peak < 4 * 2**20, peak


def test_cuda_on_the_cpu_wheel_names_the_gpu_wheel(lnmm32: Path, cli: Callable[..., Any]) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    out = cli("compare", str(lnmm32), *DIMS, "--provider", "CUDA")
    assert out.returncode == 2
    assert out.stderr == (
        "error: --provider CUDA: CUDAExecutionProvider not available; available: CPU (this onnxruntime is the CPU build: for CUDA, "
        "pip uninstall onnxruntime && pip install pytest-ortdiff[gpu], i.e. onnxruntime-gpu)\n"
    )


# -- an adversarial pass over the command line (after issue 30) -------------------------------------------------


def _one_node(path: Path, op: str, out_type: int = TensorProto.FLOAT, shape: tuple[Any, ...] = (2, 4), opset: int = 19, **attrs: Any) -> Path:
    """x: float32[shape] -> op -> y: a model of one node, saved at `path`."""
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", out_type, list(shape))],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def test_write_converted_never_costs_a_file(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """`precision M --write-converted M` replaced the model with its conversion; `--write-converted notes.py`
    overwrote a text file; an empty path wrote nothing and passed. Each is refused before the search."""
    model = _one_node(tmp_path / "relu.onnx", "Relu")
    before = model.read_bytes()
    notes = tmp_path / "notes.py"
    notes.write_text("print('important')\n")
    (tmp_path / "outdir").mkdir()
    cases = {
        str(model): "is the model being converted: writing there would replace it; give the converted model a path of its own",
        str(notes): "holds a file that is not an ONNX model, so it is not overwritten: give the converted model a path of its own",
        "": ": an empty path; give the file to write, e.g. --write-converted model_fp16.onnx",
        str(tmp_path / "outdir"): "is a directory; give the file to write in it",
    }
    for out, message in cases.items():
        res = cli("precision", str(model), "--write-converted", out)
        assert res.returncode == 2 and res.stdout == "", res.stdout
        assert res.stderr.startswith(f"error: --write-converted {out!r}") and message in res.stderr, res.stderr
    assert model.read_bytes() == before and notes.read_text() == "print('important')\n"
    # an ONNX model there (an earlier conversion) is replaced, as asked
    old = _one_node(tmp_path / "old16.onnx", "Neg")
    res = cli("precision", str(model), "--write-converted", str(old))
    assert res.returncode == 0 and res.stdout.rstrip().endswith(f"wrote {old}"), res.stderr
    assert [n.op_type for n in onnx.load(str(old)).graph.node] != ["Neg"]


def test_count_arguments_are_counts(tmp_path: Path, cli: Callable[..., Any]) -> None:
    model = str(_one_node(tmp_path / "relu.onnx", "Relu"))
    for argv, message in (
        (["blame", model, "--top", "-1"], "argument --top: -1: expected 0 or more rows"),
        (["diff", model, model, "--around", "-3"], "argument --around: -3: expected 0 or more rows"),
        (["precision", model, "--samples", "100000000"], "error: --samples 100000000: expected 1 to 1,000 samples"),
    ):
        res = cli(*argv)
        assert res.returncode == 2 and message in res.stderr, res.stderr


def test_nothing_compared_is_never_a_pass(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """`diff zero.onnx zero.onnx` (every output empty) passed; blame said 'no discrepancy'."""
    from pytest_ortdiff.analyses.align import check_deployment

    zero = _one_node(tmp_path / "zero.onnx", "Relu", shape=(0, 4))
    res = cli("diff", str(zero), str(zero))
    assert res.returncode == 1
    assert res.stdout.splitlines()[1:3] == [
        "nothing compared:",
        "  - compared 0 elements: every output is empty (y: float32[0x4]) for the feeds given (empty: x [0, 4]); feed a non-empty input",
    ]
    assert json.loads(cli("diff", str(zero), str(zero), "--json").stdout)["passed"] is False
    assert not check_deployment(str(zero), str(zero), {"x": np.zeros((0, 4), np.float32)}).passed
    blamed = cli("blame", str(zero))
    assert "  compared 0 elements (every output is empty on these feeds): nothing to blame; feed inputs whose outputs have elements" in blamed.stdout.splitlines()
    assert "no discrepancy" not in blamed.stdout


def test_a_budget_threshold_given_twice_is_refused(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """`--budget 0.1:0 --budget 0.1:0.5`: the later rule replaced the stricter one, silently."""
    model = str(_one_node(tmp_path / "sig.onnx", "Sigmoid"))
    res = cli("compare", model, "--budget", "0.1:0", "--budget", "0.1:0.5")
    assert (res.returncode, res.stderr) == (2, "error: --budget '0.1:0.5': the threshold 0.1 is given twice, with 0 and 0.5: give it once\n")
    assert cli("compare", model, "--budget", "0.1:0", "--budget", "0.1:0").returncode == 0  # (the same rule twice is the rule)


def test_outputs_of_any_dtype_are_compared_or_named(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """float8 outputs crashed blame and diff ("unknown dtype 'float8_e4m3fn'"); string outputs were a TypeError."""
    f8 = str(_one_node(tmp_path / "f8.onnx", "Cast", out_type=TensorProto.FLOAT8E4M3FN, to=TensorProto.FLOAT8E4M3FN))
    res = cli("blame", f8)
    assert res.returncode == 0 and "blame: torch evaluator vs onnxruntime CPU float32: gap max abs 0, 0/8 elements differ" in res.stdout, res.stderr
    res = cli("diff", f8, f8, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["outputs"] == [{"original": "y", "deployed": "y", "compared_as": "float32"}]
    text = str(_one_node(tmp_path / "text.onnx", "Cast", out_type=TensorProto.STRING, to=TensorProto.STRING))
    relu = str(_one_node(tmp_path / "relu.onnx", "Relu"))
    for argv in (["compare", text], ["blame", text], ["precision", text], ["diff", relu, text]):
        res = cli(*argv)
        assert res.returncode == 2 and res.stderr == (
            f"error: {text}: output 'y' is a string tensor; the commands compare tensors of numbers (and bools): "
            "compare the graph up to the node that makes strings (onnx.utils.extract_model)\n"
        ), (argv, res.stderr)


def test_feeds_that_are_not_numbers_are_named(tmp_path: Path, cli: Callable[..., Any]) -> None:
    relu = str(_one_node(tmp_path / "relu.onnx", "Relu"))
    for array, what in (
        (np.array([["a"] * 4] * 2), "<U1 values (text)"),
        (np.zeros((2, 4), "datetime64[s]"), "datetime64[s] values (dates)"),
        (np.zeros((2, 4), np.complex64), "complex64 values (complex numbers)"),
        (np.zeros((2, 4), [("a", "<f4")]), "values (raw bytes or records)"),
    ):
        path = tmp_path / "feeds.npz"
        np.savez(path, x=array)
        res = cli("compare", relu, "--feeds", str(path))
        assert res.returncode == 2 and res.stderr.startswith(f"error: --feeds {path}: 'x' holds "), res.stderr
        assert f"{what}; the model declares float32[2, 4]: save it as an array of that dtype" in res.stderr


def test_a_model_path_that_is_not_a_regular_file_is_refused(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """`compare /dev/zero` read without end; `compare FIFO` waited forever."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        res = cli("compare", path)
        assert (res.returncode, res.stderr) == (2, f"error: model file {path!r} is not a regular file (a device, a pipe or a socket): save it to a file first\n")


def test_json_is_strict_with_infinite_numbers(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """`--atol inf --json` printed bare `Infinity`, which strict parsers refuse."""
    model = str(_one_node(tmp_path / "sig.onnx", "Sigmoid"))

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))

    for argv in (["compare", model], ["blame", model], ["diff", model, model]):
        res = cli(*argv, "--atol", "inf", "--json")
        assert res.returncode == 0, res.stderr
        assert strict(res.stdout)["tolerance"]["atol"] == "inf"


def test_bfloat16_blame_without_a_kernel_is_one_line(tmp_path: Path, cli: Callable[..., Any]) -> None:
    model = str(_one_node(tmp_path / "relu.onnx", "Relu"))
    res = cli("blame", model, "--dtype", "bfloat16")
    assert res.returncode == 2 and res.stderr == (
        "error: CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for Relu(14), so there is nothing to compare the torch "
        "evaluator with: use a provider that has it (e.g. --provider CUDA) or another --dtype\n"
    )


def test_compare_and_blame_say_a_float16_model_behind_float32_io_is_judged_as_float16(lnmm32: Path, deployed: Path, cli: Callable[..., Any]) -> None:
    """The first line said 'float32' and the tolerance float32's while the check judged in float16."""
    for command in ("compare", "blame"):
        res = cli(command, str(deployed), *DIMS)
        assert res.returncode == 0, res.stderr
        assert "CPU float32 (judged as float16: the model computes in float16 behind float32 inputs and outputs), dims" in res.stdout.splitlines()[0]
        data = json.loads(cli(command, str(deployed), *DIMS, "--json").stdout)
        assert (data["dtype"], data["judged_dtype"], data["tolerance"]["text"]) == ("float32", "float16", "atol=0.01 rtol=0.01")
    assert cli("compare", str(deployed), *DIMS).stdout.splitlines()[1] == "passed (atol=0.01 rtol=0.01)"


# -- a review of the above ---------------------------------------------------------------------------------


def _scaled_matmul(path: Path, scale: float, half: bool) -> Path:
    """y = (x @ W) * scale, x: float32[1, 64]; `half`: the MatMul in float16 (float16 weights, most of the
    model's: its compute dtype), the scale in float32 after it, as a deployment of the float32 graph."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 1.0, (64, 64)).astype(np.float16 if half else np.float32)
    nodes = [helper.make_node("Cast", ["x"], ["xh"], to=TensorProto.FLOAT16), helper.make_node("MatMul", ["xh", "W"], ["th"]),
             helper.make_node("Cast", ["th"], ["t"], to=TensorProto.FLOAT)] if half else [helper.make_node("MatMul", ["x", "W"], ["t"])]  # fmt: skip
    nodes.append(helper.make_node("Mul", ["t", "s"], ["y"]))
    inits = [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(np.array(scale, np.float32), "s")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_outputs_beyond_the_compute_dtypes_range_are_not_judged_in_it(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """A float16 MatMul then a float32 scale that is 10 % off: both sides' outputs (~2e5) are beyond float16's
    range, and judged in it they saturated to 65504 on both sides: the diff passed. Now judged as float32."""
    from pytest_ortdiff.analyses.align import check_deployment

    original = _scaled_matmul(tmp_path / "orig.onnx", 1000.0, half=False)
    deployed = _scaled_matmul(tmp_path / "deployed.onnx", 1100.0, half=True)
    res = cli("diff", str(original), str(deployed), "--input-range", "x=1:2")
    assert res.returncode == 1, res.stdout
    assert res.stdout.splitlines()[0].endswith("outputs compared as float32")
    report = check_deployment(str(original), str(deployed), {"x": np.random.default_rng(0).uniform(1, 2, (1, 64)).astype(np.float32)})
    assert (report.passed, report.dtype, report.compute_dtype) == (False, "float32", None)
    assert report.notes == ("outputs hold values beyond float16's range (the deployed model computes in float16, then scales in a wider dtype): judged as float32",)


def test_write_converted_reads_what_is_there_as_protobuf_whatever_its_name(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """An existing y.json made onnx.load parse it as JSON: a ParseError traceback; a large TensorProto file (first
    byte 0x08, as a model's) would have been taken for a model."""
    from pytest_ortdiff.cli import _is_onnx_model, _model_header

    model = _one_node(tmp_path / "relu.onnx", "Relu")
    for name, text in (("y.json", '{"a": 1}'), ("x.textproto", "ir_version: 9"), ("x.onnxtxt", "<ir_version: 9> g (float x) => (float y) { y = Relu(x) }")):
        (tmp_path / name).write_text(text)
        res = cli("precision", str(model), "--write-converted", str(tmp_path / name))
        assert res.returncode == 2 and "holds a file that is not an ONNX model, so it is not overwritten" in res.stderr, res.stderr
    tensor = onnx.numpy_helper.from_array(np.zeros((64, 64), np.float32)).SerializeToString()
    assert not _model_header(tensor[:32]) and _model_header(onnx.load(str(model)).SerializeToString()[:32])
    (tmp_path / "input_0.pb").write_bytes(tensor)
    assert not _is_onnx_model(str(tmp_path / "input_0.pb"))


def test_precision_into_a_closed_pipe_still_writes_the_model(tmp_path: Path) -> None:
    model = _one_node(tmp_path / "relu.onnx", "Relu")
    out = tmp_path / "relu16.onnx"
    argv = [sys.executable, "-m", "pytest_ortdiff", "precision", str(model), "--samples", "1", "--write-converted", str(out)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # (before the first line: the report and the "wrote" line go into a closed pipe)
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141 and err == "", err
    assert out.exists() and onnx.load(str(out)).graph.node
