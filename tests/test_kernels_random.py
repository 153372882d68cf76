"""The random generator kernels: shapes, dtypes, the seed's determinism and the distributions' moments
(values cannot match another runtime's draws; conformance counts them as refused, never as passing)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from kernel_harness import run_torch
from onnx import TensorProto, helper


def _model(op: str, inputs: dict[str, np.ndarray], out_type: int, out_shape: tuple[int, ...], **attrs: Any) -> Any:
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()]
    graph = helper.make_graph([node], op, ins, [helper.make_tensor_value_info("y", out_type, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(
    ("op", "attrs", "mean", "std"),
    [
        ("RandomNormal", {"mean": 2.0, "scale": 0.5}, 2.0, 0.5),
        ("RandomUniform", {"low": -1.0, "high": 3.0}, 1.0, 4 / 12**0.5),
    ],
)
def test_random_normal_and_uniform(op: str, attrs: dict[str, Any], mean: float, std: float) -> None:
    model = _model(op, {}, TensorProto.FLOAT, (200, 100), shape=[200, 100], seed=3.0, **attrs)
    a, b = run_torch(model, {})[0], run_torch(model, {})[0]
    assert a.shape == (200, 100) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)  # a seed makes the draws reproducible
    assert abs(a.mean() - mean) < 0.05 and abs(a.std() - std) < 0.05
    if op == "RandomUniform":
        assert a.min() >= -1.0 and a.max() <= 3.0


def test_like_ops_take_the_input_shape_and_dtype() -> None:
    x = np.zeros((3, 4), dtype=np.float16)
    model = _model("RandomUniformLike", {"x": x}, TensorProto.FLOAT16, (3, 4))
    (y,) = run_torch(model, {"x": x})
    assert y.shape == (3, 4) and y.dtype == np.float16
    model = _model("RandomNormalLike", {"x": x}, TensorProto.DOUBLE, (3, 4), dtype=TensorProto.DOUBLE)
    assert run_torch(model, {"x": x})[0].dtype == np.float64


def test_bernoulli_and_multinomial() -> None:
    p = np.array([0.0, 1.0, 0.5] * 2000, dtype=np.float32)
    (y,) = run_torch(_model("Bernoulli", {"p": p}, TensorProto.FLOAT, p.shape, seed=1.0), {"p": p})
    assert set(np.unique(y)) <= {0.0, 1.0}
    np.testing.assert_array_equal(y[0::3], 0.0)
    np.testing.assert_array_equal(y[1::3], 1.0)
    assert 0.45 < y[2::3].mean() < 0.55
    logits = np.log(np.array([[0.1, 0.9], [0.9, 0.1]], dtype=np.float32))
    model = _model("Multinomial", {"l": logits}, TensorProto.INT32, (2, 2000), sample_size=2000, seed=2.0)
    (s,) = run_torch(model, {"l": logits})
    assert s.dtype == np.int32 and s.shape == (2, 2000)
    assert 0.85 < s[0].mean() < 0.95 and 0.05 < s[1].mean() < 0.15
