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


@pytest.mark.parametrize(
    ("opset", "complex_in", "inverse", "onesided", "length", "axis"),
    [
        (17, False, False, False, None, 1),
        (17, False, False, True, None, 1),
        (17, True, True, False, None, 1),
        (17, False, False, False, 6, 2),
        (20, False, False, True, 10, -2),
        (20, True, False, False, None, 1),
        (20, True, True, True, 8, -2),
    ],
)
def test_dft(
    opset: int, complex_in: bool, inverse: bool, onesided: bool, length: int | None, axis: int
) -> None:
    x = _f(2, 5, 8, 2 if complex_in else 1)
    inits = {} if length is None else {"n": np.array(length, dtype=np.int64)}
    attrs = {"inverse": int(inverse), "onesided": int(onesided)}
    if opset == 17:
        attrs["axis"] = axis
        model = one_node_model("DFT", {"x": x, "n": None}, ["y"], opset, initializers=inits, **attrs)
    else:
        inits["axis"] = np.array(axis, dtype=np.int64)
        model = one_node_model(
            "DFT", {"x": x, "n": None, "axis": None}, ["y"], opset, initializers=inits, **attrs
        )
    # onnxruntime's CPU DFT has no inverse-onesided (irfft) variant: onnx.reference alone there
    ref = "onnx" if inverse and onesided else "both"
    check_node(model, {"x": x}, dtypes=("float32", "float64"), reference=ref, tol={"float32": (1e-4, 1e-5)})


@pytest.mark.parametrize(("window", "onesided"), [(True, True), (False, True), (True, False)])
def test_stft(window: bool, onesided: bool) -> None:
    signal = _f(2, 64, 1)
    inits = {"step": np.array(8, dtype=np.int64)}
    if window:
        inits["window"] = np.hanning(16).astype(np.float32)
    else:
        inits["length"] = np.array(16, dtype=np.int64)
    inputs = {"signal": signal, "step": None, "window": None, "length": None}
    model = one_node_model("STFT", inputs, ["y"], 17, initializers=inits, onesided=int(onesided))
    check_node(model, {"signal": signal}, dtypes=("float32", "float64"), tol={"float32": (1e-4, 1e-5)})


def test_mel_weight_matrix() -> None:
    inits = {
        "bins": np.array(8, dtype=np.int64),
        "n": np.array(64, dtype=np.int64),
        "rate": np.array(16000, dtype=np.int64),
        "lo": np.array(0.0, dtype=np.float32),
        "hi": np.array(8000.0, dtype=np.float32),
    }
    model = one_node_model("MelWeightMatrix", {}, ["y"], 17, initializers=inits)
    (y,) = run_torch(model, {})
    assert y.shape == (33, 8) and y.dtype == np.float32
    check_node(model, {}, dtypes=("float32",))


def test_swiglu() -> None:
    a, b = _f(2, 3, 8), _f(2, 3, 8)
    model = one_node_model("SwiGLU", {"a": a, "b": b}, ["y"], 28, alpha=1.5)
    # opset 28 is newer than onnxruntime 1.32's: onnx.reference alone
    check_node(model, {"a": a, "b": b}, dtypes=("float32", "float64"), reference="onnx")
