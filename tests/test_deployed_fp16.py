"""Float16 models as onnxruntime's converter writes them: float16 compute behind float32 inputs and outputs
(keep_io_types=True) judged as float16, and the one-Cast-per-consumer graphs of onnxruntime 1.31's converter."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
import torch

from pytest_ortdiff import TorchEvaluator
from pytest_ortdiff.models import transformer_feeds

F, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


def _fanout_model() -> onnx.ModelProto:
    """x -> MatMul -> y, read by Pow and Sin (kept in float32 by the converter's op_block_list) -> Add."""
    rng = np.random.default_rng(0)
    w = oh.make_tensor("w", F, [4, 4], rng.random(16, dtype=np.float32).tolist())
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        oh.make_node("Pow", ["y", "two"], ["p1"], name="pow1"),
        oh.make_node("Sin", ["y"], ["p2"], name="sin"),
        oh.make_node("Add", ["p1", "p2"], ["z"], name="add"),
    ]
    graph = oh.make_graph(nodes, "fanout", [oh.make_tensor_value_info("x", F, [2, 4])], [oh.make_tensor_value_info("z", F, [2, 4])],
                          [w, oh.make_tensor("two", F, [], [2.0])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)


def _as_onnxruntime_131_writes_it(model: onnx.ModelProto) -> onnx.ModelProto:
    """What onnxruntime 1.31.1's convert_float_to_float16 writes where 1.32's writes one Cast: one identical Cast
    (same name, same output) per float32 consumer of a float16 value (reproduced on 1.31.1: `y_cast_to_fp32_node`
    twice for the Pow and the Sin above). Under 1.31 itself the converter's graph is already so, and stays so."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    readers: dict[str, int] = {}
    writers: dict[str, int] = {}
    for n in out.graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
        writers[n.output[0]] = writers.get(n.output[0], 0) + 1
    extra = []
    for n in out.graph.node:
        if n.op_type == "Cast" and n.output[0].endswith("_cast_to_fp32") and writers[n.output[0]] == 1:
            extra += [n] * (readers.get(n.output[0], 1) - 1)
    out.graph.node.extend(extra)
    return out


def _converted(keep_io_types: bool = True) -> onnx.ModelProto:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(_fanout_model(), keep_io_types=keep_io_types, op_block_list=["Pow", "Sin"])


def test_a_value_written_by_two_nodes_is_refused_in_one_line_naming_onnxruntime_131s_converter() -> None:
    """The evaluator ran such a graph into a KeyError (the second Cast's value freed after the first reader);
    onnxruntime 1.31.1 refuses it too ("two nodes with same node name"). One message, with the fix."""
    model = _as_onnxruntime_131_writes_it(_converted())
    assert [n.name for n in model.graph.node].count("y_cast_to_fp32_node") == 2
    with pytest.raises(ValueError, match=r"'y_cast_to_fp32' is the output of 2 nodes \('y_cast_to_fp32_node' \(Cast\), 'y_cast_to_fp32_node' \(Cast\)\).*onnxruntime 1\.31.*convert_float_to_float16.*>= 1\.32") as info:
        TorchEvaluator(model, check_model=False)
    assert "\n" not in str(info.value)


def test_convert_half_keeps_one_of_the_identical_casts_onnxruntime_131s_converter_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """precision.convert_half on a converter that writes a Cast per consumer (1.31.1's) gives the graph 1.32's
    converter gives: the same nodes, and the same float16-arithmetic outputs bit for bit."""
    import onnxruntime.transformers.float16 as float16

    from pytest_ortdiff.analyses.precision.keep import convert_half

    model = _fanout_model()
    good = convert_half(model, op_block_list=["Pow", "Sin"])
    original = float16.convert_float_to_float16
    monkeypatch.setattr(float16, "convert_float_to_float16", lambda *a, **k: _as_onnxruntime_131_writes_it(original(*a, **k)))
    fixed = convert_half(model, op_block_list=["Pow", "Sin"])
    assert [(n.op_type, n.name, list(n.output)) for n in fixed.graph.node] == [(n.op_type, n.name, list(n.output)) for n in good.graph.node]
    x = {"x": torch.rand(2, 4, generator=torch.Generator().manual_seed(0))}
    (a,) = TorchEvaluator(good).run(None, x)
    (b,) = TorchEvaluator(fixed).run(None, x)
    assert torch.equal(a, b)


def _embed_layer_norm() -> onnx.ModelProto:
    """onnxruntime's EmbedLayerNormalization alone (what its optimizer fuses BERT's embeddings into)."""
    rng = np.random.default_rng(0)
    weights = [oh.make_tensor(name, F, shape, rng.standard_normal(int(np.prod(shape))).astype(np.float32).tolist())
               for name, shape in (("word", [16, 8]), ("position", [8, 8]), ("segment", [2, 8]), ("gamma", [8]), ("beta", [8]))]
    node = oh.make_node("EmbedLayerNormalization", ["ids", "segments", "word", "position", "segment", "gamma", "beta"], ["y", "mask_index"],
                        domain="com.microsoft", epsilon=1e-12, name="embed")
    i32 = onnx.TensorProto.INT32
    graph = oh.make_graph([node], "embed", [oh.make_tensor_value_info("ids", i32, [1, 4]), oh.make_tensor_value_info("segments", i32, [1, 4])],
                          [oh.make_tensor_value_info("y", F, [1, 4, 8]), oh.make_tensor_value_info("mask_index", i32, [1])], weights)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)], ir_version=9)


def test_the_oracle_runs_a_contrib_op_whose_schema_takes_no_double_in_float32() -> None:
    """The float64 oracle crashed on a node sent to onnxruntime whose contrib-op schema has no tensor(double)
    (EmbedLayerNormalization: "Type 'tensor(double)' of input parameter ... is invalid", at session creation):
    such a node runs in float32, inputs cast down, outputs back up, as one onnxruntime has no double kernel for."""
    from pytest_ortdiff import OrtRunner

    model = _embed_layer_norm()
    feeds = {"ids": torch.tensor([[1, 5, 9, 15]], dtype=torch.int32), "segments": torch.tensor([[0, 0, 1, 1]], dtype=torch.int32)}
    y, mask_index = TorchEvaluator(model, compute_dtype=torch.float64, kernels={("com.microsoft", "EmbedLayerNormalization"): "ort"}).run(None, feeds)
    expected, expected_mask = OrtRunner(model).run(None, feeds)
    assert y.dtype == torch.float64 and mask_index.dtype == torch.int32
    assert torch.equal(y, expected.double()) and torch.equal(mask_index, expected_mask)


# -- float16 compute behind float32 inputs and outputs, judged as float16 ---------------------------------


def test_a_float16_model_behind_float32_io_is_judged_as_float16(deployed: Callable[[str], Path]) -> None:
    """Llama through the converter's keep_io_types=True: a float32 case judges it at float16's tolerance, in
    float16 ULPs, and says so; the same outputs against float32's tolerance would fail (the rounding of
    float16 arithmetic, not a bug)."""
    from pytest_ortdiff import Checker
    from pytest_ortdiff.runtimes.model_io import compute_dtype

    path = deployed("llama-dynamo-fp16")
    assert compute_dtype(onnx.load(str(path))) == "float16"
    feeds = transformer_feeds(path, batch=2, sequence=5)
    assert feeds["input_ids"].dtype == torch.int64  # (the inputs are float32's model's: ids and a mask)
    result = Checker("CPU", "float32").check(path, feeds)
    assert result.judged_dtype == "float16" and result.passed
    assert result.tolerance == Checker("CPU", "float16").tolerance
    report = result.report
    assert report.max_abs > Checker("CPU", "float32").tolerance.atol  # float32's tolerance would have failed it
    assert report.dtype == "float16" and 0 < (report.max_ulp_floored or 0) <= 16  # float16's ULPs at the outputs' scale
    assert "CPU float16 (its compute dtype, behind float32 inputs and outputs): passed" in result.render()
    (row,) = result.rows()
    assert row.dtype == "float32" and row.passed  # (the case's column of the matrix)


def test_the_float16_compute_dtype_is_in_the_failure_report_and_no_other_dtype_warning(deployed: Callable[[str], Path]) -> None:
    from pytest_ortdiff import Checker
    from pytest_ortdiff.engine.check import OrtDiffDtypeWarning, ToleranceBroken

    path = deployed("llama-dynamo-fp16")
    feeds = transformer_feeds(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a float16 case: the model computes in it, nothing to warn about
        Checker("CPU", "float16").check(path, feeds)
    with pytest.raises(ToleranceBroken, match=r"torch evaluator vs onnxruntime CPU float16 \(its compute dtype, behind float32 inputs and outputs\): tolerance broken \(atol=0"):
        Checker("CPU", "float32").check(path, feeds, tolerance=(0.0, 0.0))
    with pytest.warns(OrtDiffDtypeWarning, match=r"this case is bfloat16"):
        Checker("CPU", "bfloat16").check(path, feeds)


def test_blame_judges_a_float16_model_behind_float32_io_as_float16(deployed: Callable[[str], Path]) -> None:
    from pytest_ortdiff import Checker

    model = onnx.load(str(deployed("llama-dynamo-fp16")))
    table = Checker("CPU", "float32").blame(model, transformer_feeds(model))
    assert table.dtype == "float16"
