"""Conformance cases for onnxruntime's layout contrib ops (see pytest_ortdiff.contrib_cases): the NCHWc ops.

An NCHWc op reads and writes the blocked layout, which only the reorders turn into NCHW: each case is
ReorderInput -> the op -> ReorderOutput (a first-layer Conv reads NCHW itself), its weights reordered as
onnxruntime's transformer writes them, for the channel block of this machine's onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import ContribCase

NCHWC = "com.microsoft.nchwc"


def _blocked(c: int) -> int:
    from ...runtimes.kernels.contrib.layout import nchwc_block_size

    block = nchwc_block_size()
    return -(-c // block) * block


def _case(
    op: str,
    *,
    c: int = 16,
    hw: tuple[int, int] = (9, 9),
    attrs: dict[str, Any] | None = None,
    weights: tuple[int, int, int] | None = None,  # (output channels, kernel h, kernel w) of a Conv
    group: int = 1,
    bias: bool = True,
    total: bool = False,
    nchw_input: bool = False,
    out_hw: tuple[int, int] | None = None,
    channels_last: bool = False,
    seed: int = 0,
) -> Callable[[], tuple[Any, dict[str, Any]]]:
    def build() -> tuple[Any, dict[str, Any]]:
        import numpy as np
        import onnx.helper as oh
        import onnx.numpy_helper as nh
        import torch
        from onnx import TensorProto

        from ...runtimes.kernels.contrib.layout import nchwc_block_size, reorder_filter

        rng = np.random.default_rng(seed)
        block = nchwc_block_size()
        x_shape = [1, *hw, c] if channels_last else [1, c, *hw]
        nodes, inits = [], []
        source = "x"
        if not nchw_input:
            nodes.append(oh.make_node("ReorderInput", ["x"], ["xb"], domain=NCHWC, channels_last=int(channels_last)))
            source = "xb"
        inputs = [source]
        out_c = _blocked(c)
        if weights is not None:
            o, kh, kw = weights
            cin = c if nchw_input else _blocked(c)
            w = np.zeros((_blocked(o), cin // group, kh, kw), np.float32)
            w[:o, : (c // group if group > 1 else c)] = rng.standard_normal((o, c // group if group > 1 else c, kh, kw)).astype(np.float32) * 0.1
            blocked = reorder_filter(torch.from_numpy(w), block, nchw_input).numpy()
            inits.append(nh.from_array(blocked, "w"))
            inputs.append("w")
            if bias or total:
                b = np.zeros(_blocked(o), np.float32)
                b[:o] = rng.standard_normal(o).astype(np.float32) if bias else 0
                inits.append(nh.from_array(b, "b"))
                inputs.append("b")
            out_c = _blocked(o)
        if total:
            nodes.append(oh.make_node("Conv", ["xb", "w_sum"], ["s"], domain=NCHWC, kernel_shape=[1, 1]))
            ws = np.zeros((out_c, _blocked(c), 1, 1), np.float32)
            ws[:, :c] = rng.standard_normal((out_c, c, 1, 1)).astype(np.float32) * 0.1
            inits.append(nh.from_array(reorder_filter(torch.from_numpy(ws), block, False).numpy(), "w_sum"))
            inputs.append("s")
        node_attrs = dict(attrs or {})
        if weights is not None:
            node_attrs.setdefault("kernel_shape", list(weights[1:]))
            if group > 1:
                node_attrs["group"] = group
        nodes.append(oh.make_node(op, inputs, ["yb"], domain=NCHWC, **node_attrs))
        channels = weights[0] if weights is not None else c
        nodes.append(oh.make_node("ReorderOutput", ["yb"], ["y"], domain=NCHWC, channels=channels, channels_last=int(channels_last)))
        oh_, ow = out_hw or hw
        y_shape = [1, oh_, ow, channels] if channels_last else [1, channels, oh_, ow]
        graph = oh.make_graph(nodes, f"case_{op}", [oh.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [oh.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(NCHWC, 1)], ir_version=10)
        return model, {"x": torch.from_numpy(rng.standard_normal(x_shape).astype(np.float32))}

    return build


def _cases() -> list[ContribCase]:
    out: list[ContribCase] = []

    def add(op: str, name: str, build: Callable[[], tuple[Any, dict[str, Any]]], max_ulp: float | None = None) -> None:
        out.append(ContribCase(f"nchwc-{op}-{name}", f"{NCHWC}::{op}", "float32", build, max_ulp=max_ulp))

    # convolutions: sums of up to 9 * 32 products in float32, rounded in another order on each side (the
    # float64 oracle finds onnxruntime itself up to 12 ULPs from the exact sums)
    conv: Sequence[tuple[str, dict[str, Any]]] = (
        ("nchw-input-relu", {"c": 3, "nchw_input": True, "weights": (16, 3, 3), "attrs": {"pads": [1, 1, 1, 1], "activation": "Relu"}}),
        ("blocked-3x3-stride2", {"c": 16, "weights": (24, 3, 3), "attrs": {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "out_hw": (5, 5)}),
        ("depthwise-sigmoid", {"c": 16, "group": 16, "weights": (16, 3, 3), "attrs": {"pads": [1, 1, 1, 1], "activation": "Sigmoid"}}),
        ("pointwise-sum-relu", {"c": 20, "weights": (16, 1, 1), "total": True, "attrs": {"activation": "Relu"}}),
        ("dilated-leakyrelu", {"c": 16, "weights": (16, 3, 3), "attrs": {"pads": [2, 2, 2, 2], "dilations": [2, 2], "activation": "LeakyRelu", "activation_params": [0.2]}}),
        ("clip-no-bias", {"c": 16, "weights": (16, 3, 3), "bias": False, "attrs": {"pads": [1, 1, 1, 1], "activation": "Clip", "activation_params": [-0.6, 0.8]}}),
        ("hardsigmoid-tanh-asym-pads", {"c": 16, "weights": (32, 2, 3), "attrs": {"pads": [0, 1, 1, 0], "activation": "HardSigmoid", "activation_params": [0.3, 0.4]}, "out_hw": (9, 8)}),
        ("tanh", {"c": 16, "weights": (16, 1, 1), "attrs": {"activation": "Tanh"}}),
    )
    for name, kw in conv:
        add("Conv", name, _case("Conv", **kw), max_ulp=16.0)
    add("MaxPool", "3x3-stride2-pads", _case("MaxPool", c=16, attrs={"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, out_hw=(5, 5)))
    add("MaxPool", "2x2-ceil-channels-last", _case("MaxPool", c=12, attrs={"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, out_hw=(5, 5), channels_last=True))
    add("AveragePool", "3x3-include-pad", _case("AveragePool", c=16, attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}))
    add("AveragePool", "2x3-exclude-pad", _case("AveragePool", c=8, attrs={"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 1, 0, 1]}, out_hw=(5, 9)))
    add("GlobalAveragePool", "c24", _case("GlobalAveragePool", c=24, out_hw=(1, 1)))
    add("GlobalMaxPool", "c16", _case("GlobalMaxPool", c=16, out_hw=(1, 1)))
    add("Upsample", "nearest-2x3", _case("Upsample", c=16, hw=(4, 5), attrs={"mode": "nearest", "scales": [1, 1, 2, 3]}, out_hw=(8, 15)))
    for transform in ("asymmetric", "half_pixel", "align_corners"):
        add("Upsample", f"linear-{transform}", _case("Upsample", c=16, hw=(4, 5), attrs={"mode": "linear", "scales": [1, 1, 2, 2], "coordinate_transformation_mode": transform}, out_hw=(8, 10)))
    add("ReorderInput", "channels-last-c12", _case("GlobalMaxPool", c=12, out_hw=(1, 1), channels_last=True))
    return out


CASES: list[ContribCase] = _cases()
