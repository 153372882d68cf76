"""Sequences (Python lists of tensors) and optionals (None = empty) in the torch evaluator: the Sequence*
ops, SplitToSequence, ConcatFromSequence, SequenceMap, Optional*, sequence feeds and outputs, and the
refusal by name of what torch cannot hold (strings)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch
from kernel_harness import REF_TOL, run_ort, run_reference
from onnx import TensorProto as TP
from onnx import numpy_helper

from pytest_ortdiff.runtimes.evaluator import TorchEvaluator
from pytest_ortdiff.runtimes.kernels import UnsupportedVariantError, optional, sequence  # noqa: F401  (registration, until kernels/__init__ does)

RNG = np.random.default_rng(0)


def vi(name: str, elem: int, shape: list | None) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def seq_vi(name: str, elem: int, shape: list | None = None) -> onnx.ValueInfoProto:
    return oh.make_value_info(name, oh.make_sequence_type_proto(oh.make_tensor_type_proto(elem, shape)))


def ints(name: str, *values: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values[0] if len(values) == 1 else values, np.int64), name)


def model(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 18) -> onnx.ModelProto:
    m = oh.make_model(oh.make_graph(nodes, "g", inputs, outputs, inits or []), opset_imports=[oh.make_opsetid("", opset)], ir_version=9)
    onnx.checker.check_model(m, full_check=True)
    return m


def evaluate(m: onnx.ModelProto, feeds: dict[str, Any], **kwargs: Any) -> list[Any]:
    """The evaluator's outputs as numpy: arrays, lists of arrays for sequences."""
    torch_feeds = {k: [torch.from_numpy(e) for e in v] if isinstance(v, list) else None if v is None else torch.from_numpy(v) for k, v in feeds.items()}
    return [[e.numpy() for e in o] if isinstance(o, list) else o.numpy() for o in TorchEvaluator(m, **kwargs).run(None, torch_feeds)]


def assert_same(got: list[Any], expected: list[Any], tol: tuple[float, float] = REF_TOL["float32"]) -> None:
    """Outputs equal in structure (tensor or sequence and its length), dtype, shape and value."""
    __tracebackhide__ = True
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if isinstance(e, list):
            assert isinstance(g, list) and len(g) == len(e), f"output {i}: {type(g).__name__} of {len(g)} instead of a sequence of {len(e)}"
            assert_same(g, e, tol)
            continue
        e = np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape, f"output {i}: {g.dtype}{g.shape} instead of {e.dtype}{e.shape}"
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=tol[0], atol=tol[1])


# -- the Sequence* ops ---------------------------------------------------------------------------------


def sequence_ops_model(elem: int) -> onnx.ModelProto:
    """s = [a, b]; s2 = s with c inserted at pos; the last of s2; s2 without its first; its length; it
    concatenated on axis 0; s stacked on a new last axis; s2 itself (a sequence output)."""
    nodes = [
        oh.make_node("SequenceConstruct", ["a", "b"], ["s"]),
        oh.make_node("SequenceInsert", ["s", "c", "pos"], ["s2"]),
        oh.make_node("SequenceAt", ["s2", "minus_one"], ["last"]),
        oh.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
        oh.make_node("SequenceLength", ["s3"], ["n"]),
        oh.make_node("ConcatFromSequence", ["s3"], ["cat"], axis=0),
        oh.make_node("ConcatFromSequence", ["s"], ["stacked"], axis=-1, new_axis=1),
        oh.make_node("SequenceErase", ["s2"], ["s4"]),
        oh.make_node("SequenceInsert", ["s4", "a"], ["s5"]),
    ]
    return model(
        nodes,
        [vi("a", elem, [2, 3]), vi("b", elem, [2, 3]), vi("c", elem, [1, 3]), vi("pos", TP.INT64, [])],
        [vi("last", elem, ["r", 3]), vi("n", TP.INT64, []), vi("cat", elem, ["r", 3]), vi("stacked", elem, [2, 3, 2]), seq_vi("s2", elem), seq_vi("s5", elem)],
        [ints("minus_one", -1), ints("zero", 0)],
    )


@pytest.mark.parametrize("pos", [0, -1, 2], ids=["front", "before-last", "end"])
def test_sequence_ops(pos: int) -> None:
    feeds: dict[str, Any] = {"a": RNG.standard_normal((2, 3)).astype(np.float32), "b": RNG.standard_normal((2, 3)).astype(np.float32), "c": RNG.standard_normal((1, 3)).astype(np.float32), "pos": np.array(pos, np.int64)}
    m = sequence_ops_model(TP.FLOAT)
    got = evaluate(m, feeds)
    assert_same(got, run_ort(m, feeds))
    if pos != 2:  # onnx.reference inserts at position len (the end) at the front: (pos + len) % len
        assert_same(got, run_reference(m, feeds))
    order = [feeds["a"], feeds["b"]]
    order.insert(pos if pos >= 0 else pos + 2, feeds["c"])
    assert_same(got[4], order, (0, 0))
    # float16 against onnxruntime; the oracle keeps every element in float64
    f16: dict[str, Any] = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}
    m16 = sequence_ops_model(TP.FLOAT16)
    assert_same(evaluate(m16, f16), run_ort(m16, f16), REF_TOL["float16"])
    oracle = evaluate(m, feeds, compute_dtype=torch.float64)
    assert oracle[0].dtype == np.float64 and all(e.dtype == np.float64 for e in oracle[4])


def test_sequence_position_out_of_range_is_an_error() -> None:
    m = sequence_ops_model(TP.FLOAT)
    feeds = {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32), "c": np.zeros((1, 3), np.float32), "pos": np.array(3, np.int64)}
    with pytest.raises(RuntimeError, match=r"SequenceInsert: position 3 is out of range \[-2, 2\] for a sequence of 2 tensors"):
        evaluate(m, feeds)


@pytest.mark.parametrize(
    ("split", "attrs"),
    [(None, {}), (None, {"axis": 1, "keepdims": 0}), (np.array(3, np.int64), {}), (np.array([1, 2], np.int64), {"axis": -1})],
    ids=["ones-keepdims", "ones-squeezed-axis1", "scalar-split", "lengths"],
)
def test_split_to_sequence(split: np.ndarray | None, attrs: dict[str, Any]) -> None:
    inputs = ["x"] + (["split"] if split is not None else [])
    inits = [numpy_helper.from_array(split, "split")] if split is not None else []
    m = model([oh.make_node("SplitToSequence", inputs, ["seq"], **attrs)], [vi("x", TP.FLOAT, [4, 3])], [seq_vi("seq", TP.FLOAT)], inits)
    feeds: dict[str, Any] = {"x": RNG.standard_normal((4, 3)).astype(np.float32)}
    got = evaluate(m, feeds)
    assert_same(got, run_ort(m, feeds), (0, 0))
    assert_same(got, run_reference(m, feeds), (0, 0))


# -- SequenceMap ---------------------------------------------------------------------------------------


def sequence_map_model() -> onnx.ModelProto:
    """Per element x_i of a sequence of 1-D tensors of different lengths, with the tensor w and the
    outer-scope value bias: (x_i * w + bias, shape(x_i))."""
    body = oh.make_graph(
        [oh.make_node("Mul", ["x_i", "w_i"], ["p"]), oh.make_node("Add", ["p", "bias"], ["y_i"]), oh.make_node("Shape", ["x_i"], ["shape_i"])],
        "map_body",
        [vi("x_i", TP.FLOAT, ["n"]), vi("w_i", TP.FLOAT, [])],
        [vi("y_i", TP.FLOAT, ["n"]), vi("shape_i", TP.INT64, [1])],
    )
    node = oh.make_node("SequenceMap", ["xs", "w"], ["ys", "shapes"], body=body, name="map")
    return model([node], [seq_vi("xs", TP.FLOAT, ["n"]), vi("w", TP.FLOAT, []), vi("bias", TP.FLOAT, [])], [seq_vi("ys", TP.FLOAT), seq_vi("shapes", TP.INT64)], opset=17)


def test_sequence_map_runs_its_body_per_element_with_outer_scope_values() -> None:
    m = sequence_map_model()
    feeds: dict[str, Any] = {"xs": [RNG.standard_normal(n).astype(np.float32) for n in (3, 1, 4)], "w": np.array(2.0, np.float32), "bias": np.array(0.5, np.float32)}
    got = evaluate(m, feeds)
    # onnx.reference's SequenceMap does not give its body the outer scope ("Unable to find input 'bias'")
    assert_same(got, run_ort(m, feeds))
    assert_same(got[0], [x * 2 + 0.5 for x in feeds["xs"]])
    # an override by node name reaches the body
    (ys, _) = evaluate(m, feeds, kernels={("", "Mul"): lambda a, b: a - b})
    assert_same(ys, [x - 2 + 0.5 for x in feeds["xs"]])


# -- optionals ------------------------------------------------------------------------------------------


def optional_model() -> onnx.ModelProto:
    """has = the optional input holds a value; got = the tensor x through Optional and OptionalGetElement;
    none = whether an empty Optional (of the `type` attribute) holds one."""
    opt = oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, [2]))
    nodes = [
        oh.make_node("OptionalHasElement", ["opt"], ["has"]),
        oh.make_node("Optional", ["x"], ["wrapped"]),
        oh.make_node("OptionalGetElement", ["wrapped"], ["got"]),
        oh.make_node("Optional", [], ["empty"], type=oh.make_tensor_type_proto(TP.FLOAT, [2])),
        oh.make_node("OptionalHasElement", ["empty"], ["none"]),
    ]
    return model(nodes, [oh.make_value_info("opt", opt), vi("x", TP.FLOAT, [2])], [vi("has", TP.BOOL, []), vi("got", TP.FLOAT, [2]), vi("none", TP.BOOL, [])])


@pytest.mark.parametrize("full", [True, False], ids=["full", "empty"])
def test_optionals(full: bool) -> None:
    m = optional_model()
    feeds: dict[str, Any] = {"opt": np.ones(2, np.float32) if full else None, "x": np.array([1.5, -2.0], np.float32)}
    got = evaluate(m, feeds)
    # onnx.reference is wrong on two of these: its OptionalGetElement returns [x] for Optional(x), and
    # its empty Optional has an element; onnxruntime follows the spec
    assert_same(got, run_ort(m, feeds))
    assert_same(got[:1], run_reference(m, feeds)[:1])
    assert bool(got[0]) is full and not bool(got[2])


def test_optional_get_element_of_an_empty_optional_is_an_error() -> None:
    opt = oh.make_optional_type_proto(oh.make_tensor_type_proto(TP.FLOAT, [2]))
    m = model([oh.make_node("OptionalGetElement", ["opt"], ["y"], name="get")], [oh.make_value_info("opt", opt)], [vi("y", TP.FLOAT, [2])])
    with pytest.raises(RuntimeError, match=r"node 'get' \(OptionalGetElement\) with inputs opt: empty optional: OptionalGetElement: the optional is empty"):
        evaluate(m, {"opt": None})


# -- feeds and what torch cannot hold ---------------------------------------------------------------------


def test_a_sequence_feed_must_be_a_list_of_the_declared_dtype() -> None:
    m = model([oh.make_node("SequenceLength", ["xs"], ["n"])], [seq_vi("xs", TP.FLOAT, [2])], [vi("n", TP.INT64, [])])
    ev = TorchEvaluator(m)
    assert ev.run(None, {"xs": (np.zeros(2, np.float32), torch.ones(2))})[0].item() == 2
    with pytest.raises(TypeError, match=r"feed 'xs' is a Tensor, the model declares sequence<float32\[2\]>: feed a list of tensors"):
        ev.run(None, {"xs": torch.ones(2)})
    with pytest.raises(TypeError, match=r"feed 'xs\[1\]' has dtype int64, the model declares float32\[2\]"):
        ev.run(None, {"xs": [torch.ones(2), torch.ones(2, dtype=torch.int64)]})


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (seq_vi("xs", TP.STRING), r"the model's input 'xs' is a sequence of string tensors \(sequence<string>\)"),
        (vi("xs", TP.STRING, [2]), r"the model's input 'xs' is a string tensor \(string\[2\]\)"),
    ],
    ids=["sequence-of-strings", "string-tensor"],
)
def test_strings_are_refused_by_name(value: onnx.ValueInfoProto, why: str) -> None:
    op = "SequenceLength" if value.type.HasField("sequence_type") else "Size"
    m = model([oh.make_node(op, ["xs"], ["n"])], [value], [vi("n", TP.INT64, [])])
    with pytest.raises(UnsupportedVariantError, match=why + ": torch has no such values, so the torch evaluator refuses it; run the model with onnxruntime"):
        TorchEvaluator(m)
