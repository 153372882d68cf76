"""Conformance cases for onnxruntime's matmul contrib ops (see pytest_ortdiff.contrib_cases): FusedMatMul
(transA/B, transBatchA/B, alpha, broadcasting, vectors), TransposeMatMul, FusedGemm (its activations and
their parameters), FusedConv (its activations, bias, the Z input, padding, groups)."""

from __future__ import annotations

from functools import partial
from typing import Any

from . import ContribCase
from ._onenode import ELEM, MS, one_node, randn


def _fused_matmul(
    dtype: str,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    rank: int,
    op: str = "FusedMatMul",
    **attrs: Any,
) -> tuple[Any, dict[str, Any]]:
    inputs = [("A", randn(*a_shape, dtype=dtype, seed=1)), ("B", randn(*b_shape, dtype=dtype, seed=2))]
    return one_node(op, MS, inputs, [("Y", ELEM[dtype], rank)], attrs)


def _fused_gemm(dtype: str, activation: str, *, c: bool = True, trans_a: int = 0, trans_b: int = 1, **attrs: Any) -> tuple[Any, dict[str, Any]]:
    m, k, n = 6, 16, 8
    inputs: list[Any] = [
        ("A", randn(*((k, m) if trans_a else (m, k)), dtype=dtype, seed=3)),
        ("B", randn(*((n, k) if trans_b else (k, n)), dtype=dtype, seed=4)),
        ("C", randn(n, dtype=dtype, seed=5)) if c else None,
    ]
    all_attrs = {"activation": activation, "transA": trans_a, "transB": trans_b, **attrs}
    return one_node("FusedGemm", MS, inputs, [("Y", ELEM[dtype], 2)], all_attrs, weights=("B", "C"))


def _fused_conv(dtype: str, activation: str, params: list[float] | None = None, *, z: bool = False, bias: bool = True, **attrs: Any) -> tuple[Any, dict[str, Any]]:
    n, cin, cout, size = 2, 4, 6, 7
    group = int(attrs.get("group", 1))
    x = randn(n, cin, size, size, dtype=dtype, seed=6)
    w = randn(cout, cin // group, 3, 3, dtype=dtype, seed=7, scale=0.4)
    strides = attrs.get("strides", [1, 1])
    pads = attrs.get("pads", [1, 1, 1, 1])
    dilations = attrs.get("dilations", [1, 1])
    out = [(size + pads[i] + pads[i + 2] - dilations[i] * 2 - 1) // strides[i] + 1 for i in range(2)]
    inputs: list[Any] = [
        ("X", x),
        ("W", w),
        ("B", randn(cout, dtype=dtype, seed=8)) if bias or z else None,
        ("Z", randn(n, cout, *out, dtype=dtype, seed=9)) if z else None,
    ]
    all_attrs: dict[str, Any] = {"activation": activation, "kernel_shape": [3, 3], "pads": pads, **attrs}
    if params is not None:
        all_attrs["activation_params"] = params
    return one_node("FusedConv", MS, inputs, [("Y", ELEM[dtype], 4)], all_attrs, weights=("W", "B"))


CASES: list[ContribCase] = []


def _add(name: str, op: str, dtype: str, build: Any, **kw: Any) -> None:
    CASES.append(ContribCase(name, f"com.microsoft::{op}", dtype, build, **kw))


# FusedMatMul: onnxruntime's CPU provider runs float32, float16 and float64 (bfloat16: CUDA)
for _dt in ("float32", "float16"):
    _add(f"FusedMatMul.transB.alpha.{_dt}", "FusedMatMul", _dt, partial(_fused_matmul, _dt, (2, 3, 5, 16), (2, 3, 7, 16), 4, transB=1, alpha=0.125))
    _add(f"FusedMatMul.transA.broadcast.{_dt}", "FusedMatMul", _dt, partial(_fused_matmul, _dt, (3, 16, 5), (16, 7), 3, transA=1))
_add("FusedMatMul.transBatchA", "FusedMatMul", "float32", partial(_fused_matmul, "float32", (5, 2, 3, 16), (2, 3, 16, 7), 4, transBatchA=1))
_add("FusedMatMul.transBatchB.transB", "FusedMatMul", "float32", partial(_fused_matmul, "float32", (2, 3, 5, 16), (7, 2, 3, 16), 4, transBatchB=1, transB=1, alpha=-2.0))
_add("FusedMatMul.transBatchA.transA.transBatchB", "FusedMatMul", "float16", partial(_fused_matmul, "float16", (16, 2, 5), (16, 2, 7), 3, transBatchA=1, transA=1, transBatchB=1))
_add("FusedMatMul.vector-matrix", "FusedMatMul", "float32", partial(_fused_matmul, "float32", (16,), (3, 7, 16), 2, transA=1, transB=1, alpha=0.5))
_add("FusedMatMul.float64", "FusedMatMul", "float64", partial(_fused_matmul, "float64", (2, 5, 16), (2, 16, 7), 3, alpha=3.0))
_add("FusedMatMul.bfloat16", "FusedMatMul", "bfloat16", partial(_fused_matmul, "bfloat16", (2, 5, 16), (2, 7, 16), 3, transB=1, alpha=0.5), providers=("CUDA",))
_add("TransposeMatMul.transA.transB", "TransposeMatMul", "float32", partial(_fused_matmul, "float32", (2, 16, 5), (7, 16), 3, op="TransposeMatMul", transA=1, transB=1, alpha=0.25))
_add("TransposeMatMul.float16", "TransposeMatMul", "float16", partial(_fused_matmul, "float16", (5, 16), (16, 7), 2, op="TransposeMatMul"))

# FusedGemm: onnxruntime's CPU provider runs float32 only
_GEMM: list[tuple[str, dict[str, Any]]] = [
    ("Relu", {}),
    ("Tanh", {}),
    ("Sigmoid", {}),
    ("LeakyRelu", {"activation_alpha": 0.2}),
    ("HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.4}),
    ("Elu", {"activation_alpha": 0.7}),
    ("Celu", {"activation_alpha": 1.5}),
    ("Selu", {"activation_alpha": 1.6, "activation_gamma": 1.1}),
    ("Softplus", {}),
    ("Softsign", {}),
    ("ThresholdedRelu", {"activation_alpha": 0.5}),
    ("ParametricSoftplus", {"activation_alpha": 1.5, "activation_beta": 0.5}),
    ("ScaledTanh", {"activation_alpha": 2.0, "activation_beta": 0.3}),
]
for _act, _attrs in _GEMM:
    _add(f"FusedGemm.{_act}", "FusedGemm", "float32", partial(_fused_gemm, "float32", _act, **_attrs))
_add("FusedGemm.Relu.transA.noC.alpha", "FusedGemm", "float32", partial(_fused_gemm, "float32", "Relu", c=False, trans_a=1, trans_b=0, alpha=0.5))
_add("FusedGemm.LeakyRelu.beta", "FusedGemm", "float32", partial(_fused_gemm, "float32", "LeakyRelu", activation_alpha=0.1, alpha=2.0, beta=-0.5))

# FusedConv: onnxruntime's CPU provider runs float32 and float16. Each output is a 36-term float32 sum, which
# torch and onnxruntime add in different orders: each lands 4-5 floored ULP from the float64 oracle (on the
# outputs that cancel to near zero), up to 6 from each other
_CONV_ULP = 8.0
for _dt in ("float32", "float16"):
    _ulp = _CONV_ULP if _dt == "float32" else None
    _add(f"FusedConv.Relu.{_dt}", "FusedConv", _dt, partial(_fused_conv, _dt, "Relu"), max_ulp=_ulp)
    _add(f"FusedConv.Relu.Z.{_dt}", "FusedConv", _dt, partial(_fused_conv, _dt, "Relu", z=True), max_ulp=_ulp)
_add("FusedConv.Tanh.stride2.nobias", "FusedConv", "float32", partial(_fused_conv, "float32", "Tanh", bias=False, strides=[2, 2], pads=[0, 1, 1, 0]), max_ulp=_CONV_ULP)
_add("FusedConv.Sigmoid.group2", "FusedConv", "float32", partial(_fused_conv, "float32", "Sigmoid", group=2), max_ulp=_CONV_ULP)
_add("FusedConv.LeakyRelu", "FusedConv", "float32", partial(_fused_conv, "float32", "LeakyRelu", [0.2]), max_ulp=_CONV_ULP)
_add("FusedConv.Clip.Z", "FusedConv", "float32", partial(_fused_conv, "float32", "Clip", [-0.5, 1.5], z=True), max_ulp=_CONV_ULP)
_add("FusedConv.HardSigmoid.dilations", "FusedConv", "float32", partial(_fused_conv, "float32", "HardSigmoid", [0.25, 0.4], dilations=[2, 2], pads=[2, 2, 2, 2]), max_ulp=_CONV_ULP)
