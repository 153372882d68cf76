"""Conformance cases for onnxruntime's activation contrib ops (see pytest_ortdiff.contrib_cases): Gelu,
FastGelu (with and without bias), BiasGelu, QuickGelu (alpha), BiasAdd, BiasSplitGelu, BiasSoftmax (both
broadcasts). The types and ops onnxruntime has no CPU kernel for are CUDA cases, and are checked against a
float64 numpy reference in tests/test_contrib_activation.py."""

from __future__ import annotations

from functools import partial
from typing import Any

from . import ContribCase
from ._onenode import ELEM, MS, one_node, randn

_CUDA = ("CUDA",)


def _x(dtype: str, *shape: int, seed: int = 1) -> Any:
    # values across [-6, 6] where the activations bend, and their tails
    return randn(*shape, dtype=dtype, seed=seed, scale=2.5)


def _unary(op: str, dtype: str, attrs: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    return one_node(op, MS, [("X", _x(dtype, 2, 3, 32))], [("Y", ELEM[dtype], 3)], attrs)


def _with_bias(op: str, dtype: str, *, bias: bool = True, bias_weight: bool = True) -> tuple[Any, dict[str, Any]]:
    inputs: list[Any] = [("X", _x(dtype, 2, 3, 32)), ("bias", randn(32, dtype=dtype, seed=2, scale=0.5)) if bias else None]
    return one_node(op, MS, inputs, [("Y", ELEM[dtype], 3)], weights=("bias",) if bias_weight else ())


def _bias_add(dtype: str) -> tuple[Any, dict[str, Any]]:
    inputs = [("X", _x(dtype, 2, 6, 8)), ("bias", randn(8, dtype=dtype, seed=3)), ("skip", randn(2, 6, 8, dtype=dtype, seed=4))]
    return one_node("BiasAdd", MS, inputs, [("Y", ELEM[dtype], 3)], weights=("bias",))


def _bias_split_gelu(dtype: str) -> tuple[Any, dict[str, Any]]:
    inputs = [("X", _x(dtype, 2, 6, 64)), ("bias", randn(64, dtype=dtype, seed=5, scale=0.5))]
    return one_node("BiasSplitGelu", MS, inputs, [("Y", ELEM[dtype], 3)], weights=("bias",))


def _bias_softmax(dtype: str, *, inner: int, axis: int = 3) -> tuple[Any, dict[str, Any]]:
    b, h, s = 2, 3, 8
    data = randn(b, h, s, s, dtype=dtype, seed=6, scale=3.0)
    # inner: a padding mask per sample ([B, 1, 1, S]: the axes before `axis` broadcast at the end); outer: one
    # bias for every sample ([H, S, S]: the leading axes broadcast)
    bias = randn(b, 1, 1, s, dtype=dtype, seed=7, scale=3.0) if inner else randn(h, s, s, dtype=dtype, seed=7, scale=3.0)
    return one_node("BiasSoftmax", MS, [("data", data), ("bias", bias)], [("output", ELEM[dtype], 4)], {"is_inner_broadcast": inner, "axis": axis})


CASES: list[ContribCase] = []


def _add(name: str, op: str, dtype: str, build: Any, **kw: Any) -> None:
    CASES.append(ContribCase(name, f"com.microsoft::{op}", dtype, build, **kw))


for _dt in ("float32", "float16"):
    _add(f"Gelu.{_dt}", "Gelu", _dt, partial(_unary, "Gelu", _dt))
    _add(f"BiasGelu.{_dt}", "BiasGelu", _dt, partial(_with_bias, "BiasGelu", _dt))
    _add(f"FastGelu.bias.{_dt}", "FastGelu", _dt, partial(_with_bias, "FastGelu", _dt))
    _add(f"QuickGelu.{_dt}", "QuickGelu", _dt, partial(_unary, "QuickGelu", _dt))
_add("FastGelu.nobias", "FastGelu", "float32", partial(_with_bias, "FastGelu", "float32", bias=False))
_add(
    "FastGelu.bias-fed",
    "FastGelu",
    "float64",
    partial(_with_bias, "FastGelu", "float64", bias_weight=False),
    departs="onnxruntime's float64 FastGelu (its function body) uses sqrt(2/pi) and 0.044715*sqrt(2/pi) rounded to 0.797885 "
    "and 0.035677, as its doc writes them: up to 2.1e-7 from the tanh Gelu it fuses",
)
_add("BiasGelu.bias-fed", "BiasGelu", "float32", partial(_with_bias, "BiasGelu", "float32", bias_weight=False))
_add("QuickGelu.alpha", "QuickGelu", "float32", partial(_unary, "QuickGelu", "float32", {"alpha": 1.0}))
_add("QuickGelu.alpha.float64", "QuickGelu", "float64", partial(_unary, "QuickGelu", "float64", {"alpha": 0.5}))
# bfloat16: onnxruntime's CPU provider has no kernel for these four
_add("Gelu.bfloat16", "Gelu", "bfloat16", partial(_unary, "Gelu", "bfloat16"), providers=_CUDA)
_add("BiasGelu.bfloat16", "BiasGelu", "bfloat16", partial(_with_bias, "BiasGelu", "bfloat16"), providers=_CUDA)
_add("FastGelu.bias.bfloat16", "FastGelu", "bfloat16", partial(_with_bias, "FastGelu", "bfloat16"), providers=_CUDA)
_add("QuickGelu.bfloat16", "QuickGelu", "bfloat16", partial(_unary, "QuickGelu", "bfloat16"), providers=_CUDA)
# onnxruntime runs these on CUDA only
for _dt in ("float32", "float16"):
    _add(f"BiasAdd.{_dt}", "BiasAdd", _dt, partial(_bias_add, _dt), providers=_CUDA)
    _add(f"BiasSplitGelu.{_dt}", "BiasSplitGelu", _dt, partial(_bias_split_gelu, _dt), providers=_CUDA)
    _add(f"BiasSoftmax.inner.{_dt}", "BiasSoftmax", _dt, partial(_bias_softmax, _dt, inner=1), providers=_CUDA)
_add("BiasSoftmax.outer", "BiasSoftmax", "float32", partial(_bias_softmax, "float32", inner=0), providers=_CUDA)
_add("BiasSoftmax.outer.axis2", "BiasSoftmax", "float16", partial(_bias_softmax, "float16", inner=0, axis=2), providers=_CUDA)
