"""The Checker and the fixture on deployed graphs: a failure report is never hidden by a blame that fails, and
"did my deployment step move the numbers" (check_deployment: outputs compared, graphs aligned node to node,
the first divergence named)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import onnxruntime as ort
import pytest
import torch

from pytest_ortdiff import Checker
from pytest_ortdiff.engine.check import ToleranceBroken
from pytest_ortdiff.models import transformer_feeds

Deployed = Callable[[str], Path]


def test_a_blame_that_fails_never_hides_the_failure_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """check(..., blame=True) on a failing model whose blame raises (it crashed on fused graphs: the oracle's
    EmbedLayerNormalization in float64) still raises ToleranceBroken with the report, and says why no table."""
    import importlib

    import onnx.helper as oh

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torch kernel OrtKernel failed on node 'embed'\nsecond line")

    monkeypatch.setattr(importlib.import_module("pytest_ortdiff.engine.blame"), "blame", broken)
    f = onnx.TensorProto.FLOAT
    graph = oh.make_graph([oh.make_node("Tanh", ["x"], ["y"], name="tanh")], "g", [oh.make_tensor_value_info("x", f, [2, 3])], [oh.make_tensor_value_info("y", f, [2, 3])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    feeds = {"x": torch.tensor([[0.1, 3.0, -1.0], [2.0, 2.5, 0.0]])}
    with pytest.raises(ToleranceBroken) as info:
        Checker("CPU", "float32").check(model, feeds, blame=True, kernels={"tanh": lambda x: torch.tanh(x) * 1.01})  # (planted 1 % off)
    result = info.value.result
    assert not result.passed and result.blame is None
    assert result.blame_error == "RuntimeError: torch kernel OrtKernel failed on node 'embed'"
    text = str(info.value)
    assert text.startswith("ortdiff: torch evaluator vs onnxruntime CPU float32: tolerance broken")
    assert text.rstrip().endswith("blame failed, no table: RuntimeError: torch kernel OrtKernel failed on node 'embed'")


# -- check_deployment: did my deployment step move the numbers ----------------------------------------


def _value(path: Path, name: str, feeds: dict[str, torch.Tensor]) -> np.ndarray:
    """One intermediate value of a model, by onnxruntime (the graph as written, the value exposed as an output)."""
    m = onnx.load(str(path))
    m.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run([name], {k: v.numpy() for k, v in feeds.items() if k in names})[0]


def _dequantized(model: onnx.ModelProto, node: onnx.NodeProto) -> np.ndarray:
    """MatMulNBits' weight [K, N] from its 4-bit blocks (low nibble first) and scales, symmetric (zero point 8),
    in float64: what the spec says the int4 weight is."""
    init = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    attrs = {a.name: a.i for a in node.attribute}
    packed, scales = init[node.input[1]], init[node.input[2]].astype(np.float64)
    n, blocks, _ = packed.shape
    nibbles = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, attrs["block_size"]).astype(np.float64)
    w = (nibbles - 8.0) * scales.reshape(n, blocks, 1)
    return w.reshape(n, -1)[:, : attrs["K"]].T


def test_an_int4_model_against_its_float32_parent_names_matmulnbits_the_first_divergence(deployed: Deployed) -> None:
    """Llama's dynamo export and its MatMulNBits int4 form (block 32, symmetric): the outputs moved, every value
    before the first quantized projection is identical, and the first divergence named is that MatMulNBits,
    by the error numpy finds between the float32 weight and the int4 blocks dequantized by hand."""
    from pytest_ortdiff.analyses.align import DeploymentMoved, check_deployment

    parent, int4 = deployed("llama-dynamo"), deployed("llama-dynamo-int4")
    feeds = transformer_feeds(int4, batch=1, sequence=8)
    with pytest.raises(DeploymentMoved) as info:
        check_deployment(parent, int4, feeds, raise_on_failure=True)
    report = info.value.result
    assert not report.passed and report.dtype == "float32" and report.alignment is not None
    row = report.divergence
    assert row is not None and row.a is not None and row.b is not None
    assert (row.b.domain, row.b.op_type, row.a.op_type) == ("com.microsoft", "MatMulNBits", "MatMul")
    at = report.alignment.rows.index(row)
    assert all(r.status == "=" for r in report.alignment.rows[:at] if r.matched)  # (nothing moved before it)
    model = onnx.load(str(int4))
    node = next(n for n in model.graph.node if n.output[0] == row.b.name)
    x = _value(parent, node.input[0], feeds).astype(np.float64)
    w32 = onnx.numpy_helper.to_array(next(i for i in onnx.load(str(parent)).graph.initializer if i.name == next(
        n for n in onnx.load(str(parent)).graph.node if n.output[0] == row.a.name).input[1])).astype(np.float64)
    expected_gap = np.abs(x @ w32 - x @ _dequantized(model, node)).max()
    assert row.max_abs == pytest.approx(expected_gap, rel=1e-4)
    text = str(info.value)
    assert f"first divergence: {row.b.name!r} (com.microsoft::MatMulNBits, node {node.name!r}) in llama-dynamo-int4/model.onnx" in text
    assert "<- first divergence" in text and "outputs moved beyond tolerance" in text


def test_a_float16_conversion_behind_float32_io_is_judged_as_float16_pair_by_pair(deployed: Deployed) -> None:
    """BERT optimized then converted keep_io_types=True: outputs within float16's tolerance of the float32
    export's; aligned, no pair diverges: the fused nodes (SkipLayerNormalization against the LayerNormalization
    it replaced) and the float32 outputs computed in float16 are judged as float16."""
    from pytest_ortdiff.analyses.align import check_deployment

    parent, fp16 = deployed("bert-torchscript"), deployed("bert-torchscript-opt-fp16")
    feeds = transformer_feeds(fp16, batch=2, sequence=6)
    report = check_deployment(parent, fp16, feeds, align=True)
    assert report.passed and report.dtype == "float16" and report.compute_dtype == "float16"
    a = _value(parent, "last_hidden_state", feeds)
    b = _value(fp16, "last_hidden_state", feeds)
    assert report.outputs.max_abs == pytest.approx(float(np.abs(a.astype(np.float16).astype(np.float64) - b.astype(np.float16)).max()))
    assert report.alignment is not None and report.divergence is None
    fused = {r.b.op_type: r for r in report.alignment.pairs if r.b is not None and r.a is not None and r.b.domain == "com.microsoft"}
    assert all(r.status == "~" for r in fused.values())
    assert {op: r.a.op_type for op, r in fused.items() if r.a is not None and op != "SkipLayerNormalization"} == {
        "EmbedLayerNormalization": "LayerNormalization", "Attention": "Reshape", "BiasGelu": "Mul"}  # (the last node each replaced)
    out = next(r for r in report.alignment.pairs if r.b is not None and r.b.name == "last_hidden_state")
    assert out.status == "~" and "judged as float16, b's compute dtype" in out.note


def test_the_float16_converters_saturated_mask_is_no_divergence(deployed: Deployed) -> None:
    """float32's min in an attention mask (-3.4e38) is -65504 in the float16 model: compared as float16 stores
    it, not a divergence of 3.4e38."""
    from pytest_ortdiff.analyses.align import check_deployment

    report = check_deployment(deployed("llama-dynamo"), deployed("llama-dynamo-fp16"), transformer_feeds(deployed("llama-dynamo")), align=True)
    assert report.passed and report.alignment is not None and report.divergence is None
    masks = [r for r in report.alignment.pairs if r.a is not None and r.a.min < -1e38]
    assert masks and all(r.status in "=~" for r in masks)


def test_a_qdq_model_diverges_first_where_a_dequantized_weight_is_read(deployed: Deployed) -> None:
    """quantize_static's QDQ BERT: the first value to move is the word embedding's Gather, reading its table
    through QuantizeLinear/DequantizeLinear (int8 weights), by the table's own int8 rounding."""
    from pytest_ortdiff.analyses.align import DeploymentMoved, check_deployment

    parent, qdq = deployed("bert-torchscript"), deployed("bert-torchscript-qdq")
    feeds = transformer_feeds(qdq)
    with pytest.raises(DeploymentMoved) as info:
        check_deployment(parent, qdq, feeds, raise_on_failure=True)
    row = info.value.result.divergence
    assert row is not None and row.b is not None and row.b.op_type == "Gather"
    model = onnx.load(str(qdq))
    gather = next(n for n in model.graph.node if n.output[0] == row.b.name)
    producer = {o: n for n in model.graph.node for o in n.output}
    assert producer[gather.input[0]].op_type == "DequantizeLinear"
    ids = feeds["input_ids"].numpy()
    float_table = onnx.numpy_helper.to_array(next(i for i in onnx.load(str(parent)).graph.initializer if i.name.endswith("word_embeddings.weight")))
    deq = _value(qdq, gather.input[0], feeds)
    assert row.max_abs == pytest.approx(float(np.abs(float_table[ids] - deq[ids]).max()), rel=1e-6)


def test_check_deployment_in_a_test_fails_with_the_first_divergence_and_a_summary_row(pytester: pytest.Pytester, deployed: Deployed) -> None:
    parent, int4 = deployed("llama-dynamo"), deployed("llama-dynamo-int4")
    pytester.makepyfile(f"""
from pytest_ortdiff.models import transformer_feeds

def test_int4(ortdiff):
    feeds = transformer_feeds({str(int4)!r})
    ortdiff.check_deployment({str(parent)!r}, {str(int4)!r}, feeds)

def test_int4_within_a_budget(ortdiff):
    feeds = transformer_feeds({str(int4)!r})
    report = ortdiff.check_deployment({str(parent)!r}, {str(int4)!r}, feeds, tolerance={{"budget": {{0.1: 0.0}}}})
    assert report.passed and report.alignment is None
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*first divergence: 'linear' (com.microsoft::MatMulNBits, node 'node_linear_Q4') in llama-dynamo-int4/model.onnx, against 'linear' (MatMul) in llama-dynamo/model.onnx*",
        "*test_int4*CPU*float32*deployment*",
    ])


def test_a_genai_int4_decoder_with_past_against_its_fp32_build_names_the_quantized_embedding(deployed: Deployed) -> None:
    """onnxruntime-genai's int4 build against its fp32 build of one checkpoint, fed a decode step (past 4): the
    first divergence is the first quantized node, the int4 embedding (GatherBlockQuantized)."""
    from pytest_ortdiff.analyses.align import DeploymentMoved, check_deployment

    fp32, int4 = deployed("llama-genai-fp32"), deployed("llama-genai-int4")
    feeds = transformer_feeds(int4, sequence=1, past=4)
    with pytest.raises(DeploymentMoved) as info:
        check_deployment(fp32, int4, feeds, raise_on_failure=True)
    row = info.value.result.divergence
    assert row is not None and row.b is not None and (row.b.domain, row.b.op_type) == ("com.microsoft", "GatherBlockQuantized")


def test_blame_passes_over_dead_code() -> None:
    """A graph with nodes no output depends on (onnxruntime-genai's builder left a last MLP so, taking its
    gate_proj, as wide as the vocabulary, for the LM head): blame swapped the node feeding them and ran them on values the torch run never computed
    (a TypeError on None). Now a row per node, the dead ones explaining nothing, the planted node found."""
    import onnx.helper as oh

    f = onnx.TensorProto.FLOAT
    nodes = [
        oh.make_node("Tanh", ["x"], ["t"], name="tanh"),
        oh.make_node("Relu", ["t"], ["y"], name="relu"),
        oh.make_node("Sigmoid", ["t"], ["a"], name="dead_sigmoid"),
        oh.make_node("Neg", ["x"], ["b"], name="dead_neg"),
        oh.make_node("Mul", ["a", "b"], ["c"], name="dead_mul"),
    ]
    graph = oh.make_graph(nodes, "dead", [oh.make_tensor_value_info("x", f, [4, 8])], [oh.make_tensor_value_info("y", f, [4, 8])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)
    feeds = {"x": torch.linspace(-2, 2, 32).reshape(4, 8)}
    table = Checker("CPU", "float32").blame(model, feeds, kernels={"tanh": lambda x: torch.tanh(x) * 1.01})
    assert len(table.rows) == 5 and table.culprit is not None and table.culprit.node == "tanh"
    assert all(r.explained == 0 for r in table.rows if r.node.startswith("dead_"))


def test_the_precision_command_names_an_op_without_a_kernel_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli: Any) -> None:
    """`precision MODEL` on a graph with an op the evaluator has no kernel for printed a traceback."""
    import importlib

    from pytest_ortdiff import models
    from pytest_ortdiff.runtimes.evaluator import MissingKernelError

    def no_kernel(*args: Any, **kwargs: Any) -> Any:
        raise MissingKernelError("no torch kernel for com.microsoft::Foo (opset 1); run it on onnxruntime: ...; known ops: Abs, ...", ("com.microsoft::Foo",))

    monkeypatch.setattr(importlib.import_module("pytest_ortdiff.analyses.precision.keep"), "keep_float32", no_kernel)
    path = tmp_path / "mlp.onnx"
    onnx.save(models.mlp(), str(path))
    result = cli("precision", str(path), "--dim", "batch=2")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("error: no torch kernel for com.microsoft::Foo (opset 1); run it with onnxruntime instead")
    assert result.stderr.strip().endswith("(or --missing=ort)")


def test_compare_executions_judges_a_float16_conversion_behind_float32_io_as_float16(deployed: Deployed) -> None:
    """The command line's `diff` aligns with compare_executions: a keep_io_types=True conversion's float32
    output (float16 values cast up) is within float16's tolerance of the float32 export's, not beyond float32's."""
    from pytest_ortdiff.analyses.align import compare_executions

    parent, fp16 = deployed("bert-torchscript"), deployed("bert-torchscript-opt-fp16")
    alignment = compare_executions(parent, fp16, transformer_feeds(fp16))
    out = next(r for r in alignment.pairs if r.b is not None and r.b.name == "last_hidden_state")
    assert out.status == "~" and "judged as float16, b's compute dtype" in out.note and alignment.divergence is None


def test_a_deployment_row_judged_in_another_dtype_than_its_case_says_so(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A float16 conversion with float32 I/O in a float32 case: the row's dtype column is the case's, its
    tolerance float16's (atol=0.01): the row says it was judged as float16."""
    from pytest_ortdiff import models
    from pytest_ortdiff.analyses.precision.keep import convert_half

    original, deployed_ = tmp_path / "lnmm.onnx", tmp_path / "lnmm16.onnx"
    onnx.save(models.layer_norm_matmul_add(dtype="float32"), str(original))
    onnx.save(convert_half(models.layer_norm_matmul_add(dtype="float32"), (), dtype="float16", keep_io_types=True), str(deployed_))
    pytester.makepyfile(test_fp16=f"""
from pytest_ortdiff import models

def test_fp16(ortdiff):
    feeds = {{k: v.numpy() for k, v in models.random_feeds({str(original)!r}, dims={{"a": 2, "b": 8, "c": 16}}, seed=0).items()}}
    ortdiff.check_deployment({str(original)!r}, {str(deployed_)!r}, feeds)
""")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    row = next(line for line in result.stdout.lines if line.startswith("test_fp16.py::test_fp16[CPU-float32] [deployment]"))
    assert "float32" in row and "atol=0.01 rtol=0.01" in row and "judged as float16" in row and row.rstrip().endswith("passed")
