"""The contrib kernels onnxruntime cannot check on a CPU: the CUDA-only ops (GroupNorm, SkipGroupNorm,
BiasAdd, BiasSplitGelu, BiasSoftmax), the types its CPU provider lacks (bfloat16 Gelus and FusedMatMul) and
the variants its CUDA kernels refuse (GroupNorm channels first, float16 gamma), each against a float64 numpy
reference written from the op's spec; and the kernels' refusals, by name."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from pytest_ortdiff import TorchEvaluator, compare
from pytest_ortdiff.conformance.contrib_cases import ContribCase, activation, matmul, normalization
from pytest_ortdiff.conformance.contrib_cases._onenode import MS, one_node, randn
from pytest_ortdiff.numerics.tensors import from_onnx_tensor
from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError

Arrays = dict[str, np.ndarray]
_erf = np.vectorize(math.erf)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _tanh_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _group_norm(v: Arrays, node: onnx.NodeProto) -> list[np.ndarray]:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    last = attrs.get("channels_last", 1) == 1
    x = v["X"]
    s = x.copy()
    if "skip" in v:
        skip = v["skip"]
        c = x.shape[-1] if last else x.shape[1]
        if skip.ndim == 2:
            skip = skip.reshape(skip.shape[0], 1, 1, c) if last else skip.reshape(*skip.shape, 1, 1)
        s = s + skip
        if "bias" in v:
            s = s + (v["bias"] if last else v["bias"].reshape(-1, 1, 1))
    cf = np.moveaxis(s, -1, 1) if last else s
    n, c = cf.shape[:2]
    g = cf.reshape(n, attrs["groups"], -1)
    normalized = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + attrs["epsilon"])).reshape(cf.shape)
    y = normalized * v["gamma"].reshape(-1, 1, 1) + v["beta"].reshape(-1, 1, 1)
    if attrs["activation"] == 1:
        y = y / (1 + np.exp(-y))
    y = np.moveaxis(y, 1, -1) if last else y
    return [y, s]


def _bias_softmax(v: Arrays, node: onnx.NodeProto) -> list[np.ndarray]:
    axis = next(a.i for a in node.attribute if a.name == "axis")
    z = v["data"] + v["bias"]  # the cases' biases broadcast numpy's way, which is what the op fuses
    flat = z.reshape(*z.shape[:axis], -1)
    e = np.exp(flat - flat.max(-1, keepdims=True))
    return [(e / e.sum(-1, keepdims=True)).reshape(z.shape)]


def _bias_split_gelu(v: Arrays, node: onnx.NodeProto) -> list[np.ndarray]:
    s = v["X"] + v["bias"]
    half = s.shape[-1] // 2
    return [s[..., :half] * _gelu(s[..., half:])]


def _fused_matmul(v: Arrays, node: onnx.NodeProto) -> list[np.ndarray]:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    b = v["B"].swapaxes(-1, -2) if attrs.get("transB") else v["B"]
    return [attrs.get("alpha", 1.0) * (v["A"] @ b)]


#: case name -> its float64 reference, from the feeds and initializers by name
REFERENCES: dict[str, Callable[[Arrays, onnx.NodeProto], list[np.ndarray]]] = {
    "GroupNorm.float32": _group_norm,
    "GroupNorm.silu": _group_norm,
    "SkipGroupNorm.full.bias.sum": _group_norm,
    "SkipGroupNorm.nc.nobias": _group_norm,
    "SkipGroupNorm.n11c": _group_norm,
    "BiasAdd.float32": lambda v, _: [v["X"] + v["bias"] + v["skip"]],
    "BiasAdd.float16": lambda v, _: [v["X"] + v["bias"] + v["skip"]],
    "BiasSplitGelu.float32": _bias_split_gelu,
    "BiasSplitGelu.float16": _bias_split_gelu,
    "BiasSoftmax.inner.float32": _bias_softmax,
    "BiasSoftmax.inner.float16": _bias_softmax,
    "BiasSoftmax.outer": _bias_softmax,
    "BiasSoftmax.outer.axis2": _bias_softmax,
    "Gelu.bfloat16": lambda v, _: [_gelu(v["X"])],
    "BiasGelu.bfloat16": lambda v, _: [_gelu(v["X"] + v["bias"])],
    "FastGelu.bias.bfloat16": lambda v, _: [_tanh_gelu(v["X"] + v["bias"])],
    "QuickGelu.bfloat16": lambda v, _: [v["X"] / (1 + np.exp(-float(np.float32(1.702)) * v["X"]))],
    "FusedMatMul.bfloat16": _fused_matmul,
}

_OFF_CPU = [c for c in (*normalization.CASES, *activation.CASES, *matmul.CASES) if "CPU" not in c.providers]


def test_every_case_onnxruntime_cannot_check_on_a_cpu_has_a_reference() -> None:
    assert sorted(c.name for c in _OFF_CPU) == sorted(REFERENCES)


def _values(model: onnx.ModelProto, feeds: dict[str, torch.Tensor]) -> Arrays:
    out = {name: t.double().numpy() if t.is_floating_point() else t.numpy() for name, t in feeds.items()}
    out.update({init.name: from_onnx_tensor(init).double().numpy() for init in model.graph.initializer})
    return out


def _check_against(model: onnx.ModelProto, feeds: dict[str, torch.Tensor], want: list[np.ndarray], dtype: str) -> None:
    ours = TorchEvaluator(model).run(None, feeds)
    oracle = TorchEvaluator(model, compute_dtype="float64").run(None, feeds)
    torch_dtype = getattr(torch, dtype)
    for got, exact, w in zip(ours, oracle, want, strict=False):
        assert got.dtype == torch_dtype and tuple(got.shape) == w.shape
        # ours: the exact value rounded once, give or take float32's own rounding inside (a few ULP of the
        # output's scale in float32, none visible in 16 bits)
        report = compare(torch.from_numpy(w).to(torch_dtype), got)
        assert (report.max_ulp_floored or 0) <= (4 if dtype == "float32" else 1), report.summary()
        np.testing.assert_allclose(exact.numpy(), w, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("case", _OFF_CPU, ids=[c.name for c in _OFF_CPU])
def test_kernel_matches_its_float64_reference(case: ContribCase) -> None:
    model, feeds = case.build()
    _check_against(model, feeds, REFERENCES[case.name](_values(model, feeds), model.graph.node[0]), case.dtype)


@pytest.mark.parametrize(
    "dtype,gamma_dtype,channels_last,skip",
    [
        ("float32", "float32", 0, None),  # NCHW: onnxruntime's CUDA kernel refuses it
        ("float16", "float16", 1, None),  # gamma and beta in float16
        ("bfloat16", "float32", 0, "nc"),  # no onnxruntime kernel at all in bfloat16
        ("float32", "float32", 0, "full"),
    ],
)
def test_group_norm_variants_onnxruntime_lacks(dtype: str, gamma_dtype: str, channels_last: int, skip: str | None) -> None:
    model, feeds = normalization._group_norm(dtype, skip=skip, channels_last=channels_last, gamma_dtype=gamma_dtype, activation=1)
    _check_against(model, feeds, _group_norm(_values(model, feeds), model.graph.node[0]), dtype)


def test_bias_softmax_broadcasts_a_flat_bias_by_rows() -> None:
    # a bias of rank 2 holding [B, S*S]: inner broadcast serves each sample's H rows, which numpy's own
    # broadcasting cannot express; the op's row rule can
    data = randn(2, 3, 4, 4, seed=1, scale=2.0)
    bias = randn(2, 16, seed=2, scale=2.0)
    model, feeds = one_node("BiasSoftmax", MS, [("data", data), ("bias", bias)], [("y", 1, 4)], {"is_inner_broadcast": 1, "axis": 2})
    (y,) = TorchEvaluator(model).run(None, feeds)
    z = data.double().reshape(2, 3, 16) + bias.double().reshape(2, 1, 16)
    torch.testing.assert_close(y.double(), torch.softmax(z, -1).reshape(2, 3, 4, 4), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "build,message",
    [
        (partial(one_node, "GroupNorm", MS, [("X", randn(1, 2, 2, 4)), ("g", randn(4)), ("b", randn(4))], [("Y", 1, 4)], {"groups": 2, "activation": 2}), "GroupNorm activation=2: the schema defines 0 (none) and 1 (SiLU)"),
        (partial(one_node, "FusedConv", MS, [("X", randn(1, 2, 5, 5)), ("W", randn(3, 2, 3, 3))], [("Y", 1, 4)], {"activation": "Elu"}), "FusedConv activation='Elu': onnxruntime's FusedConv takes Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid"),
        (partial(one_node, "FusedGemm", MS, [("A", randn(2, 3)), ("B", randn(3, 4))], [("Y", 1, 2)], {"activation": "Clip"}), "FusedGemm activation='Clip': onnxruntime's FusedGemm takes Relu, Tanh,"),
        (partial(one_node, "SimplifiedLayerNormalization", "", [("X", randn(2, 4)), ("s", randn(4))], [("Y", 1, 2)], {"stash_type": 7}), "SimplifiedLayerNormalization stash_type=7: not a float type"),
    ],
)
def test_variants_outside_the_spec_are_refused_by_name(build: Callable[[], tuple[onnx.ModelProto, dict[str, Any]]], message: str) -> None:
    model, feeds = build()
    with pytest.raises(UnsupportedVariantError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}"):
        TorchEvaluator(model).run(None, feeds)


def test_a_bias_of_the_wrong_size_is_named() -> None:
    model, feeds = one_node("BiasGelu", MS, [("A", randn(2, 8)), ("B", randn(4))], [("C", 1, 2)])
    with pytest.raises(RuntimeError, match=r"BiasGelu: bias of shape \[4\] must be 1-D with the input's last dimension \(8\)"):
        TorchEvaluator(model).run(None, feeds)
    model, feeds = one_node("SkipLayerNormalization", MS, [("x", randn(2, 3, 8)), ("k", randn(2, 3, 8)), ("g", randn(6))], [("y", 1, 3)])
    with pytest.raises(RuntimeError, match=r"SkipLayerNormalization: gamma has 6 values, the normalized shape \[8\] has 8"):
        TorchEvaluator(model).run(None, feeds)
