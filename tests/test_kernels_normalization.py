"""The normalization kernels (BatchNormalization, InstanceNormalization, GroupNormalization, LRN,
LpNormalization, MeanVarianceNormalization) on one-node models against onnx.reference, onnxruntime and the
float64 oracle, and nn.BatchNorm2d / GroupNorm / InstanceNorm2d exported by both torch exporters.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from kernel_harness import check_node, given, one_node_model, run_ort, run_reference, run_torch
from onnx import TensorProto, helper
from torch import nn

from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError

RNG = np.random.default_rng(0)


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _pos(*shape: int) -> np.ndarray:
    return (0.5 + RNG.random(shape)).astype(np.float32)


X4 = _x(2, 4, 3, 5)
F32 = ("float32", "float64")
C4 = {"scale": _pos(4), "B": _x(4), "mean": _x(4), "var": _pos(4)}


# (id, op, opset, inputs, outputs, attrs, check_node kwargs)
CASES: list[tuple[str, str, int, dict[str, np.ndarray | None], list[str], dict[str, Any], dict[str, Any]]] = [
    ("bn15", "BatchNormalization", 15, {"X": X4, **C4}, ["Y"], {"epsilon": 1e-3}, {}),
    # onnx.reference's opset-9 BatchNormalization normalizes by batch statistics whenever momentum is set
    # (and the schema's default sets it), its opset-7 one returns a tuple: onnxruntime is the reference
    ("bn9-3d", "BatchNormalization", 9, {"X": _x(2, 4, 6), **C4}, ["Y"], {}, {"reference": "ort"}),
    # spatial=0: per-activation statistics of shape (C, H, W), which onnx.reference cannot broadcast
    (
        "bn7-per-activation",
        "BatchNormalization",
        7,
        {"X": X4, "scale": _pos(4, 3, 5), "B": _x(4, 3, 5), "mean": _x(4, 3, 5), "var": _pos(4, 3, 5)},
        ["Y"],
        {"spatial": 0},
        {"reference": "ort"},
    ),
    # training_mode=1: batch statistics normalize, running statistics move by momentum (onnxruntime's CPU
    # inference build does not implement training_mode, onnx.reference does)
    (
        "bn14-training",
        "BatchNormalization",
        14,
        {"X": X4, **C4},
        ["Y", "running_mean", "running_var"],
        {"training_mode": 1, "momentum": 0.8},
        {"reference": "onnx", "dtypes": ("float32", "float64")},
    ),
    ("instance6", "InstanceNormalization", 6, {"X": X4, "scale": C4["scale"], "B": C4["B"]}, ["Y"], {"epsilon": 1e-2}, {}),
    # stash_type=1 computes the statistics in float32 even for float64 X: float32-accurate in float64
    (
        "group21-per-channel",
        "GroupNormalization",
        21,
        {"X": X4, "scale": C4["scale"], "bias": C4["B"]},
        ["Y"],
        {"num_groups": 2},
        {"tol": {"float64": (1e-5, 1e-6)}},
    ),
    # onnx.reference's LRN sums over the window of the *batch* index: onnxruntime is the reference
    ("lrn-odd", "LRN", 13, {"X": _x(2, 5, 3, 3)}, ["Y"], {"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 2.0}, {"reference": "ort"}),
    # onnx.reference's p=1 norm forgets the absolute value: onnxruntime is the reference (it fails to build
    # a float16 LpNormalization on CPU)
    ("lp1-axis0", "LpNormalization", 1, {"X": _x(3, 4)}, ["Y"], {"p": 1, "axis": 0}, {"reference": "ort", "dtypes": F32}),
    ("lp2-zero-row", "LpNormalization", 22, {"X": np.concatenate([_x(2, 4), np.zeros((1, 4), np.float32)])}, ["Y"], {}, {}),
    # onnxruntime expands MVN's float16 function body into ill-typed Pow nodes, onnx.reference its float64
    # one (a float32 epsilon): onnxruntime in float32 and the oracle (conformance runs onnx.reference's cases)
    ("mvn-default", "MeanVarianceNormalization", 13, {"X": X4}, ["Y"], {}, {"dtypes": F32, "reference": "ort"}),
    ("mvn-axes", "MeanVarianceNormalization", 9, {"X": X4}, ["Y"], {"axes": [1, 3]}, {"dtypes": F32, "reference": "ort"}),
]


@pytest.mark.parametrize(
    ("op", "opset", "inputs", "outputs", "attrs", "kw"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_against_references(
    op: str,
    opset: int,
    inputs: dict[str, np.ndarray | None],
    outputs: list[str],
    attrs: dict[str, Any],
    kw: dict[str, Any],
) -> None:
    model = _model(op, inputs, outputs, opset, **attrs)
    check_node(model, given(inputs), **kw)


def _model(
    op: str, inputs: dict[str, np.ndarray | None], outputs: list[str], opset: int, **attrs: Any
) -> onnx.ModelProto:
    """one_node_model, with Y typed like X by hand where ONNX's shape inference cannot type a function op's
    output (GroupNormalization, MeanVarianceNormalization with default axes)."""
    if op not in ("GroupNormalization", "MeanVarianceNormalization"):
        return one_node_model(op, inputs, outputs, opset, **attrs)
    x = inputs["X"]
    assert x is not None
    node = helper.make_node(op, list(inputs), outputs, **attrs)
    vi = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in given(inputs).items()]
    y = helper.make_tensor_value_info("Y", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
    model = helper.make_model(helper.make_graph([node], op, vi, [y]), opset_imports=[helper.make_opsetid("", opset)])
    if (op, opset) != ("GroupNormalization", 18):  # the checker refuses the deprecated opset-18 op
        onnx.checker.check_model(model)
    return model


def test_group_norm18_scale_and_bias_per_group() -> None:
    # onnx.checker refuses the deprecated opset-18 op and onnxruntime has no kernel for it: onnx.reference
    # (its function body) is the reference, in float32 and for the oracle
    feeds = {"X": X4, "scale": _pos(2), "bias": _x(2)}
    model = _model("GroupNormalization", dict(feeds), ["Y"], 18, num_groups=2)
    (expected,) = run_reference(model, feeds)
    (got,) = run_torch(model, feeds, check_model=False)
    (oracle,) = run_torch(model, feeds, compute_dtype=torch.float64, check_model=False)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(oracle, expected, rtol=1e-5, atol=1e-6)
    # per group, not per channel: channels 0 and 1 share scale[0]
    y = got.reshape(2, 2, -1)
    assert np.allclose(y.std(axis=-1), feeds["scale"], rtol=1e-3)


def test_lrn_even_size_against_the_formula() -> None:
    # onnxruntime refuses an even size and onnx.reference sums over the wrong axis: the spec's formula here
    x = _x(2, 6, 2, 3)
    model = one_node_model("LRN", {"X": x}, ["Y"], 13, size=4, alpha=0.02, beta=0.7, bias=1.5)
    (got,) = run_torch(model, {"X": x})
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (1, 2), (0, 0), (0, 0)))  # floor(3/2)=1 before, ceil(3/2)=2 after
    window = sum(sq[:, i : i + 6] for i in range(4))
    alpha, beta = float(np.float32(0.02)), float(np.float32(0.7))
    expected = x / (1.5 + alpha / 4 * window) ** beta
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_group_norm_stash_type_float16_differs_from_float32_stash() -> None:
    # the default stash_type (float32) follows onnx.reference on a float16 model (onnxruntime's kernel ignores
    # stash_type); stash_type=10 normalizes in float16 itself (onnx.reference returns zeros there): a few
    # float16 ulps away from the float32 stash, and not equal to it
    x = (_x(1, 4, 64) * 2 + 30).astype(np.float16)
    feeds = {"X": x, "scale": np.ones(4, np.float16), "bias": np.zeros(4, np.float16)}
    outs = {}
    for stash in (1, 10):
        model = _model("GroupNormalization", dict(feeds), ["Y"], 21, num_groups=2, stash_type=stash)
        (outs[stash],) = run_torch(model, feeds)
    (exp,) = run_reference(_model("GroupNormalization", dict(feeds), ["Y"], 21, num_groups=2), feeds)
    np.testing.assert_allclose(outs[1].astype(np.float64), exp.astype(np.float64), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(outs[10].astype(np.float64), exp.astype(np.float64), rtol=0, atol=2e-2)
    assert not np.array_equal(outs[1], outs[10])


def test_old_batch_norm_training_is_refused_by_name() -> None:
    model = one_node_model("BatchNormalization", {"X": X4, **C4}, ["Y"], 6, is_test=0)
    with pytest.raises(Exception, match="training mode") as info:
        run_torch(model, {"X": X4, **C4})
    chain: BaseException | None = info.value
    while chain is not None and not isinstance(chain, UnsupportedVariantError):
        chain = chain.__cause__
    assert chain is not None


# -- real exports ---------------------------------------------------------------------------------


class NormStack(nn.Module):
    """BatchNorm2d (eval, trained-looking statistics), GroupNorm and InstanceNorm2d (affine) side by side."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(6)
        self.gn = nn.GroupNorm(3, 6)
        self.inorm = nn.InstanceNorm2d(6, affine=True)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in (self.bn.weight, self.bn.bias, self.gn.weight, self.gn.bias, self.inorm.weight, self.inorm.bias):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
            assert self.bn.running_mean is not None and self.bn.running_var is not None
            self.bn.running_mean.copy_(0.2 * torch.randn(6, generator=g))
            self.bn.running_var.copy_(0.5 + torch.rand(6, generator=g))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.bn(x), self.gn(x), self.inorm(x)


@pytest.fixture(scope="session")
def norm_exports() -> dict[str, onnx.ModelProto]:
    module = NormStack().eval()
    args = (torch.randn(2, 6, 5, 5, generator=torch.Generator().manual_seed(2)),)
    out: dict[str, onnx.ModelProto] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' own deprecation and tracer warnings
        # optimize=False keeps BatchNormalization a node rather than folded constants
        program = torch.onnx.export(module, args, dynamo=True, verbose=False, optimize=False)
        assert program is not None
        out["dynamo"] = program.model_proto
        buf = io.BytesIO()
        torch.onnx.export(
            module, args, buf, dynamo=False, opset_version=18, training=torch.onnx.TrainingMode.PRESERVE
        )
        out["torchscript"] = onnx.load_from_string(buf.getvalue())
    return out


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_real_exports_agree_with_onnxruntime(norm_exports: dict[str, onnx.ModelProto], exporter: str) -> None:
    model = norm_exports[exporter]
    ops = {n.op_type for n in model.graph.node}
    assert "BatchNormalization" in ops
    assert ops & {"InstanceNormalization", "GroupNormalization"}
    feeds = {model.graph.input[0].name: _x(2, 6, 5, 5)}
    got, expected = run_torch(model, feeds), run_ort(model, feeds)
    for g, e in zip(got, expected, strict=True):
        scale = float(np.abs(e).max())
        assert float(np.abs(g - e).max()) <= 1e-5 * scale


def test_elem_types_of_mixed_precision_batch_norm() -> None:
    # opset 15: X float16 with float32 statistics; running stats keep their own type
    x = X4.astype(np.float16)
    feeds = {"X": x, **C4}
    node = helper.make_node(
        "BatchNormalization", list(feeds), ["Y", "rm", "rv"], training_mode=1
    )
    vi = [helper.make_tensor_value_info("X", TensorProto.FLOAT16, x.shape)] + [
        helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in C4.items()
    ]
    outs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT16, x.shape),
        helper.make_tensor_value_info("rm", TensorProto.FLOAT, (4,)),
        helper.make_tensor_value_info("rv", TensorProto.FLOAT, (4,)),
    ]
    model = helper.make_model(
        helper.make_graph([node], "bn", vi, outs), opset_imports=[helper.make_opsetid("", 15)]
    )
    onnx.checker.check_model(model, full_check=True)
    y, rm, rv = run_torch(model, feeds)
    assert (y.dtype, rm.dtype, rv.dtype) == (np.float16, np.float32, np.float32)
    xs = X4.astype(np.float16).astype(np.float64)
    mean, var = xs.mean(axis=(0, 2, 3)), xs.var(axis=(0, 2, 3))
    np.testing.assert_allclose(rm, 0.9 * C4["mean"] + 0.1 * mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rv, 0.9 * C4["var"] + 0.1 * var, rtol=1e-5, atol=1e-6)
