"""The pytest-free core: Checker's typed results and domain exceptions (what the fixture and the command line
turn into failures, skips and error lines), and model_io's one message per bad model or feed."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from pytest_ortdiff import Checker, models
from pytest_ortdiff.analyses.fuzz import FuzzResult, fuzz
from pytest_ortdiff.engine.baseline import BaselineOutcome
from pytest_ortdiff.engine.blame import BlameTable
from pytest_ortdiff.engine.check import (
    BaselineFailed,
    CheckResult,
    MissingKernel,
    NotReproducible,
    OrtRunError,
    ToleranceBroken,
    UnsupportedByProvider,
)
from pytest_ortdiff.engine.reproducible import ReproducibilityReport
from pytest_ortdiff.runtimes.model_io import (
    InvalidModelError,
    check_feeds,
    check_model,
    input_specs,
    load_model,
    session_input_specs,
)
from pytest_ortdiff.runtimes.ort import OrtRunner

DIMS = {"a": 1, "b": 2, "c": 4}
SHIFTED = {("", "MatMul"): lambda x, w: torch.matmul(x, w) + 0.5}


@pytest.fixture(scope="module")
def seed() -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    model = models.layer_norm_matmul_add(dtype="float32")
    return model, models.random_feeds(model, dims=DIMS, seed=0)


def test_check_returns_a_typed_result_and_breaks_with_it(seed: tuple[onnx.ModelProto, dict[str, torch.Tensor]]) -> None:
    model, feeds = seed
    checker = Checker("cpu", "fp32")
    assert (checker.provider, checker.dtype, checker.tolerance.describe()) == ("CPU", "float32", "atol=0.0001 rtol=0.0001")
    result = checker.check(model, feeds)
    assert isinstance(result, CheckResult) and result.passed and result.report.max_abs < 1e-4
    assert list(result.outputs) == ["Z"] and result.outputs["Z"].shape == (1, 2, 4)
    (row,) = result.rows()
    assert (row.provider, row.dtype, row.passed, row.suffix, row.max_abs) == ("CPU", "float32", True, "", result.report.max_abs)
    with pytest.raises(ToleranceBroken) as info:
        checker.check(model, feeds, kernels=SHIFTED, reference="float64")
    broken = info.value.result
    assert isinstance(broken, CheckResult) and not broken.passed and str(info.value) == broken.render()
    # kernels= shift the oracle too: against it, the torch evaluator passes and onnxruntime breaks
    assert [j.passed for j in broken.judgements] == [False, True]
    assert [r.suffix for r in broken.rows()] == [" [ort vs float64]", " [torch vs float64]"]
    assert broken.closer == "torch"
    assert str(info.value).startswith("ortdiff: float64 oracle vs onnxruntime CPU float32: tolerance broken (atol=0.0001 rtol=0.0001)\n  - Z: 8 of 8 elements")
    assert "\ncloser to the float64 oracle: torch evaluator (onnxruntime: max " in str(info.value)


def test_holes_missing_kernels_and_onnxruntime_errors_are_domain_exceptions(
    seed: tuple[onnx.ModelProto, dict[str, torch.Tensor]], contrib_model: Callable[..., onnx.ModelProto], tmp_path: Path
) -> None:
    model, feeds = seed
    bf16 = models.layer_norm_matmul_add(dtype="bfloat16")
    with pytest.raises(UnsupportedByProvider) as hole:
        Checker("CPU", "bfloat16").check(bf16, models.random_feeds(bf16, dims=DIMS, seed=0))
    assert (hole.value.provider, hole.value.dtype) == ("CPU", "bfloat16")
    assert re.fullmatch(r"\w+\(\d+\)", hole.value.op), hole.value.op
    assert hole.value.reason == f"CPU-bfloat16: onnxruntime CPUExecutionProvider has no bfloat16 kernel for {hole.value.op}"
    x = {"x": torch.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])}
    checker = Checker("CPU", "float32")
    with pytest.raises(MissingKernel) as missing:
        checker.check(contrib_model(), x)
    assert missing.value.ops == ("com.microsoft::Inverse", "com.microsoft::Trilu")  # type: ignore[attr-defined]
    result = checker.check(contrib_model(relu=True), x, missing="ort")
    assert result.report.is_exact and result.ran_on_ort == ("com.microsoft::Inverse", "com.microsoft::Trilu")
    assert result.rows()[0].ran_on_ort == result.ran_on_ort
    (y,) = checker.run(contrib_model(), x, runtime="float64", missing="ort")
    assert y.dtype == torch.float64
    # ids out of an embedding table: onnxruntime's run-time error, as one domain exception
    table = numpy_helper.from_array(np.zeros((2, 3), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"])], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=[table],
    )
    gather = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(OrtRunError, match=r"^onnxruntime CPUExecutionProvider cannot run the model: .*indices element out of data bounds") as err:
        checker.check(gather, {"ids": torch.tensor([0, 7])})
    assert "\n" not in err.value.detail
    with pytest.raises(ValueError, match=r"missing must be 'error' .* or 'ort'"):
        checker.run(model, feeds, runtime="torch", missing="skip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runtime must be 'ort', 'torch' or 'float64', got 'onnx'"):
        checker.run(model, feeds, runtime="onnx")  # type: ignore[arg-type]


def test_baseline_reproducible_blame_and_fuzz_return_typed_results(seed: tuple[onnx.ModelProto, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    model, feeds = seed
    checker = Checker("CPU", "float32")
    path = tmp_path / "t.out.npz"
    with pytest.raises(BaselineFailed) as missing:
        checker.check_baseline(path, {"Z": torch.ones(3)}, name="out", test="t.py::t")
    assert isinstance(missing.value.result, BaselineOutcome) and missing.value.result.action == "missing"
    assert checker.check_baseline(path, {"Z": torch.ones(3)}, name="out", update=True).action == "created"
    assert checker.baseline_row(checker.check_baseline(path, {"Z": torch.ones(3)}, name="out"), "out") is not None
    with pytest.raises(BaselineFailed, match="drifted") as drift:
        checker.check_baseline(path, {"Z": torch.full((3,), 2.0)}, name="out")
    row = checker.baseline_row(drift.value.result, "out")
    assert row is not None and (row.suffix, row.passed, row.tolerance, row.max_abs) == (" [baseline out]", False, "bitwise", 1.0)
    report = checker.check_reproducible(model, feeds, runs=2, vary=("threads",))
    assert isinstance(report, ReproducibilityReport) and report.reproducible
    assert checker.reproducible_row(report).suffix == " [reproducible]"
    with pytest.raises(NotReproducible) as noisy:
        checker.check_reproducible(model, feeds, runs=2, vary=(), torch_deterministic=True, kernels={("", "MatMul"): _noisy_matmul()})
    assert isinstance(noisy.value.result, ReproducibilityReport) and not noisy.value.result.reproducible
    table = checker.blame(model, feeds)
    assert isinstance(table, BlameTable) and {r.node for r in table.rows} == {n.name or f"{n.op_type}_{i}" for i, n in enumerate(model.graph.node)}
    stats = fuzz(checker, models.layer_norm_matmul_add, dims={"c": (1, 8)}, max_examples=3)
    assert isinstance(stats, FuzzResult) and stats.passed and stats.examples == stats["examples"] == 3
    row = stats.row()
    assert row is not None and row.suffix == " [fuzz]" and row.max_abs == stats.max_abs


def _noisy_matmul() -> Callable[..., torch.Tensor]:
    calls = [0]

    def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return torch.matmul(x, w) + calls[0] * 1e-3  # a different result every run

    return matmul


def test_one_message_per_bad_model_or_feed(seed: tuple[onnx.ModelProto, dict[str, torch.Tensor]], tmp_path: Path) -> None:
    model, feeds = seed
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.node[0].input.append("nowhere")
    with pytest.raises(InvalidModelError) as info:
        check_model(bad)
    assert str(info.value).startswith("the model fails onnx.checker: Nodes in a graph must be topologically sorted, however input 'nowhere' of node:")
    assert str(info.value).endswith("is not output of any previous nodes; fix the graph") and "\n" not in str(info.value)
    path = tmp_path / "bad.onnx"
    onnx.save(bad, str(path))
    with pytest.raises(InvalidModelError, match=f"^{re.escape(str(path))} fails onnx.checker: Nodes in a graph"):
        check_model(load_model(path), subject=str(path))
    with pytest.raises(InvalidModelError, match=r"^the model fails onnx\.checker: Nodes"):  # through the Checker too
        Checker("CPU", "float32").run(bad, feeds)
    # feeds: the evaluator's messages, checked before any runtime sees them
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({k: v for k, v in feeds.items() if k != "X"} | {"x": feeds["X"]}, ValueError, "feeds do not match the model's inputs: missing ['X'], unknown ['x']; inputs are X: float32[a, b, c], "),
        ({**feeds, "X": feeds["X"].half()}, TypeError, "feed 'X' has dtype float16, the model declares float32[a, b, c]; cast it (e.g. .to(torch.float32))"),
        ({**feeds, "X": feeds["X"].numpy().astype(np.float64)}, TypeError, "feed 'X' has dtype float64, the model declares float32[a, b, c]; cast it (e.g. .astype(numpy.float32))"),
        ({**feeds, "X": feeds["X"][0]}, ValueError, "feed 'X' has shape (2, 4) (rank 2), the model declares float32[a, b, c]"),
        ({**feeds, "X": None}, TypeError, "feed 'X' is None; pass a torch tensor or numpy array"),
    ]
    for bad_feeds, kind, message in cases:
        with pytest.raises(kind, match=f"^{re.escape(message)}"):
            check_feeds(model, bad_feeds)
    # a runner holding only an onnxruntime session checks through the same specs
    assert session_input_specs(OrtRunner(model).session.get_inputs()) == input_specs(model)
    fixed = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])]))
    with pytest.raises(ValueError, match=re.escape("feed 'x' has shape (2, 5), the model declares float32[n, 4] (axis 1 must be 4)")):
        check_feeds(fixed, {"x": torch.zeros(2, 5)})


def test_an_int64_kernel_off_by_one_above_2_53_fails_the_check() -> None:
    """Issue 12, item 1: integer outputs compare exactly in check(), also where float64 cannot tell them apart."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [1])
    model = helper.make_model(helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "neg", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": torch.tensor([-(2**53) - 1])}
    off_by_one = {("", "Neg"): lambda t: -t - 1}
    with pytest.raises(ToleranceBroken, match=r"1 of 1 elements differ; integer outputs compare exactly; worst at \(0\): expected 9007199254740992, got 9007199254740993") as broken:
        Checker("CPU", "float32").check(model, feeds, kernels=off_by_one)
    assert broken.value.result.report.mismatches == 1


def _weights_model(seed: int, n: int = 1 << 16) -> onnx.ModelProto:
    """y = x + w with a 256 KiB initializer w: distinct per seed."""
    w = numpy_helper.from_array(np.full(n, seed, np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], f"weights{seed}", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_session_and_evaluator_caches_are_bounded_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 12, item 16: $ORTDIFF_CACHE_MB bounds the bytes of models cached, not their count."""
    from pytest_ortdiff.engine import check as check_module
    from pytest_ortdiff.runtimes import ort

    monkeypatch.setenv("ORTDIFF_CACHE_MB", "1")  # room for 3 of the 256 KiB models, not 6
    monkeypatch.setattr(ort, "_SESSIONS", type(ort._SESSIONS)())
    monkeypatch.setattr(check_module, "_EVALUATORS", type(check_module._EVALUATORS)())
    checker = Checker("CPU", "float32")
    feeds = {"x": torch.zeros(1 << 16)}
    for seed in range(6):
        model = _weights_model(seed)
        (out,) = checker.run(model, feeds)
        checker.run(model, feeds, runtime="torch")
        assert float(out[0]) == seed
    for cache in (ort._SESSIONS, check_module._EVALUATORS):
        assert 1 <= len(cache) <= 3 and sum(size for _, size in cache.values()) <= 1 << 20
    # the most recent model stays whatever the bound
    monkeypatch.setenv("ORTDIFF_CACHE_MB", "0")
    checker.run(_weights_model(7), feeds)
    assert len(ort._SESSIONS) == 1
    monkeypatch.setenv("ORTDIFF_CACHE_MB", "lots")
    with pytest.raises(ValueError, match=r"\$ORTDIFF_CACHE_MB: expected a number of MiB such as 512 \(0: keep only the latest model\), got 'lots'"):
        checker.run(_weights_model(8), feeds)


# -- a check that compared nothing (issue 29, item 7) -----------------------------------------------------


def _relu2(second: str = "w") -> onnx.ModelProto:
    """y = Relu(x) of shape (n, 4), z = Relu(w) of shape (m, 2)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", [second], ["z"])],
        "relu2",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]), helper.make_tensor_value_info("w", TensorProto.FLOAT, ["m", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]), helper.make_tensor_value_info("z", TensorProto.FLOAT, ["m", 2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


EMPTY = "compared 0 elements: every output is empty (y: float32[0x4], z: float32[0x2]) for the feeds given (empty: x [0, 4], w [0, 2]); feed a non-empty input"


@pytest.mark.parametrize("reference", ["torch", "float64"])
def test_a_check_that_compared_nothing_fails(reference: str) -> None:
    from pytest_ortdiff.engine.check import NothingCompared

    checker = Checker("CPU", "float32")
    with pytest.raises(NothingCompared) as info:
        checker.check(_relu2(), {"x": torch.zeros(0, 4), "w": torch.zeros(0, 2)}, reference=reference)  # type: ignore[arg-type]
    assert isinstance(info.value, ToleranceBroken)  # (caught as a broken check wherever one is)
    result = info.value.result
    assert not result.passed and all(not j.passed for j in result.judgements)
    assert [str(v) for v in result.violations] == [EMPTY] * len(result.judgements)
    assert str(info.value).splitlines()[:2] == [f"ortdiff: {result.judgements[0].title} CPU float32: compared 0 elements, not a pass", f"  - {EMPTY}"]
    for row in result.rows():
        assert (row.passed, row.max_abs, row.worst) == (False, None, EMPTY)


def test_baseline_and_reproducibility_checks_of_nothing_fail(tmp_path: Path) -> None:
    """As a check: a baseline of empty outputs, or bitwise identical runs of empty outputs, compared 0 elements,
    which is not a pass; nothing is written."""
    checker = Checker("CPU", "float32")
    with pytest.raises(ValueError, match=r"check_baseline\('y', \.\.\.\): every output is empty \(y \[0, 4\]\): a baseline of 0 elements compares nothing; feed a non-empty input"):
        checker.check_baseline(tmp_path / "y.npz", {"y": torch.zeros(0, 4)}, name="y", update=True)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"check_reproducible: compared 0 elements: every output is empty for the feeds given \(x \[0, 4\], w \[0, 2\]\)"):
        checker.check_reproducible(_relu2(), {"x": torch.zeros(0, 4), "w": torch.zeros(0, 2)}, runs=2)
    # one empty output beside others is compared (by shape) as the check does
    report = checker.check_reproducible(_relu2(), {"x": torch.zeros(0, 4), "w": torch.ones(3, 2)}, runs=2)
    assert report.reproducible


def test_outputs_empty_in_both_runtimes_beside_others_are_compared_by_shape_and_named() -> None:
    """An output empty for these feeds (no detection in this image) while another has elements: the check judges
    the elements there are, the empty output's shape must agree, and the report names it."""
    result = Checker("CPU", "float32").check(_relu2(), {"x": torch.zeros(0, 4), "w": torch.ones(3, 2)})
    assert result.passed and result.report.n == 6
    assert "empty in both runtimes (shapes compared, no values): y float32[0x4]" in result.render()


def test_compare_on_an_empty_feed_exits_1_saying_nothing_was_compared(cli: Callable[..., Any], tmp_path: Path) -> None:
    onnx.save(_relu2(), str(tmp_path / "relu2.onnx"))
    np.savez(tmp_path / "x.npz", x=np.zeros((0, 4), np.float32), w=np.zeros((0, 2), np.float32))
    out = cli("compare", "relu2.onnx", "--feeds", "x.npz", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "passed" not in out.stdout
    assert "ortdiff: torch evaluator vs onnxruntime CPU float32: compared 0 elements, not a pass" in out.stdout
    assert EMPTY in out.stdout


# -- models onnx.checker passes that the check tripped on (issue 29, item 12) ------------------------------


def _one_output_twice() -> onnx.ModelProto:
    """y = Relu(x), listed twice among the graph's outputs (onnx.checker accepts it)."""
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])], [y, y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _float8_output() -> onnx.ModelProto:
    """y = Cast(Relu(x), to=FLOAT8E4M3FN): a float8 output."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT8E4M3FN)],
        "f8",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [2, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model


RELU_OFF = {("", "Relu"): lambda x: torch.relu(x) + 0.5}


def test_an_output_listed_twice_is_run_and_compared() -> None:
    model, feeds = _one_output_twice(), {"x": torch.linspace(-1, 1, 8).reshape(2, 4)}
    want = torch.relu(feeds["x"])
    got = OrtRunner(model).run(None, feeds)
    assert len(got) == 2 and all(torch.equal(t, want) for t in got)  # one per graph output, as the evaluator gives
    checker = Checker("CPU", "float32")
    for runtime in ("ort", "torch", "float64"):
        outs = checker.run(model, feeds, runtime=runtime)  # type: ignore[arg-type]
        assert len(outs) == 2 and all(torch.equal(t.float(), want) for t in outs), runtime
    result = checker.check(model, feeds)
    assert result.passed and list(result.outputs) == ["y"] and result.report.n == 8
    with pytest.raises(ToleranceBroken) as info:
        checker.check(model, feeds, kernels=RELU_OFF)
    assert info.value.result.report.max_abs == pytest.approx(0.5)


def test_a_float8_output_is_compared_as_the_float32_values_it_holds() -> None:
    model, feeds = _float8_output(), {"x": torch.linspace(-2, 2, 8).reshape(2, 4)}
    checker = Checker("CPU", "float32")
    result = checker.check(model, feeds, reference="float64")
    assert result.passed and result.report.n == 8
    assert result.outputs["y"].dtype == torch.float8_e4m3fn  # (onnxruntime's outputs as they are)
    assert "compared as the float32 values they hold (each value of theirs is one): y float8_e4m3fn" in result.render()
    with pytest.raises(ToleranceBroken) as info:
        checker.check(model, feeds, kernels=RELU_OFF)
    assert info.value.result.report.max_abs >= 0.4  # (0.5, then rounded to float8)


@pytest.mark.parametrize("build", [_one_output_twice, _float8_output], ids=["output-listed-twice", "float8-output"])
def test_compare_runs_models_that_onnx_checker_passes(cli: Callable[..., Any], tmp_path: Path, build: Callable[[], onnx.ModelProto]) -> None:
    onnx.save(build(), str(tmp_path / "m.onnx"))
    out = cli("compare", "m.onnx", cwd=tmp_path)
    assert (out.returncode, out.stderr) == (0, ""), out.stdout + out.stderr
    assert "passed (atol=0.0001 rtol=0.0001)" in out.stdout and "output 'y'" in out.stdout
    if build is _float8_output:
        assert "compared as the float32 values they hold (each value of theirs is one): y float8_e4m3fn" in out.stdout


# -- the caches' bound in resident memory (issue 29, item 14) ----------------------------------------------

#: a fresh interpreter (its resident memory is this script's alone): N distinct models with an 8 MiB weight, each
#: checked against the float64 oracle (an onnxruntime session, a torch evaluator and the oracle cached per model);
#: prints the resident MiB after the warm-up and the most after any model
RSS_SCRIPT = """
import json, os, sys
import numpy as np, torch
from onnx import TensorProto, helper, numpy_helper
from pytest_ortdiff import Checker

def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def model(seed):
    w = numpy_helper.from_array(np.random.RandomState(seed).randn(1024, 2048).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], f"m{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2048])], [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

checker, feeds = Checker("CPU", "float32"), {"x": torch.randn(1, 1024)}
for seed in (1000, 1001):  # (libraries, kernels and allocators warm up)
    checker.check(model(seed), feeds, reference="float64")
base = peak = resident_mib()
for seed in range(int(sys.argv[1])):
    checker.check(model(seed), feeds, reference="float64")
    peak = max(peak, resident_mib())
print(json.dumps({"base": base, "peak": peak}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from /proc/self/statm")
def test_the_caches_hold_the_resident_memory_they_are_configured_for(tmp_path: Path) -> None:
    """24 distinct 8 MiB models with ORTDIFF_CACHE_MB=64 (two caches: sessions, evaluators): resident memory grows
    by at most the two bounds and 64 MiB for the check in progress. Before the fix it grew by 2.5x the bounds
    (a session holds the model's bytes and onnxruntime's copy of its weights, an evaluator the proto and the
    decoded weights; and memory freed by an eviction stayed resident)."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "rss.py"
    script.write_text(RSS_SCRIPT)
    env = {**os.environ, "ORTDIFF_CACHE_MB": "64", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script), "24"], env=env, capture_output=True, text=True, timeout=600, check=True)
    mib = json.loads(out.stdout.strip().splitlines()[-1])
    grown = mib["peak"] - mib["base"]
    assert grown <= 2 * 64 + 64, f"resident memory grew by {grown:.0f} MiB with two caches of 64 MiB ({mib})"


def test_closer_to_the_oracle_is_decided_at_the_outputs_scale() -> None:
    """A new user's float16 check: onnxruntime 470 raw ULPs (1 floored), 124 elements off; the evaluator 196 raw
    (1 floored), 129 off. Raw ULPs near zero are noise: the floored tie goes to the fewer elements off."""
    from types import SimpleNamespace

    from pytest_ortdiff.numerics.results import closer_to_oracle

    ort = SimpleNamespace(max_ulp=470.0, max_ulp_floored=1.0, mismatches=124)
    torch_side = SimpleNamespace(max_ulp=196.0, max_ulp_floored=1.0, mismatches=129)
    assert closer_to_oracle(ort, torch_side) == "onnxruntime"
    assert closer_to_oracle(torch_side, ort) == "torch"
    # rows read back from a file written before floored ULPs existed: the raw ones decide
    assert closer_to_oracle(SimpleNamespace(max_ulp=3.0, mismatches=1), SimpleNamespace(max_ulp=2.0, mismatches=9)) == "torch"


def test_a_tolerance_dict_with_a_misspelt_key_names_the_valid_ones() -> None:
    """tolerance={"atl": 1e-3} was Tolerance.__init__'s "unexpected keyword argument 'atl'"."""
    from pytest_ortdiff.engine.check import _as_tolerance

    with pytest.raises(TypeError, match=re.escape("tolerance: unknown key(s) ['atl'] (did you mean 'atol'?); valid: atol, rtol, max_ulp, budget")):
        _as_tolerance({"atl": 1e-3})


def test_every_node_of_the_bodies_on_onnxruntime_is_not_a_pass() -> None:
    """An If whose branches' nodes all run on onnxruntime ("ort" on the If goes to its branches) passed."""
    from onnx import TensorProto
    from onnx import helper as h

    from pytest_ortdiff import Checker
    from pytest_ortdiff.engine.check import NothingCompared

    def branch(op: str) -> onnx.GraphProto:
        return h.make_graph([h.make_node(op, ["x"], ["o_" + op])], op, [], [h.make_tensor_value_info("o_" + op, TensorProto.FLOAT, [4])])

    graph = h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=branch("Sin"), else_branch=branch("Cos"))], "g",
        [h.make_tensor_value_info("c", TensorProto.BOOL, []), h.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )  # fmt: skip
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    feeds = {"c": torch.tensor(True), "x": torch.randn(4)}
    checker = Checker("CPU", "float32")
    for kernels in ({"If": "ort"}, {"Sin": "ort", "Cos": "ort"}):
        with pytest.raises(NothingCompared, match="onnxruntime compared with itself, not a pass"):
            checker.check(model, feeds, kernels=kernels)
    assert checker.check(model, feeds, kernels={"Sin": "ort"}).passed  # (the else branch's Cos runs on torch)
