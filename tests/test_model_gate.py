"""The checker gate accepts what onnxruntime accepts: onnxruntime's own ops of the default domain and its
contrib ops are known ops, a graph whose nodes are out of order is sorted (and the report says so); a graph
neither onnx.checker nor onnxruntime takes is still refused with one message."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from optimized_models import ARCHITECTURES, deployed, feeds_for

from pytest_ortdiff import Checker, TorchEvaluator, blame
from pytest_ortdiff.conformance.contrib_cases._onenode import one_node, randn
from pytest_ortdiff.numerics.results import CheckRow
from pytest_ortdiff.runtimes import model_io
from pytest_ortdiff.runtimes.model_io import SORTED_NOTE, InvalidModelError, check_model
from pytest_ortdiff.runtimes.ort import OrtRunner


@pytest.fixture
def fresh_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's per-model cache emptied: a verdict depends on what is installed, which a test changes."""
    monkeypatch.setattr(model_io, "_CHECKED", OrderedDict())


def _rms_norm(opset: int = 17) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    x = randn(2, 3, 8, seed=1)
    return one_node("SimplifiedLayerNormalization", "", [("x", x), ("scale", randn(8, seed=2, shift=1.0))], [("y", TensorProto.FLOAT, 3)], {"epsilon": 1e-6}, weights=("scale",), opset=opset)


def _rms_reference(x: torch.Tensor, scale: np.ndarray, eps: float) -> np.ndarray:
    xd = x.double().numpy()
    return xd / np.sqrt((xd**2).mean(-1, keepdims=True) + eps) * scale.astype(np.float64)


def test_onnxruntimes_default_domain_ops_are_known(fresh_gate: None) -> None:
    model, feeds = _rms_norm()
    with pytest.raises(onnx.checker.ValidationError, match="No Op registered for SimplifiedLayerNormalization with domain_version of 17"):
        onnx.checker.check_model(model)  # what the genai builder and the optimizer write, which onnx refuses
    checked = check_model(model)
    assert checked.notes == () and checked.proto is model
    scale = onnx.numpy_helper.to_array(model.graph.initializer[0])
    want = _rms_reference(feeds["x"], scale, float(np.float32(1e-6)))
    (ours,) = TorchEvaluator(model).run(None, feeds)
    (theirs,) = OrtRunner(model).run(None, feeds)
    np.testing.assert_allclose(ours.numpy(), want, rtol=3e-7, atol=1e-7)
    np.testing.assert_allclose(theirs.numpy(), want, rtol=3e-7, atol=1e-7)
    # LayerNormalization below opset 17 is onnxruntime's own op (ONNX's starts at 17)
    x = randn(2, 3, 8, seed=3)
    ln, ln_feeds = one_node("LayerNormalization", "", [("x", x), ("s", randn(8, seed=4)), ("b", randn(8, seed=5))], [("y", TensorProto.FLOAT, 3)], opset=16)
    check_model(ln)
    torch.testing.assert_close(TorchEvaluator(ln).run(None, ln_feeds)[0], OrtRunner(ln).run(None, ln_feeds)[0], rtol=1e-6, atol=1e-6)


def test_a_graph_no_one_accepts_is_refused_with_one_message(fresh_gate: None) -> None:
    model, _ = _rms_norm()
    unknown = onnx.ModelProto()
    unknown.CopyFrom(model)
    unknown.graph.node[0].op_type = "SimplifiedLayerNormalisation"  # (a typo: neither onnx nor onnxruntime has it)
    with pytest.raises(InvalidModelError) as info:
        check_model(unknown)
    assert str(info.value) == (
        "the model fails onnx.checker: No Op registered for SimplifiedLayerNormalisation with domain_version of 17 "
        "(Bad node spec for node. Name: OpType: SimplifiedLayerNormalisation); fix the graph"
    )
    # an op onnxruntime knows next to a real error: the real error, once
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    relu = helper.make_node("Relu", ["y"], ["z"], bogus=1)
    bad.graph.node.append(relu)
    bad.graph.output[0].name = "z"
    with pytest.raises(InvalidModelError) as info:
        check_model(bad)
    assert str(info.value) == "the model fails onnx.checker: Unrecognized attribute: bogus for operator Relu (Bad node spec for node. Name: OpType: Relu); fix the graph"


def test_a_contrib_domain_the_model_does_not_import_is_imported_as_onnxruntime_does(fresh_gate: None) -> None:
    # optimize_model(...).model, before save_model_to_file adds the import: com.microsoft nodes, no
    # com.microsoft opset; onnxruntime runs it
    model, feeds = one_node("FastGelu", "com.microsoft", [("x", randn(2, 8, seed=3))], [("y", TensorProto.FLOAT, 2)])
    del model.opset_import[1]
    with pytest.raises(onnx.checker.ValidationError, match=r"No opset import for domain 'com\.microsoft'"):
        onnx.checker.check_model(model)
    assert check_model(model).notes == ()
    torch.testing.assert_close(TorchEvaluator(model).run(None, feeds)[0], OrtRunner(model).run(None, feeds)[0], rtol=1e-6, atol=1e-7)
    unknown = onnx.ModelProto()
    unknown.CopyFrom(model)
    unknown.graph.node[0].domain = "com.example"  # a domain no one knows: still refused
    with pytest.raises(InvalidModelError, match=r"^the model fails onnx\.checker: No opset import for domain 'com\.example'"):
        check_model(unknown)


def test_without_onnxruntime_the_ops_the_evaluator_runs_are_known(fresh_gate: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # MemcpyFromHost: an op onnxruntime has a default-domain schema for (onnx none), with no torch kernel
    memcpy = helper.make_model(
        helper.make_graph([helper.make_node("MemcpyFromHost", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])]),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=9,
    )
    assert model_io._ort_schemas()[("", "SimplifiedLayerNormalization")] == (1, 1)
    check_model(memcpy)  # onnxruntime loads it: the gate lets it through (the evaluator then names the missing kernel)
    rms, _ = _rms_norm(opset=13)
    monkeypatch.setattr(model_io, "_ort_schemas", dict)  # onnxruntime not installed
    monkeypatch.setattr(model_io, "_CHECKED", OrderedDict())
    check_model(rms)  # the evaluator has its kernel: it can be run, and compared with a peer
    with pytest.raises(InvalidModelError, match="No Op registered for MemcpyFromHost with domain_version of 17"):
        check_model(memcpy)


def _reversed(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)[::-1]
    out.graph.ClearField("node")
    out.graph.node.extend(nodes)
    return out


def _runs_in_order(graph: onnx.GraphProto) -> bool:
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    for node in graph.node:
        if not set(node.input) <= known:
            return False
        known.update(node.output)
    return True


def test_an_unsorted_graph_is_sorted_and_the_report_says_so(fresh_gate: None, tmp_path: Path) -> None:
    model = deployed("llama", tmp_path)
    feeds = feeds_for(ARCHITECTURES["llama"][1])
    shuffled = _reversed(model)
    with pytest.raises(onnx.checker.ValidationError, match="Nodes in a graph must be topologically sorted"):
        onnx.checker.check_model(shuffled)
    checked = check_model(shuffled)
    assert checked.notes == (SORTED_NOTE,) and checked.data == shuffled.SerializeToString()  # onnxruntime sorts the bytes itself
    assert _runs_in_order(checked.proto.graph) and not _runs_in_order(shuffled.graph)
    assert sorted(n.name for n in checked.proto.graph.node) == sorted(n.name for n in model.graph.node)
    want = TorchEvaluator(model).run(None, feeds)
    for ev in (TorchEvaluator(shuffled), TorchEvaluator(shuffled, check_model=False)):
        assert all(torch.equal(a, b) for a, b in zip(ev.run(None, feeds), want, strict=True))
    result = Checker("CPU", "float32").check(shuffled, feeds, tolerance={"atol": 1e-5, "rtol": 1e-4})
    assert result.notes == (SORTED_NOTE,) and f"note: {SORTED_NOTE}" in result.render()
    row = result.rows()[0]
    assert row.notes == (SORTED_NOTE,) and CheckRow.from_dict(row.to_dict()).notes == (SORTED_NOTE,)
    from pytest_ortdiff.numerics.report import render_table

    assert SORTED_NOTE in render_table([row])
    table = blame(shuffled, feeds)  # blame runs the graph in an order it can run in too
    assert len(table.rows) == len(model.graph.node)


def test_the_float16_converters_unsorted_graph_runs(fresh_gate: None) -> None:
    # convert_float_to_float16(keep_io_types=True) appends the Casts of the float32 inputs after the nodes
    # that read them: onnx.checker refuses the graph, onnxruntime sorts and runs it
    import warnings

    from onnxruntime.transformers.float16 import convert_float_to_float16

    from pytest_ortdiff import models

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the converter warns about its own internals)
        half = convert_float_to_float16(models.layer_norm_matmul_add(dtype="float32"), keep_io_types=True)
    assert [n.op_type for n in half.graph.node][:3] == ["LayerNormalization", "MatMul", "Add"]
    with pytest.raises(onnx.checker.ValidationError, match="Nodes in a graph must be topologically sorted"):
        onnx.checker.check_model(half)
    feeds = models.random_feeds(half, dims={"a": 2, "b": 4, "c": 16}, seed=0)
    result = Checker("CPU", "float32").check(half, feeds, tolerance={"atol": 2e-2, "rtol": 2e-2})
    assert result.notes == (SORTED_NOTE,) and result.report.max_abs > 0  # float16 inside: not float32's numbers


def test_an_unsorted_body_is_sorted(fresh_gate: None) -> None:
    # If's branch reads an outer value and lists its two nodes backwards
    then = helper.make_graph(
        [helper.make_node("Neg", ["t"], ["out"]), helper.make_node("Mul", ["x", "x"], ["t"])], "then", [], [helper.make_tensor_value_info("out", 1, [3])]
    )
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["out2"])], "else", [], [helper.make_tensor_value_info("out2", 1, [3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", 1, [3])],
        [helper.make_tensor_value_info("y", 1, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    checked = check_model(model)
    assert checked.notes == (SORTED_NOTE,)
    then_sorted = next(a.g for a in checked.proto.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_sorted.node] == ["Mul", "Neg"]
    x = torch.tensor([1.0, -2.0, 3.0])
    (y,) = TorchEvaluator(model).run(None, {"c": torch.tensor(True), "x": x})
    assert y.tolist() == [-1.0, -4.0, -9.0]


def test_an_unsorted_invalid_graph_names_its_real_problem(fresh_gate: None) -> None:
    model, _ = _rms_norm()
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.node.append(helper.make_node("Relu", ["y"], ["z"], bogus=1))
    bad.graph.output[0].name = "z"
    with pytest.raises(InvalidModelError, match=r"^the model fails onnx\.checker: Unrecognized attribute: bogus for operator Relu"):
        check_model(_reversed(bad))
    dangling = onnx.ModelProto()
    dangling.CopyFrom(model)
    dangling.graph.node[0].input[0] = "nowhere"  # no order helps: the checker's own message
    with pytest.raises(InvalidModelError, match=r"^the model fails onnx\.checker: Nodes in a graph must be topologically sorted, however input 'nowhere'"):
        check_model(dangling)


@pytest.mark.parametrize("float16", [False, True], ids=["float32", "float16"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_optimized_exports_run_in_the_evaluator(name: str, float16: bool, tmp_path: Path) -> None:
    # what onnxruntime.transformers writes for BERT, GPT-2 and LLaMA: accepted, every normalization and
    # activation op run by a torch kernel (attention is another family's), matching onnxruntime
    model = deployed(name, tmp_path, float16=float16)
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    feeds = feeds_for(ARCHITECTURES[name][1])
    expected_ops = {
        "bert": {("com.microsoft", "EmbedLayerNormalization"), ("com.microsoft", "SkipLayerNormalization"), ("com.microsoft", "BiasGelu")},
        "gpt2": {("com.microsoft", "SkipLayerNormalization"), ("com.microsoft", "FastGelu")},
        "llama": {("com.microsoft", "SkipSimplifiedLayerNormalization"), ("", "SimplifiedLayerNormalization")},
    }[name]
    assert expected_ops <= ops
    tol = {"atol": 2e-3, "rtol": 2e-3} if float16 else {"atol": 1e-5, "rtol": 1e-4}
    result = Checker("CPU", "float32").check(model, feeds, tolerance=tol, missing="ort")
    assert set(result.ran_on_ort) <= {"com.microsoft::Attention"}
    if not result.ran_on_ort:  # (the oracle cannot send a float64 Attention to onnxruntime: that op needs its own kernel)
        oracle = Checker("CPU", "float32").check(model, feeds, tolerance={"atol": 1e-2, "rtol": 1e-2}, reference="float64")
        assert oracle.passed


def test_the_command_line_says_it_sorted_the_graph(fresh_gate: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_ortdiff.cli import main

    graph = helper.make_graph(
        [helper.make_node("Tanh", ["t"], ["y"]), helper.make_node("Add", ["x", "x"], ["t"])],  # Add listed after its reader
        "g",
        [helper.make_tensor_value_info("x", 1, [2, 3])],
        [helper.make_tensor_value_info("y", 1, [2, 3])],
    )
    path = tmp_path / "unsorted.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))
    assert main(["compare", str(path), "--provider", "cpu"]) == 0
    assert f"note: {SORTED_NOTE}\n" in capsys.readouterr().out
