"""The training-family optimizer steps and the numeric ai.onnx.ml ops against onnx.reference (and
onnxruntime for the ml ops)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from kernel_harness import assert_outputs_close, run_ort, run_reference, run_torch
from onnx import helper

_rng = np.random.default_rng(11)
TRAINING = "ai.onnx.preview.training"


def _model(
    op: str, domain: str, feeds: dict[str, np.ndarray], outputs: dict[str, tuple[int, ...]], **attrs: Any
) -> onnx.ModelProto:
    node = helper.make_node(op, list(feeds), outputs, domain=domain, **attrs)
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, shape) for o, shape in outputs.items()]
    graph = helper.make_graph([node], op, inputs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(domain, 1)])


def _f(*shape: int) -> np.ndarray:
    return _rng.uniform(-1, 1, size=shape).astype(np.float32)


@pytest.mark.parametrize("step", [0, 3])
@pytest.mark.parametrize(
    ("op", "states", "attrs"),
    [
        ("Adagrad", 1, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01}),
        ("Adam", 2, {"alpha": 0.8, "beta": 0.95, "norm_coefficient": 0.01, "norm_coefficient_post": 0.02}),
        ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}),
        ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}),
    ],
)
def test_optimizer_steps_for_two_tensors(op: str, states: int, attrs: dict[str, Any], step: int) -> None:
    feeds = {"r": np.array(0.1, np.float32), "t": np.array(step, np.int64)}
    groups = ["x", "g"] + [f"s{k}" for k in range(states)]
    for name in groups:
        for i, shape in enumerate([(3,), (2, 2)]):
            feeds[f"{name}{i}"] = np.abs(_f(*shape)) if name.startswith("s") else _f(*shape)
    order = ["r", "t"] + [f"{name}{i}" for name in groups for i in range(2)]
    feeds = {k: feeds[k] for k in order}
    outputs = {f"out_{name}{i}": feeds[f"x{i}"].shape for name in ["x", *groups[2:]] for i in range(2)}
    model = _model(op, TRAINING, feeds, outputs, **attrs)
    got = run_torch(model, feeds)
    assert_outputs_close(got, run_reference(model, feeds), (1e-5, 1e-6), outputs)


def test_array_feature_extractor_and_binarizer() -> None:
    x = _f(3, 5)
    idx = np.array([4, 0, 2], dtype=np.int64)
    model = _model("ArrayFeatureExtractor", "ai.onnx.ml", {"x": x, "i": idx}, {"y": (3, 3)})
    got = run_torch(model, {"x": x, "i": idx})
    np.testing.assert_array_equal(got[0], x[:, [4, 0, 2]])
    assert_outputs_close(got, run_ort(model, {"x": x, "i": idx}), (0, 0), ["y"])
    model = _model("Binarizer", "ai.onnx.ml", {"x": x}, {"y": (3, 5)}, threshold=0.25)
    got = run_torch(model, {"x": x})
    np.testing.assert_array_equal(got[0], (x > 0.25).astype(np.float32))
    assert_outputs_close(got, run_ort(model, {"x": x}), (0, 0), ["y"])
