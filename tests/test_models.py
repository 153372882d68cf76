"""The seeds/000 graph builder, random_feeds and the torch twin: a valid model with symbolic dims,
seeded feeds in their recorded ranges, and a twin that computes what the graph computes."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
import torch

from pytest_ortdiff import TorchEvaluator, models
from pytest_ortdiff.models import (
    LayerNormMatMulAdd,
    layer_norm_matmul_add,
    random_feeds,
    set_feed_range,
)

DIMS = {"a": 2, "b": 8, "c": 16}
INPUTS = ["X", "scale", "bias", "weights", "bias2"]
SHAPES = {"X": (2, 8, 16), "scale": (16,), "bias": (16,), "weights": (16, 16), "bias2": (16,)}


def _dims(vi: onnx.ValueInfoProto) -> list[object]:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_builder_passes_the_full_checker_with_symbolic_dims(dtype: str) -> None:
    model = layer_norm_matmul_add(dtype=dtype)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    values = {vi.name: vi for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)) if dtype != "bfloat16" else onnx.TensorProto.BFLOAT16
    assert {name: _dims(vi) for name, vi in values.items()} == {
        "X": ["a", "b", "c"],
        "scale": ["c"],
        "bias": ["c"],
        "weights": ["c", "c"],
        "bias2": ["c"],
        "norm": ["a", "b", "c"],
        "mm": ["a", "b", "c"],
        "Z": ["a", "b", "c"],
    }
    assert {vi.type.tensor_type.elem_type for vi in values.values()} == {elem}
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization", "MatMul", "Add"]
    assert [n.name for n in model.graph.node] == ["layer_norm", "matmul", "add"]
    assert [i.name for i in model.graph.input] == INPUTS


@pytest.mark.parametrize("opset", [17, 18, 21])
def test_opset_is_honoured(opset: int) -> None:
    model = layer_norm_matmul_add(dtype="float32", opset=opset)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", opset)]
    onnx.checker.check_model(model, full_check=True)


def test_opset_below_17_is_an_error() -> None:
    with pytest.raises(ValueError, match=re.escape("LayerNormalization needs opset >= 17, got opset=16")):
        layer_norm_matmul_add(opset=16)


def test_epsilon_is_the_node_attribute() -> None:
    (ln,) = [n for n in layer_norm_matmul_add(epsilon=1e-3).graph.node if n.op_type == "LayerNormalization"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in ln.attribute}
    assert attrs == {"axis": -1, "epsilon": pytest.approx(1e-3)}


def test_default_dtype_is_float16() -> None:
    assert layer_norm_matmul_add().graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_builder_declares_its_dims_for_hypothesis() -> None:
    assert layer_norm_matmul_add.dims == {"a": (1, 4), "b": (1, 64), "c": (1, 256)}
    assert layer_norm_matmul_add.constraints == ()


# -- random_feeds ---------------------------------------------------------------------------------


def test_feed_shapes_come_from_dims() -> None:
    feeds = random_feeds(layer_norm_matmul_add(dtype="float32"), dims=DIMS, seed=0)
    assert list(feeds) == INPUTS
    assert {k: tuple(v.shape) for k, v in feeds.items()} == SHAPES
    assert {v.dtype for v in feeds.values()} == {torch.float32}
    assert {v.device.type for v in feeds.values()} == {"cpu"}


def test_feed_value_ranges() -> None:
    feeds = random_feeds(layer_norm_matmul_add(dtype="float32"), dims={"a": 4, "b": 64, "c": 64}, seed=3)
    x = feeds["X"]
    assert x.min() >= -60 and x.max() < 60
    assert x.min() < -55 and x.max() > 55  # the whole range is used
    for name in ("scale", "bias", "weights", "bias2"):
        v = feeds[name]
        assert v.min() >= 0 and v.max() < 1, name
    assert feeds["weights"].min() < 0.05 and feeds["weights"].max() > 0.95


def test_ranges_are_recorded_in_the_model_metadata() -> None:
    props = {p.key: p.value for p in layer_norm_matmul_add().metadata_props}
    assert props == {
        "ortdiff.range.X": "-60.0,60.0",
        "ortdiff.range.scale": "0.0,1.0",
        "ortdiff.range.bias": "0.0,1.0",
        "ortdiff.range.weights": "0.0,1.0",
        "ortdiff.range.bias2": "0.0,1.0",
    }


def test_set_feed_range_changes_what_is_drawn() -> None:
    model = layer_norm_matmul_add(dtype="float32")
    set_feed_range(model, "X", 5.0, 6.0)
    x = random_feeds(model, dims=DIMS)["X"]
    assert x.min() >= 5.0 and x.max() < 6.0
    with pytest.raises(ValueError, match=re.escape("feed range for 'X' must have low < high, got [6.0, 5.0)")):
        set_feed_range(model, "X", 6.0, 5.0)


def test_same_seed_same_feeds_other_seed_other_feeds() -> None:
    model = layer_norm_matmul_add(dtype="float32")
    a = random_feeds(model, dims=DIMS, seed=7)
    b = random_feeds(model, dims=DIMS, seed=7)
    c = random_feeds(model, dims=DIMS, seed=8)
    assert all(torch.equal(a[k], b[k]) for k in INPUTS)
    assert not any(torch.equal(a[k], c[k]) for k in INPUTS)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_other_dtypes_are_the_float32_feeds_rounded(dtype: str) -> None:
    f32 = random_feeds(layer_norm_matmul_add(dtype="float32"), dims=DIMS, seed=0)
    other = random_feeds(layer_norm_matmul_add(dtype=dtype), dims=DIMS, seed=0)
    target = getattr(torch, dtype)
    if dtype == "float64":
        # float64 draws in float64: the same generator, not the float32 values
        assert {v.dtype for v in other.values()} == {torch.float64}
        assert other["X"].min() >= -60 and other["X"].max() < 60
        return
    for k in INPUTS:
        assert other[k].dtype == target
        assert torch.equal(other[k], f32[k].to(target)), k


def test_dtype_override_of_floating_inputs() -> None:
    model = layer_norm_matmul_add(dtype="float32")
    half = random_feeds(model, dims=DIMS, seed=0, dtype="float16")
    f32 = random_feeds(model, dims=DIMS, seed=0)
    assert {v.dtype for v in half.values()} == {torch.float16}
    assert all(torch.equal(half[k], f32[k].half()) for k in INPUTS)


def test_missing_dim_is_named() -> None:
    model = layer_norm_matmul_add(dtype="float32")
    with pytest.raises(ValueError, match=re.escape("random_feeds needs a value for the symbolic dims ['c']; pass dims={'c': ...}")):
        random_feeds(model, dims={"a": 2, "b": 8})
    with pytest.raises(ValueError, match=re.escape("symbolic dims ['a', 'b', 'c']; pass dims={'a': ..., 'b': ..., 'c': ...}")):
        random_feeds(model)
    # a misspelt name is named with the missing one (a new user's dims={"batch": 2, "sq": 16})
    with pytest.raises(ValueError, match=re.escape("pass dims={'c': ...} ('cc' is not a dim of its inputs; theirs: ['a', 'b', 'c'])")):
        random_feeds(model, dims={"a": 2, "b": 8, "cc": 16})


def test_random_feeds_accepts_a_path(tmp_path: object) -> None:
    model = layer_norm_matmul_add(dtype="float32")
    path = tmp_path / "m.onnx"  # type: ignore[operator]
    onnx.save(model, str(path))
    a = random_feeds(path, dims=DIMS, seed=1)
    b = random_feeds(model, dims=DIMS, seed=1)
    assert all(torch.equal(a[k], b[k]) for k in INPUTS)


# -- the torch twin ---------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [1e-5, 1.0])
def test_torch_twin_matches_the_evaluator(epsilon: float) -> None:
    model = layer_norm_matmul_add(dtype="float32", epsilon=epsilon)
    feeds = random_feeds(model, dims=DIMS, seed=0)
    (z,) = TorchEvaluator(model).run(None, feeds)
    twin = LayerNormMatMulAdd(epsilon=epsilon)
    with torch.no_grad():
        out = twin(*(feeds[k] for k in INPUTS))
    assert out.dtype == torch.float32
    assert tuple(out.shape) == (2, 8, 16)
    torch.testing.assert_close(out, z, atol=1e-4, rtol=1e-4)


def test_torch_twin_epsilon_matters() -> None:
    feeds = random_feeds(layer_norm_matmul_add(dtype="float32"), dims={"a": 1, "b": 4, "c": 8}, seed=0)
    feeds["X"] = feeds["X"] / 100  # variance ~0.1: an epsilon of 1 changes the result
    args = [feeds[k] for k in INPUTS]
    assert (LayerNormMatMulAdd(1e-5)(*args) - LayerNormMatMulAdd(1.0)(*args)).abs().max() > 0.1


def test_models_namespace_is_public() -> None:
    assert set(models.__all__) >= {"LayerNormMatMulAdd", "layer_norm_matmul_add", "random_feeds", "set_feed_range"}
