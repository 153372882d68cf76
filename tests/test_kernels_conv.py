"""The convolution kernels (Conv, ConvTranspose, ConvInteger, QLinearConv, DeformConv, Col2Im,
CausalConvWithState) on one-node models against onnx.reference, onnxruntime and the float64 oracle.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from kernel_harness import (
    check_node,
    one_node_model,
    output_names,
    run_ort,
    run_reference,
    run_torch,
)
from onnx import TensorProto, helper
from torch import nn

from pytest_ortdiff.numerics.tensors import to_numpy
from pytest_ortdiff.runtimes.evaluator import TorchEvaluator

RNG = np.random.default_rng(0)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CONV_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], bool, dict[str, Any]]] = {
    # name: (X shape, W shape, bias, attributes)
    "1d-strides-asymmetric-pads": ((1, 2, 9), (3, 2, 3), True, {"strides": [2], "pads": [2, 1]}),
    "2d-groups-dilations": ((2, 4, 7, 6), (6, 2, 3, 2), True, {"group": 2, "dilations": [2, 1], "pads": [1, 0, 1, 1]}),
    "2d-depthwise-kernel_shape": ((1, 3, 6, 6), (3, 1, 3, 3), False, {"group": 3, "kernel_shape": [3, 3]}),
    "2d-same-upper": ((1, 2, 7, 5), (3, 2, 2, 3), False, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "2d-same-lower": ((1, 2, 6, 5), (3, 2, 2, 2), True, {"auto_pad": "SAME_LOWER"}),
    "3d-valid": ((1, 2, 4, 5, 4), (2, 2, 2, 3, 2), True, {"auto_pad": "VALID", "strides": [1, 2, 1]}),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case: str) -> None:
    xs, ws, bias, attrs = CONV_CASES[case]
    feeds = {"X": _f(*xs), "W": _f(*ws), "B": _f(ws[0]) if bias else None}
    model = one_node_model("Conv", feeds, ["Y"], 22, **attrs)
    check_node(model, {k: v for k, v in feeds.items() if v is not None})


CONV_T_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any], str]] = {
    # name: (X shape, W shape, attributes, trusted reference)
    "strides-output_padding": ((1, 2, 3, 4), (2, 3, 3, 3), {"strides": [3, 2], "output_padding": [1, 1]}, "both"),
    "asymmetric-pads-dilations": ((1, 2, 4, 4), (2, 2, 3, 2), {"pads": [1, 0, 2, 1], "dilations": [2, 1]}, "both"),
    # onnx.reference's ConvTranspose mishandles group > 1 (a reshape error): onnxruntime only
    "groups-1d": ((2, 4, 5), (4, 1, 3), {"group": 2, "strides": [2]}, "ort"),
    "output_shape": ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}, "both"),
    # onnxruntime puts SAME_UPPER's odd padding at the start, against the spec: onnx.reference only
    "same-upper": ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, "onnx"),
    "3d": ((1, 1, 2, 3, 2), (1, 2, 2, 2, 2), {"strides": [1, 2, 1]}, "both"),
}


@pytest.mark.parametrize("case", list(CONV_T_CASES))
def test_conv_transpose(case: str) -> None:
    xs, ws, attrs, reference = CONV_T_CASES[case]
    feeds = {"X": _f(*xs), "W": _f(*ws), "B": _f(ws[1] * attrs.get("group", 1))}
    model = one_node_model("ConvTranspose", feeds, ["Y"], 22, **attrs)
    dtypes = ("float32", "float16", "float64") if reference != "onnx" else ("float32", "float64")
    check_node(model, feeds, reference=reference, dtypes=dtypes)


def _exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, onnx_ref: bool = True) -> None:
    got = run_torch(model, feeds)
    np.testing.assert_array_equal(got[0], run_ort(model, feeds)[0])
    assert got[0].dtype == run_ort(model, feeds)[0].dtype
    if onnx_ref:
        np.testing.assert_array_equal(got[0], run_reference(model, feeds)[0])


@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_integer_is_exact(per_channel: bool) -> None:
    feeds = {
        "x": RNG.integers(0, 256, (1, 3, 6, 5), dtype=np.uint8),
        "w": RNG.integers(0, 256, (4, 3, 3, 2), dtype=np.uint8),
        "x_zero_point": np.array(131, np.uint8),
        "w_zero_point": np.array([120, 3, 250, 128], np.uint8) if per_channel else np.array(77, np.uint8),
    }
    model = one_node_model("ConvInteger", feeds, ["y"], 10, pads=[1, 0, 0, 1], strides=[1, 2])
    # onnxruntime refuses a per-channel w_zero_point ("not supported now"): onnx.reference only there
    if per_channel:
        np.testing.assert_array_equal(run_torch(model, feeds)[0], run_reference(model, feeds)[0])
    else:
        _exact(model, feeds)
    # padding takes the zero point: the float64 oracle changes nothing for integer ops
    assert run_torch(model, feeds, compute_dtype=torch.float64)[0].dtype == np.int32


def test_qlinear_conv_per_channel_matches_onnxruntime_exactly() -> None:
    x = RNG.integers(0, 256, (1, 4, 6, 6), dtype=np.uint8)
    # 7-bit weights: onnxruntime's AVX2 u8s8 kernel saturates int16 pair sums of full-range int8 weights
    # (why its quantizer has reduce_range), which would make it, not us, wrong
    w = RNG.integers(-64, 64, (4, 2, 3, 3), dtype=np.int8)
    feeds: dict[str, np.ndarray] = {
        "x": x, "x_scale": np.array(0.02, np.float32), "x_zero_point": np.array(128, np.uint8),
        "w": w, "w_scale": np.array([0.01, 0.03, 0.002, 0.05], np.float32),
        "w_zero_point": np.zeros(4, np.int8),
        "y_scale": np.array(0.05, np.float32), "y_zero_point": np.array(100, np.uint8),
        "B": RNG.integers(-500, 500, 4).astype(np.int32),
    }
    model = one_node_model("QLinearConv", feeds, ["y"], 10, group=2, pads=[1, 1, 1, 1])
    got = run_torch(model, feeds)[0]
    # saturation happens at both ends with these scales
    assert got.min() == 0 and got.max() == 255
    _exact(model, feeds)


def test_deform_conv_offsets_mask_groups() -> None:
    # onnxruntime's CPU provider has no DeformConv: onnx.reference only
    feeds = {
        "X": _f(1, 4, 5, 5), "W": _f(4, 2, 2, 2),
        "offset": 1.5 * _f(1, 2 * 2 * 2 * 2, 5, 5), "B": _f(4), "mask": RNG.random((1, 2 * 4, 5, 5)).astype(np.float32),
    }
    model = one_node_model("DeformConv", feeds, ["Y"], 19, group=2, offset_group=2, pads=[1, 1, 0, 0], dilations=[1, 1])
    # onnx.reference samples through GridSample's normalized coordinates (x / (size - 1) * 2 - 1 and back),
    # which costs it a few float64 ulps per tap: a looser float64 tolerance than usual
    check_node(model, feeds, reference="onnx", dtypes=("float32", "float64"), tol={"float64": (1e-5, 1e-7)})


def test_col2im_pads_strides_dilations() -> None:
    feeds = {"input": _f(1, 2 * 4, 6)}
    inits = {"image_shape": np.array([4, 5], np.int64), "block_shape": np.array([2, 2], np.int64)}
    model = one_node_model(
        "Col2Im", feeds, ["output"], 18, initializers=inits, pads=[0, 1, 0, 0], strides=[1, 2], dilations=[2, 1]
    )
    check_node(model, feeds)


def test_causal_conv_with_state_silu_and_past_state() -> None:
    feeds = {"input": _f(2, 3, 5), "weight": _f(3, 1, 4), "bias": _f(3), "past_state": _f(2, 3, 3)}
    model = one_node_model("CausalConvWithState", feeds, ["output", "present_state"], 27, activation="silu")
    # onnxruntime has no kernel for this opset-27 op yet, and the op takes no float64: onnx.reference in
    # float32, the oracle (float64 inside) within float32's tolerance of it
    check_node(model, feeds, reference="onnx", dtypes=("float32",))
    expected = run_reference(model, feeds)
    for got, exp in zip(run_torch(model, feeds, compute_dtype=torch.float64), expected, strict=True):
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)


# -- a real model: Conv -> Relu -> MaxPool -> GlobalAveragePool, built by hand and exported by torch ---


def _helper_model() -> onnx.ModelProto:
    w = onnx.numpy_helper.from_array(_f(8, 3, 3, 3), "w")
    b = onnx.numpy_helper.from_array(_f(8), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["m"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 1, 1])], [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


class _Stem(nn.Module):
    """A ResNet-like stem: Conv, Relu, MaxPool with ceil_mode, a depthwise Conv, global average pool."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 7, stride=2, padding=3)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(nn.functional.adaptive_avg_pool2d(self.dw(self.pool(torch.relu(self.conv(x)))), 1), 1)


def _torchscript_export() -> onnx.ModelProto:
    # the TorchScript exporter only (a fraction of a second): the dynamo exporter's graphs of these ops are
    # covered by tests/test_real_exports.py, which pays its cost once for every op family
    torch.manual_seed(0)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # a BytesIO is accepted, though the signature says paths only
        torch.onnx.export(_Stem().eval(), (torch.randn(2, 3, 20, 20),), buf,  # type: ignore[arg-type]
                          dynamo=False, opset_version=18)
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize("source", ["helper", "torchscript"])
def test_small_cnn_agrees_with_onnxruntime(source: str) -> None:
    model = _helper_model() if source == "helper" else _torchscript_export()
    name = model.graph.input[0].name
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    feeds = {name: RNG.standard_normal(dims).astype(np.float32)}
    expected = run_ort(model, feeds)[0]
    got = to_numpy(TorchEvaluator(model).run(None, {name: torch.from_numpy(feeds[name])})[0])
    scale = float(np.abs(expected).max())
    assert np.abs(got - expected).max() <= 1e-5 * scale
    assert output_names(model)
