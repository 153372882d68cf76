"""Math-family kernels beyond elementwise arithmetic: Hardmax, Acos/Acosh, Det and the two losses,
against onnx.reference, onnxruntime and the float64 oracle (tests/kernel_harness.py)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_harness import check_node, one_node_model, run_torch

_rng = np.random.default_rng(7)


def _f(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return _rng.uniform(lo, hi, size=shape).astype(np.float32)


@pytest.mark.parametrize(("opset", "axis"), [(11, 1), (11, 0), (13, -1), (13, 1)])
def test_hardmax(opset: int, axis: int) -> None:
    x = _f(2, 3, 4)
    x[0, 0, :2] = 5.0  # a tie: the first maximum wins
    model = one_node_model("Hardmax", {"x": x}, ["y"], opset, axis=axis)
    # onnx.reference applies opset 13's one-axis rule at 11 too; onnxruntime implements the 2-D coercion
    check_node(model, {"x": x}, dtypes=("float32", "float64"), reference="ort" if opset < 13 else "both")


def test_hardmax_marks_the_first_of_tied_maxima() -> None:
    x = np.array([[1.0, 3.0, 3.0, 0.0]], dtype=np.float32)
    (y,) = run_torch(one_node_model("Hardmax", {"x": x}, ["y"], 13), {"x": x})
    np.testing.assert_array_equal(y, [[0.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(("op", "lo", "hi"), [("Acos", -0.99, 0.99), ("Acosh", 1.01, 4.0)])
def test_inverse_trigonometry(op: str, lo: float, hi: float) -> None:
    x = _f(3, 5, lo=lo, hi=hi)
    check_node(one_node_model(op, {"x": x}, ["y"], 18), {"x": x})


def test_det_batched() -> None:
    x = _f(2, 3, 3)
    model = one_node_model("Det", {"x": x}, ["y"], 18)
    # onnxruntime has no float16 Det on CPU: float32 and the oracle
    check_node(model, {"x": x}, dtypes=("float32", "float64"))


@pytest.mark.parametrize(
    ("reduction", "weighted", "ignore_index", "spatial"),
    [
        ("mean", False, None, False),
        ("mean", True, None, True),
        ("sum", True, 1, False),
        ("none", False, 2, True),
        ("mean", True, 0, True),
    ],
)
def test_losses(reduction: str, weighted: bool, ignore_index: int | None, spatial: bool) -> None:
    shape = (3, 4, 2) if spatial else (3, 4)
    scores = _f(*shape)
    labels = _rng.integers(0, 4, size=(shape[0], *shape[2:])).astype(np.int64)
    labels.flat[0] = ignore_index if ignore_index is not None else 0
    inputs = {"scores": scores, "labels": labels}
    if weighted:
        inputs["w"] = _f(4, lo=0.5, hi=2.0)
    attrs = {"reduction": reduction} | ({} if ignore_index is None else {"ignore_index": ignore_index})
    sce = one_node_model("SoftmaxCrossEntropyLoss", inputs, ["loss", "log_prob"], 13, **attrs)
    check_node(sce, inputs, dtypes=("float32", "float16", "float64"))
    nll = one_node_model("NegativeLogLikelihoodLoss", inputs, ["loss"], 13, **attrs)
    check_node(nll, inputs, dtypes=("float32", "float64"))
