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
from pytest_ortdiff.baseline import BaselineOutcome
from pytest_ortdiff.blame import BlameTable
from pytest_ortdiff.check import (
    BaselineFailed,
    CheckResult,
    MissingKernel,
    NotReproducible,
    OrtRunError,
    ToleranceBroken,
    UnsupportedByProvider,
)
from pytest_ortdiff.fuzz import FuzzResult, fuzz
from pytest_ortdiff.model_io import (
    InvalidModelError,
    check_feeds,
    check_model,
    input_specs,
    load_model,
    session_input_specs,
)
from pytest_ortdiff.reproducible import ReproducibilityReport
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
    from pytest_ortdiff import check as check_module
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
