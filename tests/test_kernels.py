"""The torch kernels against onnx.reference, one-node models per op, per dtype and per opset variant.

Each model is typed by ONNX shape inference and passes the full checker; its inferred output types are
the dtypes the kernels must produce (through `ctx.torch_dtype`, so floats are float64 in oracle mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference
import pytest
import torch
from kernel_harness import ort_session
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from pytest_ortdiff.runtimes.kernels import (
    REGISTRY,
    KernelContext,
    UnsupportedVariantError,
    lookup,
    reduction,
)
from pytest_ortdiff.runtimes.kernels.contrib import normalization as contrib_normalization
from pytest_ortdiff.runtimes.kernels.math import matmul, softmax
from pytest_ortdiff.runtimes.kernels.nn import normalization as nn_normalization
from pytest_ortdiff.runtimes.kernels.tensor import cast, shape

CPU = torch.device("cpu")
_rng = np.random.default_rng(20240601)


@dataclass(frozen=True)
class Init:
    """An input that is a constant of the model (shape, axes): an initializer, not a graph input."""

    value: np.ndarray


@dataclass
class Case:
    id: str
    op: str
    inputs: tuple[Any, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    opset: int = 18
    n_out: int = 1
    # "ort" where onnx.reference itself departs from the spec (Softmax before opset 13).
    ref: str = "onnx"


def case(
    id: str, op: str, *inputs: Any, opset: int = 18, n_out: int = 1, ref: str = "onnx", **attrs: Any
) -> Case:
    return Case(id, op, inputs, attrs, opset, n_out, ref)


def _u(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.asarray(_rng.uniform(lo, hi, size=shape), dtype=np.float32)


def _pos(*shape: int) -> np.ndarray:
    return _u(*shape, lo=0.5, hi=2.0)


def _away_from_zero(*shape: int) -> np.ndarray:
    return np.asarray(_pos(*shape) * _rng.choice([-1.0, 1.0], size=shape), dtype=np.float32)


def _i64(*values: int) -> Init:
    return Init(np.array(values, dtype=np.int64))


# -- model building and running -----------------------------------------------------------------


def build(c: Case, data_type: int, int_type: int = TensorProto.INT64) -> onnx.ModelProto:
    """The one-node model of `c`, float data inputs typed `data_type` (integer data inputs `int_type`)."""
    names, graph_inputs, inits = [], [], []
    for i, value in enumerate(c.inputs):
        name = f"x{i}"
        names.append(name)
        if isinstance(value, Init):
            inits.append(onnx.numpy_helper.from_array(value.value, name))
        else:
            elem = data_type if value.dtype.kind == "f" else int_type
            graph_inputs.append(helper.make_tensor_value_info(name, elem, value.shape))
    outputs = [f"y{i}" for i in range(c.n_out)]
    node = helper.make_node(c.op, names, outputs, **c.attrs)
    graph = helper.make_graph(
        [node], c.id, graph_inputs, [helper.make_empty_tensor_value_info(o) for o in outputs], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)], ir_version=9)
    # Output types come from ONNX's own inference: the spec's dtypes, not ours or the reference's.
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    return model


def run_reference(
    c: Case, model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> list[np.ndarray]:
    if c.ref == "ort":
        sess = ort_session(model)
        return sess.run(None, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


def run_kernel(
    model: onnx.ModelProto, ctx: KernelContext, inputs: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    node = model.graph.node[0]
    cls = lookup(node.domain, node.op_type, ctx.opset)
    assert cls is not None, f"no kernel for {node.op_type} at opset {ctx.opset}"
    out = cls(node, ctx).run(*inputs)
    assert isinstance(out, tuple) and len(out) == len(node.output)
    return out


def spec_dtypes(model: onnx.ModelProto, ctx: KernelContext) -> list[torch.dtype]:
    return [ctx.torch_dtype(o.type.tensor_type.elem_type) for o in model.graph.output]


# -- float cases ----------------------------------------------------------------------------------

A3 = _u(2, 3, 4)
FLOAT_CASES = [
    case("Add-broadcast", "Add", A3, _u(3, 1)),
    case("Sub-broadcast", "Sub", _u(3, 1), A3),
    case("Mul-broadcast", "Mul", A3, _u(4)),
    case("Div-broadcast", "Div", A3, _away_from_zero(1, 3, 1)),
    case("Div-scalar", "Div", _u(5), _away_from_zero()),
    case("Pow", "Pow", _pos(2, 3), _u(2, 3)),
    case("Pow-scalar-exponent", "Pow", _pos(2, 3), np.array(3.0, dtype=np.float32)),
    case("Sqrt", "Sqrt", _pos(3, 4)),
    case("Reciprocal", "Reciprocal", _away_from_zero(3, 4)),
    case("Neg", "Neg", _u(3, 4)),
    case("Exp", "Exp", _u(3, 4)),
    case("Log", "Log", _pos(3, 4)),
    case("Tanh", "Tanh", _u(3, 4)),
    case("Erf", "Erf", _u(3, 4)),
    case("Sigmoid", "Sigmoid", _u(3, 4, lo=-6.0, hi=6.0)),
    case("Relu", "Relu", _u(3, 4)),
    case("Abs", "Abs", _u(3, 4)),
    case("Identity", "Identity", _u(3, 4)),
    case("MatMul-2d", "MatMul", _u(3, 4), _u(4, 5)),
    case("MatMul-1d-2d", "MatMul", _u(4), _u(4, 5)),
    case("MatMul-2d-1d", "MatMul", _u(3, 4), _u(4)),
    case("MatMul-1d-1d", "MatMul", _u(4), _u(4)),
    case("MatMul-batched-broadcast", "MatMul", _u(2, 1, 3, 4), _u(3, 4, 2)),
    case("Gemm-C-row", "Gemm", _u(3, 4), _u(4, 5), _u(5)),
    case(
        "Gemm-transA-transB-alpha-beta",
        "Gemm",
        _u(4, 3),
        _u(5, 4),
        _u(3, 1),
        transA=1,
        transB=1,
        alpha=0.5,
        beta=2.0,
    ),
    case("Gemm-C-scalar", "Gemm", _u(3, 4), _u(4, 5), _u(), beta=0.25),
    case("Gemm-C-full-beta0", "Gemm", _u(3, 4), _u(4, 5), _u(3, 5), beta=0.0),
    case("Gemm-no-C-alpha", "Gemm", _u(3, 4), _u(4, 5), alpha=1.5),
    case("Gemm-opset9-C-required", "Gemm", _u(4, 3), _u(4, 5), _u(1, 5), opset=9, transA=1),
    case(
        "Einsum-batch-matmul", "Einsum", _u(2, 3, 4), _u(2, 4, 5), opset=12, equation="bij,bjk->bik"
    ),
    case("LayerNorm-3-outputs", "LayerNormalization", _u(2, 3, 8), _u(8), _u(8), n_out=3),
    case(
        "LayerNorm-axis1-3d", "LayerNormalization", _u(2, 3, 8), _u(3, 8), _u(3, 8), n_out=3, axis=1
    ),
    case("LayerNorm-no-bias-eps", "LayerNormalization", _u(4, 6), _u(6), epsilon=1e-2),
    case(
        "LayerNorm-broadcast-scale",
        "LayerNormalization",
        _u(2, 3, 4),
        _u(1, 4),
        _u(4),
        n_out=3,
        axis=-2,
    ),
    case("Softmax-13-default-axis", "Softmax", _u(2, 3, 4), opset=13),
    case("Softmax-13-axis1", "Softmax", _u(2, 3, 4), opset=13, axis=1),
    # onnx.reference applies opset-13 semantics at opset 11: onnxruntime implements the 2-D coercion.
    case("Softmax-11-default-axis1-coerced", "Softmax", _u(2, 3, 4), opset=11, ref="ort"),
    case("Softmax-11-axis0-coerced", "Softmax", _u(2, 3, 4), opset=11, ref="ort", axis=0),
    case("Softmax-11-axis-last", "Softmax", _u(2, 3, 4), opset=11, ref="ort", axis=-1),
    case("LogSoftmax-13-default-axis", "LogSoftmax", _u(2, 3, 4), opset=13),
    case("LogSoftmax-13-axis0", "LogSoftmax", _u(2, 3, 4), opset=13, axis=0),
    case("LogSoftmax-11-default-axis1-coerced", "LogSoftmax", _u(2, 3, 4), opset=11, ref="ort"),
    case("ReduceSum-11-attr-axes", "ReduceSum", _u(2, 3, 4), opset=11, axes=[1]),
    case("ReduceSum-11-all-keepdims0", "ReduceSum", _u(2, 3, 4), opset=11, keepdims=0),
    case("ReduceSum-13-input-axes", "ReduceSum", _u(2, 3, 4), _i64(0, -1), opset=13, keepdims=0),
    case("ReduceSum-13-no-axes", "ReduceSum", _u(2, 3, 4), opset=13),
    case(
        "ReduceSum-13-empty-axes-noop",
        "ReduceSum",
        _u(2, 3, 4),
        _i64(),
        opset=13,
        noop_with_empty_axes=1,
    ),
    case("ReduceSum-13-empty-axes-all", "ReduceSum", _u(2, 3, 4), _i64(), opset=13, keepdims=0),
    case("ReduceMean-17-attr-axes", "ReduceMean", _u(2, 3, 4), opset=17, axes=[-1]),
    case("ReduceMean-17-all", "ReduceMean", _u(2, 3, 4), opset=17),
    case("ReduceMean-18-input-axes", "ReduceMean", _u(2, 3, 4), _i64(1), opset=18),
    case("ReduceMean-18-no-axes-keepdims0", "ReduceMean", _u(2, 3, 4), opset=18, keepdims=0),
    case("ReduceMean-18-no-axes-noop", "ReduceMean", _u(2, 3, 4), opset=18, noop_with_empty_axes=1),
    case("Reshape-zero-copies-dim", "Reshape", _u(2, 3, 4), _i64(0, -1)),
    case("Reshape-infer", "Reshape", _u(2, 3, 4), _i64(4, -1, 2)),
    case("Reshape-allowzero", "Reshape", _u(0, 4), _i64(4, 0), allowzero=1),
    case("Reshape-opset5", "Reshape", _u(2, 3, 4), _i64(0, 12), opset=5),
    case("Transpose-default", "Transpose", _u(2, 3, 4)),
    case("Transpose-perm", "Transpose", _u(2, 3, 4), perm=[1, 0, 2]),
    case("Squeeze-11-attr", "Squeeze", _u(2, 1, 4, 1), opset=11, axes=[1]),
    case("Squeeze-11-all", "Squeeze", _u(1, 3, 1), opset=11),
    case("Squeeze-13-input", "Squeeze", _u(2, 1, 4, 1), _i64(-1), opset=13),
    case("Squeeze-13-all", "Squeeze", _u(1, 3, 1), opset=13),
    case("Unsqueeze-11-attr", "Unsqueeze", _u(3, 4), opset=11, axes=[0, -1]),
    case("Unsqueeze-13-input", "Unsqueeze", _u(3, 4), _i64(3, 1), opset=13),
    case("Concat", "Concat", _u(2, 1, 3), _u(2, 2, 3), _u(2, 3, 3), axis=1),
    case("Concat-negative-axis", "Concat", _u(2, 3), _u(2, 1), axis=-1),
]

# (torch dtype, onnx type, compute_dtype, (rtol, atol)) per tested dtype.
#  float32: the kernels and the reference differ only by summation order and libm.
#  float16/bfloat16: compared with the reference run at float32 on the same (rounded) inputs. torch
#   computes these dtypes in float32 and rounds once, so a result is within half an ulp of the float32
#   value (2**-11 relative for float16, 2**-8 for bfloat16), one ulp where an op rounds twice (LayerNorm's
#   spec path, Gemm's alpha): the tolerances are one ulp, 2**-10 ~ 1e-3 and 2**-7 ~ 8e-3.
#  oracle: float64 throughout, so tight enough that a kernel computing in float32 inside would fail.
FLOAT_DTYPES = {
    "float32": (torch.float32, TensorProto.FLOAT, None, (1e-5, 1e-6)),
    "float16": (torch.float16, TensorProto.FLOAT16, None, (1e-3, 1e-3)),
    "bfloat16": (torch.bfloat16, TensorProto.BFLOAT16, None, (8e-3, 8e-3)),
    "oracle": (torch.float64, TensorProto.DOUBLE, torch.float64, (1e-12, 1e-12)),
}


@pytest.mark.parametrize(
    ("c", "dtype"),
    [
        pytest.param(c, dtype, id=f"{c.id}-{dtype}")
        for c in FLOAT_CASES
        for dtype in FLOAT_DTYPES
        # bfloat16 enters these ops' type constraints at opset 13: an older model cannot carry it.
        if not (dtype == "bfloat16" and c.opset < 13)
    ],
)
def test_float_op(c: Case, dtype: str) -> None:
    torch_dtype, onnx_type, compute_dtype, (rtol, atol) = FLOAT_DTYPES[dtype]
    if dtype == "oracle" and c.op == "Erf":
        rtol = 1e-7  # onnx.reference's Erf is np.vectorize(math.erf, otypes="f"): float32 whatever the input
    ctx = KernelContext(device=CPU, opset=c.opset, compute_dtype=compute_dtype)
    wide = torch.float64 if dtype == "oracle" else torch.float32

    inputs, feeds = [], {}
    for i, value in enumerate(c.inputs):
        if isinstance(value, Init):
            inputs.append(torch.from_numpy(value.value))
            continue
        t = torch.from_numpy(value).to(torch_dtype)
        inputs.append(t)
        # The reference sees exactly the values the kernel sees, at float32 (float64 for the oracle).
        feeds[f"x{i}"] = t.to(wide).numpy()

    expected = run_reference(
        c, build(c, TensorProto.DOUBLE if dtype == "oracle" else TensorProto.FLOAT), feeds
    )
    model = build(c, onnx_type)
    got = run_kernel(model, ctx, inputs)

    for name, g, e, want in zip(
        model.graph.output, got, expected, spec_dtypes(model, ctx), strict=True
    ):
        assert g.dtype == want, name.name
        assert tuple(g.shape) == e.shape, name.name
        np.testing.assert_allclose(g.to(wide).numpy(), e, rtol=rtol, atol=atol, err_msg=name.name)

    if dtype == "float16" and c.ref == "onnx":
        _check_reference_at_float16(c, model, feeds, got)


def _check_reference_at_float16(
    c: Case, model: onnx.ModelProto, feeds: dict[str, np.ndarray], got: tuple[torch.Tensor, ...]
) -> None:
    """The reference on the float16 model agrees on dtypes (where it follows the spec) and, loosely, on values."""
    ref16 = ReferenceEvaluator(model).run(None, {k: v.astype(np.float16) for k, v in feeds.items()})
    for i, (g, r) in enumerate(zip(got, ref16, strict=True)):
        assert tuple(g.shape) == r.shape
        # onnx.reference returns LayerNormalization's Mean/InvStdDev in X's type; the spec (and shape
        # inference, and onnxruntime) say the stash type, float32: only there do we not follow it.
        if not (c.op == "LayerNormalization" and i > 0):
            assert str(g.dtype).removeprefix("torch.") == r.dtype.name
        # The reference accumulates in float16 itself: a few float16 ulps apart from a float32-accumulated result.
        np.testing.assert_allclose(g.float().numpy(), r.astype(np.float32), rtol=1e-2, atol=1e-2)


# -- integer cases --------------------------------------------------------------------------------


def _ints(*shape: int, lo: int = -9, hi: int = 10) -> np.ndarray:
    return _rng.integers(lo, hi, size=shape, dtype=np.int64)


INT_CASES = [
    case("Add", "Add", _ints(2, 3), _ints(3)),
    case("Sub", "Sub", _ints(2, 3), _ints(2, 1)),
    case("Mul", "Mul", _ints(2, 3), _ints(2, 3)),
    # ONNX integer Div truncates toward zero: -7 / 2 == -3, where numpy's // and torch's floor give -4.
    case(
        "Div-truncates",
        "Div",
        np.array([-7, 7, -7, 7, 6, -1], dtype=np.int64),
        np.array([2, -2, -2, 2, 4, 3], dtype=np.int64),
    ),
    case(
        "Div-broadcast", "Div", _ints(3, 4, lo=-50, hi=50), np.array([3, -4, 5, -7], dtype=np.int64)
    ),
    case("Pow", "Pow", _ints(2, 3, lo=-4, hi=5), _ints(2, 3, lo=0, hi=4)),
    case("Neg", "Neg", _ints(2, 3)),
    case("Abs", "Abs", _ints(2, 3)),
    case("Relu", "Relu", _ints(2, 3)),
    case("Identity", "Identity", _ints(2, 3)),
    case("MatMul", "MatMul", _ints(3, 4), _ints(4, 2)),
    case("MatMul-1d", "MatMul", _ints(4), _ints(4)),
    case("Gemm-int-scalars", "Gemm", _ints(3, 4), _ints(4, 2), _ints(2), alpha=2.0, beta=3.0),
    case("Gemm-fractional-alpha", "Gemm", _ints(3, 4), _ints(4, 2), _ints(3, 2), alpha=0.5),
    case("Einsum-implicit", "Einsum", _ints(3, 4), _ints(4, 2), opset=12, equation="ij,jk"),
    case("ReduceSum-13", "ReduceSum", _ints(2, 3, 4), _i64(1), opset=13),
    case("ReduceSum-all", "ReduceSum", _ints(2, 3, 4), opset=13, keepdims=0),
    # Integer mean truncates toward zero too (numpy's mean with an int dtype; onnxruntime's int division).
    case(
        "ReduceMean-18-truncates",
        "ReduceMean",
        np.array([[-3, -4, 5], [3, 4, -6]], dtype=np.int64),
        _i64(1),
        opset=18,
    ),
    case("ReduceMean-17-all", "ReduceMean", _ints(2, 3, 4), opset=17),
    case("Reshape", "Reshape", _ints(2, 3, 4), _i64(0, -1)),
    case("Transpose", "Transpose", _ints(2, 3, 4), perm=[2, 0, 1]),
    case("Squeeze", "Squeeze", _ints(1, 3), _i64(0), opset=13),
    case("Unsqueeze", "Unsqueeze", _ints(3), _i64(-1), opset=13),
    case("Concat", "Concat", _ints(2, 3), _ints(1, 3), axis=0),
]

INT_DTYPES = {"int32": (torch.int32, TensorProto.INT32), "int64": (torch.int64, TensorProto.INT64)}


@pytest.mark.parametrize("dtype", list(INT_DTYPES))
@pytest.mark.parametrize("c", INT_CASES, ids=lambda c: c.id)
def test_int_op(c: Case, dtype: str) -> None:
    torch_dtype, onnx_type = INT_DTYPES[dtype]
    ctx = KernelContext(device=CPU, opset=c.opset)
    np_dtype = np.dtype(str(torch_dtype).removeprefix("torch."))
    inputs, feeds = [], {}
    for i, value in enumerate(c.inputs):
        if isinstance(value, Init):
            inputs.append(torch.from_numpy(value.value))
        else:
            feeds[f"x{i}"] = value.astype(np_dtype)
            inputs.append(torch.from_numpy(feeds[f"x{i}"]))
    model = build(c, TensorProto.FLOAT, int_type=onnx_type)
    expected = ReferenceEvaluator(model).run(None, feeds)
    got = run_kernel(model, ctx, inputs)
    for g, e, want in zip(got, expected, spec_dtypes(model, ctx), strict=True):
        assert g.dtype == want
        np.testing.assert_array_equal(g.numpy(), e)


def test_int_div_truncates_toward_zero() -> None:
    """Independent of any reference: C-style truncation, not Python's floor."""
    k = lookup("", "Div", 18)(
        helper.make_node("Div", ["a", "b"], ["y"]), KernelContext(device=CPU, opset=18)
    )
    (y,) = k.run(
        torch.tensor([-7, 7, -7, 7], dtype=torch.int32),
        torch.tensor([2, -2, -2, 2], dtype=torch.int32),
    )
    assert y.dtype == torch.int32
    assert y.tolist() == [-3, -3, 3, 3]


# -- Pow with an exponent of another type ----------------------------------------------------------

POW_MIXED = [
    (
        "float16-base-float32-exponent",
        np.array([0.7, 1.3, 2.9], np.float16),
        np.array([2.5, -1.0, 0.5], np.float32),
    ),
    (
        "float32-base-int64-exponent",
        np.array([0.7, -1.3, 2.9], np.float32),
        np.array([2, 3, -1], np.int64),
    ),
    (
        "float32-base-int32-scalar-exponent",
        np.array([0.7, -1.3, 2.9], np.float32),
        np.array(3, np.int32),
    ),
    # int ** float: computed in floating point, the result truncated back to the base's int type.
    (
        "int64-base-float32-exponent",
        np.array([2, 3, 5], np.int64),
        np.array([2.5, 0.5, 1.0], np.float32),
    ),
]


@pytest.mark.parametrize(
    ("base", "exponent"), [p[1:] for p in POW_MIXED], ids=[p[0] for p in POW_MIXED]
)
def test_pow_output_has_base_type(base: np.ndarray, exponent: np.ndarray) -> None:
    node = helper.make_node("Pow", ["b", "e"], ["y"])
    graph = helper.make_graph(
        [node],
        "pow",
        [
            helper.make_tensor_value_info(
                "b", helper.np_dtype_to_tensor_dtype(base.dtype), base.shape
            ),
            helper.make_tensor_value_info(
                "e", helper.np_dtype_to_tensor_dtype(exponent.dtype), exponent.shape
            ),
        ],
        [
            helper.make_tensor_value_info(
                "y", helper.np_dtype_to_tensor_dtype(base.dtype), base.shape
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    (expected,) = ReferenceEvaluator(model).run(None, {"b": base, "e": exponent})
    (got,) = run_kernel(
        model,
        KernelContext(device=CPU, opset=18),
        [torch.from_numpy(base), torch.from_numpy(exponent)],
    )
    assert got.numpy().dtype == base.dtype == expected.dtype
    np.testing.assert_allclose(
        got.numpy().astype(np.float64),
        expected.astype(np.float64),
        rtol=1e-3 if base.dtype == np.float16 else 1e-6,
    )


@pytest.mark.parametrize(("exponent", "eager"), [(2.0, lambda x: x.pow(2)), (0.5, lambda x: x**0.5), (-1.0, lambda x: x ** -1.0), (3.0, lambda x: x.pow(3))])
def test_pow_by_a_constant_computes_as_eager_torch_and_squares_as_onnxruntime(exponent: float, eager: Any) -> None:
    """RMSNorm's Pow(x, 2) as exported from `x.pow(2)`: a one-element exponent goes to torch as a number,
    so the evaluator computes what the module did (x * x for 2), bit for bit, on the planned (direct) path
    and through the kernel's run alike; onnxruntime squares as x * x too. A one-element exponent of higher
    rank still broadcasts."""
    from pytest_ortdiff import OrtRunner, TorchEvaluator

    x = (torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(0)) * 3).abs() + 0.1
    e = onnx.numpy_helper.from_array(np.array(exponent, np.float32), "e")
    graph = helper.make_graph(
        [helper.make_node("Pow", ["x", "e"], ["y"])],
        "pow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32, 64])],
        [e],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    ev = TorchEvaluator(model)
    (planned,) = ev.run(None, {"x": x})
    (observed,) = ev.run(None, {"x": x}, observe=lambda node, outs: None)  # the kernel's own run
    assert torch.equal(planned, eager(x)) and torch.equal(observed, planned)
    if exponent == 2.0:
        assert torch.equal(planned, x * x) and torch.equal(OrtRunner(model).run(None, {"x": x})[0], planned)
    wide = np.array(exponent, np.float32).reshape(1, 1, 1, 1)  # broadcasts the base to rank 4
    (got,) = run_kernel(model_for_pow(wide), KernelContext(device=CPU, opset=18), [x[0, 0], torch.from_numpy(wide)])
    assert got.shape == (1, 1, 1, 64) and torch.equal(got.reshape(-1), eager(x[0, 0]))


def model_for_pow(exponent: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Pow", ["b", "e"], ["y"])],
        "pow",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [64]), helper.make_tensor_value_info("e", TensorProto.FLOAT, list(exponent.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 1, 64])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


# -- Cast -------------------------------------------------------------------------------------------

_FRACTIONS = np.array([-2.7, -1.5, -0.5, 0.0, 0.4, 1.5, 2.5, 3.99], dtype=np.float32)
CASTS = [
    ("float32", _FRACTIONS, TensorProto.FLOAT16),
    ("float32", _FRACTIONS, TensorProto.BFLOAT16),
    ("float32", _FRACTIONS, TensorProto.DOUBLE),
    ("float32", _FRACTIONS, TensorProto.INT32),  # truncation toward zero: -2.7 -> -2, 3.99 -> 3
    ("float32", _FRACTIONS, TensorProto.INT64),
    ("float32", _FRACTIONS, TensorProto.BOOL),
    ("float32", np.abs(_FRACTIONS) * 50, TensorProto.UINT8),
    ("float16", _FRACTIONS.astype(np.float16), TensorProto.FLOAT),
    ("float16", _FRACTIONS.astype(np.float16), TensorProto.INT64),
    ("float64", _FRACTIONS.astype(np.float64) / 3, TensorProto.FLOAT),
    ("int64", np.array([-3, 0, 7, 2049], np.int64), TensorProto.FLOAT16),
    ("int64", np.array([-3, 0, 7, 2**40 + 1], np.int64), TensorProto.INT32),
    ("int32", np.array([-3, 0, 7], np.int32), TensorProto.FLOAT),
    ("bool", np.array([True, False, True]), TensorProto.FLOAT),
]


@pytest.mark.parametrize("opset", [13, 19])
@pytest.mark.parametrize(
    ("source", "to"),
    [(c[1], c[2]) for c in CASTS],
    ids=[f"{c[0]}-to-{TensorProto.DataType.Name(c[2]).lower()}" for c in CASTS],
)
def test_cast(source: np.ndarray, to: int, opset: int) -> None:
    node = helper.make_node("Cast", ["x"], ["y"], to=to)
    graph = helper.make_graph(
        [node],
        "cast",
        [
            helper.make_tensor_value_info(
                "x", helper.np_dtype_to_tensor_dtype(source.dtype), source.shape
            )
        ],
        [helper.make_tensor_value_info("y", to, source.shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(model, full_check=True)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": source})
    ctx = KernelContext(device=CPU, opset=opset)
    (got,) = run_kernel(model, ctx, [torch.from_numpy(source)])
    assert got.dtype == ctx.torch_dtype(to)
    # Both round to nearest-even (float targets) or truncate (int targets): exact equality.
    np.testing.assert_array_equal(got.to(torch.float64).numpy(), expected.astype(np.float64))


def test_cast_in_oracle_mode_keeps_float64() -> None:
    ctx = KernelContext(device=CPU, opset=19, compute_dtype=torch.float64)
    x = torch.tensor([1.0 / 3.0, -2.7], dtype=torch.float64)
    (half,) = lookup("", "Cast", 19)(
        helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16), ctx
    ).run(x)
    assert half.dtype == torch.float64
    assert half.tolist() == x.tolist()  # no float16 rounding recorded in the oracle
    (ints,) = lookup("", "Cast", 19)(
        helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT32), ctx
    ).run(x)
    assert ints.dtype == torch.int32
    assert ints.tolist() == [0, -2]


@pytest.mark.parametrize(
    "to",
    [TensorProto.STRING, TensorProto.FLOAT4E2M1],
    ids=lambda t: TensorProto.DataType.Name(t).lower(),
)
def test_cast_refuses_unsupported_targets(to: int) -> None:
    node = helper.make_node("Cast", ["x"], ["y"], to=to, saturate=0)
    with pytest.raises(UnsupportedVariantError, match=TensorProto.DataType.Name(to)):
        lookup("", "Cast", 19)(node, KernelContext(device=CPU, opset=19))


# -- LayerNormalization specifics ---------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [torch.float16, torch.bfloat16, torch.float32],
    ids=lambda d: str(d).removeprefix("torch."),
)
def test_layer_norm_stats_are_in_the_stash_type(dtype: torch.dtype) -> None:
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"], axis=1)
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(0)).to(dtype)
    y, mean, inv = lookup("", "LayerNormalization", 17)(
        node, KernelContext(device=CPU, opset=17)
    ).run(x, torch.ones(3, 4, dtype=dtype))
    assert (y.dtype, mean.dtype, inv.dtype) == (dtype, torch.float32, torch.float32)
    assert mean.shape == inv.shape == (2, 1, 1)
    xf = x.float()
    torch.testing.assert_close(mean, xf.mean((1, 2), keepdim=True))
    torch.testing.assert_close(
        inv, 1 / torch.sqrt(xf.var((1, 2), unbiased=False, keepdim=True) + 1e-5)
    )


def test_layer_norm_skips_stats_when_not_asked() -> None:
    """Optional outputs named "" are not wanted: one output, no second reduction."""
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "", ""])
    k = lookup("", "LayerNormalization", 17)(node, KernelContext(device=CPU, opset=17))
    assert not k.want_stats
    assert len(k.run(torch.randn(2, 4), torch.ones(4))) == 1


def test_layer_norm_oracle_mode_stats_in_float64() -> None:
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"])
    ctx = KernelContext(device=CPU, opset=17, compute_dtype=torch.float64)
    x = torch.randn(3, 5, dtype=torch.float64)
    y, mean, inv = lookup("", "LayerNormalization", 17)(node, ctx).run(
        x, torch.ones(5, dtype=torch.float64), torch.zeros(5, dtype=torch.float64)
    )
    assert y.dtype == mean.dtype == inv.dtype == torch.float64
    torch.testing.assert_close(mean, x.mean(-1, keepdim=True))


def test_layer_norm_refuses_integer_stash_type() -> None:
    node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=TensorProto.INT64)
    with pytest.raises(UnsupportedVariantError, match="stash_type"):
        lookup("", "LayerNormalization", 17)(node, KernelContext(device=CPU, opset=17))


# -- Constant -----------------------------------------------------------------------------------

CONSTANTS = {
    "value-float32": {"value": onnx.numpy_helper.from_array(_u(2, 3), "c")},
    "value-float16": {"value": onnx.numpy_helper.from_array(_u(3).astype(np.float16), "c")},
    "value-int64": {"value": onnx.numpy_helper.from_array(np.arange(4, dtype=np.int64), "c")},
    "value_float": {"value_float": 0.1},
    "value_floats": {"value_floats": [0.1, -2.5, 3.0]},
    "value_int": {"value_int": -7},
    "value_ints": {"value_ints": [3, 0, -1]},
}


@pytest.mark.parametrize("oracle", [False, True], ids=["plain", "oracle"])
@pytest.mark.parametrize("attrs", list(CONSTANTS.values()), ids=list(CONSTANTS))
def test_constant(attrs: dict[str, Any], oracle: bool) -> None:
    node = helper.make_node("Constant", [], ["y"], **attrs)
    graph = helper.make_graph([node], "constant", [], [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    onnx.checker.check_model(model, full_check=True)
    (expected,) = ReferenceEvaluator(model).run(None, {})
    ctx = KernelContext(device=CPU, opset=18, compute_dtype=torch.float64 if oracle else None)
    kernel = lookup("", "Constant", 18)(node, ctx)
    (got,) = kernel.run()
    assert got.dtype == spec_dtypes(model, ctx)[0]
    assert got.device == CPU
    assert tuple(got.shape) == expected.shape
    # The oracle promotes the stored value exactly (float32 -> float64 is exact), no rounding either way.
    np.testing.assert_array_equal(got.to(torch.float64).numpy(), expected.astype(np.float64))
    assert kernel.run()[0] is got  # built once, in __init__


@pytest.mark.parametrize(
    "attrs",
    [
        {"value_string": "hello"},
        {"value_strings": ["a", "b"]},
        {"value": helper.make_tensor("c", TensorProto.STRING, [1], [b"x"])},
        {
            "sparse_value": helper.make_sparse_tensor(
                helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0]),
                helper.make_tensor("i", TensorProto.INT64, [1], [0]),
                [3],
            )
        },
    ],
    ids=["value_string", "value_strings", "string-tensor", "sparse_value"],
)
def test_constant_refuses_strings_and_sparse(attrs: dict[str, Any]) -> None:
    node = helper.make_node("Constant", [], ["y"], **attrs)
    with pytest.raises(UnsupportedVariantError):
        lookup("", "Constant", 18)(node, KernelContext(device=CPU, opset=18))


# -- registry and odds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "opset", "expected"),
    [
        ("Softmax", 11, softmax.Softmax),
        ("Softmax", 12, softmax.Softmax),
        ("Softmax", 13, softmax.Softmax13),
        ("LogSoftmax", 12, softmax.LogSoftmax),
        ("LogSoftmax", 21, softmax.LogSoftmax13),
        ("ReduceSum", 12, reduction.ReduceSum),
        ("ReduceSum", 13, reduction.ReduceSum13),
        ("ReduceMean", 17, reduction.ReduceMean),
        ("ReduceMean", 18, reduction.ReduceMean18),
        ("Squeeze", 12, shape.Squeeze),
        ("Squeeze", 13, shape.Squeeze13),
        ("Unsqueeze", 13, shape.Unsqueeze13),
        ("Cast", 18, cast.Cast),
        ("Cast", 19, cast.Cast19),
        ("Gemm", 11, matmul.Gemm),
        ("Add", 6, None),  # legacy `broadcast`/`axis` semantics: no kernel rather than a wrong one
        ("LayerNormalization", 16, contrib_normalization.LayerNormalization1),  # onnxruntime's own, before ONNX's 17
        ("LayerNormalization", 17, nn_normalization.LayerNormalization),
    ],
    ids=lambda v: v if isinstance(v, str | int) else None,
)
def test_lookup_picks_the_version(op: str, opset: int, expected: type | None) -> None:
    assert lookup("", op, opset) is expected


def test_squeeze_of_a_non_unit_dim_is_an_error() -> None:
    k = lookup("", "Squeeze", 13)(
        helper.make_node("Squeeze", ["x", "axes"], ["y"]), KernelContext(device=CPU, opset=13)
    )
    with pytest.raises(ValueError, match="not 1"):
        k.run(torch.zeros(2, 3), torch.tensor([1]))


def test_every_kernel_is_tested() -> None:
    # the ops this file covers (the other families have their own test modules)
    ops = {
        "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Exp", "Log", "Tanh", "Erf",
        "Sigmoid", "Relu", "Abs", "Identity", "Cast", "MatMul", "Gemm", "Einsum", "LayerNormalization",
        "Softmax", "LogSoftmax", "ReduceSum", "ReduceMean", "Reshape", "Transpose", "Squeeze",
        "Unsqueeze", "Concat", "Constant",
    }  # fmt: skip
    assert ops <= {op for (_, op) in REGISTRY}
    tested = {c.op for c in FLOAT_CASES + INT_CASES} | {"Cast", "Constant"}
    assert ops - tested == set()
